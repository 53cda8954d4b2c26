/* Causal attention kernel benchmark: GFLOP/s of hp_attention_forward / hp_attention_backward
 * at the shapes of issue 13 (llama3 debugmodel head_dim 16 at B 8, T 256, 16 heads; T 1024
 * and 2048; head_dim 64 and 128; GQA), against the cblas_sgemm peak measured in the same run
 * on the same threads, and against the kernel it replaced (bench/attention_v16.h).
 * FLOPs are counted as hp_model_profile's users do (bench/train_step.c): forward
 * 2 * B * Hq * T * (T + 1) * hd (causal QK^T and PV), backward 2.5x that.
 *   bench_attention [--rounds 5] [--threads 2] [--no-old] [--isa auto|portable|avx2|avx512]
 *                   [--shape NAME] [--secs 0.25] [--cpu-time] [--tiles] [--bwd-ab]
 * Each round times every (shape, kernel) for about --secs; best and median over rounds.
 * --cpu-time divides by process CPU seconds (all threads) instead of wall seconds, the peak
 * too: GFLOP per CPU-second, steadier than wall time on a machine shared with other jobs
 * (run it with OMP_WAIT_POLICY=passive so that idle workers do not count). --tiles instead
 * times the tile products on one thread, cblas_sgemm against the micro-kernel (tile_table).
 * --bwd-ab: the two "old" columns time the backward forced fused and forced split instead
 * (hp_attention_set_backward), interleaved in the same rounds. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hyperparallel/nn.h"
#include "attention_v16.h"

void openblas_set_num_threads(int n);   /* OpenBLAS extension (cblas.h of some versions lacks it) */

static int use_cpu_time = 0;   // --cpu-time: process CPU seconds instead of wall seconds
static double now(void) {
    struct timespec ts;
    clock_gettime(use_cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double load_avg(void) {
    double l[1] = {0};
    return getloadavg(l, 1) == 1 ? l[0] : -1.0;
}

/* Best GFLOP/s of C = A B on n x n f32 squares (the machine's attainable GEMM peak). */
static double sgemm_peak(int n, int reps) {
    float *a = malloc(sizeof(float) * (size_t)n * n), *b = malloc(sizeof(float) * (size_t)n * n),
          *c = malloc(sizeof(float) * (size_t)n * n);
    if (!a || !b || !c) {
        fprintf(stderr, "sgemm_peak: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
        b[i] = (float)((i * 53) % 103) / 103.0f - 0.5f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double g = 2.0 * n * (double)n * n / (now() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

static float *filled(size_t n, unsigned seed, float scale) {
    float *p = malloc(sizeof(float) * n);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        p[i] = ((float)(x >> 40) / 16777216.0f * 2.0f - 1.0f) * scale;
    }
    return p;
}

/* The attention micro-kernel itself, instantiated here from its template with the AVX2
 * parameters attention.c uses, so that --tiles can time it against cblas_sgemm at the same
 * tile shapes in the same run. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include "nn/nn-math.h"
enum { HP_ATT_BR = 64, HP_ATT_BC = 64 };   // as attention.c
enum { HP_ATT_DENSE, HP_ATT_QCOLS, HP_ATT_KEND, HP_ATT_KBEG };
#define HP_T_SFX bench
#define HP_T_VW 8
#define HP_T_NV 2
#define HP_T_MR 6
#define HP_T_ATTR __attribute__((target("avx2,fma")))
#define HP_T_FMA 1
#define HP_T_AVX_TRANSPOSE 1
#define HP_T_VMAX(a, b) ((VF)_mm256_max_ps((__m256)(a), (__m256)(b)))
#include "nn/attention-tiles.h"
#define HAVE_UKR 1
static void *const unused_tiles[] __attribute__((unused)) = {(void *)fwd_tile_bench, (void *)bwd_group_bench,
                                                             (void *)bwd_kv_bench, (void *)bwd_q_bench};
#endif

/* One thread, the shapes of a flash-attention tile (64 query rows, 64 keys): cblas_sgemm in
 * the layout a BLAS-based kernel would use (S = Q K^T written, beta 0; the others accumulate,
 * beta 1) against the micro-kernel in attention.c's layout (S^T = K Q^T; P^T, dS^T read with
 * strides), next to the thread's rate on a large square. Why attention.c has its own kernel. */
static void tile_table(int rounds) {
    openblas_set_num_threads(1);
    static const struct { int M, N, K, ta, tb; const char *what; } t[] = {
        {64, 64, 16, 0, 1, "S = Q K^T, hd 16"},   {64, 16, 64, 0, 0, "O += P V, hd 16"},
        {64, 16, 64, 1, 0, "dK += dS^T Q, hd 16"}, {64, 64, 64, 0, 1, "S = Q K^T, hd 64"},
        {64, 64, 64, 0, 0, "O += P V, hd 64"},    {64, 64, 64, 1, 0, "dK += dS^T Q, hd 64"},
        {64, 64, 128, 0, 1, "S = Q K^T, hd 128"}, {64, 128, 64, 0, 0, "O += P V, hd 128"},
    };
    float *a = filled(1 << 16, 7, 0.5f), *b = filled(1 << 16, 8, 0.5f), *c = filled(1 << 16, 0, 0.0f);
    float *big = filled((size_t)3 << 20, 9, 0.5f);
    double sq = 0;
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1024, 1024, 1024, 1.0f, big, 1024, big + (1 << 20),
                    1024, 0.0f, big + (2 << 20), 1024);
        sq = fmax(sq, 2.0 * 1024 * 1024 * 1024 / (now() - t0) / 1e9);
    }
    printf("tile products, 1 thread, best of %d (cblas_sgemm 1024^3 on the same thread: %.1f GFLOP/s):\n", rounds, sq);
    printf("  %-22s %4s %4s %4s  %12s  %12s\n", "product", "M", "N", "K", "cblas_sgemm", "micro-kernel");
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        const int M = t[i].M, N = t[i].N, K = t[i].K, lda = t[i].ta ? M : K, ldb = t[i].tb ? K : N;
        const int first = t[i].tb;   // S = Q K^T: the written product
        const double fl = 2.0 * M * N * K;
        const int it = (int)(5e7 / fl);
        double best_b = 0, best_u = 0;
        for (int r = 0; r < rounds; r++) {
            double t0 = now();
            for (int n = 0; n < it; n++)
                cblas_sgemm(CblasRowMajor, t[i].ta ? CblasTrans : CblasNoTrans, t[i].tb ? CblasTrans : CblasNoTrans, M,
                            N, K, 1.0f, a, lda, b, ldb, first ? 0.0f : 1.0f, c, N);
            best_b = fmax(best_b, fl * it / (now() - t0) / 1e9);
#ifdef HAVE_UKR
            if (hp_nn_isa() == HP_NN_ISA_AVX2) {
                t0 = now();
                for (int n = 0; n < it; n++) {
                    if (first)   // S^T (keys, rows) = K (keys, hd) Q^T (hd, rows)
                        gemm_bench(c, HP_ATT_BR, 0, a, K, 1, b, HP_ATT_BR, N, M, K, HP_ATT_DENSE, 0);
                    else if (t[i].ta)   // dK (keys, hd) += dS^T (keys, rows) Q (rows, hd)
                        gemm_bench(c, N, 1, a, HP_ATT_BR, 1, b, N, M, N, K, HP_ATT_DENSE, 0);
                    else   // O (rows, hd) += P (rows, keys) V (keys, hd), P read from P^T
                        gemm_bench(c, N, 1, a, 1, HP_ATT_BR, b, N, M, N, K, HP_ATT_DENSE, 0);
                }
                best_u = fmax(best_u, fl * it / (now() - t0) / 1e9);
            }
#endif
        }
        printf("  %-22s %4d %4d %4d  %12.1f  %12.1f\n", t[i].what, M, N, K, best_b, best_u);
        printf("RESULT tile %d %d %d %d sgemm_gflops %.2f ukernel_gflops %.2f\n", M, N, K, t[i].ta, best_b, best_u);
    }
    free(a);
    free(b);
    free(c);
    free(big);
}

typedef struct { const char *name; int B, T, Hq, Hkv, hd; } shape_t;
static const shape_t shapes[] = {
    {"debug_hd16", 8, 256, 16, 16, 16},   // llama3 debugmodel: B 8, T 256, 16 heads of 16
    {"debug_T2048", 8, 2048, 16, 16, 16},   // the debugmodel at T 2048 (bench_train_step SEQ=2048)
    {"hd16_T1024", 2, 1024, 16, 4, 16},
    {"hd16_T2048", 1, 2048, 8, 2, 16},
    {"hd64_T256", 4, 256, 8, 8, 64},
    {"hd64_T1024", 1, 1024, 8, 2, 64},
    {"hd64_T2048", 1, 2048, 4, 2, 64},
    {"hd128_T256", 2, 256, 8, 4, 128},
    {"hd128_T1024", 1, 1024, 4, 2, 128},
    {"hd128_T2048", 1, 2048, 4, 2, 128},
    {"hd16_T2048_g1", 1, 2048, 8, 1, 16},   // one (b, kv head) group: the fused backward uses one thread
    {"hd64_T2048_g1", 1, 2048, 8, 1, 64},
};
enum { N_SHAPES = sizeof shapes / sizeof shapes[0], N_KERNELS = 4 };   // old fwd, old bwd, new fwd, new bwd
static const char *const kernel_names[N_KERNELS] = {"old fwd", "old bwd", "new fwd", "new bwd"};

typedef struct {
    shape_t s;
    int ld;
    float *qkv, *out, *lse, *dout, *g;
} problem_t;

static int bwd_ab = 0;   // --bwd-ab: the "old" columns time the backward forced fused / split

static void run_kernel(problem_t *p, int kernel) {
    const shape_t *s = &p->s;
    const int ld = p->ld, qo = 0, ko = s->Hq * s->hd, vo = (s->Hq + s->Hkv) * s->hd;
    if (bwd_ab && kernel < 2) {
        hp_attention_set_backward(kernel == 0 ? HP_ATTENTION_BWD_FUSED : HP_ATTENTION_BWD_SPLIT);
        hp_attention_backward(p->g + qo, ld, p->g + ko, ld, p->g + vo, ld, p->dout, p->out, p->lse, p->qkv + qo, ld,
                              p->qkv + ko, ld, p->qkv + vo, ld, s->B, s->T, s->Hq, s->Hkv, s->hd);
        hp_attention_set_backward(HP_ATTENTION_BWD_AUTO);
        return;
    }
    switch (kernel) {
    case 0:
        v16_attention_forward(p->out, p->lse, p->qkv + qo, ld, p->qkv + ko, ld, p->qkv + vo, ld, s->B, s->T, s->Hq,
                              s->Hkv, s->hd);
        break;
    case 1:
        v16_attention_backward(p->g + qo, ld, p->g + ko, ld, p->g + vo, ld, p->dout, p->out, p->lse, p->qkv + qo, ld,
                               p->qkv + ko, ld, p->qkv + vo, ld, s->B, s->T, s->Hq, s->Hkv, s->hd);
        break;
    case 2:
        hp_attention_forward(p->out, p->lse, p->qkv + qo, ld, p->qkv + ko, ld, p->qkv + vo, ld, s->B, s->T, s->Hq,
                             s->Hkv, s->hd);
        break;
    default:
        hp_attention_backward(p->g + qo, ld, p->g + ko, ld, p->g + vo, ld, p->dout, p->out, p->lse, p->qkv + qo, ld,
                              p->qkv + ko, ld, p->qkv + vo, ld, s->B, s->T, s->Hq, s->Hkv, s->hd);
    }
}

/* max |a - b| / max |b| */
static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

int main(int argc, char **argv) {
    int rounds = 5, threads = 2, with_old = 1, tiles = 0;
    double secs = 0.25;
    const char *only = NULL, *isa = "auto";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--secs") && i + 1 < argc) secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) isa = argv[++i];
        else if (!strcmp(argv[i], "--no-old")) with_old = 0;
        else if (!strcmp(argv[i], "--bwd-ab")) bwd_ab = 1;
        else if (!strcmp(argv[i], "--cpu-time")) use_cpu_time = 1;
        else if (!strcmp(argv[i], "--tiles")) tiles = 1;
        else {
            fprintf(stderr, "usage: %s [--rounds N] [--threads N] [--secs S] [--shape NAME] [--isa auto|portable|avx2|avx512] [--no-old] [--bwd-ab] [--cpu-time] [--tiles]\n",
                    argv[0]);
            return 2;
        }
    }
    if (rounds < 1) rounds = 1;
    if (strcmp(isa, "auto")) {
        hp_nn_isa_t want = !strcmp(isa, "portable") ? HP_NN_ISA_PORTABLE : !strcmp(isa, "avx2") ? HP_NN_ISA_AVX2
                         : !strcmp(isa, "avx512") ? HP_NN_ISA_AVX512 : HP_NN_ISA_AUTO;
        if (want == HP_NN_ISA_AUTO || hp_nn_set_isa(want) != HP_OK) {
            fprintf(stderr, "--isa %s: not available here (%s)\n", isa, hp_last_error());
            return 2;
        }
    }
    if (tiles) {
        tile_table(rounds);
        return 0;
    }
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    const double load0 = load_avg();
    double peak = fmax(sgemm_peak(1024, 5), sgemm_peak(2048, 3));

    problem_t prob[N_SHAPES];
    int np = 0;
    for (int i = 0; i < N_SHAPES; i++) {
        if (only && strcmp(only, shapes[i].name)) continue;
        problem_t *p = &prob[np++];
        p->s = shapes[i];
        const shape_t *s = &p->s;
        const size_t N = (size_t)s->B * s->T;
        p->ld = (s->Hq + 2 * s->Hkv) * s->hd;
        p->qkv = filled(N * p->ld, 1 + i, 1.5f);
        p->dout = filled(N * s->Hq * s->hd, 100 + i, 1.0f);
        p->out = filled(N * s->Hq * s->hd, 0, 0.0f);
        p->lse = filled(N * s->Hq, 0, 0.0f);
        p->g = filled(N * p->ld, 0, 0.0f);
    }
    if (!np) {
        fprintf(stderr, "no shape named %s\n", only);
        return 2;
    }
    // agreement of old and new on every shape (both are f32; differences are rounding)
    for (int i = 0; i < np && with_old && !bwd_ab; i++) {
        problem_t *p = &prob[i];
        const size_t N = (size_t)p->s.B * p->s.T, no = N * p->s.Hq * p->s.hd, ng = N * p->ld;
        float *o_old = malloc(sizeof(float) * no), *g_old = malloc(sizeof(float) * ng);
        run_kernel(p, 0);
        run_kernel(p, 1);
        memcpy(o_old, p->out, sizeof(float) * no);
        memcpy(g_old, p->g, sizeof(float) * ng);
        run_kernel(p, 2);
        run_kernel(p, 3);
        printf("%-12s new vs old: out %.2e, grads %.2e (max abs diff / max abs)\n", p->s.name,
               rel_diff(p->out, o_old, no), rel_diff(p->g, g_old, ng));
        free(o_old);
        free(g_old);
    }

    double *gf = calloc((size_t)np * N_KERNELS * rounds, sizeof(double));
    int reps[N_SHAPES][N_KERNELS];
    for (int i = 0; i < np; i++)
        for (int k = 0; k < N_KERNELS; k++) {
            if (k < 2 && !with_old) continue;
            double t0 = now();
            run_kernel(&prob[i], k);   // warm-up; sizes the repetitions
            double t = now() - t0;
            reps[i][k] = t > 0 ? (int)ceil(secs / t) : 1;
            if (reps[i][k] < 1) reps[i][k] = 1;
        }
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < np; i++)
            for (int k = 0; k < N_KERNELS; k++) {
                if (k < 2 && !with_old) continue;
                const shape_t *s = &prob[i].s;
                const double fwd = 2.0 * s->B * s->Hq * (double)s->T * (s->T + 1.0) * s->hd;
                const double fl = ((k & 1) || (bwd_ab && k == 0)) ? 2.5 * fwd : fwd;
                double t0 = now();
                for (int n = 0; n < reps[i][k]; n++) run_kernel(&prob[i], k);
                gf[((size_t)i * N_KERNELS + k) * rounds + r] = fl * reps[i][k] / (now() - t0) / 1e9;
            }
    peak = fmax(peak, fmax(sgemm_peak(1024, 5), sgemm_peak(2048, 3)));
    const double load1 = load_avg();

    printf("threads %d, rounds %d, load average %.2f -> %.2f, %s time, isa %s\n", threads, rounds, load0, load1,
           use_cpu_time ? "CPU" : "wall", hp_nn_isa_name(hp_nn_isa()));
    printf("sgemm peak (cblas_sgemm 1024^3 and 2048^3, best before and after): %.1f GFLOP/s\n", peak);
    printf("%-12s %2s %5s %3s %3s %4s | %-8s %8s %8s %7s %7s\n", "shape", "B", "T", "Hq", "Hkv", "hd", "kernel",
           "best", "median", "best%", "med%");
    for (int i = 0; i < np; i++)
        for (int k = 0; k < N_KERNELS; k++) {
            if (k < 2 && !with_old) continue;
            const shape_t *s = &prob[i].s;
            double *g = gf + ((size_t)i * N_KERNELS + k) * rounds;
            qsort(g, rounds, sizeof(double), cmp_double);
            const double best = g[rounds - 1], med = rounds % 2 ? g[rounds / 2] : 0.5 * (g[rounds / 2 - 1] + g[rounds / 2]);
            printf("%-12s %2d %5d %3d %3d %4d | %-8s %8.1f %8.1f %6.1f%% %6.1f%%\n", s->name, s->B, s->T, s->Hq, s->Hkv,
                   s->hd, bwd_ab && k < 2 ? (k ? "bwd split" : "bwd fused") : kernel_names[k], best, med, 100 * best / peak, 100 * med / peak);
            printf("RESULT %s %s best_gflops %.2f median_gflops %.2f best_pct %.1f median_pct %.1f\n", s->name,
                   bwd_ab && k < 2 ? (k ? "bwd_split" : "bwd_fused") : k == 0 ? "old_fwd" : k == 1 ? "old_bwd" : k == 2 ? "new_fwd" : "new_bwd", best, med,
                   100 * best / peak, 100 * med / peak);
        }
    for (int i = 0; i < np; i++) {
        free(prob[i].qkv); free(prob[i].dout); free(prob[i].out); free(prob[i].lse); free(prob[i].g);
    }
    free(gf);
    return 0;
}
