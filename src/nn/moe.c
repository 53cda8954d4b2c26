/* The mixture-of-experts feed-forward (TorchTitan's MoE: TokenChoiceTopKRouter, GroupedExperts,
 * shared experts) as one module of the protocol in nn.h: route (gate in f32, sigmoid/softmax,
 * expert_bias for selection only, node-limited groups, route_norm, route_scale), permute the
 * (token, choice) rows to expert-major order (a stable counting sort), one GEMM pass per
 * expert over its contiguous rows, and a deterministic combine (fixed choice order per token).
 * Everything a micro-batch needs is in its activation context; the module keeps only the
 * selection bias and the tokens-per-expert statistic (load balancing, docs/moe.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/nn.h"

static void prof(hp_act_t *act, int op, double t0) {
    if (act->prof) act->prof[op] += omp_get_wtime() - t0;
}

#define P_GATE(m) ((m)->params[0])   // (E, D)
#define P_W1(m) ((m)->params[1])     // (E, F, D)
#define P_W2(m) ((m)->params[2])     // (E, D, F)
#define P_W3(m) ((m)->params[3])     // (E, F, D)
#define P_SW1(m) ((m)->params[4])    // (Fs, D)
#define P_SW2(m) ((m)->params[5])    // (D, Fs)
#define P_SW3(m) ((m)->params[6])    // (Fs, D)

typedef struct moe_saved {
    const float *x;     // (N, D) the module input (the caller's buffer, alive until backward)
    const float *dout;  // (N, D) set by backward_input for backward_weight
    float *scores;      // (N, E) sigmoid / softmax of the gate logits (unbiased)
    int32_t *topk;      // (N, K) chosen experts, best first
    float *gate;        // (N, K) gate values (after route_norm and route_scale)
    int32_t *counts;    // (E) rows per expert in this micro-batch
    int32_t *offsets;   // (E + 1) first row of each expert in the expert-major order
    int32_t *slot_of;   // (N*K) expert-major row j -> slot n*K + k
    int32_t *row_of;    // (N*K) slot n*K + k -> expert-major row j
    float *xs;          // (N*K, D) gathered rows (times the gate under score_before_experts)
    float *h1, *h3;     // (N*K, F) expert w1 / w3 outputs
    float *a;           // (N*K, F) silu(h1) * h3
    float *ys;          // (N*K, D) expert outputs (unscaled)
    float *sh1, *sh3;   // (N, Fs) shared experts
    float *sa;          // (N, Fs)
    /* backward_input keeps these (gradient scratch) for backward_weight */
    float *dys;         // (N*K, D) gradient of the expert outputs (scaled by the gate after)
    float *dh1, *dh3;   // (N*K, F)
    float *dlogits;     // (N, E)
    float *dsh1, *dsh3; // (N, Fs)
    void *dstate;       // the dispatcher's state of this micro-batch (expert parallel)
    int N;
} moe_saved_t;

static int moe_fs(const hp_moe_config_t *c) { return c->n_shared_experts * c->shared_hidden; }

static size_t fl(size_t n) { return hp_arena_round(sizeof(float) * n); }

static size_t moe_act_bytes(const hp_module_t *m, int B, int T) {
    const hp_moe_impl_t *M = m->impl;
    const hp_moe_config_t *c = &M->c;
    const size_t N = (size_t)B * T, NK = N * c->top_k, E = c->n_experts, D = c->dim, F = c->hidden;
    const size_t Fs = moe_fs(c);
    const size_t experts = M->dispatch ? M->dispatch->act_bytes(M->dispatch_ctx, m, (int)N) : 3 * fl(NK * F);
    return hp_arena_round(sizeof(moe_saved_t)) + fl(N * E) + 2 * fl(N * c->top_k) + fl(E) + fl(E + 1) +
           2 * fl(NK) + 2 * fl(NK * D) + hp_arena_round(sizeof(void *)) + experts + (Fs ? 3 * fl(N * Fs) : 0);
}

/* Saved-tensor items (save_items, nn_module.h): the router's scores (the gate GEMM and its score
 * function), its choices (top-k ids, gate values, the expert-major permutation: TorchTitan
 * saves these reductions), the gathered rows, the expert stage (grouped GEMMs, which
 * TorchTitan's op list recomputes; under expert parallel its all-to-alls, which it saves), the
 * shared experts' w1 and w3 outputs and their SwiGLU; the combine (or the shared w2) writes
 * the output. */
enum { MOE_SCORES = 1, MOE_CHOICES, MOE_XS, MOE_EXPERTS, MOE_SH1, MOE_SH3, MOE_SA };

static size_t choices_bytes(size_t N, size_t K, size_t E) {
    return 2 * fl(N * K) + fl(E) + fl(E + 1) + 2 * fl(N * K);
}

static void moe_save_items(const hp_module_t *m, int B, int T, hp_save_list_t *L) {
    const hp_moe_impl_t *M = m->impl;
    const hp_moe_config_t *c = &M->c;
    const size_t N = (size_t)B * T, NK = N * c->top_k, E = c->n_experts, D = c->dim, F = c->hidden;
    const size_t Fs = moe_fs(c);
    const hp_param_t *const *P = (const hp_param_t *const *)m->params;
    hp_save_own_mm(L, m, MOE_SCORES, fl(N * E), 2.0 * N * D * E, &P[0], 1);
    hp_save_own(L, m, MOE_CHOICES, HP_SAVE_CHOICE, choices_bytes(N, c->top_k, E), 0.0);
    hp_save_own(L, m, MOE_XS, HP_SAVE_OTHER, fl(NK * D), 0.0);
    const size_t ex = hp_arena_round(sizeof(void *)) + fl(NK * D) +
                      (M->dispatch ? M->dispatch->act_bytes(M->dispatch_ctx, m, (int)N) : 3 * fl(NK * F));
    hp_save_own(L, m, MOE_EXPERTS, M->dispatch ? HP_SAVE_COMM : HP_SAVE_OTHER, ex, 6.0 * NK * D * F);
    if (Fs) {
        hp_save_own_mm(L, m, MOE_SH1, fl(N * Fs), 2.0 * N * D * Fs, &P[4], 1);
        hp_save_own_mm(L, m, MOE_SH3, fl(N * Fs), 2.0 * N * D * Fs, &P[6], 1);
        hp_save_own(L, m, MOE_SA, HP_SAVE_OTHER, fl(N * Fs), 0.0);
        hp_save_output(L, HP_SAVE_MM, 2.0 * N * Fs * D, &P[5], 1);
    } else {
        hp_save_output(L, HP_SAVE_OTHER, 0.0, NULL, 0);
    }
}

static size_t moe_scratch(const hp_module_t *m, int B, int T) {
    const hp_moe_impl_t *M = m->impl;
    const hp_moe_config_t *c = &M->c;
    const size_t N = (size_t)B * T, NK = N * c->top_k, D = c->dim, F = c->hidden, E = c->n_experts;
    const size_t Fs = moe_fs(c);
    // kept: dys, dh1, dh3, dlogits, dsh1, dsh3; transient: da, dxs, dg, dsa
    const size_t experts = M->dispatch ? M->dispatch->scratch_floats(M->dispatch_ctx, m, (int)N) : 3 * NK * F;
    return NK * D + N * E + 2 * N * Fs + NK * D + NK + N * Fs + experts;
}

/* ---- routing ---------------------------------------------------------------------------- */

/* Top-k of one token: the k largest of v (E) among allowed experts, best first; ties go to
 * the lower index (a fixed rule, so every layout chooses alike). */
static void topk_row(int32_t *idx, const float *v, const unsigned char *allowed, int E, int K) {
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            if (allowed && !allowed[e]) continue;
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= idx[j] == e;
            if (taken) continue;
            if (best < 0 || v[e] > v[best]) best = e;
        }
        idx[k] = best;
    }
}

/* scores: the score function of the logits (in place when logits == s->scores); choices: the
 * top-k and gate values from the scores. Either may be kept from the first forward (a replay
 * under activation checkpointing makes only what was dropped). */
static void route(const hp_moe_impl_t *M, moe_saved_t *s, const float *logits, int N, int scores, int choices) {
    const hp_moe_config_t *c = &M->c;
    const int E = c->n_experts, K = c->top_k, G = c->n_expert_groups;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *sc = s->scores + (size_t)n * E;
        const float *lg = logits + (size_t)n * E;   // may be sc itself: each lg[e] is read before sc[e] is written
        if (!scores) {
        } else if (c->score_fn == HP_MOE_SCORE_SOFTMAX) {
            float mx = lg[0];
            for (int e = 1; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
            double z = 0.0;
            for (int e = 0; e < E; e++) z += exp((double)lg[e] - mx);
            for (int e = 0; e < E; e++) sc[e] = (float)(exp((double)lg[e] - mx) / z);
        } else {
            for (int e = 0; e < E; e++) sc[e] = 1.0f / (1.0f + expf(-lg[e]));
        }
        if (!choices) continue;
        float choice[HP_MOE_MAX_EXPERTS];
        unsigned char allowed[HP_MOE_MAX_EXPERTS];
        for (int e = 0; e < E; e++) choice[e] = sc[e] + (M->expert_bias ? M->expert_bias[e] : 0.0f);
        int use_groups = G > 1 && c->n_limited_groups > 0 && c->n_limited_groups < G;
        if (use_groups) {
            // node-limited routing: a group's score is the sum of its two best biased scores;
            // only the n_limited_groups best groups may be chosen
            const int per = E / G;
            float gs[HP_MOE_MAX_EXPERTS];
            for (int g = 0; g < G; g++) {
                int32_t t2[2];
                const int kk = per >= 2 ? 2 : 1;
                topk_row(t2, choice + g * per, NULL, per, kk);
                gs[g] = choice[g * per + t2[0]] + (kk == 2 ? choice[g * per + t2[1]] : 0.0f);
            }
            int32_t gsel[HP_MOE_MAX_EXPERTS];
            topk_row(gsel, gs, NULL, G, c->n_limited_groups);
            memset(allowed, 0, (size_t)E);
            for (int i = 0; i < c->n_limited_groups; i++)
                memset(allowed + gsel[i] * per, 1, (size_t)per);
        }
        int32_t *ix = s->topk + (size_t)n * K;
        float *gv = s->gate + (size_t)n * K;
        topk_row(ix, choice, use_groups ? allowed : NULL, E, K);
        double sum = 0.0;
        for (int k = 0; k < K; k++) { gv[k] = sc[ix[k]]; sum += gv[k]; }   // gate from unbiased scores
        const float den = (float)sum + 1e-20f;
        for (int k = 0; k < K; k++) gv[k] = (c->route_norm ? gv[k] / den : gv[k]) * c->route_scale;
    }
}

/* Expert-major order: a stable counting sort of the slots n*K + k by expert (TorchTitan's
 * stable argsort of the flattened top-k ids). Serial: O(N*K) integer work, negligible next
 * to the GEMMs, and the order must not depend on threads. */
static void permute(const hp_moe_config_t *c, moe_saved_t *s, int N) {
    const int E = c->n_experts, NK = N * c->top_k;
    memset(s->counts, 0, sizeof(int32_t) * (size_t)E);
    for (int i = 0; i < NK; i++) s->counts[s->topk[i]]++;
    s->offsets[0] = 0;
    for (int e = 0; e < E; e++) s->offsets[e + 1] = s->offsets[e] + s->counts[e];
    int32_t next[HP_MOE_MAX_EXPERTS];
    memcpy(next, s->offsets, sizeof(int32_t) * (size_t)E);
    for (int i = 0; i < NK; i++) {
        const int j = next[s->topk[i]]++;
        s->slot_of[j] = i;
        s->row_of[i] = j;
    }
}

/* ---- grouped experts -------------------------------------------------------------------- */

/* For experts [0, n_local) with rows [off[e], off[e+1]) of xs: h1/h3 = xs W1/W3[e]^T,
 * a = silu(h1) * h3, ys = a W2[e]^T. One GEMM triple per expert over contiguous rows. */
void hp_moe_experts_forward(const hp_backend_t *be, float *ys, float *h1, float *h3, float *a, const float *xs,
                            const float *w1, const float *w2, const float *w3, const int32_t *offsets,
                            int n_local, int D, int F) {
    for (int e = 0; e < n_local; e++) {
        const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        const size_t wo = (size_t)e * F * D;
        be->linear_forward(be->ctx, h1 + (size_t)r0 * F, xs + (size_t)r0 * D, w1 + wo, NULL, n, D, F, 0);
        be->linear_forward(be->ctx, h3 + (size_t)r0 * F, xs + (size_t)r0 * D, w3 + wo, NULL, n, D, F, 0);
    }
    const int64_t R = offsets[n_local] - offsets[0];
    const size_t base = (size_t)offsets[0] * F;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < R * F; i++) {
        const float g = h1[base + i];
        a[base + i] = g / (1.0f + expf(-g)) * h3[base + i];
    }
    for (int e = 0; e < n_local; e++) {
        const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        be->linear_forward(be->ctx, ys + (size_t)r0 * D, a + (size_t)r0 * F, w2 + (size_t)e * D * F, NULL, n, F, D, 0);
    }
}

/* Input gradients: da = dys W2[e], dh1/dh3 by SwiGLU, dxs = dh1 W1[e] + dh3 W3[e]. da is
 * scratch (N*K, F); dh1/dh3 are kept for the weight pass. */
void hp_moe_experts_backward_input(const hp_backend_t *be, float *dxs, float *dh1, float *dh3, float *da,
                                   const float *dys, const float *h1, const float *h3, const float *w1,
                                   const float *w2, const float *w3, const int32_t *offsets, int n_local, int D,
                                   int F) {
    for (int e = 0; e < n_local; e++) {
        const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        be->linear_backward_input(be->ctx, da + (size_t)r0 * F, dys + (size_t)r0 * D, w2 + (size_t)e * D * F, n, F,
                                  D, 0);
    }
    const int64_t R = offsets[n_local] - offsets[0];
    const size_t base = (size_t)offsets[0] * F;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < R * F; i++) {
        const float g = h1[base + i], u = h3[base + i], sg = 1.0f / (1.0f + expf(-g));
        dh1[base + i] = da[base + i] * u * sg * (1.0f + g * (1.0f - sg));
        dh3[base + i] = da[base + i] * g * sg;
    }
    for (int e = 0; e < n_local; e++) {
        const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        const size_t wo = (size_t)e * F * D;
        be->linear_backward_input(be->ctx, dxs + (size_t)r0 * D, dh1 + (size_t)r0 * F, w1 + wo, n, D, F, 0);
        be->linear_backward_input(be->ctx, dxs + (size_t)r0 * D, dh3 + (size_t)r0 * F, w3 + wo, n, D, F, 1);
    }
}

/* Weight gradients (+=): dW2[e] += dys^T a, dW1[e] += dh1^T xs, dW3[e] += dh3^T xs. */
void hp_moe_experts_backward_weight(const hp_backend_t *be, float *dw1, float *dw2, float *dw3, const float *dys,
                                    const float *dh1, const float *dh3, const float *a, const float *xs,
                                    const int32_t *offsets, int n_local, int D, int F) {
    for (int e = 0; e < n_local; e++) {
        const int r0 = offsets[e], n = offsets[e + 1] - offsets[e];
        if (n == 0) continue;
        const size_t wo = (size_t)e * F * D;
        be->linear_backward_weight(be->ctx, dw2 + wo, NULL, dys + (size_t)r0 * D, a + (size_t)r0 * F, n, F, D);
        be->linear_backward_weight(be->ctx, dw1 + wo, NULL, dh1 + (size_t)r0 * F, xs + (size_t)r0 * D, n, D, F);
        be->linear_backward_weight(be->ctx, dw3 + wo, NULL, dh3 + (size_t)r0 * F, xs + (size_t)r0 * D, n, D, F);
    }
}

/* ---- the module ------------------------------------------------------------------------- */

static hp_status_t moe_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    hp_moe_impl_t *M = m->impl;
    const hp_moe_config_t *c = &M->c;
    const int N = act->B * act->T, E = c->n_experts, K = c->top_k, D = c->dim, F = c->hidden, Fs = moe_fs(c);
    const size_t NK = (size_t)N * K;
    if (!in || !out || hp_tensor_numel(in) != (int64_t)N * D || hp_tensor_numel(out) != (int64_t)N * D)
        return hp_error(HP_ERR_INVALID_ARG, "moe '%s': input and output must be f32 (%d, %d)", m->name, N, D);
    const hp_backend_t *be = act->be;
    const float *x = in->data;
    float *y = out->data;
    moe_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    memset(s, 0, sizeof(*s));
    s->N = N;
    s->x = x;
    // the items (moe_save_items), each one block; a replay makes only the dropped ones
    int run_sc, run_ch, run_xs, run_ex;
    s->scores = hp_act_save(act, m, MOE_SCORES, sizeof(float) * (size_t)N * E, &run_sc);
    char *ch = hp_act_save(act, m, MOE_CHOICES, choices_bytes((size_t)N, (size_t)K, (size_t)E), &run_ch);
    s->topk = (int32_t *)ch;
    s->gate = (float *)(ch += fl(NK));
    s->counts = (int32_t *)(ch += fl(NK));
    s->offsets = (int32_t *)(ch += fl((size_t)E));
    s->slot_of = (int32_t *)(ch += fl((size_t)E + 1));
    s->row_of = (int32_t *)(ch + fl(NK));
    s->xs = hp_act_save(act, m, MOE_XS, sizeof(float) * NK * D, &run_xs);
    const int keep_ex = hp_act_save_kept(act, m, MOE_EXPERTS);
    char *ex = hp_act_save(act, m, MOE_EXPERTS, hp_arena_round(sizeof(void *)) + fl(NK * D) +
                           (M->dispatch ? 0 : 3 * fl(NK * (size_t)F)), &run_ex);
    void **dstate = (void **)ex;   // the expert stage's state of this micro-batch, found again by a replay
    s->ys = (float *)(ex += hp_arena_round(sizeof(void *)));
    if (!M->dispatch) {
        s->h1 = (float *)(ex += fl(NK * D));
        s->h3 = (float *)(ex += fl(NK * (size_t)F));
        s->a = (float *)(ex + fl(NK * (size_t)F));
    }
    double t0 = omp_get_wtime();
    // router logits into the scores buffer; route() turns each row into scores in place
    if (run_sc) be->linear_forward(be->ctx, s->scores, x, hp_param_w(P_GATE(m)), NULL, N, D, E, 0);
    if (run_sc || run_ch) route(M, s, s->scores, N, run_sc, run_ch);
    if (run_ch) permute(c, s, N);
    if (M->tokens_per_expert && !act->replay)   // load-balancing statistic (no gradient), once per micro-batch
        for (int e = 0; e < E; e++) M->tokens_per_expert[e] += (float)s->counts[e];
    if (c->aux_loss_coeff > 0.0f && !act->replay) {   // coeff * E * sum_e f_e p_e (fixed order, double)
        double aux = 0.0;
        for (int e = 0; e < E; e++) {
            double p = 0.0;
            for (int n = 0; n < N; n++) p += s->scores[(size_t)n * E + e];
            aux += (double)s->counts[e] / (double)NK * (p / N);
        }
        M->aux_loss_sum += c->aux_loss_coeff * E * aux;
    }
    if (run_xs) {
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < (int64_t)NK; j++) {
            const int slot = s->slot_of[j];
            const float *xr = x + (size_t)(slot / K) * D;
            float *dst = s->xs + (size_t)j * D;
            const float g = c->score_before_experts ? s->gate[slot] : 1.0f;
            for (int d = 0; d < D; d++) dst[d] = xr[d] * g;
        }
    }
    prof(act, HP_NN_OP_MOE_ROUTE, t0);
    t0 = omp_get_wtime();
    if (!run_ex) {
        s->dstate = *dstate;
    } else if (M->dispatch) {   // expert parallel: dispatch, local experts, combine back (profiles itself)
        hp_act_keep_begin(act, keep_ex);   // its state is kept with the item
        hp_status_t st = M->dispatch->forward(M->dispatch_ctx, m, act, s->ys, s->xs, s->offsets, &s->dstate);
        hp_act_keep_end(act, keep_ex);
        HP_TRY(st);
        *dstate = s->dstate;
    } else {
        hp_moe_experts_forward(be, s->ys, s->h1, s->h3, s->a, s->xs, hp_param_w(P_W1(m)), hp_param_w(P_W2(m)),
                               hp_param_w(P_W3(m)), s->offsets, E, D, F);
        prof(act, HP_NN_OP_MOE_EXPERTS, t0);
    }
    const int write = !hp_act_out_kept(act, m);   // the replay leaves a kept output alone
    t0 = omp_get_wtime();
    // combine: out[n] += sum_k (gate) ys[row(n, k)], choices in their fixed order
    if (write) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float *yr = y + (size_t)n * D;
            for (int k = 0; k < K; k++) {
                const int slot = n * K + k;
                const float g = c->score_before_experts ? 1.0f : s->gate[slot];
                const float *src = s->ys + (size_t)s->row_of[slot] * D;
                for (int d = 0; d < D; d++) yr[d] += g * src[d];
            }
        }
    }
    prof(act, HP_NN_OP_MOE_COMBINE, t0);
    if (Fs > 0) {   // shared experts: a dense SwiGLU feed-forward of hidden n_shared * shared_hidden
        t0 = omp_get_wtime();
        int run1, run3, runa;
        s->sh1 = hp_act_save(act, m, MOE_SH1, sizeof(float) * (size_t)N * Fs, &run1);
        s->sh3 = hp_act_save(act, m, MOE_SH3, sizeof(float) * (size_t)N * Fs, &run3);
        s->sa = hp_act_save(act, m, MOE_SA, sizeof(float) * (size_t)N * Fs, &runa);
        if (run1) be->linear_forward(be->ctx, s->sh1, x, hp_param_w(P_SW1(m)), NULL, N, D, Fs, 0);
        if (run3) be->linear_forward(be->ctx, s->sh3, x, hp_param_w(P_SW3(m)), NULL, N, D, Fs, 0);
        if (runa) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < (int64_t)N * Fs; i++) {
                const float g = s->sh1[i];
                s->sa[i] = g / (1.0f + expf(-g)) * s->sh3[i];
            }
        }
        if (write) be->linear_forward(be->ctx, y, s->sa, hp_param_w(P_SW2(m)), NULL, N, Fs, D, 1);   // y += (residual)
        prof(act, HP_NN_OP_MOE_EXPERTS, t0);
    }
    return HP_OK;
}

static hp_status_t moe_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    hp_moe_impl_t *M = m->impl;
    const hp_moe_config_t *c = &M->c;
    moe_saved_t *s = hp_act_slot(act, m);
    const int N = s->N, E = c->n_experts, K = c->top_k, D = c->dim, F = c->hidden, Fs = moe_fs(c);
    const size_t NK = (size_t)N * K;
    const hp_backend_t *be = act->be;
    const float *dy = dout->data, *x = s->x;
    float *dx = din->data;
    s->dout = dy;
    size_t off = 0;
    s->dys = hp_act_scratch(act, &off, NK * D);
    if (!M->dispatch) {
        s->dh1 = hp_act_scratch(act, &off, NK * F);
        s->dh3 = hp_act_scratch(act, &off, NK * F);
    }
    s->dlogits = hp_act_scratch(act, &off, (size_t)N * E);
    if (Fs) {
        s->dsh1 = hp_act_scratch(act, &off, (size_t)N * Fs);
        s->dsh3 = hp_act_scratch(act, &off, (size_t)N * Fs);
    }
    float *da = M->dispatch ? NULL : hp_act_scratch(act, &off, NK * F);
    float *dxs = hp_act_scratch(act, &off, NK * D);
    float *dg = hp_act_scratch(act, &off, NK);   // (N, K) gradient of the gate values
    double t0 = omp_get_wtime();
    // combine backward: dys[j] = g * dout[n] (after) or dout[n] (before); dg = dout . ys (after)
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < (int64_t)NK; j++) {
        const int slot = s->slot_of[j];
        const float *dr = dy + (size_t)(slot / K) * D;
        const float *yr = s->ys + (size_t)j * D;
        float *dst = s->dys + (size_t)j * D;
        if (c->score_before_experts) {
            memcpy(dst, dr, sizeof(float) * (size_t)D);
        } else {
            const float g = s->gate[slot];
            double dot = 0.0;
            for (int d = 0; d < D; d++) { dst[d] = g * dr[d]; dot += (double)dr[d] * yr[d]; }
            dg[slot] = (float)dot;
        }
    }
    prof(act, HP_NN_OP_MOE_COMBINE, t0);
    t0 = omp_get_wtime();
    if (M->dispatch) {
        HP_TRY(M->dispatch->backward_input(M->dispatch_ctx, m, act, s->dstate, dxs, s->dys, &off));
    } else {
        hp_moe_experts_backward_input(be, dxs, s->dh1, s->dh3, da, s->dys, s->h1, s->h3, hp_param_w(P_W1(m)),
                                      hp_param_w(P_W2(m)), hp_param_w(P_W3(m)), s->offsets, E, D, F);
        prof(act, HP_NN_OP_MOE_EXPERTS, t0);
    }
    t0 = omp_get_wtime();
    // un-permute: dx[n] = sum_k (gate under score-before) dxs[row(n, k)], fixed k order
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *dr = dx + (size_t)n * D;
        const float *xr = x + (size_t)n * D;
        memset(dr, 0, sizeof(float) * (size_t)D);
        for (int k = 0; k < K; k++) {
            const int slot = n * K + k;
            const float *src = dxs + (size_t)s->row_of[slot] * D;
            if (c->score_before_experts) {
                const float g = s->gate[slot];
                double dot = 0.0;
                for (int d = 0; d < D; d++) { dr[d] += g * src[d]; dot += (double)src[d] * xr[d]; }
                dg[slot] = (float)dot;
            } else {
                for (int d = 0; d < D; d++) dr[d] += src[d];
            }
        }
        // router: gate values -> scores -> logits (top-k choice and expert_bias carry no gradient)
        const float *sc = s->scores + (size_t)n * E;
        const int32_t *ix = s->topk + (size_t)n * K;
        const float *g = dg + (size_t)n * K;
        float *dl = s->dlogits + (size_t)n * E;
        float ds[HP_MOE_MAX_EXPERTS];
        memset(ds, 0, sizeof(float) * (size_t)E);
        if (c->route_norm) {   // g_k = rs * s_k / S, S = sum_j s_j + 1e-20
            double S = 0.0, gs = 0.0;
            for (int k = 0; k < K; k++) S += sc[ix[k]];
            const float Sf = (float)S + 1e-20f;
            for (int k = 0; k < K; k++) gs += (double)g[k] * sc[ix[k]];
            for (int k = 0; k < K; k++)
                ds[ix[k]] += c->route_scale * (float)(g[k] / Sf - gs / ((double)Sf * Sf));
        } else {
            for (int k = 0; k < K; k++) ds[ix[k]] += c->route_scale * g[k];
        }
        if (c->aux_loss_coeff > 0.0f)   // d aux / d s[n, e] = coeff * E * f_e / N
            for (int e = 0; e < E; e++)
                ds[e] += c->aux_loss_coeff * (float)E * ((float)s->counts[e] / (float)NK) / (float)N;
        if (c->score_fn == HP_MOE_SCORE_SOFTMAX) {
            double dot = 0.0;
            for (int e = 0; e < E; e++) dot += (double)ds[e] * sc[e];
            for (int e = 0; e < E; e++) dl[e] = sc[e] * (float)(ds[e] - dot);
        } else {
            for (int e = 0; e < E; e++) dl[e] = ds[e] * sc[e] * (1.0f - sc[e]);
        }
    }
    be->linear_backward_input(be->ctx, dx, s->dlogits, hp_param_w(P_GATE(m)), N, D, E, 1);
    prof(act, HP_NN_OP_MOE_ROUTE, t0);
    if (Fs > 0) {
        t0 = omp_get_wtime();
        float *dsa = hp_act_scratch(act, &off, (size_t)N * Fs);
        be->linear_backward_input(be->ctx, dsa, dy, hp_param_w(P_SW2(m)), N, Fs, D, 0);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < (int64_t)N * Fs; i++) {
            const float gg = s->sh1[i], u = s->sh3[i], sg = 1.0f / (1.0f + expf(-gg));
            s->dsh1[i] = dsa[i] * u * sg * (1.0f + gg * (1.0f - sg));
            s->dsh3[i] = dsa[i] * gg * sg;
        }
        be->linear_backward_input(be->ctx, dx, s->dsh1, hp_param_w(P_SW1(m)), N, D, Fs, 1);
        be->linear_backward_input(be->ctx, dx, s->dsh3, hp_param_w(P_SW3(m)), N, D, Fs, 1);
        prof(act, HP_NN_OP_MOE_EXPERTS, t0);
    }
    return HP_OK;
}

static hp_status_t moe_backward_weight(hp_module_t *m, hp_act_t *act) {
    hp_moe_impl_t *M = m->impl;
    const hp_moe_config_t *c = &M->c;
    moe_saved_t *s = hp_act_slot(act, m);
    const int N = s->N, E = c->n_experts, D = c->dim, F = c->hidden, Fs = moe_fs(c);
    const hp_backend_t *be = act->be;
    double t0 = omp_get_wtime();
    if (M->dispatch)
        HP_TRY(M->dispatch->backward_weight(M->dispatch_ctx, m, act, s->dstate));
    else
        hp_moe_experts_backward_weight(be, hp_param_g(P_W1(m)), hp_param_g(P_W2(m)), hp_param_g(P_W3(m)), s->dys,
                                       s->dh1, s->dh3, s->a, s->xs, s->offsets, E, D, F);
    if (Fs > 0) {
        be->linear_backward_weight(be->ctx, hp_param_g(P_SW2(m)), NULL, s->dout, s->sa, N, Fs, D);
        be->linear_backward_weight(be->ctx, hp_param_g(P_SW1(m)), NULL, s->dsh1, s->x, N, D, Fs);
        be->linear_backward_weight(be->ctx, hp_param_g(P_SW3(m)), NULL, s->dsh3, s->x, N, D, Fs);
    }
    prof(act, HP_NN_OP_MOE_EXPERTS, t0);
    t0 = omp_get_wtime();
    be->linear_backward_weight(be->ctx, hp_param_g(P_GATE(m)), NULL, s->dlogits, s->x, N, D, E);
    prof(act, HP_NN_OP_MOE_ROUTE, t0);
    return HP_OK;
}

static const hp_module_ops_t moe_ops = {
    "moe", moe_act_bytes, moe_scratch, moe_forward, moe_backward_input, moe_backward_weight, NULL, moe_save_items,
};

hp_status_t hp_moe_config_check(const hp_moe_config_t *c, const char *what) {
    if (!what) what = "moe";
    if (!c) return hp_error(HP_ERR_INVALID_ARG, "%s: config is NULL", what);
    if (c->dim <= 0 || c->hidden <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "%s: dim %d and moe hidden %d must be > 0", what, c->dim, c->hidden);
    if (c->n_experts < 1 || c->n_experts > HP_MOE_MAX_EXPERTS)
        return hp_error(HP_ERR_INVALID_ARG, "%s: num_experts = %d, expected 1 .. %d (HP_MOE_MAX_EXPERTS)", what,
                        c->n_experts, HP_MOE_MAX_EXPERTS);
    if (c->top_k < 1 || c->top_k > c->n_experts)
        return hp_error(HP_ERR_INVALID_ARG, "%s: top_k = %d, expected 1 .. num_experts (%d); hint: lower top_k or "
                        "add experts", what, c->top_k, c->n_experts);
    if (c->score_fn != HP_MOE_SCORE_SIGMOID && c->score_fn != HP_MOE_SCORE_SOFTMAX)
        return hp_error(HP_ERR_INVALID_ARG, "%s: score_func %d, expected sigmoid or softmax", what, c->score_fn);
    if (!(c->route_scale > 0.0f))
        return hp_error(HP_ERR_INVALID_ARG, "%s: route_scale = %g, expected > 0", what, c->route_scale);
    if (!(c->aux_loss_coeff >= 0.0f))
        return hp_error(HP_ERR_INVALID_ARG, "%s: aux_loss_coeff = %g, expected >= 0 (0: off)", what, c->aux_loss_coeff);
    if (c->n_shared_experts < 0 || (c->n_shared_experts > 0 && c->shared_hidden <= 0))
        return hp_error(HP_ERR_INVALID_ARG, "%s: num_shared_experts = %d with shared hidden %d, expected >= 0 (and "
                        "a hidden > 0 when shared experts are on)", what, c->n_shared_experts, c->shared_hidden);
    if (c->n_expert_groups > 1) {
        if (c->n_experts % c->n_expert_groups != 0)
            return hp_error(HP_ERR_INVALID_ARG, "%s: num_experts %d is not divisible by num_expert_groups %d", what,
                            c->n_experts, c->n_expert_groups);
        if (c->n_limited_groups < 1 || c->n_limited_groups > c->n_expert_groups)
            return hp_error(HP_ERR_INVALID_ARG, "%s: num_limited_groups = %d, expected 1 .. num_expert_groups (%d)",
                            what, c->n_limited_groups, c->n_expert_groups);
        if ((int64_t)c->n_limited_groups * (c->n_experts / c->n_expert_groups) < c->top_k)
            return hp_error(HP_ERR_INVALID_ARG, "%s: num_limited_groups %d x %d experts per group < top_k %d: not "
                            "enough experts to choose from", what, c->n_limited_groups,
                            c->n_experts / c->n_expert_groups, c->top_k);
    }
    return HP_OK;
}

hp_status_t hp_moe_module_init(hp_module_t *m, hp_moe_impl_t *impl, const char *name, const hp_moe_config_t *c,
                               hp_param_t **params, int n_params, float *expert_bias, float *tokens_per_expert) {
    HP_TRY(hp_moe_config_check(c, name));
    const int want = c->n_shared_experts > 0 ? 7 : 4;
    if (n_params != want)
        return hp_error(HP_ERR_INVALID_ARG, "moe '%s': %d params, expected %d (gate, w1, w2, w3%s)", name, n_params,
                        want, want == 7 ? ", shared w1, w2, w3" : "");
    memset(impl, 0, sizeof(*impl));
    impl->c = *c;
    impl->expert_bias = expert_bias;
    impl->tokens_per_expert = tokens_per_expert;
    hp_module_base_init(m, &moe_ops, name, impl);
    for (int i = 0; i < n_params; i++) m->params[m->n_params++] = params[i];
    return HP_OK;
}

int hp_module_is_moe(const hp_module_t *m) { return m && m->ops == &moe_ops; }

double hp_moe_update_expert_bias(float *bias, const float *counts, int E, float coeff) {
    double sum = 0.0, mx = 0.0;
    for (int e = 0; e < E; e++) {
        sum += counts[e];
        mx = counts[e] > mx ? counts[e] : mx;
    }
    const double mean = sum / E;
    if (coeff > 0.0f && bias) {
        float delta[HP_MOE_MAX_EXPERTS];
        double dm = 0.0;
        for (int e = 0; e < E; e++) {
            const double d = mean - counts[e];
            delta[e] = coeff * (float)((d > 0) - (d < 0));
            dm += delta[e];
        }
        dm /= E;
        for (int e = 0; e < E; e++) bias[e] += delta[e] - (float)dm;
    }
    return mean > 0 ? mx / mean : 0.0;
}
