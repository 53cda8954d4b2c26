/* Byte-level BPE tokenizer reading HF tokenizer.json: loader with JSON-path error messages,
 * added-token splitting, ByteLevel / Split pre-tokenizers through PCRE2, rank-ordered BPE
 * merges with a word cache, post-processor templates, and decode. docs/tokenizer.md. */
#include "hyperparallel/tokenizer.h"
#include "hyperparallel/file.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/tokenizer-impl.h"

enum { STAGE_BYTELEVEL, STAGE_SPLIT };
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };

typedef struct stage {
    int kind;
    int add_prefix_space; /* ByteLevel */
    int use_regex;        /* ByteLevel: split with the GPT-2 pattern */
    int behavior;         /* Split */
    int invert;           /* Split */
    hp_tok_regex_t re;    /* Split, or ByteLevel with use_regex */
} stage_t;

typedef struct added {
    char *content;
    size_t len;
    int32_t id;
    int special, normalized, lstrip, rstrip, single_word;
} added_t;

typedef struct merge_entry {
    uint64_t key; /* (left << 32 | right); UINT64_MAX marks empty */
    int32_t rank, new_id;
} merge_entry_t;

typedef struct span {
    size_t off, len;
    int32_t id; /* added token id, or -1 for text; for pieces: is_match */
} span_t;

typedef struct heap_item {
    int32_t rank, pos, new_id;
} heap_item_t;

struct hp_tokenizer {
    char *name;
    int32_t n_ids;
    char **spelling;   /* (n_ids,) tokenizer.json spelling, NULL for holes */
    char **dec;        /* (n_ids,) bytes the id decodes to */
    uint32_t *dec_len; /* (n_ids,) */
    uint8_t *special;  /* (n_ids,) */
    int32_t byte_id[256];
    hp_tok_strmap_t vocab_bytes; /* raw bytes -> model id */
    hp_tok_strmap_t spell_map;   /* spelling -> id (added tokens win) */
    merge_entry_t *merges;       /* (merges_cap,) open addressing */
    size_t merges_cap;
    int ignore_merges;
    int has_unk, fuse_unk; /* model.unk_token set; fuse runs of unknown bytes */
    int32_t unk_id;        /* -1 when the unk token is not in the vocabulary */
    stage_t *stages;
    int n_stages;
    added_t *added;
    size_t n_added;
    int decoder_bytelevel;
    uint8_t added_first[2][256]; /* [normalized][byte]: some added token starts with it */
    hp_tok_regex_t word_char;    /* Rust regex \w, for single_word added tokens */
    int has_word_char;
    int32_t *prefix, *suffix;
    int n_prefix, n_suffix;
    int32_t bos, eos;
    /* scratch, reused across encode calls */
    char *pool;
    size_t pool_len, pool_cap;
    span_t *sa, *sb, *sc, *seg1, *seg2;
    size_t sa_cap, sb_cap, sc_cap, seg1_cap, seg2_cap;
    int32_t *sym_id, *sym_prev, *sym_next, *sym_len;
    heap_item_t *heap;
    size_t sym_cap, heap_cap;
    hp_tok_strmap_t cache;
    int32_t *cache_ids;
    size_t cache_ids_len, cache_ids_cap;
};

void hp_token_ids_free(hp_token_ids_t *ids) {
    if (!ids) return;
    free(ids->ids);
    memset(ids, 0, sizeof(*ids));
}

static hp_status_t ids_reserve(hp_token_ids_t *out, size_t extra) {
    if (out->len + extra <= out->cap) return HP_OK;
    size_t cap = out->cap ? out->cap : 256;
    while (cap < out->len + extra) cap *= 2;
    int32_t *p = realloc(out->ids, cap * sizeof(int32_t));
    if (!p) return hp_error(HP_ERR_OOM, "tokenizer: cannot grow the id list to %zu ids", cap);
    out->ids = p;
    out->cap = cap;
    return HP_OK;
}

static inline hp_status_t ids_push(hp_token_ids_t *out, int32_t id) {
    if (out->len == out->cap) HP_TRY(ids_reserve(out, 1));
    out->ids[out->len++] = id;
    return HP_OK;
}

#define RESERVE(ptr, cap, n) hp_tok_reserve((void **)&(ptr), &(cap), (n), sizeof(*(ptr)), 64, "tokenizer scratch")

/* ---- merges map -------------------------------------------------------------------- */

static inline uint64_t pair_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
}

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static const merge_entry_t *merge_get(hp_tokenizer_t t, int32_t a, int32_t b) {
    if (!t->merges_cap) return NULL;
    uint64_t k = pair_key(a, b);
    size_t mask = t->merges_cap - 1, i = (size_t)mix64(k) & mask;
    for (;;) {
        const merge_entry_t *e = &t->merges[i];
        if (e->key == UINT64_MAX) return NULL;
        if (e->key == k) return e;
        i = (i + 1) & mask;
    }
}

/* Later merges of the same pair overwrite earlier ones, as HF's HashMap collect does. */
static void merge_put(hp_tokenizer_t t, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    uint64_t k = pair_key(a, b);
    size_t mask = t->merges_cap - 1, i = (size_t)mix64(k) & mask;
    while (t->merges[i].key != UINT64_MAX && t->merges[i].key != k) i = (i + 1) & mask;
    t->merges[i].key = k;
    t->merges[i].rank = rank;
    t->merges[i].new_id = new_id;
}

/* ---- loading ----------------------------------------------------------------------- */

typedef struct ctx {
    const char *file;
    hp_tokenizer_t t;
    uint32_t byte_cp[256];
    int cp_byte[512]; /* code point (< 512) -> byte, -1 when not in the byte-level alphabet */
} ctx_t;

__attribute__((format(printf, 4, 5))) static hp_status_t jerr(const ctx_t *c, hp_status_t st,
                                                              const char *path,
                                                              const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return hp_error(st, "%s: %s: %s", c->file, path, msg);
}

static const char *type_name(json_object *o) {
    return o ? json_type_to_name(json_object_get_type(o)) : "null";
}

/* Member `key` of object `o` (at `path`) with the given type. Missing or null members give
 * *out = NULL when optional; a wrong type is always an error. */
static hp_status_t member(const ctx_t *c, json_object *o, const char *path, const char *key,
                          json_type type, int required, json_object **out) {
    json_object *v = NULL;
    *out = NULL;
    if (!json_object_object_get_ex(o, key, &v) || v == NULL) {
        if (required)
            return jerr(c, HP_ERR_FORMAT, path, "missing member \"%s\" (expected %s)", key,
                        json_type_to_name(type));
        return HP_OK;
    }
    if (!json_object_is_type(v, type))
        return jerr(c, HP_ERR_FORMAT, path, "member \"%s\" is %s, expected %s", key,
                    type_name(v), json_type_to_name(type));
    *out = v;
    return HP_OK;
}

static hp_status_t member_bool(const ctx_t *c, json_object *o, const char *path, const char *key,
                               int dflt, int *out) {
    json_object *v;
    HP_TRY(member(c, o, path, key, json_type_boolean, 0, &v));
    *out = v ? json_object_get_boolean(v) : dflt;
    return HP_OK;
}

static hp_status_t member_type(const ctx_t *c, json_object *o, const char *path,
                               const char **type) {
    json_object *v;
    if (!json_object_is_type(o, json_type_object))
        return jerr(c, HP_ERR_FORMAT, path, "is %s, expected an object", type_name(o));
    HP_TRY(member(c, o, path, "type", json_type_string, 1, &v));
    *type = json_object_get_string(v);
    return HP_OK;
}

/* Spelling -> raw bytes through the byte-level alphabet; 0 when a character is outside it. */
static int spelling_to_bytes(const ctx_t *c, const char *s, size_t n, char *out, size_t *out_len) {
    size_t i = 0, k = 0;
    while (i < n) {
        uint32_t cp;
        int l = hp_tok_utf8_get(s + i, n - i, &cp);
        if (l == 0 || cp >= 512 || c->cp_byte[cp] < 0) return 0;
        out[k++] = (char)c->cp_byte[cp];
        i += (size_t)l;
    }
    *out_len = k;
    return 1;
}

static hp_status_t set_spelling(const ctx_t *c, int32_t id, const char *s, size_t n,
                                const char *path) {
    hp_tokenizer_t t = c->t;
    if (t->spelling[id]) return HP_OK; /* added token spelling wins */
    t->spelling[id] = strndup(s, n);
    if (!t->spelling[id]) return hp_error(HP_ERR_OOM, "%s: %s: out of memory", c->file, path);
    /* ByteLevel decoder: map every character back to its byte; a token with a character
     * outside the alphabet decodes to its own UTF-8 (HF's decode_chain). */
    char *d = malloc(n + 1);
    if (!d) return hp_error(HP_ERR_OOM, "%s: %s: out of memory", c->file, path);
    size_t dl = n;
    if (!t->decoder_bytelevel || !spelling_to_bytes(c, s, n, d, &dl)) {
        memcpy(d, s, n);
        dl = n;
    }
    t->dec[id] = d;
    t->dec_len[id] = (uint32_t)dl;
    return HP_OK;
}

static int32_t max_id_limit(void) { return 1 << 26; }

static hp_status_t check_id(const ctx_t *c, json_object *v, const char *path, int32_t *id) {
    if (!json_object_is_type(v, json_type_int))
        return jerr(c, HP_ERR_FORMAT, path, "is %s, expected an integer id", type_name(v));
    int64_t x = json_object_get_int64(v);
    if (x < 0 || x >= max_id_limit())
        return jerr(c, HP_ERR_FORMAT, path, "id %lld is outside [0, %d)", (long long)x,
                    max_id_limit());
    *id = (int32_t)x;
    return HP_OK;
}

static hp_status_t parse_stage(ctx_t *c, json_object *o, const char *path);

/* A Split-like step must come before the ByteLevel step (it would see byte-mapped text). */
static hp_status_t check_split_order(ctx_t *c, const char *path) {
    for (int i = 0; i < c->t->n_stages; i++)
        if (c->t->stages[i].kind == STAGE_BYTELEVEL)
            return jerr(c, HP_ERR_UNSUPPORTED, path,
                        "a splitting step after a ByteLevel pre-tokenizer is not supported (it "
                        "would see byte-mapped text); put it first");
    return HP_OK;
}

/* A Split behaviour name; NULL gives Isolated. */
static hp_status_t parse_behavior(ctx_t *c, json_object *beh, const char *path, int *out) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    *out = SPLIT_ISOLATED;
    if (!beh) return HP_OK;
    for (int i = 0; i < 5; i++)
        if (strcmp(json_object_get_string(beh), names[i]) == 0) {
            *out = i;
            return HP_OK;
        }
    return jerr(c, HP_ERR_FORMAT, path,
                "behavior \"%s\" is not one of Removed, Isolated, MergedWithPrevious, "
                "MergedWithNext, Contiguous",
                json_object_get_string(beh));
}

static hp_status_t add_stage(ctx_t *c, stage_t **st, const char *path) {
    hp_tokenizer_t t = c->t;
    stage_t *s = realloc(t->stages, (size_t)(t->n_stages + 1) * sizeof(stage_t));
    if (!s) return hp_error(HP_ERR_OOM, "%s: %s: out of memory", c->file, path);
    t->stages = s;
    *st = &s[t->n_stages++];
    memset(*st, 0, sizeof(**st));
    return HP_OK;
}

static hp_status_t parse_stage(ctx_t *c, json_object *o, const char *path) {
    const char *type;
    char p2[512];
    HP_TRY(member_type(c, o, path, &type));
    if (strcmp(type, "Sequence") == 0) {
        json_object *arr;
        HP_TRY(member(c, o, path, "pretokenizers", json_type_array, 1, &arr));
        size_t n = json_object_array_length(arr);
        for (size_t i = 0; i < n; i++) {
            snprintf(p2, sizeof(p2), "%s.pretokenizers[%zu]", path, i);
            HP_TRY(parse_stage(c, json_object_array_get_idx(arr, i), p2));
        }
        return HP_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        int aps, use_regex;
        HP_TRY(member_bool(c, o, path, "add_prefix_space", 1, &aps));
        HP_TRY(member_bool(c, o, path, "use_regex", 1, &use_regex));
        stage_t *s;
        HP_TRY(add_stage(c, &s, path));
        s->kind = STAGE_BYTELEVEL;
        s->add_prefix_space = aps;
        s->use_regex = use_regex;
        if (use_regex)
            HP_TRY(hp_tok_regex_compile(&s->re, HP_TOK_GPT2_PATTERN, PCRE2_ZERO_TERMINATED, 0,
                                        "ByteLevel pattern"));
        return HP_OK;
    }
    if (strcmp(type, "Split") == 0) {
        HP_TRY(check_split_order(c, path));
        json_object *pat, *v, *beh;
        HP_TRY(member(c, o, path, "pattern", json_type_object, 1, &pat));
        snprintf(p2, sizeof(p2), "%s.pattern", path);
        int literal = 0;
        HP_TRY(member(c, pat, p2, "Regex", json_type_string, 0, &v));
        if (!v) {
            HP_TRY(member(c, pat, p2, "String", json_type_string, 0, &v));
            if (!v) return jerr(c, HP_ERR_FORMAT, p2, "expected {\"Regex\": ...} or {\"String\": ...}");
            literal = 1;
        }
        HP_TRY(member(c, o, path, "behavior", json_type_string, 1, &beh));
        int behavior;
        HP_TRY(parse_behavior(c, beh, path, &behavior));
        int invert;
        HP_TRY(member_bool(c, o, path, "invert", 0, &invert));
        stage_t *s;
        HP_TRY(add_stage(c, &s, path));
        s->kind = STAGE_SPLIT;
        s->behavior = behavior;
        s->invert = invert;
        char what[600];
        snprintf(what, sizeof(what), "%s: %s.%s", c->file, p2, literal ? "String" : "Regex");
        return hp_tok_regex_compile(&s->re, json_object_get_string(v),
                                    (size_t)json_object_get_string_len(v), literal, what);
    }
    /* HF's fixed splitters are Splits with a pattern matching one character (or, for
     * Whitespace, its regex) and a behaviour. */
    const char *pattern = NULL;
    int behavior = SPLIT_ISOLATED, invert = 0;
    if (strcmp(type, "Digits") == 0) {
        int individual;
        HP_TRY(member_bool(c, o, path, "individual_digits", 0, &individual));
        pattern = "\\p{N}"; /* char::is_numeric */
        behavior = individual ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
    } else if (strcmp(type, "Punctuation") == 0) {
        json_object *beh;
        HP_TRY(member(c, o, path, "behavior", json_type_string, 0, &beh));
        HP_TRY(parse_behavior(c, beh, path, &behavior));
        pattern = "[\\p{P}!-\\/:-@\\[-\\x{60}{-~]"; /* Unicode P* or ASCII punctuation */
    } else if (strcmp(type, "WhitespaceSplit") == 0) {
        pattern = "\\s";
        behavior = SPLIT_REMOVED;
    } else if (strcmp(type, "Whitespace") == 0) {
        pattern = "\\w+|[^\\w\\s]+";
        behavior = SPLIT_REMOVED;
        invert = 1;
    }
    if (pattern) {
        HP_TRY(check_split_order(c, path));
        stage_t *s;
        HP_TRY(add_stage(c, &s, path));
        s->kind = STAGE_SPLIT;
        s->behavior = behavior;
        s->invert = invert;
        return hp_tok_regex_compile(&s->re, pattern, PCRE2_ZERO_TERMINATED, 0, type);
    }
    return jerr(c, HP_ERR_UNSUPPORTED, path,
                "pre-tokenizer type \"%s\" is not supported (supported: ByteLevel, Split, "
                "Digits, Punctuation, Whitespace, WhitespaceSplit, Sequence of those)",
                type);
}

static hp_status_t parse_template(ctx_t *c, json_object *o, const char *path) {
    hp_tokenizer_t t = c->t;
    json_object *single, *specials;
    char p2[512];
    HP_TRY(member(c, o, path, "single", json_type_array, 1, &single));
    HP_TRY(member(c, o, path, "special_tokens", json_type_object, 1, &specials));
    size_t n = json_object_array_length(single);
    int seen_a = 0;
    free(t->prefix);
    free(t->suffix);
    t->prefix = t->suffix = NULL;
    t->n_prefix = t->n_suffix = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *item = json_object_array_get_idx(single, i), *v, *id;
        snprintf(p2, sizeof(p2), "%s.single[%zu]", path, i);
        if (!json_object_is_type(item, json_type_object))
            return jerr(c, HP_ERR_FORMAT, p2, "is %s, expected an object", type_name(item));
        HP_TRY(member(c, item, p2, "Sequence", json_type_object, 0, &v));
        if (v) {
            HP_TRY(member(c, v, p2, "id", json_type_string, 1, &id));
            if (strcmp(json_object_get_string(id), "A") != 0 || seen_a)
                return jerr(c, HP_ERR_FORMAT, p2, "the single template must hold $A once");
            seen_a = 1;
            continue;
        }
        HP_TRY(member(c, item, p2, "SpecialToken", json_type_object, 0, &v));
        if (!v) return jerr(c, HP_ERR_FORMAT, p2, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
        HP_TRY(member(c, v, p2, "id", json_type_string, 1, &id));
        const char *name = json_object_get_string(id);
        json_object *sp, *ids;
        char p3[600];
        snprintf(p3, sizeof(p3), "%s.special_tokens", path);
        if (!json_object_object_get_ex(specials, name, &sp))
            return jerr(c, HP_ERR_FORMAT, p3, "has no entry \"%s\" used by %s", name, p2);
        snprintf(p3, sizeof(p3), "%s.special_tokens[\"%s\"]", path, name);
        if (!json_object_is_type(sp, json_type_object))
            return jerr(c, HP_ERR_FORMAT, p3, "is %s, expected an object", type_name(sp));
        HP_TRY(member(c, sp, p3, "ids", json_type_array, 1, &ids));
        size_t k = json_object_array_length(ids);
        for (size_t j = 0; j < k; j++) {
            int32_t x;
            char p4[700];
            snprintf(p4, sizeof(p4), "%s.ids[%zu]", p3, j);
            HP_TRY(check_id(c, json_object_array_get_idx(ids, j), p4, &x));
            int32_t **arr = seen_a ? &t->suffix : &t->prefix;
            int *cnt = seen_a ? &t->n_suffix : &t->n_prefix;
            int32_t *p = realloc(*arr, (size_t)(*cnt + 1) * sizeof(int32_t));
            if (!p) return hp_error(HP_ERR_OOM, "%s: %s: out of memory", c->file, p4);
            *arr = p;
            p[(*cnt)++] = x;
        }
    }
    if (!seen_a) return jerr(c, HP_ERR_FORMAT, path, "the single template has no $A");
    return HP_OK;
}

static hp_status_t parse_post(ctx_t *c, json_object *o, const char *path) {
    const char *type;
    char p2[512];
    HP_TRY(member_type(c, o, path, &type));
    if (strcmp(type, "ByteLevel") == 0) return HP_OK; /* offsets only */
    if (strcmp(type, "TemplateProcessing") == 0) return parse_template(c, o, path);
    if (strcmp(type, "Sequence") == 0) {
        json_object *arr;
        HP_TRY(member(c, o, path, "processors", json_type_array, 1, &arr));
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            snprintf(p2, sizeof(p2), "%s.processors[%zu]", path, i);
            HP_TRY(parse_post(c, json_object_array_get_idx(arr, i), p2));
        }
        return HP_OK;
    }
    if (strcmp(type, "RobertaProcessing") == 0 || strcmp(type, "BertProcessing") == 0) {
        json_object *cls, *sep;
        HP_TRY(member(c, o, path, "cls", json_type_array, 1, &cls));
        HP_TRY(member(c, o, path, "sep", json_type_array, 1, &sep));
        int32_t cid, sid;
        snprintf(p2, sizeof(p2), "%s.cls[1]", path);
        HP_TRY(check_id(c, json_object_array_get_idx(cls, 1), p2, &cid));
        snprintf(p2, sizeof(p2), "%s.sep[1]", path);
        HP_TRY(check_id(c, json_object_array_get_idx(sep, 1), p2, &sid));
        hp_tokenizer_t t = c->t;
        free(t->prefix);
        free(t->suffix);
        t->prefix = malloc(sizeof(int32_t));
        t->suffix = malloc(sizeof(int32_t));
        if (!t->prefix || !t->suffix) return hp_error(HP_ERR_OOM, "%s: %s: out of memory", c->file, path);
        t->prefix[0] = cid, t->suffix[0] = sid;
        t->n_prefix = t->n_suffix = 1;
        return HP_OK;
    }
    return jerr(c, HP_ERR_UNSUPPORTED, path,
                "post-processor type \"%s\" is not supported (supported: ByteLevel, "
                "TemplateProcessing, RobertaProcessing, BertProcessing, Sequence of those)",
                type);
}

static hp_status_t parse_added(ctx_t *c, json_object *arr) {
    hp_tokenizer_t t = c->t;
    size_t n = json_object_array_length(arr);
    t->added = hp_calloc(n ? n : 1, sizeof(added_t));
    if (!t->added) return HP_ERR_OOM;
    char path[128];
    for (size_t i = 0; i < n; i++) {
        json_object *o = json_object_array_get_idx(arr, i), *v;
        snprintf(path, sizeof(path), "added_tokens[%zu]", i);
        if (!json_object_is_type(o, json_type_object))
            return jerr(c, HP_ERR_FORMAT, path, "is %s, expected an object", type_name(o));
        added_t *a = &t->added[t->n_added];
        HP_TRY(member(c, o, path, "id", json_type_int, 1, &v));
        HP_TRY(check_id(c, v, path, &a->id));
        HP_TRY(member(c, o, path, "content", json_type_string, 1, &v));
        a->len = (size_t)json_object_get_string_len(v);
        if (a->len == 0) return jerr(c, HP_ERR_FORMAT, path, "content is empty");
        if (hp_tok_utf8_check(json_object_get_string(v), a->len) != a->len)
            return jerr(c, HP_ERR_FORMAT, path, "content is not valid UTF-8");
        a->content = strndup(json_object_get_string(v), a->len);
        if (!a->content) return HP_ERR_OOM;
        t->n_added++;
        HP_TRY(member_bool(c, o, path, "special", 0, &a->special));
        HP_TRY(member_bool(c, o, path, "normalized", !a->special, &a->normalized));
        HP_TRY(member_bool(c, o, path, "lstrip", 0, &a->lstrip));
        HP_TRY(member_bool(c, o, path, "rstrip", 0, &a->rstrip));
        HP_TRY(member_bool(c, o, path, "single_word", 0, &a->single_word));
        if (a->single_word && !t->has_word_char) {
            /* HF tests the neighbours with Rust's regex \w (Unicode). */
            HP_TRY(hp_tok_regex_compile(&t->word_char,
                                        "^(?:\\p{Alphabetic}|\\p{M}|\\p{Nd}|\\p{Pc}|\\p{Join_Control})",
                                        PCRE2_ZERO_TERMINATED, 0, "single_word class"));
            t->has_word_char = 1;
        }
    }
    return HP_OK;
}

static hp_status_t parse_model(ctx_t *c, json_object *model) {
    hp_tokenizer_t t = c->t;
    json_object *v, *vocab, *merges;
    const char *type = "BPE";
    if (!json_object_is_type(model, json_type_object))
        return jerr(c, HP_ERR_FORMAT, "model", "is %s, expected an object", type_name(model));
    HP_TRY(member(c, model, "model", "type", json_type_string, 0, &v));
    if (v) type = json_object_get_string(v);
    if (strcmp(type, "BPE") != 0)
        return jerr(c, HP_ERR_UNSUPPORTED, "model.type",
                    "model \"%s\" is not supported (supported: BPE with a byte-level vocabulary)",
                    type);
    HP_TRY(member(c, model, "model", "byte_fallback", json_type_boolean, 0, &v));
    if (v && json_object_get_boolean(v))
        return jerr(c, HP_ERR_UNSUPPORTED, "model.byte_fallback",
                    "byte_fallback = true is not supported (byte-level BPE needs none)");
    static const char *must_null[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        if (json_object_object_get_ex(model, must_null[i], &v) && v &&
            !(json_object_is_type(v, json_type_string) && json_object_get_string_len(v) == 0))
            return jerr(c, HP_ERR_UNSUPPORTED, "model", "%s must be null for byte-level BPE",
                        must_null[i]);
    }
    if (json_object_object_get_ex(model, "dropout", &v) && v &&
        !(json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)))
        return jerr(c, HP_ERR_FORMAT, "model.dropout", "is %s, expected null or a number", type_name(v));
    if (v && json_object_get_double(v) != 0.0)
        return jerr(c, HP_ERR_UNSUPPORTED, "model.dropout", "BPE dropout is not supported; set it to null");
    HP_TRY(member_bool(c, model, "model", "ignore_merges", 0, &t->ignore_merges));
    HP_TRY(member_bool(c, model, "model", "fuse_unk", 0, &t->fuse_unk));
    json_object *unk;
    HP_TRY(member(c, model, "model", "unk_token", json_type_string, 0, &unk));
    t->unk_id = -1;
    HP_TRY(member(c, model, "model", "vocab", json_type_object, 1, &vocab));
    HP_TRY(member(c, model, "model", "merges", json_type_array, 1, &merges));
    if (unk) {
        json_object *idv;
        t->has_unk = 1;
        /* HF only fails when an unknown byte needs it; so do we (in encode). */
        if (json_object_object_get_ex(vocab, json_object_get_string(unk), &idv) &&
            json_object_is_type(idv, json_type_int))
            t->unk_id = (int32_t)json_object_get_int64(idv);
    }

    /* Sizes first: ids of the vocabulary and of the added tokens. */
    int32_t max_id = -1;
    char path[1024];
    json_object_object_foreach(vocab, key, val) {
        int32_t id;
        snprintf(path, sizeof(path), "model.vocab[\"%.200s\"]", key);
        HP_TRY(check_id(c, val, path, &id));
        if (id > max_id) max_id = id;
    }
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    if (max_id < 0) return jerr(c, HP_ERR_FORMAT, "model.vocab", "is empty");
    t->n_ids = max_id + 1;
    t->spelling = hp_calloc((size_t)t->n_ids, sizeof(char *));
    t->dec = hp_calloc((size_t)t->n_ids, sizeof(char *));
    t->dec_len = hp_calloc((size_t)t->n_ids, sizeof(uint32_t));
    t->special = hp_calloc((size_t)t->n_ids, 1);
    if (!t->spelling || !t->dec || !t->dec_len || !t->special) return HP_ERR_OOM;
    HP_TRY(hp_tok_strmap_init(&t->spell_map, (size_t)json_object_object_length(vocab) + t->n_added));
    HP_TRY(hp_tok_strmap_init(&t->vocab_bytes, (size_t)json_object_object_length(vocab)));

    for (size_t i = 0; i < t->n_added; i++) {
        added_t *a = &t->added[i];
        snprintf(path, sizeof(path), "added_tokens[%zu]", i);
        HP_TRY(set_spelling(c, a->id, a->content, a->len, path));
        t->special[a->id] |= (uint8_t)a->special;
        t->added_first[a->normalized ? 1 : 0][(unsigned char)a->content[0]] = 1;
        int64_t *slot;
        HP_TRY(hp_tok_strmap_put(&t->spell_map, a->content, a->len, a->id, &slot, NULL));
    }
    char *buf = malloc(4096);
    if (!buf) return HP_ERR_OOM;
    hp_status_t st = HP_OK;
    {
        json_object_object_foreach(vocab, key, val) {
            int32_t id = (int32_t)json_object_get_int64(val);
            size_t klen = strlen(key);
            snprintf(path, sizeof(path), "model.vocab[\"%.200s\"]", key);
            int64_t *slot;
            int inserted;
            if ((st = hp_tok_strmap_put(&t->spell_map, key, klen, id, &slot, &inserted))) break;
            if (t->spelling[id] && strcmp(t->spelling[id], key) != 0) {
                int is_added = 0;
                for (size_t i = 0; i < t->n_added; i++) is_added |= t->added[i].id == id;
                if (!is_added) {
                    st = jerr(c, HP_ERR_FORMAT, path, "id %d is also used by \"%.200s\"", id,
                              t->spelling[id]);
                    break;
                }
            }
            if ((st = set_spelling(c, id, key, klen, path))) break;
            size_t bl;
            if (klen <= 4096 && spelling_to_bytes(c, key, klen, buf, &bl)) {
                if ((st = hp_tok_strmap_put(&t->vocab_bytes, buf, bl, id, &slot, NULL))) break;
                if (bl == 1 && t->byte_id[(unsigned char)buf[0]] < 0)
                    t->byte_id[(unsigned char)buf[0]] = id;
            }
        }
    }
    free(buf);
    HP_TRY(st);
    /* A vocab of added tokens only (HF allows it) encodes every text to nothing: a trainer
     * would see BOS/EOS only. Refuse it here, where the file is named. */
    size_t n_plain = 0;
    for (int32_t id = 0; id < t->n_ids; id++) n_plain += t->spelling[id] != NULL;
    for (size_t i = 0; i < t->n_added; i++) {
        int first = 1; /* an id listed twice in added_tokens counts once */
        for (size_t k = 0; k < i; k++) first &= t->added[k].id != t->added[i].id;
        n_plain -= first;
    }
    if (n_plain == 0)
        return jerr(c, HP_ERR_FORMAT, "model.vocab",
                    "has no tokens besides the %zu added tokens; expected the BPE vocabulary "
                    "(the byte tokens and the merged tokens) so that text encodes to ids",
                    t->n_added);

    size_t nm = json_object_array_length(merges);
    size_t cap = 64;
    while (cap < nm * 2 + 2) cap <<= 1;
    t->merges = malloc(cap * sizeof(merge_entry_t));
    if (!t->merges) return hp_error(HP_ERR_OOM, "%s: model.merges: out of memory", c->file);
    memset(t->merges, 0xFF, cap * sizeof(merge_entry_t));
    t->merges_cap = cap;
    char *cat = NULL;
    size_t cat_cap = 0;
    for (size_t i = 0; i < nm; i++) {
        json_object *m = json_object_array_get_idx(merges, i);
        const char *parts[2];
        size_t plen[2];
        snprintf(path, sizeof(path), "model.merges[%zu]", i);
        if (json_object_is_type(m, json_type_string)) {
            const char *s = json_object_get_string(m);
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                free(cat);
                return jerr(c, HP_ERR_FORMAT, path,
                            "\"%.200s\" is not of the form \"left right\" (one space)", s);
            }
            parts[0] = s, plen[0] = (size_t)(sp - s);
            parts[1] = sp + 1, plen[1] = strlen(sp + 1);
        } else if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2 &&
                   json_object_is_type(json_object_array_get_idx(m, 0), json_type_string) &&
                   json_object_is_type(json_object_array_get_idx(m, 1), json_type_string)) {
            for (int k = 0; k < 2; k++) {
                json_object *e = json_object_array_get_idx(m, (size_t)k);
                parts[k] = json_object_get_string(e);
                plen[k] = (size_t)json_object_get_string_len(e);
            }
        } else {
            free(cat);
            return jerr(c, HP_ERR_FORMAT, path,
                        "is %s, expected \"left right\" or [\"left\", \"right\"]", type_name(m));
        }
        if (plen[0] + plen[1] + 1 > cat_cap) {
            cat_cap = (plen[0] + plen[1] + 1) * 2;
            char *p = realloc(cat, cat_cap);
            if (!p) {
                free(cat);
                return HP_ERR_OOM;
            }
            cat = p;
        }
        int32_t ids[3];
        for (int k = 0; k < 3; k++) {
            size_t kl = k < 2 ? plen[k] : plen[0] + plen[1];
            if (k < 2) {
                memcpy(cat, parts[k], kl);
            } else {
                memcpy(cat, parts[0], plen[0]);
                memcpy(cat + plen[0], parts[1], plen[1]);
            }
            cat[kl] = 0;
            json_object *idv;
            /* json-c keys are NUL-terminated; a part with an embedded NUL cannot match. */
            if (strlen(cat) != kl || !json_object_object_get_ex(vocab, cat, &idv)) {
                char tmp[256];
                snprintf(tmp, sizeof(tmp), "%.200s", cat);
                free(cat);
                if (k < 2)
                    return jerr(c, HP_ERR_FORMAT, path,
                                "token \"%s\" is not in model.vocab (a merge must join two "
                                "vocabulary tokens)",
                                tmp);
                return jerr(c, HP_ERR_FORMAT, path,
                            "the merged token \"%s\" is not in model.vocab", tmp);
            }
            ids[k] = (int32_t)json_object_get_int64(idv);
        }
        merge_put(t, ids[0], ids[1], (int32_t)i, ids[2]);
    }
    free(cat);
    return HP_OK;
}

static void infer_bos_eos(hp_tokenizer_t t) {
    t->bos = t->n_prefix > 0 ? t->prefix[0] : -1;
    t->eos = t->n_suffix > 0 ? t->suffix[0] : -1;
    static const char *bos_names[] = {"<|begin_of_text|>", "<s>", "<|startoftext|>", "<bos>"};
    static const char *eos_names[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>"};
    for (int k = 0; k < 4; k++) {
        for (size_t i = 0; i < t->n_added; i++) {
            if (!t->added[i].special) continue;
            if (t->bos < 0 && strcmp(t->added[i].content, bos_names[k]) == 0) t->bos = t->added[i].id;
            if (t->eos < 0 && strcmp(t->added[i].content, eos_names[k]) == 0) t->eos = t->added[i].id;
        }
    }
}

static hp_status_t load_doc(ctx_t *c, json_object *root) {
    hp_tokenizer_t t = c->t;
    json_object *v;
    if (!json_object_is_type(root, json_type_object))
        return jerr(c, HP_ERR_FORMAT, "$", "is %s, expected a tokenizer.json object", type_name(root));
    HP_TRY(member(c, root, "$", "normalizer", json_type_object, 0, &v));
    if (v) {
        const char *type;
        HP_TRY(member_type(c, v, "normalizer", &type));
        return jerr(c, HP_ERR_UNSUPPORTED, "normalizer",
                    "normalizer \"%s\" is not supported (supported: null, as in GPT-2 and "
                    "Llama 3 tokenizers)",
                    type);
    }
    HP_TRY(member(c, root, "$", "decoder", json_type_object, 0, &v));
    if (v) {
        const char *type;
        HP_TRY(member_type(c, v, "decoder", &type));
        if (strcmp(type, "ByteLevel") != 0)
            return jerr(c, HP_ERR_UNSUPPORTED, "decoder",
                        "decoder \"%s\" is not supported (supported: ByteLevel, null)", type);
        t->decoder_bytelevel = 1;
    }
    json_object *added, *model, *pre, *post;
    HP_TRY(member(c, root, "$", "added_tokens", json_type_array, 0, &added));
    if (added) HP_TRY(parse_added(c, added));
    HP_TRY(member(c, root, "$", "model", json_type_object, 1, &model));
    HP_TRY(parse_model(c, model));
    HP_TRY(member(c, root, "$", "pre_tokenizer", json_type_object, 0, &pre));
    if (!pre)
        return jerr(c, HP_ERR_UNSUPPORTED, "pre_tokenizer",
                    "is null; byte-level BPE needs a ByteLevel pre-tokenizer (supported: "
                    "ByteLevel, Split, Sequence of those)");
    HP_TRY(parse_stage(c, pre, "pre_tokenizer"));
    int has_bl = 0;
    for (int i = 0; i < t->n_stages; i++) has_bl |= t->stages[i].kind == STAGE_BYTELEVEL;
    if (!has_bl)
        return jerr(c, HP_ERR_UNSUPPORTED, "pre_tokenizer",
                    "has no ByteLevel step; only byte-level BPE is supported");
    HP_TRY(member(c, root, "$", "post_processor", json_type_object, 0, &post));
    if (post) HP_TRY(parse_post(c, post, "post_processor"));
    for (int i = 0; i < t->n_prefix; i++)
        if (t->prefix[i] >= t->n_ids || !t->spelling[t->prefix[i]])
            return jerr(c, HP_ERR_FORMAT, "post_processor", "special id %d is not in the vocabulary", t->prefix[i]);
    for (int i = 0; i < t->n_suffix; i++)
        if (t->suffix[i] >= t->n_ids || !t->spelling[t->suffix[i]])
            return jerr(c, HP_ERR_FORMAT, "post_processor", "special id %d is not in the vocabulary", t->suffix[i]);
    infer_bos_eos(t);
    return hp_tok_strmap_init(&t->cache, 4096);
}

hp_status_t hp_tokenizer_load_json(hp_tokenizer_t *out, const char *json, size_t len,
                                   const char *name) {
    *out = NULL;
    if (!name) name = "tokenizer.json";
    if (len > INT32_MAX)
        return hp_error(HP_ERR_FORMAT, "%s: %zu bytes is too large for a tokenizer.json", name, len);
    json_tokener *tk = json_tokener_new();
    if (!tk) return hp_error(HP_ERR_OOM, "%s: cannot create a JSON parser", name);
    json_object *root = json_tokener_parse_ex(tk, json, (int)len);
    enum json_tokener_error jerr_ = json_tokener_get_error(tk);
    size_t end = json_tokener_get_parse_end(tk);
    json_tokener_free(tk);
    if (!root || jerr_ != json_tokener_success) {
        if (root) json_object_put(root);
        return hp_error(HP_ERR_FORMAT,
                        "%s: not valid JSON (%s near byte %zu); expected a HF tokenizer.json",
                        name, jerr_ == json_tokener_continue ? "unexpected end of input"
                                                             : json_tokener_error_desc(jerr_),
                        end);
    }
    for (size_t i = end; i < len; i++) {
        if (json[i] != ' ' && json[i] != '\n' && json[i] != '\r' && json[i] != '\t') {
            json_object_put(root);
            return hp_error(HP_ERR_FORMAT, "%s: trailing data after the JSON document at byte %zu",
                            name, i);
        }
    }
    hp_tokenizer_t t = hp_calloc(1, sizeof(*t));
    if (!t) {
        json_object_put(root);
        return HP_ERR_OOM;
    }
    ctx_t c = {.file = name, .t = t};
    hp_tok_byte_to_cp(c.byte_cp);
    for (int i = 0; i < 512; i++) c.cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) c.cp_byte[c.byte_cp[b]] = b;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    t->bos = t->eos = -1;
    t->name = strdup(name);
    hp_status_t st = t->name ? load_doc(&c, root) : HP_ERR_OOM;
    json_object_put(root);
    if (st != HP_OK) {
        hp_tokenizer_free(t);
        return st;
    }
    *out = t;
    return HP_OK;
}

hp_status_t hp_tokenizer_load(hp_tokenizer_t *out, const char *path) {
    *out = NULL;
    char *buf;
    size_t len;
    hp_status_t st = hp_file_read_all(path, "tokenizer file", (size_t)1 << 30, &buf, &len);
    if (st != HP_OK) return hp_error(st, "%s (train one with `hp-tokenizer train`)", hp_last_error());
    st = hp_tokenizer_load_json(out, buf, len, path);
    free(buf);
    return st;
}

void hp_tokenizer_free(hp_tokenizer_t t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_ids; i++) {
        if (t->spelling) free(t->spelling[i]);
        if (t->dec) free(t->dec[i]);
    }
    free(t->spelling);
    free(t->dec);
    free(t->dec_len);
    free(t->special);
    hp_tok_strmap_free(&t->vocab_bytes);
    hp_tok_strmap_free(&t->spell_map);
    hp_tok_strmap_free(&t->cache);
    free(t->merges);
    for (int i = 0; i < t->n_stages; i++) hp_tok_regex_free(&t->stages[i].re);
    hp_tok_regex_free(&t->word_char);
    free(t->stages);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->prefix);
    free(t->suffix);
    free(t->pool);
    free(t->sa);
    free(t->sb);
    free(t->sc);
    free(t->seg1);
    free(t->seg2);
    free(t->sym_id);
    free(t->sym_prev);
    free(t->sym_next);
    free(t->sym_len);
    free(t->heap);
    free(t->cache_ids);
    free(t->name);
    free(t);
}

/* ---- accessors ---------------------------------------------------------------------- */

int32_t hp_tokenizer_vocab_size(hp_tokenizer_t t) { return t->n_ids; }
int32_t hp_tokenizer_bos_id(hp_tokenizer_t t) { return t->bos; }
int32_t hp_tokenizer_eos_id(hp_tokenizer_t t) { return t->eos; }

hp_status_t hp_tokenizer_set_bos_eos(hp_tokenizer_t t, int32_t bos, int32_t eos) {
    if (bos >= t->n_ids || (bos >= 0 && !t->spelling[bos]) || bos < -1)
        return hp_error(HP_ERR_INVALID_ARG, "%s: BOS id %d is not in the vocabulary (size %d)",
                        t->name, bos, t->n_ids);
    if (eos >= t->n_ids || (eos >= 0 && !t->spelling[eos]) || eos < -1)
        return hp_error(HP_ERR_INVALID_ARG, "%s: EOS id %d is not in the vocabulary (size %d)",
                        t->name, eos, t->n_ids);
    t->bos = bos;
    t->eos = eos;
    return HP_OK;
}

int32_t hp_tokenizer_token_to_id(hp_tokenizer_t t, const char *token) {
    int64_t *v = hp_tok_strmap_get(&t->spell_map, token, strlen(token));
    return v ? (int32_t)*v : -1;
}

const char *hp_tokenizer_id_to_token(hp_tokenizer_t t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->spelling[id] : NULL;
}

const char *hp_tokenizer_token_bytes(hp_tokenizer_t t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->spelling[id]) return NULL;
    *len = t->dec_len[id];
    return t->dec[id];
}

int hp_tokenizer_is_special(hp_tokenizer_t t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->special[id];
}

/* ---- encode ------------------------------------------------------------------------- */

/* Rust's char::is_whitespace (Unicode White_Space). */
static int is_ws(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Leftmost-longest added-token match in s[from..n) among tokens of the given pass
 * (normalized or not). Returns the token index or -1. */
static long find_added(hp_tokenizer_t t, int normalized, const char *s, size_t n,
                       size_t from, size_t *ms) {
    const uint8_t *first = t->added_first[normalized];
    for (size_t p = from; p < n; p++) {
        if (!first[(unsigned char)s[p]]) continue;
        long best = -1;
        size_t best_len = 0;
        for (size_t i = 0; i < t->n_added; i++) {
            const added_t *a = &t->added[i];
            if ((a->normalized != 0) != normalized || a->len > n - p || a->len <= best_len) continue;
            if (a->content[0] == s[p] && memcmp(a->content, s + p, a->len) == 0) {
                best = (long)i;
                best_len = a->len;
            }
        }
        if (best >= 0) {
            *ms = p;
            return best;
        }
    }
    return -1;
}

/* Whether the character ending at `pos` (not before `lo`) / starting at `pos` (before `hi`)
 * is a word character in Rust's regex sense (HF's single_word test). */
static int is_word_at(hp_tokenizer_t t, const char *s, size_t a, size_t b) {
    size_t ms, me;
    return hp_tok_regex_next(&t->word_char, s + a, b - a, 0, &ms, &me) == 1;
}

static int word_before(hp_tokenizer_t t, const char *s, size_t lo, size_t pos) {
    if (pos <= lo) return 0;
    size_t q = pos - 1;
    while (q > lo && ((unsigned char)s[q] & 0xC0) == 0x80) q--;
    return is_word_at(t, s, q, pos);
}

static int word_after(hp_tokenizer_t t, const char *s, size_t pos, size_t hi) {
    if (pos >= hi) return 0;
    uint32_t cp;
    int l = hp_tok_utf8_get(s + pos, hi - pos, &cp);
    return is_word_at(t, s, pos, pos + (size_t)(l ? l : 1));
}

/* Splits s[off..off+len) by added tokens of one pass into out spans (HF find_matches,
 * including lstrip / rstrip). */
static hp_status_t split_added(hp_tokenizer_t t, int normalized, int special_as_text,
                               const char *s, size_t off, size_t len, span_t **out, size_t *cap,
                               size_t *n) {
    size_t start_offset = off, end = off + len, from = off, ms;
    long k;
    while (from < end && (k = find_added(t, normalized, s, end, from, &ms)) >= 0) {
        const added_t *a = &t->added[k];
        size_t start = ms, stop = ms + a->len;
        if ((special_as_text && a->special) ||
            (a->single_word && (word_before(t, s, off, start) || word_after(t, s, stop, end)))) {
            from = stop; /* skipped (HF's `continue`): the search goes on after it */
            continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > start_offset) {
                size_t q = ns - 1;
                while (q > start_offset && ((unsigned char)s[q] & 0xC0) == 0x80) q--;
                uint32_t cp;
                if (!hp_tok_utf8_get(s + q, ns - q, &cp) || !is_ws(cp)) break;
                ns = q;
            }
            start = ns;
        }
        if (a->rstrip) {
            uint32_t cp;
            int l;
            while (stop < end && (l = hp_tok_utf8_get(s + stop, end - stop, &cp)) && is_ws(cp))
                stop += (size_t)l;
        }
        HP_TRY(RESERVE(*out, *cap, *n + 2));
        if (start_offset < start) (*out)[(*n)++] = (span_t){start_offset, start - start_offset, -1};
        (*out)[(*n)++] = (span_t){start, stop - start, a->id};
        start_offset = stop;
        from = stop;
    }
    if (start_offset < end) {
        HP_TRY(RESERVE(*out, *cap, *n + 1));
        (*out)[(*n)++] = (span_t){start_offset, end - start_offset, -1};
    }
    return HP_OK;
}

static hp_status_t pool_reserve(hp_tokenizer_t t, size_t extra) {
    return RESERVE(t->pool, t->pool_cap, t->pool_len + extra);
}

/* Applies one pre-tokenizer step to the pieces sa[0..na) (offsets into the pool) giving
 * sb[0..*nb). */
static hp_status_t apply_stage(hp_tokenizer_t t, stage_t *st, size_t na, size_t *nb) {
    *nb = 0;
    for (size_t i = 0; i < na; i++) {
        span_t p = t->sa[i];
        if (st->kind == STAGE_BYTELEVEL && st->add_prefix_space && t->pool[p.off] != ' ') {
            HP_TRY(pool_reserve(t, p.len + 1));
            t->pool[t->pool_len] = ' ';
            memmove(t->pool + t->pool_len + 1, t->pool + p.off, p.len);
            p.off = t->pool_len;
            p.len += 1;
            t->pool_len += p.len;
        }
        if (st->kind == STAGE_BYTELEVEL && !st->use_regex) {
            HP_TRY(RESERVE(t->sb, t->sb_cap, *nb + 1));
            t->sb[(*nb)++] = p;
            continue;
        }
        /* Matches and gaps, as (offsets, is_match). */
        size_t nc = 0, prev = 0, pos = 0, ms, me;
        const char *s = t->pool + p.off;
        int rc;
        int have_last = 0;
        while (pos <= p.len && (rc = hp_tok_regex_next(&st->re, s, p.len, pos, &ms, &me)) != 0) {
            if (rc < 0) return HP_ERR_INVALID_ARG;
            if (me == ms) {
                /* Empty match: step one character; like onig's find_iter (HF), an empty
                 * match right at the end of the previous match is not reported. */
                uint32_t cp;
                int l = me < p.len ? hp_tok_utf8_get(s + me, p.len - me, &cp) : 1;
                pos = me + (size_t)(l ? l : 1);
                if (have_last && ms == prev) continue;
            } else {
                pos = me;
            }
            HP_TRY(RESERVE(t->sc, t->sc_cap, nc + 2));
            if (prev != ms) t->sc[nc++] = (span_t){p.off + prev, ms - prev, 0};
            t->sc[nc++] = (span_t){p.off + ms, me - ms, 1};
            prev = me;
            have_last = 1;
        }
        if (prev != p.len) {
            HP_TRY(RESERVE(t->sc, t->sc_cap, nc + 1));
            t->sc[nc++] = (span_t){p.off + prev, p.len - prev, 0};
        }
        int behavior = st->kind == STAGE_BYTELEVEL ? SPLIT_ISOLATED : st->behavior;
        if (st->kind == STAGE_SPLIT && st->invert)
            for (size_t j = 0; j < nc; j++) t->sc[j].id = !t->sc[j].id;
        HP_TRY(RESERVE(t->sb, t->sb_cap, *nb + nc));
        size_t first = *nb;
        int prev_match = 0;
        if (behavior == SPLIT_MERGED_NEXT) {
            /* HF folds from the right: a match joins the piece after it. */
            span_t *out = t->sb + first;
            size_t cnt = 0;
            for (size_t jj = nc; jj-- > 0;) {
                span_t m = t->sc[jj];
                if (m.id && !prev_match && cnt > 0) {
                    out[cnt - 1].len += out[cnt - 1].off - m.off;
                    out[cnt - 1].off = m.off;
                } else {
                    out[cnt++] = m;
                }
                prev_match = m.id;
            }
            for (size_t a = 0, b = cnt; a + 1 < b; a++, b--) {
                span_t tmp = out[a];
                out[a] = out[b - 1];
                out[b - 1] = tmp;
            }
            *nb += cnt;
        } else {
            for (size_t j = 0; j < nc; j++) {
                span_t m = t->sc[j];
                if (behavior == SPLIT_ISOLATED) {
                    t->sb[(*nb)++] = m;
                } else if (behavior == SPLIT_REMOVED) {
                    if (!m.id) t->sb[(*nb)++] = m;
                } else if (behavior == SPLIT_MERGED_PREV) {
                    if (m.id && !prev_match && *nb > first)
                        t->sb[*nb - 1].len = m.off + m.len - t->sb[*nb - 1].off;
                    else
                        t->sb[(*nb)++] = m;
                } else { /* contiguous */
                    if (m.id == prev_match && *nb > first)
                        t->sb[*nb - 1].len = m.off + m.len - t->sb[*nb - 1].off;
                    else
                        t->sb[(*nb)++] = m;
                }
                prev_match = m.id;
            }
        }
        /* Drop empty pieces, as PreTokenizedString::split does. */
        size_t w = first;
        for (size_t j = first; j < *nb; j++)
            if (t->sb[j].len) t->sb[w++] = t->sb[j];
        *nb = w;
    }
    return HP_OK;
}

static inline int heap_less(heap_item_t a, heap_item_t b) {
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static void heap_push(heap_item_t *h, size_t *n, heap_item_t x) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(x, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static heap_item_t heap_pop(heap_item_t *h, size_t *n) {
    heap_item_t top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        heap_item_t best = x;
        if (l < *n && heap_less(h[l], best)) m = l, best = h[l];
        if (r < *n && heap_less(h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = x;
    return top;
}

/* BPE of one pre-token (raw bytes), appending ids (HF Word::merge_all). */
static hp_status_t bpe_word(hp_tokenizer_t t, const char *w, size_t n, hp_token_ids_t *out) {
    if (n == 0) return HP_OK;
    if (t->ignore_merges) {
        int64_t *v = hp_tok_strmap_get(&t->vocab_bytes, w, n);
        if (v) return ids_push(out, (int32_t)*v);
    }
    int cacheable = n <= 256;
    if (cacheable) {
        int64_t *v = hp_tok_strmap_get(&t->cache, w, n);
        if (v) {
            size_t off = (size_t)(*v >> 16), cnt = (size_t)(*v & 0xFFFF);
            HP_TRY(ids_reserve(out, cnt));
            /* cnt is 0 for a word whose bytes all have no token (no unk: HF drops them);
             * then both arrays may still be NULL, and memcpy(NULL, .., 0) is undefined. */
            if (cnt) memcpy(out->ids + out->len, t->cache_ids + off, cnt * sizeof(int32_t));
            out->len += cnt;
            return HP_OK;
        }
    }
    if (n > t->sym_cap) {
        size_t cap = t->sym_cap ? t->sym_cap : 64;
        while (cap < n) cap *= 2;
        int32_t **arrs[4] = {&t->sym_id, &t->sym_prev, &t->sym_next, &t->sym_len};
        for (int k = 0; k < 4; k++) {
            int32_t *p = realloc(*arrs[k], cap * sizeof(int32_t));
            if (!p) return hp_error(HP_ERR_OOM, "tokenizer: cannot allocate BPE scratch");
            *arrs[k] = p;
        }
        t->sym_cap = cap;
    }
    HP_TRY(RESERVE(t->heap, t->heap_cap, 3 * n + 4));
    int32_t ns = 0;
    int pending_unk = 0; /* HF's `unk`: an unknown byte waiting to be added (or fused) */
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(unsigned char)w[i]];
        if (id < 0) {
            if (!t->has_unk) continue; /* no unk token: HF drops the character */
            if (t->unk_id < 0)
                return hp_error(HP_ERR_FORMAT, "%s: model.unk_token is not in model.vocab, but "
                                "byte 0x%02x has no token", t->name, (unsigned char)w[i]);
            if (pending_unk && t->fuse_unk) continue; /* fused into the previous unk */
            pending_unk = 1;
            id = t->unk_id;
        } else {
            pending_unk = 0;
        }
        t->sym_id[ns] = id;
        t->sym_len[ns] = 1;
        t->sym_prev[ns] = ns - 1;
        t->sym_next[ns] = ns + 1;
        ns++;
    }
    if (ns > 0) t->sym_next[ns - 1] = -1;
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < ns; i++) {
        const merge_entry_t *m = merge_get(t, t->sym_id[i], t->sym_id[i + 1]);
        if (m) heap_push(t->heap, &hn, (heap_item_t){m->rank, i, m->new_id});
    }
    while (hn > 0) {
        heap_item_t top = heap_pop(t->heap, &hn);
        int32_t p = top.pos;
        if (t->sym_len[p] == 0 || t->sym_next[p] == -1) continue;
        int32_t nx = t->sym_next[p];
        const merge_entry_t *m = merge_get(t, t->sym_id[p], t->sym_id[nx]);
        if (!m || m->new_id != top.new_id) continue; /* stale entry */
        t->sym_id[p] = top.new_id;
        t->sym_len[p] += t->sym_len[nx];
        t->sym_next[p] = t->sym_next[nx];
        t->sym_len[nx] = 0;
        if (t->sym_next[nx] >= 0) t->sym_prev[t->sym_next[nx]] = p;
        int32_t pv = t->sym_prev[p];
        if (pv >= 0) {
            const merge_entry_t *m2 = merge_get(t, t->sym_id[pv], t->sym_id[p]);
            if (m2) heap_push(t->heap, &hn, (heap_item_t){m2->rank, pv, m2->new_id});
        }
        int32_t nn = t->sym_next[p];
        if (nn >= 0) {
            const merge_entry_t *m2 = merge_get(t, t->sym_id[p], t->sym_id[nn]);
            if (m2) heap_push(t->heap, &hn, (heap_item_t){m2->rank, p, m2->new_id});
        }
    }
    size_t start = out->len;
    HP_TRY(ids_reserve(out, (size_t)ns));
    for (int32_t i = 0; i < ns; i++)
        if (t->sym_len[i]) out->ids[out->len++] = t->sym_id[i];
    if (cacheable) {
        size_t cnt = out->len - start;
        if (t->cache.count >= 100000 || t->cache_ids_len + cnt > (1u << 22)) {
            hp_tok_strmap_clear(&t->cache); /* bounded: start over */
            t->cache_ids_len = 0;
        }
        HP_TRY(RESERVE(t->cache_ids, t->cache_ids_cap, t->cache_ids_len + cnt));
        if (cnt) /* see above: an all-dropped word leaves out->ids and cache_ids NULL */
            memcpy(t->cache_ids + t->cache_ids_len, out->ids + start, cnt * sizeof(int32_t));
        HP_TRY(hp_tok_strmap_put(&t->cache, w, n, (int64_t)((t->cache_ids_len << 16) | cnt),
                                 NULL, NULL));
        t->cache_ids_len += cnt;
    }
    return HP_OK;
}

static hp_status_t encode_text(hp_tokenizer_t t, const char *s, size_t len, hp_token_ids_t *out) {
    t->pool_len = 0;
    HP_TRY(pool_reserve(t, len + 1));
    memcpy(t->pool, s, len);
    t->pool_len = len;
    HP_TRY(RESERVE(t->sa, t->sa_cap, 1));
    t->sa[0] = (span_t){0, len, 0};
    size_t na = 1;
    for (int i = 0; i < t->n_stages; i++) {
        size_t nb;
        HP_TRY(apply_stage(t, &t->stages[i], na, &nb));
        span_t *tmp = t->sa;
        size_t tc = t->sa_cap;
        t->sa = t->sb, t->sa_cap = t->sb_cap;
        t->sb = tmp, t->sb_cap = tc;
        na = nb;
    }
    for (size_t i = 0; i < na; i++) HP_TRY(bpe_word(t, t->pool + t->sa[i].off, t->sa[i].len, out));
    return HP_OK;
}

hp_status_t hp_tokenizer_encode(hp_tokenizer_t t, const char *text, size_t len, unsigned flags,
                                hp_token_ids_t *out) {
    size_t bad = hp_tok_utf8_check(text, len);
    if (bad != len)
        return hp_error(HP_ERR_INVALID_ARG,
                        "%s: encode: the text is not valid UTF-8 at byte %zu of %zu (byte 0x%02x)",
                        t->name, bad, len, (unsigned char)text[bad]);
    if ((flags & HP_TOKENIZE_ADD_BOS) && t->bos < 0)
        return hp_error(HP_ERR_STATE, "%s: encode with ADD_BOS but the tokenizer has no BOS "
                        "token (set one with hp_tokenizer_set_bos_eos)", t->name);
    if ((flags & HP_TOKENIZE_ADD_EOS) && t->eos < 0)
        return hp_error(HP_ERR_STATE, "%s: encode with ADD_EOS but the tokenizer has no EOS "
                        "token (set one with hp_tokenizer_set_bos_eos)", t->name);
    size_t n0 = out->len;
    if (flags & HP_TOKENIZE_ADD_SPECIAL)
        for (int i = 0; i < t->n_prefix; i++) HP_TRY(ids_push(out, t->prefix[i]));
    /* Added tokens: the non-normalized ones on the raw text, then the normalized ones on
     * what is left (no normalizer, so both see the same bytes). */
    size_t n1 = 0, n2 = 0;
    int as_text = (flags & HP_TOKENIZE_SPECIAL_AS_TEXT) != 0;
    HP_TRY(split_added(t, 0, as_text, text, 0, len, &t->seg1, &t->seg1_cap, &n1));
    for (size_t i = 0; i < n1; i++) {
        if (t->seg1[i].id >= 0) {
            HP_TRY(RESERVE(t->seg2, t->seg2_cap, n2 + 1));
            t->seg2[n2++] = t->seg1[i];
        } else {
            HP_TRY(split_added(t, 1, as_text, text, t->seg1[i].off, t->seg1[i].len, &t->seg2,
                               &t->seg2_cap, &n2));
        }
    }
    for (size_t i = 0; i < n2; i++) {
        span_t g = t->seg2[i];
        HP_TRY(g.id >= 0 ? ids_push(out, g.id) : encode_text(t, text + g.off, g.len, out));
    }
    if (flags & HP_TOKENIZE_ADD_SPECIAL)
        for (int i = 0; i < t->n_suffix; i++) HP_TRY(ids_push(out, t->suffix[i]));
    if ((flags & HP_TOKENIZE_ADD_BOS) && (out->len == n0 || out->ids[n0] != t->bos)) {
        HP_TRY(ids_push(out, 0));
        memmove(out->ids + n0 + 1, out->ids + n0, (out->len - n0 - 1) * sizeof(int32_t));
        out->ids[n0] = t->bos;
    }
    if ((flags & HP_TOKENIZE_ADD_EOS) && (out->len == n0 || out->ids[out->len - 1] != t->eos))
        HP_TRY(ids_push(out, t->eos));
    return HP_OK;
}

/* ---- decode ------------------------------------------------------------------------- */

/* Length of the maximal prefix of s that could start a valid UTF-8 sequence (>= 1), the
 * unit that String::from_utf8_lossy replaces by one U+FFFD. */
static size_t invalid_unit(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) need = 2;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else return 1;
    size_t i = 1;
    while (i <= need && i < n) {
        unsigned x = s[i];
        if (x < lo || x > hi) break;
        lo = 0x80, hi = 0xBF;
        i++;
    }
    return i;
}

hp_status_t hp_tokenizer_decode(hp_tokenizer_t t, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *text_len) {
    *text = NULL;
    if (text_len) *text_len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->spelling[id])
            return hp_error(HP_ERR_INVALID_ARG,
                            "%s: decode: id %d at position %zu is not in the vocabulary (size %d)",
                            t->name, id, i, t->n_ids);
        total += t->dec_len[id] + 1;
    }
    char *raw = malloc(total + 1);
    if (!raw) return hp_error(HP_ERR_OOM, "%s: decode: cannot allocate %zu bytes", t->name, total);
    size_t len = 0, kept = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if ((flags & HP_DETOKENIZE_SKIP_SPECIAL) && t->special[id]) continue;
        if (!t->decoder_bytelevel && kept++) raw[len++] = ' '; /* no decoder: HF joins with spaces */
        memcpy(raw + len, t->dec[id], t->dec_len[id]);
        len += t->dec_len[id];
    }
    /* Lossy UTF-8: each invalid unit becomes U+FFFD (3 bytes). */
    char *res = malloc(len * 3 + 1);
    if (!res) {
        free(raw);
        return hp_error(HP_ERR_OOM, "%s: decode: cannot allocate %zu bytes", t->name, len * 3);
    }
    size_t i = 0, o = 0;
    while (i < len) {
        uint32_t cp;
        int k = (unsigned char)raw[i] < 0x80 ? 1 : hp_tok_utf8_get(raw + i, len - i, &cp);
        if (k > 0) {
            memcpy(res + o, raw + i, (size_t)k);
            o += (size_t)k;
            i += (size_t)k;
        } else {
            i += invalid_unit((const unsigned char *)raw + i, len - i);
            memcpy(res + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
    }
    res[o] = 0;
    free(raw);
    *text = res;
    if (text_len) *text_len = o;
    return HP_OK;
}
