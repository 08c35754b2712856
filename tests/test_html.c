/*
 * test_html.c — the cost and advise pages (tools/html.c) from a made-up cost of 8 ranks (dp=2,tp=4, a few
 * collectives per layer) and 5 advise candidates (3 accepted, 2 rejected): self-contained (no network address
 * but the SVG namespace), text escaped, events of one layer, kind and axis summed, estimates marked, the caps
 * on drawn ranks stated, and a write error reported.
 *
 *   test_html COST.html ADVISE.html   writes the two pages (tests/cli/test_html.sh renders them)
 *   test_html [TEST]                  the checks
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/cost.h"
#include "testlib.h"

#define GiB (1ull << 30)
#define TITLE "tiny <llama> & 'q' \"x\""
#define TITLE_ESC "tiny &lt;llama&gt; &amp; &#39;q&#39; &quot;x&quot;"

static hp_cost_event events[] = {
    {-1, "model.embed_tokens", "exit", HP_RUN_ALL_REDUCE, "tp", 4, 1, 4096, false, 1e-5, 0, 0},
    {0, "model.layers.0.self_attn", "entry", HP_RUN_ALL_GATHER, "tp", 4, 1, 1000, false, 1e-5, 0, 0},
    {0, "model.layers.0.mlp", "entry", HP_RUN_ALL_GATHER, "tp", 4, 1, 24, false, 1e-5, 0, 0},
    {0, "model.layers.0.self_attn", "exit", HP_RUN_REDUCE_SCATTER, "tp", 4, 2, 2048, false, 1e-5, 0, 0},
    {1, "model.layers.1.self_attn", "entry", HP_RUN_ALL_GATHER, "tp", 4, 1, 1024, false, 1e-5, 0, 0},
    {1, "model.layers.1.mlp", "EP dispatch+return", HP_RUN_ALL_TO_ALL, "tp", 4, 2, 8192, true, 1e-4, 0, 0},
    {-1, "logits", "gather", HP_RUN_GATHER, "all", 8, 1, 65536, false, 1e-4, 0, 0},
};

/* 8 ranks of dp=2,tp=4, rank 5 the most loaded (over a 2 GiB budget); the events on every rank. */
static hp_cost *fake_cost(hp_mesh *mesh, int64_t dp, int64_t tp, bool train)
{
    hp_mesh_from_sizes(mesh, dp, 1, tp, 0, false);
    hp_cost *c = calloc(1, sizeof *c);
    c->world = dp * tp;
    c->B = 2, c->S = 16, c->S_pad = 16, c->train = train, c->max_rank = 5;
    c->ranks = calloc((size_t)c->world, sizeof *c->ranks);
    for (int64_t r = 0; r < c->world; r++) {
        hp_cost_rank *k = &c->ranks[r];
        k->rank = r, k->dp = r / tp, k->tp = r % tp;
        k->weight_bytes = GiB / 4 + (uint64_t)(r % 8) * (GiB / 8);
        k->act_bytes = GiB / 8;
        k->kv_bytes = GiB / 16;
        if (train) k->grad_bytes = k->optim_bytes = k->master_bytes = k->saved_bytes = GiB / 32;
        k->total_bytes = k->weight_bytes + k->act_bytes + (train ? GiB / 8 : 0);
        k->ev = events;
        k->n_ev = sizeof events / sizeof events[0];
        for (size_t i = 0; i < k->n_ev; i++) {
            k->bytes[events[i].kind] += events[i].bytes;
            k->calls[events[i].kind] += (uint64_t)events[i].calls;
        }
        k->sent_bytes = 4096 + 1000 + 24 + 2048 + 1024 + 8192 + 65536;
        k->wire_bytes = 3 * k->sent_bytes;
    }
    c->ranks[5].weight_bytes = 2 * GiB;
    c->ranks[5].total_bytes = 2 * GiB + GiB / 8;
    return c;
}

static void free_cost(hp_cost *c)
{
    free(c->ranks);
    free(c);
}

/* 5 candidates (3 accepted, 2 rejected) and their commands. */
static hp_advise_cand cands5[5];
static char cmds5[5][HP_ADVISE_COMMAND_MAX];
static const char *cmd_ptrs5[5];

static void fake_cands(hp_advice *a, uint64_t budget)
{
    memset(cands5, 0, sizeof cands5);
    const char *mesh[5] = {"dp=1,cp=1,tp=8", "dp=2,cp=1,tp=4", "dp=4,cp=1,tp=2 ep=2 (TP-extend-EP)",
                           "dp=8,cp=1,tp=1", "dp=1,cp=8,tp=1"};
    for (int i = 0; i < 5; i++) {
        hp_advise_cand *c = &cands5[i];
        snprintf(c->mesh, sizeof c->mesh, "%s", mesh[i]);
        c->ok = i == 0 || i == 1 || i == 3;
        c->weight_bytes = (uint64_t)(i + 1) * (uint64_t)GiB / 2;
        c->act_bytes = GiB / 4;
        c->state_bytes = GiB / 8;
        c->max_bytes = c->weight_bytes + c->act_bytes + c->state_bytes;
        c->sent_bytes = (uint64_t)(5 - i) << 20;
        c->wire_bytes = (uint64_t)(7 - i) << 20;
        c->t_compute = 0.010 * (i + 1), c->t_comm = 0.002 * (5 - i), c->t_step = c->t_compute + c->t_comm;
        snprintf(cmds5[i], sizeof cmds5[i], "hyperpar plan m --mesh %s -o p.json && hyperpar shard m --plan p.json "
                 "--out shards", mesh[i]);
        cmd_ptrs5[i] = cmds5[i];
    }
    snprintf(cands5[2].reason, sizeof cands5[2].reason, "rank 0 needs 3.1 GiB > budget <2 GiB>");
    snprintf(cands5[4].reason, sizeof cands5[4].reason, "cp=8 does not divide S=12 & 2*cp");
    *a = (hp_advice){.world = 8, .mem_per_rank = budget, .n_cands = 5, .n_ok = 3, .cands = cands5};
}

/* The page a writer produces, read back (freed by the caller). */
static char *page_of(int (*write)(FILE *f, void *ctx), void *ctx, int *rc)
{
    FILE *f = tmpfile();
    if (!f) abort();
    *rc = write(f, ctx);
    long n = ftell(f);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf) abort();
    rewind(f);
    buf[fread(buf, 1, (size_t)n, f)] = '\0';
    fclose(f);
    return buf;
}

typedef struct cost_job {
    hp_cost *c;
    hp_mesh mesh;
    uint64_t budget;
    const cli_html_model *md;
} cost_job;

static int write_cost(FILE *f, void *ctx)
{
    cost_job *j = ctx;
    return cli_html_cost(f, TITLE, j->c, &j->mesh, j->md, j->budget);
}

/* The colours of a page's legend entries (<span class="key"><i style="background:C">): none twice. */
static bool legend_distinct(const char *p)
{
    char seen[32][16];
    int n = 0;
    for (const char *q = strstr(p, "<span class=\"key\"><i style=\"background:"); q;
         q = strstr(q + 1, "<span class=\"key\"><i style=\"background:")) {
        const char *c = q + strlen("<span class=\"key\"><i style=\"background:");
        size_t len = strcspn(c, "\"");
        if (len >= 16 || n == 32) return false;
        for (int i = 0; i < n; i++)
            if (strlen(seen[i]) == len && !strncmp(seen[i], c, len)) return false;
        memcpy(seen[n], c, len);
        seen[n++][len] = '\0';
    }
    return n >= 3;
}

static int write_advise(FILE *f, void *ctx)
{
    hp_advice a;
    fake_cands(&a, *(uint64_t *)ctx);
    return cli_html_advise(f, TITLE, &a, cmd_ptrs5);
}

/* One candidate, rejected. */
static int write_none_fits(FILE *f, void *ctx)
{
    hp_advise_cand none = {.ok = false, .why = HP_ADVISE_MEMORY};
    snprintf(none.mesh, sizeof none.mesh, "dp=1,cp=1,tp=1");
    snprintf(none.reason, sizeof none.reason, "rank 0 needs 9 GiB");
    hp_advice a = {.world = 1, .mem_per_rank = GiB, .n_cands = 1, .cands = &none};
    return cli_html_advise(f, "m", &a, NULL);
}

/* More accepted candidates than the chart draws. */
static int write_many(FILE *f, void *ctx)
{
    static hp_advise_cand c[20];
    for (int i = 0; i < 20; i++) {
        c[i] = (hp_advise_cand){.ok = true, .weight_bytes = GiB, .max_bytes = GiB, .t_step = 0.01 * (i + 1)};
        snprintf(c[i].mesh, sizeof c[i].mesh, "dp=%d,cp=1,tp=1", i + 1);
    }
    hp_advice a = {.world = 20, .n_cands = 20, .n_ok = 20, .cands = c};
    return cli_html_advise(f, "many", &a, NULL);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* No network address but the SVG namespace. */
static bool offline(const char *page)
{
    int svg = count(page, "xmlns=\"http://www.w3.org/2000/svg\"");
    return count(page, "http://") == svg && count(page, "https://") == 0 && svg == count(page, "<svg");
}

static void common_checks(const char *p)
{
    CHECK(!strncmp(p, "<!DOCTYPE html>", 15));
    CHECK_STR_CONTAINS(p, "<body data-hp-ok=\"1\">");
    CHECK_STR_CONTAINS(p, "document.body.setAttribute('data-hp-error','1')");
    CHECK_STR_CONTAINS(p, "<svg");
    CHECK_STR_CONTAINS(p, TITLE_ESC);
    CHECK(!strstr(p, "<llama>"));
    CHECK(!strstr(p, "&lt;/") && !strstr(p, "&lt;p")); /* markup never escaped as text */
    CHECK(offline(p));
    CHECK_STR_CONTAINS(p, "* estimate (docs/cost.md)");
    CHECK(strstr(p, "</html>\n") && !strcmp(strstr(p, "</html>\n"), "</html>\n"));
}

TEST(cost_page)
{
    /* 8 experts over EP groups of 4: ranks with tp index t hold experts 2t, 2t+1 */
    cli_html_model md = {.n_heads = 8, .n_kv_heads = 4, .n_experts = 8, .ep = 4};
    cost_job j = {.budget = 2 * GiB, .md = &md};
    j.c = fake_cost(&j.mesh, 2, 4, false);
    for (int64_t r = 0; r < j.c->world; r++) j.c->ranks[r].ep = r % 4;
    int rc;
    char *p = page_of(write_cost, &j, &rc);
    CHECK_EQ_INT(rc, 0);
    common_checks(p);
    CHECK(legend_distinct(p));
    /* what differs between ranks: every rank's row with its experts and its slices */
    for (int r = 0; r < 8; r++) {
        char row[200];
        snprintf(row, sizeof row, "<tr data-rank=\"%d\"><td class=\"n\">%d</td>", r, r);
        CHECK_STR_CONTAINS(p, row);
    }
    CHECK_STR_CONTAINS(p, "<td class=\"experts\">EP slot 3/4: experts 6..7 (2 of 8)</td><td>tp 3/4 of heads 6..7, "
                          "KV heads 3..3; dp 1/2: its replica&#39;s rows</td>");
    CHECK_STR_CONTAINS(p, "EP slot 1/4: experts 2..3 (2 of 8)");
    CHECK_STR_CONTAINS(p, "rank 7 (dp=1, cp=0, tp=3): ");
    CHECK(!strstr(p, "rank 8 ("));
    CHECK_STR_CONTAINS(p, "rank 5 (dp=1, cp=0, tp=1): 2.12 GiB* of 2.00 GiB (106%)");
    CHECK_STR_CONTAINS(p, "fill=\"#7a0019\""); /* over the budget */
    CHECK_STR_CONTAINS(p, "budget 2.00 GiB");
    CHECK_STR_CONTAINS(p, "KV cache*");
    CHECK_STR_CONTAINS(p, "outside layers");
    /* layer 0's two tp all-gathers are one row: 1 + 1 calls, 1000 + 24 bytes */
    CHECK_STR_CONTAINS(p, "<td>layer 0</td><td>all-gather</td><td>tp</td><td class=\"n\">4</td><td class=\"n\">2</td>"
                          "<td class=\"n\">1.00 KiB</td><td class=\"n\">1024</td>");
    CHECK_STR_CONTAINS(p, "<td>all-to-all</td><td>tp</td><td class=\"n\">4</td><td class=\"n\">2</td>"
                          "<td class=\"n\">8.00 KiB*</td>"); /* estimated */
    CHECK_EQ_INT(count(p, "<td>layer 0</td>"), 2);
    CHECK_STR_CONTAINS(p, "<title>layer 1: all-gather 1.00 KiB</title>"); /* exact, next to an estimate */
    CHECK_STR_CONTAINS(p, "<title>layer 1: all-to-all 8.00 KiB*</title>");
    CHECK(!strstr(p, "Showing the first"));
    free(p);
    free_cost(j.c);
}

TEST(cost_page_caps_and_training)
{
    cost_job j = {.budget = 0};
    j.c = fake_cost(&j.mesh, 16, 128, true);
    int rc;
    char *p = page_of(write_cost, &j, &rc);
    CHECK_EQ_INT(rc, 0);
    common_checks(p);
    CHECK_STR_CONTAINS(p, "first 1024 of 2048 ranks");
    CHECK_STR_CONTAINS(p, "first 64 of 2048 ranks");
    CHECK_STR_CONTAINS(p, "rank 1023 (dp=7, cp=0, tp=127)");
    CHECK(!strstr(p, "rank 1024 ("));
    CHECK_STR_CONTAINS(p, "training state*");
    CHECK_STR_CONTAINS(p, "against the most-loaded rank");
    CHECK(!strstr(p, "budget 0"));
    free(p);
    free_cost(j.c);
}

TEST(advise_page)
{
    uint64_t budget = 2 * GiB;
    int rc;
    char *p = page_of(write_advise, &budget, &rc);
    CHECK_EQ_INT(rc, 0);
    common_checks(p);
    CHECK(legend_distinct(p));
    /* the step-time bars start at a baseline near the fastest (0.020 s, 0.028 s and 0.044 s: a quarter of the
     * spread below 0.020, 0.014 s), and say so; #1's bar is 6 ms of the 30 ms the 600 pixels span */
    CHECK_STR_CONTAINS(p, "The bars start at 14 ms, not at 0");
    CHECK_STR_CONTAINS(p, "data-step=\"0.02\" x=\"260.0\" y=\"30.0\" width=\"120.000\"");
    CHECK_STR_CONTAINS(p, "5 meshes considered: 3 accepted, 2 rejected");
    CHECK_EQ_INT(count(p, "<code>hyperpar plan m --mesh "), 3);
    CHECK_STR_CONTAINS(p, "<td class=\"id\">dp=4,cp=1,tp=2 ep=2 (TP-extend-EP)</td>"
                          "<td>rank 0 needs 3.1 GiB &gt; budget &lt;2 GiB&gt;");
    CHECK_STR_CONTAINS(p, "does not divide S=12 &amp; 2*cp");
    CHECK_STR_CONTAINS(p, "#3 dp=8,cp=1,tp=1: step"); /* the third accepted, drawn */
    CHECK_STR_CONTAINS(p, "budget 2.00 GiB");
    /* the first accepted row: its sent and wire bytes, then its step time */
    CHECK_STR_CONTAINS(p, "<td class=\"n\">5.00 MiB</td><td class=\"n\">7.00 MiB</td>");
    free(p);
    p = page_of(write_none_fits, NULL, &rc);
    CHECK_EQ_INT(rc, 0);
    CHECK_STR_CONTAINS(p, "No mesh fits.");
    CHECK(offline(p));
    free(p);
    p = page_of(write_many, NULL, &rc);
    CHECK_EQ_INT(rc, 0);
    CHECK_STR_CONTAINS(p, "Showing the first 16 of 20 accepted meshes.");
    CHECK_STR_CONTAINS(p, "#16 dp=16,cp=1,tp=1: step");
    CHECK(!strstr(p, "#17 dp=17"));
    CHECK_STR_CONTAINS(p, "<td class=\"id\">dp=20,cp=1,tp=1</td>"); /* the table lists them all */
    CHECK(!strstr(p, "&lt;/") && !strstr(p, "&lt;p"));
    free(p);
}

TEST(write_error)
{
    FILE *f = fopen("/dev/full", "w");
    if (!f) return; /* no /dev/full here */
    uint64_t budget = 0;
    CHECK_EQ_INT(write_advise(f, &budget), -1);
    fclose(f);
    f = fopen("/dev/full", "w");
    cost_job j = {.budget = 0};
    j.c = fake_cost(&j.mesh, 2, 4, false);
    CHECK_EQ_INT(write_cost(f, &j), -1);
    fclose(f);
    free_cost(j.c);
}

static int write_file(const char *path, int (*write)(FILE *f, void *ctx), void *ctx)
{
    FILE *f = fopen(path, "w");
    if (!f) return perror(path), 1;
    int rc = write(f, ctx);
    return (fclose(f) != 0 || rc != 0) ? (fprintf(stderr, "%s: write failed\n", path), 1) : 0;
}

static int write_pages(const char *cost_path, const char *advise_path)
{
    cost_job j = {.budget = 2 * GiB};
    j.c = fake_cost(&j.mesh, 2, 4, false);
    uint64_t budget = 2 * GiB;
    int rc = write_file(cost_path, write_cost, &j) | write_file(advise_path, write_advise, &budget);
    free_cost(j.c);
    return rc;
}

#define main run_checks
static int run_checks(int argc, char **argv);
TEST_MAIN()
#undef main

int main(int argc, char **argv)
{
    if (argc == 3) return write_pages(argv[1], argv[2]);
    return run_checks(argc, argv);
}
