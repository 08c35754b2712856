/*
 * cost_settings.c — the settings of a cost or advise request, by name (the CLI's long options without "--", the
 * JSON-in interface's keys): the batch, the mode, the stated byte and time model (docs/cost.md), sizes such as
 * 80GB, and the checks of what they say together. The one reader of these settings: the CLI's flags
 * (tools/costflags.c) and hp.cost / hp.advise (src/api) both come here, so a value means the same and is refused
 * with the same words.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/cost.h"
#include "hyperpar/plan.h"

void hp_cost_settings_init(hp_cost_settings *s)
{
    memset(s, 0, sizeof *s);
    hp_cost_opts_default(&s->co);
}

hp_status hp_parse_size(const char *opt, const char *s, uint64_t *out, hp_err *err)
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
    if (end != s && !*end && isfinite(v) && v > 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s %s has no unit; write %sGB (%s x 10^9 bytes), %sGiB (%s x 2^30 "
                          "bytes), or %sB if bytes are meant", opt, s, s, s, s, s, s);
    if (end != s && isfinite(v) && v > 0)
        for (size_t i = 0; i < sizeof u / sizeof *u; i++)
            if (!strcmp(end, u[i].suf)) {
                if (!(v * u[i].mul < 18446744073709549568.0)) /* the largest double below 2^64 */
                    return hp_err_set(err, HP_ERR_INPUT, "%s %s is past what 64 bits of bytes hold", opt, s);
                if (v * u[i].mul < 1) break; /* less than one byte */
                *out = (uint64_t)(v * u[i].mul);
                return HP_OK;
            }
    return hp_err_set(err, HP_ERR_INPUT, "%s expects a size with a unit such as 80GB, 80GiB (= 80G), 512MiB or "
                      "4096B, got '%s'", opt, s);
}

static hp_status int_in(const char *opt, const char *s, int64_t min, int64_t max, int64_t *out, hp_err *err)
{
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < min || v > max)
        return hp_err_set(err, HP_ERR_INPUT, "%s expects an integer in [%lld, %lld], got '%s'", opt, (long long)min,
                          (long long)max, s);
    *out = v;
    return HP_OK;
}

static hp_status positive(const char *opt, const char *s, double *out, hp_err *err)
{
    char *end = NULL;
    double v = strtod(s, &end);
    if (!*s || *end || !(v > 0) || v > 1e300)
        return hp_err_set(err, HP_ERR_INPUT, "%s expects a positive number, got '%s'", opt, s);
    *out = v;
    return HP_OK;
}

/* A fraction of a rate: an efficiency in (0, 1]; a rate above the peak it is a fraction of would be a wrong peak. */
static hp_status fraction(const char *opt, const char *s, double *out, hp_err *err)
{
    char *end = NULL;
    double v = strtod(s, &end);
    if (!*s || *end || !(v > 0) || v > 1)
        return hp_err_set(err, HP_ERR_INPUT, "%s expects a fraction in (0, 1] (0.75: three quarters of the peak), got "
                          "'%s'; a rate above the profile's peak is --gemm-gflops, --intra-bw or --inter-bw", opt, s);
    *out = v;
    return HP_OK;
}

/* The settings a hardware profile also sets: given explicitly, they win (hp_cost_settings_done). */
enum { G_GEMM = 1, G_INTRA_BW = 2, G_INTER_BW = 4, G_INTRA_LAT = 8, G_INTER_LAT = 16, G_RPN = 32, G_MEM_BW = 64,
       G_RESERVE = 128, G_GEMM_EFF = 256, G_LINK_EFF = 512 };

/* A training-state setting: the first one given is named when a mode refuses it. */
static void train_only(hp_cost_settings *s, const char *flag)
{
    if (!s->train_only) s->train_only = flag;
}

static void megatron(hp_cost_settings *s, const char *by)
{
    if (!s->megatron_by) s->megatron_by = by;
}

hp_status hp_cost_setting(hp_cost_settings *s, const char *name, const char *arg, bool *taken, hp_err *err)
{
    int64_t v = 0;
    double d = 0;
    hp_status st = HP_OK;
    hp_cost_model *m = &s->co.mdl;
    *taken = true;
#define IS(n) (!strcmp(name, n))
    if (IS("batch")) {
        if ((st = int_in("--batch", arg, 1, INT32_MAX, &v, err)) == HP_OK) s->co.B = v, s->batch_given = true;
    } else if (IS("global-batch")) {
        if ((st = int_in("--global-batch", arg, 1, INT32_MAX, &v, err)) == HP_OK)
            s->global_batch = v, s->global_given = true;
    } else if (IS("micro-batch")) {
        if ((st = int_in("--micro-batch", arg, 1, INT32_MAX, &v, err)) == HP_OK)
            s->co.micro_batch = v, s->micro_given = true;
    } else if (IS("hardware")) {
        if (!(s->hw = hp_cost_hardware_find(arg)))
            st = hp_err_set(err, HP_ERR_INPUT, "--hardware expects cpu, H100 (H100-80G), H200, A100 (A100-80G) or "
                            "MI300X, got '%s'", arg);
    } else if (IS("recompute")) {
        if (!strcmp(arg, "none")) m->recompute = HP_COST_RECOMPUTE_NONE;
        else if (!strcmp(arg, "selective")) m->recompute = HP_COST_RECOMPUTE_SELECTIVE;
        else if (!strcmp(arg, "full")) m->recompute = HP_COST_RECOMPUTE_FULL;
        else return hp_err_set(err, HP_ERR_INPUT, "--recompute expects none, selective or full, got '%s'", arg);
        s->recompute_given = true;
        train_only(s, "--recompute");
    } else if (IS("pp-schedule")) {
        if (!hp_pp_sched_parse(arg, &s->co.pp_sched))
            return hp_err_set(err, HP_ERR_INPUT, "--pp-schedule expects 1f1b, gpipe or interleaved, got '%s'", arg);
        s->co.pp_sched_given = true;
        train_only(s, "--pp-schedule");
    } else if (IS("seq")) {
        if ((st = int_in("--seq", arg, 1, INT32_MAX, &v, err)) == HP_OK) s->co.S = v, s->seq_given = true;
    } else if (IS("mode")) {
        if (strcmp(arg, "infer") && strcmp(arg, "train") && strcmp(arg, "decode"))
            return hp_err_set(err, HP_ERR_INPUT, "--mode expects infer, train or decode, got '%s'", arg);
        s->co.train = !strcmp(arg, "train");
        s->co.decode = !strcmp(arg, "decode");
    } else if (IS("context")) {
        if ((st = int_in("--context", arg, 1, INT32_MAX, &v, err)) == HP_OK) s->co.context = v, s->context_given = true;
    } else if (IS("mem-bw")) {
        if ((st = positive("--mem-bw", arg, &d, err)) == HP_OK) m->mem_bw = d * 1e9, s->given |= G_MEM_BW;
    } else if (IS("gemm-gflops")) {
        if ((st = positive("--gemm-gflops", arg, &d, err)) == HP_OK) m->gemm_flops = d * 1e9, s->given |= G_GEMM;
    } else if (IS("gemm-eff")) {
        if ((st = fraction("--gemm-eff", arg, &d, err)) == HP_OK) m->gemm_eff = d, s->given |= G_GEMM_EFF;
    } else if (IS("link-eff")) {
        if ((st = fraction("--link-eff", arg, &d, err)) == HP_OK) m->link_eff = d, s->given |= G_LINK_EFF;
    } else if (IS("intra-bw")) {
        if ((st = positive("--intra-bw", arg, &d, err)) == HP_OK) m->bw_intra = d * 1e9, s->given |= G_INTRA_BW;
    } else if (IS("inter-bw")) {
        if ((st = positive("--inter-bw", arg, &d, err)) == HP_OK) m->bw_inter = d * 1e9, s->given |= G_INTER_BW;
    } else if (IS("intra-latency-us")) {
        if ((st = positive("--intra-latency-us", arg, &d, err)) == HP_OK)
            m->lat_intra = d * 1e-6, s->given |= G_INTRA_LAT;
    } else if (IS("inter-latency-us")) {
        if ((st = positive("--inter-latency-us", arg, &d, err)) == HP_OK)
            m->lat_inter = d * 1e-6, s->given |= G_INTER_LAT;
    } else if (IS("ranks-per-node")) {
        if ((st = int_in("--ranks-per-node", arg, 1, HP_MESH_MAX_WORLD, &v, err)) == HP_OK)
            m->ranks_per_node = v, s->given |= G_RPN;
    } else if (IS("train-state")) {
        train_only(s, "--train-state");
        if (strcmp(arg, "runtime") && strcmp(arg, "megatron"))
            return hp_err_set(err, HP_ERR_INPUT, "--train-state expects runtime or megatron, got '%s'", arg);
        if (!strcmp(arg, "runtime")) s->runtime_given = true;
        else megatron(s, "--train-state megatron");
    } else if (IS("grad-bytes")) {
        train_only(s, "--grad-bytes");
        if ((st = int_in("--grad-bytes", arg, 0, 16, &v, err)) == HP_OK) m->grad_bytes = (int)v, megatron(s, "--grad-bytes");
    } else if (IS("master-bytes")) {
        train_only(s, "--master-bytes");
        if ((st = int_in("--master-bytes", arg, 0, 16, &v, err)) == HP_OK)
            m->master_bytes = (int)v, megatron(s, "--master-bytes");
    } else if (IS("optim-bytes")) {
        train_only(s, "--optim-bytes");
        if ((st = int_in("--optim-bytes", arg, 0, 64, &v, err)) == HP_OK)
            m->optim_bytes = (int)v, megatron(s, "--optim-bytes");
    } else if (IS("zero")) {
        train_only(s, "--zero");
        if ((st = int_in("--zero", arg, 0, 3, &v, err)) == HP_OK) {
            m->zero = (int)v;
            if (v >= 2) megatron(s, v == 2 ? "--zero 2" : "--zero 3");
        }
    } else if (IS("kv-bytes")) {
        if ((st = int_in("--kv-bytes", arg, 1, 8, &v, err)) == HP_OK) m->kv_bytes = (int)v;
    } else if (IS("mem-per-rank")) {
        st = hp_parse_size("--mem-per-rank", arg, &s->budget, err);
    } else if (IS("mem-reserve")) { /* 0 (of any unit) is a size here: no reserve */
        char *end;
        double z = strtod(arg, &end);
        if (end != arg && z == 0 && (!*end || !strcmp(end, "B") || !strcmp(end, "GiB") || !strcmp(end, "G") ||
                                     !strcmp(end, "GB") || !strcmp(end, "MiB") || !strcmp(end, "M") || !strcmp(end, "MB")))
            m->mem_reserve = 0;
        else st = hp_parse_size("--mem-reserve", arg, &m->mem_reserve, err);
        s->reserve_given = true, s->given |= G_RESERVE;
    } else if (IS("measure-gemm")) {
        s->measure = true;
    } else {
        *taken = false;
    }
#undef IS
    if (st != HP_OK) return st;
    /* the training state's model: the byte settings describe Megatron's, not hyperpar's own */
    if (s->runtime_given && s->megatron_by)
        return hp_err_set(err, HP_ERR_INPUT, "--train-state runtime counts what 'hyperpar train' holds; %s is "
                          "Megatron-LM's byte model (--train-state megatron)", s->megatron_by);
    m->state = s->megatron_by ? HP_COST_STATE_MEGATRON : HP_COST_STATE_RUNTIME;
    return HP_OK;
}

/* --hardware under the settings given explicitly, and the checks of what they say together */
static hp_status settle_hardware(hp_cost_settings *s, hp_err *err)
{
    hp_cost_model *m = &s->co.mdl, given = *m;
    const hp_cost_hardware *hw = s->hw;
    if (s->global_given) {
        if (s->batch_given && s->co.B != s->global_batch)
            return hp_err_set(err, HP_ERR_INPUT, "--batch %lld and --global-batch %lld name the same batch; give one",
                              (long long)s->co.B, (long long)s->global_batch);
        s->co.B = s->global_batch, s->batch_given = true;
    }
    if (s->micro_given && !s->co.train)
        return hp_err_set(err, HP_ERR_INPUT, "--micro-batch splits a training step (--mode train); inference runs "
                          "the batch as given (--batch)");
    if (!hw || !hw->gpu) {
        if (m->recompute != HP_COST_RECOMPUTE_NONE)
            return hp_err_set(err, HP_ERR_INPUT, "--recompute %s describes a GPU engine's backward; hyperpar's runtime "
                              "(--hardware cpu) keeps what its backward reads (--recompute none); give a GPU "
                              "--hardware (H100, H200, A100, MI300X) for %s", hp_cost_recompute_name(m->recompute),
                              hp_cost_recompute_name(m->recompute));
        if (hw) m->hw = hw; /* cpu: today's model, the settings as given */
        return HP_OK;
    }
    if (s->runtime_given)
        return hp_err_set(err, HP_ERR_INPUT, "--train-state runtime counts what 'hyperpar train' holds; --hardware "
                          "%s describes another engine, whose state is Megatron-LM's byte model", hw->name);
    if (s->measure)
        return hp_err_set(err, HP_ERR_INPUT, "--measure-gemm measures this machine's CPU; --hardware %s states the "
                          "GPU's rate (override it with --gemm-gflops)", hw->name);
    hp_cost_model_hardware(m, hw);
    if (s->given & G_GEMM) m->gemm_flops = given.gemm_flops;
    if (s->given & G_GEMM_EFF) m->gemm_eff = given.gemm_eff;
    if (s->given & G_LINK_EFF) m->link_eff = given.link_eff;
    if (s->given & G_INTRA_BW) m->bw_intra = given.bw_intra;
    if (s->given & G_INTER_BW) m->bw_inter = given.bw_inter;
    if (s->given & G_INTRA_LAT) m->lat_intra = given.lat_intra;
    if (s->given & G_INTER_LAT) m->lat_inter = given.lat_inter;
    if (s->given & G_RPN) m->ranks_per_node = given.ranks_per_node;
    if (s->given & G_MEM_BW) m->mem_bw = given.mem_bw;
    if (s->given & G_RESERVE) m->mem_reserve = given.mem_reserve;
    if (s->recompute_given) m->recompute = given.recompute;
    if (!s->budget) s->budget = hw->mem_bytes;
    return HP_OK;
}

/* The reserve must leave the budget something: a reserve of all of it would reject every mesh for no figure. */
static hp_status settle_reserve(const hp_cost_settings *s, hp_err *err)
{
    char b[2][32];
    if (!s->budget || s->co.mdl.mem_reserve < s->budget) return HP_OK;
    return hp_err_set(err, HP_ERR_INPUT, "--mem-reserve %s is all of the budget of %s per rank%s; give a smaller "
                      "reserve (or --mem-reserve 0) or a larger --mem-per-rank",
                      hp_format_bytes(s->co.mdl.mem_reserve, b[0], 32), hp_format_bytes(s->budget, b[1], 32),
                      s->reserve_given ? "" : " (the default: a tenth of the GPU's memory)");
}

static hp_status settle_mode(hp_cost_settings *s, hp_err *err)
{
    if (!s->co.decode) {
        if (s->context_given)
            return hp_err_set(err, HP_ERR_INPUT, "--context is the KV cache of --mode decode; give --mode decode, "
                              "or --seq for the positions of an infer or train step");
        return HP_OK;
    }
    if (s->train_only)
        return hp_err_set(err, HP_ERR_INPUT, "%s describes a training step's state; --mode decode serves (no "
                          "gradients, no optimizer): drop it, or use --mode train", s->train_only);
    /* the cache's positions: --context, else the --seq (or input) given, else --seq's default */
    if (!s->context_given) s->co.context = s->seq_given ? s->co.S : 4096;
    s->co.S = 1; /* one new token per sequence */
    return HP_OK;
}

hp_status hp_cost_settings_done(hp_cost_settings *s, hp_err *err)
{
    hp_status st = settle_hardware(s, err);
    if (st == HP_OK) st = settle_reserve(s, err);
    if (st == HP_OK) st = settle_mode(s, err);
    return st;
}

hp_status hp_advise_settings_check(const hp_cost_settings *s, int64_t world, bool prefer_headroom, hp_err *err)
{
    int64_t rpn = s->co.mdl.ranks_per_node;
    if (!s->budget)
        return hp_err_set(err, HP_ERR_INPUT, "missing --mem-per-rank SIZE (e.g. 80GB), or a GPU --hardware whose "
                          "memory is the budget");
    if (rpn > 0 && rpn < world && world % rpn != 0)
        return hp_err_set(err, HP_ERR_INPUT, "--ranks-per-node %lld does not divide --world %lld (the last node "
                          "would hold %lld ranks); give a divisor of %lld, or %lld or more for one node",
                          (long long)rpn, (long long)world, (long long)(world % rpn), (long long)world,
                          (long long)world);
    if (prefer_headroom && !s->co.decode)
        return hp_err_set(err, HP_ERR_INPUT, "--prefer headroom ranks by the concurrent sequences that fit: it "
                          "belongs to --mode decode");
    return HP_OK;
}

void hp_cost_settings_batch(hp_cost_settings *s, const hp_mesh *mesh)
{
    if (!s->batch_given && s->co.B < hp_mesh_batch_split(mesh))
        s->co.B = hp_mesh_batch_split(mesh); /* the default batch: a row per replica (dp x an ep axis) */
}
