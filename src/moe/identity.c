/*
 * identity.c — a 64-bit digest of the weights the ranks of an EP group must hold identically, so that ranks
 * started on different checkpoints (same config, other weights) are refused before any exchange instead of
 * mixing two models.
 *
 * Each rank holds other experts, so a rank cannot hash what a peer holds; the digest covers what every rank
 * can read in the same time whatever the model's size:
 *
 *   settings      archetype, router kind, E, H, K, I, sI, groups, norm, routed_scaling_factor, swiglu_limit
 *   replicated    the router weight and biases, the shared expert(s), as loaded (every rank holds them whole)
 *   checkpoint    the tensor table of every file: names, dtypes, shapes, byte ranges (the safetensors headers)
 *                 and the bytes of the layer's routed-expert tensors: all of them when they total at most
 *                 HP__ID_FULL_BYTES, else HP__ID_WINDOW bytes at the start of every expert of every tensor
 *   shard folder  manifest.json whole (it lists every rank file's tensors and slices, and the folder's
 *                 identity when `hyperpar shard` wrote one); the experts are in other ranks' files
 *
 * So two checkpoints that differ only inside one expert of a layer whose experts exceed 64 MiB can share a
 * digest unless the change falls in a sampled window: the check catches another checkpoint, not a flipped
 * bit (docs/moe.md).
 */
#include "moe/moe_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Hash every expert byte of a layer up to 64 MiB (a fraction of a second); past that, windows. */
#define HP__ID_FULL_BYTES ((uint64_t)64 << 20)
/* 64 bytes: one cache line of each expert, enough to tell two random initialisations or two trainings apart. */
#define HP__ID_WINDOW 64
/* manifest.json larger than this is not a manifest hyperpar wrote. */
#define HP__ID_MANIFEST_MAX ((size_t)256 << 20)

static void hash_i64(hp_hash64 *h, int64_t v) { hp_hash64_update(h, &v, sizeof v); }

static void hash_f64(hp_hash64 *h, const double *v, int64_t n)
{
    if (v) hp_hash64_update(h, v, (size_t)n * sizeof *v);
    else hash_i64(h, -1);
}

static void hash_f32(hp_hash64 *h, const float *v, int64_t n)
{
    if (v) hp_hash64_update(h, v, (size_t)n * sizeof *v);
    else hash_i64(h, -1);
}

/* Hashes bytes [off, off + len) of tensor t, copied out of the mapping in pieces of ID_PIECE bytes with
 * hp_st_read: a file truncated meanwhile is an
 * error, not SIGBUS. */
#define ID_PIECE ((size_t)1 << 20)
static hp_status hash_bytes(hp_hash64 *h, const hp_st_file *f, const hp_st_tensor *t, uint64_t off, uint64_t len,
                            unsigned char *buf, hp_err *err)
{
    for (uint64_t done = 0; done < len;) {
        size_t n = len - done < ID_PIECE ? (size_t)(len - done) : ID_PIECE;
        hp_status st = hp_st_read(f, t, off + done, buf, n, err);
        if (st != HP_OK) return st;
        hp_hash64_update(h, buf, n);
        done += n;
    }
    return HP_OK;
}

/* The checkpoint's tensor table, then the layer's routed-expert bytes (all, or one window per expert). */
static hp_status hash_checkpoint(hp_hash64 *h, const hp_moe_layer *l, const hp_ckpt *ck, hp_err *err)
{
    char pfx[128];
    snprintf(pfx, sizeof pfx, "%sexperts.", l->prefix);
    const size_t pl = strlen(pfx), n = hp_ckpt_count(ck);
    uint64_t expert_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const hp_st_tensor *t = hp_ckpt_at(ck, i)->t;
        hp_hash64_update(h, t->name, strlen(t->name) + 1);
        int64_t v[3 + HP_MAX_DIMS] = {t->dtype, t->n_dims, (int64_t)(t->end - t->begin)};
        memcpy(v + 3, t->shape, sizeof t->shape);
        hp_hash64_update(h, v, sizeof v);
        if (!strncmp(t->name, pfx, pl)) expert_bytes += t->end - t->begin;
    }
    const bool all = expert_bytes <= HP__ID_FULL_BYTES;
    unsigned char *buf = malloc(ID_PIECE);
    if (!buf) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_status st = HP_OK;
    for (size_t i = 0; i < n && st == HP_OK; i++) {
        const hp_ckpt_tensor *ct = hp_ckpt_at(ck, i);
        const hp_st_tensor *t = ct->t;
        if (strncmp(t->name, pfx, pl) != 0) continue;
        const uint64_t bytes = t->end - t->begin;
        if (all) {
            st = hash_bytes(h, ct->file, t, 0, bytes, buf, err);
            continue;
        }
        /* A batched tensor [E, ...] holds E experts: one window at the start of each; a per-expert one, its
         * start. */
        const int64_t parts = t->n_dims == 3 && t->shape[0] > 0 ? t->shape[0] : 1;
        const uint64_t step = bytes / (uint64_t)parts;
        for (int64_t e = 0; e < parts && st == HP_OK; e++) {
            uint64_t off = (uint64_t)e * step, len = step < HP__ID_WINDOW ? step : HP__ID_WINDOW;
            st = hash_bytes(h, ct->file, t, off, len, buf, err);
        }
    }
    free(buf);
    return st;
}

/* dir/manifest.json whole. */
static hp_status hash_manifest(hp_hash64 *h, const char *dir, hp_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    int fd = -1;
    hp_status st = hp_open_regular(path, &fd, err);
    if (st != HP_OK) return st;
    char *buf = malloc(1 << 16);
    size_t total = 0;
    ssize_t got = 0;
    while (buf && (got = read(fd, buf, 1 << 16)) > 0 && total <= HP__ID_MANIFEST_MAX) {
        hp_hash64_update(h, buf, (size_t)got);
        total += (size_t)got;
    }
    close(fd);
    free(buf);
    if (!buf) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (got < 0) return hp_err_set(err, HP_ERR_IO, "%s: read failed", path);
    if (total > HP__ID_MANIFEST_MAX)
        return hp_err_set(err, HP_ERR_INPUT, "%s is larger than %zu MiB; it is not a manifest hyperpar shard wrote",
                          path, HP__ID_MANIFEST_MAX >> 20);
    return HP_OK;
}

hp_status hp_moe_layer_identity(const hp_moe_layer *l, const hp_model *m, const char *shard_dir, uint64_t *out,
                                hp_err *err)
{
    *out = 0;
    hp_hash64 h;
    hp_hash64_init(&h, 0);
    int64_t s[] = {l->layer, l->archetype, l->router, l->shared, l->act, l->n_experts, l->n_hidden, l->top_k,
                   l->d_expert, l->d_shared, l->n_group, l->topk_group, l->norm_topk_prob};
    hp_hash64_update(&h, s, sizeof s);
    double f[] = {l->routed_scaling_factor, l->swiglu_limit, l->swiglu_alpha};
    hash_f64(&h, f, 3);
    const int64_t E = l->n_experts, H = l->n_hidden, sI = l->d_shared;
    hash_f64(&h, l->w_router, E * H);
    hash_f64(&h, l->b_router, E);
    hash_f64(&h, l->b_correction, E);
    hash_f32(&h, l->ws_gate_up, 2 * sI * H);
    hash_f32(&h, l->ws_down, H * sI);
    hash_f32(&h, l->ws_gate, H);
    if (shard_dir) {
        hp_status st = hash_manifest(&h, shard_dir, err);
        if (st != HP_OK) return st;
    } else if (m && m->ckpt) {
        hp_status st = hash_checkpoint(&h, l, m->ckpt, err);
        if (st != HP_OK) return st;
    }
    *out = hp_hash64_final(&h);
    return HP_OK;
}
