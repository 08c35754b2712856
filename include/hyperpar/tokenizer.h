/*
 * hyperpar/tokenizer.h — byte-level BPE tokenization, the same ids as Hugging Face `tokenizers` (docs/tokenizer.md).
 *
 * A tokenizer is loaded from a `tokenizer.json` (hp_tok_load) or built from arrays (hp_tok_create: the vocabulary
 * and merges a GGUF file carries). Encoding runs, for a text of any bytes (invalid UTF-8 included: byte-level BPE
 * has a token for every byte):
 *
 *   text ──split at added tokens (longest first)──▶ segments ──pre-tokenizer (GPT-2 / Llama-3 / Qwen2 patterns,
 *   Digits, ByteLevel)──▶ pieces ──BPE merges by rank──▶ ids ──post-processor (a BOS template)──▶ ids
 *
 * Decoding maps each id back to its bytes (the byte-level alphabet undone) and concatenates them; decode(encode(x))
 * == x unless the normalizer changed x (NFC), a prefix space was added, a byte had no token (hp_tok_dropped), or an
 * added token's text is itself in the byte-level alphabet (all as Hugging Face; docs/tokenizer.md).
 *
 * What the library does not implement (normalizers other than none, other model types, unknown pre-tokenizer
 * patterns, BPE dropout, byte fallback, single_word added tokens, ...) is refused by name at load, HP_ERR_INPUT,
 * never tokenized differently.
 *
 * An hp_tok keeps a cache of encoded pieces: one thread at a time may encode with one hp_tok (decode and the
 * lookups are read-only and may run beside each other).
 */
#ifndef HYPERPAR_TOKENIZER_H
#define HYPERPAR_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyperpar/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_tok hp_tok;

/* Loads path: a tokenizer.json, or a folder holding one. The folder's (or the file's folder's)
 * tokenizer_config.json, when present, names the BOS and EOS tokens (bos_token, eos_token). HP_ERR_INPUT naming
 * the file, the JSON path and line:col for a malformed file, a component that is not supported, merges naming
 * tokens not in the vocabulary, duplicate ids. */
hp_status hp_tok_load(const char *path, hp_tok **out, hp_err *err);
/* The same from a tokenizer.json already in memory; label names it in messages. */
hp_status hp_tok_load_json(const char *text, size_t len, const char *label, hp_tok **out, hp_err *err);

/* What a token is, for hp_tok_create (GGUF's token types map to these: control -> SPECIAL, user-defined -> ADDED,
 * the others -> NORMAL). */
typedef enum hp_tok_kind {
    HP_TOK_NORMAL = 0, /* a token of the BPE vocabulary, written in the byte-level alphabet ("Ġthe") */
    HP_TOK_SPECIAL,    /* an added special token ("<|endoftext|>"): matched in the text, skipped by a decode that
                          skips special tokens */
    HP_TOK_ADDED,      /* an added token that is not special: matched in the text, always decoded */
} hp_tok_kind;

/* A tokenizer's parts as arrays (the ids are the indices). */
typedef struct hp_tok_spec {
    int64_t n_vocab;
    const char *const *tokens;  /* [n_vocab] NUL-terminated UTF-8; NULL entries: no token of that id */
    const hp_tok_kind *kinds;   /* [n_vocab], or NULL: every token HP_TOK_NORMAL */
    int64_t n_merges;
    const char *const *merges;  /* [n_merges] "a b" (one space between two tokens), the rank is the index */
    const char *pre;            /* the pre-tokenizer, by name: "gpt2", "llama3" ("llama-bpe"), "qwen2", "smollm"
                                   (single digits, then GPT-2) (hp_tok_pre_names) */
    int32_t bos_id, eos_id;     /* -1: none */
    bool add_bos;               /* encode with add_special puts bos_id first */
    bool ignore_merges;         /* a piece that is a whole token is that token (Llama-3's tokenizer.json) */
} hp_tok_spec;

/* Builds a tokenizer from spec (everything is copied). HP_ERR_INPUT for an unknown pre-tokenizer name, an empty
 * vocabulary, a merge that is not two known tokens whose concatenation is a token, duplicate tokens, a bos or eos
 * id outside the vocabulary. */
hp_status hp_tok_create(const hp_tok_spec *spec, hp_tok **out, hp_err *err);

void hp_tok_free(hp_tok *tok);

/* The pre-tokenizer names hp_tok_create takes, comma-separated. */
const char *hp_tok_pre_names(void);

/* The ids of text (len bytes, any bytes) into *ids (malloc'd; the caller frees; n 0 gives a non-NULL array) and
 * *n. add_special: the post-processor's tokens (a BOS) are added, as Hugging Face's add_special_tokens=True. */
hp_status hp_tok_encode(hp_tok *tok, const void *text, size_t len, bool add_special, int32_t **ids, int64_t *n,
                        hp_err *err);

/* The bytes the last hp_tok_encode left out: a byte the vocabulary has no token for (SmolLM2's has none for 21 of
 * the 256, 0x1D among them) and no unk_token to stand for it is dropped, as Hugging Face's BPE drops it (its
 * neighbours then merge as if adjacent). *first_byte (may be NULL) gets the first such byte, -1 for none. */
int64_t hp_tok_dropped(const hp_tok *tok, int *first_byte);

/* The bytes of ids [n] into *out (malloc'd, NUL-terminated after *len bytes). skip_special: special added tokens
 * give nothing. HP_ERR_INPUT naming the position for an id outside [0, hp_tok_n_vocab) or one with no token. */
hp_status hp_tok_decode(const hp_tok *tok, const int32_t *ids, int64_t n, bool skip_special, char **out, size_t *len,
                        hp_err *err);

/* One more than the largest id (added tokens included): a token file of these ids needs uint16 when <= 65,536. */
int64_t hp_tok_n_vocab(const hp_tok *tok);
/* The id of a token as written in tokenizer.json ("Ġthe", "<|endoftext|>"), or -1. */
int32_t hp_tok_id(const hp_tok *tok, const char *token);
/* The token of an id as written in tokenizer.json, or NULL (outside the vocabulary, or a gap). */
const char *hp_tok_token(const hp_tok *tok, int32_t id);
bool hp_tok_is_special(const hp_tok *tok, int32_t id);
int32_t hp_tok_bos(const hp_tok *tok); /* -1: none */
int32_t hp_tok_eos(const hp_tok *tok); /* -1: none */
/* tokenizer_config.json's chat_template beside the tokenizer.json, or NULL. */
const char *hp_tok_chat_template(const hp_tok *tok);
/* A one-turn chat prompt in the model's format, ready to encode without special tokens added (as transformers'
 * apply_chat_template(add_generation_prompt=True) gives it): the system message (NULL: the template's own default,
 * if it writes one), the user's message, then the assistant's turn opened. Renders ChatML templates
 * (<|im_start|>ROLE\nTEXT<|im_end|>\n: SmolLM2, Qwen2); another template, or none, is HP_ERR_INPUT by name.
 * *out malloc'd. */
hp_status hp_tok_chat(const hp_tok *tok, const char *system, const char *user, char **out, hp_err *err);
/* One message of a conversation: role "system", "user" or "assistant"; content [len] bytes. */
typedef struct hp_tok_message {
    const char *role;
    const char *content;
    size_t len;
} hp_tok_message;
/* A whole conversation msgs [n] in the model's ChatML format, as transformers' apply_chat_template renders it:
 * the template's default system message first when msgs[0] is not a system one, then <|im_start|>ROLE\nCONTENT
 * <|im_end|>\n per message, then <|im_start|>assistant\n with add_generation_prompt. *out (malloc'd, NUL after
 * *len bytes) is to be encoded without special tokens added. spans (may be NULL): *spans [2 * *n_spans] (malloc'd)
 * the byte ranges [start, end) of every assistant message's content and its <|im_end|>, in order: what a
 * template's {% generation %} block wraps (return_assistant_tokens_mask). HP_ERR_INPUT: no ChatML template (by
 * name, as hp_tok_chat), a role other than those three. */
hp_status hp_tok_chat_render(const hp_tok *tok, const hp_tok_message *msgs, int64_t n, bool add_generation_prompt,
                             char **out, size_t *len, int64_t **spans, int64_t *n_spans, hp_err *err);
/* hp_tok_encode, and *mask [*n] (malloc'd): 1 for the tokens of each byte range spans [2 * n_spans] (in order) —
 * from the token holding its first byte to the one holding its last, transformers' char_to_token rule — else 0.
 * HP_ERR_INPUT when the ids do not decode to text itself (a normalizer changed it, a prefix space, a byte without
 * a token, a post-processor's token): the ranges then have no tokens to map to. */
hp_status hp_tok_encode_marked(hp_tok *tok, const void *text, size_t len, bool add_special, const int64_t *spans,
                               int64_t n_spans, int32_t **ids, uint8_t **mask, int64_t *n, hp_err *err);
/* One line for messages: "BPE, 2,000 ids, 1,743 merges, 3 added tokens, pre-tokenizer llama3 split + byte-level". */
const char *hp_tok_describe(const hp_tok *tok, char *buf, size_t cap);

/* ---- files of text and ids (the `tokenize` command) ----
 * A token file is what `train --data` reads (docs/train.md): the ids as a flat little-endian stream without a
 * header, each id_bytes wide: 2 (uint16, --data-dtype uint16) or 4 (uint32). */

/* The width a token file of this vocabulary needs: 2 when every id fits 16 bits (n_vocab <= 65,536), else 4. */
int hp_tok_id_bytes(const hp_tok *tok);
/* Encodes the file at path (at most HP_TOK_MAX_TEXT bytes) as hp_tok_encode; *bytes (may be NULL) gets its size. */
#define HP_TOK_MAX_TEXT ((size_t)1 << 31)
hp_status hp_tok_encode_file(hp_tok *tok, const char *path, bool add_special, int32_t **ids, int64_t *n,
                             uint64_t *bytes, hp_err *err);
/* Writes ids [n] as a token file of id_bytes (2 or 4) to path atomically (a temporary beside it, renamed at the
 * end: never a partial file). HP_ERR_INPUT for an id that does not fit (a negative one, or >= 65,536 in 2 bytes). */
hp_status hp_tok_write_ids(const char *path, const int32_t *ids, int64_t n, int id_bytes, hp_err *err);
/* Reads a token file of id_bytes into *ids (malloc'd) and *n. HP_ERR_INPUT for a size that is not a whole number of
 * ids, or a uint32 id past 2^31 - 1. */
hp_status hp_tok_read_ids(const char *path, int id_bytes, int32_t **ids, int64_t *n, hp_err *err);
/* Reads a text file of decimal ids separated by blanks, commas or line breaks (what `tokenize` prints; one pair of
 * [ ] around them allowed) into *ids and *n. HP_ERR_INPUT naming the first thing that is not an id in [0, 2^31). */
hp_status hp_tok_read_ids_text(const char *path, int32_t **ids, int64_t *n, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
