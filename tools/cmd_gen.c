/*
 * cmd_gen.c — `hyperpar gen --family F --out DIR [...]`: a tiny deterministic random checkpoint.
 */
#include <string.h>

#include "cli.h"
#include "hyperpar/gen.h"

static void usage(FILE *out, const hp_gen_opts *d)
{
    fprintf(out,
            "usage: hyperpar gen --family F --out DIR [options]\n"
            "\n"
            "Writes DIR/config.json and DIR/model.safetensors: a tiny model of family F with random\n"
            "weights, the same bytes for the same options and seed. Families: %s.\n"
            "\n"
            "  --layers N           decoder layers (%lld)\n"
            "  --hidden H           hidden size (%lld)\n"
            "  --heads N            attention heads (%lld)\n"
            "  --kv-heads N         key/value heads (%lld)\n"
            "  --head-dim D         head dimension (%lld)\n"
            "  --intermediate I     dense MLP width; Mixtral and gpt-oss experts use it too (%lld)\n"
            "  --moe-intermediate I expert width (%lld)\n"
            "  --experts E          routed experts (%lld)\n"
            "  --top-k K            experts per token (%lld)\n"
            "  --vocab V            vocabulary size (%lld)\n"
            "  --dtype f32|bf16|f16 storage dtype (f32)\n"
            "  --expert-layout L    per-expert (hub names, default) or batched\n"
            "  --seed S             random seed (0)\n"
            "  --force              write into a non-empty DIR\n",
            hp_family_known_list(), (long long)d->layers, (long long)d->hidden, (long long)d->heads,
            (long long)d->kv_heads, (long long)d->head_dim, (long long)d->intermediate,
            (long long)d->moe_intermediate, (long long)d->experts, (long long)d->top_k, (long long)d->vocab);
}

int cmd_gen(int argc, char **argv)
{
    static const struct option opts[] = {
        {"family", required_argument, NULL, 'f'},   {"out", required_argument, NULL, 'o'},
        {"layers", required_argument, NULL, 'l'},   {"hidden", required_argument, NULL, 'H'},
        {"heads", required_argument, NULL, 'a'},    {"kv-heads", required_argument, NULL, 'k'},
        {"head-dim", required_argument, NULL, 'D'}, {"intermediate", required_argument, NULL, 'i'},
        {"moe-intermediate", required_argument, NULL, 'm'}, {"experts", required_argument, NULL, 'e'},
        {"top-k", required_argument, NULL, 'K'},    {"vocab", required_argument, NULL, 'V'},
        {"dtype", required_argument, NULL, 't'},    {"expert-layout", required_argument, NULL, 'L'},
        {"seed", required_argument, NULL, 's'},     {"force", no_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    hp_gen_opts o;
    hp_gen_opts_default(&o);
    o.family = NULL;
    const char *out = NULL;
    int c;
    int64_t seed;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int64_t *dst = NULL;
        const char *name = NULL;
        switch (c) {
        case 'f': o.family = optarg; break;
        case 'o': out = optarg; break;
        case 'l': dst = &o.layers, name = "--layers"; break;
        case 'H': dst = &o.hidden, name = "--hidden"; break;
        case 'a': dst = &o.heads, name = "--heads"; break;
        case 'k': dst = &o.kv_heads, name = "--kv-heads"; break;
        case 'D': dst = &o.head_dim, name = "--head-dim"; break;
        case 'i': dst = &o.intermediate, name = "--intermediate"; break;
        case 'm': dst = &o.moe_intermediate, name = "--moe-intermediate"; break;
        case 'e': dst = &o.experts, name = "--experts"; break;
        case 'K': dst = &o.top_k, name = "--top-k"; break;
        case 'V': dst = &o.vocab, name = "--vocab"; break;
        case 't':
            if (!strcmp(optarg, "f32")) o.dtype = HP_DT_F32;
            else if (!strcmp(optarg, "bf16")) o.dtype = HP_DT_BF16;
            else if (!strcmp(optarg, "f16")) o.dtype = HP_DT_F16;
            else return cli_usage_error("gen", "--dtype must be f32, bf16 or f16, got '%s'", optarg);
            break;
        case 'L':
            if (!hp_expert_layout_parse(optarg, &o.layout))
                return cli_usage_error("gen", "--expert-layout must be per-expert or batched, got '%s'", optarg);
            break;
        case 's':
            if (!cli_parse_i64("gen", "--seed", optarg, 0, INT64_MAX, &seed)) return HP_EXIT_USAGE;
            o.seed = (uint64_t)seed;
            break;
        case 'F': o.force = true; break;
        case 'h': {
            hp_gen_opts d;
            hp_gen_opts_default(&d);
            usage(stdout, &d);
            return HP_EXIT_OK;
        }
        default: return cli_bad_option("gen", argv);
        }
        if (dst && !cli_parse_i64("gen", name, optarg, 1, 65536, dst)) return HP_EXIT_USAGE;
    }
    if (optind != argc) return cli_usage_error("gen", "unexpected argument '%s'", argv[optind]);
    if (!o.family) return cli_usage_error("gen", "--family is required (one of %s)", hp_family_known_list());
    if (!out) return cli_usage_error("gen", "--out DIR is required");
    hp_err err;
    if (hp_gen_checkpoint(&o, out, &err) != HP_OK) return cli_fail(&err);
    fprintf(stderr, "hyperpar gen: wrote %s/config.json and %s/model.safetensors (%s, %s, layout %s, seed %llu)\n",
            out, out, o.family, hp_dtype_name(o.dtype), hp_expert_layout_name(o.layout), (unsigned long long)o.seed);
    return HP_EXIT_OK;
}
