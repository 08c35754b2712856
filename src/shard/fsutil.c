/*
 * fsutil.c — folder helpers for atomic outputs: a temporary sibling folder, installation by rename, removal.
 *
 *   DIR.tmp.<pid>/ ... written completely ...   then
 *   DIR exists?  empty: rmdir DIR;  non-empty with --force: rename DIR -> DIR.old.<pid>
 *   rename DIR.tmp.<pid> -> DIR;  remove DIR.old.<pid>
 *
 * A run that fails (or is killed) before the rename leaves at most a "*.tmp.<pid>" folder, never a DIR that
 * looks finished; an old DIR is removed only after the new one is in place.
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

static int dir_state(const char *dir) /* -1 absent, 0 empty folder, 1 non-empty folder, 2 not a folder */
{
    struct stat st;
    if (stat(dir, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) return 2;
    DIR *d = opendir(dir);
    if (!d) return 1;
    int state = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) state = 1;
    closedir(d);
    return state;
}

hp_status hp__check_out_dir(const char *dir, bool force, hp_err *err)
{
    int s = dir_state(dir);
    if (s == 2) return hp_err_set(err, HP_ERR_INPUT, "%s exists and is not a folder; choose another --out", dir);
    if (s == 1 && !force)
        return hp_err_set(err, HP_ERR_INPUT, "%s is not empty; choose another --out or pass --force to replace it",
                          dir);
    return HP_OK;
}

hp_status hp__tmpdir_create(const char *dir, char *tmp, size_t cap, hp_err *err)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--; /* "out/" -> "out.tmp.<pid>", not "out/.tmp.<pid>" */
    if ((size_t)snprintf(tmp, cap, "%.*s.tmp.%ld", (int)n, dir, (long)getpid()) >= cap)
        return hp_err_set(err, HP_ERR_INPUT, "%s: path too long", dir);
    hp__rm_tree(tmp);
    /* Missing parent folders are created, as mkdir -p would. */
    for (char *p = strchr(tmp + 1, '/'); p; p = strchr(p + 1, '/')) {
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
            hp_status st = hp_err_set(err, HP_ERR_IO, "%s: cannot create the folder: %s", tmp, strerror(errno));
            *p = '/';
            return st;
        }
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0)
        return hp_err_set(err, HP_ERR_IO, "%s: cannot create the temporary folder: %s", tmp, strerror(errno));
    return HP_OK;
}

hp_status hp__install_dir(const char *tmp, const char *dir, hp_err *err)
{
    char old[4200] = "";
    int s = dir_state(dir);
    if (s == 0 && rmdir(dir) != 0)
        return hp_err_set(err, HP_ERR_IO, "%s: cannot replace the empty folder: %s", dir, strerror(errno));
    if (s == 1 || s == 2) {
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/') n--;
        snprintf(old, sizeof old, "%.*s.old.%ld", (int)n, dir, (long)getpid());
        hp__rm_tree(old);
        if (rename(dir, old) != 0)
            return hp_err_set(err, HP_ERR_IO, "%s: cannot move the old folder aside: %s", dir, strerror(errno));
    }
    if (rename(tmp, dir) != 0) {
        hp_status st = hp_err_set(err, HP_ERR_IO, "%s: cannot rename %s into place: %s", dir, tmp, strerror(errno));
        if (old[0]) rename(old, dir);
        return st;
    }
    if (old[0]) hp__rm_tree(old);
    return HP_OK;
}

hp_status hp__write_text(const char *path, const char *text, size_t len, hp_err *err)
{
    FILE *f = fopen(path, "wb");
    if (!f) return hp_err_set(err, HP_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    bool ok = fwrite(text, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    if (!ok) return hp_err_set(err, HP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return HP_OK;
}

hp_status hp__copy_file(const char *src, const char *dst, hp_err *err)
{
    int in = open(src, O_RDONLY);
    if (in < 0) return hp_err_set(err, HP_ERR_IO, "%s: cannot open: %s", src, strerror(errno));
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0) {
        close(in);
        return hp_err_set(err, HP_ERR_IO, "%s: cannot create: %s", dst, strerror(errno));
    }
    static const size_t chunk = 1u << 20; /* 1 MiB: large enough for full disk speed */
    char *buf = malloc(chunk);
    hp_status st = buf ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    while (st == HP_OK) {
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
