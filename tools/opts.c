/*
 * opts.c — the one option parser of every command: each command declares ONE table of its options (cli_opt:
 * name, value, argument, help, repeatable, group) from which the getopt_long table, the short-option string
 * and the option lines of its --help are generated, so that the two cannot disagree.
 *
 * getopt's own messages are off (opterr = 0): an unknown option, an ambiguous abbreviation, a missing value or
 * a value given to a flag gets one message of ours, printed once under mpirun (cli_usage_error), naming the
 * option as the user wrote it. An option given twice is refused unless its entry is CLI_REPEAT.
 *
 * Also here: the parsers of the values several commands take (--compute, --dtype, --compare-rtol), written once.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/safetensors.h"

/* Set when cli_getopt has printed why it returned '?', so that cli_bad_option does not print a second error. */
static bool g_opt_reported;

static size_t n_opts(const cli_opt *t)
{
    size_t n = 0;
    while (t && t[n].name) n++;
    return n;
}

/* Builds the getopt_long table and the short-option string from p->opts, once. */
static void build(cli_parser *p)
{
    size_t n = n_opts(p->opts), s = 0;
    HP_ASSERT(n <= CLI_MAX_OPTS); /* a table larger than the parser holds: our bug */
    p->shortopts[s++] = ':';      /* a missing value returns ':' (our message), not '?' */
    for (size_t i = 0; i < n; i++) {
        const cli_opt *o = &p->opts[i];
        p->lo[i] = (struct option){o->name, o->arg ? required_argument : no_argument, NULL, o->val};
        if (o->flags & CLI_SHORT) {
            HP_ASSERT(o->val > 0 && o->val < 128);
            p->shortopts[s++] = (char)o->val;
            if (o->arg) p->shortopts[s++] = ':';
        }
    }
    p->lo[n] = (struct option){0};
    p->shortopts[s] = '\0';
    p->built = true;
}

/* The table entry that getopt returned c for; the first with that value (an alias's target) when li < 0. */
static const cli_opt *entry(const cli_parser *p, int c, int li)
{
    if (li >= 0) return &p->opts[li];
    for (const cli_opt *o = p->opts; o && o->name; o++)
        if (o->val == c) return o;
    return NULL;
}

/* The message for what getopt refused: argv[optind - 1] is the word it stopped at. */
static void refuse(const cli_parser *p, int c, int argc, char **argv)
{
    const char *word = optind > 0 && optind - 1 < argc ? argv[optind - 1] : "?";
    if (c == ':') { /* a value is missing: optopt is the option's value */
        const cli_opt *o = entry(p, optopt, -1);
        if (o) cli_usage_error(p->cmd, "--%s needs a value (%s)", o->name, o->arg);
        else cli_usage_error(p->cmd, "'%s' needs a value", word);
        return;
    }
    if (optopt && strncmp(word, "--", 2) == 0) { /* a known long flag given a value: --help=x */
        const cli_opt *o = entry(p, optopt, -1);
        cli_usage_error(p->cmd, "--%s takes no value, got '%s'", o ? o->name : word + 2, word);
        return;
    }
    if (optopt) { /* an unknown short option */
        cli_usage_error(p->cmd, "unknown option '-%c'", optopt);
        return;
    }
    /* An unknown long option, or an abbreviation of several. */
    bool dashes = strncmp(word, "--", 2) == 0; /* word may be "?" (no argument at optind - 1) */
    size_t len = dashes ? strcspn(word + 2, "=") : 0;
    char names[512] = "";
    int hits = 0;
    for (const cli_opt *o = p->opts; dashes && o && o->name; o++)
        if (strncmp(o->name, word + 2, len) == 0 && strlen(names) + strlen(o->name) + 4 < sizeof names) {
            strcat(names, hits++ ? ", --" : "--");
            strcat(names, o->name);
        }
    if (hits > 1) cli_usage_error(p->cmd, "option '%.*s' is ambiguous: %s", (int)(len + 2), word, names);
    else cli_usage_error(p->cmd, "unknown option '%s'", word);
}

int cli_getopt(cli_parser *p, int argc, char **argv)
{
    if (!p->built) build(p);
    opterr = 0; /* every message is ours */
    int li = -1;
    int c = getopt_long(argc, argv, p->shortopts, p->lo, &li);
    if (c == -1) return c;
    if (c == '?' || c == ':') {
        refuse(p, c, argc, argv);
        g_opt_reported = true;
        return '?';
    }
    const cli_opt *o = entry(p, c, li);
    if (o && (o->flags & CLI_REPEAT)) { /* kept too: every option given, in order, is what ranks agree on */
        if (p->seen.n >= CLI_MAX_GIVEN - CLI_MAX_OPTS) { /* room is kept for every distinct option */
            cli_usage_error(p->cmd, "more than %d options given (the last --%s); give fewer", CLI_MAX_GIVEN - CLI_MAX_OPTS,
                            o->name);
            g_opt_reported = true;
            return '?';
        }
        p->seen.val[p->seen.n] = c;
        p->seen.arg[p->seen.n++] = optarg;
        return c;
    }
    /* A short option is the long option with the same value (-o and --output); an alias is its target. */
    char name[80];
    if (o) snprintf(name, sizeof name, "--%.60s", o->name);
    else snprintf(name, sizeof name, "-%c", c);
    for (int i = 0; i < p->seen.n; i++) {
        if (p->seen.val[i] != c) continue;
        if (p->seen.arg[i] && optarg)
            cli_usage_error(p->cmd, "%s is given twice ('%s' and '%s'); give it once", name, p->seen.arg[i], optarg);
        else
            cli_usage_error(p->cmd, "%s is given twice; give it once", name);
        g_opt_reported = true;
        return '?';
    }
    HP_ASSERT(p->seen.n < CLI_MAX_GIVEN); /* more distinct options than any table holds: our bug */
    p->seen.val[p->seen.n] = c;
    p->seen.arg[p->seen.n++] = optarg;
    return c;
}

int cli_bad_option(const char *cmd, char **argv)
{
    if (g_opt_reported) { /* cli_getopt said why */
        g_opt_reported = false;
        return HP_EXIT_USAGE;
    }
    /* an option of the table its command does not handle: our bug, but never a crash */
    const char *arg = optind > 0 ? argv[optind - 1] : "?";
    return cli_usage_error(cmd, "option '%s' is not handled here", arg);
}

/* Help column: options are listed as "  -o, --output FILE" padded to this width, the help beside them. */
#define HELP_COL 26

void cli_print_options(FILE *out, const cli_opt *t)
{
    const char *group = NULL;
    for (size_t i = 0; t && t[i].name; i++) {
        const cli_opt *o = &t[i];
        if (!o->help) continue; /* an alias: listed with its target below */
        if (o->group && (!group || strcmp(group, o->group))) fprintf(out, "\n%s:\n", o->group);
        group = o->group;
        char head[256];
        int n = 0;
        if (o->flags & CLI_SHORT) n += snprintf(head + n, sizeof head - (size_t)n, "-%c, ", o->val);
        n += snprintf(head + n, sizeof head - (size_t)n, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
        for (size_t k = 0; t[k].name && n < (int)sizeof head - 80; k++) /* its aliases */
            if (k != i && t[k].val == o->val && !t[k].help)
                n += snprintf(head + n, sizeof head - (size_t)n, ", --%s%s%s", t[k].name, t[k].arg ? " " : "",
                              t[k].arg ? t[k].arg : "");
        fprintf(out, "  %s", head);
        bool own_line = n + 2 >= HELP_COL - 1;
        const char *h = o->help;
        if (own_line) fprintf(out, "\n%*s", HELP_COL, "");
        else fprintf(out, "%*s", HELP_COL - 2 - n, "");
        for (; *h; h++) {
            fputc(*h, out);
            if (*h == '\n' && h[1]) fprintf(out, "%*s", HELP_COL, "");
        }
        fputc('\n', out);
    }
}

bool cli_parse_compute(const char *cmd, const char *s, hp_linalg_mode *out)
{
    if (!strcmp(s, "exact")) *out = HP_LINALG_EXACT;
    else if (!strcmp(s, "bf16")) *out = HP_LINALG_BF16;
    else {
        cli_usage_error(cmd, "--compute expects exact or bf16, got '%s'", s);
        return false;
    }
    return true;
}

const char *cli_compute_name(hp_linalg_mode m) { return m == HP_LINALG_BF16 ? "bf16" : "exact"; }

const char *cli_dtype_name(hp_dtype dt)
{
    switch (dt) {
    case HP_DT_F32: return "f32";
    case HP_DT_BF16: return "bf16";
    case HP_DT_F16: return "f16";
    default: return hp_dtype_name(dt);
    }
}

bool cli_parse_dtype(const char *cmd, const char *s, const hp_dtype *allowed, int n_allowed, hp_dtype *out)
{
    for (int i = 0; i < n_allowed; i++)
        if (!strcmp(s, cli_dtype_name(allowed[i]))) {
            *out = allowed[i];
            return true;
        }
    char list[128] = "";
    for (int i = 0; i < n_allowed; i++) {
        if (i) strcat(list, i + 1 == n_allowed ? " or " : ", ");
        strncat(list, cli_dtype_name(allowed[i]), 8);
    }
    cli_usage_error(cmd, "--dtype must be %s, got '%s'", list, s);
    return false;
}

bool cli_parse_rtol(const char *cmd, const char *opt, const char *s, double *out)
{
    char *end = NULL;
    double v = strtod(s, &end);
    if (!*s || *end || !(v > 0) || v > 1) {
        cli_usage_error(cmd, "%s expects a number in (0, 1], got '%s'", opt, s);
        return false;
    }
    *out = v;
    return true;
}
