/*
 * bench_run.h — what `hyperpar bench run` (bench_run.c: the options, the random checkpoint in a temporary
 * folder, the plan and the runner over the ranks of mpirun, the header of the report) and `hyperpar bench train`
 * (bench_train.c: the timed training steps and their report) share. bench_run.c parses both commands with one
 * option table and sets up both runs; once the runner exists it hands a training run to cli_bench_train.
 * Every bench (also bench moe, ep and advise: cmd_bench.c, bench_ep.c) takes from here the spread of its
 * repetitions and the host's load average (bench_run.c defines them).
 */
#ifndef HP_TOOLS_BENCH_RUN_H
#define HP_TOOLS_BENCH_RUN_H

#include "cli.h"
#include "hyperpar/comm.h"
#include "hyperpar/run.h"

enum { CLI_BENCH_MAX_REPS = 50 };

/* Side of the reference GEMM of bench run and bench train (hp_cost_gemm_limit): 2048^3 (17 GFLOP, 48 MiB of f32
 * operands per rank) keeps a core busy for a good fraction of a second, long enough to reach the kernel's rate,
 * short enough for a test run. Best of CLI_BENCH_GEMM_REPS after a warm-up. */
enum { CLI_BENCH_GEMM_N = 2048, CLI_BENCH_GEMM_REPS = 3 };

/* Bytes of the read sweep (hp_moe_ref_read_gbps) of bench moe and the decode bench, the memory limit they
 * compare with: 512 MiB, larger than any last-level cache this runs on (32 MiB here), so it reads memory. */
#define CLI_BENCH_SWEEP_BYTES ((size_t)512 << 20)

/* One figure over its repetitions: the least, the median (the mean of the two middle values for an even
 * count) and the greatest. Every bench prints the median with this spread beside it (issue 40). */
typedef struct cli_bench_spread {
    double min, med, max;
} cli_bench_spread;
/* The spread of v[n], which it sorts in place (n 0: all zero). */
cli_bench_spread cli_bench_spread_sort(double *v, size_t n);
/* The spread of column c of rows [reps][ncol] (reps <= CLI_BENCH_MAX_REPS; rows unchanged). */
cli_bench_spread cli_bench_spread_col(const double *rows, int reps, int ncol, int c);
/* The JSON pair beside a median key: ", \"<prefix>min_s\": min, \"<prefix>max_s\": max" (seconds). */
void cli_bench_spread_json(const char *prefix, const cli_bench_spread *s);

/* The host's 1-minute load average, read once when a bench starts (before any work, the checkpoint included)
 * and once at its end (after PyTorch, before the report), so that a reader can tell a quiet run from a loaded
 * one (issue 40). */
typedef struct cli_bench_load {
    double start, end; /* -1: unreadable */
} cli_bench_load;
/* The 1-minute load average (getloadavg: /proc/loadavg), or -1 when it cannot be read. Every bench reads it here. */
double cli_bench_loadavg(void);
/* The report's line "  load<pad>: 1-minute load average 0.82 at start, 1.09 at end (2 cores)", the label padded
 * to width as its neighbours are ("unknown" for an unreadable figure), or the JSON pair
 * ", \"load_start\": 0.82, \"load_end\": 1.09" (-1 when unreadable). */
void cli_bench_load_text(const cli_bench_load *l, int width);
void cli_bench_load_json(const cli_bench_load *l);

/* The parsed options, the preset's shapes with the test-only replacements applied. */
typedef struct cli_bench_args {
    const cli_preset *p;
    int64_t layers, tokens, vocab, dp, cp, tp, reps, threads;
    int64_t batch;                                       /* rows of the global batch [batch, tokens] (>= dp) */
    int64_t hidden, intermediate, heads, kv_heads, head_dim;
    int64_t experts, moe_intermediate, first_dense, ep; /* MoE presets; ep 0: = tp */
    int64_t n_group, topk_group;                         /* DeepSeek-V3's routing groups for `experts` */
    int64_t decode;                                      /* bench run --decode N: N decode steps after the prefill */
    bool tp_given, json, train;                          /* train: bench train (the runner keeps activations) */
    hp_dtype dtype;
    hp_linalg_mode compute;                              /* --compute: the runner's products (exact by default) */
} cli_bench_args;

/* What the run set up, for the report (rank 0's). */
typedef struct cli_bench_info {
    char mesh[128], backend[128], kernels[512], blas[512], group[16];
    int ranks, threads, reps, n_overrides;
    cli_threads_info ti; /* cli_threads: the count per rank and how it was chosen */
    int64_t n_sparse;  /* sparse decoder layers */
    bool torch;        /* the launcher's python can import torch (cli_bench_torch_probe) */
    char torch_why[400]; /* when not, why */
    const char *ckpt_dir; /* the random checkpoint's folder */
    double weights;    /* W, the weights one token goes through in the forward's GEMMs (hp_cost_gemm_weights) */
    double gemm_flop;  /* 2 T x W: the GEMM work of one forward */
    double train_flop; /* model FLOPs of one training step over the batch (hp_cost_train_flops: 6 x W x B x T) */
    double gen_s;      /* seconds rank 0 took to write the checkpoint */
    uint64_t ckpt_bytes;
    cli_bench_load load; /* the host's load average at the start and the end of the bench */
} cli_bench_info;

/* The report's first lines (text: "bench <name>: preset ..., checkpoint, mesh, threads, load, moe, kernels,
 * attention"; JSON: from "{" through "blas", "load_start" and "load_end", without the closing brace). */
void cli_bench_print_head(const char *name, const cli_bench_args *a, const cli_bench_info *in);
void cli_bench_json_head(const char *name, const cli_bench_args *a, const cli_bench_info *in);

/* bench train (bench_train.c): warm-up and a->reps timed training steps of r (created with keep_activations)
 * on ids [a->batch, a->tokens], the same-run GEMM rate, PyTorch's step, in->load.end, the report on rank 0 (in:
 * rank 0's). Collective; every failure agreed. */
hp_status cli_bench_train(const hp_comm *w, hp_runner *r, const int64_t *ids, const cli_bench_args *a,
                          cli_bench_info *in, hp_err *err);

/* bench run --decode (bench_decode.c): a->reps × (the prefill of ids [a->batch, a->tokens], a->decode one-token
 * steps) on r (created with a KV cache of tokens + decode positions), the read sweep, cost --mode decode's
 * prediction, PyTorch's generate, in->load.end; the report on rank 0. Collective. */
struct hp_model;
struct hp_plan;
hp_status cli_bench_decode(const hp_comm *w, hp_runner *r, const struct hp_model *m, const struct hp_plan *p,
                           const int64_t *ids, const cli_bench_args *a, cli_bench_info *in, hp_err *err);

/* PyTorch eager on the same checkpoint and batch, timed in the same run (bench_torch.c). */
typedef struct cli_torch_eager {
    bool measured;
    double median_s, tokens_per_s;
    double min_s, max_s; /* the least and the greatest timed call, when has_spread (the script printed them) */
    bool has_spread;
    int threads;
    char model[256], version[64], dtype[16];
    char note[512]; /* measured: what ran; else why not ("PyTorch eager: not measured ...") */
} cli_torch_eager;
/* Whether $HP_BENCH_PYTHON (python3) can import torch, within a minute (else it is killed); asked before MPI
 * starts. When not, why says so: the program cannot run, its exit status and last line of stderr, or its signal. */
bool cli_bench_torch_probe(char *why, size_t cap);
/* Collective; rank 0 runs the forward (bench run; in a's dtype) or a forward+backward+AdamW step (bench train;
 * f32) of PyTorch eager on in->ckpt_dir at a's batch, with the threads of this node's ranks (in->threads each),
 * one warm-up and in->reps timed, while the other ranks wait without spinning; when !in->torch or it fails,
 * rank 0's t->note says why (a failure of PyTorch is a note, never the bench's error). */
hp_status cli_bench_torch(const hp_comm *w, const cli_bench_args *a, const cli_bench_info *in, cli_torch_eager *t,
                          hp_err *err);
/* bench moe's PyTorch run: one sparse block of the family with these dimensions (bench/torch_moe.py). */
typedef struct cli_torch_moe {
    const char *family; /* hyperpar's family name: qwen3_moe, mixtral, gpt_oss, deepseek_v3, qwen2_moe */
    int64_t hidden, experts, top_k, intermediate, shared, groups, topk_group, tokens;
    int threads, reps;
    const char *dtype;  /* f32, bf16 (the block in bf16) or autocast (f32 weights, bf16 products) */
} cli_torch_moe;
/* Times PyTorch eager's block on [1, tokens, hidden] (one warm-up, reps timed) when $HP_BENCH_PYTHON can import
 * torch; otherwise, or when it fails, t->note says why (never an error of the bench). */
void cli_bench_torch_moe(const cli_torch_moe *m, cli_torch_eager *t);
/* The report's line (text) or fields (JSON: pytorch_eager, ratio_over_pytorch, pytorch_note), next to
 * hyperpar's tokens/s; what: "tokens/s prefill", "training tokens/s". */
void cli_bench_torch_text(const cli_torch_eager *t, double tokens_per_s, const char *what);
void cli_bench_torch_json(const cli_torch_eager *t, double tokens_per_s);

#endif
