/*
 * json.h — internal: loading JSON text with positioned errors, and locating a key's value in the text.
 *
 * jansson parses; it keeps no positions for values, so type errors found after parsing are located by a
 * small scanner over the (already valid) text: hp__json_locate() returns the line:col of the value of a
 * key path such as {"quantization_config", "fmt"}.
 */
#ifndef HP_IO_JSON_H
#define HP_IO_JSON_H

#include <jansson.h>

#include "hyperpar/core.h"

/* Largest JSON file we read whole (config.json, index, plan, overrides): 256 MiB. */
#define HP_JSON_MAX_FILE (256u << 20)

/* Reads path into a NUL-terminated malloc'd buffer. */
hp_status hp__read_file(const char *path, size_t max_size, char **out, size_t *len, hp_err *err);

/* Parses text (duplicate keys rejected); on failure err reads "<label>:<line>:<col>: <reason>". */
hp_status hp__json_parse(const char *text, size_t len, const char *label, json_t **out, hp_err *err);

/* Finds the value of path[0].path[1]... (object keys) in text; returns false when not found. */
bool hp__json_locate(const char *text, size_t len, const char *const *path, int depth, int *line, int *col);

/* Short description of a JSON value for messages: `string "4096"`, `number 1.5`, `array`, `null`. */
const char *hp__json_describe(const json_t *v, char *buf, size_t cap);

#endif
