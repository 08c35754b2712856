/*
 * fuzz_gguf.c — libFuzzer target for the GGUF reader and what convert builds on it. Any input must either open
 * (and then every tensor's bytes are readable, lookups agree, small tensors dequantize, and the llama mapping and
 * the tokenizer texts either succeed or refuse with HP_ERR_INPUT) or fail with HP_ERR_INPUT; never crash or read
 * out of bounds. The corpus in fuzz/corpus/gguf/ is replayed as a ctest by replay_main.c.
 */
#include "hyperpar/convert.h"

#include <stdlib.h>
#include <string.h>
#include "fuzz.h"

/* Tensors up to this many elements are dequantized; keeps each run fast. */
#define FUZZ_MAX_CONVERT 4096

static void ok_or_input(hp_status st) { HP_ASSERT(st == HP_OK || st == HP_ERR_INPUT || st == HP_ERR_NOMEM); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hp_gguf_file *f = NULL;
    hp_err err;
    hp_status st = hp_gguf_open_memory(&f, data, size, "fuzz", &err);
    if (st != HP_OK) {
        HP_ASSERT(f == NULL && (st == HP_ERR_INPUT || st == HP_ERR_NOMEM));
        return 0;
    }
    static float out[FUZZ_MAX_CONVERT];
    static uint8_t raw[4 * FUZZ_MAX_CONVERT];
    for (size_t i = 0; i < hp_gguf_kv_count(f); i++) HP_ASSERT(hp_gguf_find_kv(f, hp_gguf_kv_at(f, i)->key));
    for (size_t i = 0; i < hp_gguf_tensor_count(f); i++) {
        const hp_gguf_tensor *t = hp_gguf_tensor_at(f, i);
        HP_ASSERT(hp_gguf_find_tensor(f, t->name) == t);
        HP_ASSERT(hp_gguf_data_offset(f) + t->offset + t->nbytes <= size);
        if (t->nbytes <= sizeof raw) HP_ASSERT(hp_gguf_read(f, t, 0, raw, (size_t)t->nbytes, &err) == HP_OK);
        if (hp_ggml_type_dequantizable(t->type) && t->n_elems <= FUZZ_MAX_CONVERT && t->ne[0] > 0)
            HP_ASSERT(hp_gguf_read_f32(f, t, 0, t->n_elems / t->ne[0], out, &err) == HP_OK);
    }
    hp_gguf_model *g = NULL;
    ok_or_input(hp_gguf_model_map(&g, f, HP_DT_BF16, &err));
    hp_gguf_model_free(g);
    char *tj = NULL, *tc = NULL;
    ok_or_input(hp_gguf_tokenizer(f, &tj, &tc, &err));
    free(tj);
    free(tc);
    hp_gguf_close(f);
    return 0;
}
