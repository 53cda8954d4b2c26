/* Block attention for context parallelism: a query block against a key/value block with an
 * explicit mask (causal diagonal, full, skip), its backward given the merged out and lse, the
 * log-sum-exp merge, and plain double references. Scores live in a (Tq, Tk) scratch per
 * thread; the products are BLAS sgemm calls (run single-threaded inside the head loop). These
 * are the CPU backend's kernels: the rest of the library calls them through the kernel table
 * (backend.h: attn_block_forward / _backward / _merge). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/attention_block.h"
#include "hyperparallel/status.h"
#include "nn/nn-blas.h"

size_t hp_attn_block_scratch_floats(int Tq, int Tk) {
    return (size_t)omp_get_max_threads() * 2 * (size_t)Tq * (size_t)Tk;
}

/* Row softmax of s (Tk) under the mask for query row i: p = exp(s - lse); returns lse. */
static float softmax_row(float *s, int i, int Tk, hp_attn_mask_t mask) {
    const int n = mask == HP_ATTN_MASK_CAUSAL ? i + 1 : Tk;
    float m = -INFINITY;
    for (int j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
    float sum = 0.0f;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j < n; j++) s[j] *= inv;
    for (int j = n; j < Tk; j++) s[j] = 0.0f;
    return m + logf(sum);
}

void hp_attn_block_forward(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *k,
                           int ldk, const float *v, int ldv, int Tq, int Tk, int Hq, int Hkv, int hd,
                           hp_attn_mask_t mask, float *scratch) {
    HP_ASSERT(mask != HP_ATTN_MASK_CAUSAL || Tq == Tk);
    if (mask == HP_ATTN_MASK_SKIP) {
        for (int t = 0; t < Tq; t++) memset(out + (size_t)t * ldo, 0, sizeof(float) * (size_t)Hq * hd);
        for (int h = 0; h < Hq; h++)
            for (int t = 0; t < Tq; t++) lse[(size_t)h * ldl + t] = -INFINITY;
        return;
    }
    const int g = Hq / Hkv;
    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(static)
    for (int h = 0; h < Hq; h++) {
        float *S = scratch + (size_t)omp_get_thread_num() * 2 * Tq * Tk;   // (Tq, Tk) scores, then P
        const float *Q = q + (size_t)h * hd, *K = k + (size_t)(h / g) * hd, *V = v + (size_t)(h / g) * hd;
        hp_cpu_sgemm(S, Tk, Q, ldq, K, ldk, Tq, Tk, hd, 0, 1, scale, 0.0f);
        for (int i = 0; i < Tq; i++) lse[(size_t)h * ldl + i] = softmax_row(S + (size_t)i * Tk, i, Tk, mask);
        hp_cpu_sgemm(out + (size_t)h * hd, ldo, S, Tk, V, ldv, Tq, hd, Tk, 0, 0, 1.0f, 0.0f);
    }
}

void hp_attn_block_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv, const float *dout,
                            int lddo, const float *out, int ldo, const float *lse, int ldl, const float *q, int ldq,
                            const float *k, int ldk, const float *v, int ldv, int Tq, int Tk, int Hq, int Hkv,
                            int hd, hp_attn_mask_t mask, float *scratch) {
    HP_ASSERT(mask != HP_ATTN_MASK_CAUSAL || Tq == Tk);
    if (mask == HP_ATTN_MASK_SKIP) return;
    const int g = Hq / Hkv;
    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(static)
    for (int kh = 0; kh < Hkv; kh++) {
        float *P = scratch + (size_t)omp_get_thread_num() * 2 * Tq * Tk, *dP = P + (size_t)Tq * Tk;
        const float *K = k + (size_t)kh * hd, *V = v + (size_t)kh * hd;
        float *dK = dk + (size_t)kh * hd, *dV = dv + (size_t)kh * hd;
        for (int h = kh * g; h < (kh + 1) * g; h++) {   // serial: the group's heads all add into dK, dV
            const float *Q = q + (size_t)h * hd, *dO = dout + (size_t)h * hd, *O = out + (size_t)h * hd;
            float *dQ = dq + (size_t)h * hd;
            hp_cpu_sgemm(P, Tk, Q, ldq, K, ldk, Tq, Tk, hd, 0, 1, scale, 0.0f);
            for (int i = 0; i < Tq; i++) {   // P = exp(S - lse) under the mask
                const int n = mask == HP_ATTN_MASK_CAUSAL ? i + 1 : Tk;
                const float l = lse[(size_t)h * ldl + i];
                float *p = P + (size_t)i * Tk;
                for (int j = 0; j < n; j++) p[j] = expf(p[j] - l);
                for (int j = n; j < Tk; j++) p[j] = 0.0f;
            }
            // dV += P^T dO; dP = dO V^T
            hp_cpu_sgemm(dV, lddv, P, Tk, dO, lddo, Tk, hd, Tq, 1, 0, 1.0f, 1.0f);
            hp_cpu_sgemm(dP, Tk, dO, lddo, V, ldv, Tq, Tk, hd, 0, 1, 1.0f, 0.0f);
            for (int i = 0; i < Tq; i++) {   // dS = P (dP - D), D = rowsum(dO * O) of the merged output
                const float *doi = dO + (size_t)i * lddo, *oi = O + (size_t)i * ldo;
                float D = 0.0f;
                for (int d = 0; d < hd; d++) D += doi[d] * oi[d];
                float *p = P + (size_t)i * Tk, *dp = dP + (size_t)i * Tk;
                for (int j = 0; j < Tk; j++) dp[j] = p[j] * (dp[j] - D);
            }
            // dQ += scale dS K; dK += scale dS^T Q
            hp_cpu_sgemm(dQ, lddq, dP, Tk, K, ldk, Tq, hd, Tk, 0, 0, scale, 1.0f);
            hp_cpu_sgemm(dK, lddk, dP, Tk, Q, ldq, Tk, hd, Tq, 1, 0, scale, 1.0f);
        }
    }
}

void hp_attn_block_merge(float *out, int ldo, float *lse, int ldl, const float *out_b, int ldb, const float *lse_b,
                         int ldlb, int T, int H, int hd) {
#pragma omp parallel for schedule(static)
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
            float *L = lse + (size_t)h * ldl + t;
            const float lb = lse_b[(size_t)h * ldlb + t];
            float *o = out + (size_t)t * ldo + (size_t)h * hd;
            const float *ob = out_b + (size_t)t * ldb + (size_t)h * hd;
            if (lb == -INFINITY) continue;   // the block saw no key
            if (*L == -INFINITY) {           // the accumulator saw none yet
                memcpy(o, ob, sizeof(float) * (size_t)hd);
                *L = lb;
                continue;
            }
            const float w = 1.0f / (1.0f + expf(*L - lb));   // sigmoid(lb - L)
            for (int d = 0; d < hd; d++) o[d] -= w * (o[d] - ob[d]);
            const float x = *L - lb;   // logsigmoid(x), stable on both sides
            const float ls = x < 0.0f ? x - log1pf(expf(x)) : -log1pf(expf(-x));
            *L -= ls;
        }
}

/* ---- references (double) --------------------------------------------------------------- */

void hp_ref_attn_block_forward(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *k,
                               int ldk, const float *v, int ldv, int Tq, int Tk, int Hq, int Hkv, int hd,
                               hp_attn_mask_t mask) {
    const int g = Hq / Hkv;
    const double scale = 1.0 / sqrt((double)hd);
    double *s = malloc(sizeof(double) * (size_t)Tk);
    HP_ASSERT(s != NULL);
    for (int h = 0; h < Hq; h++)
        for (int i = 0; i < Tq; i++) {
            const int n = mask == HP_ATTN_MASK_SKIP ? 0 : mask == HP_ATTN_MASK_CAUSAL ? i + 1 : Tk;
            const float *qi = q + (size_t)i * ldq + (size_t)h * hd;
            double m = -INFINITY, sum = 0.0;
            for (int j = 0; j < n; j++) {
                const float *kj = k + (size_t)j * ldk + (size_t)(h / g) * hd;
                double a = 0.0;
                for (int d = 0; d < hd; d++) a += (double)qi[d] * kj[d];
                s[j] = a * scale;
                m = s[j] > m ? s[j] : m;
            }
            for (int j = 0; j < n; j++) sum += exp(s[j] - m);
            float *oi = out + (size_t)i * ldo + (size_t)h * hd;
            for (int d = 0; d < hd; d++) {
                double a = 0.0;
                for (int j = 0; j < n; j++) a += exp(s[j] - m) / sum * v[(size_t)j * ldv + (size_t)(h / g) * hd + d];
                oi[d] = (float)a;
            }
            lse[(size_t)h * ldl + i] = n == 0 ? -INFINITY : (float)(m + log(sum));
        }
    free(s);
}

void hp_ref_attn_block_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv, const float *dout,
                                int lddo, const float *out, int ldo, const float *lse, int ldl, const float *q,
                                int ldq, const float *k, int ldk, const float *v, int ldv, int Tq, int Tk, int Hq,
                                int Hkv, int hd, hp_attn_mask_t mask) {
    if (mask == HP_ATTN_MASK_SKIP) return;
    const int g = Hq / Hkv;
    const double scale = 1.0 / sqrt((double)hd);
    for (int h = 0; h < Hq; h++) {
        const int kh = h / g;
        for (int i = 0; i < Tq; i++) {
            const int n = mask == HP_ATTN_MASK_CAUSAL ? i + 1 : Tk;
            const float *qi = q + (size_t)i * ldq + (size_t)h * hd, *doi = dout + (size_t)i * lddo + (size_t)h * hd;
            const float *oi = out + (size_t)i * ldo + (size_t)h * hd;
            double D = 0.0;
            for (int d = 0; d < hd; d++) D += (double)doi[d] * oi[d];
            for (int j = 0; j < n; j++) {
                const float *kj = k + (size_t)j * ldk + (size_t)kh * hd, *vj = v + (size_t)j * ldv + (size_t)kh * hd;
                double s = 0.0, dp = 0.0;
                for (int d = 0; d < hd; d++) {
                    s += (double)qi[d] * kj[d];
                    dp += (double)doi[d] * vj[d];
                }
                const double p = exp(s * scale - lse[(size_t)h * ldl + i]), ds = p * (dp - D);
                for (int d = 0; d < hd; d++) {
                    dq[(size_t)i * lddq + (size_t)h * hd + d] += (float)(scale * ds * kj[d]);
                    dk[(size_t)j * lddk + (size_t)kh * hd + d] += (float)(scale * ds * qi[d]);
                    dv[(size_t)j * lddv + (size_t)kh * hd + d] += (float)(p * doi[d]);
                }
            }
        }
    }
}
