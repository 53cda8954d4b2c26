/* TorchTitan's aux-loss-free load balancing of the MoE layers over any composition (its
 * build_optimizers_with_moe_load_balancing): before each optimizer step, the step's tokens per
 * expert of every MoE layer are summed over every rank that routed its own tokens (the loss
 * mesh: batch x cp; tp too under sequence parallel; pp gathers each stage's layers), halved for
 * blocks that activation checkpointing recomputed (the recompute counts again), then each
 * layer's expert_bias += coeff * sign(mean - c), centred (hp_moe_update_expert_bias). The
 * biases are state (not parameters): they join the checkpoint as "layers.N.moe.expert_bias". */
#ifndef HYPERPARALLEL_MOE_BALANCE_H
#define HYPERPARALLEL_MOE_BALANCE_H

#include "parallelize.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_moe_balancer *hp_moe_balancer_t;

/* After the composition (p's table final): *out NULL when the model has no MoE layer.
 * loss_comm: the communicator over the ranks whose tokens differ (the loss mesh). */
hp_status_t hp_moe_balancer_create(hp_parallel_t p, hp_comm_t loss_comm, hp_moe_balancer_t *out);
void hp_moe_balancer_destroy(hp_moe_balancer_t b);
/* The checkpoint's entries: p's table followed by one expert_bias per MoE layer of the model,
 * in layer order (f32, replicated; under pipelining another stage's layers are placeholders). */
hp_param_t *hp_moe_balancer_state(hp_moe_balancer_t b, int *n);
/* A metric of the step: "moe/aux_loss", "moe/layers.N/imbalance_max_over_mean",
 * ".../tokens_per_expert_max", ".../tokens_per_expert_min". */
typedef hp_status_t (*hp_moe_log_fn)(void *user, const char *tag, double value);
/* Collective over the composition: counts summed, biases updated, counters and the auxiliary
 * loss sums reset. log NULL: not a logging step (nothing reported). */
hp_status_t hp_moe_balancer_step(hp_moe_balancer_t b, hp_moe_log_fn log, void *user);

#ifdef __cplusplus
}
#endif
#endif
