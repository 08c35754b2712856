/*
 * yaml.c — YAML (and therefore JSON) text into a small positioned tree, via libyaml's event parser.
 *
 *   hp_ynode: SCALAR (text, quoted?) | SEQ (items) | MAP (keys in order, values), each with line:col
 *
 * Limits that keep hostile input harmless: nesting at most HP_YAML_MAX_DEPTH, no aliases (a billion-laughs
 * document cannot expand), one document only, duplicate map keys refused. Everything lives in the
 * caller's arena.
 */
#include "io/yaml.h"

#include <string.h>
#include <yaml.h>

typedef struct ctx {
    yaml_parser_t parser;
    hp_arena *arena;
    const char *label;
    hp_err *err;
} ctx;

static hp_status fail_at(ctx *c, const yaml_mark_t *m, const char *what)
{
    return hp_err_set(c->err, HP_ERR_INPUT, "%s:%zu:%zu: %s", c->label, m->line + 1, m->column + 1, what);
}

static hp_status next(ctx *c, yaml_event_t *ev)
{
    if (!yaml_parser_parse(&c->parser, ev)) {
        const yaml_parser_t *p = &c->parser;
        return hp_err_set(c->err, HP_ERR_INPUT, "%s:%zu:%zu: invalid YAML: %s%s%s", c->label,
                          p->problem_mark.line + 1, p->problem_mark.column + 1,
                          p->problem ? p->problem : "syntax error", p->context ? " " : "",
                          p->context ? p->context : "");
    }
    return HP_OK;
}

static hp_ynode *new_node(ctx *c, hp_ynode_kind kind, const yaml_mark_t *m)
{
    hp_ynode *n = hp_arena_alloc(c->arena, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->line = (int)m->line + 1;
    n->col = (int)m->column + 1;
    return n;
}

/* Appends to a growable array held in the arena (doubling; the old block stays in the arena). */
static bool push(ctx *c, void ***arr, int *n, int *cap, void *item)
{
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 8;
        void **a = hp_arena_alloc(c->arena, (size_t)nc * sizeof *a);
        if (!a) return false;
        if (*n) memcpy(a, *arr, (size_t)*n * sizeof *a);
        *arr = a;
        *cap = nc;
    }
    (*arr)[(*n)++] = item;
    return true;
}

static hp_status parse_node(ctx *c, yaml_event_t *ev, int depth, hp_ynode **out);

static hp_status parse_children(ctx *c, hp_ynode *n, yaml_event_type_t end, int depth)
{
    int cap = 0, kcap = 0;
    for (;;) {
        yaml_event_t ev;
        hp_status st = next(c, &ev);
        if (st != HP_OK) return st;
        if (ev.type == end) {
            yaml_event_delete(&ev);
            return HP_OK;
        }
        if (n->kind == HP_Y_MAP) {
            if (ev.type != YAML_SCALAR_EVENT) {
                st = fail_at(c, &ev.start_mark, "mapping keys must be plain strings");
                yaml_event_delete(&ev);
                return st;
            }
            const char *key = hp_arena_strndup(c->arena, (const char *)ev.data.scalar.value, ev.data.scalar.length);
            for (int i = 0; key && i < n->n; i++)
                if (strcmp(n->keys[i], key) == 0) {
                    char msg[300];
                    snprintf(msg, sizeof msg, "duplicate key '%.200s' in a mapping", key);
                    st = fail_at(c, &ev.start_mark, msg);
                    yaml_event_delete(&ev);
                    return st;
                }
            yaml_event_delete(&ev);
            int kn = n->n;
            if (!key || !push(c, (void ***)&n->keys, &kn, &kcap, (void *)key))
                return hp_err_set(c->err, HP_ERR_NOMEM, "out of memory parsing %s", c->label);
            if ((st = next(c, &ev)) != HP_OK) return st;
        }
        hp_ynode *child = NULL;
        st = parse_node(c, &ev, depth + 1, &child);
        if (st != HP_OK) return st;
        if (!push(c, (void ***)&n->items, &n->n, &cap, child))
            return hp_err_set(c->err, HP_ERR_NOMEM, "out of memory parsing %s", c->label);
    }
}

/* Consumes ev (a node's first event) and everything up to the node's end. */
static hp_status parse_node(ctx *c, yaml_event_t *ev, int depth, hp_ynode **out)
{
    hp_status st = HP_OK;
    if (depth > HP_YAML_MAX_DEPTH) {
        st = fail_at(c, &ev->start_mark, "nesting is deeper than 64 levels");
    } else if (ev->type == YAML_ALIAS_EVENT) {
        st = fail_at(c, &ev->start_mark, "YAML aliases (*name) are not supported; write the value out");
    } else if (ev->type == YAML_SCALAR_EVENT) {
        hp_ynode *n = new_node(c, HP_Y_SCALAR, &ev->start_mark);
        if (n) n->str = hp_arena_strndup(c->arena, (const char *)ev->data.scalar.value, ev->data.scalar.length);
        if (!n || !n->str) st = hp_err_set(c->err, HP_ERR_NOMEM, "out of memory parsing %s", c->label);
        else {
            n->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
            *out = n;
        }
    } else if (ev->type == YAML_SEQUENCE_START_EVENT || ev->type == YAML_MAPPING_START_EVENT) {
        bool map = ev->type == YAML_MAPPING_START_EVENT;
        hp_ynode *n = new_node(c, map ? HP_Y_MAP : HP_Y_SEQ, &ev->start_mark);
        if (!n) st = hp_err_set(c->err, HP_ERR_NOMEM, "out of memory parsing %s", c->label);
        yaml_event_delete(ev);
        if (st == HP_OK) st = parse_children(c, n, map ? YAML_MAPPING_END_EVENT : YAML_SEQUENCE_END_EVENT, depth);
        if (st == HP_OK) *out = n;
        return st;
    } else {
        st = fail_at(c, &ev->start_mark, "unexpected YAML event");
    }
    yaml_event_delete(ev);
    return st;
}

hp_status hp__yaml_parse(const char *text, size_t len, const char *label, hp_arena *arena, hp_ynode **root,
                         hp_err *err)
{
    *root = NULL;
    ctx c = {.arena = arena, .label = label, .err = err};
    if (!yaml_parser_initialize(&c.parser)) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    yaml_parser_set_input_string(&c.parser, (const unsigned char *)text, len);
    yaml_event_t ev;
    hp_status st = HP_OK;
    bool in_doc = false;
    while (st == HP_OK) {
        if ((st = next(&c, &ev)) != HP_OK) break;
        yaml_event_type_t t = ev.type;
        if (t == YAML_STREAM_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        if (t == YAML_DOCUMENT_START_EVENT) {
            if (*root) st = fail_at(&c, &ev.start_mark, "only one YAML document is allowed");
            in_doc = true;
            yaml_event_delete(&ev);
            continue;
        }
        if (t == YAML_STREAM_START_EVENT || t == YAML_DOCUMENT_END_EVENT) {
            yaml_event_delete(&ev);
            continue;
        }
        if (!in_doc) {
            st = fail_at(&c, &ev.start_mark, "unexpected content");
            yaml_event_delete(&ev);
            break;
        }
        st = parse_node(&c, &ev, 0, root);
    }
    yaml_parser_delete(&c.parser);
    if (st == HP_OK && !*root)
        st = hp_err_set(err, HP_ERR_INPUT, "%s: the document is empty", label);
    if (st != HP_OK) *root = NULL;
    return st;
}

const hp_ynode *hp__ymap_get(const hp_ynode *map, const char *key)
{
    if (!map || map->kind != HP_Y_MAP) return NULL;
    for (int i = 0; i < map->n; i++)
        if (strcmp(map->keys[i], key) == 0) return map->items[i];
    return NULL;
}

bool hp__yscalar_is_null(const hp_ynode *n)
{
    return n && n->kind == HP_Y_SCALAR && !n->quoted &&
           (!strcmp(n->str, "") || !strcmp(n->str, "~") || !strcmp(n->str, "null") || !strcmp(n->str, "Null") ||
            !strcmp(n->str, "NULL"));
}

int hp__yscalar_bool(const hp_ynode *n)
{
    if (!n || n->kind != HP_Y_SCALAR || n->quoted) return -1;
    if (!strcmp(n->str, "true") || !strcmp(n->str, "True") || !strcmp(n->str, "TRUE")) return 1;
    if (!strcmp(n->str, "false") || !strcmp(n->str, "False") || !strcmp(n->str, "FALSE")) return 0;
    return -1;
}
