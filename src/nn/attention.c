/* Causal attention (MHA / GQA) as a tiled online-softmax kernel (FlashAttention-2 style):
 * forward keeps only the output and the per-row log-sum-exp; backward recomputes the
 * probabilities tile by tile. No (T, T) matrix is ever stored. Scratch is per task on the
 * stack (sized by head_dim), so nothing is allocated. Reference twin: kernels_ref.c. */
#include <math.h>
#include <string.h>
#include "hyperparallel/nn.h"

enum { HP_ATT_BC = 64 };   /* keys per tile */

void hp_attention_forward(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                          const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd) {
    const float scale = 1.0f / sqrtf((float)hd);
    const int rep = Hq / Hkv;
    // parallel over (b, query head): each task writes its own out rows and lse row
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            const int g = h / rep;
            float kt[hd * HP_ATT_BC];   // (hd, BC) key tile, transposed
            float acc[hd];              // (hd) output accumulator of one row
            float qs[hd];
            float s[HP_ATT_BC];
            // rows are processed in blocks sharing one key-tile transpose
            enum { BR = 64 };
            float m_run[BR], l_run[BR], o_run[BR * hd];
            for (int i0 = 0; i0 < T; i0 += BR) {
                const int nr = i0 + BR < T ? BR : T - i0;
                for (int i = 0; i < nr; i++) { m_run[i] = -INFINITY; l_run[i] = 0.0f; }
                memset(o_run, 0, sizeof(float) * (size_t)nr * hd);
                for (int j0 = 0; j0 < i0 + nr; j0 += HP_ATT_BC) {
                    const int nc = j0 + HP_ATT_BC < T ? HP_ATT_BC : T - j0;
                    for (int j = 0; j < nc; j++) {
                        const float *kj = k + ((size_t)b * T + j0 + j) * ldk + (size_t)g * hd;
                        for (int d = 0; d < hd; d++) kt[d * HP_ATT_BC + j] = kj[d];
                    }
                    for (int i = 0; i < nr; i++) {
                        const int row = i0 + i;
                        int jmax = row - j0 + 1;
                        if (jmax <= 0) continue;
                        if (jmax > nc) jmax = nc;
                        const float *qi = q + ((size_t)b * T + row) * ldq + (size_t)h * hd;
                        for (int d = 0; d < hd; d++) qs[d] = qi[d] * scale;
                        for (int j = 0; j < jmax; j++) s[j] = 0.0f;
                        for (int d = 0; d < hd; d++) {
                            const float qd = qs[d];
                            const float *kr = kt + d * HP_ATT_BC;
#pragma omp simd
                            for (int j = 0; j < jmax; j++) s[j] += qd * kr[j];
                        }
                        float mx = m_run[i];
                        for (int j = 0; j < jmax; j++) mx = s[j] > mx ? s[j] : mx;
                        const float corr = expf(m_run[i] - mx);   // 0 on the first tile
                        float rs = 0.0f;
                        for (int j = 0; j < jmax; j++) { s[j] = expf(s[j] - mx); rs += s[j]; }
                        l_run[i] = l_run[i] * corr + rs;
                        m_run[i] = mx;
                        float *o = o_run + (size_t)i * hd;
#pragma omp simd
                        for (int d = 0; d < hd; d++) acc[d] = o[d] * corr;
                        for (int j = 0; j < jmax; j++) {
                            const float p = s[j];
                            const float *vj = v + ((size_t)b * T + j0 + j) * ldv + (size_t)g * hd;
#pragma omp simd
                            for (int d = 0; d < hd; d++) acc[d] += p * vj[d];
                        }
                        memcpy(o, acc, sizeof(float) * (size_t)hd);
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

void hp_attention_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                           const float *dout, const float *out,
                           const float *lse, const float *q, int ldq, const float *k, int ldk,
                           const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd) {
    const float scale = 1.0f / sqrtf((float)hd);
    const int rep = Hq / Hkv;
    // parallel over (b, kv head): the task owns dK, dV of head g and dQ of heads g*rep.. so
    // every output element is written by exactly one task, in a fixed order
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int g = 0; g < Hkv; g++) {
            float kt[hd * HP_ATT_BC], vt[hd * HP_ATT_BC];   // (hd, BC) transposed tiles
            float dk_acc[HP_ATT_BC * hd], dv_acc[HP_ATT_BC * hd];
            float p[HP_ATT_BC], ds[HP_ATT_BC], dqa[hd];
            for (int t = 0; t < T; t++)
                for (int h = g * rep; h < (g + 1) * rep; h++)
                    memset(dq + ((size_t)b * T + t) * lddq + (size_t)h * hd, 0, sizeof(float) * (size_t)hd);
            for (int j0 = 0; j0 < T; j0 += HP_ATT_BC) {
                const int nc = j0 + HP_ATT_BC < T ? HP_ATT_BC : T - j0;
                for (int j = 0; j < nc; j++) {
                    const float *kj = k + ((size_t)b * T + j0 + j) * ldk + (size_t)g * hd;
                    const float *vj = v + ((size_t)b * T + j0 + j) * ldv + (size_t)g * hd;
                    for (int d = 0; d < hd; d++) {
                        kt[d * HP_ATT_BC + j] = kj[d];
                        vt[d * HP_ATT_BC + j] = vj[d];
                    }
                }
                memset(dk_acc, 0, sizeof(float) * (size_t)nc * hd);
                memset(dv_acc, 0, sizeof(float) * (size_t)nc * hd);
                for (int h = g * rep; h < (g + 1) * rep; h++) {
                    for (int row = j0; row < T; row++) {
                        int jmax = row - j0 + 1;
                        if (jmax > nc) jmax = nc;
                        const size_t r = (size_t)b * T + row;
                        const float *qi = q + r * ldq + (size_t)h * hd;
                        const float *doi = dout + r * Hq * hd + (size_t)h * hd;
                        const float *oi = out + r * Hq * hd + (size_t)h * hd;
                        const float li = lse[((size_t)b * Hq + h) * T + row];
                        float di = 0.0f;   // rowsum(dO * O)
#pragma omp simd reduction(+ : di)
                        for (int d = 0; d < hd; d++) di += doi[d] * oi[d];
                        for (int j = 0; j < jmax; j++) { p[j] = 0.0f; ds[j] = 0.0f; }
                        for (int d = 0; d < hd; d++) {
                            const float qd = qi[d], gd = doi[d];
                            const float *kr = kt + d * HP_ATT_BC, *vr = vt + d * HP_ATT_BC;
#pragma omp simd
                            for (int j = 0; j < jmax; j++) { p[j] += qd * kr[j]; ds[j] += gd * vr[j]; }
                        }
                        for (int j = 0; j < jmax; j++) {
                            p[j] = expf(p[j] * scale - li);
                            ds[j] = p[j] * (ds[j] - di) * scale;
                        }
                        for (int d = 0; d < hd; d++) dqa[d] = 0.0f;
                        for (int j = 0; j < jmax; j++) {
                            const float pj = p[j], dsj = ds[j];
                            const float *kj = k + ((size_t)b * T + j0 + j) * ldk + (size_t)g * hd;
                            float *dka = dk_acc + (size_t)j * hd, *dva = dv_acc + (size_t)j * hd;
#pragma omp simd
                            for (int d = 0; d < hd; d++) {
                                dva[d] += pj * doi[d];
                                dka[d] += dsj * qi[d];
                                dqa[d] += dsj * kj[d];
                            }
                        }
                        float *dqi = dq + r * lddq + (size_t)h * hd;
#pragma omp simd
                        for (int d = 0; d < hd; d++) dqi[d] += dqa[d];
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
