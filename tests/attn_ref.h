/*
 * attn_ref.h — the tests' one f64 reference of softmax attention (test_attention, test_backward): eager, a whole
 * score row at a time, its own mask test from the positions (causal, sliding window, CP's query offset), sinks
 * joining the max and the sum. Shapes and positions come from a (its pointers are not read); q [B, sq, nh, hd],
 * k [B, sk, nkv, hd], v [B, sk, nkv, hdv], sinks [nh] or NULL; out [B, sq, nh, hdv].
 */
#ifndef HP_TESTS_ATTN_REF_H
#define HP_TESTS_ATTN_REF_H

#include "kernels/modules.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

static void attn_ref_f64(const hp__attn_args *a, const double *q, const double *k, const double *v,
                         const double *sinks, double *out)
{
    int64_t rep = a->nh / a->nkv, hd = a->hd, hdv = a->hdv > 0 ? a->hdv : hd;
    double scale = a->scale > 0 ? a->scale : 1.0 / sqrt((double)hd);
    double *s = malloc((size_t)(a->sk > 0 ? a->sk : 1) * sizeof *s);
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->nh; h++)
            for (int64_t i = 0; i < a->sq; i++) {
                int64_t qp = a->q_pos0 + i, kh = h / rep;
                const double *qr = q + ((b * a->sq + i) * a->nh + h) * hd;
                double mx = sinks ? sinks[h] : -INFINITY;
                for (int64_t j = 0; j < a->sk; j++) {
                    int64_t kp = a->k_pos0 + j;
                    bool seen = kp <= qp && (a->window <= 0 || qp - kp < a->window);
                    s[j] = -INFINITY;
                    if (!seen) continue;
                    const double *kr = k + ((b * a->sk + j) * a->nkv + kh) * hd;
                    double d = 0;
                    for (int64_t e = 0; e < hd; e++) d += qr[e] * kr[e];
                    s[j] = d * scale;
                    mx = fmax(mx, s[j]);
                }
                double sum = sinks ? exp(sinks[h] - mx) : 0;
                for (int64_t j = 0; j < a->sk; j++) {
                    s[j] = s[j] == -INFINITY ? 0 : exp(s[j] - mx);
                    sum += s[j];
                }
                double *o = out + ((b * a->sq + i) * a->nh + h) * hdv;
                for (int64_t e = 0; e < hdv; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < a->sk; j++)
                        if (s[j] != 0) acc += s[j] * v[((b * a->sk + j) * a->nkv + kh) * hdv + e];
                    o[e] = sum > 0 ? acc / sum : 0;
                }
            }
    free(s);
}

#endif
