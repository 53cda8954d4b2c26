/* fully_shard parity on 2, 4 and 8 ranks: the llama3 debug model (T = 8, one sequence per
 * rank per micro-batch) trained with AdamW + clipping against the single-rank run of the
 * whole global batch in the same program (losses, full_tensor of every sharded gradient,
 * gradient norm, final weights); overlap on and off give bitwise equal losses; gradient
 * accumulation with sync every micro-batch and with no sync until the last. Tolerances in
 * tests/test_fsdp_util.h. */
// hp-test: ranks 2 8 timeout 900 coretype 4
#include "test_fsdp_util.h"
#include "hp_test_mpi.h"

int main(int argc, char **argv) {
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &g_rank, &g_world);
    double l_on[10], l_off[10];
    const pcase_t base = {"fsdp f32", 10, 1, 0, HP_FSDP_RESHARD_DEFAULT, 1, 1, HP_F32, HP_F32, DP_INJECT_NONE};
    run_case_overlap_off(world, &base, "fsdp f32 overlap off", l_on);
    pcase_t c = base; c.what = "fsdp accum 2 (sync every micro-batch)"; c.accum = 2; c.steps = 2;
    run_case(world, &c, l_off);
    c = base; c.what = "fsdp accum 2 (no sync until last)"; c.accum = 2; c.nosync = 1; c.steps = 10;
    run_case(world, &c, l_off);
    // negative tests: each injected error must be reported by the harness
    c = base; c.steps = 2;
    c.what = "fsdp negative: rank 1 divisor x 1.001"; c.inject = DP_INJECT_DIVISOR;
    run_case(world, &c, l_off);
    c.what = "fsdp negative: one gradient row off"; c.inject = DP_INJECT_ROW;
    run_case(world, &c, l_off);
    c.what = "fsdp negative: rank 1 lr x (1 + 1e-3)"; c.inject = DP_INJECT_LR;
    run_case(world, &c, l_off);
    return hp_test_mpi_finish("test_fsdp");
}
