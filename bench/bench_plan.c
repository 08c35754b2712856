/*
 * bench_plan.c — planner speed: DeepSeek-V3 (meta mode, per-expert layout, 45k tensors) against a 6-layer
 * cut of the same config, planned in the same run. Prints both times, the tensor counts and the two
 * ratios: linear growth means time ratio ≈ tensor ratio.
 *
 *   usage: bench_plan [CONFIG.json] [--tp N] [--ep N] [--reps R]
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyperpar/plan.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best-of-reps wall time of hp_plan_derive (the model is opened once, outside the timing). */
static double time_plan(const char *text, size_t len, int64_t tp, int64_t ep, int reps, size_t *n_tensors)
{
    hp_model *m = NULL;
    hp_err err;
    if (hp_model_from_config_text(&m, text, len, "config.json", NULL, &err) != HP_OK) {
        fprintf(stderr, "bench_plan: %s\n", err.msg);
        exit(1);
    }
    hp_plan_opts o;
    hp_plan_opts_default(&o);
    hp_mesh_from_sizes(&o.mesh, 2, 1, tp, ep, false);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        hp_plan *p = NULL;
        double t0 = now();
        if (hp_plan_derive(&p, m, &o, &err) != HP_OK) {
            fprintf(stderr, "bench_plan: %s\n", err.msg);
            exit(1);
        }
        double dt = now() - t0;
        if (dt < best) best = dt;
        hp_plan_free(p);
    }
    *n_tensors = m->n_params;
    hp_model_close(m);
    return best;
}

int main(int argc, char **argv)
{
    const char *path = "tests/data/configs/deepseek-v3.json";
    int64_t tp = 8, ep = 16;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tp") && i + 1 < argc) tp = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--ep") && i + 1 < argc) ep = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else path = argv[i];
    }
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg) {
        fprintf(stderr, "bench_plan: %s: %s\n", path, je.text);
        return 2;
    }
    char *full = json_dumps(cfg, 0);
    json_object_set_new(cfg, "num_hidden_layers", json_integer(6));
    char *cut = json_dumps(cfg, 0);
    json_decref(cfg);

    size_t n_full, n_cut;
    double t_cut = time_plan(cut, strlen(cut), tp, ep, reps, &n_cut);
    double t_full = time_plan(full, strlen(full), tp, ep, reps, &n_full);
    printf("planner benchmark: %s, mesh dp=2,tp=%lld, ep=%lld, best of %d\n", path, (long long)tp, (long long)ep, reps);
    printf("  6-layer cut : %7zu tensors  %8.2f ms\n", n_cut, 1e3 * t_cut);
    printf("  full model  : %7zu tensors  %8.2f ms\n", n_full, 1e3 * t_full);
    printf("  ratio       : tensors x%.2f, time x%.2f  (time/tensor ratio %.2f; 1.00 = linear)\n",
           (double)n_full / (double)n_cut, t_full / t_cut, (t_full / t_cut) / ((double)n_full / (double)n_cut));
    free(full);
    free(cut);
    return 0;
}
