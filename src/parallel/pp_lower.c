/* Pipeline schedule lowering passes (docs/pp.md): _add_unshard_reshard, _add_reduce_grad,
 * _merge_bw, dropping bubbles and _add_send_recv, which turn a compute-only schedule into one
 * with communication and FSDP actions, plus the whole lowering (hp_pp_lower). */
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
            st = hp_pps_row_push(out, &rs);
            memmove(active + j, active + j + 1, (size_t)(n_active - j - 1) * sizeof *active);
            n_active--;
        }
        for (int q = 0; q < nn[i] && st == HP_OK; q++) {
            int have = 0;
            for (int j = 0; j < n_active; j++) have |= active[j] == nx[q];
            if (have) continue;
            hp_pp_action_t us = {nx[q], HP_PP_UNSHARD, HP_PP_NO_MB, 0, 0};
            st = hp_pps_row_push(out, &us);
            active[n_active++] = nx[q];
        }
        if (st == HP_OK) st = hp_pps_row_push(out, a);
    }
    for (int j = 0; j < n_active && st == HP_OK; j++) {
        hp_pp_action_t rs = {active[j], HP_PP_RESHARD, HP_PP_NO_MB, 0, 0};
        st = hp_pps_row_push(out, &rs);
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
        st = hp_pps_row_push(out, a);
        hp_pp_action_t lv[2];
        const int nl = hp_pps_base_leaves(a, lv);
        for (int k = 0; k < nl && st == HP_OK; k++) {   /* counting inside OVERLAP_F_B (and TRANSPOSE_B) too */
            if (lv[k].type != HP_PP_B && lv[k].type != HP_PP_W) continue;
            int64_t c = 0;
            hp_pps_amap_get(&cnt, akey(lv[k].stage, 0, HP_PP_NO_MB), &c);
            if (hp_pps_amap_put(&cnt, akey(lv[k].stage, 0, HP_PP_NO_MB), c + 1) < 0) st = hp_pps_oom("_add_reduce_grad");
            else if (c + 1 == n_mb) {
                hp_pp_action_t rg = {lv[k].stage, HP_PP_REDUCE_GRAD, HP_PP_NO_MB, 0, 0};
                st = hp_pps_row_push(out, &rg);
            }
        }
    }
    hp_pps_amap_free(&cnt);
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
            HP_TRY(hp_pps_row_push(out, &b));
            i = j;   /* the W is consumed */
        } else {
            HP_TRY(hp_pps_row_push(out, a));
        }
    }
    return HP_OK;
}

hp_status_t hp_pp_merge_bw(const hp_pp_schedule_t *s, hp_pp_schedule_t **out) { return per_row(s, merge_bw_row, 0, out); }

static hp_status_t drop_row(const pp_row_t *in, int unused, pp_row_t *out) {
    for (int i = 0; i < in->len; i++)
        if (!is_bubble(&in->a[i])) HP_TRY(hp_pps_row_push(out, &in->a[i]));
    return HP_OK;
}

hp_status_t hp_pp_drop_bubbles(const hp_pp_schedule_t *s, hp_pp_schedule_t **out) { return per_row(s, drop_row, 0, out); }

/* Every action's stage < num_stages and every stage mapped to a rank of s. */
hp_status_t hp_pps_check_mapping(const hp_pp_schedule_t *s, const int *stage_to_rank, int num_stages, const char *what) {
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
                                "schedule has num_stages %d (stages 0..%d)", what, r, i, hp_pps_act_str(a, t, sizeof t),
                                (int)hi, num_stages, num_stages - 1);
            }
        }
    return HP_OK;
}

/* _add_send_recv's readiness of a compute action on its own rank's scheduled set. */
static int sr_ready(const hp_pp_action_t *a, const amap_t *prev, int num_stages) {
    if (a->type == HP_PP_F && a->stage != 0)
        return hp_pps_amap_has(prev, a->stage, HP_PP_RECV_F, a->mb) || hp_pps_amap_has(prev, a->stage - 1, HP_PP_F, a->mb);
    if ((a->type == HP_PP_I || a->type == HP_PP_B) && a->stage != num_stages - 1)
        return hp_pps_amap_has(prev, a->stage, HP_PP_RECV_B, a->mb) || hp_pps_amap_has(prev, a->stage + 1, HP_PP_I, a->mb) ||
               hp_pps_amap_has(prev, a->stage + 1, HP_PP_B, a->mb);
    return 1;
}

/* What a blocked action waits for, for messages. */
void hp_pps_describe_wait(sb_t *b, const hp_pp_action_t *a, int num_stages, const int *s2r) {
    int s = a->stage, m = a->mb;
    switch (a->type) {
    case HP_PP_F: hp_pps_sb_printf(b, "%dRECV_F%d or %dF%d on rank %d", s, m, s - 1, m, s2r[s]); break;
    case HP_PP_I:
    case HP_PP_B: hp_pps_sb_printf(b, "%dRECV_B%d, %dI%d or %dB%d on rank %d", s, m, s + 1, m, s + 1, m, s2r[s]); break;
    case HP_PP_SEND_F: hp_pps_sb_printf(b, "%dF%d on rank %d", s, m, s2r[s]); break;
    case HP_PP_SEND_B: hp_pps_sb_printf(b, "%dI%d or %dB%d on rank %d", s, m, s, m, s2r[s]); break;
    case HP_PP_RECV_F:
        if (s == 0) hp_pps_sb_printf(b, "a SEND_F of stage -1, which does not exist");
        else hp_pps_sb_printf(b, "%dSEND_F%d on rank %d", s - 1, m, s2r[s - 1]);
        break;
    case HP_PP_RECV_B:
        if (s + 1 >= num_stages) hp_pps_sb_printf(b, "a SEND_B of stage %d, which does not exist", s + 1);
        else hp_pps_sb_printf(b, "%dSEND_B%d on rank %d", s + 1, m, s2r[s + 1]);
        break;
    case HP_PP_TRANSPOSE_F: hp_pps_sb_printf(b, "0MPIPE_RECV_F%d on rank %d", m, s2r[0]); break;
    case HP_PP_TRANSPOSE_B: hp_pps_sb_printf(b, "0RECV_B%d, 1I%d or 1B%d on rank %d", m, m, m, s2r[0]); break;
    case HP_PP_MPIPE_SEND_F: hp_pps_sb_printf(b, "0MPIPE_F%d on the same rank", m); break;
    case HP_PP_MPIPE_RECV_F: hp_pps_sb_printf(b, "0MPIPE_SEND_F%d on a helping rank", m); break;
    default: hp_pps_sb_printf(b, "nothing"); break;
    }
}

void hp_pps_describe_blocked(sb_t *b, const hp_pp_schedule_t *s, const int *pos, int num_stages, const int *s2r,
                             const char *before, const char *after, int ellipsis) {
    int shown = 0;
    for (int r = 0; r < s->n_ranks; r++) {
        if (pos[r] >= s->rows[r].len) continue;
        if (shown == 8) {
            if (ellipsis) hp_pps_sb_puts(b, "; ...");
            break;
        }
        char t[64];
        const hp_pp_action_t *a = &s->rows[r].a[pos[r]];
        hp_pps_sb_printf(b, "%srank %d %s %s %s ", shown ? "; " : "", r, before, hp_pps_act_str(a, t, sizeof t), after);
        hp_pps_describe_wait(b, a, num_stages, s2r);
        shown++;
    }
}

hp_status_t hp_pp_add_send_recv(const hp_pp_schedule_t *s, const int *stage_to_rank, int num_stages,
                                hp_pp_schedule_t **out) {
    if (!out) return hp_error(HP_ERR_INVALID_ARG, "_add_send_recv: NULL out");
    *out = NULL;
    HP_TRY(hp_pps_check_mapping(s, stage_to_rank, num_stages, "_add_send_recv"));
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
                const int nl = hp_pps_base_leaves(a0, lv);   /* an OVERLAP_F_B waits for both halves' inputs */
                int ready = 1;
                for (int k = 0; k < nl; k++) ready &= sr_ready(&lv[k], &prev[r], num_stages);
                /* MPipe: stage 0's TRANSPOSE_F reads the helper's activation */
                if (a0->type == HP_PP_TRANSPOSE_F) ready &= hp_pps_amap_has(&prev[r], 0, HP_PP_MPIPE_RECV_F, a0->mb);
                if (!ready) {
                    left++;
                    continue;
                }
                st = hp_pps_row_push(&o->rows[r], a0);
                for (int k = 0; k < nl && st == HP_OK; k++) {
                const hp_pp_action_t *a = &lv[k];
                if (hp_pps_amap_put(&prev[r], akey(a->stage, a->type, a->mb), 0) < 0) st = hp_pps_oom("_add_send_recv");
                /* an F whose next stage is elsewhere sends; the receiver gets the RECV now */
                int fwd = a->type == HP_PP_F && a->stage != num_stages - 1 &&
                          stage_to_rank[a->stage + 1] != stage_to_rank[a->stage];
                int bwd = (a->type == HP_PP_I || a->type == HP_PP_B) && a->stage != 0 &&
                          stage_to_rank[a->stage - 1] != stage_to_rank[a->stage];
                if (st == HP_OK && a->type == HP_PP_MPIPE_F) {   /* to stage 0's rank, after the replica's F */
                    hp_pp_action_t send = {0, HP_PP_MPIPE_SEND_F, a->mb, 0, 0}, recv = {0, HP_PP_MPIPE_RECV_F, a->mb, 0, 0};
                    const int peer = stage_to_rank[0];
                    st = hp_pps_row_push(&o->rows[r], &send);
                    if (st == HP_OK && hp_pps_amap_put(&prev[r], akey(0, send.type, send.mb), 0) < 0) st = hp_pps_oom("_add_send_recv");
                    if (st == HP_OK) st = hp_pps_row_push(&o->rows[peer], &recv);
                    if (st == HP_OK && hp_pps_amap_put(&prev[peer], akey(0, recv.type, recv.mb), 0) < 0) st = hp_pps_oom("_add_send_recv");
                }
                if (st == HP_OK && (fwd || bwd)) {
                    hp_pp_action_t send = {a->stage, fwd ? HP_PP_SEND_F : HP_PP_SEND_B, a->mb, 0, 0};
                    hp_pp_action_t recv = {a->stage + (fwd ? 1 : -1), fwd ? HP_PP_RECV_F : HP_PP_RECV_B, a->mb, 0, 0};
                    int peer = stage_to_rank[recv.stage];
                    st = hp_pps_row_push(&o->rows[r], &send);
                    if (st == HP_OK && hp_pps_amap_put(&prev[r], akey(send.stage, send.type, send.mb), 0) < 0) st = hp_pps_oom("_add_send_recv");
                    if (st == HP_OK) st = hp_pps_row_push(&o->rows[peer], &recv);
                    if (st == HP_OK && hp_pps_amap_put(&prev[peer], akey(recv.stage, recv.type, recv.mb), 0) < 0)
                        st = hp_pps_oom("_add_send_recv");
                }
                }
            }
            pos[r]++;
            progress = 1;
            left += pos[r] < s->rows[r].len;
        }
        if (st == HP_OK && !progress) {
            sb_t b = {0};
            hp_pps_describe_blocked(&b, s, pos, num_stages, stage_to_rank, "waits at", "for", 0);
            st = hp_error(HP_ERR_INVALID_ARG, "Malformed compute schedule, can't schedule sends/recvs: %s; hint: an "
                          "action needs its input computed earlier by an action some rank can reach (check the order "
                          "of F and B across ranks and the stage-to-rank mapping)", b.p ? b.p : "");
            free(b.p);
        }
    }
    for (int r = 0; prev && r < R; r++) hp_pps_amap_free(&prev[r]);
    free(prev);
    free(pos);
    if (st != HP_OK) {
        hp_pp_schedule_free(o);
        return st;
    }
    *out = o;
    return HP_OK;
}

/* ---- the whole lowering ----------------------------------------------------------------------- */
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
                              "present when format='compute_only'.", hp_pps_act_str(a, t, sizeof t), r, i);
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
