/*
 * gen.c — deterministic tiny checkpoints for tests and the demo.
 *
 * value(seed, key, i) = uniform in [-1, 1) from splitmix64(hash(seed, key) + i), where key names the
 * logical weight: "L<layer>.E<expert>.<gate|up|down>" for expert matrices, the tensor name otherwise.
 * Scales: linear weights 1/sqrt(fan_in) (fan_in = the input width), norms 1 + 0.1·u, biases 0.1·u.
 */
#include "hyperpar/gen.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <dirent.h>

#include "core/guard.h"
#include "io/json.h"
#include "model/family.h"

void hp_gen_opts_default(hp_gen_opts *o)
{
    memset(o, 0, sizeof *o);
    o->family = "qwen3_moe";
    o->layers = 2;
    o->hidden = 64;
    o->heads = 4;
    o->kv_heads = 2;
    o->head_dim = 16;
    o->intermediate = 128;
    o->moe_intermediate = 32;
    o->experts = 8;
    o->top_k = 2;
    o->vocab = 128;
    o->dtype = HP_DT_F32;
    o->layout = HP_LAYOUT_PER_EXPERT;
}

static const char *torch_dtype_name(hp_dtype dt)
{
    switch (dt) {
    case HP_DT_BF16: return "bfloat16";
    case HP_DT_F16: return "float16";
    default: return "float32";
    }
}

hp_status hp_gen_config_text(const hp_gen_opts *o, char **out, hp_err *err)
{
    *out = NULL;
    const hp_family *f = hp_family_find(o->family);
    char fams[HP_FAMILY_LIST_MAX];
    if (!f)
        return hp_err_set(err, HP_ERR_INPUT, "unknown family \"%s\"; known families: %s", o->family,
                          hp_family_known_list(fams, sizeof fams));
    if (o->dtype != HP_DT_F32 && o->dtype != HP_DT_BF16 && o->dtype != HP_DT_F16)
        return hp_err_set(err, HP_ERR_INPUT, "gen writes f32, bf16 or f16 weights, not %s", hp_dtype_name(o->dtype));
    const int64_t dims[] = {o->layers, o->hidden, o->heads, o->kv_heads, o->head_dim, o->intermediate, o->vocab};
    const char *names[] = {"--layers", "--hidden", "--heads", "--kv-heads", "--head-dim", "--intermediate", "--vocab"};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
        if (dims[i] <= 0 || dims[i] > HP_GEN_MAX_DIM)
            return hp_err_set(err, HP_ERR_INPUT, "%s %lld is out of range (1..%d for a generated model)", names[i],
                              (long long)dims[i], HP_GEN_MAX_DIM);
    if (o->heads % o->kv_heads != 0)
        return hp_err_set(err, HP_ERR_INPUT, "--heads %lld must be a multiple of --kv-heads %lld",
                          (long long)o->heads, (long long)o->kv_heads);
    if (f->moe && (o->experts < 1 || o->experts > HP_GEN_MAX_EXPERTS || o->top_k < 1 || o->top_k > o->experts))
        return hp_err_set(err, HP_ERR_INPUT, "--experts %lld and --top-k %lld: need 1 <= top-k <= experts <= %d",
                          (long long)o->experts, (long long)o->top_k, HP_GEN_MAX_EXPERTS);
    if (f->moe && (o->moe_intermediate <= 0 || o->moe_intermediate > HP_GEN_MAX_DIM))
        return hp_err_set(err, HP_ERR_INPUT, "--moe-intermediate %lld is out of range (1..%d)",
                          (long long)o->moe_intermediate, HP_GEN_MAX_DIM);

    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", f->architecture));
    json_object_set_new(c, "model_type", json_string(f->model_type));
    json_object_set_new(c, "hidden_size", json_integer(o->hidden));
    json_object_set_new(c, "intermediate_size", json_integer(o->intermediate));
    json_object_set_new(c, "num_hidden_layers", json_integer(o->layers));
    json_object_set_new(c, "num_attention_heads", json_integer(o->heads));
    /* MLA (DeepSeek-V3) expands k and v to every head: transformers needs num_key_value_heads == heads. */
    json_object_set_new(c, "num_key_value_heads", json_integer(f->attn == HP_ATTN_MLA ? o->heads : o->kv_heads));
    json_object_set_new(c, "head_dim", json_integer(o->head_dim));
    json_object_set_new(c, "vocab_size", json_integer(o->vocab));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(c, "rope_theta", json_real(10000.0));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "max_position_embeddings", json_integer(4096));
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "torch_dtype", json_string(torch_dtype_name(o->dtype)));
    if (f->moe) {
        json_object_set_new(c, f->experts_key, json_integer(o->experts));
        json_object_set_new(c, "num_experts_per_tok", json_integer(o->top_k));
        if (!f->moe_inter_is_intermediate)
            json_object_set_new(c, "moe_intermediate_size", json_integer(o->moe_intermediate));
        if (f->shared == HP_SHARED_GATED)
            json_object_set_new(c, "shared_expert_intermediate_size", json_integer(2 * o->moe_intermediate));
        if (f->correction_bias) {
            /* Grouped routing needs groups of at least two experts: the largest of 4, 2, 1 that allows it. */
            int64_t g = 4;
            while (g > 1 && (o->experts % g != 0 || o->experts / g < 2)) g /= 2;
            json_object_set_new(c, "n_group", json_integer(g));
            json_object_set_new(c, "topk_group", json_integer(g > 1 ? g / 2 : 1));
        }
        if (f->experts == HP_EXPERTS_GPTOSS) json_object_set_new(c, "experts_per_token", json_integer(o->top_k));
    }
    json_error_t je;
    json_t *extra = json_loads(f->gen_extra, 0, &je);
    HP_ASSERT(extra != NULL);
    json_object_update(c, extra);
    json_decref(extra);
    /* MLA has no head_dim of its own: DeepSeek-V3's config.json carries none and transformers derives it from
     * qk_rope_head_dim (5.x keeps a written one, and its rotary tables then fail to match q's rope part). */
    if (f->attn == HP_ATTN_MLA) json_object_del(c, "head_dim");
    /* The family's rotary share written out (GLM4-MoE 0.5), so the config says what the runtime will use. */
    if (f->partial_rotary > 0 && f->partial_rotary < 1)
        json_object_set_new(c, "partial_rotary_factor", json_real(f->partial_rotary));
    *out = json_dumps(c, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(c);
    if (!*out) return hp_err_set(err, HP_ERR_NOMEM, "out of memory writing config.json");
    return HP_OK;
}

/* ---- values ---- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* FNV-1a from a seed-dependent basis: generated checkpoints (and the goldens computed from them) store the
 * values this key gives, so it stays bit-exact. (1469598103934665603 is FNV's basis with a digit short; kept.) */
static uint64_t key_hash(uint64_t seed, const char *key)
{
    return hp_fnv1a64(1469598103934665603ull ^ splitmix64(seed), key, strlen(key));
}

static float uniform(uint64_t key, uint64_t i)
{
    return (float)((double)(splitmix64(key + i * 0xD1B54A32D192ED03ull) >> 40) / (double)(1 << 24) * 2.0 - 1.0);
}

typedef struct gen_tensor {
    char *name;
    char *key;      /* the value key: the name with the hub MoE block renamed to "mlp", so both layouts agree */
    hp_dtype dt;
    int n_dims;
    int64_t shape[3];
    hp_synth_tag tag;
} gen_tensor;

typedef struct gen_list {
    gen_tensor *v;
    size_t n, cap;
    const char *block; /* the family's hub MoE block name ("block_sparse_moe"), or NULL */
} gen_list;

typedef struct gen_fill {
    const gen_tensor *t;
    uint64_t seed;
    int64_t done; /* elements already produced: the writer may fill a large tensor in several calls */
} gen_fill;

static hp_status record(void *ctx, const char *name, hp_dtype dt, int n_dims, const int64_t *shape,
                        const hp_synth_tag *tag, hp_err *err)
{
    gen_list *l = ctx;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        gen_tensor *p = realloc(l->v, cap * sizeof *p);
        if (!p) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        l->v = p;
        l->cap = cap;
    }
    gen_tensor *t = &l->v[l->n];
    t->name = hp_strdup(name);
    t->key = hp_strdup(name);
    if (!t->name || !t->key) {
        free(t->name);
        free(t->key);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    /* ".block_sparse_moe." -> ".mlp." (the key only: the tensor keeps its hub name) */
    char pat[64];
    snprintf(pat, sizeof pat, ".%s.", l->block ? l->block : "mlp");
    char *hit = strcmp(pat, ".mlp.") ? strstr(t->key, pat) : NULL;
    if (hit) {
        memcpy(hit, ".mlp.", 5);
        memmove(hit + 5, hit + strlen(pat), strlen(hit + strlen(pat)) + 1);
    }
    t->dt = dt;
    t->n_dims = n_dims;
    memcpy(t->shape, shape, (size_t)n_dims * sizeof *shape);
    t->tag = *tag;
    l->n++;
    return HP_OK;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* One expert matrix element: kind, layer, expert, flat index within the per-expert matrix, fan-in. */
static float expert_value(uint64_t seed, int64_t layer, int64_t expert, const char *kind, int64_t idx, int64_t fan_in)
{
    char key[96];
    snprintf(key, sizeof key, "L%lld.E%lld.%s", (long long)layer, (long long)expert, kind);
    return uniform(key_hash(seed, key), (uint64_t)idx) / sqrtf((float)fan_in);
}

/* Fills n f32 values of tensor t starting at flat element `start`. */
static void tensor_values(const gen_tensor *t, uint64_t seed, int64_t start, int64_t n, float *out)
{
    const hp_synth_tag *g = &t->tag;
    if (g->kind == HP_TAG_NONE) {
        uint64_t k = key_hash(seed, t->key);
        bool norm = ends_with(t->name, "norm.weight");
        bool vec = t->n_dims == 1 || ends_with(t->name, "_bias");
        float scale = t->n_dims >= 2 ? 1.0f / sqrtf((float)t->shape[t->n_dims - 1]) : 0.1f;
        for (int64_t i = 0; i < n; i++) {
            float u = uniform(k, (uint64_t)(start + i));
            out[i] = norm ? 1.0f + 0.1f * u : (vec ? 0.1f * u : scale * u);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t flat = start + i;
        if (g->expert >= 0) { /* per-expert [out, in] */
            const char *kind = g->kind == HP_TAG_GATE ? "gate" : g->kind == HP_TAG_UP ? "up" : "down";
            out[i] = expert_value(seed, g->layer, g->expert, kind, flat, t->shape[1]);
            continue;
        }
        const int64_t d1 = t->shape[1], d2 = t->shape[2], per = d1 * d2;
        const int64_t e = flat / per, r = (flat % per) / d2, c = flat % d2;
        if (g->kind == HP_TAG_GATE_UP && g->interleaved) {
            /* gpt-oss [E, H, 2I], used as x @ W: column 2j is gate j, 2j+1 is up j; fan-in H. */
            out[i] = expert_value(seed, g->layer, e, c % 2 == 0 ? "gate" : "up", (c / 2) * d1 + r, d1);
        } else if (g->kind == HP_TAG_GATE_UP) {
            /* [E, 2I, H]: rows < I are expert e's gate matrix, rows >= I its up matrix. */
            const int64_t I = d1 / 2;
            out[i] = r < I ? expert_value(seed, g->layer, e, "gate", r * d2 + c, d2)
                           : expert_value(seed, g->layer, e, "up", (r - I) * d2 + c, d2);
        } else if (g->interleaved) {
            /* gpt-oss down [E, I, H], used as h @ W: the per-expert [H, I] matrix transposed; fan-in I. */
            out[i] = expert_value(seed, g->layer, e, "down", c * d1 + r, d1);
        } else {
            /* down [E, H, I]: expert e's [H, I] matrix; fan-in I. */
            out[i] = expert_value(seed, g->layer, e, "down", r * d2 + c, d2);
        }
    }
}

static hp_status fill(void *ctx, void *dst, size_t nbytes, hp_err *err)
{
    gen_fill *gf = ctx;
    const gen_tensor *t = gf->t;
    int bytes = hp_dtype_bits(t->dt) / 8;
    int64_t n = (int64_t)(nbytes / (size_t)bytes);
    float buf[4096];
    unsigned char *out = dst;
    for (int64_t off = 0; off < n; off += 4096) {
        int64_t m = n - off < 4096 ? n - off : 4096;
        tensor_values(t, gf->seed, gf->done + off, m, buf);
        hp_status st = hp_dtype_from_f32(t->dt, buf, out + off * bytes, m, err);
        if (st != HP_OK) return st;
    }
    gf->done += n;
    return HP_OK;
}

hp_expert_layout hp_gen_layout(const hp_gen_opts *o)
{
    const hp_family *f = hp_family_find(o->family);
    return f && !f->has_per_expert_layout ? HP_LAYOUT_BATCHED : o->layout;
}

/* "", ".", "..", "/" or a path whose last component is "." or "..": not a folder gen may fill. */
static bool names_no_folder(const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--; /* "a/b/" is "a/b" */
    if (n == 0 || (n == 1 && dir[0] == '/')) return true;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    const char *last = dir + b;
    size_t ln = n - b;
    return (ln == 1 && last[0] == '.') || (ln == 2 && last[0] == '.' && last[1] == '.');
}

/* The metadata key gen writes into model.safetensors: what --force looks for before it replaces anything. */
#define GEN_MARKER "hyperpar_gen"

/* ---- temporaries of killed runs ---- */

/* The PID of "<stem>.tmp.<pid>" when name is one for stem, else 0. */
static long temp_pid(const char *name, const char *stem)
{
    size_t n = strlen(stem);
    if (strncmp(name, stem, n) != 0 || strncmp(name + n, ".tmp.", 5) != 0) return 0;
    const char *d = name + n + 5;
    if (!*d || strlen(d) > 9 || strspn(d, "0123456789") != strlen(d)) return 0;
    return strtol(d, NULL, 10);
}

/* A process that no longer runs (kill reports ESRCH; EPERM means it runs under another user). */
static bool pid_dead(long pid)
{
    return pid > 0 && pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Whether the file's JSON object (a safetensors header at byte 8 when st, else the whole file) was written by
 * gen: a model's header carries GEN_MARKER in __metadata__, a config.json has "architectures" and
 * "model_type". An empty file counts too: a writer killed before its first byte left it, and it holds nothing. */
static bool gen_wrote(const char *path, bool st)
{
    int fd = -1;
    hp_err e;
    if (hp_open_regular(path, &fd, &e) != HP_OK) return false;
    struct stat sb;
    bool ok = false;
    unsigned char len8[8];
    uint64_t n = 0, at = 0;
    if (fstat(fd, &sb) != 0) goto out;
    if (sb.st_size == 0) {
        ok = true;
        goto out;
    }
    if (st) {
        if (pread(fd, len8, 8, 0) != 8) goto out;
        for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
        at = 8;
    } else {
        n = (uint64_t)sb.st_size;
    }
    if (n == 0 || n > ((uint64_t)1 << 27) || n > (uint64_t)sb.st_size - at) goto out; /* not one of ours */
    char *text = malloc((size_t)n);
    if (text && pread(fd, text, (size_t)n, (off_t)at) == (ssize_t)n) {
        json_t *root = json_loadb(text, (size_t)n, 0, NULL);
        json_t *meta = st ? json_object_get(root, "__metadata__") : NULL;
        ok = st ? json_is_string(json_object_get(meta, GEN_MARKER))
                : json_object_get(root, "architectures") && json_object_get(root, "model_type");
        json_decref(root);
    }
    free(text);
out:
    close(fd);
    return ok;
}

/* Removes dir's "model.safetensors.tmp.<pid>" and "config.json.tmp.<pid>" left by gen runs that were killed
 * (kill -9, a crash): the PID no longer runs and the file is gen's (gen_wrote). Anything else stays. */
static void remove_stale(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pm = temp_pid(e->d_name, "model.safetensors"), pc = temp_pid(e->d_name, "config.json");
        long pid = pm ? pm : pc;
        if (!pid_dead(pid)) continue;
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || !gen_wrote(path, pm != 0)) continue;
        if (unlink(path) == 0)
            hp_log(HP_LOG_WARN, "removed %s, left by 'hyperpar gen' process %ld, which no longer runs", path, pid);
    }
    closedir(d);
}

/* Whether the folder's entry `name` may be replaced by --force: config.json, or a model.safetensors that gen
 * wrote (it carries GEN_MARKER). */
static bool ours(const char *dir, const char *name)
{
    if (!strcmp(name, "config.json")) return true;
    if (strcmp(name, "model.safetensors") != 0) return false;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) return false;
    hp_st_file *f = NULL;
    hp_err e;
    if (hp_st_open(&f, path, &e) != HP_OK) return false;
    bool marked = hp_st_metadata_get(f, GEN_MARKER) != NULL;
    hp_st_close(f);
    return marked;
}

/* --out: created when absent (*made = true); an existing folder must be empty, or with --force hold only what
 * an earlier `hyperpar gen` wrote there (config.json and a marked model.safetensors): gen never overwrites a
 * file it did not write. */
static hp_status prepare_dir(const char *dir, bool force, bool *made, hp_err *err)
{
    *made = false;
    if (names_no_folder(dir))
        return hp_err_set(err, HP_ERR_INPUT,
                          "--out '%s' does not name a folder of its own (an empty path, '.', '..' or '/'); give the "
                          "name of the folder to create, e.g. --out ./tiny-model",
                          dir);
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (mkdir(dir, 0755) != 0)
            return hp_err_set(err, errno == ENOENT || errno == ENOTDIR ? HP_ERR_INPUT : HP_ERR_IO,
                              "%s: cannot create the folder: %s", dir, strerror(errno));
        *made = true;
        return HP_OK;
    }
    if (!S_ISDIR(st.st_mode)) return hp_err_set(err, HP_ERR_INPUT, "%s exists and is not a folder", dir);
    remove_stale(dir);
    DIR *d = opendir(dir);
    if (!d) return hp_err_set(err, HP_ERR_IO, "%s: cannot read the folder: %s", dir, strerror(errno));
    bool empty = true;
    char foreign[256] = "";
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        empty = false;
        if (!foreign[0] && !ours(dir, e->d_name)) snprintf(foreign, sizeof foreign, "%s", e->d_name);
    }
    closedir(d);
    if (empty) return HP_OK;
    if (!force)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s is not empty; choose another --out, or pass --force to replace an earlier 'hyperpar "
                          "gen' output there", dir);
    if (foreign[0])
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s holds '%s', which 'hyperpar gen' did not write; --force replaces only an earlier gen "
                          "output (config.json and a model.safetensors marked %s), never other files. Choose "
                          "another --out", dir, foreign, GEN_MARKER);
    return HP_OK;
}

static hp_status write_text_atomic(const char *path, const char *text, hp_err *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return hp_err_set(err, HP_ERR_IO, "%s: cannot create: %s", path, strerror(errno)); /* not tmp's name */
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return hp_err_set(err, HP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    return HP_OK;
}

/* Refuses, before anything is built, options whose tensor count no safetensors header holds: every size is
 * in range, but products of them (--layers x --experts per-expert tensors) are not checked by the ranges. */
static hp_status check_count(const hp_gen_opts *o, hp_err *err)
{
    const hp_family *f = hp_family_find(o->family);
    int64_t per_layer = 1, n;
    if (f && f->moe && hp_gen_layout(o) == HP_LAYOUT_PER_EXPERT) per_layer = 3 * o->experts;
    if (!hp_mul_i64(o->layers, per_layer, &n) || n > HP_GEN_MAX_TENSORS)
        return hp_err_set(err, HP_ERR_INPUT,
                          "--layers %lld with %lld tensors per layer would write more than %d tensors, more than "
                          "a safetensors header holds; give fewer --layers or --experts, or --expert-layout batched",
                          (long long)o->layers, (long long)per_layer, HP_GEN_MAX_TENSORS);
    return HP_OK;
}

/* The data bytes of the tensors listed, overflow-checked (HP_ERR_INPUT past 2^63). */
static hp_status data_bytes(const gen_list *l, int64_t *out, hp_err *err)
{
    int64_t total = 0;
    for (size_t i = 0; i < l->n; i++) {
        int64_t n = 1, b;
        for (int d = 0; d < l->v[i].n_dims; d++)
            if (!hp_mul_i64(n, l->v[i].shape[d], &n)) n = -1;
        if (n < 0 || !hp_dtype_nbytes(l->v[i].dt, n, &b) || !hp_add_i64(total, b, &total))
            return hp_err_set(err, HP_ERR_INPUT, "the options ask for a model of more than 2^63 bytes (tensor '%s' "
                              "and those before it); choose smaller sizes", l->v[i].name);
    }
    *out = total;
    return HP_OK;
}

/* The model must fit in the free space of dir's filesystem: refused before writing (a usage error, the sizes
 * asked for are the cause), instead of filling the disk and failing at the end. */
static hp_status check_room(const char *dir, int64_t bytes, hp_err *err)
{
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0) return HP_OK; /* unknown: the write itself reports a full disk */
    uint64_t room = 0;
    if (sv.f_frsize && sv.f_bavail > UINT64_MAX / sv.f_frsize) return HP_OK;
    room = (uint64_t)sv.f_bavail * sv.f_frsize;
    if ((uint64_t)bytes <= room) return HP_OK;
    char need[32], have[32];
    return hp_err_set(err, HP_ERR_INPUT,
                      "%s: the model would be %s (%lld bytes) but the filesystem has %s free; choose smaller sizes "
                      "(--layers, --hidden, --intermediate, --vocab, --experts) or another --out",
                      dir, hp_format_bytes((uint64_t)bytes, need, sizeof need), (long long)bytes,
                      hp_format_bytes(room, have, sizeof have));
}

hp_status hp_gen_checkpoint(const hp_gen_opts *o, const char *out_dir, hp_err *err)
{
    char *text = NULL;
    hp_status st = hp_gen_config_text(o, &text, err);
    if (st == HP_OK) st = check_count(o, err);
    if (st != HP_OK) {
        free(text);
        return st;
    }

    hp_model *m = NULL;
    hp_model_opts mo = {.layout = o->layout};
    st = hp_model_from_config_text(&m, text, strlen(text), "generated config.json", &mo, err);
    gen_list l = {0};
    gen_fill *fills = NULL;
    hp_st_writer *w = NULL;
    if (st == HP_OK) {
        l.block = m->family->per_expert_block;
        st = hp__synth_params(m->family, &m->cfg, m->layout, record, &l, err);
    }
    bool made = false, wrote_model = false;
    int64_t bytes = 0;
    if (st == HP_OK) st = data_bytes(&l, &bytes, err);
    if (st == HP_OK) st = prepare_dir(out_dir, o->force, &made, err);
    if (st == HP_OK) st = check_room(out_dir, bytes, err);
    if (st == HP_OK) {
        w = hp_st_writer_create();
        fills = calloc(l.n ? l.n : 1, sizeof *fills);
        if (!w || !fills) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, "format", "pt", err);
    if (st == HP_OK) st = hp_st_writer_set_metadata(w, GEN_MARKER, "1", err);
    for (size_t i = 0; i < l.n && st == HP_OK; i++) {
        fills[i].t = &l.v[i];
        fills[i].seed = o->seed;
        st = hp_st_writer_add_fill(w, l.v[i].name, l.v[i].dt, l.v[i].n_dims, l.v[i].shape, fill, &fills[i], err);
    }
    char path[4096];
    if (st == HP_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
        st = hp_st_writer_write(w, path, err);
        wrote_model = st == HP_OK;
    }
    if (st == HP_OK && hp_interrupted()) st = hp__interrupt_error(err); /* between the two files */
    if (st == HP_OK) {
        snprintf(path, sizeof path, "%s/config.json", out_dir);
        st = write_text_atomic(path, text, err);
    }
    if (st != HP_OK && made) { /* nothing half-made stays behind: what this run created goes */
        if (wrote_model) {
            snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
            unlink(path);
        }
        rmdir(out_dir);
    }
    hp_st_writer_destroy(w);
    free(fills);
    for (size_t i = 0; i < l.n; i++) {
        free(l.v[i].name);
        free(l.v[i].key);
    }
    free(l.v);
    hp_model_close(m);
    free(text);
    return st;
}
