/*
 * hyperpar/trainckpt.h — the checkpoints `hyperpar train --save-every K --out RUN` writes, and their merge into a
 * Hugging Face folder (docs/train.md, "Checkpoints and resume").
 *
 *   RUN/step-<t>/  .hyperpar-output      the output folder's marker (hyperpar/outdir.h: the folder appears whole)
 *                  config.json           the model's, "torch_dtype": "float32"
 *                  model.safetensors     every parameter after step t: the trained ones F32 (the masters)
 *                  rank-<r>.safetensors  rank r's training state (hp_runner_save_train_meta), r < world; metadata
 *                                        "rank": r, "checkpoint_step": t, "world": N, "run_id", and
 *                                        "step" (AdamW's steps taken: a skipped step takes none), "zero"
 *                  state.json            {"format": "hyperpar-train-checkpoint", "step": t, "world": N,
 *                                         "run_id": "<16 hex digits>", "files": [every file above but the marker],
 *                                         "sums": {"<file>": {"bytes": B, "xxh64": "<16 hex digits>"}, ...},
 *                                         "model_config": {the model's config.json, torch_dtype/dtype removed},
 *                                         "command": "hyperpar train ...", "mesh": "dp=2,cp=1,tp=1 (world 2)",
 *                                         "flags": {...; "data": {"bytes", "xxh64", "dtype"}: the data file's
 *                                         identity, not its path}}
 *
 * A checkpoint is complete when its state.json reads as above and every file it names is a regular file in the
 * folder; `RUN/step-<t>.tmp.<pid>` (a save in progress, or a dead run's) is never one. It is bound when state.json
 * names the run (run_id: random, made at the run's start, kept across resumes), each file has the size state.json
 * records, every rank file's metadata says its own rank, the step, the world and the run (and AdamW's step is at
 * most the checkpoint's), and a step-<t> folder's t is the step; hp_train_ckpt_verify adds the hash of the bytes.
 * A run folder holds the checkpoints of one run.
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
/* HP_OK when dir is a complete and bound checkpoint (above), with its step; HP_ERR_INPUT naming what is missing or
 * wrong otherwise ("<dir>: rank-1.safetensors, which state.json names, is missing; the checkpoint is incomplete",
 * "<dir>: rank-1.safetensors says step 2 where this checkpoint (state.json: step 4 ...) needs 4; ..."). Reads
 * sizes and headers, not the bytes. */
hp_status hp_train_ckpt_check(const char *dir, int64_t *step, hp_err *err);
/* The checkpoint path means: path itself when it holds state.json (which must be complete and bound), else path
 * as a run folder: its complete step-<t> with the highest t (incomplete ones and temporaries skipped), which must
 * be bound. Into out (cap bytes). HP_ERR_INPUT when there is none, or when the run folder's complete checkpoints
 * are of two runs, naming `label` ("--resume", "merge"). */
hp_status hp_train_ckpt_find(const char *label, const char *path, char *out, size_t cap, hp_err *err);
/* Compares file `name` of checkpoint dir, every byte of it, with state.json's record (size and XXH64); _all: every
 * file state.json names. HP_ERR_INPUT naming the file and both hashes. */
hp_status hp_train_ckpt_verify(const char *dir, const char *name, hp_err *err);
hp_status hp_train_ckpt_verify_all(const char *dir, hp_err *err);
/* The run id state.json of dir records (16 hex digits and a NUL: cap >= 17). */
hp_status hp_train_ckpt_run_id(const char *dir, char *out, size_t cap, hp_err *err);

/* What state.json records besides the files. */
typedef struct hp_train_ckpt_meta {
    const char *run_id;     /* 16 lowercase hex digits */
    const char *flags_json; /* the run's flags, a JSON object's text */
    const char *model_json; /* the model's config (hp_train_model_config), a JSON object's text; NULL: {} */
    const char *command;    /* the command line that saved it (NULL: not recorded) */
    const char *mesh;       /* its mesh (hp_mesh_str), what a refused resume prints with it (NULL: not recorded) */
} hp_train_ckpt_meta;
/* Writes dir/state.json for step and world ranks atomically, with the size and XXH64 of config.json,
 * model.safetensors and every rank-<r>.safetensors, which must be in dir already (state.json is the last file). */
hp_status hp_train_ckpt_write_state(const char *dir, int64_t step, int world, const hp_train_ckpt_meta *meta,
                                    hp_err *err);
/* A config.json's object without its "torch_dtype" and "dtype" (how the weights are stored, not the model), as
 * compact JSON with sorted keys, malloc'd into *out: what a checkpoint records of its model. */
hp_status hp_train_model_config(const char *config_path, char **out, hp_err *err);
/* The size and XXH64 (seed 0) of a file's bytes, read through once. */
hp_status hp_train_file_sum(const char *path, uint64_t *bytes, uint64_t *xxh64, hp_err *err);

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
 * (a step-<t> folder or a run folder: hp_train_ckpt_find, bound, and every file's bytes verified against
 * state.json: hp_train_ckpt_verify_all), through the output folder (whole or not at all). The same checkpoint
 * gives the same bytes. *step_out (may be NULL): the checkpoint's step. */
hp_status hp_train_ckpt_merge(const char *ckpt, const char *out, const hp_train_merge_opts *opts, int64_t *step_out,
                              hp_err *err);

#ifdef __cplusplus
}
#endif
#endif
