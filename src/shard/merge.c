/*
 * merge.c — hp_shard_merge: rebuilds the original checkpoint from a shard folder, byte for byte.
 *
 *   manifest.json ──strict read──▶ pieces per rank tensor (replicas with equal slices deduplicated: any one
 *                                  suffices) ──▶ the distinct pieces of every tensor tile it exactly once
 *   every rank file ──hp_st_open, hp__rank_file_check: identity, rank (misnamed?), size, every tensor's dtype
 *                      and local shape, layout digest of its manifest entry──▶ (--verify: XXH64 of each file)
 *   for each global tensor, model order:  runs of the output, row-major, each copied from the piece that
 *                                           covers it (a per-expert tensor reads dim 0 = e of its stack)
 *   ──▶ OUT.tmp.<pid>/model.safetensors (or model-0000i-of-0000n + index) + config.json ──rename──▶ OUT
 *
 * Invariants: the output holds exactly manifest.tensors, in that order, with their dtypes and shapes; an
 * element no rank file covers, or two ranks claim, is an error found before anything is written. Copies out of
 * the mapped rank files are guarded (a file truncated meanwhile is an error), and their size / mtime / inode
 * are compared again before the output is installed.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "shard/shard_int.h"

typedef struct piece {
    const hp__mtensor *mt;
    int64_t rank; /* the first rank holding it */
    const uint8_t *data;
    hp__geom geom;                /* byte geometry of the global (virtual) tensor and this piece's segments */
    int64_t lstride[HP_MAX_DIMS]; /* byte strides of the piece's local layout */
} piece;

typedef struct vtensor {   /* one rank-file tensor name, across ranks */
    const hp__mtensor *mt; /* the first rank's description that lists it */
    int n_pieces;
    piece *pieces;
} vtensor;

typedef struct gmap {
    int v;      /* vtensor, -1 until mapped */
    int expert; /* dim-0 index in a stack, -1 for a plain tensor */
} gmap;

typedef struct merge_ctx {
    const hp__manifest *man;
    const char *dir;
    hp_st_file **files; /* [world] */
    vtensor *vt;
    size_t n_vt;
    gmap *gm; /* [n_globals] */
} merge_ctx;

static hp_status mt_segs(const hp__mtensor *mt, hp__segs *s, hp_err *err)
{
    hp_shard_tensor t;
    memset(&t, 0, sizeof t);
    t.name = mt->name;
    t.n_dims = mt->n_dims;
    memcpy(t.global_shape, mt->global_shape, sizeof t.global_shape);
    t.n_slices = mt->n_slices;
    memcpy(t.slices, mt->slices, sizeof t.slices);
    return hp__segs_from_tensor(&t, s, err);
}

static bool same_desc(const hp__mtensor *a, const hp__mtensor *b)
{
    if (strcmp(a->name, b->name) || a->dtype != b->dtype || a->n_dims != b->n_dims || a->n_globals != b->n_globals ||
        a->stacked != b->stacked || memcmp(a->global_shape, b->global_shape, (size_t)a->n_dims * sizeof(int64_t)))
        return false;
    for (int e = 0; e < a->n_globals; e++)
        if (strcmp(a->globals[e], b->globals[e])) return false;
    return true;
}

static bool same_slices(const hp__mtensor *a, const hp__mtensor *b)
{
    if (a->n_slices != b->n_slices) return false;
    for (int i = 0; i < a->n_slices; i++)
        if (a->slices[i].dim != b->slices[i].dim || a->slices[i].offset != b->slices[i].offset ||
            a->slices[i].length != b->slices[i].length)
            return false;
    return true;
}

/* Opens rank r's file and checks it against the manifest (hp__rank_file_check). */
static hp_status open_rank(merge_ctx *c, uint64_t globals, size_t r, hp_err *err)
{
    const hp__mrank *rk = &c->man->ranks[r];
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", c->dir, rk->file);
    struct stat sb;
    if (stat(path, &sb) != 0) return hp__rank_file_missing(c->dir, (int64_t)r, path, err);
    hp_status st = hp_st_open(&c->files[r], path, err);
    if (st != HP_OK) {
        hp_err_prefix(err, "rank %zu", r);
        return st;
    }
    return hp__rank_file_check(c->man, globals, (int64_t)r, c->files[r], path, err);
}

/* --verify: every distinct rank file read in full against its manifest checksum. */
static hp_status verify_ranks(merge_ctx *c, hp_err *err)
{
    const hp__manifest *m = c->man;
    for (size_t r = 0; r < m->n_ranks; r++) {
        const hp__mrank *rk = &m->ranks[r];
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", c->dir, rk->file);
        if ((int64_t)r != rk->file_rank) { /* a replica: skip it when it is its file_rank's file (a hard link) */
            char fpath[4200];
            struct stat a, b;
            snprintf(fpath, sizeof fpath, "%s/%s", c->dir, m->ranks[rk->file_rank].file);
            if (stat(path, &a) == 0 && stat(fpath, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) continue;
        }
        uint64_t sum = 0, size = 0;
        hp_status st = hp__file_checksum(path, &sum, &size, err);
        if (st != HP_OK) return st;
        if (sum != rk->checksum || size != rk->bytes) {
            char got[17], want[17];
            return hp_err_set(err, HP_ERR_INPUT,
                              "rank %zu: %s: its content checksum is xxh64:%s but manifest.json records xxh64:%s; the "
                              "file is corrupt or was modified after 'hyperpar shard' wrote it",
                              r, path, hp__hex64(sum, got), hp__hex64(rk->checksum, want));
        }
    }
    return HP_OK;
}

/* Adds rank tensor mt as a piece of v unless a piece with the same slices is there (a replica). */
static hp_status add_piece(vtensor *v, const hp__mtensor *mt, int64_t rank, hp_err *err)
{
    for (int i = 0; i < v->n_pieces; i++)
        if (same_slices(v->pieces[i].mt, mt)) return HP_OK;
    piece p;
    memset(&p, 0, sizeof p);
    hp__segs s;
    hp_status st = mt_segs(mt, &s, err);
    if (st == HP_OK) st = hp__geom_make(mt->name, mt->dtype, &s, &p.geom, err);
    if (st != HP_OK) return st;
    p.mt = mt;
    p.rank = rank;
    int64_t stride = p.geom.esize;
    for (int d = p.geom.n_dims - 1; d >= 0; d--) {
        p.lstride[d] = stride;
        int64_t len = 0;
        for (int q = 0; q < p.geom.segs.n[d]; q++) len += p.geom.segs.len[d][q];
        stride *= len;
    }
    v->pieces[v->n_pieces++] = p;
    return HP_OK;
}

typedef struct named {
    const char *name;
    size_t idx;
} named;

static int named_cmp(const void *a, const void *b)
{
    return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

static int find_named(const named *v, size_t n, const char *name)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(v[mid].name, name);
        if (c == 0) return (int)v[mid].idx;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/* A rank tensor's listing: its name, its rank and its index in the rank's list. */
typedef struct listing {
    const char *name;
    size_t rank, k;
} listing;

static int listing_cmp(const void *a, const void *b)
{
    const listing *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* The rank tensors grouped by name: every rank lists a slice of every tensor, or (a pipeline) of its stage's
 * tensors; the first rank listing a name describes it. *lst (malloc'd, n_lst of them) sorted by name then rank. */
static hp_status group_names(merge_ctx *c, hp_arena *a, listing **lst, size_t *n_lst, hp_err *err)
{
    const hp__manifest *m = c->man;
    size_t total = 0;
    for (size_t r = 0; r < m->n_ranks; r++) total += m->ranks[r].n_tensors;
    listing *l = malloc((total + 1) * sizeof *l);
    c->vt = hp_arena_alloc(a, (total + 1) * sizeof *c->vt);
    if (!l || !c->vt) {
        free(l);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    size_t n = 0;
    for (size_t r = 0; r < m->n_ranks; r++)
        for (size_t k = 0; k < m->ranks[r].n_tensors; k++) l[n++] = (listing){m->ranks[r].tensors[k].name, r, k};
    qsort(l, n, sizeof *l, listing_cmp);
    c->n_vt = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && !strcmp(l[i - 1].name, l[i].name)) {
            if (l[i - 1].rank == l[i].rank) {
                hp_err_set(err, HP_ERR_INPUT, "manifest.json: rank %zu lists tensor '%s' twice", l[i].rank,
                           l[i].name);
                free(l);
                return HP_ERR_INPUT;
            }
            continue;
        }
        vtensor *v = &c->vt[c->n_vt++];
        v->mt = &m->ranks[l[i].rank].tensors[l[i].k];
        v->n_pieces = 0;
        v->pieces = hp_arena_alloc(a, (size_t)m->world * sizeof *v->pieces);
        if (!v->pieces) {
            free(l);
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        }
    }
    *lst = l, *n_lst = n;
    return HP_OK;
}

/* Groups the rank tensors by name and maps globals. */
static hp_status build_pieces(merge_ctx *c, hp_arena *a, hp_err *err)
{
    const hp__manifest *m = c->man;
    listing *lst = NULL;
    size_t n_lst = 0;
    hp_status gs = group_names(c, a, &lst, &n_lst, err);
    if (gs != HP_OK) return gs;
    c->gm = hp_arena_alloc(a, (m->n_globals + 1) * sizeof *c->gm);
    named *idx = malloc((m->n_globals + 1) * sizeof *idx);
    if (!c->gm || !idx) {
        free(idx);
        free(lst);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    for (size_t g = 0; g < m->n_globals; g++) {
        idx[g] = (named){m->globals[g].name, g};
        c->gm[g] = (gmap){-1, -1};
    }
    qsort(idx, m->n_globals, sizeof *idx, named_cmp);
    hp_status st = HP_OK;
    for (size_t g = 1; g < m->n_globals && st == HP_OK; g++)
        if (!strcmp(idx[g - 1].name, idx[g].name))
            st =
                hp_err_set(err, HP_ERR_INPUT, "manifest.json: tensor '%s' is listed twice in \"tensors\"", idx[g].name);
    for (size_t v = 0; v < c->n_vt && st == HP_OK; v++) {
        const hp__mtensor *mt = c->vt[v].mt;
        for (int e = 0; e < mt->n_globals && st == HP_OK; e++) {
            int g = find_named(idx, m->n_globals, mt->globals[e]);
            const hp__mglobal *gl = g >= 0 ? &m->globals[g] : NULL;
            int off = mt->stacked ? 1 : 0;
            if (!gl || gl->dtype != mt->dtype || gl->n_dims != mt->n_dims - off ||
                memcmp(gl->shape, mt->global_shape + off, (size_t)gl->n_dims * sizeof *gl->shape))
                st = hp_err_set(err, HP_ERR_INPUT,
                                "manifest.json: rank tensor '%s' names global '%s', which \"tensors\" "
                                "%s",
                                mt->name, mt->globals[e], gl ? "lists with another dtype or shape" : "does not list");
            else if (c->gm[g].v >= 0)
                st = hp_err_set(err, HP_ERR_INPUT,
                                "manifest.json: global tensor '%s' is held by two rank tensors ('%s' "
                                "and '%s')",
                                gl->name, c->vt[c->gm[g].v].mt->name, mt->name);
            else
                c->gm[g] = (gmap){(int)v, mt->stacked ? e : -1};
        }
    }
    for (size_t g = 0; g < m->n_globals && st == HP_OK; g++)
        if (c->gm[g].v < 0)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "manifest.json: tensor '%s' is held by no rank; the folder cannot rebuild "
                            "the checkpoint",
                            m->globals[g].name);
    free(idx);
    for (size_t i = 0, v = 0; i < n_lst && st == HP_OK; i++) { /* the listings in the vtensors' order */
        if (i > 0 && strcmp(lst[i - 1].name, lst[i].name)) v++;
        const hp__mtensor *mt = &m->ranks[lst[i].rank].tensors[lst[i].k];
        if (!same_desc(mt, c->vt[v].mt))
            st = hp_err_set(err, HP_ERR_INPUT,
                            "manifest.json: rank %zu's tensor '%s' disagrees with the other ranks' in dtype, global "
                            "shape or global names",
                            lst[i].rank, mt->name);
        else st = add_piece(&c->vt[v], mt, (int64_t)lst[i].rank, err);
    }
    free(lst);
    /* Every tensor's distinct pieces tile it exactly once. */
    const hp__segs **segs = malloc(((size_t)m->world + 1) * sizeof *segs);
    int64_t *ranks = malloc(((size_t)m->world + 1) * sizeof *ranks);
    if (st == HP_OK && (!segs || !ranks)) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (size_t v = 0; v < c->n_vt && st == HP_OK; v++) {
        const vtensor *vt = &c->vt[v];
        hp__segs *own = malloc(((size_t)vt->n_pieces + 1) * sizeof *own);
        if (!own) {
            st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            break;
        }
        for (int i = 0; i < vt->n_pieces && st == HP_OK; i++) {
            st = mt_segs(vt->pieces[i].mt, &own[i], err);
            segs[i] = &own[i];
            ranks[i] = vt->pieces[i].rank;
        }
        if (st == HP_OK)
            st = hp__check_tiling(vt->mt->name, vt->mt->global_shape, vt->mt->n_dims, vt->n_pieces, segs, ranks, err);
        free(own);
    }
    free(segs);
    free(ranks);
    return st;
}

/* Points every piece at its bytes in the first rank file holding it. */
static void attach_data(merge_ctx *c)
{
    for (size_t v = 0; v < c->n_vt; v++)
        for (int i = 0; i < c->vt[v].n_pieces; i++) {
            piece *p = &c->vt[v].pieces[i];
            const hp_st_file *f = c->files[p->rank];
            p->data = hp_st_data(f, hp_st_find(f, p->mt->name)); /* present: hp__rank_file_check */
        }
}

/* ---- assembling one global tensor ---- */

typedef struct assemble {
    const vtensor *v;
    const char *name;
    int64_t lo[HP_MAX_DIMS], hi[HP_MAX_DIMS]; /* the output region in the virtual tensor (byte geometry) */
    int n_dims, k;
    int64_t inner;
    int64_t idx[HP_MAX_DIMS]; /* current global index of dims < k */
    int64_t p;                /* current position along k */
    bool done;
    int last; /* the piece that served the previous run */
    const uint8_t *run;
    int64_t run_left;
    hp__progress *progress;
    int failed;        /* HP__FAIL_*, or HP__FAIL_HOLE with the message in fill_err */
    const char *dir;   /* the shard folder, for messages */
    hp_err *fill_err;  /* the writer runs one thread here, so one error slot is shared */
} assemble;
#define HP__FAIL_HOLE 3

static void assemble_init(assemble *s, const vtensor *v, const char *name, int expert, hp__progress *progress)
{
    memset(s, 0, sizeof *s);
    const hp__geom *g = &v->pieces[0].geom;
    s->v = v;
    s->name = name;
    s->progress = progress;
    s->n_dims = g->n_dims;
    for (int d = 0; d < g->n_dims; d++) {
        s->lo[d] = 0;
        s->hi[d] = g->shape[d];
    }
    if (expert >= 0) {
        s->lo[0] = expert;
        s->hi[0] = expert + 1;
    }
    for (int i = 0; i < v->n_pieces; i++)
        for (int d = 0; d < g->n_dims; d++) {
            const hp__segs *sg = &v->pieces[i].geom.segs;
            if (!(sg->n[d] == 1 && sg->off[d][0] == 0 && sg->len[d][0] == g->shape[d]) && d > s->k) s->k = d;
        }
    s->inner = g->esize;
    for (int d = g->n_dims - 1; d > s->k; d--) s->inner *= g->shape[d];
    for (int d = 0; d < s->k; d++) s->idx[d] = s->lo[d];
    s->p = s->lo[s->k];
    s->done = s->hi[s->k] <= s->lo[s->k];
}

/* Local index of global index x along dim d of piece q, and the global end of the segment; -1 if absent. */
static int64_t piece_local(const piece *q, int d, int64_t x, int64_t *seg_end)
{
    int64_t base = 0;
    for (int i = 0; i < q->geom.segs.n[d]; i++) {
        int64_t o = q->geom.segs.off[d][i], l = q->geom.segs.len[d][i];
        if (x >= o && x < o + l) {
            if (seg_end) *seg_end = o + l;
            return base + (x - o);
        }
        base += l;
    }
    return -1;
}

static hp_status next_run(assemble *s, hp_err *err)
{
    const vtensor *v = s->v;
    for (int t = 0; t < v->n_pieces; t++) {
        const piece *q = &v->pieces[(s->last + t) % v->n_pieces];
        int64_t off = 0, end = 0;
        bool ok = true;
        for (int d = 0; d < s->k && ok; d++) {
            int64_t l = piece_local(q, d, s->idx[d], NULL);
            ok = l >= 0;
            off += l * q->lstride[d];
        }
        int64_t lk = ok ? piece_local(q, s->k, s->p, &end) : -1;
        if (lk < 0) continue;
        s->last = (s->last + t) % v->n_pieces;
        if (end > s->hi[s->k]) end = s->hi[s->k];
        s->run = q->data + off + lk * q->lstride[s->k];
        s->run_left = (end - s->p) * s->inner;
        s->p = end;
        if (s->p == s->hi[s->k]) {
            s->p = s->lo[s->k];
            int d = s->k - 1;
            for (; d >= 0; d--) {
                if (++s->idx[d] < s->hi[d]) break;
                s->idx[d] = s->lo[d];
            }
            if (d < 0) s->done = true;
        }
        return HP_OK;
    }
    /* Unreachable after hp__check_tiling; kept as an error, never a zero. */
    s->failed = HP__FAIL_HOLE;
    return hp_err_set(s->fill_err, HP_ERR_INPUT,
                      "%s: tensor '%s': no rank file holds index %lld along dim %d (with the dims before it at their "
                      "current position); the shard folder does not cover the tensor",
                      s->dir, s->name, (long long)s->p, s->k);
}

static hp_status assemble_fill(void *ctx, void *dst, size_t nbytes, hp_err *err)
{
    assemble *s = ctx;
    uint8_t *out = dst;
    size_t left = nbytes;
    if (hp__interrupted()) {
        s->failed = HP__FAIL_INTERRUPT;
        return hp__interrupt_error(err);
    }
    while (left) {
        if (s->run_left == 0) {
            if (s->done) return hp_err_set(err, HP_ERR_IO, "internal error: tensor '%s' ran out of bytes", s->name);
            hp_status st = next_run(s, err);
            if (st != HP_OK) return st;
        }
        size_t n = (size_t)s->run_left < left ? (size_t)s->run_left : left;
        if (!hp__guarded_copy(out, s->run, n)) {
            s->failed = HP__FAIL_FAULT;
            return hp_err_set(err, HP_ERR_IO, "a rank file changed while reading");
        }
        out += n;
        s->run += n;
        s->run_left -= (int64_t)n;
        left -= n;
    }
    if (s->progress) hp__progress_add(s->progress, nbytes);
    return HP_OK;
}

/* ---- output ---- */

/* *why gets HP__FAIL_* when a fill failed (then fill_err holds a hole's message). */
static hp_status write_outputs(merge_ctx *c, const char *tmp, uint64_t max_size, hp__progress *prog,
                               hp_shard_stats *stats, int *why, hp_err *fill_err, hp_err *err)
{
    *why = 0;
    const hp__manifest *m = c->man;
    size_t n = m->n_globals;
    uint64_t *nbytes = malloc((n + 1) * sizeof *nbytes);
    int *file_of = malloc((n + 1) * sizeof *file_of);
    assemble *as = malloc((n + 1) * sizeof *as);
    hp_status st = nbytes && file_of && as ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int n_files = 0;
    uint64_t in_file = 0, total = 0;
    for (size_t g = 0; g < n && st == HP_OK; g++) {
        int64_t elems = 1, nb = 0;
        for (int d = 0; d < m->globals[g].n_dims; d++) elems *= m->globals[g].shape[d]; /* checked by the reader */
        if (!hp_dtype_nbytes(m->globals[g].dtype, elems, &nb))
            st = hp_err_set(err, HP_ERR_INPUT, "manifest.json: tensor '%s' is not a whole number of bytes",
                            m->globals[g].name);
        nbytes[g] = (uint64_t)nb;
        if (g == 0 || (in_file > 0 && in_file + nbytes[g] > max_size)) {
            n_files++;
            in_file = 0;
        }
        file_of[g] = n_files - 1;
        in_file += nbytes[g];
        total += nbytes[g];
    }
    if (n == 0) n_files = 1;
    prog->total = total;
    json_t *wmap = json_object();
    if (st == HP_OK && !wmap) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    size_t g = 0;
    for (int f = 0; f < n_files && st == HP_OK; f++) {
        char name[96], path[4300];
        if (n_files == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", f + 1, n_files);
        hp_st_writer *w = hp_st_writer_create();
        if (!w) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        if (st == HP_OK) st = hp_st_writer_set_metadata(w, "format", "pt", err);
        for (; g < n && file_of[g] == f && st == HP_OK; g++) {
            const hp__mglobal *gl = &m->globals[g];
            const vtensor *v = &c->vt[c->gm[g].v];
            assemble_init(&as[g], v, gl->name, c->gm[g].expert, prog);
            as[g].dir = c->dir;
            as[g].fill_err = fill_err;
            st = hp_st_writer_add_fill(w, gl->name, gl->dtype, gl->n_dims, gl->shape, assemble_fill, &as[g], err);
            if (st == HP_OK && json_object_set_new(wmap, gl->name, json_string(name)) != 0)
                st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        }
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        size_t g0 = g;
        while (g0 > 0 && file_of[g0 - 1] == f) g0--;
        if (st == HP_OK) st = hp_st_writer_write(w, path, err);
        for (size_t k = g0; st != HP_OK && k < g; k++)
            if (as[k].failed) *why = as[k].failed;
        hp_st_writer_destroy(w);
    }
    if (st == HP_OK && n_files > 1) {
        json_t *root = json_object(), *meta = json_object();
        json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
        json_object_set_new(root, "metadata", meta);
        json_object_set(root, "weight_map", wmap);
        char *text = json_dumps(root, JSON_PRESERVE_ORDER | JSON_INDENT(2));
        json_decref(root);
        char path[4300];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp);
        st = text ? hp__write_text(path, text, strlen(text), err) : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        free(text);
    }
    json_decref(wmap);
    if (stats) {
        stats->bytes_written = total;
        stats->files = (uint64_t)n_files;
    }
    free(nbytes);
    free(file_of);
    free(as);
    return st;
}

hp_status hp_shard_merge(const char *dir, const char *out_dir, const hp_merge_opts *o, hp_shard_stats *stats,
                         hp_err *err)
{
    hp_merge_opts defaults = {0};
    if (!o) o = &defaults;
    if (stats) memset(stats, 0, sizeof *stats);
    int64_t t0 = hp__now_ns();
    uint64_t max_size = o->max_shard_size ? o->max_shard_size : 5000000000ull; /* transformers' "5GB" */
    hp__outdir *od = hp_calloc(1, sizeof *od);
    if (!od) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    const char *inputs[1] = {dir};
    hp_status st = hp__out_prepare(od, "merge", out_dir, o->force, inputs, 1, err);
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    struct stat sb;
    char kind[160];
    if (st == HP_OK && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        st = stat(dir, &sb) != 0
                 ? hp_err_set(err, HP_ERR_INPUT, "%s: no such folder; merge reads the folder 'hyperpar shard' or "
                              "'hyperpar train --save-every' wrote", dir)
                 : hp_err_set(err, HP_ERR_INPUT, "%s %s, not a folder; merge reads the folder 'hyperpar shard' or "
                              "'hyperpar train --save-every' wrote", dir, hp_path_describe(dir, kind, sizeof kind));
    if (st == HP_OK && stat(path, &sb) != 0) {
        char sj[4200];
        snprintf(sj, sizeof sj, "%s/state.json", dir);
        bool odd = lstat(sj, &sb) == 0 && !S_ISREG(sb.st_mode); /* a state.json that is no file: say what it is */
        st = hp_err_set(err, HP_ERR_INPUT,
                        "%s: manifest.json is missing; this is not a complete 'hyperpar shard' output (nor a "
                        "training checkpoint: %s%s)", dir, odd ? "its state.json " : "it has no state.json and no "
                        "step-<t> folder", odd ? hp_path_describe(sj, kind, sizeof kind) : "");
    }
    hp__manifest *man = NULL;
    if (st == HP_OK) st = hp__manifest_read(path, &man, err);
    if (st != HP_OK) {
        free(od);
        return st;
    }
    merge_ctx c = {.man = man, .dir = dir};
    hp_arena a;
    hp_arena_init(&a);
    hp__snap snap = {0};
    const char **paths = hp_calloc((size_t)man->world, sizeof *paths);
    uint64_t *sizes = hp_calloc((size_t)man->world, sizeof *sizes);
    c.files = hp_calloc((size_t)man->world, sizeof *c.files);
    if (!c.files || !paths || !sizes) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) st = build_pieces(&c, &a, err); /* the manifest alone: consistency and tiling */
    uint64_t globals = hp__globals_digest_manifest(man);
    for (size_t r = 0; r < man->n_ranks && st == HP_OK; r++) {
        st = open_rank(&c, globals, r, err);
        paths[r] = c.files[r] ? hp_st_path(c.files[r]) : "";
        sizes[r] = c.files[r] ? hp_st_file_size(c.files[r]) : 0;
    }
    if (st == HP_OK) attach_data(&c);
    if (st == HP_OK) st = hp__snap_take(&snap, paths, sizes, man->n_ranks, err);
    if (st == HP_OK && o->verify) st = verify_ranks(&c, err);
    hp__guard_enter();
    if (st == HP_OK) st = hp__out_begin(od, err);
    if (st == HP_OK) {
        hp__progress prog;
        hp__progress_init(&prog, o->progress, "merging", 0);
        int why = 0;
        hp_err fill_err;
        hp_err_clear(&fill_err);
        st = write_outputs(&c, od->tmp, max_size, &prog, stats, &why, &fill_err, err);
        hp__progress_end(&prog);
        if (why == HP__FAIL_HOLE && err) *err = fill_err;
        char cfg[4300], dst[4300];
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        snprintf(dst, sizeof dst, "%s/config.json", od->tmp);
        if (st == HP_OK && !hp__interrupted() && hp__file_exists(cfg)) st = hp__copy_file(cfg, dst, err);
        st = hp__out_finish(od, &snap, "rank file", why, st, err);
    }
    hp__guard_leave();
    hp__snap_free(&snap);
    for (size_t r = 0; c.files && r < man->n_ranks; r++) hp_st_close(c.files[r]);
    free(c.files);
    free(paths);
    free(sizes);
    free(od);
    hp_arena_free(&a);
    hp__manifest_free(man);
    if (stats) stats->seconds = (double)(hp__now_ns() - t0) / 1e9;
    return st;
}

bool hp_shard_parse_size(const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0)) return false;
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"KB", 1e3},
                 {"MB", 1e6},
                 {"GB", 1e9},
                 {"TB", 1e12},
                 {"KIB", 1024.0},
                 {"MIB", 1048576.0},
                 {"GIB", 1073741824.0},
                 {"TIB", 1099511627776.0},
                 {"K", 1e3},
                 {"M", 1e6},
                 {"G", 1e9},
                 {"T", 1e12}};
    char u[8];
    size_t n = strlen(end);
    if (n >= sizeof u) return false;
    for (size_t i = 0; i <= n; i++) u[i] = (char)(end[i] >= 'a' && end[i] <= 'z' ? end[i] - 32 : end[i]);
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcmp(u, units[i].unit)) {
            double b = v * units[i].mult;
            if (b < 1 || b > 1.8e19) return false;
            *out = (uint64_t)b;
            return true;
        }
    return false;
}
