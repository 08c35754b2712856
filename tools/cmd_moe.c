/*
 * cmd_moe.c — `hyperpar moe MODEL --layer L --input X.safetensors --output Y.safetensors ...`: runs one
 * sparse layer in one process, or expert-parallel under mpirun (run_ep: row blocks, agreement on what each
 * rank read, gather to rank 0, errors printed once), and writes y, topk_idx and topk_w; optionally verifies
 * them against a reference file (golden moe_io.safetensors) and exits 3 on a mismatch.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "hyperpar/comm.h"
#include "hyperpar/moe.h"
#include "hyperpar/run.h"
#include "hyperpar/shard.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"

typedef struct moe_args {
    const char *model, *input, *output, *compare, *prefix, *archetype, *cf_text;
    const char *mesh, *overrides;
    int64_t layer, threads, ep, chunks;
    double cf, rtol;
    hp_moe_cap_policy policy;
    hp_linalg_mode compute;
    bool overlap;
} moe_args;

static bool cf_fn(const cli_ctx *x);

static bool policy_fn(const cli_ctx *x);

#define G_EP "expert parallelism (under mpirun)"
static const cli_opt g_opts[] = {
    {"layer", 'l', "L", "decoder layer index (must be sparse)", 0, NULL, CLI_INT(moe_args, layer, 0, 1 << 20)},
    {"input", 'i', "X", "safetensors file holding 'x'", 0, NULL, CLI_STR(moe_args, input)},
    {"output", 'o', "Y", "output file (written atomically); optional with --compare", 0, NULL,
     CLI_STR(moe_args, output)},
    {"archetype", 'a', "A", "the EP compute archetype, one of those listed below\n"
                            "(default: the family's suggestion, printed)", 0, NULL, CLI_STR(moe_args, archetype)},
    {"capacity-factor", 'c', "F", "capacity = ceil(F*T*K/E) slots per expert; 0 = off (default)", 0, NULL,
     CLI_REAL(moe_args, cf, 0, HUGE_VAL, CLI_HI_OPEN, "a non-negative number"), .fn = cf_fn},
    {"capacity-policy", 'p', "P", "score (keep the heaviest slots, default) or first (token order)", 0, NULL,
     CLI_FN(moe_args, policy, policy_fn)},
    {"threads", 't', "N", "OpenMP and BLAS threads per rank (default: OMP_NUM_THREADS when set, else this\n"
                          "process's cores divided by the ranks the launcher started on this node)", 0, NULL,
     CLI_INT(moe_args, threads, 1, 4096)},
    {"compute", 'X', "M", "exact (default: f32 activations, bf16 weights widened exactly, f32 sums)\n"
                          "or bf16 (activations rounded to bf16 for the expert products, f32 sums;\n"
                          "what PyTorch does for a bf16 model; docs/kernels.md gives its error)", 0, NULL,
     CLI_ENUM(moe_args, compute, cli_enum_compute)},
    {"compare", 'C', "REF", "verify against REF's <P>y (or <P>y_cf<F>), <P>topk_idx, <P>topk_w:\n"
                            "|y-ref| <= 1e-4*max|ref|, topk_idx equal, |topk_w-ref| <= 1e-5; exit 3 if not", 0, NULL,
     CLI_STR(moe_args, compare)},
    {"ref-prefix", 'P', "P", "key prefix in REF (default 'layers.L.'; '' for an output of hyperpar moe)", 0, NULL,
     CLI_STR(moe_args, prefix)},
    {"compare-rtol", 'R', "R", "tolerances R*max|ref| for y and R for topk_w instead of 1e-4 / 1e-5", 0, NULL,
     CLI_RTOL(moe_args, rtol)},
    CLI_OPT_HELP,
    {"ep", CLI_O_EP, "E", "EP group size (default: every rank)", 0, G_EP,
     CLI_DIGITS(moe_args, ep, 1, HP_MESH_MAX_SIZE)},
    {"mesh", CLI_O_MESH, "SPEC", "the mesh, e.g. dp=2,tp=2 (default dp=N); its product must equal N", 0, G_EP,
     CLI_STR(moe_args, mesh)},
    {"overrides", CLI_O_OVERRIDES, "FILE", "plan overrides declaring the layer's local_compute_fn (the archetype);\n"
                                           "with --ep > 1 the archetype must be chosen explicitly: --archetype or\n"
                                           "this", 0, G_EP, CLI_STR_NONEMPTY(moe_args, overrides, "a file name")},
    {"overlap", 'v', NULL, "non-blocking token exchange; the shared expert runs while it is in flight", 0, G_EP,
     CLI_FLAG(moe_args, overlap)},
    {"dispatch-chunks", 'D', "C", "exchange the local tokens in C chunks (1..64, default 1), chunk c+1's rows\n"
                                  "in flight while chunk c's experts run; same routing and capacity, y within\n"
                                  "1e-6*max|y| of one chunk (BLAS rounds differently for other row counts)", 0, G_EP,
     CLI_INT(moe_args, chunks, 1, 64)},
    {0},
};

static void archetypes(FILE *out)
{
    fprintf(out,
            "Archetypes: %s.\n"
            "A non-finite output is an error naming the row and its likely cause (exit 2).\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 bad input, 3 --compare mismatch.\n",
            hp_moe_archetype_list());
}

const cli_command cli_cmd_moe = {
    .cmd = "moe",
    .summary = "run one sparse (MoE) layer of a checkpoint on an input file",
    .forms = {{NULL, "MODEL --layer --input --output"}, {"mpirun -np N", "MODEL --layer --ep --input --output"}},
    .about = "Runs the MoE block of sparse layer L of a checkpoint on the rows of X's tensor 'x' [T, H] (f32)\n"
             "and writes 'y' [T, H] f32, 'topk_idx' [T, K] i32 and 'topk_w' [T, K] f32 (each row sorted by\n"
             "expert id ascending). Statistics go to stderr. MODEL may also be a folder written by 'hyperpar\n"
             "shard' (it holds manifest.json): each rank then loads its own rank file (docs/moe.md).\n"
             "\n"
             "Expert parallelism (under mpirun): every rank reads the same X and MODEL (checked: rows, a hash\n"
             "of X and of the weights) and takes the r-th contiguous block of rows, the first T mod N ranks one\n"
             "row more (ranks past the end of a short X hold none); EP groups are E consecutive ranks of the\n"
             "mesh (TP-extend-EP) or the mesh's explicit ep axis; each rank loads only its E/ep experts and\n"
             "applies the capacity factor to its own block; rank 0 writes the output rows in the original order.\n",
    .opts = g_opts,
    .epilog_more = archetypes,
    .run = cmd_moe,
};

static bool policy_fn(const cli_ctx *x)
{
    if (hp_moe_cap_policy_parse(x->arg, cli_target(x))) return true;
    return cli_usage_error(x->cmd, "--capacity-policy expects score or first, got '%s'", x->arg), false;
}

/* --capacity-factor: its text too, as the reference's key names it (y_cf<F>). */
static bool cf_fn(const cli_ctx *x)
{
    ((moe_args *)x->args)->cf_text = x->arg;
    return true;
}

/* Reads tensor `name` of f into a malloc'd buffer of n_elems elements of dtype dt and the given rank. */
static hp_status read_tensor(const hp_st_file *f, const char *name, hp_dtype dt, int n_dims, void **out,
                             const hp_st_tensor **tout, hp_err *err)
{
    *out = NULL;
    const hp_st_tensor *t = hp_st_find(f, name);
    if (!t)
        return hp_err_set(err, HP_ERR_INPUT, "%s: no tensor '%s'", hp_st_path(f), name);
    if (t->dtype != dt || t->n_dims != n_dims)
        return hp_err_set(err, HP_ERR_INPUT, "%s: tensor '%s' is %s with %d dims; expected %s with %d dims",
                          hp_st_path(f), name, hp_dtype_name(t->dtype), t->n_dims, hp_dtype_name(dt), n_dims);
    size_t bytes = (size_t)(t->end - t->begin);
    *out = malloc(bytes ? bytes : 1);
    if (!*out) return hp_err_set(err, HP_ERR_NOMEM, "out of memory reading '%s'", name);
    hp_status st = hp_st_read(f, t, 0, *out, bytes, err); /* a file truncated meanwhile: an error, not SIGBUS */
    if (st != HP_OK) {
        free(*out);
        *out = NULL;
        return st;
    }
    if (tout) *tout = t;
    return HP_OK;
}

/* The model: a checkpoint, or a shard folder's config.json (the weights then come from a rank file). */
static hp_status open_model(const char *path, hp_model **m, hp_err *err)
{
    return hp_shard_is_folder(path) ? hp_moe_shard_config_open(m, path, err) : hp_model_open(m, path, NULL, err);
}

/* Layer L with the local experts of lo: from the checkpoint, or from rank `rank`'s file of a shard folder. */
static hp_status load_layer(const char *path, const hp_model *m, int64_t rank, int64_t layer,
                            const hp_moe_load_opts *lo, hp_moe_layer **l, hp_err *err)
{
    return hp_shard_is_folder(path) ? hp_moe_layer_load_shard(l, path, m, rank, layer, lo, err)
                              : hp_moe_layer_load(l, m, layer, lo, err);
}


/* Compares the outputs with the reference; HP_ERR_VERIFY with the figures on a mismatch. */
static hp_status compare(const moe_args *a, const hp_moe_ws *ws, const float *y, int64_t T, int64_t H, int64_t K,
                         hp_err *err)
{
    hp_st_file *f = NULL;
    hp_status st = hp_st_open(&f, a->compare, err);
    if (st) return st;
    char pfx[96], key[160];
    if (a->prefix)
        snprintf(pfx, sizeof pfx, "%s", a->prefix);
    else
        snprintf(pfx, sizeof pfx, "layers.%lld.", (long long)a->layer);
    float *ry = NULL, *rw = NULL;
    int32_t *ri = NULL;
    const hp_st_tensor *t = NULL;
    if (a->cf > 0) {
        snprintf(key, sizeof key, "%sy_cf%s", pfx, a->cf_text);
        if (!hp_st_find(f, key)) snprintf(key, sizeof key, "%sy_cf%.1f", pfx, a->cf);
        if (!hp_st_find(f, key)) snprintf(key, sizeof key, "%sy", pfx); /* an output file of hyperpar moe */
    } else {
        snprintf(key, sizeof key, "%sy", pfx);
    }
    st = read_tensor(f, key, HP_DT_F32, 2, (void **)&ry, &t, err);
    if (!st && (t->shape[0] != T || t->shape[1] != H))
        st = hp_err_set(err, HP_ERR_INPUT, "%s: '%s' is [%lld, %lld] but y is [%lld, %lld]", a->compare, key,
                        (long long)t->shape[0], (long long)t->shape[1], (long long)T, (long long)H);
    if (!st) {
        snprintf(key, sizeof key, "%stopk_idx", pfx);
        st = read_tensor(f, key, HP_DT_I32, 2, (void **)&ri, &t, err);
        if (!st && t->n_elems != T * K)
            st = hp_err_set(err, HP_ERR_INPUT, "%s: '%s' has %lld entries, expected %lld", a->compare, key,
                            (long long)t->n_elems, (long long)(T * K));
    }
    if (!st) {
        snprintf(key, sizeof key, "%stopk_w", pfx);
        st = read_tensor(f, key, HP_DT_F32, 2, (void **)&rw, &t, err);
        if (!st && t->n_elems != T * K)
            st = hp_err_set(err, HP_ERR_INPUT, "%s: '%s' has %lld entries, expected %lld", a->compare, key,
                            (long long)t->n_elems, (long long)(T * K));
    }
    if (!st) {
        double dw = 0;
        int64_t bad_idx = 0, first_bad = -1;
        for (int64_t s = 0; s < T * K; s++) {
            if (ws->topk_idx[s] != ri[s] && bad_idx++ == 0) first_bad = s;
            dw = fmax(dw, fabs((double)ws->topk_w[s] - rw[s]));
        }
        double rtol = a->rtol > 0 ? a->rtol : 1e-4, wtol = a->rtol > 0 ? a->rtol : 1e-5;
        hp_tol yt; /* the one tolerance check (hyperpar/run.h), as run --compare and validate use it */
        int64_t shape[2] = {T, H};
        hp_tol_check(y, ry, 2, shape, rtol, &yt);
        double dy = yt.max_diff, tol = yt.tol;
        bool ok = yt.ok && bad_idx == 0 && dw <= wtol;
        fprintf(stderr, "compare %s (%s*): y max diff %.3g (tolerance %.3g), topk_idx %lld of %lld differ, "
                        "topk_w max diff %.3g (tolerance %.0e): %s\n",
                a->compare, pfx, dy, tol, (long long)bad_idx, (long long)(T * K), dw, wtol, ok ? "OK" : "MISMATCH");
        if (!ok)
            st = hp_err_set(err, HP_ERR_VERIFY,
                            "layer %lld differs from %s: y max diff %.3g (tolerance %.3g), %lld topk_idx entries "
                            "differ (first at token %lld), topk_w max diff %.3g",
                            (long long)a->layer, a->compare, dy, tol, (long long)bad_idx,
                            (long long)(first_bad >= 0 ? first_bad / K : -1), dw);
    }
    free(ry);
    free(ri);
    free(rw);
    hp_st_close(f);
    return st;
}

static hp_status write_output(const char *path, const hp_moe_layer *l, const hp_moe_ws *ws, const float *y,
                              int64_t T, hp_err *err)
{
    hp_st_writer *w = hp_st_writer_create();
    if (!w) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int64_t sy[2] = {T, l->n_hidden}, sk[2] = {T, l->top_k};
    char layer[32];
    snprintf(layer, sizeof layer, "%lld", (long long)l->layer);
    hp_status st = hp_st_writer_set_metadata(w, "archetype", hp_moe_archetype_name(l->archetype), err);
    if (!st) st = hp_st_writer_set_metadata(w, "layer", layer, err);
    if (!st) st = hp_st_writer_add(w, "y", HP_DT_F32, 2, sy, y, err);
    if (!st) st = hp_st_writer_add(w, "topk_idx", HP_DT_I32, 2, sk, ws->topk_idx, err);
    if (!st) st = hp_st_writer_add(w, "topk_w", HP_DT_F32, 2, sk, ws->topk_w, err);
    if (!st) st = hp_st_writer_write(w, path, err);
    hp_st_writer_destroy(w);
    return st;
}

static void print_stats(const hp_moe_layer *l, const hp_moe_ws *ws, const moe_args *a, double secs)
{
    const hp_moe_stats *s = &ws->stats;
    char rb[32];
    fprintf(stderr,
            "layer %lld (%s): %lld tokens, top-%lld of %lld experts, %s %s weights, resident %s (%s%s), "
            "compute %s, %.3f ms\n",
            (long long)l->layer, hp_moe_archetype_name(l->archetype), (long long)s->n_tokens, (long long)l->top_k,
            (long long)l->n_experts, l->storage, hp_dtype_name(l->dtype), l->w_dtype == HP_DT_BF16 ? "bf16" : "f32",
            hp_format_bytes(hp_moe_layer_expert_bytes(l), rb, sizeof rb), l->zero_copy ? ", mapped" : "",
            l->compute == HP_LINALG_BF16 ? "bf16" : "exact", secs * 1e3);
    fprintf(stderr, "tokens per expert:");
    for (int64_t e = 0; e < l->n_local; e++)
        fprintf(stderr, "%s%lld:%lld", e % 16 ? " " : "\n  ", (long long)(l->first_expert + e),
                (long long)ws->counts[e]);
    fprintf(stderr, "\n");
    if (a->cf > 0)
        fprintf(stderr, "capacity factor %s (%s): capacity %lld slots per expert, dropped %lld of %lld slots\n",
                a->cf_text, a->policy == HP_MOE_CAP_SCORE ? "score" : "first", (long long)s->capacity,
                (long long)s->n_dropped, (long long)s->n_slots);
    else
        fprintf(stderr, "capacity factor off: dropped 0 of %lld slots\n", (long long)s->n_slots);
}

static int run(const moe_args *a)
{
    hp_err err;
    hp_model *m = NULL;
    hp_moe_layer *l = NULL;
    hp_moe_ws *ws = NULL;
    hp_st_file *in = NULL;
    float *x = NULL, *y = NULL;
    hp_moe_load_opts lo;
    hp_moe_load_opts_default(&lo);
    lo.compute = a->compute;
    hp_status st = open_model(a->model, &m, &err);
    if (!st && a->archetype) {
        hp_moe_archetype arch = HP_MOE_ROUTED_ONLY_SOFTMAX_TOPK;
        if (!hp_moe_archetype_parse(a->archetype, &arch))
            st = hp_err_set(&err, HP_ERR_INPUT, "unknown archetype '%s'; known: %s", a->archetype,
                            hp_moe_archetype_list());
        lo.archetype = (int)arch;
    }
    if (!st) st = load_layer(a->model, m, 0, a->layer, &lo, &l, &err);
    if (!st && !a->archetype)
        fprintf(stderr, "hyperpar moe: archetype %s (suggested for family %s; choose another with --archetype)\n",
                hp_moe_archetype_name(l->archetype), m->model_type);
    const hp_st_tensor *xt = NULL;
    if (!st) st = hp_st_open(&in, a->input, &err);
    if (!st) st = read_tensor(in, "x", HP_DT_F32, 2, (void **)&x, &xt, &err);
    int64_t T = xt ? xt->shape[0] : 0;
    if (!st && xt->shape[1] != l->n_hidden)
        st = hp_err_set(&err, HP_ERR_INPUT,
                        "%s: tensor 'x' is [%lld, %lld] but layer %lld has hidden size %lld; expected [T, %lld]",
                        a->input, (long long)T, (long long)xt->shape[1], (long long)a->layer,
                        (long long)l->n_hidden, (long long)l->n_hidden);
    if (!st && T < 1) st = hp_err_set(&err, HP_ERR_INPUT, "%s: tensor 'x' has no rows", a->input);
    if (!st) st = hp_moe_ws_create(&ws, l, T, &err);
    if (!st && !(y = malloc((size_t)(T * l->n_hidden) * sizeof *y)))
        st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory");
    double t0 = hp_comm_wtime(), t1 = t0;
    if (!st) {
        hp_moe_run_opts ro = {.capacity_factor = a->cf, .policy = a->policy};
        st = hp_moe_forward(l, ws, x, T, l->n_hidden, y, &ro, &err);
        t1 = hp_comm_wtime();
        if (st) hp_err_prefix(&err, "%s", a->input);
    }
    if (!st) print_stats(l, ws, a, t1 - t0);
    if (!st && a->output) st = write_output(a->output, l, ws, y, T, &err);
    if (!st && a->compare) st = compare(a, ws, y, T, l->n_hidden, l->top_k, &err);
    free(x);
    free(y);
    hp_st_close(in);
    hp_moe_ws_destroy(ws);
    hp_moe_layer_free(l);
    hp_model_close(m);
    return st ? cli_fail(&err) : HP_EXIT_OK;
}


/* ---- expert parallelism over MPI (the orchestration is the runtime's hp_run_moe) ---- */

/* How a run under mpirun ends: an agreed error is the same on every rank, so rank 0 prints it once (the
 * others wait at a barrier so that mpirun does not end rank 0 before it has printed); an error only this
 * rank has (a failed split or collective) is printed by this rank, named. */
/* "rank 3" or "ranks 0..2". */
static const char *ranks_str(int64_t a, int64_t b, char *buf, size_t cap)
{
    if (a == b) snprintf(buf, cap, "rank %lld", (long long)a);
    else snprintf(buf, cap, "ranks %lld..%lld", (long long)a, (long long)b);
    return buf;
}

static void print_ep_stats(const moe_args *a, const hp_run_moe_result *res, int N, const char *backend)
{
    const int64_t T = res->T, q = T / N, rem = T % N;
    char b1[32], cbuf[32] = "";
    if (a->chunks > 1) snprintf(cbuf, sizeof cbuf, ", %d dispatch chunks", (int)a->chunks);
    if (res->archetype_suggested)
        fprintf(stderr, "hyperpar moe: archetype %s (suggested for this family; choose another with --archetype)\n",
                hp_moe_archetype_name(res->archetype));
    fprintf(stderr,
            "layer %lld (%s): %lld tokens on %d ranks (EP groups of %lld, %lld experts each), %s%s%s; %.3f ms "
            "(slowest rank)\n"
            "rows per rank: %lld", (long long)res->layer, hp_moe_archetype_name(res->archetype), (long long)T, N,
            (long long)res->ep, (long long)res->n_local, backend, a->overlap ? ", overlap" : "", cbuf,
            res->seconds * 1e3, (long long)q + (rem > 0));
    char r1[48], r2[48];
    if (rem > 0)
        fprintf(stderr, " on %s, %lld on %s", ranks_str(0, rem - 1, r1, sizeof r1), (long long)q,
                ranks_str(rem, N - 1, r2, sizeof r2));
    fprintf(stderr, " (rank r takes the r-th contiguous block)\n"
                    "rows computed %.0f, slots dropped %.0f of %lld, bytes exchanged %s\n",
            res->rows_computed, res->slots_dropped, (long long)(T * res->K),
            hp_format_bytes((uint64_t)res->bytes_exchanged, b1, sizeof b1));
}

static int run_ep(moe_args *a, int *argc, char ***argv)
{
    hp_err err;
    hp_err_clear(&err);
    hp_comm *world = NULL;
    if (hp_comm_world(&world, argc, argv, &err) != HP_OK) return cli_fail(&err);
    const int N = hp_comm_size(world), R = hp_comm_rank(world);
    hp_st_file *in = NULL;
    float *xall = NULL;
    hp_run_moe_result res = {0};
    bool agreed = false;
    hp_status st = HP_OK;

    /* --output is none of the inputs (checked on every rank, agreed below, so printed once). */
    char omsg[8400];
    const char *const inputs[] = {a->input, a->compare, a->overrides};
    if (a->output && cli_output_problem("--output", a->output, a->model, inputs, 3, omsg, sizeof omsg))
        st = hp_err_set(&err, HP_ERR_INPUT, "moe: %s", omsg);
    const hp_st_tensor *xt = NULL;
    if (st == HP_OK) st = hp_st_open(&in, a->input, &err);
    if (st == HP_OK) st = read_tensor(in, "x", HP_DT_F32, 2, (void **)&xall, &xt, &err);
    if (st == HP_OK && xt->shape[0] < 1) st = hp_err_set(&err, HP_ERR_INPUT, "%s: tensor 'x' has no rows", a->input);
    st = hp_comm_agree(world, st, &err);
    agreed = st != HP_OK;
    if (st == HP_OK) {
        hp_run_moe_opts ro = {.model = a->model, .layer = a->layer, .mesh = a->mesh, .ep = a->ep,
                              .archetype = a->archetype, .overrides = a->overrides, .capacity_factor = a->cf,
                              .policy = a->policy, .overlap = a->overlap, .chunks = a->chunks, .compute = a->compute};
        st = hp_run_moe(world, &ro, xall, xt->shape[0], xt->shape[1], &res, &err);
        agreed = res.agreed;
        if (st == HP_ERR_INPUT && strstr(err.msg, "tensor 'x'") == err.msg) hp_err_prefix(&err, "%s", a->input);
    }
    bool ran = st == HP_OK; /* a failure inside hp_run_moe that is this rank's alone is not agreed again */
    if (st == HP_OK && res.cf_from_plan) {
        a->cf = res.capacity_factor;
        a->cf_text = "plan";
    }
    if (st == HP_OK && R == 0) {
        print_ep_stats(a, &res, N, hp_comm_backend(world));
        hp_moe_ws tmp = {.topk_idx = res.topk_idx, .topk_w = res.topk_w};
        hp_moe_layer meta = {.n_hidden = res.H, .top_k = res.K, .layer = res.layer, .archetype = res.archetype};
        if (a->output) st = write_output(a->output, &meta, &tmp, res.y, res.T, &err);
        if (st == HP_OK && a->compare) st = compare(a, &tmp, res.y, res.T, res.H, res.K, &err);
    }
    if (ran) {
        st = hp_comm_agree(world, st, &err);
        agreed = st != HP_OK;
    }
    free(xall);
    hp_st_close(in);
    hp_run_moe_result_free(&res);
    int code = cli_collective_exit(world, st, &err, agreed);
    hp_comm_free(world);
    return code;
}

int cmd_moe(int argc, char **argv)
{
    moe_args a = {.layer = -1};
    cli_parser cp = {.command = &cli_cmd_moe};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    if (optind >= argc) return cli_usage_error("moe", "missing MODEL");
    if (optind + 1 != argc) return cli_usage_error("moe", "unexpected argument '%s'", argv[optind + 1]);
    a.model = argv[optind];
    if (a.layer < 0) return cli_usage_error("moe", "missing --layer L");
    if (!a.input) return cli_usage_error("moe", "missing --input X.safetensors");
    if (!a.output && !a.compare) return cli_usage_error("moe", "missing --output Y.safetensors (or --compare REF)");
    cli_threads(NULL, a.threads, NULL); /* the launcher's environment says the ranks of this node */
    /* Under a launcher, or with any expert-parallel option, the EP path (which also runs on one rank). */
    if (hp_comm_launched() || a.ep || a.mesh ||
        a.overrides || a.overlap || a.chunks)
        return run_ep(&a, &argc, &argv); /* checks --output itself, inside the rank agreement */
    if (a.output) {
        const char *const inputs[] = {a.input, a.compare, a.overrides};
        int orc = cli_check_output_file("moe", "--output", a.output, a.model, inputs, 3);
        if (orc != HP_EXIT_OK) return orc;
    }
    return run(&a);
}
