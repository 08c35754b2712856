/*
 * opts.c — the one option parser of every command: each command is described by a cli_command holding ONE table
 * of its options (cli_opt: name, value, argument, help, repeatable, group, and what the value does) from which
 * the getopt_long table, the short-option string, the synopsis and option lines of its --help and the parsing of
 * every value are generated, so that none of them can disagree with another.
 *
 * getopt's own messages are off (opterr = 0): an unknown option, an ambiguous abbreviation, a missing value or
 * a value given to a flag gets one message of ours, printed once under mpirun (cli_usage_error), naming the
 * option as the user wrote it. An option given twice is refused unless its entry is CLI_REPEAT.
 *
 * A value is stored by its entry's kind (store: a flag's constant, a string, a bounded integer or real, a word of
 * a list), then handed to the entry's fn when it has one; each kind's refusal has one wording, the same in every
 * command. Also here: the help printer (synopsis, text, option lines) and the handlers several commands share.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/model.h"

static size_t n_opts(const cli_opt *t)
{
    size_t n = 0;
    while (t && t[n].name) n++;
    return n;
}

/* The table's own consistency (our bugs, whatever the command line): an alias (no help) has a target that --help
 * lists it beside, and a kind's target has the size the kind stores. */
static void check_entry(const cli_opt *t, const cli_opt *o)
{
    if (!o->help) {
        const cli_opt *target = t;
        while (target->name && !(target->val == o->val && target->help)) target++;
        HP_ASSERT(target->name && o->kind == CLI_K_NONE && !o->fn);
    }
    switch (o->kind) {
    case CLI_K_STR: HP_ASSERT(o->size == sizeof(const char *)); break;
    case CLI_K_REAL: HP_ASSERT(o->size == sizeof(double) && o->want); break;
    case CLI_K_ENUM: HP_ASSERT(o->names); /* fall through */
    case CLI_K_CONST: case CLI_K_INT: case CLI_K_DIGITS:
        HP_ASSERT(o->size == sizeof(bool) || o->size == sizeof(int) || o->size == sizeof(int64_t));
        break;
    case CLI_K_NONE: case CLI_K_HELP: break;
    }
    bool flag_kind = o->kind == CLI_K_NONE || o->kind == CLI_K_HELP || o->kind == CLI_K_CONST;
    HP_ASSERT(o->arg ? o->kind != CLI_K_HELP && o->kind != CLI_K_CONST : flag_kind); /* values where one is taken */
}

/* Builds the getopt_long table and the short-option string from p->opts, once. */
static void build(cli_parser *p)
{
    if (p->command && !p->cmd) p->cmd = p->command->cmd;
    if (p->command && !p->opts) p->opts = p->command->opts;
    size_t n = n_opts(p->opts), s = 0;
    HP_ASSERT(n <= CLI_MAX_OPTS); /* a table larger than the parser holds: our bug */
    p->shortopts[s++] = ':';      /* a missing value returns ':' (our message), not '?' */
    for (size_t i = 0; i < n; i++) {
        const cli_opt *o = &p->opts[i];
        check_entry(p->opts, o);
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
        return '?';
    }
    const cli_opt *o = entry(p, c, li);
    if (o && (o->flags & CLI_REPEAT)) { /* kept too: every option given, in order, is what ranks agree on */
        if (p->seen.n >= CLI_MAX_GIVEN - CLI_MAX_OPTS) { /* room is kept for every distinct option */
            cli_usage_error(p->cmd, "more than %d options given (the last --%s); give fewer", CLI_MAX_GIVEN - CLI_MAX_OPTS,
                            o->name);
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
        return '?';
    }
    HP_ASSERT(p->seen.n < CLI_MAX_GIVEN); /* more distinct options than any table holds: our bug */
    p->seen.val[p->seen.n] = c;
    p->seen.arg[p->seen.n++] = optarg;
    return c;
}

/* ---- what a value does ---- */

void *cli_target(const cli_ctx *x) { return (char *)x->args + x->opt->off; }

/* v into an integer target of `size` bytes: a bool, an int (or an enum) or an int64_t. */
static void put_int(void *at, size_t size, int64_t v)
{
    if (size == sizeof(bool)) {
        *(bool *)at = v != 0;
    } else if (size == sizeof(int)) {
        int i = (int)v;
        memcpy(at, &i, sizeof i);
    } else {
        HP_ASSERT(size == sizeof(int64_t)); /* a table whose target is no integer: our bug */
        memcpy(at, &v, sizeof v);
    }
}

/* A word of e's list, its value into at; else the refusal naming the words ("a, b or c"; aliases unnamed). */
static bool store_enum(const cli_ctx *x, void *at)
{
    const cli_enum *e = x->opt->names;
    int n = 0;
    for (int i = 0; e->names[i].word; i++) {
        if (!strcmp(x->arg, e->names[i].word)) {
            put_int(at, x->opt->size, e->names[i].value);
            return true;
        }
        n += !e->names[i].alias;
    }
    char list[256] = "";
    for (int i = 0, k = 0; e->names[i].word; i++) {
        if (e->names[i].alias) continue;
        if (k) strcat(list, k + 1 == n ? " or " : ", ");
        strncat(list, e->names[i].word, sizeof list - strlen(list) - 8);
        k++;
    }
    cli_usage_error(x->cmd, "--%s %s %s, got '%s'", x->opt->name, e->verb ? e->verb : "expects", list, x->arg);
    return false;
}

/* A decimal in [lo, hi], written as plain digits when `digits` (strtoll alone also takes " 2" and "+2"). */
static bool store_int(const cli_ctx *x, void *at, bool digits)
{
    const cli_opt *o = x->opt;
    char name[80];
    snprintf(name, sizeof name, "--%s", o->name);
    bool plain = x->arg[0] != '\0';
    for (const char *q = x->arg; digits && *q && plain; q++) plain = *q >= '0' && *q <= '9';
    if (digits && !plain) {
        cli_usage_error(x->cmd, "%s expects an integer in [%lld, %lld] written as plain digits, got '%s'", name,
                        (long long)o->lo, (long long)o->hi, x->arg);
        return false;
    }
    int64_t v;
    if (!cli_parse_i64(x->cmd, name, x->arg, o->lo, o->hi, &v)) return false;
    put_int(at, o->size, v);
    return true;
}

/* A finite number in [flo, fhi], an end left out where it is open. */
static bool store_real(const cli_ctx *x, double *at)
{
    const cli_opt *o = x->opt;
    char *end = NULL;
    double v = strtod(x->arg, &end);
    if (!*x->arg || *end || !isfinite(v) || v < o->flo || ((o->open & CLI_LO_OPEN) && v == o->flo) || v > o->fhi ||
        ((o->open & CLI_HI_OPEN) && v == o->fhi)) {
        cli_usage_error(x->cmd, "--%s expects %s, got '%s'", o->name, o->want, x->arg);
        return false;
    }
    *at = v;
    return true;
}

/* The value of x's option into the args struct by its entry's kind, then fn, then the mark. */
static bool store(const cli_ctx *x)
{
    const cli_opt *o = x->opt;
    void *at = cli_target(x);
    bool ok = true;
    switch (o->kind) {
    case CLI_K_NONE: case CLI_K_HELP: break;
    case CLI_K_CONST: put_int(at, o->size, o->lo); break;
    case CLI_K_STR:
        if (o->want && !x->arg[0]) {
            cli_usage_error(x->cmd, "--%s needs %s, got an empty string", o->name, o->want);
            return false;
        }
        *(const char **)at = x->arg;
        break;
    case CLI_K_INT: ok = store_int(x, at, false); break;
    case CLI_K_DIGITS: ok = store_int(x, at, true); break;
    case CLI_K_REAL: ok = store_real(x, at); break;
    case CLI_K_ENUM: ok = store_enum(x, at); break;
    }
    if (ok && o->fn) ok = o->fn(x);
    if (ok && o->mark) *(bool *)((char *)x->args + o->mark - 1) = true;
    return ok;
}

int cli_parse(cli_parser *p, void *args, int argc, char **argv)
{
    optind = 1;
    int c;
    while ((c = cli_getopt(p, argc, argv)) != -1) {
        if (c == '?') return HP_EXIT_USAGE; /* cli_getopt said why */
        const cli_opt *o = entry(p, c, -1); /* an alias is its target */
        HP_ASSERT(o);
        if (o->kind == CLI_K_HELP) {
            HP_ASSERT(p->command); /* a table with --help belongs to a command */
            cli_help(stdout, p->command);
            return CLI_HELP;
        }
        cli_ctx x = {.cmd = p->cmd, .opt = o, .arg = o->arg ? optarg : NULL, .args = args};
        if (!store(&x)) return HP_EXIT_USAGE;
    }
    return HP_EXIT_OK;
}

bool cli_given(const cli_parser *p, int val)
{
    for (int i = 0; i < p->seen.n; i++)
        if (p->seen.val[i] == val) return true;
    return false;
}

/* ---- --help ---- */

/* Help column: options are listed as "  -o, --output FILE" padded to this width, the help beside them. */
#define HELP_COL 26

/* "  head   help", the help's further lines under its first; on a line of its own when head is too wide. */
static void print_item(FILE *out, const char *head, int n, const char *help)
{
    fprintf(out, "  %s", head);
    if (n + 2 >= HELP_COL - 1) fprintf(out, "\n%*s", HELP_COL, "");
    else fprintf(out, "%*s", HELP_COL - 2 - n, "");
    for (const char *h = help; *h; h++) {
        fputc(*h, out);
        if (*h == '\n' && h[1]) fprintf(out, "%*s", HELP_COL, "");
    }
    fputc('\n', out);
}

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
        print_item(out, head, n, o->help);
    }
}

/* One word of a form: an option of the table with its value's name ("[--out" ... "DIR]"), or the word itself. */
static void print_word(FILE *out, const cli_opt *t, const char *w, size_t len)
{
    size_t pre = 0, post = 0;
    while (pre < len && w[pre] == '[') pre++;
    while (post < len - pre && w[len - 1 - post] == ']') post++;
    const char *core = w + pre;
    size_t n = len - pre - post;
    if (n < 3 || strncmp(core, "--", 2) != 0) {
        fprintf(out, " %.*s", (int)len, w);
        return;
    }
    const cli_opt *o = t;
    while (o && o->name && !(strlen(o->name) == n - 2 && !strncmp(o->name, core + 2, n - 2))) o++;
    HP_ASSERT(o && o->name); /* a form names an option its table lacks: our bug */
    fprintf(out, " %.*s--%s%s%s%.*s", (int)pre, w, o->name, o->arg ? " " : "", o->arg ? o->arg : "", (int)post,
            core + n);
}

/* The synopsis: a line per form. */
static void print_forms(FILE *out, const cli_command *c)
{
    for (int i = 0; i < (int)(sizeof c->forms / sizeof *c->forms) && c->forms[i].words; i++) {
        const cli_form *f = &c->forms[i];
        fprintf(out, "%s%s%shyperpar %s", i ? "   or: " : "usage: ", f->launcher ? f->launcher : "",
                f->launcher ? " " : "", c->name ? c->name : c->cmd);
        for (const char *w = f->words; *w;) {
            size_t len = strcspn(w, " ");
            if (len) print_word(out, c->opts, w, len);
            w += len + (w[len] == ' ');
        }
        fprintf(out, " [options]\n");
    }
}

void cli_help(FILE *out, const cli_command *c)
{
    print_forms(out, c);
    if (c->about || c->about_more) fputc('\n', out);
    if (c->about) fputs(c->about, out);
    if (c->about_more) c->about_more(out);
    fputc('\n', out);
    for (const cli_arg *a = c->args; a && a->name; a++) print_item(out, a->name, (int)strlen(a->name), a->help);
    cli_print_options(out, c->opts);
    if (c->epilog || c->epilog_more) fputc('\n', out);
    if (c->epilog) fputs(c->epilog, out);
    if (c->epilog_more) c->epilog_more(out);
}

/* ---- values several commands take ---- */

const cli_enum cli_enum_compute = {NULL, {{"exact", HP_LINALG_EXACT, false}, {"bf16", HP_LINALG_BF16, false}}};

const char *cli_compute_name(hp_linalg_mode m) { return m == HP_LINALG_BF16 ? "bf16" : "exact"; }

bool cli_layout_fn(const cli_ctx *x)
{
    if (hp_expert_layout_parse(x->arg, cli_target(x))) return true;
    cli_usage_error(x->cmd, "--%s must be per-expert or batched, got '%s'", x->opt->name, x->arg);
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
