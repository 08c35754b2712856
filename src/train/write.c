/*
 * write.c — what rank 0 of a training run writes: the trained model as a folder (config.json with "torch_dtype":
 * "float32", model.safetensors with every trained parameter F32 under its own name and what was not trained
 * copied as stored), and --grad-out (grad.<name> F32 of the first step, loss F32 [N]), each atomically. The
 * tensors come whole from hp_runner_gather_params into a list (hp__trn_keep).
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "trainer.h"
#include "hyperpar/safetensors.h"
#include "hyperpar/trainckpt.h"

void hp__trn_list_free(hp__trn_list *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->e[i].name);
        free(l->e[i].data);
    }
    free(l->e);
    memset(l, 0, sizeof *l);
}

hp_status hp__trn_keep(void *ctx, const char *name, const float *data, const int64_t *shape, int n_dims, hp_err *err)
{
    hp__trn_list *l = ctx;
    if (n_dims < 0 || n_dims > HP_MAX_DIMS)
        return hp_err_set(err, HP_ERR_INPUT, "parameter '%s' has %d dimensions", name, n_dims);
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        void *e = realloc(l->e, (size_t)cap * sizeof *l->e);
        if (!e) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        l->e = e;
        l->cap = cap;
    }
    int64_t n = 1;
    for (int d = 0; d < n_dims; d++) n *= shape[d];
    hp__trn_tensor *t = &l->e[l->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->data = malloc((size_t)(n > 0 ? n : 1) * sizeof *t->data);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    memcpy(t->data, data, (size_t)n * sizeof *data);
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) t->shape[d] = shape[d];
    l->n++;
    return HP_OK;
}

static const hp__trn_tensor *list_find(const hp__trn_list *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->e[i].name, name)) return &l->e[i];
    return NULL;
}

/* ---- --grad-out ---- */

hp_status hp__trn_write_grads(const char *path, const hp__trn_list *g, const float *loss, int64_t steps, hp_err *err)
{
    hp_st_writer *w = hp_st_writer_create();
    if (!w) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_status st = HP_OK;
    char key[1100];
    for (int i = 0; st == HP_OK && i < g->n; i++) {
        snprintf(key, sizeof key, "grad.%s", g->e[i].name);
        st = hp_st_writer_add(w, key, HP_DT_F32, g->e[i].n_dims, g->e[i].shape, g->e[i].data, err);
    }
    if (st == HP_OK) st = hp_st_writer_add(w, "loss", HP_DT_F32, 1, &steps, loss, err);
    if (st == HP_OK) st = hp_st_writer_write(w, path, err);
    hp_st_writer_destroy(w);
    return st;
}

static hp_status read_text(const char *path, char **out, size_t *len, hp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return hp_err_set(err, HP_ERR_INPUT, "%s: cannot read it (%s); --out copies the model's config.json", path,
                              strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 > cap) {
            cap = cap ? 2 * cap : 65536;
            if (cap > ((size_t)64 << 20)) {
                fclose(f);
                free(buf);
                return hp_err_set(err, HP_ERR_INPUT, "%s is larger than 64 MiB; not a config.json", path);
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                fclose(f);
                free(buf);
                return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
    }
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return hp_err_set(err, HP_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return HP_OK;
}

/* ---- the model folder ---- */

typedef struct copy_ctx {
    const hp_st_file *f;
    const hp_st_tensor *t;
    uint64_t off;
} copy_ctx;

/* Streams a tensor not trained (frozen, not in the plan) from the checkpoint as stored. */
static hp_status copy_fill(void *ctx, void *dst, size_t nbytes, hp_err *err)
{
    copy_ctx *c = ctx;
    hp_status st = hp_st_read(c->f, c->t, c->off, dst, nbytes, err);
    c->off += nbytes;
    return st;
}

/* model.safetensors' tensors into w: the checkpoint's in its order (trained ones from p, F32; the rest streamed
 * as stored through cc[i]), then trained ones the checkpoint does not list. */
static hp_status add_tensors(const hp_model *m, const hp__trn_list *p, hp_st_writer *w, copy_ctx *cc, hp_err *err)
{
    size_t n_ck = m->ckpt ? hp_ckpt_count(m->ckpt) : 0;
    hp_status st = HP_OK;
    for (size_t i = 0; st == HP_OK && i < n_ck; i++) {
        const hp_ckpt_tensor *ct = hp_ckpt_at(m->ckpt, i);
        const hp__trn_tensor *e = list_find(p, ct->t->name);
        if (e) {
            st = hp_st_writer_add(w, e->name, HP_DT_F32, e->n_dims, e->shape, e->data, err);
        } else {
            cc[i] = (copy_ctx){.f = ct->file, .t = ct->t};
            st = hp_st_writer_add_fill(w, ct->t->name, ct->t->dtype, ct->t->n_dims, ct->t->shape, copy_fill, &cc[i],
                                       err);
        }
    }
    /* Trained parameters the checkpoint does not list (none for the families today) are written too. */
    for (int i = 0; st == HP_OK && i < p->n; i++)
        if (!m->ckpt || !hp_ckpt_find(m->ckpt, p->e[i].name))
            st = hp_st_writer_add(w, p->e[i].name, HP_DT_F32, p->e[i].n_dims, p->e[i].shape, p->e[i].data, err);
    return st;
}

/* config.json (torch_dtype float32) and model.safetensors of the trained parameters (the rest copied as stored):
 * as the folder of (of), begun and committed here, or (of NULL) into the existing folder dir. */
hp_status hp__trn_write_folder(hp_trainer *t, const hp__trn_list *p, hp_outdir *of, const char *dir, hp_err *err)
{
    const hp_model *m = t->m;
    char cfg_path[PATH_MAX + 16];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", m->ckpt ? hp_ckpt_dir(m->ckpt) : t->c.model);
    char *text = NULL, *cfg = NULL;
    size_t tlen = 0;
    hp_status st = read_text(cfg_path, &text, &tlen, err);
    if (st == HP_OK) st = hp_config_set_dtype(cfg_path, text, tlen, "float32", &cfg, err);
    free(text);
    size_t n_ck = m->ckpt ? hp_ckpt_count(m->ckpt) : 0;
    copy_ctx *cc = hp_calloc(n_ck + 1, sizeof *cc);
    if (st == HP_OK && !cc) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    /* Without the checkpoint (a shard folder), every parameter must have been trained. */
    for (size_t i = 0; st == HP_OK && !m->ckpt && i < m->n_params; i++)
        if (!list_find(p, m->params[i].name))
            st = hp_err_set(err, HP_ERR_INPUT, "%s: parameter '%s' is not trained (frozen or not in the plan) and a "
                            "shard folder does not hold it whole; train the checkpoint itself to write --out",
                            t->c.model, m->params[i].name);
    hp_st_writer *w = st == HP_OK ? hp_st_writer_create() : NULL;
    if (st == HP_OK && !w) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) st = add_tensors(m, p, w, cc, err);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "format", "pt", err);
    bool begun = of && st == HP_OK; /* a checkpoint's folder was begun by its caller (of NULL: write into dir) */
    if (begun) st = hp_outdir_begin(of, err);
    const char *into = of ? hp_outdir_tmp(of) : dir;
    if (st == HP_OK) {
        char path[PATH_MAX + 96];
        snprintf(path, sizeof path, "%s/config.json", into);
        st = hp_file_write_atomic(path, cfg, strlen(cfg), "config.json", err);
        snprintf(path, sizeof path, "%s/model.safetensors", into);
        if (st == HP_OK) st = hp_st_writer_write(w, path, err);
        if (begun && st == HP_OK) st = hp_outdir_commit(of, err);
        else if (begun) hp_outdir_abort(of);
    }
    hp_st_writer_destroy(w);
    free(cc);
    free(cfg);
    return st;
}
