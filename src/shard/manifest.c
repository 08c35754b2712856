/*
 * manifest.c — DIR/manifest.json: what every rank file holds and where it came from (docs/shard-format.md).
 *
 *   {"format": "hyperpar-shards", "version": 2, "identity": "<32 hex digits>",
 *    "plan":    {"file": "plan.json" | null, "fingerprint": "<FNV-1a 64 of the plan JSON text>",
 *                "stored": "plan.json" (that text, beside the rank files; absent in folders written before it)},
 *    "mesh":    {"dims": [{"name", "size"}], "world", "ep", "ep_mode"},
 *    "source":  {"path", "files", "total_bytes", "model_type", "architecture", "config_checksum": "xxh64:<16 hex>"
 *                (the config.json written beside the rank files; absent when the source had none)},
 *    "tensors": [{"name", "dtype", "shape"}]                      every parameter, model order
 *    "ranks":   [{"rank", "coords": {"dp": 0, ...}, "file", "file_rank", "bytes", "checksum": "xxh64:<16 hex>",
 *                 "tensors": [{"name", "global", "global_shape", "dtype", "slices": [{"dim", "offset", "length"}],
 *                              "experts": [first, count]}]}]}
 *
 * The reader is strict: wrong types, unknown dtypes, out-of-range numbers and file names with a '/' are
 * HP_ERR_INPUT naming the JSON path (ranks[3].tensors[2].slices[0].dim). Unknown keys are ignored. Version 1
 * (before identities and checksums) is refused with the way out: shard again.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json.h"
#include "shard/shard_int.h"

/* ---- writer ---- */

typedef struct jb {
    bool ok;
} jb;

static json_t *chk(jb *b, json_t *v)
{
    if (!v) b->ok = false;
    return v;
}
static void set(jb *b, json_t *o, const char *k, json_t *v)
{
    if (json_object_set_new(o, k, v) != 0) b->ok = false;
}
static void push(jb *b, json_t *a, json_t *v)
{
    if (json_array_append_new(a, v) != 0) b->ok = false;
}
static json_t *jint(jb *b, int64_t v)
{
    return chk(b, json_integer((json_int_t)v));
}
static json_t *jstr(jb *b, const char *s)
{
    return chk(b, json_string(s ? s : ""));
}

static json_t *shape_json(jb *b, int n, const int64_t *shape)
{
    json_t *a = chk(b, json_array());
    for (int d = 0; d < n; d++) push(b, a, jint(b, shape[d]));
    return a;
}

static json_t *rank_tensor_json(jb *b, const hp_shard_tensor *t)
{
    json_t *o = chk(b, json_object());
    set(b, o, "name", jstr(b, t->name));
    if (t->stacked) {
        json_t *g = chk(b, json_array());
        for (int e = 0; e < t->n_globals; e++) push(b, g, jstr(b, t->globals[e]));
        set(b, o, "global", g);
    } else {
        set(b, o, "global", jstr(b, t->globals[0]));
    }
    set(b, o, "global_shape", shape_json(b, t->n_dims, t->global_shape));
    set(b, o, "dtype", jstr(b, hp_dtype_name(t->dtype)));
    json_t *sl = chk(b, json_array());
    for (int i = 0; i < t->n_slices; i++) {
        json_t *s = chk(b, json_object());
        set(b, s, "dim", jint(b, t->slices[i].dim));
        set(b, s, "offset", jint(b, t->slices[i].offset));
        set(b, s, "length", jint(b, t->slices[i].length));
        push(b, sl, s);
    }
    set(b, o, "slices", sl);
    if (t->expert_count > 0) {
        json_t *e = chk(b, json_array());
        push(b, e, jint(b, t->expert_first));
        push(b, e, jint(b, t->expert_count));
        set(b, o, "experts", e);
    }
    return o;
}

hp_status hp__manifest_write(const hp_shard_layout *l, const hp_model *m, const char *plan_file, const char *plan_fp,
                             bool plan_stored, const char *identity, const uint64_t *bytes, const uint64_t *sums, const char *path,
                             hp_err *err)
{
    jb b = {.ok = true};
    json_t *root = chk(&b, json_object());
    set(&b, root, "format", jstr(&b, "hyperpar-shards"));
    set(&b, root, "version", jint(&b, HP__MANIFEST_VERSION));
    set(&b, root, "identity", jstr(&b, identity));
    json_t *plan = chk(&b, json_object());
    set(&b, plan, "file", plan_file ? jstr(&b, plan_file) : chk(&b, json_null()));
    set(&b, plan, "fingerprint", jstr(&b, plan_fp));
    if (plan_stored) set(&b, plan, "stored", jstr(&b, HP__SHARD_PLAN_FILE));
    set(&b, root, "plan", plan);

    json_t *mesh = chk(&b, json_object()), *dims = chk(&b, json_array());
    for (int d = 0; d < l->mesh.n_dims; d++) {
        json_t *o = chk(&b, json_object());
        set(&b, o, "name", jstr(&b, l->mesh.names[d]));
        set(&b, o, "size", jint(&b, l->mesh.sizes[d]));
        push(&b, dims, o);
    }
    set(&b, mesh, "dims", dims);
    set(&b, mesh, "world", jint(&b, l->world));
    set(&b, mesh, "ep", jint(&b, l->ep));
    set(&b, mesh, "ep_mode", jstr(&b, l->mesh.ep_axis ? "ep-axis" : l->ep > 1 ? "tp-extend-ep" : "none"));
    set(&b, root, "mesh", mesh);

    json_t *src = chk(&b, json_object());
    set(&b, src, "path", jstr(&b, m->path));
    set(&b, src, "files", jint(&b, (int64_t)hp_ckpt_file_count(m->ckpt)));
    set(&b, src, "total_bytes", jint(&b, (int64_t)hp_model_total_bytes(m)));
    set(&b, src, "model_type", jstr(&b, m->model_type));
    set(&b, src, "architecture", jstr(&b, m->architecture));
    /* The checksum of the config.json shard copies beside the rank files: an edit of it afterwards is named as
     * such (hp_shard_check_config), not found later as a layout "made for another plan". */
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", hp_ckpt_dir(m->ckpt));
    if (hp__file_exists(cfg)) {
        uint64_t csum = 0, csize = 0;
        hp_status cst = hp__file_checksum(cfg, &csum, &csize, err);
        if (cst != HP_OK) {
            json_decref(root);
            return cst;
        }
        char sum[40], hex[17];
        snprintf(sum, sizeof sum, "xxh64:%s", hp__hex64(csum, hex));
        set(&b, src, "config_checksum", jstr(&b, sum));
    }
    set(&b, root, "source", src);

    json_t *tensors = chk(&b, json_array());
    for (size_t i = 0; i < m->n_params; i++) {
        const hp_param *p = &m->params[i];
        json_t *o = chk(&b, json_object());
        set(&b, o, "name", jstr(&b, p->name));
        set(&b, o, "dtype", jstr(&b, hp_dtype_name(p->dtype)));
        set(&b, o, "shape", shape_json(&b, p->n_dims, p->shape));
        push(&b, tensors, o);
    }
    set(&b, root, "tensors", tensors);

    hp_status st = HP_OK;
    json_t *ranks = chk(&b, json_array());
    for (int64_t r = 0; r < l->world && st == HP_OK && b.ok; r++) {
        json_t *o = chk(&b, json_object()), *coords = chk(&b, json_object()), *ts = chk(&b, json_array());
        char file[64];
        snprintf(file, sizeof file, "rank-%05lld.safetensors", (long long)r);
        set(&b, o, "rank", jint(&b, r));
        for (int d = 0; d < l->mesh.n_dims; d++) set(&b, coords, l->mesh.names[d], jint(&b, l->ranks[r].coords[d]));
        set(&b, o, "coords", coords);
        set(&b, o, "file", jstr(&b, file));
        set(&b, o, "file_rank", jint(&b, l->ranks[r].file_rank));
        char sum[40], hex[17];
        snprintf(sum, sizeof sum, "xxh64:%s", hp__hex64(sums[r], hex));
        set(&b, o, "bytes", jint(&b, (int64_t)bytes[r]));
        set(&b, o, "checksum", jstr(&b, sum));
        for (size_t i = 0; i < l->n_tensors && st == HP_OK; i++) {
            hp_shard_tensor t;
            st = hp_shard_rank_tensor(l, r, i, &t, err);
            if (st == HP_OK && !t.absent) push(&b, ts, rank_tensor_json(&b, &t));
        }
        set(&b, o, "tensors", ts);
        push(&b, ranks, o);
    }
    set(&b, root, "ranks", ranks);
    char *text = st == HP_OK && b.ok ? json_dumps(root, JSON_PRESERVE_ORDER | JSON_INDENT(1)) : NULL;
    json_decref(root);
    if (st != HP_OK) return st;
    if (!text) return hp_err_set(err, HP_ERR_NOMEM, "manifest.json: out of memory, or a tensor name that is not UTF-8");
    size_t n = strlen(text);
    text[n] = '\n'; /* json_dumps' NUL becomes the final newline; the length below excludes nothing else */
    st = hp__write_text(path, text, n + 1, err);
    free(text);
    return st;
}

/* ---- reader ---- */

typedef struct rd {
    const char *label;
    hp_arena *a;
    hp_err *err;
} rd;

static hp_status bad(rd *r, const char *where, const char *what)
{
    return hp_err_set(r->err, HP_ERR_INPUT,
                      "%s: %s: %s; the folder is not a complete hyperpar shard output "
                      "(re-run 'hyperpar shard')",
                      r->label, where, what);
}

static hp_status get_int(rd *r, json_t *o, const char *key, const char *where, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v = json_object_get(o, key);
    char w[512];
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (!v || !json_is_integer(v)) return bad(r, w, v ? "expected an integer" : "missing");
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        char what[128];
        if (lo > hi)
            snprintf(what, sizeof what, "out of range (%lld; nothing fits)", (long long)x);
        else
            snprintf(what, sizeof what, "out of range (%lld, expected %lld to %lld)", (long long)x, (long long)lo,
                     (long long)hi);
        return bad(r, w, what);
    }
    *out = x;
    return HP_OK;
}

static hp_status get_str(rd *r, json_t *o, const char *key, const char *where, const char **out)
{
    json_t *v = json_object_get(o, key);
    char w[512];
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (!v || !json_is_string(v)) return bad(r, w, v ? "expected a string" : "missing");
    *out = hp_arena_strdup(r->a, json_string_value(v));
    return *out ? HP_OK : hp_err_set(r->err, HP_ERR_NOMEM, "out of memory");
}

static hp_status get_dtype(rd *r, json_t *o, const char *where, hp_dtype *out)
{
    const char *s = NULL;
    hp_status st = get_str(r, o, "dtype", where, &s);
    if (st == HP_OK && !hp_dtype_parse(s, out)) {
        char w[512], what[80];
        snprintf(w, sizeof w, "%s.dtype", where);
        snprintf(what, sizeof what, "unknown dtype \"%.40s\"", s);
        return bad(r, w, what);
    }
    return st;
}

static hp_status get_shape(rd *r, json_t *o, const char *key, const char *where, int *n, int64_t *shape)
{
    json_t *v = json_object_get(o, key);
    char w[512];
    snprintf(w, sizeof w, "%s.%s", where, key);
    if (!v || !json_is_array(v)) return bad(r, w, v ? "expected an array of integers" : "missing");
    if (json_array_size(v) > HP_MAX_DIMS) return bad(r, w, "more than 8 dims");
    *n = (int)json_array_size(v);
    int64_t total = 1;
    for (int d = 0; d < *n; d++) {
        json_t *x = json_array_get(v, (size_t)d);
        if (!json_is_integer(x) || json_integer_value(x) < 0) return bad(r, w, "expected non-negative integers");
        shape[d] = json_integer_value(x);
        if (!hp_mul_i64(total, shape[d], &total)) return bad(r, w, "element count overflows");
    }
    return HP_OK;
}

static hp_status read_rank_tensor(rd *r, json_t *o, const char *where, hp__mtensor *t)
{
    if (!json_is_object(o)) return bad(r, where, "expected an object");
    hp_status st = get_str(r, o, "name", where, &t->name);
    if (st == HP_OK) st = get_dtype(r, o, where, &t->dtype);
    if (st == HP_OK) st = get_shape(r, o, "global_shape", where, &t->n_dims, t->global_shape);
    if (st != HP_OK) return st;
    json_t *g = json_object_get(o, "global");
    char w[512];
    snprintf(w, sizeof w, "%s.global", where);
    if (json_is_string(g)) {
        t->n_globals = 1;
        t->globals = hp_arena_alloc(r->a, sizeof *t->globals);
        if (!t->globals) return hp_err_set(r->err, HP_ERR_NOMEM, "out of memory");
        t->globals[0] = hp_arena_strdup(r->a, json_string_value(g));
    } else if (json_is_array(g) && json_array_size(g) > 0) {
        t->stacked = true;
        t->n_globals = (int)json_array_size(g);
        if (t->n_dims < 1 || t->global_shape[0] != t->n_globals)
            return bad(r, w, "a stack's global_shape must start with its number of experts");
        t->globals = hp_arena_alloc(r->a, (size_t)t->n_globals * sizeof *t->globals);
        if (!t->globals) return hp_err_set(r->err, HP_ERR_NOMEM, "out of memory");
        for (int e = 0; e < t->n_globals; e++) {
            json_t *x = json_array_get(g, (size_t)e);
            if (!json_is_string(x)) return bad(r, w, "expected an array of tensor names");
            t->globals[e] = hp_arena_strdup(r->a, json_string_value(x));
        }
    } else {
        return bad(r, w, g ? "expected a name or a non-empty array of names" : "missing");
    }
    json_t *sl = json_object_get(o, "slices");
    snprintf(w, sizeof w, "%s.slices", where);
    if (!json_is_array(sl)) return bad(r, w, sl ? "expected an array" : "missing");
    if (json_array_size(sl) > HP_SHARD_MAX_SLICES) return bad(r, w, "too many slices");
    t->n_slices = (int)json_array_size(sl);
    for (int i = 0; i < t->n_slices && st == HP_OK; i++) {
        json_t *s = json_array_get(sl, (size_t)i);
        char ws[600];
        snprintf(ws, sizeof ws, "%s.slices[%d]", where, i);
        if (!json_is_object(s)) return bad(r, ws, "expected an object");
        int64_t dim = 0, off = 0, len = 0;
        st = get_int(r, s, "dim", ws, 0, t->n_dims - 1, &dim);
        if (st == HP_OK) st = get_int(r, s, "offset", ws, 0, t->global_shape[dim], &off);
        if (st == HP_OK) st = get_int(r, s, "length", ws, 1, t->global_shape[dim] - off, &len);
        if (st != HP_OK) break;
        /* In dim order, and along one dim ascending without overlap (as the writer emits them): the blocks of
         * a dim then add up to at most its size, which keeps every sum over them in range. */
        const hp_shard_slice *pv = i ? &t->slices[i - 1] : NULL;
        if (pv && (dim < pv->dim || (dim == pv->dim && off < pv->offset + pv->length)))
            return bad(r, ws, "slices must be in dim order, and ascending without overlap along one dim");
        t->slices[i] = (hp_shard_slice){(int)dim, off, len};
    }
    json_t *ex = json_object_get(o, "experts");
    if (st == HP_OK && ex) {
        snprintf(w, sizeof w, "%s.experts", where);
        json_t *f = json_array_get(ex, 0), *n = json_array_get(ex, 1);
        int64_t E = t->global_shape[0];
        if (!json_is_array(ex) || json_array_size(ex) != 2 || !json_is_integer(f) || !json_is_integer(n) ||
            t->n_dims < 1 || json_integer_value(f) < 0 || json_integer_value(n) < 1 ||
            json_integer_value(f) > E - json_integer_value(n))
            return bad(r, w, "expected [first, count] within dim 0 of global_shape");
        t->expert_first = json_integer_value(f);
        t->expert_count = json_integer_value(n);
        /* The expert range is the dim-0 block the slices give (whole when dim 0 is not cut). */
        int64_t lo = 0, len = E;
        if (t->n_slices > 0 && t->slices[0].dim == 0) {
            lo = t->slices[0].offset;
            len = t->slices[0].length;
            if (t->n_slices > 1 && t->slices[1].dim == 0) len = -1; /* two blocks: not one expert range */
        }
        if (lo != t->expert_first || len != t->expert_count)
            return bad(r, w, "the expert range disagrees with the tensor's slices on dim 0");
    }
    return st;
}

static hp_status read_rank(rd *r, json_t *o, int64_t idx, hp__mrank *rk)
{
    char where[64];
    snprintf(where, sizeof where, "ranks[%lld]", (long long)idx);
    if (!json_is_object(o)) return bad(r, where, "expected an object");
    hp_status st = get_int(r, o, "rank", where, idx, idx, &rk->rank);
    if (st == HP_OK) st = get_str(r, o, "file", where, &rk->file);
    if (st == HP_OK) st = get_int(r, o, "file_rank", where, 0, idx, &rk->file_rank);
    int64_t bytes = 0;
    if (st == HP_OK) st = get_int(r, o, "bytes", where, 0, INT64_MAX, &bytes);
    const char *sum = NULL;
    if (st == HP_OK) st = get_str(r, o, "checksum", where, &sum);
    if (st != HP_OK) return st;
    rk->bytes = (uint64_t)bytes;
    char *end = NULL;
    if (strncmp(sum, "xxh64:", 6) != 0 || strlen(sum) != 22 || strspn(sum + 6, "0123456789abcdef") != 16) {
        char w[96];
        snprintf(w, sizeof w, "%s.checksum", where);
        return bad(r, w, "expected \"xxh64:\" and 16 lower-case hex digits");
    }
    rk->checksum = strtoull(sum + 6, &end, 16);
    if (!rk->file[0] || strchr(rk->file, '/') || !strcmp(rk->file, ".") || !strcmp(rk->file, ".."))
        return bad(r, where, "file must be a plain file name inside the folder");
    json_t *ts = json_object_get(o, "tensors");
    if (!json_is_array(ts)) return bad(r, where, "tensors must be an array");
    rk->n_tensors = json_array_size(ts);
    rk->tensors = hp_arena_alloc(r->a, (rk->n_tensors ? rk->n_tensors : 1) * sizeof *rk->tensors);
    if (!rk->tensors) return hp_err_set(r->err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < rk->n_tensors && st == HP_OK; i++) {
        char w[128];
        snprintf(w, sizeof w, "%s.tensors[%zu]", where, i);
        st = read_rank_tensor(r, json_array_get(ts, i), w, &rk->tensors[i]);
    }
    return st;
}

/* mesh.dims (a --mesh spec, checked by hp_mesh_parse), mesh.ep and mesh.ep_mode into m->mesh; the world must be
 * their product. Optional (a reader of rank files needs only the world): has_mesh stays false without dims. */
static hp_status read_mesh(rd *r, json_t *mesh, hp__manifest *m)
{
    json_t *dims = json_object_get(mesh, "dims");
    if (!dims) return HP_OK;
    if (!json_is_array(dims) || json_array_size(dims) == 0 || json_array_size(dims) > HP_MESH_MAX_DIMS)
        return bad(r, "mesh.dims", "expected an array of 1 to 8 {name, size}");
    char spec[HP_MESH_MAX_DIMS * 40] = "";
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(dims); i++) {
        json_t *d = json_array_get(dims, i), *nm = json_object_get(d, "name"), *sz = json_object_get(d, "size");
        const char *name = json_string_value(nm);
        if (!name || !name[0] || strlen(name) > 15 || strpbrk(name, ",=") || !json_is_integer(sz) ||
            json_integer_value(sz) < 1 || json_integer_value(sz) > HP_MESH_MAX_SIZE) {
            char w[64];
            snprintf(w, sizeof w, "mesh.dims[%zu]", i);
            return bad(r, w, "expected {\"name\": an axis name, \"size\": a positive integer}");
        }
        n += (size_t)snprintf(spec + n, sizeof spec - n, "%s%s=%lld", i ? "," : "", name,
                              (long long)json_integer_value(sz));
    }
    hp_err e;
    if (hp_mesh_parse(spec, &m->mesh, &e) != HP_OK) return bad(r, "mesh.dims", e.msg);
    json_t *ep = json_object_get(mesh, "ep"), *mode = json_object_get(mesh, "ep_mode");
    const char *md = json_string_value(mode);
    if (!json_is_integer(ep) || json_integer_value(ep) < 1 || json_integer_value(ep) > HP_MESH_MAX_SIZE || !md)
        return bad(r, "mesh", "ep must be a positive integer and ep_mode a string");
    if (!strcmp(md, "ep-axis") != m->mesh.ep_axis)
        return bad(r, "mesh.ep_mode", "\"ep-axis\" exactly when the mesh has an ep axis");
    if (!m->mesh.ep_axis) m->mesh.ep = json_integer_value(ep);
    if (hp_mesh_world(&m->mesh) != m->world) return bad(r, "mesh.world", "not the product of mesh.dims");
    m->has_mesh = true;
    return HP_OK;
}

static hp_status read_root(rd *r, json_t *root, hp__manifest *m)
{
    if (!json_is_object(root)) return bad(r, "(top level)", "expected an object");
    json_t *fmt = json_object_get(root, "format");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "hyperpar-shards") != 0)
        return hp_err_set(r->err, HP_ERR_INPUT,
                          "%s: \"format\" is not \"hyperpar-shards\"; this is not a manifest "
                          "written by 'hyperpar shard'",
                          r->label);
    json_t *ver = json_object_get(root, "version");
    if (json_is_integer(ver) && json_integer_value(ver) == 1)
        return hp_err_set(r->err, HP_ERR_INPUT,
                          "%s: unsupported \"version\" 1: the folder was written by an older hyperpar, without the "
                          "folder identity and checksums this one checks; shard the checkpoint again (or merge with "
                          "the hyperpar that wrote it)",
                          r->label);
    if (!json_is_integer(ver) || json_integer_value(ver) != HP__MANIFEST_VERSION)
        return hp_err_set(r->err, HP_ERR_INPUT,
                          "%s: unsupported \"version\" (this hyperpar reads version %d); "
                          "re-shard with this version or merge with the hyperpar that wrote it",
                          r->label, HP__MANIFEST_VERSION);
    hp_status st = get_str(r, root, "identity", "(top level)", &m->identity);
    if (st != HP_OK) return st;
    if (strlen(m->identity) != 32 || strspn(m->identity, "0123456789abcdef") != 32)
        return bad(r, "identity", "expected 32 lower-case hex digits");
    json_t *cs = json_object_get(json_object_get(root, "source"), "config_checksum");
    if (cs) { /* optional: folders written before it was recorded have none */
        const char *sum = json_string_value(cs);
        if (!sum || strncmp(sum, "xxh64:", 6) != 0 || strlen(sum) != 22 || strspn(sum + 6, "0123456789abcdef") != 16)
            return bad(r, "source.config_checksum", "expected \"xxh64:\" and 16 lower-case hex digits");
        m->config_checksum = strtoull(sum + 6, NULL, 16);
        m->has_config_checksum = true;
    }
    json_t *mesh = json_object_get(root, "mesh");
    if (!json_is_object(mesh)) return bad(r, "mesh", "missing or not an object");
    st = get_int(r, mesh, "world", "mesh", 1, HP_SHARD_MAX_WORLD, &m->world);
    if (st != HP_OK) return st;
    st = read_mesh(r, mesh, m);
    if (st != HP_OK) return st;
    json_t *plan = json_object_get(root, "plan"), *fp = json_object_get(plan, "fingerprint");
    json_t *stored = json_object_get(plan, "stored");
    if (json_is_string(fp) && strlen(json_string_value(fp)) == 16) snprintf(m->plan_fp, sizeof m->plan_fp, "%s",
                                                                           json_string_value(fp));
    if (stored && !(json_is_string(stored) && !strcmp(json_string_value(stored), HP__SHARD_PLAN_FILE)))
        return bad(r, "plan.stored", "expected \"" HP__SHARD_PLAN_FILE "\"");
    m->plan_stored = stored != NULL;
    if (m->plan_stored && !m->plan_fp[0]) return bad(r, "plan.fingerprint", "expected 16 hex digits");

    json_t *gt = json_object_get(root, "tensors");
    if (!json_is_array(gt)) return bad(r, "tensors", "missing or not an array");
    m->n_globals = json_array_size(gt);
    m->globals = hp_arena_alloc(r->a, (m->n_globals ? m->n_globals : 1) * sizeof *m->globals);
    if (!m->globals) return hp_err_set(r->err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < m->n_globals && st == HP_OK; i++) {
        char w[64];
        snprintf(w, sizeof w, "tensors[%zu]", i);
        json_t *o = json_array_get(gt, i);
        if (!json_is_object(o)) return bad(r, w, "expected an object");
        st = get_str(r, o, "name", w, &m->globals[i].name);
        if (st == HP_OK) st = get_dtype(r, o, w, &m->globals[i].dtype);
        if (st == HP_OK) st = get_shape(r, o, "shape", w, &m->globals[i].n_dims, m->globals[i].shape);
    }
    json_t *ranks = json_object_get(root, "ranks");
    if (st != HP_OK) return st;
    if (!json_is_array(ranks)) return bad(r, "ranks", "missing or not an array");
    if ((int64_t)json_array_size(ranks) != m->world) {
        char what[128];
        snprintf(what, sizeof what, "lists %zu ranks but mesh.world is %lld", json_array_size(ranks),
                 (long long)m->world);
        return bad(r, "ranks", what);
    }
    m->n_ranks = (size_t)m->world;
    m->ranks = hp_arena_alloc(r->a, m->n_ranks * sizeof *m->ranks);
    if (!m->ranks) return hp_err_set(r->err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < m->n_ranks && st == HP_OK; i++)
        st = read_rank(r, json_array_get(ranks, i), (int64_t)i, &m->ranks[i]);
    return st;
}

hp_status hp__manifest_parse(const char *text, size_t len, const char *label, hp__manifest **out, hp_err *err)
{
    *out = NULL;
    json_t *root = NULL;
    hp_status st = hp__json_parse(text, len, label, &root, err);
    if (st != HP_OK) return st;
    hp__manifest *m = hp_calloc(1, sizeof *m);
    if (!m) {
        json_decref(root);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    hp_arena_init(&m->arena);
    rd r = {.label = label, .a = &m->arena, .err = err};
    st = read_root(&r, root, m);
    json_decref(root);
    if (st != HP_OK) {
        hp__manifest_free(m);
        return st;
    }
    *out = m;
    return HP_OK;
}

hp_status hp__manifest_read(const char *path, hp__manifest **out, hp_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    hp_status st = hp__read_file(path, HP_JSON_MAX_FILE, &text, &len, err);
    if (st != HP_OK) return st;
    st = hp__manifest_parse(text, len, path, out, err);
    free(text);
    return st;
}

void hp__manifest_free(hp__manifest *m)
{
    if (!m) return;
    hp_arena_free(&m->arena);
    free(m);
}

/* ---- one rank's file for readers ---- */

typedef struct rank_index {
    const char *name; /* a global name */
    size_t tensor;    /* index into the rank file's tensors */
    int64_t expert;   /* index in a stack, -1 for a plain tensor */
} rank_index;

typedef struct rank_file_int {
    hp__manifest *man;
    rank_index *index; /* sorted by name: tensor names first-class, then every global of every tensor */
    size_t n_index;
    hp_arena arena;
} rank_file_int;

static int index_cmp(const void *a, const void *b)
{
    const rank_index *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    /* A tensor's own name sorts before a stack member of the same name (the former wins lookups). */
    return c ? c : (x->expert > y->expert) - (x->expert < y->expert);
}

hp_status hp__manifest_tensor(const hp__mtensor *mt, hp_shard_tensor *out, hp_err *err)
{
    memset(out, 0, sizeof *out);
    out->name = mt->name;
    out->n_globals = mt->n_globals;
    out->globals = (const char *const *)mt->globals;
    out->stacked = mt->stacked;
    out->dtype = mt->dtype;
    out->n_dims = mt->n_dims;
    memcpy(out->global_shape, mt->global_shape, sizeof out->global_shape);
    out->n_slices = mt->n_slices;
    memcpy(out->slices, mt->slices, sizeof out->slices);
    out->expert_first = mt->expert_first;
    out->expert_count = mt->expert_count;
    out->ep_size = 0;
    hp__segs s;
    hp_status st = hp__segs_from_tensor(out, &s, err);
    if (st != HP_OK) return st;
    int64_t n = 1;
    for (int d = 0; d < out->n_dims; d++) {
        int64_t len = 0;
        for (int q = 0; q < s.n[d]; q++) len += s.len[d][q];
        out->local_shape[d] = len;
        if (!hp_mul_i64(n, len, &n)) return hp_err_set(err, HP_ERR_INPUT, "tensor '%s': size overflows", mt->name);
    }
    int64_t bytes = 0;
    if (!hp_dtype_nbytes(out->dtype, n, &bytes))
        return hp_err_set(err, HP_ERR_INPUT,
                          "tensor '%s': %lld %s elements overflow or are not a whole number of bytes", mt->name,
                          (long long)n, hp_dtype_name(out->dtype));
    out->nbytes = (uint64_t)bytes;
    return HP_OK;
}

static hp_status rank_file_index(hp_shard_rank_file *f, rank_file_int *in, hp_err *err)
{
    size_t n = 0;
    for (size_t i = 0; i < f->n_tensors; i++)
        if (!hp_add_size(n, 1 + (f->tensors[i].stacked ? (size_t)f->tensors[i].n_globals : 0), &n))
            return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    in->index = hp_arena_alloc(&in->arena, (n ? n : 1) * sizeof *in->index);
    if (!in->index) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < f->n_tensors; i++) {
        const hp_shard_tensor *t = &f->tensors[i];
        in->index[in->n_index++] = (rank_index){t->name, i, -1};
        for (int e = 0; t->stacked && e < t->n_globals; e++)
            in->index[in->n_index++] = (rank_index){t->globals[e], i, e};
    }
    qsort(in->index, in->n_index, sizeof *in->index, index_cmp);
    return HP_OK;
}

/* file_rank, mesh and coords of a checked rank file: hyperpar_coords holds one entry per rank of hyperpar_rank
 * (';' between them, ranks listed with ','), this rank's is taken. */
static hp_status rank_file_coords(hp_shard_rank_file *f, rank_file_int *in, hp_err *err)
{
    f->file_rank = in->man->ranks[f->rank].file_rank;
    const char *mesh = hp_st_metadata_get(f->file, "hyperpar_mesh"), *ranks = hp_st_metadata_get(f->file, "hyperpar_rank");
    const char *coords = hp_st_metadata_get(f->file, "hyperpar_coords");
    f->mesh = mesh ? mesh : "?";
    f->coords = "?";
    if (!ranks || !coords) return HP_OK;
    size_t k = 0; /* this rank's position in hyperpar_rank (checked by hp__rank_file_check to be listed) */
    for (const char *p = ranks; *p; k++) {
        if (strtoll(p, NULL, 10) == f->rank) break;
        p = strchr(p, ',');
        if (!p) return HP_OK;
        p++;
    }
    const char *c = coords;
    for (size_t i = 0; i < k && c; i++)
        if ((c = strchr(c, ';'))) c++;
    if (!c) return HP_OK;
    size_t len = strcspn(c, ";");
    char *dup = hp_arena_alloc(&in->arena, len + 1);
    if (!dup) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    memcpy(dup, c, len);
    dup[len] = '\0';
    f->coords = dup;
    return HP_OK;
}

hp_status hp_shard_check_config(const char *dir, hp_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    struct stat sb; /* lstat: a FIFO or a dangling link is named for what it is by the read */
    if (lstat(path, &sb) != 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s: manifest.json is missing; this is not a complete 'hyperpar shard' "
                          "output", dir);
    hp__manifest *man = NULL;
    hp_status st = hp__manifest_read(path, &man, err);
    if (st != HP_OK) return st;
    snprintf(path, sizeof path, "%s/config.json", dir);
    uint64_t sum = 0, size = 0;
    if (man->has_config_checksum && (st = hp__file_checksum(path, &sum, &size, err)) == HP_OK &&
        sum != man->config_checksum) {
        char want[17], got[17];
        st = hp_err_set(err, HP_ERR_INPUT,
                        "%s was changed after sharding (it no longer matches the config.json the folder was written "
                        "with: manifest.json records xxh64 %s, the file is now %s); the rank files hold the weights "
                        "of the original configuration. Put back the source checkpoint's config.json, or shard the "
                        "checkpoint again with the edited one",
                        path, hp__hex64(man->config_checksum, want), hp__hex64(sum, got));
    }
    hp__manifest_free(man);
    return st;
}

hp_status hp_shard_rank_open(hp_shard_rank_file **out, const char *dir, int64_t rank, hp_err *err)
{
    *out = NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s: manifest.json is missing; this is not a complete 'hyperpar shard' "
                          "output", dir);
    hp_shard_rank_file *f = hp_calloc(1, sizeof *f);
    rank_file_int *in = hp_calloc(1, sizeof *in);
    if (!f || !in) {
        free(f);
        free(in);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    hp_arena_init(&in->arena);
    f->internal = in;
    hp_status st = hp__manifest_read(path, &in->man, err);
    if (st == HP_OK && (rank < 0 || rank >= in->man->world))
        st = hp_err_set(err, HP_ERR_INPUT,
                        "%s: rank %lld has no file: the folder was sharded for a world of %lld ranks; run with the "
                        "mesh it was sharded for, or shard again for this one",
                        dir, (long long)rank, (long long)in->man->world);
    const hp__mrank *rk = st == HP_OK ? &in->man->ranks[rank] : NULL;
    if (st == HP_OK) {
        f->rank = rank;
        f->world = in->man->world;
        f->dir = hp_arena_strdup(&in->arena, dir);
        snprintf(path, sizeof path, "%s/%s", dir, rk->file);
        f->path = hp_arena_strdup(&in->arena, path);
        f->n_tensors = rk->n_tensors;
        f->tensors = hp_arena_alloc(&in->arena, (f->n_tensors ? f->n_tensors : 1) * sizeof *f->tensors);
        if (!f->dir || !f->path || !f->tensors) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; st == HP_OK && i < f->n_tensors; i++) {
        st = hp__manifest_tensor(&rk->tensors[i], &f->tensors[i], err);
        if (st != HP_OK) hp_err_prefix(err, "%s/manifest.json: rank %lld", dir, (long long)rank);
    }
    if (st == HP_OK && stat(f->path, &sb) != 0) st = hp__rank_file_missing(dir, rank, f->path, err);
    if (st == HP_OK) {
        st = hp_st_open(&f->file, f->path, err);
        if (st != HP_OK) hp_err_prefix(err, "rank %lld", (long long)rank);
    }
    if (st == HP_OK)
        st = hp__rank_file_check(in->man, hp__globals_digest_manifest(in->man), rank, f->file, f->path, err);
    if (st == HP_OK) st = rank_file_index(f, in, err);
    if (st == HP_OK) st = rank_file_coords(f, in, err);
    if (st != HP_OK) {
        hp_shard_rank_close(f);
        return st;
    }
    *out = f;
    return HP_OK;
}

void hp_shard_rank_close(hp_shard_rank_file *f)
{
    if (!f) return;
    rank_file_int *in = f->internal;
    hp_st_close(f->file);
    if (in) {
        hp__manifest_free(in->man);
        hp_arena_free(&in->arena);
        free(in);
    }
    free(f);
}

const hp_shard_tensor *hp_shard_rank_find(const hp_shard_rank_file *f, const char *name, int64_t *expert)
{
    const rank_file_int *in = f->internal;
    size_t lo = 0, hi = in->n_index;
    while (lo < hi) { /* the first entry of that name: a tensor's own name sorts before stack members */
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(in->index[mid].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == in->n_index || strcmp(in->index[lo].name, name) != 0) {
        if (expert) *expert = -1;
        return NULL;
    }
    if (expert) *expert = in->index[lo].expert;
    return &f->tensors[in->index[lo].tensor];
}

bool hp_shard_is_folder(const char *path)
{
    char man[4200];
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return false;
    snprintf(man, sizeof man, "%s/manifest.json", path);
    return lstat(man, &sb) == 0 && !S_ISDIR(sb.st_mode);
}
