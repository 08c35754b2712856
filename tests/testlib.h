/*
 * testlib.h — a tiny in-tree test runner (no dependency): CHECK macros count failures and keep going,
 * TEST() registers a function, and main() prints "N passed, N failed" and exits non-zero on failure.
 *
 *   TEST(parses_header) { CHECK(x == 1); CHECK_STR_CONTAINS(err.msg, "truncated"); }
 *   TEST_MAIN()
 *
 * The helpers every test shares, instead of its own copy:
 *   scratch folders  test_work_dir(tag): the run's one folder; test_tmpdir(buf, cap): a new one inside it; both
 *                    removed at exit; test_rm_rf(path): removed now (no shell)
 *   comparisons      test_compare(a, b, n) -> test_diff {max_diff, max_ref, at, a_at, b_at};
 *                    test_max_abs_diff, test_max_rel_diff, test_max_abs; CHECK_CLOSE(a, b, n, atol, rtol) and
 *                    CHECK_CLOSE_MSG: max|a - b| <= atol + rtol * max|b|, naming the worst element when not
 *                    (float or double arrays, any pairing; a NaN never passes)
 *   parser sweeps    test_prefix_sweep(b, len, try): every truncation refused; test_byte_sweep(b, len, end, stride,
 *                    try): every value of every byte in [0, end), each opened consistently or refused
 */
#ifndef HP_TESTLIB_H
#define HP_TESTLIB_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* 1 in a build with the sanitizers (HP_SANITIZE: tests/CMakeLists.txt defines HP_SANITIZED), where the slowest
 * tests take a strided subset of their cases that still meets every edge; 0 otherwise. */
#ifdef HP_SANITIZED
#define TEST_SANITIZED 1
#else
#define TEST_SANITIZED 0
#endif

typedef void (*hp_test_fn)(void);
static __attribute__((unused)) struct {
    const char *name;
    hp_test_fn fn;
} hp__tests[512];
static __attribute__((unused)) int hp__n_tests;
static int hp__failed_checks;

#define TEST(tname)                                                                                 \
    static void test_##tname(void);                                                                 \
    __attribute__((constructor)) static void register_##tname(void)                                 \
    {                                                                                              \
        hp__tests[hp__n_tests].name = #tname;                                                       \
        hp__tests[hp__n_tests++].fn = test_##tname;                                                 \
    }                                                                                              \
    static void test_##tname(void)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);             \
            hp__failed_checks++;                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  %s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            hp__failed_checks++;                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long hp__a = (long long)(a), hp__b = (long long)(b);                                  \
        if (hp__a != hp__b) {                                                                      \
            fprintf(stderr, "  %s:%d: CHECK failed: %s == %s (%lld vs %lld)\n", __FILE__, __LINE__, \
                    #a, #b, hp__a, hp__b);                                                         \
            hp__failed_checks++;                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                                         \
    do {                                                                                           \
        const char *hp__a = (a), *hp__b = (b);                                                     \
        if (!hp__a || !hp__b || strcmp(hp__a, hp__b) != 0) {                                       \
            fprintf(stderr, "  %s:%d: CHECK failed: \"%s\" == \"%s\"\n", __FILE__, __LINE__,       \
                    hp__a ? hp__a : "(null)", hp__b ? hp__b : "(null)");                           \
            hp__failed_checks++;                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                            \
    do {                                                                                           \
        const char *hp__h = (hay), *hp__n = (needle);                                              \
        if (!hp__h || !strstr(hp__h, hp__n)) {                                                     \
            fprintf(stderr, "  %s:%d: CHECK failed: \"%s\" does not contain \"%s\"\n", __FILE__,   \
                    __LINE__, hp__h ? hp__h : "(null)", hp__n);                                    \
            hp__failed_checks++;                                                                   \
        }                                                                                          \
    } while (0)

#define TEST_MAIN()                                                                                \
    int main(int argc, char **argv)                                                                \
    {                                                                                              \
        int passed = 0, failed = 0;                                                                \
        for (int i = 0; i < hp__n_tests; i++) {                                                    \
            if (argc > 1 && strcmp(argv[1], hp__tests[i].name) != 0) continue;                     \
            int before = hp__failed_checks;                                                        \
            hp__tests[i].fn();                                                                     \
            if (hp__failed_checks == before) {                                                     \
                passed++;                                                                          \
            } else {                                                                               \
                failed++;                                                                          \
                fprintf(stderr, "FAIL %s\n", hp__tests[i].name);                                   \
            }                                                                                      \
        }                                                                                          \
        printf("%d passed, %d failed\n", passed, failed);                                          \
        return (failed || passed == 0) ? 1 : 0;                                                    \
    }

/* ---- scratch folders ---- */

/* Removes path and everything under it, without a shell (a folder is made writable first, so a test's read-only
 * folder goes too). True when nothing is left of it (a path that does not exist counts). */
static inline bool hp__test_rm_at(int dirfd, const char *name)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT;
    if (!S_ISDIR(st.st_mode)) return unlinkat(dirfd, name, 0) == 0 || errno == ENOENT;
    (void)fchmodat(dirfd, name, 0700, 0);
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return false;
    }
    bool ok = true;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) ok &= hp__test_rm_at(fd, e->d_name);
    closedir(d);
    return unlinkat(dirfd, name, AT_REMOVEDIR) == 0 && ok;
}

static inline bool test_rm_rf(const char *path)
{
    bool ok = hp__test_rm_at(AT_FDCWD, path);
    if (!ok) fprintf(stderr, "could not remove %s\n", path);
    return ok;
}

static char hp__test_work[128];
static pid_t hp__test_work_owner;

static inline void hp__test_remove_work(void)
{
    /* Only the process that made it: a forked child that calls exit() runs the parent's atexit handlers too. */
    if (hp__test_work[0] && getpid() == hp__test_work_owner) test_rm_rf(hp__test_work);
}

/* The run's one scratch folder, $TMPDIR/hp_<tag>_XXXXXX (/tmp without TMPDIR, or with one over 80 bytes), made on
 * first use and removed with all it holds when the program ends (atexit), whichever tests ran: a cleanup "test"
 * would assert nothing and count as a pass. The first call's tag names it; test_tmpdir makes it with the tag
 * "test". The MPI tests' ctest entries give each test a TMPDIR of its own. */
static inline const char *test_work_dir(const char *tag)
{
    if (!hp__test_work[0]) {
        const char *tmp = getenv("TMPDIR");
        if (!tmp || !*tmp || strlen(tmp) > 80) tmp = "/tmp"; /* the path stays short enough for any test's buffers */
        snprintf(hp__test_work, sizeof hp__test_work, "%s/hp_%.20s_XXXXXX", tmp, tag);
        if (!mkdtemp(hp__test_work)) abort();
        hp__test_work_owner = getpid();
        atexit(hp__test_remove_work);
    }
    return hp__test_work;
}

/* A new empty folder of its own inside the run's scratch folder (test_work_dir): its path is written into
 * out[cap] and returned. It goes when the program ends; test_rm_rf(out) removes it sooner. NULL (and a failed
 * check) when it cannot be made or its path does not fit. */
static inline char *test_tmpdir(char *out, size_t cap)
{
    static int n;
    int len = snprintf(out, cap, "%s/%d", test_work_dir("test"), ++n);
    bool ok = len > 0 && (size_t)len < cap && mkdir(out, 0700) == 0;
    CHECK_MSG(ok, "cannot make a scratch folder %s", len > 0 && (size_t)len < cap ? out : "(path too long)");
    if (!ok && cap) out[0] = 0;
    return ok ? out : NULL;
}

/* ---- comparing arrays ---- */

/* How far a is from b (the reference) over n elements. */
typedef struct test_diff {
    double max_diff; /* max |a[i] - b[i]|: +inf where either value is NaN (a NaN never passes) */
    double max_ref;  /* max |b[i]| */
    int64_t at;      /* the first element with the largest difference, -1 when n == 0 */
    double a_at, b_at; /* a[at], b[at] */
} test_diff;

static inline double hp__test_elem(const void *p, int f64, int64_t i)
{
    return f64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static inline test_diff hp__test_compare(const void *a, int a64, const void *b, int b64, int64_t n)
{
    test_diff d = {0.0, 0.0, -1, 0.0, 0.0};
    for (int64_t i = 0; i < n; i++) {
        double x = hp__test_elem(a, a64, i), y = hp__test_elem(b, b64, i);
        double e = x == y ? 0.0 : fabs(x - y);
        if (isnan(e)) e = INFINITY;
        if (fabs(y) > d.max_ref) d.max_ref = fabs(y);
        if (d.at < 0 || e > d.max_diff) d.max_diff = e, d.at = i, d.a_at = x, d.b_at = y;
    }
    return d;
}

/* 1 for an array of double, 0 for one of float (anything else does not compile). */
#define HP__TEST_F64(p) _Generic((p), double *: 1, const double *: 1, float *: 0, const float *: 0)

/* Compares a with the reference b, n elements each; a and b are float or double arrays, in any pairing. */
#define test_compare(a, b, n) hp__test_compare((a), HP__TEST_F64(a), (b), HP__TEST_F64(b), (int64_t)(n))
/* max |a[i] - b[i]| (+inf with a NaN). */
#define test_max_abs_diff(a, b, n) (test_compare((a), (b), (n)).max_diff)
/* max |a[i] - b[i]| / max |b[i]|: the difference relative to the reference's largest magnitude (0 when both are
 * all zero, +inf when only b is). */
#define test_max_rel_diff(a, b, n) hp__test_rel(test_compare((a), (b), (n)))
/* max |a[i]| of a float or double array. */
#define test_max_abs(a, n) (test_compare((a), (a), (n)).max_ref)

static inline double hp__test_rel(test_diff d)
{
    return d.max_diff == 0.0 ? 0.0 : d.max_ref > 0.0 ? d.max_diff / d.max_ref : INFINITY;
}

/* Whether d is within atol + rtol * max|b|; when not, reports the worst element (index and both values) and the
 * context fmt formats (may format to nothing). */
static inline bool hp__test_close(const char *file, int line, const char *what, test_diff d, double atol, double rtol,
                                  const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static inline bool hp__test_close(const char *file, int line, const char *what, test_diff d, double atol, double rtol,
                                  const char *fmt, ...)
{
    double bound = atol + rtol * d.max_ref;
    if (d.max_diff <= bound) return true;
    char ctx[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    fprintf(stderr,
            "  %s:%d: CHECK failed: %s%s%s: max |a - b| %.6g > %.3g + %.3g * max|b| (%.6g) = %.6g, worst at [%lld]: "
            "a %.9g, b %.9g\n",
            file, line, what, ctx[0] ? ": " : "", ctx, d.max_diff, atol, rtol, d.max_ref, bound, (long long)d.at,
            d.a_at, d.b_at);
    hp__failed_checks++;
    return false;
}

/* The check "a is close to b": max |a[i] - b[i]| <= atol + rtol * max |b[i]| over n elements (a NaN never
 * passes); a failure names the worst element, its index and both values. CHECK_CLOSE_MSG adds a printf-style
 * context (which case, which rank). Both are also expressions: true when the check passed. */
#define CHECK_CLOSE(a, b, n, atol, rtol)                                                                    \
    hp__test_close(__FILE__, __LINE__, #a " ~ " #b, test_compare((a), (b), (n)), (atol), (rtol), "%s", "")
#define CHECK_CLOSE_MSG(a, b, n, atol, rtol, ...)                                                           \
    hp__test_close(__FILE__, __LINE__, #a " ~ " #b, test_compare((a), (b), (n)), (atol), (rtol), __VA_ARGS__)

/* ---- sweeps over a parser's input ---- */

/* One try of a sweep: the parser under test given b[0, len). Returns 1 when it opened the bytes and what it handed
 * out holds together, 0 when it refused them as it must (its input status, no output, a message naming the
 * input), -1 for anything else (it may print why). */
typedef int (*test_try_fn)(const unsigned char *b, size_t len);

/* Tries every proper prefix of b[0, len), each in a fresh allocation of exactly its size so that ASan sees any
 * read past its end; returns how many were not refused as they must be (try returned other than 0). */
static inline int test_prefix_sweep(const unsigned char *b, size_t len, test_try_fn try)
{
    int bad = 0;
    for (size_t n = 0; n < len; n++) {
        unsigned char *c = malloc(n ? n : 1);
        if (n) memcpy(c, b, n);
        bad += try(c, n) != 0;
        free(c);
    }
    return bad;
}

typedef struct test_sweep {
    int opened, refused, wrong; /* how many tries returned 1, 0 and -1 */
} test_sweep;

/* Sets each byte b[pos], pos in [0, end) by stride, to each of its 255 other values in turn (restoring it after)
 * and tries b[0, len) each time. A parser that checks its input shows wrong == 0, and refused > opened > 0. */
static inline test_sweep test_byte_sweep(unsigned char *b, size_t len, size_t end, size_t stride, test_try_fn try)
{
    test_sweep s = {0, 0, 0};
    for (size_t pos = 0; pos < end; pos += stride) {
        unsigned char orig = b[pos];
        for (int v = 0; v < 256; v++) {
            if (v == orig) continue;
            b[pos] = (unsigned char)v;
            int r = try(b, len);
            s.opened += r == 1, s.refused += r == 0, s.wrong += r < 0;
        }
        b[pos] = orig;
    }
    return s;
}

/* ---- shell steps ---- */

/* Runs a shell command built from fmt; the test fails when it does. */
static inline void test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void test_sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    CHECK_MSG(system(cmd) == 0, "command failed: %s", cmd);
}

#endif
