/*
 * signals.c — the CLI's handling of SIGINT / SIGTERM / SIGHUP (signals.h).
 *
 * Two ways to stop: the usual one records the signal (hp_interrupt) and lets the library finish its current
 * piece, remove its temporaries and return "interrupted", after which cli_signals_release re-raises it; with
 * paths registered (bench run's temporary checkpoint), the handler removes them itself with async-signal-safe
 * calls (unlink, rmdir) and re-raises at once.
 */
#include "signals.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hyperpar/core.h"

static const int g_sigs[] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction g_old[3];

#define MAX_PATHS 8
static char g_paths[MAX_PATHS][4096];
static volatile sig_atomic_t g_n_paths;

static void on_signal(int sig)
{
    hp_interrupt(sig);
    int n = (int)g_n_paths;
    if (n == 0) return;
    for (int i = 0; i < n; i++)
        if (unlink(g_paths[i]) != 0) rmdir(g_paths[i]);
    signal(sig, SIG_DFL);
    raise(sig); /* blocked while the handler runs: delivered, with the default action, when it returns */
}

void cli_signals_catch(void)
{
    hp_interrupt(0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++) sigaddset(&sa.sa_mask, g_sigs[i]); /* one cleanup at a time */
    for (int i = 0; i < 3; i++) {
        sigaction(g_sigs[i], NULL, &g_old[i]);
        if (g_old[i].sa_handler != SIG_IGN) sigaction(g_sigs[i], &sa, NULL);
    }
}

void cli_signals_remove_on_signal(const char *const *paths, int n)
{
    g_n_paths = 0;
    if (n > MAX_PATHS) n = MAX_PATHS;
    for (int i = 0; i < n; i++) snprintf(g_paths[i], sizeof g_paths[i], "%s", paths[i]);
    g_n_paths = n;
}

int cli_signals_release(int rc)
{
    g_n_paths = 0;
    for (int i = 0; i < 3; i++) sigaction(g_sigs[i], &g_old[i], NULL);
    int sig = hp_interrupted();
    if (sig) {
        fflush(stderr);
        signal(sig, SIG_DFL);
        raise(sig);
    }
    return rc;
}
