/* Helpers shared by the DTensor tests: deterministic global tensors of small integers (so
 * every sum is exact), building a DTensor from each rank's piece, and checks of local
 * pieces, full tensors and exact collective counts. */
#ifndef TEST_DTENSOR_UTIL_H
#define TEST_DTENSOR_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/dtensor.h"

static hp_comm_t W;
static int R, N;

static inline void tu_init(int *argc, char ***argv) {
    W = hp_test_mpi_init(argc, argv, &R, &N);
}

/* f32 tensor of small integers; different seeds give different data. Heap; free with
 * hp_tensor_free_data. */
static inline hp_tensor_t tu_global(int nd, const int64_t *shape, int seed) {
    hp_tensor_t t;
    HP_ASSERT(hp_tensor_malloc(&t, HP_F32, nd, shape) == HP_OK);
    float *p = t.data;
    int64_t n = hp_tensor_numel(&t);
    for (int64_t i = 0; i < n; i++) p[i] = (float)((i * 37 + seed * 11 + 5) % 19) - 9.0f;
    return t;
}

static inline hp_tensor_t tu_fill(int nd, const int64_t *shape, float v) {
    hp_tensor_t t;
    HP_ASSERT(hp_tensor_malloc(&t, HP_F32, nd, shape) == HP_OK);
    HP_ASSERT(hp_tensor_fill(&t, v) == HP_OK);
    return t;
}

/* Element of a contiguous f32 tensor at multi-index idx + off. */
static inline float tu_at(const hp_tensor_t *g, const int64_t *idx, const int64_t *off) {
    int64_t lin = 0;
    for (int d = 0; d < g->ndim; d++) lin = lin * g->shape[d] + idx[d] + (off ? off[d] : 0);
    return ((const float *)g->data)[lin];
}

/* This rank's local piece must equal scale * the slice of g at its global offset. */
static inline int tu_check_local(const hp_dtensor_t *dt, const hp_tensor_t *g, float scale, const char *what) {
    int64_t ls[HP_MAX_DIMS], off[HP_MAX_DIMS];
    HP_CHECK_OK(hp_dtensor_compute_local_shape_and_offset(ls, off, g->ndim, g->shape, dt->mesh,
                                                          dt->mesh_ndim, dt->placements));
    for (int d = 0; d < g->ndim; d++)
        if (ls[d] != dt->local.shape[d] || dt->global_shape[d] != g->shape[d]) {
            HP_CHECK(0, "%s: local dim %d is %lld, expected %lld (global %lld vs %lld)", what, d,
                     (long long)dt->local.shape[d], (long long)ls[d], (long long)dt->global_shape[d],
                     (long long)g->shape[d]);
            return 0;
        }
    int64_t n = hp_tensor_numel(&dt->local), idx[HP_MAX_DIMS] = {0};
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float want = scale * tu_at(g, idx, off), got = (float)hp_tensor_get_flat(&dt->local, i);
        if (got != want && bad++ < 3)
            HP_CHECK(0, "%s: local element %lld is %g, expected %g", what, (long long)i, got, want);
        for (int d = g->ndim - 1; d >= 0; d--) {
            if (++idx[d] < dt->local.shape[d]) break;
            idx[d] = 0;
        }
    }
    HP_CHECK(bad == 0, "%s: %d local elements differ", what, bad);
    return bad == 0;
}

/* full_tensor must equal scale * g (ranks outside the mesh get an empty tensor). */
static inline int tu_check_full(const hp_dtensor_t *dt, const hp_tensor_t *g, float scale, const char *what) {
    hp_tensor_t full;
    void *owned = NULL;
    hp_status_t st = hp_dtensor_full_tensor(&full, &owned, NULL, dt);
    HP_CHECK(st == HP_OK, "%s: full_tensor: %s", what, hp_last_error());
    if (st != HP_OK) return 0;
    int bad = 0;
    if (!hp_mesh_contains_self(dt->mesh)) {
        HP_CHECK(hp_tensor_numel(&full) == 0, "%s: outside rank gets an empty tensor", what);
    } else {
        HP_CHECK(hp_tensor_same_shape(&full, g), "%s: full_tensor shape", what);
        int64_t n = hp_tensor_numel(g);
        for (int64_t i = 0; i < n && hp_tensor_same_shape(&full, g); i++) {
            float want = scale * ((const float *)g->data)[i], got = ((const float *)full.data)[i];
            if (got != want && bad++ < 3)
                HP_CHECK(0, "%s: full element %lld is %g, expected %g", what, (long long)i, got, want);
        }
        HP_CHECK(bad == 0, "%s: %d full elements differ", what, bad);
    }
    free(owned);
    return bad == 0;
}

/* DTensor whose pieces are cut from g by the layout (no comm); Partial mesh dims hold the
 * whole value on every rank (so the global value is g * prod of Partial dim sizes, as
 * PyTorch's test_multi_dim_mesh builds it). The result owns its local buffer. */
static inline hp_dtensor_t tu_from_pieces(const hp_tensor_t *g, hp_mesh_t mesh, const hp_placement_t *pl) {
    int mnd = hp_mesh_ndim(mesh);
    int64_t ls[HP_MAX_DIMS], off[HP_MAX_DIMS];
    HP_ASSERT(hp_dtensor_compute_local_shape_and_offset(ls, off, g->ndim, g->shape, mesh, mnd, pl) == HP_OK);
    hp_tensor_t loc;
    HP_ASSERT(hp_tensor_malloc(&loc, HP_F32, g->ndim, ls) == HP_OK);
    int64_t n = hp_tensor_numel(&loc), idx[HP_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        ((float *)loc.data)[i] = tu_at(g, idx, off);
        for (int d = g->ndim - 1; d >= 0; d--) {
            if (++idx[d] < ls[d]) break;
            idx[d] = 0;
        }
    }
    hp_dtensor_t dt;
    HP_ASSERT(hp_dtensor_from_local(&dt, &loc, mesh, mnd, pl, g->shape) == HP_OK);
    dt.owned = loc.data;
    return dt;
}

/* Exact collective counts since the last reset (CommDebugMode analog); ranks outside the
 * mesh must have made none. */
static inline void tu_expect(hp_mesh_t mesh, const char *what, int all_gather, int all_to_all, int all_reduce,
                      int reduce_scatter, int total) {
    if (!hp_mesh_contains_self(mesh)) all_gather = all_to_all = all_reduce = reduce_scatter = total = 0;
    int ag = (int)hp_comm_count(HP_COMM_ALL_GATHER), a2a = (int)hp_comm_count(HP_COMM_ALL_TO_ALL),
        ar = (int)hp_comm_count(HP_COMM_ALL_REDUCE), rs = (int)hp_comm_count(HP_COMM_REDUCE_SCATTER),
        tot = (int)hp_comm_count_total();
    HP_CHECK(ag == all_gather && a2a == all_to_all && ar == all_reduce && rs == reduce_scatter && tot == total,
             "%s: counts all_gather %d all_to_all %d all_reduce %d reduce_scatter %d total %d; expected "
             "%d %d %d %d %d", what, ag, a2a, ar, rs, tot, all_gather, all_to_all, all_reduce,
             reduce_scatter, total);
}

static inline const char *tu_pl(int n, const hp_placement_t *p) {
    static char buf[4][96];
    static int k = 0;
    k = (k + 1) % 4;
    return hp_placements_str(n, p, buf[k], sizeof buf[k]);
}

/* The meshes the API and redistribute tests share: m1, the 1-D mesh "x" over every rank, and
 * m2, 2 x 2 ("dp", "tp") over ranks 0-3. */
static inline void tu_meshes(hp_mesh_t *m1, hp_mesh_t *m2) {
    HP_CHECK_OK(hp_mesh_create(W, 1, (int64_t[]){N}, (const char *[]){"x"}, m1));
    HP_CHECK_OK(hp_mesh_create(W, 2, (int64_t[]){2, 2}, (const char *[]){"dp", "tp"}, m2));
}

/* The end of such a test: both meshes destroyed, the summary line, MPI finalized. */
static inline int tu_finish(const char *name, hp_mesh_t m1, hp_mesh_t m2) {
    hp_mesh_destroy(m2);
    hp_mesh_destroy(m1);
    return hp_test_mpi_finish(name);
}

/* One redistribute case: g distributed as src (a) and redistributed to dst (b, the collectives
 * counted from just before it), checked bitwise against g distributed as dst directly (what
 * names it); then the caller checks the counts and frees a, b and g. */
static inline void tu_redistribute_vs_direct(const char *what, const hp_tensor_t *g, hp_mesh_t m, int np,
                                             const hp_placement_t *src, const hp_placement_t *dst, hp_dtensor_t *a,
                                             hp_dtensor_t *b) {
    hp_dtensor_t direct;
    HP_CHECK_OK(hp_dtensor_distribute(a, NULL, g, m, np, src, 0));
    HP_CHECK_OK(hp_dtensor_distribute(&direct, NULL, g, m, np, dst, 0));
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_redistribute(b, NULL, a, np, dst));
    HP_CHECK(hp_tensor_same_shape(&b->local, &direct.local) &&
                 memcmp(b->local.data, direct.local.data, hp_tensor_nbytes(&b->local)) == 0,
             "%s: equals direct distribute", what);
    hp_dtensor_free(&direct);
}

#endif
