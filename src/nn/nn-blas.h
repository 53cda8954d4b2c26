/* The CPU backend's one door to BLAS (defined in kernels.c): a single row-major cblas_sgemm
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

#endif
