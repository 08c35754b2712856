/*
 * hyperpar/train.h — the library trainer behind `hyperpar train` (docs/train.md, "The library trainer"): N
 * training steps of a model across the ranks of a communicator, as its plan says, on one batch (input) or on the
 * global batches of a token file (data) or of a text tokenized on every rank (text, optionally with the assistant
 * loss mask), with the learning-rate schedule, evaluation, a log, checkpoints and resume.
 *
 *   hp_train_config_default(&c); c.model = ...;   the caller's options (the CLI fills them from its flags)
 *   hp_train_open(&t, world, &c)                   checks, the model, the plan, the data (headers)   collective
 *   hp_train_prepare(t, local_ranks)               memory, the runner, resume, the data's tokens,     collective
 *                                                  the run folder and the log
 *   hp_train_info(t)                               what the run will do (k0, last, the log's steps)
 *   hp_train_run(t)                                steps k0 + 1 .. last: events, log lines,          collective
 *                                                  evaluations, checkpoints
 *   hp_train_write(t)                              --out's folder and --grad-out's file (rank 0)     collective
 *   hp_train_end(t)                                closes the log (its write error)
 *   hp_train_close(t)
 *
 * Every phase returns the status every rank agreed on (hp_comm_agree), so a failure on one rank ends every rank
 * at the same phase; after a failure only hp_train_close is called. The library prints nothing and reads no
 * environment variable: what a user should see comes through the caller's event callback (rank 0; warnings on
 * every rank), signals are the caller's (its hooks), and the plan is the caller's (its callback) or derived.
 *
 * Invariants kept from the CLI's history (tests/cli/test_train*.sh): nothing is created before every check
 * passed (the run folder and the log are made at the end of prepare); a checkpoint appears whole or not at all;
 * a resumed run equals the uninterrupted one bit for bit (same flags, model config and data bytes, checked
 * against the checkpoint's state.json).
 */
#ifndef HYPERPAR_TRAIN_H
#define HYPERPAR_TRAIN_H

#include "hyperpar/comm.h"
#include "hyperpar/core.h"
#include "hyperpar/cost.h"
#include "hyperpar/data.h"
#include "hyperpar/linalg.h"
#include "hyperpar/model.h"
#include "hyperpar/plan.h"
#include "hyperpar/run.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_train_event_kind {
    HP_TRAIN_EV_NOTE,     /* rank 0: a sentence about the run in text ("resumed from RUN/step-4 at step 4") */
    HP_TRAIN_EV_WARNING,  /* every rank alike (print it once): an option that changes nothing, in text */
    HP_TRAIN_EV_LIMIT,    /* rank 0, before step k0 + 1: the model FLOPs of a step and the same-run GEMM limit */
    HP_TRAIN_EV_STEP,     /* rank 0: step `step` was taken (or skipped), before its evaluation */
    HP_TRAIN_EV_EVAL,     /* rank 0: step `step`'s evaluation of eval_data */
    HP_TRAIN_EV_STEP_END, /* rank 0: step `step` is done (its log line and checkpoint too) */
} hp_train_event_kind;

typedef struct hp_train_event {
    hp_train_event_kind kind;
    const char *text;     /* NOTE, WARNING: one sentence, without a prefix or a newline */
    int64_t step;         /* STEP, EVAL, STEP_END: the run's step t, 1-based */
    double loss;          /* STEP: the step's loss (the mean over its scored positions); EVAL: the eval loss */
    double grad_norm;     /* STEP: the global gradient norm, before clipping */
    double lr;            /* STEP: the step's learning rate */
    double tokens;        /* STEP: scored positions of the step; LIMIT: positions one step forwards */
    double seconds;       /* STEP: the step's wall time (its micro-batches and the update) */
    double mfu;           /* STEP: its own MFU (flop_step / seconds / limit; 0 when unknown) */
    bool skipped;         /* STEP: not finite, skipped (hp_train_opts.skip_nonfinite) */
    bool clipped;         /* STEP: grad_norm above hp_train_opts.clip */
    bool evaluates;       /* STEP: an evaluation follows */
    int64_t windows;      /* EVAL: the windows evaluated */
    double flop_step;     /* LIMIT: model FLOPs of a step (hp_cost_train_flops) */
    double weights;       /* LIMIT: weights one token goes through (hp_cost_gemm_weights) */
    const hp_gemm_limit *limit; /* LIMIT: the measured limit (sum_gflops over the ranks) */
} hp_train_event;

typedef void (*hp_train_event_fn)(void *ctx, const hp_train_event *ev);
/* The plan to train m with (m opened by the library from cfg->model; shard_dir: MODEL when it is a shard folder,
 * else NULL), for `world` ranks. *p is the library's to free. May print nothing (the failure is agreed). */
typedef hp_status (*hp_train_plan_fn)(void *ctx, hp_model *m, const char *shard_dir, int world, hp_plan **p,
                                      hp_err *err);

/* The default GEMM limit MFU is measured against: 512³ (268 MFLOP, 3 MiB of f32 operands per rank) takes a few ms
 * a product at tens to hundreds of GFLOP/s, so measuring it costs a training run a fraction of a second; best of
 * 10 because a short product is easily disturbed on a shared machine. */
#define HP_TRAIN_GEMM_N 512
#define HP_TRAIN_GEMM_REPS 10

typedef struct hp_train_config {
    /* ---- what is trained, on what ---- */
    const char *model;      /* MODEL: a checkpoint folder, or a shard folder written for the mesh */
    const char *input;      /* --input: safetensors input_ids [B, S], the batch of every step; or NULL */
    const char *data;       /* --data: a token file (hyperpar/data.h), global batch k for step k + 1; or NULL */
    const char *text;       /* --text: a text file (or .jsonl of documents) tokenized with `tokenizer` into the
                               token stream data would be (hyperpar/data.h, hp_data_text); or NULL */
    const char *tokenizer;  /* with text: a tokenizer.json or its folder (NULL: the model's folder) */
    bool loss_mask;         /* with text: a .jsonl of conversations, only the assistant's tokens count in the loss */
    const char *eval_data;  /* --eval-data: a held-out token file (with text: a text file, read as text is), its
                               mean loss every eval_every steps; or NULL */
    hp_data_dtype dtype;    /* a stream's token type (--data-dtype) */
    hp_data_order order;    /* the windows' order; order.global_batch = global_batch */
    int64_t seq;            /* --seq S: the window length */
    int64_t global_batch;   /* --global-batch GB: windows per step */
    int64_t micro_batch;    /* --micro-batch: rows per dp replica in one forward/backward; 0: GB/dp */
    int64_t eval_every;     /* --eval-every K (with eval_data) */
    /* ---- how ---- */
    int64_t steps;          /* N >= 1: the schedule runs over steps 1..N */
    int64_t stop_after;     /* 0, or the last step this run takes (<= steps) */
    hp_lr_schedule sched;   /* kind, warmup, min_lr (lr is opt.lr, steps is `steps`) */
    hp_train_opts opt;      /* AdamW, clip, ZeRO-1, skip_nonfinite; opt.lr the peak learning rate */
    hp_linalg_mode compute; /* exact or bf16 products */
    hp_pp_sched pp_sched;   /* --pp-schedule: a pipeline's schedule (with pp_sched_given; else the pipeline's
                               default, hp_pp_sched_default) */
    bool pp_sched_given;
    /* ---- outputs and checkpoints ---- */
    const char *out;        /* --out DIR: the trained model's folder, or with save_every the run folder; or NULL */
    int64_t save_every;     /* 0, or a checkpoint every K steps (and at the last) in out/step-<t> */
    const char *resume;     /* --resume: a checkpoint or a run folder to continue; or NULL */
    const char *grad_out;   /* --grad-out: the first step's gradients and every step's loss; or NULL */
    const char *log_json;   /* --log-json: one JSON object a step; or NULL */
    bool force;             /* replace an earlier output of train in out, and an existing log_json */
    const char *plot;       /* outputs the caller writes itself (--plot, --stats-json): checked only, never to */
    const char *stats_json; /* lie inside out (whose folder replaces what is there); or NULL */
    const char *plan_file;  /* --plan and --overrides as given: inputs no output may be (the plan itself comes */
    const char *overrides;  /* from the plan callback) */
    /* ---- what was given, for the warnings about options that change nothing ---- */
    bool sched_given, dtype_given, seed_given;
    const char *command;    /* the command line, recorded in checkpoints (NULL: "") */
    const char *test_nan_grad; /* hp_run_opts.test_nan_grad: the non-finite test's hook (NULL: off) */
    /* ---- the caller's hooks (each may be NULL) ---- */
    hp_train_plan_fn plan;          /* NULL: hp_plan_derive at its defaults, tp = world */
    hp_status (*check)(void *ctx, hp_err *err); /* the caller's own checks (its outputs), first, on every rank;
                                                   their failure is agreed with the library's */
    hp_train_event_fn on_event;
    void (*signals_catch)(void *ctx);   /* around each checkpoint's save, on every rank: from catch on a signal */
    void (*signals_release)(void *ctx); /* is recorded (hp_interrupt) so the save stops and cleans up; release
                                           then acts on it */
    void *ctx;                          /* given to every hook */
} hp_train_config;

/* steps 1, AdamW at PyTorch's defaults (hp_train_opts_default), cosine, seeded order, exact compute; the rest
 * zero. */
void hp_train_config_default(hp_train_config *c);

typedef struct hp_trainer hp_trainer;

/* What the run will do, known after hp_train_prepare; its pointers are the trainer's, valid until hp_train_close. */
typedef struct hp_train_info {
    int64_t k0;            /* steps already taken: the resumed checkpoint's step (0 for a new run) */
    int64_t last;          /* the last step this run takes (stop_after, else steps) */
    int64_t save_every;    /* as the run saves (a resume into its own run folder without it: steps) */
    int64_t n_logged;      /* of steps 1..k0, those the resumed run's log_json records (read back, rank 0) */
    const double *logged_loss, *logged_norm, *logged_eval; /* [n_logged]; eval NaN where not evaluated */
    const char *model_path; /* the model as opened */
    const char *mesh;       /* the plan's mesh (hp_mesh_str) */
    const char *run_id;     /* 16 hex digits with checkpoints or resume, else "" */
    int64_t eval_windows;   /* eval_data's windows (0: none) */
} hp_train_info;

/* Checks the config, opens the model and the data (headers), takes the plan, and (every rank agreeing) emits the
 * warnings. On failure *out is NULL. Collective over world, which must outlive the trainer. */
hp_status hp_train_open(hp_trainer **out, const hp_comm *world, const hp_train_config *cfg, hp_err *err);
/* Refuses a batch this node cannot hold (local_ranks: the ranks on this node, <= 0: 1), creates the runner,
 * binds the run (its id and data identity) and resumes it, reads every token the run will read, and only then
 * creates the run folder and the log. Collective. */
hp_status hp_train_prepare(hp_trainer *t, int local_ranks, hp_err *err);
const hp_train_info *hp_train_info_of(const hp_trainer *t);
/* The runner (for statistics), after prepare. */
hp_runner *hp_train_runner(hp_trainer *t);
/* Measures the GEMM limit, then takes steps k0 + 1 .. last: per step the micro-batches and the update, the
 * events, the evaluation, the log line, the first step's gradients (grad_out) and the checkpoint. Collective. */
hp_status hp_train_run(hp_trainer *t, hp_err *err);
/* The names rank 0's hp_train_write may leave half-written if killed (the writers' temporaries, then the output
 * folder's): paths[0..n) (at most cap, owned by t), for a signal handler to remove. 0 on other ranks. */
int hp_train_temporaries(hp_trainer *t, const char **paths, int cap);
/* out (without save_every): the trained model's folder, atomically; grad_out. Collective. */
hp_status hp_train_write(hp_trainer *t, hp_err *err);
/* Closes log_json; HP_ERR_IO when its last writes failed. */
hp_status hp_train_end(hp_trainer *t, hp_err *err);
/* Frees everything (an output folder not committed is removed). NULL is fine. */
void hp_train_close(hp_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
