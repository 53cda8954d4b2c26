/* DTensor construction API and ops (PyTorch's test/distributed/tensor/test_api.py / test_dtensor.py):
 * distribute_tensor (scatter / broadcast counts, src_data_rank, local split, uneven shards,
 * errors), from_local (shape inference, given shapes, errors), to_local, full_tensor, and the
 * sharding rules of add, mul, matmul and sum with their collective counts. */
// hp-test: ranks 4 8 timeout 120
#include "test_dtensor_util.h"

static hp_mesh_t M1, M2;
static hp_placement_t S(int d) { return hp_shard(d); }
static hp_placement_t Rp(void) { return hp_replicate(); }
static hp_placement_t P(void) { return hp_partial(HP_SUM); }

static void expect_scatter_bcast(hp_mesh_t m, const char *what, int scatter, int bcast) {
    if (!hp_mesh_contains_self(m)) scatter = bcast = 0;
    int sc = (int)hp_comm_count(HP_COMM_SCATTER), bc = (int)hp_comm_count(HP_COMM_BROADCAST),
        tot = (int)hp_comm_count_total();
    HP_CHECK(sc == scatter && bc == bcast && tot == scatter + bcast,
             "%s: scatter %d broadcast %d total %d, expected %d %d", what, sc, bc, tot, scatter, bcast);
}

static void test_distribute(void) {
    /* test_distribute_tensor_rank */
    int64_t sh[2] = {12, 3};
    hp_tensor_t g = tu_global(2, sh, 0);
    hp_placement_t s0 = S(0), sm1 = S(-1), r = Rp();
    hp_dtensor_t a;
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g, M1, 1, &s0, 0));
    expect_scatter_bcast(M1, "distribute S0", 1, 0);
    if (N == 4) HP_CHECK(a.local.shape[0] == 3 && a.local.shape[1] == 3, "local (3,3) from (12,3)");
    tu_check_local(&a, &g, 1, "distribute S0");
    hp_dtensor_free(&a);
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g, M1, 1, &sm1, 0));
    HP_CHECK(a.placements[0].dim == 1, "Shard(-1) -> Shard(1)");
    tu_check_local(&a, &g, 1, "distribute S(-1)");
    hp_dtensor_free(&a);
    /* src_data_rank: every rank passes different data; the result is rank 1's */
    hp_tensor_t mine = tu_global(2, sh, 100 + R), r1 = tu_global(2, sh, 101);
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &mine, M1, 1, &s0, 1));
    tu_check_full(&a, &r1, 1, "src_data_rank=1 gives rank 1's data");
    hp_dtensor_free(&a);
    /* src_data_rank = -1 (None): local split of each rank's own data, 0 comms */
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &mine, M1, 1, &s0, -1));
    expect_scatter_bcast(M1, "src_data_rank=None", 0, 0);
    tu_check_local(&a, &mine, 1, "src_data_rank=None piece of own data");
    hp_dtensor_free(&a);
    /* test_broadcast_1d: Replicate broadcasts from coordinate 0 */
    hp_comm_counts_reset();
    hp_tensor_t r0 = tu_global(2, sh, 100);
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &mine, M1, 1, &r, 0));
    expect_scatter_bcast(M1, "distribute R", 0, 1);
    tu_check_local(&a, &r0, 1, "broadcast from rank 0");
    hp_dtensor_free(&a);
    hp_tensor_free_data(&mine), hp_tensor_free_data(&r1), hp_tensor_free_data(&r0);
    /* test_scatter_uneven and test_distribute_tensor_uneven_sharding: missing chunks empty */
    int64_t uneven[6][3] = {{5, 3, 2}, {1, 3, 2}, {13, 3, 2}, {3, 14, 2}, {2, 3, 13}, {3, 2, 14}};
    for (int t = 0; t < 6; t++)
        for (int d = 0; d < 3; d++) {
            hp_tensor_t x = tu_global(3, uneven[t], t);
            hp_placement_t sd = S(d);
            hp_dtensor_t u;
            hp_comm_counts_reset();
            HP_CHECK_OK(hp_dtensor_distribute(&u, NULL, &x, M1, 1, &sd, 0));
            char what[64];
            snprintf(what, sizeof what, "uneven (%lld,%lld,%lld) S(%d)", (long long)uneven[t][0],
                     (long long)uneven[t][1], (long long)uneven[t][2], d);
            expect_scatter_bcast(M1, what, 1, 0);
            tu_check_local(&u, &x, 1, what);
            int64_t sz, off;
            hp_shard_size_and_offset(uneven[t][d], N, R, &sz, &off);
            HP_CHECK(u.local.shape[d] == sz, "%s: torch.chunk size %lld", what, (long long)sz);
            hp_dtensor_free(&u);
            hp_tensor_free_data(&x);
        }
    /* 2x2: one collective per mesh dim */
    hp_placement_t p01[2] = {S(0), S(1)}, pr0[2] = {Rp(), S(0)}, pnn[2] = {S(0), S(0)};
    int64_t sh2[2] = {9, 7};
    hp_tensor_t g2 = tu_global(2, sh2, 9);
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g2, M2, 2, p01, 0));
    expect_scatter_bcast(M2, "2x2 [S0,S1]", 2, 0);
    tu_check_local(&a, &g2, 1, "2x2 [S0,S1]");
    hp_dtensor_free(&a);
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g2, M2, 2, pr0, 0));
    expect_scatter_bcast(M2, "2x2 [R,S0]", 1, 1);
    tu_check_local(&a, &g2, 1, "2x2 [R,S0]");
    hp_dtensor_free(&a);
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g2, M2, 2, pnn, 1));
    tu_check_local(&a, &g2, 1, "2x2 [S0,S0] nested from src 1");
    hp_dtensor_free(&a);
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g2, M2, 2, pnn, -1));
    tu_check_local(&a, &g2, 1, "2x2 [S0,S0] local split");
    hp_dtensor_free(&a);
    /* a mesh dim of size 1 still issues its (one-rank) collective, as PyTorch's
     * mesh_scatter / mesh_broadcast do */
    {
        hp_mesh_t m41;
        HP_CHECK_OK(hp_mesh_create(W, 2, (int64_t[]){4, 1}, NULL, &m41));
        hp_comm_counts_reset();
        HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g2, m41, 2, p01, 0));
        expect_scatter_bcast(m41, "(4,1) [S0,S1]", 2, 0);
        tu_check_full(&a, &g2, 1, "(4,1) [S0,S1]");
        hp_dtensor_free(&a);
        hp_placement_t rr[2] = {Rp(), Rp()};
        hp_comm_counts_reset();
        HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g2, m41, 2, rr, 0));
        expect_scatter_bcast(m41, "(4,1) [R,R]", 0, 2);
        hp_dtensor_free(&a);
        hp_mesh_destroy(m41);
    }
    /* _StridedShard: the FSDP2 + TP layout; scatter and local split give the same pieces
     * and full_tensor (all_gather + permute) gives the input back */
    hp_placement_t st[2] = {hp_strided_shard(0, 2), S(0)};
    int64_t sh8[2] = {8, 3};
    hp_tensor_t g8 = tu_global(2, sh8, 4);
    hp_dtensor_t b;
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g8, M2, 2, st, 0));
    HP_CHECK_OK(hp_dtensor_distribute(&b, NULL, &g8, M2, 2, st, -1));
    HP_CHECK(hp_tensor_same_shape(&a.local, &b.local) &&
             memcmp(a.local.data, b.local.data, hp_tensor_nbytes(&a.local)) == 0, "strided scatter == local split");
    int coord[2];
    if (hp_mesh_get_coordinate(M2, coord)) {
        int first = (int)(coord[1] * 4 + coord[0] * 2);   /* rows 0-1, 4-5, 2-3, 6-7 */
        HP_CHECK(a.local.shape[0] == 2 && ((float *)a.local.data)[0] == ((float *)g8.data)[first * 3],
                 "strided rows start at %d", first);
    }
    tu_check_full(&a, &g8, 1, "strided full_tensor");
    {   /* arena sizing of the strided transitions is exact too */
        hp_placement_t rr[2] = {Rp(), Rp()}, back[2] = {hp_strided_shard(0, 2), S(0)};
        hp_arena_t ar;
        HP_CHECK_OK(hp_arena_init(&ar, "strided", 1 << 16));
        hp_dtensor_mem_t am = {&ar, NULL, 0};
        hp_dtensor_t c, d;
        size_t pred = 0;
        HP_CHECK_OK(hp_dtensor_redistribute_scratch(&pred, &a, 2, rr));
        HP_CHECK_OK(hp_dtensor_redistribute(&c, &am, &a, 2, rr));
        size_t res = hp_arena_round(hp_tensor_nbytes(&c.local))   /* as dtensor.h says: 0 when empty */;
        HP_CHECK(ar.peak == res + pred, "strided -> R: arena peak %zu, predicted %zu + %zu", ar.peak, res, pred);
        size_t mark = ar.used;
        ar.peak = mark;
        HP_CHECK_OK(hp_dtensor_redistribute_scratch(&pred, &c, 2, back));
        HP_CHECK_OK(hp_dtensor_redistribute(&d, &am, &c, 2, back));
        res = hp_arena_round(hp_tensor_nbytes(&d.local));
        HP_CHECK(ar.peak == mark + res + pred, "R -> strided: arena peak %zu, predicted %zu + %zu + %zu", ar.peak,
                 mark, res, pred);
        tu_check_local(&d, &g8, 1, "R -> strided local selection");
        hp_arena_free(&ar);
    }
    hp_dtensor_free(&a), hp_dtensor_free(&b);
    hp_tensor_free_data(&g8);
    /* errors */
    hp_placement_t two[2] = {S(0), S(0)}, part = P(), bad = S(2);
    HP_CHECK_ERR(hp_dtensor_distribute(&a, NULL, &g, M1, 2, two, 0), HP_ERR_INVALID_ARG, "must have the same length");
    HP_CHECK_ERR(hp_dtensor_distribute(&a, NULL, &g, M1, 1, &part, 0), HP_ERR_INVALID_ARG,
                 "Trying to distribute tensor with unsupported placements");
    HP_CHECK_ERR(hp_dtensor_distribute(&a, NULL, &g, M1, 1, &bad, 0), HP_ERR_INVALID_ARG, "out of range");
    HP_CHECK_ERR(hp_dtensor_distribute(&a, NULL, &g, M1, 1, &s0, N), HP_ERR_INVALID_ARG, "src_data_rank");
    hp_tensor_free_data(&g2);
    hp_tensor_free_data(&g);
}

static void test_from_local(void) {
    int64_t ls[2] = {3, 3};
    hp_tensor_t loc = tu_global(2, ls, R);
    hp_placement_t s0 = S(0), r = Rp(), p = P();
    hp_dtensor_t a;
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_from_local(&a, &loc, M1, 1, &s0, NULL));
    HP_CHECK(hp_comm_count_total() == 0, "from_local makes no communication");
    HP_CHECK(a.global_shape[0] == 3 * N && a.global_shape[1] == 3, "inferred global (3N, 3)");
    hp_tensor_t back = hp_dtensor_to_local(&a);
    HP_CHECK(back.data == loc.data, "to_local returns the local piece");
    /* full_tensor is the concatenation of every rank's piece */
    int64_t gs[2] = {3 * N, 3};
    hp_tensor_t expect;
    HP_CHECK_OK(hp_tensor_malloc(&expect, HP_F32, 2, gs));
    for (int q = 0; q < N; q++) {
        hp_tensor_t piece = tu_global(2, ls, q);
        memcpy((float *)expect.data + q * 9, piece.data, 9 * sizeof(float));
        hp_tensor_free_data(&piece);
    }
    tu_check_full(&a, &expect, 1, "from_local S0 full_tensor");
    HP_CHECK_OK(hp_dtensor_from_local(&a, &loc, M1, 1, &r, NULL));
    HP_CHECK(a.global_shape[0] == 3, "Replicate keeps the local shape");
    /* Partial: full_tensor sums the pieces */
    hp_tensor_t sum;
    HP_CHECK_OK(hp_tensor_malloc(&sum, HP_F32, 2, ls));
    for (int q = 0; q < N; q++) {
        hp_tensor_t piece = tu_global(2, ls, q);
        for (int i = 0; i < 9; i++) ((float *)sum.data)[i] += ((float *)piece.data)[i];
        hp_tensor_free_data(&piece);
    }
    HP_CHECK_OK(hp_dtensor_from_local(&a, &loc, M1, 1, &p, NULL));
    tu_check_full(&a, &sum, 1, "from_local P full_tensor");
    /* test_from_local_uneven_sharding: a given shape */
    int64_t gsh[2] = {13, 2};
    hp_tensor_t g = tu_global(2, gsh, 3);
    hp_dtensor_t d;
    HP_CHECK_OK(hp_dtensor_distribute(&d, NULL, &g, M1, 1, &s0, 0));
    HP_CHECK_OK(hp_dtensor_from_local(&a, &d.local, M1, 1, &s0, gsh));
    tu_check_full(&a, &g, 1, "from_local uneven with shape");
    int64_t wrong[2] = {12 * N, 2};
    HP_CHECK_ERR(hp_dtensor_from_local(&a, &d.local, M1, 1, &s0, wrong), HP_ERR_INVALID_ARG, "does not match");
    HP_CHECK_ERR(hp_dtensor_from_local(&a, &d.local, M1, 0, &s0, NULL), HP_ERR_INVALID_ARG, "must have the same length");
    hp_dtensor_free(&d);
    hp_tensor_free_data(&g), hp_tensor_free_data(&sum), hp_tensor_free_data(&expect), hp_tensor_free_data(&loc);
}

/* Reference kernels on whole tensors. */
static hp_tensor_t ref_matmul(const hp_tensor_t *a, const hp_tensor_t *b) {
    int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1], s[2] = {m, n};
    hp_tensor_t c;
    HP_ASSERT(hp_tensor_malloc(&c, HP_F32, 2, s) == HP_OK);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float acc = 0;
            for (int64_t t = 0; t < k; t++) acc += ((float *)a->data)[i * k + t] * ((float *)b->data)[t * n + j];
            ((float *)c.data)[i * n + j] = acc;
        }
    return c;
}

static void test_ops(void) {
    int64_t sh[2] = {6, 5};
    hp_tensor_t x = tu_global(2, sh, 1), y = tu_global(2, sh, 2), xs, xm;
    HP_CHECK_OK(hp_tensor_malloc(&xs, HP_F32, 2, sh));
    HP_CHECK_OK(hp_tensor_malloc(&xm, HP_F32, 2, sh));
    for (int i = 0; i < 30; i++) {
        ((float *)xs.data)[i] = ((float *)x.data)[i] + ((float *)y.data)[i];
        ((float *)xm.data)[i] = ((float *)x.data)[i] * ((float *)y.data)[i];
    }
    hp_placement_t s0 = S(0), s1 = S(1), r = Rp(), p = P();
    hp_dtensor_t a, b, c;
    /* S0 + S0 -> S0, 0 comms; S0 + R -> S0 (b chunked locally), 0 comms */
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &x, M1, 1, &s0, 0));
    HP_CHECK_OK(hp_dtensor_distribute(&b, NULL, &y, M1, 1, &s0, 0));
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_add(&c, NULL, &a, &b));
    tu_expect(M1, "S0+S0", 0, 0, 0, 0, 0);
    HP_CHECK(c.placements[0].kind == HP_SHARD && c.placements[0].dim == 0, "S0+S0 -> S0");
    tu_check_local(&c, &xs, 1, "S0+S0");
    hp_dtensor_free(&b), hp_dtensor_free(&c);
    HP_CHECK_OK(hp_dtensor_distribute(&b, NULL, &y, M1, 1, &r, 0));
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_mul(&c, NULL, &a, &b));
    tu_expect(M1, "S0*R", 0, 0, 0, 0, 0);
    tu_check_local(&c, &xm, 1, "S0*R -> S0");
    hp_dtensor_free(&c);
    /* S0 + S1: no rule -> both replicated (2 all_gathers) */
    hp_dtensor_t b1;
    HP_CHECK_OK(hp_dtensor_distribute(&b1, NULL, &y, M1, 1, &s1, 0));
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_add(&c, NULL, &a, &b1));
    tu_expect(M1, "S0+S1", 2, 0, 0, 0, 2);
    HP_CHECK(c.placements[0].kind == HP_REPLICATE, "S0+S1 -> R");
    tu_check_local(&c, &xs, 1, "S0+S1");
    hp_dtensor_free(&c), hp_dtensor_free(&b1), hp_dtensor_free(&a);
    /* P * R -> P (0 comms); P + P -> P; P + R -> R via 1 all_reduce */
    hp_dtensor_t pa;
    HP_CHECK_OK(hp_dtensor_from_local(&pa, &x, M1, 1, &p, NULL));   /* global = N * x */
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_mul(&c, NULL, &pa, &b));
    tu_expect(M1, "P*R", 0, 0, 0, 0, 0);
    HP_CHECK(c.placements[0].kind == HP_PARTIAL, "P*R -> P");
    tu_check_full(&c, &xm, (float)N, "P*R");
    hp_dtensor_free(&c);
    hp_dtensor_t pb;
    HP_CHECK_OK(hp_dtensor_from_local(&pb, &y, M1, 1, &p, NULL));
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_add(&c, NULL, &pa, &pb));
    tu_expect(M1, "P+P", 0, 0, 0, 0, 0);
    tu_check_full(&c, &xs, (float)N, "P+P");
    hp_dtensor_free(&c);
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_add(&c, NULL, &pa, &b));
    tu_expect(M1, "P+R", 0, 0, 1, 0, 1);
    HP_CHECK(c.placements[0].kind == HP_REPLICATE, "P+R -> R");
    hp_dtensor_free(&c), hp_dtensor_free(&b);

    /* matmul (8,6) @ (6,4) */
    int64_t as[2] = {8, 6}, bs[2] = {6, 4};
    hp_tensor_t A = tu_global(2, as, 3), B = tu_global(2, bs, 4), C = ref_matmul(&A, &B);
    struct { hp_placement_t pa, pb; hp_placement_kind_t out; int ag; } mm[] = {
        {S(1), S(0), HP_PARTIAL, 0}, {S(0), Rp(), HP_SHARD, 0}, {Rp(), S(1), HP_SHARD, 0},
        {Rp(), Rp(), HP_REPLICATE, 0}, {S(0), S(0), HP_REPLICATE, 2},
    };
    for (size_t t = 0; t < sizeof mm / sizeof mm[0]; t++) {
        hp_dtensor_t da, db, dc;
        HP_CHECK_OK(hp_dtensor_distribute(&da, NULL, &A, M1, 1, &mm[t].pa, 0));
        HP_CHECK_OK(hp_dtensor_distribute(&db, NULL, &B, M1, 1, &mm[t].pb, 0));
        hp_comm_counts_reset();
        HP_CHECK_OK(hp_dtensor_matmul(&dc, NULL, &da, &db));
        char what[64];
        snprintf(what, sizeof what, "matmul %s @ %s", tu_pl(1, &mm[t].pa), tu_pl(1, &mm[t].pb));
        tu_expect(M1, what, mm[t].ag, 0, 0, 0, mm[t].ag);
        HP_CHECK(dc.placements[0].kind == mm[t].out, "%s: output placement %s", what, tu_pl(1, dc.placements));
        tu_check_full(&dc, &C, 1, what);
        hp_dtensor_free(&da), hp_dtensor_free(&db), hp_dtensor_free(&dc);
    }
    /* 2x2: [S0,S1] @ [R,S0] -> [S0, P], 0 comms */
    {
        hp_placement_t pa2[2] = {S(0), S(1)}, pb2[2] = {Rp(), S(0)};
        hp_dtensor_t da, db, dc;
        HP_CHECK_OK(hp_dtensor_distribute(&da, NULL, &A, M2, 2, pa2, 0));
        HP_CHECK_OK(hp_dtensor_distribute(&db, NULL, &B, M2, 2, pb2, 0));
        hp_comm_counts_reset();
        HP_CHECK_OK(hp_dtensor_matmul(&dc, NULL, &da, &db));
        tu_expect(M2, "2x2 matmul", 0, 0, 0, 0, 0);
        HP_CHECK(dc.placements[0].kind == HP_SHARD && dc.placements[1].kind == HP_PARTIAL, "[S0,P] out");
        tu_check_full(&dc, &C, 1, "2x2 matmul");
        hp_dtensor_free(&da), hp_dtensor_free(&db), hp_dtensor_free(&dc);
    }
    /* sum over a dim: Shard(dim) -> Partial (0 comms), Shard(other) -> Shard */
    {
        int64_t c0[1] = {5}, c1[1] = {6};
        hp_tensor_t col, row;
        HP_CHECK_OK(hp_tensor_malloc(&col, HP_F32, 1, c0));
        HP_CHECK_OK(hp_tensor_malloc(&row, HP_F32, 1, c1));
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 5; j++) {
                ((float *)col.data)[j] += ((float *)x.data)[i * 5 + j];
                ((float *)row.data)[i] += ((float *)x.data)[i * 5 + j];
            }
        hp_dtensor_t d0, s;
        HP_CHECK_OK(hp_dtensor_distribute(&d0, NULL, &x, M1, 1, &s0, 0));
        hp_comm_counts_reset();
        HP_CHECK_OK(hp_dtensor_sum(&s, NULL, &d0, 0));
        tu_expect(M1, "sum S0 over dim 0", 0, 0, 0, 0, 0);
        HP_CHECK(s.placements[0].kind == HP_PARTIAL && s.local.ndim == 1, "sum over sharded dim -> Partial");
        tu_check_full(&s, &col, 1, "sum dim 0");
        hp_dtensor_free(&s);
        HP_CHECK_OK(hp_dtensor_sum(&s, NULL, &d0, -1));
        HP_CHECK(s.placements[0].kind == HP_SHARD && s.placements[0].dim == 0, "sum over other dim keeps Shard");
        tu_check_local(&s, &row, 1, "sum dim 1");
        hp_dtensor_free(&s);
        hp_placement_t pmax = hp_partial(HP_MAX);
        hp_dtensor_t dm;
        HP_CHECK_OK(hp_dtensor_from_local(&dm, &x, M1, 1, &pmax, NULL));
        hp_comm_counts_reset();
        HP_CHECK_OK(hp_dtensor_sum(&s, NULL, &dm, 1));
        tu_expect(M1, "sum of P(max)", 0, 0, 1, 0, 1);
        tu_check_local(&s, &row, 1, "sum of P(max) replicates first");
        hp_dtensor_free(&s), hp_dtensor_free(&d0);
        HP_CHECK_ERR(hp_dtensor_sum(&s, NULL, &dm, 2), HP_ERR_INVALID_ARG, "out of range");
        hp_tensor_free_data(&col), hp_tensor_free_data(&row);
    }
    /* arena mode for ops: result stays, temporaries are rewound */
    {
        hp_arena_t ar;
        HP_CHECK_OK(hp_arena_init(&ar, "ops", 1 << 16));
        hp_dtensor_mem_t mem = {&ar, NULL, 0};
        hp_dtensor_t da, db, dc;
        HP_CHECK_OK(hp_dtensor_distribute(&da, NULL, &A, M1, 1, &s0, 0));
        HP_CHECK_OK(hp_dtensor_distribute(&db, NULL, &B, M1, 1, &s0, 0));
        HP_CHECK_OK(hp_dtensor_matmul(&dc, &mem, &da, &db));   /* replicates both first */
        HP_CHECK(dc.owned == NULL && ar.used == hp_arena_round(hp_tensor_nbytes(&dc.local)),
                 "arena keeps only the result (%zu used)", ar.used);
        tu_check_full(&dc, &C, 1, "arena matmul");
        hp_dtensor_free(&da), hp_dtensor_free(&db);
        hp_arena_free(&ar);
    }
    hp_dtensor_free(&pa), hp_dtensor_free(&pb);
    hp_tensor_free_data(&A), hp_tensor_free_data(&B), hp_tensor_free_data(&C);
    hp_tensor_free_data(&x), hp_tensor_free_data(&y), hp_tensor_free_data(&xs), hp_tensor_free_data(&xm);
}

/* Executors move bytes, so every dtype redistributes exactly: bf16 and i32 through
 * S0 -> S1 -> R and a Partial(sum) -> S0 reduce_scatter. */
static void test_dtypes(void) {
    hp_dtype_t dts[2] = {HP_BF16, HP_I32};
    int64_t sh[2] = {7, 5};
    for (int t = 0; t < 2; t++) {
        hp_tensor_t g;
        HP_CHECK_OK(hp_tensor_malloc(&g, dts[t], 2, sh));
        for (int64_t i = 0; i < 35; i++) hp_tensor_set_flat(&g, i, (double)(i % 13) - 6);
        hp_placement_t s0 = S(0), s1 = S(1), r = Rp(), p = P();
        hp_dtensor_t a, b, c, d, e;
        HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g, M2, 2, (hp_placement_t[]){s0, s1}, 0));
        HP_CHECK_OK(hp_dtensor_redistribute(&b, NULL, &a, 2, (hp_placement_t[]){s1, s0}));
        HP_CHECK_OK(hp_dtensor_redistribute(&c, NULL, &b, 2, (hp_placement_t[]){r, r}));
        int ok = !hp_mesh_contains_self(M2) || hp_tensor_same_shape(&c.local, &g);
        for (int64_t i = 0; ok && hp_mesh_contains_self(M2) && i < 35; i++)
            ok = hp_tensor_get_flat(&c.local, i) == hp_tensor_get_flat(&g, i);
        HP_CHECK(ok, "%s: [S0,S1] -> [S1,S0] -> [R,R] round trip", hp_dtype_name(dts[t]));
        HP_CHECK_OK(hp_dtensor_from_local(&d, &g, M1, 1, &p, NULL));
        HP_CHECK_OK(hp_dtensor_redistribute(&e, NULL, &d, 1, &s0));
        int64_t ls[2], off[2];
        HP_CHECK_OK(hp_dtensor_compute_local_shape_and_offset(ls, off, 2, sh, M1, 1, &s0));
        ok = e.local.shape[0] == ls[0];
        for (int64_t i = 0; ok && i < ls[0] * 5; i++)
            ok = hp_tensor_get_flat(&e.local, i) == N * hp_tensor_get_flat(&g, off[0] * 5 + i);
        HP_CHECK(ok, "%s: P(sum) -> S0 reduce_scatter", hp_dtype_name(dts[t]));
        hp_dtensor_free(&a), hp_dtensor_free(&b), hp_dtensor_free(&c), hp_dtensor_free(&e);
        /* a hand-made descriptor whose piece does not match its placements is refused */
        hp_dtensor_t bad = d;
        bad.placements[0] = s0;
        if (ls[0] != 7) HP_CHECK_ERR(hp_dtensor_redistribute(&e, NULL, &bad, 1, &r), HP_ERR_INVALID_ARG, "give");
        /* global_offset reports a bad descriptor as a status (it used to abort the job) */
        int64_t goff[2] = {-1, -1};
        HP_CHECK_OK(hp_dtensor_global_offset(&d, goff));
        HP_CHECK(goff[0] == 0 && goff[1] == 0, "global_offset of a Partial piece: %lld %lld", (long long)goff[0],
                 (long long)goff[1]);
        bad.placements[0] = S(5);
        HP_CHECK_ERR(hp_dtensor_global_offset(&bad, goff), HP_ERR_INVALID_ARG,
                     "hp_dtensor_global_offset: invalid DTensor");
        bad = d;
        bad.local.ndim = 99;
        HP_CHECK_ERR(hp_dtensor_global_offset(&bad, goff), HP_ERR_INVALID_ARG, "has 99 dims");
        hp_tensor_free_data(&g);
    }
    /* I64 values above 2^53 survive a redistribute exactly (read with get_flat_i64; a double
     * would round 2^53 + 1 to 2^53) */
    hp_tensor_t g;
    HP_CHECK_OK(hp_tensor_malloc(&g, HP_I64, 2, sh));
    for (int64_t i = 0; i < 35; i++) hp_tensor_set_flat_i64(&g, i, (INT64_C(1) << 53) + 1 + 2 * i);
    hp_dtensor_t a, c;
    hp_placement_t s0 = S(0), r = Rp();
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g, M1, 1, &s0, 0));
    HP_CHECK_OK(hp_dtensor_redistribute(&c, NULL, &a, 1, &r));
    int ok = hp_tensor_same_shape(&c.local, &g);
    for (int64_t i = 0; ok && i < 35; i++) ok = hp_tensor_get_flat_i64(&c.local, i) == hp_tensor_get_flat_i64(&g, i);
    HP_CHECK(ok && hp_tensor_get_flat_i64(&c.local, 0) == (INT64_C(1) << 53) + 1, "i64 S0 -> R exact");
    HP_CHECK(hp_tensor_allclose(&c.local, &g, 0, 0, NULL), "i64 allclose exact");
    hp_dtensor_free(&a), hp_dtensor_free(&c);
    hp_tensor_free_data(&g);
}

int main(int argc, char **argv) {
    tu_init(&argc, &argv);
    tu_meshes(&M1, &M2);
    test_distribute();
    test_from_local();
    test_ops();
    test_dtypes();
    return tu_finish("test_dtensor_api", M1, M2);
}
