/*
 * output.c — the check every command runs on an output FILE name before it does any work (plan -o, moe
 * --output): the name is not empty, not a folder or device, lies in a folder that exists, and is none of
 * the command's inputs. "An input" is any file given on the command line (compared by device and inode, so a
 * symbolic or hard link to an input counts), and, when the model is a folder, every name in it that the
 * checkpoint reader would pick up (config.json, *.safetensors, *.index.json, manifest.json): writing there
 * would replace the model's files or change what the folder means. Last, the folder must take a new file: the
 * check creates and removes "<path>.tmp.<pid>", the temporary the output is later written to before it is
 * renamed into place (atomic), so that a read-only file system, /sys or /proc is refused before any work and
 * not after a whole run. Every message names the user's path, never the temporary.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

#include <malloc.h>
#include <stdlib.h>

static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* The folder part of path ("." when it has none) into dir; returns the base name. */
static const char *split_path(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    snprintf(dir, cap, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
    return slash ? slash + 1 : path;
}

bool cli_same_output(const char *a, const char *b)
{
    if (!a || !b) return false;
    if (same_file(a, b)) return true;
    char da[4096], db[4096];
    const char *ba = split_path(a, da, sizeof da), *bb = split_path(b, db, sizeof db);
    return !strcmp(ba, bb) && same_file(da, db); /* a file yet to be made: the same name in the same folder */
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Whether base, a file name inside a model folder, is one the checkpoint reader would read. */
static bool reader_name(const char *base)
{
    return !strcmp(base, "config.json") || !strcmp(base, "manifest.json") || ends_with(base, ".safetensors") ||
           ends_with(base, ".index.json");
}

bool cli_output_problem(const char *opt, const char *path, const char *model, const char *const *inputs,
                        int n_inputs, char *msg, size_t cap)
{
    if (!path[0]) return snprintf(msg, cap, "%s needs a file name, got an empty string", opt), true;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return snprintf(msg, cap, "%s '%s' is %s, not a regular file; give the name of the file to write", opt, path,
                        S_ISDIR(st.st_mode) ? "a folder" : "a device, FIFO or socket"), true;
    char dir[4096];
    const char *base = split_path(path, dir, sizeof dir);
    if (!base[0] || !strcmp(base, ".") || !strcmp(base, ".."))
        return snprintf(msg, cap, "%s '%s' names a folder, not a file; give the name of the file to write", opt,
                        path), true;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return snprintf(msg, cap, "%s '%s': the folder '%s' does not exist; create it first", opt, path, dir), true;
    bool clash = same_file(path, model);
    for (int i = 0; i < n_inputs && !clash; i++) clash = same_file(path, inputs[i]);
    bool model_dir = model && stat(model, &st) == 0 && S_ISDIR(st.st_mode);
    if (!clash && model_dir && same_file(dir, model) && reader_name(base)) clash = true;
    /* A link elsewhere to one of the model folder's files is that file. */
    DIR *d = !clash && model_dir ? opendir(model) : NULL;
    for (struct dirent *e; d && !clash && (e = readdir(d)) != NULL;) {
        if (!reader_name(e->d_name)) continue;
        char in[8200];
        snprintf(in, sizeof in, "%s/%s", model, e->d_name);
        clash = same_file(path, in);
    }
    if (d) closedir(d);
    if (clash)
        return snprintf(msg, cap, "%s '%s' is one of the inputs (the model's files, or a file given with another "
                        "option); writing there would replace it. Choose another file name", opt, path), true;
    /* The folder takes a new file: probe with the temporary's own name (EEXIST: something is there, so the
     * folder took files before; the write itself will tell). */
    char probe[4200];
    snprintf(probe, sizeof probe, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST)
        return snprintf(msg, cap, "%s '%s': cannot create a file in the folder '%s' (%s); choose a writable "
                        "location", opt, path, dir, strerror(errno)), true;
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    return false;
}

int cli_check_output_file(const char *cmd, const char *opt, const char *path, const char *model,
                          const char *const *inputs, int n_inputs)
{
    char msg[8400];
    if (cli_output_problem(opt, path, model, inputs, n_inputs, msg, sizeof msg)) return cli_usage_error(cmd, "%s", msg);
    return HP_EXIT_OK;
}

void cli_json_str(const char *s)
{
    hp_json_fstr(stdout, s);
}

/* Writes data to path atomically (hp_file_write_atomic), or to stdout when path is NULL. */
hp_status cli_write_atomic_err(const char *path, const char *data, size_t len, const char *what, hp_err *err)
{
    if (!path) {
        fwrite(data, 1, len, stdout); /* main() checks stdout's errors */
        return HP_OK;
    }
    return hp_file_write_atomic(path, data, len, what, err);
}

int cli_write_atomic(const char *path, const char *data, size_t len, const char *what)
{
    hp_err err;
    return cli_write_atomic_err(path, data, len, what, &err) == HP_OK ? HP_EXIT_OK : cli_fail(&err);
}

/* This process's anonymous resident memory (RssAnon of /proc/self/status) in KiB, or -1 where there is none.
 * Freed heap is given back first (glibc keeps it otherwise), so the figure is the memory in use. */
int64_t cli_anon_kib(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long v = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %lld", &v) == 1) break;
    fclose(f);
    return v;
}

hp_status cli_write_run_stats(const hp_comm *w, const hp_runner *r, const char *path, int64_t anon_kib_grown,
                             hp_err *err)
{
    enum { NV = 2 * HP_RUN_COLL_COUNT + 11 };
    const hp_run_stats *s = hp_runner_stats(r);
    double mine[NV];
    for (int k = 0; k < HP_RUN_COLL_COUNT; k++) mine[k] = (double)s->bytes[k], mine[HP_RUN_COLL_COUNT + k] = (double)s->calls[k];
    mine[2 * HP_RUN_COLL_COUNT] = (double)s->resident_bytes;
    mine[2 * HP_RUN_COLL_COUNT + 1] = anon_kib_grown >= 0 ? (double)anon_kib_grown * 1024.0 : -1;
    mine[2 * HP_RUN_COLL_COUNT + 2] = s->seconds;
    mine[2 * HP_RUN_COLL_COUNT + 3] = (double)s->workspace_bytes; /* exact: below 2^53 */
    mine[2 * HP_RUN_COLL_COUNT + 4] = (double)s->train_grad_bytes;
    mine[2 * HP_RUN_COLL_COUNT + 5] = (double)s->train_optim_bytes;
    mine[2 * HP_RUN_COLL_COUNT + 6] = (double)s->train_master_bytes;
    mine[2 * HP_RUN_COLL_COUNT + 7] = (double)s->train_saved_bytes;
    mine[2 * HP_RUN_COLL_COUNT + 8] = (double)s->window_bytes; /* exact: below 2^53 */
    mine[2 * HP_RUN_COLL_COUNT + 9] = (double)s->p2p_bytes;
    mine[2 * HP_RUN_COLL_COUNT + 10] = (double)s->p2p_calls;
    bool train = hp_runner_train_steps(r) > 0;
    int n = hp_comm_size(w);
    double *all = hp_calloc((size_t)n * NV, sizeof *all);
    hp_status st = all ? HP_OK : hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    st = hp_comm_agree(w, st, err);
    if (st == HP_OK) st = hp_comm_allgather(w, mine, sizeof mine, all, err);
    bool p2p = false; /* a pipeline's transfers, listed when there are some */
    for (int i = 0; st == HP_OK && i < n; i++) p2p = p2p || all[(size_t)i * NV + 2 * HP_RUN_COLL_COUNT + 10] > 0;
    if (st == HP_OK && hp_comm_rank(w) == 0) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f) st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
        else if (isfinite(s->loss)) /* every rank's: the last forward's, to the bit (17 digits) */
            fprintf(f, "{\"world\": %d, \"loss\": %.17g, \"ranks\": [\n  ", n, s->loss);
        else fprintf(f, "{\"world\": %d, \"loss\": null, \"ranks\": [\n  ", n);
        for (int i = 0; f && i < n; i++) {
            const double *v = all + (size_t)i * NV;
            fprintf(f, "%s{\"rank\": %d, \"bytes\": {", i ? ",\n  " : "", i);
            for (int k = 0; k < HP_RUN_COLL_COUNT; k++)
                fprintf(f, "%s\"%s\": %.0f", k ? ", " : "", hp_run_coll_name((hp_run_coll)k), v[k]);
            fprintf(f, "}, \"calls\": {");
            for (int k = 0; k < HP_RUN_COLL_COUNT; k++)
                fprintf(f, "%s\"%s\": %.0f", k ? ", " : "", hp_run_coll_name((hp_run_coll)k), v[HP_RUN_COLL_COUNT + k]);
            fprintf(f, "}, \"resident_bytes\": %.0f, \"workspace_bytes\": %.0f, \"window_bytes\": %.0f, "
                    "\"anon_bytes_grown\": %.0f, \"seconds\": %.6f",
                    v[2 * HP_RUN_COLL_COUNT], v[2 * HP_RUN_COLL_COUNT + 3], v[2 * HP_RUN_COLL_COUNT + 8],
                    v[2 * HP_RUN_COLL_COUNT + 1], v[2 * HP_RUN_COLL_COUNT + 2]);
            if (train)
                fprintf(f, ", \"grad_bytes\": %.0f, \"optim_bytes\": %.0f, \"master_bytes\": %.0f, \"saved_bytes\": %.0f",
                        v[2 * HP_RUN_COLL_COUNT + 4], v[2 * HP_RUN_COLL_COUNT + 5], v[2 * HP_RUN_COLL_COUNT + 6],
                        v[2 * HP_RUN_COLL_COUNT + 7]);
            if (p2p)
                fprintf(f, ", \"p2p_bytes\": %.0f, \"p2p_calls\": %.0f", v[2 * HP_RUN_COLL_COUNT + 9],
                        v[2 * HP_RUN_COLL_COUNT + 10]);
            fprintf(f, "}");
        }
        if (f) {
            fprintf(f, "\n]}\n");
            fclose(f);
            st = cli_write_atomic_err(path, buf, len, "the statistics", err);
        }
        free(buf);
    }
    free(all);
    return st;
}

