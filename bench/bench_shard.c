/*
 * bench_shard.c — checkpoint sharding throughput next to a plain copy of the same bytes, same run.
 *
 *   bench_shard [CHECKPOINT] [--keep]
 *
 * Without CHECKPOINT a llama-shaped f32 checkpoint of about 2.6 GB (hidden 4096, 8 layers, vocab 32000) is
 * generated into a temporary folder. Then, each through the page cache the same way (no fsync):
 *
 *   copy      read()/write() of the source .safetensors file(s) to a new file, 4 MiB at a time
 *   shard     hyperpar's hp_shard_write under tp=2 (1 thread), tp=2 (2 threads), dp=2,tp=4 (4 threads)
 *
 * and prints GB/s written for each and the ratio shard / copy (target >= 0.7). Every measurement starts after
 * sync(); the copy's best of three is the reference. Everything is removed at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hyperpar/gen.h"
#include "hyperpar/shard.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Copies every source file into one file under dir; returns bytes copied (0 on failure). */
static uint64_t plain_copy(const hp_model *m, const char *dir, double *secs)
{
    static const size_t chunk = 4u << 20; /* the writer's piece size */
    char *buf = malloc(chunk), dst[4200];
    uint64_t total = 0;
    snprintf(dst, sizeof dst, "%s/copy.bin", dir);
    double t0 = now_s();
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (size_t f = 0; buf && out >= 0 && f < hp_ckpt_file_count(m->ckpt); f++) {
        int in = open(hp_st_path(hp_ckpt_file(m->ckpt, f)), O_RDONLY);
        ssize_t n;
        while (in >= 0 && (n = read(in, buf, chunk)) > 0) {
            if (write(out, buf, (size_t)n) != n) {
                total = 0;
                break;
            }
            total += (uint64_t)n;
        }
        if (in >= 0) close(in);
    }
    if (out >= 0) close(out);
    *secs = now_s() - t0;
    unlink(dst);
    free(buf);
    return total;
}

static int shard_once(const hp_model *m, const char *label, const char *mesh, int64_t ep, int threads, const char *dir,
                      double copy_gbs, double *best)
{
    hp_plan_opts po;
    hp_plan_opts_default(&po);
    hp_err err;
    hp_plan *p = NULL;
    if (hp_mesh_parse(mesh, &po.mesh, &err) != HP_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    po.mesh.ep = ep;
    if (hp_plan_derive(&p, m, &po, &err) != HP_OK) return fprintf(stderr, "plan: %s\n", err.msg), 1;
    char out[4200];
    snprintf(out, sizeof out, "%s/shards", dir);
    hp_shard_opts so = {.threads = threads};
    hp_shard_stats st;
    int rc = 0;
    if (hp_shard_write(m, p, out, &so, &st, &err) != HP_OK) {
        fprintf(stderr, "shard: %s\n", err.msg);
        rc = 1;
    } else {
        double gbs = (double)st.bytes_written / st.seconds / 1e9;
        if (gbs > *best) *best = gbs;
        printf("%-28s %8.2f GB written  %7.2f s  %6.2f GB/s  ratio %.2f (%llu files, %llu links)\n", label,
               (double)st.bytes_written / 1e9, st.seconds, gbs, gbs / copy_gbs, (unsigned long long)st.files,
               (unsigned long long)st.links);
    }
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
    if (system(cmd) != 0) rc = 1;
    sync();
    hp_plan_free(p);
    return rc;
}

int main(int argc, char **argv)
{
    char dir[] = "/tmp/hp_bench_shard_XXXXXX";
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
    const char *src = argc > 1 ? argv[1] : NULL;
    char gen_dir[4200];
    hp_err err;
    if (!src) {
        hp_gen_opts o;
        hp_gen_opts_default(&o);
        o.family = "llama";
        o.hidden = 4096;
        o.layers = 8;
        o.vocab = 32000;
        o.heads = 32;
        o.kv_heads = 8;
        o.head_dim = 128;
        o.intermediate = 512; /* small MLPs keep the file near 2.6 GB; the shapes that matter are all here */
        snprintf(gen_dir, sizeof gen_dir, "%s/model", dir);
        double t0 = now_s();
        if (hp_gen_checkpoint(&o, gen_dir, &err) != HP_OK) return fprintf(stderr, "gen: %s\n", err.msg), 1;
        printf("generated %s in %.1f s\n", gen_dir, now_s() - t0);
        src = gen_dir;
    }
    hp_model *m = NULL;
    if (hp_model_open(&m, src, NULL, &err) != HP_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    printf("checkpoint %s: %.2f GB in %zu tensors\n", src, (double)hp_model_total_bytes(m) / 1e9, m->n_params);

    /* Each measurement starts from a quiet page cache (sync() flushes the previous step's dirty pages, which
     * would otherwise be written back during the next one); best of three for both sides. */
    int rc = 0;
    double copy_best = 0;
    uint64_t n = 0;
    for (int rep = 0; rep < 3; rep++) {
        double s = 0;
        sync();
        n = plain_copy(m, dir, &s);
        double gbs = (double)n / s / 1e9;
        printf("%-28s %8.2f GB written  %7.2f s  %6.2f GB/s\n", "plain copy", (double)n / 1e9, s, gbs);
        if (gbs > copy_best) copy_best = gbs;
    }
    printf("reference: plain copy, best of 3: %.2f GB/s\n", copy_best);
    static const struct {
        const char *label, *mesh;
        int threads;
    } runs[] = {{"shard tp=2, 1 thread", "tp=2", 1},
                {"shard tp=2, 2 threads", "tp=2", 2},
                {"shard dp=2,tp=4, 4 threads", "dp=2,tp=4", 4}};
    double best[3] = {0, 0, 0};
    for (int rep = 0; rep < 3; rep++)
        for (int r = 0; r < 3; r++)
            rc |= shard_once(m, runs[r].label, runs[r].mesh, 1, runs[r].threads, dir, copy_best, &best[r]);
    printf("\nsummary (best of 3)          GB/s    vs plain copy %.2f GB/s\n", copy_best);
    for (int r = 0; r < 3; r++)
        printf("%-28s %6.2f   ratio %.2f%s\n", runs[r].label, best[r], best[r] / copy_best,
               best[r] / copy_best >= 0.7 ? "" : "  (below the 0.7 target)");
    hp_model_close(m);
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) rc = 1;
    return rc || !n;
}
