/*
 * test_tok.c — the tokenizer (src/tok) on hand-made tokenizers: the pre-tokenizer patterns' traps, merges by rank
 * (order, ties, duplicates, ignore_merges), added tokens (longest first, lstrip/rstrip, the normalized pass),
 * templates, decode, the token files, and hostile tokenizer.json files (every error a status and a sentence,
 * a truncation sweep that never crashes). tests/python/test_tokenize.py compares whole texts with Hugging Face.
 */
#include "testlib.h"
#include "hyperpar/tokenizer.h"
#include "tok/tok_int.h"
#include "hyperpar/data.h"

/* The pieces regex r cuts s into, joined by '|'. */
static const char *cut(hp__regex r, const char *s)
{
    static char out[1024];
    size_t n = strlen(s), k = 0;
    for (size_t p = 0; p < n;) {
        size_t m = hp__regex_match(r, (const uint8_t *)s + p, n - p);
        if (p) out[k++] = '|';
        memcpy(out + k, s + p, m);
        k += m;
        p += m;
    }
    out[k] = '\0';
    return out;
}

TEST(pattern_gpt2)
{
    CHECK_STR_EQ(cut(HP__RX_GPT2, "a   b"), "a|  | b");
    CHECK_STR_EQ(cut(HP__RX_GPT2, "a \nb"), "a| |\n|b");
    CHECK_STR_EQ(cut(HP__RX_GPT2, "it's IT'S"), "it|'s| IT|'|S");
    CHECK_STR_EQ(cut(HP__RX_GPT2, "x  "), "x|  ");
    CHECK_STR_EQ(cut(HP__RX_GPT2, "a12 34!?"), "a|12| 34|!?");
    CHECK_STR_EQ(cut(HP__RX_GPT2, " 's"), " '|s");
    CHECK_STR_EQ(cut(HP__RX_GPT2, "a\xc2\xa0\xc2\xa0" "b"), "a|\xc2\xa0|\xc2\xa0|b"); /* U+00A0 is \s, not ' ' */
    CHECK_STR_EQ(cut(HP__RX_GPT2, "a\x1c" "b"), "a|\x1c|b");                         /* U+001C is not \s */
    CHECK_STR_EQ(cut(HP__RX_GPT2, "\xff\xfe" "a"), "\xff\xfe|a");                     /* bytes of no class */
}

TEST(pattern_llama3)
{
    CHECK_STR_EQ(cut(HP__RX_LLAMA3, "it's IT'S we'LL"), "it|'s| IT|'S| we|'LL");
    CHECK_STR_EQ(cut(HP__RX_LLAMA3, "it'\xc5\xbf"), "it|'\xc5\xbf"); /* U+017F folds to s */
    CHECK_STR_EQ(cut(HP__RX_LLAMA3, "1234567"), "123|456|7");
    CHECK_STR_EQ(cut(HP__RX_LLAMA3, "(word\t(x\tx"), "(word|\t|(x|\tx");
    CHECK_STR_EQ(cut(HP__RX_LLAMA3, "foo \r\n  bar"), "foo| \r\n| | bar");
    CHECK_STR_EQ(cut(HP__RX_LLAMA3, "a\n\n\nb"), "a|\n\n\n|b");
    CHECK_STR_EQ(cut(HP__RX_LLAMA3, "x!!\r\n\r\ny"), "x|!!\r\n\r\n|y");
    CHECK_STR_EQ(cut(HP__RX_LLAMA3, "a   b"), "a|  | b");
    CHECK_STR_EQ(cut(HP__RX_LLAMA3, "x\xc2\x85y"), "x|\xc2\x85y"); /* U+0085 is \s and takes the word */
    CHECK_STR_EQ(cut(HP__RX_QWEN2, "1234 x"), "1|2|3|4| x");
}

/* A tokenizer over the alphabet a, b, c and the space, from arrays. */
static hp_tok *tiny(const char *const *merges, int64_t n_merges, bool ignore, hp_err *err)
{
    static const char *const vocab[] = {"a", "b", "c", "\xc4\xa0", "ab", "bc", "abc", "aa", "Ġa", "Ġab", "cab",
                                        "<s>", "</s>"};
    static const hp_tok_kind kinds[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, HP_TOK_SPECIAL, HP_TOK_SPECIAL};
    hp_tok_spec s = {.n_vocab = 13, .tokens = vocab, .kinds = kinds, .n_merges = n_merges, .merges = merges,
                     .pre = "gpt2", .bos_id = 11, .eos_id = 12, .add_bos = true, .ignore_merges = ignore};
    hp_tok *t = NULL;
    hp_status st = hp_tok_create(&s, &t, err);
    return st == HP_OK ? t : NULL;
}

/* The ids of text, as "1 2 3". */
static const char *ids_of(hp_tok *t, const char *text, bool special)
{
    static char out[1024];
    int32_t *ids;
    int64_t n;
    hp_err err;
    if (hp_tok_encode(t, text, strlen(text), special, &ids, &n, &err) != HP_OK) return "error";
    size_t k = 0;
    out[0] = '\0';
    for (int64_t i = 0; i < n; i++) k += (size_t)snprintf(out + k, sizeof out - k, i ? " %d" : "%d", ids[i]);
    free(ids);
    return out;
}

TEST(merges_by_rank)
{
    hp_err err;
    const char *m1[] = {"b c", "a b", "a bc"}; /* "b c" first: abc -> a bc -> abc */
    hp_tok *t = tiny(m1, 3, false, &err);
    CHECK(t != NULL);
    if (!t) return;
    CHECK_STR_EQ(ids_of(t, "abc", false), "6");
    CHECK_STR_EQ(ids_of(t, "abc", true), "11 6"); /* the BOS */
    CHECK_STR_EQ(ids_of(t, "ab", false), "4");
    CHECK_STR_EQ(ids_of(t, "abcab", false), "6 4");
    CHECK_EQ_INT(hp_tok_bos(t), 11);
    CHECK_EQ_INT(hp_tok_eos(t), 12);
    hp_tok_free(t);
    const char *m2[] = {"a b", "b c", "ab c"}; /* "a b" first: abc -> ab c -> abc; "bcab": bc ab */
    t = tiny(m2, 3, false, &err);
    CHECK_STR_EQ(ids_of(t, "abc", false), "6");
    CHECK_STR_EQ(ids_of(t, "bcab", false), "5 4");
    CHECK_STR_EQ(ids_of(t, "cabc", false), "2 6");
    hp_tok_free(t);
    const char *m3[] = {"a a"}; /* a tie of one rank: the leftmost pair first */
    t = tiny(m3, 1, false, &err);
    CHECK_STR_EQ(ids_of(t, "aaa", false), "7 0");
    CHECK_STR_EQ(ids_of(t, "aaaa", false), "7 7");
    hp_tok_free(t);
    const char *m4[] = {"a b", "c ab"}; /* ignore_merges: "cab" is a token, taken whole */
    t = tiny(m4, 2, true, &err);
    CHECK_STR_EQ(ids_of(t, "cab", false), "10");
    hp_tok_free(t);
    t = tiny(m4, 2, false, &err);
    CHECK_STR_EQ(ids_of(t, "cab", false), "10");
    hp_tok_free(t);
    const char *m5[] = {"a b"};
    t = tiny(m5, 1, true, &err);
    CHECK_STR_EQ(ids_of(t, "cab", false), "10"); /* whole */
    hp_tok_free(t);
    t = tiny(m5, 1, false, &err);
    CHECK_STR_EQ(ids_of(t, "cab", false), "2 4"); /* merged */
    CHECK_STR_EQ(ids_of(t, "a ab", false), "0 3 4"); /* "Ġab" needs merges it does not have */
    hp_tok_free(t);
    const char *m6[] = {"c ab", "a b", "Ġ a", "Ġa b"}; /* "c ab" ranked before "a b" still waits for ab; */
    t = tiny(m6, 4, false, &err);                         /* "a b" before "Ġ a" leaves Ġ alone */
    CHECK_STR_EQ(ids_of(t, "cab ab", false), "10 3 4");
    CHECK_STR_EQ(ids_of(t, " ac", false), "8 2");
    hp_tok_free(t);
}

TEST(merges_refused)
{
    hp_err err;
    const char *bad1[] = {"a zz"};
    CHECK(tiny(bad1, 1, false, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "\"zz\", which is not in the vocabulary");
    const char *bad2[] = {"c c"};
    CHECK(tiny(bad2, 1, false, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "\"cc\", which is not in the vocabulary");
    const char *bad3[] = {"ab"};
    CHECK(tiny(bad3, 1, false, &err) == NULL);
    CHECK_STR_CONTAINS(err.msg, "merge 0 is not two tokens separated by one space");
    hp_tok_spec s = {.n_vocab = 1, .tokens = (const char *const[]){"a"}, .pre = "bert"};
    hp_tok *t;
    CHECK(hp_tok_create(&s, &t, &err) == HP_ERR_INPUT && t == NULL);
    CHECK_STR_CONTAINS(err.msg, "the pre-tokenizer \"bert\" is not supported");
    s.pre = "gpt2";
    s.bos_id = 5;
    s.eos_id = -1;
    CHECK(hp_tok_create(&s, &t, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "the bos id 5 is not a token");
    s.bos_id = -1;
    s.tokens = (const char *const[]){"a", "a"};
    s.n_vocab = 2;
    CHECK(hp_tok_create(&s, &t, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "has two ids, 0 and 1");
}

TEST(byte_missing_and_decode)
{
    hp_err err;
    const char *m[] = {"a b"};
    hp_tok *t = tiny(m, 1, false, &err);
    int32_t *ids;
    int64_t n;
    /* A byte without a token is left out (no unk_token), its neighbours merged as if adjacent: Hugging Face's way. */
    CHECK_STR_EQ(ids_of(t, "abz", false), "4");
    int first;
    CHECK(hp_tok_dropped(t, &first) == 1 && first == 'z');
    CHECK_STR_EQ(ids_of(t, "azzb", false), "4");
    CHECK(hp_tok_dropped(t, &first) == 2);
    CHECK_STR_EQ(ids_of(t, "azzb", false), "4"); /* not from the cache: counted again */
    CHECK(hp_tok_dropped(t, NULL) == 2);
    CHECK_STR_EQ(ids_of(t, "zz", false), "");
    CHECK_STR_EQ(ids_of(t, "ab", false), "4");
    CHECK(hp_tok_dropped(t, &first) == 0 && first == -1);
    int32_t in[] = {11, 4, 3, 6, 12};
    char *text;
    size_t len;
    CHECK(hp_tok_decode(t, in, 5, false, &text, &len, &err) == HP_OK);
    CHECK_STR_EQ(text, "<s>ab abc</s>");
    free(text);
    CHECK(hp_tok_decode(t, in, 5, true, &text, &len, &err) == HP_OK);
    CHECK_STR_EQ(text, "ab abc");
    CHECK_EQ_INT(len, 6);
    free(text);
    int32_t bad[] = {1, 13};
    CHECK(hp_tok_decode(t, bad, 2, false, &text, &len, &err) == HP_ERR_INPUT && text == NULL);
    CHECK_STR_CONTAINS(err.msg, "id 13 at position 1 is outside the vocabulary");
    CHECK(hp_tok_encode(t, "", 0, false, &ids, &n, &err) == HP_OK && ids != NULL && n == 0);
    free(ids);
    CHECK_EQ_INT(hp_tok_id(t, "Ġab"), 9);
    CHECK_STR_EQ(hp_tok_token(t, 9), "Ġab");
    CHECK(hp_tok_token(t, 13) == NULL && hp_tok_id(t, "zz") == -1);
    CHECK(hp_tok_is_special(t, 12) && !hp_tok_is_special(t, 4));
    hp_tok_free(t);
}

/* A tokenizer.json: the 256 byte tokens (id = the byte, written as its byte-level character), a few merged
 * tokens, and the given added tokens, merges, pre-tokenizer and post-processor (JSON text). */
static char *json_text(const char *added, const char *merges, const char *pre, const char *post)
{
    hp_buf b;
    hp_buf_init(&b);
    hp_buf_printf(&b, "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n\"added_tokens\": [%s],\n"
                  "\"normalizer\": null,\n\"pre_tokenizer\": %s,\n\"post_processor\": %s,\n"
                  "\"decoder\": {\"type\": \"ByteLevel\"},\n\"model\": {\"type\": \"BPE\", \"dropout\": null, "
                  "\"unk_token\": null, \"byte_fallback\": false, \"ignore_merges\": false,\n\"vocab\": {",
                  added, pre, post);
    for (int c = 0; c < 256; c++) {
        uint32_t cp = hp__byte_char((uint8_t)c);
        char u[8];
        if (cp < 0x80) snprintf(u, sizeof u, "%s", cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : (char[]){(char)cp, 0});
        else snprintf(u, sizeof u, "%c%c", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)));
        hp_buf_printf(&b, "\"%s\": %d, ", u, c);
    }
    hp_buf_printf(&b, "\"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259, \"Ġhello\": 260, \"<|eot|>\": 261, "
                  "\"<|eot|>x\": 262, \"<m>\": 263},\n\"merges\": %s}}\n", merges);
    return b.data;
}

static const char *g_added = "{\"id\": 261, \"content\": \"<|eot|>\", \"single_word\": false, \"lstrip\": false, "
                             "\"rstrip\": false, \"normalized\": false, \"special\": true},"
                             "{\"id\": 262, \"content\": \"<|eot|>x\", \"special\": true, \"normalized\": false},"
                             "{\"id\": 263, \"content\": \"<m>\", \"special\": false, \"lstrip\": true, "
                             "\"rstrip\": true, \"normalized\": true},"
                             "{\"id\": 264, \"content\": \"\\n\\n\", \"special\": false, \"normalized\": false}";
static const char *g_merges = "[\"h e\", [\"l\", \"l\"], \"he ll\", [\"hell\", \"o\"], \"Ġ hello\"]";
static const char *g_pre = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
                           "\"individual_digits\": true}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                           "\"use_regex\": true}]}";
static const char *g_post = "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|eot|>\", "
                            "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [], "
                            "\"special_tokens\": {\"<|eot|>\": {\"id\": \"<|eot|>\", \"ids\": [261], "
                            "\"tokens\": [\"<|eot|>\"]}}}";

static hp_status load(const char *added, const char *merges, const char *pre, const char *post, hp_tok **t,
                      hp_err *err)
{
    char *text = json_text(added, merges, pre, post);
    hp_status st = hp_tok_load_json(text, strlen(text), "tokenizer.json", t, err);
    free(text);
    return st;
}

TEST(json_added_tokens)
{
    hp_err err;
    hp_tok *t;
    CHECK(load(g_added, g_merges, g_pre, g_post, &t, &err) == HP_OK);
    if (!t) {
        printf("  %s\n", err.msg);
        return;
    }
    CHECK_STR_EQ(ids_of(t, "hello hello", false), "259 260");
    CHECK_STR_EQ(ids_of(t, "hello hello", true), "261 259 260");
    CHECK_EQ_INT(hp_tok_bos(t), 261); /* the template's first token */
    /* Longest first at a position; leftmost wins. */
    CHECK_STR_EQ(ids_of(t, "a<|eot|>xy<|eot|>", false), "97 262 121 261");
    /* lstrip/rstrip take the whitespace around "<m>" */
    CHECK_STR_EQ(ids_of(t, "a  <m>  b", false), "97 263 98");
    /* a non-special added token outside the byte-level alphabet decodes to its own text */
    CHECK_STR_EQ(ids_of(t, "x\n\ny", false), "120 264 121");
    int32_t in[] = {261, 120, 264, 121, 263};
    char *text;
    size_t len;
    CHECK(hp_tok_decode(t, in, 5, true, &text, &len, &err) == HP_OK);
    CHECK_STR_EQ(text, "x\n\ny<m>");
    free(text);
    /* Digits(individual) before ByteLevel: "12" is two pieces */
    CHECK_STR_EQ(ids_of(t, "12", false), "49 50");
    char d[256];
    CHECK_STR_CONTAINS(hp_tok_describe(t, d, sizeof d), "digits (single) + byte-level (gpt2)");
    hp_tok_free(t);
}

/* The NFC normalizer: decomposed and composed forms give the same ids; Hangul jamo compose; invalid bytes pass. */
TEST(json_nfc)
{
    hp_err err;
    hp_tok *t;
    char *text = json_text(g_added, g_merges, g_pre, g_post);
    char *at = strstr(text, "\"normalizer\": null");
    CHECK(at != NULL);
    hp_buf b;
    hp_buf_init(&b);
    hp_buf_append(&b, text, (size_t)(at - text));
    hp_buf_puts(&b, "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]}");
    hp_buf_puts(&b, at + strlen("\"normalizer\": null"));
    CHECK(hp_tok_load_json(b.data, b.len, "tokenizer.json", &t, &err) == HP_OK);
    hp_buf_free(&b);
    free(text);
    if (!t) return;
    CHECK_STR_EQ(ids_of(t, "e\xcc\x81", false), "195 169");          /* e + U+0301 -> U+00E9 */
    CHECK_STR_EQ(ids_of(t, "\xc3\xa9", false), "195 169");
    CHECK_STR_EQ(ids_of(t, "\xe1\x84\x80\xe1\x85\xa1", false), "234 176 128"); /* U+1100 U+1161 -> U+AC00 */
    CHECK_STR_EQ(ids_of(t, "a\xcc\x88\xcc\xa3", false), "225 186 161 204 136"); /* a ̈ ̣: reordered, U+1EA1 ̈ */
    CHECK_STR_EQ(ids_of(t, "\xff" "e\xcc\x81", false), "255 195 169");
    CHECK_STR_EQ(ids_of(t, "\xe2\x84\xab", false), "195 133"); /* U+212B ANGSTROM SIGN -> U+00C5 */
    char d[256];
    CHECK_STR_CONTAINS(hp_tok_describe(t, d, sizeof d), "NFC, pre-tokenizer");
    hp_tok_free(t);
}

TEST(json_invalid_utf8_round_trip)
{
    hp_err err;
    hp_tok *t;
    CHECK(load(g_added, g_merges, g_pre, g_post, &t, &err) == HP_OK);
    if (!t) return;
    uint8_t text[512];
    for (int i = 0; i < 512; i++) text[i] = (uint8_t)(i * 7 + (i >> 3));
    int32_t *ids;
    int64_t n;
    char *back;
    size_t len;
    CHECK(hp_tok_encode(t, text, sizeof text, false, &ids, &n, &err) == HP_OK);
    CHECK(hp_tok_decode(t, ids, n, false, &back, &len, &err) == HP_OK);
    CHECK(len == sizeof text && !memcmp(back, text, len));
    free(ids);
    free(back);
    hp_tok_free(t);
}

/* Random bytes and random mixes of the classes' characters through each pattern: decode(encode(x)) == x, and
 * enough distinct pieces to empty the cache more than once. */
TEST(random_round_trip)
{
    static const char *const pres[] = {
        "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}",
        "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"%s\"}, "
        "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"use_regex\": false, "
        "\"add_prefix_space\": false}]}",
    };
    static const char *const pieces[] = {" ", "  ", "\t", "\n", "\r\n", "a", "Z", "7", "'s", "'LL", "!", "\xc2\xa0",
                                         "\xe3\x80\x80", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xcc\x81", "\xff",
                                         "\xe2\x82", "<|eot|>", "<m>", "\n\n", "hello"};
    uint64_t rng = 41;
    size_t n = TEST_SANITIZED ? 60000 : 400000;
    char *text = malloc(n + 8);
    for (int which = 0; which < 4; which++) {
        char pre[2048], pat[600];
        size_t k = 0;
        if (which == 0) snprintf(pre, sizeof pre, "%s", pres[0]);
        else {
            const char *p = hp__regex_pattern((hp__regex)(which - 1));
            size_t j = 0;
            for (; *p && j + 2 < sizeof pat; p++) { /* as a JSON string */
                if (*p == '\\' || *p == '"') pat[j++] = '\\';
                pat[j++] = *p;
            }
            pat[j] = '\0';
            snprintf(pre, sizeof pre, pres[1], pat);
        }
        while (k < n) {
            if (hp_splitmix64(&rng) % 4 == 0) {
                text[k++] = (char)(hp_splitmix64(&rng) & 0xFF);
                continue;
            }
            const char *p = pieces[hp_splitmix64(&rng) % (sizeof pieces / sizeof *pieces)];
            size_t len = strlen(p);
            if (k + len > n) break;
            memcpy(text + k, p, len);
            k += len;
        }
        hp_err err;
        hp_tok *t;
        CHECK_MSG(load(g_added, g_merges, pre, "null", &t, &err) == HP_OK, "%s", err.msg);
        if (!t) continue;
        int32_t *ids;
        int64_t n_ids;
        char *back;
        size_t len;
        CHECK(hp_tok_encode(t, text, k, false, &ids, &n_ids, &err) == HP_OK);
        CHECK(hp_tok_decode(t, ids, n_ids, false, &back, &len, &err) == HP_OK);
        /* "<m>" takes the spaces around it (lstrip, rstrip): compare without them */
        CHECK_MSG(len <= k && n_ids > 1000, "pattern %d: %zu bytes back of %zu, %lld ids", which, len, k,
                  (long long)n_ids);
        free(ids);
        free(back);
        /* Without the stripping token the round trip is exact. */
        hp_tok *t2;
        CHECK(load("", g_merges, pre, "null", &t2, &err) == HP_OK);
        if (t2) {
            CHECK(hp_tok_encode(t2, text, k, false, &ids, &n_ids, &err) == HP_OK);
            CHECK(hp_tok_decode(t2, ids, n_ids, false, &back, &len, &err) == HP_OK);
            CHECK_MSG(len == k && !memcmp(back, text, k), "pattern %d: the round trip differs", which);
            free(ids);
            free(back);
            hp_tok_free(t2);
        }
        hp_tok_free(t);
    }
    free(text);
}

/* Each hostile file: HP_ERR_INPUT and a message holding `want`. */
static void refused(const char *added, const char *merges, const char *pre, const char *post, const char *want)
{
    hp_err err;
    hp_tok *t = (hp_tok *)1;
    hp_status st = load(added, merges, pre, post, &t, &err);
    CHECK_MSG(st == HP_ERR_INPUT && t == NULL, "status %d for a file that should be refused with '%s'", st, want);
    CHECK_STR_CONTAINS(err.msg, want);
}

TEST(json_hostile)
{
    refused(g_added, "[\"h zz\"]", g_pre, g_post, "\"zz\", which is not in the vocabulary");
    refused(g_added, "[\"h e l\"]", g_pre, g_post, "model.merges[0] must be \"a b\"");
    refused(g_added, "[[\"h\"]]", g_pre, g_post, "model.merges[0] must be");
    refused(g_added, "[7]", g_pre, g_post, "model.merges[0] must be");
    refused(g_added, "{}", g_pre, g_post, "model.merges must be an array");
    refused("{\"id\": 999, \"content\": \"<m>\"}", g_merges, g_pre, g_post, "has two ids");
    refused("{\"id\": 261, \"content\": \"<x>\"}", g_merges, g_pre, g_post, "added token 261 is \"<x>\"");
    refused("{\"id\": \"1\", \"content\": \"<x>\"}", g_merges, g_pre, g_post, "added_tokens[0] must be an object");
    refused("{\"id\": 300, \"content\": \"<x>\", \"single_word\": true}", g_merges, g_pre, g_post, "single_word");
    refused("{\"id\": 300, \"content\": \"<x>\", \"lstrip\": 1}", g_merges, g_pre, g_post,
            "added_tokens[0].lstrip must be true or false");
    refused(g_added, g_merges, "{\"type\": \"Metaspace\"}", g_post, "the pre-tokenizer Metaspace is not supported");
    refused(g_added, g_merges, "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"behavior\": "
            "\"Isolated\", \"invert\": false}", g_post, "is not one hyperpar implements");
    refused(g_added, g_merges, "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\", "
            "\"invert\": false}", g_post, "must be {\"Regex\"");
    refused(g_added, g_merges, "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"x\"}, \"behavior\": \"Removed\", "
            "\"invert\": false}", g_post, "behavior string \"Removed\"");
    refused(g_added, g_merges, "[]", g_post, "pre_tokenizer must be an object");
    refused(g_added, g_merges, g_pre, "{\"type\": \"BertProcessing\"}", "post-processor BertProcessing");
    refused(g_added, g_merges, g_pre, "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
            "\"<q>\"}}, {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": {}}", "special_tokens[\"<q>\"].ids");
    refused(g_added, g_merges, g_pre, "{\"type\": \"TemplateProcessing\", \"single\": [], \"special_tokens\": {}}",
            "single has 0 $A");
    /* The model's own fields. */
    hp_err err;
    hp_tok *t;
    const char *edits[][3] = {
        {"\"vocab\": {", "\"vocab\": {\"zz\": \"1\", ", "model.vocab[\"zz\"] must be an integer id"},
        {"\"vocab\": {", "\"vocab\": {\"zz\": -4, ", "id -4 is outside"},
        {"\"vocab\": {", "\"vocab\": {\"zz\": 99999999999, ", "is outside"},
        {"\"vocab\": {", "\"vocab\": {\"zz\": 5, ", "id 5 is given to two tokens"},
        {"\"vocab\": {", "\"vocab\": {\"\": 300, ", "is empty"},
        {"\"vocab\": {", "\"vocab\": {\"a\\u0000b\": 300, ", "invalid JSON"},
        {"\"vocab\": {", "\"vocabulary\": {", "model.vocab must be an object"},
        {"\"type\": \"BPE\"", "\"type\": \"Unigram\"", "only BPE models"},
        {"\"dropout\": null", "\"dropout\": 0.5", "BPE dropout"},
        {"\"byte_fallback\": false", "\"byte_fallback\": true", "byte fallback"},
        {"\"byte_fallback\": false", "\"byte_fallback\": \"no\"", "model.byte_fallback must be true or false"},
        {"\"unk_token\": null", "\"unk_token\": \"<unk>\"", "model.unk_token \"<unk>\" is not in the vocabulary"},
        {"\"normalizer\": null", "\"normalizer\": {\"type\": \"NFKC\"}", "the normalizer NFKC is not supported"},
        {"\"decoder\": {\"type\": \"ByteLevel\"}", "\"decoder\": {\"type\": \"WordPiece\"}", "decoder WordPiece"},
        {"\"decoder\": {\"type\": \"ByteLevel\"}", "\"decoder\": null", "needs the ByteLevel decoder"},
        {"\"truncation\": null", "\"truncation\": {\"max_length\": 8}", "does not truncate"},
        {"\"model\": {", "\"model\": 7, \"m\": {", "\"model\" must be an object"},
        {"{\"version\"", "[{\"version\"", "the top level must be an object"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        char *text = json_text(g_added, g_merges, g_pre, g_post);
        char *at = strstr(text, edits[i][0]);
        CHECK(at != NULL);
        if (!at) continue;
        hp_buf b;
        hp_buf_init(&b);
        hp_buf_append(&b, text, (size_t)(at - text));
        hp_buf_puts(&b, edits[i][1]);
        hp_buf_puts(&b, at + strlen(edits[i][0]));
        if (!strcmp(edits[i][1], "[{\"version\"")) hp_buf_puts(&b, "]");
        t = (hp_tok *)1;
        hp_status st = hp_tok_load_json(b.data, b.len, "tokenizer.json", &t, &err);
        CHECK_MSG(st == HP_ERR_INPUT && t == NULL, "edit %zu (%s): status %d", i, edits[i][2], st);
        CHECK_STR_CONTAINS(err.msg, edits[i][2]);
        hp_buf_free(&b);
        free(text);
    }
    refused(g_added, g_merges, g_pre, "{\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"B\"}}], "
            "\"special_tokens\": {}}", "is sequence B; a single template has $A only");
    refused(g_added, g_merges, g_pre, "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {}}], "
            "\"special_tokens\": {}}", "single[0] must be a SpecialToken or a Sequence with an id");
    refused(g_added, g_merges, g_pre, "{\"type\": \"TemplateProcessing\"}", "needs a \"single\" array");
    refused(g_added, g_merges, "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, {\"type\": "
            "\"Digits\"}, {\"type\": \"Digits\"}, {\"type\": \"Digits\"}, {\"type\": \"Digits\"}, {\"type\": \"Digits\"}, "
            "{\"type\": \"Digits\"}, {\"type\": \"Digits\"}, {\"type\": \"Digits\"}]}", g_post,
            "more than 8 pre-tokenizer steps");
    refused(g_added, g_merges, "{\"type\": \"Sequence\", \"pretokenizers\": 3}", g_post,
            "pre_tokenizer.pretokenizers must be an array");
    refused(g_added, g_merges, "{\"type\": 3}", g_post, "pre_tokenizer.type must be a string, found integer 3");
    /* Located: the message carries the line:col of the key. */
    refused(g_added, g_merges, g_pre, "{\"type\": \"BertProcessing\"}", "tokenizer.json:5:");
}

/* Every prefix of a valid file is refused (or, the whole, taken), never a crash. */
TEST(json_truncation_sweep)
{
    char *text = json_text(g_added, g_merges, g_pre, g_post);
    size_t n = strlen(text);
    int ok = 0;
    for (size_t k = 0; k < n; k += TEST_SANITIZED ? 7 : 1) {
        hp_err err;
        hp_tok *t;
        hp_status st = hp_tok_load_json(text, k, "tokenizer.json", &t, &err);
        if (st == HP_OK) ok++, hp_tok_free(t);
        else CHECK(st == HP_ERR_INPUT && t == NULL);
    }
    CHECK(ok <= 1); /* the file without its last line break */
    free(text);
}

/* tokenizer_config.json beside the file names BOS and EOS; one that names no token is refused. A gap decodes to
 * an error. */
TEST(config_and_gaps)
{
    char dir[512], path[600];
    test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char *text = json_text(g_added, g_merges, g_pre, g_post);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    free(text);
    hp_err err;
    hp_tok *t;
    CHECK(hp_tok_load(dir, &t, &err) == HP_OK && hp_tok_bos(t) == 261 && hp_tok_eos(t) == -1);
    /* 264 ("\n\n") is the last id */
    int32_t gap[] = {264, 265};
    char *out;
    size_t len;
    CHECK(hp_tok_decode(t, gap, 2, false, &out, &len, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "id 265 at position 1 is outside the vocabulary");
    hp_tok_free(t);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "w");
    fputs("{\"bos_token\": {\"content\": \"<m>\"}, \"eos_token\": \"<|eot|>x\"}", f);
    fclose(f);
    CHECK(hp_tok_load(dir, &t, &err) == HP_OK && hp_tok_bos(t) == 263 && hp_tok_eos(t) == 262);
    hp_tok_free(t);
    f = fopen(path, "w");
    fputs("{\"eos_token\": \"</s>\"}", f);
    fclose(f);
    t = (hp_tok *)1;
    CHECK(hp_tok_load(dir, &t, &err) == HP_ERR_INPUT && t == NULL);
    CHECK_STR_CONTAINS(err.msg, "eos_token \"</s>\" is not a token of the tokenizer.json beside it");
    snprintf(path, sizeof path, "%s/none", dir);
    CHECK(hp_tok_load(path, &t, &err) == HP_ERR_INPUT);
    CHECK(hp_tok_load(test_work_dir("tok"), &t, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "the folder has no tokenizer.json");
    /* A vocabulary with a gap: id 1 has no token. */
    hp_tok_spec s = {.n_vocab = 3, .tokens = (const char *const[]){"a", NULL, "b"}, .pre = "qwen2", .bos_id = -1,
                     .eos_id = -1};
    CHECK(hp_tok_create(&s, &t, &err) == HP_OK);
    int32_t ids[] = {0, 1};
    CHECK(hp_tok_decode(t, ids, 2, false, &out, &len, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "id 1 at position 1 is no token");
    hp_tok_free(t);
}

TEST(token_files)
{
    char dir[512], path[600], txt[600];
    test_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/ids.bin", dir);
    snprintf(txt, sizeof txt, "%s/ids.txt", dir);
    int32_t ids[] = {0, 1, 65535, 7};
    hp_err err;
    int32_t *back;
    int64_t n;
    CHECK(hp_tok_write_ids(path, ids, 4, 2, &err) == HP_OK);
    CHECK(hp_tok_read_ids(path, 2, &back, &n, &err) == HP_OK && n == 4 && !memcmp(back, ids, sizeof ids));
    free(back);
    CHECK(hp_tok_read_ids(path, 4, &back, &n, &err) == HP_OK && n == 2);
    free(back);
    int32_t big[] = {65536};
    CHECK(hp_tok_write_ids(path, big, 1, 2, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "does not fit a uint16 token file");
    CHECK(hp_tok_write_ids(path, big, 1, 4, &err) == HP_OK);
    CHECK(hp_tok_read_ids(path, 2, &back, &n, &err) == HP_OK && n == 2 && back[0] == 0 && back[1] == 1);
    free(back);
    FILE *f = fopen(path, "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    CHECK(hp_tok_read_ids(path, 2, &back, &n, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "3 bytes is not a whole number of uint16 ids");
    f = fopen(txt, "w");
    fputs("[1, 2,3\n 4]\n", f);
    fclose(f);
    CHECK(hp_tok_read_ids_text(txt, &back, &n, &err) == HP_OK && n == 4 && back[3] == 4);
    free(back);
    f = fopen(txt, "w");
    fputs("1 2 x3", f);
    fclose(f);
    CHECK(hp_tok_read_ids_text(txt, &back, &n, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "'x3' (id 2, byte 4) is not an id");
    f = fopen(txt, "w");
    fputs("1 99999999999", f);
    fclose(f);
    CHECK(hp_tok_read_ids_text(txt, &back, &n, &err) == HP_ERR_INPUT);
    f = fopen(txt, "w");
    fputs("[1 2] 3", f);
    fclose(f);
    CHECK(hp_tok_read_ids_text(txt, &back, &n, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "text after the closing ']' at byte 6");
    uint32_t huge = 0x80000000u;
    f = fopen(path, "wb");
    fwrite(&huge, 4, 1, f);
    fclose(f);
    CHECK(hp_tok_read_ids(path, 4, &back, &n, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "id 2147483648 at position 0 is past 2^31 - 1");
}

TEST_MAIN()
