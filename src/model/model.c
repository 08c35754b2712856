/*
 * model.c — opening a model (real checkpoint or meta mode), ordering its parameters, building its tree.
 *
 * Ordering and the tree come from one structure, a trie over dotted names:
 *
 *   ""  ─ model ─ embed_tokens ─ weight          every node is a name prefix; a parameter is a node
 *            │                                    with param >= 0; a module is a node with children.
 *            ├─ layers ─ 0 ─ self_attn ─ q_proj ─ weight
 *            │          └ 1 ...                   siblings are sorted by registration rank
 *            └─ norm ─ weight                     (families.c), then numeric-aware natural order.
 *   └ lm_head ─ weight
 *
 * A depth-first walk of the sorted trie gives the parameter order and the module list, so the order is a
 * function of the set of names alone: the same checkpoint in any file order yields the same table.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/json.h"
#include "model/family.h"
#include "model/model_int.h"

/* Meta mode refuses configs that would synthesise far more tensors than any published model has
 * (DeepSeek-V3 per-expert has 45k): 4M rows already take about 1 GB for the table. Fuzz targets lower it. */
size_t hp__meta_max_tensors = 4u << 20;

const char *hp_expert_layout_name(hp_expert_layout l) { return l == HP_LAYOUT_BATCHED ? "batched" : "per-expert"; }

bool hp_expert_layout_parse(const char *s, hp_expert_layout *out)
{
    if (strcmp(s, "per-expert") == 0 || strcmp(s, "per_expert") == 0) *out = HP_LAYOUT_PER_EXPERT;
    else if (strcmp(s, "batched") == 0) *out = HP_LAYOUT_BATCHED;
    else return false;
    return true;
}

/* ---- raw parameter collection (unordered) ---- */

typedef struct raw_list {
    hp_param *v;
    size_t n, cap;
    hp_arena *arena;
} raw_list;

static hp_status raw_push(raw_list *l, const char *name, hp_dtype dt, int n_dims, const int64_t *shape,
                          hp_err *err)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        hp_param *p = realloc(l->v, cap * sizeof *p);
        if (!p) return hp_err_set(err, HP_ERR_NOMEM, "out of memory building the parameter table");
        l->v = p;
        l->cap = cap;
    }
    hp_param *p = &l->v[l->n];
    memset(p, 0, sizeof *p);
    p->name = hp_arena_strdup(l->arena, name);
    if (!p->name) return hp_err_set(err, HP_ERR_NOMEM, "out of memory building the parameter table");
    p->dtype = dt;
    p->n_dims = n_dims;
    p->n_elems = 1;
    for (int d = 0; d < n_dims; d++) {
        p->shape[d] = shape[d];
        if (!hp_mul_i64(p->n_elems, shape[d], &p->n_elems))
            return hp_err_set(err, HP_ERR_INPUT, "parameter '%s': element count overflows 64 bits", name);
    }
    int64_t nb;
    if (!hp_dtype_nbytes(dt, p->n_elems, &nb))
        return hp_err_set(err, HP_ERR_INPUT, "parameter '%s': byte size overflows 64 bits", name);
    p->nbytes = (uint64_t)nb;
    p->file_index = -1;
    p->trainable = true;
    l->n++;
    return HP_OK;
}

static hp_status synth_emit(void *ctx, const char *name, hp_dtype dt, int n_dims, const int64_t *shape,
                            const hp_synth_tag *tag, hp_err *err)
{
    (void)tag;
    raw_list *l = ctx;
    if (l->n >= hp__meta_max_tensors)
        return hp_err_set(err, HP_ERR_INPUT,
                          "the configuration would synthesise more than %zu tensors; check num_hidden_layers and "
                          "the expert count",
                          hp__meta_max_tensors);
    return raw_push(l, name, dt, n_dims, shape, err);
}

/* ---- trie ---- */

typedef struct node {
    const char *fqn; /* arena; for param nodes the param's own name */
    size_t fqn_len;
    const char *seg;
    size_t seg_len;
    int parent, first_child, next_sibling, n_children;
    int param;  /* index into the raw list, -1 when none */
    int module; /* index into modules after the walk, -1 when not a module */
    int rank;
} node;

typedef struct trie {
    node *nodes;
    size_t n, cap;
    int *slots; /* open addressing over fqn; -1 empty */
    size_t n_slots;
} trie;

static int trie_get_or_add(trie *t, const char *fqn, size_t len, int parent, bool *added)
{
    uint64_t h = hp_hash64_bytes(fqn, len, 0);
    size_t mask = t->n_slots - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        int k = t->slots[i];
        if (k < 0) {
            HP_ASSERT(t->n < t->cap);
            node *nd = &t->nodes[t->n];
            memset(nd, 0, sizeof *nd);
            nd->fqn = fqn;
            nd->fqn_len = len;
            size_t s = len;
            while (s > 0 && fqn[s - 1] != '.') s--;
            nd->seg = fqn + s;
            nd->seg_len = len - s;
            nd->parent = parent;
            nd->first_child = nd->next_sibling = -1;
            nd->param = nd->module = -1;
            nd->rank = hp__segment_rank(nd->seg, nd->seg_len);
            t->slots[i] = (int)t->n;
            *added = true;
            return (int)t->n++;
        }
        if (t->nodes[k].fqn_len == len && memcmp(t->nodes[k].fqn, fqn, len) == 0) {
            *added = false;
            return k;
        }
    }
}

static int seg_cmp(const node *a, const node *b)
{
    if (a->rank != b->rank) {
        if (a->rank < 0) return 1;
        if (b->rank < 0) return -1;
        return a->rank < b->rank ? -1 : 1;
    }
    char sa[256], sb[256];
    size_t la = a->seg_len < 255 ? a->seg_len : 255, lb = b->seg_len < 255 ? b->seg_len : 255;
    memcpy(sa, a->seg, la);
    sa[la] = '\0';
    memcpy(sb, b->seg, lb);
    sb[lb] = '\0';
    int c = hp_natural_cmp(sa, sb);
    if (c) return c;
    return a->seg_len < b->seg_len ? -1 : a->seg_len > b->seg_len;
}

static const node *g_sort_nodes; /* qsort has no context argument in C11 */
static const hp_param *g_sort_params;

static int name_cmp(const void *x, const void *y)
{
    return strcmp(g_sort_params[*(const int *)x].name, g_sort_params[*(const int *)y].name);
}

static int child_cmp(const void *x, const void *y)
{
    return seg_cmp(&g_sort_nodes[*(const int *)x], &g_sort_nodes[*(const int *)y]);
}

/* m->name_hash over m's parameter names (model.h); left NULL when memory runs out. */
static void build_name_hash(hp_model *m)
{
    if (m->n_params > (size_t)UINT32_MAX / 4) return;
    size_t cap = 16;
    while (cap < 2 * m->n_params) cap *= 2;
    uint32_t *t = hp_arena_alloc(&m->arena, cap * sizeof *t);
    if (!t) return;
    memset(t, 0, cap * sizeof *t);
    for (size_t i = 0; i < m->n_params; i++) {
        const char *name = m->params[i].name;
        size_t j = (size_t)hp_hash64_bytes(name, strlen(name), 0) & (cap - 1);
        while (t[j]) j = (j + 1) & (cap - 1);
        t[j] = (uint32_t)i + 1;
    }
    m->name_hash = t;
    m->name_hash_mask = cap - 1;
}

/* The trie of every dotted prefix of raw's names (t's arrays allocated here; the caller frees them, also on
 * failure), each node's children in registration-rank then natural order (docs/design.md, "The model"). kids
 * gets a scratch array of t->n ints, which the walk reuses. */
static hp_status trie_build(trie *t, const raw_list *raw, int **kids, hp_err *err)
{
    size_t n_seg = 1;
    for (size_t i = 0; i < raw->n; i++) {
        size_t segs = 1;
        for (const char *c = raw->v[i].name; *c; c++) segs += *c == '.';
        n_seg += segs;
    }
    t->cap = n_seg;
    t->n_slots = 16;
    while (t->n_slots < 2 * n_seg) t->n_slots *= 2;
    t->nodes = malloc(t->cap * sizeof *t->nodes);
    t->slots = malloc(t->n_slots * sizeof *t->slots);
    if (!t->nodes || !t->slots) return hp_err_set(err, HP_ERR_NOMEM, "out of memory building the module tree");
    memset(t->slots, 0xff, t->n_slots * sizeof *t->slots);
    bool added;
    int root = trie_get_or_add(t, "", 0, -1, &added);
    HP_ASSERT(root == 0);

    for (size_t i = 0; i < raw->n; i++) {
        const char *name = raw->v[i].name;
        size_t len = strlen(name);
        int parent = root;
        for (size_t e = 0; e <= len; e++) {
            if (e < len && name[e] != '.') continue;
            int k = trie_get_or_add(t, name, e, parent, &added);
            if (added) {
                node *p = &t->nodes[parent];
                t->nodes[k].next_sibling = p->first_child; /* reversed now, sorted below */
                p->first_child = k;
                p->n_children++;
            }
            parent = k;
        }
        if (t->nodes[parent].param >= 0)
            return hp_err_set(err, HP_ERR_INPUT, "parameter '%s' appears twice in the checkpoint", name);
        t->nodes[parent].param = (int)i;
    }

    /* Sort every node's children. */
    *kids = malloc(t->n * sizeof **kids);
    if (!*kids) return hp_err_set(err, HP_ERR_NOMEM, "out of memory sorting the module tree");
    int *kd = *kids;
    g_sort_nodes = t->nodes;
    for (size_t k = 0; k < t->n; k++) {
        node *nd = &t->nodes[k];
        if (nd->n_children < 1) continue;
        int c = 0;
        for (int ch = nd->first_child; ch >= 0; ch = t->nodes[ch].next_sibling) kd[c++] = ch;
        qsort(kd, (size_t)c, sizeof *kd, child_cmp);
        nd->first_child = kd[0];
        for (int j = 0; j < c; j++) t->nodes[kd[j]].next_sibling = j + 1 < c ? kd[j + 1] : -1;
    }
    return HP_OK;
}

/* The pre-order walk of t from its root (node 0): m->params and m->modules in their final order, each module's
 * name, leaf, parent and depth. n_modules is the number of modules the walk meets (the root and every node with
 * children); stack and kids are scratch arrays of t->n ints. */
static hp_status walk_modules(hp_model *m, trie *t, const raw_list *raw, size_t n_modules, int *stack, int *kids,
                              hp_err *err)
{
    const int root = 0;
    size_t n_mod = 0, n_par = 0, sp = 0;
    stack[sp++] = root;
    while (sp > 0) {
        int k = stack[--sp];
        node *nd = &t->nodes[k];
        if (nd->param >= 0) {
            hp_param *p = &m->params[n_par];
            *p = raw->v[nd->param];
            p->module = t->nodes[nd->parent].module;
            n_par++;
        }
        if (k == root || nd->n_children > 0) {
            hp_module *mod = &m->modules[n_mod];
            nd->module = (int)n_mod;
            mod->name = k == root ? "" : hp_arena_strndup(&m->arena, nd->fqn, nd->fqn_len);
            mod->leaf = k == root ? "" : hp_arena_strndup(&m->arena, nd->seg, nd->seg_len);
            if (!mod->name || !mod->leaf)
                return hp_err_set(err, HP_ERR_NOMEM, "out of memory building the module tree");
            mod->parent = k == root ? -1 : t->nodes[nd->parent].module;
            mod->depth = k == root ? 0 : m->modules[mod->parent].depth + 1;
            mod->first_child = mod->next_sibling = -1;
            n_mod++;
        }
        /* Push children in reverse so the first child is visited first. */
        int c = 0;
        for (int ch = nd->first_child; ch >= 0; ch = t->nodes[ch].next_sibling) kids[c++] = ch;
        for (int j = c - 1; j >= 0; j--) stack[sp++] = kids[j];
    }
    HP_ASSERT(n_par == raw->n && n_mod == n_modules);
    m->n_params = n_par;
    m->n_modules = n_mod;
    return HP_OK;
}

/* After the walk: each module's children links (in walk order), its owned-parameter list (into owned, one int per
 * parameter) and its subtree's parameter range. last_child is scratch of m->n_modules ints. */
static void link_modules(hp_model *m, int *owned, int *last_child)
{
    size_t n_mod = m->n_modules, n_par = m->n_params;
    for (size_t i = 0; i < n_mod; i++) last_child[i] = -1;
    for (size_t i = 1; i < n_mod; i++) {
        hp_module *mod = &m->modules[i];
        hp_module *par = &m->modules[mod->parent];
        if (last_child[mod->parent] < 0) par->first_child = (int)i;
        else m->modules[last_child[mod->parent]].next_sibling = (int)i;
        last_child[mod->parent] = (int)i;
    }
    for (size_t i = 0; i < n_par; i++) m->modules[m->params[i].module].n_params++;
    size_t off = 0;
    for (size_t i = 0; i < n_mod; i++) {
        m->modules[i].params = owned + off;
        off += (size_t)m->modules[i].n_params;
        m->modules[i].n_params = 0;
    }
    for (size_t i = 0; i < n_par; i++) {
        hp_module *mod = &m->modules[m->params[i].module];
        ((int *)mod->params)[mod->n_params++] = (int)i;
    }
    /* Subtree ranges: the walk emits a subtree's parameters contiguously; children follow parents. */
    for (size_t i = 0; i < n_mod; i++) {
        hp_module *mod = &m->modules[i];
        mod->subtree_first = mod->n_params ? mod->params[0] : INT32_MAX;
        mod->subtree_end = mod->n_params ? mod->params[mod->n_params - 1] + 1 : -1;
    }
    for (size_t i = n_mod; i-- > 1;) {
        hp_module *mod = &m->modules[i], *par = &m->modules[mod->parent];
        if (mod->subtree_first < par->subtree_first) par->subtree_first = mod->subtree_first;
        if (mod->subtree_end > par->subtree_end) par->subtree_end = mod->subtree_end;
    }
    for (size_t i = 0; i < n_mod; i++)
        if (m->modules[i].subtree_end < 0) m->modules[i].subtree_first = m->modules[i].subtree_end = 0;
}

/* Orders raw params and builds modules into m: the trie of the names (trie_build), the pre-order walk
 * (walk_modules), the links (link_modules), then the name index and hash. Consumes raw (its array is freed). */
static hp_status build_table(hp_model *m, raw_list *raw, hp_err *err)
{
    trie t = {0};
    int *stack = NULL, *kids = NULL;
    hp_status st = trie_build(&t, raw, &kids, err);
    if (st != HP_OK) goto done;

    /* Count modules: the root and every node with children. */
    size_t n_modules = 0;
    for (size_t k = 0; k < t.n; k++)
        if (k == 0 || t.nodes[k].n_children > 0) n_modules++;
    m->modules = hp_arena_alloc(&m->arena, n_modules * sizeof *m->modules);
    m->params = hp_arena_alloc(&m->arena, (raw->n ? raw->n : 1) * sizeof *m->params);
    int *owned = hp_arena_alloc(&m->arena, (raw->n ? raw->n : 1) * sizeof *owned);
    stack = malloc(t.n * sizeof *stack);
    if (!m->modules || !m->params || !owned || !stack) {
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory building the module tree");
        goto done;
    }
    if ((st = walk_modules(m, &t, raw, n_modules, stack, kids, err)) != HP_OK) goto done;
    link_modules(m, owned, stack); /* the stack is reused: n_modules <= t.n */

    size_t n_par = m->n_params;
    int *index = hp_arena_alloc(&m->arena, (n_par ? n_par : 1) * sizeof *index);
    if (!index) {
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory indexing parameter names");
        goto done;
    }
    for (size_t i = 0; i < n_par; i++) index[i] = (int)i;
    g_sort_params = m->params;
    qsort(index, n_par, sizeof *index, name_cmp);
    m->name_index = index;
    build_name_hash(m); /* out of memory: lookups fall back to the sorted index */

done:
    free(t.nodes);
    free(t.slots);
    free(stack);
    free(kids);
    free(raw->v);
    raw->v = NULL;
    return st;
}

/* ---- meta mode ---- */

static hp_status need(const hp_model *m, const char *label, int64_t value, const char *key, hp_err *err)
{
    if (value > 0) return HP_OK;
    return hp_err_set(err, HP_ERR_INPUT,
                      "%s: field \"%s\" is missing or zero; meta mode needs it to synthesise the %s parameter "
                      "shapes",
                      label, key, hp_family_name(m->family));
}

static hp_status check_meta_config(const hp_model *m, const char *label, hp_err *err)
{
    const hp_model_config *c = &m->cfg;
    const hp_family *f = m->family;
    hp_status st;
    if ((st = need(m, label, c->hidden_size, "hidden_size", err)) ||
        (st = need(m, label, c->num_hidden_layers, "num_hidden_layers", err)) ||
        (st = need(m, label, c->num_attention_heads, "num_attention_heads", err)) ||
        (st = need(m, label, c->vocab_size, "vocab_size", err)))
        return st;
    if (c->num_hidden_layers > 100000)
        return hp_err_set(err, HP_ERR_INPUT, "%s: num_hidden_layers %lld is implausible (more than 100000)", label,
                          (long long)c->num_hidden_layers);
    if (f->attn == HP_ATTN_MLA) {
        if ((st = need(m, label, c->kv_lora_rank, "kv_lora_rank", err)) ||
            (st = need(m, label, c->qk_rope_head_dim, "qk_rope_head_dim", err)) ||
            (st = need(m, label, c->qk_nope_head_dim, "qk_nope_head_dim", err)) ||
            (st = need(m, label, c->v_head_dim, "v_head_dim", err)))
            return st;
    } else if (!c->head_dim) {
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: hidden_size %lld is not divisible by num_attention_heads %lld and no head_dim is "
                          "given; add \"head_dim\" to the config",
                          label, (long long)c->hidden_size, (long long)c->num_attention_heads);
    }
    bool any_dense = false, any_sparse = false;
    for (int64_t i = 0; i < c->num_hidden_layers; i++) {
        if (hp__family_layer_sparse(f, c, i)) any_sparse = true;
        else any_dense = true;
        if (any_dense && any_sparse) break;
    }
    if (any_dense && (st = need(m, label, c->intermediate_size, "intermediate_size", err))) return st;
    /* Qwen-MoE with num_experts 0 is a dense model (transformers' sparse rule needs num_experts > 0); the
     * other MoE families build their routed block on every sparse layer, so they need experts. */
    if (f->moe && (f->sparse != HP_SPARSE_STEP || c->n_experts > 0)) {
        if ((st = need(m, label, c->n_experts, f->experts == HP_EXPERTS_GPTOSS || f->per_expert_block[0] == 'b'
                                                     ? "num_local_experts"
                                                     : "num_experts or n_routed_experts",
                       err)))
            return st;
        if (c->n_experts > 65536)
            return hp_err_set(err, HP_ERR_INPUT, "%s: %lld experts is implausible (more than 65536)", label,
                              (long long)c->n_experts);
        if (any_sparse && (st = need(m, label, c->moe_intermediate_size,
                                     f->moe_inter_is_intermediate ? "intermediate_size" : "moe_intermediate_size", err)))
            return st;
    }
    return HP_OK;
}

static hp_status open_meta(hp_model *m, const char *text, size_t len, const char *label,
                           const hp_model_opts *opts, hp_err *err)
{
    hp_status st = hp__config_parse(text, len, label, &m->arena, &m->cfg, &m->architecture, &m->model_type,
                                    &m->family, err);
    if (st != HP_OK) return st;
    if (!m->family) {
        char fams[HP_FAMILY_LIST_MAX];
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: model_type \"%s\" (architecture \"%s\") is not a family hyperpar can synthesise from "
                          "config.json alone; known families: %s. Point hyperpar at the checkpoint's safetensors "
                          "instead: any architecture is read from real weights",
                          label, m->model_type, m->architecture,
                          hp_family_known_list(fams, sizeof fams));
    }
    if ((st = check_meta_config(m, label, err)) != HP_OK) return st;
    m->meta = true;
    m->has_config = true;
    m->layout = opts ? opts->layout : HP_LAYOUT_PER_EXPERT;
    if (!m->family->has_per_expert_layout) m->layout = HP_LAYOUT_BATCHED;
    raw_list raw = {.arena = &m->arena};
    st = hp__synth_params(m->family, &m->cfg, m->layout, synth_emit, &raw, err);
    if (st != HP_OK) {
        hp_err_prefix(err, "%s", label);
        free(raw.v);
        return st;
    }
    return build_table(m, &raw, err);
}

/* ---- real checkpoints ---- */

/* Something is at path (a FIFO, a dangling link): reading it then refuses it by what it is, never silently. */
static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static bool ends_with(const char *s, const char *suffix);

static bool dir_has_safetensors(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return false;
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL)
        found = ends_with(e->d_name, ".safetensors") || strcmp(e->d_name, "model.safetensors.index.json") == 0;
    closedir(d);
    return found;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* ---- where its files are (model_int.h) ---- */

/* Whether m's path names its config.json itself (meta mode from a .json path, or config text's label). */
static bool path_is_config(const hp_model *m) { return m->meta && ends_with(m->path, ".json"); }

const char *hp__model_dir(const hp_model *m, char *buf, size_t cap)
{
    if (m->ckpt) {
        snprintf(buf, cap, "%s", hp_ckpt_dir(m->ckpt));
    } else if (path_is_config(m)) {
        const char *slash = strrchr(m->path, '/');
        snprintf(buf, cap, "%.*s", slash ? (int)(slash - m->path) : 1, slash ? m->path : ".");
    } else {
        snprintf(buf, cap, "%s", m->path);
    }
    return buf;
}

const char *hp__model_config_path(const hp_model *m, char *buf, size_t cap)
{
    if (path_is_config(m)) {
        snprintf(buf, cap, "%s", m->path);
    } else {
        char dir[4096];
        snprintf(buf, cap, "%s/config.json", hp__model_dir(m, dir, sizeof dir));
    }
    return buf;
}

static hp_expert_layout detect_layout(const hp_model *m)
{
    for (size_t i = 0; i < m->n_params; i++) {
        const char *e = strstr(m->params[i].name, ".experts.");
        if (!e) continue;
        return isdigit((unsigned char)e[9]) ? HP_LAYOUT_PER_EXPERT : HP_LAYOUT_BATCHED;
    }
    return HP_LAYOUT_PER_EXPERT;
}

static hp_status open_real(hp_model *m, const char *path, hp_err *err)
{
    hp_status st = hp_ckpt_open(&m->ckpt, path, err);
    if (st != HP_OK) return st;

    char cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", hp_ckpt_dir(m->ckpt));
    bool have_config = exists(cfg_path);
    m->has_config = have_config;
    if (have_config) {
        char *text = NULL;
        size_t len = 0;
        if ((st = hp__read_file(cfg_path, HP_JSON_MAX_FILE, &text, &len, err)) != HP_OK) return st;
        st = hp__config_parse(text, len, cfg_path, &m->arena, &m->cfg, &m->architecture, &m->model_type,
                              &m->family, err);
        free(text);
        if (st != HP_OK) return st;
    }

    raw_list raw = {.arena = &m->arena};
    for (size_t i = 0; i < hp_ckpt_count(m->ckpt); i++) {
        const hp_ckpt_tensor *ct = hp_ckpt_at(m->ckpt, i);
        if ((st = raw_push(&raw, ct->t->name, ct->t->dtype, ct->t->n_dims, ct->t->shape, err)) != HP_OK) {
            free(raw.v);
            return st;
        }
        hp_param *p = &raw.v[raw.n - 1];
        p->file_index = ct->file_index;
        p->offset = hp_st_data_offset(ct->file) + ct->t->begin;
    }
    if (raw.n == 0) {
        free(raw.v);
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: the checkpoint holds no tensors (%s); there is nothing to inspect, plan or shard. "
                          "Re-download the weights, or point hyperpar at the config.json for meta mode",
                          path, hp_ckpt_source(m->ckpt));
    }
    if ((st = build_table(m, &raw, err)) != HP_OK) return st;
    m->layout = detect_layout(m);
    /* config.json must describe these weights (layers, experts, shapes), or every plan is wrong. */
    if (have_config && m->family) return hp__model_check_weights(m, cfg_path, err);
    return HP_OK;
}

static hp_model *model_new(const char *path)
{
    hp_model *m = hp_calloc(1, sizeof *m);
    if (!m) return NULL;
    hp_arena_init(&m->arena);
    m->path = hp_arena_strdup(&m->arena, path);
    m->architecture = m->model_type = "";
    return m;
}

static void finish_names(hp_model *m)
{
    char buf[256];
    hp_arch_canonical(m->architecture, m->model_type, buf, sizeof buf);
    m->arch = hp_arena_strdup(&m->arena, buf);
}

hp_status hp_model_from_config_text(hp_model **out, const char *text, size_t len, const char *label,
                                    const hp_model_opts *opts, hp_err *err)
{
    *out = NULL;
    hp_model *m = model_new(label);
    if (!m || !m->path) {
        hp_model_close(m);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    hp_status st = open_meta(m, text, len, label, opts, err);
    if (st != HP_OK) {
        hp_model_close(m);
        return st;
    }
    finish_names(m);
    *out = m;
    return HP_OK;
}

hp_status hp_model_from_tensors(hp_model **out, const char *config_text, size_t len, const char *label,
                                const hp_tensor_desc *t, size_t n, hp_err *err)
{
    *out = NULL;
    hp_model *m = model_new(label);
    if (!m || !m->path) {
        hp_model_close(m);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    hp_status st = hp__config_parse(config_text, len, label, &m->arena, &m->cfg, &m->architecture, &m->model_type,
                                    &m->family, err);
    raw_list raw = {.arena = &m->arena};
    for (size_t i = 0; st == HP_OK && i < n; i++) {
        if (t[i].n_dims < 0 || t[i].n_dims > HP_MAX_DIMS) {
            st = hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s' has %d dimensions; at most %d are supported", label,
                            t[i].name, t[i].n_dims, HP_MAX_DIMS);
            break;
        }
        for (int d = 0; d < t[i].n_dims; d++)
            if (t[i].shape[d] < 0)
                st = hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s' has a negative size", label, t[i].name);
        if (st == HP_OK && (st = raw_push(&raw, t[i].name, t[i].dtype, t[i].n_dims, t[i].shape, err)) == HP_OK)
            raw.v[raw.n - 1].trainable = t[i].trainable;
    }
    if (st == HP_OK && raw.n == 0)
        st = hp_err_set(err, HP_ERR_INPUT, "%s: the model has no parameters; there is nothing to plan", label);
    if (st != HP_OK) {
        free(raw.v);
        hp_model_close(m);
        return st;
    }
    m->meta = true; /* shapes only: the weights stay where they are (a live module) */
    m->has_config = true;
    if ((st = build_table(m, &raw, err)) == HP_OK) {
        m->layout = detect_layout(m);
        if (m->family) st = hp__model_check_weights(m, label, err);
    }
    if (st != HP_OK) {
        hp_model_close(m);
        return st;
    }
    finish_names(m);
    *out = m;
    return HP_OK;
}

hp_status hp_model_open(hp_model **out, const char *path, const hp_model_opts *opts, hp_err *err)
{
    *out = NULL;
    char cfg_path[4096];
    bool meta = false;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        char why[256];
        const char *what = hp_path_describe(path, why, sizeof why);
        if (errno == ENOENT && strcmp(what, "does not exist") == 0)
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: no such file or folder; point hyperpar at a Hugging Face checkpoint folder, a "
                              ".safetensors file or a config.json",
                              path);
        return hp_err_set(err, HP_ERR_INPUT, "%s: cannot open: the path %s", path, what);
    }
    if (S_ISDIR(sb.st_mode)) {
        /* A folder is a checkpoint when it holds weights; a folder with only config.json is meta mode. */
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", path);
        if (!dir_has_safetensors(path)) {
            if (!exists(cfg_path))
                return hp_err_set(err, HP_ERR_INPUT,
                                  "%s: the folder holds neither *.safetensors files nor a config.json; point "
                                  "hyperpar at a Hugging Face checkpoint folder, a .safetensors file or a config.json",
                                  path);
            meta = true;
        }
    } else if (!S_ISREG(sb.st_mode)) {
        char why[256];
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: the path %s; hyperpar reads a checkpoint folder, a .safetensors file or a config.json "
                          "(save the data to a regular file first)",
                          path, hp_path_describe(path, why, sizeof why));
    } else if (ends_with(path, ".json") && !ends_with(path, ".index.json")) {
        snprintf(cfg_path, sizeof cfg_path, "%s", path);
        meta = true;
    }

    hp_model *m = model_new(path);
    if (!m || !m->path) {
        hp_model_close(m);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    hp_status st;
    if (meta) {
        char *text = NULL;
        size_t len = 0;
        st = hp__read_file(cfg_path, HP_JSON_MAX_FILE, &text, &len, err);
        if (st == HP_OK) st = open_meta(m, text, len, cfg_path, opts, err);
        free(text);
    } else {
        st = open_real(m, path, err);
    }
    if (st != HP_OK) {
        hp_model_close(m);
        return st;
    }
    finish_names(m);
    *out = m;
    return HP_OK;
}

void hp_model_close(hp_model *m)
{
    if (!m) return;
    hp_ckpt_close(m->ckpt);
    hp_arena_free(&m->arena);
    free(m);
}

const hp_param *hp_model_find_param(const hp_model *m, const char *name)
{
    if (m->name_hash) {
        size_t j = (size_t)hp_hash64_bytes(name, strlen(name), 0) & m->name_hash_mask;
        for (uint32_t v; (v = m->name_hash[j]) != 0; j = (j + 1) & m->name_hash_mask)
            if (!strcmp(m->params[v - 1].name, name)) return &m->params[v - 1];
        return NULL;
    }
    size_t lo = 0, hi = m->n_params;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const hp_param *p = &m->params[m->name_index[mid]];
        int c = strcmp(p->name, name);
        if (c == 0) return p;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* Walks the tree from the root along the dotted segments of name. */
int hp_model_find_module(const hp_model *m, const char *name)
{
    if (m->n_modules == 0) return -1;
    if (!*name) return 0;
    int cur = 0;
    const char *seg = name;
    for (;;) {
        const char *dot = strchr(seg, '.');
        size_t len = dot ? (size_t)(dot - seg) : strlen(seg);
        int next = -1;
        for (int c = m->modules[cur].first_child; c >= 0; c = m->modules[c].next_sibling)
            if (strlen(m->modules[c].leaf) == len && strncmp(m->modules[c].leaf, seg, len) == 0) {
                next = c;
                break;
            }
        if (next < 0) return -1;
        cur = next;
        if (!dot) return cur;
        seg = dot + 1;
    }
}

bool hp_model_layer_is_sparse(const hp_model *m, int64_t layer)
{
    if (m->family) return hp__family_layer_sparse(m->family, &m->cfg, layer);
    /* Unknown family: a layer is sparse when it holds experts. */
    char needle[64];
    snprintf(needle, sizeof needle, "layers.%lld.", (long long)layer);
    for (size_t i = 0; i < m->n_params; i++) {
        const char *p = strstr(m->params[i].name, needle);
        if (p && strstr(p, ".experts.")) return true;
    }
    return false;
}

size_t hp_model_freeze(hp_model *m, const char *glob)
{
    size_t n = 0;
    for (size_t i = 0; i < m->n_params; i++)
        if (hp_glob_match(glob, m->params[i].name)) {
            m->params[i].trainable = false;
            n++;
        }
    return n;
}

uint64_t hp_model_num_params(const hp_model *m)
{
    uint64_t n = 0;
    for (size_t i = 0; i < m->n_params; i++) n += (uint64_t)m->params[i].n_elems;
    return n;
}

uint64_t hp_model_total_bytes(const hp_model *m)
{
    uint64_t n = 0;
    for (size_t i = 0; i < m->n_params; i++) n += m->params[i].nbytes;
    return n;
}
