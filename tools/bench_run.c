/*
 * bench_run.c — `hyperpar bench run --preset P [...]`: the runtime's whole forward pass (hp_runner_forward:
 * embedding, decoder layers, norm, lm_head, loss) at a real model's layer shapes, dense (llama-3-8b) or MoE
 * (qwen3-30b-a3b, mixtral-8x7b, gpt-oss-20b, deepseek-v3), over the ranks of mpirun, timed, and compared with
 * figures measured in the same run on the same ranks:
 *
 *   - each collective kind's time inside the runtime (hp_run_stats.coll_s: the whole transition, packing,
 *     the MPI call and unpacking; for the all-to-all the MoE token exchange, dispatch and return) next to a
 *     bare hp_comm collective of the same bytes per call, called as many times, on the same group, right
 *     after: ratio bare / runtime (target >= 0.8);
 *   - resident weight bytes on the largest rank next to the plan's share: the checkpoint's weight bytes / tp,
 *     for MoE dense bytes / tp + routed-expert bytes (names with ".experts.") / ep (target: within 5%);
 *   - MoE: the phase times of the EP forward (route ... shared) summed over the sparse layers.
 *
 * The checkpoint is random: rank 0 writes it into a fresh temporary folder (mkdtemp under $TMPDIR or /tmp:
 * hp-bench-run-XXXXXX/ holds the file "owner", naming the host and PID of the run, and model/, the checkpoint)
 * and every rank opens it and derives the plan for the mesh (dp, cp, tp; tp fastest; MoE: TP-extend-EP with
 * ep = tp unless --ep, the EP compute declared by the overrides hp_plan_suggest_overrides writes, as
 * `hyperpar plan --suggest-overrides` prints them); the folder is removed at the end, also on failure and on
 * SIGINT / SIGTERM / SIGHUP (rank 0's handler removes it and re-raises the signal), and a later run removes
 * the folders of runs killed outright (kill -9: their owner names this host and a PID that no longer runs). A dense
 * preset up to gen's HP_GEN_MAX_DIM (65536) is written by hp_gen_checkpoint. Llama-3's vocabulary is 128256,
 * and gen's DeepSeek-V3 config holds small MLA ranks and groups, so those and every MoE preset are written
 * here instead (write_from_config): gen's config.json text with vocab_size and the preset's MoE fields
 * rewritten, the tensors of its meta model, values with gen's scales. All ranks must see rank 0's folder: one
 * machine, or a TMPDIR shared by every node.
 *
 * Groups of the bare collectives: the runtime counts each kind over both its tp and cp groups (and the loss
 * sums over the world), so the bare ones run on the tp group (split(world, rank / tp, rank % tp), the
 * runtime's rank order for a dp,cp,tp mesh), on the cp group when tp = 1 and cp > 1, on the world otherwise;
 * a gather (a MoE block's routing; the runner takes no logits: hp_run_opts.no_logits) goes to rank 0 over the
 * world, each rank sending its own bytes per call; the
 * all-to-all runs on the EP group (hp_mesh_ep_index, as the runner splits it), per_call / G bytes to each rank.
 * Bytes per call are each kind's bytes / calls (its mean), so the bare run moves the same total bytes in the
 * same number of calls. Times are the slowest rank's (max over ranks) per rep, then the median over reps (the
 * forward's with the least and the greatest rep beside it). The host's 1-minute load average is read before any
 * work and again after PyTorch, and printed with the report (issue 40). Only rank 0 prints; every failure goes through hp_comm_agree so that no rank is left in a collective.
 *
 * `hyperpar bench train` (bench_train.c) is parsed and set up here too, with the same options, checkpoint, plan
 * and mesh; its runner keeps the activations, and once it exists run() hands the timing and the report to
 * cli_bench_train (bench_run.h declares what the two files share).
 *
 * Test-only options --hidden, --intermediate, --heads, --kv-heads and --head-dim replace the preset's shapes
 * so that the CLI tests run in seconds (--experts and --dense-layers are real options: the real DeepSeek-V3
 * sparse layer needs more memory than a 24 GiB machine has).
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "bench_run.h"
#include "costflags.h"
#include "hyperpar/cost.h"
#include "signals.h"
#include "hyperpar/gen.h"
#include "hyperpar/overrides.h"

enum { MAX_REPS = CLI_BENCH_MAX_REPS };
#define MAX_VOCAB (1 << 20) /* above every published vocabulary (262144 is the largest we know) */
#define RATIO_TARGET 0.8    /* bare / runtime per collective kind */
#define GEMM_SHARE_TARGET 0.7 /* the forward's GEMM rate / the same-run GEMM limit (issue 24) */
#define RESIDENT_TOL 0.05   /* |resident / (checkpoint / tp) - 1| */

typedef cli_bench_args rb_args;
typedef cli_bench_info rb_info;

static bool is_moe(const rb_args *a) { return a->p->experts > 0; }

enum {
    O_HIDDEN = 300, O_INTER, O_HEADS, O_KV, O_HD, O_DP, O_CP, O_TP, O_EP, O_EXPERTS, O_DENSE, O_BATCH, O_FORMAT, O_DECODE,
    O_COMPUTE
};

/* What the command line says: the arguments, the preset's name and the test-only shapes (0: the preset's). */
typedef struct rb_opts {
    rb_args a;
    const char *preset;
    int64_t shape[5]; /* --hidden, --intermediate, --heads, --kv-heads, --head-dim */
} rb_opts;

static const cli_enum g_dtypes = {"must be", {{"bf16", HP_DT_BF16, false}, {"f32", HP_DT_F32, false}}};
static const cli_enum g_formats = {NULL, {{"text", 0, false}, {"json", 1, false}}}; /* into json */

#define G_TEST "test-only: replace the preset's shapes (for MoE presets --intermediate replaces the dense and\n" \
               "the expert width)"
static const cli_opt g_opts[] = {
    {"preset", 'p', "P", "a preset, listed below", 0, NULL, CLI_STR(rb_opts, preset)},
    {"layers", 'L', "L", "decoder layers (1; deepseek-v3: 4, its 3 dense layers and one sparse)", 0, NULL,
     CLI_INT(rb_opts, a.layers, 1, 1024)},
    {"tokens", 'T', "T", "sequence length T of the batch [B, T] (256)", 0, NULL, CLI_INT(rb_opts, a.tokens, 1, 65536)},
    {"seq", 'T', "T", NULL, 0, NULL, CLI_ALIAS},
    {"batch", O_BATCH, "B", "rows B of the global batch [B, T], at least dp (default dp: one row per dp replica)",
     0, NULL, CLI_INT(rb_opts, a.batch, 1, 65536)},
    {"vocab", 'V', "V", "vocabulary instead of the preset's: the embedding and lm_head are V x H, so a\n"
                        "smaller V makes the checkpoint smaller and its generation faster (one bf16 layer\n"
                        "with vocab 128256 is ~2.5 GB; --vocab 32000 is ~1 GB)", 0, NULL,
     CLI_INT(rb_opts, a.vocab, 1, MAX_VOCAB)},
    {"tp", O_TP, "N", "the mesh's tp (default: the number of processes)", 0, NULL,
     CLI_INT(rb_opts, a.tp, 1, HP_MESH_MAX_SIZE), CLI_MARK(rb_opts, a.tp_given)},
    {"dp", O_DP, "N", "the mesh's dp (1)", 0, NULL, CLI_INT(rb_opts, a.dp, 1, HP_MESH_MAX_SIZE)},
    {"cp", O_CP, "N", "the mesh's cp (1)", 0, NULL, CLI_INT(rb_opts, a.cp, 1, HP_MESH_MAX_SIZE)},
    {"ep", O_EP, "N", "MoE presets: expert parallelism, TP-extend-EP over groups of N consecutive ranks\n"
                      "(default: N = tp, the experts spread over the tp group); with N > 1 the EP compute is\n"
                      "declared as 'hyperpar plan MODEL --tp N --ep N --suggest-overrides' prints it. With\n"
                      "ep 1 and tp > 1 the experts are cut over tp (the resident figure assumes whole experts)",
     0, NULL, CLI_INT(rb_opts, a.ep, 1, HP_MESH_MAX_SIZE)},
    {"experts", O_EXPERTS, "E", "MoE presets: routed experts per sparse layer instead of the preset's (its top-k,\n"
                                "widths and shared expert unchanged), a multiple of ep. DeepSeek-V3's real sparse\n"
                                "layer is ~21 GiB in bf16 (256 x 3 x 7168 x 2048) and does not fit a 24 GiB machine:\n"
                                "shrink it, e.g. --experts 16 (routing groups: min(8, E/2), half of them picked)",
     0, NULL, CLI_INT(rb_opts, a.experts, 1, HP_GEN_MAX_EXPERTS)},
    {"dense-layers", O_DENSE, "N", "deepseek-v3: leading dense layers instead of first_k_dense_replace 3", 0, NULL,
     CLI_INT(rb_opts, a.first_dense, 0, 1023)},
    {"dtype", 'd', "D", "dtype the weights are generated and held in: bf16 (default) or f32", 0, NULL,
     CLI_ENUM(rb_opts, a.dtype, g_dtypes)},
    {"compute", O_COMPUTE, "M", "exact (default: f32 products) or bf16: both operands of every product rounded to\n"
                                "bf16, f32 sums (oneDNN bf16 x bf16 where the CPU has it); the GEMM limit and\n"
                                "PyTorch (a bf16 model for run, autocast for train) follow it", 0, NULL,
     CLI_ENUM(rb_opts, a.compute, cli_enum_compute)},
    {"reps", 'R', "R", "timed forwards (run) or training steps (train) after one warm-up (3); the median is\n"
                      "reported", 0, NULL, CLI_INT(rb_opts, a.reps, 1, MAX_REPS)},
    {"decode", O_DECODE, "N", "run only: after the batch's prefill, N decode steps of one token per row over the\n"
                              "KV cache (generate's), against the memory-bandwidth floor, cost --mode decode\n"
                              "and PyTorch's generate (docs/generate.md)", 0, NULL,
     CLI_INT(rb_opts, a.decode, 1, 65536)},
    {"threads", 't', "N", "threads per rank for the GEMMs and OpenBLAS (default: OMP_NUM_THREADS when set,\n"
                          "else this process's cores divided by the ranks on this node)", 0, NULL,
     CLI_INT(rb_opts, a.threads, 1, 1024)},
    {"format", O_FORMAT, "F", "text (default) or json: one JSON object", 0, NULL, CLI_ENUM(rb_opts, a.json, g_formats)},
    {"json", 'j', NULL, "the same as --format json", 0, NULL, CLI_FLAG(rb_opts, a.json)},
    CLI_OPT_HELP,
    {"hidden", O_HIDDEN, "N", "hidden size", 0, G_TEST, CLI_INT(rb_opts, shape[0], 1, HP_GEN_MAX_DIM)},
    {"intermediate", O_INTER, "N", "dense MLP width", 0, G_TEST, CLI_INT(rb_opts, shape[1], 1, HP_GEN_MAX_DIM)},
    {"heads", O_HEADS, "N", "attention heads", 0, G_TEST, CLI_INT(rb_opts, shape[2], 1, HP_GEN_MAX_DIM)},
    {"kv-heads", O_KV, "N", "key/value heads", 0, G_TEST, CLI_INT(rb_opts, shape[3], 1, HP_GEN_MAX_DIM)},
    {"head-dim", O_HD, "N", "head dimension", 0, G_TEST, CLI_INT(rb_opts, shape[4], 1, HP_GEN_MAX_DIM)},
    {0},
};

/* What bench run (train: bench train) measures and against what; the targets are this file's constants. */
static void about(FILE *out, bool train)
{
    if (train)
        fprintf(out,
                "Runs training steps (hp_runner_train_step: the forward, the backward with the gradient sums, AdamW\n"
                "with PyTorch's defaults) on a random checkpoint with the preset's layer shapes over all N ranks, as\n"
                "'hyperpar train' does, on a fixed batch of B x T ids, and prints the median step (slowest rank),\n"
                "training tokens/s, the split into forward, backward (and its communication) and optimizer, and the\n"
                "model FLOPs per step (6 x the weights a token goes through x B x T) over the step as achieved\n"
                "GFLOP/s, next to the dense f32 GEMM rate of every rank measured in the same run (ratio).\n");
    else
        fprintf(out,
                "Runs the runtime's whole forward pass (embedding, L decoder layers, norm, lm_head, loss) on a random\n"
                "checkpoint with the preset's layer shapes over all N ranks, as 'hyperpar run' does, and prints prefill\n"
                "tokens/s and the forward's GEMM rate next to the same-run GEMM limit of its compute mode (a 2048^3\n"
                "product through the GEMM layer on every rank at once; ratio, target >= %.1f), the slowest rank's\n"
                "compute and communication time, each collective kind's time next to a\n"
                "bare MPI collective of the same bytes and calls measured in the same run (ratio bare/runtime, target\n"
                ">= %.1f), and the resident weight bytes per rank next to the plan's share (target within %.0f%%): the\n"
                "checkpoint's / tp, for MoE presets dense bytes / tp + expert bytes / ep. MoE presets also print the\n"
                "EP token exchange (all-to-all) and the MoE phase times summed over the sparse layers.\n",
                GEMM_SHARE_TARGET, RATIO_TARGET, RESIDENT_TOL * 100);
    fprintf(out, "Then, when $HP_BENCH_PYTHON (default python3) can import torch, rank 0 times PyTorch eager on the\n"
                 "same checkpoint and batch with this node's threads (%s) and prints\n"
                 "its tokens/s and the ratio hyperpar/PyTorch; otherwise a note says why.\n",
            train ? "a forward+backward+AdamW step, f32" : "the forward, in the checkpoint's dtype");
    fprintf(out, "Every median is printed with the least and the greatest of its reps (JSON: *_min_s, *_max_s beside\n"
                 "it), and the report gives the host's 1-minute load average at the start and the end (load_start,\n"
                 "load_end; -1 when unreadable), so that a loaded run can be told from a quiet one.\n");
    fprintf(out, "Rank 0 writes the checkpoint into a temporary folder under $TMPDIR (or /tmp), removed at the end;\n"
                 "every rank must see it. Also runs as one process without mpirun.\n"
                 "HP_GEMM=onednn in the environment runs every large product of the GEMM layer on oneDNN, and\n"
                 "HP_GEMM=hyperpar every one on hyperpar's blocked AVX-512 kernel where the CPU has it, to compare\n"
                 "the two with the default choice (docs/kernels.md).\n");
}
static void about_run(FILE *out) { about(out, false); }
static void about_train(FILE *out) { about(out, true); }

static void presets(FILE *out)
{
    fprintf(out, "presets:\n");
    cli_print_presets(out, false);
}

const cli_command cli_cmd_bench_run = {
    .cmd = "bench",
    .name = "bench run",
    .summary = "the runtime's whole forward pass over MPI ranks against bare collectives",
    .forms = {{"[mpirun -np N]", "--preset"}},
    .about_more = about_run,
    .opts = g_opts,
    .epilog_more = presets,
    .run = cmd_bench_run,
};

const cli_command cli_cmd_bench_train = {
    .cmd = "bench",
    .name = "bench train",
    .summary = "the training step over MPI ranks against the same-run GEMM rate",
    .forms = {{"[mpirun -np N]", "--preset"}},
    .about_more = about_train,
    .opts = g_opts,
    .epilog_more = presets,
    .run = cmd_bench_train,
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

cli_bench_spread cli_bench_spread_sort(double *v, size_t n)
{
    if (n == 0) return (cli_bench_spread){0, 0, 0};
    qsort(v, n, sizeof *v, cmp_double);
    double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return (cli_bench_spread){v[0], med, v[n - 1]};
}

cli_bench_spread cli_bench_spread_col(const double *rows, int reps, int ncol, int c)
{
    double v[MAX_REPS];
    int n = reps < MAX_REPS ? reps : MAX_REPS;
    for (int i = 0; i < n; i++) v[i] = rows[i * ncol + c];
    return cli_bench_spread_sort(v, n > 0 ? (size_t)n : 0);
}

void cli_bench_spread_json(const char *prefix, const cli_bench_spread *s)
{
    printf(", \"%smin_s\": %.6g, \"%smax_s\": %.6g", prefix, s->min, prefix, s->max);
}

double cli_bench_loadavg(void)
{
    double l;
    return getloadavg(&l, 1) == 1 ? l : -1.0;
}

/* "0.82", or "unknown" when the load could not be read. */
static const char *load_str(double l, char *buf, size_t cap)
{
    if (l < 0) snprintf(buf, cap, "unknown");
    else snprintf(buf, cap, "%.2f", l);
    return buf;
}

void cli_bench_load_text(const cli_bench_load *l, int width)
{
    char s[32], e[32];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("  %-*s: 1-minute load average %s at start, %s at end (%ld core%s)\n", width, "load",
           load_str(l->start, s, sizeof s), load_str(l->end, e, sizeof e), cores, cores == 1 ? "" : "s");
}

void cli_bench_load_json(const cli_bench_load *l)
{
    /* two decimals, as /proc/loadavg has them; -1 when unreadable */
    printf(", \"load_start\": %.2f, \"load_end\": %.2f", l->start < 0 ? -1.0 : l->start, l->end < 0 ? -1.0 : l->end);
}

/* ---- the temporary checkpoint ---- */

/* Removes the files of a folder this run created (gen writes no subfolders), then the folder. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        char path[4200];
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (unlink(path) != 0) fprintf(stderr, "hyperpar bench: could not remove %s: %s\n", path, strerror(errno));
        }
        closedir(d);
    }
    if (rmdir(dir) != 0) fprintf(stderr, "hyperpar bench: could not remove %s: %s\n", dir, strerror(errno));
}

/* Removes what a run folder root holds (model/ with the checkpoint files, the owner file), then root; only the
 * names bench run and the writers it calls create, so a folder holding anything else stays. Silent. */
static void remove_run(const char *root)
{
    char model[4200], path[4600];
    snprintf(model, sizeof model, "%s/model", root);
    DIR *d = opendir(model);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, "model.safetensors", 17) && strncmp(e->d_name, "config.json", 11)) continue;
        snprintf(path, sizeof path, "%s/%s", model, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(model);
    snprintf(path, sizeof path, "%s/owner", root);
    unlink(path);
    rmdir(root);
}

/* Removes the run folders under base of bench runs that were killed outright (kill -9, a crash): their owner
 * file names this host and a PID that no longer runs. Another host's folder (a shared TMPDIR) stays. */
static void remove_stale_runs(const char *base)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    DIR *d = opendir(base);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, "hp-bench-run-", 13) || strlen(e->d_name) != 19) continue;
        char root[4200], path[4300], text[512] = "", h[256];
        snprintf(root, sizeof root, "%s/%s", base, e->d_name);
        snprintf(path, sizeof path, "%s/owner", root);
        struct stat sb;
        if (lstat(root, &sb) != 0 || !S_ISDIR(sb.st_mode) || sb.st_uid != geteuid()) continue;
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
        if (f) fclose(f);
        text[n] = '\0';
        long pid = 0;
        if (sscanf(text, "hyperpar bench run host %255s pid %ld", h, &pid) != 2 || strcmp(h, host) != 0 || pid <= 0 ||
            pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        remove_run(root);
        fprintf(stderr, "hyperpar bench: removed %s, left by bench run process %ld, which no longer runs\n", root,
                pid);
    }
    if (d) closedir(d);
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* One tensor of write_from_config: values scale * u, u uniform in [-1, 1) from (the name's hash, index);
 * norms 1 + 0.1 u, other vectors 0.1 u, matrices u / sqrt(fan_in), as gen writes them. */
typedef struct big_fill {
    const hp_param *p;
    uint64_t key;
    int64_t done; /* elements already produced (the writer fills a tensor in pieces, in order) */
} big_fill;

static hp_status big_fill_fn(void *ctx, void *dst, size_t nbytes, hp_err *err)
{
    big_fill *f = ctx;
    const hp_param *p = f->p;
    size_t el = (size_t)hp_dtype_bits(p->dtype) / 8;
    int64_t n = (int64_t)(nbytes / el);
    size_t len = strlen(p->name);
    bool norm = len >= 11 && !strcmp(p->name + len - 11, "norm.weight");
    float scale = p->n_dims >= 2 ? 1.0f / sqrtf((float)p->shape[p->n_dims - 1]) : 0.1f, buf[4096];
    for (int64_t off = 0; off < n; off += 4096) {
        int64_t m = n - off < 4096 ? n - off : 4096;
        for (int64_t i = 0; i < m; i++) {
            uint64_t z = splitmix64(f->key + (uint64_t)(f->done + off + i) * 0xD1B54A32D192ED03ull);
            float u = (float)((double)(z >> 40) / (double)(1 << 24) * 2.0 - 1.0);
            buf[i] = norm ? 1.0f + 0.1f * u : scale * u;
        }
        hp_status st = hp_dtype_from_f32(p->dtype, buf, (char *)dst + (size_t)off * el, m, err);
        if (st != HP_OK) return st;
    }
    f->done += n;
    return HP_OK;
}

/* Replaces the integer value of "key" in the config.json text *text (malloc'd; reallocated). */
static hp_status patch_int(char **text, const char *key, int64_t value, hp_err *err)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *at = strstr(*text, pat);
    char *digits = at ? (char *)at + strlen(pat) : NULL;
    while (digits && *digits == ' ') digits++;
    size_t n_digits = digits ? strspn(digits, "0123456789") : 0;
    if (!n_digits) return hp_err_set(err, HP_ERR_IO, "gen's config.json text has no integer %s to rewrite", key);
    size_t cap = strlen(*text) + 32;
    char *out = malloc(cap);
    if (!out) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    snprintf(out, cap, "%.*s%lld%s", (int)(digits - *text), *text, (long long)value, digits + n_digits);
    free(*text);
    *text = out;
    return HP_OK;
}

/* Whether hp_gen_checkpoint writes the checkpoint: dense presets up to gen's HP_GEN_MAX_DIM. MoE presets are
 * written here (write_from_config): gen's DeepSeek-V3 config holds small MLA ranks, routing groups and one
 * leading dense layer, and gen writes real-sized MoE layers slowly (one qwen3-30b-a3b layer, 1.19 GiB: 207 s
 * on the 2-core VM; write_from_config's threaded writer takes seconds). */
static bool gen_fits(const rb_args *a) { return a->vocab <= HP_GEN_MAX_DIM && !is_moe(a); }

/* The checkpoint must fit in the free space of dir's filesystem (TMPDIR): refused before writing, as a usage
 * error (the sizes asked for are the cause), instead of filling the disk. Byte sums overflow-checked. */
static hp_status check_room(const hp_model *m, const char *dir, hp_err *err)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        if (m->params[i].nbytes > UINT64_MAX - bytes)
            return hp_err_set(err, HP_ERR_INPUT, "the checkpoint would be more than 2^64 bytes; choose smaller sizes");
        bytes += m->params[i].nbytes;
    }
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0 || (sv.f_frsize && sv.f_bavail > UINT64_MAX / sv.f_frsize)) return HP_OK;
    uint64_t room = (uint64_t)sv.f_bavail * sv.f_frsize;
    if (bytes <= room) return HP_OK;
    char need[32], have[32];
    return hp_err_set(err, HP_ERR_INPUT,
                      "%s: the checkpoint would be %s but the filesystem has %s free; choose smaller sizes (--layers, "
                      "--vocab, --experts, ...) or set TMPDIR to a folder with room for it",
                      dir, hp_format_bytes(bytes, need, sizeof need), hp_format_bytes(room, have, sizeof have));
}

/* The options gen is given for the checkpoint of a. */
static hp_gen_opts gen_opts_of(const rb_args *a)
{
    hp_gen_opts g;
    hp_gen_opts_default(&g);
    g.family = a->p->family;
    g.layers = a->layers;
    g.hidden = a->hidden;
    g.heads = a->heads;
    g.kv_heads = a->kv_heads;
    g.head_dim = a->head_dim;
    g.intermediate = a->intermediate;
    g.vocab = a->vocab;
    g.dtype = a->dtype;
    if (is_moe(a)) {
        g.experts = a->experts;
        g.top_k = a->p->top_k;
        g.moe_intermediate = a->moe_intermediate;
    }
    return g;
}

/* The checkpoint's config.json text (malloc'd into *cfg): gen's for o (vocab at most HP_GEN_MAX_DIM) with
 * vocab_size and the DeepSeek-V3 fields rewritten to the preset's; for a checkpoint gen writes itself (gen_fits)
 * the same text gen writes. */
static hp_status config_text(const rb_args *a, const hp_gen_opts *o, char **cfg, hp_err *err)
{
    hp_gen_opts g = *o;
    g.vocab = o->vocab < HP_GEN_MAX_DIM ? o->vocab : HP_GEN_MAX_DIM;
    hp_status st = hp_gen_config_text(&g, cfg, err);
    if (st == HP_OK) st = patch_int(cfg, "vocab_size", o->vocab, err);
    if (a->p->q_lora) {
        const char *keys[] = {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                              "n_group", "topk_group", "first_k_dense_replace"};
        const int64_t vals[] = {a->p->q_lora, a->p->kv_lora, a->p->nope, a->p->rope, a->p->v_head,
                                a->n_group, a->topk_group, a->first_dense};
        for (size_t i = 0; st == HP_OK && i < sizeof keys / sizeof *keys; i++) st = patch_int(cfg, keys[i], vals[i], err);
    }
    return st;
}

/* A checkpoint gen cannot write itself (gen_fits false): config_text's config.json and the tensors its meta
 * model lists (dense and MoE families alike), into the (empty) folder dir. */
static hp_status write_from_config(const rb_args *a, const hp_gen_opts *o, const char *dir, int threads, hp_err *err)
{
    char *cfg = NULL;
    hp_status st = config_text(a, o, &cfg, err);
    hp_model *m = NULL;
    hp_st_writer *w = NULL;
    big_fill *fills = NULL;
    if (st == HP_OK) st = hp_model_from_config_text(&m, cfg, strlen(cfg), "bench config.json", NULL, err);
    if (st == HP_OK) st = check_room(m, dir, err);
    if (st == HP_OK) {
        w = hp_st_writer_create();
        fills = calloc(m->n_params ? m->n_params : 1, sizeof *fills);
        if (!w || !fills) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "format", "pt", err);
    for (size_t i = 0; st == HP_OK && i < m->n_params; i++) {
        const hp_param *p = &m->params[i];
        fills[i] = (big_fill){.p = p, .key = hp_hash64_bytes(p->name, strlen(p->name), o->seed)};
        st = hp_st_writer_add_fill(w, p->name, p->dtype, p->n_dims, p->shape, big_fill_fn, &fills[i], err);
    }
    char path[4200];
    if (st == HP_OK) {
        hp_st_writer_set_threads(w, threads);
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        st = hp_st_writer_write(w, path, err);
    }
    if (st == HP_OK) { /* config.json last, under a temporary name: a folder without one is no checkpoint */
        char tmp[4300];
        snprintf(path, sizeof path, "%s/config.json", dir);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        bool ok = f && fputs(cfg, f) != EOF && fputc('\n', f) != EOF;
        ok = (f && fclose(f) == 0) && ok;
        if (!ok || rename(tmp, path) != 0)
            st = hp_err_set(err, HP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    hp_st_writer_destroy(w);
    free(fills);
    hp_model_close(m);
    free(cfg);
    return st;
}

/* Rank 0: a fresh run folder root (*made once it exists) with the owner file and the checkpoint of a in
 * dir = root/model. From the moment root exists until cli_signals_release, a signal removes it (every name the
 * writers use in it) and ends the process with that signal. */
static hp_status make_checkpoint(const rb_args *a, char *root, char *dir, size_t cap, bool *made, double *seconds,
                                 hp_err *err)
{
    const char *base = getenv("TMPDIR");
    base = base && *base ? base : "/tmp";
    remove_stale_runs(base);
    snprintf(root, cap, "%s/hp-bench-run-XXXXXX", base);
    if (!mkdtemp(root))
        return hp_err_set(err, HP_ERR_IO, "%s: cannot create the temporary folder for the checkpoint there: %s (set "
                          "TMPDIR to a writable folder with room for it)", base, strerror(errno));
    *made = true;
    char paths[8][4200];
    const long pid = (long)getpid();
    snprintf(dir, cap, "%s/model", root);
    snprintf(paths[0], sizeof paths[0], "%s/model.safetensors", dir);
    snprintf(paths[1], sizeof paths[1], "%s/model.safetensors.tmp.%ld", dir, pid);
    snprintf(paths[2], sizeof paths[2], "%s/config.json", dir);
    snprintf(paths[3], sizeof paths[3], "%s/config.json.tmp", dir);
    snprintf(paths[4], sizeof paths[4], "%s/config.json.tmp.%ld", dir, pid);
    snprintf(paths[5], sizeof paths[5], "%s", dir);
    snprintf(paths[6], sizeof paths[6], "%s/owner", root);
    snprintf(paths[7], sizeof paths[7], "%s", root);
    const char *const list[8] = {paths[0], paths[1], paths[2], paths[3], paths[4], paths[5], paths[6], paths[7]};
    cli_signals_catch();
    cli_signals_remove_on_signal(list, 8);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    FILE *f = fopen(paths[6], "w");
    bool ok = f && fprintf(f, "hyperpar bench run host %s pid %ld\n", host[0] ? host : "unknown", pid) > 0;
    ok = (f && fclose(f) == 0) && ok;
    if (!ok || mkdir(dir, 0700) != 0)
        return hp_err_set(err, HP_ERR_IO, "%s: cannot write the temporary folder: %s (set TMPDIR to a writable "
                          "folder with room for it)", root, strerror(errno));
    hp_gen_opts g = gen_opts_of(a);
    double t0 = hp_comm_wtime();
    hp_status st = gen_fits(a) ? hp_gen_checkpoint(&g, dir, err)
                               : write_from_config(a, &g, dir, hp_linalg_set_threads(0), err);
    *seconds = hp_comm_wtime() - t0;
    return st;
}

/* ---- measurements ---- */

/* Columns of one timed forward: the slowest rank's figures, then each kind's time on the rank that spent the
 * least in it, i.e. the one that reached its collectives last (without the wait for a slower rank). */
enum { C_WALL, C_SECONDS, C_COMPUTE, C_COMM, C_PHASE, C_COLL = C_PHASE + 6,
       C_COLL_MIN = C_COLL + HP_RUN_COLL_COUNT, C_N = C_COLL_MIN + HP_RUN_COLL_COUNT };
static const char *const g_phase_names[6] = {"route", "dispatch", "experts", "return", "combine", "shared"};

typedef struct rb_result {
    double med[C_N];                    /* medians over reps of the slowest rank's figures */
    cli_bench_spread wall;              /* the forward's (C_WALL) min, median and max over reps */
    double bytes[HP_RUN_COLL_COUNT];    /* per rank per forward (max over ranks) */
    double calls[HP_RUN_COLL_COUNT];    /* per forward (max over ranks) */
    double bare[HP_RUN_COLL_COUNT];     /* bare collectives: median slowest-rank time of all calls */
    double bare_min[HP_RUN_COLL_COUNT]; /* and of the rank that spent the least in them */
    double sync[HP_RUN_COLL_COUNT];     /* the runtime's per kind with a barrier before each call (wait excluded) */
    double sync_bare[HP_RUN_COLL_COUNT]; /* the bare collectives timed right after each of those forwards */
    double resident, share, total;      /* largest rank's resident and plan-share bytes; checkpoint bytes */
    double expert_bytes;                /* the checkpoint's routed-expert bytes (names holding ".experts.") */
    double expect;                      /* (total - expert_bytes) / tp + expert_bytes / ep */
    hp_gemm_limit gemm;                 /* the same-run GEMM limit in the forward's compute mode */
} rb_result;

/* Warm-up (when asked), then reps forwards of ids [B, T]; rows[r][C_N] the slowest rank's figures of rep r. */
static hp_status time_forward(const hp_comm *c, hp_runner *r, const int64_t *ids, int64_t B, int64_t T, int reps,
                              bool warm_up, double *rows, hp_err *err)
{
    hp_status st = HP_OK;
    for (int k = warm_up ? -1 : 0; k < reps && st == HP_OK; k++) {
        hp_run_output o = {0};
        if ((st = hp_comm_barrier(c, err))) break;
        double t0 = hp_comm_wtime();
        st = hp_runner_forward(r, ids, B, T, &o, err);
        double t = hp_comm_wtime() - t0;
        hp_runner_recycle_output(r, &o); /* the outputs freed (the bench takes no logits) */
        if ((st = hp_comm_agree(c, st, err)) || k < 0) continue;
        const hp_run_stats *s = hp_runner_stats(r);
        double *v = rows + k * C_N;
        v[C_WALL] = t;
        v[C_SECONDS] = s->seconds;
        v[C_COMPUTE] = s->compute_s;
        v[C_COMM] = s->comm_s;
        for (int j = 0; j < 6; j++) v[C_PHASE + j] = s->moe_phase_s[j];
        for (int j = 0; j < HP_RUN_COLL_COUNT; j++) {
            v[C_COLL + j] = s->coll_s[j];
            v[C_COLL_MIN + j] = -s->coll_s[j]; /* min over ranks = -max(-x) */
        }
        st = hp_comm_allreduce_max_f64(c, v, C_N, err);
        for (int j = 0; j < HP_RUN_COLL_COUNT; j++) v[C_COLL_MIN + j] = -v[C_COLL_MIN + j];
    }
    return st;
}

/* Writes every page of p[n], as the runtime's buffers are written. An untouched calloc'd buffer maps all its
 * pages to the kernel's one zero page, whose 4 KiB stay in cache: a bare collective that reads it does not read
 * memory at all (measured: MPI_Allgather of 10.8 and 31 MiB per rank on 2 ranks ran 1.5-2.1x faster, median,
 * from such a buffer than from written memory), so it is no fair twin of a runtime collective. Values near 1:
 * sums never reach denormals. */
static void fill_pages(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = 1.0f + (float)(i & 1023) * 0x1p-12f;
}

/* The bare collectives of kind k: `calls` calls of `per_call` bytes (gather: this rank's own bytes; all-to-all:
 * per_call / G to each of the G ranks of g) on g (the world for the gather, the EP group for the all-to-all), warm-up then reps; med[0] the median slowest-rank time of all calls of a rep,
 * med[1] the median time of the rank that spent the least in them. */
static hp_status time_bare(const hp_comm *world, const hp_comm *g, hp_run_coll k, int64_t calls, size_t per_call,
                           int reps, double *med, hp_err *err)
{
    const int P = hp_comm_size(world), G = hp_comm_size(g);
    size_t nf = (per_call + sizeof(float) - 1) / sizeof(float); /* floats per call (per block for the scatter) */
    if (k == HP_RUN_REDUCE_SCATTER || k == HP_RUN_ALL_TO_ALL) nf = (nf + (size_t)G - 1) / (size_t)G;
    size_t *cnt = NULL;
    float *send = NULL, *recv = NULL;
    size_t n_send = 0, n_recv = 0;
    hp_status st = HP_OK;
    switch (k) {
    case HP_RUN_ALL_GATHER: n_send = nf, n_recv = nf * (size_t)G; break;
    case HP_RUN_ALL_REDUCE: n_send = nf; break;
    case HP_RUN_REDUCE_SCATTER: n_send = nf * (size_t)G, n_recv = nf; break;
    case HP_RUN_ALL_TO_ALL: n_send = n_recv = nf * (size_t)G; break; /* nf per peer */
    default: /* gather: rank 0 learns every rank's bytes per call */
        n_send = nf;
        if (!(cnt = calloc(2 * (size_t)P, sizeof *cnt))) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        break;
    }
    if ((st = hp_comm_agree(world, st, err))) return st;
    if (k == HP_RUN_GATHER) {
        size_t mine = nf * sizeof(float);
        st = hp_comm_allgather(world, &mine, sizeof mine, cnt, err);
        for (int p = 0; st == HP_OK && p < P; p++) {
            cnt[P + p] = n_recv * sizeof(float);
            n_recv += cnt[p] / sizeof(float);
        }
        if (hp_comm_rank(world) != 0) n_recv = 0;
    }
    if (st == HP_OK && (!(send = calloc(n_send + 1, sizeof *send)) || !(recv = calloc(n_recv + 1, sizeof *recv))))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for the bare %s buffers", hp_run_coll_name(k));
    if (st == HP_OK) fill_pages(send, n_send + 1), fill_pages(recv, n_recv + 1);
    double t[2 * MAX_REPS];
    for (int r = -1; r < reps; r++) {
        if ((st = hp_comm_agree(world, st, err))) break;
        if ((st = hp_comm_barrier(world, err))) break;
        double t0 = hp_comm_wtime();
        for (int64_t i = 0; i < calls && st == HP_OK; i++) {
            switch (k) {
            case HP_RUN_ALL_GATHER: st = hp_comm_allgather(g, send, nf * sizeof *send, recv, err); break;
            case HP_RUN_ALL_REDUCE: st = hp_comm_allreduce_sum_f32(g, send, nf, err); break;
            case HP_RUN_REDUCE_SCATTER: st = hp_comm_reduce_scatter_sum_f32(g, send, recv, nf, err); break;
            case HP_RUN_ALL_TO_ALL: st = hp_comm_alltoall(g, send, nf * sizeof *send, recv, err); break;
            default: st = hp_comm_gatherv(world, send, nf * sizeof *send, recv, cnt, cnt + P, 0, err); break;
            }
        }
        double dt[2] = {hp_comm_wtime() - t0, 0};
        dt[1] = -dt[0];
        if ((st = hp_comm_agree(world, st, err))) break;
        if ((st = hp_comm_allreduce_max_f64(world, dt, 2, err))) break;
        if (r >= 0) t[2 * r] = dt[0], t[2 * r + 1] = -dt[1];
    }
    if (st == HP_OK) med[0] = cli_bench_spread_col(t, reps, 2, 0).med, med[1] = cli_bench_spread_col(t, reps, 2, 1).med;
    free(send);
    free(recv);
    free(cnt);
    return st;
}

/* The synchronized forwards, each followed by one rep of the bare collectives of every kind that ran: res.sync
 * and res.sync_bare, the medians over a->reps pairs (after one warm-up forward). */
static hp_status time_sync_paired(const hp_comm *w, hp_runner *r, const int64_t *ids, int64_t B, int64_t T,
                                  const rb_args *a, const hp_comm *const *bg, const size_t *per_call, rb_result *res,
                                  hp_err *err)
{
    int reps = (int)a->reps;
    double *rows = calloc((size_t)reps * C_N, sizeof *rows);
    double *bare = calloc((size_t)reps * HP_RUN_COLL_COUNT, sizeof *bare);
    hp_status st = rows && bare ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if ((st = hp_comm_agree(w, st, err))) goto out;
    hp_runner_sync_collectives(r, true);
    for (int i = 0; i < reps && st == HP_OK; i++) {
        st = time_forward(w, r, ids, B, T, 1, i == 0, rows + (size_t)i * C_N, err);
        for (int k = 0; k < HP_RUN_COLL_COUNT && st == HP_OK; k++) {
            double med[2] = {0, 0};
            if (res->calls[k] > 0)
                st = time_bare(w, bg[k], (hp_run_coll)k, (int64_t)res->calls[k], per_call[k], 1, med, err);
            bare[(size_t)i * HP_RUN_COLL_COUNT + (size_t)k] = med[0];
        }
    }
    hp_runner_sync_collectives(r, false);
    for (int k = 0; st == HP_OK && k < HP_RUN_COLL_COUNT; k++) {
        res->sync[k] = cli_bench_spread_col(rows, reps, C_N, C_COLL + k).med;
        res->sync_bare[k] = cli_bench_spread_col(bare, reps, HP_RUN_COLL_COUNT, k).med;
    }
out:
    free(rows);
    free(bare);
    return st;
}

/* ---- output ---- */



static double ratio(double bare, double runtime) { return runtime > 0 ? bare / runtime : 0.0; }

static const char *dtype_str(hp_dtype dt) { return dt == HP_DT_BF16 ? "bf16" : "f32"; }

void cli_bench_print_head(const char *name, const rb_args *a, const rb_info *in)
{
    char b1[32];
    printf("bench %s: %s (%s) %lld layer%s, H %lld, I %lld, heads %lld / kv %lld x %lld, vocab %lld, %s; batch %lld x "
           "%lld tokens\n",
           name, a->p->name, a->p->family, (long long)a->layers, a->layers == 1 ? "" : "s", (long long)a->hidden,
           (long long)a->intermediate, (long long)a->heads, (long long)a->kv_heads, (long long)a->head_dim,
           (long long)a->vocab, dtype_str(a->dtype), (long long)a->batch, (long long)a->tokens);
    printf("  checkpoint: %s random, written by rank 0 in %.1f s (%s) to a temporary folder, removed at the end\n",
           hp_format_bytes(in->ckpt_bytes, b1, sizeof b1), in->gen_s,
           gen_fits(a)                 ? "hp_gen_checkpoint"
           : a->vocab > HP_GEN_MAX_DIM ? "gen's config and scales, vocab above gen's limit"
                                       : "gen's config, the preset's MoE fields, gen's scales");
    printf("  mesh      : %s, %d rank%s, %s, compute %s\n", in->mesh, in->ranks, in->ranks == 1 ? "" : "s",
           in->backend, cli_compute_name(a->compute));
    char tb[128];
    printf("  threads   : %s\n", cli_threads_str(&in->ti, tb, sizeof tb));
    cli_bench_load_text(&in->load, 10);
    if (is_moe(a)) {
        printf("  moe       : %lld experts%s, top-%lld, expert width %lld%s, %lld sparse layer%s of %lld; ep %lld", (long long)a->experts,
               a->experts == a->p->experts ? "" : " (--experts; the preset has more)", (long long)a->p->top_k,
               (long long)a->moe_intermediate, a->p->q_lora ? ", 1 shared expert" : "", (long long)in->n_sparse,
               in->n_sparse == 1 ? "" : "s", (long long)a->layers, (long long)a->ep);
        if (a->ep > 1)
            printf(" (TP-extend-EP, EP group: %lld consecutive ranks), compute declared by the %d override%s "
                   "'hyperpar plan --suggest-overrides' prints\n",
                   (long long)a->ep, in->n_overrides, in->n_overrides == 1 ? "" : "s");
        else
            printf(" (each rank holds every expert and runs its own rows)\n");
    }
    printf("  kernels   : %s\n", in->kernels);
    printf("  attention : one fused kernel (query x key blocks, online softmax, no [S, S] scores; the backward too), "
           "oneDNN sgemm per block%s; %s should oneDNN refuse one\n",
           a->compute == HP_LINALG_BF16 ? " on operands rounded to bf16" : "", in->blas);
}

static void print_text(const rb_args *a, const rb_info *in, const rb_result *r, const cli_torch_eager *pt)
{
    const double *m = r->med;
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    double expect = r->expect;
    cli_bench_print_head("run", a, in);
    printf("  forward   : %.3f ms median of %d (min %.3f, max %.3f; slowest rank) -> %.1f tokens/s prefill; GEMM work "
           "%.1f GFLOP -> %.1f GFLOP/s over all ranks\n",
           m[C_WALL] * 1e3, in->reps, r->wall.min * 1e3, r->wall.max * 1e3, (double)(a->batch * a->tokens) / m[C_WALL],
           in->gemm_flop * 1e-9, in->gemm_flop / m[C_WALL] * 1e-9);
    double fwd = in->gemm_flop / m[C_WALL] * 1e-9;
    printf("  gemm limit: %.1f GFLOP/s summed over the ranks (slowest %.1f): a %lld^3 product through the GEMM layer "
           "in %s (rank 0: %s) on every rank at once, best of %d; the forward's GEMM rate is %.2f of it (target >= "
           "%.1f)\n",
           r->gemm.sum_gflops, r->gemm.min_gflops, (long long)r->gemm.n, a->compute == HP_LINALG_BF16 ? "bf16 x bf16" : "f32",
           r->gemm.impl[0] ? r->gemm.impl : "?", r->gemm.reps, fwd / r->gemm.sum_gflops, GEMM_SHARE_TARGET);
    if (r->gemm.peak_gflops > 0)
        printf("  cpu peak  : %.1f GFLOP/s summed over the ranks: %s on registers only, every thread at once; the GEMM "
               "limit is %.2f of it, the forward's GEMM rate %.2f\n",
               r->gemm.peak_gflops, r->gemm.peak_name, r->gemm.sum_gflops / r->gemm.peak_gflops,
               fwd / r->gemm.peak_gflops);
    printf("  split     : compute %.3f ms, communication %.3f ms (each the slowest rank's; communication %.2f of the "
           "runner's forward)\n",
           m[C_COMPUTE] * 1e3, m[C_COMM] * 1e3, m[C_SECONDS] > 0 ? m[C_COMM] / m[C_SECONDS] : 0.0);
    if (is_moe(a))
        printf("  moe phases: route %.3f, dispatch %.3f, experts %.3f, return %.3f, combine %.3f, shared %.3f ms (summed "
               "over the %lld sparse layer%s, slowest rank per phase)\n",
               m[C_PHASE] * 1e3, m[C_PHASE + 1] * 1e3, m[C_PHASE + 2] * 1e3, m[C_PHASE + 3] * 1e3, m[C_PHASE + 4] * 1e3,
               m[C_PHASE + 5] * 1e3, (long long)in->n_sparse, in->n_sparse == 1 ? "" : "s");
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) {
        const char *name = hp_run_coll_name((hp_run_coll)k);
        if (r->calls[k] == 0) {
            printf("  %-15s: none in this forward\n", name);
            continue;
        }
        const char *grp = k == HP_RUN_GATHER ? "world to rank 0" : k == HP_RUN_ALL_TO_ALL ? "ep group" : in->group;
        printf("  %-15s: runtime %.3f ms, %s in %.0f calls per rank; bare %.3f ms (%s, same bytes and calls)   ratio "
               "bare/runtime %.2f (target >= %.1f)\n",
               name, m[C_COLL + k] * 1e3, hp_format_bytes((uint64_t)r->bytes[k], b1, sizeof b1), r->calls[k],
               r->bare[k] * 1e3, grp, ratio(r->bare[k], m[C_COLL + k]), RATIO_TARGET);
        if (in->ranks > 1 && k != HP_RUN_GATHER) /* a gather's last rank in is a non-root sending little */
            printf("  %-15s  last rank in (no wait for a slower rank): runtime %.3f ms, bare %.3f ms   ratio "
                   "bare/runtime %.2f\n",
                   "", m[C_COLL_MIN + k] * 1e3, r->bare_min[k] * 1e3, ratio(r->bare_min[k], m[C_COLL_MIN + k]));
        if (in->ranks > 1)
            printf("  %-15s  synchronized (a barrier before each call, its wait excluded): runtime %.3f ms, bare "
                   "%.3f ms (timed after each of these forwards)   ratio bare/runtime %.2f (target >= %.1f)\n",
                   "", r->sync[k] * 1e3, r->sync_bare[k] * 1e3, ratio(r->sync_bare[k], r->sync[k]), RATIO_TARGET);
    }
    if (!is_moe(a))
        printf("  resident  : %s of weights on the largest rank (plan share %s); checkpoint %s / tp %lld = %s   ratio "
               "%.4f (target within %.0f%%)\n",
               hp_format_bytes((uint64_t)r->resident, b1, sizeof b1), hp_format_bytes((uint64_t)r->share, b2, sizeof b2),
               hp_format_bytes((uint64_t)r->total, b3, sizeof b3), (long long)a->tp,
               hp_format_bytes((uint64_t)expect, b5, sizeof b5), r->resident / expect, RESIDENT_TOL * 100);
    else
        printf("  resident  : %s of weights on the largest rank (plan share %s); dense %s / tp %lld + experts %s / ep "
               "%lld = %s   ratio %.4f (target within %.0f%%)\n",
               hp_format_bytes((uint64_t)r->resident, b1, sizeof b1), hp_format_bytes((uint64_t)r->share, b2, sizeof b2),
               hp_format_bytes((uint64_t)(r->total - r->expert_bytes), b3, sizeof b3), (long long)a->tp,
               hp_format_bytes((uint64_t)r->expert_bytes, b4, sizeof b4), (long long)a->ep,
               hp_format_bytes((uint64_t)expect, b5, sizeof b5), r->resident / expect, RESIDENT_TOL * 100);
    cli_bench_torch_text(pt, (double)(a->batch * a->tokens) / m[C_WALL], "tokens/s prefill");
}

void cli_bench_json_head(const char *name, const rb_args *a, const rb_info *in)
{
    printf("{\"bench\": \"%s\", \"preset\": \"%s\", \"family\": \"%s\", \"layers\": %lld, \"hidden\": %lld, "
           "\"intermediate\": %lld, \"heads\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, \"vocab\": %lld, "
           "\"dtype\": \"%s\", \"batch\": %lld, \"tokens\": %lld, \"dp\": %lld, \"cp\": %lld, \"tp\": %lld, \"ranks\": %d, "
           "\"threads\": %d, \"reps\": %d, \"compute\": \"%s\", \"checkpoint_bytes\": %llu, \"gen_s\": %.6g, \"mesh\": ",
           name, a->p->name, a->p->family, (long long)a->layers, (long long)a->hidden, (long long)a->intermediate,
           (long long)a->heads, (long long)a->kv_heads, (long long)a->head_dim, (long long)a->vocab,
           dtype_str(a->dtype), (long long)a->batch, (long long)a->tokens, (long long)a->dp, (long long)a->cp, (long long)a->tp, in->ranks,
           in->threads, in->reps, cli_compute_name(a->compute), (unsigned long long)in->ckpt_bytes, in->gen_s);
    cli_json_str(in->mesh);
    printf(", \"backend\": ");
    cli_json_str(in->backend);
    printf(", \"kernels\": ");
    cli_json_str(in->kernels);
    printf(", \"blas\": ");
    cli_json_str(in->blas);
    cli_bench_load_json(&in->load);
}

static void print_json(const rb_args *a, const rb_info *in, const rb_result *r, const cli_torch_eager *pt)
{
    const double *m = r->med;
    double expect = r->expect;
    cli_bench_json_head("run", a, in);
    if (is_moe(a)) {
        printf(", \"moe\": {\"experts\": %lld, \"experts_preset\": %lld, \"top_k\": %lld, \"moe_intermediate\": %lld, "
               "\"sparse_layers\": %lld, \"ep\": %lld, \"overrides\": %d, \"expert_bytes\": %.0f, \"phases_s\": {",
               (long long)a->experts, (long long)a->p->experts, (long long)a->p->top_k, (long long)a->moe_intermediate,
               (long long)in->n_sparse, (long long)a->ep, in->n_overrides, r->expert_bytes);
        for (int j = 0; j < 6; j++) printf("%s\"%s\": %.6g", j ? ", " : "", g_phase_names[j], m[C_PHASE + j]);
        printf("}}");
    }
    printf(", \"median_s\": %.6g", m[C_WALL]);
    cli_bench_spread_json("", &r->wall);
    printf(", \"tokens_per_s\": %.6g, \"gemm_gflop\": %.6g, \"gflops\": %.6g, \"runner_s\": %.6g, \"compute_s\": %.6g, "
           "\"comm_s\": %.6g, \"bare_group\": \"%s\", \"ratio_target\": %.2f, ",
           (double)(a->batch * a->tokens) / m[C_WALL], in->gemm_flop * 1e-9, in->gemm_flop / m[C_WALL] * 1e-9,
           m[C_SECONDS], m[C_COMPUTE], m[C_COMM], in->group, RATIO_TARGET);
    printf("\"gemm_limit_n\": %lld, \"gemm_limit_gflops\": %.6g, \"gemm_limit_gflops_min_rank\": %.6g, "
           "\"gemm_share\": %.4f, \"gemm_share_target\": %.2f, \"peak_gflops\": %.6g, \"peak_instruction\": \"%s\", "
           "\"gemm_limit_impl\": ",
           (long long)r->gemm.n, r->gemm.sum_gflops, r->gemm.min_gflops,
           in->gemm_flop / m[C_WALL] * 1e-9 / r->gemm.sum_gflops, GEMM_SHARE_TARGET, r->gemm.peak_gflops,
           r->gemm.peak_name);
    cli_json_str(r->gemm.impl);
    printf(", \"collectives\": {");
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) {
        printf("%s\"%s\": {\"bytes\": %.0f, \"calls\": %.0f, \"runtime_s\": %.6g", k ? ", " : "",
               hp_run_coll_name((hp_run_coll)k), r->bytes[k], r->calls[k], m[C_COLL + k]);
        if (r->calls[k] > 0 && m[C_COLL + k] > 0)
            printf(", \"bare_s\": %.6g, \"ratio_bare_over_runtime\": %.4f", r->bare[k], r->bare[k] / m[C_COLL + k]);
        else
            printf(", \"bare_s\": null, \"ratio_bare_over_runtime\": null");
        if (r->calls[k] > 0 && m[C_COLL_MIN + k] > 0 && k != HP_RUN_GATHER)
            printf(", \"last_in_runtime_s\": %.6g, \"last_in_bare_s\": %.6g, \"last_in_ratio\": %.4f}",
                   m[C_COLL_MIN + k], r->bare_min[k], r->bare_min[k] / m[C_COLL_MIN + k]);
        else
            printf(", \"last_in_runtime_s\": null, \"last_in_bare_s\": null, \"last_in_ratio\": null}");
    }
    printf("}, \"resident_bytes\": %.0f, \"share_bytes\": %.0f, \"checkpoint_weight_bytes\": %.0f, "
           "\"expected_resident_bytes\": %.0f, \"resident_ratio\": %.6f, \"resident_tolerance\": %.2f",
           r->resident, r->share, r->total, expect, r->resident / expect, RESIDENT_TOL);
    cli_bench_torch_json(pt, (double)(a->batch * a->tokens) / m[C_WALL]);
    printf("}\n");
}

/* ---- the run ---- */

static uint64_t dir_bytes(const char *dir)
{
    uint64_t n = 0;
    DIR *d = opendir(dir);
    char path[4200];
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        FILE *f;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.' && (f = fopen(path, "rb"))) {
            if (fseek(f, 0, SEEK_END) == 0) n += (uint64_t)ftell(f);
            fclose(f);
        }
    }
    if (d) closedir(d);
    return n;
}

/* Rank 0's description of the run for the report: *la is the linear-algebra context it asked (freed by the
 * caller). */
static void describe(const hp_comm *w, const hp_plan *p, const rb_args *a, rb_info *in, hp_linalg **la)
{
    hp_err err;
    in->n_sparse = is_moe(a) ? a->layers - a->first_dense : 0;
    in->gemm_flop = 2.0 * (double)(a->batch * a->tokens) * in->weights;
    in->threads = hp_linalg_set_threads(0);
    hp_mesh_str(&p->mesh, in->mesh, sizeof in->mesh);
    snprintf(in->backend, sizeof in->backend, "%s", hp_comm_backend(w));
    if (hp_linalg_create(la, &err) == HP_OK) hp_linalg_describe(*la, in->kernels, sizeof in->kernels);
    else snprintf(in->kernels, sizeof in->kernels, "unknown (%.400s)", err.msg);
    hp_linalg_blas_describe(in->blas, sizeof in->blas, NULL);
}

/* The plan of a's mesh on m (*p, and with EP the suggested overrides it was derived with, *ov). */
static hp_status derive_plan(const hp_model *m, const rb_args *a, hp_plan **p, hp_overrides **ov, hp_err *err)
{
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, a->dp, a->cp, a->tp, a->ep > 1 ? a->ep : 0, false);
    hp_status st = hp_plan_derive(p, m, &po, err);
    if (st == HP_OK && a->ep > 1) {
        /* With EP the compute is declared, never chosen silently: the overrides `hyperpar plan MODEL --tp N
         * --ep N --suggest-overrides` prints, parsed from that text, and the plan derived again with them. */
        hp_buf b;
        hp_buf_init(&b);
        st = hp_plan_suggest_overrides(*p, &b, err);
        if (st == HP_OK && b.oom) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for the overrides");
        if (st == HP_OK) st = hp_overrides_parse(ov, b.data ? b.data : "", b.len, "suggested overrides", err);
        hp_buf_free(&b);
        hp_plan_free(*p);
        *p = NULL;
        po.overrides = *ov;
        if (st == HP_OK) st = hp_plan_derive(p, m, &po, err);
    }
    return st;
}

/* A run this node cannot hold is refused before any of it is allocated (hp_cost_forward_fits), and before
 * the checkpoint is written: m may be the meta model of its config. */
static hp_status memory_check(const hp_comm *w, const hp_model *m, const hp_plan *p, const rb_args *a,
                              const cli_threads_info *ti, hp_err *err)
{
    char what[160];
    snprintf(what, sizeof what, "bench %s of %s at batch %lld x %lld tokens (%lld layer%s, vocab %lld)",
             a->train ? "train" : "run", a->p->name, (long long)a->batch, (long long)a->tokens, (long long)a->layers,
             a->layers == 1 ? "" : "s", (long long)a->vocab);
    return hp_cost_forward_fits(w, m, p, a->batch, a->tokens, a->train, false, 0, ti->local_ranks, what,
                                   "give fewer --tokens, --batch or --layers, a smaller --vocab, or more ranks", err);
}

/* Refused first when this node cannot hold the run, so that such a run writes nothing: cost's figures need only
 * the config, so every rank builds the model the checkpoint's config.json describes (meta, no weights), and its
 * plan. Collective; agreed. */
static hp_status check_fits(const hp_comm *w, const rb_args *a, const cli_threads_info *ti, hp_err *err)
{
    hp_gen_opts g = gen_opts_of(a);
    char *cfg = NULL;
    hp_model *m = NULL;
    hp_plan *p = NULL;
    hp_overrides *ov = NULL;
    hp_status st = config_text(a, &g, &cfg, err);
    if (st == HP_OK) st = hp_model_from_config_text(&m, cfg, strlen(cfg), "bench config.json", NULL, err);
    free(cfg);
    if (st == HP_OK) st = derive_plan(m, a, &p, &ov, err);
    if ((st = hp_comm_agree(w, st, err)) == HP_OK) st = memory_check(w, m, p, a, ti, err);
    hp_plan_free(p);
    hp_overrides_free(ov);
    hp_model_close(m);
    return st;
}

/* What the runtime's collectives moved in its last forward (the same every forward; the largest rank's bytes and
 * calls), the resident weights against the plan's share, and the bare collectives of the same bytes and calls on
 * the group each kind mostly ran on (in->group: tp's, cp's or the world), also paired with synchronized forwards.
 * Collective; every failure agreed. */
static hp_status measure_collectives(const hp_comm *w, hp_runner *r, const hp_model *m, const hp_plan *p,
                                     const rb_args *a, const int64_t *ids, rb_result *res, rb_info *in, hp_err *err)
{
    const int P = hp_comm_size(w), R = hp_comm_rank(w);
    const int64_t B = a->batch, T = a->tokens;
    hp_comm *tpg = NULL, *cpg = NULL, *epg = NULL;
    hp_status st = HP_OK;
    /* Bytes and calls of the last forward (the same every forward), the largest rank's; resident bytes. */
    const hp_run_stats *s = hp_runner_stats(r);
    double v[2 * HP_RUN_COLL_COUNT + 2];
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) {
        v[k] = (double)s->bytes[k];
        v[HP_RUN_COLL_COUNT + k] = (double)s->calls[k];
    }
    v[2 * HP_RUN_COLL_COUNT] = (double)s->resident_bytes;
    v[2 * HP_RUN_COLL_COUNT + 1] = (double)s->share_bytes;
    if ((st = hp_comm_allreduce_max_f64(w, v, 2 * HP_RUN_COLL_COUNT + 2, err))) goto out;
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) {
        res->bytes[k] = v[k];
        res->calls[k] = v[HP_RUN_COLL_COUNT + k];
    }
    res->resident = v[2 * HP_RUN_COLL_COUNT];
    res->share = v[2 * HP_RUN_COLL_COUNT + 1];
    res->total = (double)hp_model_total_bytes(m);
    for (size_t i = 0; i < m->n_params; i++)
        if (strstr(m->params[i].name, ".experts.")) res->expert_bytes += (double)m->params[i].nbytes;
    res->expect = (res->total - res->expert_bytes) / (double)a->tp + res->expert_bytes / (double)(a->ep > 1 ? a->ep : 1);

    /* The bare collectives, on the group the runtime's collectives of that kind mostly ran on. */
    const hp_mesh *pm = &p->mesh;
    if ((st = hp_comm_split(w, (int)hp_mesh_group_rank(pm, R, "tp", 0), (int)hp_mesh_coord(pm, R, "tp"), &tpg, err)))
        goto out;
    if ((st = hp_comm_split(w, (int)hp_mesh_group_rank(pm, R, "cp", 0), (int)hp_mesh_coord(pm, R, "cp"), &cpg, err)))
        goto out;
    const hp_comm *g = a->tp > 1 ? tpg : a->cp > 1 ? cpg : w;
    snprintf(in->group, sizeof in->group, "%s", a->tp > 1 ? "tp group" : a->cp > 1 ? "cp group" : "world");
    /* The EP group, as the runner splits it (TP-extend-EP: ep consecutive ranks; the tp group when ep = tp). */
    int64_t ep_n = hp_plan_ep_size(p), eg, ei;
    hp_mesh_ep_index(&p->mesh, ep_n, R, &eg, &ei);
    if ((st = hp_comm_split(w, (int)eg, (int)ei, &epg, err))) goto out;
    size_t per_call[HP_RUN_COLL_COUNT];
    const hp_comm *bg[HP_RUN_COLL_COUNT];
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) {
        /* Every rank of a group runs the same collectives; the gather's ranks each send their own bytes. */
        double own = s->calls[k] ? (double)s->bytes[k] / (double)s->calls[k] : 0.0;
        per_call[k] = res->calls[k] > 0 ? (size_t)ceil(k == HP_RUN_GATHER ? own : res->bytes[k] / res->calls[k]) : 0;
        bg[k] = k == HP_RUN_GATHER ? w : k == HP_RUN_ALL_TO_ALL ? epg : g;
    }
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) {
        if (res->calls[k] == 0) continue;
        double med[2];
        if ((st = time_bare(w, bg[k], (hp_run_coll)k, (int64_t)res->calls[k], per_call[k], (int)a->reps, med, err)))
            goto out;
        res->bare[k] = med[0];
        res->bare_min[k] = med[1];
    }
    /* Again with a barrier before each collective: the collectives' own cost, without the wait for a slower
     * rank's compute (hp_run_opts.sync_collectives; the barrier time is not in coll_s). Each forward is
     * followed at once by the bare collectives of every kind, so that a ratio's two halves see the same load
     * (on a shared machine it moves within a minute). */
    if (P > 1 && (st = time_sync_paired(w, r, ids, B, T, a, bg, per_call, res, err))) goto out;

out:
    hp_comm_free(epg);
    hp_comm_free(cpg);
    hp_comm_free(tpg);
    return st;
}

static int run(rb_args *a, int *argc, char ***argv)
{
    /* The host's load before any work: the probe, the checkpoint, the runs. */
    const double load_start = cli_bench_loadavg();
    /* Whether PyTorch can be measured (rank 0 only), asked before MPI starts. */
    char torch_why[400] = "not probed on this rank";
    bool torch = hp_comm_launch_rank() <= 0 && cli_bench_torch_probe(torch_why, sizeof torch_why);
    hp_err err;
    hp_err_clear(&err);
    hp_comm *w = NULL;
    if (hp_comm_world(&w, argc, argv, &err) != HP_OK) return cli_fail(&err);
    const int P = hp_comm_size(w), R = hp_comm_rank(w);
    /* Both pools (OpenMP for oneDNN and the kernels, OpenBLAS for attention) get the count explicitly, so that
     * the count printed is the one used and the ranks of one node share its cores instead of each taking all. */
    cli_threads_info ti;
    cli_threads(w, a->threads, &ti);
    if (!a->tp_given) a->tp = P / (a->dp * a->cp) > 0 ? P / (a->dp * a->cp) : 1;
    if (is_moe(a) && !a->ep) a->ep = a->tp;
    char dir[4096] = "", root[4096] = "";
    bool made = false;
    hp_model *m = NULL;
    hp_plan *p = NULL;
    hp_runner *r = NULL;
    hp_overrides *ov = NULL;
    int64_t *ids = NULL;
    hp_linalg *la = NULL;
    rb_result res = {0};
    rb_info in = {.ranks = P, .reps = (int)a->reps, .torch = torch, .ti = ti, .ckpt_dir = dir,
                  .load = {load_start, -1}};
    snprintf(in.torch_why, sizeof in.torch_why, "%s", torch_why);
    double *rows = NULL;
    hp_status st = HP_OK;
    if (a->dp * a->cp * a->tp != P)
        st = hp_err_set(&err, HP_ERR_INPUT,
                        "the mesh dp=%lld,cp=%lld,tp=%lld has %lld ranks but %d process%s run it; start it with "
                        "mpirun -np %lld or change --dp/--cp/--tp",
                        (long long)a->dp, (long long)a->cp, (long long)a->tp, (long long)(a->dp * a->cp * a->tp), P,
                        P == 1 ? "" : "es", (long long)(a->dp * a->cp * a->tp));
    else if (is_moe(a) && a->experts % a->ep)
        st = hp_err_set(&err, HP_ERR_INPUT, "--experts %lld is not a multiple of ep %lld: every rank of an EP group "
                        "holds the same number of experts; change --experts or --ep", (long long)a->experts,
                        (long long)a->ep);
    /* --batch rows, by default one per dp replica (the runtime gives each replica at least one row). */
    const int64_t B = a->batch, T = a->tokens;
    if ((st = hp_comm_agree(w, st, &err))) goto done;

    if ((st = check_fits(w, a, &ti, &err))) goto done;

    /* Rank 0 writes the checkpoint while the others wait in the agreement; then they learn its folder. */
    if (R == 0) st = make_checkpoint(a, root, dir, sizeof dir, &made, &in.gen_s, &err);
    if (R == 0 && st == HP_OK) in.ckpt_bytes = dir_bytes(dir);
    if ((st = hp_comm_agree(w, st, &err))) goto done;
    if ((st = hp_comm_bcast(w, dir, sizeof dir, 0, &err))) goto done;
    st = hp_model_open(&m, dir, NULL, &err);
    if (st == HP_OK) {
        in.weights = hp_cost_gemm_weights(m);
        in.train_flop = hp_cost_train_flops(m, B * T);
    }
    if (st == HP_OK) st = derive_plan(m, a, &p, &ov, &err);
    in.n_overrides = ov ? (int)hp_overrides_count(ov) : 0;
    if ((st = hp_comm_agree(w, st, &err))) goto done;
    if (!(ids = malloc((size_t)(B * T) * sizeof *ids)))
        st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory for %lld ids", (long long)(B * T));
    if ((st = hp_comm_agree(w, st, &err))) goto done;
    hp_run_opts ro = {.compute = a->compute, .keep_activations = a->train, .no_logits = true}; /* timed only */
    if (a->decode) ro.no_logits = false, ro.kv_cache = T + a->decode; /* generation's: each step's logits taken */
    if ((st = hp_runner_create(&r, w, m, p, &ro, &err))) goto done;

    /* ids [B, T]: deterministic, spread over the vocabulary, all < V. */
    for (int64_t i = 0; i < B * T; i++) ids[i] = (int64_t)(((uint64_t)i * 2654435761u + 1) % (uint64_t)a->vocab);
    if (!(rows = calloc((size_t)a->reps * C_N, sizeof *rows))) st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory");
    if ((st = hp_comm_agree(w, st, &err))) goto done;
    if (a->train) {
        if (R == 0) describe(w, p, a, &in, &la);
        st = cli_bench_train(w, r, ids, a, &in, &err);
        goto done;
    }
    if (a->decode) {
        if (R == 0) describe(w, p, a, &in, &la);
        st = cli_bench_decode(w, r, m, p, ids, a, &in, &err);
        goto done;
    }
    if ((st = time_forward(w, r, ids, B, T, (int)a->reps, true, rows, &err))) goto done;
    for (int c = 0; c < C_N; c++) res.med[c] = cli_bench_spread_col(rows, (int)a->reps, C_N, c).med;
    res.wall = cli_bench_spread_col(rows, (int)a->reps, C_N, C_WALL);
    /* The GEMM limit of the forward's compute mode, on every rank at once, as bench train measures it. */
    if ((st = hp_cost_gemm_limit(w, CLI_BENCH_GEMM_N, a->compute, CLI_BENCH_GEMM_REPS, &res.gemm, &err))) goto done;

    if ((st = measure_collectives(w, r, m, p, a, ids, &res, &in, &err))) goto done;

    /* PyTorch last: the same batch and checkpoint, the node's cores. */
    if (R == 0) describe(w, p, a, &in, &la);
    cli_torch_eager pt;
    if ((st = cli_bench_torch(w, a, &in, &pt, &err))) goto done;
    in.load.end = cli_bench_loadavg();
    if (R == 0) {
        if (a->json) print_json(a, &in, &res, &pt);
        else print_text(a, &in, &res, &pt);
        fflush(stdout);
    }
done:
    free(rows);
    free(ids);
    hp_linalg_destroy(la);
    hp_runner_free(r);
    hp_plan_free(p);
    hp_overrides_free(ov);
    hp_model_close(m);
    /* Every rank has closed the checkpoint before rank 0 removes it (every failure above is agreed, so all
     * ranks are here); rank 0 prints a failure before any rank exits, since mpirun may end the job as soon as
     * one rank exits with a non-zero status. */
    hp_err e2;
    if (P > 1) (void)hp_comm_barrier(w, &e2);
    if (made) {
        if (access(dir, F_OK) == 0) remove_dir(dir);
        remove_run(root);
        if (access(root, F_OK) == 0) fprintf(stderr, "hyperpar bench: could not remove %s\n", root);
        cli_signals_release(0); /* a signal during the removal: re-raised now */
    }
    int code = cli_collective_exit(w, st, &err, true);
    hp_comm_free(w);
    return code;
}

/* bench run and bench train: one option table, one parser. */
static int bench_main(int argc, char **argv, bool train)
{
    rb_opts o = {.a = {.tokens = 256, .first_dense = -1, .dp = 1, .cp = 1, .tp = 1, .reps = 3, .dtype = HP_DT_BF16,
                       .train = train}};
    cli_parser cp = {.command = train ? &cli_cmd_bench_train : &cli_cmd_bench_run};
    int prc = cli_parse(&cp, &o, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    rb_args a = o.a;
    const int64_t *shape = o.shape;
    const char *preset_name = o.preset;
    if (optind != argc) return cli_usage_error("bench", "unexpected argument '%s'", argv[optind]);
    if (train && a.decode) return cli_usage_error("bench", "--decode belongs to 'hyperpar bench run'");
    if (!(a.p = cli_preset_arg("bench", preset_name, false))) return HP_EXIT_USAGE;
    a.hidden = shape[0] ? shape[0] : a.p->hidden;
    a.intermediate = shape[1] ? shape[1] : a.p->intermediate;
    a.heads = shape[2] ? shape[2] : a.p->heads;
    a.kv_heads = shape[3] ? shape[3] : a.p->kv_heads;
    a.head_dim = shape[4] ? shape[4] : a.p->head_dim;
    if (!a.vocab) a.vocab = a.p->vocab;
    if (!a.batch) a.batch = a.dp;
    if (a.batch < a.dp)
        return cli_usage_error("bench", "--batch %lld is fewer rows than dp %lld: every dp replica needs at least one "
                               "row; give --batch %lld or more", (long long)a.batch, (long long)a.dp, (long long)a.dp);
    const cli_preset *p = a.p;
    if (!is_moe(&a) && (a.ep || a.experts || a.first_dense >= 0))
        return cli_usage_error("bench", "%s is dense: --ep, --experts and --dense-layers apply to the MoE presets (%s)",
                               p->name, cli_preset_names(true, (char[256]){0}, 256));
    if (a.first_dense >= 0 && !p->first_dense)
        return cli_usage_error("bench", "--dense-layers applies to deepseek-v3 (%s has no leading dense layers)",
                               p->name);
    if (a.first_dense < 0) a.first_dense = p->first_dense;
    if (!a.layers) a.layers = is_moe(&a) ? a.first_dense + 1 : 1;
    if (is_moe(&a) && a.layers <= a.first_dense)
        return cli_usage_error("bench", "--layers %lld has no sparse layer: %s's first %lld layer%s dense; give "
                               "--layers %lld or more, or fewer --dense-layers", (long long)a.layers, p->name,
                               (long long)a.first_dense, a.first_dense == 1 ? " is" : "s are",
                               (long long)a.first_dense + 1);
    if (is_moe(&a)) {
        if (!a.experts) a.experts = p->experts;
        a.moe_intermediate = shape[1] ? shape[1] : p->moe_intermediate;
        if (a.experts < p->top_k)
            return cli_usage_error("bench", "--experts %lld is below %s's top-%lld: each token goes to %lld experts",
                                   (long long)a.experts, p->name, (long long)p->top_k, (long long)p->top_k);
        if (p->n_group) { /* the real 8 groups, top-4 of them; fewer when E is small (groups of at least 2) */
            int64_t g = p->n_group;
            while (g > 1 && (a.experts % g || a.experts / g < 2)) g /= 2;
            a.n_group = g;
            a.topk_group = g > 1 ? g * p->topk_group / p->n_group : 1;
            if (a.topk_group * (a.experts / g) < p->top_k)
                return cli_usage_error("bench", "--experts %lld is too few for %s's group-limited top-%lld: %lld "
                                       "groups of %lld, top-%lld groups, hold %lld experts; give --experts %lld or more",
                                       (long long)a.experts, p->name, (long long)p->top_k, (long long)g,
                                       (long long)(a.experts / g), (long long)a.topk_group,
                                       (long long)(a.topk_group * (a.experts / g)), (long long)(2 * p->top_k));
        }
    }
    if (a.heads % a.kv_heads)
        return cli_usage_error("bench", "--heads %lld must be a multiple of --kv-heads %lld", (long long)a.heads,
                               (long long)a.kv_heads);
    /* Per-expert checkpoints hold 3 tensors per expert and sparse layer: more than a safetensors header holds
     * is refused before any work (--layers <= 1024 and --experts <= 4096, so the product cannot overflow). */
    if (is_moe(&a) && p->family && a.layers * 3 * a.experts > HP_GEN_MAX_TENSORS)
        return cli_usage_error("bench", "--layers %lld x --experts %lld would write more than %d tensors, more than a "
                               "safetensors header holds; give fewer --layers or --experts", (long long)a.layers,
                               (long long)a.experts, HP_GEN_MAX_TENSORS);
    return run(&a, &argc, &argv);
}

int cmd_bench_run(int argc, char **argv) { return bench_main(argc, argv, false); }
int cmd_bench_train(int argc, char **argv) { return bench_main(argc, argv, true); }
