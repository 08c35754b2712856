/*
 * costflags.c — the flags `hyperpar cost` and `hyperpar advise` share: the settings of the cost model, read by the
 * library (hp_cost_setting, src/cost/cost_settings.c) under the flags' long names; --format, --output, the routing
 * file and --measure-gemm's measurement here.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/comm.h"
#include "costflags.h"
#include "hyperpar/linalg.h"
#include "hyperpar/data.h"
#include "hyperpar/safetensors.h"


void cli_cost_flags_init(cli_cost_flags *f)
{
    memset(f, 0, sizeof *f);
    hp_cost_settings_init(&f->s);
}

const cli_enum cli_enum_cost_format = {NULL, {{"text", 0, false}, {"json", 1, false}, {"html", 2, false}}};

bool cli_cost_fn(const cli_ctx *x)
{
    cli_cost_flags *f = cli_target(x);
    hp_err err;
    bool taken = false;
    if (hp_cost_setting(&f->s, x->opt->name, x->arg ? x->arg : "", &taken, &err) != HP_OK)
        return cli_usage_error(x->cmd, "%s", err.msg), false;
    if (!taken) /* a flag of the table the library does not know: our bug, but never a crash */
        return cli_usage_error(x->cmd, "option '--%s' is not handled here", x->opt->name), false;
    return true;
}

bool cli_cost_flags_done(const char *cmd, cli_cost_flags *f)
{
    hp_err err;
    if (hp_cost_settings_done(&f->s, &err) == HP_OK) return true;
    cli_usage_error(cmd, "%s", err.msg);
    return false;
}

void cli_cost_engine_text(FILE *o, const hp_cost_model *m, bool train)
{
    char b[32];
    if (!hp_cost_model_gpu(m)) {
        fprintf(o, "engine   hyperpar's own runtime (f32 activations; --hardware cpu)\n");
        return;
    }
    fprintf(o, "engine   figures for a bf16 GPU engine (Megatron-style accounting), not hyperpar's runtime: %s, %s, "
               "%.0f TFLOP/s bf16, links %.0f / %.0f GB/s per direction (node / network), %lld per node%s%s\n",
            m->hw->desc, hp_format_bytes(m->hw->mem_bytes, b, sizeof b), m->gemm_flops / 1e12, m->bw_intra / 1e9,
            m->bw_inter / 1e9, (long long)m->ranks_per_node, train ? "; recompute " : "",
            train ? hp_cost_recompute_name(m->recompute) : "");
}

void cli_cost_reserve_text(FILE *o, const hp_cost_model *m, uint64_t budget)
{
    char b[3][32];
    if (!budget) return;
    if (!m->mem_reserve) {
        fprintf(o, "reserve  none (--mem-reserve): the figures may fill the whole %s per rank\n",
                hp_format_bytes(budget, b[0], 32));
        return;
    }
    fprintf(o, "reserve  %s per rank kept for the runtime and fragmentation (CUDA context, NCCL buffers, the "
               "allocator; --mem-reserve): the figures must fit %s of %s\n", hp_format_bytes(m->mem_reserve, b[0], 32),
            hp_format_bytes(hp_cost_usable(m, budget), b[1], 32), hp_format_bytes(budget, b[2], 32));
}

/* Appends word to buf (at *n), single-quoted when it holds anything a shell would read otherwise. */
void cli_fit_text(FILE *o, const hp_fit *f, const char *cmd, int argc, char **argv)
{
    char b[3][32];
    if (!f->binding) return;
    char rs[80] = "";
    if (f->reserve) {
        char r[2][32];
        snprintf(rs, sizeof rs, ", less a reserve of %s: %s", hp_format_bytes(f->reserve, r[0], 32),
                 hp_format_bytes(f->budget > f->reserve ? f->budget - f->reserve : 0, r[1], 32));
    }
    fprintf(o, "\nbinding constraint: %s, %s of the most-loaded rank's %s (budget %s%s)\n", f->binding,
            hp_format_bytes(f->binding_bytes, b[0], 32), hp_format_bytes(f->total_bytes, b[1], 32),
            hp_format_bytes(f->budget, b[2], 32), rs);
    if (!f->n) {
        fprintf(o, "no single change found that fits (tried: %s)\n", f->tried[0] ? f->tried : "nothing");
        return;
    }
    fprintf(o, "nearest changes that fit (%s; the most-loaded rank then needs):\n",
            f->ch[0].flag2[0] ? "none fits alone: each with the second flag" : "each alone");
    for (int i = 0; i < f->n; i++) {
        char line[HP_FIT_COMMAND_MAX];
        hp_fit_command(line, sizeof line, cmd, argc, argv, &f->ch[i]);
        char fv[128];
        snprintf(fv, sizeof fv, "%s %s%s%s%s%s", f->ch[i].flag, f->ch[i].value, f->ch[i].flag2[0] ? " " : "",
                 f->ch[i].flag2, f->ch[i].flag2[0] ? " " : "", f->ch[i].value2);
        fprintf(o, "  %-24s %10s%s%s\n    %s\n", fv, hp_format_bytes(f->ch[i].bytes, b[0], 32),
                f->ch[i].mesh[0] ? "  first: " : "", f->ch[i].mesh, line);
    }
}

/* Reads moe.<l>.topk_idx [B·S, K] I32 of every sparse layer from path into f (and B, S from input_ids when the
 * file has them and no --batch/--seq/--input was given). */
hp_status cli_cost_read_routing(cli_cost_flags *f, const hp_model *m, const char *path, hp_err *err)
{
    hp_st_file *sf = NULL;
    hp_status st = hp_st_open(&sf, path, err);
    if (st != HP_OK) return st;
    int64_t B, S; /* input_ids, when the file has them, checked as every command checks them */
    if (hp_st_find(sf, CLI_IDS_KEY) && !f->s.batch_given && !f->s.seq_given) {
        if ((st = hp_data_read_input_ids(path, 0, NULL, &B, &S, err)) != HP_OK) {
            hp_st_close(sf);
            return st;
        }
        f->s.co.B = B, f->s.co.S = S;
    }
    int64_t L = m->cfg.num_hidden_layers, K = m->cfg.num_experts_per_tok, E = m->cfg.n_experts, found = 0;
    if (!(f->routing = hp_calloc((size_t)L + 1, sizeof *f->routing))) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int64_t l = 0; st == HP_OK && l < L; l++) {
        char key[CLI_TOPK_KEY_MAX];
        cli_topk_key(l, key, sizeof key);
        const hp_st_tensor *t = hp_st_find(sf, key);
        if (!t) continue;
        int64_t rows = f->s.co.B * f->s.co.S;
        if (t->dtype != HP_DT_I32 || t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != K) {
            st = hp_err_set(err, HP_ERR_INPUT, "%s: '%s' is %s [%lld, %lld]; expected I32 [%lld, %lld] (B·S rows of "
                            "the batch %lld x %lld, K = num_experts_per_tok)", path, key, hp_dtype_name(t->dtype),
                            (long long)(t->n_dims > 0 ? t->shape[0] : 0), (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                            (long long)rows, (long long)K, (long long)f->s.co.B, (long long)f->s.co.S);
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
    f->s.co.routing = (const int32_t *const *)f->routing;
    f->s.co.routing_layers = L;
    return st;
}

void cli_cost_flags_free(cli_cost_flags *f)
{
    for (int64_t l = 0; f->routing && l < f->n_routing; l++) free(f->routing[l]);
    free(f->routing);
    f->routing = NULL;
}

const char *cli_seconds(double s, char *buf, size_t cap)
{
    return hp_format_seconds(s, buf, cap);
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
        double t0 = hp_comm_wtime();
        st = hp_linear_forward(lin, 0, M, a, K, c, N, false, err);
        double dt_s = hp_comm_wtime() - t0;
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
    if (!f->s.measure) return HP_OK;
    char desc[400];
    double r = 0;
    hp_status st = cli_measure_gemm(m, &r, desc, sizeof desc, err);
    if (st == HP_OK && r > 0) {
        f->s.co.mdl.gemm_flops = r;
        fprintf(stderr, "hyperpar: measured GEMM rate %.1f GFLOP/s (%s)\n", r / 1e9, desc);
    }
    return st;
}

