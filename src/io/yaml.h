/*
 * yaml.h — internal: YAML or JSON text into a positioned tree (libyaml events; JSON is parsed as YAML).
 */
#ifndef HP_IO_YAML_H
#define HP_IO_YAML_H

#include "hyperpar/core.h"

#define HP_YAML_MAX_DEPTH 64

typedef enum { HP_Y_SCALAR, HP_Y_SEQ, HP_Y_MAP } hp_ynode_kind;

typedef struct hp_ynode hp_ynode;
struct hp_ynode {
    hp_ynode_kind kind;
    int line, col;      /* 1-based position of the node in the text */
    const char *str;    /* SCALAR: the text */
    bool quoted;        /* SCALAR: quoted (never null / bool / number) */
    int n;              /* SEQ, MAP: number of items */
    hp_ynode **items;   /* SEQ items, or MAP values */
    const char **keys;  /* MAP keys, in document order */
};

/* Parses text; on failure err reads "<label>:<line>:<col>: <reason>". Nodes live in arena. */
hp_status hp__yaml_parse(const char *text, size_t len, const char *label, hp_arena *arena, hp_ynode **root,
                         hp_err *err);
const hp_ynode *hp__ymap_get(const hp_ynode *map, const char *key);
bool hp__yscalar_is_null(const hp_ynode *n);
/* 1 true, 0 false, -1 not a plain boolean. */
int hp__yscalar_bool(const hp_ynode *n);

#endif
