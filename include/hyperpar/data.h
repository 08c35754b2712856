/*
 * hyperpar/data.h — token data for training: a token file opened once, cut into windows, ordered into global
 * batches (in order or shuffled per epoch from a seed), and the learning-rate schedule (docs/train.md, "Data,
 * batches and schedule").
 *
 * A source is either a flat little-endian token stream (uint16 or uint32, no header: nanoGPT's .bin), a
 * safetensors file with input_ids I64/I32 [N, S], or a token stream in memory (hp_data_open_ids: what train --text
 * tokenizes, hp_data_text; with a mask of the tokens that count as targets, --loss-mask). Every window becomes one
 * ids row the runner takes:
 *
 *   stream, --seq S:       window i = tokens [i·S, i·S + S] (S + 1 ids), W = floor((n_tokens − 1) / S);
 *                          the runner scores positions 0..S−1 against ids[p + 1]: S scored positions per row
 *   safetensors [N, S]:    window i = row i as stored (S ids), W = N; S − 1 scored positions per row
 *
 *      stream: | t0 t1 ... tS | tS+1 ... t2S | ...        window 0 = t0..tS, window 1 = tS..t2S (overlap: 1 token)
 *
 * Global batch k (step k + 1) holds the windows at positions [k·GB, (k+1)·GB) of the endless sequence of
 * epochs, each epoch a permutation of 0..W−1 (the identity, or Fisher–Yates from splitmix64 seeded by
 * seed ^ epoch). Every rank reads the same rows; the runner splits them over dp itself.
 */
#ifndef HYPERPAR_DATA_H
#define HYPERPAR_DATA_H

#include <stdint.h>

#include "hyperpar/core.h"
#include "hyperpar/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_data_dtype {
    HP_DATA_U16, /* little-endian uint16 stream (the default: vocabularies below 65,536) */
    HP_DATA_U32, /* little-endian uint32 stream */
} hp_data_dtype;

/* "uint16" / "uint32" -> the dtype; false for anything else. */
bool hp_data_dtype_parse(const char *s, hp_data_dtype *out);

typedef struct hp_data hp_data;

/* Opens path read-only: a safetensors file (a name ending in .safetensors) with input_ids I64/I32 [N, seq], or else
 * a token stream of dtype dt. Refused with HP_ERR_INPUT naming the file: a size that is not a whole number of
 * tokens, fewer than seq + 1 tokens (not one window), an input_ids of another dtype or rank or a width other than
 * seq, seq < 2 for safetensors (< 1 for a stream). The file is read with pread (a stream) or hp_st_read (safetensors),
 * so a file truncated meanwhile is an error, never a crash. */
hp_status hp_data_open(hp_data **out, const char *path, hp_data_dtype dt, int64_t seq, hp_err *err);
void hp_data_close(hp_data *d);

/* An in-memory token stream (what train --text tokenizes), cut into windows as a stream file is: ids [n] (each in
 * [0, 2^31)) and mask [n] (NULL: none), both copied. mask[i] != 0: token i counts as a target (the loss of the
 * position before it); 0: it is still an input, but no loss is taken on it (transformers' label -100). label
 * names the source in messages ("--text chat.jsonl"). HP_ERR_INPUT for fewer than seq + 1 tokens. */
hp_status hp_data_open_ids(hp_data **out, const char *label, const int32_t *ids, const uint8_t *mask, int64_t n,
                           int64_t seq, hp_err *err);

int64_t hp_data_windows(const hp_data *d);   /* W */
int64_t hp_data_row_len(const hp_data *d);   /* ids per row: seq + 1 for a stream, seq for safetensors */
int64_t hp_data_row_scored(const hp_data *d); /* scored positions per row: row_len − 1 */
const char *hp_data_path(const hp_data *d);
/* Whether the source has a mask (hp_data_open_ids). */
bool hp_data_masked(const hp_data *d);
/* Window w's mask, parallel to its ids row: row [hp_data_row_len(d)], 1 where the token counts as a target (every
 * token without a mask); and the targets it scores: positions 0..row_len − 2 whose next token counts (row_len − 1
 * without a mask). 0 <= w < W. */
void hp_data_window_mask(const hp_data *d, int64_t w, uint8_t *row);
int64_t hp_data_window_scored(const hp_data *d, int64_t w);

typedef enum hp_data_shuffle {
    HP_DATA_SEEDED = 0, /* the default: each epoch's window order a permutation from the seed */
    HP_DATA_IN_ORDER,   /* windows 0, 1, 2, ... every epoch */
} hp_data_shuffle;

typedef struct hp_data_order {
    hp_data_shuffle shuffle;
    uint64_t seed;
    int64_t global_batch; /* GB, windows per step, >= 1 */
} hp_data_order;

/* The window at position q (0-based) of the endless sequence of epochs: epoch q / W, index q mod W of that
 * epoch's permutation. */
hp_status hp_data_window_at(hp_data *d, const hp_data_order *o, int64_t q, int64_t *window, hp_err *err);

/* Rows [row0, row0 + rows) of global batch `step` (0-based: the k of step k + 1) into ids_out
 * [rows, hp_data_row_len(d)]; 0 <= row0, row0 + rows <= global_batch. A token outside [0, vocab) is
 * HP_ERR_INPUT naming the file, its token offset and byte offset (a stream) or its input_ids[n][s]. */
hp_status hp_data_batch(hp_data *d, const hp_data_order *o, int64_t step, int64_t row0, int64_t rows, int64_t vocab,
                        int64_t *ids_out, hp_err *err);

/* Windows [w0, w0 + rows) in file order (evaluation), the same checks. */
hp_status hp_data_rows(hp_data *d, int64_t w0, int64_t rows, int64_t vocab, int64_t *ids_out, hp_err *err);

/* Epoch e's permutation of 0..n−1 (Fisher–Yates from splitmix64 seeded by seed ^ e), written to perm [n]. */
void hp_data_permutation(uint64_t seed, uint64_t epoch, int64_t n, int64_t *perm);
/* splitmix64: advances *state by 0x9E3779B97F4A7C15 and returns its mix. */
uint64_t hp_splitmix64(uint64_t *state);

/* ---- the token inputs of run, validate and cost (docs/run.md, "Inputs") ----
 *
 * One source gives ids [B, S] (row-major, int64):
 *
 *   HP_IDS_SAFETENSORS (path):    its input_ids I64/I32 [B, S] as stored, whatever the file's name
 *   HP_IDS_STREAM (path, B, S):   a token stream (flat little-endian uint16/uint32, no header, as hp_data_open
 *                                 reads it) cut into B rows of S tokens without overlap: row b = tokens
 *                                 [b·S, b·S + S); the rest of the file is not read
 *   HP_IDS_LIST ("1,2,3;4,5,6"):  rows separated by ';', ids by ',' (blanks around either allowed), decimal;
 *                                 every row the same length
 *   HP_IDS_RANDOM (B, S, seed):   ids[i] = (the i-th output of splitmix64 from state seed) mod vocab, i = b·S + s;
 *                                 the modulo's bias (below 2^-32 for any vocabulary below 2^32) is part of the
 *                                 definition, so another tool reproduces the ids exactly
 *
 * Every id is checked against [0, vocab); an error names where the bad id is (input_ids[b][s], the stream's token
 * and byte offset, or the list's row and column counted from 1). */
typedef enum hp_ids_kind {
    HP_IDS_NONE = 0,
    HP_IDS_SAFETENSORS, /* arg: the path */
    HP_IDS_STREAM,      /* arg: the path; dtype, B, S */
    HP_IDS_LIST,        /* arg: the text */
    HP_IDS_RANDOM,      /* B, S, seed */
} hp_ids_kind;

typedef struct hp_ids_source {
    hp_ids_kind kind;
    const char *arg;
    hp_data_dtype dtype; /* HP_IDS_STREAM (HP_DATA_U16 = 0 by default) */
    int64_t B, S;        /* HP_IDS_STREAM and HP_IDS_RANDOM: rows and their length, each in [1, 2^31) */
    uint64_t seed;       /* HP_IDS_RANDOM */
} hp_ids_source;

/* hp_data_open's rule: a name ending in .safetensors holds input_ids, any other is a token stream. */
bool hp_data_is_safetensors(const char *path);

/* "B,S" (two integers in [1, 2^31), as --random-input takes them) -> B, S; HP_ERR_INPUT naming what is wrong. */
hp_status hp_ids_parse_shape(const char *text, int64_t *B, int64_t *S, hp_err *err);

/* The ids of src into *ids (malloc'd [B·S]; ids NULL: read and check them, return only the shape) and their
 * shape. HP_ERR_INPUT for a source that is empty, ragged, not numbers, outside [0, vocab), shorter than B·S tokens,
 * or a B·S that overflows; the message names the source (the file, --ids or --random-input) and what to do.
 * vocab < 1 (a model that does not give its size): the ids are not checked against it (hp_runner_forward still
 * checks them), and HP_IDS_RANDOM is refused. */
hp_status hp_ids_load(const hp_ids_source *src, int64_t vocab, int64_t **ids, int64_t *B, int64_t *S, hp_err *err);

/* The safetensors file's input_ids I64/I32 [B, S] (B, S >= 1) into *ids (malloc'd; ids NULL: only the shape is
 * read), whatever the file's name; vocab > 0 also checks every id against [0, vocab). */
hp_status hp_data_read_input_ids(const char *path, int64_t vocab, int64_t **ids, int64_t *B, int64_t *S, hp_err *err);

/* ---- text: the token stream of train --text (docs/train.md, "Text") ----
 *
 * A file named *.jsonl holds one document a line, {"text": "..."} or {"messages": [{"role", "content"}, ...]}
 * (a conversation in the model's ChatML format, hp_tok_chat_render); blank lines are skipped. Any other file is
 * one document, the whole of it. A text document is encoded as `hyperpar tokenize` encodes a file (the
 * post-processor's tokens added), a conversation as apply_chat_template gives it (none added); each is followed
 * by the tokenizer's EOS id. */
typedef struct hp_text_tokens {
    int32_t *ids;          /* [n] */
    uint8_t *mask;         /* [n] with loss_mask (1: an assistant message's token, its <|im_end|> included), else
                              NULL */
    int64_t n, n_docs;
    int64_t n_marked;      /* tokens the mask marks */
    uint64_t bytes;        /* the file's */
    int64_t n_dropped;     /* bytes the tokenizer left out (no token for them: hp_tok_dropped) */
    int first_dropped;     /* the first of them, -1: none */
} hp_text_tokens;

/* Whether path names a JSON Lines file (its name ends in .jsonl). */
bool hp_data_is_jsonl(const char *path);
/* The token stream of the text file at path (at most HP_TOK_MAX_TEXT bytes) into *out. loss_mask: path must be
 * a .jsonl of conversations, and out->mask marks the assistant's tokens. HP_ERR_INPUT naming the file (and the
 * line of a .jsonl) for an empty file, a line that is not one of those objects, a role other than system, user
 * and assistant, a conversation whose tokens cannot be mapped back to its text (hp_tok_encode_marked), no
 * document, a tokenizer without an EOS token or without a ChatML template for a conversation. */
hp_status hp_data_text(hp_tok *tok, const char *path, bool loss_mask, hp_text_tokens *out, hp_err *err);
void hp_text_tokens_free(hp_text_tokens *t);

/* ---- the learning-rate schedule ---- */

typedef enum hp_lr_kind {
    HP_LR_COSINE = 0, /* the default */
    HP_LR_LINEAR,
    HP_LR_CONSTANT,
} hp_lr_kind;

/* "cosine" / "linear" / "constant" -> the kind; false for anything else. */
bool hp_lr_kind_parse(const char *s, hp_lr_kind *out);
const char *hp_lr_kind_name(hp_lr_kind k);

typedef struct hp_lr_schedule {
    hp_lr_kind kind;
    double lr, min_lr;
    int64_t warmup; /* W >= 0 steps */
    int64_t steps;  /* N >= 1, the run's length */
} hp_lr_schedule;

/* The learning rate of step t = 1..N: t <= W gives lr·t/W; after it (or t > N = W) cosine
 * min_lr + ½(lr − min_lr)(1 + cos(π(t−W)/(N−W))), linear lr − (lr − min_lr)(t−W)/(N−W), constant lr; N <= W:
 * lr after the warmup. */
double hp_lr_at(const hp_lr_schedule *s, int64_t t);

#ifdef __cplusplus
}
#endif
#endif
