/* Private helpers shared by the tokenizer (tokenizer.c) and the trainer (tokenizer_train.c):
 * the byte-level alphabet, the pre-tokenizer regexes, a byte-string hash map and a PCRE2
 * wrapper. */
#ifndef HP_TOKENIZER_IMPL_H
#define HP_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "hyperparallel/status.h"

/* The pattern of HF's ByteLevel pre-tokenizer (use_regex = true), i.e. GPT-2's. */
#define HP_TOK_GPT2_PATTERN \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* Llama 3's Split pattern. */
#define HP_TOK_LLAMA3_PATTERN                                                              \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "            \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Grows *buf (elements of `elem` bytes, capacity *cap) to hold at least n: doubling from
 * `first`; an allocation failure names `who`. */
hp_status_t hp_tok_reserve(void **buf, size_t *cap, size_t n, size_t elem, size_t first, const char *who);

/* GPT-2's bytes_to_unicode: byte -> code point of the printable character standing for it. */
void hp_tok_byte_to_cp(uint32_t cp[256]);
/* Writes the UTF-8 encoding of cp (< 0x110000) to out, returns its length (1..4). */
int hp_tok_utf8_put(uint32_t cp, char *out);
/* Decodes one UTF-8 character at s[0..n), returns its length (1..4) or 0 when invalid. */
int hp_tok_utf8_get(const char *s, size_t n, uint32_t *cp);
/* Offset of the first invalid UTF-8 byte, or n when the text is valid. */
size_t hp_tok_utf8_check(const char *s, size_t n);

/* Hash map from byte strings to int64 values; keys are copied into a pool. */
typedef struct hp_tok_strmap_entry {
    uint64_t hash; /* 0 marks an empty slot */
    uint32_t off, len;
    int64_t val;
} hp_tok_strmap_entry_t;

typedef struct hp_tok_strmap {
    hp_tok_strmap_entry_t *e; /* (cap,) */
    size_t cap, count;
    char *pool;
    size_t pool_len, pool_cap;
} hp_tok_strmap_t;

hp_status_t hp_tok_strmap_init(hp_tok_strmap_t *m, size_t cap_hint);
void hp_tok_strmap_free(hp_tok_strmap_t *m);
void hp_tok_strmap_clear(hp_tok_strmap_t *m);
int64_t *hp_tok_strmap_get(const hp_tok_strmap_t *m, const char *key, size_t len);
/* Finds or inserts key (value `init` when new); *slot points at the value until the next
 * insertion. *inserted says whether it was new. */
hp_status_t hp_tok_strmap_put(hp_tok_strmap_t *m, const char *key, size_t len, int64_t init,
                              int64_t **slot, int *inserted);
static inline const char *hp_tok_strmap_key(const hp_tok_strmap_t *m,
                                            const hp_tok_strmap_entry_t *e) {
    return m->pool + e->off;
}

/* A compiled pattern (UTF, UCP, JIT when available) with its match data. */
typedef struct hp_tok_regex {
    pcre2_code *code;
    pcre2_match_data *md;
    int jit;
} hp_tok_regex_t;

/* `what` names the pattern's origin for messages. literal != 0 matches the text as is. */
hp_status_t hp_tok_regex_compile(hp_tok_regex_t *re, const char *pattern, size_t len,
                                 int literal, const char *what);
void hp_tok_regex_free(hp_tok_regex_t *re);
/* Next match in s[0..n) at or after `from` (s must be valid UTF-8). Returns 1 and sets
 * [*ms, *me), 0 when there is none, or -1 on a matching error (message set). */
int hp_tok_regex_next(hp_tok_regex_t *re, const char *s, size_t n, size_t from, size_t *ms,
                      size_t *me);

#endif
