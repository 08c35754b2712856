/*
 * test_shard_safety.c — what shard and merge promise about the file system and about integrity:
 * --out is never an input (nor inside / around one) and a bad --out is a usage error; --force replaces only
 * hyperpar's own output; the install never replaces a folder that appeared or changed meanwhile; a source
 * truncated while read is an error, not SIGBUS; an interrupt and a dead process leave nothing for long;
 * merge refuses rank files of another folder, misnamed ones, edited manifests (overlapping, missing or
 * swapped slices) and, with verify, changed bytes. Every failure leaves no output and no temporary folder.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "hyperpar/gen.h"
#include "hyperpar/shard.h"
#include "shard/shard_int.h"
#include "testlib.h"

static const char *work(void) { return test_work_dir("shard_safe"); }

static char *wpath(char *buf, const char *name)
{
    snprintf(buf, 512, "%s/%s", work(), name);
    return buf;
}

#define sh test_sh

static bool exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

/* No "<dir>.tmp.*" or "<dir>.old.*" sibling. */
static bool no_temporaries(const char *dir)
{
    char parent[512];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    *slash = '\0';
    const char *base = slash + 1;
    DIR *d = opendir(parent);
    struct dirent *e;
    bool clean = true;
    char b2[512];
    snprintf(b2, sizeof b2, "%s", dir + (base - parent));
    while (d && (e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, b2, strlen(b2)) && (strstr(e->d_name + strlen(b2), ".tmp.") ||
                                                   strstr(e->d_name + strlen(b2), ".old.")))
            clean = false;
    if (d) closedir(d);
    return clean;
}

typedef struct fixture {
    hp_model *m;
    hp_plan *p;
} fixture;

static fixture open_planned(const char *dir, int64_t dp, int64_t tp, int64_t ep)
{
    fixture f = {0};
    hp_err err;
    CHECK_MSG(hp_model_open(&f.m, dir, NULL, &err) == HP_OK, "%s", err.msg);
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_mesh_from_sizes(&po.mesh, dp, 1, tp, ep, false);
    if (f.m) CHECK_MSG(hp_plan_derive(&f.p, f.m, &po, &err) == HP_OK, "%s", err.msg);
    return f;
}

static void close_fixture(fixture *f)
{
    hp_plan_free(f->p);
    hp_model_close(f->m);
}

#define MIXTRAL "data/golden/mixtral_per_expert_f32"
#define QWEN3 "data/golden/qwen3_moe_batched_bf16"

static hp_status shard_to(const char *model, const char *out, bool force, hp_err *err)
{
    fixture f = open_planned(model, 2, 2, 1);
    hp_shard_opts so = {.force = force};
    hp_status st = f.p ? hp_shard_write(f.m, f.p, out, &so, NULL, err) : HP_ERR_INPUT;
    close_fixture(&f);
    return st;
}

TEST(xxh64_matches_the_reference)
{
    CHECK(hp_hash64_bytes("", 0, 0) == 0xEF46DB3751D8E999ull);
    CHECK(hp_hash64_bytes("a", 1, 0) == 0xD24EC4F1A98C6E5Bull);
    CHECK(hp_hash64_bytes("abc", 3, 0) == 0x44BC2CF5AD770999ull);
    /* Streaming in odd pieces gives the one-shot digest. */
    char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (char)(i * 7 + 3);
    hp_hash64 s;
    hp_hash64_init(&s, 5);
    for (size_t o = 0, k = 1; o < sizeof buf; o += k, k = k * 3 % 61 + 1)
        hp_hash64_update(&s, buf + o, o + k <= sizeof buf ? k : sizeof buf - o);
    CHECK(hp_hash64_final(&s) == hp_hash64_bytes(buf, sizeof buf, 5));
}

/* ---- #22: names that cannot be an output folder ---- */

static void bad_out(const char *out, const char *needle)
{
    hp_err err;
    CHECK_EQ_INT(shard_to(MIXTRAL, out, false, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, needle);
    hp_merge_opts mo = {0};
    CHECK_EQ_INT(hp_shard_merge("data/golden", out, &mo, NULL, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, needle);
}

TEST(unusable_out_names_are_input_errors)
{
    char file[512], below[600];
    sh("echo x > %s", wpath(file, "plainfile"));
    snprintf(below, sizeof below, "%s/sub/dir", file);
    bad_out("", "--out is empty");
    bad_out(".", "names an existing folder by '.'");
    bad_out("./", "names an existing folder by '.'");
    bad_out("..", "names an existing folder by '..'");
    bad_out("data/..", "names an existing folder by '..'");
    bad_out("/", "is the root folder");
    bad_out(below, "a component of it is a file, not a folder");
    bad_out(file, "exists and is not a folder");
    char ghost[600];
    snprintf(ghost, sizeof ghost, "%s/nothere/../x", work());
    bad_out(ghost, "has '..' after a folder that does not exist");
    CHECK(exists(file));
}

/* ---- #4: never write over, into or around an input ---- */

TEST(out_is_never_an_input_nor_around_one)
{
    char src[512], tok[600], st[600], link[512], out[600];
    sh("cp -r " MIXTRAL " %s && echo t > %s/tokenizer.json", wpath(src, "src"), src);
    snprintf(tok, sizeof tok, "%s/tokenizer.json", src);
    snprintf(st, sizeof st, "%s/model.safetensors", src);
    CHECK(symlink(src, wpath(link, "srclink")) == 0);
    hp_err err;
    /* The folder around the scratch folder, through "..": /tmp/../tmp without TMPDIR. */
    char around[600];
    const char *w = work(), *slash = strrchr(w, '/'), *prev = slash;
    while (prev > w && prev[-1] != '/') prev--;
    snprintf(around, sizeof around, "%.*s/..%.*s", (int)(slash - w), w, (int)(slash - prev + 1), prev - 1);
    struct {
        const char *out, *how;
    } cases[] = {{src, "is the input"},     {work(), "contains the input"}, {around, "contains the input"},
                 {link, "is the input"},    {NULL, "lies inside the input"}, {NULL, "lies inside the input"}};
    char in1[800], in2[800];
    snprintf(in1, sizeof in1, "%s/shards", src);
    snprintf(in2, sizeof in2, "%s/new/deeper", link);
    cases[4].out = in1;
    cases[5].out = in2;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int force = 0; force < 2; force++) {
            CHECK_EQ_INT(shard_to(src, cases[i].out, force, &err), HP_ERR_INPUT);
            CHECK_STR_CONTAINS(err.msg, cases[i].how);
            CHECK_MSG(exists(tok) && exists(st), "case %zu removed the source", i);
            CHECK(!exists(in1));
        }
    /* The source given as a file: its folder contains it. */
    CHECK_EQ_INT(shard_to(st, src, true, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "contains the input");
    /* --plan / --overrides files are inputs too. */
    fixture f = open_planned(src, 1, 2, 1);
    char plandir[512], plan[600];
    sh("mkdir -p %s && echo '{}' > %s/plan.json", wpath(plandir, "plans"), plandir);
    snprintf(plan, sizeof plan, "%s/plan.json", plandir);
    const char *inputs[] = {plan};
    hp_shard_opts so = {.force = true, .inputs = inputs, .n_inputs = 1};
    CHECK_EQ_INT(hp_shard_write(f.m, f.p, plandir, &so, NULL, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "contains the input");
    CHECK(exists(plan));
    /* merge S --out S (--force) and --out inside S. */
    snprintf(out, sizeof out, "%s/shards", work());
    CHECK_MSG(f.p && hp_shard_write(f.m, f.p, out, NULL, NULL, &err) == HP_OK, "%s", err.msg);
    close_fixture(&f);
    hp_merge_opts mo = {.force = true};
    CHECK_EQ_INT(hp_shard_merge(out, out, &mo, NULL, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "is the input");
    snprintf(in1, sizeof in1, "%s/merged", out);
    CHECK_EQ_INT(hp_shard_merge(out, in1, &mo, NULL, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "lies inside the input");
    snprintf(in1, sizeof in1, "%s/manifest.json", out);
    CHECK(exists(in1));
}

/* ---- #4: --force replaces only what hyperpar wrote ---- */

TEST(force_replaces_only_our_own_output)
{
    char out[512], extra[600];
    hp_err err;
    CHECK_MSG(shard_to(MIXTRAL, wpath(out, "ours"), false, &err) == HP_OK, "%s", err.msg);
    snprintf(extra, sizeof extra, "%s/notes.txt", out);
    sh("echo mine > %s", extra);
    CHECK_EQ_INT(shard_to(MIXTRAL, out, true, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "holds 'notes.txt', which hyperpar did not write");
    CHECK(exists(extra));
    unlink(extra);
    sh("mkdir %s/sub", out);
    CHECK_EQ_INT(shard_to(MIXTRAL, out, true, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "holds 'sub'");
    sh("rmdir %s/sub", out);
    CHECK_MSG(shard_to(MIXTRAL, out, true, &err) == HP_OK, "%s", err.msg);
    CHECK(no_temporaries(out));
    /* A merge output is marked too, and --force replaces it. */
    char merged[512];
    hp_merge_opts mo = {0};
    CHECK_MSG(hp_shard_merge(out, wpath(merged, "merged"), &mo, NULL, &err) == HP_OK, "%s", err.msg);
    snprintf(extra, sizeof extra, "%s/" HP_SHARD_MARKER, merged);
    CHECK(exists(extra));
    mo.force = true;
    CHECK_MSG(hp_shard_merge(out, merged, &mo, NULL, &err) == HP_OK, "%s", err.msg);
    CHECK(no_temporaries(merged));
}

/* ---- #5: the install never replaces what appeared or changed while the command ran ---- */

TEST(install_never_replaces_what_appeared)
{
    char out[512], notes[600];
    hp_err err;
    hp__outdir o, o2;
    /* absent at the start, a non-empty folder at the end */
    CHECK(hp__out_prepare(&o, "shard", wpath(out, "race1"), false, NULL, 0, &err) == HP_OK);
    CHECK(hp__out_begin(&o, &err) == HP_OK);
    sh("mkdir %s && echo x > %s/notes.txt", out, out);
    CHECK_EQ_INT(hp__out_commit(&o, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "appeared while hyperpar shard ran");
    CHECK_STR_CONTAINS(err.msg, "nothing was replaced");
    hp__out_abort(&o);
    snprintf(notes, sizeof notes, "%s/notes.txt", out);
    CHECK(exists(notes) && no_temporaries(out));
    /* absent at the start, an empty folder at the end: still not replaced */
    CHECK(hp__out_prepare(&o, "shard", wpath(out, "race2"), false, NULL, 0, &err) == HP_OK);
    CHECK(hp__out_begin(&o, &err) == HP_OK);
    sh("mkdir %s", out);
    CHECK_EQ_INT(hp__out_commit(&o, &err), HP_ERR_INPUT);
    hp__out_abort(&o);
    /* an empty folder at the start that filled up */
    CHECK(hp__out_prepare(&o, "merge", out, false, NULL, 0, &err) == HP_OK);
    CHECK(hp__out_begin(&o, &err) == HP_OK);
    sh("echo x > %s/notes.txt", out);
    CHECK_EQ_INT(hp__out_commit(&o, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "became non-empty while hyperpar merge ran");
    hp__out_abort(&o);
    snprintf(notes, sizeof notes, "%s/notes.txt", out);
    CHECK(exists(notes) && no_temporaries(out));
    /* two runs into one --out: the second to finish fails, the first's output stays */
    CHECK(hp__out_prepare(&o, "shard", wpath(out, "race3"), false, NULL, 0, &err) == HP_OK);
    CHECK(hp__out_prepare(&o2, "shard", out, false, NULL, 0, &err) == HP_OK);
    CHECK(hp__out_begin(&o, &err) == HP_OK);
    CHECK(hp__out_commit(&o, &err) == HP_OK);
    CHECK(hp__out_begin(&o2, &err) == HP_OK);
    CHECK_EQ_INT(hp__out_commit(&o2, &err), HP_ERR_INPUT);
    hp__out_abort(&o2);
    char marker[600];
    snprintf(marker, sizeof marker, "%s/" HP_SHARD_MARKER, out);
    CHECK(exists(marker) && no_temporaries(out));
    /* --force: an earlier output replaced by another folder meanwhile is not replaced */
    CHECK(hp__out_prepare(&o, "shard", out, true, NULL, 0, &err) == HP_OK);
    CHECK(hp__out_begin(&o, &err) == HP_OK);
    sh("mv %s %s.moved && mkdir %s && cp %s.moved/" HP_SHARD_MARKER " %s/", out, out, out, out, out);
    CHECK_EQ_INT(hp__out_commit(&o, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "was replaced");
    hp__out_abort(&o);
    CHECK(exists(marker) && no_temporaries(out));
    /* --force: an earlier output that gained a user's file meanwhile is not replaced */
    CHECK(hp__out_prepare(&o, "shard", out, true, NULL, 0, &err) == HP_OK);
    CHECK(hp__out_begin(&o, &err) == HP_OK);
    sh("echo x > %s/notes.txt", out);
    CHECK_EQ_INT(hp__out_commit(&o, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "holds 'notes.txt'");
    hp__out_abort(&o);
    snprintf(notes, sizeof notes, "%s/notes.txt", out);
    CHECK(exists(notes) && no_temporaries(out));
    /* --force, nothing changed: replaced, and nothing else left behind */
    unlink(notes);
    CHECK(hp__out_prepare(&o, "shard", out, true, NULL, 0, &err) == HP_OK);
    CHECK(hp__out_begin(&o, &err) == HP_OK);
    CHECK_MSG(hp__out_commit(&o, &err) == HP_OK, "%s", err.msg);
    CHECK(exists(marker) && no_temporaries(out));
}

/* ---- #6: a source that changes while read ---- */

TEST(source_changed_while_sharding_is_an_error)
{
    char src[512], st[600], out[512];
    sh("cp -r " MIXTRAL " %s", wpath(src, "shrink"));
    snprintf(st, sizeof st, "%s/model.safetensors", src);
    fixture f = open_planned(src, 1, 2, 1);
    struct stat sb;
    CHECK(stat(st, &sb) == 0);
    /* Truncated after it was mapped: reading faults (SIGBUS before), now an error. */
    CHECK(truncate(st, sb.st_size / 3) == 0);
    hp_err err;
    CHECK_EQ_INT(hp_shard_write(f.m, f.p, wpath(out, "shrunk_out"), NULL, NULL, &err), HP_ERR_IO);
    CHECK_STR_CONTAINS(err.msg, "the source changed while reading");
    CHECK_STR_CONTAINS(err.msg, "model.safetensors");
    CHECK(!exists(out) && no_temporaries(out));
    close_fixture(&f);
    /* Grown after it was mapped: nothing faults, the size check says so. */
    sh("rm -rf %s && cp -r " MIXTRAL " %s", src, src);
    f = open_planned(src, 1, 2, 1);
    sh("echo more >> %s", st);
    CHECK_EQ_INT(hp_shard_write(f.m, f.p, out, NULL, NULL, &err), HP_ERR_IO);
    CHECK_STR_CONTAINS(err.msg, "the source changed while reading (its size went from");
    CHECK(!exists(out) && no_temporaries(out));
    close_fixture(&f);
}

TEST(guarded_copy_survives_a_truncated_mapping)
{
    char p[512];
    int fd = open(wpath(p, "map.bin"), O_RDWR | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && ftruncate(fd, 1 << 16) == 0);
    uint8_t *m = mmap(NULL, 1 << 16, PROT_READ, MAP_SHARED, fd, 0);
    CHECK(m != MAP_FAILED);
    uint8_t buf[4096];
    hp__guard_enter();
    CHECK(hp__guarded_copy(buf, m + 8192, sizeof buf));
    CHECK(ftruncate(fd, 4096) == 0);
    CHECK(!hp__guarded_copy(buf, m + 8192, sizeof buf)); /* SIGBUS, caught */
    CHECK(hp__guarded_copy(buf, m, 1024));              /* and the guard still works afterwards */
    CHECK(!hp__guarded_copy(buf, m + 60000, 100));
    hp__guard_leave();
    munmap(m, 1 << 16);
    close(fd);
}

/* ---- #7: interrupts and stale temporaries ---- */

TEST(interrupt_removes_the_unfinished_output)
{
    char out[512], merged[512];
    hp_err err;
    hp_shard_interrupt(SIGINT);
    CHECK_EQ_INT(shard_to(MIXTRAL, wpath(out, "intr"), false, &err), HP_ERR_IO);
    CHECK_STR_CONTAINS(err.msg, "interrupted by signal 2");
    CHECK(!exists(out) && no_temporaries(out));
    CHECK_EQ_INT(hp_shard_interrupted(), SIGINT);
    hp_shard_interrupt(0);
    CHECK(shard_to(MIXTRAL, out, false, &err) == HP_OK);
    hp_shard_interrupt(SIGTERM);
    hp_merge_opts mo = {0};
    CHECK_EQ_INT(hp_shard_merge(out, wpath(merged, "intr_merged"), &mo, NULL, &err), HP_ERR_IO);
    CHECK_STR_CONTAINS(err.msg, "interrupted by signal 15");
    CHECK(!exists(merged) && no_temporaries(merged));
    hp_shard_interrupt(0);
}

TEST(stale_temporaries_of_dead_processes_are_removed)
{
    pid_t child = fork();
    if (child == 0) _exit(0);
    CHECK(child > 0 && waitpid(child, NULL, 0) == child);
    char out[512], stale[600], foreign[600], alive[600];
    wpath(out, "stale");
    snprintf(stale, sizeof stale, "%s.tmp.%d", out, (int)child);
    snprintf(foreign, sizeof foreign, "%s.old.%d", out, (int)child);
    snprintf(alive, sizeof alive, "%s.tmp.%d", out, (int)getppid());
    sh("mkdir %s %s %s && echo junk > %s/rank-00000.safetensors", stale, foreign, alive, stale);
    sh("echo '{\"written_by\": \"hyperpar\", \"command\": \"shard\"}' > %s/" HP_SHARD_MARKER, stale);
    sh("cp %s/" HP_SHARD_MARKER " %s/", stale, alive);
    hp_err err;
    CHECK_MSG(shard_to(MIXTRAL, out, false, &err) == HP_OK, "%s", err.msg);
    CHECK(!exists(stale));  /* ours, its process gone: removed */
    CHECK(exists(foreign)); /* not marked: not ours to remove */
    CHECK(exists(alive));   /* its process runs */
    sh("rm -rf %s %s", foreign, alive);
}

/* ---- #9, #19: rank files of another folder, misnamed rank files ---- */

static void gen_qwen3(const char *dir, uint64_t seed)
{
    hp_gen_opts o;
    hp_gen_opts_default(&o);
    o.family = "qwen3_moe";
    o.seed = seed;
    hp_err err;
    CHECK_MSG(hp_gen_checkpoint(&o, dir, &err) == HP_OK, "%s", err.msg);
}

static void merge_fails(const char *dir, bool verify, const char *needle)
{
    char out[512];
    hp_err err;
    hp_merge_opts mo = {.verify = verify};
    CHECK_EQ_INT(hp_shard_merge(dir, wpath(out, "merged_bad"), &mo, NULL, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, needle);
    CHECK_MSG(!strstr(err.msg, ".tmp."), "message names a temporary path: %s", err.msg);
    CHECK(!exists(out) && no_temporaries(out));
}

TEST(rank_files_of_another_folder_or_misnamed_are_refused)
{
    char a[512], b[512], sa[512], sb[512], mix[512];
    gen_qwen3(wpath(a, "gen_a"), 1);
    gen_qwen3(wpath(b, "gen_b"), 7);
    hp_err err;
    CHECK_MSG(shard_to(a, wpath(sa, "sh_a"), false, &err) == HP_OK, "%s", err.msg);
    CHECK_MSG(shard_to(b, wpath(sb, "sh_b"), false, &err) == HP_OK, "%s", err.msg);
    /* Same mesh, same tensor names and shapes: only the identity tells them apart. */
    sh("rm -rf %s && cp -r %s %s && cp %s/rank-00001.safetensors %s/", wpath(mix, "mix"), sa, mix, sb, mix);
    merge_fails(mix, false, "rank 1: ");
    merge_fails(mix, false, "belongs to another shard folder: its identity is");
    hp_shard_rank_file *rf = NULL;
    CHECK_EQ_INT(hp_shard_rank_open(&rf, mix, 1, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "belongs to another shard folder");
    CHECK(rf == NULL);
    CHECK_MSG(hp_shard_rank_open(&rf, mix, 0, &err) == HP_OK, "%s", err.msg);
    hp_shard_rank_close(rf);
    /* This folder's rank 0 under rank 1's name: misnamed, not foreign. */
    sh("cp %s/rank-00000.safetensors %s/rank-00001.safetensors", sa, mix);
    merge_fails(mix, false, "rank-00001.safetensors is misnamed: it is this folder's file for rank 0,2");
    CHECK_EQ_INT(hp_shard_rank_open(&rf, mix, 1, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "is misnamed");
    /* A rank file renamed away from its rank-NNNNN name. */
    sh("rm %s/rank-00001.safetensors && cp %s/rank-00001.safetensors %s/rank-1.safetensors", mix, sa, mix);
    merge_fails(mix, false, "rank-00001.safetensors is missing; the folder has 'rank-1.safetensors', which is not a "
                            "name hyperpar writes");
    sh("mv %s/rank-1.safetensors %s/rank-00001.safetensors", mix, mix);
    char ok[512];
    hp_merge_opts mo = {.verify = true};
    CHECK_MSG(hp_shard_merge(mix, wpath(ok, "mix_ok"), &mo, NULL, &err) == HP_OK, "%s", err.msg);
    /* A flipped byte in the data: same size and header, found by --verify's checksum. */
    sh("printf '\\125' | dd of=%s/rank-00001.safetensors bs=1 seek=$(( $(stat -c %%s %s/rank-00001.safetensors) - 3 "
       ")) conv=notrunc status=none",
       mix, mix);
    merge_fails(mix, true, "rank 1: ");
    merge_fails(mix, true, "its content checksum is xxh64:");
}

/* ---- #10: edited manifests ---- */

typedef void (*edit_fn)(json_t *ranks);

static void edit_manifest(const char *src, const char *dst, edit_fn fn)
{
    sh("rm -rf %s && cp -r %s %s", dst, src, dst);
    char p[600];
    snprintf(p, sizeof p, "%s/manifest.json", dst);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    CHECK(root != NULL);
    if (!root) return;
    fn(json_object_get(root, "ranks"));
    CHECK(json_dump_file(root, p, JSON_PRESERVE_ORDER | JSON_INDENT(1)) == 0);
    json_decref(root);
}

/* The first tensor of rank r with a slice on dim 0, and that slice. */
static json_t *first_slice(json_t *ranks, size_t r, json_t **tensor)
{
    json_t *ts = json_object_get(json_array_get(ranks, r), "tensors");
    for (size_t i = 0; i < json_array_size(ts); i++) {
        json_t *sl = json_object_get(json_array_get(ts, i), "slices");
        if (json_array_size(sl) && json_integer_value(json_object_get(json_array_get(sl, 0), "dim")) == 0) {
            if (tensor) *tensor = json_array_get(ts, i);
            return json_array_get(sl, 0);
        }
    }
    return NULL;
}

static void overlap_edit(json_t *ranks) /* rank 1's block [64, 128) moved to [32, 96): it overlaps rank 0's [0, 64) */
{
    json_t *s = first_slice(ranks, 1, NULL);
    CHECK(s && json_object_set_new(s, "offset", json_integer(json_integer_value(json_object_get(s, "offset")) / 2)) == 0);
}

static void hole_edit(json_t *ranks) /* ranks 1 and 3 now claim rank 0's block: the second half is nobody's */
{
    for (size_t r = 1; r < 4; r += 2) {
        json_t *s = first_slice(ranks, r, NULL);
        CHECK(s && json_object_set_new(s, "offset", json_integer(0)) == 0);
    }
}

static void replica_edit(json_t *ranks) /* rank 1 alone claims rank 0's block: tiles (rank 3), but lies */
{
    json_t *s = first_slice(ranks, 1, NULL);
    CHECK(s && json_object_set_new(s, "offset", json_integer(0)) == 0);
}

static void swap_experts_edit(json_t *ranks) /* ranks 0 and 1 swap their expert ranges of one stack */
{
    json_t *t0 = NULL, *t1 = NULL;
    json_t *ts0 = json_object_get(json_array_get(ranks, 0), "tensors");
    json_t *ts1 = json_object_get(json_array_get(ranks, 1), "tensors");
    for (size_t i = 0; i < json_array_size(ts0) && !t0; i++)
        if (json_object_get(json_array_get(ts0, i), "experts")) {
            t0 = json_array_get(ts0, i);
            t1 = json_array_get(ts1, i);
        }
    CHECK(t0 && t1);
    if (!t0 || !t1) return;
    json_t *s0 = json_deep_copy(json_object_get(t0, "slices")), *e0 = json_deep_copy(json_object_get(t0, "experts"));
    json_object_set(t0, "slices", json_object_get(t1, "slices"));
    json_object_set(t0, "experts", json_object_get(t1, "experts"));
    json_object_set_new(t1, "slices", s0);
    json_object_set_new(t1, "experts", e0);
}

TEST(edited_manifest_slices_are_refused)
{
    char sa[512], bad[512];
    hp_err err;
    CHECK_MSG(shard_to(MIXTRAL, wpath(sa, "tiles"), false, &err) == HP_OK, "%s", err.msg);
    edit_manifest(sa, wpath(bad, "tiles_bad"), overlap_edit);
    merge_fails(bad, false, "manifest.json: tensor 'model.embed_tokens.weight': ranks 0 and 1 both hold dim 0 [32, 64), dim 1 [0, 64)");
    merge_fails(bad, false, "must not overlap");
    edit_manifest(sa, bad, hole_edit);
    merge_fails(bad, false, "manifest.json: tensor 'model.embed_tokens.weight': no rank holds [64, 128) of dim 0");
    edit_manifest(sa, bad, replica_edit);
    merge_fails(bad, false, "rank 1: manifest.json's entry for rank 1");
    /* Swapped expert ranges tile the tensor: the layout digest in the rank files says the manifest lies. */
    fixture f = open_planned(QWEN3, 1, 2, 2);
    char se[512];
    hp_shard_opts so = {0};
    CHECK_MSG(f.p && hp_shard_write(f.m, f.p, wpath(se, "ep_tiles"), &so, NULL, &err) == HP_OK, "%s", err.msg);
    close_fixture(&f);
    edit_manifest(se, bad, swap_experts_edit);
    merge_fails(bad, false, "rank 0: manifest.json's entry for rank 0 (its tensors, slices or expert ranges) is not "
                            "what");
    hp_shard_rank_file *rf = NULL;
    CHECK_EQ_INT(hp_shard_rank_open(&rf, bad, 1, &err), HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "the manifest was edited");
}

/* ---- #19: messages name what the user gave ---- */

TEST(messages_never_name_the_temporary_folder)
{
    hp__outdir o;
    hp_err err;
    char out[512];
    CHECK(hp__out_prepare(&o, "merge", wpath(out, "msg"), false, NULL, 0, &err) == HP_OK);
    CHECK(hp__out_begin(&o, &err) == HP_OK);
    hp_err_set(&err, HP_ERR_IO, "%s/model.safetensors.tmp.%d: cannot write: No space left on device", o.tmp,
               (int)getpid());
    hp__out_fix_msg(&o, &err);
    char want[700];
    snprintf(want, sizeof want, "%s/model.safetensors: cannot write", out);
    CHECK_STR_CONTAINS(err.msg, want);
    CHECK(!strstr(err.msg, ".tmp."));
    hp__out_abort(&o);
    CHECK(no_temporaries(out) && !exists(out));
}

TEST_MAIN()
