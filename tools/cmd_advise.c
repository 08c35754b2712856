/*
 * cmd_advise.c — `hyperpar advise MODEL --world N --mem-per-rank SIZE`: every mesh of N ranks the model
 * accepts, the others rejected with their reason, the accepted ranked by predicted step time (docs/cost.md).
 *
 * One plan is derived, on a template mesh where every axis the model can use is active (tp, cp, and EP over
 * the dense region). Its contracts and placements do not depend on the axis sizes, so each candidate is the
 * template's cost at the candidate's sizes: the dry executor (hp_cost_compute with another mesh) for the
 * communication, activations and FLOPs of rank 0 and the last rank, and the weight bytes from the template's
 * shard layout, tensor by tensor divided by the sizes of the axes that shard it. `hyperpar cost` with the
 * printed flags gives a candidate's figures from its own plan.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "costflags.h"
#include "hyperpar/cost.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"
#include "hyperpar/shard.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: hyperpar advise MODEL --world N --mem-per-rank SIZE [--batch B --seq S] [--mode infer|train]\n"
            "                       [--ranks-per-node R] [--intra-bw G --inter-bw G] [model flags]\n"
            "                       [--overrides F] [--no-sequence-parallel] [--loss-parallel] [--top K]\n"
            "                       [--format text|json|html] [-o FILE]\n"
            "\n"
            "Every mesh of N ranks for MODEL (a checkpoint or a config.json): dp x cp x tp, with expert parallelism\n"
            "for MoE models both over the dense region (TP-extend-EP, --ep) and as its own axis (--ep-axis). A\n"
            "mesh the model or the runtime cannot take is rejected with the reason (tp does not divide the KV\n"
            "heads, ep does not divide the experts, the most-loaded rank needs more than SIZE, tp spans nodes,\n"
            "...); the rest are ranked by predicted step time, then by bytes sent over links. Prints the best K\n"
            "with their per-rank memory and communication, and the commands that make the plan and the shards\n"
            "of the first. Memory: weights exact, activations and state estimated (docs/cost.md).\n"
            "\n"
            "  --world N               ranks in all\n"
            "  --top K                 candidates printed (5)\n"
            "%s",
            cli_cost_model_usage());
}

/* ---- the template: one plan, its tensors grouped by the axes that shard them ---- */

enum { M_TP = 1, M_CP = 2, M_EP = 4 };

typedef struct dimreq { /* a dim some tensor shards: its length must divide by (2x) the axis size */
    int mask;
    int64_t len;
    bool packed;
    const char *name;
} dimreq;

typedef struct tmpl {
    hp_plan *p;
    hp_cost_plan *k;    /* the dry executor's view of p */
    uint64_t bytes[8]; /* global bytes of the tensors sharded on exactly the axes of the mask */
    dimreq req[64];
    int n_req;
} tmpl;

static void add_req(tmpl *t, int mask, int64_t len, bool packed, const char *name)
{
    for (int i = 0; i < t->n_req; i++)
        if (t->req[i].mask == mask && t->req[i].len == len && t->req[i].packed == packed) return;
    if (t->n_req < 64) t->req[t->n_req++] = (dimreq){mask, len, packed, name};
}

static hp_status build_template(tmpl *t, const hp_model *m, const cli_plan_flags *pf, hp_err *err)
{
    const hp_model_config *c = &m->cfg;
    int64_t nkv = c->num_key_value_heads ? c->num_key_value_heads : c->num_attention_heads;
    int64_t tp = c->num_attention_heads % 2 == 0 && nkv % 2 == 0 ? 2 : 1;
    bool moe = m->family && hp_family_is_moe(m->family) && c->n_experts > 1;
    int64_t ep = moe && c->n_experts % 2 == 0 ? 2 : 0;
    hp_plan_opts po = pf->po;
    hp_mesh_from_sizes(&po.mesh, 1, 2, tp, 0, false);
    po.mesh.ep = ep;
    hp_status st = hp_plan_derive(&t->p, m, &po, err);
    if (st != HP_OK) return st;
    hp_shard_layout *l = NULL;
    if ((st = hp_cost_plan_create(&t->k, m, t->p, err)) != HP_OK) return st;
    if ((st = hp_shard_layout_build(&l, m, t->p, err)) != HP_OK) return st;
    for (size_t i = 0; i < l->n_tensors; i++) {
        const hp_shard_tensor *x = &l->tensors[i];
        int mask = 0;
        for (int a = 0; a < HP_AXIS_COUNT; a++) {
            hp_placement pl = x->pl.ax[a];
            if (pl.kind != HP_PL_S && pl.kind != HP_PL_S2) continue;
            int bit = a == HP_AXIS_TP ? M_TP : a == HP_AXIS_CP ? M_CP : M_EP;
            if (bit == M_EP && !(x->ep_size > 1 || l->mesh.ep_axis)) continue;
            mask |= bit;
            int d = pl.dim < 0 ? pl.dim + x->n_dims : pl.dim;
            if (d >= 0 && d < x->n_dims) add_req(t, bit, x->global_shape[d], pl.kind == HP_PL_S2, x->name);
        }
        int64_t nb = 0;
        int64_t n = 1;
        for (int d = 0; d < x->n_dims; d++) n *= x->global_shape[d];
        if (hp_dtype_nbytes(x->dtype, n, &nb)) t->bytes[mask] += (uint64_t)nb;
    }
    hp_shard_layout_free(l);
    return HP_OK;
}

static uint64_t weight_bytes(const tmpl *t, int64_t tp, int64_t cp, int64_t ep)
{
    uint64_t w = 0;
    for (int mask = 0; mask < 8; mask++) {
        uint64_t d = 1;
        if (mask & M_TP) d *= (uint64_t)tp;
        if (mask & M_CP) d *= (uint64_t)cp;
        if (mask & M_EP) d *= (uint64_t)ep;
        w += t->bytes[mask] / d;
    }
    return w;
}

/* ---- candidates ---- */

typedef struct ctx {
    const hp_model *m;
    const tmpl *t;
    const cli_cost_flags *cf;
    const cli_plan_flags *pf;
    const char *model_arg;
    uint64_t budget;
    hp_err *batch_err; /* the first refusal of the batch itself by the dry executor (e.g. past 64 bits), if any */
} ctx;

/* The plan flags that make candidate c. */
static void flags_of(const cli_advise_cand *c, char *buf, size_t cap)
{
    if (c->ep_axis)
        snprintf(buf, cap, "--mesh dp=%lld,cp=%lld,tp=%lld,ep=%lld --ep-axis", (long long)c->dp, (long long)c->cp,
                 (long long)c->tp, (long long)c->ep);
    else if (c->ep > 1)
        snprintf(buf, cap, "--dp %lld --cp %lld --tp %lld --ep %lld", (long long)c->dp, (long long)c->cp,
                 (long long)c->tp, (long long)c->ep);
    else
        snprintf(buf, cap, "--dp %lld --cp %lld --tp %lld", (long long)c->dp, (long long)c->cp, (long long)c->tp);
}

static bool reject(cli_advise_cand *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool reject(cli_advise_cand *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->reason, sizeof c->reason, fmt, ap);
    va_end(ap);
    c->ok = false;
    return false;
}

/* Evaluates candidate c (sizes set): accepted, or rejected with the reason. */
static bool evaluate(const ctx *x, cli_advise_cand *c)
{
    const hp_model *m = x->m;
    const hp_cost_opts *co = &x->cf->co;
    char b[4][32];
    if (c->ep_axis)
        snprintf(c->mesh, sizeof c->mesh, "dp=%lld,cp=%lld,tp=%lld,ep=%lld (ep axis)", (long long)c->dp,
                 (long long)c->cp, (long long)c->tp, (long long)c->ep);
    else
        snprintf(c->mesh, sizeof c->mesh, c->ep > 1 ? "dp=%lld,cp=%lld,tp=%lld ep=%lld (TP-extend)" : "dp=%lld,cp=%lld,tp=%lld",
                 (long long)c->dp, (long long)c->cp, (long long)c->tp, (long long)c->ep);
    hp_err err;
    int64_t rpn = co->mdl.ranks_per_node;
    if (hp_plan_check_compat(m, c->tp, c->cp, c->ep, co->S, &err) != HP_OK) return reject(c, "%s", err.msg);
    if (c->ep_axis && c->tp > 1)
        return reject(c, "an explicit ep axis with tp=%lld: the runtime runs whole experts per rank (experts would "
                      "be sharded over tp); use TP-extend-EP (--ep) or tp=1", (long long)c->tp);
    bool moe = m->family && hp_family_is_moe(m->family) && m->cfg.n_experts > 1;
    if (moe && c->tp > 1 && c->ep < 2)
        return reject(c, "tp=%lld without expert parallelism would shard the experts over tp; the runtime runs "
                      "whole experts per rank (add --ep)", (long long)c->tp);
    if (co->B < c->dp)
        return reject(c, "dp=%lld replicas but the batch has %lld rows", (long long)c->dp, (long long)co->B);
    if (rpn > 0 && (c->tp > rpn || rpn % c->tp))
        return reject(c, "tp=%lld does not fit inside a node of %lld ranks (TP stays inside a node)", (long long)c->tp,
                      (long long)rpn);
    for (int i = 0; i < x->t->n_req; i++) {
        const dimreq *r = &x->t->req[i];
        int64_t size = r->mask == M_TP ? c->tp : r->mask == M_CP ? c->cp : c->ep, parts = r->packed ? 2 * size : size;
        if (size > 1 && r->len % parts)
            return reject(c, "'%s' has a dim of %lld that does not split into %s%s=%lld", r->name, (long long)r->len,
                          r->packed ? "2 x " : "", r->mask == M_TP ? "tp" : r->mask == M_CP ? "cp" : "ep",
                          (long long)size);
    }
    hp_mesh mesh;
    hp_mesh_from_sizes(&mesh, c->dp, c->cp, c->tp, c->ep_axis ? c->ep : 0, c->ep_axis);
    if (!c->ep_axis) mesh.ep = c->ep > 1 ? c->ep : 0;
    hp_cost_opts o = *co;
    int64_t world = hp_mesh_world(&mesh), ranks[2] = {0, world - 1};
    o.mesh = &mesh;
    o.ranks = ranks;
    o.n_ranks = world > 1 ? 2 : 1;
    o.weights_given = true;
    o.weight_bytes = weight_bytes(x->t, c->tp, c->cp, c->ep_axis || c->ep > 1 ? c->ep : 1);
    hp_cost *k = NULL;
    if (hp_cost_eval(&k, x->t->k, &o, &err) != HP_OK) {
        if (err.status == HP_ERR_INPUT && x->batch_err->status == HP_OK) *x->batch_err = err;
        return reject(c, "%s", err.msg);
    }
    if (k->refused[0]) {
        reject(c, "%s", k->refused);
        hp_cost_free(k);
        return false;
    }
    const hp_cost_rank *r = &k->ranks[k->max_rank];
    c->max_bytes = r->total_bytes;
    c->weight_bytes = r->weight_bytes;
    c->act_bytes = r->act_bytes;
    c->state_bytes = k->train ? r->grad_bytes + r->optim_bytes + r->master_bytes + r->saved_bytes : r->kv_bytes;
    if (!k->train) c->max_bytes += r->kv_bytes; /* serving: the KV cache of the batch counts against the budget */
    c->net_bytes = 0;
    c->t_step = c->t_compute = c->t_comm = 0;
    for (int64_t i = 0; i < k->n_ranks; i++) {
        const hp_cost_rank *q = &k->ranks[i];
        if (q->net_bytes > c->net_bytes) c->net_bytes = q->net_bytes;
        if (q->t_step > c->t_step) c->t_step = q->t_step, c->t_compute = q->t_compute, c->t_comm = q->t_comm;
    }
    hp_cost_free(k);
    char fl[200];
    flags_of(c, fl, sizeof fl);
    snprintf(c->command, sizeof c->command, "hyperpar plan %s %s%s%s -o plan.json && hyperpar shard %s --plan plan.json "
             "--out shards", x->model_arg, fl, x->pf->overrides ? " --overrides " : "",
             x->pf->overrides ? x->pf->overrides : "", x->model_arg);
    if (x->budget && c->max_bytes > x->budget)
        return reject(c, "the most-loaded rank needs %s of %s (weights %s + activations %s + %s %s)",
                      hp_format_bytes(c->max_bytes, b[0], 32), hp_format_bytes(x->budget, b[1], 32),
                      hp_format_bytes(c->weight_bytes, b[2], 32), hp_format_bytes(c->act_bytes, b[3], 32),
                      co->train ? "training state" : "KV cache", hp_format_bytes(c->state_bytes, b[0] + 16, 16));
    c->ok = true;
    return true;
}

static int by_time(const void *a, const void *b)
{
    const cli_advise_cand *x = a, *y = b;
    if (x->ok != y->ok) return x->ok ? -1 : 1;
    if (!x->ok) { /* rejected: the nearest misses (evaluated, least memory) first, then the rest as found */
        if ((x->max_bytes > 0) != (y->max_bytes > 0)) return x->max_bytes > 0 ? -1 : 1;
        return x->max_bytes < y->max_bytes ? -1 : x->max_bytes > y->max_bytes;
    }
    double hi = x->t_step > y->t_step ? x->t_step : y->t_step; /* within 1%: a tie, decided by bytes, memory */
    if (fabs(x->t_step - y->t_step) > 0.01 * hi) return x->t_step < y->t_step ? -1 : 1;
    if (x->net_bytes != y->net_bytes) return x->net_bytes < y->net_bytes ? -1 : 1;
    return x->max_bytes < y->max_bytes ? -1 : x->max_bytes > y->max_bytes;
}

/* The divisors of N, ascending, into d (room for 2·sqrt(N) + 2); their count. */
static int divisors(int64_t N, int64_t *d)
{
    int n = 0, m = 0;
    int64_t hi[2100];
    for (int64_t e = 1; e * e <= N; e++)
        if (N % e == 0) {
            d[n++] = e;
            if (e != N / e) hi[m++] = N / e;
        }
    while (m > 0) d[n++] = hi[--m];
    return n;
}

/* Every (dp, cp, tp[, ep]) of N ranks, evaluated; *out sorted best first, rejected last. */
static hp_status enumerate(const ctx *x, int64_t N, cli_advise_cand **out, int *n_out, hp_err *err)
{
    const hp_model_config *mc = &x->m->cfg;
    bool moe = x->m->family && hp_family_is_moe(x->m->family) && mc->n_experts > 1;
    int cap = 64, n = 0;
    cli_advise_cand *v = malloc((size_t)cap * sizeof *v);
    if (!v) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int64_t dv[2100];
    int nd = divisors(N, dv);
    for (int i = 0; i < nd; i++) {
        int64_t tp = dv[i];
        for (int j = 0; j < nd; j++) {
            int64_t cp = dv[j];
            if ((N / tp) % cp) continue;
            int64_t rest = N / tp / cp; /* dp, or dp x ep on its own axis */
            for (int q = 0; q < (moe ? nd : 1); q++) {
                int64_t e = dv[q];
                for (int axis = 0; axis < 2; axis++) {
                    cli_advise_cand c = {.cp = cp, .tp = tp, .ep = e, .ep_axis = axis == 1};
                    if (axis == 0) { /* ep = 1, or TP-extend-EP over the whole dense region */
                        if (N % e) continue;
                        c.dp = rest;
                    } else {
                        if (e < 2 || rest % e) continue;
                        c.dp = rest / e;
                    }
                    if (n == cap) {
                        cap *= 2;
                        cli_advise_cand *nv = realloc(v, (size_t)cap * sizeof *nv);
                        if (!nv) {
                            free(v);
                            return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
                        }
                        v = nv;
                    }
                    evaluate(x, &c);
                    v[n++] = c;
                }
            }
        }
    }
    qsort(v, (size_t)n, sizeof *v, by_time);
    *out = v;
    *n_out = n;
    return HP_OK;
}

/* ---- output ---- */

static void print_text(FILE *o, const ctx *x, const cli_advise_cand *v, int n, int top, int64_t N, double secs)
{
    char b[6][32];
    int ok = 0;
    for (int i = 0; i < n; i++) ok += v[i].ok;
    const hp_cost_opts *co = &x->cf->co;
    fprintf(o, "model    %s (%s)\nworld    %lld ranks, %s per rank; batch %lld x %lld (%s)", x->m->path,
            x->m->model_type[0] ? x->m->model_type : "?", (long long)N, hp_format_bytes(x->budget, b[0], 32),
            (long long)co->B, (long long)co->S, co->train ? "training" : "inference");
    if (co->mdl.ranks_per_node) fprintf(o, "; %lld ranks per node", (long long)co->mdl.ranks_per_node);
    fprintf(o, "\n");
    fprintf(o, "meshes   %d considered, %d accepted, %d rejected (%.3f s, %.2f ms per mesh)\n\n", n, ok, n - ok, secs,
            n ? secs * 1e3 / n : 0.0);
    if (ok) {
        fprintf(o, "best first (predicted step time*; within 1%%, fewer bytes over links, then less memory; memory of the most-loaded rank):\n");
        fprintf(o, "  %-4s %-40s %11s %11s %11s %11s %12s %10s\n", "#", "mesh", "memory", "weights", "activ.*",
                co->train ? "state*" : "KV cache*", "links/step", "step*");
        for (int i = 0; i < ok && i < top; i++) {
            const cli_advise_cand *c = &v[i];
            char ts[24];
            fprintf(o, "  %-4d %-40s %11s %11s %11s %11s %12s %10s\n", i + 1, c->mesh,
                    hp_format_bytes(c->max_bytes, b[0], 32), hp_format_bytes(c->weight_bytes, b[1], 32),
                    hp_format_bytes(c->act_bytes, b[2], 32), hp_format_bytes(c->state_bytes, b[3], 32),
                    hp_format_bytes(c->net_bytes, b[4], 32), cli_seconds(c->t_step, ts, sizeof ts));
        }
        fprintf(o, "\nmake the plan and the shards of #1:\n  %s\n", v[0].command);
        char fl[200];
        flags_of(&v[0], fl, sizeof fl);
        fprintf(o, "its own plan's figures: hyperpar cost %s %s --batch %lld --seq %lld%s%s%s\n", x->model_arg, fl,
                (long long)co->B, (long long)co->S, co->train ? " --mode train" : "",
                x->pf->overrides ? " --overrides " : "", x->pf->overrides ? x->pf->overrides : "");
    } else {
        fprintf(o, "no mesh of %lld ranks fits; the reasons follow\n", (long long)N);
    }
    int shown = 0;
    if (n - ok) fprintf(o, "\nrejected (first %d of %d):\n", n - ok < 12 ? n - ok : 12, n - ok);
    for (int i = ok; i < n && shown < 12; i++, shown++) fprintf(o, "  %-40s %s\n", v[i].mesh, v[i].reason);
    fprintf(o, "\n* estimate, from the model stated in docs/cost.md; weights are exact. Each candidate is the\n"
               "  template plan's cost at its sizes; 'hyperpar cost' with its flags gives its own plan's figures.\n");
}

static void print_json(FILE *o, const ctx *x, const cli_advise_cand *v, int n, int64_t N, double secs)
{
    fprintf(o, "{\"model_path\": ");
    cli_json_fstr(o, x->m->path);
    fprintf(o, ", \"world\": %lld, \"mem_per_rank\": %llu, \"batch\": %lld, \"seq\": %lld, \"mode\": \"%s\", "
               "\"seconds\": %.17g, \"candidates\": [",
            (long long)N, (unsigned long long)x->budget, (long long)x->cf->co.B, (long long)x->cf->co.S,
            x->cf->co.train ? "train" : "infer", secs);
    for (int i = 0; i < n; i++) {
        const cli_advise_cand *c = &v[i];
        fprintf(o, "%s\n  {\"mesh\": ", i ? "," : "");
        cli_json_fstr(o, c->mesh);
        fprintf(o, ", \"dp\": %lld, \"cp\": %lld, \"tp\": %lld, \"ep\": %lld, \"ep_axis\": %s, \"ok\": %s",
                (long long)c->dp, (long long)c->cp, (long long)c->tp, (long long)c->ep, c->ep_axis ? "true" : "false",
                c->ok ? "true" : "false");
        if (c->ok || c->max_bytes) {
            fprintf(o, ", \"max_bytes\": %llu, \"weight_bytes\": %llu, \"activation_bytes\": %llu, \"state_bytes\": "
                       "%llu, \"net_bytes\": %llu, \"t_step\": %.17g, \"t_compute\": %.17g, \"t_comm\": %.17g",
                    (unsigned long long)c->max_bytes, (unsigned long long)c->weight_bytes,
                    (unsigned long long)c->act_bytes, (unsigned long long)c->state_bytes,
                    (unsigned long long)c->net_bytes, c->t_step, c->t_compute, c->t_comm);
        }
        if (c->ok) {
            fprintf(o, ", \"command\": ");
            cli_json_fstr(o, c->command);
        } else {
            fprintf(o, ", \"reason\": ");
            cli_json_fstr(o, c->reason);
        }
        fprintf(o, "}");
    }
    fprintf(o, "\n]}\n");
}

/* ---- the command ---- */

static int cli_advise_run(const char *model_arg, cli_plan_flags *pf, cli_cost_flags *cf, int64_t N, int top, double *per_mesh,
                   double *plan_s, bool quiet)
{
    hp_err err;
    hp_model *m = NULL;
    hp_overrides *ov = NULL;
    tmpl t = {0};
    cli_advise_cand *v = NULL;
    int n = 0;
    hp_status st = cli_plan_flags_apply(pf, NULL, &ov, &err);
    if (st == HP_OK) st = hp_model_open(&m, model_arg, NULL, &err);
    if (st == HP_OK && !quiet) st = cli_cost_measure(cf, m, &err);
    struct timespec a, b, c2;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (st == HP_OK) st = build_template(&t, m, pf, &err);
    clock_gettime(CLOCK_MONOTONIC, &b);
    hp_err batch_err = {.status = HP_OK};
    ctx x = {.m = m, .t = &t, .cf = cf, .pf = pf, .model_arg = model_arg, .budget = cf->budget, .batch_err = &batch_err};
    if (st == HP_OK) st = enumerate(&x, N, &v, &n, &err);
    clock_gettime(CLOCK_MONOTONIC, &c2);
    double secs = (double)(c2.tv_sec - b.tv_sec) + (double)(c2.tv_nsec - b.tv_nsec) * 1e-9;
    if (per_mesh) *per_mesh = n ? secs / n : 0;
    if (plan_s) *plan_s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    int rc = HP_EXIT_OK;
    if (st != HP_OK) rc = cli_fail(&err);
    else if (!quiet) {
        char *buf = NULL, title[400];
        size_t len = 0;
        FILE *o = open_memstream(&buf, &len);
        if (!o) rc = HP_EXIT_RUNTIME;
        else {
            snprintf(title, sizeof title, "%s on %lld ranks", m->path, (long long)N);
            if (cf->format == 1) print_json(o, &x, v, n, N, secs);
            else if (cf->format == 2) rc = cli_html_advise(o, title, v, n, cf->budget) == 0 ? HP_EXIT_OK : HP_EXIT_RUNTIME;
            else print_text(o, &x, v, n, top, N, secs);
            fclose(o);
            if (rc == HP_EXIT_OK) rc = cli_write_atomic(cf->output, buf, len, "the advice");
            free(buf);
        }
        int ok = 0;
        for (int i = 0; i < n; i++) ok += v[i].ok;
        if (rc == HP_EXIT_OK && !ok && batch_err.status != HP_OK && !(n && v[0].max_bytes)) {
            /* no mesh got figures, and the batch itself was refused: that is the cause */
            rc = cli_fail(&batch_err);
        } else if (rc == HP_EXIT_OK && !ok) { /* the report lists every reason; the request as given cannot be met */
            char fb[32];
            hp_err_set(&err, HP_ERR_INPUT, "no mesh of %lld ranks fits in %s per rank (all %d rejected%s%s); give more "
                       "memory per rank (--mem-per-rank), another --world, or a smaller --batch / --seq",
                       (long long)N, hp_format_bytes(cf->budget, fb, sizeof fb), n, n ? "; the nearest: " : "",
                       n ? v[0].reason : "");
            rc = cli_fail(&err);
        }
    }
    free(v);
    hp_cost_plan_free(t.k);
    hp_plan_free(t.p);
    hp_model_close(m);
    hp_overrides_free(ov);
    return rc;
}

/* --ranks-per-node R must tile the world in whole nodes (R divides N), or hold it all (R >= N). */
static bool rpn_divides(const char *cmd, int64_t rpn, int64_t N)
{
    if (rpn <= 0 || rpn >= N || N % rpn == 0) return true;
    cli_usage_error(cmd, "--ranks-per-node %lld does not divide --world %lld (the last node would hold %lld ranks); "
                    "give a divisor of %lld, or %lld or more for one node", (long long)rpn, (long long)N,
                    (long long)(N % rpn), (long long)N, (long long)N);
    return false;
}

int cmd_advise(int argc, char **argv)
{
    enum { O_WORLD = 1000, O_TOP };
    static const struct option opts[] = {
        CLI_OPT_PLAN, CLI_OPT_COST, {"world", required_argument, NULL, O_WORLD}, {"top", required_argument, NULL, O_TOP},
        {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    cli_plan_flags pf;
    cli_plan_flags_init(&pf);
    cli_cost_flags cf;
    cli_cost_flags_init(&cf);
    int64_t N = 0, top = 5;
    int c;
    optind = 1;
    cli_seen seen = {0};
    while ((c = cli_getopt(&seen, "advise", argc, argv, "ho:", opts)) != -1) {
        int pr = cli_plan_flag("advise", c, optarg, &pf);
        if (pr == 0) pr = cli_cost_flag("advise", c == 'o' ? CLI_O_OUT : c, optarg, &cf);
        if (pr < 0) return HP_EXIT_USAGE;
        if (pr > 0) continue;
        switch (c) {
        case O_WORLD:
            if (!cli_parse_i64("advise", "--world", optarg, 1, 1 << 20, &N)) return HP_EXIT_USAGE;
            break;
        case O_TOP:
            if (!cli_parse_i64("advise", "--top", optarg, 1, 1000, &top)) return HP_EXIT_USAGE;
            break;
        case 'h': usage(stdout); return HP_EXIT_OK;
        default: return cli_bad_option("advise", argv);
        }
    }
    if (optind != argc - 1) return cli_usage_error("advise", "expected exactly one MODEL");
    if (N < 1) return cli_usage_error("advise", "missing --world N (the number of ranks)");
    if (!cf.budget) return cli_usage_error("advise", "missing --mem-per-rank SIZE (e.g. 80GB)");
    if (!rpn_divides("advise", cf.co.mdl.ranks_per_node, N)) return HP_EXIT_USAGE;
    const char *const inputs[] = {pf.overrides};
    if (cf.output && cli_check_output_file("advise", "--output", cf.output, argv[optind], inputs, 1) != 0)
        return HP_EXIT_USAGE;
    return cli_advise_run(argv[optind], &pf, &cf, N, (int)top, NULL, NULL, false);
}

/* `hyperpar bench advise MODEL --world N [advise flags]`: the time advise takes per mesh against one plan
 * derivation of the same model in the same run (the template's). */
int cmd_bench_advise(int argc, char **argv)
{
    enum { O_WORLD = 1000, O_REPS };
    static const struct option opts[] = {
        CLI_OPT_PLAN, CLI_OPT_COST, {"world", required_argument, NULL, O_WORLD}, {"reps", required_argument, NULL, O_REPS},
        {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    cli_plan_flags pf;
    cli_plan_flags_init(&pf);
    cli_cost_flags cf;
    cli_cost_flags_init(&cf);
    int64_t N = 0, reps = 3;
    int c;
    optind = 1;
    cli_seen seen = {0};
    while ((c = cli_getopt(&seen, "bench advise", argc, argv, "h", opts)) != -1) {
        int pr = cli_plan_flag("bench advise", c, optarg, &pf);
        if (pr == 0) pr = cli_cost_flag("bench advise", c, optarg, &cf);
        if (pr < 0) return HP_EXIT_USAGE;
        if (pr > 0) continue;
        switch (c) {
        case O_WORLD:
            if (!cli_parse_i64("bench advise", "--world", optarg, 1, 1 << 20, &N)) return HP_EXIT_USAGE;
            break;
        case O_REPS:
            if (!cli_parse_i64("bench advise", "--reps", optarg, 1, 100, &reps)) return HP_EXIT_USAGE;
            break;
        case 'h':
            printf("usage: hyperpar bench advise MODEL --world N [--reps R] [advise flags]\n\n"
                   "Times 'hyperpar advise' over every mesh of N ranks (the best of R runs) against one plan\n"
                   "derivation of MODEL in the same run, and prints both and their ratio.\n");
            return HP_EXIT_OK;
        default: return cli_bad_option("bench advise", argv);
        }
    }
    if (optind != argc - 1) return cli_usage_error("bench advise", "expected exactly one MODEL");
    if (N < 1) return cli_usage_error("bench advise", "missing --world N");
    if (!rpn_divides("bench advise", cf.co.mdl.ranks_per_node, N)) return HP_EXIT_USAGE;
    if (!cf.budget) cf.budget = UINT64_MAX / 2;
    double best_mesh = 0, best_plan = 0;
    for (int64_t i = 0; i < reps; i++) {
        double per = 0, plan = 0;
        int rc = cli_advise_run(argv[optind], &pf, &cf, N, 1, &per, &plan, true);
        if (rc != HP_EXIT_OK) return rc;
        if (!i || per < best_mesh) best_mesh = per;
        if (!i || plan < best_plan) best_plan = plan;
    }
    printf("bench advise: %s, world %lld, batch %lld x %lld\n", argv[optind], (long long)N, (long long)cf.co.B,
           (long long)cf.co.S);
    printf("  one plan (the template, with its shard layout): %9.3f ms\n", best_plan * 1e3);
    printf("  advise, per mesh:                               %9.3f ms   (%.4f of one plan; best of %lld)\n", best_mesh * 1e3,
           best_plan > 0 ? best_mesh / best_plan : 0.0, (long long)reps);
    return HP_EXIT_OK;
}
