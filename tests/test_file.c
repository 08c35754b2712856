/* test_file.c — hp_open_regular and hp_path_describe: inputs that are not regular files are refused at once
 * (a FIFO never blocks), with a sentence naming what the path is; hp_file_write_atomic writes whole or not at
 * all, also when the disk fills (the full-disk test hook, hp_test_hooks.full_disk, installed by that test). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "hyperpar/core.h"
#include "testlib.h"

static char g_dir[200];

static const char *path_in(const char *name)
{
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void make_dir(void)
{
    if (!g_dir[0] && !test_tmpdir(g_dir, sizeof g_dir)) abort();
}

TEST(regular_file_opens_and_blocks_again)
{
    make_dir();
    const char *p = path_in("reg");
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    fputs("abc", f);
    fclose(f);
    int fd = -1;
    hp_err err;
    CHECK(hp_open_regular(p, &fd, &err) == HP_OK);
    CHECK(fd >= 0);
    CHECK((fcntl(fd, F_GETFL) & O_NONBLOCK) == 0);
    char buf[4] = {0};
    CHECK(read(fd, buf, 3) == 3 && !strcmp(buf, "abc"));
    close(fd);
}

TEST(fifo_is_refused_without_blocking)
{
    make_dir();
    const char *p = path_in("fifo");
    CHECK(mkfifo(p, 0600) == 0);
    int fd = 7;
    hp_err err;
    CHECK(hp_open_regular(p, &fd, &err) == HP_ERR_INPUT); /* a blocking open would hang here */
    CHECK(fd == -1);
    CHECK_STR_CONTAINS(err.msg, "FIFO");
    char why[128];
    CHECK_STR_CONTAINS(hp_path_describe(p, why, sizeof why), "FIFO");
}

TEST(folder_missing_loop_and_device_say_what_they_are)
{
    make_dir();
    int fd;
    hp_err err;
    char why[128];
    CHECK(hp_open_regular(g_dir, &fd, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "is a folder");
    CHECK(hp_open_regular(path_in("nothing"), &fd, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "does not exist");
    CHECK(symlink(path_in("loop_b"), path_in("loop_a")) == 0);
    CHECK(symlink(path_in("loop_a"), path_in("loop_b")) == 0);
    CHECK(hp_open_regular(path_in("loop_a"), &fd, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "symbolic-link loop");
    CHECK_STR_CONTAINS(hp_path_describe(path_in("loop_a"), why, sizeof why), "symbolic-link loop");
    CHECK(hp_open_regular("/dev/null", &fd, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "character device");
    CHECK(hp_open_regular("", &fd, &err) == HP_ERR_INPUT);
    CHECK_STR_CONTAINS(err.msg, "empty path");
    CHECK_STR_CONTAINS(hp_path_describe(g_dir, why, sizeof why), "folder");
}

TEST(socket_is_refused)
{
    make_dir();
    const char *p = path_in("sock");
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", p);
    CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    int fd;
    hp_err err;
    CHECK(hp_open_regular(p, &fd, &err) == HP_ERR_INPUT);
    CHECK(strstr(err.msg, "socket") != NULL);
    close(s);
}

static bool file_is(const char *p, const char *text)
{
    char buf[64] = "";
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = '\0';
    return f && !strcmp(buf, text);
}

TEST(atomic_write_is_whole_or_nothing_and_names_the_file)
{
    make_dir();
    /* The process may write 10 bytes through the writers (the full-disk test hook): 6 + 3 pass, 5 more fail. */
    hp_test_hooks small_disk = {.full_disk = true, .enospc_after = 10};
    hp_test_hooks_install(&small_disk);
    const char *p = path_in("atomic");
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", p, (long)getpid());
    hp_err err;
    CHECK(hp_file_write_atomic(p, "hello\n", 6, "the test file", &err) == HP_OK);
    CHECK(file_is(p, "hello\n"));
    CHECK(hp_file_write_atomic(p, "abc", 3, "the test file", &err) == HP_OK);
    CHECK(file_is(p, "abc"));
    CHECK(hp_file_write_atomic(p, "12345", 5, "the test file", &err) == HP_ERR_IO);
    CHECK_MSG(strstr(err.msg, "atomic: writing the test file failed: No space left on device; nothing was written"),
              "%s", err.msg);
    CHECK(strstr(err.msg, ".tmp.") == NULL);
    CHECK(file_is(p, "abc"));   /* the earlier file stays whole */
    CHECK(access(tmp, F_OK) != 0); /* and no temporary */
    CHECK(hp_file_write_atomic(path_in("no/such"), "x", 1, "the test file", &err) == HP_ERR_INPUT);
    CHECK(strstr(err.msg, "cannot create a file in its folder") != NULL);
    CHECK(hp_file_sync_dir(g_dir, &err) == HP_OK);
    CHECK(hp_file_sync_dir(path_in("no"), &err) == HP_ERR_IO);
    hp_test_hooks_install(NULL); /* the disk has room again */
    CHECK(hp_file_write_atomic(p, "12345", 5, "the test file", &err) == HP_OK);
    CHECK(file_is(p, "12345"));
}

TEST_MAIN()
