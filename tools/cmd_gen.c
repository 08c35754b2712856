/*
 * cmd_gen.c — `hyperpar gen --family F --out DIR [...]`: a tiny deterministic random checkpoint.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cli.h"
#include "signals.h"
#include "hyperpar/gen.h"

typedef struct gen_args {
    hp_gen_opts o;
    const char *out;
} gen_args;

static bool seed_fn(const cli_ctx *x);

static const cli_enum g_dtypes = {"must be", {{"f32", HP_DT_F32, false}, {"bf16", HP_DT_BF16, false},
                                              {"f16", HP_DT_F16, false}}};

/* gen's option table; each integer option's help gets its range and default appended (gen_table). The ranges
 * are the bounds hp_gen_config_text checks. */
#define DIM(n, c, h, m, hi) {n, c, "N", h, 0, NULL, CLI_INT(gen_args, o.m, 1, hi)}
static const cli_opt g_opts[] = {
    {"family", 'f', "F", "the model family (see above)", 0, NULL, CLI_STR(gen_args, o.family)},
    {"out", 'o', "DIR", "the folder to write", 0, NULL, CLI_STR(gen_args, out)},
    {"dtype", 't', "f32|bf16|f16", "storage dtype (f32)", 0, NULL, CLI_ENUM(gen_args, o.dtype, g_dtypes)},
    {"expert-layout", 'L', "L", "per-expert (hub names, default) or batched; gpt-oss is always batched", 0, NULL,
     CLI_FN(gen_args, o.layout, cli_layout_fn)},
    {"seed", 's', "S", "random seed, 0..18446744073709551615 (0)", 0, NULL, CLI_FN(gen_args, o.seed, seed_fn)},
    {"force", 'F', NULL, "write into a non-empty DIR", 0, NULL, CLI_FLAG(gen_args, o.force)},
    CLI_OPT_HELP,
    DIM("layers", 'l', "decoder layers", layers, HP_GEN_MAX_DIM),
    DIM("hidden", 'H', "hidden size", hidden, HP_GEN_MAX_DIM),
    DIM("heads", 'a', "attention heads", heads, HP_GEN_MAX_DIM),
    DIM("kv-heads", 'k', "key/value heads, a divisor of --heads (DeepSeek-V3: equal to --heads)", kv_heads,
        HP_GEN_MAX_DIM),
    DIM("head-dim", 'D', "head dimension", head_dim, HP_GEN_MAX_DIM),
    DIM("intermediate", 'i', "dense MLP width; Mixtral and gpt-oss experts use it too", intermediate, HP_GEN_MAX_DIM),
    DIM("moe-intermediate", 'm', "expert width", moe_intermediate, HP_GEN_MAX_DIM),
    DIM("experts", 'e', "routed experts", experts, HP_GEN_MAX_EXPERTS),
    DIM("top-k", 'K', "experts per token, at most --experts", top_k, HP_GEN_MAX_EXPERTS),
    DIM("vocab", 'V', "vocabulary size", vocab, HP_GEN_MAX_DIM),
    {0},
};
#undef DIM
#define N_OPTS (sizeof g_opts / sizeof *g_opts - 1)

static void about(FILE *out)
{
    char fams[HP_FAMILY_LIST_MAX];
    fprintf(out,
            "Writes DIR/config.json and DIR/model.safetensors: a tiny model of family F with random\n"
            "weights, the same bytes for the same options and seed. Families: %s.\n",
            hp_family_known_list(fams, sizeof fams));
}

const cli_command cli_cmd_gen = {
    .cmd = "gen",
    .summary = "write a tiny random checkpoint of a supported family",
    .forms = {{NULL, "--family --out"}},
    .about_more = about,
    .opts = g_opts,
    .run = cmd_gen,
};

/* g_opts with the range and default (of d) after each integer option's help, written into help[]. */
static void gen_table(cli_opt t[N_OPTS + 1], char help[N_OPTS][160], const gen_args *d)
{
    for (size_t i = 0; i <= N_OPTS; i++) {
        t[i] = g_opts[i];
        if (t[i].kind != CLI_K_INT) continue;
        int64_t v;
        memcpy(&v, (const char *)d + t[i].off, sizeof v);
        snprintf(help[i], sizeof help[i], "%s, %lld..%lld (%lld)", t[i].help, (long long)t[i].lo, (long long)t[i].hi,
                 (long long)v);
        t[i].help = help[i];
    }
}

/* A seed is any unsigned 64-bit value, in decimal: no sign, no spaces, nothing clamped. */
static bool seed_fn(const cli_ctx *x)
{
    const char *s = x->arg;
    uint64_t v = 0;
    bool ok = *s != '\0';
    for (const char *c = s; *c && ok; c++) {
        unsigned d = (unsigned)(*c - '0');
        ok = *c >= '0' && *c <= '9' && v <= (UINT64_MAX - d) / 10; /* a digit, and no overflow */
        v = v * 10 + d;
    }
    if (!ok)
        return cli_usage_error(x->cmd, "--seed expects an integer in [0, 18446744073709551615], got '%s'", s), false;
    *(uint64_t *)cli_target(x) = v;
    return true;
}

int cmd_gen(int argc, char **argv)
{
    gen_args a, d;
    hp_gen_opts_default(&a.o);
    a.o.family = NULL;
    a.out = NULL;
    d = a;
    cli_opt table[N_OPTS + 1];
    char help[N_OPTS][160];
    gen_table(table, help, &d);
    cli_command c = cli_cmd_gen;
    c.opts = table;
    cli_parser cp = {.command = &c};
    int rc = cli_parse(&cp, &a, argc, argv);
    if (rc != HP_EXIT_OK) return rc == CLI_HELP ? HP_EXIT_OK : rc;
    hp_gen_opts o = a.o;
    const char *out = a.out;
    bool layout_given = cli_given(&cp, 'L');
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
