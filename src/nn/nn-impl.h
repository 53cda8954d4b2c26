/* Private helpers of the nn layer shared by module.c and model.c: activation-arena slots,
 * gradient scratch carving, module base initialisation. */
#ifndef HP_NN_IMPL_H
#define HP_NN_IMPL_H

#include "hyperparallel/nn.h"

/* Allocation from the activation arena; asserts (size-table bug) when it runs out. */
void *hp_act_alloc(hp_act_t *act, size_t bytes);
/* Allocates a module's saved-state struct and registers it under the module id. */
void *hp_act_slot_new(hp_act_t *act, const hp_module_t *m, size_t bytes);
/* The module's saved state of this microbatch (asserts it exists). */
void *hp_act_slot(hp_act_t *act, const hp_module_t *m);
/* Carves `floats` from act->grad_scratch at *offset (advanced). */
float *hp_act_scratch(hp_act_t *act, size_t *offset, size_t floats);
void hp_module_base_init(hp_module_t *m, const hp_module_ops_t *ops, const char *name, void *impl);

/* ---- tensor parallel support (model.c, used by src/parallel/tp.c) ---------------------- */
typedef struct hp_model *hp_model_t;
/* Replaces the cross-entropy kernels (loss_parallel over vocab-sharded logits (N, V local)). */
typedef struct hp_model_loss_fn {
    hp_status_t (*forward)(void *ctx, double *sum, double *losses, float *lse, const float *logits,
                           const int32_t *targets, int N, int V, int64_t *n_valid);
    hp_status_t (*backward)(void *ctx, float *dlogits, const float *logits, const float *lse,
                            const int32_t *targets, float dloss, int N, int V);
} hp_model_loss_fn_t;
/* Every module of the model (creation order); returns the count (writes at most cap). */
int hp_model_modules(hp_model_t m, hp_module_t **out, int cap);
/* Attention and feed-forward run local heads / hidden features (n/tp); errors name the sizes. */
hp_status_t hp_model_tp_localize(hp_model_t m, int attn_tp, int ffn_tp);
/* seq_shard: residual stream holds T/seq_shard positions per rank (0 or 1: all); logits_cols:
 * columns the output module writes (0: vocab); loss_fn NULL: the cross-entropy kernels. */
void hp_model_tp_set(hp_model_t m, int seq_shard, int logits_cols, const hp_model_loss_fn_t *loss_fn,
                     void *loss_ctx);
int hp_model_max_tokens(hp_model_t m);   /* max_batch * max_seq_len */
/* The model takes ownership of new parameter / gradient storage (aligned, `floats` each) that
 * the caller's param entries already point into (tensor parallel: the compacted local shards)
 * at param_off[i] floats (units stay contiguous, so hp_model_unit_span / param_offset describe
 * the new layout); the old storage is freed and every unit re-bound. */
void hp_model_tp_adopt_storage(hp_model_t m, float *param_data, float *grad_data, size_t floats,
                               const size_t *param_off);

#endif
