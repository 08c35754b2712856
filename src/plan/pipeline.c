/*
 * pipeline.c — the pp axis's stages: which decoder layers each pipeline chunk holds, and which stages hold each
 * parameter (docs/pipeline.md). The one statement of the rule: the plan records it, explain prints it, the shard
 * layout places each tensor by it.
 */
#include "plan/planner_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

hp_status hp_pipeline_split(hp_pipeline *out, int64_t L, int64_t pp, int64_t virt, const int64_t *counts, int n,
                            hp_arena *a, hp_err *err)
{
    memset(out, 0, sizeof *out);
    if (virt < 1) virt = 1;
    if (pp < 1 || pp > HP_MESH_MAX_SIZE || virt > HP_MESH_MAX_SIZE)
        return hp_err_set(err, HP_ERR_INPUT, "pp=%lld with %lld virtual stages is out of range", (long long)pp,
                          (long long)virt);
    int64_t C = pp * virt;
    if (virt > 1 && pp < 2)
        return hp_err_set(err, HP_ERR_INPUT, "--pp-virtual %lld needs a pipeline (pp >= 2); the mesh has pp=%lld",
                          (long long)virt, (long long)pp);
    out->pp = pp, out->virt = virt, out->n_chunks = C;
    out->first = hp_arena_alloc(a, (size_t)C * sizeof *out->first);
    out->count = hp_arena_alloc(a, (size_t)C * sizeof *out->count);
    if (!out->first || !out->count) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (counts) {
        if (n != C)
            return hp_err_set(err, HP_ERR_INPUT, "--pp-layers gives %d counts; pp=%lld x %lld virtual stages has %lld "
                              "chunks: give one count per chunk", n, (long long)pp, (long long)virt, (long long)C);
        int64_t sum = 0;
        for (int64_t c = 0; c < C; c++) {
            if (counts[c] < 0 || counts[c] > L)
                return hp_err_set(err, HP_ERR_INPUT, "--pp-layers: chunk %lld has %lld layers; each count is a number "
                                  "of decoder layers in [0, %lld]", (long long)c, (long long)counts[c], (long long)L);
            out->first[c] = sum;
            out->count[c] = counts[c];
            sum += counts[c];
        }
        if (sum != L)
            return hp_err_set(err, HP_ERR_INPUT, "--pp-layers: the counts sum to %lld, but the model has %lld decoder "
                              "layers; every layer must be on exactly one stage", (long long)sum, (long long)L);
        out->given = true;
        return HP_OK;
    }
    int64_t U = L + 2; /* the embedding and the loss count as one layer each */
    if (U < C)
        return hp_err_set(err, HP_ERR_INPUT, "pp=%lld x %lld virtual stages makes %lld chunks, but the model has only "
                          "%lld decoder layers (+ the embedding and the loss): use a smaller pp or fewer virtual stages",
                          (long long)pp, (long long)virt, (long long)C, (long long)L);
    int64_t next = 0;
    for (int64_t c = 0; c < C; c++) {
        int64_t units = U / C + (c >= C - U % C); /* the last U mod C chunks take one unit more */
        int64_t k = units - (c == 0) - (c == C - 1);
        out->first[c] = next;
        out->count[c] = k > 0 ? k : 0;
        next += out->count[c];
    }
    return HP_OK;
}

int64_t hp_pipeline_chunk_of(const hp_pipeline *q, int64_t l)
{
    for (int64_t c = 0; c < q->n_chunks; c++)
        if (l >= q->first[c] && l < q->first[c] + q->count[c]) return c;
    return q->n_chunks - 1; /* past the decoder (multi-token prediction): with the loss */
}

int64_t hp_pipeline_stage_of(const hp_pipeline *q, int64_t l)
{
    return q->pp > 1 ? hp_pipeline_chunk_of(q, l) % q->pp : 0;
}

/* The decoder layer a parameter name belongs to ("...layers.<l>."), or -1. */
static int64_t layer_of(const char *name)
{
    const char *s = strstr(name, "layers.");
    if (!s || (s != name && s[-1] != '.')) return -1;
    char *end = NULL;
    long long l = strtoll(s + 7, &end, 10);
    return end != s + 7 && *end == '.' && l >= 0 ? l : -1;
}

int hp_pipeline_param_stages(const hp_plan *p, const char *name, int64_t st[2])
{
    const hp_pipeline *q = &p->pipe;
    int64_t last = q->pp > 1 ? q->pp - 1 : 0;
    int64_t l = layer_of(name);
    if (l >= 0) {
        st[0] = l < p->model->cfg.num_hidden_layers ? hp_pipeline_stage_of(q, l) : last;
        return 1;
    }
    if (strstr(name, "embed_tokens")) {
        st[0] = 0;
        bool tied = !hp_model_find_param(p->model, "lm_head.weight"); /* the head reads the embedding */
        if (tied && last != 0) {
            st[1] = last;
            return 2;
        }
        return 1;
    }
    st[0] = last;
    return 1;
}
