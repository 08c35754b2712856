/*
 * bpe.c — byte-pair merges by rank, the hash maps they use, and the cache of pieces.
 *
 * A piece of n bytes starts as n symbols (one per byte, its single-byte token) in a doubly linked list laid in an
 * array: symbol i starts at byte i, and a merge keeps the left symbol (its id becomes the merged token's, its
 * length the sum) and empties the right one (len 0). A min-heap holds candidate merges (rank, pos, made): the
 * pair that starts at symbol pos merges into token made. Each step pops the lowest rank, ties to the leftmost
 * pos — the order Hugging Face's BPE merges in — and skips an entry that went stale (its symbol was merged away,
 * is last, or its pair now makes another token); a merge pushes the two pairs it forms with its neighbours. Cost:
 * O(n log n) per piece.
 *
 *   bytes   " t h e r e"     symbols [Ġ][t][h][e][r][e]   heap {(h e), (r e), (Ġ t), ...}
 *   merges  ...              [Ġ][t][he][·][re][·] -> [Ġt][·][he][·][re][·] -> [Ġthe][·][·][·][re][·] -> ...
 *
 * With ignore_merges, a piece that is itself a token (by its bytes) is that token, without merging.
 *
 * The cache maps a piece's bytes (up to HP__CACHE_MAX_PIECE) to its ids: natural text repeats its words, so most
 * pieces are found there. It is an open-addressed table of HP__CACHE_SLOTS slots, emptied whole when half full.
 */
#include <stdlib.h>
#include <string.h>

#include "tok/tok_int.h"

/* ---- byte strings -> ids ---- */

static bool key_eq(const hp_tok *t, bool bytes, int32_t id, const void *key, size_t n)
{
    const hp__token *k = &t->tok[id];
    if (bytes) return k->n_bytes == n && !memcmp(k->bytes, key, n);
    return strlen(k->str) == n && !memcmp(k->str, key, n);
}

hp_status hp__idmap_reserve(hp__idmap *m, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n + 2) cap *= 2;
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot) return HP_ERR_NOMEM;
    memset(m->slot, 0xFF, cap * sizeof *m->slot);
    m->cap = cap;
    m->n = 0;
    return HP_OK;
}

void hp__idmap_free(hp__idmap *m)
{
    free(m->slot);
    memset(m, 0, sizeof *m);
}

int32_t hp__idmap_find(const hp__idmap *m, const hp_tok *t, bool bytes, const void *key, size_t n)
{
    if (!m->cap) return -1;
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)hp_hash64_bytes(key, n, 0) & mask;; i = (i + 1) & mask) {
        int32_t id = m->slot[i];
        if (id < 0) return -1;
        if (key_eq(t, bytes, id, key, n)) return id;
    }
}

bool hp__idmap_put(hp__idmap *m, const hp_tok *t, bool bytes, int32_t id)
{
    if (2 * (m->n + 1) > m->cap) { /* grow: rehash every id */
        hp__idmap g = {0};
        if (hp__idmap_reserve(&g, 2 * m->n + 2) != HP_OK) return false;
        for (size_t i = 0; i < m->cap; i++)
            if (m->slot[i] >= 0) hp__idmap_put(&g, t, bytes, m->slot[i]);
        free(m->slot);
        *m = g;
    }
    const hp__token *k = &t->tok[id];
    const void *key = bytes ? (const void *)k->bytes : (const void *)k->str;
    size_t n = bytes ? k->n_bytes : strlen(k->str);
    size_t mask = m->cap - 1;
    size_t i = (size_t)hp_hash64_bytes(key, n, 0) & mask;
    while (m->slot[i] >= 0) i = (i + 1) & mask;
    m->slot[i] = id;
    m->n++;
    return true;
}

/* ---- merges: (a, b) -> (rank, made) ---- */

static size_t merge_slot(uint64_t key, size_t mask) { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & mask; }

static bool merge_grow(hp__mergemap *m)
{
    size_t cap = m->cap ? 2 * m->cap : 1024;
    hp__mergemap g = {calloc(cap, sizeof *g.key), malloc(cap * sizeof *g.rank), malloc(cap * sizeof *g.made), cap, 0};
    if (!g.key || !g.rank || !g.made) {
        hp__merge_free(&g);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->key[i]) continue;
        size_t j = merge_slot(m->key[i], cap - 1);
        while (g.key[j]) j = (j + 1) & (cap - 1);
        g.key[j] = m->key[i];
        g.rank[j] = m->rank[i];
        g.made[j] = m->made[i];
        g.n++;
    }
    hp__merge_free(m);
    *m = g;
    return true;
}

bool hp__merge_put(hp__mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t made)
{
    if (2 * (m->n + 1) > m->cap && !merge_grow(m)) return false;
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    size_t mask = m->cap - 1, i = merge_slot(key, mask);
    while (m->key[i] && m->key[i] != key) i = (i + 1) & mask;
    if (!m->key[i]) m->n++;
    /* A pair listed twice keeps its later rank, as Hugging Face's map of merges does. */
    m->key[i] = key;
    m->rank[i] = rank;
    m->made[i] = made;
    return true;
}

bool hp__merge_get(const hp__mergemap *m, int32_t a, int32_t b, int32_t *rank, int32_t *made)
{
    if (!m->cap) return false;
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    size_t mask = m->cap - 1;
    for (size_t i = merge_slot(key, mask); m->key[i]; i = (i + 1) & mask)
        if (m->key[i] == key) {
            *rank = m->rank[i];
            *made = m->made[i];
            return true;
        }
    return false;
}

void hp__merge_free(hp__mergemap *m)
{
    free(m->key);
    free(m->rank);
    free(m->made);
    memset(m, 0, sizeof *m);
}

/* ---- output ---- */

void hp__out_push(hp_tok *t, int32_t id)
{
    if (t->n_out == t->cap_out) {
        size_t cap = t->cap_out ? 2 * t->cap_out : 4096;
        int32_t *p = realloc(t->out, cap * sizeof *p);
        if (!p) {
            t->out_oom = true;
            return;
        }
        t->out = p;
        t->cap_out = cap;
    }
    t->out[t->n_out++] = id;
}

/* ---- the heap of candidate merges ---- */

static bool before(const hp__heap_item *a, const hp__heap_item *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(hp__heap_item *h, size_t *n, hp__heap_item it)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!before(&it, &h[up])) break;
        h[i] = h[up];
        i = up;
    }
    h[i] = it;
}

static hp__heap_item heap_pop(hp__heap_item *h, size_t *n)
{
    hp__heap_item top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && before(&h[c + 1], &h[c])) c++;
        if (!before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

/* Pushes the merge of the pair starting at symbol pos, when there is one. */
static void push_pair(const hp_tok *t, hp__heap_item *h, size_t *n, int32_t pos)
{
    const hp__sym *s = t->sym;
    int32_t nx = s[pos].next, rank, made;
    if (nx >= 0 && hp__merge_get(&t->merges, s[pos].id, s[nx].id, &rank, &made))
        heap_push(h, n, (hp__heap_item){rank, pos, made});
}

/* The initial symbols of s [n]: one per byte. A byte without a token is unk (consecutive ones fused with fuse_unk)
 * or, without an unk_token, left out and counted (t->n_dropped), as Hugging Face's BPE leaves out a character it
 * has no token for: its neighbours become adjacent. *n_sym may be 0. */
static void init_symbols(hp_tok *t, const uint8_t *s, size_t n, int32_t *n_sym)
{
    int32_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id < 0) {
            if (t->unk_id < 0) {
                if (!t->n_dropped++) t->first_dropped = s[i];
                continue;
            }
            id = t->unk_id;
            if (t->fuse_unk && k > 0 && t->sym[k - 1].id == id) {
                t->sym[k - 1].len++;
                continue;
            }
        }
        t->sym[k] = (hp__sym){id, k - 1, k + 1, 1};
        k++;
    }
    if (k) t->sym[k - 1].next = -1;
    *n_sym = k;
}

static hp_status merge_all(hp_tok *t, const uint8_t *s, size_t n, hp_err *err)
{
    if (n > t->cap_sym) {
        size_t cap = n > 2 * t->cap_sym ? n : 2 * t->cap_sym;
        hp__sym *sym = realloc(t->sym, cap * sizeof *sym);
        if (sym) t->sym = sym;
        hp__heap_item *heap = sym ? realloc(t->heap, 2 * cap * sizeof *heap) : NULL;
        if (!heap) return hp_err_set(err, HP_ERR_NOMEM, "tokenizer: out of memory for a piece of %zu bytes", n);
        t->heap = heap;
        t->cap_sym = cap;
    }
    int32_t n_sym;
    init_symbols(t, s, n, &n_sym);
    if (!n_sym) return HP_OK;
    hp__sym *sym = t->sym;
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < n_sym; i++) push_pair(t, t->heap, &nh, i);
    /* Every pushed entry is a pair of live neighbours at push time; a merge pushes at most two: the heap holds
     * fewer than 2·n_sym entries. */
    while (nh) {
        hp__heap_item top = heap_pop(t->heap, &nh);
        int32_t pos = top.pos, nx = sym[pos].next, rank, made;
        if (sym[pos].len == 0 || nx < 0) continue;
        if (!hp__merge_get(&t->merges, sym[pos].id, sym[nx].id, &rank, &made) || made != top.made) continue;
        sym[pos].id = made;
        sym[pos].len += sym[nx].len;
        sym[pos].next = sym[nx].next;
        sym[nx].len = 0;
        if (sym[pos].next >= 0) sym[sym[pos].next].prev = pos;
        if (sym[pos].prev >= 0) push_pair(t, t->heap, &nh, sym[pos].prev);
        push_pair(t, t->heap, &nh, pos);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) hp__out_push(t, sym[i].id);
    return HP_OK;
}

/* ---- the cache ---- */

static void cache_clear(hp_tok *t)
{
    for (size_t i = 0; t->cache && i < HP__CACHE_SLOTS; i++) {
        free(t->cache[i].key);
        t->cache[i] = (hp__cache_entry){0};
    }
    t->cache_n = 0;
}

static const int32_t *cache_ids(const hp__cache_entry *e)
{
    return (const int32_t *)(const void *)(e->key + ((e->klen + 3u) & ~3u));
}

/* The slot of s [n] (hash h): the entry holding it, or the empty slot to fill. */
static hp__cache_entry *cache_slot(hp_tok *t, uint64_t h, const uint8_t *s, size_t n)
{
    size_t mask = HP__CACHE_SLOTS - 1;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        hp__cache_entry *e = &t->cache[i];
        if (!e->hash || (e->hash == h && e->klen == n && !memcmp(e->key, s, n))) return e;
    }
}

/* Keeps the ids out[from, n_out) as those of s [n]; nothing when out of memory (the cache is only faster). */
static void cache_put(hp_tok *t, hp__cache_entry *e, uint64_t h, const uint8_t *s, size_t n, size_t from)
{
    size_t n_ids = t->n_out - from, koff = (n + 3u) & ~(size_t)3u;
    uint8_t *key = malloc(koff + n_ids * sizeof(int32_t));
    if (!key) return;
    memcpy(key, s, n);
    memcpy(key + koff, t->out + from, n_ids * sizeof(int32_t));
    *e = (hp__cache_entry){h, key, (uint32_t)n, (uint32_t)n_ids};
    t->cache_n++;
}

hp_status hp__bpe_piece(hp_tok *t, const uint8_t *s, size_t n, hp_err *err)
{
    if (t->ignore_merges) {
        int32_t id = hp__idmap_find(&t->by_bytes, t, true, s, n);
        if (id >= 0) {
            hp__out_push(t, id);
            return HP_OK;
        }
    }
    if (n == 1 && t->byte_id[s[0]] >= 0) {
        hp__out_push(t, t->byte_id[s[0]]);
        return HP_OK;
    }
    if (n > HP__CACHE_MAX_PIECE) return merge_all(t, s, n, err);
    if (!t->cache) t->cache = calloc(HP__CACHE_SLOTS, sizeof *t->cache); /* NULL: no cache, still correct */
    if (!t->cache) return merge_all(t, s, n, err);
    uint64_t h = hp_hash64_bytes(s, n, 0) | 1u;
    hp__cache_entry *e = cache_slot(t, h, s, n);
    if (e->hash) {
        const int32_t *ids = cache_ids(e);
        for (uint32_t i = 0; i < e->n_ids; i++) hp__out_push(t, ids[i]);
        return HP_OK;
    }
    size_t from = t->n_out;
    int64_t dropped = t->n_dropped;
    hp_status st = merge_all(t, s, n, err);
    if (st != HP_OK || t->out_oom || t->n_dropped != dropped) return st; /* a piece with a dropped byte: not kept */
    if (2 * (t->cache_n + 1) > HP__CACHE_SLOTS) {
        cache_clear(t);
        e = cache_slot(t, h, s, n);
    }
    cache_put(t, e, h, s, n, from);
    return HP_OK;
}

void hp__bpe_free(hp_tok *t)
{
    cache_clear(t);
    free(t->cache);
    free(t->sym);
    free(t->heap);
    free(t->out);
    hp__idmap_free(&t->by_str);
    hp__idmap_free(&t->by_bytes);
    hp__merge_free(&t->merges);
}
