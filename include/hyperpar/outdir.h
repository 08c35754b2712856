/*
 * hyperpar/outdir.h — an output folder that appears whole or not at all: what `hyperpar shard --out`,
 * `hyperpar merge --out` and `hyperpar train --out` write (docs/design.md, "Output folders").
 *
 *   open    --out is checked before any work: a usable new folder's name, none of the inputs (nor inside or
 *           around one), and absent, an empty folder, or (force) an earlier hyperpar output: a folder holding
 *           the HP_OUTDIR_MARKER file and nothing but regular files the command writes (spec.names).
 *   begin   "<OUT>.tmp.<pid>" is made beside OUT and marked; the command writes its files into it.
 *   commit  renamed into place without ever replacing a folder that appeared or changed meanwhile
 *           (renameat2 NOREPLACE; with force, EXCHANGE with the re-checked earlier output, whose files go).
 *   abort   the temporary folder (and the parents made for it) go; close aborts what was not committed.
 *
 * A command never removes anything it did not create: stale temporaries of dead processes only when they hold
 * the marker, an earlier output only file by file, by the names it writes.
 */
#ifndef HYPERPAR_OUTDIR_H
#define HYPERPAR_OUTDIR_H

#include "hyperpar/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The file hyperpar writes into every output folder, to recognise it later:
 * {"written_by": "hyperpar", "command": "<cmd>", "marker_version": 1}. */
#define HP_OUTDIR_MARKER ".hyperpar-output"

typedef struct hp_outdir_spec {
    const char *cmd;           /* "shard", "merge", "train": in messages and in the marker */
    const char *out;           /* the folder as the user gave it (--out) */
    const char *const *names;  /* fnmatch(3) patterns of the file names cmd writes, NULL-ended (marker implied) */
    const char *example;       /* a folder name for "e.g. --out NAME" in messages; NULL: "out" */
    bool force;                /* replace an earlier hyperpar output */
    bool make_parents;         /* create missing parent folders (removed again on abort); else they must exist */
    const char *const *inputs; /* files and folders the output must not be, contain or lie in (missing ones and
                                  NULL entries are skipped) */
    size_t n_inputs;
} hp_outdir_spec;

/* Borrows spec's strings until close. */
typedef struct hp_outdir hp_outdir;

/* The checks of "open" above, touching nothing. HP_ERR_INPUT naming the conflict ("<cmd>: --out ..."). */
hp_status hp_outdir_open(hp_outdir **out, const hp_outdir_spec *spec, hp_err *err);
/* Removes stale temporaries of dead processes, creates missing parents (make_parents) and the marked temporary
 * folder. On failure nothing is left. */
hp_status hp_outdir_begin(hp_outdir *o, hp_err *err);
/* The temporary folder to write into ("<canonical OUT>.tmp.<pid>"), known from open on: a signal handler may
 * remove its files and then it (they are the only names in it). */
const char *hp_outdir_tmp(const hp_outdir *o);
/* OUT as an absolute path (its existing part resolved). */
const char *hp_outdir_path(const hp_outdir *o);
/* Installs the temporary folder as OUT. On failure (HP_ERR_INPUT when OUT appeared or changed meanwhile,
 * HP_ERR_IO otherwise; the message names OUT, not the temporary) the temporary folder is removed. */
hp_status hp_outdir_commit(hp_outdir *o, hp_err *err);
/* Rewrites err's message where it names the temporary folder to name OUT (a writer's message about a file in it,
 * from this process or another rank). NULL o is fine. */
void hp_outdir_fix_msg(const hp_outdir *o, hp_err *err);
/* Removes the temporary folder and the parents created for it. Idempotent. */
void hp_outdir_abort(hp_outdir *o);
/* Removes every "<name>.tmp.<pid>" / "<name>.old.<pid>" folder directly in dir that holds the marker and whose
 * process no longer runs on this host (each named on stderr): what a killed run left of its outputs in dir (train
 * sweeps its run folder at the start, so a dead run's half-written checkpoint never blocks the next). */
void hp_outdir_remove_stale(const char *dir);
/* Aborts what was not committed and frees o. NULL is fine. */
void hp_outdir_close(hp_outdir *o);

#ifdef __cplusplus
}
#endif
#endif
