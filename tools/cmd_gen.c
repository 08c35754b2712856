/*
 * cmd_gen.c — `hyperpar gen --family F --out DIR [...]`: a tiny deterministic random checkpoint.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cli.h"
#include "signals.h"
#include "hyperpar/gen.h"

/* Integer options, their help text and the range gen accepts (the same bounds hp_gen_config_text checks). */
typedef struct int_opt {
    int code;
    const char *name, *help;
    size_t offset;       /* into hp_gen_opts */
    int64_t min, max;
} int_opt;

#define OPT(c, n, h, m, hi) {c, n, h, offsetof(hp_gen_opts, m), 1, hi}
static const int_opt g_int_opts[] = {
    OPT('l', "--layers", "decoder layers", layers, HP_GEN_MAX_DIM),
    OPT('H', "--hidden", "hidden size", hidden, HP_GEN_MAX_DIM),
    OPT('a', "--heads", "attention heads", heads, HP_GEN_MAX_DIM),
    OPT('k', "--kv-heads", "key/value heads, a divisor of --heads (DeepSeek-V3: equal to --heads)", kv_heads,
        HP_GEN_MAX_DIM),
    OPT('D', "--head-dim", "head dimension", head_dim, HP_GEN_MAX_DIM),
    OPT('i', "--intermediate", "dense MLP width; Mixtral and gpt-oss experts use it too", intermediate,
        HP_GEN_MAX_DIM),
    OPT('m', "--moe-intermediate", "expert width", moe_intermediate, HP_GEN_MAX_DIM),
    OPT('e', "--experts", "routed experts", experts, HP_GEN_MAX_EXPERTS),
    OPT('K', "--top-k", "experts per token, at most --experts", top_k, HP_GEN_MAX_EXPERTS),
    OPT('V', "--vocab", "vocabulary size", vocab, HP_GEN_MAX_DIM),
};
#define N_INT_OPTS (sizeof g_int_opts / sizeof *g_int_opts)

/* gen's option table: the fixed options, then one entry per integer option of g_int_opts, its help naming the
 * range and the default (d), written into help[]. */
static const cli_opt g_fixed_opts[] = {
    {"family", 'f', "F", "the model family (see above)", 0, NULL},
    {"out", 'o', "DIR", "the folder to write", 0, NULL},
    {"dtype", 't', "f32|bf16|f16", "storage dtype (f32)", 0, NULL},
    {"expert-layout", 'L', "L", "per-expert (hub names, default) or batched; gpt-oss is always batched", 0, NULL},
    {"seed", 's', "S", "random seed, 0..18446744073709551615 (0)", 0, NULL},
    {"force", 'F', NULL, "write into a non-empty DIR", 0, NULL},
    CLI_OPT_HELP,
};
#define N_FIXED_OPTS (sizeof g_fixed_opts / sizeof *g_fixed_opts)

static void gen_table(cli_opt t[N_FIXED_OPTS + N_INT_OPTS + 1], char help[N_INT_OPTS][160], const hp_gen_opts *d)
{
    size_t n = 0;
    for (size_t i = 0; i < N_FIXED_OPTS; i++) t[n++] = g_fixed_opts[i];
    for (size_t i = 0; i < N_INT_OPTS; i++) {
        const int_opt *o = &g_int_opts[i];
        snprintf(help[i], sizeof help[i], "%s, %lld..%lld (%lld)", o->help, (long long)o->min, (long long)o->max,
                 (long long)*(const int64_t *)((const char *)d + o->offset));
        t[n++] = (cli_opt){o->name + 2, o->code, "N", help[i], 0, NULL};
    }
    t[n] = (cli_opt){0};
}

static void usage(FILE *out, const cli_opt *t)
{
    char fams[HP_FAMILY_LIST_MAX];
    fprintf(out,
            "usage: hyperpar gen --family F --out DIR [options]\n"
            "\n"
            "Writes DIR/config.json and DIR/model.safetensors: a tiny model of family F with random\n"
            "weights, the same bytes for the same options and seed. Families: %s.\n"
            "\n",
            hp_family_known_list(fams, sizeof fams));
    cli_print_options(out, t);
}

/* A seed is any unsigned 64-bit value, in decimal: no sign, no spaces, nothing clamped. */
static bool parse_seed(const char *s, uint64_t *out)
{
    if (!*s) return false;
    uint64_t v = 0;
    for (const char *c = s; *c; c++) {
        if (*c < '0' || *c > '9') return false;
        unsigned d = (unsigned)(*c - '0');
        if (v > (UINT64_MAX - d) / 10) return false; /* would overflow */
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

int cmd_gen(int argc, char **argv)
{
    hp_gen_opts o;
    hp_gen_opts_default(&o);
    o.family = NULL;
    const char *out = NULL;
    bool layout_given = false;
    int c;
    hp_gen_opts d;
    hp_gen_opts_default(&d);
    cli_opt table[N_FIXED_OPTS + N_INT_OPTS + 1];
    char help[N_INT_OPTS][160];
    gen_table(table, help, &d);
    cli_parser cp = {.cmd = "gen", .opts = table};
    while ((c = cli_getopt(&cp, argc, argv)) != -1) {
        const int_opt *io = NULL;
        for (size_t i = 0; i < N_INT_OPTS; i++)
            if (g_int_opts[i].code == c) io = &g_int_opts[i];
        if (io) {
            if (!cli_parse_i64("gen", io->name, optarg, io->min, io->max, (int64_t *)((char *)&o + io->offset)))
                return HP_EXIT_USAGE;
            continue;
        }
        switch (c) {
        case 'f': o.family = optarg; break;
        case 'o': out = optarg; break;
        case 't': {
            static const hp_dtype dts[] = {HP_DT_F32, HP_DT_BF16, HP_DT_F16};
            if (!cli_parse_dtype("gen", optarg, dts, 3, &o.dtype)) return HP_EXIT_USAGE;
            break;
        }
        case 'L':
            if (!hp_expert_layout_parse(optarg, &o.layout))
                return cli_usage_error("gen", "--expert-layout must be per-expert or batched, got '%s'", optarg);
            layout_given = true;
            break;
        case 's':
            if (!parse_seed(optarg, &o.seed))
                return cli_usage_error("gen", "--seed expects an integer in [0, 18446744073709551615], got '%s'",
                                       optarg);
            break;
        case 'F': o.force = true; break;
        case 'h': usage(stdout, table); return HP_EXIT_OK;
        default: return cli_bad_option("gen", argv);
        }
    }
    if (optind != argc) return cli_usage_error("gen", "unexpected argument '%s'", argv[optind]);
    char fams[HP_FAMILY_LIST_MAX];
    if (!o.family)
        return cli_usage_error("gen", "--family is required (one of %s)", hp_family_known_list(fams, sizeof fams));
    if (!out) return cli_usage_error("gen", "--out DIR is required");
    if (!*out) return cli_usage_error("gen", "--out is empty; give the name of the folder to create");
    hp_err err;
    /* SIGINT / SIGTERM / SIGHUP: gen stops within one piece, removes its temporary (and the folder it made),
     * and the signal is re-raised, so the exit status is the signal's. */
    cli_signals_catch();
    if (hp_gen_checkpoint(&o, out, &err) != HP_OK) return cli_signals_release(cli_fail(&err));
    cli_signals_release(0);
    hp_expert_layout written = hp_gen_layout(&o);
    char layout[96] = ""; /* a dense family has no experts: nothing to say about their layout */
    if (hp_family_is_moe(hp_family_find(o.family)))
        snprintf(layout, sizeof layout, ", layout %s%s", hp_expert_layout_name(written),
                 layout_given && written != o.layout ? ": the family has no other" : "");
    fprintf(stderr, "hyperpar gen: wrote %s/config.json and %s/model.safetensors (%s, %s%s, seed %llu)\n", out, out,
            o.family, hp_dtype_name(o.dtype), layout, (unsigned long long)o.seed);
    return HP_EXIT_OK;
}
