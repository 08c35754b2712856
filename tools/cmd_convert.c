/*
 * cmd_convert.c — `hyperpar convert MODEL.gguf --out DIR [--dtype bf16|f32]`: a GGUF model as a Hugging Face
 * folder (hyperpar/convert.h, docs/gguf.md).
 */
#include <stddef.h>
#include <stdio.h>

#include "cli.h"
#include "signals.h"
#include "hyperpar/convert.h"

typedef struct convert_args {
    const char *out;
    hp_dtype dtype;
    int64_t threads;
    bool force;
} convert_args;

static const cli_enum g_dtypes = {"must be", {{"bf16", HP_DT_BF16, false}, {"f32", HP_DT_F32, false}}};

static const cli_opt g_opts[] = {
    {"out", 'o', "DIR", "the folder to write: absent or empty", 0, NULL, CLI_STR(convert_args, out)},
    {"dtype", 't', "bf16|f32", "the weights' dtype (bf16)", 0, NULL, CLI_ENUM(convert_args, dtype, g_dtypes)},
    {"threads", 'j', "N", "tensors written in parallel (default: one per core, at most 8)", 0, NULL,
     CLI_INT(convert_args, threads, 1, 256)},
    {"force", 'F', NULL, "replace an earlier 'hyperpar convert' output in DIR (nothing else)", 0, NULL,
     CLI_FLAG(convert_args, force)},
    CLI_OPT_HELP,
    {0},
};

const cli_command cli_cmd_convert = {
    .cmd = "convert",
    .summary = "a GGUF model (llama.cpp) as a Hugging Face folder",
    .forms = {{NULL, "MODEL.gguf --out"}},
    .about = "Writes DIR/config.json, generation_config.json, model.safetensors, tokenizer.json and\n"
             "tokenizer_config.json from a GGUF file: the weights dequantized (F32, F16, BF16, Q8_0, Q4_0, Q4_1,\n"
             "Q4_K, Q6_K) and cast to --dtype, under transformers' names with llama.cpp's rotary row order of\n"
             "q_proj / k_proj undone; the byte-level BPE tokenizer with its special tokens and chat template.\n"
             "transformers loads DIR as it is (AutoModelForCausalLM, AutoTokenizer), and so do inspect, plan and\n"
             "run. Architectures: llama (LlamaForCausalLM). The folder appears whole or not at all.\n",
    .epilog = "Exit codes: 0 ok, 1 runtime failure, 2 bad input (the message names the GGUF key or tensor).\n",
    .opts = g_opts,
    .run = cmd_convert,
};

int cmd_convert(int argc, char **argv)
{
    hp_convert_opts o;
    hp_convert_opts_default(&o);
    convert_args a = {.dtype = o.dtype};
    cli_parser cp = {.command = &cli_cmd_convert};
    int rc = cli_parse(&cp, &a, argc, argv);
    if (rc != HP_EXIT_OK) return rc == CLI_HELP ? HP_EXIT_OK : rc;
    if (optind != argc - 1)
        return cli_usage_error("convert", optind < argc ? "expected one MODEL.gguf, got more" : "expected MODEL.gguf");
    if (!a.out) return cli_usage_error("convert", "--out DIR is required");
    if (!*a.out) return cli_usage_error("convert", "--out is empty; give the name of the folder to create");
    o.out = a.out;
    o.dtype = a.dtype;
    o.threads = (int)a.threads;
    o.force = a.force;
    hp_err err;
    hp_convert_stats s;
    /* SIGINT / SIGTERM / SIGHUP: the writer stops within one piece, the temporary folder goes, and the signal is
     * re-raised, so the exit status is the signal's. */
    cli_signals_catch();
    if (hp_convert_gguf(argv[optind], &o, &s, &err) != HP_OK) return cli_signals_release(cli_fail(&err));
    cli_signals_release(0);
    char b[48];
    fprintf(stderr, "hyperpar convert: wrote %s (%zu tensors, %s of %s weights%s; config.json, tokenizer.json)\n", o.out,
            s.n_tensors, hp_format_bytes(s.bytes, b, sizeof b), hp_dtype_name(o.dtype),
            s.tied ? ", tied embeddings" : "");
    return HP_EXIT_OK;
}
