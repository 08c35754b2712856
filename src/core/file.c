/*
 * file.c — opening input files without surprises, and saying what a path is when it is not what we need.
 *
 * A plain open(O_RDONLY) of a FIFO blocks until a writer appears, so a named pipe given as a checkpoint,
 * an overrides file or an input would hang hyperpar forever. hp_open_regular opens with O_NONBLOCK (which
 * never blocks on a FIFO or a device), checks with fstat that the object opened is a regular file, and
 * only then clears O_NONBLOCK. Everything that is not a regular file is refused with a sentence naming
 * what it is: a folder, a FIFO, a device, a socket, a symbolic-link loop, a missing path.
 *
 * Small outputs go through hp_file_write_atomic: a temporary beside the file, synced, renamed; a full disk (or
 * the full-disk test hook, hp_test_hooks.full_disk in hyperpar/core.h) fails it with the path and the cause.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/guard.h"
#include "hyperpar/core.h"

static const char *mode_kind(mode_t m)
{
    if (S_ISREG(m)) return "is a regular file";
    if (S_ISDIR(m)) return "is a folder";
    if (S_ISFIFO(m)) return "is a FIFO (named pipe), not a regular file";
    if (S_ISCHR(m)) return "is a character device, not a regular file";
    if (S_ISBLK(m)) return "is a block device, not a regular file";
    if (S_ISSOCK(m)) return "is a socket, not a regular file";
    return "is not a regular file";
}

static const char *errno_kind(int e, char *buf, size_t cap)
{
    switch (e) {
    case ENOENT: return "does not exist";
    case ELOOP: return "is a symbolic-link loop (too many levels of symbolic links)";
    case ENOTDIR: return "does not exist (a component of the path is not a folder)";
    case ENAMETOOLONG: return "is too long a path";
    case EACCES: return "cannot be read: permission denied";
    case ENXIO: return "is a socket or a device that cannot be opened for reading";
    default: snprintf(buf, cap, "cannot be opened: %s", strerror(e)); return buf;
    }
}

const char *hp_path_describe(const char *path, char *buf, size_t cap)
{
    struct stat st;
    if (!path || !*path) return "is an empty path";
    if (stat(path, &st) != 0) {
        int e = errno;
        /* A symbolic link whose target is missing: stat says ENOENT, lstat finds the link itself. */
        if (e == ENOENT && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
            return "is a dangling symbolic link (its target does not exist)";
        return errno_kind(e, buf, cap);
    }
    return mode_kind(st.st_mode);
}

/* The advice that follows "PATH <what it is>" in an open error. */
static const char *hint_for_errno(int e)
{
    switch (e) {
    case ENOENT:
    case ENOTDIR: return "; check the path";
    case ELOOP: return "; fix the symbolic links or give the real file";
    case EACCES: return "; check the file's permissions";
    default: return "";
    }
}

hp_status hp_open_regular(const char *path, int *fd_out, hp_err *err)
{
    char why[256];
    *fd_out = -1;
    if (!path || !*path) return hp_err_set(err, HP_ERR_INPUT, "an empty path was given where a file is expected");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        /* A missing or unreadable input is the user's to fix (exit 2); anything else is the environment. */
        hp_status st = (e == ENOENT || e == ELOOP || e == ENOTDIR || e == ENAMETOOLONG || e == EACCES ||
                        e == EISDIR || e == ENXIO)
                           ? HP_ERR_INPUT
                           : HP_ERR_IO;
        if (e == EISDIR) return hp_err_set(err, st, "%s: cannot open: the path is a folder; a file was expected here", path);
        const char *what = e == ENOENT ? hp_path_describe(path, why, sizeof why) : errno_kind(e, why, sizeof why);
        return hp_err_set(err, st, "%s: cannot open: the path %s%s", path, what, hint_for_errno(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return hp_err_set(err, HP_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        if (S_ISDIR(sb.st_mode))
            return hp_err_set(err, HP_ERR_INPUT, "%s: cannot open: the path is a folder; a file was expected here", path);
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: cannot open: the path %s; hyperpar reads inputs it can seek and map: save it to a "
                          "regular file first",
                          path, mode_kind(sb.st_mode));
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return hp_err_set(err, HP_ERR_IO, "%s: cannot clear O_NONBLOCK: %s", path, strerror(e));
    }
    *fd_out = fd;
    return HP_OK;
}

hp_status hp_file_write_atomic(const char *path, const void *data, size_t len, const char *what, hp_err *err)
{
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof tmp)
        return hp_err_set(err, HP_ERR_INPUT, "%s: cannot write %s: the path is too long", path, what);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno == EEXIST && unlink(tmp) == 0) /* a leftover of an earlier process with our pid */
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        int e = errno;
        return hp_err_set(err, e == ENOENT || e == ENOTDIR || e == EISDIR || e == ENAMETOOLONG ? HP_ERR_INPUT
                                                                                              : HP_ERR_IO,
                          "%s: cannot write %s: cannot create a file in its folder (%s); nothing was written", path,
                          what, strerror(e));
    }
    int e = hp__test_write_fault(len);
    for (size_t off = 0; off < len && !e;) {
        ssize_t n = write(fd, (const char *)data + off, len - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) e = n < 0 ? errno : EIO;
        else off += (size_t)n;
    }
    if (!e && fsync(fd) != 0 && errno != EINVAL && errno != EROFS) e = errno; /* EINVAL: no sync on /dev/shm etc. */
    if (close(fd) != 0 && !e) e = errno;
    if (!e && rename(tmp, path) != 0) e = errno;
    if (e) {
        unlink(tmp);
        return hp_err_set(err, HP_ERR_IO, "%s: writing %s failed: %s; nothing was written", path, what, strerror(e));
    }
    return HP_OK;
}

hp_status hp_file_sync_dir(const char *dir, hp_err *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return hp_err_set(err, HP_ERR_IO, "%s: cannot open the folder to sync it: %s", dir, strerror(errno));
    int e = fsync(fd) != 0 && errno != EINVAL && errno != EROFS && errno != EBADF ? errno : 0;
    close(fd);
    if (e) return hp_err_set(err, HP_ERR_IO, "%s: cannot sync the folder to disk: %s", dir, strerror(e));
    return HP_OK;
}
