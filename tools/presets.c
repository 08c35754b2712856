/*
 * presets.c — the one table of real model shapes the benchmarks run at (bench moe, bench ep, bench run).
 *
 * The config.json files of meta-llama/Meta-Llama-3-8B, Qwen/Qwen3-30B-A3B, mistralai/Mixtral-8x7B-v0.1,
 * openai/gpt-oss-20b and deepseek-ai/DeepSeek-V3 (spec/hf_reference.md §4; also in shared/configs/).
 */
#include <string.h>

#include "cli.h"
#include "hyperpar/moe.h"

static const cli_preset g_presets[] = {
    {.name = "llama-3-8b", .family = "llama", .hidden = 4096, .intermediate = 14336, .heads = 32, .kv_heads = 8,
     .head_dim = 128, .vocab = 128256},
    {.name = "qwen3-30b-a3b", .family = "qwen3_moe", .archetype = HP_MOE_QWEN3MOE_TOPK_ROUTER, .hidden = 2048,
     .intermediate = 6144, .heads = 32, .kv_heads = 4, .head_dim = 128, .vocab = 151936, .experts = 128, .top_k = 8,
     .moe_intermediate = 768, .norm_topk = true},
    {.name = "mixtral-8x7b", .family = "mixtral", .archetype = HP_MOE_MIXTRAL_TOPK_ROUTER, .hidden = 4096,
     .intermediate = 14336, .heads = 32, .kv_heads = 8, .head_dim = 128, .vocab = 32000, .experts = 8, .top_k = 2,
     .moe_intermediate = 14336, .norm_topk = true},
    {.name = "gpt-oss-20b", .family = "gpt_oss", .archetype = HP_MOE_GPTOSS_TOPK_ROUTER, .hidden = 2880,
     .intermediate = 2880, .heads = 64, .kv_heads = 8, .head_dim = 64, .vocab = 201088, .experts = 32, .top_k = 4,
     .moe_intermediate = 2880, .norm_topk = false},
    {.name = "deepseek-v3", .family = "deepseek_v3", .archetype = HP_MOE_DEEPSEEKV3_SIGMOID_GROUP_SHARED,
     .hidden = 7168, .intermediate = 18432, .heads = 128, .kv_heads = 128, .head_dim = 128, .vocab = 129280,
     .experts = 256, .top_k = 8, .moe_intermediate = 2048, .shared_intermediate = 2048, .first_dense = 3,
     .n_group = 8, .topk_group = 4, .rsf = 2.5, .norm_topk = true, .q_lora = 1536, .kv_lora = 512, .nope = 128,
     .rope = 64, .v_head = 128},
};
#define N_PRESETS (sizeof g_presets / sizeof *g_presets)

const cli_preset *cli_preset_at(size_t i) { return i < N_PRESETS ? &g_presets[i] : NULL; }

const cli_preset *cli_preset_find(const char *name, bool moe_only)
{
    for (size_t i = 0; i < N_PRESETS; i++)
        if (!strcmp(name, g_presets[i].name) && (!moe_only || g_presets[i].experts > 0)) return &g_presets[i];
    return NULL;
}

const cli_preset *cli_preset_arg(const char *cmd, const char *name, bool moe_only)
{
    char names[256];
    cli_preset_names(moe_only, names, sizeof names);
    const cli_preset *p = name ? cli_preset_find(name, moe_only) : NULL;
    if (!name) cli_usage_error(cmd, "missing --preset (%s)", names);
    else if (!p) cli_usage_error(cmd, "unknown preset '%s'; known: %s", name, names);
    return p;
}

const char *cli_preset_names(bool moe_only, char *buf, size_t cap)
{
    size_t o = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; i < N_PRESETS && o < cap; i++)
        if (!moe_only || g_presets[i].experts > 0)
            o += (size_t)snprintf(buf + o, cap - o, "%s%s", o ? ", " : "", g_presets[i].name);
    return buf;
}

hp_moe_dims cli_preset_moe_dims(const cli_preset *p)
{
    return (hp_moe_dims){.n_hidden = p->hidden, .n_experts = p->experts, .top_k = p->top_k,
                         .d_expert = p->moe_intermediate, .d_shared = p->shared_intermediate,
                         .n_group = p->n_group ? p->n_group : 1, .topk_group = p->topk_group ? p->topk_group : 1,
                         .routed_scaling_factor = p->rsf > 0 ? p->rsf : 1.0, .norm_topk_prob = p->norm_topk};
}

void cli_preset_describe(const cli_preset *p, char *buf, size_t cap)
{
    int n;
    if (p->q_lora)
        n = snprintf(buf, cap, "H %lld, %lld heads MLA q_lora %lld kv_lora %lld nope %lld rope %lld v %lld",
                     (long long)p->hidden, (long long)p->heads, (long long)p->q_lora, (long long)p->kv_lora,
                     (long long)p->nope, (long long)p->rope, (long long)p->v_head);
    else
        n = snprintf(buf, cap, "H %lld, %lld heads, %lld kv x %lld", (long long)p->hidden, (long long)p->heads,
                     (long long)p->kv_heads, (long long)p->head_dim);
    if (n < 0 || (size_t)n >= cap) return;
    if (!p->experts) n += snprintf(buf + n, cap - (size_t)n, ", I %lld", (long long)p->intermediate);
    else {
        n += snprintf(buf + n, cap - (size_t)n, ", %lld experts top-%lld x %lld", (long long)p->experts,
                      (long long)p->top_k, (long long)p->moe_intermediate);
        if (p->n_group > 1 && (size_t)n < cap)
            n += snprintf(buf + n, cap - (size_t)n, " in %lld groups top-%lld", (long long)p->n_group,
                          (long long)p->topk_group);
        if (p->shared_intermediate && (size_t)n < cap)
            n += snprintf(buf + n, cap - (size_t)n, ", shared expert x %lld", (long long)p->shared_intermediate);
        if (p->first_dense && (size_t)n < cap)
            n += snprintf(buf + n, cap - (size_t)n, ", dense I %lld in the first %lld layers",
                          (long long)p->intermediate, (long long)p->first_dense);
    }
    if ((size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ", vocab %lld", (long long)p->vocab);
}

void cli_print_presets(FILE *out, bool moe_only)
{
    for (size_t i = 0; i < N_PRESETS; i++) {
        if (moe_only && !g_presets[i].experts) continue;
        char d[300];
        cli_preset_describe(&g_presets[i], d, sizeof d);
        fprintf(out, "  %-14s %s\n", g_presets[i].name, d);
    }
}
