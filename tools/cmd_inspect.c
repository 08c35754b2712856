/*
 * cmd_inspect.c — `hyperpar inspect PATH [--json] [--tree [--depth N]] [--tensors] [--rank N]`: a model's summary,
 * what a GGUF file holds (the model `hyperpar convert` would write from it, with each tensor's GGUF name and type),
 * or what each rank of a shard folder holds (its tensors at their local shapes, read from the checked rank files).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/convert.h"
#include "hyperpar/model.h"
#include "hyperpar/shard.h"

typedef struct inspect_args {
    bool json, tree, tensors;
    int64_t depth, rank;
    hp_model_opts mo;
} inspect_args;

static const cli_opt g_opts[] = {
    {"json", 'j', NULL, "one JSON object: architecture, model_type, num_params, num_tensors,\n"
                        "total_bytes, dtypes (dtype -> bytes), layers, experts, ...", 0, NULL,
     CLI_FLAG(inspect_args, json)},
    {"tree", 't', NULL, "the module tree with parameter counts per module", 0, NULL, CLI_FLAG(inspect_args, tree)},
    {"depth", 'd', "N", "limit --tree to N levels below the root", 0, NULL, CLI_INT(inspect_args, depth, 0, 1000)},
    {"tensors", 'T', NULL, "list every tensor: name, dtype, shape", 0, NULL, CLI_FLAG(inspect_args, tensors)},
    {"expert-layout", 'L', "L", "meta mode: per-expert (hub names, default) or batched", 0, NULL,
     CLI_FN(inspect_args, mo.layout, cli_layout_fn)},
    {"rank", 'r', "N", "a shard folder: only rank N (default: every rank)", 0, NULL,
     CLI_INT(inspect_args, rank, 0, HP_SHARD_MAX_WORLD - 1)},
    CLI_OPT_HELP,
    {0},
};

const cli_command cli_cmd_inspect = {
    .cmd = "inspect",
    .summary = "summarise a checkpoint folder, .safetensors file, config.json or GGUF\n"
               "file; or what each rank of a shard folder holds",
    .forms = {{NULL, "PATH"}, {NULL, "SHARDS"}},
    .about = "Summarises a model. PATH is a checkpoint folder (model.safetensors or an index with shards),\n"
             "a .safetensors file, or a config.json (meta mode: shapes synthesised, no weights). A GGUF file\n"
             "(llama.cpp) is read directly: the model 'hyperpar convert' writes from it, each tensor under its\n"
             "transformers name and shape with its GGUF name and type (--tensors), and the bytes by GGUF type.\n"
             "SHARDS, a folder written by 'hyperpar shard' (or one rank-NNNNN.safetensors file inside it: that\n"
             "rank), lists what each rank holds: its coordinates, its file, and every tensor with its dtype, local\n"
             "shape, global shape, the slice it keeps of each cut dim ([offset, end) of dim d) and the experts of\n"
             "an expert stack, from the rank files checked against manifest.json; of the options only --rank and\n"
             "--json apply to it.\n",
    .opts = g_opts,
    .run = cmd_inspect,
};

/* Names come from files: a tensor name may hold escape sequences that would drive the terminal. Text output
 * shows them escaped (hp_buf_escape), a backslash doubled so that the output is unambiguous. JSON output needs
 * none of this: jansson escapes control characters itself. */
static const char *esc(hp_buf *b, const char *text)
{
    b->len = 0;
    hp_buf_escape(b, text, HP_ESC_BACKSLASH);
    hp_buf_append(b, "", 1);
    return b->oom || !b->data ? "?" : b->data;
}

static void shape_str(const hp_param *p, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < p->n_dims && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)p->shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Subtree parameter totals, computed bottom-up (modules are in pre-order, children after parents). */
static uint64_t *subtree_totals(const hp_model *m)
{
    uint64_t *tot = calloc(m->n_modules ? m->n_modules : 1, sizeof *tot);
    if (!tot) return NULL;
    for (size_t i = 0; i < m->n_params; i++) tot[m->params[i].module] += (uint64_t)m->params[i].n_elems;
    for (size_t i = m->n_modules; i-- > 1;) tot[m->modules[i].parent] += tot[i];
    return tot;
}

static void print_param_line(const hp_model *m, const hp_param *p, const char *rel, int indent)
{
    char cnt[32], shp[128];
    hp_buf b;
    hp_buf_init(&b);
    shape_str(p, shp, sizeof shp);
    printf("%*s%-*s %15s  %s %s\n", indent, "", 48 - indent > 1 ? 48 - indent : 1, esc(&b, rel),
           hp_format_count((uint64_t)p->n_elems, cnt, sizeof cnt), hp_dtype_name(p->dtype), shp);
    hp_buf_free(&b);
}

/* Prints module i and, in registration order, its parameters and children. Modules without child
 * modules (a Linear, a norm) are folded into their parent's listing as "q_proj.weight" lines, so the tree
 * shows structure rather than one line per weight. */
static void print_module(const hp_model *m, const uint64_t *tot, int i, int max_depth)
{
    const hp_module *mod = &m->modules[i];
    int indent = 2 * mod->depth;
    char cnt[32];
    hp_buf b;
    hp_buf_init(&b);
    printf("%*s%-*s %15s\n", indent, "", 48 - indent > 1 ? 48 - indent : 1, i == 0 ? "(model)" : esc(&b, mod->leaf),
           hp_format_count(tot[i], cnt, sizeof cnt));
    hp_buf_free(&b);
    if ((max_depth >= 0 && mod->depth + 1 > max_depth) || mod->depth >= 200) return;
    size_t skip = i ? strlen(mod->name) + 1 : 0;
    for (int k = 0; k < mod->n_params; k++) {
        const hp_param *p = &m->params[mod->params[k]];
        print_param_line(m, p, p->name + skip, indent + 2);
    }
    for (int ch = mod->first_child; ch >= 0; ch = m->modules[ch].next_sibling) {
        const hp_module *cm = &m->modules[ch];
        if (cm->first_child >= 0) {
            print_module(m, tot, ch, max_depth);
            continue;
        }
        for (int k = 0; k < cm->n_params; k++) {
            const hp_param *p = &m->params[cm->params[k]];
            print_param_line(m, p, p->name + skip, indent + 2);
        }
    }
}

static void print_tree(const hp_model *m, int max_depth)
{
    uint64_t *tot = subtree_totals(m);
    if (!tot) return;
    print_module(m, tot, 0, max_depth);
    free(tot);
}

static int print_json(const hp_model *m, bool tensors)
{
    hp_buf b;
    hp_buf_init(&b);
    hp_err err;
    int rc = hp_model_inspect_json(m, tensors, &b, &err) == HP_OK ? HP_EXIT_OK : cli_fail(&err);
    if (rc == HP_EXIT_OK) fwrite(b.data, 1, b.len, stdout);
    hp_buf_free(&b);
    return rc;
}

static void print_summary(const hp_model *m)
{
    uint64_t by[HP_DT_COUNT];
    hp_model_dtype_bytes(m, by);
    char a[48], b[48];
    hp_buf e1, e2;
    hp_buf_init(&e1);
    hp_buf_init(&e2);
    printf("%-13s %s%s\n", "model", esc(&e1, m->path),
           m->meta ? "  (meta mode: shapes from config.json, no weights)" : "");
    printf("%-13s %s (model_type %s, family %s)\n", "architecture", *m->architecture ? esc(&e1, m->architecture) : "?",
           *m->model_type ? esc(&e2, m->model_type) : "?", m->family ? hp_family_name(m->family) : "unknown");
    if (m->ckpt) {
        /* Which file was read; a folder holding both model.safetensors and an index reads the single file,
         * as transformers does, and says so. */
        const char *src = hp_ckpt_source(m->ckpt), *ign = hp_ckpt_ignored(m->ckpt);
        src = strrchr(src, '/') ? strrchr(src, '/') + 1 : src; /* the folder is on the "model" line */
        if (ign) ign = strrchr(ign, '/') ? strrchr(ign, '/') + 1 : ign;
        printf("%-13s %s (%zu file%s)%s%s%s\n", "weights", esc(&e1, src),
               hp_ckpt_file_count(m->ckpt), hp_ckpt_file_count(m->ckpt) == 1 ? "" : "s", ign ? "; " : "",
               ign ? esc(&e2, ign) : "", ign ? " ignored, as transformers does" : "");
    }
    hp_buf_free(&e1);
    hp_buf_free(&e2);
    bool mla = hp_family_is_mla(m->family); /* its head_dim is only the rope part of a q/k head */
    if (m->cfg.num_hidden_layers && mla)
        printf("%-13s %lld (%lld sparse), hidden %lld, heads %lld, multi-head latent attention:\n%-13s q/k head dim "
               "%lld (nope %lld + rope %lld), v head dim %lld, kv_lora_rank %lld, q_lora_rank %lld\n", "layers",
               (long long)m->cfg.num_hidden_layers, (long long)hp_model_sparse_layers(m), (long long)m->cfg.hidden_size,
               (long long)m->cfg.num_attention_heads, "", (long long)(m->cfg.qk_nope_head_dim + m->cfg.qk_rope_head_dim),
               (long long)m->cfg.qk_nope_head_dim, (long long)m->cfg.qk_rope_head_dim, (long long)m->cfg.v_head_dim,
               (long long)m->cfg.kv_lora_rank, (long long)m->cfg.q_lora_rank);
    else if (m->cfg.num_hidden_layers)
        printf("%-13s %lld (%lld sparse), hidden %lld, heads %lld / kv %lld, head_dim %lld\n", "layers",
               (long long)m->cfg.num_hidden_layers, (long long)hp_model_sparse_layers(m), (long long)m->cfg.hidden_size,
               (long long)m->cfg.num_attention_heads, (long long)m->cfg.num_key_value_heads,
               (long long)m->cfg.head_dim);
    if (m->cfg.n_experts)
        printf("%-13s %lld routed, top-%lld, width %lld, layout %s\n", "experts", (long long)m->cfg.n_experts,
               (long long)m->cfg.num_experts_per_tok, (long long)m->cfg.moe_intermediate_size,
               hp_expert_layout_name(m->layout));
    printf("%-13s %s\n", "parameters", hp_format_count(hp_model_num_params(m), a, sizeof a));
    printf("%-13s %zu in %zu modules\n", "tensors", m->n_params, m->n_modules);
    printf("%-13s %s (%s bytes)\n", "size", hp_format_bytes(hp_model_total_bytes(m), a, sizeof a),
           hp_format_count(hp_model_total_bytes(m), b, sizeof b));
    for (int t = 0; t < HP_DT_COUNT; t++)
        if (by[t]) printf("%-13s   %-6s %s\n", "", hp_dtype_name((hp_dtype)t), hp_format_bytes(by[t], a, sizeof a));
}


/* "[2, 64]" of n dims into buf. */
static const char *dims_str(int n, const int64_t *d, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int k = 0; k < n && o < cap; k++) o += (size_t)snprintf(buf + o, cap - o, "%s%lld", k ? ", " : "", (long long)d[k]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

/* One rank of a shard folder: text lines, or an object appended to arr. */
static void print_rank(const hp_shard_rank_file *f, json_t *arr)
{
    char a[160], b[160], by[32];
    uint64_t total = 0;
    for (size_t i = 0; i < f->n_tensors; i++) total += f->tensors[i].nbytes;
    const char *file = strrchr(f->path, '/') ? strrchr(f->path, '/') + 1 : f->path;
    if (!arr) {
        hp_buf e;
        hp_buf_init(&e);
        hp_buf e2; /* coords and mesh come from the file's __metadata__: escaped like every name */
        hp_buf_init(&e2);
        printf("\nrank %lld  %s  %s", (long long)f->rank, esc(&e2, f->coords), esc(&e, file));
        hp_buf_free(&e2);
        if (f->file_rank != f->rank) printf(" (rank %lld's file, linked)", (long long)f->file_rank);
        printf("  %zu tensors, %s\n", f->n_tensors, hp_format_bytes(total, by, sizeof by));
        for (size_t i = 0; i < f->n_tensors; i++) {
            const hp_shard_tensor *t = &f->tensors[i];
            printf("  %-52s %-4s %-16s", esc(&e, t->name), hp_dtype_name(t->dtype),
                   dims_str(t->n_dims, t->local_shape, a, sizeof a));
            if (t->n_slices || t->stacked || t->expert_count)
                printf(" of %s:", dims_str(t->n_dims, t->global_shape, b, sizeof b));
            else
                printf(" whole");
            for (int k = 0; k < t->n_slices; k++)
                printf(" dim %d [%lld, %lld)", t->slices[k].dim, (long long)t->slices[k].offset,
                       (long long)(t->slices[k].offset + t->slices[k].length));
            if (t->expert_count)
                printf(" experts %lld-%lld", (long long)t->expert_first,
                       (long long)(t->expert_first + t->expert_count - 1));
            printf("\n");
        }
        hp_buf_free(&e);
        return;
    }
    json_t *ts = json_array();
    for (size_t i = 0; i < f->n_tensors; i++) {
        const hp_shard_tensor *t = &f->tensors[i];
        json_t *ls = json_array(), *gs = json_array(), *sl = json_array();
        for (int k = 0; k < t->n_dims; k++) {
            json_array_append_new(ls, json_integer(t->local_shape[k]));
            json_array_append_new(gs, json_integer(t->global_shape[k]));
        }
        for (int k = 0; k < t->n_slices; k++)
            json_array_append_new(sl, json_pack("{s:i, s:I, s:I}", "dim", t->slices[k].dim, "offset",
                                                (json_int_t)t->slices[k].offset, "length",
                                                (json_int_t)t->slices[k].length));
        json_t *o = json_pack("{s:s, s:s, s:o, s:o, s:o}", "name", t->name, "dtype", hp_dtype_name(t->dtype), "shape",
                              ls, "global_shape", gs, "slices", sl);
        if (t->expert_count)
            json_object_set_new(o, "experts", json_pack("[I, I]", (json_int_t)t->expert_first,
                                                        (json_int_t)t->expert_count));
        if (t->stacked) { /* the per-expert parameters the stack holds, in expert order */
            json_t *g = json_array();
            for (int k = 0; k < t->n_globals; k++) json_array_append_new(g, json_string(t->globals[k]));
            json_object_set_new(o, "globals", g);
        }
        json_array_append_new(ts, o);
    }
    json_array_append_new(arr, json_pack("{s:I, s:s, s:s, s:I, s:I, s:o}", "rank", (json_int_t)f->rank, "coords",
                                         f->coords, "file", file, "file_rank", (json_int_t)f->file_rank, "bytes",
                                         (json_int_t)total, "tensors", ts));
}

/* inspect SHARDS [--rank N]: each rank's file opened and checked as run opens it (hp_shard_rank_open). */
static int inspect_shards(const char *dir, int64_t only, bool json)
{
    hp_err err;
    hp_shard_rank_file *f = NULL;
    if (hp_shard_rank_open(&f, dir, only >= 0 ? only : 0, &err) != HP_OK) return cli_fail(&err);
    int64_t world = f->world;
    char mesh[256];
    snprintf(mesh, sizeof mesh, "%s", f->mesh);
    json_t *ranks = json ? json_array() : NULL;
    if (!json) {
        hp_buf e;
        hp_buf_init(&e);
        printf("%-13s %s (written by 'hyperpar shard')\n", "shards", esc(&e, dir));
        printf("%-13s %s (world %lld)%s\n", "mesh", esc(&e, mesh), (long long)world,
               only >= 0 ? "" : "; each rank's tensors below (--rank N for one)");
        hp_buf_free(&e);
    }
    int rc = HP_EXIT_OK;
    for (int64_t r = only >= 0 ? only : 0; r < (only >= 0 ? only + 1 : world); r++) {
        if (!f && hp_shard_rank_open(&f, dir, r, &err) != HP_OK) {
            rc = cli_fail(&err);
            break;
        }
        print_rank(f, ranks);
        hp_shard_rank_close(f);
        f = NULL;
    }
    hp_shard_rank_close(f);
    if (json) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:o}", "shards", dir, "mesh", mesh, "world", (json_int_t)world,
                              "ranks", ranks);
        char *s = rc == HP_EXIT_OK ? json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
        json_decref(o);
        if (rc == HP_EXIT_OK && !s) return HP_EXIT_RUNTIME;
        if (s) puts(s);
        free(s);
    }
    return rc;
}

/* A rank-NNNNN.safetensors file inside a shard folder: its folder and rank (the folder's config.json describes
 * the whole model, not the file, so the file is shown as that rank of the folder). */
static bool shard_rank_path(const char *path, char *dir, size_t cap, int64_t *rank)
{
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    long long r;
    int used = -1;
    if (sscanf(base, "rank-%5lld.safetensors%n", &r, &used) != 1 || used < 0 || base[used] || strlen(base) != 22)
        return false;
    snprintf(dir, cap, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (slash == path) snprintf(dir, cap, "/");
    if (!hp_shard_is_folder(dir)) return false;
    *rank = r;
    return true;
}

/* ---- a GGUF file: the model convert writes from it ---- */

/* Bytes and tensors of each GGUF type in the file. */
static void gguf_type_totals(const hp_gguf_file *f, uint64_t bytes[HP_GGML_TYPE_END], size_t count[HP_GGML_TYPE_END])
{
    memset(bytes, 0, HP_GGML_TYPE_END * sizeof *bytes);
    memset(count, 0, HP_GGML_TYPE_END * sizeof *count);
    for (size_t i = 0; i < hp_gguf_tensor_count(f); i++) {
        const hp_gguf_tensor *t = hp_gguf_tensor_at(f, i);
        bytes[t->type] += t->nbytes;
        count[t->type]++;
    }
}

static void print_gguf_summary(const hp_gguf_model *g)
{
    const hp_gguf_file *f = g->file;
    const hp_model *m = g->model;
    uint64_t bytes[HP_GGML_TYPE_END];
    size_t count[HP_GGML_TYPE_END];
    gguf_type_totals(f, bytes, count);
    char a[48], b[48];
    hp_buf e;
    hp_buf_init(&e);
    printf("%-13s %s  (GGUF version %u, %zu metadata keys, %zu tensors)\n", "model", esc(&e, hp_gguf_path(f)),
           hp_gguf_version(f), hp_gguf_kv_count(f), hp_gguf_tensor_count(f));
    printf("%-13s %s (model_type %s, family %s; GGUF architecture %s)\n", "architecture", esc(&e, m->architecture),
           m->model_type, m->family ? hp_family_name(m->family) : "unknown", g->arch);
    hp_buf_free(&e);
    printf("%-13s %lld, hidden %lld, heads %lld / kv %lld, head_dim %lld, vocab %lld%s\n", "layers",
           (long long)m->cfg.num_hidden_layers, (long long)m->cfg.hidden_size, (long long)m->cfg.num_attention_heads,
           (long long)m->cfg.num_key_value_heads, (long long)m->cfg.head_dim, (long long)m->cfg.vocab_size,
           g->tied ? ", tied embeddings" : "");
    printf("%-13s %s\n", "parameters", hp_format_count(hp_model_num_params(m), a, sizeof a));
    printf("%-13s %zu in %zu modules (transformers' names, as 'hyperpar convert' writes them)\n", "tensors",
           m->n_params, m->n_modules);
    printf("%-13s %s (%s bytes)\n", "file size", hp_format_bytes(hp_gguf_file_size(f), a, sizeof a),
           hp_format_count(hp_gguf_file_size(f), b, sizeof b));
    for (unsigned t = 0; t < HP_GGML_TYPE_END; t++)
        if (count[t])
            printf("%-13s   %-6s %s in %zu tensor%s\n", "", hp_ggml_type_name(t),
                   hp_format_bytes(bytes[t], a, sizeof a), count[t], count[t] == 1 ? "" : "s");
    printf("%-13s %s as BF16, %s as F32\n", "converted", hp_format_bytes(hp_model_num_params(m) * 2, a, sizeof a),
           hp_format_bytes(hp_model_num_params(m) * 4, b, sizeof b));
}

/* inspect --json of a GGUF file: the model's object, plus "gguf": the file's version and bytes by type, and with
 * --tensors each tensor's GGUF name, type and dims. */
static int print_gguf_json(const hp_gguf_model *g, bool tensors)
{
    hp_buf b;
    hp_buf_init(&b);
    hp_err err;
    if (hp_model_inspect_json(g->model, tensors, &b, &err) != HP_OK) {
        hp_buf_free(&b);
        return cli_fail(&err);
    }
    json_t *o = json_loadb(b.data, b.len, 0, NULL);
    hp_buf_free(&b);
    if (!o) return HP_EXIT_RUNTIME;
    uint64_t bytes[HP_GGML_TYPE_END];
    size_t count[HP_GGML_TYPE_END];
    gguf_type_totals(g->file, bytes, count);
    json_t *types = json_object(), *list = json_array();
    for (unsigned t = 0; t < HP_GGML_TYPE_END; t++)
        if (count[t]) json_object_set_new(types, hp_ggml_type_name(t), json_integer((json_int_t)bytes[t]));
    for (size_t i = 0; tensors && i < g->n_tensors; i++) {
        const hp_gguf_mapped *mt = &g->tensors[i];
        json_t *ne = json_array();
        for (int d = 0; d < mt->src->n_dims; d++) json_array_append_new(ne, json_integer(mt->src->ne[d]));
        json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:o, s:b}", "name", mt->name, "gguf_name", mt->src->name,
                                              "gguf_type", hp_ggml_type_name(mt->src->type), "gguf_dims", ne,
                                              "rotary_rows_permuted", mt->permute_heads > 0));
    }
    json_t *gg = json_pack("{s:i, s:s, s:I, s:I, s:o}", "version", (int)hp_gguf_version(g->file), "architecture",
                           g->arch, "file_size", (json_int_t)hp_gguf_file_size(g->file), "tensor_count",
                           (json_int_t)hp_gguf_tensor_count(g->file), "bytes_by_type", types);
    if (tensors) json_object_set_new(gg, "tensors", list);
    else json_decref(list);
    json_object_set_new(o, "mode", json_string("gguf")); /* shapes from the GGUF file, weights not read */
    json_object_set_new(o, "gguf", gg);
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!s) return HP_EXIT_RUNTIME;
    puts(s);
    free(s);
    return HP_EXIT_OK;
}

static int inspect_gguf(const char *path, bool json, bool tree, bool tensors, int64_t depth)
{
    hp_err err;
    hp_gguf_file *f = NULL;
    hp_gguf_model *g = NULL;
    if (hp_gguf_open(&f, path, &err) != HP_OK || hp_gguf_model_map(&g, f, HP_DT_BF16, &err) != HP_OK) {
        hp_gguf_close(f);
        return cli_fail(&err);
    }
    int rc = HP_EXIT_OK;
    if (json) {
        rc = print_gguf_json(g, tensors);
    } else {
        print_gguf_summary(g);
        if (tree) {
            printf("\n");
            print_tree(g->model, (int)depth);
        }
        if (tensors) {
            char shp[128];
            hp_buf b, c;
            hp_buf_init(&b);
            hp_buf_init(&c);
            printf("\n");
            for (size_t i = 0; i < g->n_tensors; i++) {
                const hp_gguf_mapped *mt = &g->tensors[i];
                const hp_param *p = hp_model_find_param(g->model, mt->name);
                shape_str(p, shp, sizeof shp);
                printf("%s %s %s <- %s%s\n", esc(&b, mt->name), hp_ggml_type_name(mt->src->type), shp,
                       esc(&c, mt->src->name), mt->permute_heads ? " (rotary rows permuted)" : "");
            }
            hp_buf_free(&b);
            hp_buf_free(&c);
        }
    }
    hp_gguf_model_free(g);
    hp_gguf_close(f);
    return rc;
}

int cmd_inspect(int argc, char **argv)
{
    inspect_args a = {.depth = -1, .rank = -1, .mo = {.layout = HP_LAYOUT_PER_EXPERT}};
    cli_parser cp = {.command = &cli_cmd_inspect};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    bool json = a.json, tree = a.tree, tensors = a.tensors;
    int64_t depth = a.depth, rank = a.rank;
    hp_model_opts mo = a.mo;
    if (optind != argc - 1) return cli_usage_error("inspect", "expected exactly one PATH");
    if (depth >= 0 && !tree) return cli_usage_error("inspect", "--depth limits the --tree listing; add --tree");
    const char *path = argv[optind];
    char dir[4200];
    int64_t file_rank;
    bool folder = hp_shard_is_folder(path), rank_file = !folder && shard_rank_path(path, dir, sizeof dir, &file_rank);
    if ((folder || rank_file) && (tree || tensors || mo.layout != HP_LAYOUT_PER_EXPERT))
        return cli_usage_error("inspect", "%s is %s of a shard folder: it lists each rank's tensors itself; --tree, "
                               "--tensors and --expert-layout describe a checkpoint", path,
                               folder ? "the whole" : "one rank file");
    if (rank_file && rank >= 0 && rank != file_rank)
        return cli_usage_error("inspect", "--rank %lld, but %s is rank %lld's file", (long long)rank, path,
                               (long long)file_rank);
    if (!folder && !rank_file && rank >= 0)
        return cli_usage_error("inspect", "--rank picks a rank of a shard folder; %s is not one", path);
    if (folder) return inspect_shards(path, rank, json);
    if (rank_file) return inspect_shards(dir, file_rank, json);
    if (hp_gguf_is_gguf(path)) {
        if (mo.layout != HP_LAYOUT_PER_EXPERT)
            return cli_usage_error("inspect", "%s is a GGUF file; --expert-layout describes a config.json", path);
        return inspect_gguf(path, json, tree, tensors, depth);
    }

    hp_err err;
    hp_model *m = NULL;
    if (hp_model_open(&m, argv[optind], &mo, &err) != HP_OK) return cli_fail(&err);
    int rc = HP_EXIT_OK;
    if (json) {
        rc = print_json(m, tensors);
    } else {
        print_summary(m);
        if (tree) {
            printf("\n");
            print_tree(m, (int)depth);
        }
        if (tensors) {
            char shp[128];
            hp_buf b;
            hp_buf_init(&b);
            printf("\n");
            for (size_t i = 0; i < m->n_params; i++) {
                shape_str(&m->params[i], shp, sizeof shp);
                printf("%s %s %s\n", esc(&b, m->params[i].name), hp_dtype_name(m->params[i].dtype), shp);
            }
            hp_buf_free(&b);
        }
    }
    hp_model_close(m);
    return rc;
}
