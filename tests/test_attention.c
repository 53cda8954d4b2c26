// The causal flash attention kernels (hp_attention_forward / _backward) against the double
// reference (kernels_ref.c) on every ISA path this CPU has (avx512, avx2, portable), one forced
// at a time (hp_nn_set_isa): head_dim 16 (one vector on AVX-512), 24 (a one-vector column tail on
// AVX2; the AVX2 tiles on an AVX-512 CPU), 32, 64, 128, and 12 / 6 (the 4-wide and scalar
// portable instantiations); GQA ratios 1, 2, 4; T 1, 7, 100, 257 (not multiples of the 64-row
// tiles); B 2; q/k/v at strides of a padded packed qkv row, gradients at other strides. Also: the
// results do not depend on the thread count (bitwise), the paths agree with each other, the
// harness rejects an injected error, and hp_nn_set_isa refuses a path the CPU lacks. The backward
// runs in both of its schedules, forced one at a time (hp_attention_set_backward): fused per
// (b, kv head) and split (dK/dV per key tile, dQ per query tile), each against the reference,
// and the two bitwise equal (the same products summed in the same order). T 520: the long-sequence
// schedules on contiguous copies of K, V, dK, dV, bitwise equal to the strided ones.
// hp-test: ranks 1 timeout 300
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/nn.h"
#include "hp_test.h"
#include "hp_test_rand.h"

/* Tolerances, |a - b| <= atol + rtol |b| against the double reference:
 * forward: a score sums hd <= 128 f32 products (|q|, |k| <= 1.5, scaled by 1/sqrt(hd): |s| <= 20,
 * error <= hd u |s| ~ 1.5e-4 worst case, ~1e-5 at random signs) and enters exp with relative
 * error <= 4.5e-7; O sums T <= 257 weighted rows of |v| <= 1.5 in f32 (T u ~ 1.5e-5 relative to
 * the sum of |terms|, which is max|v| since the weights sum to 1): rtol 1e-4, atol 1e-5 (measured
 * worst ratio 0.05 on AVX2 and portable); backward: two such products chained (dS from P and dP, then dS K, P^T dO,
 * dS^T Q over T terms): twice both. */
#define FWD_RTOL 1e-4
#define FWD_ATOL 1e-5
#define BWD_RTOL 2e-4
#define BWD_ATOL 2e-5

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float *rnd(size_t n, float scale) { return hp_test_rnd(&rng_state, n, scale); }

/* max over i of |a - b| / (atol + rtol |b|); <= 1 means close; a NaN anywhere gives +inf */
static double close_ratio(const float *a, const float *b, size_t n, double rtol, double atol) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double r = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (r != r) return INFINITY;
        if (r > worst) worst = r;
    }
    return worst;
}

static double worst_fwd = 0, worst_bwd = 0;   // largest ratios seen (printed: the margin)

typedef struct {
    int B, T, Hq, Hkv, hd, ld, ldg;
    size_t N;
    float *qkv, *dout;
    float *o_ref, *lse_ref, *g_ref;   // reference results
} case_t;

static void case_init(case_t *c, int B, int T, int Hq, int Hkv, int hd) {
    c->B = B, c->T = T, c->Hq = Hq, c->Hkv = Hkv, c->hd = hd;
    c->N = (size_t)B * T;
    c->ld = (Hq + 2 * Hkv) * hd + 5;   // packed q | k | v rows plus padding: odd strides
    c->ldg = c->ld + 3;                // gradients at their own stride
    c->qkv = rnd(c->N * c->ld, 1.5f);
    c->dout = rnd(c->N * Hq * hd, 1.0f);
    c->o_ref = malloc(sizeof(float) * c->N * Hq * hd);
    c->lse_ref = malloc(sizeof(float) * c->N * Hq);
    c->g_ref = malloc(sizeof(float) * c->N * c->ldg);
    const float *q = c->qkv, *k = q + Hq * hd, *v = k + Hkv * hd;
    hp_ref_attention_forward(c->o_ref, c->lse_ref, q, c->ld, k, c->ld, v, c->ld, B, T, Hq, Hkv, hd);
    memset(c->g_ref, 0, sizeof(float) * c->N * c->ldg);
    hp_ref_attention_backward(c->g_ref, c->ldg, c->g_ref + Hq * hd, c->ldg, c->g_ref + (Hq + Hkv) * hd, c->ldg,
                              c->dout, q, c->ld, k, c->ld, v, c->ld, B, T, Hq, Hkv, hd);
}

static void case_free(case_t *c) {
    free(c->qkv); free(c->dout); free(c->o_ref); free(c->lse_ref); free(c->g_ref);
}

/* Runs the kernels on the current path; out/lse/g receive the results. The gradient buffer
 * starts as garbage (the kernel writes =); padding columns are compared to the reference's 0
 * only where the kernel writes, so they are zeroed first in both. */
static void run(const case_t *c, float *o, float *lse, float *g) {
    const int Hq = c->Hq, Hkv = c->Hkv, hd = c->hd;
    const float *q = c->qkv, *k = q + Hq * hd, *v = k + Hkv * hd;
    hp_attention_forward(o, lse, q, c->ld, k, c->ld, v, c->ld, c->B, c->T, Hq, Hkv, hd);
    for (size_t r = 0; r < c->N; r++) {
        float *row = g + r * c->ldg;
        for (int d = 0; d < c->ldg; d++) row[d] = d < (Hq + 2 * Hkv) * hd ? 1e30f : 0.0f;   // garbage
    }
    hp_attention_backward(g, c->ldg, g + Hq * hd, c->ldg, g + (Hq + Hkv) * hd, c->ldg, c->dout, o, lse, q, c->ld,
                          k, c->ld, v, c->ld, c->B, c->T, Hq, Hkv, hd);
}

static void check_case(const case_t *c, const char *path) {
    const size_t no = c->N * c->Hq * c->hd, ng = c->N * c->ldg;
    float *o = malloc(sizeof(float) * no), *lse = malloc(sizeof(float) * c->N * c->Hq), *g = malloc(sizeof(float) * ng);
    float *gs = malloc(sizeof(float) * ng);
    HP_CHECK(hp_attention_set_backward(HP_ATTENTION_BWD_SPLIT) == HP_OK, "force split");
    run(c, o, lse, gs);
    HP_CHECK(hp_attention_set_backward(HP_ATTENTION_BWD_FUSED) == HP_OK, "force fused");
    run(c, o, lse, g);
    HP_CHECK(hp_attention_set_backward(HP_ATTENTION_BWD_AUTO) == HP_OK, "auto");
    HP_CHECK(memcmp(g, gs, sizeof(float) * ng) == 0, "%s B%d T%d Hq%d Hkv%d hd%d: split and fused backward differ",
             path, c->B, c->T, c->Hq, c->Hkv, c->hd);
    char what[128];
    snprintf(what, sizeof what, "%s B%d T%d Hq%d Hkv%d hd%d", path, c->B, c->T, c->Hq, c->Hkv, c->hd);
    double ro = close_ratio(o, c->o_ref, no, FWD_RTOL, FWD_ATOL);
    double rl = close_ratio(lse, c->lse_ref, c->N * c->Hq, FWD_RTOL, FWD_ATOL);
    double rg = close_ratio(g, c->g_ref, ng, BWD_RTOL, BWD_ATOL);
    HP_CHECK(ro <= 1.0, "%s: forward out error ratio %.3g", what, ro);
    HP_CHECK(rl <= 1.0, "%s: lse error ratio %.3g", what, rl);
    HP_CHECK(rg <= 1.0, "%s: backward error ratio %.3g", what, rg);
    double rs = close_ratio(gs, c->g_ref, ng, BWD_RTOL, BWD_ATOL);   // the split one on its own
    HP_CHECK(rs <= 1.0, "%s: split backward error ratio %.3g", what, rs);
    worst_fwd = fmax(worst_fwd, fmax(ro, rl));
    worst_bwd = fmax(worst_bwd, fmax(rg, rs));
    free(o); free(lse); free(g); free(gs);
}

/* Same bits at 1 and 3 threads (every output element has one writer and a fixed order). */
static void check_threads(const case_t *c, const char *path) {
    const size_t no = c->N * c->Hq * c->hd, ng = c->N * c->ldg;
    float *o1 = malloc(sizeof(float) * no), *l1 = malloc(sizeof(float) * c->N * c->Hq), *g1 = malloc(sizeof(float) * ng);
    float *o3 = malloc(sizeof(float) * no), *l3 = malloc(sizeof(float) * c->N * c->Hq), *g3 = malloc(sizeof(float) * ng);
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    run(c, o1, l1, g1);   // auto: fused on 1 thread
    omp_set_num_threads(3);
    HP_CHECK(hp_attention_set_backward(HP_ATTENTION_BWD_SPLIT) == HP_OK, "force split");
    run(c, o3, l3, g3);   // split (forced) on 3 threads
    HP_CHECK(hp_attention_set_backward(HP_ATTENTION_BWD_AUTO) == HP_OK, "auto");
    omp_set_num_threads(nt);
    HP_CHECK(memcmp(o1, o3, sizeof(float) * no) == 0 && memcmp(l1, l3, sizeof(float) * c->N * c->Hq) == 0 &&
                 memcmp(g1, g3, sizeof(float) * ng) == 0,
             "%s T%d hd%d: results differ between 1 thread (fused) and 3 threads (split)", path, c->T, c->hd);
    free(o1); free(l1); free(g1); free(o3); free(l3); free(g3);
}

/* The harness must see a small error: one output element off by 10x the tolerance fails. */
static void check_negative(const case_t *c) {
    const size_t no = c->N * c->Hq * c->hd;
    float *o = malloc(sizeof(float) * no);
    memcpy(o, c->o_ref, sizeof(float) * no);
    HP_CHECK(close_ratio(o, c->o_ref, no, FWD_RTOL, FWD_ATOL) == 0.0, "identical arrays must give ratio 0");
    const size_t i = no / 2;
    o[i] += (float)(10.0 * (FWD_ATOL + FWD_RTOL * fabs((double)o[i])));
    HP_CHECK(!(close_ratio(o, c->o_ref, no, FWD_RTOL, FWD_ATOL) <= 1.0), "an injected error of 10x the tolerance passed");
    o[i] = NAN;
    HP_CHECK(!(close_ratio(o, c->o_ref, no, FWD_RTOL, FWD_ATOL) <= 1.0), "a NaN passed");
    free(o);
}

int main(void) {
    // the paths this CPU has, in order (AVX-512 implies AVX2 + FMA); a missing one is refused
    hp_nn_isa_t paths[3] = {HP_NN_ISA_PORTABLE, HP_NN_ISA_AVX2, HP_NN_ISA_AVX512};
    int npaths = 1;
    const hp_nn_isa_t start = hp_nn_isa();
    HP_CHECK(start != HP_NN_ISA_AUTO, "hp_nn_isa() never reports auto");
    if (hp_nn_set_isa(HP_NN_ISA_AVX2) == HP_OK) npaths = 2;
    else printf("no AVX2+FMA on this CPU: only the portable path is checked\n");
    if (npaths == 2 && hp_nn_set_isa(HP_NN_ISA_AVX512) == HP_OK) npaths = 3;
    else printf("no AVX-512 (F, DQ, BW, VL, CD) on this CPU: the avx512 path is not checked\n");
    if (npaths < 3) HP_CHECK(hp_nn_set_isa(HP_NN_ISA_AVX512) == HP_ERR_UNSUPPORTED, "avx512 refused where missing");
    HP_CHECK(hp_nn_set_isa(HP_NN_ISA_AUTO) == HP_OK && hp_nn_isa() == paths[npaths - 1],
             "auto selects the best path (%s)", hp_nn_isa_name(hp_nn_isa()));
    HP_CHECK(hp_nn_set_isa((hp_nn_isa_t)42) == HP_ERR_UNSUPPORTED, "an unknown path is refused");
    HP_CHECK(hp_attention_set_backward((hp_attention_bwd_t)7) == HP_ERR_INVALID_ARG, "an unknown backward mode is refused");
    HP_CHECK(!strcmp(hp_nn_isa_name(HP_NN_ISA_PORTABLE), "portable") && !strcmp(hp_nn_isa_name(HP_NN_ISA_AVX2), "avx2") &&
                 !strcmp(hp_nn_isa_name(HP_NN_ISA_AVX512), "avx512"),
             "path names");

    static const int hds[] = {16, 24, 32, 64, 128, 12, 6}, reps[] = {1, 2, 4}, Ts[] = {1, 7, 100, 257};
    int ncase = 0;
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
        for (size_t r = 0; r < sizeof reps / sizeof reps[0]; r++)
            for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
                const int hd = hds[a], rep = reps[r], T = Ts[t];
                if (hd < 16 && (rep == 4 || T == 1)) continue;   // the odd head_dims: fewer cases
                const int Hkv = rep == 4 ? 1 : 2;
                case_t c;
                case_init(&c, 2, T, Hkv * rep, Hkv, hd);
                for (int p = 0; p < npaths; p++) {
                    HP_CHECK(hp_nn_set_isa(paths[p]) == HP_OK, "set %s", hp_nn_isa_name(paths[p]));
                    check_case(&c, hp_nn_isa_name(paths[p]));
                    if (rep == 2 && (T == 100 || T == 257) && (hd == 16 || hd == 24))
                        check_threads(&c, hp_nn_isa_name(paths[p]));
                }
                if (!ncase++) check_negative(&c);
                case_free(&c);
            }
    // one larger shape (two 64-row tiles per head, many (b, head) tasks), as the model runs it
    {
        case_t c;
        case_init(&c, 3, 130, 8, 2, 32);
        for (int p = 0; p < npaths; p++) {
            HP_CHECK(hp_nn_set_isa(paths[p]) == HP_OK, "set");
            check_case(&c, hp_nn_isa_name(paths[p]));
            check_threads(&c, hp_nn_isa_name(paths[p]));
        }
        case_free(&c);
    }
    // a long sequence (T >= 512: the kernels run on contiguous per-thread copies of K, V and
    // dK, dV); against the reference, and bitwise against the strided schedules (forward on 3
    // threads takes single tiles, the split backward never copies)
    {
        case_t c;
        case_init(&c, 2, 520, 4, 2, 16);
        for (int p = 0; p < npaths; p++) {
            HP_CHECK(hp_nn_set_isa(paths[p]) == HP_OK, "set");
            check_case(&c, hp_nn_isa_name(paths[p]));
            check_threads(&c, hp_nn_isa_name(paths[p]));
        }
        case_free(&c);
    }
    HP_CHECK(hp_nn_set_isa(start) == HP_OK, "restore");
    printf("attention: %d shapes x %d path(s); worst error ratio forward %.3g, backward %.3g (<= 1 passes)\n", ncase,
           npaths, worst_fwd, worst_bwd);
    return hp_test_finish("test_attention");
}
