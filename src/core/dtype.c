/* Element types and conversions; bf16 and f16 from f32 round to nearest even. */
#include "hyperparallel/dtype.h"

#include <math.h>
#include <string.h>

static const size_t dtype_sizes[HP_DTYPE_COUNT] = {4, 2, 2, 4, 8, 1};
static const char *const dtype_names[HP_DTYPE_COUNT] = {"f32", "bf16", "f16", "i32", "i64", "u8"};

size_t hp_dtype_size(hp_dtype_t dt) { return (unsigned)dt < HP_DTYPE_COUNT ? dtype_sizes[dt] : 0; }
const char *hp_dtype_name(hp_dtype_t dt) { return (unsigned)dt < HP_DTYPE_COUNT ? dtype_names[dt] : "invalid"; }
int hp_dtype_is_float(hp_dtype_t dt) { return dt == HP_F32 || dt == HP_BF16 || dt == HP_F16; }

static inline uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

hp_bf16_t hp_f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (hp_bf16_t)((u >> 16) | 0x40u); /* quiet NaN */
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;   /* round to nearest even; overflow carries into inf */
    return (hp_bf16_t)(u >> 16);
}

float hp_bf16_to_f32(hp_bf16_t x) { return bits_f32((uint32_t)x << 16); }

hp_f16_t hp_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (hp_f16_t)(sign | 0x7e00u);            /* NaN */
    if (a >= 0x477ff000u) return (hp_f16_t)(sign | 0x7c00u);           /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                             /* subnormal or zero in f16 */
        if (a < 0x33000000u) return (hp_f16_t)sign;                    /* < 2^-25: rounds to 0 */
        uint32_t exp = a >> 23;
        uint32_t mant = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exp;                                   /* 14..24 */
        uint32_t half = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (hp_f16_t)(sign | half);
    }
    uint32_t lsb = (a >> 13) & 1u;
    a += 0xfffu + lsb;                                                 /* round mantissa */
    uint32_t h = ((a >> 13) - (112u << 10));                           /* rebias 127 -> 15 */
    return (hp_f16_t)(sign | h);
}

float hp_f16_to_f32(hp_f16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t mant = (uint32_t)h & 0x3ffu;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        float v = (float)mant * 0x1p-24f;   /* subnormal: mant * 2^-24, exact in f32 */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

static inline double load_as_double(const void *p, hp_dtype_t dt, size_t i) {
    switch (dt) {
    case HP_F32: return ((const float *)p)[i];
    case HP_BF16: return hp_bf16_to_f32(((const uint16_t *)p)[i]);
    case HP_F16: return hp_f16_to_f32(((const uint16_t *)p)[i]);
    case HP_I32: return ((const int32_t *)p)[i];
    case HP_I64: return (double)((const int64_t *)p)[i];
    case HP_U8: return ((const uint8_t *)p)[i];
    default: return 0.0;
    }
}

static inline double clampd(double v, double lo, double hi) {
    if (isnan(v)) return 0.0;
    return v < lo ? lo : (v > hi ? hi : v);
}

static inline void store_from_double(void *p, hp_dtype_t dt, size_t i, double v) {
    switch (dt) {
    case HP_F32: ((float *)p)[i] = (float)v; break;
    case HP_BF16: ((uint16_t *)p)[i] = hp_f32_to_bf16((float)v); break;
    case HP_F16: ((uint16_t *)p)[i] = hp_f32_to_f16((float)v); break;
    case HP_I32: ((int32_t *)p)[i] = (int32_t)clampd(trunc(v), -2147483648.0, 2147483647.0); break;
    case HP_I64: ((int64_t *)p)[i] = (int64_t)clampd(trunc(v), -9223372036854775808.0, 9223372036854774784.0); break;
    case HP_U8: ((uint8_t *)p)[i] = (uint8_t)clampd(trunc(v), 0.0, 255.0); break;
    default: break;
    }
}

void hp_convert(void *dst, hp_dtype_t dst_dt, const void *src, hp_dtype_t src_dt, size_t n) {
    if (dst_dt == src_dt) {
        if (dst != src) memmove(dst, src, n * hp_dtype_size(dst_dt));
        return;
    }
    /* Fast paths for the float conversions used by mixed precision: f32 to and from the
     * 16-bit float types, element by element without the double in between. */
    const int half_dst = dst_dt == HP_BF16 || dst_dt == HP_F16, half_src = src_dt == HP_BF16 || src_dt == HP_F16;
    if (src_dt == HP_F32 && half_dst) {
        const float *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = dst_dt == HP_BF16 ? hp_f32_to_bf16(s[i]) : hp_f32_to_f16(s[i]);
        return;
    }
    if (half_src && dst_dt == HP_F32) {
        const uint16_t *s = src;
        float *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = src_dt == HP_BF16 ? hp_bf16_to_f32(s[i]) : hp_f16_to_f32(s[i]);
        return;
    }
    /* I64 <-> I32 without going through double (exact for all int32 values). */
    if (src_dt == HP_I32 && dst_dt == HP_I64) {
        const int32_t *s = src; int64_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = s[i];
        return;
    }
    for (size_t i = 0; i < n; i++) store_from_double(dst, dst_dt, i, load_as_double(src, src_dt, i));
}
