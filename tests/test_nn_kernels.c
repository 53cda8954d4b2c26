// Optimised nn kernels against their plain reference twins (kernels_ref.c), on odd sizes
// (tails of tiles and SIMD lanes), MHA and GQA, both RoPE styles, ignored targets; every kernel
// on each ISA path this CPU has (avx512, avx2, portable), forced one at a time (hp_nn_set_isa:
// the explicit-vector SwiGLU, cross-entropy, RoPE and AdamW row kernels of kernels-simd.h,
// attention's tiles), with sizes that leave 16-, 8- and 4-lane tails.
// Tolerances: f32 kernels vs double references, |a - b| <= 1e-5 + 1e-4 |b| (GEMM-backed
// kernels: 2e-5 + 2e-4 |b|, sums over up to 300 terms); the kernel table's general GEMM per
// element within gamma_{K+2} of its magnitudes, and bitwise cblas_sgemm.
// hp-test: ranks 1 timeout 120 coretype 1
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include <omp.h>
#include "hyperparallel/backend.h"
#include "hyperparallel/nn.h"
#include "hyperparallel/nn_loss.h"
#include "hp_test.h"
#include "hp_test_rand.h"

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) { return hp_test_frand(&rng_state); }   // uniform in [-1, 1)
static float *rnd(size_t n, float scale) { return hp_test_rnd(&rng_state, n, scale); }
static float *zeros(size_t n) { return calloc(n, sizeof(float)); }

/* max over i of |a-b| / (atol + rtol |b|); <= 1 means close; a NaN anywhere gives +inf (a
 * NaN ratio must not be replaced by a later element's) */
static double close_ratio(const float *a, const float *b, size_t n, double rtol, double atol) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double r = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (r != r) return INFINITY;
        if (r > worst) worst = r;
    }
    return worst;
}
#define CHECK_ARR(a, b, n, rtol, atol, what)                                                \
    do {                                                                                    \
        double r_ = close_ratio((a), (b), (n), (rtol), (atol));                             \
        HP_CHECK(r_ <= 1.0, "%s: error ratio %.3g (rtol %g atol %g)", what, r_, rtol, atol); \
    } while (0)

static void test_linear(int N, int IC, int OC, int with_bias) {
    float *x = rnd((size_t)N * IC, 1), *w = rnd((size_t)OC * IC, 0.5f), *b = with_bias ? rnd(OC, 1) : NULL;
    float *y = zeros((size_t)N * OC), *yr = zeros((size_t)N * OC);
    hp_linear_forward(y, x, w, b, N, IC, OC);
    hp_ref_linear_forward(yr, x, w, b, N, IC, OC);
    CHECK_ARR(y, yr, (size_t)N * OC, 2e-4, 2e-5, "linear forward");
    // accumulate variant: y2 = 1 + x W^T
    float *y2 = malloc(sizeof(float) * (size_t)N * OC);
    for (size_t i = 0; i < (size_t)N * OC; i++) y2[i] = 1.0f, yr[i] += 1.0f;
    hp_linear_forward_acc(y2, x, w, b, N, IC, OC);
    CHECK_ARR(y2, yr, (size_t)N * OC, 2e-4, 2e-5, "linear forward_acc");
    float *dy = rnd((size_t)N * OC, 1);
    float *dx = zeros((size_t)N * IC), *dxr = zeros((size_t)N * IC);
    float *dw = rnd((size_t)OC * IC, 1), *dwr = malloc(sizeof(float) * (size_t)OC * IC);
    memcpy(dwr, dw, sizeof(float) * (size_t)OC * IC);   // both accumulate onto the same start
    float *db = with_bias ? zeros(OC) : NULL, *dbr = with_bias ? zeros(OC) : NULL;
    hp_linear_backward_input(dx, dy, w, N, IC, OC, 0);
    hp_linear_backward_weight(dw, db, dy, x, N, IC, OC);
    hp_ref_linear_backward(dxr, dwr, dbr, dy, x, w, N, IC, OC);
    CHECK_ARR(dx, dxr, (size_t)N * IC, 2e-4, 2e-5, "linear backward_input");
    CHECK_ARR(dw, dwr, (size_t)OC * IC, 2e-4, 2e-5, "linear backward_weight");
    if (with_bias) CHECK_ARR(db, dbr, OC, 2e-4, 2e-5, "linear backward bias");
    // accumulate flag of backward_input
    hp_linear_backward_input(dx, dy, w, N, IC, OC, 1);
    for (size_t i = 0; i < (size_t)N * IC; i++) dxr[i] *= 2.0f;
    CHECK_ARR(dx, dxr, (size_t)N * IC, 2e-4, 2e-5, "linear backward_input accumulate");
    free(x); free(w); free(b); free(y); free(yr); free(y2); free(dy); free(dx); free(dxr); free(dw);
    free(dwr); free(db); free(dbr);
}

static void test_rmsnorm(int N, int C) {
    float *x = rnd((size_t)N * C, 2), *w = rnd(C, 1), *y = zeros((size_t)N * C), *yr = zeros((size_t)N * C);
    float *r = zeros(N), *rr = zeros(N);
    hp_rmsnorm_forward(y, r, x, w, N, C, 1e-5f);
    hp_ref_rmsnorm_forward(yr, rr, x, w, N, C, 1e-5f);
    CHECK_ARR(y, yr, (size_t)N * C, 1e-4, 1e-5, "rmsnorm forward");
    CHECK_ARR(r, rr, N, 1e-4, 1e-5, "rmsnorm rstd");
    float *dy = rnd((size_t)N * C, 1), *dx = zeros((size_t)N * C), *dxr = zeros((size_t)N * C);
    float *dw = zeros(C), *dwr = zeros(C);
    hp_rmsnorm_backward_input(dx, dy, x, w, r, N, C, 0);
    hp_rmsnorm_backward_weight(dw, dy, x, r, N, C);
    hp_ref_rmsnorm_backward(dxr, dwr, dy, x, w, rr, N, C);
    CHECK_ARR(dx, dxr, (size_t)N * C, 1e-4, 1e-5, "rmsnorm backward_input");
    CHECK_ARR(dw, dwr, C, 2e-4, 2e-5, "rmsnorm backward_weight");
    // head-wise variant on a strided layout equals the plain kernel row by row
    int H = 3, ld = H * C + 5;
    float *xs = rnd((size_t)N * ld, 2), *ys = zeros((size_t)N * ld), *rs = zeros((size_t)N * H);
    hp_rmsnorm_heads_forward(ys, ld, rs, xs, ld, w, N, H, C, 1e-6f);
    float *row = zeros(C), *rrow = zeros(1);
    double worst = 0;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            hp_ref_rmsnorm_forward(row, rrow, xs + (size_t)n * ld + h * C, w, 1, C, 1e-6f);
            double rr2 = close_ratio(ys + (size_t)n * ld + h * C, row, C, 1e-4, 1e-5);
            if (rr2 > worst) worst = rr2;
        }
    HP_CHECK(worst <= 1.0, "rmsnorm heads forward ratio %g", worst);
    // head-wise backward (strided in and out) against the reference row by row
    float *dys = rnd((size_t)N * ld, 1), *dxs = zeros((size_t)N * ld), *dws = zeros(C), *dwr2 = zeros(C);
    float *drow = zeros(C);
    hp_rmsnorm_heads_backward_input(dxs, ld, dys, ld, xs, ld, w, rs, N, H, C);
    hp_rmsnorm_heads_backward_weight(dws, dys, ld, xs, ld, rs, N, H, C);
    worst = 0;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < H; h++) {
            hp_ref_rmsnorm_backward(drow, dwr2, dys + (size_t)n * ld + h * C, xs + (size_t)n * ld + h * C, w,
                                    rs + (size_t)n * H + h, 1, C);
            double rr2 = close_ratio(dxs + (size_t)n * ld + h * C, drow, C, 1e-4, 1e-5);
            if (rr2 > worst) worst = rr2;
        }
    HP_CHECK(worst <= 1.0, "rmsnorm heads backward_input ratio %g", worst);
    CHECK_ARR(dws, dwr2, C, 2e-4, 2e-5, "rmsnorm heads backward_weight");
    free(dys); free(dxs); free(dws); free(dwr2); free(drow);
    free(x); free(w); free(y); free(yr); free(r); free(rr); free(dy); free(dx); free(dxr); free(dw);
    free(dwr); free(xs); free(ys); free(rs); free(row); free(rrow);
}

static void test_rope(int B, int T, int H, int hd, hp_rope_style_t style, int scaled) {
    hp_rope_scaling_t sc = {scaled, 8.0f, 1.0f, 4.0f, 64, 0, 0.0f, 0.0f};
    float *c = zeros((size_t)T * hd / 2), *s = zeros((size_t)T * hd / 2);
    hp_rope_table(c, s, T, hd, 500000.0f, &sc);
    // table: angle of pair i at t is t * freq_i; for pair 0 freq is 1 (no scaling of high freq)
    HP_CHECK_CLOSE(c[(size_t)1 * hd / 2], cos(1.0), 1e-6, 1e-6);
    int ld = H * hd + 3;
    float *x = rnd((size_t)B * T * ld, 1), *xr = malloc(sizeof(float) * (size_t)B * T * ld);
    memcpy(xr, x, sizeof(float) * (size_t)B * T * ld);
    float *x0 = malloc(sizeof(float) * (size_t)B * T * ld);
    memcpy(x0, x, sizeof(float) * (size_t)B * T * ld);
    hp_rope_apply(x, ld, B, T, H, hd, c, s, style, 0);
    hp_ref_rope_apply(xr, ld, B, T, H, hd, c, s, style, 0);
    CHECK_ARR(x, xr, (size_t)B * T * ld, 1e-5, 1e-6, "rope forward");
    hp_rope_apply(x, ld, B, T, H, hd, c, s, style, 1);   // inverse returns the input
    CHECK_ARR(x, x0, (size_t)B * T * ld, 1e-5, 1e-6, "rope inverse");
    free(c); free(s); free(x); free(xr); free(x0);
}

static void test_attention(int B, int T, int Hq, int Hkv, int hd) {
    int ldq = Hq * hd + 2 * Hkv * hd, ldk = ldq, ldv = ldq;   // packed qkv rows, as the model
    size_t N = (size_t)B * T;
    float *qkv = rnd(N * ldq, 1.5f);
    const float *q = qkv, *k = qkv + Hq * hd, *v = qkv + (Hq + Hkv) * hd;
    float *o = zeros(N * Hq * hd), *or_ = zeros(N * Hq * hd), *lse = zeros(N * Hq), *lser = zeros(N * Hq);
    hp_attention_forward(o, lse, q, ldq, k, ldk, v, ldv, B, T, Hq, Hkv, hd);
    hp_ref_attention_forward(or_, lser, q, ldq, k, ldk, v, ldv, B, T, Hq, Hkv, hd);
    char what[96];
    snprintf(what, sizeof what, "attention forward B%d T%d Hq%d Hkv%d hd%d", B, T, Hq, Hkv, hd);
    CHECK_ARR(o, or_, N * Hq * hd, 1e-4, 1e-5, what);
    CHECK_ARR(lse, lser, N * Hq, 1e-4, 1e-5, what);
    float *dout = rnd(N * Hq * hd, 1);
    // gradients at their own strides (different from q/k/v's), garbage-filled: kernels write (=)
    int ldg = ldq + 7;
    float *dqkv = rnd(N * ldg, 1), *dqkvr = rnd(N * ldg, 1);
    memcpy(dqkvr, dqkv, sizeof(float) * N * ldg);
    hp_attention_backward(dqkv, ldg, dqkv + Hq * hd, ldg, dqkv + (Hq + Hkv) * hd, ldg, dout, o, lse, q, ldq,
                          k, ldk, v, ldv, B, T, Hq, Hkv, hd);
    hp_ref_attention_backward(dqkvr, ldg, dqkvr + Hq * hd, ldg, dqkvr + (Hq + Hkv) * hd, ldg, dout, q, ldq,
                              k, ldk, v, ldv, B, T, Hq, Hkv, hd);
    snprintf(what, sizeof what, "attention backward B%d T%d Hq%d Hkv%d hd%d", B, T, Hq, Hkv, hd);
    CHECK_ARR(dqkv, dqkvr, N * ldg, 2e-4, 2e-5, what);
    free(qkv); free(o); free(or_); free(lse); free(lser); free(dout); free(dqkv); free(dqkvr);
}

static void test_swiglu(int N, int H) {
    float *h = rnd((size_t)N * 2 * H, 4), *y = zeros((size_t)N * H), *yr = zeros((size_t)N * H);
    hp_swiglu_forward(y, h, N, H);
    hp_ref_swiglu_forward(yr, h, N, H);
    CHECK_ARR(y, yr, (size_t)N * H, 1e-5, 1e-6, "swiglu forward");
    float *dy = rnd((size_t)N * H, 1), *dh = zeros((size_t)N * 2 * H), *dhr = zeros((size_t)N * 2 * H);
    hp_swiglu_backward(dh, dy, h, N, H);
    hp_ref_swiglu_backward(dhr, dy, h, N, H);
    CHECK_ARR(dh, dhr, (size_t)N * 2 * H, 1e-5, 1e-6, "swiglu backward");
    free(h); free(y); free(yr); free(dy); free(dh); free(dhr);
}

static void test_embedding(int N, int C, int V) {
    int32_t *tok = malloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) tok[n] = (int32_t)((frand() + 1.0f) * 0.5f * (V - 1)) % 5;   // many repeats
    tok[N - 1] = V - 1;
    float *w = rnd((size_t)V * C, 1), *y = zeros((size_t)N * C);
    hp_embedding_forward(y, tok, w, N, C);
    int ok = 1;
    for (int n = 0; n < N; n++) ok &= memcmp(y + (size_t)n * C, w + (size_t)tok[n] * C, sizeof(float) * C) == 0;
    HP_CHECK(ok, "embedding forward rows differ from weight rows");
    float *dy = rnd((size_t)N * C, 1), *dw = zeros((size_t)V * C), *dwr = zeros((size_t)V * C);
    hp_embedding_backward(dw, dy, tok, N, C, V);
    hp_ref_embedding_backward(dwr, dy, tok, N, C, V);
    // same per-row order of additions (token order): bitwise equal
    HP_CHECK(memcmp(dw, dwr, sizeof(float) * (size_t)V * C) == 0, "embedding backward not bitwise equal");
    free(tok); free(w); free(y); free(dy); free(dw); free(dwr);
}

static void test_cross_entropy(int N, int V) {
    float *z = rnd((size_t)N * V, 6);
    int32_t *t = malloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) t[n] = (n % 4 == 3) ? HP_IGNORE_INDEX : (int32_t)(((frand() + 1) * 0.5f) * (V - 1));
    double *l = calloc(N, sizeof(double)), *lr = calloc(N, sizeof(double));
    float *lse = zeros(N);
    int64_t nv = 0, nvr = 0;
    double s = hp_cross_entropy_forward(l, lse, z, t, N, V, &nv);
    double sr = hp_ref_cross_entropy_forward(lr, z, t, N, V, &nvr);
    HP_CHECK(nv == nvr && nv == N - N / 4, "valid count %lld vs %lld", (long long)nv, (long long)nvr);
    HP_CHECK_CLOSE(s, sr, 1e-5, 1e-5);
    double wl = 0;
    for (int n = 0; n < N; n++) wl = fmax(wl, fabs(l[n] - lr[n]) / (1e-6 + 1e-6 * fabs(lr[n])));
    HP_CHECK(wl <= 1.0, "cross-entropy per-row loss ratio %g", wl);
    float *d = zeros((size_t)N * V), *dr = zeros((size_t)N * V);
    hp_cross_entropy_backward(d, z, lse, t, 0.25f, N, V);
    hp_ref_cross_entropy_backward(dr, z, t, 0.25f, N, V);
    CHECK_ARR(d, dr, (size_t)N * V, 1e-4, 1e-7, "cross-entropy backward");
    int zero_ok = 1;
    for (int n = 3; n < N; n += 4)
        for (int v = 0; v < V; v++) zero_ok &= d[(size_t)n * V + v] == 0.0f;
    HP_CHECK(zero_ok, "ignored rows must have zero gradient");
    // the shard kernel (loss_parallel's backward) over all columns is the same loop: bitwise equal
    float *ds = zeros((size_t)N * V);
    hp_cross_entropy_backward_shard(ds, z, lse, t, 0.25f, N, V, 0);
    HP_CHECK(memcmp(ds, d, sizeof(float) * (size_t)N * V) == 0, "cross-entropy shard kernel at offset 0 differs");
    free(ds);
    free(z); free(t); free(l); free(lr); free(lse); free(d); free(dr);
}

/* AdamW: the CPU backend's update (f32, vectorised) against the double twin. Tolerance: each of
 * m', v' is one or two f32 operations from its inputs (<= 2 u relative, u = 6e-8, plus u |g|
 * absolute where g - m cancels); p' adds the update lr/bc1 m'/(sqrt v'/sqrt bc2 + eps), whose
 * four f32 operations give <= 5 u of |update| <= lr/bc1 * 1/sqrt(1-b2)...: rtol 1e-6 (16 u),
 * atol 1e-9 (lr 1e-3, |g| <= 1e-2: u |g| = 6e-10). Odd n: vector tails; n > one chunk: the
 * parallel chunks. */
static void test_adamw(int64_t n, int64_t step) {
    float *p = rnd(n, 0.05f), *m = rnd(n, 1e-3f), *v = rnd(n, 1e-5f), *g = rnd(n, 1e-2f);
    for (int64_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    if (n > 3) g[1] = 0.0f, m[1] = 0.0f, v[1] = 0.0f;   // all zero: the update is 0 / eps
    float *pr = malloc(sizeof(float) * n), *mr = malloc(sizeof(float) * n), *vr = malloc(sizeof(float) * n);
    memcpy(pr, p, sizeof(float) * n);
    memcpy(mr, m, sizeof(float) * n);
    memcpy(vr, v, sizeof(float) * n);
    const hp_backend_t *be = hp_backend_cpu();
    be->adamw_update(be->ctx, p, m, v, g, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
    hp_ref_adamw_update(pr, mr, vr, g, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, step);
    CHECK_ARR(p, pr, (size_t)n, 1e-6, 1e-9, "adamw p");
    CHECK_ARR(m, mr, (size_t)n, 1e-6, 1e-9, "adamw m");
    CHECK_ARR(v, vr, (size_t)n, 1e-6, 1e-9, "adamw v");
    // the harness sees an error of 10x the tolerance in one element
    p[n / 2] = (float)(pr[n / 2] + 10.0 * (1e-9 + 1e-6 * fabs((double)pr[n / 2])));
    HP_CHECK(!(close_ratio(p, pr, (size_t)n, 1e-6, 1e-9) <= 1.0), "adamw: an injected error passed");
    free(p); free(m); free(v); free(g); free(pr); free(mr); free(vr);
}

/* RMSNorm dW sums each channel's rows in order whatever the block width (64 channels, or 16
 * when 64-wide blocks would leave threads idle): the same bits at 1 thread (wide) and at more
 * threads than wide blocks (narrow). */
static void test_rmsnorm_dw_blocks(int N, int C) {
    float *x = rnd((size_t)N * C, 1), *dy = rnd((size_t)N * C, 1), *rs = rnd(N, 1);
    float *a = zeros(C), *b = zeros(C);
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    hp_rmsnorm_backward_weight(a, dy, x, rs, N, C);
    omp_set_num_threads((C + 63) / 64 + 1);
    hp_rmsnorm_backward_weight(b, dy, x, rs, N, C);
    omp_set_num_threads(nt);
    HP_CHECK(memcmp(a, b, sizeof(float) * (size_t)C) == 0, "rmsnorm dW differs between 64- and 16-channel blocks");
    free(x); free(dy); free(rs); free(a); free(b);
}

/* The kernel table's general GEMM (backend.h gemm) against a double loop, every transpose pair,
 * row strides wider than the rows, alpha and beta (0: c's old values unused; 1.3). Bound per
 * element: a sum of K products plus the beta term in f32 is within gamma_{K+2} (Higham 3.5:
 * (K+2) u / (1 - (K+2) u), u = 2^-24) of |alpha| sum_k |a_ik b_kj| + |beta c_ij|. And the CPU
 * slot is exactly one cblas_sgemm with the same arguments (bitwise). Negative: an element moved
 * by 10x its bound fails. */
static void test_gemm(int M, int N, int K, int ta, int tb, float alpha, float beta) {
    const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
    float *a = rnd((size_t)(ta ? K : M) * lda, 1), *b = rnd((size_t)(tb ? N : K) * ldb, 1);
    float *c = rnd((size_t)M * ldc, 1), *c0 = malloc(sizeof(float) * (size_t)M * ldc);
    float *cb = malloc(sizeof(float) * (size_t)M * ldc);
    memcpy(c0, c, sizeof(float) * (size_t)M * ldc);
    memcpy(cb, c, sizeof(float) * (size_t)M * ldc);
    const hp_backend_t *be = hp_backend_cpu();
    be->gemm(be->ctx, c, ldc, a, lda, b, ldb, M, N, K, ta, tb, alpha, beta);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, a, lda,
                b, ldb, beta, cb, ldc);
    HP_CHECK(memcmp(c, cb, sizeof(float) * (size_t)M * ldc) == 0,
             "gemm slot %dx%dx%d (%d, %d) is not cblas_sgemm's bits", M, N, K, ta, tb);
    const double u = ldexp(1.0, -24), gam = (K + 2) * u / (1 - (K + 2) * u);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                const double x = ta ? a[(size_t)k * lda + i] : a[(size_t)i * lda + k];
                const double y = tb ? b[(size_t)j * ldb + k] : b[(size_t)k * ldb + j];
                ref += x * y;
                mag += fabs(x * y);
            }
            const double c_old = beta != 0.0f ? c0[(size_t)i * ldc + j] : 0.0;
            ref = alpha * ref + beta * c_old;
            const double bound = gam * (fabs(alpha) * mag + fabs(beta * c_old)) + 1e-30;
            double r = fabs(c[(size_t)i * ldc + j] - ref) / bound;
            if (i == M / 2 && j == N / 2 && r <= 1.0) {   // negative: 10x the bound must fail
                const double moved = fabs(c[(size_t)i * ldc + j] + 10 * bound - ref) / bound;
                HP_CHECK(moved > 1.0, "gemm: an injected error of 10x the bound passed");
            }
            worst = fmax(worst, r);
        }
    HP_CHECK(worst <= 1.0, "gemm %dx%dx%d trans (%d, %d) alpha %g beta %g: worst %.3g of the bound", M, N, K, ta, tb,
             alpha, beta, worst);
    free(a); free(b); free(c); free(c0); free(cb);
}

/* Negative test of the shared harness at the swiglu / cross-entropy tolerances: an error of
 * 10x the tolerance in one element, and a NaN, fail. */
static void test_negative(void) {
    float *a = rnd(100, 1), *b = malloc(sizeof(float) * 100);
    memcpy(b, a, sizeof(float) * 100);
    HP_CHECK(close_ratio(a, b, 100, 1e-5, 1e-6) == 0.0, "identical arrays give ratio 0");
    a[50] += (float)(10.0 * (1e-6 + 1e-5 * fabs((double)b[50])));
    HP_CHECK(!(close_ratio(a, b, 100, 1e-5, 1e-6) <= 1.0), "an injected error of 10x the tolerance passed");
    a[50] = NAN;
    HP_CHECK(!(close_ratio(a, b, 100, 1e-5, 1e-6) <= 1.0), "a NaN passed");
    free(a); free(b);
}

/* The flash kernels give bitwise identical results on repeated runs (fixed reduction order). */
static void test_attention_determinism(void) {
    int B = 2, T = 100, Hq = 4, Hkv = 2, hd = 16, ld = (Hq + 2 * Hkv) * hd;
    size_t N = (size_t)B * T;
    float *qkv = rnd(N * ld, 1), *dout = rnd(N * Hq * hd, 1);
    float *o1 = zeros(N * Hq * hd), *o2 = zeros(N * Hq * hd), *l1 = zeros(N * Hq), *l2 = zeros(N * Hq);
    float *g1 = zeros(N * ld), *g2 = zeros(N * ld);
    for (int rep = 0; rep < 2; rep++) {
        float *o = rep ? o2 : o1, *l = rep ? l2 : l1, *g = rep ? g2 : g1;
        hp_attention_forward(o, l, qkv, ld, qkv + Hq * hd, ld, qkv + (Hq + Hkv) * hd, ld, B, T, Hq, Hkv, hd);
        hp_attention_backward(g, ld, g + Hq * hd, ld, g + (Hq + Hkv) * hd, ld, dout, o, l, qkv, ld, qkv + Hq * hd, ld,
                              qkv + (Hq + Hkv) * hd, ld, B, T, Hq, Hkv, hd);
    }
    HP_CHECK(memcmp(o1, o2, sizeof(float) * N * Hq * hd) == 0 && memcmp(g1, g2, sizeof(float) * N * ld) == 0,
             "attention not bitwise reproducible");
    free(qkv); free(dout); free(o1); free(o2); free(l1); free(l2); free(g1); free(g2);
}

int main(void) {
    // every ISA path this CPU has, one at a time
    hp_nn_isa_t paths[3] = {HP_NN_ISA_PORTABLE, HP_NN_ISA_AVX2, HP_NN_ISA_AVX512};
    const int npaths = hp_nn_set_isa(HP_NN_ISA_AVX2) != HP_OK ? 1 : hp_nn_set_isa(HP_NN_ISA_AVX512) != HP_OK ? 2 : 3;
    test_negative();
    for (int t = 0; t < 4; t++) {   // the table's GEMM (BLAS: no ISA path of ours)
        test_gemm(37, 29, 41, t & 1, t >> 1, 1.0f, 0.0f);
        test_gemm(16, 40, 9, t & 1, t >> 1, 0.7f, 1.3f);
    }
    for (int pi = 0; pi < npaths; pi++) {
        HP_CHECK(hp_nn_set_isa(paths[pi]) == HP_OK, "set %s", hp_nn_isa_name(paths[pi]));
        printf("path %s\n", hp_nn_isa_name(paths[pi]));
        test_linear(37, 29, 41, 0);
        test_linear(64, 96, 80, 1);
        test_linear(1, 7, 3, 1);
        test_rmsnorm(33, 96);
        test_rmsnorm(5, 17);
        test_rope(2, 19, 3, 16, HP_ROPE_INTERLEAVED, 1);
        test_rope(2, 19, 3, 16, HP_ROPE_HALF, 0);
        test_rope(1, 7, 2, 128, HP_ROPE_HALF, 0);
        test_attention(2, 17, 4, 4, 16);     // MHA, T below one tile
        test_attention(2, 130, 4, 2, 16);    // GQA, T spans three key tiles with a tail
        test_attention(1, 70, 6, 2, 8);      // GQA rep 3
        test_attention(1, 65, 2, 1, 128);    // qwen3-like head_dim
        test_attention(3, 1, 2, 1, 16);      // single token
        test_attention_determinism();
        test_swiglu(13, 37);
        test_embedding(50, 19, 11);
        test_cross_entropy(40, 301);
        test_cross_entropy(8, 2048);
        test_swiglu(4, 768);                 // whole vectors only
        test_cross_entropy(3, 7);            // vocab below one vector
        test_rope(2, 5, 3, 12, HP_ROPE_INTERLEAVED, 0);   // a vector tail of 4 (AVX2) / 12 (AVX-512) per head
        test_rope(2, 5, 3, 12, HP_ROPE_HALF, 0);          // half 6: a tail of 2 (portable) / 6 (AVX2, AVX-512)
        test_rope(2, 9, 2, 40, HP_ROPE_INTERLEAVED, 1);   // 40 = 2 x 16 + a tail of 8 (AVX-512)
        test_rope(2, 9, 2, 48, HP_ROPE_HALF, 0);          // half 24 = 16 + 8
        test_swiglu(5, 1000);                // 62 x 16 + 8
        test_cross_entropy(6, 1027);         // 64 x 16 + 3
        test_attention(2, 90, 4, 2, 32);     // two 16-lane vectors per head row (AVX-512)
        test_attention(1, 40, 3, 3, 24);     // head_dim 24 on an AVX-512 CPU: the AVX2 tiles
        test_rope(1, 3, 2, 128, HP_ROPE_INTERLEAVED, 1);
        test_adamw(37, 1);
        test_rmsnorm_dw_blocks(50, 200);     // three full 64-blocks and a tail
        test_adamw(3 * 16384 + 5, 7);        // several parallel chunks and a tail
    }
    HP_CHECK(hp_nn_set_isa(HP_NN_ISA_AUTO) == HP_OK, "restore");
    return hp_test_finish("test_nn_kernels");
}
