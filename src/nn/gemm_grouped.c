/* The CPU's grouped GEMM (backend.h gemm_grouped, used by the MoE experts) and its double
 * reference twin. Every group's product runs in one OpenMP team instead of a fork and join per
 * group: each group's M rows are split as hp_linear_* split them (one block per thread, blocks
 * of whole 16-row micro-tiles; a group of fewer than 32 rows stays whole), and the blocks of all
 * groups are dealt to the threads, largest cost to the least-loaded thread. Each block is one
 * single-threaded cblas_sgemm over the whole K, the call hp_linear_* makes for it, so every
 * element is the same sum in the same order as a per-group call: the result does not depend on
 * the thread count or the deal. */
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/backend.h"
#include "hyperparallel/nn.h"
#include "nn/nn-blas.h"

enum { GG_BATCH = 1024, GG_MAX_THREADS = 256 };

/* One block: rows [m0, m1) of group g. */
typedef struct {
    int g, m0, m1;
    double cost;
} gg_task_t;

static void gg_run(const hp_gemm_group_t *g, int m0, int m1, int ta, int tb, float alpha, float beta) {
    const float *a = ta ? g->a + m0 : g->a + (size_t)m0 * g->lda;   // op(a) row m0: a column when transposed
    hp_cpu_sgemm(g->c + (size_t)m0 * g->ldc, g->ldc, a, g->lda, g->b, g->ldb, m1 - m0, g->N, g->K, ta, tb, alpha,
                 beta);
}

static int gg_cost_desc(const void *x, const void *y) {
    const gg_task_t *a = x, *b = y;
    if (a->cost != b->cost) return a->cost < b->cost ? 1 : -1;
    return a->g != b->g ? a->g - b->g : a->m0 - b->m0;   // a total order: the deal is deterministic
}

/* Runs tasks t[0, k) on nt threads: sorted by cost, the largest to the least-loaded thread. */
static void gg_deal(const hp_gemm_group_t *groups, gg_task_t *t, int k, int nt, int ta, int tb, float alpha,
                    float beta) {
    int owner[GG_BATCH];
    double load[GG_MAX_THREADS] = {0};
    qsort(t, (size_t)k, sizeof(gg_task_t), gg_cost_desc);
    for (int j = 0; j < k; j++) {
        int best = 0;
        for (int q = 1; q < nt; q++) best = load[q] < load[best] ? q : best;
        owner[j] = best;
        load[best] += t[j].cost;
    }
#pragma omp parallel num_threads(nt)
    {
        const int me = omp_get_thread_num();
        for (int j = 0; j < k; j++)
            if (owner[j] == me && t[j].m1 > t[j].m0) gg_run(&groups[t[j].g], t[j].m0, t[j].m1, ta, tb, alpha, beta);
    }
}

void hp_gemm_grouped(const hp_gemm_group_t *groups, int n, int trans_a, int trans_b, float alpha, float beta) {
    int nt = omp_in_parallel() ? 1 : omp_get_max_threads();
    nt = nt < GG_MAX_THREADS ? nt : GG_MAX_THREADS;
    if (nt <= 1) {   // one thread: the groups in order
        for (int i = 0; i < n; i++)
            if (groups[i].M > 0 && groups[i].N > 0) gg_run(&groups[i], 0, groups[i].M, trans_a, trans_b, alpha, beta);
        return;
    }
    gg_task_t t[GG_BATCH];   // the step allocates nothing: more blocks than this run as several teams
    int k = 0;
    const int blas_threads = hp_cpu_blas_get_num_threads();
    if (blas_threads != 1) hp_cpu_blas_set_num_threads(1);
    for (int i = 0; i < n; i++) {
        const hp_gemm_group_t *g = &groups[i];
        if (g->M <= 0 || g->N <= 0) continue;
        const int parts = g->M >= 32 ? nt : 1;
        if (k + parts > GG_BATCH) {
            gg_deal(groups, t, k, nt, trans_a, trans_b, alpha, beta);
            k = 0;
        }
        const double per_row = (double)g->N * (g->K > 0 ? g->K : 1);
        int chunk = (g->M + parts - 1) / parts;
        if (parts > 1) chunk = (chunk + 15) / 16 * 16;   // whole micro-tiles per block, as hp_linear_*
        for (int j = 0; j < parts; j++) {
            const int m0 = j * chunk < g->M ? j * chunk : g->M, m1 = m0 + chunk < g->M ? m0 + chunk : g->M;
            t[k++] = (gg_task_t){i, m0, m1, per_row * (m1 - m0)};
        }
    }
    if (k > 0) gg_deal(groups, t, k, nt, trans_a, trans_b, alpha, beta);
    if (blas_threads != 1) hp_cpu_blas_set_num_threads(blas_threads);   // leave the caller's setting
}

void hp_ref_gemm_grouped(const hp_gemm_group_t *groups, int n, int trans_a, int trans_b, float alpha, float beta) {
    for (int i = 0; i < n; i++) {
        const hp_gemm_group_t *g = &groups[i];
        for (int r = 0; r < g->M; r++)
            for (int c = 0; c < g->N; c++) {
                double acc = 0.0;
                for (int q = 0; q < g->K; q++) {
                    const double av = trans_a ? g->a[(size_t)q * g->lda + r] : g->a[(size_t)r * g->lda + q];
                    const double bv = trans_b ? g->b[(size_t)c * g->ldb + q] : g->b[(size_t)q * g->ldb + c];
                    acc += av * bv;
                }
                float *o = g->c + (size_t)r * g->ldc + c;
                *o = (float)(alpha * acc + (beta != 0.0f ? (double)beta * *o : 0.0));
            }
    }
}
