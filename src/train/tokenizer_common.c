/* Helpers of the tokenizer and its trainer: byte-level alphabet, UTF-8, a byte-string hash
 * map and the PCRE2 wrapper (tokenizer-impl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/tokenizer-impl.h"

hp_status_t hp_tok_reserve(void **buf, size_t *cap, size_t n, size_t elem, size_t first, const char *who) {
    if (n <= *cap) return HP_OK;
    size_t c = *cap ? *cap : first;
    while (c < n) c *= 2;
    void *p = realloc(*buf, c * elem);
    if (!p) return hp_error(HP_ERR_OOM, "%s: cannot allocate %zu bytes", who, c * elem);
    *buf = p;
    *cap = c;
    return HP_OK;
}

void hp_tok_byte_to_cp(uint32_t cp[256]) {
    /* Printable bytes stand for themselves; the others get 256, 257, ... in byte order. */
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp[b] = printable ? (uint32_t)b : next++;
    }
}

int hp_tok_utf8_put(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int hp_tok_utf8_get(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) return 0;
    unsigned c = u[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (u[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

size_t hp_tok_utf8_check(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = hp_tok_utf8_get(s + i, n - i, &cp);
        if (k == 0) return i;
        i += (size_t)k;
    }
    return n;
}

/* ---- byte-string hash map ----------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    /* FNV-1a with a final mix; 0 is reserved for empty slots. */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h ? h : 1;
}

hp_status_t hp_tok_strmap_init(hp_tok_strmap_t *m, size_t cap_hint) {
    memset(m, 0, sizeof(*m));
    size_t cap = 64;
    while (cap < cap_hint * 2) cap <<= 1;
    m->e = hp_calloc(cap, sizeof(*m->e));
    if (!m->e) return HP_ERR_OOM;
    m->cap = cap;
    return HP_OK;
}

void hp_tok_strmap_free(hp_tok_strmap_t *m) {
    free(m->e);
    free(m->pool);
    memset(m, 0, sizeof(*m));
}

void hp_tok_strmap_clear(hp_tok_strmap_t *m) {
    memset(m->e, 0, m->cap * sizeof(*m->e));
    m->count = 0;
    m->pool_len = 0;
}

static size_t find_slot(const hp_tok_strmap_t *m, const char *key, size_t len, uint64_t h) {
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    for (;;) {
        const hp_tok_strmap_entry_t *e = &m->e[i];
        if (e->hash == 0) return i;
        if (e->hash == h && e->len == len && memcmp(m->pool + e->off, key, len) == 0) return i;
        i = (i + 1) & mask;
    }
}

int64_t *hp_tok_strmap_get(const hp_tok_strmap_t *m, const char *key, size_t len) {
    if (!m->e) return NULL;
    uint64_t h = hash_bytes(key, len);
    size_t i = find_slot(m, key, len, h);
    return m->e[i].hash ? &m->e[i].val : NULL;
}

static hp_status_t grow(hp_tok_strmap_t *m) {
    size_t cap = m->cap * 2;
    hp_tok_strmap_entry_t *e = hp_calloc(cap, sizeof(*e));
    if (!e) return HP_ERR_OOM;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->e[i].hash) continue;
        size_t j = (size_t)m->e[i].hash & (cap - 1);
        while (e[j].hash) j = (j + 1) & (cap - 1);
        e[j] = m->e[i];
    }
    free(m->e);
    m->e = e;
    m->cap = cap;
    return HP_OK;
}

hp_status_t hp_tok_strmap_put(hp_tok_strmap_t *m, const char *key, size_t len, int64_t init,
                              int64_t **slot, int *inserted) {
    if (len > UINT32_MAX) return hp_error(HP_ERR_INVALID_ARG, "tokenizer map: key too long");
    if ((m->count + 1) * 2 > m->cap) HP_TRY(grow(m));
    uint64_t h = hash_bytes(key, len);
    size_t i = find_slot(m, key, len, h);
    hp_tok_strmap_entry_t *e = &m->e[i];
    if (e->hash) {
        if (inserted) *inserted = 0;
        if (slot) *slot = &e->val;
        return HP_OK;
    }
    if (m->pool_len + len + 1 > m->pool_cap) {
        size_t cap = m->pool_cap ? m->pool_cap : 4096;
        while (cap < m->pool_len + len + 1) cap *= 2;
        if (cap > UINT32_MAX) return hp_error(HP_ERR_OOM, "tokenizer map: key pool over 4 GiB");
        char *p = realloc(m->pool, cap);
        if (!p) return hp_error(HP_ERR_OOM, "tokenizer map: cannot grow key pool to %zu bytes", cap);
        m->pool = p;
        m->pool_cap = cap;
    }
    memcpy(m->pool + m->pool_len, key, len);
    m->pool[m->pool_len + len] = 0;
    e->hash = h;
    e->off = (uint32_t)m->pool_len;
    e->len = (uint32_t)len;
    e->val = init;
    m->pool_len += len + 1;
    m->count++;
    if (inserted) *inserted = 1;
    if (slot) *slot = &e->val;
    return HP_OK;
}

/* ---- PCRE2 ------------------------------------------------------------------------- */

/* Oniguruma (HF's regex engine) and PCRE2 disagree on a few Unicode classes: PCRE2's \s
 * includes U+180E (its \h list), Unicode White_Space (Oniguruma) does not; Oniguruma's \w
 * is Letter | Mark | Decimal_Number | Connector_Punctuation, PCRE2's is [\p{L}\p{N}_]; and
 * Debian 12's PCRE2 has Unicode 14.0 categories where Oniguruma has 16.0. So \s \S \w \W \d
 * \D and every general-category \p{..} / \P{..} is rewritten into an explicit class with
 * 16.0's members (tokenizer_unicode.c); inside a class \S \W \D are left as PCRE2 has them.
 * \uHHHH (Oniguruma) becomes \x{HHHH} (PCRE2). */
#define WS_LIST "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define GC_BIT(g) (1u << HP_TOK_GC_##g)
#define WORD_MASK (GC_BIT(Lu) | GC_BIT(Ll) | GC_BIT(Lt) | GC_BIT(Lm) | GC_BIT(Lo) | GC_BIT(Mn) | \
                   GC_BIT(Mc) | GC_BIT(Me) | GC_BIT(Nd) | GC_BIT(Pc))

static int is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static hp_status_t onig_compat(const char *p, size_t n, hp_tok_buf_t *out) {
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\\' && i + 1 < n) {
            char c = p[i + 1];
            uint32_t mask = 0;
            int negate = 0;
            size_t skip = 2;
            if (c == 's') {
                HP_TRY(hp_tok_buf_add(out, in_class ? WS_LIST : "[" WS_LIST "]",
                                      strlen(WS_LIST) + (in_class ? 0 : 2)));
                i++;
                continue;
            }
            if (c == 'S' && !in_class) {
                HP_TRY(hp_tok_buf_add(out, "[^" WS_LIST "]", strlen(WS_LIST) + 3));
                i++;
                continue;
            }
            if (c == 'w' || (c == 'W' && !in_class)) mask = WORD_MASK, negate = c == 'W';
            else if (c == 'd' || (c == 'D' && !in_class)) mask = GC_BIT(Nd), negate = c == 'D';
            else if (c == 'p' || c == 'P') {
                const char *name = p + i + 2;
                size_t nl = 0;
                negate = c == 'P';
                if (i + 2 < n && p[i + 2] == '{') {
                    const char *end = memchr(p + i + 3, '}', n - i - 3);
                    if (end) {
                        name = p + i + 3;
                        nl = (size_t)(end - name);
                        skip = 3 + nl + 1;
                        if (nl && name[0] == '^') name++, nl--, negate = !negate;
                    }
                } else if (i + 2 < n) {
                    nl = 1, skip = 3;
                }
                mask = nl ? hp_tok_gc_mask_of_name(name, nl) : 0; /* others: PCRE2's own */
            } else if (c == 'u' && i + 5 < n && is_hex(p[i + 2]) && is_hex(p[i + 3]) &&
                       is_hex(p[i + 4]) && is_hex(p[i + 5])) {
                char x[16];
                snprintf(x, sizeof(x), "\\x{%.4s}", p + i + 2);
                HP_TRY(hp_tok_buf_add(out, x, strlen(x)));
                i += 5;
                continue;
            }
            if (mask) {
                HP_TRY(hp_tok_unicode_class(out, mask, negate, in_class));
                i += skip - 1;
                continue;
            }
            HP_TRY(hp_tok_buf_add(out, p + i, 2)); /* any other escape, as written */
            i++;
            continue;
        }
        if (p[i] == '[' && !in_class) {
            in_class = 1;
            HP_TRY(hp_tok_buf_add(out, "[", 1));
            /* "[]" and "[^]" start with a literal ']' */
            if (i + 1 < n && p[i + 1] == '^') HP_TRY(hp_tok_buf_add(out, p + ++i, 1));
            if (i + 1 < n && p[i + 1] == ']') HP_TRY(hp_tok_buf_add(out, p + ++i, 1));
            continue;
        }
        if (p[i] == '[' && in_class && i + 1 < n && p[i + 1] == ':') {
            const char *end = memchr(p + i + 2, ']', n - i - 2); /* [:alpha:] */
            size_t k = end ? (size_t)(end - p) + 1 - i : 1;
            HP_TRY(hp_tok_buf_add(out, p + i, k));
            i += k - 1;
            continue;
        }
        if (p[i] == ']' && in_class) in_class = 0;
        HP_TRY(hp_tok_buf_add(out, p + i, 1));
    }
    return HP_OK;
}

hp_status_t hp_tok_regex_compile(hp_tok_regex_t *re, const char *pattern, size_t len,
                                 int literal, const char *what) {
    memset(re, 0, sizeof(*re));
    int err = 0;
    PCRE2_SIZE erroff = 0;
    uint32_t opts = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
    if (len == PCRE2_ZERO_TERMINATED) len = strlen(pattern);
    hp_tok_buf_t conv = {0};
    if (!literal) {
        hp_status_t st = onig_compat(pattern, len, &conv);
        if (st != HP_OK) {
            free(conv.p);
            return hp_error(st, "%s: cannot translate the regex (out of memory)", what);
        }
    }
    re->code = pcre2_compile((PCRE2_SPTR)(literal ? pattern : conv.p), literal ? len : conv.len,
                             opts, &err, &erroff, NULL);
    if (!re->code && !literal) { /* report the error at its place in the pattern as written */
        pcre2_code *c = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &err, &erroff, NULL);
        if (c) pcre2_code_free(c);
    }
    free(conv.p);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof(msg));
        return hp_error(HP_ERR_FORMAT, "%s: regex does not compile at offset %zu: %s", what,
                        (size_t)erroff, (const char *)msg);
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    re->md = pcre2_match_data_create_from_pattern(re->code, NULL);
    if (!re->md) {
        pcre2_code_free(re->code);
        re->code = NULL;
        return hp_error(HP_ERR_OOM, "%s: cannot allocate regex match data", what);
    }
    return HP_OK;
}

void hp_tok_regex_free(hp_tok_regex_t *re) {
    if (re->md) pcre2_match_data_free(re->md);
    if (re->code) pcre2_code_free(re->code);
    memset(re, 0, sizeof(*re));
}

int hp_tok_regex_next(hp_tok_regex_t *re, const char *s, size_t n, size_t from, size_t *ms,
                      size_t *me) {
    int rc = re->jit ? pcre2_jit_match(re->code, (PCRE2_SPTR)s, n, from, 0, re->md, NULL)
                     : pcre2_match(re->code, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK,
                                   re->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        hp_error(HP_ERR_INVALID_ARG, "tokenizer regex: matching failed at offset %zu: %s",
                 from, (const char *)msg);
        return -1;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(re->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

hp_status_t hp_tok_regex_find_all(hp_tok_regex_t *re, const char *s, size_t n,
                                  hp_tok_match_t **out, size_t *cap, size_t *count) {
    size_t pos = 0, ms, me, prev_end = 0;
    int rc, have_last = 0;
    *count = 0;
    while (pos <= n && (rc = hp_tok_regex_next(re, s, n, pos, &ms, &me)) != 0) {
        if (rc < 0) return HP_ERR_INVALID_ARG;
        if (me == ms) {
            /* Empty match: step one character; like onig's find_iter (HF), an empty match
             * right at the end of the previous match is not reported. */
            uint32_t cp;
            int l = me < n ? hp_tok_utf8_get(s + me, n - me, &cp) : 1;
            pos = me + (size_t)(l ? l : 1);
            if (have_last && ms == prev_end) continue;
        } else {
            pos = me;
        }
        if (*count == *cap) {
            size_t c = *cap ? *cap * 2 : 64;
            hp_tok_match_t *p = realloc(*out, c * sizeof(**out));
            if (!p) return hp_error(HP_ERR_OOM, "tokenizer regex: cannot grow the match list to %zu", c);
            *out = p;
            *cap = c;
        }
        (*out)[(*count)++] = (hp_tok_match_t){ms, me};
        prev_end = me;
        have_last = 1;
    }
    return HP_OK;
}
