/* HF normalizers: NFC / NFD / NFKC / NFKD through utf8proc, limited to what HF's Unicode 9.0
 * tables know; Replace (String or Regex), Prepend and Strip. A text that needs nothing (all
 * of it already normalized) is not copied. docs/tokenizer.md, "Normalizers". */
#define _GNU_SOURCE /* memmem */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "train/tokenizer-impl.h"

void hp_tok_normalizer_free(hp_tok_normalizer_t *nz) {
    for (int i = 0; i < nz->n_steps; i++) {
        free(nz->steps[i].pat);
        free(nz->steps[i].text);
        hp_tok_regex_free(&nz->steps[i].re);
    }
    free(nz->steps);
    free(nz->buf[0].p);
    free(nz->buf[1].p);
    free(nz->u32);
    free(nz->m);
    memset(nz, 0, sizeof(*nz));
}

/* utf8proc on one run that holds no barrier, appended to dst. */
static hp_status_t nf_run(hp_tok_normalizer_t *nz, utf8proc_option_t opt, const char *s, size_t n,
                          hp_tok_buf_t *dst) {
    for (;;) {
        utf8proc_ssize_t k = utf8proc_decompose_custom((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n,
                                                       nz->u32, (utf8proc_ssize_t)nz->u32_cap, opt,
                                                       NULL, NULL);
        if (k < 0)
            return hp_error(HP_ERR_INVALID_ARG, "tokenizer normalizer: utf8proc: %s",
                            utf8proc_errmsg(k));
        if ((size_t)k <= nz->u32_cap) {
            /* utf8proc_reencode composes (with UTF8PROC_COMPOSE) and writes UTF-8 in place. */
            utf8proc_ssize_t bytes = utf8proc_reencode(nz->u32, k, opt);
            if (bytes < 0)
                return hp_error(HP_ERR_INVALID_ARG, "tokenizer normalizer: utf8proc: %s",
                                utf8proc_errmsg(bytes));
            return hp_tok_buf_add(dst, (const char *)nz->u32, (size_t)bytes);
        }
        size_t cap = nz->u32_cap ? nz->u32_cap : 256;
        while (cap < (size_t)k) cap *= 2;
        int32_t *p = realloc(nz->u32, cap * sizeof(int32_t));
        if (!p) return hp_error(HP_ERR_OOM, "tokenizer normalizer: cannot allocate %zu code points", cap);
        nz->u32 = p;
        nz->u32_cap = cap;
    }
}

/* Unicode normalization as HF does it with Unicode 9.0 tables. Runs of characters that are
 * already normalized starters ("safe") are copied; each run between them goes to utf8proc
 * together with the safe starter before it (a mark may compose onto it). A character newer
 * than 9.0 is a barrier: HF leaves it as it is and nothing combines across it, so it ends a
 * run and is copied. */
static hp_status_t unicode_nf(hp_tok_normalizer_t *nz, hp_tok_norm_kind_t kind, const char *s,
                              size_t n, hp_tok_buf_t *dst, int *changed) {
    static const unsigned safe_bit[4] = {HP_TOK_NF_SAFE_NFC, HP_TOK_NF_SAFE_NFD,
                                         HP_TOK_NF_SAFE_NFKC, HP_TOK_NF_SAFE_NFKD};
    static const utf8proc_option_t opts[4] = {
        UTF8PROC_STABLE | UTF8PROC_COMPOSE, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
    unsigned safe = safe_bit[kind];
    size_t copied = 0, i = 0, last_safe = SIZE_MAX; /* start of the last safe starter */
    *changed = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) { /* ASCII is safe in every form */
            last_safe = i++;
            continue;
        }
        uint32_t cp;
        int l = hp_tok_utf8_get(s + i, n - i, &cp);
        if (l <= 0) return hp_error(HP_ERR_INVALID_ARG, "tokenizer normalizer: invalid UTF-8 at byte %zu", i);
        unsigned f = hp_tok_nf_flags(cp);
        if (f & (safe | HP_TOK_NF_BARRIER)) {
            last_safe = (f & safe) ? i : SIZE_MAX;
            i += (size_t)l;
            continue;
        }
        /* A run that needs normalizing: from the safe starter before it (if adjacent) to the
         * next safe character or barrier. */
        size_t run = last_safe != SIZE_MAX && last_safe >= copied ? last_safe : i;
        size_t end = i + (size_t)l;
        while (end < n) {
            uint32_t c2;
            int l2 = hp_tok_utf8_get(s + end, n - end, &c2);
            if (l2 <= 0) return hp_error(HP_ERR_INVALID_ARG, "tokenizer normalizer: invalid UTF-8 at byte %zu", end);
            if (hp_tok_nf_flags(c2) & (safe | HP_TOK_NF_BARRIER)) break;
            end += (size_t)l2;
        }
        if (!*changed) dst->len = 0;
        *changed = 1;
        HP_TRY(hp_tok_buf_add(dst, s + copied, run - copied));
        HP_TRY(nf_run(nz, opts[kind], s + run, end - run, dst));
        copied = i = end;
        last_safe = SIZE_MAX;
    }
    if (*changed) HP_TRY(hp_tok_buf_add(dst, s + copied, n - copied));
    return HP_OK;
}

/* Replace every match of a String or Regex pattern by the content (HF NormalizedString::replace). */
static hp_status_t replace(hp_tok_normalizer_t *nz, const hp_tok_norm_step_t *st, const char *s,
                           size_t n, hp_tok_buf_t *dst, int *changed) {
    size_t nm = 0;
    *changed = 0;
    if (st->is_regex) {
        HP_TRY(hp_tok_regex_find_all((hp_tok_regex_t *)&st->re, s, n, &nz->m, &nz->m_cap, &nm));
    } else if (st->pat_len > 0) {
        for (size_t p = 0; p + st->pat_len <= n;) {
            const char *hit = memmem(s + p, n - p, st->pat, st->pat_len);
            if (!hit) break;
            if (nm == nz->m_cap) {
                size_t c = nz->m_cap ? nz->m_cap * 2 : 64;
                hp_tok_match_t *q = realloc(nz->m, c * sizeof(*q));
                if (!q) return hp_error(HP_ERR_OOM, "tokenizer normalizer: out of memory");
                nz->m = q;
                nz->m_cap = c;
            }
            size_t at = (size_t)(hit - s);
            nz->m[nm++] = (hp_tok_match_t){at, at + st->pat_len};
            p = at + st->pat_len;
        }
    }
    if (nm == 0) return HP_OK;
    *changed = 1;
    dst->len = 0;
    size_t prev = 0;
    for (size_t k = 0; k < nm; k++) {
        HP_TRY(hp_tok_buf_add(dst, s + prev, nz->m[k].start - prev));
        HP_TRY(hp_tok_buf_add(dst, st->text, st->text_len));
        prev = nz->m[k].end;
    }
    return hp_tok_buf_add(dst, s + prev, n - prev);
}

hp_status_t hp_tok_normalize(hp_tok_normalizer_t *nz, const char *s, size_t n, const char **out,
                             size_t *out_len, int *moved) {
    const char *cur = s;
    int start_moved = 0;
    size_t cur_len = n;
    int which = 0; /* the scratch buffer the next step writes */
    for (int k = 0; k < nz->n_steps; k++) {
        const hp_tok_norm_step_t *st = &nz->steps[k];
        hp_tok_buf_t *dst = &nz->buf[which];
        int changed = 0;
        switch (st->kind) {
        case HP_TOK_NORM_NFC:
        case HP_TOK_NORM_NFD:
        case HP_TOK_NORM_NFKC:
        case HP_TOK_NORM_NFKD:
            HP_TRY(unicode_nf(nz, st->kind, cur, cur_len, dst, &changed));
            break;
        case HP_TOK_NORM_REPLACE:
            HP_TRY(replace(nz, st, cur, cur_len, dst, &changed));
            /* a match at the start replaced by nothing: the text now starts later */
            if (changed && st->text_len == 0 && nz->m[0].start == 0 && nz->m[0].end > 0) start_moved = 1;
            break;
        case HP_TOK_NORM_PREPEND:
            if (cur_len > 0) { /* HF prepends to non-empty text only */
                dst->len = 0;
                HP_TRY(hp_tok_buf_add(dst, st->text, st->text_len));
                HP_TRY(hp_tok_buf_add(dst, cur, cur_len));
                changed = 1;
            }
            break;
        case HP_TOK_NORM_STRIP: {
            size_t a = 0, b = cur_len;
            uint32_t cp;
            int l;
            while (st->left && a < b && (l = hp_tok_utf8_get(cur + a, b - a, &cp)) > 0 && hp_tok_is_ws(cp))
                a += (size_t)l;
            while (st->right && b > a) {
                size_t q = b - 1;
                while (q > a && ((unsigned char)cur[q] & 0xC0) == 0x80) q--;
                if (hp_tok_utf8_get(cur + q, b - q, &cp) <= 0 || !hp_tok_is_ws(cp)) break;
                b = q;
            }
            if (a > 0) start_moved = 1;
            cur += a; /* a view of the current text: no copy */
            cur_len = b - a;
            break;
        }
        }
        if (changed) {
            cur = dst->p;
            cur_len = dst->len;
            which ^= 1;
        }
    }
    *out = cur;
    *out_len = cur_len;
    if (moved) *moved = start_moved;
    return HP_OK;
}
