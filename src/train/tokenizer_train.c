/* Byte-level BPE training: GPT-2 regex pre-tokenization, word counts, then repeatedly the
 * most frequent adjacent pair is merged (ties: smaller left id, then smaller right id), with
 * incremental pair counts. Writes a HF tokenizer.json. docs/tokenizer.md. */
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyperparallel/file.h"
#include "hyperparallel/tokenizer.h"
#include "train/tokenizer-impl.h"

typedef struct pair_info {
    int32_t a, b;
    int64_t count;
    int32_t *where; /* word indices holding the pair (may repeat or be stale) */
    uint32_t n_where, cap_where;
    int32_t dirty;  /* merge index of the last change */
} pair_info_t;

typedef struct heap_e {
    int64_t count;
    int32_t a, b, pair;
} heap_e_t;

typedef struct trainer {
    const hp_tokenizer_train_options_t *opts;
    hp_tok_regex_t re;
    hp_tok_strmap_t words; /* word bytes -> count */
    /* words after counting */
    int32_t n_words;
    int64_t *wcount; /* (n_words,) */
    int32_t *woff;   /* (n_words,) offset into syms */
    int32_t *wlen;   /* (n_words,) current number of symbols */
    int32_t *syms;
    int32_t *seen;   /* (n_words,) last merge that visited the word */
    /* pairs */
    pair_info_t *pairs;
    size_t n_pairs, cap_pairs;
    uint64_t *pmap_key; /* open addressing: (a << 32 | b), UINT64_MAX empty */
    int32_t *pmap_val;
    size_t pmap_cap;
    heap_e_t *heap;
    size_t n_heap, cap_heap;
    int32_t *changed;
    size_t n_changed, cap_changed;
    /* tokens */
    hp_tok_strmap_t tok_map; /* token bytes -> id */
    char **tok;              /* id -> bytes */
    uint32_t *tok_len;
    int32_t n_tok, cap_tok;
    int32_t (*merges)[2];
    int32_t n_merges;
    int64_t invalid_bytes;
} trainer_t;

static hp_status_t grow_arr(void **p, size_t *cap, size_t need, size_t elem) {
    return hp_tok_reserve(p, cap, need, elem, 1024, "hp_tokenizer_train");
}

/* ---- counting words ----------------------------------------------------------------- */

static hp_status_t count_word(trainer_t *tr, const char *s, size_t n) {
    int64_t *slot;
    HP_TRY(hp_tok_strmap_put(&tr->words, s, n, 0, &slot, NULL));
    (*slot)++;
    return HP_OK;
}

/* Pre-tokenizes valid UTF-8 text with the GPT-2 pattern (ByteLevel, use_regex). */
static hp_status_t count_valid(trainer_t *tr, const char *s, size_t n) {
    size_t pos = 0, prev = 0, ms, me;
    int rc;
    while (pos < n && (rc = hp_tok_regex_next(&tr->re, s, n, pos, &ms, &me)) != 0) {
        if (rc < 0) return HP_ERR_INVALID_ARG;
        if (ms > prev) HP_TRY(count_word(tr, s + prev, ms - prev));
        if (me > ms) HP_TRY(count_word(tr, s + ms, me - ms));
        prev = me;
        pos = me > ms ? me : me + 1;
    }
    if (prev < n) HP_TRY(count_word(tr, s + prev, n - prev));
    return HP_OK;
}

/* Counts one document; bytes that are not UTF-8 become single-byte words. */
static hp_status_t count_text(trainer_t *tr, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t bad = i + hp_tok_utf8_check(s + i, n - i);
        if (bad > i) HP_TRY(count_valid(tr, s + i, bad - i));
        if (bad < n) {
            HP_TRY(count_word(tr, s + bad, 1));
            tr->invalid_bytes++;
            bad++;
        }
        i = bad;
    }
    return HP_OK;
}

/* Drops lines equal to the separator (with "\n" or "\r\n"), counting the rest. */
static hp_status_t count_doc(trainer_t *tr, const char *s, size_t n) {
    const char *sep = tr->opts->separator_line;
    if (!sep || !*sep) return count_text(tr, s, n);
    size_t sl = strlen(sep), start = 0, i = 0;
    while (i < n) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - s) + 1 : n; /* line is s[i..end) */
        size_t content = end - i - (nl ? 1 : 0);
        if (content > 0 && s[i + content - 1] == '\r') content--;
        if (content == sl && memcmp(s + i, sep, sl) == 0) {
            if (i > start) HP_TRY(count_text(tr, s + start, i - start));
            start = end;
        }
        i = end;
    }
    if (n > start) HP_TRY(count_text(tr, s + start, n - start));
    return HP_OK;
}

/* JSONL: each non-empty line is an object whose `field` string is a document. */
static hp_status_t count_jsonl(trainer_t *tr, const char *file, const char *s, size_t n) {
    const char *field = tr->opts->jsonl_field;
    json_tokener *tk = json_tokener_new();
    if (!tk) return hp_error(HP_ERR_OOM, "%s: cannot create a JSON parser", file);
    hp_status_t st = HP_OK;
    size_t i = 0, line = 0;
    while (st == HP_OK && i < n) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - s) : n;
        line++;
        size_t a = i, b = end;
        while (a < b && (s[a] == ' ' || s[a] == '\t' || s[a] == '\r')) a++;
        while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r')) b--;
        if (b > a) {
            if (b - a > INT32_MAX) {
                st = hp_error(HP_ERR_FORMAT, "%s:%zu: line too long", file, line);
                break;
            }
            json_tokener_reset(tk);
            json_object *o = json_tokener_parse_ex(tk, s + a, (int)(b - a)), *v = NULL;
            if (!o || json_tokener_get_error(tk) != json_tokener_success ||
                json_tokener_get_parse_end(tk) != b - a) {
                st = hp_error(HP_ERR_FORMAT, "%s:%zu: not a JSON object (JSONL expects one per line)",
                              file, line);
            } else if (!json_object_is_type(o, json_type_object) ||
                       !json_object_object_get_ex(o, field, &v) ||
                       !json_object_is_type(v, json_type_string)) {
                st = hp_error(HP_ERR_FORMAT, "%s:%zu: expected an object with a string field \"%s\"",
                              file, line, field);
            } else {
                st = count_doc(tr, json_object_get_string(v), (size_t)json_object_get_string_len(v));
            }
            if (o) json_object_put(o);
        }
        i = end + 1;
    }
    json_tokener_free(tk);
    return st;
}

/* ---- pairs -------------------------------------------------------------------------- */

static inline uint64_t pkey(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
static inline size_t phash(uint64_t k, size_t mask) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k & mask;
}

static hp_status_t pmap_grow(trainer_t *tr) {
    size_t cap = tr->pmap_cap ? tr->pmap_cap * 2 : 1 << 16;
    uint64_t *k = malloc(cap * sizeof(uint64_t));
    int32_t *v = malloc(cap * sizeof(int32_t));
    if (!k || !v) {
        free(k);
        free(v);
        return hp_error(HP_ERR_OOM, "hp_tokenizer_train: cannot grow the pair map");
    }
    memset(k, 0xFF, cap * sizeof(uint64_t));
    for (size_t i = 0; i < tr->pmap_cap; i++) {
        if (tr->pmap_key[i] == UINT64_MAX) continue;
        size_t j = phash(tr->pmap_key[i], cap - 1);
        while (k[j] != UINT64_MAX) j = (j + 1) & (cap - 1);
        k[j] = tr->pmap_key[i];
        v[j] = tr->pmap_val[i];
    }
    free(tr->pmap_key);
    free(tr->pmap_val);
    tr->pmap_key = k;
    tr->pmap_val = v;
    tr->pmap_cap = cap;
    return HP_OK;
}

/* Index of pair (a, b), created with count 0 when new. */
static hp_status_t pair_get(trainer_t *tr, int32_t a, int32_t b, int32_t *out) {
    if ((tr->n_pairs + 1) * 2 > tr->pmap_cap) HP_TRY(pmap_grow(tr));
    uint64_t k = pkey(a, b);
    size_t mask = tr->pmap_cap - 1, i = phash(k, mask);
    while (tr->pmap_key[i] != UINT64_MAX) {
        if (tr->pmap_key[i] == k) {
            *out = tr->pmap_val[i];
            return HP_OK;
        }
        i = (i + 1) & mask;
    }
    HP_TRY(grow_arr((void **)&tr->pairs, &tr->cap_pairs, tr->n_pairs + 1, sizeof(pair_info_t)));
    pair_info_t *p = &tr->pairs[tr->n_pairs];
    memset(p, 0, sizeof(*p));
    p->a = a, p->b = b, p->dirty = -1;
    tr->pmap_key[i] = k;
    tr->pmap_val[i] = (int32_t)tr->n_pairs;
    *out = (int32_t)tr->n_pairs++;
    return HP_OK;
}

static inline int heap_better(const heap_e_t *x, const heap_e_t *y) {
    if (x->count != y->count) return x->count > y->count;
    if (x->a != y->a) return x->a < y->a;
    return x->b < y->b;
}

static hp_status_t heap_push(trainer_t *tr, int32_t pi) {
    HP_TRY(grow_arr((void **)&tr->heap, &tr->cap_heap, tr->n_heap + 1, sizeof(heap_e_t)));
    heap_e_t x = {tr->pairs[pi].count, tr->pairs[pi].a, tr->pairs[pi].b, pi};
    size_t i = tr->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_better(&x, &tr->heap[p])) break;
        tr->heap[i] = tr->heap[p];
        i = p;
    }
    tr->heap[i] = x;
    return HP_OK;
}

static heap_e_t heap_pop(trainer_t *tr) {
    heap_e_t *h = tr->heap, top = h[0], x = h[--tr->n_heap];
    size_t n = tr->n_heap, i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const heap_e_t *best = &x;
        if (l < n && heap_better(&h[l], best)) m = l, best = &h[l];
        if (r < n && heap_better(&h[r], best)) m = r;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (n) h[i] = x;
    return top;
}

/* count += delta for pair (a, b) in word w; records the word on increments. */
static hp_status_t pair_add(trainer_t *tr, int32_t a, int32_t b, int64_t delta, int32_t w,
                            int32_t stamp) {
    int32_t pi;
    HP_TRY(pair_get(tr, a, b, &pi));
    pair_info_t *p = &tr->pairs[pi];
    p->count += delta;
    if (delta > 0 && (p->n_where == 0 || p->where[p->n_where - 1] != w)) {
        if (p->n_where == p->cap_where) {
            uint32_t c = p->cap_where ? p->cap_where * 2 : 4;
            int32_t *q = realloc(p->where, c * sizeof(int32_t));
            if (!q) return hp_error(HP_ERR_OOM, "hp_tokenizer_train: out of memory");
            p->where = q;
            p->cap_where = c;
        }
        p->where[p->n_where++] = w;
    }
    if (p->dirty != stamp) {
        p->dirty = stamp;
        HP_TRY(grow_arr((void **)&tr->changed, &tr->cap_changed, tr->n_changed + 1, sizeof(int32_t)));
        tr->changed[tr->n_changed++] = pi;
    }
    return HP_OK;
}

/* ---- tokens ------------------------------------------------------------------------- */

static hp_status_t add_token(trainer_t *tr, const char *s, size_t n, int32_t *id) {
    int64_t *slot;
    int inserted;
    HP_TRY(hp_tok_strmap_put(&tr->tok_map, s, n, tr->n_tok, &slot, &inserted));
    if (!inserted) {
        *id = (int32_t)*slot;
        return HP_OK;
    }
    if (tr->n_tok == tr->cap_tok) {
        int32_t c = tr->cap_tok ? tr->cap_tok * 2 : 1024;
        char **t = realloc(tr->tok, (size_t)c * sizeof(char *));
        if (t) tr->tok = t;
        uint32_t *l = realloc(tr->tok_len, (size_t)c * sizeof(uint32_t));
        if (l) tr->tok_len = l;
        if (!t || !l) return hp_error(HP_ERR_OOM, "hp_tokenizer_train: out of memory");
        tr->cap_tok = c;
    }
    char *copy = malloc(n + 1);
    if (!copy) return hp_error(HP_ERR_OOM, "hp_tokenizer_train: out of memory");
    memcpy(copy, s, n);
    copy[n] = 0;
    tr->tok[tr->n_tok] = copy;
    tr->tok_len[tr->n_tok] = (uint32_t)n;
    *id = tr->n_tok++;
    return HP_OK;
}

/* ---- writing ------------------------------------------------------------------------ */

static void put_json_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}

/* Byte-level spelling of raw token bytes. */
static void put_token(FILE *f, const uint32_t cp[256], const char *s, size_t n) {
    char buf[1024];
    size_t k = 0;
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cp[(unsigned char)s[i]];
        if (c == '"' || c == '\\') buf[k++] = '\\';
        k += (size_t)hp_tok_utf8_put(c, buf + k);
        if (k > sizeof(buf) - 8) {
            fwrite(buf, 1, k, f);
            k = 0;
        }
    }
    fwrite(buf, 1, k, f);
    fputc('"', f);
}

static void put_special_ref(FILE *f, const char *s, int type_id) {
    fputs("{\"SpecialToken\": {\"id\": ", f);
    put_json_string(f, s, strlen(s));
    fprintf(f, ", \"type_id\": %d}}", type_id);
}

static hp_status_t write_json(trainer_t *tr, const char *out_path) {
    const hp_tokenizer_train_options_t *o = tr->opts;
    uint32_t cp[256];
    hp_tok_byte_to_cp(cp);
    FILE *f;
    char *tmp;
    HP_TRY(hp_file_atomic_begin(out_path, &f, &tmp));
    fputs("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
          "  \"added_tokens\": [",
          f);
    for (size_t i = 0; i < o->n_special; i++) {
        fprintf(f, "%s\n    {\"id\": %zu, \"content\": ", i ? "," : "", i);
        put_json_string(f, o->special[i], strlen(o->special[i]));
        fputs(", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
              "\"normalized\": false, \"special\": true}",
              f);
    }
    fputs(o->n_special ? "\n  ],\n" : "],\n", f);
    fputs("  \"normalizer\": null,\n"
          "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
          "\"trim_offsets\": true, \"use_regex\": true},\n",
          f);
    if (o->n_special >= 2) {
        const char *bos = o->special[0], *eos = o->special[1];
        fputs("  \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [", f);
        put_special_ref(f, bos, 0);
        fputs(", {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, ", f);
        put_special_ref(f, eos, 0);
        fputs("], \"pair\": [", f);
        put_special_ref(f, bos, 0);
        fputs(", {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, ", f);
        put_special_ref(f, eos, 0);
        fputs(", ", f);
        put_special_ref(f, bos, 1);
        fputs(", {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}, ", f);
        put_special_ref(f, eos, 1);
        fputs("], \"special_tokens\": {", f);
        for (int k = 0; k < 2; k++) {
            const char *s = o->special[k];
            fputs(k ? ", " : "", f);
            put_json_string(f, s, strlen(s));
            fputs(": {\"id\": ", f);
            put_json_string(f, s, strlen(s));
            fprintf(f, ", \"ids\": [%d], \"tokens\": [", k);
            put_json_string(f, s, strlen(s));
            fputs("]}", f);
        }
        fputs("}},\n", f);
    } else {
        fputs("  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
              "\"trim_offsets\": false, \"use_regex\": true},\n",
              f);
    }
    fputs("  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
          "\"trim_offsets\": true, \"use_regex\": true},\n"
          "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n"
          "    \"unk_token\": null,\n    \"continuing_subword_prefix\": null,\n"
          "    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n"
          "    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n    \"vocab\": {",
          f);
    for (int32_t id = 0; id < tr->n_tok; id++) {
        fputs(id ? ",\n      " : "\n      ", f);
        if ((size_t)id < o->n_special)
            put_json_string(f, tr->tok[id], tr->tok_len[id]);
        else
            put_token(f, cp, tr->tok[id], tr->tok_len[id]);
        fprintf(f, ": %d", id);
    }
    fputs("\n    },\n    \"merges\": [", f);
    for (int32_t i = 0; i < tr->n_merges; i++) {
        fputs(i ? ",\n      [" : "\n      [", f);
        int32_t a = tr->merges[i][0], b = tr->merges[i][1];
        put_token(f, cp, tr->tok[a], tr->tok_len[a]);
        fputs(", ", f);
        put_token(f, cp, tr->tok[b], tr->tok_len[b]);
        fputc(']', f);
    }
    fputs("\n    ]\n  }\n}\n", f);
    hp_status_t st = hp_file_atomic_commit(out_path, f, tmp);
    if (st != HP_OK) return hp_error_prefix(st, "%s: cannot write the tokenizer: ", out_path);
    return HP_OK;
}

/* ---- training ----------------------------------------------------------------------- */

static hp_status_t merge_pair(trainer_t *tr, int32_t pi, int32_t new_id, int32_t stamp) {
    pair_info_t *p = &tr->pairs[pi];
    int32_t a = p->a, b = p->b;
    /* The where list may grow while we walk it (pair_add on this pair is impossible: a
     * merge never creates (a, b) itself... unless new_id equals a or b; copy to be safe). */
    uint32_t nw = p->n_where;
    int32_t *where = malloc((size_t)(nw ? nw : 1) * sizeof(int32_t));
    if (!where) return hp_error(HP_ERR_OOM, "hp_tokenizer_train: out of memory");
    memcpy(where, p->where, (size_t)nw * sizeof(int32_t));
    hp_status_t st = HP_OK;
    for (uint32_t k = 0; k < nw && st == HP_OK; k++) {
        int32_t w = where[k];
        if (tr->seen[w] == stamp) continue;
        tr->seen[w] = stamp;
        int32_t *s = tr->syms + tr->woff[w];
        int32_t n = tr->wlen[w], o = 0;
        int64_t c = tr->wcount[w];
        for (int32_t i = 0; i < n && st == HP_OK;) {
            if (i + 1 < n && s[i] == a && s[i + 1] == b) {
                if (o > 0) {
                    st = pair_add(tr, s[o - 1], a, -c, w, stamp);
                    if (st == HP_OK) st = pair_add(tr, s[o - 1], new_id, c, w, stamp);
                }
                if (i + 2 < n && st == HP_OK) {
                    st = pair_add(tr, b, s[i + 2], -c, w, stamp);
                    if (st == HP_OK) st = pair_add(tr, new_id, s[i + 2], c, w, stamp);
                }
                s[o++] = new_id;
                i += 2;
            } else {
                s[o++] = s[i++];
            }
        }
        tr->wlen[w] = o;
    }
    free(where);
    HP_TRY(st);
    p = &tr->pairs[pi];
    p->count = 0;
    p->n_where = 0;
    return HP_OK;
}

static hp_status_t train_words(trainer_t *tr) {
    const hp_tokenizer_train_options_t *o = tr->opts;
    uint32_t cp[256];
    hp_tok_byte_to_cp(cp);
    /* ids: special tokens, then the 256 bytes ordered by their byte-level character. */
    for (size_t i = 0; i < o->n_special; i++) {
        int32_t id;
        HP_TRY(add_token(tr, o->special[i], strlen(o->special[i]), &id));
        if ((size_t)id != i)
            return hp_error(HP_ERR_INVALID_ARG, "hp_tokenizer_train: special token \"%s\" is "
                            "given twice", o->special[i]);
    }
    int order[256];
    for (int b = 0; b < 256; b++) order[b] = b;
    for (int i = 1; i < 256; i++) { /* insertion sort by code point */
        int x = order[i], j = i - 1;
        while (j >= 0 && cp[order[j]] > cp[x]) order[j + 1] = order[j], j--;
        order[j + 1] = x;
    }
    int32_t byte_id[256];
    for (int i = 0; i < 256; i++) {
        char c = (char)order[i];
        /* A special token spelled as one byte would collide; the map keeps ids unique. */
        HP_TRY(add_token(tr, &c, 1, &byte_id[order[i]]));
    }

    /* Word arrays. */
    size_t total = 0;
    tr->n_words = (int32_t)tr->words.count;
    for (size_t i = 0; i < tr->words.cap; i++)
        if (tr->words.e[i].hash) total += tr->words.e[i].len;
    if (total > INT32_MAX) return hp_error(HP_ERR_INVALID_ARG, "hp_tokenizer_train: too many distinct words");
    size_t nw = (size_t)tr->n_words ? (size_t)tr->n_words : 1;
    tr->wcount = malloc(nw * sizeof(int64_t));
    tr->woff = malloc(nw * sizeof(int32_t));
    tr->wlen = malloc(nw * sizeof(int32_t));
    tr->seen = malloc(nw * sizeof(int32_t));
    tr->syms = malloc((total ? total : 1) * sizeof(int32_t));
    if (!tr->wcount || !tr->woff || !tr->wlen || !tr->seen || !tr->syms)
        return hp_error(HP_ERR_OOM, "hp_tokenizer_train: out of memory for %d words", tr->n_words);
    /* Words in pool order (insertion order of first occurrence): deterministic. */
    int32_t w = 0;
    size_t off = 0;
    {
        /* Collect entries ordered by pool offset. */
        int32_t *idx = malloc(nw * sizeof(int32_t));
        if (!idx) return HP_ERR_OOM;
        for (size_t i = 0; i < tr->words.cap; i++)
            if (tr->words.e[i].hash) idx[w++] = (int32_t)i;
        /* pool offsets grow with insertion: sort idx by offset (radix-free: qsort). */
        const hp_tok_strmap_entry_t *E = tr->words.e;
        for (int32_t gap = w / 2; gap > 0; gap /= 2) /* shell sort, no global state */
            for (int32_t i = gap; i < w; i++) {
                int32_t x = idx[i], j = i;
                while (j >= gap && E[idx[j - gap]].off > E[x].off) idx[j] = idx[j - gap], j -= gap;
                idx[j] = x;
            }
        for (int32_t k = 0; k < w; k++) {
            const hp_tok_strmap_entry_t *e = &E[idx[k]];
            const char *s = hp_tok_strmap_key(&tr->words, e);
            tr->wcount[k] = e->val;
            tr->woff[k] = (int32_t)off;
            tr->wlen[k] = (int32_t)e->len;
            tr->seen[k] = -1;
            for (uint32_t i = 0; i < e->len; i++) tr->syms[off + i] = byte_id[(unsigned char)s[i]];
            off += e->len;
        }
        free(idx);
    }
    hp_tok_strmap_free(&tr->words);

    /* Initial pair counts. */
    for (int32_t k = 0; k < tr->n_words; k++) {
        const int32_t *s = tr->syms + tr->woff[k];
        for (int32_t i = 0; i + 1 < tr->wlen[k]; i++)
            HP_TRY(pair_add(tr, s[i], s[i + 1], tr->wcount[k], k, -2));
    }
    for (size_t i = 0; i < tr->n_pairs; i++) HP_TRY(heap_push(tr, (int32_t)i));
    tr->n_changed = 0;

    int64_t min_freq = o->min_frequency > 0 ? o->min_frequency : 2;
    HP_TRY(grow_arr((void **)&tr->merges, &(size_t){0}, (size_t)(o->vocab_size + 1), sizeof(int32_t[2])));
    double t0 = hp_clock_now_seconds();
    while (tr->n_tok < o->vocab_size && tr->n_heap > 0) {
        heap_e_t top = heap_pop(tr);
        pair_info_t *p = &tr->pairs[top.pair];
        if (top.count != p->count) continue; /* stale entry */
        if (p->count < min_freq) break;
        int32_t a = p->a, b = p->b;
        size_t la = tr->tok_len[a], lb = tr->tok_len[b];
        char *cat = malloc(la + lb + 1);
        if (!cat) return HP_ERR_OOM;
        memcpy(cat, tr->tok[a], la);
        memcpy(cat + la, tr->tok[b], lb);
        int32_t new_id;
        hp_status_t st = add_token(tr, cat, la + lb, &new_id);
        free(cat);
        HP_TRY(st);
        int32_t stamp = tr->n_merges;
        tr->merges[tr->n_merges][0] = a;
        tr->merges[tr->n_merges][1] = b;
        tr->n_merges++;
        tr->n_changed = 0;
        HP_TRY(merge_pair(tr, top.pair, new_id, stamp));
        for (size_t i = 0; i < tr->n_changed; i++)
            if (tr->pairs[tr->changed[i]].count > 0) HP_TRY(heap_push(tr, tr->changed[i]));
        if (o->verbose && tr->n_merges % 1000 == 0)
            hp_log(HP_LOG_INFO, "hp_tokenizer_train: %d merges, vocab %d, %.1f s", tr->n_merges,
                   tr->n_tok, hp_clock_now_seconds() - t0);
    }
    return HP_OK;
}

static void trainer_free(trainer_t *tr) {
    hp_tok_regex_free(&tr->re);
    hp_tok_strmap_free(&tr->words);
    hp_tok_strmap_free(&tr->tok_map);
    free(tr->wcount);
    free(tr->woff);
    free(tr->wlen);
    free(tr->syms);
    free(tr->seen);
    for (size_t i = 0; i < tr->n_pairs; i++) free(tr->pairs[i].where);
    free(tr->pairs);
    free(tr->pmap_key);
    free(tr->pmap_val);
    free(tr->heap);
    free(tr->changed);
    for (int32_t i = 0; i < tr->n_tok; i++) free(tr->tok[i]);
    free(tr->tok);
    free(tr->tok_len);
    free(tr->merges);
}

static hp_status_t check_opts(const hp_tokenizer_train_options_t *o) {
    if (!o) return hp_error(HP_ERR_INVALID_ARG, "hp_tokenizer_train: options are NULL");
    int64_t need = 256 + (int64_t)o->n_special;
    if (o->vocab_size < need || o->vocab_size > (1 << 24))
        return hp_error(HP_ERR_INVALID_ARG,
                        "hp_tokenizer_train: vocab_size %d must be in [%lld, %d] (256 bytes + "
                        "%zu special tokens at least)",
                        o->vocab_size, (long long)need, 1 << 24, o->n_special);
    for (size_t i = 0; i < o->n_special; i++) {
        size_t n = o->special[i] ? strlen(o->special[i]) : 0;
        if (n == 0 || hp_tok_utf8_check(o->special[i], n) != n)
            return hp_error(HP_ERR_INVALID_ARG,
                            "hp_tokenizer_train: special token %zu is empty or not UTF-8", i);
        if (n == 1)
            return hp_error(HP_ERR_INVALID_ARG,
                            "hp_tokenizer_train: special token \"%s\" is a single byte, which is "
                            "already a byte token; use a longer name such as \"<|%s|>\"",
                            o->special[i], o->special[i]);
    }
    return HP_OK;
}

static hp_status_t trainer_init(trainer_t *tr, const hp_tokenizer_train_options_t *o) {
    memset(tr, 0, sizeof(*tr));
    tr->opts = o;
    HP_TRY(check_opts(o));
    HP_TRY(hp_tok_regex_compile(&tr->re, HP_TOK_GPT2_PATTERN, PCRE2_ZERO_TERMINATED, 0,
                                "GPT-2 pattern"));
    HP_TRY(hp_tok_strmap_init(&tr->words, 1 << 16));
    HP_TRY(hp_tok_strmap_init(&tr->tok_map, (size_t)o->vocab_size));
    return HP_OK;
}

static hp_status_t finish(trainer_t *tr, const char *out_path, double t0) {
    size_t n_words = tr->words.count;
    HP_TRY(train_words(tr));
    if (tr->invalid_bytes)
        hp_log(HP_LOG_WARN, "hp_tokenizer_train: %lld bytes were not UTF-8 and were counted as "
               "single-byte words", (long long)tr->invalid_bytes);
    if (tr->n_tok < tr->opts->vocab_size && tr->opts->verbose)
        hp_log(HP_LOG_INFO, "hp_tokenizer_train: stopped at vocab %d < %d: no pair left that occurs "
               "at least %lld times", tr->n_tok, tr->opts->vocab_size,
               (long long)(tr->opts->min_frequency > 0 ? tr->opts->min_frequency : 2));
    HP_TRY(write_json(tr, out_path));
    if (tr->opts->verbose)
        hp_log(HP_LOG_INFO, "hp_tokenizer_train: %zu distinct words, %d merges, vocab %d, "
               "%.2f s -> %s", n_words, tr->n_merges, tr->n_tok, hp_clock_now_seconds() - t0, out_path);
    return HP_OK;
}

hp_status_t hp_tokenizer_train_texts(const hp_tokenizer_train_options_t *opts,
                                     const char *const *texts, const size_t *lens,
                                     size_t n_texts, const char *out_path) {
    trainer_t tr;
    double t0 = hp_clock_now_seconds();
    hp_status_t st = trainer_init(&tr, opts);
    for (size_t i = 0; st == HP_OK && i < n_texts; i++) st = count_doc(&tr, texts[i], lens[i]);
    if (st == HP_OK) st = finish(&tr, out_path, t0);
    trainer_free(&tr);
    return st;
}

hp_status_t hp_tokenizer_train(const hp_tokenizer_train_options_t *opts,
                               const char *const *files, size_t n_files, const char *out_path) {
    trainer_t tr;
    double t0 = hp_clock_now_seconds();
    hp_status_t st = trainer_init(&tr, opts);
    if (st == HP_OK && n_files == 0)
        st = hp_error(HP_ERR_INVALID_ARG, "hp_tokenizer_train: no input files");
    for (size_t i = 0; st == HP_OK && i < n_files; i++) {
        char *buf;
        size_t len;
        st = hp_file_read_all(files[i], "training text", SIZE_MAX, &buf, &len);
        if (st == HP_OK) {
            st = opts->jsonl_field ? count_jsonl(&tr, files[i], buf, len) : count_doc(&tr, buf, len);
            free(buf);
        }
    }
    if (st == HP_OK) st = finish(&tr, out_path, t0);
    trainer_free(&tr);
    return st;
}
