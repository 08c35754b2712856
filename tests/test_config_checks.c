/*
 * test_config_checks.c — config.json semantics against transformers: each family's config-class defaults
 * for absent keys, impossible values refused with the key's line:col, config.json that contradicts the
 * weights beside it, inputs that are not regular files (never a blocking open), and gen's option edges.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperpar/gen.h"
#include "hyperpar/model.h"
#include "testlib.h"

static hp_model *open_text(const char *text, hp_err *err)
{
    hp_model *m = NULL;
    hp_err_clear(err);
    hp_model_from_config_text(&m, text, strlen(text), "config.json", NULL, err);
    return m;
}

/* Expects text to be refused as bad input with needle in the message. */
static void expect_refused_at(const char *text, const char *needle, int line)
{
    hp_err err;
    hp_model *m = open_text(text, &err);
    CHECK_MSG(m == NULL, "line %d: accepted: %s", line, text);
    CHECK_MSG(err.status == HP_ERR_INPUT, "line %d: status %d", line, (int)err.status);
    CHECK_MSG(strstr(err.msg, needle) != NULL, "line %d: \"%s\" lacks \"%s\"", line, err.msg, needle);
    hp_model_close(m);
}
#define EXPECT_REFUSED(text, needle) expect_refused_at(text, needle, __LINE__)

/* A small valid body per family; the test appends or overrides keys. */
#define SMALL "\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 32, " \
              "\"intermediate_size\": 96"

TEST(absent_keys_take_each_family_config_class_default)
{
    hp_err err;
    /* Qwen3Config.head_dim defaults to 128 (not hidden_size / heads = 16) and num_key_value_heads to 32. */
    hp_model *m = open_text("{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_hidden_layers\": 1, "
                            "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 32, "
                            "\"intermediate_size\": 96}",
                            &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (m) {
        CHECK_EQ_INT(m->cfg.head_dim, 128);
        const hp_param *q = hp_model_find_param(m, "model.layers.0.self_attn.q_proj.weight");
        CHECK(q && q->shape[0] == 4 * 128 && q->shape[1] == 64);
        const hp_param *qn = hp_model_find_param(m, "model.layers.0.self_attn.q_norm.weight");
        CHECK(qn && qn->shape[0] == 128);
    }
    hp_model_close(m);

    static const struct {
        const char *family;
        int64_t kv_heads, head_dim; /* the values absent keys get; -1: derived (heads, hidden // heads) */
    } cases[] = {
        {"llama", -1, -1},     /* None -> heads, H // nH */
        {"mistral", 8, -1},    /* MistralConfig num_key_value_heads = 8 */
        {"qwen2", 32, -1},     /* Qwen2Config num_key_value_heads = 32 */
        {"qwen3", 32, 128},    /* Qwen3Config head_dim = 128 */
        {"mixtral", 8, -1},
        {"qwen2_moe", 16, -1},
        {"qwen3_moe", 4, -1},  /* Qwen3MoeConfig num_key_value_heads = 4, no head_dim field */
        {"glm4_moe", 8, -1},
        {"gpt_oss", 8, 64},    /* GptOssConfig head_dim = 64 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        /* 32 heads so that every default kv count divides them. */
        char text[512];
        snprintf(text, sizeof text,
                 "{\"model_type\": \"%s\", \"hidden_size\": 512, \"num_hidden_layers\": 1, \"num_attention_heads\": "
                 "32, \"vocab_size\": 32, \"intermediate_size\": 96, \"moe_intermediate_size\": 8, \"num_experts\": "
                 "8, \"num_local_experts\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"n_group\": 1, "
                 "\"topk_group\": 1}",
                 cases[i].family);
        m = open_text(text, &err);
        CHECK_MSG(m != NULL, "%s: %s", cases[i].family, err.msg);
        if (!m) continue;
        int64_t want_kv = cases[i].kv_heads < 0 ? 32 : cases[i].kv_heads;
        int64_t want_hd = cases[i].head_dim < 0 ? 512 / 32 : cases[i].head_dim;
        CHECK_MSG(m->cfg.num_key_value_heads == want_kv, "%s: kv %lld want %lld", cases[i].family,
                  (long long)m->cfg.num_key_value_heads, (long long)want_kv);
        CHECK_MSG(m->cfg.head_dim == want_hd, "%s: head_dim %lld want %lld", cases[i].family,
                  (long long)m->cfg.head_dim, (long long)want_hd);
        hp_model_close(m);
    }

    /* An explicit null is transformers' None: num_key_value_heads = heads, head_dim = H // nH. */
    m = open_text("{\"model_type\": \"qwen3\", " SMALL ", \"num_key_value_heads\": null, \"head_dim\": null}", &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (m) {
        CHECK_EQ_INT(m->cfg.num_key_value_heads, 4);
        CHECK_EQ_INT(m->cfg.head_dim, 16);
    }
    hp_model_close(m);

    /* DeepseekV3Config: routed_scaling_factor 2.5, norm_topk_prob true, n_group 8, topk_group 4, one shared
     * expert; q_lora_rank null means no query LoRA (q_proj). */
    m = open_text("{\"model_type\": \"deepseek_v3\", " SMALL ", \"num_key_value_heads\": 4, \"moe_intermediate_size\": "
                  "8, \"n_routed_experts\": 16, \"num_experts_per_tok\": 2, \"kv_lora_rank\": 8, \"q_lora_rank\": "
                  "null, \"qk_rope_head_dim\": 4, \"qk_nope_head_dim\": 4, \"v_head_dim\": 4, "
                  "\"first_k_dense_replace\": 1}",
                  &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (m) {
        CHECK(m->cfg.routed_scaling_factor == 2.5);
        CHECK(m->cfg.norm_topk_prob);
        CHECK_EQ_INT(m->cfg.n_group, 8);
        CHECK_EQ_INT(m->cfg.topk_group, 4);
        CHECK_EQ_INT(m->cfg.shared_intermediate_size, 8);
        CHECK(hp_model_find_param(m, "model.layers.0.self_attn.q_proj.weight") != NULL);
        CHECK(hp_model_find_param(m, "model.layers.0.self_attn.q_a_proj.weight") == NULL);
    }
    hp_model_close(m);

    /* Sizes config.json leaves out entirely come from the config class too (LlamaConfig: 32 layers). */
    m = open_text("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_attention_heads\": 4, \"vocab_size\": 8, "
                  "\"intermediate_size\": 8}",
                  &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (m) CHECK_EQ_INT(m->cfg.num_hidden_layers, 32);
    hp_model_close(m);
}

TEST(impossible_values_are_refused_with_their_position)
{
    EXPECT_REFUSED("{\"model_type\": \"qwen3_moe\", " SMALL ", \"moe_intermediate_size\": 8, \"num_experts\": 8,\n"
                   "\"num_experts_per_tok\": 9}",
                   "config.json:2:24: num_experts_per_tok 9 is greater than the 8 routed experts");
    EXPECT_REFUSED("{\"model_type\": \"llama\", " SMALL ",\n\"num_key_value_heads\": 8}",
                   "config.json:2:24: num_key_value_heads 8 is greater than num_attention_heads 4");
    EXPECT_REFUSED("{\"model_type\": \"mistral\", " SMALL ", \"num_key_value_heads\": 3}",
                   "num_key_value_heads 3 does not divide num_attention_heads 4");
    /* Explicit zeros are not "absent": they used to be replaced by the default silently. */
    EXPECT_REFUSED("{\"model_type\": \"llama\", " SMALL ",\n  \"num_key_value_heads\": 0}",
                   "config.json:2:26: field \"num_key_value_heads\" is 0, but it must be at least 1");
    EXPECT_REFUSED("{\"model_type\": \"qwen3\", " SMALL ", \"head_dim\": 0}", "field \"head_dim\" is 0");
    EXPECT_REFUSED("{\"model_type\": \"qwen3_moe\", " SMALL ", \"num_experts\": 8, \"decoder_sparse_step\": 0}",
                   "field \"decoder_sparse_step\" is 0");
    EXPECT_REFUSED("{\"model_type\": \"llama\", \"vocab_size\": 0}", "field \"vocab_size\" is 0");
    EXPECT_REFUSED("{\"model_type\": \"deepseek_v3\", " SMALL ", \"n_group\": 0}", "field \"n_group\" is 0");
    EXPECT_REFUSED("{\"model_type\": \"deepseek_v3\", " SMALL ", \"num_key_value_heads\": 4, "
                   "\"routed_scaling_factor\": -2.5}",
                   "routed_scaling_factor -2.5 would negate every routed expert's output");
    EXPECT_REFUSED("{\"model_type\": \"deepseek_v3\", " SMALL ", \"num_key_value_heads\": 4, "
                   "\"routed_scaling_factor\": 0}",
                   "routed_scaling_factor 0 would zero");
    EXPECT_REFUSED("{\"model_type\": \"gpt_oss\", " SMALL ", \"num_key_value_heads\": 4, \"swiglu_limit\": -7}",
                   "swiglu_limit -7 is negative");
    /* model_type and architectures naming two families. */
    EXPECT_REFUSED("{\"architectures\": [\"Qwen2ForCausalLM\"],\n \"model_type\": \"llama\", " SMALL "}",
                   "config.json:2:16: model_type \"llama\" (family llama) contradicts architectures[0] "
                   "\"Qwen2ForCausalLM\" (family qwen2)");
    /* Grouped routing (DeepSeek-V3, GLM4-MoE): groups must split the experts evenly, in groups of 2 or more. */
    const char *ds = "{\"model_type\": \"deepseek_v3\", " SMALL ", \"moe_intermediate_size\": 8, "
                     "\"n_routed_experts\": 8, \"kv_lora_rank\": 8, \"qk_rope_head_dim\": 4, \"qk_nope_head_dim\": 4, "
                     "\"v_head_dim\": 4, ";
    char text[1024];
    snprintf(text, sizeof text, "%s\"num_key_value_heads\": 4, \"num_experts_per_tok\": 2, \"n_group\": 3, \"topk_group\": 1}", ds);
    EXPECT_REFUSED(text, "n_group 3 does not divide the 8 routed experts");
    snprintf(text, sizeof text, "%s\"num_key_value_heads\": 4, \"num_experts_per_tok\": 2, \"n_group\": 4, \"topk_group\": 5}", ds);
    EXPECT_REFUSED(text, "topk_group 5 is greater than n_group 4");
    snprintf(text, sizeof text, "%s\"num_key_value_heads\": 4, \"num_experts_per_tok\": 2, \"n_group\": 8, \"topk_group\": 8}", ds);
    EXPECT_REFUSED(text, "leaves groups of 1 expert");
    snprintf(text, sizeof text, "%s\"num_key_value_heads\": 4, \"n_group\": 4, \"topk_group\": 1, \"num_experts_per_tok\": 3}", ds);
    EXPECT_REFUSED(text, "num_experts_per_tok 3 is more than the 2 experts of the topk_group 1 groups");
    /* MLA expands k and v to every head. */
    snprintf(text, sizeof text, "%s\"num_experts_per_tok\": 2, \"n_group\": 1, \"topk_group\": 1, \"num_key_value_heads\": 2}", ds);
    EXPECT_REFUSED(text, "num_key_value_heads 2 differs from num_attention_heads 4");
    /* LlamaConfig refuses hidden_size % heads != 0; a family that floors still needs a head_dim above 0. */
    EXPECT_REFUSED("{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, "
                   "\"num_attention_heads\": 5, \"vocab_size\": 8, \"intermediate_size\": 8}",
                   "hidden_size 64 is not divisible by num_attention_heads 5");
    EXPECT_REFUSED("{\"model_type\": \"mistral\", \"hidden_size\": 4, \"num_hidden_layers\": 1, "
                   "\"num_attention_heads\": 8, \"num_key_value_heads\": 8, \"vocab_size\": 8, \"intermediate_size\": 8}",
                   "the default head_dim (hidden_size // num_attention_heads) is 0");
    /* The same values are fine where they are meaningful. */
    hp_err err;
    hp_model *m = open_text("{\"model_type\": \"mistral\", \"hidden_size\": 60, \"num_hidden_layers\": 1, "
                            "\"num_attention_heads\": 8, \"num_key_value_heads\": 8, \"vocab_size\": 8, "
                            "\"intermediate_size\": 8}",
                            &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (m) CHECK_EQ_INT(m->cfg.head_dim, 7); /* MistralConfig: hidden_size // num_attention_heads */
    hp_model_close(m);
    m = open_text("{\"model_type\": \"qwen2_moe\", " SMALL ", \"num_key_value_heads\": 4, \"num_experts\": 0}", &err);
    CHECK_MSG(m != NULL, "a Qwen-MoE config with 0 experts is a dense model: %s", err.msg);
    hp_model_close(m);
}

/* ---- config.json against the weights ---- */

/* The run's scratch folder (testlib.h), removed at exit. */
#define g_base test_work_dir("cfgchk")

static const char *gen_into(const char *name, const char *family, int64_t layers, int64_t experts)
{
    static char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", g_base, name);
    hp_gen_opts o;
    hp_gen_opts_default(&o);
    o.family = family;
    o.layers = layers;
    o.experts = experts;
    hp_err err;
    CHECK_MSG(hp_gen_checkpoint(&o, dir, &err) == HP_OK, "%s", err.msg);
    return dir;
}

/* Replaces `"key": <old>` by `"key": value` in dir/config.json. */
static bool set_key(const char *dir, const char *key, const char *value)
{
    char path[300], cmd[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"%s\": [^,}]*/\"%s\": %s/' '%s'", key, key, value, path);
    return system(cmd) == 0;
}

static void expect_open_refused(const char *path, const char *n1, const char *n2, int line)
{
    hp_model *m = NULL;
    hp_err err;
    hp_status st = hp_model_open(&m, path, NULL, &err);
    CHECK_MSG(st == HP_ERR_INPUT, "line %d: status %d (%s)", line, (int)st, st ? err.msg : "opened");
    CHECK_MSG(m == NULL, "line %d", line);
    if (st != HP_OK) {
        CHECK_MSG(strstr(err.msg, n1) != NULL, "line %d: \"%s\" lacks \"%s\"", line, err.msg, n1);
        if (n2) CHECK_MSG(strstr(err.msg, n2) != NULL, "line %d: \"%s\" lacks \"%s\"", line, err.msg, n2);
    }
    hp_model_close(m);
}
#define EXPECT_OPEN_REFUSED(path, n1, n2) expect_open_refused(path, n1, n2, __LINE__)

TEST(config_that_contradicts_the_weights_is_refused)
{
    const char *dir = gen_into("experts", "qwen3_moe", 2, 8);
    CHECK(dir && set_key(dir, "num_experts", "16"));
    EXPECT_OPEN_REFUSED(dir, "config.json does not describe the weights beside it",
                        "it says 16 routed experts (num_experts) but the weights hold 8");
    dir = gen_into("experts_b", "qwen3_moe", 2, 8);
    CHECK(dir && set_key(dir, "num_experts", "4"));
    EXPECT_OPEN_REFUSED(dir, "it says 4 routed experts", "beyond the 4 routed experts");

    dir = gen_into("layers", "qwen3_moe", 2, 8);
    CHECK(dir && set_key(dir, "num_hidden_layers", "5"));
    EXPECT_OPEN_REFUSED(dir, "it says num_hidden_layers 5 but the weights hold layers 0..1",
                        "Fix config.json to match the weights");
    dir = gen_into("layers_b", "llama", 3, 8);
    CHECK(dir && set_key(dir, "num_hidden_layers", "2"));
    EXPECT_OPEN_REFUSED(dir, "it says num_hidden_layers 2 but the weights hold layers 0..2",
                        "is in layer 2, beyond num_hidden_layers 2");

    dir = gen_into("hidden", "mixtral", 2, 8);
    CHECK(dir && set_key(dir, "hidden_size", "32"));
    EXPECT_OPEN_REFUSED(dir, "it says hidden_size 32 but model.embed_tokens.weight is [128, 64]", NULL);
    dir = gen_into("inter", "qwen2_moe", 2, 8);
    CHECK(dir && set_key(dir, "moe_intermediate_size", "16"));
    EXPECT_OPEN_REFUSED(dir, "tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' is [32, 64] in the weights but "
                        "[16, 64] by config.json", NULL);

    /* The layer layout: which layers are sparse (each family's rule), optional tensors, the output head. */
    dir = gen_into("step", "qwen3_moe", 2, 8);
    CHECK(dir && set_key(dir, "decoder_sparse_step", "2"));
    EXPECT_OPEN_REFUSED(dir, "config.json does not describe the weights beside it",
                        "layer 0 is dense by config.json (decoder_sparse_step 2) but the weights hold experts for it");
    dir = gen_into("mlp_only", "qwen2_moe", 3, 8);
    CHECK(dir && set_key(dir, "mlp_only_layers", "[2]"));
    EXPECT_OPEN_REFUSED(dir, "layer 2 is dense by config.json (decoder_sparse_step 1, mlp_only_layers [2])", NULL);
    dir = gen_into("first_k", "deepseek_v3", 3, 8);
    CHECK(dir && set_key(dir, "first_k_dense_replace", "5"));
    EXPECT_OPEN_REFUSED(dir, "layer 1 is dense by config.json (first_k_dense_replace 5)", "(2 in all)");
    dir = gen_into("first_k0", "glm4_moe", 2, 8);
    CHECK(dir && set_key(dir, "first_k_dense_replace", "0"));
    EXPECT_OPEN_REFUSED(dir, "layer 0 is sparse by config.json (first_k_dense_replace 0) but the weights hold no "
                        "experts for it", NULL);
    dir = gen_into("bias", "llama", 2, 8);
    CHECK(dir && set_key(dir, "attention_bias", "true"));
    EXPECT_OPEN_REFUSED(dir, "attention_bias is true, but the weights hold no '*.self_attn.q_proj.bias' tensor", NULL);
    dir = gen_into("bias_mla", "deepseek_v3", 2, 8);
    CHECK(dir && set_key(dir, "attention_bias", "true"));
    EXPECT_OPEN_REFUSED(dir, "attention_bias is true, but the weights hold no '*.self_attn.q_a_proj.bias' tensor", NULL);
    dir = gen_into("bias_off", "gpt_oss", 2, 8);
    CHECK(dir && set_key(dir, "attention_bias", "false"));
    EXPECT_OPEN_REFUSED(dir, "the weights hold 'model.layers.0.self_attn.q_proj.bias', but attention_bias is false",
                        NULL);
    dir = gen_into("qkv_bias", "qwen2_moe", 2, 8);
    CHECK(dir && set_key(dir, "qkv_bias", "false"));
    EXPECT_OPEN_REFUSED(dir, "but qkv_bias is false", NULL);
    dir = gen_into("qk_norm", "glm4_moe", 2, 8);
    CHECK(dir && set_key(dir, "use_qk_norm", "true"));
    EXPECT_OPEN_REFUSED(dir, "use_qk_norm is true, but the weights hold no '*.self_attn.q_norm.weight' tensor", NULL);
    dir = gen_into("tied", "mixtral", 2, 8);
    CHECK(dir && set_key(dir, "tie_word_embeddings", "true"));
    EXPECT_OPEN_REFUSED(dir, "tie_word_embeddings is true (lm_head shares model.embed_tokens.weight) but the weights "
                        "hold a separate lm_head.weight", NULL);
    /* qwen2 has q/k/v biases without a flag: a config saying attention_bias changes nothing (the flag is not
     * qwen2's), and its generated weights open. */
    dir = gen_into("qwen2", "qwen2", 2, 8);
    hp_model *m = NULL;
    hp_err err;
    CHECK_MSG(dir && hp_model_open(&m, dir, NULL, &err) == HP_OK, "%s", err.msg);
    hp_model_close(m);

    /* The generated checkpoints themselves open (and so do the golden ones, see test_model). */
    dir = gen_into("fine", "deepseek_v3", 2, 8);
    CHECK_MSG(dir && hp_model_open(&m, dir, NULL, &err) == HP_OK, "%s", err.msg);
    hp_model_close(m);
    /* A config that names only the family says nothing to disagree with. */
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"model_type\": \"deepseek_v3\"}", f);
        fclose(f);
    }
    CHECK_MSG(hp_model_open(&m, dir, NULL, &err) == HP_OK, "%s", err.msg);
    hp_model_close(m);
}

TEST(checkpoint_without_tensors_is_refused)
{
    if (!gen_into("seed", "llama", 1, 8)) return;
    char dir[256], p[300];
    snprintf(dir, sizeof dir, "%s/empty", g_base);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    if (f) {
        const char hdr[] = "{}      "; /* an 8-byte header holding no tensor */
        unsigned char len[8] = {8, 0, 0, 0, 0, 0, 0, 0};
        fwrite(len, 1, 8, f);
        fwrite(hdr, 1, 8, f);
        fclose(f);
    }
    EXPECT_OPEN_REFUSED(dir, "the checkpoint holds no tensors", NULL);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    f = fopen(p, "w");
    if (f) {
        fputs("{\"metadata\": {}, \"weight_map\": {}}", f);
        fclose(f);
    }
    EXPECT_OPEN_REFUSED(p, "\"weight_map\" is empty", NULL);
}

TEST(paths_that_are_not_files_are_named_and_never_block)
{
    if (!gen_into("seed2", "llama", 1, 8)) return;
    char p[300], q[300];
    snprintf(p, sizeof p, "%s/pipe.json", g_base);
    CHECK(mkfifo(p, 0600) == 0);
    EXPECT_OPEN_REFUSED(p, "is a FIFO (named pipe)", NULL);
    /* A folder whose config.json is a FIFO: meta mode refuses it instead of blocking on it. */
    snprintf(q, sizeof q, "%s/fifo_cfg", g_base);
    CHECK(mkdir(q, 0755) == 0);
    snprintf(p, sizeof p, "%s/fifo_cfg/config.json", g_base);
    CHECK(mkfifo(p, 0600) == 0);
    EXPECT_OPEN_REFUSED(q, "config.json: cannot open: the path is a FIFO", NULL);
    /* A checkpoint folder whose config.json is a FIFO is refused too (it used to be skipped silently). */
    snprintf(p, sizeof p, "%s/seed2/config.json", g_base);
    CHECK(unlink(p) == 0 && mkfifo(p, 0600) == 0);
    snprintf(q, sizeof q, "%s/seed2", g_base);
    EXPECT_OPEN_REFUSED(q, "config.json: cannot open: the path is a FIFO", NULL);
    /* A symbolic-link loop and a device are named, not "no such file or folder". */
    snprintf(p, sizeof p, "%s/loop1", g_base);
    snprintf(q, sizeof q, "%s/loop2", g_base);
    CHECK(symlink(q, p) == 0 && symlink(p, q) == 0);
    EXPECT_OPEN_REFUSED(p, "symbolic-link loop", NULL);
    EXPECT_OPEN_REFUSED("/dev/null", "/dev/null: the path is a character device", NULL);
    snprintf(p, sizeof p, "%s/nothing", g_base);
    EXPECT_OPEN_REFUSED(p, "nothing: no such file or folder", NULL);
}

TEST(gen_seed_and_out_edges)
{
    hp_gen_opts o;
    hp_gen_opts_default(&o);
    hp_err err;
    /* Seeds above INT64_MAX are distinct seeds, not clamped. */
    char a[300], b[300], cmd[700];
    snprintf(a, sizeof a, "%s/s_max", g_base);
    snprintf(b, sizeof b, "%s/s_i64", g_base);
    o.seed = UINT64_MAX;
    CHECK(hp_gen_checkpoint(&o, a, &err) == HP_OK);
    o.seed = (uint64_t)INT64_MAX;
    CHECK(hp_gen_checkpoint(&o, b, &err) == HP_OK);
    snprintf(cmd, sizeof cmd, "cmp -s '%s/model.safetensors' '%s/model.safetensors'", a, b);
    CHECK(system(cmd) != 0);
    /* --out must name a folder of its own. */
    static const char *bad[] = {"", ".", "..", "/", "x/.", "x/..", "./"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(hp_gen_checkpoint(&o, bad[i], &err) == HP_ERR_INPUT, "'%s'", bad[i]);
        CHECK_STR_CONTAINS(err.msg, "does not name a folder of its own");
    }
    /* gpt-oss has only the batched layout; gen says what it writes. */
    o.family = "gpt_oss";
    o.layout = HP_LAYOUT_PER_EXPERT;
    CHECK(hp_gen_layout(&o) == HP_LAYOUT_BATCHED);
    o.family = "qwen3_moe";
    CHECK(hp_gen_layout(&o) == HP_LAYOUT_PER_EXPERT);
    /* The expert limit gen documents is the one it checks. */
    o.experts = HP_GEN_MAX_EXPERTS + 1;
    char *text = NULL;
    CHECK(hp_gen_config_text(&o, &text, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "experts <= 4096");
    free(text);
}

TEST_MAIN()
