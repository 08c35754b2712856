/*
 * mapped.c — the file handling the strict readers share (mapped.h): open without blocking, stat, map read-only
 * under the SIGBUS guard, copy out with the size re-checked, close. The readers own the parsing and every
 * message about their format; the messages here name only the file.
 */
#include "io/mapped.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/guard.h"

void hp__mapped_init(hp__mapped *m)
{
    memset(m, 0, sizeof *m);
    m->buf = (const unsigned char *)"";
    m->guard_slot = -1;
    m->fd = -1;
    hp_arena_init(&m->arena);
}

hp_status hp__mapped_nomem(const char *label, hp_err *err)
{
    return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory.", label ? label : "(memory)");
}

hp_status hp__mapped_open_memory(hp__mapped *m, const void *buf, size_t len, const char *label, hp_err *err)
{
    hp__mapped_init(m);
    m->label = hp_strdup(label ? label : "(memory)");
    if (!m->label) return hp__mapped_nomem(label, err);
    m->buf = buf ? buf : (const void *)"";
    m->size = buf ? len : 0;
    return HP_OK;
}

hp_status hp__mapped_open(hp__mapped *m, const char *path, size_t map_min, hp_err *err)
{
    hp__mapped_init(m);
    int fd = -1;
    hp_status st = hp_open_regular(path, &fd, err);
    if (st != HP_OK) return st;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return hp_err_set(err, HP_ERR_IO, "%s: cannot stat: %s.", path, strerror(e));
    }
    m->label = hp_strdup(path);
    if (!m->label) {
        close(fd);
        return hp__mapped_nomem(path, err);
    }
    m->size = (size_t)sb.st_size;
    if (m->size < map_min) { /* mmap of 0 bytes fails; the reader refuses a file this small by its size */
        close(fd);
        return HP_OK;
    }
    void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return hp_err_set(err, HP_ERR_IO, "%s: cannot map %zu bytes: %s.", path, (size_t)sb.st_size, strerror(e));
    }
    m->map = p;
    m->buf = p;
    hp__guard_enter();
    m->guard_slot = hp__guard_map(p, m->size, path);
    m->fd = fd;
    return HP_OK;
}

void hp__mapped_close(hp__mapped *m)
{
    if (m->map) {
        hp__guard_unmap(m->guard_slot);
        munmap(m->map, m->size);
        hp__guard_leave();
    }
    if (m->fd >= 0) close(m->fd);
    hp_arena_free(&m->arena);
    free(m->label);
    hp__mapped_init(m);
}

bool hp__mapped_still_holds(const hp__mapped *m, uint64_t end)
{
    struct stat sb;
    return m->fd < 0 || (fstat(m->fd, &sb) == 0 && (uint64_t)sb.st_size >= end);
}

bool hp__mapped_copy(const hp__mapped *m, uint64_t off, void *dst, size_t n)
{
    if (!m->map) {
        memcpy(dst, m->buf + off, n);
        return true;
    }
    return hp__guarded_copy(dst, m->buf + off, n);
}

bool hp__mapped_read(const hp__mapped *m, uint64_t off, void *dst, size_t n)
{
    if (!m->map) return hp__mapped_copy(m, off, dst, n);
    return hp__mapped_still_holds(m, off + n) && hp__guarded_copy(dst, m->buf + off, n) &&
           hp__mapped_still_holds(m, off + n);
}

hp_status hp__mapped_changed(const hp__mapped *m, const char *what, hp_err *err)
{
    return hp_err_set(err, HP_ERR_IO,
                      "%s changed while reading (truncated or rewritten by another process): reading %s faulted. "
                      "Run again once no other program writes to it.", m->label, what);
}
