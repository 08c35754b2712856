/*
 * adamw.c — one step of torch.optim.AdamW (decoupled weight decay, bias-corrected moments) on a flat f32
 * parameter, its gradient and its two f32 moments.
 *
 * Precision: each element is computed in double from its f32 inputs and rounded to f32 once per stored value
 * (p, m, v), in PyTorch's order of operations (_single_tensor_adamw: p·(1 − lr·wd); m lerp'd toward g;
 * v·β2 + (1 − β2)·g²; denom = √v / √(1 − β2^t) + eps; p −= (lr / (1 − β1^t)) · m / denom). PyTorch rounds to f32
 * after each of those tensor operations instead; the difference is a few f32 ulps of the update, far inside the
 * end-to-end bar (1e-6·max|p| + 1e-7 per tensor, tests/test_backward.c).
 */
#include "kernels/backward.h"

#include <math.h>

/* The step's constants, shared by the update and its check so that both compute every element the same way. */
typedef struct adamw_k {
    double lr, b1, b2, step_size, bc2_sqrt, decay, eps;
} adamw_k;

static adamw_k adamw_consts(const hp__adamw *opt, int64_t step)
{
    double b1 = opt->beta1, b2 = opt->beta2;
    double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    return (adamw_k){.lr = opt->lr, .b1 = b1, .b2 = b2, .step_size = opt->lr / bc1, .bc2_sqrt = sqrt(bc2),
                     .decay = 1.0 - opt->lr * opt->weight_decay, .eps = opt->eps};
}

/* One element's new (p, m, v), each rounded to f32 once. */
static inline void adamw_elem(const adamw_k *k, float param, float grad, float m, float v, float *po, float *mo,
                              float *vo)
{
    double g = grad;
    double p = (double)param * k->decay;
    double mi = (double)m + (1.0 - k->b1) * (g - (double)m);
    double vi = (double)v * k->b2 + (1.0 - k->b2) * g * g;
    double denom = sqrt(vi) / k->bc2_sqrt + k->eps;
    p -= k->step_size * mi / denom;
    *mo = (float)mi;
    *vo = (float)vi;
    *po = (float)p;
}

void hp__adamw_step(float *param, const float *grad, float *m, float *v, int64_t n, const hp__adamw *opt,
                    int64_t step)
{
    adamw_k k = adamw_consts(opt, step);
    /* element-wise: the threads split the elements, every element computed the same way (deterministic) */
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) adamw_elem(&k, param[i], grad[i], m[i], v[i], &param[i], &m[i], &v[i]);
}

int64_t hp__adamw_check(const float *param, const float *grad, const float *m, const float *v, int64_t n,
                        const hp__adamw *opt, int64_t step, hp__adamw_bad *bad)
{
    adamw_k k = adamw_consts(opt, step);
    int64_t first = n;
    /* the same element function as the step, so "finite here" is "finite there"; the lowest index wins */
#pragma omp parallel for schedule(static) reduction(min : first) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        float po, mo, vo;
        adamw_elem(&k, param[i], grad[i], m[i], v[i], &po, &mo, &vo);
        if (!isfinite(po) || !isfinite(mo) || !isfinite(vo) || vo < 0) first = i < first ? i : first;
    }
    if (first < n && bad) {
        float po, mo, vo;
        adamw_elem(&k, param[first], grad[first], m[first], v[first], &po, &mo, &vo);
        *bad = (hp__adamw_bad){.param = po, .m = mo, .v = vo, .old = param[first], .grad = grad[first],
                               .decay = k.decay};
    }
    return first;
}
