/* Tensor and sequence parallel (torch.distributed.tensor.parallel): parallelize_module with a
 * plan of (fnmatch pattern over dotted module names, style); the styles ColwiseParallel,
 * RowwiseParallel (Linear and Embedding), SequenceParallel, PrepareModuleInput,
 * PrepareModuleOutput, PrepareModuleInputOutput, NoParallel; loss_parallel (cross-entropy over
 * vocab-sharded logits). The model families' plans are in src/models/ (models.h). See docs/tp.md.
 *
 * A parallelized module is replaced in its parent by a wrapper module (kind "tp_colwise",
 * "tp_rowwise", "tp_sequence_parallel", "tp_prepare" or "tp_no_parallel", carrying the module's
 * name) that holds it as its only child and redistributes inputs / outputs / gradients around
 * it, the style's input and output functions; the module itself is not modified. Its
 * parameters become DTensors on the 1-D TP mesh (hp_param_t value and grad describe the local
 * shard: placements, global shape, local shape), which the module computes with, so
 * optimizers, gradient clipping and checkpoints see them like any other DTensor. Shards are
 * packed in place inside the parameter's storage (a fused stacked GEMM wq|wk|wv stays one GEMM
 * over the local rows of each). Shards must be even (sizes divisible by the TP degree). */
#ifndef HYPERPARALLEL_TP_H
#define HYPERPARALLEL_TP_H

#include <stdint.h>
#include "status.h"
#include "mesh.h"
#include "dtensor.h"
#include "nn.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_tp_style_kind {
    HP_TP_COLWISE = 0,
    HP_TP_ROWWISE,
    HP_TP_SEQUENCE_PARALLEL,
    HP_TP_PREPARE_INPUT,
    HP_TP_PREPARE_OUTPUT,
    HP_TP_PREPARE_INPUT_OUTPUT,
    HP_TP_NO_PARALLEL
} hp_tp_style_kind_t;

/* A style. Layout fields are used when the matching has_* flag is set; otherwise PyTorch's
 * defaults apply (Colwise: input Replicate, output Shard(-1); Rowwise: input Shard(-1),
 * output Replicate; Embedding rowwise input Replicate). Shard dims of activations: 0 = rows of
 * a 2-D (N, C) tensor, 1 = the sequence of (B, T, C) (B from hp_act_t.B), -1 = features. */
typedef struct hp_tp_style {
    hp_tp_style_kind_t kind;
    int has_input_layout, has_output_layout, has_desired_input, has_desired_output;
    hp_placement_t input_layout, output_layout, desired_input_layout, desired_output_layout;
    int use_local_output;   /* Colwise/Rowwise default 1; PrepareModuleInput default 0 */
    int sequence_dim;       /* SequenceParallel: 1 */
} hp_tp_style_t;

hp_tp_style_t hp_tp_colwise(void);
hp_tp_style_t hp_tp_rowwise(void);
hp_tp_style_t hp_tp_sequence_parallel(void);
hp_tp_style_t hp_tp_prepare_input(hp_placement_t input_layout, hp_placement_t desired_input_layout);
hp_tp_style_t hp_tp_prepare_output(hp_placement_t output_layout, hp_placement_t desired_output_layout);
hp_tp_style_t hp_tp_prepare_input_output(hp_placement_t input_layout, hp_placement_t desired_input_layout,
                                         hp_placement_t output_layout, hp_placement_t desired_output_layout);
hp_tp_style_t hp_tp_no_parallel(void);
/* Builders: a copy of s with the layout set. */
hp_tp_style_t hp_tp_with_input(hp_tp_style_t s, hp_placement_t input_layout);
hp_tp_style_t hp_tp_with_output(hp_tp_style_t s, hp_placement_t output_layout, int use_local_output);
const char *hp_tp_style_name(hp_tp_style_kind_t kind);   /* "ColwiseParallel", ... */

#define HP_TP_PATTERN_MAX 96
typedef struct hp_tp_plan_entry {
    char pattern[HP_TP_PATTERN_MAX];   /* fnmatch over dotted module names ("layers.*.attention.wq") */
    hp_tp_style_t style;
} hp_tp_plan_entry_t;

typedef struct hp_tp *hp_tp_t;

/* parallelize_module over an explicit list of module trees (the modules and, recursively,
 * their children): every plan pattern must match at least one module name; a fused linear
 * (several stacked params) is also matched by its params' module names (param name without
 * ".weight": the model's "layers.0.attention.wqkv" is wq|wk|wv) and all of them must get the
 * same style. A child is replaced in its parent by its wrapper (hp_module_replace_child); a
 * root's entry in `modules` becomes its wrapper (PyTorch's parallelize_module returns it): call
 * that. max_rows: the most activation rows (B*T) a forward will see (sizes the TP buffers).
 * Errors (nothing is changed then): a pattern matching nothing, a style on a module kind it
 * does not support, two different styles for one module, a module parallelized twice, sizes
 * not divisible by the degree, unsupported layouts; each message names the pattern / module
 * and the expected values. */
hp_status_t hp_tp_parallelize_modules(hp_tp_t *out, hp_module_t **modules, int n_modules,
                                      hp_mesh_t tp_mesh, const hp_tp_plan_entry_t *plan, int n_plan,
                                      int64_t max_rows);

/* parallelize_module on a model: applies the plan to the model's modules, each wrapper put in
 * its module's place with hp_model_replace_module (a unit's module keeps the unit's hooks
 * through its wrapper). Attention and feed-forward then run the local heads / hidden features
 * their projections' shards hold (n_heads/tp, n_kv_heads/tp: an error when they do not
 * divide); every other parameter becomes a Replicate DTensor on the TP mesh; the model keeps
 * storage of the local sizes (hp_model_compact_storage). The model learns the layouts through
 * the module protocol: the wrappers report their activation splits (nn.h act_split), so the
 * residual stream holds sequence shards when the plan's embedding output is Shard(1)
 * (sequence parallel) and the logits vocab columns when the output's output layout is
 * Shard(-1); then the head's cross-entropy child is replaced by loss_parallel. Call before or
 * after hp_model_init_weights (the initialisation of a shard equals the slice of the
 * single-rank initialisation) and before or after context parallel (hp_cp_apply). */
hp_status_t hp_tp_parallelize_model(hp_tp_t *out, hp_model_t model, hp_mesh_t tp_mesh,
                                    const hp_tp_plan_entry_t *plan, int n_plan);
/* Puts the original modules back in their parents (a model's tree, or the parents of
 * parallelize_modules' trees; a root's wrapper in the caller's list is gone: use the original
 * module) and frees the wrappers. Before the model is destroyed. The parameters stay shards. */
void hp_tp_destroy(hp_tp_t tp);

/* Appends (pattern, style) to a plan of capacity cap holding n entries; returns n + 1 (an entry
 * beyond cap is counted, not written, so a caller can size its array). The model families'
 * plans (TorchTitan's, per family: hp_model_spec_t.tp_plan in models.h) are built with it. */
int hp_tp_plan_add(hp_tp_plan_entry_t *plan, int cap, int n, const char *pattern, hp_tp_style_t style);

/* Bytes of the TP buffers (gathered inputs / output gradients kept for backward, scratch). */
size_t hp_tp_buffer_bytes(hp_tp_t tp);
int hp_tp_degree(hp_tp_t tp);

/* ---- loss_parallel: cross-entropy over logits sharded on the class dim --------------------
 * logits (N, V_local) hold global classes [vocab_offset, vocab_offset + V_local) of this rank;
 * targets (N) global ids or -100. Forward: row max all-reduced (MAX), sum of exp all-reduced
 * (SUM, double), the target logit taken by its owning rank and all-reduced (SUM): 3
 * all-reduces, as PyTorch's loss_parallel. losses (N) and lse (N) as hp_cross_entropy_forward;
 * *sum = sum of valid losses. Backward: local, no communication. */
hp_status_t hp_loss_parallel_forward(double *sum, double *losses, float *lse, const float *logits,
                                     const int32_t *targets, int N, int V_local, int64_t vocab_offset,
                                     hp_comm_t comm, int64_t *n_valid);
void hp_loss_parallel_backward(float *dlogits, const float *logits, const float *lse, const int32_t *targets,
                               float dloss, int N, int V_local, int64_t vocab_offset);

#ifdef __cplusplus
}
#endif
#endif
