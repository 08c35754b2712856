/*
 * hyperpar/core.h — status codes, caller-owned errors, checked size math, arenas, logging.
 *
 * Every fallible function returns an hp_status and, on failure, fills a caller-owned hp_err with one
 * full sentence: where (file, JSON path with line:col, tensor, rank), what (found vs expected), and what to
 * do. HP_ASSERT is for our own bugs only: nothing a user file can trigger may reach it.
 */
#ifndef HYPERPAR_CORE_H
#define HYPERPAR_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_status {
    HP_OK = 0,
    HP_ERR_INPUT,   /* bad input file, bad arguments, impossible request: CLI exit 2 */
    HP_ERR_IO,      /* the environment failed us (open, write, rename, mmap): CLI exit 1 */
    HP_ERR_NOMEM,   /* allocation failed: CLI exit 1 */
    HP_ERR_VERIFY,  /* a numeric verification failed: CLI exit 3 */
} hp_status;

#define HP_ERR_MSG_MAX 2048

typedef struct hp_err {
    hp_status status;
    char msg[HP_ERR_MSG_MAX];
} hp_err;

/* Fills err (which may be NULL) with a formatted message and returns status, so that callers can write
 * `return hp_err_set(err, HP_ERR_INPUT, "...");`. */
hp_status hp_err_set(hp_err *err, hp_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes the current message with "<prefix>: " (used to add a file name at an outer level). */
void hp_err_prefix(hp_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void hp_err_clear(hp_err *err);

/* The CLI exit code for a status: 0, 2 (input), 1 (runtime), 3 (verification). */
int hp_status_exit_code(hp_status status);

const char *hp_status_name(hp_status status);

/* Always-on assertion for programming errors; prints file:line and aborts. */
#define HP_ASSERT(cond)                                                                            \
    do {                                                                                           \
        if (!(cond)) hp__assert_fail(#cond, __FILE__, __LINE__);                                   \
    } while (0)
void hp__assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

/* ---- checked size math: each returns false on overflow (or a negative operand) ---- */
bool hp_mul_i64(int64_t a, int64_t b, int64_t *out);
bool hp_add_i64(int64_t a, int64_t b, int64_t *out);
bool hp_mul_size(size_t a, size_t b, size_t *out);
bool hp_add_size(size_t a, size_t b, size_t *out);

/* Allocation wrappers that never return NULL for a zero size and zero-fill (calloc semantics). */
void *hp_calloc(size_t n, size_t size);
char *hp_strdup(const char *s);

/* ---- arena: bump allocation in chunks, freed in one call ---- */
typedef struct hp_arena_chunk hp_arena_chunk;
typedef struct hp_arena {
    hp_arena_chunk *head;
    size_t bytes_used;
} hp_arena;

void hp_arena_init(hp_arena *a);
void hp_arena_free(hp_arena *a);
/* Returns 16-byte aligned zeroed memory, or NULL when out of memory. */
void *hp_arena_alloc(hp_arena *a, size_t n);
char *hp_arena_strdup(hp_arena *a, const char *s);
char *hp_arena_strndup(hp_arena *a, const char *s, size_t n);
char *hp_arena_printf(hp_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- growable string buffer ---- */
typedef struct hp_buf {
    char *data;
    size_t len, cap;
    bool oom;
} hp_buf;

void hp_buf_init(hp_buf *b);
void hp_buf_free(hp_buf *b);
void hp_buf_append(hp_buf *b, const void *data, size_t n);
void hp_buf_puts(hp_buf *b, const char *s);
void hp_buf_printf(hp_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- text read from files, made safe to show on a terminal ----
 * Names and strings from files (tensor names, JSON keys and values, dtype strings, metadata) may hold bytes
 * that drive a terminal. Escaping shows every byte that is not printable as \xNN: C0 controls (ESC
 * included), DEL, bytes of invalid UTF-8, the C1 controls U+0080..U+009F (which some terminals obey as
 * ESC [) and the bidirectional overrides U+202A..U+202E, U+2066..U+2069 (which reorder what is shown).
 * Printable ASCII and other valid UTF-8 pass unchanged. */
#define HP_ESC_BACKSLASH 1u  /* a backslash becomes \\, so that the result is unambiguous (listings) */
#define HP_ESC_KEEP_LINES 2u /* '\n' and '\t' pass unchanged (a whole message of several lines) */
/* Appends s (NULL: "") escaped as above to b. */
void hp_buf_escape(hp_buf *b, const char *s, unsigned flags);
/* s escaped (flags 0) into buf of cap bytes, for quoting a name inside a message; when it does not fit it is
 * cut at a whole character and ends in "...". Returns buf. */
const char *hp_escape(const char *s, char *buf, size_t cap);
/* Whether s needs no escaping (flags as for hp_buf_escape). */
bool hp_is_safe_text(const char *s, unsigned flags);

/* ---- logging to stderr ---- */
typedef enum { HP_LOG_ERROR = 0, HP_LOG_WARN, HP_LOG_INFO, HP_LOG_DEBUG } hp_log_level;
void hp_log_set_level(hp_log_level level);
hp_log_level hp_log_get_level(void);
/* "hyperpar: <level>: <message>" on stderr, the message escaped (HP_ESC_KEEP_LINES). */
void hp_log(hp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Human-readable byte count ("1.50 GiB") into buf; returns buf. */
const char *hp_format_bytes(uint64_t bytes, char *buf, size_t cap);
/* Seconds with 3 significant digits in s, ms or us ("2.5 s", "12.3 ms", "45 us") into buf; returns buf. */
const char *hp_format_seconds(double s, char *buf, size_t cap);
/* The value hp_format_seconds shows for s (rounded to its 3 digits, in seconds): what a ranking printed with it
 * compares, so that a row is never shown slower than the row below it. */
double hp_seconds_as_printed(double s);
/* Thousands separators ("46,702,792,704") into buf; returns buf. */
const char *hp_format_count(uint64_t n, char *buf, size_t cap);

/* Case-insensitive matching against a lower-case pattern (names are never copied to lower case):
 * hp_eq_ci compares n bytes; hp_contains_ci finds pat anywhere in the NUL-terminated s. */
bool hp_eq_ci(const char *s, const char *lower_pat, size_t n);
bool hp_contains_ci(const char *s, const char *lower_pat);

/* Numeric-aware comparison: "layers.2" < "layers.10"; digit runs compare as numbers. */
int hp_natural_cmp(const char *a, const char *b);

/* ---- files ---- */
/* Opens a regular file read-only (O_CLOEXEC) without ever blocking: a FIFO, a device, a socket, a folder, a
 * symbolic-link loop or a missing path is refused with HP_ERR_INPUT and a sentence naming what it is. */
hp_status hp_open_regular(const char *path, int *fd_out, hp_err *err);
/* What a path is, as the end of a sentence ("does not exist", "is a FIFO (named pipe), not a regular file",
 * "is a folder", "is a symbolic-link loop ..."); buf holds the text for unusual errno values. */
const char *hp_path_describe(const char *path, char *buf, size_t cap);
/* Writes len bytes to path atomically: a temporary "<path>.tmp.<pid>" beside it (created exclusively; one of an
 * earlier process with our pid is replaced), synced to disk, then renamed over path. Every write, sync, close
 * and rename error is HP_ERR_IO naming path (not the temporary), `what` and the cause; the temporary never stays
 * behind. A folder that cannot take the file (missing, not a folder) is HP_ERR_INPUT. */
hp_status hp_file_write_atomic(const char *path, const void *data, size_t len, const char *what, hp_err *err);
/* Makes what was renamed into folder dir durable (fsync of the folder itself); file systems without it pass.
 * HP_ERR_IO naming dir otherwise. */
hp_status hp_file_sync_dir(const char *dir, hp_err *err);

/* Shell-style glob on dotted names (fnmatchcase): '*' any run (dots included), '?' one character, [a-z] [!x]. */
bool hp_glob_match(const char *pattern, const char *text);
/* Whether every [...] class of pattern is closed and has no reversed range. When not: *bad_pos is the 0-based
 * offset of the offending '[' (or range) and *why a phrase saying what is wrong ("a '[' that opens ..."). */
bool hp_glob_valid(const char *pattern, size_t *bad_pos, const char **why);

/* ---- hashing ----
 * hp_hash64 is the library's one 64-bit hash of bytes: XXH64 (not cryptographic; ~10 GB/s on one core). The
 * digest depends only on the bytes and the seed, never on the pieces they arrive in, and equals the reference
 * XXH64(data, len, seed) (shard folder identities and rank-file checksums store it: docs/shard-format.md). */
typedef struct hp_hash64 {
    uint64_t v[4], seed, total;
    uint8_t buf[32]; /* pending bytes of an unfinished 32-byte stripe */
    unsigned n_buf;
} hp_hash64;
void hp_hash64_init(hp_hash64 *s, uint64_t seed);
void hp_hash64_update(hp_hash64 *s, const void *data, size_t n);
uint64_t hp_hash64_final(const hp_hash64 *s); /* the state stays usable: more updates may follow */
uint64_t hp_hash64_bytes(const void *data, size_t n, uint64_t seed); /* init + update + final */

/* FNV-1a 64 continuing h (start from HP_FNV1A64_BASIS): only for values a file format already stores (the
 * manifest's plan fingerprint, gen's value keys); new code uses hp_hash64. */
#define HP_FNV1A64_BASIS 0xcbf29ce484222325ull
#define HP_FNV1A64_PRIME 0x100000001b3ull
uint64_t hp_fnv1a64(uint64_t h, const void *data, size_t n);

/* ---- interruption ---- */
/* Records a signal (0 clears); async-signal-safe, so a SIGINT / SIGTERM / SIGHUP handler calls it. Long work
 * that writes output (shard, merge, the safetensors writer, gen) checks hp_interrupted for every piece of at
 * most 4 MiB, removes its temporaries and fails with HP_ERR_IO "interrupted"; the caller then re-raises the
 * signal. hp_shard_interrupt is the same flag. */
void hp_interrupt(int sig);
/* The signal recorded by hp_interrupt, 0 when none. */
int hp_interrupted(void);

/* ---- test hooks: FOR TESTS ONLY, not part of the API ----
 * Points where hyperpar's own tests make a process pause, or its writes fail, on purpose, so that a test can
 * kill, signal or starve it at exactly that point instead of guessing with sleeps. The library reads no
 * environment variable for them: a program installs them. The CLI does, once, first thing in main, from the
 * HP_TEST_* environment (tools/testhooks.c; docs/reliability.md lists the variables), which is how the shell
 * tests set them; the C unit tests call hp_test_hooks_install themselves. A zeroed struct turns every hook off.
 *
 * A pause at a path P creates P.ready holding the process id (so a test kills exactly the process that paused),
 * then waits until P.go exists, a signal was recorded (hp_interrupted) or 120 s passed. */
typedef struct hp_test_hooks {
    bool one_rank;                   /* the hooks below act only in the process of world rank only_rank (as
                                        hp_comm_world found it; a process without a launcher is rank 0) */
    int only_rank;                   /* with one_rank; -1 matches no process */
    bool full_disk;                  /* the file writers (the safetensors writer, hp_file_write_atomic, the output
                                        folder's small files) fail with ENOSPC once enospc_after bytes in all were
                                        written in this process; the write that crosses the limit fails whole */
    long long enospc_after;          /* with full_disk: >= 0 */
    const char *pause_before_read;   /* P: the first read of a mapped safetensors file pauses (once a process) */
    const char *pause_read_of;       /* with pause_before_read: only a file whose path holds this text counts */
    const char *pause_mid_write;     /* P: the safetensors writer pauses with its temporary holding the header */
    const char *pause_write_of;      /* with pause_mid_write: only a file whose path holds this text */
    const char *pause_before_commit; /* P: an output folder pauses complete in its temporary, before its rename */
    const char *pause_in_step;       /* P: the read of step pause_step's first rows of a dataset pauses */
    long long pause_step;            /* with pause_in_step: the step, 1 for the first */
    /* The MPI backend's (read when hp_comm_world makes the world, in every process: only_rank does not apply) */
    long long mpi_chunk_bytes;       /* > 0 (at most 1 GiB): the largest message a collective sends, else 1 GiB */
    bool mpi_force_pieces;           /* every collective goes as messages of mpi_chunk_bytes, none through a
                                        shared window */
    bool mpi_shm_set;                /* /dev/shm is taken to have mpi_shm_avail bytes free (>= 0) */
    long long mpi_shm_avail;
} hp_test_hooks;

/* Copies h (its strings too) into the library's one hook table, replacing what was there; NULL turns every hook
 * off. Not thread-safe: call it before any other library call, or between tests while no other thread is inside
 * the library. */
void hp_test_hooks_install(const hp_test_hooks *h);

#ifdef __cplusplus
}
#endif
#endif
