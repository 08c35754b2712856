/*
 * tok.c — the tokenizer object: its tokens and added tokens, building it (from arrays here, from tokenizer.json in
 * tok_json.c), the lookups, encode's driver and decode.
 *
 * Data (tok_int.h): tok[id] holds each token's string as tokenizer.json writes it and the bytes it decodes to;
 * by_str maps strings to ids, by_bytes the bytes of the BPE vocabulary's tokens to ids (ignore_merges), byte_id
 * each byte's single-byte token; merges maps a pair of ids to its rank and the token it makes.
 *
 * Invariants after building: every merge's three tokens exist; byte_id[b] is the token whose string is the one
 * character standing for b (or -1); an added token's id holds its content; bos_id and eos_id are -1 or tokens.
 *
 * Encoding (hp_tok_encode), as Hugging Face's Tokenizer::encode for one sequence:
 *
 *   1. the added tokens that are not `normalized` are found in the text, leftmost first and the longest at a
 *      position (their lstrip/rstrip take the whitespace beside them);
 *   2. the text between them is normalized (NFC, or nothing), and in it the `normalized` added tokens are found
 *      the same way;
 *   3. the text between those is pre-tokenized (pretok.c) and each piece merged (bpe.c);
 *   4. with add_special, the post-processor's template puts its tokens before and after.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok/nfc.h"
#include "tok/tok_int.h"

/* Largest id taken: 16,777,216 tokens (the largest vocabularies are about 256K); a file naming id 2·10^9 would
 * otherwise allocate tens of GB. */
#define HP_TOK_MAX_ID (1 << 24)

/* ---- the byte-level alphabet (GPT-2's bytes_to_unicode) ----
 * The printable bytes 0x21..0x7E, 0xA1..0xAC and 0xAE..0xFF stand for themselves; the 68 others, in byte order,
 * for U+0100..U+0143: 0x00..0x20 -> U+0100..U+0120 ('Ġ' is the space), 0x7F..0xA0 -> U+0121..U+0142, 0xAD ->
 * U+0143. */
uint32_t hp__byte_char(uint8_t b)
{
    if (b <= 0x20) return 0x100u + b;
    if (b >= 0x7F && b <= 0xA0) return 0x121u + (uint32_t)(b - 0x7F);
    if (b == 0xAD) return 0x143;
    return b;
}

int hp__char_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp >= 0x100 && cp <= 0x120) return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142) return (int)(cp - 0x121 + 0x7F);
    if (cp == 0x143) return 0xAD;
    return -1;
}

/* ---- building ---- */

hp_tok *hp__tok_new(void)
{
    hp_tok *t = hp_calloc(1, sizeof *t);
    if (!t) return NULL;
    hp_arena_init(&t->arena);
    memset(t->byte_id, 0xFF, sizeof t->byte_id);
    t->unk_id = t->bos_id = t->eos_id = -1;
    if (hp__idmap_reserve(&t->by_str, 1024) != HP_OK || hp__idmap_reserve(&t->by_bytes, 1024) != HP_OK) {
        hp_tok_free(t);
        return NULL;
    }
    return t;
}

void hp_tok_free(hp_tok *t)
{
    if (!t) return;
    hp__bpe_free(t);
    for (int i = 0; i < HP__PRE_MAX; i++) free(t->scratch[i].p);
    for (int b = 0; b < 256; b++) free(t->added_first[b]);
    free(t->added);
    free(t->tok);
    free(t->chat_template);
    hp_arena_free(&t->arena);
    free(t);
}

/* Room for ids [0, id]. */
static hp_status grow_vocab(hp_tok *t, int64_t id, const char *where, hp_err *err)
{
    if (id < 0 || id >= HP_TOK_MAX_ID)
        return hp_err_set(err, HP_ERR_INPUT, "%s: id %lld is outside [0, %d); fix the tokenizer", where, (long long)id,
                          HP_TOK_MAX_ID);
    if (id < t->cap_vocab) {
        if (id >= t->n_vocab) t->n_vocab = id + 1;
        return HP_OK;
    }
    int64_t cap = t->cap_vocab ? t->cap_vocab : 1024;
    while (cap <= id) cap *= 2;
    hp__token *p = realloc(t->tok, (size_t)cap * sizeof *p);
    if (!p) return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory for %lld tokens", where, (long long)cap);
    memset(p + t->cap_vocab, 0, (size_t)(cap - t->cap_vocab) * sizeof *p);
    t->tok = p;
    t->cap_vocab = cap;
    t->n_vocab = id + 1;
    return HP_OK;
}

/* A token's string into tok[id]: its bytes are the byte-level alphabet undone when every character is of it, else
 * the string's own UTF-8 (what Hugging Face's ByteLevel decoder gives for such a token). */
static hp_status put_string(hp_tok *t, int64_t id, const char *str, size_t len, hp_tok_kind kind, const char *where,
                            hp_err *err)
{
    char shown[96];
    if (len == 0 || memchr(str, 0, len))
        return hp_err_set(err, HP_ERR_INPUT, "%s: token %lld is %s; a token is a non-empty string without NUL "
                          "characters", where, (long long)id, len ? "a string holding a NUL character" : "empty");
    hp_status st = grow_vocab(t, id, where, err);
    if (st != HP_OK) return st;
    hp__token *k = &t->tok[id];
    char *s = hp_arena_strndup(&t->arena, str, len);
    uint8_t *bytes = hp_arena_alloc(&t->arena, len);
    if (!s || !bytes) return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory", where);
    bool in = true;
    size_t nb = 0;
    for (size_t p = 0; p < len && in;) {
        uint32_t cp;
        p += hp__utf8_next((const uint8_t *)str + p, len - p, &cp);
        int b = hp__char_byte(cp);
        if (b < 0) in = false;
        else bytes[nb++] = (uint8_t)b;
    }
    if (!in) memcpy(bytes, str, nb = len);
    *k = (hp__token){s, bytes, (uint32_t)nb, (uint8_t)kind, in};
    int32_t other = hp__idmap_find(&t->by_str, t, false, str, len);
    if (other >= 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s: token \"%s\" has two ids, %d and %lld; fix the tokenizer", where,
                          hp_escape(s, shown, sizeof shown), other, (long long)id);
    if (!hp__idmap_put(&t->by_str, t, false, (int32_t)id))
        return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory", where);
    return HP_OK;
}

hp_status hp__tok_set(hp_tok *t, int64_t id, const char *str, size_t len, hp_tok_kind kind, const char *where,
                      hp_err *err)
{
    char a[96], b[96];
    if (id >= 0 && id < t->n_vocab && t->tok[id].str)
        return hp_err_set(err, HP_ERR_INPUT, "%s: id %lld is given to two tokens, \"%s\" and \"%s\"; fix the "
                          "tokenizer", where, (long long)id, hp_escape(t->tok[id].str, a, sizeof a),
                          hp_escape(hp_arena_strndup(&t->arena, str, len), b, sizeof b));
    hp_status st = put_string(t, id, str, len, kind, where, err);
    if (st != HP_OK) return st;
    hp__token *k = &t->tok[id];
    if (k->in_alphabet) {
        if (!hp__idmap_put(&t->by_bytes, t, true, (int32_t)id))
            return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory", where);
        if (k->n_bytes == 1) t->byte_id[k->bytes[0]] = (int32_t)id;
    }
    return HP_OK;
}

hp_status hp__tok_add(hp_tok *t, int64_t id, const char *content, size_t len, bool special, bool normalized,
                      bool lstrip, bool rstrip, const char *where, hp_err *err)
{
    char a[96], b[96];
    hp_tok_kind kind = special ? HP_TOK_SPECIAL : HP_TOK_ADDED;
    if (id >= 0 && id < t->n_vocab && t->tok[id].str) {
        if (strlen(t->tok[id].str) != len || memcmp(t->tok[id].str, content, len))
            return hp_err_set(err, HP_ERR_INPUT, "%s: added token %lld is \"%s\" but the vocabulary's token %lld is "
                              "\"%s\"; fix the tokenizer", where, (long long)id,
                              hp_escape(hp_arena_strndup(&t->arena, content, len), a, sizeof a), (long long)id,
                              hp_escape(t->tok[id].str, b, sizeof b));
        t->tok[id].kind = (uint8_t)kind;
    } else {
        hp_status st = put_string(t, id, content, len, kind, where, err);
        if (st != HP_OK) return st;
    }
    if (t->n_added % 64 == 0) {
        hp__added *p = realloc(t->added, (size_t)(t->n_added + 64) * sizeof *p);
        if (!p) return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory", where);
        t->added = p;
    }
    t->added[t->n_added++] = (hp__added){(const uint8_t *)t->tok[id].str, len, (int32_t)id, special, normalized,
                                         lstrip, rstrip};
    return HP_OK;
}

hp_status hp__tok_merge(hp_tok *t, const char *a, size_t na, const char *b, size_t nb, int64_t index,
                        const char *where, hp_err *err)
{
    char shown[96];
    if (index >= INT32_MAX) return hp_err_set(err, HP_ERR_INPUT, "%s: more than 2^31 merges", where);
    int32_t ia = hp__idmap_find(&t->by_str, t, false, a, na), ib = hp__idmap_find(&t->by_str, t, false, b, nb);
    char *ab = malloc(na + nb + 1);
    if (!ab) return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory", where);
    memcpy(ab, a, na);
    memcpy(ab + na, b, nb);
    ab[na + nb] = '\0';
    int32_t made = hp__idmap_find(&t->by_str, t, false, ab, na + nb);
    const char *missing = ia < 0 ? hp_arena_strndup(&t->arena, a, na)
                          : ib < 0 ? hp_arena_strndup(&t->arena, b, nb)
                          : made < 0 ? ab : NULL;
    hp_status st = HP_OK;
    if (missing)
        st = hp_err_set(err, HP_ERR_INPUT, "%s: merge %lld makes or uses the token \"%s\", which is not in the "
                        "vocabulary; fix the tokenizer", where, (long long)index,
                        hp_escape(missing, shown, sizeof shown));
    else if (!hp__merge_put(&t->merges, ia, ib, (int32_t)index, made))
        st = hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory", where);
    free(ab);
    if (st == HP_OK) t->n_merges++;
    return st;
}

hp_status hp__tok_finish(hp_tok *t, const char *where, hp_err *err)
{
    if (t->n_vocab == 0) return hp_err_set(err, HP_ERR_INPUT, "%s: the vocabulary is empty", where);
    const char *names[2] = {"bos", "eos"};
    int32_t ids[2] = {t->bos_id, t->eos_id};
    for (int i = 0; i < 2; i++)
        if (ids[i] >= t->n_vocab || (ids[i] >= 0 && !t->tok[ids[i]].str))
            return hp_err_set(err, HP_ERR_INPUT, "%s: the %s id %d is not a token of the vocabulary", where, names[i],
                              ids[i]);
    /* The added tokens by first byte, longest first: the first that matches at a position is the longest. */
    int counts[256] = {0};
    for (int i = 0; i < t->n_added; i++) counts[t->added[i].text[0]]++;
    for (int c = 0; c < 256; c++) {
        if (!counts[c]) continue;
        int32_t *list = malloc((size_t)(counts[c] + 1) * sizeof *list);
        if (!list) return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory", where);
        int k = 0;
        for (int i = 0; i < t->n_added; i++)
            if (t->added[i].text[0] == c) list[k++] = i;
        for (int i = 1; i < k; i++) /* insertion sort, stable: longest first, then in file order */
            for (int j = i; j > 0 && t->added[list[j]].len > t->added[list[j - 1]].len; j--) {
                int32_t x = list[j];
                list[j] = list[j - 1];
                list[j - 1] = x;
            }
        list[k] = -1;
        t->added_first[c] = list;
    }
    return HP_OK;
}

/* ---- from arrays ---- */

static const struct {
    const char *name;
    hp__pre_step steps[2];
    int n;
} g_pre[] = {
    {"gpt2", {{HP__PRE_BYTELEVEL, HP__RX_GPT2, true, false, false}}, 1},
    {"llama3", {{HP__PRE_SPLIT, HP__RX_LLAMA3, false, false, false}, {HP__PRE_BYTELEVEL, HP__RX_GPT2, false, false,
                                                                      false}}, 2},
    {"llama-bpe", {{HP__PRE_SPLIT, HP__RX_LLAMA3, false, false, false}, {HP__PRE_BYTELEVEL, HP__RX_GPT2, false, false,
                                                                         false}}, 2},
    {"qwen2", {{HP__PRE_SPLIT, HP__RX_QWEN2, false, false, false}, {HP__PRE_BYTELEVEL, HP__RX_GPT2, false, false,
                                                                    false}}, 2},
    {"smollm", {{HP__PRE_DIGITS, HP__RX_GPT2, false, false, true}, {HP__PRE_BYTELEVEL, HP__RX_GPT2, true, false,
                                                                    false}}, 2},
};

const char *hp_tok_pre_names(void) { return "gpt2, llama3 (llama-bpe), qwen2, smollm"; }

/* The merge "a b" of spec (one space between two non-empty tokens). */
static hp_status spec_merge(hp_tok *t, const char *m, int64_t i, hp_err *err)
{
    const char *sp = m ? strchr(m, ' ') : NULL;
    if (!sp || sp == m || !sp[1] || strchr(sp + 1, ' '))
        return hp_err_set(err, HP_ERR_INPUT, "tokenizer: merge %lld is not two tokens separated by one space", 
                          (long long)i);
    return hp__tok_merge(t, m, (size_t)(sp - m), sp + 1, strlen(sp + 1), i, "tokenizer", err);
}

static hp_status create(hp_tok *t, const hp_tok_spec *spec, hp_err *err)
{
    size_t p = 0;
    while (p < sizeof g_pre / sizeof *g_pre && (!spec->pre || strcmp(spec->pre, g_pre[p].name))) p++;
    if (p == sizeof g_pre / sizeof *g_pre)
        return hp_err_set(err, HP_ERR_INPUT, "tokenizer: the pre-tokenizer \"%s\" is not supported (supported: %s)",
                          spec->pre ? spec->pre : "(none)", hp_tok_pre_names());
    memcpy(t->pre, g_pre[p].steps, sizeof g_pre[p].steps);
    t->n_pre = g_pre[p].n;
    t->ignore_merges = spec->ignore_merges;
    if (spec->n_vocab < 1 || spec->n_vocab > HP_TOK_MAX_ID || !spec->tokens)
        return hp_err_set(err, HP_ERR_INPUT, "tokenizer: %lld tokens; a vocabulary has 1 to %d",
                          (long long)spec->n_vocab, HP_TOK_MAX_ID);
    hp_status st = HP_OK;
    for (int64_t i = 0; i < spec->n_vocab && st == HP_OK; i++)
        if (spec->tokens[i]) st = hp__tok_set(t, i, spec->tokens[i], strlen(spec->tokens[i]), HP_TOK_NORMAL,
                                              "tokenizer", err);
    for (int64_t i = 0; i < spec->n_vocab && st == HP_OK; i++) {
        hp_tok_kind k = spec->kinds ? spec->kinds[i] : HP_TOK_NORMAL;
        if (k != HP_TOK_NORMAL && spec->tokens[i])
            st = hp__tok_add(t, i, spec->tokens[i], strlen(spec->tokens[i]), k == HP_TOK_SPECIAL, false, false, false,
                             "tokenizer", err);
    }
    for (int64_t i = 0; i < spec->n_merges && st == HP_OK; i++) st = spec_merge(t, spec->merges[i], i, err);
    if (st != HP_OK) return st;
    t->bos_id = spec->bos_id < 0 ? -1 : spec->bos_id; /* hp__tok_finish checks them */
    t->eos_id = spec->eos_id < 0 ? -1 : spec->eos_id;
    if (spec->add_bos && t->bos_id >= 0) {
        t->prefix_ids = hp_arena_alloc(&t->arena, sizeof(int32_t));
        if (!t->prefix_ids) return hp_err_set(err, HP_ERR_NOMEM, "tokenizer: out of memory");
        t->prefix_ids[0] = t->bos_id;
        t->n_prefix = 1;
    }
    return hp__tok_finish(t, "tokenizer", err);
}

hp_status hp_tok_create(const hp_tok_spec *spec, hp_tok **out, hp_err *err)
{
    *out = NULL;
    hp_tok *t = hp__tok_new();
    if (!t) return hp_err_set(err, HP_ERR_NOMEM, "tokenizer: out of memory");
    hp_status st = create(t, spec, err);
    if (st != HP_OK) {
        hp_tok_free(t);
        return st;
    }
    *out = t;
    return HP_OK;
}

/* ---- lookups ---- */

int64_t hp_tok_n_vocab(const hp_tok *t) { return t->n_vocab; }

int64_t hp_tok_dropped(const hp_tok *t, int *first_byte)
{
    if (first_byte) *first_byte = t->first_dropped;
    return t->n_dropped;
}
int32_t hp_tok_bos(const hp_tok *t) { return t->bos_id; }
int32_t hp_tok_eos(const hp_tok *t) { return t->eos_id; }

int32_t hp_tok_id(const hp_tok *t, const char *token)
{
    return token ? hp__idmap_find(&t->by_str, t, false, token, strlen(token)) : -1;
}

const char *hp_tok_token(const hp_tok *t, int32_t id) { return id >= 0 && id < t->n_vocab ? t->tok[id].str : NULL; }

bool hp_tok_is_special(const hp_tok *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->tok[id].str && t->tok[id].kind == HP_TOK_SPECIAL;
}

const char *hp_tok_describe(const hp_tok *t, char *buf, size_t cap)
{
    char v[32], m[32];
    int n = snprintf(buf, cap, "BPE, %s ids, %s merges, %d added tokens, %spre-tokenizer ",
                     hp_format_count((uint64_t)t->n_vocab, v, sizeof v),
                     hp_format_count((uint64_t)t->n_merges, m, sizeof m), t->n_added, t->nfc ? "NFC, " : "");
    for (int i = 0; i < t->n_pre && n >= 0 && (size_t)n < cap; i++) {
        const hp__pre_step *s = &t->pre[i];
        const char *sep = i ? " + " : "";
        if (s->kind == HP__PRE_SPLIT) n += snprintf(buf + n, cap - (size_t)n, "%ssplit %s", sep, hp__regex_name(s->regex));
        else if (s->kind == HP__PRE_DIGITS)
            n += snprintf(buf + n, cap - (size_t)n, "%sdigits%s", sep, s->individual_digits ? " (single)" : "");
        else
            n += snprintf(buf + n, cap - (size_t)n, "%sbyte-level%s%s", sep, s->use_regex ? " (gpt2)" : "",
                          s->add_prefix_space ? " (prefix space)" : "");
    }
    if (t->n_pre == 0 && n >= 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "none");
    return buf;
}

/* ---- encode ---- */

typedef struct piece_ctx {
    hp_tok *t;
    hp_err *err;
} piece_ctx;

static hp_status piece(void *ctx, const uint8_t *s, size_t n)
{
    piece_ctx *c = ctx;
    return hp__bpe_piece(c->t, s, n, c->err);
}

/* Text between added tokens: pre-tokenized, each piece merged. */
static hp_status encode_plain(hp_tok *t, const uint8_t *s, size_t n, hp_err *err)
{
    piece_ctx c = {t, err};
    return n ? hp__pretokenize(t->pre, t->n_pre, t->scratch, s, n, piece, &c, err) : HP_OK;
}

/* Whether the character that ends just before s + p (p > 0) is whitespace; its start into *start. */
static bool space_before(const uint8_t *s, size_t p, size_t *start)
{
    size_t q = p - 1;
    while (q > 0 && p - q < 4 && (s[q] & 0xC0) == 0x80) q--;
    uint32_t cp;
    size_t len = hp__utf8_next(s + q, p - q, &cp);
    if (q + len != p) { /* not a whole character ending at p: one stray byte */
        q = p - 1;
        len = hp__utf8_next(s + q, 1, &cp);
    }
    *start = q;
    return hp__uc_class(cp) == HP__UC_S;
}

static hp_status split_added(hp_tok *t, const uint8_t *s, size_t n, bool normalized, hp_err *err);

/* The text between the added tokens that are not `normalized`: normalized, then the second pass. */
static hp_status normalize_then_split(hp_tok *t, const uint8_t *s, size_t n, hp_err *err)
{
    if (!t->nfc || hp__nfc_quick(s, n)) return split_added(t, s, n, true, err);
    hp_buf b;
    hp_buf_init(&b);
    hp__nfc(s, n, &b);
    hp_status st = b.oom ? hp_err_set(err, HP_ERR_NOMEM, "tokenizer: out of memory normalizing %zu bytes", n)
                         : split_added(t, (const uint8_t *)b.data, b.len, true, err);
    hp_buf_free(&b);
    return st;
}

/* The added tokens of one pass (normalized or not) in s [n]; the text between goes to the next pass, or is
 * encoded after the second. */
static hp_status split_added(hp_tok *t, const uint8_t *s, size_t n, bool normalized, hp_err *err)
{
    size_t done = 0; /* s [0, done) is encoded */
    for (size_t p = 0; p < n; p++) {
        const int32_t *list = t->added_first[s[p]];
        if (!list) continue;
        const hp__added *hit = NULL;
        for (; *list >= 0 && !hit; list++) {
            const hp__added *a = &t->added[*list];
            if (a->normalized == normalized && a->len <= n - p && !memcmp(s + p, a->text, a->len)) hit = a;
        }
        if (!hit) continue;
        size_t start = p, stop = p + hit->len, q;
        if (hit->lstrip)
            while (start > done && space_before(s, start, &q)) start = q < done ? done : q;
        if (hit->rstrip)
            while (stop < n) {
                uint32_t cp;
                size_t len = hp__utf8_next(s + stop, n - stop, &cp);
                if (hp__uc_class(cp) != HP__UC_S) break;
                stop += len;
            }
        hp_status st = normalized ? encode_plain(t, s + done, start - done, err)
                                  : normalize_then_split(t, s + done, start - done, err);
        if (st != HP_OK) return st;
        hp__out_push(t, hit->id);
        done = stop;
        p = stop - 1;
    }
    return normalized ? encode_plain(t, s + done, n - done, err) : normalize_then_split(t, s + done, n - done, err);
}

hp_status hp_tok_encode(hp_tok *t, const void *text, size_t len, bool add_special, int32_t **ids, int64_t *n,
                        hp_err *err)
{
    *ids = NULL;
    *n = 0;
    t->n_out = 0;
    t->out_oom = false;
    t->n_dropped = 0;
    t->first_dropped = -1;
    if (add_special)
        for (int i = 0; i < t->n_prefix; i++) hp__out_push(t, t->prefix_ids[i]);
    hp_status st = split_added(t, text, len, false, err);
    if (st != HP_OK) return st;
    if (add_special)
        for (int i = 0; i < t->n_suffix; i++) hp__out_push(t, t->suffix_ids[i]);
    if (!t->out && !t->out_oom) { /* a non-NULL array for no ids */
        hp__out_push(t, 0);
        t->n_out = 0;
    }
    if (t->out_oom) return hp_err_set(err, HP_ERR_NOMEM, "tokenizer: out of memory for %zu ids", t->n_out);
    *ids = t->out;
    *n = (int64_t)t->n_out;
    t->out = NULL;
    t->n_out = t->cap_out = 0;
    return HP_OK;
}

/* ---- decode ---- */

hp_status hp_tok_decode(const hp_tok *t, const int32_t *ids, int64_t n, bool skip_special, char **out, size_t *len,
                        hp_err *err)
{
    *out = NULL;
    *len = 0;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab || !t->tok[id].str)
            return hp_err_set(err, HP_ERR_INPUT, "id %d at position %lld is %s; the ids are not of this tokenizer",
                              id, (long long)i, id < 0 || id >= t->n_vocab ? "outside the vocabulary" : "no token");
        if (!(skip_special && t->tok[id].kind == HP_TOK_SPECIAL)) total += t->tok[id].n_bytes;
    }
    char *buf = malloc(total + 1);
    if (!buf) return hp_err_set(err, HP_ERR_NOMEM, "tokenizer: out of memory for %zu bytes of text", total);
    size_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        const hp__token *tk = &t->tok[ids[i]];
        if (skip_special && tk->kind == HP_TOK_SPECIAL) continue;
        memcpy(buf + k, tk->bytes, tk->n_bytes);
        k += tk->n_bytes;
    }
    buf[k] = '\0';
    *out = buf;
    *len = k;
    return HP_OK;
}
