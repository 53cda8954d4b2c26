/* Multi-dim redistribute on 8 ranks (PyTorch's MultiDimRedistributeTest):
 * test_redistribute_shard_dim_multi_dim_mesh (2x2x2, 8x8x8, exact collective counts, equal to
 * a direct distribute) and test_multi_dim_mesh (meshes (8), (2,4), (4,2), (2,2,2); every input
 * in {R, S0, S1, P} per mesh dim to every output in {R, S0, S1}; full_tensor equals the input
 * times the product of the Partial mesh-dim sizes). */
// hp-test: ranks 8 timeout 240
#include "test_dtensor_util.h"

static hp_placement_t S(int d) { return hp_shard(d); }

static void test_shard_dim_counts(hp_mesh_t m) {
    struct { hp_placement_t src[3], dst[3]; int comms; } cases[] = {
        {{S(0), S(0), S(0)}, {S(1), S(1), S(1)}, 3},
        {{S(0), S(1), S(0)}, {S(1), S(0), S(0)}, 3},
        {{S(0), S(1), S(2)}, {S(2), S(1), S(0)}, 2},
        {{S(1), S(0), S(0)}, {hp_replicate(), S(0), S(0)}, 1},
        {{S(1), hp_replicate(), S(0)}, {hp_replicate(), S(0), S(0)}, 2},
        {{S(0), S(0), S(1)}, {S(0), S(1), S(2)}, 2},
    };
    int64_t sh[3] = {8, 8, 8}, shu[3] = {9, 5, 7};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++)
        for (int uneven = 0; uneven < 2; uneven++) {
            hp_tensor_t g = tu_global(3, uneven ? shu : sh, (int)t);
            hp_dtensor_t a, b;
            char what[96];
            snprintf(what, sizeof what, "2x2x2%s %s->%s", uneven ? " uneven" : "", tu_pl(3, cases[t].src),
                     tu_pl(3, cases[t].dst));
            tu_redistribute_vs_direct(what, &g, m, 3, cases[t].src, cases[t].dst, &a, &b);
            HP_CHECK((int)hp_comm_count_total() == cases[t].comms,
                     "%s: %d collectives, expected %d", what, (int)hp_comm_count_total(), cases[t].comms);
            hp_dtensor_free(&a), hp_dtensor_free(&b);
            hp_tensor_free_data(&g);
        }
}

static void test_multi_dim_mesh(hp_mesh_t m, const int64_t *tshape, int *ncases) {
    int mnd = hp_mesh_ndim(m);
    hp_placement_t in_opts[4] = {hp_replicate(), S(0), S(1), hp_partial(HP_SUM)};
    hp_placement_t out_opts[3] = {hp_replicate(), S(0), S(1)};
    hp_tensor_t g = tu_global(2, tshape, mnd);
    int nin = 1, nout = 1;
    for (int i = 0; i < mnd; i++) nin *= 4, nout *= 3;
    for (int ci = 0; ci < nin; ci++) {
        hp_placement_t src[3];
        float scale = 1;
        for (int i = 0, c = ci; i < mnd; i++, c /= 4) {
            src[i] = in_opts[c % 4];
            if (src[i].kind == HP_PARTIAL) scale *= (float)hp_mesh_size(m, i);
        }
        hp_dtensor_t a = tu_from_pieces(&g, m, src);
        for (int co = 0; co < nout; co++) {
            hp_placement_t dst[3];
            for (int i = 0, c = co; i < mnd; i++, c /= 3) dst[i] = out_opts[c % 3];
            hp_dtensor_t b;
            hp_status_t st = hp_dtensor_redistribute(&b, NULL, &a, mnd, dst);
            HP_CHECK(st == HP_OK, "%s -> %s: %s", tu_pl(mnd, src), tu_pl(mnd, dst), hp_last_error());
            if (st != HP_OK) continue;
            char what[96];
            snprintf(what, sizeof what, "mesh %dd %s -> %s", mnd, tu_pl(mnd, src), tu_pl(mnd, dst));
            tu_check_local(&b, &g, scale, what);
            (*ncases)++;
            hp_dtensor_free(&b);
        }
        hp_dtensor_free(&a);
    }
    hp_tensor_free_data(&g);
}

int main(int argc, char **argv) {
    tu_init(&argc, &argv);
    HP_CHECK(N == 8, "this test needs 8 ranks, got %d", N);
    if (N != 8) return hp_test_finish("test_dtensor_multidim");
    hp_mesh_t m3, m8, m24, m42;
    HP_CHECK_OK(hp_mesh_create(W, 3, (int64_t[]){2, 2, 2}, NULL, &m3));
    HP_CHECK_OK(hp_mesh_create(W, 1, (int64_t[]){8}, NULL, &m8));
    HP_CHECK_OK(hp_mesh_create(W, 2, (int64_t[]){2, 4}, NULL, &m24));
    HP_CHECK_OK(hp_mesh_create(W, 2, (int64_t[]){4, 2}, NULL, &m42));
    test_shard_dim_counts(m3);
    int n = 0;
    int64_t ts[2] = {16, 24}, tu[2] = {11, 6};
    test_multi_dim_mesh(m8, ts, &n);
    test_multi_dim_mesh(m24, ts, &n);
    test_multi_dim_mesh(m42, tu, &n);
    test_multi_dim_mesh(m3, ts, &n);
    HP_CHECK(n == 12 + 144 + 144 + 1728, "ran %d multi-dim cases", n);
    hp_mesh_destroy(m42), hp_mesh_destroy(m24), hp_mesh_destroy(m8), hp_mesh_destroy(m3);
    return hp_test_mpi_finish("test_dtensor_multidim");
}
