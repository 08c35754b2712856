/*
 * costflags.h — the flags `hyperpar cost` and `hyperpar advise` share (costflags.c).
 */
#ifndef HP_TOOLS_COSTFLAGS_H
#define HP_TOOLS_COSTFLAGS_H

#include <stdio.h>

#include "cli.h"
#include "hyperpar/comm.h"
#include "hyperpar/cost.h"

enum {
    CLI_O_BATCH = 0x5000, CLI_O_SEQ, CLI_O_MODE, CLI_O_GEMM, CLI_O_INTRA_BW, CLI_O_INTER_BW, CLI_O_INTRA_LAT,
    CLI_O_INTER_LAT, CLI_O_RPN, CLI_O_GRAD, CLI_O_MASTER, CLI_O_OPTIM, CLI_O_ZERO, CLI_O_KV, CLI_O_BUDGET,
    CLI_O_FORMAT, CLI_O_OUT, CLI_O_MEASURE, CLI_O_STATE, CLI_O_HW, CLI_O_RECOMPUTE, CLI_O_MICRO, CLI_O_GLOBAL,
    CLI_O_CONTEXT, CLI_O_MEM_BW, CLI_O_RESERVE, CLI_O_GEMM_EFF, CLI_O_LINK_EFF, CLI_O_PP_SCHED
};

/* The cost model's flags, for a command's option table (cli_opt, cli.h); parsed by cli_cost_flag. */
/* The default batch of advise's help: one batch for every candidate (hp_advise_opts.cost.B). */
#define CLI_ADVISE_BATCH "one row per rank, N rows: every dp divides it"
/* bdef: the default batch, in the words of the command's help. */
/* The action of every cost flag but --format and --output: a setting of the library's by its long name. */
#define CLI_COST_SET(T, m) CLI_FN(T, m, cli_cost_fn)
#define CLI_OPTS_COST(grp, bdef, T, m)                                                                              \
    {"batch", CLI_O_BATCH, "B", "the batch of one step, all replicas (default: " bdef ")", 0, grp,                  \
     CLI_COST_SET(T, m)},                                                                                           \
    {"global-batch", CLI_O_GLOBAL, "B", "the same as --batch (train: the rows of one optimizer step)", 0, grp,      \
     CLI_COST_SET(T, m)},                                                                                           \
    {"micro-batch", CLI_O_MICRO, "MB", "train: rows per replica per micro-batch; B / (MB x dp) micro-batches\n"     \
                                       "(gradient accumulation) must be whole (default: 1 row, Megatron's; when\n"  \
                                       "dp does not divide B, one micro-batch of each replica's rows)", 0, grp,     \
     CLI_COST_SET(T, m)},                                                                                           \
    {"hardware", CLI_O_HW, "HW", "cpu (default: hyperpar's own f32 runtime), or a GPU: H100 (H100-80G), H200,\n"    \
                                 "A100 (A100-80G), MI300X: its memory, bf16 rate and links (docs/cost.md);\n"       \
                                 "figures are then estimates for a bf16 GPU engine, not hyperpar's runtime", 0,     \
     grp, CLI_COST_SET(T, m)},                                                                                      \
    {"recompute", CLI_O_RECOMPUTE, "R", "train, GPU: none, selective (default: the attention scores) or full\n"     \
                                        "(only each layer's input kept); cpu: none only", 0, grp,                   \
     CLI_COST_SET(T, m)},                                                                                           \
    {"pp-schedule", CLI_O_PP_SCHED, "K", "train with a pp axis: 1f1b, gpipe or interleaved (default: interleaved\n" \
                                         "with --pp-virtual, else 1f1b), as 'hyperpar train' runs it", 0, grp,      \
     CLI_COST_SET(T, m)},                                                                                           \
    {"seq", CLI_O_SEQ, "S", "positions per row of the step (default 4096)", 0, grp,                                 \
     CLI_COST_SET(T, m)},                                                                                           \
    {"mode", CLI_O_MODE, "M", "infer (default: weights, activations, KV cache), train (adds gradients,\n"           \
                              "optimizer state, master weights, saved activations, the backward) or\n"              \
                              "decode (serving: one new token per sequence of --batch against a KV\n"               \
                              "cache of --context positions; the sequences that fit, the step bound\n"              \
                              "by FLOPs or by memory bandwidth)", 0, grp,                                           \
     CLI_COST_SET(T, m)},                                                                                           \
    {"context", CLI_O_CONTEXT, "C", "decode: KV cache positions per sequence (default: --seq, else 4096)", 0, grp,  \
     CLI_COST_SET(T, m)},                                                                                           \
    {"gemm-gflops", CLI_O_GEMM, "G", "GEMM rate per rank for the predicted time (default 100; a GPU: its own)",     \
     0, grp, CLI_COST_SET(T, m)},                                                                                   \
    {"gemm-eff", CLI_O_GEMM_EFF, "F", "the fraction of that rate the step's GEMMs sustain, in (0, 1] (cpu: 1;\n"  \
                                      "a GPU: its profile's, H100 0.75, docs/cost.md)", 0, grp,                    \
     CLI_COST_SET(T, m)},                                                                                           \
    {"link-eff", CLI_O_LINK_EFF, "F", "the fraction of the link bandwidths collectives reach, in (0, 1]\n"        \
                                      "(cpu: 1; a GPU: its profile's, 0.8)", 0, grp,                               \
     CLI_COST_SET(T, m)},                                                                                           \
    {"measure-gemm", CLI_O_MEASURE, NULL, "measure it here instead: the GEMM layer at the model's hidden size",     \
     0, grp, CLI_COST_SET(T, m)},                                                                                   \
    {"mem-bw", CLI_O_MEM_BW, "G", "decode: memory bandwidth per rank in GB/s (10: what a core of a\n"               \
                                  "2-core CPU machine moved with memcpy, docs/cost.md; a GPU: its HBM's)", 0, grp,  \
     CLI_COST_SET(T, m)},                                                                                           \
    {"intra-bw", CLI_O_INTRA_BW, "G", "link bandwidth in GB/s inside a node (10)", 0, grp,                          \
     CLI_COST_SET(T, m)},                                                                                           \
    {"inter-bw", CLI_O_INTER_BW, "G", "link bandwidth in GB/s between nodes (1.25)", 0, grp,                        \
     CLI_COST_SET(T, m)},                                                                                           \
    {"intra-latency-us", CLI_O_INTRA_LAT, "L", "latency per message inside a node (5)", 0, grp,                     \
     CLI_COST_SET(T, m)},                                                                                           \
    {"inter-latency-us", CLI_O_INTER_LAT, "L", "latency per message between nodes (20)", 0, grp,                    \
     CLI_COST_SET(T, m)},                                                                                           \
    {"ranks-per-node", CLI_O_RPN, "R", "ranks 0..R-1 share a node, and so on: a divisor of the world, or at\n"      \
                                       "least the world (one node); default: all on one node (a GPU: 8)", 0, grp,   \
     CLI_COST_SET(T, m)},                                                                                           \
    {"train-state", CLI_O_STATE, "M", "train: runtime (default: what 'hyperpar train' holds, to the byte) or\n"     \
                                      "megatron (Megatron-LM's byte model, set by the four flags below)", 0, grp,   \
     CLI_COST_SET(T, m)},                                                                                           \
    {"grad-bytes", CLI_O_GRAD, "N", "train, megatron: gradient bytes per parameter (4)", 0, grp,                    \
     CLI_COST_SET(T, m)},                                                                                           \
    {"master-bytes", CLI_O_MASTER, "N", "train, megatron: master-weight bytes per parameter (4)", 0, grp,           \
     CLI_COST_SET(T, m)},                                                                                           \
    {"optim-bytes", CLI_O_OPTIM, "N", "train, megatron: optimizer-state bytes per parameter (8)", 0, grp,           \
     CLI_COST_SET(T, m)},                                                                                           \
    {"zero", CLI_O_ZERO, "Z", "train: 1 splits optimizer state (and megatron's master weights) over the\n"          \
                              "data-parallel group (experts: the ranks holding the same experts); 2\n"              \
                              "(megatron) gradients too; 3 (megatron, FSDP) the weights too", 0, grp,               \
     CLI_COST_SET(T, m)},                                                                                           \
    {"kv-bytes", CLI_O_KV, "N", "KV cache bytes per element (2)", 0, grp,                                           \
     CLI_COST_SET(T, m)},                                                                                           \
    {"mem-per-rank", CLI_O_BUDGET, "SIZE", "the memory budget of a rank, with its unit: 80GB = 80e9 bytes,\n"       \
                                           "80GiB = 80G = 80*2^30 bytes, 4096B = 4096 bytes (a GPU: its memory)",   \
     0, grp, CLI_COST_SET(T, m)},                                                                                   \
    {"mem-reserve", CLI_O_RESERVE, "SIZE", "of the budget, kept for the runtime and fragmentation (CUDA context,\n" \
                                           "NCCL buffers, allocator): the figures must fit the rest (default: a\n"  \
                                           "GPU: a tenth of its memory, 8 GiB of an H100; cpu: 0)", 0, grp,         \
     CLI_COST_SET(T, m)},                                                                                           \
    {"format", CLI_O_FORMAT, "F", "text (default), json, or html (one self-contained page)", 0, grp,                \
     CLI_ENUM(T, m.format, cli_enum_cost_format)},                                                                  \
    {"output", 'o', "FILE", "write there (atomically) instead of stdout", CLI_SHORT, grp,                           \
     CLI_STR(T, m.output)}

typedef struct cli_cost_flags {
    hp_cost_settings s; /* what the flags say (hp_cost_setting) */
    int format;         /* 0 text, 1 json, 2 html */
    const char *output; /* -o */
    int32_t **routing;  /* --routing: per layer, owned */
    int64_t n_routing;
} cli_cost_flags;

void cli_cost_flags_init(cli_cost_flags *f);
/* After the flags: applies --hardware under the flags given explicitly, its memory as the default budget, and
 * checks what the flags say together (--recompute under cpu, --micro-batch outside training, ...); --mode decode:
 * no training flag, the context is --context, else the --seq given, else 4096, and the step one new token (S = 1);
 * --context needs decode. false: a usage error was printed. */
bool cli_cost_flags_done(const char *cmd, cli_cost_flags *f);
/* The binding constraint and the changes of f (none: the line says nothing was found), as text (the JSON:
 * hp_fit_json, hyperpar/report.h). */
void cli_fit_text(FILE *o, const hp_fit *f, const char *cmd, int argc, char **argv);
/* The text line that says which engine the figures describe (the JSON: hp_cost_engine_json). */
void cli_cost_engine_text(FILE *o, const hp_cost_model *m, bool train);
/* The "reserve" line of the text: how much of a budget (0: none, no line) m keeps for the runtime, and the rest. */
void cli_cost_reserve_text(FILE *o, const hp_cost_model *m, uint64_t budget);
/* A cost flag's value through hp_cost_setting under the option's long name; its refusal as a usage error. */
bool cli_cost_fn(const cli_ctx *x);
extern const cli_enum cli_enum_cost_format; /* --format text|json|html: 0, 1, 2 */
hp_status cli_cost_read_routing(cli_cost_flags *f, const hp_model *m, const char *path, hp_err *err);
void cli_cost_flags_free(cli_cost_flags *f);
/* The GEMM layer's rate on this machine at the model's hidden size (512 rows x H x 4H, its dtype), into *flops
 * (FLOP/s), and what ran into desc. */
hp_status cli_measure_gemm(const hp_model *m, double *flops, char *desc, size_t cap, hp_err *err);
/* --measure-gemm: cli_measure_gemm into f's model (the rate printed on stderr); nothing otherwise. */
hp_status cli_cost_measure(cli_cost_flags *f, const hp_model *m, hp_err *err);
/* JSON numbers of doubles, never rounded to a few digits: a count (FLOPs) as an integer while a double holds it
 * exactly, else with every digit a double has (17 significant); a real (seconds, rates) with 17 significant
 * digits, which read back to the same double. Not finite: null. */
/* "2.5 s", "12.3 ms" or "45 us". */
const char *cli_seconds(double s, char *buf, size_t cap);


#endif
