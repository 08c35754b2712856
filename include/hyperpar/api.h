/*
 * api.h — hyperpar as one JSON-in call, for other languages (the Python package loads libhyperpar_c.so, which
 * exports only these two functions). docs/python.md describes the requests.
 *
 *   request: {"command": "plan" | "cost" | "advise" | "inspect",
 *             "model": {"path": P} | {"config": {...}} | {"config": {...}, "tensors": [{name, shape, dtype}]},
 *             "options": {plan options}, "format": "json" | "explain" | "hf", ...}
 *
 * *out receives exactly the text the CLI prints for the same command (`--format json`, or the plan's format);
 * on a refusal *err_msg receives the CLI's message. Both are malloc'd (free them with hp_api_free); the return
 * value is the CLI's exit code: 0, 2 (input: a bad model, mesh, option or request), 1 (runtime).
 */
#ifndef HYPERPAR_API_H
#define HYPERPAR_API_H

#if defined(__GNUC__)
#define HP_API_EXPORT __attribute__((visibility("default")))
#else
#define HP_API_EXPORT
#endif

HP_API_EXPORT int hp_api_call(const char *request, char **out, char **err_msg);
HP_API_EXPORT void hp_api_free(void *p);

#endif
