/*
 * test_plan_inputs.c — what the planner accepts from a user, refused when it is nonsense (issue 10, item 16
 * and the derive=false part of 15): --mesh specs (hp_mesh_parse, hp_mesh_check), globs (hp_glob_valid), the
 * top level of an overrides file, and a derive=false plan that covers nothing. Each error is checked for its
 * status and a stable part of its text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperpar/overrides.h"
#include "testlib.h"

static void mesh_refused(const char *spec, const char *needle)
{
    hp_mesh m;
    hp_err err;
    err.msg[0] = '\0';
    CHECK_MSG(hp_mesh_parse(spec, &m, &err) == HP_ERR_INPUT, "--mesh '%s' was accepted", spec);
    CHECK_STR_CONTAINS(err.msg, needle);
}

TEST(mesh_spec_is_strict)
{
    /* Accepted before: a trailing comma, a space or sign before the size, a leading zero. */
    mesh_refused("tp=2,", "item 2 is empty (a trailing comma)");
    mesh_refused(",tp=2", "item 1 is empty (a leading comma)");
    mesh_refused("dp=2,,tp=2", "item 2 is empty (a doubled comma)");
    mesh_refused("tp= 2", "a space or control character at position 4");
    mesh_refused("tp=2\n", "a space or control character at position 5");
    mesh_refused(" tp=2", "position 1");
    mesh_refused("tp=+2", "size of 'tp' must be an integer in [1, 1048576] written as plain digits, got '+2'");
    mesh_refused("tp=02", "got '02'");
    mesh_refused("tp=0", "got '0'");
    mesh_refused("tp=-2", "got '-2'");
    mesh_refused("tp=2x", "got '2x'");
    mesh_refused("tp=1048577", "got '1048577'");
    mesh_refused("tp=99999999999999999999999", "must be an integer in [1, 1048576]");
    mesh_refused("tp=", "got ''");
    mesh_refused("=2", "item 1 has no axis name");
    mesh_refused("tp", "item 1 ('tp') is not NAME=SIZE");
    mesh_refused("tq=2", "unknown axis 'tq'");
    mesh_refused("TP=2", "unknown axis 'TP'");
    mesh_refused("averyveryverylongaxisname=2", "an unknown axis name");
    mesh_refused("tp=2,tp=4", "axis 'tp' appears twice");
    mesh_refused("", "--mesh is empty");
    /* The product is bounded, so that no later product of sizes can overflow. */
    mesh_refused("dp=1048576,tp=1048576", "the mesh has more than 1073741824 ranks");
    mesh_refused("dp=2,cp=2,tp=2,ep=2,pp=2,dp_shard=2,dp_cp=2,ep_shard=2,dp_replicate=2", "at most 8 axes");
    hp_mesh m;
    hp_err err;
    CHECK(hp_mesh_parse("dp=2,cp=1,tp=4", &m, &err) == HP_OK && m.n_dims == 3 && hp_mesh_world(&m) == 8);
    CHECK(hp_mesh_parse("tp=1048576,dp=1024", &m, &err) == HP_OK && hp_mesh_world(&m) == (1 << 30));
    CHECK(hp_mesh_parse("tp=2,ep=4", &m, &err) == HP_OK && m.ep_axis && m.ep == 4);
}

TEST(mesh_check_bounds_built_meshes)
{
    hp_mesh m;
    hp_err err;
    hp_mesh_from_sizes(&m, 1048576, 1048576, 1048576, 1048576, true);
    CHECK(hp_mesh_world(&m) == INT64_MAX); /* saturates instead of overflowing */
    CHECK_EQ_INT(hp_mesh_check(&m, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "the mesh dp=1048576,cp=1048576,tp=1048576,ep=1048576 has more than 1073741824 ranks");
    hp_mesh_from_sizes(&m, 2, 1, 4, 2, false);
    CHECK(hp_mesh_check(&m, &err) == HP_OK);
    m.sizes[1] = 0;
    CHECK_EQ_INT(hp_mesh_check(&m, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "mesh axis 'cp' has size 0; sizes must be in [1, 1048576]");
    /* hp_plan_derive checks the mesh it is given. */
    hp_model *md = NULL;
    CHECK(hp_model_open(&md, "data/configs/llama-3-8b.json", NULL, &err) == HP_OK);
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, 1048576, 1048576, 1, 1, false);
    hp_plan *p = NULL;
    if (md) CHECK_EQ_INT(hp_plan_derive(&p, md, &po, &err), HP_ERR_INPUT);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(err.msg, "has more than 1073741824 ranks");
    hp_model_close(md);
}

TEST(glob_valid)
{
    size_t pos = 99;
    const char *why = NULL;
    CHECK(hp_glob_valid("model.layers.*.mlp", &pos, &why));
    CHECK(hp_glob_valid("model.layers.[0-9].mlp", &pos, &why));
    CHECK(hp_glob_valid("x[]]y", &pos, &why));  /* ']' first in a class is a member */
    CHECK(hp_glob_valid("x[!]]y", &pos, &why));
    CHECK(hp_glob_valid("[[]", &pos, &why));    /* a literal '[' */
    CHECK(hp_glob_valid("a-b?", &pos, &why));
    CHECK(!hp_glob_valid("[*", &pos, &why));
    CHECK(pos == 0 && why && strstr(why, "never closed by ']'"));
    CHECK(!hp_glob_valid("model.layers.[0-9.mlp", &pos, &why));
    CHECK_EQ_INT((int)pos, 13);
    CHECK(!hp_glob_valid("x[]", &pos, &why));
    CHECK(!hp_glob_valid("x[!]", &pos, &why));
    CHECK(!hp_glob_valid("layers.[9-0]", &pos, &why));
    CHECK(pos == 8 && strstr(why, "reversed range"));
    /* Matching is unchanged for valid patterns. */
    CHECK(hp_glob_match("model.layers.[0-1].mlp", "model.layers.1.mlp"));
    CHECK(!hp_glob_match("model.layers.[!0-1].mlp", "model.layers.1.mlp"));
}

static void overrides_refused(const char *yaml, const char *needle)
{
    hp_overrides *o = (hp_overrides *)&o; /* must come back NULL */
    hp_err err;
    err.msg[0] = '\0';
    CHECK_MSG(hp_overrides_parse(&o, yaml, strlen(yaml), "ov.yaml", &err) == HP_ERR_INPUT, "accepted: %s", yaml);
    CHECK(o == NULL);
    CHECK_STR_CONTAINS(err.msg, needle);
}

TEST(overrides_top_level)
{
    /* A key beside plan_overrides was ignored: a typo that silently dropped entries. */
    overrides_refused("plan_overrides:\n  - match: model.norm\n    params: {}\nplan_override:\n  - match: x\n",
                      "ov.yaml:5:3: unknown top-level key 'plan_override'");
    overrides_refused("plan_overrides: []\nextra: 1\n",
                      "unknown top-level key 'extra'; the only top-level key is plan_overrides");
    overrides_refused("plan_overides:\n  - match: model.norm\n", "unknown top-level key 'plan_overides'");
    /* A null document was an empty set of overrides. */
    overrides_refused("~\n", "ov.yaml:1:1: the overrides document is null ('~')");
    overrides_refused("null\n", "the overrides document is null ('null')");
    overrides_refused("---\n~\n", "the overrides document is null");
    overrides_refused("plan_overrides: ~\n", "ov.yaml:1:17: plan_overrides is null");
    overrides_refused("plan_overrides:\n", "plan_overrides is null");
    overrides_refused("", "empty");
    overrides_refused("42\n", "plan_overrides must be a list of entries, got a string");
    /* [] is the explicit empty list. */
    hp_overrides *o = NULL;
    hp_err err;
    CHECK(hp_overrides_parse(&o, "[]\n", 3, "ov.yaml", &err) == HP_OK && hp_overrides_count(o) == 0);
    hp_overrides_free(o);
    CHECK(hp_overrides_parse(&o, "plan_overrides: []\n", 19, "ov.yaml", &err) == HP_OK);
    hp_overrides_free(o);
}

TEST(overrides_malformed_glob_is_an_error)
{
    overrides_refused("- match: \"[*\"\n  params: {}\n",
                      "ov.yaml:1:10: match '[*' is not a valid glob: a '[' that opens a character class never "
                      "closed by ']' at character 1");
    overrides_refused("- match: model.layers.[0-1.mlp\n  region_dispatch: false\n", "at character 14");
    overrides_refused("- match: \"model.layers.[1-0].mlp\"\n  region_dispatch: false\n", "reversed range");
    hp_overrides *o = NULL;
    hp_err err;
    const char *ok = "- match: \"model.layers.[01].mlp\"\n  region_dispatch: false\n";
    CHECK_MSG(hp_overrides_parse(&o, ok, strlen(ok), "ov.yaml", &err) == HP_OK, "%s", err.msg);
    hp_overrides_free(o);
}

/* derive=false holds only the overrides: with none that apply, the plan would cover nothing. */
TEST(no_derive_without_overrides)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/configs/llama-3-8b.json", NULL, &err) == HP_OK);
    if (!m) return;
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, 1, 1, 2, 1, false);
    po.derive = false;
    hp_plan *p = NULL;
    CHECK_EQ_INT(hp_plan_derive(&p, m, &po, &err), HP_ERR_INPUT);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(err.msg, "derive=False: the plan holds only the overrides, and no override entry was given");
    hp_overrides *o = NULL;
    const char *yaml = "- match: model.norm\n  when: cp\n  params: {weight: {tp: replicate}}\n";
    CHECK(hp_overrides_parse(&o, yaml, strlen(yaml), "ov.yaml", &err) == HP_OK);
    po.overrides = o;
    CHECK_EQ_INT(hp_plan_derive(&p, m, &po, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "no override entry applied (each one's 'when' is inactive on this mesh)");
    hp_overrides_free(o);
    yaml = "- match: model.norm\n  params: {weight: {tp: replicate}}\n";
    CHECK(hp_overrides_parse(&o, yaml, strlen(yaml), "ov.yaml", &err) == HP_OK);
    po.overrides = o;
    CHECK_MSG(hp_plan_derive(&p, m, &po, &err) == HP_OK, "%s", err.msg);
    CHECK(p && p->n_boundaries == 1);
    hp_plan_free(p);
    hp_overrides_free(o);
    hp_model_close(m);
}

TEST_MAIN()
