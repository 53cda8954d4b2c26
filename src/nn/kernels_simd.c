/* Instantiates the elementwise row kernels (kernels-simd.h) per ISA path and picks the table
 * for hp_nn_isa() (nn-simd.h): AVX-512 (16 lanes) where the CPU has F, DQ, BW, VL and CD,
 * AVX2+FMA (8 lanes), else the portable 4-lane one (SSE2 on x86-64, NEON on arm64). The same
 * arithmetic per lane on every path; only the cross-entropy's double sums group lanes by the
 * vector width (lane-wise, then the lanes in order), so its bits differ between paths within
 * the derived bound (tests/test_nn_kernels.c checks each path against the reference). */
#include <math.h>
#include <stdint.h>
#include "hyperparallel/nn.h"
#include "nn/nn-math.h"
#include "nn/nn-simd.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HP_K_HAVE_AVX512 1
#define HP_K_SFX avx512
#define HP_K_VW 16
#define HP_K_ATTR __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512cd,avx2,fma")))
#define HP_K_SQRT_AVX512 1
#include "nn/kernels-simd.h"
#undef HP_K_SFX
#undef HP_K_VW
#undef HP_K_ATTR
#undef HP_K_SQRT_AVX512
#define HP_K_HAVE_AVX2 1
#define HP_K_SFX avx2
#define HP_K_VW 8
#define HP_K_ATTR __attribute__((target("avx2,fma")))
#define HP_K_SQRT_AVX 1
#include "nn/kernels-simd.h"
#undef HP_K_SFX
#undef HP_K_VW
#undef HP_K_ATTR
#undef HP_K_SQRT_AVX
#define HP_K_SQRT_SSE 1
#endif

#define HP_K_SFX generic4
#define HP_K_VW 4
#define HP_K_ATTR
#include "nn/kernels-simd.h"
#undef HP_K_SFX
#undef HP_K_VW
#undef HP_K_ATTR

static const hp_nn_simd_t table_generic4 = {"portable", swiglu_fwd_generic4, swiglu_bwd_generic4, row_max_generic4,
                                            exp_sum_generic4, exp_scale_generic4, rope_row_generic4,
                                            adamw_generic4};
#ifdef HP_K_HAVE_AVX512
static const hp_nn_simd_t table_avx512 = {"avx512", swiglu_fwd_avx512, swiglu_bwd_avx512, row_max_avx512,
                                          exp_sum_avx512, exp_scale_avx512, rope_row_avx512, adamw_avx512};
#endif
#ifdef HP_K_HAVE_AVX2
static const hp_nn_simd_t table_avx2 = {"avx2", swiglu_fwd_avx2, swiglu_bwd_avx2, row_max_avx2,
                                        exp_sum_avx2, exp_scale_avx2, rope_row_avx2, adamw_avx2};
#endif

const hp_nn_simd_t *hp_nn_simd(void) {
#ifdef HP_K_HAVE_AVX512
    if (hp_nn_isa() == HP_NN_ISA_AVX512) return &table_avx512;
#endif
#ifdef HP_K_HAVE_AVX2
    if (hp_nn_isa() == HP_NN_ISA_AVX2) return &table_avx2;
#endif
    return &table_generic4;
}
