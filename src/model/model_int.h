/*
 * model_int.h — internal: where an opened model's files are, for the modules above model that read a file
 * beside the weights (run: generation_config.json; cost: config.json for the program's configuration). The
 * rule is model.c's, said once: hp_model_open takes a checkpoint folder, a .safetensors file, an index json, a
 * config.json (meta mode, any name ending .json) or a folder holding only config.json (meta mode).
 */
#ifndef HP_MODEL_MODEL_INT_H
#define HP_MODEL_MODEL_INT_H

#include <stddef.h>

#include "hyperpar/model.h"

/* The folder m was opened from, into buf (returned): the checkpoint's folder (hp_ckpt_dir: also for a
 * .safetensors file or an index json), a meta config.json's own folder ("." when its path has no '/'), or the
 * meta folder itself. */
const char *hp__model_dir(const hp_model *m, char *buf, size_t cap);
/* m's config.json, into buf (returned): the file itself in meta mode when m was opened from a .json path (a
 * model from config text: its label), else config.json in hp__model_dir. */
const char *hp__model_config_path(const hp_model *m, char *buf, size_t cap);

#endif
