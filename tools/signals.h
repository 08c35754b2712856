/*
 * signals.h — SIGINT / SIGTERM / SIGHUP while a command writes: nothing half-written stays behind, and the
 * exit status is the signal's (130 for ^C in a shell).
 */
#ifndef HP_TOOLS_SIGNALS_H
#define HP_TOOLS_SIGNALS_H

/* Catches the three signals: the handler records the signal with hp_interrupt, so the library (shard,
 * merge, the safetensors writer, gen) stops at its next piece, removes its temporaries and fails with
 * "interrupted". A signal ignored at start (nohup, `cmd &`) stays ignored. Clears any earlier record. */
void cli_signals_catch(void);
/* For work that cannot stop at a piece (a forward pass inside MPI collectives): paths (at most 8, each under
 * 4096 bytes; files first, then their folder) the handler itself removes before it re-raises the signal at
 * once. n = 0 forgets them. The names are copied. */
void cli_signals_remove_on_signal(const char *const *paths, int n);
/* Restores the previous actions; re-raises a recorded signal with its default action (after the caller
 * printed its error, if any), else returns rc. */
int cli_signals_release(int rc);

#endif
