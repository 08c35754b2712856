/*
 * cmd_cost.c — `hyperpar cost MODEL [plan flags] [--format text|json]`: what a plan costs each rank.
 *
 * This first slice reports the weight bytes each rank holds, exactly: the bytes of the tensors in that rank's
 * `hyperpar shard` file, from the same shard layout (so it works in meta mode too, from config.json alone).
 * Communication, activations and training state come next (issue 14).
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"
#include "hyperpar/shard.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: hyperpar cost MODEL [--mesh SPEC | --dp N --cp N --tp N] [--ep N [--ep-axis]]\n"
            "                     [--no-sequence-parallel] [--loss-parallel] [--overrides F] [--packed-fused]\n"
            "                     [--allow-uncovered] [--freeze GLOB]... [--plan plan.json] [--format text|json]\n"
            "\n"
            "What MODEL's plan costs each rank of the mesh. MODEL is a checkpoint or a config.json (meta mode).\n"
            "Today: the weight bytes of every rank, exact (the tensors of its 'hyperpar shard' file, in the\n"
            "checkpoint's dtypes), and the most-loaded rank. Communication, activations and training state\n"
            "are not reported yet.\n"
            "\n"
            "  --format F   text (default) or json: {\"world\", \"total_weight_bytes\", \"max_weight_bytes\",\n"
            "               \"max_rank\", \"ranks\": [{\"rank\", \"coords\", \"weight_bytes\"}, ...]}\n"
            "  plan flags   as 'hyperpar plan' (see its --help); --plan reads a plan file instead\n");
}

static int report(const hp_model *m, const hp_plan *p, const hp_shard_layout *l, bool json)
{
    int64_t max_r = 0;
    uint64_t total = hp_model_total_bytes(m);
    for (int64_t r = 0; r < l->world; r++)
        if (l->ranks[r].nbytes > l->ranks[max_r].nbytes) max_r = r;
    char mesh[160], coords[160], b1[32], b2[32];
    hp_mesh_str(&p->mesh, mesh, sizeof mesh);
    if (json) {
        printf("{\"model\": ");
        cli_json_str(m->path);
        printf(", \"mesh\": ");
        cli_json_str(mesh);
        printf(", \"world\": %lld, \"total_weight_bytes\": %llu, \"max_weight_bytes\": %llu, \"max_rank\": %lld, "
               "\"ranks\": [",
               (long long)l->world, (unsigned long long)total, (unsigned long long)l->ranks[max_r].nbytes,
               (long long)max_r);
        for (int64_t r = 0; r < l->world; r++) {
            printf("%s{\"rank\": %lld, \"coords\": ", r ? ", " : "", (long long)r);
            cli_json_str(hp_shard_coords_str(l, r, coords, sizeof coords));
            printf(", \"weight_bytes\": %llu}", (unsigned long long)l->ranks[r].nbytes);
        }
        printf("]}\n");
        return HP_EXIT_OK;
    }
    printf("model    %s (%s)\nmesh     %s\nweights  %s in the checkpoint; per rank (exact: its shard file's tensors):\n",
           m->path, m->model_type[0] ? m->model_type : "?", mesh, hp_format_bytes(total, b1, sizeof b1));
    int64_t shown = l->world < 64 ? l->world : 64;
    for (int64_t r = 0; r < shown; r++)
        printf("  rank %-6lld %-28s %12s  %5.1f%%\n", (long long)r, hp_shard_coords_str(l, r, coords, sizeof coords),
               hp_format_bytes(l->ranks[r].nbytes, b1, sizeof b1),
               total ? 100.0 * (double)l->ranks[r].nbytes / (double)total : 0.0);
    if (shown < l->world) printf("  ... %lld more ranks (--format json lists them all)\n", (long long)(l->world - shown));
    printf("most-loaded rank %lld: %s (an even split of the %s checkpoint over all %lld ranks would be %s)\n",
           (long long)max_r, hp_format_bytes(l->ranks[max_r].nbytes, b1, sizeof b1),
           hp_format_bytes(total, b2, sizeof b2), (long long)l->world,
           hp_format_bytes(total / (uint64_t)l->world, coords, sizeof coords));
    printf("not reported yet: communication per step, activations and KV cache, training state\n");
    return HP_EXIT_OK;
}

int cmd_cost(int argc, char **argv)
{
    enum { O_PLAN = 1000, O_FORMAT };
    static const struct option opts[] = {
        CLI_OPT_MESH, CLI_OPT_EP, CLI_OPT_PLAN,
        {"plan", required_argument, NULL, O_PLAN}, {"format", required_argument, NULL, O_FORMAT},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    cli_plan_flags pf;
    cli_plan_flags_init(&pf);
    const char *plan_path = NULL;
    bool json = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int pr = cli_plan_flag("cost", c, optarg, &pf);
        if (pr < 0) return HP_EXIT_USAGE;
        if (pr > 0) continue;
        switch (c) {
        case O_PLAN: plan_path = optarg; break;
        case O_FORMAT:
            if (strcmp(optarg, "text") && strcmp(optarg, "json"))
                return cli_usage_error("cost", "--format must be text or json, got '%s'", optarg);
            json = !strcmp(optarg, "json");
            break;
        case 'h': usage(stdout); return HP_EXIT_OK;
        default: return cli_bad_option("cost", argv);
        }
    }
    if (optind != argc - 1) return cli_usage_error("cost", "expected exactly one MODEL");
    if (plan_path && pf.any)
        return cli_usage_error("cost", "give either --plan or the plan flags (--mesh, --tp, --ep, ...), not both");
    int rc = cli_plan_flags_mesh("cost", &pf, 1);
    if (rc != HP_EXIT_OK) return rc;
    hp_err err;
    hp_overrides *ov = NULL;
    hp_model *m = NULL;
    hp_plan *p = NULL;
    hp_shard_layout *l = NULL;
    hp_status st = cli_plan_flags_apply(&pf, NULL, &ov, &err);
    if (st == HP_OK) st = hp_model_open(&m, argv[optind], NULL, &err);
    for (int i = 0; st == HP_OK && i < pf.n_freeze; i++)
        if (hp_model_freeze(m, pf.freeze[i]) == 0)
            fprintf(stderr, "hyperpar: warning: --freeze '%s' matched no parameter\n", pf.freeze[i]);
    if (st == HP_OK) st = plan_path ? hp_shard_read_plan(&p, m, plan_path, NULL, &err) : hp_plan_derive(&p, m, &pf.po, &err);
    if (st == HP_OK) st = hp_shard_layout_build(&l, m, p, &err);
    rc = st == HP_OK ? report(m, p, l, json) : cli_fail(&err);
    hp_shard_layout_free(l);
    hp_plan_free(p);
    hp_model_close(m);
    hp_overrides_free(ov);
    return rc;
}
