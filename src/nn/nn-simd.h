/* The explicitly vectorised row kernels of the elementwise nn ops (kernels-simd.h), one table
 * per ISA path; hp_nn_simd() returns the one for hp_nn_isa() (isa.c), so the choice is made
 * at run time from cpuid like attention's. Internal to src/nn. */
#ifndef HP_NN_SIMD_H
#define HP_NN_SIMD_H

#include <stdint.h>

typedef struct {
    const char *name;
    /* o = silu(a) * b over n floats */
    void (*swiglu_fwd)(float *o, const float *a, const float *b, int n);
    /* db = d silu(a), da = d b silu'(a) */
    void (*swiglu_bwd)(float *da, float *db, const float *d, const float *a, const float *b, int n);
    float (*row_max)(const float *z, int n);                    /* n >= 1 */
    double (*exp_sum)(const float *z, float shift, int n);      /* sum exp(z - shift), in double */
    void (*exp_scale)(float *d, const float *z, float shift, float mul, int n);   /* d = exp(z - shift) mul */
    /* RoPE of one row's heads in place; buf: 2 hd floats of scratch (kernels-simd.h) */
    void (*rope_row)(float *v, int n_heads, int hd, const float *c, const float *s, float sgn, int interleaved,
                     float *buf);
    /* one chunk of AdamW (backend_cpu.c's arithmetic, constants precomputed there) */
    void (*adamw)(float *p, float *m, float *v, const float *g, int64_t n, float decay, float w1, float b2,
                  float w2, float step_size, float bc2_sqrt, float eps);
} hp_nn_simd_t;

const hp_nn_simd_t *hp_nn_simd(void);

#endif
