/*
 * guard.c — reading mapped inputs safely while shard and merge run, and stopping cleanly on a signal.
 *
 * A source (or rank file) is read through mmap. When another process truncates the file meanwhile, touching
 * a page past the new end raises SIGBUS in the thread that touched it, which used to kill hyperpar (exit 135)
 * and leave "<out>.tmp.<pid>" behind. Every copy out of a mapping therefore runs inside hp__guarded_copy:
 *
 *   thread-local jmp = &jb;  memcpy(...);  jmp = NULL          SIGBUS handler: jmp set?  siglongjmp(jmp)
 *                                                                              not set?  restore the old
 *                                                                              action and return (the fault
 *                                                                              repeats and takes it)
 *
 * SIGBUS is synchronous: it is delivered to the faulting thread, so a thread-local jump buffer is enough
 * under OpenMP. memcpy holds no lock, so leaving it by a jump is safe. The caller turns the fault into an
 * error and removes its temporary folder. A file rewritten in place without shrinking faults nothing, so the
 * size, modification time and inode of every input are also compared at the end (hp__snap).
 *
 * Interruption: hp_shard_interrupt (async-signal-safe) records a signal; the copy callbacks check it for
 * every piece (at most 4 MiB), so a run stops within one piece, removes its temporary folder and returns.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "shard/shard_int.h"

/* volatile: the stores around memcpy must happen in program order as the handler sees them. */
static _Thread_local sigjmp_buf *volatile t_jump;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_refs;
static struct sigaction g_old;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)si;
    (void)uc;
    if (t_jump) siglongjmp(*t_jump, 1);
    /* Not a guarded copy: our own bug or another mapping; let the previous action handle the repeat. */
    sigaction(sig, &g_old, NULL);
}

void hp__guard_enter(void)
{
    pthread_mutex_lock(&g_mu);
    if (g_refs++ == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER; /* SA_NODEFER: the jump out leaves SIGBUS unblocked */
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &g_old);
    }
    pthread_mutex_unlock(&g_mu);
}

void hp__guard_leave(void)
{
    pthread_mutex_lock(&g_mu);
    if (g_refs > 0 && --g_refs == 0) sigaction(SIGBUS, &g_old, NULL);
    pthread_mutex_unlock(&g_mu);
}

bool hp__guarded_copy(void *dst, const void *src, size_t n)
{
    sigjmp_buf jb;
    if (sigsetjmp(jb, 0)) {
        t_jump = NULL;
        return false;
    }
    t_jump = &jb;
    atomic_signal_fence(memory_order_seq_cst);
    memcpy(dst, src, n);
    atomic_signal_fence(memory_order_seq_cst);
    t_jump = NULL;
    return true;
}

/* ---- interruption ---- */

static volatile sig_atomic_t g_signal;

void hp_shard_interrupt(int sig) { g_signal = sig; }
int hp_shard_interrupted(void) { return (int)g_signal; }
int hp__interrupted(void) { return (int)g_signal; }

hp_status hp__interrupt_error(hp_err *err)
{
    int s = (int)g_signal;
    return hp_err_set(err, HP_ERR_IO, "interrupted by signal %d (%s); the unfinished output was removed", s,
                      strsignal(s));
}

/* ---- snapshots ---- */

static bool stat_sig(const char *path, uint64_t *sig)
{
    struct stat st;
    if (stat(path, &st) != 0) return false;
    sig[0] = (uint64_t)st.st_dev;
    sig[1] = (uint64_t)st.st_ino;
    sig[2] = (uint64_t)st.st_size;
    sig[3] = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
    return true;
}

hp_status hp__snap_take(hp__snap *s, const char *const *paths, const uint64_t *sizes, size_t n, hp_err *err)
{
    memset(s, 0, sizeof *s);
    s->paths = hp_calloc(n ? n : 1, sizeof *s->paths);
    s->sig = hp_calloc(n ? n : 1, 4 * sizeof *s->sig);
    if (!s->paths || !s->sig) {
        hp__snap_free(s);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    s->n = n;
    for (size_t i = 0; i < n; i++) {
        s->paths[i] = paths[i];
        if (!stat_sig(paths[i], s->sig + 4 * i)) memset(s->sig + 4 * i, 0, 4 * sizeof *s->sig);
        if (sizes) s->sig[4 * i + 2] = sizes[i]; /* the size mapped at open: a change since then counts too */
    }
    return HP_OK;
}

static hp_status changed(const char *path, const char *what, const char *how, hp_err *err)
{
    return hp_err_set(err, HP_ERR_IO,
                      "%s: the %s changed while reading (%s); nothing was written. Run again once no other "
                      "program writes to it",
                      path, what, how);
}

hp_status hp__snap_check(const hp__snap *s, const char *what, hp_err *err)
{
    for (size_t i = 0; i < s->n; i++) {
        uint64_t now[4];
        const uint64_t *then = s->sig + 4 * i;
        if (!stat_sig(s->paths[i], now)) return changed(s->paths[i], what, "it was removed", err);
        if (now[0] != then[0] || now[1] != then[1]) return changed(s->paths[i], what, "it was replaced", err);
        if (now[2] != then[2]) {
            char how[96];
            snprintf(how, sizeof how, "its size went from %llu to %llu bytes", (unsigned long long)then[2],
                     (unsigned long long)now[2]);
            return changed(s->paths[i], what, how, err);
        }
        if (now[3] != then[3]) return changed(s->paths[i], what, "it was modified", err);
    }
    return HP_OK;
}

hp_status hp__fault_error(const hp__snap *s, const char *what, hp_err *err)
{
    if (s && hp__snap_check(s, what, err) != HP_OK) return HP_ERR_IO;
    return hp_err_set(err, HP_ERR_IO,
                      "a %s changed while reading (reading its mapping faulted: the file was truncated); "
                      "nothing was written. Run again once no other program writes to it",
                      what);
}

void hp__snap_free(hp__snap *s)
{
    free(s->paths);
    free(s->sig);
    memset(s, 0, sizeof *s);
}
