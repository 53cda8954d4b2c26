/* DeviceMesh conformance (PyTorch's test/distributed/test_device_mesh.py): row-major layout,
 * per-dim groups (checked against the real communicators), coordinates and local ranks, slicing by
 * names sharing the parent's groups, flatten, concatenation of slices, from_comm, str, equality, ranks outside the
 * mesh, and PyTorch's errors. */
// hp-test: ranks 4 8
#include <stdio.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/mesh.h"

static hp_comm_t W;
static int R, N;

/* The members of this rank's group on every dim, from the layout and from the communicator
 * (all_gather of world ranks), must agree; the comm rank must be the coordinate. */
static void check_groups(hp_mesh_t m, const char *what) {
    int coord[HP_MESH_MAX_DIMS];
    if (!hp_mesh_get_coordinate(m, coord)) return;
    for (int d = 0; d < hp_mesh_ndim(m); d++) {
        int expect[64], got[64];
        int n = hp_mesh_group_ranks(m, d, expect);
        hp_comm_t c = hp_mesh_get_comm(m, d);
        HP_CHECK(c != NULL && hp_comm_size(c) == n, "%s dim %d: comm size", what, d);
        if (!c) continue;
        HP_CHECK(hp_comm_rank(c) == coord[d] && hp_mesh_get_local_rank(m, d) == coord[d],
                 "%s dim %d: group rank %d, coordinate %d", what, d, hp_comm_rank(c), coord[d]);
        int me = hp_comm_rank(W);
        HP_CHECK_OK(hp_all_gather(&me, got, 1, HP_I32, c, NULL));
        for (int i = 0; i < n; i++)
            HP_CHECK(got[i] == expect[i], "%s dim %d: member %d is rank %d, layout says %d", what, d,
                     i, got[i], expect[i]);
    }
}

static void expect_group(hp_mesh_t m, int d, int n, const int *ranks, const char *what) {
    int got[64];
    int k = hp_mesh_group_ranks(m, d, got);
    HP_CHECK(k == n, "%s: group size %d, expected %d", what, k, n);
    for (int i = 0; i < n && i < k; i++)
        HP_CHECK(got[i] == ranks[i], "%s: member %d is %d, expected %d", what, i, got[i], ranks[i]);
}

static void test_2d(void) {
    /* test_device_mesh_2d: [[0,1],[2,3]]: dim0 groups {0,2},{1,3}; dim1 groups {0,1},{2,3} */
    int64_t shape[2] = {2, 2};
    const char *names[2] = {"dp", "tp"};
    hp_mesh_t m;
    HP_CHECK_OK(hp_mesh_create(W, 2, shape, names, &m));
    int coord[2];
    int in = hp_mesh_get_coordinate(m, coord);
    HP_CHECK(in == (R < 4), "rank %d in 2x2 mesh: %d", R, in);
    if (in) {
        HP_CHECK(coord[0] == R / 2 && coord[1] == R % 2, "coordinate (%d,%d)", coord[0], coord[1]);
        int g0[2] = {R % 2, R % 2 + 2}, g1[2] = {2 * (R / 2), 2 * (R / 2) + 1};
        expect_group(m, 0, 2, g0, "2x2 dim0");
        expect_group(m, 1, 2, g1, "2x2 dim1");
        check_groups(m, "2x2");
    } else {
        /* ranks outside the mesh: no coordinate, no communicators */
        HP_CHECK(hp_mesh_get_comm(m, 0) == NULL && hp_mesh_get_local_rank(m, 1) == -1,
                 "outside rank has no groups");
    }
    char buf[128];
    hp_mesh_str(m, buf, sizeof buf);
    HP_CHECK(strcmp(buf, "DeviceMesh((dp=2, tp=2), ranks [[0,1],[2,3]])") == 0, "str '%s'", buf);
    HP_CHECK(hp_mesh_size(m, -1) == 4 && hp_mesh_size(m, 1) == 2 && hp_mesh_ndim(m) == 2, "sizes");
    int c11[2] = {1, 1}, bad[2] = {2, 0};
    HP_CHECK(hp_mesh_rank_at(m, c11) == 3 && hp_mesh_rank_at(m, bad) == -1, "rank_at");
    int di = -1;
    HP_CHECK_OK(hp_mesh_dim_index(m, "tp", &di));
    HP_CHECK(di == 1, "dim_index tp");
    /* test_raises_invalid_mesh_dim_name: KeyError listing the valid names */
    HP_CHECK_ERR(hp_mesh_dim_index(m, "cp", &di), HP_ERR_NOT_FOUND,
                 "Valid mesh_dim_names are ('dp', 'tp')");
    hp_mesh_t s;
    const char *bad_names[1] = {"pp"};
    HP_CHECK_ERR(hp_mesh_slice(m, 1, bad_names, &s), HP_ERR_NOT_FOUND, "Invalid mesh_dim_names");
    /* test_device_mesh_hash: equal layouts are equal, different ones differ */
    hp_mesh_t m2, m3;
    HP_CHECK_OK(hp_mesh_create(W, 2, shape, names, &m2));
    int64_t shape41[2] = {4, 1};
    HP_CHECK_OK(hp_mesh_create(W, 2, shape41, names, &m3));
    HP_CHECK(hp_mesh_equal(m, m2) && !hp_mesh_equal(m, m3), "mesh equality");
    check_groups(m3, "4x1");
    hp_mesh_destroy(m3);
    hp_mesh_destroy(m2);
    hp_mesh_destroy(m);
}

static void test_errors(void) {
    hp_mesh_t m = NULL;
    int64_t shape[2] = {2, 2};
    const char *dup[2] = {"dp", "dp"};
    HP_CHECK_ERR(hp_mesh_create(W, 2, shape, dup, &m), HP_ERR_INVALID_ARG, "Each mesh_dim_name must be unique.");
    const char *one[1] = {"dp"};
    HP_CHECK_ERR(hp_mesh_create_n(W, 2, shape, 1, one, &m), HP_ERR_INVALID_ARG,
                 "mesh_shape and mesh_dim_names should have same length!");
    int64_t big[1] = {N + 1};
    HP_CHECK_ERR(hp_mesh_create(W, 1, big, NULL, &m), HP_ERR_INVALID_ARG,
                 "Mesh should not be bigger than default world size");
    int64_t zero[2] = {2, 0};
    HP_CHECK_ERR(hp_mesh_create(W, 2, zero, NULL, &m), HP_ERR_INVALID_ARG, "mesh_shape[1] = 0");
    HP_CHECK_ERR(hp_mesh_create(W, 0, shape, NULL, &m), HP_ERR_INVALID_ARG, "expected 1..8");
    HP_CHECK(m == NULL, "no mesh on error");
    /* slicing an unnamed mesh */
    HP_CHECK_OK(hp_mesh_create(W, 2, shape, NULL, &m));
    hp_mesh_t s;
    HP_CHECK_ERR(hp_mesh_slice(m, 1, one, &s), HP_ERR_NOT_FOUND, "Cannot slice a DeviceMesh without mesh_dim_names!");
    char buf[96];
    HP_CHECK(strcmp(hp_mesh_str(m, buf, sizeof buf), "DeviceMesh((2, 2), ranks [[0,1],[2,3]])") == 0,
             "unnamed str '%s'", buf);
    HP_CHECK(hp_mesh_dim_name(m, 0) == NULL, "unnamed dim name");
    hp_mesh_destroy(m);
    HP_CHECK_OK(hp_mesh_create(W, 2, shape, (const char *[]){"dp", "tp"}, &m));
    const char *twice[2] = {"dp", "dp"};
    HP_CHECK_ERR(hp_mesh_slice(m, 2, twice, &s), HP_ERR_INVALID_ARG, "given twice");
    hp_mesh_destroy(m);
}

static void test_8(void) {
    /* test_init_device_mesh: equals DeviceMesh(arange(8).view(2,4)); test_get_item: the TP
     * sub-mesh of rank r is row r//4, the DP sub-mesh is column r%4, sharing the groups. */
    int64_t shape[2] = {2, 4};
    const char *names[2] = {"dp", "tp"};
    hp_mesh_t m, tp, dp;
    HP_CHECK_OK(hp_mesh_create(W, 2, shape, names, &m));
    char buf[128];
    hp_mesh_str(m, buf, sizeof buf);
    HP_CHECK(strcmp(buf, "DeviceMesh((dp=2, tp=4), ranks [[0,1,2,3],[4,5,6,7]])") == 0, "str '%s'", buf);
    for (int i = 0; i < 8; i++) {
        int c[2] = {i / 4, i % 4};
        HP_CHECK(hp_mesh_rank_at(m, c) == i, "arange layout at %d", i);
    }
    check_groups(m, "2x4");
    const char *ntp[1] = {"tp"}, *ndp[1] = {"dp"};
    HP_CHECK_OK(hp_mesh_slice(m, 1, ntp, &tp));
    HP_CHECK_OK(hp_mesh_slice(m, 1, ndp, &dp));
    int row[4], col[2] = {R % 4, R % 4 + 4};
    for (int i = 0; i < 4; i++) row[i] = 4 * (R / 4) + i;
    expect_group(tp, 0, 4, row, "tp sub-mesh");
    expect_group(dp, 0, 2, col, "dp sub-mesh");
    HP_CHECK(hp_mesh_get_comm(tp, 0) == hp_mesh_get_comm(m, 1) && hp_mesh_get_comm(dp, 0) == hp_mesh_get_comm(m, 0),
             "test_get_group: sub-mesh groups are the parent's");
    HP_CHECK(strcmp(hp_mesh_dim_name(tp, 0), "tp") == 0 && hp_mesh_get_local_rank(tp, 0) == R % 4, "tp names/rank");
    /* test_get_item_1d: slicing a 1-D mesh by its own name gives the same mesh */
    hp_mesh_t tp2;
    HP_CHECK_OK(hp_mesh_slice(tp, 1, ntp, &tp2));
    HP_CHECK(hp_mesh_equal(tp, tp2), "1-d slice of itself");
    hp_mesh_destroy(tp2);
    hp_mesh_destroy(tp);
    hp_mesh_destroy(dp);
    hp_mesh_destroy(m);

    /* test_device_mesh_nd (2x2x2), 3-D slicing and flatten */
    int64_t s3[3] = {2, 2, 2};
    const char *n3[3] = {"pp", "dp", "tp"};
    HP_CHECK_OK(hp_mesh_create(W, 3, s3, n3, &m));
    check_groups(m, "2x2x2");
    int p = R / 4, d = (R / 2) % 2, t = R % 2;
    int g0[2] = {2 * d + t, 4 + 2 * d + t}, g1[2] = {4 * p + t, 4 * p + 2 + t}, g2[2] = {4 * p + 2 * d, 4 * p + 2 * d + 1};
    expect_group(m, 0, 2, g0, "3d dim0");
    expect_group(m, 1, 2, g1, "3d dim1");
    expect_group(m, 2, 2, g2, "3d dim2");
    hp_mesh_t sub, flat, flat2, flat3, rev;
    const char *dptp[2] = {"dp", "tp"}, *tpdp[2] = {"tp", "dp"}, *pptp[2] = {"pp", "tp"};
    HP_CHECK_OK(hp_mesh_slice(m, 2, dptp, &sub));
    snprintf(buf, sizeof buf, "DeviceMesh((dp=2, tp=2), ranks [[%d,%d],[%d,%d]])", 4 * p, 4 * p + 1, 4 * p + 2, 4 * p + 3);
    char got[128];
    HP_CHECK(strcmp(hp_mesh_str(sub, got, sizeof got), buf) == 0, "3d slice '%s' expected '%s'", got, buf);
    check_groups(sub, "3d slice");
    HP_CHECK_OK(hp_mesh_slice(m, 2, tpdp, &rev));
    snprintf(buf, sizeof buf, "DeviceMesh((tp=2, dp=2), ranks [[%d,%d],[%d,%d]])", 4 * p, 4 * p + 2, 4 * p + 1, 4 * p + 3);
    HP_CHECK(strcmp(hp_mesh_str(rev, got, sizeof got), buf) == 0, "reordered slice '%s' expected '%s'", got, buf);
    check_groups(rev, "reordered slice");
    HP_CHECK_OK(hp_mesh_flatten(m, 2, dptp, NULL, &flat));
    int gf[4] = {4 * p, 4 * p + 1, 4 * p + 2, 4 * p + 3};
    expect_group(flat, 0, 4, gf, "flatten dp,tp");
    HP_CHECK(strcmp(hp_mesh_dim_name(flat, 0), "dp_tp") == 0, "flatten default name");
    check_groups(flat, "flatten dp,tp");
    HP_CHECK_OK(hp_mesh_flatten(m, 2, pptp, "pp_tp", &flat2));
    int gf2[4] = {2 * d, 2 * d + 1, 4 + 2 * d, 4 + 2 * d + 1};
    expect_group(flat2, 0, 4, gf2, "flatten pp,tp");
    check_groups(flat2, "flatten pp,tp");
    HP_CHECK_OK(hp_mesh_flatten(sub, 2, dptp, "x", &flat3));   /* flatten of a slice */
    expect_group(flat3, 0, 4, gf, "flatten of slice");
    check_groups(flat3, "flatten of slice");
    /* _concatenate (FSDP over TP's SPMD mesh): m["dp"] + m["tp"] == m["dp", "tp"], in either
     * order, with the slices' communicators; m["pp"] + flatten("dp_tp") covers all 8 ranks */
    hp_mesh_t sdp, stp, spp, cat, cat2, cat3;
    const char *ndp1[1] = {"dp"}, *ntp1[1] = {"tp"}, *npp1[1] = {"pp"};
    HP_CHECK_OK(hp_mesh_slice(m, 1, ndp1, &sdp));
    HP_CHECK_OK(hp_mesh_slice(m, 1, ntp1, &stp));
    HP_CHECK_OK(hp_mesh_slice(m, 1, npp1, &spp));
    HP_CHECK_OK(hp_mesh_concat(sdp, stp, &cat));
    HP_CHECK(cat && hp_mesh_equal(cat, sub), "concat dp + tp equals the (dp, tp) slice: %s",
             cat ? hp_mesh_str(cat, got, sizeof got) : "NULL");
    HP_CHECK(cat && hp_mesh_get_comm(cat, 1) == hp_mesh_get_comm(m, 2), "concat shares the tp communicator");
    HP_CHECK_OK(hp_mesh_concat(stp, sdp, &cat2));
    HP_CHECK(cat2 && hp_mesh_equal(cat2, rev), "concat tp + dp equals the (tp, dp) slice");
    HP_CHECK_OK(hp_mesh_concat(spp, flat, &cat3));
    int full8[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    if (cat3) {
        HP_CHECK(hp_mesh_size(cat3, -1) == 8 && hp_mesh_size(cat3, 1) == 4, "concat pp + dp_tp shape");
        int c[2] = {0, 0}, ok = 1;
        for (int i = 0; i < 8; i++) {
            c[0] = i / 4, c[1] = i % 4;
            ok &= hp_mesh_rank_at(cat3, c) == full8[i];
        }
        HP_CHECK(ok, "concat pp + dp_tp layout is arange(8)");
        check_groups(cat3, "concat pp + dp_tp");
    }
    hp_mesh_t bad = NULL, other = NULL, ow = NULL;
    HP_CHECK_ERR(hp_mesh_concat(sdp, sub, &bad), HP_ERR_INVALID_ARG, "share a dim");
    HP_CHECK_ERR(hp_mesh_concat(sdp, flat, &bad), HP_ERR_INVALID_ARG, "share a dim");
    HP_CHECK_OK(hp_mesh_from_comm(W, "world", &ow));
    int64_t s2[2] = {4, 2};
    const char *n2[2] = {"a", "b"};
    HP_CHECK_OK(hp_mesh_create(W, 2, s2, n2, &other));
    HP_CHECK_ERR(hp_mesh_concat(sdp, ow, &bad), HP_ERR_INVALID_ARG, "not slices of one DeviceMesh");
    HP_CHECK_ERR(hp_mesh_concat(other, stp, &bad), HP_ERR_INVALID_ARG, "not slices of one DeviceMesh");
    HP_CHECK(bad == NULL, "failed concat leaves out NULL");
    hp_mesh_destroy(other);
    hp_mesh_destroy(ow);
    hp_mesh_destroy(cat3);
    hp_mesh_destroy(cat2);
    hp_mesh_destroy(cat);
    hp_mesh_destroy(spp);
    hp_mesh_destroy(stp);
    hp_mesh_destroy(sdp);
    hp_mesh_destroy(flat3);
    hp_mesh_destroy(flat2);
    hp_mesh_destroy(flat);
    hp_mesh_destroy(rev);
    hp_mesh_destroy(sub);
    hp_mesh_destroy(m);
}

static void test_from_comm(void) {
    hp_mesh_t m;
    HP_CHECK_OK(hp_mesh_from_comm(W, "world", &m));
    HP_CHECK(hp_mesh_size(m, 0) == N && hp_mesh_get_local_rank(m, 0) == R && hp_mesh_get_comm(m, 0) == W,
             "from_comm mesh");
    check_groups(m, "from_comm");
    hp_mesh_destroy(m);
}

int main(int argc, char **argv) {
    W = hp_test_mpi_init(&argc, &argv, &R, &N);
    test_errors();
    test_2d();
    test_from_comm();
    if (N == 8) test_8();
    return hp_test_mpi_finish("test_mesh");
}
