/*
 * identity.c — knowing that every rank file of a shard folder belongs to it and says what the manifest says.
 *
 *   identity   32 hex digits, in manifest.json and in every rank file's __metadata__ (hyperpar_identity):
 *              XXH64 (two seeds) over the mesh, every rank's layout digest (below), and each source tensor's
 *              name, dtype, shape and a content sample (first, middle and last 4 KiB). Two folders of different
 *              sources, weights or layouts differ; re-sharding the same weights into the same layout gives the
 *              same identity and byte-identical rank files, wherever the source lies and however the plan was
 *              given (the plan JSON names the source path, so its fingerprint is not part of it).
 *   layout     16 hex digits per rank file (hyperpar_layout): XXH64 of the global tensor list and of that
 *              rank's manifest entry (names, globals, shapes, slices, expert ranges). An edited manifest (a
 *              slice moved, two ranks' expert ranges swapped) no longer matches the files it describes.
 *   checksum   XXH64 of each whole rank file, in the manifest; `merge --verify` reads every file to check it.
 *   tiling     the distinct blocks of each tensor cover its global shape exactly once (merge).
 *
 * None of these is cryptographic: they catch accidents (a file copied from another folder, a hand edit, a
 * truncated or flipped file), not an adversary who edits the manifest and the files together.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shard/shard_int.h"

/* ---- canonical text fed to the hash ---- */

static void h_str(hp_hash64 *h, const char *s) { hp_hash64_update(h, s, strlen(s) + 1); /* with its NUL */ }

static void h_i64(hp_hash64 *h, int64_t v)
{
    char b[32];
    int n = snprintf(b, sizeof b, "%lld;", (long long)v);
    hp_hash64_update(h, b, (size_t)n);
}

static void h_shape(hp_hash64 *h, int n, const int64_t *shape)
{
    h_i64(h, n);
    for (int d = 0; d < n; d++) h_i64(h, shape[d]);
}

/* ---- identity ---- */

#define SAMPLE 4096 /* bytes hashed at each of three places of a tensor: a page, cheap even for 100k tensors */

hp_status hp__identity(const hp_model *m, const hp_shard_layout *l, char *out, hp_err *err)
{
    hp_hash64 h[2];
    hp_hash64_init(&h[0], 0);
    hp_hash64_init(&h[1], 0x9e3779b97f4a7c15ull);
    uint8_t *buf = malloc(SAMPLE);
    hp__mtensor *mts = hp_calloc(l->n_tensors ? l->n_tensors : 1, sizeof *mts);
    hp_status st = buf && mts ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    uint64_t globals = hp__globals_digest_model(m);
    for (int k = 0; k < 2; k++) {
        h_str(&h[k], "hyperpar-identity 1");
        for (int d = 0; d < l->mesh.n_dims; d++) {
            h_str(&h[k], l->mesh.names[d]);
            h_i64(&h[k], l->mesh.sizes[d]);
        }
        h_i64(&h[k], l->ep);
    }
    for (int64_t r = 0; r < l->world && st == HP_OK; r++) {
        size_t held = 0;
        for (size_t i = 0; i < l->n_tensors && st == HP_OK; i++) {
            hp_shard_tensor t;
            st = hp_shard_rank_tensor(l, r, i, &t, err);
            if (st == HP_OK && !t.absent) hp__mtensor_from(&t, &mts[held++]);
        }
        uint64_t d = hp__rank_layout(globals, mts, held);
        for (int k = 0; st == HP_OK && k < 2; k++) hp_hash64_update(&h[k], &d, sizeof d);
    }
    free(mts);
    for (size_t i = 0; i < m->n_params && st == HP_OK; i++) {
        const hp_param *p = &m->params[i];
        const hp_ckpt_tensor *ct = hp_ckpt_find(m->ckpt, p->name);
        if (!ct) {
            st = hp_err_set(err, HP_ERR_INPUT, "tensor '%s' is missing from the checkpoint", p->name);
            break;
        }
        const uint8_t *data = hp_st_data(ct->file, ct->t);
        uint64_t nb = ct->t->end - ct->t->begin;
        uint64_t at[3] = {0, nb > SAMPLE ? nb / 2 - SAMPLE / 2 : 0, nb > SAMPLE ? nb - SAMPLE : 0};
        for (int k = 0; k < 2; k++) {
            h_str(&h[k], p->name);
            h_str(&h[k], hp_dtype_name(p->dtype));
            h_shape(&h[k], p->n_dims, p->shape);
        }
        for (int s = 0; s < 3 && st == HP_OK; s++) {
            size_t n = nb < SAMPLE ? (size_t)nb : SAMPLE;
            if (n == 0) break;
            if (!hp__guarded_copy(buf, data + at[s], n)) {
                st = hp_err_set(err, HP_ERR_IO, "%s: the source changed while reading (reading tensor '%s' faulted: "
                                "the file was truncated); nothing was written. Run again once no other program "
                                "writes to it", hp_st_path(ct->file), p->name);
                break;
            }
            for (int k = 0; k < 2; k++) hp_hash64_update(&h[k], buf, n);
        }
    }
    free(buf);
    if (st == HP_OK) {
        hp__hex64(hp_hash64_final(&h[0]), out);
        hp__hex64(hp_hash64_final(&h[1]), out + 16);
    }
    return st;
}

/* ---- layout digests ---- */

uint64_t hp__globals_digest_model(const hp_model *m)
{
    hp_hash64 h;
    hp_hash64_init(&h, 0);
    for (size_t i = 0; i < m->n_params; i++) {
        h_str(&h, m->params[i].name);
        h_str(&h, hp_dtype_name(m->params[i].dtype));
        h_shape(&h, m->params[i].n_dims, m->params[i].shape);
    }
    return hp_hash64_final(&h);
}

uint64_t hp__globals_digest_manifest(const hp__manifest *man)
{
    hp_hash64 h;
    hp_hash64_init(&h, 0);
    for (size_t i = 0; i < man->n_globals; i++) {
        h_str(&h, man->globals[i].name);
        h_str(&h, hp_dtype_name(man->globals[i].dtype));
        h_shape(&h, man->globals[i].n_dims, man->globals[i].shape);
    }
    return hp_hash64_final(&h);
}

uint64_t hp__rank_layout(uint64_t globals, const hp__mtensor *ts, size_t n)
{
    hp_hash64 h;
    hp_hash64_init(&h, globals);
    h_i64(&h, (int64_t)n);
    for (size_t i = 0; i < n; i++) {
        const hp__mtensor *t = &ts[i];
        h_str(&h, t->name);
        h_str(&h, t->stacked ? "stack" : "plain");
        h_str(&h, hp_dtype_name(t->dtype));
        h_shape(&h, t->n_dims, t->global_shape);
        h_i64(&h, t->n_globals);
        for (int e = 0; e < t->n_globals; e++) h_str(&h, t->globals[e]);
        h_i64(&h, t->n_slices);
        for (int k = 0; k < t->n_slices; k++) {
            h_i64(&h, t->slices[k].dim);
            h_i64(&h, t->slices[k].offset);
            h_i64(&h, t->slices[k].length);
        }
        h_i64(&h, t->expert_count ? t->expert_first : -1);
        h_i64(&h, t->expert_count);
    }
    return hp_hash64_final(&h);
}

void hp__mtensor_from(const hp_shard_tensor *t, hp__mtensor *mt)
{
    memset(mt, 0, sizeof *mt);
    mt->name = t->name;
    mt->n_globals = t->n_globals;
    mt->globals = (const char **)t->globals;
    mt->stacked = t->stacked;
    mt->dtype = t->dtype;
    mt->n_dims = t->n_dims;
    memcpy(mt->global_shape, t->global_shape, sizeof mt->global_shape);
    mt->n_slices = t->n_slices;
    memcpy(mt->slices, t->slices, sizeof mt->slices);
    mt->expert_first = t->expert_count ? t->expert_first : 0;
    mt->expert_count = t->expert_count;
}

/* ---- rank-file checks ---- */

static bool lists_rank(const char *ranks, int64_t r)
{
    for (const char *s = ranks; s && *s;) {
        char *end = NULL;
        long long v = strtoll(s, &end, 10);
        if (end == s) return false;
        if (v == (long long)r) return true;
        s = *end == ',' ? end + 1 : end;
    }
    return false;
}

hp_status hp__rank_file_check(const hp__manifest *man, uint64_t globals, int64_t r, const hp_st_file *f,
                              const char *path, hp_err *err)
{
    const hp__mrank *rk = &man->ranks[r];
    const char *id = hp_st_metadata_get(f, "hyperpar_identity");
    const char *world = hp_st_metadata_get(f, "hyperpar_world"), *ranks = hp_st_metadata_get(f, "hyperpar_rank");
    uint64_t sum = 0, fsize = 0;
    hp_err cerr;
    /* The rank file is byte for byte the one this manifest was written with (its checksum), so the manifest's
     * identity is what was edited: said once, about the manifest, whichever rank file shows it. */
    if (id && strcmp(id, man->identity) != 0 && hp__file_checksum(path, &sum, &fsize, &cerr) == HP_OK &&
        sum == rk->checksum && fsize == rk->bytes)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%.*smanifest.json's identity is %s (%s), but the rank files it lists carry %s and match its "
                          "checksums: the manifest was edited after 'hyperpar shard' wrote it. Put back the "
                          "identity %s (or the original manifest.json), or shard again",
                          strrchr(path, '/') ? (int)(strrchr(path, '/') - path + 1) : 0, path, man->identity,
                          strspn(man->identity, "0") == 32 ? "zeroed" : "edited", id, id);
    if (!id || strcmp(id, man->identity) != 0)
        return hp_err_set(err, HP_ERR_INPUT,
                          "rank %lld: %s belongs to another shard folder: its identity is %s, this folder's is %s "
                          "(manifest.json); put back the rank file 'hyperpar shard' wrote here, or shard again",
                          (long long)r, path, id ? id : "(none: not written by this hyperpar)", man->identity);
    char want[32];
    snprintf(want, sizeof want, "%lld", (long long)man->world);
    if (!world || strcmp(world, want) != 0 || !lists_rank(ranks, r))
        return hp_err_set(err, HP_ERR_INPUT,
                          "rank %lld: %s is misnamed: it is this folder's file for rank %s (hyperpar_rank in its "
                          "__metadata__), not rank %lld's. Rank files are named rank-NNNNN.safetensors after the "
                          "rank they hold; restore the original names",
                          (long long)r, path, ranks ? ranks : "(none)", (long long)r);
    uint64_t size = hp_st_file_size(f);
    if (size != rk->bytes)
        return hp_err_set(err, HP_ERR_INPUT,
                          "rank %lld: %s has %llu bytes but manifest.json records %llu; the file was modified after "
                          "'hyperpar shard' wrote it",
                          (long long)r, path, (unsigned long long)size, (unsigned long long)rk->bytes);
    if (hp_st_count(f) != rk->n_tensors)
        return hp_err_set(err, HP_ERR_INPUT, "rank %lld: %s holds %zu tensors but the manifest lists %zu", (long long)r,
                          path, hp_st_count(f), rk->n_tensors);
    for (size_t i = 0; i < rk->n_tensors; i++) {
        const hp__mtensor *mt = &rk->tensors[i];
        hp_shard_tensor t;
        hp_status st = hp__manifest_tensor(mt, &t, err);
        if (st != HP_OK) {
            hp_err_prefix(err, "manifest.json: rank %lld", (long long)r);
            return st;
        }
        const hp_st_tensor *ft = hp_st_find(f, mt->name);
        bool ok = ft && ft->dtype == t.dtype && ft->n_dims == t.n_dims &&
                  !memcmp(ft->shape, t.local_shape, (size_t)t.n_dims * sizeof(int64_t));
        if (!ok)
            return hp_err_set(err, HP_ERR_INPUT,
                              "rank %lld: %s: tensor '%s' is %s in the file but the manifest expects %s with the "
                              "shape its slices give; the file does not match the manifest",
                              (long long)r, path, mt->name, ft ? "different" : "missing", hp_dtype_name(mt->dtype));
    }
    const char *layout = hp_st_metadata_get(f, "hyperpar_layout");
    char got[17];
    hp__hex64(hp__rank_layout(globals, rk->tensors, rk->n_tensors), got);
    if (!layout || strcmp(layout, got) != 0)
        return hp_err_set(err, HP_ERR_INPUT,
                          "rank %lld: manifest.json's entry for rank %lld (its tensors, slices or expert ranges) is "
                          "not what %s was written with (layout %s, the entry gives %s); the manifest was edited. "
                          "Restore it or shard again",
                          (long long)r, (long long)r, path, layout ? layout : "(none)", got);
    return HP_OK;
}

hp_status hp__rank_file_missing(const char *dir, int64_t r, const char *path, hp_err *err)
{
    char others[512] = "";
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t o = 0;
    while (d && (e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        size_t len = strlen(n);
        bool st_file = len > 12 && !strcmp(n + len - 12, ".safetensors");
        bool rank_name = len == 22 && !strncmp(n, "rank-", 5) && strspn(n + 5, "0123456789") == 5;
        if (!st_file || rank_name || o + len + 8 >= sizeof others) continue;
        o += (size_t)snprintf(others + o, sizeof others - o, "%s'%s'", o ? ", " : "", n);
    }
    if (d) closedir(d);
    if (others[0])
        return hp_err_set(err, HP_ERR_INPUT,
                          "rank %lld: %s is missing; the folder has %s, which is not a name hyperpar writes: rank "
                          "files are named rank-NNNNN.safetensors (five digits). Rename the misnamed file back",
                          (long long)r, path, others);
    return hp_err_set(err, HP_ERR_INPUT,
                      "rank %lld: %s is missing; the shard folder is incomplete (re-run 'hyperpar shard')",
                      (long long)r, path);
}

hp_status hp__file_checksum(const char *path, uint64_t *sum, uint64_t *size, hp_err *err)
{
    int fd = -1;
    hp_status st = hp_open_regular(path, &fd, err);
    if (st != HP_OK) return st;
    static const size_t chunk = 1u << 22; /* 4 MiB reads: full disk speed, and the interrupt check per piece */
    uint8_t *buf = malloc(chunk);
    hp_hash64 h;
    hp_hash64_init(&h, 0);
    uint64_t total = 0;
    if (!buf) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    while (st == HP_OK) {
        if (hp__interrupted()) {
            st = hp__interrupt_error(err);
            break;
        }
        ssize_t n = read(fd, buf, chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) st = hp_err_set(err, HP_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (n <= 0) break;
        hp_hash64_update(&h, buf, (size_t)n);
        total += (uint64_t)n;
    }
    free(buf);
    close(fd);
    *sum = hp_hash64_final(&h);
    *size = total;
    return st;
}

/* ---- tiling ---- */

static bool segs_meet(const hp__segs *a, const hp__segs *b, int d, int64_t *lo, int64_t *hi)
{
    for (int i = 0; i < a->n[d]; i++)
        for (int j = 0; j < b->n[d]; j++) {
            int64_t l = a->off[d][i] > b->off[d][j] ? a->off[d][i] : b->off[d][j];
            int64_t ea = a->off[d][i] + a->len[d][i], eb = b->off[d][j] + b->len[d][j];
            int64_t h = ea < eb ? ea : eb;
            if (l < h) {
                *lo = l;
                *hi = h;
                return true;
            }
        }
    return false;
}

static int cmp_i64pair(const void *x, const void *y)
{
    const int64_t *a = x, *b = y;
    return (a[0] > b[0]) - (a[0] < b[0]);
}

hp_status hp__check_tiling(const char *name, const int64_t *shape, int n_dims, int n, const hp__segs *const *segs,
                           const int64_t *ranks, hp_err *err)
{
    /* Overlaps first: two distinct blocks overlap when their segments meet along every dim. */
    for (int a = 0; a < n; a++)
        for (int b = a + 1; b < n; b++) {
            int64_t lo = 0, hi = 0;
            int d = 0;
            char where[256] = "";
            size_t o = 0;
            for (; d < n_dims; d++) {
                if (!segs_meet(segs[a], segs[b], d, &lo, &hi)) break;
                if (o < sizeof where)
                    o += (size_t)snprintf(where + o, sizeof where - o, "%sdim %d [%lld, %lld)", d ? ", " : "", d,
                                          (long long)lo, (long long)hi);
            }
            if (d == n_dims)
                return hp_err_set(err, HP_ERR_INPUT,
                                  "manifest.json: tensor '%s': ranks %lld and %lld both hold %s with different "
                                  "slices; the slices of a tensor must not overlap. The manifest was edited: restore "
                                  "it or shard again",
                                  name, (long long)ranks[a], (long long)ranks[b], n_dims ? where : "the scalar");
        }
    /* No overlap: the blocks tile the tensor iff their volumes add up to it. A dim whose blocks leave a gap
     * is named with the gap. */
    int64_t total = 1, sum = 0;
    for (int d = 0; d < n_dims; d++) total *= shape[d]; /* fits: checked by the manifest reader */
    for (int a = 0; a < n && sum < total; a++) {
        int64_t v = 1;
        for (int d = 0; d < n_dims; d++) {
            int64_t len = 0;
            for (int q = 0; q < segs[a]->n[d]; q++) len += segs[a]->len[d][q];
            v *= len;
        }
        sum += v;
    }
    if (sum >= total) return HP_OK;
    int64_t *iv = malloc(((size_t)n * HP__SEG_MAX + 1) * 2 * sizeof *iv);
    if (!iv) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int d = 0; d < n_dims; d++) {
        size_t k = 0;
        for (int a = 0; a < n; a++)
            for (int q = 0; q < segs[a]->n[d]; q++) {
                iv[2 * k] = segs[a]->off[d][q];
                iv[2 * k + 1] = segs[a]->off[d][q] + segs[a]->len[d][q];
                k++;
            }
        qsort(iv, k, 2 * sizeof *iv, cmp_i64pair);
        int64_t reach = 0;
        for (size_t i = 0; i <= k; i++) {
            int64_t next = i < k ? iv[2 * i] : shape[d];
            if (next > reach) {
                free(iv);
                return hp_err_set(err, HP_ERR_INPUT,
                                  "manifest.json: tensor '%s': no rank holds [%lld, %lld) of dim %d; the folder "
                                  "cannot rebuild it. The manifest was edited or rank entries are missing: restore "
                                  "it or shard again",
                                  name, (long long)reach, (long long)next, d);
            }
            if (i < k && iv[2 * i + 1] > reach) reach = iv[2 * i + 1];
        }
    }
    free(iv);
    return hp_err_set(err, HP_ERR_INPUT,
                      "manifest.json: tensor '%s': the ranks' slices hold %lld of its %lld elements; some block is "
                      "held by no rank. The manifest was edited: restore it or shard again",
                      name, (long long)sum, (long long)total);
}
