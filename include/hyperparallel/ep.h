/* Expert parallelism (TorchTitan's dp2ep; docs/moe.md): every MoE layer's routed experts are
 * sharded over a 1-D `ep` mesh, Shard(0) on the expert dim, so rank r holds experts
 * [r E/ep, (r+1) E/ep) and never another rank's. The MoE module's expert stage is replaced by
 * an all-to-all dispatcher: count exchange (all_to_all of the per-expert counts), all_to_all_v
 * of the token rows, rank-major -> expert-major permutation, the local grouped experts, the
 * inverse permutation and the reverse all_to_all_v; backward mirrors it. The router, shared
 * experts and every dense parameter stay whole and become Replicate over ep (gradient norms
 * count them once). Dispatch state lives in each micro-batch's activation context. */
#ifndef HYPERPARALLEL_EP_H
#define HYPERPARALLEL_EP_H

#include "status.h"
#include "mesh.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_ep *hp_ep_t;

/* Shards the experts of every MoE module of m over ep_mesh (1-D, size dividing the number
 * of experts) and installs the dispatcher; the parameter storage is compacted to the local
 * size. The other parameters become Replicate over ep, except those that already have a
 * mesh (the TP plan's layout when the ep mesh spans tp ranks: they keep it). Call before hp_model_init_weights (each rank draws its experts at their global
 * indices) or after loading full weights (the local slice is kept). Buffers are sized for
 * the worst case (every token of every ep rank routed to this rank's experts), so the step
 * allocates nothing. ep_mesh must outlive the handle. */
hp_status_t hp_ep_parallelize_model(hp_model_t m, hp_mesh_t ep_mesh, hp_ep_t *out);
/* Tensor parallel of the experts alone (EP = 1): every rank of the 1-D tp mesh keeps all
 * experts on F/tp hidden features (w1/w3 Shard(1), w2 Shard(2)); the expert stage all-reduces
 * its partial outputs (forward) and input gradients (backward) over tp. The MoE input must be
 * Replicate over tp (no sequence parallel); router and shared experts stay replicated. Call
 * after hp_tp_parallelize_model and before hp_model_init_weights. */
hp_status_t hp_ep_tensor_parallel_experts(hp_model_t m, hp_mesh_t tp_mesh, hp_ep_t *out);
/* Expert tensor parallel on a 2-D (ep, tp) mesh: experts Shard(0) over ep and their hidden F
 * over tp (w1/w3 Shard(1), w2 Shard(2)); tokens (Replicate over tp) are dispatched within
 * each tp column over ep, and the combined outputs / input gradients, partial over the F
 * slices, are all-reduced over tp. Dense parameters become (Replicate, their TP placement).
 * Call after hp_tp_parallelize_model on the same tp dim and before hp_model_init_weights. */
hp_status_t hp_ep_parallelize_model_etp(hp_model_t m, hp_mesh_t ep_tp_mesh, hp_ep_t *out);
/* Expert parallel with FSDP of the experts over efsdp (TorchTitan's dp2ep): on the 2-D
 * (efsdp, ep) sparse mesh each rank keeps experts [r E/ep + f E/(ep efsdp), +E/(ep efsdp))
 * (placements _StridedShard(0, ep), Shard(0)); when efsdp x ep > E (TorchTitan's rule) it keeps
 * all E/ep experts of its ep rank on 1/efsdp of their dim 1 (Shard(1), Shard(0)): w1/w3 rows
 * of F, w2 rows of D. The dispatcher all-gathers its ep rank's experts over efsdp before each
 * use and reduce-scatters their grads (SUM) into the shards. Dense parameters become Replicate
 * over both dims. Shard(0) needs efsdp dividing E/ep, Shard(1) efsdp dividing F and D.
 * On a 3-D (efsdp, ep, etp) mesh the experts are also tensor parallel over etp (ETP x expert
 * FSDP): each rank first keeps its F/etp slice (w1/w3 Shard(1), w2 Shard(2) on etp), efsdp then
 * shards that as above (Shard(1) splits w1/w3's F slice again, _StridedShard(1, etp) on efsdp,
 * and w2's D); the gathered experts run as under ETP (outputs and input gradients all-reduced
 * over etp). Dense parameters become (Replicate, Replicate, their TP placement); call after
 * hp_tp_parallelize_model on the same tp ranks. Shard(1) then needs efsdp dividing F/etp and D. */
hp_status_t hp_ep_parallelize_model_efsdp(hp_model_t m, hp_mesh_t efsdp_ep_mesh, hp_ep_t *out);
/* Hands the dense parameters back to their own plans (TorchTitan: the dense parts keep
 * theirs): the Replicate-over-ep layout the calls above gave them becomes a plain tensor again,
 * or under ETP their tensor-parallel placement on the tp mesh. Call before fully_shard of the
 * dense parameters over the dense fsdp mesh, with the experts as its ignored_params
 * (hp_ep_is_expert_param): the experts stay as above. */
hp_status_t hp_ep_restore_dense_layout(hp_ep_t ep, hp_model_t m);
/* Sequence parallel around the MoE layers (TorchTitan's MoE layouts with SP on): the MoE
 * input arrives Shard(seq) over the 1-D tp_mesh and each tp rank routes its own tokens.
 * With the experts' F sharded over tp (hp_ep_tensor_parallel_experts, ETP) every expert row
 * goes to the tp ranks holding its expert's F slices and their partial outputs (and input
 * gradients) come back summed (all-gather to Replicate, Partial -> Shard(seq)); with EP over
 * ranks that include tp (hp_ep_parallelize_model on an ep mesh spanning tp, ETP degree 1)
 * the tokens are dispatched as they are. The router's and shared experts' gradients are then
 * Partial over tp: hp_ep_reduce_sequence_parallel_grads sums them. Call after the handle is
 * made and before hp_model_init_weights; not with expert FSDP. */
hp_status_t hp_ep_enable_sequence_parallel(hp_ep_t ep, hp_model_t m, hp_mesh_t tp_mesh);
/* After the step's backward (all micro-batches): all-reduces (SUM) over tp the local gradients
 * of the MoE modules' router and shared-expert parameters among params (their FSDP shards or
 * whole tensors); a no-op without sequence parallel. */
hp_status_t hp_ep_reduce_sequence_parallel_grads(hp_ep_t ep, hp_param_t *params, int n);
void hp_ep_destroy(hp_ep_t ep);
/* Whether p is a routed-expert parameter (sharded over ep). */
int hp_ep_is_expert_param(const hp_param_t *p);
/* Bytes of routed-expert parameters this rank holds (values only; 1/ep or 1/tp of them). */
size_t hp_ep_local_expert_bytes(hp_ep_t ep);

#ifdef __cplusplus
}
#endif
#endif
