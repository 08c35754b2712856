/*
 * core.c — errors, checked math, allocation helpers, string buffer, logging, formatting.
 *
 * Nothing here knows about models or files; every other module builds on it.
 */
#include "hyperpar/core.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

hp_status hp_err_set(hp_err *err, hp_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

void hp_err_prefix(hp_err *err, const char *fmt, ...)
{
    if (!err) return;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[HP_ERR_MSG_MAX];
    memcpy(old, err->msg, sizeof old);
    int room = (int)(sizeof err->msg - strlen(prefix) - 3);
    snprintf(err->msg, sizeof err->msg, "%s: %.*s", prefix, room > 0 ? room : 0, old);
}

void hp_err_clear(hp_err *err)
{
    if (!err) return;
    err->status = HP_OK;
    err->msg[0] = '\0';
}

int hp_status_exit_code(hp_status status)
{
    switch (status) {
    case HP_OK: return 0;
    case HP_ERR_INPUT: return 2;
    case HP_ERR_VERIFY: return 3;
    case HP_ERR_IO:
    case HP_ERR_NOMEM: return 1;
    }
    return 1;
}

const char *hp_status_name(hp_status status)
{
    switch (status) {
    case HP_OK: return "ok";
    case HP_ERR_INPUT: return "bad input";
    case HP_ERR_IO: return "i/o error";
    case HP_ERR_NOMEM: return "out of memory";
    case HP_ERR_VERIFY: return "verification failed";
    }
    return "unknown";
}

void hp__assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "hyperpar: internal error: assertion '%s' failed at %s:%d; please report this bug\n",
            expr, file, line);
    abort();
}

bool hp_mul_i64(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0) return false;
    return !__builtin_mul_overflow(a, b, out);
}

bool hp_add_i64(int64_t a, int64_t b, int64_t *out)
{
    if (a < 0 || b < 0) return false;
    return !__builtin_add_overflow(a, b, out);
}

bool hp_mul_size(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
bool hp_add_size(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }

void *hp_calloc(size_t n, size_t size)
{
    if (n == 0 || size == 0) n = size = 1;
    return calloc(n, size);
}

char *hp_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---- arena ---- */

struct hp_arena_chunk {
    hp_arena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

/* 64 KiB chunks keep malloc calls rare for parse trees of thousands of names. */
#define HP_ARENA_CHUNK 65536

void hp_arena_init(hp_arena *a)
{
    a->head = NULL;
    a->bytes_used = 0;
}

void hp_arena_free(hp_arena *a)
{
    if (!a) return;
    hp_arena_chunk *c = a->head;
    while (c) {
        hp_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->bytes_used = 0;
}

void *hp_arena_alloc(hp_arena *a, size_t n)
{
    size_t need = (n + 15) & ~(size_t)15;
    if (need < n) return NULL;
    hp_arena_chunk *c = a->head;
    if (!c || c->cap - c->used < need) {
        size_t cap = need > HP_ARENA_CHUNK ? need : HP_ARENA_CHUNK;
        size_t total;
        if (!hp_add_size(sizeof(hp_arena_chunk), cap, &total)) return NULL;
        c = malloc(total);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += need;
    a->bytes_used += need;
    memset(p, 0, n);
    return p;
}

char *hp_arena_strndup(hp_arena *a, const char *s, size_t n)
{
    char *p = hp_arena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *hp_arena_strdup(hp_arena *a, const char *s) { return hp_arena_strndup(a, s, strlen(s)); }

char *hp_arena_printf(hp_arena *a, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        va_end(ap2);
        return NULL;
    }
    char *p = hp_arena_alloc(a, (size_t)n + 1);
    if (p) vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

/* ---- buffer ---- */

void hp_buf_init(hp_buf *b) { memset(b, 0, sizeof *b); }

void hp_buf_free(hp_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

void hp_buf_append(hp_buf *b, const void *data, size_t n)
{
    if (b->oom) return;
    size_t need;
    if (!hp_add_size(b->len, n + 1, &need)) {
        b->oom = true;
        return;
    }
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need) cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void hp_buf_puts(hp_buf *b, const char *s) { hp_buf_append(b, s, strlen(s)); }

void hp_buf_printf(hp_buf *b, const char *fmt, ...)
{
    char small[512];
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        va_end(ap2);
        b->oom = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        hp_buf_append(b, small, (size_t)n);
    } else {
        char *big = malloc((size_t)n + 1);
        if (!big) {
            b->oom = true;
        } else {
            vsnprintf(big, (size_t)n + 1, fmt, ap2);
            hp_buf_append(b, big, (size_t)n);
            free(big);
        }
    }
    va_end(ap2);
}

/* ---- logging ---- */

static hp_log_level g_log_level = HP_LOG_WARN;

void hp_log_set_level(hp_log_level level) { g_log_level = level; }
hp_log_level hp_log_get_level(void) { return g_log_level; }

void hp_log(hp_log_level level, const char *fmt, ...)
{
    if (level > g_log_level) return;
    static const char *names[] = {"error", "warning", "info", "debug"};
    char msg[HP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    hp_buf b;
    hp_buf_init(&b);
    hp_buf_escape(&b, msg, HP_ESC_KEEP_LINES);
    fprintf(stderr, "hyperpar: %s: %.*s\n", names[level], (int)b.len, b.data && !b.oom ? b.data : "?");
    hp_buf_free(&b);
}

/* ---- escaping text from files ---- */

/* The length of the valid UTF-8 sequence of 2..4 bytes at s and its code point, or 0 when s does not start
 * one (overlong forms, surrogates and values past U+10FFFF are not UTF-8). */
static size_t utf8_len(const unsigned char *s, uint32_t *cp)
{
    unsigned char c = s[0];
    size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (!n) return 0;
    uint32_t v = c & (0x7F >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0; /* also stops at the terminating NUL */
        v = (v << 6) | (s[i] & 0x3F);
    }
    if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10FFFF)) || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

/* One character of s as shown: writes at most 16 bytes to out and returns how many; *used gets the bytes of s
 * it stands for (at least 1). */
static size_t esc_char(const unsigned char *s, unsigned flags, char *out, size_t *used)
{
    uint32_t cp = 0;
    size_t n = *s >= 0x80 ? utf8_len(s, &cp) : 1;
    bool shown;
    if (n > 1)
        shown = !(cp <= 0x9F || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069));
    else
        shown = n == 1 && ((*s >= 0x20 && *s != 0x7F) ||
                           ((flags & HP_ESC_KEEP_LINES) && (*s == '\n' || *s == '\t')));
    if (!n) n = 1;
    *used = n;
    if (n == 1 && *s == '\\' && (flags & HP_ESC_BACKSLASH)) {
        memcpy(out, "\\\\", 2);
        return 2;
    }
    if (shown) {
        memcpy(out, s, n);
        return n;
    }
    static const char hex[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        out[4 * i] = '\\', out[4 * i + 1] = 'x';
        out[4 * i + 2] = hex[s[i] >> 4], out[4 * i + 3] = hex[s[i] & 15];
    }
    return 4 * n;
}

void hp_buf_escape(hp_buf *b, const char *text, unsigned flags)
{
    const unsigned char *s = (const unsigned char *)(text ? text : "");
    char out[16];
    while (*s) {
        size_t used = 1, k = esc_char(s, flags, out, &used);
        hp_buf_append(b, out, k);
        s += used;
    }
}

const char *hp_escape(const char *text, char *buf, size_t cap)
{
    if (!cap) return buf;
    const unsigned char *s = (const unsigned char *)(text ? text : "");
    char out[16];
    size_t o = 0, starts[4]; /* where the last four characters shown begin: a cut backs off whole ones */
    unsigned n_starts = 0;
    while (*s) {
        size_t used = 1, k = esc_char(s, 0, out, &used);
        if (o + k + 1 > cap) {
            for (unsigned back = 0; o + 4 > cap && back < 4 && back < n_starts; back++)
                o = starts[(n_starts - 1 - back) % 4];
            if (o + 4 <= cap) memcpy(buf + o, "...", 3), o += 3;
            break;
        }
        starts[n_starts++ % 4] = o;
        memcpy(buf + o, out, k);
        o += k;
        s += used;
    }
    buf[o] = '\0';
    return buf;
}

bool hp_is_safe_text(const char *text, unsigned flags)
{
    const unsigned char *s = (const unsigned char *)(text ? text : "");
    char out[16];
    while (*s) {
        size_t used = 1, k = esc_char(s, flags, out, &used);
        if (k != used || memcmp(out, s, k) != 0) return false;
        s += used;
    }
    return true;
}

const char *hp_format_bytes(uint64_t bytes, char *buf, size_t cap)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

/* The unit s is shown in: a multiplier of seconds. */
static double seconds_unit(double s)
{
    return s >= 1.0 ? 1.0 : s >= 1e-3 || s == 0 ? 1e3 : 1e6;
}

/* s rounded to 3 significant digits in unit u (a multiplier of seconds). */
static double seconds_in_unit(double s, double u)
{
    char b[48];
    snprintf(b, sizeof b, "%.3g", s * u);
    return strtod(b, NULL);
}

const char *hp_format_seconds(double s, char *buf, size_t cap)
{
    double u = seconds_unit(s), r = seconds_in_unit(s, u);
    /* 1000 and above: whole units, not 1e+03 */
    snprintf(buf, cap, r >= 1000 ? "%.0f %s" : "%.3g %s", r, u == 1.0 ? "s" : u == 1e3 ? "ms" : "us");
    return buf;
}

double hp_seconds_as_printed(double s)
{
    double u = seconds_unit(s);
    return seconds_in_unit(s, u) / u;
}

const char *hp_format_count(uint64_t n, char *buf, size_t cap)
{
    char digits[32];
    int len = snprintf(digits, sizeof digits, "%llu", (unsigned long long)n);
    char out[48];
    int o = 0;
    for (int i = 0; i < len; i++) {
        if (i > 0 && (len - i) % 3 == 0) out[o++] = ',';
        out[o++] = digits[i];
    }
    out[o] = '\0';
    snprintf(buf, cap, "%s", out);
    return buf;
}

/* ASCII case folding (names are ASCII; the C locale's tolower, without its call per byte). */
static unsigned char lower_ascii(unsigned char c) { return c >= 'A' && c <= 'Z' ? (unsigned char)(c + 32) : c; }

bool hp_eq_ci(const char *s, const char *lower_pat, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (lower_ascii((unsigned char)s[i]) != (unsigned char)lower_pat[i]) return false;
    return true;
}

/* Scans for the pattern's first byte in either case, then compares the rest (hp_eq_ci stops at s's end: its
 * '\0' matches no pattern byte). */
bool hp_contains_ci(const char *s, const char *lower_pat)
{
    size_t n = strlen(lower_pat);
    if (n == 0) return true;
    unsigned char c0 = (unsigned char)lower_pat[0];
    unsigned char u0 = c0 >= 'a' && c0 <= 'z' ? (unsigned char)(c0 - 32) : c0;
    for (; *s; s++)
        if (((unsigned char)*s == c0 || (unsigned char)*s == u0) && hp_eq_ci(s + 1, lower_pat + 1, n - 1)) return true;
    return false;
}

int hp_natural_cmp(const char *a, const char *b)
{
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            while (*a == '0' && isdigit((unsigned char)a[1])) a++;
            while (*b == '0' && isdigit((unsigned char)b[1])) b++;
            size_t la = 0, lb = 0;
            while (isdigit((unsigned char)a[la])) la++;
            while (isdigit((unsigned char)b[lb])) lb++;
            if (la != lb) return la < lb ? -1 : 1;
            int c = memcmp(a, b, la);
            if (c) return c < 0 ? -1 : 1;
            a += la;
            b += lb;
        } else {
            if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
            a++;
            b++;
        }
    }
    if (*a) return 1;
    if (*b) return -1;
    return 0;
}

/* Matches one [...] class at p against c; returns the position after ']' or NULL when malformed. */
static const char *glob_class(const char *p, char c, bool *hit)
{
    bool neg = *p == '!' || *p == '^';
    if (neg) p++;
    bool in = false;
    const char *start = p;
    while (*p && (*p != ']' || p == start)) {
        if (p[1] == '-' && p[2] && p[2] != ']') {
            in |= (unsigned char)c >= (unsigned char)p[0] && (unsigned char)c <= (unsigned char)p[2];
            p += 3;
        } else {
            in |= *p == c;
            p++;
        }
    }
    if (*p != ']') return NULL;
    *hit = in != neg;
    return p + 1;
}

bool hp_glob_valid(const char *p, size_t *bad_pos, const char **why)
{
    for (const char *s = p; *s; s++) {
        if (*s != '[') continue;
        const char *q = s + 1;
        if (*q == '!' || *q == '^') q++;
        const char *start = q;
        /* The class ends at the first ']' that is not its first member (as glob_class reads it). */
        while (*q && (*q != ']' || q == start)) {
            if (q[1] == '-' && q[2] && q[2] != ']') {
                if ((unsigned char)q[0] > (unsigned char)q[2]) {
                    if (bad_pos) *bad_pos = (size_t)(q - p);
                    if (why) *why = "a reversed range in a [...] class (it matches nothing)";
                    return false;
                }
                q += 3;
            } else {
                q++;
            }
        }
        if (*q != ']') {
            if (bad_pos) *bad_pos = (size_t)(s - p);
            if (why) *why = "a '[' that opens a character class never closed by ']'";
            return false;
        }
        s = q;
    }
    return true;
}

/* fnmatchcase semantics: '*' any run (dots included), '?' one character, [abc] [a-z] [!x] classes; a
 * malformed class matches its '[' literally (hp_glob_valid refuses such patterns where users write them). */
bool hp_glob_match(const char *p, const char *t)
{
    const char *star_p = NULL, *star_t = NULL;
    while (*t) {
        if (*p == '*') {
            star_p = ++p;
            star_t = t;
            continue;
        }
        bool hit = false;
        const char *after = NULL;
        if (*p == '[' && (after = glob_class(p + 1, *t, &hit)) != NULL) {
            if (hit) {
                p = after;
                t++;
                continue;
            }
        } else if (*p && (*p == '?' || *p == *t)) {
            p++;
            t++;
            continue;
        }
        if (!star_p) return false;
        p = star_p;
        t = ++star_t;
    }
    while (*p == '*') p++;
    return *p == '\0';
}
