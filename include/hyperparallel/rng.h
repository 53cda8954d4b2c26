/* Counter-based RNG (Philox 4x32-10) keyed by (seed, stream name, global element index).
 * The value of element i of a stream depends only on (seed, name, i), so filling any shard
 * of a tensor gives exactly the values of that slice of the whole tensor (initialisation does
 * not depend on the layout). */
#ifndef HYPERPARALLEL_RNG_H
#define HYPERPARALLEL_RNG_H

#include <stdint.h>
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_rng_key {
    uint64_t seed;
    uint64_t stream;   /* 64-bit hash of the stream name (FNV-1a) */
} hp_rng_key_t;

hp_rng_key_t hp_rng_key(uint64_t seed, const char *stream_name);

/* Raw Philox4x32-10 block for a 128-bit counter; exposed for tests. */
void hp_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* Value of the stream at a global element index. */
float hp_rng_uniform_at(hp_rng_key_t key, uint64_t index);                 /* [0, 1) */
float hp_rng_normal_at(hp_rng_key_t key, uint64_t index, float mean, float std);
/* Normal truncated to [a, b] (absolute bounds, as torch.nn.init.trunc_normal_). */
float hp_rng_trunc_normal_at(hp_rng_key_t key, uint64_t index, float mean, float std, float a, float b);

typedef enum hp_rng_dist { HP_RNG_UNIFORM = 0, HP_RNG_NORMAL, HP_RNG_TRUNC_NORMAL } hp_rng_dist_t;
typedef struct hp_rng_spec {
    hp_rng_dist_t dist;
    float p0, p1;      /* uniform: low, high; normal: mean, std; trunc: mean, std */
    float a, b;        /* trunc normal bounds */
} hp_rng_spec_t;

/* Fills `t` (any strided view, f32/bf16/f16) as the slice at `global_offset` (ndim entries)
 * of a tensor of `global_shape`: element with global multi-index g gets the stream's value at
 * the row-major flat index of g in global_shape. global_offset NULL = zeros; global_shape
 * NULL = t's own shape. */
hp_status_t hp_rng_fill(hp_tensor_t *t, hp_rng_key_t key, const hp_rng_spec_t *spec,
                        const int64_t *global_shape, const int64_t *global_offset);

#ifdef __cplusplus
}
#endif
#endif
