/*
 * inputflags.h — the token inputs run, validate and cost share (inputflags.c): --input, --ids, --random-input
 * and their companions, turned into an hp_ids_source (hyperpar/data.h holds the rules).
 */
#ifndef HP_TOOLS_INPUTFLAGS_H
#define HP_TOOLS_INPUTFLAGS_H

#include "cli.h"
#include "hyperpar/data.h"

enum { CLI_O_INPUT = 'i', CLI_O_IDS = 0x6000, CLI_O_RANDOM, CLI_O_SEED, CLI_O_DDTYPE };

/* Handlers (inputflags.c): --data-dtype, --seed. */
bool cli_input_dtype_fn(const cli_ctx *x);
bool cli_input_seed_fn(const cli_ctx *x);
/* The token input flags for a command's table: into the cli_input_flags member m of the args struct T. */
#define CLI_OPTS_INPUT(grp, T, m)                                                                                   \
    {"input", CLI_O_INPUT, "FILE", "a safetensors file with input_ids I64 (or I32) [B, S]; with --seq S a token\n" \
                                   "stream instead (flat little-endian uint16/uint32, as 'hyperpar train'\n"     \
                                   "reads): B rows of S tokens, row b = tokens [b*S, b*S+S), B = --batch\n"      \
                                   "(default 1)", CLI_SHORT, grp, CLI_STR(T, m.input)},                            \
    {"data-dtype", CLI_O_DDTYPE, "T", "a token stream's tokens: uint16 (default) or uint32", 0, grp,              \
     CLI_FN(T, m, cli_input_dtype_fn)},                                                                             \
    {"ids", CLI_O_IDS, "LIST", "the ids themselves: rows separated by ';', ids by ',' (\"1,2,3;4,5,6\" is\n"     \
                               "[2, 3]); every row the same length", 0, grp, CLI_STR(T, m.ids)},                 \
    {"random-input", CLI_O_RANDOM, "B,S", "B rows of S ids drawn uniformly from [0, vocab) by splitmix64 from\n"  \
                                          "--seed (docs/run.md, \"Inputs\"): the same ids on every rank and run",  \
     0, grp, CLI_STR(T, m.random)},                                                                                 \
    {"seed", CLI_O_SEED, "N", "--random-input's seed (default 0)", 0, grp, CLI_FN(T, m, cli_input_seed_fn)}

typedef struct cli_input_flags {
    const char *input, *ids, *random; /* the sources as given; exactly one is taken */
    const char *dtype;                /* --data-dtype as given */
    bool seed_given;
    hp_ids_source src;                /* filled by cli_input_check */
} cli_input_flags;

/* Exactly one source, its companions only with it; fills f->src. seq/batch: the command's --seq and --batch
 * (0: not given), which cut a token stream. Prints a usage error and returns 2, or HP_EXIT_OK. */
int cli_input_check(const char *cmd, cli_input_flags *f, int64_t seq, int64_t batch);
/* The flags' one-line reminder for a usage error ("give --input ..., --ids ... or --random-input B,S"). */
#define CLI_INPUT_WAYS "--input IDS.safetensors, --input TOKENS.bin --seq S, --ids \"1,2;3,4\" or --random-input B,S"

#endif
