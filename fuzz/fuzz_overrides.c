/*
 * fuzz_overrides.c — libFuzzer target: plan-override text (YAML or JSON) into hp_overrides_parse. Any input
 * must end in HP_OK or a clean error; never a crash, a leak or an out-of-bounds access.
 */
#include <stdint.h>
#include <stdlib.h>

#include "hyperpar/overrides.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hp_overrides *o = NULL;
    hp_err err;
    if (hp_overrides_parse(&o, (const char *)data, size, "fuzz.yaml", &err) == HP_OK) {
        (void)hp_overrides_count(o);
        hp_overrides_free(o);
    } else if (o != NULL || err.msg[0] == '\0') {
        abort();
    }
    return 0;
}
