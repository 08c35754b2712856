/*
 * schedule.c — the learning rate of each training step (docs/train.md, "Data, batches and schedule").
 *
 * For step t = 1..N with warmup W and peak lr: t <= W gives lr·t/W (W = 0: no warmup); after it, with
 * u = (t − W)/(N − W) in (0, 1]:
 *   cosine    min_lr + ½(lr − min_lr)(1 + cos(π·u))   (lr just after the warmup, min_lr at t = N)
 *   linear    lr − (lr − min_lr)·u
 *   constant  lr
 * and N <= W (no step after the warmup to decay over) gives lr. Computed in double, as written.
 */
#include <math.h>
#include <string.h>

#include "hyperpar/data.h"

static const char *const g_names[] = {"cosine", "linear", "constant"};

bool hp_lr_kind_parse(const char *s, hp_lr_kind *out)
{
    for (int k = 0; k < 3; k++)
        if (!strcmp(s, g_names[k])) {
            *out = (hp_lr_kind)k;
            return true;
        }
    return false;
}

const char *hp_lr_kind_name(hp_lr_kind k) { return (unsigned)k < 3 ? g_names[k] : "?"; }

double hp_lr_at(const hp_lr_schedule *s, int64_t t)
{
    if (s->warmup > 0 && t <= s->warmup) return s->lr * (double)t / (double)s->warmup;
    if (s->kind == HP_LR_CONSTANT || s->steps <= s->warmup) return s->lr;
    double u = (double)(t - s->warmup) / (double)(s->steps - s->warmup);
    if (s->kind == HP_LR_LINEAR) return s->lr - (s->lr - s->min_lr) * u;
    return s->min_lr + 0.5 * (s->lr - s->min_lr) * (1.0 + cos(M_PI * u));
}
