/*
 * cmd_generate.c — `hyperpar generate MODEL --ids LIST [--max-new-tokens N] [sampling] [mesh flags]`: the prompts
 * grown token by token under the plan (hp_generate, docs/generate.md), the tokens printed as they come.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "hyperpar/comm.h"
#include "hyperpar/overrides.h"
#include "hyperpar/run.h"
#include "hyperpar/safetensors.h"
#include "hyperpar/shard.h"
#include "hyperpar/tokenizer.h"
#include "inputflags.h"

enum { O_MAXNEW = 300, O_TEMP, O_TOPK, O_TOPP, O_EOS, O_COMPUTE, O_PLAN, O_NOKV, O_PROMPT, O_CHAT, O_SYSTEM, O_TOK };
#define G_INPUT "the prompts: --prompt TEXT, or ids: one of --input, --ids, --random-input (rows of the same length)"
#define G_PLAN "the plan (as 'hyperpar plan' derives it; default: a shard folder's own, else --tp = the processes)"
#define G_GEN "generation"

typedef struct gen_args {
    const char *model, *plan, *output, *eos;
    const char *prompt, *system, *tokenizer; /* --prompt, --system, --tokenizer */
    bool chat;
    cli_plan_flags pf;
    cli_input_flags in;
    bool default_mesh, no_kv;
    int threads;
    hp_linalg_mode compute;
    hp_generate_opts o;
} gen_args;

static const cli_opt g_opts[] = {
    CLI_OPT_HELP,
    {"max-new-tokens", 'n', "N", "tokens to add to each prompt at most (default 32)", CLI_SHORT, G_GEN,
     CLI_INT(gen_args, o.max_new, 0, 1 << 20)},
    {"temperature", O_TEMP, "T", "0 (default): greedy, the most likely token; > 0: sampled from the\n"
                                 "softmax of logits / T", 0, G_GEN,
     CLI_REAL(gen_args, o.temperature, 0, 1e6, 0, "a number in [0, 1e6]")},
    {"top-k", O_TOPK, "K", "sampled: only the K most likely tokens (ties at the K-th kept; 0: all)", 0, G_GEN,
     CLI_INT(gen_args, o.top_k, 0, INT32_MAX)},
    {"top-p", O_TOPP, "P", "sampled: only the most likely tokens whose probability together passes P\n"
                           "(nucleus; 1: all)", 0, G_GEN, CLI_RTOL(gen_args, o.top_p)},
    {"eos", O_EOS, "LIST|none", "ids that end a row (comma-separated; default: generation_config.json's\n"
                                "eos_token_id, else config.json's); none: every row runs --max-new-tokens", 0,
     G_GEN, CLI_STR(gen_args, eos)},
    {"output", 'o', "OUT", "rank 0 writes the rows, prompt and tokens, as input_ids I64 [B, S] (atomically;\n"
                           "a row that ended early repeats its eos)", CLI_SHORT, G_GEN, CLI_STR(gen_args, output)},
    {"no-kv-cache", O_NOKV, NULL, "run the whole rows at every step instead of the new token over a KV cache\n"
                                  "(the same ids; the reference the cache is checked against)", 0, G_GEN,
     CLI_FLAG(gen_args, no_kv)},
    {"threads", 't', "N", "threads per rank for the GEMMs", CLI_SHORT, NULL, CLI_INT(gen_args, threads, 1, 1024)},
    {"compute", O_COMPUTE, "M", "exact (default) or bf16 (activations rounded to bf16 for the GEMMs)", 0, NULL,
     CLI_ENUM(gen_args, compute, cli_enum_compute)},
    {"prompt", 'p', "TEXT", "the prompt as text, encoded by the model's tokenizer (its tokenizer.json);\n"
                            "the new tokens print as text", CLI_SHORT, G_INPUT, CLI_STR(gen_args, prompt)},
    {"chat", O_CHAT, NULL, "--prompt is a user's message: put it in the model's chat template (ChatML\n"
                           "templates: SmolLM2, Qwen2), the assistant's turn opened", 0, G_INPUT,
     CLI_FLAG(gen_args, chat)},
    {"system", O_SYSTEM, "TEXT", "--chat: the system message (default: the template's own, if any)", 0, G_INPUT,
     CLI_STR(gen_args, system)},
    {"tokenizer", O_TOK, "PATH", "the tokenizer.json (or its folder) for --prompt (default: MODEL's)", 0, G_INPUT,
     CLI_STR(gen_args, tokenizer)},
    CLI_OPTS_INPUT(G_INPUT, gen_args, in),
    CLI_OPTS_MESH(G_PLAN, gen_args, pf),
    CLI_OPTS_EP(G_PLAN, gen_args, pf),
    CLI_OPTS_PLAN(G_PLAN, gen_args, pf),
    {"plan", O_PLAN, "plan.json", "a plan written by 'hyperpar plan' instead of deriving one", 0, G_PLAN,
     CLI_STR(gen_args, plan)},
    {0},
};

static const cli_arg g_args[] = {{"MODEL", "a checkpoint folder (config.json + safetensors) or a shard folder"},
                                 {0}};

const cli_command cli_cmd_generate = {
    .cmd = "generate",
    .summary = "grow prompts token by token under the plan (greedy or sampled)",
    .forms = {{"[mpirun -np N]", "MODEL --prompt"}, {"[mpirun -np N]", "MODEL --ids"},
              {"[mpirun -np N]", "MODEL --input"}},
    .about = "Runs the prompts' rows forward across the ranks as the plan says (any mesh 'hyperpar run' takes),\n"
             "picks each row's next token from its last position's logits on rank 0 (greedy by default, or\n"
             "sampled with --temperature, --top-k and --top-p from splitmix64 seeded by --seed: the same seed\n"
             "draws the same tokens on every mesh), and repeats until every row produced an eos id or\n"
             "--max-new-tokens. One prompt: its new tokens print on stdout as they are produced; several: one\n"
             "line per row at the end. The prompts run once (prefill); each step then runs one new token per\n"
             "row over a KV cache of every earlier position (docs/generate.md).\n",
    .args = g_args,
    .opts = g_opts,
    .epilog = "Exit codes: 0 ok, 1 runtime failure, 2 bad input.\n",
    .run = cmd_generate,
};

/* --eos LIST: at most 8 non-negative ids below V; "none": none. */
static hp_status parse_eos(const char *s, int64_t V, hp_generate_opts *o, hp_err *err)
{
    o->n_eos = 0;
    if (!strcmp(s, "none")) return HP_OK;
    const char *p = s;
    while (*p) {
        char *end = NULL;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || v >= V || (*end && *end != ',') || o->n_eos == 8)
            return hp_err_set(err, HP_ERR_INPUT, "--eos expects 'none' or at most 8 comma-separated ids in [0, %lld), "
                              "got '%s'", (long long)V, s);
        o->eos[o->n_eos++] = v;
        p = *end ? end + 1 : end;
    }
    return HP_OK;
}

typedef struct stream {
    bool one;          /* one prompt: each token printed as it comes */
    const hp_tok *tok; /* --prompt: the tokens printed as text */
    int32_t *ids;      /* the new ids so far (text) */
    int64_t n, cap;
    size_t shown;      /* bytes of their text printed */
} stream;

/* The bytes of s that end with a whole UTF-8 character (a byte-level token may end inside one). */
static size_t whole_utf8(const char *s, size_t len)
{
    size_t i = len, k = 0;
    while (i > 0 && k < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--, k++;
    if (i == 0) return len;
    unsigned char c = (unsigned char)s[i - 1];
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need == k + 1 || need == 1 ? len : i - 1;
}

/* Prints the new text of s's ids (all of it when last). */
static void show_text(stream *s, bool last)
{
    char *text = NULL;
    size_t len = 0;
    hp_err err;
    if (hp_tok_decode(s->tok, s->ids, s->n, true, &text, &len, &err) != HP_OK) return;
    size_t upto = last ? len : whole_utf8(text, len);
    if (upto > s->shown) fwrite(text + s->shown, 1, upto - s->shown, stdout), s->shown = upto;
    fflush(stdout);
    free(text);
}

static void on_token(void *ctx, int64_t row, int64_t token)
{
    stream *s = ctx;
    (void)row;
    if (!s->one) return;
    if (!s->tok) {
        printf(" %" PRId64, token);
        fflush(stdout);
        return;
    }
    if (s->n == s->cap) {
        int64_t nc = s->cap ? 2 * s->cap : 64;
        int32_t *p = realloc(s->ids, (size_t)nc * sizeof *p);
        if (!p) return;
        s->ids = p, s->cap = nc;
    }
    s->ids[s->n++] = (int32_t)token;
    show_text(s, false);
}

/* --prompt's ids: the text (in the chat template with --chat) through the tokenizer. */
static hp_status prompt_ids(const gen_args *a, hp_tok **tok, int64_t **ids, int64_t *S, hp_err *err)
{
    hp_status st = hp_tok_load(a->tokenizer ? a->tokenizer : a->model, tok, err);
    char *chat = NULL;
    if (st == HP_OK && a->chat) st = hp_tok_chat(*tok, a->system, a->prompt, &chat, err);
    int32_t *t = NULL;
    int64_t n = 0;
    const char *text = chat ? chat : a->prompt;
    if (st == HP_OK) st = hp_tok_encode(*tok, text, strlen(text), !a->chat, &t, &n, err);
    free(chat);
    if (st == HP_OK && n == 0) st = hp_err_set(err, HP_ERR_INPUT, "--prompt gives no tokens");
    if (st == HP_OK && !(*ids = malloc((size_t)n * sizeof **ids)))
        st = hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; st == HP_OK && i < n; i++) (*ids)[i] = t[i];
    free(t);
    if (st == HP_OK) *S = n;
    return st;
}

static hp_status write_ids(const char *path, const int64_t *ids, int64_t B, int64_t S, hp_err *err)
{
    hp_st_writer *w = hp_st_writer_create();
    if (!w) return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    int64_t shape[2] = {B, S};
    hp_status st = hp_st_writer_add(w, CLI_IDS_KEY, HP_DT_I64, 2, shape, ids, err);
    if (st == HP_OK) st = hp_st_writer_write(w, path, err);
    hp_st_writer_destroy(w);
    return st;
}

/* Rank 0's rows on stdout: one prompt's tokens were streamed; several: each row's new tokens up to its eos. */
static void print_rows(const gen_args *a, const int64_t *ids, int64_t B, int64_t S0, int64_t S)
{
    if (B == 1) {
        printf("\n");
        return;
    }
    for (int64_t b = 0; b < B; b++) {
        printf("%lld:", (long long)b);
        for (int64_t s = S0; s < S; s++) {
            int64_t t = ids[b * S + s];
            printf(" %" PRId64, t);
            bool end = false;
            for (int i = 0; i < a->o.n_eos; i++) end = end || a->o.eos[i] == t;
            if (end) break;
        }
        printf("\n");
    }
}

static int generate(gen_args *a, const cli_parser *cp, int *argc, char ***argv)
{
    hp_err err;
    hp_err_clear(&err);
    hp_comm *w = NULL;
    if (hp_comm_world(&w, argc, argv, &err) != HP_OK) return cli_fail(&err);
    /* Before anything that differs by rank: every option but --threads as rank 0's, inputs by their identity. */
    static const int free_vals[] = {'t'};
    static const cli_agree_input agree_inputs[] = {{CLI_O_INPUT, cli_file_identity}, {O_PLAN, cli_file_identity},
                                                   {CLI_O_OVERRIDES, cli_file_identity}};
    if (cli_agree_flags(w, cp, free_vals, 1, agree_inputs, 3, &err) != HP_OK) {
        int code = cli_collective_exit(w, HP_ERR_INPUT, &err, true);
        hp_comm_free(w);
        return code;
    }
    hp_model *m = NULL;
    hp_plan *p = NULL;
    hp_overrides *ov = NULL;
    hp_runner *r = NULL;
    int64_t *ids = NULL, *out = NULL, B = 0, S0 = 0, S = 0;
    hp_status st = HP_OK;
    char omsg[8400];
    const char *const inputs[] = {a->in.input, a->pf.overrides, a->plan};
    if (a->output && cli_output_problem("--output", a->output, a->model, inputs, 3, omsg, sizeof omsg))
        st = hp_err_set(&err, HP_ERR_INPUT, "%s", omsg);
    bool shard = hp_shard_is_folder(a->model);
    if (st == HP_OK) st = shard ? hp_moe_shard_config_open(&m, a->model, &err) : hp_model_open(&m, a->model, NULL, &err);
    if (st == HP_OK)
        st = cli_plan_resolve(&a->pf, a->plan, shard ? a->model : NULL, a->default_mesh, hp_comm_size(w), m, &p, &ov,
                              &err);
    if (st == HP_OK) st = a->eos ? parse_eos(a->eos, m->cfg.vocab_size, &a->o, &err) : hp_generate_default_eos(m, &a->o, &err);
    hp_tok *tok = NULL;
    if (st == HP_OK && a->prompt) {
        st = prompt_ids(a, &tok, &ids, &S0, &err);
        B = 1;
    } else if (st == HP_OK) {
        st = hp_ids_load(&a->in.src, m->cfg.vocab_size, &ids, &B, &S0, &err);
    }
    if (st == HP_OK) a->o.seed = a->in.src.seed; /* --seed (inputflags.c keeps it in the source) */
    st = hp_comm_agree(w, st, &err);
    if (st == HP_OK) {
        cli_threads_info ti;
        cli_threads(w, a->threads, &ti);
        hp_run_opts ro = {.command = "generate", .shards = shard ? a->model : NULL, .compute = a->compute,
                          .kv_cache = a->no_kv ? 0 : S0 + a->o.max_new};
        st = hp_runner_create(&r, w, m, p, &ro, &err);
    }
    stream sm = {.one = B == 1, .tok = tok};
    if (st == HP_OK && hp_comm_rank(w) == 0 && tok) {
        fwrite(a->prompt, 1, strlen(a->prompt), stdout);
        if (a->chat) fputc('\n', stdout); /* the user's message, then the assistant's answer */
        fflush(stdout);
    } else if (st == HP_OK && hp_comm_rank(w) == 0 && B == 1) {
        printf("%" PRId64 " prompt tokens:", S0);
        fflush(stdout);
    }
    if (st == HP_OK) st = hp_generate(r, ids, B, S0, &a->o, on_token, &sm, &out, &S, &err);
    if (st == HP_OK && hp_comm_rank(w) == 0) {
        if (tok) show_text(&sm, true);
        print_rows(a, out, B, S0, S);
        if (a->output) st = write_ids(a->output, out, B, S, &err);
    }
    st = hp_comm_agree(w, st, &err);
    free(out);
    free(ids);
    free(sm.ids);
    hp_tok_free(tok);
    hp_runner_free(r);
    hp_plan_free(p);
    hp_overrides_free(ov);
    hp_model_close(m);
    int code = cli_collective_exit(w, st, &err, true);
    hp_comm_free(w);
    return code;
}

int cmd_generate(int argc, char **argv)
{
    gen_args a = {0};
    hp_generate_opts_default(&a.o);
    cli_plan_flags_init(&a.pf);
    cli_parser cp = {.command = &cli_cmd_generate};
    int prc = cli_parse(&cp, &a, argc, argv);
    if (prc != HP_EXIT_OK) return prc == CLI_HELP ? HP_EXIT_OK : prc;
    if (optind >= argc) return cli_usage_error("generate", "missing MODEL");
    if (optind + 1 < argc) return cli_usage_error("generate", "unexpected argument '%s'", argv[optind + 1]);
    a.model = argv[optind];
    /* --seed seeds the sampling too (and --random-input's ids when given), so it needs no --random-input here */
    bool seeded = a.in.seed_given;
    if (!a.in.random) a.in.seed_given = false;
    if (a.prompt && (a.in.input || a.in.ids || a.in.random))
        return cli_usage_error("generate", "--prompt and %s are two prompts; give one of them",
                               a.in.input ? "--input" : a.in.ids ? "--ids" : "--random-input");
    if (!a.prompt && (a.chat || a.system || a.tokenizer))
        return cli_usage_error("generate", "--chat, --system and --tokenizer belong to --prompt TEXT");
    if (a.system && !a.chat) return cli_usage_error("generate", "--system is a chat's: give --chat too");
    int irc = a.prompt ? HP_EXIT_OK : cli_input_check("generate", &a.in, 0, 0);
    a.in.seed_given = seeded;
    if (irc != HP_EXIT_OK) return irc;
    if (a.plan && cli_plan_flags_any(&a.pf))
        return cli_usage_error("generate", "give either --plan or the plan flags (--mesh, --tp, ...), not both");
    if (a.o.temperature == 0 && (cli_given(&cp, O_TOPK) || cli_given(&cp, O_TOPP)))
        return cli_usage_error("generate", "--top-k and --top-p filter a sampled pick: give --temperature > 0");
    a.default_mesh = cli_plan_flags_default_mesh(&a.pf);
    if (!a.default_mesh) {
        int rc = cli_plan_flags_mesh("generate", &a.pf, 1);
        if (rc != HP_EXIT_OK) return rc;
    }
    return generate(&a, &cp, &argc, &argv);
}
