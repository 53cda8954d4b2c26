/* Causal attention (MHA / GQA) as a tiled online-softmax kernel (FlashAttention-2 style):
 * forward keeps only the output and the per-row log-sum-exp; backward recomputes the
 * probabilities tile by tile. No (T, T) matrix is ever stored. Reference twin: kernels_ref.c.
 *
 * The tile products run in a register-blocked micro-kernel (attention-tiles.h), instantiated
 * per ISA path and chosen at run time (hp_nn_isa, isa.c): AVX-512 (16 lanes, 8 x 32 micro-tiles,
 * head_dim % 16 == 0), AVX2+FMA (head_dim % 8 == 0; also what an AVX-512 CPU runs for other
 * head_dims) and a portable one (4-wide GCC vectors: SSE2 / NEON; scalar for head_dim % 4 != 0). Why not
 * cblas_sgemm per tile: at these tile shapes (64 x 64 x 16 .. 64 x 64 x 128) OpenBLAS packs
 * both operands and makes a beta pass per call: on one Zen 3 thread 30-37 GFLOP/s for S = Q K^T
 * at head_dim 16 and 40-83 for the others, against 63-88 for this micro-kernel in the same runs
 * (bench_attention --tiles, docs/performance.md "Attention on AVX2"); the micro-kernel also
 * applies the causal mask per micro-tile and reads P^T, dS^T in place.
 * Scratch is per task on the stack (sized by head_dim), so nothing is allocated. The backward
 * runs fused per (batch, kv head), or split into a dK/dV pass over key tiles and a dQ pass over
 * query tiles when there are fewer groups than threads (hp_attention_set_backward).
 *
 * hp_attention_decode_forward serves inference (KV cache, model.h): a few new query rows
 * against cached keys/values, one plain score row per (row, head). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "hyperparallel/nn.h"
#include "nn/nn-math.h"

/* Query rows and keys per tile: the (BC, BR) transposed score tile, the (hd, BR) packed query
 * tile and the (BC, hd) value rows stay in L1/L2; 64 keys amortise the online-softmax rescale
 * of the output rows. (48 and 96 measured no better, docs/performance.md.) */
enum { HP_ATT_BR = 64, HP_ATT_BC = 64 };
/* Causal modes of a tile product (attention-tiles.h, gemm). */
enum { HP_ATT_DENSE, HP_ATT_QCOLS, HP_ATT_KEND, HP_ATT_KBEG };

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* AVX-512: 8 x 32 micro-tiles (16 zmm accumulators, 2 for the B row, 1 broadcast: 19 of 32
 * registers), 16 query rows' softmax statistics per vector */
#define HP_ATT_HAVE_AVX512 1
#define HP_T_SFX avx512
#define HP_T_VW 16
#define HP_T_NV 2
#define HP_T_MR 8
#define HP_T_ATTR __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512cd,avx2,fma")))
#define HP_T_FMA 1
#define HP_T_AVX_TRANSPOSE 1
#define HP_T_VMAX(a, b) ((VF)_mm512_max_ps((__m512)(a), (__m512)(b)))
#include "nn/attention-tiles.h"
#define HP_ATT_HAVE_AVX2 1
#define HP_T_SFX avx2
#define HP_T_VW 8
#define HP_T_NV 2
#define HP_T_MR 6
#define HP_T_ATTR __attribute__((target("avx2,fma")))
#define HP_T_FMA 1
#define HP_T_AVX_TRANSPOSE 1
#define HP_T_VMAX(a, b) ((VF)_mm256_max_ps((__m256)(a), (__m256)(b)))
#include "nn/attention-tiles.h"
#endif

#define HP_T_SFX generic4
#define HP_T_VW 4
#define HP_T_NV 2
#define HP_T_MR 4
#include "nn/attention-tiles.h"

#define HP_T_SFX generic1
#define HP_T_VW 1
#define HP_T_NV 2
#define HP_T_MR 4
#include "nn/attention-tiles.h"

typedef void (*hp_att_fwd_tile_fn)(float *out, int ldo, float *lse, const float *q, int ldq, const float *k, int ldk,
                                   const float *v, int ldv, int i0, int nr, int npre, int hd, float scale);
typedef void (*hp_att_bwd_group_fn)(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv, const float *dout,
                                    const float *out, int ldo, const float *lse, const float *q, int ldq,
                                    const float *k, int ldk, const float *v, int ldv, int T, int rep, int hd,
                                    float scale);
typedef void (*hp_att_bwd_kv_fn)(float *dk, int lddk, float *dv, int lddv, const float *dout, const float *out,
                                 int ldo, const float *lse, const float *q, int ldq, const float *k, int ldk,
                                 const float *v, int ldv, int T, int rep, int hd, float scale, int j0);
typedef void (*hp_att_bwd_q_fn)(float *dq, int lddq, const float *dout, const float *out, int ldo, const float *lse,
                                const float *q, int ldq, const float *k, int ldk, const float *v, int ldv, int T,
                                int hd, float scale, int i0);

static int bwd_mode = HP_ATTENTION_BWD_AUTO;   // hp_attention_set_backward

/* Long sequences: a (batch, kv head) group's K, V rows and its dK, dV sums are used again by
 * every later query tile, but in the model's activations they lie one row of all heads apart
 * (3 KB at the debugmodel's fused QKV), a stride that maps a head's rows onto 1/16 of the L2
 * sets and a page each, so past T ~ 512 they no longer stay in cache and the hardware
 * prefetchers do not follow them. The fused backward then runs on contiguous (T, hd) copies
 * (same arithmetic, only the strides differ: the same bits). The copies live in a per-thread
 * workspace allocated on first use and kept (grown when T * hd grows), so the step loop
 * allocates only in its first step; if the allocation fails, the strided path runs. */
enum { HP_ATT_CONTIG_MIN_T = 512 };
static _Thread_local float *att_ws;
static _Thread_local size_t att_ws_n;

static float *att_workspace(size_t n) {
    if (n <= att_ws_n) return att_ws;
    void *p = NULL;
    if (posix_memalign(&p, 64, n * sizeof(float)) != 0) return NULL;   // caller falls back, no error
    free(att_ws);
    att_ws = p;
    att_ws_n = n;
    return att_ws;
}

/* dst (n, hd) contiguous = src rows (stride ld); att_store_rows the other way. */
static void att_copy_rows(float *dst, const float *src, size_t ld, int n, int hd) {
    for (int r = 0; r < n; r++) memcpy(dst + (size_t)r * hd, src + (size_t)r * ld, sizeof(float) * (size_t)hd);
}
static void att_store_rows(float *dst, size_t ld, const float *src, int n, int hd) {
    for (int r = 0; r < n; r++) memcpy(dst + (size_t)r * ld, src + (size_t)r * hd, sizeof(float) * (size_t)hd);
}

hp_status_t hp_attention_set_backward(hp_attention_bwd_t mode) {
    if (mode != HP_ATTENTION_BWD_AUTO && mode != HP_ATTENTION_BWD_FUSED && mode != HP_ATTENTION_BWD_SPLIT)
        return hp_error(HP_ERR_INVALID_ARG, "hp_attention_set_backward: mode %d is not one of AUTO (0), FUSED (1), "
                        "SPLIT (2)", (int)mode);
    __atomic_store_n(&bwd_mode, (int)mode, __ATOMIC_RELAXED);
    return HP_OK;
}

/* The instantiation for this call: the selected ISA if head_dim fits its vectors. */
static int att_path(int hd) {
    const hp_nn_isa_t isa = hp_nn_isa();
#ifdef HP_ATT_HAVE_AVX512
    if (isa == HP_NN_ISA_AVX512 && hd % 16 == 0) return 3;
#endif
#ifdef HP_ATT_HAVE_AVX2
    if ((isa == HP_NN_ISA_AVX2 || isa == HP_NN_ISA_AVX512) && hd % 8 == 0) return 2;
#endif
    return hd % 4 == 0 ? 1 : 0;
}

void hp_attention_forward(float *out, float *lse, const float *q, int ldq, const float *k, int ldk,
                          const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd) {
    const float scale = 1.0f / sqrtf((float)hd);
    const int rep = Hq / Hkv, ldo = Hq * hd, nqt = (T + HP_ATT_BR - 1) / HP_ATT_BR, path = att_path(hd);
    hp_att_fwd_tile_fn tile = path == 1 ? fwd_tile_generic4 : fwd_tile_generic1;
#ifdef HP_ATT_HAVE_AVX2
    if (path == 2) tile = fwd_tile_avx2;
#endif
#ifdef HP_ATT_HAVE_AVX512
    if (path == 3) tile = fwd_tile_avx512;
#endif
    const long nbh = (long)B * Hq, ntask = nqt * nbh;
    // parallel over (b, head, query tile); each task writes its own out rows and lse entries.
    // With many (b, head) pairs a thread takes all tiles of one in order (its K, V stay in
    // cache); with few, single tiles, the costliest (last) first.
    const int whole = nbh >= 4L * omp_get_max_threads();
    if (whole && T >= HP_ATT_CONTIG_MIN_T && (ldk != hd || ldv != hd)) {
        // long sequences: one (b, head) per task on contiguous copies of its K, V rows
        // (att_workspace); the same tiles in the same order, so the same bits
#pragma omp parallel for schedule(dynamic, 1)
        for (long bh = 0; bh < nbh; bh++) {
            const int b = (int)(bh / Hq), h = (int)(bh % Hq), g = h / rep;
            const size_t r0 = (size_t)b * T, th = (size_t)T * hd;
            const float *gk = k + r0 * ldk + (size_t)g * hd, *gv = v + r0 * ldv + (size_t)g * hd;
            float *ws = att_workspace(2 * th);   // (T, hd) K, V
            if (ws) {
                att_copy_rows(ws, gk, (size_t)ldk, T, hd);
                att_copy_rows(ws + th, gv, (size_t)ldv, T, hd);
            }
            for (int qt = 0; qt < nqt; qt++) {
                const int i0 = qt * HP_ATT_BR, nr = T - i0 < HP_ATT_BR ? T - i0 : HP_ATT_BR;
                const int rest = T - i0 - nr, npre = rest < HP_ATT_BR ? rest : HP_ATT_BR;
                tile(out + r0 * ldo + (size_t)h * hd, ldo, lse + ((size_t)b * Hq + h) * T,
                     q + r0 * ldq + (size_t)h * hd, ldq, ws ? ws : gk, ws ? hd : ldk, ws ? ws + th : gv,
                     ws ? hd : ldv, i0, nr, npre, hd, scale);
            }
        }
        return;
    }
#pragma omp parallel for schedule(dynamic, whole ? nqt : 1)
    for (long t = 0; t < ntask; t++) {
        const long bh = whole ? t / nqt : t % nbh;
        const int qt = whole ? (int)(t % nqt) : nqt - 1 - (int)(t / nbh);
        const int b = (int)(bh / Hq), h = (int)(bh % Hq), g = h / rep;
        const int i0 = qt * HP_ATT_BR, nr = T - i0 < HP_ATT_BR ? T - i0 : HP_ATT_BR;
        const int rest = T - i0 - nr, npre = !whole ? 0 : rest < HP_ATT_BR ? rest : HP_ATT_BR;
        const size_t r0 = (size_t)b * T;
        tile(out + r0 * ldo + (size_t)h * hd, ldo, lse + ((size_t)b * Hq + h) * T, q + r0 * ldq + (size_t)h * hd, ldq,
             k + r0 * ldk + (size_t)g * hd, ldk, v + r0 * ldv + (size_t)g * hd, ldv, i0, nr, npre, hd, scale);
    }
}

void hp_attention_backward(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                           const float *dout, const float *out,
                           const float *lse, const float *q, int ldq, const float *k, int ldk,
                           const float *v, int ldv, int B, int T, int Hq, int Hkv, int hd) {
    const float scale = 1.0f / sqrtf((float)hd);
    const int rep = Hq / Hkv, ldo = Hq * hd, path = att_path(hd);
    hp_att_bwd_group_fn group = path == 1 ? bwd_group_generic4 : bwd_group_generic1;
    hp_att_bwd_kv_fn kvf = path == 1 ? bwd_kv_generic4 : bwd_kv_generic1;
    hp_att_bwd_q_fn qf = path == 1 ? bwd_q_generic4 : bwd_q_generic1;
#ifdef HP_ATT_HAVE_AVX2
    if (path == 2) group = bwd_group_avx2, kvf = bwd_kv_avx2, qf = bwd_q_avx2;
#endif
#ifdef HP_ATT_HAVE_AVX512
    if (path == 3) group = bwd_group_avx512, kvf = bwd_kv_avx512, qf = bwd_q_avx512;
#endif
    const int nt = T / HP_ATT_BR + (T % HP_ATT_BR != 0);   // query tiles = key tiles (BR == BC)
    const int mode = __atomic_load_n(&bwd_mode, __ATOMIC_RELAXED);
    // Split when some threads would get no (b, kv head) group: the two passes recompute the
    // scores (7 tile products per pair instead of 5), which pays only when the fused loop
    // leaves threads idle (B * Hkv = 1 on 2 threads: 3.5 against 5 units on the slowest one).
    const int split = mode == HP_ATTENTION_BWD_SPLIT ||
                      (mode == HP_ATTENTION_BWD_AUTO && nt >= 2 && (long)B * Hkv < omp_get_max_threads());
    if (split) {
        const long nkv = (long)B * Hkv * nt, nq = (long)B * Hq * nt;
        // pass 1, parallel over (b, kv head, key tile): the task owns dK, dV rows of its key
        // tile; the costliest (first, seen by every later query tile) first
#pragma omp parallel for schedule(dynamic, 1)
        for (long t = 0; t < nkv; t++) {
            const int jt = (int)(t / ((long)B * Hkv)), bg = (int)(t % ((long)B * Hkv));
            const int b = bg / Hkv, g = bg % Hkv;
            const size_t r0 = (size_t)b * T, h0 = (size_t)g * rep;
            kvf(dk + r0 * lddk + (size_t)g * hd, lddk, dv + r0 * lddv + (size_t)g * hd, lddv, dout + r0 * ldo + h0 * hd,
                out + r0 * ldo + h0 * hd, ldo, lse + ((size_t)b * Hq + h0) * T, q + r0 * ldq + h0 * hd, ldq,
                k + r0 * ldk + (size_t)g * hd, ldk, v + r0 * ldv + (size_t)g * hd, ldv, T, rep, hd, scale,
                jt * HP_ATT_BC);
        }
        // pass 2, parallel over (b, query head, query tile): the task owns dQ rows of its
        // query tile; the costliest (last, sees every key tile) first
#pragma omp parallel for schedule(dynamic, 1)
        for (long t = 0; t < nq; t++) {
            const int it = nt - 1 - (int)(t / ((long)B * Hq)), bh = (int)(t % ((long)B * Hq));
            const int b = bh / Hq, h = bh % Hq, g = h / rep;
            const size_t r0 = (size_t)b * T;
            qf(dq + r0 * lddq + (size_t)h * hd, lddq, dout + r0 * ldo + (size_t)h * hd, out + r0 * ldo + (size_t)h * hd,
               ldo, lse + ((size_t)b * Hq + h) * T, q + r0 * ldq + (size_t)h * hd, ldq, k + r0 * ldk + (size_t)g * hd,
               ldk, v + r0 * ldv + (size_t)g * hd, ldv, T, hd, scale, it * HP_ATT_BR);
        }
        return;
    }
    // parallel over (b, kv head): the task owns dK, dV of head g and dQ of heads g*rep.. so
    // every output element is written by exactly one task, in a fixed order
    const int contig = T >= HP_ATT_CONTIG_MIN_T && (ldk != hd || ldv != hd || lddk != hd || lddv != hd);
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int g = 0; g < Hkv; g++) {
            const size_t r0 = (size_t)b * T, h0 = (size_t)g * rep, th = (size_t)T * hd;
            float *gdk = dk + r0 * lddk + (size_t)g * hd, *gdv = dv + r0 * lddv + (size_t)g * hd;
            const float *gk = k + r0 * ldk + (size_t)g * hd, *gv = v + r0 * ldv + (size_t)g * hd;
            float *ws = contig ? att_workspace(4 * th) : NULL;   // (T, hd) K, V, dK, dV
            if (ws) {
                att_copy_rows(ws, gk, (size_t)ldk, T, hd);
                att_copy_rows(ws + th, gv, (size_t)ldv, T, hd);
                group(dq + r0 * lddq + h0 * hd, lddq, ws + 2 * th, hd, ws + 3 * th, hd, dout + r0 * ldo + h0 * hd,
                      out + r0 * ldo + h0 * hd, ldo, lse + ((size_t)b * Hq + h0) * T, q + r0 * ldq + h0 * hd, ldq, ws,
                      hd, ws + th, hd, T, rep, hd, scale);
                att_store_rows(gdk, (size_t)lddk, ws + 2 * th, T, hd);
                att_store_rows(gdv, (size_t)lddv, ws + 3 * th, T, hd);
                continue;
            }
            group(dq + r0 * lddq + h0 * hd, lddq, gdk, lddk, gdv, lddv, dout + r0 * ldo + h0 * hd,
                  out + r0 * ldo + h0 * hd, ldo, lse + ((size_t)b * Hq + h0) * T, q + r0 * ldq + h0 * hd, ldq, gk, ldk,
                  gv, ldv, T, rep, hd, scale);
        }
    }
}

void hp_attention_decode_forward(float *out, float *scratch, const float *q, int ldq, const float *k, int ldk,
                                 const float *v, int ldv, int p0, int n, int Hq, int Hkv, int hd,
                                 int n_threads) {
    const float scale = 1.0f / sqrtf((float)hd);
    const int rep = Hq / Hkv, len = p0 + n, max_t = omp_get_max_threads();
    const int nt = n_threads < max_t ? n_threads : max_t;
    // parallel over (new row, query head); each task writes its own out row and uses the
    // score row of its thread (scratch holds n_threads rows of p0 + n floats)
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt)
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < Hq; h++) {
            const int g = h / rep, nk = p0 + i + 1;   // causal: keys 0 .. p0 + i
            float *s = scratch + (size_t)omp_get_thread_num() * len;
            float qs[hd], acc[hd];
            const float *qi = q + (size_t)i * ldq + (size_t)h * hd;
            for (int d = 0; d < hd; d++) qs[d] = qi[d] * scale;   // scaled first, as the tiled kernel
            float mx = -INFINITY;
            for (int j = 0; j < nk; j++) {
                const float *kj = k + (size_t)j * ldk + (size_t)g * hd;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int d = 0; d < hd; d++) dot += qs[d] * kj[d];
                s[j] = dot;
                mx = dot > mx ? dot : mx;
            }
            float l = 0.0f;
#pragma omp simd reduction(+ : l)
            for (int j = 0; j < nk; j++) { s[j] = hp_nn_expf(s[j] - mx); l += s[j]; }
            memset(acc, 0, sizeof(float) * (size_t)hd);
            for (int j = 0; j < nk; j++) {
                const float *vj = v + (size_t)j * ldv + (size_t)g * hd;
                const float pj = s[j];
#pragma omp simd
                for (int d = 0; d < hd; d++) acc[d] += pj * vj[d];
            }
            float *oi = out + (size_t)i * Hq * hd + (size_t)h * hd;
            const float inv = 1.0f / l;
            for (int d = 0; d < hd; d++) oi[d] = acc[d] * inv;
        }
    }
}
