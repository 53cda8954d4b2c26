/* Unicode 16.0 character classes for the tokenizer's PCRE2 regexes: HF's Oniguruma knows
 * Unicode 16.0, Debian 12's PCRE2 14.0. A \p{..} is rewritten as PCRE2's own class plus
 * the code points PCRE2 classifies differently (measured once per process), or, for a PCRE2
 * this cannot be measured for, as explicit 16.0 ranges. docs/tokenizer.md. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/tokenizer-impl.h"

int hp_tok_gc_of(uint32_t cp) {
    if (cp >= 0x110000) return HP_TOK_GC_Cn;
    size_t lo = 0, hi = hp_tok_gc16_len; /* last entry with start <= cp */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((hp_tok_gc16[mid] >> 5) <= cp) lo = mid;
        else hi = mid;
    }
    return (int)(hp_tok_gc16[lo] & 31);
}

hp_status_t hp_tok_buf_add(hp_tok_buf_t *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return hp_error(HP_ERR_OOM, "tokenizer: cannot grow a buffer to %zu bytes", cap);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n); /* s may be NULL when n is 0 */
    b->len += n;
    b->p[b->len] = 0;
    return HP_OK;
}

static hp_status_t buf_str(hp_tok_buf_t *b, const char *s) { return hp_tok_buf_add(b, s, strlen(s)); }

/* ---- what PCRE2 thinks of the code points whose category changed ------------------------ */

static const char *const gc_names[HP_TOK_GC_COUNT] = {
    "Cc", "Cf", "Cn", "Co", "Cs", "Ll", "Lm", "Lo", "Lt", "Lu", "Mc", "Me", "Mn", "Nd", "Nl",
    "No", "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "Sc", "Sk", "Sm", "So", "Zl", "Zp", "Zs"};

static pthread_once_t calib_once = PTHREAD_ONCE_INIT;
static int calib_ok;              /* PCRE2's categories of the unstable code points are known */
static uint8_t *calib_cat;        /* (n unstable code points,) PCRE2's category, in table order */
static uint8_t *calib_cat16;      /* (n unstable code points,) the 16.0 category */
static size_t calib_n;
static char calib_version[64];
static hp_tok_unicode_mode_t forced_mode = HP_TOK_UNICODE_AUTO;

/* Only a PCRE2 whose tables are Unicode 14.0 to 16.0 can differ from 16.0 just at the code
 * points of hp_tok_gc_unstable (the generator took the differences of 14.0 and 15.0). */
static int version_in_range(const char *v) {
    int major = 0, minor = 0;
    if (sscanf(v, "%d.%d", &major, &minor) != 2) return 0;
    int x = major * 100 + minor;
    return x >= 1400 && x <= 1600;
}

static void calibrate(void) {
    if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, calib_version) < 0) return;
    if (!version_in_range(calib_version)) return;
    /* One regex with one group per category tells PCRE2's category of a code point. */
    char pat[HP_TOK_GC_COUNT * 12 + 16];
    size_t o = (size_t)snprintf(pat, sizeof(pat), "^(?:");
    for (int g = 0; g < HP_TOK_GC_COUNT; g++)
        o += (size_t)snprintf(pat + o, sizeof(pat) - o, "%s(\\p{%s})", g ? "|" : "", gc_names[g]);
    snprintf(pat + o, sizeof(pat) - o, ")");
    int err;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &err, &eo, NULL);
    if (!re) return;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    size_t n = 0;
    for (size_t i = 0; i < hp_tok_gc_unstable_len; i++)
        n += hp_tok_gc_unstable[i][1] - hp_tok_gc_unstable[i][0] + 1;
    uint8_t *cat = malloc(n ? n : 1), *cat16 = malloc(n ? n : 1);
    int ok = md && cat && cat16;
    size_t k = 0;
    for (size_t i = 0; ok && i < hp_tok_gc_unstable_len; i++) {
        for (uint32_t cp = hp_tok_gc_unstable[i][0]; ok && cp <= hp_tok_gc_unstable[i][1]; cp++) {
            char u[4];
            int l = hp_tok_utf8_put(cp, u);
            int rc = pcre2_match(re, (PCRE2_SPTR)u, (size_t)l, 0, 0, md, NULL);
            ok = rc >= 2; /* group rc-1 matched: category rc-2 */
            if (ok) cat16[k] = (uint8_t)hp_tok_gc_of(cp), cat[k++] = (uint8_t)(rc - 2);
        }
    }
    if (md) pcre2_match_data_free(md);
    pcre2_code_free(re);
    if (!ok) {
        free(cat);
        free(cat16);
        return;
    }
    calib_cat = cat; /* kept for the process */
    calib_cat16 = cat16;
    calib_n = n;
    calib_ok = 1;
}

hp_tok_unicode_mode_t hp_tok_unicode_set_mode(hp_tok_unicode_mode_t mode) {
    pthread_once(&calib_once, calibrate);
    forced_mode = mode;
    if (mode == HP_TOK_UNICODE_EXPLICIT || !calib_ok) return HP_TOK_UNICODE_EXPLICIT;
    return HP_TOK_UNICODE_DELTA;
}

/* ---- class text ----------------------------------------------------------------------- */

static hp_status_t add_range(hp_tok_buf_t *b, uint32_t lo, uint32_t hi) {
    char s[32];
    int n = lo == hi ? snprintf(s, sizeof(s), "\\x{%X}", lo) : snprintf(s, sizeof(s), "\\x{%X}-\\x{%X}", lo, hi);
    return hp_tok_buf_add(b, s, (size_t)n);
}

/* Ranges of the code points (surrogates excluded) whose 16.0 category is in mask (or not). */
static hp_status_t add_explicit(hp_tok_buf_t *b, uint32_t mask, int negate) {
    uint32_t start = 0;
    int open = 0;
    for (size_t i = 0; i <= hp_tok_gc16_len; i++) {
        uint32_t cp = i < hp_tok_gc16_len ? hp_tok_gc16[i] >> 5 : 0x110000;
        int in = i < hp_tok_gc16_len && ((mask >> (hp_tok_gc16[i] & 31)) & 1) != (uint32_t)negate;
        if (i < hp_tok_gc16_len && (hp_tok_gc16[i] & 31) == HP_TOK_GC_Cs) in = 0;
        if (open && !in) {
            HP_TRY(add_range(b, start, cp - 1));
            open = 0;
        } else if (!open && in) {
            start = cp;
            open = 1;
        }
    }
    return HP_OK;
}

/* \p{..} names covering mask, whole groups where possible (\p{L} rather than five). */
static hp_status_t add_names(hp_tok_buf_t *b, uint32_t mask) {
    static const struct { const char *name; int lo, hi; } groups[] = {
        {"C", HP_TOK_GC_Cc, HP_TOK_GC_Cs}, {"L", HP_TOK_GC_Ll, HP_TOK_GC_Lu},
        {"M", HP_TOK_GC_Mc, HP_TOK_GC_Mn}, {"N", HP_TOK_GC_Nd, HP_TOK_GC_No},
        {"P", HP_TOK_GC_Pc, HP_TOK_GC_Ps}, {"S", HP_TOK_GC_Sc, HP_TOK_GC_So},
        {"Z", HP_TOK_GC_Zl, HP_TOK_GC_Zs}};
    for (size_t k = 0; k < sizeof(groups) / sizeof(groups[0]); k++) {
        uint32_t gm = ((1u << (groups[k].hi + 1)) - 1) & ~((1u << groups[k].lo) - 1);
        char s[16];
        if ((mask & gm) == gm) {
            snprintf(s, sizeof(s), "\\p{%s}", groups[k].name);
            HP_TRY(buf_str(b, s));
            continue;
        }
        for (int g = groups[k].lo; g <= groups[k].hi; g++)
            if ((mask >> g) & 1) {
                snprintf(s, sizeof(s), "\\p{%s}", gc_names[g]);
                HP_TRY(buf_str(b, s));
            }
    }
    return HP_OK;
}

/* Code points of the unstable list that 16.0 puts in mask but PCRE2 does not (which = 0),
 * or that PCRE2 puts in mask but 16.0 does not (which = 1), as ranges. */
static hp_status_t add_delta(hp_tok_buf_t *b, uint32_t mask, int which, int *any) {
    size_t k = 0;
    uint32_t start = 0, prev = 0;
    int open = 0;
    *any = 0;
    for (size_t i = 0; i < hp_tok_gc_unstable_len; i++) {
        for (uint32_t cp = hp_tok_gc_unstable[i][0]; cp <= hp_tok_gc_unstable[i][1]; cp++, k++) {
            int in16 = (mask >> calib_cat16[k]) & 1, inp = (mask >> calib_cat[k]) & 1;
            int in = which == 0 ? in16 && !inp : inp && !in16;
            if (in && open && cp == prev + 1) {
                prev = cp;
                continue;
            }
            if (open) HP_TRY(add_range(b, start, prev));
            open = in;
            start = prev = cp;
            if (in) *any = 1;
        }
    }
    if (open) HP_TRY(add_range(b, start, prev));
    return HP_OK;
}

hp_status_t hp_tok_unicode_class(hp_tok_buf_t *out, uint32_t mask, int negate, int in_class) {
    pthread_once(&calib_once, calibrate);
    int delta = calib_ok && forced_mode != HP_TOK_UNICODE_EXPLICIT;
    if (!delta || (in_class && negate)) {
        /* A complement cannot be written inside a class as PCRE2's class minus a list. */
        if (!in_class) HP_TRY(buf_str(out, "["));
        HP_TRY(add_explicit(out, mask, negate));
        return in_class ? HP_OK : buf_str(out, "]");
    }
    hp_tok_buf_t add = {0}, rem = {0};
    int any_add, any_rem;
    hp_status_t st = add_delta(&add, mask, 0, &any_add);
    if (st == HP_OK) st = add_delta(&rem, mask, 1, &any_rem);
    if (st != HP_OK) goto done;
    if (any_rem) {
        /* PCRE2's class holds code points 16.0 does not (a category change, e.g. Mn -> Mc):
         * explicit ranges, which keep the atom one class (a lookahead group would make each
         * repetition a backtracking frame). */
        if (!in_class && (st = buf_str(out, "["))) goto done;
        if ((st = add_explicit(out, mask, negate))) goto done;
        if (!in_class) st = buf_str(out, "]");
        goto done;
    }
    /* [names added] or [^names added]; in a class, names and added only */
    if (!in_class && (st = buf_str(out, negate ? "[^" : "["))) goto done;
    if ((st = add_names(out, mask))) goto done;
    if (any_add && (st = hp_tok_buf_add(out, add.p, add.len))) goto done;
    if (!in_class) st = buf_str(out, "]");
done:
    free(add.p);
    free(rem.p);
    return st;
}

uint32_t hp_tok_gc_mask_of_name(const char *name, size_t len) {
    char n[40];
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (c == ' ' || c == '_' || c == '-') continue;
        if (k + 1 >= sizeof(n)) return 0;
        n[k++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
    }
    n[k] = 0;
#define B(g) (1u << HP_TOK_GC_##g)
    static const struct { const char *name; uint32_t mask; } names[] = {
        {"l", B(Lu) | B(Ll) | B(Lt) | B(Lm) | B(Lo)}, {"letter", B(Lu) | B(Ll) | B(Lt) | B(Lm) | B(Lo)},
        {"lc", B(Lu) | B(Ll) | B(Lt)}, {"l&", B(Lu) | B(Ll) | B(Lt)}, {"casedletter", B(Lu) | B(Ll) | B(Lt)},
        {"lu", B(Lu)}, {"uppercaseletter", B(Lu)}, {"ll", B(Ll)}, {"lowercaseletter", B(Ll)},
        {"lt", B(Lt)}, {"titlecaseletter", B(Lt)}, {"lm", B(Lm)}, {"modifierletter", B(Lm)},
        {"lo", B(Lo)}, {"otherletter", B(Lo)},
        {"m", B(Mn) | B(Mc) | B(Me)}, {"mark", B(Mn) | B(Mc) | B(Me)}, {"combiningmark", B(Mn) | B(Mc) | B(Me)},
        {"mn", B(Mn)}, {"nonspacingmark", B(Mn)}, {"mc", B(Mc)}, {"spacingmark", B(Mc)},
        {"me", B(Me)}, {"enclosingmark", B(Me)},
        {"n", B(Nd) | B(Nl) | B(No)}, {"number", B(Nd) | B(Nl) | B(No)},
        {"nd", B(Nd)}, {"decimalnumber", B(Nd)}, {"nl", B(Nl)}, {"letternumber", B(Nl)},
        {"no", B(No)}, {"othernumber", B(No)},
        {"p", B(Pc) | B(Pd) | B(Ps) | B(Pe) | B(Pi) | B(Pf) | B(Po)},
        {"punctuation", B(Pc) | B(Pd) | B(Ps) | B(Pe) | B(Pi) | B(Pf) | B(Po)},
        {"pc", B(Pc)}, {"connectorpunctuation", B(Pc)}, {"pd", B(Pd)}, {"dashpunctuation", B(Pd)},
        {"ps", B(Ps)}, {"openpunctuation", B(Ps)}, {"pe", B(Pe)}, {"closepunctuation", B(Pe)},
        {"pi", B(Pi)}, {"initialpunctuation", B(Pi)}, {"pf", B(Pf)}, {"finalpunctuation", B(Pf)},
        {"po", B(Po)}, {"otherpunctuation", B(Po)},
        {"s", B(Sm) | B(Sc) | B(Sk) | B(So)}, {"symbol", B(Sm) | B(Sc) | B(Sk) | B(So)},
        {"sm", B(Sm)}, {"mathsymbol", B(Sm)}, {"sc", B(Sc)}, {"currencysymbol", B(Sc)},
        {"sk", B(Sk)}, {"modifiersymbol", B(Sk)}, {"so", B(So)}, {"othersymbol", B(So)},
        {"z", B(Zs) | B(Zl) | B(Zp)}, {"separator", B(Zs) | B(Zl) | B(Zp)},
        {"zs", B(Zs)}, {"spaceseparator", B(Zs)}, {"zl", B(Zl)}, {"lineseparator", B(Zl)},
        {"zp", B(Zp)}, {"paragraphseparator", B(Zp)},
        {"c", B(Cc) | B(Cf) | B(Cs) | B(Co) | B(Cn)}, {"other", B(Cc) | B(Cf) | B(Cs) | B(Co) | B(Cn)},
        {"cc", B(Cc)}, {"control", B(Cc)}, {"cf", B(Cf)}, {"format", B(Cf)},
        {"cs", B(Cs)}, {"surrogate", B(Cs)}, {"co", B(Co)}, {"privateuse", B(Co)},
        {"cn", B(Cn)}, {"unassigned", B(Cn)},
    };
#undef B
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(n, names[i].name) == 0) return names[i].mask;
    return 0;
}
