/*
 * inputflags.c — run's, validate's and cost's token inputs: which source the flags name, refused when they name
 * two or a companion without its source. The sources' rules (the stream's rows, the list's syntax, the random
 * ids) are hp_ids_load's (src/data/data.c).
 */
#include <string.h>

#include "inputflags.h"

int cli_input_flag(const char *cmd, int c, const char *arg, cli_input_flags *f)
{
    int64_t v;
    switch (c) {
    case CLI_O_INPUT: f->input = arg; return 1;
    case CLI_O_IDS: f->ids = arg; return 1;
    case CLI_O_RANDOM: f->random = arg; return 1;
    case CLI_O_DDTYPE:
        if (!hp_data_dtype_parse(arg, &f->src.dtype))
            return cli_usage_error(cmd, "--data-dtype expects uint16 or uint32, got '%s'", arg), -1;
        f->dtype = arg;
        return 1;
    case CLI_O_SEED:
        if (!cli_parse_i64(cmd, "--seed", arg, 0, INT64_MAX, &v)) return -1;
        f->src.seed = (uint64_t)v;
        f->seed_given = true;
        return 1;
    default: return 0;
    }
}

int cli_input_check(const char *cmd, cli_input_flags *f, int64_t seq, int64_t batch)
{
    const char *given[3], *names[3] = {"--input", "--ids", "--random-input"};
    const char *args[3] = {f->input, f->ids, f->random};
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (args[i]) given[n++] = names[i];
    if (n > 1)
        return cli_usage_error(cmd, "%s and %s are two inputs; give one of them", given[0], given[1]);
    if (n == 0) return cli_usage_error(cmd, "missing the input: " CLI_INPUT_WAYS);
    bool stream = f->input && seq > 0;
    if (f->input && seq > 0 && hp_data_is_safetensors(f->input))
        return cli_usage_error(cmd, "%s holds input_ids [B, S] of its own; --seq (and --batch) cut a token stream "
                               "into rows", f->input);
    if (f->input && !stream && batch > 0)
        return cli_usage_error(cmd, "--batch with --input needs --seq S: together they cut a token stream into "
                               "rows (a safetensors file has its own [B, S])");
    if (!f->input && (seq > 0 || batch > 0))
        return cli_usage_error(cmd, "%s carries its own shape; --seq and --batch cut a token stream given with "
                               "--input", given[0]);
    if (f->dtype && !stream)
        return cli_usage_error(cmd, "--data-dtype belongs to a token stream (--input FILE --seq S)");
    if (f->seed_given && !f->random) return cli_usage_error(cmd, "--seed belongs to --random-input B,S");
    f->src.kind = stream ? HP_IDS_STREAM : f->input ? HP_IDS_SAFETENSORS : f->ids ? HP_IDS_LIST : HP_IDS_RANDOM;
    f->src.arg = f->input ? f->input : f->ids;
    if (stream) {
        f->src.S = seq;
        f->src.B = batch > 0 ? batch : 1;
    }
    if (f->random) {
        hp_err err;
        if (hp_ids_parse_shape(f->random, &f->src.B, &f->src.S, &err) != HP_OK)
            return cli_usage_error(cmd, "%s", err.msg);
    }
    return HP_EXIT_OK;
}
