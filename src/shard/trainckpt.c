/*
 * trainckpt.c — training checkpoints (hyperpar/trainckpt.h): which folder is one and whether it is complete, the
 * run folder's last complete one, state.json, and the merge into a Hugging Face folder.
 *
 *   find     path/state.json present ─▶ path, checked complete
 *            else path is a run folder ─▶ its complete "step-<t>" with the highest t (a digit run after "step-"
 *            and nothing else: "step-4.tmp.<pid>" is a save in progress or a dead run's, never taken)
 *   merge    model.safetensors ──each tensor, in file order: F32 kept (f32) or rounded to BF16, BF16 / F16
 *            widened to F32 (f32) or BF16 kept / F16 narrowed (bf16), others as stored──▶ OUT.tmp.<pid>/
 *            model.safetensors + config.json (torch_dtype of the dtype) ──rename──▶ OUT (hyperpar/outdir.h)
 *
 * Invariant: a checkpoint is only ever read once state.json lists every file and each is there; the merge reads
 * only config.json and model.safetensors, the parameters as trained (the rank files hold the optimizer state).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperpar/trainckpt.h"
#include "shard/shard_int.h"

/* ---- what a checkpoint is ---- */

/* "step-<t>": a checkpoint's name in its run folder (t decimal digits, nothing after them). */
static bool step_name(const char *nm, long long *t)
{
    const char *num = nm + 5;
    if (strncmp(nm, "step-", 5) || !*num || strspn(num, "0123456789") != strlen(num) || strlen(num) > 15)
        return false;
    *t = strtoll(num, NULL, 10);
    return true;
}

static bool has_state(const char *dir)
{
    char p[HP__PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/state.json", dir);
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

bool hp_train_ckpt_is(const char *dir)
{
    if (has_state(dir)) return true;
    DIR *d = opendir(dir);
    if (!d) return false;
    bool run = false;
    long long t;
    struct dirent *e;
    while (!run && (e = readdir(d))) run = step_name(e->d_name, &t);
    closedir(d);
    return run;
}

static bool regular(const char *dir, const char *name)
{
    char p[HP__PATH_MAX + 300];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

hp_status hp_train_ckpt_check(const char *dir, int64_t *step, hp_err *err)
{
    char p[HP__PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/state.json", dir);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    if (!root)
        return hp_err_set(err, HP_ERR_INPUT, "%s: state.json does not read as JSON (%s, line %d); not a complete "
                          "training checkpoint", dir, je.text, je.line);
    json_t *fmt = json_object_get(root, "format"), *js = json_object_get(root, "step");
    json_t *jw = json_object_get(root, "world"), *files = json_object_get(root, "files");
    hp_status st = HP_OK;
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), HP_TRAIN_CKPT_FORMAT))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: state.json has no \"format\": \"" HP_TRAIN_CKPT_FORMAT "\"; it is not "
                        "a checkpoint 'hyperpar train --save-every' wrote", dir);
    else if (!json_is_integer(js) || json_integer_value(js) < 1 || !json_is_integer(jw) ||
             json_integer_value(jw) < 1 || !json_is_array(files))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: state.json lacks a step >= 1, a world >= 1 or the list of files", dir);
    int64_t world = st == HP_OK ? (int64_t)json_integer_value(jw) : 0;
    /* Every file it names, and at least the model folder and every rank's state. */
    for (size_t i = 0; st == HP_OK && i < json_array_size(files); i++) {
        const char *f = json_string_value(json_array_get(files, i));
        if (!f || !*f || strchr(f, '/') || !strcmp(f, "..") || !strcmp(f, "."))
            st = hp_err_set(err, HP_ERR_INPUT, "%s: state.json's files[%zu] is not a file name", dir, i);
        else if (!regular(dir, f))
            st = hp_err_set(err, HP_ERR_INPUT, "%s: %s, which state.json names, is missing; the checkpoint is "
                            "incomplete", dir, f);
    }
    for (int64_t r = -3; st == HP_OK && r < world; r++) {
        char name[64];
        if (r < 0) snprintf(name, sizeof name, "%s", r == -3 ? "config.json" : r == -2 ? "model.safetensors"
                                                                                   : HP_OUTDIR_MARKER);
        else snprintf(name, sizeof name, "rank-%lld.safetensors", (long long)r);
        bool listed = r == -1; /* the marker is the folder's, not a file of the list */
        for (size_t i = 0; !listed && i < json_array_size(files); i++)
            listed = !strcmp(name, json_string_value(json_array_get(files, i)));
        if (!listed || !regular(dir, name))
            st = hp_err_set(err, HP_ERR_INPUT, "%s: %s is %s; the checkpoint is incomplete", dir, name,
                            listed ? "missing" : "not listed in state.json");
    }
    if (st == HP_OK && step) *step = (int64_t)json_integer_value(js);
    json_decref(root);
    return st;
}

hp_status hp_train_ckpt_find(const char *label, const char *path, char *out, size_t cap, hp_err *err)
{
    if (has_state(path)) {
        hp_status st = hp_train_ckpt_check(path, NULL, err);
        if (st != HP_OK) return st;
        if ((size_t)snprintf(out, cap, "%s", path) >= cap)
            return hp_err_set(err, HP_ERR_INPUT, "%s %s: the path is too long", label, path);
        return HP_OK;
    }
    DIR *d = opendir(path);
    if (!d) return hp_err_set(err, HP_ERR_INPUT, "%s %s: no such checkpoint or run folder (%s)", label, path,
                              strerror(errno));
    long long best = -1;
    int skipped = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        long long t;
        if (!step_name(nm, &t)) continue;
        char sub[HP__PATH_MAX + 300];
        snprintf(sub, sizeof sub, "%s/%s", path, nm);
        if (t <= best) continue;
        if (hp_train_ckpt_check(sub, NULL, NULL) == HP_OK) best = t;
        else skipped++;
    }
    closedir(d);
    if (best < 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s %s: it holds no complete checkpoint (a step-<t> folder whose state.json "
                          "names files that are all there)%s", label, path,
                          skipped ? "; its step-<t> folders are incomplete" : "");
    if ((size_t)snprintf(out, cap, "%s/step-%lld", path, best) >= cap)
        return hp_err_set(err, HP_ERR_INPUT, "%s %s: the path is too long", label, path);
    return HP_OK;
}

hp_status hp_train_ckpt_write_state(const char *dir, int64_t step, int world, const char *flags_json, hp_err *err)
{
    json_error_t je;
    json_t *flags = json_loads(flags_json, 0, &je), *files = json_array();
    if (!flags || !json_is_object(flags) || !files) {
        json_decref(flags);
        json_decref(files);
        return hp_err_set(err, HP_ERR_INPUT, "state.json: the run's flags are not a JSON object");
    }
    json_array_append_new(files, json_string("config.json"));
    json_array_append_new(files, json_string("model.safetensors"));
    for (int r = 0; r < world; r++) {
        char name[64];
        snprintf(name, sizeof name, "rank-%d.safetensors", r);
        json_array_append_new(files, json_string(name));
    }
    json_t *root = json_pack("{s:s, s:I, s:i, s:o, s:o}", "format", HP_TRAIN_CKPT_FORMAT, "step", (json_int_t)step,
                             "world", world, "files", files, "flags", flags);
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    char p[HP__PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/state.json", dir);
    hp_status st = text ? hp_file_write_atomic(p, text, strlen(text), "state.json", err)
                        : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    free(text);
    return st;
}

/* ---- config.json's dtype ---- */

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* Past the string starting at s[i] == '"'; n when it is not closed. */
static size_t skip_string(const char *s, size_t i, size_t n)
{
    for (i++; i < n; i++) {
        if (s[i] == '\\') i++;
        else if (s[i] == '"') return i + 1;
    }
    return n;
}

/* Past the JSON value at s[i]: a string, an object or array (nesting and strings followed), or a literal. */
static size_t skip_value(const char *s, size_t i, size_t n)
{
    if (i < n && s[i] == '"') return skip_string(s, i, n);
    int depth = 0;
    while (i < n) {
        char c = s[i];
        if (c == '"') {
            i = skip_string(s, i, n);
            continue;
        }
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') {
            if (depth == 0) return i;
            if (--depth == 0) return i + 1;
        } else if (depth == 0 && (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r')) return i;
        i++;
    }
    return n;
}

hp_status hp_config_set_dtype(const char *label, const char *text, size_t n, const char *torch_dtype, char **out,
                              hp_err *err)
{
    size_t spans[2][2];
    int n_spans = 0;
    size_t i = skip_ws(text, 0, n), open = i;
    bool bad = i >= n || text[i] != '{', members = false;
    for (i++; !bad;) {
        i = skip_ws(text, i, n);
        if (i < n && text[i] == '}') break;
        if (i >= n || text[i] != '"') {
            bad = true;
            break;
        }
        size_t k0 = i + 1, k1 = skip_string(text, i, n) - 1;
        i = skip_ws(text, k1 + 1, n);
        if (i >= n || text[i] != ':') {
            bad = true;
            break;
        }
        i = skip_ws(text, i + 1, n);
        size_t v0 = i, v1 = skip_value(text, i, n);
        if (v1 == v0 || v1 > n) {
            bad = true;
            break;
        }
        members = true;
        size_t kl = k1 - k0;
        if (((kl == 11 && !strncmp(text + k0, "torch_dtype", 11)) || (kl == 5 && !strncmp(text + k0, "dtype", 5))) &&
            n_spans < 2) {
            spans[n_spans][0] = v0;
            spans[n_spans++][1] = v1;
        }
        i = skip_ws(text, v1, n);
        if (i < n && text[i] == ',') i++;
        else if (i < n && text[i] == '}') break;
        else bad = true;
    }
    if (bad)
        return hp_err_set(err, HP_ERR_INPUT, "%s is not a JSON object; it is copied with %s weights", label,
                          torch_dtype);
    char f32[64], add[96];
    snprintf(f32, sizeof f32, "\"%s\"", torch_dtype);
    snprintf(add, sizeof add, "\n  \"torch_dtype\": \"%s\"", torch_dtype);
    size_t fl = strlen(f32), al = strlen(add);
    char *o = malloc(n + al + 2 + 2 * fl + 1);
    if (!o) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    size_t len = 0, at = 0;
    if (n_spans == 0) {
        memcpy(o, text, open + 1);
        len = open + 1;
        memcpy(o + len, add, al);
        len += al;
        if (members) o[len++] = ',';
        at = open + 1;
    }
    for (int s = 0; s < n_spans; s++) {
        memcpy(o + len, text + at, spans[s][0] - at);
        len += spans[s][0] - at;
        memcpy(o + len, f32, fl);
        len += fl;
        at = spans[s][1];
    }
    memcpy(o + len, text + at, n - at);
    len += n - at;
    o[len] = '\0';
    *out = o;
    return HP_OK;
}

/* ---- merge ---- */

typedef struct conv_ctx {
    const hp_st_file *f;
    const hp_st_tensor *t;
    hp_dtype to;
    uint64_t off;   /* bytes of t read so far */
    float *buf;     /* the f32 values of one piece */
    size_t buf_cap; /* elements */
    void *raw;      /* its stored BF16 / F16 bytes */
} conv_ctx;

static bool is_float(hp_dtype dt) { return dt == HP_DT_F32 || dt == HP_DT_BF16 || dt == HP_DT_F16; }

/* The next nbytes of the tensor in ctx->to: read as stored, widened to f32, narrowed (BF16: round to nearest
 * even). A tensor kept as stored is copied. */
static hp_status conv_fill(void *vctx, void *dst, size_t nbytes, hp_err *err)
{
    conv_ctx *c = vctx;
    const hp_st_tensor *t = c->t;
    if (t->dtype == c->to || !is_float(t->dtype)) {
        hp_status st = hp_st_read(c->f, t, c->off, dst, nbytes, err);
        c->off += nbytes;
        return st;
    }
    size_t n = nbytes / (size_t)(hp_dtype_bits(c->to) / 8), in = n * (size_t)(hp_dtype_bits(t->dtype) / 8);
    if (n > c->buf_cap) {
        float *nb = realloc(c->buf, n * sizeof *nb);
        if (!nb) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        c->buf = nb;
        free(c->raw);
        c->raw = malloc(n * sizeof(float));
        if (!c->raw) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        c->buf_cap = n;
    }
    void *raw = t->dtype == HP_DT_F32 ? (void *)c->buf : c->raw;
    hp_status st = hp_st_read(c->f, t, c->off, raw, in, err);
    c->off += in;
    if (st == HP_OK && t->dtype != HP_DT_F32) st = hp_dtype_to_f32(t->dtype, raw, c->buf, (int64_t)n, err);
    if (st == HP_OK) st = hp_dtype_from_f32(c->to, c->buf, dst, (int64_t)n, err);
    return st;
}

static const char *torch_name(hp_dtype dt) { return dt == HP_DT_BF16 ? "bfloat16" : "float32"; }

static hp_status read_all(const char *path, char **out, size_t *len, hp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return hp_err_set(err, HP_ERR_INPUT, "%s: cannot read it (%s)", path, strerror(errno));
    struct stat sb;
    char *buf = NULL;
    size_t n = 0;
    if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size <= ((off_t)64 << 20)) {
        buf = malloc((size_t)sb.st_size + 1);
        if (buf) n = fread(buf, 1, (size_t)sb.st_size, f);
    }
    bool bad = !buf || ferror(f) || n != (size_t)sb.st_size;
    fclose(f);
    if (bad) {
        free(buf);
        return hp_err_set(err, HP_ERR_INPUT, "%s: cannot read it whole (not a regular file under 64 MiB)", path);
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return HP_OK;
}

hp_status hp_train_ckpt_merge(const char *ckpt, const char *out, const hp_train_merge_opts *opts, int64_t *step_out,
                              hp_err *err)
{
    hp_train_merge_opts defaults = {.dtype = HP_DT_F32};
    if (!opts) opts = &defaults;
    hp_dtype to = opts->dtype;
    if (to != HP_DT_F32 && to != HP_DT_BF16)
        return hp_err_set(err, HP_ERR_INPUT, "merge: --dtype %s: a training checkpoint merges to f32 or bf16",
                          hp_dtype_name(to));
    char dir[HP__PATH_MAX];
    hp_status st = hp_train_ckpt_find("merge", ckpt, dir, sizeof dir, err);
    int64_t step = 0;
    if (st == HP_OK) st = hp_train_ckpt_check(dir, &step, err);
    if (st != HP_OK) return st;
    hp__outdir *od = hp_calloc(1, sizeof *od);
    if (!od) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    const char *inputs[1] = {ckpt};
    st = hp__out_prepare(od, "merge", out, opts->force, inputs, 1, err);
    char path[HP__PATH_MAX + 64], *text = NULL, *cfg = NULL;
    size_t tlen = 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (st == HP_OK) st = read_all(path, &text, &tlen, err);
    if (st == HP_OK) st = hp_config_set_dtype(path, text, tlen, torch_name(to), &cfg, err);
    hp_st_file *f = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st == HP_OK) st = hp_st_open(&f, path, err);
    size_t n = f ? hp_st_count(f) : 0;
    conv_ctx *cc = st == HP_OK ? hp_calloc(n + 1, sizeof *cc) : NULL;
    hp_st_writer *w = st == HP_OK ? hp_st_writer_create() : NULL;
    if (st == HP_OK && (!cc || !w)) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "format", "pt", err);
    for (size_t i = 0; st == HP_OK && i < n; i++) {
        const hp_st_tensor *t = hp_st_tensor_at(f, i);
        cc[i] = (conv_ctx){.f = f, .t = t, .to = is_float(t->dtype) ? to : t->dtype};
        st = hp_st_writer_add_fill(w, t->name, cc[i].to, t->n_dims, t->shape, conv_fill, &cc[i], err);
    }
    if (st == HP_OK) st = hp__out_begin(od, err);
    if (st == HP_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", od->tmp);
        st = hp_st_writer_write(w, path, err);
        snprintf(path, sizeof path, "%s/config.json", od->tmp);
        if (st == HP_OK) st = hp__write_text(path, cfg, strlen(cfg), err);
        if (st == HP_OK && hp__interrupted()) st = hp__interrupt_error(err);
        if (st == HP_OK) st = hp__out_commit(od, err);
        if (st != HP_OK) {
            hp__out_fix_msg(od, err);
            hp__out_abort(od);
        }
    }
    for (size_t i = 0; cc && i < n; i++) free(cc[i].buf), free(cc[i].raw);
    free(cc);
    hp_st_writer_destroy(w);
    hp_st_close(f);
    free(text);
    free(cfg);
    free(od);
    if (st == HP_OK && step_out) *step_out = step;
    return st;
}
