/* Vectorisable elementwise math for the nn kernels. hp_nn_expf is a Cody-Waite range
 * reduction plus a degree-6 Taylor polynomial (relative error < 2e-7, about 1-2 ulp, versus
 * glibc's expf); written with plain arithmetic and a union bit cast so that GCC vectorises
 * it inside `#pragma omp simd` loops (glibc's expf is a scalar call there). */
#ifndef HP_NN_MATH_H
#define HP_NN_MATH_H

#include <stdint.h>

/* The polynomial of hp_nn_expf, highest degree first for Horner's rule: 1/720, 1/120, 1/24,
 * 1/6, 1/2, 1, 1. The vector exps (attention-tiles.h, kernels-simd.h) evaluate it from here. */
static const float hp_nn_exp_poly[7] = {1.3888889e-3f, 8.3333333e-3f, 4.1666667e-2f, 1.6666667e-1f, 0.5f, 1.0f, 1.0f};

static inline float hp_nn_expf(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    // round to nearest with the 1.5 * 2^23 trick (floorf does not vectorise unless
    // -fno-trapping-math, which the build does not use)
    const float magic = 12582912.0f;
    float n = (xc * log2e + magic) - magic;
    float r = xc - n * ln2_hi;
    r = r - n * ln2_lo;
    float p = 1.3888889e-3f;                 // 1/720
    p = p * r + 8.3333333e-3f;               // 1/120
    p = p * r + 4.1666667e-2f;               // 1/24
    p = p * r + 1.6666667e-1f;               // 1/6
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int32_t i; float f; } scale;
    // unsigned shift: n is in [-126, 127] for finite x; a NaN input must not be UB here
    scale.i = (int32_t)((uint32_t)((int32_t)n + 127) << 23);
    return x < -87.0f ? 0.0f : p * scale.f;   // exp(-inf) = 0 (masked scores)
}

#endif
