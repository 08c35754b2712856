/*
 * fuzz_config.c — libFuzzer target: config.json text into meta-mode synthesis (hp_model_from_config_text).
 * Any input must end in HP_OK or a clean error; never a crash, a leak or an out-of-bounds access.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/model.h"
#include "fuzz.h"

extern size_t hp__meta_max_tensors;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hp__meta_max_tensors = 20000; /* keep each input fast; the limit's own error path is exercised too */
    hp_model *m = NULL;
    hp_err err;
    if (hp_model_from_config_text(&m, (const char *)data, size, "fuzz.json", NULL, &err) == HP_OK) {
        (void)hp_model_num_params(m);
        hp_model_close(m);
    } else if (m != NULL || err.msg[0] == '\0') {
        abort(); /* contract: on failure the output is NULL and the message is filled */
    }
    return 0;
}
