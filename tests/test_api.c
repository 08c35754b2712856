/*
 * test_api.c — the JSON-in interface (include/hyperpar/api.h) in C, so that the sanitizer build sees it too (the
 * Python tests load the release library): each command's reply is the library writer's text, a model given as a
 * config or as a module's tensors plans as its file does, and bad requests of every kind are exit 2 with a
 * message and no reply, never a crash.
 */
#include <stdlib.h>
#include <string.h>

#include "hyperpar/api.h"
#include "hyperpar/model.h"
#include "hyperpar/plan.h"
#include "testlib.h"

#define L3 "data/configs/llama-3-8b.json"

/* The reply to req: its exit code; *out and *msg (either may be NULL) owned by the caller. */
static int call(const char *req, char **out, char **msg)
{
    char *o = NULL, *e = NULL;
    int rc = hp_api_call(req, &o, &e);
    if (out) *out = o;
    else hp_api_free(o);
    if (msg) *msg = e;
    else hp_api_free(e);
    return rc;
}

TEST(plan_is_the_library_json)
{
    char *out = NULL, *msg = NULL;
    CHECK_EQ_INT(call("{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"mesh\": {\"tp\": 2}}}",
                      &out, &msg), 0);
    CHECK(out && !msg);
    hp_model *m = NULL;
    hp_plan *p = NULL;
    hp_err err;
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, 1, 1, 2, 1, false);
    CHECK(hp_model_open(&m, L3, NULL, &err) == HP_OK && hp_plan_derive(&p, m, &po, &err) == HP_OK);
    hp_buf b;
    hp_buf_init(&b);
    CHECK(p && hp_plan_to_json(p, &b, &err) == HP_OK);
    CHECK(out && b.data && strlen(out) == b.len && !memcmp(out, b.data, b.len));
    hp_buf_free(&b);
    hp_plan_free(p);
    hp_model_close(m);
    hp_api_free(out);
}

TEST(every_command_answers)
{
    static const char *const reqs[] = {
        "{\"command\": \"inspect\", \"model\": {\"path\": \"" L3 "\"}, \"tensors\": true}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"mesh\": \"dp=2,tp=4\"}, \"format\": \"explain\"}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"mesh\": {\"tp\": 2}}, \"format\": \"hf\", \"hf_version\": \"5.25\"}",
        "{\"command\": \"cost\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"mesh\": {\"tp\": 8}}, "
        "\"cost\": {\"mode\": \"train\", \"seq\": 2048, \"hardware\": \"H100\", \"mem-per-rank\": \"40GB\"}}",
        "{\"command\": \"cost\", \"model\": {\"path\": \"data/configs/mixtral-8x7b.json\"}, \"options\": {\"mesh\": "
        "{\"tp\": 2, \"ep\": 2}}, \"cost\": {\"mode\": \"decode\", \"context\": 1024}, \"rank\": 1}",
        "{\"command\": \"advise\", \"model\": {\"path\": \"" L3 "\"}, \"world\": 8, \"cost\": {\"hardware\": \"H100\"}}",
    };
    for (size_t i = 0; i < sizeof reqs / sizeof *reqs; i++) {
        char *out = NULL, *msg = NULL;
        int rc = call(reqs[i], &out, &msg);
        CHECK_MSG(rc == 0 && out && strlen(out) > 100 && !msg, "request %zu: rc %d %s", i, rc, msg ? msg : "");
        hp_api_free(out);
        hp_api_free(msg);
    }
}

/* advise with a budget nothing fits: exit 2, the message, and the report beside it */
TEST(advise_refusal_keeps_its_report)
{
    char *out = NULL, *msg = NULL;
    int rc = call("{\"command\": \"advise\", \"model\": {\"path\": \"" L3 "\"}, \"world\": 2, \"cost\": "
                  "{\"mem-per-rank\": \"1GB\"}}", &out, &msg);
    CHECK_EQ_INT(rc, 2);
    CHECK(msg && strstr(msg, "fits"));
    CHECK(out && strstr(out, "\"candidates\""));
    hp_api_free(out);
    hp_api_free(msg);
}

TEST(a_module_s_tensors_plan_as_its_checkpoint)
{
    hp_model *m = NULL;
    hp_err err;
    CHECK(hp_model_open(&m, "data/forward/llama", NULL, &err) == HP_OK);
    if (!m) return;
    hp_buf req;
    hp_buf_init(&req);
    char *cfg = NULL;
    size_t n = 0;
    FILE *f = fopen("data/forward/llama/config.json", "rb");
    CHECK(f != NULL);
    if (f) {
        cfg = calloc(1, 1 << 16);
        n = fread(cfg, 1, (1 << 16) - 1, f);
        fclose(f);
    }
    hp_buf_printf(&req, "{\"command\": \"plan\", \"options\": {\"mesh\": {\"tp\": 2}}, \"model\": {\"config\": %.*s, "
                  "\"tensors\": [", (int)n, cfg ? cfg : "{}");
    for (size_t i = 0; i < m->n_params; i++) {
        const hp_param *p = &m->params[i];
        hp_buf_printf(&req, "%s{\"name\": \"%s\", \"dtype\": \"%s\", \"shape\": [", i ? ", " : "", p->name,
                      hp_dtype_name(p->dtype));
        for (int d = 0; d < p->n_dims; d++) hp_buf_printf(&req, "%s%lld", d ? ", " : "", (long long)p->shape[d]);
        hp_buf_puts(&req, "]}");
    }
    hp_buf_puts(&req, "]}}");
    char *a = NULL, *b = NULL, *msg = NULL;
    CHECK_EQ_INT(call(req.data, &a, &msg), 0);
    CHECK_MSG(!msg, "%s", msg ? msg : "");
    CHECK_EQ_INT(call("{\"command\": \"plan\", \"options\": {\"mesh\": {\"tp\": 2}}, \"model\": {\"path\": "
                      "\"data/forward/llama\"}}", &b, NULL), 0);
    /* the same boundaries; only the model's path differs */
    const char *ba = a ? strstr(a, "\"boundaries\"") : NULL, *bb = b ? strstr(b, "\"boundaries\"") : NULL;
    CHECK(ba && bb && !strcmp(ba, bb));
    hp_api_free(a);
    hp_api_free(b);
    hp_api_free(msg);
    /* one tensor of another shape: refused, naming it */
    char *bad = strstr(req.data, "\"shape\": [");
    if (bad) bad[10] = '7';
    msg = NULL;
    CHECK_EQ_INT(call(req.data, NULL, &msg), 2);
    CHECK(msg && strstr(msg, "does not describe"));
    hp_api_free(msg);
    free(cfg);
    hp_buf_free(&req);
    hp_model_close(m);
}

TEST(bad_requests_are_exit_2_with_a_message)
{
    static const char *const bad[] = {
        NULL, "", "{", "[]", "3", "{\"command\": 3}", "{\"command\": \"fly\"}", "{\"command\": \"plan\"}",
        "{\"command\": \"plan\", \"bogus\": 1, \"model\": {\"path\": \"" L3 "\"}}",
        "{\"command\": \"plan\", \"model\": {\"path\": 3}}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"/nonexistent\"}}",
        "{\"command\": \"plan\", \"model\": {\"config\": 3}}",
        "{\"command\": \"plan\", \"model\": {\"config\": {}}}",
        "{\"command\": \"plan\", \"model\": {\"config\": {\"model_type\": \"llama\"}, \"tensors\": 5}}",
        "{\"command\": \"plan\", \"model\": {\"config\": {\"model_type\": \"llama\"}, \"tensors\": [{\"name\": 1}]}}",
        "{\"command\": \"plan\", \"model\": {\"config\": {\"model_type\": \"llama\"}, \"tensors\": "
        "[{\"name\": \"a\", \"dtype\": \"F32\", \"shape\": [-1]}]}}",
        "{\"command\": \"plan\", \"model\": {\"config\": {\"model_type\": \"llama\"}, \"tensors\": "
        "[{\"name\": \"a\", \"dtype\": \"Q9\", \"shape\": [1]}]}}",
        "{\"command\": \"plan\", \"model\": {\"config\": {\"model_type\": \"llama\"}, \"tensors\": []}}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"mesh\": {\"tp\": 0}}}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"mesh\": {\"tp\": 3}}}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"mesh\": {\"zp\": 2}}}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"mesh\": \"tp=x\"}}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"mesh\": [2]}}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"ep\": 2, \"mesh\": \"tp=2,ep=4\"}}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"overrides_text\": \"a: [\"}}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"options\": {\"freeze\": \"x\"}}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"format\": \"yaml\"}",
        "{\"command\": \"plan\", \"model\": {\"path\": \"" L3 "\"}, \"format\": \"hf\", \"hf_version\": \"abc\"}",
        "{\"command\": \"cost\", \"model\": {\"path\": \"" L3 "\"}, \"cost\": {\"mode\": \"fly\"}}",
        "{\"command\": \"cost\", \"model\": {\"path\": \"" L3 "\"}, \"cost\": {\"mem-per-rank\": \"80\"}}",
        "{\"command\": \"cost\", \"model\": {\"path\": \"" L3 "\"}, \"cost\": {\"bogus\": 1}}",
        "{\"command\": \"cost\", \"model\": {\"path\": \"" L3 "\"}, \"cost\": {\"measure-gemm\": true}}",
        "{\"command\": \"cost\", \"model\": {\"path\": \"" L3 "\"}, \"rank\": 99}",
        "{\"command\": \"advise\", \"model\": {\"path\": \"" L3 "\"}, \"world\": 8}",
        "{\"command\": \"advise\", \"model\": {\"path\": \"" L3 "\"}, \"world\": 0, \"cost\": {\"hardware\": \"H100\"}}",
        "{\"command\": \"advise\", \"model\": {\"path\": \"" L3 "\"}, \"world\": 8, \"prefer\": \"x\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char *out = NULL, *msg = NULL;
        int rc = call(bad[i], &out, &msg);
        CHECK_MSG(rc == 2 && !out && msg && strlen(msg) > 10, "request %zu (%s): rc %d, reply %s, message %s", i,
                  bad[i] ? bad[i] : "NULL", rc, out ? "given" : "none", msg ? msg : "none");
        hp_api_free(out);
        hp_api_free(msg);
    }
}

TEST_MAIN()
