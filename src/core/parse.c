/* Number parsing with range checks, the float32 representability check, edit distance and the
 * unknown-flag message with its suggestion: the helpers every layer and tool parses input with. */
#include "hyperparallel/parse.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HINT_FMT "%s%s"
#define HINT_ARG(h) ((h) && *(h) ? "; hint: " : ""), ((h) && *(h) ? (h) : "")

/* Only spaces may follow the digits; the text must hold at least one digit. */
static int tail_ok(const char *text, const char *end) {
    if (end == text) return 0;
    while (*end == ' ' || *end == '\t') end++;
    return *end == '\0';
}

hp_status_t hp_parse_i64(const char *what, const char *text, int64_t min, int64_t max, const char *hint,
                         int64_t *out) {
    if (!text) text = "";
    errno = 0;
    char *end = NULL;
    long long v = strtoll(text, &end, 10);
    int range_err = errno == ERANGE;
    if (!tail_ok(text, end))
        return hp_error(HP_ERR_INVALID_ARG, "%s expects an integer, got '%s'" HINT_FMT, what, text,
                        HINT_ARG(hint ? hint : "write a plain decimal integer, e.g. 16"));
    if (range_err || v < min || v > max)
        return hp_error(HP_ERR_INVALID_ARG, "%s expects an integer in [%lld, %lld], got '%s'" HINT_FMT, what,
                        (long long)min, (long long)max, text, HINT_ARG(hint));
    *out = (int64_t)v;
    return HP_OK;
}

hp_status_t hp_parse_i32(const char *what, const char *text, int32_t min, int32_t max, const char *hint,
                         int32_t *out) {
    int64_t v;
    HP_TRY(hp_parse_i64(what, text, min, max, hint, &v));
    *out = (int32_t)v;
    return HP_OK;
}

hp_status_t hp_parse_u64(const char *what, const char *text, uint64_t max, const char *hint, uint64_t *out) {
    if (!text) text = "";
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;   /* strtoull would skip them too, and then accept a '-' */
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(p, &end, 10);
    int range_err = errno == ERANGE;
    if (*p == '-' || *p == '+' || !tail_ok(p, end))
        return hp_error(HP_ERR_INVALID_ARG, "%s expects a non-negative integer, got '%s'" HINT_FMT, what, text,
                        HINT_ARG(hint ? hint : "write a plain decimal integer, e.g. 16"));
    if (range_err || v > max)
        return hp_error(HP_ERR_INVALID_ARG, "%s expects an integer in [0, %llu], got '%s'" HINT_FMT, what,
                        (unsigned long long)max, text, HINT_ARG(hint));
    *out = (uint64_t)v;
    return HP_OK;
}

hp_status_t hp_parse_f64(const char *what, const char *text, double min, double max, const char *hint,
                         double *out) {
    if (!text) text = "";
    errno = 0;
    char *end = NULL;
    double v = strtod(text, &end);
    int range_err = errno == ERANGE;
    if (!tail_ok(text, end) || isnan(v))
        return hp_error(HP_ERR_INVALID_ARG, "%s expects a finite number, got '%s'" HINT_FMT, what, text,
                        HINT_ARG(hint ? hint : "write a decimal number, e.g. 0.001 or 1e-3"));
    if (isinf(v) || range_err)
        return hp_error(HP_ERR_INVALID_ARG, "%s expects a finite number, got '%s' (it %s a double)" HINT_FMT, what,
                        text, fabs(v) > 1.0 ? "overflows" : "underflows", HINT_ARG(hint));
    if (v < min || v > max)
        return hp_error(HP_ERR_INVALID_ARG, "%s expects a number in [%g, %g], got '%s'" HINT_FMT, what, min, max,
                        text, HINT_ARG(hint));
    *out = v;
    return HP_OK;
}

hp_status_t hp_check_f32(const char *what, double v) {
    if (!isfinite(v) || fabs(v) > FLT_MAX)
        return hp_error(HP_ERR_INVALID_ARG, "%s = %g is not representable in float32 (largest %g), where it is used; "
                        "hint: use a smaller value", what, v, (double)FLT_MAX);
    if (v != 0.0 && fabs(v) < FLT_MIN)
        return hp_error(HP_ERR_INVALID_ARG, "%s = %g underflows float32, where it is used (smallest normal %g; it "
                        "would become 0 or lose precision); hint: use a value >= %g", what, v, (double)FLT_MIN,
                        (double)FLT_MIN);
    return HP_OK;
}

hp_status_t hp_parse_f32(const char *what, const char *text, double min, double max, const char *hint,
                         float *out) {
    double v;
    HP_TRY(hp_parse_f64(what, text, min, max, hint, &v));
    HP_TRY(hp_check_f32(what, v));
    *out = (float)v;
    return HP_OK;
}

hp_status_t hp_check_i64(const char *what, int64_t v, int64_t min, int64_t max, const char *hint) {
    if (v < min || v > max)
        return hp_error(HP_ERR_INVALID_ARG, "%s = %lld is out of range: expected an integer in [%lld, %lld]" HINT_FMT,
                        what, (long long)v, (long long)min, (long long)max, HINT_ARG(hint));
    return HP_OK;
}

size_t hp_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    size_t row[256];
    if (lb >= 255) lb = 255;
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = (tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1])) ? 0 : 1;
            size_t best = diag + cost;
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *hp_nearest_name(const char *s, const char *const *candidates, size_t n) {
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        size_t d = hp_edit_distance(s, candidates[i]);
        if (d < best_d) {
            best_d = d;
            best = candidates[i];
        }
    }
    size_t len = strlen(s), limit = len / 3 > 3 ? len / 3 : 3;
    return best_d <= limit ? best : NULL;
}

hp_status_t hp_flag_unknown_error(const char *tool, const char *arg, const char *const *known, size_t n) {
    char name[256];
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    if (len >= sizeof name) len = sizeof name - 1;
    memcpy(name, arg, len);
    name[len] = '\0';
    char list[1024];
    size_t used = 0;
    list[0] = '\0';
    for (size_t i = 0; i < n && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", known[i]);
    const char *near = hp_nearest_name(name, known, n);
    if (near)
        return hp_error(HP_ERR_INVALID_ARG, "%s: unknown option '%s'; did you mean '%s'? (options: %s)", tool, name,
                        near, list);
    return hp_error(HP_ERR_INVALID_ARG, "%s: unknown option '%s' (options: %s)", tool, name, list);
}

int hp_flag_value(const char *tool, int argc, char **argv, int *i, const char *name, const char **value) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *value = a + n + 1;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        hp_error(HP_ERR_INVALID_ARG, "%s: option '%s' needs a value (%s VALUE or %s=VALUE)", tool, name, name, name);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}
