/*
 * chat.c — conversations in the model's own format (docs/tokenizer.md, "Chat"). Chat templates are Jinja
 * programs; hyperpar runs no Jinja. It recognises the ChatML family (<|im_start|>ROLE\nTEXT<|im_end|>\n per message,
 * then <|im_start|>assistant\n when a generation prompt is asked for: SmolLM2, Qwen2) and renders that, with the
 * default system message a template writes itself when the first message is not a system one; any other template
 * is refused by name.
 *
 * A rendered conversation also says where each assistant message lies: the bytes of its content and its closing
 * <|im_end|>, what a template's {% generation %} block wraps and transformers' return_assistant_tokens_mask marks
 * (the newline after <|im_end|> is outside it). hp_tok_encode_marked turns those byte ranges into a mask of the
 * tokens, by transformers' rule: from the token holding a range's first byte to the one holding its last.
 *
 *   <|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n
 *                                                                                 |--- span ---|
 */
#include "tok/tok_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IM_START "<|im_start|>"
#define IM_END "<|im_end|>"

const char *hp_tok_chat_template(const hp_tok *tok)
{
    return tok->chat_template;
}

/* The default system message a ChatML template writes when the first message is not a system one: the literal
 * '<|im_start|>system\n' TEXT '<|im_end|>' quoted in the template (TEXT without quotes or braces), or NULL. */
static char *default_system(const char *tpl)
{
    static const char *const heads[] = {"'" IM_START "system\n", "'" IM_START "system\\n", "\"" IM_START "system\n",
                                        "\"" IM_START "system\\n"};
    for (size_t h = 0; h < sizeof heads / sizeof *heads; h++) {
        const char *p = strstr(tpl, heads[h]);
        if (!p) continue;
        p += strlen(heads[h]);
        const char *e = strstr(p, IM_END);
        if (!e || memchr(p, heads[h][0], (size_t)(e - p)) || memchr(p, '{', (size_t)(e - p))) continue;
        return strndup(p, (size_t)(e - p));
    }
    return NULL;
}

/* HP_OK when the tokenizer's chat template is a ChatML one hyperpar renders. */
static hp_status chatml(const hp_tok *tok, hp_err *err)
{
    const char *tpl = tok->chat_template;
    if (!tpl)
        return hp_err_set(err, HP_ERR_INPUT, "the tokenizer has no chat_template (tokenizer_config.json): give the "
                          "formatted prompt itself");
    if (!strstr(tpl, IM_START) || !strstr(tpl, IM_END) || !strstr(tpl, "add_generation_prompt") ||
        !strstr(tpl, "message['role']") || !strstr(tpl, "message['content']"))
        return hp_err_set(err, HP_ERR_INPUT, "the chat template is not a ChatML one (<|im_start|>role ... "
                          "<|im_end|>), the only kind hyperpar renders: give the formatted prompt itself");
    return HP_OK;
}

/* Appends n bytes of s to the growing buffer (*buf, *len, *cap); false when out of memory. */
static bool put(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1) c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return false;
        *buf = b, *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return true;
}

hp_status hp_tok_chat_render(const hp_tok *tok, const hp_tok_message *msgs, int64_t n, bool add_generation_prompt,
                             char **out, size_t *out_len, int64_t **spans, int64_t *n_spans, hp_err *err)
{
    *out = NULL;
    *out_len = 0;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    hp_status st = chatml(tok, err);
    if (st != HP_OK) return st;
    for (int64_t i = 0; i < n; i++)
        if (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") && strcmp(msgs[i].role, "assistant"))
            return hp_err_set(err, HP_ERR_INPUT, "message %lld has role '%.40s'; a ChatML conversation takes system, "
                              "user and assistant", (long long)i, msgs[i].role);
    char *dflt = n == 0 || strcmp(msgs[0].role, "system") ? default_system(tok->chat_template) : NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int64_t n_asst = 0, k = 0;
    for (int64_t i = 0; i < n; i++) n_asst += !strcmp(msgs[i].role, "assistant");
    int64_t *sp = spans ? calloc((size_t)(2 * n_asst + 1), sizeof *sp) : NULL;
    bool ok = !spans || sp;
    if (ok && dflt)
        ok = put(&buf, &len, &cap, IM_START "system\n", strlen(IM_START "system\n")) &&
             put(&buf, &len, &cap, dflt, strlen(dflt)) && put(&buf, &len, &cap, IM_END "\n", strlen(IM_END "\n"));
    for (int64_t i = 0; ok && i < n; i++) {
        bool asst = !strcmp(msgs[i].role, "assistant");
        ok = put(&buf, &len, &cap, IM_START, strlen(IM_START)) && put(&buf, &len, &cap, msgs[i].role,
                                                                     strlen(msgs[i].role)) &&
             put(&buf, &len, &cap, "\n", 1);
        if (ok && asst && sp) sp[2 * k] = (int64_t)len;
        ok = ok && put(&buf, &len, &cap, msgs[i].content, msgs[i].len) && put(&buf, &len, &cap, IM_END, strlen(IM_END));
        if (ok && asst && sp) sp[2 * k++ + 1] = (int64_t)len;
        ok = ok && put(&buf, &len, &cap, "\n", 1);
    }
    if (ok && add_generation_prompt)
        ok = put(&buf, &len, &cap, IM_START "assistant\n", strlen(IM_START "assistant\n"));
    if (ok && !buf) ok = put(&buf, &len, &cap, "", 0); /* nothing rendered: an empty string, not NULL */
    free(dflt);
    if (!ok) {
        free(buf), free(sp);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory for a conversation");
    }
    *out = buf;
    *out_len = len;
    if (spans) *spans = sp;
    if (n_spans) *n_spans = n_asst;
    return HP_OK;
}

hp_status hp_tok_chat(const hp_tok *tok, const char *system, const char *user, char **out, hp_err *err)
{
    hp_tok_message m[2] = {{"system", system, system ? strlen(system) : 0}, {"user", user, strlen(user)}};
    size_t len;
    return hp_tok_chat_render(tok, system ? m : m + 1, system ? 2 : 1, true, out, &len, NULL, NULL, err);
}

hp_status hp_tok_encode_marked(hp_tok *tok, const void *text, size_t len, bool add_special, const int64_t *spans,
                               int64_t n_spans, int32_t **ids, uint8_t **mask, int64_t *n, hp_err *err)
{
    *mask = NULL;
    hp_status st = hp_tok_encode(tok, text, len, add_special, ids, n, err);
    if (st != HP_OK) return st;
    uint8_t *mk = calloc((size_t)*n + 1, 1);
    int64_t *at = malloc(((size_t)*n + 1) * sizeof *at); /* at[i]: the first byte of token i; at[n] the end */
    if (!mk || !at) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory for a mask of %lld tokens", (long long)*n);
    size_t pos = 0;
    for (int64_t i = 0; st == HP_OK && i < *n; i++) {
        const hp__token *tk = &tok->tok[(*ids)[i]];
        at[i] = (int64_t)pos;
        if (pos + tk->n_bytes > len || memcmp((const char *)text + pos, tk->bytes, tk->n_bytes))
            break;
        pos += tk->n_bytes;
    }
    /* Byte offsets are the tokens' only where the ids decode to the text itself (no normalizer change, prefix
     * space, dropped byte or template token). */
    if (st == HP_OK && pos != len)
        st = hp_err_set(err, HP_ERR_INPUT, "the tokens do not decode back to the text (byte %zu of %zu differs: a "
                        "normalizer, a prefix space, a byte without a token or a post-processor token), so the "
                        "assistant messages' tokens cannot be located", pos, len);
    if (st == HP_OK) at[*n] = (int64_t)len;
    for (int64_t s = 0, i = 0; st == HP_OK && s < n_spans; s++) {
        int64_t lo = spans[2 * s], hi = spans[2 * s + 1];
        if (lo >= hi) continue;
        while (i > 0 && at[i] > lo) i--; /* spans come in order; this only guards against one that does not */
        while (at[i + 1] <= lo) i++;     /* the token holding byte lo */
        for (; i < *n && at[i] < hi; i++) mk[i] = 1;
        if (i > 0) i--;
    }
    free(at);
    if (st != HP_OK) {
        free(mk), free(*ids);
        *ids = NULL, *n = 0;
        return st;
    }
    *mask = mk;
    return HP_OK;
}
