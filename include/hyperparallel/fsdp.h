/* fully_shard (FSDP2 / HSDP) over the model's units (docs/fsdp.md): every unit (the
 * embedding, each transformer block, the root = norm + output, as TorchTitan groups them) is
 * one parameter group with one flat all-gather and one flat reduce-scatter laid out as
 * PyTorch's foreach_all_gather / foreach_reduce; with tied embeddings (qwen3) the embedding and
 * the root are one group (fully_shard([tok_embeddings, norm, output])). Parameters become DTensors Shard(0) on the
 * mesh (torch.chunk rows, zero-padded local buffers); the hp_param_t array of the FSDP object
 * points at the LOCAL shards, so the optimizer, clipping and checkpoints see sharded params.
 * Full-size parameters and gradients exist only transiently in a workspace sized for the
 * groups in flight. */
#ifndef HYPERPARALLEL_FSDP_H
#define HYPERPARALLEL_FSDP_H

#include "comm.h"
#include "dtype.h"
#include "mesh.h"
#include "model.h"
#include "param.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MixedPrecisionPolicy. HP_F32 means "None" (our parameters are f32). param_dtype HP_BF16:
 * the all-gather moves bf16 and the unit computes with the bf16-rounded weights upcast to
 * f32 (our kernels compute in f32; PyTorch would also compute in bf16). reduce_dtype HP_BF16:
 * reduce-scatter / all-reduce in bf16, results cast back to f32 before accumulation. Sharded
 * parameters, gradients and optimizer state stay f32. output_dtype / cast_forward_inputs:
 * see docs/fsdp.md (inputs of our units are token ids and f32 activations). */
typedef struct hp_mp_policy {
    hp_dtype_t param_dtype;
    hp_dtype_t reduce_dtype;
    hp_dtype_t output_dtype;
    int cast_forward_inputs;
} hp_mp_policy_t;

enum { HP_FSDP_RESHARD_DEFAULT = -1 };   /* None: True for non-root units, False for the root */

typedef struct hp_fsdp_options {
    /* HP_FSDP_RESHARD_DEFAULT, 1 (True), 0 (False) or an integer k >= 2 that divides the shard
     * size (after forward keep a copy sharded over groups of k ranks; backward all-gathers
     * over that group). Applies to every unit; the root follows it except for Default. */
    int reshard_after_forward;
    hp_mp_policy_t mp;
    /* 1: asynchronous collectives, implicit forward prefetch (the next unit's all-gather is
     * issued once this unit's is copied out) and backward prefetch (the previous unit in
     * post-forward order), reduce-scatters waited one unit later. 0: blocking, no prefetch
     * (same arithmetic, bitwise identical results). */
    int overlap;
    /* 0 = unset (PyTorch default: AVG over shard x replicate ranks). > 0: set_gradient_divide_
     * factor(f): reduce-scatter AVG when f == shard size, else PREMUL_SUM(1/f); all-reduce SUM.
     * TorchTitan's globally normalised loss needs sums: factor 1 (PREMUL_SUM(1) == SUM). */
    double gradient_divide_factor;
    /* set_force_sum_reduction_for_comms: SUM with pre-divide p and post-divide f/p
     * (p = largest power of two with f % p == 0 and f/p > p... PyTorch's rule). */
    int force_sum_reduction;
    /* fully_shard's ignored_params: NULL = none; else parameters for which it returns nonzero
     * are left to their owner (expert parallel's experts, managed over efsdp by ep.c): not
     * sharded, not gathered, not reduced; fully_shard moves them into storage of its own
     * (the model's is released), hp_fsdp_params lists them unchanged (their own layout) and
     * hp_fsdp_zero_grad zeroes their gradients. */
    int (*ignored_params)(const hp_param_t *p);
} hp_fsdp_options_t;

/* reshard Default, no mixed precision (all f32), overlap on, divide factor unset. */
hp_fsdp_options_t hp_fsdp_default_options(void);

typedef struct hp_fsdp *hp_fsdp_t;

/* fully_shard every unit of `model` over `mesh` (tied embeddings: the embedding and the root
 * are one group, unsharded at the embedding's pre-forward, resharded after the root's forward
 * as reshard_after_forward says (Default: kept, as the root), unsharded for backward at the
 * root's pre-backward, reduced once after the embedding's backward with the gradient of both
 * uses): 1-D (Shard(0)) or 2-D HSDP (dims
 * (replicate, shard), names required, placements (Replicate(), Shard(0))). After
 * tensor-parallel parallelize (parameters are DTensors on a 1-D tp mesh that is a slice of the
 * same mesh as `mesh`), FSDP shards each TP-local tensor's dim 0 and the sharded parameters
 * are DTensors on the SPMD mesh (mesh dims..., tp) with the full global shape: placements
 * (_StridedShard(0, tp), Shard(0)) for TP Shard(0), (Shard(0), Shard(1)) for TP Shard(1),
 * (Shard(0), Replicate()) for replicated ones (HSDP: Replicate() first). Copies this rank's
 * rows of the model's current weights into the sharded buffers (an empty model,
 * hp_model_create_empty, has none: the shards stay zero until hp_model_init_params draws them
 * or a checkpoint is loaded into hp_fsdp_params), then releases the model's storage
 * (hp_model_release_storage) and installs the hooks. Collective over the mesh (none at creation, but
 * every rank must call it). Errors: a model already wrapped (fully_shard twice, or DDP), a
 * mesh of other than 1 or 2 dims, a 2-D mesh without names, a scalar parameter, a rank
 * outside the mesh. */
hp_status_t hp_fully_shard(hp_model_t model, hp_mesh_t mesh, const hp_fsdp_options_t *opts,
                           hp_fsdp_t *out);
/* Removes the hooks and frees the shards (the model's weights are gone with them). */
void hp_fsdp_destroy(hp_fsdp_t f);

/* The check fully_shard runs on every parameter (contiguous f32, not a scalar: PyTorch's
 * "Change <name> to a 1D tensor with numel equal to 1."). */
hp_status_t hp_fsdp_validate_param(const hp_param_t *p);

/* Sharded parameters in the model's param order (DTensors on the mesh; local = this rank's
 * rows, a view into the zero-padded shard buffer). */
hp_param_t *hp_fsdp_params(hp_fsdp_t f);
int hp_fsdp_num_params(hp_fsdp_t f);
/* Zeroes the sharded gradients. HP_ERR_STATE when unreduced gradients from backwards run
 * without gradient sync are pending (they would be lost). */
hp_status_t hp_fsdp_zero_grad(hp_fsdp_t f);
/* set_requires_gradient_sync: 0 = the next backwards accumulate unsharded gradients locally
 * (no reduce-scatter, no all-reduce); the first backward with 1 reduces the accumulated sum. */
void hp_fsdp_set_requires_gradient_sync(hp_fsdp_t f, int sync);
/* HSDP set_requires_all_reduce: 0 = reduce-scatter only, outputs accumulate per replicate
 * (partial), the first backward with 1 all-reduces the accumulated sharded gradient. On a
 * 1-D mesh this is an error (there is no replicate dim). */
hp_status_t hp_fsdp_set_requires_all_reduce(hp_fsdp_t f, int all_reduce);
/* Communicators over which gradient norms must be summed (shard, then replicate, then the
 * TP mesh's when the parameters are TP DTensors): pass to hp_clip_grad_norm. Returns the
 * count (1 to 3). */
int hp_fsdp_grad_comms(hp_fsdp_t f, hp_comm_t *comms);
/* The unsharded (over the FSDP shard dim) value or gradient of parameter i into out: the full
 * tensor, or with TP the TP-local tensor (numel of the model's parameter i before
 * fully_shard). Collective over the shard group. */
hp_status_t hp_fsdp_full_value(hp_fsdp_t f, int i, float *out);
hp_status_t hp_fsdp_full_grad(hp_fsdp_t f, int i, float *out);

/* Persistent bytes of this rank: sharded parameters (padded), sharded gradients (padded),
 * both with the ignored parameters held whole, and the transient workspace (gathered
 * parameters / gradients and collective buffers). */
void hp_fsdp_memory(hp_fsdp_t f, size_t *param_bytes, size_t *grad_bytes, size_t *workspace_bytes);

/* ---- explicit control (FSDPModule's unshard / reshard / set_modules_to_*_prefetch) --------
 * FSDP's modules are the model's units: 0 tok_embeddings, 1..L layers.0..L-1, L+1 the root
 * (norm + output); a unit of the tied group (tok_embeddings+root) controls the group. */

/* FSDPModule.unshard(async_op): all-gathers the unit's group (a no-op when it is unsharded or
 * gathering); without async_op it also waits and points the model's entries at the gathered
 * parameters, with async_op hp_fsdp_wait_unshard does (UnshardHandle.wait). The group then
 * stays unsharded until its post-forward (as reshard_after_forward says), its post-backward or
 * hp_fsdp_reshard: its pre-forward / pre-backward all-gather is skipped (PyTorch's manual
 * prefetch). A rotating group takes a slot of the pool (hp_fsdp_num_slots): unsharding more of
 * them at once than the pool holds is HP_ERR_STATE. */
hp_status_t hp_fsdp_unshard(hp_fsdp_t f, int unit, int async_op);
hp_status_t hp_fsdp_wait_unshard(hp_fsdp_t f, int unit);
/* FSDPModule.reshard(): frees the unit's gathered parameters (SHARDED; a post-forward copy of
 * reshard_after_forward = k is dropped too). Refused inside the unit's backward. */
hp_status_t hp_fsdp_reshard(hp_fsdp_t f, int unit);
int hp_fsdp_is_unsharded(hp_fsdp_t f, int unit);
/* set_modules_to_forward_prefetch / set_modules_to_backward_prefetch: after unit's all-gather
 * is copied out in its pre-forward (pre-backward), the all-gathers of `units` start, in list
 * order (no-ops for groups unsharded or gathering already). The list replaces the implicit
 * prefetch of that unit (forward: the next unit; backward: the previous one; both only with
 * overlap); n = 0 prefetches nothing, n < 0 restores the implicit one. The numerics do not
 * change (bitwise the same results). The rotating pool is re-sized to what the lists hold at
 * once (set-up time: every group must be sharded). */
#define HP_FSDP_MAX_PREFETCH 16
hp_status_t hp_fsdp_set_modules_to_forward_prefetch(hp_fsdp_t f, int unit, const int *units, int n);
hp_status_t hp_fsdp_set_modules_to_backward_prefetch(hp_fsdp_t f, int unit, const int *units, int n);
/* Rotating unsharded-parameter slots of the pool (the kept groups, reshard_after_forward False
 * and the root by default, have buffers of their own). */
int hp_fsdp_num_slots(hp_fsdp_t f);

/* What hp_fully_shard(model, a mesh of W shard x R replicate ranks, opts) would hold on a rank,
 * without a mesh or any allocation (the memory plan's FSDP term; `model` may be empty): the
 * parameter and gradient bytes (hp_fsdp_memory's) and the workspace with the implicit
 * prefetches; no_sync: backwards run without gradient sync (a pipeline's micro-batches before
 * the step's last), so every group keeps its unsharded gradients between them. rs_input_bytes
 * (may be NULL): the largest reduce-scatter input, which the MPI library copies into a temporary
 * of its own (Open MPI's reduce_scatter_block algorithms) while it runs. */
hp_status_t hp_fsdp_plan_memory(hp_model_t model, int W, int R, const hp_fsdp_options_t *opts, int no_sync,
                                size_t *param_bytes, size_t *grad_bytes, size_t *workspace_bytes,
                                size_t *rs_input_bytes);

/* Event log (PyTorch's patched unshard / reshard / post_backward in its FSDP tests):
 * "unshard <unit>", "reshard <unit>", "post_backward <unit>" where <unit> is
 * "tok_embeddings", "layers.<i>", "root", or "tok_embeddings+root" (the group of a tied
 * model). Only unshards that start an all-gather and reshards that free parameters are logged
 * (no-ops are not). Off by default. */
void hp_fsdp_record_events(hp_fsdp_t f, int on);
int hp_fsdp_num_events(hp_fsdp_t f);
const char *hp_fsdp_event(hp_fsdp_t f, int i);
void hp_fsdp_clear_events(hp_fsdp_t f);

/* Seconds spent waiting in collectives (exposed communication) since the last reset. */
double hp_fsdp_comm_wait_seconds(hp_fsdp_t f);
void hp_fsdp_reset_timers(hp_fsdp_t f);

#ifdef __cplusplus
}
#endif
#endif
