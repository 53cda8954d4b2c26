/* Pipeline schedule checks (docs/pp.md): _validate_schedule, the lock-step simulator
 * _simulate_comms_compute (deadlock and its message with the grid) and the unit-cost timing
 * (steps, bubble fraction, per-action start and end). */
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
                             "microbatch must be < %d", r, i, hp_pps_act_str(a0, t, sizeof t), n);
                    st = hp_pps_error_with_grid(s, i, head);
                    break;
                }
                mp[(size_t)a0->mb * 2 + (a0->type == HP_PP_TRANSPOSE_F)]++;
            }
            if (on_replica(a0->type)) continue;   /* the helper's replica, not stage 0 */
            hp_pp_action_t lv[2];
            const int nl = hp_pps_base_leaves(a0, lv);   /* an overlap's F and B, in order */
            for (int k = 0; k < nl && st == HP_OK; k++) {
            const hp_pp_action_t *a = &lv[k];
            char t[64], head[512];
            const int sid = a->stage;
            if (sid >= num_stages) {
                snprintf(head, sizeof head, "Rank %d, step %d: action %s names stage %d, but the schedule has %d stages "
                         "(0..%d)", r, i, hp_pps_act_str(a, t, sizeof t), sid, num_stages, num_stages - 1);
                st = hp_pps_error_with_grid(s, i, head);
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
            if (need && !hp_pps_amap_has(&seen, sid, need[0] == 'F' ? HP_PP_F : HP_PP_I, a->mb)) {
                snprintf(head, sizeof head, "Rank %d, step %d: Running %s for stage %d, microbatch %d without first "
                         "running %s", r, i, what, sid, (int)a->mb, first);
                st = hp_pps_error_with_grid(s, i, head);
                break;
            }
            if (slot >= 0) {
                int fresh = hp_pps_amap_put(&seen, akey(sid, a->type, a->mb), 0);
                if (fresh < 0) st = hp_pps_oom("_validate_schedule");
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
    hp_pps_amap_free(&seen);
    return st;
}

/* ---- the lock-step simulator ------------------------------------------------------------------- */
typedef struct { const int *s2r; int num_stages; amap_t *prev; int n_ranks; } sim_t;

static int sim_ready_leaf(const sim_t *S, int r, const hp_pp_action_t *a) {
    const int s = a->stage, m = a->mb;
    const amap_t *own = &S->prev[S->s2r[s]];
    switch (a->type) {
    case HP_PP_MPIPE_F: return 1;   /* the tokens are on every rank */
    case HP_PP_MPIPE_SEND_F: return hp_pps_amap_has(&S->prev[r], 0, HP_PP_MPIPE_F, m);
    case HP_PP_MPIPE_RECV_F:
        for (int q = 0; q < S->n_ranks; q++)
            if (q != r && hp_pps_amap_has(&S->prev[q], 0, HP_PP_MPIPE_SEND_F, m)) return 1;
        return 0;
    case HP_PP_F: return s == 0 || hp_pps_amap_has(own, s, HP_PP_RECV_F, m) || hp_pps_amap_has(own, s - 1, HP_PP_F, m);
    case HP_PP_I:
    case HP_PP_B:
        return s == S->num_stages - 1 || hp_pps_amap_has(own, s, HP_PP_RECV_B, m) || hp_pps_amap_has(own, s + 1, HP_PP_I, m) ||
               hp_pps_amap_has(own, s + 1, HP_PP_B, m);
    case HP_PP_W: return 1;
    case HP_PP_SEND_F: return hp_pps_amap_has(own, s, HP_PP_F, m);
    case HP_PP_SEND_B: return hp_pps_amap_has(own, s, HP_PP_I, m) || hp_pps_amap_has(own, s, HP_PP_B, m);
    case HP_PP_RECV_F: return s > 0 && hp_pps_amap_has(&S->prev[S->s2r[s - 1]], s - 1, HP_PP_SEND_F, m);
    case HP_PP_RECV_B: return s + 1 < S->num_stages && hp_pps_amap_has(&S->prev[S->s2r[s + 1]], s + 1, HP_PP_SEND_B, m);
    default: return 1;   /* UNSHARD, RESHARD, REDUCE_GRAD: local */
    }
}

/* An OVERLAP_F_B (which PyTorch's simulator does not model) is ready when both halves are. */
static int sim_ready(const sim_t *S, int r, const hp_pp_action_t *a) {
    hp_pp_action_t lv[2];
    const int nl = hp_pps_base_leaves(a, lv);
    int ok = 1;
    for (int k = 0; k < nl; k++) ok &= sim_ready_leaf(S, r, &lv[k]);
    if (a->type == HP_PP_TRANSPOSE_F) ok &= hp_pps_amap_has(&S->prev[S->s2r[0]], 0, HP_PP_MPIPE_RECV_F, a->mb);
    return ok;
}

static hp_status_t sim_mark(sim_t *S, int r, const hp_pp_action_t *a) {
    hp_pp_action_t lv[2];
    const int nl = hp_pps_base_leaves(a, lv);
    for (int k = 0; k < nl; k++)
        if (hp_pps_amap_put(&S->prev[r], akey(lv[k].stage, lv[k].type, lv[k].mb), 0) < 0) return hp_pps_oom("simulate");
    return HP_OK;
}

hp_status_t hp_pp_simulate(const hp_pp_schedule_t *s, const int *stage_to_rank, int num_stages,
                           hp_pp_schedule_t **simulated, int *steps) {
    if (simulated) *simulated = NULL;
    if (!steps) return hp_error(HP_ERR_INVALID_ARG, "_simulate_comms_compute: NULL steps");
    HP_TRY(hp_pps_check_mapping(s, stage_to_rank, num_stages, "_simulate_comms_compute"));
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
                st = hp_pps_row_push(&o->rows[r], a);
                if (st == HP_OK) st = sim_mark(&S, r, a);
                pos[r]++;
                SKIP_BUBBLES(r);
                progress = 1;
            } else {
                st = hp_pps_row_push(&o->rows[r], NULL);
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
            hp_pps_describe_blocked(&b, s, pos, num_stages, stage_to_rank, "next action", "waits for", 1);
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
    for (int r = 0; S.prev && r < R; r++) hp_pps_amap_free(&S.prev[r]);
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
                                  "num_stages %d", r, pos[r], hp_pps_act_str(a, t, sizeof t), (int)a->stage, num_stages);
                    break;
                }
                hp_pp_action_t lv[2];
                const int nl = hp_pps_base_leaves(a, lv);   /* an OVERLAP_F_B costs its F and its B */
                if (nl == 2 && lv[1].stage >= num_stages) {
                    char t[64];
                    st = hp_error(HP_ERR_INVALID_ARG, "hp_pp_timing: rank %d, position %d: %s names stage %d >= "
                                  "num_stages %d", r, pos[r], hp_pps_act_str(a, t, sizeof t), (int)lv[1].stage, num_stages);
                    break;
                }
                int64_t t0 = free_at[r];
                int ok = 1, cost = 0;
                if (a->type == HP_PP_TRANSPOSE_F) {   /* after the helper's preprocess forward */
                    int64_t t = 0;
                    ok = hp_pps_amap_get(&done, akey(0, HP_PP_MPIPE_F, a->mb), &t);
                    t0 = ok && t > t0 ? t : t0;
                }
                for (int k = 0; k < nl && ok; k++) {
                    const hp_pp_action_t *x = &lv[k];
                    int64_t t = 0;
                    if (x->type == HP_PP_F && x->stage > 0) {
                        ok = hp_pps_amap_get(&done, akey(x->stage - 1, HP_PP_F, x->mb), &t);
                        t0 = ok && t > t0 ? t : t0;
                    }
                    if (x->type == HP_PP_I || x->type == HP_PP_B) {
                        ok = hp_pps_amap_get(&done, akey(x->stage, HP_PP_F, x->mb), &t);
                        t0 = ok && t > t0 ? t : t0;
                        if (ok && x->stage < num_stages - 1) {
                            ok = hp_pps_amap_get(&done, akey(x->stage + 1, HP_PP_I, x->mb), &t);
                            t0 = ok && t > t0 ? t : t0;
                        }
                    }
                    if (x->type == HP_PP_W) {
                        ok = hp_pps_amap_get(&done, akey(x->stage, HP_PP_I, x->mb), &t);
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
                    if (hp_pps_amap_put(&done, akey(x->stage, kk, x->mb), end) < 0 ||
                        (x->type == HP_PP_B && hp_pps_amap_put(&done, akey(x->stage, HP_PP_W, x->mb), end) < 0))
                        st = hp_pps_oom("hp_pp_timing");
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
                hp_pps_sb_printf(&b, "%srank %d waits at %s", shown++ ? "; " : "", r, hp_pps_act_str(a, t, sizeof t));
            }
            st = hp_error(HP_ERR_INVALID_ARG, "hp_pp_timing: the compute schedule deadlocks: %s; hint: each F needs the "
                          "F of the previous stage, each I/B its own F and the I/B of the next stage, each W its I "
                          "(hp_pp_validate checks the per-stage order)", b.p ? b.p : "");
            free(b.p);
        }
    }
    free(pos);
    free(free_at);
    hp_pps_amap_free(&done);
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
        return hp_pps_oom("hp_pp_timing_actions");
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
