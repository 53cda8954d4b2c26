/* Composite modules of the Llama-family block: attention (fused wq|wk|wv, qk-norm, RoPE at
 * global positions, a replaceable core, wo), the causal SDPA core (training and KV-cache
 * decode), feed-forward (fused w1|w3, SwiGLU, w2), the transformer block, the head (norm,
 * output). Every kernel goes through act->be; the saved tensors follow the save_items protocol
 * (nn_module.h), so activation checkpointing can keep some and replay the rest. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "nn/nn-model.h"

static void prof(hp_act_t *act, int op, double t0) {
    if (act->prof) act->prof[op] += omp_get_wtime() - t0;
}

/* ---- attention core: causal scaled-dot-product attention over [q | k | v] rows ---------- */

/* The heads come from the projection that feeds the core: the local rows of its q and k (or
 * kv) weights over the rows per head (a tensor-parallel shard holds fewer heads). */
typedef struct core_impl {
    const hp_param_t *q, *kv;
    int q_per, kv_per;       /* weight rows per head */
    int hd, hv, layer;       /* q|k and v head widths (equal but for MLA) */
    int hc;                  /* the one width of a padded call (>= both; the KV cache's) */
    const hp_backend_t *be;  /* the model's kernels (its contexts'): a training call's widths without a
                              * context, for the parent's save items */
} core_impl_t;

/* This call's widths (nn_sdpa_core_widths): the two when they differ and the backend has the
 * separate-width kernels (training), else the one padded width hc. act NULL: a training call
 * of the model's contexts. */
static int core_split(const core_impl_t *C, const hp_act_t *act) {
    const hp_backend_t *be = act ? act->be : C->be;
    return C->hv != C->hd && !(act && act->kv) && be->attention_qk_v_forward && be->attention_qk_v_backward;
}
static void core_widths(const core_impl_t *C, const hp_act_t *act, int *hd, int *hv) {
    const int split = core_split(C, act);
    *hd = split ? C->hd : C->hc;
    *hv = split ? C->hv : C->hc;
}

static void core_heads(const core_impl_t *C, int *H, int *KV) {
    *H = (int)(C->q->value.local.shape[0] / C->q_per);
    *KV = (int)(C->kv->value.local.shape[0] / C->kv_per);
}

typedef struct core_saved {
    const float *in;   // (N, qd + 2 kd) q | k | v after qk-norm and RoPE (the parent's buffer)
    const float *out;  // (N, qd)
    float *lse;        // (B, H, T)
    int B, T;
} core_saved_t;

static size_t core_act_bytes(const hp_module_t *m, int B, int T) {
    int H, KV;
    core_heads(m->impl, &H, &KV);
    return hp_arena_round(sizeof(core_saved_t)) + hp_arena_round(sizeof(float) * (size_t)B * T * H);
}

static hp_status_t core_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    const core_impl_t *C = m->impl;
    int H, KV;
    core_heads(C, &H, &KV);
    int hd, hv;
    core_widths(C, act, &hd, &hv);
    const int qd = H * hd, kd = KV * hd, vd = KV * hv, ld = qd + kd + vd, N = act->B * act->T;
    const float *x = in->data;
    double t0 = omp_get_wtime();
    if (act->kv) {   // decode: the new rows attend to the cached keys of positions [0, pos0 + N)
        struct hp_model_kv_cache *kc = act->kv;
        const float *K = kc->k + (size_t)C->layer * kc->max_len * kd, *V = kc->v + (size_t)C->layer * kc->max_len * kd;
        act->be->attention_decode_forward(act->be->ctx, out->data, kc->scores, x, ld, K, kd, V, kd, act->pos0, N,
                                          H, KV, hd, kc->n_threads);
        prof(act, HP_NN_OP_ATTENTION_FWD, t0);
        return HP_OK;
    }
    core_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->in = x;
    s->out = out->data;
    s->B = act->B;
    s->T = act->T;
    s->lse = hp_act_alloc(act, sizeof(float) * (size_t)N * H);
    if (hv != hd)
        act->be->attention_qk_v_forward(act->be->ctx, out->data, s->lse, x, ld, x + qd, ld, x + qd + kd, ld, act->B,
                                        act->T, H, KV, hd, hv);
    else
        act->be->attention_forward(act->be->ctx, out->data, s->lse, x, ld, x + qd, ld, x + qd + kd, ld, act->B,
                                   act->T, H, KV, hd);
    prof(act, HP_NN_OP_ATTENTION_FWD, t0);
    return HP_OK;
}

static hp_status_t core_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    const core_impl_t *C = m->impl;
    core_saved_t *s = hp_act_slot(act, m);
    int H, KV;
    core_heads(C, &H, &KV);
    int hd, hv;
    core_widths(C, act, &hd, &hv);
    const int qd = H * hd, kd = KV * hd, ld = qd + kd + KV * hv;
    float *d = din->data;
    const float *x = s->in;
    double t0 = omp_get_wtime();
    if (hv != hd)
        act->be->attention_qk_v_backward(act->be->ctx, d, ld, d + qd, ld, d + qd + kd, ld, dout->data, s->out, s->lse,
                                         x, ld, x + qd, ld, x + qd + kd, ld, s->B, s->T, H, KV, hd, hv);
    else
        act->be->attention_backward(act->be->ctx, d, ld, d + qd, ld, d + qd + kd, ld, dout->data, s->out, s->lse, x,
                                    ld, x + qd, ld, x + qd + kd, ld, s->B, s->T, H, KV, hd);
    prof(act, HP_NN_OP_ATTENTION_BWD, t0);
    return HP_OK;
}

static const hp_module_ops_t core_ops = {
    "sdpa", core_act_bytes, NULL, core_forward, core_backward_input, NULL, NULL, NULL,
};

/* A module of m with its ops, name and impl_bytes of zeroed impl; NULL when out of memory. */
static hp_module_t *module_new(hp_model_t m, const hp_module_ops_t *ops, const char *name, size_t impl_bytes) {
    hp_module_t *mod = hp_model_module_new(m, impl_bytes);
    if (mod) hp_module_base_init(mod, ops, name, mod->impl);
    return mod;
}

hp_status_t nn_sdpa_core_new(hp_model_t m, const char *name, const hp_param_t *q, int q_per, const hp_param_t *kv,
                             int kv_per, int head_dim, int v_dim, int pad_dim, int layer, hp_module_t **out) {
    HP_ASSERT(pad_dim >= head_dim && pad_dim >= v_dim);
    hp_module_t *core = module_new(m, &core_ops, name, sizeof(core_impl_t));
    if (!core) return HP_ERR_OOM;
    *(core_impl_t *)core->impl = (core_impl_t){.q = q, .kv = kv, .q_per = q_per, .kv_per = kv_per, .hd = head_dim,
                                               .hv = v_dim, .layer = layer, .hc = pad_dim, .be = m->be};
    *out = core;
    return HP_OK;
}

int nn_sdpa_core_widths(const hp_module_t *core, const hp_act_t *act, int *hd, int *hv) {
    if (!core || core->ops != &core_ops) return 0;
    core_widths(core->impl, act, hd, hv);
    return 1;
}

/* ---- attention ------------------------------------------------------------------------ */

typedef struct attn_impl {
    hp_attention_cfg_t c;                /* c.n_heads, c.n_kv: the declared (whole) heads */
    const hp_param_t *wq, *wk;           /* the projection's q and k weights (the model's entries) */
} attn_impl_t;

/* The heads this call runs: the local rows of wq and wk over head_dim (a tensor-parallel shard
 * holds n_heads / tp of them), and the widths of the [q | k | v] rows. */
typedef struct attn_dims {
    int H, KV, qd, kd, ld;
} attn_dims_t;

static attn_dims_t attn_dims(const attn_impl_t *A) {
    attn_dims_t d;
    d.qd = (int)A->wq->value.local.shape[0];
    d.kd = (int)A->wk->value.local.shape[0];
    d.H = d.qd / A->c.head_dim;
    d.KV = d.kd / A->c.head_dim;
    d.ld = d.qd + 2 * d.kd;
    return d;
}
/* Children are read from the module at every call, so hp_module_replace_child swaps them. */
#define A_WQKV(m) ((m)->children[0])
#define A_CORE(m) ((m)->children[1])
#define A_WO(m) ((m)->children[2])

typedef struct attn_saved {
    float *qkv;    // (N, qkvd) wq|wk|wv output (RoPE applied in place without qk-norm)
    float *qkr;    // (N, qkvd) q, k after qk-norm and RoPE, v copied (qk-norm only)
    float *rstd_q; // (N, H)   qk-norm
    float *rstd_k; // (N, KV)
    float *o;      // (N, qd) core output
    float *dqkr;   // scratch: gradient of qkr (qk-norm only), kept for backward_weight
    int B, T;
} attn_saved_t;

static size_t attn_act_bytes(const hp_module_t *m, int B, int T) {
    const attn_impl_t *A = m->impl;
    const attn_dims_t d = attn_dims(A);
    const size_t N = (size_t)B * T;
    size_t s = hp_arena_round(sizeof(attn_saved_t)) + hp_arena_round(sizeof(float) * N * d.ld) +
               hp_arena_round(sizeof(float) * N * d.qd);
    if (A->c.qk_norm)
        s += hp_arena_round(sizeof(float) * N * d.ld) + hp_arena_round(sizeof(float) * N * d.H) +
             hp_arena_round(sizeof(float) * N * d.KV);
    for (int i = 0; i < m->n_children; i++) s += m->children[i]->ops->act_bytes(m->children[i], B, T);
    return s;
}

static size_t attn_scratch(const hp_module_t *m, int B, int T) {
    const attn_impl_t *A = m->impl;
    const attn_dims_t d = attn_dims(A);
    const size_t N = (size_t)B * T;
    return N * ((size_t)d.qd + d.ld + (A->c.qk_norm ? (size_t)d.ld : 0));
}

/* Rotates the q and k columns of (B*T, ld) rows at positions pos0 + t, or (the context's
 * position segments, context parallelism) each segment at its global position. B and T are
 * the module's own (saved in forward: a wrapper may change act->T around the call). */
static void rope_qk(hp_act_t *act, const attn_impl_t *A, const attn_dims_t *d, float *x, int B, int T, int inverse) {
    const int half = A->c.head_dim / 2, ld = d->ld;
    if (act->n_pos_segs > 0 && !act->kv) {
        const int L = T / act->n_pos_segs;
        for (int b = 0; b < B; b++)
            for (int g = 0; g < act->n_pos_segs; g++) {
                float *xs = x + ((size_t)b * T + (size_t)g * L) * ld;
                const float *c = A->c.cos_t + (size_t)act->pos_segs[g] * half;
                const float *n = A->c.sin_t + (size_t)act->pos_segs[g] * half;
                act->be->rope_apply(act->be->ctx, xs, ld, 1, L, d->H, A->c.head_dim, c, n, A->c.style, inverse);
                act->be->rope_apply(act->be->ctx, xs + d->qd, ld, 1, L, d->KV, A->c.head_dim, c, n, A->c.style,
                                    inverse);
            }
        return;
    }
    const float *cs = A->c.cos_t + (size_t)act->pos0 * half, *sn = A->c.sin_t + (size_t)act->pos0 * half;
    act->be->rope_apply(act->be->ctx, x, ld, B, T, d->H, A->c.head_dim, cs, sn, A->c.style, inverse);
    act->be->rope_apply(act->be->ctx, x + d->qd, ld, B, T, d->KV, A->c.head_dim, cs, sn, A->c.style, inverse);
}

/* Saved-tensor items (save_items): the projection's output, the qk-norm block, the core's output. */
enum { ATTN_QKR = 1 };
static size_t fl4(size_t n) { return hp_arena_round(sizeof(float) * n); }

static void attn_save_items(const hp_module_t *m, int B, int T, hp_save_list_t *L) {
    const attn_impl_t *A = m->impl;
    const attn_dims_t d = attn_dims(A);
    const size_t N = (size_t)B * T;
    /* a replaced core (context parallel) may start from the projection's hooks (the async
     * exchange): the projection, the qk-norm block and the core are kept or replayed together */
    const int tied = A_CORE(m)->ops != &core_ops;
    hp_save_child(L, A_WQKV(m), B, T, fl4(N * d.ld), HP_SAVE_MM, 2.0 * N * A->c.dim * d.ld, NULL, 0);
    if (A->c.qk_norm) {
        hp_save_own(L, m, ATTN_QKR, HP_SAVE_OTHER, fl4(N * d.ld) + fl4(N * d.H) + fl4(N * d.KV), 0.0);
        if (tied) hp_save_tie(L);
    }
    // FlopCounterMode's SDPA count: q k^T and p v over every (query, key) pair (no causal discount)
    hp_save_child(L, A_CORE(m), B, T, fl4(N * d.qd), HP_SAVE_ATTENTION, 4.0 * N * T * d.H * A->c.head_dim, NULL, 0);
    if (tied) hp_save_tie(L);
    hp_save_final(L, m, A_WO(m), B, T, HP_SAVE_MM, 2.0 * N * d.qd * A->c.dim, NULL, 0);
}

static hp_status_t attn_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    attn_impl_t *A = m->impl;
    const attn_dims_t d = attn_dims(A);
    const int N = act->B * act->T, hd = A->c.head_dim, qd = d.qd, kd = d.kd, ld = d.ld;
    attn_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->B = act->B;
    s->T = act->T;
    s->qkv = hp_act_save_out(act, A_WQKV(m), sizeof(float) * (size_t)N * ld);
    s->o = hp_act_save_out(act, A_CORE(m), sizeof(float) * (size_t)N * qd);
    hp_tensor_t t_in, t_qkv, t_src, t_o;
    hp_tensor_view2(&t_in, in->data, N, A->c.dim);
    hp_tensor_view2(&t_qkv, s->qkv, N, ld);
    HP_TRY(hp_module_forward(A_WQKV(m), act, &t_in, &t_qkv));   // the replay skips it when qkv was kept
    float *src = s->qkv;
    int rotate = !hp_act_out_kept(act, A_WQKV(m));   // RoPE rotates its input in place: once
    double t0 = omp_get_wtime();
    if (A->c.qk_norm) {
        const float *qn = hp_param_w(m->params[0]), *kn = hp_param_w(m->params[1]);
        char *blk = hp_act_save(act, m, ATTN_QKR, fl4((size_t)N * ld) + fl4((size_t)N * d.H) + fl4((size_t)N * d.KV),
                                &rotate);
        s->qkr = (float *)blk;
        s->rstd_q = (float *)(blk + fl4((size_t)N * ld));
        s->rstd_k = (float *)(blk + fl4((size_t)N * ld) + fl4((size_t)N * d.H));
        if (rotate) {
            act->be->rmsnorm_heads_forward(act->be->ctx, s->qkr, ld, s->rstd_q, s->qkv, ld, qn, N, d.H, hd, A->c.eps);
            act->be->rmsnorm_heads_forward(act->be->ctx, s->qkr + qd, ld, s->rstd_k, s->qkv + qd, ld, kn, N, d.KV, hd,
                                           A->c.eps);
            act->be->copy_rows(act->be->ctx, s->qkr + qd + kd, ld, s->qkv + qd + kd, ld, N, kd);
        }
        src = s->qkr;
        prof(act, HP_NN_OP_QK_NORM, t0);
    }
    t0 = omp_get_wtime();
    if (rotate) rope_qk(act, A, &d, src, act->B, act->T, 0);
    prof(act, HP_NN_OP_ROPE, t0);
    if (act->kv) {   // decode: append this chunk's keys and values to the layer's cache rows
        struct hp_model_kv_cache *kc = act->kv;
        float *K = kc->k + ((size_t)A->c.layer * kc->max_len + act->pos0) * kd;
        float *V = kc->v + ((size_t)A->c.layer * kc->max_len + act->pos0) * kd;
        act->be->copy_rows(act->be->ctx, K, kd, src + qd, ld, N, kd);
        act->be->copy_rows(act->be->ctx, V, kd, src + qd + kd, ld, N, kd);
    }
    hp_tensor_view2(&t_src, src, N, ld);
    hp_tensor_view2(&t_o, s->o, N, qd);
    HP_TRY(hp_module_forward(A_CORE(m), act, &t_src, &t_o));
    return hp_module_forward(A_WO(m), act, &t_o, out);   // out += o Wo^T (residual)
}

static hp_status_t attn_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    attn_impl_t *A = m->impl;
    attn_saved_t *s = hp_act_slot(act, m);
    const attn_dims_t d = attn_dims(A);
    const int N = s->B * s->T, hd = A->c.head_dim, qd = d.qd, kd = d.kd, ld = d.ld;
    size_t off = 0;
    float *dO = hp_act_scratch(act, &off, (size_t)N * qd);
    float *dqkv = hp_act_scratch(act, &off, (size_t)N * ld);
    hp_tensor_t t_dO, t_dsrc, t_dqkv, t_din;
    hp_tensor_view2(&t_dO, dO, N, qd);
    HP_TRY(hp_module_backward_input(A_WO(m), act, dout, &t_dO));
    float *dsrc = dqkv;   // core gradient [dq | dk | dv]: straight into dqkv, or dqkr under qk-norm
    if (A->c.qk_norm) {
        s->dqkr = hp_act_scratch(act, &off, (size_t)N * ld);
        dsrc = s->dqkr;
    }
    hp_tensor_view2(&t_dsrc, dsrc, N, ld);
    HP_TRY(hp_module_backward_input(A_CORE(m), act, &t_dO, &t_dsrc));
    double t0 = omp_get_wtime();
    rope_qk(act, A, &d, dsrc, s->B, s->T, 1);
    prof(act, HP_NN_OP_ROPE, t0);
    if (A->c.qk_norm) {
        t0 = omp_get_wtime();
        const float *qn = hp_param_w(m->params[0]), *kn = hp_param_w(m->params[1]);
        act->be->rmsnorm_heads_backward_input(act->be->ctx, dqkv, ld, s->dqkr, ld, s->qkv, ld, qn, s->rstd_q, N, d.H,
                                              hd);
        act->be->rmsnorm_heads_backward_input(act->be->ctx, dqkv + qd, ld, s->dqkr + qd, ld, s->qkv + qd, ld, kn,
                                              s->rstd_k, N, d.KV, hd);
        act->be->copy_rows(act->be->ctx, dqkv + qd + kd, ld, s->dqkr + qd + kd, ld, N, kd);
        prof(act, HP_NN_OP_QK_NORM, t0);
    }
    hp_tensor_view2(&t_dqkv, dqkv, N, ld);
    hp_tensor_view2(&t_din, din->data, N, A->c.dim);
    return hp_module_backward_input(A_WQKV(m), act, &t_dqkv, &t_din);
}

static hp_status_t attn_backward_weight(hp_module_t *m, hp_act_t *act) {
    attn_impl_t *A = m->impl;
    attn_saved_t *s = hp_act_slot(act, m);
    HP_TRY(hp_module_backward_weight(A_WO(m), act));
    HP_TRY(hp_module_backward_weight(A_CORE(m), act));
    HP_TRY(hp_module_backward_weight(A_WQKV(m), act));
    if (A->c.qk_norm) {
        const attn_dims_t d = attn_dims(A);
        const int N = s->B * s->T, ld = d.ld, hd = A->c.head_dim;
        double t0 = omp_get_wtime();
        if (!m->params[0]->frozen)   // requires_grad = False (LoRA's base): no weight gradient
            act->be->rmsnorm_heads_backward_weight(act->be->ctx, hp_param_g(m->params[0]), s->dqkr, ld, s->qkv, ld,
                                                   s->rstd_q, N, d.H, hd);
        if (!m->params[1]->frozen)
            act->be->rmsnorm_heads_backward_weight(act->be->ctx, hp_param_g(m->params[1]), s->dqkr + d.qd, ld,
                                                   s->qkv + d.qd, ld, s->rstd_k, N, d.KV, hd);
        prof(act, HP_NN_OP_QK_NORM, t0);
    }
    return HP_OK;
}

static const hp_module_ops_t attn_ops = {
    "attention", attn_act_bytes, attn_scratch, attn_forward, attn_backward_input, attn_backward_weight, NULL,
    attn_save_items,
};

hp_status_t hp_attention_new(hp_model_t m, const char *name, const hp_attention_cfg_t *c, hp_module_t *wqkv,
                             hp_module_t *wo, hp_param_t *q_norm, hp_param_t *k_norm, hp_module_t **out) {
    HP_ASSERT(wqkv->n_params >= 3);   // wq | wk | wv stacked
    hp_module_t *a = hp_model_module_new(m, sizeof(attn_impl_t)), *core = NULL;
    if (!a) return HP_ERR_OOM;
    attn_impl_t *A = a->impl;
    A->c = *c;
    A->wq = wqkv->params[0];
    A->wk = wqkv->params[1];
    char nm[HP_PARAM_NAME_MAX];
    snprintf(nm, sizeof(nm), "%s.core", name);
    HP_TRY(nn_sdpa_core_new(m, nm, A->wq, c->head_dim, A->wk, c->head_dim, c->head_dim, c->head_dim, c->head_dim,
                            c->layer, &core));
    void *ai = a->impl;
    hp_module_base_init(a, &attn_ops, name, ai);
    a->children[a->n_children++] = wqkv;
    a->children[a->n_children++] = core;
    a->children[a->n_children++] = wo;
    if (c->qk_norm) {
        a->params[a->n_params++] = q_norm;
        a->params[a->n_params++] = k_norm;
    }
    *out = a;
    return HP_OK;
}

void hp_attention_local_heads(const hp_module_t *m, int *n_heads, int *n_kv_heads) {
    const attn_dims_t d = attn_dims(m->impl);
    if (n_heads) *n_heads = d.H;
    if (n_kv_heads) *n_kv_heads = d.KV;
}

hp_module_t *hp_attention_core(hp_module_t *m) { return m && m->ops == &attn_ops ? A_CORE(m) : NULL; }

/* The attention as the asynchronous context-parallel core sees it (cp.c): its projection
 * child, the raw projection rows and the qk-norm + RoPE it applies to rows before its core. */
hp_module_t *hp_attention_wqkv(hp_module_t *m) { return m && m->ops == &attn_ops ? A_WQKV(m) : NULL; }

const float *hp_attention_projection_rows(hp_module_t *m, hp_act_t *act) {
    if (!m || m->ops != &attn_ops || m->id < 0 || m->id >= act->n_slots || !act->slots[m->id]) return NULL;
    const attn_saved_t *s = hp_act_slot(act, m);
    return s->qkv;
}

hp_status_t hp_attention_prepare_rows(hp_module_t *m, hp_act_t *act, float *x, int ld, int rows, int n_q, int n_k,
                                      int pos0, float *rstd) {
    if (!m || m->ops != &attn_ops)
        return hp_error(HP_ERR_INVALID_ARG, "hp_attention_prepare_rows: module '%s' is not an attention module",
                        m ? m->name : "(null)");
    const attn_impl_t *A = m->impl;
    const int hd = A->c.head_dim, half = hd / 2;
    if (rows <= 0 || pos0 < 0 || n_q < 0 || n_k < 0 || ld < (n_q + n_k) * hd)
        return hp_error(HP_ERR_INVALID_ARG, "hp_attention_prepare_rows '%s': rows=%d, pos0=%d, n_q=%d, n_k=%d, "
                        "ld=%d, expected rows > 0, pos0 >= 0 and ld >= (n_q + n_k) x head_dim %d", m->name, rows,
                        pos0, n_q, n_k, ld, hd);
    if (A->c.qk_norm) {   // in place: each element is read before it is written (kernels.c)
        if (n_q) act->be->rmsnorm_heads_forward(act->be->ctx, x, ld, rstd, x, ld, hp_param_w(m->params[0]), rows, n_q,
                                                hd, A->c.eps);
        if (n_k) act->be->rmsnorm_heads_forward(act->be->ctx, x + (size_t)n_q * hd, ld, rstd, x + (size_t)n_q * hd, ld,
                                                hp_param_w(m->params[1]), rows, n_k, hd, A->c.eps);
    }
    const float *c = A->c.cos_t + (size_t)pos0 * half, *sn = A->c.sin_t + (size_t)pos0 * half;
    if (n_q) act->be->rope_apply(act->be->ctx, x, ld, 1, rows, n_q, hd, c, sn, A->c.style, 0);
    if (n_k) act->be->rope_apply(act->be->ctx, x + (size_t)n_q * hd, ld, 1, rows, n_k, hd, c, sn, A->c.style, 0);
    return HP_OK;
}

/* ---- feed-forward ----------------------------------------------------------------------- */

typedef struct ffn_impl {
    int dim;
    const hp_param_t *w1;   /* its local rows are the hidden features this call runs (a TP shard: hidden / tp) */
} ffn_impl_t;
static int ffn_hidden(const ffn_impl_t *F) { return (int)F->w1->value.local.shape[0]; }
#define F_W13(m) ((m)->children[0])
#define F_W2(m) ((m)->children[1])

typedef struct ffn_saved {
    float *h13;   // (N, 2*hidden) w1|w3 outputs
    float *a;     // (N, hidden) silu(h1) * h3
    int N;
} ffn_saved_t;

static size_t ffn_act_bytes(const hp_module_t *m, int B, int T) {
    const int hid = ffn_hidden(m->impl);
    size_t N = (size_t)B * T;
    return hp_arena_round(sizeof(ffn_saved_t)) + hp_arena_round(sizeof(float) * N * 2 * hid) +
           hp_arena_round(sizeof(float) * N * hid) + F_W13(m)->ops->act_bytes(F_W13(m), B, T) +
           F_W2(m)->ops->act_bytes(F_W2(m), B, T);
}

static size_t ffn_scratch(const hp_module_t *m, int B, int T) {
    return (size_t)B * T * 3 * ffn_hidden(m->impl);
}

/* Items: the w1|w3 output, the SwiGLU output; w2 writes the module's output. */
enum { FFN_A = 1 };
static void ffn_save_items(const hp_module_t *m, int B, int T, hp_save_list_t *L) {
    const ffn_impl_t *F = m->impl;
    const size_t N = (size_t)B * T, hid = (size_t)ffn_hidden(F);
    hp_save_child(L, F_W13(m), B, T, fl4(N * 2 * hid), HP_SAVE_MM, 2.0 * N * F->dim * 2 * hid, NULL, 0);
    hp_save_own(L, m, FFN_A, HP_SAVE_OTHER, fl4(N * hid), 0.0);
    hp_save_final(L, m, F_W2(m), B, T, HP_SAVE_MM, 2.0 * N * hid * F->dim, NULL, 0);
}

static hp_status_t ffn_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    ffn_impl_t *F = m->impl;
    const int N = act->B * act->T, hid = ffn_hidden(F);
    ffn_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->N = N;
    int run;
    s->h13 = hp_act_save_out(act, F_W13(m), sizeof(float) * (size_t)N * 2 * hid);
    s->a = hp_act_save(act, m, FFN_A, sizeof(float) * (size_t)N * hid, &run);
    hp_tensor_t t_in, t_h13, t_a;
    hp_tensor_view2(&t_in, in->data, N, F->dim);
    hp_tensor_view2(&t_h13, s->h13, N, 2 * hid);
    hp_tensor_view2(&t_a, s->a, N, hid);
    HP_TRY(hp_module_forward(F_W13(m), act, &t_in, &t_h13));
    double t0 = omp_get_wtime();
    if (run) act->be->swiglu_forward(act->be->ctx, s->a, s->h13, N, hid);
    prof(act, HP_NN_OP_SWIGLU_FWD, t0);
    return hp_module_forward(F_W2(m), act, &t_a, out);   // out += a W2^T (residual)
}

static hp_status_t ffn_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    ffn_impl_t *F = m->impl;
    ffn_saved_t *s = hp_act_slot(act, m);
    const int N = s->N, hid = ffn_hidden(F);
    size_t off = 0;
    float *da = hp_act_scratch(act, &off, (size_t)N * hid);
    float *dh13 = hp_act_scratch(act, &off, (size_t)N * 2 * hid);
    hp_tensor_t t_da, t_dh13, t_din;
    hp_tensor_view2(&t_da, da, N, hid);
    hp_tensor_view2(&t_dh13, dh13, N, 2 * hid);
    HP_TRY(hp_module_backward_input(F_W2(m), act, dout, &t_da));
    double t0 = omp_get_wtime();
    act->be->swiglu_backward(act->be->ctx, dh13, da, s->h13, N, hid);
    prof(act, HP_NN_OP_SWIGLU_BWD, t0);
    hp_tensor_view2(&t_din, din->data, N, F->dim);
    return hp_module_backward_input(F_W13(m), act, &t_dh13, &t_din);
}

static hp_status_t ffn_backward_weight(hp_module_t *m, hp_act_t *act) {
    HP_TRY(hp_module_backward_weight(F_W2(m), act));
    return hp_module_backward_weight(F_W13(m), act);
}

static const hp_module_ops_t ffn_ops = {
    "feed_forward", ffn_act_bytes, ffn_scratch, ffn_forward, ffn_backward_input, ffn_backward_weight, NULL,
    ffn_save_items,
};

hp_status_t hp_feed_forward_new(hp_model_t m, const char *name, int dim, int hidden, hp_module_t *w13,
                                hp_module_t *w2, hp_module_t **out) {
    HP_ASSERT(w13->n_params >= 2 && w13->params[0]->value.local.shape[0] == hidden);   // w1 | w3 stacked
    hp_module_t *f = module_new(m, &ffn_ops, name, sizeof(ffn_impl_t));
    if (!f) return HP_ERR_OOM;
    ffn_impl_t *F = f->impl;
    F->dim = dim;
    F->w1 = w13->params[0];
    f->children[f->n_children++] = w13;
    f->children[f->n_children++] = w2;
    *out = f;
    return HP_OK;
}

int hp_feed_forward_local_hidden(const hp_module_t *m) { return ffn_hidden(m->impl); }

/* ---- transformer block ------------------------------------------------------------------ */

typedef struct block_impl {
    int dim;
} block_impl_t;
#define K_ATTN_NORM(m) ((m)->children[0])
#define K_ATTN(m) ((m)->children[1])
#define K_FFN_NORM(m) ((m)->children[2])
#define K_FFN(m) ((m)->children[3])

typedef struct block_saved {
    float *xn;   // (N, dim) attention_norm(x)
    float *h;    // (N, dim) x + attention(xn)
    float *hn;   // (N, dim) ffn_norm(h)
    int N;
} block_saved_t;

static size_t block_act_bytes(const hp_module_t *m, int B, int T) {
    const block_impl_t *K = m->impl;
    size_t N = (size_t)B * T, s = hp_arena_round(sizeof(block_saved_t)) + 3 * hp_arena_round(sizeof(float) * N * K->dim);
    for (int i = 0; i < m->n_children; i++) s += m->children[i]->ops->act_bytes(m->children[i], B, T);
    return s;
}

static size_t child_scratch(const hp_module_t *c, int B, int T) {
    return c->ops->grad_scratch_floats ? c->ops->grad_scratch_floats(c, B, T) : 0;
}

static size_t block_scratch(const hp_module_t *m, int B, int T) {
    const block_impl_t *K = m->impl;
    return (size_t)B * T * 3 * K->dim + child_scratch(K_ATTN(m), B, T) + child_scratch(K_FFN(m), B, T);
}

static hp_status_t block_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    block_impl_t *K = m->impl;
    const int N = act->B * act->T;
    if (!in || !out || in->dtype != HP_F32 || hp_tensor_numel(in) != (int64_t)N * K->dim ||
        hp_tensor_numel(out) != (int64_t)N * K->dim)
        return hp_error(HP_ERR_INVALID_ARG, "block '%s': input and output must be f32 (%d, %d, %d)",
                        m->name, act->B, act->T, K->dim);
    block_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->N = N;
    s->xn = hp_act_save_out(act, K_ATTN_NORM(m), sizeof(float) * (size_t)N * K->dim);
    s->h = hp_act_save_out(act, K_ATTN(m), sizeof(float) * (size_t)N * K->dim);
    s->hn = hp_act_save_out(act, K_FFN_NORM(m), sizeof(float) * (size_t)N * K->dim);
    hp_tensor_t t_x, t_xn, t_h, t_hn, t_out;
    hp_tensor_view2(&t_x, in->data, N, K->dim);
    hp_tensor_view2(&t_xn, s->xn, N, K->dim);
    hp_tensor_view2(&t_h, s->h, N, K->dim);
    hp_tensor_view2(&t_hn, s->hn, N, K->dim);
    hp_tensor_view2(&t_out, out->data, N, K->dim);
    HP_TRY(hp_module_forward(K_ATTN_NORM(m), act, &t_x, &t_xn));
    // the residual adds fused into wo and w2 accumulate: their buffers start as a copy, unless kept
    if (!hp_act_out_kept(act, K_ATTN(m))) memcpy(s->h, in->data, sizeof(float) * (size_t)N * K->dim);
    HP_TRY(hp_module_forward(K_ATTN(m), act, &t_xn, &t_h));        // h = x + attn(xn)
    HP_TRY(hp_module_forward(K_FFN_NORM(m), act, &t_h, &t_hn));
    if (!hp_act_out_kept(act, m)) memcpy(out->data, s->h, sizeof(float) * (size_t)N * K->dim);
    return hp_module_forward(K_FFN(m), act, &t_hn, &t_out);  // out = h + ffn(hn)
}

/* Items: the attention_norm output, the attention's items and output (h), the ffn_norm output,
 * the feed-forward's items; the feed-forward writes the block's output. The kinds and FLOPs
 * given here are those of a child that does not list its own (one op to the policy). */
static void block_save_items(const hp_module_t *m, int B, int T, hp_save_list_t *L) {
    const block_impl_t *K = m->impl;
    const size_t x = fl4((size_t)B * T * K->dim);
    hp_save_child(L, K_ATTN_NORM(m), B, T, x, HP_SAVE_OTHER, 0.0, NULL, 0);
    hp_save_child(L, K_ATTN(m), B, T, x, HP_SAVE_MM, 0.0, NULL, 0);
    hp_save_child(L, K_FFN_NORM(m), B, T, x, HP_SAVE_OTHER, 0.0, NULL, 0);
    hp_save_final(L, m, K_FFN(m), B, T, HP_SAVE_MM, 0.0, NULL, 0);
}

static hp_status_t block_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    block_impl_t *K = m->impl;
    block_saved_t *s = hp_act_slot(act, m);
    const int N = s->N;
    float *base = act->grad_scratch;
    size_t cap = act->grad_scratch_floats, off = 0;
    float *dhn = hp_act_scratch(act, &off, (size_t)N * K->dim);
    float *dh = hp_act_scratch(act, &off, (size_t)N * K->dim);
    float *dxn = hp_act_scratch(act, &off, (size_t)N * K->dim);
    size_t attn_floats = child_scratch(K_ATTN(m), act->B, act->T);
    hp_tensor_t t_dhn, t_dh, t_dxn, t_din;
    hp_tensor_view2(&t_dhn, dhn, N, K->dim);
    hp_tensor_view2(&t_dh, dh, N, K->dim);
    hp_tensor_view2(&t_dxn, dxn, N, K->dim);
    hp_tensor_view2(&t_din, din->data, N, K->dim);
    hp_status_t st;
    // children carve their scratch from disjoint regions so their weight parts can run later
    act->grad_scratch = base + off + attn_floats;
    act->grad_scratch_floats = cap - off - attn_floats;
    st = hp_module_backward_input(K_FFN(m), act, dout, &t_dhn);
    if (st == HP_OK) {
        memcpy(dh, dout->data, sizeof(float) * (size_t)N * K->dim);
        st = hp_module_backward_input(K_FFN_NORM(m), act, &t_dhn, &t_dh);   // dh = dout + ...
    }
    if (st == HP_OK) {
        act->grad_scratch = base + off;
        act->grad_scratch_floats = attn_floats;
        st = hp_module_backward_input(K_ATTN(m), act, &t_dh, &t_dxn);
    }
    act->grad_scratch = base;
    act->grad_scratch_floats = cap;
    HP_TRY(st);
    memcpy(din->data, dh, sizeof(float) * (size_t)N * K->dim);
    return hp_module_backward_input(K_ATTN_NORM(m), act, &t_dxn, &t_din);   // din = dh + ...
}

static hp_status_t block_backward_weight(hp_module_t *m, hp_act_t *act) {
    HP_TRY(hp_module_backward_weight(K_FFN(m), act));
    HP_TRY(hp_module_backward_weight(K_FFN_NORM(m), act));
    HP_TRY(hp_module_backward_weight(K_ATTN(m), act));
    return hp_module_backward_weight(K_ATTN_NORM(m), act);
}

/* The residual stream keeps its split through the block: input and output are what the first
 * child that decides says of its input (sequence parallel: the attention_norm's). */
static int block_act_split(const hp_module_t *m, int output, hp_act_split_t *s) {
    (void)output;
    return hp_module_act_split(K_ATTN_NORM(m), 0, s) || hp_module_act_split(K_ATTN(m), 0, s);
}

static const hp_module_ops_t block_ops = {
    "transformer_block", block_act_bytes, block_scratch, block_forward, block_backward_input,
    block_backward_weight, block_act_split, block_save_items,
};

hp_status_t hp_block_new(hp_model_t m, const char *name, int dim, hp_module_t *attention_norm,
                         hp_module_t *attention, hp_module_t *ffn_norm, hp_module_t *feed_forward,
                         hp_module_t **out) {
    hp_module_t *b = module_new(m, &block_ops, name, sizeof(block_impl_t));
    if (!b) return HP_ERR_OOM;
    block_impl_t *K = b->impl;
    K->dim = dim;
    b->children[b->n_children++] = attention_norm;
    b->children[b->n_children++] = attention;
    b->children[b->n_children++] = ffn_norm;
    b->children[b->n_children++] = feed_forward;
    *out = b;
    return HP_OK;
}

/* ---- loss: cross-entropy over the logits (the head's replaceable child) ------------------ */

size_t hp_loss_act_bytes(const hp_module_t *loss, int B, int T) {
    (void)loss;
    const size_t N = (size_t)B * T;
    return hp_arena_round(sizeof(hp_loss_saved_t)) + hp_arena_round(sizeof(double) * N) +
           hp_arena_round(sizeof(float) * N);
}

hp_status_t hp_loss_begin(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_loss_saved_t **out) {
    if (!act->targets || !in || in->ndim != 2)
        return hp_error(HP_ERR_INVALID_ARG, "loss '%s' (%s): expected logits (N, V) and the targets (act->targets)",
                        m->name, m->ops->kind);
    hp_loss_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->sum = 0.0;
    s->n_valid = 0;
    s->logits = in->data;
    s->targets = act->targets;
    s->N = (int)in->shape[0];
    s->V = (int)in->shape[1];
    s->losses = hp_act_alloc(act, sizeof(double) * (size_t)s->N);
    s->lse = hp_act_alloc(act, sizeof(float) * (size_t)s->N);
    *out = s;
    return HP_OK;
}

static hp_status_t loss_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    (void)out;
    hp_loss_saved_t *s;
    HP_TRY(hp_loss_begin(m, act, in, &s));
    double t0 = omp_get_wtime();
    s->sum = act->be->cross_entropy_forward(act->be->ctx, s->losses, s->lse, s->logits, s->targets, s->N, s->V,
                                            &s->n_valid);
    prof(act, HP_NN_OP_CROSS_ENTROPY, t0);
    return HP_OK;
}

static hp_status_t loss_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    const hp_loss_saved_t *s = hp_act_slot(act, m);
    double t0 = omp_get_wtime();
    act->be->cross_entropy_backward(act->be->ctx, din->data, s->logits, s->lse, s->targets, *(const float *)dout->data,
                                    s->N, s->V, 0);
    prof(act, HP_NN_OP_CROSS_ENTROPY, t0);
    return HP_OK;
}

static const hp_module_ops_t loss_ops = {
    "cross_entropy", hp_loss_act_bytes, NULL, loss_forward, loss_backward_input, NULL, NULL, NULL,
};

int hp_module_is_loss(const hp_module_t *m) { return m && m->ops == &loss_ops; }

/* ---- head: final norm and output projection; the loss child ------------------------------- */

typedef struct head_impl {
    int dim;
} head_impl_t;
#define H_NORM(m) ((m)->children[0])
#define H_OUT(m) ((m)->children[1])
#define H_LOSS(m) ((m)->children[2])   /* run by the model container on the head's output */

typedef struct head_saved {
    float *hf;   // (Nr, dim) norm output
    int Nr;
} head_saved_t;

static size_t head_act_bytes(const hp_module_t *m, int B, int T) {
    const head_impl_t *H = m->impl;
    size_t s = hp_arena_round(sizeof(head_saved_t)) + hp_arena_round(sizeof(float) * (size_t)B * T * H->dim);
    for (int i = 0; i < m->n_children; i++) s += m->children[i]->ops->act_bytes(m->children[i], B, T);
    return s;
}

static size_t head_scratch(const hp_module_t *m, int B, int T) {
    const head_impl_t *H = m->impl;
    return (size_t)B * T * H->dim;
}

static hp_status_t head_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    head_impl_t *H = m->impl;
    const int Nr = act->B * act->T;
    head_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->Nr = Nr;
    s->hf = hp_act_alloc(act, sizeof(float) * (size_t)Nr * H->dim);
    hp_tensor_t t_x, t_h;
    hp_tensor_view2(&t_x, in->data, Nr, H->dim);
    hp_tensor_view2(&t_h, s->hf, Nr, H->dim);
    HP_TRY(hp_module_forward(H_NORM(m), act, &t_x, &t_h));
    return hp_module_forward(H_OUT(m), act, &t_h, out);
}

static hp_status_t head_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    head_impl_t *H = m->impl;
    head_saved_t *s = hp_act_slot(act, m);
    size_t off = 0;
    float *dh = hp_act_scratch(act, &off, (size_t)s->Nr * H->dim);
    hp_tensor_t t_dh, t_din;
    hp_tensor_view2(&t_dh, dh, s->Nr, H->dim);
    hp_tensor_view2(&t_din, din->data, s->Nr, H->dim);
    HP_TRY(hp_module_backward_input(H_OUT(m), act, dout, &t_dh));
    return hp_module_backward_input(H_NORM(m), act, &t_dh, &t_din);
}

static hp_status_t head_backward_weight(hp_module_t *m, hp_act_t *act) {
    HP_TRY(hp_module_backward_weight(H_OUT(m), act));
    return hp_module_backward_weight(H_NORM(m), act);
}

/* The head's input is the residual stream (its norm says how it is split); its output the
 * logits (its output projection says). */
static int head_act_split(const hp_module_t *m, int output, hp_act_split_t *s) {
    if (output) return hp_module_act_split(H_OUT(m), 1, s);
    return hp_module_act_split(H_NORM(m), 0, s) || hp_module_act_split(H_OUT(m), 0, s);
}

static const hp_module_ops_t head_ops = {
    "head", head_act_bytes, head_scratch, head_forward, head_backward_input, head_backward_weight, head_act_split, NULL,
};

hp_status_t hp_head_new(hp_model_t m, const char *name, int dim, hp_module_t *norm, hp_module_t *output,
                        hp_module_t **out) {
    hp_module_t *h = hp_model_module_new(m, sizeof(head_impl_t)), *loss = hp_model_module_new(m, 0);
    if (!h || !loss) return HP_ERR_OOM;
    void *hi = h->impl;
    hp_module_base_init(h, &head_ops, name, hi);
    hp_module_base_init(loss, &loss_ops, "loss", NULL);
    head_impl_t *H = hi;
    H->dim = dim;
    h->children[h->n_children++] = norm;
    h->children[h->n_children++] = output;
    h->children[h->n_children++] = loss;
    *out = h;
    return HP_OK;
}

hp_module_t *nn_head_loss(hp_module_t *m) {
    if (!m) return NULL;
    if (m->ops == &head_ops) return H_LOSS(m);
    for (int i = 0; i < m->n_children; i++) {   // the head under a wrapper
        hp_module_t *l = nn_head_loss(m->children[i]);
        if (l) return l;
    }
    return NULL;
}
