/* DistributedDataParallel over the model (docs/fsdp.md); ZeRO-1 is zero.h.
 * DDP: parameters replicated (broadcast from rank 0 at creation); gradients are copied into
 * flat buckets (PyTorch's assignment: first bucket 1 MiB, then bucket_cap_mb, computed in
 * parameter order, bucket order reversed) and each bucket's all-reduce starts asynchronously
 * as soon as all of its gradients are ready during backward (after each unit's
 * backward_weight); buckets are launched in index order and waited at the end of backward. */
#ifndef HYPERPARALLEL_DDP_H
#define HYPERPARALLEL_DDP_H

#include <stddef.h>
#include "comm.h"
#include "model.h"
#include "param.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* torch.distributed._compute_bucket_assignment_by_size: tensors in the given order, grouped by
 * `keys` (dtype) separately; a bucket closes as soon as its bytes reach the current limit (the
 * tensor that crosses it stays); limits are consumed per key: limits[0] for the first bucket,
 * then limits[1], ..., the last one repeatedly. Result buckets are sorted by their smallest
 * tensor index. Writes bucket_of[i] (bucket of tensor i) and, when non-NULL, bucket_limit[b]
 * (the limit bucket b was built under, capacity n); returns the number of buckets. */
int hp_ddp_bucket_assignment(const size_t *bytes, const int *keys, int n, const size_t *limits, int n_limits,
                             int *bucket_of, size_t *bucket_limit);

typedef struct hp_ddp_options {
    size_t first_bucket_bytes;   /* 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES) */
    size_t bucket_cap_bytes;     /* bucket_cap_mb 25 */
    /* 1: PyTorch's pre-division by the world size (gradient average); 0: SUM (the trainer's
     * globally normalised loss). */
    int average;
    int overlap;                 /* 1: async all-reduce per bucket during backward; 0: blocking */
} hp_ddp_options_t;
hp_ddp_options_t hp_ddp_default_options(void);

typedef struct hp_ddp *hp_ddp_t;

/* Wraps `model` (full-size replicated params) over `comm`: broadcasts the weights from rank 0
 * and installs the hooks. Errors: a model already wrapped (fully_shard or DDP). */
hp_status_t hp_ddp_create(hp_model_t model, hp_comm_t comm, const hp_ddp_options_t *opts, hp_ddp_t *out);
void hp_ddp_destroy(hp_ddp_t d);
/* no_sync(): 0 = backwards accumulate locally without communication until one runs with 1. */
void hp_ddp_set_requires_gradient_sync(hp_ddp_t d, int sync);
int hp_ddp_num_buckets(hp_ddp_t d);
/* Params of bucket b (model param indices) in bucket order; returns the count. */
int hp_ddp_bucket_params(hp_ddp_t d, int b, int *indices, int cap);
double hp_ddp_comm_wait_seconds(hp_ddp_t d);

#ifdef __cplusplus
}
#endif
#endif
