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
 *   bound    state.json's run_id and "sums" (every file's bytes and XXH64, written last by write_state, which
 *            hashes the files in place) ─▶ each file's size, each rank file's metadata (rank, checkpoint_step,
 *            world, run_id) and a step-<t> folder's t (hp_train_ckpt_check: no hashing); the bytes themselves
 *            by hp_train_ckpt_verify (merge: every file; --resume: each rank its own)
 *
 * Invariant: a checkpoint is only ever read once state.json lists every file and each is there and bound; the
 * merge reads only config.json and model.safetensors, the parameters as trained (the rank files hold the optimizer
 * state), after checking every file's bytes against state.json.
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

/* Whether dir is complete (the first half of hp_train_ckpt_check): state.json reads, every file it names is
 * there. *step on success. */
static hp_status ckpt_complete(const char *dir, int64_t *step, hp_err *err)
{
    char p[HP__PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/state.json", dir);
    if (!regular(dir, "state.json")) { /* never opened unless a file: a FIFO would block the read */
        char why[160];
        return hp_err_set(err, HP_ERR_INPUT, "%s: its state.json %s; not a complete training checkpoint", dir,
                          hp_path_describe(p, why, sizeof why));
    }
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
        else if (!regular(dir, f)) {
            char fp[HP__PATH_MAX + 300], why[160];
            snprintf(fp, sizeof fp, "%s/%s", dir, f);
            struct stat sb;
            st = hp_err_set(err, HP_ERR_INPUT, "%s: %s, which state.json names, %s; the checkpoint is incomplete", dir,
                            f, lstat(fp, &sb) != 0 ? "is missing" : hp_path_describe(fp, why, sizeof why));
        }
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

/* ---- what binds a checkpoint's files together ---- */

hp_status hp_train_file_sum(const char *path, uint64_t *bytes, uint64_t *xxh64, hp_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return hp_err_set(err, HP_ERR_INPUT, "%s: cannot read it (%s)", path, strerror(errno));
    enum { CHUNK = 1 << 20 }; /* 1 MiB reads: the hash runs at memory speed, the reads at the disk's */
    char *buf = malloc(CHUNK);
    hp_hash64 h;
    hp_hash64_init(&h, 0);
    uint64_t n = 0;
    size_t k = 0;
    while (buf && (k = fread(buf, 1, CHUNK, f)) > 0) {
        hp_hash64_update(&h, buf, k);
        n += k;
    }
    bool nomem = !buf, bad = nomem || ferror(f);
    fclose(f);
    free(buf);
    if (bad)
        return hp_err_set(err, nomem ? HP_ERR_NOMEM : HP_ERR_IO, "%s: %s", path,
                          nomem ? "out of memory" : "read error");
    *bytes = n;
    *xxh64 = hp_hash64_final(&h);
    return HP_OK;
}

/* state.json's record of file name: {"bytes": N, "xxh64": "<16 hex digits>"}, or NULL. */
static json_t *sum_of(json_t *root, const char *name)
{
    json_t *e = json_object_get(json_object_get(root, "sums"), name);
    json_t *b = json_object_get(e, "bytes"), *x = json_object_get(e, "xxh64");
    return json_is_integer(b) && json_integer_value(b) >= 0 && json_is_string(x) &&
           strlen(json_string_value(x)) == 16 ? e : NULL;
}

static bool hex16(const char *s) { return s && strlen(s) == 16 && strspn(s, "0123456789abcdef") == 16; }

/* The second half of hp_train_ckpt_check, on a complete checkpoint: state.json names the run and records every
 * file's size and hash, each file has its recorded size, a step-<t> folder's t is state.json's step, and every
 * rank file's metadata says its rank, the step, the world and the run. Cheap: sizes and headers, no hashing. */
static hp_status ckpt_bound(const char *dir, json_t *root, hp_err *err)
{
    int64_t step = (int64_t)json_integer_value(json_object_get(root, "step"));
    int64_t world = (int64_t)json_integer_value(json_object_get(root, "world"));
    const char *run = json_string_value(json_object_get(root, "run_id"));
    json_t *files = json_object_get(root, "files");
    if (!hex16(run))
        return hp_err_set(err, HP_ERR_INPUT, "%s: state.json has no \"run_id\" (16 hex digits): it was written before "
                          "checkpoints were bound to their run, or edited; it cannot be checked, so it is not taken",
                          dir);
    const char *base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    long long t;
    if (step_name(base, &t) && t != step)
        return hp_err_set(err, HP_ERR_INPUT, "%s: state.json says step %lld, the folder's name step %lld; a "
                          "checkpoint's folder is not renamed, and its state.json not edited", dir, (long long)step, t);
    for (size_t i = 0; i < json_array_size(files); i++) {
        const char *f = json_string_value(json_array_get(files, i));
        json_t *e = sum_of(root, f);
        char p[HP__PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s", dir, f);
        struct stat sb = {0};
        if (!e)
            return hp_err_set(err, HP_ERR_INPUT, "%s: state.json records no size and hash of %s (\"sums\"); it cannot "
                              "be checked, so it is not taken", dir, f);
        long long want = (long long)json_integer_value(json_object_get(e, "bytes"));
        if (stat(p, &sb) != 0 || (long long)sb.st_size != want)
            return hp_err_set(err, HP_ERR_INPUT, "%s: %s is %lld bytes where state.json records %lld; it is not the "
                              "file this checkpoint saved (replaced, truncated or from another checkpoint)", dir, f,
                              (long long)sb.st_size, want);
    }
    for (int64_t r = 0; r < world; r++) {
        char p[HP__PATH_MAX + 64];
        snprintf(p, sizeof p, "%s/rank-%lld.safetensors", dir, (long long)r);
        hp_st_file *sf = NULL;
        hp_status st = hp_st_open(&sf, p, err);
        if (st != HP_OK) return st;
        const char *mr = hp_st_metadata_get(sf, "rank"), *ms = hp_st_metadata_get(sf, "checkpoint_step");
        const char *mw = hp_st_metadata_get(sf, "world"), *mu = hp_st_metadata_get(sf, "run_id");
        char want[64];
        const char *what = NULL, *had = NULL;
        snprintf(want, sizeof want, "%lld", (long long)r);
        if (!mr || strcmp(mr, want)) what = "rank", had = mr;
        if (!what && (snprintf(want, sizeof want, "%lld", (long long)step), !ms || strcmp(ms, want)))
            what = "checkpoint_step", had = ms;
        if (!what && (snprintf(want, sizeof want, "%lld", (long long)world), !mw || strcmp(mw, want)))
            what = "world", had = mw;
        if (!what && (!mu || strcmp(mu, run))) what = "run_id", had = mu, snprintf(want, sizeof want, "%s", run);
        const char *sa = hp_st_metadata_get(sf, "step"); /* AdamW's steps: at most the run's (skipped ones take none) */
        if (!what && (!sa || strspn(sa, "0123456789") != strlen(sa) || !*sa || strlen(sa) > 15 ||
                      strtoll(sa, NULL, 10) > step))
            what = "step", had = sa, snprintf(want, sizeof want, "at most %lld", (long long)step);
        if (what)
            st = hp_err_set(err, HP_ERR_INPUT, "%s: rank-%lld.safetensors says %s %s where this checkpoint "
                            "(state.json: step %lld of %lld ranks, run %s) needs %s; the file belongs to another %s: "
                            "restore this checkpoint's own file", dir, (long long)r, what, had ? had : "(none)",
                            (long long)step, (long long)world, run, want,
                            !strcmp(what, "run_id") ? "run" : !strcmp(what, "world") ? "mesh"
                            : !strcmp(what, "rank") ? "rank" : "step");
        hp_st_close(sf);
        if (st != HP_OK) return st;
    }
    return HP_OK;
}

hp_status hp_train_ckpt_check(const char *dir, int64_t *step, hp_err *err)
{
    int64_t t = 0;
    hp_status st = ckpt_complete(dir, &t, err);
    char p[HP__PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/state.json", dir);
    json_t *root = st == HP_OK ? json_load_file(p, 0, NULL) : NULL;
    if (st == HP_OK && !root) st = hp_err_set(err, HP_ERR_INPUT, "%s: state.json changed while it was read", dir);
    if (st == HP_OK) st = ckpt_bound(dir, root, err);
    json_decref(root);
    if (st == HP_OK && step) *step = t;
    return st;
}

hp_status hp_train_ckpt_verify(const char *dir, const char *name, hp_err *err)
{
    char p[HP__PATH_MAX + 300];
    snprintf(p, sizeof p, "%s/state.json", dir);
    json_t *root = json_load_file(p, 0, NULL);
    json_t *e = root ? sum_of(root, name) : NULL;
    hp_status st = HP_OK;
    if (!e) st = hp_err_set(err, HP_ERR_INPUT, "%s: state.json records no size and hash of %s", dir, name);
    uint64_t bytes = 0, h = 0;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (st == HP_OK) st = hp_train_file_sum(p, &bytes, &h, err);
    char hx[17];
    snprintf(hx, sizeof hx, "%016llx", (unsigned long long)h);
    if (st == HP_OK && (bytes != (uint64_t)json_integer_value(json_object_get(e, "bytes")) ||
                        strcmp(hx, json_string_value(json_object_get(e, "xxh64")))))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: %s has XXH64 %s (%llu bytes) where state.json records %s (%lld bytes); "
                        "it is not the file this checkpoint saved (changed since, or from another checkpoint)", dir,
                        name, hx, (unsigned long long)bytes, json_string_value(json_object_get(e, "xxh64")),
                        (long long)json_integer_value(json_object_get(e, "bytes")));
    json_decref(root);
    return st;
}

hp_status hp_train_ckpt_verify_all(const char *dir, hp_err *err)
{
    char p[HP__PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/state.json", dir);
    json_t *root = json_load_file(p, 0, NULL), *files = root ? json_object_get(root, "files") : NULL;
    hp_status st = json_is_array(files) ? HP_OK : hp_err_set(err, HP_ERR_INPUT, "%s: state.json lists no files", dir);
    for (size_t i = 0; st == HP_OK && i < json_array_size(files); i++)
        st = hp_train_ckpt_verify(dir, json_string_value(json_array_get(files, i)), err);
    json_decref(root);
    return st;
}

hp_status hp_train_ckpt_run_id(const char *dir, char *out, size_t cap, hp_err *err)
{
    char p[HP__PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/state.json", dir);
    json_t *root = json_load_file(p, 0, NULL);
    const char *run = root ? json_string_value(json_object_get(root, "run_id")) : NULL;
    hp_status st = hex16(run) && cap > 16 ? HP_OK
                   : hp_err_set(err, HP_ERR_INPUT, "%s: state.json names no run (\"run_id\")", dir);
    if (st == HP_OK) snprintf(out, cap, "%s", run);
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
    long long best = -1, other_t = -1, first_t = -1;
    int skipped = 0;
    hp_err first_bad = {0}; /* the first incomplete step-<t>'s reason */
    char run[17] = "", other[17] = "";
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        long long t;
        if (!step_name(nm, &t)) continue;
        char sub[HP__PATH_MAX + 300], id[17];
        snprintf(sub, sizeof sub, "%s/%s", path, nm);
        hp_err e1;
        if (ckpt_complete(sub, NULL, &e1) != HP_OK) {
            if (!skipped++) first_bad = e1;
            continue;
        }
        if (t > best) best = t;
        /* every complete checkpoint of a run folder is of one run: a second run's would be mixed in */
        if (hp_train_ckpt_run_id(sub, id, sizeof id, NULL) != HP_OK) snprintf(id, sizeof id, "(none)");
        if (!*run) snprintf(run, sizeof run, "%s", id), first_t = t;
        else if (strcmp(run, id) && other_t < 0) snprintf(other, sizeof other, "%s", id), other_t = t;
    }
    closedir(d);
    if (other_t >= 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s %s: it holds the checkpoints of two runs (step-%lld of run %s, "
                          "step-%lld of run %s), so its last one need not be the run's; name the step-<t> folder to "
                          "take", label, path, first_t, run, other_t, other);
    if (best < 0) { /* a state.json that is there but is no file (a folder, a FIFO) is named for what it is */
        char sp[HP__PATH_MAX + 32], why[160];
        snprintf(sp, sizeof sp, "%s/state.json", path);
        struct stat sb;
        if (lstat(sp, &sb) == 0 && !S_ISREG(sb.st_mode))
            return hp_err_set(err, HP_ERR_INPUT, "%s %s: its state.json %s; a checkpoint's state.json is the file "
                              "'hyperpar train' writes", label, path, hp_path_describe(sp, why, sizeof why));
        return hp_err_set(err, HP_ERR_INPUT, "%s %s: it holds no complete checkpoint (a step-<t> folder whose state.json "
                          "names files that are all there)%s%s", label, path,
                          skipped ? "; its step-<t> folders are incomplete, the first seen: " : "",
                          skipped ? first_bad.msg : "");
    }
    if ((size_t)snprintf(out, cap, "%s/step-%lld", path, best) >= cap)
        return hp_err_set(err, HP_ERR_INPUT, "%s %s: the path is too long", label, path);
    return hp_train_ckpt_check(out, NULL, err); /* the last complete one must be bound, never passed over */
}

hp_status hp_train_ckpt_write_state(const char *dir, int64_t step, int world, const hp_train_ckpt_meta *meta,
                                    hp_err *err)
{
    json_error_t je;
    json_t *flags = json_loads(meta->flags_json, 0, &je), *files = json_array(), *sums = json_object();
    json_t *model = meta->model_json ? json_loads(meta->model_json, 0, &je) : json_object();
    hp_status st = HP_OK;
    if (!flags || !json_is_object(flags) || !model || !json_is_object(model) || !files || !sums)
        st = hp_err_set(err, HP_ERR_INPUT, "state.json: the run's flags or the model's config are not a JSON object");
    else if (!hex16(meta->run_id))
        st = hp_err_set(err, HP_ERR_INPUT, "state.json: the run id '%s' is not 16 hex digits",
                        meta->run_id ? meta->run_id : "");
    for (int r = -2; st == HP_OK && r < world; r++) {
        char name[64], p[HP__PATH_MAX + 64], hx[17];
        if (r < 0) snprintf(name, sizeof name, "%s", r == -2 ? "config.json" : "model.safetensors");
        else snprintf(name, sizeof name, "rank-%d.safetensors", r);
        json_array_append_new(files, json_string(name));
        snprintf(p, sizeof p, "%s/%s", dir, name);
        uint64_t bytes = 0, h = 0;
        st = hp_train_file_sum(p, &bytes, &h, err);
        snprintf(hx, sizeof hx, "%016llx", (unsigned long long)h);
        if (st == HP_OK)
            json_object_set_new(sums, name, json_pack("{s:I, s:s}", "bytes", (json_int_t)bytes, "xxh64", hx));
    }
    json_t *root = st == HP_OK ? json_pack("{s:s, s:I, s:i, s:s, s:O, s:O, s:O, s:O}", "format", HP_TRAIN_CKPT_FORMAT,
                                           "step", (json_int_t)step, "world", world, "run_id", meta->run_id,
                                           "files", files, "sums", sums, "model_config", model, "flags", flags)
                               : NULL;
    if (root && meta->command) json_object_set_new(root, "command", json_string(meta->command));
    if (root && meta->mesh) json_object_set_new(root, "mesh", json_string(meta->mesh));
    char *text = root ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    json_decref(flags), json_decref(files), json_decref(sums), json_decref(model);
    char p[HP__PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/state.json", dir);
    if (st == HP_OK)
        st = text ? hp_file_write_atomic(p, text, strlen(text), "state.json", err)
                  : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    free(text);
    return st;
}

hp_status hp_train_model_config(const char *path, char **out, hp_err *err)
{
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    if (!c || !json_is_object(c)) {
        json_decref(c);
        return hp_err_set(err, HP_ERR_INPUT, "%s: not a JSON object (%s, line %d)", path, je.text, je.line);
    }
    /* how the weights are stored is not the model: a checkpoint's own config.json says float32 */
    json_object_del(c, "torch_dtype");
    json_object_del(c, "dtype");
    *out = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(c);
    return *out ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
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
    if (st == HP_OK) st = hp_train_ckpt_verify_all(dir, err); /* every file is the one the run saved */
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
