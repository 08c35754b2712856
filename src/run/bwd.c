/*
 * bwd.c — the backward pass (docs/train.md): the program's steps walked in reverse through the op record's bwd
 * entries (ops.c), each layer's forward first recomputed from its kept input through the runner's own forward
 * entries.
 *
 * Gradients carry layouts like activations. The gradient of an activation laid out L is held in L with every
 * P read as R (the gradient of a partial sum is the whole sum's, on every rank); a computation's backward may
 * give its input's gradient as a partial sum (P on tp when tp cuts the module's heads or width; P on cp for
 * K and V, which every cp rank's queries read). Each forward transition F -> T then has one dual: the gradient
 * moves from T's gradient layout to F's by the same lowering table (S(d)->R all-gather becomes a slice or,
 * from a partial sum, a reduce-scatter; P->R all-reduce becomes the identity; P->S(d) reduce-scatter becomes an
 * all-gather; R->S(d) a slice becomes an all-gather). Nothing is decided per module.
 *
 * Memory: each layer's input is kept by the forward (keep_activations); its backward recomputes the layer's
 * forward from it and keeps, per step, what a later step of the layer would overwrite (recompute): the values a
 * step's backward reads are its forward's, whatever the layer's shape.
 */
#include "kernels/backward.h"
#include "kernels/modules.h"
#include "run/train_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- gradients and their layouts ---- */

/* The layout a gradient of an activation laid out l is held in: P read as R. */
static hp__lay glay(hp__lay l)
{
    for (int ax = 0; ax < HP__NAX; ax++)
        if (l.ax[ax].kind == HP_PL_P) l.ax[ax] = hp_pl_r();
    return l;
}

/* The dual of a forward transition into `to`: the gradient g, held as `from` (P: a partial sum), moved to the
 * gradient layout of the forward's source `to` by the lowering table. */
static hp_status dual(hp_runner *r, hp__act *g, hp__lay from, const hp__lay *to, const char *what, hp_err *err)
{
    g->lay = from; /* P and R hold the same block: only the meaning changes */
    hp__act_shape(&r->x, g);
    hp__lay want = glay(*to);
    const char *coll;
    return hp__redistribute(&r->x, g, &want, what, &coll, err);
}

/* An activation like a (global dims, layout), contents undefined. */
static hp_status like(hp_runner *r, hp__act *dst, const hp__act *a, int64_t X, hp__lay lay, hp_err *err)
{
    return hp__act_alloc(&r->x, dst, a->g[0], a->g[1], X, lay, err);
}

static void add_into(hp__act *dst, const hp__act *src)
{
    int64_t n = hp__act_count(dst);
    for (int64_t i = 0; i < n; i++) dst->d[i] += src->d[i];
}

/* The step's backward scratch blocks (hp__step_bwd_widths) for rows rows, reserved at its backward's start. */
static hp_status reserve(hp_runner *r, const hp__step *s, int64_t rows, float *f[HP__NBWD], hp_err *err)
{
    int64_t w[HP__NBWD];
    hp__step_bwd_widths(&r->g, s, r->x.pos.r[HP__TP], w);
    for (int k = 0; k < HP__NBWD; k++) {
        f[k] = NULL;
        if (w[k] > 0 && !(f[k] = hp__t_fbuf(r->train, k, rows * w[k], err))) return HP_ERR_NOMEM;
    }
    return HP_OK;
}

/* dx = dy·W and dW += dyᵀ·x, db += Σ dy, with dx added into acc (the sum over several projections of x): written
 * there when first, else through scratch [rows, K]. */
static hp_status lin_bwd_add(const hp_runner *r, float *scratch, int64_t rows, int64_t N, int64_t K, const float *dy,
                             int64_t ldy, const hp__w *W, float *gW, const hp__w *b, float *gb, const float *x,
                             float *acc, bool first, hp_err *err)
{
    float *dx = first ? acc : scratch;
    hp_status st = hp__linear_backward(r->o.compute, rows, N, K, dy, ldy, hp__t_w32(r, W), x, K, dx, K, gW,
                                       b && b->present ? gb : NULL, err);
    if (st != HP_OK) return st;
    if (!first)
        for (int64_t i = 0; i < rows * K; i++) acc[i] += dx[i];
    return HP_OK;
}

/* The normed input of a norm step: h moved to the layout the norm ran on (its entry, recomputed). */
static hp_status norm_input(hp_runner *r, const hp__step *s, const hp__act *h, hp__act *x, hp_err *err)
{
    hp_status st = hp__r_act_copy(r, x, h, err);
    return st == HP_OK ? hp__r_enter(r, s, x, err) : st;
}

/* A norm step's backward: dy (the gradient of its output, held as s->leave's gradient layout) becomes the
 * gradient of its input in the stream's layout, added into dh (add) or written there. */
static hp_status norm_bwd(hp_runner *r, const hp__step *s, norm_w *n, const hp__act *h, hp__act *dy, hp__act *dh,
                          bool add, hp_err *err)
{
    hp__train *t = r->train;
    char what[200];
    snprintf(what, sizeof what, "%s (backward of its exit)", s->c.fqn);
    hp_status st = dual(r, dy, glay(s->leave), &s->out, what, err);
    if (st == HP_OK) st = norm_input(r, s, h, &t->x, err);
    if (st != HP_OK) return st;
    int64_t rows = t->x.n[0] * t->x.n[1], H = r->g.cfg.H;
    hp__rmsnorm_backward(t->x.d, rows, H, n->w.d, r->g.cfg.eps, dy->d, dy->d, hp__t_grad(r, &n->w));
    snprintf(what, sizeof what, "%s (backward of its entry)", s->c.fqn);
    if ((st = dual(r, dy, s->run, &s->in, what, err)) != HP_OK) return st;
    if (add) add_into(dh, dy);
    else st = hp__r_act_copy(r, dh, dy, err);
    return st;
}

/* The attention core's backward shared by GQA and MLA: aa is the forward's call on the runner's K and V (q, k, v
 * set); dK and dV of every key this rank's queries saw come out in t->dk / t->dv, brought back to the keys' own
 * block by the reduce-scatter that is CP's K/V all-gather's dual. */
static hp_status attn_core_bwd(hp_runner *r, const hp__step *s, const hp__attn_args *aa, const hp__act *ta,
                               const float *d_o, float *dq, float *dsinks, hp_err *err)
{
    hp__train *t = r->train;
    const hp__act *K = &r->sc.k, *V = &r->sc.v;
    hp_status st = hp__act_alloc(&r->x, &t->dk, K->g[0], K->g[1], K->g[2], K->lay, err);
    if (st == HP_OK) st = hp__act_alloc(&r->x, &t->dv, V->g[0], V->g[1], V->g[2], V->lay, err);
    size_t sc = hp__attention_backward_scratch_bytes(aa, dsinks && aa->sinks); /* held while it runs */
    hp__mem_count(&r->x, 0, sc);
    if (st == HP_OK) st = hp__attention_backward(aa, d_o, dq, t->dk.d, t->dv.d, dsinks, err);
    hp__mem_count(&r->x, sc, 0);
    hp__lay kl = {{hp_pl_r(), ta->lay.ax[HP__CP]}};
    if (st != HP_OK || kl.ax[HP__CP].kind != HP_PL_S) return st;
    char what[200];
    snprintf(what, sizeof what, "%s (backward of the cp K/V all-gather)", s->c.fqn);
    hp__lay part = {{hp_pl_r(), hp_pl_p()}};
    if ((st = dual(r, &t->dk, part, &kl, what, err)) != HP_OK) return st;
    return dual(r, &t->dv, part, &kl, what, err);
}

/* Attention's backward (GQA): da the gradient of its output (G(out)), ta its input on the run layout; the
 * forward's q (after rope), output, K and V are in the runner's buffers (recomputed). dt receives the input's
 * gradient: a partial sum over tp when tp cuts the heads. */
static hp_status attn_bwd(hp_runner *r, const hp__step *s, attn_w *a, const hp__bio *bi, const hp__act *da,
                          hp__act *dt, hp_err *err)
{
    hp__train *t = r->train;
    const hp__rcfg *c = &r->g.cfg;
    int64_t Bl = bi->tin->n[0], sq = bi->tin->n[1], rows = Bl * sq, H = c->H, hd = c->hd, nh = a->nh, nkv = a->nkv;
    const hp__act *ta = bi->tin;
    const float *q = bi->buf[0], *o = bi->buf[1];
    hp__act *K = &r->sc.k, *V = &r->sc.v;
    float *f[HP__NBWD];
    hp_status st = reserve(r, s, rows, f, err);
    if (st != HP_OK) return st;
    float *d_o = f[0], *dq = f[1];
    /* o_proj */
    st = hp__linear_backward(r->o.compute, rows, H, nh * hd, da->d, H, hp__t_w32(r, &a->wo), o, nh * hd, d_o,
                                       nh * hd, hp__t_grad(r, &a->wo), a->bo.present ? hp__t_grad(r, &a->bo) : NULL, err);
    if (st != HP_OK) return st;
    /* the attention itself */
    hp__attn_args aa = {.B = Bl, .sq = sq, .sk = K->n[1], .nh = nh, .nkv = nkv, .hd = hd, .q = q, .k = K->d,
                        .v = V->d, .q_pos0 = ta->lo[1], .k_pos0 = K->lo[1], .window = c->window[s->layer],
                        .out = NULL, .sinks = a->sinks.present ? a->sinks.d : NULL, .mode = r->o.compute};
    st = attn_core_bwd(r, s, &aa, ta, d_o, dq, a->sinks.present ? hp__t_grad(r, &a->sinks) : NULL, err);
    if (st != HP_OK) return st;
    /* rope (the tables of these positions are the forward's, rebuilt by its recompute) */
    if ((st = hp__r_rope(r, ta->lo[1], sq, err)) != HP_OK) return st;
    for (int64_t b = 0; b < Bl; b++) {
        hp__rope_backward(dq + b * sq * nh * hd, sq, nh, hd, c->rot, r->sc.rope_cos, r->sc.rope_sin);
        hp__rope_backward(t->dk.d + b * sq * nkv * hd, sq, nkv, hd, c->rot, r->sc.rope_cos, r->sc.rope_sin);
    }
    /* q/k norms: their inputs are the projections, recomputed */
    if (a->qn.present || a->kn.present) {
        float *pre = f[2];
        if (a->qn.present) {
            if ((st = hp_linear_forward(a->q, 0, rows, ta->d, H, pre, nh * hd, false, err)) != HP_OK) return st;
            hp__rmsnorm_backward(pre, rows * nh, hd, a->qn.d, c->eps, dq, dq, hp__t_grad(r, &a->qn));
        }
        if (a->kn.present) {
            if ((st = hp_linear_forward(a->k, 0, rows, ta->d, H, pre, nkv * hd, false, err)) != HP_OK) return st;
            hp__rmsnorm_backward(pre, rows * nkv, hd, a->kn.d, c->eps, t->dk.d, t->dk.d, hp__t_grad(r, &a->kn));
        }
    }
    /* the projections: dt = dq·Wq + dk·Wk + dv·Wv */
    if ((st = like(r, dt, ta, H, (hp__lay){{s->split ? hp_pl_p() : hp_pl_r(), ta->lay.ax[HP__CP]}}, err)) != HP_OK)
        return st;
    st = lin_bwd_add(r, f[3], rows, nh * hd, H, dq, nh * hd, &a->wq, hp__t_grad(r, &a->wq), &a->bq, hp__t_grad(r, &a->bq), ta->d,
                     dt->d, true, err);
    if (st == HP_OK)
        st = lin_bwd_add(r, f[3], rows, nkv * hd, H, t->dk.d, nkv * hd, &a->wk, hp__t_grad(r, &a->wk), &a->bk,
                         hp__t_grad(r, &a->bk), ta->d, dt->d, false, err);
    if (st == HP_OK)
        st = lin_bwd_add(r, f[3], rows, nkv * hd, H, t->dv.d, nkv * hd, &a->wv, hp__t_grad(r, &a->wv), &a->bv,
                         hp__t_grad(r, &a->bv), ta->d, dt->d, false, err);
    return st;
}

/* DeepSeek-V3's latent attention backward (the forward is runner.c's mla_apply): da the gradient of its output,
 * ta its input on the run layout; q (after rope) in buffer 0, the attention output in buffer 1, K and V in
 * sc.k / sc.v, and the latent block (kv_a's output with k_rot rotated, q_a's normed output, the normed latent,
 * kv_b's output) kept in scratch 4. dt receives the input's gradient (a partial sum over tp when tp cuts the
 * heads; the latent projections' gradients are then partial too, and summed over tp). */
static hp_status mla_bwd(hp_runner *r, const hp__step *s, attn_w *a, const hp__bio *bi, const hp__act *da,
                         hp__act *dt, hp_err *err)
{
    hp__train *t = r->train;
    const hp__act *ta = bi->tin;
    const hp__rcfg *c = &r->g.cfg;
    int64_t Bl = ta->n[0], sq = ta->n[1], rows = Bl * sq, H = c->H, nh = a->nh;
    int64_t nope = a->nope, rope = a->rope, vd = a->vd, qk = nope + rope, kvl = a->kvl, lat = kvl + rope;
    int64_t qa_n = a->ql > 0 ? a->ql : 0;
    const float *q = bi->buf[0], *o = bi->buf[1], *tmp = bi->buf[2];
    const float *kva = tmp, *qa = kva + rows * lat, *ckv = qa + rows * qa_n;
    hp__act *K = &r->sc.k, *V = &r->sc.v;
    float *f[HP__NBWD];
    hp_status st = reserve(r, s, rows, f, err);
    if (st != HP_OK) return st;
    float *d_o = f[0], *dq = f[1], *dlat = f[2];
    float *dkva = dlat, *dqa = dkva + rows * lat, *dkv = dqa + rows * qa_n;
    st = hp__linear_backward(r->o.compute, rows, H, nh * vd, da->d, H, hp__t_w32(r, &a->wo), o, nh * vd, d_o,
                                       nh * vd, hp__t_grad(r, &a->wo), a->bo.present ? hp__t_grad(r, &a->bo) : NULL, err);
    if (st != HP_OK) return st;
    hp__attn_args aa = {.B = Bl, .sq = sq, .sk = K->n[1], .nh = nh, .nkv = nh, .hd = qk, .hdv = vd,
                        .scale = hp__mla_scale(c, qk), .q = q, .k = K->d, .v = V->d, .q_pos0 = ta->lo[1],
                        .k_pos0 = K->lo[1], .window = c->window[s->layer], .mode = r->o.compute};
    st = attn_core_bwd(r, s, &aa, ta, d_o, dq, NULL, err);
    if (st != HP_OK) return st;
    /* K = [k_nope | k_rot broadcast to every head], V: back into kv_b's output and kv_a's rope channels */
    memset(dkva, 0, (size_t)(rows * lat) * sizeof *dkva);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t h = 0; h < nh; h++) {
            const float *dk = t->dk.d + (i * nh + h) * qk;
            float *dst = dkv + (i * nh + h) * (nope + vd);
            memcpy(dst, dk, (size_t)nope * sizeof *dst);
            memcpy(dst + nope, t->dv.d + (i * nh + h) * vd, (size_t)vd * sizeof *dst);
            for (int64_t j = 0; j < rope; j++) dkva[i * lat + kvl + j] += dk[nope + j];
        }
    if ((st = hp__r_rope(r, ta->lo[1], sq, err)) != HP_OK) return st;
    hp__mla_rope(r, c->interleave, dkva + kvl, lat, dq, nh, qk, nope, rope, Bl, sq, true);
    /* kv_b, then the latent's norm (its input: kv_a's first kvl channels, as the forward left them) */
    float *dckv = f[3];
    st = hp__linear_backward(r->o.compute, rows, nh * (nope + vd), kvl, dkv, nh * (nope + vd), hp__t_w32(r, &a->wkvb), ckv,
                             kvl, dckv, kvl, hp__t_grad(r, &a->wkvb), NULL, err);
    if (st != HP_OK) return st;
    float *pre = f[5];
    for (int64_t i = 0; i < rows; i++) memcpy(pre + i * kvl, kva + i * lat, (size_t)kvl * sizeof *pre);
    hp__rmsnorm_backward(pre, rows, kvl, a->kvan.d, 1e-6, dckv, dckv, hp__t_grad(r, &a->kvan)); /* in place */
    for (int64_t i = 0; i < rows; i++) memcpy(dkva + i * lat, dckv + i * kvl, (size_t)kvl * sizeof *dkva);
    /* dt = dkva·W_kva + (q's path) */
    if ((st = like(r, dt, ta, H, (hp__lay){{s->split ? hp_pl_p() : hp_pl_r(), ta->lay.ax[HP__CP]}}, err)) != HP_OK)
        return st;
    st = lin_bwd_add(r, f[3], rows, lat, H, dkva, lat, &a->wkva, hp__t_grad(r, &a->wkva), NULL, NULL, ta->d, dt->d, true,
                     err);
    if (st != HP_OK || a->ql <= 0)
        return st == HP_OK ? lin_bwd_add(r, f[3], rows, nh * qk, H, dq, nh * qk, &a->wq, hp__t_grad(r, &a->wq), NULL, NULL,
                                         ta->d, dt->d, false, err)
                           : st;
    st = hp__linear_backward(r->o.compute, rows, nh * qk, a->ql, dq, nh * qk, hp__t_w32(r, &a->wq), qa, a->ql, dqa, a->ql,
                             hp__t_grad(r, &a->wq), NULL, err);
    if (st != HP_OK) return st;
    /* q_a's norm: its input recomputed */
    if ((st = hp_linear_forward(a->qa, 0, rows, ta->d, H, pre, a->ql, false, err)) != HP_OK) return st;
    hp__rmsnorm_backward(pre, rows, a->ql, a->qan.d, 1e-6, dqa, dqa, hp__t_grad(r, &a->qan));
    return lin_bwd_add(r, f[3], rows, a->ql, H, dqa, a->ql, &a->wqa, hp__t_grad(r, &a->wqa), NULL, NULL, ta->d, dt->d, false,
                       err);
}

/* The MLP's backward: tm its input on the run layout (the runner's t after the recompute), gate|up in buffer 2
 * and the hidden in buffer 3; dt receives the input's gradient (a partial sum over tp when tp cuts the width). */
static hp_status mlp_bwd(hp_runner *r, const hp__step *s, mlp_w *m, const hp__bio *bi, const hp__act *da,
                         hp__act *dt, hp_err *err)
{
    const hp__act *tm = bi->tin;
    int64_t rows = tm->n[0] * tm->n[1], H = r->g.cfg.H, I = m->I;
    const float *gu = bi->buf[2], *hid = bi->buf[3];
    float *f[HP__NBWD];
    hp_status st = reserve(r, s, rows, f, err);
    if (st != HP_OK) return st;
    float *dhid = f[0], *dgu = f[1];
    st = hp__linear_backward(r->o.compute, rows, H, I, da->d, H, hp__t_w32(r, &m->wd), hid, I, dhid, I,
                                       hp__t_grad(r, &m->wd), m->bd.present ? hp__t_grad(r, &m->bd) : NULL, err);
    if (st != HP_OK) return st;
    int64_t ld, up; /* gate|up's layout, as the forward wrote it (dgu takes the same) */
    hp__gu_layout(s->fused, rows, I, &ld, &up);
    hp__swiglu_backward(gu, ld, gu + up, ld, dhid, I, rows, I, dgu, ld, dgu + up, ld);
    st = like(r, dt, tm, H, (hp__lay){{s->split ? hp_pl_p() : hp_pl_r(), tm->lay.ax[HP__CP]}}, err);
    if (st != HP_OK) return st;
    if (s->fused)
        return lin_bwd_add(r, f[3], rows, 2 * I, H, dgu, 2 * I, &m->wgu, hp__t_grad(r, &m->wgu), &m->bgu, hp__t_grad(r, &m->bgu),
                           tm->d, dt->d, true, err);
    st = lin_bwd_add(r, f[3], rows, I, H, dgu, ld, &m->wg, hp__t_grad(r, &m->wg), &m->bg, hp__t_grad(r, &m->bg), tm->d, dt->d,
                     true, err);
    if (st == HP_OK)
        st = lin_bwd_add(r, f[3], rows, I, H, dgu + up, ld, &m->wu, hp__t_grad(r, &m->wu), &m->bu, hp__t_grad(r, &m->bu), tm->d,
                         dt->d, false, err);
    return st;
}

/* The MoE block's backward: the EP runtime's reverse of its last forward (recomputed on these rows). dt receives
 * the input's gradient on the block's rows: a partial sum over tp when tp cuts the experts. */
static hp_status moe_bwd(hp_runner *r, const hp__step *s, moe_w *m, const hp__bio *bi, const hp__act *da,
                         hp__act *dt, hp_err *err)
{
    const hp__act *tm = bi->tin;
    tmoe *b = hp__t_moe(r, s->layer);
    if (!b) return hp_err_set(err, HP_ERR_INPUT, "internal error: %s has no training state", s->c.fqn);
    hp__lay lay = tm->lay;
    if (m->tp_cut) lay.ax[HP__TP] = hp_pl_p();
    hp_status st = like(r, dt, tm, r->g.cfg.H, lay, err);
    size_t had = hp_moe_ep_backward_bytes(m->ep); /* its scratch, made by the layer's first backward and kept */
    if (st == HP_OK) st = hp_moe_ep_backward(m->ep, tm->d, tm->n[0] * tm->n[1], da->d, dt->d, b->g, err);
    hp__mem_count(&r->x, had, hp_moe_ep_backward_bytes(m->ep));
    return hp_comm_agree(r->x.world, st, err); /* the next collectives mix the EP groups */
}

/* A gradient for validate --backward's tape (named "<what> (gradient)"), the recompute's records being off. */
static hp_status grad_record(hp_runner *r, const char *what, const char *coll, hp__act *g, hp_err *err)
{
    char name[200];
    snprintf(name, sizeof name, "%s (gradient)", what);
    r->tr.quiet = false;
    hp_status st = hp__r_record(r, name, coll, g, err);
    r->tr.quiet = true;
    return st;
}

/* ---- the op record's backward entries (ops.c) ----
 *
 * The gradient state between steps: t->dh the stream's (G(stream)), t->da a module's output's, t->dt a module's
 * input's. Walking the program in reverse, each entry takes the gradient of its step's output and leaves its
 * input's, exactly the duals of the forward's transitions in reverse order. */

/* The loss: dz = (softmax − onehot) / scored positions on the logits' block, into t->da; a target the mask leaves
 * out (label −1) gets 0, as transformers' ignore_index. */
hp_status hp__bwd_loss(hp_runner *r, const hp__step *s, step_w *w, hp__bio *b, hp_err *err)
{
    (void)s, (void)w;
    hp__train *t = r->train;
    const hp__act *z = &r->sc.a;
    int64_t rows = z->n[0] * z->n[1], vn = z->n[2], vlo = z->lo[2];
    int64_t dp_lo = r->x.dp_rows[r->x.dp_r], scored = t->scored, S = b->S;
    if (rows != r->sc.loss_rows)
        return hp_err_set(err, HP_ERR_INPUT, "internal error: the loss kept %lld rows where the logits hold %lld",
                          (long long)r->sc.loss_rows, (long long)rows);
    size_t lab_b = ((size_t)rows + 1) * sizeof(int64_t);
    int64_t *lab = hp__mem_realloc(&r->x, NULL, 0, lab_b);
    if (!lab) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < rows; i++) {
        int64_t bb = i / z->n[1], p = z->lo[1] + i % z->n[1];
        int64_t at = (dp_lo + z->lo[0] + bb) * S + p + 1;
        lab[i] = p + 1 < S && (!b->mask || b->mask[at]) ? b->ids[at] : -1;
    }
    hp_status st = hp__act_alloc(&r->x, &t->da, z->g[0], z->g[1], z->g[2], z->lay, err);
    if (st == HP_OK)
        hp__xent_backward(z->d, vn, rows, vn, vlo, r->sc.loss_mx, r->sc.loss_se, lab,
                          scored > 0 ? 1.0 / (double)scored : 0.0, t->da.d, vn);
    hp__mem_free(&r->x, lab, lab_b);
    return st;
}

/* The head: t->da (the logits' gradient) through its exit, its linear and its entry, into t->dt. */
hp_status hp__bwd_head(hp_runner *r, const hp__step *s, step_w *w, hp__bio *b, hp_err *err)
{
    (void)w;
    hp__train *t = r->train;
    const hp__act *th = b->tin;
    int64_t rows = th->n[0] * th->n[1], H = r->g.cfg.H;
    char what[200];
    snprintf(what, sizeof what, "%s (backward of its exit)", s->c.fqn);
    hp_status st = dual(r, &t->da, glay(s->leave), &s->out, what, err);
    if (st != HP_OK) return st;
    hp__w *W = r->w.head_w;
    if ((st = like(r, &t->dt, th, H, (hp__lay){{s->split ? hp_pl_p() : hp_pl_r(), th->lay.ax[HP__CP]}}, err)) != HP_OK)
        return st;
    int64_t vl = t->da.n[2]; /* the rank's vocabulary block, as the head computed it */
    if ((st = hp__linear_backward(r->o.compute, rows, vl, H, t->da.d, vl, hp__t_w32(r, W), th->d, H, t->dt.d, H,
                                  hp__t_grad(r, W), NULL, err)) != HP_OK)
        return st;
    snprintf(what, sizeof what, "%s (backward of its entry)", s->c.fqn);
    return dual(r, &t->dt, t->dt.lay, &s->in, what, err);
}

/* A norm: t->dt (its output's gradient) to its input's, added into the stream's gradient t->dh, or written there
 * when nothing after it added to the stream (the final norm). */
hp_status hp__bwd_norm(hp_runner *r, const hp__step *s, step_w *w, hp__bio *b, hp_err *err)
{
    hp__train *t = r->train;
    bool add = t->dh_live;
    hp_status st = norm_bwd(r, s, &w->norm, b->hin, &t->dt, &t->dh, add, err);
    t->dh_live = true;
    return st == HP_OK ? grad_record(r, s->c.fqn, add ? "+ residual" : "dual of its entry", &t->dh, err) : st;
}

/* A residual h += a: the branch's gradient is the stream's, brought back to the layout the branch left in. */
hp_status hp__bwd_residual(hp_runner *r, const hp__step *s, step_w *w, hp__bio *b, hp_err *err)
{
    (void)w, (void)b;
    hp__train *t = r->train;
    char what[200];
    snprintf(what, sizeof what, "the residual add after %s (backward)", s->c.fqn);
    hp_status st = hp__r_act_copy(r, &t->da, &t->dh, err);
    return st == HP_OK ? dual(r, &t->da, r->g.stream, &s->in, what, err) : st;
}

/* A module between its boundaries: t->da through its exit's dual, the module's backward into t->dt, its entry's
 * dual. */
typedef hp_status (*module_fn)(hp_runner *r, const hp__step *s, step_w *w, const hp__bio *b, hp_err *err);

static hp_status module_bwd(hp_runner *r, const hp__step *s, step_w *w, const hp__bio *b, module_fn fn, hp_err *err)
{
    hp__train *t = r->train;
    char what[200];
    snprintf(what, sizeof what, "%s (backward of its exit)", s->c.fqn);
    hp_status st = dual(r, &t->da, glay(s->leave), &s->out, what, err);
    if (st == HP_OK) st = fn(r, s, w, b, err);
    snprintf(what, sizeof what, "%s (backward of its entry)", s->c.fqn);
    if (st == HP_OK) st = dual(r, &t->dt, t->dt.lay, &s->in, what, err);
    return st == HP_OK ? grad_record(r, s->c.fqn, "dual of its entry", &t->dt, err) : st;
}

static hp_status attn_fn(hp_runner *r, const hp__step *s, step_w *w, const hp__bio *b, hp_err *err)
{
    hp__train *t = r->train;
    return s->op == HP__OP_MLA ? mla_bwd(r, s, &w->at, b, &t->da, &t->dt, err)
                               : attn_bwd(r, s, &w->at, b, &t->da, &t->dt, err);
}

static hp_status mlp_fn(hp_runner *r, const hp__step *s, step_w *w, const hp__bio *b, hp_err *err)
{
    return mlp_bwd(r, s, &w->mlp, b, &r->train->da, &r->train->dt, err);
}

static hp_status moe_fn(hp_runner *r, const hp__step *s, step_w *w, const hp__bio *b, hp_err *err)
{
    return moe_bwd(r, s, &w->moe, b, &r->train->da, &r->train->dt, err);
}

hp_status hp__bwd_attn(hp_runner *r, const hp__step *s, step_w *w, hp__bio *b, hp_err *err)
{
    return module_bwd(r, s, w, b, attn_fn, err);
}

hp_status hp__bwd_mlp(hp_runner *r, const hp__step *s, step_w *w, hp__bio *b, hp_err *err)
{
    return module_bwd(r, s, w, b, mlp_fn, err);
}

hp_status hp__bwd_moe(hp_runner *r, const hp__step *s, step_w *w, hp__bio *b, hp_err *err)
{
    return module_bwd(r, s, w, b, moe_fn, err);
}

/* The embedding: the stream's gradient through its exit's dual, added into the rank's vocabulary rows. */
hp_status hp__bwd_embed(hp_runner *r, const hp__step *s, step_w *w, hp__bio *b, hp_err *err)
{
    hp__train *t = r->train;
    char what[200];
    snprintf(what, sizeof what, "%s (backward of its exit)", s->c.fqn);
    hp_status st = dual(r, &t->dh, r->g.stream, &s->out, what, err);
    if (st != HP_OK) return st;
    const hp__act *d = &t->dh;
    int64_t n = d->n[0] * d->n[1], dp_lo = r->x.dp_rows[r->x.dp_r], S = b->S;
    size_t id_b = ((size_t)n + 1) * sizeof(int64_t);
    int64_t *id = hp__mem_realloc(&r->x, NULL, 0, id_b);
    if (!id) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    /* The padding token's row gets no gradient from the embedding, as transformers' nn.Embedding(padding_idx =
     * pad_token_id) of every family gives it none (a tied lm_head still adds its own). */
    const int64_t pad = r->m->cfg.pad_token_id;
    for (int64_t i = 0; i < n; i++) {
        int64_t bb = i / d->n[1], p = d->lo[1] + i % d->n[1];
        id[i] = p < S ? b->ids[(dp_lo + d->lo[0] + bb) * S + p] : -1; /* a padded position (CP) reads no row */
        if (id[i] == pad) id[i] = -1;
    }
    const hp__w *E = &w->table;
    float *gE = hp__t_grad(r, E);
    if (gE) hp__embedding_backward(id, n, d->d, r->g.cfg.H, E->lo[0], E->shape[0], gE);
    hp__mem_free(&r->x, id, id_b);
    return HP_OK;
}

/* ---- the walk ---- */

static bool later(const hp_runner *r, size_t i, size_t e, hp__op op, int buf)
{
    return hp__recompute_overwrites(&r->g, i, e, op, buf, r->x.pos.r[HP__TP]);
}

/* The recompute's slots for n positions of a layer, grown keeping what the earlier positions hold (a layer with
 * more steps than those undone so far). */
static hp_status slots(hp__train *t, int n, hp_err *err)
{
    if (n <= t->n_pos) return HP_OK;
    size_t o = (size_t)t->n_pos, k = (size_t)n;
    hp__bio *src = realloc(t->src, k * sizeof *src);
    if (src) t->src = src;
    hp__act *h = src ? realloc(t->sv_h, k * sizeof *h) : NULL;
    if (h) t->sv_h = h;
    hp__act *tt = h ? realloc(t->sv_t, k * sizeof *tt) : NULL;
    if (tt) t->sv_t = tt;
    float **b = tt ? realloc(t->sv_buf, k * HP__NBUF * sizeof *b) : NULL;
    if (b) t->sv_buf = b;
    size_t *c = b ? realloc(t->sv_cap, k * HP__NBUF * sizeof *c) : NULL;
    if (c) t->sv_cap = c;
    if (!c) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the backward's recompute");
    memset(t->src + o, 0, (k - o) * sizeof *t->src);
    memset(t->sv_h + o, 0, (k - o) * sizeof *t->sv_h);
    memset(t->sv_t + o, 0, (k - o) * sizeof *t->sv_t);
    memset(t->sv_buf + o * HP__NBUF, 0, (k - o) * HP__NBUF * sizeof *t->sv_buf);
    memset(t->sv_cap + o * HP__NBUF, 0, (k - o) * HP__NBUF * sizeof *t->sv_cap);
    t->n_pos = n;
    return HP_OK;
}

/* A copy of n floats of src in slot k (kept across layers). */
static const float *save_buf(hp__train *t, size_t k, const float *src, int64_t n, hp_err *err)
{
    float *p = hp__t_grow(t, &t->sv_buf[k], &t->sv_cap[k], n, err);
    if (p) memcpy(p, src, (size_t)n * sizeof *src);
    return p;
}

/* What module step i's backward reads after its forward in the recompute [f, e): its input and intermediates,
 * copied where a later step of the recompute overwrites them, else the runner's own. */
static hp_status module_src(hp_runner *r, size_t f, size_t i, size_t e, const hp__fio *io, hp_err *err)
{
    hp__train *t = r->train;
    size_t p = i - f;
    hp__bio *b = &t->src[p];
    hp_status st = HP_OK;
    b->tin = io->t;
    if (later(r, i, e, HP__OP_NORM, -1)) {
        st = hp__r_act_copy(r, &t->sv_t[p], io->t, err);
        b->tin = &t->sv_t[p];
    }
    int64_t w[HP__NBUF], rows = io->t->n[0] * io->t->n[1];
    hp__step_row_widths(&r->g, &r->g.steps[i], r->x.pos.r[HP__TP], w);
    for (int k = 0; k < HP__NBUF && st == HP_OK; k++) {
        b->buf[k] = w[k] > 0 ? r->sc.buf[k] : NULL;
        if (w[k] > 0 && later(r, i, e, HP__OP_COUNT, k) &&
            !(b->buf[k] = save_buf(t, p * HP__NBUF + (size_t)k, r->sc.buf[k], rows * w[k], err)))
            st = HP_ERR_NOMEM;
    }
    return st;
}

/* Layer steps [f, e]'s forward again from the layer's kept input, through the runner's own entries (so the
 * intermediates are the forward's, bit for bit), leaving in t->src what each step's backward reads. The last
 * step is not run when it is the residual that ends the layer: no backward reads its output. The stream is the
 * kept input until a residual changes it, then the recompute's own copy (t->h1). */
static hp_status recompute(hp_runner *r, size_t f, size_t e, hp_err *err)
{
    hp__train *t = r->train;
    const hp__prog *g = &r->g;
    hp__act *kept = &r->sc.kept[g->steps[f].layer];
    size_t end = g->steps[e].op == HP__OP_RESIDUAL ? e : e + 1;
    hp_status st = slots(t, (int)(e - f + 1), err);
    hp__fio io = {.h = kept, .t = &r->sc.t, .a = &r->sc.a, .max_rows = r->sc.moe_rows, .recompute = true};
    for (size_t i = f; i < end && st == HP_OK; i++) {
        const hp__step *s = &g->steps[i];
        hp__bio *b = &t->src[i - f];
        memset(b, 0, sizeof *b);
        if (s->op == HP__OP_RESIDUAL && io.h == kept) {
            if ((st = hp__r_act_copy(r, &t->h1, kept, err)) != HP_OK) break;
            io.h = &t->h1;
        }
        if (s->op == HP__OP_NORM) {
            b->hin = io.h;
            if (io.h != kept && later(r, i, end, HP__OP_RESIDUAL, -1)) {
                if ((st = hp__r_act_copy(r, &t->sv_h[i - f], io.h, err)) != HP_OK) break;
                b->hin = &t->sv_h[i - f];
            }
        }
        io.next = i + 1 < g->n_steps ? &g->steps[i + 1] : NULL;
        st = hp__op_rt_table[s->op].fwd(r, s, &r->w.sw[i], &io, err);
        if (st == HP_OK && hp__op_is_module(s->op)) st = module_src(r, f, i, end, &io, err);
    }
    return st;
}

hp_status hp__backward(hp_runner *r, const int64_t *ids, const uint8_t *mask, int64_t S, hp_err *err)
{
    r->train->dh_live = false;
    return hp__backward_steps(r, ids, mask, S, 0, r->g.n_steps, err);
}

hp_status hp__backward_steps(hp_runner *r, const int64_t *ids, const uint8_t *mask, int64_t S, size_t lo, size_t hi,
                             hp_err *err)
{
    hp__train *t = r->train;
    const hp__prog *g = &r->g;
    hp_status st = HP_OK;
    size_t f = 0; /* the first step of the layer being undone */
    for (size_t i = hi; st == HP_OK && i-- > lo;) {
        const hp__step *s = &g->steps[i];
        hp__bio b = {0};
        if (s->layer >= 0) {
            if (i + 1 == g->n_steps || g->steps[i + 1].layer != s->layer) { /* the layer's last step */
                for (f = i; f > 0 && g->steps[f - 1].layer == s->layer;) f--;
                if (!g->steps[f].keep)
                    return hp_err_set(err, HP_ERR_INPUT, "internal error: layer %lld does not start at a kept input",
                                      (long long)s->layer);
                if ((st = recompute(r, f, i, err)) != HP_OK) break;
            }
            b = t->src[i - f];
        } else { /* outside the layers: the forward's own values */
            if (s->op == HP__OP_NORM && !s->keep)
                return hp_err_set(err, HP_ERR_INPUT, "internal error: %s's input is not kept", s->c.fqn);
            b.hin = &r->sc.kept[g->cfg.L];
            b.tin = &r->sc.t;
        }
        b.ids = ids, b.mask = mask, b.S = S;
        const hp__op_rt *o = &hp__op_rt_table[s->op];
        if (o->bwd) st = o->bwd(r, s, &r->w.sw[i], &b, err);
    }
    return st;
}

static void free_slots(hp__train *t)
{
    for (int i = 0; i < t->n_pos; i++) {
        hp__act_release(t->ctx, &t->sv_h[i]);
        hp__act_release(t->ctx, &t->sv_t[i]);
        for (size_t k = (size_t)i * HP__NBUF; k < (size_t)(i + 1) * HP__NBUF; k++)
            hp__mem_free(t->ctx, t->sv_buf[k], t->sv_cap[k] * sizeof(float));
    }
    free(t->src), free(t->sv_h), free(t->sv_t), free(t->sv_buf), free(t->sv_cap);
    t->src = NULL, t->sv_h = t->sv_t = NULL, t->sv_buf = NULL, t->sv_cap = NULL;
    t->n_pos = 0;
}

void hp__bwd_release(hp__train *t)
{
    free_slots(t);
    hp__act *acts[] = {&t->dh, &t->dt, &t->da, &t->x, &t->h1, &t->dk, &t->dv};
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++) hp__act_release(t->ctx, acts[i]);
    for (int i = 0; i < HP__NBWD; i++) {
        hp__mem_free(t->ctx, t->f[i], t->fcap[i] * sizeof(float));
        t->f[i] = NULL;
        t->fcap[i] = 0;
    }
}
