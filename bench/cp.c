/* Context-parallel attention per rank: forward + backward time of the CP core (ring attention
 * with head-tail balancing) per rotate method, side by side in one run, and the share of the
 * K/V (dK/dV) communication hidden behind block compute:
 *   hidden = 1 - (seconds blocked waiting for transfers) / (seconds the same transfers take alone).
 * The transfers alone are timed with the same calls and sizes and no compute in between.
 * Second table: a 1-layer llama3 model (dim = heads x hd) with the CP cores installed by
 * hp_cp_apply, each rotate method synchronous and asynchronous (parallelism.context_parallel_async:
 * the K/V collective started from the projection's post-forward hook, so the qk-norm / RoPE
 * work between projection and core also hides it), the model's forward + backward per rank.
 *   mpirun -np 4 bench_cp [--seq 4096] [--batch 1] [--heads 8] [--kv 4] [--hd 64] [--iters 3] */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/comm.h"
#include "hyperparallel/cp.h"
#include "hyperparallel/nn.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"

#define CHECK(expr)                                                                            \
    do {                                                                                       \
        hp_status_t s_ = (expr);                                                               \
        if (s_ != HP_OK) {                                                                     \
            fprintf(stderr, "bench_cp: %s: %s\n", #expr, hp_last_error());                     \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static double max_over(hp_comm_t w, double x) {
    float a = (float)x, y = a;
    CHECK(hp_all_reduce(&a, &y, 1, HP_F32, HP_MAX, w, NULL));
    return y;
}

/* The transfers of one forward + backward without compute (see ring_forward / ring_backward). */
static double comm_alone(hp_comm_t w, hp_cp_rotate_t rot, float *a, float *b, size_t kv) {
    const int R = hp_comm_size(w), g = hp_comm_rank(w), nxt = (g + 1) % R, prv = (g + R - 1) % R;
    hp_barrier(w, NULL);
    double t0 = omp_get_wtime();
    if (rot == HP_CP_ROTATE_ALLGATHER) {
        CHECK(hp_all_gather(a, b, kv, HP_F32, w, NULL));                 // forward
        CHECK(hp_all_gather(a, b, kv, HP_F32, w, NULL));                 // backward: K/V again
        CHECK(hp_reduce_scatter(b, a, kv, HP_F32, HP_SUM, w, NULL));     // dK/dV
    } else {
        const int steps = (R - 1) + (R - 1) + R;                         // K/V fwd, K/V bwd, dK/dV
        for (int i = 0; i < steps; i++) {
            hp_work_t rw = NULL, sw = NULL;
            CHECK(hp_recv(b, kv, HP_F32, prv, w, &rw));
            CHECK(hp_send(a, kv, HP_F32, nxt, w, &sw));
            CHECK(hp_work_wait(&sw));
            CHECK(hp_work_wait(&rw));
        }
    }
    return omp_get_wtime() - t0;
}

int main(int argc, char **argv) {
    hp_comm_t world = NULL;
    CHECK(hp_comm_init(&argc, &argv, &world));
    int T = 4096, B = 1, Hq = 8, Hkv = 4, hd = 64, iters = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seq")) T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) Hq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv")) Hkv = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hd")) hd = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
    }
    const int W = hp_comm_size(world), rank = hp_comm_rank(world), Tl = T / W;
    const int qd = Hq * hd, kd = Hkv * hd, ld = qd + 2 * kd;
    float *x = malloc(sizeof(float) * B * Tl * ld), *o = malloc(sizeof(float) * B * Tl * qd);
    float *dx = malloc(sizeof(float) * B * Tl * ld), *dout = malloc(sizeof(float) * B * Tl * qd);
    const size_t kv = (size_t)B * Tl * 2 * kd;
    float *ca = calloc(kv * W, sizeof(float)), *cb = calloc(kv * W, sizeof(float));
    for (size_t i = 0; i < (size_t)B * Tl * ld; i++) x[i] = (float)sin(0.37 * i + rank);
    for (size_t i = 0; i < (size_t)B * Tl * qd; i++) dout[i] = (float)cos(0.11 * i + rank);
    if (rank == 0)
        printf("bench_cp: %d ranks, T %d (T/cp %d), B %d, heads %d / kv %d, hd %d, %d threads, %d iters "
               "(median of per-iteration max over ranks)\n", W, T, Tl, B, Hq, Hkv, hd, omp_get_max_threads(), iters);
    if (rank == 0) printf("%-10s %12s %12s %12s %12s %8s\n", "rotate", "fwd+bwd s", "compute s", "waited s",
                          "comm alone s", "hidden");
    for (int r = 0; r < 2; r++) {
        hp_cp_options_t opt = hp_cp_options_default();
        opt.rotate = (hp_cp_rotate_t)r;
        hp_cp_t cp = NULL;
        hp_module_t *core = NULL;
        CHECK(hp_cp_create(world, &opt, B, T, Hq, Hkv, hd, &cp));
        CHECK(hp_cp_core_new(cp, "attention.core", Hq, Hkv, &core));
        core->id = 0;
        hp_act_t act;
        CHECK(hp_act_init(&act, 1, core->ops->act_bytes(core, B, Tl) + 4096));
        hp_tensor_t tx, to, tdo, tdx;
        hp_tensor_view2(&tx, x, B * Tl, ld);
        hp_tensor_view2(&to, o, B * Tl, qd);
        hp_tensor_view2(&tdo, dout, B * Tl, qd);
        hp_tensor_view2(&tdx, dx, B * Tl, ld);
        double tot[16], comp[16], wait[16], alone[16];
        for (int it = -1; it < iters && it < 16; it++) {   // it -1: warm-up
            hp_act_reset(&act);
            act.B = B;
            act.T = Tl;
            hp_cp_set_positions(cp, &act);
            hp_cp_timers(cp, NULL, NULL, 1);
            hp_barrier(world, NULL);
            double t0 = omp_get_wtime();
            CHECK(hp_module_forward(core, &act, &tx, &to));
            CHECK(hp_module_backward_input(core, &act, &tdo, &tdx));
            double t = omp_get_wtime() - t0, c = 0, wt = 0;
            hp_cp_timers(cp, &c, &wt, 1);
            double a = comm_alone(world, opt.rotate, ca, cb, kv);
            if (it < 0) continue;
            tot[it] = max_over(world, t);
            comp[it] = max_over(world, c);
            wait[it] = max_over(world, wt);
            alone[it] = max_over(world, a);
        }
        int n = iters < 16 ? iters : 16;
        for (int i = 0; i < n; i++)   // median by sorting each column (small n)
            for (int j = i + 1; j < n; j++) {
                double *cols[4] = {tot, comp, wait, alone};
                for (int k = 0; k < 4; k++)
                    if (cols[k][j] < cols[k][i]) {
                        double s = cols[k][i];
                        cols[k][i] = cols[k][j];
                        cols[k][j] = s;
                    }
            }
        const int m = n / 2;
        double hidden = alone[m] > 0 ? 1.0 - wait[m] / alone[m] : 0.0;
        if (hidden < 0) hidden = 0;
        if (rank == 0)
            printf("%-10s %12.4f %12.4f %12.4f %12.4f %7.0f%%\n", r ? "alltoall" : "allgather", tot[m], comp[m], wait[m],
                   alone[m], 100.0 * hidden);
        hp_act_free(&act);
        hp_cp_destroy(cp);
    }
    /* the model: sync vs async per rotate method */
    hp_model_config_t mc;
    CHECK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.n_layers = 1;
    mc.n_heads = Hq;
    mc.n_kv_heads = Hkv;
    mc.head_dim = hd;
    mc.dim = Hq * hd;
    mc.max_seq_len = T;
    int32_t *tok = malloc(sizeof(int32_t) * B * T), *tgt = malloc(sizeof(int32_t) * B * T);
    int32_t *lt = malloc(sizeof(int32_t) * B * Tl), *lg = malloc(sizeof(int32_t) * B * Tl);
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 7919) % mc.vocab_size;
        tgt[i] = (i * 104729 + 3) % mc.vocab_size;
    }
    if (rank == 0) printf("1-layer llama3 (dim %d), forward + backward of the model per rank:\n%-16s %12s %12s %12s %8s\n",
                          mc.dim, "rotate", "fwd+bwd s", "waited s", "comm alone s", "hidden");
    for (int v = 0; v < 4; v++) {
        hp_cp_options_t opt = hp_cp_options_default();
        opt.rotate = (hp_cp_rotate_t)(v % 2);
        opt.async = v / 2;
        hp_model_t m = NULL;
        hp_cp_t cp = NULL;
        CHECK(hp_model_create(&mc, B, T, &m));
        CHECK(hp_cp_create(world, &opt, B, T, Hq, Hkv, hd, &cp));
        CHECK(hp_cp_apply(cp, m));
        CHECK(hp_model_init_weights(m, 7));
        CHECK(hp_cp_shard_tokens(cp, lt, tok, B));
        CHECK(hp_cp_shard_tokens(cp, lg, tgt, B));
        double tot[16], wait[16], alone[16];
        for (int it = -1; it < iters && it < 16; it++) {
            float loss = 0;
            hp_cp_timers(cp, NULL, NULL, 1);
            hp_barrier(world, NULL);
            double t0 = omp_get_wtime();
            CHECK(hp_model_forward(m, lt, lg, B, Tl, (float)(B * T), &loss));
            CHECK(hp_model_backward(m));
            double t = omp_get_wtime() - t0, wt = 0;
            hp_cp_timers(cp, NULL, &wt, 1);
            double a = comm_alone(world, opt.rotate, ca, cb, kv);
            if (it < 0) continue;
            tot[it] = max_over(world, t);
            wait[it] = max_over(world, wt);
            alone[it] = max_over(world, a);
        }
        int n = iters < 16 ? iters : 16;
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++) {
                double *cols[3] = {tot, wait, alone};
                for (int k = 0; k < 3; k++)
                    if (cols[k][j] < cols[k][i]) {
                        double sw = cols[k][i];
                        cols[k][i] = cols[k][j];
                        cols[k][j] = sw;
                    }
            }
        const int md = n / 2;
        double hidden = alone[md] > 0 ? 1.0 - wait[md] / alone[md] : 0.0;
        if (hidden < 0) hidden = 0;
        if (rank == 0)
            printf("%-16s %12.4f %12.4f %12.4f %7.0f%%\n", v == 0 ? "allgather" : v == 1 ? "alltoall" :
                   v == 2 ? "allgather async" : "alltoall async", tot[md], wait[md], alone[md], 100.0 * hidden);
        hp_model_destroy(m);
        hp_cp_destroy(cp);
    }
    free(tok); free(tgt); free(lt); free(lg);
    free(x); free(o); free(dx); free(dout); free(ca); free(cb);
    hp_comm_finalize();
    return 0;
}
