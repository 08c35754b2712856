/* test_helpers.c — facts written once: the EP group size, the group base of an axis, the batch split, the pp
 * refusal (mesh and plan API); and the lists for messages (families, archetypes) that live in no static buffer. */
#include "hyperpar/model.h"
#include "hyperpar/moe.h"
#include "hyperpar/overrides.h"
#include "hyperpar/plan.h"
#include "testlib.h"

static hp_mesh parse(const char *spec)
{
    hp_mesh m;
    hp_err e;
    hp_status st = hp_mesh_parse(spec, &m, &e);
    CHECK_MSG(st == HP_OK, "%s: %s", spec, e.msg);
    return m;
}

/* For every rank and axis: the rank at coordinate c of its group differs from rank only on that axis, holds c
 * there, and every member of a group names the same base; there are world / size groups. */
TEST(group_rank_sets_one_coordinate)
{
    const char *specs[] = {"dp=2,cp=3,tp=2", "dp=2,tp=2,ep=2", "tp=4", "dp=3,ep=2,tp=2", "cp=2,dp=2"};
    const char *axes[] = {"dp", "cp", "tp", "ep"};
    for (size_t k = 0; k < sizeof specs / sizeof *specs; k++) {
        hp_mesh m = parse(specs[k]);
        int64_t world = hp_mesh_world(&m);
        for (size_t a = 0; a < 4; a++) {
            const char *ax = axes[a];
            int64_t size = hp_mesh_size(&m, ax), n_bases = 0;
            for (int64_t r = 0; r < world; r++) {
                int64_t base = hp_mesh_group_rank(&m, r, ax, 0);
                CHECK_MSG(base >= 0 && base < world, "%s %s rank %lld", specs[k], ax, (long long)r);
                if (base == r && hp_mesh_coord(&m, r, ax) == 0) n_bases++;
                for (int64_t c = 0; c < size; c++) {
                    int64_t q = hp_mesh_group_rank(&m, r, ax, c);
                    CHECK_MSG(hp_mesh_coord(&m, q, ax) == c, "%s %s rank %lld coord %lld", specs[k], ax,
                              (long long)r, (long long)c);
                    CHECK_MSG(hp_mesh_group_rank(&m, q, ax, 0) == base, "%s %s: rank %lld and %lld in one group",
                              specs[k], ax, (long long)r, (long long)q);
                    for (size_t b = 0; b < 4; b++)
                        if (b != a)
                            CHECK_MSG(hp_mesh_coord(&m, q, axes[b]) == hp_mesh_coord(&m, r, axes[b]),
                                      "%s: %s group of rank %lld moves %s", specs[k], ax, (long long)r, axes[b]);
                }
            }
            CHECK_MSG(n_bases == world / size, "%s %s: %lld groups", specs[k], ax, (long long)n_bases);
        }
    }
    hp_mesh m = parse("dp=2,cp=2,tp=2");
    CHECK_EQ_INT(hp_mesh_group_rank(&m, 7, "tp", 0), 6);
    CHECK_EQ_INT(hp_mesh_group_rank(&m, 7, "cp", 0), 5);
    CHECK_EQ_INT(hp_mesh_group_rank(&m, 7, "dp", 0), 3);
    CHECK_EQ_INT(hp_mesh_group_rank(&m, 5, "ep", 0), 5); /* no such axis: a group of one */
}

TEST(ep_size_rule)
{
    hp_mesh m = parse("dp=2,tp=2,ep=4");
    CHECK_EQ_INT(hp_mesh_ep_size(&m), 4); /* an explicit ep axis: its size */
    hp_mesh_from_sizes(&m, 2, 1, 4, 0, false);
    CHECK_EQ_INT(hp_mesh_ep_size(&m), 1); /* unset */
    m.ep = 4;
    CHECK_EQ_INT(hp_mesh_ep_size(&m), 4); /* TP-extend-EP */
    m.ep = 0;
    CHECK_EQ_INT(hp_mesh_ep_size(&m), 1);
    hp_mesh_from_sizes(&m, 1, 1, 2, 3, true);
    CHECK_EQ_INT(hp_mesh_ep_size(&m), 3);

    hp_plan p;
    memset(&p, 0, sizeof p);
    hp_mesh_from_sizes(&p.mesh, 2, 1, 4, 0, false);
    p.ep = 4;
    CHECK_EQ_INT(hp_plan_ep_size(&p), 4);
    p.ep = 0;
    CHECK_EQ_INT(hp_plan_ep_size(&p), 1);
    p.mesh = parse("dp=2,ep=2,tp=2");
    p.ep = 2;
    CHECK_EQ_INT(hp_plan_ep_size(&p), 2);
}

/* The batch split: dp x an explicit ep axis (the ep axis is data parallelism outside the MoE blocks), dp alone
 * otherwise (TP-extend-EP adds no ranks). Every index once; the group is the ranks of the same cp and tp
 * coordinates, named by its lowest rank; the members' indexes are 0..n-1. */
TEST(batch_index_splits_over_dp_and_the_ep_axis)
{
    static const struct {
        const char *spec;
        int64_t n;
    } cases[] = {{"dp=2,tp=2,ep=2", 4}, {"dp=1,ep=2", 2}, {"tp=2,ep=2", 2}, {"dp=3,ep=2,tp=2", 6},
                 {"dp=2,cp=2,tp=2", 2}, {"cp=2,dp=2,ep=2", 4}, {"tp=4", 1}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        hp_mesh m = parse(cases[k].spec);
        int64_t world = hp_mesh_world(&m), seen[64] = {0};
        CHECK_EQ_INT(hp_mesh_batch_split(&m), cases[k].n);
        for (int64_t r = 0; r < world; r++) {
            int64_t n, i, g;
            hp_mesh_batch_index(&m, r, &n, &i, &g);
            CHECK_EQ_INT(n, cases[k].n);
            CHECK_MSG(i >= 0 && i < n, "%s rank %lld index %lld", cases[k].spec, (long long)r, (long long)i);
            int64_t e = m.ep_axis ? hp_mesh_coord(&m, r, "ep") : 0;
            CHECK_EQ_INT(i, hp_mesh_coord(&m, r, "dp") * (m.ep_axis ? hp_mesh_size(&m, "ep") : 1) + e);
            CHECK_MSG(hp_mesh_coord(&m, g, "tp") == hp_mesh_coord(&m, r, "tp") &&
                      hp_mesh_coord(&m, g, "cp") == hp_mesh_coord(&m, r, "cp") && hp_mesh_coord(&m, g, "dp") == 0 &&
                      hp_mesh_coord(&m, g, "ep") == 0, "%s rank %lld group %lld", cases[k].spec, (long long)r,
                      (long long)g);
            seen[g * 8 + i]++;
        }
        for (int64_t j = 0; j < 64; j++) CHECK_MSG(seen[j] <= 1, "%s: slot %lld twice", cases[k].spec, (long long)j);
    }
    hp_mesh m;
    hp_mesh_from_sizes(&m, 2, 1, 2, 4, false); /* TP-extend-EP: dp alone */
    CHECK_EQ_INT(hp_mesh_batch_split(&m), 2);
    hp_mesh_from_sizes(&m, 2, 1, 2, 4, true); /* --dp 2 --tp 2 --ep 4 --ep-axis */
    int64_t n, i;
    hp_mesh_batch_index(&m, 15, &n, &i, NULL);
    CHECK_EQ_INT(n, 8);
    CHECK_EQ_INT(i, 7);
}

TEST(pp_is_refused_in_one_sentence)
{
    hp_err e;
    hp_mesh m = parse("pp=2,tp=2");
    CHECK(hp_mesh_check_pp(&m, "moe", &e) == HP_ERR_INPUT);
    CHECK_STR_EQ(e.msg, "pipeline parallelism (pp=2): plan, explain, shard, merge, run, validate, train, cost and "
                        "advise take it, but moe does not execute or model a pipeline yet; drop pp from the mesh "
                        "(docs/pipeline.md)");
    m = parse("pp=1,tp=2");
    CHECK(hp_mesh_check_pp(&m, "run", &e) == HP_OK);
    m = parse("dp=2,tp=2");
    CHECK(hp_mesh_check_pp(&m, "run", &e) == HP_OK);
}

/* The family list goes into the caller's buffer: whole at HP_FAMILY_LIST_MAX, cut short (and terminated) in a
 * smaller one, untouched with none. */
TEST(family_list_in_the_callers_buffer)
{
    char buf[HP_FAMILY_LIST_MAX];
    CHECK(hp_family_known_list(buf, sizeof buf) == buf);
    char want[HP_FAMILY_LIST_MAX] = "";
    size_t o = 0;
    for (size_t i = 0; i < hp_family_count(); i++)
        o += (size_t)snprintf(want + o, sizeof want - o, "%s%s", i ? ", " : "", hp_family_name(hp_family_at(i)));
    CHECK(o < sizeof want); /* HP_FAMILY_LIST_MAX holds every family */
    CHECK_STR_EQ(buf, want);
    char small[8];
    memset(small, 'x', sizeof small);
    hp_family_known_list(small, sizeof small);
    CHECK_EQ_INT((int)strlen(small), 7);
    CHECK(strncmp(small, want, 7) == 0);
    char none = 'x';
    hp_family_known_list(&none, 0);
    CHECK(none == 'x');
}

/* Both archetype lists are one constant string, every key in the table's order. */
TEST(archetype_lists_are_constant_strings)
{
    char want[1024] = "";
    size_t o = 0;
    for (size_t i = 0; i < hp_archetype_count(); i++)
        o += (size_t)snprintf(want + o, sizeof want - o, "%s%s", i ? ", " : "", hp_archetype_key(i));
    CHECK_STR_EQ(hp_archetype_list(), want);
    CHECK_STR_EQ(hp_moe_archetype_list(), want);
    CHECK(hp_archetype_list() == hp_archetype_list());
}

TEST_MAIN()
