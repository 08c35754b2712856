/*
 * report.c — the JSON reports of cost and advise (`--format json`, hp.cost, hp.advise): written here, once, for
 * the CLI and the JSON-in interface (src/api) alike; the changes that make a plan fit, as command lines.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/cost.h"
#include "hyperpar/overrides.h"
#include "hyperpar/report.h"
#include "hyperpar/run.h"
#include "hyperpar/shard.h"

void hp_json_fstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void put_word(char *buf, size_t cap, size_t *n, const char *word)
{
    bool plain = *word != '\0';
    for (const char *c = word; *c && plain; c++)
        plain = strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=,:+@%", *c) != NULL;
    int k;
    if (plain) k = snprintf(buf + *n, cap - *n, " %s", word);
    else {
        k = snprintf(buf + *n, cap - *n, " '");
        for (const char *c = word; k >= 0 && *n + (size_t)k < cap && *c; c++)
            k += snprintf(buf + *n + k, cap - *n - (size_t)k, *c == '\'' ? "'\\''" : "%c", *c);
        if (k >= 0 && *n + (size_t)k < cap) k += snprintf(buf + *n + k, cap - *n - (size_t)k, "'");
    }
    if (k > 0) *n = *n + (size_t)k < cap ? *n + (size_t)k : cap - 1;
}

/* Whether argv[i] is flag (as "--flag V" or "--flag=V"): the words it takes into *words. */
static bool is_flag(char **argv, int i, int argc, const char *flag, int *words)
{
    size_t l = strlen(flag);
    if (strncmp(argv[i], flag, l)) return false;
    if (argv[i][l] == '=') return *words = 1, true;
    if (argv[i][l] == '\0') return *words = i + 1 < argc ? 2 : 1, true;
    return false;
}

/* Whether argv[i] is the flag of change ch (or one it replaces: --global-batch with --batch, --train-state with
 * --zero 2 or 3): its words into *words. */
static bool replaced_by(char **argv, int i, int argc, const char *flag, const char *value, int *words)
{
    return is_flag(argv, i, argc, flag, words) ||
           (!strcmp(flag, "--batch") && is_flag(argv, i, argc, "--global-batch", words)) ||
           (!strcmp(flag, "--zero") && atoi(value) >= 2 && is_flag(argv, i, argc, "--train-state", words));
}

/* The command line that makes change ch: "hyperpar CMD" with argv[1..argc) (argv[0] is CMD), every occurrence of
 * ch's flag (and of --global-batch with --batch, of --train-state runtime with --zero 2 or 3) dropped and ch's
 * flag and value appended, each word quoted for a POSIX shell where it needs it. */
void hp_fit_command(char *buf, size_t cap, const char *cmd, int argc, char **argv, const hp_fit_change *ch)
{
    size_t n = 0;
    int k = snprintf(buf, cap, "hyperpar %s", cmd);
    n = k > 0 && (size_t)k < cap ? (size_t)k : 0;
    for (int i = 1; i < argc; i++) {
        int words = 0;
        if (replaced_by(argv, i, argc, ch->flag, ch->value, &words) ||
            (ch->flag2[0] && replaced_by(argv, i, argc, ch->flag2, ch->value2, &words))) {
            i += words - 1;
            continue;
        }
        put_word(buf, cap, &n, argv[i]);
    }
    put_word(buf, cap, &n, ch->flag);
    put_word(buf, cap, &n, ch->value);
    if (ch->flag2[0]) {
        put_word(buf, cap, &n, ch->flag2);
        put_word(buf, cap, &n, ch->value2);
    }
}

void hp_fit_json(FILE *o, const hp_fit *f, const char *cmd, int argc, char **argv)
{
    if (!f->binding) {
        fprintf(o, "null");
        return;
    }
    fprintf(o, "{\"binding\": ");
    hp_json_fstr(o, f->binding);
    fprintf(o, ", \"binding_bytes\": %llu, \"total_bytes\": %llu, \"budget\": %llu, \"reserve\": %llu, \"changes\": [",
            (unsigned long long)f->binding_bytes, (unsigned long long)f->total_bytes, (unsigned long long)f->budget,
            (unsigned long long)f->reserve);
    for (int i = 0; i < f->n; i++) {
        char line[HP_FIT_COMMAND_MAX];
        hp_fit_command(line, sizeof line, cmd, argc, argv, &f->ch[i]);
        fprintf(o, "%s{\"flag\": ", i ? ", " : "");
        hp_json_fstr(o, f->ch[i].flag);
        fprintf(o, ", \"value\": ");
        hp_json_fstr(o, f->ch[i].value);
        fprintf(o, ", \"with\": ");
        if (f->ch[i].flag2[0]) {
            fprintf(o, "{\"flag\": ");
            hp_json_fstr(o, f->ch[i].flag2);
            fprintf(o, ", \"value\": ");
            hp_json_fstr(o, f->ch[i].value2);
            fprintf(o, "}");
        } else {
            fprintf(o, "null");
        }
        fprintf(o, ", \"bytes\": %llu, \"mesh\": ", (unsigned long long)f->ch[i].bytes);
        if (f->ch[i].mesh[0]) hp_json_fstr(o, f->ch[i].mesh);
        else fprintf(o, "null");
        fprintf(o, ", \"command\": ");
        hp_json_fstr(o, line);
        fprintf(o, "}");
    }
    fprintf(o, "]}");
}

void hp_cost_engine_json(FILE *o, const hp_cost_model *m)
{
    const hp_cost_hardware *h = m->hw;
    bool gpu = hp_cost_model_gpu(m);
    fprintf(o, "\"engine\": \"%s\", \"hardware\": {\"name\": \"%s\", \"description\": ", gpu ? "estimate" : "hyperpar",
            h ? h->name : "cpu");
    hp_json_fstr(o, h ? h->desc : "hyperpar's own f32 runtime on this project's CPUs");
    fprintf(o, ", \"memory_bytes\": %llu", (unsigned long long)(h ? h->mem_bytes : 0));
    static const char *const names[] = {"flops", "hbm_bandwidth", "intra_bw", "inter_bw", "intra_latency",
                                        "inter_latency"};
    const double v[] = {m->gemm_flops, h ? h->hbm_bw : 0, m->bw_intra, m->bw_inter, m->lat_intra, m->lat_inter};
    hp_json_reals(o, names, v, sizeof v / sizeof *v);
    fprintf(o, ", \"ranks_per_node\": %lld, \"activation_bytes\": %d, \"recompute\": \"%s\", \"mem_reserve\": %llu, "
               "\"source\": ", (long long)m->ranks_per_node, gpu ? 2 : 4, hp_cost_recompute_name(m->recompute),
            (unsigned long long)m->mem_reserve);
    hp_json_fstr(o, h ? h->source : "hyperpar bench run (docs/cost.md)");
    static const char *const effs[] = {"gemm_eff", "link_eff"};
    const double e[] = {m->gemm_eff, m->link_eff};
    hp_json_reals(o, effs, e, sizeof e / sizeof *e);
    fprintf(o, ", \"eff_source\": ");
    hp_json_fstr(o, h ? h->eff_source : "1: the rates are hyperpar bench's measurements, not a datasheet's");
    fprintf(o, "}");
}

void hp_json_count(FILE *o, double v)
{
    if (!isfinite(v)) fprintf(o, "null");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0) fprintf(o, "%.0f", v); /* below 2^53: exact */
    else fprintf(o, "%.17g", v);
}

void hp_json_real(FILE *o, double v)
{
    if (!isfinite(v)) fprintf(o, "null");
    else fprintf(o, "%.17g", v);
}

void hp_json_reals(FILE *o, const char *const *names, const double *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        fprintf(o, ", \"%s\": ", names[i]);
        hp_json_real(o, v[i]);
    }
}

static void json_model(FILE *o, const hp_cost_model *m)
{
    fprintf(o, "{\"state\": \"%s\", \"grad_bytes\": %d, \"master_bytes\": %d, \"optim_bytes\": %d, \"zero\": %d, "
            "\"recompute\": \"%s\", \"kv_bytes\": %d",
            m->state == HP_COST_STATE_MEGATRON || hp_cost_model_gpu(m) ? "megatron" : "runtime", m->grad_bytes,
            m->master_bytes, m->optim_bytes, m->zero, hp_cost_recompute_name(m->recompute), m->kv_bytes);
    static const char *const names[] = {"gemm_flops", "gemm_eff", "link_eff", "bw_intra", "bw_inter", "lat_intra",
                                        "lat_inter", "mem_bw"};
    const double v[] = {m->gemm_flops, m->gemm_eff, m->link_eff, m->bw_intra, m->bw_inter, m->lat_intra, m->lat_inter,
                        m->mem_bw};
    hp_json_reals(o, names, v, sizeof v / sizeof *v);
    fprintf(o, ", \"ranks_per_node\": %lld}", (long long)m->ranks_per_node);
}

static void json_kinds(FILE *o, const uint64_t *v)
{
    fprintf(o, "{");
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++)
        fprintf(o, "%s\"%s\": %llu", k ? ", " : "", hp_run_coll_name((hp_run_coll)k), (unsigned long long)v[k]);
    fprintf(o, "}");
}

/* ", "name": v", or null when the figure is not derived (the runtime refuses the plan). */
static void json_u64(FILE *o, const char *name, uint64_t v, bool derived)
{
    if (derived) fprintf(o, ", \"%s\": %llu", name, (unsigned long long)v);
    else fprintf(o, ", \"%s\": null", name);
}

/* ", "name": n", null when n < 0 (no budget, or not derived). */
static void json_i64(FILE *o, const char *name, int64_t n)
{
    if (n >= 0) fprintf(o, ", \"%s\": %lld", name, (long long)n);
    else fprintf(o, ", \"%s\": null", name);
}

static const char *cost_mode_name(const hp_cost *c)
{
    return c->train ? "train" : c->decode ? "decode" : "infer";
}

/* "pipeline": null without pp; else the stages, the schedule, the step's makespan and each stage's worst
 * evaluated rank (null figures for a stage none of whose ranks was evaluated). */
static void json_pipeline(FILE *o, const hp_cost *c)
{
    fprintf(o, ", \"pipeline\": ");
    if (c->pp <= 1 || !c->stages) {
        fprintf(o, "null");
        return;
    }
    fprintf(o, "{\"pp\": %lld, \"virtual\": %lld, \"schedule\": ", (long long)c->pp, (long long)c->pp_virtual);
    if (c->train) fprintf(o, "\"%s\"", hp_pp_sched_name(c->pp_sched));
    else fprintf(o, "null");
    fprintf(o, ", \"t_makespan\": ");
    hp_json_real(o, c->t_makespan);
    fprintf(o, ", \"stages\": [");
    for (int64_t s = 0; s < c->pp; s++) {
        const hp_cost_stage *g = &c->stages[s];
        bool d = g->evaluated;
        fprintf(o, "%s\n  {\"stage\": %lld, \"ranks\": [%lld, %lld], \"chunks\": %lld, \"first_layer\": %lld, "
                   "\"layers\": %lld, \"embedding\": %s, \"head\": %s, \"rank\": ",
                s ? "," : "", (long long)s, (long long)g->rank_lo, (long long)g->rank_hi, (long long)g->n_chunks,
                (long long)g->first_layer, (long long)g->n_layers, g->embedding ? "true" : "false",
                g->head ? "true" : "false");
        if (d) fprintf(o, "%lld", (long long)c->ranks[g->max_rank].rank);
        else fprintf(o, "null");
        json_u64(o, "weight_bytes", g->weight_bytes, d);
        json_u64(o, "activation_bytes", g->act_bytes, d);
        json_u64(o, "saved_bytes", g->saved_bytes, d);
        json_u64(o, "total_bytes", g->total_bytes, d);
        json_u64(o, "p2p_bytes", g->p2p_bytes, d);
        json_i64(o, "in_flight", d ? g->in_flight : -1);
        fprintf(o, ", \"t_busy\": ");
        hp_json_real(o, d ? g->t_busy : NAN);
        fprintf(o, "}");
    }
    fprintf(o, "\n]}");
}

void hp_cost_report_json(FILE *o, const hp_model *m, const hp_plan *p, const hp_shard_layout *l, const hp_cost *c,
                         int64_t ri, uint64_t budget, const hp_fit *fit, int argc, char **argv)
{
    char mesh[160], coords[160];
    hp_mesh_str(&p->mesh, mesh, sizeof mesh);
    fprintf(o, "{\"model_path\": ");
    hp_json_fstr(o, m->path);
    fprintf(o, ", \"mesh\": ");
    hp_json_fstr(o, mesh);
    fprintf(o, ", \"world\": %lld, \"batch\": %lld, \"seq\": %lld, \"seq_padded\": %lld, \"mode\": \"%s\", "
           "\"total_weight_bytes\": %llu, \"max_rank\": %lld, \"model\": ",
           (long long)c->world, (long long)c->B, (long long)c->S, (long long)c->S_pad, cost_mode_name(c),
           (unsigned long long)hp_model_total_bytes(m), (long long)c->ranks[c->max_rank].rank);
    json_model(o, &c->mdl);
    fprintf(o, ", \"micro_batch\": %lld, \"micro_batches\": %lld, \"mem_per_rank\": %llu, \"mem_reserve\": %llu, "
               "\"mem_usable\": %llu, ", (long long)c->micro_batch, (long long)c->n_micro, (unsigned long long)budget,
            (unsigned long long)c->mdl.mem_reserve, (unsigned long long)hp_cost_usable(&c->mdl, budget));
    hp_cost_engine_json(o, &c->mdl);
    fprintf(o, ", \"fit\": ");
    if (fit->binding && fit->budget && fit->total_bytes > hp_cost_usable(&c->mdl, fit->budget))
        hp_fit_json(o, fit, "cost", argc, argv);
    else fprintf(o, "null");
    if (c->decode) fprintf(o, ", \"context\": %lld", (long long)c->context);
    else fprintf(o, ", \"context\": null");
    json_i64(o, "seqs_fit", c->decode ? hp_cost_seqs(c, budget) : -1);
    fprintf(o, ", \"refused\": ");
    if (c->refused[0]) hp_json_fstr(o, c->refused);
    else fprintf(o, "null");
    fprintf(o, ", \"note\": ");
    if (c->note[0]) hp_json_fstr(o, c->note);
    else fprintf(o, "null");
    if (c->train) { /* MFU is a training step's measure */
        fprintf(o, ", \"model_flops\": ");
        hp_json_count(o, c->refused[0] ? NAN : c->model_flops);
        fprintf(o, ", \"mfu\": ");
        hp_json_real(o, c->refused[0] ? NAN : c->mfu);
    }
    json_pipeline(o, c);
    fprintf(o, ", \"estimates\": [\"activation_bytes\", \"kv_cache_bytes\", \"grad_bytes\", \"optim_bytes\", "
           "\"master_bytes\", \"saved_bytes\", \"gather_bytes\", \"flops\", \"attn_flops\", \"recompute_flops\", "
           "\"t_compute\", \"t_comm\", \"t_overlap\", \"t_exposed\", \"t_bubble\", \"t_step\", \"model_flops\", "
           "\"mfu\", \"kv_seq_bytes\", \"read_bytes\", \"t_memory\", \"seqs_fit\"], \"ranks\": [");
    for (int64_t i = 0; i < c->n_ranks; i++) {
        const hp_cost_rank *r = &c->ranks[i];
        fprintf(o, "%s\n  {\"rank\": %lld, \"coords\": ", i ? "," : "", (long long)r->rank);
        hp_json_fstr(o, hp_shard_coords_str(l, r->rank, coords, sizeof coords));
        bool d = !c->refused[0]; /* refused: only the weights are derived, the rest is null, never 0 */
        fprintf(o, ", \"ep_index\": %lld, \"weight_bytes\": %llu, \"stored_bytes\": %llu", (long long)r->ep,
                (unsigned long long)r->weight_bytes, (unsigned long long)r->stored_bytes);
        json_u64(o, "activation_bytes", r->act_bytes, d);
        json_u64(o, "workspace_bytes", r->workspace_bytes, d);
        json_u64(o, "window_bytes", r->window_bytes, d);
        json_u64(o, "kv_cache_bytes", r->kv_bytes, d);
        json_u64(o, "kv_seq_bytes", r->kv_seq_bytes, d);
        json_u64(o, "grad_bytes", r->grad_bytes, d);
        json_u64(o, "optim_bytes", r->optim_bytes, d);
        json_u64(o, "master_bytes", r->master_bytes, d);
        json_u64(o, "saved_bytes", r->saved_bytes, d);
        json_u64(o, "gather_bytes", r->gather_bytes, d);
        json_u64(o, "total_bytes", r->total_bytes, d);
        fprintf(o, ", \"stage\": %lld", (long long)r->stage);
        json_u64(o, "p2p_bytes", r->p2p_bytes, d);
        json_u64(o, "p2p_calls", r->p2p_calls, d);
        json_i64(o, "in_flight", d ? r->in_flight : -1);
        fprintf(o, ", \"comm\": ");
        if (d) {
            fprintf(o, "{\"bytes\": ");
            json_kinds(o, r->bytes);
            fprintf(o, ", \"calls\": ");
            json_kinds(o, r->calls);
            fprintf(o, "}");
        } else {
            fprintf(o, "null");
        }
        json_u64(o, "sent_bytes", r->sent_bytes, d);
        json_u64(o, "wire_bytes", r->wire_bytes, d);
        json_u64(o, "net_bytes", r->sent_bytes, d); /* net_bytes: sent_bytes' old name */
        fprintf(o, ", \"flops\": ");
        hp_json_count(o, d ? r->flops : NAN);
        fprintf(o, ", \"t_compute\": ");
        hp_json_real(o, d ? r->t_compute : NAN);
        fprintf(o, ", \"t_comm\": ");
        hp_json_real(o, d ? r->t_comm : NAN);
        fprintf(o, ", \"t_step\": ");
        hp_json_real(o, d ? r->t_step : NAN);
        static const char *const tn[] = {"attn_flops", "recompute_flops", "t_overlap", "t_exposed", "t_bubble", "t_busy"};
        const double tv[] = {r->attn_flops, r->recompute_flops, r->t_overlap, r->t_exposed, r->t_bubble, r->t_busy};
        for (size_t k = 0; k < sizeof tv / sizeof *tv; k++) {
            fprintf(o, ", \"%s\": ", tn[k]);
            if (k < 2) hp_json_count(o, d ? tv[k] : NAN);
            else hp_json_real(o, d ? tv[k] : NAN);
        }
        if (c->train) {
            fprintf(o, ", \"mfu\": ");
            hp_json_real(o, d ? r->mfu : NAN);
        }
        if (c->decode) {
            json_u64(o, "read_bytes", r->read_bytes, d);
            fprintf(o, ", \"t_memory\": ");
            hp_json_real(o, d ? r->t_memory : NAN);
            uint64_t usable = hp_cost_usable(&c->mdl, budget);
            json_i64(o, "seqs_fit", !d ? -1 : budget && !usable ? 0 : hp_cost_rank_seqs(r, usable));
        }
        fprintf(o, ", \"ep_estimated\": %s}", r->ep_estimated ? "true" : "false");
    }
    const hp_cost_rank *r = &c->ranks[ri];
    fprintf(o, "\n], \"events_rank\": %lld, \"events\": [", (long long)r->rank);
    for (size_t i = 0; i < r->n_ev; i++) {
        const hp_cost_event *e = &r->ev[i];
        fprintf(o, "%s\n  {\"layer\": %d, \"where\": ", i ? "," : "", e->layer);
        hp_json_fstr(o, e->where);
        fprintf(o, ", \"step\": \"%s\", \"kind\": \"%s\", \"axis\": \"%s\", \"group\": %d, \"calls\": %lld, \"bytes\": %llu, "
               "\"wire_bytes\": %llu, \"estimated\": %s, \"seconds\": ",
               e->step, hp_run_coll_name(e->kind), e->axis, e->group, (long long)e->calls, (unsigned long long)e->bytes,
               (unsigned long long)e->wire_bytes, e->estimated ? "true" : "false");
        hp_json_real(o, e->seconds);
        fprintf(o, "}");
    }
    fprintf(o, "\n]}\n");
}


/* The plan flags that make candidate c. With EP, the EP compute too (it is never chosen silently): --ep-compute as
 * given, else the family's suggestion unless --overrides (which may declare it) were given. */
void hp_advise_flags(char *buf, size_t cap, const hp_model *m, const hp_advise_cand *c, const char *ep_compute,
                     const char *overrides)
{
    int n;
    char pp[48] = "", ppm[48] = "", virt[48] = "";
    if (c->pp > 1) snprintf(pp, sizeof pp, " --pp %lld", (long long)c->pp);
    if (c->pp > 1) snprintf(ppm, sizeof ppm, "pp=%lld,", (long long)c->pp);
    if (c->pp_virtual > 1) snprintf(virt, sizeof virt, " --pp-virtual %lld", (long long)c->pp_virtual);
    if (c->ep_axis)
        n = snprintf(buf, cap, "--mesh %sdp=%lld,cp=%lld,tp=%lld,ep=%lld --ep-axis%s", ppm, (long long)c->dp,
                     (long long)c->cp, (long long)c->tp, (long long)c->ep, virt);
    else if (c->ep > 1)
        n = snprintf(buf, cap, "--dp %lld --cp %lld --tp %lld --ep %lld%s%s", (long long)c->dp, (long long)c->cp,
                     (long long)c->tp, (long long)c->ep, pp, virt);
    else
        n = snprintf(buf, cap, "--dp %lld --cp %lld --tp %lld%s%s", (long long)c->dp, (long long)c->cp,
                     (long long)c->tp, pp, virt);
    const char *ec = ep_compute ? ep_compute
                     : !overrides && hp_archetype_suggest(m) ? "suggested" : NULL;
    if (c->ep > 1 && ec && n >= 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, " --ep-compute %s", ec);
}


/* What the shard command reads: MODEL when it holds the weights; a config.json (meta mode) holds none, so the
 * command names a placeholder the user replaces (HP_ADVISE_CKPT_NOTE says so), never a command that cannot run. */
#define CKPT_PLACEHOLDER "CHECKPOINT"

/* The hyperpar plan + shard command line that makes candidate c. */
void hp_advise_command(char *buf, size_t cap, const hp_model *m, const hp_advise_cand *c, const char *model_arg,
                       const char *ep_compute, const char *overrides)
{
    char fl[300];
    hp_advise_flags(fl, sizeof fl, m, c, ep_compute, overrides);
    snprintf(buf, cap, "hyperpar plan %s %s%s%s -o plan.json && hyperpar shard %s --plan plan.json --out shards",
             model_arg, fl, overrides ? " --overrides " : "", overrides ? overrides : "",
             m->meta ? CKPT_PLACEHOLDER : model_arg);
}

void hp_advice_json(FILE *o, const hp_model *m, const hp_advice *a, const hp_fit *fit, const char *model_arg,
                    const char *ep_compute, const char *overrides, int argc, char **argv)
{
    fprintf(o, "{\"model_path\": ");
    hp_json_fstr(o, m->path);
    fprintf(o, ", \"world\": %lld, \"mem_per_rank\": %llu, \"batch\": %lld, \"seq\": %lld, \"mode\": \"%s\", "
               "\"seconds\": %.17g, \"micro_batch\": %lld, \"zero\": %d, \"context\": ",
            (long long)a->world, (unsigned long long)a->mem_per_rank, (long long)a->B, (long long)a->S,
            a->train ? "train" : a->decode ? "decode" : "infer", a->search_seconds, (long long)a->micro_batch,
            a->mdl.zero);
    if (a->decode) fprintf(o, "%lld", (long long)a->context);
    else fprintf(o, "null");
    fprintf(o, ", \"prefer\": \"%s\", \"mem_reserve\": %llu, \"mem_usable\": %llu, \"chosen\": ",
            a->prefer_headroom ? "headroom" : "time", (unsigned long long)a->mdl.mem_reserve,
            (unsigned long long)hp_cost_usable(&a->mdl, a->mem_per_rank));
    if (a->train) {
        fprintf(o, "{\"micro_batch\": %lld, \"recompute\": \"%s\", \"relaxed\": %s, \"reason\": ",
                (long long)a->micro_batch, hp_cost_recompute_name(a->mdl.recompute), a->relaxed ? "true" : "false");
        hp_json_fstr(o, a->chosen);
        fprintf(o, "}, ");
    } else {
        fprintf(o, "null, ");
    }
    hp_cost_engine_json(o, &a->mdl);
    fprintf(o, ", \"fit\": ");
    if (!a->n_ok && fit) hp_fit_json(o, fit, "advise", argc, argv);
    else fprintf(o, "null");
    fprintf(o, ", \"candidates\": [");
    for (int i = 0; i < a->n_cands; i++) {
        const hp_advise_cand *c = &a->cands[i];
        fprintf(o, "%s\n  {\"mesh\": ", i ? "," : "");
        hp_json_fstr(o, c->mesh);
        fprintf(o, ", \"dp\": %lld, \"cp\": %lld, \"tp\": %lld, \"ep\": %lld, \"ep_axis\": %s, \"pp\": %lld, "
                   "\"pp_virtual\": %lld, \"ok\": %s",
                (long long)c->dp, (long long)c->cp, (long long)c->tp, (long long)c->ep, c->ep_axis ? "true" : "false",
                (long long)c->pp, (long long)c->pp_virtual, c->ok ? "true" : "false");
        if (c->ok || c->max_bytes) {
            fprintf(o, ", \"max_bytes\": %llu, \"weight_bytes\": %llu, \"activation_bytes\": %llu, \"state_bytes\": "
                       "%llu, \"sent_bytes\": %llu, \"wire_bytes\": %llu, \"t_step\": %.17g, \"t_compute\": %.17g, "
                       "\"t_comm\": %.17g",
                    (unsigned long long)c->max_bytes, (unsigned long long)c->weight_bytes,
                    (unsigned long long)c->act_bytes, (unsigned long long)c->state_bytes,
                    (unsigned long long)c->sent_bytes, (unsigned long long)c->wire_bytes, c->t_step, c->t_compute,
                    c->t_comm);
            if (c->pp > 1) fprintf(o, ", \"t_bubble\": %.17g, \"t_busy\": %.17g", c->t_bubble, c->t_busy);
            if (a->decode)
                fprintf(o, ", \"t_memory\": %.17g, \"kv_seq_bytes\": %llu, \"seqs_fit\": %lld", c->t_memory,
                        (unsigned long long)c->kv_seq_bytes, (long long)c->seqs);
            if (a->train)
                fprintf(o, ", \"micro_batch\": %lld, \"micro_batches\": %lld, \"recompute\": \"%s\"",
                        (long long)c->micro_batch, (long long)c->n_micro, hp_cost_recompute_name(a->mdl.recompute));
        }
        if (c->ok) {
            char cmd[HP_ADVISE_COMMAND_MAX];
            hp_advise_command(cmd, sizeof cmd, m, c, model_arg, ep_compute, overrides);
            fprintf(o, ", \"command\": ");
            hp_json_fstr(o, cmd);
            if (m->meta) {
                fprintf(o, ", \"command_note\": ");
                hp_json_fstr(o, HP_ADVISE_CKPT_NOTE);
            }
        } else {
            fprintf(o, ", \"reason\": ");
            hp_json_fstr(o, c->reason);
            if (c->binding) {
                fprintf(o, ", \"binding\": ");
                hp_json_fstr(o, c->binding);
                fprintf(o, ", \"binding_bytes\": %llu", (unsigned long long)c->binding_bytes);
            }
        }
        fprintf(o, "}");
    }
    fprintf(o, "\n]}\n");
}

