/*
 * gguf_tokenizer.c — the byte-level BPE tokenizer a GGUF file carries, written as Hugging Face tokenizers'
 * tokenizer.json and transformers' tokenizer_config.json (docs/gguf.md, "Tokenizer").
 *
 * What the GGUF file holds (tokenizer.ggml.*) and where it goes:
 *
 *   model = "gpt2"                  model.type "BPE" (byte-level: tokens are already in GPT-2's byte-to-unicode
 *                                   alphabet, so they are copied as they are)
 *   tokens[i]                       model.vocab {token: i}; every id once, every token once
 *   merges[k] = "a b"               model.merges[k], with a, b and ab in the vocabulary (as tokenizers requires)
 *   token_type[i] CONTROL (3)       added_tokens, special: true   (<|im_start|>, <|begin_of_text|>)
 *                 USER_DEFINED (4)  added_tokens, special: false
 *   pre                             normalizer + pre_tokenizer (+ ignore_merges), from the table below
 *   add_bos_token / add_eos_token   post_processor: TemplateProcessing around ByteLevel
 *   bos / eos / unknown / padding   tokenizer_config.json's bos_token, eos_token, unk_token, pad_token
 *   chat_template                   tokenizer_config.json's chat_template
 *
 * The pre-tokenizers are those of the models' own tokenizer.json files, under llama.cpp's names for them.
 */
#include "hyperpar/convert.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* llama.cpp's token types (tokenizer.ggml.token_type). */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* Llama 3's split: contractions, letters with one leading non-letter, digits in runs of up to three, punctuation,
 * newlines, spaces. Qwen2's is the same with one digit at a time. */
#define RE_HEAD "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
#define RE_TAIL "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct pre_rule {
    const char *name;    /* tokenizer.ggml.pre */
    const char *split;   /* a Split regex (Isolated) before ByteLevel without its own regex; NULL: ByteLevel's
                            GPT-2 regex */
    bool digits;         /* Digits (individual_digits) first */
    bool nfc;            /* NFC normalizer */
    bool ignore_merges;  /* a whole word in the vocabulary is taken as it is (Llama 3) */
    bool trim_offsets;   /* ByteLevel pre-tokenizer's trim_offsets, as the model's file has it */
} pre_rule;

static const pre_rule g_pre[] = {
    {"smollm", NULL, true, false, false, true},
    {"llama-bpe", RE_HEAD "\\p{N}{1,3}" RE_TAIL, false, false, true, true},
    {"qwen2", RE_HEAD "\\p{N}" RE_TAIL, false, true, false, false},
    {"gpt-2", NULL, false, false, false, true},
    {"gpt2", NULL, false, false, false, true},
};
#define N_PRE (sizeof g_pre / sizeof *g_pre)

/* ---- the vocabulary as a hash set (id by token), for duplicates and merges ---- */

typedef struct vocab_index {
    const hp_gguf_str *tok; /* [n] */
    int64_t *slot;          /* [mask + 1] id + 1, 0: empty */
    uint64_t mask;
} vocab_index;

static uint64_t str_hash(const char *s, size_t n) { return hp_hash64_bytes(s, n, 0x6767756621ull); }

/* The id of s[0, n), or -1. */
static int64_t vocab_find(const vocab_index *v, const char *s, size_t n)
{
    for (uint64_t h = str_hash(s, n) & v->mask;; h = (h + 1) & v->mask) {
        int64_t id = v->slot[h] - 1;
        if (id < 0) return -1;
        if (v->tok[id].len == n && memcmp(v->tok[id].s, s, n) == 0) return id;
    }
}

static hp_status vocab_build(vocab_index *v, const hp_gguf_file *f, const hp_gguf_kv *tokens, hp_err *err)
{
    uint64_t cap = 16;
    while (cap < 2 * tokens->n) cap *= 2;
    v->tok = tokens->arr;
    v->mask = cap - 1;
    v->slot = hp_calloc((size_t)cap, sizeof *v->slot);
    if (!v->slot) return hp_err_set(err, HP_ERR_NOMEM, "out of memory for the vocabulary index");
    char a[96];
    for (uint64_t i = 0; i < tokens->n; i++) {
        const hp_gguf_str *t = &v->tok[i];
        int64_t other = vocab_find(v, t->s, (size_t)t->len);
        if (other >= 0)
            return hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer.ggml.tokens: token %llu '%s' is also token %lld; a "
                              "tokenizer.json vocabulary maps each token to one id.", hp_gguf_path(f),
                              (unsigned long long)i, hp_escape(t->s, a, sizeof a), (long long)other);
        uint64_t h = str_hash(t->s, (size_t)t->len) & v->mask;
        while (v->slot[h]) h = (h + 1) & v->mask;
        v->slot[h] = (int64_t)i + 1;
    }
    return HP_OK;
}

/* ---- pieces ---- */

/* A JSON string of a token, or an error naming it: tokenizer.json is UTF-8 text. */
static json_t *token_string(const hp_gguf_file *f, const char *what, uint64_t i, const hp_gguf_str *s, hp_err *err)
{
    json_t *j = strlen(s->s) == s->len ? json_stringn(s->s, (size_t)s->len) : NULL;
    if (!j) {
        char a[96];
        hp_err_set(err, HP_ERR_INPUT, "%s: %s %llu ('%s') is not valid UTF-8 text without NUL bytes; tokenizer.json "
                   "cannot hold it.", hp_gguf_path(f), what, (unsigned long long)i, hp_escape(s->s, a, sizeof a));
    }
    return j;
}

static json_t *added_token(json_t *content, int64_t id, bool special)
{
    return json_pack("{s:I, s:o, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)id, "content", content, "single_word",
                     0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", special);
}

static json_t *byte_level(bool add_prefix_space, bool trim_offsets, bool use_regex)
{
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", add_prefix_space,
                     "trim_offsets", trim_offsets, "use_regex", use_regex);
}

static json_t *pre_tokenizer(const pre_rule *p)
{
    json_t *seq = json_array();
    if (p->digits) json_array_append_new(seq, json_pack("{s:s, s:b}", "type", "Digits", "individual_digits", 1));
    if (p->split)
        json_array_append_new(seq, json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex",
                                             p->split, "behavior", "Isolated", "invert", 0));
    json_array_append_new(seq, byte_level(false, p->trim_offsets, p->split == NULL));
    return json_pack("{s:s, s:o}", "type", "Sequence", "pretokenizers", seq);
}

/* ByteLevel alone, or followed by TemplateProcessing adding bos before and eos after each sequence. */
static json_t *post_processor(const hp_gguf_str *tok, int64_t bos, int64_t eos)
{
    json_t *bl = byte_level(true, false, true);
    if (bos < 0 && eos < 0) return bl;
    json_t *single = json_array(), *pair = json_array(), *special = json_object();
    for (int seq = 0; seq < 2; seq++) {
        const char *id = seq ? "B" : "A";
        if (bos >= 0) {
            json_array_append_new(pair, json_pack("{s:{s:s, s:i}}", "SpecialToken", "id", tok[bos].s, "type_id", seq));
            if (!seq) json_array_append_new(single, json_pack("{s:{s:s, s:i}}", "SpecialToken", "id", tok[bos].s,
                                                              "type_id", 0));
        }
        json_array_append_new(pair, json_pack("{s:{s:s, s:i}}", "Sequence", "id", id, "type_id", seq));
        if (!seq) json_array_append_new(single, json_pack("{s:{s:s, s:i}}", "Sequence", "id", id, "type_id", 0));
        if (eos >= 0) {
            json_array_append_new(pair, json_pack("{s:{s:s, s:i}}", "SpecialToken", "id", tok[eos].s, "type_id", seq));
            if (!seq) json_array_append_new(single, json_pack("{s:{s:s, s:i}}", "SpecialToken", "id", tok[eos].s,
                                                              "type_id", 0));
        }
    }
    for (int k = 0; k < 2; k++) {
        int64_t id = k ? eos : bos;
        if (id >= 0)
            json_object_set_new(special, tok[id].s, json_pack("{s:s, s:[I], s:[s]}", "id", tok[id].s, "ids",
                                                              (json_int_t)id, "tokens", tok[id].s));
    }
    json_t *tp = json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing", "single", single, "pair", pair,
                           "special_tokens", special);
    return json_pack("{s:s, s:[o, o]}", "type", "Sequence", "processors", bl, tp);
}

/* ---- reading the keys ---- */

typedef struct tok_meta {
    const pre_rule *pre;
    const hp_gguf_kv *tokens, *types, *merges;
    int64_t bos, eos, unk, pad, ctx; /* -1: absent */
    bool add_bos, add_eos;
    const hp_gguf_str *chat_template;
} tok_meta;

static hp_status get_id(const hp_gguf_file *f, const char *key, int64_t n, int64_t *out, hp_err *err)
{
    bool found;
    hp_status st = hp_gguf_get_int(f, key, out, &found, err);
    if (st) return st;
    if (!found) *out = -1;
    else if (*out < 0 || *out >= n)
        return hp_err_set(err, HP_ERR_INPUT, "%s: %s is %lld, outside the vocabulary of %lld tokens.", hp_gguf_path(f),
                          key, (long long)*out, (long long)n);
    return HP_OK;
}

static hp_status read_model_kind(const hp_gguf_file *f, tok_meta *m, hp_err *err)
{
    const char *lab = hp_gguf_path(f);
    const hp_gguf_str *model = NULL, *pre = NULL;
    char a[96];
    hp_status st = hp_gguf_get_string(f, "tokenizer.ggml.model", &model, err);
    if (!st) st = hp_gguf_get_string(f, "tokenizer.ggml.pre", &pre, err);
    if (st) return st;
    if (!model)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer.ggml.model is missing: the file carries no tokenizer.",
                          lab);
    if (strcmp(model->s, "gpt2") != 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer.ggml.model is '%s'; convert writes byte-level BPE "
                          "tokenizers (tokenizer.ggml.model 'gpt2') only.", lab, hp_escape(model->s, a, sizeof a));
    for (size_t i = 0; pre && i < N_PRE; i++)
        if (strcmp(pre->s, g_pre[i].name) == 0) m->pre = &g_pre[i];
    if (!m->pre)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer.ggml.pre is %s%s%s; convert knows the pre-tokenizers "
                          "'smollm', 'llama-bpe', 'qwen2' and 'gpt-2' (how text is split before BPE differs for each, "
                          "so a guess would tokenize differently).", lab, pre ? "'" : "absent",
                          pre ? hp_escape(pre->s, a, sizeof a) : "", pre ? "'" : "");
    return HP_OK;
}

static hp_status read_tok_meta(const hp_gguf_file *f, tok_meta *m, hp_err *err)
{
    const char *lab = hp_gguf_path(f);
    memset(m, 0, sizeof *m);
    hp_status st = read_model_kind(f, m, err);
    if (!st) st = hp_gguf_get_array(f, "tokenizer.ggml.tokens", HP_GGUF_STRING, &m->tokens, err);
    if (!st) st = hp_gguf_get_array(f, "tokenizer.ggml.token_type", HP_GGUF_I32, &m->types, err);
    if (!st) st = hp_gguf_get_array(f, "tokenizer.ggml.merges", HP_GGUF_STRING, &m->merges, err);
    if (st) return st;
    if (!m->tokens || !m->tokens->n || !m->merges)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer.ggml.%s is missing; a BPE tokenizer needs its tokens and "
                          "merges.", lab, !m->tokens || !m->tokens->n ? "tokens" : "merges");
    if (m->types && m->types->n != m->tokens->n)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer.ggml.token_type has %llu entries for %llu tokens.", lab,
                          (unsigned long long)m->types->n, (unsigned long long)m->tokens->n);
    const int64_t n = (int64_t)m->tokens->n;
    bool found;
    if ((st = get_id(f, "tokenizer.ggml.bos_token_id", n, &m->bos, err)) ||
        (st = get_id(f, "tokenizer.ggml.eos_token_id", n, &m->eos, err)) ||
        (st = get_id(f, "tokenizer.ggml.unknown_token_id", n, &m->unk, err)) ||
        (st = get_id(f, "tokenizer.ggml.padding_token_id", n, &m->pad, err)) ||
        (st = hp_gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &m->add_bos, &found, err)) ||
        (st = hp_gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &m->add_eos, &found, err)) ||
        (st = hp_gguf_get_string(f, "tokenizer.chat_template", &m->chat_template, err)))
        return st;
    if ((m->add_bos && m->bos < 0) || (m->add_eos && m->eos < 0))
        return hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer.ggml.add_%s_token is true but the %s token id is missing.",
                          lab, m->add_bos && m->bos < 0 ? "bos" : "eos", m->add_bos && m->bos < 0 ? "bos" : "eos");
    /* model_max_length: the architecture's context length, when the file says it */
    const hp_gguf_str *arch = NULL;
    m->ctx = -1;
    if (hp_gguf_get_string(f, "general.architecture", &arch, err) == HP_OK && arch) {
        char key[160];
        snprintf(key, sizeof key, "%s.context_length", arch->s);
        if (hp_gguf_get_int(f, key, &m->ctx, &found, err) != HP_OK || !found) m->ctx = -1;
    }
    return HP_OK;
}

/* ---- tokenizer.json ---- */

static hp_status merges_json(const hp_gguf_file *f, const tok_meta *m, const vocab_index *v, json_t *out,
                             hp_err *err)
{
    const hp_gguf_str *mg = m->merges->arr;
    char a[96];
    for (uint64_t k = 0; k < m->merges->n; k++) {
        const char *s = mg[k].s, *sp = memchr(s, ' ', (size_t)mg[k].len);
        size_t la = sp ? (size_t)(sp - s) : 0, lb = sp ? (size_t)mg[k].len - la - 1 : 0;
        bool ok = sp && la && lb && !memchr(sp + 1, ' ', lb);
        if (ok && (vocab_find(v, s, la) < 0 || vocab_find(v, sp + 1, lb) < 0)) ok = false;
        if (ok) { /* the merged token must be in the vocabulary too */
            char *ab = malloc(la + lb + 1);
            if (!ab) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
            memcpy(ab, s, la);
            memcpy(ab + la, sp + 1, lb);
            ok = vocab_find(v, ab, la + lb) >= 0;
            free(ab);
        }
        if (!ok)
            return hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer.ggml.merges: merge %llu '%s' is not two tokens of the "
                              "vocabulary separated by one space whose concatenation is a token too; tokenizers "
                              "would refuse it.", hp_gguf_path(f), (unsigned long long)k,
                              hp_escape(s, a, sizeof a));
        json_t *js = token_string(f, "merge", k, &mg[k], err);
        if (!js) return HP_ERR_INPUT;
        json_array_append_new(out, js);
    }
    return HP_OK;
}

/* model.vocab and added_tokens, in id order. */
static hp_status vocab_json(const hp_gguf_file *f, const tok_meta *m, json_t *vocab, json_t *added, hp_err *err)
{
    const hp_gguf_str *tok = m->tokens->arr;
    const int32_t *type = m->types ? m->types->arr : NULL;
    for (uint64_t i = 0; i < m->tokens->n; i++) {
        json_t *s = token_string(f, "token", i, &tok[i], err);
        if (!s) return HP_ERR_INPUT;
        json_object_setn_new_nocheck(vocab, tok[i].s, (size_t)tok[i].len, json_integer((json_int_t)i));
        int32_t t = type ? type[i] : TT_NORMAL;
        if (t < TT_NORMAL || t > TT_BYTE) {
            json_decref(s);
            return hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer.ggml.token_type[%llu] is %d; token types are 1..6 "
                              "(normal, unknown, control, user-defined, unused, byte).", hp_gguf_path(f),
                              (unsigned long long)i, t);
        }
        if (t == TT_CONTROL || t == TT_USER_DEFINED) json_array_append_new(added, added_token(s, (int64_t)i, t == TT_CONTROL));
        else json_decref(s);
    }
    return HP_OK;
}

static hp_status tokenizer_json(const hp_gguf_file *f, const tok_meta *m, const vocab_index *v, char **out,
                                hp_err *err)
{
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    hp_status st = vocab_json(f, m, vocab, added, err);
    if (!st) st = merges_json(f, m, v, merges, err);
    if (st) {
        json_decref(vocab);
        json_decref(merges);
        json_decref(added);
        return st;
    }
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                              "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                              "byte_fallback", 0, "ignore_merges", m->pre->ignore_merges, "vocab", vocab, "merges",
                              merges);
    json_t *root = json_pack("{s:s, s:n, s:n, s:o, s:o, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation",
                             "padding", "added_tokens", added, "normalizer",
                             m->pre->nfc ? json_pack("{s:s}", "type", "NFC") : json_null(), "pre_tokenizer",
                             pre_tokenizer(m->pre), "post_processor",
                             post_processor(m->tokens->arr, m->add_bos ? m->bos : -1, m->add_eos ? m->eos : -1),
                             "decoder", byte_level(true, true, true), "model", model);
    *out = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    return *out ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory writing tokenizer.json");
}

/* ---- tokenizer_config.json ---- */

static char *tokenizer_config(const tok_meta *m)
{
    const hp_gguf_str *tok = m->tokens->arr;
    const int32_t *type = m->types ? m->types->arr : NULL;
    json_t *c = json_object(), *dec = json_object();
    json_object_set_new(c, "add_bos_token", json_boolean(m->add_bos));
    json_object_set_new(c, "add_eos_token", json_boolean(m->add_eos));
    for (uint64_t i = 0; type && i < m->tokens->n; i++) {
        if (type[i] != TT_CONTROL && type[i] != TT_USER_DEFINED) continue;
        char id[32];
        snprintf(id, sizeof id, "%llu", (unsigned long long)i);
        json_object_set_new(dec, id, json_pack("{s:s, s:b, s:b, s:b, s:b, s:b}", "content", tok[i].s, "lstrip", 0,
                                               "normalized", 0, "rstrip", 0, "single_word", 0, "special",
                                               type[i] == TT_CONTROL));
    }
    json_object_set_new(c, "added_tokens_decoder", dec);
    const struct { const char *key; int64_t id; } named[] = {
        {"bos_token", m->bos}, {"eos_token", m->eos}, {"unk_token", m->unk}, {"pad_token", m->pad}};
    for (size_t k = 0; k < 4; k++)
        if (named[k].id >= 0) json_object_set_new(c, named[k].key, json_string(tok[named[k].id].s));
    json_t *tpl = m->chat_template ? json_stringn(m->chat_template->s, (size_t)m->chat_template->len) : NULL;
    if (m->chat_template && !tpl) {
        json_decref(c);
        return NULL;
    }
    if (tpl) json_object_set_new(c, "chat_template", tpl);
    json_object_set_new(c, "clean_up_tokenization_spaces", json_false());
    if (m->ctx > 0) json_object_set_new(c, "model_max_length", json_integer((json_int_t)m->ctx));
    json_object_set_new(c, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    char *s = json_dumps(c, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(c);
    return s;
}

hp_status hp_gguf_tokenizer(const hp_gguf_file *f, char **tokenizer_json_out, char **tokenizer_config_json,
                            hp_err *err)
{
    *tokenizer_json_out = *tokenizer_config_json = NULL;
    tok_meta m;
    hp_status st = read_tok_meta(f, &m, err);
    if (st) return st;
    if (m.chat_template && strlen(m.chat_template->s) != m.chat_template->len)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer.chat_template holds a NUL byte.", hp_gguf_path(f));
    vocab_index v = {0};
    st = vocab_build(&v, f, m.tokens, err);
    if (!st) st = tokenizer_json(f, &m, &v, tokenizer_json_out, err);
    free(v.slot);
    if (!st) {
        *tokenizer_config_json = tokenizer_config(&m);
        if (!*tokenizer_config_json)
            st = hp_err_set(err, HP_ERR_INPUT, "%s: tokenizer_config.json cannot be written: the chat template or a "
                            "special token is not valid UTF-8.", hp_gguf_path(f));
    }
    if (st) {
        free(*tokenizer_json_out);
        *tokenizer_json_out = NULL;
    }
    return st;
}
