/* nn: the mixture-of-experts module (router, grouped experts, shared experts, combine), its
 * replaceable expert stage for expert parallelism, and the grouped-expert kernels
 * (src/nn/moe.c, docs/moe.md). */
#ifndef HYPERPARALLEL_NN_MOE_H
#define HYPERPARALLEL_NN_MOE_H

#include <stddef.h>
#include <stdint.h>
#include "nn_module.h"

#ifdef __cplusplus
extern "C" {
#endif

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
/* Work the expert stage runs while its first exchange is in flight (the MoE module passes the
 * shared experts' part that does not touch its output: their hidden activations in forward,
 * their hidden gradients in backward); the stage calls fn(arg) exactly once per pass. */
typedef struct hp_moe_overlap {
    hp_status_t (*fn)(void *arg);
    void *arg;
} hp_moe_overlap_t;
/* A replaceable expert stage (expert parallelism, src/parallel/ep.c): takes the (N*K, D) rows
 * in global expert-major order (offsets (E+1)) and returns the experts' outputs in the same
 * order. Its per-micro-batch state lives in the activation context (act arena and gradient
 * scratch), found again through *state, so micro-batches in flight never mix. ov: run once
 * while the rows are in flight (forward and backward_input). */
typedef struct hp_moe_dispatch {
    size_t (*act_bytes)(void *ctx, const hp_module_t *moe, int N);        /* for N local tokens */
    size_t (*scratch_floats)(void *ctx, const hp_module_t *moe, int N);
    hp_status_t (*forward)(void *ctx, hp_module_t *moe, hp_act_t *act, float *ys, const float *xs,
                           const int32_t *offsets, void **state, const hp_moe_overlap_t *ov);
    /* dxs (=) from dys; scratch carved from act at *scratch_off (advanced), kept for the weight pass */
    hp_status_t (*backward_input)(void *ctx, hp_module_t *moe, hp_act_t *act, void *state, float *dxs,
                                  const float *dys, size_t *scratch_off, const hp_moe_overlap_t *ov);
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
/* The CPU grouped GEMM (backend.h gemm_grouped; src/nn/gemm_grouped.c): every group as the gemm
 * slot computes it (bitwise: each element one cblas_sgemm sum over the whole K), all groups in
 * one OpenMP team. hp_ref_gemm_grouped: its twin, plain loops in double. */
void hp_gemm_grouped(const hp_gemm_group_t *groups, int n, int trans_a, int trans_b, float alpha, float beta);
void hp_ref_gemm_grouped(const hp_gemm_group_t *groups, int n, int trans_a, int trans_b, float alpha, float beta);
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

#ifdef __cplusplus
}
#endif
#endif
