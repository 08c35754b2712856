/* test_text.c — what `train --text` trains on (docs/train.md, "Text"): a ChatML conversation rendered with its
 * assistant spans (hp_tok_chat_render), the tokens of those spans (hp_tok_encode_marked), the token stream of a
 * text or .jsonl file with EOS after each document and the assistant mask (hp_data_text), and the in-memory source
 * cut into windows with their masks (hp_data_open_ids); every error with its status and a stable part of its
 * message. The tokenizer is tests/data/text's (120 ids, EOS <|im_end|>, a ChatML template with generation blocks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/data.h"
#include "hyperpar/tokenizer.h"
#include "testlib.h"

#define TOKDIR "data/text"

static hp_tok *load(void)
{
    hp_tok *t = NULL;
    hp_err err;
    CHECK_EQ_INT(hp_tok_load(TOKDIR, &t, &err), HP_OK);
    return t;
}

/* A file of the given text in the run's scratch folder. */
static const char *file_of(const char *name, const char *text)
{
    static char p[8][512];
    static int k;
    char *s = p[k++ % 8];
    snprintf(s, 512, "%s/%s", test_work_dir("text"), name);
    FILE *f = fopen(s, "wb");
    CHECK(f != NULL);
    if (f) {
        fwrite(text, 1, strlen(text), f);
        fclose(f);
    }
    return s;
}

/* tokenizer.json named as a file reads the tokenizer_config.json beside it, as its folder does (its EOS, its
 * template). */
TEST(load_file_or_folder)
{
    hp_tok *a = load(), *b = NULL;
    hp_err err;
    CHECK_EQ_INT(hp_tok_load(TOKDIR "/tokenizer.json", &b, &err), HP_OK);
    CHECK(a && b && hp_tok_eos(a) == 2 && hp_tok_eos(b) == 2);
    CHECK(b && hp_tok_chat_template(b) && !strcmp(hp_tok_chat_template(a), hp_tok_chat_template(b)));
    hp_tok_free(a);
    hp_tok_free(b);
}

TEST(chat_render_spans)
{
    hp_tok *t = load();
    hp_err err;
    hp_tok_message m[] = {{"user", "hi?", 3}, {"assistant", "yes.", 4}, {"user", "no", 2}, {"assistant", "", 0}};
    char *text;
    size_t len;
    int64_t *sp, ns;
    CHECK_EQ_INT(hp_tok_chat_render(t, m, 4, false, &text, &len, &sp, &ns, &err), HP_OK);
    const char *want = "<|im_start|>system\nyou are a test assistant.<|im_end|>\n<|im_start|>user\nhi?<|im_end|>\n"
                       "<|im_start|>assistant\nyes.<|im_end|>\n<|im_start|>user\nno<|im_end|>\n"
                       "<|im_start|>assistant\n<|im_end|>\n";
    CHECK_STR_EQ(text, want);
    CHECK(len == strlen(want) && ns == 2);
    /* each span: the content and its <|im_end|>, not the newline after it */
    CHECK(!strncmp(text + sp[0], "yes.<|im_end|>\n<|im_start|>user", 30) && sp[1] - sp[0] == 14);
    CHECK(!strncmp(text + sp[2], "<|im_end|>", 10) && sp[3] - sp[2] == 10);
    free(text), free(sp);
    /* a system message first: no default; a generation prompt at the end */
    hp_tok_message s[] = {{"system", "be a cat.", 9}, {"user", "mew", 3}};
    CHECK_EQ_INT(hp_tok_chat_render(t, s, 2, true, &text, &len, NULL, NULL, &err), HP_OK);
    CHECK_STR_EQ(text, "<|im_start|>system\nbe a cat.<|im_end|>\n<|im_start|>user\nmew<|im_end|>\n"
                       "<|im_start|>assistant\n");
    free(text);
    /* hp_tok_chat is the one-turn case */
    CHECK_EQ_INT(hp_tok_chat(t, NULL, "mew", &text, &err), HP_OK);
    CHECK_STR_EQ(text, "<|im_start|>system\nyou are a test assistant.<|im_end|>\n<|im_start|>user\nmew<|im_end|>\n"
                       "<|im_start|>assistant\n");
    free(text);
    hp_tok_message bad[] = {{"user", "a", 1}, {"tool", "b", 1}};
    CHECK_EQ_INT(hp_tok_chat_render(t, bad, 2, false, &text, &len, &sp, &ns, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "message 1 has role 'tool'; a ChatML conversation takes system, user and assistant");
    CHECK(text == NULL && sp == NULL);
    hp_tok_free(t);
}

TEST(encode_marked)
{
    hp_tok *t = load();
    hp_err err;
    hp_tok_message m[] = {{"user", "what is two?", 12}, {"assistant", "two is big.", 11}};
    char *text;
    size_t len;
    int64_t *sp, ns, n;
    int32_t *ids;
    uint8_t *mask;
    CHECK_EQ_INT(hp_tok_chat_render(t, m, 2, false, &text, &len, &sp, &ns, &err), HP_OK);
    CHECK_EQ_INT(hp_tok_encode_marked(t, text, len, false, sp, ns, &ids, &mask, &n, &err), HP_OK);
    /* the marked tokens decode to the assistant's content and its <|im_end|>; the others to the rest */
    char marked[256] = "", other[512] = "";
    for (int64_t i = 0; i < n; i++) {
        char *s;
        size_t l;
        CHECK_EQ_INT(hp_tok_decode(t, &ids[i], 1, false, &s, &l, &err), HP_OK);
        strncat(mask[i] ? marked : other, s, mask[i] ? sizeof marked - strlen(marked) - 1
                                                     : sizeof other - strlen(other) - 1);
        free(s);
    }
    CHECK_STR_EQ(marked, "two is big.<|im_end|>");
    CHECK(strlen(other) + strlen(marked) == len);
    CHECK(mask[n - 1] == 0 && mask[n - 2] == 1 && ids[n - 2] == hp_tok_eos(t)); /* "\n" after <|im_end|> */
    free(ids), free(mask);
    /* a span inside a token marks the token holding it */
    int64_t mid[2] = {1, 2};
    CHECK_EQ_INT(hp_tok_encode_marked(t, "the cat", 7, false, mid, 1, &ids, &mask, &n, &err), HP_OK);
    for (int64_t i = 0, at = 0; i < n; i++) {
        char *s;
        size_t l;
        CHECK_EQ_INT(hp_tok_decode(t, &ids[i], 1, false, &s, &l, &err), HP_OK);
        CHECK(mask[i] == (at <= 1 && 1 < at + (int64_t)l)); /* only the token holding byte 1 */
        at += (int64_t)l;
        free(s);
    }
    free(ids), free(mask);
    /* bytes without a token (uppercase: not in this vocabulary) do not decode back: refused */
    CHECK_EQ_INT(hp_tok_encode_marked(t, "the CAT", 7, false, mid, 1, &ids, &mask, &n, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "the tokens do not decode back to the text (byte 4 of 7 differs");
    CHECK(ids == NULL && mask == NULL);
    free(text), free(sp);
    hp_tok_free(t);
}

/* The ids of text through hp_tok_encode with special tokens, as `hyperpar tokenize` makes them. */
static int64_t encode(hp_tok *t, const char *text, int32_t *out, int64_t cap)
{
    hp_err err;
    int32_t *ids;
    int64_t n;
    CHECK_EQ_INT(hp_tok_encode(t, text, strlen(text), true, &ids, &n, &err), HP_OK);
    for (int64_t i = 0; i < n && i < cap; i++) out[i] = ids[i];
    free(ids);
    return n;
}

TEST(text_streams)
{
    hp_tok *t = load();
    hp_err err;
    hp_text_tokens tt;
    int32_t want[256];
    int32_t eos = hp_tok_eos(t);
    CHECK(eos == 2);
    /* a plain file: one document, then EOS */
    CHECK_EQ_INT(hp_data_text(t, file_of("a.txt", "the cat sat.\n\nyes no"), false, &tt, &err), HP_OK);
    int64_t n = encode(t, "the cat sat.\n\nyes no", want, 256);
    CHECK(tt.n == n + 1 && tt.n_docs == 1 && tt.mask == NULL && tt.ids[n] == eos && tt.bytes == 20);
    CHECK(!memcmp(tt.ids, want, (size_t)n * sizeof *want));
    hp_text_tokens_free(&tt);
    /* JSON Lines: each "text" a document, blank lines skipped, other keys ignored */
    CHECK_EQ_INT(hp_data_text(t, file_of("b.jsonl", "{\"text\": \"the cat\", \"id\": 7}\n\n  \r\n{\"text\": \"a\\nb\"}"),
                              false, &tt, &err), HP_OK);
    int64_t n1 = encode(t, "the cat", want, 256), n2 = encode(t, "a\nb", want + n1 + 1, 256 - n1 - 1);
    want[n1] = eos, want[n1 + n2 + 1] = eos;
    CHECK(tt.n == n1 + n2 + 2 && tt.n_docs == 2);
    CHECK(!memcmp(tt.ids, want, (size_t)tt.n * sizeof *want));
    hp_text_tokens_free(&tt);
    /* conversations: the mask marks the assistant's tokens, never an EOS after a document */
    const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                       "\"content\": \"yes.\"}]}\n{\"messages\": [{\"role\": \"user\", \"content\": \"no\"}]}\n";
    CHECK_EQ_INT(hp_data_text(t, file_of("c.jsonl", chat), true, &tt, &err), HP_OK);
    CHECK(tt.n_docs == 2 && tt.mask && tt.n_marked > 2 && tt.ids[tt.n - 1] == eos && tt.mask[tt.n - 1] == 0);
    int64_t marked = 0;
    for (int64_t i = 0; i < tt.n; i++) marked += tt.mask[i];
    CHECK(marked == tt.n_marked);
    int64_t n_masked = tt.n;
    hp_text_tokens_free(&tt);
    /* the same conversations without --loss-mask: the same ids, no mask */
    CHECK_EQ_INT(hp_data_text(t, file_of("c.jsonl", chat), false, &tt, &err), HP_OK);
    CHECK(tt.n == n_masked && tt.mask == NULL);
    hp_text_tokens_free(&tt);
    hp_tok_free(t);
}

TEST(text_errors)
{
    hp_tok *t = load();
    hp_err err;
    hp_text_tokens tt;
    static const struct {
        const char *name, *text;
        bool mask;
        const char *msg;
    } cases[] = {
        {"e.txt", "", false, "e.txt is empty: there is no text to train on"},
        {"e.jsonl", "\n \n", false, "e.jsonl holds no document (every line is blank)"},
        {"j1.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"\n", false, "j1.jsonl: line 2, column"},
        {"j2.jsonl", "{\"text\": \"a\"}\n[1, 2]\n", false, "j2.jsonl: line 2: a JSON array, not an object"},
        {"j3.jsonl", "{\"txt\": \"a\"}\n", false, "j3.jsonl: line 1: no \"text\""},
        {"j4.jsonl", "{\"text\": 5}\n", false, "j4.jsonl: line 1: \"text\" is not a string"},
        {"j5.jsonl", "{\"text\": \"a\", \"messages\": []}\n", false, "j5.jsonl: line 1: both \"text\" and \"messages\""},
        {"j6.jsonl", "{\"text\": \"a\"}\n", true, "j6.jsonl: line 1 has no \"messages\": --loss-mask trains on"},
        {"j7.jsonl", "{\"messages\": [{\"role\": \"user\"}]}\n", true,
         "j7.jsonl: line 1: messages[0] is not {\"role\": \"...\", \"content\": \"...\"}"},
        {"j8.jsonl", "\n{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}\n", false,
         "j8.jsonl: line 2: message 0 has role 'tool'"},
        {"j9.jsonl", "{\"messages\": {\"role\": \"user\"}}\n", false, "j9.jsonl: line 1: \"messages\" is not an array"},
        {"p.txt", "hello", true, "--loss-mask: "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memset(&err, 0, sizeof err);
        CHECK_EQ_INT(hp_data_text(t, file_of(cases[i].name, cases[i].text), cases[i].mask, &tt, &err), HP_ERR_INPUT);
        CHECK_STR_CONTAINS(err.msg, cases[i].msg);
        CHECK(tt.ids == NULL && tt.mask == NULL);
    }
    char missing[600];
    snprintf(missing, sizeof missing, "%s/missing.txt", test_work_dir("text"));
    CHECK_EQ_INT(hp_data_text(t, missing, false, &tt, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "missing.txt");
    hp_tok_free(t);
}

/* Every prefix of a .jsonl of conversations either tokenizes (a cut at a line's end) or is HP_ERR_INPUT naming a
 * line, with nothing returned; never a crash or a leak. */
TEST(jsonl_truncation_sweep)
{
    hp_tok *t = load();
    const char *chat = "{\"messages\": [{\"role\": \"system\", \"content\": \"be a cat.\"}, {\"role\": \"user\", "
                       "\"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"mew\\n\"}]}\n"
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"\\u00e9?\"}, {\"role\": \"assistant\", "
                       "\"content\": \"no.\"}]}\n";
    size_t len = strlen(chat);
    char *buf = malloc(len + 1);
    int ok = 0;
    for (size_t k = 1; buf && k < len; k++) {
        memcpy(buf, chat, k);
        buf[k] = '\0';
        hp_err err;
        hp_text_tokens tt;
        hp_status st = hp_data_text(t, file_of("cut.jsonl", buf), true, &tt, &err);
        if (st == HP_OK) {
            ok++;
            CHECK(tt.n_docs >= 1 && tt.mask != NULL);
            hp_text_tokens_free(&tt);
        } else {
            CHECK_EQ_INT(st, HP_ERR_INPUT);
            CHECK_STR_CONTAINS(err.msg, "cut.jsonl: line ");
            CHECK(tt.ids == NULL && tt.mask == NULL);
        }
    }
    CHECK(ok == 2); /* the first line whole, without and with its newline */
    free(buf);
    hp_tok_free(t);
}

TEST(memory_source)
{
    hp_err err;
    hp_data *d = NULL;
    int32_t ids[20];
    uint8_t mask[20] = {0};
    for (int i = 0; i < 20; i++) ids[i] = i + 1;
    mask[3] = mask[4] = mask[9] = 1;
    /* S = 4: W = floor(19 / 4) = 4 windows of 5 tokens, one shared */
    CHECK_EQ_INT(hp_data_open_ids(&d, "--text t", ids, mask, 20, 4, &err), HP_OK);
    CHECK(hp_data_windows(d) == 4 && hp_data_row_len(d) == 5 && hp_data_masked(d));
    int64_t row[5];
    CHECK_EQ_INT(hp_data_rows(d, 1, 1, 100, row, &err), HP_OK);
    CHECK(row[0] == 5 && row[4] == 9);
    uint8_t m[5];
    hp_data_window_mask(d, 0, m); /* tokens 0..4: 3 and 4 marked; token 0 is no window's target here */
    CHECK(m[3] == 1 && m[4] == 1 && m[0] == 0);
    CHECK(hp_data_window_scored(d, 0) == 2 && hp_data_window_scored(d, 1) == 0 && hp_data_window_scored(d, 2) == 1);
    /* token 4 is window 0's last target and window 1's first input: counted once */
    CHECK(hp_data_window_scored(d, 3) == 0);
    CHECK_EQ_INT(hp_data_rows(d, 0, 1, 4, row, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "--text t: token 3 of its token stream is 4, outside the vocabulary [0, 4) of the "
                                "model; the tokenizer is not the model's");
    hp_data_close(d);
    /* without a mask every window scores S */
    CHECK_EQ_INT(hp_data_open_ids(&d, "--text t", ids, NULL, 20, 4, &err), HP_OK);
    CHECK(!hp_data_masked(d) && hp_data_window_scored(d, 2) == 4);
    hp_data_window_mask(d, 2, m);
    CHECK(m[0] == 1 && m[4] == 1);
    hp_data_close(d);
    CHECK_EQ_INT(hp_data_open_ids(&d, "--text t", ids, NULL, 20, 19, &err), HP_OK);
    hp_data_close(d);
    CHECK_EQ_INT(hp_data_open_ids(&d, "--text t", ids, NULL, 20, 20, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "--text t gives 20 tokens, fewer than one window of --seq 20 (21 tokens");
    CHECK(d == NULL);
}

TEST(no_eos)
{
    /* a tokenizer without EOS (none named, none of the usual names a token) cannot separate documents */
    const char *tj = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}, "
                     "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}, "
                     "\"decoder\": {\"type\": \"ByteLevel\"}, \"added_tokens\": []}";
    hp_tok *t = NULL;
    hp_err err;
    CHECK_EQ_INT(hp_tok_load_json(tj, strlen(tj), "tokenizer.json", &t, &err), HP_OK);
    hp_text_tokens tt;
    CHECK_EQ_INT(hp_data_text(t, file_of("ne.txt", "ab"), false, &tt, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "the tokenizer has no EOS token, which separates --text's documents");
    /* and no chat template: a conversation is refused by name */
    CHECK_EQ_INT(hp_tok_chat(t, NULL, "a", &(char *){NULL}, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "no chat_template");
    hp_tok_free(t);
}

TEST_MAIN()
