/* fully_shard with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32 or bf16) on 2 and
 * 4 ranks against fully_shard over a 1-rank mesh under the same policy (the single-rank run
 * with bf16-rounded weights); reshard_after_forward True and False with f32 give identical
 * numbers to the default. */
// hp-test: ranks 4 timeout 900 coretype 2
#include "test_fsdp_util.h"
#include "hp_test_mpi.h"

int main(int argc, char **argv) {
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &g_rank, &g_world);
    double l0[10], l1[10];
    const pcase_t base = {"fsdp bf16 params, f32 reduce (vs 1-rank)", 3, 1, 0, HP_FSDP_RESHARD_DEFAULT, 1, 1,
                          HP_BF16, HP_F32, DP_INJECT_NONE};
    run_case(world, &base, l0);
    pcase_t c = base;
    c.what = "fsdp bf16 params, bf16 reduce (vs 1-rank)"; c.rdt = HP_BF16;
    run_case(world, &c, l0);
    // negative test: a 5% error in one rank's gradients must show through the bf16 reduction
    c.what = "fsdp bf16 reduce negative: rank 1 divisor x 1.05"; c.inject = DP_INJECT_DIVISOR; c.steps = 1;
    run_case(world, &c, l0);
    c = base; c.what = "fsdp f32 reshard_after_forward False"; c.pdt = HP_F32; c.raf = 0; c.steps = 2;
    run_case(world, &c, l0);
    c.what = "fsdp f32 reshard_after_forward True"; c.raf = 1;
    run_case(world, &c, l1);
    dp_check_same_losses(l0, l1, 2, "reshard_after_forward False", "True");
    return hp_test_mpi_finish("test_fsdp_mp");
}
