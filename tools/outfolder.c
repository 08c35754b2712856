/*
 * outfolder.c — an output FOLDER written atomically by a command of the tool (train --out), the way `hyperpar
 * shard --out` treats its folder (src/shard/outdir.c), using only what the tool may use:
 *
 *   check    --out is a usable folder name whose parent exists; it is not an input, inside one, nor holds
 *            one (compared by canonical path); it is absent, an empty folder, or (--force) an earlier output
 *            of the same command: it holds the marker HP_SHARD_MARKER naming that command and nothing but the
 *            file names the command writes.
 *   begin    "<OUT>.tmp.<pid>" is made and marked; the command writes its files into it.
 *   commit   absent OUT: renameat2(tmp, OUT, RENAME_NOREPLACE), so a folder that appeared meanwhile is never
 *            replaced; empty OUT: rmdir (fails if it filled up) then the same; --force over an earlier output:
 *            re-checked, swapped with renameat2(RENAME_EXCHANGE), the old one's known files removed.
 *   abort    the temporary folder's known files and the folder go.
 *
 * Invariant: only files this command names are ever removed (unlink by name, then rmdir, which fails on
 * anything else): what the user made is never deleted.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cli.h"
#include "hyperpar/shard.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

static int rename2(const char *from, const char *to, unsigned flags)
{
#ifdef SYS_renameat2
    return (int)syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, flags);
#else
    (void)from;
    (void)to;
    (void)flags;
    errno = ENOSYS;
    return -1;
#endif
}

/* The names the command writes into its folder (NULL-ended), the marker included. */
static bool known(const cli_outfolder *o, const char *name)
{
    if (!strcmp(name, HP_SHARD_MARKER)) return true;
    for (int i = 0; o->names[i]; i++)
        if (!strcmp(name, o->names[i])) return true;
    return false;
}

/* Whether dir holds the marker written by o->cmd and nothing else but its known names. */
static bool ours(const cli_outfolder *o, const char *dir)
{
    char p[PATH_MAX + 160], text[256];
    snprintf(p, sizeof p, "%s/%s", dir, HP_SHARD_MARKER);
    int fd = open(p, O_RDONLY | O_NOFOLLOW);
    if (fd < 0) return false;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return false;
    text[n] = '\0';
    char want[96];
    snprintf(want, sizeof want, "\"command\": \"%s\"", o->cmd);
    if (!strstr(text, "\"written_by\": \"hyperpar\"") || !strstr(text, want)) return false;
    DIR *d = opendir(dir);
    if (!d) return false;
    bool ok = true;
    struct dirent *e;
    while (ok && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            struct stat sb;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            ok = known(o, e->d_name) && lstat(p, &sb) == 0 && S_ISREG(sb.st_mode);
        }
    closedir(d);
    return ok;
}

/* Removes dir's known files, then dir itself (which fails, harmlessly, if anything else is in it). */
static void remove_ours(const cli_outfolder *o, const char *dir)
{
    char p[PATH_MAX + 160];
    for (int i = 0; o->names[i]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, o->names[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/%s", dir, HP_SHARD_MARKER);
    unlink(p);
    rmdir(dir);
}

/* -1 absent, 0 empty folder, 1 non-empty folder, 2 not a folder. */
static int dir_state(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return -1;
    if (!S_ISDIR(sb.st_mode)) return 2;
    DIR *d = opendir(path);
    if (!d) return 1;
    int s = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            s = 1;
            break;
        }
    closedir(d);
    return s;
}

static bool within(const char *inner, const char *outer)
{
    size_t n = strlen(outer);
    return !strncmp(inner, outer, n) && (inner[n] == '/' || (n == 1 && outer[0] == '/'));
}

bool cli_outfolder_check(cli_outfolder *o, const char *opt, bool force, const char *const *inputs, int n_inputs,
                         char *msg, size_t cap)
{
    const char *out = o->out;
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;
    const char *base = out + n;
    while (base > out && base[-1] != '/') base--;
    size_t bl = (size_t)(out + n - base);
    if (n == 0) return snprintf(msg, cap, "%s: %s is empty; give the name of a new folder", o->cmd, opt), true;
    if (bl == 0 || (n == 1 && out[0] == '/') || (bl == 1 && base[0] == '.') || (bl == 2 && !strncmp(base, "..", 2)))
        return snprintf(msg, cap, "%s: %s %s names an existing folder by '%.*s'; hyperpar writes a new folder and "
                        "renames it into place, so give a new folder's name", o->cmd, opt, out, (int)bl, base), true;
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%.*s", base > out ? (int)(base - out) : 1, base > out ? out : ".");
    char rp[PATH_MAX];
    if (!realpath(parent, rp))
        return snprintf(msg, cap, "%s: %s %s: the folder '%s' does not exist; create it first", o->cmd, opt, out,
                        parent), true;
    if ((size_t)snprintf(o->canon, sizeof o->canon, "%s/%.*s", strcmp(rp, "/") ? rp : "", (int)bl, base) >=
            sizeof o->canon - 32)
        return snprintf(msg, cap, "%s: %s %s is too long a path", o->cmd, opt, out), true;
    for (int i = 0; i < n_inputs; i++) {
        if (!inputs[i] || !inputs[i][0]) continue;
        char in[PATH_MAX];
        if (!realpath(inputs[i], in)) continue;
        const char *how = !strcmp(in, o->canon) ? "is" : within(o->canon, in) ? "lies inside"
                          : within(in, o->canon)                             ? "contains" : NULL;
        if (how)
            return snprintf(msg, cap, "%s: %s %s %s the input %s; hyperpar never writes over, into or around what it "
                            "reads. Choose a new folder elsewhere", o->cmd, opt, out, how, inputs[i]), true;
    }
    int s = dir_state(o->canon);
    if (s == 2)
        return snprintf(msg, cap, "%s: %s %s exists and is not a folder; choose another %s", o->cmd, opt, out, opt),
               true;
    if (s == 1 && !ours(o, o->canon))
        return snprintf(msg, cap, "%s: %s %s is not empty and is not an earlier 'hyperpar %s' output; nothing was "
                        "changed. Choose another %s", o->cmd, opt, out, o->cmd, opt), true;
    if (s == 1 && !force)
        return snprintf(msg, cap, "%s: %s %s holds an earlier 'hyperpar %s' output; pass --force to replace it, or "
                        "choose another %s", o->cmd, opt, out, o->cmd, opt), true;
    o->state = s;
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", o->canon, (long)getpid());
    return false;
}

hp_status cli_outfolder_begin(cli_outfolder *o, hp_err *err)
{
    if (mkdir(o->tmp, 0755) != 0)
        return hp_err_set(err, HP_ERR_IO, "%s: cannot create the folder %s.tmp.%ld beside --out %s: %s", o->cmd,
                          o->out, (long)getpid(), o->out, strerror(errno));
    o->tmp_made = true;
    char p[PATH_MAX + 128], text[160];
    snprintf(p, sizeof p, "%s/%s", o->tmp, HP_SHARD_MARKER);
    int n = snprintf(text, sizeof text, "{\"written_by\": \"hyperpar\", \"command\": \"%s\", \"marker_version\": 1}\n",
                     o->cmd);
    hp_status st = cli_write_atomic_err(p, text, (size_t)n, "the output marker", err);
    if (st != HP_OK) cli_outfolder_abort(o);
    return st;
}

static hp_status appeared(const cli_outfolder *o, const char *what, hp_err *err)
{
    return hp_err_set(err, HP_ERR_INPUT, "%s: --out %s %s while hyperpar %s ran; nothing was replaced and this run's "
                      "output was removed. Choose another --out or run again", o->cmd, o->out, what, o->cmd);
}

static hp_status rename_noreplace(cli_outfolder *o, hp_err *err)
{
    if (rename2(o->tmp, o->canon, RENAME_NOREPLACE) == 0) return HP_OK;
    if (errno == EEXIST || errno == ENOTEMPTY) return appeared(o, "appeared", err);
    if (errno == EINVAL || errno == ENOSYS) { /* no renameat2 flags here: rename(2) never replaces a full folder */
        struct stat sb;
        if (lstat(o->canon, &sb) == 0) return appeared(o, "appeared", err);
        if (rename(o->tmp, o->canon) == 0) return HP_OK;
    }
    return hp_err_set(err, HP_ERR_IO, "%s: cannot rename the finished output into %s: %s", o->cmd, o->out,
                      strerror(errno));
}

hp_status cli_outfolder_commit(cli_outfolder *o, hp_err *err)
{
    hp_status st;
    int s = dir_state(o->canon);
    if (o->state < 0 || (o->state == 0 && s < 0)) {
        st = rename_noreplace(o, err);
    } else if (o->state == 0) {
        if (s != 0 || rmdir(o->canon) != 0) st = appeared(o, "became non-empty", err);
        else st = rename_noreplace(o, err);
    } else if (s < 0) {
        st = rename_noreplace(o, err);
    } else if (!ours(o, o->canon)) {
        st = appeared(o, "changed", err);
    } else if (rename2(o->tmp, o->canon, RENAME_EXCHANGE) == 0) {
        remove_ours(o, o->tmp); /* the earlier output, now at the temporary name */
        o->tmp_made = false;
        return HP_OK;
    } else {
        /* No exchange on this file system: the old output aside, the new one in, the old one removed. */
        char old[PATH_MAX + 160];
        snprintf(old, sizeof old, "%s.old.%ld", o->canon, (long)getpid());
        if (rename(o->canon, old) != 0)
            st = hp_err_set(err, HP_ERR_IO, "%s: cannot move the earlier %s aside: %s", o->cmd, o->out,
                            strerror(errno));
        else if ((st = rename_noreplace(o, err)) != HP_OK)
            rename(old, o->canon);
        else
            remove_ours(o, old);
    }
    if (st == HP_OK) o->tmp_made = false;
    else cli_outfolder_abort(o);
    return st;
}

void cli_outfolder_abort(cli_outfolder *o)
{
    if (o->tmp_made) remove_ours(o, o->tmp);
    o->tmp_made = false;
}
