/*
 * json.c — JSON loading with line:col errors, and a positional scanner for post-parse diagnostics.
 */
#include "io/json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

hp_status hp__read_file(const char *path, size_t max_size, char **out, size_t *len, hp_err *err)
{
    *out = NULL;
    *len = 0;
    /* hp_open_regular never blocks: a FIFO, a device or a folder is refused with a sentence saying what it is. */
    int fd = -1;
    hp_status st0 = hp_open_regular(path, &fd, err);
    if (st0 != HP_OK) return st0;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return hp_err_set(err, HP_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if ((uint64_t)st.st_size > max_size) {
        close(fd);
        return hp_err_set(err, HP_ERR_INPUT, "%s: %lld bytes is larger than the %zu-byte limit for this kind of file",
                          path, (long long)st.st_size, max_size);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        free(buf);
        return hp_err_set(err, HP_ERR_IO, "%s: read failed (%zu of %zu bytes); the file changed while reading", path,
                          got, n);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return HP_OK;
}

hp_status hp__json_parse(const char *text, size_t len, const char *label, json_t **out, hp_err *err)
{
    json_error_t je;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!*out) {
        return hp_err_set(err, HP_ERR_INPUT, "%s:%d:%d: invalid JSON: %s", label, je.line, je.column, je.text);
    }
    return HP_OK;
}

/* ---- positional scanner over valid JSON ---- */

typedef struct scan {
    const char *p, *end;
    int line, col;
} scan;

static void adv(scan *s)
{
    if (s->p >= s->end) return;
    if (*s->p == '\n') {
        s->line++;
        s->col = 1;
    } else if (((unsigned char)*s->p & 0xC0) != 0x80) {
        s->col++;
    }
    s->p++;
}

static void skip_ws(scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')) adv(s);
}

/* Copies a string token's raw content (escapes kept) into buf; positions s after the closing quote. */
static void scan_string(scan *s, char *buf, size_t cap)
{
    size_t n = 0;
    adv(s); /* opening quote */
    while (s->p < s->end && *s->p != '"') {
        if (*s->p == '\\') {
            if (n + 1 < cap) buf[n++] = *s->p;
            adv(s);
        }
        if (s->p < s->end) {
            if (n + 1 < cap) buf[n++] = *s->p;
            adv(s);
        }
    }
    adv(s);
    if (cap) buf[n < cap ? n : cap - 1] = '\0';
}

static void skip_value(scan *s)
{
    skip_ws(s);
    if (s->p >= s->end) return;
    char c = *s->p;
    if (c == '"') {
        char tmp[1];
        scan_string(s, tmp, 0);
        return;
    }
    if (c == '{' || c == '[') {
        int depth = 0;
        while (s->p < s->end) {
            char d = *s->p;
            if (d == '"') {
                scan_string(s, NULL, 0);
                continue;
            }
            if (d == '{' || d == '[') depth++;
            if (d == '}' || d == ']') {
                depth--;
                if (depth == 0) {
                    adv(s);
                    return;
                }
            }
            adv(s);
        }
        return;
    }
    while (s->p < s->end && *s->p != ',' && *s->p != '}' && *s->p != ']' && *s->p != ' ' && *s->p != '\n' &&
           *s->p != '\r' && *s->p != '\t')
        adv(s);
}

bool hp__json_locate(const char *text, size_t len, const char *const *path, int depth, int *line, int *col)
{
    scan s = {text, text + len, 1, 1};
    for (int level = 0; level < depth; level++) {
        skip_ws(&s);
        if (s.p >= s.end || *s.p != '{') return false;
        adv(&s);
        bool found = false;
        while (s.p < s.end) {
            skip_ws(&s);
            if (s.p < s.end && *s.p == '}') return false;
            char key[256];
            if (s.p >= s.end || *s.p != '"') return false;
            scan_string(&s, key, sizeof key);
            skip_ws(&s);
            if (s.p < s.end && *s.p == ':') adv(&s);
            skip_ws(&s);
            if (strcmp(key, path[level]) == 0) {
                found = true;
                break;
            }
            skip_value(&s);
            skip_ws(&s);
            if (s.p < s.end && *s.p == ',') adv(&s);
        }
        if (!found) return false;
    }
    *line = s.line;
    *col = s.col;
    return true;
}

const char *hp__json_describe(const json_t *v, char *buf, size_t cap)
{
    switch (json_typeof(v)) {
    case JSON_STRING: snprintf(buf, cap, "string \"%.40s\"", json_string_value(v)); break;
    case JSON_INTEGER: snprintf(buf, cap, "integer %lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: snprintf(buf, cap, "number %g", json_real_value(v)); break;
    case JSON_TRUE: snprintf(buf, cap, "true"); break;
    case JSON_FALSE: snprintf(buf, cap, "false"); break;
    case JSON_NULL: snprintf(buf, cap, "null"); break;
    case JSON_ARRAY: snprintf(buf, cap, "an array"); break;
    case JSON_OBJECT: snprintf(buf, cap, "an object"); break;
    }
    return buf;
}
