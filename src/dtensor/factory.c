/* DTensor factories (torch.distributed.tensor.zeros/ones/full/rand): each rank allocates and
 * fills only its own piece; random fills use the piece's global indices, so any layout gives
 * the values of the same tensor drawn whole (initialisation does not depend on the layout:
 * docs/architecture.md, rules every layer keeps). */
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor-impl.h"

static hp_status_t check_shape(const char *fn, int ndim, const int64_t *global_shape) {
    if (ndim < 0 || ndim > HP_MAX_DIMS)
        return hp_error(HP_ERR_INVALID_ARG, "%s: ndim %d out of range 0..%d", fn, ndim, HP_MAX_DIMS);
    for (int d = 0; d < ndim; d++)
        if (global_shape[d] < 0)
            return hp_error(HP_ERR_INVALID_ARG, "%s: size[%d] = %lld is negative", fn, d,
                            (long long)global_shape[d]);
    return HP_OK;
}

hp_status_t hp_dtensor_full(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, hp_dtype_t dtype,
                            int ndim, const int64_t *global_shape, hp_mesh_t mesh, int nplacements,
                            const hp_placement_t *placements, double value) {
    HP_TRY(check_shape("hp_dtensor_full", ndim, global_shape));
    hp_placement_t pl[HP_MESH_MAX_DIMS];
    HP_TRY(hp_dtensor_check_placements_(pl, ndim, mesh, nplacements, placements, "hp_dtensor_full"));
    hp_dmem_t dm;
    hp_dmem_begin(&dm, mem);
    hp_dtensor_t res;
    memset(&res, 0, sizeof(res));
    hp_status_t st = hp_dtensor_make_result_(&res, &dm, dtype, ndim, global_shape, mesh, pl);
    if (st == HP_OK) st = hp_tensor_fill(&res.local, value);   /* out_data may hold anything */
    return hp_dtensor_finish_(&dm, &res, st, out);
}

hp_status_t hp_dtensor_rand(hp_dtensor_t *out, const hp_dtensor_mem_t *mem, hp_dtype_t dtype,
                            int ndim, const int64_t *global_shape, hp_mesh_t mesh, int nplacements,
                            const hp_placement_t *placements, hp_rng_key_t key,
                            const hp_rng_spec_t *spec) {
    char s[32];
    HP_TRY(check_shape("hp_dtensor_rand", ndim, global_shape));
    hp_placement_t pl[HP_MESH_MAX_DIMS];
    HP_TRY(hp_dtensor_check_placements_(pl, ndim, mesh, nplacements, placements, "hp_dtensor_rand"));
    const int pi = hp_placements_first_partial_(pl, nplacements);
    if (pi >= 0)
        return hp_error(HP_ERR_INVALID_ARG, "hp_dtensor_rand: placement %s on mesh dim %d: a random tensor cannot be "
                        "Partial; use Replicate or Shard", hp_placement_str(pl[pi], s, sizeof(s)), pi);
    if (!hp_dtype_is_float(dtype))
        return hp_error(HP_ERR_INVALID_ARG, "hp_dtensor_rand: dtype %s is not a float type", hp_dtype_name(dtype));
    hp_dmem_t dm;
    hp_dmem_begin(&dm, mem);
    hp_dtensor_t res;
    memset(&res, 0, sizeof(res));
    hp_status_t st = hp_dtensor_make_result_(&res, &dm, dtype, ndim, global_shape, mesh, pl);
    int coord[HP_MESH_MAX_DIMS];
    if (st != HP_OK || !hp_mesh_get_coordinate(mesh, coord) || hp_tensor_numel(&res.local) == 0) goto end;
    int mnd = hp_mesh_ndim(mesh);
    int64_t ms[HP_MESH_MAX_DIMS], ls[HP_MAX_DIMS], off[HP_MAX_DIMS];
    for (int i = 0; i < mnd; i++) ms[i] = hp_mesh_size(mesh, i);
    hp_layout_local_shape_and_offset(ndim, global_shape, mnd, ms, coord, pl, ls, off);
    if (hp_layout_is_box(mnd, ms, pl)) {
        st = hp_rng_fill(&res.local, key, spec, global_shape, off);
        goto end;
    }
    /* _StridedShard: the strided dim is filled one global index at a time (a narrow view
     * with its own offset); the other dims are boxes. */
    int sd = -1;
    for (int i = 0; i < mnd; i++)
        if (pl[i].kind == HP_STRIDED_SHARD && pl[i].split_factor > 1 && ms[i] > 1) sd = pl[i].dim;
    for (int i = 0; i < mnd; i++)
        if (pl[i].kind == HP_STRIDED_SHARD && pl[i].dim != sd && pl[i].split_factor > 1 && ms[i] > 1) {
            st = hp_error(HP_ERR_UNSUPPORTED, "hp_dtensor_rand: _StridedShard on two tensor dims");
            goto end;
        }
    int64_t *idx = hp_dmem_scratch(&dm, (size_t)(global_shape[sd] + 1) * sizeof(int64_t));
    if (!idx) {
        st = HP_ERR_OOM;
        goto end;
    }
    int64_t n = hp_layout_dim_indices(global_shape[sd], sd, mnd, ms, coord, pl, idx);
    for (int64_t t = 0; t < n && st == HP_OK; t++) {
        hp_tensor_t row;
        st = hp_tensor_narrow(&row, &res.local, sd, t, 1);
        off[sd] = idx[t];
        if (st == HP_OK) st = hp_rng_fill(&row, key, spec, global_shape, off);
    }
end:
    return hp_dtensor_finish_(&dm, &res, st, out);
}
