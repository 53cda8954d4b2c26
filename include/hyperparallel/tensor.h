/* hp_tensor_t: a strided view descriptor (dtype, ndim <= 8, shape and strides outermost-first
 * in elements, PyTorch order) over a buffer it does not own. Views share the buffer. */
#ifndef HYPERPARALLEL_TENSOR_H
#define HYPERPARALLEL_TENSOR_H

#include <stdint.h>
#include "dtype.h"
#include "status.h"
#include "arena.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_MAX_DIMS 8

/* Where a tensor's bytes live. Only host memory exists today; a CUDA backend adds its
 * devices here, and kernels reached through hp_backend_t (backend.h) take tensors on theirs. */
typedef enum hp_device { HP_DEVICE_HOST = 0 } hp_device_t;

typedef struct hp_tensor {
    hp_dtype_t dtype;
    int ndim;                       /* 0 = scalar (one element) */
    int64_t shape[HP_MAX_DIMS];
    int64_t stride[HP_MAX_DIMS];    /* in elements */
    void *data;                     /* points at element [0,...,0] */
    hp_device_t device;             /* HP_DEVICE_HOST (zero-initialised descriptors are host) */
} hp_tensor_t;

/* A contiguous (rows, cols) f32 host view over data (kernels' 2-D operands). */
static inline void hp_tensor_view2(hp_tensor_t *t, float *data, int64_t rows, int64_t cols) {
    *t = (hp_tensor_t){0};
    t->dtype = HP_F32;
    t->ndim = 2;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->stride[0] = cols;
    t->stride[1] = 1;
    t->data = data;
}

/* Rows of a (..., C) tensor: the product of every dim but the last. */
static inline int64_t hp_tensor_rows(const hp_tensor_t *t) {
    int64_t r = 1;
    for (int i = 0; i < t->ndim - 1; i++) r *= t->shape[i];
    return r;
}

/* Contiguous descriptor over `data` (may be NULL when numel == 0). */
hp_status_t hp_tensor_init(hp_tensor_t *t, hp_dtype_t dt, int ndim, const int64_t *shape, void *data);
/* Allocates a contiguous zeroed tensor from an arena. */
hp_status_t hp_tensor_alloc(hp_tensor_t *t, hp_arena_t *arena, hp_dtype_t dt, int ndim, const int64_t *shape);
/* Heap-owned contiguous zeroed tensor (setup code and tests, not the step loop);
 * free with hp_tensor_free_data. */
hp_status_t hp_tensor_malloc(hp_tensor_t *t, hp_dtype_t dt, int ndim, const int64_t *shape);
void hp_tensor_free_data(hp_tensor_t *t);

int64_t hp_tensor_numel(const hp_tensor_t *t);
size_t hp_tensor_nbytes(const hp_tensor_t *t);   /* numel * element size */
int hp_tensor_is_contiguous(const hp_tensor_t *t);
int hp_tensor_same_shape(const hp_tensor_t *a, const hp_tensor_t *b);
/* Pointer to the element at a multi-index (ndim entries). */
void *hp_tensor_ptr(const hp_tensor_t *t, const int64_t *index);

/* Views (share data). dim may be negative (counts from the end). */
hp_status_t hp_tensor_narrow(hp_tensor_t *out, const hp_tensor_t *t, int dim, int64_t start, int64_t length);
hp_status_t hp_tensor_select(hp_tensor_t *out, const hp_tensor_t *t, int dim, int64_t index);
hp_status_t hp_tensor_transpose(hp_tensor_t *out, const hp_tensor_t *t, int dim0, int dim1);
/* Reshape of a contiguous tensor; one entry of shape may be -1. */
hp_status_t hp_tensor_reshape(hp_tensor_t *out, const hp_tensor_t *t, int ndim, const int64_t *shape);

/* Strided copy between same-shape tensors, converting dtype if they differ. */
hp_status_t hp_tensor_copy(hp_tensor_t *dst, const hp_tensor_t *src);
/* Sets every element to `value` (converted to the tensor's dtype). */
hp_status_t hp_tensor_fill(hp_tensor_t *t, double value);
/* Reads element i of the row-major flattening as double (tests and debugging). A double
 * holds integers exactly only up to 2^53: for I64 use the _i64 pair below. */
double hp_tensor_get_flat(const hp_tensor_t *t, int64_t i);
void hp_tensor_set_flat(hp_tensor_t *t, int64_t i, double v);
/* Element i as int64_t, exact for I64, I32 and U8 (float dtypes: truncated, non-finite -> 0). */
int64_t hp_tensor_get_flat_i64(const hp_tensor_t *t, int64_t i);
void hp_tensor_set_flat_i64(hp_tensor_t *t, int64_t i, int64_t v);
/* Number of NaN / +-inf elements of a float tensor (0 for integer dtypes); *first (may be
 * NULL) gets the flat index of the first one, or -1. */
int64_t hp_tensor_count_nonfinite(const hp_tensor_t *t, int64_t *first);
/* Max |a-b| over all elements of same-shape tensors; also whether all are within
 * atol + rtol*|b|. Returns 1 if close. */
int hp_tensor_allclose(const hp_tensor_t *a, const hp_tensor_t *b, double rtol, double atol, double *max_abs_diff);
/* "(3, 4) f32" into buf. */
const char *hp_tensor_shape_str(const hp_tensor_t *t, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
