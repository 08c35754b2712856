/*
 * memo.c — name templates: the planner's per-name results computed once per template instead of once per name.
 *
 * Phase 1 (classify) and phase 3 (infer) are pure functions of a name that never look at its index segments
 * (an all-digit dotted segment: a layer or an expert number): no pattern of theirs holds one, and an all-digit
 * segment stays all-digit. A name's template writes each such segment as "0", so DeepSeek-V3's 45k parameter
 * names ("model.layers.17.mlp.experts.203.down_proj.weight") come down to a few dozen templates
 * ("model.layers.0.mlp.experts.0.down_proj.weight"), each classified once.
 *
 * The table: open addressing over XXH64 of the template (seeded with the caller's tag), linear probing, kept at
 * most half full; the templates are owned copies. Names longer than HP__MEMO_MAX_NAME are not memoized.
 */
#include <stdlib.h>
#include <string.h>

#include "plan/planner.h"

#define HP__MEMO_MAX_NAME 512

typedef struct entry {
    uint64_t h;
    char *key; /* NULL: empty */
    uint32_t tag;
    int val;
} entry;

struct hp__memo {
    entry *e;
    size_t cap, n; /* cap a power of two */
};

hp__memo *hp__memo_create(void)
{
    hp__memo *m = calloc(1, sizeof *m);
    if (m && !(m->e = calloc(m->cap = 256, sizeof *m->e))) {
        free(m);
        return NULL;
    }
    return m;
}

void hp__memo_destroy(hp__memo *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->cap; i++) free(m->e[i].key);
    free(m->e);
    free(m);
}

/* name's template into buf (cap bytes); its length with the terminator, or 0 when it does not fit. One pass:
 * a segment is copied as it goes and rewound to "0" at its end when it held only digits. */
static size_t template_of(const char *name, char *buf, size_t cap)
{
    size_t o = 0, seg = 0; /* seg: where the current segment starts in buf */
    bool digits = true;
    for (const char *s = name;; s++) {
        char c = *s;
        if (c == '.' || c == '\0') {
            if (digits && o > seg) { /* an index segment */
                buf[seg] = '0';
                o = seg + 1;
            }
            if (o + 1 >= cap) return 0;
            buf[o++] = c;
            if (c == '\0') return o;
            seg = o;
            digits = true;
            continue;
        }
        if (o + 1 >= cap) return 0;
        buf[o++] = c;
        digits = digits && c >= '0' && c <= '9';
    }
}

static bool grow(hp__memo *m)
{
    entry *old = m->e;
    size_t oc = m->cap;
    entry *e = calloc(oc * 2, sizeof *e);
    if (!e) return false;
    m->e = e;
    m->cap = oc * 2;
    for (size_t i = 0; i < oc; i++) {
        if (!old[i].key) continue;
        size_t j = (size_t)old[i].h & (m->cap - 1);
        while (e[j].key) j = (j + 1) & (m->cap - 1);
        e[j] = old[i];
    }
    free(old);
    return true;
}

int *hp__memo_slot(hp__memo *m, const char *name, uint32_t tag, bool *fresh)
{
    char key[HP__MEMO_MAX_NAME];
    size_t len = m && name ? template_of(name, key, sizeof key) : 0;
    if (!len) return NULL;
    if (2 * (m->n + 1) > m->cap && !grow(m)) return NULL;
    uint64_t h = hp_hash64_bytes(key, len, tag);
    size_t j = (size_t)h & (m->cap - 1);
    for (; m->e[j].key; j = (j + 1) & (m->cap - 1))
        if (m->e[j].h == h && m->e[j].tag == tag && !strcmp(m->e[j].key, key)) {
            *fresh = false;
            return &m->e[j].val;
        }
    if (!(m->e[j].key = malloc(len))) return NULL;
    memcpy(m->e[j].key, key, len);
    m->e[j].h = h;
    m->e[j].tag = tag;
    m->n++;
    *fresh = true;
    return &m->e[j].val;
}
