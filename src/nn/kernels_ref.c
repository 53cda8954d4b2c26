/* Plain reference kernels: the obvious loops, serial (reference code, speed irrelevant),
 * double accumulation. tests/test_nn_kernels.c compares every optimised kernel with these. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/nn.h"

void hp_ref_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                           int N, int IC, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int i = 0; i < IC; i++) s += (double)inp[(size_t)n * IC + i] * weight[(size_t)o * IC + i];
            out[(size_t)n * OC + o] = (float)s;
        }
}

void hp_ref_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, int N, int IC, int OC) {
    // dinp (=), dweight (+=), dbias (+=)
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double s = 0.0;
            for (int o = 0; o < OC; o++) s += (double)dout[(size_t)n * OC + o] * weight[(size_t)o * IC + i];
            dinp[(size_t)n * IC + i] = (float)s;
        }
    for (int o = 0; o < OC; o++) {
        for (int i = 0; i < IC; i++) {
            double s = 0.0;
            for (int n = 0; n < N; n++) s += (double)dout[(size_t)n * OC + o] * inp[(size_t)n * IC + i];
            dweight[(size_t)o * IC + i] += (float)s;
        }
        if (dbias) {
            double s = 0.0;
            for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o];
            dbias[o] += (float)s;
        }
    }
}

void hp_ref_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight,
                            int N, int C, float eps) {
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        double r = 1.0 / sqrt(ss / C + eps);
        rstd[n] = (float)r;
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (float)(x[c] * r * weight[c]);
    }
}

void hp_ref_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        double r = rstd[n], dot = 0.0;
        for (int c = 0; c < C; c++) dot += (double)dy[c] * weight[c] * x[c];
        for (int c = 0; c < C; c++) {
            dinp[(size_t)n * C + c] = (float)(r * weight[c] * dy[c] - r * r * r * dot / C * x[c]);
            dweight[c] += (float)(dy[c] * x[c] * r);
        }
    }
}

void hp_ref_rope_apply(float *x, int ld, int B, int T, int n_heads, int head_dim,
                       const float *cos_t, const float *sin_t, hp_rope_style_t style, int inverse) {
    int half = head_dim / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < n_heads; h++) {
                float *v = x + ((size_t)b * T + t) * ld + (size_t)h * head_dim;
                for (int i = 0; i < half; i++) {
                    double c = cos_t[(size_t)t * half + i];
                    double s = sin_t[(size_t)t * half + i] * (inverse ? -1.0 : 1.0);
                    int i0 = style == HP_ROPE_INTERLEAVED ? 2 * i : i;
                    int i1 = style == HP_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
                    double a = v[i0], bb = v[i1];
                    v[i0] = (float)(a * c - bb * s);
                    v[i1] = (float)(bb * c + a * s);
                }
            }
}

/* One causal score row of the reference: p[j] = exp(q_i . k_j scale - max) for keys j <= i
 * (k: key 0 of the row's sequence and kv head, rows ldk apart), in double; *mx the max, the
 * sum returned. Shared by the reference forward and backward only. */
static double ref_softmax_row(double *p, double *mx, const float *qi, const float *k, int ldk, int i, int hd,
                              double scale) {
    *mx = -INFINITY;
    for (int j = 0; j <= i; j++) {
        const float *kj = k + (size_t)j * ldk;
        double s = 0.0;
        for (int d = 0; d < hd; d++) s += (double)qi[d] * kj[d];
        p[j] = s * scale;
        if (p[j] > *mx) *mx = p[j];
    }
    double sum = 0.0;
    for (int j = 0; j <= i; j++) {
        p[j] = exp(p[j] - *mx);
        sum += p[j];
    }
    return sum;
}

/* Full softmax per (b, h, query row); the (T) score row is built in a heap buffer (reference
 * code only, never in the step loop). */
void hp_ref_attention_forward(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                              const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd) {
    double *p = malloc(sizeof(double) * (size_t)T);
    HP_ASSERT(p != NULL);
    double scale = 1.0 / sqrt((double)hd);
    int rep = Hq / Hkv;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            int g = h / rep;
            for (int i = 0; i < T; i++) {
                const float *qi = q + ((size_t)b * T + i) * ldq + (size_t)h * hd;
                double mx;
                const float *kg = k + (size_t)b * T * ldk + (size_t)g * hd;   // key 0 of the kv head
                const double sum = ref_softmax_row(p, &mx, qi, kg, ldk, i, hd, scale);
                lse[((size_t)b * Hq + h) * T + i] = (float)(mx + log(sum));
                float *oi = out + ((size_t)b * T + i) * Hq * hd + (size_t)h * hd;
                for (int d = 0; d < hd; d++) {
                    double acc = 0.0;
                    for (int j = 0; j <= i; j++)
                        acc += p[j] / sum * v[((size_t)b * T + j) * ldv + (size_t)g * hd + d];
                    oi[d] = (float)acc;
                }
            }
        }
    free(p);
}

void hp_ref_attention_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                               const float *dout,
                               const float *q, int ldq, const float *k, int ldk,
                               const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd) {
    double *p = malloc(sizeof(double) * (size_t)T);
    double *dp = malloc(sizeof(double) * (size_t)T);
    HP_ASSERT(p != NULL && dp != NULL);
    double scale = 1.0 / sqrt((double)hd);
    int rep = Hq / Hkv;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            for (int d = 0; d < Hq * hd; d++) dq[((size_t)b * T + t) * lddq + d] = 0.0f;
            for (int d = 0; d < Hkv * hd; d++) {
                dk[((size_t)b * T + t) * lddk + d] = 0.0f;
                dv[((size_t)b * T + t) * lddv + d] = 0.0f;
            }
        }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            int g = h / rep;
            for (int i = 0; i < T; i++) {
                const float *qi = q + ((size_t)b * T + i) * ldq + (size_t)h * hd;
                const float *doi = dout + ((size_t)b * T + i) * Hq * hd + (size_t)h * hd;
                double mx;
                const float *kg = k + (size_t)b * T * ldk + (size_t)g * hd;   // key 0 of the kv head
                const double sum = ref_softmax_row(p, &mx, qi, kg, ldk, i, hd, scale);
                double dsum = 0.0;   // sum_j p_j dp_j
                for (int j = 0; j <= i; j++) {
                    p[j] /= sum;
                    const float *vj = v + ((size_t)b * T + j) * ldv + (size_t)g * hd;
                    double s = 0.0;
                    for (int d = 0; d < hd; d++) s += (double)doi[d] * vj[d];
                    dp[j] = s;
                    dsum += p[j] * s;
                }
                float *dqi = dq + ((size_t)b * T + i) * lddq + (size_t)h * hd;
                for (int j = 0; j <= i; j++) {
                    double ds = p[j] * (dp[j] - dsum) * scale;
                    const float *kj = k + ((size_t)b * T + j) * ldk + (size_t)g * hd;
                    float *dkj = dk + ((size_t)b * T + j) * lddk + (size_t)g * hd;
                    float *dvj = dv + ((size_t)b * T + j) * lddv + (size_t)g * hd;
                    for (int d = 0; d < hd; d++) {
                        dqi[d] += (float)(ds * kj[d]);
                        dkj[d] += (float)(ds * qi[d]);
                        dvj[d] += (float)(p[j] * doi[d]);
                    }
                }
            }
        }
    free(p);
    free(dp);
}

/* The twin of hp_attention_forward_qk_v / _backward_qk_v (q|k heads hd wide, v and out heads
 * hv wide, scale 1/sqrt(hd)): the loops above with the v side at hv. */
void hp_ref_attention_qk_v_forward(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                                   const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd, int hv) {
    double *p = malloc(sizeof(double) * (size_t)T);
    HP_ASSERT(p != NULL);
    const double scale = 1.0 / sqrt((double)hd);
    const int rep = Hq / Hkv;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            const int g = h / rep;
            for (int i = 0; i < T; i++) {
                const float *qi = q + ((size_t)b * T + i) * ldq + (size_t)h * hd;
                double mx;
                const float *kg = k + (size_t)b * T * ldk + (size_t)g * hd;
                const double sum = ref_softmax_row(p, &mx, qi, kg, ldk, i, hd, scale);
                lse[((size_t)b * Hq + h) * T + i] = (float)(mx + log(sum));
                float *oi = out + ((size_t)b * T + i) * Hq * hv + (size_t)h * hv;
                for (int d = 0; d < hv; d++) {
                    double acc = 0.0;
                    for (int j = 0; j <= i; j++) acc += p[j] / sum * v[((size_t)b * T + j) * ldv + (size_t)g * hv + d];
                    oi[d] = (float)acc;
                }
            }
        }
    free(p);
}

void hp_ref_attention_qk_v_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv, const float *dout,
                                    const float *q, int ldq, const float *k, int ldk, const float *v, int ldv, int B,
                                    int T, int Hq, int Hkv, int hd, int hv) {
    double *p = malloc(sizeof(double) * (size_t)T), *dp = malloc(sizeof(double) * (size_t)T);
    HP_ASSERT(p != NULL && dp != NULL);
    const double scale = 1.0 / sqrt((double)hd);
    const int rep = Hq / Hkv;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const size_t r = (size_t)b * T + t;
            for (int d = 0; d < Hq * hd; d++) dq[r * lddq + d] = 0.0f;
            for (int d = 0; d < Hkv * hd; d++) dk[r * lddk + d] = 0.0f;
            for (int d = 0; d < Hkv * hv; d++) dv[r * lddv + d] = 0.0f;
        }
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            const int g = h / rep;
            for (int i = 0; i < T; i++) {
                const float *qi = q + ((size_t)b * T + i) * ldq + (size_t)h * hd;
                const float *doi = dout + ((size_t)b * T + i) * Hq * hv + (size_t)h * hv;
                double mx;
                const float *kg = k + (size_t)b * T * ldk + (size_t)g * hd;
                const double sum = ref_softmax_row(p, &mx, qi, kg, ldk, i, hd, scale);
                double dsum = 0.0;   // sum_j p_j dp_j
                for (int j = 0; j <= i; j++) {
                    p[j] /= sum;
                    const float *vj = v + ((size_t)b * T + j) * ldv + (size_t)g * hv;
                    double s = 0.0;
                    for (int d = 0; d < hv; d++) s += (double)doi[d] * vj[d];
                    dp[j] = s;
                    dsum += p[j] * s;
                }
                float *dqi = dq + ((size_t)b * T + i) * lddq + (size_t)h * hd;
                for (int j = 0; j <= i; j++) {
                    const double ds = p[j] * (dp[j] - dsum) * scale;
                    const float *kj = k + ((size_t)b * T + j) * ldk + (size_t)g * hd;
                    float *dkj = dk + ((size_t)b * T + j) * lddk + (size_t)g * hd;
                    float *dvj = dv + ((size_t)b * T + j) * lddv + (size_t)g * hv;
                    for (int d = 0; d < hd; d++) {
                        dqi[d] += (float)(ds * kj[d]);
                        dkj[d] += (float)(ds * qi[d]);
                    }
                    for (int d = 0; d < hv; d++) dvj[d] += (float)(p[j] * doi[d]);
                }
            }
        }
    free(p);
    free(dp);
}

void hp_ref_swiglu_forward(float *out, const float *h13, int N, int H) {
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            double a = h13[(size_t)n * 2 * H + j], b = h13[(size_t)n * 2 * H + H + j];
            out[(size_t)n * H + j] = (float)(a / (1.0 + exp(-a)) * b);
        }
}

void hp_ref_swiglu_backward(float *dh13, const float *dout, const float *h13, int N, int H) {
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            double a = h13[(size_t)n * 2 * H + j], b = h13[(size_t)n * 2 * H + H + j];
            double d = dout[(size_t)n * H + j];
            double sg = 1.0 / (1.0 + exp(-a));
            dh13[(size_t)n * 2 * H + j] = (float)(d * b * (sg + a * sg * (1.0 - sg)));
            dh13[(size_t)n * 2 * H + H + j] = (float)(d * a * sg);
        }
}

void hp_ref_adamw_update(float *p, float *m, float *v, const float *g, int64_t n, double lr, double b1, double b2,
                         double eps, double wd, int64_t step) {
    const double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    for (int64_t i = 0; i < n; i++) {
        const double gi = g[i], mi = m[i] + (1.0 - b1) * (gi - m[i]), vi = b2 * v[i] + (1.0 - b2) * gi * gi;
        p[i] = (float)(p[i] * (1.0 - lr * wd) - lr / bc1 * mi / (sqrt(vi) / sqrt(bc2) + eps));
        m[i] = (float)mi;
        v[i] = (float)vi;
    }
}

void hp_ref_embedding_backward(float *dweight, const float *dout, const int32_t *tokens, int N, int C, int V) {
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) dweight[(size_t)tokens[n] * C + c] += dout[(size_t)n * C + c];
}

double hp_ref_cross_entropy_forward(double *losses, const float *logits, const int32_t *targets,
                                    int N, int V, int64_t *n_valid) {
    double total = 0.0;
    int64_t cnt = 0;
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        double mx = -INFINITY, s = 0.0;
        for (int v = 0; v < V; v++) if (z[v] > mx) mx = z[v];
        for (int v = 0; v < V; v++) s += exp(z[v] - mx);
        if (targets[n] == HP_IGNORE_INDEX) { losses[n] = 0.0; continue; }
        double l = mx + log(s) - z[targets[n]];
        losses[n] = l;
        total += l;
        cnt++;
    }
    if (n_valid) *n_valid = cnt;
    return total;
}

void hp_ref_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets,
                                   float dloss, int N, int V) {
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        if (targets[n] == HP_IGNORE_INDEX) { memset(d, 0, sizeof(float) * (size_t)V); continue; }
        double mx = -INFINITY, s = 0.0;
        for (int v = 0; v < V; v++) if (z[v] > mx) mx = z[v];
        for (int v = 0; v < V; v++) s += exp(z[v] - mx);
        for (int v = 0; v < V; v++) d[v] = (float)(exp(z[v] - mx) / s * dloss);
        d[targets[n]] -= dloss;
    }
}
