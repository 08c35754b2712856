/*
 * tok_json.c — a Hugging Face tokenizer.json (and the tokenizer_config.json beside it) into an hp_tok.
 *
 * Taken (docs/tokenizer.md, "Supported"):
 *   model            BPE: vocab {token: id}, merges as "a b" strings or [a, b] pairs, ignore_merges, unk_token,
 *                    fuse_unk; dropout null or 0, byte_fallback false, no subword prefix or word suffix
 *   normalizer       null, NFC (or a Sequence of at most NFC)
 *   pre_tokenizer    null, ByteLevel (use_regex, add_prefix_space), Split (a known Regex pattern,
 *                    behavior Isolated, invert false), Digits (individual_digits), Sequence of these
 *   post_processor   null, ByteLevel, TemplateProcessing (its single template), Sequence of these
 *   decoder          ByteLevel (or a Sequence of it)
 *   added_tokens     id, content, special, normalized, lstrip, rstrip; single_word false
 *   truncation, padding null
 * Anything else is refused by name: the message gives the file, line:col of the nearest located key, the JSON path
 * and the value found, so that a tokenizer is never encoded differently from Hugging Face without a word.
 */
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json.h"
#include "tok/tok_int.h"

typedef struct jctx {
    const char *text;
    size_t len;
    const char *label;
    hp_tok *t;
    hp_err *err;
} jctx;

static hp_status bad(const jctx *c, const char *k1, const char *k2, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* "<label>:<line>:<col>: <sentence>; fix the tokenizer", at k1.k2's value (or k1's, or none). */
static hp_status bad(const jctx *c, const char *k1, const char *k2, const char *fmt, ...)
{
    char msg[1024], loc[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *path[2] = {k1, k2};
    int line, col;
    if (k1 && k2 && hp__json_locate(c->text, c->len, path, 2, &line, &col))
        snprintf(loc, sizeof loc, "%s:%d:%d", c->label, line, col);
    else if (k1 && hp__json_locate(c->text, c->len, path, 1, &line, &col))
        snprintf(loc, sizeof loc, "%s:%d:%d", c->label, line, col);
    else
        snprintf(loc, sizeof loc, "%s", c->label);
    return hp_err_set(c->err, HP_ERR_INPUT, "%s: %s; fix the tokenizer", loc, msg);
}

/* A short description of v for messages. */
static const char *desc(const json_t *v, char *buf, size_t cap)
{
    return v ? hp__json_describe(v, buf, cap) : "nothing";
}

/* Optional boolean key of o: dflt when absent or null; false with an error for another type. */
static bool get_bool(const jctx *c, const json_t *o, const char *key, bool dflt, const char *k1, const char *where,
                     bool *out)
{
    const json_t *v = json_object_get(o, key);
    char d[96];
    if (!v || json_is_null(v)) *out = dflt;
    else if (json_is_boolean(v)) *out = json_is_true(v);
    else return bad(c, k1, NULL, "%s.%s must be true or false, found %s", where, key, desc(v, d, sizeof d)), false;
    return true;
}

/* o's "type" string, or NULL after an error. */
static const char *type_of(const jctx *c, const json_t *o, const char *k1, const char *where)
{
    char d[96];
    if (!json_is_object(o)) return bad(c, k1, NULL, "%s must be an object, found %s", where, desc(o, d, sizeof d)), NULL;
    const json_t *ty = json_object_get(o, "type");
    if (!json_is_string(ty))
        return bad(c, k1, NULL, "%s.type must be a string, found %s", where, desc(ty, d, sizeof d)), NULL;
    return json_string_value(ty);
}

/* ---- model ---- */

static hp_status load_vocab(const jctx *c, const json_t *vocab)
{
    char d[96];
    if (!json_is_object(vocab))
        return bad(c, "model", "vocab", "model.vocab must be an object {token: id}, found %s", desc(vocab, d, sizeof d));
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v))
            return bad(c, "model", "vocab", "model.vocab[\"%s\"] must be an integer id, found %s",
                       hp_escape(key, d, 48), desc(v, d + 48, sizeof d - 48));
        hp_status st = hp__tok_set(c->t, json_integer_value(v), key, strlen(key), HP_TOK_NORMAL, c->label, c->err);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

static hp_status load_merges(const jctx *c, const json_t *merges)
{
    char d[96];
    if (!json_is_array(merges))
        return bad(c, "model", "merges", "model.merges must be an array, found %s", desc(merges, d, sizeof d));
    for (size_t i = 0; i < json_array_size(merges); i++) {
        const json_t *m = json_array_get(merges, i);
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        if (json_is_string(m)) { /* "a b": exactly one space */
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (sp && !strchr(sp + 1, ' ')) na = (size_t)(sp - a), b = sp + 1, nb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            na = strlen(a), nb = strlen(b);
        }
        if (!na || !nb)
            return bad(c, "model", "merges", "model.merges[%zu] must be \"a b\" (two tokens, one space) or [\"a\", "
                       "\"b\"], found %s", i, desc(m, d, sizeof d));
        char where[256];
        snprintf(where, sizeof where, "%s: model.merges[%zu]", c->label, i);
        hp_status st = hp__tok_merge(c->t, a, na, b, nb, (int64_t)i, where, c->err);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

/* The BPE model's options: what is not implemented is refused. */
static hp_status model_options(const jctx *c, const json_t *m)
{
    char d[96];
    const json_t *v = json_object_get(m, "dropout");
    if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0.0))
        return bad(c, "model", "dropout", "model.dropout is %s; BPE dropout (random merges) is not supported: set it "
                   "to null", desc(v, d, sizeof d));
    bool b;
    if (!get_bool(c, m, "byte_fallback", false, "model", "model", &b)) return c->err->status;
    if (b) return bad(c, "model", "byte_fallback", "model.byte_fallback is true; byte fallback is not supported");
    const char *affix[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = json_object_get(m, affix[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !*json_string_value(v)))
            return bad(c, "model", affix[i], "model.%s is %s; subword prefixes and word suffixes are not supported",
                       affix[i], desc(v, d, sizeof d));
    }
    if (!get_bool(c, m, "ignore_merges", false, "model", "model", &c->t->ignore_merges)) return c->err->status;
    if (!get_bool(c, m, "fuse_unk", false, "model", "model", &c->t->fuse_unk)) return c->err->status;
    v = json_object_get(m, "unk_token");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v)) return bad(c, "model", "unk_token", "model.unk_token must be a string or null");
        c->t->unk_id = hp_tok_id(c->t, json_string_value(v));
        if (c->t->unk_id < 0)
            return bad(c, "model", "unk_token", "model.unk_token \"%s\" is not in the vocabulary",
                       hp_escape(json_string_value(v), d, sizeof d));
    }
    return HP_OK;
}

static hp_status load_model(const jctx *c, const json_t *root)
{
    char d[96];
    const json_t *m = json_object_get(root, "model");
    if (!json_is_object(m)) return bad(c, "model", NULL, "\"model\" must be an object, found %s", desc(m, d, sizeof d));
    const json_t *ty = json_object_get(m, "type");
    if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "BPE")))
        return bad(c, "model", "type", "model.type is %s; only BPE models are supported (not WordPiece, Unigram, "
                   "WordLevel)", desc(ty, d, sizeof d));
    hp_status st = load_vocab(c, json_object_get(m, "vocab"));
    return st != HP_OK ? st : model_options(c, m);
}

/* ---- added tokens ---- */

static hp_status load_added(const jctx *c, const json_t *root)
{
    char d[96];
    const json_t *list = json_object_get(root, "added_tokens");
    if (!list || json_is_null(list)) return HP_OK;
    if (!json_is_array(list)) return bad(c, "added_tokens", NULL, "added_tokens must be an array");
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *a = json_array_get(list, i);
        const json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_object(a) || !json_is_integer(id) || !json_is_string(content) || !json_string_length(content))
            return bad(c, "added_tokens", NULL, "added_tokens[%zu] must be an object with an integer \"id\" and a "
                       "non-empty string \"content\", found %s", i, desc(a, d, sizeof d));
        bool special, normalized, lstrip, rstrip, single;
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (!get_bool(c, a, "special", false, "added_tokens", where, &special) ||
            !get_bool(c, a, "normalized", !special, "added_tokens", where, &normalized) ||
            !get_bool(c, a, "lstrip", false, "added_tokens", where, &lstrip) ||
            !get_bool(c, a, "rstrip", false, "added_tokens", where, &rstrip) ||
            !get_bool(c, a, "single_word", false, "added_tokens", where, &single))
            return c->err->status;
        if (single)
            return bad(c, "added_tokens", NULL, "added_tokens[%zu] (\"%s\") has single_word true, which is not "
                       "supported", i, hp_escape(json_string_value(content), d, sizeof d));
        char w[256];
        snprintf(w, sizeof w, "%s: added_tokens[%zu]", c->label, i);
        hp_status st = hp__tok_add(c->t, json_integer_value(id), json_string_value(content),
                                   json_string_length(content), special, normalized, lstrip, rstrip, w, c->err);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

/* ---- normalizer, pre-tokenizer ---- */

/* null, NFC, or a Sequence of at most NFC (an empty one, or [NFC]). */
static hp_status load_normalizer(const jctx *c, const json_t *root)
{
    const json_t *n = json_object_get(root, "normalizer");
    if (!n || json_is_null(n)) return HP_OK;
    const char *ty = type_of(c, n, "normalizer", "normalizer");
    if (!ty) return c->err->status;
    const json_t *list = json_object_get(n, "normalizers");
    if (!strcmp(ty, "Sequence") && json_is_array(list) && json_array_size(list) <= 1) {
        if (json_array_size(list) == 0) return HP_OK;
        n = json_array_get(list, 0);
        ty = type_of(c, n, "normalizer", "normalizer.normalizers[0]");
        if (!ty) return c->err->status;
    }
    if (!strcmp(ty, "NFC")) {
        c->t->nfc = true;
        return HP_OK;
    }
    return bad(c, "normalizer", NULL, "the normalizer %s is not supported (only none and NFC); hyperpar would not "
               "give Hugging Face's ids", ty);
}

static hp_status pre_step(const jctx *c, const json_t *p, const char *where, int depth);

/* A step of a pre-tokenizer or post-processor; depth counts the Sequences around it. */
typedef hp_status (*step_fn)(const jctx *c, const json_t *p, const char *where, int depth);

/* A Sequence's steps: step on each element of list, named where.key[i], one level deeper. */
static hp_status each_step(const jctx *c, const json_t *list, const char *where, const char *key, int depth,
                           step_fn step)
{
    for (size_t i = 0; i < json_array_size(list); i++) {
        char w[256];
        snprintf(w, sizeof w, "%s.%s[%zu]", where, key, i);
        hp_status st = step(c, json_array_get(list, i), w, depth + 1);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

static hp_status add_step(const jctx *c, hp__pre_step s, const char *where)
{
    if (c->t->n_pre == HP__PRE_MAX)
        return bad(c, "pre_tokenizer", NULL, "%s: more than %d pre-tokenizer steps", where, HP__PRE_MAX);
    c->t->pre[c->t->n_pre++] = s;
    return HP_OK;
}

static hp_status pre_split(const jctx *c, const json_t *p, const char *where)
{
    char d[160];
    const json_t *pat = json_object_get(p, "pattern"), *beh = json_object_get(p, "behavior");
    const json_t *rx = json_object_get(pat, "Regex");
    bool invert;
    if (!get_bool(c, p, "invert", false, "pre_tokenizer", where, &invert)) return c->err->status;
    if (!json_is_string(beh) || strcmp(json_string_value(beh), "Isolated") || invert)
        return bad(c, "pre_tokenizer", NULL, "%s: a Split with behavior %s%s is not supported (only Isolated, not "
                   "inverted)", where, desc(beh, d, sizeof d), invert ? " inverted" : "");
    if (!json_is_string(rx))
        return bad(c, "pre_tokenizer", NULL, "%s.pattern must be {\"Regex\": \"...\"} with a known pattern, found %s",
                   where, desc(pat, d, sizeof d));
    int r = hp__regex_find(json_string_value(rx));
    if (r < 0)
        return bad(c, "pre_tokenizer", NULL, "%s: the Split pattern \"%s\" is not one hyperpar implements (the GPT-2, "
                   "Llama-3 and Qwen2 patterns, exactly as their tokenizer.json write them)", where,
                   hp_escape(json_string_value(rx), d, sizeof d));
    return add_step(c, (hp__pre_step){HP__PRE_SPLIT, (hp__regex)r, false, false, false}, where);
}

static hp_status pre_step(const jctx *c, const json_t *p, const char *where, int depth)
{
    const char *ty = type_of(c, p, "pre_tokenizer", where);
    if (!ty) return c->err->status;
    if (!strcmp(ty, "Sequence")) {
        const json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list) || depth > 4)
            return bad(c, "pre_tokenizer", NULL, "%s.pretokenizers must be an array (nested at most 4 deep)", where);
        return each_step(c, list, where, "pretokenizers", depth, pre_step);
    }
    hp__pre_step s = {HP__PRE_BYTELEVEL, HP__RX_GPT2, false, false, false};
    if (!strcmp(ty, "ByteLevel")) {
        if (!get_bool(c, p, "use_regex", true, "pre_tokenizer", where, &s.use_regex) ||
            !get_bool(c, p, "add_prefix_space", true, "pre_tokenizer", where, &s.add_prefix_space))
            return c->err->status;
        return add_step(c, s, where);
    }
    if (!strcmp(ty, "Digits")) {
        s.kind = HP__PRE_DIGITS;
        if (!get_bool(c, p, "individual_digits", false, "pre_tokenizer", where, &s.individual_digits))
            return c->err->status;
        return add_step(c, s, where);
    }
    if (!strcmp(ty, "Split")) return pre_split(c, p, where);
    return bad(c, "pre_tokenizer", NULL, "%s: the pre-tokenizer %s is not supported (ByteLevel, Split, Digits, "
               "Sequence)", where, ty);
}

/* ---- post-processor, decoder ---- */

/* The special_tokens entry name's ids appended to *ids [*n] (arena). */
static hp_status template_ids(const jctx *c, const json_t *specials, const char *name, int32_t **ids, int *n)
{
    char d[96];
    const json_t *ent = json_object_get(specials, name), *list = json_object_get(ent, "ids");
    if (!json_is_array(list))
        return bad(c, "post_processor", NULL, "post_processor.special_tokens[\"%s\"].ids must be an array of ids",
                   hp_escape(name, d, sizeof d));
    size_t k = json_array_size(list);
    if (k > 64 || *n > 64)
        return bad(c, "post_processor", NULL, "post_processor: more than 64 ids in a template (\"%s\")",
                   hp_escape(name, d, sizeof d));
    int32_t *p = hp_arena_alloc(&c->t->arena, (size_t)(*n + (int)k + 1) * sizeof *p);
    if (!p) return hp_err_set(c->err, HP_ERR_NOMEM, "%s: out of memory", c->label);
    if (*n) memcpy(p, *ids, (size_t)*n * sizeof *p);
    for (size_t i = 0; i < k; i++) {
        const json_t *v = json_array_get(list, i);
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= c->t->n_vocab || !c->t->tok[id].str)
            return bad(c, "post_processor", NULL, "post_processor.special_tokens[\"%s\"].ids[%zu] is %s, not a token "
                       "of the vocabulary", hp_escape(name, d, 48), i, desc(v, d + 48, sizeof d - 48));
        p[(*n)++] = (int32_t)id;
    }
    *ids = p;
    return HP_OK;
}

/* A TemplateProcessing's single template: its special tokens before $A go first, those after it last. */
static hp_status post_template(const jctx *c, const json_t *p, const char *where)
{
    char d[96];
    const json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
    if (!json_is_array(single) || !json_is_object(specials))
        return bad(c, "post_processor", NULL, "%s: a TemplateProcessing needs a \"single\" array and a "
                   "\"special_tokens\" object", where);
    int32_t *pre = NULL, *post = NULL;
    int n_pre = 0, n_post = 0, n_seq = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *it = json_array_get(single, i);
        const json_t *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
        const json_t *id = json_object_get(sp ? sp : sq, "id");
        if (!json_is_string(id))
            return bad(c, "post_processor", NULL, "%s.single[%zu] must be a SpecialToken or a Sequence with an id, "
                       "found %s", where, i, desc(it, d, sizeof d));
        if (sq) {
            if (strcmp(json_string_value(id), "A"))
                return bad(c, "post_processor", NULL, "%s.single[%zu] is sequence %s; a single template has $A only",
                           where, i, hp_escape(json_string_value(id), d, sizeof d));
            n_seq++;
            continue;
        }
        hp_status st = n_seq ? template_ids(c, specials, json_string_value(id), &post, &n_post)
                             : template_ids(c, specials, json_string_value(id), &pre, &n_pre);
        if (st != HP_OK) return st;
    }
    if (n_seq != 1) return bad(c, "post_processor", NULL, "%s.single has %d $A; it must have one", where, n_seq);
    hp_tok *t = c->t;
    int32_t *np = hp_arena_alloc(&t->arena, (size_t)(n_pre + t->n_prefix + 1) * sizeof *np);
    int32_t *ns = hp_arena_alloc(&t->arena, (size_t)(n_post + t->n_suffix + 1) * sizeof *ns);
    if (!np || !ns) return hp_err_set(c->err, HP_ERR_NOMEM, "%s: out of memory", c->label);
    /* A later processor of a Sequence wraps what the earlier made. */
    if (n_pre) memcpy(np, pre, (size_t)n_pre * sizeof *np);
    if (t->n_prefix) memcpy(np + n_pre, t->prefix_ids, (size_t)t->n_prefix * sizeof *np);
    if (t->n_suffix) memcpy(ns, t->suffix_ids, (size_t)t->n_suffix * sizeof *ns);
    if (n_post) memcpy(ns + t->n_suffix, post, (size_t)n_post * sizeof *ns);
    t->prefix_ids = np, t->n_prefix += n_pre;
    t->suffix_ids = ns, t->n_suffix += n_post;
    return HP_OK;
}

static hp_status post_step(const jctx *c, const json_t *p, const char *where, int depth)
{
    const char *ty = type_of(c, p, "post_processor", where);
    if (!ty) return c->err->status;
    if (!strcmp(ty, "ByteLevel")) return HP_OK; /* offsets only */
    if (!strcmp(ty, "TemplateProcessing")) return post_template(c, p, where);
    const json_t *list = json_object_get(p, "processors");
    if (!strcmp(ty, "Sequence") && json_is_array(list) && depth < 4)
        return each_step(c, list, where, "processors", depth, post_step);
    return bad(c, "post_processor", NULL, "%s: the post-processor %s is not supported (ByteLevel, TemplateProcessing, "
               "Sequence)", where, ty);
}

static hp_status load_decoder(const jctx *c, const json_t *d, const char *where, int depth)
{
    char s[96];
    if (!d || json_is_null(d))
        return bad(c, "decoder", NULL, "%s is %s; a byte-level BPE tokenizer needs the ByteLevel decoder", where,
                   desc(d, s, sizeof s));
    const char *ty = type_of(c, d, "decoder", where);
    if (!ty) return c->err->status;
    if (!strcmp(ty, "ByteLevel")) return HP_OK;
    const json_t *list = json_object_get(d, "decoders");
    if (!strcmp(ty, "Sequence") && json_is_array(list) && json_array_size(list) == 1 && depth < 4)
        return load_decoder(c, json_array_get(list, 0), "decoder.decoders[0]", depth + 1);
    return bad(c, "decoder", NULL, "%s: the decoder %s is not supported (ByteLevel)", where, ty);
}

/* ---- the whole file ---- */

/* bos: the template's first token; eos: the first of these names that is a token. */
static void default_bos_eos(hp_tok *t)
{
    static const char *const eos[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>"};
    if (t->n_prefix) t->bos_id = t->prefix_ids[0];
    for (size_t i = 0; i < sizeof eos / sizeof *eos && t->eos_id < 0; i++) t->eos_id = hp_tok_id(t, eos[i]);
}

static hp_status load_root(const jctx *c, const json_t *root)
{
    char d[96];
    if (!json_is_object(root)) return bad(c, NULL, NULL, "the top level must be an object");
    const char *unsupported[2] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(root, unsupported[i]);
        if (v && !json_is_null(v))
            return bad(c, unsupported[i], NULL, "%s is %s; hyperpar does not %s: set it to null", unsupported[i],
                       desc(v, d, sizeof d), i ? "pad" : "truncate");
    }
    hp_status st = load_model(c, root);
    if (st == HP_OK) st = load_added(c, root);
    if (st == HP_OK) {
        const json_t *m = json_object_get(root, "model");
        st = load_merges(c, json_object_get(m, "merges"));
    }
    if (st == HP_OK) st = load_normalizer(c, root);
    const json_t *pre = json_object_get(root, "pre_tokenizer"), *post = json_object_get(root, "post_processor");
    if (st == HP_OK && pre && !json_is_null(pre)) st = pre_step(c, pre, "pre_tokenizer", 0);
    if (st == HP_OK && post && !json_is_null(post)) st = post_step(c, post, "post_processor", 0);
    if (st == HP_OK) st = load_decoder(c, json_object_get(root, "decoder"), "decoder", 0);
    if (st != HP_OK) return st;
    default_bos_eos(c->t);
    return hp__tok_finish(c->t, c->label, c->err);
}

hp_status hp_tok_load_json(const char *text, size_t len, const char *label, hp_tok **out, hp_err *err)
{
    *out = NULL;
    json_t *root;
    hp_status st = hp__json_parse(text, len, label, &root, err);
    if (st != HP_OK) return st;
    hp_tok *t = hp__tok_new();
    if (!t) {
        json_decref(root);
        return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory", label);
    }
    jctx c = {text, len, label, t, err};
    st = load_root(&c, root);
    json_decref(root);
    if (st != HP_OK) {
        hp_tok_free(t);
        return st;
    }
    *out = t;
    return HP_OK;
}

/* tokenizer_config.json's key: a string, or {"content": string}; NULL when absent or null. */
static const char *config_token(const json_t *cfg, const char *key)
{
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* bos_token, eos_token and chat_template of the tokenizer_config.json in dir, when there is one. */
static hp_status load_config(hp_tok *t, const char *dir, hp_err *err)
{
    char path[4200], shown[96];
    snprintf(path, sizeof path, "%.4096s/tokenizer_config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) return HP_OK;
    char *text;
    size_t len;
    json_t *cfg;
    hp_status st = hp__read_file(path, HP_JSON_MAX_FILE, &text, &len, err);
    if (st != HP_OK) return st;
    st = hp__json_parse(text, len, path, &cfg, err);
    free(text);
    if (st != HP_OK) return st;
    const char *keys[2] = {"bos_token", "eos_token"};
    int32_t *ids[2] = {&t->bos_id, &t->eos_id};
    for (int i = 0; i < 2 && st == HP_OK; i++) {
        const char *name = config_token(cfg, keys[i]);
        if (!name) continue;
        int32_t id = hp_tok_id(t, name);
        if (id < 0)
            st = hp_err_set(err, HP_ERR_INPUT, "%s: %s \"%s\" is not a token of the tokenizer.json beside it", path,
                            keys[i], hp_escape(name, shown, sizeof shown));
        *ids[i] = id;
    }
    const json_t *tpl = json_object_get(cfg, "chat_template");
    if (st == HP_OK && json_is_string(tpl) && !(t->chat_template = strdup(json_string_value(tpl))))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    json_decref(cfg);
    return st;
}

hp_status hp_tok_load(const char *path, hp_tok **out, hp_err *err)
{
    *out = NULL;
    char file[4200], dir[4200];
    struct stat sb;
    if (strlen(path) > 4096) return hp_err_set(err, HP_ERR_INPUT, "a tokenizer path of more than 4096 bytes");
    bool is_dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (is_dir) {
        snprintf(file, sizeof file, "%.4096s/tokenizer.json", path);
        snprintf(dir, sizeof dir, "%s", path);
        if (stat(file, &sb) != 0)
            return hp_err_set(err, HP_ERR_INPUT, "%s: the folder has no tokenizer.json; give a folder with one, or the "
                              "file itself", path);
    } else {
        char copy[4200]; /* dirname may return a pointer into its argument: never print it into itself */
        snprintf(file, sizeof file, "%s", path);
        snprintf(copy, sizeof copy, "%s", path);
        snprintf(dir, sizeof dir, "%s", dirname(copy));
    }
    char *text;
    size_t len;
    hp_status st = hp__read_file(file, HP_JSON_MAX_FILE, &text, &len, err);
    if (st != HP_OK) return st;
    hp_tok *t;
    st = hp_tok_load_json(text, len, file, &t, err);
    free(text);
    if (st == HP_OK) st = load_config(t, dir, err);
    if (st != HP_OK) {
        hp_tok_free(t);
        return st;
    }
    *out = t;
    return HP_OK;
}
