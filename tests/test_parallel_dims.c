/* ParallelDims: validation rules (pure arithmetic, every rank count), the refusal of
 * unimplemented parallelisms, and mesh construction on 4 and 8 ranks: the world mesh's
 * coordinates equal the arithmetic layout, and every derived mesh's communicator groups
 * exactly the ranks that differ only on its flattened dims (checked with an all-reduce of
 * world ranks). */
// hp-test: ranks 1 4 8 timeout 120
#include <stdio.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/config.h"
#include "hyperparallel/mesh.h"
#include "hyperparallel/parallel_dims.h"
#include "hyperparallel/parallel_config.h"
#include "hyperparallel/status.h"

static void test_validation(void) {
    hp_parallel_dims_t pd;
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, -1, 1, 1, 1, 1, 1, 8));
    HP_CHECK(pd.dp_shard == 8, "dp_shard -1 -> %d", pd.dp_shard);
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 2, -1, 1, 2, 1, 1, 1, 8));
    HP_CHECK(pd.dp_shard == 2 && hp_parallel_dims_dp(&pd) == 4, "hsdp+tp");
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, -1, 2, 2, 2, 1, 1, 16));
    HP_CHECK(pd.dp_shard == 2 && hp_parallel_dims_fsdp(&pd) == 4 && hp_parallel_dims_loss(&pd) == 4, "fsdp/loss");
    HP_CHECK(hp_parallel_dims_non_dp(&pd) == 8, "non-dp");
    HP_CHECK(hp_parallel_dims_metrics_rank(&pd) == 8, "metrics rank under pp: %d", hp_parallel_dims_metrics_rank(&pd));
    /* ep borrows from dp_shard*cp*tp = 8. */
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, 4, 1, 2, 1, 8, 1, 8));
    HP_CHECK(hp_parallel_dims_efsdp(&pd) == 1, "efsdp");
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, 4, 1, 2, 1, 4, 1, 8));
    HP_CHECK(hp_parallel_dims_efsdp(&pd) == 2, "efsdp 2");
    /* ETP (etp = tp): ep and efsdp split dp_shard*cp alone, efsdp = dp_shard*cp*tp/(ep*etp). */
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, 4, 1, 2, 1, 4, 2, 8));
    HP_CHECK(hp_parallel_dims_efsdp(&pd) == 1, "ETP efsdp 1");
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, 4, 1, 2, 1, 2, 2, 8));
    HP_CHECK(hp_parallel_dims_efsdp(&pd) == 2, "ETP efsdp 2");
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, 2, 2, 1, 1, 2, 1, 4));
    HP_CHECK(hp_parallel_dims_efsdp(&pd) == 2, "cp: efsdp 2");
    HP_CHECK_ERR(hp_parallel_dims_init(&pd, 1, 2, 1, 2, 1, 4, 2, 4), HP_ERR_INVALID_ARG,
                 "'parallelism.expert_parallel_degree' = 4 must divide parallelism.data_parallel_shard_degree * "
                 "context_parallel_degree = 2*1 = 2 with expert_tensor_parallel_degree");

    HP_CHECK_ERR(hp_parallel_dims_init(&pd, 1, 3, 1, 1, 1, 1, 1, 8), HP_ERR_INVALID_ARG,
                 "parallelism.data_parallel_replicate_degree * data_parallel_shard_degree * context_parallel_degree * "
                 "tensor_parallel_degree * pipeline_parallel_degree = 1*3*1*1*1 = 3 must equal the world size 8");
    HP_CHECK_ERR(hp_parallel_dims_init(&pd, 1, -1, 1, 3, 1, 1, 1, 8), HP_ERR_INVALID_ARG,
                 "parallelism.data_parallel_shard_degree=-1 needs the world size (8) to be a multiple of "
                 "parallelism.data_parallel_replicate_degree * context_parallel_degree * tensor_parallel_degree");
    HP_CHECK_ERR(hp_parallel_dims_init(&pd, 0, -1, 1, 1, 1, 1, 1, 8), HP_ERR_INVALID_ARG,
                 "'parallelism.data_parallel_replicate_degree' must be >= 1, got 0");
    HP_CHECK_ERR(hp_parallel_dims_init(&pd, 1, -2, 1, 1, 1, 1, 1, 8), HP_ERR_INVALID_ARG,
                 "'parallelism.data_parallel_shard_degree' must be -1");
    HP_CHECK_ERR(hp_parallel_dims_init(&pd, 1, 2, 1, 2, 2, 3, 1, 8), HP_ERR_INVALID_ARG,
                 "'parallelism.expert_parallel_degree' = 3 must divide parallelism.data_parallel_shard_degree * "
                 "context_parallel_degree * tensor_parallel_degree = 2*1*2 = 4");
    HP_CHECK_ERR(hp_parallel_dims_init(&pd, 1, 2, 1, 4, 1, 1, 2, 8), HP_ERR_INVALID_ARG,
                 "'parallelism.expert_tensor_parallel_degree' = 2 must be 1 or parallelism.tensor_parallel_degree (4)");

    /* From a config, aliases included. */
    hp_config_t c;
    hp_config_defaults(&c);
    HP_CHECK_OK(hp_config_set(&c, "parallelism.tp", "2", "test"));
    HP_CHECK_OK(hp_config_set(&c, "parallelism.pp", "2", "test"));
    HP_CHECK_OK(hp_parallel_dims_from_config(&c, 8, &pd));
    HP_CHECK(pd.tp == 2 && pd.pp == 2 && pd.dp_shard == 2, "from config");
    HP_CHECK_ERR(hp_parallel_dims_from_config(&c, 6, &pd), HP_ERR_INVALID_ARG, "multiple of");

    /* Coordinates: rank = (((pp*R + r)*S + s)*C + c)*T + t. */
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 2, 3, 2, 2, 2, 1, 1, 48));
    for (int rank = 0; rank < 48; rank++) {
        int co[HP_PD_NDIM];
        hp_parallel_dims_coords(&pd, rank, co);
        int back = ((((co[0] * 2 + co[1]) * 3 + co[2]) * 2 + co[3]) * 2) + co[4];
        HP_CHECK(back == rank, "coords of %d", rank);
        HP_CHECK(hp_parallel_dims_batch_rank(&pd, rank) == co[1] * 3 + co[2], "batch rank of %d", rank);
    }

    /* Unimplemented parallelisms are refused, naming the key. */
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, -1, 1, 1, 1, 1, 1, 1));
    HP_CHECK_OK(hp_parallel_dims_check_implemented(&pd, 0));
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, 2, 1, 2, 1, 1, 1, 4));
    HP_CHECK_ERR(hp_parallel_dims_check_implemented(&pd, 0), HP_ERR_UNSUPPORTED,
                 "parallelism.data_parallel_shard_degree=2: fully sharded data parallel (FSDP) is not implemented");
    HP_CHECK_ERR(hp_parallel_dims_check_implemented(&pd, HP_PAR_DP_SHARD), HP_ERR_UNSUPPORTED,
                 "parallelism.tensor_parallel_degree=2: tensor parallel is not implemented in this build yet; set "
                 "--parallelism.tensor_parallel_degree=1");
    HP_CHECK_OK(hp_parallel_dims_check_implemented(&pd, HP_PAR_DP_SHARD | HP_PAR_TP));
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, 1, 2, 1, 2, 1, 1, 4));
    HP_CHECK_ERR(hp_parallel_dims_check_implemented(&pd, HP_PAR_CP), HP_ERR_UNSUPPORTED, "pipeline_parallel_degree=2");
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, 2, 1, 1, 1, 2, 1, 2));
    HP_CHECK_ERR(hp_parallel_dims_check_implemented(&pd, HP_PAR_DP_SHARD), HP_ERR_UNSUPPORTED,
                 "expert_parallel_degree=2");
}

/* Sum of the world ranks y whose coordinates equal x's outside `flat` (a bit set of dims). */
static int expected_group_sum(const hp_parallel_dims_t *pd, int x, unsigned flat) {
    int cx[HP_PD_NDIM], cy[HP_PD_NDIM], sum = 0;
    hp_parallel_dims_coords(pd, x, cx);
    for (int y = 0; y < pd->world_size; y++) {
        hp_parallel_dims_coords(pd, y, cy);
        bool same = true;
        for (int d = 0; d < HP_PD_NDIM; d++)
            if (!(flat & (1u << d)) && cx[d] != cy[d]) same = false;
        if (same) sum += y;
    }
    return sum;
}

static int group_sum(hp_mesh_t m, int dim, int rank) {
    int32_t v = rank, out = -1;
    hp_status_t s = hp_all_reduce(&v, &out, 1, HP_I32, HP_SUM, hp_mesh_get_comm(m, dim), NULL);
    HP_CHECK(s == HP_OK, "all_reduce: %s", hp_last_error());
    return out;
}

static void check_mesh_etp(hp_comm_t world, int r, int s, int c, int t, int p, int e, int et) {
    int rank = hp_comm_rank(world), n = hp_comm_size(world);
    hp_parallel_dims_t pd;
    hp_parallel_meshes_t m;
    HP_CHECK_OK(hp_parallel_dims_init(&pd, r, s, c, t, p, e, et, n));
    HP_CHECK_OK(hp_parallel_dims_build_mesh(&pd, world, &m));
    if (!m.world) return;
    char buf[256];
    HP_CHECK(hp_mesh_ndim(m.world) == HP_PD_NDIM, "world ndim %d (%s)", hp_mesh_ndim(m.world),
             hp_parallel_dims_str(&pd, buf, sizeof buf));
    int co[HP_MESH_MAX_DIMS], want[HP_PD_NDIM];
    HP_CHECK(hp_mesh_get_coordinate(m.world, co), "in mesh");
    hp_parallel_dims_coords(&pd, rank, want);
    for (int d = 0; d < HP_PD_NDIM; d++) {
        HP_CHECK(co[d] == want[d], "%s coord %d vs %d (%s)", hp_parallel_dims_names[d], co[d], want[d],
                 hp_parallel_dims_str(&pd, buf, sizeof buf));
        HP_CHECK(group_sum(m.world, d, rank) == expected_group_sum(&pd, rank, 1u << d), "world dim %s group (%s)",
                 hp_parallel_dims_names[d], hp_parallel_dims_str(&pd, buf, sizeof buf));
    }
    const unsigned R = 1u << HP_PD_DP_REPLICATE, S = 1u << HP_PD_DP_SHARD, C = 1u << HP_PD_CP;
    HP_CHECK(hp_mesh_size(m.batch, -1) == hp_parallel_dims_dp(&pd), "batch size");
    HP_CHECK(hp_mesh_get_local_rank(m.batch, 0) == hp_parallel_dims_batch_rank(&pd, rank), "batch rank %d vs %d",
             hp_mesh_get_local_rank(m.batch, 0), hp_parallel_dims_batch_rank(&pd, rank));
    HP_CHECK(group_sum(m.batch, 0, rank) == expected_group_sum(&pd, rank, R | S), "batch group (%s)",
             hp_parallel_dims_str(&pd, buf, sizeof buf));
    HP_CHECK(hp_mesh_size(m.loss, -1) == hp_parallel_dims_loss(&pd), "loss size");
    HP_CHECK(group_sum(m.loss, 0, rank) == expected_group_sum(&pd, rank, R | S | C), "loss group");
    HP_CHECK(hp_mesh_size(m.fsdp, -1) == hp_parallel_dims_fsdp(&pd), "fsdp size");
    HP_CHECK(group_sum(m.fsdp, 0, rank) == expected_group_sum(&pd, rank, S | C), "fsdp group");
    if (e > 1) {
        HP_CHECK(m.sparse != NULL, "sparse mesh");
        if (m.sparse) {
            /* Inside a dp_shard*cp*tp block the local index is (f*e + j)*et + q: ep groups vary j
             * (consecutive runs of e ranks when et = 1), efsdp groups f, etp groups q (tp's). */
            int block = pd.dp_shard * pd.cp * pd.tp, b0 = rank - rank % block, L = rank % block;
            int f = L / (e * et), j = L / et % e, q = L % et, sum[3] = {0, 0, 0};
            for (int y = b0; y < b0 + block; y++) {
                int yl = y - b0, yf = yl / (e * et), yj = yl / et % e, yq = yl % et;
                sum[0] += yj == j && yq == q ? y : 0;   // efsdp: f varies
                sum[1] += yf == f && yq == q ? y : 0;   // ep: j varies
                sum[2] += yf == f && yj == j ? y : 0;   // etp: q varies
            }
            HP_CHECK(hp_mesh_ndim(m.sparse) == (et > 1 ? 5 : 4), "sparse ndim %d", hp_mesh_ndim(m.sparse));
            HP_CHECK(group_sum(m.sparse, 3, rank) == sum[1], "ep group");
            HP_CHECK(group_sum(m.sparse, 2, rank) == sum[0], "efsdp group");
            if (et > 1) HP_CHECK(group_sum(m.sparse, 4, rank) == sum[2], "etp group");
        }
    } else {
        HP_CHECK(m.sparse == NULL, "no sparse mesh without ep");
    }
    hp_parallel_meshes_destroy(&m);
}

static void check_mesh(hp_comm_t world, int r, int s, int c, int t, int p, int e) {
    check_mesh_etp(world, r, s, c, t, p, e, 1);
}

int main(int argc, char **argv) {
    int n;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, NULL, &n);
    test_validation();
    check_mesh(world, 1, -1, 1, 1, 1, 1);
    if (n == 4) {
        check_mesh(world, 2, 2, 1, 1, 1, 1);
        check_mesh(world, 1, -1, 1, 2, 1, 1);
        check_mesh(world, 1, 1, 2, 1, 2, 1);
        check_mesh(world, 1, 2, 1, 2, 1, 4);
    }
    if (n == 8) {
        check_mesh(world, 1, 2, 1, 2, 2, 1);
        check_mesh(world, 2, 2, 2, 1, 1, 1);
        check_mesh(world, 2, -1, 1, 2, 1, 2);
        check_mesh(world, 1, 2, 2, 2, 1, 4);
        check_mesh_etp(world, 1, 4, 1, 2, 1, 2, 2);   // ETP ep 2 x efsdp 2
        check_mesh_etp(world, 1, 2, 2, 2, 1, 2, 2);   // ETP with cp: (efsdp, ep) over dp_shard x cp
    }
    if (n == 4) check_mesh(world, 1, 2, 2, 1, 1, 2);   // cp: ep 2 x efsdp 2 over dp_shard x cp
    /* The mesh refuses a world size it was not validated for. */
    hp_parallel_dims_t pd;
    hp_parallel_meshes_t m;
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, -1, 1, 1, 1, 1, 1, n + 1));
    HP_CHECK_ERR(hp_parallel_dims_build_mesh(&pd, world, &m), HP_ERR_INVALID_ARG, "validated for a world of");
    return hp_test_mpi_finish("test_parallel_dims");
}
