/*
 * outdir.c — an atomic output folder (hyperpar/outdir.h): shard, merge and train --out, from the --out check
 * to the final rename.
 *
 *   prepare  --out is a usable folder name, not an input nor inside one nor holding one (compared by
 *            canonical path and by device + inode of every existing ancestor), and either absent, an empty
 *            folder, or (--force) an earlier hyperpar output: it holds HP_OUTDIR_MARKER (or a hyperpar
 *            manifest) and nothing but the file names the command writes (its fnmatch patterns).
 *   begin    stale "<OUT>.tmp.<pid>" / "<OUT>.old.<pid>" of dead processes (with our marker) are removed;
 *            missing parents are created (when asked; else they must exist); "<OUT>.tmp.<pid>" is made and
 *            marked.
 *   commit   absent / empty OUT: rmdir the empty folder (fails if it filled up), then
 *            renameat2(tmp, OUT, RENAME_NOREPLACE): a folder that appeared meanwhile is never replaced.
 *            --force: re-check the old output, renameat2(RENAME_EXCHANGE), check that what came out is the
 *            folder seen at the start (else swap back: another run got there first), remove its files by
 *            name, then the folder.
 *   abort    the temporary folder and the parents created for it go.
 *
 * Invariant: hyperpar removes only folders it created, or the files of earlier outputs it has just re-verified
 * as its own (by name: a file that appears meanwhile keeps the folder).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shard/shard_int.h"

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

/* ---- names ---- */

static bool digits(const char *s, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

#define D5 "[0-9][0-9][0-9][0-9][0-9]"
/* The file names shard and merge write into their output folder. */
static const char *const g_shard_names[] = {"manifest.json",
                                            "config.json",
                                            "plan.json",
                                            "model.safetensors",
                                            "model.safetensors.index.json",
                                            "rank-" D5 ".safetensors",
                                            "model-" D5 "-of-" D5 ".safetensors",
                                            NULL};

/* A file name the command writes into its output folder: the marker, or one of its patterns. */
static bool our_name(const hp__outdir *o, const char *n)
{
    if (!strcmp(n, HP_OUTDIR_MARKER)) return true;
    for (size_t i = 0; o->names && o->names[i]; i++)
        if (fnmatch(o->names[i], n, FNM_PATHNAME) == 0) return true;
    return false;
}

static bool file_starts_with(const char *path, const char *needle, size_t within)
{
    char buf[512];
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0) return false;
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, buf, within < sizeof buf ? within : sizeof buf - 1)
                                                            : -1;
    close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

/* The folder holds our marker, or (folders from before markers) a manifest.json of ours. */
static bool has_marker(const char *dir)
{
    char p[HP__PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/%s", dir, HP_OUTDIR_MARKER);
    if (file_starts_with(p, "\"written_by\": \"hyperpar\"", 200)) return true;
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    return file_starts_with(p, "\"format\": \"hyperpar-shards\"", 200);
}

/* HP_OK when dir is an earlier hyperpar output: marked, and holding only regular files of o's names. */
static hp_status check_ours(const hp__outdir *o, const char *dir, hp_err *err)
{
    const char *label = o->out, *cmd = o->cmd;
    char fix[200];
    snprintf(fix, sizeof fix,
             "--force replaces only a folder that hyperpar wrote (it holds the " HP_OUTDIR_MARKER " marker or a "
             "hyperpar manifest.json, and nothing but files 'hyperpar %s' writes)",
             cmd);
    if (!has_marker(dir))
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: --out %s is not empty and was not written by hyperpar; %s. Remove it yourself or "
                          "choose another --out",
                          cmd, label, fix);
    DIR *d = opendir(dir);
    if (!d) return hp_err_set(err, HP_ERR_IO, "%s: --out %s cannot be listed: %s", cmd, label, strerror(errno));
    hp_status st = HP_OK;
    struct dirent *e;
    while (st == HP_OK && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[HP__PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        bool ok = our_name(o, e->d_name) && lstat(p, &sb) == 0 && S_ISREG(sb.st_mode);
        if (!ok)
            st = hp_err_set(err, HP_ERR_INPUT,
                            "%s: --out %s holds '%s', which hyperpar did not write; %s. Move it out of the folder "
                            "or choose another --out",
                            cmd, label, e->d_name, fix);
    }
    closedir(d);
    return st;
}

/* Removes an earlier output that check_ours has just passed: its files of our names, then the folder (which stays,
 * named on stderr, if anything else appeared in it meanwhile). */
static void remove_ours(const hp__outdir *o, const char *dir)
{
    /* Passes until one removes nothing: readdir need not return every entry while the folder changes. */
    for (bool again = true; again;) {
        again = false;
        DIR *d = opendir(dir);
        if (!d) break;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            char p[HP__PATH_MAX + 300];
            struct stat sb;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (our_name(o, e->d_name) && lstat(p, &sb) == 0 && S_ISREG(sb.st_mode) && unlink(p) == 0) again = true;
        }
        closedir(d);
    }
    if (rmdir(dir) != 0)
        hp_log(HP_LOG_WARN, "%s: kept %s, the earlier output of --out %s: %s (it holds files hyperpar did not write)",
               o->cmd, dir, o->out, strerror(errno));
}

/* -1 absent, 0 empty folder, 1 non-empty folder, 2 not a folder; sb filled when it exists (lstat). */
static int dir_state(const char *dir, struct stat *sb)
{
    if (lstat(dir, sb) != 0) return -1;
    if (!S_ISDIR(sb->st_mode)) return 2;
    DIR *d = opendir(dir);
    if (!d) return 1;
    int state = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) state = 1;
    closedir(d);
    return state;
}

/* ---- canonical paths ---- */

/* out = realpath of the longest existing prefix of path + the components after it. The missing components
 * must be plain names (no "." or ".."), and the existing prefix must be a folder. */
static hp_status canon_path(const char *cmd, const char *path, char *out, hp_err *err)
{
    char work[HP__PATH_MAX];
    if (strlen(path) >= sizeof work)
        return hp_err_set(err, HP_ERR_INPUT, "%s: --out is longer than %d bytes", cmd, HP__PATH_MAX - 1);
    strcpy(work, path);
    char tail[HP__PATH_MAX] = "";
    for (;;) {
        size_t n = strlen(work);
        while (n > 1 && work[n - 1] == '/') work[--n] = '\0';
        char *res = realpath(n ? work : ".", NULL);
        if (res) {
            struct stat sb;
            if (tail[0] && (stat(res, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
                hp_status st = hp_err_set(err, HP_ERR_INPUT,
                                          "%s: --out %s cannot be created: %s is not a folder; choose a path "
                                          "below a folder",
                                          cmd, path, work);
                free(res);
                return st;
            }
            int k = snprintf(out, HP__PATH_MAX, "%s%s%s", res, strcmp(res, "/") && tail[0] ? "/" : "", tail);
            free(res);
            if (k >= HP__PATH_MAX)
                return hp_err_set(err, HP_ERR_INPUT, "%s: --out %s is too long a path", cmd, path);
            return HP_OK;
        }
        int e = errno;
        if (e == ENOTDIR)
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: --out %s cannot be created: a component of it is a file, not a folder; choose "
                              "a path below a folder",
                              cmd, path);
        if (e != ENOENT) {
            char why[160];
            return hp_err_set(err, HP_ERR_INPUT, "%s: --out %s: %s %s", cmd, path, work,
                              hp_path_describe(work, why, sizeof why));
        }
        /* work does not exist: move its last component to the tail */
        char *slash = strrchr(work, '/');
        const char *comp = slash ? slash + 1 : work;
        if (!strcmp(comp, ".") || !strcmp(comp, ".."))
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: --out %s has '%s' after a folder that does not exist; give a plain path", cmd,
                              path, comp);
        char t2[2 * HP__PATH_MAX + 2];
        snprintf(t2, sizeof t2, "%s%s%s", comp, tail[0] ? "/" : "", tail);
        if (strlen(t2) >= sizeof tail) return hp_err_set(err, HP_ERR_INPUT, "%s: --out %s is too long a path", cmd, path);
        memcpy(tail, t2, strlen(t2) + 1);
        if (slash == work)
            work[1] = '\0'; /* "/x" -> "/" */
        else if (slash)
            *slash = '\0';
        else
            work[0] = '\0'; /* relative: the current folder */
    }
}

/* Is `inner` equal to `outer` or below it (canonical paths)? */
static bool path_within(const char *inner, const char *outer)
{
    size_t n = strlen(outer);
    if (!strcmp(outer, "/")) return true;
    return !strncmp(inner, outer, n) && (inner[n] == '\0' || inner[n] == '/');
}

/* Does some existing ancestor of canonical path p (p included) have device and inode (dev, ino)? */
static bool ancestor_is(const char *p, dev_t dev, ino_t ino)
{
    char w[HP__PATH_MAX];
    snprintf(w, sizeof w, "%s", p);
    for (;;) {
        struct stat sb;
        if (stat(w, &sb) == 0 && sb.st_dev == dev && sb.st_ino == ino) return true;
        char *slash = strrchr(w, '/');
        if (!slash || !strcmp(w, "/")) return false;
        if (slash == w)
            w[1] = '\0';
        else
            *slash = '\0';
    }
}

static hp_status check_inputs(hp__outdir *o, const char *const *inputs, size_t n, hp_err *err)
{
    struct stat osb;
    bool out_exists = stat(o->canon, &osb) == 0;
    for (size_t i = 0; i < n; i++) {
        if (!inputs[i] || !inputs[i][0]) continue;
        char *in = realpath(inputs[i], NULL);
        struct stat isb;
        if (!in || stat(in, &isb) != 0) {
            free(in);
            continue;
        }
        const char *how = NULL;
        if (!strcmp(in, o->canon) || (out_exists && osb.st_dev == isb.st_dev && osb.st_ino == isb.st_ino))
            how = "is";
        else if (path_within(o->canon, in) || ancestor_is(o->canon, isb.st_dev, isb.st_ino))
            how = "lies inside";
        else if (path_within(in, o->canon) || (out_exists && ancestor_is(in, osb.st_dev, osb.st_ino)))
            how = "contains";
        free(in);
        if (how)
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: --out %s %s the input %s; hyperpar never writes over, into or around what it "
                              "reads. Choose a new folder elsewhere",
                              o->cmd, o->out, how, inputs[i]);
    }
    return HP_OK;
}

hp_status hp__out_prepare(hp__outdir *o, const char *cmd, const char *out, bool force, const char *const *inputs,
                          size_t n_inputs, hp_err *err)
{
    hp_outdir_spec spec = {.cmd = cmd, .out = out, .names = g_shard_names, .force = force, .make_parents = true,
                           .example = !strcmp(cmd, "merge") ? "merged" : "shards", .inputs = inputs,
                           .n_inputs = n_inputs};
    return hp__out_prepare_spec(o, &spec, err);
}

hp_status hp__out_prepare_spec(hp__outdir *o, const hp_outdir_spec *spec, hp_err *err)
{
    memset(o, 0, sizeof *o);
    const char *cmd = spec->cmd, *ex = spec->example ? spec->example : "out";
    bool force = spec->force;
    o->cmd = cmd;
    o->out = spec->out ? spec->out : "";
    o->names = spec->names;
    o->example = ex;
    o->force = force;
    o->parents = spec->make_parents;
    size_t n = strlen(o->out);
    while (n > 1 && o->out[n - 1] == '/') n--;
    const char *base = o->out + n;
    while (base > o->out && base[-1] != '/') base--;
    size_t bl = (size_t)(o->out + n - base);
    if (n == 0)
        return hp_err_set(err, HP_ERR_INPUT, "%s: --out is empty; give the folder to write, e.g. --out %s", cmd, ex);
    if ((bl == 1 && base[0] == '.') || (bl == 2 && !strncmp(base, "..", 2)))
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: --out %s names an existing folder by '%.*s'; hyperpar writes a new folder and renames "
                          "it into place, so give a new folder's name, e.g. --out %.*s%s",
                          cmd, o->out, (int)bl, base, (int)(base - o->out), o->out, ex);
    if (bl == 0 || (n == 1 && o->out[0] == '/'))
        return hp_err_set(err, HP_ERR_INPUT, "%s: --out / is the root folder; give a new folder's name", cmd);
    hp_status st = canon_path(cmd, o->out, o->canon, err);
    if (st != HP_OK) return st;
    if (!o->parents) { /* the folder that takes OUT must exist */
        char parent[HP__PATH_MAX];
        snprintf(parent, sizeof parent, "%s", o->canon);
        char *slash = strrchr(parent, '/');
        parent[slash && slash > parent ? slash - parent : 1] = '\0';
        struct stat pb;
        if (stat(parent, &pb) != 0 || !S_ISDIR(pb.st_mode))
            return hp_err_set(err, HP_ERR_INPUT, "%s: --out %s: the folder '%.*s' does not exist; create it first",
                              cmd, o->out, (int)(base > o->out ? base - o->out - 1 : 1), base > o->out ? o->out : ".");
    }
    if ((size_t)snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", o->canon, (long)getpid()) >= sizeof o->tmp)
        return hp_err_set(err, HP_ERR_INPUT, "%s: --out %s is too long a path", cmd, o->out);
    st = check_inputs(o, spec->inputs, spec->n_inputs, err);
    if (st != HP_OK) return st;
    struct stat sb;
    int s = dir_state(o->canon, &sb);
    if (s == 2)
        return hp_err_set(err, HP_ERR_INPUT, "%s: --out %s exists and is not a folder; choose another --out", cmd,
                          o->out);
    if (s >= 0) {
        char parent[HP__PATH_MAX + 8];
        snprintf(parent, sizeof parent, "%s/..", o->canon);
        struct stat pb;
        if (stat(parent, &pb) == 0 && pb.st_dev != sb.st_dev)
            return hp_err_set(err, HP_ERR_INPUT,
                              "%s: --out %s is a mount point; hyperpar replaces the folder itself, so give a new "
                              "folder inside it",
                              cmd, o->out);
        o->dev = (uint64_t)sb.st_dev;
        o->ino = (uint64_t)sb.st_ino;
    }
    if (s == 1 && !force)
        return hp_err_set(err, HP_ERR_INPUT,
                          "%s: --out %s is not empty; choose another --out or pass --force to replace an earlier "
                          "hyperpar output (only that: --force never replaces other folders)",
                          cmd, o->out);
    if (s == 1) {
        st = check_ours(o, o->canon, err);
        if (st != HP_OK) return st;
    }
    o->state = s < 0 ? 0 : s == 0 ? 1 : 2;
    return HP_OK;
}

/* ---- begin ---- */

/* Whether process pid still runs here (or is not ours to ask: then it counts as running). A zombie does not: a
 * rank that mpirun killed stays one until its new parent reaps it, and its output is as dead as it is. */
static bool alive(long pid)
{
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return false;
    char p[64], buf[256];
    snprintf(p, sizeof p, "/proc/%ld/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f) return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *end = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold spaces and parentheses */
    return !(end && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X'));
}

/* Removes the "<base>.tmp.<pid>" and "<base>.old.<pid>" folders in parent (base NULL: any name) left by processes
 * that no longer run, when they hold our marker. */
static void sweep(const char *parent, const char *base)
{
    size_t bl = base ? strlen(base) : 0;
    DIR *d = opendir(parent);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name, *num = NULL;
        if (base) {
            if (strncmp(nm, base, bl) || (strncmp(nm + bl, ".tmp.", 5) && strncmp(nm + bl, ".old.", 5))) continue;
            num = nm + bl + 5;
        } else {
            const char *dot = strrchr(nm, '.');
            if (!dot || dot - nm < 5 || (strncmp(dot - 4, ".tmp.", 5) && strncmp(dot - 4, ".old.", 5))) continue;
            num = dot + 1;
        }
        if (!digits(num, strlen(num)) || strlen(num) > 9) continue;
        long pid = strtol(num, NULL, 10);
        if (pid <= 0 || pid == (long)getpid()) continue;
        if (alive(pid)) continue;
        char p[HP__PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s", strcmp(parent, "/") ? parent : "", nm);
        struct stat sb;
        if (lstat(p, &sb) != 0 || !S_ISDIR(sb.st_mode) || !has_marker(p)) continue;
        hp__rm_tree(p);
        hp_log(HP_LOG_WARN, "removed %s, the unfinished output of process %ld, which no longer runs", p, pid);
    }
    closedir(d);
}

static void remove_stale(const hp__outdir *o)
{
    char parent[HP__PATH_MAX];
    snprintf(parent, sizeof parent, "%s", o->canon);
    char *slash = strrchr(parent, '/');
    const char *base = o->canon + (slash - parent) + 1;
    if (slash == parent)
        parent[1] = '\0';
    else
        *slash = '\0';
    sweep(parent, base);
}

void hp_outdir_remove_stale(const char *dir) { sweep(dir, NULL); }

static hp_status write_marker(const hp__outdir *o, const char *dir, hp_err *err)
{
    char p[HP__PATH_MAX + 32], text[160];
    snprintf(p, sizeof p, "%s/%s", dir, HP_OUTDIR_MARKER);
    int n = snprintf(text, sizeof text, "{\"written_by\": \"hyperpar\", \"command\": \"%s\", \"marker_version\": 1}\n",
                     o->cmd);
    return hp__write_text(p, text, (size_t)n, err);
}

hp_status hp__out_begin(hp__outdir *o, hp_err *err)
{
    remove_stale(o);
    /* Missing parents, as mkdir -p; remembered so that a failure removes them again. */
    char w[HP__PATH_MAX];
    snprintf(w, sizeof w, "%s", o->canon);
    for (char *p = strchr(w + 1, '/'); p; p = strchr(p + 1, '/')) {
        *p = '\0';
        if (mkdir(w, 0755) == 0) {
            if (o->n_created < 8) snprintf(o->created[o->n_created++], HP__PATH_MAX, "%s", w);
        } else if (errno != EEXIST) {
            hp_status st = hp_err_set(err, HP_ERR_IO, "%s: cannot create the folder %s: %s", o->cmd, w, strerror(errno));
            hp__out_abort(o);
            return st;
        }
        *p = '/';
    }
    if (mkdir(o->tmp, 0755) != 0) {
        struct stat sb;
        if (errno != EEXIST) goto mkdir_failed;
        if (lstat(o->tmp, &sb) != 0 || !S_ISDIR(sb.st_mode) || !has_marker(o->tmp)) {
            hp_status st = hp_err_set(err, HP_ERR_INPUT,
                                      "%s: %s exists and was not made by hyperpar; it is in the way of the temporary "
                                      "folder. Move it away",
                                      o->cmd, o->tmp);
            hp__out_abort(o);
            return st;
        }
        hp__rm_tree(o->tmp); /* ours, from an earlier process that had our pid */
        if (mkdir(o->tmp, 0755) != 0) goto mkdir_failed;
    }
    o->tmp_made = true;
    hp_status st = write_marker(o, o->tmp, err);
    if (st != HP_OK) hp__out_abort(o);
    return st;
mkdir_failed:;
    int e = errno; /* the user's --out named, not the temporary "<out>.tmp.<pid>" beside it */
    hp_status st2 = hp_err_set(err, HP_ERR_IO, "%s: cannot create --out %s: its folder does not take a new folder (%s)",
                               o->cmd, o->out, strerror(e));
    hp__out_abort(o);
    return st2;
}

void hp__out_abort(hp__outdir *o)
{
    if (o->tmp_made && !o->installed) hp__rm_tree(o->tmp);
    o->tmp_made = false;
    for (int i = o->n_created - 1; i >= 0; i--) rmdir(o->created[i]); /* only while still empty */
    o->n_created = 0;
}

/* ---- commit ---- */

static hp_status appeared(const hp__outdir *o, const char *what, hp_err *err)
{
    return hp_err_set(err, HP_ERR_INPUT,
                      "%s: --out %s %s while hyperpar %s ran (another run or another program); nothing was replaced "
                      "and this run's output was removed. Choose another --out or run again",
                      o->cmd, o->out, what, o->cmd);
}

/* Onto an OUT that is absent now: never replaces anything that appeared. */
static hp_status rename_noreplace(hp__outdir *o, hp_err *err)
{
    if (rename2(o->tmp, o->canon, RENAME_NOREPLACE) == 0) return HP_OK;
    if (errno == EEXIST || errno == ENOTEMPTY) return appeared(o, "appeared", err);
    if (errno == EINVAL || errno == ENOSYS) {
        /* A file system without renameat2 flags: rename(2) still refuses to replace a non-empty folder. */
        struct stat sb;
        if (lstat(o->canon, &sb) == 0) return appeared(o, "appeared", err);
        if (rename(o->tmp, o->canon) == 0) return HP_OK;
        if (errno == EEXIST || errno == ENOTEMPTY || errno == EISDIR || errno == ENOTDIR)
            return appeared(o, "appeared", err);
    }
    return hp_err_set(err, HP_ERR_IO, "%s: cannot rename the finished output into %s: %s", o->cmd, o->out,
                      strerror(errno));
}

static bool same_node(const char *p, uint64_t dev, uint64_t ino)
{
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode) && (uint64_t)sb.st_dev == dev && (uint64_t)sb.st_ino == ino;
}

/* Test hook (hp_test_hooks.pause_before_commit = P): a run pauses with its output complete in its temporary
 * folder (hp__test_pause: P.ready, then wait for P.go or a signal). Tests deliver a signal or change --out at
 * exactly this point instead of guessing with sleeps. */
static void test_pause_point(void) { hp__test_pause(hp__test_hooks()->pause_before_commit, false); }

static hp_status install(hp__outdir *o, hp_err *err);

/* The folder's entries are on disk before it takes OUT's name, and the rename itself after (each file was synced
 * by its writer): a crash never leaves OUT naming a folder with missing files. */
hp_status hp__out_commit(hp__outdir *o, hp_err *err)
{
    test_pause_point();
    if (hp__interrupted()) return hp__interrupt_error(err);
    hp_status st = hp_file_sync_dir(o->tmp, err);
    if (st == HP_OK) st = install(o, err);
    if (st == HP_OK) {
        char parent[HP__PATH_MAX];
        snprintf(parent, sizeof parent, "%s", o->canon);
        char *slash = strrchr(parent, '/');
        parent[slash && slash > parent ? slash - parent : 1] = '\0';
        hp_err e2;
        if (hp_file_sync_dir(parent, &e2) != HP_OK)
            hp_log(HP_LOG_WARN, "%s: %s is in place but may not survive a crash: %s", o->cmd, o->out, e2.msg);
    }
    return st;
}

static hp_status install(hp__outdir *o, hp_err *err)
{
    hp_status st = HP_OK;
    if (o->state == 1) { /* an empty folder at the start: it must still be that folder, and empty */
        if (!same_node(o->canon, o->dev, o->ino)) {
            struct stat sb;
            if (lstat(o->canon, &sb) == 0) return appeared(o, "was replaced", err);
        } else if (rmdir(o->canon) != 0) {
            if (errno == ENOTEMPTY || errno == EEXIST) return appeared(o, "became non-empty", err);
            return hp_err_set(err, HP_ERR_IO, "%s: cannot replace the empty folder %s: %s", o->cmd, o->out,
                              strerror(errno));
        }
    }
    if (o->state != 2) {
        st = rename_noreplace(o, err);
    } else if (!same_node(o->canon, o->dev, o->ino)) {
        struct stat sb;
        st = lstat(o->canon, &sb) == 0 ? appeared(o, "was replaced by another folder", err) : rename_noreplace(o, err);
    } else if ((st = check_ours(o, o->canon, err)) != HP_OK) {
        hp_err_prefix(err, "the folder changed while hyperpar ran; nothing was replaced");
    } else if (rename2(o->tmp, o->canon, RENAME_EXCHANGE) == 0) {
        /* o->tmp now holds what was OUT: exactly the folder checked at the start, or swap back. */
        if (!same_node(o->tmp, o->dev, o->ino) || check_ours(o, o->tmp, NULL) != HP_OK) {
            if (rename2(o->tmp, o->canon, RENAME_EXCHANGE) != 0)
                return hp_err_set(err, HP_ERR_IO,
                                  "%s: %s was replaced by another run at the same moment and could not be swapped "
                                  "back (%s); the folder it held is now %s",
                                  o->cmd, o->out, strerror(errno), o->tmp);
            return appeared(o, "was replaced by another run", err);
        }
        o->installed = true;
        remove_ours(o, o->tmp);
        return HP_OK;
    } else if (errno == ENOENT) {
        st = rename_noreplace(o, err);
    } else if (errno == EINVAL || errno == ENOSYS) {
        /* No exchange on this file system: move the old output aside, check it, then rename. */
        char old[HP__PATH_MAX + 32];
        snprintf(old, sizeof old, "%s.old.%ld", o->canon, (long)getpid());
        if (rename2(o->canon, old, RENAME_NOREPLACE) != 0 && rename(o->canon, old) != 0)
            return hp_err_set(err, HP_ERR_IO, "%s: cannot move the old %s aside: %s", o->cmd, o->out, strerror(errno));
        if (!same_node(old, o->dev, o->ino) || check_ours(o, old, NULL) != HP_OK) {
            rename2(old, o->canon, RENAME_NOREPLACE);
            return appeared(o, "was replaced by another run", err);
        }
        st = rename_noreplace(o, err);
        if (st != HP_OK)
            rename2(old, o->canon, RENAME_NOREPLACE);
        else
            remove_ours(o, old);
    } else {
        st = hp_err_set(err, HP_ERR_IO, "%s: cannot swap the finished output into %s: %s", o->cmd, o->out,
                        strerror(errno));
    }
    if (st == HP_OK) {
        o->installed = true;
        o->tmp_made = false;
    }
    return st;
}

/* ---- the end of a run ---- */

hp_status hp__out_finish(hp__outdir *o, const hp__snap *snap, const char *what, int why, hp_status st, hp_err *err)
{
    if (why == HP__FAIL_FAULT) st = hp__fault_error(snap, what, err);
    if (why == HP__FAIL_INTERRUPT || (st == HP_OK && hp__interrupted())) st = hp__interrupt_error(err);
    if (st == HP_OK) st = hp__snap_check(snap, what, err);
    if (st == HP_OK) st = hp__out_commit(o, err);
    if (st != HP_OK) {
        hp__out_fix_msg(o, err);
        hp__out_abort(o);
    }
    return st;
}

/* ---- messages ---- */

static void replace_all(char *msg, size_t cap, const char *from, const char *to)
{
    size_t fl = strlen(from), tl = strlen(to);
    if (!fl) return;
    char out[HP_ERR_MSG_MAX];
    size_t o = 0;
    for (const char *p = msg; *p && o + 1 < sizeof out;) {
        if (!strncmp(p, from, fl) && o + tl + 1 < sizeof out) {
            memcpy(out + o, to, tl);
            o += tl;
            p += fl;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    snprintf(msg, cap, "%s", out);
}

void hp__out_fix_msg(const hp__outdir *o, hp_err *err)
{
    if (!err || !o->tmp[0]) return;
    char pid[32];
    snprintf(pid, sizeof pid, ".tmp.%ld", (long)getpid());
    replace_all(err->msg, sizeof err->msg, o->tmp, o->out);
    replace_all(err->msg, sizeof err->msg, pid, ""); /* the writer's "<file>.tmp.<pid>" */
}

/* ---- the public API (hyperpar/outdir.h) ---- */

hp_status hp_outdir_open(hp_outdir **out, const hp_outdir_spec *spec, hp_err *err)
{
    *out = NULL;
    hp_outdir *o = hp_calloc(1, sizeof *o);
    if (!o) return hp_err_set(err, HP_ERR_NOMEM, "%s: out of memory", spec->cmd);
    hp_status st = hp__out_prepare_spec(o, spec, err);
    if (st != HP_OK) {
        free(o);
        return st;
    }
    *out = o;
    return HP_OK;
}

hp_status hp_outdir_begin(hp_outdir *o, hp_err *err) { return hp__out_begin(o, err); }

const char *hp_outdir_tmp(const hp_outdir *o) { return o->tmp; }

const char *hp_outdir_path(const hp_outdir *o) { return o->canon; }

hp_status hp_outdir_commit(hp_outdir *o, hp_err *err)
{
    hp_status st = hp__out_commit(o, err);
    if (st != HP_OK) {
        hp__out_fix_msg(o, err);
        hp__out_abort(o);
    }
    return st;
}

void hp_outdir_abort(hp_outdir *o) { hp__out_abort(o); }

void hp_outdir_fix_msg(const hp_outdir *o, hp_err *err)
{
    if (o) hp__out_fix_msg(o, err);
}

void hp_outdir_close(hp_outdir *o)
{
    if (!o) return;
    if (!o->installed) hp__out_abort(o);
    free(o);
}
