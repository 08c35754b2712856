/*
 * cmd_plan.c — `hyperpar plan MODEL [mesh flags] [--format json|explain|hf] [-o FILE]`.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: hyperpar plan MODEL [--mesh dp=2,cp=1,tp=4 | --dp N --cp N --tp N] [--ep N [--ep-axis]]\n"
            "                     [--world N] [--no-sequence-parallel] [--loss-parallel]\n"
            "                     [--format json|explain|hf] [--fqn FQN] [-o FILE] [--freeze GLOB]...\n"
            "                     [--allow-uncovered] [--packed-fused] [--seq-len N]\n"
            "                     [--expert-layout per-expert|batched] [--overrides FILE] [--no-derive]\n"
            "                     [--suggest-overrides]\n"
            "\n"
            "Derives the tensor/sequence/context/expert-parallel sharding plan of MODEL (a checkpoint folder,\n"
            ".safetensors file or config.json) for a device mesh. Same input, byte-identical output.\n"
            "\n"
            "  --mesh SPEC          mesh axes in order with sizes; the product is the world size. Axes: dp, cp,\n"
            "                       tp, ep (explicit old-style EP axis), pp (refused when > 1)\n"
            "  --dp/--cp/--tp N     the mesh (dp, cp, tp) from sizes (default 1 each)\n"
            "  --ep N               expert parallelism: by default TP-extend-EP (D-10), EP groups of N\n"
            "                       consecutive ranks of the dense region; with --ep-axis an explicit ep mesh axis\n"
            "  --world N            check that the mesh has exactly N ranks\n"
            "  --no-sequence-parallel  contracts without sequence parallelism (default: on)\n"
            "  --loss-parallel      keep lm_head logits vocab-sharded\n"
            "  --format F           json (default, docs/plan-format.md), explain (report with the compiled\n"
            "                       boundary collectives), hf (transformers base_model_tp_plan style)\n"
            "  --fqn FQN            with --format explain: only this boundary\n"
            "  -o, --output FILE    write there (atomically) instead of stdout\n"
            "  --freeze GLOB        mark matching parameters non-trainable (repeatable)\n"
            "  --allow-uncovered    uncovered trainable parameters warn instead of failing\n"
            "  --packed-fused       fused gate/up weights get a packed S(d)x2 placement instead of an error\n"
            "  --seq-len N          also check the sequence length against cp (divisible by 2*cp)\n"
            "  --expert-layout L    meta mode: per-expert (default) or batched expert names\n"
            "  --overrides FILE     plan overrides (YAML or JSON list of entries: match, when, params, in_src,\n"
            "                       in_dst, out_src, out_dst, out_names, tp_divide_attrs, is_boundary,\n"
            "                       region_dispatch, local_compute_fn {_target_: ARCHETYPE, ...})\n"
            "  --no-derive          derive=false: the plan holds only the overrides\n"
            "  --suggest-overrides  print the YAML that declares the EP compute of every EP-marked boundary\n"
            "                       (the family's suggested archetype); review it, then pass it with --overrides\n");
}

static int write_output(const char *path, const char *data, size_t len)
{
    if (!path) {
        fwrite(data, 1, len, stdout);
        return HP_EXIT_OK;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fprintf(stderr, "hyperpar: error: %s: cannot create: %s\n", tmp, strerror(errno));
        return HP_EXIT_RUNTIME;
    }
    bool ok = fwrite(data, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "hyperpar: error: %s: write failed: %s\n", path, strerror(errno));
        unlink(tmp);
        return HP_EXIT_RUNTIME;
    }
    return HP_EXIT_OK;
}

int cmd_plan(int argc, char **argv)
{
    enum { O_MESH = 1000, O_DP, O_CP, O_TP, O_EP, O_EP_AXIS, O_WORLD, O_NOSP, O_LP, O_FORMAT, O_FQN, O_FREEZE,
           O_UNCOV, O_PACKED, O_SEQ, O_LAYOUT, O_OVERRIDES, O_NODERIVE, O_SUGGEST };
    static const struct option opts[] = {
        {"mesh", required_argument, NULL, O_MESH},   {"dp", required_argument, NULL, O_DP},
        {"cp", required_argument, NULL, O_CP},       {"tp", required_argument, NULL, O_TP},
        {"ep", required_argument, NULL, O_EP},       {"ep-axis", no_argument, NULL, O_EP_AXIS},
        {"world", required_argument, NULL, O_WORLD}, {"no-sequence-parallel", no_argument, NULL, O_NOSP},
        {"loss-parallel", no_argument, NULL, O_LP},  {"format", required_argument, NULL, O_FORMAT},
        {"fqn", required_argument, NULL, O_FQN},     {"output", required_argument, NULL, 'o'},
        {"freeze", required_argument, NULL, O_FREEZE}, {"allow-uncovered", no_argument, NULL, O_UNCOV},
        {"packed-fused", no_argument, NULL, O_PACKED}, {"seq-len", required_argument, NULL, O_SEQ},
        {"expert-layout", required_argument, NULL, O_LAYOUT}, {"help", no_argument, NULL, 'h'},
        {"overrides", required_argument, NULL, O_OVERRIDES}, {"no-derive", no_argument, NULL, O_NODERIVE},
        {"suggest-overrides", no_argument, NULL, O_SUGGEST},
        {NULL, 0, NULL, 0},
    };
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_model_opts mo = {.layout = HP_LAYOUT_PER_EXPERT};
    const char *mesh_spec = NULL, *format = "json", *fqn = NULL, *output = NULL, *overrides = NULL;
    bool suggest = false;
    const char *freeze[64];
    int n_freeze = 0;
    int64_t dp = 1, cp = 1, tp = 1, ep = 1, world = 0;
    bool sizes_given = false, ep_axis = false;
    hp_err err;
    int c;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        switch (c) {
        case O_MESH: mesh_spec = optarg; break;
        case O_DP: if (!cli_parse_i64("plan", "--dp", optarg, 1, 1 << 20, &dp)) return HP_EXIT_USAGE; sizes_given = true; break;
        case O_CP: if (!cli_parse_i64("plan", "--cp", optarg, 1, 1 << 20, &cp)) return HP_EXIT_USAGE; sizes_given = true; break;
        case O_TP: if (!cli_parse_i64("plan", "--tp", optarg, 1, 1 << 20, &tp)) return HP_EXIT_USAGE; sizes_given = true; break;
        case O_EP: if (!cli_parse_i64("plan", "--ep", optarg, 1, 1 << 20, &ep)) return HP_EXIT_USAGE; break;
        case O_EP_AXIS: ep_axis = true; break;
        case O_WORLD: if (!cli_parse_i64("plan", "--world", optarg, 1, 1 << 30, &world)) return HP_EXIT_USAGE; break;
        case O_NOSP: po.sequence_parallel = false; break;
        case O_LP: po.loss_parallel = true; break;
        case O_FORMAT:
            if (strcmp(optarg, "json") && strcmp(optarg, "explain") && strcmp(optarg, "hf"))
                return cli_usage_error("plan", "--format must be json, explain or hf, got '%s'", optarg);
            format = optarg;
            break;
        case O_FQN: fqn = optarg; break;
        case 'o': output = optarg; break;
        case O_FREEZE:
            if (n_freeze == 64) return cli_usage_error("plan", "at most 64 --freeze patterns");
            freeze[n_freeze++] = optarg;
            break;
        case O_UNCOV: po.allow_uncovered = true; break;
        case O_PACKED: po.packed_fused = true; break;
        case O_SEQ: if (!cli_parse_i64("plan", "--seq-len", optarg, 1, INT64_MAX / 4, &po.seq_len)) return HP_EXIT_USAGE; break;
        case O_LAYOUT:
            if (!hp_expert_layout_parse(optarg, &mo.layout))
                return cli_usage_error("plan", "--expert-layout must be per-expert or batched, got '%s'", optarg);
            break;
        case O_OVERRIDES: overrides = optarg; break;
        case O_NODERIVE: po.derive = false; break;
        case O_SUGGEST: suggest = true; break;
        case 'h': usage(stdout); return HP_EXIT_OK;
        default: return cli_bad_option("plan", argv);
        }
    }
    if (optind != argc - 1) return cli_usage_error("plan", "expected exactly one MODEL");
    if (mesh_spec && sizes_given) return cli_usage_error("plan", "give either --mesh or --dp/--cp/--tp, not both");

    int mrc = cli_mesh("plan", mesh_spec, dp, cp, tp, ep, ep_axis, &po.mesh);
    if (mrc != HP_EXIT_OK) return mrc;
    if (world && hp_mesh_world(&po.mesh) != world) {
        char buf[256];
        err.status = HP_ERR_INPUT;
        snprintf(err.msg, sizeof err.msg,
                 "the mesh %s has %lld ranks but the world size is %lld; the product of the mesh sizes must equal "
                 "the number of ranks",
                 hp_mesh_str(&po.mesh, buf, sizeof buf), (long long)hp_mesh_world(&po.mesh), (long long)world);
        return cli_fail(&err);
    }

    hp_overrides *ov = NULL;
    if (overrides && hp_overrides_load(&ov, overrides, &err) != HP_OK) return cli_fail(&err);
    po.overrides = ov;
    hp_model *m = NULL;
    if (hp_model_open(&m, argv[optind], &mo, &err) != HP_OK) {
        hp_overrides_free(ov);
        return cli_fail(&err);
    }
    for (int i = 0; i < n_freeze; i++)
        if (hp_model_freeze(m, freeze[i]) == 0)
            fprintf(stderr, "hyperpar: warning: --freeze '%s' matched no parameter\n", freeze[i]);
    hp_plan *p = NULL;
    int rc = HP_EXIT_OK;
    if (hp_plan_derive(&p, m, &po, &err) != HP_OK) {
        rc = cli_fail(&err);
    } else {
        hp_buf b;
        hp_buf_init(&b);
        hp_status st = suggest                      ? hp_plan_suggest_overrides(p, &b, &err)
                       : !strcmp(format, "json")    ? hp_plan_to_json(p, &b, &err)
                       : !strcmp(format, "explain") ? hp_plan_explain(p, fqn, &b, &err)
                                                    : hp_plan_to_hf(p, &b, &err);
        if (st != HP_OK) rc = cli_fail(&err);
        else if (b.oom) rc = HP_EXIT_RUNTIME;
        else rc = write_output(output, b.data ? b.data : "", b.len);
        hp_buf_free(&b);
    }
    hp_plan_free(p);
    hp_model_close(m);
    hp_overrides_free(ov);
    return rc;
}
