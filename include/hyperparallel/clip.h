/* Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_ over DTensors): the
 * squares of the local shards, each parameter counted once over its mesh (a Replicate dim
 * counts on its local rank 0), summed over the communicators the placements span. The
 * gradient finalizer (parallelize.h) calls these for every layout. */
#ifndef HYPERPARALLEL_CLIP_H
#define HYPERPARALLEL_CLIP_H

#include "comm.h"
#include "param.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Global L2 norm of every gradient. Each rank sums the squares of its local shards, counting
 * a parameter replicated over a mesh dim only on local rank 0 of that dim (so the sum over
 * all ranks counts it once); the sum is then SUM-all-reduced over each of `comms` in turn
 * (for example the world, or the dp_shard, tp and pp communicators). n_comms == 0: local. */
hp_status_t hp_grad_norm(const hp_param_t *params, int n_params, const hp_comm_t *comms,
                         int n_comms, double *total_norm);
/* Computes the norm as above, then scales every gradient by min(1, max_norm / (norm + 1e-6))
 * as PyTorch. A non-finite norm leaves the gradients alone and returns HP_ERR_NUMERIC (with
 * *total_norm set) so the trainer can skip the step. */
hp_status_t hp_clip_grad_norm(hp_param_t *params, int n_params, double max_norm,
                              const hp_comm_t *comms, int n_comms, double *total_norm);
/* The scaling step alone (torch.nn.utils.clip_grads_with_norm_), for a norm computed over
 * another set of parameters (a pipeline counts a tied weight's two copies once). */
hp_status_t hp_clip_grads_with_norm(hp_param_t *params, int n_params, double max_norm, double total_norm);

#ifdef __cplusplus
}
#endif
#endif
