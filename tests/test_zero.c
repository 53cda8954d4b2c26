/* ZeroRedundancyOptimizer (ZeRO-1): PyTorch's greedy partition (numel descending, to the rank
 * with the smallest running total, ties to the lowest rank); DDP + ZeRO-1 AdamW parity with
 * the single-rank run for 10 steps, with and without gradient accumulation; optimizer state
 * per rank about 1/W. */
// hp-test: ranks 4 timeout 900 coretype 2
#include "test_ddp_util.h"
#include "hp_test_mpi.h"

int main(int argc, char **argv) {
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &g_rank, &g_world);
    {   // sizes 9, 7, 7, 5, 3, 1 over 3 ranks: 9 -> r0, 7 -> r1, 7 -> r2, 5 -> r1 (7 < 9, tie r1 < r2)...
        int64_t numel[6] = {3, 7, 9, 1, 7, 5};
        int owner[6], expect[6] = {2, 1, 0, 0, 2, 1};
        // order: 9 (i2) r0; 7 (i1) r1; 7 (i4) r2; 5 (i5) r1 (totals 9,7,7 -> r1); 3 (i0) r2 (9,12,7);
        // 1 (i3) r0 (9,12,10)
        hp_zero_partition(numel, 6, 3, owner);
        int ok = 1;
        for (int i = 0; i < 6; i++) ok &= owner[i] == expect[i];
        HP_CHECK(ok, "partition %d %d %d %d %d %d", owner[0], owner[1], owner[2], owner[3], owner[4], owner[5]);
    }
    double l[10];
    ddp_parity(world, "ddp + zero-1", 10, 1, 1, 0, 1, DP_INJECT_NONE, l);
    ddp_parity(world, "ddp + zero-1 accum 2", 2, 2, 1, 0, 1, DP_INJECT_NONE, l);
    // negative test: a sharded optimizer step that is slightly off must be reported
    ddp_parity(world, "ddp + zero-1 negative: rank 1 lr x (1 + 1e-3)", 2, 1, 1, 0, 1, DP_INJECT_LR, l);
    return hp_test_mpi_finish("test_zero");
}
