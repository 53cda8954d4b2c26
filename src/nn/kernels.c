/* Optimised CPU kernels of the nn layer: every GEMM through the CPU backend's one door to BLAS
 * (nn-blas.h, blas.c: one cblas_sgemm call), fused elementwise
 * loops parallel over the index they write (OpenMP), no atomics, fixed reduction orders so
 * results are bitwise reproducible for a given thread count. Reference twins: kernels_ref.c. */
#include <math.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/nn.h"
#include "hyperparallel/nn_loss.h"
#include "nn/nn-blas.h"
#include "nn/nn-math.h"
#include "nn/nn-simd.h"

/* ---- linear ---------------------------------------------------------------------------- */

/* C (M, N) = op(A) (M, K) op(B) (K, N) + beta C, row-major, with the M rows split over the
 * OpenMP threads: each thread calls a single-threaded cblas_sgemm on its block. One thread
 * pool (OpenMP) is then active instead of two (OpenMP + OpenBLAS's pthreads) that would
 * spin against each other on a small machine; OpenBLAS's own thread count is restored after.
 * Every element is computed by one call over the whole K, so the result does not depend on
 * the split. */
static void sgemm_rows(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                       float beta, float *C, int ldc) {
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (nt <= 1 || M < 32) {
        hp_cpu_sgemm(C, ldc, A, lda, B, ldb, M, N, K, ta, tb, 1.0f, beta);
        return;
    }
    const int blas_threads = hp_cpu_blas_get_num_threads();
    if (blas_threads != 1) hp_cpu_blas_set_num_threads(1);
    int chunk = (M + nt - 1) / nt;
    chunk = (chunk + 15) / 16 * 16;   // whole micro-tiles per thread
#pragma omp parallel num_threads(nt)
    {
        int m0 = omp_get_thread_num() * chunk;
        int m1 = m0 + chunk < M ? m0 + chunk : M;
        if (m0 < m1) {
            const float *Am = !ta ? A + (size_t)m0 * lda : A + m0;
            hp_cpu_sgemm(C + (size_t)m0 * ldc, ldc, Am, lda, B, ldb, m1 - m0, N, K, ta, tb, 1.0f, beta);
        }
    }
    if (blas_threads != 1) hp_cpu_blas_set_num_threads(blas_threads);   // leave the caller's setting
}

static void add_bias_rows(float *out, const float *bias, int N, int OC) {
    if (!bias) return;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * OC;
#pragma omp simd
        for (int c = 0; c < OC; c++) o[c] += bias[c];
    }
}

void hp_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                       int N, int IC, int OC) {
    // out (N, OC) = inp (N, IC) @ weight^T
    sgemm_rows(0, 1, N, OC, IC, inp, IC, weight, IC, 0.0f, out, OC);
    add_bias_rows(out, bias, N, OC);
}

void hp_linear_forward_acc(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int IC, int OC) {
    sgemm_rows(0, 1, N, OC, IC, inp, IC, weight, IC, 1.0f, out, OC);
    add_bias_rows(out, bias, N, OC);
}

void hp_linear_backward_input(float *dinp, const float *dout, const float *weight,
                              int N, int IC, int OC, int accumulate) {
    // dinp (N, IC) = dout (N, OC) @ weight (OC, IC)
    sgemm_rows(0, 0, N, IC, OC, dout, OC, weight, IC, accumulate ? 1.0f : 0.0f, dinp, IC);
}

void hp_linear_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                               int N, int IC, int OC) {
    // dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC), output channels split over threads
    sgemm_rows(1, 0, OC, IC, N, dout, OC, inp, IC, 1.0f, dweight, IC);
    if (dbias) {
        // parallel over output channels; each sums its column over rows in order
#pragma omp parallel for schedule(static)
        for (int cb = 0; cb < OC; cb += 16) {
            int ce = cb + 16 < OC ? cb + 16 : OC;
            float acc[16] = {0};
            for (int n = 0; n < N; n++) {
                const float *d = dout + (size_t)n * OC;
                for (int c = cb; c < ce; c++) acc[c - cb] += d[c];
            }
            for (int c = cb; c < ce; c++) dbias[c] += acc[c - cb];
        }
    }
}

/* ---- RMSNorm --------------------------------------------------------------------------- */

/* Head row r = (token n, head h) of a (N, n_heads * C) view at row stride ld: its offset. */
static inline int64_t head_row(int64_t r, int n_heads, int ld, int C) {
    return r / n_heads * ld + r % n_heads * C;
}

void hp_rmsnorm_heads_forward(float *out, int ldo, float *rstd, const float *inp, int ldi,
                              const float *weight, int N, int n_heads, int C, float eps) {
    int64_t rows = (int64_t)N * n_heads;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = inp + head_row(r, n_heads, ldi, C);
        float *y = out + head_row(r, n_heads, ldo, C);
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        float s = 1.0f / sqrtf(ss / (float)C + eps);
        rstd[r] = s;
#pragma omp simd
        for (int c = 0; c < C; c++) y[c] = x[c] * s * weight[c];
    }
}

static void rmsnorm_heads_bwd_in(float *dinp, int ldo, const float *dout, int lddo,
                                 const float *inp, int ldi, const float *weight,
                                 const float *rstd, int N, int n_heads, int C, int accumulate) {
    int64_t rows = (int64_t)N * n_heads;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = inp + head_row(r, n_heads, ldi, C);
        const float *dy = dout + head_row(r, n_heads, lddo, C);
        float *dx = dinp + head_row(r, n_heads, ldo, C);
        float s = rstd[r];
        float dot = 0.0f;   // sum_c dy * w * x
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; c++) dot += dy[c] * weight[c] * x[c];
        float k = s * s * s * dot / (float)C;
        if (accumulate) {
#pragma omp simd
            for (int c = 0; c < C; c++) dx[c] += s * weight[c] * dy[c] - k * x[c];
        } else {
#pragma omp simd
            for (int c = 0; c < C; c++) dx[c] = s * weight[c] * dy[c] - k * x[c];
        }
    }
}

void hp_rmsnorm_heads_backward_input(float *dinp, int ldo, const float *dout, int lddo,
                                     const float *inp, int ldi, const float *weight,
                                     const float *rstd, int N, int n_heads, int C) {
    rmsnorm_heads_bwd_in(dinp, ldo, dout, lddo, inp, ldi, weight, rstd, N, n_heads, C, 0);
}

void hp_rmsnorm_heads_backward_weight(float *dweight, const float *dout, int lddo,
                                      const float *inp, int ldi, const float *rstd,
                                      int N, int n_heads, int C) {
    // parallel over channel blocks; each channel sums its rows in order n (no atomics), so the
    // bits do not depend on the block width: 64 channels (eight 8-lane accumulators, four
    // cache lines of a row per visit) unless that leaves threads without a block
    const int wide = (C + 63) / 64 >= omp_get_max_threads();
    if (wide) {
        enum { CB = 64 };
#pragma omp parallel for schedule(static)
        for (int cb = 0; cb < C; cb += CB) {
            const int ce = cb + CB < C ? cb + CB : C;
            float acc[CB] = {0};
            for (int64_t n = 0; n < N; n++) {
                for (int h = 0; h < n_heads; h++) {
                    const float *x = inp + n * ldi + (int64_t)h * C + cb;
                    const float *dy = dout + n * lddo + (int64_t)h * C + cb;
                    const float s = rstd[n * n_heads + h];
                    if (ce - cb == CB) {   // a full block: constant trip count, acc in registers
#pragma omp simd
                        for (int c = 0; c < CB; c++) acc[c] += dy[c] * x[c] * s;
                    } else {
                        for (int c = 0; c < ce - cb; c++) acc[c] += dy[c] * x[c] * s;
                    }
                }
            }
            for (int c = cb; c < ce; c++) dweight[c] += acc[c - cb];
        }
        return;
    }
    enum { CB = 16 };
#pragma omp parallel for schedule(static)
    for (int cb = 0; cb < C; cb += CB) {
        int ce = cb + CB < C ? cb + CB : C;
        float acc[CB] = {0};
        for (int64_t n = 0; n < N; n++) {
            for (int h = 0; h < n_heads; h++) {
                const float *x = inp + n * ldi + (int64_t)h * C;
                const float *dy = dout + n * lddo + (int64_t)h * C;
                float s = rstd[n * n_heads + h];
                for (int c = cb; c < ce; c++) acc[c - cb] += dy[c] * x[c] * s;
            }
        }
        for (int c = cb; c < ce; c++) dweight[c] += acc[c - cb];
    }
}

void hp_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                        int N, int C, float eps) {
    hp_rmsnorm_heads_forward(out, C, rstd, inp, C, weight, N, 1, C, eps);
}

void hp_rmsnorm_backward_input(float *dinp, const float *dout, const float *inp,
                               const float *weight, const float *rstd, int N, int C, int accumulate) {
    rmsnorm_heads_bwd_in(dinp, C, dout, C, inp, C, weight, rstd, N, 1, C, accumulate);
}

void hp_rmsnorm_backward_weight(float *dweight, const float *dout, const float *inp,
                                const float *rstd, int N, int C) {
    hp_rmsnorm_heads_backward_weight(dweight, dout, C, inp, C, rstd, N, 1, C);
}

/* ---- RoPE ------------------------------------------------------------------------------ */

void hp_rope_table(float *cos_t, float *sin_t, int T, int head_dim, float theta,
                   const hp_rope_scaling_t *scaling) {
    int half = head_dim / 2;
    int ylo = 0, yhi = 0;
    if (scaling && scaling->yarn) {
        /* TorchTitan deepseek_v3 find_correction_range: dims where beta rotations fit in the
         * original context, floor / ceil, clamped to [0, hd - 1] (in double as Python's math) */
        const double two_pi = 2.0 * M_PI, lb = 2.0 * log((double)theta);
        double lo = floor(head_dim * log(scaling->original_max_pos / (scaling->beta_fast * two_pi)) / lb);
        double hi = ceil(head_dim * log(scaling->original_max_pos / (scaling->beta_slow * two_pi)) / lb);
        ylo = lo < 0 ? 0 : (int)lo;
        yhi = hi > head_dim - 1 ? head_dim - 1 : (int)hi;
    }
    for (int i = 0; i < half; i++) {
        // as torch: 1 / theta ** (arange(0, hd, 2).float() / hd), in f32
        float expo = (float)(2 * i) / (float)head_dim;
        float freq = 1.0f / powf(theta, expo);
        if (scaling && scaling->yarn) {
            // smooth = 1 - clamp((i - low) / (high - low), 0, 1) (f32 as torch), max += 0.001 if equal
            const float mx = ylo == yhi ? (float)yhi + 0.001f : (float)yhi;
            float ramp = ((float)i - (float)ylo) / (mx - (float)ylo);
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            const float smooth = 1.0f - ramp;
            freq = freq / scaling->factor * (1.0f - smooth) + freq * smooth;
        } else if (scaling && scaling->enabled) {
            // Llama 3.1: long wavelengths divided by factor, a smooth blend in between
            float lo_wl = (float)scaling->original_max_pos / scaling->low_freq_factor;
            float hi_wl = (float)scaling->original_max_pos / scaling->high_freq_factor;
            float wl = 2.0f * (float)M_PI / freq;
            float nf = wl > lo_wl ? freq / scaling->factor : freq;
            float smooth = ((float)scaling->original_max_pos / wl - scaling->low_freq_factor) /
                           (scaling->high_freq_factor - scaling->low_freq_factor);
            if (wl >= hi_wl && wl <= lo_wl)
                freq = (1.0f - smooth) * nf / scaling->factor + smooth * nf;
            else
                freq = nf;
        }
        for (int t = 0; t < T; t++) {
            float ang = (float)t * freq;   // f32 product as torch.outer
            cos_t[(size_t)t * half + i] = (float)cos((double)ang);
            sin_t[(size_t)t * half + i] = (float)sin((double)ang);
        }
    }
}

void hp_rope_apply(float *x, int ld, int B, int T, int n_heads, int head_dim,
                   const float *cos_t, const float *sin_t, hp_rope_style_t style, int inverse) {
    const float sgn = inverse ? -1.0f : 1.0f;
    const int64_t rows = (int64_t)B * T;
    const int half = head_dim / 2;
    const hp_nn_simd_t *k = hp_nn_simd();   // explicit-vector row kernel (nn-simd.h)
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int t = (int)(r % T);
        float buf[2 * head_dim];   // this row's expanded cos / sin (interleaved style)
        k->rope_row(x + r * ld, n_heads, head_dim, cos_t + (size_t)t * half, sin_t + (size_t)t * half, sgn,
                    style == HP_ROPE_INTERLEAVED, buf);
    }
}

/* ---- SwiGLU ------------------------------------------------------------------------------ */

/* Rows in parallel, each through the explicitly vectorised row kernel of the ISA path in use
 * (nn-simd.h: the exp inlined lane-wise). */
void hp_swiglu_forward(float *out, const float *h13, int N, int H) {
    const hp_nn_simd_t *k = hp_nn_simd();
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *a = h13 + (size_t)n * 2 * H, *b = a + H;   // (N, 2H): gate | up
        k->swiglu_fwd(out + (size_t)n * H, a, b, H);
    }
}

void hp_swiglu_backward(float *dh13, const float *dout, const float *h13, int N, int H) {
    const hp_nn_simd_t *k = hp_nn_simd();
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *a = h13 + (size_t)n * 2 * H, *b = a + H;
        float *da = dh13 + (size_t)n * 2 * H, *db = da + H;   // (N, 2H) =
        k->swiglu_bwd(da, db, dout + (size_t)n * H, a, b, H);
    }
}

/* ---- embedding -------------------------------------------------------------------------- */

void hp_embedding_forward(float *out, const int32_t *tokens, const float *weight, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * C, weight + (size_t)tokens[n] * C, sizeof(float) * (size_t)C);
}

void hp_embedding_backward(float *dweight, const float *dout, const int32_t *tokens, int N, int C, int V) {
    // each thread owns a contiguous range of vocab rows and scans the tokens in order, so
    // repeated tokens add in a fixed order without atomics
#pragma omp parallel
    {
        int nt = omp_get_num_threads(), tid = omp_get_thread_num();
        int lo = (int)((int64_t)V * tid / nt), hi = (int)((int64_t)V * (tid + 1) / nt);
        for (int n = 0; n < N; n++) {
            int t = tokens[n];
            if (t < lo || t >= hi) continue;
            float *dw = dweight + (size_t)t * C;
            const float *d = dout + (size_t)n * C;
#pragma omp simd
            for (int c = 0; c < C; c++) dw[c] += d[c];
        }
    }
}

/* ---- cross-entropy --------------------------------------------------------------------- */

double hp_cross_entropy_forward(double *losses, float *lse, const float *logits, const int32_t *targets,
                                int N, int V, int64_t *n_valid) {
    const hp_nn_simd_t *k = hp_nn_simd();
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        const float mx = k->row_max(z, V);
        const double s = k->exp_sum(z, mx, V);   // f32 exps summed in double, a fixed order
        double l = (double)mx + log(s);
        lse[n] = (float)l;
        int t = targets[n];
        losses[n] = (t == HP_IGNORE_INDEX) ? 0.0 : l - (double)z[t];
    }
    double sum = 0.0;   // fixed order
    int64_t cnt = 0;
    for (int n = 0; n < N; n++) {
        if (targets[n] == HP_IGNORE_INDEX) continue;
        sum += losses[n];
        cnt++;
    }
    if (n_valid) *n_valid = cnt;
    return sum;
}

void hp_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                               const int32_t *targets, float dloss, int N, int V) {
    hp_cross_entropy_backward_shard(dlogits, logits, lse, targets, dloss, N, V, 0);   // the whole vocab
}

/* ---- elementwise ------------------------------------------------------------------------- */

void hp_add_inplace(float *y, const float *x, int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}
