/* hp_tensor_t descriptors: contiguous creation, views, strided copy and fill. */
#include "hyperparallel/tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static hp_status_t check_shape(int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > HP_MAX_DIMS)
        return hp_error(HP_ERR_INVALID_ARG, "tensor ndim %d out of range; expected 0..%d", ndim, HP_MAX_DIMS);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return hp_error(HP_ERR_INVALID_ARG, "tensor shape[%d] = %lld is negative; sizes must be >= 0", i,
                            (long long)shape[i]);
    return HP_OK;
}

static void set_contiguous(hp_tensor_t *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}

hp_status_t hp_tensor_init(hp_tensor_t *t, hp_dtype_t dt, int ndim, const int64_t *shape, void *data) {
    HP_TRY(check_shape(ndim, shape));
    if ((unsigned)dt >= HP_DTYPE_COUNT) return hp_error(HP_ERR_INVALID_ARG, "tensor dtype %d is not a valid hp_dtype_t", (int)dt);
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    set_contiguous(t);
    t->data = data;
    return HP_OK;
}

hp_status_t hp_tensor_alloc(hp_tensor_t *t, hp_arena_t *arena, hp_dtype_t dt, int ndim, const int64_t *shape) {
    HP_TRY(hp_tensor_init(t, dt, ndim, shape, NULL));
    size_t bytes = hp_tensor_nbytes(t);
    t->data = hp_arena_alloc(arena, bytes);
    if (!t->data) return HP_ERR_OOM;
    return HP_OK;
}

hp_status_t hp_tensor_malloc(hp_tensor_t *t, hp_dtype_t dt, int ndim, const int64_t *shape) {
    HP_TRY(hp_tensor_init(t, dt, ndim, shape, NULL));
    size_t bytes = hp_tensor_nbytes(t);
    t->data = hp_aligned_alloc(bytes ? bytes : 64);
    if (!t->data) return HP_ERR_OOM;
    memset(t->data, 0, bytes);
    return HP_OK;
}

void hp_tensor_free_data(hp_tensor_t *t) {
    hp_free_aligned(t->data);
    t->data = NULL;
}

int64_t hp_tensor_numel(const hp_tensor_t *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t hp_tensor_nbytes(const hp_tensor_t *t) { return (size_t)hp_tensor_numel(t) * hp_dtype_size(t->dtype); }

int hp_tensor_is_contiguous(const hp_tensor_t *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}

int hp_tensor_same_shape(const hp_tensor_t *a, const hp_tensor_t *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

void *hp_tensor_ptr(const hp_tensor_t *t, const int64_t *index) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += index[i] * t->stride[i];
    return (char *)t->data + off * (int64_t)hp_dtype_size(t->dtype);
}

static hp_status_t norm_dim(const hp_tensor_t *t, int *dim, const char *what) {
    int d = *dim < 0 ? *dim + t->ndim : *dim;
    if (d < 0 || d >= t->ndim)
        return hp_error(HP_ERR_INVALID_ARG, "%s: dim %d out of range for a %d-d tensor; expected %d..%d", what, *dim,
                        t->ndim, -t->ndim, t->ndim - 1);
    *dim = d;
    return HP_OK;
}

hp_status_t hp_tensor_narrow(hp_tensor_t *out, const hp_tensor_t *t, int dim, int64_t start, int64_t length) {
    HP_TRY(norm_dim(t, &dim, "narrow"));
    if (start < 0 || length < 0 || start + length > t->shape[dim])
        return hp_error(HP_ERR_INVALID_ARG, "narrow: [%lld, %lld) is outside dim %d of size %lld", (long long)start,
                        (long long)(start + length), dim, (long long)t->shape[dim]);
    hp_tensor_t r = *t;
    if (length > 0 && start > 0) r.data = (char *)t->data + start * t->stride[dim] * (int64_t)hp_dtype_size(t->dtype);
    r.shape[dim] = length;
    *out = r;
    return HP_OK;
}

hp_status_t hp_tensor_select(hp_tensor_t *out, const hp_tensor_t *t, int dim, int64_t index) {
    HP_TRY(norm_dim(t, &dim, "select"));
    if (index < 0) index += t->shape[dim];
    if (index < 0 || index >= t->shape[dim])
        return hp_error(HP_ERR_INVALID_ARG, "select: index %lld out of range for dim %d of size %lld", (long long)index,
                        dim, (long long)t->shape[dim]);
    hp_tensor_t r = *t;
    r.data = (char *)t->data + index * t->stride[dim] * (int64_t)hp_dtype_size(t->dtype);
    for (int i = dim; i < t->ndim - 1; i++) {
        r.shape[i] = t->shape[i + 1];
        r.stride[i] = t->stride[i + 1];
    }
    r.ndim = t->ndim - 1;
    r.shape[r.ndim] = 0;
    r.stride[r.ndim] = 0;
    *out = r;
    return HP_OK;
}

hp_status_t hp_tensor_transpose(hp_tensor_t *out, const hp_tensor_t *t, int dim0, int dim1) {
    HP_TRY(norm_dim(t, &dim0, "transpose"));
    HP_TRY(norm_dim(t, &dim1, "transpose"));
    hp_tensor_t r = *t;
    r.shape[dim0] = t->shape[dim1];
    r.shape[dim1] = t->shape[dim0];
    r.stride[dim0] = t->stride[dim1];
    r.stride[dim1] = t->stride[dim0];
    *out = r;
    return HP_OK;
}

hp_status_t hp_tensor_reshape(hp_tensor_t *out, const hp_tensor_t *t, int ndim, const int64_t *shape) {
    if (!hp_tensor_is_contiguous(t))
        return hp_error(HP_ERR_INVALID_ARG, "reshape: the source is not contiguous; copy it first (hp_tensor_copy)");
    if (ndim < 0 || ndim > HP_MAX_DIMS)
        return hp_error(HP_ERR_INVALID_ARG, "reshape: ndim %d out of range 0..%d", ndim, HP_MAX_DIMS);
    int64_t numel = hp_tensor_numel(t), known = 1;
    int infer = -1;
    int64_t s[HP_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) return hp_error(HP_ERR_INVALID_ARG, "reshape: only one dimension can be -1");
            infer = i;
        } else if (shape[i] < 0) {
            return hp_error(HP_ERR_INVALID_ARG, "reshape: invalid size %lld at dim %d", (long long)shape[i], i);
        } else {
            known *= shape[i];
        }
    }
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            return hp_error(HP_ERR_INVALID_ARG, "reshape: cannot infer dim %d for %lld elements", infer, (long long)numel);
        s[infer] = numel / known;
        known *= s[infer];
    }
    if (known != numel)
        return hp_error(HP_ERR_INVALID_ARG, "reshape: shape has %lld elements but the tensor has %lld", (long long)known,
                        (long long)numel);
    void *data = t->data;
    HP_TRY(hp_tensor_init(out, t->dtype, ndim, s, data));
    return HP_OK;
}

/* Iterates over every element of a shape in row-major order calling fn with the byte
 * offsets into two tensors. Rows of the innermost dim are handed over whole. */
typedef void (*row_fn)(char *d, int64_t dstride, const char *s, int64_t sstride, int64_t n, void *ctx);

static void for_each_row(const hp_tensor_t *dst, const hp_tensor_t *src, row_fn fn, void *ctx) {
    int nd = dst->ndim;
    int64_t numel = hp_tensor_numel(dst);
    if (numel == 0) return;
    size_t des = hp_dtype_size(dst->dtype), ses = src ? hp_dtype_size(src->dtype) : 0;
    if (nd == 0) {
        fn(dst->data, 0, src ? src->data : NULL, 0, 1, ctx);
        return;
    }
    int64_t inner = dst->shape[nd - 1];
    int64_t rows = numel / inner;
    int64_t idx[HP_MAX_DIMS] = {0};
    for (int64_t r = 0; r < rows; r++) {
        int64_t doff = 0, soff = 0;
        for (int i = 0; i < nd - 1; i++) {
            doff += idx[i] * dst->stride[i];
            if (src) soff += idx[i] * src->stride[i];
        }
        fn((char *)dst->data + doff * (int64_t)des, dst->stride[nd - 1],
           src ? (const char *)src->data + soff * (int64_t)ses : NULL, src ? src->stride[nd - 1] : 0, inner, ctx);
        for (int i = nd - 2; i >= 0; i--) {
            if (++idx[i] < dst->shape[i]) break;
            idx[i] = 0;
        }
    }
}

typedef struct { hp_dtype_t ddt, sdt; } copy_ctx;

static void copy_row(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, void *vctx) {
    copy_ctx *c = vctx;
    size_t de = hp_dtype_size(c->ddt), se = hp_dtype_size(c->sdt);
    if (ds == 1 && ss == 1) {
        hp_convert(d, c->ddt, s, c->sdt, (size_t)n);
        return;
    }
    for (int64_t i = 0; i < n; i++) hp_convert(d + i * ds * (int64_t)de, c->ddt, s + i * ss * (int64_t)se, c->sdt, 1);
}

hp_status_t hp_tensor_copy(hp_tensor_t *dst, const hp_tensor_t *src) {
    if (!hp_tensor_same_shape(dst, src)) {
        char a[128], b[128];
        return hp_error(HP_ERR_INVALID_ARG, "copy: destination %s and source %s differ in shape",
                        hp_tensor_shape_str(dst, a, sizeof a), hp_tensor_shape_str(src, b, sizeof b));
    }
    copy_ctx c = {dst->dtype, src->dtype};
    if (hp_tensor_is_contiguous(dst) && hp_tensor_is_contiguous(src)) {
        hp_convert(dst->data, dst->dtype, src->data, src->dtype, (size_t)hp_tensor_numel(dst));
        return HP_OK;
    }
    for_each_row(dst, src, copy_row, &c);
    return HP_OK;
}

static void fill_row(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, void *vctx) {
    const hp_tensor_t *one = vctx;   /* a one-element tensor holding the value */
    size_t es = hp_dtype_size(one->dtype);
    for (int64_t i = 0; i < n; i++) memcpy(d + i * ds * (int64_t)es, one->data, es);
}

hp_status_t hp_tensor_fill(hp_tensor_t *t, double value) {
    unsigned char buf[8];
    hp_tensor_t one;
    hp_tensor_init(&one, t->dtype, 0, NULL, buf);
    hp_tensor_set_flat(&one, 0, value);
    for_each_row(t, NULL, fill_row, &one);
    return HP_OK;
}

static int64_t flat_offset(const hp_tensor_t *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->stride[d];
        i /= n;
    }
    return off;
}

double hp_tensor_get_flat(const hp_tensor_t *t, int64_t i) {
    double v;
    const char *p = (const char *)t->data + flat_offset(t, i) * (int64_t)hp_dtype_size(t->dtype);
    switch (t->dtype) {
    case HP_F32: { float f; memcpy(&f, p, 4); v = f; break; }
    case HP_BF16: { uint16_t h; memcpy(&h, p, 2); v = hp_bf16_to_f32(h); break; }
    case HP_F16: { uint16_t h; memcpy(&h, p, 2); v = hp_f16_to_f32(h); break; }
    case HP_I32: { int32_t x; memcpy(&x, p, 4); v = x; break; }
    case HP_I64: { int64_t x; memcpy(&x, p, 8); v = (double)x; break; }
    case HP_U8: v = *(const uint8_t *)p; break;
    default: v = NAN;
    }
    return v;
}

int64_t hp_tensor_get_flat_i64(const hp_tensor_t *t, int64_t i) {
    const char *p = (const char *)t->data + flat_offset(t, i) * (int64_t)hp_dtype_size(t->dtype);
    switch (t->dtype) {
    case HP_I64: { int64_t x; memcpy(&x, p, 8); return x; }
    case HP_I32: { int32_t x; memcpy(&x, p, 4); return x; }
    case HP_U8: return *(const uint8_t *)p;
    default: { double v = hp_tensor_get_flat(t, i); return (int64_t)(isfinite(v) ? trunc(v) : 0); }
    }
}

void hp_tensor_set_flat_i64(hp_tensor_t *t, int64_t i, int64_t v) {
    char *p = (char *)t->data + flat_offset(t, i) * (int64_t)hp_dtype_size(t->dtype);
    switch (t->dtype) {
    case HP_I64: memcpy(p, &v, 8); break;
    case HP_I32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case HP_U8: *(uint8_t *)p = (uint8_t)v; break;
    default: hp_tensor_set_flat(t, i, (double)v);
    }
}

int64_t hp_tensor_count_nonfinite(const hp_tensor_t *t, int64_t *first) {
    int64_t n = hp_tensor_numel(t), bad = 0;
    if (first) *first = -1;
    if (!hp_dtype_is_float(t->dtype)) return 0;
    for (int64_t i = 0; i < n; i++) {
        if (isfinite(hp_tensor_get_flat(t, i))) continue;
        if (bad++ == 0 && first) *first = i;
    }
    return bad;
}

void hp_tensor_set_flat(hp_tensor_t *t, int64_t i, double v) {
    char *p = (char *)t->data + flat_offset(t, i) * (int64_t)hp_dtype_size(t->dtype);
    switch (t->dtype) {
    case HP_I32: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
    case HP_I64: { int64_t x = (int64_t)v; memcpy(p, &x, 8); break; }
    default: { float f = (float)v; hp_convert(p, t->dtype, &f, HP_F32, 1); break; }
    }
}

int hp_tensor_allclose(const hp_tensor_t *a, const hp_tensor_t *b, double rtol, double atol, double *max_abs_diff) {
    double worst = 0.0;
    int ok = hp_tensor_same_shape(a, b);
    if (ok) {
        int64_t n = hp_tensor_numel(a);
        for (int64_t i = 0; i < n; i++) {
            double x = hp_tensor_get_flat(a, i), y = hp_tensor_get_flat(b, i);
            double d = fabs(x - y);
            if (a->dtype == HP_I64 && b->dtype == HP_I64) { /* exact: doubles lose bits above 2^53 */
                int64_t xi = hp_tensor_get_flat_i64(a, i), yi = hp_tensor_get_flat_i64(b, i);
                d = xi == yi ? 0.0 : fmax(fabs((double)xi - (double)yi), 1.0);
            }
            if (isnan(x) != isnan(y)) d = INFINITY;
            else if (isnan(x)) d = 0.0;
            if (d > worst) worst = d;
            if (!(d <= atol + rtol * fabs(y))) ok = 0;
        }
    }
    if (max_abs_diff) *max_abs_diff = ok || hp_tensor_same_shape(a, b) ? worst : INFINITY;
    return ok;
}

const char *hp_tensor_shape_str(const hp_tensor_t *t, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "(");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (t->ndim == 1 && k < n) k += (size_t)snprintf(buf + k, n - k, ",");
    if (k < n) snprintf(buf + k, n - k, ") %s", hp_dtype_name(t->dtype));
    return buf;
}
