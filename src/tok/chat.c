/*
 * chat.c — a chat prompt in the model's own format (docs/tokenizer.md, "Chat"). Chat templates are Jinja
 * programs; hyperpar runs no Jinja. It recognises the ChatML family (<|im_start|>ROLE\nTEXT<|im_end|>\n per message,
 * then <|im_start|>assistant\n: SmolLM2, Qwen2) and renders that, with the default system message a template
 * writes itself when the first message is not a system one; any other template is refused by name.
 */
#include "tok/tok_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IM_START "<|im_start|>"
#define IM_END "<|im_end|>"

const char *hp_tok_chat_template(const hp_tok *tok)
{
    return tok->chat_template;
}

/* The default system message a ChatML template writes when the first message is not a system one: the literal
 * '<|im_start|>system\n' TEXT '<|im_end|>' quoted in the template (TEXT without quotes or braces), or NULL. */
static char *default_system(const char *tpl)
{
    static const char *const heads[] = {"'" IM_START "system\n", "'" IM_START "system\\n", "\"" IM_START "system\n",
                                        "\"" IM_START "system\\n"};
    for (size_t h = 0; h < sizeof heads / sizeof *heads; h++) {
        const char *p = strstr(tpl, heads[h]);
        if (!p) continue;
        p += strlen(heads[h]);
        const char *e = strstr(p, IM_END);
        if (!e || memchr(p, heads[h][0], (size_t)(e - p)) || memchr(p, '{', (size_t)(e - p))) continue;
        return strndup(p, (size_t)(e - p));
    }
    return NULL;
}

hp_status hp_tok_chat(const hp_tok *tok, const char *system, const char *user, char **out, hp_err *err)
{
    *out = NULL;
    const char *tpl = tok->chat_template;
    if (!tpl)
        return hp_err_set(err, HP_ERR_INPUT, "the tokenizer has no chat_template (tokenizer_config.json): give the "
                          "formatted prompt itself");
    if (!strstr(tpl, IM_START) || !strstr(tpl, IM_END) || !strstr(tpl, "add_generation_prompt") ||
        !strstr(tpl, "message['role']") || !strstr(tpl, "message['content']"))
        return hp_err_set(err, HP_ERR_INPUT, "the chat template is not a ChatML one (<|im_start|>role ... "
                          "<|im_end|>), the only kind hyperpar renders: give the formatted prompt itself");
    char *dflt = system ? NULL : default_system(tpl);
    const char *sys = system ? system : dflt;
    size_t n = strlen(user) + (sys ? strlen(sys) : 0) + 128;
    char *s = malloc(n);
    if (!s) {
        free(dflt);
        return hp_err_set(err, HP_ERR_NOMEM, "out of memory");
    }
    int k = 0;
    if (sys) k = snprintf(s, n, IM_START "system\n%s" IM_END "\n", sys);
    snprintf(s + k, n - (size_t)k, IM_START "user\n%s" IM_END "\n" IM_START "assistant\n", user);
    free(dflt);
    *out = s;
    return HP_OK;
}
