/*
 * api.c — the JSON-in interface (include/hyperpar/api.h): a request names a command, a model and its options;
 * the reply is the text the CLI prints. Everything here is reading the request: the work and the writing are the
 * library's own functions, the ones the CLI calls, so the two give the same bytes.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/api.h"
#include "hyperpar/cost.h"
#include "hyperpar/model.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"
#include "hyperpar/report.h"
#include "hyperpar/shard.h"

#define REQ_MAX_TENSORS 1000000

typedef struct req {
    json_t *root;
    const char *command;
} req;

static hp_status bad(hp_err *err, const char *fmt, const char *what)
{
    return hp_err_set(err, HP_ERR_INPUT, fmt, what);
}

/* A mesh size: an integer in [1, HP_MESH_MAX_SIZE], refused as the CLI refuses --tp, --dp, --cp, --ep. */
static hp_status size_of(json_t *v, const char *name, int64_t *out, hp_err *err)
{
    if (json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= HP_MESH_MAX_SIZE) {
        *out = (int64_t)json_integer_value(v);
        return HP_OK;
    }
    char *shown = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    hp_status st = hp_err_set(err, HP_ERR_INPUT, "--%s expects an integer in [1, %lld]%s, got '%s'", name,
                              (long long)HP_MESH_MAX_SIZE, json_is_integer(v) ? "" : " written as plain digits",
                              shown ? shown : "?");
    free(shown);
    return st;
}

static bool flag(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return v && json_is_true(v);
}

static hp_status check_keys(json_t *o, const char *what, const char *const *known, hp_err *err)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        bool ok = false;
        for (const char *const *q = known; *q && !ok; q++) ok = !strcmp(k, *q);
        if (!ok) {
            char list[512] = "";
            for (const char *const *q = known; *q; q++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", q == known ? "" : ", ", *q);
            return hp_err_set(err, HP_ERR_INPUT, "%s: unknown option '%s'; known: %s", what, k, list);
        }
    }
    return HP_OK;
}

/* ---- the model ---- */

static hp_status open_model(json_t *src, hp_model **m, hp_err *err)
{
    static const char *const known[] = {"path", "config", "tensors", "expert_layout", "label", NULL};
    if (!json_is_object(src)) return bad(err, "the request's %s must be an object: {\"path\": ...} or {\"config\": ...}", "model");
    hp_status st = check_keys(src, "model", known, err);
    if (st != HP_OK) return st;
    hp_model_opts mo = {.layout = HP_LAYOUT_PER_EXPERT};
    json_t *lay = json_object_get(src, "expert_layout");
    if (lay && (!json_is_string(lay) || !hp_expert_layout_parse(json_string_value(lay), &mo.layout)))
        return bad(err, "%s must be per-expert or batched", "expert_layout");
    json_t *path = json_object_get(src, "path"), *cfg = json_object_get(src, "config");
    json_t *tensors = json_object_get(src, "tensors");
    if (path) {
        if (!json_is_string(path) || cfg || tensors)
            return bad(err, "the model's %s is a string, given alone (not with config or tensors)", "path");
        return hp_model_open(m, json_string_value(path), &mo, err);
    }
    if (!json_is_object(cfg)) return bad(err, "the model needs a %s (an object) or a path", "config");
    json_t *label_v = json_object_get(src, "label");
    const char *label = json_is_string(label_v) ? json_string_value(label_v) : "config";
    char *text = json_dumps(cfg, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (!tensors) {
        st = hp_model_from_config_text(m, text, strlen(text), label, &mo, err);
        free(text);
        return st;
    }
    size_t n = json_array_size(tensors);
    if (!json_is_array(tensors) || n > REQ_MAX_TENSORS) {
        free(text);
        return bad(err, "the model's %s must be an array of {name, shape, dtype}", "tensors");
    }
    hp_tensor_desc *t = calloc(n ? n : 1, sizeof *t);
    if (!t) {
        free(text);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n && st == HP_OK; i++) {
        json_t *e = json_array_get(tensors, i), *nm = json_object_get(e, "name"), *sh = json_object_get(e, "shape");
        json_t *dt = json_object_get(e, "dtype"), *tr = json_object_get(e, "trainable");
        if (!json_is_string(nm) || !json_is_array(sh) || json_array_size(sh) > HP_MAX_DIMS || !json_is_string(dt) ||
            !hp_dtype_parse(json_string_value(dt), &t[i].dtype)) {
            st = hp_err_set(err, HP_ERR_INPUT, "model tensor %zu: needs a name, a shape of at most %d sizes and a "
                            "safetensors dtype (F32, BF16, ...)", i, HP_MAX_DIMS);
            break;
        }
        t[i].name = json_string_value(nm);
        t[i].n_dims = (int)json_array_size(sh);
        t[i].trainable = !tr || json_is_true(tr);
        for (int d = 0; d < t[i].n_dims; d++) {
            json_t *v = json_array_get(sh, (size_t)d);
            if (!json_is_integer(v) || json_integer_value(v) < 0) {
                st = hp_err_set(err, HP_ERR_INPUT, "model tensor '%s': shape sizes are integers >= 0", t[i].name);
                break;
            }
            t[i].shape[d] = (int64_t)json_integer_value(v);
        }
    }
    if (st == HP_OK) st = hp_model_from_tensors(m, text, strlen(text), label, t, n, err);
    free(t);
    free(text);
    return st;
}

/* ---- plan options (the CLI's plan flags) ---- */

typedef struct plan_req {
    hp_plan_opts po;
    hp_overrides *ov;
    json_t *freeze;
} plan_req;

static hp_status plan_options(json_t *o, plan_req *r, hp_err *err)
{
    static const char *const known[] = {"mesh", "ep", "ep_axis", "sequence_parallel", "loss_parallel", "overrides",
                                        "overrides_text", "ep_compute", "freeze", "allow_uncovered", "packed_fused",
                                        NULL};
    hp_plan_opts_default(&r->po);
    r->ov = NULL;
    r->freeze = NULL;
    if (o && !json_is_object(o)) return bad(err, "the request's %s must be an object", "options");
    hp_status st = o ? check_keys(o, "options", known, err) : HP_OK; /* none given: the defaults */
    if (st != HP_OK) return st;
    int64_t dp = 1, cp = 1, tp = 1, ep = 1;
    bool ep_axis = flag(o, "ep_axis");
    json_t *v = json_object_get(o, "ep");
    if (v && (st = size_of(v, "ep", &ep, err)) != HP_OK) return st;
    json_t *mesh = json_object_get(o, "mesh");
    if (json_is_string(mesh)) {
        if ((st = hp_mesh_parse(json_string_value(mesh), &r->po.mesh, err)) != HP_OK) return st;
        if (r->po.mesh.ep_axis) {
            if (ep > 1 && ep != r->po.mesh.ep)
                return hp_err_set(err, HP_ERR_INPUT, "--ep %lld disagrees with the mesh's ep axis (%lld)",
                                  (long long)ep, (long long)r->po.mesh.ep);
        } else if (ep_axis) {
            return bad(err, "--ep-axis needs an ep axis in --mesh (e.g. --mesh tp=2,ep=2)%s", "");
        } else {
            r->po.mesh.ep = ep;
        }
    } else if (json_is_object(mesh)) {
        const char *k;
        json_object_foreach(mesh, k, v) {
            int64_t *dst = !strcmp(k, "dp") ? &dp : !strcmp(k, "cp") ? &cp : !strcmp(k, "tp") ? &tp
                           : !strcmp(k, "ep") ? &ep : NULL;
            if (!dst) return bad(err, "mesh axis '%s' is not one of dp, cp, tp, ep", k);
            if ((st = size_of(v, k, dst, err)) != HP_OK) return st;
        }
        hp_mesh_from_sizes(&r->po.mesh, dp, cp, tp, ep, ep_axis);
    } else if (mesh && !json_is_null(mesh)) {
        return bad(err, "the %s is an object such as {\"tp\": 2, \"ep\": 2} or a string \"dp=2,tp=2\"", "mesh");
    } else {
        hp_mesh_from_sizes(&r->po.mesh, dp, cp, tp, ep, ep_axis);
    }
    if ((st = hp_mesh_check(&r->po.mesh, err)) != HP_OK) return st;
    v = json_object_get(o, "sequence_parallel");
    if (v) r->po.sequence_parallel = json_is_true(v);
    r->po.loss_parallel = flag(o, "loss_parallel");
    r->po.allow_uncovered = flag(o, "allow_uncovered");
    r->po.packed_fused = flag(o, "packed_fused");
    v = json_object_get(o, "ep_compute");
    if (v && (!json_is_string(v) || !json_string_value(v)[0]))
        return bad(err, "%s needs suggested or an archetype", "ep_compute");
    if (v) r->po.ep_compute = json_string_value(v);
    json_t *ovp = json_object_get(o, "overrides"), *ovt = json_object_get(o, "overrides_text");
    if (ovp && (!json_is_string(ovp) || !json_string_value(ovp)[0]))
        return bad(err, "%s needs a file name", "overrides");
    if (ovp) st = hp_overrides_load(&r->ov, json_string_value(ovp), err);
    else if (json_is_string(ovt))
        st = hp_overrides_parse(&r->ov, json_string_value(ovt), strlen(json_string_value(ovt)), "overrides", err);
    if (st != HP_OK) return st;
    r->po.overrides = r->ov;
    r->freeze = json_object_get(o, "freeze");
    if (r->freeze && !json_is_array(r->freeze)) return bad(err, "%s is a list of globs", "freeze");
    size_t i;
    json_array_foreach(r->freeze, i, v) {
        size_t at = 0;
        const char *why = NULL;
        if (!json_is_string(v) || !hp_glob_valid(json_string_value(v), &at, &why))
            return bad(err, "freeze pattern %s is not a valid glob", json_is_string(v) ? json_string_value(v) : "?");
    }
    return HP_OK;
}

static void freeze_model(const plan_req *r, hp_model *m)
{
    size_t i;
    json_t *v;
    json_array_foreach(r->freeze, i, v) hp_model_freeze(m, json_string_value(v));
}

/* ---- commands ---- */

static hp_status do_plan(json_t *q, hp_model *m, plan_req *r, hp_buf *out, hp_err *err)
{
    json_t *fv = json_object_get(q, "format"), *fq = json_object_get(q, "fqn");
    const char *format = json_is_string(fv) ? json_string_value(fv) : "json";
    if (strcmp(format, "json") && strcmp(format, "explain") && strcmp(format, "hf"))
        return bad(err, "--format must be json, explain or hf, got '%s'", format);
    json_t *hv = json_object_get(q, "hf_version");
    if (hv && !json_is_null(hv) && !json_is_string(hv)) return bad(err, "%s is a string such as \"5.25\"", "hf_version");
    hp_plan *p = NULL;
    hp_status st = hp_plan_derive(&p, m, &r->po, err);
    if (st != HP_OK) return st;
    if (!strcmp(format, "json")) st = hp_plan_to_json(p, out, err);
    else if (!strcmp(format, "explain")) st = hp_plan_explain(p, json_is_string(fq) ? json_string_value(fq) : NULL, out, err);
    else st = hp_plan_to_hf_target(p, json_is_string(hv) ? json_string_value(hv) : NULL, out, err);
    hp_plan_free(p);
    return st;
}

/* ---- cost and advise: the settings by the CLI's names, and the command line their reports quote ---- */

typedef struct argv_buf {
    char *v[256];
    int n;
} argv_buf;

static void arg_push(argv_buf *a, const char *s)
{
    if (a->n < (int)(sizeof a->v / sizeof *a->v) - 1) a->v[a->n++] = strdup(s);
}

static void arg_free(argv_buf *a)
{
    for (int i = 0; i < a->n; i++) free(a->v[i]);
}

/* The CLI command line equivalent to the request (the fit's changes quote it). */
static void request_argv(argv_buf *a, const char *cmd, json_t *model, const plan_req *r, json_t *opts)
{
    char b[64];
    arg_push(a, cmd);
    json_t *path = json_object_get(model, "path");
    arg_push(a, json_is_string(path) ? json_string_value(path) : "MODEL");
    const hp_mesh *m = &r->po.mesh;
    if (m->ep_axis || hp_mesh_size(m, "pp") > 1) {
        arg_push(a, "--mesh");
        arg_push(a, hp_mesh_str(m, b, sizeof b));
        if (m->ep_axis) arg_push(a, "--ep-axis");
    } else {
        static const char *const axes[] = {"dp", "cp", "tp"};
        for (int i = 0; i < 3; i++)
            if (hp_mesh_size(m, axes[i]) > 1) {
                snprintf(b, sizeof b, "--%s", axes[i]);
                arg_push(a, b);
                snprintf(b, sizeof b, "%lld", (long long)hp_mesh_size(m, axes[i]));
                arg_push(a, b);
            }
        if (m->ep > 1) {
            arg_push(a, "--ep");
            snprintf(b, sizeof b, "%lld", (long long)m->ep);
            arg_push(a, b);
        }
    }
    const char *k;
    json_t *v;
    json_object_foreach(opts, k, v) {
        snprintf(b, sizeof b, "--%s", k);
        arg_push(a, b);
        if (json_is_string(v)) arg_push(a, json_string_value(v));
        else if (json_is_integer(v)) snprintf(b, sizeof b, "%lld", (long long)json_integer_value(v)), arg_push(a, b);
        else if (json_is_real(v)) snprintf(b, sizeof b, "%.17g", json_real_value(v)), arg_push(a, b);
    }
}

/* The "cost" object: {name: value} with the CLI's long names (hp_cost_setting); true for a flag. */
static hp_status cost_settings(json_t *o, hp_cost_settings *s, hp_err *err)
{
    hp_cost_settings_init(s);
    if (o && !json_is_object(o)) return bad(err, "the request's %s must be an object of settings", "cost");
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        char val[64];
        if (json_is_string(v)) snprintf(val, sizeof val, "%s", json_string_value(v));
        else if (json_is_integer(v)) snprintf(val, sizeof val, "%lld", (long long)json_integer_value(v));
        else if (json_is_real(v)) snprintf(val, sizeof val, "%.17g", json_real_value(v));
        else if (json_is_true(v)) val[0] = '\0';
        else if (json_is_false(v) || json_is_null(v)) continue;
        else return bad(err, "cost setting '%s' must be a string, a number or true", k);
        if (json_is_string(v) && strlen(json_string_value(v)) >= sizeof val)
            return bad(err, "cost setting '%s' is too long", k);
        if (!strcmp(k, "measure-gemm"))
            return bad(err, "%s measures the GEMM rate with the CLI (hyperpar cost --measure-gemm); give gemm-gflops",
                       "measure-gemm");
        bool taken = false;
        hp_status st = hp_cost_setting(s, k, val, &taken, err);
        if (st != HP_OK) return st;
        if (!taken)
            return bad(err, "'%s' is not a cost setting (batch, global-batch, micro-batch, seq, mode, context, "
                       "hardware, recompute, mem-per-rank, mem-reserve, mem-bw, gemm-gflops, gemm-eff, link-eff, "
                       "intra-bw, inter-bw, intra-latency-us, inter-latency-us, ranks-per-node, train-state, "
                       "grad-bytes, master-bytes, optim-bytes, zero, kv-bytes)", k);
    }
    return hp_cost_settings_done(s, err);
}

/* A FILE writing into memory, its text then moved into out. */
static hp_status memfile_done(FILE *f, char **buf, size_t *len, hp_buf *out, hp_err *err)
{
    if (fclose(f) != 0 || !*buf) {
        free(*buf);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory writing the report");
    }
    hp_buf_append(out, *buf, *len);
    free(*buf);
    return HP_OK;
}

static hp_status do_cost(json_t *q, hp_model *m, plan_req *r, hp_buf *out, hp_err *err)
{
    hp_cost_settings s;
    json_t *opts = json_object_get(q, "cost");
    hp_status st = cost_settings(opts, &s, err);
    json_t *rv = json_object_get(q, "rank");
    if (st == HP_OK && rv && (!json_is_integer(rv) || json_integer_value(rv) < 0))
        st = bad(err, "%s is a rank index >= 0", "rank");
    hp_plan *p = NULL;
    hp_cost_result res = {0};
    if (st == HP_OK) st = hp_plan_derive(&p, m, &r->po, err);
    if (st == HP_OK) st = hp_cost_evaluate(&res, m, p, &s, true, err);
    const hp_cost *c = res.cost;
    if (st == HP_OK && rv && json_integer_value(rv) >= c->world)
        st = hp_err_set(err, HP_ERR_INPUT, "--rank %lld: the mesh has %lld ranks", (long long)json_integer_value(rv),
                        (long long)c->world);
    if (st == HP_OK) {
        argv_buf a = {0};
        request_argv(&a, "cost", json_object_get(q, "model"), r, opts);
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        else {
            hp_cost_report_json(f, m, p, res.layout, c, rv ? (int64_t)json_integer_value(rv) : c->max_rank, s.budget,
                                &res.fit, a.n, a.v);
            st = memfile_done(f, &buf, &len, out, err);
        }
        arg_free(&a);
    }
    hp_cost_result_free(&res);
    hp_plan_free(p);
    return st;
}

static hp_status do_advise(json_t *q, hp_model *m, plan_req *r, hp_buf *out, hp_err *err)
{
    hp_cost_settings s;
    json_t *opts = json_object_get(q, "cost"), *wv = json_object_get(q, "world"), *pv = json_object_get(q, "prefer");
    if (!json_is_integer(wv) || json_integer_value(wv) < 1 || json_integer_value(wv) > (1 << 20))
        return bad(err, "--world expects an integer in [1, 1048576] (the number of ranks)%s", "");
    const char *prefer = json_is_string(pv) ? json_string_value(pv) : "time";
    if (strcmp(prefer, "time") && strcmp(prefer, "headroom"))
        return bad(err, "--prefer expects time or headroom, got '%s'", prefer);
    int64_t N = (int64_t)json_integer_value(wv);
    json_t *mv = json_object_get(q, "max_pp");
    if (mv && !json_is_null(mv) &&
        (!json_is_integer(mv) || json_integer_value(mv) < 1 || json_integer_value(mv) > (1 << 20))) {
        char *shown = json_dumps(mv, JSON_ENCODE_ANY);
        hp_status bs = bad(err, "--max-pp expects an integer in [1, 1048576], got '%s'", shown ? shown : "?");
        free(shown);
        return bs;
    }
    int64_t max_pp = json_is_integer(mv) ? (int64_t)json_integer_value(mv) : 0;
    hp_status st = cost_settings(opts, &s, err);
    if (st == HP_OK) st = hp_advise_settings_check(&s, N, !strcmp(prefer, "headroom"), err);
    if (st != HP_OK) return st;
    hp_advise_opts ao;
    hp_advise_opts_default(&ao);
    ao.world = N;
    ao.mem_per_rank = s.budget;
    ao.cost = s.co;
    if (!s.batch_given) ao.cost.B = 0; /* the default: a row per rank (hp_advise) */
    ao.plan = r->po;
    ao.prefer_headroom = !strcmp(prefer, "headroom");
    ao.fixed_micro_batch = s.micro_given, ao.fixed_recompute = s.recompute_given;
    ao.max_pp = max_pp;
    hp_advice *a = NULL;
    hp_fit fit = {0};
    st = hp_advise(&a, m, &ao, err);
    if (st == HP_OK && !a->n_ok) st = hp_advise_fit(&fit, m, &ao, a, err);
    if (st == HP_OK) {
        argv_buf av = {0};
        request_argv(&av, "advise", json_object_get(q, "model"), r, opts);
        char w[32];
        snprintf(w, sizeof w, "%lld", (long long)N);
        arg_push(&av, "--world");
        arg_push(&av, w);
        char mp[32];
        snprintf(mp, sizeof mp, "%lld", (long long)max_pp);
        if (max_pp > 0) arg_push(&av, "--max-pp"), arg_push(&av, mp);
        json_t *path = json_object_get(json_object_get(q, "model"), "path");
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        else {
            json_t *ec = json_object_get(json_object_get(q, "options"), "ep_compute");
            json_t *ov = json_object_get(json_object_get(q, "options"), "overrides");
            hp_advice_json(f, m, a, &fit, json_is_string(path) ? json_string_value(path) : "MODEL",
                           json_is_string(ec) ? json_string_value(ec) : NULL,
                           json_is_string(ov) ? json_string_value(ov) : NULL, av.n, av.v);
            st = memfile_done(f, &buf, &len, out, err);
        }
        arg_free(&av);
        /* the report lists every reason; when nothing fits, the request as given cannot be met (the report is
         * still the reply: the caller gets both) */
        if (st == HP_OK) st = hp_advice_verdict(a, err);
    }
    hp_advice_free(a);
    return st;
}

static hp_status dispatch(json_t *q, hp_buf *out, hp_err *err)
{
    static const char *const known[] = {"command", "model", "options", "format", "fqn", "cost", "rank", "world",
                                        "prefer", "tensors", "hf_version", "max_pp", NULL};
    hp_status st = check_keys(q, "request", known, err);
    if (st != HP_OK) return st;
    json_t *cv = json_object_get(q, "command");
    const char *cmd = json_is_string(cv) ? json_string_value(cv) : "";
    enum { PLAN, COST, ADVISE, INSPECT, NONE } c = !strcmp(cmd, "plan") ? PLAN : !strcmp(cmd, "cost") ? COST
                                                 : !strcmp(cmd, "advise") ? ADVISE : !strcmp(cmd, "inspect") ? INSPECT
                                                 : NONE;
    if (c == NONE) return bad(err, "the request's command '%s' is not one of plan, cost, advise, inspect", cmd);
    plan_req r = {0};
    st = c != INSPECT ? plan_options(json_object_get(q, "options"), &r, err) : HP_OK;
    hp_model *m = NULL;
    if (st == HP_OK) st = open_model(json_object_get(q, "model"), &m, err);
    if (st == HP_OK) freeze_model(&r, m);
    if (st == HP_OK) {
        switch (c) {
        case PLAN: st = do_plan(q, m, &r, out, err); break;
        case COST: st = do_cost(q, m, &r, out, err); break;
        case ADVISE: st = do_advise(q, m, &r, out, err); break;
        default: st = hp_model_inspect_json(m, flag(q, "tensors"), out, err); break;
        }
    }
    hp_model_close(m);
    hp_overrides_free(r.ov);
    return st;
}

int hp_api_call(const char *request, char **out, char **err_msg)
{
    *out = *err_msg = NULL;
    hp_err err;
    hp_err_clear(&err);
    hp_buf b;
    hp_buf_init(&b);
    json_error_t je;
    json_t *q = request ? json_loads(request, JSON_REJECT_DUPLICATES, &je) : NULL;
    hp_status st;
    if (!json_is_object(q))
        st = hp_err_set(&err, HP_ERR_INPUT, "the request is not a JSON object%s%s", q ? "" : ": ", q ? "" : je.text);
    else st = dispatch(q, &b, &err);
    json_decref(q);
    if (b.oom) st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory");
    if (b.len && !b.oom) {
        *out = malloc(b.len + 1);
        if (*out) {
            memcpy(*out, b.data ? b.data : "", b.len);
            (*out)[b.len] = '\0';
        } else {
            st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory");
        }
    }
    hp_buf_free(&b);
    if (st != HP_OK) *err_msg = strdup(err.msg);
    return hp_status_exit_code(st);
}

void hp_api_free(void *p) { free(p); }
