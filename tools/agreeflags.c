/*
 * agreeflags.c — before a command's first collective, every rank agrees that it was given the same options as
 * rank 0 (cli_agree_flags). Ranks started with other flags (mpirun's MPMD form `-np 1 A : -np 1 B`, or a
 * wrapper script that differs per rank) would otherwise take another number of steps, enter another
 * collective (a hang), or train replicas that drift apart with exit 0.
 *
 * The option table is the one source: for every option of the command's cli_opt table (aliases are their
 * target) each rank builds its canonical text, the option as given on its command line ("--steps 4", "--freeze a
 * --freeze b", "--skip-nonfinite"; "" when not given), and hashes it; an option that names an input file is
 * hashed by the file's identity instead (its size and its bytes, cli_file_identity), so that two paths to one
 * file agree and one path to two files does not. One allgather of the hashes (8 bytes an option) gives every
 * rank every rank's; the first (rank, option) in rank then table order that differs is the same verdict on every
 * rank, and only then the text of that rank's option travels (one broadcast from it) for the message:
 *
 *     rank 1 was given --steps 4 where rank 0 has --steps 3; every rank must be given the same options
 *
 * Values are compared as given, not as parsed: "--lr 1e-3" and "--lr 0.001", or "--micro-batch 4" and its
 * default, differ. An input that a rank cannot read is not compared (its own open fails later, agreed).
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "hyperpar/comm.h"

/* A file up to 1 MiB is hashed whole; a larger one by its size and 16 windows of 4 KiB spread evenly from its
 * first to its last byte (a few ms on any disk): two token files or two checkpoints of one size differ there. */
#define WHOLE_MAX ((off_t)1 << 20)
#define N_WINDOWS 16
#define WINDOW 4096

uint64_t cli_file_identity(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return 0;
    }
    hp_hash64 h;
    hp_hash64_init(&h, 0);
    int64_t size = (int64_t)sb.st_size;
    hp_hash64_update(&h, &size, sizeof size);
    unsigned char buf[WINDOW];
    bool ok = true;
    if (sb.st_size <= WHOLE_MAX) {
        for (off_t at = 0; ok && at < sb.st_size;) {
            ssize_t k = pread(fd, buf, sizeof buf, at);
            ok = k > 0;
            if (ok) hp_hash64_update(&h, buf, (size_t)k), at += k;
        }
    } else {
        for (int i = 0; ok && i < N_WINDOWS; i++) {
            off_t at = (off_t)((double)(sb.st_size - WINDOW) * i / (N_WINDOWS - 1));
            ok = pread(fd, buf, WINDOW, at) == WINDOW;
            if (ok) hp_hash64_update(&h, buf, WINDOW);
        }
    }
    close(fd);
    uint64_t id = hp_hash64_final(&h);
    return ok ? (id ? id : 1) : 0;
}

/* The message's room for one option's text; a longer one (many --freeze) is cut, the hash still whole. */
#define TEXT_MAX 1024

/* The options of c's table the ranks compare: every entry but the aliases, --help and `free_vals`. */
static bool compared(const cli_opt *o, const int *free_vals, int n_free)
{
    if (!o->help || o->val == 'h') return false;
    for (int i = 0; i < n_free; i++)
        if (free_vals[i] == o->val) return false;
    return true;
}

/* The option as given on this rank ("" when not): "--name ARG" for each time, space-separated, cut at cap. */
static void text_of(const cli_parser *cp, const cli_opt *o, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < cp->seen.n && n < cap; i++) {
        if (cp->seen.val[i] != o->val) continue;
        int k = snprintf(buf + n, cap - n, "%s--%s%s%s", n ? " " : "", o->name, cp->seen.arg[i] ? " " : "",
                         cp->seen.arg[i] ? cp->seen.arg[i] : "");
        n += k > 0 ? (size_t)k : 0;
    }
    if (n >= cap && cap > 4) memcpy(buf + cap - 4, "...", 4);
}

/* The option's hash on this rank: of its text, or of its file's identity (an input); 0 when not comparable. */
static uint64_t hash_of(const cli_parser *cp, const cli_opt *o, const cli_agree_input *inputs, int n_inputs,
                        const char *text)
{
    if (*text)
        for (int i = 0; i < n_inputs; i++)
            if (inputs[i].val == o->val) {
                const char *arg = NULL;
                for (int j = 0; j < cp->seen.n; j++)
                    if (cp->seen.val[j] == o->val) arg = cp->seen.arg[j];
                return arg ? inputs[i].identity(arg) : 0;
            }
    uint64_t h = hp_hash64_bytes(text, strlen(text), 0x5eed);
    return h ? h : 1;
}

hp_status cli_agree_flags(const hp_comm *w, const cli_parser *cp, const int *free_vals, int n_free,
                          const cli_agree_input *inputs, int n_inputs, hp_err *err)
{
    const int N = hp_comm_size(w);
    int n_opt = 0;
    for (const cli_opt *o = cp->opts; o->name; o++) n_opt += compared(o, free_vals, n_free);
    if (N < 2 || n_opt == 0) return HP_OK;
    const cli_opt **opt = calloc((size_t)n_opt, sizeof *opt);
    uint64_t *mine = calloc((size_t)n_opt, sizeof *mine), *all = calloc((size_t)n_opt * (size_t)N, sizeof *all);
    char *text = malloc(TEXT_MAX), *theirs = malloc(TEXT_MAX);
    hp_status st = opt && mine && all && text && theirs ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int k = 0;
    for (const cli_opt *o = cp->opts; st == HP_OK && o->name; o++) {
        if (!compared(o, free_vals, n_free)) continue;
        text_of(cp, o, text, TEXT_MAX);
        opt[k] = o;
        mine[k++] = hash_of(cp, o, inputs, n_inputs, text);
    }
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK) st = hp_comm_allgather(w, mine, (size_t)n_opt * sizeof *mine, all, err);
    int bad_r = -1, bad_i = -1;
    for (int r = 1; st == HP_OK && bad_r < 0 && r < N; r++)
        for (int i = 0; bad_r < 0 && i < n_opt; i++) {
            uint64_t a = all[(size_t)r * (size_t)n_opt + (size_t)i], z = all[i];
            if (a && z && a != z) bad_r = r, bad_i = i;
        }
    if (bad_r >= 0) { /* the same verdict on every rank: rank bad_r's text of the option travels to all */
        const cli_opt *o = opt[bad_i];
        text_of(cp, o, theirs, TEXT_MAX);
        st = hp_comm_bcast(w, theirs, TEXT_MAX, bad_r, err);
        if (st == HP_OK) {
            text_of(cp, o, text, TEXT_MAX);
            theirs[TEXT_MAX - 1] = '\0';
            char no[96];
            snprintf(no, sizeof no, "no --%.80s", o->name);
            bool same = !strcmp(theirs, text); /* an input: the same path, another file */
            st = hp_err_set(err, HP_ERR_INPUT, "rank %d was given %s where rank 0 has %s%s; every rank must be given "
                            "the same options", bad_r, *theirs ? theirs : no, *text ? text : no,
                            same ? ", and the two are other files (other size or bytes)" : "");
        }
        hp_comm_diverged(w); /* ranks given other commands may reach a different number of agreements */
    }
    free(opt);
    free(mine);
    free(all);
    free(text);
    free(theirs);
    return st;
}
