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
#include "run/backward.h"

#include <math.h>

void hp__adamw_step(float *param, const float *grad, float *m, float *v, int64_t n, const hp__adamw *opt,
                    int64_t step)
{
    double lr = opt->lr, b1 = opt->beta1, b2 = opt->beta2;
    double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    double step_size = lr / bc1, bc2_sqrt = sqrt(bc2), decay = 1.0 - lr * opt->weight_decay;
    /* element-wise: the threads split the elements, every element computed the same way (deterministic) */
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        double g = grad[i];
        double p = (double)param[i] * decay;
        double mi = (double)m[i] + (1.0 - b1) * (g - (double)m[i]);
        double vi = (double)v[i] * b2 + (1.0 - b2) * g * g;
        double denom = sqrt(vi) / bc2_sqrt + opt->eps;
        p -= step_size * mi / denom;
        m[i] = (float)mi;
        v[i] = (float)vi;
        param[i] = (float)p;
    }
}
