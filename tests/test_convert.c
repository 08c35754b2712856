/* test_convert.c — a GGUF file as a Hugging Face folder (hyperpar/convert.h): the llama mapping (names, order,
 * the tied case, config.json) and each of its refusals, the tokenizer texts and theirs, and hp_convert_gguf's
 * folder (complete, or nothing at all: an --out that is not empty, a refused file, a full disk). The numbers
 * against transformers and the gguf package: tests/python/test_gguf_convert.py. */
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_build.h"
#include "hyperpar/convert.h"
#include "testlib.h"

/* What tiny() leaves out or changes. */
enum {
    T_TIED = 1,          /* no output.weight */
    T_ARCH_QWEN = 2,     /* general.architecture "qwen2" */
    T_NO_LAYERS = 4,     /* no llama.block_count */
    T_NO_FFN_UP = 8,     /* no blk.0.ffn_up.weight */
    T_EXTRA_BIAS = 16,   /* a blk.0.attn_q.bias */
    T_ROPE_FREQS = 32,   /* a rope_freqs.weight */
    T_BAD_SHAPE = 64,    /* blk.0.attn_k.weight with 3 kv heads' rows */
    T_Q5K = 128,         /* blk.0.ffn_down.weight as Q5_K */
    T_EXPERTS = 256,     /* llama.expert_count 4 */
    T_PRE_WEIRD = 512,   /* tokenizer.ggml.pre "weird" */
    T_DUP_TOKEN = 1024,  /* token 3 spelled like token 0 */
    T_BAD_MERGE = 2048,  /* merge "a c" */
    T_SPM = 4096,        /* tokenizer.ggml.model "llama" */
    T_LAYER_1 = 8192,    /* a blk.1.attn_q.weight in a one-layer model */
    T_VOCAB_KEY = 1 << 14,   /* llama.vocab_size 5 for 4 tokens */
    T_ROPE_LINEAR = 1 << 15, /* llama.rope.scaling.type linear, factor 4, original context 32 */
    T_ROPE_WEIRD = 1 << 16,  /* llama.rope.scaling.type "longrope" */
    T_BAD_UTF8 = 1 << 17,    /* token 1 is the byte 0xff */
    T_VALUE_LEN = 1 << 18,   /* llama.attention.value_length 32 with a head dim of 64 */
    T_TYPES_SHORT = 1 << 19, /* token_type with 3 entries for 4 tokens */
};

/* hidden 256, 4 heads of 64, 2 kv heads, feed-forward 512, one layer; a vocabulary of 4 tokens; every tensor F32
 * zeros except the Q5_K case. */
static unsigned char *tiny(size_t *len, unsigned flags)
{
    gfile g = {0};
    gf_kv_str(&g, "general.architecture", flags & T_ARCH_QWEN ? "qwen2" : "llama");
    gf_kv_u32(&g, "llama.context_length", 128);
    gf_kv_u32(&g, "llama.embedding_length", 256);
    if (!(flags & T_NO_LAYERS)) gf_kv_u32(&g, "llama.block_count", 1);
    gf_kv_u32(&g, "llama.feed_forward_length", 512);
    gf_kv_u32(&g, "llama.attention.head_count", 4);
    gf_kv_u32(&g, "llama.attention.head_count_kv", 2);
    gf_kv_f32(&g, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gf_kv_f32(&g, "llama.rope.freq_base", 500000.0f);
    if (flags & T_EXPERTS) gf_kv_u32(&g, "llama.expert_count", 4);
    if (flags & T_VOCAB_KEY) gf_kv_u32(&g, "llama.vocab_size", 5);
    if (flags & T_VALUE_LEN) gf_kv_u32(&g, "llama.attention.value_length", 32);
    if (flags & (T_ROPE_LINEAR | T_ROPE_WEIRD)) {
        gf_kv_str(&g, "llama.rope.scaling.type", flags & T_ROPE_LINEAR ? "linear" : "longrope");
        gf_kv_f32(&g, "llama.rope.scaling.factor", 4.0f);
        gf_kv_u32(&g, "llama.rope.scaling.original_context_length", 32);
    }
    gf_kv_str(&g, "tokenizer.ggml.model", flags & T_SPM ? "llama" : "gpt2");
    gf_kv_str(&g, "tokenizer.ggml.pre", flags & T_PRE_WEIRD ? "weird" : "smollm");
    const char *tokens[] = {"a", flags & T_BAD_UTF8 ? "\xff" : "b", "ab", flags & T_DUP_TOKEN ? "a" : "<s>"};
    gf_kv_strs(&g, "tokenizer.ggml.tokens", tokens, 4);
    const int32_t types[] = {1, 1, 1, 3};
    gf_kv_i32s(&g, "tokenizer.ggml.token_type", types, flags & T_TYPES_SHORT ? 3 : 4);
    const char *merges[] = {flags & (T_BAD_MERGE | T_BAD_UTF8) ? "a c" : "a b"};
    gf_kv_strs(&g, "tokenizer.ggml.merges", merges, 1);
    gf_kv_u32(&g, "tokenizer.ggml.bos_token_id", 3);
    gf_kv_u32(&g, "tokenizer.ggml.eos_token_id", 3);
    gf_kv_bool(&g, "tokenizer.ggml.add_bos_token", 1);
    gf_kv_str(&g, "tokenizer.chat_template", "{{ messages }}");
#define T2(name, a, b) gf_tensor(&g, name, 2, (uint64_t[]){a, b}, HP_GGML_F32, NULL, (size_t)(a) * (b) * 4)
#define T1(name, a) gf_tensor(&g, name, 1, (uint64_t[]){a}, HP_GGML_F32, NULL, (size_t)(a) * 4)
    T2("token_embd.weight", 256, 4);
    T1("blk.0.attn_norm.weight", 256);
    T2("blk.0.attn_q.weight", 256, 256);
    if (flags & T_BAD_SHAPE) T2("blk.0.attn_k.weight", 256, 192);
    else T2("blk.0.attn_k.weight", 256, 128);
    T2("blk.0.attn_v.weight", 256, 128);
    T2("blk.0.attn_output.weight", 256, 256);
    T1("blk.0.ffn_norm.weight", 256);
    T2("blk.0.ffn_gate.weight", 256, 512);
    if (!(flags & T_NO_FFN_UP)) T2("blk.0.ffn_up.weight", 256, 512);
    if (flags & T_Q5K) gf_tensor(&g, "blk.0.ffn_down.weight", 2, (uint64_t[]){512, 256}, HP_GGML_Q5_K, NULL,
                                 2 * 256 * 176);
    else T2("blk.0.ffn_down.weight", 512, 256);
    if (flags & T_EXTRA_BIAS) T1("blk.0.attn_q.bias", 256);
    if (flags & T_LAYER_1) T2("blk.1.attn_q.weight", 256, 256);
    if (flags & T_ROPE_FREQS) T1("rope_freqs.weight", 32);
    T1("output_norm.weight", 256);
    if (!(flags & T_TIED)) T2("output.weight", 256, 4);
#undef T1
#undef T2
    unsigned char *b = gf_image(&g, len);
    gf_free(&g);
    return b;
}

static hp_gguf_file *open_tiny(unsigned flags, unsigned char **img)
{
    size_t len;
    *img = tiny(&len, flags);
    hp_gguf_file *f = NULL;
    hp_err e;
    CHECK_MSG(hp_gguf_open_memory(&f, *img, len, "m.gguf", &e) == HP_OK, "%s", e.msg);
    return f;
}

/* hp_gguf_model_map of tiny(flags) fails with HP_ERR_INPUT mentioning needle. */
static void expect_map_error(unsigned flags, const char *needle)
{
    unsigned char *img;
    hp_gguf_file *f = open_tiny(flags, &img);
    if (f) {
        hp_gguf_model *g = (hp_gguf_model *)1;
        hp_err e;
        e.msg[0] = 0;
        CHECK(hp_gguf_model_map(&g, f, HP_DT_BF16, &e) == HP_ERR_INPUT && g == NULL);
        CHECK_STR_CONTAINS(e.msg, needle);
        CHECK_STR_CONTAINS(e.msg, "m.gguf: ");
    }
    hp_gguf_close(f);
    free(img);
}

TEST(llama_mapping)
{
    unsigned char *img;
    hp_gguf_file *f = open_tiny(0, &img);
    hp_gguf_model *g = NULL;
    hp_err e;
    CHECK_MSG(f && hp_gguf_model_map(&g, f, HP_DT_BF16, &e) == HP_OK, "%s", e.msg);
    if (g) {
        CHECK_EQ_INT(g->n_tensors, 12);
        CHECK(!g->tied);
        CHECK_STR_EQ(g->tensors[0].name, "model.embed_tokens.weight");
        CHECK(g->tensors[0].shape[0] == 4 && g->tensors[0].shape[1] == 256);
        CHECK_STR_EQ(g->tensors[1].name, "model.layers.0.self_attn.q_proj.weight");
        CHECK_STR_EQ(g->tensors[1].src->name, "blk.0.attn_q.weight");
        CHECK_EQ_INT(g->tensors[1].permute_heads, 4);
        CHECK_STR_EQ(g->tensors[2].name, "model.layers.0.self_attn.k_proj.weight");
        CHECK(g->tensors[2].permute_heads == 2 && g->tensors[2].shape[0] == 128);
        CHECK_EQ_INT(g->tensors[3].permute_heads, 0);
        CHECK_STR_EQ(g->tensors[7].name, "model.layers.0.mlp.down_proj.weight");
        CHECK(g->tensors[7].shape[0] == 256 && g->tensors[7].shape[1] == 512);
        CHECK_STR_EQ(g->tensors[10].name, "model.norm.weight");
        CHECK_STR_EQ(g->tensors[11].name, "lm_head.weight");
        json_t *c = json_loads(g->config_json, 0, NULL);
        CHECK(c != NULL);
        CHECK_STR_EQ(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)), "LlamaForCausalLM");
        CHECK_EQ_INT(json_integer_value(json_object_get(c, "num_key_value_heads")), 2);
        CHECK_EQ_INT(json_integer_value(json_object_get(c, "head_dim")), 64);
        CHECK_EQ_INT(json_integer_value(json_object_get(c, "vocab_size")), 4);
        CHECK(json_real_value(json_object_get(c, "rms_norm_eps")) == 1e-5); /* the f32's shortest decimal */
        CHECK(json_real_value(json_object_get(c, "rope_theta")) == 500000.0);
        CHECK(json_is_false(json_object_get(c, "tie_word_embeddings")));
        CHECK_STR_EQ(json_string_value(json_object_get(c, "torch_dtype")), "bfloat16");
        CHECK_EQ_INT(json_integer_value(json_object_get(c, "bos_token_id")), 3);
        json_decref(c);
        CHECK(g->model && g->model->n_params == 12);
        CHECK_STR_CONTAINS(g->generation_config_json, "\"eos_token_id\": 3");
    }
    hp_gguf_model_free(g);
    hp_gguf_close(f);
    free(img);
    f = open_tiny(T_TIED, &img);
    CHECK(f && hp_gguf_model_map(&g, f, HP_DT_F32, &e) == HP_OK);
    if (g) {
        CHECK(g->tied && g->n_tensors == 11);
        CHECK_STR_CONTAINS(g->config_json, "\"tie_word_embeddings\": true");
        CHECK_STR_CONTAINS(g->config_json, "\"torch_dtype\": \"float32\"");
    }
    hp_gguf_model_free(g);
    hp_gguf_close(f);
    free(img);
}

TEST(llama_mapping_refusals)
{
    expect_map_error(T_ARCH_QWEN, "architecture 'qwen2' is not supported; hyperpar converts GGUF models of the llama "
                                  "architecture");
    expect_map_error(T_NO_LAYERS, "metadata key 'llama.block_count' is missing; a llama model needs it");
    expect_map_error(T_NO_FFN_UP, "tensor 'blk.0.ffn_up.weight' is missing; a llama model needs it (transformers' "
                                  "model.layers.N.mlp.up_proj.weight)");
    expect_map_error(T_EXTRA_BIAS, "tensor 'blk.0.attn_q.bias' has no transformers name in the llama mapping");
    expect_map_error(T_LAYER_1, "tensor 'blk.1.attn_q.weight' has no transformers name in the llama mapping");
    expect_map_error(T_LAYER_1, "for N < llama.block_count = 1");
    expect_map_error(T_ROPE_FREQS, "tensor 'rope_freqs.weight' holds per-frequency rotary factors");
    expect_map_error(T_BAD_SHAPE, "tensor 'blk.0.attn_k.weight' has shape [192, 256] (transformers' order, GGUF's "
                                  "reversed) but the metadata (hidden 256, 4 heads of 64, 2 kv heads, feed-forward "
                                  "512, 4 tokens) make model.layers.0.self_attn.k_proj.weight [128, 256]");
    expect_map_error(T_Q5K, "tensor 'blk.0.ffn_down.weight' is Q5_K, which hyperpar cannot dequantize");
    expect_map_error(T_EXPERTS, "llama.expert_count is 4: a mixture-of-experts model");
    expect_map_error(T_VOCAB_KEY, "llama.vocab_size is 5 but tokenizer.ggml.tokens holds 4 tokens");
    expect_map_error(T_ROPE_WEIRD, "llama.rope.scaling.type is 'longrope'; convert carries over 'linear', 'yarn' and "
                                   "'none'");
    expect_map_error(T_VALUE_LEN, "llama.attention.value_length 32 differs from the head dim 64");
}

TEST(rope_scaling_carries_over)
{
    unsigned char *img;
    hp_gguf_file *f = open_tiny(T_ROPE_LINEAR, &img);
    hp_gguf_model *g = NULL;
    hp_err e;
    CHECK_MSG(f && hp_gguf_model_map(&g, f, HP_DT_BF16, &e) == HP_OK, "%s", e.msg);
    if (g) {
        json_t *c = json_loads(g->config_json, 0, NULL), *r = json_object_get(c, "rope_scaling");
        CHECK_STR_EQ(json_string_value(json_object_get(r, "rope_type")), "linear");
        CHECK(json_real_value(json_object_get(r, "factor")) == 4.0);
        CHECK_EQ_INT(json_integer_value(json_object_get(r, "original_max_position_embeddings")), 32);
        json_decref(c);
    }
    hp_gguf_model_free(g);
    hp_gguf_close(f);
    free(img);
}

/* hp_gguf_tokenizer of tiny(flags): HP_OK with the texts, or HP_ERR_INPUT naming needle. */
static void tokenizer_of(unsigned flags, char **tj, char **tc, hp_status want, const char *needle)
{
    unsigned char *img;
    hp_gguf_file *f = open_tiny(flags, &img);
    hp_err e;
    e.msg[0] = 0;
    *tj = *tc = NULL;
    hp_status st = f ? hp_gguf_tokenizer(f, tj, tc, &e) : HP_ERR_IO;
    CHECK_MSG(st == want, "status %d: %s", (int)st, e.msg);
    if (needle) CHECK_STR_CONTAINS(e.msg, needle);
    hp_gguf_close(f);
    free(img);
}

TEST(tokenizer_texts)
{
    char *tj, *tc;
    tokenizer_of(0, &tj, &tc, HP_OK, NULL);
    json_t *t = tj ? json_loads(tj, 0, NULL) : NULL, *c = tc ? json_loads(tc, 0, NULL) : NULL;
    CHECK(t && c);
    if (t && c) {
        json_t *model = json_object_get(t, "model");
        CHECK_STR_EQ(json_string_value(json_object_get(model, "type")), "BPE");
        CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(model, "vocab"), "ab")), 2);
        CHECK_STR_EQ(json_string_value(json_array_get(json_object_get(model, "merges"), 0)), "a b");
        json_t *added = json_object_get(t, "added_tokens");
        CHECK(json_array_size(added) == 1);
        CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(added, 0), "content")), "<s>");
        CHECK(json_is_true(json_object_get(json_array_get(added, 0), "special")));
        json_t *pre = json_object_get(json_object_get(t, "pre_tokenizer"), "pretokenizers");
        CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(pre, 0), "type")), "Digits");
        CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(pre, 1), "type")), "ByteLevel");
        json_t *pp = json_object_get(t, "post_processor"); /* add_bos_token: ByteLevel, then bos */
        CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(json_object_get(pp, "processors"), 1), "type")),
                     "TemplateProcessing");
        CHECK_STR_EQ(json_string_value(json_object_get(c, "bos_token")), "<s>");
        CHECK_STR_EQ(json_string_value(json_object_get(c, "chat_template")), "{{ messages }}");
        CHECK_EQ_INT(json_integer_value(json_object_get(c, "model_max_length")), 128);
        CHECK(json_is_true(json_object_get(json_object_get(json_object_get(c, "added_tokens_decoder"), "3"),
                                           "special")));
    }
    json_decref(t);
    json_decref(c);
    free(tj);
    free(tc);
    tokenizer_of(T_PRE_WEIRD, &tj, &tc, HP_ERR_INPUT, "m.gguf: tokenizer.ggml.pre is 'weird'; convert knows the "
                                                      "pre-tokenizers 'smollm', 'llama-bpe', 'qwen2' and 'gpt-2'");
    tokenizer_of(T_SPM, &tj, &tc, HP_ERR_INPUT, "tokenizer.ggml.model is 'llama'; convert writes byte-level BPE");
    tokenizer_of(T_DUP_TOKEN, &tj, &tc, HP_ERR_INPUT, "tokenizer.ggml.tokens: token 3 'a' is also token 0");
    tokenizer_of(T_BAD_MERGE, &tj, &tc, HP_ERR_INPUT, "tokenizer.ggml.merges: merge 0 'a c' is not two tokens of the "
                                                      "vocabulary");
    tokenizer_of(T_BAD_UTF8, &tj, &tc, HP_ERR_INPUT, "m.gguf: token 1 ('\\xFF') is not valid UTF-8 text without NUL "
                                                     "bytes; tokenizer.json cannot hold it");
    tokenizer_of(T_TYPES_SHORT, &tj, &tc, HP_ERR_INPUT, "tokenizer.ggml.token_type has 3 entries for 4 tokens");
    CHECK(tj == NULL && tc == NULL);
}

static bool exists(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static void write_file(const char *p, const unsigned char *b, size_t n)
{
    FILE *fp = fopen(p, "wb");
    CHECK(fp && fwrite(b, 1, n, fp) == n);
    if (fp) fclose(fp);
}

TEST(convert_folder_whole_or_nothing)
{
    char dir[256], in[300], out[300], bad[300];
    test_tmpdir(dir, sizeof dir);
    snprintf(in, sizeof in, "%s/m.gguf", dir);
    snprintf(bad, sizeof bad, "%s/bad.gguf", dir);
    snprintf(out, sizeof out, "%s/hf", dir);
    size_t len;
    unsigned char *img = tiny(&len, T_TIED);
    write_file(in, img, len);
    free(img);
    img = tiny(&len, T_PRE_WEIRD);
    write_file(bad, img, len);
    free(img);
    hp_convert_opts o;
    hp_convert_opts_default(&o);
    o.out = out;
    hp_convert_stats s;
    hp_err e;
    CHECK_MSG(hp_convert_gguf(in, &o, &s, &e) == HP_OK, "%s", e.msg);
    const char *names[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json"};
    for (int i = 0; i < 5; i++) CHECK_MSG(exists(out, names[i]), "%s", names[i]);
    CHECK(s.n_tensors == 11 && s.tied && s.bytes == 2ull * (4 * 256 + 3 * 256 + 256 * 256 * 2 + 2 * 256 * 128 +
                                                             3 * 256 * 512));
    hp_st_file *st = NULL;
    char mp[400];
    snprintf(mp, sizeof mp, "%s/model.safetensors", out);
    CHECK(hp_st_open(&st, mp, &e) == HP_OK && hp_st_count(st) == 11 &&
          hp_st_find(st, "model.embed_tokens.weight")->dtype == HP_DT_BF16 && !hp_st_find(st, "lm_head.weight"));
    hp_st_close(st);
    /* an --out that is not empty */
    CHECK(hp_convert_gguf(in, &o, &s, &e) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(e.msg, "convert: --out");
    CHECK_STR_CONTAINS(e.msg, "is not empty");
    /* a refused file leaves no folder */
    snprintf(out, sizeof out, "%s/hf2", dir);
    o.out = out;
    CHECK(hp_convert_gguf(bad, &o, &s, &e) == HP_ERR_INPUT && access(out, F_OK) != 0);
    /* a full disk while writing the weights: nothing left, not even the temporary folder */
    hp_test_hooks small_disk = {.full_disk = true, .enospc_after = 20000};
    hp_test_hooks_install(&small_disk);
    hp_status rc = hp_convert_gguf(in, &o, &s, &e);
    hp_test_hooks off = {0};
    hp_test_hooks_install(&off);
    CHECK_MSG(rc == HP_ERR_IO, "%s", e.msg);
    CHECK_STR_CONTAINS(e.msg, "No space left on device");
    CHECK(access(out, F_OK) != 0);
    DIR *d = opendir(dir);
    int others = 0;
    for (struct dirent *de; d && (de = readdir(d));) others += strstr(de->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    CHECK_EQ_INT(others, 0);
}

TEST_MAIN()
