/* The composition of parallelisms over one rank's model, as public steps (TorchTitan's
 * parallelize_llama and pipeline_llm): an hp_parallel_t holds the rank's model parts (the whole
 * model, or the pipeline stages it runs), what each apply step made (TP, EP, CP, FSDP, DDP
 * handles; the pipeline runtime) and the gradient finalizer those steps filled. A model family's
 * parallelize (src/models/) calls the steps in TorchTitan's order:
 *
 *     hp_pipeline_split (pipeline parallel only)  or  hp_parallel_create
 *     hp_apply_tp -> hp_apply_ep -> hp_apply_cp -> hp_apply_ac -> hp_apply_fsdp or hp_apply_ddp
 *     (-> hp_apply_zero) -> hp_parallel_init_weights -> hp_apply_pp (pipeline parallel only)
 *
 * and a library user can call the same steps in the same order with the same result (the step
 * functions below are the whole composition: the trainer holds no parallelism of its own). Each
 * step attaches through the module protocol (nn.h hooks, hp_model_replace_module) and states
 * the reductions its placements need in the gradient finalizer, so the trainer's step is
 * forward-backward, one finalizer call, the optimizer (docs/architecture.md). */
#ifndef HYPERPARALLEL_PARALLELIZE_H
#define HYPERPARALLEL_PARALLELIZE_H

#include <stdint.h>
#include "status.h"
#include "comm.h"
#include "mesh.h"
#include "param.h"
#include "model.h"
#include "tp.h"
#include "cp.h"
#include "fsdp.h"
#include "ddp.h"
#include "zero.h"
#include "pp_schedule.h"
#include "parallel_dims.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_parallel *hp_parallel_t;

/* ---- the rank's model parts ------------------------------------------------------------- */

/* One part: `model` (borrowed; destroy it after hp_parallel_destroy). batch and seq_len: the
 * largest (B, T) the caller will feed (whole sequences; context parallel shards them). */
hp_status_t hp_parallel_create(hp_model_t model, int batch, int seq_len, hp_parallel_t *out);
void hp_parallel_destroy(hp_parallel_t p);
/* p destroys `mesh` with itself (a mesh a composition sliced for its steps). */
hp_status_t hp_parallel_adopt_mesh(hp_parallel_t p, hp_mesh_t mesh);
int hp_parallel_num_parts(hp_parallel_t p);
hp_model_t hp_parallel_part(hp_parallel_t p, int i);
/* The whole model's (name, DTensor) table the optimizer, clipping and checkpoints see: the
 * parts' parameters in their final layout (FSDP's shards once hp_apply_fsdp ran); under
 * pipeline parallel the other stages' parameters are placeholders with the global shape and no
 * local elements, so every rank lists the same entries in the same order. */
hp_param_t *hp_parallel_params(hp_parallel_t p);
int hp_parallel_num_params(hp_parallel_t p);
/* Bytes per rank: parameters, gradients (FSDP's shards where sharded), activations and
 * workspace of every part (FSDP's gather buffers in the workspace). */
void hp_parallel_memory(hp_parallel_t p, size_t *param_bytes, size_t *grad_bytes, size_t *act_bytes,
                        size_t *work_bytes);

/* ---- the apply steps (TorchTitan's order) ------------------------------------------------ */

/* Tensor / sequence parallel (parallelize_module) of every part over the 1-D tp_mesh with
 * `plan` (each part gets the entries that match one of its modules). Before the weights are
 * drawn: each rank draws its shards at their global indices. */
hp_status_t hp_apply_tp(hp_parallel_t p, hp_mesh_t tp_mesh, const hp_tp_plan_entry_t *plan, int n_plan);

/* Expert parallel of every MoE layer (TorchTitan's apply_moe_ep_tp). sparse: the run's sparse
 * mesh (hp_parallel_meshes_t.sparse: [pp,] dp_replicate, efsdp, ep[, etp]; NULL when ep is 1);
 * tp_mesh: the dense TP mesh (NULL when tp is 1). The mode follows the mesh: experts Shard(0)
 * over ep; with etp the hidden F over etp (ETP); with efsdp > 1 FSDP of the experts over efsdp;
 * ep 1 with tp_mesh: the experts' hidden F over tp. sequence_parallel (with tp_mesh): every tp
 * rank routes its own sequence shard (TorchTitan's MoE layouts with SP on). Expert gradients
 * are summed over dp_replicate after backward; the gradient norm counts the experts over their
 * own mesh. After hp_apply_tp, before the weights are drawn. */
hp_status_t hp_apply_ep(hp_parallel_t p, hp_mesh_t sparse, hp_mesh_t tp_mesh, int sequence_parallel);

/* Context parallel over the 1-D cp_mesh: every part's attention cores become ring / Ulysses
 * cores (after hp_apply_tp: they run the local heads); the caller feeds whole sequences and each
 * rank runs T/cp rows of each (head-tail balanced by default). A part without attention keeps
 * its units. */
hp_status_t hp_apply_cp(hp_parallel_t p, hp_mesh_t cp_mesh, const hp_cp_options_t *o);

/* Activation checkpointing (TorchTitan semantics): every_k 0 off, 1 every block (mode full),
 * k > 1 the blocks l with (l + 1) % k == 0 (layer-level selective AC). */
hp_status_t hp_apply_ac(hp_parallel_t p, int every_k);
/* The same with a save policy (nn_checkpoint.h): op-level selective AC (HP_AC_OP) or a memory
 * budget (HP_AC_BUDGET) in every checkpointed block; bitwise the losses and gradients without AC. */
hp_status_t hp_apply_ac_options(hp_parallel_t p, const hp_ac_options_t *o);
/* What the applied checkpointing costs on this rank per micro-batch of micro_batch sequences
 * (<= 0: the batch p was created for) of the rows this rank runs (T / cp): activation bytes
 * and recompute FLOPs summed over the rank's parts (model.h hp_ac_estimate_t). */
hp_status_t hp_parallel_ac_estimate(hp_parallel_t p, int micro_batch, hp_ac_estimate_t *out);

/* TorchTitan's init (parallelize, then init_weights), drawn from the counter RNG keyed by
 * (seed, parameter name, global element index): every layout draws bitwise the values the
 * single rank has at each index. The last step: the parts' parameters are placed by then, so a
 * part created empty (hp_model_create_empty, the meta device) allocates only what this rank
 * holds (hp_model_materialize: TP / EP shards, a stage's units) or FSDP's shards are drawn in
 * place (hp_fsdp_params), and nothing of the model's full size is ever allocated on a rank
 * that does not hold it whole. A part with storage is drawn where it lives (any order). */
hp_status_t hp_parallel_init_weights(hp_parallel_t p, uint64_t seed);

/* fully_shard of every part over dp_mesh ((dp_shard), (dp_replicate, dp_shard), or under
 * context parallel (dp_shard x cp) flattened): FSDP2 / HSDP. Under expert parallel the experts
 * stay on their sparse mesh (ignored by FSDP). Under pipeline parallel the gradients are
 * reduced after each stage's last backward of the step only. */
hp_status_t hp_apply_fsdp(hp_parallel_t p, hp_mesh_t dp_mesh, const hp_fsdp_options_t *o);

/* Replicated data parallel over dp_comm: DDP's bucketed asynchronous all-reduce during backward
 * (no pipeline, untied embeddings, no expert parallel), else one SUM all-reduce per held gradient
 * after backward (the finalizer). `o` may be NULL (DDP defaults with sums, not averages). */
hp_status_t hp_apply_ddp(hp_parallel_t p, hp_comm_t dp_comm, const hp_ddp_options_t *o);

/* ZeRO-1 (ZeroRedundancyOptimizer) over the replicated data-parallel ranks of dp_comm, after
 * hp_apply_ddp (whole gradients on every rank): the parameters are partitioned by PyTorch's
 * greedy rule; the optimizer is built on hp_parallel_optim_params (this rank's share, the
 * others placeholders), so each rank holds the state of its share only; after each optimizer
 * step hp_parallel_after_optimizer_step broadcasts every parameter from its owner. Results
 * are bitwise those of DDP (the owner's update is the one every rank would compute). Not with
 * pipeline stages, experts or FSDP (which shards the state already). */
hp_status_t hp_apply_zero(hp_parallel_t p, hp_comm_t dp_comm);
/* The table the optimizer is built on: hp_parallel_params, or ZeRO-1's view of it. */
hp_param_t *hp_parallel_optim_params(hp_parallel_t p);
/* After every optimizer step (ZeRO-1's broadcast from the owners; nothing otherwise). */
hp_status_t hp_parallel_after_optimizer_step(hp_parallel_t p);

/* ---- pipeline parallel (TorchTitan's pipeline_llm) --------------------------------------- */

/* What the split and the runtime need; each field is the job config key of the same name under
 * `parallelism.` (docs/config.md), which the errors name. */
typedef struct hp_pipeline_options {
    const char *schedule;                 /* pipeline_parallel_schedule (a generator's name) */
    const char *schedule_csv;             /* pipeline_parallel_schedule_csv ("" or NULL: none) */
    const char *module_fqns_per_model_part;   /* "" or NULL: split by layer counts */
    int microbatch_size;                  /* pipeline_parallel_microbatch_size */
    int layers_per_stage;                 /* pipeline_parallel_layers_per_stage (-1: unset) */
    int first_stage_less_layers, last_stage_less_layers;
    int mpipe_transpose_layers;           /* pipeline_parallel_mpipe_transpose_layers */
} hp_pipeline_options_t;

/* Splits cfg's model into stages (the schedule decides one or two per pp rank; the units are
 * split by TorchTitan's rule or module_fqns_per_model_part), maps them onto the pp ranks, makes
 * the lowered schedule, and creates on this rank only its stages' models (each holding only its
 * units) as the parts of a new hp_parallel_t. batch: the local batch (a whole number of
 * micro-batches); seq_len: T. pd: the run's degrees (MPipe's and the V schedules' rules); rank:
 * this rank's index in the world mesh. No collective runs here. */
hp_status_t hp_pipeline_split(const hp_model_config_t *cfg, const hp_parallel_dims_t *pd, int rank, int batch,
                              int seq_len, const hp_pipeline_options_t *o, hp_parallel_t *out);
/* The runtime over the parts (after every other step; collective over pp_comm, the world
 * mesh's pp dim): the whole model's parameter table, the tied weight's gradient sum between
 * the first and last stage, and the gradient norm summed over pp. The parts' set-up may have
 * failed on some ranks only: every rank of `world` agrees first. */
hp_status_t hp_apply_pp(hp_parallel_t p, hp_comm_t world, hp_mesh_t world_mesh);
int hp_parallel_is_pipelined(hp_parallel_t p);
/* Logs (rank 0 of world, collective over pp) each pp rank's stages, parameter, context and
 * buffer bytes; nothing without pipeline parallel. */
hp_status_t hp_pipeline_log_layout(hp_parallel_t p, hp_comm_t world);

/* ---- running a step ---------------------------------------------------------------------- */

/* Zeroes every part's gradients (and FSDP's sharded ones). */
hp_status_t hp_parallel_zero_grad(hp_parallel_t p);
/* Forward and backward of one micro-batch (pipelined: one run of the schedule over the
 * batch's micro-batches): tokens / targets (B, T) whole sequences of this data-parallel rank;
 * each loss is its summed cross-entropy / loss_divisor (the step's global valid-token count).
 * last: the step's last micro-batch (gradient reductions run only then: DDP's no_sync, FSDP's
 * set_requires_gradient_sync under pipelining). *loss: this rank's share of the loss (NaN when
 * the forward was not finite: every rank still enters the same collectives). */
hp_status_t hp_parallel_forward_backward(hp_parallel_t p, const int32_t *tokens, const int32_t *targets, int B,
                                         int T, float loss_divisor, int last, double *loss);
/* Forward only (validation): *loss_sum and *n_valid of this rank's rows (the last stage's under
 * pipelining, zero elsewhere). */
hp_status_t hp_parallel_eval(hp_parallel_t p, const int32_t *tokens, const int32_t *targets, int B, int T,
                             double *loss_sum, int64_t *n_valid);
/* The communicator the step's loss is summed over first: the pp dim under pipelining (only
 * the last stage holds it), else NULL. */
hp_comm_t hp_parallel_pp_comm(hp_parallel_t p);
/* Seconds data parallel's collectives kept the step waiting (FSDP or DDP) since creation. */
double hp_parallel_comm_wait_seconds(hp_parallel_t p);

/* The whole model gathered (collective over world): every parameter's full tensor (FSDP / TP:
 * full_tensor, the ranks other than 0 through one parameter-sized scratch; pipelined: each
 * stage's first rank sends to world rank 0). *full receives a model of the whole config holding
 * them on world rank 0 (NULL elsewhere); *owned says whether the caller destroys it (replicated
 * parameters: the part itself, not owned). */
hp_status_t hp_parallel_gather_full_model(hp_parallel_t p, hp_comm_t world, int seq_len, hp_model_t *full,
                                         int *owned);

/* ---- the gradient finalizer ---------------------------------------------------------------
 * Every post-backward reduction and the global gradient norm, built by the apply steps: each
 * registers the reductions its placements need (replicated data parallel's all-reduce, the
 * experts' sum over dp_replicate, sequence parallel's router sums over tp, the pipeline's tied
 * weight) and the communicators its parameters' placements span for the norm. Parameters fall
 * in norm groups (the dense ones; the experts on their sparse mesh under expert parallel): each
 * group's norm sums the squares of the entries counted on this rank (a Replicate dim counts on
 * its local rank 0) over its communicators (and pp), and the total is the norm of the groups'
 * norms (PyTorch's clip_grad_norm_ over several devices). Clipping is then one call for every
 * layout. */
typedef struct hp_grad_finalizer *hp_grad_finalizer_t;
hp_grad_finalizer_t hp_parallel_finalizer(hp_parallel_t p);

/* Reductions run in phase order, registration order within a phase: data-parallel sums, the
 * expert groups, partial sums over tp, the pipeline's tied copies. */
typedef enum hp_grad_phase {
    HP_GRAD_PHASE_DATA_PARALLEL = 0,
    HP_GRAD_PHASE_EXPERT,
    HP_GRAD_PHASE_TENSOR_PARALLEL,
    HP_GRAD_PHASE_PIPELINE,
    HP_GRAD_PHASES
} hp_grad_phase_t;
/* fn(ctx, params, n) runs after every backward of the step with the whole model's table. */
typedef hp_status_t (*hp_grad_reduce_fn)(void *ctx, hp_param_t *params, int n);
hp_status_t hp_grad_finalizer_add_reduction(hp_grad_finalizer_t f, hp_grad_phase_t phase, hp_grad_reduce_fn fn,
                                            void *ctx);
/* Norm groups: the dense parameters (HP_GRAD_GROUP_DENSE, every parameter when no expert group
 * exists) and the experts (HP_GRAD_GROUP_EXPERT: hp_ep_is_expert_param). Sets the group's
 * communicators (the mesh dims its parameters are placed on; replaces earlier ones) and makes
 * the group exist; hp_grad_finalizer_add_comm appends one (the pipeline's pp dim to each). */
typedef enum hp_grad_group { HP_GRAD_GROUP_DENSE = 0, HP_GRAD_GROUP_EXPERT, HP_GRAD_GROUPS } hp_grad_group_t;
#define HP_GRAD_MAX_COMMS 8
hp_status_t hp_grad_finalizer_set_comms(hp_grad_finalizer_t f, hp_grad_group_t g, const hp_comm_t *comms, int n);
hp_status_t hp_grad_finalizer_add_comm(hp_grad_finalizer_t f, hp_grad_group_t g, hp_comm_t comm);

/* After the step's last backward: every registered reduction. */
hp_status_t hp_grad_finalizer_reduce(hp_grad_finalizer_t f);
/* The global gradient norm (collective), then, when max_norm > 0, every gradient scaled by
 * max_norm / (norm + 1e-6) if that is below 1 (torch.nn.utils.clip_grad_norm_). A non-finite
 * norm is HP_ERR_NUMERIC with gradients untouched. */
hp_status_t hp_grad_finalizer_clip(hp_grad_finalizer_t f, double max_norm, double *norm);

#ifdef __cplusplus
}
#endif
#endif
