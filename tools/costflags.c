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

/* The model flags a hardware profile also sets: given explicitly, they win (cli_cost_flags_done). */
enum { CLI_G_GEMM = 1, CLI_G_INTRA_BW = 2, CLI_G_INTER_BW = 4, CLI_G_INTRA_LAT = 8, CLI_G_INTER_LAT = 16,
       CLI_G_RPN = 32, CLI_G_MEM_BW = 64, CLI_G_RESERVE = 128 };

int cli_cost_flag(const char *cmd, int c, const char *arg, cli_cost_flags *f)
{
    int64_t v;
    double d;
    hp_cost_model *m = &f->co.mdl;
    static const unsigned given_of[][2] = {{CLI_O_GEMM, CLI_G_GEMM},           {CLI_O_INTRA_BW, CLI_G_INTRA_BW},
                                           {CLI_O_INTER_BW, CLI_G_INTER_BW},   {CLI_O_INTRA_LAT, CLI_G_INTRA_LAT},
                                           {CLI_O_INTER_LAT, CLI_G_INTER_LAT}, {CLI_O_RPN, CLI_G_RPN},
                                           {CLI_O_MEM_BW, CLI_G_MEM_BW},       {CLI_O_RESERVE, CLI_G_RESERVE}};
    for (size_t i = 0; i < sizeof given_of / sizeof *given_of; i++)
        if ((unsigned)c == given_of[i][0]) f->given |= given_of[i][1];
    switch (c) {
    case CLI_O_BATCH:
        if (!cli_parse_i64(cmd, "--batch", arg, 1, INT32_MAX, &v)) return -1;
        f->co.B = v, f->batch_given = true;
        return 1;
    case CLI_O_GLOBAL:
        if (!cli_parse_i64(cmd, "--global-batch", arg, 1, INT32_MAX, &v)) return -1;
        f->global_batch = v, f->global_given = true;
        return 1;
    case CLI_O_MICRO:
        if (!cli_parse_i64(cmd, "--micro-batch", arg, 1, INT32_MAX, &v)) return -1;
        f->co.micro_batch = v, f->micro_given = true;
        return 1;
    case CLI_O_HW:
        if (!(f->hw = hp_cost_hardware_find(arg)))
            return cli_usage_error(cmd, "--hardware expects cpu, H100 (H100-80G), H200, A100 (A100-80G) or MI300X, "
                                   "got '%s'", arg), -1;
        return 1;
    case CLI_O_RECOMPUTE:
        if (!strcmp(arg, "none")) m->recompute = HP_COST_RECOMPUTE_NONE;
        else if (!strcmp(arg, "selective")) m->recompute = HP_COST_RECOMPUTE_SELECTIVE;
        else if (!strcmp(arg, "full")) m->recompute = HP_COST_RECOMPUTE_FULL;
        else return cli_usage_error(cmd, "--recompute expects none, selective or full, got '%s'", arg), -1;
        f->recompute_given = true;
        if (!f->train_only) f->train_only = "--recompute";
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
        if (!cli_parse_i64(cmd, "--zero", arg, 0, 3, &v)) return -1;
        m->zero = (int)v;
        if (v >= 2 && !f->megatron_by) f->megatron_by = v == 2 ? "--zero 2" : "--zero 3";
        break;
    case CLI_O_KV:
        if (!cli_parse_i64(cmd, "--kv-bytes", arg, 1, 8, &v)) return -1;
        m->kv_bytes = (int)v;
        return 1;
    case CLI_O_BUDGET:
        if (!cli_parse_size(cmd, "--mem-per-rank", arg, &f->budget)) return -1;
        return 1;
    case CLI_O_RESERVE: { /* 0 (of any unit) is a size here: no reserve */
        char *end;
        double z = strtod(arg, &end);
        if (end != arg && z == 0 && (!*end || !strcmp(end, "B") || !strcmp(end, "GiB") || !strcmp(end, "G") ||
                                     !strcmp(end, "GB") || !strcmp(end, "MiB") || !strcmp(end, "M") || !strcmp(end, "MB")))
            m->mem_reserve = 0;
        else if (!cli_parse_size(cmd, "--mem-reserve", arg, &m->mem_reserve)) return -1;
        f->reserve_given = true;
        return 1;
    }
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

static int flags_mode(const char *cmd, cli_cost_flags *f);

/* --hardware under the flags given explicitly, and the checks of what they say together */
static bool flags_hardware(const char *cmd, cli_cost_flags *f)
{
    hp_cost_model *m = &f->co.mdl, given = *m;
    const hp_cost_hardware *hw = f->hw;
    if (f->global_given) {
        if (f->batch_given && f->co.B != f->global_batch)
            return cli_usage_error(cmd, "--batch %lld and --global-batch %lld name the same batch; give one",
                                   (long long)f->co.B, (long long)f->global_batch), false;
        f->co.B = f->global_batch, f->batch_given = true;
    }
    if (f->micro_given && !f->co.train)
        return cli_usage_error(cmd, "--micro-batch splits a training step (--mode train); inference runs the batch "
                               "as given (--batch)"), false;
    if (!hw || !hw->gpu) {
        if (m->recompute != HP_COST_RECOMPUTE_NONE)
            return cli_usage_error(cmd, "--recompute %s describes a GPU engine's backward; hyperpar's runtime "
                                   "(--hardware cpu) keeps what its backward reads (--recompute none); give a GPU "
                                   "--hardware (H100, H200, A100, MI300X) for %s", hp_cost_recompute_name(m->recompute),
                                   hp_cost_recompute_name(m->recompute)), false;
        if (hw) m->hw = hw; /* cpu: today's model, the flags as given */
        return true;
    }
    if (f->runtime_given)
        return cli_usage_error(cmd, "--train-state runtime counts what 'hyperpar train' holds; --hardware %s "
                               "describes another engine, whose state is Megatron-LM's byte model", hw->name), false;
    if (f->measure)
        return cli_usage_error(cmd, "--measure-gemm measures this machine's CPU; --hardware %s states the GPU's rate "
                               "(override it with --gemm-gflops)", hw->name), false;
    hp_cost_model_hardware(m, hw);
    if (f->given & CLI_G_GEMM) m->gemm_flops = given.gemm_flops;
    if (f->given & CLI_G_INTRA_BW) m->bw_intra = given.bw_intra;
    if (f->given & CLI_G_INTER_BW) m->bw_inter = given.bw_inter;
    if (f->given & CLI_G_INTRA_LAT) m->lat_intra = given.lat_intra;
    if (f->given & CLI_G_INTER_LAT) m->lat_inter = given.lat_inter;
    if (f->given & CLI_G_RPN) m->ranks_per_node = given.ranks_per_node;
    if (f->given & CLI_G_MEM_BW) m->mem_bw = given.mem_bw;
    if (f->given & CLI_G_RESERVE) m->mem_reserve = given.mem_reserve;
    if (f->recompute_given) m->recompute = given.recompute;
    if (!f->budget) f->budget = hw->mem_bytes;
    return true;
}

/* The reserve must leave the budget something: a reserve of all of it would reject every mesh for no figure. */
static bool flags_reserve(const char *cmd, const cli_cost_flags *f)
{
    char b[2][32];
    if (!f->budget || f->co.mdl.mem_reserve < f->budget) return true;
    return cli_usage_error(cmd, "--mem-reserve %s is all of the budget of %s per rank%s; give a smaller reserve (or "
                           "--mem-reserve 0) or a larger --mem-per-rank",
                           hp_format_bytes(f->co.mdl.mem_reserve, b[0], 32), hp_format_bytes(f->budget, b[1], 32),
                           f->reserve_given ? "" : " (the default: a tenth of the GPU's memory)"), false;
}

bool cli_cost_flags_done(const char *cmd, cli_cost_flags *f)
{
    return flags_hardware(cmd, f) && flags_reserve(cmd, f) && flags_mode(cmd, f) == HP_EXIT_OK;
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

void cli_cost_engine_json(FILE *o, const hp_cost_model *m)
{
    const hp_cost_hardware *h = m->hw;
    bool gpu = hp_cost_model_gpu(m);
    fprintf(o, "\"engine\": \"%s\", \"hardware\": {\"name\": \"%s\", \"description\": ", gpu ? "estimate" : "hyperpar",
            h ? h->name : "cpu");
    cli_json_fstr(o, h ? h->desc : "hyperpar's own f32 runtime on this project's CPUs");
    fprintf(o, ", \"memory_bytes\": %llu", (unsigned long long)(h ? h->mem_bytes : 0));
    static const char *const names[] = {"flops", "hbm_bandwidth", "intra_bw", "inter_bw", "intra_latency",
                                        "inter_latency"};
    const double v[] = {m->gemm_flops, h ? h->hbm_bw : 0, m->bw_intra, m->bw_inter, m->lat_intra, m->lat_inter};
    cli_json_reals(o, names, v, sizeof v / sizeof *v);
    fprintf(o, ", \"ranks_per_node\": %lld, \"activation_bytes\": %d, \"recompute\": \"%s\", \"mem_reserve\": %llu, "
               "\"source\": ", (long long)m->ranks_per_node, gpu ? 2 : 4, hp_cost_recompute_name(m->recompute),
            (unsigned long long)m->mem_reserve);
    cli_json_fstr(o, h ? h->source : "hyperpar bench run (docs/cost.md)");
    fprintf(o, "}");
}

/* Appends word to buf (at *n), single-quoted when it holds anything a shell would read otherwise. */
static void put_word(char *buf, size_t cap, size_t *n, const char *word)
{
    bool plain = *word != '\0';
    for (const char *c = word; *c && plain; c++)
        plain = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=,:+@%", *c) != NULL;
    int k;
    if (plain) k = snprintf(buf + *n, cap - *n, " %s", word);
    else {
        k = snprintf(buf + *n, cap - *n, " '");
        for (const char *c = word; k >= 0 && *n + (size_t)k < cap && *c; c++)
            k += snprintf(buf + *n + k, cap - *n - (size_t)k, *c == '\'' ? "'\\''" : "%c", *c);
        if (k >= 0 && *n + (size_t)k < cap) k += snprintf(buf + *n + k, cap - *n - (size_t)k, "'");
    }
    if (k > 0) *n = *n + (size_t)k < cap ? *n + (size_t)k : cap - 1;
}

/* Whether argv[i] is flag (as "--flag V" or "--flag=V"): the words it takes into *words. */
static bool is_flag(char **argv, int i, int argc, const char *flag, int *words)
{
    size_t l = strlen(flag);
    if (strncmp(argv[i], flag, l)) return false;
    if (argv[i][l] == '=') return *words = 1, true;
    if (argv[i][l] == '\0') return *words = i + 1 < argc ? 2 : 1, true;
    return false;
}

/* Whether argv[i] is the flag of change ch (or one it replaces: --global-batch with --batch, --train-state with
 * --zero 2 or 3): its words into *words. */
static bool replaced_by(char **argv, int i, int argc, const char *flag, const char *value, int *words)
{
    return is_flag(argv, i, argc, flag, words) ||
           (!strcmp(flag, "--batch") && is_flag(argv, i, argc, "--global-batch", words)) ||
           (!strcmp(flag, "--zero") && atoi(value) >= 2 && is_flag(argv, i, argc, "--train-state", words));
}

void cli_fit_command(char *buf, size_t cap, const char *cmd, int argc, char **argv, const hp_fit_change *ch)
{
    size_t n = 0;
    int k = snprintf(buf, cap, "hyperpar %s", cmd);
    n = k > 0 && (size_t)k < cap ? (size_t)k : 0;
    for (int i = 1; i < argc; i++) {
        int words = 0;
        if (replaced_by(argv, i, argc, ch->flag, ch->value, &words) ||
            (ch->flag2[0] && replaced_by(argv, i, argc, ch->flag2, ch->value2, &words))) {
            i += words - 1;
            continue;
        }
        put_word(buf, cap, &n, argv[i]);
    }
    put_word(buf, cap, &n, ch->flag);
    put_word(buf, cap, &n, ch->value);
    if (ch->flag2[0]) {
        put_word(buf, cap, &n, ch->flag2);
        put_word(buf, cap, &n, ch->value2);
    }
}

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
        char line[CLI_FIT_COMMAND_MAX];
        cli_fit_command(line, sizeof line, cmd, argc, argv, &f->ch[i]);
        char fv[128];
        snprintf(fv, sizeof fv, "%s %s%s%s%s%s", f->ch[i].flag, f->ch[i].value, f->ch[i].flag2[0] ? " " : "",
                 f->ch[i].flag2, f->ch[i].flag2[0] ? " " : "", f->ch[i].value2);
        fprintf(o, "  %-24s %10s%s%s\n    %s\n", fv, hp_format_bytes(f->ch[i].bytes, b[0], 32),
                f->ch[i].mesh[0] ? "  first: " : "", f->ch[i].mesh, line);
    }
}

void cli_fit_json(FILE *o, const hp_fit *f, const char *cmd, int argc, char **argv)
{
    if (!f->binding) {
        fprintf(o, "null");
        return;
    }
    fprintf(o, "{\"binding\": ");
    cli_json_fstr(o, f->binding);
    fprintf(o, ", \"binding_bytes\": %llu, \"total_bytes\": %llu, \"budget\": %llu, \"reserve\": %llu, \"changes\": [",
            (unsigned long long)f->binding_bytes, (unsigned long long)f->total_bytes, (unsigned long long)f->budget,
            (unsigned long long)f->reserve);
    for (int i = 0; i < f->n; i++) {
        char line[CLI_FIT_COMMAND_MAX];
        cli_fit_command(line, sizeof line, cmd, argc, argv, &f->ch[i]);
        fprintf(o, "%s{\"flag\": ", i ? ", " : "");
        cli_json_fstr(o, f->ch[i].flag);
        fprintf(o, ", \"value\": ");
        cli_json_fstr(o, f->ch[i].value);
        fprintf(o, ", \"with\": ");
        if (f->ch[i].flag2[0]) {
            fprintf(o, "{\"flag\": ");
            cli_json_fstr(o, f->ch[i].flag2);
            fprintf(o, ", \"value\": ");
            cli_json_fstr(o, f->ch[i].value2);
            fprintf(o, "}");
        } else {
            fprintf(o, "null");
        }
        fprintf(o, ", \"bytes\": %llu, \"mesh\": ", (unsigned long long)f->ch[i].bytes);
        if (f->ch[i].mesh[0]) cli_json_fstr(o, f->ch[i].mesh);
        else fprintf(o, "null");
        fprintf(o, ", \"command\": ");
        cli_json_fstr(o, line);
        fprintf(o, "}");
    }
    fprintf(o, "]}");
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

/* --mode decode takes no training flag, its context is --context, else the --seq given, else 4096, and its step one
 * new token (S = 1); --context needs decode. HP_EXIT_OK, or the usage error's exit code (printed). */
static int flags_mode(const char *cmd, cli_cost_flags *f)
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

void cli_json_reals(FILE *o, const char *const *names, const double *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fprintf(o, ", \"%s\": ", names[i]);
        cli_json_real(o, v[i]);
    }
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

hp_status cli_forward_memory_fits(const hp_comm *w, const hp_model *m, const hp_plan *p, int64_t B, int64_t S,
                                  bool train, bool weights_held, double root_extra, int local_ranks, const char *what,
                                  const char *remedy, hp_err *err)
{
    int64_t R = hp_comm_rank(w);
    hp_cost_opts o;
    hp_cost_opts_default(&o);
    o.B = B, o.S = S, o.train = train, o.n_ranks = 1, o.ranks = &R;
    /* the forward runs the B rows as one micro-batch (each replica its rows), not cost's default of 1 row */
    int64_t dp = hp_mesh_size(&p->mesh, "dp");
    if (train && dp > 0 && B % dp == 0) o.micro_batch = B / dp;
    hp_cost *c = NULL;
    hp_err e;
    double need = 0; /* unknown (the runtime refuses the plan, or cost could not say): the allocations tell */
    hp_status cs = hp_cost_compute(&c, m, p, &o, &e);
    if (cs == HP_OK && !c->refused[0]) {
        const hp_cost_rank *k = &c->ranks[0];
        need = k->workspace_bytes == UINT64_MAX ? 0x1p64 /* past 64 bits */
                                                : (double)k->workspace_bytes + (weights_held ? 0.0 : (double)k->weight_bytes);
        need += (double)k->window_bytes; /* the groups' shared windows: memory beside the workspace */
        if (train && (double)k->total_bytes > need) need = (double)k->total_bytes;
        if (R == 0) need += root_extra;
    } /* else unknown too: a batch past 64-bit sizes is the runtime's own refusal (exit 2) */
    hp_cost_free(c);
    hp_status st = hp_comm_allreduce_max_f64(w, &need, 1, err);
    if (st != HP_OK || need <= 0) return st;
    char rem[400];
    snprintf(rem, sizeof rem, "%s ('hyperpar cost' on the same model, mesh and --batch/--seq prints each rank's "
             "figures)", remedy);
    /* nodes may hold other numbers of ranks: the verdict is agreed, so that no rank goes on alone */
    return hp_comm_agree(w, cli_memory_fits(what, need, local_ranks > 0 ? local_ranks : 1, rem, err), err);
}
