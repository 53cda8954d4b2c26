/* HSDP parity on 2 x 2 and 2 x 4 meshes (dp_replicate, dp_shard): reduce-scatter over the
 * shard dim then all-reduce over the replicate dim, 10 AdamW steps against the single-rank
 * run; with gradient accumulation (no sync until the last micro-batch); and
 * reshard_after_forward = 2 on the 1-D mesh (post-forward copy sharded over groups of 2). */
// hp-test: ranks 8 timeout 900 coretype 4
#include "test_fsdp_util.h"
#include "hp_test_mpi.h"

int main(int argc, char **argv) {
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &g_rank, &g_world);
    double l[10];
    const pcase_t base = {"hsdp 2 x W/2", 10, 1, 0, HP_FSDP_RESHARD_DEFAULT, 2, 1, HP_F32, HP_F32, DP_INJECT_NONE};
    run_case(world, &base, l);
    pcase_t c = base;
    c.what = "hsdp 2 x W/2 accum 2 (no sync until last)"; c.accum = 2; c.nosync = 1; c.steps = 2;
    run_case(world, &c, l);
    c = base; c.what = "fsdp reshard_after_forward 2"; c.R = 1; c.raf = 2; c.steps = 2;
    run_case(world, &c, l);
    return hp_test_mpi_finish("test_fsdp_hsdp");
}
