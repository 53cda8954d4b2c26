/* The f32 FMA peak of the cores in use (hp_cpu_fma_peak_flops, nn_kernels.h): the MFU
 * denominator that does not depend on which GEMM kernels a library picked. Each thread runs
 * independent chains of fused multiply-adds on registers only (no loads or stores in the loop),
 * enough chains to cover the FMA latency on every FMA port (AVX-512: 16 zmm chains, the Intel
 * server cores' 2 ports x 4-cycle latency x 2; AVX2: 12 ymm chains, which with the two operands
 * fill the 16 ymm registers; portable: 8 chains of 4 floats). The ISA is the CPU's widest
 * (hp_cpu_features), not the nn path a user forced: the peak is the hardware's. Each thread
 * times its own loop in thread CPU time (CLOCK_THREAD_CPUTIME_ID) and the peak is the sum of
 * the threads' rates: the rate of a core while it runs the loop, which other processes on a
 * shared machine do not lower (a wall-clock best-of read 43 GFLOP/s instead of 485 on 2 cores
 * at load average 20), and which counts the cores the threads run on even when the OS puts two
 * of them on one core. */
#include <omp.h>
#include <time.h>
#include "hyperparallel/nn.h"
#include "core/core-cpu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx512f"))) static double fma_avx512(long iters, float *sink) {
    __m512 acc[16];
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
    }
    __m512 s = acc[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, acc[i]);
    *sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16 * 16 * (double)iters;
}
__attribute__((target("avx2,fma"))) static double fma_avx2(long iters, float *sink) {
    __m256 acc[12];
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
    }
    __m256 s = acc[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, acc[i]);
    float l[8];
    _mm256_storeu_ps(l, s);
    *sink = l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];
    return 2.0 * 8 * 12 * (double)iters;
}
#endif

typedef float v4f __attribute__((vector_size(16)));
static double fma_portable(long iters, float *sink) {
    v4f acc[8];
    const v4f x = (v4f){0} + 0.999999f, y = (v4f){0} + 1e-7f;
    for (int i = 0; i < 8; i++) acc[i] = (v4f){0} + (float)i;
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) acc[i] = acc[i] * x + y;
    }
    v4f s = acc[0];
    for (int i = 1; i < 8; i++) s += acc[i];
    *sink = s[0] + s[1] + s[2] + s[3];
    return 2.0 * 4 * 8 * (double)iters;
}

static double thread_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double fma_run(long iters, float *sink) {
#if defined(__x86_64__) && defined(__GNUC__)
    const unsigned f = hp_cpu_features();
    if (f & HP_CPU_AVX512F) return fma_avx512(iters, sink);
    if (f & HP_CPU_AVX2_FMA) return fma_avx2(iters, sink);
#endif
    return fma_portable(iters, sink);
}

hp_status_t hp_cpu_fma_peak_flops(int threads, double seconds, double *flops) {
    if (!flops) return hp_error(HP_ERR_INVALID_ARG, "hp_cpu_fma_peak_flops: flops is NULL");
    if (threads <= 0) threads = omp_get_max_threads();
    if (seconds <= 0) seconds = 0.05;
    // calibrate on one thread: iterations for about 2 ms of CPU time per repetition; several
    // repetitions, the best kept (a repetition's rate still drops when the hypervisor takes the
    // core away, which the guest's CPU clock does not see)
    float sink = 0;
    long iters = 1 << 14;
    for (;;) {
        const double t0 = thread_cpu_now();
        fma_run(iters, &sink);
        const double dt = thread_cpu_now() - t0;
        if (dt > 2e-3 || iters > (1L << 30)) {
            iters = (long)((double)iters * 2e-3 / (dt > 0 ? dt : 1e-6)) + 1;
            break;
        }
        iters *= 4;
    }
    double best = 0;
    const double t_end = hp_clock_now_seconds() + seconds;
    int reps = 0;
    do {
        double rate = 0;   // sum over threads of FLOP per CPU-second
#pragma omp parallel num_threads(threads) reduction(+ : rate)
        {
            float s = 0;
            const double t0 = thread_cpu_now();
            const double fl = fma_run(iters, &s);
            const double dt = thread_cpu_now() - t0;
            if (dt > 0) rate += fl / dt;
            if (s == 1234.5f) {   // never true; keeps the chains alive
#pragma omp atomic
                sink += 1.0f;
            }
        }
        if (rate > best) best = rate;
        reps++;
    } while (reps < 3 || hp_clock_now_seconds() < t_end);
    *flops = best + (sink == 1234.5f ? 1e-30 : 0.0);
    return HP_OK;
}
