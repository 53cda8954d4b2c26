/* BPE tokenizer reading HF tokenizer.json: the loader (JSON-path error messages), added-token
 * splitting, normalizers, pre-tokenizers (ByteLevel, Split, Metaspace, ...) through PCRE2,
 * byte-level or character BPE with byte_fallback and a word cache, and post-processor
 * templates. Decode: tokenizer_decode.c. docs/tokenizer.md. */
#define _GNU_SOURCE /* memmem */
#include "hyperparallel/tokenizer.h"
#include "hyperparallel/file.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/tokenizer-impl.h"

typedef hp_tok_stage_t stage_t;
typedef hp_tok_added_t added_t;
typedef hp_tok_merge_t merge_entry_t;
typedef hp_tok_span_t span_t;
typedef hp_tok_heap_item_t heap_item_t;

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

static inline const merge_entry_t *merge_get(hp_tokenizer_t t, int32_t a, int32_t b) {
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

static inline int cross_has(hp_tokenizer_t t, int32_t a, int32_t b) {
    uint64_t k = pair_key(a, b);
    size_t mask = t->cross_cap - 1, i = (size_t)mix64(k) & mask;
    for (;;) {
        if (t->cross[i].key == UINT64_MAX) return 0;
        if (t->cross[i].key == k) return 1;
        i = (i + 1) & mask;
    }
}

/* The first and last atom (initial symbol: a character, byte or unk token) of every token
 * made by merges, to a fixpoint; then the set of atom pairs a merge can join. Left NULL
 * (no splitting) when a token's atoms are ambiguous: two merges make it from different
 * atoms, or it is also an initial symbol of its own. */
static hp_status_t build_cross(hp_tokenizer_t t) {
    size_t nm = 0;
    for (size_t i = 0; i < t->merges_cap; i++) nm += t->merges[i].key != UINT64_MAX;
    if (nm == 0) return HP_OK;
    int32_t *first = malloc((size_t)t->n_ids * sizeof(int32_t));
    int32_t *last = malloc((size_t)t->n_ids * sizeof(int32_t));
    uint8_t *made = hp_calloc((size_t)t->n_ids, 1);
    hp_status_t st = HP_OK;
    if (!first || !last || !made) {
        st = hp_error(HP_ERR_OOM, "%s: model.merges: out of memory", t->name);
        goto done;
    }
    for (int32_t i = 0; i < t->n_ids; i++) first[i] = last[i] = i;
    int changed = 1, passes = 0;
    while (changed && passes++ < 64) {
        changed = 0;
        for (size_t i = 0; i < t->merges_cap; i++) {
            const merge_entry_t *e = &t->merges[i];
            if (e->key == UINT64_MAX) continue;
            int32_t a = (int32_t)(e->key >> 32), b = (int32_t)(uint32_t)e->key, ab = e->new_id;
            made[ab] = 1;
            if (first[ab] != first[a] || last[ab] != last[b]) {
                first[ab] = first[a];
                last[ab] = last[b];
                changed = 1;
            }
        }
    }
    int ok = !changed;
    for (size_t i = 0; ok && i < t->merges_cap; i++) { /* one answer per token */
        const merge_entry_t *e = &t->merges[i];
        if (e->key == UINT64_MAX) continue;
        int32_t a = (int32_t)(e->key >> 32), b = (int32_t)(uint32_t)e->key;
        ok = first[e->new_id] == first[a] && last[e->new_id] == last[b];
    }
    /* a token that is an initial symbol itself must not be made of other atoms */
    for (int b = 0; ok && b < 256; b++) {
        if (t->byte_id[b] >= 0 && made[t->byte_id[b]]) ok = 0;
        if (t->fb_id[b] >= 0 && made[t->fb_id[b]]) ok = 0;
    }
    if (ok && t->unk_id >= 0 && made[t->unk_id]) ok = 0;
    if (ok && !t->byte_level) {
        for (uint32_t cp = 0; ok && cp < 0x10000; cp++)
            if (t->char_id[cp] >= 0 && made[t->char_id[cp]]) ok = 0;
        for (size_t i = 0; ok && i < t->vocab_bytes.cap; i++) { /* characters beyond the BMP */
            const hp_tok_strmap_entry_t *e = &t->vocab_bytes.e[i];
            uint32_t cp;
            if (e->hash && e->len == 4 && hp_tok_utf8_get(hp_tok_strmap_key(&t->vocab_bytes, e), 4, &cp) == 4 &&
                made[e->val])
                ok = 0;
        }
    }
    if (!ok) goto done;
    size_t cap = 64;
    while (cap < nm * 2 + 2) cap <<= 1;
    t->cross = malloc(cap * sizeof(merge_entry_t));
    if (!t->cross) {
        st = hp_error(HP_ERR_OOM, "%s: model.merges: out of memory", t->name);
        goto done;
    }
    memset(t->cross, 0xFF, cap * sizeof(merge_entry_t));
    t->cross_cap = cap;
    for (size_t i = 0; i < t->merges_cap; i++) {
        const merge_entry_t *e = &t->merges[i];
        if (e->key == UINT64_MAX) continue;
        uint64_t k = pair_key(last[(int32_t)(e->key >> 32)], first[(int32_t)(uint32_t)e->key]);
        size_t j = (size_t)mix64(k) & (cap - 1);
        while (t->cross[j].key != UINT64_MAX && t->cross[j].key != k) j = (j + 1) & (cap - 1);
        t->cross[j].key = k;
    }
done:
    free(first);
    free(last);
    free(made);
    return st;
}

/* ---- loading ----------------------------------------------------------------------- */

typedef struct ctx {
    const char *file;
    hp_tokenizer_t t;
    uint32_t byte_cp[256];
    /* json-c keeps object keys as C strings, so the document's \u0000 escapes were replaced
     * by a code point it does not use (see rewrite_nul); strings read back turn it into NUL. */
    int has_nul;
    char sent[3]; /* the stand-in's UTF-8 */
    hp_tok_strmap_t model_map; /* model.vocab spelling -> id, while loading */
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

/* Appends s[0..n) with the NUL stand-in turned back into U+0000. */
static hp_status_t restore(const ctx_t *c, hp_tok_buf_t *b, const char *s, size_t n) {
    if (!c->has_nul) return hp_tok_buf_add(b, s, n);
    size_t i = 0;
    const char *hit;
    while (i < n && (hit = memmem(s + i, n - i, c->sent, 3))) {
        HP_TRY(hp_tok_buf_add(b, s + i, (size_t)(hit - s) - i));
        HP_TRY(hp_tok_buf_add(b, "", 1));
        i = (size_t)(hit - s) + 3;
    }
    return hp_tok_buf_add(b, s + i, n - i);
}

/* A token as it can be printed in a message: control characters as \u00XX, at most ~200 bytes. */
static const char *show(const char *s, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7F) o += (size_t)snprintf(out + o, cap - o, "\\u%04x", ch);
        else out[o++] = (char)ch;
    }
    out[o] = 0;
    return out;
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

/* A string member, NUL restored, as a new allocation (*len bytes, NUL-terminated). */
static hp_status_t member_str(const ctx_t *c, json_object *o, const char *path, const char *key,
                              int required, char **out, size_t *len) {
    json_object *v;
    *out = NULL;
    *len = 0;
    HP_TRY(member(c, o, path, key, json_type_string, required, &v));
    if (!v) return HP_OK;
    hp_tok_buf_t b = {0};
    hp_status_t st = restore(c, &b, json_object_get_string(v), (size_t)json_object_get_string_len(v));
    if (st == HP_OK && !b.p) st = hp_tok_buf_add(&b, "", 0);
    if (st != HP_OK) {
        free(b.p);
        return st;
    }
    *out = b.p;
    *len = b.len;
    return HP_OK;
}

/* A string member that must be exactly one character. */
static hp_status_t member_char(const ctx_t *c, json_object *o, const char *path, const char *key,
                               uint32_t dflt, uint32_t *cp) {
    char *s;
    size_t n;
    HP_TRY(member_str(c, o, path, key, 0, &s, &n));
    *cp = dflt;
    if (!s) return HP_OK;
    int l = hp_tok_utf8_get(s, n, cp);
    free(s);
    if (l <= 0 || (size_t)l != n)
        return jerr(c, HP_ERR_FORMAT, path, "member \"%s\" must be one character", key);
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

/* A {"String": s} or {"Regex": r} pattern (Replace, Split). */
static hp_status_t member_pattern(const ctx_t *c, json_object *o, const char *path, char **s,
                                  size_t *n, int *is_regex) {
    json_object *pat;
    char p2[600];
    HP_TRY(member(c, o, path, "pattern", json_type_object, 1, &pat));
    snprintf(p2, sizeof(p2), "%s.pattern", path);
    *is_regex = 1;
    HP_TRY(member_str(c, pat, p2, "Regex", 0, s, n));
    if (*s) return HP_OK;
    *is_regex = 0;
    HP_TRY(member_str(c, pat, p2, "String", 0, s, n));
    if (!*s) return jerr(c, HP_ERR_FORMAT, p2, "expected {\"Regex\": ...} or {\"String\": ...}");
    return HP_OK;
}

/* Spelling -> raw bytes through the byte-level alphabet; 0 when a character is outside it. */
static int spelling_to_bytes(const hp_tokenizer_t t, const char *s, size_t n, char *out,
                             size_t *out_len) {
    size_t i = 0, k = 0;
    while (i < n) {
        uint32_t cp;
        int l = hp_tok_utf8_get(s + i, n - i, &cp);
        if (l == 0 || cp >= 512 || t->cp_byte[cp] < 0) return 0;
        out[k++] = (char)t->cp_byte[cp];
        i += (size_t)l;
    }
    *out_len = k;
    return 1;
}

static hp_status_t set_spelling(const ctx_t *c, int32_t id, const char *s, size_t n,
                                const char *path) {
    hp_tokenizer_t t = c->t;
    if (t->spelling[id]) return HP_OK; /* added token spelling wins */
    t->spelling[id] = malloc(n + 1);
    if (!t->spelling[id]) return hp_error(HP_ERR_OOM, "%s: %s: out of memory", c->file, path);
    memcpy(t->spelling[id], s, n);
    t->spelling[id][n] = 0;
    t->spelling_len[id] = (uint32_t)n;
    char *d = NULL;
    size_t dl = n;
    if (t->decoder == HP_TOK_DECODER_CHAIN) {
        HP_TRY(hp_tok_token_stream_bytes(t, s, n, &d, &dl));
    } else {
        /* ByteLevel decoder: every character back to its byte; a token with a character
         * outside the alphabet decodes to its own UTF-8 (HF's decode_chain). */
        d = malloc(n + 1);
        if (!d) return hp_error(HP_ERR_OOM, "%s: %s: out of memory", c->file, path);
        if (t->decoder != HP_TOK_DECODER_BYTELEVEL || !spelling_to_bytes(t, s, n, d, &dl)) {
            memcpy(d, s, n);
            dl = n;
        }
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

/* ---- normalizer ---------------------------------------------------------------------- */

static hp_status_t add_norm_step(ctx_t *c, hp_tok_norm_step_t **st, const char *path) {
    hp_tok_normalizer_t *nz = &c->t->norm;
    hp_tok_norm_step_t *s = realloc(nz->steps, (size_t)(nz->n_steps + 1) * sizeof(*s));
    if (!s) return hp_error(HP_ERR_OOM, "%s: %s: out of memory", c->file, path);
    nz->steps = s;
    *st = &s[nz->n_steps++];
    memset(*st, 0, sizeof(**st));
    return HP_OK;
}

static hp_status_t parse_norm(ctx_t *c, json_object *o, const char *path) {
    const char *type;
    char p2[600];
    HP_TRY(member_type(c, o, path, &type));
    if (strcmp(type, "Sequence") == 0) {
        json_object *arr;
        HP_TRY(member(c, o, path, "normalizers", json_type_array, 1, &arr));
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            snprintf(p2, sizeof(p2), "%s.normalizers[%zu]", path, i);
            HP_TRY(parse_norm(c, json_object_array_get_idx(arr, i), p2));
        }
        return HP_OK;
    }
    static const char *nf[] = {"NFC", "NFD", "NFKC", "NFKD"};
    hp_tok_norm_step_t *st;
    for (int k = 0; k < 4; k++)
        if (strcmp(type, nf[k]) == 0) {
            HP_TRY(add_norm_step(c, &st, path));
            st->kind = (hp_tok_norm_kind_t)(HP_TOK_NORM_NFC + k);
            return HP_OK;
        }
    if (strcmp(type, "Replace") == 0) {
        HP_TRY(add_norm_step(c, &st, path));
        st->kind = HP_TOK_NORM_REPLACE;
        HP_TRY(member_pattern(c, o, path, &st->pat, &st->pat_len, &st->is_regex));
        HP_TRY(member_str(c, o, path, "content", 1, &st->text, &st->text_len));
        if (st->is_regex) {
            char what[700];
            snprintf(what, sizeof(what), "%s: %s.pattern.Regex", c->file, path);
            HP_TRY(hp_tok_regex_compile(&st->re, st->pat, st->pat_len, 0, what));
        }
        return HP_OK;
    }
    if (strcmp(type, "Prepend") == 0) {
        HP_TRY(add_norm_step(c, &st, path));
        st->kind = HP_TOK_NORM_PREPEND;
        return member_str(c, o, path, "prepend", 1, &st->text, &st->text_len);
    }
    if (strcmp(type, "Strip") == 0) {
        HP_TRY(add_norm_step(c, &st, path));
        st->kind = HP_TOK_NORM_STRIP;
        HP_TRY(member_bool(c, o, path, "strip_left", 1, &st->left));
        return member_bool(c, o, path, "strip_right", 1, &st->right);
    }
    return jerr(c, HP_ERR_UNSUPPORTED, path,
                "normalizer \"%s\" is not supported (supported: NFC, NFD, NFKC, NFKD, Replace, "
                "Prepend, Strip, and a Sequence of those; null for none)",
                type);
}

/* ---- pre-tokenizer ------------------------------------------------------------------- */

static hp_status_t parse_stage(ctx_t *c, json_object *o, const char *path);

/* A Split-like step must come before the ByteLevel step (it would see byte-mapped text). */
static hp_status_t check_split_order(ctx_t *c, const char *path) {
    for (int i = 0; i < c->t->n_stages; i++)
        if (c->t->stages[i].kind == HP_TOK_STAGE_BYTELEVEL)
            return jerr(c, HP_ERR_UNSUPPORTED, path,
                        "a splitting step after a ByteLevel pre-tokenizer is not supported (it "
                        "would see byte-mapped text); put it first");
    return HP_OK;
}

/* A Split behaviour name; NULL gives Isolated. */
static hp_status_t parse_behavior(ctx_t *c, json_object *beh, const char *path, int *out) {
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    *out = HP_TOK_SPLIT_ISOLATED;
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

/* Metaspace's prepend_scheme, or the older add_prefix_space (true: always, false: never). */
static hp_status_t parse_prepend_scheme(ctx_t *c, json_object *o, const char *path, int *out) {
    json_object *v;
    HP_TRY(member(c, o, path, "prepend_scheme", json_type_string, 0, &v));
    if (v) {
        static const char *names[] = {"always", "first", "never"};
        for (int i = 0; i < 3; i++)
            if (strcmp(json_object_get_string(v), names[i]) == 0) {
                *out = i;
                return HP_OK;
            }
        return jerr(c, HP_ERR_FORMAT, path,
                    "prepend_scheme \"%s\" is not one of always, first, never",
                    json_object_get_string(v));
    }
    int aps;
    HP_TRY(member_bool(c, o, path, "add_prefix_space", 1, &aps));
    *out = aps ? HP_TOK_PREPEND_ALWAYS : HP_TOK_PREPEND_NEVER;
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
        s->kind = HP_TOK_STAGE_BYTELEVEL;
        s->add_prefix_space = aps;
        s->use_regex = use_regex;
        if (use_regex)
            HP_TRY(hp_tok_regex_compile(&s->re, HP_TOK_GPT2_PATTERN, PCRE2_ZERO_TERMINATED, 0,
                                        "ByteLevel pattern"));
        return HP_OK;
    }
    if (strcmp(type, "Metaspace") == 0) {
        HP_TRY(check_split_order(c, path));
        uint32_t rep;
        int scheme, split;
        HP_TRY(member_char(c, o, path, "replacement", 0x2581, &rep));
        HP_TRY(parse_prepend_scheme(c, o, path, &scheme));
        HP_TRY(member_bool(c, o, path, "split", 1, &split));
        stage_t *s;
        HP_TRY(add_stage(c, &s, path));
        s->kind = HP_TOK_STAGE_METASPACE;
        s->rep_len = hp_tok_utf8_put(rep, s->rep);
        s->prepend_scheme = scheme;
        s->split = split;
        return HP_OK;
    }
    if (strcmp(type, "Split") == 0) {
        HP_TRY(check_split_order(c, path));
        char *pat;
        size_t plen;
        int is_regex;
        HP_TRY(member_pattern(c, o, path, &pat, &plen, &is_regex));
        json_object *beh;
        int behavior, invert;
        hp_status_t st = member(c, o, path, "behavior", json_type_string, 1, &beh);
        if (st == HP_OK) st = parse_behavior(c, beh, path, &behavior);
        if (st == HP_OK) st = member_bool(c, o, path, "invert", 0, &invert);
        stage_t *s;
        if (st == HP_OK) st = add_stage(c, &s, path);
        if (st == HP_OK) {
            s->kind = HP_TOK_STAGE_SPLIT;
            s->behavior = behavior;
            s->invert = invert;
            char what[600];
            snprintf(what, sizeof(what), "%s: %s.pattern.%s", c->file, path, is_regex ? "Regex" : "String");
            st = hp_tok_regex_compile(&s->re, pat, plen, !is_regex, what);
        }
        free(pat);
        return st;
    }
    /* HF's fixed splitters are Splits with a pattern matching one character (or, for
     * Whitespace, its regex) and a behaviour. */
    const char *pattern = NULL;
    int behavior = HP_TOK_SPLIT_ISOLATED, invert = 0;
    if (strcmp(type, "Digits") == 0) {
        int individual;
        HP_TRY(member_bool(c, o, path, "individual_digits", 0, &individual));
        pattern = "\\p{N}"; /* char::is_numeric */
        behavior = individual ? HP_TOK_SPLIT_ISOLATED : HP_TOK_SPLIT_CONTIGUOUS;
    } else if (strcmp(type, "Punctuation") == 0) {
        json_object *beh;
        HP_TRY(member(c, o, path, "behavior", json_type_string, 0, &beh));
        HP_TRY(parse_behavior(c, beh, path, &behavior));
        pattern = "[\\p{P}!-\\/:-@\\[-\\x{60}{-~]"; /* Unicode P* or ASCII punctuation */
    } else if (strcmp(type, "WhitespaceSplit") == 0) {
        pattern = "\\s";
        behavior = HP_TOK_SPLIT_REMOVED;
    } else if (strcmp(type, "Whitespace") == 0) {
        pattern = "\\w+|[^\\w\\s]+";
        behavior = HP_TOK_SPLIT_REMOVED;
        invert = 1;
    }
    if (pattern) {
        HP_TRY(check_split_order(c, path));
        stage_t *s;
        HP_TRY(add_stage(c, &s, path));
        s->kind = HP_TOK_STAGE_SPLIT;
        s->behavior = behavior;
        s->invert = invert;
        return hp_tok_regex_compile(&s->re, pattern, PCRE2_ZERO_TERMINATED, 0, type);
    }
    return jerr(c, HP_ERR_UNSUPPORTED, path,
                "pre-tokenizer type \"%s\" is not supported (supported: ByteLevel, Split, "
                "Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit, Sequence of those)",
                type);
}

/* ---- decoder ------------------------------------------------------------------------- */

static hp_status_t add_dec_step(ctx_t *c, hp_tok_dec_step_t **st, const char *path) {
    hp_tokenizer_t t = c->t;
    hp_tok_dec_step_t *s = realloc(t->dec_steps, (size_t)(t->n_dec_steps + 1) * sizeof(*s));
    if (!s) return hp_error(HP_ERR_OOM, "%s: %s: out of memory", c->file, path);
    t->dec_steps = s;
    *st = &s[t->n_dec_steps++];
    memset(*st, 0, sizeof(**st));
    return HP_OK;
}

static hp_status_t parse_dec(ctx_t *c, json_object *o, const char *path) {
    const char *type;
    char p2[600];
    hp_tok_dec_step_t *st;
    HP_TRY(member_type(c, o, path, &type));
    if (strcmp(type, "Sequence") == 0) {
        json_object *arr;
        HP_TRY(member(c, o, path, "decoders", json_type_array, 1, &arr));
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            snprintf(p2, sizeof(p2), "%s.decoders[%zu]", path, i);
            HP_TRY(parse_dec(c, json_object_array_get_idx(arr, i), p2));
        }
        return HP_OK;
    }
    if (strcmp(type, "ByteLevel") == 0 || strcmp(type, "ByteFallback") == 0 ||
        strcmp(type, "Fuse") == 0) {
        HP_TRY(add_dec_step(c, &st, path));
        st->kind = type[0] == 'F' ? HP_TOK_DEC_FUSE : type[4] == 'L' ? HP_TOK_DEC_BYTELEVEL
                                                                      : HP_TOK_DEC_BYTEFALLBACK;
        return HP_OK;
    }
    if (strcmp(type, "Replace") == 0) {
        HP_TRY(add_dec_step(c, &st, path));
        st->kind = HP_TOK_DEC_REPLACE;
        HP_TRY(member_pattern(c, o, path, &st->pat, &st->pat_len, &st->is_regex));
        HP_TRY(member_str(c, o, path, "content", 1, &st->text, &st->text_len));
        if (st->is_regex) {
            char what[700];
            snprintf(what, sizeof(what), "%s: %s.pattern.Regex", c->file, path);
            HP_TRY(hp_tok_regex_compile(&st->re, st->pat, st->pat_len, 0, what));
        }
        return HP_OK;
    }
    if (strcmp(type, "Strip") == 0) {
        json_object *v;
        HP_TRY(add_dec_step(c, &st, path));
        st->kind = HP_TOK_DEC_STRIP;
        HP_TRY(member_char(c, o, path, "content", ' ', &st->ch));
        HP_TRY(member(c, o, path, "start", json_type_int, 0, &v));
        st->start = v ? (int)json_object_get_int(v) : 0;
        HP_TRY(member(c, o, path, "stop", json_type_int, 0, &v));
        st->stop = v ? (int)json_object_get_int(v) : 0;
        if (st->start < 0 || st->stop < 0)
            return jerr(c, HP_ERR_FORMAT, path, "start %d and stop %d must not be negative",
                        st->start, st->stop);
        return HP_OK;
    }
    if (strcmp(type, "Metaspace") == 0) {
        int scheme;
        HP_TRY(add_dec_step(c, &st, path));
        st->kind = HP_TOK_DEC_METASPACE;
        HP_TRY(member_char(c, o, path, "replacement", 0x2581, &st->ch));
        HP_TRY(parse_prepend_scheme(c, o, path, &scheme));
        st->prepend = scheme != HP_TOK_PREPEND_NEVER;
        return HP_OK;
    }
    return jerr(c, HP_ERR_UNSUPPORTED, path,
                "decoder \"%s\" is not supported (supported: ByteLevel, Replace, ByteFallback, "
                "Fuse, Strip, Metaspace, and a Sequence of those; null for none)",
                type);
}

/* ---- post-processor ------------------------------------------------------------------ */

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

/* ---- added tokens -------------------------------------------------------------------- */

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
        HP_TRY(member_str(c, o, path, "content", 1, &a->content, &a->len));
        t->n_added++;
        if (a->len == 0) return jerr(c, HP_ERR_FORMAT, path, "content is empty");
        if (hp_tok_utf8_check(a->content, a->len) != a->len)
            return jerr(c, HP_ERR_FORMAT, path, "content is not valid UTF-8");
        HP_TRY(member_bool(c, o, path, "special", 0, &a->special));
        HP_TRY(member_bool(c, o, path, "normalized", !a->special, &a->normalized));
        HP_TRY(member_bool(c, o, path, "lstrip", 0, &a->lstrip));
        HP_TRY(member_bool(c, o, path, "rstrip", 0, &a->rstrip));
        HP_TRY(member_bool(c, o, path, "single_word", 0, &a->single_word));
        /* A normalized token is searched for in normalized text, so its content is
         * normalized too (HF's refresh_added_tokens). */
        const char *m = a->content;
        size_t ml = a->len;
        if (a->normalized) HP_TRY(hp_tok_normalize(&t->norm, a->content, a->len, &m, &ml, NULL));
        a->match = malloc(ml + 1);
        if (!a->match) return HP_ERR_OOM;
        if (ml) memcpy(a->match, m, ml);
        a->match[ml] = 0;
        a->match_len = ml;
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

static hp_status_t trie_node(hp_tokenizer_t t, int pass, int32_t *idx) {
    if (t->trie_n[pass] == t->trie_cap[pass]) {
        int32_t cap = t->trie_cap[pass] ? t->trie_cap[pass] * 2 : 64;
        hp_tok_trie_node_t *p = realloc(t->trie[pass], (size_t)cap * sizeof(*p));
        if (!p) return hp_error(HP_ERR_OOM, "%s: added_tokens: out of memory", t->name);
        t->trie[pass] = p;
        t->trie_cap[pass] = cap;
    }
    *idx = t->trie_n[pass]++;
    t->trie[pass][*idx] = (hp_tok_trie_node_t){-1, -1, -1, 0};
    return HP_OK;
}

/* Byte tries of the added tokens, one per pass (non-normalized, normalized). */
static hp_status_t build_tries(hp_tokenizer_t t) {
    int32_t root;
    for (int pass = 0; pass < 2; pass++) HP_TRY(trie_node(t, pass, &root));
    for (size_t i = 0; i < t->n_added; i++) {
        const added_t *a = &t->added[i];
        int pass = a->normalized ? 1 : 0;
        if (a->match_len == 0) continue; /* normalized to nothing: never matches */
        int32_t node = 0;
        for (size_t k = 0; k < a->match_len; k++) {
            uint8_t b = (uint8_t)a->match[k];
            int32_t ch = t->trie[pass][node].child;
            while (ch >= 0 && t->trie[pass][ch].byte != b) ch = t->trie[pass][ch].sibling;
            if (ch < 0) {
                HP_TRY(trie_node(t, pass, &ch));
                t->trie[pass][ch].byte = b;
                t->trie[pass][ch].sibling = t->trie[pass][node].child;
                t->trie[pass][node].child = ch;
            }
            node = ch;
        }
        if (t->trie[pass][node].added < 0) t->trie[pass][node].added = (int32_t)i;
        t->added_first[pass][(unsigned char)a->match[0]] = 1;
    }
    return HP_OK;
}

/* ---- model --------------------------------------------------------------------------- */

static int32_t model_id(const ctx_t *c, const char *s, size_t n) {
    int64_t *v = hp_tok_strmap_get(&c->model_map, s, n);
    return v ? (int32_t)*v : -1;
}

/* HF ignores the ids written in added_tokens and assigns its own as it adds the tokens in
 * file order (AddedVocabulary::add_tokens): an id already given to the same content, else
 * the model vocabulary's id of the content, else the next one after the largest added id
 * (at least the number of vocabulary entries). Released files agree with that; a file that
 * does not is encoded as HF encodes it, with a warning (as HF's). A second entry with the
 * same content takes over the first one's flags. */
static hp_status_t assign_added_ids(ctx_t *c, size_t vocab_size) {
    hp_tokenizer_t t = c->t;
    int32_t max_added = -1;
    size_t w = 0;
    for (size_t i = 0; i < t->n_added; i++) {
        added_t a = t->added[i];
        int32_t id = -1;
        size_t same = SIZE_MAX;
        for (size_t k = 0; k < w; k++)
            if (t->added[k].len == a.len && memcmp(t->added[k].content, a.content, a.len) == 0) same = k;
        if (same != SIZE_MAX) id = t->added[same].id;
        if (id < 0) id = model_id(c, a.content, a.len);
        if (id < 0)
            id = max_added >= 0 && (max_added >= (int32_t)vocab_size || vocab_size == 0) ? max_added + 1
                                                                                      : (int32_t)vocab_size;
        if (id >= max_id_limit()) {
            char p[64];
            snprintf(p, sizeof(p), "added_tokens[%zu]", i);
            return jerr(c, HP_ERR_FORMAT, p, "the id HF would give it, %d, is outside [0, %d)", id,
                        max_id_limit());
        }
        if (id != a.id) {
            char shown[256];
            hp_log(HP_LOG_WARN, "%s: added_tokens[%zu] \"%s\" has id %d in the file, but HF tokenizers "
                   "gives it %d (used)", c->file, i, show(a.content, a.len, shown, 200), a.id, id);
        }
        a.id = id;
        if (id > max_added) max_added = id;
        memset(&t->added[i], 0, sizeof(a));
        if (same != SIZE_MAX) { /* the later entry's flags win */
            free(t->added[same].content);
            free(t->added[same].match);
            t->added[same] = a;
        } else {
            t->added[w++] = a;
        }
    }
    t->n_added = w;
    return HP_OK;
}

static hp_status_t parse_model(ctx_t *c, json_object *model) {
    hp_tokenizer_t t = c->t;
    json_object *v, *vocab, *merges;
    const char *type = "BPE";
    char shown[256];
    if (!json_object_is_type(model, json_type_object))
        return jerr(c, HP_ERR_FORMAT, "model", "is %s, expected an object", type_name(model));
    HP_TRY(member(c, model, "model", "type", json_type_string, 0, &v));
    if (v) type = json_object_get_string(v);
    if (strcmp(type, "BPE") != 0)
        return jerr(c, HP_ERR_UNSUPPORTED, "model.type",
                    "model \"%s\" is not supported (supported: BPE, byte-level or with "
                    "characters and byte_fallback)",
                    type);
    HP_TRY(member_bool(c, model, "model", "byte_fallback", 0, &t->byte_fallback));
    static const char *must_empty[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        if (json_object_object_get_ex(model, must_empty[i], &v) && v &&
            !(json_object_is_type(v, json_type_string) && json_object_get_string_len(v) == 0)) {
            char p2[80];
            snprintf(p2, sizeof(p2), "model.%s", must_empty[i]);
            return jerr(c, HP_ERR_UNSUPPORTED, p2,
                        "is %s; only null or \"\" is supported (no subword prefix / suffix, as "
                        "in GPT-2, Llama, Mistral, Gemma, Qwen and DeepSeek tokenizers)",
                        json_object_to_json_string(v));
        }
    }
    if (json_object_object_get_ex(model, "dropout", &v) && v &&
        !(json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)))
        return jerr(c, HP_ERR_FORMAT, "model.dropout", "is %s, expected null or a number", type_name(v));
    if (v && json_object_get_double(v) != 0.0)
        return jerr(c, HP_ERR_UNSUPPORTED, "model.dropout",
                    "BPE dropout %g is not supported (it makes ids random); set it to null",
                    json_object_get_double(v));
    HP_TRY(member_bool(c, model, "model", "ignore_merges", 0, &t->ignore_merges));
    HP_TRY(member_bool(c, model, "model", "fuse_unk", 0, &t->fuse_unk));
    char *unk;
    size_t unk_len;
    HP_TRY(member_str(c, model, "model", "unk_token", 0, &unk, &unk_len));
    t->unk_id = -1;
    t->has_unk = unk != NULL;
    hp_status_t st = member(c, model, "model", "vocab", json_type_object, 1, &vocab);
    if (st == HP_OK) st = member(c, model, "model", "merges", json_type_array, 1, &merges);
    if (st != HP_OK) {
        free(unk);
        return st;
    }

    /* Sizes first: ids of the vocabulary (indexed by spelling), then the added tokens'. */
    int32_t max_id = -1;
    char path[1024];
    size_t nv = (size_t)json_object_object_length(vocab);
    if ((st = hp_tok_strmap_init(&c->model_map, nv))) {
        free(unk);
        return st;
    }
    hp_tok_buf_t key = {0};
    json_object_object_foreach(vocab, key0, val0) {
        int32_t id;
        snprintf(path, sizeof(path), "model.vocab[\"%s\"]", show(key0, strlen(key0), shown, 200));
        if ((st = check_id(c, val0, path, &id))) break;
        if (id > max_id) max_id = id;
        key.len = 0;
        if ((st = restore(c, &key, key0, strlen(key0)))) break;
        if (!key.p && (st = hp_tok_buf_add(&key, "", 0))) break;
        if ((st = hp_tok_strmap_put(&c->model_map, key.p, key.len, id, NULL, NULL))) break;
    }
    if (st == HP_OK) st = assign_added_ids(c, nv);
    if (st != HP_OK) {
        free(key.p);
        free(unk);
        return st;
    }
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    if (max_id < 0) {
        free(key.p);
        free(unk);
        return jerr(c, HP_ERR_FORMAT, "model.vocab", "is empty");
    }
    t->n_ids = max_id + 1;
    t->spelling = hp_calloc((size_t)t->n_ids, sizeof(char *));
    t->spelling_len = hp_calloc((size_t)t->n_ids, sizeof(uint32_t));
    t->dec = hp_calloc((size_t)t->n_ids, sizeof(char *));
    t->dec_len = hp_calloc((size_t)t->n_ids, sizeof(uint32_t));
    t->special = hp_calloc((size_t)t->n_ids, 1);
    if (!t->spelling || !t->spelling_len || !t->dec || !t->dec_len || !t->special) {
        free(key.p);
        free(unk);
        return HP_ERR_OOM;
    }
    if ((st = hp_tok_strmap_init(&t->spell_map, nv + t->n_added)) ||
        (st = hp_tok_strmap_init(&t->vocab_bytes, nv))) {
        free(key.p);
        free(unk);
        return st;
    }

    for (size_t i = 0; i < t->n_added && st == HP_OK; i++) {
        added_t *a = &t->added[i];
        snprintf(path, sizeof(path), "added_tokens[%zu]", i);
        /* HF's id_to_token (and decode) of a normalized added token is its normalized
         * content, also when the vocabulary spells that id otherwise */
        st = a->normalized ? set_spelling(c, a->id, a->match, a->match_len, path)
                           : set_spelling(c, a->id, a->content, a->len, path);
        t->special[a->id] |= (uint8_t)a->special;
        int64_t *slot;
        if (st == HP_OK) st = hp_tok_strmap_put(&t->spell_map, a->content, a->len, a->id, &slot, NULL);
    }
    if (!t->byte_level) {
        t->char_id = malloc(0x10000 * sizeof(int32_t));
        if (!t->char_id) st = HP_ERR_OOM;
        else memset(t->char_id, 0xFF, 0x10000 * sizeof(int32_t));
    }
    char *buf = malloc(4096);
    if (!buf && st == HP_OK) st = HP_ERR_OOM;
    if (st == HP_OK) {
        json_object_object_foreach(vocab, key1, val) {
            int32_t id = (int32_t)json_object_get_int64(val);
            key.len = 0;
            if ((st = restore(c, &key, key1, strlen(key1)))) break;
            if (!key.p && (st = hp_tok_buf_add(&key, "", 0))) break;
            const char *k = key.p;
            size_t klen = key.len;
            snprintf(path, sizeof(path), "model.vocab[\"%s\"]", show(k, klen, shown, 200));
            int64_t *slot;
            int inserted;
            if ((st = hp_tok_strmap_put(&t->spell_map, k, klen, id, &slot, &inserted))) break;
            if (t->spelling[id] && (t->spelling_len[id] != klen || memcmp(t->spelling[id], k, klen) != 0)) {
                int is_added = 0;
                for (size_t i = 0; i < t->n_added; i++) is_added |= t->added[i].id == id;
                if (!is_added) {
                    st = jerr(c, HP_ERR_FORMAT, path, "id %d is also used by \"%s\"", id,
                              show(t->spelling[id], t->spelling_len[id], shown, 200));
                    break;
                }
            }
            if ((st = set_spelling(c, id, k, klen, path))) break;
            if (t->byte_level) {
                /* The model sees byte-mapped text: index the vocabulary by raw bytes. */
                size_t bl;
                if (klen <= 4096 && spelling_to_bytes(t, k, klen, buf, &bl)) {
                    if ((st = hp_tok_strmap_put(&t->vocab_bytes, buf, bl, id, &slot, NULL))) break;
                    if (bl == 1 && t->byte_id[(unsigned char)buf[0]] < 0)
                        t->byte_id[(unsigned char)buf[0]] = id;
                }
            } else {
                if ((st = hp_tok_strmap_put(&t->vocab_bytes, k, klen, id, &slot, NULL))) break;
                uint32_t cp;
                int l = hp_tok_utf8_get(k, klen, &cp);
                if (l > 0 && (size_t)l == klen && cp < 0x10000) t->char_id[cp] = id;
            }
        }
    }
    free(buf);
    free(key.p);
    if (st == HP_OK && unk) t->unk_id = model_id(c, unk, unk_len); /* HF fails only when needed */
    free(unk);
    HP_TRY(st);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        t->fb_id[b] = model_id(c, name, 6);
    }
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
                    "(the byte or character tokens and the merged tokens) so that text encodes "
                    "to ids",
                    t->n_added);

    size_t nm = json_object_array_length(merges);
    size_t cap = 64;
    while (cap < nm * 2 + 2) cap <<= 1;
    t->merges = malloc(cap * sizeof(merge_entry_t));
    if (!t->merges) return hp_error(HP_ERR_OOM, "%s: model.merges: out of memory", c->file);
    memset(t->merges, 0xFF, cap * sizeof(merge_entry_t));
    t->merges_cap = cap;
    hp_tok_buf_t cat = {0};
    for (size_t i = 0; i < nm && st == HP_OK; i++) {
        json_object *m = json_object_array_get_idx(merges, i);
        const char *parts[2];
        size_t plen[2];
        snprintf(path, sizeof(path), "model.merges[%zu]", i);
        if (json_object_is_type(m, json_type_string)) {
            const char *s = json_object_get_string(m);
            size_t sl = (size_t)json_object_get_string_len(m);
            const char *sp = memchr(s, ' ', sl);
            if (!sp || memchr(sp + 1, ' ', sl - (size_t)(sp + 1 - s))) {
                st = jerr(c, HP_ERR_FORMAT, path, "\"%s\" is not of the form \"left right\" (one space)",
                          show(s, sl, shown, 200));
                break;
            }
            parts[0] = s, plen[0] = (size_t)(sp - s);
            parts[1] = sp + 1, plen[1] = sl - plen[0] - 1;
        } else if (json_object_is_type(m, json_type_array) && json_object_array_length(m) == 2 &&
                   json_object_is_type(json_object_array_get_idx(m, 0), json_type_string) &&
                   json_object_is_type(json_object_array_get_idx(m, 1), json_type_string)) {
            for (int k = 0; k < 2; k++) {
                json_object *e = json_object_array_get_idx(m, (size_t)k);
                parts[k] = json_object_get_string(e);
                plen[k] = (size_t)json_object_get_string_len(e);
            }
        } else {
            st = jerr(c, HP_ERR_FORMAT, path,
                      "is %s, expected \"left right\" or [\"left\", \"right\"]", type_name(m));
            break;
        }
        /* left, right and left+right, each looked up in model.vocab */
        cat.len = 0;
        if ((st = restore(c, &cat, parts[0], plen[0]))) break;
        size_t l0 = cat.len;
        if ((st = restore(c, &cat, parts[1], plen[1]))) break;
        if (!cat.p && (st = hp_tok_buf_add(&cat, "", 0))) break;
        size_t l1 = cat.len - l0;
        int32_t a = model_id(c, cat.p, l0), b = model_id(c, cat.p + l0, l1), ab = model_id(c, cat.p, cat.len);
        if (a < 0 || b < 0) {
            const char *bad = a < 0 ? cat.p : cat.p + l0;
            st = jerr(c, HP_ERR_FORMAT, path,
                      "token \"%s\" is not in model.vocab (a merge must join two vocabulary tokens)",
                      show(bad, a < 0 ? l0 : l1, shown, 200));
        } else if (ab < 0) {
            st = jerr(c, HP_ERR_FORMAT, path, "the merged token \"%s\" is not in model.vocab",
                      show(cat.p, cat.len, shown, 200));
        } else {
            merge_put(t, a, b, (int32_t)i, ab);
        }
    }
    free(cat.p);
    if (st == HP_OK) st = build_cross(t);
    return st;
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

/* Whether the pre-tokenizer (object or null) holds a ByteLevel step: then the model works
 * on bytes. Decided before the vocabulary is read, which it indexes. */
static int has_bytelevel(json_object *pre) {
    if (!pre || !json_object_is_type(pre, json_type_object)) return 0;
    json_object *v;
    if (json_object_object_get_ex(pre, "type", &v) && json_object_is_type(v, json_type_string) &&
        strcmp(json_object_get_string(v), "ByteLevel") == 0)
        return 1;
    if (json_object_object_get_ex(pre, "pretokenizers", &v) && json_object_is_type(v, json_type_array))
        for (size_t i = 0; i < json_object_array_length(v); i++)
            if (has_bytelevel(json_object_array_get_idx(v, i))) return 1;
    return 0;
}

static hp_status_t load_doc(ctx_t *c, json_object *root) {
    hp_tokenizer_t t = c->t;
    json_object *v;
    if (!json_object_is_type(root, json_type_object))
        return jerr(c, HP_ERR_FORMAT, "$", "is %s, expected a tokenizer.json object", type_name(root));
    HP_TRY(member(c, root, "$", "normalizer", json_type_object, 0, &v));
    if (v) HP_TRY(parse_norm(c, v, "normalizer"));
    HP_TRY(member(c, root, "$", "decoder", json_type_object, 0, &v));
    if (v) {
        HP_TRY(parse_dec(c, v, "decoder"));
        t->decoder = t->n_dec_steps == 1 && t->dec_steps[0].kind == HP_TOK_DEC_BYTELEVEL
                         ? HP_TOK_DECODER_BYTELEVEL
                         : HP_TOK_DECODER_CHAIN;
    }
    json_object *added, *model, *pre, *post;
    HP_TRY(member(c, root, "$", "pre_tokenizer", json_type_object, 0, &pre));
    t->byte_level = has_bytelevel(pre);
    HP_TRY(member(c, root, "$", "added_tokens", json_type_array, 0, &added));
    if (added) HP_TRY(parse_added(c, added));
    HP_TRY(build_tries(t));
    HP_TRY(member(c, root, "$", "model", json_type_object, 1, &model));
    HP_TRY(parse_model(c, model));
    if (pre) HP_TRY(parse_stage(c, pre, "pre_tokenizer"));
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

/* json-c stores object keys as C strings, so a vocabulary token holding U+0000 would be cut
 * short there. If the document has \u0000 escapes, each becomes the escape of a
 * noncharacter (U+FDD0..U+FDEF) that the document does not use, and every string read back
 * turns it into U+0000 again. Returns 0, or -1 when all 32 stand-ins are used. */
static int rewrite_nul(char *j, size_t n, ctx_t *c) {
    int has = 0;
    uint32_t used = 0; /* bit k: U+FDD0+k appears, raw or escaped */
    for (size_t i = 0; i + 2 < n; i++) {
        unsigned char b = (unsigned char)j[i];
        if (b == 0xEF && (unsigned char)j[i + 1] == 0xB7 && (unsigned char)j[i + 2] >= 0x90 &&
            (unsigned char)j[i + 2] <= 0xAF)
            used |= 1u << ((unsigned char)j[i + 2] - 0x90);
        if (b == '\\' && i + 5 < n && j[i + 1] == 'u') {
            if (memcmp(j + i + 2, "0000", 4) == 0) has = 1;
            char e = (char)(j[i + 4] | 32), d = (char)(j[i + 5] | 32);
            int k = d >= '0' && d <= '9' ? d - '0' : d >= 'a' && d <= 'f' ? d - 'a' + 10 : -1;
            if ((j[i + 2] | 32) == 'f' && (j[i + 3] | 32) == 'd' && (e == 'd' || e == 'e') && k >= 0)
                used |= 1u << (k + (e == 'e' ? 16 : 0)); /* \uFDD_ / \uFDE_ */
            i++; /* the 'u' is not the start of another escape */
        } else if (b == '\\') {
            i++; /* an escaped character, e.g. \\ */
        }
    }
    if (!has) return 0;
    int k = 0;
    while (k < 32 && (used >> k) & 1) k++;
    if (k == 32) return -1;
    uint32_t sent = 0xFDD0 + (uint32_t)k;
    char hex[5];
    snprintf(hex, sizeof(hex), "%04X", sent);
    for (size_t i = 0; i + 5 < n; i++) {
        if (j[i] != '\\') continue;
        if (j[i + 1] == 'u' && memcmp(j + i + 2, "0000", 4) == 0) memcpy(j + i + 2, hex, 4);
        i++;
    }
    c->has_nul = 1;
    hp_tok_utf8_put(sent, c->sent);
    return 0;
}

hp_status_t hp_tokenizer_load_json(hp_tokenizer_t *out, const char *json, size_t len,
                                   const char *name) {
    *out = NULL;
    if (!name) name = "tokenizer.json";
    if (len > INT32_MAX)
        return hp_error(HP_ERR_FORMAT, "%s: %zu bytes is too large for a tokenizer.json", name, len);
    hp_tokenizer_t t = hp_calloc(1, sizeof(*t));
    if (!t) return HP_ERR_OOM;
    ctx_t c = {.file = name, .t = t};
    char *copy = NULL;
    if (memmem(json, len, "\\u0000", 6)) {
        copy = malloc(len ? len : 1);
        if (!copy) {
            free(t);
            return hp_error(HP_ERR_OOM, "%s: cannot copy %zu bytes", name, len);
        }
        memcpy(copy, json, len);
        if (rewrite_nul(copy, len, &c) < 0) {
            free(copy);
            free(t);
            return hp_error(HP_ERR_UNSUPPORTED,
                            "%s: the file uses U+0000 and all of U+FDD0..U+FDEF; tokens with "
                            "U+0000 are supported only when one of those noncharacters is unused",
                            name);
        }
        json = copy;
    }
    json_tokener *tk = json_tokener_new();
    if (!tk) {
        free(copy);
        free(t);
        return hp_error(HP_ERR_OOM, "%s: cannot create a JSON parser", name);
    }
    json_object *root = json_tokener_parse_ex(tk, json, (int)len);
    enum json_tokener_error jerr_ = json_tokener_get_error(tk);
    size_t end = json_tokener_get_parse_end(tk);
    json_tokener_free(tk);
    hp_status_t st = HP_OK;
    if (!root || jerr_ != json_tokener_success) {
        st = hp_error(HP_ERR_FORMAT, "%s: not valid JSON (%s near byte %zu); expected a HF tokenizer.json",
                      name, jerr_ == json_tokener_continue ? "unexpected end of input"
                                                           : json_tokener_error_desc(jerr_),
                      end);
    } else {
        for (size_t i = end; i < len; i++) {
            if (json[i] != ' ' && json[i] != '\n' && json[i] != '\r' && json[i] != '\t') {
                st = hp_error(HP_ERR_FORMAT, "%s: trailing data after the JSON document at byte %zu",
                              name, i);
                break;
            }
        }
    }
    free(copy);
    if (st == HP_OK) {
        hp_tok_byte_to_cp(c.byte_cp);
        for (int i = 0; i < 512; i++) t->cp_byte[i] = -1;
        for (int b = 0; b < 256; b++) t->cp_byte[c.byte_cp[b]] = (int16_t)b;
        for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
        t->bos = t->eos = t->pad = -1;
        t->add_bos = t->add_eos = -1;
        t->name = strdup(name);
        st = t->name ? load_doc(&c, root) : HP_ERR_OOM;
    }
    if (root) json_object_put(root);
    hp_tok_strmap_free(&c.model_map);
    if (st != HP_OK) {
        hp_tokenizer_free(t);
        return st;
    }
    *out = t;
    return HP_OK;
}

hp_status_t hp_tokenizer_load(hp_tokenizer_t *out, const char *path) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return hp_tokenizer_load_dir(out, path);
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
    free(t->spelling_len);
    free(t->dec);
    free(t->dec_len);
    free(t->special);
    free(t->char_id);
    hp_tok_strmap_free(&t->vocab_bytes);
    hp_tok_strmap_free(&t->spell_map);
    hp_tok_strmap_free(&t->cache);
    free(t->merges);
    free(t->cross);
    hp_tok_normalizer_free(&t->norm);
    for (int i = 0; i < t->n_stages; i++) hp_tok_regex_free(&t->stages[i].re);
    hp_tok_regex_free(&t->word_char);
    free(t->stages);
    hp_tok_dec_steps_free(t->dec_steps, t->n_dec_steps);
    for (size_t i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].match);
    }
    free(t->added);
    free(t->trie[0]);
    free(t->trie[1]);
    free(t->prefix);
    free(t->suffix);
    free(t->chat_template);
    for (size_t i = 0; i < t->n_templates; i++) {
        free(t->template_names[i]);
        free(t->templates[i]);
    }
    free(t->template_names);
    free(t->templates);
    free(t->pool);
    free(t->sa);
    free(t->sb);
    free(t->sc);
    free(t->seg1);
    free(t->seg2);
    free(t->m);
    free(t->nbuf);
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
int32_t hp_tokenizer_pad_id(hp_tokenizer_t t) { return t->pad; }

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

/* Leftmost-longest added-token match in s[from..n) among tokens of one pass (normalized or
 * not), as HF's Aho-Corasick (LeftmostLongest). Returns the token index or -1. */
static long find_added(hp_tokenizer_t t, int pass, const char *s, size_t n, size_t from,
                       size_t *ms) {
    const uint8_t *first = t->added_first[pass];
    const hp_tok_trie_node_t *tr = t->trie[pass];
    for (size_t p = from; p < n; p++) {
        if (!first[(unsigned char)s[p]]) continue;
        long best = -1;
        int32_t node = 0;
        for (size_t k = p; k < n; k++) {
            int32_t ch = tr[node].child;
            while (ch >= 0 && tr[ch].byte != (uint8_t)s[k]) ch = tr[ch].sibling;
            if (ch < 0) break;
            node = ch;
            if (tr[node].added >= 0) best = tr[node].added;
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
static hp_status_t split_added(hp_tokenizer_t t, int pass, int special_as_text, const char *s,
                               size_t off, size_t len, span_t **out, size_t *cap, size_t *n) {
    size_t start_offset = off, end = off + len, from = off, ms;
    long k;
    while (from < end && (k = find_added(t, pass, s, end, from, &ms)) >= 0) {
        const added_t *a = &t->added[k];
        size_t start = ms, stop = ms + a->match_len;
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
                if (!hp_tok_utf8_get(s + q, ns - q, &cp) || !hp_tok_is_ws(cp)) break;
                ns = q;
            }
            start = ns;
        }
        if (a->rstrip) {
            uint32_t cp;
            int l;
            while (stop < end && (l = hp_tok_utf8_get(s + stop, end - stop, &cp)) && hp_tok_is_ws(cp))
                stop += (size_t)l;
        }
        HP_TRY(RESERVE(*out, *cap, *n + 2));
        if (start_offset < start) (*out)[(*n)++] = (span_t){start_offset, start - start_offset, -1, 0};
        (*out)[(*n)++] = (span_t){start, stop - start, a->id, 0};
        start_offset = stop;
        from = stop;
    }
    if (start_offset < end) {
        HP_TRY(RESERVE(*out, *cap, *n + 1));
        (*out)[(*n)++] = (span_t){start_offset, end - start_offset, -1, 0};
    }
    return HP_OK;
}

static hp_status_t pool_reserve(hp_tokenizer_t t, size_t extra) {
    return RESERVE(t->pool, t->pool_cap, t->pool_len + extra);
}

/* Pieces sc[0..nc) (id = is a match) of one input piece, after a split with `behavior`,
 * appended to sb (HF SplitDelimiterBehavior). */
static hp_status_t apply_behavior(hp_tokenizer_t t, int behavior, size_t nc, size_t *nb) {
    HP_TRY(RESERVE(t->sb, t->sb_cap, *nb + nc));
    size_t first = *nb;
    int prev_match = 0;
    if (behavior == HP_TOK_SPLIT_MERGED_NEXT) {
        /* HF folds from the right: a match joins the piece after it. */
        span_t *out = t->sb + first;
        size_t cnt = 0;
        for (size_t jj = nc; jj-- > 0;) {
            span_t m = t->sc[jj];
            if (m.id && !prev_match && cnt > 0) {
                out[cnt - 1].len += out[cnt - 1].off - m.off;
                out[cnt - 1].off = m.off;
                out[cnt - 1].origin = m.origin;
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
            if (behavior == HP_TOK_SPLIT_ISOLATED) {
                t->sb[(*nb)++] = m;
            } else if (behavior == HP_TOK_SPLIT_REMOVED) {
                if (!m.id) t->sb[(*nb)++] = m;
            } else if (behavior == HP_TOK_SPLIT_MERGED_PREV) {
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
    return HP_OK;
}

/* Matches and gaps of p (pool offsets) as sc spans (id = is a match). */
static hp_status_t to_spans(hp_tokenizer_t t, span_t p, size_t nm, size_t *nc) {
    size_t prev = 0;
    *nc = 0;
    HP_TRY(RESERVE(t->sc, t->sc_cap, 2 * nm + 1));
    for (size_t k = 0; k < nm; k++) {
        size_t ms = t->m[k].start, me = t->m[k].end;
        if (prev != ms) t->sc[(*nc)++] = (span_t){p.off + prev, ms - prev, 0, p.origin && prev == 0};
        t->sc[(*nc)++] = (span_t){p.off + ms, me - ms, 1, p.origin && ms == 0};
        prev = me;
    }
    if (prev != p.len) t->sc[(*nc)++] = (span_t){p.off + prev, p.len - prev, 0, p.origin && prev == 0};
    return HP_OK;
}

/* Metaspace on one piece: spaces become the replacement, which is also prepended
 * (prepend_scheme), then optionally a split before each replacement. */
static hp_status_t apply_metaspace(hp_tokenizer_t t, const stage_t *st, span_t p, size_t *nb) {
    size_t spaces = 0;
    for (size_t k = 0; k < p.len; k++) spaces += t->pool[p.off + k] == ' ';
    HP_TRY(pool_reserve(t, p.len + (spaces + 1) * (size_t)st->rep_len));
    char *dst = t->pool + t->pool_len, *src = t->pool + p.off;
    size_t o = 0;
    /* HF replaces the spaces first, so a leading space counts as a leading replacement. */
    int starts = p.len > 0 && (src[0] == ' ' || (p.len >= (size_t)st->rep_len &&
                                                 memcmp(src, st->rep, (size_t)st->rep_len) == 0));
    int prepend = st->prepend_scheme == HP_TOK_PREPEND_ALWAYS ||
                  (st->prepend_scheme == HP_TOK_PREPEND_FIRST && p.origin);
    if (prepend && !starts) {
        memcpy(dst, st->rep, (size_t)st->rep_len);
        o += (size_t)st->rep_len;
    }
    for (size_t k = 0; k < p.len; k++) {
        if (src[k] == ' ') {
            memcpy(dst + o, st->rep, (size_t)st->rep_len);
            o += (size_t)st->rep_len;
        } else {
            dst[o++] = src[k];
        }
    }
    span_t q = {t->pool_len, o, 0, p.origin};
    t->pool_len += o;
    if (!st->split) {
        HP_TRY(RESERVE(t->sb, t->sb_cap, *nb + 1));
        if (q.len) t->sb[(*nb)++] = q;
        return HP_OK;
    }
    size_t nm = 0;
    const char *s = t->pool + q.off;
    for (size_t k = 0; k + (size_t)st->rep_len <= q.len;) {
        if (memcmp(s + k, st->rep, (size_t)st->rep_len) == 0) {
            HP_TRY(RESERVE(t->m, t->m_cap, nm + 1));
            t->m[nm++] = (hp_tok_match_t){k, k + (size_t)st->rep_len};
            k += (size_t)st->rep_len;
        } else {
            k++;
        }
    }
    size_t nc;
    HP_TRY(to_spans(t, q, nm, &nc));
    return apply_behavior(t, HP_TOK_SPLIT_MERGED_NEXT, nc, nb);
}

/* Applies one pre-tokenizer step to the pieces sa[0..na) (offsets into the pool) giving
 * sb[0..*nb). */
static hp_status_t apply_stage(hp_tokenizer_t t, stage_t *st, size_t na, size_t *nb) {
    *nb = 0;
    for (size_t i = 0; i < na; i++) {
        span_t p = t->sa[i];
        if (st->kind == HP_TOK_STAGE_METASPACE) {
            HP_TRY(apply_metaspace(t, st, p, nb));
            continue;
        }
        if (st->kind == HP_TOK_STAGE_BYTELEVEL && st->add_prefix_space && t->pool[p.off] != ' ') {
            HP_TRY(pool_reserve(t, p.len + 1));
            t->pool[t->pool_len] = ' ';
            memmove(t->pool + t->pool_len + 1, t->pool + p.off, p.len);
            p.off = t->pool_len;
            p.len += 1;
            t->pool_len += p.len;
        }
        if (st->kind == HP_TOK_STAGE_BYTELEVEL && !st->use_regex) {
            HP_TRY(RESERVE(t->sb, t->sb_cap, *nb + 1));
            t->sb[(*nb)++] = p;
            continue;
        }
        size_t nm = 0, nc;
        HP_TRY(hp_tok_regex_find_all(&st->re, t->pool + p.off, p.len, &t->m, &t->m_cap, &nm));
        HP_TRY(to_spans(t, p, nm, &nc));
        int behavior = st->kind == HP_TOK_STAGE_BYTELEVEL ? HP_TOK_SPLIT_ISOLATED : st->behavior;
        if (st->kind == HP_TOK_STAGE_SPLIT && st->invert)
            for (size_t j = 0; j < nc; j++) t->sc[j].id = !t->sc[j].id;
        HP_TRY(apply_behavior(t, behavior, nc, nb));
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

static inline void sym_add(hp_tokenizer_t t, int32_t *ns, int32_t id) {
    int32_t k = (*ns)++;
    t->sym_id[k] = id;
    t->sym_len[k] = 1;
    t->sym_prev[k] = k - 1;
    t->sym_next[k] = k + 1;
}

/* HF's Word::merge_all on the symbols [lo, hi): a heap ordered by (rank, position), stale
 * entries skipped. */
static void merge_range(hp_tokenizer_t t, int32_t lo, int32_t hi) {
    size_t hn = 0;
    for (int32_t k = lo; k + 1 < hi; k++) {
        const merge_entry_t *m = merge_get(t, t->sym_id[k], t->sym_id[k + 1]);
        if (m) heap_push(t->heap, &hn, (heap_item_t){m->rank, k, m->new_id});
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
}

/* BPE of one pre-token, appending ids (HF BPE::merge_word then Word::merge_all). The
 * symbols are the bytes (byte-level) or the characters of the word; an unknown one becomes
 * its "<0xXX>" byte tokens (byte_fallback) or the unk token. */
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
    size_t need = 2 * n + 2; /* a byte-level byte may fall back to two byte tokens */
    if (need > t->sym_cap) {
        size_t cap = t->sym_cap ? t->sym_cap : 64;
        while (cap < need) cap *= 2;
        int32_t **arrs[4] = {&t->sym_id, &t->sym_prev, &t->sym_next, &t->sym_len};
        for (int k = 0; k < 4; k++) {
            int32_t *p = realloc(*arrs[k], cap * sizeof(int32_t));
            if (!p) return hp_error(HP_ERR_OOM, "tokenizer: cannot allocate BPE scratch");
            *arrs[k] = p;
        }
        t->sym_cap = cap;
    }
    HP_TRY(RESERVE(t->heap, t->heap_cap, 3 * need + 4));
    int32_t ns = 0;
    int32_t unk_pending = -1; /* HF's `unk`: an unk id waiting to be added (or fused) */
    size_t i = 0;
    while (i < n) {
        int32_t id;
        char fb[4];
        const char *bytes;
        size_t nbytes;
        if (t->byte_level) {
            unsigned char b = (unsigned char)w[i++];
            id = t->byte_id[b];
            bytes = fb;
            nbytes = 0;
            if (id < 0) { /* byte_fallback sees the byte's character of the alphabet */
                uint32_t cps[256];
                hp_tok_byte_to_cp(cps);
                nbytes = (size_t)hp_tok_utf8_put(cps[b], fb);
            }
        } else {
            uint32_t cp;
            int l = hp_tok_utf8_get(w + i, n - i, &cp);
            if (l <= 0) l = 1, cp = 0xFFFD; /* (the text was checked: not reached) */
            bytes = w + i;
            nbytes = (size_t)l;
            if (cp < 0x10000) {
                id = t->char_id[cp];
            } else {
                int64_t *v = hp_tok_strmap_get(&t->vocab_bytes, w + i, nbytes);
                id = v ? (int32_t)*v : -1;
            }
            i += nbytes;
        }
        if (id >= 0) {
            if (unk_pending >= 0) sym_add(t, &ns, unk_pending), unk_pending = -1;
            sym_add(t, &ns, id);
            continue;
        }
        if (t->byte_fallback) {
            int all = 1;
            for (size_t k = 0; k < nbytes; k++) all &= t->fb_id[(unsigned char)bytes[k]] >= 0;
            if (all) {
                /* (HF adds these before a pending unk, which waits for the next known one) */
                for (size_t k = 0; k < nbytes; k++) sym_add(t, &ns, t->fb_id[(unsigned char)bytes[k]]);
                continue;
            }
        }
        if (!t->has_unk) continue; /* no unk token: HF drops the character */
        if (t->unk_id < 0)
            return hp_error(HP_ERR_FORMAT, "%s: model.unk_token is not in model.vocab, but the "
                            "text holds a character without a token", t->name);
        if (unk_pending >= 0 && !t->fuse_unk) sym_add(t, &ns, unk_pending);
        unk_pending = t->unk_id;
    }
    if (unk_pending >= 0) sym_add(t, &ns, unk_pending);
    /* Merge piece by piece between adjacent symbols that no merge can join (see cross). */
    for (int32_t lo = 0; lo < ns;) {
        int32_t hi = lo + 1;
        if (t->cross)
            while (hi < ns && cross_has(t, t->sym_id[hi - 1], t->sym_id[hi])) hi++;
        else
            hi = ns;
        t->sym_prev[lo] = -1;
        t->sym_next[hi - 1] = -1;
        merge_range(t, lo, hi);
        lo = hi;
    }
    size_t start = out->len;
    HP_TRY(ids_reserve(out, (size_t)ns));
    for (int32_t k = 0; k < ns; k++)
        if (t->sym_len[k]) out->ids[out->len++] = t->sym_id[k];
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

/* Pre-tokenizes and BPE-encodes one normalized piece without added tokens. `origin`: the
 * piece starts at offset 0 of the input. */
static hp_status_t encode_text(hp_tokenizer_t t, const char *s, size_t len, int origin,
                               hp_token_ids_t *out) {
    t->pool_len = 0;
    HP_TRY(pool_reserve(t, len + 1));
    memcpy(t->pool, s, len);
    t->pool_len = len;
    HP_TRY(RESERVE(t->sa, t->sa_cap, 1));
    t->sa[0] = (span_t){0, len, 0, origin};
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
    /* HF's AddedVocabulary::extract_and_normalize: the non-normalized added tokens are found
     * in the raw text, each piece between them is normalized, then the normalized added
     * tokens are found in it. */
    size_t n1 = 0;
    int as_text = (flags & HP_TOKENIZE_SPECIAL_AS_TEXT) != 0;
    HP_TRY(split_added(t, 0, as_text, text, 0, len, &t->seg1, &t->seg1_cap, &n1));
    for (size_t i = 0; i < n1; i++) {
        span_t g = t->seg1[i];
        if (g.id >= 0) {
            HP_TRY(ids_push(out, g.id));
            continue;
        }
        const char *np = text + g.off;
        size_t nl = g.len;
        int moved = 0;
        if (t->norm.n_steps) HP_TRY(hp_tok_normalize(&t->norm, np, nl, &np, &nl, &moved));
        size_t n2 = 0;
        HP_TRY(split_added(t, 1, as_text, np, 0, nl, &t->seg2, &t->seg2_cap, &n2));
        for (size_t k = 0; k < n2; k++) {
            span_t h = t->seg2[k];
            HP_TRY(h.id >= 0 ? ids_push(out, h.id)
                             : encode_text(t, np + h.off, h.len, g.off == 0 && !moved && h.off == 0, out));
        }
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
