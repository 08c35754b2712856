/*
 * data.c — token files for training: a flat little-endian uint16/uint32 stream or a safetensors input_ids
 * [N, S], cut into windows, ordered into global batches (docs/train.md, "Data, batches and schedule").
 *
 * Layout of a stream of n tokens with --seq S (window i = the S + 1 tokens starting at token i·S):
 *
 *   token:   0        S        2S              (W−1)·S      W·S  ...  n−1
 *            |--win 0-|                                        (W = floor((n − 1) / S))
 *                     |--win 1-|
 *                                              |--win W−1---|
 *
 * A stream in memory (hp_data_open_ids, train --text) is cut the same way, its mask (when it has one) window by
 * window beside the ids: window i's mask is that of tokens [i·S, i·S + S], and it scores the targets 1..S marked.
 *
 * The same streams (and safetensors input_ids, an --ids list, --random-input) are the token inputs of run, validate
 * and cost: hp_ids_load, at the end of this file, cuts a stream into rows without overlap instead of windows.
 *
 * The order of an epoch is the identity (--shuffle none) or a Fisher–Yates shuffle driven by splitmix64 seeded
 * by seed ^ epoch; the current epoch's permutation is kept (W int64s) and made again when a batch reaches
 * another epoch. Invariants after hp_data_open: W >= 1, every window lies inside the file as opened; the reads
 * go through pread / hp_st_read, so a file truncated later is an error naming it, never a SIGBUS.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/guard.h"
#include "hyperpar/data.h"
#include "hyperpar/safetensors.h"

struct hp_data {
    char *path;
    int fd;              /* a stream: the open file; -1 for safetensors */
    hp_st_file *st;      /* safetensors: the open file; NULL for a stream */
    const hp_st_tensor *t; /* input_ids */
    size_t es;           /* bytes per token */
    hp_data_dtype dt;
    int64_t seq, n_tokens, windows, row_len;
    int32_t *mem;        /* an in-memory stream (hp_data_open_ids): its ids [n_tokens], or NULL */
    uint8_t *mask;       /* its mask [n_tokens] (1: the token counts as a target), or NULL: every token does */
    int64_t *perm;       /* [windows]: the order of epoch perm_epoch (seeded only), or NULL */
    uint64_t perm_epoch;
    uint64_t perm_seed;
    void *buf;           /* one row's raw bytes [row_len · es] */
};

bool hp_data_dtype_parse(const char *s, hp_data_dtype *out)
{
    if (!strcmp(s, "uint16")) *out = HP_DATA_U16;
    else if (!strcmp(s, "uint32")) *out = HP_DATA_U32;
    else return false;
    return true;
}

bool hp_data_is_safetensors(const char *path)
{
    size_t n = strlen(path), k = strlen(".safetensors");
    return n >= k && !strcmp(path + n - k, ".safetensors");
}

/* Opens a token stream and counts its tokens (d->dt, d->es set): a size that is not a whole number of tokens is
 * refused. */
static hp_status open_stream_tokens(hp_data *d, const char *path, hp_err *err)
{
    hp_status st = hp_open_regular(path, &d->fd, err);
    if (st != HP_OK) return st;
    struct stat sb;
    if (fstat(d->fd, &sb) != 0) return hp_err_set(err, HP_ERR_IO, "%s: cannot stat it (%s)", path, strerror(errno));
    int64_t size = (int64_t)sb.st_size;
    const char *name = d->dt == HP_DATA_U16 ? "uint16" : "uint32";
    if (size % (int64_t)d->es)
        return hp_err_set(err, HP_ERR_INPUT, "%s: %lld bytes is not a whole number of %s tokens (%zu bytes each); "
                          "the file looks truncated, or its dtype is not --data-dtype %s", path, (long long)size,
                          name, d->es, name);
    d->n_tokens = size / (int64_t)d->es;
    return HP_OK;
}

static hp_status open_stream(hp_data *d, const char *path, hp_err *err)
{
    hp_status st = open_stream_tokens(d, path, err);
    if (st != HP_OK) return st;
    const char *name = d->dt == HP_DATA_U16 ? "uint16" : "uint32";
    if (d->n_tokens < d->seq + 1)
        return hp_err_set(err, HP_ERR_INPUT, "%s holds %lld %s tokens, fewer than one window of --seq %lld (%lld "
                          "tokens: the inputs and the label of the last one); give a longer file or a shorter --seq",
                          path, (long long)d->n_tokens, name, (long long)d->seq, (long long)(d->seq + 1));
    d->windows = (d->n_tokens - 1) / d->seq;
    d->row_len = d->seq + 1;
    return HP_OK;
}

static hp_status open_st(hp_data *d, const char *path, hp_err *err)
{
    hp_status st = hp_st_open(&d->st, path, err);
    if (st != HP_OK) return st;
    d->t = hp_st_find(d->st, "input_ids");
    if (!d->t) return hp_err_set(err, HP_ERR_INPUT, "%s has no tensor 'input_ids'; a safetensors token file holds "
                                 "input_ids I64 or I32 [N, S]", path);
    if (d->t->dtype != HP_DT_I64 && d->t->dtype != HP_DT_I32)
        return hp_err_set(err, HP_ERR_INPUT, "%s: input_ids is %s; expected I64 or I32", path,
                          hp_dtype_name(d->t->dtype));
    if (d->t->n_dims != 2)
        return hp_err_set(err, HP_ERR_INPUT, "%s: input_ids has %d dimensions; expected 2 [N, S]", path,
                          d->t->n_dims);
    if (d->t->shape[1] != d->seq)
        return hp_err_set(err, HP_ERR_INPUT, "%s: input_ids is [%lld, %lld]; its rows must be --seq %lld ids long "
                          "(a row is one window as stored)", path, (long long)d->t->shape[0],
                          (long long)d->t->shape[1], (long long)d->seq);
    if (d->t->shape[0] < 1) return hp_err_set(err, HP_ERR_INPUT, "%s: input_ids has no rows", path);
    if (d->seq < 2)
        return hp_err_set(err, HP_ERR_INPUT, "%s: rows of %lld ids score no position; --seq must be >= 2 for a "
                          "safetensors file", path, (long long)d->seq);
    d->es = d->t->dtype == HP_DT_I64 ? 8 : 4;
    d->windows = d->t->shape[0];
    d->n_tokens = d->t->n_elems;
    d->row_len = d->seq;
    return HP_OK;
}

hp_status hp_data_open(hp_data **out, const char *path, hp_data_dtype dt, int64_t seq, hp_err *err)
{
    *out = NULL;
    if (seq < 1 || seq > ((int64_t)1 << 40))
        return hp_err_set(err, HP_ERR_INPUT, "--seq %lld: expected a window length in [1, 2^40]", (long long)seq);
    hp_data *d = hp_calloc(1, sizeof *d);
    if (!d) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    d->fd = -1;
    d->dt = dt;
    d->seq = seq;
    d->es = dt == HP_DATA_U16 ? 2 : 4;
    d->path = strdup(path);
    hp_status st = d->path ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) st = hp_data_is_safetensors(path) ? open_st(d, path, err) : open_stream(d, path, err);
    size_t nb = 0;
    if (st == HP_OK && !hp_mul_size((size_t)d->row_len, d->es, &nb))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: a row of %lld tokens overflows", path, (long long)d->row_len);
    if (st == HP_OK && !(d->buf = malloc(nb)))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for a row of %lld tokens", (long long)d->row_len);
    if (st != HP_OK) {
        hp_data_close(d);
        return st;
    }
    *out = d;
    return HP_OK;
}

hp_status hp_data_open_ids(hp_data **out, const char *label, const int32_t *ids, const uint8_t *mask, int64_t n,
                           int64_t seq, hp_err *err)
{
    *out = NULL;
    if (seq < 1 || seq > ((int64_t)1 << 40))
        return hp_err_set(err, HP_ERR_INPUT, "--seq %lld: expected a window length in [1, 2^40]", (long long)seq);
    if (n < seq + 1)
        return hp_err_set(err, HP_ERR_INPUT, "%s gives %lld tokens, fewer than one window of --seq %lld (%lld tokens: "
                          "the inputs and the label of the last one); give a longer text or a shorter --seq", label,
                          (long long)n, (long long)seq, (long long)(seq + 1));
    hp_data *d = hp_calloc(1, sizeof *d);
    if (!d) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    d->fd = -1;
    d->dt = HP_DATA_U32;
    d->es = sizeof *d->mem;
    d->seq = seq;
    d->n_tokens = n;
    d->windows = (n - 1) / seq;
    d->row_len = seq + 1;
    d->path = strdup(label);
    d->mem = malloc((size_t)n * sizeof *d->mem);
    d->mask = mask ? malloc((size_t)n) : NULL;
    if (!d->path || !d->mem || (mask && !d->mask)) {
        hp_data_close(d);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory for %lld tokens", (long long)n);
    }
    memcpy(d->mem, ids, (size_t)n * sizeof *d->mem);
    if (mask) memcpy(d->mask, mask, (size_t)n);
    *out = d;
    return HP_OK;
}

void hp_data_close(hp_data *d)
{
    if (!d) return;
    free(d->mem);
    free(d->mask);
    if (d->fd >= 0) close(d->fd);
    hp_st_close(d->st);
    free(d->perm);
    free(d->buf);
    free(d->path);
    free(d);
}

int64_t hp_data_windows(const hp_data *d) { return d->windows; }
int64_t hp_data_row_len(const hp_data *d) { return d->row_len; }
int64_t hp_data_row_scored(const hp_data *d) { return d->row_len - 1; }
const char *hp_data_path(const hp_data *d) { return d->path; }
bool hp_data_masked(const hp_data *d) { return d->mask != NULL; }

/* A stream's window w starts at token w·seq; a safetensors row has no mask. */
void hp_data_window_mask(const hp_data *d, int64_t w, uint8_t *row)
{
    if (d->mask) memcpy(row, d->mask + w * d->seq, (size_t)d->row_len);
    else memset(row, 1, (size_t)d->row_len);
}

int64_t hp_data_window_scored(const hp_data *d, int64_t w)
{
    if (!d->mask) return d->row_len - 1;
    int64_t n = 0;
    for (int64_t s = 1; s < d->row_len; s++) n += d->mask[w * d->seq + s] != 0;
    return n;
}

/* ---- order ---- */

uint64_t hp_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fisher–Yates from the back: for i = n−1 down to 1, j = splitmix64() mod (i + 1), swap perm[i] and perm[j]. The
 * modulo's bias (below 2^-30 for any n a file can hold) is part of the definition, so another tool reproduces
 * the order exactly. */
void hp_data_permutation(uint64_t seed, uint64_t epoch, int64_t n, int64_t *perm)
{
    uint64_t state = seed ^ epoch;
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(hp_splitmix64(&state) % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

hp_status hp_data_window_at(hp_data *d, const hp_data_order *o, int64_t q, int64_t *window, hp_err *err)
{
    if (q < 0) return hp_err_set(err, HP_ERR_INPUT, "window position %lld is negative", (long long)q);
    uint64_t epoch = (uint64_t)(q / d->windows);
    int64_t i = q % d->windows;
    if (o->shuffle == HP_DATA_IN_ORDER) {
        *window = i;
        return HP_OK;
    }
    if (!d->perm || d->perm_epoch != epoch || d->perm_seed != o->seed) {
        if (!d->perm) {
            size_t nb = 0;
            if (!hp_mul_size((size_t)d->windows, sizeof *d->perm, &nb) || !(d->perm = malloc(nb)))
                return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the order of %lld windows",
                                  (long long)d->windows);
        }
        hp_data_permutation(o->seed, epoch, d->windows, d->perm);
        d->perm_epoch = epoch;
        d->perm_seed = o->seed;
    }
    *window = d->perm[i];
    return HP_OK;
}

/* ---- reading a window ---- */

static hp_status read_window(hp_data *d, int64_t w, int64_t vocab, int64_t *row, hp_err *err)
{
    if (d->mem) { /* an in-memory stream: its ids were made by a tokenizer, maybe not the model's */
        const int32_t *src = d->mem + w * d->seq;
        for (int64_t s = 0; s < d->row_len; s++) {
            if (src[s] < 0 || src[s] >= vocab)
                return hp_err_set(err, HP_ERR_INPUT, "%s: token %lld of its token stream is %d, outside the "
                                  "vocabulary [0, %lld) of the model; the tokenizer is not the model's", d->path,
                                  (long long)(w * d->seq + s), src[s], (long long)vocab);
            row[s] = src[s];
        }
        return HP_OK;
    }
    size_t nb = (size_t)d->row_len * d->es;
    if (d->st) {
        hp_status st = hp_st_read(d->st, d->t, (uint64_t)w * nb, d->buf, nb, err);
        if (st != HP_OK) return st;
        for (int64_t s = 0; s < d->row_len; s++) {
            int64_t v;
            if (d->es == 8) {
                memcpy(&v, (const char *)d->buf + 8 * s, 8);
            } else {
                int32_t v32;
                memcpy(&v32, (const char *)d->buf + 4 * s, 4);
                v = v32;
            }
            if (v < 0 || v >= vocab)
                return hp_err_set(err, HP_ERR_INPUT, "%s: input_ids[%lld][%lld] = %lld is outside the vocabulary "
                                  "[0, %lld) of the model", d->path, (long long)w, (long long)s, (long long)v,
                                  (long long)vocab);
            row[s] = v;
        }
        return HP_OK;
    }
    int64_t tok0 = w * d->seq;
    off_t off = (off_t)tok0 * (off_t)d->es;
    size_t got = 0;
    while (got < nb) {
        ssize_t k = pread(d->fd, (char *)d->buf + got, nb - got, off + (off_t)got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return hp_err_set(err, HP_ERR_IO, "%s: read error at byte %lld (%s)", d->path,
                                     (long long)(off + (off_t)got), strerror(errno));
        if (k == 0)
            return hp_err_set(err, HP_ERR_IO, "%s changed while reading (truncated by another process): byte %lld "
                              "of window %lld is past its end", d->path, (long long)(off + (off_t)got), (long long)w);
        got += (size_t)k;
    }
    const unsigned char *b = d->buf;
    for (int64_t s = 0; s < d->row_len; s++) {
        int64_t v;
        if (d->es == 2) v = (int64_t)((unsigned)b[2 * s] | (unsigned)b[2 * s + 1] << 8);
        else
            v = (int64_t)((uint32_t)b[4 * s] | (uint32_t)b[4 * s + 1] << 8 | (uint32_t)b[4 * s + 2] << 16 |
                          (uint32_t)b[4 * s + 3] << 24);
        if (v >= vocab)
            return hp_err_set(err, HP_ERR_INPUT, "%s: token %lld (byte offset %lld) is %lld, outside the vocabulary "
                              "[0, %lld) of the model; the file was tokenized for another vocabulary, or its dtype "
                              "is not --data-dtype %s", d->path, (long long)(tok0 + s),
                              (long long)((tok0 + s) * (int64_t)d->es), (long long)v, (long long)vocab,
                              d->es == 2 ? "uint16" : "uint32");
        row[s] = v;
    }
    return HP_OK;
}

hp_status hp_data_rows(hp_data *d, int64_t w0, int64_t rows, int64_t vocab, int64_t *ids_out, hp_err *err)
{
    if (w0 < 0 || rows < 0 || w0 > d->windows - rows)
        return hp_err_set(err, HP_ERR_INPUT, "%s: windows [%lld, %lld) are outside [0, %lld)", d->path,
                          (long long)w0, (long long)(w0 + rows), (long long)d->windows);
    for (int64_t r = 0; r < rows; r++) {
        hp_status st = read_window(d, w0 + r, vocab, ids_out + r * d->row_len, err);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

hp_status hp_data_batch(hp_data *d, const hp_data_order *o, int64_t step, int64_t row0, int64_t rows, int64_t vocab,
                        int64_t *ids_out, hp_err *err)
{
    int64_t GB = o->global_batch, q0;
    if (GB < 1 || step < 0 || row0 < 0 || rows < 0 || row0 > GB - rows)
        return hp_err_set(err, HP_ERR_INPUT, "rows [%lld, %lld) of step %lld are outside a global batch of %lld",
                          (long long)row0, (long long)(row0 + rows), (long long)step, (long long)GB);
    if (!hp_mul_i64(step, GB, &q0) || !hp_add_i64(q0, row0 + rows, &q0))
        return hp_err_set(err, HP_ERR_INPUT, "step %lld of a global batch of %lld overflows the window count",
                          (long long)step, (long long)GB);
    q0 -= row0 + rows;
    /* Test hook (hp_test_hooks.pause_in_step, pause_step T): pauses the read of step T's first rows
     * (hp__test_pause), so a test kills a rank inside a step, the others waiting in its collectives. */
    const hp_test_hooks *hk = hp__test_hooks();
    if (row0 == 0 && hk->pause_in_step && hk->pause_step == step + 1) hp__test_pause(hk->pause_in_step, false);
    for (int64_t r = 0; r < rows; r++) {
        int64_t w;
        hp_status st = hp_data_window_at(d, o, q0 + row0 + r, &w, err);
        if (st == HP_OK) st = read_window(d, w, vocab, ids_out + r * d->row_len, err);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

/* ---- the token inputs of run, validate and cost ---- */

/* The cap on B and S (each): far past any batch a forward pass holds; B·S then fits in int64 (its bytes are
 * checked). */
#define IDS_DIM_MAX ((int64_t)1 << 31)

hp_status hp_data_read_input_ids(const char *path, int64_t vocab, int64_t **ids, int64_t *B, int64_t *S, hp_err *err)
{
    if (ids) *ids = NULL;
    hp_st_file *f = NULL;
    hp_status st = hp_st_open(&f, path, err);
    if (st != HP_OK) return st;
    const hp_st_tensor *t = hp_st_find(f, "input_ids");
    if (!t) st = hp_err_set(err, HP_ERR_INPUT, "%s: no tensor 'input_ids' (I64 [B, S])", path);
    else if (t->n_dims != 2 || (t->dtype != HP_DT_I64 && t->dtype != HP_DT_I32))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: 'input_ids' is %s with %d dims; expected I64 (or I32) [B, S]", path,
                        hp_dtype_name(t->dtype), t->n_dims);
    else if (t->shape[0] < 1 || t->shape[1] < 1)
        st = hp_err_set(err, HP_ERR_INPUT, "%s: 'input_ids' is [%lld, %lld]; it needs at least one token", path,
                        (long long)t->shape[0], (long long)t->shape[1]);
    if (st == HP_OK) {
        *B = t->shape[0];
        *S = t->shape[1];
    }
    if (st == HP_OK && ids) {
        int64_t n = t->shape[0] * t->shape[1]; /* the reader checked shape against the file's bytes */
        *ids = malloc((size_t)n * sizeof **ids);
        if (!*ids) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for input_ids");
        /* guarded: a file truncated meanwhile is an error, not SIGBUS; I32 widened in place from the end */
        size_t es = t->dtype == HP_DT_I64 ? 8 : 4;
        if (st == HP_OK) st = hp_st_read(f, t, 0, *ids, (size_t)n * es, err);
        for (int64_t i = n - 1; st == HP_OK && es == 4 && i >= 0; i--) {
            int32_t v;
            memcpy(&v, (const char *)*ids + i * 4, 4);
            (*ids)[i] = v;
        }
        for (int64_t i = 0; st == HP_OK && vocab > 0 && i < n; i++)
            if ((*ids)[i] < 0 || (*ids)[i] >= vocab)
                st = hp_err_set(err, HP_ERR_INPUT, "%s: input_ids[%lld][%lld] = %lld is outside the vocabulary "
                                "[0, %lld) of the model", path, (long long)(i / *S), (long long)(i % *S),
                                (long long)(*ids)[i], (long long)vocab);
        if (st != HP_OK) {
            free(*ids);
            *ids = NULL;
        }
    }
    hp_st_close(f);
    return st;
}

/* One integer of "B,S" starting at *p (blanks around it skipped); false when there is none or it is out of
 * [1, IDS_DIM_MAX). */
static bool shape_dim(const char **p, int64_t *out, bool *range)
{
    const char *s = *p;
    while (*s == ' ' || *s == '\t') s++;
    if (!(*s >= '0' && *s <= '9') && *s != '-' && *s != '+') return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s) return false;
    *range = errno == ERANGE || v < 1 || v >= IDS_DIM_MAX;
    while (*end == ' ' || *end == '\t') end++;
    *p = end;
    *out = v;
    return true;
}

hp_status hp_ids_parse_shape(const char *text, int64_t *B, int64_t *S, hp_err *err)
{
    const char *p = text;
    bool rb = false, rs = false;
    if (!shape_dim(&p, B, &rb) || *p++ != ',' || !shape_dim(&p, S, &rs) || *p)
        return hp_err_set(err, HP_ERR_INPUT, "--random-input '%s': expected B,S (rows and tokens per row, two "
                          "positive integers, e.g. 2,16)", text);
    if (rb || rs)
        return hp_err_set(err, HP_ERR_INPUT, "--random-input '%s': %s must be in [1, %lld]", text,
                          rb ? "B (the rows)" : "S (the tokens per row)", (long long)(IDS_DIM_MAX - 1));
    return HP_OK;
}

/* --ids "1,2,3;4,5,6" -> ids [B, S]; one pass to count, one to fill. */
static hp_status parse_list(const char *text, int64_t vocab, int64_t **ids, int64_t *B, int64_t *S, hp_err *err)
{
    if (vocab < 1) vocab = INT64_MAX; /* unknown here: checked by the runner */
    int64_t rows = 0, cols = -1, n = 0, col = 0;
    int64_t cap = 16, *v = malloc((size_t)cap * sizeof *v);
    if (!v) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_status st = HP_OK;
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (*p == ';' || *p == ',' || !*p) {
            if (!*p && rows == 0 && col == 0) st = hp_err_set(err, HP_ERR_INPUT, "--ids is empty; give rows of "
                                                              "token ids like \"1,2,3;4,5,6\"");
            else st = hp_err_set(err, HP_ERR_INPUT, "--ids: row %lld, column %lld is empty (ids are separated by "
                                 "',' and rows by ';', as in \"1,2,3;4,5,6\")", (long long)(rows + 1),
                                 (long long)(col + 1));
            break;
        }
        errno = 0;
        char *end = (char *)p;
        long long x = (*p >= '0' && *p <= '9') || *p == '-' || *p == '+' ? strtoll(p, &end, 10) : 0;
        if (end == p) {
            int len = 0;
            while (p[len] && p[len] != ',' && p[len] != ';' && len < 20) len++;
            st = hp_err_set(err, HP_ERR_INPUT, "--ids: row %lld, column %lld: '%.*s' is not a token id (a decimal "
                            "integer)", (long long)(rows + 1), (long long)(col + 1), len, p);
            break;
        }
        if (errno == ERANGE || x < 0 || x >= vocab) {
            st = hp_err_set(err, HP_ERR_INPUT, "--ids: row %lld, column %lld: %.*s is outside the vocabulary "
                            "[0, %lld) of the model", (long long)(rows + 1), (long long)(col + 1), (int)(end - p), p,
                            (long long)vocab);
            break;
        }
        p = end;
        while (*p == ' ' || *p == '\t') p++;
        if (*p && *p != ',' && *p != ';') {
            st = hp_err_set(err, HP_ERR_INPUT, "--ids: row %lld, column %lld: '%c' after %lld is neither ',' nor ';'",
                            (long long)(rows + 1), (long long)(col + 1), *p, x);
            break;
        }
        if (n == cap) {
            int64_t *nv = n < IDS_DIM_MAX ? realloc(v, (size_t)(cap *= 2) * sizeof *v) : NULL;
            if (!nv) {
                st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for --ids");
                break;
            }
            v = nv;
        }
        v[n++] = x;
        col++;
        if (*p == ',') {
            p++;
            continue;
        }
        /* the end of a row */
        if (cols >= 0 && col != cols) {
            st = hp_err_set(err, HP_ERR_INPUT, "--ids: row %lld has %lld id%s, row 1 has %lld; every row must be "
                            "the same length", (long long)(rows + 1), (long long)col, col == 1 ? "" : "s",
                            (long long)cols);
            break;
        }
        cols = col;
        rows++;
        col = 0;
        if (!*p) break;
        p++; /* ';' */
    }
    if (st != HP_OK) {
        free(v);
        return st;
    }
    *B = rows;
    *S = cols;
    if (ids) *ids = v;
    else free(v);
    return HP_OK;
}

/* B rows of S tokens from the start of a stream, without overlap: one window of B·S tokens through read_window. */
static hp_status read_stream(const hp_ids_source *src, int64_t vocab, int64_t **ids, hp_err *err)
{
    int64_t n = src->B * src->S; /* both below 2^31: no overflow */
    hp_data d = {.fd = -1, .dt = src->dtype, .es = src->dtype == HP_DATA_U16 ? 2 : 4, .path = (char *)src->arg};
    hp_status st = open_stream_tokens(&d, src->arg, err);
    const char *name = d.dt == HP_DATA_U16 ? "uint16" : "uint32";
    if (st == HP_OK && d.n_tokens < n)
        st = hp_err_set(err, HP_ERR_INPUT, "%s holds %lld %s tokens, fewer than --batch %lld rows of --seq %lld "
                        "(%lld tokens); give a smaller --batch or --seq, or a longer file", src->arg,
                        (long long)d.n_tokens, name, (long long)src->B, (long long)src->S, (long long)n);
    d.seq = d.row_len = n; /* window 0 = tokens [0, n) */
    int64_t *v = NULL;
    if (st == HP_OK && (!(d.buf = malloc((size_t)n * d.es)) || !(v = malloc((size_t)n * sizeof *v))))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for %lld tokens", (long long)n);
    if (st == HP_OK) st = read_window(&d, 0, vocab > 0 ? vocab : INT64_MAX, v, err);
    if (d.fd >= 0) close(d.fd);
    free(d.buf);
    if (st != HP_OK || !ids) free(v);
    else *ids = v;
    return st;
}

hp_status hp_ids_load(const hp_ids_source *src, int64_t vocab, int64_t **ids, int64_t *B, int64_t *S, hp_err *err)
{
    if (ids) *ids = NULL;
    if (vocab < 1 && src->kind == HP_IDS_RANDOM) /* a model without config.json: nothing to draw from */
        return hp_err_set(err, HP_ERR_INPUT, "--random-input: the model gives no vocabulary size (vocab_size) to draw "
                          "ids from");
    bool shaped = src->kind == HP_IDS_STREAM || src->kind == HP_IDS_RANDOM;
    if (shaped && (src->B < 1 || src->B >= IDS_DIM_MAX || src->S < 1 || src->S >= IDS_DIM_MAX))
        return hp_err_set(err, HP_ERR_INPUT, "%s: %lld rows of %lld tokens; each must be in [1, %lld]",
                          src->kind == HP_IDS_RANDOM ? "--random-input" : src->arg, (long long)src->B,
                          (long long)src->S, (long long)(IDS_DIM_MAX - 1));
    size_t nb;
    if (shaped && !hp_mul_size((size_t)(src->B * src->S), sizeof(int64_t), &nb))
        return hp_err_set(err, HP_ERR_INPUT, "%s: %lld rows of %lld tokens overflow the memory's size",
                          src->kind == HP_IDS_RANDOM ? "--random-input" : src->arg, (long long)src->B,
                          (long long)src->S);
    switch (src->kind) {
    case HP_IDS_SAFETENSORS: {
        hp_status st = hp_data_read_input_ids(src->arg, vocab, ids, B, S, err);
        if (st == HP_ERR_INPUT && err && !hp_data_is_safetensors(src->arg) && !strstr(err->msg, "input_ids")) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            size_t k = strlen(msg);
            if (k && msg[k - 1] == '.') msg[k - 1] = '\0';
            hp_err_set(err, HP_ERR_INPUT, "%s; if it is a token stream (flat uint16/uint32 tokens, as 'hyperpar "
                       "train' reads), give --seq S to cut it into rows", msg);
        }
        return st;
    }
    case HP_IDS_STREAM:
        *B = src->B, *S = src->S;
        return read_stream(src, vocab, ids, err);
    case HP_IDS_LIST: return parse_list(src->arg, vocab, ids, B, S, err);
    case HP_IDS_RANDOM: {
        *B = src->B, *S = src->S;
        if (!ids) return HP_OK;
        int64_t n = src->B * src->S;
        if (!(*ids = malloc((size_t)n * sizeof **ids)))
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory for %lld random ids", (long long)n);
        uint64_t state = src->seed;
        for (int64_t i = 0; i < n; i++) (*ids)[i] = (int64_t)(hp_splitmix64(&state) % (uint64_t)vocab);
        return HP_OK;
    }
    default: return hp_err_set(err, HP_ERR_INPUT, "no input: give --input, --ids or --random-input");
    }
}
