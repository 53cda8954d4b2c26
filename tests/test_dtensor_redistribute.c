/* Redistribute conformance (PyTorch's test/distributed/tensor/test_redistribute.py): every 1-D case on a
 * mesh over all ranks (world 4 as PyTorch, and 8), every 2x2 case on a 2x2 mesh over ranks
 * 0-3 (on 8 ranks, ranks 4-7 are outside the mesh: empty pieces, no communication), with the
 * same shapes, expected values and exact collective counts. S(i)->S(j) is one all_to_all
 * here (PyTorch on CPU counts one all_gather for it). */
// hp-test: ranks 4 8 timeout 120
#include "test_dtensor_util.h"

static hp_mesh_t M1, M2;   /* 1-D over the world; 2x2 over ranks 0-3 */
static hp_placement_t S(int d) { return hp_shard(d); }
static hp_placement_t Rp(void) { return hp_replicate(); }
static hp_placement_t P(void) { return hp_partial(HP_SUM); }

/* test_shard_to_replicate_forward_backward: (12,3),(13,3),(14,3) on dim 0 and transposes on
 * dim 1: equals the input, exactly one all_gather. Also R->R (0 comms) and R->S (0 comms,
 * the torch.chunk piece). */
static void test_1d_basic(void) {
    int64_t shapes[6][2] = {{12, 3}, {13, 3}, {14, 3}, {3, 12}, {3, 13}, {3, 14}};
    for (int t = 0; t < 6; t++) {
        int dim = t < 3 ? 0 : 1;
        hp_tensor_t g = tu_global(2, shapes[t], t);
        hp_placement_t s = S(dim), r = Rp();
        hp_dtensor_t a, b, c, d;
        HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g, M1, 1, &s, 0));
        char what[64];
        snprintf(what, sizeof what, "(%lld,%lld) S(%d)->R", (long long)shapes[t][0], (long long)shapes[t][1], dim);
        tu_check_local(&a, &g, 1, what);
        hp_comm_counts_reset();
        HP_CHECK_OK(hp_dtensor_redistribute(&b, NULL, &a, 1, &r));
        tu_expect(M1, what, 1, 0, 0, 0, 1);
        tu_check_local(&b, &g, 1, what);
        HP_CHECK(b.placements[0].kind == HP_REPLICATE, "%s: placement", what);
        hp_comm_counts_reset();
        HP_CHECK_OK(hp_dtensor_redistribute(&c, NULL, &b, 1, &r));
        tu_expect(M1, "R->R", 0, 0, 0, 0, 0);
        tu_check_local(&c, &g, 1, "R->R");
        hp_comm_counts_reset();
        HP_CHECK_OK(hp_dtensor_redistribute(&d, NULL, &b, 1, &s));
        tu_expect(M1, "R->S", 0, 0, 0, 0, 0);
        tu_check_local(&d, &g, 1, "R->S (torch.chunk piece)");
        hp_dtensor_free(&a), hp_dtensor_free(&b), hp_dtensor_free(&c), hp_dtensor_free(&d);
        hp_tensor_free_data(&g);
    }
}

/* test_partial_to_replicate / test_partial_to_shard / test_replicate_to_partial (1-D). */
static void test_1d_partial(void) {
    int64_t shape[2] = {12, 3};
    hp_tensor_t ones = tu_fill(2, shape, 1.0f);
    hp_placement_t p = P(), r = Rp();
    hp_dtensor_t a, b;
    HP_CHECK_OK(hp_dtensor_from_local(&a, &ones, M1, 1, &p, NULL));
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_redistribute(&b, NULL, &a, 1, &r));
    tu_expect(M1, "P->R", 0, 0, 1, 0, 1);
    tu_check_local(&b, &ones, (float)N, "P->R gives ones * world_size");
    /* replicate_to_partial: public API refuses, internal divides by the mesh dim size */
    hp_dtensor_t c;
    HP_CHECK_ERR(hp_dtensor_redistribute(&c, NULL, &b, 1, &p), HP_ERR_INVALID_ARG, "Can not redistribute");
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_redistribute_internal(&c, NULL, &b, 1, &p));
    tu_expect(M1, "R->P internal", 0, 0, 0, 0, 0);
    tu_check_local(&c, &ones, 1.0f, "R->P internal gives local / world_size");
    hp_dtensor_free(&b), hp_dtensor_free(&c);
    /* partial_to_shard: ones -> Shard(d) == ones * world with torch.chunk shapes, 1 reduce_scatter */
    int64_t shapes[4][2] = {{12, 3}, {13, 3}, {3, 13}, {1, 5}};
    for (int t = 0; t < 4; t++) {
        for (int dim = 0; dim < 2; dim++) {
            hp_tensor_t o = tu_fill(2, shapes[t], 1.0f);
            hp_placement_t s = S(dim);
            hp_dtensor_t x, y;
            HP_CHECK_OK(hp_dtensor_from_local(&x, &o, M1, 1, &p, NULL));
            hp_comm_counts_reset();
            HP_CHECK_OK(hp_dtensor_redistribute(&y, NULL, &x, 1, &s));
            char what[64];
            snprintf(what, sizeof what, "P->S(%d) (%lld,%lld)", dim, (long long)shapes[t][0], (long long)shapes[t][1]);
            tu_expect(M1, what, 0, 0, 0, 1, 1);
            tu_check_local(&y, &o, (float)N, what);
            hp_dtensor_free(&y);
            hp_tensor_free_data(&o);
        }
    }
    /* other reduce ops: avg, max, min, product of rank-dependent pieces */
    hp_redop_t ops[4] = {HP_AVG, HP_MAX, HP_MIN, HP_PROD};
    for (int o = 0; o < 4; o++) {
        hp_tensor_t v = tu_fill(2, shape, (float)(R % 2 + 1));
        hp_placement_t po = hp_partial(ops[o]), s1 = S(1);
        hp_dtensor_t x, y, z;
        HP_CHECK_OK(hp_dtensor_from_local(&x, &v, M1, 1, &po, NULL));
        float expect = ops[o] == HP_AVG ? 1.5f : ops[o] == HP_MAX ? 2.0f : ops[o] == HP_MIN ? 1.0f
                       : (float)(1 << (N / 2));
        hp_tensor_t e = tu_fill(2, shape, expect);
        HP_CHECK_OK(hp_dtensor_redistribute(&y, NULL, &x, 1, &r));
        tu_check_local(&y, &e, 1, hp_redop_name(ops[o]));
        HP_CHECK_OK(hp_dtensor_redistribute(&z, NULL, &x, 1, &s1));
        tu_check_local(&z, &e, 1, hp_redop_name(ops[o]));
        hp_dtensor_free(&y), hp_dtensor_free(&z);
        hp_tensor_free_data(&v), hp_tensor_free_data(&e);
    }
    hp_tensor_free_data(&ones);
}

/* test_redistribute_negative_shard_dim and test_redistribute_shard_dim_change (1-D). */
static void test_1d_shard_dim(void) {
    int64_t sh[2] = {12, 3};
    hp_tensor_t g = tu_global(2, sh, 7);
    hp_placement_t s0 = S(0), sm1 = S(-1);
    hp_dtensor_t a, b;
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g, M1, 1, &s0, 0));
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_dtensor_redistribute(&b, NULL, &a, 1, &sm1));
    HP_CHECK(b.placements[0].kind == HP_SHARD && b.placements[0].dim == 1, "Shard(-1) normalised to Shard(1)");
    tu_expect(M1, "S0->S(-1)", 0, 1, 0, 0, 1);
    tu_check_local(&b, &g, 1, "S0->S(-1)");
    hp_dtensor_free(&a), hp_dtensor_free(&b);
    hp_tensor_free_data(&g);

    struct { int nd; int64_t s[3]; } shapes[5] = {{2, {8, 8}}, {3, {8, 8, 8}}, {2, {8, 5}}, {2, {5, 8}}, {2, {5, 5}}};
    for (int t = 0; t < 5; t++) {
        hp_tensor_t x = tu_global(shapes[t].nd, shapes[t].s, t);
        for (int dir = 0; dir < 2; dir++) {
            hp_placement_t from = S(dir), to = S(1 - dir);
            hp_dtensor_t u, v, direct;
            HP_CHECK_OK(hp_dtensor_distribute(&u, NULL, &x, M1, 1, &from, 0));
            HP_CHECK_OK(hp_dtensor_distribute(&direct, NULL, &x, M1, 1, &to, 0));
            hp_comm_counts_reset();
            HP_CHECK_OK(hp_dtensor_redistribute(&v, NULL, &u, 1, &to));
            char what[64];
            snprintf(what, sizeof what, "1-D S%d->S%d shape #%d", dir, 1 - dir, t);
            tu_expect(M1, what, 0, 1, 0, 0, 1);
            HP_CHECK(hp_tensor_same_shape(&v.local, &direct.local) &&
                     memcmp(v.local.data, direct.local.data, hp_tensor_nbytes(&v.local)) == 0,
                     "%s: equals direct distribute", what);
            hp_dtensor_free(&u), hp_dtensor_free(&v), hp_dtensor_free(&direct);
        }
        hp_tensor_free_data(&x);
    }
}

/* 2x2: test_redistribute_uneven_sharding, 2-D counts of test_redistribute_shard_dim_change,
 * test_replicate_to_partial on [P,P], test_redistribute_to_partial. */
static void test_2x2(void) {
    int64_t shapes[4][2] = {{10, 5}, {9, 5}, {3, 5}, {1, 3}};
    hp_placement_t specs[2][2] = {{S(0), S(0)}, {S(0), S(1)}};
    for (int t = 0; t < 4; t++)
        for (int sp = 0; sp < 2; sp++) {
            hp_tensor_t g = tu_global(2, shapes[t], t + 10 * sp);
            hp_dtensor_t a;
            HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g, M2, 2, specs[sp], 0));
            char what[64];
            snprintf(what, sizeof what, "uneven (%lld,%lld) %s", (long long)shapes[t][0],
                     (long long)shapes[t][1], tu_pl(2, specs[sp]));
            tu_check_local(&a, &g, 1, what);
            tu_check_full(&a, &g, 1, what);
            hp_dtensor_free(&a);
            hp_tensor_free_data(&g);
        }
    struct { int nd; hp_placement_t src[2], dst[2]; int a2a, ag; } cases[] = {
        {2, {S(0), S(1)}, {S(0), S(0)}, 1, 0},
        {2, {S(0), S(1)}, {S(1), S(0)}, 1, 1},
        {2, {S(0), S(0)}, {S(1), S(1)}, 1, 1},
        {3, {S(0), S(2)}, {S(1), S(0)}, 1, 1},
        {3, {S(1), S(1)}, {S(1), S(2)}, 1, 0},
    };
    int64_t shape2[2] = {8, 8}, shape3[3] = {8, 8, 8}, shape2u[2] = {7, 5}, shape3u[3] = {5, 7, 3};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++)
        for (int uneven = 0; uneven < 2; uneven++) {
            const int64_t *sh = cases[t].nd == 2 ? (uneven ? shape2u : shape2) : (uneven ? shape3u : shape3);
            hp_tensor_t g = tu_global(cases[t].nd, sh, (int)t);
            hp_dtensor_t a, b;
            char what[96];
            snprintf(what, sizeof what, "%d-d%s %s->%s", cases[t].nd, uneven ? " uneven" : "",
                     tu_pl(2, cases[t].src), tu_pl(2, cases[t].dst));
            tu_redistribute_vs_direct(what, &g, M2, 2, cases[t].src, cases[t].dst, &a, &b);
            if (!uneven)   /* counts are PyTorch's for the 8x8(x8) tensors */
                tu_expect(M2, what, cases[t].ag, cases[t].a2a, 0, 0, cases[t].ag + cases[t].a2a);
            tu_check_full(&b, &g, 1, what);
            hp_dtensor_free(&a), hp_dtensor_free(&b);
            hp_tensor_free_data(&g);
        }
    /* [R,R] -> [P,P] internally gives local / 4 */
    {
        int64_t sh[2] = {4, 4};
        hp_tensor_t g = tu_global(2, sh, 3);
        hp_placement_t rr[2] = {Rp(), Rp()}, pp[2] = {P(), P()};
        hp_dtensor_t a, b;
        HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g, M2, 2, rr, 0));
        hp_comm_counts_reset();
        HP_CHECK_OK(hp_dtensor_redistribute_internal(&b, NULL, &a, 2, pp));
        tu_expect(M2, "[R,R]->[P,P]", 0, 0, 0, 0, 0);
        tu_check_local(&b, &g, 0.25f, "[R,R]->[P,P] = local / 4");
        tu_check_full(&b, &g, 1, "[P,P] full");
        hp_dtensor_free(&a), hp_dtensor_free(&b);
        hp_tensor_free_data(&g);
    }
    /* test_redistribute_to_partial */
    {
        int64_t sh[2] = {6, 4};
        hp_tensor_t g = tu_global(2, sh, 5);
        hp_placement_t prod = hp_partial(HP_PROD);
        struct { hp_placement_t src[2], dst[2]; int ok; } cases2[] = {
            {{P(), S(0)}, {P(), S(0)}, 1},
            {{P(), S(0)}, {P(), S(1)}, 1},
            {{S(0), P()}, {Rp(), P()}, 1},
            {{S(0), prod}, {Rp(), prod}, 1},
            {{S(0), Rp()}, {S(0), P()}, 0},
            {{S(0), Rp()}, {Rp(), P()}, 0},
            {{S(0), S(1)}, {Rp(), P()}, 0},
            {{S(0), prod}, {Rp(), P()}, 0},
        };
        for (size_t t = 0; t < sizeof cases2 / sizeof cases2[0]; t++) {
            /* Pieces: the layout's slice on coordinate 0 of a Partial dim, the identity of
             * the op (0 for sum, 1 for product) elsewhere, so the global value is g. */
            hp_dtensor_t a = tu_from_pieces(&g, M2, cases2[t].src), b;
            int coord[2];
            if (hp_mesh_get_coordinate(M2, coord))
                for (int i = 0; i < 2; i++)
                    if (cases2[t].src[i].kind == HP_PARTIAL && coord[i] != 0)
                        hp_tensor_fill(&a.local, cases2[t].src[i].reduce_op == HP_PROD ? 1.0 : 0.0);
            char what[96];
            snprintf(what, sizeof what, "to_partial %s->%s", tu_pl(2, cases2[t].src), tu_pl(2, cases2[t].dst));
            if (cases2[t].ok) {
                HP_CHECK_OK(hp_dtensor_redistribute(&b, NULL, &a, 2, cases2[t].dst));
                tu_check_full(&b, &g, 1, what);
                hp_dtensor_free(&b);
            } else {
                HP_CHECK_ERR(hp_dtensor_redistribute(&b, NULL, &a, 2, cases2[t].dst), HP_ERR_INVALID_ARG,
                             "Can not redistribute");
            }
            hp_dtensor_free(&a);
        }
        hp_tensor_free_data(&g);
    }
    /* placements length != mesh ndim */
    {
        int64_t sh[2] = {4, 4};
        hp_tensor_t g = tu_global(2, sh, 1);
        hp_placement_t rr[2] = {Rp(), Rp()}, one = S(0);
        hp_dtensor_t a, b;
        HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g, M2, 2, rr, 0));
        HP_CHECK_ERR(hp_dtensor_redistribute(&b, NULL, &a, 1, &one), HP_ERR_INVALID_ARG,
                     "must have the same length");
        HP_CHECK_ERR(hp_dtensor_redistribute(&b, NULL, &a, 2, NULL), HP_ERR_INVALID_ARG,
                     "placements is needed for redistribute!");
        hp_placement_t bad[2] = {S(2), Rp()};
        HP_CHECK_ERR(hp_dtensor_redistribute(&b, NULL, &a, 2, bad), HP_ERR_INVALID_ARG, "out of range");
        hp_dtensor_free(&a);
        hp_tensor_free_data(&g);
    }
}

/* test_one_chunk_mesh: mesh (4,1); any src in {S1,R,P} to any dst in {S0,S1,R} on the size-1
 * dim: 0 comms, placements updated. */
static void test_one_chunk_mesh(void) {
    int64_t ms[2] = {4, 1};
    hp_mesh_t m;
    HP_CHECK_OK(hp_mesh_create(W, 2, ms, (const char *[]){"a", "b"}, &m));
    int64_t sh[2] = {8, 6};
    hp_tensor_t g = tu_global(2, sh, 2);
    hp_placement_t srcs[3] = {S(1), Rp(), P()}, dsts[3] = {S(0), S(1), Rp()};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            hp_placement_t src[2] = {Rp(), srcs[i]}, dst[2] = {Rp(), dsts[j]};
            hp_dtensor_t a = tu_from_pieces(&g, m, src), b;
            hp_comm_counts_reset();
            HP_CHECK_OK(hp_dtensor_redistribute(&b, NULL, &a, 2, dst));
            char what[64];
            snprintf(what, sizeof what, "one chunk %s->%s", tu_pl(2, src), tu_pl(2, dst));
            tu_expect(m, what, 0, 0, 0, 0, 0);
            HP_CHECK(hp_placement_equal(b.placements[1], dsts[j]), "%s: placement updated", what);
            tu_check_local(&b, &g, 1, what);
            hp_dtensor_free(&a), hp_dtensor_free(&b);
        }
    hp_tensor_free_data(&g);
    hp_mesh_destroy(m);
}

/* Storage modes: caller buffer, arena (scratch rewound, result kept), heap. */
static void test_storage(void) {
    int64_t sh[2] = {9, 5};
    hp_tensor_t g = tu_global(2, sh, 4);
    hp_placement_t s0 = S(0), s1 = S(1);
    hp_dtensor_t a, b, c;
    HP_CHECK_OK(hp_dtensor_distribute(&a, NULL, &g, M1, 1, &s0, 0));
    HP_CHECK(a.owned == a.local.data, "heap result is owned");
    hp_arena_t arena;
    HP_CHECK_OK(hp_arena_init(&arena, "dtensor-test", 1 << 16));
    hp_dtensor_mem_t am = {&arena, NULL, 0};
    HP_CHECK_OK(hp_dtensor_redistribute(&b, &am, &a, 1, &s1));
    HP_CHECK(b.owned == NULL && (!hp_tensor_nbytes(&b.local) || (char *)b.local.data >= arena.base) &&
             arena.used == hp_arena_round(hp_tensor_nbytes(&b.local)),
             "arena holds only the result after the call (used %zu)", arena.used);
    tu_check_local(&b, &g, 1, "arena result");
    float buf[64];
    hp_dtensor_mem_t om = {NULL, buf, sizeof buf};
    HP_CHECK_OK(hp_dtensor_redistribute(&c, &om, &b, 1, &s0));
    HP_CHECK(c.local.data == buf && c.owned == NULL, "caller buffer used");
    tu_check_local(&c, &g, 1, "out_data result");
    hp_dtensor_mem_t small = {NULL, buf, 1};
    hp_dtensor_t d;
    if (hp_mesh_get_local_rank(M1, 0) == 0)   /* rank 0 holds a non-empty piece */
        HP_CHECK_ERR(hp_dtensor_redistribute(&d, &small, &b, 1, &s0), HP_ERR_INVALID_ARG, "out_data holds");
    hp_arena_free(&arena);
    hp_dtensor_free(&a);
    hp_tensor_free_data(&g);
}

int main(int argc, char **argv) {
    tu_init(&argc, &argv);
    tu_meshes(&M1, &M2);
    test_1d_basic();
    test_1d_partial();
    test_1d_shard_dim();
    test_2x2();
    test_one_chunk_mesh();
    test_storage();
    return tu_finish("test_dtensor_redistribute", M1, M2);
}
