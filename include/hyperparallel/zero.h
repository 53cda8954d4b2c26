/* ZeroRedundancyOptimizer (ZeRO-1, docs/fsdp.md): optimizer state partitioned greedily over
 * the ranks of a communicator; each rank steps its own parameters with a local optimizer,
 * then every parameter is broadcast from its owner. Use it with DDP (full gradients on every
 * rank). The optimizer is the caller's, behind hp_zero_local_optim_t. */
#ifndef HYPERPARALLEL_ZERO_H
#define HYPERPARALLEL_ZERO_H

#include <stddef.h>
#include <stdint.h>
#include "comm.h"
#include "mesh.h"
#include "param.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The optimizer ZeRO runs on this rank's share, as calls plus a context. The train layer
 * supplies one (hp_optim_zero_local in optim.h); any optimizer over hp_param_t arrays fits.
 * create: an optimizer over params[n] (kept by pointer), *out its handle; ctx is used only
 * during hp_zero_create. step: one step at lr * lr_factor. state_bytes (optional, NULL = 0):
 * the optimizer state it holds. destroy: frees it. */
typedef struct hp_zero_local_optim {
    hp_status_t (*create)(void *ctx, hp_param_t *params, int n_params, void **out);
    hp_status_t (*step)(void *opt, double lr_factor);
    size_t (*state_bytes)(void *opt);
    void (*destroy)(void *opt);
    void *ctx;
} hp_zero_local_optim_t;

/* ZeroRedundancyOptimizer: `params` (replicated, identical on every rank of comm) partitioned
 * by PyTorch's greedy rule (sorted by numel descending, stable; each to the rank with the
 * smallest running total, ties to the lowest rank); the local optimizer `lo` over this
 * rank's share (none when the rank owns nothing). */
typedef struct hp_zero *hp_zero_t;
hp_status_t hp_zero_create(const hp_zero_local_optim_t *lo, hp_param_t *params, int n_params, hp_comm_t comm,
                           hp_zero_t *out);
void hp_zero_free(hp_zero_t z);
/* The partition rule alone: owner[i] for n params of the given numels over `world` ranks. */
void hp_zero_partition(const int64_t *numel, int n, int world, int *owner);
/* Local step on the owned params, then each param broadcast (async) from its owner; waits. */
hp_status_t hp_zero_step(hp_zero_t z, double lr_factor);
int hp_zero_owner(hp_zero_t z, int i);
/* ZeRO-1 with the caller's optimizer (the composition's step, hp_apply_zero): the partition
 * alone, and the table the optimizer is built on (hp_zero_optim_params): the entries this rank
 * owns, and for the others a placeholder (the name and global shape, no local elements,
 * Replicate on `mesh`, a mesh over comm's ranks), so every rank's optimizer lists every
 * parameter in the same order, steps only its share and holds only its share's state, and a
 * checkpoint saves each state from its owner. After the optimizer's step, hp_zero_sync
 * broadcasts every parameter from its owner. */
hp_status_t hp_zero_create_partition(hp_param_t *params, int n_params, hp_comm_t comm, hp_mesh_t mesh,
                                     hp_zero_t *out);
hp_param_t *hp_zero_optim_params(hp_zero_t z);
hp_status_t hp_zero_sync(hp_zero_t z);
size_t hp_zero_state_bytes(hp_zero_t z);

#ifdef __cplusplus
}
#endif
#endif
