/* Initialisation does not depend on the layout (docs/architecture.md): a tensor initialised
 * sharded on any mesh equals, bitwise, the slice of the same tensor initialised whole. Part 1
 * (any rank count) walks every coordinate of several virtual meshes and placements (uneven,
 * empty, nested, _StridedShard) in one process; part 2 (4 and 8 ranks) fills real DTensor shards from their global offsets
 * and checks full_tensor against the whole fill, also through hp_dtensor_rand. */
// hp-test: ranks 1 4 8
#include "test_dtensor_util.h"
#include "hyperparallel/rng.h"

static const hp_rng_spec_t k_specs[3] = {
    {HP_RNG_UNIFORM, -0.5f, 0.5f, 0, 0},
    {HP_RNG_NORMAL, 0.0f, 0.02f, 0, 0},
    {HP_RNG_TRUNC_NORMAL, 0.0f, 1.0f, -2.0f, 2.0f},
};

/* Fills a piece of a layout: box layouts in one call from the global offset; a strided dim
 * one index at a time (each a narrow view with its own global offset). */
static hp_status_t fill_piece(hp_tensor_t *loc, hp_rng_key_t key, const hp_rng_spec_t *spec, int nd,
                              const int64_t *gshape, int mnd, const int64_t *ms, const int *coord,
                              const hp_placement_t *pl) {
    int64_t ls[HP_MAX_DIMS], off[HP_MAX_DIMS];
    hp_layout_local_shape_and_offset(nd, gshape, mnd, ms, coord, pl, ls, off);
    int sd = -1;
    for (int i = 0; i < mnd; i++)
        if (pl[i].kind == HP_STRIDED_SHARD) sd = pl[i].dim;
    if (sd < 0) return hp_rng_fill(loc, key, spec, gshape, off);
    int64_t *idx = malloc((size_t)(gshape[sd] + 1) * sizeof(int64_t));
    int64_t n = hp_layout_dim_indices(gshape[sd], sd, mnd, ms, coord, pl, idx);
    for (int64_t t = 0; t < n; t++) {
        hp_tensor_t row;
        HP_TRY(hp_tensor_narrow(&row, loc, sd, t, 1));
        off[sd] = idx[t];
        HP_TRY(hp_rng_fill(&row, key, spec, gshape, off));
    }
    free(idx);
    return HP_OK;
}

/* Compares a piece with the whole fill, element by element via the layout's indices. */
static int piece_matches(const hp_tensor_t *loc, const hp_tensor_t *whole, int nd, const int64_t *gshape,
                         int mnd, const int64_t *ms, const int *coord, const hp_placement_t *pl) {
    int64_t *idx[HP_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        idx[d] = malloc((size_t)(gshape[d] + 1) * sizeof(int64_t));
        int64_t n = hp_layout_dim_indices(gshape[d], d, mnd, ms, coord, pl, idx[d]);
        HP_ASSERT(n == loc->shape[d]);
    }
    size_t es = hp_dtype_size(loc->dtype);
    int64_t n = hp_tensor_numel(loc), li[HP_MAX_DIMS] = {0}, gi[HP_MAX_DIMS];
    int ok = 1;
    for (int64_t e = 0; e < n && ok; e++) {
        for (int d = 0; d < nd; d++) gi[d] = idx[d][li[d]];
        ok = memcmp(hp_tensor_ptr(loc, li), hp_tensor_ptr(whole, gi), es) == 0;
        for (int d = nd - 1; d >= 0; d--) {
            if (++li[d] < loc->shape[d]) break;
            li[d] = 0;
        }
    }
    for (int d = 0; d < nd; d++) free(idx[d]);
    return ok;
}

static void test_virtual(void) {
    struct { int mnd; int64_t ms[3]; int nd; int64_t shape[3]; hp_placement_t pl[3]; } cases[] = {
        {1, {4}, 2, {13, 5}, {hp_shard(0)}},
        {1, {4}, 2, {3, 7}, {hp_shard(1)}},
        {1, {8}, 1, {5}, {hp_shard(0)}},                      /* empty trailing shards */
        {2, {2, 2}, 2, {9, 5}, {hp_shard(0), hp_shard(0)}},   /* nested, uneven */
        {2, {2, 2}, 2, {10, 7}, {hp_shard(0), hp_shard(1)}},
        {2, {2, 4}, 3, {5, 6, 7}, {hp_replicate(), hp_shard(2)}},
        {2, {2, 2}, 2, {8, 6}, {hp_strided_shard(0, 2), hp_shard(0)}},   /* FSDP2 + TP */
        {2, {2, 2}, 2, {7, 3}, {hp_strided_shard(0, 2), hp_shard(0)}},
        {3, {2, 2, 2}, 3, {7, 6, 5}, {hp_shard(0), hp_shard(1), hp_shard(0)}},
        {3, {2, 1, 3}, 2, {1, 11}, {hp_shard(1), hp_shard(0), hp_shard(1)}},
    };
    hp_dtype_t dts[2] = {HP_F32, HP_BF16};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int s = 0; s < 3; s++)
            for (int di = 0; di < 2; di++) {
                hp_rng_key_t key = hp_rng_key(1234, "layers.0.attention.wq.weight");
                hp_tensor_t whole;
                HP_CHECK_OK(hp_tensor_malloc(&whole, dts[di], cases[c].nd, cases[c].shape));
                HP_CHECK_OK(hp_rng_fill(&whole, key, &k_specs[s], NULL, NULL));
                int total = 1;
                for (int i = 0; i < cases[c].mnd; i++) total *= (int)cases[c].ms[i];
                int64_t covered = 0;
                for (int r = 0; r < total; r++) {
                    int coord[3];
                    for (int i = cases[c].mnd - 1, q = r; i >= 0; i--) {
                        coord[i] = q % (int)cases[c].ms[i];
                        q /= (int)cases[c].ms[i];
                    }
                    int64_t ls[3], off[3];
                    hp_layout_local_shape_and_offset(cases[c].nd, cases[c].shape, cases[c].mnd, cases[c].ms,
                                                     coord, cases[c].pl, ls, off);
                    hp_tensor_t loc;
                    HP_CHECK_OK(hp_tensor_malloc(&loc, dts[di], cases[c].nd, ls));
                    HP_CHECK_OK(fill_piece(&loc, key, &k_specs[s], cases[c].nd, cases[c].shape, cases[c].mnd,
                                           cases[c].ms, coord, cases[c].pl));
                    HP_CHECK(piece_matches(&loc, &whole, cases[c].nd, cases[c].shape, cases[c].mnd,
                                           cases[c].ms, coord, cases[c].pl),
                             "case %zu spec %d %s coord %d: shard differs from the slice of the whole", c, s,
                             hp_dtype_name(dts[di]), r);
                    covered += hp_tensor_numel(&loc);
                    hp_tensor_free_data(&loc);
                }
                int replicated = 1;
                for (int i = 0; i < cases[c].mnd; i++)
                    if (cases[c].pl[i].kind == HP_REPLICATE) replicated *= (int)cases[c].ms[i];
                HP_CHECK(covered == hp_tensor_numel(&whole) * replicated, "case %zu: pieces cover the tensor", c);
                hp_tensor_free_data(&whole);
            }
}

/* 1 when the full tensor of dt (gathered over its mesh) is bitwise `whole`. */
static int gathers_to(const hp_dtensor_t *dt, const hp_tensor_t *whole) {
    hp_tensor_t full;
    void *owned = NULL;
    HP_CHECK_OK(hp_dtensor_full_tensor(&full, &owned, NULL, dt));
    const int same = hp_tensor_same_shape(&full, whole) && memcmp(full.data, whole->data, hp_tensor_nbytes(whole)) == 0;
    free(owned);
    return same;
}

/* Real shards on a 2x2 (or 2x4) mesh: fill from the global offset, full_tensor == whole. */
static void test_distributed(void) {
    int64_t ms[2] = {2, N / 2};
    hp_mesh_t m;
    HP_CHECK_OK(hp_mesh_create(W, 2, ms, (const char *[]){"dp", "tp"}, &m));
    hp_placement_t pls[4][2] = {{hp_shard(0), hp_shard(1)}, {hp_shard(0), hp_shard(0)},
                                {hp_replicate(), hp_shard(-1)}, {hp_shard(1), hp_replicate()}};
    int64_t shape[2] = {11, 7};
    for (int p = 0; p < 4; p++) {
        hp_rng_key_t key = hp_rng_key(7, "tok_embeddings.weight");
        hp_tensor_t whole;
        HP_CHECK_OK(hp_tensor_malloc(&whole, HP_F32, 2, shape));
        HP_CHECK_OK(hp_rng_fill(&whole, key, &k_specs[1], NULL, NULL));
        int64_t ls[2], off[2];
        HP_CHECK_OK(hp_dtensor_compute_local_shape_and_offset(ls, off, 2, shape, m, 2, pls[p]));
        hp_tensor_t loc;
        HP_CHECK_OK(hp_tensor_malloc(&loc, HP_F32, 2, ls));
        HP_CHECK_OK(hp_rng_fill(&loc, key, &k_specs[1], shape, off));
        hp_dtensor_t dt;
        HP_CHECK_OK(hp_dtensor_from_local(&dt, &loc, m, 2, pls[p], shape));
        HP_CHECK(gathers_to(&dt, &whole), "placements %s: gathered shards differ from the whole fill",
                 tu_pl(2, pls[p]));
        hp_tensor_free_data(&loc);
        hp_tensor_free_data(&whole);
    }
    hp_mesh_destroy(m);
}

/* hp_dtensor_rand on real meshes equals the whole draw (full_tensor), for box and strided
 * layouts; hp_dtensor_full fills only the local piece. */
static void test_factories(void) {
    int64_t ms[2] = {2, N / 2};
    hp_mesh_t m;
    HP_CHECK_OK(hp_mesh_create(W, 2, ms, NULL, &m));
    hp_placement_t pls[4][2] = {{hp_shard(0), hp_shard(1)}, {hp_shard(0), hp_shard(0)},
                                {hp_replicate(), hp_replicate()}, {hp_strided_shard(0, 2), hp_shard(0)}};
    int64_t shape[2] = {9, 5};
    hp_rng_key_t key = hp_rng_key(99, "output.weight");
    hp_tensor_t whole;
    HP_CHECK_OK(hp_tensor_malloc(&whole, HP_F32, 2, shape));
    HP_CHECK_OK(hp_rng_fill(&whole, key, &k_specs[2], NULL, NULL));
    for (int p = 0; p < 4; p++) {
        hp_dtensor_t dt;
        HP_CHECK_OK(hp_dtensor_rand(&dt, NULL, HP_F32, 2, shape, m, 2, pls[p], key, &k_specs[2]));
        HP_CHECK(gathers_to(&dt, &whole), "hp_dtensor_rand %s differs from the whole draw", tu_pl(2, pls[p]));
        hp_dtensor_free(&dt);
    }
    hp_placement_t pp[2] = {hp_partial(HP_SUM), hp_shard(0)};
    hp_dtensor_t dt;
    HP_CHECK_ERR(hp_dtensor_rand(&dt, NULL, HP_F32, 2, shape, m, 2, pp, key, &k_specs[0]), HP_ERR_INVALID_ARG,
                 "cannot be Partial");
    /* ones with [P, S0]: local pieces of ones, global value 2 (sum over the dp dim) */
    HP_CHECK_OK(hp_dtensor_full(&dt, NULL, HP_F32, 2, shape, m, 2, pp, 1.0));
    int64_t ls[2], off[2];
    HP_CHECK_OK(hp_dtensor_compute_local_shape_and_offset(ls, off, 2, shape, m, 2, pp));
    HP_CHECK(dt.local.shape[0] == ls[0] && dt.local.shape[1] == 5, "ones: local shape");
    hp_tensor_t twos;
    HP_CHECK_OK(hp_tensor_malloc(&twos, HP_F32, 2, shape));
    HP_CHECK_OK(hp_tensor_fill(&twos, 2.0));
    tu_check_full(&dt, &twos, 1, "ones with [P, S0]");
    hp_dtensor_free(&dt);
    hp_tensor_free_data(&twos);
    hp_tensor_free_data(&whole);
    hp_mesh_destroy(m);
}

int main(int argc, char **argv) {
    tu_init(&argc, &argv);
    test_virtual();
    if (N >= 4 && N % 2 == 0) {
        test_distributed();
        test_factories();
    }
    return hp_test_mpi_finish("test_rng_sharded");
}
