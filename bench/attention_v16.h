/* The attention kernel as it was before the tiled-GEMM rewrite (commit b26ea8d,
 * src/nn/attention.c), kept only so that bench/attention.c can time old against new in the
 * same run. Not part of the library; not tested beyond that comparison. */
#ifndef HP_BENCH_ATTENTION_V16_H
#define HP_BENCH_ATTENTION_V16_H
#include <math.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/nn.h"
#include "nn/nn-math.h"

enum { V16_ATT_BC = 64, V16_ATT_BR = 64 };   /* keys per tile, query rows per block */

typedef float v16f __attribute__((vector_size(64), aligned(4)));   /* unaligned access allowed */

/* s[0..64) = sum_d a[d] * kt[d][0..64): one score row against a (hd, 64) transposed tile. */
static inline void v16_row_dot_tile(float *s, const float *a, const float *kt, int hd) {
    v16f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (int d = 0; d < hd; d++) {
        const v16f *r = (const v16f *)(kt + (size_t)d * V16_ATT_BC);
        const float ad = a[d];
        s0 += ad * r[0];
        s1 += ad * r[1];
        s2 += ad * r[2];
        s3 += ad * r[3];
    }
    v16f *o = (v16f *)s;
    o[0] = s0; o[1] = s1; o[2] = s2; o[3] = s3;
}

/* Two score rows at once against two tiles (backward: q.k and dO.v). */
static inline void v16_row_dot_tile2(float *s, float *t, const float *a, const float *b, const float *kt,
                                 const float *vt, int hd) {
    v16f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, t0 = {0}, t1 = {0}, t2 = {0}, t3 = {0};
    for (int d = 0; d < hd; d++) {
        const v16f *r = (const v16f *)(kt + (size_t)d * V16_ATT_BC), *u = (const v16f *)(vt + (size_t)d * V16_ATT_BC);
        const float ad = a[d], bd = b[d];
        s0 += ad * r[0]; s1 += ad * r[1]; s2 += ad * r[2]; s3 += ad * r[3];
        t0 += bd * u[0]; t1 += bd * u[1]; t2 += bd * u[2]; t3 += bd * u[3];
    }
    v16f *o = (v16f *)s, *p = (v16f *)t;
    o[0] = s0; o[1] = s1; o[2] = s2; o[3] = s3;
    p[0] = t0; p[1] = t1; p[2] = t2; p[3] = t3;
}

/* acc[0..hd) = acc * c + sum_{j<n} w[j*ws] * rows[j*ld + 0..hd), accumulators in registers
 * (hd a multiple of 16), summed in j order. */
static inline __attribute__((always_inline)) void v16_rows_axpy(float *acc, float c, const float *w, int ws,
                                                            const float *rows, size_t ld, int n, int hd) {
    for (int c0 = 0; c0 < hd; c0 += 64) {
        const int nv = hd - c0 >= 64 ? 4 : (hd - c0) / 16;
        v16f *A = (v16f *)(acc + c0);
        const float *R = rows + c0;
        if (nv == 4) {
            v16f a0 = A[0] * c, a1 = A[1] * c, a2 = A[2] * c, a3 = A[3] * c;
            for (int j = 0; j < n; j++) {
                const v16f *r = (const v16f *)(R + (size_t)j * ld);
                const float wj = w[(size_t)j * ws];
                a0 += wj * r[0]; a1 += wj * r[1]; a2 += wj * r[2]; a3 += wj * r[3];
            }
            A[0] = a0; A[1] = a1; A[2] = a2; A[3] = a3;
        } else if (nv == 3) {
            v16f a0 = A[0] * c, a1 = A[1] * c, a2 = A[2] * c;
            for (int j = 0; j < n; j++) {
                const v16f *r = (const v16f *)(R + (size_t)j * ld);
                const float wj = w[(size_t)j * ws];
                a0 += wj * r[0]; a1 += wj * r[1]; a2 += wj * r[2];
            }
            A[0] = a0; A[1] = a1; A[2] = a2;
        } else if (nv == 2) {
            // two interleaved partial sums per vector: breaks the FMA latency chain
            v16f a0 = A[0] * c, a1 = A[1] * c, b0 = {0}, b1 = {0};
            int j = 0;
            for (; j + 1 < n; j += 2) {
                const v16f *r = (const v16f *)(R + (size_t)j * ld), *t = (const v16f *)(R + (size_t)(j + 1) * ld);
                const float wj = w[(size_t)j * ws], wk = w[(size_t)(j + 1) * ws];
                a0 += wj * r[0]; a1 += wj * r[1];
                b0 += wk * t[0]; b1 += wk * t[1];
            }
            if (j < n) {
                const v16f *r = (const v16f *)(R + (size_t)j * ld);
                const float wj = w[(size_t)j * ws];
                a0 += wj * r[0]; a1 += wj * r[1];
            }
            A[0] = a0 + b0; A[1] = a1 + b1;
        } else {
            // hd 16: four interleaved partial sums (j mod 4), combined in a fixed order
            v16f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            int j = 0;
            for (; j + 3 < n; j += 4) {
                a0 += w[(size_t)j * ws] * *(const v16f *)(R + (size_t)j * ld);
                a1 += w[(size_t)(j + 1) * ws] * *(const v16f *)(R + (size_t)(j + 1) * ld);
                a2 += w[(size_t)(j + 2) * ws] * *(const v16f *)(R + (size_t)(j + 2) * ld);
                a3 += w[(size_t)(j + 3) * ws] * *(const v16f *)(R + (size_t)(j + 3) * ld);
            }
            for (; j < n; j++) a0 += w[(size_t)j * ws] * *(const v16f *)(R + (size_t)j * ld);
            A[0] = A[0] * c + ((a0 + a1) + (a2 + a3));
        }
    }
}

/* Four rows at once (register blocking: each loaded tile vector feeds four rows).
 * S[r][0..64) = sum_d a[r*lda + d] * kt[d][0..64), r < 4. */
static inline __attribute__((always_inline)) void v16_rows4_dot_tile(float *S, const float *a, size_t lda,
                                                                 const float *kt, int hd) {
    v16f s[4][4] = {{{0}}};
    for (int d = 0; d < hd; d++) {
        const v16f *r = (const v16f *)(kt + (size_t)d * V16_ATT_BC);
        const v16f k0 = r[0], k1 = r[1], k2 = r[2], k3 = r[3];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const float ad = a[(size_t)i * lda + d];
            s[i][0] += ad * k0; s[i][1] += ad * k1; s[i][2] += ad * k2; s[i][3] += ad * k3;
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        v16f *o = (v16f *)(S + (size_t)i * V16_ATT_BC);
        o[0] = s[i][0]; o[1] = s[i][1]; o[2] = s[i][2]; o[3] = s[i][3];
    }
}

/* For r < 4: acc[r*lda + 0..hd) = acc * c[r] + sum_{j<n} P[r*ps + j*is] * rows[j*ld + 0..hd)
 * (c NULL: no scaling), hd a multiple of 16, j summed in order. */
#define V16_ROWS4_AXPY_NV(NV)                                                                   \
    static inline __attribute__((always_inline)) void v16_rows4_axpy_##NV(                        \
        float *acc, size_t lda, const float *c, const float *P, size_t ps, size_t is,           \
        const float *rows, size_t ld, int n) {                                                 \
        v16f a[4][NV];                                                                          \
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {                                  \
            const float cr = c ? c[r] : 1.0f;                                                  \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                               \
                a[r][v] = ((const v16f *)(acc + (size_t)r * lda))[v] * cr;                      \
        }                                                                                      \
        for (int j = 0; j < n; j++) {                                                          \
            const v16f *x = (const v16f *)(rows + (size_t)j * ld);                               \
            v16f xv[NV];                                                                        \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) xv[v] = x[v];                 \
            _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {                              \
                const float w = P[(size_t)r * ps + (size_t)j * is];                            \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) a[r][v] += w * xv[v];     \
            }                                                                                  \
        }                                                                                      \
        _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++)                                    \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)                               \
                ((v16f *)(acc + (size_t)r * lda))[v] = a[r][v];                                 \
    }
V16_ROWS4_AXPY_NV(1)
V16_ROWS4_AXPY_NV(2)
V16_ROWS4_AXPY_NV(4)
#undef V16_ROWS4_AXPY_NV

static inline void v16_rows4_axpy(float *acc, size_t lda, const float *c, const float *P, size_t ps, size_t is,
                              const float *rows, size_t ld, int n, int hd) {
    int c0 = 0;
    for (; c0 + 64 <= hd; c0 += 64) v16_rows4_axpy_4(acc + c0, lda, c, P, ps, is, rows + c0, ld, n);
    if (c0 + 32 <= hd) { v16_rows4_axpy_2(acc + c0, lda, c, P, ps, is, rows + c0, ld, n); c0 += 32; }
    if (c0 + 16 <= hd) v16_rows4_axpy_1(acc + c0, lda, c, P, ps, is, rows + c0, ld, n);
}

/* Plain-loop versions for head_dim not a multiple of 16. */
static void v16_row_dot_tile_plain(float *s, const float *a, const float *kt, int hd) {
    for (int j = 0; j < V16_ATT_BC; j++) s[j] = 0.0f;
    for (int d = 0; d < hd; d++) {
        const float ad = a[d];
        const float *r = kt + (size_t)d * V16_ATT_BC;
#pragma omp simd
        for (int j = 0; j < V16_ATT_BC; j++) s[j] += ad * r[j];
    }
}
static void v16_rows_axpy_plain(float *acc, float c, const float *w, int ws, const float *rows, size_t ld, int n, int hd) {
    for (int d = 0; d < hd; d++) acc[d] *= c;
    for (int j = 0; j < n; j++) {
        const float wj = w[(size_t)j * ws];
        const float *r = rows + (size_t)j * ld;
        for (int d = 0; d < hd; d++) acc[d] += wj * r[d];
    }
}

/* (hd, 64) transposed copy of rows j0..j0+nc of a strided (T, ld) matrix; columns >= nc are
 * zero so full-width dot products stay finite. */
static void v16_load_tile_t(float *dst, const float *src, size_t ld, int nc, int hd) {
    if (nc == V16_ATT_BC) {
        // blocks of 16 keys: 16 rows are read once, then written as contiguous 16-float runs
        for (int j0 = 0; j0 < V16_ATT_BC; j0 += 16)
            for (int d = 0; d < hd; d++) {
                float *o = dst + (size_t)d * V16_ATT_BC + j0;
                const float *r = src + (size_t)j0 * ld + d;
#pragma GCC unroll 16
                for (int j = 0; j < 16; j++) o[j] = r[(size_t)j * ld];
            }
        return;
    }
    for (int j = 0; j < nc; j++) {
        const float *r = src + (size_t)j * ld;
        for (int d = 0; d < hd; d++) dst[(size_t)d * V16_ATT_BC + j] = r[d];
    }
    for (int d = 0; d < hd; d++) memset(dst + (size_t)d * V16_ATT_BC + nc, 0, sizeof(float) * (size_t)(V16_ATT_BC - nc));
}

static void v16_attention_forward(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                          const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd) {
    const float scale = 1.0f / sqrtf((float)hd);
    const int rep = Hq / Hkv;
    const int fast = hd % 16 == 0;
    // parallel over (b, query head): each task writes its own out rows and lse row
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            const int g = h / rep;
            float kt[hd * V16_ATT_BC];   // (hd, BC) key tile, transposed
            float qblk[V16_ATT_BR * hd]; // (BR, hd) scaled query rows of the block
            float s[V16_ATT_BC];
            float m_run[V16_ATT_BR], l_run[V16_ATT_BR], o_run[V16_ATT_BR * hd];
            for (int i0 = 0; i0 < T; i0 += V16_ATT_BR) {
                const int nr = i0 + V16_ATT_BR < T ? V16_ATT_BR : T - i0;
                for (int i = 0; i < nr; i++) { m_run[i] = -INFINITY; l_run[i] = 0.0f; }
                memset(o_run, 0, sizeof(float) * (size_t)nr * hd);
                for (int i = 0; i < nr; i++) {
                    const float *qi = q + ((size_t)b * T + i0 + i) * ldq + (size_t)h * hd;
                    for (int d = 0; d < hd; d++) qblk[(size_t)i * hd + d] = qi[d] * scale;
                }
                for (int j0 = 0; j0 < i0 + nr; j0 += V16_ATT_BC) {
                    const int nc = j0 + V16_ATT_BC < T ? V16_ATT_BC : T - j0;
                    v16_load_tile_t(kt, k + ((size_t)b * T + j0) * ldk + (size_t)g * hd, (size_t)ldk, nc, hd);
                    const float *vtile = v + ((size_t)b * T + j0) * ldv + (size_t)g * hd;
                    int i = 0;
                    if (fast && j0 <= i0) {
                        // groups of four rows; every row of the block sees key j0 (j0 <= i0)
                        float S4[4 * V16_ATT_BC], corr4[4];
                        for (; i + 4 <= nr; i += 4) {
                            v16_rows4_dot_tile(S4, qblk + (size_t)i * hd, (size_t)hd, kt, hd);
                            int nmax = 0;
                            for (int r = 0; r < 4; r++) {
                                int jmax = i0 + i + r - j0 + 1;
                                if (jmax > nc) jmax = nc;
                                if (jmax > nmax) nmax = jmax;
                                float *sr = S4 + (size_t)r * V16_ATT_BC;
                                float mx = m_run[i + r];
#pragma omp simd reduction(max : mx)
                                for (int j = 0; j < jmax; j++) mx = sr[j] > mx ? sr[j] : mx;
                                corr4[r] = hp_nn_expf(m_run[i + r] - mx);
                                float rs = 0.0f;
#pragma omp simd reduction(+ : rs)
                                for (int j = 0; j < V16_ATT_BC; j++) {
                                    float e = j < jmax ? hp_nn_expf(sr[j] - mx) : 0.0f;   // causal mask
                                    sr[j] = e;
                                    rs += e;
                                }
                                l_run[i + r] = l_run[i + r] * corr4[r] + rs;
                                m_run[i + r] = mx;
                            }
                            v16_rows4_axpy(o_run + (size_t)i * hd, (size_t)hd, corr4, S4, V16_ATT_BC, 1, vtile,
                                       (size_t)ldv, nmax, hd);
                        }
                    }
                    for (; i < nr; i++) {
                        const int row = i0 + i;
                        int jmax = row - j0 + 1;   // causal: keys j0 .. row
                        if (jmax <= 0) continue;
                        if (jmax > nc) jmax = nc;
                        const float *qs = qblk + (size_t)i * hd;
                        if (fast) v16_row_dot_tile(s, qs, kt, hd);
                        else v16_row_dot_tile_plain(s, qs, kt, hd);
                        float mx = m_run[i];
#pragma omp simd reduction(max : mx)
                        for (int j = 0; j < jmax; j++) mx = s[j] > mx ? s[j] : mx;
                        const float corr = hp_nn_expf(m_run[i] - mx);   // 0 on the first tile
                        float rs = 0.0f;
#pragma omp simd reduction(+ : rs)
                        for (int j = 0; j < jmax; j++) { s[j] = hp_nn_expf(s[j] - mx); rs += s[j]; }
                        l_run[i] = l_run[i] * corr + rs;
                        m_run[i] = mx;
                        if (fast) v16_rows_axpy(o_run + (size_t)i * hd, corr, s, 1, vtile, (size_t)ldv, jmax, hd);
                        else v16_rows_axpy_plain(o_run + (size_t)i * hd, corr, s, 1, vtile, (size_t)ldv, jmax, hd);
                    }
                }
                for (int i = 0; i < nr; i++) {
                    const int row = i0 + i;
                    float *oi = out + ((size_t)b * T + row) * Hq * hd + (size_t)h * hd;
                    const float inv = 1.0f / l_run[i];
                    for (int d = 0; d < hd; d++) oi[d] = o_run[(size_t)i * hd + d] * inv;
                    lse[((size_t)b * Hq + h) * T + row] = m_run[i] + logf(l_run[i]);
                }
            }
        }
    }
}

static void v16_attention_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                           const float *dout, const float *out,
                           const float *lse, const float *q, int ldq, const float *k, int ldk,
                           const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd) {
    const float scale = 1.0f / sqrtf((float)hd);
    const int rep = Hq / Hkv;
    const int fast = hd % 16 == 0;
    // parallel over (b, kv head): the task owns dK, dV of head g and dQ of heads g*rep.. so
    // every output element is written by exactly one task, in a fixed order
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int g = 0; g < Hkv; g++) {
            float kt[hd * V16_ATT_BC], vt[hd * V16_ATT_BC];   // (hd, BC) transposed tiles
            float dk_acc[V16_ATT_BC * hd], dv_acc[V16_ATT_BC * hd];
            float pb[V16_ATT_BR * V16_ATT_BC], dsb[V16_ATT_BR * V16_ATT_BC];   // (BR, BC) P and dS of a row block
            for (int t = 0; t < T; t++)
                for (int h = g * rep; h < (g + 1) * rep; h++)
                    memset(dq + ((size_t)b * T + t) * lddq + (size_t)h * hd, 0, sizeof(float) * (size_t)hd);
            for (int j0 = 0; j0 < T; j0 += V16_ATT_BC) {
                const int nc = j0 + V16_ATT_BC < T ? V16_ATT_BC : T - j0;
                const float *ktile = k + ((size_t)b * T + j0) * ldk + (size_t)g * hd;
                v16_load_tile_t(kt, ktile, (size_t)ldk, nc, hd);
                v16_load_tile_t(vt, v + ((size_t)b * T + j0) * ldv + (size_t)g * hd, (size_t)ldv, nc, hd);
                memset(dk_acc, 0, sizeof(float) * (size_t)nc * hd);
                memset(dv_acc, 0, sizeof(float) * (size_t)nc * hd);
                for (int h = g * rep; h < (g + 1) * rep; h++) {
                    // query rows from j0 on (earlier rows see none of these keys), in blocks
                    for (int i0 = j0; i0 < T; i0 += V16_ATT_BR) {
                        const int nr = i0 + V16_ATT_BR < T ? V16_ATT_BR : T - i0;
                        const float *qb = q + ((size_t)b * T + i0) * ldq + (size_t)h * hd;
                        const float *dob = dout + ((size_t)b * T + i0) * Hq * hd + (size_t)h * hd;
                        int i = 0;
                        if (fast)   // scores and dO.V of four rows at a time
                            for (; i + 4 <= nr; i += 4) {
                                v16_rows4_dot_tile(pb + (size_t)i * V16_ATT_BC, qb + (size_t)i * ldq, (size_t)ldq, kt, hd);
                                v16_rows4_dot_tile(dsb + (size_t)i * V16_ATT_BC, dob + (size_t)i * Hq * hd, (size_t)Hq * hd, vt, hd);
                            }
                        for (; i < nr; i++) {
                            if (fast) {
                                v16_row_dot_tile2(pb + (size_t)i * V16_ATT_BC, dsb + (size_t)i * V16_ATT_BC, qb + (size_t)i * ldq,
                                              dob + (size_t)i * Hq * hd, kt, vt, hd);
                            } else {
                                v16_row_dot_tile_plain(pb + (size_t)i * V16_ATT_BC, qb + (size_t)i * ldq, kt, hd);
                                v16_row_dot_tile_plain(dsb + (size_t)i * V16_ATT_BC, dob + (size_t)i * Hq * hd, vt, hd);
                            }
                        }
                        for (i = 0; i < nr; i++) {
                            const int row = i0 + i;
                            int jmax = row - j0 + 1;
                            if (jmax > nc) jmax = nc;
                            const size_t r = (size_t)b * T + row;
                            const float *doi = dout + r * Hq * hd + (size_t)h * hd;
                            const float *oi = out + r * Hq * hd + (size_t)h * hd;
                            const float li = lse[((size_t)b * Hq + h) * T + row];
                            float di = 0.0f;   // rowsum(dO * O)
#pragma omp simd reduction(+ : di)
                            for (int d = 0; d < hd; d++) di += doi[d] * oi[d];
                            float *p = pb + (size_t)i * V16_ATT_BC, *ds = dsb + (size_t)i * V16_ATT_BC;
#pragma omp simd
                            for (int j = 0; j < V16_ATT_BC; j++) {
                                float pj = j < jmax ? hp_nn_expf(p[j] * scale - li) : 0.0f;   // causal mask
                                p[j] = pj;
                                ds[j] = pj * (ds[j] - di) * scale;
                            }
                        }
                        // dQ rows += dS K (keys in order; dS is 0 past each row's last key)
                        i = 0;
                        if (fast)
                            for (; i + 4 <= nr; i += 4) {
                                int n4 = i0 + i + 3 - j0 + 1;
                                if (n4 > nc) n4 = nc;
                                v16_rows4_axpy(dq + ((size_t)b * T + i0 + i) * lddq + (size_t)h * hd, (size_t)lddq, NULL,
                                           dsb + (size_t)i * V16_ATT_BC, V16_ATT_BC, 1, ktile, (size_t)ldk, n4, hd);
                            }
                        for (; i < nr; i++) {
                            int jmax = i0 + i - j0 + 1;
                            if (jmax > nc) jmax = nc;
                            float *dqi = dq + ((size_t)b * T + i0 + i) * lddq + (size_t)h * hd;
                            if (fast) v16_rows_axpy(dqi, 1.0f, dsb + (size_t)i * V16_ATT_BC, 1, ktile, (size_t)ldk, jmax, hd);
                            else v16_rows_axpy_plain(dqi, 1.0f, dsb + (size_t)i * V16_ATT_BC, 1, ktile, (size_t)ldk, jmax, hd);
                        }
                        // dV[j] += sum_i P[i][j] dO[i], dK[j] += sum_i dS[i][j] Q[i] (rows in order)
                        int j = 0;
                        if (fast)
                            for (; j + 4 <= nc; j += 4) {
                                // rows before the first that sees key j0 + j have P = dS = 0 for all
                                // four keys; skipping them drops only exact zeros
                                int r0 = j0 + j - i0;
                                if (r0 < 0) r0 = 0;
                                if (r0 >= nr) continue;
                                v16_rows4_axpy(dv_acc + (size_t)j * hd, (size_t)hd, NULL, pb + (size_t)r0 * V16_ATT_BC + j, 1,
                                           V16_ATT_BC, dob + (size_t)r0 * Hq * hd, (size_t)Hq * hd, nr - r0, hd);
                                v16_rows4_axpy(dk_acc + (size_t)j * hd, (size_t)hd, NULL, dsb + (size_t)r0 * V16_ATT_BC + j, 1,
                                           V16_ATT_BC, qb + (size_t)r0 * ldq, (size_t)ldq, nr - r0, hd);
                            }
                        for (; j < nc; j++) {
                            if (fast) {
                                v16_rows_axpy(dv_acc + (size_t)j * hd, 1.0f, pb + j, V16_ATT_BC, dob, (size_t)Hq * hd, nr, hd);
                                v16_rows_axpy(dk_acc + (size_t)j * hd, 1.0f, dsb + j, V16_ATT_BC, qb, (size_t)ldq, nr, hd);
                            } else {
                                v16_rows_axpy_plain(dv_acc + (size_t)j * hd, 1.0f, pb + j, V16_ATT_BC, dob, (size_t)Hq * hd, nr, hd);
                                v16_rows_axpy_plain(dk_acc + (size_t)j * hd, 1.0f, dsb + j, V16_ATT_BC, qb, (size_t)ldq, nr, hd);
                            }
                        }
                    }
                }
                for (int j = 0; j < nc; j++) {
                    memcpy(dk + ((size_t)b * T + j0 + j) * lddk + (size_t)g * hd, dk_acc + (size_t)j * hd,
                           sizeof(float) * (size_t)hd);
                    memcpy(dv + ((size_t)b * T + j0 + j) * lddv + (size_t)g * hd, dv_acc + (size_t)j * hd,
                           sizeof(float) * (size_t)hd);
                }
            }
        }
    }
}

#endif
