/* Expert parallelism (include/hyperparallel/ep.h): expert sharding of the MoE modules over the
 * ep mesh and the all-to-all dispatcher (hp_moe_dispatch_t) that runs their expert stage:
 * counts, rows, permutation to local expert-major order, local grouped experts and back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/ep.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/dtensor.h"

struct hp_ep {
    hp_mesh_t mesh;
    hp_comm_t comm;
    int rank, size;
    size_t expert_bytes;
    int tp;             /* 1: tensor parallel of the experts (hidden F sharded), not expert parallel */
    /* expert tensor parallel on [ep, tp]: the experts' hidden F is also sharded over tp_comm
     * and the combined outputs / input gradients are all-reduced over it */
    hp_comm_t tp_comm;
    int tp_size, tp_rank;
    /* FSDP of the experts over efsdp: each rank keeps 1/efsdp of its ep rank's experts; the
     * weights are all-gathered into ws_w for each use, the grads computed into ws_g and
     * reduce-scattered (one layer at a time: the workspace is shared by the layers) */
    hp_comm_t fs_comm;
    int fs_size, fs_rank;
    int fs_dim1;            /* Shard(1) over efsdp (efsdp x ep > E): each rank keeps 1/efsdp of
                               dim 1 of every local expert; gathered blocks are re-laid out */
    float *ws_w, *ws_g;     // (3, efsdp x shard floats)
    hp_mesh_t dense_tp;     /* ETP: the tp mesh of the dense parameters' TP plan */
    /* sequence parallel around the MoE layers (hp_ep_enable_sequence_parallel): the MoE input
     * is Shard(seq) over sp_comm (the tp dim), each tp rank routes its own tokens; the router's
     * and shared experts' grads are Partial over it. With the experts' F also sharded over tp
     * (sq = tp: TP of the experts, ETP) every row goes to the sq ranks holding its expert's F
     * slices over g_comm (the (ep, tp) ranks, ep-major) and the sq partial outputs coming back
     * are summed by the sender (TorchTitan's all-gather to Replicate + reduce-scatter) */
    hp_comm_t sp_comm;
    int sq;
    hp_mesh_t g_mesh;       // (ep x tp) flattened (ETP)
    hp_comm_t g_comm;
};

/* Shard(1) re-layout between the whole local experts (El, d1, rest) and the rank-major blocks
 * of a collective over efsdp (Fs, El, d1/Fs, rest); loc: the local shard (El, d1/Fs, rest).
 * to_blocks 0: whole[e, f c + i] = blocks[f, e, i]; 1: the reverse. */
static void dim1_blocks(const hp_tensor_t *loc, int Fs, float *whole, float *blocks, int to_blocks) {
    const int64_t El = loc->shape[0], c = loc->shape[1], rest = loc->shape[2];
#pragma omp parallel for collapse(2) schedule(static)
    for (int f = 0; f < Fs; f++)
        for (int64_t e = 0; e < El; e++) {
            float *w = whole + ((size_t)e * Fs * c + (size_t)f * c) * rest, *b = blocks + (((size_t)f * El + e) * c) * rest;
            if (to_blocks) memcpy(b, w, sizeof(float) * (size_t)(c * rest));
            else memcpy(w, b, sizeof(float) * (size_t)(c * rest));
        }
}

/* The local experts' whole weights: the parameters themselves, or (expert FSDP) the shards
 * all-gathered over efsdp into the workspace. */
static hp_status_t ep_weights(struct hp_ep *ep, hp_module_t *m, const float **w) {
    const hp_param_t *ps[3] = {m->params[1], m->params[2], m->params[3]};
    if (ep->fs_size <= 1) {
        for (int k = 0; k < 3; k++) w[k] = hp_param_w(ps[k]);
        return HP_OK;
    }
    const size_t n = (size_t)hp_tensor_numel(&ps[0]->value.local), full = n * ep->fs_size;
    for (int k = 0; k < 3; k++) {
        // Shard(1): gathered (efsdp, El, d1/efsdp, rest) into ws_g (free outside the weight pass)
        float *dst = ep->fs_dim1 ? ep->ws_g + k * full : ep->ws_w + k * full;
        HP_TRY(hp_all_gather(hp_param_w(ps[k]), dst, n, HP_F32, ep->fs_comm, NULL));
        if (ep->fs_dim1) dim1_blocks(&ps[k]->value.local, ep->fs_size, ep->ws_w + k * full, dst, 0);
        w[k] = ep->ws_w + k * full;
    }
    return HP_OK;
}

static int ep_fl(const struct hp_ep *ep, const hp_module_t *m) {
    return ((const hp_moe_impl_t *)m->impl)->c.hidden / (ep->tp_size > 1 ? ep->tp_size : 1);
}

#define W1(m) ((m)->params[1])   // local (E/ep, F, D)
#define W2(m) ((m)->params[2])   // local (E/ep, D, F)
#define W3(m) ((m)->params[3])

typedef struct ep_state {
    int R;              // rows this rank's experts received
    int32_t *rc;        // (G, El) rows from rank p for local expert j (G = ep, or ep x tp)
    int32_t *sc;        // (G, El) rows to rank g per expert of its ep rank
    size_t *qdis;       // (G) receive displacements of the returning rows (sq > 1)
    int32_t *loff;      // (El + 1) local expert-major offsets
    int32_t *perm;      // (Rmax) local expert-major row -> rank-major row
    size_t *scnt, *sdis, *rcnt, *rdis;   // (ep) all_to_all_v counts / displacements (floats)
    float *buf;         // (Rmax, D) rank-major rows (receive / send side)
    float *xl, *yl;     // (Rmax, D) local expert-major input and output
    float *h1, *h3, *a; // (Rmax, F)
    float *dyl, *dh1, *dh3;   // backward, kept for the weight pass (gradient scratch)
} ep_state_t;

static void prof(hp_act_t *act, int op, double t0) {
    if (act->prof) act->prof[op] += omp_get_wtime() - t0;
}

/* Ranks each row goes to per ep rank (1, or tp when the experts' F is sharded over the tp
 * ranks and the tokens are sequence-sharded over them) and the ranks of the exchange. */
static int ep_q(const struct hp_ep *ep) { return ep->sq > 1 ? ep->sq : 1; }
static int ep_g(const struct hp_ep *ep) { return ep->size * ep_q(ep); }

static size_t rmax(const hp_ep_t ep, const hp_module_t *m, int N) {
    const hp_moe_impl_t *M = m->impl;
    return (size_t)ep_g(ep) * N * M->c.top_k;
}

static size_t ep_act_bytes(void *ctx, const hp_module_t *m, int N) {
    hp_ep_t ep = ctx;
    const hp_moe_impl_t *M = m->impl;
    const size_t R = rmax(ep, m, N), El = (size_t)M->c.n_experts / ep->size, D = M->c.dim, F = ep_fl(ep, m),
                 G = (size_t)ep_g(ep);
    return hp_arena_round(sizeof(ep_state_t)) + 2 * hp_arena_round(sizeof(int32_t) * G * El) +
           hp_arena_round(sizeof(int32_t) * (El + 1)) + hp_arena_round(sizeof(int32_t) * R) +
           5 * hp_arena_round(sizeof(size_t) * G) + 3 * hp_arena_round(sizeof(float) * R * D) +
           3 * hp_arena_round(sizeof(float) * R * F);
}

static size_t ep_scratch(void *ctx, const hp_module_t *m, int N) {
    hp_ep_t ep = ctx;
    const hp_moe_impl_t *M = m->impl;
    const size_t R = rmax(ep, m, N);
    return R * (2 * (size_t)M->c.dim + 3 * (size_t)ep_fl(ep, m));   // dyl, dxl; dh1, dh3, da
}

/* dst[i] = src[perm[i]] (gather) or dst[perm[i]] = src[i] (scatter), rows of w floats. */
static void permute_rows(float *dst, const float *src, const int32_t *perm, int R, int w, int scatter) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < R; i++) {
        const size_t di = scatter ? (size_t)perm[i] : (size_t)i, si = scatter ? (size_t)i : (size_t)perm[i];
        memcpy(dst + di * w, src + si * w, sizeof(float) * (size_t)w);
    }
}

/* sq > 1: the rows came back from the sq ranks holding the F slices of each ep rank's
 * experts (block g = (q, t) at qdis[g]); their partial sums, added in t order, go to dst at
 * the rows of ep rank q's experts. */
static void sum_slices(float *dst, const float *ret, const ep_state_t *s, int P, int Q) {
    for (int q = 0; q < P; q++) {
        const int64_t n = (int64_t)s->scnt[q * Q];
        float *d = dst + s->sdis[q * Q];
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) {
            float acc = ret[s->qdis[q * Q] + (size_t)i];
            for (int t = 1; t < Q; t++) acc += ret[s->qdis[q * Q + t] + (size_t)i];
            d[i] = acc;
        }
    }
}

static hp_status_t ep_forward(void *ctx, hp_module_t *m, hp_act_t *act, float *ys, const float *xs,
                              const int32_t *offsets, void **state) {
    hp_ep_t ep = ctx;
    hp_moe_impl_t *M = m->impl;
    const int P = ep->size, Q = ep_q(ep), G = P * Q, E = M->c.n_experts, El = E / P, D = M->c.dim, F = ep_fl(ep, m);
    hp_comm_t gc = Q > 1 ? ep->g_comm : ep->comm;
    const int N = act->B * act->T;
    const size_t Rm = rmax(ep, m, N);
    double t0 = omp_get_wtime();
    ep_state_t *s = hp_act_alloc(act, sizeof(*s));
    *state = s;
    s->rc = hp_act_alloc(act, sizeof(int32_t) * (size_t)G * El);
    s->sc = hp_act_alloc(act, sizeof(int32_t) * (size_t)G * El);
    s->loff = hp_act_alloc(act, sizeof(int32_t) * (size_t)(El + 1));
    s->perm = hp_act_alloc(act, sizeof(int32_t) * Rm);
    s->scnt = hp_act_alloc(act, sizeof(size_t) * G);
    s->sdis = hp_act_alloc(act, sizeof(size_t) * G);
    s->rcnt = hp_act_alloc(act, sizeof(size_t) * G);
    s->rdis = hp_act_alloc(act, sizeof(size_t) * G);
    s->qdis = hp_act_alloc(act, sizeof(size_t) * G);
    s->buf = hp_act_alloc(act, sizeof(float) * Rm * D);
    s->xl = hp_act_alloc(act, sizeof(float) * Rm * D);
    s->yl = hp_act_alloc(act, sizeof(float) * Rm * D);
    s->h1 = hp_act_alloc(act, sizeof(float) * Rm * F);
    s->h3 = hp_act_alloc(act, sizeof(float) * Rm * F);
    s->a = hp_act_alloc(act, sizeof(float) * Rm * F);
    // 1. count exchange: my rows per expert, block g (the experts of ep rank g / Q) to rank g
    for (int g = 0; g < G; g++)
        for (int j = 0; j < El; j++) {
            const int e = (g / Q) * El + j;
            s->sc[g * El + j] = offsets[e + 1] - offsets[e];
        }
    HP_TRY(hp_all_to_all(s->sc, s->rc, (size_t)El, HP_I32, gc, NULL));
    // 2. splits: rows to ep rank q are contiguous in expert-major order (sent to each of its Q ranks)
    size_t ro = 0, qo = 0;
    for (int g = 0; g < G; g++) {
        const int q = g / Q;
        s->scnt[g] = (size_t)(offsets[(q + 1) * El] - offsets[q * El]) * D;
        s->sdis[g] = (size_t)offsets[q * El] * D;
        s->qdis[g] = qo;
        qo += s->scnt[g];
        size_t r = 0;
        for (int j = 0; j < El; j++) r += (size_t)s->rc[g * El + j];
        s->rcnt[g] = r * D;
        s->rdis[g] = ro;
        ro += s->rcnt[g];
    }
    s->R = (int)(ro / D);
    HP_ASSERT((size_t)s->R <= Rm);
    HP_TRY(hp_all_to_all_v(xs, s->scnt, s->sdis, s->buf, s->rcnt, s->rdis, HP_F32, gc, NULL));
    // 3. rank-major (p, j) -> expert-major (j, p)
    s->loff[0] = 0;
    for (int j = 0; j < El; j++) {
        int n = 0;
        for (int p = 0; p < G; p++) n += s->rc[p * El + j];
        s->loff[j + 1] = s->loff[j] + n;
    }
    for (int j = 0, i = 0; j < El; j++)
        for (int p = 0; p < G; p++) {
            int base = (int)(s->rdis[p] / D);
            for (int jj = 0; jj < j; jj++) base += s->rc[p * El + jj];
            for (int r = 0; r < s->rc[p * El + j]; r++) s->perm[i++] = base + r;
        }
    permute_rows(s->xl, s->buf, s->perm, s->R, D, 0);
    prof(act, HP_NN_OP_MOE_DISPATCH, t0);
    // 4. the local experts
    const float *w[3];
    HP_TRY(ep_weights(ep, m, w));
    t0 = omp_get_wtime();
    hp_moe_experts_forward(act->be, s->yl, s->h1, s->h3, s->a, s->xl, w[0], w[1], w[2], s->loff, El, D, F);
    prof(act, HP_NN_OP_MOE_EXPERTS, t0);
    // 5. back: expert-major -> rank-major, reverse all_to_all_v
    t0 = omp_get_wtime();
    permute_rows(s->buf, s->yl, s->perm, s->R, D, 1);
    if (Q > 1) {   // F slices of the (sequence-sharded) rows: Q partial outputs per row, summed here
        HP_TRY(hp_all_to_all_v(s->buf, s->rcnt, s->rdis, s->yl, s->scnt, s->qdis, HP_F32, gc, NULL));   // yl: free
        sum_slices(ys, s->yl, s, P, Q);
    } else {
        HP_TRY(hp_all_to_all_v(s->buf, s->rcnt, s->rdis, ys, s->scnt, s->sdis, HP_F32, gc, NULL));
        if (ep->tp_size > 1)   // ETP, tokens Replicate over tp: each tp rank computed its F slice: Partial -> Replicate
            HP_TRY(hp_all_reduce(ys, ys, (size_t)offsets[E] * D, HP_F32, HP_SUM, ep->tp_comm, NULL));
    }
    prof(act, HP_NN_OP_MOE_DISPATCH, t0);
    return HP_OK;
}

static hp_status_t ep_backward_input(void *ctx, hp_module_t *m, hp_act_t *act, void *state, float *dxs,
                                     const float *dys, size_t *off) {
    hp_ep_t ep = ctx;
    hp_moe_impl_t *M = m->impl;
    ep_state_t *s = state;
    const int P = ep->size, Q = ep_q(ep), El = M->c.n_experts / P, D = M->c.dim, F = ep_fl(ep, m);
    hp_comm_t gc = Q > 1 ? ep->g_comm : ep->comm;
    const size_t Rm = rmax(ep, m, act->B * act->T);
    s->dyl = hp_act_scratch(act, off, Rm * D);
    s->dh1 = hp_act_scratch(act, off, Rm * F);
    s->dh3 = hp_act_scratch(act, off, Rm * F);
    float *da = hp_act_scratch(act, off, Rm * F), *dxl = hp_act_scratch(act, off, Rm * D);
    double t0 = omp_get_wtime();
    HP_TRY(hp_all_to_all_v(dys, s->scnt, s->sdis, s->buf, s->rcnt, s->rdis, HP_F32, gc, NULL));
    permute_rows(s->dyl, s->buf, s->perm, s->R, D, 0);
    prof(act, HP_NN_OP_MOE_DISPATCH, t0);
    const float *w[3];
    HP_TRY(ep_weights(ep, m, w));
    t0 = omp_get_wtime();
    hp_moe_experts_backward_input(act->be, dxl, s->dh1, s->dh3, da, s->dyl, s->h1, s->h3, w[0], w[1], w[2], s->loff,
                                  El, D, F);
    prof(act, HP_NN_OP_MOE_EXPERTS, t0);
    t0 = omp_get_wtime();
    permute_rows(s->buf, dxl, s->perm, s->R, D, 1);
    if (Q > 1) {   // partial over the F slices: the Q copies of each row's gradient summed here
        HP_TRY(hp_all_to_all_v(s->buf, s->rcnt, s->rdis, dxl, s->scnt, s->qdis, HP_F32, gc, NULL));   // dxl: free
        sum_slices(dxs, dxl, s, P, Q);
    } else {
        HP_TRY(hp_all_to_all_v(s->buf, s->rcnt, s->rdis, dxs, s->scnt, s->sdis, HP_F32, gc, NULL));
        if (ep->tp_size > 1) {   // ETP, tokens Replicate over tp: partial over the F slices
            size_t floats = 0;
            for (int q = 0; q < P; q++) floats += s->scnt[q];
            HP_TRY(hp_all_reduce(dxs, dxs, floats, HP_F32, HP_SUM, ep->tp_comm, NULL));
        }
    }
    prof(act, HP_NN_OP_MOE_DISPATCH, t0);
    return HP_OK;
}

static hp_status_t ep_backward_weight(void *ctx, hp_module_t *m, hp_act_t *act, void *state) {
    hp_ep_t ep = ctx;
    hp_moe_impl_t *M = m->impl;
    ep_state_t *s = state;
    double t0 = omp_get_wtime();
    if (ep->fs_size <= 1) {
        hp_moe_experts_backward_weight(act->be, hp_param_g(W1(m)), hp_param_g(W2(m)), hp_param_g(W3(m)), s->dyl,
                                       s->dh1, s->dh3, s->a, s->xl, s->loff, M->c.n_experts / ep->size, M->c.dim,
                                       ep_fl(ep, m));
        prof(act, HP_NN_OP_MOE_EXPERTS, t0);
        return HP_OK;
    }
    // expert FSDP: whole local grads into the workspace, reduce-scattered (SUM) into the shards (+=)
    const size_t n = (size_t)hp_tensor_numel(&W1(m)->grad.local), full = n * ep->fs_size;
    memset(ep->ws_g, 0, sizeof(float) * 3 * full);
    hp_moe_experts_backward_weight(act->be, ep->ws_g, ep->ws_g + full, ep->ws_g + 2 * full, s->dyl, s->dh1, s->dh3,
                                   s->a, s->xl, s->loff, M->c.n_experts / ep->size, M->c.dim, ep_fl(ep, m));
    prof(act, HP_NN_OP_MOE_EXPERTS, t0);
    t0 = omp_get_wtime();
    hp_param_t *ps[3] = {W1(m), W2(m), W3(m)};
    for (int k = 0; k < 3; k++) {
        float *src = ep->ws_g + k * full;
        if (ep->fs_dim1) {   // Shard(1): rank-major blocks in ws_w (the weights are re-gathered per use)
            dim1_blocks(&ps[k]->grad.local, ep->fs_size, src, ep->ws_w + k * full, 1);
            src = ep->ws_w + k * full;
        }
        float *mine = src + (size_t)ep->fs_rank * n;   // in place: this rank's block
        HP_TRY(hp_reduce_scatter(src, mine, n, HP_F32, HP_SUM, ep->fs_comm, NULL));
        act->be->add_inplace(act->be->ctx, hp_param_g(ps[k]), mine, (int64_t)n);
    }
    prof(act, HP_NN_OP_MOE_DISPATCH, t0);
    return HP_OK;
}

static const hp_moe_dispatch_t ep_dispatch = {
    ep_act_bytes, ep_scratch, ep_forward, ep_backward_input, ep_backward_weight,
};

/* ---- tensor parallel of the experts: every rank holds all E experts on F/tp hidden features
 * (w1/w3 Shard(1), w2 Shard(2)); the expert outputs and the input gradients are partial sums
 * over tp, all-reduced. The router, shared experts and combine run replicated. ---- */

typedef struct etp_state {
    const float *xs;        // (N*K, D) the module's expert-major rows (its saved buffer)
    const float *dys;       // (N*K, D) set by backward_input
    float *h1, *h3, *a;     // (N*K, F/tp)
    float *dh1, *dh3;       // (N*K, F/tp) gradient scratch, kept for the weight pass
    const int32_t *offsets; // (E + 1) the module's saved offsets
} etp_state_t;

static int etp_fl(const hp_ep_t ep, const hp_module_t *m) { return ((const hp_moe_impl_t *)m->impl)->c.hidden / ep->size; }

static size_t etp_act_bytes(void *ctx, const hp_module_t *m, int N) {
    const hp_moe_impl_t *M = m->impl;
    const size_t NK = (size_t)N * M->c.top_k;
    return hp_arena_round(sizeof(etp_state_t)) + 3 * hp_arena_round(sizeof(float) * NK * etp_fl(ctx, m));
}

static size_t etp_scratch(void *ctx, const hp_module_t *m, int N) {
    const hp_moe_impl_t *M = m->impl;
    return 3 * (size_t)N * M->c.top_k * etp_fl(ctx, m);   // dh1, dh3, da
}

static hp_status_t etp_forward(void *ctx, hp_module_t *m, hp_act_t *act, float *ys, const float *xs,
                               const int32_t *offsets, void **state) {
    hp_ep_t ep = ctx;
    hp_moe_impl_t *M = m->impl;
    const int N = act->B * act->T, E = M->c.n_experts, D = M->c.dim, Fl = etp_fl(ep, m);
    const size_t NK = (size_t)N * M->c.top_k;
    etp_state_t *s = hp_act_alloc(act, sizeof(*s));
    *state = s;
    s->xs = xs;
    s->offsets = offsets;
    s->h1 = hp_act_alloc(act, sizeof(float) * NK * Fl);
    s->h3 = hp_act_alloc(act, sizeof(float) * NK * Fl);
    s->a = hp_act_alloc(act, sizeof(float) * NK * Fl);
    double t0 = omp_get_wtime();
    hp_moe_experts_forward(act->be, ys, s->h1, s->h3, s->a, xs, hp_param_w(W1(m)), hp_param_w(W2(m)),
                           hp_param_w(W3(m)), offsets, E, D, Fl);
    prof(act, HP_NN_OP_MOE_EXPERTS, t0);
    t0 = omp_get_wtime();
    HP_TRY(hp_all_reduce(ys, ys, NK * D, HP_F32, HP_SUM, ep->comm, NULL));   // Partial -> Replicate
    prof(act, HP_NN_OP_MOE_DISPATCH, t0);
    return HP_OK;
}

static hp_status_t etp_backward_input(void *ctx, hp_module_t *m, hp_act_t *act, void *state, float *dxs,
                                      const float *dys, size_t *off) {
    hp_ep_t ep = ctx;
    hp_moe_impl_t *M = m->impl;
    etp_state_t *s = state;
    const int N = act->B * act->T, E = M->c.n_experts, D = M->c.dim, Fl = etp_fl(ep, m);
    const size_t NK = (size_t)N * M->c.top_k;
    s->dys = dys;
    s->dh1 = hp_act_scratch(act, off, NK * Fl);
    s->dh3 = hp_act_scratch(act, off, NK * Fl);
    float *da = hp_act_scratch(act, off, NK * Fl);
    double t0 = omp_get_wtime();
    hp_moe_experts_backward_input(act->be, dxs, s->dh1, s->dh3, da, dys, s->h1, s->h3, hp_param_w(W1(m)),
                                  hp_param_w(W2(m)), hp_param_w(W3(m)), s->offsets, E, D, Fl);
    prof(act, HP_NN_OP_MOE_EXPERTS, t0);
    t0 = omp_get_wtime();
    HP_TRY(hp_all_reduce(dxs, dxs, NK * D, HP_F32, HP_SUM, ep->comm, NULL));   // partial over the F slices
    prof(act, HP_NN_OP_MOE_DISPATCH, t0);
    return HP_OK;
}

static hp_status_t etp_backward_weight(void *ctx, hp_module_t *m, hp_act_t *act, void *state) {
    hp_ep_t ep = ctx;
    hp_moe_impl_t *M = m->impl;
    etp_state_t *s = state;
    double t0 = omp_get_wtime();
    hp_moe_experts_backward_weight(act->be, hp_param_g(W1(m)), hp_param_g(W2(m)), hp_param_g(W3(m)), s->dys, s->dh1,
                                   s->dh3, s->a, s->xs, s->offsets, M->c.n_experts, M->c.dim, etp_fl(ep, m));
    prof(act, HP_NN_OP_MOE_EXPERTS, t0);
    return HP_OK;
}

static const hp_moe_dispatch_t etp_dispatch = {
    etp_act_bytes, etp_scratch, etp_forward, etp_backward_input, etp_backward_weight,
};

int hp_ep_is_expert_param(const hp_param_t *p) { return p && strstr(p->name, ".moe.experts.") != NULL; }

size_t hp_ep_local_expert_bytes(hp_ep_t ep) { return ep ? ep->expert_bytes : 0; }

static void set_layout(hp_dtensor_t *d, hp_mesh_t mesh, hp_placement_t pl, int64_t local0, float *data) {
    d->mesh = mesh;
    d->mesh_ndim = 1;
    d->placements[0] = pl;
    if (data) {
        d->local.shape[0] = local0;
        int64_t st = 1;
        for (int i = d->local.ndim - 1; i >= 0; i--) { d->local.stride[i] = st; st *= d->local.shape[i]; }
        d->local.data = data;
    }
}

static hp_status_t shard_experts_f(hp_model_t m, int P, int r);
static hp_status_t install(hp_model_t m, hp_ep_t ep, const hp_moe_dispatch_t *d);

/* A handle dispatching over dim `dim` of `mesh` (the ep dim; tp for TP of the experts). */
static hp_ep_t ep_new(hp_mesh_t mesh, int dim) {
    hp_ep_t ep = hp_calloc(1, sizeof(*ep));
    if (!ep) return NULL;
    ep->mesh = mesh;
    ep->comm = hp_mesh_get_comm(mesh, dim);
    ep->size = (int)hp_mesh_size(mesh, dim);
    ep->rank = hp_mesh_get_local_rank(mesh, dim);
    return ep;
}

/* The common tail: compacts the storage, installs dispatcher d; on failure frees the handle. */
static hp_status_t ep_finish(hp_model_t m, hp_ep_t ep, const hp_moe_dispatch_t *d, hp_status_t st, hp_ep_t *out) {
    if (st == HP_OK) st = hp_model_compact_storage(m);
    if (st == HP_OK) st = install(m, ep, d);
    if (st != HP_OK) {
        hp_ep_destroy(ep);
        return st;
    }
    *out = ep;
    return HP_OK;
}

/* The checks every expert attach starts with: the arguments (*out = NULL), a mesh of nd_lo
 * to nd_hi dims (`dims` says which), a model with MoE layers (`what` names the parallelism);
 * *c the model's config. */
static hp_status_t attach_begin(hp_model_t m, hp_mesh_t mesh, hp_ep_t *out, int nd_lo, int nd_hi, const char *fn,
                                const char *dims, const char *what, const hp_model_config_t **c) {
    if (!m || !mesh || !out) return hp_error(HP_ERR_INVALID_ARG, "%s: NULL argument", fn);
    *out = NULL;
    *c = hp_model_config(m);
    const int nd = hp_mesh_ndim(mesh);
    if (nd < nd_lo || nd > nd_hi)
        return hp_error(HP_ERR_INVALID_ARG, "%s: the mesh must be %s, got %d dims", fn, dims, nd);
    if ((*c)->moe_experts <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "%s: model '%s/%s' has no MoE layers; hint: use a family with MoE layers "
                        "(deepseek_v3, qwen3_moe), or degree 1", what, (*c)->name, (*c)->flavor);
    return HP_OK;
}

hp_status_t hp_ep_tensor_parallel_experts(hp_model_t m, hp_mesh_t mesh, hp_ep_t *out) {
    const hp_model_config_t *c;
    HP_TRY(attach_begin(m, mesh, out, 1, 1, "hp_ep_tensor_parallel_experts", "1-D (tp)", "tensor parallel of experts",
                        &c));
    const int P = (int)hp_mesh_size(mesh, 0);
    if (c->moe_hidden % P != 0)
        return hp_error(HP_ERR_INVALID_ARG, "tensor parallel of experts: degree %d does not divide the expert hidden "
                        "size %d (model.moe_hidden_dim); hint: use a divisor of %d", P, c->moe_hidden, c->moe_hidden);
    hp_ep_t ep = ep_new(mesh, 0);
    if (!ep) return HP_ERR_OOM;
    ep->tp = 1;
    hp_status_t st = shard_experts_f(m, P, ep->rank);
    hp_param_t *ps = hp_model_params(m);
    for (int i = 0; i < hp_model_num_params(m); i++) {
        hp_param_t *p = &ps[i];
        if (!hp_ep_is_expert_param(p)) continue;
        const int f_dim = strstr(p->name, ".moe.experts.w2") ? 2 : 1;
        set_layout(&p->value, mesh, hp_shard(f_dim), 0, NULL);
        set_layout(&p->grad, mesh, hp_shard(f_dim), 0, NULL);
        ep->expert_bytes += sizeof(float) * (size_t)hp_tensor_numel(&p->value.local);
    }
    return ep_finish(m, ep, &etp_dispatch, st, out);
}

/* w1/w3 (E, F, D) -> (E, F/P, D) rows [r F/P, (r+1) F/P) of each expert; w2 (E, D, F) ->
 * (E, D, F/P) columns; moved to the front of their storage (destinations never pass their
 * sources). The caller sets the placements. */
static hp_status_t shard_experts_f(hp_model_t m, int P, int r) {
    hp_param_t *ps = hp_model_params(m);
    for (int i = 0; i < hp_model_num_params(m); i++) {
        hp_param_t *p = &ps[i];
        if (!hp_ep_is_expert_param(p)) continue;
        const int is_w2 = strstr(p->name, ".moe.experts.w2") != NULL;
        const int64_t E = p->value.local.shape[0], A = p->value.local.shape[1], Bd = p->value.local.shape[2];
        hp_dtensor_t *ts[2] = {&p->value, &p->grad};
        for (int k = 0; k < 2; k++) {
            hp_dtensor_t *d = ts[k];
            float *v = d->local.data;   // NULL in an empty model: only the layout changes
            if (!is_w2) {   // (E, F, D): F = A
                const int64_t Fl = A / P;
                for (int64_t e = 0; v && e < E; e++)
                    memmove(v + (size_t)(e * Fl * Bd), v + (size_t)((e * A + r * Fl) * Bd), sizeof(float) * (size_t)(Fl * Bd));
                d->local.shape[1] = Fl;
            } else {        // (E, D, F): F = Bd
                const int64_t Fl = Bd / P;
                for (int64_t row = 0; v && row < E * A; row++)
                    memmove(v + (size_t)(row * Fl), v + (size_t)(row * Bd + r * Fl), sizeof(float) * (size_t)Fl);
                d->local.shape[2] = Fl;
            }
            int64_t st = 1;
            for (int j = d->local.ndim - 1; j >= 0; j--) { d->local.stride[j] = st; st *= d->local.shape[j]; }
        }
    }
    return HP_OK;
}

/* The dispatcher on every MoE module; re-registering the module re-sizes the contexts. */
static hp_status_t install(hp_model_t m, hp_ep_t ep, const hp_moe_dispatch_t *d) {
    hp_module_t *mods[4096];
    const int nm = hp_model_modules(m, mods, 4096);
    for (int i = 0; i < nm && i < 4096; i++) {
        hp_module_t *blk = mods[i];
        for (int k = 0; k < blk->n_children; k++) {
            hp_module_t *moe = blk->children[k];
            if (!hp_module_is_moe(moe)) continue;
            hp_moe_impl_t *M = moe->impl;
            M->dispatch = d;
            M->dispatch_ctx = ep;
            HP_TRY(hp_model_replace_module(m, blk, moe, moe));
        }
    }
    return HP_OK;
}

hp_status_t hp_ep_parallelize_model(hp_model_t m, hp_mesh_t mesh, hp_ep_t *out) {
    const hp_model_config_t *c;
    HP_TRY(attach_begin(m, mesh, out, 1, 1, "hp_ep_parallelize_model", "1-D (ep)", "expert parallel", &c));
    const int P = (int)hp_mesh_size(mesh, 0);
    if (c->moe_experts % P != 0)
        return hp_error(HP_ERR_INVALID_ARG, "expert parallel: degree %d does not divide the %d experts; hint: use a "
                        "divisor of %d", P, c->moe_experts, c->moe_experts);
    hp_ep_t ep = ep_new(mesh, 0);
    if (!ep) return HP_ERR_OOM;
    const int El = c->moe_experts / P;
    // parameters: experts Shard(0) (local slice moved to the front), the rest Replicate
    hp_param_t *ps = hp_model_params(m);
    for (int i = 0; i < hp_model_num_params(m); i++) {
        hp_param_t *p = &ps[i];
        if (!hp_ep_is_expert_param(p)) {
            if (p->value.mesh) continue;   // EP borrowing tp ranks: the dense TP plan's layout stays
            set_layout(&p->value, mesh, hp_replicate(), 0, NULL);
            set_layout(&p->grad, mesh, hp_replicate(), 0, NULL);
            continue;
        }
        const size_t per = (size_t)(hp_tensor_numel(&p->value.local) / p->value.local.shape[0]);
        float *v = p->value.local.data, *g = p->grad.local.data;
        if (v) {   // an empty model's entries have no storage: only their layouts change
            memmove(v, v + (size_t)ep->rank * El * per, sizeof(float) * El * per);
            memmove(g, g + (size_t)ep->rank * El * per, sizeof(float) * El * per);
        }
        set_layout(&p->value, mesh, hp_shard(0), El, v);
        set_layout(&p->grad, mesh, hp_shard(0), El, g);
        if (!v) p->value.local.shape[0] = p->grad.local.shape[0] = El;
        ep->expert_bytes += sizeof(float) * El * per;
    }
    return ep_finish(m, ep, &ep_dispatch, HP_OK, out);
}

hp_status_t hp_ep_parallelize_model_etp(hp_model_t m, hp_mesh_t mesh2, hp_ep_t *out) {
    const hp_model_config_t *c;
    HP_TRY(attach_begin(m, mesh2, out, 2, 2, "hp_ep_parallelize_model_etp", "2-D (ep, tp)", "expert tensor parallel",
                        &c));
    const int P = (int)hp_mesh_size(mesh2, 0), Q = (int)hp_mesh_size(mesh2, 1);
    if (c->moe_experts % P != 0 || c->moe_hidden % Q != 0)
        return hp_error(HP_ERR_INVALID_ARG, "expert tensor parallel: model '%s/%s' with %d experts of hidden %d on an "
                        "(ep %d, tp %d) mesh; ep must divide the experts and tp the expert hidden size", c->name,
                        c->flavor, c->moe_experts, c->moe_hidden, P, Q);
    hp_ep_t ep = ep_new(mesh2, 0);
    if (!ep) return HP_ERR_OOM;
    ep->tp_comm = hp_mesh_get_comm(mesh2, 1);
    ep->tp_size = Q;
    ep->tp_rank = hp_mesh_get_local_rank(mesh2, 1);
    const int El = c->moe_experts / P;
    hp_param_t *ps = hp_model_params(m);
    for (int i = 0; i < hp_model_num_params(m); i++) {   // experts: this ep rank's experts first
        hp_param_t *p = &ps[i];
        hp_dtensor_t *ts[2] = {&p->value, &p->grad};
        for (int k = 0; k < 2; k++) {
            hp_dtensor_t *d = ts[k];
            if (!hp_ep_is_expert_param(p)) {
                /* dense: Replicate over ep, and the tensor-parallel placement (or Replicate) over tp */
                hp_placement_t tpp = d->mesh && d->mesh_ndim == 1 ? d->placements[0] : hp_replicate();
                if (d->mesh && d->mesh_ndim == 1 && !ep->dense_tp) ep->dense_tp = d->mesh;
                d->mesh = mesh2;
                d->mesh_ndim = 2;
                d->placements[0] = hp_replicate();
                d->placements[1] = tpp;
                continue;
            }
            const size_t per = (size_t)(hp_tensor_numel(&d->local) / d->local.shape[0]);
            float *v = d->local.data;
            if (v) memmove(v, v + (size_t)ep->rank * El * per, sizeof(float) * El * per);
            d->local.shape[0] = El;
        }
    }
    hp_status_t st = shard_experts_f(m, Q, ep->tp_rank);
    for (int i = 0; i < hp_model_num_params(m); i++) {
        hp_param_t *p = &ps[i];
        if (!hp_ep_is_expert_param(p)) continue;
        const int f_dim = strstr(p->name, ".moe.experts.w2") ? 2 : 1;
        hp_dtensor_t *ts[2] = {&p->value, &p->grad};
        for (int k = 0; k < 2; k++) {
            ts[k]->mesh = mesh2;
            ts[k]->mesh_ndim = 2;
            ts[k]->placements[0] = hp_shard(0);
            ts[k]->placements[1] = hp_shard(f_dim);
        }
        ep->expert_bytes += sizeof(float) * (size_t)hp_tensor_numel(&p->value.local);
    }
    return ep_finish(m, ep, &ep_dispatch, st, out);
}

hp_status_t hp_ep_parallelize_model_efsdp(hp_model_t m, hp_mesh_t mesh2, hp_ep_t *out) {
    const hp_model_config_t *c;
    HP_TRY(attach_begin(m, mesh2, out, 2, 3, "hp_ep_parallelize_model_efsdp", "2-D (efsdp, ep) or 3-D (efsdp, ep, etp)",
                        "expert FSDP", &c));
    const int nd = hp_mesh_ndim(mesh2);
    const int Fs = (int)hp_mesh_size(mesh2, 0), P = (int)hp_mesh_size(mesh2, 1), Q = nd == 3 ? (int)hp_mesh_size(mesh2, 2) : 1;
    if (c->moe_experts % P != 0)
        return hp_error(HP_ERR_INVALID_ARG, "expert parallel: degree %d does not divide the %d experts", P,
                        c->moe_experts);
    if (c->moe_hidden % Q != 0)
        return hp_error(HP_ERR_INVALID_ARG, "expert tensor parallel: etp %d does not divide the expert hidden size %d "
                        "(model.moe_hidden_dim); hint: use a tensor_parallel_degree dividing %d", Q, c->moe_hidden,
                        c->moe_hidden);
    const int El = c->moe_experts / P;
    /* TorchTitan's rule: Shard(1) when efsdp x ep > E (fewer local experts than efsdp ranks),
     * else Shard(0) (here over whole experts: efsdp must divide E / ep) */
    const int dim1 = Fs * P > c->moe_experts;
    if (!dim1 && El % Fs != 0)
        return hp_error(HP_ERR_UNSUPPORTED, "expert FSDP: efsdp %d does not divide the %d experts per ep rank "
                        "(uneven Shard(0) is not implemented); hint: use an expert_parallel_degree with experts / "
                        "ep a multiple of %d", Fs, El, Fs);
    if (dim1 && ((c->moe_hidden / Q) % Fs != 0 || c->dim % Fs != 0))
        return hp_error(HP_ERR_INVALID_ARG, "expert FSDP with Shard(1) (efsdp %d x ep %d > %d experts): efsdp must "
                        "divide model.moe_hidden_dim / etp (%d / %d) and model.dim (%d), the experts' dim 1; hint: use "
                        "an efsdp (data_parallel_shard_degree x context_parallel_degree / expert_parallel_degree) "
                        "dividing both", Fs, P, c->moe_experts, c->moe_hidden, Q, c->dim);
    const int Ef = dim1 ? El : El / Fs;
    hp_ep_t ep = ep_new(mesh2, 1);
    if (!ep) return HP_ERR_OOM;
    ep->fs_comm = hp_mesh_get_comm(mesh2, 0);
    ep->fs_size = Fs;
    ep->fs_rank = hp_mesh_get_local_rank(mesh2, 0);
    ep->fs_dim1 = dim1;
    if (Q > 1) {   // ETP: the experts' hidden F over etp, outputs / input grads all-reduced over it
        ep->tp_comm = hp_mesh_get_comm(mesh2, 2);
        ep->tp_size = Q;
        ep->tp_rank = hp_mesh_get_local_rank(mesh2, 2);
    }
    hp_param_t *ps = hp_model_params(m);
    // ETP: first each rank's F slice of every expert (ETP's local layout), then efsdp's part below
    hp_status_t st = Q > 1 ? shard_experts_f(m, Q, ep->tp_rank) : HP_OK;
    size_t ws = 0;
    for (int i = 0; st == HP_OK && i < hp_model_num_params(m); i++) {
        hp_param_t *p = &ps[i];
        hp_dtensor_t *ts[2] = {&p->value, &p->grad};
        const int expert = hp_ep_is_expert_param(p);
        const int f_dim = strstr(p->name, ".moe.experts.w2") ? 2 : 1;   // the F dim etp shards
        for (int k = 0; k < 2; k++) {
            hp_dtensor_t *d = ts[k];
            if (!expert) {   // dense: Replicate over (efsdp, ep), over etp its TP placement (or Replicate)
                hp_placement_t tpp = d->mesh && d->mesh_ndim == 1 ? d->placements[0] : hp_replicate();
                if (Q > 1 && d->mesh && d->mesh_ndim == 1 && !ep->dense_tp) ep->dense_tp = d->mesh;
                d->mesh = mesh2;
                d->mesh_ndim = nd;
                d->placements[0] = d->placements[1] = hp_replicate();
                if (nd == 3) d->placements[2] = tpp;
                continue;
            }
            d->mesh = mesh2;
            d->mesh_ndim = nd;
            if (nd == 3) d->placements[2] = hp_shard(f_dim);
            // this rank's experts r*El + f*Ef .. + Ef: ep's block, then efsdp's part of it
            // (FSDP2 over TP's layout: _StridedShard(0, ep) on efsdp, Shard(0) on ep)
            const size_t per = (size_t)(hp_tensor_numel(&d->local) / d->local.shape[0]);
            float *v = d->local.data;
            if (v)
                memmove(v, v + ((size_t)ep->rank * El + (size_t)(dim1 ? 0 : ep->fs_rank) * Ef) * per,
                        sizeof(float) * Ef * per);
            d->local.shape[0] = Ef;
            d->placements[0] = hp_strided_shard(0, P);
            d->placements[1] = hp_shard(0);
            if (dim1) {   // rows [f c, (f+1) c) of each local expert's dim 1: (Shard(1), Shard(0))
                const int64_t d1 = d->local.shape[1], cc = d1 / Fs, rest = (int64_t)per / d1;
                for (int64_t e = 0; v && e < Ef; e++)   // destinations never pass their sources
                    memmove(v + (size_t)(e * cc * rest), v + (size_t)((e * d1 + ep->fs_rank * cc) * rest),
                            sizeof(float) * (size_t)(cc * rest));
                d->local.shape[1] = cc;
                d->local.stride[0] = cc * rest;
                /* ETP's w1/w3 hold F slice t of the tp ranks; efsdp splits that slice again:
                 * F index t F/etp + f c, i.e. _StridedShard(1, etp) on efsdp, Shard(1) on etp
                 * (w2's dim 1 is D, not sharded by etp) */
                d->placements[0] = Q > 1 && f_dim == 1 ? hp_strided_shard(1, Q) : hp_shard(1);
            }
            if (k == 0) {
                const size_t held = (size_t)hp_tensor_numel(&d->local);
                ep->expert_bytes += sizeof(float) * held;
                if (held * Fs > ws) ws = held * Fs;
            }
        }
    }
    if (st == HP_OK) {
        ep->ws_w = hp_aligned_alloc(sizeof(float) * 3 * (ws ? ws : 1));
        ep->ws_g = hp_aligned_alloc(sizeof(float) * 3 * (ws ? ws : 1));
        st = ep->ws_w && ep->ws_g ? HP_OK : HP_ERR_OOM;
    }
    return ep_finish(m, ep, &ep_dispatch, st, out);
}

hp_status_t hp_ep_restore_dense_layout(hp_ep_t ep, hp_model_t m) {
    if (!ep || !m) return hp_error(HP_ERR_INVALID_ARG, "hp_ep_restore_dense_layout: NULL argument");
    hp_param_t *ps = hp_model_params(m);
    for (int i = 0; i < hp_model_num_params(m); i++) {
        hp_param_t *p = &ps[i];
        if (hp_ep_is_expert_param(p)) continue;
        hp_dtensor_t *ts[2] = {&p->value, &p->grad};
        for (int k = 0; k < 2; k++) {
            hp_dtensor_t *d = ts[k];
            if (d->mesh != ep->mesh) continue;   // already its own plan's layout
            if (ep->tp_size > 1 && ep->dense_tp) {   // ETP: (.., Replicate, tp placement) -> tp placement on tp
                d->placements[0] = d->placements[d->mesh_ndim - 1];
                d->mesh = ep->dense_tp;
                d->mesh_ndim = 1;
            } else {   // Replicate over ep (and efsdp): a plain tensor again
                d->mesh = NULL;
                d->mesh_ndim = 0;
                d->placements[0] = d->placements[1] = hp_replicate();
            }
        }
    }
    return HP_OK;
}

hp_status_t hp_ep_enable_sequence_parallel(hp_ep_t ep, hp_model_t m, hp_mesh_t tp_mesh) {
    if (!ep || !m || !tp_mesh || hp_mesh_ndim(tp_mesh) != 1)
        return hp_error(HP_ERR_INVALID_ARG, "hp_ep_enable_sequence_parallel: NULL argument or a tp mesh not 1-D");
    if (ep->sp_comm) return hp_error(HP_ERR_STATE, "hp_ep_enable_sequence_parallel: already enabled");
    if (ep->fs_size > 1)
        return hp_error(HP_ERR_UNSUPPORTED, "sequence parallel around MoE layers with expert FSDP (efsdp %d) is not "
                        "implemented", ep->fs_size);
    ep->sp_comm = hp_mesh_get_comm(tp_mesh, 0);
    const int k = (int)hp_mesh_size(tp_mesh, 0);
    if (ep->tp) {   // TP of the experts (EP 1): the all-to-all dispatcher with one ep rank and the F slices over tp
        if (ep->comm != ep->sp_comm)
            return hp_error(HP_ERR_INVALID_ARG, "hp_ep_enable_sequence_parallel: tp_mesh is not the experts' tp mesh");
        ep->tp_comm = ep->g_comm = ep->comm;
        ep->tp_size = ep->size;
        ep->tp_rank = ep->rank;
        ep->size = 1;
        ep->rank = 0;
        ep->sq = ep->tp_size;
        return install(m, ep, &ep_dispatch);
    }
    if (ep->tp_size > 1) {   // ETP: rows go to the tp ranks of their ep rank over the flattened (ep, tp)
        if (ep->tp_size != k || hp_mesh_ndim(ep->mesh) != 2)
            return hp_error(HP_ERR_INVALID_ARG, "hp_ep_enable_sequence_parallel: tp mesh of %d ranks, experts' F over %d",
                            k, ep->tp_size);
        const char *names[2] = {hp_mesh_dim_name(ep->mesh, 0), hp_mesh_dim_name(ep->mesh, 1)};
        HP_TRY(hp_mesh_flatten(ep->mesh, 2, names, "ep_tp", &ep->g_mesh));
        ep->g_comm = hp_mesh_get_comm(ep->g_mesh, 0);
        ep->sq = ep->tp_size;
        return install(m, ep, &ep_dispatch);
    }
    return HP_OK;   // EP over ranks that include tp: each tp rank dispatches its own tokens as it is
}

hp_status_t hp_ep_reduce_sequence_parallel_grads(hp_ep_t ep, hp_param_t *params, int n) {
    if (!ep || (!params && n > 0)) return hp_error(HP_ERR_INVALID_ARG, "hp_ep_reduce_sequence_parallel_grads: NULL");
    if (!ep->sp_comm || hp_comm_size(ep->sp_comm) == 1) return HP_OK;
    for (int i = 0; i < n; i++) {   // router gate and shared experts: each tp rank saw its own tokens
        hp_param_t *p = &params[i];
        if (hp_ep_is_expert_param(p) || !strstr(p->name, ".moe.")) continue;
        hp_tensor_t *g = &p->grad.local;
        if (hp_tensor_numel(g) == 0 || !g->data) continue;
        HP_TRY(hp_all_reduce(g->data, g->data, (size_t)hp_tensor_numel(g), HP_F32, HP_SUM, ep->sp_comm, NULL));
    }
    return HP_OK;
}

void hp_ep_destroy(hp_ep_t ep) {
    if (!ep) return;
    hp_mesh_destroy(ep->g_mesh);
    hp_free_aligned(ep->ws_w);
    hp_free_aligned(ep->ws_g);
    free(ep);
}
