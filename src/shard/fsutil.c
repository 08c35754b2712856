/*
 * fsutil.c — file helpers of the shard module: recursive removal (of folders hyperpar made), file copy with
 * the interrupt check, small text files. The output folder's life (temporary folder, install) is outdir.c.
 */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shard/shard_int.h"

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

void hp__rm_tree(const char *dir)
{
    struct stat st;
    if (lstat(dir, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(dir);
        return;
    }
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

bool hp__file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

hp_status hp__write_text(const char *path, const char *text, size_t len, hp_err *err)
{
    FILE *f = fopen(path, "wb");
    if (!f) return hp_err_set(err, HP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int e = 0; /* the first failure: a full disk shows at the write, the flush, the sync or the close */
    if (hp__test_write_fault(len) != 0 || fwrite(text, 1, len, f) != len || fflush(f) != 0)
        e = errno ? errno : EIO;
    else if (fsync(fileno(f)) != 0 && errno != EINVAL && errno != EROFS)
        e = errno;
    if (fclose(f) != 0 && !e) e = errno;
    if (e) return hp_err_set(err, HP_ERR_IO, "%s: write failed: %s", path, strerror(e));
    return HP_OK;
}

hp_status hp__copy_file(const char *src, const char *dst, hp_err *err)
{
    int in = -1;
    hp_status ost = hp_open_regular(src, &in, err);
    if (ost != HP_OK) return ost;
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0) {
        close(in);
        return hp_err_set(err, HP_ERR_IO, "%s: cannot create: %s", dst, strerror(errno));
    }
    static const size_t chunk = 1u << 20; /* 1 MiB: large enough for full disk speed */
    char *buf = malloc(chunk);
    hp_status st = buf ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    while (st == HP_OK) {
        if (hp__interrupted()) {
            st = hp__interrupt_error(err);
            break;
        }
        ssize_t n = read(in, buf, chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) st = hp_err_set(err, HP_ERR_IO, "%s: read failed: %s", src, strerror(errno));
        if (n <= 0) break;
        for (ssize_t o = 0; o < n && st == HP_OK;) {
            ssize_t w = write(out, buf + o, (size_t)(n - o));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0)
                st = hp_err_set(err, HP_ERR_IO, "%s: write failed: %s", dst, strerror(errno));
            else
                o += w;
        }
    }
    free(buf);
    close(in);
    if (close(out) != 0 && st == HP_OK) st = hp_err_set(err, HP_ERR_IO, "%s: write failed: %s", dst, strerror(errno));
    if (st != HP_OK) unlink(dst);
    return st;
}
