/*
 * cmd_train.c — `hyperpar train MODEL (--input IDS | --data FILE --seq S --global-batch GB) [--steps N] [--out DIR]
 * [--grad-out G] [AdamW] [schedule] [mesh flags]`: N training steps (hp_runner_accumulate per micro-batch, then
 * hp_runner_apply: forward, backward, AdamW at the schedule's lr) across the ranks of mpirun, as the plan says
 * (docs/train.md). --input trains on the same batch every step; --data reads global batch k of the token file
 * for step k + 1 (hyperpar/data.h: the windows, their order and the schedule are the library's).
 *
 *   --grad-out G   rank 0: grad.<name> F32 at the checkpoint's name and shape for every trainable parameter,
 *                  the first step's gradient, and loss F32 [N], each step's loss (one atomic file).
 *   --out DIR      rank 0: DIR/config.json (the model's, "torch_dtype": "float32") and DIR/model.safetensors,
 *                  every parameter after N steps as F32 under its own name (what was not trained copied as
 *                  stored), written as one folder atomically (hyperpar/outdir.h, as shard --out).
 *
 * What the user sees (rank 0, stderr): a step line every --log-every steps (tokens/s and MFU over the steps since
 * the previous line; MFU against the same-run GEMM limit, hyperpar/cost.h); on a terminal a progress line with
 * the ETA, rewritten in place between them; --log-json FILE, one JSON object per step; --plot FILE.html at the
 * end, the curves of the steps this run took (tools/html.c).
 */
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <dirent.h>
#include <jansson.h>

#include "cli.h"
#include "costflags.h"
#include "signals.h"
#include "testhooks.h"
#include "hyperpar/comm.h"
#include "hyperpar/cost.h"
#include "hyperpar/data.h"
#include "hyperpar/moe.h"
#include "hyperpar/outdir.h"
#include "hyperpar/overrides.h"
#include "hyperpar/run.h"
#include "hyperpar/safetensors.h"
#include "hyperpar/shard.h"
#include "hyperpar/trainckpt.h"

/* A line of train's own on stderr (rank 0 calls it): "train: <fmt>" with the user's paths in it escaped as every
 * message is (a newline or a control byte in a name shows as \xNN, never breaking or driving the terminal). */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cli_vsay("train: ", 0, fmt, ap);
    va_end(ap);
}

enum {
    O_PLAN = 300, O_STEPS, O_OUT, O_GRAD, O_LR, O_B1, O_B2, O_EPS, O_WD, O_FORCE, O_ZERO, O_CLIP, O_DATA, O_DDTYPE,
    O_SEQ, O_GB, O_MB, O_SHUFFLE, O_SEED, O_WARMUP, O_SCHED, O_MINLR, O_EVAL, O_EVERY, O_LOGJSON, O_SKIPNF,
    O_SAVE, O_RESUME, O_STOP, O_STATS, O_LOGEVERY, O_PLOT, O_COMPUTE
};
#define G_PLAN "the plan (as 'hyperpar plan' derives it; default: a shard folder's own, else --tp = the processes)"
#define G_OPT "AdamW (torch.optim.AdamW's defaults)"
#define G_DATA "token data (docs/train.md, \"Data, batches and schedule\")"
#define G_SCHED "the learning-rate schedule, for step t = 1..N"

static const cli_opt g_opts[] = {
    CLI_OPT_HELP,
    {"input", 'i', "IDS", "safetensors with input_ids I64 (or I32) [B, S]; the same file on every rank; every\n"
                          "step trains on this batch", CLI_SHORT, NULL},
    {"steps", O_STEPS, "N", "training steps (default 1); the schedule runs over them", 0, NULL},
    {"save-every", O_SAVE, "K", "with --out DIR: every K steps (and at the last one) a checkpoint DIR/step-<t>: a\n"
                                "model folder (config.json, model.safetensors) and every rank's training state,\n"
                                "written whole or not at all (a kill or a full disk mid-save leaves the earlier\n"
                                "ones intact); 'hyperpar merge DIR' turns the last into a Hugging Face folder",
     0, NULL},
    {"resume", O_RESUME, "CKPT", "continue the run of checkpoint CKPT (a DIR/step-<t> folder, or DIR: its last\n"
                                 "complete one) with the same flags, model config and data (by its bytes): the\n"
                                 "same parameters, optimizer state and step, so the result equals the\n"
                                 "uninterrupted run's bit for bit; every file is checked against the sizes and\n"
                                 "hashes its state.json records", 0, NULL},
    {"stop-after", O_STOP, "K", "end after step K (with --save-every: its checkpoint), as a time limit would;\n"
                                "the schedule still follows --steps", 0, NULL},
    {"log-json", O_LOGJSON, "FILE", "rank 0 writes one JSON object per line and step: step, loss, grad_norm\n"
                                    "(before clipping), lr, tokens_per_s, step_s, mfu (and eval_loss where\n"
                                    "evaluated, run_id with checkpoints); a new file (--force replaces one),\n"
                                    "or after --resume the run's own log, continued", 0, NULL},
    {"log-every", O_LOGEVERY, "N", "rank 0 prints a step line every N steps (default 1), and always at the last\n"
                                   "step, a skipped one and one that evaluates; its tokens/s and mfu are over the\n"
                                   "steps since the previous line", 0, NULL},
    {"plot", O_PLOT, "FILE.html", "rank 0 writes the loss (and eval loss) and gradient-norm curves of the steps\n"
                                  "this run took as one self-contained page (inline SVG, no network), atomically,\n"
                                  "when the run ends well", 0, NULL},
    {"stats-json", O_STATS, "FILE", "rank 0 writes every rank's statistics after the last step, run's\n"
                                    "--stats-json with the training state's bytes (grad_bytes, optim_bytes,\n"
                                    "master_bytes, saved_bytes: what 'hyperpar cost --mode train' predicts)", 0, NULL},
    {"data", O_DATA, "FILE", "train on a token file instead of --input: a flat little-endian token stream\n"
                             "(.bin, see --data-dtype) or a .safetensors with input_ids I64/I32 [N, S]",
     0, G_DATA},
    {"data-dtype", O_DDTYPE, "T", "uint16 (default) or uint32: the stream's token type", 0, G_DATA},
    {"seq", O_SEQ, "S", "window length: a stream's window is S + 1 tokens (S scored positions);\n"
                        "a safetensors input_ids must be [N, S]", 0, G_DATA},
    {"global-batch", O_GB, "GB", "windows per step (every rank reads the same; dp splits them)", 0, G_DATA},
    {"micro-batch", O_MB, "MB", "rows per dp replica in one forward/backward (Megatron's and cost's meaning); MB x dp\n"
                                "divides GB: GB/(MB x dp) accumulated (default: GB/dp, one micro-batch a step)", 0,
     G_DATA},
    {"shuffle", O_SHUFFLE, "M", "seeded (default: each epoch's windows shuffled from --seed) or none", 0, G_DATA},
    {"seed", O_SEED, "N", "the shuffle's seed, an unsigned 64-bit integer (default 0)", 0, G_DATA},
    {"eval-data", O_EVAL, "FILE", "a held-out token file (same --data-dtype and --seq): every --eval-every\n"
                                  "K steps, its mean loss over all its windows (forward only)", 0, G_DATA},
    {"eval-every", O_EVERY, "K", "steps between evaluations of --eval-data", 0, G_DATA},
    {"schedule", O_SCHED, "KIND", "cosine (default with --data), linear or constant (default with --input)", 0,
     G_SCHED},
    {"warmup", O_WARMUP, "W", "warmup steps: lr·t/W for t <= W (default 0)", 0, G_SCHED},
    {"min-lr", O_MINLR, "X", "where cosine and linear end at step N, in [0, --lr] (default 0)", 0, G_SCHED},
    {"out", 'o', "DIR", "rank 0 writes a checkpoint folder: config.json and model.safetensors, every\n"
                        "parameter after the last step as F32 (atomically; refused when DIR is not empty)", CLI_SHORT,
     NULL},
    {"force", O_FORCE, NULL, "replace an earlier 'hyperpar train' output in DIR (its marker and nothing but\n"
                             "its files; never any other folder), and an existing --log-json file", 0, NULL},
    {"grad-out", O_GRAD, "G", "rank 0 writes grad.<name> F32 (the first step's gradient of every trainable\n"
                              "parameter) and loss F32 [N] (each step's loss), atomically", 0, NULL},
    {"threads", 't', "N", "threads per rank for the GEMMs (default: OMP_NUM_THREADS when set, else this\n"
                          "process's cores divided by the ranks on its node)", 0, NULL},
    {"lr", O_LR, "X", "learning rate, > 0 (1e-3)", 0, G_OPT},
    {"beta1", O_B1, "X", "first moment decay, in [0, 1) (0.9)", 0, G_OPT},
    {"beta2", O_B2, "X", "second moment decay, in [0, 1) (0.999)", 0, G_OPT},
    {"eps", O_EPS, "X", "added to the denominator, > 0 (1e-8)", 0, G_OPT},
    {"weight-decay", O_WD, "X", "decoupled weight decay, >= 0 (0.01)", 0, G_OPT},
    {"clip", O_CLIP, "NORM", "scale the gradients by NORM / (norm + 1e-6) when their global norm (every\n"
                             "element counted once over the ranks) exceeds NORM, as torch's clip_grad_norm_;\n"
                             "the norm is printed every step (default: off)", 0, G_OPT},
    {"skip-nonfinite", O_SKIPNF, NULL, "skip a step whose gradients, or AdamW update, are not all finite (no\n"
                                       "update: parameters and moments as they were; counted) instead of ending\n"
                                       "the run with exit 3 naming the first such parameter", 0, G_OPT},
    {"compute", O_COMPUTE, "M", "exact (default: f32 products) or bf16: both operands of every matrix product\n"
                                "rounded to bf16, f32 sums, as torch.autocast(bfloat16) multiplies; f32 master\n"
                                "weights, AdamW state, norms, softmax, router and loss", 0, G_OPT},
    {"zero", O_ZERO, "S", "0 (default) or 1: ZeRO-1, each rank keeps AdamW's moments of its block of what it\n"
                          "shares with the other dp ranks (routed experts: with their expert-data-parallel\n"
                          "group); the same numbers", 0, G_OPT},
    CLI_OPTS_MESH(G_PLAN),
    CLI_OPTS_EP(G_PLAN),
    CLI_OPTS_PLAN(G_PLAN),
    {"plan", O_PLAN, "plan.json", "a plan written by 'hyperpar plan' instead of deriving one", 0, G_PLAN},
    {0},
};

/* The GEMM limit MFU is measured against: 512³ (268 MFLOP, 3 MiB of f32 operands per rank) takes a few ms
 * a product at tens to hundreds of GFLOP/s, so measuring it costs a training run a fraction of a second; best of
 * 10 because a short product is easily disturbed on a shared machine. */
#define TRAIN_GEMM_N 512
#define TRAIN_GEMM_REPS 10

static void usage(FILE *out)
{
    fprintf(out,
            "usage: [mpirun -np N] hyperpar train MODEL --input IDS.safetensors [--steps N] [--out DIR [--force]]\n"
            "   or: [mpirun -np N] hyperpar train MODEL --data FILE [--data-dtype uint16|uint32] --seq S\n"
            "                        --global-batch GB [--micro-batch MB] [--shuffle none|seeded] [--seed N]\n"
            "                        [--eval-data FILE --eval-every K] [--steps N] [--out DIR [--force]]\n"
            "       common options:  [--save-every K] [--resume CKPT] [--stop-after K] [--skip-nonfinite]\n"
            "                        [--schedule constant|linear|cosine] [--warmup W] [--min-lr X] [--log-json F]\n"
            "                        [--log-every N] [--plot F.html]\n"
            "                        [--grad-out G.safetensors] [--lr X] [--beta1 X] [--beta2 X] [--eps X]\n"
            "                        [--weight-decay X] [--clip NORM] [--zero 0|1] [--compute exact|bf16]\n"
            "                        [--threads N]\n"
            "                        [--mesh SPEC | --dp N --cp N --tp N] [--ep N [--ep-axis]] [--packed-fused]\n"
            "                        [--no-sequence-parallel] [--loss-parallel] [--overrides F] [--freeze GLOB]\n"
            "                        [--ep-compute suggested|ARCHETYPE] [--plan plan.json]\n"
            "\n"
            "Trains MODEL for N steps, on the same batch (--input) or on the global batches of a token file\n"
            "(--data), across the ranks exactly as its plan says: each step runs\n"
            "the forward, the backward of every boundary in reverse (each collective by its dual), sums every\n"
            "parameter's gradient over the ranks that saw other rows of it, and takes an AdamW step on each\n"
            "rank's slices (docs/train.md). Every family 'hyperpar run' runs, dense and MoE (listed in its\n"
            "--help).\n"
            "\n"
            "  MODEL                   a checkpoint folder, or a folder written by 'hyperpar shard' for the mesh\n");
    cli_print_options(out, g_opts);
    fprintf(out,
            "\n"
            "stderr (rank 0): first the model FLOPs per step and the GEMM limit MFU is measured against (an f32\n"
            "512x512x512 product through the GEMM layer, best of %d, on every rank at once, summed over the ranks;\n"
            "a fraction of a second, and its kernels); then a line every --log-every steps: the step's loss, gradient\n"
            "norm and lr, and over the steps since the previous line tokens/s (scored positions per second) and\n"
            "mfu (model FLOPs per second over the limit; a measured limit, so it may pass 1); on a terminal a\n"
            "progress line with the elapsed time and the ETA, rewritten in place (never when stderr is not one,\n"
            "as under mpirun).\n"
            "Under mpirun every rank must be given the same options but --threads (inputs: the same files): a\n"
            "difference exits 2 before any work, naming the rank and the option. A batch this machine cannot hold,\n"
            "a token outside the vocabulary anywhere the run reads, and a last checkpoint that cannot be saved are\n"
            "refused before step 1, creating nothing.\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 bad input or usage (a checkpoint that is not the run's among\n"
            "them), 3 a non-finite gradient or update.\n",
            TRAIN_GEMM_REPS);
}

typedef struct train_args {
    const char *model, *input, *out, *grad_out, *plan;
    const char *data, *eval_data, *log_json, *stats_json, *plot;
    hp_data_dtype dtype;
    int64_t seq, gb, mb, eval_every; /* mb: windows of one micro-step over all replicas (--micro-batch × dp) */
    int64_t mb_rows;                 /* --micro-batch as given: rows per replica (0: one micro-batch a step) */
    hp_data_order order;
    hp_lr_schedule sched;
    bool data_opts, sched_given; /* a --data option / --schedule was given */
    bool dtype_given, seed_given; /* --data-dtype, --seed was given (warn_no_effect) */
    cli_plan_flags pf;
    bool default_mesh, force;
    int64_t steps;
    int64_t save_every, stop_after;
    int64_t log_every; /* --log-every (default 1) */
    const char *resume;
    int threads;
    hp_linalg_mode compute;
    hp_train_opts to;
    char run_id[17];      /* the run's id (bind_start): made at its start, or the resumed checkpoint's */
    char data_sum[17];    /* the XXH64 of --data's (--input's) bytes, and their count: the data's identity */
    uint64_t data_bytes;
    char *model_config;   /* the model's config as checkpoints record it (hp_train_model_config) */
    char cmdline[2048];   /* "hyperpar train ..." as given (shell-quoted), and the plan's mesh: what a checkpoint */
    char mesh[160];       /* records, for a refused resume to print */
} train_args;

/* ---- what rank 0 gathers: a list of whole tensors ---- */

typedef struct tensor_list {
    int n, cap;
    struct entry {
        char *name;
        float *data;
        int n_dims;
        int64_t shape[HP_MAX_DIMS];
    } *e;
} tensor_list;

static void list_free(tensor_list *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->e[i].name);
        free(l->e[i].data);
    }
    free(l->e);
    memset(l, 0, sizeof *l);
}

static hp_status keep(void *ctx, const char *name, const float *data, const int64_t *shape, int n_dims, hp_err *err)
{
    tensor_list *l = ctx;
    if (n_dims < 0 || n_dims > HP_MAX_DIMS)
        return hp_err_set(err, HP_ERR_INPUT, "parameter '%s' has %d dimensions", name, n_dims);
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        void *e = realloc(l->e, (size_t)cap * sizeof *l->e);
        if (!e) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        l->e = e;
        l->cap = cap;
    }
    int64_t n = 1;
    for (int d = 0; d < n_dims; d++) n *= shape[d];
    struct entry *t = &l->e[l->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->data = malloc((size_t)(n > 0 ? n : 1) * sizeof *t->data);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    memcpy(t->data, data, (size_t)n * sizeof *data);
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) t->shape[d] = shape[d];
    l->n++;
    return HP_OK;
}

static const struct entry *list_find(const tensor_list *l, const char *name)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->e[i].name, name)) return &l->e[i];
    return NULL;
}

/* ---- --grad-out ---- */

static hp_status write_grads(const char *path, const tensor_list *g, const float *loss, int64_t steps, hp_err *err)
{
    hp_st_writer *w = hp_st_writer_create();
    if (!w) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_status st = HP_OK;
    char key[1100];
    for (int i = 0; st == HP_OK && i < g->n; i++) {
        snprintf(key, sizeof key, "grad.%s", g->e[i].name);
        st = hp_st_writer_add(w, key, HP_DT_F32, g->e[i].n_dims, g->e[i].shape, g->e[i].data, err);
    }
    if (st == HP_OK) st = hp_st_writer_add(w, "loss", HP_DT_F32, 1, &steps, loss, err);
    if (st == HP_OK) st = hp_st_writer_write(w, path, err);
    hp_st_writer_destroy(w);
    return st;
}

static hp_status read_text(const char *path, char **out, size_t *len, hp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return hp_err_set(err, HP_ERR_INPUT, "%s: cannot read it (%s); --out copies the model's config.json", path,
                              strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 > cap) {
            cap = cap ? 2 * cap : 65536;
            if (cap > ((size_t)64 << 20)) {
                fclose(f);
                free(buf);
                return hp_err_set(err, HP_ERR_INPUT, "%s is larger than 64 MiB; not a config.json", path);
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                fclose(f);
                free(buf);
                return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
    }
    bool failed = ferror(f);
    fclose(f);
    if (failed) {
        free(buf);
        return hp_err_set(err, HP_ERR_IO, "%s: read error", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return HP_OK;
}

/* ---- --out: model.safetensors ---- */

typedef struct copy_ctx {
    const hp_st_file *f;
    const hp_st_tensor *t;
    uint64_t off;
} copy_ctx;

/* Streams a tensor not trained (frozen, not in the plan) from the checkpoint as stored. */
static hp_status copy_fill(void *ctx, void *dst, size_t nbytes, hp_err *err)
{
    copy_ctx *c = ctx;
    hp_status st = hp_st_read(c->f, c->t, c->off, dst, nbytes, err);
    c->off += nbytes;
    return st;
}

/* config.json (torch_dtype float32) and model.safetensors of the trained parameters (the rest copied as stored):
 * as the folder of (of), begun and committed here, or (of NULL) into the existing folder dir. */
static hp_status write_folder(const train_args *a, const hp_model *m, const tensor_list *p, hp_outdir *of,
                              const char *dir, hp_err *err)
{
    char cfg_path[PATH_MAX + 16];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", m->ckpt ? hp_ckpt_dir(m->ckpt) : a->model);
    char *text = NULL, *cfg = NULL;
    size_t tlen = 0;
    hp_status st = read_text(cfg_path, &text, &tlen, err);
    if (st == HP_OK) st = hp_config_set_dtype(cfg_path, text, tlen, "float32", &cfg, err);
    free(text);
    size_t n_ck = m->ckpt ? hp_ckpt_count(m->ckpt) : 0;
    copy_ctx *cc = hp_calloc(n_ck + 1, sizeof *cc);
    if (st == HP_OK && !cc) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    /* Without the checkpoint (a shard folder), every parameter must have been trained. */
    for (size_t i = 0; st == HP_OK && !m->ckpt && i < m->n_params; i++)
        if (!list_find(p, m->params[i].name))
            st = hp_err_set(err, HP_ERR_INPUT, "%s: parameter '%s' is not trained (frozen or not in the plan) and a "
                            "shard folder does not hold it whole; train the checkpoint itself to write --out",
                            a->model, m->params[i].name);
    hp_st_writer *w = st == HP_OK ? hp_st_writer_create() : NULL;
    if (st == HP_OK && !w) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == HP_OK && i < n_ck; i++) {
        const hp_ckpt_tensor *ct = hp_ckpt_at(m->ckpt, i);
        const struct entry *e = list_find(p, ct->t->name);
        if (e) {
            st = hp_st_writer_add(w, e->name, HP_DT_F32, e->n_dims, e->shape, e->data, err);
        } else {
            cc[i] = (copy_ctx){.f = ct->file, .t = ct->t};
            st = hp_st_writer_add_fill(w, ct->t->name, ct->t->dtype, ct->t->n_dims, ct->t->shape, copy_fill, &cc[i],
                                       err);
        }
    }
    /* Trained parameters the checkpoint does not list (none for the families today) are written too. */
    for (int i = 0; st == HP_OK && i < p->n; i++)
        if (!m->ckpt || !hp_ckpt_find(m->ckpt, p->e[i].name))
            st = hp_st_writer_add(w, p->e[i].name, HP_DT_F32, p->e[i].n_dims, p->e[i].shape, p->e[i].data, err);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "format", "pt", err);
    bool begun = of && st == HP_OK; /* a checkpoint's folder was begun by its caller (of NULL: write into dir) */
    if (begun) st = hp_outdir_begin(of, err);
    const char *into = of ? hp_outdir_tmp(of) : dir;
    if (st == HP_OK) {
        char path[PATH_MAX + 96];
        snprintf(path, sizeof path, "%s/config.json", into);
        st = cli_write_atomic_err(path, cfg, strlen(cfg), "config.json", err);
        snprintf(path, sizeof path, "%s/model.safetensors", into);
        if (st == HP_OK) st = hp_st_writer_write(w, path, err);
        if (begun && st == HP_OK) st = hp_outdir_commit(of, err);
        else if (begun) hp_outdir_abort(of);
    }
    hp_st_writer_destroy(w);
    free(cc);
    free(cfg);
    return st;
}

/* ---- --data and --eval-data ---- */

/* --eval-data's batches in file order: GB windows each, the last remainder joined to the batch before it (so no
 * batch has fewer rows than dp replicas unless the file does). The rows of the batch at window w0 of W. */
static int64_t eval_batch(int64_t W, int64_t w0, int64_t gb) { return W - w0 < 2 * gb ? W - w0 : gb; }
/* The largest of them: min(W, 2·GB − 1). */
static int64_t eval_batch_max(int64_t W, int64_t gb) { return W < 2 * gb - 1 ? W : 2 * gb - 1; }

/* Opens the training data (and the eval data) on every rank, reading their headers only, and checks what the
 * plan needs of them before step 1: rows of one length, a vocabulary to check tokens against, and as many rows
 * as dp replicas in every micro-batch and every --eval-data batch. *B: rows a micro-batch, *S: ids a row. */
static hp_status open_data(train_args *a, const hp_model *m, const hp_plan *p, hp_data **data, hp_data **eval,
                           int64_t *B, int64_t *S, hp_err *err)
{
    hp_status st = hp_data_open(data, a->data, a->dtype, a->seq, err);
    if (st == HP_OK && a->eval_data) st = hp_data_open(eval, a->eval_data, a->dtype, a->seq, err);
    if (st != HP_OK) return st;
    *S = hp_data_row_len(*data);
    if (*eval && hp_data_row_len(*eval) != *S)
        return hp_err_set(err, HP_ERR_INPUT, "--eval-data %s gives rows of %lld ids and --data %s rows of %lld; "
                          "give both as token streams or both as safetensors", a->eval_data,
                          (long long)hp_data_row_len(*eval), a->data, (long long)*S);
    if (m->cfg.vocab_size <= 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s: the model's config gives no vocab_size; --data checks every token "
                          "against it", a->model);
    int64_t dp = hp_mesh_size(&p->mesh, "dp");
    if (a->gb < dp)
        return hp_err_set(err, HP_ERR_INPUT, "--global-batch %lld is fewer windows than the dp=%lld replicas; every "
                          "replica needs at least one: give a global batch of at least %lld, or a smaller dp",
                          (long long)a->gb, (long long)dp, (long long)dp);
    /* --micro-batch is rows per replica (as cost's and Megatron's): a micro-step takes MB x dp windows */
    if (a->mb_rows && (a->mb_rows > a->gb / dp || a->gb % (a->mb_rows * dp)))
        return hp_err_set(err, HP_ERR_INPUT, "--micro-batch %lld rows per replica x dp=%lld = %lld windows a "
                          "micro-step, which does not divide --global-batch %lld; give a --micro-batch that divides "
                          "%lld%s", (long long)a->mb_rows, (long long)dp, (long long)(a->mb_rows * dp),
                          (long long)a->gb, (long long)(a->gb / dp), a->gb % dp ? " and a global batch dp divides" : "");
    a->mb = a->mb_rows ? a->mb_rows * dp : a->gb;
    *B = a->mb;
    if (*eval && hp_data_windows(*eval) < dp)
        return hp_err_set(err, HP_ERR_INPUT, "--eval-data %s holds %lld window%s of --seq %lld, fewer than the dp=%lld "
                          "replicas; every replica evaluates at least one: give a longer eval file or a smaller dp",
                          a->eval_data, (long long)hp_data_windows(*eval), hp_data_windows(*eval) == 1 ? "" : "s",
                          (long long)a->seq, (long long)dp);
    return HP_OK;
}

/* Reads every token this run will read, checking each against the vocabulary (hp_data_rows, the read of the
 * run's own hp_data_batch and evaluation: the same messages): the training windows of steps k0 + 1 .. last (the whole file when
 * they cover it) and all of --eval-data. ids [MB, S] and eval_ids [eval_batch_max, S] are the run's buffers. */
static hp_status scan_data(const train_args *a, hp_data *data, hp_data *eval, int64_t k0, int64_t last, int64_t vocab,
                           int64_t *ids, int64_t *eval_ids, hp_err *err)
{
    int64_t W = hp_data_windows(data);
    hp_status st = HP_OK;
    if ((double)(last - k0) * (double)a->gb >= (double)W)
        for (int64_t w0 = 0; st == HP_OK && w0 < W; w0 += a->mb)
            st = hp_data_rows(data, w0, W - w0 < a->mb ? W - w0 : a->mb, vocab, ids, err);
    else /* the windows of positions k0·GB .. last·GB − 1 of the order, as hp_data_batch reads them */
        for (int64_t q = k0 * a->gb, w; st == HP_OK && q < last * a->gb; q++)
            if ((st = hp_data_window_at(data, &a->order, q, &w, err)) == HP_OK)
                st = hp_data_rows(data, w, 1, vocab, ids, err);
    int64_t We = eval ? hp_data_windows(eval) : 0;
    for (int64_t w0 = 0; st == HP_OK && w0 < We; w0 += eval_batch(We, w0, a->gb))
        st = hp_data_rows(eval, w0, eval_batch(We, w0, a->gb), vocab, eval_ids, err);
    return st;
}

/* The mean loss over every window of ev in file order (eval_batch), forward only; each batch's mean weighted by
 * its rows (every row scores the same number of positions). Collective. */
static hp_status evaluate(hp_runner *r, hp_comm *w, hp_data *ev, int64_t gb, int64_t vocab, int64_t *ids,
                          double *mean, hp_err *err)
{
    int64_t W = hp_data_windows(ev), S = hp_data_row_len(ev);
    double sum = 0;
    hp_status st = HP_OK;
    for (int64_t w0 = 0; st == HP_OK && w0 < W;) {
        int64_t n = eval_batch(W, w0, gb);
        st = hp_data_rows(ev, w0, n, vocab, ids, err);
        st = hp_comm_agree(w, st, err);
        hp_run_output out = {0};
        if (st == HP_OK) st = hp_runner_forward(r, ids, n, S, &out, err);
        st = hp_comm_agree(w, st, err);
        sum += out.loss * (double)n;
        hp_run_output_free(&out);
        w0 += n;
    }
    *mean = sum / (double)W;
    return st;
}

/* A step (or an evaluation) this node cannot hold is refused before its batch is read or allocated, by run's
 * rule (cli_forward_memory_fits): B x S tokens forward and backward with the training state, and --eval-data's
 * largest batch (eval_rows, 0: none) forward; rank 0 also gathers every parameter whole in f32 for --grad-out
 * (the gradients) and --out (the weights). Collective; the verdict is agreed. */
static hp_status memory_check(hp_comm *w, const train_args *a, const hp_model *m, const hp_plan *p, int64_t B,
                              int64_t S, int64_t eval_rows, int local_ranks, hp_err *err)
{
    char what[PATH_MAX + 200];
    double gathered = (double)hp_model_num_params(m) * sizeof(float) * ((a->grad_out ? 1 : 0) + (a->out ? 1 : 0));
    snprintf(what, sizeof what, "train of %s on %s of %lld x %lld tokens", a->model,
             a->data ? "micro-batches" : "a batch", (long long)B, (long long)S);
    hp_status st = cli_forward_memory_fits(w, m, p, B, S, true, false, gathered, local_ranks, what,
                                           a->data ? "give a smaller --micro-batch (each step still trains on "
                                                     "--global-batch windows), a shorter --seq, or more ranks"
                                                   : "give an --input of fewer rows or tokens, or more ranks", err);
    if (st == HP_OK && eval_rows > B) {
        snprintf(what, sizeof what, "train of %s evaluating --eval-data %s in batches of up to %lld x %lld tokens",
                 a->model, a->eval_data, (long long)eval_rows, (long long)S);
        st = cli_forward_memory_fits(w, m, p, eval_rows, S, false, false, gathered, local_ranks, what,
                                     "give a smaller --global-batch (an evaluation's batches hold up to 2 x GB - 1 "
                                     "windows), a shorter --seq, or more ranks", err);
    }
    return st;
}

/* The last step this run takes: --stop-after, else --steps. */
static int64_t last_step(const train_args *a)
{
    return a->stop_after > 0 && a->stop_after < a->steps ? a->stop_after : a->steps;
}

/* A flag that changes nothing in this run: one warning each on rank 0, before step 1. */
static void warn_no_effect(const train_args *a, const hp_model *m, const hp_plan *p, int world)
{
    int64_t last = last_step(a);
    if (a->sched.min_lr > 0 && a->sched.kind == HP_LR_CONSTANT)
        cli_warn_cmd("train", "--min-lr has no effect with --schedule constant (it is where linear and cosine end)");
    else if (a->sched.kind != HP_LR_CONSTANT && a->sched.warmup >= a->steps && (a->sched.min_lr > 0 || a->sched_given))
        cli_warn_cmd("train", "%s has no effect: --warmup %lld spans all --steps %lld, so the schedule never decays",
                     a->sched.min_lr > 0 ? "--min-lr" : "--schedule", (long long)a->sched.warmup,
                     (long long)a->steps);
    if (a->eval_every > last)
        cli_warn_cmd("train", "--eval-every %lld has no effect: it is past the last step this run takes (%lld), so "
                     "--eval-data is never evaluated", (long long)a->eval_every, (long long)last);
    if (a->dtype_given && a->data && hp_data_is_safetensors(a->data))
        cli_warn_cmd("train", "--data-dtype has no effect with a safetensors --data (%s): its input_ids carry their "
                     "own dtype", a->data);
    if (a->seed_given && a->order.shuffle == HP_DATA_IN_ORDER)
        cli_warn_cmd("train", "--seed has no effect with --shuffle none (it seeds the shuffle)");
    if (a->to.zero && hp_mesh_size(&p->mesh, "dp") == 1 && (m->cfg.n_experts == 0 || world == 1))
        cli_warn_cmd("train", "--zero 1 has no effect at dp=1: no other rank holds the same parameters to share "
                     "AdamW's moments with");
    if (a->stop_after && a->stop_after == a->steps)
        cli_warn_cmd("train", "--stop-after %lld has no effect: it is --steps, the run's last step anyway",
                     (long long)a->stop_after);
    hp_lr_schedule ls = a->sched; /* a run whose every step has lr 0 writes the model unchanged (its gradients may
                                     be what is wanted: --grad-out), so it is said, not refused */
    ls.lr = a->to.lr, ls.steps = a->steps;
    bool moves = false;
    for (int64_t t = 1; t <= a->steps && !moves; t++) moves = hp_lr_at(&ls, t) > 0;
    if (!moves)
        cli_warn_cmd("train", "every step's learning rate is 0 (--schedule %s over --steps %lld ends at --min-lr %g%s): "
                     "the weights will not change; give more --steps, a --min-lr above 0 or --schedule constant",
                     hp_lr_kind_name(ls.kind), (long long)a->steps, ls.min_lr, a->steps == 1 ? " on its only step" : "");
}

/* ---- what the user sees: the step lines, the progress line, --plot ---- */

typedef struct train_view {
    bool root, tty;              /* rank 0; its stderr is a terminal (the progress line) */
    int64_t every, steps;        /* --log-every, --steps */
    double flop_step, limit;     /* model FLOPs per step; the GEMM limit, FLOP/s over all ranks */
    int64_t n;                   /* steps since the last step line */
    double tokens, secs;         /* their scored positions and seconds */
    double t0;                   /* when this process's first step began */
    int64_t k0, last;            /* the steps it takes: k0 + 1 .. last */
    int shown;                   /* characters of the progress line on the terminal (0: none) */
    /* --plot (rank 0): this run's steps */
    int64_t n_pts, n_eval;
    int64_t n_prev;              /* of them, steps before --resume, read from --log-json */
    int64_t *step, *eval_step;   /* [last - k0] */
    double *loss, *norm, *eval;  /* [last - k0] */
} train_view;

static hp_status view_init(train_view *v, const train_args *a, bool root, int64_t k0, int64_t last, hp_err *err)
{
    *v = (train_view){.root = root, .tty = root && isatty(STDERR_FILENO), .every = a->log_every, .steps = a->steps,
                      .k0 = k0, .last = last};
    if (!root || !a->plot) return HP_OK;
    size_t n = (size_t)(last - k0);
    v->step = hp_calloc(n, sizeof *v->step);
    v->eval_step = hp_calloc(n, sizeof *v->eval_step);
    v->loss = hp_calloc(n, sizeof *v->loss);
    v->norm = hp_calloc(n, sizeof *v->norm);
    v->eval = hp_calloc(n, sizeof *v->eval);
    if (!v->step || !v->eval_step || !v->loss || !v->norm || !v->eval)
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory for --plot's %zu steps", n);
    return HP_OK;
}

static void view_free(train_view *v)
{
    free(v->step);
    free(v->eval_step);
    free(v->loss);
    free(v->norm);
    free(v->eval);
}

/* Removes the progress line from the terminal, before anything else is printed. */
static void view_clear(train_view *v)
{
    if (!v->shown) return;
    fprintf(stderr, "\r%*s\r", v->shown, "");
    fflush(stderr);
    v->shown = 0;
}

/* "1:02:03" or "2:03". */
static const char *hms(double s, char *buf, size_t cap)
{
    long t = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
    return buf;
}

/* On a terminal, after step t: "train: step t/N, 0:12 elapsed, ETA 1:05", the ETA from this process's mean
 * seconds per step (evaluations and checkpoints included) over the steps left until the run's last. */
static void view_progress(train_view *v, int64_t t, double now)
{
    if (!v->tty || t >= v->last) return;
    char el[32], eta[32], line[160];
    double elapsed = now - v->t0, per = elapsed / (double)(t - v->k0);
    int len = snprintf(line, sizeof line, "train: step %lld/%lld, %s elapsed, ETA %s", (long long)t,
                       (long long)v->steps, hms(elapsed, el, sizeof el), hms(per * (double)(v->last - t), eta,
                                                                             sizeof eta));
    view_clear(v);
    fputs(line, stderr);
    fflush(stderr);
    v->shown = len;
}

/* Step t took dt seconds for `tokens` scored positions: rank 0 keeps it for --plot and prints its line when due
 * (every --log-every steps, the last step, a skipped step, one that evaluates). Returns the step's own MFU. */
static double view_step(train_view *v, int64_t t, double loss, double norm, double lr, double tokens, double dt,
                        const char *event, bool force)
{
    v->n++;
    v->tokens += tokens;
    v->secs += dt;
    if (v->step) {
        v->step[v->n_pts] = t;
        v->loss[v->n_pts] = loss;
        v->norm[v->n_pts++] = norm;
    }
    double mfu = v->limit > 0 && dt > 0 ? v->flop_step / dt / v->limit : 0;
    if (!v->root || !(force || t % v->every == 0 || t == v->last)) return mfu;
    double tps = v->secs > 0 ? v->tokens / v->secs : 0;
    double mean = v->limit > 0 && v->secs > 0 ? v->flop_step * (double)v->n / v->secs / v->limit : 0;
    fprintf(stderr, "train: step %lld/%lld loss %.7g grad-norm %.6g%s lr %.6g tokens/s %.1f mfu %.4g (%.3f s/step)\n",
            (long long)t, (long long)v->steps, loss, norm, event, lr, tps, mean, v->secs / (double)v->n);
    v->n = 0;
    v->tokens = v->secs = 0;
    return mfu;
}

static void view_eval(train_view *v, int64_t t, double loss)
{
    if (!v->eval_step) return;
    v->eval_step[v->n_eval] = t;
    v->eval[v->n_eval++] = loss;
}

/* --log-json of a run: a new run's log is a new file (another run's is never overwritten, but with --force); a
 * resumed run continues its own log: the lines of steps 1..k0 kept (those after the checkpoint were of steps it
 * takes again), every line of this run (its run_id, when it has one) and none missing. Rank 0. */
typedef struct log_prev {
    char *kept;       /* the kept lines' text */
    size_t kept_len;
    int64_t n;        /* steps 1..n */
    double *loss, *norm, *eval; /* [n]; eval NaN where not evaluated */
} log_prev;

static void log_prev_free(log_prev *l)
{
    free(l->kept), free(l->loss), free(l->norm), free(l->eval);
    memset(l, 0, sizeof *l);
}

static hp_status log_check(const train_args *a, int64_t k0, log_prev *prev, hp_err *err)
{
    memset(prev, 0, sizeof *prev);
    struct stat sb;
    if (stat(a->log_json, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0) return HP_OK; /* a new file */
    if (!a->resume && !a->force)
        return hp_err_set(err, HP_ERR_INPUT, "--log-json %s holds a log already (%lld bytes: another run's); name "
                          "another file, or pass --force to replace it", a->log_json, (long long)sb.st_size);
    if (!a->resume) return HP_OK;
    FILE *f = fopen(a->log_json, "r");
    if (!f) return hp_err_set(err, HP_ERR_IO, "--log-json %s: cannot read it (%s)", a->log_json, strerror(errno));
    FILE *k = open_memstream(&prev->kept, &prev->kept_len);
    hp_status st = k ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int64_t want = 1;
    for (int64_t no = 1; st == HP_OK && (len = getline(&line, &cap, f)) > 0; no++) {
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)len, 0, &je), *js = json_object_get(o, "step");
        json_t *id = json_object_get(o, "run_id");
        int64_t t = json_is_integer(js) ? (int64_t)json_integer_value(js) : -1;
        if (!json_is_object(o) || t < 1)
            st = hp_err_set(err, HP_ERR_INPUT, "--log-json %s: line %lld is not a step's record; it is not this "
                            "run's log: name another file", a->log_json, (long long)no);
        else if (id && (!json_is_string(id) || strcmp(json_string_value(id), a->run_id)))
            st = hp_err_set(err, HP_ERR_INPUT, "--log-json %s: line %lld is of run %s, not of the run resumed (%s); "
                            "name another file", a->log_json, (long long)no,
                            json_is_string(id) ? json_string_value(id) : "?", a->run_id);
        else if (t <= k0 && t != want)
            st = hp_err_set(err, HP_ERR_INPUT, "--log-json %s: line %lld records step %lld where step %lld follows; "
                            "it is not this run's log (steps 1 to %lld): name another file", a->log_json,
                            (long long)no, (long long)t, (long long)want, (long long)k0);
        else if (t <= k0) {
            fwrite(line, 1, (size_t)len, k);
            if (line[len - 1] != '\n') fputc('\n', k);
            double *l3[3];
            for (int i = 0; i < 3; i++) {
                double **arr = i == 0 ? &prev->loss : i == 1 ? &prev->norm : &prev->eval;
                l3[i] = realloc(*arr, (size_t)want * sizeof **arr);
                if (l3[i]) *arr = l3[i];
            }
            if (!l3[0] || !l3[1] || !l3[2]) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            else {
                json_t *ev = json_object_get(o, "eval_loss");
                prev->loss[want - 1] = json_number_value(json_object_get(o, "loss"));
                prev->norm[want - 1] = json_number_value(json_object_get(o, "grad_norm"));
                prev->eval[want - 1] = json_is_number(ev) ? json_number_value(ev) : NAN;
                prev->n = want++;
            }
        }
        json_decref(o);
    }
    free(line);
    fclose(f);
    if (k) fclose(k);
    if (st == HP_OK && prev->n != k0)
        st = hp_err_set(err, HP_ERR_INPUT, "--log-json %s records steps 1 to %lld where the checkpoint resumed is at "
                        "step %lld: it is not this run's whole log; name another file", a->log_json,
                        (long long)prev->n, (long long)k0);
    if (st != HP_OK) log_prev_free(prev);
    return st;
}

/* Opens the log: a new file, or the resumed run's log rewritten to its kept lines (atomically), to append to. */
static hp_status log_open(const train_args *a, const log_prev *prev, FILE **log, hp_err *err)
{
    hp_status st = HP_OK;
    if (a->resume && prev->kept_len)
        st = cli_write_atomic_err(a->log_json, prev->kept, prev->kept_len, "the log", err);
    if (st == HP_OK && !(*log = fopen(a->log_json, a->resume && prev->kept_len ? "a" : "w")))
        st = hp_err_set(err, HP_ERR_IO, "--log-json %s: cannot create it (%s)", a->log_json, strerror(errno));
    return st;
}

/* The model FLOPs of a step over `tokens` forwarded positions and the same-run GEMM limit (every rank at once),
 * into v; rank 0 says both once, with the kernels the limit ran on. Collective. */
static hp_status measure_limit(hp_comm *w, const hp_model *m, int64_t tokens, hp_linalg_mode compute, train_view *v,
                               hp_err *err)
{
    hp_gemm_limit lim;
    hp_status st = hp_cost_gemm_limit(w, TRAIN_GEMM_N, compute, TRAIN_GEMM_REPS, &lim, err);
    if (st != HP_OK) return st;
    v->flop_step = hp_cost_train_flops(m, tokens);
    v->limit = lim.sum_gflops * 1e9;
    if (!v->root) return HP_OK;
    char kernels[512];
    int N = hp_comm_size(w);
    fprintf(stderr, "train: model FLOPs %.4g G per step (6 x %.4g weights per token x %lld tokens); MFU limit %.1f "
            "GFLOP/s: a%s %lld^3 GEMM, best of %d on every rank at once, summed over %d rank%s (slowest rank "
            "%.1f; %.2f s)\n",
            v->flop_step * 1e-9, hp_cost_gemm_weights(m), (long long)tokens, lim.sum_gflops,
            compute == HP_LINALG_BF16 ? " bf16" : "n f32", (long long)lim.n, lim.reps,
            N, N == 1 ? "" : "s", lim.min_gflops, lim.seconds);
    fprintf(stderr, "train: GEMM kernels: %s\n", hp_linalg_describe(NULL, kernels, sizeof kernels));
    return HP_OK;
}

/* --plot: rank 0's page of the steps this run took, written atomically (a signal meanwhile removes the
 * temporary). */
static hp_status write_plot(const train_args *a, const hp_model *m, const hp_plan *p, const train_view *v, int world,
                            hp_err *err)
{
    char mesh[160], title[PATH_MAX + 200], summary[600], tmp[PATH_MAX + 40];
    hp_mesh_str(&p->mesh, mesh, sizeof mesh);
    snprintf(title, sizeof title, "%s on %s", m->path, mesh);
    int64_t n = v->n_pts;
    char before[120] = "";
    if (v->n_prev)
        snprintf(before, sizeof before, " (steps 1 to %lld before --resume, from --log-json)", (long long)v->n_prev);
    snprintf(summary, sizeof summary, "Steps %lld to %lld of %lld, taken on %d process%s%s%s; the last: loss %.7g, "
             "gradient norm %.6g.", (long long)(n ? v->step[0] : 0), (long long)(n ? v->step[n - 1] : 0),
             (long long)a->steps, world, world == 1 ? "" : "es", a->resume && !v->n_prev ? " after --resume" : "",
             before, n ? v->loss[n - 1] : 0.0, n ? v->norm[n - 1] : 0.0);
    cli_train_curves c = {.n = n, .step = v->step, .loss = v->loss, .grad_norm = v->norm, .n_eval = v->n_eval,
                          .eval_step = v->eval_step, .eval_loss = v->eval, .clip = a->to.clip, .summary = summary,
                          .note = "The steps this run took (after --resume, those after the checkpoint, and "
                                  "the earlier ones when the run's --log-json is continued); --log-json keeps every "
                                  "step's figures."};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int rc = cli_html_train(f, title, &c);
    fclose(f);
    hp_status st = rc == 0 && buf ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "--plot %s: out of memory for the page",
                                                       a->plot);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", a->plot, (long)getpid()); /* cli_write_atomic_err's temporary */
    const char *rm[1] = {tmp};
    if (st == HP_OK) {
        cli_signals_catch();
        cli_signals_remove_on_signal(rm, 1);
        st = cli_write_atomic_err(a->plot, buf, len, "the page", err);
        cli_signals_remove_on_signal(NULL, 0);
        cli_signals_release(0);
    }
    free(buf);
    return st;
}

/* ---- the command ---- */

static int finish(hp_comm *w, hp_status st, hp_err *err)
{
    int code = cli_collective_exit(w, st, err, true);
    hp_comm_free(w);
    return code;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whether the file path is the output folder of, or lies inside it (its folder resolved, links followed). */
static bool inside_outdir(const char *path, const hp_outdir *of)
{
    char g[PATH_MAX], rg[PATH_MAX], full[2 * PATH_MAX + 2];
    const char *slash = strrchr(path, '/');
    snprintf(g, sizeof g, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    const char *canon = hp_outdir_path(of);
    size_t cl = strlen(canon);
    if (!realpath(g, rg)) return false;
    if (!strncmp(rg, canon, cl) && (rg[cl] == '\0' || rg[cl] == '/')) return true;
    snprintf(full, sizeof full, "%s/%s", strcmp(rg, "/") ? rg : "", slash ? slash + 1 : path);
    return !strcmp(full, canon);
}

static const char *const g_out_names[] = {"config.json", "model.safetensors", NULL};
static const char *const g_ckpt_names[] = {"config.json", "model.safetensors", "state.json", "rank-*.safetensors",
                                           NULL};

/* ---- checkpoints (--save-every, --resume) ---- */

/* The flags a resumed run must share with the saved one, as state.json records them. */
static json_t *run_flags(const train_args *a, int world)
{
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "steps", json_integer((json_int_t)a->steps));
    json_object_set_new(o, "world", json_integer(world));
    json_object_set_new(o, "lr", json_real(a->sched.lr));
    json_object_set_new(o, "min_lr", json_real(a->sched.min_lr));
    json_object_set_new(o, "schedule", json_string(hp_lr_kind_name(a->sched.kind)));
    json_object_set_new(o, "warmup", json_integer((json_int_t)a->sched.warmup));
    json_object_set_new(o, "beta1", json_real(a->to.beta1));
    json_object_set_new(o, "beta2", json_real(a->to.beta2));
    json_object_set_new(o, "eps", json_real(a->to.eps));
    json_object_set_new(o, "weight_decay", json_real(a->to.weight_decay));
    json_object_set_new(o, "clip", json_real(a->to.clip));
    json_object_set_new(o, "zero", json_integer(a->to.zero));
    json_object_set_new(o, "compute", json_string(cli_compute_name(a->compute)));
    /* the data by what it holds, not by its spelling: another path to the same bytes is the same data */
    const char *dp = a->data ? a->data : a->input ? a->input : "";
    size_t dl = strlen(dp);
    const char *kind = a->input || (dl >= 12 && !strcmp(dp + dl - 12, ".safetensors")) ? "input_ids"
                       : a->dtype == HP_DATA_U32 ? "uint32" : "uint16";
    json_object_set_new(o, "data", json_pack("{s:I, s:s, s:s}", "bytes", (json_int_t)a->data_bytes, "xxh64",
                                             a->data_sum, "dtype", kind));
    json_object_set_new(o, "seq", json_integer((json_int_t)a->seq));
    json_object_set_new(o, "global_batch", json_integer((json_int_t)a->gb));
    json_object_set_new(o, "micro_batch", json_integer((json_int_t)a->mb_rows)); /* per replica, as given */
    json_object_set_new(o, "shuffle", json_string(a->order.shuffle == HP_DATA_IN_ORDER ? "none" : "seeded"));
    char seed[24]; /* the whole unsigned 64-bit range, as given */
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)a->order.seed);
    json_object_set_new(o, "seed", json_string(seed));
    return o;
}

/* A config value as a message shows it: a number as the user wrote it (1e-06, not 9.9999999999999995e-7). */
static const char *value_text(json_t *v, char *buf, size_t cap)
{
    if (!v) snprintf(buf, cap, "(none)");
    else if (json_is_real(v)) snprintf(buf, cap, "%.15g", json_real_value(v));
    else {
        char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        snprintf(buf, cap, "%s", t ? t : "?");
        free(t);
    }
    return buf;
}

/* The model of this run must be the saved run's: its config (hp_train_model_config) equal to the one state.json
 * records, the first differing key named (another rms_norm_eps, rope_theta or family with the same shapes trains
 * another model on the saved weights). */
static hp_status same_model(const train_args *a, const char *ckpt, json_t *saved, hp_err *err)
{
    json_t *mine = a->model_config ? json_loads(a->model_config, 0, NULL) : NULL;
    hp_status st = HP_OK;
    if (!json_is_object(saved))
        st = hp_err_set(err, HP_ERR_INPUT, "--resume %s: state.json records no model_config; it cannot tell whether "
                        "%s is the model it trained", ckpt, a->model);
    else if (!mine) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int pass = 0; st == HP_OK && pass < 2; pass++) { /* keys of the saved config, then keys only this one has */
        const char *key;
        json_t *v;
        json_object_foreach(pass ? mine : saved, key, v) {
            json_t *o = json_object_get(pass ? saved : mine, key);
            if (o && (json_is_number(o) && json_is_number(v) ? json_number_value(o) == json_number_value(v)
                                                              : json_equal(o, v)))
                continue; /* (10000 and 10000.0 are one rope_theta) */
            json_t *had = pass ? o : v, *now = pass ? v : o;
            char h[256], n[256];
            st = hp_err_set(err, HP_ERR_INPUT, "--resume %s: the run trained a model whose config.json has %s %s; %s's "
                            "has %s: resume with the model the run began from", ckpt, key, value_text(had, h, sizeof h),
                            a->model, value_text(now, n, sizeof n));
            break;
        }
    }
    json_decref(mine);
    return st;
}

/* The step state.json of ckpt records, after checking that its flags are this run's (each difference named, with
 * the command line and mesh that saved it). --steps may be raised: *saved_steps then gets the saved run's total
 * (0 when the same), the schedule following the new one. */
static hp_status read_checkpoint(const train_args *a, int world, const char *ckpt, int64_t *step, int64_t *saved_steps,
                                 hp_err *err)
{
    *saved_steps = 0;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/state.json", ckpt);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je), *want = run_flags(a, world);
    json_t *flags = root ? json_object_get(root, "flags") : NULL, *js = root ? json_object_get(root, "step") : NULL;
    hp_status st = HP_OK;
    if (!root || !json_is_integer(js) || !json_is_object(flags) || !want)
        st = hp_err_set(err, HP_ERR_INPUT, "--resume: %s is not a training checkpoint's state (%s)", path,
                        root ? "no step or flags" : je.text);
    const char *key;
    json_t *v;
    if (st == HP_OK)
        json_object_foreach(want, key, v) {
            json_t *had = json_object_get(flags, key);
            if (had && json_equal(had, v)) continue;
            if (!had && !strcmp(key, "compute") && a->compute == HP_LINALG_EXACT) continue; /* saved before --compute */
            if (had && json_is_integer(had) && !strcmp(key, "steps")) { /* another total: checked below */
                *saved_steps = (int64_t)json_integer_value(had);
                continue;
            }
            char *h = had ? json_dumps(had, JSON_ENCODE_ANY) : NULL, *n = json_dumps(v, JSON_ENCODE_ANY);
            if (!strcmp(key, "data"))
                st = hp_err_set(err, HP_ERR_INPUT, "--resume %s: the run was saved training on other data: %s there, "
                                "%s %s has %s; resume with the saved run's data (its bytes, wherever the file is)",
                                ckpt, h ? h : "(none)", a->data ? "--data" : "--input", a->data ? a->data : a->input,
                                n ? n : "?");
            else
                st = hp_err_set(err, HP_ERR_INPUT, "--resume %s: the run was saved with %s %s, this one has %s; resume "
                                "with the saved run's flags", ckpt, key, h ? h : "(none)", n ? n : "?");
            free(h), free(n);
            json_t *cmd = json_object_get(root, "command"), *mesh = json_object_get(root, "mesh");
            size_t l = strlen(err->msg);
            if (json_is_string(cmd) && l < sizeof err->msg)
                snprintf(err->msg + l, sizeof err->msg - l, "; it was saved by: %s%s%s", json_string_value(cmd),
                         json_is_string(mesh) ? ", on mesh " : "", json_is_string(mesh) ? json_string_value(mesh) : "");
            break;
        }
    if (st == HP_OK) st = same_model(a, ckpt, json_object_get(root, "model_config"), err);
    if (st == HP_OK) *step = (int64_t)json_integer_value(js);
    if (st == HP_OK && (*step < 1 || *step >= a->steps))
        st = hp_err_set(err, HP_ERR_INPUT, "--resume %s: it is at step %lld of %lld; nothing is left to train: give a "
                        "--steps above %lld to continue it (the schedule then follows the new total)", ckpt,
                        (long long)*step, (long long)a->steps, (long long)*step);
    json_decref(root);
    json_decref(want);
    return st;
}

/* The output folder of a checkpoint, out = "<--out>/step-<t>" (inputs: the run's six, what it must not touch). */
static hp_outdir_spec ckpt_spec(const train_args *a, const char *out, const char *const *inputs)
{
    return (hp_outdir_spec){.cmd = "train", .out = out, .names = g_ckpt_names, .example = "run/step-100",
                            .force = a->force, .inputs = inputs, .n_inputs = 6};
}

/* Before step 1, the checks the save of the run's last checkpoint (step `last`) will make, touching nothing: not
 * an input nor in or around one (--out inside the model's folder), absent or (--force) an earlier output. The run
 * folder may not exist yet: it is made just before step 1. */
static hp_status check_checkpoint_out(const train_args *a, int64_t k0, int64_t last, const char *const *inputs,
                                      hp_err *err)
{
    char out[PATH_MAX + 64];
    /* a resumed run saves after k0: a later step-<t> of its own already there would stop it at step t */
    for (int64_t t = (k0 / a->save_every + 1) * a->save_every; t < last && !a->force; t += a->save_every) {
        struct stat sb; /* the steps it saves: the multiples of --save-every after k0 (not every step up to last) */
        snprintf(out, sizeof out, "%s/step-%lld", a->out, (long long)t);
        if (stat(out, &sb) == 0)
            return hp_err_set(err, HP_ERR_INPUT, "--out %s already holds step-%lld, which this run resumed at step "
                              "%lld would save again: resume from its last checkpoint (--resume %s), or pass "
                              "--force to replace the later ones", a->out, (long long)t, (long long)k0, a->out);
    }
    snprintf(out, sizeof out, "%s/step-%lld", a->out, (long long)last);
    hp_outdir_spec os = ckpt_spec(a, out, inputs);
    os.make_parents = true;
    hp_outdir *of = NULL;
    hp_status st = hp_outdir_open(&of, &os, err);
    hp_outdir_close(of);
    return st;
}

/* Checkpoint step-<t> of the run folder a->out: every rank's training state, the model folder, state.json, as one
 * folder that appears whole or not at all. Collective. */
static hp_status save_checkpoint(const train_args *a, hp_comm *w, const hp_model *m, hp_runner *r, int64_t step,
                                 hp_err *err)
{
    bool root = hp_comm_rank(w) == 0;
    char out[PATH_MAX + 64], tmp[PATH_MAX + 128] = "";
    snprintf(out, sizeof out, "%s/step-%lld", a->out, (long long)step);
    const char *const inputs[] = {a->input, a->pf.overrides, a->plan, a->model, a->data, a->eval_data};
    hp_outdir_spec os = ckpt_spec(a, out, inputs);
    hp_outdir *of = NULL;
    hp_status st = HP_OK;
    /* SIGINT/SIGTERM/SIGHUP during the save are recorded on every rank (mpirun forwards them): the writers stop at
     * their next piece, the save fails, its temporary folder is removed (hp_outdir_close), and then the signal ends
     * the process with its own status (T13: step-<t>.tmp.<pid> stayed behind) */
    cli_signals_catch();
    if (root && (st = hp_outdir_open(&of, &os, err)) == HP_OK && (st = hp_outdir_begin(of, err)) == HP_OK)
        snprintf(tmp, sizeof tmp, "%s", hp_outdir_tmp(of));
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK) st = hp_comm_bcast(w, tmp, sizeof tmp, 0, err);
    char sv[32];
    snprintf(sv, sizeof sv, "%lld", (long long)step);
    /* "step" is AdamW's steps taken (a skipped step takes none); "checkpoint_step" the run's step, state.json's */
    const char *const meta[4] = {"run_id", a->run_id, "checkpoint_step", sv};
    if (st == HP_OK) st = hp_runner_save_train_meta(r, tmp, meta, 2, err);
    tensor_list params = {0};
    if (st == HP_OK) st = hp_runner_gather_params(r, false, keep, &params, err);
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK && root) st = write_folder(a, m, &params, NULL, tmp, err);
    if (root && st == HP_OK) { /* last: it lists every file, so a folder with it is complete */
        json_t *flags = run_flags(a, hp_comm_size(w));
        char *text = flags ? json_dumps(flags, JSON_PRESERVE_ORDER) : NULL;
        hp_train_ckpt_meta cm = {.run_id = a->run_id, .flags_json = text, .model_json = a->model_config,
                                 .command = a->cmdline, .mesh = a->mesh};
        st = text ? hp_train_ckpt_write_state(tmp, step, hp_comm_size(w), &cm, err)
                  : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        free(text);
        json_decref(flags);
    }
    st = hp_comm_agree(w, st, err); /* every rank's file is in place */
    if (root && st == HP_OK) st = hp_outdir_commit(of, err);
    list_free(&params);
    st = hp_comm_agree(w, st, err);
    if (root && st != HP_OK) { /* a full disk, a write error: named in the checkpoint, not its temporary */
        hp_outdir_fix_msg(of, err);
        hp_err_prefix(err, "train: saving the checkpoint of step %lld failed; the earlier checkpoints are intact",
                      (long long)step);
    }
    hp_outdir_close(of); /* aborts what was not committed: the temporary folder, whoever wrote into it */
    if (st == HP_OK && root) say("step %lld: checkpoint %s", (long long)step, out);
    if (hp_interrupted() && root)
        say("interrupted while saving step %lld's checkpoint: %s; the earlier checkpoints are intact", (long long)step,
            st == HP_OK ? "it was complete" : "its temporary folder is removed");
    cli_signals_release(0); /* a signal recorded meanwhile ends the process now, with its status */
    return st;
}

/* --resume's identity for the ranks' agreement: the checkpoint it means (hp_train_ckpt_find), by its state.json,
 * which records the step and the run's flags; 0 (not compared) when there is none. */
static uint64_t resume_identity(const char *arg)
{
    char ckpt[PATH_MAX + 64], path[PATH_MAX + 80];
    hp_err e;
    if (hp_train_ckpt_find("--resume", arg, ckpt, sizeof ckpt, &e) != HP_OK) return 0;
    snprintf(path, sizeof path, "%s/state.json", ckpt);
    return cli_file_identity(path);
}

/* "step-<t>": a checkpoint's name in a run folder (decimal digits, nothing after them). */
static bool is_step_name(const char *nm)
{
    const char *num = nm + 5;
    return !strncmp(nm, "step-", 5) && *num && strspn(num, "0123456789") == strlen(num);
}

/* Removes checkpoint folder dir of another run (--force): only when it holds the output marker and nothing but
 * the files a checkpoint holds. */
static hp_status remove_checkpoint(const char *dir, hp_err *err)
{
    char p[2 * PATH_MAX + 600];
    snprintf(p, sizeof p, "%s/%s", dir, HP_OUTDIR_MARKER);
    struct stat sb;
    if (lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode))
        return hp_err_set(err, HP_ERR_INPUT, "--force: %s holds no %s, so hyperpar did not write it; it is not "
                          "removed: move it away or choose another --out", dir, HP_OUTDIR_MARKER);
    DIR *d = opendir(dir);
    if (!d) return hp_err_set(err, HP_ERR_IO, "--force: %s: cannot list it (%s)", dir, strerror(errno));
    struct dirent *e;
    hp_status st = HP_OK;
    for (int pass = 0; pass < 2 && st == HP_OK; pass++, rewinddir(d)) /* first every name checked, then removed */
        while (st == HP_OK && (e = readdir(d))) {
            const char *nm = e->d_name;
            if (!strcmp(nm, ".") || !strcmp(nm, "..")) continue;
            bool ours = !strcmp(nm, HP_OUTDIR_MARKER) || !strcmp(nm, "config.json") || !strcmp(nm, "state.json") ||
                        !strcmp(nm, "model.safetensors") ||
                        (!strncmp(nm, "rank-", 5) && strlen(nm) > 17 && !strcmp(nm + strlen(nm) - 12, ".safetensors"));
            if (!ours) st = hp_err_set(err, HP_ERR_INPUT, "--force: %s holds '%s', which hyperpar did not write; it is "
                                       "not removed", dir, nm);
            snprintf(p, sizeof p, "%s/%s", dir, nm);
            if (pass == 1 && st == HP_OK && unlink(p) != 0)
                st = hp_err_set(err, HP_ERR_IO, "--force: cannot remove %s (%s)", p, strerror(errno));
        }
    closedir(d);
    if (st == HP_OK && rmdir(dir) != 0) st = hp_err_set(err, HP_ERR_IO, "--force: cannot remove %s (%s)", dir,
                                                        strerror(errno));
    if (st == HP_OK) say("--force: removed %s, a checkpoint of another run", dir);
    return st;
}

/* The run folder (--out with --save-every) holds the checkpoints of one run, or `merge RUN` and `--resume RUN`
 * could take another run's last step: a step-<t> of another run (any, for a new run; another run id, for a
 * resumed one) is refused, or with --force removed. Rank 0. */
static hp_status check_run_folder(const train_args *a, hp_err *err)
{
    DIR *d = opendir(a->out);
    if (!d) return HP_OK; /* made at the start; a failure there was said */
    hp_status st = HP_OK;
    struct dirent *e;
    while (st == HP_OK && (e = readdir(d))) {
        if (!is_step_name(e->d_name)) continue;
        char sub[PATH_MAX + 300], id[17] = "";
        if ((size_t)snprintf(sub, sizeof sub, "%s/%s", a->out, e->d_name) >= sizeof sub) continue;
        bool known = hp_train_ckpt_run_id(sub, id, sizeof id, NULL) == HP_OK;
        if (a->resume && known && !strcmp(id, a->run_id)) continue; /* this run's own */
        if (a->force) {
            st = remove_checkpoint(sub, err);
            continue;
        }
        st = hp_err_set(err, HP_ERR_INPUT, "--out %s holds %s, a checkpoint of %s%s%s, and a run folder holds one "
                        "run's checkpoints (merge and --resume take its last): %s", a->out, e->d_name,
                        known ? "run " : "another run", known ? id : "", known ? (a->resume ? ", not this one" : "")
                                                                                : " (or of none: no run_id)",
                        a->resume ? "resume into the run's own folder, choose another --out, or pass --force to "
                                    "remove the other run's checkpoints"
                                  : "continue that run with --resume, choose another --out, or pass --force to remove "
                                    "its checkpoints");
    }
    closedir(d);
    return st;
}

/* A new run's id: 64 random bits as 16 hex digits (the kernel's, else the clock's and the process's). */
static void new_run_id(char out[17])
{
    uint64_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&v, sizeof v, 1, f) != 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    }
    if (f) fclose(f);
    snprintf(out, 17, "%016llx", (unsigned long long)v);
}

/* What binds this run's checkpoints (with --save-every or --resume): the run id (the resumed checkpoint's, else a
 * new one), the data's identity (the size and XXH64 of its bytes, read by rank 0) and the model's config; then
 * the run folder's other runs (check_run_folder). Collective. */
static hp_status bind_start(train_args *a, hp_comm *w, const hp_model *m, const char *ckpt, hp_err *err)
{
    hp_status st = HP_OK;
    const char *dp = a->data ? a->data : a->input;
    if (hp_comm_rank(w) == 0) {
        if (a->resume) st = hp_train_ckpt_run_id(ckpt, a->run_id, sizeof a->run_id, err);
        else new_run_id(a->run_id);
        uint64_t h = 0;
        if (st == HP_OK) st = hp_train_file_sum(dp, &a->data_bytes, &h, err);
        snprintf(a->data_sum, sizeof a->data_sum, "%016llx", (unsigned long long)h);
        if (st == HP_OK && a->save_every) st = check_run_folder(a, err);
    }
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK) st = hp_comm_bcast(w, a->run_id, sizeof a->run_id, 0, err);
    if (st == HP_OK) st = hp_comm_bcast(w, a->data_sum, sizeof a->data_sum, 0, err);
    if (st == HP_OK) st = hp_comm_bcast(w, &a->data_bytes, sizeof a->data_bytes, 0, err);
    char cfg[PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/config.json", m->ckpt ? hp_ckpt_dir(m->ckpt) : a->model);
    if (st == HP_OK) st = m->has_config ? hp_train_model_config(cfg, &a->model_config, err)
                                        : ((a->model_config = strdup("{}")) ? HP_OK
                                           : hp_err_set(err, HP_ERR_NOMEM, "out of memory"));
    return hp_comm_agree(w, st, err);
}

/* Before a resume restores anything: every file of the checkpoint is the one its run saved, byte for byte (rank r
 * hashes its own state file, rank 0 also the model folder's two files). Collective. */
static hp_status verify_resume(hp_comm *w, const char *ckpt, hp_err *err)
{
    char name[64];
    int me = hp_comm_rank(w);
    snprintf(name, sizeof name, "rank-%d.safetensors", me);
    hp_status st = hp_train_ckpt_verify(ckpt, name, err);
    if (st == HP_OK && me == 0) st = hp_train_ckpt_verify(ckpt, "config.json", err);
    if (st == HP_OK && me == 0) st = hp_train_ckpt_verify(ckpt, "model.safetensors", err);
    if (st != HP_OK) hp_err_prefix(err, "--resume");
    return hp_comm_agree(w, st, err);
}

static int train(train_args *a, const cli_parser *cp, const char *usage_msg, int *argc, char ***argv)
{
    hp_err err;
    hp_err_clear(&err);
    hp_comm *w = NULL;
    if (hp_comm_world(&w, argc, argv, &err) != HP_OK) return cli_fail(&err);
    int N = hp_comm_size(w);
    bool root = hp_comm_rank(w) == 0;
    /* Before anything that differs by rank: every option but --threads as rank 0's, inputs by their identity. */
    static const int free_vals[] = {'t'};
    static const cli_agree_input agree_inputs[] = {{'i', cli_file_identity}, {O_DATA, cli_file_identity},
                                                   {O_EVAL, cli_file_identity}, {O_PLAN, cli_file_identity},
                                                   {CLI_O_OVERRIDES, cli_file_identity}, {O_RESUME, resume_identity}};
    hp_status st = cli_agree_flags(w, cp, free_vals, 1, agree_inputs, 6, &err);
    /* the same options: the same usage error on every rank, printed once */
    if (st == HP_OK) st = hp_comm_agree(w, usage_msg ? hp_err_set(&err, HP_ERR_INPUT, "%s", usage_msg) : HP_OK, &err);
    if (st != HP_OK) return finish(w, st, &err);
    hp_model *m = NULL;
    hp_plan *p = NULL;
    hp_overrides *ov = NULL;
    hp_runner *r = NULL;
    int64_t *ids = NULL, B = 0, S = 0;
    float *losses = NULL;
    tensor_list grads = {0}, params = {0};
    char omsg[8400];
    hp_outdir *of = NULL;
    hp_data *data = NULL, *eval = NULL;
    int64_t *eval_ids = NULL;
    FILE *log = NULL;
    const char *const inputs[] = {a->input, a->pf.overrides, a->plan, a->model, a->data, a->eval_data};
    if (a->grad_out && cli_output_problem("--grad-out", a->grad_out, a->model, inputs, 6, omsg, sizeof omsg))
        st = hp_err_set(&err, HP_ERR_INPUT, "%s", omsg);
    if (st == HP_OK && a->log_json &&
        cli_output_problem("--log-json", a->log_json, a->model, inputs, 6, omsg, sizeof omsg))
        st = hp_err_set(&err, HP_ERR_INPUT, "%s", omsg);
    if (st == HP_OK && a->plot && cli_output_problem("--plot", a->plot, a->model, inputs, 6, omsg, sizeof omsg))
        st = hp_err_set(&err, HP_ERR_INPUT, "%s", omsg);
    if (st == HP_OK && a->stats_json &&
        cli_output_problem("--stats-json", a->stats_json, a->model, inputs, 6, omsg, sizeof omsg))
        st = hp_err_set(&err, HP_ERR_INPUT, "%s", omsg);
    { /* no two outputs in one file */
        const char *name[] = {"--plot", "--log-json", "--grad-out", "--stats-json"};
        const char *path[] = {a->plot, a->log_json, a->grad_out, a->stats_json};
        for (int i = 0; i < 4; i++)
            for (int j = i + 1; j < 4 && st == HP_OK; j++)
                if (cli_same_output(path[i], path[j]))
                    st = hp_err_set(&err, HP_ERR_INPUT, "%s and %s name the same file %s", name[i], name[j], path[i]);
    }
    /* --resume into the run's own folder: it stays the run folder, with or without --save-every (the last step is
     * then its one new checkpoint; hyperpar merge makes the Hugging Face folder) */
    if (st == HP_OK && a->resume && a->out && !a->save_every && hp_train_ckpt_is(a->out)) {
        a->save_every = a->steps;
        if (root)
            say("--out %s is a run folder: the run continues in it, its last step saved as a checkpoint there "
                "('hyperpar merge %s' makes the Hugging Face folder)", a->out, a->out);
    }
    if (st == HP_OK && a->out && !a->save_every) { /* with --save-every DIR holds the checkpoints instead */
        hp_outdir_spec os = {.cmd = "train", .out = a->out, .names = g_out_names, .example = "trained",
                             .force = a->force, .inputs = inputs, .n_inputs = 4};
        st = hp_outdir_open(&of, &os, &err);
    }
    int64_t last = last_step(a);
    struct stat sb; /* the run folder: made just before step 1 */
    if (st == HP_OK && a->out && a->save_every && stat(a->out, &sb) == 0 && !S_ISDIR(sb.st_mode))
        st = hp_err_set(&err, HP_ERR_INPUT, "--out %s is not a folder; with --save-every it holds the run's "
                        "checkpoints", a->out);
    char ckpt[PATH_MAX + 64] = "";
    int64_t k0 = 0; /* steps already taken (--resume) */
    if (st == HP_OK && a->resume) st = hp_train_ckpt_find("--resume", a->resume, ckpt, sizeof ckpt, &err);
    /* A file inside --out DIR would go with the folder's rename (with --save-every the run folder is not renamed). */
    if (st == HP_OK && of && a->grad_out && inside_outdir(a->grad_out, of))
        st = hp_err_set(&err, HP_ERR_INPUT, "--grad-out %s is or lies inside --out %s; write it elsewhere", a->grad_out,
                        a->out);
    if (st == HP_OK && of && a->log_json && inside_outdir(a->log_json, of))
        st = hp_err_set(&err, HP_ERR_INPUT, "--log-json %s is or lies inside --out %s, whose folder replaces what is "
                        "there when the model is written; write it elsewhere", a->log_json, a->out);
    if (st == HP_OK && of && a->plot && inside_outdir(a->plot, of))
        st = hp_err_set(&err, HP_ERR_INPUT, "--plot %s is or lies inside --out %s; write it elsewhere", a->plot,
                        a->out);
    if (st == HP_OK && of && a->stats_json && inside_outdir(a->stats_json, of))
        st = hp_err_set(&err, HP_ERR_INPUT, "--stats-json %s is or lies inside --out %s; write it elsewhere",
                        a->stats_json, a->out);
    bool shard = hp_shard_is_folder(a->model);
    if (st == HP_OK) st = shard ? hp_moe_shard_config_open(&m, a->model, &err) : hp_model_open(&m, a->model, NULL, &err);
    if (st == HP_OK && a->out && !m->has_config)
        st = hp_err_set(&err, HP_ERR_INPUT, "%s has no config.json beside its weights; --out copies it into the "
                        "checkpoint it writes, so train the checkpoint folder", a->model);
    /* --plan, the shard folder's own plan (the flags checked against it), or the one the flags derive */
    if (st == HP_OK)
        st = cli_plan_resolve(&a->pf, a->plan, shard ? a->model : NULL, a->default_mesh, N, m, &p, &ov, &err);
    if (st == HP_OK) hp_mesh_str(&p->mesh, a->mesh, sizeof a->mesh);
    if (st == HP_OK && a->input) st = hp_data_read_input_ids(a->input, 0, &ids, &B, &S, &err);
    if (st == HP_OK && a->data) st = open_data(a, m, p, &data, &eval, &B, &S, &err);
    if (st == HP_OK && (data ? hp_data_row_scored(data) : S - 1) <= 0) /* S = 1: the loss is a mean of nothing */
        st = hp_err_set(&err, HP_ERR_INPUT, "%s: its rows are 1 token long, so no position is scored (each predicts "
                        "the next token) and a step would only decay the weights; give rows of 2 tokens or more",
                        data ? a->data : a->input);
    st = hp_comm_agree(w, st, &err);
    if (st == HP_OK) warn_no_effect(a, m, p, N);
    cli_threads_info ti = {0};
    if (st == HP_OK) {
        char tb[128];
        cli_threads(w, a->threads, &ti); /* collective: every rank asks */
        if (root) fprintf(stderr, "train: threads: %s\n", cli_threads_str(&ti, tb, sizeof tb));
    }
    /* a batch this node cannot hold is refused before it is read or allocated */
    int64_t eval_rows = eval ? eval_batch_max(hp_data_windows(eval), a->gb) : 0;
    if (st == HP_OK) st = memory_check(w, a, m, p, B, S, eval_rows, ti.local_ranks, &err);
    if (st == HP_OK && data) {
        ids = hp_calloc((size_t)(a->mb * S), sizeof *ids);
        if (eval) eval_ids = hp_calloc((size_t)(eval_rows * S), sizeof *eval_ids);
        if (!ids || (eval && !eval_ids)) st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory for the batch");
    }
    if (st == HP_OK) {
        losses = hp_calloc((size_t)a->steps, sizeof *losses);
        if (!losses) st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory for %lld losses", (long long)a->steps);
    }
    st = hp_comm_agree(w, st, &err);
    if (st == HP_OK && (a->save_every || a->resume)) st = bind_start(a, w, m, ckpt, &err);
    st = hp_comm_agree(w, st, &err);
    if (st == HP_OK) {
        hp_run_opts ro = {.command = "train", .shards = shard ? a->model : NULL, .keep_activations = true,
                          .compute = a->compute,
                          .test_nan_grad = cli_test_env_get().nan_grad}; /* the non-finite test's hook (testhooks.c) */
        st = hp_runner_create(&r, w, m, p, &ro, &err);
        st = hp_comm_agree(w, st, &err);
    }
    if (st == HP_OK && a->resume) {
        a->sched.lr = a->to.lr; /* as run_flags records it */
        int64_t was = 0;
        st = hp_comm_agree(w, read_checkpoint(a, N, ckpt, &k0, &was, &err), &err);
        if (st == HP_OK && was && root)
            fprintf(stderr, "train: --steps %lld where the run was saved with --steps %lld: the schedule of steps %lld.."
                    "%lld follows the new total (the steps before it followed the old one)\n", (long long)a->steps,
                    (long long)was, (long long)k0 + 1, (long long)a->steps);
        /* the load first: it names a tensor that is not finite; then every byte against state.json's hashes */
        if (st == HP_OK) st = hp_runner_load_train(r, ckpt, &err);
        if (st == HP_OK) st = verify_resume(w, ckpt, &err);
        if (st == HP_OK && root) say("resumed from %s at step %lld", ckpt, (long long)k0);
    }
    if (st == HP_OK && last <= k0)
        st = hp_err_set(&err, HP_ERR_INPUT, "--stop-after %lld: the run resumed at step %lld is already past it",
                        (long long)a->stop_after, (long long)k0);
    /* Every token the run will read, before step 1: a bad one found at step k would end the run after k - 1 steps
     * of work, and one in --eval-data after the first evaluation's; so would a last checkpoint it cannot save. */
    if (st == HP_OK && a->out && a->save_every) st = check_checkpoint_out(a, k0, last, inputs, &err);
    if (st == HP_OK && data) st = scan_data(a, data, eval, k0, last, m->cfg.vocab_size, ids, eval_ids, &err);
    log_prev prev = {0};
    if (st == HP_OK && root && a->log_json) st = log_check(a, k0, &prev, &err);
    st = hp_comm_agree(w, st, &err);
    /* Only now, every check passed, does the run create anything: the run folder, the log. */
    if (st == HP_OK && root && a->out && a->save_every) {
        if (mkdir(a->out, 0777) != 0 && errno != EEXIST)
            st = hp_err_set(&err, HP_ERR_INPUT, "--out %s: cannot create the run folder (%s)", a->out, strerror(errno));
        else /* what a killed run left there (a save it never finished) */
            hp_outdir_remove_stale(a->out);
    }
    if (st == HP_OK && root && a->log_json) st = log_open(a, &prev, &log, &err);
    st = hp_comm_agree(w, st, &err);
    a->sched.steps = a->steps;
    a->sched.lr = a->to.lr;
    /* With --data: GB/MB micro-batches of MB rows, each row scoring hp_data_row_scored positions; the loss of
     * every micro-batch's gradients is the mean over the whole step's n_scored. */
    int64_t n_micro = data ? a->gb / a->mb : 1, rows = data ? a->mb : B;
    int64_t n_scored = data ? a->gb * hp_data_row_scored(data) : B * (S - 1);
    train_view v;
    if (st == HP_OK) st = hp_comm_agree(w, view_init(&v, a, root, k0 - prev.n, last, &err), &err);
    else v = (train_view){0};
    for (int64_t t = 1; st == HP_OK && t <= prev.n && v.step; t++) { /* --plot: the whole run, the log's steps too */
        v.step[v.n_pts] = t, v.loss[v.n_pts] = prev.loss[t - 1], v.norm[v.n_pts++] = prev.norm[t - 1], v.n_prev++;
        if (!isnan(prev.eval[t - 1])) view_eval(&v, t, prev.eval[t - 1]);
    }
    v.k0 = k0;
    log_prev_free(&prev);
    if (st == HP_OK) st = measure_limit(w, m, n_micro * rows * S, a->compute, &v, &err);
    v.t0 = now_s();
    for (int64_t k = k0; st == HP_OK && k < last; k++) {
        double loss = 0, norm = 0, t0 = now_s();
        a->to.lr = hp_lr_at(&a->sched, k + 1);
        for (int64_t j = 0; st == HP_OK && j < n_micro; j++) {
            double lj = 0;
            if (a->data) {
                st = hp_data_batch(data, &a->order, k, j * a->mb, a->mb, m->cfg.vocab_size, ids, &err);
                st = hp_comm_agree(w, st, &err);
            }
            if (st == HP_OK) st = hp_runner_accumulate(r, ids, rows, S, a->data ? n_scored : 0, &lj, &err);
            loss += n_scored > 0 ? lj * (double)(rows * (S - 1)) / (double)n_scored : lj;
        }
        int64_t skipped0 = hp_runner_stats(r)->train_skipped;
        if (st == HP_OK) st = hp_runner_apply(r, &a->to, &norm, &err);
        st = hp_comm_agree(w, st, &err);
        if (st != HP_OK) break;
        bool skipped = hp_runner_stats(r)->train_skipped > skipped0;
        double dt = now_s() - t0, tps = dt > 0 ? (double)n_scored / dt : 0;
        losses[k] = (float)loss;
        double eval_loss = 0;
        bool evaluated = eval && (k + 1) % a->eval_every == 0;
        view_clear(&v);
        double mfu = view_step(&v, k + 1, loss, norm, a->to.lr, (double)n_scored, dt,
                               skipped ? " (not finite: step skipped)"
                               : a->to.clip > 0 && norm > a->to.clip ? " (clipped)" : "", skipped || evaluated);
        if (evaluated) {
            st = evaluate(r, w, eval, a->gb, m->cfg.vocab_size, eval_ids, &eval_loss, &err);
            if (st != HP_OK) break;
            view_eval(&v, k + 1, eval_loss);
            if (root) say("step %lld/%lld eval loss %.7g (%s, %lld windows)", (long long)(k + 1),
                              (long long)a->steps, eval_loss, a->eval_data, (long long)hp_data_windows(eval));
        }
        if (log) {
            fprintf(log, "{\"step\": %lld, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.17g, \"tokens_per_s\": %.6g, "
                    "\"step_s\": %.6g, \"mfu\": %.6g", (long long)(k + 1), loss, norm, a->to.lr, tps, dt, mfu);
            if (evaluated) fprintf(log, ", \"eval_loss\": %.9g", eval_loss);
            if (a->run_id[0]) fprintf(log, ", \"run_id\": \"%s\"", a->run_id);
            fprintf(log, "}\n");
            if ((fflush(log) != 0 || ferror(log)) && st == HP_OK) /* a full disk: said now, not lost */
                st = hp_err_set(&err, HP_ERR_IO, "--log-json %s: cannot write step %lld's line (%s)", a->log_json,
                                (long long)(k + 1), strerror(errno ? errno : EIO));
        }
        st = hp_comm_agree(w, st, &err);
        if (k == k0 && a->grad_out) {
            st = hp_runner_gather_params(r, true, keep, &grads, &err);
            st = hp_comm_agree(w, st, &err);
        }
        if (st == HP_OK && a->save_every && ((k + 1) % a->save_every == 0 || k + 1 == last))
            st = save_checkpoint(a, w, m, r, k + 1, &err);
        if (st == HP_OK) view_progress(&v, k + 1, now_s());
    }
    view_clear(&v);
    /* Rank 0 writes with no collective in between: a signal there removes what it had half-written (every
     * name it may have made: the writers' own temporaries, then the folder) and ends the process at once. */
    char rm[7][PATH_MAX + 200];
    int n_rm = 0;
    if (root && of) {
        snprintf(rm[n_rm++], sizeof rm[0], "%s/%s", hp_outdir_tmp(of), HP_OUTDIR_MARKER);
        for (int i = 0; g_out_names[i]; i++) {
            snprintf(rm[n_rm++], sizeof rm[0], "%s/%s", hp_outdir_tmp(of), g_out_names[i]);
            snprintf(rm[n_rm++], sizeof rm[0], "%s/%s.tmp.%ld", hp_outdir_tmp(of), g_out_names[i], (long)getpid());
        }
    }
    if (root && a->grad_out) snprintf(rm[n_rm++], sizeof rm[0], "%s.tmp.%ld", a->grad_out, (long)getpid());
    if (root && of) snprintf(rm[n_rm++], sizeof rm[0], "%s", hp_outdir_tmp(of));
    const char *rm_list[8];
    bool caught = false;
    for (int i = 0; i < n_rm; i++) rm_list[i] = rm[i];
    if (st == HP_OK && a->out && !a->save_every) { /* (with --save-every the last checkpoint is the model) */
        st = hp_runner_gather_params(r, false, keep, &params, &err);
        st = hp_comm_agree(w, st, &err);
        if (st == HP_OK && root) {
            cli_signals_catch();
            cli_signals_remove_on_signal(rm_list, n_rm);
            caught = true;
        }
        if (st == HP_OK && root) st = write_folder(a, m, &params, of, NULL, &err);
        st = hp_comm_agree(w, st, &err);
        if (st == HP_OK && root) say("wrote %s (%d trained parameters, float32)", a->out, params.n);
    }
    if (st == HP_OK && a->grad_out) {
        if (root && !caught) {
            cli_signals_catch();
            cli_signals_remove_on_signal(rm_list, n_rm);
            caught = true;
        }
        if (root) st = write_grads(a->grad_out, &grads, losses + k0, last - k0, &err);
        st = hp_comm_agree(w, st, &err);
        if (st == HP_OK && root) say("wrote %s (%d gradients, %lld losses)", a->grad_out,
                                         grads.n, (long long)(last - k0));
    }
    if (st == HP_OK && a->stats_json) st = cli_write_run_stats(w, r, a->stats_json, -1, &err);
    if (caught) {
        cli_signals_remove_on_signal(NULL, 0);
        cli_signals_release(0); /* the signals' earlier actions back (one caught meanwhile ended the process) */
    }
    if (log && fclose(log) != 0 && st == HP_OK)
        st = hp_err_set(&err, HP_ERR_IO, "--log-json %s: write error (%s)", a->log_json, strerror(errno));
    if (st == HP_OK && a->plot) {
        if (root) st = write_plot(a, m, p, &v, N, &err);
        st = hp_comm_agree(w, st, &err);
        if (st == HP_OK && root)
            say("wrote %s (%lld step%s)", a->plot, (long long)v.n_pts, v.n_pts == 1 ? "" : "s");
    }
    view_free(&v);
    list_free(&grads);
    list_free(&params);
    hp_data_close(data);
    hp_data_close(eval);
    free(eval_ids);
    free(losses);
    free(ids);
    hp_runner_free(r);
    hp_plan_free(p);
    hp_overrides_free(ov);
    hp_model_close(m);
    hp_outdir_close(of);
    free(a->model_config);
    return finish(w, st, &err);
}

/* A number for opt in [lo, hi) (hi_open) or [lo, hi] with lo itself allowed when lo_closed; else a usage error. */
static bool parse_real(const char *opt, const char *s, double lo, bool lo_closed, double hi, const char *want,
                       double *out)
{
    char *end = NULL;
    double v = strtod(s, &end);
    if (!*s || *end || !isfinite(v) || v < lo || (!lo_closed && v == lo) || v >= hi) {
        cli_usage_error("train", "%s expects %s, got '%s'", opt, want, s);
        return false;
    }
    *out = v;
    return true;
}

/* --help printed: exit 0 without training. */
#define PARSE_HELP (-1)

/* The command line into *a: HP_EXIT_OK, PARSE_HELP, or a usage error's exit code (the error printed, or deferred:
 * cli_usage_defer). */
static int parse(train_args *a, cli_parser *cp, int argc, char **argv)
{
    int64_t v;
    int c;
    optind = 1;
    while ((c = cli_getopt(cp, argc, argv)) != -1) {
        int pr = cli_plan_flag("train", c, optarg, &a->pf);
        if (pr < 0) return HP_EXIT_USAGE;
        if (pr > 0) continue;
        switch (c) {
        case 'h': usage(stdout); return PARSE_HELP;
        case 'i': a->input = optarg; break;
        case 'o': a->out = optarg; break;
        case O_GRAD: a->grad_out = optarg; break;
        case O_PLAN: a->plan = optarg; break;
        case O_LOGJSON: a->log_json = optarg; break;
        case O_STATS: a->stats_json = optarg; break;
        case O_PLOT: a->plot = optarg; break;
        case O_LOGEVERY: {
            char *end = NULL;
            errno = 0;
            long long n = strtoll(optarg, &end, 10);
            if (!*optarg || *end || errno || n < 1 || n > 1000000000)
                return cli_usage_error("train", "--log-every expects a whole number of steps in [1, 1000000000], got "
                                       "'%s' (the last step's line is always printed, so a large N prints little "
                                       "else)", optarg);
            a->log_every = n;
            break;
        }
        case O_DATA: a->data = optarg; break;
        case O_EVAL: a->eval_data = optarg; a->data_opts = true; break;
        case O_DDTYPE:
            if (!hp_data_dtype_parse(optarg, &a->dtype))
                return cli_usage_error("train", "--data-dtype expects uint16 or uint32, got '%s'", optarg);
            a->data_opts = a->dtype_given = true;
            break;
        case O_SHUFFLE:
            if (!strcmp(optarg, "none")) a->order.shuffle = HP_DATA_IN_ORDER;
            else if (!strcmp(optarg, "seeded")) a->order.shuffle = HP_DATA_SEEDED;
            else return cli_usage_error("train", "--shuffle expects none or seeded, got '%s'", optarg);
            a->data_opts = true;
            break;
        case O_SEED: {
            char *end = NULL;
            errno = 0;
            unsigned long long sv = strtoull(optarg, &end, 10);
            if (!*optarg || *end || errno || optarg[0] == '-')
                return cli_usage_error("train", "--seed expects an unsigned 64-bit integer, got '%s'", optarg);
            a->order.seed = (uint64_t)sv;
            a->data_opts = a->seed_given = true;
            break;
        }
        case O_SEQ:
            if (!cli_parse_i64("train", "--seq", optarg, 1, (int64_t)1 << 30, &a->seq)) return HP_EXIT_USAGE;
            a->data_opts = true;
            break;
        case O_GB:
            if (!cli_parse_i64("train", "--global-batch", optarg, 1, (int64_t)1 << 30, &a->gb)) return HP_EXIT_USAGE;
            a->data_opts = true;
            break;
        case O_MB:
            if (!cli_parse_i64("train", "--micro-batch", optarg, 1, (int64_t)1 << 30, &a->mb_rows)) return HP_EXIT_USAGE;
            a->data_opts = true;
            break;
        case O_EVERY:
            if (!cli_parse_i64("train", "--eval-every", optarg, 1, 1000000000, &a->eval_every)) return HP_EXIT_USAGE;
            a->data_opts = true;
            break;
        case O_SCHED:
            if (!hp_lr_kind_parse(optarg, &a->sched.kind))
                return cli_usage_error("train", "--schedule expects constant, linear or cosine, got '%s'", optarg);
            a->sched_given = true;
            break;
        case O_WARMUP:
            if (!cli_parse_i64("train", "--warmup", optarg, 0, 1000000000, &a->sched.warmup)) return HP_EXIT_USAGE;
            break;
        case O_MINLR:
            if (!parse_real("--min-lr", optarg, 0, true, HUGE_VAL, "a finite number >= 0", &a->sched.min_lr))
                return HP_EXIT_USAGE;
            break;
        case O_FORCE: a->force = true; break;
        case O_CLIP:
            if (!parse_real("--clip", optarg, 0, false, HUGE_VAL, "a finite number > 0", &a->to.clip)) return HP_EXIT_USAGE;
            break;
        case O_SKIPNF: a->to.skip_nonfinite = true; break;
        case O_COMPUTE:
            if (!cli_parse_compute("train", optarg, &a->compute)) return HP_EXIT_USAGE;
            break;
        case O_ZERO:
            if (!cli_parse_i64("train", "--zero", optarg, 0, 1, &v)) return HP_EXIT_USAGE;
            a->to.zero = (int)v;
            break;
        case O_STEPS:
            if (!cli_parse_i64("train", "--steps", optarg, 1, 1000000000, &a->steps)) return HP_EXIT_USAGE;
            break;
        case O_SAVE:
            if (!cli_parse_i64("train", "--save-every", optarg, 1, 1000000000, &a->save_every)) return HP_EXIT_USAGE;
            break;
        case O_STOP:
            if (!cli_parse_i64("train", "--stop-after", optarg, 1, 1000000000, &a->stop_after)) return HP_EXIT_USAGE;
            break;
        case O_RESUME: a->resume = optarg; break;
        case 't':
            if (!cli_parse_i64("train", "--threads", optarg, 1, 1024, &v)) return HP_EXIT_USAGE;
            a->threads = (int)v;
            break;
        case O_LR:
            if (!parse_real("--lr", optarg, 0, false, HUGE_VAL, "a finite number > 0", &a->to.lr)) return HP_EXIT_USAGE;
            break;
        case O_B1:
            if (!parse_real("--beta1", optarg, 0, true, 1, "a number in [0, 1)", &a->to.beta1)) return HP_EXIT_USAGE;
            break;
        case O_B2:
            if (!parse_real("--beta2", optarg, 0, true, 1, "a number in [0, 1)", &a->to.beta2)) return HP_EXIT_USAGE;
            break;
        case O_EPS:
            if (!parse_real("--eps", optarg, 0, false, HUGE_VAL, "a finite number > 0", &a->to.eps)) return HP_EXIT_USAGE;
            break;
        case O_WD:
            if (!parse_real("--weight-decay", optarg, 0, true, HUGE_VAL, "a finite number >= 0", &a->to.weight_decay))
                return HP_EXIT_USAGE;
            break;
        default: return cli_bad_option("train", argv);
        }
    }
    if (optind >= argc) return cli_usage_error("train", "missing MODEL");
    if (optind + 1 < argc) return cli_usage_error("train", "unexpected argument '%s'", argv[optind + 1]);
    a->model = argv[optind];
    if (!a->input && !a->data) return cli_usage_error("train", "missing --input IDS.safetensors or --data FILE");
    if (a->input && a->data)
        return cli_usage_error("train", "give either --input (the same batch every step) or --data (a token file), "
                               "not both");
    if (a->input && a->data_opts)
        return cli_usage_error("train", "--seq, --global-batch, --micro-batch, --data-dtype, --shuffle, --seed and "
                               "--eval-data/--eval-every go with --data, not --input");
    if (a->data) {
        if (!a->seq) return cli_usage_error("train", "--data needs --seq S (the window length)");
        if (!a->gb) return cli_usage_error("train", "--data needs --global-batch GB (windows per step)");
        a->mb = a->gb; /* one micro-step a step until the plan's dp sets it (open_data) */
        if (!a->eval_data != !a->eval_every)
            return cli_usage_error("train", "--eval-data and --eval-every go together");
        a->order.global_batch = a->gb;
    } else if (!a->sched_given) {
        a->sched.kind = HP_LR_CONSTANT; /* --input: a constant lr unless a schedule is asked for, as before */
    }
    if (a->sched.min_lr > a->to.lr)
        return cli_usage_error("train", "--min-lr %g is above --lr %g", a->sched.min_lr, a->to.lr);
    if (a->force && !a->out && !a->log_json)
        return cli_usage_error("train", "--force replaces an earlier --out DIR or --log-json FILE; give one");
    if (a->save_every && !a->out)
        return cli_usage_error("train", "--save-every needs --out DIR: the run folder its checkpoints go in");
    if (a->stop_after > a->steps)
        return cli_usage_error("train", "--stop-after %lld is past --steps %lld", (long long)a->stop_after,
                               (long long)a->steps);
    if (a->plan && a->pf.any)
        return cli_usage_error("train", "give either --plan or the plan flags (--mesh, --tp, ...), not both");
    a->default_mesh = !a->pf.mesh_spec && !a->pf.sizes_given && !a->pf.ep_given && !a->pf.ep_axis;
    if (!a->default_mesh) {
        int rc = cli_plan_flags_mesh("train", &a->pf, 1);
        if (rc != HP_EXIT_OK) return rc;
    }
    return HP_EXIT_OK;
}

/* "hyperpar train ARGS" as typed, each argument that needs it in single quotes: what a checkpoint records of the
 * command that saved it. Cut at cap. */
static void cmdline_of(int argc, char **argv, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "hyperpar train");
    for (int i = 1; i < argc && n < cap; i++) {
        const char *x = argv[i];
        bool plain = *x && strspn(x, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=.,/:@+%") ==
                               strlen(x);
        n += (size_t)snprintf(out + n, cap - n, plain ? " %s" : " '", x);
        for (const char *c = x; !plain && *c && n + 5 < cap; c++)
            n += (size_t)(*c == '\'' ? snprintf(out + n, cap - n, "'\\''") : snprintf(out + n, cap - n, "%c", *c));
        if (!plain && n < cap) n += (size_t)snprintf(out + n, cap - n, "'");
    }
}

int cmd_train(int argc, char **argv)
{
    train_args a = {.steps = 1, .log_every = 1};
    hp_train_opts_default(&a.to);
    cli_plan_flags_init(&a.pf);
    cli_parser cp = {.cmd = "train", .opts = g_opts};
    /* Under a launcher a usage error is said after the ranks agreed on their options: one rank's bad value (an
     * MPMD launch) is then named as the option that differs, where otherwise it would end the job unsaid. The
     * options after the bad one are still read, so that every rank's list is whole. */
    char usage_msg[HP_ERR_MSG_MAX] = "";
    bool launched = hp_comm_launched();
    if (launched) cli_usage_defer(usage_msg, sizeof usage_msg);
    cmdline_of(argc, argv, a.cmdline, sizeof a.cmdline);
    int rc = parse(&a, &cp, argc, argv), c;
    while (rc > 0 && launched && (c = cli_getopt(&cp, argc, argv)) != -1 && c != '?') continue;
    cli_usage_defer(NULL, 0);
    if (rc == PARSE_HELP) return HP_EXIT_OK;
    if (rc != HP_EXIT_OK && !launched) return rc;
    if (rc != HP_EXIT_OK && !usage_msg[0]) /* every path above says why; this only guards the message */
        snprintf(usage_msg, sizeof usage_msg, "train: bad usage; see 'hyperpar train --help'");
    return train(&a, &cp, rc != HP_EXIT_OK ? usage_msg : NULL, &argc, &argv);
}
