/*
 * hf_registry.c — which transformers release accepts which parallel-style names, for the plan export
 * (hf.c, `hyperpar plan --format hf --hf-version V`). docs/plan-format.md, section "Transformers plan
 * export", tells the same facts to users.
 *
 * transformers keeps its styles in one registry (`ALL_PARALLEL_STYLES`); a plan naming a style the
 * registry lacks is refused with a ValueError, and the registry changed from release to release, not
 * only by additions (embedding_colwise is in 5.8 but not in 5.16-5.20; ep_router went in 5.23). So the
 * table below is what was read in the released wheels themselves, one row per release read:
 *
 *   release  read in                                       styles the export may write
 *   5.0      integrations/tensor_parallel.py               colwise rowwise colwise_rep sequence_parallel
 *                                                          replicate grouped_gemm ep_router
 *   5.8      integrations/tensor_parallel.py               + colwise_gather_output packed_* embedding_*
 *                                                          replicated_with_grad_allreduce moe_tp_experts
 *                                                          - colwise_rep replicate
 *   5.16     distributed/tensor_parallel.py                5.8 - embedding_colwise + colwise_rep
 *   5.18     (same as 5.16)
 *   5.19     (5.18 + ep_dispatch_experts)
 *   5.20     (same as 5.19)
 *   5.21     + embedding_colwise replicate
 *   5.22     (same as 5.21)
 *   5.23     - ep_router; `ep_router` and `moe_tp_experts` in an ep_plan raise (distributed/mixin.py)
 *   5.25     (same as 5.23); moe_tp_experts warns "removal in v5.28.0" (distributed/tensor_parallel.py)
 *
 * A release between two rows has a style when both rows have it (so 5.17 gets what 5.16 and 5.18
 * share); a release after the newest row is taken as the newest row, less what it announces removed.
 * Patch releases share their minor release's row (no patch release changed the registry in the rows
 * read: 5.22.0 and 5.22.2 alike).
 *
 * How plans combine, by era (distributed/mixin.py of each release):
 *   <= 5.18  the EP plan *replaces* the TP plan when expert parallelism is on (`tp_plan` returns
 *            `_ep_plan`), and DistributedConfig has no ep_plan: the EP plan repeats the dense entries.
 *   5.19-22  TP and EP plans apply side by side, EP rules winning on the modules they name;
 *            DistributedConfig(tp_plan=, ep_plan=) are merged into the model's plans (keys: full module
 *            paths, "model.layers.*..."); the router-masking EP of ep_router + moe_tp_experts needs
 *            ep_size == tp_size (distributed/configuration_utils.py).
 *   >= 5.23  as 5.19, and an EP plan is grouped_gemm on the expert tensors plus ep_dispatch_experts on the
 *            experts module (the models' own base_model_ep_plan).
 */
#include <stdio.h>
#include <string.h>

#include "plan/planner.h"

static const char *const style_names[HP__HF_STYLE_COUNT] = {
    [HP__HF_COLWISE] = "colwise",
    [HP__HF_ROWWISE] = "rowwise",
    [HP__HF_COLWISE_GATHER_OUTPUT] = "colwise_gather_output",
    [HP__HF_COLWISE_REP] = "colwise_rep",
    [HP__HF_PACKED_COLWISE] = "packed_colwise",
    [HP__HF_PACKED_ROWWISE] = "packed_rowwise",
    [HP__HF_EMBEDDING_ROWWISE] = "embedding_rowwise",
    [HP__HF_EMBEDDING_COLWISE] = "embedding_colwise",
    [HP__HF_SEQUENCE_PARALLEL] = "sequence_parallel",
    [HP__HF_REPLICATED_WITH_GRAD_ALLREDUCE] = "replicated_with_grad_allreduce",
    [HP__HF_REPLICATE] = "replicate",
    [HP__HF_GROUPED_GEMM] = "grouped_gemm",
    [HP__HF_EP_ROUTER] = "ep_router",
    [HP__HF_MOE_TP_EXPERTS] = "moe_tp_experts",
    [HP__HF_EP_DISPATCH_EXPERTS] = "ep_dispatch_experts",
};

#define B(s) (1u << HP__HF_##s)
#define R_5_0 (B(COLWISE) | B(ROWWISE) | B(COLWISE_REP) | B(SEQUENCE_PARALLEL) | B(REPLICATE) | B(GROUPED_GEMM) | \
               B(EP_ROUTER))
#define R_5_8 (B(COLWISE) | B(ROWWISE) | B(COLWISE_GATHER_OUTPUT) | B(PACKED_COLWISE) | B(PACKED_ROWWISE) |         \
               B(EMBEDDING_ROWWISE) | B(EMBEDDING_COLWISE) | B(SEQUENCE_PARALLEL) |                                 \
               B(REPLICATED_WITH_GRAD_ALLREDUCE) | B(GROUPED_GEMM) | B(EP_ROUTER) | B(MOE_TP_EXPERTS))
#define R_5_16 ((R_5_8 & ~B(EMBEDDING_COLWISE)) | B(COLWISE_REP))
#define R_5_19 (R_5_16 | B(EP_DISPATCH_EXPERTS))
#define R_5_21 (R_5_19 | B(EMBEDDING_COLWISE) | B(REPLICATE))
#define R_5_23 (R_5_21 & ~B(EP_ROUTER))

static const struct release {
    int major, minor;
    unsigned styles;
} releases[] = {
    {5, 0, R_5_0},   {5, 8, R_5_8},   {5, 16, R_5_16}, {5, 18, R_5_16}, {5, 19, R_5_19},
    {5, 20, R_5_19}, {5, 21, R_5_21}, {5, 22, R_5_21}, {5, 23, R_5_23}, {5, 25, R_5_23},
};
#define N_RELEASES (sizeof releases / sizeof *releases)

/* Styles the newest release read announces removed, and from which release (5.25's deprecation warning). */
static const struct removal {
    int major, minor, style;
} removals[] = {{5, 28, HP__HF_MOE_TP_EXPERTS}};

const char *hp__hf_style_name(int style) { return style >= 0 && style < HP__HF_STYLE_COUNT ? style_names[style] : NULL; }

int hp__hf_style_parse(const char *name)
{
    for (int i = 0; i < HP__HF_STYLE_COUNT; i++)
        if (name && strcmp(name, style_names[i]) == 0) return i;
    return -1;
}

static int cmp_mm(int a_major, int a_minor, int b_major, int b_minor)
{
    return a_major != b_major ? (a_major < b_major ? -1 : 1) : a_minor != b_minor ? (a_minor < b_minor ? -1 : 1) : 0;
}

/* One version component: 1 to 6 digits (a larger number is no transformers release). */
static const char *component(const char *s, int *out)
{
    int n = 0, v = 0;
    while (s[n] >= '0' && s[n] <= '9') {
        if (n == 6) return NULL;
        v = v * 10 + (s[n] - '0');
        n++;
    }
    if (n == 0) return NULL;
    *out = v;
    return s + n;
}

hp_status hp__hf_target_init(hp__hf_target *t, const char *version, hp_err *err)
{
    memset(t, 0, sizeof *t);
    const char *v = version ? version : HP_HF_DEFAULT_VERSION;
    int part[3] = {0, 0, 0}, n = 0;
    const char *s = v;
    while (s && n < 3) {
        s = component(s, &part[n++]);
        if (!s || *s == '\0') break;
        s = *s == '.' ? s + 1 : NULL;
    }
    if (!s || *s != '\0' || n < 2)
        return hp_err_set(err, HP_ERR_INPUT,
                          "transformers version '%s' does not parse: give MAJOR.MINOR or MAJOR.MINOR.PATCH in plain "
                          "digits, e.g. 5.25 or 5.22.2 (for a development build such as 5.26.0.dev0, give the release "
                          "before it, 5.25)",
                          v);
    t->major = part[0], t->minor = part[1], t->patch = part[2];
    snprintf(t->text, sizeof t->text, "%d.%d.%d", t->major, t->minor, t->patch);
    const struct release *lo = NULL, *hi = NULL;
    for (size_t i = 0; i < N_RELEASES; i++) {
        int c = cmp_mm(releases[i].major, releases[i].minor, t->major, t->minor);
        if (c <= 0) lo = &releases[i];
        if (c >= 0 && !hi) hi = &releases[i];
    }
    if (!lo)
        return hp_err_set(err, HP_ERR_INPUT,
                          "transformers %s is older than 5.0, the oldest release whose parallel-style names hyperpar "
                          "knows (docs/plan-format.md, \"Transformers plan export\"); give 5.0 or later",
                          t->text);
    t->styles = lo->styles & (hi ? hi->styles : ~0u);
    for (size_t i = 0; i < sizeof removals / sizeof *removals; i++)
        if (cmp_mm(t->major, t->minor, removals[i].major, removals[i].minor) >= 0)
            t->styles &= ~(1u << removals[i].style);
    t->era = cmp_mm(t->major, t->minor, 5, 18) <= 0   ? HP__HF_ERA_REPLACE
             : cmp_mm(t->major, t->minor, 5, 22) <= 0 ? HP__HF_ERA_SEPARATE
                                                      : HP__HF_ERA_DISPATCH;
    t->newer_than_known = cmp_mm(t->major, t->minor, releases[N_RELEASES - 1].major,
                                 releases[N_RELEASES - 1].minor) > 0;
    return HP_OK;
}

bool hp__hf_target_has(const hp__hf_target *t, int style)
{
    return style >= 0 && style < HP__HF_STYLE_COUNT && (t->styles >> style & 1u);
}

hp_status hp_plan_hf_version_check(const char *version, hp_err *err)
{
    hp__hf_target t;
    return hp__hf_target_init(&t, version, err);
}
