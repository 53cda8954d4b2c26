/* Steady state allocates nothing: after one warm-up "step" of mixed collectives (blocking,
 * asynchronous with two in flight, widened BF16, PREMUL_SUM, in-place, all_to_all_v, grouped
 * point-to-point), repeating the step makes no allocation in the comm layer, under every
 * progress mechanism. Results are checked too, so the step is not vacuous. */
// hp-test: ranks 2 4 timeout 120
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm-impl.h"
#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/comm.h"

enum { NEL = 4099 };   /* prime */

static hp_comm_t W;
static int R, N;
static float *A, *B, *C;        // (N*NEL) f32 buffers
static uint16_t *H;             // (NEL) bf16
static size_t SC[64], SD[64], RC[64], RD[64];
static hp_redop_t HALF;

static void step(int check) {
    for (size_t i = 0; i < NEL; i++) A[i] = (float)(R + 1), H[i] = hp_f32_to_bf16((float)(2 * R));
    HP_CHECK_OK(hp_all_reduce(A, B, NEL, HP_F32, HP_SUM, W, NULL));
    HP_CHECK_OK(hp_all_reduce(H, H, NEL, HP_BF16, HP_AVG, W, NULL));
    if (check) {
        HP_CHECK(B[NEL - 1] == (float)(N * (N + 1) / 2), "f32 sum %g", B[NEL - 1]);
        HP_CHECK(hp_bf16_to_f32(H[7]) == (float)(N - 1), "bf16 avg %g", hp_bf16_to_f32(H[7]));
    }
    /* two asynchronous operations in flight at once */
    hp_work_t w1 = NULL, w2 = NULL;
    for (size_t i = 0; i < NEL; i++) A[i] = (float)R;
    HP_CHECK_OK(hp_all_gather(A, C, NEL, HP_F32, W, &w1));
    HP_CHECK_OK(hp_all_reduce(B, B, NEL, HP_F32, HALF, W, &w2));
    HP_CHECK_OK(hp_work_wait(&w2));
    HP_CHECK_OK(hp_work_wait(&w1));
    if (check) {
        HP_CHECK(C[(size_t)(N - 1) * NEL] == (float)(N - 1), "all_gather %g", C[(size_t)(N - 1) * NEL]);
        float want = 0.5f * (float)N * (float)(N * (N + 1) / 2);
        HP_CHECK(B[3] == want, "premul %g vs %g", B[3], want);
    }
    /* in-place reduce_scatter and all_to_all */
    for (size_t i = 0; i < (size_t)N * NEL; i++) C[i] = 1.0f;
    HP_CHECK_OK(hp_reduce_scatter(C, C + (size_t)R * NEL, NEL, HP_F32, HP_SUM, W, NULL));
    if (check) HP_CHECK(C[(size_t)R * NEL + 5] == (float)N, "reduce_scatter %g", C[(size_t)R * NEL + 5]);
    HP_CHECK_OK(hp_all_to_all(C, C, NEL, HP_F32, W, NULL));
    HP_CHECK_OK(hp_all_to_all_v(A, SC, SD, B, RC, RD, HP_F32, W, NULL));
    /* grouped ring exchange */
    HP_CHECK_OK(hp_group_start());
    HP_CHECK_OK(hp_send(A, NEL, HP_F32, (R + 1) % N, W, NULL));
    HP_CHECK_OK(hp_recv(B, NEL, HP_F32, (R + N - 1) % N, W, NULL));
    HP_CHECK_OK(hp_group_end());
    if (check) HP_CHECK(B[1] == (float)((R + N - 1) % N), "ring %g", B[1]);
    HP_CHECK_OK(hp_barrier(W, NULL));
}

int main(int argc, char **argv) {
    W = hp_test_mpi_init(&argc, &argv, &R, &N);
    hp_comm_set_timeout(60);
    A = calloc((size_t)N * NEL, sizeof *A);
    B = calloc((size_t)N * NEL, sizeof *B);
    C = calloc((size_t)N * NEL, sizeof *C);
    H = calloc(NEL, sizeof *H);
    if (!A || !B || !C || !H || N > 64) return 2;
    /* uneven counts 0..2 at stride 3; rank j sends me (j + R) % 3, as many as I send it */
    for (int j = 0; j < N; j++)
        SC[j] = RC[j] = (size_t)((R + j) % 3), SD[j] = RD[j] = 3 * (size_t)j;
    HP_CHECK_OK(hp_redop_create_premul_sum(0.5, W, &HALF));
    const char *modes[3] = {"poll", "thread", "none"};
    for (int m = 0; m < 3; m++) {
        HP_CHECK_OK(hp_comm_set_progress(modes[m]));
        step(1);   /* warm-up: may grow the pool and workspaces */
        uint64_t before = hp_comm_debug_allocs();
        for (int it = 0; it < 5; it++) step(it == 4);
        uint64_t after = hp_comm_debug_allocs();
        HP_CHECK(after == before, "progress %s: %llu allocations in 5 steady-state steps", modes[m],
                 (unsigned long long)(after - before));
    }
    HP_CHECK_OK(hp_comm_set_progress("poll"));
    HP_CHECK_OK(hp_redop_destroy(HALF, W));
    free(A), free(B), free(C), free(H);
    return hp_test_mpi_finish("test_comm_steady");
}
