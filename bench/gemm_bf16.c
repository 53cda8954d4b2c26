/* bf16 GEMMs against f32 sgemm at the llama3 debugmodel's training-step shapes (docs/performance.md
 * "bf16 GEMM"; tools/bench_gemm_bf16.sh alternates the configurations round by round with
 * PyTorch's side, bench/gemm_bf16_torch.py). One process measures one implementation:
 *   bench_gemm_bf16 --impl sgemm|onednn|f32|sbgemm [--threads 2] [--rounds 5] [--rows 2048]
 * sgemm: OpenBLAS cblas_sgemm on f32 operands (the f32 step's GEMMs, after the kernel family check);
 * onednn: hp_gemm_bf16 forced to oneDNN's dnnl_gemm_bf16bf16f32 (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16
 *   caps it at the AVX512_BF16 kernels, unset it runs AMX where the CPU has it);
 * f32: hp_gemm_bf16's f32 path (widen the bf16 operands, one sgemm), what runs without AMX;
 * sbgemm: OpenBLAS's cblas_sbgemm, when the linked OpenBLAS exports it (Debian 12's 0.3.21 does not).
 * The products: per layer the 4 linears (wq|wk|wv 768x256, wo 256x256, w1|w3 1536x256, w2 256x768)
 * x 6 layers + the output projection (2048x256), each as forward (x W^T), backward input (dy W) and
 * backward weight (dy^T x, beta 1), at rows = B * T tokens, split by rows over the threads (each
 * thread one single-threaded call, as the CPU backend's linears do). Rates in GFLOP per CPU-second
 * of the process (CLOCK_PROCESS_CPUTIME_ID; run with OMP_WAIT_POLICY=passive), the per-core rate,
 * which a shared machine's load disturbs much less than wall time; the best of --rounds. */
#include <dlfcn.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include "hyperparallel/nn.h"

void openblas_set_num_threads(int n);

typedef void (*sbgemm_fn)(int, int, int, int, int, int, float, const uint16_t *, int, const uint16_t *, int, float,
                          float *, int);
static int impl;   // 0 sgemm, 1 hp_gemm_bf16 (onednn or f32 path), 2 sbgemm
static sbgemm_fn sbgemm;

static void gemm1(int ta, int tb, int M, int N, int K, const void *A, int lda, const void *B, int ldb, float beta,
                  float *C, int ldc) {
    if (impl == 0)
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A,
                    lda, B, ldb, beta, C, ldc);
    else if (impl == 1)
        hp_gemm_bf16(C, ldc, A, lda, B, ldb, M, N, K, ta, tb, 1.0f, beta);
    else
        sbgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda,
               B, ldb, beta, C, ldc);
}

static void gemm_rows(int nt, int es, int ta, int tb, int M, int N, int K, const char *A, int lda, const char *B,
                      int ldb, float beta, float *C, int ldc) {
    int chunk = (M + nt - 1) / nt;
    chunk = (chunk + 15) / 16 * 16;
#pragma omp parallel num_threads(nt)
    {
        const int m0 = omp_get_thread_num() * chunk, m1 = m0 + chunk < M ? m0 + chunk : M;
        if (m0 < m1)
            gemm1(ta, tb, m1 - m0, N, K, ta ? A + (size_t)m0 * es : A + (size_t)m0 * lda * es, lda, B, ldb, beta,
                  C + (size_t)m0 * ldc, ldc);
    }
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *name = "sgemm";
    int threads = 2, rounds = 5, rows = 2048;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--impl")) name = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rows")) rows = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    char what[320];
    int es = 2;   // element size of the operands
    if (!strcmp(name, "sgemm")) {
        hp_gemm_info_t gi;
        hp_gemm_info(&gi);
        impl = 0;
        es = 4;
        snprintf(what, sizeof what, "f32 OpenBLAS %s cblas_sgemm, %s kernels (%s)", gi.version, gi.core, gi.core_isa);
    } else if (!strcmp(name, "onednn") || !strcmp(name, "f32")) {
        const hp_gemm_bf16_impl_t want = !strcmp(name, "onednn") ? HP_GEMM_BF16_ONEDNN : HP_GEMM_BF16_F32;
        if (hp_gemm_bf16_set_impl(want) != HP_OK) {
            printf("SKIP: %s\n", hp_last_error());
            return 0;
        }
        impl = 1;
        hp_gemm_bf16_describe(what, sizeof what);
    } else if (!strcmp(name, "sbgemm")) {
        if (!(sbgemm = (sbgemm_fn)dlsym(RTLD_DEFAULT, "cblas_sbgemm"))) {
            printf("SKIP: the linked OpenBLAS does not export cblas_sbgemm (built without BUILD_BFLOAT16)\n");
            return 0;
        }
        impl = 2;
        snprintf(what, sizeof what, "OpenBLAS cblas_sbgemm");
    } else {
        fprintf(stderr, "--impl sgemm|onednn|f32|sbgemm\n");
        return 2;
    }
    printf("bench_gemm_bf16: %s; %d threads; cpu ISA %s\n", what, threads, hp_cpu_isa_name());

    static const int lin[][2] = {{768, 256}, {256, 256}, {1536, 256}, {256, 768}};
    const int L = 6, V = 2048, D = 256;
    const size_t big = (size_t)rows * 2048;
    char *A = calloc(big, 4), *B = calloc(big, 4);
    float *C = calloc(big, sizeof(float));
    if (!A || !B || !C) return 1;
    for (size_t i = 0; i < big; i++) {
        const float a = (float)(i % 97) * 0.01f - 0.4f, b = (float)(i % 89) * 0.01f - 0.4f;
        if (es == 4) ((float *)A)[i] = a, ((float *)B)[i] = b;
        else ((hp_bf16_t *)A)[i] = hp_f32_to_bf16(a), ((hp_bf16_t *)B)[i] = hp_f32_to_bf16(b);
    }
    double flops = 0;
    for (int i = 0; i < 4; i++) flops += 3.0 * 2.0 * rows * lin[i][0] * (double)lin[i][1] * L;
    flops += 3.0 * 2.0 * rows * (double)V * D;
    double best = 1e30, cbest = 1e30;
    openblas_set_num_threads(1);
    for (int r = 0; r < rounds + 1; r++) {   // round 0 warms up (oneDNN's JIT, AMX tile permission)
        const double t0 = hp_clock_now_seconds(), c0 = cpu_now();
        for (int l = 0; l < L + 1; l++)
            for (int i = 0; i < (l < L ? 4 : 1); i++) {
                const int O = l < L ? lin[i][0] : V, IN = l < L ? lin[i][1] : D;
                gemm_rows(threads, es, 0, 1, rows, O, IN, A, IN, B, IN, 0.0f, C, O);   // fwd: out = x W^T
                gemm_rows(threads, es, 0, 0, rows, IN, O, A, O, B, IN, 0.0f, C, IN);   // bwd input: dx = dy W
                gemm_rows(threads, es, 1, 0, O, IN, rows, A, O, B, IN, 1.0f, C, IN);   // bwd weight: dW += dy^T x
            }
        const double dt = hp_clock_now_seconds() - t0, dc = cpu_now() - c0;
        if (r > 0 && dt < best) best = dt;
        if (r > 0 && dc < cbest) cbest = dc;
    }
    printf("step GEMMs (rows %d, split over %d threads): %.2f ms, %.1f GFLOP/s wall, %.1f GFLOP per CPU-s\n", rows,
           threads, best * 1e3, flops / best / 1e9, flops / cbest / 1e9);
    printf("RESULT gemm_bf16 impl %s step_gflops %.2f step_cpu %.2f\n", name, flops / best / 1e9, flops / cbest / 1e9);
    free(A);
    free(B);
    free(C);
    return 0;
}
