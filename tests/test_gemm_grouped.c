// The grouped GEMM of the MoE experts (backend.h gemm_grouped; the CPU's hp_gemm_grouped): the
// groups of an expert pass (M from 0 to 257 rows, among them the 16-row block edges and the
// 32-row split threshold; the forward, input- and weight-gradient shapes: both transposes) are
// bitwise equal to the per-expert hp_linear_* calls the MoE made before (so its numerics do not
// change) at 1, 2 and 3 threads; the grouped path, and the slot's documented default
// (hp_backend_gemm_grouped on a table without gemm_grouped: one gemm call per group, whose
// OpenBLAS blocking may differ), against the double twin hp_ref_gemm_grouped within the derived
// bound; beta 0 overwrites; more blocks than one team takes (several teams) give the same bits;
// an injected error fails the harness.
// hp-test: ranks 1 timeout 300
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/backend.h"
#include "hyperparallel/nn.h"
#include "hp_test.h"
#include "hp_test_rand.h"

static uint64_t rng_state = 0xD1B54A32D192ED03ull;
static float frand(void) { return hp_test_frand(&rng_state); }   // uniform in [-1, 1)

/* Each f32 result sums K products in some order (blocked by the BLAS): |error| <= gamma_K
 * sum_k |a||b| with gamma_K = K u / (1 - K u), u = 2^-24; plus the rounding of the beta term.
 * The check uses that bound per element (|a|, |b| < 1, so sum |a||b| <= K), times 2 for the
 * beta sum: a bound, not a guess, and a wrong product is off by O(1). */
static double bound(int K) {
    const double u = ldexp(1.0, -24), g = K * u / (1.0 - K * u);
    return 2.0 * (g * K + u * 2.0) + 1e-30;
}

typedef struct {
    int n;
    hp_gemm_group_t g[512];
    float *a, *b, *c0;   // operands and the starting c of every group, one buffer each
    size_t na, nb, nc;
} pass_t;

/* Groups of one expert pass: E groups of rows M[e] (the rows of expert e), op(a) (M, K) from a
 * shared row buffer, b per group (the expert's weight), c disjoint. trans_a: the weight-gradient
 * shape (M, N fixed per group, the rows are K). */
static void pass_init(pass_t *p, const int *rows, int E, int D, int F, int ta, int tb) {
    memset(p, 0, sizeof(*p));
    int R = 0;
    for (int e = 0; e < E; e++) R += rows[e];
    p->na = (size_t)(R > 0 ? R : 1) * (D > F ? D : F);
    p->nb = ta ? (size_t)(R > 0 ? R : 1) * D : (size_t)E * D * F;   // dW: the input rows; else the weights
    p->nc = ta ? (size_t)E * D * F : (size_t)(R > 0 ? R : 1) * F;
    p->a = malloc(sizeof(float) * p->na);
    p->b = malloc(sizeof(float) * p->nb);
    p->c0 = malloc(sizeof(float) * p->nc);
    for (size_t i = 0; i < p->na; i++) p->a[i] = frand();
    for (size_t i = 0; i < p->nb; i++) p->b[i] = frand();
    for (size_t i = 0; i < p->nc; i++) p->c0[i] = frand();
    int r0 = 0;
    for (int e = 0; e < E; e++) {
        hp_gemm_group_t *g = &p->g[p->n++];
        const float *w = p->b + (size_t)e * D * F;
        if (ta) {   // dW (F, D) += dh^T (F, n) x (n, D): a = dh rows (n, F), b = x rows (n, D)
            *g = (hp_gemm_group_t){.c = p->c0 + (size_t)e * F * D, .a = p->a + (size_t)r0 * F,
                                   .b = p->b + (size_t)r0 * D, .M = F, .N = D,
                                   .K = rows[e], .ldc = D, .lda = F, .ldb = D};
        } else if (tb) {   // h (n, F) = x (n, D) W^T, W (F, D)
            *g = (hp_gemm_group_t){.c = p->c0 + (size_t)r0 * F, .a = p->a + (size_t)r0 * D, .b = w, .M = rows[e], .N = F,
                                   .K = D, .ldc = F, .lda = D, .ldb = D};
        } else {   // h (n, F) = dy (n, D) W, W (D, F)
            *g = (hp_gemm_group_t){.c = p->c0 + (size_t)r0 * F, .a = p->a + (size_t)r0 * D, .b = w, .M = rows[e], .N = F,
                                   .K = D, .ldc = F, .lda = D, .ldb = F};
        }
        r0 += rows[e];
    }
}

/* The groups rebased onto another c buffer (same offsets). */
static void rebase(const pass_t *p, hp_gemm_group_t *g, float *c) {
    for (int i = 0; i < p->n; i++) {
        g[i] = p->g[i];
        g[i].c = c + (p->g[i].c - p->c0);
    }
}

static void check_pass(const int *rows, int E, int D, int F, int ta, int tb, float beta, const char *what) {
    static pass_t p;
    pass_init(&p, rows, E, D, F, ta, tb);
    const hp_backend_t *cpu = hp_backend_cpu();
    hp_backend_t nodefault = *cpu;
    nodefault.gemm_grouped = NULL;
    static hp_gemm_group_t g[512];
    float *c_grp = malloc(sizeof(float) * p.nc), *c_one = malloc(sizeof(float) * p.nc), *c_ref = malloc(sizeof(float) * p.nc);
    float *c_def = malloc(sizeof(float) * p.nc), *c_t = malloc(sizeof(float) * p.nc);
    // the per-expert linear calls of the MoE before the grouped slot (hp_linear_*: rows split
    // over the threads); forward x W^T (beta 0 / 1), input gradient dy W, weight gradient (+=)
    const int nt = omp_get_max_threads();
    for (int t = 1; t <= 3; t++) {
        omp_set_num_threads(t);
        memcpy(c_one, p.c0, sizeof(float) * p.nc);
        rebase(&p, g, c_one);
        int have = 1;
        for (int i = 0; i < p.n; i++) {
            const hp_gemm_group_t *q = &g[i];
            if (q->M <= 0 || q->N <= 0) continue;
            if (tb && beta == 0.0f) hp_linear_forward(q->c, q->a, q->b, NULL, q->M, q->K, q->N);
            else if (tb) hp_linear_forward_acc(q->c, q->a, q->b, NULL, q->M, q->K, q->N);
            else if (!ta) hp_linear_backward_input(q->c, q->a, q->b, q->M, q->N, q->K, beta != 0.0f);
            else if (beta != 0.0f) hp_linear_backward_weight(q->c, NULL, q->a, q->b, q->K, q->N, q->M);
            else have = 0;   // dW with beta 0: no linear call of that shape
        }
        memcpy(c_t, p.c0, sizeof(float) * p.nc);
        rebase(&p, g, c_t);
        hp_backend_gemm_grouped(cpu, g, p.n, ta, tb, 1.0f, beta);
        if (have) HP_CHECK(!memcmp(c_t, c_one, sizeof(float) * p.nc), "%s: %d threads: grouped differs from the "
                           "per-expert linear calls", what, t);
        if (t == 2) memcpy(c_grp, c_t, sizeof(float) * p.nc);
    }
    omp_set_num_threads(nt);
    // the default of a table without the slot: one gemm per group
    memcpy(c_def, p.c0, sizeof(float) * p.nc);
    rebase(&p, g, c_def);
    hp_backend_gemm_grouped(&nodefault, g, p.n, ta, tb, 1.0f, beta);
    // the twin, within the bound
    memcpy(c_ref, p.c0, sizeof(float) * p.nc);
    rebase(&p, g, c_ref);
    hp_ref_gemm_grouped(g, p.n, ta, tb, 1.0f, beta);
    double worst = 0.0;
    for (int i = 0; i < p.n; i++) {
        const double b = bound(p.g[i].K > 0 ? p.g[i].K : 1);
        const size_t off = (size_t)(p.g[i].c - p.c0);
        for (int r = 0; r < p.g[i].M; r++)
            for (int cc = 0; cc < p.g[i].N; cc++) {
                const size_t k = off + (size_t)r * p.g[i].ldc + cc;
                worst = fmax(worst, fabs((double)c_grp[k] - c_ref[k]) / b);
                worst = fmax(worst, fabs((double)c_def[k] - c_ref[k]) / b);
            }
    }
    HP_CHECK(worst <= 1.0, "%s: error %.3g of the bound against the double twin", what, worst);
    if (beta == 0.0f) {   // beta 0 overwrites: the starting c (random) must not matter
        for (size_t i = 0; i < p.nc; i++) c_t[i] = 1e30f;
        rebase(&p, g, c_t);
        const int nt0 = omp_get_max_threads();
        omp_set_num_threads(2);
        hp_gemm_grouped(g, p.n, ta, tb, 1.0f, 0.0f);
        omp_set_num_threads(nt0);
        int same = 1;
        for (int i = 0; i < p.n; i++) {
            const size_t off = (size_t)(p.g[i].c - p.c0);
            for (int r = 0; r < p.g[i].M; r++)
                same &= !memcmp(c_t + off + (size_t)r * p.g[i].ldc, c_grp + off + (size_t)r * p.g[i].ldc,
                                sizeof(float) * p.g[i].N);
        }
        HP_CHECK(same, "%s: beta 0 does not overwrite", what);
    }
    free(c_grp); free(c_one); free(c_ref); free(c_def); free(c_t);
    free(p.a); free(p.b); free(p.c0);
}

int main(void) {
    // routed rows of 8 experts: empty, tiny, the 16-row block and 32-row split edges, large
    static const int rows[][8] = {{0, 1, 5, 31, 32, 33, 100, 257}, {64, 64, 64, 64, 64, 64, 64, 64},
                                  {700, 0, 0, 3, 0, 0, 17, 0}};
    char what[96];
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
        for (int shape = 0; shape < 3; shape++) {
            const int ta = shape == 2, tb = shape == 0;
            for (int bi = 0; bi < 2; bi++) {
                snprintf(what, sizeof what, "rows %zu %s beta %d", r, shape == 0 ? "x W^T" : shape == 1 ? "dy W" : "dW",
                         bi);
                check_pass(rows[r], 8, 48, 40, ta, tb, (float)bi, what);
            }
        }
    {   // more blocks than one team takes (1024): 400 groups of >= 32 rows x 3 threads
        static int many[400];
        for (int e = 0; e < 400; e++) many[e] = 32 + e % 9;
        const int nt = omp_get_max_threads();
        omp_set_num_threads(3);
        check_pass(many, 400, 16, 24, 0, 1, 0.0f, "400 groups");
        omp_set_num_threads(nt);
    }
    {   // the harness: a product off by far less than O(1) but above the bound fails
        const double b = bound(48);
        HP_CHECK(b < 1e-3, "the bound at K 48 is %.3g, small enough to see a wrong product", b);
        const float x = 0.5f, y = x + (float)(10 * b);
        HP_CHECK(fabs((double)y - x) / b > 1.0, "an injected error of 10x the bound would pass");
    }
    return hp_test_finish("test_gemm_grouped");
}
