/*
 * write.c — hp_shard_write: one safetensors file per distinct rank, hard links for dp replicas, the manifest.
 *
 *   layout (layout.c) ──▶ distinct ranks (file_rank == rank) ──OpenMP over files──▶ DIR.tmp.<pid>/rank-r.safetensors
 *                                                                                   │ each tensor: hp__gather over the
 *                                                                                   │ mmap'd source (copy.c)
 *   replicas: link(rank-file_rank, rank-r), a copy where link() fails ─────────────▶ rank-r.safetensors
 *   each distinct file is read back once for its XXH64 checksum (manifest "checksum")
 *   manifest.json, config.json ──────────────────────────────────────────────────▶ rename to DIR (outdir.c)
 *
 * Every source byte a rank needs is read once, straight from the mapping (guarded: a source truncated
 * meanwhile is an error), and written once per distinct file; nothing holds a whole tensor. Every rank file's
 * __metadata__ carries the folder identity and its layout digest (identity.c). A failure anywhere, an
 * interrupt, or a source whose size / mtime / inode changed by the end removes the temporary folder.
 */
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shard/shard_int.h"

typedef struct job {
    const hp_model *m;
    const hp_shard_layout *l;
    const char *tmp;
    hp__progress *progress;
    int writer_threads; /* threads over the tensors of one file */
    const char *identity;
    uint64_t globals;        /* hp__globals_digest_model */
    uint64_t *bytes, *sums;  /* [world]: each distinct file's size and checksum, filled by write_rank */
} job;

/* "0,2" and "dp=0,tp=0;dp=1,tp=0": every rank that shares file_rank's file. */
static void replica_lists(const hp_shard_layout *l, int64_t file_rank, hp_buf *ranks, hp_buf *coords)
{
    char c[256];
    bool first = true;
    for (int64_t r = file_rank; r < l->world; r++) {
        if (l->ranks[r].file_rank != file_rank) continue;
        hp_buf_printf(ranks, "%s%lld", first ? "" : ",", (long long)r);
        hp_buf_printf(coords, "%s%s", first ? "" : ";", hp_shard_coords_str(l, r, c, sizeof c));
        first = false;
    }
    hp_buf_append(ranks, "", 1);
    hp_buf_append(coords, "", 1);
}

static hp_status source_ptr(const hp_model *m, int param, const uint8_t **out, hp_err *err)
{
    const hp_ckpt_tensor *ct = hp_ckpt_find(m->ckpt, m->params[param].name);
    if (!ct) return hp_err_set(err, HP_ERR_INPUT, "tensor '%s' is missing from the checkpoint", m->params[param].name);
    *out = hp_st_data(ct->file, ct->t);
    return HP_OK;
}

/* Writes rank's file. *why gets HP__FAIL_* when a copy faulted or was interrupted (0 otherwise). */
static hp_status write_rank(const job *j, int64_t rank, int *why, hp_err *err)
{
    *why = 0;
    hp__mtensor *mts = hp_calloc(j->l->n_tensors ? j->l->n_tensors : 1, sizeof *mts);
    const hp_shard_layout *l = j->l;
    hp_st_writer *w = hp_st_writer_create();
    hp__gather *g = hp_calloc(l->n_tensors ? l->n_tensors : 1, sizeof *g);
    const uint8_t ***experts = hp_calloc(l->n_tensors ? l->n_tensors : 1, sizeof *experts);
    hp_buf ranks, coords;
    hp_buf_init(&ranks);
    hp_buf_init(&coords);
    hp_status st = (w && g && experts && mts) ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    char mesh[256] = "", world[32];
    for (int d = 0; d < l->mesh.n_dims; d++)
        snprintf(mesh + strlen(mesh), sizeof mesh - strlen(mesh), "%s%s=%lld", d ? "," : "", l->mesh.names[d],
                 (long long)l->mesh.sizes[d]);
    snprintf(world, sizeof world, "%lld", (long long)l->world);
    replica_lists(l, rank, &ranks, &coords);
    if (st == HP_OK && (ranks.oom || coords.oom)) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "format", "pt", err);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "hyperpar_rank", ranks.data, err);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "hyperpar_world", world, err);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "hyperpar_mesh", mesh, err);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "hyperpar_coords", coords.data, err);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "hyperpar_identity", j->identity, err);
    size_t held = 0; /* the tensors this rank holds (a pipeline stage holds its layers') */
    for (size_t i = 0; i < l->n_tensors && st == HP_OK; i++) {
        hp_shard_tensor t;
        st = hp_shard_rank_tensor(l, rank, i, &t, err);
        if (st == HP_OK && !t.absent) hp__mtensor_from(&t, &mts[held++]);
    }
    char layout[17];
    hp__hex64(hp__rank_layout(j->globals, mts, held), layout);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "hyperpar_layout", layout, err);
    for (size_t i = 0; i < l->n_tensors && st == HP_OK; i++) {
        hp_shard_tensor t;
        hp__segs s;
        hp__geom geom;
        st = hp_shard_rank_tensor(l, rank, i, &t, err);
        if (st == HP_OK && t.absent) continue;
        if (st == HP_OK) st = hp__segs_from_tensor(&t, &s, err);
        if (st == HP_OK) st = hp__geom_make(t.name, t.dtype, &s, &geom, err);
        const uint8_t *base = NULL;
        if (st == HP_OK && t.stacked) {
            experts[i] = hp_calloc((size_t)t.n_globals, sizeof *experts[i]);
            if (!experts[i]) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            for (int e = 0; e < t.n_globals && st == HP_OK; e++)
                st = source_ptr(j->m, t.params[e], &experts[i][e], err);
        } else if (st == HP_OK) {
            st = source_ptr(j->m, t.params[0], &base, err);
        }
        if (st != HP_OK) break;
        hp__gather_init(&g[i], &geom, base, (const uint8_t *const *)experts[i], j->progress);
        st = hp_st_writer_add_fill(w, t.name, t.dtype, t.n_dims, t.local_shape, hp__gather_fill, &g[i], err);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/rank-%05lld.safetensors", j->tmp, (long long)rank);
    if (st == HP_OK) {
        hp_st_writer_set_threads(w, j->writer_threads);
        st = hp_st_writer_write(w, path, err);
        for (size_t i = 0; st != HP_OK && i < l->n_tensors; i++)
            if (g[i].failed) *why = g[i].failed;
    }
    if (st == HP_OK) st = hp__file_checksum(path, &j->sums[rank], &j->bytes[rank], err);
    if (st != HP_OK) hp_err_prefix(err, "rank %lld", (long long)rank);
    hp_st_writer_destroy(w);
    free(mts);
    for (size_t i = 0; experts && i < l->n_tensors; i++) free(experts[i]);
    free(experts);
    free(g);
    hp_buf_free(&ranks);
    hp_buf_free(&coords);
    return st;
}

static hp_status link_replicas(const hp_shard_layout *l, const char *tmp, uint64_t *links, hp_err *err)
{
    for (int64_t r = 0; r < l->world; r++) {
        int64_t f = l->ranks[r].file_rank;
        if (f == r) continue;
        if (hp__interrupted()) return hp__interrupt_error(err);
        char src[4200], dst[4200];
        snprintf(src, sizeof src, "%s/rank-%05lld.safetensors", tmp, (long long)f);
        snprintf(dst, sizeof dst, "%s/rank-%05lld.safetensors", tmp, (long long)r);
        if (link(src, dst) != 0) {
            hp_status st = hp__copy_file(src, dst, err); /* file systems without hard links */
            if (st != HP_OK) return st;
        }
        (*links)++;
    }
    return HP_OK;
}

/* The plan's JSON text (o->plan_text as read, else the plan serialised) into b, and its fingerprint into fp. */
static hp_status plan_text(const hp_plan *p, const char *text, hp_buf *b, char *fp, hp_err *err)
{
    hp_status st = HP_OK;
    if (text) hp_buf_puts(b, text);
    else st = hp_plan_to_json(p, b, err);
    if (st == HP_OK && b->oom) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) hp__fnv1a_hex(b->data ? b->data : "", b->len, fp);
    return st;
}

static hp_status write_all(const hp_model *m, const hp_shard_layout *l, const char *tmp, const char *identity,
                           const char *plan_fp, const hp_buf *plan, const hp_shard_opts *o, hp_shard_stats *stats, int *why, hp_err *err)
{
    int64_t *files = malloc((size_t)l->world * sizeof *files);
    uint64_t *bytes = hp_calloc((size_t)l->world, sizeof *bytes), *sums = hp_calloc((size_t)l->world, sizeof *sums);
    if (!files || !bytes || !sums) {
        free(files);
        free(bytes);
        free(sums);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    int64_t n_files = 0;
    uint64_t total = 0;
    for (int64_t r = 0; r < l->world; r++)
        if (l->ranks[r].file_rank == r) {
            files[n_files++] = r;
            total += l->ranks[r].nbytes;
        }
    hp__progress prog;
    hp__progress_init(&prog, o->progress, "sharding", total);
    /* Threads go over files when there are enough of them, otherwise over the tensors of each file (one
     * file at a time): nested parallel regions would run single-threaded. */
    int threads = o->threads > 0 ? o->threads : 1;
    job j = {.m = m, .l = l, .tmp = tmp, .progress = &prog, .writer_threads = 1, .identity = identity,
             .globals = hp__globals_digest_model(m), .bytes = bytes, .sums = sums};
    if (threads > n_files) {
        j.writer_threads = threads;
        threads = 1;
    }
    hp_status st = HP_OK;
    int failed = 0, first_why = 0;
    int64_t failed_at = n_files;
    hp_err first_err;
    hp_err_clear(&first_err);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t f = 0; f < n_files; f++) {
        hp_err e;
        hp_err_clear(&e);
        int skip, w = 0;
#pragma omp atomic read
        skip = failed; /* after a failure the remaining files are not worth writing */
        if (skip) continue;
        hp_status s = write_rank(&j, files[f], &w, &e);
        if (s != HP_OK) {
#pragma omp critical(hp_shard_err)
            {
                if (f < failed_at) {
                    failed_at = f;
                    first_err = e;
                    st = s;
                }
                if (w) first_why = w;
#pragma omp atomic write
                failed = 1;
            }
        }
    }
    hp__progress_end(&prog);
    free(files);
    *why = first_why;
    if (st != HP_OK) {
        if (err) *err = first_err;
        free(bytes);
        free(sums);
        return st;
    }
    if (stats) {
        stats->bytes_written = total;
        stats->files = (uint64_t)n_files;
    }
    uint64_t links = 0;
    st = link_replicas(l, tmp, &links, err);
    if (stats) stats->links = links;
    for (int64_t r = 0; r < l->world; r++) { /* replicas share their file's size and checksum */
        bytes[r] = bytes[l->ranks[r].file_rank];
        sums[r] = sums[l->ranks[r].file_rank];
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    if (st == HP_OK) st = hp__manifest_write(l, m, o->plan_file, plan_fp, true, identity, bytes, sums, path, err);
    /* the plan itself, so that run and train on the folder need no flags (hp_shard_folder_plan) */
    snprintf(path, sizeof path, "%s/" HP__SHARD_PLAN_FILE, tmp);
    if (st == HP_OK) st = hp__write_text(path, plan->data ? plan->data : "", plan->len, err);
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", hp_ckpt_dir(m->ckpt));
    snprintf(path, sizeof path, "%s/config.json", tmp);
    if (st == HP_OK && hp__file_exists(cfg)) st = hp__copy_file(cfg, path, err);
    free(bytes);
    free(sums);
    return st;
}

/* The paths the output must keep clear of: the checkpoint as given, its files, config.json, the caller's. */
static const char **input_list(const hp_model *m, const hp_shard_opts *o, hp_arena *a, size_t *n)
{
    size_t nf = hp_ckpt_file_count(m->ckpt), cap = nf + 2 + (o->n_inputs > 0 ? (size_t)o->n_inputs : 0);
    const char **v = hp_arena_alloc(a, cap * sizeof *v);
    if (!v) return NULL;
    *n = 0;
    v[(*n)++] = m->path;
    v[(*n)++] = hp_arena_printf(a, "%s/config.json", hp_ckpt_dir(m->ckpt));
    for (size_t i = 0; i < nf; i++) v[(*n)++] = hp_st_path(hp_ckpt_file(m->ckpt, i));
    for (int i = 0; i < o->n_inputs; i++) v[(*n)++] = o->inputs[i];
    return v;
}

hp_status hp_shard_write(const hp_model *m, const hp_plan *p, const char *out_dir, const hp_shard_opts *o,
                         hp_shard_stats *stats, hp_err *err)
{
    hp_shard_opts defaults = {0};
    if (!o) o = &defaults;
    if (stats) memset(stats, 0, sizeof *stats);
    int64_t t0 = hp__now_ns();
    if (m->meta || !m->ckpt)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s holds no weights (config.json only); shard needs a checkpoint with safetensors files",
                          m->path);
    hp_arena a;
    hp_arena_init(&a);
    size_t n_in = 0;
    const char **inputs = input_list(m, o, &a, &n_in);
    hp__outdir *od = hp_calloc(1, sizeof *od);
    hp_status st = inputs && od ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) st = hp__out_prepare(od, "shard", out_dir, o->force, inputs, n_in, err);
    hp_shard_layout *l = NULL;
    if (st == HP_OK) st = hp_shard_layout_build(&l, m, p, err);
    hp__snap snap = {0};
    const char **files = NULL;
    uint64_t *sizes = NULL;
    size_t nf = st == HP_OK ? hp_ckpt_file_count(m->ckpt) : 0;
    if (st == HP_OK && (!(files = hp_arena_alloc(&a, (nf ? nf : 1) * sizeof *files)) ||
                        !(sizes = hp_arena_alloc(&a, (nf ? nf : 1) * sizeof *sizes))))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == HP_OK && i < nf; i++) {
        files[i] = hp_st_path(hp_ckpt_file(m->ckpt, i));
        sizes[i] = hp_st_file_size(hp_ckpt_file(m->ckpt, i));
    }
    if (st == HP_OK) st = hp__snap_take(&snap, files, sizes, nf, err);
    hp__guard_enter();
    char fp[17], identity[33];
    hp_buf plan;
    hp_buf_init(&plan);
    if (st == HP_OK) st = plan_text(p, o->plan_text, &plan, fp, err);
    if (st == HP_OK) st = hp__identity(m, l, identity, err);
    if (st == HP_OK) st = hp__out_begin(od, err);
    int why = 0;
    if (st == HP_OK) {
        st = write_all(m, l, od->tmp, identity, fp, &plan, o, stats, &why, err);
        st = hp__out_finish(od, &snap, "source", why, st, err);
    }
    hp__guard_leave();
    hp_buf_free(&plan);
    hp__snap_free(&snap);
    hp_shard_layout_free(l);
    free(od);
    hp_arena_free(&a);
    if (stats) stats->seconds = (double)(hp__now_ns() - t0) / 1e9;
    return st;
}
