/* nn: the module protocol (docs/nn.md) and the CPU kernels of the Llama-family layers.
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
#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_IGNORE_INDEX (-100)

/* ---- module protocol ----------------------------------------------------------------- */

/* Per-microbatch activation context: what forward saved for backward lives in `arena`
 * (one microbatch's lifetime) and is found again through `slots[module id]`. Several
 * contexts can be in flight at once (pipelining), dropped and rebuilt (checkpointing). The
 * model's micro-batch context (model.h, hp_model_ctx_t) embeds one. */
typedef struct hp_act {
    hp_arena_t arena;     /* saved tensors of this microbatch */
    int B, T;             /* microbatch shape: rows are (b, t), t < T local positions */
    int n_slots;
    void **slots;         /* per module id: the module's saved state (in arena) */
    /* Scratch for activation gradients inside a module's backward (set by the caller). A
     * module carves disjoint regions for its children, so a backward_weight may run after
     * later backward_input calls as long as the caller gives each unit its own scratch. */
    float *grad_scratch;
    size_t grad_scratch_floats;
    double *prof;         /* optional: seconds per kernel kind (HP_NN_OP_*), accumulated */
    const hp_backend_t *be;   /* the kernel table (hp_act_init: hp_backend_default()) */
    /* Global position of local row t = 0 (RoPE angle and causal mask use pos0 + t): 0 for a
     * whole sequence, the cache position under KV-cache decode, a shard's offset under
     * context parallelism. The model's contexts start every micro-batch at 0. */
    int pos0;
    /* A rank's rows of each sequence as n_pos_segs equal segments, segment i starting at global
     * position pos_segs[i] (context parallelism's head-tail balancing: its hooks on the attention
     * modules set them, cp.h hp_cp_set_positions); 0: one segment at pos0. */
    int n_pos_segs;
    const int *pos_segs;
    /* The micro-batch's target ids (B*T, HP_IGNORE_INDEX for none) that a loss module reads
     * (model.h: the model container sets them; NULL: logits only). */
    const int32_t *targets;
    /* Inference: the KV cache the attention modules append to and read (NULL: training). */
    struct hp_model_kv_cache *kv;
    /* Weight passes may be deferred past later input passes (a split-backward context):
     * checkpoint wrappers keep their recomputed state until the context is reset. */
    int keep_recompute;
} hp_act_t;

typedef struct hp_module hp_module_t;

/* How an activation of a micro-batch of B sequences of T positions and C features is split
 * across ranks: each rank holds T / seq positions of every sequence (rows (b, t), t in its
 * share) and C / cols of the features. {1, 1}: whole. */
typedef struct hp_act_split {
    int seq, cols;
} hp_act_split_t;

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
    /* Optional: the split of the module's input (output = 0) or output (output = 1) when the
     * module decides it: returns 1 and fills *s. NULL or 0: the module takes what it is given
     * and passes it on. Tensor parallel's wrappers report their styles' layouts (sequence
     * parallel: seq = degree; vocab-parallel logits: cols = degree), composite modules ask the
     * child that sees the input (or makes the output) first; the model container reads its
     * units' to size the residual stream and the logits (docs/nn.md, "Activation splits"). */
    int (*act_split)(const hp_module_t *m, int output, hp_act_split_t *s);
} hp_module_ops_t;

#define HP_MODULE_MAX_CHILDREN 8
#define HP_MODULE_MAX_PARAMS 8
#define HP_MODULE_MAX_HOOKS 4   /* per kind */

/* Module hooks (torch.nn.Module register_forward_pre_hook / ..._hook /
 * register_full_backward_pre_hook / ..._hook): called by hp_module_forward (pre before,
 * post after), hp_module_backward_input (pre_backward before) and hp_module_backward_weight
 * (post_backward after: the module's weight gradients are complete). Several per module,
 * called in registration order; an error stops the call. A hook may re-point its module's
 * parameter data (value.local.data / grad.local.data): modules read them at every call.
 * FSDP, DDP and the pipeline attach here; activation checkpointing is a wrapper module. */
typedef enum hp_hook_kind {
    HP_HOOK_PRE_FORWARD = 0, HP_HOOK_POST_FORWARD, HP_HOOK_PRE_BACKWARD, HP_HOOK_POST_BACKWARD,
    HP_HOOK_KINDS
} hp_hook_kind_t;
typedef hp_status_t (*hp_module_hook_fn)(void *user, hp_module_t *m, hp_act_t *act);
typedef struct hp_module_hook {
    hp_module_hook_fn fn;
    void *user;
    int handle;
} hp_module_hook_t;

struct hp_module {
    char name[HP_PARAM_NAME_MAX];   /* fully qualified ("layers.3.attention"); "" for the root */
    const hp_module_ops_t *ops;
    int id;                         /* index into hp_act_t.slots */
    int unit;                       /* the model unit this module is the outer module of, else -1 */
    int n_children;
    hp_module_t *children[HP_MODULE_MAX_CHILDREN];
    int n_params;
    hp_param_t *params[HP_MODULE_MAX_PARAMS];   /* owned by the model's parameter table */
    void *impl;                     /* layer configuration (sizes, flags) */
    double *timer;                  /* optional: seconds accumulated by forward + backward */
    int n_hooks[HP_HOOK_KINDS];
    hp_module_hook_t hooks[HP_HOOK_KINDS][HP_MODULE_MAX_HOOKS];
};

/* Registers a hook; *handle (may be NULL) identifies it for removal. HP_ERR_INVALID_ARG when
 * the module already has HP_MODULE_MAX_HOOKS of that kind. */
hp_status_t hp_module_add_hook(hp_module_t *m, hp_hook_kind_t kind, hp_module_hook_fn fn, void *user, int *handle);
/* Removes the hook with that handle (any kind); unknown handles are ignored. */
void hp_module_remove_hook(hp_module_t *m, int handle);
/* Removes every hook whose user pointer is `user` (a wrapper detaching itself). */
void hp_module_remove_hooks_of(hp_module_t *m, void *user);
/* Moves m's hooks to `to` (an outer wrapper taking m's place), appended after to's own. */
hp_status_t hp_module_move_hooks(hp_module_t *to, hp_module_t *m);

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
    HP_NN_OP_MOE_ROUTE, HP_NN_OP_MOE_EXPERTS, HP_NN_OP_MOE_COMBINE, HP_NN_OP_MOE_DISPATCH,   /* moe.c, ep.c */
    HP_NN_OP_COUNT
};
extern const char *const hp_nn_op_names[HP_NN_OP_COUNT];

/* Reserves the activation context for modules 0..n_modules-1 with an arena of `bytes`;
 * be = hp_backend_default(), pos0 = 0, no KV cache. */
hp_status_t hp_act_init(hp_act_t *act, int n_modules, size_t bytes);
void hp_act_free(hp_act_t *act);
/* Drops the saved state of a microbatch (start of forward, or after checkpointing). */
void hp_act_reset(hp_act_t *act);

/* For module authors (nn's layers, the parallel wrappers): allocation from the activation
 * arena (asserts (a size-table bug) when it runs out), a module's saved-state struct
 * registered under its id, that state again in backward (asserts it exists), gradient
 * scratch carved from act->grad_scratch at *offset (advanced), and the base set-up of a
 * module struct (zeroes it; id and unit -1). */
void *hp_act_alloc(hp_act_t *act, size_t bytes);
void *hp_act_slot_new(hp_act_t *act, const hp_module_t *m, size_t bytes);
void *hp_act_slot(hp_act_t *act, const hp_module_t *m);
float *hp_act_scratch(hp_act_t *act, size_t *offset, size_t floats);
void hp_module_base_init(hp_module_t *m, const hp_module_ops_t *ops, const char *name, void *impl);

/* Replaces child `old` of `parent` by `repl` in the same position: the one way a parallelism
 * changes a module tree (tensor parallelism puts a wrapper holding `old` as its child in its
 * place, context parallelism swaps an attention's core, loss_parallel the head's loss).
 * Composite modules read their children at every call. HP_ERR_INVALID_ARG when old is not a
 * child of parent. A model's modules are replaced through hp_model_replace_module (model.h),
 * which gives the new module its activation slot. */
hp_status_t hp_module_replace_child(hp_module_t *parent, hp_module_t *old, hp_module_t *repl);

/* m's act_split answer (1 and *s), or 0 when m (or its ops) does not decide it. */
int hp_module_act_split(const hp_module_t *m, int output, hp_act_split_t *s);

/* Calls through a module's ops table with checks (named errors instead of NULL calls). */
hp_status_t hp_module_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out);
hp_status_t hp_module_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din);
hp_status_t hp_module_backward_weight(hp_module_t *m, hp_act_t *act);

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
/* --- what the asynchronous context-parallel core needs of its attention --- */
/* The projection child (fused wq|wk|wv linear). */
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
/* --- end --- */
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

/* ---- mixture of experts (src/nn/moe.c, docs/moe.md) -----------------------------------
 * TorchTitan's MoE feed-forward as one module: TokenChoiceTopKRouter (gate (E, D) in f32,
 * sigmoid or softmax scores, expert_bias added for the choice only, node-limited routing over
 * expert groups, gate values gathered from the unbiased scores, route_norm, route_scale),
 * GroupedExperts (w1/w3 (E, F, D), w2 (E, D, F); one GEMM pass per expert over its contiguous
 * expert-major rows, no padding, no drops), shared experts (a dense SwiGLU of hidden
 * n_shared_experts * shared_hidden) and a deterministic combine (each token sums its choices
 * in their fixed order). Forward accumulates into out (out += moe(x), the residual). */
#define HP_MOE_MAX_EXPERTS 512
typedef enum { HP_MOE_SCORE_SIGMOID = 0, HP_MOE_SCORE_SOFTMAX = 1 } hp_moe_score_fn_t;
typedef struct hp_moe_config {
    int dim, hidden;          /* D, F (per expert) */
    int n_experts, top_k;     /* E, K */
    int score_fn;             /* hp_moe_score_fn_t */
    int route_norm;           /* divide the top-k gate values by their sum (+1e-20) */
    float route_scale;        /* then multiply by this (1 = off) */
    int score_before_experts; /* scale the expert input instead of its output */
    int n_shared_experts, shared_hidden;   /* 0: no shared experts */
    int n_expert_groups, n_limited_groups; /* node-limited routing; <= 1 groups: off */
    /* HyperParallel's auxiliary load-balancing loss coeff * E * sum_e f_e p_e per micro-batch
     * (f_e: share of the N*K routed slots, no gradient; p_e: mean score), its gradient added
     * to the scores in backward independently of the main loss's normalisation (Megatron's
     * MoEAuxLossAutoScaler at scale 1); 0: off */
    float aux_loss_coeff;
} hp_moe_config_t;
/* A replaceable expert stage (expert parallelism, src/parallel/ep.c): takes the (N*K, D) rows
 * in global expert-major order (offsets (E+1)) and returns the experts' outputs in the same
 * order. Its per-micro-batch state lives in the activation context (act arena and gradient
 * scratch), found again through *state, so micro-batches in flight never mix. */
typedef struct hp_moe_dispatch {
    size_t (*act_bytes)(void *ctx, const hp_module_t *moe, int N);        /* for N local tokens */
    size_t (*scratch_floats)(void *ctx, const hp_module_t *moe, int N);
    hp_status_t (*forward)(void *ctx, hp_module_t *moe, hp_act_t *act, float *ys, const float *xs,
                           const int32_t *offsets, void **state);
    /* dxs (=) from dys; scratch carved from act at *scratch_off (advanced), kept for the weight pass */
    hp_status_t (*backward_input)(void *ctx, hp_module_t *moe, hp_act_t *act, void *state, float *dxs,
                                  const float *dys, size_t *scratch_off);
    hp_status_t (*backward_weight)(void *ctx, hp_module_t *moe, hp_act_t *act, void *state);
} hp_moe_dispatch_t;
typedef struct hp_moe_impl {
    hp_moe_config_t c;
    float *expert_bias;       /* (E) selection-only bias (NULL: none); caller-owned */
    float *tokens_per_expert; /* (E) += routed rows per forward (NULL: not counted); caller-owned */
    const hp_moe_dispatch_t *dispatch;   /* NULL: every expert is local (one rank) */
    void *dispatch_ctx;
    double aux_loss_sum;      /* += the auxiliary loss of each forward (metrics; caller resets) */
} hp_moe_impl_t;
/* The config's bounds (top_k <= n_experts, groups dividing experts, ...); `what` prefixes the
 * message (a config key or module name). */
hp_status_t hp_moe_config_check(const hp_moe_config_t *c, const char *what);
/* params: gate (E, D), w1 (E, F, D), w2 (E, D, F), w3 (E, F, D), then with shared experts
 * shared w1 (Fs, D), w2 (D, Fs), w3 (Fs, D): 4 or 7 entries. */
hp_status_t hp_moe_module_init(hp_module_t *m, hp_moe_impl_t *impl, const char *name, const hp_moe_config_t *c,
                               hp_param_t **params, int n_params, float *expert_bias, float *tokens_per_expert);
int hp_module_is_moe(const hp_module_t *m);
/* TorchTitan's aux-loss-free load balancing for one layer: delta = coeff * sign(mean(c) - c),
 * delta -= mean(delta), bias += delta. counts (E) are the step's tokens per expert summed over
 * every rank that routes its own tokens (the batch mesh). Returns max(c) / mean(c) (the
 * imbalance; 1 when balanced, 0 when no tokens). */
double hp_moe_update_expert_bias(float *bias, const float *counts, int E, float coeff);
/* Grouped experts over n_local experts whose rows of xs are [offsets[e], offsets[e+1]):
 * h1/h3 (R, F) = xs W1/W3[e]^T, a = silu(h1) h3, ys (R, D) = a W2[e]^T (all =). */
void hp_moe_experts_forward(const hp_backend_t *be, float *ys, float *h1, float *h3, float *a, const float *xs,
                            const float *w1, const float *w2, const float *w3, const int32_t *offsets,
                            int n_local, int D, int F);
/* dxs (=), dh1/dh3 (=, kept for the weight pass), da scratch (R, F). */
void hp_moe_experts_backward_input(const hp_backend_t *be, float *dxs, float *dh1, float *dh3, float *da,
                                   const float *dys, const float *h1, const float *h3, const float *w1,
                                   const float *w2, const float *w3, const int32_t *offsets, int n_local, int D,
                                   int F);
/* dw1/dw3 (E, F, D) +=, dw2 (E, D, F) +=. */
void hp_moe_experts_backward_weight(const hp_backend_t *be, float *dw1, float *dw2, float *dw3, const float *dys,
                                    const float *dh1, const float *dh3, const float *a, const float *xs,
                                    const int32_t *offsets, int n_local, int D, int F);

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
    /* YaRN (DeepSeek-V3, enabled ignored): freq / factor blended with freq by a linear ramp
     * over the correction range of beta_fast / beta_slow rotations at original_max_pos */
    int yarn;
    float beta_fast, beta_slow;
} hp_rope_scaling_t;
// cos, sin (T, hd/2): angles pos * freq_i, freq_i = theta^(-2i/hd) with optional Llama 3.1
// or YaRN scaling, computed in f32 as PyTorch's precompute (then cos/sin of the f32 angle)
void hp_rope_table(float *cos_t, float *sin_t, int T, int head_dim, float theta,
                   const hp_rope_scaling_t *scaling);
// x (N = B*T rows, each holding n_heads heads of head_dim at row stride ld) rotated in place
// by position (row % T). Backward is the same call with inverse = 1 (rotation by -angle).
void hp_rope_apply(float *x, int ld, int B, int T, int n_heads, int head_dim,
                   const float *cos_t, const float *sin_t, hp_rope_style_t style, int inverse);
void hp_ref_rope_apply(float *x, int ld, int B, int T, int n_heads, int head_dim,
                       const float *cos_t, const float *sin_t, hp_rope_style_t style, int inverse);

/* ---- ISA paths of the kernels -------------------------------------------------------------- */
/* Kernels with ISA-specific code (attention today) pick a path at run time from cpuid, so the
 * binary does not depend on -march. AUTO (the default): the best path this CPU supports; the
 * environment variable HP_NN_ISA=portable|avx2, read on first use, sets the start value.
 * Forcing a path lets a test check each one on a machine that has them all. */
typedef enum { HP_NN_ISA_AUTO = 0, HP_NN_ISA_PORTABLE, HP_NN_ISA_AVX2 } hp_nn_isa_t;
/* HP_ERR_UNSUPPORTED if this CPU or build lacks `isa`. Not to be called while kernels run. */
hp_status_t hp_nn_set_isa(hp_nn_isa_t isa);
/* The path kernels use now (never AUTO). */
hp_nn_isa_t hp_nn_isa(void);
const char *hp_nn_isa_name(hp_nn_isa_t isa);   /* "auto", "portable", "avx2" */

/* ---- kernels: causal attention (MHA / GQA), flash-style ---------------------------------- */
/* q (B, T, Hq, hd) at row stride ldq, k/v (B, T, Hkv, hd) at row strides ldk/ldv,
 * out (B, T, Hq, hd) contiguous, lse (B, Hq, T) saved. Softmax scale 1/sqrt(hd). Tiled online
 * softmax: no (T, T) matrix is kept; parallel over (b, head, 64-row query tile). The AVX2 path
 * needs hd % 8 == 0 (else the portable one runs). Scratch lives on each task's stack, about
 * 0.75 KiB per unit of hd + 17 KiB (113 KiB at hd 128); nothing is allocated. Results do not
 * depend on the thread count. */
void hp_attention_forward(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                          const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd);
/* dq/dk/dv (=) at row strides lddq/lddk/lddv. Fused: parallel over (b, kv head), each task owns
 * dK, dV of its kv head and dQ of the query heads in its group, so no atomics. With fewer such
 * groups than threads (and T > 64) it splits instead: a dK/dV pass over (b, kv head, key tile)
 * and a dQ pass over (b, query head, query tile), each recomputing the scores (1.4x the tile
 * products); the two give the same bits. Stack scratch about 1.5 KiB per unit of hd + 33 KiB. */
/* AUTO (default): split as above; FUSED / SPLIT force one (tests, benchmarks); another value is
 * HP_ERR_INVALID_ARG. Not to be called while kernels run. */
typedef enum { HP_ATTENTION_BWD_AUTO = 0, HP_ATTENTION_BWD_FUSED, HP_ATTENTION_BWD_SPLIT } hp_attention_bwd_t;
hp_status_t hp_attention_set_backward(hp_attention_bwd_t mode);
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
/* The twin of the CPU backend's adamw_update (backend.h; torch.optim.adamw's single-tensor
 * arithmetic) in double: p = p (1 - lr wd) - lr / bc1 m' / (sqrt(v') / sqrt(bc2) + eps). */
void hp_ref_adamw_update(float *p, float *m, float *v, const float *g, int64_t n, double lr, double b1, double b2,
                         double eps, double wd, int64_t step);

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
