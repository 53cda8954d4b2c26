/* Chat templates without a Jinja engine: recognition of a model folder's template among the
 * families' released ones (chat_template_known.c), one renderer per template written out
 * from its Jinja text (checked against transformers by tests/test_sft.c on
 * tests/data/sft/golden.json), JSONL conversations parsed into messages, and the token ids
 * with the assistant-only mask. */
#include "hyperparallel/chat_template.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/chat_template-impl.h"
#include "tokenizer-impl.h"   /* hp_tok_utf8_get: Python's str.strip on code points */

enum kind { K_QWEN25, K_CHATML, K_QWEN3, K_LLAMA2, K_LLAMA3, K_LLAMA31, K_MISTRAL01, K_MISTRAL, K_GEMMA, K_DSV3 };
static const struct { const char *name; enum kind kind; } kinds_[] = {
    {"qwen2.5", K_QWEN25}, {"chatml", K_CHATML}, {"qwen3", K_QWEN3},        {"llama2", K_LLAMA2},
    {"llama3", K_LLAMA3},  {"llama3.1", K_LLAMA31}, {"mistral-v0.1", K_MISTRAL01}, {"mistral", K_MISTRAL},
    {"gemma", K_GEMMA},    {"deepseek_v3", K_DSV3},
};
/* family names that pick a template (data.chat_template = qwen2) */
static const struct { const char *family, *name; } aliases_[] = {{"qwen2", "qwen2.5"}, {"deepseek", "deepseek_v3"}};

struct hp_chat_template {
    enum kind kind;
    int known;      /* index into hp_chat_known */
    char *bos, *eos;
};

const char *hp_chat_template_names(void) {
    static char names[512];
    if (!names[0]) {
        size_t o = 0;
        for (int i = 0; i < hp_chat_known_count; i++)
            o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", i ? ", " : "", hp_chat_known[i].name);
    }
    return names;
}

/* ---- recognition ---------------------------------------------------------------------- */

/* The normalised text: trimmed, CR LF -> LF, backslash-n -> LF (a Jinja string literal may
 * spell a newline either way; tokenizer_config.json files and .jinja copies differ there). */
static char *normalise(const char *s, size_t *n) {
    size_t len = strlen(s);
    while (len && (s[len - 1] == ' ' || s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == '\t')) len--;
    while (len && (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t')) s++, len--;
    char *o = hp_malloc(len + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '\r' && i + 1 < len && s[i + 1] == '\n') continue;
        if (s[i] == '\\' && i + 1 < len && s[i + 1] == 'n') {
            o[k++] = '\n';
            i++;
            continue;
        }
        o[k++] = s[i];
    }
    o[k] = 0;
    *n = k;
    return o;
}

hp_status_t hp_chat_template_recognize(const char *text, const char **name) {
    *name = NULL;
    size_t n;
    char *a = normalise(text, &n);
    if (!a) return hp_error(HP_ERR_OOM, "chat template: out of memory");
    int best = -1;
    size_t best_at = 0;
    for (int i = 0; i < hp_chat_known_count; i++) {
        size_t m;
        char *b = normalise(hp_chat_known[i].text, &m);
        if (!b) {
            free(a);
            return hp_error(HP_ERR_OOM, "chat template: out of memory");
        }
        size_t at = 0;
        while (at < n && at < m && a[at] == b[at]) at++;
        free(b);
        if (at == n && at == m) {
            free(a);
            *name = hp_chat_known[i].name;
            return HP_OK;
        }
        if (best < 0 || at > best_at) best = i, best_at = at;
    }
    char snip[48];
    size_t sl = n - best_at < 40 ? n - best_at : 40;
    memcpy(snip, a + best_at, sl);
    snip[sl] = 0;
    for (size_t i = 0; i < sl; i++)
        if (snip[i] == '\n') snip[i] = ' ';
    free(a);
    return hp_error(HP_ERR_UNSUPPORTED,
                    "the chat template (%zu bytes) is none of the known ones (%s): the closest, %s (%s), differs at byte "
                    "%zu (\"%s\"); hint: set data.chat_template to the name of the template the model was trained "
                    "with (docs/finetune.md), which is rendered instead",
                    strlen(text), hp_chat_template_names(), hp_chat_known[best].name, hp_chat_known[best].models,
                    best_at, snip);
}

hp_status_t hp_chat_template_create(const char *name, const char *bos, const char *eos, hp_chat_template_t *out) {
    *out = NULL;
    for (size_t a = 0; a < sizeof aliases_ / sizeof aliases_[0]; a++)
        if (strcmp(name, aliases_[a].family) == 0) name = aliases_[a].name;
    int known = -1;
    for (int i = 0; i < hp_chat_known_count; i++)
        if (strcmp(hp_chat_known[i].name, name) == 0) known = i;
    int k = -1;
    for (size_t i = 0; i < sizeof kinds_ / sizeof kinds_[0]; i++)
        if (strcmp(kinds_[i].name, name) == 0) k = (int)kinds_[i].kind;
    if (known < 0 || k < 0)
        return hp_error(HP_ERR_INVALID_ARG,
                        "data.chat_template = '%s' is not a known chat template; expected one of %s (or the family "
                        "names qwen2, deepseek); hint: docs/finetune.md lists the models of each",
                        name, hp_chat_template_names());
    hp_chat_template_t t = hp_calloc(1, sizeof *t);
    if (!t) return hp_error(HP_ERR_OOM, "chat template: out of memory");
    t->kind = (enum kind)k;
    t->known = known;
    t->bos = strdup(bos ? bos : "");
    t->eos = strdup(eos ? eos : "");
    if (!t->bos || !t->eos) {
        hp_chat_template_free(t);
        return hp_error(HP_ERR_OOM, "chat template: out of memory");
    }
    *out = t;
    return HP_OK;
}

hp_status_t hp_chat_template_from_tokenizer(hp_tokenizer_t tok, const char *name, hp_chat_template_t *out) {
    *out = NULL;
    int32_t b = hp_tokenizer_bos_id(tok), e = hp_tokenizer_eos_id(tok);
    const char *bos = b >= 0 ? hp_tokenizer_id_to_token(tok, b) : NULL;
    const char *eos = e >= 0 ? hp_tokenizer_id_to_token(tok, e) : NULL;
    if (name && *name) return hp_chat_template_create(name, bos, eos, out);
    const char *text = hp_tokenizer_chat_template(tok, NULL);
    if (!text)
        return hp_error(HP_ERR_INVALID_ARG,
                        "the tokenizer has no chat template (tokenizer.path should be a model folder whose "
                        "tokenizer_config.json has chat_template, or that holds chat_template.jinja); hint: set "
                        "data.chat_template to one of %s",
                        hp_chat_template_names());
    const char *known;
    HP_TRY(hp_chat_template_recognize(text, &known));
    return hp_chat_template_create(known, bos, eos, out);
}

void hp_chat_template_free(hp_chat_template_t t) {
    if (!t) return;
    free(t->bos);
    free(t->eos);
    free(t);
}

const char *hp_chat_template_name(hp_chat_template_t t) { return hp_chat_known[t->known].name; }
const char *hp_chat_template_models(hp_chat_template_t t) { return hp_chat_known[t->known].models; }

/* ---- rendering ------------------------------------------------------------------------ */

typedef struct str {
    const char *p;
    size_t n;
} str_t;

void hp_chat_render_free(hp_chat_render_t *r) {
    free(r->text);
    free(r->spans);
    memset(r, 0, sizeof *r);
}

static hp_status_t put(hp_chat_render_t *r, const char *p, size_t n) {
    if (r->len + n + 1 > r->cap) {
        size_t nc = r->cap ? r->cap : 256;
        while (nc < r->len + n + 1) nc *= 2;
        char *t = realloc(r->text, nc);
        if (!t) return hp_error(HP_ERR_OOM, "chat template: out of memory rendering %zu bytes", nc);
        r->text = t;
        r->cap = nc;
    }
    memcpy(r->text + r->len, p, n);
    r->len += n;
    r->text[r->len] = 0;
    return HP_OK;
}
static hp_status_t puts_(hp_chat_render_t *r, const char *s) { return put(r, s, strlen(s)); }
static hp_status_t puts2(hp_chat_render_t *r, str_t s) { return put(r, s.p, s.n); }

/* Opens (begin) or closes a span at the current end of the text. */
static hp_status_t mark(hp_chat_render_t *r, bool begin) {
    if (begin) {
        if (r->n_spans == r->spans_cap) {
            size_t nc = r->spans_cap ? 2 * r->spans_cap : 8;
            size_t(*s)[2] = realloc(r->spans, nc * sizeof *s);
            if (!s) return hp_error(HP_ERR_OOM, "chat template: out of memory");
            r->spans = s;
            r->spans_cap = nc;
        }
        r->spans[r->n_spans][0] = r->spans[r->n_spans][1] = r->len;
        r->n_spans++;
    } else {
        r->spans[r->n_spans - 1][1] = r->len;
    }
    return HP_OK;
}

/* Python's str.isspace code points (str.strip() and Jinja's trim strip them). */
static bool py_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}
/* str.strip() */
static str_t strip_ws(str_t s) {
    while (s.n) {
        uint32_t c;
        int k = hp_tok_utf8_get(s.p, s.n, &c);
        if (k <= 0 || !py_space(c)) break;
        s.p += k, s.n -= (size_t)k;
    }
    while (s.n) {   /* step back over one UTF-8 character */
        size_t k = 1;
        while (k < s.n && k < 4 && ((unsigned char)s.p[s.n - k] & 0xc0) == 0x80) k++;
        uint32_t c;
        if (hp_tok_utf8_get(s.p + s.n - k, k, &c) != (int)k || !py_space(c)) break;
        s.n -= k;
    }
    return s;
}
static str_t lstrip_nl(str_t s) {
    while (s.n && *s.p == '\n') s.p++, s.n--;
    return s;
}
static str_t rstrip_nl(str_t s) {
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}
static const char *find(str_t h, const char *needle, bool last) {
    size_t k = strlen(needle);
    const char *hit = NULL;
    for (size_t i = 0; i + k <= h.n; i++)
        if (memcmp(h.p + i, needle, k) == 0) {
            hit = h.p + i;
            if (!last) break;
        }
    return hit;
}
static bool starts(str_t s, const char *p) { size_t k = strlen(p); return s.n >= k && memcmp(s.p, p, k) == 0; }
static bool ends(str_t s, const char *p) { size_t k = strlen(p); return s.n >= k && memcmp(s.p + s.n - k, p, k) == 0; }

static const char *role_names_[] = {"system", "user", "assistant", "tool"};
static str_t content(const hp_chat_message_t *m) { return (str_t){m->content, m->content_len}; }

/* transformers' tojson of a string (json.dumps, ensure_ascii=False) */
static hp_status_t put_json_string(hp_chat_render_t *r, str_t s) {
    HP_TRY(put(r, "\"", 1));
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        char e[8];
        const char *x = NULL;
        if (c == '"') x = "\\\"";
        else if (c == '\\') x = "\\\\";
        else if (c == '\n') x = "\\n";
        else if (c == '\r') x = "\\r";
        else if (c == '\t') x = "\\t";
        else if (c == '\b') x = "\\b";
        else if (c == '\f') x = "\\f";
        else if (c < 0x20) snprintf(e, sizeof e, "\\u%04x", c), x = e;
        if (x) HP_TRY(puts_(r, x));
        else HP_TRY(put(r, s.p + i, 1));
    }
    return put(r, "\"", 1);
}

static hp_status_t refuse(const char *what) {
    return hp_error(HP_ERR_INVALID_ARG, "%s", what);
}
static const char *alternate_ = "Conversation roles must alternate user/assistant/user/assistant/... (the template's "
                                "own check); hint: start with a user message and alternate (a system message may "
                                "come first where the template takes one)";

/* ChatML line: '<|im_start|>' + role + '\n' + content + '<|im_end|>' + '\n' (a span when trained) */
static hp_status_t chatml_line(hp_chat_render_t *r, const char *role, str_t c, bool span) {
    HP_TRY(puts_(r, "<|im_start|>"));
    HP_TRY(puts_(r, role));
    HP_TRY(puts_(r, "\n"));
    if (span) HP_TRY(mark(r, true));
    HP_TRY(puts2(r, c));
    HP_TRY(puts_(r, "<|im_end|>"));
    if (span) HP_TRY(mark(r, false));
    return puts_(r, "\n");
}

/* Qwen2.5 / Qwen3 tool messages: consecutive ones share one user turn. */
static hp_status_t qwen_tool(hp_chat_render_t *r, const hp_chat_message_t *m, size_t n, size_t i) {
    if (i == 0 || m[i - 1].role != HP_CHAT_TOOL) HP_TRY(puts_(r, "<|im_start|>user"));
    HP_TRY(puts_(r, "\n<tool_response>\n"));
    HP_TRY(puts2(r, content(&m[i])));
    HP_TRY(puts_(r, "\n</tool_response>"));
    if (i + 1 == n || m[i + 1].role != HP_CHAT_TOOL) HP_TRY(puts_(r, "<|im_end|>\n"));
    return HP_OK;
}

static hp_status_t render_qwen3(hp_chat_render_t *r, const hp_chat_message_t *m, size_t n, size_t ft) {
    if (m[0].role == HP_CHAT_SYSTEM) HP_TRY(chatml_line(r, "system", content(&m[0]), false));
    /* the last user query: the last user message that is not a tool response */
    size_t lqi = n - 1;
    for (size_t k = n; k-- > 0;) {
        str_t c = content(&m[k]);
        if (m[k].role == HP_CHAT_USER && !(starts(c, "<tool_response>") && ends(c, "</tool_response>"))) {
            lqi = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const hp_chat_message_t *x = &m[i];
        if (x->role == HP_CHAT_USER || (x->role == HP_CHAT_SYSTEM && i > 0)) {
            HP_TRY(chatml_line(r, role_names_[x->role], content(x), false));
        } else if (x->role == HP_CHAT_ASSISTANT) {
            str_t c = content(x), reasoning = {"", 0};
            if (x->reasoning) {
                reasoning = (str_t){x->reasoning, x->reasoning_len};
            } else if (find(c, "</think>", false)) {
                const char *last = find(c, "</think>", true), *first = find(c, "</think>", false);
                str_t after = {last + 8, (size_t)(c.p + c.n - (last + 8))};
                str_t before = rstrip_nl((str_t){c.p, (size_t)(first - c.p)});
                const char *open = find(before, "<think>", true);
                if (open) before = (str_t){open + 7, (size_t)(before.p + before.n - (open + 7))};
                reasoning = lstrip_nl(before);
                c = lstrip_nl(after);
            }
            const bool span = i >= ft;
            HP_TRY(puts_(r, "<|im_start|>assistant\n"));
            if (span) HP_TRY(mark(r, true));
            if (i > lqi && (i + 1 == n || reasoning.n > 0)) {
                HP_TRY(puts_(r, "<think>\n"));
                HP_TRY(puts2(r, rstrip_nl(lstrip_nl(reasoning))));
                HP_TRY(puts_(r, "\n</think>\n\n"));
                HP_TRY(puts2(r, lstrip_nl(c)));
            } else {
                HP_TRY(puts2(r, c));
            }
            HP_TRY(puts_(r, "<|im_end|>"));
            if (span) HP_TRY(mark(r, false));
            HP_TRY(puts_(r, "\n"));
        } else if (x->role == HP_CHAT_TOOL) {
            HP_TRY(qwen_tool(r, m, n, i));
        }
    }
    return HP_OK;
}

static hp_status_t render_body(hp_chat_template_t t, hp_chat_render_t *r, const hp_chat_message_t *m, size_t n,
                               size_t ft, bool gen) {
    switch (t->kind) {
    case K_CHATML:
        for (size_t i = 0; i < n; i++)
            HP_TRY(chatml_line(r, role_names_[m[i].role], content(&m[i]), m[i].role == HP_CHAT_ASSISTANT && i >= ft));
        if (gen) HP_TRY(puts_(r, "<|im_start|>assistant\n"));
        return HP_OK;
    case K_QWEN25:
        if (m[0].role == HP_CHAT_SYSTEM) HP_TRY(chatml_line(r, "system", content(&m[0]), false));
        else HP_TRY(puts_(r, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                             "assistant.<|im_end|>\n"));
        for (size_t i = 0; i < n; i++) {
            if (m[i].role == HP_CHAT_TOOL) HP_TRY(qwen_tool(r, m, n, i));
            else if (m[i].role != HP_CHAT_SYSTEM || i > 0)
                HP_TRY(chatml_line(r, role_names_[m[i].role], content(&m[i]), m[i].role == HP_CHAT_ASSISTANT && i >= ft));
        }
        if (gen) HP_TRY(puts_(r, "<|im_start|>assistant\n"));
        return HP_OK;
    case K_QWEN3:
        HP_TRY(render_qwen3(r, m, n, ft));
        if (gen) HP_TRY(puts_(r, "<|im_start|>assistant\n"));
        return HP_OK;
    case K_LLAMA2: {
        size_t s = m[0].role == HP_CHAT_SYSTEM ? 1 : 0;
        for (size_t i = s; i < n; i++) {
            size_t j = i - s;
            if ((m[i].role == HP_CHAT_USER) != (j % 2 == 0)) return refuse(alternate_);
            if (m[i].role != HP_CHAT_USER && m[i].role != HP_CHAT_ASSISTANT)
                return hp_error(HP_ERR_INVALID_ARG, "the llama2 template does not take a %s message here (its "
                                "Jinja text would drop it silently); hint: remove it or fold it into a user "
                                "message", role_names_[m[i].role]);
            hp_chat_render_t tmp = {0};   /* '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + content, stripped */
            str_t c = content(&m[i]);
            if (j == 0 && s) {
                hp_status_t st = puts_(&tmp, "<<SYS>>\n");
                if (st == HP_OK) st = puts2(&tmp, content(&m[0]));
                if (st == HP_OK) st = puts_(&tmp, "\n<</SYS>>\n\n");
                if (st == HP_OK) st = puts2(&tmp, c);
                if (st != HP_OK) {
                    hp_chat_render_free(&tmp);
                    return st;
                }
                c = (str_t){tmp.text, tmp.len};
            }
            hp_status_t st = HP_OK;
            if (m[i].role == HP_CHAT_USER) {
                st = puts_(r, t->bos);
                if (st == HP_OK) st = puts_(r, "[INST] ");
                if (st == HP_OK) st = puts2(r, strip_ws(c));
                if (st == HP_OK) st = puts_(r, " [/INST]");
            } else {
                const bool span = i >= ft;
                if (span) st = mark(r, true);
                if (st == HP_OK) st = puts_(r, " ");
                if (st == HP_OK) st = puts2(r, strip_ws(c));
                if (st == HP_OK) st = puts_(r, " ");
                if (st == HP_OK) st = puts_(r, t->eos);
                if (st == HP_OK && span) st = mark(r, false);
            }
            hp_chat_render_free(&tmp);
            HP_TRY(st);
        }
        return HP_OK;   /* the template has no generation prompt */
    }
    case K_LLAMA3:
        for (size_t i = 0; i < n; i++) {
            if (i == 0) HP_TRY(puts_(r, t->bos));
            HP_TRY(puts_(r, "<|start_header_id|>"));
            HP_TRY(puts_(r, role_names_[m[i].role]));
            HP_TRY(puts_(r, "<|end_header_id|>\n\n"));
            const bool span = m[i].role == HP_CHAT_ASSISTANT && i >= ft;
            if (span) HP_TRY(mark(r, true));
            HP_TRY(puts2(r, strip_ws(content(&m[i]))));
            HP_TRY(puts_(r, "<|eot_id|>"));
            if (span) HP_TRY(mark(r, false));
        }
        if (gen) HP_TRY(puts_(r, "<|start_header_id|>assistant<|end_header_id|>\n\n"));
        return HP_OK;
    case K_LLAMA31: {
        HP_TRY(puts_(r, t->bos));
        HP_TRY(puts_(r, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                        "Today Date: 26 Jul 2024\n\n"));
        size_t s = m[0].role == HP_CHAT_SYSTEM ? 1 : 0;
        if (s) HP_TRY(puts2(r, strip_ws(content(&m[0]))));
        HP_TRY(puts_(r, "<|eot_id|>"));
        for (size_t i = s; i < n; i++) {
            if (m[i].role == HP_CHAT_TOOL) {   /* a string is `iterable` to Jinja: tojson quotes it */
                HP_TRY(puts_(r, "<|start_header_id|>ipython<|end_header_id|>\n\n"));
                HP_TRY(put_json_string(r, content(&m[i])));
                HP_TRY(puts_(r, "<|eot_id|>"));
                continue;
            }
            HP_TRY(puts_(r, "<|start_header_id|>"));
            HP_TRY(puts_(r, role_names_[m[i].role]));
            HP_TRY(puts_(r, "<|end_header_id|>\n\n"));
            const bool span = m[i].role == HP_CHAT_ASSISTANT && i >= ft;
            if (span) HP_TRY(mark(r, true));
            HP_TRY(puts2(r, strip_ws(content(&m[i]))));
            HP_TRY(puts_(r, "<|eot_id|>"));
            if (span) HP_TRY(mark(r, false));
        }
        if (gen) HP_TRY(puts_(r, "<|start_header_id|>assistant<|end_header_id|>\n\n"));
        return HP_OK;
    }
    case K_MISTRAL01:
    case K_MISTRAL:
        HP_TRY(puts_(r, t->bos));
        for (size_t i = 0; i < n; i++) {
            if ((m[i].role == HP_CHAT_USER) != (i % 2 == 0)) return refuse(alternate_);
            if (m[i].role == HP_CHAT_USER) {
                HP_TRY(puts_(r, "[INST] "));
                HP_TRY(puts2(r, content(&m[i])));
                HP_TRY(puts_(r, " [/INST]"));
            } else if (m[i].role == HP_CHAT_ASSISTANT) {
                const bool span = i >= ft;
                if (span) HP_TRY(mark(r, true));
                HP_TRY(puts2(r, content(&m[i])));
                HP_TRY(puts_(r, t->eos));
                if (span) HP_TRY(mark(r, false));
                if (t->kind == K_MISTRAL01) HP_TRY(puts_(r, " "));
            } else {
                return refuse("Only user and assistant roles are supported! (the template's own check); hint: fold "
                              "system and tool text into a user message");
            }
        }
        return HP_OK;   /* no generation prompt */
    case K_GEMMA:
        if (m[0].role == HP_CHAT_SYSTEM)
            return refuse("System role not supported (the gemma template's own check); hint: put the system text "
                          "into the first user message");
        HP_TRY(puts_(r, t->bos));
        for (size_t i = 0; i < n; i++) {
            if ((m[i].role == HP_CHAT_USER) != (i % 2 == 0)) return refuse(alternate_);
            HP_TRY(puts_(r, "<start_of_turn>"));
            HP_TRY(puts_(r, m[i].role == HP_CHAT_ASSISTANT ? "model" : role_names_[m[i].role]));
            HP_TRY(puts_(r, "\n"));
            const bool span = m[i].role == HP_CHAT_ASSISTANT && i >= ft;
            if (span) HP_TRY(mark(r, true));
            HP_TRY(puts2(r, strip_ws(content(&m[i]))));
            HP_TRY(puts_(r, "<end_of_turn>"));
            if (span) HP_TRY(mark(r, false));
            HP_TRY(puts_(r, "\n"));
        }
        if (gen) HP_TRY(puts_(r, "<start_of_turn>model\n"));
        return HP_OK;
    case K_DSV3: {
        static const char *eos = "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
        HP_TRY(puts_(r, t->bos));
        bool first_sp = true, is_tool = false, out_first = true;
        for (size_t i = 0; i < n; i++)
            if (m[i].role == HP_CHAT_SYSTEM) {
                if (!first_sp) HP_TRY(puts_(r, "\n\n"));
                HP_TRY(puts2(r, content(&m[i])));
                first_sp = false;
            }
        for (size_t i = 0; i < n; i++) {
            const hp_chat_message_t *x = &m[i];
            if (x->role == HP_CHAT_USER) {
                is_tool = false;
                HP_TRY(puts_(r, "<\xef\xbd\x9cUser\xef\xbd\x9c>"));
                HP_TRY(puts2(r, content(x)));
            } else if (x->role == HP_CHAT_ASSISTANT) {
                HP_TRY(puts_(r, is_tool ? "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81" "end\xef\xbd\x9c>"
                                        : "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"));
                is_tool = false;
                const bool span = i >= ft;
                if (span) HP_TRY(mark(r, true));
                HP_TRY(puts2(r, content(x)));
                HP_TRY(puts_(r, eos));
                if (span) HP_TRY(mark(r, false));
            } else if (x->role == HP_CHAT_TOOL) {
                is_tool = true;   /* is_output_first is never set back: the released template's behaviour */
                HP_TRY(puts_(r, out_first ? "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81" "begin\xef\xbd\x9c>"
                                            "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81" "begin\xef\xbd\x9c>"
                                          : "\n<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81" "begin\xef\xbd\x9c>"));
                out_first = false;
                HP_TRY(puts2(r, content(x)));
                HP_TRY(puts_(r, "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81" "end\xef\xbd\x9c>"));
            }
        }
        if (is_tool) HP_TRY(puts_(r, "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81" "end\xef\xbd\x9c>"));
        if (gen && !is_tool) HP_TRY(puts_(r, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"));
        return HP_OK;
    }
    }
    return hp_error(HP_ERR_STATE, "chat template: unknown renderer %d", (int)t->kind);
}

hp_status_t hp_chat_template_render(hp_chat_template_t t, const hp_chat_message_t *m, size_t n, size_t first_trained,
                                    bool add_generation_prompt, hp_chat_render_t *r) {
    r->len = 0;
    r->n_spans = 0;
    HP_TRY(put(r, "", 0));
    if (n == 0) return hp_error(HP_ERR_INVALID_ARG, "chat template %s: no messages", hp_chat_template_name(t));
    hp_status_t st = render_body(t, r, m, n, first_trained, add_generation_prompt);
    if (st != HP_OK) return hp_error_prefix(st, "chat template %s: ", hp_chat_template_name(t));
    return HP_OK;
}

/* ---- JSONL samples -------------------------------------------------------------------- */

void hp_chat_sample_free(hp_chat_sample_t *s) {
    json_object_put(s->json);
    free(s->m);
    memset(s, 0, sizeof *s);
}

static hp_status_t add_message(hp_chat_sample_t *s, json_object *o, const char *where, const char *field, size_t k) {
    if (!json_object_is_type(o, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%s%s[%zu] is not an object; expected {\"role\": ..., \"content\": ...}", where,
                        field, k);
    json_object *role = NULL, *c = NULL, *tc = NULL;
    if (!json_object_object_get_ex(o, "role", &role) || !json_object_is_type(role, json_type_string))
        return hp_error(HP_ERR_FORMAT, "%s%s[%zu]: no string \"role\"; expected one of system, user, assistant, tool",
                        where, field, k);
    const char *rn = json_object_get_string(role);
    int ri = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(rn, role_names_[i]) == 0) ri = i;
    if (ri < 0)
        return hp_error(HP_ERR_FORMAT, "%s%s[%zu]: unknown role \"%s\"; expected one of system, user, assistant, tool "
                        "(hint: map other names, e.g. human / gpt of ShareGPT files, to user / assistant)",
                        where, field, k, rn);
    if (json_object_object_get_ex(o, "tool_calls", &tc) && !json_object_is_type(tc, json_type_null))
        return hp_error(HP_ERR_UNSUPPORTED, "%s%s[%zu]: tool_calls are not supported (their JSON rendering differs "
                        "per template); hint: write the call into the assistant's content", where, field, k);
    if (!json_object_object_get_ex(o, "content", &c) || !json_object_is_type(c, json_type_string))
        return hp_error(HP_ERR_FORMAT, "%s%s[%zu] (%s): \"content\" is %s; expected a string", where, field, k, rn,
                        !c ? "missing" : json_type_to_name(json_object_get_type(c)));
    if (s->n == s->cap) {
        size_t nc = s->cap ? 2 * s->cap : 8;
        hp_chat_message_t *nm = realloc(s->m, nc * sizeof *nm);
        if (!nm) return hp_error(HP_ERR_OOM, "%sout of memory", where);
        s->m = nm;
        s->cap = nc;
    }
    hp_chat_message_t *m = &s->m[s->n++];
    *m = (hp_chat_message_t){(hp_chat_role_t)ri, json_object_get_string(c), (size_t)json_object_get_string_len(c),
                             NULL, 0};
    /* transformers reads reasoning under these names, the first non-null one */
    static const char *rf[] = {"reasoning_content", "thinking", "reasoning"};
    for (int i = 0; i < 3 && !m->reasoning; i++) {
        json_object *v = NULL;
        if (!json_object_object_get_ex(o, rf[i], &v) || json_object_is_type(v, json_type_null)) continue;
        if (!json_object_is_type(v, json_type_string))
            return hp_error(HP_ERR_FORMAT, "%s%s[%zu]: \"%s\" is not a string", where, field, k, rf[i]);
        m->reasoning = json_object_get_string(v);
        m->reasoning_len = (size_t)json_object_get_string_len(v);
    }
    return HP_OK;
}

/* A string (as a message of `role`) or a list of messages. */
static hp_status_t add_part(hp_chat_sample_t *s, json_object *v, const char *where, const char *field,
                            hp_chat_role_t role) {
    if (json_object_is_type(v, json_type_string)) {
        json_object *o = json_object_new_object();
        if (!o) return hp_error(HP_ERR_OOM, "%sout of memory", where);
        json_object_object_add(o, "role", json_object_new_string(role_names_[role]));
        json_object_object_add(o, "content", json_object_get(v));
        /* kept alive by the line's object */
        json_object_object_add((json_object *)s->json, role == HP_CHAT_USER ? "\001prompt" : "\001completion", o);
        return add_message(s, o, where, field, 0);
    }
    if (!json_object_is_type(v, json_type_array))
        return hp_error(HP_ERR_FORMAT, "%s\"%s\" is %s; expected a string or a list of messages", where, field,
                        json_type_to_name(json_object_get_type(v)));
    size_t n = json_object_array_length(v);
    for (size_t k = 0; k < n; k++) HP_TRY(add_message(s, json_object_array_get_idx(v, k), where, field, k));
    return HP_OK;
}

hp_status_t hp_chat_sample_parse(const char *line, size_t len, const char *where, bool need_answer,
                                 hp_chat_sample_t *s) {
    json_object_put(s->json);
    s->json = NULL;
    s->n = 0;
    s->first_trained = 0;
    struct json_tokener *tok = json_tokener_new();
    if (!tok) return hp_error(HP_ERR_OOM, "%sout of memory for the JSON parser", where);
    json_object *o = json_tokener_parse_ex(tok, line, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (je != json_tokener_success || !o) {
        json_object_put(o);
        return hp_error(HP_ERR_FORMAT, "%sinvalid JSON (%s); expected one JSON object per line",
                        where, je == json_tokener_continue ? "incomplete" : json_tokener_error_desc(je));
    }
    for (size_t i = used; i < len; i++)
        if (!(line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n')) {
            json_object_put(o);
            return hp_error(HP_ERR_FORMAT, "%sunexpected text after the JSON value at column %zu", where, used + 1);
        }
    s->json = o;
    if (!json_object_is_type(o, json_type_object))
        return hp_error(HP_ERR_FORMAT, "%sthe line is not a JSON object; expected {\"messages\": [...]} or "
                        "{\"prompt\": ..., \"completion\": ...}", where);
    json_object *msgs = NULL, *p = NULL, *c = NULL;
    if (json_object_object_get_ex(o, "messages", &msgs)) {
        if (!json_object_is_type(msgs, json_type_array))
            return hp_error(HP_ERR_FORMAT, "%s\"messages\" is not a list", where);
        HP_TRY(add_part(s, msgs, where, "messages", HP_CHAT_USER));
    } else if (json_object_object_get_ex(o, "prompt", &p) && json_object_object_get_ex(o, "completion", &c)) {
        HP_TRY(add_part(s, p, where, "prompt", HP_CHAT_USER));
        s->first_trained = s->n;
        HP_TRY(add_part(s, c, where, "completion", HP_CHAT_ASSISTANT));
    } else {
        return hp_error(HP_ERR_FORMAT, "%sneither \"messages\" nor \"prompt\" and \"completion\"; expected "
                        "{\"messages\": [{\"role\": \"user\", \"content\": ...}, ...]} or {\"prompt\": ..., "
                        "\"completion\": ...}", where);
    }
    bool trained = false;
    for (size_t i = s->first_trained; i < s->n; i++) trained |= s->m[i].role == HP_CHAT_ASSISTANT;
    if (!trained && need_answer)
        return hp_error(HP_ERR_FORMAT, "%sno assistant message%s: nothing to train on; hint: every SFT sample needs "
                        "an answer", where, s->first_trained ? " in \"completion\"" : "");
    return HP_OK;
}

/* ---- tokens and mask ------------------------------------------------------------------ */

static hp_status_t encode_into(const hp_text_encoder_t *enc, const char *text, size_t len, int32_t **buf, size_t *cap,
                               size_t *n) {
    HP_TRY(enc->encode(enc->ctx, text, len, *buf, *cap, n));
    if (*n > *cap) {
        size_t nc = *n + 64;
        int32_t *nb = realloc(*buf, nc * sizeof *nb);
        if (!nb) return hp_error(HP_ERR_OOM, "sft: out of memory for %zu token ids", nc);
        *buf = nb;
        *cap = nc;
        size_t again = 0;
        HP_TRY(enc->encode(enc->ctx, text, len, *buf, *cap, &again));
        if (again != *n) return hp_error(HP_ERR_STATE, "sft: the encoder gave %zu ids, then %zu", *n, again);
    }
    return HP_OK;
}

hp_status_t hp_chat_tokenize(const hp_chat_render_t *r, const hp_text_encoder_t *enc, int32_t **ids, uint8_t **mask,
                             size_t *n, size_t *cap) {
    size_t nf = 0;
    HP_TRY(encode_into(enc, r->text, r->len, ids, cap, &nf));
    uint8_t *nm = realloc(*mask, *cap ? *cap : 1);
    if (!nm) return hp_error(HP_ERR_OOM, "sft: out of memory for the mask");
    *mask = nm;
    memset(*mask, 0, nf);
    *n = nf;
    int32_t *pre = NULL;
    size_t pcap = 0;
    hp_status_t st = HP_OK;
    for (size_t k = 0; k < r->n_spans && st == HP_OK; k++) {
        size_t idx[2];
        for (int side = 0; side < 2 && st == HP_OK; side++) {
            size_t np = 0;
            st = encode_into(enc, r->text, r->spans[k][side], &pre, &pcap, &np);
            if (st != HP_OK) break;
            size_t l = 0;
            while (l < np && l < nf && pre[l] == (*ids)[l]) l++;
            idx[side] = l == np ? np : l + (size_t)side;   /* merged across the seam: see the header */
        }
        for (size_t i = idx[0]; st == HP_OK && i < idx[1] && i < nf; i++) (*mask)[i] = 1;
    }
    free(pre);
    return st;
}
