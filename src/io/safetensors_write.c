/*
 * safetensors_write.c — the safetensors writer: collects tensors (data borrowed, or produced by a fill
 * callback while writing), then writes
 *
 *   u64 LE N | compact JSON header padded with spaces to a multiple of 8 | tensors in the order added
 *
 * to "<path>.tmp.<pid>" and renames it over path, so a reader never sees a half-written file. The header
 * (with the caller's __metadata__, e.g. gen's marker) is flushed before any data, so that a later run can
 * tell a temporary left by a killed writer. A signal recorded by hp_interrupt stops the write within one
 * piece (at most 4 MiB): the temporary is removed and the write fails with "interrupted". The header
 * lists "__metadata__" first (when set), then each tensor as {"dtype","shape","data_offsets"}; offsets run
 * back to back from 0, so the result passes hp_st_open's layout checks by construction.
 *
 * Names are unique (an open-addressing hash keeps add O(1) for checkpoints with 100k tensors).
 */
#include "hyperpar/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/guard.h"

/* Fill callbacks get pieces of at most this size, so streaming a tensor of any size needs only 4 MiB. A
 * multiple of 24 bytes so that every piece holds whole elements of every dtype (8-byte types and the 3-byte
 * groups of four F6 values). */
#define HP_ST_FILL_CHUNK (((size_t)4 << 20) / 24 * 24)

typedef struct st_wtensor {
    char *name;
    hp_dtype dtype;
    int n_dims;
    int64_t shape[HP_MAX_DIMS];
    int64_t nbytes;
    const void *data; /* borrowed; NULL when fill is used */
    hp_st_fill_fn fill;
    void *ctx;
} st_wtensor;

struct hp_st_writer {
    st_wtensor *t; /* [n], in the order added */
    size_t n, cap;
    size_t *slots; /* [n_slots] open-addressing hash of names: tensor index + 1, 0 = empty */
    size_t n_slots;
    char **meta_keys, **meta_values; /* [n_meta] */
    size_t n_meta, cap_meta;
    int threads; /* > 1: tensors are produced in parallel and written with pwrite at their offsets */
};

void hp_st_writer_set_threads(hp_st_writer *w, int n) { w->threads = n; }

static uint64_t name_hash(const char *s) { return hp_hash64_bytes(s, strlen(s), 0); }

/* The slot holding name, or the empty slot where it would go. n_slots is a power of two, never full. */
static size_t *find_slot(const hp_st_writer *w, const char *name)
{
    size_t mask = w->n_slots - 1;
    for (size_t i = (size_t)name_hash(name) & mask;; i = (i + 1) & mask) {
        size_t *s = &w->slots[i];
        if (*s == 0 || strcmp(w->t[*s - 1].name, name) == 0) return s;
    }
}

/* Keeps the table at most half full. */
static bool grow_slots(hp_st_writer *w)
{
    if ((w->n + 1) * 2 <= w->n_slots) return true;
    size_t n_slots = w->n_slots ? w->n_slots * 2 : 64;
    size_t *old = w->slots, old_n = w->n_slots;
    w->slots = hp_calloc(n_slots, sizeof *w->slots);
    if (!w->slots) {
        w->slots = old;
        return false;
    }
    w->n_slots = n_slots;
    for (size_t i = 0; i < old_n; i++)
        if (old[i]) *find_slot(w, w->t[old[i] - 1].name) = old[i];
    free(old);
    return true;
}

hp_st_writer *hp_st_writer_create(void) { return hp_calloc(1, sizeof(hp_st_writer)); }

void hp_st_writer_destroy(hp_st_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) free(w->t[i].name);
    for (size_t i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->t);
    free(w->slots);
    free(w->meta_keys);
    free(w->meta_values);
    free(w);
}

static bool valid_utf8(const char *s)
{
    json_t *j = json_string(s); /* jansson validates UTF-8 */
    json_decref(j);
    return j != NULL;
}

hp_status hp_st_writer_set_metadata(hp_st_writer *w, const char *key, const char *value, hp_err *err)
{
    if (!key || !value || !valid_utf8(key) || !valid_utf8(value))
        return hp_err_set(err, HP_ERR_INPUT,
                          "safetensors writer: metadata key and value must be non-NULL UTF-8 strings.");
    for (size_t i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta_keys[i], key) == 0) {
            char *v = hp_strdup(value);
            if (!v) return hp_err_set(err, HP_ERR_NOMEM, "safetensors writer: out of memory.");
            free(w->meta_values[i]);
            w->meta_values[i] = v;
            return HP_OK;
        }
    }
    if (w->n_meta == w->cap_meta) {
        size_t cap = w->cap_meta ? w->cap_meta * 2 : 8;
        char **k = realloc(w->meta_keys, cap * sizeof *k);
        if (k) w->meta_keys = k;
        char **v = realloc(w->meta_values, cap * sizeof *v);
        if (v) w->meta_values = v;
        if (!k || !v) return hp_err_set(err, HP_ERR_NOMEM, "safetensors writer: out of memory.");
        w->cap_meta = cap;
    }
    char *k = hp_strdup(key), *v = hp_strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return hp_err_set(err, HP_ERR_NOMEM, "safetensors writer: out of memory.");
    }
    w->meta_keys[w->n_meta] = k;
    w->meta_values[w->n_meta++] = v;
    return HP_OK;
}

static hp_status writer_add(hp_st_writer *w, const char *name, hp_dtype dt, int n_dims, const int64_t *shape,
                            const void *data, hp_st_fill_fn fill, void *ctx, hp_err *err)
{
    if (!name || !name[0] || strcmp(name, "__metadata__") == 0 || !valid_utf8(name))
        return hp_err_set(err, HP_ERR_INPUT,
                          "safetensors writer: tensor name '%s' is not usable; names must be non-empty UTF-8 and "
                          "not \"__metadata__\".", name ? name : "(null)");
    if ((unsigned)dt >= HP_DT_COUNT)
        return hp_err_set(err, HP_ERR_INPUT, "safetensors writer: tensor '%s': dtype %d is not a known dtype.",
                          name, (int)dt);
    if (n_dims < 0 || n_dims > HP_MAX_DIMS || (n_dims > 0 && !shape))
        return hp_err_set(err, HP_ERR_INPUT,
                          "safetensors writer: tensor '%s': rank %d is outside 0..%d (or the shape is missing).",
                          name, n_dims, HP_MAX_DIMS);
    int64_t n_elems = 1, nbytes;
    for (int d = 0; d < n_dims; d++) {
        if (!hp_mul_i64(n_elems, shape[d], &n_elems))
            return hp_err_set(err, HP_ERR_INPUT,
                              "safetensors writer: tensor '%s': dimension %d is %lld, negative or overflowing the "
                              "element count.", name, d, (long long)shape[d]);
    }
    if (!hp_dtype_nbytes(dt, n_elems, &nbytes))
        return hp_err_set(err, HP_ERR_INPUT,
                          "safetensors writer: tensor '%s': %lld elements of %s are not a whole number of bytes "
                          "or overflow.", name, (long long)n_elems, hp_dtype_name(dt));
    if (nbytes > 0 && !data && !fill)
        return hp_err_set(err, HP_ERR_INPUT, "safetensors writer: tensor '%s': no data for %lld bytes.", name,
                          (long long)nbytes);
    if (!grow_slots(w)) return hp_err_set(err, HP_ERR_NOMEM, "safetensors writer: out of memory.");
    size_t *slot = find_slot(w, name);
    if (*slot)
        return hp_err_set(err, HP_ERR_INPUT, "safetensors writer: tensor '%s' was added twice; names must be "
                          "unique.", name);
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        st_wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) return hp_err_set(err, HP_ERR_NOMEM, "safetensors writer: out of memory.");
        w->t = t;
        w->cap = cap;
    }
    st_wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->name = hp_strdup(name);
    if (!t->name) return hp_err_set(err, HP_ERR_NOMEM, "safetensors writer: out of memory.");
    t->dtype = dt;
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) t->shape[d] = shape[d];
    t->nbytes = nbytes;
    t->data = fill ? NULL : data;
    t->fill = fill;
    t->ctx = ctx;
    *slot = ++w->n;
    return HP_OK;
}

hp_status hp_st_writer_add(hp_st_writer *w, const char *name, hp_dtype dt, int n_dims, const int64_t *shape,
                           const void *data, hp_err *err)
{
    return writer_add(w, name, dt, n_dims, shape, data, NULL, NULL, err);
}

hp_status hp_st_writer_add_fill(hp_st_writer *w, const char *name, hp_dtype dt, int n_dims,
                                const int64_t *shape, hp_st_fill_fn fill, void *ctx, hp_err *err)
{
    if (!fill) return hp_err_set(err, HP_ERR_INPUT, "safetensors writer: tensor '%s': fill callback is NULL.",
                                 name ? name : "(null)");
    return writer_add(w, name, dt, n_dims, shape, NULL, fill, ctx, err);
}

/* The compact JSON header, unpadded, into *out (caller frees). */
static hp_status build_header(const hp_st_writer *w, char **out, hp_err *err)
{
    *out = NULL;
    json_t *root = json_object();
    bool ok = root != NULL;
    if (ok && w->n_meta) {
        json_t *m = json_object();
        ok = m && json_object_set_new(root, "__metadata__", m) == 0;
        for (size_t i = 0; ok && i < w->n_meta; i++)
            ok = json_object_set_new(m, w->meta_keys[i], json_string(w->meta_values[i])) == 0;
    }
    int64_t off = 0;
    for (size_t i = 0; ok && i < w->n; i++) {
        const st_wtensor *t = &w->t[i];
        int64_t end;
        if (!hp_add_i64(off, t->nbytes, &end)) {
            json_decref(root);
            return hp_err_set(err, HP_ERR_INPUT, "safetensors writer: the data section overflows 64 bits at "
                              "tensor '%s'.", t->name);
        }
        /* set_new and append_new take the reference even when they fail, so nothing leaks on OOM. */
        json_t *e = json_object();
        if (json_object_set_new(root, t->name, e) != 0) {
            ok = false;
            break;
        }
        json_t *shape = json_array(), *offs = json_array();
        int rc = json_object_set_new(e, "dtype", json_string(hp_dtype_name(t->dtype)));
        rc |= json_object_set_new(e, "shape", shape);
        rc |= json_object_set_new(e, "data_offsets", offs);
        for (int d = 0; rc == 0 && d < t->n_dims; d++)
            rc |= json_array_append_new(shape, json_integer(t->shape[d]));
        if (rc == 0) rc |= json_array_append_new(offs, json_integer(off));
        if (rc == 0) rc |= json_array_append_new(offs, json_integer(end));
        ok = rc == 0;
        off = end;
    }
    *out = ok ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!*out) return hp_err_set(err, HP_ERR_NOMEM, "safetensors writer: out of memory building the header.");
    return HP_OK;
}

/* Names the file being written (path), never its temporary "<path>.tmp.<pid>": that name means nothing to the user. */
static hp_status write_error(const char *path, const char *what, int e, hp_err *err)
{
    return hp_err_set(err, HP_ERR_IO, "%s: cannot %s: %s.", path, what, strerror(e));
}

/* fwrite of all n bytes, accounted to the full-disk test hook (hp__test_write_fault). */
static bool put(FILE *fp, const void *buf, size_t n)
{
    return hp__test_write_fault(n) == 0 && fwrite(buf, 1, n, fp) == n;
}

/* Streams one tensor's bytes produced by its fill callback, chunk by chunk. */
static hp_status write_filled(FILE *fp, const char *path, const char *tmp, const st_wtensor *t,
                              unsigned char *chunk, hp_err *err)
{
    for (int64_t done = 0; done < t->nbytes;) {
        if (hp_interrupted()) return hp__interrupt_error(err);
        size_t n = (size_t)(t->nbytes - done) < HP_ST_FILL_CHUNK ? (size_t)(t->nbytes - done) : HP_ST_FILL_CHUNK;
        hp_status st = t->fill(t->ctx, chunk, n, err);
        if (st) {
            hp_err_prefix(err, "%s: tensor '%s'", path, t->name);
            return st;
        }
        if (!put(fp, chunk, n)) return write_error(path, "write", errno, err);
        done += (int64_t)n;
    }
    return HP_OK;
}

/* pwrite all of buf at off (short writes continue). */
static bool pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
    const unsigned char *p = buf;
    if (hp__test_write_fault(n) != 0) return false;
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return true;
}

/* The data section with w->threads threads: the file is sized first, then every tensor is produced (in
 * chunks, one buffer per thread) and written at its own offset; tensors go to threads dynamically since
 * their sizes differ by orders of magnitude. The first error (in tensor order) wins. */
static hp_status write_parallel(const hp_st_writer *w, FILE *fp, uint64_t data_start, const char *path,
                                const char *tmp, size_t chunk_size, hp_err *err)
{
    if (fflush(fp) != 0) return write_error(path, "write", errno, err);
    int fd = fileno(fp);
    uint64_t *offs = malloc(w->n * sizeof *offs), end = data_start;
    if (!offs) return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory.", path);
    for (size_t i = 0; i < w->n; i++) {
        offs[i] = end;
        end += (uint64_t)w->t[i].nbytes;
    }
    if (ftruncate(fd, (off_t)end) != 0) {
        free(offs);
        return write_error(path, "size", errno, err);
    }
    hp_status st = HP_OK;
    size_t failed_at = w->n;
    hp_err first;
    hp_err_clear(&first);
#pragma omp parallel num_threads(w->threads)
    {
        unsigned char *buf = malloc(chunk_size ? chunk_size : 1);
#pragma omp for schedule(dynamic, 1)
        for (size_t i = 0; i < w->n; i++) {
            const st_wtensor *t = &w->t[i];
            hp_err e;
            hp_status s = buf ? HP_OK : hp_err_set(&e, HP_ERR_NOMEM, "%s: out of memory.", path);
            for (int64_t done = 0; s == HP_OK && done < t->nbytes;) {
                if (hp_interrupted()) {
                    s = hp__interrupt_error(&e);
                    break;
                }
                size_t n = (size_t)(t->nbytes - done) < HP_ST_FILL_CHUNK ? (size_t)(t->nbytes - done) : HP_ST_FILL_CHUNK;
                const void *src = t->data ? (const unsigned char *)t->data + done : buf;
                if (!t->data) {
                    s = t->fill(t->ctx, buf, n, &e);
                    if (s != HP_OK) hp_err_prefix(&e, "%s: tensor '%s'", path, t->name);
                }
                if (s == HP_OK && !pwrite_all(fd, src, n, offs[i] + (uint64_t)done))
                    s = write_error(path, "write", errno, &e);
                done += (int64_t)n;
            }
            if (s != HP_OK) {
#pragma omp critical(hp_st_write_err)
                if (i < failed_at) {
                    failed_at = i;
                    first = e;
                    st = s;
                }
            }
        }
        free(buf);
    }
    free(offs);
    if (st != HP_OK && err) *err = first;
    return st;
}

hp_status hp_st_writer_write(hp_st_writer *w, const char *path, hp_err *err)
{
    char *hdr;
    hp_status hst = build_header(w, &hdr, err);
    if (hst) return hst;
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7; /* data section starts 8-aligned */
    if (padded > HP_ST_MAX_HEADER) {
        free(hdr);
        return hp_err_set(err, HP_ERR_INPUT, "%s: the header would be %zu bytes, over the %llu-byte limit of "
                          "safetensors readers; write fewer tensors per file.", path, padded, HP_ST_MAX_HEADER);
    }
    bool any_fill = false;
    size_t chunk_size = 1;
    for (size_t i = 0; i < w->n; i++) {
        if (!w->t[i].fill) continue;
        any_fill = true;
        if ((uint64_t)w->t[i].nbytes > chunk_size)
            chunk_size = (uint64_t)w->t[i].nbytes < HP_ST_FILL_CHUNK ? (size_t)w->t[i].nbytes : HP_ST_FILL_CHUNK;
    }
    unsigned char *chunk = any_fill ? malloc(chunk_size) : NULL;
    size_t tlen = strlen(path) + 32;
    char *tmp = malloc(tlen);
    if ((any_fill && !chunk) || !tmp) {
        free(hdr);
        free(chunk);
        free(tmp);
        return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory.", path);
    }
    snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());

    hp_status st = HP_OK;
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        st = write_error(path, "create", errno, err);
        goto out;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "        ";
    if (!put(fp, len8, 8) || !put(fp, hdr, hlen) || !put(fp, spaces, padded - hlen)) {
        st = write_error(path, "write", errno, err);
        goto out;
    }
    if (fflush(fp) != 0) { /* the header, with its metadata, is on disk before any data */
        st = write_error(tmp, "write", errno, err);
        goto out;
    }
    /* Test hook (hp_test_hooks.pause_mid_write = P): pauses with the temporary holding its header (P.ready,
     * then P.go or a signal), so tests interrupt or kill a writer at exactly this point; with pause_write_of =
     * TEXT only a file whose path holds TEXT (e.g. "step-4.tmp": the second checkpoint of a run). */
    const hp_test_hooks *hk = hp__test_hooks();
    if (hk->pause_mid_write && (!hk->pause_write_of || strstr(path, hk->pause_write_of)))
        hp__test_pause(hk->pause_mid_write, false);
    if (w->threads > 1 && w->n > 1)
        st = write_parallel(w, fp, 8 + (uint64_t)padded, path, tmp, chunk_size, err);
    for (size_t i = 0; i < w->n && st == HP_OK && !(w->threads > 1 && w->n > 1); i++) {
        const st_wtensor *t = &w->t[i];
        if (t->nbytes == 0) continue;
        if (hp_interrupted())
            st = hp__interrupt_error(err);
        else if (t->fill)
            st = write_filled(fp, path, tmp, t, chunk, err);
        else if (!put(fp, t->data, (size_t)t->nbytes))
            st = write_error(path, "write", errno, err);
    }
    if (st == HP_OK && hp_interrupted()) st = hp__interrupt_error(err);
    if (st) goto out;
    /* On disk before the rename: a crash after it never leaves the name pointing at missing data. EINVAL /
     * EROFS: a file system without sync (a pipe-like special file, /dev/shm on some kernels). */
    if (fflush(fp) != 0 || (fsync(fileno(fp)) != 0 && errno != EINVAL && errno != EROFS)) {
        st = write_error(path, "write", errno, err);
        goto out;
    }
    FILE *done = fp;
    fp = NULL;
    if (fclose(done) != 0) {
        st = write_error(path, "write", errno, err);
        goto out;
    }
    if (rename(tmp, path) != 0) st = write_error(path, "rename the temporary file into place", errno, err);
out:
    if (fp) fclose(fp);
    if (st) unlink(tmp);
    free(hdr);
    free(chunk);
    free(tmp);
    return st;
}
