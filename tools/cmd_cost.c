/*
 * cmd_cost.c — `hyperpar cost MODEL [plan flags] [--batch B --seq S] [--mode infer|train] [--format F]`: what a
 * plan costs each rank (docs/cost.md).
 *
 * Exact: the weight bytes (the rank's shard file) and the communication of one forward step (the dry executor
 * of src/cost/cost.c: what `hyperpar run` counts, boundary by boundary). Estimates, marked so: activations, KV
 * cache, training state, FLOPs and the predicted step time, and the MoE exchange of a real router (the
 * balanced router's, unless --routing gives the routing).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "costflags.h"
#include "hyperpar/cost.h"
#include "hyperpar/moe.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"
#include "hyperpar/safetensors.h"
#include "hyperpar/shard.h"
#include "inputflags.h"

enum { O_PLAN = 1000, O_ROUTING, O_RANK, O_DETAIL };
#define G_PLAN "the plan, derived as 'hyperpar plan' does (see its --help), unless --plan"

typedef struct cost_args {
    cli_plan_flags pf;
    cli_cost_flags cf;
    cli_input_flags in;
    const char *plan, *routing;
    int64_t rank;
    bool detail;
} cost_args;

static const cli_opt g_opts[] = {
    {"routing", O_ROUTING, "FILE", "the routed experts: moe.<layer>.topk_idx I32 [B*S, K] (a forward_io file\n"
                                   "or 'hyperpar run --output'); B and S from its input_ids when it has them",
     0, NULL, CLI_STR(cost_args, routing)},
    {"rank", O_RANK, "R", "the rank whose collectives are listed (default: the most-loaded)", 0, NULL,
     CLI_INT(cost_args, rank, 0, HP_MESH_MAX_WORLD)},
    {"detail", O_DETAIL, NULL, "list every layer's collectives (default: the first layers, then sums)", 0, NULL,
     CLI_FLAG(cost_args, detail)},
    CLI_OPT_HELP,
    CLI_OPTS_COST("the batch and the byte and time model (docs/cost.md)", "one row per dp replica", cost_args, cf),
    CLI_OPTS_INPUT("B and S from an input instead of --batch/--seq (one of --input, --ids, --random-input; all\n"
                   "as 'hyperpar run' takes them, checked against the vocabulary)", cost_args, in),
    {"plan", O_PLAN, "plan.json", "a plan written by 'hyperpar plan' instead of deriving one", 0, G_PLAN,
     CLI_STR(cost_args, plan)},
    CLI_OPTS_MESH(G_PLAN, cost_args, pf), CLI_OPTS_EP(G_PLAN, cost_args, pf), CLI_OPTS_PLAN(G_PLAN, cost_args, pf),
    {0},
};

const cli_command cli_cmd_cost = {
    .cmd = "cost",
    .summary = "what a plan costs each rank: memory, communication, FLOPs, step time",
    .forms = {{NULL, "MODEL"}},
    .about = "What MODEL's plan costs each rank of the mesh. MODEL is a checkpoint, a config.json (meta mode) or a\n"
             "folder written by 'hyperpar shard' (its mesh and plan, as run takes them).\n"
             "Exact: the weight bytes of every rank (its 'hyperpar shard' file's tensors), and the communication\n"
             "and workspace of one forward step, boundary by boundary (each collective's kind, group and bytes):\n"
             "what 'hyperpar run' counts on the same batch without --output or --compare. That run takes no\n"
             "logits: lm_head and the loss run in row chunks, and only the MoE routing is gathered to rank 0; a run\n"
             "with --output also holds every row's logits and gathers them to rank 0 (docs/cost.md,\n"
             "\"Which run\"). Estimates, marked *: activations, KV cache, training state, FLOPs and a\n"
             "predicted step time, from the stated model of docs/cost.md; the MoE token exchange is exact for a\n"
             "given routing or 'hyperpar run --router balanced', and the balanced router's estimate otherwise.\n"
             "With a GPU --hardware every figure but the weights' layout is an estimate for another engine (bf16,\n"
             "Megatron-style activations and state), --freeze honoured (no gradient, optimizer state or master).\n"
             "With --mem-per-rank (a GPU: its memory, less --mem-reserve, a tenth by default) and a rank that\n"
             "does not fit, it prints the binding constraint and the nearest changes that fit, as command lines.\n"
             "--mode train runs micro-batches of 1 row per replica unless --micro-batch says otherwise.\n"
             "--mode decode (serving): --batch sequences, one new token each, each with a KV cache of --context\n"
             "positions: the KV cache per sequence and for the batch, how many sequences fit beside the weights\n"
             "and the step's activations in --mem-per-rank, and the step time max(compute, memory reads / --mem-bw)\n"
             "+ communication (the collectives of that B x 1 batch, as 'hyperpar run' would count them).\n"
             "The flags of the byte and time model (--gemm-gflops ... --kv-bytes, listed below), given, override\n"
             "--hardware's figures.\n",
    .opts = g_opts,
    .epilog = "JSON: {\"world\", \"batch\", \"micro_batch\", \"micro_batches\", \"seq\", \"mode\", \"max_rank\", \"engine\"\n"
              "       \"mem_per_rank\", \"mem_reserve\", \"mem_usable\" (the budget less the reserve),\n"
              "       (\"hyperpar\" or \"estimate\"), \"hardware\": {the profile}, \"model\": {the byte and time model},\n"
              "       \"note\", \"fit\" (null, or with --mem-per-rank: {\"binding\", \"binding_bytes\", \"changes\":\n"
              "       [{\"flag\", \"value\", \"bytes\", \"command\"}]}),\n"
              "       \"ranks\": [{\"rank\", \"coords\", \"weight_bytes\" (exact: as the runtime holds them),\n"
              "       \"stored_bytes\" (its shard file's tensor bytes), \"activation_bytes\", \"workspace_bytes\"\n"
              "       (exact: the high-water mark of run's buffers in its forward), \"window_bytes\" (exact: the\n"
              "       shared-memory windows of its tp and cp groups on one node), \"kv_cache_bytes\",\n"
              "       \"grad_bytes\", \"optim_bytes\", \"master_bytes\", \"saved_bytes\", \"gather_bytes\",\n"
              "       \"total_bytes\",\n"
              "       \"comm\": {\"bytes\": {kind: n}, \"calls\": {kind: n}}, \"sent_bytes\" (into groups of more than one\n"
              "       rank; alias net_bytes), \"wire_bytes\" (sent over links, ring algorithms), \"flops\", \"t_compute\",\n"
              "       \"t_comm\", \"t_step\", \"attn_flops\", \"recompute_flops\", \"t_overlap\" (the dp gradient\n"
              "       reduction beside the backward), \"t_exposed\" (the communication the step waits for),\n"
              "       \"t_bubble\" (a pipeline's wait; 0 without pp), \"stage\", \"p2p_bytes\", \"p2p_calls\",\n"
              "       \"in_flight\", \"t_busy\" (its stage's own seconds), \"ep_estimated\", \"kv_seq_bytes\" (one sequence's\n"
              "       cache), in train \"mfu\", and in decode \"read_bytes\", \"t_memory\", \"seqs_fit\" (null without\n"
              "       --mem-per-rank)}, ...],\n"
              "       \"context\" and \"seqs_fit\" (decode: the mesh's concurrent sequences; else null),\n"
              "       in train \"model_flops\" and \"mfu\" (the step's, against its slowest rank),\n"
              "       \"pipeline\" (null without pp: pp, virtual, schedule, t_makespan, stages: [each stage's ranks,\n"
              "       layers and its most-loaded rank's bytes, in_flight, p2p_bytes, t_busy]),\n"
              "       \"events\": [the listed rank's collectives]}\n",
    .run = cmd_cost,
};

static const char *mb(uint64_t b, char *buf, size_t cap)
{
    return hp_format_bytes(b, buf, cap);
}

typedef struct fit_args { /* the command line, for the changes' commands */
    const hp_fit *fit;
    int argc;
    char **argv;
} fit_args;

static void event_line(FILE *o, const hp_cost_event *e)
{
    char b[32];
    char ts[24];
    fprintf(o, "  %5s  %-44.44s %-18s %-14s %2s=%-5d %3lld  %12s%s %11s\n", "", e->where, e->step,
           hp_run_coll_name(e->kind), e->axis, e->group, (long long)e->calls, mb(e->bytes, b, sizeof b), e->estimated ? "*" : " ",
           cli_seconds(e->seconds, ts, sizeof ts));
}

static void layer_sum(FILE *o, int32_t layer, const hp_cost_rank *r)
{
    uint64_t by[HP_RUN_COLL_COUNT] = {0};
    double t = 0;
    for (size_t i = 0; i < r->n_ev; i++)
        if (r->ev[i].layer == layer) by[r->ev[i].kind] += r->ev[i].bytes, t += r->ev[i].seconds;
    char b[32], name[24];
    snprintf(name, sizeof name, layer < 0 ? "outside" : "layer %d", layer);
    fprintf(o, "  %-13s", name);
    bool any = false;
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++)
        if (by[k]) fprintf(o, "%s%s %s", any ? ", " : " ", hp_run_coll_name((hp_run_coll)k), mb(by[k], b, sizeof b)), any = true;
    char ts[24];
    fprintf(o, "%s   (%s*)\n", any ? "" : " no collective", cli_seconds(t, ts, sizeof ts));
}

/* Decode's own figures: the cache per sequence, the sequences that fit, and what bounds the step. */
static void decode_text(FILE *o, const hp_cost *c, uint64_t budget)
{
    char b[4][32], t[4][24];
    const hp_cost_rank *mx = &c->ranks[c->max_rank], *slow = &c->ranks[0];
    for (int64_t i = 1; i < c->n_ranks; i++)
        if (c->ranks[i].t_step > slow->t_step) slow = &c->ranks[i];
    fprintf(o, "\ndecode   KV cache per sequence on rank %lld: %s* (every layer's K and V of %lld positions", (long long)mx->rank,
            mb(mx->kv_seq_bytes, b[0], 32), (long long)c->context);
    fprintf(o, "; sliding-window layers keep their window)\n");
    int64_t n = hp_cost_seqs(c, budget);
    if (n < 0)
        fprintf(o, "         sequences that fit: needs --mem-per-rank (the memory left after weights and activations,\n"
                   "         over the KV cache of one sequence)\n");
    else
        fprintf(o, "         sequences that fit in %s per rank%s%s%s: %lld* (%lld per replica x dp=%lld; floor((budget - "
                   "weights - activations) / KV per sequence) on the rank that fits fewest)\n",
                mb(hp_cost_usable(&c->mdl, budget), b[1], 32), c->mdl.mem_reserve ? " (" : "",
                c->mdl.mem_reserve ? mb(budget, b[3], 32) : "", c->mdl.mem_reserve ? " less the reserve)" : "",
                (long long)n, (long long)(n / (c->dp > 0 ? c->dp : 1)), (long long)c->dp);
    fprintf(o, "         step of rank %lld*: %s = max(compute %s, memory %s: %s read at %.3g GB/s) + communication %s; "
               "%s-bound\n", (long long)slow->rank, cli_seconds(slow->t_step, t[0], 24),
            cli_seconds(slow->t_compute, t[1], 24), cli_seconds(slow->t_memory, t[2], 24), mb(slow->read_bytes, b[2], 32),
            c->mdl.mem_bw / 1e9, cli_seconds(slow->t_comm, t[3], 24), slow->t_memory >= slow->t_compute ? "memory" : "compute");
}

/* The table of ranks: each one's weights and, unless the plan is refused, the rest (the first 64). */
static void ranks_text(FILE *o, const hp_shard_layout *l, const hp_cost *c)
{
    char coords[160], b[8][32];
    if (c->refused[0])
        fprintf(o, "\nper rank        %-22s %10s %11s\n", "coords", "weights", "the rest");
    else
        fprintf(o, "\nper rank        %-22s %10s %11s %10s %11s %10s %10s %9s %9s\n", "coords", "weights",
                "activations*", c->train ? "state*" : "KV cache*", "total", "comm/step", "wire/step", "GFLOP*", "step*");
    int64_t shown = c->n_ranks < 64 ? c->n_ranks : 64;
    for (int64_t i = 0; i < shown && c->refused[0]; i++) /* only the weights are derived: no 0 B / 0 ms */
        fprintf(o, "  rank %-8lld %-22.22s %10s %11s\n", (long long)c->ranks[i].rank,
                hp_shard_coords_str(l, c->ranks[i].rank, coords, sizeof coords), mb(c->ranks[i].weight_bytes, b[0], 32),
                "not derived");
    for (int64_t i = 0; i < shown && !c->refused[0]; i++) {
        const hp_cost_rank *r = &c->ranks[i];
        uint64_t all = 0, st = c->train ? r->grad_bytes + r->optim_bytes + r->master_bytes + r->saved_bytes +
                                          r->gather_bytes : r->kv_bytes;
        for (int k = 0; k < HP_RUN_COLL_COUNT; k++) all += r->bytes[k];
        char ts[24];
        fprintf(o, "  rank %-8lld %-22.22s %10s %11s %10s %11s %10s %10s %9.3g %10s\n", (long long)r->rank,
               hp_shard_coords_str(l, r->rank, coords, sizeof coords), mb(r->weight_bytes, b[0], 32),
               mb(r->act_bytes, b[1], 32), mb(st, b[2], 32), mb(r->total_bytes, b[3], 32), mb(all, b[4], 32),
               mb(r->wire_bytes, b[5], 32), r->flops / 1e9, cli_seconds(r->t_step, ts, sizeof ts));
    }
    if (shown < c->n_ranks) fprintf(o, "  ... %lld more ranks (--format json lists them all)\n", (long long)(c->n_ranks - shown));
}

/* A pipeline's stages: one line each, the worst of its evaluated ranks (docs/cost.md "Pipeline parallelism"). */
static void pipeline_text(FILE *o, const hp_cost *c)
{
    char b[6][32], t[3][24];
    if (c->train)
        fprintf(o, "\npipeline pp=%lld x %lld virtual, schedule %s, %lld micro-batches: the step's timeline %s* "
                   "(simulated)\n", (long long)c->pp, (long long)c->pp_virtual, hp_pp_sched_name(c->pp_sched),
                (long long)c->n_micro, cli_seconds(c->t_makespan, t[0], 24));
    else
        fprintf(o, "\npipeline pp=%lld x %lld virtual: one batch through the stages in turn, %s*\n", (long long)c->pp,
                (long long)c->pp_virtual, cli_seconds(c->t_makespan, t[0], 24));
    fprintf(o, "  %5s %-15s %-16s %10s %12s %12s %9s %10s %10s %9s\n", "stage", "ranks", "layers", "weights",
            "activations*", c->train ? "saved*" : "", c->train ? "in flight" : "", "total", "p2p/step", "busy*");
    for (int64_t s = 0; s < c->pp; s++) {
        const hp_cost_stage *g = &c->stages[s];
        char rk[40], ly[48];
        snprintf(rk, sizeof rk, "%lld..%lld", (long long)g->rank_lo, (long long)g->rank_hi - 1);
        snprintf(ly, sizeof ly, "%lld%s%s", (long long)g->n_layers, g->embedding ? " +embed" : "", g->head ? " +head" : "");
        if (!g->evaluated) {
            fprintf(o, "  %5lld %-15s %-16s %10s\n", (long long)s, rk, ly, "not evaluated");
            continue;
        }
        char inf[24] = "";
        if (c->train) snprintf(inf, sizeof inf, "%lld", (long long)g->in_flight);
        fprintf(o, "  %5lld %-15s %-16s %10s %12s %12s %9s %10s %10s %9s\n", (long long)s, rk, ly,
                mb(g->weight_bytes, b[0], 32), mb(g->act_bytes, b[1], 32), c->train ? mb(g->saved_bytes, b[2], 32) : "",
                inf, mb(g->total_bytes, b[3], 32), mb(g->p2p_bytes, b[4], 32), cli_seconds(g->t_busy, t[1], 24));
    }
    fprintf(o, "  (each stage's most-loaded rank; p2p: the residual stream's blocks sent and received between stages%s)\n",
            c->train ? ", forward and backward" : "");
}

static void report_text(FILE *o, const hp_model *m, const hp_plan *p, const hp_shard_layout *l, const hp_cost *c, int64_t ri,
                        bool detail, uint64_t budget, bool routed, const fit_args *fa)
{
    char mesh[160], b[8][32];
    hp_mesh_str(&p->mesh, mesh, sizeof mesh);
    char what[120];
    if (c->decode)
        snprintf(what, sizeof what, "decode: one new token per sequence, a KV cache of %lld positions each",
                 (long long)c->context);
    fprintf(o, "model    %s (%s)\nmesh     %s\nbatch    %lld x %lld (%s)%s; the MoE exchange: %s\n", m->path,
           m->model_type[0] ? m->model_type : "?", mesh, (long long)c->B, (long long)c->S,
           c->train ? "training step: forward and backward" : c->decode ? what : "inference: one forward",
           c->S_pad != c->S ? " (padded for cp)" : "",
           !(m->family && hp_family_is_moe(m->family)) ? "none (dense)"
           : routed                                    ? "the given routing (exact)"
                                                       : "the balanced router's (estimate*)");
    if (c->train)
        fprintf(o, "step     %lld micro-batch%s of %lld row%s per replica (gradient accumulation); activations are one "
                   "micro-batch's\n", (long long)c->n_micro, c->n_micro == 1 ? "" : "es", (long long)c->micro_batch,
                c->micro_batch == 1 ? "" : "s");
    cli_cost_engine_text(o, &c->mdl, c->train);
    ranks_text(o, l, c);
    if (!c->refused[0] && !hp_cost_model_gpu(&c->mdl)) { /* hyperpar run's own buffers: not a GPU engine's */
        int64_t wi = 0;
        for (int64_t i = 1; i < c->n_ranks; i++)
            if (c->ranks[i].workspace_bytes > c->ranks[wi].workspace_bytes) wi = i;
        uint64_t wb = c->ranks[wi].workspace_bytes;
        fprintf(o, "workspace (run's activation, scratch and communication buffers at their peak, exact): %s on rank "
                   "%lld\n", wb == UINT64_MAX ? "past 2^64 bytes" : mb(wb, b[0], 32), (long long)c->ranks[wi].rank);
        wi = 0;
        for (int64_t i = 1; i < c->n_ranks; i++)
            if (c->ranks[i].window_bytes > c->ranks[wi].window_bytes) wi = i;
        if (c->ranks[wi].window_bytes) /* beside the workspace: MPI's shared memory, the tp and cp groups on one node */
            fprintf(o, "shared windows (the tp and cp groups' collectives on one node, shared memory, exact): %s on "
                       "rank %lld\n", mb(c->ranks[wi].window_bytes, b[0], 32), (long long)c->ranks[wi].rank);
    }
    const hp_cost_rank *mx = &c->ranks[c->max_rank];
    if (c->refused[0]) {
        fprintf(o, "most-loaded rank %lld: weights %s exact; activations, %s and the total not derived\n",
                (long long)mx->rank, mb(mx->weight_bytes, b[0], 32), c->train ? "training state" : "KV cache");
        if (budget)
            fprintf(o, "budget   %s per rank: the weights alone need %.1f%% of it; the total is not derived\n",
                    mb(budget, b[0], 32), 100.0 * (double)mx->weight_bytes / (double)budget);
        fprintf(o, "\ncommunication, activations, FLOPs and time are not derived: 'hyperpar run' refuses this plan:\n"
                   "  %s\n", c->refused);
        return;
    }
    fprintf(o, "most-loaded rank %lld: %s (weights %s exact + activations %s*", (long long)mx->rank,
           mb(mx->total_bytes, b[0], 32), mb(mx->weight_bytes, b[1], 32), mb(mx->act_bytes, b[2], 32));
    if (c->train)
        fprintf(o, " + gradients %s* + optimizer %s* + master %s* + saved activations %s*", mb(mx->grad_bytes, b[3], 32),
               mb(mx->optim_bytes, b[4], 32), mb(mx->master_bytes, b[5], 32), mb(mx->saved_bytes, b[6], 32));
    if (c->train && c->mdl.zero >= 3)
        fprintf(o, " + gathered weights %s* (ZeRO-3: the largest layer's, while it runs)", mb(mx->gather_bytes, b[3], 32));
    if (!c->train && !c->decode)
        fprintf(o, " + KV cache %s* of the %lld positions", mb(mx->kv_bytes, b[3], 32), (long long)c->S);
    if (c->decode)
        fprintf(o, " + KV cache %s* of its %lld sequences x %lld positions", mb(mx->kv_bytes, b[3], 32),
                (long long)(mx->kv_seq_bytes ? mx->kv_bytes / mx->kv_seq_bytes : 0), (long long)c->context);
    fprintf(o, ")\n");
    uint64_t usable = hp_cost_usable(&c->mdl, budget); /* the budget less the runtime's reserve */
    if (budget && !c->mdl.mem_reserve)
        fprintf(o, "budget   %s per rank: the most-loaded rank needs %.1f%% of it (%s)\n", mb(budget, b[0], 32),
               100.0 * (double)mx->total_bytes / (double)budget, mx->total_bytes <= budget ? "fits" : "does NOT fit");
    else if (budget)
        fprintf(o, "budget   %s per rank, less a reserve of %s for the runtime and fragmentation (--mem-reserve): the "
                   "most-loaded rank needs %.1f%% of the %s left (%s)\n", mb(budget, b[0], 32),
                mb(c->mdl.mem_reserve, b[1], 32), 100.0 * (double)mx->total_bytes / (double)(usable ? usable : 1),
                mb(usable, b[2], 32), mx->total_bytes <= usable ? "fits" : "does NOT fit");
    if (budget && mx->total_bytes > usable) cli_fit_text(o, fa->fit, "cost", fa->argc, fa->argv);

    if (c->decode) decode_text(o, c, budget);
    if (c->pp > 1 && c->stages) pipeline_text(o, c);
    if (c->note[0]) fprintf(o, "\nnote: %s\n", c->note);
    const hp_cost_rank *r = &c->ranks[ri];
    fprintf(o, "\ncollectives of rank %lld per %s (%s; times*)\n", (long long)r->rank,
           c->train ? "training step (the backward's marked *)" : "forward step",
           hp_cost_model_gpu(&c->mdl) ? "bytes: a bf16 engine's, half of what 'hyperpar run' counts"
                                      : "bytes exact: what 'hyperpar run' counts");
    fprintf(o, "  %5s  %-44s %-18s %-14s %-8s %5s %12s  %12s\n", "layer", "boundary", "step", "collective", "group",
           "calls", "bytes", "time");
    int32_t L = (int32_t)m->cfg.num_hidden_layers, first_sparse = -1;
    for (int32_t i = 0; i < L && first_sparse < 0; i++)
        for (size_t k = 0; k < r->n_ev; k++)
            if (r->ev[k].layer == i && r->ev[k].kind == HP_RUN_ALL_TO_ALL) first_sparse = i;
    for (int32_t layer = -1; layer <= L; layer++) {
        int32_t lk = layer == L ? -1 : layer; /* -1 twice: before the layers (embed) and after (head, loss) */
        bool full = detail || L <= 4 || layer <= 0 || layer == first_sparse || layer == L;
        if (layer == L) fprintf(o, "  after the layers\n");
        if (full) {
            for (size_t k = 0; k < r->n_ev; k++) {
                const hp_cost_event *e = &r->ev[k];
                bool before = e->where && (strstr(e->where, "embed_tokens") != NULL);
                if (e->layer != lk || (lk < 0 && (layer == -1) != before)) continue;
                event_line(o, e);
            }
        }
        if (layer >= 0 && layer < L) layer_sum(o, layer, r);
    }
    uint64_t tot = 0;
    fprintf(o, "step total of rank %lld:", (long long)r->rank);
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) {
        tot += r->bytes[k];
        fprintf(o, "%s %s %s in %llu calls", k ? "," : "", hp_run_coll_name((hp_run_coll)k), mb(r->bytes[k], b[0], 32),
               (unsigned long long)r->calls[k]);
    }
    fprintf(o, "\n  = %s, of which %s in groups of more than one rank; %s over links (ring algorithms)\n",
            mb(tot, b[0], 32), mb(r->sent_bytes, b[1], 32), mb(r->wire_bytes, b[2], 32));
    char t1[24], t2[24], t3[24];
    char t4[24], t5[24], t6[24], t7[24];
    if (!hp_cost_model_gpu(&c->mdl)) /* hyperpar's runtime: its measured rates, nothing overlapped */
        fprintf(o, "predicted step of rank %lld*: %s = %scompute %s (%.3g GFLOP at %.3g GFLOP/s)%s%s%s + communication "
                   "%s%s%s\n", (long long)r->rank, cli_seconds(r->t_step, t1, sizeof t1), c->decode ? "max(" : "",
                cli_seconds(r->t_compute, t2, sizeof t2), r->flops / 1e9, c->mdl.gemm_flops / 1e9,
                c->decode ? ", memory " : "", c->decode ? cli_seconds(r->t_memory, t4, sizeof t4) : "",
                c->decode ? ")" : "", cli_seconds(r->t_comm, t3, sizeof t3), c->pp > 1 ? " + pipeline bubble " : "",
                c->pp > 1 ? cli_seconds(r->t_bubble, t7, sizeof t7) : "");
    else
        fprintf(o, "predicted step of rank %lld*: %s = %scompute %s (%.3g GFLOP%s at %.3g GFLOP/s: %.3g%% of "
                   "%.3g)%s%s%s + communication %s exposed (of %s, links at %.3g%%; %s of dp gradient reduction beside the "
                   "backward) + pipeline bubble %s\n",
                (long long)r->rank, cli_seconds(r->t_step, t1, sizeof t1), c->decode ? "max(" : "",
                cli_seconds(r->t_compute, t2, sizeof t2), r->flops / 1e9,
                !c->train ? "" : c->mdl.recompute == HP_COST_RECOMPUTE_FULL ? " with full recompute"
                               : c->mdl.recompute == HP_COST_RECOMPUTE_SELECTIVE ? " with selective recompute" : "",
                c->mdl.gemm_flops * c->mdl.gemm_eff / 1e9, c->mdl.gemm_eff * 100, c->mdl.gemm_flops / 1e9,
                c->decode ? ", memory " : "", c->decode ? cli_seconds(r->t_memory, t4, sizeof t4) : "",
                c->decode ? ")" : "", cli_seconds(r->t_exposed, t3, sizeof t3), cli_seconds(r->t_comm, t5, sizeof t5),
                c->mdl.link_eff * 100, cli_seconds(r->t_overlap, t6, sizeof t6),
                cli_seconds(r->t_bubble, t7, sizeof t7));
    if (c->train && !c->refused[0])
        fprintf(o, "MFU*: %.1f%% (model FLOPs %.4g = 6 x active weights x tokens + the attention scores', no "
                   "recompute, over the slowest step x %lld ranks x %.4g GFLOP/s)\n",
                c->mfu * 100, c->model_flops, (long long)c->world, c->mdl.gemm_flops / 1e9);
    fprintf(o, "\n* estimate, from the model stated in docs/cost.md (adjust it with the model flags, see --help)%s\n",
           mx->ep_estimated ? "; the MoE exchange assumes the balanced router (give --routing for the exact bytes)" : "");
}

static hp_status write_html(const char *path, const hp_model *m, const hp_plan *p, const hp_cost *c, uint64_t budget,
                            hp_err *err)
{
    char *buf = NULL, mesh[160], title[400];
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    hp_mesh_str(&p->mesh, mesh, sizeof mesh);
    snprintf(title, sizeof title, "%s on %s%s%s%s", m->path, mesh,
             hp_cost_model_gpu(&c->mdl) ? ": estimates for a bf16 GPU engine (" : "",
             hp_cost_model_gpu(&c->mdl) ? c->mdl.hw->name : "",
             hp_cost_model_gpu(&c->mdl) ? ", Megatron-style accounting), not hyperpar's runtime" : "");
    cli_html_model md = {.n_heads = m->cfg.num_attention_heads,
                         .n_kv_heads = m->cfg.num_key_value_heads ? m->cfg.num_key_value_heads
                                                                  : m->cfg.num_attention_heads,
                         .n_experts = m->family && hp_family_is_moe(m->family) ? m->cfg.n_experts : 0,
                         .ep = hp_plan_ep_size(p), .mla = m->cfg.kv_lora_rank > 0};
    int rc = cli_html_cost(f, title, c, &p->mesh, &md, budget);
    fclose(f);
    hp_status st = rc == 0 ? HP_OK : hp_err_set(err, HP_ERR_IO, "writing the page failed");
    if (st == HP_OK) st = cli_write_atomic_err(path, buf, len, "the page", err);
    free(buf);
    return st;
}

int cmd_cost(int argc, char **argv)
{
    cost_args a = {.rank = -1};
    cli_plan_flags_init(&a.pf);
    cli_cost_flags_init(&a.cf);
    cli_parser cp = {.command = &cli_cmd_cost};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    cli_plan_flags pf = a.pf;
    cli_cost_flags cf = a.cf;
    cli_input_flags in = a.in;
    const char *plan_path = a.plan, *routing = a.routing;
    int64_t want_rank = a.rank;
    bool detail = a.detail;
    if (optind != argc - 1) return cli_usage_error("cost", "expected exactly one MODEL");
    if (plan_path && cli_plan_flags_any(&pf))
        return cli_usage_error("cost", "give either --plan or the plan flags (--mesh, --tp, --ep, ...), not both");
    bool input = in.input || in.ids || in.random;
    /* --seq with --input cuts a token stream (then --batch counts its rows); with --ids or --random-input, or a
     * safetensors --input, the input's shape is the batch */
    if (input) {
        int irc = cli_input_check("cost", &in, in.input && cf.s.seq_given ? cf.s.co.S : 0,
                                  in.input && cf.s.seq_given && cf.s.batch_given ? cf.s.co.B : 0);
        if (irc != HP_EXIT_OK) return irc;
        if (in.src.kind != HP_IDS_STREAM && (cf.s.batch_given || cf.s.seq_given))
            return cli_usage_error("cost", "give either %s or --batch/--seq, not both",
                                   in.input ? "--input" : in.ids ? "--ids" : "--random-input");
    } else if (in.dtype || in.seed_given) {
        return cli_usage_error("cost", "%s belongs to an input (--input FILE --seq S, --random-input B,S)",
                               in.dtype ? "--data-dtype" : "--seed");
    }
    if (!cli_cost_flags_done("cost", &cf)) return HP_EXIT_USAGE;
    int rc = cli_plan_flags_mesh("cost", &pf, 1);
    if (rc != HP_EXIT_OK) return rc;
    const char *const inputs[] = {plan_path, in.input, routing, pf.overrides};
    if (cf.output && cli_check_output_file("cost", "--output", cf.output, argv[optind], inputs, 4) != 0)
        return HP_EXIT_USAGE;
    hp_err err;
    hp_overrides *ov = NULL;
    hp_model *m = NULL;
    hp_plan *p = NULL;
    /* a shard folder: its config.json (meta mode) and the plan it records, the flags checked against it */
    const char *shard = hp_shard_is_folder(argv[optind]) ? argv[optind] : NULL;
    hp_status st = shard ? HP_OK : cli_plan_flags_apply(&pf, NULL, &ov, &err);
    if (st == HP_OK) st = shard ? hp_moe_shard_config_open(&m, shard, &err) : hp_model_open(&m, argv[optind], NULL, &err);
    if (st == HP_OK && input && (st = hp_ids_load(&in.src, m->cfg.vocab_size, NULL, &cf.s.co.B, &cf.s.co.S, &err)) == HP_OK)
        cf.s.batch_given = cf.s.seq_given = true;
    if (st == HP_OK && input && cf.s.co.decode) { /* the input's rows are the sequences, its positions their context */
        if (!cf.s.context_given) cf.s.co.context = cf.s.co.S;
        cf.s.co.S = 1;
    }
    if (st == HP_OK && !shard) cli_plan_flags_freeze(&pf, m);
    if (st == HP_OK) st = cli_cost_measure(&cf, m, &err);
    if (st == HP_OK && routing) {
        if (!(m->family && hp_family_is_moe(m->family)))
            st = hp_err_set(&err, HP_ERR_INPUT, "--routing: %s is a dense model; it has no routing", m->path);
        else st = cli_cost_read_routing(&cf, m, routing, &err);
    }
    bool default_mesh = cli_plan_flags_default_mesh(&pf);
    if (st == HP_OK && shard) st = cli_plan_resolve(&pf, plan_path, shard, default_mesh, 1, m, &p, &ov, &err);
    else if (st == HP_OK) st = plan_path ? hp_shard_read_plan(&p, m, plan_path, NULL, &err) : hp_plan_derive(&p, m, &pf.po, &err);
    hp_cost_result res = {0};
    if (st == HP_OK) st = hp_cost_evaluate(&res, m, p, &cf.s, cf.format != 2, &err);
    const hp_shard_layout *l = res.layout;
    const hp_cost *cost = res.cost;
    hp_fit fit = res.fit;
    for (int i = 0, k = 0; st == HP_OK && input && i < fit.n; i++) { /* the input's shape is the batch: keep it */
        if (strcmp(fit.ch[i].flag, "--seq") && strcmp(fit.ch[i].flag, "--batch")) fit.ch[k++] = fit.ch[i];
        if (i == fit.n - 1) fit.n = k;
    }
    fit_args fa = {.fit = &fit, .argc = argc, .argv = argv};
    if (st == HP_OK && want_rank >= cost->world)
        st = hp_err_set(&err, HP_ERR_INPUT, "--rank %lld: the mesh has %lld ranks", (long long)want_rank,
                        (long long)cost->world);
    if (st == HP_OK) {
        int64_t ri = want_rank >= 0 ? want_rank : cost->max_rank;
        if (cf.format == 2) st = write_html(cf.output, m, p, cost, cf.s.budget, &err);
        else {
            char *buf = NULL;
            size_t len = 0;
            FILE *mem = cf.output ? open_memstream(&buf, &len) : NULL, *o = mem ? mem : stdout;
            if (cf.output && !mem) st = hp_err_set(&err, HP_ERR_NOMEM, "out of memory");
            else if (cf.format == 1) hp_cost_report_json(o, m, p, l, cost, ri, cf.s.budget, &fit, argc, argv);
            else report_text(o, m, p, l, cost, ri, detail, cf.s.budget, routing != NULL, &fa);
            if (mem) {
                fclose(mem);
                st = cli_write_atomic_err(cf.output, buf, len, "the report", &err);
                free(buf);
            }
        }
    }
    rc = st == HP_OK ? HP_EXIT_OK : cli_fail(&err);
    hp_cost_result_free(&res);
    hp_plan_free(p);
    hp_model_close(m);
    hp_overrides_free(ov);
    cli_cost_flags_free(&cf);
    return rc;
}
