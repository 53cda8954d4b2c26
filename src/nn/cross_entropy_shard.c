/* Cross-entropy backward over a column shard of the logits (nn_loss.h): the kernel that
 * loss_parallel's backward runs, the same arithmetic as hp_cross_entropy_backward (nn.h)
 * restricted to the shard's columns. */
#include <string.h>

#include "hyperparallel/nn_loss.h"
#include "nn/nn-simd.h"

void hp_cross_entropy_backward_shard(float *dlogits, const float *logits, const float *lse,
                                     const int32_t *targets, float dloss, int N, int V_local,
                                     int64_t vocab_offset) {
    const hp_nn_simd_t *k = hp_nn_simd();   // the exps vectorised explicitly (nn-simd.h)
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *d = dlogits + (size_t)n * V_local;        // local (N, V/tp)
        const float *z = logits + (size_t)n * V_local;   // local (N, V/tp)
        int64_t t = targets[n];
        if (t == HP_IGNORE_INDEX) {
            memset(d, 0, sizeof(float) * (size_t)V_local);
            continue;
        }
        float l = lse[n];
        k->exp_scale(d, z, l, dloss, V_local);
        if (t >= vocab_offset && t < vocab_offset + V_local) d[t - vocab_offset] -= dloss;
    }
}
