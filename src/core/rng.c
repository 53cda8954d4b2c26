/* Philox 4x32-10 counter-based RNG. Element i of stream (seed, name) is a pure function of
 * (seed, hash(name), i): counter = (i_lo, i_hi, hash_lo, hash_hi), key = (seed_lo, seed_hi). */
#include "hyperparallel/rng.h"

#include <math.h>
#include <string.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void hp_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

hp_rng_key_t hp_rng_key(uint64_t seed, const char *stream_name) {
    uint64_t h = 1469598103934665603ull;   /* FNV-1a 64 */
    for (const unsigned char *p = (const unsigned char *)(stream_name ? stream_name : ""); *p; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    hp_rng_key_t k = {seed, h};
    return k;
}

static inline void block_at(hp_rng_key_t key, uint64_t index, uint32_t out[4]) {
    uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)key.stream, (uint32_t)(key.stream >> 32)};
    uint32_t k[2] = {(uint32_t)key.seed, (uint32_t)(key.seed >> 32)};
    hp_philox4x32_10(ctr, k, out);
}

/* 24-bit uniforms: exact in float. */
static inline double u01(uint32_t x) { return (double)(x >> 8) * 0x1p-24; }            /* [0, 1) */
static inline double u01_open(uint32_t x) { return ((double)(x >> 8) + 1.0) * 0x1p-24; } /* (0, 1] */

float hp_rng_uniform_at(hp_rng_key_t key, uint64_t index) {
    uint32_t o[4];
    block_at(key, index, o);
    return (float)u01(o[0]);
}

static inline double std_normal_at(hp_rng_key_t key, uint64_t index) {
    uint32_t o[4];
    block_at(key, index, o);
    /* Box-Muller with 32-bit-derived uniforms from two lanes. */
    double u1 = ((double)o[0] + 1.0) * 0x1p-32;   /* (0, 1] */
    double u2 = (double)o[1] * 0x1p-32;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

float hp_rng_normal_at(hp_rng_key_t key, uint64_t index, float mean, float std) {
    return (float)(mean + std * std_normal_at(key, index));
}

/* Inverse error function: Giles' single-precision initial guess refined by two Newton
 * steps on erf (double), accurate to ~1e-15 on (-1, 1). */
static double erfinv_d(double x) {
    if (x <= -1.0) return -INFINITY;
    if (x >= 1.0) return INFINITY;
    double w = -log((1.0 - x) * (1.0 + x)), p;
    if (w < 5.0) {
        w -= 2.5;
        p = 2.81022636e-08;
        p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
        p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; p = -0.00417768164 + p * w;
        p = 0.246640727 + p * w; p = 1.50140941 + p * w;
    } else {
        w = sqrt(w) - 3.0;
        p = -0.000200214257;
        p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; p = -0.00367342844 + p * w;
        p = 0.00573950773 + p * w; p = -0.0076224613 + p * w; p = 0.00943887047 + p * w;
        p = 1.00167406 + p * w; p = 2.83297682 + p * w;
    }
    double y = p * x;
    for (int i = 0; i < 2; i++) {
        double err = erf(y) - x;
        y -= err / (1.1283791670955126 * exp(-y * y));
    }
    return y;
}

float hp_rng_trunc_normal_at(hp_rng_key_t key, uint64_t index, float mean, float std, float a, float b) {
    /* Inverse-CDF method as torch.nn.init.trunc_normal_: uniform over [cdf(a), cdf(b)]. */
    double lo = 0.5 * (1.0 + erf(((double)a - mean) / std / 1.4142135623730951));
    double hi = 0.5 * (1.0 + erf(((double)b - mean) / std / 1.4142135623730951));
    uint32_t o[4];
    block_at(key, index, o);
    double u = u01_open(o[0]) - 0.5 * 0x1p-24;   /* centre of a 2^-24 bin, in (0, 1) */
    double p = 2.0 * (lo + (hi - lo) * u) - 1.0;
    double x = mean + std * 1.4142135623730951 * erfinv_d(p);
    if (x < a) x = a;
    if (x > b) x = b;
    return (float)x;
}

static inline float sample(hp_rng_key_t key, const hp_rng_spec_t *s, uint64_t i) {
    switch (s->dist) {
    case HP_RNG_UNIFORM: return (float)(s->p0 + (s->p1 - s->p0) * u01(({ uint32_t o[4]; block_at(key, i, o); o[0]; })));
    case HP_RNG_NORMAL: return hp_rng_normal_at(key, i, s->p0, s->p1);
    case HP_RNG_TRUNC_NORMAL: return hp_rng_trunc_normal_at(key, i, s->p0, s->p1, s->a, s->b);
    }
    return 0.0f;
}

hp_status_t hp_rng_fill(hp_tensor_t *t, hp_rng_key_t key, const hp_rng_spec_t *spec, const int64_t *global_shape,
                        const int64_t *global_offset) {
    if (!hp_dtype_is_float(t->dtype))
        return hp_error(HP_ERR_INVALID_ARG, "rng fill: tensor dtype %s is not a float type", hp_dtype_name(t->dtype));
    if ((unsigned)spec->dist > HP_RNG_TRUNC_NORMAL)
        return hp_error(HP_ERR_INVALID_ARG, "rng fill: unknown distribution %d", (int)spec->dist);
    int nd = t->ndim;
    int64_t gshape[HP_MAX_DIMS], goff[HP_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        gshape[d] = global_shape ? global_shape[d] : t->shape[d];
        goff[d] = global_offset ? global_offset[d] : 0;
        if (goff[d] < 0 || goff[d] + t->shape[d] > gshape[d])
            return hp_error(HP_ERR_INVALID_ARG,
                            "rng fill: shard [%lld, %lld) on dim %d lies outside the global size %lld",
                            (long long)goff[d], (long long)(goff[d] + t->shape[d]), d, (long long)gshape[d]);
    }
    int64_t numel = hp_tensor_numel(t);
    size_t es = hp_dtype_size(t->dtype);
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < numel; e++) {
        int64_t rem = e, flat = 0, mul = 1, off = 0;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t i = rem % t->shape[d];
            rem /= t->shape[d];
            flat += (goff[d] + i) * mul;
            mul *= gshape[d];
            off += i * t->stride[d];
        }
        float v = sample(key, spec, (uint64_t)flat);
        hp_convert((char *)t->data + off * (int64_t)es, t->dtype, &v, HP_F32, 1);
    }
    return HP_OK;
}
