/* Decode: ids -> tokens -> HF's decoder chain (ByteLevel, Replace, ByteFallback, Fuse, Strip,
 * Metaspace, Sequence of those) -> text, with invalid UTF-8 replaced as Rust's
 * String::from_utf8_lossy does. docs/tokenizer.md, "Decoders". */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>

#include "train/tokenizer-impl.h"

void hp_tok_dec_steps_free(hp_tok_dec_step_t *steps, int n) {
    for (int i = 0; i < n; i++) {
        free(steps[i].pat);
        free(steps[i].text);
        hp_tok_regex_free(&steps[i].re);
    }
    free(steps);
}

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

/* Appends the lossy UTF-8 of raw[0..len) to dst. */
static hp_status_t add_lossy(hp_tok_buf_t *dst, const char *raw, size_t len) {
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        for (;;) { /* the longest valid run */
            uint32_t cp;
            int k = j >= len ? 0 : (unsigned char)raw[j] < 0x80 ? 1 : hp_tok_utf8_get(raw + j, len - j, &cp);
            if (k <= 0) break;
            j += (size_t)k;
        }
        HP_TRY(hp_tok_buf_add(dst, raw + i, j - i));
        if (j < len) {
            HP_TRY(hp_tok_buf_add(dst, "\xEF\xBF\xBD", 3));
            j += invalid_unit((const unsigned char *)raw + j, len - j);
        }
        i = j;
    }
    return HP_OK;
}

/* A list of token strings: token i is text.p[off[i] .. off[i] + len[i]). */
typedef struct toks {
    hp_tok_buf_t text;
    size_t *off, *len;
    size_t n, cap;
} toks_t;

static void toks_free(toks_t *t) {
    free(t->text.p);
    free(t->off);
    free(t->len);
    memset(t, 0, sizeof(*t));
}

static hp_status_t toks_push(toks_t *t, const char *s, size_t n) {
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 64;
        size_t *o = realloc(t->off, c * sizeof(size_t));
        if (!o) return hp_error(HP_ERR_OOM, "tokenizer decode: out of memory");
        t->off = o;
        size_t *l = realloc(t->len, c * sizeof(size_t));
        if (!l) return hp_error(HP_ERR_OOM, "tokenizer decode: out of memory");
        t->len = l;
        t->cap = c;
    }
    t->off[t->n] = t->text.len;
    t->len[t->n] = n;
    t->n++;
    return hp_tok_buf_add(&t->text, s, n);
}

/* The token being built last gets more text. */
static hp_status_t toks_extend(toks_t *t, const char *s, size_t n) {
    t->len[t->n - 1] += n;
    return hp_tok_buf_add(&t->text, s, n);
}

/* "<0xXX>" -> the byte, as HF's ByteFallback (u8::from_str_radix of the two characters,
 * which also takes "+X"); -1 otherwise. */
static int fallback_byte(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) {
            if (i == 3 && c == '+') continue;
            return -1;
        }
        v = v * 16 + d;
    }
    return v;
}

/* Replace of one token (String or Regex pattern). */
static hp_status_t replace_into(const hp_tok_dec_step_t *st, const char *s, size_t n, toks_t *out,
                                hp_tok_match_t **m, size_t *m_cap) {
    HP_TRY(toks_push(out, "", 0));
    size_t prev = 0;
    if (st->is_regex) {
        /* decode is thread-safe: the compiled pattern is shared, the match data is not */
        hp_tok_regex_t re = st->re;
        re.md = pcre2_match_data_create_from_pattern(re.code, NULL);
        if (!re.md) return hp_error(HP_ERR_OOM, "tokenizer decode: cannot allocate regex match data");
        size_t nm = 0;
        hp_status_t rs = hp_tok_regex_find_all(&re, s, n, m, m_cap, &nm);
        pcre2_match_data_free(re.md);
        HP_TRY(rs);
        for (size_t k = 0; k < nm; k++) {
            HP_TRY(toks_extend(out, s + prev, (*m)[k].start - prev));
            HP_TRY(toks_extend(out, st->text, st->text_len));
            prev = (*m)[k].end;
        }
    } else if (st->pat_len > 0) {
        const char *hit;
        while (prev + st->pat_len <= n && (hit = memmem(s + prev, n - prev, st->pat, st->pat_len))) {
            size_t at = (size_t)(hit - s);
            HP_TRY(toks_extend(out, s + prev, at - prev));
            HP_TRY(toks_extend(out, st->text, st->text_len));
            prev = at + st->pat_len;
        }
    }
    return toks_extend(out, s + prev, n - prev);
}

/* One decoder step from `in` to `out`. */
static hp_status_t dec_step(hp_tokenizer_t t, const hp_tok_dec_step_t *st, const toks_t *in,
                            toks_t *out, hp_tok_match_t **m, size_t *m_cap) {
    out->n = 0;
    out->text.len = 0;
    switch (st->kind) {
    case HP_TOK_DEC_BYTELEVEL: {
        /* Every token's characters back to bytes (a token with a character outside the
         * byte alphabet stays as its UTF-8), all joined, then lossy UTF-8: one token. */
        hp_tok_buf_t raw = {0};
        hp_status_t s = HP_OK;
        for (size_t i = 0; i < in->n && s == HP_OK; i++) {
            const char *p = in->text.p + in->off[i];
            size_t n = in->len[i], k = 0, start = raw.len;
            while (k < n && s == HP_OK) {
                uint32_t cp;
                int l = hp_tok_utf8_get(p + k, n - k, &cp);
                if (l <= 0 || cp >= 512 || t->cp_byte[cp] < 0) break;
                char b = (char)t->cp_byte[cp];
                s = hp_tok_buf_add(&raw, &b, 1);
                k += (size_t)l;
            }
            if (s == HP_OK && k < n) {
                raw.len = start;
                s = hp_tok_buf_add(&raw, p, n);
            }
        }
        if (s == HP_OK) s = toks_push(out, "", 0);
        if (s == HP_OK && raw.len) {
            s = add_lossy(&out->text, raw.p, raw.len);
            out->len[0] = out->text.len;
        }
        free(raw.p);
        return s;
    }
    case HP_TOK_DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++)
            HP_TRY(replace_into(st, in->text.p + in->off[i], in->len[i], out, m, m_cap));
        return HP_OK;
    case HP_TOK_DEC_BYTEFALLBACK: {
        /* Runs of <0xXX> tokens become their bytes when those are UTF-8, else one U+FFFD per
         * byte; other tokens pass. */
        size_t run = 0;
        hp_tok_buf_t bytes = {0};
        hp_status_t s = HP_OK;
        for (size_t i = 0; i <= in->n && s == HP_OK; i++) {
            int b = i < in->n ? fallback_byte(in->text.p + in->off[i], in->len[i]) : -1;
            if (b >= 0) {
                char c = (char)b;
                s = hp_tok_buf_add(&bytes, &c, 1);
                run++;
                continue;
            }
            if (run) {
                if (hp_tok_utf8_check(bytes.p, bytes.len) == bytes.len) {
                    s = toks_push(out, bytes.p, bytes.len);
                } else {
                    for (size_t k = 0; k < run && s == HP_OK; k++) s = toks_push(out, "\xEF\xBF\xBD", 3);
                }
                run = 0;
                bytes.len = 0;
            }
            if (i < in->n && s == HP_OK) s = toks_push(out, in->text.p + in->off[i], in->len[i]);
        }
        free(bytes.p);
        return s;
    }
    case HP_TOK_DEC_FUSE:
        HP_TRY(toks_push(out, "", 0));
        for (size_t i = 0; i < in->n; i++) HP_TRY(toks_extend(out, in->text.p + in->off[i], in->len[i]));
        return HP_OK;
    case HP_TOK_DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *p = in->text.p + in->off[i];
            size_t a = 0, b = in->len[i];
            uint32_t cp;
            int l;
            for (int k = 0; k < st->start && a < b && (l = hp_tok_utf8_get(p + a, b - a, &cp)) > 0 && cp == st->ch; k++)
                a += (size_t)l;
            for (int k = 0; k < st->stop && b > a; k++) {
                size_t q = b - 1;
                while (q > a && ((unsigned char)p[q] & 0xC0) == 0x80) q--;
                if (hp_tok_utf8_get(p + q, b - q, &cp) <= 0 || cp != st->ch) break;
                b = q;
            }
            HP_TRY(toks_push(out, p + a, b - a));
        }
        return HP_OK;
    case HP_TOK_DEC_METASPACE:
        /* The replacement becomes a space; in the first token it is dropped (HF drops every
         * one there, not only the leading one) unless prepend_scheme is "never". */
        for (size_t i = 0; i < in->n; i++) {
            const char *p = in->text.p + in->off[i];
            size_t n = in->len[i], k = 0, prev = 0;
            HP_TRY(toks_push(out, "", 0));
            while (k < n) {
                uint32_t cp;
                int l = hp_tok_utf8_get(p + k, n - k, &cp);
                if (l <= 0) l = 1, cp = 0xFFFD;
                if (cp == st->ch) {
                    HP_TRY(toks_extend(out, p + prev, k - prev));
                    if (!(i == 0 && st->prepend)) HP_TRY(toks_extend(out, " ", 1));
                    prev = k + (size_t)l;
                }
                k += (size_t)l;
            }
            HP_TRY(toks_extend(out, p + prev, n - prev));
        }
        return HP_OK;
    }
    return HP_OK;
}

hp_status_t hp_tok_token_stream_bytes(hp_tokenizer_t t, const char *s, size_t n, char **out,
                                      size_t *out_len) {
    /* The decoders that act on each token alone; ByteFallback gives the raw byte (a caller
     * streaming output buffers bytes until the UTF-8 is complete), Fuse and Strip (which
     * depend on the neighbours) are left out. */
    hp_tok_buf_t cur = {0};
    HP_TRY(hp_tok_buf_add(&cur, s, n));
    hp_status_t st = HP_OK;
    for (int k = 0; k < t->n_dec_steps && st == HP_OK; k++) {
        const hp_tok_dec_step_t *d = &t->dec_steps[k];
        int fb;
        if (d->kind == HP_TOK_DEC_BYTEFALLBACK && (fb = fallback_byte(cur.p, cur.len)) >= 0) {
            cur.p[0] = (char)fb;
            cur.len = 1;
        } else if (d->kind == HP_TOK_DEC_REPLACE || d->kind == HP_TOK_DEC_METASPACE ||
                   d->kind == HP_TOK_DEC_BYTELEVEL) {
            toks_t in = {0}, o = {0};
            hp_tok_match_t *m = NULL;
            size_t m_cap = 0;
            st = toks_push(&in, cur.p, cur.len);
            if (st == HP_OK && d->kind == HP_TOK_DEC_METASPACE) {
                /* on its own a token is not the first one: its replacement is a space */
                hp_tok_dec_step_t d2 = *d;
                d2.prepend = 0;
                st = dec_step(t, &d2, &in, &o, &m, &m_cap);
            } else if (st == HP_OK && d->kind == HP_TOK_DEC_BYTELEVEL) {
                /* bytes without the lossy step */
                hp_tok_buf_t raw = {0};
                size_t k2 = 0;
                while (k2 < cur.len && st == HP_OK) {
                    uint32_t cp;
                    int l = hp_tok_utf8_get(cur.p + k2, cur.len - k2, &cp);
                    if (l <= 0 || cp >= 512 || t->cp_byte[cp] < 0) break;
                    char b = (char)t->cp_byte[cp];
                    st = hp_tok_buf_add(&raw, &b, 1);
                    k2 += (size_t)l;
                }
                if (st == HP_OK && k2 == cur.len) {
                    cur.len = 0;
                    st = hp_tok_buf_add(&cur, raw.p ? raw.p : "", raw.len);
                }
                free(raw.p);
                toks_free(&in);
                continue;
            } else if (st == HP_OK) {
                st = dec_step(t, d, &in, &o, &m, &m_cap);
            }
            if (st == HP_OK) {
                cur.len = 0;
                st = hp_tok_buf_add(&cur, o.text.p ? o.text.p : "", o.text.len);
            }
            free(m);
            toks_free(&in);
            toks_free(&o);
        }
    }
    if (st != HP_OK) {
        free(cur.p);
        return st;
    }
    if (!cur.p) st = hp_tok_buf_add(&cur, "", 0);
    *out = cur.p;
    *out_len = cur.len;
    return st;
}

hp_status_t hp_tokenizer_decode(hp_tokenizer_t t, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *text_len) {
    *text = NULL;
    if (text_len) *text_len = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->spelling[id])
            return hp_error(HP_ERR_INVALID_ARG,
                            "%s: decode: id %d at position %zu is not in the vocabulary (size %d)",
                            t->name, id, i, t->n_ids);
    }
    int skip = (flags & HP_DETOKENIZE_SKIP_SPECIAL) != 0;
    hp_tok_buf_t res = {0};
    hp_status_t st = HP_OK;
    if (t->decoder != HP_TOK_DECODER_CHAIN) {
        /* ByteLevel alone: the bytes of every token, lossy UTF-8 (precomputed per id). No
         * decoder: the spellings joined by spaces, as HF. */
        hp_tok_buf_t raw = {0};
        size_t kept = 0;
        for (size_t i = 0; i < n && st == HP_OK; i++) {
            int32_t id = ids[i];
            if (skip && t->special[id]) continue;
            if (t->decoder == HP_TOK_DECODER_NONE) {
                if (kept++) st = hp_tok_buf_add(&raw, " ", 1);
                if (st == HP_OK) st = hp_tok_buf_add(&raw, t->spelling[id], t->spelling_len[id]);
            } else {
                st = hp_tok_buf_add(&raw, t->dec[id], t->dec_len[id]);
            }
        }
        if (st == HP_OK) st = add_lossy(&res, raw.p ? raw.p : "", raw.len);
        free(raw.p);
    } else {
        toks_t a = {0}, b = {0};
        hp_tok_match_t *m = NULL;
        size_t m_cap = 0;
        for (size_t i = 0; i < n && st == HP_OK; i++)
            if (!(skip && t->special[ids[i]])) st = toks_push(&a, t->spelling[ids[i]], t->spelling_len[ids[i]]);
        for (int k = 0; k < t->n_dec_steps && st == HP_OK; k++) {
            st = dec_step(t, &t->dec_steps[k], &a, &b, &m, &m_cap);
            toks_t tmp = a;
            a = b;
            b = tmp;
        }
        for (size_t i = 0; i < a.n && st == HP_OK; i++) st = add_lossy(&res, a.text.p + a.off[i], a.len[i]);
        free(m);
        toks_free(&a);
        toks_free(&b);
    }
    if (st == HP_OK && !res.p) st = hp_tok_buf_add(&res, "", 0);
    if (st != HP_OK) {
        free(res.p);
        return st;
    }
    *text = res.p;
    if (text_len) *text_len = res.len;
    return HP_OK;
}
