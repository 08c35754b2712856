/*
 * moe_ep.c — one MoE layer under expert parallelism across the world: the orchestration `hyperpar moe` runs
 * under mpirun (and the tests call), in the runtime where the decoder's MoE boundaries will use it too.
 *
 *   mesh + ep        → EP groups (hp_mesh_ep_index) and each rank's experts (hp_ep_local_experts)
 *   the plan         → the archetype (local_compute_fn) and capacity factor when not given
 *   agreement        → every rank runs the same command (fingerprint), input (hash) and weights (identity)
 *   row blocks       → rank r takes the r-th contiguous block of T rows (the first T mod N one more)
 *   forward          → hp_moe_ep_forward_chunks in the rank's EP group
 *   gather           → y, topk_idx, topk_w on rank 0 in row order
 *
 * Every phase ends in an agreement over the world, so one rank's failure ends every rank with its message.
 */
#include "moe/moe_internal.h"

#include "hyperpar/overrides.h"
#include "hyperpar/run.h"
#include "hyperpar/shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* What every rank must agree on before any exchange: model shape, layer, archetype, options, mesh. */
static uint64_t fingerprint(const hp_model *m, const hp_run_moe_opts *o, int64_t ep, int archetype, double cf,
                            const char *mesh)
{
    uint64_t np = hp_model_num_params(m), nb = hp_model_total_bytes(m);
    int64_t v[] = {(int64_t)np, (int64_t)nb, m->cfg.hidden_size, m->cfg.n_experts, m->cfg.num_experts_per_tok,
                   o->layer, archetype, (int64_t)o->policy, o->overlap, ep, o->chunks > 1 ? o->chunks : 1,
                   (int64_t)o->compute};
    hp_hash64 h;
    hp_hash64_init(&h, 0);
    hp_hash64_update(&h, v, sizeof v);
    hp_hash64_update(&h, &cf, sizeof cf);
    hp_hash64_update(&h, mesh, strlen(mesh));
    return hp_hash64_final(&h);
}

/* The archetype of the layer from the plan (overrides), or explicitly; with EP it is never chosen silently. */
static hp_status choose_archetype(const hp_run_moe_opts *o, const hp_model *m, const hp_mesh *mesh, int64_t ep,
                                  int *arch, double *cf_from_plan, hp_err *err)
{
    *arch = -1;
    if (o->archetype) {
        hp_moe_archetype x;
        if (!hp_moe_archetype_parse(o->archetype, &x))
            return hp_err_set(err, HP_ERR_INPUT, "unknown archetype '%s'; known: %s", o->archetype,
                              hp_moe_archetype_list());
        *arch = (int)x;
        return HP_OK;
    }
    if (ep <= 1 && !o->overrides) return HP_OK; /* one process per expert set: the family's suggestion */
    hp_overrides *ov = NULL;
    hp_status st = o->overrides ? hp_overrides_load(&ov, o->overrides, err) : HP_OK;
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    po.mesh = *mesh;
    po.overrides = ov;
    po.allow_uncovered = true;
    po.packed_fused = true;
    hp_plan *p = NULL;
    if (st == HP_OK) st = hp_plan_derive(&p, m, &po, err);
    if (st == HP_OK) st = hp_plan_preflight(p, "moe", err);
    if (st == HP_OK && !o->overrides) st = hp_err_set(err, HP_ERR_INPUT, "internal: no archetype");
    if (st == HP_ERR_INPUT && !o->overrides) hp_err_prefix(err, "choose the EP compute with --archetype A or --overrides FILE");
    if (st == HP_OK) {
        char pfx[64];
        snprintf(pfx, sizeof pfx, "model.layers.%lld.", (long long)o->layer);
        const hp_boundary *hit = NULL;
        for (size_t i = 0; i < p->n_boundaries; i++)
            if (!strncmp(p->boundaries[i].fqn, pfx, strlen(pfx)) && p->boundaries[i].local_compute_fn)
                hit = &p->boundaries[i];
        hp_moe_archetype x;
        if (!hit)
            st = hp_err_set(err, HP_ERR_INPUT, "%s declares no local_compute_fn for layer %lld; add an entry matching "
                            "its MoE block", o->overrides, (long long)o->layer);
        else if (!hp_moe_archetype_parse(hit->local_compute_fn, &x))
            st = hp_err_set(err, HP_ERR_INPUT, "archetype '%s' has no runtime", hit->local_compute_fn);
        else {
            *arch = (int)x;
            *cf_from_plan = hit->compute.capacity_factor;
        }
    }
    hp_plan_free(p);
    hp_overrides_free(ov);
    return st;
}

/* What a rank read on its own, compared over the world before any exchange. */
typedef struct ident {
    int64_t rows;    /* rows of x */
    uint64_t x_hash; /* x's bytes */
    uint64_t w_hash; /* hp_moe_layer_identity */
} ident;

/* Every rank must hold the same input and weights as rank 0; the message names the first rank that does
 * not and what differs. Every rank sees every identity, so every rank reaches the same verdict. */
static hp_status check_idents(const hp_comm *w, const ident *me, const hp_run_moe_opts *o, hp_err *err)
{
    const int N = hp_comm_size(w);
    ident *all = calloc((size_t)N, sizeof *all);
    if (!all) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_status st = hp_comm_allgather(w, me, sizeof *me, all, err);
    for (int r = 1; st == HP_OK && r < N; r++) {
        if (all[r].rows != all[0].rows)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "rank %d read %lld rows of x but rank 0 read %lld; under mpirun every rank must be given "
                            "the same --input (each rank takes its own block of its rows)",
                            r, (long long)all[r].rows, (long long)all[0].rows);
        else if (all[r].x_hash != all[0].x_hash)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "rank %d read an input x with the same shape as rank 0's but other values; under mpirun "
                            "every rank must be given the same --input",
                            r);
        else if (all[r].w_hash != all[0].w_hash)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "rank %d loaded other weights for layer %lld than rank 0 (router, shared expert or the "
                            "checkpoint's tensors differ, though the config agrees); every rank must run the same "
                            "checkpoint or shard folder (%s on this rank)",
                            r, (long long)o->layer, o->model);
    }
    free(all);
    return st;
}

/* Byte counts and displacements of N blocks of T rows (the first T mod N blocks one row more) of `row`
 * bytes each. */
static void block_counts(int64_t T, int N, int64_t row, size_t *cnt, size_t *dsp)
{
    const int64_t q = T / N, rem = T % N;
    for (int r = 0; r < N; r++) {
        int64_t lo = r * q + (r < rem ? r : rem), n = q + (r < rem ? 1 : 0);
        cnt[r] = (size_t)(n * row);
        dsp[r] = (size_t)(lo * row);
    }
}

/* An agreement at a phase boundary; res->agreed records that a failure is now known to every rank. */
static hp_status agree(const hp_comm *w, hp_status st, hp_run_moe_result *res, hp_err *err)
{
    st = hp_comm_agree(w, st, err);
    res->agreed = st != HP_OK;
    return st;
}

/* The mesh and this rank's EP slot. */
static hp_status mesh_of(const hp_run_moe_opts *o, int N, hp_mesh *mesh, int64_t *ep, char *mstr, size_t cap,
                         hp_err *err)
{
    hp_status st = HP_OK;
    *ep = o->ep;
    if (o->mesh) st = hp_mesh_parse(o->mesh, mesh, err);
    else hp_mesh_from_sizes(mesh, N, 1, 1, 1, false);
    if (st == HP_OK && mesh->ep_axis) {
        if (*ep > 1 && *ep != mesh->ep)
            st = hp_err_set(err, HP_ERR_INPUT, "--ep %lld disagrees with the mesh's ep axis (%lld)", (long long)*ep,
                            (long long)mesh->ep);
        *ep = mesh->ep;
    }
    if (st == HP_OK) st = hp_mesh_check_pp(mesh, "moe", err);
    if (st == HP_OK && *ep <= 0) *ep = N;
    if (st == HP_OK && !mesh->ep_axis) mesh->ep = *ep;
    if (st == HP_OK) hp_mesh_str(mesh, mstr, cap);
    if (st == HP_OK && hp_mesh_world(mesh) != N)
        st = hp_err_set(err, HP_ERR_INPUT, "the mesh %s has %lld ranks but mpirun started %d; the product of the "
                        "mesh sizes must equal the number of ranks", mstr, (long long)hp_mesh_world(mesh), N);
    if (st == HP_OK && (N % *ep != 0))
        st = hp_err_set(err, HP_ERR_INPUT,
                        "ep_size (--ep %lld) must divide the %d ranks mpirun started (the EP groups tile the "
                        "ranks); start a multiple of %lld ranks or choose an --ep that divides %d",
                        (long long)*ep, N, (long long)*ep, N);
    return st;
}

hp_status hp_run_moe(const hp_comm *world, const hp_run_moe_opts *o, const float *xall, int64_t T, int64_t Hx,
                     hp_run_moe_result *res, hp_err *err)
{
    memset(res, 0, sizeof *res);
    const int N = hp_comm_size(world), R = hp_comm_rank(world);
    hp_comm *grp = NULL;
    hp_model *m = NULL;
    hp_moe_layer *l = NULL;
    hp_moe_ep *ep = NULL;
    float *y = NULL;
    size_t *cnt = NULL;
    hp_mesh mesh;
    int64_t eps = 0, color = 0, ep_rank = 0;
    char mstr[160] = "";
    bool shard = hp_shard_is_folder(o->model);
    hp_status st = mesh_of(o, N, &mesh, &eps, mstr, sizeof mstr, err);
    if (st == HP_OK) hp_mesh_ep_index(&mesh, eps, R, &color, &ep_rank);
    if ((st = agree(world, st, res, err)) != HP_OK) goto done;
    if ((st = hp_comm_split(world, (int)color, (int)ep_rank, &grp, err)) != HP_OK) goto done;

    st = shard ? hp_moe_shard_config_open(&m, o->model, err) : hp_model_open(&m, o->model, NULL, err);
    if ((st = agree(world, st, res, err)) != HP_OK) goto done;
    int arch = -1;
    double cf_plan = 0, cf = o->capacity_factor;
    st = choose_archetype(o, m, &mesh, eps, &arch, &cf_plan, err);
    if (st == HP_OK && cf <= 0 && cf_plan > 0) {
        cf = cf_plan;
        res->cf_from_plan = true;
    }
    if (st == HP_OK && m->cfg.n_experts % eps != 0)
        st = hp_err_set(err, HP_ERR_INPUT, "num_experts (%lld) must be divisible by ep_size (%lld)",
                        (long long)m->cfg.n_experts, (long long)eps);
    if ((st = agree(world, st, res, err)) != HP_OK) goto done;

    /* Every rank must run the same model, layer, options and mesh. */
    uint64_t fp = fingerprint(m, o, eps, arch, cf, mstr), *fps = calloc((size_t)N, sizeof *fps);
    if (!fps) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if (st == HP_OK) st = hp_comm_allgather(world, &fp, sizeof fp, fps, err);
    for (int r = 0; st == HP_OK && r < N; r++)
        if (fps[r] != fps[0])
            st = hp_err_set(err, HP_ERR_INPUT,
                            "rank %d disagrees with rank 0 on the model, layer, archetype, options or mesh; every "
                            "rank must be given the same command",
                            r);
    free(fps);
    if ((st = agree(world, st, res, err)) != HP_OK) goto done;

    hp_moe_load_opts lo;
    hp_moe_load_opts_default(&lo);
    lo.compute = o->compute;
    lo.archetype = arch;
    int64_t Lloc = 0;
    hp_ep_local_experts(m->cfg.n_experts, eps, ep_rank, &lo.first_expert, &Lloc);
    lo.n_local = Lloc;
    st = shard ? hp_moe_layer_load_shard(&l, o->model, m, R, o->layer, &lo, err)
               : hp_moe_layer_load(&l, m, o->layer, &lo, err);
    int64_t H = l ? l->n_hidden : 0, K = l ? l->top_k : 0;
    if (st == HP_OK && Hx != H)
        st = hp_err_set(err, HP_ERR_INPUT, "tensor 'x' is [%lld, %lld] but layer %lld has hidden size %lld",
                        (long long)T, (long long)Hx, (long long)o->layer, (long long)H);
    if (st == HP_OK && T < 1) st = hp_err_set(err, HP_ERR_INPUT, "tensor 'x' has no rows");
    /* What this rank read on its own: the input's shape and bytes, and the weights' identity. */
    ident me = {0};
    if (st == HP_OK) {
        me.rows = T;
        me.x_hash = hp_hash64_bytes(xall, (size_t)(T * H) * sizeof(float), 0);
        st = hp_moe_layer_identity(l, m, shard ? o->model : NULL, &me.w_hash, err);
    }
    if ((st = agree(world, st, res, err)) != HP_OK) goto done;
    if ((st = agree(world, check_idents(world, &me, o, err), res, err)) != HP_OK) goto done;
    res->T = T, res->H = H, res->K = K, res->layer = o->layer, res->n_experts = m->cfg.n_experts, res->ep = eps;
    res->n_local = Lloc, res->archetype = l->archetype, res->archetype_suggested = arch < 0;
    res->capacity_factor = cf;

    /* Rank r takes rows [lo_row, lo_row + Tl): the first T mod N ranks one row more (numpy.array_split); ranks
     * past the end of a short input hold none and still take part in every exchange. */
    const int64_t q = T / N, rem = T % N;
    const int64_t lo_row = R * q + (R < rem ? R : rem), Tl = q + (R < rem ? 1 : 0), Tmax = q + (rem > 0);
    const float *x = xall + lo_row * H;
    if (!(y = malloc((size_t)((Tl ? Tl : 1) * H) * sizeof *y))) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    /* With chunks the creation is a collective of the EP group: every rank gets there or none does. */
    if ((st = agree(world, st, res, err)) != HP_OK) goto done;
    const int chunks = o->chunks > 1 ? (int)o->chunks : 1;
    /* Every rank is sized for the largest block (Tmax rows): a peer may route all its slots here. */
    st = hp_moe_ep_create_chunked(&ep, l, grp, Tmax, chunks, err);
    if ((st = agree(world, st, res, err)) != HP_OK) goto done;
    hp_moe_run_opts ro = {.capacity_factor = cf, .policy = o->policy, .row_base = lo_row};
    double t0 = hp_comm_wtime();
    st = hp_moe_ep_forward_chunks(ep, x, Tl, y, &ro, o->overlap, chunks, err);
    double t1 = hp_comm_wtime();
    /* The forward agrees within its EP group; the other groups of the world must stop too. */
    if ((st = agree(world, st, res, err)) != HP_OK) goto done;
    /* Rank 0 gathers y, topk_idx, topk_w in the original row order. */
    cnt = calloc(2 * (size_t)N, sizeof *cnt);
    if (R == 0) {
        res->y = malloc((size_t)(T * H) * sizeof *res->y);
        res->topk_idx = malloc((size_t)(T * K) * sizeof *res->topk_idx);
        res->topk_w = malloc((size_t)(T * K) * sizeof *res->topk_w);
    }
    if (!cnt || (R == 0 && (!res->y || !res->topk_idx || !res->topk_w)))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    if ((st = agree(world, st, res, err)) != HP_OK) goto done;
    const hp_moe_ws *ws = hp_moe_ep_ws(ep);
    size_t *rc = cnt, *rd = cnt + N;
    /* Block sizes from the agreed T (every rank holds the same input); hp_comm_gatherv checks them again. */
    block_counts(T, N, H * (int64_t)sizeof(float), rc, rd);
    st = hp_comm_gatherv(world, y, (size_t)(Tl * H) * sizeof(float), res->y, rc, rd, 0, err);
    block_counts(T, N, K * (int64_t)sizeof(int32_t), rc, rd);
    if (st == HP_OK)
        st = hp_comm_gatherv(world, ws->topk_idx, (size_t)(Tl * K) * sizeof(int32_t), res->topk_idx, rc, rd, 0, err);
    if (st == HP_OK)
        st = hp_comm_gatherv(world, ws->topk_w, (size_t)(Tl * K) * sizeof(float), res->topk_w, rc, rd, 0, err);
    /* Statistics: rows and dropped slots summed over ranks; the slowest rank's time. */
    const hp_moe_ep_stats *es = hp_moe_ep_get_stats(ep);
    double agg[3] = {(double)es->rows_recv, (double)es->n_dropped, (double)es->bytes_exchanged};
    double tmax = t1 - t0;
    if (st == HP_OK) st = hp_comm_allreduce_sum_f64(world, agg, 3, err);
    if (st == HP_OK) st = hp_comm_allreduce_max_f64(world, &tmax, 1, err);
    res->rows_computed = agg[0], res->slots_dropped = agg[1], res->bytes_exchanged = agg[2], res->seconds = tmax;
    st = agree(world, st, res, err);
done:
    free(y);
    free(cnt);
    hp_moe_ep_destroy(ep);
    hp_moe_layer_free(l);
    hp_model_close(m);
    hp_comm_free(grp);
    if (st != HP_OK) {
        bool agreed = res->agreed;
        hp_run_moe_result_free(res);
        res->agreed = agreed;
    }
    return st;
}

void hp_run_moe_result_free(hp_run_moe_result *res)
{
    free(res->y);
    free(res->topk_idx);
    free(res->topk_w);
    res->y = NULL;
    res->topk_idx = NULL;
    res->topk_w = NULL;
}
