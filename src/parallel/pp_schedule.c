/* Pipeline schedules as data (docs/pp.md): PyTorch's pipelining action IR (parse, format),
 * per-rank action lists with bubbles, their CSV form and the grid of _format_pipeline_order,
 * plus the strings and action map that pp_generate.c, pp_lower.c and pp_simulate.c share.
 * Semantics: torch/distributed/pipelining/schedules.py. */
#include "hyperparallel/pp_schedule.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hyperparallel/file.h"
#include "pp_schedule-impl.h"

static const char *const type_names[HP_PP_TYPE_COUNT] = {
    [HP_PP_F] = "F", [HP_PP_I] = "I", [HP_PP_W] = "W", [HP_PP_B] = "B",
    [HP_PP_UNSHARD] = "UNSHARD", [HP_PP_RESHARD] = "RESHARD",
    [HP_PP_SEND_F] = "SEND_F", [HP_PP_RECV_F] = "RECV_F", [HP_PP_SEND_B] = "SEND_B", [HP_PP_RECV_B] = "RECV_B",
    [HP_PP_REDUCE_GRAD] = "REDUCE_GRAD", [HP_PP_OVERLAP_F_B] = "OVERLAP_F_B",
    [HP_PP_MPIPE_F] = "MPIPE_F", [HP_PP_MPIPE_SEND_F] = "MPIPE_SEND_F", [HP_PP_MPIPE_RECV_F] = "MPIPE_RECV_F",
    [HP_PP_TRANSPOSE_F] = "TRANSPOSE_F", [HP_PP_TRANSPOSE_B] = "TRANSPOSE_B",
};

const char *hp_pp_type_name(hp_pp_type_t type) {
    return (int)type >= 0 && type < HP_PP_TYPE_COUNT ? type_names[type] : NULL;
}

int hp_pp_type_is_compute(hp_pp_type_t t) {
    return t == HP_PP_F || t == HP_PP_I || t == HP_PP_W || t == HP_PP_B || t == HP_PP_OVERLAP_F_B ||
           t == HP_PP_MPIPE_F || t == HP_PP_TRANSPOSE_F || t == HP_PP_TRANSPOSE_B;
}

/* MPipe: stage 0's TRANSPOSE_F / TRANSPOSE_B are its F / B for every rule about the stage's
 * order and its neighbours (validation, counts, readiness of stage 1, sends); their own extra
 * input is checked where it matters. MPIPE_F / MPIPE_SEND_F name stage 0 but run on a helping
 * rank's replica, which is not stage 0: they own no stage. */
static hp_pp_type_t base_type(hp_pp_type_t t) {
    return t == HP_PP_TRANSPOSE_F ? HP_PP_F : t == HP_PP_TRANSPOSE_B ? HP_PP_B : t;
}
/* hp_pp_action_leaves with TRANSPOSE_F / TRANSPOSE_B read as F / B. */
int hp_pps_base_leaves(const hp_pp_action_t *a, hp_pp_action_t out[2]) {
    const int n = hp_pp_action_leaves(a, out);
    for (int k = 0; k < n; k++) out[k].type = base_type(out[k].type);
    return n;
}

int hp_pp_action_leaves(const hp_pp_action_t *a, hp_pp_action_t out[2]) {
    if (a->type != HP_PP_OVERLAP_F_B) {
        out[0] = *a;
        return 1;
    }
    out[0] = (hp_pp_action_t){a->stage, HP_PP_F, a->mb, 0, 0};
    out[1] = (hp_pp_action_t){a->sub_stage, HP_PP_B, a->sub_mb, 0, 0};
    return 2;
}

static int type_has_mb(hp_pp_type_t t) { return t != HP_PP_UNSHARD && t != HP_PP_RESHARD && t != HP_PP_REDUCE_GRAD; }

/* ---- growing strings ------------------------------------------------------------------- */

void hp_pps_sb_putn(sb_t *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
void hp_pps_sb_puts(sb_t *b, const char *s) { hp_pps_sb_putn(b, s, strlen(s)); }
static void sb_pad(sb_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) hp_pps_sb_putn(b, " ", 1);
}
void hp_pps_sb_printf(sb_t *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    hp_pps_sb_putn(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}
/* Hands the text to the caller (never NULL on success). */
hp_status_t hp_pps_sb_finish(sb_t *b, char **out) {
    if (!b->oom && !b->p) hp_pps_sb_putn(b, "", 0);
    if (b->oom) {
        free(b->p);
        return hp_error(HP_ERR_OOM, "pp schedule: out of memory building a text of %zu bytes", b->n);
    }
    *out = b->p;
    return HP_OK;
}

/* ---- a set / map of actions: open addressing over a packed 60-bit key ------------------ */

static uint64_t mix64(uint64_t x) {   /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}
void hp_pps_amap_free(amap_t *m) {
    free(m->keys);
    free(m->vals);
    free(m->used);
    memset(m, 0, sizeof *m);
}
static size_t amap_slot(const amap_t *m, uint64_t k) {
    size_t i = (size_t)mix64(k) & (m->cap - 1);
    while (m->used[i] && m->keys[i] != k) i = (i + 1) & (m->cap - 1);
    return i;
}
static int amap_grow(amap_t *m) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    amap_t g = {calloc(cap, sizeof *g.keys), calloc(cap, sizeof *g.vals), calloc(cap, 1), cap, 0};
    if (!g.keys || !g.vals || !g.used) {
        hp_pps_amap_free(&g);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->used[i]) {
            size_t j = amap_slot(&g, m->keys[i]);
            g.used[j] = 1, g.keys[j] = m->keys[i], g.vals[j] = m->vals[i], g.n++;
        }
    hp_pps_amap_free(m);
    *m = g;
    return 0;
}
/* Sets key -> val; returns 1 when the key is new, 0 when it was there, -1 out of memory. */
int hp_pps_amap_put(amap_t *m, uint64_t k, int64_t val) {
    if ((m->n + 1) * 2 > m->cap && amap_grow(m) != 0) return -1;
    size_t i = amap_slot(m, k);
    int fresh = !m->used[i];
    m->used[i] = 1, m->keys[i] = k, m->vals[i] = val;
    m->n += (size_t)fresh;
    return fresh;
}
int hp_pps_amap_get(const amap_t *m, uint64_t k, int64_t *val) {
    if (!m->cap) return 0;
    size_t i = amap_slot(m, k);
    if (!m->used[i]) return 0;
    if (val) *val = m->vals[i];
    return 1;
}
int hp_pps_amap_has(const amap_t *m, int32_t stage, int type, int32_t mb) { return hp_pps_amap_get(m, akey(stage, type, mb), NULL); }

hp_status_t hp_pps_oom(const char *what) { return hp_error(HP_ERR_OOM, "%s: out of memory", what); }

/* ---- actions ------------------------------------------------------------------------------ */
int hp_pp_action_format(const hp_pp_action_t *a, char *buf, size_t cap) {
    const char *t = hp_pp_type_name(a->type);
    if (a->type == HP_PP_OVERLAP_F_B)
        return snprintf(buf, cap, "(%dF%d;%dB%d)OVERLAP_F_B", (int)a->stage, (int)a->mb, (int)a->sub_stage,
                        (int)a->sub_mb);
    if (!t) return snprintf(buf, cap, "%d?%d", (int)a->stage, (int)a->mb);
    if (a->mb == HP_PP_NO_MB) return snprintf(buf, cap, "%d%s", (int)a->stage, t);
    return snprintf(buf, cap, "%d%s%d", (int)a->stage, t, (int)a->mb);
}

const char *hp_pps_act_str(const hp_pp_action_t *a, char *buf, size_t cap) {
    hp_pp_action_format(a, buf, cap);
    return buf;
}

#define PP_ACTION_HINT \
    "expected {stage}{TYPE}{microbatch} such as 1F0, 2I1, 0W3, 0B3, 2SEND_B2, 1RECV_F1, 1UNSHARD or 0REDUCE_GRAD, " \
    "TYPE one of F I W B UNSHARD RESHARD REDUCE_GRAD SEND_F RECV_F SEND_B RECV_B (MPipe: MPIPE_F MPIPE_SEND_F " \
    "MPIPE_RECV_F TRANSPOSE_F TRANSPOSE_B)"

static hp_status_t check_action(const hp_pp_action_t *a, const char *what) {
    if ((int)a->type < 0 || a->type >= HP_PP_TYPE_COUNT)
        return hp_error(HP_ERR_INVALID_ARG, "%s: action type %d is not an hp_pp_type_t", what, (int)a->type);
    if (a->stage < 0 || a->stage > HP_PP_MAX_STAGE)
        return hp_error(HP_ERR_INVALID_ARG, "%s: stage %d outside [0, %d]", what, (int)a->stage, HP_PP_MAX_STAGE);
    if (type_has_mb(a->type) && (a->mb < 0 || a->mb > HP_PP_MAX_MB))
        return hp_error(HP_ERR_INVALID_ARG, "%s: %s needs a microbatch in [0, %d], got %d", what, type_names[a->type],
                        HP_PP_MAX_MB, (int)a->mb);
    if (!type_has_mb(a->type) && a->mb != HP_PP_NO_MB)
        return hp_error(HP_ERR_INVALID_ARG, "%s: %s takes no microbatch (HP_PP_NO_MB), got %d", what,
                        type_names[a->type], (int)a->mb);
    if (a->type == HP_PP_OVERLAP_F_B &&
        (a->sub_stage < 0 || a->sub_stage > HP_PP_MAX_STAGE || a->sub_mb < 0 || a->sub_mb > HP_PP_MAX_MB))
        return hp_error(HP_ERR_INVALID_ARG, "%s: OVERLAP_F_B's backward (stage %d, microbatch %d) is outside [0, %d] x "
                        "[0, %d]", what, (int)a->sub_stage, (int)a->sub_mb, HP_PP_MAX_STAGE, HP_PP_MAX_MB);
    return HP_OK;
}

/* Reads the decimal digits at *p (at least one) into [0, max]; -1 when there are none, -2 when
 * the value is larger than max. */
static int64_t read_uint(const char **p, int64_t max) {
    const char *s = *p;
    int64_t v = 0;
    int big = 0;
    while (*s >= '0' && *s <= '9') {
        if (!big) v = v * 10 + (*s - '0');
        if (v > max) big = 1;
        s++;
    }
    if (s == *p) return -1;
    *p = s;
    return big ? -2 : v;
}

/* "(aF m;bB k)OVERLAP_F_B": PyTorch's sub-action form, with exactly an F and then a B. */
static hp_status_t parse_overlap(const char *text, size_t len, const char *what, const char *t, hp_pp_action_t *out) {
    static const char tail[] = ")OVERLAP_F_B";
    const size_t tl = sizeof tail - 1;
    const char *semi = memchr(text, ';', len);
    if (len < tl + 2 || memcmp(text + len - tl, tail, tl) != 0 || !semi)
        return hp_error(HP_ERR_INVALID_ARG, "%s '%s' is not a pipeline action: a '(' starts an overlapped pair, "
                        "expected '(F;B)OVERLAP_F_B' such as '(0F7;7B3)OVERLAP_F_B'", what, t);
    char part[2][64];
    const char *p0 = text + 1, *p1 = semi + 1;
    const size_t n0 = (size_t)(semi - p0), n1 = (size_t)(text + len - tl - p1);
    if (n0 >= sizeof part[0] || n1 >= sizeof part[1])
        return hp_error(HP_ERR_INVALID_ARG, "%s '%s': a sub-action is too long", what, t);
    memcpy(part[0], p0, n0);
    part[0][n0] = 0;
    memcpy(part[1], p1, n1);
    part[1][n1] = 0;
    hp_pp_action_t f, b;
    HP_TRY(hp_pp_action_parse(part[0], what, &f, NULL));
    HP_TRY(hp_pp_action_parse(part[1], what, &b, NULL));
    if (f.type != HP_PP_F || b.type != HP_PP_B)
        return hp_error(HP_ERR_INVALID_ARG, "%s '%s': OVERLAP_F_B overlaps a forward and a full backward, got %s and "
                        "%s; write '(sF m;tB k)OVERLAP_F_B'", what, t, type_names[f.type], type_names[b.type]);
    *out = (hp_pp_action_t){f.stage, HP_PP_OVERLAP_F_B, f.mb, b.stage, b.mb};
    return HP_OK;
}

hp_status_t hp_pp_action_parse(const char *text, const char *what, hp_pp_action_t *out, int *is_bubble) {
    if (!what) what = "action";
    if (!text) return hp_error(HP_ERR_INVALID_ARG, "%s: NULL text", what);
    while (isspace((unsigned char)*text)) text++;
    size_t len = strlen(text);
    while (len && isspace((unsigned char)text[len - 1])) len--;
    if (is_bubble) *is_bubble = 0;
    if (len == 0) {
        if (!is_bubble) return hp_error(HP_ERR_INVALID_ARG, "%s: empty text is a bubble (None), not an action", what);
        *is_bubble = 1;
        return HP_OK;
    }
    char t[96];   /* the trimmed text, shown in messages */
    snprintf(t, sizeof t, "%.*s%s", (int)(len < 80 ? len : 80), text, len > 80 ? "..." : "");
    if (text[0] == '(') return parse_overlap(text, len, what, t, out);
    const char *p = text, *end = text + len;
    int64_t stage = read_uint(&p, HP_PP_MAX_STAGE);
    if (stage == -1) return hp_error(HP_ERR_INVALID_ARG, "%s '%s' is not a pipeline action: %s", what, t, PP_ACTION_HINT);
    if (stage == -2)
        return hp_error(HP_ERR_INVALID_ARG, "%s '%s': stage index exceeds %d (HP_PP_MAX_STAGE)", what, t, HP_PP_MAX_STAGE);
    /* longest names first; no name is a prefix of another of the same first letter otherwise */
    static const hp_pp_type_t order[] = {HP_PP_MPIPE_SEND_F, HP_PP_MPIPE_RECV_F, HP_PP_MPIPE_F, HP_PP_TRANSPOSE_F,
                                         HP_PP_TRANSPOSE_B, HP_PP_REDUCE_GRAD, HP_PP_UNSHARD, HP_PP_RESHARD, HP_PP_SEND_F, HP_PP_RECV_F,
                                         HP_PP_SEND_B,      HP_PP_RECV_B,  HP_PP_F,       HP_PP_I,      HP_PP_B,
                                         HP_PP_W};
    int type = -1;
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
        size_t n = strlen(type_names[order[k]]);
        if ((size_t)(end - p) >= n && strncmp(p, type_names[order[k]], n) == 0) {
            type = (int)order[k];
            p += n;
            break;
        }
    }
    if (type < 0)
        return hp_error(HP_ERR_INVALID_ARG, "%s '%s' is not a pipeline action: '%.*s' after the stage is not an action "
                        "type; %s", what, t, (int)(end - p < 40 ? end - p : 40), p, PP_ACTION_HINT);
    int64_t mb = HP_PP_NO_MB;
    if (p < end && *p >= '0' && *p <= '9') {
        mb = read_uint(&p, HP_PP_MAX_MB);
        if (mb == -2)
            return hp_error(HP_ERR_INVALID_ARG, "%s '%s': microbatch index exceeds %d (HP_PP_MAX_MB: at most 2^20 "
                            "microbatches per step); hint: number the microbatches of one step from 0", what, t,
                            HP_PP_MAX_MB);
    }
    if (p != end)
        return hp_error(HP_ERR_INVALID_ARG, "%s '%s' is not a pipeline action: unexpected '%.*s' after '%.*s'; %s", what,
                        t, (int)(end - p < 40 ? end - p : 40), p, (int)(p - text), text, PP_ACTION_HINT);
    if (type_has_mb((hp_pp_type_t)type) && mb == HP_PP_NO_MB)
        return hp_error(HP_ERR_INVALID_ARG, "%s '%s': %s needs a microbatch index, e.g. '%d%s0'", what, t,
                        type_names[type], (int)stage, type_names[type]);
    if (!type_has_mb((hp_pp_type_t)type) && mb != HP_PP_NO_MB)
        return hp_error(HP_ERR_INVALID_ARG, "%s '%s': %s takes no microbatch index; write '%d%s'", what, t,
                        type_names[type], (int)stage, type_names[type]);
    out->stage = (int32_t)stage;
    out->type = (hp_pp_type_t)type;
    out->mb = (int32_t)mb;
    return HP_OK;
}

/* ---- schedules ---------------------------------------------------------------------------- */


hp_status_t hp_pp_schedule_create(int n_ranks, hp_pp_schedule_t **out) {
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_schedule_create: NULL out");
    *out = NULL;
    if (n_ranks < 1 || n_ranks > PP_MAX_RANKS)
        return hp_error(HP_ERR_INVALID_ARG, "pp schedule: n_ranks %d outside [1, %d]", n_ranks, PP_MAX_RANKS);
    hp_pp_schedule_t *s = hp_calloc(1, sizeof *s);
    if (!s) return HP_ERR_OOM;
    s->rows = hp_calloc((size_t)n_ranks, sizeof *s->rows);
    if (!s->rows) {
        free(s);
        return HP_ERR_OOM;
    }
    s->n_ranks = n_ranks;
    *out = s;
    return HP_OK;
}

void hp_pp_schedule_free(hp_pp_schedule_t *s) {
    if (!s) return;
    for (int r = 0; r < s->n_ranks; r++) free(s->rows[r].a);
    free(s->rows);
    free(s);
}

int hp_pp_schedule_n_ranks(const hp_pp_schedule_t *s) { return s ? s->n_ranks : 0; }
int hp_pp_schedule_len(const hp_pp_schedule_t *s, int rank) {
    return s && rank >= 0 && rank < s->n_ranks ? s->rows[rank].len : 0;
}
const hp_pp_action_t *hp_pp_schedule_at(const hp_pp_schedule_t *s, int rank, int i) {
    if (!s || rank < 0 || rank >= s->n_ranks || i < 0 || i >= s->rows[rank].len) return NULL;
    const hp_pp_action_t *a = &s->rows[rank].a[i];
    return is_bubble(a) ? NULL : a;
}

/* Appends without checks (internal: actions already valid). */
hp_status_t hp_pps_row_push(pp_row_t *row, const hp_pp_action_t *a) {
    if (row->len == row->cap) {
        if (row->cap >= (1 << 28)) return hp_error(HP_ERR_INVALID_ARG, "pp schedule: more than 2^28 slots on one rank");
        int cap = row->cap ? row->cap * 2 : 16;
        hp_pp_action_t *p = realloc(row->a, (size_t)cap * sizeof *p);
        if (!p) return hp_pps_oom("pp schedule");
        row->a = p;
        row->cap = cap;
    }
    static const hp_pp_action_t bubble = {-1, PP_BUBBLE, HP_PP_NO_MB, 0, 0};
    row->a[row->len++] = a ? *a : bubble;
    return HP_OK;
}
hp_status_t hp_pps_push(hp_pp_schedule_t *s, int rank, int32_t stage, hp_pp_type_t type, int32_t mb) {
    hp_pp_action_t a = {stage, type, mb, 0, 0};
    return hp_pps_row_push(&s->rows[rank], &a);
}

hp_status_t hp_pp_schedule_append(hp_pp_schedule_t *s, int rank, const hp_pp_action_t *a) {
    if (!s || rank < 0 || rank >= s->n_ranks)
        return hp_error(HP_ERR_INVALID_ARG, "hp_pp_schedule_append: rank %d outside [0, %d)", rank, s ? s->n_ranks : 0);
    if (a) HP_TRY(check_action(a, "hp_pp_schedule_append"));
    return hp_pps_row_push(&s->rows[rank], a);
}

hp_status_t hp_pp_schedule_append_text(hp_pp_schedule_t *s, int rank, const char *text) {
    if (!s || rank < 0 || rank >= s->n_ranks)
        return hp_error(HP_ERR_INVALID_ARG, "hp_pp_schedule_append_text: rank %d outside [0, %d)", rank,
                        s ? s->n_ranks : 0);
    const char *p = text;
    int comma = strchr(text, ',') != NULL;
    for (int k = 0; *p || comma; k++) {
        const char *q = p;
        if (comma) {
            while (*q && *q != ',') q++;
        } else {
            while (*p == ' ' || *p == '\t' || *p == '\n') p++;
            if (!*p) break;
            q = p;
            while (*q && *q != ' ' && *q != '\t' && *q != '\n') q++;
        }
        char cell[128];
        snprintf(cell, sizeof cell, "%.*s", (int)(q - p < 127 ? q - p : 127), p);
        char what[64];
        snprintf(what, sizeof what, "rank %d, item %d", rank, k);
        if (!comma && strcmp(cell, "_") == 0) {
            HP_TRY(hp_pps_row_push(&s->rows[rank], NULL));
        } else {
            hp_pp_action_t a;
            int bub;
            HP_TRY(hp_pp_action_parse(cell, what, &a, &bub));
            HP_TRY(hp_pps_row_push(&s->rows[rank], bub ? NULL : &a));
        }
        if (comma && !*q) break;
        p = *q ? q + 1 : q;
    }
    return HP_OK;
}

hp_status_t hp_pp_schedule_copy(const hp_pp_schedule_t *s, hp_pp_schedule_t **out) {
    HP_TRY(hp_pp_schedule_create(s->n_ranks, out));
    for (int r = 0; r < s->n_ranks; r++)
        for (int i = 0; i < s->rows[r].len; i++) {
            hp_status_t st = hp_pps_row_push(&(*out)->rows[r], &s->rows[r].a[i]);
            if (st != HP_OK) {
                hp_pp_schedule_free(*out);
                *out = NULL;
                return st;
            }
        }
    return HP_OK;
}

int64_t hp_pp_schedule_count(const hp_pp_schedule_t *s) {
    int64_t n = 0;
    for (int r = 0; s && r < s->n_ranks; r++)
        for (int i = 0; i < s->rows[r].len; i++) n += !is_bubble(&s->rows[r].a[i]);
    return n;
}

int hp_pp_schedule_equal(const hp_pp_schedule_t *a, const hp_pp_schedule_t *b) {
    if (!a || !b || a->n_ranks != b->n_ranks) return 0;
    for (int r = 0; r < a->n_ranks; r++) {
        if (a->rows[r].len != b->rows[r].len) return 0;
        for (int i = 0; i < a->rows[r].len; i++) {
            const hp_pp_action_t *x = &a->rows[r].a[i], *y = &b->rows[r].a[i];
            if (is_bubble(x) != is_bubble(y)) return 0;
            if (!is_bubble(x) && (x->stage != y->stage || x->type != y->type || x->mb != y->mb)) return 0;
            if (!is_bubble(x) && x->type == HP_PP_OVERLAP_F_B && (x->sub_stage != y->sub_stage || x->sub_mb != y->sub_mb))
                return 0;
        }
    }
    return 1;
}

/* ---- CSV ---------------------------------------------------------------------------------- */
hp_status_t hp_pp_schedule_to_csv(const hp_pp_schedule_t *s, char **out) {
    sb_t b = {0};
    for (int r = 0; r < s->n_ranks; r++) {
        const pp_row_t *row = &s->rows[r];
        if (row->len == 1 && is_bubble(&row->a[0])) {
            hp_pps_sb_puts(&b, "\"\"");   /* csv.writer quotes a lone empty field so the row is not blank */
        } else {
            for (int i = 0; i < row->len; i++) {
                char t[64];
                if (i) hp_pps_sb_putn(&b, ",", 1);
                if (!is_bubble(&row->a[i])) hp_pps_sb_puts(&b, hp_pps_act_str(&row->a[i], t, sizeof t));
            }
        }
        hp_pps_sb_puts(&b, "\r\n");
    }
    return hp_pps_sb_finish(&b, out);
}

hp_status_t hp_pp_schedule_from_csv(const char *text, const char *what, hp_pp_schedule_t **out) {
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_schedule_from_csv: NULL out");
    *out = NULL;
    if (!what) what = "csv";
    /* count rows: a final line without "\n" is a row; nothing after the last "\n" is not */
    int rows = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        rows++;
        if (!nl) break;
        p = nl + 1;
    }
    if (rows == 0)
        return hp_error(HP_ERR_FORMAT, "%s: no rows; expected one row of actions per pipeline rank (PyTorch's "
                        "_dump_csv format)", what);
    hp_pp_schedule_t *s;
    HP_TRY(hp_pp_schedule_create(rows, &s));
    const char *p = text;
    hp_status_t st = HP_OK;
    for (int r = 0; r < rows && st == HP_OK; r++) {
        const char *eol = strchr(p, '\n');
        if (!eol) eol = p + strlen(p);
        const char *le = eol;
        if (le > p && le[-1] == '\r') le--;
        if (le > p) {   /* a blank line is a rank with no actions */
            const char *c = p;
            for (int k = 1; st == HP_OK; k++) {
                char cell[128];
                size_t n = 0;
                int overlong = 0;
                if (c < le && *c == '"') {   /* quoted cell, "" is a quote */
                    c++;
                    for (;;) {
                        if (c >= le) {
                            st = hp_error(HP_ERR_FORMAT, "%s:%d: cell %d: unterminated quoted cell", what, r + 1, k);
                            break;
                        }
                        if (*c == '"') {
                            if (c + 1 < le && c[1] == '"') {
                                c++;
                            } else {
                                c++;
                                break;
                            }
                        }
                        if (n + 1 < sizeof cell) cell[n++] = *c;
                        else overlong = 1;
                        c++;
                    }
                    if (st != HP_OK) break;
                    if (c < le && *c != ',') {
                        st = hp_error(HP_ERR_FORMAT, "%s:%d: cell %d: text after the closing quote", what, r + 1, k);
                        break;
                    }
                } else {
                    while (c < le && *c != ',') {
                        if (n + 1 < sizeof cell) cell[n++] = *c;
                        else overlong = 1;
                        c++;
                    }
                }
                cell[n] = '\0';
                char where[512];
                snprintf(where, sizeof where, "%s:%d: cell %d:", what, r + 1, k);
                if (overlong) {
                    st = hp_error(HP_ERR_FORMAT, "%s action '%.40s...' is longer than %zu characters; %s", where, cell,
                                  sizeof cell - 1, PP_ACTION_HINT);
                    break;
                }
                hp_pp_action_t a;
                int bub;
                st = hp_pp_action_parse(cell, where, &a, &bub);
                if (st == HP_ERR_INVALID_ARG) st = HP_ERR_FORMAT;
                if (st == HP_OK) st = hp_pps_row_push(&s->rows[r], bub ? NULL : &a);
                if (c >= le) break;
                c++;   /* the comma */
            }
        }
        p = *eol ? eol + 1 : eol;
    }
    if (st != HP_OK) {
        hp_pp_schedule_free(s);
        return st;
    }
    *out = s;
    return HP_OK;
}

hp_status_t hp_pp_schedule_save_csv(const hp_pp_schedule_t *s, const char *path) {
    char *text;
    HP_TRY(hp_pp_schedule_to_csv(s, &text));
    hp_status_t st = hp_file_write_atomic(path, text, strlen(text));
    free(text);
    if (st != HP_OK) return hp_error_prefix(st, "writing the schedule CSV: ");
    return HP_OK;
}

hp_status_t hp_pp_schedule_load_csv(const char *path, hp_pp_schedule_t **out) {
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_schedule_load_csv: NULL out");
    *out = NULL;
    char *text;
    size_t n;
    HP_TRY(hp_file_read_all(path, "schedule CSV", (size_t)1 << 30, &text, &n));
    hp_status_t st = memchr(text, '\0', n)
                         ? hp_error(HP_ERR_FORMAT, "%s: a NUL byte; not a schedule CSV (text, one row per rank)", path)
                         : hp_pp_schedule_from_csv(text, path, out);
    free(text);
    return st;
}

/* ---- the grid (_format_pipeline_order) ------------------------------------------------------ */
static int max_len(const hp_pp_schedule_t *s) {
    int n = 0;
    for (int r = 0; r < s->n_ranks; r++) n = s->rows[r].len > n ? s->rows[r].len : n;
    return n;
}

/* Rows [lo, hi] of the grid of s (widths over the whole schedule). */
static void grid_rows(sb_t *b, const hp_pp_schedule_t *s, int error_step, int lo, int hi) {
    int steps = max_len(s);
    char t[64];
    int digits = snprintf(t, sizeof t, "%d", steps > 0 ? steps - 1 : 0);
    size_t label = 5 + (size_t)digits;   /* "Step " + zero-filled number */
    /* PyTorch's column k is as wide as the longer of the step label and rank k's actions */
    size_t *w = calloc((size_t)s->n_ranks, sizeof *w);
    if (!w) {
        b->oom = 1;
        return;
    }
    for (int r = 0; r < s->n_ranks; r++) {
        w[r] = label;
        for (int i = 0; i < s->rows[r].len; i++)
            if (!is_bubble(&s->rows[r].a[i])) {
                size_t l = (size_t)hp_pp_action_format(&s->rows[r].a[i], t, sizeof t);
                if (l > w[r]) w[r] = l;
            }
    }
    if (lo == 0) {
        sb_pad(b, label + 2);
        for (int r = 0; r < s->n_ranks; r++) {
            int l = snprintf(t, sizeof t, "Rank %d", r);
            if (r) hp_pps_sb_putn(b, " ", 1);
            hp_pps_sb_puts(b, t);
            if ((size_t)l < w[r]) sb_pad(b, w[r] - (size_t)l);
        }
        hp_pps_sb_putn(b, "\n", 1);
    }
    for (int i = lo; i <= hi && i < steps; i++) {
        hp_pps_sb_printf(b, "Step %0*d: ", digits, i);
        for (int r = 0; r < s->n_ranks; r++) {
            size_t l = 0;
            if (r) hp_pps_sb_putn(b, " ", 1);
            if (i < s->rows[r].len && !is_bubble(&s->rows[r].a[i])) {
                l = (size_t)hp_pp_action_format(&s->rows[r].a[i], t, sizeof t);
                hp_pps_sb_puts(b, t);
            }
            if (l < w[r]) sb_pad(b, w[r] - l);
        }
        if (i == error_step) hp_pps_sb_puts(b, " <-- ERROR HERE");
        hp_pps_sb_putn(b, "\n", 1);
    }
    free(w);
}

hp_status_t hp_pp_format_grid(const hp_pp_schedule_t *s, int error_step, char **out) {
    sb_t b = {0};
    grid_rows(&b, s, error_step, 0, max_len(s) - 1);
    return hp_pps_sb_finish(&b, out);
}

/* An hp_error message: `head`, then "\n\nFull pipeline schedule:\n" and the grid, or the rows
 * around error_step when the whole grid would not fit the message. */
hp_status_t hp_pps_error_with_grid(const hp_pp_schedule_t *s, int error_step, const char *head) {
    sb_t g = {0};
    grid_rows(&g, s, error_step, 0, max_len(s) - 1);
    if (!g.oom && g.n + strlen(head) < 1800) {
        hp_status_t st = hp_error(HP_ERR_INVALID_ARG, "%s\n\nFull pipeline schedule:\n%s", head, g.p);
        free(g.p);
        return st;
    }
    free(g.p);
    sb_t w = {0};
    int steps = max_len(s), lo = error_step - 3 < 0 ? 0 : error_step - 3, hi = error_step + 3;
    sb_t hdr = {0};
    grid_rows(&hdr, s, -1, 0, -1);   /* header line only */
    grid_rows(&w, s, error_step, lo, hi);
    hp_status_t st = hp_error(HP_ERR_INVALID_ARG,
                              "%s\n\nFull pipeline schedule (steps %d..%d of %d; hp_pp_format_grid prints all):\n%s%s",
                              head, lo, hi < steps ? hi : steps - 1, steps, hdr.p ? hdr.p : "", w.p ? w.p : "");
    free(hdr.p);
    free(w.p);
    return st;
}
