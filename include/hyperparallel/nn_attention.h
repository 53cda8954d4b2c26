/* nn: the causal attention kernels (MHA / GQA): the tiled flash forward and backward, the
 * KV-cache decode, and the plain double reference twins (src/nn/attention.c,
 * kernels_ref.c). */
#ifndef HYPERPARALLEL_NN_ATTENTION_H
#define HYPERPARALLEL_NN_ATTENTION_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernels: causal attention (MHA / GQA), flash-style ---------------------------------- */
/* q (B, T, Hq, hd) at row stride ldq, k/v (B, T, Hkv, hd) at row strides ldk/ldv,
 * out (B, T, Hq, hd) contiguous, lse (B, Hq, T) saved. Softmax scale 1/sqrt(hd). Tiled online
 * softmax: no (T, T) matrix is kept; parallel over (b, head, 64-row query tile). The AVX2 path
 * needs hd % 8 == 0 (else the portable one runs). Scratch lives on each task's stack, about
 * 0.75 KiB per unit of hd + 17 KiB (113 KiB at hd 128); nothing is allocated. Results do not
 * depend on the thread count. */
void hp_attention_forward(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                          const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd);
/* dq/dk/dv (=) at row strides lddq/lddk/lddv. Fused: parallel over (b, kv head), each task owns
 * dK, dV of its kv head and dQ of the query heads in its group, so no atomics. With fewer such
 * groups than threads (and T > 64) it splits instead: a dK/dV pass over (b, kv head, key tile)
 * and a dQ pass over (b, query head, query tile), each recomputing the scores (1.4x the tile
 * products); the two give the same bits. Stack scratch about 1.5 KiB per unit of hd + 33 KiB. */
/* AUTO (default): split as above; FUSED / SPLIT force one (tests, benchmarks); another value is
 * HP_ERR_INVALID_ARG. Not to be called while kernels run. */
typedef enum { HP_ATTENTION_BWD_AUTO = 0, HP_ATTENTION_BWD_FUSED, HP_ATTENTION_BWD_SPLIT } hp_attention_bwd_t;
hp_status_t hp_attention_set_backward(hp_attention_bwd_t mode);
void hp_attention_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                           const float *dout, const float *out,
                           const float *lse, const float *q, int ldq, const float *k, int ldk,
                           const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd);
/* Inference (KV cache): n new query rows at positions [p0, p0 + n) against a cache holding
 * keys/values of positions [0, p0 + n) (the new rows' own keys already written). q (n, Hq, hd)
 * at row stride ldq; k/v (p0 + n, Hkv, hd) at row strides ldk/ldv; out (n, Hq, hd) contiguous.
 * scratch: n_threads rows of (p0 + n) floats (one score row per thread); the loop runs on at
 * most n_threads threads (and at most omp_get_max_threads()). Causal, softmax scale 1/sqrt(hd), GQA (head h reads kv head
 * h / (Hq/Hkv)). Row i equals row p0 + i of hp_attention_forward up to float rounding. */
void hp_attention_decode_forward(float *out, float *scratch, const float *q, int ldq, const float *k, int ldk,
                                 const float *v, int ldv, int p0, int n, int Hq, int Hkv, int hd,
                                 int n_threads);
/* q|k heads hd wide, v and out heads hv wide (MLA: qk_nope + qk_rope and v_head_dim): q
 * (B, T, Hq, hd), k (B, T, Hkv, hd), v (B, T, Hkv, hv), out (B, T, Hq, hv) contiguous, lse as
 * above, softmax scale 1/sqrt(hd); backward dq/dk hd wide, dv hv wide (=). The same tiled
 * kernels with the V, O, dO, dV products at hv, so no zero channel is computed or moved (a
 * padded hv = hd run pays hd/hv on those products; bitwise the same as it when hv == hd, and for
 * hv < hd equal to padding V with zeros up to float rounding: the appended products are 0). The
 * ISA path needs both widths to fit its vectors (hd % 8 == hv % 8 == 0 for AVX2). */
void hp_attention_forward_qk_v(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                               const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd, int hv);
void hp_attention_backward_qk_v(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv, const float *dout,
                                const float *out, const float *lse, const float *q, int ldq, const float *k, int ldk,
                                const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd, int hv);
/* Reference: full (T, T) softmax per head, in double. */
void hp_ref_attention_forward(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                              const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd);
void hp_ref_attention_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                               const float *dout,
                               const float *q, int ldq, const float *k, int ldk,
                               const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd);
/* Reference twins of the _qk_v kernels (double, full softmax rows). */
void hp_ref_attention_qk_v_forward(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                                   const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd, int hv);
void hp_ref_attention_qk_v_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv, const float *dout,
                                    const float *q, int ldq, const float *k, int ldk, const float *v, int ldv, int B,
                                    int T, int Hq, int Hkv, int hd, int hv);

#ifdef __cplusplus
}
#endif
#endif
