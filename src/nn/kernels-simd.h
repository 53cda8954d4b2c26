/* Row kernels of the elementwise nn ops (SwiGLU, the cross-entropy exps, AdamW), written once
 * on GCC vector types of HP_K_VW floats and instantiated per ISA path by kernels_simd.c
 * (AVX-512: 16 lanes; AVX2+FMA: 8 lanes under __attribute__((target("avx2,fma"))); portable: 4
 * lanes, SSE2 / NEON),
 * so that the exp is vectorised explicitly rather than by the compiler's choice (GCC 12 -O2
 * left these loops scalar: "control flow in loop"). Parameters:
 *   HP_K_SFX  suffix of the generated names; HP_K_VW lanes; HP_K_ATTR function attribute;
 *   HP_K_SQRT_AVX512 / HP_K_SQRT_AVX / HP_K_SQRT_SSE: AVX-512 / AVX / SSE intrinsics for the
 *   square root (vsqrtps / sqrtps) and the float-to-double conversion (else per lane).
 * Tails (n % VW) run the same arithmetic one lane at a time through a one-lane vector load. */

#define HP_K_CAT_(a, b) a##_##b
#define HP_K_CAT(a, b) HP_K_CAT_(a, b)
#define HP_K_N(name) HP_K_CAT(name, HP_K_SFX)
#define HP_K_INL static inline __attribute__((always_inline)) HP_K_ATTR

typedef float HP_K_N(vf) __attribute__((vector_size(HP_K_VW * 4), aligned(4), may_alias));
typedef int32_t HP_K_N(vi) __attribute__((vector_size(HP_K_VW * 4), aligned(4), may_alias));
typedef uint32_t HP_K_N(vu) __attribute__((vector_size(HP_K_VW * 4), aligned(4), may_alias));
typedef double HP_K_N(vdh) __attribute__((vector_size(HP_K_VW * 4), aligned(8), may_alias));   // VW/2 doubles
#define VF HP_K_N(vf)
#define VI HP_K_N(vi)
#define VU HP_K_N(vu)
#define VDH HP_K_N(vdh)

/* n (< VW) floats into a vector, the rest `fill`; and back */
HP_K_INL VF HP_K_N(ldn)(const float *p, int n, float fill) {
    VF x = (VF){0} + fill;
    for (int l = 0; l < n; l++) x[l] = p[l];
    return x;
}
HP_K_INL void HP_K_N(stn)(float *p, VF x, int n) {
    for (int l = 0; l < n; l++) p[l] = x[l];
}
#define LD(p) (*(const VF *)(p))
#define ST(p, x) (*(VF *)(p) = (x))

HP_K_INL VF HP_K_N(sel)(VI m, VF a, VF b) { return (VF)(((VI)a & m) | ((VI)b & ~m)); }   // m ? a : b

/* exp(x) lane-wise, hp_nn_expf's arithmetic (nn-math.h: clamp to [-87, 88], Cody-Waite
 * reduction in two steps, degree-6 Taylor polynomial, 2^n from the exponent bits; relative
 * error < 2e-7; exactly 0 below -87, so exp(-inf) = 0). */
HP_K_INL VF HP_K_N(vexp)(VF x) {
    const float log2e = 1.44269504088896341f;
    const float magic = 12582912.0f + 127.0f;   // 1.5 * 2^23 + bias: low mantissa bits = n + 127
    VF xc = HP_K_N(sel)(x < -87.0f, (VF){0} - 87.0f, x);
    xc = HP_K_N(sel)(xc > 88.0f, (VF){0} + 88.0f, xc);
    const VF t = xc * log2e + magic;
    const VF n = t - magic;
    VF r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    VF p = (VF){0} + hp_nn_exp_poly[0];
#pragma GCC unroll 6
    for (int i = 1; i < 7; i++) p = p * r + hp_nn_exp_poly[i];
    const VU e = (VU)t << 23;   // (n + 127) << 23: the bits of 2^n (the top bits shift out)
    return HP_K_N(sel)(x < -87.0f, (VF){0}, p * (VF)e);
}

/* SwiGLU forward of one row: o = silu(a) * b. */
HP_K_INL VF HP_K_N(swiglu1)(VF x, VF b) { return x / (1.0f + HP_K_N(vexp)(-x)) * b; }
static HP_K_ATTR void HP_K_N(swiglu_fwd)(float *o, const float *a, const float *b, int n) {
    int j = 0;
    for (; j + HP_K_VW <= n; j += HP_K_VW) ST(o + j, HP_K_N(swiglu1)(LD(a + j), LD(b + j)));
    if (j < n) {
        const int m = n - j;
        HP_K_N(stn)(o + j, HP_K_N(swiglu1)(HP_K_N(ldn)(a + j, m, 0), HP_K_N(ldn)(b + j, m, 0)), m);
    }
}

/* SwiGLU backward of one row: db = d silu(a), da = d b silu'(a). */
HP_K_INL void HP_K_N(swiglu_b1)(VF *da, VF *db, VF d, VF x, VF b) {
    const VF sg = 1.0f / (1.0f + HP_K_N(vexp)(-x));
    *db = d * (x * sg);
    *da = d * b * (sg * (1.0f + x * (1.0f - sg)));
}
static HP_K_ATTR void HP_K_N(swiglu_bwd)(float *da, float *db, const float *d, const float *a, const float *b,
                                         int n) {
    int j = 0;
    VF va, vb;
    for (; j + HP_K_VW <= n; j += HP_K_VW) {
        HP_K_N(swiglu_b1)(&va, &vb, LD(d + j), LD(a + j), LD(b + j));
        ST(da + j, va);
        ST(db + j, vb);
    }
    if (j < n) {
        const int m = n - j;
        HP_K_N(swiglu_b1)(&va, &vb, HP_K_N(ldn)(d + j, m, 0), HP_K_N(ldn)(a + j, m, 0), HP_K_N(ldn)(b + j, m, 0));
        HP_K_N(stn)(da + j, va, m);
        HP_K_N(stn)(db + j, vb, m);
    }
}

/* max of z[0..n) (n >= 1) */
static HP_K_ATTR float HP_K_N(row_max)(const float *z, int n) {
    VF mx = (VF){0} - INFINITY;
    int j = 0;
    for (; j + HP_K_VW <= n; j += HP_K_VW) mx = HP_K_N(sel)(LD(z + j) > mx, LD(z + j), mx);
    float m = -INFINITY;
    for (int l = 0; l < HP_K_VW; l++) m = mx[l] > m ? mx[l] : m;
    for (; j < n; j++) m = z[j] > m ? z[j] : m;
    return m;
}

/* sum of exp(z - shift) over z[0..n): f32 exps summed in double, lane-wise then the lanes in
 * order, then the tail: a fixed order (independent of threads). */
/* the low and high halves of a float vector as doubles (one register each: a whole-width double
 * vector would live on the stack) */
HP_K_INL void HP_K_N(cvt_pd)(VF e, VDH *lo, VDH *hi) {
#if defined(HP_K_SQRT_AVX512)
    *lo = (VDH)_mm512_cvtps_pd(_mm512_castps512_ps256((__m512)e));
    *hi = (VDH)_mm512_cvtps_pd((__m256)_mm512_extractf64x4_pd((__m512d)e, 1));
#elif defined(HP_K_SQRT_AVX)
    *lo = (VDH)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)e));
    *hi = (VDH)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)e, 1));
#elif defined(HP_K_SQRT_SSE)
    *lo = (VDH)_mm_cvtps_pd((__m128)e);
    *hi = (VDH)_mm_cvtps_pd(_mm_movehl_ps((__m128)e, (__m128)e));
#else
    for (int l = 0; l < HP_K_VW / 2; l++) (*lo)[l] = e[l], (*hi)[l] = e[HP_K_VW / 2 + l];
#endif
}
static HP_K_ATTR double HP_K_N(exp_sum)(const float *z, float shift, int n) {
    VDH a0 = (VDH){0}, a1 = (VDH){0};
    int j = 0;
    for (; j + HP_K_VW <= n; j += HP_K_VW) {
        VDH lo, hi;
        HP_K_N(cvt_pd)(HP_K_N(vexp)(LD(z + j) - shift), &lo, &hi);
        a0 += lo;
        a1 += hi;
    }
    double s = 0.0;
    for (int l = 0; l < HP_K_VW / 2; l++) s += a0[l];
    for (int l = 0; l < HP_K_VW / 2; l++) s += a1[l];
    if (j < n) {
        const VF e = HP_K_N(vexp)(HP_K_N(ldn)(z + j, n - j, -INFINITY) - shift);   // padding lanes: exp(-inf) = 0
        for (int l = 0; l < n - j; l++) s += (double)e[l];
    }
    return s;
}

/* d = exp(z - shift) * mul over n floats (the cross-entropy gradient before the target term) */
static HP_K_ATTR void HP_K_N(exp_scale)(float *d, const float *z, float shift, float mul, int n) {
    int j = 0;
    for (; j + HP_K_VW <= n; j += HP_K_VW) ST(d + j, HP_K_N(vexp)(LD(z + j) - shift) * mul);
    if (j < n) HP_K_N(stn)(d + j, HP_K_N(vexp)(HP_K_N(ldn)(z + j, n - j, 0) - shift) * mul, n - j);
}

/* RoPE of one row's n_heads heads, in place (head h at v + h hd), inverse when sgn = -1.
 * Interleaved pairs (x[2i], x[2i+1]): out = x c2 + swap(x) s2 with c2 = (c0 c0 c1 c1 ..) and
 * s2 = (-s0 s0 -s1 s1 ..) (times sgn), built once per row in buf (2 hd floats) and applied to
 * every head; rotate_half pairs (x[i], x[i + hd/2]): a' = a c - b s, b' = b c + a s. */
HP_K_INL VF HP_K_N(swap_pairs)(VF x) {
    VI m;
    for (int l = 0; l < HP_K_VW; l++) m[l] = l ^ 1;
    return __builtin_shuffle(x, m);
}
static HP_K_ATTR void HP_K_N(rope_row)(float *v, int n_heads, int hd, const float *c, const float *s, float sgn,
                                       int interleaved, float *buf) {
    const int half = hd / 2;
    if (interleaved) {
        float *c2 = buf, *s2 = buf + hd;
        for (int i = 0; i < half; i++) {
            c2[2 * i] = c2[2 * i + 1] = c[i];
            s2[2 * i] = -(sgn * s[i]);
            s2[2 * i + 1] = sgn * s[i];
        }
        for (int h = 0; h < n_heads; h++) {
            float *x = v + (size_t)h * hd;
            int j = 0;
            for (; j + HP_K_VW <= hd; j += HP_K_VW) {
                const VF xv = LD(x + j);
                ST(x + j, xv * LD(c2 + j) + HP_K_N(swap_pairs)(xv) * LD(s2 + j));
            }
            if (j < hd) {   // hd - j is even: pairs stay in the vector
                const int m = hd - j;
                const VF xv = HP_K_N(ldn)(x + j, m, 0);
                HP_K_N(stn)(x + j, xv * HP_K_N(ldn)(c2 + j, m, 0) + HP_K_N(swap_pairs)(xv) * HP_K_N(ldn)(s2 + j, m, 0), m);
            }
        }
        return;
    }
    for (int h = 0; h < n_heads; h++) {
        float *a = v + (size_t)h * hd, *b = a + half;
        int i = 0;
        for (; i + HP_K_VW <= half; i += HP_K_VW) {
            const VF va = LD(a + i), vb = LD(b + i), vc = LD(c + i), vs = LD(s + i) * sgn;
            ST(a + i, va * vc - vb * vs);
            ST(b + i, vb * vc + va * vs);
        }
        if (i < half) {
            const int m = half - i;
            const VF va = HP_K_N(ldn)(a + i, m, 0), vb = HP_K_N(ldn)(b + i, m, 0), vc = HP_K_N(ldn)(c + i, m, 0),
                     vs = HP_K_N(ldn)(s + i, m, 0) * sgn;
            HP_K_N(stn)(a + i, va * vc - vb * vs, m);
            HP_K_N(stn)(b + i, vb * vc + va * vs, m);
        }
    }
}

/* AdamW (torch.optim.adamw's single-tensor arithmetic, as backend_cpu.c's reference loop):
 * p = p decay - step_size m / (sqrt(v) / bc2_sqrt + eps), m = m + w1 (g - m), v = b2 v + w2 g^2. */
HP_K_INL void HP_K_N(adamw1)(VF *p, VF *m, VF *v, VF g, float decay, float w1, float b2, float w2, float step_size,
                             float bc2_sqrt, float eps) {
    const VF pi = *p * decay;
    const VF mi = *m + w1 * (g - *m);
    const VF vi = b2 * *v + w2 * g * g;
    VF sq;
#if defined(HP_K_SQRT_AVX512)
    sq = (VF)_mm512_sqrt_ps((__m512)vi);   // vsqrtps zmm: correctly rounded, as sqrtf
#elif defined(HP_K_SQRT_AVX)
    sq = (VF)_mm256_sqrt_ps((__m256)vi);   // vsqrtps: correctly rounded, as sqrtf
#elif defined(HP_K_SQRT_SSE)
    sq = (VF)_mm_sqrt_ps((__m128)vi);
#else
    for (int l = 0; l < HP_K_VW; l++) sq[l] = __builtin_sqrtf(vi[l]);
#endif
    *m = mi;
    *v = vi;
    *p = pi - step_size * (mi / (sq / bc2_sqrt + eps));
}
static HP_K_ATTR void HP_K_N(adamw)(float *p, float *m, float *v, const float *g, int64_t n, float decay, float w1,
                                    float b2, float w2, float step_size, float bc2_sqrt, float eps) {
    int64_t j = 0;
    for (; j + HP_K_VW <= n; j += HP_K_VW) {
        VF vp = LD(p + j), vm = LD(m + j), vv = LD(v + j);
        HP_K_N(adamw1)(&vp, &vm, &vv, LD(g + j), decay, w1, b2, w2, step_size, bc2_sqrt, eps);
        ST(p + j, vp);
        ST(m + j, vm);
        ST(v + j, vv);
    }
    if (j < n) {
        const int r = (int)(n - j);
        VF vp = HP_K_N(ldn)(p + j, r, 0), vm = HP_K_N(ldn)(m + j, r, 0), vv = HP_K_N(ldn)(v + j, r, 0);
        HP_K_N(adamw1)(&vp, &vm, &vv, HP_K_N(ldn)(g + j, r, 0), decay, w1, b2, w2, step_size, bc2_sqrt, eps);
        HP_K_N(stn)(p + j, vp, r);
        HP_K_N(stn)(m + j, vm, r);
        HP_K_N(stn)(v + j, vv, r);
    }
}

#undef LD
#undef ST
#undef VF
#undef VI
#undef VU
#undef VDH
#undef HP_K_INL
#undef HP_K_N
#undef HP_K_CAT
#undef HP_K_CAT_
