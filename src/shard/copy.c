/*
 * copy.c — strided copy of a rank's slice out of a global tensor, as contiguous runs.
 *
 * A slice keeps, per dim d, segments [off, off+len) of the global dim (one segment for a whole dim or an
 * S(d) block, two for a packed S(d)x2). Let k be the last dim that is not whole: everything after k is
 * whole, so one index step along k is `inner` contiguous bytes and a segment of dim k is one run:
 *
 *   global [G0, G1, G2], slice S(1) on dim 1 (k = 1, inner = G2·esize):
 *     for each i0:   run = src + i0·stride0 + off1·stride1,  length len1·inner
 *
 * Runs come in the slice's local row-major order, which is the rank file's layout; the writer's fill
 * callback copies them into its pieces (≤ 4 MiB) without ever holding a whole tensor. A stacked expert
 * tensor has one source buffer per expert: dim 0 picks the buffer, so a run never crosses experts.
 * Every copy out of the mapping is guarded (guard.c): a source truncated meanwhile is an error, not SIGBUS.
 * Also here: the byte geometry of sub-byte dtypes, FNV-1a fingerprints and the progress line.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "shard/shard_int.h"

static bool seg_whole(const hp__segs *s, int d)
{
    return s->n[d] == 1 && s->off[d][0] == 0 && s->len[d][0] == s->shape[d];
}

hp_status hp__geom_make(const char *name, hp_dtype dt, const hp__segs *s, hp__geom *g, hp_err *err)
{
    memset(g, 0, sizeof *g);
    int bits = hp_dtype_bits(dt);
    int last_sliced = -1;
    for (int d = 0; d < s->n_dims; d++)
        if (!seg_whole(s, d)) last_sliced = d;
    if (bits % 8 == 0 && s->n_dims > 0) {
        g->n_dims = s->n_dims;
        memcpy(g->shape, s->shape, sizeof g->shape);
        g->esize = bits / 8;
        g->segs = *s;
        return HP_OK;
    }
    /* Scalars, and sub-byte dtypes as bytes: [total] when whole, [G0, row bytes] when only dim 0 is cut. */
    int64_t n_elems = 1, row = 1;
    for (int d = 0; d < s->n_dims; d++) {
        n_elems *= s->shape[d]; /* the tensor's element count fits int64 (validated by the reader) */
        if (d > 0) row *= s->shape[d];
    }
    g->esize = 1;
    g->segs.n_dims = 1;
    if (last_sliced < 0) {
        int64_t nb = 0;
        if (!hp_dtype_nbytes(dt, n_elems, &nb))
            return hp_err_set(err, HP_ERR_INPUT, "tensor '%s': %lld %s elements are not a whole number of bytes", name,
                              (long long)n_elems, hp_dtype_name(dt));
        g->n_dims = 1;
        g->shape[0] = nb;
    } else {
        int64_t rb = 0;
        if (last_sliced != 0 || s->n_dims < 2 || !hp_dtype_nbytes(dt, row, &rb))
            return hp_err_set(err, HP_ERR_INPUT,
                              "tensor '%s': %s packs elements below a byte; it can only be split on "
                              "dim 0 along whole-byte rows, not on dim %d",
                              name, hp_dtype_name(dt), last_sliced);
        g->n_dims = 2;
        g->shape[0] = s->shape[0];
        g->shape[1] = rb;
        g->segs.n_dims = 2;
        g->segs.n[1] = 1;
        g->segs.len[1][0] = rb;
    }
    g->segs.shape[0] = g->shape[0];
    g->segs.shape[1] = g->shape[1];
    if (last_sliced < 0) {
        g->segs.n[0] = 1;
        g->segs.off[0][0] = 0;
        g->segs.len[0][0] = g->shape[0];
    } else {
        g->segs.n[0] = s->n[0];
        memcpy(g->segs.off[0], s->off[0], sizeof s->off[0]);
        memcpy(g->segs.len[0], s->len[0], sizeof s->len[0]);
    }
    return HP_OK;
}

void hp__gather_init(hp__gather *c, const hp__geom *g, const uint8_t *base, const uint8_t *const *experts,
                     hp__progress *progress)
{
    memset(c, 0, sizeof *c);
    c->g = *g;
    c->base = base;
    c->experts = experts;
    c->progress = progress;
    c->k = 0;
    for (int d = 0; d < g->n_dims; d++)
        if (!seg_whole(&g->segs, d)) c->k = d;
    int64_t s = g->esize;
    for (int d = g->n_dims - 1; d >= 0; d--) {
        c->stride[d] = s;
        s *= g->shape[d];
    }
    c->inner = c->stride[c->k];
}

/* Global index of local index l along dim d. */
static int64_t seg_map(const hp__segs *s, int d, int64_t l)
{
    for (int q = 0; q < s->n[d]; q++) {
        if (l < s->len[d][q]) return s->off[d][q] + l;
        l -= s->len[d][q];
    }
    return -1;
}

static int64_t seg_total(const hp__segs *s, int d)
{
    int64_t t = 0;
    for (int q = 0; q < s->n[d]; q++) t += s->len[d][q];
    return t;
}

/* Sets run/run_left to the next contiguous run; false when the slice is exhausted. */
static bool next_run(hp__gather *c)
{
    if (c->done) return false;
    const hp__segs *s = &c->g.segs;
    const uint8_t *b = c->base;
    int64_t off = 0;
    for (int j = 0; j < c->k; j++) {
        int64_t gj = seg_map(s, j, c->lidx[j]);
        if (c->experts && j == 0)
            b = c->experts[gj];
        else
            off += gj * c->stride[j];
    }
    int64_t gk = s->off[c->k][c->seg] + c->pos, cnt = s->len[c->k][c->seg] - c->pos;
    if (c->experts && c->k == 0) {
        b = c->experts[gk];
        cnt = 1;
    } else {
        off += gk * c->stride[c->k];
    }
    c->run = b + off;
    c->run_left = cnt * c->inner;
    c->pos += cnt;
    if (c->pos == s->len[c->k][c->seg]) {
        c->pos = 0;
        if (++c->seg == s->n[c->k]) {
            c->seg = 0;
            int j = c->k - 1;
            for (; j >= 0; j--) {
                if (++c->lidx[j] < seg_total(s, j)) break;
                c->lidx[j] = 0;
            }
            if (j < 0) c->done = true;
        }
    }
    return true;
}

hp_status hp__gather_fill(void *ctx, void *dst, size_t nbytes, hp_err *err)
{
    hp__gather *c = ctx;
    uint8_t *out = dst;
    size_t left = nbytes;
    if (hp__interrupted()) {
        c->failed = HP__FAIL_INTERRUPT;
        return hp__interrupt_error(err);
    }
    while (left) {
        if (c->run_left == 0 && !next_run(c))
            return hp_err_set(err, HP_ERR_IO, "internal error: a slice ran out of bytes while writing");
        size_t n = (size_t)c->run_left < left ? (size_t)c->run_left : left;
        if (!hp__guarded_copy(out, c->run, n)) {
            c->failed = HP__FAIL_FAULT;
            return hp_err_set(err, HP_ERR_IO, "the source changed while reading");
        }
        out += n;
        c->run += n;
        c->run_left -= (int64_t)n;
        left -= n;
    }
    if (c->progress) hp__progress_add(c->progress, nbytes);
    return HP_OK;
}

/* The manifest stores FNV-1a 64 plan fingerprints (docs/shard-format.md), so this one stays FNV. */
const char *hp__fnv1a_hex(const void *data, size_t n, char *buf)
{
    return hp__hex64(hp_fnv1a64(HP_FNV1A64_BASIS, data, n), buf);
}

const char *hp__hex64(uint64_t v, char *buf)
{
    snprintf(buf, 17, "%016" PRIx64, v);
    return buf;
}

/* ---- progress ---- */

int64_t hp__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void hp__progress_init(hp__progress *p, bool enabled, const char *verb, uint64_t total)
{
    p->enabled = enabled;
    p->verb = verb;
    p->total = total;
    atomic_init(&p->done, 0);
    p->start_ns = hp__now_ns();
    atomic_init(&p->last_ns, p->start_ns);
}

static void progress_print(hp__progress *p, uint64_t done, int64_t now)
{
    double secs = (double)(now - p->start_ns) / 1e9, rate = secs > 0 ? (double)done / secs : 0;
    char a[32], b[32], r[32];
    double eta = rate > 0 ? (double)(p->total - (done < p->total ? done : p->total)) / rate : 0;
    fprintf(stderr, "\r%s %s / %s  %s/s  ETA %.0fs   ", p->verb, hp_format_bytes(done, a, sizeof a),
            hp_format_bytes(p->total, b, sizeof b), hp_format_bytes((uint64_t)rate, r, sizeof r), eta);
    fflush(stderr); /* no newline: a line-buffered stderr would hold it */
}

void hp__progress_add(hp__progress *p, uint64_t n)
{
    uint64_t done = atomic_fetch_add(&p->done, n) + n;
    if (!p->enabled) return;
    int64_t now = hp__now_ns(), last = atomic_load(&p->last_ns);
    /* At most four lines a second; the compare-exchange lets exactly one thread print. */
    if (now - last >= 250000000 && atomic_compare_exchange_strong(&p->last_ns, &last, now))
        progress_print(p, done, now);
}

void hp__progress_end(hp__progress *p)
{
    if (!p->enabled) return;
    progress_print(p, atomic_load(&p->done), hp__now_ns());
    fputc('\n', stderr);
}
