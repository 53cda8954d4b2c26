/* Randomized redistribute (acceptance 2): a fixed seed draws 240 cases of random shapes
 * (1-3 dims, sizes 0..9 so uneven, empty and size-1 dims all occur), random 1-D, 2-D and 3-D
 * meshes over up to 8 ranks (some leave ranks outside the mesh), random source placements
 * including Partial(sum/avg/max/min) and random targets; full_tensor of the result must equal
 * the one-rank ground truth, and the local piece must be the layout's slice of it. Each case
 * also runs in arena mode, whose peak must equal hp_dtensor_redistribute_scratch's size. */
// hp-test: ranks 8 timeout 240
#include <math.h>

#include "test_dtensor_util.h"

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static int rnd(int n) {   /* same sequence on every rank */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int)((rng_state >> 33) % (uint64_t)n);
}

#define NMESH 13
static const int mesh_nd[NMESH] = {1, 2, 2, 2, 2, 3, 3, 3, 3, 2, 2, 1, 3};
static const int64_t mesh_sh[NMESH][3] = {{8}, {2, 4}, {4, 2}, {8, 1}, {1, 8}, {2, 2, 2}, {2, 4, 1},
                                          {1, 2, 4}, {4, 1, 2}, {2, 3}, {3, 2}, {7}, {2, 1, 3}};

static int close_to(float got, double want) { return fabs(got - want) <= 1e-5 * (1 + fabs(want)); }

int main(int argc, char **argv) {
    tu_init(&argc, &argv);
    HP_CHECK(N == 8, "this test needs 8 ranks, got %d", N);
    if (N != 8) return hp_test_finish("test_dtensor_random");
    hp_mesh_t meshes[NMESH];
    for (int i = 0; i < NMESH; i++) HP_CHECK_OK(hp_mesh_create(W, mesh_nd[i], mesh_sh[i], NULL, &meshes[i]));
    hp_redop_t pops[4] = {HP_SUM, HP_AVG, HP_MAX, HP_MIN};
    int ncases = 240, nfail_cases = 0;
    long long kinds[4] = {0};   /* counts of R, S, P sources and of Partial-keeping targets */
    for (int t = 0; t < ncases; t++) {
        int mi = rnd(NMESH), mnd = mesh_nd[mi];
        hp_mesh_t m = meshes[mi];
        int nd = 1 + rnd(3);
        int64_t shape[3];
        for (int d = 0; d < nd; d++) shape[d] = rnd(10);
        hp_tensor_t g = tu_global(nd, shape, t);
        hp_placement_t src[3], dst[3];
        double scale = 1;
        for (int i = 0; i < mnd; i++) {
            int k = rnd(3);
            if (k == 0) src[i] = hp_replicate(), kinds[0]++;
            else if (k == 1) src[i] = hp_shard(rnd(nd) - (rnd(2) ? nd : 0)), kinds[1]++;   /* incl. negative dims */
            else {
                src[i] = hp_partial(pops[rnd(4)]), kinds[2]++;
                int64_t ks = mesh_sh[mi][i];
                if (src[i].reduce_op == HP_SUM) scale *= (double)(ks * (ks + 1) / 2);
                if (src[i].reduce_op == HP_AVG) scale *= (double)(ks + 1) / 2.0;
            }
        }
        for (int i = 0; i < mnd; i++) {
            int k = rnd(3);
            if (src[i].kind == HP_PARTIAL && rnd(3) == 0) dst[i] = src[i], kinds[3]++;
            else if (k == 0) dst[i] = hp_replicate();
            else dst[i] = hp_shard(rnd(nd));
        }
        /* Pieces: the layout slice of g, times (c+1) on sum/avg Partial dims (so the reduction
         * matters), identical on max/min dims; the global value is scale * g. */
        hp_placement_t srcn[3];
        for (int i = 0; i < mnd; i++) HP_CHECK_OK(hp_placement_normalize(&srcn[i], src[i], nd));
        hp_dtensor_t a = tu_from_pieces(&g, m, srcn), b;
        int coord[3];
        if (hp_mesh_get_coordinate(m, coord)) {
            double w = 1;
            for (int i = 0; i < mnd; i++)
                if (src[i].kind == HP_PARTIAL && (src[i].reduce_op == HP_SUM || src[i].reduce_op == HP_AVG))
                    w *= coord[i] + 1;
            for (int64_t e = 0; e < hp_tensor_numel(&a.local); e++)
                ((float *)a.local.data)[e] *= (float)w;
        }
        char what[160];
        snprintf(what, sizeof what, "case %d: shape %dd (%lld,%lld,%lld) mesh #%d %s -> %s", t, nd,
                 (long long)shape[0], (long long)(nd > 1 ? shape[1] : -1), (long long)(nd > 2 ? shape[2] : -1),
                 mi, tu_pl(mnd, src), tu_pl(mnd, dst));
        /* arena mode first, in an arena sized exactly as dtensor.h promises: result =
         * hp_arena_round(bytes of the target local shape) plus the predicted scratch. Every
         * rank must succeed (an empty piece or a rank outside the mesh included: they used to
         * take 64 uncounted bytes and fail with OOM alone) and peak at exactly that size. */
        {
            size_t pred = 0;
            hp_dtensor_t c;
            HP_CHECK_OK(hp_dtensor_redistribute_scratch(&pred, &a, mnd, dst));
            int64_t ls[3], off[3], numel = 1;
            HP_CHECK_OK(hp_dtensor_compute_local_shape_and_offset(ls, off, nd, shape, m, mnd, dst));
            for (int d = 0; d < nd; d++) numel *= ls[d];
            size_t res = hp_arena_round((size_t)numel * hp_dtype_size(a.local.dtype));
            hp_arena_t exact;
            HP_CHECK_OK(hp_arena_init(&exact, "redistribute-exact", res + pred));
            hp_dtensor_mem_t am = {&exact, NULL, 0};
            hp_clear_error();
            hp_status_t ast = hp_dtensor_redistribute(&c, &am, &a, mnd, dst);
            HP_CHECK(ast == HP_OK && exact.peak == res + pred && exact.used == res,
                     "%s: arena of result %zu + scratch %zu: %s '%s', peak %zu, used after %zu", what, res,
                     pred, hp_status_string(ast), hp_last_error(), exact.peak, exact.used);
            int32_t mine = ast == HP_OK, all = 0;
            HP_CHECK_OK(hp_all_reduce(&mine, &all, 1, HP_I32, HP_MIN, W, NULL));
            HP_CHECK(all == 1, "%s: some rank's exactly sized arena-mode redistribute failed", what);
            hp_arena_free(&exact);
        }
        hp_status_t st = hp_dtensor_redistribute(&b, NULL, &a, mnd, dst);
        HP_CHECK(st == HP_OK, "%s: %s", what, hp_last_error());
        if (st == HP_OK) {
            int ok = 1;
            hp_tensor_t full;
            void *owned = NULL;
            HP_CHECK_OK(hp_dtensor_full_tensor(&full, &owned, NULL, &b));
            if (hp_mesh_contains_self(m)) {
                ok &= hp_tensor_same_shape(&full, &g);
                for (int64_t e = 0; ok && e < hp_tensor_numel(&g); e++)
                    ok &= close_to(((float *)full.data)[e], scale * ((float *)g.data)[e]);
                /* the local piece is the layout's slice (when no Partial remains) */
                int has_p = 0;
                for (int i = 0; i < mnd; i++) has_p |= dst[i].kind == HP_PARTIAL;
                int64_t ls[3], off[3];
                HP_CHECK_OK(hp_dtensor_compute_local_shape_and_offset(ls, off, nd, shape, m, mnd, b.placements));
                for (int d = 0; d < nd; d++) ok &= ls[d] == b.local.shape[d];
                if (!has_p && ok) {
                    int64_t idx[3] = {0};
                    for (int64_t e = 0; e < hp_tensor_numel(&b.local); e++) {
                        ok &= close_to(((float *)b.local.data)[e], scale * tu_at(&g, idx, off));
                        for (int d = nd - 1; d >= 0; d--) {
                            if (++idx[d] < ls[d]) break;
                            idx[d] = 0;
                        }
                    }
                }
            } else {
                ok &= hp_tensor_numel(&full) == 0 && hp_tensor_numel(&b.local) == 0;
            }
            HP_CHECK(ok, "%s: full_tensor or local piece differs from the ground truth", what);
            nfail_cases += !ok;
            free(owned);
            hp_dtensor_free(&b);
        }
        hp_dtensor_free(&a);
        hp_tensor_free_data(&g);
    }
    if (R == 0)
        printf("test_dtensor_random: %d cases (%d failed); source placements R %lld, S %lld, P %lld; "
               "targets keeping Partial %lld\n", ncases, nfail_cases, kinds[0], kinds[1], kinds[2], kinds[3]);
    for (int i = 0; i < NMESH; i++) hp_mesh_destroy(meshes[i]);
    return hp_test_mpi_finish("test_dtensor_random");
}
