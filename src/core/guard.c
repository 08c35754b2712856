/*
 * guard.c — reading mapped inputs safely, the interrupt flag, and the test hooks (the table
 * hp_test_hooks_install fills: pause points and the full-disk budget).
 *
 * Inputs (safetensors files, shard rank files) are read through mmap. When another process truncates a file
 * meanwhile, touching a page past its new end raises SIGBUS in the thread that touched it, which used to kill
 * hyperpar (exit 135) and leave temporaries behind. Every copy out of a mapping therefore runs inside
 * hp__guarded_copy:
 *
 *   thread-local jmp = &jb;  memcpy(...);  jmp = NULL          SIGBUS handler: jmp set?  siglongjmp(jmp)
 *                                                             fault inside a registered mapping?  print its
 *                                                                 name, _exit(1)
 *                                                             otherwise: restore the old action and return
 *                                                                 (the fault repeats and takes it)
 *
 * SIGBUS is synchronous: it is delivered to the faulting thread, so a thread-local jump buffer is enough
 * under OpenMP. memcpy holds no lock, so leaving it by a jump is safe. The caller turns the fault into an
 * error ("changed while reading") and cleans up. The second branch is the last resort for a pointer into a
 * mapping handed to code we do not control (a zero-copy weight read by a BLAS thread): there is no way back
 * into that code, so the process ends with the runtime-failure status and a message naming the file, using
 * only async-signal-safe calls.
 *
 * The registry is a fixed table written under a mutex and read by the handler without one: a slot's bounds
 * are published after its name and cleared before it is reused.
 *
 * Interruption: hp_interrupt (async-signal-safe) records a signal; long loops (shard and merge copies, the
 * safetensors writer) check hp_interrupted for every piece (at most 4 MiB), stop, remove their temporaries
 * and return an error; the CLI then re-raises the signal.
 */
#define _GNU_SOURCE
#include "core/guard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* volatile: the stores around memcpy must happen in program order as the handler sees them. */
static _Thread_local sigjmp_buf *volatile t_jump;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_refs;
static struct sigaction g_old;

/* Registered mappings. 1024: more files than the largest published checkpoint has shards (DeepSeek-V3: 163)
 * plus the rank files of a shard folder open at once; a file beyond it is still covered by its guarded reads. */
#define N_MAPS 1024
#define MAP_NAME 256
typedef struct map_slot {
    _Atomic uintptr_t lo, hi; /* [lo, hi); hi == 0: free */
    char name[MAP_NAME];
} map_slot;
static map_slot g_maps[N_MAPS];

static size_t cstrlen(const char *s)
{
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

/* The last resort (see the header): async-signal-safe only. The message is put together first and written
 * in one call, so that it does not interleave with another thread's output. */
static void fatal_fault(const char *name)
{
    static const char a[] = "hyperpar: error: ", b[] =
        " changed while reading (truncated or rewritten by another process); reading its mapping faulted. Run "
        "again once no other program writes to it.\n";
    char msg[sizeof a + MAP_NAME + sizeof b];
    size_t n = 0, k = cstrlen(name);
    memcpy(msg, a, sizeof a - 1);
    n += sizeof a - 1;
    memcpy(msg + n, name, k);
    n += k;
    memcpy(msg + n, b, sizeof b - 1);
    n += sizeof b - 1;
    ssize_t r = write(2, msg, n);
    (void)r;
    _exit(1);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    if (t_jump) siglongjmp(*t_jump, 1);
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < N_MAPS; i++) {
        uintptr_t hi = atomic_load(&g_maps[i].hi);
        if (hi && a >= atomic_load(&g_maps[i].lo) && a < hi) fatal_fault(g_maps[i].name);
    }
    /* Not a mapped input: our own bug or another mapping; let the previous action handle the repeat. */
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

int hp__guard_map(const void *base, size_t len, const char *path)
{
    if (!base || !len) return -1;
    int slot = -1;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < N_MAPS && slot < 0; i++) {
        if (atomic_load(&g_maps[i].hi) != 0) continue;
        slot = i;
        snprintf(g_maps[i].name, MAP_NAME, "%s", path ? path : "a mapped file");
        atomic_store(&g_maps[i].lo, (uintptr_t)base);
        atomic_store(&g_maps[i].hi, (uintptr_t)base + len);
    }
    pthread_mutex_unlock(&g_mu);
    return slot;
}

void hp__guard_unmap(int slot)
{
    if (slot < 0 || slot >= N_MAPS) return;
    pthread_mutex_lock(&g_mu);
    atomic_store(&g_maps[slot].hi, 0);
    atomic_store(&g_maps[slot].lo, 0);
    pthread_mutex_unlock(&g_mu);
}

/* ---- interruption ---- */

static volatile sig_atomic_t g_signal;

void hp_interrupt(int sig) { g_signal = sig; }
int hp_interrupted(void) { return (int)g_signal; }

hp_status hp__interrupt_error(hp_err *err)
{
    int s = (int)g_signal;
    return hp_err_set(err, HP_ERR_IO, "interrupted by signal %d (%s); the unfinished output was removed", s,
                      strsignal(s));
}

/* ---- test hooks ---- */

/* The table hp_test_hooks_install fills (it owns copies of the strings) and the state derived from it. Written
 * only by the install, before the work it affects starts; read from any thread. */
static hp_test_hooks g_hooks;
/* Whether a `once` pause already happened since the install. */
static _Atomic int g_paused_once;
/* The full-disk budget left: -1 not worked out yet (the rank is not known at the install), -2 no limit. The
 * budget is process-wide (writer threads share it). */
static _Atomic long long g_write_left = -1;
/* This process's world rank, as hp_comm_world found it (0 before, and without a launcher). */
static _Atomic int g_test_rank;

void hp_test_hooks_install(const hp_test_hooks *h)
{
    const char *const old[] = {g_hooks.pause_before_read, g_hooks.pause_read_of,       g_hooks.pause_mid_write,
                               g_hooks.pause_write_of,    g_hooks.pause_before_commit, g_hooks.pause_in_step};
    for (size_t i = 0; i < sizeof old / sizeof *old; i++) free((char *)old[i]);
    hp_test_hooks t = {0};
    if (h) t = *h;
    /* Owned copies; an empty string is no hook, and one that cannot be copied leaves its hook off (the test that
     * set it then fails visibly: it never pauses). */
    const char **const s[] = {&t.pause_before_read, &t.pause_read_of,       &t.pause_mid_write,
                              &t.pause_write_of,    &t.pause_before_commit, &t.pause_in_step};
    for (size_t i = 0; i < sizeof s / sizeof *s; i++) *s[i] = *s[i] && **s[i] ? strdup(*s[i]) : NULL;
    g_hooks = t;
    atomic_store(&g_paused_once, 0);
    atomic_store(&g_write_left, -1);
}

const hp_test_hooks *hp__test_hooks(void) { return &g_hooks; }

void hp__test_set_rank(int rank) { atomic_store(&g_test_rank, rank); }

bool hp__test_rank_selected(void) { return !g_hooks.one_rank || g_hooks.only_rank == atomic_load(&g_test_rank); }

void hp__test_pause(const char *p, bool once)
{
    if (!p || !*p || strlen(p) > 4000 || !hp__test_rank_selected()) return;
    if (once && atomic_exchange(&g_paused_once, 1)) return;
    char ready[4100], tmp[4140], go[4100], pid[32];
    snprintf(ready, sizeof ready, "%s.ready", p);
    snprintf(tmp, sizeof tmp, "%s.ready.%ld", p, (long)getpid());
    snprintf(go, sizeof go, "%s.go", p);
    /* P.ready appears with the pid already in it (written under another name, then renamed). */
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        bool ok = write(fd, pid, (size_t)n) == n;
        close(fd);
        if (!ok || rename(tmp, ready) != 0) unlink(tmp);
    }
    const struct timespec tick = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 12000 && !hp_interrupted() && access(go, F_OK) != 0; i++) nanosleep(&tick, NULL);
}

int hp__test_write_fault(size_t n)
{
    long long l = atomic_load(&g_write_left);
    if (l == -1) { /* worked out at the first write, once hp_comm_world has recorded the rank */
        bool on = g_hooks.full_disk && g_hooks.enospc_after >= 0 && hp__test_rank_selected();
        long long b = on ? g_hooks.enospc_after : -2;
        long long expected = -1;
        atomic_compare_exchange_strong(&g_write_left, &expected, b);
        l = atomic_load(&g_write_left);
    }
    if (l == -2) return 0;
    for (;;) {
        if ((unsigned long long)l < n) {
            atomic_store(&g_write_left, 0);
            errno = ENOSPC;
            return ENOSPC;
        }
        if (atomic_compare_exchange_weak(&g_write_left, &l, l - (long long)n)) return 0;
    }
}
