/*
 * inspect.c — a model described as one JSON object (`hyperpar inspect --json`, hp.inspect): what it is, its
 * sizes, its bytes by dtype, and (with tensors) every tensor's name, dtype and shape.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/model.h"
#include "hyperpar/safetensors.h"

int64_t hp_model_sparse_layers(const hp_model *m)
{
    int64_t n = 0;
    for (int64_t l = 0; l < m->cfg.num_hidden_layers; l++) n += hp_model_layer_is_sparse(m, l);
    return n;
}

void hp_model_dtype_bytes(const hp_model *m, uint64_t by[HP_DT_COUNT])
{
    memset(by, 0, HP_DT_COUNT * sizeof *by);
    for (size_t i = 0; i < m->n_params; i++) by[m->params[i].dtype] += m->params[i].nbytes;
}

hp_status hp_model_inspect_json(const hp_model *m, bool tensors, hp_buf *out, hp_err *err)
{
    uint64_t by[HP_DT_COUNT];
    hp_model_dtype_bytes(m, by);
    json_t *o = json_object();
    json_object_set_new(o, "path", json_string(m->path));
    json_object_set_new(o, "mode", json_string(m->meta ? "meta" : "checkpoint"));
    json_object_set_new(o, "architecture", json_string(m->architecture));
    json_object_set_new(o, "model_type", json_string(m->model_type));
    json_object_set_new(o, "arch", json_string(m->arch));
    json_object_set_new(o, "family", m->family ? json_string(hp_family_name(m->family)) : json_null());
    json_object_set_new(o, "num_params", json_integer((json_int_t)hp_model_num_params(m)));
    json_object_set_new(o, "num_tensors", json_integer((json_int_t)m->n_params));
    json_object_set_new(o, "total_bytes", json_integer((json_int_t)hp_model_total_bytes(m)));
    json_t *d = json_object();
    for (int t = 0; t < HP_DT_COUNT; t++)
        if (by[t]) json_object_set_new(d, hp_dtype_name((hp_dtype)t), json_integer((json_int_t)by[t]));
    json_object_set_new(o, "dtypes", d);
    json_object_set_new(o, "layers", json_integer(m->cfg.num_hidden_layers));
    json_object_set_new(o, "sparse_layers", json_integer(hp_model_sparse_layers(m)));
    json_object_set_new(o, "experts", json_integer(m->cfg.n_experts));
    json_object_set_new(o, "experts_per_tok", json_integer(m->cfg.num_experts_per_tok));
    json_object_set_new(o, "expert_layout", json_string(hp_expert_layout_name(m->layout)));
    json_object_set_new(o, "hidden_size", json_integer(m->cfg.hidden_size));
    json_object_set_new(o, "num_modules", json_integer((json_int_t)m->n_modules));
    if (m->ckpt) {
        json_object_set_new(o, "weights", json_string(hp_ckpt_source(m->ckpt)));
        const char *ign = hp_ckpt_ignored(m->ckpt);
        json_object_set_new(o, "weights_ignored", ign ? json_string(ign) : json_null());
    }
    if (tensors) {
        json_t *arr = json_array();
        for (size_t i = 0; i < m->n_params; i++) {
            const hp_param *p = &m->params[i];
            json_t *shape = json_array();
            for (int k = 0; k < p->n_dims; k++) json_array_append_new(shape, json_integer(p->shape[k]));
            json_array_append_new(arr, json_pack("{s:s, s:s, s:o}", "name", p->name, "dtype",
                                                 hp_dtype_name(p->dtype), "shape", shape));
        }
        json_object_set_new(o, "tensors", arr);
    }
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!s) return hp_err_set(err, HP_ERR_NOMEM, "out of memory writing the model's JSON");
    hp_buf_puts(out, s);
    hp_buf_puts(out, "\n");
    free(s);
    return out->oom ? hp_err_set(err, HP_ERR_NOMEM, "out of memory writing the model's JSON") : HP_OK;
}
