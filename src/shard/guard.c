/*
 * guard.c — shard and merge's side of reading mapped inputs safely: snapshots of the inputs, the fault and
 * interrupt errors.
 *
 * Copies out of a mapping are guarded by the core (core/guard.c: a fault becomes a false return, not SIGBUS).
 * A file rewritten in place without shrinking faults nothing, so the size, modification time and inode of
 * every input are also compared at the end (hp__snap).
 *
 * Interruption: hp_shard_interrupt (async-signal-safe) records a signal in the core's flag (hp_interrupt); the
 * copy callbacks check it for every piece (at most 4 MiB), so a run stops within one piece, removes its
 * temporary folder and returns.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "shard/shard_int.h"

/* ---- interruption ---- */

/* The flag is the core's (hp_interrupt): the safetensors writer and gen stop on the same signal. */
void hp_shard_interrupt(int sig) { hp_interrupt(sig); }
int hp_shard_interrupted(void) { return hp_interrupted(); }
int hp__interrupted(void) { return hp_interrupted(); }

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
