/*
 * report.h — the JSON reports of `hyperpar cost` and `hyperpar advise` (`--format json`), written once for the
 * CLI and for the JSON-in interface (api.h); the command lines that make a plan fit, or that build an advised
 * mesh. src/cost/report.c.
 */
#ifndef HYPERPAR_REPORT_H
#define HYPERPAR_REPORT_H

#include <stdio.h>

#include "hyperpar/cost.h"
#include "hyperpar/shard.h"

/* JSON pieces: a string (quoted, escaped); a count (an integer below 2^53 written exactly; null when not finite);
 * a real (%.17g; null when not finite); ", "name": v" for each of n reals. */
void hp_json_fstr(FILE *f, const char *s);
void hp_json_count(FILE *o, double v);
void hp_json_real(FILE *o, double v);
void hp_json_reals(FILE *o, const char *const *names, const double *v, size_t n);

/* The command line (`hyperpar CMD` and argv[1..argc-1] as given) with change ch made: its flags replace the ones
 * they change. */
#define HP_FIT_COMMAND_MAX 8192
void hp_fit_command(char *buf, size_t cap, const char *cmd, int argc, char **argv, const hp_fit_change *ch);
/* f as JSON (null without a binding constraint), each change with its command line. */
void hp_fit_json(FILE *o, const hp_fit *f, const char *cmd, int argc, char **argv);
/* The engine the figures describe (hyperpar's runtime, or a GPU's estimate), as the "engine", "hardware" keys. */
void hp_cost_engine_json(FILE *o, const hp_cost_model *m);

/* `hyperpar cost --format json`: every rank's figures, the events of rank index ri, the fit against budget (its
 * changes quoting argv). l: the shard layout of p (the ranks' coordinates). */
void hp_cost_report_json(FILE *o, const hp_model *m, const hp_plan *p, const hp_shard_layout *l, const hp_cost *c,
                         int64_t ri, uint64_t budget, const hp_fit *fit, int argc, char **argv);

/* The hyperpar plan + shard command line that builds candidate c: model_arg as given; ep_compute and overrides
 * as the request gave them (NULL: none). A config.json (meta mode) holds no weights: the shard command then names
 * a placeholder, and HP_ADVISE_CKPT_NOTE says so. */
#define HP_ADVISE_COMMAND_MAX 600
#define HP_ADVISE_CKPT_NOTE "(MODEL is a config.json: shard needs the checkpoint folder with the weights; put it for CHECKPOINT)"
/* The plan flags alone (--dp .. --tp .., --ep-compute with EP). */
void hp_advise_flags(char *buf, size_t cap, const hp_model *m, const hp_advise_cand *c, const char *ep_compute,
                     const char *overrides);
void hp_advise_command(char *buf, size_t cap, const hp_model *m, const hp_advise_cand *c, const char *model_arg,
                       const char *ep_compute, const char *overrides);
/* `hyperpar advise --format json`. fit: the nearest changes when nothing fits (argv quoted in them). */
void hp_advice_json(FILE *o, const hp_model *m, const hp_advice *a, const hp_fit *fit, const char *model_arg,
                    const char *ep_compute, const char *overrides, int argc, char **argv);

#endif
