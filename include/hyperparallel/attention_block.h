/* Block attention kernels for context parallelism (cp.h): one sequence's query block against
 * one key/value block with an explicit mask mode, out + lse in f32, the matching backward
 * that accumulates dQ/dK/dV, and the log-sum-exp merge of two partial results. QK^T, PV and
 * the backward products go through BLAS sgemm; each kernel has a plain double reference twin
 * (hp_ref_attn_block_*) that tests/test_attention_block.c compares it with. These are the CPU
 * backend's kernels: the library reaches them through the kernel table (backend.h:
 * attn_block_forward / _backward / _merge), so a device backend replaces them. */
#ifndef HYPERPARALLEL_ATTENTION_BLOCK_H
#define HYPERPARALLEL_ATTENTION_BLOCK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which keys of the block a query row sees. CAUSAL is the diagonal block (Tq == Tk, query i
 * sees keys 0..i); FULL sees every key; SKIP sees none (out = 0, lse = -inf). */
typedef enum hp_attn_mask {
    HP_ATTN_MASK_CAUSAL = 0,
    HP_ATTN_MASK_FULL = 1,
    HP_ATTN_MASK_SKIP = 2
} hp_attn_mask_t;

/* Floats of scratch the optimised kernels need for a (Tq, Tk) block: two (Tq, Tk) score
 * matrices per OpenMP thread. */
size_t hp_attn_block_scratch_floats(int Tq, int Tk);

/* q (Tq, Hq, hd) at row stride ldq, k / v (Tk, Hkv, hd) at row strides ldk / ldv (query head h
 * reads kv head h / (Hq / Hkv)); out (Tq, Hq, hd) (=) at row stride ldo; lse (Hq, Tq) (=) at
 * head stride ldl, natural log. Softmax scale 1/sqrt(hd). Parallel over query heads. */
void hp_attn_block_forward(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *k,
                           int ldk, const float *v, int ldv, int Tq, int Tk, int Hq, int Hkv, int hd,
                           hp_attn_mask_t mask, float *scratch);
/* Backward of one block given the final (merged over every block) out and lse of the query
 * rows: dq (Tq, Hq, hd) +=, dk / dv (Tk, Hkv, hd) +=. Parallel over kv heads (each task owns
 * dK, dV of its kv head and dQ of its query heads: no atomics). SKIP does nothing. */
void hp_attn_block_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv, const float *dout,
                            int lddo, const float *out, int ldo, const float *lse, int ldl, const float *q, int ldq,
                            const float *k, int ldk, const float *v, int ldv, int Tq, int Tk, int Hq, int Hkv,
                            int hd, hp_attn_mask_t mask, float *scratch);
/* Merges a block result into an accumulated one (f32, PyTorch's form):
 * out -= sigmoid(lse_b - lse) (out - out_b); lse -= logsigmoid(lse - lse_b). An accumulator
 * with lse = -inf (nothing seen yet) takes the block as is. out (T, H, hd) at ldo, out_b at
 * ldb; lse / lse_b (H, T) at head strides ldl / ldlb. */
void hp_attn_block_merge(float *out, int ldo, float *lse, int ldl, const float *out_b, int ldb, const float *lse_b,
                         int ldlb, int T, int H, int hd);

/* References in double: the same contracts, no scratch. */
void hp_ref_attn_block_forward(float *out, int ldo, float *lse, int ldl, const float *q, int ldq, const float *k,
                               int ldk, const float *v, int ldv, int Tq, int Tk, int Hq, int Hkv, int hd,
                               hp_attn_mask_t mask);
void hp_ref_attn_block_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv, const float *dout,
                                int lddo, const float *out, int ldo, const float *lse, int ldl, const float *q,
                                int ldq, const float *k, int ldk, const float *v, int ldv, int Tq, int Tk, int Hq,
                                int Hkv, int hd, hp_attn_mask_t mask);

#ifdef __cplusplus
}
#endif
#endif
