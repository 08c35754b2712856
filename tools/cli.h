/*
 * cli.h — shared pieces of the hyperpar command-line tool: subcommand table, error reporting, exit codes.
 *
 * Exit codes: 0 success, 1 runtime failure, 2 bad input or usage, 3 a numeric verification failed.
 */
#ifndef HP_TOOLS_CLI_H
#define HP_TOOLS_CLI_H

#include <stdarg.h>
#include <stddef.h>
#include <getopt.h>
#include <stdio.h>

#include "hyperpar/report.h"

#include "hyperpar/core.h"

#define HP_EXIT_OK 0
#define HP_EXIT_RUNTIME 1
#define HP_EXIT_USAGE 2
#define HP_EXIT_VERIFY 3

/* Every message is printed escaped (control characters, invalid UTF-8, ... as \xNN; line breaks kept): what it
 * quotes from a file can never drive the terminal. */
/* Prints "hyperpar: error: <msg>" and returns the exit code for err->status. */
int cli_fail(const hp_err *err);
/* The same for an error every rank meets alike before MPI starts (the command line): printed on rank 0 only. */
int cli_fail_once(const hp_err *err);
/* Prints "hyperpar: error: <cmd>: <msg>" plus a hint to run --help (on rank 0 only under mpirun); returns 2. */
/* With buf (cap bytes, "" on entry), the first usage error (cli_usage_error, cli_fail_once) is written to buf on
 * every rank instead of printed, for a command that reports it after its ranks agreed on their options (a
 * usage error of one rank alone would otherwise end the job unsaid: only rank 0 prints). NULL: printed again. */
void cli_usage_defer(char *buf, size_t cap);
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "hyperpar: error: <msg>", for errors that are not an hp_err. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* head, then fmt's text escaped (hp_buf_escape with esc: HP_ESC_KEEP_LINES for a message of several lines, 0 for
 * one line whose quoted names must not break it), then a newline, on stderr: every message's one printer. */
void cli_vsay(const char *head, unsigned esc, const char *fmt, va_list ap);
/* "hyperpar: warning: <msg>", on rank 0 only under mpirun (warnings are the same on every rank). */
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "hyperpar: warning: <cmd>: <msg>", the same way (as cli_usage_error words errors): a flag that changes nothing. */
void cli_warn_cmd(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cli_note(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* "hyperpar: note: ", the same way */
/* Whether the launcher's environment (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK) names a rank other than 0:
 * such a rank keeps quiet about what every rank would print alike. False when no launcher says. */
bool cli_rank_is_quiet(void);
/* Parses a positive integer option value; on failure prints a usage error and returns false. */
bool cli_parse_i64(const char *cmd, const char *opt, const char *s, int64_t min, int64_t max, int64_t *out);
/* The mesh from --mesh SPEC or from --dp/--cp/--tp sizes, with --ep and --ep-axis; prints the error and
 * returns its exit code, or HP_EXIT_OK. */
struct hp_mesh;
int cli_mesh(const char *cmd, const char *mesh_spec, int64_t dp, int64_t cp, int64_t tp, int64_t ep, bool ep_axis,
             struct hp_mesh *out);
/* ---- option tables (opts.c): one per command ----
 *
 * A command is described once, by a cli_command: its name, the synopsis lines, a one-line summary ('hyperpar
 * --help' lists it), the text of its --help and ONE table of its options (cli_opt). From the table come getopt's
 * long and short options, the option lines of --help and what each option does with its value, so that an option
 * cannot be taken without being listed, listed without being taken, or parsed in two ways:
 *
 *     static const cli_opt g_opts[] = {
 *         {"steps", O_STEPS, "N", "training steps (default 1)", 0, NULL, CLI_INT(train_args, steps, 1, 1000000000)},
 *         {"force", O_FORCE, NULL, "replace an earlier output", 0, NULL, CLI_FLAG(train_args, force)},
 *         ...
 *     };
 *     cli_parse(&(cli_parser){.command = &cmd}, &args, argc, argv) fills args, or prints the refusal.
 *
 * An entry's kind says what its value becomes in the command's args struct (a byte offset, the target's size);
 * fn does what no kind does (a value parsed by the library, two fields set), after the kind's store. Every
 * refusal is a usage error in the words of cli_usage_error: "run: --seq expects an integer in [1, 2147483647],
 * got '0'". */
enum {
    CLI_REPEAT = 1, /* may be given more than once */
    CLI_SHORT = 2,  /* -val is the same option */
};
/* What an option's value does: stored into the command's args struct at cli_opt.off (cli_opt.size bytes). */
typedef enum cli_kind {
    CLI_K_NONE = 0, /* nothing stored: fn does it, or the command asks cli_given */
    CLI_K_HELP,     /* prints the command's --help (cli_help) on stdout: cli_parse returns CLI_HELP */
    CLI_K_CONST,    /* a flag: the integer lo into a bool, int or int64_t */
    CLI_K_STR,      /* the value as given (const char *); with want, an empty one is refused: "--x needs <want>, got an
                       empty string" */
    CLI_K_INT,      /* a decimal integer in [lo, hi] into an int or int64_t (cli_parse_i64's words) */
    CLI_K_DIGITS,   /* the same written as plain digits, no sign or space: "--x expects an integer in [lo, hi] written
                       as plain digits, got 'v'" */
    CLI_K_REAL,     /* a finite double in [flo, fhi] (an end open with CLI_LO_OPEN, CLI_HI_OPEN): "--x expects <want>,
                       got 'v'" */
    CLI_K_ENUM,     /* one of names' words, its value into a bool, int or enum: "--x expects a, b or c, got 'v'" */
} cli_kind;
enum { CLI_LO_OPEN = 1, CLI_HI_OPEN = 2 }; /* cli_opt.open of a CLI_K_REAL */

/* The words of a CLI_K_ENUM and the values they stand for. */
typedef struct cli_enum {
    const char *verb;  /* the refusal's verb: NULL "expects", or "must be" */
    struct {
        const char *word;
        int value;
        bool alias;    /* taken, but not named in the refusal (float32 beside f32) */
    } names[8];        /* ended by a NULL word */
} cli_enum;
extern const cli_enum cli_enum_compute; /* --compute exact|bf16 (hp_linalg_mode), one list for every command */

struct cli_opt;
/* An option's value as a handler sees it. */
typedef struct cli_ctx {
    const char *cmd;            /* the command's name in messages */
    const struct cli_opt *opt;  /* the option's entry (an alias's target) */
    const char *arg;            /* its value; NULL for a flag */
    void *args;                 /* the command's args struct */
} cli_ctx;
/* A handler: false after printing a usage error (cli_usage_error). */
typedef bool (*cli_fn)(const cli_ctx *x);
/* The option's target in the command's args struct (cli_opt.off). */
void *cli_target(const cli_ctx *x);

typedef struct cli_opt {
    const char *name;  /* the long name, without "--" */
    int val;           /* what cli_getopt returns; with CLI_SHORT also the short option -val */
    const char *arg;   /* the value's name in --help ("FILE"); NULL: a flag without a value */
    const char *help;  /* --help text, lines separated by '\n'; NULL: an alias, listed and parsed as its target (the
                          first entry of the same val) */
    unsigned flags;    /* CLI_REPEAT, CLI_SHORT */
    const char *group; /* a heading printed above the first option of a new group; NULL: none */
    /* What the value does (the CLI_INT(...) macros below set these): */
    cli_kind kind;
    size_t off, size;  /* the target: its offset in the args struct and its bytes */
    size_t mark;       /* 1 + the offset of a bool set true when the option is given (CLI_MARK); 0: none */
    int64_t lo, hi;    /* CLI_K_INT, CLI_K_DIGITS: the bounds; CLI_K_CONST: the value */
    double flo, fhi;   /* CLI_K_REAL: the bounds */
    unsigned open;     /* CLI_K_REAL: CLI_LO_OPEN, CLI_HI_OPEN */
    const char *want;  /* CLI_K_REAL: what it expects ("a number in (0, 1]"); CLI_K_STR: what an empty one lacks */
    const cli_enum *names; /* CLI_K_ENUM */
    cli_fn fn;         /* called after the kind's store with the same target; false: refused (printed) */
} cli_opt;

/* An entry's action, after its six leading fields: T is the command's args struct, m a member (a path such as
 * pf.po.loss_parallel). */
#define CLI_AT(T, m) .off = offsetof(T, m), .size = sizeof(((T *)0)->m)
#define CLI_FLAG(T, m) .kind = CLI_K_CONST, CLI_AT(T, m), .lo = 1
#define CLI_CONST(T, m, v) .kind = CLI_K_CONST, CLI_AT(T, m), .lo = (v)
#define CLI_STR(T, m) .kind = CLI_K_STR, CLI_AT(T, m)
#define CLI_STR_NONEMPTY(T, m, w) .kind = CLI_K_STR, CLI_AT(T, m), .want = (w)
#define CLI_INT(T, m, l, h) .kind = CLI_K_INT, CLI_AT(T, m), .lo = (l), .hi = (h)
#define CLI_DIGITS(T, m, l, h) .kind = CLI_K_DIGITS, CLI_AT(T, m), .lo = (l), .hi = (h)
#define CLI_REAL(T, m, l, h, o, w) .kind = CLI_K_REAL, CLI_AT(T, m), .flo = (l), .fhi = (h), .open = (o), .want = (w)
#define CLI_ENUM(T, m, e) .kind = CLI_K_ENUM, CLI_AT(T, m), .names = &(e)
#define CLI_FN(T, m, f) CLI_AT(T, m), .fn = (f)
#define CLI_MARK(T, m) .mark = offsetof(T, m) + 1
#define CLI_ALIAS .kind = CLI_K_NONE
/* --compare-rtol / --rtol R: a number in (0, 1]. */
#define CLI_RTOL(T, m) CLI_REAL(T, m, 0, 1, CLI_LO_OPEN, "a number in (0, 1]")
/* A finite number > 0 (bench's --max-gib). */
#define CLI_POSITIVE(T, m) CLI_REAL(T, m, 0, 1e300, CLI_LO_OPEN, "a positive number")
#define CLI_OPT_HELP {"help", 'h', NULL, "print this help and exit", CLI_SHORT, NULL, .kind = CLI_K_HELP}

/* A positional argument's line of --help ("  MODEL   a checkpoint folder ..."). */
typedef struct cli_arg {
    const char *name, *help;
} cli_arg;
/* One synopsis line: "usage: [launcher] hyperpar <name> <words> [options]". Each word of `words` that starts with
 * "--" (inside [ ] too) is an option of the table, written with its value's name from there ("--out" becomes
 * "--out DIR"); the others (MODEL) are written as they are. */
typedef struct cli_form {
    const char *launcher; /* "[mpirun -np N]", "mpirun -np N" or NULL */
    const char *words;
} cli_form;
typedef struct cli_command {
    const char *cmd;        /* the name its messages give (cli_usage_error): "run", "bench" for every benchmark */
    const char *name;       /* the words after "hyperpar" in its synopsis ("bench run"); NULL: cmd */
    const char *summary;    /* one line ('\n' where it wraps) of 'hyperpar --help' */
    cli_form forms[3];      /* the synopsis: one line per form ("usage:", then "   or:"); a NULL words ends them */
    const char *about;      /* the text under the synopsis: what the command does */
    void (*about_more)(FILE *out); /* what about cannot hold as a literal (a list of families); NULL: none */
    const cli_arg *args;    /* its positional arguments' lines above the options, ended by a NULL name; NULL: none */
    const cli_opt *opts;    /* ended by an entry with a NULL name */
    const char *epilog;     /* the text under the options; NULL: none */
    void (*epilog_more)(FILE *out);
    int (*run)(int argc, char **argv); /* its entry point: argv[0] is its last name word ("run") */
    const struct cli_command *const *subs; /* a group (bench): its commands, ended by NULL; else NULL */
} cli_command;
/* The whole --help of c: the synopsis, about, the argument and option lines, the epilog. Every word of a form that
 * names an option must be one of the table (an assertion: a form names its own table's options only). */
void cli_help(FILE *out, const cli_command *c);
/* The option lines of --help, generated from the table: "  -o, --output FILE   help", aliases beside their
 * target, a heading where the group changes. */
void cli_print_options(FILE *out, const cli_opt *opts);

/* ---- the plan and mesh flags plan, shard, cost, advise, run, validate and train share (planflags.c) ---- */
enum {
    CLI_O_MESH = 0x4000, CLI_O_DP, CLI_O_CP, CLI_O_TP, CLI_O_EP, CLI_O_EP_AXIS, CLI_O_NOSP, CLI_O_LP, CLI_O_FREEZE,
    CLI_O_UNCOV, CLI_O_PACKED, CLI_O_OVERRIDES, CLI_O_EP_COMPUTE, CLI_O_PP, CLI_O_PP_VIRTUAL, CLI_O_PP_LAYERS, CLI_O_END
};
/* Handlers of the plan flags (planflags.c): --freeze appends a checked glob, --ep-compute sets both fields. */
bool cli_plan_freeze_fn(const cli_ctx *x);
bool cli_plan_ep_compute_fn(const cli_ctx *x);
/* --pp-layers N,N,..: plain-digit counts, at most 1024, into cli_plan_flags.pp_layers and hp_plan_opts. */
bool cli_plan_pp_layers_fn(const cli_ctx *x);
/* The shared plan and mesh flags for a command's table: into the cli_plan_flags member m of the args struct T. */
#define CLI_OPTS_MESH(grp, T, m)                                                                                    \
    {"mesh", CLI_O_MESH, "SPEC", "mesh axes in order with sizes; the product is the world size. Axes: dp,\n"        \
                                 "cp, tp, ep (an explicit EP axis: it adds ranks, --ep-axis implied; the\n"      \
                                 "experts split over it, cut over tp when tp > 1), pp (pipeline stages: the\n"  \
                                 "first, outermost axis)", 0, grp,                                                \
     CLI_STR(T, m.mesh_spec)},                                                                                      \
    {"pp", CLI_O_PP, "N", "pipeline stages of a mesh given by sizes (default 1): the outermost axis;\n"            \
                          "plan, explain, shard and merge take it (docs/pipeline.md)", 0, grp,                     \
     CLI_DIGITS(T, m.pp, 1, HP_MESH_MAX_SIZE), CLI_MARK(T, m.pp_given)},                                            \
    {"pp-virtual", CLI_O_PP_VIRTUAL, "V", "virtual stages per pipeline stage (interleaved chunks, round robin;\n"   \
                                          "default 1)", 0, grp, CLI_DIGITS(T, m.po.pp_virtual, 1, 1024)},        \
    {"pp-layers", CLI_O_PP_LAYERS, "N,N,..", "decoder layers of each pipeline chunk, stage order (default: even,\n"\
                                             "the embedding and the loss counted as a layer each)", 0, grp,       \
     CLI_FN(T, m, cli_plan_pp_layers_fn)},                                                                          \
    {"dp", CLI_O_DP, "N", "data-parallel size of a mesh given by sizes (default 1)", 0, grp,                        \
     CLI_DIGITS(T, m.dp, 1, HP_MESH_MAX_SIZE), CLI_MARK(T, m.dp_given)},                                            \
    {"cp", CLI_O_CP, "N", "context-parallel size of a mesh given by sizes (default 1)", 0, grp,                     \
     CLI_DIGITS(T, m.cp, 1, HP_MESH_MAX_SIZE), CLI_MARK(T, m.cp_given)},                                            \
    {"tp", CLI_O_TP, "N", "tensor-parallel size of a mesh given by sizes", 0, grp,                                  \
     CLI_DIGITS(T, m.tp, 1, HP_MESH_MAX_SIZE), CLI_MARK(T, m.tp_given)}
#define CLI_OPTS_EP(grp, T, m)                                                                                      \
    {"ep", CLI_O_EP, "N", "expert parallelism: by default TP-extend-EP (D-10), EP groups of N consecutive\n"        \
                          "ranks of the dense region: it rides on the dp/cp/tp ranks and adds none\n"        \
                          "(--dp 2 --tp 2 --ep 2 is 4 ranks); with --ep-axis an explicit ep mesh axis", 0, grp,    \
     CLI_DIGITS(T, m.ep, 1, HP_MESH_MAX_SIZE), CLI_MARK(T, m.ep_given)},                                            \
    {"ep-axis", CLI_O_EP_AXIS, NULL, "EP as an explicit ep axis of --mesh (an ep axis in --mesh is one anyway)", 0, \
     grp, CLI_FLAG(T, m.ep_axis)}
#define CLI_OPTS_PLAN(grp, T, m)                                                                                    \
    {"no-sequence-parallel", CLI_O_NOSP, NULL, "contracts without sequence parallelism (default: on)", 0, grp,      \
     CLI_CONST(T, m.po.sequence_parallel, 0)},                                                                      \
    {"loss-parallel", CLI_O_LP, NULL, "keep lm_head logits vocab-sharded", 0, grp, CLI_FLAG(T, m.po.loss_parallel)}, \
    {"freeze", CLI_O_FREEZE, "GLOB", "mark matching parameters non-trainable (repeatable)", CLI_REPEAT, grp,       \
     CLI_FN(T, m, cli_plan_freeze_fn)},                                                                             \
    {"allow-uncovered", CLI_O_UNCOV, NULL, "uncovered trainable parameters warn instead of failing", 0, grp,        \
     CLI_FLAG(T, m.po.allow_uncovered)},                                                                            \
    {"packed-fused", CLI_O_PACKED, NULL, "fused gate/up weights get a packed S(d)x2 placement instead of an\n"      \
                                         "error", 0, grp, CLI_FLAG(T, m.po.packed_fused)},                          \
    {"overrides", CLI_O_OVERRIDES, "FILE", "plan overrides (YAML or JSON list of entries: match, when, params,\n"  \
                                           "in_src, in_dst, out_src, out_dst, out_names, tp_divide_attrs,\n"       \
                                           "is_boundary, region_dispatch, local_compute_fn {_target_: ARCHETYPE,\n" \
                                           "...}; docs/overrides.md)", 0, grp,                                      \
     CLI_STR_NONEMPTY(T, m.overrides, "a file name")},                                                              \
    {"ep-compute", CLI_O_EP_COMPUTE, "A", "the EP compute of every MoE block the overrides leave without one:\n" \
                                          "suggested (the family's archetype) or an ARCHETYPE (docs/overrides.md);\n" \
                                          "never chosen unless given. Refused for a dense model", 0, grp,         \
     CLI_FN(T, m, cli_plan_ep_compute_fn)}

#include "hyperpar/plan.h"
/* What the plan flags say; which were given is read from the values (cli_plan_flags_any). */
typedef struct cli_plan_flags {
    const char *mesh_spec, *overrides, *ep_compute;
    int64_t dp, cp, tp, ep, pp;
    bool ep_given, ep_axis, pp_given;
    int64_t pp_layers[1024];  /* --pp-layers: hp_plan_opts.pp_layers */
    bool dp_given, cp_given, tp_given; /* which sizes were given (a shard folder's mesh fills the others) */
    const char *freeze[64];
    int n_freeze;
    hp_plan_opts po;          /* sequence_parallel, loss_parallel, allow_uncovered, packed_fused, ep_compute; mesh
                                 after cli_plan_flags_mesh */
} cli_plan_flags;

void cli_plan_flags_init(cli_plan_flags *f);
/* Whether some plan flag was given (they exclude --plan FILE). */
bool cli_plan_flags_any(const cli_plan_flags *f);
/* Whether a flag that shapes the plan beyond its mesh was given (--overrides, --ep-compute, --no-sequence-parallel,
 * --loss-parallel, --packed-fused, --allow-uncovered). */
bool cli_plan_flags_shaping(const cli_plan_flags *f);
/* Whether a size of the mesh was given (--dp, --cp, --tp). */
bool cli_plan_flags_sizes(const cli_plan_flags *f);
/* Whether no mesh flag was given (--mesh, a size, --ep, --ep-axis): a command's default mesh. */
bool cli_plan_flags_default_mesh(const cli_plan_flags *f);
/* The mesh into f->po.mesh (default_tp when neither --mesh nor sizes are given); prints; an exit code. */
int cli_plan_flags_mesh(const char *cmd, cli_plan_flags *f, int64_t default_tp);
/* Loads --overrides into *ov (freed by the caller) and f->po, and applies --freeze to m. */
struct hp_overrides;
hp_status cli_plan_flags_apply(cli_plan_flags *f, hp_model *m, struct hp_overrides **ov, hp_err *err);
/* --freeze applied to m (a warning for a pattern that matches nothing), for commands that open m later. */
void cli_plan_flags_freeze(const cli_plan_flags *f, hp_model *m);
/* The plan a command that executes one runs (run, validate, train), for m opened from MODEL: --plan plan_path
 * read for m; else, when shard_dir is a shard folder, the plan it records (hp_shard_folder_plan), each given plan
 * flag checked against it (a contradiction is HP_ERR_INPUT naming both values: "--tp 4 contradicts the shard
 * folder's tp=2") and, when flags shape the plan beyond the mesh, derived on the folder's mesh; else derived from
 * the flags (default_mesh: none given, tp = n_procs). *ov gets the loaded --overrides (the caller frees it); --freeze
 * is applied to m. Prints nothing (errors go through the ranks' agreement). */
hp_status cli_plan_resolve(cli_plan_flags *f, const char *plan_path, const char *shard_dir, bool default_mesh,
                           int64_t n_procs, hp_model *m, hp_plan **p, struct hp_overrides **ov, hp_err *err);

#define CLI_MAX_OPTS 64
/* Options one command line may give, repeats counted: the distinct ones and 192 repeats. */
#define CLI_MAX_GIVEN (4 * CLI_MAX_OPTS)
/* One command's parser: declare it with its command, {.command = &g_cmd}; the rest is built on the first
 * cli_getopt (cmd and opts from the command, unless set). */
typedef struct cli_parser {
    const cli_command *command;
    const char *cmd;
    const cli_opt *opts; /* ended by an entry with a NULL name */
    bool built;
    struct option lo[CLI_MAX_OPTS + 1];
    char shortopts[3 * CLI_MAX_OPTS + 2];
    struct { /* the options given so far, in order (a repeatable one at each time it is given) */
        int n;
        int val[CLI_MAX_GIVEN];
        const char *arg[CLI_MAX_GIVEN];
    } seen;
} cli_parser;
/* getopt_long for every command. An option given a second time is a usage error ("run: --input is given twice
 * ('A' and 'B'); give it once"), since the last would silently win; only CLI_REPEAT entries repeat. A short option
 * counts as the long option of the same value (-o and --output), and aliases of one value as one option. An
 * unknown or ambiguous option, a missing value or a value given to a flag gets our one message (getopt's own are
 * off). On any such error it prints the message and returns '?'. */
int cli_getopt(cli_parser *p, int argc, char **argv);
/* cli_parse's result when --help was printed: the command exits 0 without doing anything. */
#define CLI_HELP (-1)
/* Every option of argv (from argv[1]; optind reset) through p's table, in the order given: each value stored or
 * handed to its entry's fn, --help printed. Returns HP_EXIT_OK with optind at the first positional argument,
 * CLI_HELP, or HP_EXIT_USAGE after the first refusal (printed): an unknown option, a bad value, ... */
int cli_parse(cli_parser *p, void *args, int argc, char **argv);
/* Whether option val was given (parsed by p so far). */
bool cli_given(const cli_parser *p, int val);
/* Every rank agrees that it was given the options rank 0 was (agreeflags.c): collective over w, called before the
 * command's first collective that depends on them. Every option of cp's table is compared as given ("--lr 1e-3"
 * and "--lr 0.001" differ) except --help and free_vals (what may differ per rank: --threads); an option of
 * `inputs` by its file's identity instead of its path (identity 0: unreadable here, not compared; the command's
 * own open says why). On a difference every rank returns HP_ERR_INPUT with one message naming the first rank
 * that differs and the option, both values ("rank 1 was given --steps 4 where rank 0 has --steps 3"), and w is
 * marked diverged (hp_comm_diverged). One process: HP_OK at once. */
typedef struct cli_agree_input {
    int val;                               /* the option (its cli_opt val) */
    uint64_t (*identity)(const char *arg); /* the identity of what it names, 0 when it cannot be read */
} cli_agree_input;
struct hp_comm;
hp_status cli_agree_flags(const struct hp_comm *w, const cli_parser *cp, const int *free_vals, int n_free,
                          const cli_agree_input *inputs, int n_inputs, hp_err *err);
/* A file's identity: a hash of its size and bytes (whole up to 1 MiB, else 16 windows of 4 KiB); 0 when it is
 * not a readable regular file. */
uint64_t cli_file_identity(const char *path);

/* The values several commands take, each parsed in one place (opts.c); a usage error is printed, false returned. */
#include "hyperpar/linalg.h"
const char *cli_compute_name(hp_linalg_mode m);                                /* "exact", "bf16" */
/* --compare-rtol / --rtol R: a number in (0, 1]; opt names the option in the message. */
bool cli_parse_rtol(const char *cmd, const char *opt, const char *s, double *out);
/* --expert-layout L (plan, inspect, gen): per-expert or batched, into an hp_expert_layout. */
bool cli_layout_fn(const cli_ctx *x);

/* An output FILE name (plan -o, moe --output) checked before any work: not empty, not a folder or device, in
 * an existing folder that takes a new file (probed), and none of the inputs (MODEL, a name in MODEL's folder the reader would pick up, or
 * any of inputs[], NULL entries skipped), links included. Prints the error; 0 when fine, else exit code 2. */
int cli_check_output_file(const char *cmd, const char *opt, const char *path, const char *model,
                          const char *const *inputs, int n_inputs);
/* The same check, the problem written to msg (true when there is one): for paths that go through a rank
 * agreement under MPI, so that the error is printed once. */
bool cli_output_problem(const char *opt, const char *path, const char *model, const char *const *inputs,
                        int n_inputs, char *msg, size_t cap);

/* Whether two output names are one file: the same file (links included), or, for a file yet to be made, the
 * same name in the same folder ("o.st" and "./o.st"). */
bool cli_same_output(const char *a, const char *b);

/* Writes data to path atomically (a temporary next to it, synced, renamed over path; never left behind), or
 * to stdout when path is NULL. `what` names it in errors ("the plan"). Returns an exit code. */
int cli_write_atomic(const char *path, const char *data, size_t len, const char *what);
/* The same, the error (naming path, never the temporary) into err instead of printed. */
hp_status cli_write_atomic_err(const char *path, const char *data, size_t len, const char *what, hp_err *err);
#include "hyperpar/comm.h"
#include "hyperpar/run.h"
/* This process's anonymous resident memory (RssAnon of /proc/self/status) in KiB after giving freed heap back,
 * or -1 where there is none. */
int64_t cli_anon_kib(void);
/* --stats-json of run and train: the last forward's loss (17 digits; null when not finite) and every rank's
 * statistics (bytes and calls per collective kind, resident weights, the forward's workspace, anon_kib_grown,
 * seconds; after a training step its state's bytes: grad_bytes, optim_bytes, master_bytes, saved_bytes) to rank 0,
 * written there atomically. Collective. */
hp_status cli_write_run_stats(const hp_comm *w, const hp_runner *r, const char *path, int64_t anon_kib_grown,
                              hp_err *err);

/* Prints s to stdout as a JSON string (quotes, backslashes and control characters escaped). */
void cli_json_str(const char *s);

/* ---- cost, advise and train pictures (html.c): one self-contained HTML page, inline SVG, no network ---- */
struct hp_cost;
struct hp_mesh;

struct hp_advice;

/* Room for one candidate's `hyperpar plan ... && hyperpar shard ...` command line. */

/* `hyperpar cost --format html`: the mesh as a grid of ranks coloured by total memory against budget (0: against
 * the most-loaded rank), a stacked bar per rank (weights, activations, KV cache or training state), and per layer
 * the collectives with their bytes (of rank c->max_rank). title: the model and mesh. Returns 0, or -1 on a write
 * error. */
/* What the cost page says of each rank's slices: the model's heads and experts, and how the plan places the experts. */
typedef struct cli_html_model {
    int64_t n_heads, n_kv_heads; /* query and KV heads (tp cuts both evenly) */
    int64_t n_experts;           /* routed experts, 0: a dense model */
    int64_t ep;                  /* the EP group size (1: no expert parallelism; the experts are then cut over tp) */
    bool mla;                    /* latent attention: the KV cache is the latent, whole on every tp rank */
} cli_html_model;
/* md (NULL: no table of slices) adds a table of what each rank holds: coordinates, experts, slices, memory. */
int cli_html_cost(FILE *f, const char *title, const struct hp_cost *c, const struct hp_mesh *mesh,
                  const cli_html_model *md, uint64_t budget);
/* `hyperpar advise --format html`: the library's advice (hp_advise): the accepted candidates side by side (memory
 * against a->mem_per_rank, predicted step time, communication), best first, and the rejected ones with their
 * reasons. commands[i] (or commands NULL): the command line that makes candidate i, shown for the accepted. */
int cli_html_advise(FILE *f, const char *title, const struct hp_advice *a, const char *const *commands);

/* `hyperpar train --plot`: the curves of the steps a run took. */
typedef struct cli_train_curves {
    int64_t n;                  /* points, one per step */
    const int64_t *step;        /* [n] the step numbers, ascending */
    const double *loss;         /* [n] */
    const double *grad_norm;    /* [n] before clipping */
    int64_t n_eval;             /* evaluations (--eval-data), 0: none */
    const int64_t *eval_step;   /* [n_eval] the steps that evaluated, ascending */
    const double *eval_loss;    /* [n_eval] */
    double clip;                /* --clip (drawn as a line), 0: none */
    const char *summary;        /* a sentence under the title */
    const char *note;           /* the page's last paragraph, NULL: none */
} cli_train_curves;
/* The loss (and eval loss) and the gradient norm against the step, with ticks on both axes: one polyline per
 * curve (data-curve="loss", "eval_loss", "grad_norm") with a point per step (per evaluation); a non-finite value
 * breaks its line and is not drawn; dots with tooltips on curves of at most 100 points. Returns 0, or -1 on a
 * write error. */
int cli_html_train(FILE *f, const char *title, const cli_train_curves *t);

/* ---- facts several commands share (common.c) ---- */
struct hp_comm;
/* The one error exit of a command that ran collectives (run, validate, moe, bench run, bench ep): 0 for HP_OK;
 * otherwise, when the failure was agreed (every rank holds the same message, hp_comm_agree), rank 0 prints it
 * and every rank waits at a barrier so that none exits before it is printed (mpirun may end the job at the
 * first non-zero exit); a failure that is this rank's alone (!agreed) is printed by the rank, naming it.
 * Returns the exit code for st on every rank. Does not free w. */
int cli_collective_exit(struct hp_comm *w, hp_status st, hp_err *err, bool agreed);
/* The tensor of token ids every command reads and writes: input_ids I64 (or I32 read) [B, S]. */
#define CLI_IDS_KEY "input_ids"
/* How a command chose its threads: per rank, this process's cores (sched_getaffinity), the ranks on this node,
 * and what overrode the default (NULL: none). */
typedef struct cli_threads_info {
    int threads, cores, local_ranks;
    const char *why; /* "--threads", "OMP_NUM_THREADS" or NULL */
} cli_threads_info;
/* The threads of each rank's GEMM pools (OpenMP's and OpenBLAS's, both set): --threads N (requested > 0), else
 * OMP_NUM_THREADS when set, else max(1, this process's cores / the ranks of its node), so that ranks x threads
 * never oversubscribe the cores by default (OpenMP spinning on shared cores costs up to 9x). The ranks of the
 * node come from the launcher's environment (hp_comm_launch_local_size), else from w's host names (collective
 * over w then; w may be NULL: one process). *info (may be NULL) says how. */
int cli_threads(const hp_comm *w, int64_t requested, cli_threads_info *info);
/* "1 per rank (2 cores, 2 ranks on this node)", "4 per rank (--threads; 2 cores, 2 ranks on this node)". */
const char *cli_threads_str(const cli_threads_info *t, char *buf, size_t cap);
/* The key of a sparse layer's routed experts in run's --output, forward_io files and cost's --routing:
 * "moe.<layer>.topk_idx", I32 [B*S, K]. */
const char *cli_topk_key(int64_t layer, char *buf, size_t cap);
#define CLI_TOPK_KEY_MAX 48

/* ---- the benchmarks' model shapes (presets.c): one table for bench moe, ep and run ---- */
#include "hyperpar/moe.h"
typedef struct cli_preset {
    const char *name, *family;  /* "mixtral-8x7b", its hyperpar family "mixtral" */
    hp_moe_archetype archetype; /* MoE presets: the EP compute archetype */
    int64_t hidden, intermediate, heads, kv_heads, head_dim, vocab;
    int64_t experts, top_k, moe_intermediate, shared_intermediate; /* experts 0: dense */
    int64_t first_dense, n_group, topk_group; /* DeepSeek-V3: first_k_dense_replace, group-limited routing */
    double rsf;                               /* routed_scaling_factor (0: 1) */
    bool norm_topk;                           /* norm_topk_prob */
    int64_t q_lora, kv_lora, nope, rope, v_head; /* MLA (0: none) */
} cli_preset;
/* The preset called name (moe_only: only those with experts), or NULL. */
const cli_preset *cli_preset_find(const char *name, bool moe_only);
/* --preset NAME of a benchmark: the preset, or NULL after a usage error naming the known ones (NULL name: missing). */
const cli_preset *cli_preset_arg(const char *cmd, const char *name, bool moe_only);
const cli_preset *cli_preset_at(size_t i); /* the i-th preset, NULL past the end */
/* "llama-3-8b, qwen3-30b-a3b, ..." into buf. */
const char *cli_preset_names(bool moe_only, char *buf, size_t cap);
/* The whole MoE layer of a preset (all experts). */
hp_moe_dims cli_preset_moe_dims(const cli_preset *p);
/* "H 4096, 32 heads, 8 kv x 128, I 14336, vocab 128256" into buf; cli_print_presets: one such line per preset. */
void cli_preset_describe(const cli_preset *p, char *buf, size_t cap);
void cli_print_presets(FILE *out, bool moe_only);

int cmd_inspect(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_shard(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_moe(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_validate(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_cost(int argc, char **argv);
int cmd_advise(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench_advise(int argc, char **argv); /* cmd_bench.c */
/* --ranks-per-node R tiles --world N in whole nodes (R divides N) or holds it all (R >= N); else a usage error of
 * cmd, printed (cmd_advise.c). */
bool cli_advise_rpn_divides(const char *cmd, int64_t rpn, int64_t N);
int cmd_bench(int argc, char **argv);
int cmd_bench_run(int argc, char **argv); /* bench_run.c */
int cmd_bench_train(int argc, char **argv); /* bench_run.c (the options and setup) and bench_train.c */
int cmd_bench_ep(int argc, char **argv); /* bench_ep.c */
/* The commands, each described in its file: 'hyperpar --help' lists them (main.c), bench dispatches to its own. */
extern const cli_command cli_cmd_inspect, cli_cmd_plan, cli_cmd_gen, cli_cmd_convert, cli_cmd_demo, cli_cmd_shard,
    cli_cmd_merge, cli_cmd_moe, cli_cmd_run, cli_cmd_validate, cli_cmd_train, cli_cmd_cost, cli_cmd_advise, cli_cmd_bench,
    cli_cmd_generate, cli_cmd_tokenize;
extern const cli_command cli_cmd_bench_moe, cli_cmd_bench_ep, cli_cmd_bench_run, cli_cmd_bench_train,
    cli_cmd_bench_advise;

#endif
