/* nn: the CPU kernels of the layers (linear, RMSNorm, RoPE, SwiGLU, embedding,
 * cross-entropy, elementwise) with their plain reference twins (hp_ref_*), and the run-time
 * choice of ISA path. Raw f32 pointers in the house order (outputs, saved, inputs, weights,
 * sizes; backward: gradients first). */
#ifndef HYPERPARALLEL_NN_KERNELS_H
#define HYPERPARALLEL_NN_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernels: linear (every GEMM through cblas_sgemm) ---------------------------------- */

// out (N, OC) = inp (N, IC) @ weight^T (OC, IC) + bias (OC) (bias may be NULL)
void hp_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                       int N, int IC, int OC);
/* Like hp_linear_forward but out += (residual add fused into the GEMM, beta = 1). */
void hp_linear_forward_acc(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int IC, int OC);
// dinp (N, IC) (= if !accumulate, += otherwise) = dout (N, OC) @ weight (OC, IC)
void hp_linear_backward_input(float *dinp, const float *dout, const float *weight,
                              int N, int IC, int OC, int accumulate);
// dweight (OC, IC) += dout^T @ inp; dbias (OC) += column sums of dout (dbias may be NULL)
void hp_linear_backward_weight(float *dweight, float *dbias, const float *dout, const float *inp,
                               int N, int IC, int OC);
void hp_ref_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int IC, int OC);
void hp_ref_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int IC, int OC);

/* ---- kernels: RMSNorm (rows of length C) ------------------------------------------------ */
// out (N, C), rstd (N) saved; y = x * rsqrt(mean(x^2) + eps) * weight
void hp_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                        int N, int C, float eps);
// dinp (N, C) (= if !accumulate, += otherwise; with = it may alias dout); uses saved rstd
void hp_rmsnorm_backward_input(float *dinp, const float *dout, const float *inp,
                               const float *weight, const float *rstd, int N, int C, int accumulate);
// dweight (C) +=
void hp_rmsnorm_backward_weight(float *dweight, const float *dout, const float *inp,
                                const float *rstd, int N, int C);
/* Head-wise variants (qk-norm): rows are (token n, head h) at n*ld + h*C, for N tokens of
 * n_heads heads; rstd (N, n_heads). out/dinp use ldo, inputs ldi. */
void hp_rmsnorm_heads_forward(float *out, int ldo, float *rstd, const float *inp, int ldi,
                              const float *weight, int N, int n_heads, int C, float eps);
void hp_rmsnorm_heads_backward_input(float *dinp, int ldo, const float *dout, int lddo,
                                     const float *inp, int ldi, const float *weight,
                                     const float *rstd, int N, int n_heads, int C);
void hp_rmsnorm_heads_backward_weight(float *dweight, const float *dout, int lddo,
                                      const float *inp, int ldi, const float *rstd,
                                      int N, int n_heads, int C);
void hp_ref_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                            int N, int C, float eps);
void hp_ref_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C);

/* ---- kernels: RoPE ---------------------------------------------------------------------- */
typedef enum hp_rope_style {
    HP_ROPE_INTERLEAVED = 0,   /* llama3: pairs (x[2i], x[2i+1]) as complex numbers */
    HP_ROPE_HALF = 1           /* qwen3 (rotate_half): pairs (x[i], x[i + hd/2]) */
} hp_rope_style_t;
typedef struct hp_rope_scaling {
    int enabled;
    float factor, low_freq_factor, high_freq_factor;
    int original_max_pos;
    /* YaRN (DeepSeek-V3, enabled ignored): freq / factor blended with freq by a linear ramp
     * over the correction range of beta_fast / beta_slow rotations at original_max_pos */
    int yarn;
    float beta_fast, beta_slow;
} hp_rope_scaling_t;
// cos, sin (T, hd/2): angles pos * freq_i, freq_i = theta^(-2i/hd) with optional Llama 3.1
// or YaRN scaling, computed in f32 as PyTorch's precompute (then cos/sin of the f32 angle)
void hp_rope_table(float *cos_t, float *sin_t, int T, int head_dim, float theta,
                   const hp_rope_scaling_t *scaling);
// x (N = B*T rows, each holding n_heads heads of head_dim at row stride ld) rotated in place
// by position (row % T). Backward is the same call with inverse = 1 (rotation by -angle).
void hp_rope_apply(float *x, int ld, int B, int T, int n_heads, int head_dim,
                   const float *cos_t, const float *sin_t, hp_rope_style_t style, int inverse);
void hp_ref_rope_apply(float *x, int ld, int B, int T, int n_heads, int head_dim,
                       const float *cos_t, const float *sin_t, hp_rope_style_t style, int inverse);

/* ---- ISA paths of the kernels -------------------------------------------------------------- */
/* Kernels with ISA-specific code (attention, the RoPE / SwiGLU / cross-entropy / AdamW row
 * kernels) pick a path at run time from cpuid, so the binary does not depend on -march.
 * AUTO (the default): the best path this CPU supports (avx512 where it has AVX-512 F, DQ, BW,
 * VL and CD; avx2 where AVX2 + FMA; portable otherwise); the environment variable
 * HP_NN_ISA=portable|avx2|avx512, read on first use, sets the start value. Forcing a path
 * lets a test check each one on a machine that has them all. */
typedef enum { HP_NN_ISA_AUTO = 0, HP_NN_ISA_PORTABLE, HP_NN_ISA_AVX2, HP_NN_ISA_AVX512 } hp_nn_isa_t;
/* HP_ERR_UNSUPPORTED if this CPU or build lacks `isa`. Not to be called while kernels run. */
hp_status_t hp_nn_set_isa(hp_nn_isa_t isa);
/* The path kernels use now (never AUTO). */
hp_nn_isa_t hp_nn_isa(void);
const char *hp_nn_isa_name(hp_nn_isa_t isa);   /* "auto", "portable", "avx2", "avx512" */

/* ---- the CPU, its GEMM library and its FMA peak --------------------------------------------- */
/* The widest vector ISA of this CPU that the OS enables: "avx512" (F, DQ, BW, VL, CD), "avx2"
 * (with FMA), "avx", "sse4.2", "sse2"; "arm64" / "unknown" elsewhere. */
const char *hp_cpu_isa_name(void);

/* Which GEMM kernels run (every linear's cblas_sgemm). OpenBLAS picks its kernel family from
 * the CPU's model number at load and falls back to old kernels on models newer than itself;
 * the library checks the family against the CPU's ISA at load and selects the right one
 * (src/nn/blas.c, docs/dependencies.md "GEMM library"), unless OPENBLAS_CORETYPE is set. */
typedef struct {
    char library[16];          /* "OpenBLAS" */
    char version[24];          /* "0.3.21" */
    char core[32];             /* the kernel family in use (openblas_get_corename): "SkylakeX" */
    char core_isa[16];         /* its ISA, as hp_cpu_isa_name's names ("unknown" off x86-64) */
    char cpu_isa[16];          /* hp_cpu_isa_name() */
    char library_choice[32];   /* the family the library chose by itself at load */
    int dynamic_arch;          /* the build has several families (DYNAMIC_ARCH) */
    int selected;              /* 1: the family was re-selected at load (library_choice was below the CPU) */
    int forced;                /* 1: OPENBLAS_CORETYPE is set in the environment (respected as given) */
    int below_cpu;             /* 1: the kernels in use are below the CPU's ISA: GEMMs run slow */
} hp_gemm_info_t;
void hp_gemm_info(hp_gemm_info_t *out);
/* One line for start-up logs ("GEMM: OpenBLAS 0.3.21, SkylakeX kernels (avx512) on a CPU with
 * avx512", and why when the family was re-selected or is below the CPU); returns below_cpu. */
int hp_gemm_describe(char *buf, size_t n);

/* The f32 FMA peak of `threads` cores (FLOP/s), independent of any library: a register-only
 * loop of independent fused multiply-adds at the CPU's widest vector ISA (zmm with AVX-512,
 * ymm with AVX2 + FMA, 4-wide vectors otherwise), run on `threads` OpenMP threads at once (<= 0:
 * omp_get_max_threads(), the threads the kernels use), each timed in its own thread CPU time
 * (so other load on a shared machine does not lower it); the sum of the threads' rates, the best
 * of several repetitions within about `seconds`. What every f32 FLOP of a step could at
 * most reach: the MFU denominator when metrics.peak_flops is not set (metrics.h). */
hp_status_t hp_cpu_fma_peak_flops(int threads, double seconds, double *flops);

/* ---- bfloat16: array conversions and the bf16 GEMM (src/nn/gemm_bf16.c) ------------------ */
/* n elements f32 -> bf16, round to nearest even, NaN kept quiet (hp_f32_to_bf16 per element),
 * and bf16 -> f32 (exact); explicit-vector loops on the avx512 / avx2 ISA paths (hp_nn_isa),
 * bitwise the reference twins hp_ref_convert_* (the scalar rule). */
void hp_convert_f32_to_bf16(hp_bf16_t *dst, const float *src, int64_t n);
void hp_convert_bf16_to_f32(float *dst, const hp_bf16_t *src, int64_t n);
void hp_ref_convert_f32_to_bf16(hp_bf16_t *dst, const float *src, int64_t n);
void hp_ref_convert_bf16_to_f32(float *dst, const hp_bf16_t *src, int64_t n);

/* c (M, N) f32 = alpha op(a) op(b) + beta c with bf16 a and b, row-major, the gemm slot's
 * argument conventions (backend.h); beta 0: c is not read. The products of bf16 values are
 * exact in f32 and summed in f32 on every path (in an order that differs between them), so a
 * path is within gamma_{K+2} of the magnitudes of the exact sum (tests/test_gemm_bf16.c).
 * Which implementation runs: oneDNN's dnnl_gemm_bf16bf16f32 (loaded with dlopen) where the CPU
 * has AMX, measured the fastest there; the f32 path (widen to f32, one OpenBLAS sgemm) elsewhere,
 * including CPUs with AVX512_BF16 but no AMX, where oneDNN's bf16 kernels were measured slower
 * than sgemm (docs/performance.md "bf16 GEMM"). HP_GEMM_BF16=auto|onednn|f32 or
 * hp_gemm_bf16_set_impl forces one (HP_ERR_UNSUPPORTED for oneDNN without it or AVX512_BF16). */
void hp_gemm_bf16(float *c, int ldc, const hp_bf16_t *a, int lda, const hp_bf16_t *b, int ldb, int M, int N, int K,
                  int trans_a, int trans_b, float alpha, float beta);
/* The same with the caller's scratch ws of ws_floats floats (the f32 path widens op(a) and op(b)
 * into it; oneDNN needs none), so the training step allocates nothing; ws NULL: allocated per
 * call as hp_gemm_bf16 does. ws_floats below what the path needs is an invariant failure. */
void hp_gemm_bf16_ws(float *c, int ldc, const hp_bf16_t *a, int lda, const hp_bf16_t *b, int ldb, int M, int N, int K,
                     int trans_a, int trans_b, float alpha, float beta, float *ws, size_t ws_floats);
/* Floats of scratch any implementation needs for these sizes (the f32 path's M K + K N + 1):
 * a caller sizes its workspace once, so a later hp_gemm_bf16_set_impl cannot outgrow it. */
size_t hp_gemm_bf16_ws_floats(int M, int N, int K, int trans_a, int trans_b);
/* the reference twin: double sums of the exact products, one rounding */
void hp_ref_gemm_bf16(float *c, int ldc, const hp_bf16_t *a, int lda, const hp_bf16_t *b, int ldb, int M, int N,
                      int K, int trans_a, int trans_b, float alpha, float beta);
typedef enum { HP_GEMM_BF16_AUTO = 0, HP_GEMM_BF16_ONEDNN, HP_GEMM_BF16_F32 } hp_gemm_bf16_impl_t;
hp_status_t hp_gemm_bf16_set_impl(hp_gemm_bf16_impl_t impl);
hp_gemm_bf16_impl_t hp_gemm_bf16_impl(void);                       /* the one running now (never AUTO) */
const char *hp_gemm_bf16_impl_name(hp_gemm_bf16_impl_t impl);      /* "auto", "onednn", "f32" */
/* One line for start-up logs: "bf16 GEMM: oneDNN 2.6.3 dnnl_gemm_bf16bf16f32, amx_bf16 kernels
 * (CPU: AMX and AVX512_BF16)", or the f32 path and why. */
int hp_gemm_bf16_describe(char *buf, size_t n);

/* ---- kernels: SwiGLU -------------------------------------------------------------------- */
// out (N, H) = silu(h13[:, :H]) * h13[:, H:], h13 (N, 2H)
void hp_swiglu_forward(float *out, const float *h13, int N, int H);
// dh13 (N, 2H) (=) from dout (N, H)
void hp_swiglu_backward(float *dh13, const float *dout, const float *h13, int N, int H);
void hp_ref_swiglu_forward(float *out, const float *h13, int N, int H);
void hp_ref_swiglu_backward(float *dh13, const float *dout, const float *h13, int N, int H);
/* The twin of the CPU backend's adamw_update (backend.h; torch.optim.adamw's single-tensor
 * arithmetic) in double: p = p (1 - lr wd) - lr / bc1 m' / (sqrt(v') / sqrt(bc2) + eps). */
void hp_ref_adamw_update(float *p, float *m, float *v, const float *g, int64_t n, double lr, double b1, double b2,
                         double eps, double wd, int64_t step);

/* ---- kernels: embedding ----------------------------------------------------------------- */
// out (N, C) = weight[tokens[n]]; tokens must be in [0, V) (checked by the caller)
void hp_embedding_forward(float *out, const int32_t *tokens, const float *weight, int N, int C);
// dweight (V, C) += scatter of dout (N, C); parallel over vocab rows (each thread owns rows)
void hp_embedding_backward(float *dweight, const float *dout, const int32_t *tokens, int N, int C, int V);
void hp_ref_embedding_backward(float *dweight, const float *dout, const int32_t *tokens, int N, int C, int V);

/* ---- kernels: cross-entropy ----------------------------------------------------------- */
/* losses (N, double) = lse(logits[n]) - logits[n][target] for valid targets, 0 for ignored;
 * lse (N) saved for backward; returns the sum over valid rows (fixed order, double) and
 * *n_valid. Row sums of exp and the logs are taken in double. */
double hp_cross_entropy_forward(double *losses, float *lse, const float *logits, const int32_t *targets,
                                int N, int V, int64_t *n_valid);
// dlogits (N, V) (=) = (softmax - onehot) * dloss for valid rows, 0 for ignored rows
void hp_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                               const int32_t *targets, float dloss, int N, int V);
double hp_ref_cross_entropy_forward(double *losses, const float *logits, const int32_t *targets,
                                    int N, int V, int64_t *n_valid);
void hp_ref_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets,
                                   float dloss, int N, int V);

/* ---- elementwise ---------------------------------------------------------------------- */
void hp_add_inplace(float *y, const float *x, int64_t n);   /* y += x */

#ifdef __cplusplus
}
#endif
#endif
