/*
 * fuzz_overrides.c — libFuzzer target: plan-override text (YAML or JSON) into hp_overrides_parse. Any input
 * must end in HP_OK or a clean error; never a crash, a leak or an out-of-bounds access. The text is also a glob
 * for hp_glob_valid (which every user-written glob goes through) and hp_glob_match.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/overrides.h"
#include "fuzz.h"

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
    char *pat = malloc(size + 1);
    if (!pat) return 0;
    memcpy(pat, data, size);
    pat[size] = '\0';
    size_t pos = (size_t)-1;
    const char *why = NULL;
    if (!hp_glob_valid(pat, &pos, &why) && (pos >= size || !why || (pat[pos] != '[' && pat[pos + 1] != '-'))) abort();
    (void)hp_glob_match(pat, "model.layers.0.mlp.experts.1.gate_proj.weight");
    free(pat);
    return 0;
}
