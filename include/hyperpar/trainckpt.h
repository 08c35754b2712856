/*
 * hyperpar/trainckpt.h — the checkpoints `hyperpar train --save-every K --out RUN` writes, and their merge into a
 * Hugging Face folder (docs/train.md, "Checkpoints and resume").
 *
 *   RUN/step-<t>/  .hyperpar-output      the output folder's marker (hyperpar/outdir.h: the folder appears whole)
 *                  config.json           the model's, "torch_dtype": "float32"
 *                  model.safetensors     every parameter after step t: the trained ones F32 (the masters)
 *                  rank-<r>.safetensors  rank r's training state (hp_runner_save_train), r < world
 *                  state.json            {"format": "hyperpar-train-checkpoint", "step": t, "world": N,
 *                                         "files": [every file above but the marker], "flags": {...}}
 *
 * A checkpoint is complete when its state.json reads as above and every file it names is a regular file in the
 * folder; `RUN/step-<t>.tmp.<pid>` (a save in progress, or a dead run's) is never one.
 */
#ifndef HYPERPAR_TRAINCKPT_H
#define HYPERPAR_TRAINCKPT_H

#include "hyperpar/core.h"
#include "hyperpar/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_TRAIN_CKPT_FORMAT "hyperpar-train-checkpoint"

/* Whether dir is a training checkpoint (it holds state.json, complete or not) or a run folder (it holds a
 * step-<t> entry), as opposed to a shard folder. */
bool hp_train_ckpt_is(const char *dir);
/* HP_OK when dir is a complete checkpoint (above), with its step; HP_ERR_INPUT naming what is missing or wrong
 * otherwise ("<dir>: rank-1.safetensors, which state.json names, is missing; the checkpoint is incomplete"). */
hp_status hp_train_ckpt_check(const char *dir, int64_t *step, hp_err *err);
/* The checkpoint path means: path itself when it holds state.json (which must be complete), else path as a run
 * folder: its complete step-<t> with the highest t (incomplete ones and temporaries skipped). Into out (cap
 * bytes). HP_ERR_INPUT when there is none, naming `label` ("--resume", "merge"). */
hp_status hp_train_ckpt_find(const char *label, const char *path, char *out, size_t cap, hp_err *err);
/* Writes dir/state.json for step, world ranks and the run's flags (flags_json, a JSON object's text) atomically. */
hp_status hp_train_ckpt_write_state(const char *dir, int64_t step, int world, const char *flags_json, hp_err *err);

/* A config.json's text (a JSON object) with its top-level "torch_dtype" and "dtype" values set to
 * "<torch_dtype>" (e.g. "float32"), or "torch_dtype" added first when it has neither; the rest byte for byte.
 * malloc'd into *out. HP_ERR_INPUT naming label when text is not a JSON object. */
hp_status hp_config_set_dtype(const char *label, const char *text, size_t n, const char *torch_dtype, char **out,
                              hp_err *err);

typedef struct hp_train_merge_opts {
    hp_dtype dtype; /* HP_DT_F32 (0 means it: the masters as trained) or HP_DT_BF16 (rounded to nearest even) */
    bool force;     /* replace an earlier hyperpar output in out */
} hp_train_merge_opts;

/* Writes out (a Hugging Face folder: config.json with the dtype's torch_dtype, model.safetensors with every
 * tensor of the checkpoint in its order, floating ones in opts->dtype, others as stored) from checkpoint ckpt
 * (a step-<t> folder or a run folder: hp_train_ckpt_find), through the output folder (whole or not at all). The
 * same checkpoint gives the same bytes. *step_out (may be NULL): the checkpoint's step. */
hp_status hp_train_ckpt_merge(const char *ckpt, const char *out, const hp_train_merge_opts *opts, int64_t *step_out,
                              hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
