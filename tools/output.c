/*
 * output.c — the check every command runs on an output FILE name before it does any work (plan -o, moe
 * --output): the name is not empty, not a folder or device, lies in a folder that exists, and is none of
 * the command's inputs. "An input" is any file given on the command line (compared by device and inode, so a
 * symbolic or hard link to an input counts), and, when the model is a folder, every name in it that the
 * checkpoint reader would pick up (config.json, *.safetensors, *.index.json, manifest.json): writing there
 * would replace the model's files or change what the folder means. The output itself is then written to
 * "<path>.tmp.<pid>" and renamed into place (atomic), by the command.
 */
#include <dirent.h>
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
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}
