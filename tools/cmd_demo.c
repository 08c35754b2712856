/*
 * cmd_demo.c — `hyperpar demo [--out DIR] [--family F]`: the main job end to end on a tiny generated model.
 *
 * Today: gen → inspect (checkpoint) → inspect (meta mode from config.json) → check that meta mode
 * synthesises exactly the checkpoint's tensors → plan (tp=2, ep=2). Each later capability adds its step.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "hyperpar/gen.h"
#include "hyperpar/model.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: hyperpar demo [--out DIR] [--family F]\n"
            "\n"
            "Generates a tiny MoE checkpoint (qwen3_moe by default) and walks through what hyperpar does\n"
            "with it. Without --out the files go to a temporary folder that is removed afterwards.\n");
}

static void step(int n, const char *what) { printf("\n== step %d: %s\n", n, what); }

/* The meta-mode table must list the same tensors, shapes and dtypes as the checkpoint. */
static int compare_tables(const hp_model *real, const hp_model *meta)
{
    if (real->n_params != meta->n_params) {
        printf("MISMATCH: checkpoint has %zu tensors, meta mode %zu\n", real->n_params, meta->n_params);
        return HP_EXIT_VERIFY;
    }
    for (size_t i = 0; i < real->n_params; i++) {
        const hp_param *a = &real->params[i], *b = &meta->params[i];
        if (strcmp(a->name, b->name) || a->dtype != b->dtype || a->n_dims != b->n_dims ||
            memcmp(a->shape, b->shape, (size_t)a->n_dims * sizeof *a->shape)) {
            printf("MISMATCH at %zu: %s vs %s\n", i, a->name, b->name);
            return HP_EXIT_VERIFY;
        }
    }
    printf("meta mode reproduces all %zu tensors of the checkpoint (names, order, shapes, dtypes)\n",
           real->n_params);
    return HP_EXIT_OK;
}

int cmd_demo(int argc, char **argv)
{
    static const struct option opts[] = {
        {"out", required_argument, NULL, 'o'},
        {"family", required_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *out = NULL;
    hp_gen_opts g;
    hp_gen_opts_default(&g);
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'f': g.family = optarg; break;
        case 'h': usage(stdout); return HP_EXIT_OK;
        default: return cli_bad_option("demo", argv);
        }
    }
    if (optind != argc) return cli_usage_error("demo", "unexpected argument '%s'", argv[optind]);

    char tmp[256] = "";
    if (!out) {
        const char *base = getenv("TMPDIR");
        snprintf(tmp, sizeof tmp, "%s/hyperpar-demo-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(tmp)) {
            perror("hyperpar demo: mkdtemp");
            return HP_EXIT_RUNTIME;
        }
        out = tmp;
    } else if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "hyperpar: error: %s: cannot create the folder: %s\n", out, strerror(errno));
        return HP_EXIT_RUNTIME;
    }
    g.force = true;
    char model_dir[512], cfg[600];
    snprintf(model_dir, sizeof model_dir, "%s/model", out);
    snprintf(cfg, sizeof cfg, "%s/config.json", model_dir);

    int rc = HP_EXIT_OK;
    hp_err err;
    hp_model *real = NULL, *meta = NULL;
    step(1, "gen: a tiny random checkpoint");
    printf("$ hyperpar gen --family %s --out %s\n", g.family, model_dir);
    if (hp_gen_checkpoint(&g, model_dir, &err) != HP_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    fflush(stdout);

    step(2, "inspect the checkpoint");
    printf("$ hyperpar inspect %s --tree --depth 4\n", model_dir);
    fflush(stdout);
    {
        char *args[] = {"inspect", model_dir, "--tree", "--depth", "4", NULL};
        optind = 1;
        if ((rc = cmd_inspect(5, args)) != HP_EXIT_OK) goto done;
    }

    step(3, "meta mode: the same model from config.json alone");
    printf("$ hyperpar inspect %s\n", cfg);
    fflush(stdout);
    {
        char *args[] = {"inspect", cfg, NULL};
        optind = 1;
        if ((rc = cmd_inspect(2, args)) != HP_EXIT_OK) goto done;
    }
    if (hp_model_open(&real, model_dir, NULL, &err) != HP_OK || hp_model_open(&meta, cfg, NULL, &err) != HP_OK) {
        rc = cli_fail(&err);
        goto done;
    }
    if ((rc = compare_tables(real, meta)) != HP_EXIT_OK) goto done;

    step(4, "plan: tp=2 with TP-extend-EP over 2 ranks (one MoE boundary shown)");
    printf("$ hyperpar plan %s --tp 2 --ep 2 --format explain --fqn model.layers.0.mlp\n", model_dir);
    fflush(stdout);
    {
        char *args[] = {"plan", model_dir, "--tp", "2", "--ep", "2", "--format", "explain", "--fqn",
                        "model.layers.0.mlp", NULL};
        optind = 1;
        if ((rc = cmd_plan(10, args)) != HP_EXIT_OK) goto done;
    }

    printf("\nNot built yet: shard/merge (per-rank files), moe (MoE over MPI).\n");
done:
    hp_model_close(real);
    hp_model_close(meta);
    fflush(stdout);
    if (tmp[0]) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0) fprintf(stderr, "hyperpar demo: could not remove %s\n", tmp);
    } else {
        printf("files kept in %s\n", out);
    }
    return rc;
}
