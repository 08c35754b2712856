/*
 * trainer.h (internal) — the trainer's state and the functions its files share (hyperpar/train.h).
 *
 *   trainer.c  the phases: open (checks, model, plan, data headers), prepare, close; events
 *   batches.c  the data: micro-batches, --eval-data's batches, the scan of every token, evaluation, memory
 *   loop.c     the steps (hp_train_run), the log's lines, the GEMM limit, hp_train_write
 *   ckpt.c     checkpoints: the flags they record, save, read back for --resume, the run folder, binding
 *   log.c      --log-json: a new log, or a resumed run's own, checked and continued
 *   write.c    what rank 0 writes: the model folder (config.json, model.safetensors), --grad-out
 */
#ifndef HP_TRAIN_TRAINER_H
#define HP_TRAIN_TRAINER_H

#include <limits.h>
#include <stdio.h>

#include "hyperpar/outdir.h"
#include "hyperpar/train.h"

/* What rank 0 gathers: a list of whole tensors (hp_runner_gather_params' callback hp__trn_keep). */
typedef struct hp__trn_tensor {
    char *name;
    float *data;
    int n_dims;
    int64_t shape[HP_MAX_DIMS];
} hp__trn_tensor;
typedef struct hp__trn_list {
    int n, cap;
    hp__trn_tensor *e;
} hp__trn_list;

/* --log-json of a resumed run: the lines of steps 1..n kept, and their figures (--plot draws them). */
typedef struct hp__trn_log_prev {
    char *kept;       /* the kept lines' text */
    size_t kept_len;
    int64_t n;        /* steps 1..n */
    double *loss, *norm, *eval; /* [n]; eval NaN where not evaluated */
} hp__trn_log_prev;

struct hp_trainer {
    hp_train_config c;          /* the caller's config (its strings borrowed) */
    const hp_comm *w;
    bool root;
    int world;
    hp_train_opts to;           /* c.opt, to.lr the current step's */
    hp_lr_schedule sched;       /* c.sched with lr and steps */
    int64_t save_every;         /* c.save_every, or steps for a resume into its run folder */
    int64_t last, k0;           /* the steps this run takes: k0 + 1 .. last */
    const char *inputs[8];      /* what no output may be: input, overrides, plan, model, data, eval_data, text,
                                   tokenizer */
    hp_model *m;
    hp_plan *p;
    hp_runner *r;
    bool shard;                 /* MODEL is a shard folder */
    hp_outdir *of;              /* --out without --save-every */
    hp_data *data, *eval;
    int64_t *ids, *eval_ids;    /* [mb or B, S], [eval_rows, S] */
    uint8_t *mask, *eval_mask;  /* a masked source's (--loss-mask): the same rows' masks, else NULL */
    int64_t B, S, mb;           /* rows a micro-batch, ids a row; mb: windows of one micro-step (MB x dp) */
    int64_t eval_rows;          /* the largest --eval-data batch */
    hp_pp_sched pp_sched;       /* a pipeline's schedule (c.pp_sched, or the pipeline's default) */
    float *losses;              /* [steps] */
    hp__trn_list grads, params; /* rank 0: the first step's gradients; the parameters for --out */
    FILE *log;                  /* rank 0's --log-json */
    hp__trn_log_prev prev;
    char ckpt[PATH_MAX + 64];   /* the checkpoint --resume means */
    char run_id[17];            /* the run's id (bind): made at its start, or the resumed checkpoint's */
    char data_sum[17];          /* the XXH64 of --data's (--input's) bytes, and their count: the data's identity */
    uint64_t data_bytes;
    char *model_config;         /* the model's config as checkpoints record it (hp_train_model_config) */
    char mesh[160];             /* the plan's mesh, what a checkpoint records */
    double flop_step, limit;    /* model FLOPs per step; the GEMM limit, FLOP/s over all ranks */
    char rm[7][PATH_MAX + 200]; /* hp_train_temporaries */
    hp_train_info info;
};

/* ---- trainer.c ---- */
/* "train: ..."-less sentences to the caller: a note (rank 0 calls it) and a warning (every rank). */
void hp__trn_note(hp_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hp__trn_warn(hp_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hp__trn_event(hp_trainer *t, const hp_train_event *ev);
/* The last step this run takes: stop_after, else steps. */
int64_t hp__trn_last_step(const hp_trainer *t);
extern const char *const hp__trn_out_names[];
extern const char *const hp__trn_ckpt_names[];

/* ---- batches.c ---- */
int64_t hp__trn_eval_batch(int64_t W, int64_t w0, int64_t gb);
int64_t hp__trn_eval_batch_max(int64_t W, int64_t gb);
hp_status hp__trn_open_data(hp_trainer *t, hp_err *err);
hp_status hp__trn_same_text(hp_trainer *t, hp_err *err);
hp_status hp__trn_batch(hp_trainer *t, int64_t k, int64_t n_micro, int64_t *scored, int64_t *n_scored, hp_err *err);
hp_status hp__trn_scan_data(hp_trainer *t, hp_err *err);
hp_status hp__trn_evaluate(hp_trainer *t, double *mean, hp_err *err);
hp_status hp__trn_memory_check(hp_trainer *t, int local_ranks, hp_err *err);

/* ---- ckpt.c ---- */
hp_status hp__trn_bind_start(hp_trainer *t, hp_err *err);
hp_status hp__trn_resume(hp_trainer *t, hp_err *err);
hp_status hp__trn_check_checkpoint_out(hp_trainer *t, hp_err *err);
hp_status hp__trn_save_checkpoint(hp_trainer *t, int64_t step, hp_err *err);

/* ---- log.c ---- */
hp_status hp__trn_log_check(hp_trainer *t, hp_err *err);
hp_status hp__trn_log_open(hp_trainer *t, hp_err *err);
void hp__trn_log_prev_free(hp__trn_log_prev *l);

/* ---- write.c ---- */
hp_status hp__trn_keep(void *ctx, const char *name, const float *data, const int64_t *shape, int n_dims, hp_err *err);
void hp__trn_list_free(hp__trn_list *l);
hp_status hp__trn_write_folder(hp_trainer *t, const hp__trn_list *p, hp_outdir *of, const char *dir, hp_err *err);
hp_status hp__trn_write_grads(const char *path, const hp__trn_list *g, const float *loss, int64_t steps, hp_err *err);

#endif
