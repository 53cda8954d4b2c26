/* nn: the layer modules (linear, RMSNorm, embedding) and what the composite modules
 * (attention, MLA, feed-forward, the loss child) offer the parallelisms that attach to them
 * (docs/nn.md). */
#ifndef HYPERPARALLEL_NN_LAYERS_H
#define HYPERPARALLEL_NN_LAYERS_H

#include <stddef.h>
#include <stdint.h>
#include "nn_module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- layers (modules) ------------------------------------------------------------------ */
/* Layer modules are created into caller-owned storage; parameter storage (value and grad)
 * is owned by the caller's hp_param_t entries, which must be contiguous f32. Modules read
 * the data pointers of their params at every call (hooks may re-point them), and their sizes
 * from the params' local shapes (value.local.shape): a parallelism that shards a parameter
 * (tensor parallel: a DTensor's local shard) changes what the module computes without
 * touching the module; the impl's sizes are the declared (whole) ones. */
static inline float *hp_param_w(const hp_param_t *p) { return (float *)p->value.local.data; }
static inline float *hp_param_g(const hp_param_t *p) { return (float *)p->grad.local.data; }

typedef struct hp_linear_impl {
    int in_features, out_features;   /* declared; calls run the weights' local shapes */
    int n_weights;             /* params[0 .. n_weights): (out_i, in) stacked along out, adjacent */
    int has_bias;              /* params[n_weights]: (out) */
    int accumulate_output;     /* forward: out += x W^T (residual add fused into the GEMM) */
    int accumulate_input_grad; /* backward_input: din += instead of = */
    int prof_op;               /* first of three profile slots (fwd, bwd_input, bwd_weight) */
} hp_linear_impl_t;
/* A linear layer y = x W^T (+ b) over rows of x (..., in). Several adjacent params stacked
 * along out (wq|wk|wv, w1|w3) make one fused GEMM. */
void hp_linear_module_init(hp_module_t *m, hp_linear_impl_t *impl, const char *name,
                           hp_param_t **params, int n_params, hp_param_t *bias,
                           int in_features, int out_features);
/* Bytes of bf16 workspace (hp_act_t.bf16_ws) a linear module needs for `rows` input rows under
 * bf16 compute (the largest of its three GEMMs: both operands in bf16 and the bf16 GEMM's
 * scratch), from its weights' local shapes now; 0 for a module that is not a linear. */
size_t hp_linear_bf16_ws_bytes(const hp_module_t *m, int64_t rows);

typedef struct hp_rmsnorm_impl {
    int dim;
    float eps;                 /* weight: params[0] (dim) */
    int accumulate_input_grad; /* backward_input: din += instead of = */
} hp_rmsnorm_impl_t;
void hp_rmsnorm_module_init(hp_module_t *m, hp_rmsnorm_impl_t *impl, const char *name,
                            hp_param_t *weight, int dim, float eps);

typedef struct hp_embedding_impl {
    int vocab, dim;            /* weight: params[0] (vocab, dim); declared, calls run its local shape */
} hp_embedding_impl_t;
/* in: (B, T) i32 token ids; out: (B, T, dim). */
void hp_embedding_module_init(hp_module_t *m, hp_embedding_impl_t *impl, const char *name,
                              hp_param_t *weight, int vocab, int dim);

/* ---- composite modules (built by a family's architecture, model_builder.h; docs/nn.md) -----
 * attention: children wqkv (fused linear), core (causal SDPA: a replaceable child, e.g. ring
 * or Ulysses attention under context parallelism), wo; params q_norm, k_norm (qk-norm).
 * feed_forward: children w13 (fused linear), w2. Both run the heads / hidden features their
 * projections' parameters hold (TorchTitan's view(bs, seqlen, -1, head_dim)): the local heads
 * of wq / wk (the wq.weight, wk.weight entries' local rows / head_dim) and the local rows of
 * w1, whatever wrapper a parallelism put around the projection. */
void hp_attention_local_heads(const hp_module_t *attention, int *n_heads, int *n_kv_heads);
/* The attention's core child. A replacement core (hp_model_replace_module(model, attention,
 * hp_attention_core(attention), core)) takes the (N, qd + 2 kd) rows [q | k | v] (after
 * qk-norm and RoPE) and writes (N, qd); its backward_input writes [dq | dk | dv] in the same
 * layout. */
hp_module_t *hp_attention_core(hp_module_t *attention);
/* For the asynchronous context-parallel core (cp.h), which starts the K/V exchange from the
 * projection's output: the projection child (fused wq|wk|wv linear). */
hp_module_t *hp_attention_wqkv(hp_module_t *attention);
/* During the attention's forward (from the projection's post-forward hook to the core), its
 * raw projection output (B*T, qd + 2 kd) [q | k | v] before qk-norm and RoPE; NULL when
 * `attention` is not an attention module. Read it at once: RoPE later rotates it in place. */
const float *hp_attention_projection_rows(hp_module_t *attention, hp_act_t *act);
/* Applies in place to `rows` raw projection rows of width ld, [q (n_q heads) | k (n_k heads)]
 * at global positions pos0, pos0 + 1, ..., what the attention's forward applies before its
 * core (q-norm / k-norm under qk-norm, then RoPE), row by row with the same kernels, so a row
 * comes out bitwise as on the rank that owns it. rstd: scratch (rows x max(n_q, n_k)). */
hp_status_t hp_attention_prepare_rows(hp_module_t *attention, hp_act_t *act, float *x, int ld, int rows, int n_q,
                                      int n_k, int pos0, float *rstd);
int hp_feed_forward_local_hidden(const hp_module_t *feed_forward);
/* MLA attention (kind "mla_attention", DeepSeek-V3; src/nn/mla.c, docs/moe.md): children the q
 * path (wq, or wq_a, q_norm, wq_b), wkv_a, kv_norm, wkv_b, core (causal SDPA over zero-padded
 * heads), wo. It runs the heads its wq (or wq_b) weight holds. When that weight is a DTensor
 * sharded over its rows (tensor parallel: heads split across the ranks of a mesh dim), the
 * gradient of the rotary key k_pe, which every head shares, is Partial over that dim: the
 * module sums it over the dim's ranks (one all-reduce of (rows, qk_rope_head_dim)), as DTensor
 * propagates a sum over a sharded dim. Its local heads (0 when `mla` is not an MLA module): */
int hp_mla_local_heads(const hp_module_t *mla);
/* The loss (kind "cross_entropy": the head's child "loss", which the model container runs on the
 * head's logits; a parallelism replaces it, e.g. tensor parallel's loss_parallel over
 * vocab-sharded logits). A loss module's forward takes in = the logits (N, V) f32 and the
 * targets act->targets (N) (out is unused) and leaves its hp_loss_saved_t as its activation
 * slot: the sum of the valid rows' losses (in row order, double) and their count, read by the
 * container; backward_input takes dout = d loss / d sum as a (1) f32 tensor and writes
 * din = dlogits (N, V) (=). */
typedef struct hp_loss_saved {
    double sum;                /* over the valid rows, in row order */
    int64_t n_valid;
    const float *logits;       /* (N, V) the caller's, alive until backward */
    const int32_t *targets;    /* (N) */
    double *losses;            /* (N) per row, 0 for ignored rows */
    float *lse;                /* (N) */
    int N, V;
} hp_loss_saved_t;
/* For loss modules: the arena bytes of a forward over B x T rows (an act_bytes op: the same
 * for every loss module), and its start (checks the logits and targets, saves them, allocates
 * losses and lse as the module's slot). */
size_t hp_loss_act_bytes(const hp_module_t *loss, int B, int T);
hp_status_t hp_loss_begin(hp_module_t *loss, hp_act_t *act, const hp_tensor_t *logits, hp_loss_saved_t **out);
/* The result of `loss`'s last forward in act. */
static inline const hp_loss_saved_t *hp_loss_result(hp_act_t *act, const hp_module_t *loss) {
    return (const hp_loss_saved_t *)hp_act_slot(act, loss);
}
/* Whether m is the model's built-in cross-entropy loss. */
int hp_module_is_loss(const hp_module_t *m);

#ifdef __cplusplus
}
#endif
#endif
