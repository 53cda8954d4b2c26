// The block attention kernels of context parallelism (attention_block.h): hp_attn_block_forward /
// _backward (BLAS) against their double references for the causal-diagonal, full and skip masks,
// GQA ratios 1, 2, 4, blocks Tq != Tk, padded strides, accumulating (+=) gradients; the lse merge
// of a row's blocks equals causal attention over the whole row (hp_ref_attention_forward); and the
// harness rejects an injected error. The kernel table's attn_block_* slots give these kernels' bits.
// hp-test: ranks 1 timeout 120
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/attention_block.h"
#include "hyperparallel/backend.h"
#include "hyperparallel/nn.h"
#include "hp_test.h"
#include "hp_test_rand.h"

/* Against the double references: a score sums hd <= 32 f32 products of |q|, |k| <= 1 (error
 * <= hd u |s| ~ 2e-6), O sums Tk <= 40 softmax-weighted rows of |v| <= 1 (Tk u ~ 5e-6 of the
 * row's |v|), so rtol 1e-4 / atol 1e-5 leaves a 10x margin as test_attention.c's bound;
 * backward chains two such products (dS from P and dP, then dS K, dS^T Q, P^T dO): twice
 * both. The merge adds two roundings per merged block (<= 4 blocks): within the same bound. */
#define FWD_RTOL 1e-4
#define FWD_ATOL 1e-5
#define BWD_RTOL 2e-4
#define BWD_ATOL 2e-5

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float *rnd(size_t n) { return hp_test_rnd(&rng_state, n, 1.0f); }

/* max over elements of |a - b| / (atol + rtol |b|) (<= 1 passes); -inf == -inf counts as equal */
static double worst(const float *a, const float *b, size_t n, double rtol, double atol) {
    double w = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(a[i]) && isinf(b[i]) && a[i] == b[i]) continue;
        double r = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (!(r <= w)) w = isnan(r) ? INFINITY : r;
    }
    return w;
}

static void one_case(int Tq, int Tk, int Hq, int Hkv, int hd, hp_attn_mask_t mask) {
    const int ldq = Hq * hd + 3, ldk = Hkv * hd + 5, ldo = Hq * hd + 1, ldl = Tq + 2;
    float *q = rnd((size_t)Tq * ldq), *k = rnd((size_t)Tk * ldk), *v = rnd((size_t)Tk * ldk);
    float *o1 = calloc((size_t)Tq * ldo, 4), *o2 = calloc((size_t)Tq * ldo, 4);
    float *l1 = calloc((size_t)Hq * ldl, 4), *l2 = calloc((size_t)Hq * ldl, 4);
    float *scratch = malloc(sizeof(float) * hp_attn_block_scratch_floats(Tq, Tk));
    hp_attn_block_forward(o1, ldo, l1, ldl, q, ldq, k, ldk, v, ldk, Tq, Tk, Hq, Hkv, hd, mask, scratch);
    hp_ref_attn_block_forward(o2, ldo, l2, ldl, q, ldq, k, ldk, v, ldk, Tq, Tk, Hq, Hkv, hd, mask);
    double wf = worst(o1, o2, (size_t)Tq * ldo, FWD_RTOL, FWD_ATOL), wl = worst(l1, l2, (size_t)Hq * ldl, FWD_RTOL, FWD_ATOL);
    HP_CHECK(wf <= 1.0 && wl <= 1.0, "forward Tq=%d Tk=%d Hq=%d Hkv=%d hd=%d mask=%d: out %.3g lse %.3g of the bound",
             Tq, Tk, Hq, Hkv, hd, mask, wf, wl);
    /* backward from a random dout, gradients starting non-zero (they accumulate) */
    float *dout = rnd((size_t)Tq * ldo);
    float *dq1 = rnd((size_t)Tq * ldq), *dk1 = rnd((size_t)Tk * ldk), *dv1 = rnd((size_t)Tk * ldk);
    float *dq2 = malloc(sizeof(float) * Tq * ldq), *dk2 = malloc(sizeof(float) * Tk * ldk), *dv2 = malloc(sizeof(float) * Tk * ldk);
    memcpy(dq2, dq1, sizeof(float) * Tq * ldq);
    memcpy(dk2, dk1, sizeof(float) * Tk * ldk);
    memcpy(dv2, dv1, sizeof(float) * Tk * ldk);
    hp_attn_block_backward(dq1, ldq, dk1, ldk, dv1, ldk, dout, ldo, o2, ldo, l2, ldl, q, ldq, k, ldk, v, ldk, Tq, Tk,
                           Hq, Hkv, hd, mask, scratch);
    hp_ref_attn_block_backward(dq2, ldq, dk2, ldk, dv2, ldk, dout, ldo, o2, ldo, l2, ldl, q, ldq, k, ldk, v, ldk, Tq,
                               Tk, Hq, Hkv, hd, mask);
    double wq = worst(dq1, dq2, (size_t)Tq * ldq, BWD_RTOL, BWD_ATOL), wk = worst(dk1, dk2, (size_t)Tk * ldk, BWD_RTOL, BWD_ATOL),
           wv = worst(dv1, dv2, (size_t)Tk * ldk, BWD_RTOL, BWD_ATOL);
    HP_CHECK(wq <= 1.0 && wk <= 1.0 && wv <= 1.0, "backward Tq=%d Tk=%d Hq=%d Hkv=%d mask=%d: dq %.3g dk %.3g dv %.3g",
             Tq, Tk, Hq, Hkv, mask, wq, wk, wv);
    {   /* the kernel table's slots (backend.h, how cp.c calls them) are these kernels: the same bits */
        const hp_backend_t *be = hp_backend_cpu();
        float *o3 = calloc((size_t)Tq * ldo, 4), *l3 = calloc((size_t)Hq * ldl, 4), *dq3 = rnd((size_t)Tq * ldq);
        float *dq4 = malloc(sizeof(float) * Tq * ldq);
        memcpy(dq4, dq3, sizeof(float) * Tq * ldq);
        be->attn_block_forward(be->ctx, o3, ldo, l3, ldl, q, ldq, k, ldk, v, ldk, Tq, Tk, Hq, Hkv, hd, mask, scratch);
        be->attn_block_backward(be->ctx, dq3, ldq, dk2, ldk, dv2, ldk, dout, ldo, o2, ldo, l2, ldl, q, ldq, k, ldk, v, ldk,
                                Tq, Tk, Hq, Hkv, hd, mask, scratch);
        hp_attn_block_backward(dq4, ldq, dk2, ldk, dv2, ldk, dout, ldo, o2, ldo, l2, ldl, q, ldq, k, ldk, v, ldk, Tq, Tk,
                               Hq, Hkv, hd, mask, scratch);
        HP_CHECK(!memcmp(o3, o1, sizeof(float) * Tq * ldo) && !memcmp(l3, l1, sizeof(float) * Hq * ldl) &&
                 !memcmp(dq3, dq4, sizeof(float) * Tq * ldq), "table slots differ from the kernels (Tq=%d mask=%d)", Tq,
                 mask);
        free(o3); free(l3); free(dq3); free(dq4);
    }
    free(q); free(k); free(v); free(o1); free(o2); free(l1); free(l2); free(scratch);
    free(dout); free(dq1); free(dk1); free(dv1); free(dq2); free(dk2); free(dv2);
}

/* Causal attention over T = n c rows as blocks: query chunk a merges key chunks 0..a (full
 * below the diagonal, causal on it), against hp_ref_attention_forward of the whole row. */
static void merge_case(int n, int c, int Hq, int Hkv, int hd, int inject) {
    const int T = n * c, qd = Hq * hd, kd = Hkv * hd, ld = qd + 2 * kd;
    float *x = rnd((size_t)T * ld);
    float *ref = malloc(sizeof(float) * T * qd), *rl = malloc(sizeof(float) * Hq * T);
    hp_ref_attention_forward(ref, rl, x, ld, x + qd, ld, x + qd + kd, ld, 1, T, Hq, Hkv, hd);
    float *out = malloc(sizeof(float) * T * qd), *lse = malloc(sizeof(float) * Hq * T);
    float *bo = malloc(sizeof(float) * c * qd), *bl = malloc(sizeof(float) * Hq * c);
    float *scratch = malloc(sizeof(float) * hp_attn_block_scratch_floats(c, c));
    const hp_backend_t *be = hp_backend_cpu();
    for (int i = 0; i < Hq * T; i++) lse[i] = -INFINITY;
    memset(out, 0, sizeof(float) * T * qd);
    for (int a = 0; a < n; a++)
        for (int j = n - 1; j >= 0; j--) {   // any order: the merge is symmetric
            hp_attn_mask_t mk = j < a ? HP_ATTN_MASK_FULL : j == a ? HP_ATTN_MASK_CAUSAL : HP_ATTN_MASK_SKIP;
            hp_attn_block_forward(bo, qd, bl, c, x + (size_t)a * c * ld, ld, x + (size_t)j * c * ld + qd, ld,
                                  x + (size_t)j * c * ld + qd + kd, ld, c, c, Hq, Hkv, hd, mk, scratch);
            // through the kernel table, as cp.c merges
            be->attn_block_merge(be->ctx, out + (size_t)a * c * qd, qd, lse + (size_t)a * c, T, bo, qd, bl, c, c, Hq,
                                 hd);
        }
    if (inject) out[T * qd / 2] += 1e-3f;
    double wo = worst(out, ref, (size_t)T * qd, FWD_RTOL, FWD_ATOL), wl = worst(lse, rl, (size_t)Hq * T, FWD_RTOL, FWD_ATOL);
    if (inject)
        HP_CHECK(wo > 1.0, "negative test: an injected 1e-3 error passed the harness (%.3g of the bound)", wo);
    else
        HP_CHECK(wo <= 1.0 && wl <= 1.0, "merge n=%d c=%d Hq=%d Hkv=%d: out %.3g lse %.3g of the bound", n, c, Hq, Hkv,
                 wo, wl);
    free(x); free(ref); free(rl); free(out); free(lse); free(bo); free(bl); free(scratch);
}

int main(void) {
    const int heads[][2] = {{4, 4}, {4, 2}, {8, 2}};
    for (int h = 0; h < 3; h++) {
        for (int hd = 8; hd <= 32; hd *= 2) {
            one_case(1, 1, heads[h][0], heads[h][1], hd, HP_ATTN_MASK_CAUSAL);
            one_case(17, 17, heads[h][0], heads[h][1], hd, HP_ATTN_MASK_CAUSAL);
            one_case(9, 23, heads[h][0], heads[h][1], hd, HP_ATTN_MASK_FULL);
            one_case(16, 16, heads[h][0], heads[h][1], hd, HP_ATTN_MASK_FULL);
            one_case(5, 7, heads[h][0], heads[h][1], hd, HP_ATTN_MASK_SKIP);
        }
        merge_case(4, 8, heads[h][0], heads[h][1], 16, 0);
        merge_case(3, 5, heads[h][0], heads[h][1], 8, 0);
    }
    merge_case(4, 8, 4, 2, 16, 1);
    return hp_test_finish("test_attention_block");
}
