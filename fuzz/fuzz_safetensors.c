/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors reader. Any input must either open (and then
 * every tensor's bytes are readable and lookups agree) or fail with HP_ERR_INPUT; never crash or read out of
 * bounds. The corpus in fuzz/corpus/safetensors/ is replayed as a ctest by replay_main.c.
 */
#include "hyperpar/safetensors.h"

#include <stdlib.h>
#include <string.h>
#include "fuzz.h"

/* Small tensors are converted too; 4096 elements keeps each run fast. */
#define FUZZ_MAX_CONVERT 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hp_st_file *f = NULL;
    hp_err err;
    hp_status st = hp_st_open_memory(&f, data, size, "fuzz", &err);
    if (st != HP_OK) {
        HP_ASSERT(f == NULL && (st == HP_ERR_INPUT || st == HP_ERR_NOMEM));
        return 0;
    }
    HP_ASSERT(hp_st_data_offset(f) <= size);
    static float out[FUZZ_MAX_CONVERT];
    unsigned sum = 0;
    for (size_t i = 0; i < hp_st_count(f); i++) {
        const hp_st_tensor *t = hp_st_tensor_at(f, i);
        HP_ASSERT(hp_st_find(f, t->name) == t);
        HP_ASSERT(hp_st_data_offset(f) + t->end <= size && t->begin <= t->end);
        const uint8_t *d = hp_st_data(f, t);
        for (uint64_t b = 0; b < t->end - t->begin; b++) sum += d[b];
        if ((t->dtype == HP_DT_F32 || t->dtype == HP_DT_BF16 || t->dtype == HP_DT_F16) &&
            t->n_elems <= FUZZ_MAX_CONVERT) {
            HP_ASSERT(hp_dtype_to_f32(t->dtype, d, out, t->n_elems, &err) == HP_OK);
            if (t->dtype != HP_DT_F32)
                HP_ASSERT(hp_dtype_from_f32(t->dtype, out, out, 0, &err) == HP_OK);
        }
    }
    for (size_t i = 0; i < hp_st_metadata_count(f); i++) {
        const char *k, *v;
        hp_st_metadata_at(f, i, &k, &v);
        HP_ASSERT(k && v && hp_st_metadata_get(f, k) != NULL);
    }
    (void)sum;
    hp_st_close(f);
    return 0;
}
