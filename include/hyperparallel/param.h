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
    /* PyTorch's requires_grad = False (LoRA's frozen base, docs/finetune.md "LoRA"): the
     * optimizer keeps no state for it and never changes it, the norm for clipping skips it,
     * and modules skip its weight gradient (grad stays zero). */
    int frozen;
} hp_param_t;

#ifdef __cplusplus
}
#endif
#endif
