/* The model builder API (nn layer), for model-family authors: the architecture a family gives
 * hp_model_create (how many units, what parameters each declares, how its module tree is
 * built) and the composite modules a Llama-style decoder is made of (attention, MLA,
 * feed-forward, block, head). The families themselves live in src/models/ (docs/architecture.md
 * "Adding a model family"); the leaf modules (linear, rmsnorm, embedding, MoE) are in nn.h. */
#ifndef HYPERPARALLEL_MODEL_BUILDER_H
#define HYPERPARALLEL_MODEL_BUILDER_H

#include "model.h"
#include "nn.h"
#include "rng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the architecture: declare each unit's parameters, then build its modules ----------- */

enum { HP_PARAM_INIT_RNG = 0, HP_PARAM_INIT_ONES = 1, HP_PARAM_INIT_ZEROS = 2 };
enum { HP_MODEL_UNIT_EMBEDDING = 0, HP_MODEL_UNIT_BLOCK = 1, HP_MODEL_UNIT_HEAD = 2 };
#define HP_MODEL_MAX_UNIT_PARAMS 32   /* parameters one unit may declare */

/* One parameter of a unit. The model lays the unit's parameters out contiguously in declared
 * order, except that members of one group (> 0) are stored adjacent (a fused GEMM reads them as
 * one stacked matrix). Initialisation is keyed by (seed, name, global element index), so a
 * shard draws the values the single-rank model has there. */
typedef struct hp_param_decl {
    char name[HP_PARAM_NAME_MAX];   /* FQN, TorchTitan's ("layers.3.attention.wq.weight") */
    int ndim;                       /* 1 .. 3 */
    int64_t shape[3];
    int group;                      /* > 0: stored adjacent to the group's other members */
    int init;                       /* HP_PARAM_INIT_* */
    hp_rng_spec_t rng;              /* HP_PARAM_INIT_RNG: the distribution */
    int frozen;                     /* hp_param_t.frozen (LoRA's base weights) */
} hp_param_decl_t;

/* What hp_model_create needs from a model family (hp_model_config_t.arch points at it; the
 * registry, models.h, sets it when it resolves a config). Every function reads the config's
 * fields only, so one architecture serves several families that differ in fields. */
typedef struct hp_model_arch {
    int (*n_units)(const hp_model_config_t *c);
    int (*unit_kind)(const hp_model_config_t *c, int unit);   /* HP_MODEL_UNIT_* */
    /* The unit's parameters in table order (TorchTitan's state-dict order), at most
     * HP_MODEL_MAX_UNIT_PARAMS; returns the count. has_embedding: whether unit 0 is in the
     * model's range (a tied head without it declares its own copy of the embedding weight). */
    int (*declare)(const hp_model_config_t *c, int unit, int has_embedding, hp_param_decl_t *out);
    /* Builds the unit's module tree over its parameters (declared order) and returns the outer
     * module; every module comes from hp_model_module_new. */
    hp_status_t (*build)(hp_model_t m, int unit, hp_param_t **params, int n_params, hp_module_t **out);
} hp_model_arch_t;

/* A module (and `impl_bytes` of zeroed impl storage its `impl` points to) owned by the model
 * and freed with it; ids follow creation order. NULL when out of memory. */
hp_module_t *hp_model_module_new(hp_model_t m, size_t impl_bytes);
/* The model's RoPE tables, (max_seq_len, rotated channels / 2) each, filled at creation from
 * the config (rope_theta, Llama 3.1 scaling or YaRN). */
void hp_model_rope_tables(hp_model_t m, const float **cos_t, const float **sin_t);

/* ---- composite modules ------------------------------------------------------------------- */

typedef struct hp_attention_cfg {
    int dim, n_heads, n_kv, head_dim, layer;
    int qk_norm;
    float eps;
    hp_rope_style_t style;
    const float *cos_t, *sin_t;   /* (max_T, head_dim/2) */
} hp_attention_cfg_t;

/* GQA attention: wqkv (a fused linear over wq|wk|wv), qk-norm (params q_norm / k_norm, or NULL),
 * RoPE, core (a replaceable child: causal SDPA, created here), wo (accumulates into the
 * residual). */
hp_status_t hp_attention_new(hp_model_t m, const char *name, const hp_attention_cfg_t *c, hp_module_t *wqkv,
                             hp_module_t *wo, hp_param_t *q_norm, hp_param_t *k_norm, hp_module_t **out);

/* MLA attention (DeepSeek-V3). Children, in order: the q path (wq, or wq_a, q_norm, wq_b),
 * wkv_a, kv_norm, wkv_b, then the core (created here), wo (accumulates into the residual; its
 * input grad is written with =, wkv_a's added with +=). */
typedef struct hp_mla_cfg {
    int dim, n_heads, layer;
    int q_lora, kv_lora, nope, rope, v;   /* model.q_lora_rank .. v_head_dim */
    int hc;                               /* the core's head width: max(nope + rope, v) */
    float scale;                          /* the softmax scale of q.k */
    const float *cos_t, *sin_t;           /* (max_T, rope/2) */
} hp_mla_cfg_t;
hp_status_t hp_mla_new(hp_model_t m, const char *name, const hp_mla_cfg_t *c, hp_module_t *const *kids, int n_kids,
                       hp_module_t **out);

/* feed_forward: w13 (a fused linear over w1|w3), SwiGLU, w2 (accumulates into the residual). */
hp_status_t hp_feed_forward_new(hp_model_t m, const char *name, int dim, int hidden, hp_module_t *w13,
                                hp_module_t *w2, hp_module_t **out);
/* transformer block: x + attention(attention_norm(x)), then + feed_forward(ffn_norm(h)); the
 * feed-forward may be an MoE module (nn.h). */
hp_status_t hp_block_new(hp_model_t m, const char *name, int dim, hp_module_t *attention_norm,
                         hp_module_t *attention, hp_module_t *ffn_norm, hp_module_t *feed_forward,
                         hp_module_t **out);
/* head: norm then output (logits); in (Nr, dim), out (N, logits columns). */
hp_status_t hp_head_new(hp_model_t m, const char *name, int dim, hp_module_t *norm, hp_module_t *output,
                        hp_module_t **out);

/* LoRA (PEFT / TorchTitan LoRAConverter; docs/finetune.md "LoRA"): a module in base's place
 * (same name, base its only child) computing base(x) plus, for each stacked member i of the
 * linear base with A[i] != NULL, (alpha / rank) B[i] (A[i] x) on that member's output rows;
 * A[i] (rank, in), B[i] (out_i, rank) are parameter entries of the model (declared by the
 * family). base's hooks stay on base. */
hp_status_t hp_lora_new(hp_model_t m, hp_module_t *base, hp_param_t *const *A, hp_param_t *const *B, int rank,
                        float alpha, hp_module_t **out);

#ifdef __cplusplus
}
#endif
#endif
