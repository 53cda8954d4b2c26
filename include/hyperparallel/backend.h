/* hp_backend_t: the kernel table, the only device seam. Every kernel and GEMM in the library
 * (the model's layers, the optimizers' updates and Newton-Schulz products, DTensor's matmul, the
 * context-parallel block attention, the peak-FLOP/s probe) and the BLAS thread count are
 * reached through one table plus its context: from the micro-batch context (hp_act_t.be) in
 * the model, from hp_backend_default() elsewhere. The table's type sits at the core layer so
 * every layer can call it; the CPU backend that fills it (OpenBLAS + OpenMP, host memory) is
 * hp_backend_cpu() in src/nn, whose kernels keep their plain hp_ref_* twins (nn.h) that tests
 * compare them with. A CUDA + cuBLAS backend fills the same slots for device memory
 * (hp_tensor_t.device). Argument order and shapes are those of nn.h's kernels. Every slot is
 * required unless its comment says optional (NULL), and then it names the default. */
#ifndef HYPERPARALLEL_BACKEND_H
#define HYPERPARALLEL_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "dtype.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_rope_scaling hp_rope_scaling_t;

/* One product of a grouped GEMM (gemm_grouped): c (M, N) = alpha op(a) op(b) + beta c,
 * row-major, as the gemm slot's arguments. */
typedef struct hp_gemm_group {
    float *c;
    const float *a, *b;
    int M, N, K;
    int ldc, lda, ldb;
} hp_gemm_group_t;

typedef struct hp_backend {
    const char *name;          /* "cpu" */
    hp_device_t device;        /* where the buffers it takes live */
    void *ctx;                 /* backend state (streams, handles); NULL for the CPU */

    /* memory: buffers of `bytes` on the backend's device, zeroed; free(NULL) is a no-op */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p);
    void (*memset0)(void *ctx, void *p, size_t bytes);
    /* rows of `cols` floats from src (row stride lds) to dst (row stride ldd) */
    void (*copy_rows)(void *ctx, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                      int64_t cols);
    /* n elements between dtypes (f32 <-> bf16 / f16, round to nearest even) */
    void (*convert)(void *ctx, void *dst, hp_dtype_t dst_dt, const void *src, hp_dtype_t src_dt, int64_t n);
    void (*add_inplace)(void *ctx, float *y, const float *x, int64_t n);   /* y += x */

    /* linear: out (N, OC) = inp (N, IC) W^T (OC, IC) (+ bias); acc: out += */
    void (*linear_forward)(void *ctx, float *out, const float *inp, const float *weight, const float *bias,
                           int N, int IC, int OC, int accumulate);
    /* dinp (N, IC) (= or += with accumulate) = dout (N, OC) W (OC, IC) */
    void (*linear_backward_input)(void *ctx, float *dinp, const float *dout, const float *weight, int N, int IC,
                                  int OC, int accumulate);
    /* dweight (OC, IC) += dout^T inp; dbias (OC) += column sums (may be NULL) */
    void (*linear_backward_weight)(void *ctx, float *dweight, float *dbias, const float *dout, const float *inp,
                                   int N, int IC, int OC);

    /* rmsnorm over rows of C; rstd (N) saved */
    void (*rmsnorm_forward)(void *ctx, float *out, float *rstd, const float *inp, const float *weight, int N,
                            int C, float eps);
    void (*rmsnorm_backward_input)(void *ctx, float *dinp, const float *dout, const float *inp,
                                   const float *weight, const float *rstd, int N, int C, int accumulate);
    void (*rmsnorm_backward_weight)(void *ctx, float *dweight, const float *dout, const float *inp,
                                    const float *rstd, int N, int C);
    /* head-wise rmsnorm (qk-norm): rows (token n, head h) at n*ld + h*C */
    void (*rmsnorm_heads_forward)(void *ctx, float *out, int ldo, float *rstd, const float *inp, int ldi,
                                  const float *weight, int N, int n_heads, int C, float eps);
    void (*rmsnorm_heads_backward_input)(void *ctx, float *dinp, int ldo, const float *dout, int lddo,
                                         const float *inp, int ldi, const float *weight, const float *rstd,
                                         int N, int n_heads, int C);
    void (*rmsnorm_heads_backward_weight)(void *ctx, float *dweight, const float *dout, int lddo,
                                          const float *inp, int ldi, const float *rstd, int N, int n_heads, int C);

    /* RoPE in place; cos_t / sin_t rows are positions (the caller offsets them by the
     * context's first global position); style: hp_rope_style_t */
    void (*rope_apply)(void *ctx, float *x, int ld, int B, int T, int n_heads, int head_dim, const float *cos_t,
                       const float *sin_t, int style, int inverse);

    /* causal attention (GQA), see hp_attention_forward / _backward / _decode_forward */
    void (*attention_forward)(void *ctx, float *out, float *lse, const float *q, int ldq, const float *k,
                              int ldk, const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd);
    void (*attention_backward)(void *ctx, float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                               const float *dout, const float *out, const float *lse, const float *q, int ldq,
                               const float *k, int ldk, const float *v, int ldv, int B, int T, int Hq, int Hkv,
                               int hd);
    void (*attention_decode_forward)(void *ctx, float *out, float *scratch, const float *q, int ldq,
                                     const float *k, int ldk, const float *v, int ldv, int p0, int n, int Hq,
                                     int Hkv, int hd, int n_threads);

    /* Causal attention with separate head widths (MLA): q|k heads hd wide, v and out heads hv
     * wide, softmax scale 1/sqrt(hd) (hp_attention_forward_qk_v / _backward_qk_v; the same
     * arguments as attention_forward / _backward plus hv). Optional: NULL when the backend has
     * none; then MLA zero-pads the narrower side to one width max(hd, hv) and calls
     * attention_forward / _backward (its layout before this slot existed). */
    void (*attention_qk_v_forward)(void *ctx, float *out, float *lse, const float *q, int ldq, const float *k,
                                   int ldk, const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd, int hv);
    void (*attention_qk_v_backward)(void *ctx, float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                                    const float *dout, const float *out, const float *lse, const float *q, int ldq,
                                    const float *k, int ldk, const float *v, int ldv, int B, int T, int Hq, int Hkv,
                                    int hd, int hv);
    /* Grouped GEMM (the MoE experts: one product per expert over its rows): for each of the n
     * groups, c = alpha op(a) op(b) + beta c with the group's operands, sizes and strides, and
     * trans_a / trans_b / alpha / beta shared. Groups write disjoint c. Optional: NULL runs one
     * gemm call per group in order (hp_backend_gemm_grouped). The CPU's (hp_gemm_grouped) runs
     * all groups' row blocks in one thread team (few rows per group would otherwise pay a fork
     * and join each), each block the cblas call linear_* makes for it: bitwise the per-group
     * linear_* products (the default's single gemm call per group may block its sums
     * differently, within the usual GEMM rounding). */
    void (*gemm_grouped)(void *ctx, const hp_gemm_group_t *groups, int n, int trans_a, int trans_b, float alpha,
                         float beta);

    void (*swiglu_forward)(void *ctx, float *out, const float *h13, int N, int H);
    void (*swiglu_backward)(void *ctx, float *dh13, const float *dout, const float *h13, int N, int H);

    void (*embedding_forward)(void *ctx, float *out, const int32_t *tokens, const float *weight, int N, int C);
    void (*embedding_backward)(void *ctx, float *dweight, const float *dout, const int32_t *tokens, int N, int C,
                               int V);

    /* cross-entropy: returns the sum over valid rows (double), losses (N) and lse (N) saved */
    double (*cross_entropy_forward)(void *ctx, double *losses, float *lse, const float *logits,
                                    const int32_t *targets, int N, int V, int64_t *n_valid);
    /* over a column shard (V_local columns starting at vocab_offset; 0 and V: the whole vocab) */
    void (*cross_entropy_backward)(void *ctx, float *dlogits, const float *logits, const float *lse,
                                   const int32_t *targets, float dloss, int N, int V_local, int64_t vocab_offset);

    /* optimizer updates over n elements, torch.optim single-tensor semantics (optim.h):
     * AdamW at 1-based `step` (decoupled weight decay, bias-corrected); SGD with L2 weight
     * decay, momentum buffer buf (NULL when momentum is 0), dampening, nesterov; `started`
     * is 0 on the buffer's first step. */
    void (*adamw_update)(void *ctx, float *p, float *m, float *v, const float *g, int64_t n, double lr,
                         double b1, double b2, double eps, double wd, int64_t step);
    void (*sgd_update)(void *ctx, float *p, float *buf, const float *g, int64_t n, double lr, double wd,
                       double momentum, double dampening, int nesterov, int started);

    /* General GEMM, row-major, as BLAS sgemm: c (M, N) = alpha op(a) op(b) + beta c, where
     * op(a) (M, K) is a (M, K) at row stride lda, or the transpose of a (K, M) when trans_a;
     * op(b) (K, N) is b (K, N) at row stride ldb, or the transpose of b (N, K) when trans_b;
     * c at row stride ldc. One call, not split over threads by the caller (the CPU backend:
     * one cblas_sgemm with exactly these arguments, so a caller gets the bits it got from
     * cblas before). Used by Muon's Newton-Schulz, DTensor's matmul, the block attention,
     * the peak-FLOP/s probe. */
    void (*gemm)(void *ctx, float *c, int ldc, const float *a, int lda, const float *b, int ldb, int M, int N,
                 int K, int trans_a, int trans_b, float alpha, float beta);

    /* bf16 GEMM: c (M, N) f32 = alpha op(a) op(b) + beta c with a and b bf16 (hp_bf16_t), the
     * gemm slot's conventions. Optional: NULL when the backend has none (hp_backend_has_gemm_bf16;
     * a caller then widens to f32 with convert and calls gemm). The CPU's: hp_gemm_bf16
     * (nn_kernels.h), oneDNN's AMX kernels where the CPU has AMX, else widen + sgemm. ws: the
     * caller's scratch of ws_floats floats (at least hp_gemm_bf16_ws_floats(M, N, K, ta, tb), which
     * is 0 where no implementation needs one), so a step allocates nothing; NULL: the call
     * allocates what it needs (callers outside the training step). */
    void (*gemm_bf16)(void *ctx, float *c, int ldc, const uint16_t *a, int lda, const uint16_t *b, int ldb, int M,
                      int N, int K, int trans_a, int trans_b, float alpha, float beta, float *ws, size_t ws_floats);

    /* Block attention for context parallel (attention_block.h, whose hp_attn_block_* are the CPU
     * kernels): one query block (Tq rows) against one key/value block (Tk rows) under a mask
     * (hp_attn_mask_t), out (Tq, Hq, hd) (=) and lse (Hq, Tq) (=); the backward given the
     * merged out and lse (dq / dk / dv +=); the log-sum-exp merge of a block result into an
     * accumulated one. scratch: at least hp_attn_block_scratch_floats(Tq, Tk) floats. */
    void (*attn_block_forward)(void *ctx, float *out, int ldo, float *lse, int ldl, const float *q, int ldq,
                               const float *k, int ldk, const float *v, int ldv, int Tq, int Tk, int Hq, int Hkv,
                               int hd, int mask, float *scratch);
    void (*attn_block_backward)(void *ctx, float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                                const float *dout, int lddo, const float *out, int ldo, const float *lse, int ldl,
                                const float *q, int ldq, const float *k, int ldk, const float *v, int ldv, int Tq,
                                int Tk, int Hq, int Hkv, int hd, int mask, float *scratch);
    void (*attn_block_merge)(void *ctx, float *out, int ldo, float *lse, int ldl, const float *out_b, int ldb,
                             const float *lse_b, int ldlb, int T, int H, int hd);

    /* The backend's own thread pool for its library kernels (the CPU: OpenBLAS's thread count;
     * OpenMP's is the caller's). Optional: NULL when the backend has none; then
     * hp_backend_set_num_threads does nothing and hp_backend_get_num_threads returns 1. */
    void (*set_num_threads)(void *ctx, int n);
    int (*get_num_threads)(void *ctx);
    /* Waits until every kernel issued so far has finished (timing a kernel, reading a result
     * on the host). Optional: NULL when kernels complete before they return (the CPU); then
     * hp_backend_synchronize does nothing. */
    void (*synchronize)(void *ctx);
} hp_backend_t;

/* The optional slots with their defaults. */
static inline void hp_backend_set_num_threads(const hp_backend_t *be, int n) {
    if (be->set_num_threads) be->set_num_threads(be->ctx, n);
}
static inline int hp_backend_get_num_threads(const hp_backend_t *be) {
    return be->get_num_threads ? be->get_num_threads(be->ctx) : 1;
}
static inline void hp_backend_synchronize(const hp_backend_t *be) {
    if (be->synchronize) be->synchronize(be->ctx);
}
static inline int hp_backend_has_gemm_bf16(const hp_backend_t *be) { return be->gemm_bf16 != NULL; }
/* gemm_grouped, or its default: one gemm call per non-empty group, in order. */
static inline void hp_backend_gemm_grouped(const hp_backend_t *be, const hp_gemm_group_t *g, int n, int trans_a,
                                           int trans_b, float alpha, float beta) {
    if (be->gemm_grouped) {
        be->gemm_grouped(be->ctx, g, n, trans_a, trans_b, alpha, beta);
        return;
    }
    for (int i = 0; i < n; i++)
        if (g[i].M > 0 && g[i].N > 0)
            be->gemm(be->ctx, g[i].c, g[i].ldc, g[i].a, g[i].lda, g[i].b, g[i].ldb, g[i].M, g[i].N, g[i].K, trans_a,
                     trans_b, alpha, beta);
}

/* The CPU backend: OpenBLAS sgemm for every linear product, OpenMP loops, host memory.
 * (Defined in src/nn/backend_cpu.c, with the kernels it adapts.) */
const hp_backend_t *hp_backend_cpu(void);
/* The backend every new model and activation context starts with (hp_backend_cpu()). */
const hp_backend_t *hp_backend_default(void);

#ifdef __cplusplus
}
#endif
#endif
