/* Gradient clipping over meshes: the global norm of sharded (uneven torch.chunk rows) and
 * replicated gradients, summed over the communicators of a 1-D mesh (every rank count) and a
 * 2x2 mesh (4 ranks), equals the norm of the full gradients computed on one rank, and every
 * local shard is scaled by the same coefficient. */
// hp-test: ranks 1 2 4 timeout 60
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/mesh.h"
#include "hyperparallel/optim.h"

#define ROWS 10
#define COLS 3

static float value_a(int64_t i) { return (float)((i * 7) % 13) / 13.0f - 0.4f; }   /* full A (ROWS, COLS) */
static float value_b(int64_t i) { return (float)((i * 5) % 11) / 11.0f - 0.5f; }   /* full B (COLS) */

static double full_norm(void) {
    double s = 0;
    for (int64_t i = 0; i < ROWS * COLS; i++) s += (double)value_a(i) * value_a(i);
    for (int64_t i = 0; i < COLS; i++) s += (double)value_b(i) * value_b(i);
    return sqrt(s);
}

/* A sharded by rows over mesh dim `shard_dim` (torch.chunk), replicated over the other dims;
 * B replicated everywhere. */
static void run(hp_mesh_t mesh, int shard_dim, const char *what) {
    int nd = hp_mesh_ndim(mesh);
    int coord = hp_mesh_get_local_rank(mesh, shard_dim);
    int size = (int)hp_mesh_size(mesh, shard_dim);
    int cs = (ROWS + size - 1) / size;
    int r0 = coord * cs < ROWS ? coord * cs : ROWS;
    int r1 = (coord + 1) * cs < ROWS ? (coord + 1) * cs : ROWS;
    float ga[ROWS * COLS], gb[COLS], va[ROWS * COLS], vb[COLS];
    hp_param_t p[2];
    memset(p, 0, sizeof p);
    snprintf(p[0].name, sizeof p[0].name, "a");
    snprintf(p[1].name, sizeof p[1].name, "b");
    int64_t sa[2] = {r1 - r0, COLS}, sb[1] = {COLS};
    HP_CHECK_OK(hp_tensor_init(&p[0].grad.local, HP_F32, 2, sa, ga));
    HP_CHECK_OK(hp_tensor_init(&p[0].value.local, HP_F32, 2, sa, va));
    HP_CHECK_OK(hp_tensor_init(&p[1].grad.local, HP_F32, 1, sb, gb));
    HP_CHECK_OK(hp_tensor_init(&p[1].value.local, HP_F32, 1, sb, vb));
    for (int k = 0; k < 2; k++) {
        p[k].grad.mesh = mesh;
        p[k].grad.mesh_ndim = nd;
        for (int d = 0; d < nd; d++)
            p[k].grad.placements[d] = (k == 0 && d == shard_dim) ? hp_shard(0) : hp_replicate();
        p[k].value = p[k].grad;
    }
    for (int64_t i = 0; i < (int64_t)(r1 - r0) * COLS; i++) ga[i] = value_a((int64_t)r0 * COLS + i);
    for (int64_t i = 0; i < COLS; i++) gb[i] = value_b(i);
    hp_comm_t comms[HP_MESH_MAX_DIMS];
    for (int d = 0; d < nd; d++) comms[d] = hp_mesh_get_comm(mesh, d);
    double norm = 0, ref = full_norm();
    HP_CHECK_OK(hp_grad_norm(p, 2, comms, nd, &norm));
    HP_CHECK_CLOSE(norm, ref, 1e-6, 0);
    double max_norm = 0.25 * ref;
    HP_CHECK_OK(hp_clip_grad_norm(p, 2, max_norm, comms, nd, &norm));
    float coef = (float)(max_norm / (ref + 1e-6));
    for (int64_t i = 0; i < (int64_t)(r1 - r0) * COLS; i++)
        HP_CHECK_CLOSE(ga[i], value_a((int64_t)r0 * COLS + i) * coef, 1e-6, 1e-7);
    for (int64_t i = 0; i < COLS; i++) HP_CHECK_CLOSE(gb[i], value_b(i) * coef, 1e-6, 1e-7);
    if (hp_comm_rank(comms[0]) == 0 && hp_mesh_get_local_rank(mesh, nd - 1) == 0)
        printf("%s: norm %.7f (full-tensor norm %.7f)\n", what, norm, ref);
}

int main(int argc, char **argv) {
    hp_comm_t W = hp_test_mpi_init(&argc, &argv, NULL, NULL);
    hp_mesh_t m1 = NULL;
    HP_CHECK_OK(hp_mesh_from_comm(W, "dp", &m1));
    if (m1) {
        run(m1, 0, "1-D mesh");
        hp_mesh_destroy(m1);
    }
    if (hp_comm_size(W) == 4) {
        int64_t shape[2] = {2, 2};
        const char *names[2] = {"dp", "tp"};
        hp_mesh_t m2 = NULL;
        HP_CHECK_OK(hp_mesh_create(W, 2, shape, names, &m2));
        if (m2) {
            run(m2, 0, "2x2 mesh, Shard(0) on dp, Replicate on tp");
            run(m2, 1, "2x2 mesh, Replicate on dp, Shard(0) on tp");
            hp_mesh_destroy(m2);
        }
    }
    return hp_test_mpi_finish("test_clip_dist");
}
