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
#include "hyperparallel/tokenizer.h"

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

/* ---- Unicode (tokenizer_unicode.c, tables in tokenizer_unicode_data.c) ---------------- */

/* General categories in PCRE2's order (tools/golden/make_unicode_tables.py). */
enum {
    HP_TOK_GC_Cc, HP_TOK_GC_Cf, HP_TOK_GC_Cn, HP_TOK_GC_Co, HP_TOK_GC_Cs, HP_TOK_GC_Ll,
    HP_TOK_GC_Lm, HP_TOK_GC_Lo, HP_TOK_GC_Lt, HP_TOK_GC_Lu, HP_TOK_GC_Mc, HP_TOK_GC_Me,
    HP_TOK_GC_Mn, HP_TOK_GC_Nd, HP_TOK_GC_Nl, HP_TOK_GC_No, HP_TOK_GC_Pc, HP_TOK_GC_Pd,
    HP_TOK_GC_Pe, HP_TOK_GC_Pf, HP_TOK_GC_Pi, HP_TOK_GC_Po, HP_TOK_GC_Ps, HP_TOK_GC_Sc,
    HP_TOK_GC_Sk, HP_TOK_GC_Sm, HP_TOK_GC_So, HP_TOK_GC_Zl, HP_TOK_GC_Zp, HP_TOK_GC_Zs,
    HP_TOK_GC_COUNT
};
extern const uint32_t hp_tok_gc16[];
extern const size_t hp_tok_gc16_len;
extern const uint32_t hp_tok_gc_unstable[][2];
extern const size_t hp_tok_gc_unstable_len;
extern const uint8_t hp_tok_nf_stage1[];
extern const uint8_t hp_tok_nf_stage2[][256];

/* Unicode 16.0 general category of cp (HP_TOK_GC_*), the version of HF's Oniguruma. */
int hp_tok_gc_of(uint32_t cp);

/* Normalization flags (HF's normalizers have Unicode 9.0 tables). SAFE_*: the character
 * is in that form, has combining class 0 and nothing composes onto it, so a text made only
 * of such characters (and barriers) is left as it is. BARRIER: not in Unicode 9.0, so HF
 * neither decomposes, composes nor reorders it, and nothing combines across it. */
enum {
    HP_TOK_NF_SAFE_NFC = 1,
    HP_TOK_NF_SAFE_NFD = 2,
    HP_TOK_NF_SAFE_NFKC = 4,
    HP_TOK_NF_SAFE_NFKD = 8,
    HP_TOK_NF_BARRIER = 16,
};
static inline unsigned hp_tok_nf_flags(uint32_t cp) {
    return cp < 0x110000 ? hp_tok_nf_stage2[hp_tok_nf_stage1[cp >> 8]][cp & 255] : 0;
}

/* How \p{..} classes are written for PCRE2 (tokenizer_unicode.c): DELTA adds to (and removes
 * from) PCRE2's own \p{..} the code points where its Unicode tables differ from 16.0 (a PCRE2
 * with Unicode 14.0-16.0 tables, asked about each such code point once); EXPLICIT writes
 * every class as Unicode 16.0 ranges (any other PCRE2; slower). AUTO picks. */
typedef enum { HP_TOK_UNICODE_AUTO, HP_TOK_UNICODE_DELTA, HP_TOK_UNICODE_EXPLICIT } hp_tok_unicode_mode_t;
/* Forces a mode for the regexes compiled afterwards (tests); returns the mode in use. */
hp_tok_unicode_mode_t hp_tok_unicode_set_mode(hp_tok_unicode_mode_t mode);

/* A growable byte string for building patterns and texts. */
typedef struct hp_tok_buf {
    char *p;
    size_t len, cap;
} hp_tok_buf_t;
hp_status_t hp_tok_buf_add(hp_tok_buf_t *b, const char *s, size_t n);

/* Appends to `out` PCRE2 syntax matching exactly the code points whose Unicode 16.0 category
 * is in `mask` (bit HP_TOK_GC_*), or, with `negate`, all others. `in_class`: the text goes
 * inside [...] (no brackets written); otherwise it is one complete atom. */
hp_status_t hp_tok_unicode_class(hp_tok_buf_t *out, uint32_t mask, int negate, int in_class);
/* The category mask of a property name as Oniguruma spells it (L, Lu, Letter,
 * Uppercase_Letter, ... case, spaces, '-' and '_' ignored); 0 when it is not a category. */
uint32_t hp_tok_gc_mask_of_name(const char *name, size_t len);

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

typedef struct hp_tok_match {
    size_t start, end;
} hp_tok_match_t;
/* Every match of re in s[0..n) as Oniguruma's find_iter reports them (HF): left to right,
 * after an empty match one character further, an empty match right at the end of the
 * previous match left out. *out grows as needed (capacity *cap). */
hp_status_t hp_tok_regex_find_all(hp_tok_regex_t *re, const char *s, size_t n,
                                  hp_tok_match_t **out, size_t *cap, size_t *count);

/* Rust's char::is_whitespace (Unicode White_Space). */
static inline int hp_tok_is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* ---- normalizers (tokenizer_normalize.c) --------------------------------------------- */

typedef enum {
    HP_TOK_NORM_NFC, HP_TOK_NORM_NFD, HP_TOK_NORM_NFKC, HP_TOK_NORM_NFKD,
    HP_TOK_NORM_REPLACE, HP_TOK_NORM_PREPEND, HP_TOK_NORM_STRIP
} hp_tok_norm_kind_t;

typedef struct hp_tok_norm_step {
    hp_tok_norm_kind_t kind;
    char *pat;            /* Replace with a String pattern (pat_len > 0) */
    size_t pat_len;
    int is_regex;         /* Replace with a Regex pattern */
    hp_tok_regex_t re;
    char *text;           /* Replace: the content; Prepend: the prefix */
    size_t text_len;
    int left, right;      /* Strip */
} hp_tok_norm_step_t;

typedef struct hp_tok_normalizer {
    hp_tok_norm_step_t *steps; /* (n_steps,) applied in order (a Sequence, flattened) */
    int n_steps;
    hp_tok_buf_t buf[2];       /* scratch: each step writes the other one */
    int32_t *u32;              /* utf8proc's code point buffer */
    size_t u32_cap;
    hp_tok_match_t *m;
    size_t m_cap;
} hp_tok_normalizer_t;

/* Normalizes the valid UTF-8 s[0..n) through all steps. *out is s itself when nothing
 * changed, else scratch of nz valid until the next call. *moved (may be NULL): the result no
 * longer starts at the start of s (Strip or an empty Replace removed it), which HF's
 * Metaspace prepend_scheme "first" sees through its offsets. */
hp_status_t hp_tok_normalize(hp_tok_normalizer_t *nz, const char *s, size_t n, const char **out,
                             size_t *out_len, int *moved);
void hp_tok_normalizer_free(hp_tok_normalizer_t *nz);

/* ---- decoders (tokenizer_decode.c) ---------------------------------------------------- */

typedef enum {
    HP_TOK_DEC_BYTELEVEL, HP_TOK_DEC_REPLACE, HP_TOK_DEC_BYTEFALLBACK, HP_TOK_DEC_FUSE,
    HP_TOK_DEC_STRIP, HP_TOK_DEC_METASPACE
} hp_tok_dec_kind_t;

typedef struct hp_tok_dec_step {
    hp_tok_dec_kind_t kind;
    char *pat;          /* Replace (String) */
    size_t pat_len;
    int is_regex;       /* Replace (Regex) */
    hp_tok_regex_t re;
    char *text;         /* Replace: the content */
    size_t text_len;
    uint32_t ch;        /* Strip: the character; Metaspace: the replacement */
    int start, stop;    /* Strip */
    int prepend;        /* Metaspace: prepend_scheme is not "never" */
} hp_tok_dec_step_t;

/* ---- the tokenizer (tokenizer.c loads and encodes, tokenizer_decode.c decodes,
 * tokenizer_config.c reads tokenizer_config.json) -------------------------------------- */

enum { HP_TOK_STAGE_BYTELEVEL, HP_TOK_STAGE_SPLIT, HP_TOK_STAGE_METASPACE };
enum {
    HP_TOK_SPLIT_REMOVED, HP_TOK_SPLIT_ISOLATED, HP_TOK_SPLIT_MERGED_PREV,
    HP_TOK_SPLIT_MERGED_NEXT, HP_TOK_SPLIT_CONTIGUOUS
};
enum { HP_TOK_PREPEND_ALWAYS, HP_TOK_PREPEND_FIRST, HP_TOK_PREPEND_NEVER };

typedef struct hp_tok_stage {
    int kind;
    int add_prefix_space; /* ByteLevel */
    int use_regex;        /* ByteLevel: split with the GPT-2 pattern */
    int behavior;         /* Split */
    int invert;           /* Split */
    hp_tok_regex_t re;    /* Split, or ByteLevel with use_regex */
    char rep[4];          /* Metaspace: the replacement character's UTF-8 */
    int rep_len;
    int prepend_scheme;   /* Metaspace: HP_TOK_PREPEND_* */
    int split;            /* Metaspace: split before each replacement character */
} hp_tok_stage_t;

typedef struct hp_tok_added {
    char *content;  /* as written in tokenizer.json */
    size_t len;
    char *match;    /* what is searched: content, normalized when `normalized` */
    size_t match_len;
    int32_t id;
    int special, normalized, lstrip, rstrip, single_word;
} hp_tok_added_t;

/* A byte trie over the added tokens of one pass (normalized or not). */
typedef struct hp_tok_trie_node {
    int32_t child, sibling; /* first child, next sibling; -1 none */
    int32_t added;          /* index into added, -1 when no token ends here */
    uint8_t byte;
} hp_tok_trie_node_t;

typedef struct hp_tok_merge {
    uint64_t key; /* (left << 32 | right); UINT64_MAX marks empty */
    int32_t rank, new_id;
} hp_tok_merge_t;

typedef struct hp_tok_span {
    size_t off, len;
    int32_t id;     /* added token id, or -1 for text; for regex pieces: is_match */
    int32_t origin; /* starts at offset 0 of the input (Metaspace prepend_scheme "first") */
} hp_tok_span_t;

typedef struct hp_tok_heap_item {
    int32_t rank, pos, new_id;
} hp_tok_heap_item_t;

enum { HP_TOK_DECODER_NONE, HP_TOK_DECODER_BYTELEVEL, HP_TOK_DECODER_CHAIN };

struct hp_tokenizer {
    char *name;
    int32_t n_ids;
    char **spelling;   /* (n_ids,) tokenizer.json spelling, NULL for holes */
    uint32_t *spelling_len; /* (n_ids,) (a spelling may hold U+0000) */
    char **dec;        /* (n_ids,) bytes the id decodes to on its own (streaming) */
    uint32_t *dec_len; /* (n_ids,) */
    uint8_t *special;  /* (n_ids,) */
    int byte_level;    /* a ByteLevel pre-tokenizer: the model sees bytes */
    int32_t byte_id[256];      /* byte-level: byte -> id of its one-character token */
    int16_t cp_byte[512];      /* byte-level alphabet: code point -> byte, -1 outside */
    int32_t *char_id;          /* (0x10000,) char mode: BMP code point -> id, -1 none */
    hp_tok_strmap_t vocab_bytes; /* model vocabulary: raw bytes (byte-level) or spelling -> id */
    hp_tok_strmap_t spell_map;   /* spelling -> id (added tokens win) */
    hp_tok_merge_t *merges;      /* (merges_cap,) open addressing */
    size_t merges_cap;
    /* (last atom of a, first atom of b) of every merge (a, b): two adjacent initial symbols
     * not in this set are never joined, so a long word is merged piece by piece there
     * (same result, smaller heaps). NULL when the merges do not allow it. */
    hp_tok_merge_t *cross;
    size_t cross_cap;
    int ignore_merges;
    int has_unk, fuse_unk; /* model.unk_token set; fuse runs of unknown characters */
    int32_t unk_id;        /* -1 when the unk token is not in the vocabulary */
    int byte_fallback;
    int32_t fb_id[256];    /* byte_fallback: byte -> id of "<0xXX>", -1 none */
    hp_tok_normalizer_t norm;
    hp_tok_stage_t *stages;
    int n_stages;
    hp_tok_added_t *added;
    size_t n_added;
    hp_tok_trie_node_t *trie[2]; /* [normalized] root at 0 */
    int32_t trie_n[2], trie_cap[2];
    uint8_t added_first[2][256]; /* [normalized][byte]: some added token starts with it */
    int decoder;                 /* HP_TOK_DECODER_* */
    hp_tok_dec_step_t *dec_steps;
    int n_dec_steps;
    hp_tok_regex_t word_char;    /* Rust regex \w, for single_word added tokens */
    int has_word_char;
    int32_t *prefix, *suffix;
    int n_prefix, n_suffix;
    int32_t bos, eos, pad;
    /* tokenizer_config.json (tokenizer_config.c) */
    int add_bos, add_eos; /* add_bos_token / add_eos_token: 1, 0, or -1 when not given */
    char *chat_template;  /* NULL when none */
    char **template_names, **templates; /* named chat templates (a list in the config) */
    size_t n_templates;
    /* scratch, reused across encode calls */
    char *pool;
    size_t pool_len, pool_cap;
    hp_tok_span_t *sa, *sb, *sc, *seg1, *seg2;
    size_t sa_cap, sb_cap, sc_cap, seg1_cap, seg2_cap;
    hp_tok_match_t *m;
    size_t m_cap;
    char *nbuf;        /* normalized text of the current piece */
    size_t nbuf_cap;
    int32_t *sym_id, *sym_prev, *sym_next, *sym_len;
    hp_tok_heap_item_t *heap;
    size_t sym_cap, heap_cap;
    hp_tok_strmap_t cache;
    int32_t *cache_ids;
    size_t cache_ids_len, cache_ids_cap;
};

/* Bytes a token decodes to when it stands alone (the per-token decoders; tokenizer_decode.c). */
hp_status_t hp_tok_token_stream_bytes(hp_tokenizer_t t, const char *s, size_t n, char **out,
                                      size_t *out_len);
/* Frees what the decoder steps hold. */
void hp_tok_dec_steps_free(hp_tok_dec_step_t *steps, int n);

#endif
