/* Pipeline schedule layer (docs/pp.md): PyTorch's pipelining action IR, per-rank action lists,
 * their CSV form, the GPipe / 1F1B / Interleaved1F1B / LoopedBFS generators, the lowering
 * passes, _validate_schedule and the lock-step simulator. Pure logic over small integers; the
 * semantics are those of torch/distributed/pipelining/schedules.py. */
#include "hyperparallel/pp_schedule.h"
#include "hyperparallel/file.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define PP_BUBBLE HP_PP_TYPE_COUNT   /* type of a slot that holds no action */
#define PP_MAX_RANKS (1 << 20)
#define PP_MAX_COMPUTE (1 << 24)     /* generator limit on compute actions in all */

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
static int on_replica(hp_pp_type_t t) { return t == HP_PP_MPIPE_F || t == HP_PP_MPIPE_SEND_F; }
/* hp_pp_action_leaves with TRANSPOSE_F / TRANSPOSE_B read as F / B. */
static int base_leaves(const hp_pp_action_t *a, hp_pp_action_t out[2]) {
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
typedef struct { char *p; size_t n, cap; int oom; } sb_t;

static void sb_putn(sb_t *b, const char *s, size_t n) {
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
static void sb_puts(sb_t *b, const char *s) { sb_putn(b, s, strlen(s)); }
static void sb_pad(sb_t *b, size_t n) {
    for (size_t i = 0; i < n; i++) sb_putn(b, " ", 1);
}
static void sb_printf(sb_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sb_t *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    sb_putn(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}
/* Hands the text to the caller (never NULL on success). */
static hp_status_t sb_finish(sb_t *b, char **out) {
    if (!b->oom && !b->p) sb_putn(b, "", 0);
    if (b->oom) {
        free(b->p);
        return hp_error(HP_ERR_OOM, "pp schedule: out of memory building a text of %zu bytes", b->n);
    }
    *out = b->p;
    return HP_OK;
}

/* ---- a set / map of actions: open addressing over a packed 60-bit key ------------------ */
typedef struct { uint64_t *keys; int64_t *vals; uint8_t *used; size_t cap, n; } amap_t;

static uint64_t akey(int32_t stage, int type, int32_t mb) {
    return ((uint64_t)(uint32_t)stage << 36) | ((uint64_t)(unsigned)type << 32) | (uint32_t)(mb + 1);
}
static uint64_t mix64(uint64_t x) {   /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}
static void amap_free(amap_t *m) {
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
        amap_free(&g);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->used[i]) {
            size_t j = amap_slot(&g, m->keys[i]);
            g.used[j] = 1, g.keys[j] = m->keys[i], g.vals[j] = m->vals[i], g.n++;
        }
    amap_free(m);
    *m = g;
    return 0;
}
/* Sets key -> val; returns 1 when the key is new, 0 when it was there, -1 out of memory. */
static int amap_put(amap_t *m, uint64_t k, int64_t val) {
    if ((m->n + 1) * 2 > m->cap && amap_grow(m) != 0) return -1;
    size_t i = amap_slot(m, k);
    int fresh = !m->used[i];
    m->used[i] = 1, m->keys[i] = k, m->vals[i] = val;
    m->n += (size_t)fresh;
    return fresh;
}
static int amap_get(const amap_t *m, uint64_t k, int64_t *val) {
    if (!m->cap) return 0;
    size_t i = amap_slot(m, k);
    if (!m->used[i]) return 0;
    if (val) *val = m->vals[i];
    return 1;
}
static int amap_has(const amap_t *m, int32_t stage, int type, int32_t mb) { return amap_get(m, akey(stage, type, mb), NULL); }

static hp_status_t oom(const char *what) { return hp_error(HP_ERR_OOM, "%s: out of memory", what); }

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

static const char *act_str(const hp_pp_action_t *a, char *buf, size_t cap) {
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
            return hp_error(HP_ERR_INVALID_ARG, "%s '%s': microbatch index exceeds %d (HP_PP_MAX_MB)", what, t,
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
typedef struct { hp_pp_action_t *a; int len, cap; } pp_row_t;
struct hp_pp_schedule { int n_ranks; pp_row_t *rows; };

static int is_bubble(const hp_pp_action_t *a) { return a->type == PP_BUBBLE; }

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
static hp_status_t row_push(pp_row_t *row, const hp_pp_action_t *a) {
    if (row->len == row->cap) {
        if (row->cap >= (1 << 28)) return hp_error(HP_ERR_INVALID_ARG, "pp schedule: more than 2^28 slots on one rank");
        int cap = row->cap ? row->cap * 2 : 16;
        hp_pp_action_t *p = realloc(row->a, (size_t)cap * sizeof *p);
        if (!p) return oom("pp schedule");
        row->a = p;
        row->cap = cap;
    }
    static const hp_pp_action_t bubble = {-1, PP_BUBBLE, HP_PP_NO_MB, 0, 0};
    row->a[row->len++] = a ? *a : bubble;
    return HP_OK;
}
static hp_status_t push(hp_pp_schedule_t *s, int rank, int32_t stage, hp_pp_type_t type, int32_t mb) {
    hp_pp_action_t a = {stage, type, mb, 0, 0};
    return row_push(&s->rows[rank], &a);
}

hp_status_t hp_pp_schedule_append(hp_pp_schedule_t *s, int rank, const hp_pp_action_t *a) {
    if (!s || rank < 0 || rank >= s->n_ranks)
        return hp_error(HP_ERR_INVALID_ARG, "hp_pp_schedule_append: rank %d outside [0, %d)", rank, s ? s->n_ranks : 0);
    if (a) HP_TRY(check_action(a, "hp_pp_schedule_append"));
    return row_push(&s->rows[rank], a);
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
            HP_TRY(row_push(&s->rows[rank], NULL));
        } else {
            hp_pp_action_t a;
            int bub;
            HP_TRY(hp_pp_action_parse(cell, what, &a, &bub));
            HP_TRY(row_push(&s->rows[rank], bub ? NULL : &a));
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
            hp_status_t st = row_push(&(*out)->rows[r], &s->rows[r].a[i]);
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
            sb_puts(&b, "\"\"");   /* csv.writer quotes a lone empty field so the row is not blank */
        } else {
            for (int i = 0; i < row->len; i++) {
                char t[64];
                if (i) sb_putn(&b, ",", 1);
                if (!is_bubble(&row->a[i])) sb_puts(&b, act_str(&row->a[i], t, sizeof t));
            }
        }
        sb_puts(&b, "\r\n");
    }
    return sb_finish(&b, out);
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
                if (st == HP_OK) st = row_push(&s->rows[r], bub ? NULL : &a);
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
            if (r) sb_putn(b, " ", 1);
            sb_puts(b, t);
            if ((size_t)l < w[r]) sb_pad(b, w[r] - (size_t)l);
        }
        sb_putn(b, "\n", 1);
    }
    for (int i = lo; i <= hi && i < steps; i++) {
        sb_printf(b, "Step %0*d: ", digits, i);
        for (int r = 0; r < s->n_ranks; r++) {
            size_t l = 0;
            if (r) sb_putn(b, " ", 1);
            if (i < s->rows[r].len && !is_bubble(&s->rows[r].a[i])) {
                l = (size_t)hp_pp_action_format(&s->rows[r].a[i], t, sizeof t);
                sb_puts(b, t);
            }
            if (l < w[r]) sb_pad(b, w[r] - l);
        }
        if (i == error_step) sb_puts(b, " <-- ERROR HERE");
        sb_putn(b, "\n", 1);
    }
    free(w);
}

hp_status_t hp_pp_format_grid(const hp_pp_schedule_t *s, int error_step, char **out) {
    sb_t b = {0};
    grid_rows(&b, s, error_step, 0, max_len(s) - 1);
    return sb_finish(&b, out);
}

/* An hp_error message: `head`, then "\n\nFull pipeline schedule:\n" and the grid, or the rows
 * around error_step when the whole grid would not fit the message. */
static hp_status_t error_with_grid(const hp_pp_schedule_t *s, int error_step, const char *head) {
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

/* ---- stage-to-rank mappings ------------------------------------------------------------------ */
hp_status_t hp_pp_stage_to_rank(hp_pp_style_t style, int pp, int num_stages, int *out) {
    if (pp < 1 || num_stages < 1 || num_stages > HP_PP_MAX_STAGE + 1)
        return hp_error(HP_ERR_INVALID_ARG, "generate_stage_to_rank_mapping: pp %d and num_stages %d must be >= 1 "
                        "(num_stages <= %d)", pp, num_stages, HP_PP_MAX_STAGE + 1);
    if (style == HP_PP_STYLE_LOOP) {
        for (int s = 0; s < num_stages; s++) out[s] = s % pp;
        return HP_OK;
    }
    if (style != HP_PP_STYLE_V) return hp_error(HP_ERR_INVALID_ARG, "generate_stage_to_rank_mapping: unknown style %d", (int)style);
    if (num_stages % pp != 0)
        return hp_error(HP_ERR_INVALID_ARG, "num_stages %d must be evenly divisible by pp_size %d for V schedules",
                        num_stages, pp);
    int r = 0;
    for (int s = 0; s < num_stages; s++) {
        out[s] = r;
        if ((s + 1) % pp == 0) continue;   /* stay on the border rank: the turn of the V */
        r += (s / pp) % 2 == 0 ? 1 : -1;
    }
    return HP_OK;
}

/* ---- generators ------------------------------------------------------------------------------ */
static const char *const kind_names[HP_PP_KIND_COUNT] = {"GPipe",         "1F1B",          "Interleaved1F1B", "LoopedBFS",
                                                         "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV",
                                                         "MPipeTranspose"};

const char *hp_pp_kind_name(hp_pp_kind_t k) { return (int)k >= 0 && k < HP_PP_KIND_COUNT ? kind_names[k] : NULL; }
int hp_pp_kind_is_single_stage(hp_pp_kind_t k) { return k == HP_PP_GPIPE || k == HP_PP_1F1B; }
hp_pp_style_t hp_pp_kind_style(hp_pp_kind_t k) {
    return k == HP_PP_ZBV || k == HP_PP_DUALPIPEV ? HP_PP_STYLE_V : HP_PP_STYLE_LOOP;
}

hp_status_t hp_pp_kind_from_name(const char *name, hp_pp_kind_t *out) {
    static const char *const later[] = {"PipelineScheduleSingle", "PipelineScheduleMulti"};
    for (int k = 0; k < HP_PP_KIND_COUNT; k++)
        if (name && strcasecmp(name, kind_names[k]) == 0) {
            *out = (hp_pp_kind_t)k;
            return HP_OK;
        }
    for (size_t k = 0; name && k < sizeof later / sizeof later[0]; k++)
        if (strcasecmp(name, later[k]) == 0)
            return hp_error(HP_ERR_UNSUPPORTED, "schedule '%s': PyTorch's %s is a base class that generates no order; "
                            "use one of GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, "
                            "DualPipeV, MPipeTranspose, or a CSV (docs/pp.md)", name, later[k]);
    return hp_error(HP_ERR_INVALID_ARG, "Unknown schedule name '%s'. The valid options are ['1F1B', 'Interleaved1F1B', "
                    "'GPipe', 'LoopedBFS', 'InterleavedZeroBubble', 'ZBVZeroBubble', 'DualPipeV', 'MPipeTranspose'] "
                    "(case-insensitive)",
                    name ? name : "(null)");
}

static hp_status_t gen_gpipe(hp_pp_schedule_t *s, int P, int n) {
    for (int r = 0; r < P; r++) {
        for (int i = 0; i < r; i++) HP_TRY(row_push(&s->rows[r], NULL));
        for (int m = 0; m < n; m++) HP_TRY(push(s, r, r, HP_PP_F, m));
        for (int i = 0; i < 3 * (P - 1 - r); i++) HP_TRY(row_push(&s->rows[r], NULL));
        for (int m = 0; m < n; m++) HP_TRY(push(s, r, r, HP_PP_B, m));
    }
    return HP_OK;
}

static hp_status_t gen_1f1b(hp_pp_schedule_t *s, int P, int n) {
    for (int r = 0; r < P; r++) {
        for (int i = 0; i < r; i++) HP_TRY(row_push(&s->rows[r], NULL));
        int warm = P - 1 - r, fwd = 0, bwd = 0;
        for (; fwd < warm; fwd++) HP_TRY(push(s, r, r, HP_PP_F, fwd));
        for (int i = 0; i < 2 * (P - 1 - r); i++) HP_TRY(row_push(&s->rows[r], NULL));
        /* steady: the next forward is `fwd` (PyTorch numbers the last rank's from 1; see the header) */
        for (; fwd < n; fwd++) {
            HP_TRY(push(s, r, r, HP_PP_F, fwd));
            HP_TRY(push(s, r, r, HP_PP_B, bwd++));
        }
        for (; bwd < n; bwd++) {   /* cooldown: each backward after a bubble */
            HP_TRY(row_push(&s->rows[r], NULL));
            HP_TRY(push(s, r, r, HP_PP_B, bwd));
        }
    }
    return HP_OK;
}

/* _get_1f1b_rank_ops with Interleaved1F1B's stage functions; zb: InterleavedZeroBubble's variant
 * (warm-up factor 1, post-warm-up P-1-r bubbles, I for B, no cool-down bubbles, after each
 * backward past the first r the W of the oldest backward; the remaining Ws at the end). wcnt is
 * the per-local-stage W counter (zb only). */
static hp_status_t gen_interleaved(hp_pp_schedule_t *s, int P, int L, int n, int64_t mpr, int zb, int *fcnt, int *bcnt,
                                   int *wcnt) {
    const int64_t nl = (int64_t)n * L;
    const hp_pp_type_t bt = zb ? HP_PP_I : HP_PP_B;
    for (int r = 0; r < P; r++) {
        int64_t warm = (int64_t)(L - 1) * mpr + (zb ? 1 : 2) * (int64_t)(P - 1 - r);
        if (warm > nl) warm = nl;
        const int64_t fwd_bwd = nl - warm, cooldown = nl - fwd_bwd, total = warm + fwd_bwd + cooldown;
        int64_t post = zb ? P - r - 1 : ((int64_t)L * P + 2 * (int64_t)(P - 1 - r)) - (warm + r);
        int64_t wdone = 0;   /* W ops issued: the W of backward op warm + wdone comes next */
        memset(fcnt, 0, (size_t)L * sizeof *fcnt);
        memset(bcnt, 0, (size_t)L * sizeof *bcnt);
        memset(wcnt, 0, (size_t)L * sizeof *wcnt);
#define BWD_LOC(op) (L - 1 - (int)((((op) - warm) / mpr) % L))
        for (int i = 0; i < r; i++) HP_TRY(row_push(&s->rows[r], NULL));
        for (int64_t op = 0; op < total; op++) {
            if (op < warm + fwd_bwd) {   /* warm-up and steady: a forward */
                int loc = (int)((op / mpr) % L);
                HP_TRY(push(s, r, loc * P + r, HP_PP_F, fcnt[loc]++));
                if (op == warm - 1)
                    for (int64_t i = 0; i < post; i++) HP_TRY(row_push(&s->rows[r], NULL));
            } else if (!zb) {   /* cooldown: a bubble to stay aligned with the other ranks' 1F1B */
                HP_TRY(row_push(&s->rows[r], NULL));
            }
            if (op >= warm) {
                int loc = BWD_LOC(op);
                HP_TRY(push(s, r, loc * P + r, bt, bcnt[loc]++));
                if (zb && op - warm >= r) {
                    int wl = BWD_LOC(warm + wdone);
                    HP_TRY(push(s, r, wl * P + r, HP_PP_W, wcnt[wl]++));
                    wdone++;
                }
            }
        }
        for (; zb && wdone < total - warm; wdone++) {
            int wl = BWD_LOC(warm + wdone);
            HP_TRY(push(s, r, wl * P + r, HP_PP_W, wcnt[wl]++));
        }
#undef BWD_LOC
    }
    return HP_OK;
}

/* ScheduleInterleavedZeroBubble._add_bubbles_to_actions: lock-step over the ranks; a rank whose
 * next action is an F of stage s > 0 whose (s-1)F of that microbatch has not run in an earlier
 * round gets a bubble instead (PyTorch's FULL_BACKWARD rule never fires: the list has I, not B);
 * a bubble of the input is kept and passed. */
static hp_status_t add_bubbles(hp_pp_schedule_t **sp) {
    hp_pp_schedule_t *in = *sp, *o;
    const int R = in->n_ranks;
    HP_TRY(hp_pp_schedule_create(R, &o));
    amap_t seen = {0}, fresh = {0};
    int *pos = hp_calloc((size_t)R, sizeof *pos);
    hp_status_t st = pos ? HP_OK : HP_ERR_OOM;
    int64_t total = 0, guard = 0;
    for (int r = 0; r < R; r++) total += in->rows[r].len;
    for (int active = 1; st == HP_OK && active;) {
        active = 0;
        amap_free(&fresh);
        for (int r = 0; r < R && st == HP_OK; r++) {
            if (pos[r] >= in->rows[r].len) continue;
            active = 1;
            const hp_pp_action_t *a = &in->rows[r].a[pos[r]];
            if (is_bubble(a)) {
                pos[r]++;
                st = row_push(&o->rows[r], NULL);
            } else if (a->type == HP_PP_F && a->stage != 0 && !amap_has(&seen, a->stage - 1, HP_PP_F, a->mb)) {
                st = row_push(&o->rows[r], NULL);
            } else {
                pos[r]++;
                st = row_push(&o->rows[r], a);
                if (st == HP_OK && amap_put(&fresh, akey(a->stage, a->type, a->mb), 0) < 0) st = oom("add_bubbles");
            }
        }
        for (size_t i = 0; st == HP_OK && i < fresh.cap; i++)   /* seen |= this round's actions */
            if (fresh.keys && fresh.used[i] && amap_put(&seen, fresh.keys[i], 0) < 0) st = oom("add_bubbles");
        if (st == HP_OK && ++guard > 4 * total + 16)
            st = hp_error(HP_ERR_STATE, "InterleavedZeroBubble: _add_bubbles_to_actions does not terminate");
    }
    amap_free(&seen);
    amap_free(&fresh);
    free(pos);
    if (st != HP_OK) {
        hp_pp_schedule_free(o);
        return st;
    }
    hp_pp_schedule_free(in);
    *sp = o;
    return HP_OK;
}

/* ScheduleZBVZeroBubble._calculate_single_rank_operations (2 stages per rank, V mapping). */
static hp_status_t gen_zbv(hp_pp_schedule_t *s, int P, int n) {
    const int nm = n > 2 * P - 1 ? n : 2 * P - 1, S = 2 * P;
    for (int r = 0; r < P; r++) {
        const int c0 = r, c1 = S - 1 - r;
        int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
        pp_row_t *row = &s->rows[r];
        const int start = row->len;
        for (int i = 0; i < r; i++) HP_TRY(row_push(row, NULL));
        for (int i = 0; i < 2 * (P - r) - 1; i++) HP_TRY(push(s, r, c0, HP_PP_F, f0++));
        for (int i = 0; i < r; i++) {
            HP_TRY(push(s, r, c1, HP_PP_F, f1++));
            HP_TRY(push(s, r, c0, HP_PP_F, f0++));
        }
        for (int i = 0; i < P - r; i++) {
            HP_TRY(push(s, r, c1, HP_PP_F, f1++));
            HP_TRY(push(s, r, c1, HP_PP_I, b1));
            HP_TRY(push(s, r, c1, HP_PP_W, b1++));
        }
        while (f1 < f0 || f0 < nm) {
            if (f0 < nm) HP_TRY(push(s, r, c0, HP_PP_F, f0++));
            HP_TRY(push(s, r, c0, HP_PP_I, b0));
            HP_TRY(push(s, r, c0, HP_PP_W, b0++));
            HP_TRY(push(s, r, c1, HP_PP_F, f1++));
            HP_TRY(push(s, r, c1, HP_PP_I, b1));
            HP_TRY(push(s, r, c1, HP_PP_W, b1++));
        }
        int w0 = b0, w1 = b1;
        for (int i = 0; i < r; i++) {
            HP_TRY(push(s, r, c0, HP_PP_I, b0++));
            HP_TRY(push(s, r, c1, HP_PP_I, b1++));
        }
        for (int i = 0; i < P - r; i++) {
            HP_TRY(push(s, r, c0, HP_PP_I, b0++));
            HP_TRY(push(s, r, c0, HP_PP_W, w0++));
        }
        while (w1 < b1) HP_TRY(push(s, r, c1, HP_PP_W, w1++));
        while (w0 < b0) HP_TRY(push(s, r, c0, HP_PP_W, w0++));
        for (int i = start; i < row->len; i++)   /* the microbatches past n become bubbles */
            if (!is_bubble(&row->a[i]) && row->a[i].mb >= n) row->a[i] = (hp_pp_action_t){-1, PP_BUBBLE, HP_PP_NO_MB, 0, 0};
    }
    return HP_OK;
}

/* ScheduleDualPipeV._calculate_single_rank_operations (2 stages per rank, V mapping, n >= 2P). */
typedef struct {
    hp_pp_schedule_t *s;
    int r, c[2];
    int fcnt[2], icnt[2], wcnt[2];   /* per local stage: next F, next I-or-B, W issued */
    int *wq, wq_head, wq_len;        /* pending W (local stage, mb), capacity 2n */
} dpv_t;

static hp_status_t dpv_act(dpv_t *d, int loc, hp_pp_type_t t) {
    const int stage = d->c[loc];
    if (t == HP_PP_F) return push(d->s, d->r, stage, HP_PP_F, d->fcnt[loc]++);
    const int mb = d->icnt[loc]++;
    if (t == HP_PP_B) d->wcnt[loc]++;
    else d->wq[d->wq_head + d->wq_len++] = loc * (1 << 24) + mb;   /* an I: its W later */
    return push(d->s, d->r, stage, t, mb);
}

static hp_status_t dpv_overlap(dpv_t *d, int floc, int bloc) {
    hp_pp_action_t a = {d->c[floc], HP_PP_OVERLAP_F_B, d->fcnt[floc]++, d->c[bloc], d->icnt[bloc]++};
    d->wcnt[bloc]++;
    return row_push(&d->s->rows[d->r], &a);
}

static hp_status_t dpv_pending_w(dpv_t *d) {
    if (!d->wq_len) return HP_OK;
    const int v = d->wq[d->wq_head++];
    d->wq_len--;
    d->wcnt[v >> 24]++;
    return push(d->s, d->r, d->c[v >> 24], HP_PP_W, v & ((1 << 24) - 1));
}

static hp_status_t gen_dualpipev(hp_pp_schedule_t *s, int P, int n) {
    int *wq = hp_malloc((size_t)(4 * n + 4) * sizeof *wq);
    if (!wq) return oom("DualPipeV");
    hp_status_t st = HP_OK;
    for (int r = 0; r < P && st == HP_OK; r++) {
        dpv_t d = {s, r, {r, 2 * P - 1 - r}, {0, 0}, {0, 0}, {0, 0}, wq, 0, 0};
#define DO(x)                        \
    do {                             \
        if ((st = (x)) != HP_OK) goto done; \
    } while (0)
        for (int i = 0; i < (P - r - 1) * 2; i++) DO(dpv_act(&d, 0, HP_PP_F));   /* 1: F0 */
        for (int i = 0; i < r + 1; i++) {                                         /* 2: F0 F1 */
            DO(dpv_act(&d, 0, HP_PP_F));
            DO(dpv_act(&d, 1, HP_PP_F));
        }
        for (int i = 0; i < P - r - 1; i++) {                                     /* 3: I1 W F1 */
            DO(dpv_act(&d, 1, HP_PP_I));
            DO(dpv_pending_w(&d));
            DO(dpv_act(&d, 1, HP_PP_F));
        }
        for (int i = 0; i < n - 2 * P + r + 1; i++) {                             /* 4: (F0 B1) (F1 B0) */
            if (i == 0 && r == P - 1) {
                DO(dpv_act(&d, 0, HP_PP_F));
                DO(dpv_act(&d, 1, HP_PP_B));
            } else {
                DO(dpv_overlap(&d, 0, 1));
            }
            DO(dpv_overlap(&d, 1, 0));
        }
        for (int i = 0; i < P - r - 1; i++) {                                     /* 5: B1 (F1 B0) */
            DO(dpv_act(&d, 1, HP_PP_B));
            DO(dpv_overlap(&d, 1, 0));
        }
        int zb = 0;
        const int s6 = r + 1;
        for (int i = 0; i < s6; i++) {                                            /* 6: B1 B0, I from the middle */
            if (i == s6 / 2 && r % 2 == 1) zb = 1;
            DO(dpv_act(&d, 1, zb ? HP_PP_I : HP_PP_B));
            if (i == s6 / 2 && r % 2 == 0) zb = 1;
            DO(dpv_act(&d, 0, zb ? HP_PP_I : HP_PP_B));
        }
        for (int i = 0; i < P - r - 1; i++) {                                     /* 7: W B0 */
            DO(dpv_pending_w(&d));
            DO(dpv_act(&d, 0, zb ? HP_PP_I : HP_PP_B));
        }
        for (int i = 0; i < r + 1; i++) DO(dpv_pending_w(&d));                    /* 8: W */
#undef DO
    }
done:
    free(wq);
    return st;
}

/* ScheduleMPipeTranspose over Interleaved1F1B's lists: for mb in 1 .. min(P, n) - 1, rank mb
 * computes the preprocess forward of mb in its first slot (Interleaved1F1B starts rank r with r
 * bubbles) and stage 0 (on rank 0) runs TRANSPOSE_F / TRANSPOSE_B of mb for its F / B. */
static hp_status_t mpipe_transpose(hp_pp_schedule_t *s, int P, int n) {
    const int nt = P < n ? P : n;
    for (int m = 1; m < nt; m++) {
        pp_row_t *row = &s->rows[m];
        if (row->len == 0 || !is_bubble(&row->a[0]))
            return hp_error(HP_ERR_STATE, "MPipeTranspose: rank %d does not start with a bubble", m);
        row->a[0] = (hp_pp_action_t){0, HP_PP_MPIPE_F, m, 0, 0};
        for (int i = 0; i < s->rows[0].len; i++) {
            hp_pp_action_t *a = &s->rows[0].a[i];
            if (is_bubble(a) || a->stage != 0 || a->mb != m) continue;
            if (a->type == HP_PP_F) a->type = HP_PP_TRANSPOSE_F;
            else if (a->type == HP_PP_B) a->type = HP_PP_TRANSPOSE_B;
        }
    }
    return HP_OK;
}

static hp_status_t gen_looped_bfs(hp_pp_schedule_t *s, int P, int L, int n) {
    for (int r = 0; r < P; r++) {
        for (int i = 0; i < r; i++) HP_TRY(row_push(&s->rows[r], NULL));
        for (int l = 0; l < L; l++)
            for (int m = 0; m < n; m++) HP_TRY(push(s, r, l * P + r, HP_PP_F, m));
        for (int i = 0; i < 2 * (P - 1 - r); i++) HP_TRY(row_push(&s->rows[r], NULL));
        for (int l = L - 1; l >= 0; l--)
            for (int m = n - 1; m >= 0; m--) HP_TRY(push(s, r, l * P + r, HP_PP_B, m));
    }
    return HP_OK;
}

hp_status_t hp_pp_generate(hp_pp_kind_t kind, int pp, int L, int n, hp_pp_schedule_t **out) {
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_generate: NULL out");
    *out = NULL;
    const char *name = hp_pp_kind_name(kind);
    if (!name) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_generate: unknown schedule kind %d", (int)kind);
    if (pp < 1 || L < 1 || n < 1)
        return hp_error(HP_ERR_INVALID_ARG, "%s: pp %d, stages per rank %d and n_microbatches %d must all be >= 1",
                        name, pp, L, n);
    if ((int64_t)pp * L * n * 2 > PP_MAX_COMPUTE || (int64_t)pp * L > HP_PP_MAX_STAGE + 1)
        return hp_error(HP_ERR_INVALID_ARG, "%s: pp %d x stages per rank %d x n_microbatches %d x 2 compute actions "
                        "exceeds 2^24; hint: a schedule of that size is not useful to simulate", name, pp, L, n);
    if (hp_pp_kind_is_single_stage(kind) && L != 1)
        return hp_error(HP_ERR_INVALID_ARG, "%s is a single-stage schedule (PipelineScheduleSingle): stages per rank "
                        "must be 1, got %d; hint: use Interleaved1F1B or LoopedBFS for %d stages per rank", name, L, L);
    if (kind == HP_PP_1F1B && n < pp)
        return hp_error(HP_ERR_INVALID_ARG, "Number of microbatches (%d) must be greater than or equal to the number of "
                        "stages (%d).", n, pp);
    int64_t rounds = n / pp > 1 ? n / pp : 1, mpr = n / rounds;
    if ((kind == HP_PP_INTERLEAVED_1F1B || kind == HP_PP_INTERLEAVED_ZB || kind == HP_PP_MPIPE) && n % rounds != 0)
        return hp_error(HP_ERR_INVALID_ARG, "%s requires the number of microbatches to be a multiple of the number of "
                        "rounds (%lld), but got %d.", kind == HP_PP_INTERLEAVED_ZB ? "Zero bubble" : "Interleaved 1F1B",
                        (long long)rounds, n);
    if ((kind == HP_PP_ZBV || kind == HP_PP_DUALPIPEV) && L != 2)
        return hp_error(HP_ERR_INVALID_ARG, "ZBV requires exactly 2 stages per rank, but got %d. (%s runs the V "
                        "mapping: rank r holds stages r and 2 pp - 1 - r)", L, name);
    if (kind == HP_PP_DUALPIPEV && n < 2 * pp)
        return hp_error(HP_ERR_INVALID_ARG, "DualPipeV requires at least as many microbatches as stages, but got %d "
                        "microbatches and %d stages.", n, 2 * pp);
    hp_pp_schedule_t *s;
    HP_TRY(hp_pp_schedule_create(pp, &s));
    hp_status_t st = HP_OK;
    int *cnt = NULL;
    switch (kind) {
    case HP_PP_GPIPE: st = gen_gpipe(s, pp, n); break;
    case HP_PP_1F1B: st = gen_1f1b(s, pp, n); break;
    case HP_PP_INTERLEAVED_1F1B:
    case HP_PP_INTERLEAVED_ZB:
    case HP_PP_MPIPE: {
        const int zb = kind == HP_PP_INTERLEAVED_ZB;
        cnt = hp_calloc(3 * (size_t)L, sizeof *cnt);
        st = cnt ? gen_interleaved(s, pp, L, n, mpr, zb, cnt, cnt + L, cnt + 2 * L) : HP_ERR_OOM;
        if (st == HP_OK && zb) st = add_bubbles(&s);
        if (st == HP_OK && kind == HP_PP_MPIPE) st = mpipe_transpose(s, pp, n);
        break;
    }
    case HP_PP_LOOPED_BFS: st = gen_looped_bfs(s, pp, L, n); break;
    case HP_PP_ZBV: st = gen_zbv(s, pp, n); break;
    case HP_PP_DUALPIPEV: st = gen_dualpipev(s, pp, n); break;
    default: break;
    }
    free(cnt);
    if (st != HP_OK) {
        hp_pp_schedule_free(s);
        return st;
    }
    *out = s;
    return HP_OK;
}

/* ---- lowering passes ------------------------------------------------------------------------- */

/* _add_unshard_reshard on one row. next[i*K..] holds the first K distinct stages of the row's
 * actions from i on (order of first use), computed backwards: the stages from i are stage(i)
 * followed by those from i+1 without stage(i). */
static hp_status_t unshard_row(const pp_row_t *in, int K, pp_row_t *out) {
    const int len = in->len;
    int32_t *next = hp_malloc(((size_t)len + 1) * (size_t)K * sizeof *next);
    int *nn = hp_calloc((size_t)len + 1, sizeof *nn);
    int32_t *active = hp_malloc((size_t)K * sizeof *active);
    hp_status_t st = next && nn && active ? HP_OK : HP_ERR_OOM;
    for (int i = len - 1; i >= 0 && st == HP_OK; i--) {
        const hp_pp_action_t *a = &in->a[i];
        int32_t *dst = next + (size_t)i * K, *src = next + (size_t)(i + 1) * K;
        if (is_bubble(a) || on_replica(a->type)) {   /* the replica is not stage 0: nothing to unshard */
            memcpy(dst, src, (size_t)K * sizeof *dst);
            nn[i] = nn[i + 1];
            continue;
        }
        int c = 0;
        dst[c++] = a->stage;
        const int two = a->type == HP_PP_OVERLAP_F_B && a->sub_stage != a->stage && K > 1;
        if (two) dst[c++] = a->sub_stage;
        for (int j = 0; j < nn[i + 1] && c < K; j++)
            if (src[j] != a->stage && !(two && src[j] == a->sub_stage)) dst[c++] = src[j];
        nn[i] = c;
    }
    int n_active = 0;
    for (int i = 0; i < len && st == HP_OK; i++) {
        const hp_pp_action_t *a = &in->a[i];
        if (is_bubble(a)) continue;
        const int32_t *nx = next + (size_t)i * K;
        /* evict first (in unshard order), then fetch the missing ones (in order of use) */
        for (int j = 0; j < n_active && st == HP_OK;) {
            int keep = 0;
            for (int q = 0; q < nn[i]; q++) keep |= nx[q] == active[j];
            if (keep) {
                j++;
                continue;
            }
            hp_pp_action_t rs = {active[j], HP_PP_RESHARD, HP_PP_NO_MB, 0, 0};
            st = row_push(out, &rs);
            memmove(active + j, active + j + 1, (size_t)(n_active - j - 1) * sizeof *active);
            n_active--;
        }
        for (int q = 0; q < nn[i] && st == HP_OK; q++) {
            int have = 0;
            for (int j = 0; j < n_active; j++) have |= active[j] == nx[q];
            if (have) continue;
            hp_pp_action_t us = {nx[q], HP_PP_UNSHARD, HP_PP_NO_MB, 0, 0};
            st = row_push(out, &us);
            active[n_active++] = nx[q];
        }
        if (st == HP_OK) st = row_push(out, a);
    }
    for (int j = 0; j < n_active && st == HP_OK; j++) {
        hp_pp_action_t rs = {active[j], HP_PP_RESHARD, HP_PP_NO_MB, 0, 0};
        st = row_push(out, &rs);
    }
    free(next);
    free(nn);
    free(active);
    return st;
}

typedef hp_status_t (*row_pass_fn)(const pp_row_t *in, int arg, pp_row_t *out);

static hp_status_t per_row(const hp_pp_schedule_t *s, row_pass_fn fn, int arg, hp_pp_schedule_t **out) {
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "pp pass: NULL out");
    *out = NULL;
    if (!s) return hp_error(HP_ERR_INVALID_ARG, "pp pass: NULL schedule");
    hp_pp_schedule_t *o;
    HP_TRY(hp_pp_schedule_create(s->n_ranks, &o));
    for (int r = 0; r < s->n_ranks; r++) {
        hp_status_t st = fn(&s->rows[r], arg, &o->rows[r]);
        if (st != HP_OK) {
            hp_pp_schedule_free(o);
            return st;
        }
    }
    *out = o;
    return HP_OK;
}

hp_status_t hp_pp_add_unshard_reshard(const hp_pp_schedule_t *s, int max_active_stages, hp_pp_schedule_t **out) {
    if (out) *out = NULL;
    if (max_active_stages < 1 || max_active_stages > 1024)
        return hp_error(HP_ERR_INVALID_ARG, "_add_unshard_reshard: max_active_stages %d outside [1, 1024] (PyTorch's "
                        "default is 3)", max_active_stages);
    return per_row(s, unshard_row, max_active_stages, out);
}

static hp_status_t reduce_grad_row(const pp_row_t *in, int n_mb, pp_row_t *out) {
    amap_t cnt = {0};   /* stage -> B and W seen */
    hp_status_t st = HP_OK;
    for (int i = 0; i < in->len && st == HP_OK; i++) {
        const hp_pp_action_t *a = &in->a[i];
        if (is_bubble(a)) continue;
        st = row_push(out, a);
        hp_pp_action_t lv[2];
        const int nl = base_leaves(a, lv);
        for (int k = 0; k < nl && st == HP_OK; k++) {   /* counting inside OVERLAP_F_B (and TRANSPOSE_B) too */
            if (lv[k].type != HP_PP_B && lv[k].type != HP_PP_W) continue;
            int64_t c = 0;
            amap_get(&cnt, akey(lv[k].stage, 0, HP_PP_NO_MB), &c);
            if (amap_put(&cnt, akey(lv[k].stage, 0, HP_PP_NO_MB), c + 1) < 0) st = oom("_add_reduce_grad");
            else if (c + 1 == n_mb) {
                hp_pp_action_t rg = {lv[k].stage, HP_PP_REDUCE_GRAD, HP_PP_NO_MB, 0, 0};
                st = row_push(out, &rg);
            }
        }
    }
    amap_free(&cnt);
    return st;
}

hp_status_t hp_pp_add_reduce_grad(const hp_pp_schedule_t *s, int n_microbatches, hp_pp_schedule_t **out) {
    if (out) *out = NULL;
    if (n_microbatches < 1)
        return hp_error(HP_ERR_INVALID_ARG, "_add_reduce_grad: n_microbatches %d must be >= 1", n_microbatches);
    return per_row(s, reduce_grad_row, n_microbatches, out);
}

static hp_status_t merge_bw_row(const pp_row_t *in, int unused, pp_row_t *out) {
    for (int i = 0; i < in->len; i++) {
        const hp_pp_action_t *a = &in->a[i];
        if (is_bubble(a)) continue;
        int j = i + 1;
        while (j < in->len && is_bubble(&in->a[j])) j++;
        const hp_pp_action_t *nx = j < in->len ? &in->a[j] : NULL;
        if (a->type == HP_PP_I && nx && nx->type == HP_PP_W && nx->stage == a->stage && nx->mb == a->mb) {
            hp_pp_action_t b = {a->stage, HP_PP_B, a->mb, 0, 0};
            HP_TRY(row_push(out, &b));
            i = j;   /* the W is consumed */
        } else {
            HP_TRY(row_push(out, a));
        }
    }
    return HP_OK;
}

hp_status_t hp_pp_merge_bw(const hp_pp_schedule_t *s, hp_pp_schedule_t **out) { return per_row(s, merge_bw_row, 0, out); }

static hp_status_t drop_row(const pp_row_t *in, int unused, pp_row_t *out) {
    for (int i = 0; i < in->len; i++)
        if (!is_bubble(&in->a[i])) HP_TRY(row_push(out, &in->a[i]));
    return HP_OK;
}

hp_status_t hp_pp_drop_bubbles(const hp_pp_schedule_t *s, hp_pp_schedule_t **out) { return per_row(s, drop_row, 0, out); }

/* Every action's stage < num_stages and every stage mapped to a rank of s. */
static hp_status_t check_mapping(const hp_pp_schedule_t *s, const int *stage_to_rank, int num_stages, const char *what) {
    if (!s || !stage_to_rank) return hp_error(HP_ERR_INVALID_ARG, "%s: NULL schedule or stage_to_rank", what);
    if (num_stages < 1 || num_stages > HP_PP_MAX_STAGE + 1)
        return hp_error(HP_ERR_INVALID_ARG, "%s: num_stages %d outside [1, %d]", what, num_stages, HP_PP_MAX_STAGE + 1);
    for (int st = 0; st < num_stages; st++)
        if (stage_to_rank[st] < 0 || stage_to_rank[st] >= s->n_ranks)
            return hp_error(HP_ERR_INVALID_ARG, "%s: stage_to_rank[%d] = %d is not a rank of the %d-rank schedule", what,
                            st, stage_to_rank[st], s->n_ranks);
    for (int r = 0; r < s->n_ranks; r++)
        for (int i = 0; i < s->rows[r].len; i++) {
            const hp_pp_action_t *a = &s->rows[r].a[i];
            const int32_t hi = a->type == HP_PP_OVERLAP_F_B && a->sub_stage > a->stage ? a->sub_stage : a->stage;
            if (!is_bubble(a) && hi >= num_stages) {
                char t[64];
                return hp_error(HP_ERR_INVALID_ARG, "%s: rank %d, position %d: action %s names stage %d, but the "
                                "schedule has num_stages %d (stages 0..%d)", what, r, i, act_str(a, t, sizeof t),
                                (int)hi, num_stages, num_stages - 1);
            }
        }
    return HP_OK;
}

/* _add_send_recv's readiness of a compute action on its own rank's scheduled set. */
static int sr_ready(const hp_pp_action_t *a, const amap_t *prev, int num_stages) {
    if (a->type == HP_PP_F && a->stage != 0)
        return amap_has(prev, a->stage, HP_PP_RECV_F, a->mb) || amap_has(prev, a->stage - 1, HP_PP_F, a->mb);
    if ((a->type == HP_PP_I || a->type == HP_PP_B) && a->stage != num_stages - 1)
        return amap_has(prev, a->stage, HP_PP_RECV_B, a->mb) || amap_has(prev, a->stage + 1, HP_PP_I, a->mb) ||
               amap_has(prev, a->stage + 1, HP_PP_B, a->mb);
    return 1;
}

/* What a blocked action waits for, for messages. */
static void describe_wait(sb_t *b, const hp_pp_action_t *a, int num_stages, const int *s2r) {
    int s = a->stage, m = a->mb;
    switch (a->type) {
    case HP_PP_F: sb_printf(b, "%dRECV_F%d or %dF%d on rank %d", s, m, s - 1, m, s2r[s]); break;
    case HP_PP_I:
    case HP_PP_B: sb_printf(b, "%dRECV_B%d, %dI%d or %dB%d on rank %d", s, m, s + 1, m, s + 1, m, s2r[s]); break;
    case HP_PP_SEND_F: sb_printf(b, "%dF%d on rank %d", s, m, s2r[s]); break;
    case HP_PP_SEND_B: sb_printf(b, "%dI%d or %dB%d on rank %d", s, m, s, m, s2r[s]); break;
    case HP_PP_RECV_F:
        if (s == 0) sb_printf(b, "a SEND_F of stage -1, which does not exist");
        else sb_printf(b, "%dSEND_F%d on rank %d", s - 1, m, s2r[s - 1]);
        break;
    case HP_PP_RECV_B:
        if (s + 1 >= num_stages) sb_printf(b, "a SEND_B of stage %d, which does not exist", s + 1);
        else sb_printf(b, "%dSEND_B%d on rank %d", s + 1, m, s2r[s + 1]);
        break;
    case HP_PP_TRANSPOSE_F: sb_printf(b, "0MPIPE_RECV_F%d on rank %d", m, s2r[0]); break;
    case HP_PP_TRANSPOSE_B: sb_printf(b, "0RECV_B%d, 1I%d or 1B%d on rank %d", m, m, m, s2r[0]); break;
    case HP_PP_MPIPE_SEND_F: sb_printf(b, "0MPIPE_F%d on the same rank", m); break;
    case HP_PP_MPIPE_RECV_F: sb_printf(b, "0MPIPE_SEND_F%d on a helping rank", m); break;
    default: sb_printf(b, "nothing"); break;
    }
}

hp_status_t hp_pp_add_send_recv(const hp_pp_schedule_t *s, const int *stage_to_rank, int num_stages,
                                hp_pp_schedule_t **out) {
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "_add_send_recv: NULL out");
    *out = NULL;
    HP_TRY(check_mapping(s, stage_to_rank, num_stages, "_add_send_recv"));
    const int R = s->n_ranks;
    hp_pp_schedule_t *o;
    HP_TRY(hp_pp_schedule_create(R, &o));
    amap_t *prev = hp_calloc((size_t)R, sizeof *prev);
    int *pos = hp_calloc((size_t)R, sizeof *pos);
    hp_status_t st = prev && pos ? HP_OK : HP_ERR_OOM;
    for (int left = R; st == HP_OK && left > 0;) {
        int progress = 0;
        left = 0;
        for (int r = 0; r < R && st == HP_OK; r++) {
            if (pos[r] >= s->rows[r].len) continue;
            const hp_pp_action_t *a0 = &s->rows[r].a[pos[r]];
            if (!is_bubble(a0)) {
                hp_pp_action_t lv[2];
                const int nl = base_leaves(a0, lv);   /* an OVERLAP_F_B waits for both halves' inputs */
                int ready = 1;
                for (int k = 0; k < nl; k++) ready &= sr_ready(&lv[k], &prev[r], num_stages);
                /* MPipe: stage 0's TRANSPOSE_F reads the helper's activation */
                if (a0->type == HP_PP_TRANSPOSE_F) ready &= amap_has(&prev[r], 0, HP_PP_MPIPE_RECV_F, a0->mb);
                if (!ready) {
                    left++;
                    continue;
                }
                st = row_push(&o->rows[r], a0);
                for (int k = 0; k < nl && st == HP_OK; k++) {
                const hp_pp_action_t *a = &lv[k];
                if (amap_put(&prev[r], akey(a->stage, a->type, a->mb), 0) < 0) st = oom("_add_send_recv");
                /* an F whose next stage is elsewhere sends; the receiver gets the RECV now */
                int fwd = a->type == HP_PP_F && a->stage != num_stages - 1 &&
                          stage_to_rank[a->stage + 1] != stage_to_rank[a->stage];
                int bwd = (a->type == HP_PP_I || a->type == HP_PP_B) && a->stage != 0 &&
                          stage_to_rank[a->stage - 1] != stage_to_rank[a->stage];
                if (st == HP_OK && a->type == HP_PP_MPIPE_F) {   /* to stage 0's rank, after the replica's F */
                    hp_pp_action_t send = {0, HP_PP_MPIPE_SEND_F, a->mb, 0, 0}, recv = {0, HP_PP_MPIPE_RECV_F, a->mb, 0, 0};
                    const int peer = stage_to_rank[0];
                    st = row_push(&o->rows[r], &send);
                    if (st == HP_OK && amap_put(&prev[r], akey(0, send.type, send.mb), 0) < 0) st = oom("_add_send_recv");
                    if (st == HP_OK) st = row_push(&o->rows[peer], &recv);
                    if (st == HP_OK && amap_put(&prev[peer], akey(0, recv.type, recv.mb), 0) < 0) st = oom("_add_send_recv");
                }
                if (st == HP_OK && (fwd || bwd)) {
                    hp_pp_action_t send = {a->stage, fwd ? HP_PP_SEND_F : HP_PP_SEND_B, a->mb, 0, 0};
                    hp_pp_action_t recv = {a->stage + (fwd ? 1 : -1), fwd ? HP_PP_RECV_F : HP_PP_RECV_B, a->mb, 0, 0};
                    int peer = stage_to_rank[recv.stage];
                    st = row_push(&o->rows[r], &send);
                    if (st == HP_OK && amap_put(&prev[r], akey(send.stage, send.type, send.mb), 0) < 0) st = oom("_add_send_recv");
                    if (st == HP_OK) st = row_push(&o->rows[peer], &recv);
                    if (st == HP_OK && amap_put(&prev[peer], akey(recv.stage, recv.type, recv.mb), 0) < 0)
                        st = oom("_add_send_recv");
                }
                }
            }
            pos[r]++;
            progress = 1;
            left += pos[r] < s->rows[r].len;
        }
        if (st == HP_OK && !progress) {
            sb_t b = {0};
            int shown = 0;
            for (int r = 0; r < R && shown < 8; r++) {
                if (pos[r] >= s->rows[r].len) continue;
                char t[64];
                const hp_pp_action_t *a = &s->rows[r].a[pos[r]];
                sb_printf(&b, "%srank %d waits at %s for ", shown ? "; " : "", r, act_str(a, t, sizeof t));
                describe_wait(&b, a, num_stages, stage_to_rank);
                shown++;
            }
            st = hp_error(HP_ERR_INVALID_ARG, "Malformed compute schedule, can't schedule sends/recvs: %s; hint: an "
                          "action needs its input computed earlier by an action some rank can reach (check the order "
                          "of F and B across ranks and the stage-to-rank mapping)", b.p ? b.p : "");
            free(b.p);
        }
    }
    for (int r = 0; prev && r < R; r++) amap_free(&prev[r]);
    free(prev);
    free(pos);
    if (st != HP_OK) {
        hp_pp_schedule_free(o);
        return st;
    }
    *out = o;
    return HP_OK;
}

/* ---- validation -------------------------------------------------------------------------------- */
hp_status_t hp_pp_validate(const hp_pp_schedule_t *s, int pp, int num_stages, int n, int *stage_to_rank_out) {
    if (!s) return hp_error(HP_ERR_INVALID_ARG, "_validate_schedule: NULL schedule");
    if (num_stages < 1 || num_stages > HP_PP_MAX_STAGE + 1 || n < 1)
        return hp_error(HP_ERR_INVALID_ARG, "_validate_schedule: num_stages %d must be in [1, %d] and num_microbatches "
                        "%d >= 1", num_stages, HP_PP_MAX_STAGE + 1, n);
    if (s->n_ranks != pp)
        return hp_error(HP_ERR_INVALID_ARG, "Schedule has incorrect number of ranks - expected %d, actual %d", pp,
                        s->n_ranks);
    int *map = hp_malloc((size_t)num_stages * sizeof *map);
    int64_t *cnt = hp_calloc((size_t)num_stages * 4, sizeof *cnt);   /* distinct F, B, I, W per stage */
    int *mp = hp_calloc((size_t)n * 2, sizeof *mp);   /* MPipe: per microbatch MPIPE_F and TRANSPOSE_F seen */
    amap_t seen = {0};
    hp_status_t st = map && cnt && mp ? HP_OK : HP_ERR_OOM;
    for (int i = 0; map && i < num_stages; i++) map[i] = -1;
    for (int r = 0; r < s->n_ranks && st == HP_OK; r++)
        for (int i = 0; i < s->rows[r].len && st == HP_OK; i++) {
            const hp_pp_action_t *a0 = &s->rows[r].a[i];
            if (is_bubble(a0)) continue;
            if (a0->type == HP_PP_MPIPE_F || a0->type == HP_PP_TRANSPOSE_F) {
                if (a0->stage != 0 || a0->mb >= n) {
                    char t[64], head[512];
                    snprintf(head, sizeof head, "Rank %d, step %d: %s: MPipe's preprocess is part of stage 0 and the "
                             "microbatch must be < %d", r, i, act_str(a0, t, sizeof t), n);
                    st = error_with_grid(s, i, head);
                    break;
                }
                mp[(size_t)a0->mb * 2 + (a0->type == HP_PP_TRANSPOSE_F)]++;
            }
            if (on_replica(a0->type)) continue;   /* the helper's replica, not stage 0 */
            hp_pp_action_t lv[2];
            const int nl = base_leaves(a0, lv);   /* an overlap's F and B, in order */
            for (int k = 0; k < nl && st == HP_OK; k++) {
            const hp_pp_action_t *a = &lv[k];
            char t[64], head[512];
            const int sid = a->stage;
            if (sid >= num_stages) {
                snprintf(head, sizeof head, "Rank %d, step %d: action %s names stage %d, but the schedule has %d stages "
                         "(0..%d)", r, i, act_str(a, t, sizeof t), sid, num_stages, num_stages - 1);
                st = error_with_grid(s, i, head);
                break;
            }
            int slot = -1;
            const char *need = NULL, *what = NULL, *first = NULL;
            switch (a->type) {
            case HP_PP_F: slot = 0; break;
            case HP_PP_B: slot = 1, need = "F", what = "Full Backward", first = "Forward"; break;
            case HP_PP_I: slot = 2, need = "F", what = "Backward Input", first = "Forward"; break;
            case HP_PP_W: slot = 3, need = "I", what = "Backward Weight", first = "Backward Input"; break;
            default: break;
            }
            if (need && !amap_has(&seen, sid, need[0] == 'F' ? HP_PP_F : HP_PP_I, a->mb)) {
                snprintf(head, sizeof head, "Rank %d, step %d: Running %s for stage %d, microbatch %d without first "
                         "running %s", r, i, what, sid, (int)a->mb, first);
                st = error_with_grid(s, i, head);
                break;
            }
            if (slot >= 0) {
                int fresh = amap_put(&seen, akey(sid, a->type, a->mb), 0);
                if (fresh < 0) st = oom("_validate_schedule");
                else cnt[(size_t)sid * 4 + (size_t)slot] += fresh;
            }
            if (map[sid] < 0) {
                map[sid] = r;
            } else if (map[sid] != r) {
                st = hp_error(HP_ERR_INVALID_ARG, "Rank %d, step %d: Stage %d is assigned to both rank %d and rank %d",
                              r, i, sid, r, map[sid]);
            }
            }
        }
    for (int sid = 0; sid < num_stages && st == HP_OK; sid++) {
        const int64_t f = cnt[sid * 4], b = cnt[sid * 4 + 1], ii = cnt[sid * 4 + 2], w = cnt[sid * 4 + 3];
        if (f != n)
            st = hp_error(HP_ERR_INVALID_ARG, "Got %lld F microbatches for stage %d, expected %d", (long long)f, sid, n);
        else if (ii != w)
            st = hp_error(HP_ERR_INVALID_ARG, "Invalid backward microbatches for stage %d: I and W must have equal "
                          "counts, but got I=%lld, W=%lld", sid, (long long)ii, (long long)w);
        else if (b + (ii + w) / 2 != n)
            st = hp_error(HP_ERR_INVALID_ARG, "Invalid backward microbatches for stage %d: expected %d total backwards, "
                          "but got B=%lld, I=%lld, W=%lld", sid, n, (long long)b, (long long)ii, (long long)w);
    }
    for (int m = 0; m < n && st == HP_OK; m++)
        if (mp[2 * m] != mp[2 * m + 1] || mp[2 * m] > 1)
            st = hp_error(HP_ERR_INVALID_ARG, "MPipe: microbatch %d has %d MPIPE_F and %d TRANSPOSE_F; stage 0 "
                          "continues a transposed microbatch from exactly one helper's MPIPE_F (and one of each at "
                          "most)", m, mp[2 * m], mp[2 * m + 1]);
    for (int r = 0; r < s->n_ranks && st == HP_OK && map[0] >= 0; r++)
        for (int i = 0; i < s->rows[r].len && st == HP_OK; i++)
            if (!is_bubble(&s->rows[r].a[i]) && s->rows[r].a[i].type == HP_PP_MPIPE_F && r == map[0])
                st = hp_error(HP_ERR_INVALID_ARG, "MPipe: rank %d, step %d: MPIPE_F of microbatch %d on stage 0's own "
                              "rank; hint: a helping rank (one not holding stage 0) computes the preprocess forward",
                              r, i, (int)s->rows[r].a[i].mb);
    if (st == HP_OK && stage_to_rank_out) memcpy(stage_to_rank_out, map, (size_t)num_stages * sizeof *map);
    free(map);
    free(cnt);
    free(mp);
    amap_free(&seen);
    return st;
}

hp_status_t hp_pp_lower(const hp_pp_schedule_t *compute, int num_stages, int n, hp_pp_schedule_t **out,
                        int *stage_to_rank_out) {
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_lower: NULL out");
    *out = NULL;
    if (!compute) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_lower: NULL schedule");
    int *map = hp_malloc((size_t)(num_stages > 0 ? num_stages : 1) * sizeof *map);
    if (!map) return HP_ERR_OOM;
    hp_status_t st = hp_pp_validate(compute, compute->n_ranks, num_stages, n, map);
    for (int r = 0; r < compute->n_ranks && st == HP_OK; r++)
        for (int i = 0; i < compute->rows[r].len; i++) {
            const hp_pp_action_t *a = &compute->rows[r].a[i];
            if (!is_bubble(a) && !hp_pp_type_is_compute(a->type)) {
                char t[64];
                st = hp_error(HP_ERR_INVALID_ARG, "Expected compute-only schedule but found communication action '%s' "
                              "at rank %d, position %d. Communication actions (e.g. SEND_F, RECV_F, etc.) should not be "
                              "present when format='compute_only'.", act_str(a, t, sizeof t), r, i);
                break;
            }
        }
    hp_pp_schedule_t *u = NULL, *g = NULL;
    if (st == HP_OK) st = hp_pp_add_unshard_reshard(compute, 3, &u);
    if (st == HP_OK) st = hp_pp_add_reduce_grad(u, n, &g);
    if (st == HP_OK) st = hp_pp_add_send_recv(g, map, num_stages, out);
    if (st == HP_OK && stage_to_rank_out) memcpy(stage_to_rank_out, map, (size_t)num_stages * sizeof *map);
    hp_pp_schedule_free(u);
    hp_pp_schedule_free(g);
    free(map);
    return st;
}

/* ---- the lock-step simulator ------------------------------------------------------------------- */
typedef struct { const int *s2r; int num_stages; amap_t *prev; int n_ranks; } sim_t;

static int sim_ready_leaf(const sim_t *S, int r, const hp_pp_action_t *a) {
    const int s = a->stage, m = a->mb;
    const amap_t *own = &S->prev[S->s2r[s]];
    switch (a->type) {
    case HP_PP_MPIPE_F: return 1;   /* the tokens are on every rank */
    case HP_PP_MPIPE_SEND_F: return amap_has(&S->prev[r], 0, HP_PP_MPIPE_F, m);
    case HP_PP_MPIPE_RECV_F:
        for (int q = 0; q < S->n_ranks; q++)
            if (q != r && amap_has(&S->prev[q], 0, HP_PP_MPIPE_SEND_F, m)) return 1;
        return 0;
    case HP_PP_F: return s == 0 || amap_has(own, s, HP_PP_RECV_F, m) || amap_has(own, s - 1, HP_PP_F, m);
    case HP_PP_I:
    case HP_PP_B:
        return s == S->num_stages - 1 || amap_has(own, s, HP_PP_RECV_B, m) || amap_has(own, s + 1, HP_PP_I, m) ||
               amap_has(own, s + 1, HP_PP_B, m);
    case HP_PP_W: return 1;
    case HP_PP_SEND_F: return amap_has(own, s, HP_PP_F, m);
    case HP_PP_SEND_B: return amap_has(own, s, HP_PP_I, m) || amap_has(own, s, HP_PP_B, m);
    case HP_PP_RECV_F: return s > 0 && amap_has(&S->prev[S->s2r[s - 1]], s - 1, HP_PP_SEND_F, m);
    case HP_PP_RECV_B: return s + 1 < S->num_stages && amap_has(&S->prev[S->s2r[s + 1]], s + 1, HP_PP_SEND_B, m);
    default: return 1;   /* UNSHARD, RESHARD, REDUCE_GRAD: local */
    }
}

/* An OVERLAP_F_B (which PyTorch's simulator does not model) is ready when both halves are. */
static int sim_ready(const sim_t *S, int r, const hp_pp_action_t *a) {
    hp_pp_action_t lv[2];
    const int nl = base_leaves(a, lv);
    int ok = 1;
    for (int k = 0; k < nl; k++) ok &= sim_ready_leaf(S, r, &lv[k]);
    if (a->type == HP_PP_TRANSPOSE_F) ok &= amap_has(&S->prev[S->s2r[0]], 0, HP_PP_MPIPE_RECV_F, a->mb);
    return ok;
}

static hp_status_t sim_mark(sim_t *S, int r, const hp_pp_action_t *a) {
    hp_pp_action_t lv[2];
    const int nl = base_leaves(a, lv);
    for (int k = 0; k < nl; k++)
        if (amap_put(&S->prev[r], akey(lv[k].stage, lv[k].type, lv[k].mb), 0) < 0) return oom("simulate");
    return HP_OK;
}

hp_status_t hp_pp_simulate(const hp_pp_schedule_t *s, const int *stage_to_rank, int num_stages,
                           hp_pp_schedule_t **simulated, int *steps) {
    if (simulated) *simulated = NULL;
    if (!steps) return hp_error(HP_ERR_INVALID_ARG, "_simulate_comms_compute: NULL steps");
    HP_TRY(check_mapping(s, stage_to_rank, num_stages, "_simulate_comms_compute"));
    const int R = s->n_ranks;
    hp_pp_schedule_t *o;
    HP_TRY(hp_pp_schedule_create(R, &o));
    sim_t S = {stage_to_rank, num_stages, hp_calloc((size_t)R, sizeof(amap_t)), R};
    int *pos = hp_calloc((size_t)R, sizeof *pos);
    hp_status_t st = S.prev && pos ? HP_OK : HP_ERR_OOM;
    /* bubbles of the input are dropped: skip them at each rank's cursor */
#define SKIP_BUBBLES(r) while (pos[r] < s->rows[r].len && is_bubble(&s->rows[r].a[pos[r]])) pos[r]++
    for (int r = 0; r < R && st == HP_OK; r++) SKIP_BUBBLES(r);
    int64_t round = 0;
    for (;;) {
        int active = 0;
        for (int r = 0; r < R; r++) active += pos[r] < s->rows[r].len;
        if (!active || st != HP_OK) break;
        int progress = 0;
        for (int r = 0; r < R && st == HP_OK; r++) {
            if (pos[r] >= s->rows[r].len) continue;
            const hp_pp_action_t *a = &s->rows[r].a[pos[r]];
            if (sim_ready(&S, r, a)) {
                st = row_push(&o->rows[r], a);
                if (st == HP_OK) st = sim_mark(&S, r, a);
                pos[r]++;
                SKIP_BUBBLES(r);
                progress = 1;
            } else {
                st = row_push(&o->rows[r], NULL);
            }
        }
        /* second pass: an idle rank may take its action if a later rank unblocked it */
        for (int r = 0; r < R && st == HP_OK; r++) {
            if (pos[r] >= s->rows[r].len) continue;
            pp_row_t *row = &o->rows[r];
            if (row->len == 0 || !is_bubble(&row->a[row->len - 1])) continue;
            const hp_pp_action_t *a = &s->rows[r].a[pos[r]];
            if (!sim_ready(&S, r, a)) continue;
            row->a[row->len - 1] = *a;
            st = sim_mark(&S, r, a);
            pos[r]++;
            SKIP_BUBBLES(r);
        }
        round++;
        if (st == HP_OK && !progress) {
            sb_t b = {0};
            int shown = 0;
            for (int r = 0; r < R; r++) {
                if (pos[r] >= s->rows[r].len) continue;
                if (shown == 8) {
                    sb_puts(&b, "; ...");
                    break;
                }
                char t[64];
                const hp_pp_action_t *a = &s->rows[r].a[pos[r]];
                sb_printf(&b, "%srank %d next action %s waits for ", shown ? "; " : "", r, act_str(a, t, sizeof t));
                describe_wait(&b, a, num_stages, stage_to_rank);
                shown++;
            }
            st = hp_error(HP_ERR_INVALID_ARG, "Schedule is not progressing (deadlock after %lld simulated steps): %s; "
                          "hint: a RECV is missing or ordered before the action that feeds its SEND", (long long)round,
                          b.p ? b.p : "");
            free(b.p);
            break;
        }
    }
#undef SKIP_BUBBLES
    int n = 0;
    for (int r = 0; r < R; r++) n = o->rows[r].len > n ? o->rows[r].len : n;
    for (int r = 0; S.prev && r < R; r++) amap_free(&S.prev[r]);
    free(S.prev);
    free(pos);
    if (st == HP_OK && steps) *steps = n;
    if (simulated && (st == HP_OK || st == HP_ERR_INVALID_ARG)) *simulated = o;
    else hp_pp_schedule_free(o);
    return st;
}

/* ---- unit-cost timing (bubble fraction) -------------------------------------------------------- */
/* ts / te (when not NULL): per slot (rank r's slot i at off[r] + i) the action's start and end,
 * -1 for bubbles and communication. */
static hp_status_t timing(const hp_pp_schedule_t *s, int num_stages, hp_pp_timing_t *out, int64_t *ts, int64_t *te) {
    if (!s || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_timing: NULL schedule or out");
    if (num_stages < 1 || num_stages > HP_PP_MAX_STAGE + 1)
        return hp_error(HP_ERR_INVALID_ARG, "hp_pp_timing: num_stages %d outside [1, %d]", num_stages,
                        HP_PP_MAX_STAGE + 1);
    const int R = s->n_ranks;
    amap_t done = {0};   /* (stage, F | I | W, mb) -> finish time; a B finishes both I and W */
    int *pos = hp_calloc((size_t)R, sizeof *pos);
    int64_t *free_at = hp_calloc((size_t)R, sizeof *free_at);
    hp_status_t st = pos && free_at ? HP_OK : HP_ERR_OOM;
    int64_t makespan = 0, busy = 0;
    for (int left = 1; st == HP_OK && left;) {
        int progress = 0;
        left = 0;
        for (int r = 0; r < R && st == HP_OK; r++) {
            for (; pos[r] < s->rows[r].len; pos[r]++) {
                const hp_pp_action_t *a = &s->rows[r].a[pos[r]];
                if (is_bubble(a) || !hp_pp_type_is_compute(a->type)) continue;   /* communication is free */
                if (a->stage >= num_stages) {
                    char t[64];
                    st = hp_error(HP_ERR_INVALID_ARG, "hp_pp_timing: rank %d, position %d: %s names stage %d >= "
                                  "num_stages %d", r, pos[r], act_str(a, t, sizeof t), (int)a->stage, num_stages);
                    break;
                }
                hp_pp_action_t lv[2];
                const int nl = base_leaves(a, lv);   /* an OVERLAP_F_B costs its F and its B */
                if (nl == 2 && lv[1].stage >= num_stages) {
                    char t[64];
                    st = hp_error(HP_ERR_INVALID_ARG, "hp_pp_timing: rank %d, position %d: %s names stage %d >= "
                                  "num_stages %d", r, pos[r], act_str(a, t, sizeof t), (int)lv[1].stage, num_stages);
                    break;
                }
                int64_t t0 = free_at[r];
                int ok = 1, cost = 0;
                if (a->type == HP_PP_TRANSPOSE_F) {   /* after the helper's preprocess forward */
                    int64_t t = 0;
                    ok = amap_get(&done, akey(0, HP_PP_MPIPE_F, a->mb), &t);
                    t0 = ok && t > t0 ? t : t0;
                }
                for (int k = 0; k < nl && ok; k++) {
                    const hp_pp_action_t *x = &lv[k];
                    int64_t t = 0;
                    if (x->type == HP_PP_F && x->stage > 0) {
                        ok = amap_get(&done, akey(x->stage - 1, HP_PP_F, x->mb), &t);
                        t0 = ok && t > t0 ? t : t0;
                    }
                    if (x->type == HP_PP_I || x->type == HP_PP_B) {
                        ok = amap_get(&done, akey(x->stage, HP_PP_F, x->mb), &t);
                        t0 = ok && t > t0 ? t : t0;
                        if (ok && x->stage < num_stages - 1) {
                            ok = amap_get(&done, akey(x->stage + 1, HP_PP_I, x->mb), &t);
                            t0 = ok && t > t0 ? t : t0;
                        }
                    }
                    if (x->type == HP_PP_W) {
                        ok = amap_get(&done, akey(x->stage, HP_PP_I, x->mb), &t);
                        t0 = ok && t > t0 ? t : t0;
                    }
                    cost += x->type == HP_PP_B ? 2 : 1;
                }
                if (!ok) break;
                const int64_t end = t0 + cost;
                if (ts) {
                    size_t at = 0;
                    for (int q = 0; q < r; q++) at += (size_t)s->rows[q].len;
                    ts[at + (size_t)pos[r]] = t0;
                    te[at + (size_t)pos[r]] = end;
                }
                free_at[r] = end;
                busy += cost;
                makespan = end > makespan ? end : makespan;
                for (int k = 0; k < nl && st == HP_OK; k++) {
                    const hp_pp_action_t *x = &lv[k];
                    int kk = x->type == HP_PP_F || x->type == HP_PP_MPIPE_F ? x->type : x->type == HP_PP_W ? HP_PP_W : HP_PP_I;
                    if (amap_put(&done, akey(x->stage, kk, x->mb), end) < 0 ||
                        (x->type == HP_PP_B && amap_put(&done, akey(x->stage, HP_PP_W, x->mb), end) < 0))
                        st = oom("hp_pp_timing");
                }
                if (st != HP_OK) break;
                progress = 1;
            }
            left += pos[r] < s->rows[r].len;
        }
        if (st == HP_OK && left && !progress) {
            sb_t b = {0};
            int shown = 0;
            for (int r = 0; r < R && shown < 8; r++) {
                if (pos[r] >= s->rows[r].len) continue;
                char t[64];
                const hp_pp_action_t *a = &s->rows[r].a[pos[r]];
                sb_printf(&b, "%srank %d waits at %s", shown++ ? "; " : "", r, act_str(a, t, sizeof t));
            }
            st = hp_error(HP_ERR_INVALID_ARG, "hp_pp_timing: the compute schedule deadlocks: %s; hint: each F needs the "
                          "F of the previous stage, each I/B its own F and the I/B of the next stage, each W its I "
                          "(hp_pp_validate checks the per-stage order)", b.p ? b.p : "");
            free(b.p);
        }
    }
    free(pos);
    free(free_at);
    amap_free(&done);
    if (st != HP_OK) return st;
    out->makespan = makespan;
    out->busy = busy;
    out->bubble_fraction = makespan > 0 ? 1.0 - (double)busy / ((double)R * (double)makespan) : 0.0;
    return HP_OK;
}

hp_status_t hp_pp_timing(const hp_pp_schedule_t *s, int num_stages, hp_pp_timing_t *out) {
    return timing(s, num_stages, out, NULL, NULL);
}

hp_status_t hp_pp_timing_actions(const hp_pp_schedule_t *s, int num_stages, hp_pp_timing_t *out, int64_t **start,
                                 int64_t **end) {
    if (!start || !end) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_timing_actions: NULL start or end");
    *start = *end = NULL;
    if (!s) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_timing_actions: NULL schedule");
    size_t n = 0;
    for (int r = 0; r < s->n_ranks; r++) n += (size_t)s->rows[r].len;
    int64_t *a = hp_malloc((n + 1) * sizeof *a), *b = hp_malloc((n + 1) * sizeof *b);
    if (!a || !b) {
        free(a);
        free(b);
        return oom("hp_pp_timing_actions");
    }
    for (size_t i = 0; i < n; i++) a[i] = b[i] = -1;
    hp_status_t st = timing(s, num_stages, out, a, b);
    if (st != HP_OK) {
        free(a);
        free(b);
        return st;
    }
    *start = a;
    *end = b;
    return HP_OK;
}
