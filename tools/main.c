/*
 * main.c — the hyperpar command-line tool: dispatches to one subcommand per file (cmd_*.c).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "testhooks.h"
#include "hyperpar/comm.h"
#include "hyperpar/plan.h"

/* The commands, in the order 'hyperpar --help' lists them; each file describes its own (cli_command). */
static const cli_command *const g_commands[] = {
    &cli_cmd_inspect, &cli_cmd_plan, &cli_cmd_gen, &cli_cmd_convert, &cli_cmd_tokenize, &cli_cmd_demo, &cli_cmd_shard,
    &cli_cmd_merge, &cli_cmd_moe, &cli_cmd_run, &cli_cmd_generate, &cli_cmd_train, &cli_cmd_validate, &cli_cmd_cost,
    &cli_cmd_advise, &cli_cmd_bench,
};
#define N_COMMANDS (sizeof g_commands / sizeof *g_commands)

/* A summary's lines under one another, from column `col`. */
static void print_summary(FILE *out, const char *s, int col)
{
    for (; *s; s++) {
        fputc(*s, out);
        if (*s == '\n' && s[1]) fprintf(out, "%*s", col, "");
    }
    fputc('\n', out);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: hyperpar [-v|--verbose] [--version] <command> [options]\n"
            "\n"
            "Plans, shards and runs Hugging Face transformer checkpoints across ranks.\n"
            "\n"
            "commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const cli_command *c = g_commands[i];
        fprintf(out, "  %-10s ", c->cmd);
        print_summary(out, c->summary, 13);
        for (const cli_command *const *sub = c->subs; sub && *sub; sub++) { /* a group: its commands */
            fprintf(out, "%13s%-13s ", "", (*sub)->name);
            print_summary(out, (*sub)->summary, 27);
        }
    }
    fprintf(out,
            "\n"
            "Run 'hyperpar <command> --help' for a command's options.\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 bad input or usage, 3 numeric verification failed.\n");
}

/*
 * Every message the CLI prints goes through msg_print: it escapes what a message may quote from a file
 * (control characters, ESC above all, invalid UTF-8, C1 controls, bidi overrides; hp_buf_escape) so that no
 * name in a checkpoint can drive the terminal, whatever the message and whoever built it. Line breaks and
 * tabs of multi-line messages stay.
 *
 * Under mpirun every rank parses the same command line: a usage error, or a warning printed before the ranks
 * agree, would be printed once per rank. Those are printed only where the launcher's environment says the rank
 * is 0, or says nothing (cli_rank_is_quiet); every rank still returns the same exit code.
 */
/* Set when this rank kept an error to itself (rank 0 prints it). */
static bool g_kept_quiet;
/* cli_usage_defer's buffer: the first usage error goes there instead of stderr (NULL: printed). */
static char *g_defer;
static size_t g_defer_cap;

void cli_usage_defer(char *buf, size_t cap)
{
    g_defer = buf;
    g_defer_cap = cap;
}

bool cli_rank_is_quiet(void) { return hp_comm_launch_rank() > 0; }

void cli_vsay(const char *head, unsigned esc, const char *fmt, va_list ap)
{
    char msg[16384]; /* a usage error may quote a path of PATH_MAX bytes and more */
    vsnprintf(msg, sizeof msg, fmt, ap);
    hp_buf b;
    hp_buf_init(&b);
    hp_buf_escape(&b, msg, esc);
    fprintf(stderr, "%s%.*s\n", head, (int)b.len, b.data && !b.oom ? b.data : msg);
    hp_buf_free(&b);
}

static void msg_print(const char *head, const char *fmt, va_list ap) { cli_vsay(head, HP_ESC_KEEP_LINES, fmt, ap); }

void cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    msg_print("hyperpar: error: ", fmt, ap);
    va_end(ap);
}

void cli_note(const char *fmt, ...)
{
    if (cli_rank_is_quiet()) return;
    va_list ap;
    va_start(ap, fmt);
    msg_print("hyperpar: note: ", fmt, ap);
    va_end(ap);
}

void cli_warn(const char *fmt, ...)
{
    if (cli_rank_is_quiet()) return;
    va_list ap;
    va_start(ap, fmt);
    msg_print("hyperpar: warning: ", fmt, ap);
    va_end(ap);
}

void cli_warn_cmd(const char *cmd, const char *fmt, ...)
{
    if (cli_rank_is_quiet()) return;
    char prefix[96];
    snprintf(prefix, sizeof prefix, "hyperpar: warning: %.60s: ", cmd); /* as cli_usage_error words its errors */
    va_list ap;
    va_start(ap, fmt);
    msg_print(prefix, fmt, ap);
    va_end(ap);
}

int cli_fail(const hp_err *err)
{
    cli_error("%s", err->msg);
    return hp_status_exit_code(err->status);
}

int cli_fail_once(const hp_err *err)
{
    if (g_defer) {
        if (!*g_defer) snprintf(g_defer, g_defer_cap, "%s", err->msg);
        return hp_status_exit_code(err->status);
    }
    if (cli_rank_is_quiet()) g_kept_quiet = true;
    else cli_error("%s", err->msg);
    return hp_status_exit_code(err->status);
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    if (cli_rank_is_quiet() && !g_defer) {
        g_kept_quiet = true;
        return HP_EXIT_USAGE;
    }
    char msg[12288];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_defer) {
        if (!*g_defer) snprintf(g_defer, g_defer_cap, "%s: %s\nRun 'hyperpar %s --help' for usage.", cmd, msg, cmd);
        return HP_EXIT_USAGE;
    }
    cli_error("%s: %s\nRun 'hyperpar %s --help' for usage.", cmd, msg, cmd);
    return HP_EXIT_USAGE;
}

bool cli_parse_i64(const char *cmd, const char *opt, const char *s, int64_t min, int64_t max, int64_t *out)
{
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < min || v > max) {
        cli_usage_error(cmd, "%s expects an integer in [%lld, %lld], got '%s'", opt, (long long)min, (long long)max,
                        s);
        return false;
    }
    *out = v;
    return true;
}

int cli_mesh(const char *cmd, const char *mesh_spec, int64_t dp, int64_t cp, int64_t tp, int64_t ep, bool ep_axis,
             hp_mesh *out)
{
    hp_err err;
    if (!mesh_spec) {
        hp_mesh_from_sizes(out, dp, cp, tp, ep, ep_axis);
        return HP_EXIT_OK;
    }
    if (hp_mesh_parse(mesh_spec, out, &err) != HP_OK) return cli_fail_once(&err);
    if (out->ep_axis) {
        if (ep > 1 && ep != out->ep)
            return cli_usage_error(cmd, "--ep %lld disagrees with the mesh's ep axis (%lld)", (long long)ep,
                                   (long long)out->ep);
    } else if (ep_axis) {
        return cli_usage_error(cmd, "--ep-axis needs an ep axis in --mesh (e.g. --mesh tp=2,ep=2)");
    } else {
        out->ep = ep;
    }
    return HP_EXIT_OK;
}

/* A usage error of the tool itself (no command, or an unknown one): the message, then the usage. */
static int main_usage_error(const char *fmt, const char *arg)
{
    if (cli_rank_is_quiet()) {
        g_kept_quiet = true;
        return HP_EXIT_USAGE;
    }
    if (fmt) cli_error(fmt, arg);
    usage(stderr);
    return HP_EXIT_USAGE;
}

static int run_main(int argc, char **argv)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return HP_EXIT_OK;
        } else if (!strcmp(argv[i], "--version")) {
            printf("hyperpar 0.1.0\n");
            return HP_EXIT_OK;
        } else if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "--verbose")) {
            hp_log_set_level(HP_LOG_INFO);
        } else {
            return main_usage_error("unknown option '%s'", argv[i]);
        }
    }
    /* The library's warnings (hp_log) are the same on every rank: under mpirun, rank 0 prints them (-v keeps
     * every rank's). */
    if (cli_rank_is_quiet() && hp_log_get_level() == HP_LOG_WARN) hp_log_set_level(HP_LOG_ERROR);
    if (i >= argc) return main_usage_error(NULL, NULL);
    if (!strcmp(argv[i], "help")) {
        usage(stdout);
        return HP_EXIT_OK;
    }
    for (size_t c = 0; c < N_COMMANDS; c++)
        if (!strcmp(argv[i], g_commands[c]->cmd)) {
            optind = 1;
            return g_commands[c]->run(argc - i, argv + i);
        }
    return main_usage_error("unknown command '%s'", argv[i]);
}

/* Output that did not reach its destination (a full disk, /dev/full, a closed pipe) is a failure: every
 * command's stdout is flushed and closed here, and a write error turns a success into exit 1. */
int main(int argc, char **argv)
{
    cli_test_hooks_install(); /* the HP_TEST_* environment, for hyperpar's own tests (testhooks.c) */
    /* Both streams line-buffered, whatever they are: each line reaches the file in one write, so when stdout and
     * stderr share a pipe (2>&1 | tee) a block of stdout never ends mid-line with a stderr line after it (a fully
     * buffered stdout flushed every 4 KiB did), and a line printed in pieces is not split by the other stream.
     * The buffers hold lines up to 64 KiB whole; what prints without a newline (progress lines) flushes itself. */
    setvbuf(stdout, NULL, _IOLBF, 1 << 16);
    setvbuf(stderr, NULL, _IOLBF, 1 << 16);
    int rc = run_main(argc, argv);
    if (g_kept_quiet) {
        /* mpirun ends the whole job when the first rank fails: a rank that kept its error to itself lets rank 0
         * print it first. */
        struct timespec ts = {0, 300 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    errno = 0;
    bool bad = ferror(stdout) != 0;
    int e = errno;
    if (fflush(stdout) != 0) bad = true, e = errno;
    if (fclose(stdout) != 0) bad = true, e = e ? e : errno;
    if (bad) {
        fprintf(stderr, "hyperpar: error: cannot write to standard output: %s\n",
                e ? strerror(e) : "write error");
        if (rc == HP_EXIT_OK) rc = HP_EXIT_RUNTIME;
    }
    return rc;
}
