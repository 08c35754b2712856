/*
 * hyperpar/gen.h — tiny random checkpoints of any supported family (config.json + model.safetensors).
 *
 * Values are a pure function of (seed, logical weight, element index): an expert's gate, up and down
 * matrices get the same numbers whether they are written per expert or stacked into the batched
 * gate_up_proj / down_proj tensors, so a per-expert and a batched checkpoint of one seed hold the same model.
 */
#ifndef HYPERPAR_GEN_H
#define HYPERPAR_GEN_H

#include "hyperpar/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_gen_opts {
    const char *family;          /* model_type, e.g. "qwen3_moe" */
    int64_t layers;              /* num_hidden_layers (2) */
    int64_t hidden;              /* hidden_size (64) */
    int64_t heads, kv_heads, head_dim; /* 4, 2, 16 */
    int64_t intermediate;        /* dense MLP width (128); Mixtral / gpt-oss experts use it too (96 / 48) */
    int64_t moe_intermediate;    /* expert width (32) */
    int64_t experts, top_k;      /* 8, 2 */
    int64_t vocab;               /* 128 */
    hp_dtype dtype;              /* F32 or BF16 (F32) */
    hp_expert_layout layout;     /* per-expert (default) or batched */
    uint64_t seed;               /* 0 */
    bool force;                  /* overwrite a non-empty output folder */
} hp_gen_opts;

/* Ranges gen accepts (the CLI --help prints them from here): every size 1..HP_GEN_MAX_DIM, experts
 * 1..HP_GEN_MAX_EXPERTS (a generated per-expert model stores 3 tensors per expert and layer), top-k 1..experts. */
#define HP_GEN_MAX_DIM 65536
#define HP_GEN_MAX_EXPERTS 4096
/* At most this many tensors (checked before anything is built): safetensors headers are limited to 100 MB,
 * about 100 bytes per tensor entry. */
#define HP_GEN_MAX_TENSORS (1 << 20)

void hp_gen_opts_default(hp_gen_opts *o);

/* The expert layout gen writes for o: o->layout, except for families that only have the batched one
 * (gpt-oss). */
hp_expert_layout hp_gen_layout(const hp_gen_opts *o);

/* Writes out_dir/config.json and out_dir/model.safetensors (each atomically). out_dir must name a folder:
 * "", ".", ".." or a path ending in "/." or "/.." is HP_ERR_INPUT; so are options whose products of sizes
 * overflow, exceed HP_GEN_MAX_TENSORS tensors or do not fit in out_dir's free space (checked before writing).
 * Temporaries "<file>.tmp.<pid>" that a killed gen left in out_dir (the PID no longer runs, the file carries
 * gen's marker) are removed first. A signal recorded by hp_interrupt stops the write: the temporary goes (and
 * out_dir when this call created it), and the call fails with HP_ERR_IO "interrupted". */
hp_status hp_gen_checkpoint(const hp_gen_opts *o, const char *out_dir, hp_err *err);

/* The config.json text gen would write (malloc'd, NUL-terminated). */
hp_status hp_gen_config_text(const hp_gen_opts *o, char **out, hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
