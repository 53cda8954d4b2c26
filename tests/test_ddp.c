/* DDP: PyTorch's bucket-assignment cases (ComputeBucketAssignmentTest in test_c10d_common.py);
 * the debug model's buckets (1 MiB first, 25 MiB cap, reversed); one all-reduce per bucket
 * per synced backward and none under no_sync; parity with the single-rank run for 10 AdamW
 * steps with and without gradient accumulation (no_sync until the last micro-batch), a
 * small bucket cap (many buckets), overlap on and off (bitwise equal losses); weights of
 * other ranks replaced by rank 0's at creation; DDP over an FSDP model is refused. */
// hp-test: ranks 2 timeout 900 coretype 4
#include "test_ddp_util.h"

#include "hyperparallel/fsdp.h"
#include "hyperparallel/mesh.h"
#include "hp_test_mpi.h"

static void check_assignment(const size_t *bytes, const int *keys, int n, const size_t *limits, int nl,
                             const int *expect_of, int expect_nb, const size_t *expect_limits, const char *what) {
    int of[16];
    size_t lim[16];
    int nb = hp_ddp_bucket_assignment(bytes, keys, n, limits, nl, of, lim);
    int ok = nb == expect_nb;
    for (int i = 0; ok && i < n; i++) ok = of[i] == expect_of[i];
    for (int b = 0; ok && expect_limits && b < nb; b++) ok = lim[b] == expect_limits[b];
    HP_CHECK(ok, "%s: %d buckets (expected %d)", what, nb, expect_nb);
}

static void assignment_cases(void) {
    {   // 4 float tensors of 100, 200, 100, 50 elements, limit [400] -> [[0],[1],[2],[3]]
        size_t b[4] = {400, 800, 400, 200}, l[1] = {400};
        int of[4] = {0, 1, 2, 3};
        check_assignment(b, NULL, 4, l, 1, of, 4, NULL, "single limit");
    }
    {   // alternating float(50) / double(25), [400] -> [[0,2],[1,3],[4],[5]]
        size_t b[6] = {200, 200, 200, 200, 200, 200}, l[1] = {400};
        int k[6] = {0, 1, 0, 1, 0, 1}, of[6] = {0, 1, 0, 1, 2, 3};
        check_assignment(b, k, 6, l, 1, of, 4, NULL, "multiple dtypes");
    }
    {   // four float(10), [40, 80] -> [[0],[1,2],[3]], limits [40, 80, 80]
        size_t b[4] = {40, 40, 40, 40}, l[2] = {40, 80}, el[3] = {40, 80, 80};
        int of[4] = {0, 1, 1, 2};
        check_assignment(b, NULL, 4, l, 2, of, 3, el, "multi limit single dtype");
    }
    {   // alternating float(50) / double(25), [200, 400] -> [[0],[1],[2,4],[3,5]], limits [200,200,400,400]
        size_t b[6] = {200, 200, 200, 200, 200, 200}, l[2] = {200, 400}, el[4] = {200, 200, 400, 400};
        int k[6] = {0, 1, 0, 1, 0, 1}, of[6] = {0, 1, 2, 3, 2, 3};
        check_assignment(b, k, 6, l, 2, of, 4, el, "multi limit multi dtype");
    }
}

int main(int argc, char **argv) {
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &g_rank, &g_world);
    assignment_cases();

    // the debug model: the first bucket (in parameter order) closes at 1 MiB, so the
    // embedding (2 MiB) is alone; reversed, it is the last bucket
    const hp_model_config_t cfg = dp_config(0);
    hp_model_t m = NULL;
    HP_ASSERT(hp_model_create(&cfg, DP_B, DP_T, &m) == HP_OK);
    hp_ddp_t d = NULL;
    HP_CHECK_OK(hp_ddp_create(m, world, NULL, &d));
    if (d) {
        int nb = hp_ddp_num_buckets(d), idx[128];
        int n_last = hp_ddp_bucket_params(d, nb - 1, idx, 128);
        HP_CHECK(nb >= 2 && n_last == 1 && idx[0] == 0, "%d buckets; the last holds %d params (first %d)", nb, n_last,
                 idx[0]);
        hp_comm_t again = NULL;
        hp_ddp_t d2 = NULL;
        (void)again;
        HP_CHECK_ERR(hp_ddp_create(m, world, NULL, &d2), HP_ERR_STATE, "already wrapped by DDP");
        // collectives: one all-reduce per bucket per synced backward, none under no_sync
        int32_t tok[DP_T], tgt[DP_T];
        dp_sequence(0, 0, g_rank, cfg.vocab_size, tok, tgt);
        float l;
        for (int sync = 0; sync < 2; sync++) {
            hp_ddp_set_requires_gradient_sync(d, sync);
            hp_comm_counts_reset();
            HP_CHECK_OK(hp_model_forward(m, tok, tgt, 1, DP_T, 10.0f, &l));
            HP_CHECK_OK(hp_model_backward(m));
            HP_CHECK(hp_comm_count(HP_COMM_ALL_REDUCE) == (uint64_t)(sync ? nb : 0), "sync %d: %llu all-reduces, "
                     "expected %d", sync, (unsigned long long)hp_comm_count(HP_COMM_ALL_REDUCE), sync ? nb : 0);
        }
        hp_ddp_destroy(d);
    }
    // DDP over a fully_shard model
    {
        hp_model_t f = NULL;
        HP_ASSERT(hp_model_create(&cfg, DP_B, DP_T, &f) == HP_OK);
        hp_mesh_t mesh = NULL;
        HP_ASSERT(hp_mesh_from_comm(world, "dp_shard", &mesh) == HP_OK);
        hp_fsdp_t fs = NULL;
        HP_CHECK_OK(hp_fully_shard(f, mesh, NULL, &fs));
        hp_ddp_t d3 = NULL;
        HP_CHECK_ERR(hp_ddp_create(f, world, NULL, &d3), HP_ERR_STATE, "already wrapped by fully_shard");
        hp_fsdp_destroy(fs);
        hp_model_destroy(f);
        hp_mesh_destroy(mesh);
    }
    hp_model_destroy(m);

    double a[10], b[10];
    ddp_parity(world, "ddp", 10, 1, 0, 0, 1, DP_INJECT_NONE, a);
    ddp_parity(world, "ddp overlap off", 2, 1, 0, 0, 0, DP_INJECT_NONE, b);
    dp_check_same_losses(a, b, 2, "overlap on", "off");
    ddp_parity(world, "ddp accum 2 (no_sync until last)", 10, 2, 0, 0, 1, DP_INJECT_NONE, b);
    ddp_parity(world, "ddp bucket cap 1 MiB", 2, 1, 0, (size_t)1 << 20, 1, DP_INJECT_NONE, b);
    // negative tests: each injected error must be reported by the harness
    ddp_parity(world, "ddp negative: rank 1 divisor x 1.001", 2, 1, 0, 0, 1, DP_INJECT_DIVISOR, b);
    ddp_parity(world, "ddp negative: one gradient row off", 2, 1, 0, 0, 1, DP_INJECT_ROW, b);
    return hp_test_mpi_finish("test_ddp");
}
