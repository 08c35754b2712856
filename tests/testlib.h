/*
 * testlib.h — a tiny in-tree test runner (no dependency): CHECK macros count failures and keep going,
 * TEST() registers a function, and main() prints "N passed, N failed" and exits non-zero on failure.
 *
 *   TEST(parses_header) { CHECK(x == 1); CHECK_STR_CONTAINS(err.msg, "truncated"); }
 *   TEST_MAIN()
 */
#ifndef HP_TESTLIB_H
#define HP_TESTLIB_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- scratch folders and shell steps ---- */

static char hp__test_work[64];

static inline void test_rm_rf(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static inline void hp__test_remove_work(void)
{
    if (hp__test_work[0]) test_rm_rf(hp__test_work);
}

/* One scratch folder /tmp/hp_<tag>_XXXXXX for the whole run, made on first use and removed when the program
 * ends (atexit), whichever tests ran: a cleanup "test" would assert nothing and count as a pass. */
static inline const char *test_work_dir(const char *tag)
{
    if (!hp__test_work[0]) {
        snprintf(hp__test_work, sizeof hp__test_work, "/tmp/hp_%.20s_XXXXXX", tag);
        if (!mkdtemp(hp__test_work)) abort();
        atexit(hp__test_remove_work);
    }
    return hp__test_work;
}

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
