/*
 * text.c — the token stream `train --text` trains on (docs/train.md, "Text"): a text file tokenized with the
 * model's tokenizer, one document after another, each followed by the tokenizer's EOS id.
 *
 *   FILE (any name but *.jsonl)   one document: the whole file
 *   FILE.jsonl                    one document a line: {"text": "..."} encoded as `hyperpar tokenize` encodes a
 *                                 file (the post-processor's tokens added), or {"messages": [{"role", "content"},
 *                                 ...]} rendered in the model's ChatML format (hp_tok_chat_render) and encoded
 *                                 without special tokens (apply_chat_template's ids); blank lines are skipped
 *
 *   stream:  | doc 0 ... | EOS | doc 1 ... | EOS | ...
 *   mask:    | 0 0 1 1 0 |  0  | 0 1 1 1 0 |  0  |        (loss_mask: 1 on the assistant messages' tokens)
 *
 * With loss_mask every line must be a conversation, and the mask marks each assistant message's content and
 * its <|im_end|> (hp_tok_encode_marked: transformers' return_assistant_tokens_mask); the EOS after a document is
 * not marked. Any line that is not one of these objects is HP_ERR_INPUT naming the file and the line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "hyperpar/data.h"
#include "io/json.h"

bool hp_data_is_jsonl(const char *path)
{
    size_t n = strlen(path);
    return n >= 6 && !strcmp(path + n - 6, ".jsonl");
}

void hp_text_tokens_free(hp_text_tokens *t)
{
    if (!t) return;
    free(t->ids);
    free(t->mask);
    memset(t, 0, sizeof *t);
}

/* The growing stream: ids [n] (and mask [n] with a mask), capacity cap. */
typedef struct tstream {
    hp_text_tokens *t;
    int64_t cap;
    bool masked;
} tstream;

/* Appends ids [n] (mask [n], or NULL: 0s) and then EOS (mask 0). */
static hp_status append(tstream *s, const int32_t *ids, const uint8_t *mask, int64_t n, int32_t eos, hp_err *err)
{
    hp_text_tokens *t = s->t;
    if (t->n + n + 1 > s->cap) {
        int64_t c = s->cap ? s->cap : 4096;
        while (c < t->n + n + 1) c *= 2;
        int32_t *a = realloc(t->ids, (size_t)c * sizeof *a);
        if (a) t->ids = a;
        uint8_t *b = a && s->masked ? realloc(t->mask, (size_t)c) : NULL;
        if (b) t->mask = b;
        if (!a || (s->masked && !b))
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory for %lld tokens", (long long)(t->n + n + 1));
        s->cap = c;
    }
    memcpy(t->ids + t->n, ids, (size_t)n * sizeof *ids);
    if (s->masked) {
        if (mask) memcpy(t->mask + t->n, mask, (size_t)n);
        else memset(t->mask + t->n, 0, (size_t)n);
        for (int64_t i = 0; mask && i < n; i++) t->n_marked += mask[i] != 0;
        t->mask[t->n + n] = 0;
    }
    t->ids[t->n + n] = eos;
    t->n += n + 1;
    t->n_docs++;
    return HP_OK;
}

/* Counts what the last encode left out (bytes without a token). */
static void count_dropped(hp_tok *tok, hp_text_tokens *t)
{
    int first;
    int64_t d = hp_tok_dropped(tok, &first);
    if (d && !t->n_dropped) t->first_dropped = first;
    t->n_dropped += d;
}

/* One document of text [len]: encoded as `hyperpar tokenize` encodes a file, then EOS. */
static hp_status add_text(hp_tok *tok, tstream *s, const char *text, size_t len, hp_err *err)
{
    int32_t *ids;
    int64_t n;
    hp_status st = hp_tok_encode(tok, text, len, true, &ids, &n, err);
    if (st != HP_OK) return st;
    count_dropped(tok, s->t);
    st = append(s, ids, NULL, n, hp_tok_eos(tok), err);
    free(ids);
    return st;
}

/* A line's "messages" (msgs, an array) as a conversation: rendered, encoded (with its mask under loss_mask),
 * then EOS. where: "FILE: line N". */
static hp_status add_chat(hp_tok *tok, tstream *s, json_t *msgs, const char *where, hp_err *err)
{
    size_t n = json_array_size(msgs);
    hp_tok_message *m = calloc(n + 1, sizeof *m);
    if (!m) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_status st = HP_OK;
    for (size_t i = 0; st == HP_OK && i < n; i++) {
        json_t *e = json_array_get(msgs, i), *role = json_object_get(e, "role");
        json_t *content = json_object_get(e, "content");
        if (!json_is_object(e) || !json_is_string(role) || !json_is_string(content))
            st = hp_err_set(err, HP_ERR_INPUT, "%s: messages[%zu] is not {\"role\": \"...\", \"content\": \"...\"} "
                            "(both strings)", where, i);
        else
            m[i] = (hp_tok_message){json_string_value(role), json_string_value(content), json_string_length(content)};
    }
    char *text = NULL;
    size_t len = 0;
    int64_t *spans = NULL, n_spans = 0;
    if (st == HP_OK) st = hp_tok_chat_render(tok, m, (int64_t)n, false, &text, &len, &spans, &n_spans, err);
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    int64_t k = 0;
    if (st == HP_OK && s->masked)
        st = hp_tok_encode_marked(tok, text, len, false, spans, n_spans, &ids, &mask, &k, err);
    else if (st == HP_OK)
        st = hp_tok_encode(tok, text, len, false, &ids, &k, err);
    if (st == HP_OK) count_dropped(tok, s->t);
    if (st == HP_OK) st = append(s, ids, mask, k, hp_tok_eos(tok), err);
    else if (st == HP_ERR_INPUT && strncmp(err->msg, where, strlen(where))) hp_err_prefix(err, "%s", where);
    free(ids), free(mask), free(spans), free(text), free(m);
    return st;
}

/* Line `line` of path (text [len], not blank) as one document. */
static hp_status add_line(hp_tok *tok, tstream *s, const char *path, int64_t line, const char *text, size_t len,
                          hp_err *err)
{
    char where[4200];
    snprintf(where, sizeof where, "%s: line %lld", path, (long long)line);
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    if (!j)
        return hp_err_set(err, HP_ERR_INPUT, "%s, column %d: not JSON (%s); a .jsonl file holds one JSON object a "
                          "line, {\"text\": \"...\"} or {\"messages\": [...]}", where, je.column, je.text);
    json_t *tx = json_object_get(j, "text"), *ms = json_object_get(j, "messages");
    hp_status st = HP_OK;
    if (!json_is_object(j))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: a JSON %s, not an object {\"text\": \"...\"} or {\"messages\": [...]}",
                        where, json_is_array(j) ? "array" : json_is_string(j) ? "string" : "value");
    else if (tx && ms)
        st = hp_err_set(err, HP_ERR_INPUT, "%s: both \"text\" and \"messages\"; give one of them a line", where);
    else if (s->masked && !ms)
        st = hp_err_set(err, HP_ERR_INPUT, "%s has no \"messages\": --loss-mask trains on conversations, "
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, {\"role\": \"assistant\", ...}]}, "
                        "and counts only the assistant's tokens", where);
    else if (ms && !json_is_array(ms))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: \"messages\" is not an array of {\"role\", \"content\"}", where);
    else if (!ms && !json_is_string(tx))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: %s; each line is {\"text\": \"...\"} (a string) or {\"messages\": "
                        "[...]}", where, tx ? "\"text\" is not a string" : "no \"text\"");
    else if (ms)
        st = add_chat(tok, s, ms, where, err);
    else
        st = add_text(tok, s, json_string_value(tx), json_string_length(tx), err);
    json_decref(j);
    return st;
}

/* Every line of a .jsonl file text [len] that is not blank, as a document. */
static hp_status add_lines(hp_tok *tok, tstream *s, const char *path, const char *text, size_t len, hp_err *err)
{
    hp_status st = HP_OK;
    int64_t line = 0;
    for (size_t p = 0; st == HP_OK && p < len;) {
        const char *nl = memchr(text + p, '\n', len - p);
        size_t e = nl ? (size_t)(nl - text) : len;
        line++;
        size_t q = p;
        while (q < e && (text[q] == ' ' || text[q] == '\t' || text[q] == '\r')) q++;
        if (q < e) st = add_line(tok, s, path, line, text + p, e - p, err);
        p = e + 1;
    }
    if (st == HP_OK && s->t->n_docs == 0)
        st = hp_err_set(err, HP_ERR_INPUT, "%s holds no document (every line is blank); a .jsonl file holds one "
                        "{\"text\": \"...\"} or {\"messages\": [...]} a line", path);
    return st;
}

hp_status hp_data_text(hp_tok *tok, const char *path, bool loss_mask, hp_text_tokens *out, hp_err *err)
{
    memset(out, 0, sizeof *out);
    out->first_dropped = -1;
    bool jsonl = hp_data_is_jsonl(path);
    if (hp_tok_eos(tok) < 0)
        return hp_err_set(err, HP_ERR_INPUT, "the tokenizer has no EOS token, which separates --text's documents; "
                          "name one as eos_token in tokenizer_config.json beside tokenizer.json");
    if (loss_mask && !jsonl)
        return hp_err_set(err, HP_ERR_INPUT, "--loss-mask: %s is not a .jsonl file; the mask needs conversations, one "
                          "{\"messages\": [...]} a line of a FILE.jsonl", path);
    char *text;
    size_t len;
    hp_status st = hp__read_file(path, HP_TOK_MAX_TEXT, &text, &len, err);
    if (st != HP_OK) return st;
    out->bytes = len;
    tstream s = {.t = out, .masked = loss_mask};
    if (len == 0)
        st = hp_err_set(err, HP_ERR_INPUT, "%s is empty: there is no text to train on", path);
    else if (jsonl)
        st = add_lines(tok, &s, path, text, len, err);
    else if ((st = add_text(tok, &s, text, len, err)) != HP_OK)
        hp_err_prefix(err, "%s", path);
    free(text);
    if (st != HP_OK) hp_text_tokens_free(out);
    return st;
}
