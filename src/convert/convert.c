/*
 * convert.c — `hyperpar convert MODEL.gguf --out DIR`: a GGUF model as a Hugging Face folder that transformers
 * loads as it is (docs/gguf.md, "What convert writes").
 *
 *   open + validate the GGUF file ─► map names, shapes, config (gguf_llama.c) ─► tokenizer texts
 *   (gguf_tokenizer.c) ─► OUT.tmp.<pid>/ {config.json, generation_config.json, tokenizer.json,
 *   tokenizer_config.json, model.safetensors} ─► renamed to OUT (hyperpar/outdir.h)
 *
 * Everything that can be refused is refused before the output folder is made. model.safetensors is streamed:
 * the writer asks each tensor for its bytes in pieces (hp_st_writer_add_fill), and the fill reads one GGUF row
 * at a time (hp_gguf_read_f32: dequantized to f32), in transformers' row order (a q_proj / k_proj row comes from
 * the GGUF row the rotary permutation put it in), and narrows it to the output dtype. Memory: one row per tensor
 * being written.
 */
#include "hyperpar/convert.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/guard.h"
#include "hyperpar/outdir.h"
#include "hyperpar/safetensors.h"

void hp_convert_opts_default(hp_convert_opts *o)
{
    memset(o, 0, sizeof *o);
    o->dtype = HP_DT_BF16;
}

/* The files convert writes (the output folder's names: hyperpar/outdir.h). */
static const char *const g_names[] = {"config.json", "generation_config.json", "model.safetensors",
                                      "tokenizer.json", "tokenizer_config.json", NULL};

typedef struct fill_ctx {
    const hp_gguf_file *f;
    const hp_gguf_mapped *m;
    hp_dtype dt;
    int64_t cols;     /* elements per row: the GGUF ne[0], transformers' last dim */
    int64_t pos;      /* elements written so far */
    int64_t head_dim; /* permuted tensors: rows per head */
    int64_t cached;   /* the source row in row[], -1: none */
    float *row;       /* [cols] */
} fill_ctx;

/* The GGUF row holding transformers' row r: inside head h = r / d, row (half, i) = (w / (d/2), w % (d/2)) with
 * w = r % d was written at 2·i + half. */
static int64_t source_row(const fill_ctx *c, int64_t r)
{
    if (!c->head_dim) return r;
    const int64_t d = c->head_dim, h = r / d, w = r % d, half = w / (d / 2), i = w % (d / 2);
    return h * d + 2 * i + half;
}

static hp_status fill(void *ctx, void *dst, size_t nbytes, hp_err *err)
{
    fill_ctx *c = ctx;
    const size_t esz = (size_t)hp_dtype_bits(c->dt) / 8;
    int64_t n = (int64_t)(nbytes / esz);
    unsigned char *out = dst;
    if (!c->row && !(c->row = malloc((size_t)c->cols * sizeof *c->row)))
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory for a row of %lld elements", (long long)c->cols);
    while (n > 0) {
        const int64_t r = c->pos / c->cols, col = c->pos % c->cols, k = n < c->cols - col ? n : c->cols - col;
        const int64_t src = source_row(c, r);
        hp_status st;
        if (src != c->cached) {
            if ((st = hp_gguf_read_f32(c->f, c->m->src, src, 1, c->row, err))) return st;
            c->cached = src;
        }
        if ((st = hp_dtype_from_f32(c->dt, c->row + col, out, k, err))) return st;
        out += (size_t)k * esz;
        c->pos += k;
        n -= k;
    }
    return HP_OK;
}

/* dir/name holding text and a final newline. */
static hp_status write_text(const char *dir, const char *name, const char *text, hp_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t n = strlen(text);
    char *t = malloc(n + 2);
    if (!t) return hp_err_set(err, HP_ERR_NOMEM, "out of memory writing %s", name);
    memcpy(t, text, n);
    t[n] = '\n';
    hp_status st = hp_file_write_atomic(path, t, n + 1, name, err);
    free(t);
    return st;
}

static hp_status write_weights(const hp_gguf_model *g, hp_dtype dt, int threads, const char *dir,
                               hp_convert_stats *stats, hp_err *err)
{
    fill_ctx *ctx = hp_calloc(g->n_tensors, sizeof *ctx);
    hp_st_writer *w = hp_st_writer_create();
    hp_status st = ctx && w ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    uint64_t bytes = 0;
    for (size_t i = 0; i < g->n_tensors && !st; i++) {
        const hp_gguf_mapped *m = &g->tensors[i];
        ctx[i] = (fill_ctx){.f = g->file, .m = m, .dt = dt, .cols = m->src->ne[0], .cached = -1,
                            .head_dim = m->permute_heads ? m->shape[0] / m->permute_heads : 0};
        int64_t shape[HP_MAX_DIMS] = {0};
        for (int d = 0; d < m->n_dims; d++) shape[d] = m->shape[d];
        bytes += (uint64_t)m->src->n_elems * (uint64_t)hp_dtype_bits(dt) / 8;
        st = hp_st_writer_add_fill(w, m->name, dt, m->n_dims, shape, fill, &ctx[i], err);
    }
    if (!st) {
        char path[4200];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        hp_st_writer_set_threads(w, threads);
        st = hp_st_writer_write(w, path, err);
    }
    for (size_t i = 0; ctx && i < g->n_tensors; i++) free(ctx[i].row);
    free(ctx);
    hp_st_writer_destroy(w);
    if (stats) stats->bytes = bytes;
    return st;
}

static int default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

/* The folder's files into dir (the temporary folder). */
static hp_status write_folder(const hp_gguf_model *g, const char *tok, const char *tok_cfg, const hp_convert_opts *o,
                              const char *dir, hp_convert_stats *stats, hp_err *err)
{
    hp_status st = write_text(dir, "config.json", g->config_json, err);
    if (!st) st = write_text(dir, "generation_config.json", g->generation_config_json, err);
    if (!st) st = write_text(dir, "tokenizer.json", tok, err);
    if (!st) st = write_text(dir, "tokenizer_config.json", tok_cfg, err);
    if (!st) st = write_weights(g, o->dtype, o->threads > 0 ? o->threads : default_threads(), dir, stats, err);
    if (!st && hp_interrupted()) st = hp__interrupt_error(err);
    return st;
}

hp_status hp_convert_gguf(const char *path, const hp_convert_opts *o, hp_convert_stats *stats, hp_err *err)
{
    if (stats) memset(stats, 0, sizeof *stats);
    if (!o->out || !*o->out) return hp_err_set(err, HP_ERR_INPUT, "convert: --out names no folder");
    const char *inputs[1] = {path};
    hp_outdir_spec spec = {.cmd = "convert", .out = o->out, .names = g_names, .example = "model-hf",
                           .force = o->force, .make_parents = true, .inputs = inputs, .n_inputs = 1};
    hp_outdir *od = NULL;
    hp_gguf_file *f = NULL;
    hp_gguf_model *g = NULL;
    char *tok = NULL, *tok_cfg = NULL;
    /* Everything that can be refused is refused before the folder is made: --out, the file, the mapping, the
     * tokenizer. */
    hp_status st = hp_outdir_open(&od, &spec, err);
    if (!st) st = hp_gguf_open(&f, path, err);
    if (!st) st = hp_gguf_model_map(&g, f, o->dtype, err);
    if (!st) st = hp_gguf_tokenizer(f, &tok, &tok_cfg, err);
    if (!st) st = hp_outdir_begin(od, err);
    if (!st) st = write_folder(g, tok, tok_cfg, o, hp_outdir_tmp(od), stats, err);
    if (!st) st = hp_outdir_commit(od, err);
    if (st) hp_outdir_fix_msg(od, err);
    if (!st && stats) {
        stats->n_tensors = g->n_tensors;
        stats->tied = g->tied;
    }
    hp_outdir_close(od); /* removes the temporary folder when it was not committed */
    free(tok);
    free(tok_cfg);
    hp_gguf_model_free(g);
    hp_gguf_close(f);
    return st;
}
