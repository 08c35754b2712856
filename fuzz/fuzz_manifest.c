/*
 * fuzz_manifest.c — libFuzzer target: shard manifest.json text into the strict reader (hp__manifest_parse),
 * then every rank tensor it lists through what hp_shard_rank_open and merge do with it: local shape and
 * bytes from the slices (hp__manifest_tensor), the copy geometry (hp__geom_make) and the layout digest. Any input must end in
 * HP_OK or a clean error; never a crash, a leak, an out-of-bounds access or undefined behaviour.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shard/shard_int.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hp__manifest *m = NULL;
    hp_err err;
    if (hp__manifest_parse((const char *)data, size, "manifest.json", &m, &err) != HP_OK) {
        if (m != NULL || err.msg[0] == '\0') abort(); /* contract: on failure the output is NULL, the message set */
        return 0;
    }
    uint64_t globals = hp__globals_digest_manifest(m);
    for (size_t r = 0; r < m->n_ranks; r++) {
        const hp__mrank *rk = &m->ranks[r];
        if (rk->rank != (int64_t)r || rk->file_rank > rk->rank || strlen(m->identity) != 32) abort();
        (void)hp__rank_layout(globals, rk->tensors, rk->n_tensors);
        for (size_t i = 0; i < rk->n_tensors; i++) {
            hp_shard_tensor t;
            if (hp__manifest_tensor(&rk->tensors[i], &t, &err) != HP_OK) {
                if (err.msg[0] == '\0') abort();
                continue;
            }
            hp__segs s;
            hp__geom g;
            if (hp__segs_from_tensor(&t, &s, &err) == HP_OK) (void)hp__geom_make(t.name, t.dtype, &s, &g, &err);
        }
    }
    hp__manifest_free(m);
    return 0;
}
