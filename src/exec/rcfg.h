/*
 * exec/rcfg.h — the family's forward semantics from config.json (rcfg.c): norm eps, rotary parameters, sliding
 * windows, read once from the model's parse and the family table. Pure: the program, the runtime and cost read it.
 */
#ifndef HP_EXEC_RCFG_H
#define HP_EXEC_RCFG_H

#include "hyperpar/model.h"

typedef enum { HP__ROPE_DEFAULT, HP__ROPE_LINEAR, HP__ROPE_LLAMA3, HP__ROPE_YARN } hp__rope_type;

typedef struct hp__rcfg {
    int64_t H, L, nh, nkv, hd, V, I;
    double eps;
    hp__rope_type rope;
    double theta, factor, low, high, partial, attn_scale;
    double beta_fast, beta_slow; /* yarn */
    double mscale_all_dim;       /* yarn: DeepSeek's softmax scale factor m² (0: none) */
    bool interleave;             /* rope on adjacent pairs (DeepSeek rope_interleave, default true there) */
    bool truncate;               /* yarn: floor/ceil the correction range (default true) */
    int64_t orig_max;
    int64_t rot;     /* rotary channels per head (hd · partial_rotary_factor, even) */
    int64_t *window; /* [L]: sliding window W (keys j > q - W), 0 = none */
} hp__rcfg;

/* From the model's one parse of config.json (m->cfg.fwd) and its family's facts (family table); label names
 * the config.json in messages (NULL: the model's path). HP_ERR_INPUT for what the runtime cannot run. */
hp_status hp__rcfg_read(const hp_model *m, const char *label, hp__rcfg *c, hp_err *err);
void hp__rcfg_free(hp__rcfg *c);
/* cos/sin [n, rot/2] for positions pos0..pos0+n-1 (f32 as transformers computes them, times attn_scale). */
hp_status hp__rope_table(const hp__rcfg *c, int64_t pos0, int64_t n, float **cos_out, float **sin_out, hp_err *err);

/* HP_OK when the runtime runs this model's family (the family table's `runs`: the ten decoder families of
 * docs/run.md); else HP_ERR_INPUT naming the model, its family and the families that run. */
hp_status hp__run_family_check(const hp_model *m, hp_err *err);

/* MLA's softmax scale: qk_head_dim^-½, times m² with yarn's mscale_all_dim (yarn_apply_mscale). */
double hp__mla_scale(const hp__rcfg *c, int64_t qk);

#endif
