/*
 * cmd_moe.c — `hyperpar moe MODEL --layer L --input X.safetensors --output Y.safetensors ...`: runs one
 * sparse layer in one process and writes y, topk_idx and topk_w; optionally verifies them against a
 * reference file (golden moe_io.safetensors) and exits 3 on a mismatch.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "hyperpar/moe.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: hyperpar moe MODEL --layer L --input X.safetensors --output Y.safetensors\n"
            "                    [--archetype A] [--capacity-factor F] [--capacity-policy score|first]\n"
            "                    [--threads N] [--compare REF.safetensors [--ref-prefix P]]\n"
            "\n"
            "Runs the MoE block of sparse layer L of a checkpoint on the rows of X's tensor 'x' [T, H] (f32)\n"
            "and writes 'y' [T, H] f32, 'topk_idx' [T, K] i32 and 'topk_w' [T, K] f32 (each row sorted by\n"
            "expert id ascending). Statistics go to stderr.\n"
            "\n"
            "  --layer L               decoder layer index (must be sparse)\n"
            "  --input X               safetensors file holding 'x'\n"
            "  --output Y              output file (written atomically); optional with --compare\n"
            "  --archetype A           %s\n"
            "                          (default: the family's suggestion, printed)\n"
            "  --capacity-factor F     capacity = ceil(F*T*K/E) slots per expert; 0 = off (default)\n"
            "  --capacity-policy P     score (keep the heaviest slots, default) or first (token order)\n"
            "  --threads N             OpenMP and BLAS threads\n"
            "  --compare REF           verify against REF's <P>y (or <P>y_cf<F>), <P>topk_idx, <P>topk_w:\n"
            "                          |y-ref| <= 1e-4*max|ref|, topk_idx equal, |topk_w-ref| <= 1e-5; exit 3 if not\n"
            "  --ref-prefix P          key prefix in REF (default 'layers.L.')\n"
            "\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 bad input, 3 --compare mismatch.\n",
            hp_moe_archetype_list());
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Reads tensor `name` of f into a malloc'd buffer of n_elems elements of dtype dt and the given rank. */
static hp_status read_tensor(const hp_st_file *f, const char *name, hp_dtype dt, int n_dims, void **out,
                             const hp_st_tensor **tout, hp_err *err)
{
    *out = NULL;
    const hp_st_tensor *t = hp_st_find(f, name);
    if (!t)
        return hp_err_set(err, HP_ERR_INPUT, "%s: no tensor '%s'", hp_st_path(f), name);
    if (t->dtype != dt || t->n_dims != n_dims)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s' is %s with %d dims; expected %s with %d dims",
                          hp_st_path(f), name, hp_dtype_name(t->dtype), t->n_dims, hp_dtype_name(dt), n_dims);
    size_t bytes = (size_t)(t->end - t->begin);
    *out = malloc(bytes ? bytes : 1);
    if (!*out) return hp_err_set(err, HP_ERR_NOMEM, "out of memory reading '%s'", name);
    memcpy(*out, hp_st_data(f, t), bytes);
    if (tout) *tout = t;
    return HP_OK;
}

typedef struct moe_args {
    const char *model, *input, *output, *compare, *prefix, *archetype, *cf_text;
    int64_t layer, threads;
    double cf;
    hp_moe_cap_policy policy;
} moe_args;

/* Compares the outputs with the reference; HP_ERR_VERIFY with the figures on a mismatch. */
static hp_status compare(const moe_args *a, const hp_moe_ws *ws, const float *y, int64_t T, int64_t H, int64_t K,
                         hp_err *err)
{
    hp_st_file *f = NULL;
    hp_status st = hp_st_open(&f, a->compare, err);
    if (st) return st;
    char pfx[96], key[160];
    if (a->prefix)
        snprintf(pfx, sizeof pfx, "%s", a->prefix);
    else
        snprintf(pfx, sizeof pfx, "layers.%lld.", (long long)a->layer);
    float *ry = NULL, *rw = NULL;
    int32_t *ri = NULL;
    const hp_st_tensor *t = NULL;
    if (a->cf > 0) {
        snprintf(key, sizeof key, "%sy_cf%s", pfx, a->cf_text);
        if (!hp_st_find(f, key)) snprintf(key, sizeof key, "%sy_cf%.1f", pfx, a->cf);
    } else {
        snprintf(key, sizeof key, "%sy", pfx);
    }
    st = read_tensor(f, key, HP_DT_F32, 2, (void **)&ry, &t, err);
    if (!st && (t->shape[0] != T || t->shape[1] != H))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: '%s' is [%lld, %lld] but y is [%lld, %lld]", a->compare, key,
                        (long long)t->shape[0], (long long)t->shape[1], (long long)T, (long long)H);
    if (!st) {
        snprintf(key, sizeof key, "%stopk_idx", pfx);
        st = read_tensor(f, key, HP_DT_I32, 2, (void **)&ri, &t, err);
        if (!st && t->n_elems != T * K)
            st = hp_err_set(err, HP_ERR_INPUT, "%s: '%s' has %lld entries, expected %lld", a->compare, key,
                            (long long)t->n_elems, (long long)(T * K));
    }
    if (!st) {
        snprintf(key, sizeof key, "%stopk_w", pfx);
        st = read_tensor(f, key, HP_DT_F32, 2, (void **)&rw, &t, err);
        if (!st && t->n_elems != T * K)
            st = hp_err_set(err, HP_ERR_INPUT, "%s: '%s' has %lld entries, expected %lld", a->compare, key,
                            (long long)t->n_elems, (long long)(T * K));
    }
    if (!st) {
        double mx = 0, dy = 0, dw = 0;
        int64_t bad_idx = 0, first_bad = -1;
        for (int64_t i = 0; i < T * H; i++) {
            mx = fmax(mx, fabs(ry[i]));
            dy = fmax(dy, fabs((double)y[i] - ry[i]));
        }
        for (int64_t s = 0; s < T * K; s++) {
            if (ws->topk_idx[s] != ri[s] && bad_idx++ == 0) first_bad = s;
            dw = fmax(dw, fabs((double)ws->topk_w[s] - rw[s]));
        }
        double tol = 1e-4 * mx;
        bool ok = dy <= tol && bad_idx == 0 && dw <= 1e-5;
        fprintf(stderr, "compare %s (%s*): y max diff %.3g (tolerance %.3g), topk_idx %lld of %lld differ, "
                        "topk_w max diff %.3g (tolerance 1e-05): %s\n",
                a->compare, pfx, dy, tol, (long long)bad_idx, (long long)(T * K), dw, ok ? "OK" : "MISMATCH");
        if (!ok)
            st = hp_err_set(err, HP_ERR_VERIFY,
                            "layer %lld differs from %s: y max diff %.3g (tolerance %.3g), %lld topk_idx entries "
                            "differ (first at token %lld), topk_w max diff %.3g",
                            (long long)a->layer, a->compare, dy, tol, (long long)bad_idx,
                            (long long)(first_bad >= 0 ? first_bad / K : -1), dw);
    }
    free(ry);
    free(ri);
    free(rw);
    hp_st_close(f);
    return st;
}

static hp_status write_output(const char *path, const hp_moe_layer *l, const hp_moe_ws *ws, const float *y,
                              int64_t T, hp_err *err)
{
    hp_st_writer *w = hp_st_writer_create();
    if (!w) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int64_t sy[2] = {T, l->n_hidden}, sk[2] = {T, l->top_k};
    char layer[32];
    snprintf(layer, sizeof layer, "%lld", (long long)l->layer);
    hp_status st = hp_st_writer_set_metadata(w, "archetype", hp_moe_archetype_name(l->archetype), err);
    if (!st) st = hp_st_writer_set_metadata(w, "layer", layer, err);
    if (!st) st = hp_st_writer_add(w, "y", HP_DT_F32, 2, sy, y, err);
    if (!st) st = hp_st_writer_add(w, "topk_idx", HP_DT_I32, 2, sk, ws->topk_idx, err);
    if (!st) st = hp_st_writer_add(w, "topk_w", HP_DT_F32, 2, sk, ws->topk_w, err);
    if (!st) st = hp_st_writer_write(w, path, err);
    hp_st_writer_destroy(w);
    return st;
}

static void print_stats(const hp_moe_layer *l, const hp_moe_ws *ws, const moe_args *a, double secs)
{
    const hp_moe_stats *s = &ws->stats;
    fprintf(stderr, "layer %lld (%s): %lld tokens, top-%lld of %lld experts, %s %s weights -> f32, %.3f ms\n",
            (long long)l->layer, hp_moe_archetype_name(l->archetype), (long long)s->n_tokens, (long long)l->top_k,
            (long long)l->n_experts, l->storage, hp_dtype_name(l->dtype), secs * 1e3);
    fprintf(stderr, "tokens per expert:");
    for (int64_t e = 0; e < l->n_local; e++)
        fprintf(stderr, "%s%lld:%lld", e % 16 ? " " : "\n  ", (long long)(l->first_expert + e),
                (long long)ws->counts[e]);
    fprintf(stderr, "\n");
    if (a->cf > 0)
        fprintf(stderr, "capacity factor %s (%s): capacity %lld slots per expert, dropped %lld of %lld slots\n",
                a->cf_text, a->policy == HP_MOE_CAP_SCORE ? "score" : "first", (long long)s->capacity,
                (long long)s->n_dropped, (long long)s->n_slots);
    else
        fprintf(stderr, "capacity factor off: dropped 0 of %lld slots\n", (long long)s->n_slots);
}

static int run(const moe_args *a)
{
    hp_err err;
    hp_model *m = NULL;
    hp_moe_layer *l = NULL;
    hp_moe_ws *ws = NULL;
    hp_st_file *in = NULL;
    float *x = NULL, *y = NULL;
    hp_moe_load_opts lo;
    hp_moe_load_opts_default(&lo);
    hp_status st = hp_model_open(&m, a->model, NULL, &err);
    if (!st && a->archetype) {
        hp_moe_archetype arch = HP_MOE_ROUTED_ONLY_SOFTMAX_TOPK;
        if (!hp_moe_archetype_parse(a->archetype, &arch))
            st = hp_err_set(&err, HP_ERR_INPUT, "unknown archetype '%s'; known: %s", a->archetype,
                            hp_moe_archetype_list());
        lo.archetype = (int)arch;
    }
    if (!st) st = hp_moe_layer_load(&l, m, a->layer, &lo, &err);
    if (!st && !a->archetype)
        fprintf(stderr, "hyperpar moe: archetype %s (suggested for family %s; choose another with --archetype)\n",
                hp_moe_archetype_name(l->archetype), m->model_type);
    const hp_st_tensor *xt = NULL;
    if (!st) st = hp_st_open(&in, a->input, &err);
    if (!st) st = read_tensor(in, "x", HP_DT_F32, 2, (void **)&x, &xt, &err);
    int64_t T = xt ? xt->shape[0] : 0;
    if (!st && xt->shape[1] != l->n_hidden)
        st = hp_err_set(&err, HP_ERR_INPUT,
                        "%s: tensor 'x' is [%lld, %lld] but layer %lld has hidden size %lld; expected [T, %lld]",
                        a->input, (long long)T, (long long)xt->shape[1], (long long)a->layer,
                        (long long)l->n_hidden, (long long)l->n_hidden);
    if (!st && T < 1) st = hp_err_set(&err, HP_ERR_INPUT, "%s: tensor 'x' has no rows", a->input);
    if (!st) st = hp_moe_ws_create(&ws, l, T, &err);
    if (!st && !(y = malloc((size_t)(T * l->n_hidden) * sizeof *y)))
        st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory");
    double t0 = now_s(), t1 = t0;
    if (!st) {
        hp_moe_run_opts ro = {.capacity_factor = a->cf, .policy = a->policy};
        st = hp_moe_forward(l, ws, x, T, l->n_hidden, y, &ro, &err);
        t1 = now_s();
        if (st) hp_err_prefix(&err, "%s", a->input);
    }
    if (!st) print_stats(l, ws, a, t1 - t0);
    if (!st && a->output) st = write_output(a->output, l, ws, y, T, &err);
    if (!st && a->compare) st = compare(a, ws, y, T, l->n_hidden, l->top_k, &err);
    free(x);
    free(y);
    hp_st_close(in);
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(l);
    hp_model_close(m);
    return st ? cli_fail(&err) : HP_EXIT_OK;
}

int cmd_moe(int argc, char **argv)
{
    static const struct option opts[] = {
        {"layer", required_argument, 0, 'l'},           {"input", required_argument, 0, 'i'},
        {"output", required_argument, 0, 'o'},          {"archetype", required_argument, 0, 'a'},
        {"capacity-factor", required_argument, 0, 'c'}, {"capacity-policy", required_argument, 0, 'p'},
        {"threads", required_argument, 0, 't'},         {"compare", required_argument, 0, 'C'},
        {"ref-prefix", required_argument, 0, 'P'},      {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    moe_args a = {.layer = -1};
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'l':
            if (!cli_parse_i64("moe", "--layer", optarg, 0, 1 << 20, &a.layer)) return HP_EXIT_USAGE;
            break;
        case 'i': a.input = optarg; break;
        case 'o': a.output = optarg; break;
        case 'a': a.archetype = optarg; break;
        case 'c': {
            char *end = NULL;
            a.cf = strtod(optarg, &end);
            a.cf_text = optarg;
            if (!*optarg || *end || !isfinite(a.cf) || a.cf < 0)
                return cli_usage_error("moe", "--capacity-factor expects a non-negative number, got '%s'", optarg);
            break;
        }
        case 'p':
            if (!hp_moe_cap_policy_parse(optarg, &a.policy))
                return cli_usage_error("moe", "--capacity-policy expects score or first, got '%s'", optarg);
            break;
        case 't':
            if (!cli_parse_i64("moe", "--threads", optarg, 1, 4096, &a.threads)) return HP_EXIT_USAGE;
            break;
        case 'C': a.compare = optarg; break;
        case 'P': a.prefix = optarg; break;
        case 'h': usage(stdout); return HP_EXIT_OK;
        default: return cli_bad_option("moe", argv);
        }
    }
    if (optind >= argc) return cli_usage_error("moe", "missing MODEL");
    if (optind + 1 != argc) return cli_usage_error("moe", "unexpected argument '%s'", argv[optind + 1]);
    a.model = argv[optind];
    if (a.layer < 0) return cli_usage_error("moe", "missing --layer L");
    if (!a.input) return cli_usage_error("moe", "missing --input X.safetensors");
    if (!a.output && !a.compare) return cli_usage_error("moe", "missing --output Y.safetensors (or --compare REF)");
    if (a.threads > 0) hp_moe_set_threads((int)a.threads);
    return run(&a);
}
