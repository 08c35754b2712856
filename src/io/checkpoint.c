/*
 * checkpoint.c — one or more safetensors files seen as one tensor list.
 *
 * A checkpoint is found from a path that is
 *   - a folder: model.safetensors if present (as transformers: a folder also holding an index loads the
 *     single file, with a warning), else model.safetensors.index.json, else its only *.safetensors;
 *   - an index (*.json): {"metadata": {...}, "weight_map": {"<tensor>": "<shard file>", ...}}, shards
 *     resolved next to the index (spec/hf_reference.md §5.2);
 *   - any other file: one safetensors file.
 *
 * Invariants after hp_ckpt_open succeeds:
 *   - every shard is a fully validated hp_st_file, opened once; files are in sorted file-name order;
 *   - the weight_map and the shards agree exactly: each listed tensor is in its shard, each shard tensor is
 *     listed and mapped to that shard, and no tensor is in two shards;
 *   - tensors are ordered by shard, then by header order within the shard; names are unique and an index
 *     sorted by name gives O(log n) lookup.
 */
#include "hyperpar/safetensors.h"

#include "io/json.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct hp_ckpt {
    char *dir;             /* folder holding the files */
    hp_st_file **files;    /* [n_files], sorted by file name */
    size_t n_files;
    hp_ckpt_tensor *tensors; /* [n], file order then header order */
    size_t n;
    const hp_ckpt_tensor **by_name; /* [n], sorted by name */
    char *source;          /* what was read: the index, or the single .safetensors file */
    char *ignored;         /* an index a folder also holds, ignored in favour of model.safetensors; or NULL */
};

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* The folder part of path ("." when there is none). */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return hp_strdup(".");
    if (slash == path) return hp_strdup("/");
    size_t n = (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = '\0';
    }
    return d;
}

static const char *base_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static bool is_regular(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const hp_ckpt_tensor *const *)a)->t->name, (*(const hp_ckpt_tensor *const *)b)->t->name);
}

static hp_status nomem(hp_err *err) { return hp_err_set(err, HP_ERR_NOMEM, "checkpoint: out of memory."); }

/* Lists the tensors of all files in order and builds the name index. */
static hp_status build_list(hp_ckpt *c, hp_err *err)
{
    size_t n = 0;
    for (size_t i = 0; i < c->n_files; i++) n += hp_st_count(c->files[i]);
    c->tensors = hp_calloc(n, sizeof *c->tensors);
    c->by_name = hp_calloc(n, sizeof *c->by_name);
    if (!c->tensors || !c->by_name) return nomem(err);
    for (size_t i = 0; i < c->n_files; i++) {
        for (size_t j = 0; j < hp_st_count(c->files[i]); j++) {
            hp_ckpt_tensor *t = &c->tensors[c->n];
            t->t = hp_st_tensor_at(c->files[i], j);
            t->file = c->files[i];
            t->file_index = (int)i;
            c->by_name[c->n++] = t;
        }
    }
    qsort(c->by_name, c->n, sizeof *c->by_name, cmp_tensor_name);
    for (size_t i = 1; i < c->n; i++) {
        const hp_ckpt_tensor *a = c->by_name[i - 1], *b = c->by_name[i];
        char en[256];
        if (strcmp(a->t->name, b->t->name) == 0)
            return hp_err_set(err, HP_ERR_INPUT,
                              "tensor '%s' appears in both %s and %s; a tensor must live in exactly one file.",
                              hp_escape(a->t->name, en, sizeof en), hp_st_path(a->file), hp_st_path(b->file));
    }
    return HP_OK;
}

static hp_status open_single(hp_ckpt *c, const char *path, hp_err *err)
{
    c->files = hp_calloc(1, sizeof *c->files);
    if (!c->files) return nomem(err);
    hp_status st = hp_st_open(&c->files[0], path, err);
    if (st) return st;
    c->n_files = 1;
    return HP_OK;
}

/* A shard name must stay inside the checkpoint folder. */
static bool plain_file_name(const char *s)
{
    return s[0] && strchr(s, '/') == NULL && strchr(s, '\\') == NULL && strcmp(s, ".") != 0 &&
           strcmp(s, "..") != 0;
}

/* Checks that the weight_map wm and the opened shards (names[i] -> c->files[i]) agree exactly. */
static hp_status check_agreement(hp_ckpt *c, const char *idx, json_t *wm, char **names, hp_err *err)
{
    const char *key;
    json_t *v;
    char en[256], ef[256], em[256]; /* names from the files, escaped for the messages */
    json_object_foreach(wm, key, v) {
        const char *fname = json_string_value(v);
        char **hit = bsearch(&fname, names, c->n_files, sizeof *names, cmp_str);
        if (!hit) return hp_err_set(err, HP_ERR_INPUT, "%s: internal shard lookup failed.", idx); /* not reached */
        if (!hp_st_find(c->files[hit - names], key))
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: tensor '%s' is listed in %s for shard %s but %s does not contain it; the index "
                              "and the shards disagree (re-download the checkpoint or regenerate the index).",
                              idx, hp_escape(key, en, sizeof en), base_of(idx), hp_escape(fname, ef, sizeof ef), ef);
    }
    for (size_t i = 0; i < c->n_files; i++) {
        for (size_t j = 0; j < hp_st_count(c->files[i]); j++) {
            const char *name = hp_st_tensor_at(c->files[i], j)->name;
            const char *mapped = json_string_value(json_object_get(wm, name));
            if (!mapped)
                return hp_err_set(err, HP_ERR_INPUT,
                                  "%s: shard %s contains tensor '%s', which the weight_map of %s does not list; the "
                                  "index and the shards disagree (regenerate the index).", idx,
                                  hp_escape(names[i], ef, sizeof ef), hp_escape(name, en, sizeof en), base_of(idx));
            if (strcmp(mapped, names[i]) != 0)
                return hp_err_set(err, HP_ERR_INPUT,
                                  "%s: tensor '%s' appears in both shard %s and shard %s (the index maps it to %s); "
                                  "a tensor must live in exactly one shard.", idx, hp_escape(name, en, sizeof en),
                                  hp_escape(names[i], ef, sizeof ef), hp_escape(mapped, em, sizeof em), em);
        }
    }
    return HP_OK;
}

static hp_status open_index(hp_ckpt *c, const char *idx, hp_err *err)
{
    /* Read through hp__read_file: never a blocking open (a FIFO is refused by name), and a size limit. */
    char *text = NULL;
    size_t len = 0;
    hp_status rst = hp__read_file(idx, HP_JSON_MAX_FILE, &text, &len, err);
    if (rst != HP_OK) return rst;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    free(text);
    if (!root)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: the index is not valid JSON: %s (line %d, column %d); re-download or regenerate it.",
                          idx, je.text, je.line, je.column);
    hp_status st = HP_OK;
    char **names = NULL;
    json_t *wm = json_object_get(root, "weight_map");
    json_t *meta = json_object_get(root, "metadata");
    if (!json_is_object(root)) {
        st = hp_err_set(err, HP_ERR_INPUT, "%s: the index is not a JSON object with a \"weight_map\"; it is "
                        "corrupt or not a safetensors index.", idx);
        goto done;
    }
    if (!json_is_object(wm)) {
        st = hp_err_set(err, HP_ERR_INPUT, "%s: \"weight_map\" is %s, expected an object mapping tensor names to "
                        "shard file names; the index is corrupt.", idx, wm ? "not an object" : "missing");
        goto done;
    }
    if (meta && !json_is_object(meta)) {
        st = hp_err_set(err, HP_ERR_INPUT, "%s: \"metadata\" is not an object; the index is corrupt.", idx);
        goto done;
    }
    if (json_object_size(wm) == 0) {
        st = hp_err_set(err, HP_ERR_INPUT, "%s: \"weight_map\" is empty, so the checkpoint holds no tensors; the "
                        "index is truncated or corrupt (re-download it, or point hyperpar at a .safetensors file).", idx);
        goto done;
    }
    size_t n_map = json_object_size(wm), n_names = 0;
    names = hp_calloc(n_map, sizeof *names);
    if (!names) {
        st = nomem(err);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *fname = json_string_value(v);
        if (!fname) {
            char en[256];
            st = hp_err_set(err, HP_ERR_INPUT, "%s: weight_map entry for tensor '%s' is not a string; it must name "
                            "the shard file holding the tensor.", idx, hp_escape(key, en, sizeof en));
            goto done;
        }
        if (!plain_file_name(fname)) {
            char en[256], ef[256];
            st = hp_err_set(err, HP_ERR_INPUT, "%s: weight_map maps tensor '%s' to '%s', which is not a plain file "
                            "name; shard names must not contain '/' or be '..' (they live next to the index).",
                            idx, hp_escape(key, en, sizeof en), hp_escape(fname, ef, sizeof ef));
            goto done;
        }
        names[n_names++] = (char *)fname;
    }
    qsort(names, n_names, sizeof *names, cmp_str);
    size_t n_files = 0;
    for (size_t i = 0; i < n_names; i++)
        if (n_files == 0 || strcmp(names[n_files - 1], names[i]) != 0) names[n_files++] = names[i];
    c->files = hp_calloc(n_files, sizeof *c->files);
    if (!c->files) {
        st = nomem(err);
        goto done;
    }
    for (size_t i = 0; i < n_files; i++) {
        char *p = path_join(c->dir, names[i]);
        if (!p) {
            st = nomem(err);
            goto done;
        }
        if (!is_regular(p)) {
            char why[256];
            st = hp_err_set(err, HP_ERR_INPUT, "%s: the weight_map lists shard %s but %s %s; the checkpoint is "
                            "incomplete (download every shard).", idx, names[i], p, hp_path_describe(p, why, sizeof why));
            free(p);
            goto done;
        }
        st = hp_st_open(&c->files[i], p, err);
        free(p);
        if (st) goto done;
        c->n_files++;
    }
    st = check_agreement(c, idx, wm, names, err);
done:
    free(names);
    json_decref(root);
    return st;
}

/* A folder without an index or model.safetensors: use its only *.safetensors file. */
static hp_status open_only_file(hp_ckpt *c, const char *dir, hp_err *err)
{
    DIR *d = opendir(dir);
    if (!d) return hp_err_set(err, HP_ERR_IO, "%s: cannot list the folder: %s.", dir, strerror(errno));
    char **found = NULL;
    size_t n = 0, cap = 0;
    hp_status st = HP_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!ends_with(e->d_name, ".safetensors") || e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **p = realloc(found, cap * sizeof *p);
            if (!p) {
                st = nomem(err);
                break;
            }
            found = p;
        }
        if (!(found[n] = hp_strdup(e->d_name))) {
            st = nomem(err);
            break;
        }
        n++;
    }
    closedir(d);
    if (st == HP_OK && n == 0)
        st = hp_err_set(err, HP_ERR_INPUT, "%s: no checkpoint here: looked for %s, %s and any *.safetensors file; "
                        "pass the folder of a downloaded model or a .safetensors file.", dir, INDEX_NAME,
                        SINGLE_NAME);
    if (st == HP_OK && n > 1) {
        qsort(found, n, sizeof *found, cmp_str);
        hp_buf b;
        hp_buf_init(&b);
        for (size_t i = 0; i < n && i < 8; i++) hp_buf_printf(&b, "%s%s", i ? ", " : "", found[i]);
        if (n > 8) hp_buf_printf(&b, " and %zu more", n - 8);
        st = hp_err_set(err, HP_ERR_INPUT, "%s: holds %zu .safetensors files (%s) but no %s; pass one file or "
                        "add the index.", dir, n, b.data ? b.data : "", INDEX_NAME);
        hp_buf_free(&b);
    }
    if (st == HP_OK) {
        char *p = path_join(dir, found[0]);
        st = p ? open_single(c, p, err) : nomem(err);
        free(p);
    }
    for (size_t i = 0; i < n; i++) free(found[i]);
    free(found);
    return st;
}

/* Whether something exists at path (a dangling symbolic link counts: opening it then says what it is). */
static bool exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* A folder: model.safetensors first, then the index, then its only *.safetensors file. transformers
 * (modeling_utils, _get_resolved_checkpoint_files) checks model.safetensors before the index, so a folder
 * holding both loads the single file; we do the same and say so. */
static hp_status open_folder(hp_ckpt *c, const char *path, hp_err *err)
{
    char *idx = path_join(path, INDEX_NAME), *single = path_join(path, SINGLE_NAME);
    hp_status st;
    if (!idx || !single) {
        st = nomem(err);
    } else if (exists(single)) {
        /* hp_st_open refuses a FIFO, a folder or a dangling link named model.safetensors by what it is. */
        st = open_single(c, single, err);
        if (st == HP_OK && exists(idx)) {
            hp_log(HP_LOG_WARN, "%s holds both %s and %s; using %s as transformers does (the index is ignored)", path,
                   SINGLE_NAME, INDEX_NAME, SINGLE_NAME);
            c->ignored = hp_strdup(idx);
            if (!c->ignored) st = nomem(err);
        }
        if (st == HP_OK && !(c->source = hp_strdup(single))) st = nomem(err);
    } else if (exists(idx)) {
        st = open_index(c, idx, err);
        if (st == HP_OK && !(c->source = hp_strdup(idx))) st = nomem(err);
    } else {
        st = open_only_file(c, path, err);
        if (st == HP_OK && !(c->source = hp_strdup(hp_st_path(c->files[0])))) st = nomem(err);
    }
    free(idx);
    free(single);
    return st;
}

hp_status hp_ckpt_open(hp_ckpt **out, const char *path, hp_err *err)
{
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        char why[256];
        int e = errno;
        return hp_err_set(err, e == ENOENT || e == ENOTDIR || e == ELOOP || e == EACCES ? HP_ERR_INPUT : HP_ERR_IO,
                          "%s: cannot open: the path %s; pass a checkpoint folder, a %s or a .safetensors file.", path,
                          hp_path_describe(path, why, sizeof why), INDEX_NAME);
    }
    hp_ckpt *c = hp_calloc(1, sizeof *c);
    if (!c) return nomem(err);
    hp_status st;
    bool is_dir = S_ISDIR(sb.st_mode);
    c->dir = is_dir ? hp_strdup(path) : dir_of(path);
    if (!c->dir) {
        st = nomem(err);
    } else if (is_dir) {
        st = open_folder(c, path, err);
    } else {
        st = ends_with(path, ".json") ? open_index(c, path, err) : open_single(c, path, err);
        if (st == HP_OK && !(c->source = hp_strdup(path))) st = nomem(err);
    }
    if (st == HP_OK) st = build_list(c, err);
    if (st) {
        hp_ckpt_close(c);
        return st;
    }
    *out = c;
    return HP_OK;
}

void hp_ckpt_close(hp_ckpt *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->n_files; i++) hp_st_close(c->files[i]);
    free(c->files);
    free(c->tensors);
    free(c->by_name);
    free(c->dir);
    free(c->source);
    free(c->ignored);
    free(c);
}

const char *hp_ckpt_dir(const hp_ckpt *c) { return c->dir; }
const char *hp_ckpt_source(const hp_ckpt *c) { return c->source; }
const char *hp_ckpt_ignored(const hp_ckpt *c) { return c->ignored; }
size_t hp_ckpt_count(const hp_ckpt *c) { return c->n; }
const hp_ckpt_tensor *hp_ckpt_at(const hp_ckpt *c, size_t i) { return i < c->n ? &c->tensors[i] : NULL; }
size_t hp_ckpt_file_count(const hp_ckpt *c) { return c->n_files; }
const hp_st_file *hp_ckpt_file(const hp_ckpt *c, size_t i) { return i < c->n_files ? c->files[i] : NULL; }

const hp_ckpt_tensor *hp_ckpt_find(const hp_ckpt *c, const char *name)
{
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = strcmp(c->by_name[mid]->t->name, name);
        if (r == 0) return c->by_name[mid];
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}
