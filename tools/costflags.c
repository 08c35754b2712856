/*
 * costflags.c — the flags `hyperpar cost` and `hyperpar advise` share: the batch, the mode, the stated byte and
 * time model (docs/cost.md), sizes such as 80GB, and the routing file.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "costflags.h"
#include "hyperpar/linalg.h"
#include "hyperpar/data.h"
#include "hyperpar/safetensors.h"

#include <time.h>

void cli_cost_flags_init(cli_cost_flags *f)
{
    memset(f, 0, sizeof *f);
    hp_cost_opts_default(&f->co);
}

bool cli_parse_size(const char *cmd, const char *opt, const char *s, uint64_t *out)
{
    char *end;
    double v = strtod(s, &end);
    static const struct {
        const char *suf;
        double mul;
    } u[] = {{"B", 1},           {"K", 1024.0},   {"KiB", 1024.0},          {"KB", 1e3},
             {"M", 1048576.0},  {"MiB", 1048576.0}, {"MB", 1e6},     {"G", 1073741824.0},      {"GiB", 1073741824.0},
             {"GB", 1e9},       {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12}};
    /* A bare number is refused: '--mem-per-rank 80' far more likely means 80 GB than 80 bytes. */
    if (end != s && !*end && isfinite(v) && v > 0) {
        cli_usage_error(cmd, "%s %s has no unit; write %sGB (%s x 10^9 bytes), %sGiB (%s x 2^30 bytes), or %sB if "
                        "bytes are meant", opt, s, s, s, s, s, s);
        return false;
    }
    if (end != s && isfinite(v) && v > 0)
        for (size_t i = 0; i < sizeof u / sizeof *u; i++)
            if (!strcmp(end, u[i].suf)) {
                if (!(v * u[i].mul < 18446744073709549568.0)) { /* the largest double below 2^64 */
                    cli_usage_error(cmd, "%s %s is past what 64 bits of bytes hold", opt, s);
                    return false;
                }
                if (v * u[i].mul < 1) break; /* less than one byte */
                *out = (uint64_t)(v * u[i].mul);
                return true;
            }
    cli_usage_error(cmd, "%s expects a size with a unit such as 80GB, 80GiB (= 80G), 512MiB or 4096B, got '%s'",
                    opt, s);
    return false;
}

int cli_cost_flag(const char *cmd, int c, const char *arg, cli_cost_flags *f)
{
    int64_t v;
    double d;
    hp_cost_model *m = &f->co.mdl;
    switch (c) {
    case CLI_O_BATCH:
        if (!cli_parse_i64(cmd, "--batch", arg, 1, INT32_MAX, &v)) return -1;
        f->co.B = v, f->batch_given = true;
        return 1;
    case CLI_O_SEQ:
        if (!cli_parse_i64(cmd, "--seq", arg, 1, INT32_MAX, &v)) return -1;
        f->co.S = v, f->seq_given = true;
        return 1;
    case CLI_O_MODE:
        if (strcmp(arg, "infer") && strcmp(arg, "train") && strcmp(arg, "decode"))
            return cli_usage_error(cmd, "--mode expects infer, train or decode, got '%s'", arg), -1;
        f->co.train = !strcmp(arg, "train");
        f->co.decode = !strcmp(arg, "decode");
        return 1;
    case CLI_O_CONTEXT:
        if (!cli_parse_i64(cmd, "--context", arg, 1, INT32_MAX, &v)) return -1;
        f->co.context = v, f->context_given = true;
        return 1;
    case CLI_O_MEM_BW:
        if (!cli_parse_positive(cmd, "--mem-bw", arg, &d)) return -1;
        m->mem_bw = d * 1e9;
        return 1;
    case CLI_O_GEMM:
        if (!cli_parse_positive(cmd, "--gemm-gflops", arg, &d)) return -1;
        m->gemm_flops = d * 1e9;
        return 1;
    case CLI_O_INTRA_BW:
        if (!cli_parse_positive(cmd, "--intra-bw", arg, &d)) return -1;
        m->bw_intra = d * 1e9;
        return 1;
    case CLI_O_INTER_BW:
        if (!cli_parse_positive(cmd, "--inter-bw", arg, &d)) return -1;
        m->bw_inter = d * 1e9;
        return 1;
    case CLI_O_INTRA_LAT:
        if (!cli_parse_positive(cmd, "--intra-latency-us", arg, &d)) return -1;
        m->lat_intra = d * 1e-6;
        return 1;
    case CLI_O_INTER_LAT:
        if (!cli_parse_positive(cmd, "--inter-latency-us", arg, &d)) return -1;
        m->lat_inter = d * 1e-6;
        return 1;
    case CLI_O_RPN:
        if (!cli_parse_i64(cmd, "--ranks-per-node", arg, 1, HP_MESH_MAX_WORLD, &v)) return -1;
        m->ranks_per_node = v;
        return 1;
    case CLI_O_STATE:
        if (!f->train_only) f->train_only = "--train-state";
        if (strcmp(arg, "runtime") && strcmp(arg, "megatron"))
            return cli_usage_error(cmd, "--train-state expects runtime or megatron, got '%s'", arg), -1;
        if (!strcmp(arg, "runtime")) f->runtime_given = true;
        else if (!f->megatron_by) f->megatron_by = "--train-state megatron";
        break;
    case CLI_O_GRAD:
        if (!f->train_only) f->train_only = "--grad-bytes";
        if (!cli_parse_i64(cmd, "--grad-bytes", arg, 0, 16, &v)) return -1;
        m->grad_bytes = (int)v;
        if (!f->megatron_by) f->megatron_by = "--grad-bytes";
        break;
    case CLI_O_MASTER:
        if (!f->train_only) f->train_only = "--master-bytes";
        if (!cli_parse_i64(cmd, "--master-bytes", arg, 0, 16, &v)) return -1;
        m->master_bytes = (int)v;
        if (!f->megatron_by) f->megatron_by = "--master-bytes";
        break;
    case CLI_O_OPTIM:
        if (!f->train_only) f->train_only = "--optim-bytes";
        if (!cli_parse_i64(cmd, "--optim-bytes", arg, 0, 64, &v)) return -1;
        m->optim_bytes = (int)v;
        if (!f->megatron_by) f->megatron_by = "--optim-bytes";
        break;
    case CLI_O_ZERO:
        if (!f->train_only) f->train_only = "--zero";
        if (!cli_parse_i64(cmd, "--zero", arg, 0, 2, &v)) return -1;
        m->zero = (int)v;
        if (v == 2 && !f->megatron_by) f->megatron_by = "--zero 2";
        break;
    case CLI_O_KV:
        if (!cli_parse_i64(cmd, "--kv-bytes", arg, 1, 8, &v)) return -1;
        m->kv_bytes = (int)v;
        return 1;
    case CLI_O_BUDGET:
        if (!cli_parse_size(cmd, "--mem-per-rank", arg, &f->budget)) return -1;
        return 1;
    case CLI_O_FORMAT:
        if (strcmp(arg, "text") && strcmp(arg, "json") && strcmp(arg, "html"))
            return cli_usage_error(cmd, "--format expects text, json or html, got '%s'", arg), -1;
        f->format = !strcmp(arg, "json") ? 1 : !strcmp(arg, "html") ? 2 : 0;
        return 1;
    case 'o': /* --output and -o are one option */
    case CLI_O_OUT: f->output = arg; return 1;
    case CLI_O_MEASURE: f->measure = true; return 1;
    default: return 0;
    }
    /* the training state's model: the byte flags describe Megatron's, not hyperpar's own */
    if (f->runtime_given && f->megatron_by)
        return cli_usage_error(cmd, "--train-state runtime counts what 'hyperpar train' holds; %s is Megatron-LM's "
                               "byte model (--train-state megatron)", f->megatron_by), -1;
    m->state = f->megatron_by ? HP_COST_STATE_MEGATRON : HP_COST_STATE_RUNTIME;
    return 1;
}

/* Reads moe.<l>.topk_idx [B·S, K] I32 of every sparse layer from path into f (and B, S from input_ids when the
 * file has them and no --batch/--seq/--input was given). */
hp_status cli_cost_read_routing(cli_cost_flags *f, const hp_model *m, const char *path, hp_err *err)
{
    hp_st_file *sf = NULL;
    hp_status st = hp_st_open(&sf, path, err);
    if (st != HP_OK) return st;
    int64_t B, S; /* input_ids, when the file has them, checked as every command checks them */
    if (hp_st_find(sf, CLI_IDS_KEY) && !f->batch_given && !f->seq_given) {
        if ((st = hp_data_read_input_ids(path, 0, NULL, &B, &S, err)) != HP_OK) {
            hp_st_close(sf);
            return st;
        }
        f->co.B = B, f->co.S = S;
    }
    int64_t L = m->cfg.num_hidden_layers, K = m->cfg.num_experts_per_tok, E = m->cfg.n_experts, found = 0;
    if (!(f->routing = hp_calloc((size_t)L + 1, sizeof *f->routing))) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int64_t l = 0; st == HP_OK && l < L; l++) {
        char key[CLI_TOPK_KEY_MAX];
        cli_topk_key(l, key, sizeof key);
        const hp_st_tensor *t = hp_st_find(sf, key);
        if (!t) continue;
        int64_t rows = f->co.B * f->co.S;
        if (t->dtype != HP_DT_I32 || t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != K) {
            st = hp_err_set(err, HP_ERR_INPUT, "%s: '%s' is %s [%lld, %lld]; expected I32 [%lld, %lld] (B·S rows of "
                            "the batch %lld x %lld, K = num_experts_per_tok)", path, key, hp_dtype_name(t->dtype),
                            (long long)(t->n_dims > 0 ? t->shape[0] : 0), (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                            (long long)rows, (long long)K, (long long)f->co.B, (long long)f->co.S);
            break;
        }
        int32_t *v = malloc((size_t)(rows * K) * sizeof *v + 1);
        if (!v) {
            st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            break;
        }
        st = hp_st_read(sf, t, 0, v, (size_t)(rows * K) * sizeof *v, err); /* truncated meanwhile: an error */
        for (int64_t i = 0; i < rows * K && st == HP_OK; i++)
            if (v[i] < 0 || v[i] >= E)
                st = hp_err_set(err, HP_ERR_INPUT, "%s: %s[%lld] = %d is not an expert of the %lld", path, key,
                                (long long)(i / K), v[i], (long long)E);
        f->routing[l] = v;
        found++;
    }
    if (st == HP_OK && !found)
        st = hp_err_set(err, HP_ERR_INPUT, "%s holds no moe.<layer>.topk_idx tensor (write one with 'hyperpar run "
                        "--output', or use a forward_io file)", path);
    hp_st_close(sf);
    f->n_routing = L;
    f->co.routing = (const int32_t *const *)f->routing;
    f->co.routing_layers = L;
    return st;
}

int cli_cost_flags_mode(const char *cmd, cli_cost_flags *f)
{
    if (!f->co.decode) {
        if (f->context_given)
            return cli_usage_error(cmd, "--context is the KV cache of --mode decode; give --mode decode, or --seq for "
                                   "the positions of an infer or train step");
        return HP_EXIT_OK;
    }
    if (f->train_only)
        return cli_usage_error(cmd, "%s describes a training step's state; --mode decode serves (no gradients, no "
                               "optimizer): drop it, or use --mode train", f->train_only);
    /* the cache's positions: --context, else the --seq (or input) given, else --seq's default */
    if (!f->context_given) f->co.context = f->seq_given ? f->co.S : 4096;
    f->co.S = 1; /* one new token per sequence */
    return HP_EXIT_OK;
}

void cli_cost_flags_free(cli_cost_flags *f)
{
    for (int64_t l = 0; f->routing && l < f->n_routing; l++) free(f->routing[l]);
    free(f->routing);
    f->routing = NULL;
}

void cli_json_count(FILE *o, double v)
{
    if (!isfinite(v)) fprintf(o, "null");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0) fprintf(o, "%.0f", v); /* below 2^53: exact */
    else fprintf(o, "%.17g", v);
}

void cli_json_real(FILE *o, double v)
{
    if (!isfinite(v)) fprintf(o, "null");
    else fprintf(o, "%.17g", v);
}

const char *cli_seconds(double s, char *buf, size_t cap)
{
    return hp_format_seconds(s, buf, cap);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

hp_status cli_measure_gemm(const hp_model *m, double *flops, char *desc, size_t cap, hp_err *err)
{
    int64_t K = m->cfg.hidden_size > 0 ? m->cfg.hidden_size : 1024, N = 4 * K, M = 512;
    if (K > 8192) K = 8192, N = 4 * K;
    hp_dtype dt = m->cfg.dtype == HP_DT_F32 ? HP_DT_F32 : HP_DT_BF16;
    size_t es = dt == HP_DT_F32 ? 4 : 2;
    void *w = calloc((size_t)(N * K), es);
    float *a = malloc((size_t)(M * K) * sizeof *a), *c = malloc((size_t)(M * N) * sizeof *c);
    hp_linalg *la = NULL;
    hp_linear *lin = NULL;
    hp_status st = w && a && c ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory for the GEMM measurement");
    for (int64_t i = 0; st == HP_OK && i < M * K; i++) a[i] = (float)(i % 7) * 0.125f;
    if (st == HP_OK) st = hp_linalg_create(&la, err);
    hp_linear_desc d = {.n_out = N, .n_in = K, .n_mats = 1, .dtype = dt, .w = w, .mode = HP_LINALG_EXACT};
    if (st == HP_OK) st = hp_linear_init(&lin, la, &d, err);
    double best = 0;
    for (int rep = 0; st == HP_OK && rep < 5; rep++) {
        double t0 = now_s();
        st = hp_linear_forward(lin, 0, M, a, K, c, N, false, err);
        double dt_s = now_s() - t0;
        double flop = 2.0 * (double)M * (double)N * (double)K;
        if (st == HP_OK && rep > 0 && dt_s > 0 && flop / dt_s > best) best = flop / dt_s; /* rep 0 warms up */
    }
    if (st == HP_OK) {
        char ld[200];
        *flops = best;
        snprintf(desc, cap, "%s weights, [%lld x %lld] x [%lld x %lld], best of 4: %s", dt == HP_DT_F32 ? "f32" : "bf16",
                 (long long)M, (long long)K, (long long)K, (long long)N, hp_linalg_describe(la, ld, sizeof ld));
    }
    hp_linear_free(lin);
    hp_linalg_destroy(la);
    free(w);
    free(a);
    free(c);
    return st;
}

hp_status cli_cost_measure(cli_cost_flags *f, const hp_model *m, hp_err *err)
{
    if (!f->measure) return HP_OK;
    char desc[400];
    double r = 0;
    hp_status st = cli_measure_gemm(m, &r, desc, sizeof desc, err);
    if (st == HP_OK && r > 0) {
        f->co.mdl.gemm_flops = r;
        fprintf(stderr, "hyperpar: measured GEMM rate %.1f GFLOP/s (%s)\n", r / 1e9, desc);
    }
    return st;
}
