/*
 * html.c — the pictures of `hyperpar cost --format html` and `hyperpar advise --format html`: one self-contained
 * HTML5 page each, inline CSS and inline SVG only (nothing from the network; the one script marks <body> with
 * data-hp-error when the page raises an error, for tests).
 *
 * cost: the mesh as a grid of ranks coloured by memory against the budget (green, yellow, red; dark red over
 * it), a table of what each rank holds (its coordinates, its experts, its slices of the heads and the sequence,
 * its memory), a stacked bar per rank (weights, activations, KV cache or training state) against the budget line,
 * and per layer the collectives of the most-loaded rank (a stacked bar each, and a table). advise: the accepted
 * meshes' memory side by side against the budget, their step times as bars from a baseline near the fastest (so
 * that small differences show; the baseline is printed), then tables of the accepted and the rejected ones.
 * Decode (serving) adds the KV cache per sequence, the sequences that fit and what bounds the step. Every legend
 * entry of a page has its own colour (one palette, below). Estimates (docs/cost.md) carry an asterisk. train (--plot): the loss (and the eval loss) and the
 * gradient norm against the step, one polyline per curve and finite stretch.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/cost.h"
#include "hyperpar/plan.h"

#define GRID_MAX_CELLS 1024 /* ranks drawn in the mesh grid */
#define GRID_MAX_COLS 128   /* wider rows wrap */
#define BARS_MAX_RANKS 64   /* ranks drawn as bars */
#define BARS_MAX_LAYERS 256 /* layers drawn as bars */
#define ADVISE_MAX_DRAWN 16 /* candidates drawn in the chart */
#define EST "*"             /* marks an estimate */

/* One palette for every legend entry a page shows, no colour twice (Tableau 10 and two more): the memory parts,
 * the collective kinds, the budget line and the step time. */
_Static_assert(HP_RUN_COLL_COUNT == 5, "one colour per collective kind");
/* weights, activations, KV cache or training state */
static const char *const mem_colour[3] = {"#4e79a7", "#f28e2b", "#59a14f"};
/* all-gather, all-reduce, reduce-scatter, gather, all-to-all */
static const char *const coll_colour[HP_RUN_COLL_COUNT] = {"#76b7b2", "#edc948", "#b07aa1", "#9c755f", "#ff9da7"};
#define BUDGET_COLOUR "#c0002a"
#define TIME_COLOUR "#7f7f7f"
#define RANKS_MAX_ROWS 1024 /* ranks listed in the table of what each holds */

/* A short formatted figure, returned by value (valid until the end of the full expression that uses it). */
typedef struct txt {
    char s[48];
} txt;

static txt fbytes(uint64_t b)
{
    txt t;
    hp_format_bytes(b, t.s, sizeof t.s);
    return t;
}

static txt fsec(double s)
{
    txt t;
    /* the text's digits (hp_format_seconds): the ranking ties times that print the same */
    if (!(s > 0)) snprintf(t.s, sizeof t.s, "0 s");
    else hp_format_seconds(s, t.s, sizeof t.s);
    return t;
}

static txt fpct(double frac)
{
    txt t;
    snprintf(t.s, sizeof t.s, "%.0f%%", frac >= 0 ? frac * 100 : 0);
    return t;
}

/* ---- text, escaped for HTML (element content and attribute values alike) ---- */

static void esc(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void vesc(FILE *f, const char *fmt, va_list ap)
{
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    esc(f, buf);
}

/* printf, escaped */
static void escf(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void escf(FILE *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vesc(f, fmt, ap);
    va_end(ap);
}

/* ---- colour ---- */

/* frac of the budget: green (0) through yellow (0.5) to red (1); dark red beyond (over the budget). */
static txt heat(double frac)
{
    static const int stop[3][3] = {{46, 160, 67}, {240, 200, 40}, {215, 48, 39}};
    txt t;
    if (!(frac >= 0)) frac = 0;
    if (frac > 1) {
        snprintf(t.s, sizeof t.s, "#7a0019");
        return t;
    }
    int i = frac < 0.5 ? 0 : 1;
    double u = frac < 0.5 ? frac * 2 : (frac - 0.5) * 2;
    int rgb[3];
    for (int k = 0; k < 3; k++) rgb[k] = (int)(stop[i][k] + u * (stop[i + 1][k] - stop[i][k]) + 0.5);
    snprintf(t.s, sizeof t.s, "#%02x%02x%02x", rgb[0], rgb[1], rgb[2]);
    return t;
}

/* ---- SVG pieces ---- */

static void svg_open(FILE *f, double w, double h, const char *label)
{
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "role=\"img\" aria-label=\"", w, h, w, h);
    esc(f, label);
    fputs("\">\n", f);
}

static void rect(FILE *f, double x, double y, double w, double h, const char *fill)
{
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", x, y, w, h, fill);
}

/* A rectangle with a tooltip (its SVG <title>). */
static void rect_tip(FILE *f, double x, double y, double w, double h, const char *fill, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
static void rect_tip(FILE *f, double x, double y, double w, double h, const char *fill, const char *fmt, ...)
{
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>", x, y, w, h, fill);
    va_list ap;
    va_start(ap, fmt);
    vesc(f, fmt, ap);
    va_end(ap);
    fputs("</title></rect>\n", f);
}

/* anchor: start, middle or end; cls: a class of the page's style ("" none). */
static void text(FILE *f, double x, double y, const char *anchor, const char *cls, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static void text(FILE *f, double x, double y, const char *anchor, const char *cls, const char *fmt, ...)
{
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s%s%s>", x, y, anchor, cls[0] ? " class=\"" : "", cls,
            cls[0] ? "\"" : "");
    va_list ap;
    va_start(ap, fmt);
    vesc(f, fmt, ap);
    va_end(ap);
    fputs("</text>\n", f);
}

static void line(FILE *f, double x1, double y1, double x2, double y2, const char *stroke, bool dashed)
{
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"%s\"%s/>\n", x1, y1,
            x2, y2, stroke, dashed ? "2" : "1", dashed ? " stroke-dasharray=\"6 3\"" : "");
}

/* One part of a stacked bar. */
typedef struct seg {
    uint64_t v;
    const char *colour, *name;
    bool est;
} seg;

/* A horizontal stacked bar from x at y, scale pixels per byte, a tooltip per part naming `who`; returns its end. */
static double hbar(FILE *f, double x, double y, double h, double scale, const seg *s, int n, const char *who)
{
    for (int i = 0; i < n; i++) {
        double w = (double)s[i].v * scale;
        if (w <= 0) continue;
        rect_tip(f, x, y, w, h, s[i].colour, "%s: %s %s%s", who, s[i].name, fbytes(s[i].v).s, s[i].est ? EST : "");
        x += w;
    }
    return x;
}

/* A vertical stacked bar standing on base (y grows downwards). */
static void vbar(FILE *f, double x, double base, double w, double scale, const seg *s, int n, const char *who)
{
    for (int i = 0; i < n; i++) {
        double h = (double)s[i].v * scale;
        if (h <= 0) continue;
        base -= h;
        rect_tip(f, x, base, w, h, s[i].colour, "%s: %s %s%s", who, s[i].name, fbytes(s[i].v).s, s[i].est ? EST : "");
    }
}

/* ---- the page ---- */

static const char page_style[] =
    "body{font-family:sans-serif;margin:24px;color:#222;background:#fff}\n"
    "h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:28px 0 8px}\n"
    "p.sum,p.note{margin:4px 0;color:#444}p.note{font-size:13px}\n"
    ".key{display:inline-block;margin:0 14px 6px 0;font-size:13px}\n"
    ".key i{display:inline-block;width:14px;height:14px;margin-right:5px;vertical-align:-2px;border:1px solid #999}\n"
    "table{border-collapse:collapse;font-size:13px;margin:6px 0}\n"
    "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}\n"
    "th{background:#f0f0f0}td.n{text-align:right;white-space:nowrap}\n"
    /* identifiers never break inside a token; numbers and command lines not at all; wide tables scroll */
    "td,th,p,.key{overflow-wrap:normal;word-break:keep-all}\n"
    "code,.id{white-space:nowrap}code{font-size:12px}\n"
    "div.scroll{overflow-x:auto;max-width:100%}\n"
    "svg{display:block;margin:6px 0}svg text{font-size:11px;fill:#222}\n"
    "svg text.in{pointer-events:none;font-size:10px}svg text.hot{fill:#fff}svg text.b{fill:" BUDGET_COLOUR "}\n";

static void page_open(FILE *f, const char *kind, const char *title)
{
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>hyperpar ", f);
    escf(f, "%s: %s", kind, title ? title : "");
    fprintf(f, "</title>\n<style>\n%s</style>\n", page_style);
    fputs("<script>window.addEventListener('error',function(){document.body.setAttribute('data-hp-error','1')});"
          "</script>\n</head>\n<body data-hp-ok=\"1\">\n<h1>hyperpar ", f);
    escf(f, "%s: %s", kind, title ? title : "");
    fputs("</h1>\n", f);
}

/* note: the page's last paragraph (NULL: none). */
static int page_close(FILE *f, const char *note)
{
    if (note) {
        fputs("<p class=\"note\">", f);
        esc(f, note);
        fputs("</p>\n", f);
    }
    fputs("</body>\n</html>\n", f);
    return fflush(f) != 0 || ferror(f) ? -1 : 0;
}

static void key(FILE *f, const char *colour, const char *label)
{
    fprintf(f, "<span class=\"key\"><i style=\"background:%s\"></i>", colour);
    esc(f, label);
    fputs("</span>\n", f);
}

/* ---- cost ---- */

static uint64_t state_bytes(const hp_cost *c, const hp_cost_rank *r)
{
    return c->train ? r->grad_bytes + r->optim_bytes + r->master_bytes + r->saved_bytes : r->kv_bytes;
}

static const char *state_name(const hp_cost *c)
{
    return c->train ? "training state" : "KV cache";
}

static const char *step_name(const hp_cost *c)
{
    return c->train ? "training step" : c->decode ? "decode step (one new token per sequence)" : "forward step";
}

/* The reference of the colours: the budget, or else the most-loaded rank. */
static uint64_t cost_ref(const hp_cost *c, uint64_t budget)
{
    return budget ? budget : c->ranks[c->max_rank].total_bytes;
}

static void mem_segs(const hp_cost *c, const hp_cost_rank *r, seg s[3])
{
    s[0] = (seg){r->weight_bytes, mem_colour[0], "weights", false};
    s[1] = (seg){r->act_bytes, mem_colour[1], "activations", true};
    s[2] = (seg){state_bytes(c, r), mem_colour[2], state_name(c), true};
}

/* "dp=0, cp=1, tp=3" */
static const char *coords_str(const hp_mesh *mesh, int64_t rank, int first, int last, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int d = first; mesh && d < last && n < cap; d++) {
        int k = snprintf(buf + n, cap - n, "%s%s=%lld", n ? ", " : "", mesh->names[d],
                         (long long)hp_mesh_coord(mesh, rank, mesh->names[d]));
        if (k < 0) break;
        n += (size_t)k;
    }
    return buf;
}

/* Decode's own figures: the KV cache per sequence, the sequences that fit, what bounds the slowest rank's step. */
static void decode_summary(FILE *f, const hp_cost *c, uint64_t budget)
{
    const hp_cost_rank *m = &c->ranks[c->max_rank], *slow = &c->ranks[0];
    for (int64_t i = 1; i < c->n_ranks; i++)
        if (c->ranks[i].t_step > slow->t_step) slow = &c->ranks[i];
    int64_t n = hp_cost_seqs(c, budget);
    fputs("<p class=\"sum\">", f);
    escf(f, "KV cache per sequence on rank %lld: %s" EST "; ", (long long)m->rank, fbytes(m->kv_seq_bytes).s);
    if (n < 0) esc(f, "sequences that fit: needs --mem-per-rank");
    else escf(f, "sequences that fit in %s per rank: %lld" EST " (%lld per replica x dp=%lld)", fbytes(budget).s,
              (long long)n, (long long)(n / (c->dp > 0 ? c->dp : 1)), (long long)c->dp);
    fputs("</p>\n<p class=\"sum\">", f);
    escf(f, "step of rank %lld: %s" EST " = max(compute %s, memory %s: %s read at %.3g GB/s) + communication %s: %s-bound",
         (long long)slow->rank, fsec(slow->t_step).s, fsec(slow->t_compute).s, fsec(slow->t_memory).s,
         fbytes(slow->read_bytes).s, c->mdl.mem_bw / 1e9, fsec(slow->t_comm).s,
         slow->t_memory >= slow->t_compute ? "memory" : "compute");
    fputs("</p>\n", f);
}

static void cost_summary(FILE *f, const hp_cost *c, const hp_mesh *mesh, uint64_t budget)
{
    char ms[256] = "";
    if (mesh) hp_mesh_str(mesh, ms, sizeof ms);
    const hp_cost_rank *m = &c->ranks[c->max_rank];
    fputs("<p class=\"sum\">", f);
    escf(f, "mesh %s; world %lld; batch B=%lld, S=%lld", ms[0] ? ms : "?", (long long)c->world, (long long)c->B,
         (long long)c->S);
    if (c->S_pad != c->S) escf(f, " (padded to %lld)", (long long)c->S_pad);
    if (c->decode)
        escf(f, "; decode (serving): %lld sequences, one new token each, a KV cache of %lld positions per sequence",
             (long long)c->B, (long long)c->context);
    else
        escf(f, "; %s", c->train ? "training (forward and backward)" : "inference (one forward step)");
    fputs("</p>\n<p class=\"sum\">", f);
    if (c->refused[0]) /* only the weights are derived: no total, no 0 B */
        escf(f, "most-loaded rank %lld: weights %s; activations, %s and the total not derived; budget %s",
             (long long)m->rank, fbytes(m->weight_bytes).s, state_name(c),
             budget ? fbytes(budget).s : "none (colours against the most-loaded rank's weights)");
    else
        escf(f, "most-loaded rank %lld: total %s" EST " (weights + activations + %s); budget %s", (long long)m->rank,
             fbytes(m->total_bytes).s, state_name(c),
             budget ? fbytes(budget).s : "none (colours against the most-loaded rank)");
    if (budget && !c->refused[0]) escf(f, " (%s used)", fpct((double)m->total_bytes / (double)budget).s);
    fputs("</p>\n", f);
    if (c->decode && !c->refused[0]) decode_summary(f, c, budget);
    if (c->refused[0]) {
        fputs("<p class=\"sum\">", f);
        esc(f, "Only the weights are derived: 'hyperpar run' refuses this plan: ");
        esc(f, c->refused);
        fputs("</p>\n", f);
    }
}

static void cost_legend(FILE *f, const hp_cost *c, uint64_t budget)
{
    char s[64];
    fputs("<div>\n", f);
    key(f, mem_colour[0], "weights (exact)");
    key(f, mem_colour[1], "activations" EST);
    snprintf(s, sizeof s, "%s" EST, state_name(c));
    key(f, mem_colour[2], s);
    if (budget) key(f, BUDGET_COLOUR, "budget");
    fputs("</div>\n<div>\n", f);
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) key(f, coll_colour[k], hp_run_coll_name((hp_run_coll)k));
    fputs("</div>\n", f);
    /* the heat scale of the grid */
    svg_open(f, 440, 34, "memory colour scale");
    for (int i = 0; i < 20; i++) rect(f, 60 + i * 15, 4, 15, 14, heat((i + 0.5) / 20).s);
    rect(f, 376, 4, 30, 14, heat(2).s);
    text(f, 0, 15, "start", "", "memory:");
    text(f, 60, 30, "start", "", "0%%");
    text(f, 210, 30, "middle", "", "50%%");
    text(f, 360, 30, "end", "", "100%%");
    text(f, 391, 30, "middle", "", ">100%%");
    fputs("</svg>\n", f);
}

/* Mesh geometry of the grid: columns = the last dim (wrapped beyond GRID_MAX_COLS). */
static int64_t grid_cols(const hp_cost *c, const hp_mesh *mesh)
{
    int64_t cols = mesh && mesh->n_dims > 0 ? mesh->sizes[mesh->n_dims - 1] : c->world;
    if (cols < 1 || cols > c->world) cols = c->world;
    return cols > GRID_MAX_COLS ? GRID_MAX_COLS : cols;
}

static int64_t axis_size(const hp_mesh *mesh, const char *axis)
{
    int64_t n = mesh ? hp_mesh_size(mesh, axis) : 1;
    return n > 0 ? n : 1;
}

/* The experts rank k holds: its EP slot's block of them (whole), or every expert cut over tp, or all of them. */
static const char *rank_experts(const hp_cost_rank *k, const hp_mesh *mesh, const cli_html_model *md, char *buf,
                                size_t cap)
{
    int64_t E = md ? md->n_experts : 0, P = md && md->ep > 1 ? md->ep : 1, tp = axis_size(mesh, "tp"), first, n;
    buf[0] = '\0';
    if (E < 2) return buf;
    hp_ep_local_experts(E, P, k->ep, &first, &n);
    int w = P > 1 ? snprintf(buf, cap, "EP slot %lld/%lld: experts %lld..%lld (%lld of %lld)", (long long)k->ep,
                             (long long)P, (long long)first, (long long)(first + n - 1), (long long)n, (long long)E)
                  : snprintf(buf, cap, "all %lld experts", (long long)E);
    if (P == 1 && tp > 1 && w >= 0 && (size_t)w < cap)
        snprintf(buf + w, cap - (size_t)w, ", tp %lld/%lld of each one's width", (long long)k->tp, (long long)tp);
    return buf;
}

/* Rank k's slices: its tp block of the heads, its cp chunks of the sequence, its replica's rows. */
static const char *rank_slices(const hp_cost_rank *k, const hp_mesh *mesh, const cli_html_model *md, char *buf,
                               size_t cap)
{
    int64_t tp = axis_size(mesh, "tp"), cp = axis_size(mesh, "cp"), dp = mesh ? hp_mesh_batch_split(mesh) : 1; /* dp x an ep axis */
    size_t n = 0;
    buf[0] = '\0';
    int w = 0;
    if (tp > 1 && md && md->n_heads % tp == 0) {
        int64_t h = md->n_heads / tp, kv = md->n_kv_heads / tp;
        w = md->mla || md->n_kv_heads % tp
                ? snprintf(buf, cap, "tp %lld/%lld of heads %lld..%lld", (long long)k->tp, (long long)tp,
                           (long long)(k->tp * h), (long long)(k->tp * h + h - 1))
                : snprintf(buf, cap, "tp %lld/%lld of heads %lld..%lld, KV heads %lld..%lld", (long long)k->tp,
                           (long long)tp, (long long)(k->tp * h), (long long)(k->tp * h + h - 1),
                           (long long)(k->tp * kv), (long long)(k->tp * kv + kv - 1));
    } else if (tp > 1) {
        w = snprintf(buf, cap, "tp %lld/%lld", (long long)k->tp, (long long)tp);
    }
    n = w > 0 && (size_t)w < cap ? (size_t)w : n;
    if (cp > 1 && n < cap) { /* 2·cp load-balanced chunks: c and 2cp-1-c */
        w = snprintf(buf + n, cap - n, "%scp %lld/%lld: sequence chunks %lld and %lld of %lld", n ? "; " : "",
                     (long long)k->cp, (long long)cp, (long long)k->cp, (long long)(2 * cp - 1 - k->cp),
                     (long long)(2 * cp));
        n = w > 0 && n + (size_t)w < cap ? n + (size_t)w : n;
    }
    if (dp > 1 && n < cap)
        snprintf(buf + n, cap - n, "%sdp %lld/%lld: its replica's rows", n ? "; " : "", (long long)k->dp, (long long)dp);
    if (!buf[0]) snprintf(buf, cap, "everything (one rank per replica)");
    return buf;
}

static void grid_cell(FILE *f, const hp_cost *c, const hp_mesh *mesh, const cli_html_model *md, int64_t r, double x,
                      double y, double cell, uint64_t ref)
{
    const hp_cost_rank *k = &c->ranks[r];
    double frac = ref ? (double)k->total_bytes / (double)ref : 0;
    char co[256], ex[160], sl[300];
    coords_str(mesh, r, 0, mesh ? mesh->n_dims : 0, co, sizeof co);
    rank_experts(k, mesh, md, ex, sizeof ex);
    rect_tip(f, x, y, cell, cell, heat(frac).s, "rank %lld (%s): %s" EST " of %s (%s)%s%s%s%s", (long long)r, co,
             fbytes(k->total_bytes).s, fbytes(ref).s, fpct(frac).s, md ? "; " : "",
             md ? rank_slices(k, mesh, md, sl, sizeof sl) : "", ex[0] ? "; " : "", ex);
    bool ep = md && md->ep > 1 && md->n_experts > 1;
    if (cell >= 26)
        text(f, x + cell / 2, y + cell / 2 + (ep ? 0 : 4), "middle", frac > 1 ? "in hot" : "in", "%lld", (long long)r);
    if (cell >= 26 && ep) /* the EP slot, what differs most between ranks of a MoE plan */
        text(f, x + cell / 2, y + cell / 2 + 11, "middle", frac > 1 ? "in hot" : "in", "e%lld", (long long)k->ep);
}

/* What each rank holds: its coordinates, experts, slices and memory, a row per rank. */
static void cost_ranks_table(FILE *f, const hp_cost *c, const hp_mesh *mesh, const cli_html_model *md)
{
    int64_t rows = c->world < RANKS_MAX_ROWS ? c->world : RANKS_MAX_ROWS; /* the page's ranks: every rank */
    bool moe = md->n_experts > 1;
    fputs("<h2>What each rank holds</h2>\n<div class=\"scroll\"><table class=\"ranks\">\n<tr><th>rank</th>"
          "<th>coordinates</th>", f);
    if (moe) fputs("<th>experts</th>", f);
    fputs("<th>slices</th><th>weights</th><th>total" EST "</th></tr>\n", f);
    for (int64_t i = 0; i < rows; i++) {
        const hp_cost_rank *k = &c->ranks[i];
        char co[256], buf[300];
        fprintf(f, "<tr data-rank=\"%lld\"><td class=\"n\">%lld</td><td class=\"id\">", (long long)k->rank,
                (long long)k->rank);
        esc(f, coords_str(mesh, k->rank, 0, mesh ? mesh->n_dims : 0, co, sizeof co));
        if (moe) {
            fputs("</td><td class=\"experts\">", f);
            esc(f, rank_experts(k, mesh, md, buf, sizeof buf));
        }
        fputs("</td><td>", f);
        esc(f, rank_slices(k, mesh, md, buf, sizeof buf));
        fputs("</td><td class=\"n\">", f);
        esc(f, fbytes(k->weight_bytes).s);
        fputs("</td><td class=\"n\">", f);
        if (c->refused[0]) esc(f, "not derived");
        else escf(f, "%s" EST, fbytes(k->total_bytes).s);
        fputs("</td></tr>\n", f);
    }
    fputs("</table></div>\n", f);
    if (rows < c->world)
        fprintf(f, "<p class=\"note\">Listing the first %lld of %lld ranks.</p>\n", (long long)rows,
                (long long)c->world);
}

static void cost_grid(FILE *f, const hp_cost *c, const hp_mesh *mesh, const cli_html_model *md, uint64_t budget)
{
    int64_t cols = grid_cols(c, mesh), drawn = c->world < GRID_MAX_CELLS ? c->world : GRID_MAX_CELLS;
    int64_t rows = (drawn + cols - 1) / cols;
    bool wrapped = mesh && mesh->n_dims > 0 && mesh->sizes[mesh->n_dims - 1] > cols;
    bool row_labels = mesh && mesh->n_dims > 1 && !wrapped;
    double x0 = row_labels ? 150 : 10, y0 = 20, cell = (1100 - x0) / (double)cols;
    if (cell > 44) cell = 44;
    if (cell < 7) cell = 7;
    double gap = cell >= 12 ? 2 : 1;
    int64_t label_every = 1; /* rows from one row label to the next, so that they do not overlap */
    while ((double)label_every * (cell + gap) < 13) label_every++;
    fputs("<h2>Memory per rank on the mesh</h2>\n<p class=\"note\">", f);
    escf(f, "Each cell a rank, coloured by its total (weights + activations + %s" EST ") against %s%s. ",
         state_name(c), budget ? "the budget" : "the most-loaded rank",
         md && md->ep > 1 && md->n_experts > 1 ? "; eN: its EP slot" : "");
    if (mesh && mesh->n_dims > 1)
        escf(f, "Rows: the coordinates of the axes before %s; columns: %s. ", mesh->names[mesh->n_dims - 1],
             mesh->names[mesh->n_dims - 1]);
    if (wrapped) escf(f, "Rows wrap every %lld ranks. ", (long long)cols);
    if (drawn < c->world) escf(f, "Showing the first %lld of %lld ranks.", (long long)drawn, (long long)c->world);
    fputs("</p>\n", f);
    svg_open(f, x0 + (double)cols * (cell + gap) + 10, y0 + (double)rows * (cell + gap) + 10, "mesh grid");
    if (mesh && mesh->n_dims > 0 && !wrapped && cell >= 16)
        for (int64_t j = 0; j < cols; j++)
            text(f, x0 + (double)j * (cell + gap) + cell / 2, 14, "middle", "", "%s%s%lld",
                 j ? "" : mesh->names[mesh->n_dims - 1], j ? "" : " ", (long long)j);
    uint64_t ref = cost_ref(c, budget);
    for (int64_t r = 0; r < drawn; r++) {
        int64_t i = r / cols, j = r % cols;
        double y = y0 + (double)i * (cell + gap);
        if (j == 0 && row_labels && i % label_every == 0) {
            char co[256];
            text(f, x0 - 8, y + cell / 2 + 4, "end", "", "%s", coords_str(mesh, r, 0, mesh->n_dims - 1, co, sizeof co));
        }
        grid_cell(f, c, mesh, md, r, x0 + (double)j * (cell + gap), y, cell, ref);
    }
    fputs("</svg>\n", f);
}

static void cost_bars(FILE *f, const hp_cost *c, uint64_t budget)
{
    int64_t drawn = c->world < BARS_MAX_RANKS ? c->world : BARS_MAX_RANKS;
    uint64_t top = budget;
    seg s[3];
    for (int64_t r = 0; r < drawn; r++) {
        mem_segs(c, &c->ranks[r], s);
        if (s[0].v + s[1].v + s[2].v > top) top = s[0].v + s[1].v + s[2].v;
    }
    double x0 = 80, width = 820, h = 16, pitch = 20, y0 = 24;
    double scale = top ? width / (double)top : 0;
    fputs("<h2>Memory of each rank</h2>\n<p class=\"note\">", f);
    escf(f, "Weights, activations" EST " and %s" EST " of each rank%s.", state_name(c),
         budget ? ", against the budget (the red line)" : "");
    if (drawn < c->world) escf(f, " Showing the first %lld of %lld ranks.", (long long)drawn, (long long)c->world);
    fputs("</p>\n", f);
    svg_open(f, x0 + width + 130, y0 + (double)drawn * pitch + 10, "memory per rank");
    for (int64_t r = 0; r < drawn; r++) {
        double y = y0 + (double)r * pitch;
        char who[32];
        snprintf(who, sizeof who, "rank %lld", (long long)r);
        mem_segs(c, &c->ranks[r], s);
        text(f, x0 - 8, y + h - 4, "end", "", "%s", who);
        double end = hbar(f, x0, y, h, scale, s, 3, who);
        text(f, end + 6, y + h - 4, "start", "", "%s" EST, fbytes(s[0].v + s[1].v + s[2].v).s);
    }
    if (budget) {
        double x = x0 + (double)budget * scale;
        line(f, x, y0 - 6, x, y0 + (double)drawn * pitch, BUDGET_COLOUR, true);
        text(f, x, y0 - 10, "middle", "b", "budget %s", fbytes(budget).s);
    }
    fputs("</svg>\n", f);
}

/* The bytes per kind of rank r's events in layer l, and whether they hold an estimate. False when l has none. */
static bool layer_sums(const hp_cost_rank *r, int32_t l, uint64_t sum[HP_RUN_COLL_COUNT], bool est[HP_RUN_COLL_COUNT])
{
    bool any = false;
    memset(sum, 0, sizeof(uint64_t) * HP_RUN_COLL_COUNT);
    memset(est, 0, sizeof(bool) * HP_RUN_COLL_COUNT);
    for (size_t i = 0; i < r->n_ev; i++) {
        const hp_cost_event *e = &r->ev[i];
        if (e->layer != l) continue;
        any = true;
        if ((unsigned)e->kind >= HP_RUN_COLL_COUNT) continue;
        sum[e->kind] += e->bytes;
        est[e->kind] = est[e->kind] || e->estimated;
    }
    return any;
}

static int32_t last_layer(const hp_cost_rank *r)
{
    int32_t l = -1;
    for (size_t i = 0; i < r->n_ev; i++)
        if (r->ev[i].layer > l) l = r->ev[i].layer;
    return l;
}

static txt layer_name(int32_t l)
{
    txt t;
    if (l < 0)
        snprintf(t.s, sizeof t.s, "outside layers");
    else
        snprintf(t.s, sizeof t.s, "layer %d", (int)l);
    return t;
}

static void layer_bar(FILE *f, int32_t l, const uint64_t sum[HP_RUN_COLL_COUNT], const bool est[HP_RUN_COLL_COUNT],
                      double y, double scale)
{
    seg s[HP_RUN_COLL_COUNT];
    uint64_t all = 0;
    bool any_est = false;
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) {
        s[k] = (seg){sum[k], coll_colour[k], hp_run_coll_name((hp_run_coll)k), est[k]};
        all += sum[k];
        any_est = any_est || est[k];
    }
    text(f, 102, y + 11, "end", "", "%s", layer_name(l).s);
    double end = hbar(f, 110, y, 14, scale, s, HP_RUN_COLL_COUNT, layer_name(l).s);
    text(f, end + 6, y + 11, "start", "", "%s%s", fbytes(all).s, any_est ? EST : "");
}

static void layer_chart(FILE *f, const hp_cost_rank *r)
{
    int32_t last = last_layer(r);
    uint64_t sum[HP_RUN_COLL_COUNT], top = 0;
    bool est[HP_RUN_COLL_COUNT];
    int n = 0;
    for (int32_t l = -1; l <= last && n < BARS_MAX_LAYERS; l++) {
        if (!layer_sums(r, l, sum, est)) continue;
        uint64_t all = 0;
        for (int k = 0; k < HP_RUN_COLL_COUNT; k++) all += sum[k];
        if (all > top) top = all;
        n++;
    }
    double scale = top ? 760.0 / (double)top : 0, y = 8;
    svg_open(f, 1000, 16 + n * 18.0, "collective bytes per layer");
    int drawn = 0;
    for (int32_t l = -1; l <= last && drawn < n; l++) {
        if (!layer_sums(r, l, sum, est)) continue;
        layer_bar(f, l, sum, est, y, scale);
        y += 18;
        drawn++;
    }
    fputs("</svg>\n", f);
    int total = 0;
    for (int32_t l = -1; l <= last; l++) total += layer_sums(r, l, sum, est);
    if (total > n) fprintf(f, "<p class=\"note\">Showing the first %d of %d layers.</p>\n", n, total);
}

static bool same_row(const hp_cost_event *a, const hp_cost_event *b)
{
    return a->layer == b->layer && a->kind == b->kind && !strcmp(a->axis ? a->axis : "", b->axis ? b->axis : "");
}

/* One table row: the events of layer, kind and axis of e (the first of them), summed. */
static void layer_row(FILE *f, const hp_cost_rank *r, size_t first)
{
    const hp_cost_event *e = &r->ev[first];
    uint64_t bytes = 0, calls = 0;
    bool est = false;
    for (size_t i = first; i < r->n_ev; i++) {
        if (!same_row(&r->ev[i], e)) continue;
        bytes += r->ev[i].bytes;
        calls += (uint64_t)(r->ev[i].calls > 0 ? r->ev[i].calls : 0);
        est = est || r->ev[i].estimated;
    }
    fputs("<tr><td>", f);
    esc(f, layer_name(e->layer).s);
    fputs("</td><td>", f);
    esc(f, hp_run_coll_name(e->kind));
    fputs("</td><td>", f);
    esc(f, e->axis ? e->axis : "?");
    fprintf(f, "</td><td class=\"n\">%d</td><td class=\"n\">%llu</td><td class=\"n\">", (int)e->group,
            (unsigned long long)calls);
    escf(f, "%s%s", fbytes(bytes).s, est ? EST : "");
    fprintf(f, "</td><td class=\"n\">%llu</td></tr>\n", (unsigned long long)bytes);
}

static void layer_table(FILE *f, const hp_cost_rank *r)
{
    fputs("<div class=\"scroll\"><table>\n<tr><th>layer</th><th>collective</th><th>axis</th><th>group size</th><th>calls</th>"
          "<th>bytes</th><th>bytes (exact count)</th></tr>\n", f);
    int32_t last = last_layer(r);
    for (int32_t l = -1; l <= last; l++)
        for (size_t i = 0; i < r->n_ev; i++) {
            if (r->ev[i].layer != l) continue;
            bool seen = false;
            for (size_t j = 0; j < i && !seen; j++) seen = same_row(&r->ev[j], &r->ev[i]);
            if (!seen) layer_row(f, r, i);
        }
    fputs("</table></div>\n", f);
}

static void cost_layers(FILE *f, const hp_cost *c)
{
    const hp_cost_rank *r = &c->ranks[c->max_rank];
    if (c->refused[0]) {
        fputs("<h2>Collectives per layer</h2>\n<p>Not derived: 'hyperpar run' refuses this plan (above).</p>\n", f);
        return;
    }
    fputs("<h2>Collectives per layer</h2>\n<p class=\"note\">", f);
    escf(f, "Rank %lld (the most-loaded), bytes it sends into each kind of collective in one %s. Total:",
         (long long)r->rank, step_name(c));
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++)
        if (r->calls[k] || r->bytes[k])
            escf(f, " %s %s in %llu calls;", hp_run_coll_name((hp_run_coll)k), fbytes(r->bytes[k]).s,
                 (unsigned long long)r->calls[k]);
    escf(f, " into groups of more than one rank: %s%s; sent over links (ring algorithms): %s%s.",
         fbytes(r->sent_bytes).s, r->ep_estimated ? EST : "", fbytes(r->wire_bytes).s, r->ep_estimated ? EST : "");
    fputs("</p>\n", f);
    if (!r->n_ev) {
        fputs("<p>No collectives.</p>\n", f);
        return;
    }
    layer_chart(f, r);
    layer_table(f, r);
}

int cli_html_cost(FILE *f, const char *title, const struct hp_cost *c, const struct hp_mesh *mesh,
                  const cli_html_model *md, uint64_t budget)
{
    page_open(f, "cost", title);
    if (!c || c->world < 1 || !c->ranks || c->max_rank < 0 || c->max_rank >= c->world) {
        fputs("<p>No ranks.</p>\n", f);
        return page_close(f, EST " estimate (docs/cost.md)");
    }
    cost_summary(f, c, mesh, budget);
    cost_legend(f, c, budget);
    cost_grid(f, c, mesh, md, budget);
    if (md) cost_ranks_table(f, c, mesh, md);
    cost_bars(f, c, budget);
    cost_layers(f, c);
    return page_close(f, EST " estimate (docs/cost.md)");
}

/* ---- advise ---- */

static void cand_segs(const hp_advise_cand *a, seg s[3])
{ /* the state: the KV cache (infer, decode) or the training state */
    s[0] = (seg){a->weight_bytes, mem_colour[0], "weights", false};
    s[1] = (seg){a->act_bytes, mem_colour[1], "activations", true};
    s[2] = (seg){a->state_bytes, mem_colour[2], "KV cache or training state", true};
}

static uint64_t cand_mem(const hp_advise_cand *a)
{
    uint64_t sum = a->weight_bytes + a->act_bytes + a->state_bytes;
    return sum > a->max_bytes ? sum : a->max_bytes;
}

/* The memory scale's top over the first `drawn` accepted candidates; returns drawn. */
static int advise_tops(const hp_advise_cand *c, int n, uint64_t budget, uint64_t *mem_top)
{
    int drawn = 0;
    *mem_top = budget;
    for (int i = 0; i < n && drawn < ADVISE_MAX_DRAWN; i++) {
        if (!c[i].ok) continue;
        if (cand_mem(&c[i]) > *mem_top) *mem_top = cand_mem(&c[i]);
        drawn++;
    }
    return drawn;
}

/* Gridlines with the memory scale on the left. */
static void advise_axes(FILE *f, double x0, double x1, double base, double ph, uint64_t mem_top)
{
    for (int g = 0; g <= 4; g++) {
        double y = base - ph * g / 4;
        line(f, x0, y, x1, y, g ? "#e0e0e0" : "#888", false);
        text(f, x0 - 6, y + 4, "end", "", "%s", fbytes((uint64_t)((double)mem_top * g / 4)).s);
    }
    text(f, x0 - 6, base - ph - 12, "end", "", "memory");
}

static void advise_group(FILE *f, const hp_advise_cand *a, int idx, double gx, double gw, double base, double ph,
                         uint64_t mem_top)
{
    double bw = gw * 0.5 > 48 ? 48 : gw * 0.5, x = gx + gw / 2 - bw / 2;
    char who[sizeof a->mesh + 48];
    snprintf(who, sizeof who, "#%d %.*s", idx, (int)sizeof a->mesh, a->mesh);
    seg s[3];
    cand_segs(a, s);
    vbar(f, x, base, bw, mem_top ? ph / (double)mem_top : 0, s, 3, who);
    text(f, gx + gw / 2, base + 16, "middle", "", "#%d", idx);
    if (gw >= 220) text(f, gx + gw / 2, base + 30, "middle", "", "%s", a->mesh);
    if (gw >= 70) { /* the figure above the bar */
        double mh = mem_top ? (double)cand_mem(a) / (double)mem_top * ph : 0;
        text(f, gx + gw / 2, base - mh - 4, "middle", "", "%s", fbytes(cand_mem(a)).s);
    }
}

static void advise_chart(FILE *f, const hp_advise_cand *c, int n, uint64_t budget, const char *state)
{
    uint64_t mem_top;
    int drawn = advise_tops(c, n, budget, &mem_top), accepted = 0;
    for (int i = 0; i < n; i++) accepted += c[i].ok;
    fputs("<h2>Accepted meshes, best first: memory of the most-loaded rank</h2>\n", f);
    if (!drawn) {
        fputs("<p>No mesh fits.</p>\n", f);
        return;
    }
    char st[64];
    snprintf(st, sizeof st, "%s" EST, state);
    fputs("<div>\n", f);
    key(f, mem_colour[0], "weights");
    key(f, mem_colour[1], "activations" EST);
    key(f, mem_colour[2], st);
    if (budget) key(f, BUDGET_COLOUR, "budget");
    fputs("</div>\n", f);
    if (accepted > drawn)
        fprintf(f, "<p class=\"note\">Showing the first %d of %d accepted meshes.</p>\n", drawn, accepted);
    double x0 = 90, pw = 880, ph = 260, base = 40 + ph, gw = pw / drawn;
    mem_top = mem_top + mem_top / 10;
    svg_open(f, x0 + pw + 30, base + 40, "accepted meshes: memory");
    advise_axes(f, x0, x0 + pw, base, ph, mem_top);
    for (int i = 0, k = 0; i < n && k < drawn; i++)
        if (c[i].ok) {
            advise_group(f, &c[i], k + 1, x0 + k * gw, gw, base, ph, mem_top);
            k++;
        }
    if (budget && mem_top) {
        double y = base - (double)budget / (double)mem_top * ph;
        line(f, x0, y, x0 + pw, y, BUDGET_COLOUR, true);
        text(f, x0 + pw - 4, y - 4, "end", "b", "budget %s", fbytes(budget).s);
    }
    fputs("</svg>\n", f);
}

/* How the step-time bars are scaled. The drawn times span [lo, hi]; d = t - lo is how much slower than the fastest
 * a mesh is, dmin the smallest such difference above 0.
 *   LINEAR  hi - lo <= 40 dmin: a linear axis from a baseline a quarter of the spread below the fastest (never
 *           below 0), printed on the axis; the smallest difference spans at least 1/50 of the axis;
 *   LOG     the differences span more: each bar is d on a logarithmic axis (decades from below dmin to above
 *           hi - lo, ticked), so that a difference of 1% shows next to one of 10x; the fastest has no bar;
 *   SAME    every time is the same. */
typedef enum { TS_SAME, TS_LINEAR, TS_LOG } tscale_kind;

typedef struct tscale {
    tscale_kind kind;
    double lo, base, top; /* LINEAR: base..top seconds; LOG: 10^base..10^top seconds of difference */
    double width;         /* pixels of the axis */
} tscale;

static tscale time_scale(const hp_advise_cand *c, int n, int drawn, double width)
{
    tscale ts = {.kind = TS_SAME, .width = width};
    double hi = 0, dmin = 0;
    for (int i = 0, k = 0; i < n && k < drawn; i++)
        if (c[i].ok) {
            if (!k || c[i].t_step < ts.lo) ts.lo = c[i].t_step;
            if (!k || c[i].t_step > hi) hi = c[i].t_step;
            k++;
        }
    for (int i = 0, k = 0; i < n && k < drawn; i++)
        if (c[i].ok) {
            double d = c[i].t_step - ts.lo;
            if (d > 0 && (dmin == 0 || d < dmin)) dmin = d;
            k++;
        }
    if (!(hi > ts.lo) || !(dmin > 0)) return ts;
    if (hi - ts.lo <= 40 * dmin) {
        ts.kind = TS_LINEAR;
        ts.base = ts.lo - (hi - ts.lo) / 4 > 0 ? ts.lo - (hi - ts.lo) / 4 : 0;
        ts.top = hi;
    } else {
        ts.kind = TS_LOG;
        ts.base = floor(log10(dmin)) - 1; /* the smallest difference a decade in: a visible bar */
        ts.top = ceil(log10(hi - ts.lo));
        if (ts.top <= ts.base) ts.top = ts.base + 1;
    }
    return ts;
}

/* The bar's length in pixels of a step of t seconds. */
static double time_px(const tscale *ts, double t)
{
    switch (ts->kind) {
    case TS_LINEAR: return (t - ts->base) / (ts->top - ts->base) * ts->width;
    case TS_LOG: return t > ts->lo ? (log10(t - ts->lo) - ts->base) / (ts->top - ts->base) * ts->width : 0;
    default: return ts->width / 2;
    }
}

/* The axis: its baseline (LINEAR) or its decades of difference (LOG), and what the bars mean. */
static void time_axis_note(FILE *f, const tscale *ts)
{
    fputs("<p class=\"note\">", f);
    if (ts->kind == TS_LINEAR && ts->base > 0)
        escf(f, "The bars start at %s, not at 0: a bar's length is the time above that baseline, so that the "
                "differences between meshes show. Each bar says how much slower than #1 it is.", fsec(ts->base).s);
    else if (ts->kind == TS_LINEAR)
        esc(f, "The bars start at 0 s. Each bar says how much slower than #1 it is.");
    else if (ts->kind == TS_LOG)
        escf(f, "A bar's length is how much slower than the fastest drawn mesh (%s) it is, on a logarithmic axis "
                "(a tick per factor of 10), so that small and large differences both show; the fastest has no bar. "
                "Each bar gives its time.", fsec(ts->lo).s);
    else
        esc(f, "Every drawn mesh has the same predicted step time.");
    fputs("</p>\n", f);
}

static void time_axis(FILE *f, const tscale *ts, double x0, double y0, double y1)
{
    line(f, x0, y0 - 6, x0, y1, "#888", false);
    if (ts->kind == TS_LINEAR) text(f, x0, y0 - 10, "middle", "", "%s", fsec(ts->base).s);
    if (ts->kind != TS_LOG) return;
    for (double e = ts->base; e <= ts->top + 1e-9; e += 1) {
        double x = x0 + (e - ts->base) / (ts->top - ts->base) * ts->width;
        line(f, x, y0 - 4, x, y1, "#e0e0e0", false);
        text(f, x, y0 - 10, "middle", "", "+%s", fsec(pow(10, e)).s);
    }
}

/* The predicted step times of the drawn candidates as horizontal bars (time_scale), each labelled with its time
 * and how much slower than #1 it is. data-step on each bar: its seconds. */
static void advise_time_chart(FILE *f, const hp_advise_cand *c, int n, bool decode)
{
    int drawn = 0;
    double best = 0;
    for (int i = 0; i < n && drawn < ADVISE_MAX_DRAWN; i++)
        if (c[i].ok) {
            if (!drawn) best = c[i].t_step;
            drawn++;
        }
    if (!drawn) return;
    double x0 = 260, h = 16, pitch = 22, y0 = 30;
    tscale ts = time_scale(c, n, drawn, 600);
    fputs("<h2>Predicted step time" EST "</h2>\n<div>\n", f);
    key(f, TIME_COLOUR, decode ? "step time" EST ": max(compute, memory reads) + communication"
                               : "step time" EST ": compute + communication");
    fputs("</div>\n", f);
    time_axis_note(f, &ts);
    svg_open(f, x0 + ts.width + 200, y0 + drawn * pitch + 10, "accepted meshes: step time");
    time_axis(f, &ts, x0, y0, y0 + drawn * pitch);
    for (int i = 0, k = 0; i < n && k < drawn; i++) {
        const hp_advise_cand *a = &c[i];
        if (!a->ok) continue;
        double y = y0 + k * pitch, w = time_px(&ts, a->t_step);
        char who[sizeof a->mesh + 48];
        snprintf(who, sizeof who, "#%d %.*s", k + 1, (int)sizeof a->mesh, a->mesh);
        text(f, x0 - 8, y + h - 4, "end", "", "#%d %s", k + 1, a->mesh);
        fprintf(f, "<rect data-step=\"%.17g\" x=\"%.1f\" y=\"%.1f\" width=\"%.3f\" height=\"%.1f\" fill=\"%s\"><title>",
                a->t_step, x0, y, w, h, TIME_COLOUR);
        if (decode)
            escf(f, "%s: step %s" EST " (compute %s" EST ", memory %s" EST ", communication %s" EST ")", who,
                 fsec(a->t_step).s, fsec(a->t_compute).s, fsec(a->t_memory).s, fsec(a->t_comm).s);
        else
            escf(f, "%s: step %s" EST " (compute %s" EST ", communication %s" EST ")", who, fsec(a->t_step).s,
                 fsec(a->t_compute).s, fsec(a->t_comm).s);
        fputs("</title></rect>\n", f);
        if (k == 0) text(f, x0 + w + 6, y + h - 4, "start", "", "%s", fsec(a->t_step).s);
        else { /* 3 significant digits, without an exponent */
            double pct = best > 0 ? (a->t_step - best) / best * 100 : 0.0;
            text(f, x0 + w + 6, y + h - 4, "start", "", fabs(pct) < 100 ? "%s (%+.3g%% vs #1)" : "%s (%+.0f%% vs #1)",
                 fsec(a->t_step).s, pct);
        }
        k++;
    }
    fputs("</svg>\n", f);
}

static void accepted_table(FILE *f, const hp_advise_cand *c, int n, const char *const *commands, bool decode)
{
    fputs("<div class=\"scroll\"><table>\n<tr><th>#</th><th>mesh</th><th>memory" EST
          " (weights + activations + state)</th><th>sent bytes</th><th>wire bytes</th>", f);
    fputs(decode ? "<th>step time" EST " (max(compute, memory) + communication)</th><th>KV cache per sequence" EST
                   "</th><th>sequences that fit" EST "</th>"
                 : "<th>step time" EST " (compute + communication)</th>", f);
    fputs("<th>command</th></tr>\n", f);
    for (int i = 0, k = 0; i < n; i++) {
        const hp_advise_cand *a = &c[i];
        if (!a->ok) continue;
        fprintf(f, "<tr><td class=\"n\">%d</td><td class=\"id\">", ++k);
        esc(f, a->mesh);
        fputs("</td><td class=\"n\">", f);
        escf(f, "%s" EST " (%s + %s + %s)", fbytes(a->max_bytes).s, fbytes(a->weight_bytes).s, fbytes(a->act_bytes).s,
             fbytes(a->state_bytes).s);
        fputs("</td><td class=\"n\">", f);
        esc(f, fbytes(a->sent_bytes).s);
        fputs("</td><td class=\"n\">", f);
        esc(f, fbytes(a->wire_bytes).s);
        fputs("</td><td class=\"n\">", f);
        if (decode) {
            escf(f, "%s" EST " (max(%s, %s) + %s)", fsec(a->t_step).s, fsec(a->t_compute).s, fsec(a->t_memory).s,
                 fsec(a->t_comm).s);
            fputs("</td><td class=\"n\">", f);
            esc(f, fbytes(a->kv_seq_bytes).s);
            fprintf(f, "</td><td class=\"n\">%lld", (long long)a->seqs);
        } else {
            escf(f, "%s" EST " (%s + %s)", fsec(a->t_step).s, fsec(a->t_compute).s, fsec(a->t_comm).s);
        }
        fputs("</td><td><code>", f);
        esc(f, commands && commands[i] ? commands[i] : "");
        fputs("</code></td></tr>\n", f);
    }
    fputs("</table></div>\n", f);
}

static void rejected_table(FILE *f, const hp_advise_cand *c, int n)
{
    int rejected = 0;
    for (int i = 0; i < n; i++) rejected += !c[i].ok;
    fputs("<h2>Rejected meshes</h2>\n", f);
    if (!rejected) {
        fputs("<p>None.</p>\n", f);
        return;
    }
    fputs("<div class=\"scroll\"><table>\n<tr><th>mesh</th><th>why not</th></tr>\n", f);
    for (int i = 0; i < n; i++) {
        if (c[i].ok) continue;
        fputs("<tr><td class=\"id\">", f);
        esc(f, c[i].mesh);
        fputs("</td><td>", f);
        esc(f, c[i].reason);
        fputs("</td></tr>\n", f);
    }
    fputs("</table></div>\n", f);
}

int cli_html_advise(FILE *f, const char *title, const hp_advice *adv, const char *const *commands)
{
    page_open(f, "advise", title);
    const hp_advise_cand *c = adv ? adv->cands : NULL;
    int n = adv && c && adv->n_cands > 0 ? adv->n_cands : 0;
    uint64_t budget = adv ? adv->mem_per_rank : 0;
    int accepted = 0;
    for (int i = 0; i < n; i++) accepted += c[i].ok;
    fputs("<p class=\"sum\">", f);
    escf(f, "%d meshes considered: %d accepted, %d rejected; memory per rank budget %s.", n, accepted, n - accepted,
         budget ? fbytes(budget).s : "none");
    bool decode = adv && adv->decode;
    if (decode)
        escf(f, " Decode (serving): %lld sequences, one new token each, a KV cache of %lld positions per sequence; "
                "ranked by %s.", (long long)adv->B, (long long)adv->context,
             adv->prefer_headroom ? "the concurrent sequences that fit, then the step time" : "the step time");
    fputs("</p>\n", f);
    advise_chart(f, c, n, budget, decode ? "KV cache" : adv && adv->train ? "training state" : "KV cache or training state");
    advise_time_chart(f, c, n, decode);
    if (accepted) accepted_table(f, c, n, commands, decode);
    rejected_table(f, c, n);
    return page_close(f, EST " estimate (docs/cost.md)");
}

/* ---- train ---- */

#define LOSS_COLOUR "#4e79a7"
#define EVAL_COLOUR "#f28e2b"
#define NORM_COLOUR "#59a14f"

/* A round tick spacing (1, 2 or 5 times a power of ten) that cuts span into about `want` parts. */
static double tick_step(double span, int want)
{
    double raw = span / want, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

/* One curve of a chart: n points (x[i], y[i]). */
typedef struct series {
    const char *name, *colour;
    const int64_t *x;
    const double *y;
    int64_t n;
} series;

/* The range of the finite values of the curves (and of extra when > 0), widened a little; false when none. */
static bool finite_range(const series *c, int n_c, double extra, double *lo, double *hi)
{
    bool any = false;
    for (int k = 0; k < n_c; k++)
        for (int64_t i = 0; i < c[k].n; i++)
            if (isfinite(c[k].y[i])) {
                if (!any || c[k].y[i] < *lo) *lo = c[k].y[i];
                if (!any || c[k].y[i] > *hi) *hi = c[k].y[i];
                any = true;
            }
    if (!any) return false;
    if (extra > 0 && isfinite(extra)) {
        if (extra < *lo) *lo = extra;
        if (extra > *hi) *hi = extra;
    }
    double pad = *hi > *lo ? (*hi - *lo) * 0.05 : fabs(*hi) > 0 ? fabs(*hi) * 0.05 : 1;
    *lo -= pad;
    *hi += pad;
    return true;
}

/* The chart's scale: x0..x1 pixels for steps s0..s1, base..top pixels for values lo..hi. */
typedef struct scale {
    double x0, x1, s0, s1, base, top, lo, hi;
} scale;

static double to_px(const scale *sc, double step)
{
    return sc->x0 + (step - sc->s0) / (sc->s1 - sc->s0) * (sc->x1 - sc->x0);
}

static double to_py(const scale *sc, double v)
{
    return sc->base - (v - sc->lo) / (sc->hi - sc->lo) * (sc->base - sc->top);
}

/* Points a curve marks with a dot as well (a tooltip each): few enough to tell apart, and a lone point would
 * not show as a line. */
#define MARKED_POINTS 100

/* One curve: a polyline per stretch of finite values (a NaN or Inf breaks the line and is never drawn), each
 * with data-curve="name" so that a reader can count its points; dots on the points of a short curve. */
static void curve(FILE *f, const scale *sc, const series *c)
{
    bool open = false;
    for (int64_t i = 0; i <= c->n; i++) {
        bool ok = i < c->n && isfinite(c->y[i]);
        if (ok && !open)
            fprintf(f, "<polyline data-curve=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
                    c->name, c->colour);
        else if (!ok && open)
            fputs("\"/>\n", f);
        if (ok) fprintf(f, "%s%.1f,%.1f", open ? " " : "", to_px(sc, (double)c->x[i]), to_py(sc, c->y[i]));
        open = ok;
    }
    for (int64_t i = 0; c->n <= MARKED_POINTS && i < c->n; i++) {
        if (!isfinite(c->y[i])) continue;
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"><title>", to_px(sc, (double)c->x[i]),
                to_py(sc, c->y[i]), c->colour);
        escf(f, "step %lld: %s %.7g", (long long)c->x[i], c->name, c->y[i]);
        fputs("</title></circle>\n", f);
    }
}

/* A chart of n_c curves against the steps first..last, with ticks on both axes, the y axis named ylabel;
 * hline > 0: a dashed line at that value (the clipping threshold), named hname. */
static void train_chart(FILE *f, const char *label, const char *ylabel, int64_t first, int64_t last,
                        const series *c, int n_c, double hline, const char *hname)
{
    const double W = 900, H = 320;
    scale sc = {.x0 = 80, .x1 = W - 30, .s0 = (double)first, .s1 = (double)last, .base = H - 50, .top = 20};
    if (!finite_range(c, n_c, hline, &sc.lo, &sc.hi)) {
        fputs("<p>No finite value to draw.</p>\n", f);
        return;
    }
    if (sc.s1 <= sc.s0) sc.s0 -= 0.5, sc.s1 += 0.5; /* one step: a point in the middle, its tick alone */
    svg_open(f, W, H, label);
    double dy = tick_step(sc.hi - sc.lo, 5);
    int ticks = 0; /* at most 20 per axis, whatever the rounding */
    for (double v = ceil(sc.lo / dy) * dy; v <= sc.hi && ticks++ < 20; v += dy) {
        double y = to_py(&sc, v);
        line(f, sc.x0, y, sc.x1, y, "#e0e0e0", false);
        text(f, sc.x0 - 6, y + 4, "end", "", "%.6g", fabs(v) < dy * 1e-9 ? 0.0 : v);
    }
    double dx = tick_step(sc.s1 - sc.s0, 8);
    if (dx < 1) dx = 1; /* steps are whole */
    ticks = 0;
    for (double v = ceil(sc.s0 / dx) * dx; v <= sc.s1 && ticks++ < 20; v += dx) {
        double x = to_px(&sc, v);
        line(f, x, sc.base, x, sc.base + 5, "#888", false);
        text(f, x, sc.base + 18, "middle", "", "%.0f", v);
    }
    line(f, sc.x0, sc.base, sc.x1, sc.base, "#888", false);
    line(f, sc.x0, sc.top, sc.x0, sc.base, "#888", false);
    text(f, (sc.x0 + sc.x1) / 2, H - 12, "middle", "", "step");
    double mid = (sc.top + sc.base) / 2;
    fprintf(f, "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">", mid, mid);
    esc(f, ylabel);
    fputs("</text>\n", f);
    if (hline > 0 && isfinite(hline)) {
        double y = to_py(&sc, hline);
        line(f, sc.x0, y, sc.x1, y, BUDGET_COLOUR, true);
        text(f, sc.x1 - 4, y - 4, "end", "b", "%s %.6g", hname, hline);
    }
    for (int k = 0; k < n_c; k++) curve(f, &sc, &c[k]);
    fputs("</svg>\n", f);
}

int cli_html_train(FILE *f, const char *title, const cli_train_curves *t)
{
    page_open(f, "train", title);
    if (!t || t->n < 1 || !t->step || !t->loss || !t->grad_norm) {
        fputs("<p>No steps.</p>\n", f);
        return page_close(f, NULL);
    }
    int64_t first = t->step[0], last = t->step[t->n - 1];
    fputs("<p class=\"sum\">", f);
    esc(f, t->summary ? t->summary : "");
    fputs("</p>\n<h2>Loss</h2>\n<div>\n", f);
    bool eval = t->n_eval > 0 && t->eval_step && t->eval_loss;
    key(f, LOSS_COLOUR, "training loss (the step's global batch)");
    if (eval) key(f, EVAL_COLOUR, "eval loss (--eval-data)");
    fputs("</div>\n", f);
    const series loss[2] = {{"loss", LOSS_COLOUR, t->step, t->loss, t->n},
                            {"eval_loss", EVAL_COLOUR, t->eval_step, t->eval_loss, eval ? t->n_eval : 0}};
    train_chart(f, "loss against the step", "loss", first, last, loss, eval ? 2 : 1, 0, NULL);
    fputs("<h2>Gradient norm</h2>\n<div>\n", f);
    key(f, NORM_COLOUR, "global gradient norm, before clipping");
    if (t->clip > 0) key(f, BUDGET_COLOUR, "--clip");
    fputs("</div>\n", f);
    const series norm = {"grad_norm", NORM_COLOUR, t->step, t->grad_norm, t->n};
    train_chart(f, "gradient norm against the step", "gradient norm", first, last, &norm, 1, t->clip, "clip");
    return page_close(f, t->note);
}
