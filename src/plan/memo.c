/*
 * memo.c — name templates: the planner's per-name results computed once per template instead of once per name.
 *
 * Phase 1 (classify) and phase 3 (infer) are pure functions of a name that never look at its index segments
 * (an all-digit dotted segment: a layer or an expert number): no pattern of theirs holds one, and an all-digit
 * segment stays all-digit. A name's template writes each such segment as "0", so DeepSeek-V3's 45k parameter
 * names ("model.layers.17.mlp.experts.203.down_proj.weight") come down to a few dozen templates
 * ("model.layers.0.mlp.experts.0.down_proj.weight"), each classified once.
 *
 * Template ids come from the model's module tree, never from the full names: a module's template is its
 * parent's template and its own segment (leaf, or "0" for an index), so its id is looked up by the pair (parent
 * id, segment), and a parameter's by (its module's id, the segment after the module's name). One short segment
 * is hashed per module and per parameter, in one pass in module order (a parent is numbered before its
 * children: the tree's pre-order). Equal ids mean equal template strings: a segment holds no dot, so (parent
 * template, segment) spells one string. The root is id 0.
 *
 *   segs : XXH64(segment, seed = parent id) → {seg, len, parent, id}   one entry per distinct template
 *   kids : per id, its last 4 children {seg, len, id}: most lookups end there, unhashed
 *   vals : (tag << 32 | id), mixed → {key, val}                       one entry per (template, tag) asked for
 *
 * segs and vals are one kind of table (otab): open addressing, linear probing, at most half full, starting
 * small and doubling; their size follows the templates (dozens), not the names.
 */
#include <stdlib.h>
#include <string.h>

#include "plan/planner.h"

/* An open-addressing table of fixed-size entries whose first member is their hash, never 0 (0 marks an empty
 * slot; otab_hash makes sure of it). */
typedef struct otab {
    unsigned char *e;
    size_t cap, n, esz;
} otab;

static uint64_t otab_hash(uint64_t h) { return h ? h : 1; }

static uint64_t *otab_at(const otab *t, size_t j) { return (uint64_t *)(t->e + j * t->esz); }

/* The slot of the entry with hash h that match(entry, key) accepts, or the empty slot where it belongs (its hash
 * still 0: the caller fills it in and counts it in n). Grows first so that the table stays at most half full.
 * NULL when out of memory. */
static void *otab_slot(otab *t, uint64_t h, bool (*match)(const void *entry, const void *key), const void *key)
{
    if (2 * (t->n + 1) > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        otab g = {calloc(cap, t->esz), cap, t->n, t->esz};
        if (!g.e) return NULL;
        for (size_t i = 0; i < t->cap; i++) {
            const uint64_t *e = otab_at(t, i);
            if (!*e) continue;
            size_t j = (size_t)*e & (cap - 1);
            while (*otab_at(&g, j)) j = (j + 1) & (cap - 1);
            memcpy(otab_at(&g, j), e, t->esz);
        }
        free(t->e);
        *t = g;
    }
    size_t j = (size_t)h & (t->cap - 1);
    for (uint64_t *e; *(e = otab_at(t, j)); j = (j + 1) & (t->cap - 1))
        if (*e == h && match(e, key)) return e;
    return otab_at(t, j);
}

typedef struct seg_entry {
    uint64_t h;
    const char *seg; /* "0" for an index segment */
    size_t len;
    uint32_t parent, id;
} seg_entry;

/* The last few children looked up under one template: siblings repeat their segments under every layer and
 * expert ("0", "gate_proj", "weight"), so most lookups end here without hashing. */
#define MEMO_KIDS 4
typedef struct kid_cache {
    const char *seg[MEMO_KIDS];
    size_t len[MEMO_KIDS];
    uint32_t id[MEMO_KIDS];
    unsigned n;
} kid_cache;

typedef struct val_entry {
    uint64_t h;
    uint64_t key; /* tag << 32 | id */
    int val;
} val_entry;

struct hp__memo {
    uint32_t *param_t;  /* [n_params] template id of each parameter */
    uint32_t *module_t; /* [n_modules] template id of each module */
    otab segs;          /* seg_entry; ids 1 .. n_ids - 1 live in it */
    size_t n_ids;
    kid_cache *kids; /* [kids_cap] per parent id */
    size_t kids_cap;
    otab vals; /* val_entry */
};

/* Whether s[0, len) is a dotted index segment: non-empty, digits only. */
static bool is_index(const char *s, size_t len)
{
    if (!len) return false;
    for (size_t i = 0; i < len; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

/* Room in kids for every id so far. */
static bool kids_grow(hp__memo *m)
{
    if (m->n_ids < m->kids_cap) return true;
    size_t cap = m->kids_cap ? 2 * m->kids_cap : 64;
    kid_cache *k = realloc(m->kids, cap * sizeof *k);
    if (!k) return false;
    memset(k + m->kids_cap, 0, (cap - m->kids_cap) * sizeof *k);
    m->kids = k;
    m->kids_cap = cap;
    return true;
}

typedef struct seg_key {
    const char *s;
    size_t len;
    uint32_t parent;
} seg_key;

static bool seg_match(const void *entry, const void *key)
{
    const seg_entry *e = entry;
    const seg_key *k = key;
    return e->parent == k->parent && e->len == k->len && !memcmp(e->seg, k->s, k->len);
}

/* The id of the template (parent's template, segment s[0, len)) through the table; UINT32_MAX when out of
 * memory. */
static uint32_t table_id(hp__memo *m, uint32_t parent, const char *s, size_t len)
{
    uint64_t h = otab_hash(hp_hash64_bytes(s, len, parent));
    seg_key key = {s, len, parent};
    seg_entry *e = otab_slot(&m->segs, h, seg_match, &key);
    if (!e) return UINT32_MAX;
    if (e->h) return e->id;
    if (!kids_grow(m)) return UINT32_MAX;
    *e = (seg_entry){h, s, len, parent, (uint32_t)m->n_ids};
    m->segs.n++;
    return (uint32_t)m->n_ids++;
}

/* The id of the template (parent's template, segment s[0, len)): the parent's recent children first. */
static uint32_t seg_id(hp__memo *m, uint32_t parent, const char *s, size_t len)
{
    if (is_index(s, len)) s = "0", len = 1;
    kid_cache *k = &m->kids[parent];
    for (unsigned i = 0; i < MEMO_KIDS && i < k->n; i++)
        if (k->len[i] == len && !memcmp(k->seg[i], s, len)) return k->id[i];
    uint32_t id = table_id(m, parent, s, len);
    if (id == UINT32_MAX) return id;
    k = &m->kids[parent]; /* table_id may have moved the caches */
    unsigned slot = k->n++ % MEMO_KIDS;
    k->seg[slot] = s, k->len[slot] = len, k->id[slot] = id;
    return id;
}

/* Ids of every module and parameter of model. Module names are parent name + "." + leaf (the root's children:
 * the leaf alone), and a parameter's name is its module's name + "." + its own segment. */
static bool assign_ids(hp__memo *m, const hp_model *model)
{
    size_t nm = model->n_modules;
    size_t *name_len = malloc((nm ? nm : 1) * sizeof *name_len);
    bool ok = name_len != NULL;
    m->n_ids = 1; /* 0: the root */
    ok = ok && kids_grow(m);
    for (size_t i = 0; ok && i < nm; i++) {
        const hp_module *mod = &model->modules[i];
        if (mod->parent < 0) {
            m->module_t[i] = 0;
            name_len[i] = 0;
            continue;
        }
        HP_ASSERT((size_t)mod->parent < i); /* pre-order: parents first */
        size_t leaf = strlen(mod->leaf);
        name_len[i] = model->modules[mod->parent].parent < 0 ? leaf : name_len[mod->parent] + 1 + leaf;
        m->module_t[i] = seg_id(m, m->module_t[mod->parent], mod->leaf, leaf);
        ok = m->module_t[i] != UINT32_MAX;
    }
    for (size_t i = 0; ok && i < model->n_params; i++) {
        const hp_param *p = &model->params[i];
        const char *seg = model->modules[p->module].parent < 0 ? p->name : p->name + name_len[p->module] + 1;
        m->param_t[i] = seg_id(m, m->module_t[p->module], seg, strlen(seg));
        ok = m->param_t[i] != UINT32_MAX;
    }
    free(name_len);
    return ok;
}

hp__memo *hp__memo_create(const hp_model *model)
{
    hp__memo *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->segs.esz = sizeof(seg_entry);
    m->vals.esz = sizeof(val_entry);
    m->param_t = malloc((model->n_params ? model->n_params : 1) * sizeof *m->param_t);
    m->module_t = malloc((model->n_modules ? model->n_modules : 1) * sizeof *m->module_t);
    if (!m->param_t || !m->module_t || !assign_ids(m, model)) {
        hp__memo_destroy(m);
        return NULL;
    }
    return m;
}

void hp__memo_destroy(hp__memo *m)
{
    if (!m) return;
    free(m->param_t);
    free(m->module_t);
    free(m->segs.e);
    free(m->kids);
    free(m->vals.e);
    free(m);
}

static bool val_match(const void *entry, const void *key)
{
    return ((const val_entry *)entry)->key == *(const uint64_t *)key;
}

static int *slot_of(hp__memo *m, uint32_t id, uint32_t tag, bool *fresh)
{
    uint64_t key = (uint64_t)tag << 32 | id, h = otab_hash(key * 0x9e3779b97f4a7c15ull >> 17);
    val_entry *e = otab_slot(&m->vals, h, val_match, &key);
    if (!e) return NULL;
    *fresh = !e->h;
    if (*fresh) {
        *e = (val_entry){h, key, 0};
        m->vals.n++;
    }
    return &e->val;
}

int *hp__memo_param(hp__memo *m, size_t i, uint32_t tag, bool *fresh)
{
    return m ? slot_of(m, m->param_t[i], tag, fresh) : NULL;
}

int *hp__memo_module(hp__memo *m, size_t mi, uint32_t tag, bool *fresh)
{
    return m ? slot_of(m, m->module_t[mi], tag, fresh) : NULL;
}

uint32_t hp__memo_param_id(const hp__memo *m, size_t i) { return m ? m->param_t[i] : UINT32_MAX; }
