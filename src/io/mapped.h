/*
 * io/mapped.h — internal: the bytes a strict reader (safetensors.c, gguf.c) validates, either a file mapped
 * read-only or a caller's buffer, and the guarded copies out of them.
 *
 * A mapped file stays open while it is mapped: a file truncated inside the mapping's last page reads as zeros
 * there (no SIGBUS), so a careful read asks the file's size before and after it copies (hp__mapped_read). The
 * SIGBUS guard (core/guard.h) is entered for as long as the mapping lives and the mapping is registered with it,
 * so a fault names the file instead of killing the process with a bare "Bus error".
 *
 * Invariants after an open returns HP_OK: buf[0, size) is readable (buf is "" when size is 0 or the file was too
 * small to map); map is non-NULL exactly when buf is our own mapping, and fd >= 0 exactly then. A reader's
 * struct embeds one hp__mapped and frees it with hp__mapped_close, which accepts one that was only initialized.
 */
#ifndef HP_IO_MAPPED_H
#define HP_IO_MAPPED_H

#include "hyperpar/core.h"

typedef struct hp__mapped {
    char *label;              /* path or caller's label, for messages */
    const unsigned char *buf; /* the whole file */
    size_t size;
    void *map;      /* non-NULL when buf is our own mapping: the SIGBUS guard is entered while it lives */
    int guard_slot; /* the mapping's entry in the guard's registry (hp__guard_map), -1 when none */
    int fd;         /* the mapped file, kept open: careful reads check it still holds the bytes (-1: none) */
    hp_arena arena; /* the reader's names and values */
} hp__mapped;

/* Sets m to nothing (no label, no bytes, fd and guard_slot -1, an empty arena); hp__mapped_close accepts it. The
 * opens below do this first, so a failed open leaves m ready to close. */
void hp__mapped_init(hp__mapped *m);

/* HP_ERR_NOMEM "LABEL: out of memory." (label NULL: "(memory)"), for a reader that could not allocate itself. */
hp_status hp__mapped_nomem(const char *label, hp_err *err);

/* m holds the caller's buffer buf[0, len) (NULL: an empty one), not copied (it must outlive m), labelled label
 * (NULL: "(memory)"). */
hp_status hp__mapped_open_memory(hp__mapped *m, const void *buf, size_t len, const char *label, hp_err *err);

/* Opens path without ever blocking (hp_open_regular: a FIFO is refused by name) and maps the whole file when it
 * has at least map_min (>= 1) bytes; a smaller file is not mapped (buf is "", size its real size) so that the
 * reader refuses it by its size without reading it. Errors: hp_open_regular's, "PATH: cannot stat: ...",
 * "PATH: out of memory.", "PATH: cannot map N bytes: ...". */
hp_status hp__mapped_open(hp__mapped *m, const char *path, size_t map_min, hp_err *err);

/* Unmaps and closes what an open made, frees the label and the arena; m is left initialized. */
void hp__mapped_close(hp__mapped *m);

/* Whether the mapped file still holds [0, end) (always true for a buffer). */
bool hp__mapped_still_holds(const hp__mapped *m, uint64_t end);

/* Copies buf[off, off + n) into dst (the range must be inside size); false when the mapping faulted. */
bool hp__mapped_copy(const hp__mapped *m, uint64_t off, void *dst, size_t n);

/* hp__mapped_copy with the file's size checked before and after the copy; false when the file no longer holds
 * the bytes or the mapping faulted. */
bool hp__mapped_read(const hp__mapped *m, uint64_t off, void *dst, size_t n);

/* HP_ERR_IO "LABEL changed while reading (truncated or rewritten by another process): reading WHAT faulted. ..." */
hp_status hp__mapped_changed(const hp__mapped *m, const char *what, hp_err *err);

#endif
