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
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
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
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!base[0] || !strcmp(base, ".") || !strcmp(base, ".."))
        return snprintf(msg, cap, "%s '%s' names a folder, not a file; give the name of the file to write", opt,
                        path), true;
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + 1 : 1, slash ? path : ".");
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

void cli_json_fstr(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

void cli_json_str(const char *s)
{
    cli_json_fstr(stdout, s);
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
