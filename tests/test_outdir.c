/*
 * test_outdir.c — hyperpar/outdir.h through the public API alone, with a command's own file names (as `train
 * --out` uses it): open / begin / commit / close; the temporary folder's name known before begin; parents
 * required or created; --force only over a marked folder holding nothing but the command's names (patterns);
 * the earlier output's files removed by name; a file that appears meanwhile is never removed.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperpar/outdir.h"
#include "testlib.h"

static const char *work(void) { return test_work_dir("outdir"); }

static char *wpath(char *buf, const char *name)
{
    snprintf(buf, 512, "%s/%s", work(), name);
    return buf;
}

static bool exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

static const char *const g_names[] = {"weights.bin", "part-[0-9][0-9].bin", NULL};

static hp_outdir_spec spec_for(const char *out, bool force, bool parents)
{
    return (hp_outdir_spec){.cmd = "demo", .out = out, .names = g_names, .example = "demo_out", .force = force,
                            .make_parents = parents};
}

/* A whole run: open, begin, one file per name given, commit. */
static hp_status write_out(const char *out, bool force, bool parents, const char *const *files, hp_err *err)
{
    hp_outdir_spec s = spec_for(out, force, parents);
    hp_outdir *o = NULL;
    hp_status st = hp_outdir_open(&o, &s, err);
    if (st == HP_OK) st = hp_outdir_begin(o, err);
    for (int i = 0; st == HP_OK && files && files[i]; i++) test_sh("echo new > '%s/%s'", hp_outdir_tmp(o), files[i]);
    if (st == HP_OK) st = hp_outdir_commit(o, err);
    hp_outdir_close(o);
    return st;
}

TEST(a_new_folder_appears_whole_with_its_marker)
{
    char out[512], want[700];
    hp_err err;
    hp_outdir_spec s = spec_for(wpath(out, "new"), false, false);
    hp_outdir *o = NULL;
    CHECK_MSG(hp_outdir_open(&o, &s, &err) == HP_OK, "%s", err.msg);
    snprintf(want, sizeof want, "%s.tmp.%ld", hp_outdir_path(o), (long)getpid());
    CHECK_STR_EQ(hp_outdir_tmp(o), want); /* known before begin: for a signal handler's list */
    CHECK(!exists(want));
    CHECK(hp_outdir_begin(o, &err) == HP_OK);
    snprintf(want, sizeof want, "%s/" HP_OUTDIR_MARKER, hp_outdir_tmp(o));
    CHECK(exists(want));
    test_sh("echo w > '%s/weights.bin'", hp_outdir_tmp(o));
    CHECK_MSG(hp_outdir_commit(o, &err) == HP_OK, "%s", err.msg);
    CHECK(!exists(hp_outdir_tmp(o)));
    hp_outdir_close(o);
    snprintf(want, sizeof want, "%s/weights.bin", out);
    CHECK(exists(want));
    snprintf(want, sizeof want, "%s/" HP_OUTDIR_MARKER, out);
    CHECK(exists(want));
}

TEST(close_without_commit_leaves_nothing)
{
    char out[512];
    hp_err err;
    hp_outdir_spec s = spec_for(wpath(out, "deep/er/dropped"), false, true);
    hp_outdir *o = NULL;
    CHECK(hp_outdir_open(&o, &s, &err) == HP_OK);
    CHECK(hp_outdir_begin(o, &err) == HP_OK);
    CHECK(exists(hp_outdir_tmp(o)));
    test_sh("echo w > '%s/weights.bin'", hp_outdir_tmp(o));
    hp_outdir_close(o);
    CHECK(!exists(out));
    CHECK(!exists(wpath(out, "deep"))); /* the parents made for it went too */
    hp_outdir_close(NULL);
}

TEST(parents_are_required_or_created)
{
    char out[512];
    hp_err err;
    CHECK(write_out(wpath(out, "no/such/dir"), false, false, NULL, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "demo: --out ");
    CHECK_STR_CONTAINS(err.msg, "/no/such' does not exist; create it first");
    CHECK(!exists(wpath(out, "no")));
    const char *const files[] = {"part-07.bin", NULL};
    CHECK_MSG(write_out(wpath(out, "made/for/it"), false, true, files, &err) == HP_OK, "%s", err.msg);
    CHECK(exists(wpath(out, "made/for/it/part-07.bin")));
}

TEST(messages_name_the_command_and_its_example)
{
    char out[512], in[512];
    hp_err err;
    CHECK(write_out(".", false, false, NULL, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "demo: --out . names an existing folder by '.'");
    CHECK_STR_CONTAINS(err.msg, "e.g. --out demo_out");
    CHECK(write_out("", false, false, NULL, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "e.g. --out demo_out");
    wpath(in, "input");
    test_sh("mkdir -p '%s'", in);
    hp_outdir_spec s = spec_for(wpath(out, "input/sub"), false, true);
    const char *const inputs[] = {in};
    s.inputs = inputs;
    s.n_inputs = 1;
    hp_outdir *o = NULL;
    CHECK(hp_outdir_open(&o, &s, &err) == HP_ERR_INPUT && !o);
    CHECK_STR_CONTAINS(err.msg, "lies inside the input");
}

TEST(force_replaces_only_a_folder_of_our_names)
{
    char out[512], p[700];
    hp_err err;
    const char *const first[] = {"weights.bin", "part-01.bin", NULL}, *const second[] = {"part-02.bin", NULL};
    CHECK(write_out(wpath(out, "ours"), false, false, first, &err) == HP_OK);
    CHECK(write_out(out, false, false, second, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "is not empty; choose another --out or pass --force");
    CHECK_MSG(write_out(out, true, false, second, &err) == HP_OK, "%s", err.msg);
    snprintf(p, sizeof p, "%s/part-02.bin", out);
    CHECK(exists(p));
    snprintf(p, sizeof p, "%s/weights.bin", out); /* the earlier output's files are gone */
    CHECK(!exists(p));
    /* A name outside the patterns (part-1.bin: one digit) is the user's: refused, kept. */
    snprintf(p, sizeof p, "%s/part-1.bin", out);
    test_sh("echo mine > '%s'", p);
    CHECK(write_out(out, true, false, first, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "holds 'part-1.bin', which hyperpar did not write");
    CHECK_STR_CONTAINS(err.msg, "nothing but files 'hyperpar demo' writes");
    CHECK(exists(p));
    /* A folder without the marker is never replaced. */
    test_sh("mkdir -p '%s' && echo x > '%s/weights.bin'", wpath(out, "plain"), out);
    CHECK(write_out(out, true, false, first, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "is not empty and was not written by hyperpar");
}

TEST(a_file_that_appears_in_the_earlier_output_is_never_removed)
{
    char out[512], p[700];
    hp_err err;
    const char *const files[] = {"weights.bin", NULL};
    CHECK(write_out(wpath(out, "raced"), false, false, files, &err) == HP_OK);
    hp_outdir_spec s = spec_for(out, true, false);
    hp_outdir *o = NULL;
    CHECK(hp_outdir_open(&o, &s, &err) == HP_OK);
    CHECK(hp_outdir_begin(o, &err) == HP_OK);
    snprintf(p, sizeof p, "%s/notes.txt", out);
    test_sh("echo mine > '%s'", p); /* after the check, before the install */
    CHECK(hp_outdir_commit(o, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "nothing was replaced");
    CHECK(!strstr(err.msg, ".tmp."));
    CHECK(!exists(hp_outdir_tmp(o)));
    hp_outdir_close(o);
    CHECK(exists(p));
    snprintf(p, sizeof p, "%s/weights.bin", out);
    CHECK(exists(p));
}

TEST_MAIN()
