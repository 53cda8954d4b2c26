/* The CPU backend's one door to BLAS (defined in blas.c, with the kernel family check): a single row-major cblas_sgemm
 * call and OpenBLAS's thread count. Only the CPU kernels (src/nn) include this; code outside
 * them reaches a GEMM through the kernel table (backend.h: gemm, set_num_threads). */
#ifndef HP_NN_BLAS_H
#define HP_NN_BLAS_H

/* c (M, N) = alpha op(a) op(b) + beta c, row-major; op = transpose when trans_a / trans_b
 * (backend.h's gemm slot). Exactly one cblas_sgemm call with these arguments. */
void hp_cpu_sgemm(float *c, int ldc, const float *a, int lda, const float *b, int ldb, int M, int N, int K,
                  int trans_a, int trans_b, float alpha, float beta);
/* OpenBLAS's own thread count (openblas_set_num_threads / openblas_get_num_threads). */
void hp_cpu_blas_set_num_threads(int n);
int hp_cpu_blas_get_num_threads(void);

/* Tests of the kernel family check (blas.c): select an OpenBLAS family by name as
 * OPENBLAS_CORETYPE would (HP_ERR_UNSUPPORTED where the library cannot switch or runs another
 * family then), and run the load-time check again as at load, ignoring OPENBLAS_CORETYPE. Not
 * to be called while a GEMM runs. */
#include "hyperparallel/status.h"
hp_status_t hp_cpu_blas_select_family(const char *name);
void hp_cpu_blas_recheck(void);

#endif
