/* loss_parallel: cross-entropy over logits sharded on the class (vocab) dim, as PyTorch's
 * torch.distributed.tensor.parallel.loss_parallel: log_softmax = x - max (all-reduce MAX)
 * - log(sum exp) (all-reduce SUM), nll gathers the target logit from the owning rank
 * (all-reduce SUM); the backward (softmax - onehot) * dloss is local: the nn shard kernel
 * hp_cross_entropy_backward_shard. Sums of exp are taken in double as the single-rank kernel
 * (hp_cross_entropy_forward). */
#include <math.h>
#include "hyperparallel/tp.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/backend.h"
#include "hyperparallel/nn_loss.h"
#include "nn/nn-math.h"

hp_status_t hp_loss_parallel_forward(double *sum, double *losses, float *lse, const float *logits,
                                     const int32_t *targets, int N, int V_local, int64_t vocab_offset,
                                     hp_comm_t comm, int64_t *n_valid) {
    if (!sum || !losses || !lse || !logits || !targets || N < 0 || V_local <= 0 || !comm)
        return hp_error(HP_ERR_INVALID_ARG, "hp_loss_parallel_forward: NULL buffer or bad sizes (N %d, "
                        "V_local %d); hint: logits (N, V_local), targets (N), comm the TP communicator",
                        N, V_local);
    // Scratch without allocation: the row max lives in lse (N floats), the sums of exp in
    // the upper half of `losses` (N doubles hold 2N floats); lse = max + log(sum) in double
    // overwrites `losses` in ascending order, which only clobbers sums already read.
    float *mx = lse;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V_local;
        float m = -INFINITY;
        for (int v = 0; v < V_local; v++) m = z[v] > m ? z[v] : m;
        mx[n] = m;
    }
    HP_TRY(hp_all_reduce(mx, mx, (size_t)N, HP_F32, HP_MAX, comm, NULL));
    // sums of exp in double per rank (index order), all-reduced in f32 (the logits dtype, as PyTorch)
    float *se = (float *)losses + N;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V_local;
        double s = 0.0;
        for (int v = 0; v < V_local; v++) s += (double)hp_nn_expf(z[v] - mx[n]);
        se[n] = (float)s;
    }
    HP_TRY(hp_all_reduce(se, se, (size_t)N, HP_F32, HP_SUM, comm, NULL));
    for (int n = 0; n < N; n++) {
        double l = (double)mx[n] + log((double)se[n]);
        losses[n] = l;
    }
    // target logit: the owning rank contributes it, the others 0 (masked nll); summed
    float *tl = lse;
    for (int n = 0; n < N; n++) {
        int64_t t = targets[n];
        tl[n] = (t != HP_IGNORE_INDEX && t >= vocab_offset && t < vocab_offset + V_local)
                    ? logits[(size_t)n * V_local + (size_t)(t - vocab_offset)] : 0.0f;
    }
    HP_TRY(hp_all_reduce(tl, tl, (size_t)N, HP_F32, HP_SUM, comm, NULL));
    double s = 0.0;   // fixed order
    int64_t cnt = 0;
    for (int n = 0; n < N; n++) {
        double l = losses[n];
        float t = tl[n];
        lse[n] = (float)l;
        if (targets[n] == HP_IGNORE_INDEX) {
            losses[n] = 0.0;
            continue;
        }
        losses[n] = l - (double)t;
        s += losses[n];
        cnt++;
    }
    *sum = s;
    if (n_valid) *n_valid = cnt;
    return HP_OK;
}

void hp_loss_parallel_backward(float *dlogits, const float *logits, const float *lse, const int32_t *targets,
                               float dloss, int N, int V_local, int64_t vocab_offset) {
    const hp_backend_t *be = hp_backend_default();
    be->cross_entropy_backward(be->ctx, dlogits, logits, lse, targets, dloss, N, V_local, vocab_offset);
}
