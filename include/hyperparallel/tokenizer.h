/* BPE tokenizer compatible with Hugging Face `tokenizers` tokenizer.json files (GPT-2,
 * Llama 2 / 3, Mistral, Gemma, Qwen2 / 3, DeepSeek-V3 styles) and tokenizer_config.json:
 * loading, encode, decode, and training a new byte-level tokenizer.json from text files.
 * Supported subset and behaviour: docs/tokenizer.md. */
#ifndef HYPERPARALLEL_TOKENIZER_H
#define HYPERPARALLEL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "hyperparallel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_tokenizer *hp_tokenizer_t;

/* A growable list of token ids. Zero-initialise; encode appends; free with
 * hp_token_ids_free. Set len = 0 to reuse the storage. */
typedef struct hp_token_ids {
    int32_t *ids; /* (len,) */
    size_t len;
    size_t cap;
} hp_token_ids_t;

void hp_token_ids_free(hp_token_ids_t *ids);

/* Loads a tokenizer.json, or a model folder (a directory: hp_tokenizer_load_dir). Errors
 * (HP_ERR_IO, HP_ERR_FORMAT, HP_ERR_UNSUPPORTED) name the file and the JSON path of the
 * offending value, e.g. "t.json: model.merges[3]: ...", and what is supported. */
hp_status_t hp_tokenizer_load(hp_tokenizer_t *out, const char *path);
/* Same from a JSON document in memory; `name` is used in messages. */
hp_status_t hp_tokenizer_load_json(hp_tokenizer_t *out, const char *json, size_t len,
                                   const char *name);
void hp_tokenizer_free(hp_tokenizer_t tok);

/* Encode flags. */
enum {
    /* Apply the post-processor as HF's encode(add_special_tokens=True) does (the
     * TemplateProcessing "single" template; ByteLevel adds nothing). */
    HP_TOKENIZE_ADD_SPECIAL = 1u << 0,
    /* Prepend the BOS id / append the EOS id unless already there (TorchTitan's add_bos /
     * add_eos). Fails with HP_ERR_STATE when the tokenizer has no BOS / EOS. */
    HP_TOKENIZE_ADD_BOS = 1u << 1,
    HP_TOKENIZE_ADD_EOS = 1u << 2,
    /* Special added tokens written in the text are encoded as ordinary text, as HF's
     * encode_special_tokens = True (e.g. a corpus that quotes "<|endoftext|>"). */
    HP_TOKENIZE_SPECIAL_AS_TEXT = 1u << 3,
};
/* Decode flags. */
enum { HP_DETOKENIZE_SKIP_SPECIAL = 1u << 0 };

/* Encodes `len` bytes of UTF-8 text and APPENDS the ids to `out`. Added tokens are matched
 * in the raw text first (longest first), the rest is pre-tokenized and BPE-merged.
 * Invalid UTF-8 is an HP_ERR_INVALID_ARG naming the byte offset. Uses per-tokenizer scratch
 * and a word cache: one thread per tokenizer at a time. */
hp_status_t hp_tokenizer_encode(hp_tokenizer_t tok, const char *text, size_t len,
                                unsigned flags, hp_token_ids_t *out);

/* Decodes ids into newly allocated UTF-8 text (NUL-terminated, free with free()). Byte
 * sequences that are not valid UTF-8 become U+FFFD as in HF's decode. An id outside the
 * vocabulary is an HP_ERR_INVALID_ARG naming it. Thread-safe. */
hp_status_t hp_tokenizer_decode(hp_tokenizer_t tok, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *text_len);

/* Number of ids (largest id + 1). */
int32_t hp_tokenizer_vocab_size(hp_tokenizer_t tok);
/* BOS / EOS ids, -1 when there is none. BOS is the first special token before $A in a
 * TemplateProcessing "single" template, EOS the first after it; without a template, the
 * first added special token named like a BOS (<|begin_of_text|>, <s>, <|startoftext|>,
 * <bos>) or an EOS (<|end_of_text|>, </s>, <|endoftext|>, <eos>). */
int32_t hp_tokenizer_bos_id(hp_tokenizer_t tok);
int32_t hp_tokenizer_eos_id(hp_tokenizer_t tok);
/* Overrides BOS / EOS (-1 clears); the id must exist. */
hp_status_t hp_tokenizer_set_bos_eos(hp_tokenizer_t tok, int32_t bos, int32_t eos);
/* Id of a token given by its tokenizer.json spelling (added tokens first), -1 if absent. */
int32_t hp_tokenizer_token_to_id(hp_tokenizer_t tok, const char *token);
/* tokenizer.json spelling of an id, NULL if absent. */
const char *hp_tokenizer_id_to_token(hp_tokenizer_t tok, int32_t id);
/* The bytes one id decodes to (not NUL-terminated, may be part of a UTF-8 character): for
 * streaming output, buffer them until the UTF-8 is complete. NULL if the id is absent. */
const char *hp_tokenizer_token_bytes(hp_tokenizer_t t, int32_t id, size_t *len);
/* 1 when the id is an added token marked "special". */
int hp_tokenizer_is_special(hp_tokenizer_t tok, int32_t id);

/* ---- a Hugging Face model folder ------------------------------------------------------ */

/* Loads dir/tokenizer.json, then applies dir/tokenizer_config.json when present (falling
 * back to dir/special_tokens_map.json for the token names) and dir/chat_template.jinja.
 * Errors name the file, the field and what was expected. */
hp_status_t hp_tokenizer_load_dir(hp_tokenizer_t *out, const char *dir);
/* Applies one tokenizer_config.json (or special_tokens_map.json) to a loaded tokenizer:
 * bos_token / eos_token / pad_token (a string or {"content": ...}; each must be a token of
 * the tokenizer) override BOS / EOS / pad, add_bos_token / add_eos_token are recorded
 * (hp_tokenizer_config_flags), chat_template (a string, or a list of {name, template}) is
 * kept. Other keys are ignored. */
hp_status_t hp_tokenizer_apply_config(hp_tokenizer_t tok, const char *path);
/* Pad id (pad_token of the config), -1 when there is none. */
int32_t hp_tokenizer_pad_id(hp_tokenizer_t tok);
/* add_bos_token / add_eos_token of the config as HP_TOKENIZE_ADD_BOS | HP_TOKENIZE_ADD_EOS
 * (0 for a key that is false or absent). */
unsigned hp_tokenizer_config_flags(hp_tokenizer_t tok);
/* The Jinja text of the chat template: name NULL for the default one (the single template,
 * or the one named "default"), else the named one; NULL when there is none. The template is
 * not rendered here; the tokens it writes (e.g. "<|im_start|>") are looked up with
 * hp_tokenizer_token_to_id, bos_token / eos_token with hp_tokenizer_id_to_token of the BOS /
 * EOS ids. */
const char *hp_tokenizer_chat_template(hp_tokenizer_t tok, const char *name);
/* The added tokens (tokenizer.json's added_tokens, in file order): count, and the id and
 * specialness of the i-th. */
size_t hp_tokenizer_added_count(hp_tokenizer_t tok);
int32_t hp_tokenizer_added_id(hp_tokenizer_t tok, size_t i);

/* ---- training ------------------------------------------------------------------------ */

typedef struct hp_tokenizer_train_options {
    int32_t vocab_size;            /* total, including the 256 bytes and special tokens */
    const char *const *special;    /* special tokens, get ids 0..n_special-1 */
    size_t n_special;
    /* Lines equal to this string are document separators and are not trained on (the
     * fortune files' "%"); NULL for none. */
    const char *separator_line;
    /* When set, files are JSONL (one JSON object per line, C4 style) and this string field
     * of each object is a document; a line that is not such an object is an error naming
     * file:line. Empty lines are skipped. */
    const char *jsonl_field;
    int64_t min_frequency;         /* a pair must occur at least this often (default 2) */
    int verbose;                   /* progress on hp_log INFO */
} hp_tokenizer_train_options_t;

/* Trains byte-level BPE (GPT-2 regex pre-tokenization, 256-byte alphabet, most frequent
 * pair first, ties broken by the smaller (left id, right id)) on the files and writes a HF
 * tokenizer.json to `out_path` (atomically: a temporary file renamed). With special tokens
 * the first is BOS and the second EOS, written as a TemplateProcessing "BOS $A EOS". */
hp_status_t hp_tokenizer_train(const hp_tokenizer_train_options_t *opts,
                               const char *const *files, size_t n_files, const char *out_path);

/* Same from in-memory texts (each one a document). */
hp_status_t hp_tokenizer_train_texts(const hp_tokenizer_train_options_t *opts,
                                     const char *const *texts, const size_t *lens,
                                     size_t n_texts, const char *out_path);

#ifdef __cplusplus
}
#endif
#endif
