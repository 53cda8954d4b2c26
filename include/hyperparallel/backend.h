/* hp_backend_t: the kernel table. Every kernel the model, the optimizers and the parallel
 * wrappers run (linear, rmsnorm, rope, attention, swiglu, embedding, cross-entropy, copies,
 * dtype conversion, optimizer updates) is called through one table plus its context, reached
 * from the micro-batch context (hp_act_t.be). The CPU backend (OpenBLAS + OpenMP, host
 * memory) is hp_backend_cpu(), whose kernels keep their plain hp_ref_* twins (nn.h) that
 * tests compare them with. A CUDA + cuBLAS backend fills the same slots for device memory
 * (hp_tensor_t.device). Argument order and shapes are those of nn.h's kernels. */
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
} hp_backend_t;

/* The CPU backend: OpenBLAS sgemm for every linear product, OpenMP loops, host memory. */
const hp_backend_t *hp_backend_cpu(void);
/* The backend every new model and activation context starts with (hp_backend_cpu()). */
const hp_backend_t *hp_backend_default(void);

#ifdef __cplusplus
}
#endif
#endif
