/* A named parameter: (fully qualified name, DTensor value, DTensor gradient). Optimizers,
 * gradient clipping and checkpoints see only these pairs, never a parallelism's internals
 * (docs/architecture.md, rules every layer keeps). Names follow
 * HF / TorchTitan ("layers.3.attention.wq.weight"). */
#ifndef HYPERPARALLEL_PARAM_H
#define HYPERPARALLEL_PARAM_H

#include "dtensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_PARAM_NAME_MAX 96

typedef struct hp_param {
    char name[HP_PARAM_NAME_MAX];
    hp_dtensor_t value;   /* f32 master weights (local shard) */
    hp_dtensor_t grad;    /* f32, same layout as value; backward accumulates (+=) */
} hp_param_t;

#ifdef __cplusplus
}
#endif
#endif
