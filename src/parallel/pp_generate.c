/* Pipeline schedule generators (docs/pp.md): stage-to-rank mappings, schedule kinds by name,
 * and the per-rank action lists of GPipe, 1F1B, Interleaved1F1B, LoopedBFS, the zero-bubble
 * schedules (InterleavedZeroBubble, ZBVZeroBubble), DualPipeV and MPipe transpose. */
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
        for (int i = 0; i < r; i++) HP_TRY(hp_pps_row_push(&s->rows[r], NULL));
        for (int m = 0; m < n; m++) HP_TRY(hp_pps_push(s, r, r, HP_PP_F, m));
        for (int i = 0; i < 3 * (P - 1 - r); i++) HP_TRY(hp_pps_row_push(&s->rows[r], NULL));
        for (int m = 0; m < n; m++) HP_TRY(hp_pps_push(s, r, r, HP_PP_B, m));
    }
    return HP_OK;
}

static hp_status_t gen_1f1b(hp_pp_schedule_t *s, int P, int n) {
    for (int r = 0; r < P; r++) {
        for (int i = 0; i < r; i++) HP_TRY(hp_pps_row_push(&s->rows[r], NULL));
        int warm = P - 1 - r, fwd = 0, bwd = 0;
        for (; fwd < warm; fwd++) HP_TRY(hp_pps_push(s, r, r, HP_PP_F, fwd));
        for (int i = 0; i < 2 * (P - 1 - r); i++) HP_TRY(hp_pps_row_push(&s->rows[r], NULL));
        /* steady: the next forward is `fwd` (PyTorch numbers the last rank's from 1; see the header) */
        for (; fwd < n; fwd++) {
            HP_TRY(hp_pps_push(s, r, r, HP_PP_F, fwd));
            HP_TRY(hp_pps_push(s, r, r, HP_PP_B, bwd++));
        }
        for (; bwd < n; bwd++) {   /* cooldown: each backward after a bubble */
            HP_TRY(hp_pps_row_push(&s->rows[r], NULL));
            HP_TRY(hp_pps_push(s, r, r, HP_PP_B, bwd));
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
        for (int i = 0; i < r; i++) HP_TRY(hp_pps_row_push(&s->rows[r], NULL));
        for (int64_t op = 0; op < total; op++) {
            if (op < warm + fwd_bwd) {   /* warm-up and steady: a forward */
                int loc = (int)((op / mpr) % L);
                HP_TRY(hp_pps_push(s, r, loc * P + r, HP_PP_F, fcnt[loc]++));
                if (op == warm - 1)
                    for (int64_t i = 0; i < post; i++) HP_TRY(hp_pps_row_push(&s->rows[r], NULL));
            } else if (!zb) {   /* cooldown: a bubble to stay aligned with the other ranks' 1F1B */
                HP_TRY(hp_pps_row_push(&s->rows[r], NULL));
            }
            if (op >= warm) {
                int loc = BWD_LOC(op);
                HP_TRY(hp_pps_push(s, r, loc * P + r, bt, bcnt[loc]++));
                if (zb && op - warm >= r) {
                    int wl = BWD_LOC(warm + wdone);
                    HP_TRY(hp_pps_push(s, r, wl * P + r, HP_PP_W, wcnt[wl]++));
                    wdone++;
                }
            }
        }
        for (; zb && wdone < total - warm; wdone++) {
            int wl = BWD_LOC(warm + wdone);
            HP_TRY(hp_pps_push(s, r, wl * P + r, HP_PP_W, wcnt[wl]++));
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
        hp_pps_amap_free(&fresh);
        for (int r = 0; r < R && st == HP_OK; r++) {
            if (pos[r] >= in->rows[r].len) continue;
            active = 1;
            const hp_pp_action_t *a = &in->rows[r].a[pos[r]];
            if (is_bubble(a)) {
                pos[r]++;
                st = hp_pps_row_push(&o->rows[r], NULL);
            } else if (a->type == HP_PP_F && a->stage != 0 && !hp_pps_amap_has(&seen, a->stage - 1, HP_PP_F, a->mb)) {
                st = hp_pps_row_push(&o->rows[r], NULL);
            } else {
                pos[r]++;
                st = hp_pps_row_push(&o->rows[r], a);
                if (st == HP_OK && hp_pps_amap_put(&fresh, akey(a->stage, a->type, a->mb), 0) < 0) st = hp_pps_oom("add_bubbles");
            }
        }
        for (size_t i = 0; st == HP_OK && i < fresh.cap; i++)   /* seen |= this round's actions */
            if (fresh.keys && fresh.used[i] && hp_pps_amap_put(&seen, fresh.keys[i], 0) < 0) st = hp_pps_oom("add_bubbles");
        if (st == HP_OK && ++guard > 4 * total + 16)
            st = hp_error(HP_ERR_STATE, "InterleavedZeroBubble: _add_bubbles_to_actions does not terminate");
    }
    hp_pps_amap_free(&seen);
    hp_pps_amap_free(&fresh);
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
        for (int i = 0; i < r; i++) HP_TRY(hp_pps_row_push(row, NULL));
        for (int i = 0; i < 2 * (P - r) - 1; i++) HP_TRY(hp_pps_push(s, r, c0, HP_PP_F, f0++));
        for (int i = 0; i < r; i++) {
            HP_TRY(hp_pps_push(s, r, c1, HP_PP_F, f1++));
            HP_TRY(hp_pps_push(s, r, c0, HP_PP_F, f0++));
        }
        for (int i = 0; i < P - r; i++) {
            HP_TRY(hp_pps_push(s, r, c1, HP_PP_F, f1++));
            HP_TRY(hp_pps_push(s, r, c1, HP_PP_I, b1));
            HP_TRY(hp_pps_push(s, r, c1, HP_PP_W, b1++));
        }
        while (f1 < f0 || f0 < nm) {
            if (f0 < nm) HP_TRY(hp_pps_push(s, r, c0, HP_PP_F, f0++));
            HP_TRY(hp_pps_push(s, r, c0, HP_PP_I, b0));
            HP_TRY(hp_pps_push(s, r, c0, HP_PP_W, b0++));
            HP_TRY(hp_pps_push(s, r, c1, HP_PP_F, f1++));
            HP_TRY(hp_pps_push(s, r, c1, HP_PP_I, b1));
            HP_TRY(hp_pps_push(s, r, c1, HP_PP_W, b1++));
        }
        int w0 = b0, w1 = b1;
        for (int i = 0; i < r; i++) {
            HP_TRY(hp_pps_push(s, r, c0, HP_PP_I, b0++));
            HP_TRY(hp_pps_push(s, r, c1, HP_PP_I, b1++));
        }
        for (int i = 0; i < P - r; i++) {
            HP_TRY(hp_pps_push(s, r, c0, HP_PP_I, b0++));
            HP_TRY(hp_pps_push(s, r, c0, HP_PP_W, w0++));
        }
        while (w1 < b1) HP_TRY(hp_pps_push(s, r, c1, HP_PP_W, w1++));
        while (w0 < b0) HP_TRY(hp_pps_push(s, r, c0, HP_PP_W, w0++));
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
    if (t == HP_PP_F) return hp_pps_push(d->s, d->r, stage, HP_PP_F, d->fcnt[loc]++);
    const int mb = d->icnt[loc]++;
    if (t == HP_PP_B) d->wcnt[loc]++;
    else d->wq[d->wq_head + d->wq_len++] = loc * (1 << 24) + mb;   /* an I: its W later */
    return hp_pps_push(d->s, d->r, stage, t, mb);
}

static hp_status_t dpv_overlap(dpv_t *d, int floc, int bloc) {
    hp_pp_action_t a = {d->c[floc], HP_PP_OVERLAP_F_B, d->fcnt[floc]++, d->c[bloc], d->icnt[bloc]++};
    d->wcnt[bloc]++;
    return hp_pps_row_push(&d->s->rows[d->r], &a);
}

static hp_status_t dpv_pending_w(dpv_t *d) {
    if (!d->wq_len) return HP_OK;
    const int v = d->wq[d->wq_head++];
    d->wq_len--;
    d->wcnt[v >> 24]++;
    return hp_pps_push(d->s, d->r, d->c[v >> 24], HP_PP_W, v & ((1 << 24) - 1));
}

static hp_status_t gen_dualpipev(hp_pp_schedule_t *s, int P, int n) {
    int *wq = hp_malloc((size_t)(4 * n + 4) * sizeof *wq);
    if (!wq) return hp_pps_oom("DualPipeV");
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
        for (int i = 0; i < r; i++) HP_TRY(hp_pps_row_push(&s->rows[r], NULL));
        for (int l = 0; l < L; l++)
            for (int m = 0; m < n; m++) HP_TRY(hp_pps_push(s, r, l * P + r, HP_PP_F, m));
        for (int i = 0; i < 2 * (P - 1 - r); i++) HP_TRY(hp_pps_row_push(&s->rows[r], NULL));
        for (int l = L - 1; l >= 0; l--)
            for (int m = n - 1; m >= 0; m--) HP_TRY(hp_pps_push(s, r, l * P + r, HP_PP_B, m));
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
