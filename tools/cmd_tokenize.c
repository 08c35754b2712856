/*
 * cmd_tokenize.c — `hyperpar tokenize MODEL --text FILE [--out TOKENS.bin]` and `--decode IDS`: a text into the
 * token file `train --data` reads, and ids back into text, with the model's tokenizer.json (hyperpar/tokenizer.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/comm.h"
#include "hyperpar/tokenizer.h"

typedef struct tok_args {
    const char *text, *out, *decode;
    int dtype; /* 0: from the vocabulary, else the id bytes 2 or 4 */
    bool ids_text, no_special, skip_special;
} tok_args;

static const cli_enum g_dtypes = {NULL, {{"uint16", 2, false}, {"uint32", 4, false}}};

static const cli_opt g_opts[] = {
    {"text", 't', "FILE", "the text to encode (any bytes)", 0, NULL, CLI_STR_NONEMPTY(tok_args, text, "a file")},
    {"out", 'o', "FILE", "encoding: the token file to write (default: the ids on stdout, separated\n"
                         "by spaces); decoding: the text file (default: stdout)", 0, NULL,
     CLI_STR_NONEMPTY(tok_args, out, "a file")},
    {"dtype", 'd', "uint16|uint32", "the token file's ids (default: uint16 when the vocabulary has at most\n"
                                    "65,536 ids, else uint32; train takes the same as --data-dtype)", 0, NULL,
     CLI_ENUM(tok_args, dtype, g_dtypes)},
    {"no-special", 'n', NULL, "encode without the post-processor's tokens (a BOS)", 0, NULL,
     CLI_FLAG(tok_args, no_special)},
    {"decode", 'D', "IDS", "decode the ids of the token file IDS (as --out writes it) into text", 0, NULL,
     CLI_STR_NONEMPTY(tok_args, decode, "a file")},
    {"ids-text", 'T', NULL, "--decode's IDS holds decimal ids separated by spaces, commas or lines\n"
                            "(what tokenize prints)", 0, NULL, CLI_FLAG(tok_args, ids_text)},
    {"skip-special", 's', NULL, "decoding leaves the special tokens out", 0, NULL, CLI_FLAG(tok_args, skip_special)},
    CLI_OPT_HELP,
    {0},
};

static const cli_arg g_args[] = {
    {"MODEL", "a folder with tokenizer.json (and tokenizer_config.json for BOS/EOS), or the file"},
    {0},
};

const cli_command cli_cmd_tokenize = {
    .cmd = "tokenize",
    .summary = "encode a text into a token file with a model's tokenizer.json, or decode ids",
    .forms = {{NULL, "MODEL --text [--out]"}, {NULL, "MODEL --decode [--ids-text] [--out]"}},
    .about = "Encodes FILE with the byte-level BPE tokenizer of MODEL (tokenizer.json: the GPT-2, Llama-3 and\n"
             "Qwen2 pre-tokenizers, added and special tokens; the same ids as Hugging Face tokenizers) and writes\n"
             "the ids as the token file 'train --data' reads, or prints them. --decode turns ids back into text.\n"
             "A tokenizer with a part hyperpar does not implement is refused by name (docs/tokenizer.md).\n",
    .args = g_args,
    .opts = g_opts,
    .run = cmd_tokenize,
};

/* The ids on stdout, separated by spaces, a line break at the end. */
static void print_ids(const int32_t *ids, int64_t n)
{
    for (int64_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
}

static int encode(hp_tok *tok, const tok_args *a, int id_bytes)
{
    hp_err err;
    int32_t *ids;
    int64_t n;
    uint64_t bytes;
    double t0 = hp_comm_wtime();
    if (hp_tok_encode_file(tok, a->text, !a->no_special, &ids, &n, &bytes, &err) != HP_OK) return cli_fail(&err);
    double dt = hp_comm_wtime() - t0;
    int first;
    int64_t dropped = hp_tok_dropped(tok, &first);
    if (dropped)
        cli_warn("tokenize: %lld bytes of %s have no token in the vocabulary (the first: 0x%02X) and were left out, "
                 "as Hugging Face tokenizers leaves them out; decoding will not give them back", (long long)dropped,
                 a->text, (unsigned)first);
    int rc = HP_EXIT_OK;
    if (a->out) {
        if (hp_tok_write_ids(a->out, ids, n, id_bytes, &err) != HP_OK) rc = cli_fail(&err);
    } else {
        print_ids(ids, n);
    }
    free(ids);
    if (rc != HP_EXIT_OK) return rc;
    char b[32], k[32];
    fprintf(stderr, "hyperpar tokenize: %s bytes -> %s ids in %.3g s (%.3g MB/s)%s%s%s\n",
            hp_format_count(bytes, b, sizeof b), hp_format_count((uint64_t)n, k, sizeof k), dt,
            dt > 0 ? (double)bytes / dt / 1e6 : 0.0, a->out ? "; wrote " : "", a->out ? a->out : "",
            !a->out ? "" : id_bytes == 2 ? " (uint16: train --data-dtype uint16)" : " (uint32: train --data-dtype uint32)");
    return HP_EXIT_OK;
}

static int decode(hp_tok *tok, const tok_args *a, int id_bytes)
{
    hp_err err;
    int32_t *ids;
    int64_t n;
    hp_status st = a->ids_text ? hp_tok_read_ids_text(a->decode, &ids, &n, &err)
                               : hp_tok_read_ids(a->decode, id_bytes, &ids, &n, &err);
    if (st != HP_OK) return cli_fail(&err);
    char *text;
    size_t len;
    st = hp_tok_decode(tok, ids, n, a->skip_special, &text, &len, &err);
    free(ids);
    if (st != HP_OK) {
        hp_err_prefix(&err, "%s", a->decode);
        return cli_fail(&err);
    }
    int rc = HP_EXIT_OK;
    if (a->out) rc = cli_write_atomic(a->out, text, len, "the text");
    else if (len && fwrite(text, 1, len, stdout) != len) rc = HP_EXIT_RUNTIME;
    free(text);
    return rc;
}

int cmd_tokenize(int argc, char **argv)
{
    tok_args a = {0};
    cli_parser cp = {.command = &cli_cmd_tokenize};
    int rc = cli_parse(&cp, &a, argc, argv);
    if (rc != HP_EXIT_OK) return rc == CLI_HELP ? HP_EXIT_OK : rc;
    if (optind >= argc) return cli_usage_error("tokenize", "MODEL is required (a folder with tokenizer.json)");
    if (optind + 1 != argc) return cli_usage_error("tokenize", "unexpected argument '%s'", argv[optind + 1]);
    const char *model = argv[optind];
    if (!a.text == !a.decode) return cli_usage_error("tokenize", "give one of --text FILE (encode) or --decode IDS");
    if (a.ids_text && !a.decode) return cli_usage_error("tokenize", "--ids-text applies to --decode only");
    if (a.skip_special && !a.decode) return cli_usage_error("tokenize", "--skip-special applies to --decode only");
    if (a.no_special && a.decode) return cli_usage_error("tokenize", "--no-special applies to --text only");
    if (a.dtype && a.decode && a.ids_text) return cli_usage_error("tokenize", "--dtype does not apply to --ids-text");
    if (a.dtype && !a.decode && !a.out) return cli_usage_error("tokenize", "--dtype applies to a token file (--out)");
    const char *inputs[2] = {a.text, a.decode};
    if (a.out && cli_check_output_file("tokenize", "--out", a.out, model, inputs, 2) != 0) return HP_EXIT_USAGE;
    hp_err err;
    hp_tok *tok;
    if (hp_tok_load(model, &tok, &err) != HP_OK) return cli_fail(&err);
    int id_bytes = a.dtype ? a.dtype : hp_tok_id_bytes(tok);
    if (id_bytes == 2 && hp_tok_n_vocab(tok) > 65536 && !a.decode) {
        long long nv = (long long)hp_tok_n_vocab(tok);
        hp_tok_free(tok);
        return cli_usage_error("tokenize", "--dtype uint16 cannot hold the ids of a vocabulary of %lld; use uint32",
                               nv);
    }
    char d[256];
    if (hp_log_get_level() >= HP_LOG_INFO) hp_log(HP_LOG_INFO, "tokenizer: %s", hp_tok_describe(tok, d, sizeof d));
    rc = a.decode ? decode(tok, &a, id_bytes) : encode(tok, &a, id_bytes);
    hp_tok_free(tok);
    return rc;
}
