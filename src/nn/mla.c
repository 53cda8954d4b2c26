/* Multi-head latent attention (DeepSeek-V3 MLA, TorchTitan's deepseek_v3 Attention): the q
 * path (wq, or wq_a -> q_norm -> wq_b), the latent path (wkv_a -> [c | k_pe], kv_norm(c) ->
 * wkv_b -> [k_nope | v] per head), RoPE (interleaved pairs) on the last qk_rope channels of q
 * and on k_pe (one for every head), the causal SDPA core and wo. The core has one head width
 * hc = max(qk_nope + qk_rope, v_head): the narrower of q|k and v is zero-padded to it (zero
 * channels add nothing to q.k and give zero output columns, which are dropped), and q is
 * pre-scaled by scale * sqrt(hc) so that the core's 1/sqrt(hc) gives MLA's softmax scale. The
 * core is the model's "sdpa" module, so context parallel swaps it for ring / Ulysses attention
 * over the same [q | k | v] rows; RoPE then follows the context's position segments. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/comm.h"
#include "hyperparallel/mesh.h"
#include "nn/nn-model.h"

typedef struct mla_impl {
    hp_mla_cfg_t c;
    const hp_param_t *qw;          /* wq (or wq_b) weight: its local rows / qk_head are the heads this call runs */
    int nq;                        /* children of the q path: 1 (wq) or 3 (wq_a, q_norm, wq_b) */
    float alpha;                   /* q pre-scale: scale * sqrt(hc) */
} mla_impl_t;

static int mla_heads(const mla_impl_t *A) { return (int)(A->qw->value.local.shape[0] / (A->c.nope + A->c.rope)); }
/* Children are read from the module at every call (hp_module_replace_child swaps them). */
#define M_Q(m, i) ((m)->children[i])
#define M_WKVA(m) ((m)->children[((mla_impl_t *)(m)->impl)->nq])
#define M_KVN(m) ((m)->children[((mla_impl_t *)(m)->impl)->nq + 1])
#define M_WKVB(m) ((m)->children[((mla_impl_t *)(m)->impl)->nq + 2])
#define M_CORE(m) ((m)->children[((mla_impl_t *)(m)->impl)->nq + 3])
#define M_WO(m) ((m)->children[((mla_impl_t *)(m)->impl)->nq + 4])

typedef struct mla_saved {
    float *qa, *qan;   // (N, q_lora) wq_a output, q_norm output (q_lora > 0)
    float *q;          // (N, H*qk) wq / wq_b output
    float *kva;        // (N, kv_lora + rope) wkv_a output
    float *kvc;        // (N, kv_lora) the latent c, contiguous (kv_norm input)
    float *kvn;        // (N, kv_lora) kv_norm output
    float *kvb;        // (N, H*(nope + v)) wkv_b output
    float *qkv;        // (N, 3*H*hc) core input [q | k | v], padded, RoPE applied, q pre-scaled
    float *o;          // (N, H*hc) core output
    float *ov;         // (N, H*v) wo input
    int B, T;
} mla_saved_t;

static size_t fl(size_t n) { return hp_arena_round(sizeof(float) * n); }

static size_t mla_act_bytes(const hp_module_t *m, int B, int T) {
    const mla_impl_t *A = m->impl;
    const hp_mla_cfg_t *c = &A->c;
    const size_t N = (size_t)B * T, H = (size_t)mla_heads(A);
    size_t s = hp_arena_round(sizeof(mla_saved_t)) + fl(N * H * (c->nope + c->rope)) +
               fl(N * (c->kv_lora + c->rope)) + 2 * fl(N * c->kv_lora) + fl(N * H * (c->nope + c->v)) +
               fl(N * 3 * H * c->hc) + fl(N * H * c->hc) + fl(N * H * c->v);
    if (c->q_lora) s += 2 * fl(N * c->q_lora);
    for (int i = 0; i < m->n_children; i++) s += m->children[i]->ops->act_bytes(m->children[i], B, T);
    return s;
}

/* Backward scratch (floats): dov, do, dqkv, dq, dkvb, dkvn, dkvc, dpe, dkva (+ dqan, dqa). */
static size_t mla_scratch(const hp_module_t *m, int B, int T) {
    const mla_impl_t *A = m->impl;
    const hp_mla_cfg_t *c = &A->c;
    const size_t N = (size_t)B * T, H = (size_t)mla_heads(A);
    return N * (H * c->v + H * c->hc + 3 * H * c->hc + H * (c->nope + c->rope) + H * (c->nope + c->v) +
                2 * (size_t)c->kv_lora + c->rope + (c->kv_lora + c->rope) + 2 * (size_t)c->q_lora) + 16 * 12;
}

/* RoPE on `heads` blocks of `rope` channels at column off + h * stride of rows (B*T, ld), at
 * positions pos0 + t, or (context parallel) the context's segments at their global positions. */
static void rope_heads(hp_act_t *act, const mla_impl_t *A, float *x, int ld, int B, int T, int heads, int stride,
                       int off, int inverse) {
    const int half = A->c.rope / 2;
    if (act->n_pos_segs > 0 && !act->kv) {
        const int L = T / act->n_pos_segs;
        for (int b = 0; b < B; b++)
            for (int g = 0; g < act->n_pos_segs; g++) {
                float *xs = x + ((size_t)b * T + (size_t)g * L) * ld;
                const float *cs = A->c.cos_t + (size_t)act->pos_segs[g] * half, *sn = A->c.sin_t + (size_t)act->pos_segs[g] * half;
                for (int h = 0; h < heads; h++)
                    act->be->rope_apply(act->be->ctx, xs + (size_t)h * stride + off, ld, 1, L, 1, A->c.rope, cs, sn,
                                        HP_ROPE_INTERLEAVED, inverse);
            }
        return;
    }
    const float *cs = A->c.cos_t + (size_t)act->pos0 * half, *sn = A->c.sin_t + (size_t)act->pos0 * half;
    for (int h = 0; h < heads; h++)
        act->be->rope_apply(act->be->ctx, x + (size_t)h * stride + off, ld, B, T, 1, A->c.rope, cs, sn,
                            HP_ROPE_INTERLEAVED, inverse);
}

/* dpe summed over this rank's heads is Partial over the mesh dims whose ranks split the heads
 * (the dims where the q weight is Shard(0): a sum over a sharded dim, as DTensor propagates
 * it); the all-reduce makes it the whole sum. No dim: nothing to do. */
static hp_status_t reduce_over_heads(const mla_impl_t *A, float *dpe, size_t n) {
    const hp_dtensor_t *w = &A->qw->value;
    for (int i = 0; w->mesh && i < w->mesh_ndim; i++)
        if (w->placements[i].kind == HP_SHARD && w->placements[i].dim == 0 && hp_mesh_size(w->mesh, i) > 1)
            HP_TRY(hp_all_reduce(dpe, dpe, n, HP_F32, HP_SUM, hp_mesh_get_comm(w->mesh, i), NULL));
    return HP_OK;
}

/* Saved-tensor items (save_items, nn_module.h): the projections' outputs (q path, wkv_a, kv_norm,
 * wkv_b), the latent copy, the core's [q | k | v] rows (built, padded, RoPE applied), the core's
 * output and its per-head slice for wo; wo writes the module's output. */
enum { MLA_KVC = 1, MLA_QKV, MLA_OV };

static void mla_save_items(const hp_module_t *m, int B, int T, hp_save_list_t *L) {
    const mla_impl_t *A = m->impl;
    const hp_mla_cfg_t *c = &A->c;
    const size_t N = (size_t)B * T, H = (size_t)mla_heads(A), qk = c->nope + c->rope, D = c->dim;
    if (c->q_lora) {
        hp_save_child(L, M_Q(m, 0), B, T, fl(N * c->q_lora), HP_SAVE_MM, 2.0 * N * D * c->q_lora, NULL, 0);
        hp_save_child(L, M_Q(m, 1), B, T, fl(N * c->q_lora), HP_SAVE_OTHER, 0.0, NULL, 0);
        hp_save_child(L, M_Q(m, 2), B, T, fl(N * H * qk), HP_SAVE_MM, 2.0 * N * c->q_lora * H * qk, NULL, 0);
    } else {
        hp_save_child(L, M_Q(m, 0), B, T, fl(N * H * qk), HP_SAVE_MM, 2.0 * N * D * H * qk, NULL, 0);
    }
    hp_save_child(L, M_WKVA(m), B, T, fl(N * (c->kv_lora + c->rope)), HP_SAVE_MM,
                  2.0 * N * D * (c->kv_lora + c->rope), NULL, 0);
    hp_save_own(L, m, MLA_KVC, HP_SAVE_OTHER, fl(N * c->kv_lora), 0.0);
    hp_save_child(L, M_KVN(m), B, T, fl(N * c->kv_lora), HP_SAVE_OTHER, 0.0, NULL, 0);
    hp_save_child(L, M_WKVB(m), B, T, fl(N * H * (c->nope + c->v)), HP_SAVE_MM,
                  2.0 * N * c->kv_lora * H * (c->nope + c->v), NULL, 0);
    hp_save_own(L, m, MLA_QKV, HP_SAVE_OTHER, fl(N * 3 * H * c->hc), 0.0);
    hp_save_child(L, M_CORE(m), B, T, fl(N * H * c->hc), HP_SAVE_ATTENTION, 4.0 * N * T * H * c->hc, NULL, 0);
    hp_save_own(L, m, MLA_OV, HP_SAVE_OTHER, fl(N * H * c->v), 0.0);
    hp_save_final(L, m, M_WO(m), B, T, HP_SAVE_MM, 2.0 * N * H * c->v * D, NULL, 0);
}

static hp_status_t mla_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    mla_impl_t *A = m->impl;
    const hp_mla_cfg_t *c = &A->c;
    const int N = act->B * act->T, H = mla_heads(A), qk = c->nope + c->rope, hc = c->hc, kvl = c->kv_lora;
    const int lda = kvl + c->rope, ldb = c->nope + c->v, ld3 = 3 * H * hc;
    mla_saved_t *s = hp_act_slot_new(act, m, sizeof(*s));
    s->B = act->B;
    s->T = act->T;
    // the items (mla_save_items): a replay makes only the dropped ones, the children of kept ones skipped
    int run_kvc, run_qkv, run_ov;
    s->q = hp_act_save_out(act, M_Q(m, A->nq - 1), sizeof(float) * (size_t)N * H * qk);
    s->kva = hp_act_save_out(act, M_WKVA(m), sizeof(float) * (size_t)N * lda);
    s->kvc = hp_act_save(act, m, MLA_KVC, sizeof(float) * (size_t)N * kvl, &run_kvc);
    s->kvn = hp_act_save_out(act, M_KVN(m), sizeof(float) * (size_t)N * kvl);
    s->kvb = hp_act_save_out(act, M_WKVB(m), sizeof(float) * (size_t)N * H * ldb);
    s->qkv = hp_act_save(act, m, MLA_QKV, sizeof(float) * (size_t)N * ld3, &run_qkv);
    s->o = hp_act_save_out(act, M_CORE(m), sizeof(float) * (size_t)N * H * hc);
    s->ov = hp_act_save(act, m, MLA_OV, sizeof(float) * (size_t)N * H * c->v, &run_ov);
    hp_tensor_t tx, ta, tb, tq;
    hp_tensor_view2(&tx, in->data, N, c->dim);
    hp_tensor_view2(&tq, s->q, N, (int64_t)H * qk);
    if (c->q_lora) {
        s->qa = hp_act_save_out(act, M_Q(m, 0), sizeof(float) * (size_t)N * c->q_lora);
        s->qan = hp_act_save_out(act, M_Q(m, 1), sizeof(float) * (size_t)N * c->q_lora);
        hp_tensor_view2(&ta, s->qa, N, c->q_lora);
        hp_tensor_view2(&tb, s->qan, N, c->q_lora);
        HP_TRY(hp_module_forward(M_Q(m, 0), act, &tx, &ta));
        HP_TRY(hp_module_forward(M_Q(m, 1), act, &ta, &tb));
        HP_TRY(hp_module_forward(M_Q(m, 2), act, &tb, &tq));
    } else {
        HP_TRY(hp_module_forward(M_Q(m, 0), act, &tx, &tq));
    }
    hp_tensor_view2(&ta, s->kva, N, lda);
    HP_TRY(hp_module_forward(M_WKVA(m), act, &tx, &ta));
    if (run_kvc) act->be->copy_rows(act->be->ctx, s->kvc, kvl, s->kva, lda, N, kvl);
    hp_tensor_view2(&ta, s->kvc, N, kvl);
    hp_tensor_view2(&tb, s->kvn, N, kvl);
    HP_TRY(hp_module_forward(M_KVN(m), act, &ta, &tb));
    hp_tensor_view2(&tb, s->kvb, N, (int64_t)H * ldb);
    hp_tensor_view2(&ta, s->kvn, N, kvl);
    HP_TRY(hp_module_forward(M_WKVB(m), act, &ta, &tb));
    // core rows: q = alpha [q_nope, q_pe, 0], k = [k_nope, k_pe, 0], v = [v, 0] per head
    const float alpha = A->alpha;
    if (run_qkv) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++) {
            float *r = s->qkv + (size_t)n * ld3;
            const float *q = s->q + (size_t)n * H * qk, *b = s->kvb + (size_t)n * H * ldb, *pe = s->kva + (size_t)n * lda + kvl;
            for (int h = 0; h < H; h++) {
                float *qh = r + (size_t)h * hc, *kh = r + (size_t)(H + h) * hc, *vh = r + (size_t)(2 * H + h) * hc;
                for (int j = 0; j < qk; j++) qh[j] = alpha * q[(size_t)h * qk + j];
                memcpy(kh, b + (size_t)h * ldb, sizeof(float) * (size_t)c->nope);
                memcpy(kh + c->nope, pe, sizeof(float) * (size_t)c->rope);
                memcpy(vh, b + (size_t)h * ldb + c->nope, sizeof(float) * (size_t)c->v);
                for (int j = qk; j < hc; j++) qh[j] = kh[j] = 0.0f;
                for (int j = c->v; j < hc; j++) vh[j] = 0.0f;
            }
        }
    }
    double t0 = omp_get_wtime();
    if (run_qkv) rope_heads(act, A, s->qkv, ld3, act->B, act->T, 2 * H, hc, c->nope, 0);   // q heads then k heads
    if (act->prof) act->prof[HP_NN_OP_ROPE] += omp_get_wtime() - t0;
    if (act->kv) {   // decode: append this chunk's keys and (padded) values to the layer's cache rows
        struct hp_model_kv_cache *kc = act->kv;
        const size_t kd = (size_t)H * hc;
        float *K = kc->k + ((size_t)c->layer * kc->max_len + act->pos0) * kd;
        float *V = kc->v + ((size_t)c->layer * kc->max_len + act->pos0) * kd;
        act->be->copy_rows(act->be->ctx, K, (int)kd, s->qkv + kd, ld3, N, (int)kd);
        act->be->copy_rows(act->be->ctx, V, (int)kd, s->qkv + 2 * kd, ld3, N, (int)kd);
    }
    hp_tensor_view2(&ta, s->qkv, N, ld3);
    hp_tensor_view2(&tb, s->o, N, (int64_t)H * hc);
    HP_TRY(hp_module_forward(M_CORE(m), act, &ta, &tb));
    for (int h = 0; run_ov && h < H; h++)
        act->be->copy_rows(act->be->ctx, s->ov + (size_t)h * c->v, H * c->v, s->o + (size_t)h * hc, H * hc, N, c->v);
    hp_tensor_view2(&ta, s->ov, N, (int64_t)H * c->v);
    return hp_module_forward(M_WO(m), act, &ta, out);   // out += ov Wo^T (residual)
}

static hp_status_t mla_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    mla_impl_t *A = m->impl;
    const hp_mla_cfg_t *c = &A->c;
    mla_saved_t *s = hp_act_slot(act, m);
    const int N = s->B * s->T, H = mla_heads(A), qk = c->nope + c->rope, hc = c->hc, kvl = c->kv_lora;
    const int lda = kvl + c->rope, ldb = c->nope + c->v, ld3 = 3 * H * hc;
    size_t off = 0;
    float *dov = hp_act_scratch(act, &off, (size_t)N * H * c->v);
    float *dO = hp_act_scratch(act, &off, (size_t)N * H * hc);
    float *dqkv = hp_act_scratch(act, &off, (size_t)N * ld3);
    float *dq = hp_act_scratch(act, &off, (size_t)N * H * qk);
    float *dkvb = hp_act_scratch(act, &off, (size_t)N * H * ldb);
    float *dkvn = hp_act_scratch(act, &off, (size_t)N * kvl);
    float *dkvc = hp_act_scratch(act, &off, (size_t)N * kvl);
    float *dpe = hp_act_scratch(act, &off, (size_t)N * c->rope);
    float *dkva = hp_act_scratch(act, &off, (size_t)N * lda);
    hp_tensor_t ta, tb;
    hp_tensor_view2(&ta, dov, N, (int64_t)H * c->v);
    HP_TRY(hp_module_backward_input(M_WO(m), act, dout, &ta));
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            float *d = dO + ((size_t)n * H + h) * hc;
            memcpy(d, dov + ((size_t)n * H + h) * c->v, sizeof(float) * (size_t)c->v);
            for (int j = c->v; j < hc; j++) d[j] = 0.0f;
        }
    hp_tensor_view2(&ta, dO, N, (int64_t)H * hc);
    hp_tensor_view2(&tb, dqkv, N, ld3);
    HP_TRY(hp_module_backward_input(M_CORE(m), act, &ta, &tb));
    double t0 = omp_get_wtime();
    rope_heads(act, A, dqkv, ld3, s->B, s->T, 2 * H, hc, c->nope, 1);
    if (act->prof) act->prof[HP_NN_OP_ROPE] += omp_get_wtime() - t0;
    // split the core gradient: dq (pre-scale undone), dkvb = [dk_nope | dv], dpe = sum over heads
    const float alpha = A->alpha;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *r = dqkv + (size_t)n * ld3;
        float *q = dq + (size_t)n * H * qk, *b = dkvb + (size_t)n * H * ldb, *pe = dpe + (size_t)n * c->rope;
        for (int j = 0; j < c->rope; j++) pe[j] = 0.0f;
        for (int h = 0; h < H; h++) {   // heads in order: a fixed summation order for dpe
            const float *qh = r + (size_t)h * hc, *kh = r + (size_t)(H + h) * hc, *vh = r + (size_t)(2 * H + h) * hc;
            for (int j = 0; j < qk; j++) q[(size_t)h * qk + j] = alpha * qh[j];
            memcpy(b + (size_t)h * ldb, kh, sizeof(float) * (size_t)c->nope);
            memcpy(b + (size_t)h * ldb + c->nope, vh, sizeof(float) * (size_t)c->v);
            for (int j = 0; j < c->rope; j++) pe[j] += kh[c->nope + j];
        }
    }
    HP_TRY(reduce_over_heads(A, dpe, (size_t)N * c->rope));   // k_pe feeds every head
    // the latent: wkv_b, kv_norm; then dkva = [dc | dk_pe]
    hp_tensor_view2(&ta, dkvb, N, (int64_t)H * ldb);
    hp_tensor_view2(&tb, dkvn, N, kvl);
    HP_TRY(hp_module_backward_input(M_WKVB(m), act, &ta, &tb));
    hp_tensor_view2(&ta, dkvc, N, kvl);
    HP_TRY(hp_module_backward_input(M_KVN(m), act, &tb, &ta));
    act->be->copy_rows(act->be->ctx, dkva, lda, dkvc, kvl, N, kvl);
    act->be->copy_rows(act->be->ctx, dkva + kvl, lda, dpe, c->rope, N, c->rope);
    // the q path writes din (=), wkv_a adds to it (+=)
    hp_tensor_view2(&ta, dq, N, (int64_t)H * qk);
    if (c->q_lora) {
        float *dqan = hp_act_scratch(act, &off, (size_t)N * c->q_lora);
        float *dqa = hp_act_scratch(act, &off, (size_t)N * c->q_lora);
        hp_tensor_t tc;
        hp_tensor_view2(&tb, dqan, N, c->q_lora);
        hp_tensor_view2(&tc, dqa, N, c->q_lora);
        HP_TRY(hp_module_backward_input(M_Q(m, 2), act, &ta, &tb));
        HP_TRY(hp_module_backward_input(M_Q(m, 1), act, &tb, &tc));
        HP_TRY(hp_module_backward_input(M_Q(m, 0), act, &tc, din));
    } else {
        HP_TRY(hp_module_backward_input(M_Q(m, 0), act, &ta, din));
    }
    hp_tensor_view2(&ta, dkva, N, lda);
    return hp_module_backward_input(M_WKVA(m), act, &ta, din);
}

static hp_status_t mla_backward_weight(hp_module_t *m, hp_act_t *act) {
    for (int i = m->n_children - 1; i >= 0; i--) HP_TRY(hp_module_backward_weight(m->children[i], act));
    return HP_OK;
}

static const hp_module_ops_t mla_ops = {
    "mla_attention", mla_act_bytes, mla_scratch, mla_forward, mla_backward_input, mla_backward_weight, NULL,
    mla_save_items,
};

hp_status_t hp_mla_new(hp_model_t m, const char *name, const hp_mla_cfg_t *c, hp_module_t *const *kids, int n_kids,
                       hp_module_t **out) {
    const int nq = c->q_lora ? 3 : 1;
    HP_ASSERT(n_kids == nq + 4);
    hp_module_t *a = hp_model_module_new(m, sizeof(mla_impl_t)), *core = NULL;
    if (!a) return HP_ERR_OOM;
    mla_impl_t *A = a->impl;
    A->c = *c;
    A->qw = kids[nq - 1]->params[0];   // wq, or wq_b
    A->nq = nq;
    A->alpha = (float)((double)c->scale * sqrt((double)c->hc));
    char nm[HP_PARAM_NAME_MAX];
    snprintf(nm, sizeof(nm), "%s.core", name);
    const int qk = c->nope + c->rope;   // the core's heads: wq's rows per head, every head its own k and v
    HP_TRY(nn_sdpa_core_new(m, nm, A->qw, qk, A->qw, qk, c->hc, c->layer, &core));
    void *ai = a->impl;
    hp_module_base_init(a, &mla_ops, name, ai);
    for (int i = 0; i < nq + 3; i++) a->children[a->n_children++] = kids[i];
    a->children[a->n_children++] = core;
    a->children[a->n_children++] = kids[nq + 3];
    *out = a;
    return HP_OK;
}

int hp_mla_local_heads(const hp_module_t *m) {
    return m && m->ops == &mla_ops ? mla_heads(m->impl) : 0;
}
