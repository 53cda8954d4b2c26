/* Cross-entropy kernels over a column shard of the logits: the class (vocab) dim split across
 * ranks, as loss_parallel (tp.h) needs. The full-width kernels are in nn.h; a shard with
 * vocab_offset 0 and V_local = V is the full kernel. */
#ifndef HYPERPARALLEL_NN_LOSS_H
#define HYPERPARALLEL_NN_LOSS_H

#include <stdint.h>
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dlogits (N, V_local) (=) = (softmax - onehot) * dloss over this shard's columns
 * [vocab_offset, vocab_offset + V_local): softmax = exp(logits - lse) with lse (N) the
 * row's log-sum-exp over every shard; the onehot term only where the target falls in the
 * shard; 0 for ignored rows (HP_IGNORE_INDEX). Parallel over rows. */
void hp_cross_entropy_backward_shard(float *dlogits, const float *logits, const float *lse,
                                     const int32_t *targets, float dloss, int N, int V_local,
                                     int64_t vocab_offset);

#ifdef __cplusplus
}
#endif
#endif
