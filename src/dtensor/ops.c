/* A few DTensor ops with sharding rules, to show the dispatch model: a rule picks output
 * placements per mesh dim and the input placements it needs; inputs that do not fit are
 * redistributed (internal redistribute, counted like any other); then the local kernel runs
 * on the local pieces (the matmul's GEMM through the kernel table, backend.h). f32 only. */
#include <string.h>

#include "dtensor/dtensor-impl.h"
#include "hyperparallel/backend.h"

typedef struct op_plan {
    hp_placement_t need_a[HP_MESH_MAX_DIMS], need_b[HP_MESH_MAX_DIMS], out[HP_MESH_MAX_DIMS];
} op_plan_t;

static int is_shard(hp_placement_t p) { return p.kind == HP_SHARD || p.kind == HP_STRIDED_SHARD; }
static int is_linear_partial(hp_placement_t p) {
    return p.kind == HP_PARTIAL && (p.reduce_op == HP_SUM || p.reduce_op == HP_AVG);
}

static hp_status_t check_inputs(const char *op, const hp_dtensor_t *a, const hp_dtensor_t *b) {
    if (!a->mesh || (b && !b->mesh))
        return hp_error(HP_ERR_INVALID_ARG, "%s: inputs must be DTensors (mesh set)", op);
    if (b && !hp_mesh_equal(a->mesh, b->mesh))
        return hp_error(HP_ERR_INVALID_ARG, "%s: inputs live on different device meshes; "
                        "redistribute one onto the other's mesh first", op);
    if (a->local.dtype != HP_F32 || (b && b->local.dtype != HP_F32))
        return hp_error(HP_ERR_UNSUPPORTED, "%s: only f32 DTensors are supported (got %s)", op,
                        hp_dtype_name(a->local.dtype != HP_F32 ? a->local.dtype : b->local.dtype));
    return HP_OK;
}

/* Redistributes `in` to `want` into *tmp unless it already has those placements; *use points
 * at whichever holds the data. Temporaries come from the arena (rewound by the caller) or
 * the heap (owned by tmp). */
static hp_status_t fit(const hp_dtensor_t **use, hp_dtensor_t *tmp, const hp_dtensor_t *in,
                       const hp_placement_t *want, const hp_dtensor_mem_t *scratch) {
    int same = 1;
    for (int i = 0; i < in->mesh_ndim; i++) same &= hp_placement_equal(in->placements[i], want[i]);
    memset(tmp, 0, sizeof(*tmp));
    if (same) {
        *use = in;
        return HP_OK;
    }
    HP_TRY(hp_dtensor_redistribute_(tmp, scratch, in, in->mesh_ndim, want, 1));
    *use = tmp;
    return HP_OK;
}

typedef hp_status_t (*kernel_fn)(hp_tensor_t *out, const hp_tensor_t *a, const hp_tensor_t *b, int arg);

/* Allocate the result, fit the inputs, run the kernel, release temporaries. */
static hp_status_t run_op(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, const hp_dtensor_t *a,
                          const hp_dtensor_t *b, const op_plan_t *p, int out_nd,
                          const int64_t *out_gshape, kernel_fn kern, int arg) {
    hp_dmem_t dm;
    hp_dmem_begin(&dm, mem);
    hp_dtensor_t res, ta, tb;
    memset(&res, 0, sizeof(res));
    memset(&ta, 0, sizeof(ta));
    memset(&tb, 0, sizeof(tb));
    hp_status_t st = hp_dtensor_make_result_(&res, &dm, HP_F32, out_nd, out_gshape, a->mesh, p->out);
    if (st != HP_OK) goto end;
    hp_dtensor_mem_t scratch = {mem ? mem->arena : NULL, NULL, 0};
    const hp_dtensor_t *ua = a, *ub = b;
    st = fit(&ua, &ta, a, p->need_a, &scratch);
    if (st == HP_OK && b) st = fit(&ub, &tb, b, p->need_b, &scratch);
    if (st == HP_OK && hp_mesh_contains_self(a->mesh))
        st = kern(&res.local, &ua->local, b ? &ub->local : NULL, arg);
end:
    hp_dtensor_free(&ta);
    hp_dtensor_free(&tb);
    hp_dmem_end(&dm);   /* rewinds the arena past the temporaries; the result stays */
    if (st != HP_OK) {
        hp_dtensor_free(&res);
        return st;
    }
    *out = res;
    return HP_OK;
}

/* ---- elementwise ------------------------------------------------------------------------- */

static hp_status_t ew_kernel(hp_tensor_t *out, const hp_tensor_t *a, const hp_tensor_t *b, int mul) {
    HP_ASSERT(hp_tensor_same_shape(a, b) && hp_tensor_same_shape(out, a));
    hp_tensor_t ca = *a, cb = *b;
    HP_ASSERT(hp_tensor_is_contiguous(&ca) && hp_tensor_is_contiguous(&cb));
    int64_t n = hp_tensor_numel(out);
    float *o = out->data;
    const float *x = ca.data, *y = cb.data;
    for (int64_t i = 0; i < n; i++) o[i] = mul ? x[i] * y[i] : x[i] + y[i];
    return HP_OK;
}

static hp_status_t elementwise(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, const hp_dtensor_t *a,
                               const hp_dtensor_t *b, int mul) {
    const char *name = mul ? "hp_dtensor_mul" : "hp_dtensor_add";
    HP_TRY(check_inputs(name, a, b));
    if (a->local.ndim != b->local.ndim || memcmp(a->global_shape, b->global_shape,
                                                 (size_t)a->local.ndim * sizeof(int64_t)) != 0 ||
        !hp_tensor_is_contiguous(&a->local) || !hp_tensor_is_contiguous(&b->local))
        return hp_error(HP_ERR_INVALID_ARG, "%s: inputs need the same global shape and contiguous "
                        "local pieces (no broadcasting)", name);
    op_plan_t p;
    for (int i = 0; i < a->mesh_ndim; i++) {
        hp_placement_t x = a->placements[i], y = b->placements[i], r = hp_replicate();
        if (hp_placement_equal(x, y) && (x.kind != HP_PARTIAL || (!mul && is_linear_partial(x)))) {
            p.need_a[i] = p.need_b[i] = p.out[i] = x;                       /* S+S, R+R, P+P */
        } else if (is_shard(x) && y.kind == HP_REPLICATE) {
            p.need_a[i] = p.need_b[i] = p.out[i] = x;                       /* chunk b locally */
        } else if (x.kind == HP_REPLICATE && is_shard(y)) {
            p.need_a[i] = p.need_b[i] = p.out[i] = y;
        } else if (mul && is_linear_partial(x) && y.kind == HP_REPLICATE) {
            p.need_a[i] = x, p.need_b[i] = y, p.out[i] = x;                 /* P * R = P */
        } else if (mul && x.kind == HP_REPLICATE && is_linear_partial(y)) {
            p.need_a[i] = x, p.need_b[i] = y, p.out[i] = y;
        } else {
            p.need_a[i] = p.need_b[i] = p.out[i] = r;
        }
    }
    return run_op(out, mem, a, b, &p, a->local.ndim, a->global_shape, ew_kernel, mul);
}

hp_status_t hp_dtensor_add(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, const hp_dtensor_t *a,
                           const hp_dtensor_t *b) {
    return elementwise(out, mem, a, b, 0);
}

hp_status_t hp_dtensor_mul(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, const hp_dtensor_t *a,
                           const hp_dtensor_t *b) {
    return elementwise(out, mem, a, b, 1);
}

/* ---- matmul ------------------------------------------------------------------------------ */

static hp_status_t mm_kernel(hp_tensor_t *out, const hp_tensor_t *a, const hp_tensor_t *b, int arg) {
    // local a (m, k), b (k, n), out (m, n)
    int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
    HP_ASSERT(b->shape[0] == k && out->shape[0] == m && out->shape[1] == n);
    HP_ASSERT(hp_tensor_is_contiguous(a) && hp_tensor_is_contiguous(b));
    if (m == 0 || n == 0) return HP_OK;
    if (k == 0) {
        memset(out->data, 0, (size_t)(m * n) * sizeof(float));
        return HP_OK;
    }
    const hp_backend_t *be = hp_backend_default();
    be->gemm(be->ctx, out->data, (int)n, a->data, (int)k, b->data, (int)n, (int)m, (int)n, (int)k, 0, 0, 1.0f, 0.0f);
    return HP_OK;
}

hp_status_t hp_dtensor_matmul(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, const hp_dtensor_t *a,
                              const hp_dtensor_t *b) {
    HP_TRY(check_inputs("hp_dtensor_matmul", a, b));
    if (a->local.ndim != 2 || b->local.ndim != 2 || a->global_shape[1] != b->global_shape[0])
        return hp_error(HP_ERR_INVALID_ARG, "hp_dtensor_matmul: expected (M, K) @ (K, N), got "
                        "%d-d @ %d-d with inner sizes %lld and %lld", a->local.ndim, b->local.ndim,
                        (long long)a->global_shape[a->local.ndim - 1], (long long)b->global_shape[0]);
    op_plan_t p;
    for (int i = 0; i < a->mesh_ndim; i++) {
        hp_placement_t x = a->placements[i], y = b->placements[i], r = hp_replicate();
        p.need_a[i] = x, p.need_b[i] = y;
        if (x.kind == HP_SHARD && x.dim == 0 && y.kind == HP_REPLICATE) p.out[i] = hp_shard(0);
        else if (x.kind == HP_REPLICATE && y.kind == HP_SHARD && y.dim == 1) p.out[i] = hp_shard(1);
        else if (x.kind == HP_SHARD && x.dim == 1 && y.kind == HP_SHARD && y.dim == 0)
            p.out[i] = hp_partial(HP_SUM);                 /* contracted dim sharded on both */
        else if (x.kind == HP_REPLICATE && y.kind == HP_REPLICATE) p.out[i] = r;
        else if (x.kind == HP_PARTIAL && x.reduce_op == HP_SUM && y.kind == HP_REPLICATE) p.out[i] = x;
        else if (x.kind == HP_REPLICATE && y.kind == HP_PARTIAL && y.reduce_op == HP_SUM) p.out[i] = y;
        else p.need_a[i] = p.need_b[i] = p.out[i] = r;
    }
    int64_t g[2] = {a->global_shape[0], b->global_shape[1]};
    return run_op(out, mem, a, b, &p, 2, g, mm_kernel, 0);
}

/* ---- sum over a dim ---------------------------------------------------------------------- */

static hp_status_t sum_kernel(hp_tensor_t *out, const hp_tensor_t *a, const hp_tensor_t *b, int dim) {
    HP_ASSERT(hp_tensor_is_contiguous(a));
    int64_t pre = 1, n = a->shape[dim], post = 1;
    for (int d = 0; d < dim; d++) pre *= a->shape[d];
    for (int d = dim + 1; d < a->ndim; d++) post *= a->shape[d];
    const float *x = a->data;
    float *o = out->data;
    for (int64_t i = 0; i < pre; i++)
        for (int64_t j = 0; j < post; j++) {
            float acc = 0.0f;   /* fixed order over the dim: deterministic */
            for (int64_t t = 0; t < n; t++) acc += x[(i * n + t) * post + j];
            o[i * post + j] = acc;
        }
    return HP_OK;
}

hp_status_t hp_dtensor_sum(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, const hp_dtensor_t *in,
                           int dim) {
    HP_TRY(check_inputs("hp_dtensor_sum", in, NULL));
    int nd = in->local.ndim;
    if (dim < -nd || dim >= nd || nd == 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_dtensor_sum: dim %d out of range for a %d-d tensor "
                        "(expected -%d..%d)", dim, nd, nd, nd - 1);
    if (dim < 0) dim += nd;
    op_plan_t p;
    for (int i = 0; i < in->mesh_ndim; i++) {
        hp_placement_t x = in->placements[i];
        p.need_a[i] = x;
        if (is_shard(x) && x.dim == dim) p.out[i] = hp_partial(HP_SUM);
        else if (is_shard(x)) {
            p.out[i] = x;
            p.out[i].dim = x.dim - (x.dim > dim);
        } else if (x.kind == HP_REPLICATE || is_linear_partial(x)) p.out[i] = x;
        else p.need_a[i] = p.out[i] = hp_replicate();
    }
    int64_t g[HP_MAX_DIMS];
    for (int d = 0, j = 0; d < nd; d++)
        if (d != dim) g[j++] = in->global_shape[d];
    return run_op(out, mem, in, NULL, &p, nd - 1, g, sum_kernel, dim);
}
