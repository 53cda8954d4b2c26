/* DTensor layout math, no communication: placements (equality, text, normalisation),
 * torch.chunk shard sizes and offsets, nested and strided local shapes, and PyTorch's greedy
 * redistribute planner (_gen_transform_infos). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor-impl.h"

int hp_placement_equal(hp_placement_t a, hp_placement_t b) {
    if (a.kind != b.kind) return 0;
    switch (a.kind) {
    case HP_REPLICATE: return 1;
    case HP_SHARD: return a.dim == b.dim;
    case HP_PARTIAL: return a.reduce_op == b.reduce_op;
    case HP_STRIDED_SHARD: return a.dim == b.dim && a.split_factor == b.split_factor;
    }
    return 0;
}

static const char *partial_op_name(hp_redop_t op) {
    switch (op) {
    case HP_SUM: return "sum";
    case HP_AVG: return "avg";
    case HP_PROD: return "product";
    case HP_MAX: return "max";
    case HP_MIN: return "min";
    default: return "?";
    }
}

const char *hp_placement_str(hp_placement_t p, char *buf, size_t n) {
    switch (p.kind) {
    case HP_REPLICATE: snprintf(buf, n, "R"); break;
    case HP_SHARD: snprintf(buf, n, "S(%d)", p.dim); break;
    case HP_PARTIAL: snprintf(buf, n, "P(%s)", partial_op_name(p.reduce_op)); break;
    case HP_STRIDED_SHARD: snprintf(buf, n, "_S(%d, %d)", p.dim, p.split_factor); break;
    default: snprintf(buf, n, "?"); break;
    }
    return buf;
}

const char *hp_placements_str(int n, const hp_placement_t *p, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && used < size; i++) {
        char one[32];
        used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? ", " : "",
                                 hp_placement_str(p[i], one, sizeof(one)));
    }
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

hp_status_t hp_placement_normalize(hp_placement_t *out, hp_placement_t in, int tensor_ndim) {
    char s[32];
    *out = in;
    switch (in.kind) {
    case HP_REPLICATE:
        return HP_OK;
    case HP_PARTIAL:
        if (in.reduce_op != HP_SUM && in.reduce_op != HP_AVG && in.reduce_op != HP_PROD &&
            in.reduce_op != HP_MAX && in.reduce_op != HP_MIN)
            return hp_error(HP_ERR_INVALID_ARG, "Partial reduce op %d is not one of sum, avg, "
                            "product, max, min", (int)in.reduce_op);
        return HP_OK;
    case HP_SHARD:
    case HP_STRIDED_SHARD:
        if (in.dim < -tensor_ndim || in.dim >= tensor_ndim)
            return hp_error(HP_ERR_INVALID_ARG, "placement %s: shard dim %d out of range for a "
                            "%d-d tensor; expected -%d..%d", hp_placement_str(in, s, sizeof(s)),
                            in.dim, tensor_ndim, tensor_ndim, tensor_ndim - 1);
        if (in.dim < 0) out->dim = in.dim + tensor_ndim;
        if (in.kind == HP_STRIDED_SHARD && in.split_factor < 1)
            return hp_error(HP_ERR_INVALID_ARG, "placement %s: split_factor must be >= 1",
                            hp_placement_str(in, s, sizeof(s)));
        return HP_OK;
    }
    return hp_error(HP_ERR_INVALID_ARG, "placement kind %d is not Shard, Replicate, Partial or "
                    "_StridedShard", (int)in.kind);
}

void hp_shard_size_and_offset(int64_t size, int64_t k, int64_t r, int64_t *local_size,
                              int64_t *offset) {
    HP_ASSERT(k >= 1 && r >= 0 && r < k && size >= 0);
    if (size % k == 0) {
        *local_size = size / k;
        *offset = r * (size / k);
        return;
    }
    int64_t c = (size + k - 1) / k;
    int64_t start = c * r;
    if (start > size) {
        *local_size = 0;
        *offset = size;
    } else {
        *local_size = (start + c < size ? start + c : size) - start;
        *offset = start;
    }
}

/* Size of StridedShard piece r of a dim of size n: split n into sf pieces, each into k. */
static int64_t strided_size(int64_t n, int64_t sf, int64_t k, int64_t r) {
    int64_t total = 0;
    for (int64_t j = 0; j < sf; j++) {
        int64_t pl, po, cl, co;
        hp_shard_size_and_offset(n, sf, j, &pl, &po);
        hp_shard_size_and_offset(pl, k, r, &cl, &co);
        total += cl;
    }
    return total;
}

void hp_layout_local_shape_and_offset(int ndim, const int64_t *global_shape, int mesh_ndim,
                                      const int64_t *mesh_shape, const int *coord,
                                      const hp_placement_t *placements, int64_t *local_shape,
                                      int64_t *global_offset) {
    for (int d = 0; d < ndim; d++) {
        local_shape[d] = global_shape[d];
        global_offset[d] = 0;
    }
    int strided[HP_MAX_DIMS] = {0}, sharded[HP_MAX_DIMS] = {0};
    for (int i = 0; i < mesh_ndim; i++) {
        hp_placement_t p = placements[i];
        if (p.kind == HP_SHARD) {
            int64_t sz, off;
            hp_shard_size_and_offset(local_shape[p.dim], mesh_shape[i], coord[i], &sz, &off);
            local_shape[p.dim] = sz;
            global_offset[p.dim] += off;
            sharded[p.dim] = 1;
        } else if (p.kind == HP_STRIDED_SHARD) {
            local_shape[p.dim] = strided_size(local_shape[p.dim], p.split_factor, mesh_shape[i],
                                              coord[i]);
            strided[p.dim] = 1;
        }
    }
    /* An empty piece starts at the global end of its dim (as PyTorch 2.15; one level of
     * chunking already clamps to the end, this makes nested levels agree). */
    for (int d = 0; d < ndim; d++)
        if (sharded[d] && local_shape[d] == 0) global_offset[d] = global_shape[d];
    /* A strided dim is not one box: report its first owned index (size if none). */
    for (int d = 0; d < ndim; d++) {
        if (!strided[d]) continue;
        int64_t n = global_shape[d];
        global_offset[d] = n;
        if (local_shape[d] == 0) continue;
        int64_t *idx = hp_malloc((size_t)n * sizeof(int64_t));
        HP_ASSERT_MSG(idx != NULL, "out of memory computing a strided shard offset");
        if (hp_layout_dim_indices(n, d, mesh_ndim, mesh_shape, coord, placements, idx) > 0)
            global_offset[d] = idx[0];
        free(idx);
    }
}

int64_t hp_layout_dim_indices(int64_t n, int dim, int mesh_ndim, const int64_t *mesh_shape,
                              const int *coord, const hp_placement_t *placements, int64_t *idx) {
    int64_t cnt = n;
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    for (int m = 0; m < mesh_ndim; m++) {
        hp_placement_t p = placements[m];
        if ((p.kind != HP_SHARD && p.kind != HP_STRIDED_SHARD) || p.dim != dim) continue;
        int64_t k = mesh_shape[m], r = coord[m];
        if (p.kind == HP_SHARD) {
            int64_t sz, off;
            hp_shard_size_and_offset(cnt, k, r, &sz, &off);
            memmove(idx, idx + off, (size_t)sz * sizeof(int64_t));
            cnt = sz;
        } else {
            /* In place: pieces are visited left to right and each kept chunk moves left. */
            int64_t w = 0;
            for (int64_t j = 0; j < p.split_factor; j++) {
                int64_t pl, po, cl, co;
                hp_shard_size_and_offset(cnt, p.split_factor, j, &pl, &po);
                hp_shard_size_and_offset(pl, k, r, &cl, &co);
                memmove(idx + w, idx + po + co, (size_t)cl * sizeof(int64_t));
                w += cl;
            }
            cnt = w;
        }
    }
    return cnt;
}

int hp_layout_is_box(int mesh_ndim, const int64_t *mesh_shape, const hp_placement_t *placements) {
    for (int i = 0; i < mesh_ndim; i++)
        if (placements[i].kind == HP_STRIDED_SHARD && placements[i].split_factor > 1 &&
            mesh_shape[i] > 1)
            return 0;
    return 1;
}

/* Shared by the public entry points: count, normalisation and range checks. */
hp_status_t hp_dtensor_check_placements_(hp_placement_t *out, int tensor_ndim, hp_mesh_t mesh,
                                         int nplacements, const hp_placement_t *placements,
                                         const char *what) {
    int mnd = hp_mesh_ndim(mesh);
    if (nplacements != mnd)
        return hp_error(HP_ERR_INVALID_ARG, "%s: `placements` must have the same length as "
                        "`device_mesh.ndim`! Found placements length: %d, and "
                        "device_mesh.ndim: %d.", what, nplacements, mnd);
    for (int i = 0; i < mnd; i++) HP_TRY(hp_placement_normalize(&out[i], placements[i], tensor_ndim));
    return HP_OK;
}

int hp_placements_first_partial_(const hp_placement_t *pl, int n) {
    for (int i = 0; i < n; i++)
        if (pl[i].kind == HP_PARTIAL) return i;
    return -1;
}

static void mesh_shape_of(hp_mesh_t mesh, int64_t *ms) {
    for (int i = 0; i < hp_mesh_ndim(mesh); i++) ms[i] = hp_mesh_size(mesh, i);
}

hp_status_t hp_dtensor_compute_local_shape_and_offset(int64_t *local_shape, int64_t *global_offset,
                                                      int ndim, const int64_t *global_shape,
                                                      hp_mesh_t mesh, int nplacements,
                                                      const hp_placement_t *placements) {
    hp_placement_t pl[HP_MESH_MAX_DIMS];
    HP_TRY(hp_dtensor_check_placements_(pl, ndim, mesh, nplacements, placements,
                                        "compute_local_shape_and_global_offset"));
    int coord[HP_MESH_MAX_DIMS];
    if (!hp_mesh_get_coordinate(mesh, coord)) {
        for (int d = 0; d < ndim; d++) local_shape[d] = global_offset[d] = 0;
        return HP_OK;
    }
    int64_t ms[HP_MESH_MAX_DIMS];
    mesh_shape_of(mesh, ms);
    hp_layout_local_shape_and_offset(ndim, global_shape, hp_mesh_ndim(mesh), ms, coord, pl,
                                     local_shape, global_offset);
    return HP_OK;
}

int64_t hp_dtensor_local_numel(const hp_dtensor_t *t) { return hp_tensor_numel(&t->local); }

hp_status_t hp_dtensor_global_offset(const hp_dtensor_t *t, int64_t *offset) {
    if (!t || !offset)
        return hp_error(HP_ERR_INVALID_ARG, "hp_dtensor_global_offset: needs a DTensor and an offset array");
    int nd = t->local.ndim;
    int64_t ls[HP_MAX_DIMS];
    if (nd < 0 || nd > HP_MAX_DIMS)
        return hp_error(HP_ERR_INVALID_ARG, "hp_dtensor_global_offset: the DTensor has %d dims, expected 0..%d "
                        "(an uninitialised descriptor?)", nd, HP_MAX_DIMS);
    if (!t->mesh) {
        for (int d = 0; d < nd; d++) offset[d] = 0;
        return HP_OK;
    }
    hp_status_t st = hp_dtensor_compute_local_shape_and_offset(ls, offset, nd, t->global_shape,
                                                               t->mesh, t->mesh_ndim, t->placements);
    /* a bad descriptor is the caller's input, not an invariant: report it */
    if (st != HP_OK) return hp_error_prefix(st, "hp_dtensor_global_offset: invalid DTensor: ");
    return HP_OK;
}

/* ---- planner --------------------------------------------------------------------------- */

static int is_shard_on(hp_placement_t p, int d) {
    return (p.kind == HP_SHARD || p.kind == HP_STRIDED_SHARD) && p.dim == d;
}

hp_status_t hp_redistribute_plan(hp_transform_t *steps, int max_steps, int *nsteps, int ndim,
                                 const int64_t *global_shape, int mesh_ndim,
                                 const int64_t *mesh_shape, const int *coord,
                                 const hp_placement_t *src, const hp_placement_t *dst) {
    int n = 0;
#define EMIT(md, s_, d_)                                                                  \
    do {                                                                                  \
        if (n >= max_steps)                                                               \
            return hp_error(HP_ERR_INVALID_ARG, "hp_redistribute_plan: more than %d steps; " \
                            "pass a larger steps array (2 * mesh ndim always suffices)",    \
                            max_steps);                                                   \
        steps[n].mesh_dim = (md);                                                         \
        steps[n].src = (s_);                                                              \
        steps[n].dst = (d_);                                                              \
        memcpy(steps[n].logical_shape, logical[md], sizeof(steps[n].logical_shape));      \
        n++;                                                                              \
    } while (0)
    int64_t logical[HP_MESH_MAX_DIMS][HP_MAX_DIMS];
    memset(logical, 0, sizeof(logical));
    for (int d = 0; d < ndim; d++) logical[0][d] = global_shape[d];
    if (mesh_ndim == 1) {   /* one direct step, none when the placements are equal */
        if (!hp_placement_equal(src[0], dst[0])) EMIT(0, src[0], dst[0]);
        *nsteps = n;
        return HP_OK;
    }
    /* Per-mesh-dim logical shapes from the source placements. */
    for (int i = 0; i + 1 < mesh_ndim; i++) {
        memcpy(logical[i + 1], logical[i], sizeof(logical[i]));
        if (src[i].kind == HP_SHARD) {
            int64_t sz, off;
            hp_shard_size_and_offset(logical[i][src[i].dim], mesh_shape[i], coord[i], &sz, &off);
            logical[i + 1][src[i].dim] = sz;
        } else if (src[i].kind == HP_STRIDED_SHARD) {
            logical[i + 1][src[i].dim] =
                strided_size(logical[i][src[i].dim], src[i].split_factor, mesh_shape[i], coord[i]);
        }
    }
    hp_placement_t cur[HP_MESH_MAX_DIMS], tgt[HP_MESH_MAX_DIMS];
    memcpy(cur, src, (size_t)mesh_ndim * sizeof(hp_placement_t));
    memcpy(tgt, dst, (size_t)mesh_ndim * sizeof(hp_placement_t));
    int64_t num_shards = 1;
    for (int i = 0; i < mesh_ndim; i++)
        if (src[i].kind == HP_SHARD || src[i].kind == HP_STRIDED_SHARD) num_shards *= mesh_shape[i];
    if (num_shards > 1) {
        /* Inner to outer: replicate nested sharding that the target does not share first. */
        for (int md = mesh_ndim - 1; md >= 0; md--) {
            hp_placement_t target = tgt[md];
            if (target.kind == HP_SHARD || target.kind == HP_STRIDED_SHARD) {
                int d = target.dim, differ = 0;
                for (int i = 0; i < md; i++)
                    if (is_shard_on(cur[i], d) != is_shard_on(tgt[i], d)) differ = 1;
                if (differ) target = hp_replicate();
            }
            if (!hp_placement_equal(cur[md], target)) {
                EMIT(md, cur[md], target);
                cur[md] = target;
            }
        }
    }
    /* Outer to inner: the remaining steps (re-sharding what was replicated above). */
    for (int md = 0; md < mesh_ndim; md++) {
        if (!hp_placement_equal(cur[md], tgt[md])) {
            EMIT(md, cur[md], tgt[md]);
            cur[md] = tgt[md];
        }
    }
#undef EMIT
    *nsteps = n;
    return HP_OK;
}
