// Context-parallel attention (cp.h) against full causal attention: for rotate methods allgather
// and alltoall, head-tail balancing and none, Ulysses degrees 1 (ring), 2 and cp (Ulysses, and
// the hybrid ulysses x ring at cp 4), MHA and GQA (ratios 2 and 4), the core's outputs, lse and
// dQ/dK/dV equal hp_ref_attention_forward / _backward of the whole sequence. Also: the head-tail
// balancer indices of PyTorch's examples, the per-document variant, restore = argsort, shard /
// unshard round trip, named errors (T not divisible by 2 cp, Ulysses degree not dividing cp or the
// heads), and a negative test that an injected small error fails the harness.
// hp-test: ranks 2 4 timeout 180
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/cp.h"
#include "hyperparallel/nn.h"
#include "hp_test_mpi.h"
#include "hp_test_rand.h"

/* Against the double reference of the whole sequence: each block is an f32 BLAS product as in
 * test_attention_block.c (rtol 1e-4 / atol 1e-5 forward, twice that backward); the lse merge
 * adds two f32 roundings per merged block (<= 2 cp = 8 blocks per row, ~1e-6 relative) and the
 * dK/dV sum over <= 4 ring ranks adds <= 4 u relative: both well inside those bounds. */
#define FWD_RTOL 1e-4
#define FWD_ATOL 1e-5
#define BWD_RTOL 2e-4
#define BWD_ATOL 2e-5

static uint64_t rng_state;
static float *rnd(size_t n, uint64_t seed) {   // the same on every rank
    rng_state = seed;
    return hp_test_rnd(&rng_state, n, 1.0f);
}

static double worst(const float *a, const float *b, size_t n, double rtol, double atol) {
    double w = 0.0;
    for (size_t i = 0; i < n; i++) {
        double r = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (!(r <= w)) w = isnan(r) ? INFINITY : r;
    }
    return w;
}

static hp_comm_t world;
static int rank, W;

/* One CP variant against the reference; inject > 0 adds that error to one output element
 * (the negative test) and returns the worst ratio instead of checking it. */
static double run_case(hp_cp_rotate_t rot, hp_cp_balancer_t lb, int U, int Hq, int Hkv, double inject) {
    const int B = 2, T = 8 * W, hd = 16, qd = Hq * hd, kd = Hkv * hd, ld = qd + 2 * kd, Tl = T / W;
    float *x = rnd((size_t)B * T * ld, 11), *dout = rnd((size_t)B * T * qd, 12);
    float *ref = malloc(sizeof(float) * B * T * qd), *rlse = malloc(sizeof(float) * B * Hq * T);
    float *rdx = calloc((size_t)B * T * ld, sizeof(float));
    hp_ref_attention_forward(ref, rlse, x, ld, x + qd, ld, x + qd + kd, ld, B, T, Hq, Hkv, hd);
    hp_ref_attention_backward(rdx, ld, rdx + qd, ld, rdx + qd + kd, ld, dout, x, ld, x + qd, ld, x + qd + kd, ld, B, T,
                              Hq, Hkv, hd);
    hp_cp_options_t o = {.rotate = rot, .balancer = lb, .ulysses_degree = U};
    hp_cp_t cp = NULL;
    hp_module_t *core = NULL;
    double w_all = 0.0;
    HP_CHECK_OK(hp_cp_create(world, &o, B, T, Hq, Hkv, hd, &cp));
    HP_CHECK_OK(hp_cp_core_new(cp, "layers.0.attention.core", Hq, Hkv, &core));
    if (!cp || !core) return INFINITY;
    core->id = 0;
    hp_act_t act;
    HP_CHECK_OK(hp_act_init(&act, 1, core->ops->act_bytes(core, B, Tl) + 4096));
    act.B = B;
    act.T = Tl;
    hp_cp_set_positions(cp, &act);
    float *xl = malloc(sizeof(float) * B * Tl * ld), *ol = malloc(sizeof(float) * B * Tl * qd);
    float *dol = malloc(sizeof(float) * B * Tl * qd), *dxl = malloc(sizeof(float) * B * Tl * ld);
    float *gath = malloc(sizeof(float) * W * B * Tl * ld), *full = malloc(sizeof(float) * B * T * ld);
    HP_CHECK_OK(hp_cp_shard_rows(xl, x, sizeof(float) * ld, B, T, W, rank, lb));
    HP_CHECK_OK(hp_cp_shard_rows(dol, dout, sizeof(float) * qd, B, T, W, rank, lb));
    hp_tensor_t tx, to, tdo, tdx;
    hp_tensor_view2(&tx, xl, B * Tl, ld);
    hp_tensor_view2(&to, ol, B * Tl, qd);
    hp_tensor_view2(&tdo, dol, B * Tl, qd);
    hp_tensor_view2(&tdx, dxl, B * Tl, ld);
    HP_CHECK_OK(hp_module_forward(core, &act, &tx, &to));
    /* lse rows this rank holds, against the reference at their global positions */
    const float *lse;
    int nh, h0, rows, r0;
    HP_CHECK_OK(hp_cp_core_lse(core, &act, &lse, &nh, &h0, &rows, &r0));
    int32_t *idx = malloc(sizeof(int32_t) * T);
    HP_CHECK_OK(hp_cp_shard_indices(T, W, lb, idx));
    double wl = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++)
            for (int r = 0; r < rows; r++) {
                const int p = idx[(r0 + r / Tl) * Tl + r % Tl];
                float a = lse[((size_t)b * nh + h) * rows + r], e = rlse[((size_t)b * Hq + h0 + h) * T + p];
                double q = fabs((double)a - e) / (FWD_ATOL + FWD_RTOL * fabs((double)e));
                if (!(q <= wl)) wl = isnan(q) ? INFINITY : q;
            }
    HP_CHECK_OK(hp_module_backward_input(core, &act, &tdo, &tdx));
    /* gather and restore the outputs and gradients */
    if (inject > 0.0 && rank == 0) ol[3] += (float)inject;
    HP_CHECK_OK(hp_all_gather(ol, gath, (size_t)B * Tl * qd, HP_F32, world, NULL));
    HP_CHECK_OK(hp_cp_unshard_rows(full, gath, sizeof(float) * qd, B, T, W, lb));
    double wo = worst(full, ref, (size_t)B * T * qd, FWD_RTOL, FWD_ATOL);
    HP_CHECK_OK(hp_all_gather(dxl, gath, (size_t)B * Tl * ld, HP_F32, world, NULL));
    HP_CHECK_OK(hp_cp_unshard_rows(full, gath, sizeof(float) * ld, B, T, W, lb));
    double wd = worst(full, rdx, (size_t)B * T * ld, BWD_RTOL, BWD_ATOL);
    w_all = fmax(fmax(wo, wl), wd);
    if (inject == 0.0)
        HP_CHECK(w_all <= 1.0, "cp %d rotate %s lb %s ulysses %d heads %d/%d: out %.3g lse %.3g dqkv %.3g of the bound",
                 W, rot == HP_CP_ROTATE_ALLGATHER ? "allgather" : "alltoall", lb ? "headtail" : "none", U, Hq, Hkv, wo,
                 wl, wd);
    hp_act_free(&act);
    hp_cp_destroy(cp);
    free(x); free(dout); free(ref); free(rlse); free(rdx); free(xl); free(ol); free(dol); free(dxl); free(gath);
    free(full); free(idx);
    return w_all;
}

static void check_indices(void) {
    int32_t idx[16], res[16];
    const int32_t e82[8] = {0, 1, 6, 7, 2, 3, 4, 5}, e84[8] = {0, 7, 1, 6, 2, 5, 3, 4};
    HP_CHECK_OK(hp_cp_shard_indices(8, 2, HP_CP_BALANCE_HEADTAIL, idx));
    HP_CHECK(memcmp(idx, e82, sizeof e82) == 0, "head-tail T=8 cp=2: %d %d %d %d %d %d %d %d", idx[0], idx[1], idx[2],
             idx[3], idx[4], idx[5], idx[6], idx[7]);
    HP_CHECK_OK(hp_cp_shard_indices(8, 4, HP_CP_BALANCE_HEADTAIL, idx));
    HP_CHECK(memcmp(idx, e84, sizeof e84) == 0, "head-tail T=8 cp=4 differs from PyTorch's [0,7,1,6,2,5,3,4]");
    hp_cp_restore_indices(idx, 8, res);
    for (int i = 0; i < 8; i++) HP_CHECK(idx[res[i]] == i, "restore is not argsort at %d", i);
    const int docs[2] = {8, 4};
    const int32_t ed[12] = {0, 1, 6, 7, 8, 11, 2, 3, 4, 5, 9, 10};
    HP_CHECK_OK(hp_cp_shard_indices_docs(docs, 2, 2, idx));
    HP_CHECK(memcmp(idx, ed, sizeof ed) == 0, "per-document head-tail docs (8, 4) cp=2");
    HP_CHECK_OK(hp_cp_shard_indices(8, 2, HP_CP_BALANCE_NONE, idx));
    for (int i = 0; i < 8; i++) HP_CHECK(idx[i] == i, "none: identity");
    /* shard / unshard round trip over all ranks' rows */
    int32_t g[2 * 16], loc[4][2 * 4], back[2 * 16], cat[4 * 2 * 4];
    for (int i = 0; i < 32; i++) g[i] = i;
    for (int r = 0; r < 4; r++) HP_CHECK_OK(hp_cp_shard_rows(loc[r], g, sizeof(int32_t), 2, 16, 4, r, HP_CP_BALANCE_HEADTAIL));
    HP_CHECK(loc[1][0] == 2 && loc[1][2] == 12 && loc[1][4] == 18, "rank 1's rows of head-tail T=16 cp=4");
    memcpy(cat, loc, sizeof cat);
    HP_CHECK_OK(hp_cp_unshard_rows(back, cat, sizeof(int32_t), 2, 16, 4, HP_CP_BALANCE_HEADTAIL));
    HP_CHECK(memcmp(back, g, sizeof g) == 0, "unshard(shard(x)) != x");
    /* named errors */
    HP_CHECK_ERR(hp_cp_shard_indices(12, 4, HP_CP_BALANCE_HEADTAIL, idx), HP_ERR_INVALID_ARG, "training.seq_len");
    HP_CHECK_ERR(hp_cp_shard_indices_docs((const int[]){6, 6}, 2, 2, idx), HP_ERR_INVALID_ARG, "2 x cp = 4");
    hp_cp_rotate_t rt;
    HP_CHECK_ERR(hp_cp_rotate_parse("ring", "parallelism.context_parallel_rotate_method", &rt), HP_ERR_INVALID_ARG,
                 "parallelism.context_parallel_rotate_method");
}

static void check_errors(void) {
    hp_cp_t cp = NULL;
    hp_cp_options_t o = hp_cp_options_default();
    HP_CHECK_ERR(hp_cp_create(world, &o, 1, 8 * W + 2, 4, 2, 16, &cp), HP_ERR_INVALID_ARG, "2 x cp");
    o.ulysses_degree = 3;
    HP_CHECK_ERR(hp_cp_create(world, &o, 1, 8 * W, 6, 6, 16, &cp), HP_ERR_INVALID_ARG,
                 "context_parallel_ulysses_degree = 3 does not divide parallelism.context_parallel_degree");
    o.ulysses_degree = W;
    HP_CHECK_ERR(hp_cp_create(world, &o, 1, 8 * W, 8, 1, 16, &cp), HP_ERR_INVALID_ARG,
                 "context_parallel_ulysses_degree");
    HP_CHECK(cp == NULL, "a refused hp_cp_create returned a handle");
}

int main(int argc, char **argv) {
    world = hp_test_mpi_init(&argc, &argv, &rank, &W);
    check_indices();
    check_errors();
    const int heads[][2] = {{8, 8}, {8, 4}, {8, 2}};
    for (int rot = 0; rot < 2; rot++)
        for (int lb = 0; lb < 2; lb++)
            for (int h = 0; h < 3; h++)
                for (int U = 1; U <= W; U *= 2) {
                    if (heads[h][1] % U != 0) continue;
                    run_case((hp_cp_rotate_t)rot, (hp_cp_balancer_t)lb, U, heads[h][0], heads[h][1], 0.0);
                }
    double w = run_case(HP_CP_ROTATE_ALLTOALL, HP_CP_BALANCE_HEADTAIL, 1, 8, 4, 1e-3);
    HP_CHECK(w > 1.0, "negative test: an injected 1e-3 output error passed the harness (%.3g of the bound)", w);
    int rc = hp_test_finish("test_cp_attention");
    hp_comm_finalize();
    return rc;
}
