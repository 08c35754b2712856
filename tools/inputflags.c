/*
 * inputflags.c — run's, validate's and cost's token inputs: which source the flags name, refused when they name
 * two or a companion without its source. The sources' rules (the stream's rows, the list's syntax, the random
 * ids) are hp_ids_load's (src/data/data.c).
 */
#include <string.h>

#include "inputflags.h"

bool cli_input_dtype_fn(const cli_ctx *x)
{
    cli_input_flags *f = cli_target(x);
    if (!hp_data_dtype_parse(x->arg, &f->src.dtype))
        return cli_usage_error(x->cmd, "--data-dtype expects uint16 or uint32, got '%s'", x->arg), false;
    f->dtype = x->arg;
    return true;
}

bool cli_input_seed_fn(const cli_ctx *x)
{
    cli_input_flags *f = cli_target(x);
    int64_t v;
    if (!cli_parse_i64(x->cmd, "--seed", x->arg, 0, INT64_MAX, &v)) return false;
    f->src.seed = (uint64_t)v;
    f->seed_given = true;
    return true;
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
