/*
 * hyperpar/convert.h — a GGUF model as a Hugging Face folder (`hyperpar convert`, docs/gguf.md).
 *
 *   MODEL.gguf ──hp_gguf_model_map──► hp_gguf_model: config.json text, generation_config.json text, and each
 *        │                            GGUF tensor under its transformers name and shape (Q/K rows to un-permute)
 *        └──hp_gguf_tokenizer──────► tokenizer.json + tokenizer_config.json texts (byte-level BPE)
 *   hp_convert_gguf: both, then config.json, generation_config.json, model.safetensors (dequantized, cast to
 *   bf16 or f32, Q/K rows restored), tokenizer.json and tokenizer_config.json into --out, atomically.
 *
 * Architectures: llama (LlamaForCausalLM). Tokenizers: tokenizer.ggml.model "gpt2" with the pre-tokenizers
 * "smollm", "llama-bpe", "qwen2", "gpt-2" / "gpt2". Anything else is refused by name (HP_ERR_INPUT).
 */
#ifndef HYPERPAR_CONVERT_H
#define HYPERPAR_CONVERT_H

#include "hyperpar/gguf.h"
#include "hyperpar/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One GGUF tensor as transformers names it. */
typedef struct hp_gguf_mapped {
    const char *name;             /* transformers' name: model.layers.0.self_attn.q_proj.weight */
    const hp_gguf_tensor *src;    /* the GGUF tensor (blk.0.attn_q.weight) */
    int n_dims;
    int64_t shape[HP_GGUF_MAX_DIMS]; /* transformers' order: the GGUF dims reversed */
    int64_t permute_heads;        /* > 0: llama.cpp interleaved each head's rotary halves over this many heads
                                   * (q: attention heads, k: key/value heads); convert undoes it */
} hp_gguf_mapped;

typedef struct hp_gguf_model {
    const hp_gguf_file *file;
    const char *arch;             /* general.architecture ("llama") */
    char *config_json;            /* config.json for transformers, torch_dtype as asked */
    char *generation_config_json; /* bos / eos / pad ids */
    hp_gguf_mapped *tensors;      /* [n_tensors], transformers' order */
    size_t n_tensors;
    bool tied;                    /* no output.weight: lm_head is the embedding (tie_word_embeddings) */
    hp_model *model;              /* the parameter table of the folder convert writes (meta: no weights) */
    hp_arena arena;
} hp_gguf_model;

/* Maps f's tensors and metadata to transformers' for a folder whose weights are of dtype (BF16 or F32). Every
 * tensor must be one the family's table names, of a type hp_gguf_read_f32 converts, with the shape the metadata
 * implies; every expected tensor must be there (output.weight may be absent: tied). HP_ERR_INPUT names the GGUF
 * key or tensor otherwise. */
hp_status hp_gguf_model_map(hp_gguf_model **out, const hp_gguf_file *f, hp_dtype dtype, hp_err *err);
void hp_gguf_model_free(hp_gguf_model *m);

/* The tokenizer of f as Hugging Face tokenizers' tokenizer.json and transformers' tokenizer_config.json
 * (malloc'd texts): vocabulary and merges from tokenizer.ggml.tokens / merges, special tokens from
 * tokenizer.ggml.token_type (CONTROL: special, USER_DEFINED: added), the pre-tokenizer from tokenizer.ggml.pre,
 * bos / eos / unk / pad and the chat template (tokenizer.chat_template). HP_ERR_INPUT for a tokenizer model or
 * pre-tokenizer it does not know, merges naming tokens that are not in the vocabulary, duplicate tokens. */
hp_status hp_gguf_tokenizer(const hp_gguf_file *f, char **tokenizer_json, char **tokenizer_config_json,
                            hp_err *err);

typedef struct hp_convert_opts {
    const char *out;  /* the folder to create: absent or empty */
    hp_dtype dtype;   /* HP_DT_BF16 (hp_convert_opts_default) or HP_DT_F32 */
    int threads;      /* tensors written in parallel (0: one per core, at most 8) */
    bool force;       /* replace an earlier `hyperpar convert` output folder (only that: hyperpar/outdir.h) */
} hp_convert_opts;

void hp_convert_opts_default(hp_convert_opts *o);

/* What hp_convert_gguf wrote. */
typedef struct hp_convert_stats {
    size_t n_tensors;
    uint64_t bytes;   /* model.safetensors */
    bool tied;
} hp_convert_stats;

/* Writes o->out/{config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json}
 * from the GGUF file at path. The folder appears whole or not at all (a temporary folder beside it, renamed at
 * the end; hyperpar/outdir.h): an --out that exists and is not empty is HP_ERR_INPUT (with force, unless it is an
 * earlier convert output), and a failure or a signal (hp_interrupt) leaves nothing. stats may be NULL. */
hp_status hp_convert_gguf(const char *path, const hp_convert_opts *o, hp_convert_stats *stats, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
