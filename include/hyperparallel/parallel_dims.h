/* hp_parallel_dims: the parallel degrees of a run and its device meshes, with TorchTitan's
 * rules (torchtitan/distributed/parallel_dims.py). Ranks are laid out row-major over
 * (pp, dp_replicate, dp_shard, cp, tp), tp fastest:
 *     rank = (((pp*R + r)*S + s)*C + c)*T + t.
 * Validation and coordinates are pure arithmetic (no communication); hp_parallel_dims_
 * build_mesh creates the meshes. A parallelism this build does not implement is refused by
 * hp_parallel_dims_check_implemented, which the trainer calls before building anything. */
#ifndef HYPERPARALLEL_PARALLEL_DIMS_H
#define HYPERPARALLEL_PARALLEL_DIMS_H

#include <stdbool.h>
#include <stdint.h>
#include "mesh.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_parallel_dims {
    int dp_replicate;
    int dp_shard;   /* resolved: never -1 after hp_parallel_dims_init */
    int cp;
    int tp;
    int pp;
    int ep;
    int etp;
    int world_size;
} hp_parallel_dims_t;

/* Validates and resolves (dp_shard = -1 takes world / (dp_replicate*cp*tp*pp)). Errors name
 * the config key: every degree >= 1 (dp_shard may be -1), the product equals world_size,
 * ep divides dp_shard*cp*tp, etp is 1 or tp, and with etp = tp > 1 ep divides dp_shard*cp. */
hp_status_t hp_parallel_dims_init(hp_parallel_dims_t *pd, int dp_replicate, int dp_shard, int cp, int tp, int pp,
                                  int ep, int etp, int world_size);

/* Derived sizes. */
static inline int hp_parallel_dims_dp(const hp_parallel_dims_t *p) { return p->dp_replicate * p->dp_shard; }
static inline int hp_parallel_dims_loss(const hp_parallel_dims_t *p) { return hp_parallel_dims_dp(p) * p->cp; }
static inline int hp_parallel_dims_fsdp(const hp_parallel_dims_t *p) { return p->dp_shard * p->cp; }
/* Expert-FSDP degree of the sparse mesh: dp_shard*cp*tp/(ep*etp) (etp 1: dp_shard*cp*tp/ep;
 * ETP, etp = tp: dp_shard*cp/ep). */
static inline int hp_parallel_dims_efsdp(const hp_parallel_dims_t *p) {
    return p->dp_shard * p->cp * p->tp / (p->ep * p->etp);
}
/* Ranks that see the same data and divide throughput (TorchTitan's tps divisor cp*tp*pp). */
static inline int hp_parallel_dims_non_dp(const hp_parallel_dims_t *p) { return p->cp * p->tp * p->pp; }

/* Dims of the world mesh, in order. */
enum { HP_PD_PP = 0, HP_PD_DP_REPLICATE, HP_PD_DP_SHARD, HP_PD_CP, HP_PD_TP, HP_PD_NDIM };
extern const char *const hp_parallel_dims_names[HP_PD_NDIM];   /* "pp", "dp_replicate", ... */

/* Coordinate of a rank on (pp, dp_replicate, dp_shard, cp, tp). */
void hp_parallel_dims_coords(const hp_parallel_dims_t *pd, int rank, int coords[HP_PD_NDIM]);
/* Data-loading rank: the coordinate on batch = (dp_replicate, dp_shard) flattened. */
int hp_parallel_dims_batch_rank(const hp_parallel_dims_t *pd, int rank);
/* Metrics rank: 0, or under pp the first rank of the last stage, (world/pp)*(pp-1). */
int hp_parallel_dims_metrics_rank(const hp_parallel_dims_t *pd);
/* "pp=1 dp_replicate=1 dp_shard=4 cp=1 tp=1 ep=1 (world 4)". */
const char *hp_parallel_dims_str(const hp_parallel_dims_t *pd, char *buf, size_t n);

/* Parallelisms; a bit set of the ones a build implements. */
typedef enum hp_parallelism {
    HP_PAR_DP_REPLICATE = 1 << 0,   /* DDP / HSDP replicate dim */
    HP_PAR_DP_SHARD = 1 << 1,       /* FSDP */
    HP_PAR_TP = 1 << 2,
    HP_PAR_PP = 1 << 3,
    HP_PAR_CP = 1 << 4,
    HP_PAR_EP = 1 << 5,
} hp_parallelism_t;
/* Refuses (HP_ERR_UNSUPPORTED) any degree > 1 whose bit is not in `implemented`, naming the
 * config key, the value and the hint to set it to 1. The trainer passes the set its build
 * implements; nothing is silently ignored. */
hp_status_t hp_parallel_dims_check_implemented(const hp_parallel_dims_t *pd, unsigned implemented);

/* The meshes of a run. `world` has all five dims (pp, dp_replicate, dp_shard, cp, tp), size-1
 * dims included (they cost one trivial communicator each and keep every name valid, so the
 * trainer never branches on whether a dim exists). The others are flattened 1-D meshes over
 * the named world dims (TorchTitan's names):
 *   batch = dp_replicate x dp_shard   data loading and the global token count
 *   loss  = dp_replicate x dp_shard x cp   loss all-reduce, finite-flag, MoE counts
 *   fsdp  = dp_shard x cp             FSDP shards over the cp ranks too
 * `sparse` (pp, dp_replicate, efsdp, ep) exists only when ep > 1 (NULL otherwise): ep borrows
 * ranks from dp_shard x cp x tp; under ETP (etp = tp > 1) it is (pp, dp_replicate, efsdp, ep,
 * etp), (efsdp, ep) over dp_shard x cp and etp the ranks of tp. */
typedef struct hp_parallel_meshes {
    hp_mesh_t world;
    hp_mesh_t batch;
    hp_mesh_t loss;
    hp_mesh_t fsdp;
    hp_mesh_t sparse;
} hp_parallel_meshes_t;

/* Collective over `world` (whose size must equal pd->world_size). */
hp_status_t hp_parallel_dims_build_mesh(const hp_parallel_dims_t *pd, hp_comm_t world, hp_parallel_meshes_t *out);
void hp_parallel_meshes_destroy(hp_parallel_meshes_t *m);

#ifdef __cplusplus
}
#endif
#endif
