/* Element types and conversions. bf16 and f16 conversions from f32 round to nearest even;
 * NaN stays NaN, overflow goes to infinity. */
#ifndef HYPERPARALLEL_DTYPE_H
#define HYPERPARALLEL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_dtype {
    HP_F32 = 0,
    HP_BF16,
    HP_F16,
    HP_I32,
    HP_I64,
    HP_U8,
    HP_DTYPE_COUNT
} hp_dtype_t;

size_t hp_dtype_size(hp_dtype_t dt);        /* bytes per element */
const char *hp_dtype_name(hp_dtype_t dt);   /* "f32", "bf16", ... */
int hp_dtype_is_float(hp_dtype_t dt);

typedef uint16_t hp_bf16_t;
typedef uint16_t hp_f16_t;

hp_bf16_t hp_f32_to_bf16(float x);
float hp_bf16_to_f32(hp_bf16_t x);
hp_f16_t hp_f32_to_f16(float x);
float hp_f16_to_f32(hp_f16_t x);

/* Converts n elements between any two dtypes (float <-> int truncates toward zero as C does;
 * out-of-range integer results are saturated). src and dst must not overlap unless equal. */
void hp_convert(void *dst, hp_dtype_t dst_dt, const void *src, hp_dtype_t src_dt, size_t n);

#ifdef __cplusplus
}
#endif
#endif
