/*
 * costflags.h — the flags `hyperpar cost` and `hyperpar advise` share (costflags.c).
 */
#ifndef HP_TOOLS_COSTFLAGS_H
#define HP_TOOLS_COSTFLAGS_H

#include <stdio.h>

#include "hyperpar/cost.h"

enum {
    CLI_O_BATCH = 0x5000, CLI_O_SEQ, CLI_O_MODE, CLI_O_GEMM, CLI_O_INTRA_BW, CLI_O_INTER_BW, CLI_O_INTRA_LAT,
    CLI_O_INTER_LAT, CLI_O_RPN, CLI_O_GRAD, CLI_O_MASTER, CLI_O_OPTIM, CLI_O_ZERO, CLI_O_KV, CLI_O_BUDGET,
    CLI_O_FORMAT, CLI_O_OUT, CLI_O_MEASURE
};

#define CLI_OPT_COST                                                                                               \
    {"batch", required_argument, NULL, CLI_O_BATCH}, {"seq", required_argument, NULL, CLI_O_SEQ},                  \
        {"mode", required_argument, NULL, CLI_O_MODE}, {"gemm-gflops", required_argument, NULL, CLI_O_GEMM},       \
        {"intra-bw", required_argument, NULL, CLI_O_INTRA_BW}, {"inter-bw", required_argument, NULL, CLI_O_INTER_BW}, \
        {"intra-latency-us", required_argument, NULL, CLI_O_INTRA_LAT},                                            \
        {"inter-latency-us", required_argument, NULL, CLI_O_INTER_LAT},                                            \
        {"ranks-per-node", required_argument, NULL, CLI_O_RPN}, {"grad-bytes", required_argument, NULL, CLI_O_GRAD}, \
        {"master-bytes", required_argument, NULL, CLI_O_MASTER}, {"optim-bytes", required_argument, NULL, CLI_O_OPTIM}, \
        {"zero", required_argument, NULL, CLI_O_ZERO}, {"kv-bytes", required_argument, NULL, CLI_O_KV},            \
        {"mem-per-rank", required_argument, NULL, CLI_O_BUDGET}, {"format", required_argument, NULL, CLI_O_FORMAT}, \
        {"output", required_argument, NULL, 'o'}, {"measure-gemm", no_argument, NULL, CLI_O_MEASURE}

typedef struct cli_cost_flags {
    hp_cost_opts co;
    bool batch_given, seq_given;
    uint64_t budget;    /* --mem-per-rank, 0 when not given */
    int format;         /* 0 text, 1 json, 2 html */
    const char *output; /* -o */
    bool measure;       /* --measure-gemm */
    int32_t **routing;  /* --routing: per layer, owned */
    int64_t n_routing;
} cli_cost_flags;

void cli_cost_flags_init(cli_cost_flags *f);
/* Option c with its argument: 1 taken, 0 not one of these, -1 a usage error (printed). */
int cli_cost_flag(const char *cmd, int c, const char *arg, cli_cost_flags *f);
const char *cli_cost_model_usage(void);
/* "80GB" (1000s), "80GiB" or "80G" (1024s), "4096B" bytes: a unit is required (a bare "80" is refused, not taken
 * as 80 bytes); prints a usage error and returns false otherwise. */
bool cli_parse_size(const char *cmd, const char *opt, const char *s, uint64_t *out);
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
void cli_json_count(FILE *o, double v);
void cli_json_real(FILE *o, double v);
/* "2.5 s", "12.3 ms" or "45 us". */
const char *cli_seconds(double s, char *buf, size_t cap);

#endif
