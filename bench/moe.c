/* MoE layer benchmark (docs/moe.md, docs/performance.md): the MoE feed-forward's time split
 * into route (gate GEMM, scores, top-k, permutation, gather), dispatch (count exchange, the
 * all_to_all_v of rows both ways and the rank-major <-> expert-major permutations; 0 at ep 1),
 * experts (the grouped GEMMs and SwiGLU, shared experts included) and combine, forward plus
 * backward, from the per-op profile of a 2-layer all-MoE model; and the grouped-GEMM
 * efficiency: hp_moe_experts_forward over E experts with the routed rows against one sgemm
 * chain of the same total size (all N*K rows through one expert's weights).
 *   mpirun -np {1,2,4} bench_moe [--iters 5] [--dim 256] [--hidden 256] [--experts 8] [--top-k 2]
 *                                [--tokens 512]
 * With --model NAME (deepseek_v3, qwen3_moe) the flavor's whole model instead (--flavor,
 * default debugmodel; --batch 8 --seq 128, the peer harness's shapes), expert parallel over
 * the ranks: every op of the per-op profile (max over ranks), the step, tokens/s per rank and
 * the FLOP rate by the trainer's formula; --experts, --top-k, --hidden, --layers, --head-dim,
 * --dense-layers replace the flavor's sizes (TorchTitan 0.3.0's qwen3 debugmodel_moe: --model
 * qwen3_moe --layers 8 --head-dim 128 --experts 64 --top-k 8 --hidden 768 --dense-layers 0).
 * With --mla-core T: MLA's attention core alone (one thread, 8 heads, q|k 192, v 128, B 1),
 * forward + backward with separate widths against the padded one-width kernel (v at 192), in
 * alternating rounds: the padding waste the separate widths remove.
 * Short runs only: the machine may be shared; the numbers say so (load average printed). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyperparallel/comm.h"
#include "hyperparallel/ep.h"
#include "hyperparallel/mesh.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/nn.h"

#define CHECK(x)                                                                 \
    do {                                                                         \
        hp_status_t s_ = (x);                                                    \
        if (s_ != HP_OK) {                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, hp_last_error()); \
            return 1;                                                            \
        }                                                                        \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double load_avg(void) {
    double l = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = 0;
        fclose(f);
    }
    return l;
}

/* --model: the flavor's whole model, forward + backward, expert parallel over the ranks (ep =
 * world size); the per-op profile (max over ranks) and the step's rate. */
static int bench_model(hp_comm_t world, const char *name, const char *flavor, int B, int T, int iters,
                       const int *over) {
    const int rank = hp_comm_rank(world), ws = hp_comm_size(world);
    hp_model_config_t c;
    CHECK(hp_model_flavor(name, flavor, &c));
    // sizes given on the command line (> 0) replace the flavor's: experts, top-k, expert hidden,
    // layers, head_dim, dense layers + 1 (0 dense layers is 1)
    if (over[0] > 0) c.moe_experts = over[0];
    if (over[1] > 0) c.moe_top_k = over[1];
    if (over[2] > 0) c.moe_hidden = over[2];
    if (over[3] > 0) c.n_layers = over[3];
    if (over[4] > 0) c.head_dim = over[4];
    if (over[5] > 0) c.moe_n_dense_layers = over[5] - 1;
    c.max_seq_len = T;   // as the trainer: short runs have plain RoPE (docs/moe.md)
    CHECK(hp_model_config_validate(&c));
    const int N = B * T;
    hp_model_t m = NULL;
    CHECK(hp_model_create(&c, B, T, &m));
    hp_mesh_t mesh = NULL;
    hp_ep_t ep = NULL;
    if (ws > 1) {
        const int64_t shape[1] = {ws};
        const char *dn[1] = {"ep"};
        CHECK(hp_mesh_create(world, 1, shape, dn, &mesh));
        CHECK(hp_ep_parallelize_model(m, mesh, &ep));
    }
    CHECK(hp_model_init_weights(m, 1));
    int32_t *tk = malloc(sizeof(int32_t) * (size_t)N), *tg = malloc(sizeof(int32_t) * (size_t)N);
    uint32_t s = 7u + 13u * (uint32_t)rank;
    for (int i = 0; i < N; i++) { s = s * 1664525u + 1013904223u; tk[i] = (int32_t)((s >> 8) % (uint32_t)c.vocab_size); }
    for (int i = 0; i < N; i++) tg[i] = tk[(i + 1) % N];
    float loss;
    CHECK(hp_model_forward(m, tk, tg, B, T, (float)N, &loss));   // warm-up
    CHECK(hp_model_backward(m));
    const char **names;
    const double *sec;
    const int nops = hp_model_profile(m, &names, &sec);
    double acc[HP_NN_OP_COUNT + 1] = {0}, best = 1e30;
    for (int it = 0; it < iters; it++) {
        const double t0 = now();
        CHECK(hp_model_forward(m, tk, tg, B, T, (float)N, &loss));
        CHECK(hp_model_backward(m));
        const double dt = now() - t0;
        best = fmin(best, dt);
        acc[HP_NN_OP_COUNT] += dt / iters;
        for (int o = 0; o < nops; o++) acc[o] += sec[o] / iters;
    }
    float loc[HP_NN_OP_COUNT + 1], mx[HP_NN_OP_COUNT + 1];
    for (int o = 0; o <= HP_NN_OP_COUNT; o++) loc[o] = (float)acc[o];
    CHECK(hp_all_reduce(loc, mx, HP_NN_OP_COUNT + 1, HP_F32, HP_MAX, world, NULL));
    if (rank == 0) {
        const double step = mx[HP_NN_OP_COUNT], fpt = hp_model_flops_per_token(&c, T);
        double prof = 0;
        for (int o = 0; o < nops; o++) prof += mx[o];
        printf("bench_moe --model %s/%s: ep %d, B %d, T %d, %d threads, load %.2f; forward + backward (no optimizer)\n",
               name, flavor, ws, B, T, omp_get_max_threads(), load_avg());
        printf("  step %.1f ms (best %.1f), %.0f tokens/s per rank, %.1f GFLOP/s per rank (%.1f MFLOP/token)\n",
               1e3 * step, 1e3 * best, N / step, fpt * N / step * 1e-9, fpt * 1e-6);
        for (int o = 0; o < nops; o++)
            if (mx[o] > 0) printf("  %-22s %8.1f ms  %5.1f%%\n", names[o], 1e3 * mx[o], 100.0 * mx[o] / step);
        printf("  %-22s %8.1f ms  %5.1f%%\n", "(outside the profile)", 1e3 * (step - prof), 100.0 * (step - prof) / step);
    }
    hp_ep_destroy(ep);
    hp_model_destroy(m);
    hp_mesh_destroy(mesh);
    free(tk);
    free(tg);
    return 0;
}

/* --mla-core: the core with separate widths against the padded one, alternating, best of rounds. */
static int bench_mla_core(int T, int iters) {
    const int H = 8, hd = 192, hv = 128, N = T, ldp = 3 * H * hd, lds = H * (2 * hd + hv);
    float *xp = calloc((size_t)N * ldp, sizeof(float)), *xs = calloc((size_t)N * lds, sizeof(float));
    float *op = malloc(sizeof(float) * (size_t)N * H * hd), *os = malloc(sizeof(float) * (size_t)N * H * hv);
    float *dp = calloc((size_t)N * H * hd, sizeof(float)), *ds = malloc(sizeof(float) * (size_t)N * H * hv);
    float *gp = malloc(sizeof(float) * (size_t)N * ldp), *gs = malloc(sizeof(float) * (size_t)N * lds);
    float *lse = malloc(sizeof(float) * (size_t)N * H);
    uint32_t r = 12345u;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H * (2 * hd + hv); j++) {
            r = r * 1664525u + 1013904223u;
            const float v = (float)(r >> 8) * (1.0f / 16777216.0f) - 0.5f;
            xs[(size_t)n * lds + j] = v;
            const int part = j < 2 * H * hd ? j : 2 * H * hd + (j - 2 * H * hd) / hv * hd + (j - 2 * H * hd) % hv;
            xp[(size_t)n * ldp + part] = v;   // v heads padded to hd with zeros
        }
    for (int i = 0; i < N * H; i++)
        for (int d = 0; d < hv; d++) ds[(size_t)i * hv + d] = dp[(size_t)i * hd + d] = 1e-3f * (float)((i + d) % 7);
    double best_p = 1e30, best_s = 1e30;
    for (int it = 0; it < iters + 1; it++) {
        double t0 = now();
        hp_attention_forward(op, lse, xp, ldp, xp + H * hd, ldp, xp + 2 * H * hd, ldp, 1, T, H, H, hd);
        hp_attention_backward(gp, ldp, gp + H * hd, ldp, gp + 2 * H * hd, ldp, dp, op, lse, xp, ldp, xp + H * hd, ldp,
                              xp + 2 * H * hd, ldp, 1, T, H, H, hd);
        double t1 = now();
        hp_attention_forward_qk_v(os, lse, xs, lds, xs + H * hd, lds, xs + 2 * H * hd, lds, 1, T, H, H, hd, hv);
        hp_attention_backward_qk_v(gs, lds, gs + H * hd, lds, gs + 2 * H * hd, lds, ds, os, lse, xs, lds, xs + H * hd,
                                   lds, xs + 2 * H * hd, lds, 1, T, H, H, hd, hv);
        double t2 = now();
        if (it > 0) {   // one warm-up round
            best_p = fmin(best_p, t1 - t0);
            best_s = fmin(best_s, t2 - t1);
        }
    }
    printf("bench_moe --mla-core: T %d, %d heads, q|k %d, v %d, %d threads, load %.2f: forward + backward padded "
           "(v at %d) %.1f ms, separate widths %.1f ms (%.2fx)\n", T, H, hd, hv, omp_get_max_threads(), load_avg(), hd,
           1e3 * best_p, 1e3 * best_s, best_p / best_s);
    free(xp); free(xs); free(op); free(os); free(dp); free(ds); free(gp); free(gs); free(lse);
    return 0;
}

int main(int argc, char **argv) {
    hp_comm_t world = NULL;
    CHECK(hp_comm_init(&argc, &argv, &world));
    const int rank = hp_comm_rank(world), ws = hp_comm_size(world);
    int iters = 5, dim = 256, hidden = 256, experts = 8, top_k = 2, tokens = 512, batch = 8, seq = 128;
    const char *model = NULL, *flavor = "debugmodel";
    int mla_core = 0, over[6] = {0};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--mla-core")) mla_core = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers")) over[3] = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--head-dim")) over[4] = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dense-layers")) over[5] = atoi(argv[i + 1]) + 1;
        else if (!strcmp(argv[i], "--flavor")) flavor = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) seq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dim")) dim = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hidden")) hidden = over[2] = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--experts")) experts = over[0] = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--top-k")) top_k = over[1] = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens")) tokens = atoi(argv[i + 1]);
    }
    if (mla_core > 0 || model) {
        const int rc = mla_core > 0 ? (rank == 0 ? bench_mla_core(mla_core, iters) : 0)
                                    : bench_model(world, model, flavor, batch, seq, iters, over);
        hp_comm_finalize();
        return rc;
    }
    hp_model_config_t c;
    CHECK(hp_model_flavor("qwen3_moe", "debugmodel", &c));
    c.dim = dim;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 4;
    c.head_dim = dim / 4;
    c.moe_hidden = hidden;
    c.moe_experts = experts;
    c.moe_top_k = top_k;
    c.moe_n_dense_layers = 0;
    c.vocab_size = 512;
    c.max_seq_len = 128;
    CHECK(hp_model_config_validate(&c));
    const int T = 128, B = tokens / T > 0 ? tokens / T : 1, N = B * T;
    hp_model_t m = NULL;
    CHECK(hp_model_create(&c, B, T, &m));
    hp_mesh_t mesh = NULL;
    hp_ep_t ep = NULL;
    if (ws > 1) {
        const int64_t shape[1] = {ws};
        const char *dn[1] = {"ep"};
        CHECK(hp_mesh_create(world, 1, shape, dn, &mesh));
        CHECK(hp_ep_parallelize_model(m, mesh, &ep));
    }
    CHECK(hp_model_init_weights(m, 1));
    int32_t *tk = malloc(sizeof(int32_t) * (size_t)N), *tg = malloc(sizeof(int32_t) * (size_t)N);
    uint32_t s = 7u + 13u * (uint32_t)rank;
    for (int i = 0; i < N; i++) { s = s * 1664525u + 1013904223u; tk[i] = (int32_t)((s >> 8) % 512u); }
    for (int i = 0; i < N; i++) tg[i] = tk[(i + 1) % N];
    float loss;
    CHECK(hp_model_forward(m, tk, tg, B, T, (float)N, &loss));   // warm-up
    CHECK(hp_model_backward(m));
    const char **names;
    const double *sec;
    hp_model_profile(m, &names, &sec);   // per step (the profile restarts with each forward)
    double route = 0, disp = 0, exps = 0, comb = 0;
    double t0 = now();
    for (int it = 0; it < iters; it++) {
        CHECK(hp_model_forward(m, tk, tg, B, T, (float)N, &loss));
        CHECK(hp_model_backward(m));
        route += sec[HP_NN_OP_MOE_ROUTE] / iters;
        disp += sec[HP_NN_OP_MOE_DISPATCH] / iters;
        exps += sec[HP_NN_OP_MOE_EXPERTS] / iters;
        comb += sec[HP_NN_OP_MOE_COMBINE] / iters;
    }
    const double wall = (now() - t0) / iters;
    float loc[4] = {(float)route, (float)disp, (float)exps, (float)comb}, mx[4];
    CHECK(hp_all_reduce(loc, mx, 4, HP_F32, HP_MAX, world, NULL));
    if (rank == 0) {
        const double moe = mx[0] + mx[1] + mx[2] + mx[3];
        printf("bench_moe: ep %d, %d tokens/rank, dim %d, %d experts of hidden %d, top-%d, 2 MoE layers, %d threads, "
               "load %.2f\n", ws, N, dim, experts, hidden, top_k, omp_get_max_threads(), load_avg());
        printf("  fwd+bwd per step (max over ranks, ms): route %.2f  dispatch %.2f  experts %.2f  combine %.2f  "
               "(MoE %.2f of step %.2f); all-to-all share of the MoE layer %.1f%%\n",
               1e3 * mx[0], 1e3 * mx[1], 1e3 * mx[2], 1e3 * mx[3], 1e3 * moe, 1e3 * wall,
               moe > 0 ? 100.0 * mx[1] / moe : 0.0);
    }
    /* grouped-GEMM efficiency on one rank: E experts over their routed rows (balanced:
     * N*K/E rows each) against the same total rows through one expert */
    if (rank == 0) {
        const int NK = N * top_k, D = dim, F = hidden;
        float *xs = malloc(sizeof(float) * (size_t)NK * D), *ys = malloc(sizeof(float) * (size_t)NK * D);
        float *h1 = malloc(sizeof(float) * (size_t)NK * F), *h3 = malloc(sizeof(float) * (size_t)NK * F);
        float *a = malloc(sizeof(float) * (size_t)NK * F);
        float *w = malloc(sizeof(float) * (size_t)experts * F * D * 3);
        for (size_t i = 0; i < (size_t)NK * D; i++) xs[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        for (size_t i = 0; i < (size_t)experts * F * D * 3; i++) w[i] = (float)((i * 40503u) % 1000) * 1e-4f - 0.05f;
        int32_t off_g[HP_MOE_MAX_EXPERTS + 1], off_1[2] = {0, NK};
        for (int e = 0; e <= experts; e++) off_g[e] = (int32_t)((int64_t)NK * e / experts);
        const hp_backend_t *be = hp_backend_default();
        const float *w1 = w, *w2 = w + (size_t)experts * F * D, *w3 = w + 2 * (size_t)experts * F * D;
        double best_g = 1e30, best_1 = 1e30;
        for (int r = 0; r < 2 * iters + 2; r++) {
            double ta = now();
            hp_moe_experts_forward(be, ys, h1, h3, a, xs, w1, w2, w3, off_g, experts, D, F);
            double tb = now();
            hp_moe_experts_forward(be, ys, h1, h3, a, xs, w1, w2, w3, off_1, 1, D, F);
            double tc = now();
            if (r >= 2) {   // two warm-up rounds
                best_g = fmin(best_g, tb - ta);
                best_1 = fmin(best_1, tc - tb);
            }
        }
        const double flop = 3.0 * 2.0 * NK * (double)D * F;
        printf("  grouped GEMM (fwd, %d experts x %d rows): %.1f GFLOP/s; one sgemm chain of the same %d rows: %.1f "
               "GFLOP/s; efficiency %.0f%%\n", experts, NK / experts, flop / best_g * 1e-9, NK, flop / best_1 * 1e-9,
               100.0 * best_1 / best_g);
        free(xs); free(ys); free(h1); free(h3); free(a); free(w);
    }
    hp_ep_destroy(ep);
    hp_model_destroy(m);
    hp_mesh_destroy(mesh);
    free(tk);
    free(tg);
    hp_comm_finalize();
    return 0;
}
