/*
 * fuzz_plan_json.c — libFuzzer target: plan JSON text ("hyperpar-plan" v1) into the shard module's plan reader
 * (hp__shard_plan_parse, what hp_shard_read_plan runs on a file's text), then the preflight `hyperpar shard`
 * runs on a plan it read. Any input must end in HP_OK or a clean error; never a crash, a leak, an
 * out-of-bounds access or undefined behaviour.
 *
 * The reader checks a plan against a model, so the target builds two once, in meta mode, from the tiny
 * Qwen3-MoE config below (2 layers, 8 experts): one with per-expert names (plans stack them with ep_stack)
 * and one with batched expert tensors. The seeds in fuzz/corpus/plan_json are `hyperpar plan` outputs for
 * this config (saved as config.json) on several meshes, plus corrupt variants.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/overrides.h"
#include "shard/shard_int.h"
#include "fuzz.h"

static const char g_config[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"hidden_size\": 64,"
    " \"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
    " \"head_dim\": 16, \"vocab_size\": 128, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"decoder_sparse_step\": 1,"
    " \"mlp_only_layers\": [], \"attention_bias\": false}";

static hp_model *model(hp_expert_layout layout)
{
    static hp_model *models[2];
    int i = layout == HP_LAYOUT_BATCHED;
    if (!models[i]) {
        hp_model_opts o = {.layout = layout};
        hp_err err;
        if (hp_model_from_config_text(&models[i], g_config, strlen(g_config), "config.json", &o, &err) != HP_OK)
            abort(); /* the embedded config is ours: failing here is a bug of the target */
    }
    return models[i];
}

static void one(const hp_model *m, const uint8_t *data, size_t size)
{
    hp_plan *p = NULL;
    hp_err err;
    if (hp__shard_plan_parse(&p, m, (const char *)data, size, "plan.json", &err) != HP_OK) {
        if (p != NULL || err.msg[0] == '\0') abort(); /* contract: on failure the output is NULL, the message set */
        return;
    }
    (void)hp_plan_preflight(p, NULL, &err);
    hp_plan_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    one(model(HP_LAYOUT_PER_EXPERT), data, size);
    one(model(HP_LAYOUT_BATCHED), data, size);
    return 0;
}
