/* The CPU backend of the kernel table (backend.h): thin adapters over the OpenBLAS + OpenMP
 * kernels of nn.h and attention_block.h, the general GEMM and OpenBLAS's thread count (through
 * nn-blas.h, the one door to BLAS) and the optimizer updates (owned here, so a GPU backend
 * replaces them all in one place). Host memory, 64-byte aligned. */
#include <math.h>
#include <string.h>
#include "hyperparallel/attention_block.h"
#include "hyperparallel/backend.h"
#include "hyperparallel/nn.h"
#include "hyperparallel/nn_loss.h"
#include "nn/nn-blas.h"
#include "nn/nn-simd.h"

static void *cpu_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    void *p = hp_aligned_alloc(bytes ? bytes : 64);
    if (p) memset(p, 0, bytes);
    return p;
}
static void cpu_free(void *ctx, void *p) { (void)ctx; hp_free_aligned(p); }
static void cpu_memset0(void *ctx, void *p, size_t bytes) { (void)ctx; if (bytes) memset(p, 0, bytes); }

static void cpu_copy_rows(void *ctx, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                          int64_t cols) {
    (void)ctx;
    if (ldd == cols && lds == cols) {
        memcpy(dst, src, sizeof(float) * (size_t)(rows * cols));
        return;
    }
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * ldd, src + r * lds, sizeof(float) * (size_t)cols);
}

static void cpu_convert(void *ctx, void *dst, hp_dtype_t dd, const void *src, hp_dtype_t sd, int64_t n) {
    (void)ctx;
    // the vector loops compute hp_convert's bits (tests/test_gemm_bf16.c); elementwise, so
    // chunks in parallel (bf16 compute converts whole activations) give the same bits
    if ((sd == HP_F32 && dd == HP_BF16) || (sd == HP_BF16 && dd == HP_F32)) {
        enum { CHUNK = 65536 };
        const int64_t nch = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nch > 1)
        for (int64_t c = 0; c < nch; c++) {
            const int64_t i0 = c * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
            if (sd == HP_F32) hp_convert_f32_to_bf16((hp_bf16_t *)dst + i0, (const float *)src + i0, len);
            else hp_convert_bf16_to_f32((float *)dst + i0, (const hp_bf16_t *)src + i0, len);
        }
    } else {
        hp_convert(dst, dd, src, sd, (size_t)n);
    }
}
static void cpu_add(void *ctx, float *y, const float *x, int64_t n) { (void)ctx; hp_add_inplace(y, x, n); }

static void cpu_linear_forward(void *ctx, float *out, const float *inp, const float *w, const float *b, int N,
                               int IC, int OC, int acc) {
    (void)ctx;
    if (acc) hp_linear_forward_acc(out, inp, w, b, N, IC, OC);
    else hp_linear_forward(out, inp, w, b, N, IC, OC);
}
static void cpu_linear_bi(void *ctx, float *dinp, const float *dout, const float *w, int N, int IC, int OC,
                          int acc) {
    (void)ctx;
    hp_linear_backward_input(dinp, dout, w, N, IC, OC, acc);
}
static void cpu_linear_bw(void *ctx, float *dw, float *db, const float *dout, const float *inp, int N, int IC,
                          int OC) {
    (void)ctx;
    hp_linear_backward_weight(dw, db, dout, inp, N, IC, OC);
}
static void cpu_rms_f(void *ctx, float *out, float *rstd, const float *inp, const float *w, int N, int C,
                      float eps) {
    (void)ctx;
    hp_rmsnorm_forward(out, rstd, inp, w, N, C, eps);
}
static void cpu_rms_bi(void *ctx, float *dinp, const float *dout, const float *inp, const float *w,
                       const float *rstd, int N, int C, int acc) {
    (void)ctx;
    hp_rmsnorm_backward_input(dinp, dout, inp, w, rstd, N, C, acc);
}
static void cpu_rms_bw(void *ctx, float *dw, const float *dout, const float *inp, const float *rstd, int N,
                       int C) {
    (void)ctx;
    hp_rmsnorm_backward_weight(dw, dout, inp, rstd, N, C);
}
static void cpu_rmsh_f(void *ctx, float *out, int ldo, float *rstd, const float *inp, int ldi, const float *w,
                       int N, int H, int C, float eps) {
    (void)ctx;
    hp_rmsnorm_heads_forward(out, ldo, rstd, inp, ldi, w, N, H, C, eps);
}
static void cpu_rmsh_bi(void *ctx, float *dinp, int ldo, const float *dout, int lddo, const float *inp, int ldi,
                        const float *w, const float *rstd, int N, int H, int C) {
    (void)ctx;
    hp_rmsnorm_heads_backward_input(dinp, ldo, dout, lddo, inp, ldi, w, rstd, N, H, C);
}
static void cpu_rmsh_bw(void *ctx, float *dw, const float *dout, int lddo, const float *inp, int ldi,
                        const float *rstd, int N, int H, int C) {
    (void)ctx;
    hp_rmsnorm_heads_backward_weight(dw, dout, lddo, inp, ldi, rstd, N, H, C);
}
static void cpu_rope(void *ctx, float *x, int ld, int B, int T, int H, int hd, const float *c, const float *s,
                     int style, int inverse) {
    (void)ctx;
    hp_rope_apply(x, ld, B, T, H, hd, c, s, (hp_rope_style_t)style, inverse);
}
static void cpu_attn_f(void *ctx, float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                       const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd) {
    (void)ctx;
    hp_attention_forward(out, lse, q, ldq, k, ldk, v, ldv, B, T, Hq, Hkv, hd);
}
static void cpu_attn_b(void *ctx, float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                       const float *dout, const float *out, const float *lse, const float *q, int ldq,
                       const float *k, int ldk, const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd) {
    (void)ctx;
    hp_attention_backward(dq, lddq, dk, lddk, dv, lddv, dout, out, lse, q, ldq, k, ldk, v, ldv, B, T, Hq, Hkv, hd);
}
static void cpu_attn_dec(void *ctx, float *out, float *scratch, const float *q, int ldq, const float *k, int ldk,
                         const float *v, int ldv, int p0, int n, int Hq, int Hkv, int hd, int n_threads) {
    (void)ctx;
    hp_attention_decode_forward(out, scratch, q, ldq, k, ldk, v, ldv, p0, n, Hq, Hkv, hd, n_threads);
}
/* MLA's core (separate q|k and v head widths) and the MoE experts' grouped GEMM. */
static void cpu_attn_qk_v_f(void *ctx, float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                            const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd, int hv) {
    (void)ctx;
    hp_attention_forward_qk_v(out, lse, q, ldq, k, ldk, v, ldv, B, T, Hq, Hkv, hd, hv);
}
static void cpu_attn_qk_v_b(void *ctx, float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                            const float *dout, const float *out, const float *lse, const float *q, int ldq,
                            const float *k, int ldk, const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd,
                            int hv) {
    (void)ctx;
    hp_attention_backward_qk_v(dq, lddq, dk, lddk, dv, lddv, dout, out, lse, q, ldq, k, ldk, v, ldv, B, T, Hq, Hkv,
                               hd, hv);
}
static void cpu_gemm_grouped(void *ctx, const hp_gemm_group_t *g, int n, int ta, int tb, float alpha, float beta) {
    (void)ctx;
    hp_gemm_grouped(g, n, ta, tb, alpha, beta);
}
static void cpu_swiglu_f(void *ctx, float *out, const float *h13, int N, int H) {
    (void)ctx;
    hp_swiglu_forward(out, h13, N, H);
}
static void cpu_swiglu_b(void *ctx, float *dh13, const float *dout, const float *h13, int N, int H) {
    (void)ctx;
    hp_swiglu_backward(dh13, dout, h13, N, H);
}
static void cpu_emb_f(void *ctx, float *out, const int32_t *tok, const float *w, int N, int C) {
    (void)ctx;
    hp_embedding_forward(out, tok, w, N, C);
}
static void cpu_emb_b(void *ctx, float *dw, const float *dout, const int32_t *tok, int N, int C, int V) {
    (void)ctx;
    hp_embedding_backward(dw, dout, tok, N, C, V);
}
static double cpu_ce_f(void *ctx, double *losses, float *lse, const float *logits, const int32_t *t, int N, int V,
                       int64_t *n_valid) {
    (void)ctx;
    return hp_cross_entropy_forward(losses, lse, logits, t, N, V, n_valid);
}
static void cpu_ce_b(void *ctx, float *dl, const float *logits, const float *lse, const int32_t *t, float dloss,
                     int N, int V, int64_t off) {
    (void)ctx;
    hp_cross_entropy_backward_shard(dl, logits, lse, t, dloss, N, V, off);
}

/* torch.optim.adamw single-tensor path: p *= 1 - lr*wd; m = lerp(m, g, 1-b1);
 * v = b2 v + (1-b2) g^2; p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps). */
static void cpu_adamw(void *ctx, float *p, float *m, float *v, const float *g, int64_t n, double lr, double b1,
                      double b2, double eps, double wd, int64_t step) {
    (void)ctx;
    const float decay = (float)(1.0 - lr * wd);
    const float w1 = (float)(1.0 - b1), fb2 = (float)b2, w2 = (float)(1.0 - b2);
    const double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    const float step_size = (float)(lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float feps = (float)eps;
    // elementwise, so chunks in parallel give the same bits at any thread count; each chunk
    // through the ISA path's vector loop (nn-simd.h: vsqrtps, correctly rounded as sqrtf)
    const hp_nn_simd_t *k = hp_nn_simd();
    enum { CHUNK = 16384 };
    const int64_t nch = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nch > 1)
    for (int64_t c = 0; c < nch; c++) {
        const int64_t i0 = c * CHUNK, len = n - i0 < CHUNK ? n - i0 : CHUNK;
        k->adamw(p + i0, m + i0, v + i0, g + i0, len, decay, w1, fb2, w2, step_size, bc2_sqrt, feps);
    }
}

/* torch.optim.sgd: d = g + wd p; buf = d (first step) or momentum*buf + (1-dampening) d;
 * d = nesterov ? d + momentum*buf : buf; p -= lr d. */
static void cpu_sgd(void *ctx, float *p, float *buf, const float *g, int64_t n, double lr, double wd, double mom,
                    double damp, int nesterov, int started) {
    (void)ctx;
    const float fwd = (float)wd, fmom = (float)mom, fdamp = (float)(1.0 - damp), flr = (float)lr;
    for (int64_t i = 0; i < n; i++) {
        float d = g[i];
        if (fwd != 0.0f) d += fwd * p[i];
        if (buf) {
            float b = started ? fmom * buf[i] + fdamp * d : d;
            buf[i] = b;
            d = nesterov ? d + fmom * b : b;
        }
        p[i] -= flr * d;
    }
}

static void cpu_gemm(void *ctx, float *c, int ldc, const float *a, int lda, const float *b, int ldb, int M, int N,
                     int K, int ta, int tb, float alpha, float beta) {
    (void)ctx;
    hp_cpu_sgemm(c, ldc, a, lda, b, ldb, M, N, K, ta, tb, alpha, beta);
}

static void cpu_gemm_bf16(void *ctx, float *c, int ldc, const uint16_t *a, int lda, const uint16_t *b, int ldb, int M,
                          int N, int K, int ta, int tb, float alpha, float beta, float *ws, size_t ws_floats) {
    (void)ctx;
    hp_gemm_bf16_ws(c, ldc, a, lda, b, ldb, M, N, K, ta, tb, alpha, beta, ws, ws_floats);
}

static void cpu_attn_block_f(void *ctx, float *out, int ldo, float *lse, int ldl, const float *q, int ldq,
                             const float *k, int ldk, const float *v, int ldv, int Tq, int Tk, int Hq, int Hkv, int hd,
                             int mask, float *scratch) {
    (void)ctx;
    hp_attn_block_forward(out, ldo, lse, ldl, q, ldq, k, ldk, v, ldv, Tq, Tk, Hq, Hkv, hd, (hp_attn_mask_t)mask,
                          scratch);
}
static void cpu_attn_block_b(void *ctx, float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                             const float *dout, int lddo, const float *out, int ldo, const float *lse, int ldl,
                             const float *q, int ldq, const float *k, int ldk, const float *v, int ldv, int Tq, int Tk,
                             int Hq, int Hkv, int hd, int mask, float *scratch) {
    (void)ctx;
    hp_attn_block_backward(dq, lddq, dk, lddk, dv, lddv, dout, lddo, out, ldo, lse, ldl, q, ldq, k, ldk, v, ldv, Tq,
                           Tk, Hq, Hkv, hd, (hp_attn_mask_t)mask, scratch);
}
static void cpu_attn_block_m(void *ctx, float *out, int ldo, float *lse, int ldl, const float *out_b, int ldb,
                             const float *lse_b, int ldlb, int T, int H, int hd) {
    (void)ctx;
    hp_attn_block_merge(out, ldo, lse, ldl, out_b, ldb, lse_b, ldlb, T, H, hd);
}

static void cpu_set_threads(void *ctx, int n) { (void)ctx; hp_cpu_blas_set_num_threads(n); }
static int cpu_get_threads(void *ctx) { (void)ctx; return hp_cpu_blas_get_num_threads(); }

static const hp_backend_t cpu_backend = {
    .name = "cpu",
    .device = HP_DEVICE_HOST,
    .ctx = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset0 = cpu_memset0,
    .copy_rows = cpu_copy_rows,
    .convert = cpu_convert,
    .add_inplace = cpu_add,
    .linear_forward = cpu_linear_forward,
    .linear_backward_input = cpu_linear_bi,
    .linear_backward_weight = cpu_linear_bw,
    .rmsnorm_forward = cpu_rms_f,
    .rmsnorm_backward_input = cpu_rms_bi,
    .rmsnorm_backward_weight = cpu_rms_bw,
    .rmsnorm_heads_forward = cpu_rmsh_f,
    .rmsnorm_heads_backward_input = cpu_rmsh_bi,
    .rmsnorm_heads_backward_weight = cpu_rmsh_bw,
    .rope_apply = cpu_rope,
    .attention_forward = cpu_attn_f,
    .attention_backward = cpu_attn_b,
    .attention_decode_forward = cpu_attn_dec,
    .attention_qk_v_forward = cpu_attn_qk_v_f,
    .attention_qk_v_backward = cpu_attn_qk_v_b,
    .gemm_grouped = cpu_gemm_grouped,
    .swiglu_forward = cpu_swiglu_f,
    .swiglu_backward = cpu_swiglu_b,
    .embedding_forward = cpu_emb_f,
    .embedding_backward = cpu_emb_b,
    .cross_entropy_forward = cpu_ce_f,
    .cross_entropy_backward = cpu_ce_b,
    .adamw_update = cpu_adamw,
    .sgd_update = cpu_sgd,
    .gemm = cpu_gemm,
    .gemm_bf16 = cpu_gemm_bf16,
    .attn_block_forward = cpu_attn_block_f,
    .attn_block_backward = cpu_attn_block_b,
    .attn_block_merge = cpu_attn_block_m,
    .set_num_threads = cpu_set_threads,
    .get_num_threads = cpu_get_threads,
    .synchronize = NULL,   /* the CPU's kernels complete before they return */
};

const hp_backend_t *hp_backend_cpu(void) { return &cpu_backend; }
const hp_backend_t *hp_backend_default(void) { return &cpu_backend; }
