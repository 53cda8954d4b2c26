/* hp_dtensor: a tensor laid out over a device mesh by one placement per mesh dim
 * (Shard(d) / Replicate / Partial(op)), with torch.chunk shard math, distribute_tensor,
 * from_local, full_tensor and redistribute as PyTorch's torch.distributed.tensor. */
#ifndef HYPERPARALLEL_DTENSOR_H
#define HYPERPARALLEL_DTENSOR_H

#include <stdint.h>
#include "tensor.h"
#include "mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_placement_kind {
    HP_REPLICATE = 0,
    HP_SHARD,
    HP_PARTIAL,
    HP_STRIDED_SHARD    /* _StridedShard(dim, split_factor): FSDP2 + TP layout */
} hp_placement_kind_t;

typedef struct hp_placement {
    hp_placement_kind_t kind;
    int dim;              /* Shard / StridedShard: tensor dim (normalised >= 0) */
    hp_redop_t reduce_op; /* Partial: HP_SUM, HP_AVG, HP_PROD, HP_MAX, HP_MIN */
    int split_factor;     /* StridedShard */
} hp_placement_t;

static inline hp_placement_t hp_shard(int dim) { hp_placement_t p = {HP_SHARD, dim, HP_SUM, 1}; return p; }
static inline hp_placement_t hp_replicate(void) { hp_placement_t p = {HP_REPLICATE, 0, HP_SUM, 1}; return p; }
static inline hp_placement_t hp_partial(hp_redop_t op) { hp_placement_t p = {HP_PARTIAL, 0, op, 1}; return p; }

/* A DTensor descriptor. `local` is this rank's piece; its shape is the local shape.
 * mesh == NULL means not distributed: mesh_ndim 0, global shape == local shape. */
typedef struct hp_dtensor {
    hp_tensor_t local;
    hp_mesh_t mesh;
    int mesh_ndim;
    hp_placement_t placements[HP_MESH_MAX_DIMS];
    int64_t global_shape[HP_MAX_DIMS];      /* local.ndim entries */
} hp_dtensor_t;

#ifdef __cplusplus
}
#endif
#endif
