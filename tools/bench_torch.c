/*
 * bench_torch.c — PyTorch eager on the same shapes, timed in the same run as `hyperpar bench run` / `bench train`
 * / `bench moe`.
 *
 * The binary carries bench/torch_model.py, bench/torch_step.py and bench/torch_moe.py (CMake embeds them:
 * cmake/embed.cmake, the strings cli_torch_model_py, cli_torch_step_py and cli_torch_moe_py), so a build tree and
 * an install alike run them and nothing is looked up or written at run time: rank 0 (the launcher's rank) spawns
 *
 *   $HP_BENCH_PYTHON -B -c BOOT  MODEL_SRC STEP_SRC  CKPT --mode train|forward --batch B --tokens T
 *                                --threads N --reps R --dtype f32|bf16
 *
 * (HP_BENCH_PYTHON defaults to python3; -B writes no bytecode) where BOOT makes MODEL_SRC the module
 * torch_model and runs STEP_SRC as __main__; N is the threads of all ranks on this node, the cores hyperpar used,
 * and the other ranks wait without spinning meanwhile. CKPT is the bench's own random checkpoint, so PyTorch runs the same
 * layer shapes, vocabulary and batch [B, T] with the same weights. The script prints one JSON object on stdout;
 * its stderr (transformers' progress bars) and stdin are /dev/null. Whether python can import torch is asked
 * once before MPI starts (cli_bench_torch_probe); the step itself is spawned with posix_spawn, which does not
 * copy the MPI process's memory. `bench moe` (one process) spawns torch_moe.py the same way, with the preset's MoE
 * dimensions instead of a checkpoint (cli_bench_torch_moe).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <jansson.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_run.h"

extern const unsigned char cli_torch_model_py[], cli_torch_step_py[], cli_torch_moe_py[];
extern char **environ;

/* Makes argv[1] the module torch_model, then runs argv[2] as the script with the remaining arguments. */
static const char g_boot[] =
    "import sys, types\n"
    "m = types.ModuleType('torch_model'); m.__file__ = 'torch_model.py'\n"
    "exec(compile(sys.argv[1], 'torch_model.py', 'exec'), m.__dict__)\n"
    "sys.modules['torch_model'] = m\n"
    "src = sys.argv[2]; sys.argv = ['torch_step.py'] + sys.argv[3:]\n"
    "exec(compile(src, 'torch_step.py', 'exec'), {'__name__': '__main__', '__file__': 'torch_step.py'})\n";

static const char *or_q(const char *s) { return s ? s : "?"; }

static const char *python(void)
{
    const char *p = getenv("HP_BENCH_PYTHON");
    return p && *p ? p : "python3";
}

/* Spawns argv with stdin and stderr on /dev/null; stdout into out (NUL-terminated, cut at cap - 1) when out,
 * else /dev/null. Returns the exit status (0..255), or -1 when it could not run or was killed. */
static int spawn(char *const argv[], char *out, size_t cap)
{
    int fd[2] = {-1, -1};
    if (out && pipe2(fd, O_CLOEXEC) != 0) return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (out) posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    else posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (out) close(fd[1]);
    size_t n = 0;
    if (rc == 0 && out) {
        char sink[4096];
        for (;;) { /* read to the end, keeping what fits */
            char *dst = n + 1 < cap ? out + n : sink;
            size_t room = n + 1 < cap ? cap - 1 - n : sizeof sink;
            ssize_t k = read(fd[0], dst, room);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            if (dst != sink) n += (size_t)k;
        }
    }
    if (out) {
        out[n] = '\0';
        close(fd[0]);
    }
    if (rc != 0) return -1;
    int ws;
    while (waitpid(pid, &ws, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

/* How long the probe may take: importing torch takes seconds; a program that never ends is not a python. */
#define PROBE_S 60

bool cli_bench_torch_probe(char *why, size_t cap)
{
    snprintf(why, cap, "?");
    char *argv[] = {(char *)python(), "-c", "import torch", NULL};
    int fd[2];
    if (pipe2(fd, O_CLOEXEC) != 0) return snprintf(why, cap, "no pipe: %s", strerror(errno)), false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 2); /* its error, for the note */
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        snprintf(why, cap, "cannot run %s: %s", argv[0], strerror(rc));
        return false;
    }
    /* Its stderr, the last 400 bytes kept, until it closes or the time is up (then it is killed). */
    char err[401] = "";
    size_t n = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    bool late = false;
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        int left = PROBE_S * 1000 - (int)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
        struct pollfd pf = {.fd = fd[0], .events = POLLIN};
        int pr = left > 0 ? poll(&pf, 1, left) : 0;
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) {
            late = true;
            break;
        }
        char buf[512];
        ssize_t k = pr > 0 ? read(fd[0], buf, sizeof buf) : -1;
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        for (ssize_t i = 0; i < k; i++) { /* keep the tail */
            if (n == sizeof err - 1) memmove(err, err + 1, --n);
            err[n++] = buf[i];
        }
    }
    close(fd[0]);
    if (late) kill(pid, SIGKILL);
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    if (late) return snprintf(why, cap, "%s did not finish 'import torch' within %d s", argv[0], PROBE_S), false;
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0) return true;
    err[n] = '\0';
    while (n > 0 && (err[n - 1] == '\n' || err[n - 1] == '\r' || err[n - 1] == ' ')) err[--n] = '\0';
    const char *last = strrchr(err, '\n');
    last = last ? last + 1 : err;
    char esc[200];
    hp_escape(last, esc, sizeof esc);
    if (WIFSIGNALED(ws)) snprintf(why, cap, "%s was killed by signal %d on 'import torch'", argv[0], WTERMSIG(ws));
    else snprintf(why, cap, "%s exited with status %d on 'import torch'%s%s", argv[0], WEXITSTATUS(ws),
                  esc[0] ? ": " : "", esc);
    return false;
}

/* Spawns $HP_BENCH_PYTHON -B -c BOOT MODEL_SRC script args... (args NULL-terminated) and reads the last JSON
 * object it prints into t: the median, least and greatest of the timed calls of `tokens` tokens each; t->note says
 * what ran, or why not. */
static void run_script(const unsigned char *script, char *const args[], int64_t tokens, const char *dt,
                       cli_torch_eager *t)
{
    enum { MAX_ARGS = 40 };
    char *argv[MAX_ARGS + 7] = {(char *)python(), "-B", "-c", (char *)g_boot, (char *)cli_torch_model_py,
                                (char *)script};
    int n = 6;
    for (int i = 0; args[i] && i < MAX_ARGS; i++) argv[n++] = args[i];
    argv[n] = NULL;
    char out[8192];
    int rc = spawn(argv, out, sizeof out);
    json_error_t je;
    const char *nl = strrchr(out, '{'); /* the last JSON object printed */
    json_t *o = rc == 0 && nl ? json_loads(nl, JSON_DISABLE_EOF_CHECK, &je) : NULL;
    const char *e = o ? json_string_value(json_object_get(o, "error")) : NULL;
    double med = o ? json_number_value(json_object_get(o, "median_s")) : 0;
    if (!o || e || !(med > 0)) {
        snprintf(t->note, sizeof t->note, "PyTorch eager: not measured (%s %s: %.300s)", python(),
                 rc < 0 ? "could not run" : "failed", e ? e : rc ? "non-zero exit" : "no result printed");
        json_decref(o);
        return;
    }
    t->measured = true;
    t->median_s = med;
    /* The least and the greatest timed call (bench/torch_*.py print them beside the median). */
    json_t *lo = json_object_get(o, "min_s"), *hi = json_object_get(o, "max_s");
    t->has_spread = json_is_number(lo) && json_is_number(hi);
    t->min_s = t->has_spread ? json_number_value(lo) : 0;
    t->max_s = t->has_spread ? json_number_value(hi) : 0;
    t->tokens_per_s = (double)tokens / med;
    t->threads = (int)json_integer_value(json_object_get(o, "threads"));
    snprintf(t->model, sizeof t->model, "%s", or_q(json_string_value(json_object_get(o, "model"))));
    snprintf(t->version, sizeof t->version, "%s", or_q(json_string_value(json_object_get(o, "torch"))));
    snprintf(t->dtype, sizeof t->dtype, "%s", dt);
    snprintf(t->note, sizeof t->note, "PyTorch eager %s, %s, torch %s, %d thread%s", t->dtype, t->model, t->version,
             t->threads, t->threads == 1 ? "" : "s");
    json_decref(o);
}

static void not_installed(cli_torch_eager *t, const char *why)
{
    snprintf(t->note, sizeof t->note, "PyTorch eager: not measured here (torch cannot be imported: %.400s)", why);
}

/* Rank 0's measurement. */
static void measure(const cli_bench_args *a, const cli_bench_info *in, cli_torch_eager *t)
{
    if (!in->torch) {
        not_installed(t, in->torch_why);
        return;
    }
    char B[32], T[32], N[32], R[32];
    snprintf(B, sizeof B, "%lld", (long long)a->batch);
    snprintf(T, sizeof T, "%lld", (long long)a->tokens);
    /* The cores this node's ranks used: each rank's threads times the ranks here (Open MPI's local size). */
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    long local = ls ? strtol(ls, NULL, 10) : 1;
    snprintf(N, sizeof N, "%ld", (long)in->threads * (local > 0 ? local : 1));
    snprintf(R, sizeof R, "%d", in->reps);
    const char *mode = a->train ? "train" : a->decode ? "decode" : "forward";
    /* The forward runs in the bench's dtype; the training step in f32, or under autocast with --compute bf16 (the
     * mixed precision PyTorch users train with). */
    const char *dt = a->train ? (a->compute == HP_LINALG_BF16 ? "autocast" : "f32") : a->dtype == HP_DT_BF16 ? "bf16" : "f32";
    char D[32];
    snprintf(D, sizeof D, "%lld", (long long)a->decode);
    char *args[] = {(char *)in->ckpt_dir, "--mode", (char *)mode, "--batch", B, "--tokens", T, "--threads", N,
                    "--reps", R, "--dtype", (char *)dt, a->decode ? "--new-tokens" : NULL, D, NULL};
    /* decode: the median is of one decode step of B tokens */
    run_script(cli_torch_step_py, args, a->decode ? a->batch : a->batch * a->tokens, dt, t);
}

void cli_bench_torch_moe(const cli_torch_moe *m, cli_torch_eager *t)
{
    memset(t, 0, sizeof *t);
    char why[512];
    if (!cli_bench_torch_probe(why, sizeof why)) {
        not_installed(t, why);
        return;
    }
    char v[9][32];
    const int64_t nums[9] = {m->hidden, m->experts, m->top_k, m->intermediate, m->shared,
                             m->groups, m->topk_group, m->tokens, m->threads};
    for (int i = 0; i < 9; i++) snprintf(v[i], sizeof v[i], "%lld", (long long)nums[i]);
    char R[32];
    snprintf(R, sizeof R, "%d", m->reps);
    char *args[] = {"--family", (char *)m->family, "--hidden", v[0], "--experts", v[1], "--top-k", v[2],
                    "--intermediate", v[3], "--shared", v[4], "--groups", v[5], "--topk-group", v[6],
                    "--tokens", v[7], "--threads", v[8], "--reps", R, "--dtype", (char *)m->dtype, NULL};
    run_script(cli_torch_moe_py, args, m->tokens, m->dtype, t);
}

hp_status cli_bench_torch(const hp_comm *w, const cli_bench_args *a, const cli_bench_info *in, cli_torch_eager *t,
                          hp_err *err)
{
    memset(t, 0, sizeof *t);
    const int P = hp_comm_size(w), R = hp_comm_rank(w);
    if (R == 0) measure(a, in, t);
    if (P == 1) return HP_OK;
    /* The other ranks wait without spinning, so that PyTorch has the node's cores: a 1-byte all-to-all (which
     * no rank completes before rank 0 posts it, after PyTorch) polled every 2 ms. */
    char *buf = calloc(2 * (size_t)P, 1);
    size_t *cnt = calloc(2 * (size_t)P, sizeof *cnt);
    hp_status st = buf && cnt ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int i = 0; cnt && i < P; i++) {
        cnt[i] = 1;
        cnt[P + i] = (size_t)i;
    }
    hp_comm_req *req = NULL;
    if (st == HP_OK) st = hp_comm_ialltoallv(w, buf, cnt, cnt + P, buf + P, cnt, cnt + P, &req, err);
    for (bool done = false; st == HP_OK && !done;) {
        st = hp_comm_test(req, &done, err);
        if (st == HP_OK && !done) nanosleep(&(struct timespec){.tv_nsec = 2000000}, NULL);
    }
    if (req) {
        hp_status s2 = hp_comm_wait(req, err);
        if (st == HP_OK) st = s2;
    }
    free(buf);
    free(cnt);
    return hp_comm_agree(w, st, err);
}

void cli_bench_torch_text(const cli_torch_eager *t, double tokens_per_s, const char *what)
{
    if (!t->measured) {
        printf("  %s\n", t->note);
        return;
    }
    char spread[80] = "";
    if (t->has_spread)
        snprintf(spread, sizeof spread, " (min %.3f, max %.3f)", t->min_s * 1e3, t->max_s * 1e3);
    printf("  pytorch   : %.3f ms median%s of the same batch -> %.1f %s (%s; the same run, rank 0)   ratio "
           "hyperpar/pytorch %.2f\n",
           t->median_s * 1e3, spread, t->tokens_per_s, what, t->note, tokens_per_s / t->tokens_per_s);
}

void cli_bench_torch_json(const cli_torch_eager *t, double tokens_per_s)
{
    if (t->measured) {
        printf(", \"pytorch_eager\": {\"median_s\": %.6g", t->median_s);
        if (t->has_spread) cli_bench_spread_json("", &(cli_bench_spread){t->min_s, t->median_s, t->max_s});
        else printf(", \"min_s\": null, \"max_s\": null");
        printf(", \"tokens_per_s\": %.6g, \"threads\": %d, \"dtype\": \"%s\", \"model\": ", t->tokens_per_s, t->threads,
               t->dtype);
        cli_json_str(t->model);
        printf(", \"torch\": ");
        cli_json_str(t->version);
        printf("}, \"ratio_over_pytorch\": %.6g", tokens_per_s / t->tokens_per_s);
    } else {
        printf(", \"pytorch_eager\": null, \"ratio_over_pytorch\": null");
    }
    printf(", \"pytorch_note\": ");
    cli_json_str(t->note);
}
