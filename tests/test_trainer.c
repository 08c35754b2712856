/*
 * test_trainer.c — the library trainer (hyperpar/train.h) driven directly, in one process, on the golden llama
 * (data/forward/llama, its forward_io input_ids): three steps in one run; two steps saved every step, then a
 * resume from the run folder that takes the third with the same loss bit for bit; the events (notes, warnings,
 * steps), the info after prepare, and refusals (a resume with another --lr, the caller's check) with their
 * messages.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperpar/train.h"
#include "testlib.h"

#define MODEL "data/forward/llama"
#define INPUT "data/forward/llama/forward_io.safetensors"

/* What the events said. */
typedef struct seen {
    int n_steps, n_notes, n_warnings, n_limits, n_ends;
    int64_t step[8];
    double loss[8];
    char notes[4096], warnings[2048];
} seen;

static void on_event(void *ctx, const hp_train_event *ev)
{
    seen *s = ctx;
    size_t l;
    switch (ev->kind) {
    case HP_TRAIN_EV_NOTE:
        s->n_notes++;
        l = strlen(s->notes);
        snprintf(s->notes + l, sizeof s->notes - l, "%s\n", ev->text);
        break;
    case HP_TRAIN_EV_WARNING:
        s->n_warnings++;
        l = strlen(s->warnings);
        snprintf(s->warnings + l, sizeof s->warnings - l, "%s\n", ev->text);
        break;
    case HP_TRAIN_EV_LIMIT:
        s->n_limits++;
        CHECK(ev->limit && ev->limit->sum_gflops > 0 && ev->flop_step > 0 && ev->tokens > 0);
        break;
    case HP_TRAIN_EV_STEP:
        if (s->n_steps < 8) s->step[s->n_steps] = ev->step, s->loss[s->n_steps] = ev->loss;
        s->n_steps++;
        CHECK(ev->seconds >= 0 && ev->tokens > 0 && ev->grad_norm > 0 && !ev->skipped);
        break;
    case HP_TRAIN_EV_EVAL: break;
    case HP_TRAIN_EV_STEP_END: s->n_ends++; break;
    }
}

static void config(hp_train_config *c, seen *s, int64_t steps)
{
    hp_train_config_default(c);
    c->model = MODEL;
    c->input = INPUT;
    c->steps = steps;
    c->sched.kind = HP_LR_CONSTANT;
    c->on_event = on_event;
    c->ctx = s;
    c->command = "test_trainer";
}

/* open, prepare, run, write, end, close: the status of the first phase that failed; *info (may be NULL) as
 * prepare gave it, with run_id (whose string the trainer owns) copied into run_id[17]. */
static hp_status train(const hp_train_config *c, hp_train_info *info, char *run_id, hp_err *err)
{
    hp_comm *w = NULL;
    hp_status st = hp_comm_self(&w, err);
    hp_trainer *t = NULL;
    if (st == HP_OK) st = hp_train_open(&t, w, c, err);
    if (st == HP_OK) st = hp_train_prepare(t, 1, err);
    if (st == HP_OK && info) {
        *info = *hp_train_info_of(t);
        snprintf(run_id, 17, "%s", info->run_id);
        info->run_id = info->mesh = info->model_path = NULL; /* freed with the trainer */
        info->logged_loss = info->logged_norm = info->logged_eval = NULL;
    }
    if (st == HP_OK) st = hp_train_run(t, err);
    if (st == HP_OK) st = hp_train_write(t, err);
    if (st == HP_OK) st = hp_train_end(t, err);
    hp_train_close(t);
    hp_comm_free(w);
    return st;
}

static char g_dir[64];

static const char *tmp(const char *name, char *buf, size_t cap)
{
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/hp_test_trainer.XXXXXX");
        if (!mkdtemp(g_dir)) abort();
    }
    snprintf(buf, cap, "%s/%s", g_dir, name);
    return buf;
}

static void rm_tree(void)
{
    if (!g_dir[0]) return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    CHECK(system(cmd) == 0);
    g_dir[0] = '\0';
}

TEST(steps_then_resume_equal_one_run)
{
    hp_err err;
    char run[128], grads[128], log[128], id[17];
    /* three steps in one run */
    seen one = {0};
    hp_train_config c;
    config(&c, &one, 3);
    c.grad_out = tmp("one.g.safetensors", grads, sizeof grads);
    c.log_json = tmp("one.jsonl", log, sizeof log);
    hp_train_info info;
    CHECK_MSG(train(&c, &info, id, &err) == HP_OK, "%s", err.msg);
    CHECK_EQ_INT(info.k0, 0);
    CHECK_EQ_INT(info.last, 3);
    CHECK_EQ_INT(one.n_steps, 3);
    CHECK_EQ_INT(one.n_ends, 3);
    CHECK_EQ_INT(one.n_limits, 1);
    CHECK(one.loss[0] > one.loss[1] && one.loss[1] > one.loss[2]);
    CHECK_STR_CONTAINS(one.notes, "(21 gradients, 3 losses)");
    struct stat sb;
    CHECK(stat(grads, &sb) == 0 && sb.st_size > 0);
    CHECK(stat(log, &sb) == 0 && sb.st_size > 0);

    /* steps 1 and 2 of 3, a checkpoint after each */
    seen two = {0};
    config(&c, &two, 3);
    c.stop_after = 2;
    c.save_every = 1;
    c.out = tmp("run", run, sizeof run);
    CHECK_MSG(train(&c, &info, id, &err) == HP_OK, "%s", err.msg);
    CHECK_EQ_INT(two.n_steps, 2);
    CHECK(two.loss[0] == one.loss[0] && two.loss[1] == one.loss[1]);
    CHECK_STR_CONTAINS(two.notes, "step 2: checkpoint");
    CHECK_EQ_INT(strlen(id), 16);
    char saved_id[17];
    snprintf(saved_id, sizeof saved_id, "%s", id);

    /* the resume from the run folder takes step 3 as the one run did */
    seen three = {0};
    config(&c, &three, 3);
    c.save_every = 1;
    c.out = run;
    c.resume = run;
    CHECK_MSG(train(&c, &info, id, &err) == HP_OK, "%s", err.msg);
    CHECK_EQ_INT(info.k0, 2);
    CHECK_STR_EQ(id, saved_id); /* the resumed run keeps the run's id */
    CHECK_EQ_INT(three.n_steps, 1);
    CHECK_EQ_INT(three.step[0], 3);
    CHECK_MSG(three.loss[0] == one.loss[2], "resumed %.17g, one run %.17g", three.loss[0], one.loss[2]);
    CHECK_STR_CONTAINS(three.notes, "resumed from");
    CHECK_STR_CONTAINS(three.notes, "step 3: checkpoint");

    /* another --lr is not the saved run's: refused, naming the flag */
    seen bad = {0};
    config(&c, &bad, 4);
    c.opt.lr = 2e-3;
    c.resume = run;
    CHECK(train(&c, NULL, NULL, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "the run was saved with lr");
    CHECK_STR_CONTAINS(err.msg, "it was saved by: test_trainer");
    CHECK_EQ_INT(bad.n_steps, 0);
    rm_tree();
}

static hp_status refuse(void *ctx, hp_err *err)
{
    (void)ctx;
    return hp_err_set(err, HP_ERR_INPUT, "the caller refuses");
}

TEST(warnings_and_the_callers_check)
{
    hp_err err;
    seen s = {0};
    hp_train_config c;
    config(&c, &s, 1);
    c.stop_after = 1;
    CHECK_MSG(train(&c, NULL, NULL, &err) == HP_OK, "%s", err.msg);
    CHECK_EQ_INT(s.n_warnings, 1);
    CHECK_STR_CONTAINS(s.warnings, "--stop-after 1 has no effect");

    seen r = {0};
    config(&c, &r, 1);
    c.check = refuse;
    CHECK(train(&c, NULL, NULL, &err) == HP_ERR_INPUT);
    CHECK_STR_EQ(err.msg, "the caller refuses");
    CHECK_EQ_INT(r.n_steps + r.n_notes + r.n_warnings, 0);

    /* a --data file that is not there: refused at open, before any step */
    seen m = {0};
    config(&c, &m, 1);
    c.input = NULL;
    c.data = "data/forward/llama/no-such-file.bin";
    c.seq = 4;
    c.global_batch = 1;
    c.order.global_batch = 1;
    CHECK(train(&c, NULL, NULL, &err) != HP_OK);
    CHECK_STR_CONTAINS(err.msg, "no-such-file.bin");
    CHECK_EQ_INT(m.n_steps, 0);
}

TEST_MAIN()
