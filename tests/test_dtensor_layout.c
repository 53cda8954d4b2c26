/* DTensor layout math without communication: torch.chunk shard sizes/offsets, nested and
 * strided sharding, placement normalisation and text, and the greedy planner's step lists
 * and collective counts for every multi-dim case of PyTorch's test_redistribute.py. */
// hp-test: ranks 1
#include <string.h>

#include "hp_test.h"
#include "hyperparallel/dtensor.h"

static hp_placement_t S(int d) { return hp_shard(d); }
static hp_placement_t R(void) { return hp_replicate(); }

/* Number of steps that communicate: src != dst on a mesh dim of size > 1, other than the
 * local Replicate -> Shard chunk (and the local Replicate -> Partial). */
static int plan_comms(int nd, const int64_t *shape, int mnd, const int64_t *ms, const int *coord,
                      const hp_placement_t *src, const hp_placement_t *dst, char *trace, size_t tn) {
    hp_transform_t steps[16];
    int n = -1;
    HP_CHECK_OK(hp_redistribute_plan(steps, 16, &n, nd, shape, mnd, ms, coord, src, dst));
    int comms = 0;
    size_t used = 0;
    trace[0] = 0;
    for (int i = 0; i < n; i++) {
        char a[32], b[32];
        used += (size_t)snprintf(trace + used, tn - used, "%s%d:%s->%s", i ? " " : "", steps[i].mesh_dim,
                                 hp_placement_str(steps[i].src, a, sizeof a),
                                 hp_placement_str(steps[i].dst, b, sizeof b));
        if (hp_placement_equal(steps[i].src, steps[i].dst) || ms[steps[i].mesh_dim] == 1) continue;
        if (steps[i].src.kind == HP_REPLICATE) continue;
        comms++;
    }
    return comms;
}

/* Shard.local_shard_size_and_offset */
static void test_shard_sizes(void) {
    int64_t exp5[4] = {2, 2, 1, 0}, off5[4] = {0, 2, 4, 5};
    int64_t exp1[4] = {1, 0, 0, 0}, off1[4] = {0, 1, 1, 1};
    for (int r = 0; r < 4; r++) {
        int64_t sz, off;
        hp_shard_size_and_offset(5, 4, r, &sz, &off);
        HP_CHECK(sz == exp5[r] && off == off5[r], "n=5 k=4 r=%d: (%lld, %lld)", r, (long long)sz, (long long)off);
        hp_shard_size_and_offset(1, 4, r, &sz, &off);
        HP_CHECK(sz == exp1[r] && off == off1[r], "n=1 k=4 r=%d: (%lld, %lld)", r, (long long)sz, (long long)off);
        hp_shard_size_and_offset(12, 4, r, &sz, &off);
        HP_CHECK(sz == 3 && off == 3 * r, "n=12 k=4 r=%d", r);
        hp_shard_size_and_offset(0, 4, r, &sz, &off);
        HP_CHECK(sz == 0 && off == 0, "n=0 k=4 r=%d", r);
    }
}

/* Nested [S0, S0] on 2x2 with n = 9: 3, 2, 2, 2 (not chunk(9, 4) = 3, 3, 3, 0). */
static void test_nested_shards(void) {
    int64_t ms[2] = {2, 2}, g[1] = {9};
    hp_placement_t pl[2] = {S(0), S(0)};
    int64_t exps[4] = {3, 2, 2, 2}, expo[4] = {0, 3, 5, 7};
    for (int r = 0; r < 4; r++) {
        int c[2] = {r / 2, r % 2};
        int64_t ls, off;
        hp_layout_local_shape_and_offset(1, g, 2, ms, c, pl, &ls, &off);
        HP_CHECK(ls == exps[r] && off == expo[r], "[S0,S0] n=9 rank %d: (%lld, %lld)", r,
                 (long long)ls, (long long)off);
    }
    /* (10,5) on [S0,S1]: rows 5,5 ; cols 3,2 */
    int64_t g2[2] = {10, 5};
    hp_placement_t p2[2] = {S(0), S(1)};
    int64_t e2[4][4] = {{5, 3, 0, 0}, {5, 2, 0, 3}, {5, 3, 5, 0}, {5, 2, 5, 3}};
    for (int r = 0; r < 4; r++) {
        int c[2] = {r / 2, r % 2};
        int64_t ls[2], off[2];
        hp_layout_local_shape_and_offset(2, g2, 2, ms, c, p2, ls, off);
        HP_CHECK(ls[0] == e2[r][0] && ls[1] == e2[r][1] && off[0] == e2[r][2] && off[1] == e2[r][3],
                 "(10,5) [S0,S1] rank %d: (%lld,%lld) @ (%lld,%lld)", r, (long long)ls[0],
                 (long long)ls[1], (long long)off[0], (long long)off[1]);
    }
    /* (1,3) on [S0,S0]: only rank 0 holds the row */
    int64_t g3[2] = {1, 3};
    hp_placement_t p3[2] = {S(0), S(0)};
    for (int r = 0; r < 4; r++) {
        int c[2] = {r / 2, r % 2};
        int64_t ls[2], off[2];
        hp_layout_local_shape_and_offset(2, g3, 2, ms, c, p3, ls, off);
        HP_CHECK(ls[0] == (r == 0) && ls[1] == 3, "(1,3) [S0,S0] rank %d: rows %lld", r, (long long)ls[0]);
    }
}

/* _StridedShard: 8x8 on dp x tp = 2x2. [S0,S0] -> rows 0-1,2-3,4-5,6-7;
 * [_S(0,2), S0] -> rows 0-1,4-5,2-3,6-7. */
static void test_strided_shard(void) {
    int64_t ms[2] = {2, 2}, g[2] = {8, 8};
    hp_placement_t plain[2] = {S(0), S(0)}, strided[2] = {hp_strided_shard(0, 2), S(0)};
    int64_t first_plain[4] = {0, 2, 4, 6}, first_strided[4] = {0, 4, 2, 6};
    for (int r = 0; r < 4; r++) {
        int c[2] = {r / 2, r % 2};
        int64_t idx[8], ls[2], off[2];
        int64_t n = hp_layout_dim_indices(8, 0, 2, ms, c, plain, idx);
        HP_CHECK(n == 2 && idx[0] == first_plain[r] && idx[1] == first_plain[r] + 1, "plain rank %d", r);
        n = hp_layout_dim_indices(8, 0, 2, ms, c, strided, idx);
        HP_CHECK(n == 2 && idx[0] == first_strided[r] && idx[1] == first_strided[r] + 1,
                 "strided rank %d: %lld rows from %lld", r, (long long)n, (long long)idx[0]);
        hp_layout_local_shape_and_offset(2, g, 2, ms, c, strided, ls, off);
        HP_CHECK(ls[0] == 2 && ls[1] == 8 && off[0] == first_strided[r], "strided shape rank %d", r);
    }
    HP_CHECK(!hp_layout_is_box(2, ms, strided) && hp_layout_is_box(2, ms, plain), "is_box");
    /* the strided layout equals FSDP-over-TP: tp chunk first, then the dp chunk of it */
    int64_t g7 = 7;
    for (int r = 0; r < 4; r++) {
        int c[2] = {r / 2, r % 2};
        int64_t idx[7], tps, tpo, dps, dpo;
        int64_t n = hp_layout_dim_indices(g7, 0, 2, ms, c, strided, idx);
        hp_shard_size_and_offset(g7, 2, c[1], &tps, &tpo);
        hp_shard_size_and_offset(tps, 2, c[0], &dps, &dpo);
        HP_CHECK(n == dps && (n == 0 || idx[0] == tpo + dpo), "strided n=7 rank %d", r);
    }
}

/* Normalisation and text */
static void test_placement_text(void) {
    hp_placement_t p;
    HP_CHECK_OK(hp_placement_normalize(&p, S(-1), 2));
    HP_CHECK(p.kind == HP_SHARD && p.dim == 1, "Shard(-1) on 2-d -> Shard(1), got %d", p.dim);
    HP_CHECK_OK(hp_placement_normalize(&p, S(-3), 3));
    HP_CHECK(p.dim == 0, "Shard(-3) on 3-d -> Shard(0)");
    HP_CHECK_ERR(hp_placement_normalize(&p, S(2), 2), HP_ERR_INVALID_ARG, "out of range");
    HP_CHECK_ERR(hp_placement_normalize(&p, S(-3), 2), HP_ERR_INVALID_ARG, "out of range");
    char buf[64];
    hp_placement_t pl[4] = {S(0), R(), hp_partial(HP_SUM), hp_strided_shard(1, 2)};
    hp_placements_str(4, pl, buf, sizeof buf);
    HP_CHECK(strcmp(buf, "[S(0), R, P(sum), _S(1, 2)]") == 0, "placements str '%s'", buf);
    HP_CHECK(strcmp(hp_placement_str(hp_partial(HP_PROD), buf, sizeof buf), "P(product)") == 0, "prod");
    HP_CHECK(!hp_placement_equal(hp_partial(HP_SUM), hp_partial(HP_MAX)), "P(sum) != P(max)");
    HP_CHECK(hp_placement_equal(S(1), S(1)) && !hp_placement_equal(S(1), S(0)), "shard eq");
}

/* Planner: collective counts of test_redistribute_shard_dim_change (2x2) and
 * test_redistribute_shard_dim_multi_dim_mesh (2x2x2), for every rank's coordinate. */
static void test_planner(void) {
    struct { int mnd; int nd; hp_placement_t src[3], dst[3]; int comms; } cases[] = {
        {2, 2, {S(0), S(1)}, {S(0), S(0)}, 1},
        {2, 2, {S(0), S(1)}, {S(1), S(0)}, 2},
        {2, 2, {S(0), S(0)}, {S(1), S(1)}, 2},
        {2, 3, {S(0), S(1)}, {S(0), S(0)}, 1},
        {2, 3, {S(0), S(1)}, {S(1), S(0)}, 2},
        {2, 3, {S(0), S(0)}, {S(1), S(1)}, 2},
        {2, 3, {S(0), S(2)}, {S(1), S(0)}, 2},
        {2, 3, {S(1), S(1)}, {S(1), S(2)}, 1},
        {3, 3, {S(0), S(0), S(0)}, {S(1), S(1), S(1)}, 3},
        {3, 3, {S(0), S(1), S(0)}, {S(1), S(0), S(0)}, 3},
        {3, 3, {S(0), S(1), S(2)}, {S(2), S(1), S(0)}, 2},
        {3, 3, {S(1), S(0), S(0)}, {R(), S(0), S(0)}, 1},
        {3, 3, {S(1), R(), S(0)}, {R(), S(0), S(0)}, 2},
        {3, 3, {S(0), S(0), S(1)}, {S(0), S(1), S(2)}, 2},
    };
    int64_t ms[3] = {2, 2, 2}, shape[3] = {8, 8, 8};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        int nranks = 1 << cases[t].mnd;
        for (int r = 0; r < nranks; r++) {
            int c[3];
            for (int i = 0; i < cases[t].mnd; i++) c[i] = (r >> (cases[t].mnd - 1 - i)) & 1;
            char trace[256], a[64], b[64];
            int n = plan_comms(cases[t].nd, shape, cases[t].mnd, ms, c, cases[t].src, cases[t].dst,
                               trace, sizeof trace);
            HP_CHECK(n == cases[t].comms, "%s -> %s: %d comms (%s), expected %d",
                     hp_placements_str(cases[t].mnd, cases[t].src, a, sizeof a),
                     hp_placements_str(cases[t].mnd, cases[t].dst, b, sizeof b), n, trace,
                     cases[t].comms);
        }
    }
    /* exact trace of a nested case: [S0,S0] -> [R,S0] replicates inner first */
    int c[2] = {0, 0};
    char trace[256];
    hp_placement_t src[2] = {S(0), S(0)}, dst[2] = {R(), S(0)};
    plan_comms(1, shape, 2, ms, c, src, dst, trace, sizeof trace);
    HP_CHECK(strcmp(trace, "1:S(0)->R 0:S(0)->R 1:R->S(0)") == 0, "trace '%s'", trace);
    /* logical shape of the inner step is the outer chunk (uneven n = 9 at coord 0: 5) */
    hp_transform_t steps[8];
    int n;
    int64_t s9 = 9;
    HP_CHECK_OK(hp_redistribute_plan(steps, 8, &n, 1, &s9, 2, ms, c, src, dst));
    HP_CHECK(n == 3 && steps[0].logical_shape[0] == 5 && steps[1].logical_shape[0] == 9,
             "logical shapes %lld %lld", (long long)steps[0].logical_shape[0],
             (long long)steps[1].logical_shape[0]);
    /* 1-D: one direct step; none for equal placements */
    hp_placement_t a1 = S(0), b1 = S(0), r1 = R();
    HP_CHECK_OK(hp_redistribute_plan(steps, 8, &n, 1, &s9, 1, ms, c, &a1, &b1));
    HP_CHECK(n == 0, "1-D plan of equal placements is empty");
    HP_CHECK_OK(hp_redistribute_plan(steps, 8, &n, 1, &s9, 1, ms, c, &a1, &r1));
    HP_CHECK(n == 1 && steps[0].logical_shape[0] == 9, "1-D plan has one step");
    HP_CHECK_ERR(hp_redistribute_plan(steps, 1, &n, 1, &s9, 2, ms, c, src, dst), HP_ERR_INVALID_ARG,
                 "more than 1 steps");
}

int main(void) {
    test_shard_sizes();
    test_nested_shards();
    test_strided_shard();
    test_placement_text();
    test_planner();
    return hp_test_finish("test_dtensor_layout");
}
