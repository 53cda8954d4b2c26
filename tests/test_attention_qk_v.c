// The causal attention with separate q|k and v head widths (MLA's core: hp_attention_forward_qk_v
// / _backward_qk_v, backend slots attention_qk_v_*), on every ISA path this CPU has, one forced
// at a time: against its double twin (hp_ref_attention_qk_v_*); the twin against the existing
// double loop (hp_ref_attention_*) on zero-padded rows; the kernel bitwise against the
// one-width kernel on V zero-padded to the q|k width (the padded layout MLA ran before: the
// appended products are exact zeros); hv == hd bitwise the one-width kernel; the same bits at 1
// and 3 threads and in both backward schedules; a long sequence (contiguous copies); the harness
// rejects an injected error. Widths: DeepSeek-V3's 192 / 128, 24 / 16, 16 / 24 (v wider), 12 / 8
// (4-wide portable), 6 / 10 (scalar); GQA 1 and 2; T 1, 7, 100, 130.
// hp-test: ranks 1 timeout 300
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/backend.h"
#include "hyperparallel/nn.h"
#include "hp_test.h"
#include "hp_test_rand.h"

/* Against the double twin, |a - b| <= atol + rtol |b|: test_attention.c's derivation with a
 * score of hd <= 192 f32 products (random signs: ~1e-5 relative; worst case 2.3e-4 would need
 * all terms aligned) and an output of T <= 520 weighted rows of hv values: rtol 1e-4, atol 1e-5;
 * backward two such products chained: twice both. */
#define FWD_RTOL 1e-4
#define FWD_ATOL 1e-5
#define BWD_RTOL 2e-4
#define BWD_ATOL 2e-5
/* Twin against the old double loop on q, k padded and q scaled by sqrt(hv / hd) (v wider than
 * q|k: the old loop's scale is 1/sqrt(hv)): the only difference is that float pre-scale of q
 * (half an ulp, 6e-8 relative, moving a score |s| <= 20 by 1.2e-6 and exp by that relative):
 * rtol 1e-5, atol 1e-6. With v narrower no scale is needed and the two are bitwise equal. */
#define PAD_RTOL 1e-5
#define PAD_ATOL 1e-6

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float *rnd(size_t n, float scale) { return hp_test_rnd(&rng_state, n, scale); }
static double close_ratio(const float *a, const float *b, size_t n, double rtol, double atol) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double r = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (r != r) return INFINITY;
        if (r > worst) worst = r;
    }
    return worst;
}

static double worst_fwd = 0, worst_bwd = 0;

typedef struct {
    int B, T, Hq, Hkv, hd, hv, ld, ldg;
    size_t N, no, ng;
    float *qkv, *dout, *o_ref, *lse_ref, *g_ref;
} case_t;

/* Rows [q (Hq hd) | k (Hkv hd) | v (Hkv hv) | 3 spare], gradients at another stride. */
static void case_init(case_t *c, int B, int T, int Hq, int Hkv, int hd, int hv) {
    *c = (case_t){.B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .hd = hd, .hv = hv};
    c->N = (size_t)B * T;
    c->ld = (Hq + Hkv) * hd + Hkv * hv + 3;
    c->ldg = c->ld + 5;
    c->no = c->N * Hq * hv;
    c->ng = c->N * c->ldg;
    c->qkv = rnd(c->N * c->ld, 1.5f);
    c->dout = rnd(c->no, 1.0f);
    c->o_ref = malloc(sizeof(float) * c->no);
    c->lse_ref = malloc(sizeof(float) * c->N * Hq);
    c->g_ref = calloc(c->ng, sizeof(float));
    const float *q = c->qkv, *k = q + Hq * hd, *v = k + Hkv * hd;
    hp_ref_attention_qk_v_forward(c->o_ref, c->lse_ref, q, c->ld, k, c->ld, v, c->ld, B, T, Hq, Hkv, hd, hv);
    hp_ref_attention_qk_v_backward(c->g_ref, c->ldg, c->g_ref + Hq * hd, c->ldg, c->g_ref + (Hq + Hkv) * hd, c->ldg,
                                   c->dout, q, c->ld, k, c->ld, v, c->ld, B, T, Hq, Hkv, hd, hv);
}
static void case_free(case_t *c) {
    free(c->qkv); free(c->dout); free(c->o_ref); free(c->lse_ref); free(c->g_ref);
}

/* The kernels through the CPU backend's slots; g starts as garbage where the kernel writes. */
static void run(const case_t *c, float *o, float *lse, float *g) {
    const hp_backend_t *be = hp_backend_cpu();
    const int Hq = c->Hq, Hkv = c->Hkv, hd = c->hd, hv = c->hv;
    const float *q = c->qkv, *k = q + Hq * hd, *v = k + Hkv * hd;
    be->attention_qk_v_forward(be->ctx, o, lse, q, c->ld, k, c->ld, v, c->ld, c->B, c->T, Hq, Hkv, hd, hv);
    for (size_t r = 0; r < c->N; r++)
        for (int d = 0; d < c->ldg; d++) g[r * c->ldg + d] = d < (Hq + Hkv) * hd + Hkv * hv ? 1e30f : 0.0f;
    be->attention_qk_v_backward(be->ctx, g, c->ldg, g + Hq * hd, c->ldg, g + (Hq + Hkv) * hd, c->ldg, c->dout, o, lse,
                                q, c->ld, k, c->ld, v, c->ld, c->B, c->T, Hq, Hkv, hd, hv);
}

static void check_case(const case_t *c, const char *path) {
    float *o = malloc(sizeof(float) * c->no), *lse = malloc(sizeof(float) * c->N * c->Hq);
    float *g = malloc(sizeof(float) * c->ng), *gs = malloc(sizeof(float) * c->ng);
    char what[160];
    snprintf(what, sizeof what, "%s B%d T%d Hq%d Hkv%d hd%d hv%d", path, c->B, c->T, c->Hq, c->Hkv, c->hd, c->hv);
    HP_CHECK(hp_attention_set_backward(HP_ATTENTION_BWD_SPLIT) == HP_OK, "force split");
    run(c, o, lse, gs);
    HP_CHECK(hp_attention_set_backward(HP_ATTENTION_BWD_FUSED) == HP_OK, "force fused");
    run(c, o, lse, g);
    HP_CHECK(hp_attention_set_backward(HP_ATTENTION_BWD_AUTO) == HP_OK, "auto");
    HP_CHECK(memcmp(g, gs, sizeof(float) * c->ng) == 0, "%s: split and fused backward differ", what);
    const double ro = fmax(close_ratio(o, c->o_ref, c->no, FWD_RTOL, FWD_ATOL),
                           close_ratio(lse, c->lse_ref, c->N * c->Hq, FWD_RTOL, FWD_ATOL));
    const double rg = close_ratio(g, c->g_ref, c->ng, BWD_RTOL, BWD_ATOL);
    HP_CHECK(ro <= 1.0, "%s: forward error ratio %.3g", what, ro);
    HP_CHECK(rg <= 1.0, "%s: backward error ratio %.3g", what, rg);
    worst_fwd = fmax(worst_fwd, ro);
    worst_bwd = fmax(worst_bwd, rg);
    free(o); free(lse); free(g); free(gs);
}

/* Same bits at 1 thread (fused backward) and 3 threads (split, forced). */
static void check_threads(const case_t *c, const char *path) {
    float *o1 = malloc(sizeof(float) * c->no), *l1 = malloc(sizeof(float) * c->N * c->Hq), *g1 = malloc(sizeof(float) * c->ng);
    float *o3 = malloc(sizeof(float) * c->no), *l3 = malloc(sizeof(float) * c->N * c->Hq), *g3 = malloc(sizeof(float) * c->ng);
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    run(c, o1, l1, g1);
    omp_set_num_threads(3);
    HP_CHECK(hp_attention_set_backward(HP_ATTENTION_BWD_SPLIT) == HP_OK, "force split");
    run(c, o3, l3, g3);
    HP_CHECK(hp_attention_set_backward(HP_ATTENTION_BWD_AUTO) == HP_OK, "auto");
    omp_set_num_threads(nt);
    HP_CHECK(!memcmp(o1, o3, sizeof(float) * c->no) && !memcmp(l1, l3, sizeof(float) * c->N * c->Hq) &&
             !memcmp(g1, g3, sizeof(float) * c->ng), "%s T%d hd%d hv%d: 1 and 3 threads differ", path, c->T, c->hd, c->hv);
    free(o1); free(l1); free(g1); free(o3); free(l3); free(g3);
}

/* The same inputs in the one-width layout, both sides padded with zeros to w = max(hd, hv):
 * rows [q (Hq w) | k (Hkv w) | v (Hkv w)], q times qscale (so that 1/sqrt(w) gives 1/sqrt(hd)). */
static float *padded(const case_t *c, int w, float qscale, int *ldp) {
    const int Hq = c->Hq, Hkv = c->Hkv, hd = c->hd, hv = c->hv, ld = (Hq + 2 * Hkv) * w;
    float *x = calloc(c->N * ld, sizeof(float));
    for (size_t n = 0; n < c->N; n++) {
        const float *r = c->qkv + n * c->ld;
        float *p = x + n * ld;
        for (int h = 0; h < Hq; h++)
            for (int d = 0; d < hd; d++) p[h * w + d] = r[h * hd + d] * qscale;
        for (int h = 0; h < Hkv; h++) {
            memcpy(p + (Hq + h) * w, r + (Hq + h) * hd, sizeof(float) * hd);
            memcpy(p + (Hq + Hkv + h) * w, r + (Hq + Hkv) * hd + h * hv, sizeof(float) * hv);
        }
    }
    *ldp = ld;
    return x;
}

/* The twin against the existing double loop on the padded rows; the kernel (v narrower)
 * bitwise against the one-width kernel on V padded, as MLA ran it before. */
static void check_padded(const case_t *c, const char *path) {
    const int Hq = c->Hq, Hkv = c->Hkv, hd = c->hd, hv = c->hv, w = hd > hv ? hd : hv;
    const float qscale = hv > hd ? (float)sqrt((double)hv / hd) : 1.0f;
    int ld;
    float *x = padded(c, w, qscale, &ld);
    float *dp = calloc(c->N * Hq * w, sizeof(float));
    for (size_t r = 0; r < c->N * Hq; r++) memcpy(dp + r * w, c->dout + r * hv, sizeof(float) * hv);
    float *o = malloc(sizeof(float) * c->N * Hq * w), *lse = malloc(sizeof(float) * c->N * Hq);
    float *g = calloc(c->N * ld, sizeof(float)), *ov = malloc(sizeof(float) * c->no);
    hp_ref_attention_forward(o, lse, x, ld, x + Hq * w, ld, x + (Hq + Hkv) * w, ld, c->B, c->T, Hq, Hkv, w);
    for (size_t r = 0; r < c->N * Hq; r++) memcpy(ov + r * hv, o + r * w, sizeof(float) * hv);
    const double rtol = hv > hd ? PAD_RTOL : 0.0, atol = hv > hd ? PAD_ATOL : 0.0;
    double worst = fmax(close_ratio(ov, c->o_ref, c->no, rtol, atol + 1e-300),
                        close_ratio(lse, c->lse_ref, c->N * Hq, rtol, atol + 1e-300));
    HP_CHECK(worst <= 1.0, "twin hd%d hv%d vs the one-width double loop on padded rows: forward ratio %.3g", hd, hv,
             worst);
    if (hv < hd) {   // the kernels: bitwise against the one-width kernel on V padded with zeros
        const size_t ng = c->N * c->ldg;
        float *ok = malloc(sizeof(float) * c->no), *lk = malloc(sizeof(float) * c->N * Hq), *gk = malloc(sizeof(float) * ng);
        run(c, ok, lk, gk);
        hp_attention_forward(o, lse, x, ld, x + Hq * w, ld, x + (Hq + Hkv) * w, ld, c->B, c->T, Hq, Hkv, w);
        hp_attention_backward(g, ld, g + Hq * w, ld, g + (Hq + Hkv) * w, ld, dp, o, lse, x, ld, x + Hq * w, ld,
                              x + (Hq + Hkv) * w, ld, c->B, c->T, Hq, Hkv, w);
        int same = !memcmp(lk, lse, sizeof(float) * c->N * Hq);
        for (size_t n = 0; n < c->N && same; n++) {
            for (int h = 0; h < Hq; h++) same &= !memcmp(ok + (n * Hq + h) * hv, o + (n * Hq + h) * w, sizeof(float) * hv);
            same &= !memcmp(gk + n * c->ldg, g + n * ld, sizeof(float) * (Hq + Hkv) * hd);   // dq, dk
            for (int h = 0; h < Hkv; h++)
                same &= !memcmp(gk + n * c->ldg + (Hq + Hkv) * hd + h * hv, g + n * ld + (Hq + Hkv + h) * w,
                                sizeof(float) * hv);
        }
        HP_CHECK(same, "%s B%d T%d hd%d hv%d: not bitwise the one-width kernel on V padded with zeros", path, c->B, c->T,
                 hd, hv);
        free(ok); free(lk); free(gk);
    }
    free(x); free(dp); free(o); free(lse); free(g); free(ov);
}

/* hv == hd: the one-width kernel's bits (the same code, so GQA models keep theirs). */
static void check_equal_widths(const char *path) {
    case_t c;
    case_init(&c, 2, 100, 4, 2, 16, 16);
    float *o = malloc(sizeof(float) * c.no), *l = malloc(sizeof(float) * c.N * 4), *g = malloc(sizeof(float) * c.ng);
    float *o1 = malloc(sizeof(float) * c.no), *l1 = malloc(sizeof(float) * c.N * 4), *g1 = calloc(c.ng, sizeof(float));
    run(&c, o, l, g);
    const float *q = c.qkv, *k = q + 4 * 16, *v = k + 2 * 16;
    hp_attention_forward(o1, l1, q, c.ld, k, c.ld, v, c.ld, 2, 100, 4, 2, 16);
    for (size_t r = 0; r < c.N; r++)
        for (int d = 0; d < c.ldg; d++) g1[r * c.ldg + d] = d < 8 * 16 ? 1e30f : 0.0f;
    hp_attention_backward(g1, c.ldg, g1 + 64, c.ldg, g1 + 96, c.ldg, c.dout, o1, l1, q, c.ld, k, c.ld, v, c.ld, 2, 100,
                          4, 2, 16);
    HP_CHECK(!memcmp(o, o1, sizeof(float) * c.no) && !memcmp(l, l1, sizeof(float) * c.N * 4) &&
             !memcmp(g, g1, sizeof(float) * c.ng), "%s: hv == hd differs from hp_attention_*", path);
    free(o); free(l); free(g); free(o1); free(l1); free(g1);
    case_free(&c);
}

static void check_negative(const case_t *c) {
    float *o = malloc(sizeof(float) * c->no);
    memcpy(o, c->o_ref, sizeof(float) * c->no);
    HP_CHECK(close_ratio(o, c->o_ref, c->no, FWD_RTOL, FWD_ATOL) == 0.0, "identical arrays give ratio 0");
    o[c->no / 2] += (float)(10.0 * (FWD_ATOL + FWD_RTOL * fabs((double)o[c->no / 2])));
    HP_CHECK(!(close_ratio(o, c->o_ref, c->no, FWD_RTOL, FWD_ATOL) <= 1.0), "an injected error of 10x passed");
    free(o);
}

int main(void) {
    const hp_nn_isa_t start = hp_nn_isa();
    hp_nn_isa_t paths[8];
    int npaths = 0;
    for (int p = HP_NN_ISA_PORTABLE; p < HP_NN_ISA_PORTABLE + 8; p++)   // every path this CPU and build have
        if (hp_nn_set_isa((hp_nn_isa_t)p) == HP_OK) paths[npaths++] = (hp_nn_isa_t)p;
    HP_CHECK(npaths >= 1, "the portable path exists");
    const hp_backend_t *be = hp_backend_cpu();
    HP_CHECK(be->attention_qk_v_forward && be->attention_qk_v_backward, "the CPU backend has the qk_v slots");
    static const int widths[][2] = {{192, 128}, {24, 16}, {16, 24}, {12, 8}, {6, 10}};
    static const int Ts[] = {1, 7, 100, 130};
    int ncase = 0;
    for (size_t a = 0; a < sizeof widths / sizeof widths[0]; a++)
        for (int rep = 1; rep <= 2; rep++)
            for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
                const int hd = widths[a][0], hv = widths[a][1], T = Ts[t];
                if (hd == 192 && (T == 7 || rep == 2)) continue;   // the large width: fewer shapes
                case_t c;
                case_init(&c, 2, T, 2 * rep, 2, hd, hv);
                for (int p = 0; p < npaths; p++) {
                    HP_CHECK(hp_nn_set_isa(paths[p]) == HP_OK, "set %s", hp_nn_isa_name(paths[p]));
                    check_case(&c, hp_nn_isa_name(paths[p]));
                    check_padded(&c, hp_nn_isa_name(paths[p]));
                    if (T >= 100 && rep == 2) check_threads(&c, hp_nn_isa_name(paths[p]));
                }
                if (!ncase++) check_negative(&c);
                case_free(&c);
            }
    {   // a long sequence: the schedules on contiguous copies of K, V (and dK, dV)
        case_t c;
        case_init(&c, 2, 520, 4, 2, 24, 16);
        for (int p = 0; p < npaths; p++) {
            HP_CHECK(hp_nn_set_isa(paths[p]) == HP_OK, "set");
            check_case(&c, hp_nn_isa_name(paths[p]));
            check_padded(&c, hp_nn_isa_name(paths[p]));
            check_threads(&c, hp_nn_isa_name(paths[p]));
        }
        case_free(&c);
    }
    for (int p = 0; p < npaths; p++) {
        HP_CHECK(hp_nn_set_isa(paths[p]) == HP_OK, "set");
        check_equal_widths(hp_nn_isa_name(paths[p]));
    }
    HP_CHECK(hp_nn_set_isa(start) == HP_OK, "restore");
    printf("attention qk_v: %d shapes x %d path(s); worst error ratio forward %.3g, backward %.3g (<= 1 passes)\n",
           ncase, npaths, worst_fwd, worst_bwd);
    return hp_test_finish("test_attention_qk_v");
}
