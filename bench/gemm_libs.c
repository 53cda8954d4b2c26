/* The GEMM libraries a CPU could run, measured at the shapes of the llama3 debugmodel's training
 * step (docs/dependencies.md says which one the CPU backend uses and why; docs/performance.md
 * "GEMM library" has the runs). One process measures one library:
 *   bench_gemm_libs --lib openblas|dnnl|blis [--threads 2] [--rounds 7] [--rows 2048]
 * openblas: the library the CPU backend links (its kernel family after hyperparallel's start-up
 *   check, hp_gemm_info; OPENBLAS_CORETYPE=Haswell|Prescott|... forces one);
 * dnnl: oneDNN's dnnl_sgemm (Debian libdnnl2), loaded with dlopen, so the build does not need
 *   it; ONEDNN_MAX_CPU_ISA=AVX2 caps its JIT kernels at AVX2;
 * blis: BLIS's bli_sgemm (Debian libblis4), dlopen; BLIS_ARCH_TYPE=haswell|skx forces a
 *   sub-configuration.
 * Two measurements, each the best of --rounds: "step" is the 18 products of the debugmodel's
 * linears per layer x 6 layers plus the output projection (forward, backward input, backward
 * weight) at rows = B * T tokens, split over the threads by rows as the CPU backend's linears
 * do (each thread one single-threaded call); "square" is one multi-threaded 2048^3 product. Each
 * also in GFLOP per CPU-second of the process (CLOCK_PROCESS_CPUTIME_ID; run with
 * OMP_WAIT_POLICY=passive so that waiting threads do not count), the per-core rate, which a
 * shared machine's load disturbs much less than wall time. */
#include <dlfcn.h>
#include <time.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include "hyperparallel/nn.h"

void openblas_set_num_threads(int n);

typedef int (*dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                             int64_t, float, float *, int64_t);
typedef void (*blis_setnt_fn)(int64_t);
typedef const char *(*blis_str_fn)(int);
typedef int (*blis_id_fn)(void);

static int lib;   // 0 openblas, 1 dnnl, 2 blis
static dnnl_sgemm_fn dnnl_sgemm_p;
static void (*blis_cblas_sgemm)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                                float *, int);
static blis_setnt_fn blis_set_threads;

/* row-major C (M, N) = op(A) op(B) + beta C, on the calling thread's library settings */
static void gemm1(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
                  float *C, int ldc) {
    if (lib == 1) {
        dnnl_sgemm_p(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    } else if (lib == 2) {
        blis_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f,
                         A, lda, B, ldb, beta, C, ldc);
    } else {
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A,
                    lda, B, ldb, beta, C, ldc);
    }
}

static void set_lib_threads(int n) {
    if (lib == 0) openblas_set_num_threads(n);
    else if (lib == 2) blis_set_threads(n);
    // dnnl (OpenMP runtime) runs on the OpenMP team of the caller: 1 inside a parallel region
}

/* The CPU backend's split (kernels.c sgemm_rows): M rows in 16-row multiples per thread. */
static void gemm_rows(int nt, int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc) {
    int chunk = (M + nt - 1) / nt;
    chunk = (chunk + 15) / 16 * 16;
#pragma omp parallel num_threads(nt)
    {
        const int m0 = omp_get_thread_num() * chunk, m1 = m0 + chunk < M ? m0 + chunk : M;
        if (m0 < m1)
            gemm1(ta, tb, m1 - m0, N, K, ta ? A + m0 : A + (size_t)m0 * lda, lda, B, ldb, beta, C + (size_t)m0 * ldc,
                  ldc);
    }
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *name = "openblas";
    int threads = 2, rounds = 7, rows = 2048;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--lib")) name = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rows")) rows = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    char what[256];
    if (!strcmp(name, "dnnl")) {
        void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!h) h = dlopen("libdnnl.so.3", RTLD_NOW | RTLD_LOCAL);
        if (!h || !(dnnl_sgemm_p = (dnnl_sgemm_fn)dlsym(h, "dnnl_sgemm"))) {
            printf("SKIP: oneDNN not installed (Debian libdnnl2)\n");
            return 0;
        }
        int (*isa)(void) = (int (*)(void))dlsym(h, "dnnl_get_effective_cpu_isa");
        lib = 1;
        float a = 0, b = 0, c = 0;
        gemm1(0, 0, 1, 1, 1, &a, 1, &b, 1, 0.0f, &c, 1);   // initializes the ISA choice
        snprintf(what, sizeof what, "oneDNN dnnl_sgemm, effective ISA %d (dnnl_cpu_isa_t; ONEDNN_MAX_CPU_ISA=%s)",
                 isa ? isa() : -1, getenv("ONEDNN_MAX_CPU_ISA") ? getenv("ONEDNN_MAX_CPU_ISA") : "unset");
    } else if (!strcmp(name, "blis")) {
        void *h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
        if (!h || !(blis_cblas_sgemm = dlsym(h, "cblas_sgemm")) ||
            !(blis_set_threads = (blis_setnt_fn)dlsym(h, "bli_thread_set_num_threads"))) {
            printf("SKIP: BLIS not installed (Debian libblis4)\n");
            return 0;
        }
        lib = 2;
        blis_id_fn qid = (blis_id_fn)dlsym(h, "bli_arch_query_id");
        blis_str_fn astr = (blis_str_fn)dlsym(h, "bli_arch_string");
        const char *(*ver)(void) = (const char *(*)(void))dlsym(h, "bli_info_get_version_str");
        snprintf(what, sizeof what, "BLIS %s, sub-configuration %s (BLIS_ARCH_TYPE=%s)", ver ? ver() : "?",
                 qid && astr ? astr(qid()) : "?", getenv("BLIS_ARCH_TYPE") ? getenv("BLIS_ARCH_TYPE") : "unset");
    } else {
        hp_gemm_info_t gi;
        hp_gemm_info(&gi);
        snprintf(what, sizeof what, "OpenBLAS %s, kernels %s (%s)", gi.version, gi.core, gi.core_isa);
    }
    printf("bench_gemm_libs: %s; %d threads; cpu ISA %s\n", what, threads, hp_cpu_isa_name());

    // the debugmodel: dim 256, ffn 768, vocab 2048, 6 layers; linears (out, in)
    static const int lin[][2] = {{768, 256}, {256, 256}, {1536, 256}, {256, 768}};
    const int L = 6, V = 2048, D = 256;
    const size_t big = (size_t)rows * 2048 + 2048 * 2048;
    float *A = calloc(big, sizeof(float)), *B = calloc(big, sizeof(float)), *C = calloc(big, sizeof(float));
    if (!A || !B || !C) return 1;
    for (size_t i = 0; i < big; i++) A[i] = (float)(i % 97) * 0.01f - 0.4f, B[i] = (float)(i % 89) * 0.01f - 0.4f;
    double flops_step = 0;
    for (int i = 0; i < 4; i++) flops_step += 3.0 * 2.0 * rows * lin[i][0] * (double)lin[i][1] * L;
    flops_step += 3.0 * 2.0 * rows * (double)V * D;
    double best_step = 1e30, best_sq = 1e30, cbest_step = 1e30, cbest_sq = 1e30;
    set_lib_threads(1);
    for (int r = 0; r < rounds + 1; r++) {   // round 0 warms up
        double t0 = hp_clock_now_seconds(), c0 = cpu_now();
        for (int l = 0; l < L + 1; l++)
            for (int i = 0; i < (l < L ? 4 : 1); i++) {
                const int O = l < L ? lin[i][0] : V, IN = l < L ? lin[i][1] : D;
                gemm_rows(threads, 0, 1, rows, O, IN, A, IN, B, IN, 0.0f, C, O);   // fwd: out = x W^T
                gemm_rows(threads, 0, 0, rows, IN, O, A, O, B, IN, 0.0f, C, IN);   // bwd input: dx = dy W
                gemm_rows(threads, 1, 0, O, IN, rows, A, O, B, IN, 1.0f, C, IN);   // bwd weight: dW += dy^T x
            }
        const double dt = hp_clock_now_seconds() - t0, dc = cpu_now() - c0;
        if (r > 0 && dt < best_step) best_step = dt;
        if (r > 0 && dc < cbest_step) cbest_step = dc;
    }
    set_lib_threads(threads);
    omp_set_num_threads(threads);
    const int n = 2048;
    for (int r = 0; r < rounds + 1; r++) {
        double t0 = hp_clock_now_seconds(), c0 = cpu_now();
        gemm1(0, 0, n, n, n, A, n, B, n, 0.0f, C, n);
        const double dt = hp_clock_now_seconds() - t0, dc = cpu_now() - c0;
        if (r > 0 && dt < best_sq) best_sq = dt;
        if (r > 0 && dc < cbest_sq) cbest_sq = dc;
    }
    printf("step GEMMs (rows %d, split over %d threads): %.2f ms, %.1f GFLOP/s; square %d^3 (%d threads): %.1f "
           "GFLOP/s\n",
           rows, threads, best_step * 1e3, flops_step / best_step / 1e9, n, threads, 2.0 * n * n * (double)n / best_sq / 1e9);
    printf("per CPU-second: step %.1f, square %.1f GFLOP\n", flops_step / cbest_step / 1e9,
           2.0 * n * n * (double)n / cbest_sq / 1e9);
    printf("RESULT gemm_libs step_gflops %.2f square_gflops %.2f step_cpu %.2f square_cpu %.2f\n",
           flops_step / best_step / 1e9, 2.0 * n * n * (double)n / best_sq / 1e9, flops_step / cbest_step / 1e9,
           2.0 * n * n * (double)n / cbest_sq / 1e9);
    free(A);
    free(B);
    free(C);
    return 0;
}
