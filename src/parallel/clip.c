/* Global gradient norm and clipping over DTensor gradients (torch.nn.utils.clip_grad_norm_):
 * a fixed-order chunked f64 sum of the local squares, then an f32 SUM all-reduce over each
 * communicator the placements span. */
#include "hyperparallel/clip.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "hyperparallel/mesh.h"
#include "hyperparallel/dtensor.h"

/* 1 when this rank holds the counted copy of a parameter: local rank 0 on every mesh dim
 * over which it is replicated. */
static int counts_here(const hp_dtensor_t *t) {
    if (!t->mesh) return 1;
    for (int d = 0; d < t->mesh_ndim; d++)
        if (t->placements[d].kind == HP_REPLICATE && hp_mesh_get_local_rank(t->mesh, d) != 0) return 0;
    return 1;
}

/* Elements [glo, ghi) of the concatenation of the gradients that count on this rank
 * (counted[i]); walks the parameters with a running offset (no allocation). */
static double sum_squares_range(const hp_param_t *params, int n, const unsigned char *counted, int64_t glo,
                                int64_t ghi) {
    double s = 0;
    int64_t off = 0;
    for (int i = 0; i < n && off < ghi; i++) {
        if (!counted[i]) continue;
        int64_t len = hp_tensor_numel(&params[i].grad.local);
        int64_t lo = glo > off ? glo - off : 0, hi = (ghi < off + len ? ghi : off + len) - off;
        const float *g = params[i].grad.local.data;
        // eight independent double sums (one chain was latency-bound, 4 cycles an element),
        // combined in a fixed tree: the order depends only on the chunk bounds, not on threads
        double a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t j = lo;
        for (; j + 8 <= hi; j += 8)
            for (int k = 0; k < 8; k++) a[k] += (double)g[j + k] * g[j + k];
        for (; j < hi; j++) a[0] += (double)g[j] * g[j];
        s += ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        off += len;
    }
    return s;
}

/* Squares are summed in 64 fixed chunks of the concatenated gradients and the chunk sums are
 * added in order: the result does not depend on the thread count (deterministic). */
#define NORM_CHUNKS 64
#define NORM_MAX_PARAMS 65536

hp_status_t hp_grad_norm(const hp_param_t *params, int n_params, const hp_comm_t *comms,
                         int n_comms, double *total_norm) {
    static _Thread_local unsigned char counted[NORM_MAX_PARAMS];
    if (n_params > NORM_MAX_PARAMS)
        return hp_error(HP_ERR_UNSUPPORTED, "grad norm: %d parameters; at most %d supported", n_params,
                        NORM_MAX_PARAMS);
    int64_t total = 0;
    for (int i = 0; i < n_params; i++) {
        const hp_dtensor_t *g = &params[i].grad;
        if (g->local.dtype != HP_F32 || !hp_tensor_is_contiguous(&g->local))
            return hp_error(HP_ERR_INVALID_ARG, "grad norm: gradient of '%s' must be contiguous f32",
                            params[i].name);
        for (int d = 0; g->mesh && d < g->mesh_ndim; d++)
            if (g->placements[d].kind == HP_PARTIAL)
                return hp_error(HP_ERR_STATE, "grad norm: gradient of '%s' is still Partial on mesh "
                                "dim %d; reduce gradients before clipping", params[i].name, d);
        counted[i] = (unsigned char)(counts_here(g) && !params[i].frozen);   // requires_grad = False: no grad
        if (counted[i]) total += hp_tensor_numel(&g->local);
    }
    double part[NORM_CHUNKS];
    /* `counted` is per calling thread; the workers must read the caller's copy */
    const unsigned char *cnt = counted;
#pragma omp parallel for schedule(static) if (total > 65536)
    for (int c = 0; c < NORM_CHUNKS; c++)
        part[c] = sum_squares_range(params, n_params, cnt, total * c / NORM_CHUNKS,
                                    total * (c + 1) / NORM_CHUNKS);
    double ss = 0;
    for (int c = 0; c < NORM_CHUNKS; c++) ss += part[c];
    /* The comm layer has no f64, so the cross-rank sum is f32 (PyTorch also reduces the norm
     * in the gradients' f32); the local sum above is f64. */
    for (int k = 0; k < n_comms; k++) {
        if (!comms[k]) continue;
        float f = (float)ss;
        HP_TRY(hp_all_reduce(&f, &f, 1, HP_F32, HP_SUM, comms[k], NULL));
        ss = f;
    }
    *total_norm = sqrt(ss);
    return HP_OK;
}

/* g[lo, hi) *= coef for the slice [glo, ghi) of the concatenated gradients */
static void scale_range(hp_param_t *params, int n, float coef, int64_t glo, int64_t ghi) {
    int64_t off = 0;
    for (int i = 0; i < n && off < ghi; i++) {
        int64_t len = hp_tensor_numel(&params[i].grad.local);
        int64_t lo = glo > off ? glo - off : 0, hi = (ghi < off + len ? ghi : off + len) - off;
        float *g = params[i].grad.local.data;
        for (int64_t j = lo; j < hi; j++) g[j] *= coef;
        off += len;
    }
}

hp_status_t hp_clip_grads_with_norm(hp_param_t *params, int n_params, double max_norm, double total_norm) {
    if (!(max_norm > 0))
        return hp_error(HP_ERR_INVALID_ARG, "clip_grad_norm: max_norm %g must be > 0", max_norm);
    if (!isfinite(total_norm))
        return hp_error(HP_ERR_NUMERIC, "clip_grad_norm: total gradient norm is %g; gradients left "
                        "unscaled (skip this step or lower the learning rate)", total_norm);
    double coef = max_norm / (total_norm + 1e-6);
    if (coef >= 1.0) return HP_OK;   /* PyTorch multiplies by the clamped 1.0: a no-op */
    const float fc = (float)coef;
    int64_t total = 0;
    for (int i = 0; i < n_params; i++) total += hp_tensor_numel(&params[i].grad.local);
#pragma omp parallel if (total > 65536)
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        scale_range(params, n_params, fc, total * t / nt, total * (t + 1) / nt);
    }
    return HP_OK;
}

hp_status_t hp_clip_grad_norm(hp_param_t *params, int n_params, double max_norm,
                              const hp_comm_t *comms, int n_comms, double *total_norm) {
    if (!(max_norm > 0))
        return hp_error(HP_ERR_INVALID_ARG, "clip_grad_norm: max_norm %g must be > 0", max_norm);
    HP_TRY(hp_grad_norm(params, n_params, comms, n_comms, total_norm));
    return hp_clip_grads_with_norm(params, n_params, max_norm, *total_norm);
}

