/* nn: the module protocol (DESIGN section 3) and the CPU kernels of the Llama-family layers.
 * Kernels take raw f32 pointers in the house order (outputs, saved, inputs, weights, sizes;
 * backward: gradients first). Each optimised kernel has a plain reference twin (hp_ref_*)
 * that tests compare it with. Activation-gradient outputs say whether they are written (=)
 * or accumulated (+=); parameter gradients always accumulate (+=). */
#ifndef HYPERPARALLEL_NN_H
#define HYPERPARALLEL_NN_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "arena.h"
#include "tensor.h"
#include "param.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_IGNORE_INDEX (-100)

/* ---- module protocol ----------------------------------------------------------------- */

/* Per-microbatch activation context: what forward saved for backward lives in `arena`
 * (one microbatch's lifetime) and is found again through `slots[module id]`. Several
 * contexts can be in flight at once (pipelining), dropped and rebuilt (checkpointing). */
typedef struct hp_act {
    hp_arena_t arena;     /* saved tensors of this microbatch */
    int B, T;             /* microbatch shape of the last forward */
    int n_slots;
    void **slots;         /* per module id: the module's saved state (in arena) */
    /* Scratch for activation gradients inside a module's backward (set by the caller; the
     * model points it at its shared workspace, so backward_weight of a module must run
     * before the next backward_input that shares it). */
    float *grad_scratch;
    size_t grad_scratch_floats;
    double *prof;         /* optional: seconds per kernel kind (HP_NN_OP_*), accumulated */
} hp_act_t;

typedef struct hp_module hp_module_t;

typedef struct hp_module_ops {
    const char *kind;   /* "linear", "rmsnorm", "embedding", "attention", "feed_forward", ... */
    /* Bytes this module (children included) takes from an activation arena for (B, T). */
    size_t (*act_bytes)(const hp_module_t *m, int B, int T);
    /* Floats of activation-gradient scratch backward_input needs for (B, T). */
    size_t (*grad_scratch_floats)(const hp_module_t *m, int B, int T);
    /* out = f(in); saves what backward needs into act. */
    hp_status_t (*forward)(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out);
    /* din (=) from dout; keeps in act what backward_weight needs (dout stays valid until then). */
    hp_status_t (*backward_input)(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din);
    /* Parameter grads += . */
    hp_status_t (*backward_weight)(hp_module_t *m, hp_act_t *act);
} hp_module_ops_t;

#define HP_MODULE_MAX_CHILDREN 8
#define HP_MODULE_MAX_PARAMS 4

struct hp_module {
    char name[HP_PARAM_NAME_MAX];   /* fully qualified ("layers.3.attention"); "" for the root */
    const hp_module_ops_t *ops;
    int id;                         /* index into hp_act_t.slots */
    int n_children;
    hp_module_t *children[HP_MODULE_MAX_CHILDREN];
    int n_params;
    hp_param_t *params[HP_MODULE_MAX_PARAMS];   /* owned by the model's parameter table */
    void *impl;                     /* layer configuration (sizes, weight pointers) */
    double *timer;                  /* optional: seconds accumulated by forward + backward */
};

/* Kernel kinds of the per-op profile (hp_act_t.prof, hp_model_profile). */
enum {
    HP_NN_OP_EMBEDDING = 0,
    HP_NN_OP_RMSNORM_FWD, HP_NN_OP_RMSNORM_BWD,
    HP_NN_OP_LINEAR_FWD, HP_NN_OP_LINEAR_BWD_INPUT, HP_NN_OP_LINEAR_BWD_WEIGHT,
    HP_NN_OP_OUTPUT_FWD, HP_NN_OP_OUTPUT_BWD_INPUT, HP_NN_OP_OUTPUT_BWD_WEIGHT,
    HP_NN_OP_ROPE, HP_NN_OP_QK_NORM,
    HP_NN_OP_ATTENTION_FWD, HP_NN_OP_ATTENTION_BWD,
    HP_NN_OP_SWIGLU_FWD, HP_NN_OP_SWIGLU_BWD,
    HP_NN_OP_CROSS_ENTROPY, HP_NN_OP_ELEMENTWISE,
    HP_NN_OP_COUNT
};
extern const char *const hp_nn_op_names[HP_NN_OP_COUNT];

/* Reserves the activation context for modules 0..n_modules-1 with an arena of `bytes`. */
hp_status_t hp_act_init(hp_act_t *act, int n_modules, size_t bytes);
void hp_act_free(hp_act_t *act);
/* Drops the saved state of a microbatch (start of forward, or after checkpointing). */
void hp_act_reset(hp_act_t *act);

/* Calls through a module's ops table with checks (named errors instead of NULL calls). */
hp_status_t hp_module_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out);
hp_status_t hp_module_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din);
hp_status_t hp_module_backward_weight(hp_module_t *m, hp_act_t *act);

/* ---- layers (modules) ------------------------------------------------------------------ */
/* Layer modules are created into caller-owned storage; parameter storage (value and grad)
 * is owned by the caller's hp_param_t entries, which must be contiguous f32. */

typedef struct hp_linear_impl {
    int in_features, out_features;
    float *weight, *dweight;   /* (out, in) : possibly several params stacked along out */
    float *bias, *dbias;       /* (out) or NULL */
    int accumulate_output;     /* forward: out += x W^T (residual add fused into the GEMM) */
    int accumulate_input_grad; /* backward_input: din += instead of = */
    int prof_op;               /* first of three profile slots (fwd, bwd_input, bwd_weight) */
} hp_linear_impl_t;
/* A linear layer y = x W^T (+ b) over rows of x (..., in). Several adjacent params stacked
 * along out (wq|wk|wv, w1|w3) make one fused GEMM. */
void hp_linear_module_init(hp_module_t *m, hp_linear_impl_t *impl, const char *name,
                           hp_param_t **params, int n_params, hp_param_t *bias,
                           int in_features, int out_features);

typedef struct hp_rmsnorm_impl {
    int dim;
    float eps;
    float *weight, *dweight;   /* (dim) */
    int accumulate_input_grad; /* backward_input: din += instead of = */
} hp_rmsnorm_impl_t;
void hp_rmsnorm_module_init(hp_module_t *m, hp_rmsnorm_impl_t *impl, const char *name,
                            hp_param_t *weight, int dim, float eps);

typedef struct hp_embedding_impl {
    int vocab, dim;
    float *weight, *dweight;   /* (vocab, dim) */
} hp_embedding_impl_t;
/* in: (B, T) i32 token ids; out: (B, T, dim). */
void hp_embedding_module_init(hp_module_t *m, hp_embedding_impl_t *impl, const char *name,
                              hp_param_t *weight, int vocab, int dim);

/* ---- kernels: linear (every GEMM through cblas_sgemm) ---------------------------------- */

// out (N, OC) = inp (N, IC) @ weight^T (OC, IC) + bias (OC) (bias may be NULL)
void hp_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                       int N, int IC, int OC);
/* Like hp_linear_forward but out += (residual add fused into the GEMM, beta = 1). */
void hp_linear_forward_acc(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int IC, int OC);
// dinp (N, IC) (= if !accumulate, += otherwise) = dout (N, OC) @ weight (OC, IC)
void hp_linear_backward_input(float *dinp, const float *dout, const float *weight,
                              int N, int IC, int OC, int accumulate);
// dweight (OC, IC) += dout^T @ inp; dbias (OC) += column sums of dout (dbias may be NULL)
void hp_linear_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                               int N, int IC, int OC);
void hp_ref_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int IC, int OC);
void hp_ref_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int IC, int OC);

/* ---- kernels: RMSNorm (rows of length C) ------------------------------------------------ */
// out (N, C), rstd (N) saved; y = x * rsqrt(mean(x^2) + eps) * weight
void hp_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                        int N, int C, float eps);
// dinp (N, C) (= if !accumulate, += otherwise; with = it may alias dout); uses saved rstd
void hp_rmsnorm_backward_input(float *dinp, const float *dout, const float *inp,
                               const float *weight, const float *rstd, int N, int C, int accumulate);
// dweight (C) +=
void hp_rmsnorm_backward_weight(float *dweight, const float *dout, const float *inp,
                                const float *rstd, int N, int C);
/* Head-wise variants (qk-norm): rows are (token n, head h) at n*ld + h*C, for N tokens of
 * n_heads heads; rstd (N, n_heads). out/dinp use ldo, inputs ldi. */
void hp_rmsnorm_heads_forward(float *out, int ldo, float *rstd, const float *inp, int ldi,
                              const float *weight, int N, int n_heads, int C, float eps);
void hp_rmsnorm_heads_backward_input(float *dinp, int ldo, const float *dout, int lddo,
                                     const float *inp, int ldi, const float *weight,
                                     const float *rstd, int N, int n_heads, int C);
void hp_rmsnorm_heads_backward_weight(float *dweight, const float *dout, int lddo,
                                      const float *inp, int ldi, const float *rstd,
                                      int N, int n_heads, int C);
void hp_ref_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                            int N, int C, float eps);
void hp_ref_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C);

/* ---- kernels: RoPE ---------------------------------------------------------------------- */
typedef enum hp_rope_style {
    HP_ROPE_INTERLEAVED = 0,   /* llama3: pairs (x[2i], x[2i+1]) as complex numbers */
    HP_ROPE_HALF = 1           /* qwen3 (rotate_half): pairs (x[i], x[i + hd/2]) */
} hp_rope_style_t;
typedef struct hp_rope_scaling {
    int enabled;
    float factor, low_freq_factor, high_freq_factor;
    int original_max_pos;
} hp_rope_scaling_t;
// cos, sin (T, hd/2): angles pos * freq_i, freq_i = theta^(-2i/hd) with optional Llama 3.1
// scaling, computed in f32 as PyTorch's precompute (then cos/sin of the f32 angle)
void hp_rope_table(float *cos_t, float *sin_t, int T, int head_dim, float theta,
                   const hp_rope_scaling_t *scaling);
// x (N = B*T rows, each holding n_heads heads of head_dim at row stride ld) rotated in place
// by position (row % T). Backward is the same call with inverse = 1 (rotation by -angle).
void hp_rope_apply(float *x, int ld, int B, int T, int n_heads, int head_dim,
                   const float *cos_t, const float *sin_t, hp_rope_style_t style, int inverse);
void hp_ref_rope_apply(float *x, int ld, int B, int T, int n_heads, int head_dim,
                       const float *cos_t, const float *sin_t, hp_rope_style_t style, int inverse);

/* ---- kernels: causal attention (MHA / GQA), flash-style ---------------------------------- */
/* q (B, T, Hq, hd) at row stride ldq, k/v (B, T, Hkv, hd) at row strides ldk/ldv,
 * out (B, T, Hq, hd) contiguous, lse (B, Hq, T) saved. Softmax scale 1/sqrt(hd). Tiled online
 * softmax: no (T, T) matrix is kept; parallel over (b, head). */
void hp_attention_forward(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                          const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd);
/* dq/dk/dv (=) at row strides lddq/lddk/lddv; parallel over (b, kv head): each task owns dK,
 * dV of its kv head and dQ of the query heads in its group, so no atomics. */
void hp_attention_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                           const float *dout, const float *out,
                           const float *lse, const float *q, int ldq, const float *k, int ldk,
                           const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd);
/* Inference (KV cache): n new query rows at positions [p0, p0 + n) against a cache holding
 * keys/values of positions [0, p0 + n) (the new rows' own keys already written). q (n, Hq, hd)
 * at row stride ldq; k/v (p0 + n, Hkv, hd) at row strides ldk/ldv; out (n, Hq, hd) contiguous.
 * scratch: n_threads rows of (p0 + n) floats (one score row per thread); the loop runs on at
 * most n_threads threads (and at most omp_get_max_threads()). Causal, softmax scale 1/sqrt(hd), GQA (head h reads kv head
 * h / (Hq/Hkv)). Row i equals row p0 + i of hp_attention_forward up to float rounding. */
void hp_attention_decode_forward(float *out, float *scratch, const float *q, int ldq, const float *k, int ldk,
                                 const float *v, int ldv, int p0, int n, int Hq, int Hkv, int hd,
                                 int n_threads);
/* Reference: full (T, T) softmax per head, in double. */
void hp_ref_attention_forward(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                              const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd);
void hp_ref_attention_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                               const float *dout,
                               const float *q, int ldq, const float *k, int ldk,
                               const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd);

/* ---- kernels: SwiGLU -------------------------------------------------------------------- */
// out (N, H) = silu(h13[:, :H]) * h13[:, H:], h13 (N, 2H)
void hp_swiglu_forward(float *out, const float *h13, int N, int H);
// dh13 (N, 2H) (=) from dout (N, H)
void hp_swiglu_backward(float *dh13, const float *dout, const float *h13, int N, int H);
void hp_ref_swiglu_forward(float *out, const float *h13, int N, int H);
void hp_ref_swiglu_backward(float *dh13, const float *dout, const float *h13, int N, int H);

/* ---- kernels: embedding ----------------------------------------------------------------- */
// out (N, C) = weight[tokens[n]]; tokens must be in [0, V) (checked by the caller)
void hp_embedding_forward(float *out, const int32_t *tokens, const float *weight, int N, int C);
// dweight (V, C) += scatter of dout (N, C); parallel over vocab rows (each thread owns rows)
void hp_embedding_backward(float *dweight, const float *dout, const int32_t *tokens, int N, int C, int V);
void hp_ref_embedding_backward(float *dweight, const float *dout, const int32_t *tokens, int N, int C, int V);

/* ---- kernels: cross-entropy ----------------------------------------------------------- */
/* losses (N, double) = lse(logits[n]) - logits[n][target] for valid targets, 0 for ignored;
 * lse (N) saved for backward; returns the sum over valid rows (fixed order, double) and
 * *n_valid. Row sums of exp and the logs are taken in double. */
double hp_cross_entropy_forward(double *losses, float *lse, const float *logits, const int32_t *targets,
                                int N, int V, int64_t *n_valid);
// dlogits (N, V) (=) = (softmax - onehot) * dloss for valid rows, 0 for ignored rows
void hp_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                               const int32_t *targets, float dloss, int N, int V);
double hp_ref_cross_entropy_forward(double *losses, const float *logits, const int32_t *targets,
                                    int N, int V, int64_t *n_valid);
void hp_ref_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets,
                                   float dloss, int N, int V);

/* ---- elementwise ---------------------------------------------------------------------- */
void hp_add_inplace(float *y, const float *x, int64_t n);   /* y += x */

#ifdef __cplusplus
}
#endif
#endif
