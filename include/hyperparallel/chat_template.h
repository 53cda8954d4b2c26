/* Chat templates and supervised fine-tuning samples: the known chat templates of the model
 * families (Qwen2 / Qwen2.5 / ChatML, Qwen3, Llama 2, Llama 3 / 3.1, Mistral, Gemma,
 * DeepSeek-V3) recognised from a model folder's template text and rendered exactly as
 * transformers' apply_chat_template(tokenize=False) renders them (no Jinja engine: each is
 * written out in C and checked against transformers), the assistant spans of a rendering, and
 * a conversation turned into token ids with the assistant-only loss mask. Details:
 * docs/finetune.md. */
#ifndef HYPERPARALLEL_CHAT_TEMPLATE_H
#define HYPERPARALLEL_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hyperparallel/data.h"
#include "hyperparallel/status.h"
#include "hyperparallel/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_chat_role { HP_CHAT_SYSTEM = 0, HP_CHAT_USER, HP_CHAT_ASSISTANT, HP_CHAT_TOOL } hp_chat_role_t;

/* One message; the texts are UTF-8 and need not be NUL-terminated. */
typedef struct hp_chat_message {
    hp_chat_role_t role;
    const char *content;
    size_t content_len;
    const char *reasoning;   /* reasoning_content (or its aliases thinking / reasoning); NULL = none */
    size_t reasoning_len;
} hp_chat_message_t;

typedef struct hp_chat_template *hp_chat_template_t;

/* Names of the known templates, comma-separated ("qwen2.5, chatml, qwen3, ..."). */
const char *hp_chat_template_names(void);
/* Finds the known template whose text equals `text` after normalisation (surrounding
 * whitespace trimmed, CR LF as LF, the two characters backslash-n as a newline): *name is its
 * name. HP_ERR_UNSUPPORTED when none matches, naming the closest known template and the byte
 * where they part, with the hint to set data.chat_template. */
hp_status_t hp_chat_template_recognize(const char *text, const char **name);
/* A template by name (a known name, or a family name: qwen2 = qwen2.5); bos / eos are the
 * texts the template writes for bos_token / eos_token (NULL = none, rendered as ""). */
hp_status_t hp_chat_template_create(const char *name, const char *bos, const char *eos, hp_chat_template_t *out);
/* The template of a loaded tokenizer (a model folder's tokenizer_config.json or
 * chat_template.jinja): `name` (data.chat_template) when given, else the recognised one;
 * bos / eos from the tokenizer. Errors name the folder's template and list the known ones. */
hp_status_t hp_chat_template_from_tokenizer(hp_tokenizer_t tok, const char *name, hp_chat_template_t *out);
void hp_chat_template_free(hp_chat_template_t t);
const char *hp_chat_template_name(hp_chat_template_t t);
/* Models whose released template this is ("Qwen/Qwen3-*"). */
const char *hp_chat_template_models(hp_chat_template_t t);

/* A rendering: the text and the byte spans [begin, end) of the trained assistant messages
 * (after the header the generation prompt writes, through the end-of-turn token). */
typedef struct hp_chat_render {
    char *text;
    size_t len, cap;
    size_t (*spans)[2];
    size_t n_spans, spans_cap;
} hp_chat_render_t;
void hp_chat_render_free(hp_chat_render_t *r);

/* Renders messages[0..n) as transformers does (add_generation_prompt as given); assistant
 * messages at index >= first_trained get a span. Conversations the template refuses
 * (roles that do not alternate, a system message Gemma does not take, ...) are
 * HP_ERR_INVALID_ARG with the template's own words; the Llama 2 template, which would drop
 * a tool message silently, refuses it. Resets and fills *r. */
hp_status_t hp_chat_template_render(hp_chat_template_t t, const hp_chat_message_t *m, size_t n, size_t first_trained,
                                    bool add_generation_prompt, hp_chat_render_t *r);

/* One SFT sample of a JSONL line: {"messages": [{"role", "content"[, "reasoning_content"]}...]}
 * (every assistant message trained) or {"prompt": ..., "completion": ...} (each a string, a
 * user / assistant message, or a list of messages; the completion's assistant messages are
 * trained). The messages point into the parsed line. */
typedef struct hp_chat_sample {
    void *json;                  /* the parsed line (json-c) */
    hp_chat_message_t *m;
    size_t n, cap;
    size_t first_trained;
} hp_chat_sample_t;
/* Parses and checks a line: invalid JSON, neither form, an unknown role, a content that is
 * not a string, tool_calls (not supported), and with need_answer no assistant message to
 * train on (a prompt to render with add_generation_prompt has none). Errors are prefixed with
 * `where` (e.g. "data.jsonl:3: "). Resets *s (keep it for the next line). */
hp_status_t hp_chat_sample_parse(const char *line, size_t len, const char *where, bool need_answer,
                                 hp_chat_sample_t *s);
void hp_chat_sample_free(hp_chat_sample_t *s);

/* Token ids of a rendering and the assistant mask: ids = encode(text) (the whole text at
 * once, as the model sees it at inference); the tokens of span [b, e) are those from
 * len(encode(text[:b])) to len(encode(text[:e])); where the tokenizer merges across b (the
 * prefix's encoding is not a prefix of the whole one), from the first token where they differ,
 * and across e one past it (a token holding assistant text is trained, as TRL's assistant
 * mask). ids / mask grow as needed (*cap elements each). */
hp_status_t hp_chat_tokenize(const hp_chat_render_t *r, const hp_text_encoder_t *enc, int32_t **ids, uint8_t **mask,
                             size_t *n, size_t *cap);

#ifdef __cplusplus
}
#endif
#endif
