/*
 * core/guard.h — internal: reading mapped files without dying of SIGBUS, and the test pause points.
 *
 * A file read through mmap that another process truncates meanwhile raises SIGBUS at the first touch of a
 * page past its new end. hp__guarded_copy turns that into a false return (the caller reports "changed while
 * reading"); mappings registered with hp__guard_map are also covered where a pointer into them is used
 * directly (a zero-copy GEMM operand): a fault there prints the file's name and ends the process with exit
 * status 1 instead of a bare "Bus error" (135). See guard.c for the mechanism. The test hooks' table lives
 * here too.
 */
#ifndef HP_CORE_GUARD_H
#define HP_CORE_GUARD_H

#include "hyperpar/core.h"

/* Installs the SIGBUS handler (nested calls count; the last leave restores the previous action). Both are
 * thread-safe. The readers' opens (hp_st_open, hp_gguf_open: io/mapped.c) enter for every mapped file and their
 * closes leave, so reads of an open file are always covered; shard and merge also enter around their copy loops. */
void hp__guard_enter(void);
void hp__guard_leave(void);
/* memcpy from a mapping; false when the mapping faulted (the file shrank under us). Needs the guard entered. */
bool hp__guarded_copy(void *dst, const void *src, size_t n);
/* Registers [base, base + len) as the mapping of path (a copy of the name is kept): a fault inside it outside
 * any guarded copy ends the process with exit status 1 and "hyperpar: error: PATH changed while reading ...".
 * Returns a slot to pass to hp__guard_unmap, or -1 when the table is full (the file is then covered by its
 * guarded copies only). */
int hp__guard_map(const void *base, size_t len, const char *path);
void hp__guard_unmap(int slot);

/* HP_ERR_IO "interrupted by signal N (NAME); the unfinished output was removed", for the signal hp_interrupt
 * recorded. */
hp_status hp__interrupt_error(hp_err *err);

/* The test hooks (hyperpar/core.h, hp_test_hooks): the table hp_test_hooks_install filled, all off until then.
 * The library reads it, never the environment. */
const hp_test_hooks *hp__test_hooks(void);
/* Test hook: when path (a hook's value) is a non-empty path P and this process is the one the hooks select,
 * creates P.ready (holding the process id, so a test can kill exactly the process that paused) and waits until
 * P.go exists, a signal was recorded (hp_interrupted) or 120 s passed. Tests truncate an input or deliver a
 * signal at exactly this point instead of guessing with sleeps. With `once`, only the first such call in the
 * process (since the hooks were installed) pauses. */
void hp__test_pause(const char *path, bool once);
/* Test hook: whether this process is the one hp_test_hooks.only_rank selects (true without one_rank): its world
 * rank as hp_comm_world recorded it with hp__test_set_rank (0 until then). */
bool hp__test_rank_selected(void);
void hp__test_set_rank(int rank);
/* Test hook for a full disk (hp_test_hooks.full_disk): the process's file writers (the safetensors writer,
 * hp_file_write_atomic, the output folder's small files) account every write here and fail with ENOSPC once
 * enospc_after bytes in all have been written (the write that crosses the limit fails whole). Returns 0, or
 * ENOSPC with errno set. */
int hp__test_write_fault(size_t n);

#endif
