/*
 * agree.c — before the runtime's first collective that depends on what a rank was given, every rank agrees
 * that it was given the same thing as rank 0. A rank started with other mesh flags, another plan file,
 * sequence or loss parallelism switched differently, another compute mode or router, or on other weights
 * would otherwise enter other collectives than its peers (a hang) or mix two models (wrong numbers).
 *
 * Each rank computes, on its own and without reading anything big, a fingerprint of seven parts:
 *
 *   mesh         the mesh's sizes, the EP size and whether ep is an axis
 *   sp, lp       the plan's sequence_parallel and loss_parallel
 *   model        family, the parameter count, and every number the runtime reads from config.json (hp__rcfg:
 *                widths, heads, rope and its scaling, windows per layer)
 *   source       a checkpoint or a shard folder
 *   weights      checkpoint: every tensor's name, dtype, shape and three 64-byte windows of its bytes (start,
 *                middle, end: two random initialisations or two trainings differ there); shard folder: the
 *                folder identity in the rank file's __metadata__ (it covers the source tensors, the mesh and
 *                every rank's layout, docs/shard-format.md)
 *   plan         the plan's JSON (hp_plan_to_json) without the model's path: placements, contracts, overrides'
 *                effects, EP compute and its options
 *   options      compute mode, router, overlap, run or validate, synchronised collectives
 *
 * The parts are gathered from every rank (one allgather of a few hundred bytes each); every rank sees every
 * fingerprint and so reaches the same verdict, which names the first rank that differs from rank 0 and, in
 * that order, the first part that differs with both values where they are words. The cost is three small
 * reads per tensor (at most three pages each) and one serialisation of the plan.
 */
#include "run/agree.h"


#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { P_MESH, P_SP, P_LP, P_MODEL, P_SOURCE, P_WEIGHTS, P_PLAN, P_OPTIONS, P_COUNT };

typedef struct fingerprint {
    uint64_t h[P_COUNT];
    char mesh[96], model[96], options[96];
} fingerprint;

static void mix_i64(hp_hash64 *h, int64_t v) { hp_hash64_update(h, &v, sizeof v); }
static void mix_f64(hp_hash64 *h, double v) { hp_hash64_update(h, &v, sizeof v); }
static void mix_str(hp_hash64 *h, const char *s) { hp_hash64_update(h, s ? s : "", s ? strlen(s) + 1 : 1); }
static uint64_t str_hash(const char *s) { return hp_hash64_bytes(s ? s : "", s ? strlen(s) + 1 : 1, 0); }

/* Every number the runtime reads from config.json: two ranks that read two configs compute other things. */
static uint64_t model_hash(const hp_model *m, const hp__rcfg *c)
{
    hp_hash64 h;
    hp_hash64_init(&h, 0);
    mix_str(&h, m->family ? hp_family_name(m->family) : "?");
    int64_t iv[] = {(int64_t)hp_model_num_params(m), c->H, c->L, c->nh, c->nkv, c->hd, c->V, c->I, (int64_t)c->rope,
                    c->interleave, c->truncate, c->orig_max, c->rot};
    for (size_t i = 0; i < sizeof iv / sizeof *iv; i++) mix_i64(&h, iv[i]);
    double dv[] = {c->eps, c->theta, c->factor, c->low, c->high, c->partial, c->attn_scale, c->beta_fast,
                   c->beta_slow, c->mscale_all_dim};
    for (size_t i = 0; i < sizeof dv / sizeof *dv; i++) mix_f64(&h, dv[i]);
    for (int64_t l = 0; c->window && l < c->L; l++) mix_i64(&h, c->window[l]);
    return hp_hash64_final(&h);
}

/* 64 bytes at three places of every tensor: enough to tell two checkpoints of the same shapes apart. */
#define WINDOW 64

static hp_status weights_hash(const hp_model *m, const hp_shard_rank_file *rf, uint64_t *out, hp_err *err)
{
    if (rf) {
        const char *id = hp_st_metadata_get(rf->file, "hyperpar_identity");
        *out = str_hash(id ? id : "");
        return HP_OK;
    }
    hp_hash64 h;
    hp_hash64_init(&h, 0);
    const hp_ckpt *ck = m->ckpt;
    size_t n = ck ? hp_ckpt_count(ck) : 0;
    unsigned char buf[WINDOW];
    hp_status st = HP_OK;
    for (size_t i = 0; st == HP_OK && i < n; i++) {
        const hp_ckpt_tensor *ct = hp_ckpt_at(ck, i);
        const hp_st_tensor *t = ct->t;
        mix_str(&h, t->name);
        mix_i64(&h, t->dtype);
        for (int d = 0; d < t->n_dims; d++) mix_i64(&h, t->shape[d]);
        const uint64_t bytes = t->end - t->begin;
        const uint64_t at[3] = {0, bytes / 2, bytes > WINDOW ? bytes - WINDOW : 0};
        for (int k = 0; st == HP_OK && k < 3 && bytes > 0; k++) {
            size_t len = bytes - at[k] < WINDOW ? (size_t)(bytes - at[k]) : WINDOW;
            if ((st = hp_st_read(ct->file, t, at[k], buf, len, err)) == HP_OK) hp_hash64_update(&h, buf, len);
        }
    }
    *out = hp_hash64_final(&h);
    return st;
}

/* Hashes s with the text from `key` up to (not including) the next `until` cut out (to the end if none). */
static void mix_without(hp_hash64 *h, const char *s, const char *key, const char *until)
{
    const char *k = strstr(s, key);
    if (!k) {
        hp_hash64_update(h, s, strlen(s));
        return;
    }
    const char *e = strstr(k, until);
    hp_hash64_update(h, s, (size_t)(k - s));
    if (e) hp_hash64_update(h, e, strlen(e));
}

/* The plan's JSON without the model's "path" (ranks may reach one checkpoint by other paths) and without the
 * "param_roles" (the planner's classification, which a plan file does not carry and the runtime never reads):
 * a plan derived from flags and the same plan read from its file agree. */
static hp_status plan_hash(const hp_plan *p, uint64_t *out, hp_err *err)
{
    hp_buf b = {0};
    hp_status st = hp_plan_to_json(p, &b, err);
    if (st == HP_OK && b.oom) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) {
        const char *s = b.data ? b.data : "";
        const char *roles = strstr(s, "\"param_roles\":");
        char *a = strndup(s, roles ? (size_t)(roles - s) : strlen(s));
        if (!a) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        else {
            hp_hash64 h;
            hp_hash64_init(&h, 0);
            mix_without(&h, a, "\"path\":", "\n"); /* the model's path: one line */
            if (roles) mix_without(&h, roles, "\"param_roles\":", "\n  \""); /* to the next top-level key */
            *out = hp_hash64_final(&h);
        }
        free(a);
    }
    hp_buf_free(&b);
    return st;
}

static hp_status fingerprint_of(const hp_model *m, const hp_plan *p, const hp_run_opts *o, const hp__rcfg *c,
                                const hp_shard_rank_file *rf, fingerprint *f, hp_err *err)
{
    memset(f, 0, sizeof *f);
    hp_mesh_str(&p->mesh, f->mesh, sizeof f->mesh);
    size_t k = strlen(f->mesh);
    if (hp_plan_ep_size(p) > 1 || p->mesh.ep_axis)
        snprintf(f->mesh + k, sizeof f->mesh - k, " with ep=%lld%s", (long long)hp_plan_ep_size(p),
                 p->mesh.ep_axis ? " as an axis" : "");
    f->h[P_MESH] = str_hash(f->mesh);
    f->h[P_SP] = p->sequence_parallel;
    f->h[P_LP] = p->loss_parallel;
    snprintf(f->model, sizeof f->model, "%s, %llu parameters", m->family ? hp_family_name(m->family) : "?",
             (unsigned long long)hp_model_num_params(m));
    f->h[P_MODEL] = model_hash(m, c);
    f->h[P_SOURCE] = rf != NULL;
    snprintf(f->options, sizeof f->options, "--compute %s, --router %s%s%s%s",
             o->compute == HP_LINALG_BF16 ? "bf16" : "exact", o->balanced_router ? "balanced" : "real",
             o->overlap ? ", --overlap" : "", o->record ? ", validate" : "",
             o->sync_collectives ? ", synchronised collectives" : "");
    f->h[P_OPTIONS] = str_hash(f->options) ^ (uint64_t)o->keep_activations;
    hp_status st = weights_hash(m, rf, &f->h[P_WEIGHTS], err);
    if (st == HP_OK) st = plan_hash(p, &f->h[P_PLAN], err);
    return st;
}

static hp_status differ(const fingerprint *a, const fingerprint *z, int r, hp_err *err)
{
    if (a->h[P_MESH] != z->h[P_MESH])
        return hp_err_set(err, HP_ERR_INPUT, "rank %d runs the mesh %s, rank 0 %s; every rank must be given the same "
                          "mesh flags (or plan)", r, a->mesh, z->mesh);
    if (a->h[P_SP] != z->h[P_SP])
        return hp_err_set(err, HP_ERR_INPUT, "rank %d runs with sequence parallelism %s, rank 0 %s; every rank must "
                          "be given the same --no-sequence-parallel (or plan)", r, a->h[P_SP] ? "on" : "off",
                          z->h[P_SP] ? "on" : "off");
    if (a->h[P_LP] != z->h[P_LP])
        return hp_err_set(err, HP_ERR_INPUT, "rank %d runs with loss parallelism %s, rank 0 %s; every rank must be "
                          "given the same --loss-parallel (or plan)", r, a->h[P_LP] ? "on" : "off",
                          z->h[P_LP] ? "on" : "off");
    if (a->h[P_MODEL] != z->h[P_MODEL])
        return hp_err_set(err, HP_ERR_INPUT, "rank %d loaded other weights than rank 0: another model (%s; rank 0: "
                          "%s, or another config.json); every rank must be given the same MODEL", r, a->model,
                          z->model);
    if (a->h[P_SOURCE] != z->h[P_SOURCE])
        return hp_err_set(err, HP_ERR_INPUT, "rank %d reads %s, rank 0 %s; every rank must be given the same MODEL",
                          r, a->h[P_SOURCE] ? "a shard folder" : "a checkpoint",
                          z->h[P_SOURCE] ? "a shard folder" : "a checkpoint");
    if (a->h[P_WEIGHTS] != z->h[P_WEIGHTS])
        return hp_err_set(err, HP_ERR_INPUT, "rank %d loaded other weights than rank 0 (same shapes, other values); "
                          "every rank must be given the same MODEL", r);
    if (a->h[P_PLAN] != z->h[P_PLAN])
        return hp_err_set(err, HP_ERR_INPUT, "rank %d derived another plan than rank 0 (placements, contracts, "
                          "overrides or the EP compute differ); every rank must be given the same plan flags, "
                          "--overrides or --plan", r);
    if (a->h[P_OPTIONS] != z->h[P_OPTIONS])
        return hp_err_set(err, HP_ERR_INPUT, "rank %d was given other options than rank 0 (%s; rank 0: %s); every "
                          "rank must be given the same command", r, a->options, z->options);
    return HP_OK;
}

hp_status hp__run_agree(const hp_comm *world, const hp_model *m, const hp_plan *p, const hp_run_opts *o,
                        const hp__rcfg *c, const hp_shard_rank_file *rf, hp_status local, hp_err *err)
{
    fingerprint mine;
    hp_status st = local;
    if (st == HP_OK) st = fingerprint_of(m, p, o, c, rf, &mine, err);
    st = hp_comm_agree(world, st, err);
    if (st != HP_OK) return st;
    int n = hp_comm_size(world);
    fingerprint *all = calloc((size_t)n, sizeof *all);
    if (!all) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    st = hp_comm_agree(world, st, err);
    if (st == HP_OK) st = hp_comm_allgather(world, &mine, sizeof mine, all, err);
    for (int r = 1; st == HP_OK && r < n; r++)
        if ((st = differ(&all[r], &all[0], r, err)) != HP_OK) hp_comm_diverged(world); /* the same verdict everywhere */
    free(all);
    return st;
}
