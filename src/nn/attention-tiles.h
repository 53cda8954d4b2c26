/* Tile kernels of the causal flash attention (attention.c), written once over a vector width
 * and instantiated once per ISA path: attention.c includes this file several times, each
 * time with
 *   HP_T_SFX   suffix of the generated names (avx512, avx2, generic4, generic1)
 *   HP_T_VW    floats per vector (16: AVX-512 zmm; 8: AVX2 ymm; 4: SSE2 / NEON; 1: scalar, any head_dim)
 *   HP_T_NV    vectors per micro-tile column block (1 or 2)
 *   HP_T_MR    rows per micro-tile (4 to 8)
 * optionally HP_T_ATTR (a function attribute: __attribute__((target("avx2,fma")))), HP_T_FMA
 * (one fused exp reduction step), HP_T_VMAX(a, b) (a max instruction), HP_T_AVX_TRANSPOSE
 * (8 x 8 register transposes in the query pack, AVX intrinsics), and HP_ATT_BR / HP_ATT_BC
 * (query rows / keys per tile, multiples of 8), HP_ATT_* (causal modes). The HP_T_*
 * parameters are undefined again at the end, so the next instantiation starts clean.
 *
 * Layout: a tile's scores are kept transposed, S^T (keys, query rows) = K Q^T, so that the
 * softmax statistics (row max, sum, rescale factor) of HP_T_VW query rows sit in one vector
 * and every softmax step is a plain vector operation over keys, with no horizontal reduction;
 * K is read in place as the A operand (scalar broadcasts at any stride), so the transposed
 * side is the query tile, packed once per tile; B operands whose rows would lie a page apart
 * (V, and in the backward K, Q, dO) are copied contiguous. Every product of the forward (S^T = K Q^T,
 * O += P V) and backward (S^T, dP^T = V dO^T, dQ += dS K, dV += P^T dO, dK += dS^T Q) goes
 * through one register-blocked micro-kernel of HP_T_MR x (HP_T_NV * HP_T_VW) accumulators
 * (AVX-512: 8 x 32 floats = 16 zmm of 32; AVX2: 6 x 16 floats = 12 ymm, the Haswell sgemm shape, leaving 4 registers for the B row and
 * the A broadcast, so nothing spills). The causal mask is applied per micro-tile: blocks wholly
 * above the diagonal are not computed, and a row block's key (or query) range stops (starts)
 * at the first masked term. Exp is hp_nn_expf's polynomial, lane-wise. */

#ifndef HP_T_ATTR
#define HP_T_ATTR
#endif
#define HP_T_CAT_(a, b) a##_##b
#define HP_T_CAT(a, b) HP_T_CAT_(a, b)
#define HP_T_N(name) HP_T_CAT(name, HP_T_SFX)
#define HP_T_NB (HP_T_VW * HP_T_NV)
#define HP_T_INL static inline __attribute__((always_inline)) HP_T_ATTR

typedef float HP_T_N(vf) __attribute__((vector_size(HP_T_VW * 4), aligned(4), may_alias));
typedef int32_t HP_T_N(vi) __attribute__((vector_size(HP_T_VW * 4), aligned(4), may_alias));
typedef uint32_t HP_T_N(vu) __attribute__((vector_size(HP_T_VW * 4), aligned(4), may_alias));
#define VF HP_T_N(vf)
#define VI HP_T_N(vi)
#define VU HP_T_N(vu)
#define LD(p) (*(const VF *)(p))
#define ST(p, x) (*(VF *)(p) = (x))

HP_T_INL VF HP_T_N(vsel)(VI m, VF a, VF b) { return (VF)(((VI)a & m) | ((VI)b & ~m)); }   // m ? a : b
#ifdef HP_T_VMAX
HP_T_INL VF HP_T_N(vmax)(VF a, VF b) { return HP_T_VMAX(a, b); }
#else
HP_T_INL VF HP_T_N(vmax)(VF a, VF b) { return HP_T_N(vsel)(a > b, a, b); }
#endif
HP_T_INL VF HP_T_N(vsplat)(float x) { return (VF){0} + x; }
HP_T_INL VI HP_T_N(viota)(void) {
    VI iota;
    for (int l = 0; l < HP_T_VW; l++) iota[l] = l;
    return iota;
}

/* exp(x) lane-wise for softmax arguments, x <= 0 (s - max, s - lse; x > 88 would overflow):
 * hp_nn_expf's range reduction x = n ln2 + r and degree-6 Taylor polynomial (nn-math.h:
 * relative error < 2e-7), the clamp at -87 only (exp(-87) = 1.6e-38 stands in for anything
 * smaller, exp(-inf) included, an absolute error below 2e-38), and 2^n built from the bits of
 * the rounding sum. With FMA (HP_T_FMA) the reduction is one fused step r = x - n ln2_f, exact
 * but for ln2_f's own error (1.9e-9): |n| 1.9e-9 more relative error, at most 2.4e-7 more at
 * n = -126, where exp(x) < 2^-125 of the row's largest term. */
HP_T_INL VF HP_T_N(vexp)(VF x) {
    const float log2e = 1.44269504088896341f;
    const float magic = 12582912.0f + 127.0f;   // 1.5 * 2^23 + bias: bits(t) = bits(magic - 127) + n + 127
    const VF xc = HP_T_N(vmax)(x, HP_T_N(vsplat)(-87.0f));
    const VF t = xc * log2e + magic;   // round(x log2e) + 127 in the low mantissa bits
    const VF n = t - magic;
#ifdef HP_T_FMA
    const VF r = xc - n * 0.693147182464599609375f;
#else
    VF r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
#endif
    VF p = HP_T_N(vsplat)(hp_nn_exp_poly[0]);
#pragma GCC unroll 6
    for (int i = 1; i < 7; i++) p = p * r + hp_nn_exp_poly[i];
    const VU e = (VU)t << 23;   // (n + 127) << 23: the bits of 2^n (the top bits shift out)
    return p * (VF)e;
}

/* The micro-kernel: C[r][c] (+)= sum_{k < K} A[r * ars + k * acs] * B[k * ldb + c] for r < MR_,
 * c < NV_ * VW; the k terms are summed in order in registers, then added to C (accum) or
 * stored. MR_ and NV_ are constants at every call (ukr_rows), so the loops unroll. */
HP_T_INL void HP_T_N(ukr)(const int MR_, const int NV_, float *C, size_t ldc, int accum, const float *A,
                          size_t ars, size_t acs, const float *B, size_t ldb, int K) {
    VF acc[HP_T_MR][HP_T_NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR_; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV_; v++) acc[r][v] = (VF){0};
    for (int k = 0; k < K; k++) {
        VF b[HP_T_NV];
#pragma GCC unroll 2
        for (int v = 0; v < NV_; v++) b[v] = LD(B + (size_t)k * ldb + (size_t)v * HP_T_VW);
        const float *a = A + (size_t)k * acs;
#pragma GCC unroll 8
        for (int r = 0; r < MR_; r++) {
            const float ar = a[(size_t)r * ars];
#pragma GCC unroll 2
            for (int v = 0; v < NV_; v++) acc[r][v] += ar * b[v];
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR_; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV_; v++) {
            float *c = C + (size_t)r * ldc + (size_t)v * HP_T_VW;
            VF x = acc[r][v];
            if (accum) x += LD(c);
            ST(c, x);
        }
}

/* One row block of M rows (a constant at every call), columns [c0, n) (n - c0 a multiple of
 * VW): full column blocks, then one-vector tails (head_dim 24: 16 + 8). */
HP_T_INL void HP_T_N(ukr_row)(const int M, float *C, size_t ldc, int accum, const float *A, size_t ars,
                              size_t acs, const float *B, size_t ldb, int K, int c0, int n) {
    int c = c0;
    for (; c + HP_T_NB <= n; c += HP_T_NB) HP_T_N(ukr)(M, HP_T_NV, C + c, ldc, accum, A, ars, acs, B + c, ldb, K);
    for (; c < n; c += HP_T_VW) HP_T_N(ukr)(M, 1, C + c, ldc, accum, A, ars, acs, B + c, ldb, K);
}

/* mr <= HP_T_MR rows: a full micro-tile, or a partial one as blocks of 4, 2 and 1 rows. Rows
 * are independent (each C element sums its k terms in the same order whatever the block), so
 * the grouping changes no bit; it instantiates four row counts instead of one per count. */
_Static_assert(HP_T_MR >= 4 && HP_T_MR <= 8, "attention-tiles.h: HP_T_MR must be 4 to 8");
static HP_T_ATTR void HP_T_N(ukr_rows)(int mr, float *C, size_t ldc, int accum, const float *A, size_t ars,
                                       size_t acs, const float *B, size_t ldb, int K, int c0, int n) {
    if (mr == HP_T_MR) {
        HP_T_N(ukr_row)(HP_T_MR, C, ldc, accum, A, ars, acs, B, ldb, K, c0, n);
        return;
    }
    if (mr & 4) {
        HP_T_N(ukr_row)(4, C, ldc, accum, A, ars, acs, B, ldb, K, c0, n);
        C += 4 * ldc;
        A += 4 * ars;
    }
    if (mr & 2) {
        HP_T_N(ukr_row)(2, C, ldc, accum, A, ars, acs, B, ldb, K, c0, n);
        C += 2 * ldc;
        A += 2 * ars;
    }
    if (mr & 1) HP_T_N(ukr_row)(1, C, ldc, accum, A, ars, acs, B, ldb, K, c0, n);
}

/* C (M, N) (+)= A (M, K) B (K, N), N a multiple of VW, in micro-tiles; `mode` applies the
 * causal mask given off = (first query row) - (first key) of the tile (query row i sees key j
 * iff j <= i + off, in tile-local indices):
 *   DENSE  everything;
 *   QCOLS  rows are keys, columns queries: the columns (VW-aligned) before a row block's first
 *          visible query are not computed (C there is left as it was);
 *   KEND   rows are queries, k keys: k stops after the row block's last visible key;
 *   KBEG   rows are keys, k queries: k starts at the row block's first visible query.
 * The terms skipped are exactly ones the mask makes zero. */
static HP_T_ATTR void HP_T_N(gemm)(float *C, size_t ldc, int accum, const float *A, size_t ars, size_t acs,
                                   const float *B, size_t ldb, int M, int N, int K, int mode, int off) {
    for (int r0 = 0; r0 < M; r0 += HP_T_MR) {
        const int mr = M - r0 < HP_T_MR ? M - r0 : HP_T_MR;
        int kb = 0, ke = K, c0 = 0;
        if (mode == HP_ATT_KEND) {
            ke = off + r0 + mr;
            if (ke > K) ke = K;
        } else if (mode == HP_ATT_KBEG) {
            kb = r0 - off;
            if (kb < 0) kb = 0;
        } else if (mode == HP_ATT_QCOLS) {
            c0 = r0 - off;
            c0 = c0 <= 0 ? 0 : c0 / HP_T_VW * HP_T_VW;
        }
        if (ke <= kb || c0 >= N) continue;
        HP_T_N(ukr_rows)(mr, C + (size_t)r0 * ldc, ldc, accum, A + (size_t)r0 * ars + (size_t)kb * acs, ars, acs,
                         B + (size_t)kb * ldb, ldb, ke - kb, c0, N);
    }
}

/* Software prefetch of n rows of hd floats at stride ld (for writing if rw): rows of the
 * (B*T, heads*hd) activations lie kilobytes apart, one page each, where the hardware
 * prefetchers stop, so the next tile's rows are requested while this one computes. */
HP_T_INL void HP_T_N(prefetch_rows)(const float *p, size_t ld, int n, int hd, int rw) {
    for (int r = 0; r < n; r++) {
        const float *row = p + (size_t)r * ld;
        for (int d = 0; d < hd; d += 16) {
            if (rw) __builtin_prefetch(row + d, 1, 3);
            else __builtin_prefetch(row + d, 0, 3);
        }
        if (rw) __builtin_prefetch(row + hd - 1, 1, 3);
        else __builtin_prefetch(row + hd - 1, 0, 3);
    }
}

/* dst (hd, BR) = src rows 0..nr transposed, times `scale` (src row stride ld); columns
 * [nr, nrp) zero. */
HP_T_INL void HP_T_N(pack_t)(float *dst, const float *src, size_t ld, int nr, int nrp, int hd, float scale) {
    int r = 0;
#ifdef HP_T_AVX_TRANSPOSE
    // 8 x 8 blocks transposed in registers (hd % 8 == 0 on this path)
    const __m256 sc = _mm256_set1_ps(scale);
    for (; r + 8 <= nr; r += 8)
        for (int d = 0; d < hd; d += 8) {
            const float *s0 = src + (size_t)r * ld + d;
            __m256 x[8], t[8];
            for (int i = 0; i < 8; i++) x[i] = _mm256_mul_ps(_mm256_loadu_ps(s0 + (size_t)i * ld), sc);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(x[i], x[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                x[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                x[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                x[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                x[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
            }
            float *o = dst + (size_t)d * HP_ATT_BR + r;
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(o + (size_t)i * HP_ATT_BR, _mm256_permute2f128_ps(x[i], x[i + 4], 0x20));
                _mm256_storeu_ps(o + (size_t)(i + 4) * HP_ATT_BR, _mm256_permute2f128_ps(x[i], x[i + 4], 0x31));
            }
        }
#endif
    for (; r < nr; r++) {
        const float *s = src + (size_t)r * ld;
        for (int d = 0; d < hd; d++) dst[(size_t)d * HP_ATT_BR + r] = s[d] * scale;
    }
    for (int d = 0; d < hd; d++)
        for (int r = nr; r < nrp; r++) dst[(size_t)d * HP_ATT_BR + r] = 0.0f;
}

/* dst (n, hd) contiguous = src rows 0..n (stride ld). */
HP_T_INL void HP_T_N(pack_rows)(float *dst, const float *src, size_t ld, int n, int hd) {
    for (int r = 0; r < n; r++)
        for (int d = 0; d < hd; d += HP_T_VW) ST(dst + (size_t)r * hd + d, LD(src + (size_t)r * ld + d));
}

/* Key ranges of the query rows r .. r + VW (tile-local, off as in gemm): keys [0, cfull) are
 * seen by every lane, [cfull, cany) by some (lane l sees key c iff c <= r + l + off). */
HP_T_INL void HP_T_N(key_range)(int r, int off, int nc, int *cfull, int *cany) {
    int f = r + off + 1, a = r + HP_T_VW + off;
    *cfull = f < 0 ? 0 : f > nc ? nc : f;
    *cany = a < 0 ? 0 : a > nc ? nc : a;
}

/* One query tile of one (batch, head): rows i0 .. i0 + nr of q (rows at stride ldq, the head's
 * columns), every key 0 .. i0 + nr - 1 of k/v; writes those rows of out (stride ldo) and lse.
 * npre: rows after the tile that the caller computes next (their q, k, v are prefetched). */
static HP_T_ATTR void HP_T_N(fwd_tile)(float *out, int ldo, float *lse, const float *q, int ldq, const float *k,
                                       int ldk, const float *v, int ldv, int i0, int nr, int npre, int hd,
                                       float scale) {
    float qt[hd * HP_ATT_BR];        // (hd, BR) scaled query rows, transposed
    float S[HP_ATT_BC * HP_ATT_BR];  // (BC, BR) S^T, then P^T
    float o[HP_ATT_BR * hd];         // (BR, hd) unnormalised output rows
    float vp[HP_ATT_BC * hd];        // (BC, hd) value rows of the key tile, contiguous
    float m[HP_ATT_BR], l[HP_ATT_BR], corr[HP_ATT_BR];
    const int nrp = (nr + HP_T_VW - 1) / HP_T_VW * HP_T_VW;
    const VI iota = HP_T_N(viota)();
    HP_T_N(pack_t)(qt, q + (size_t)i0 * ldq, (size_t)ldq, nr, nrp, hd, scale);
    for (int r = 0; r < nrp; r++) m[r] = -INFINITY, l[r] = 0.0f;
    memset(o, 0, sizeof(float) * (size_t)nr * hd);
    HP_T_N(prefetch_rows)(out + (size_t)i0 * ldo, (size_t)ldo, nr, hd, 1);
    const int jend = i0 + nr;   // keys past the tile's last row are seen by none of its rows
    for (int j0 = 0; j0 < jend; j0 += HP_ATT_BC) {
        const int nc = jend - j0 < HP_ATT_BC ? jend - j0 : HP_ATT_BC;
        const int off = i0 - j0, dense = off >= nc - 1;   // dense: row 0 already sees every key
        if (j0 + HP_ATT_BC < jend) {   // the next key tile
            const int nn = jend - j0 - HP_ATT_BC < HP_ATT_BC ? jend - j0 - HP_ATT_BC : HP_ATT_BC;
            HP_T_N(prefetch_rows)(k + (size_t)(j0 + HP_ATT_BC) * ldk, (size_t)ldk, nn, hd, 0);
            HP_T_N(prefetch_rows)(v + (size_t)(j0 + HP_ATT_BC) * ldv, (size_t)ldv, nn, hd, 0);
        } else if (npre > 0) {   // the next query tile: its rows, and its new keys
            HP_T_N(prefetch_rows)(q + (size_t)jend * ldq, (size_t)ldq, npre, hd, 0);
            HP_T_N(prefetch_rows)(k + (size_t)jend * ldk, (size_t)ldk, npre, hd, 0);
            HP_T_N(prefetch_rows)(v + (size_t)jend * ldv, (size_t)ldv, npre, hd, 0);
        }
        HP_T_N(gemm)(S, HP_ATT_BR, 0, k + (size_t)j0 * ldk, ldk, 1, qt, HP_ATT_BR, nc, nrp, hd,
                     dense ? HP_ATT_DENSE : HP_ATT_QCOLS, off);
        // online softmax, VW query rows at a time: running max, P^T = exp(S^T - max), sums
        for (int r = 0; r < nrp; r += HP_T_VW) {
            int cf, ca;
            HP_T_N(key_range)(r, off, nc, &cf, &ca);
            const VI vis = iota + (r + off);   // lane sees key c iff c <= vis
            const VF mold = LD(m + r), ninf = HP_T_N(vsplat)(-INFINITY);
            VF vm = mold;
            for (int c = 0; c < cf; c++) vm = HP_T_N(vmax)(vm, LD(S + (size_t)c * HP_ATT_BR + r));
            for (int c = cf; c < ca; c++)
                vm = HP_T_N(vmax)(vm, HP_T_N(vsel)(vis >= c, LD(S + (size_t)c * HP_ATT_BR + r), ninf));
            VF vs = {0};
            for (int c = 0; c < cf; c++) {
                float *p = S + (size_t)c * HP_ATT_BR + r;
                const VF e = HP_T_N(vexp)(LD(p) - vm);
                ST(p, e);
                vs += e;
            }
            for (int c = cf; c < ca; c++) {
                float *p = S + (size_t)c * HP_ATT_BR + r;
                const VF e = (VF)((VI)HP_T_N(vexp)(LD(p) - vm) & (vis >= c));
                ST(p, e);
                vs += e;
            }
            for (int c = ca; c < nc; c++) ST(S + (size_t)c * HP_ATT_BR + r, (VF){0});   // masked: P = 0
            // 0 on a row's first tile (exp(-inf)); a row with no key here keeps vm = mold
            const VF cv = HP_T_N(vexp)(mold - vm);
            ST(l + r, LD(l + r) * cv + vs);
            ST(m + r, vm);
            ST(corr + r, cv);
        }
        for (int r = 0; r < nr; r++)
            if (corr[r] != 1.0f) {
                float *orow = o + (size_t)r * hd;
                const float cr = corr[r];
                for (int d = 0; d < hd; d += HP_T_VW) ST(orow + d, LD(orow + d) * cr);
            }
        // O (nr, hd) += P (nr, nc) V (nc, hd), P read from P^T; V rows packed (B rows a page
        // apart would cost a TLB entry each)
        HP_T_N(pack_rows)(vp, v + (size_t)j0 * ldv, (size_t)ldv, nc, hd);
        HP_T_N(gemm)(o, hd, 1, S, 1, HP_ATT_BR, vp, hd, nr, hd, nc,
                     dense ? HP_ATT_DENSE : HP_ATT_KEND, off);
    }
    for (int r = 0; r < nr; r++) {
        float *orow = out + (size_t)(i0 + r) * ldo;
        const float inv = 1.0f / l[r];
        for (int d = 0; d < hd; d += HP_T_VW) ST(orow + d, LD(o + (size_t)r * hd + d) * inv);
        lse[i0 + r] = m[r] + logf(l[r]);
    }
}

/* Backward helpers. bwd_qtile: query tile rows i0 .. i0 + nr of one head (q/dout/out at its
 * columns, lse at its (T) row): Q^T scaled and dO^T packed (hd, BR); if qp, the Q and dO rows
 * contiguous (BR, hd) (the B operands of dK, dV); D = rowsum(dO * O) and L = lse of the rows
 * (0 past nr). */
HP_T_INL void HP_T_N(bwd_qtile)(float *qt, float *dot, float *qp, float *dop, float *D, float *L, const float *q,
                                int ldq, const float *dout, const float *out, int ldo, const float *lse, int i0,
                                int nr, int nrp, int hd, float scale) {
    const float *qb = q + (size_t)i0 * ldq, *dob = dout + (size_t)i0 * ldo;
    HP_T_N(pack_t)(qt, qb, (size_t)ldq, nr, nrp, hd, scale);
    HP_T_N(pack_t)(dot, dob, (size_t)ldo, nr, nrp, hd, 1.0f);
    if (qp) {
        HP_T_N(pack_rows)(qp, qb, (size_t)ldq, nr, hd);
        HP_T_N(pack_rows)(dop, dob, (size_t)ldo, nr, hd);
    }
    for (int r = 0; r < nrp; r++) {
        float dsum = 0.0f;
        if (r < nr) {
            const float *dor = dob + (size_t)r * ldo, *orow = out + (size_t)(i0 + r) * ldo;
            VF vd = {0};
            for (int d = 0; d < hd; d += HP_T_VW) vd += LD(dor + d) * LD(orow + d);
            for (int x = 0; x < HP_T_VW; x++) dsum += vd[x];
        }
        D[r] = dsum;
        L[r] = r < nr ? lse[i0 + r] : 0.0f;
    }
}

/* bwd_pds: one (query tile, key tile) pair: S^T = K Q^T and dP^T = V dO^T, then in place
 * P^T = exp(S^T - lse) and dS^T = P^T (dP^T - D) scale, VW query rows at a time (masked: 0). */
HP_T_INL void HP_T_N(bwd_pds)(float *S, float *dP, const float *qt, const float *dot, const float *L, const float *D,
                              const float *kb, int ldk, const float *vb, int ldv, int nc, int nrp, int off, int hd,
                              float scale) {
    const int dense = off >= nc - 1;
    const VI iota = HP_T_N(viota)();
    HP_T_N(gemm)(S, HP_ATT_BR, 0, kb, ldk, 1, qt, HP_ATT_BR, nc, nrp, hd, dense ? HP_ATT_DENSE : HP_ATT_QCOLS, off);
    HP_T_N(gemm)(dP, HP_ATT_BR, 0, vb, ldv, 1, dot, HP_ATT_BR, nc, nrp, hd, dense ? HP_ATT_DENSE : HP_ATT_QCOLS, off);
    for (int r = 0; r < nrp; r += HP_T_VW) {
        int cf, ca;
        HP_T_N(key_range)(r, off, nc, &cf, &ca);
        const VI vis = iota + (r + off);
        const VF Lr = LD(L + r), Dr = LD(D + r);
        for (int c = 0; c < cf; c++) {
            float *p = S + (size_t)c * HP_ATT_BR + r, *ds = dP + (size_t)c * HP_ATT_BR + r;
            const VF e = HP_T_N(vexp)(LD(p) - Lr);
            ST(p, e);
            ST(ds, e * (LD(ds) - Dr) * scale);
        }
        for (int c = cf; c < ca; c++) {
            float *p = S + (size_t)c * HP_ATT_BR + r, *ds = dP + (size_t)c * HP_ATT_BR + r;
            const VF e = (VF)((VI)HP_T_N(vexp)(LD(p) - Lr) & (vis >= c));
            ST(p, e);
            ST(ds, e * (LD(ds) - Dr) * scale);
        }
        for (int c = ca; c < nc; c++) {   // masked: P = dS = 0
            ST(S + (size_t)c * HP_ATT_BR + r, (VF){0});
            ST(dP + (size_t)c * HP_ATT_BR + r, (VF){0});
        }
    }
}

/* The backward's scratch for one task, on the stack and sized by head_dim (nothing is
 * allocated): one array of bws_floats(hd) floats carved into the tiles below. */
typedef struct {
    float *qt, *dot;   // (hd, BR) scaled Q^T, dO^T of the query tile
    float *S;          // (BC, BR) S^T, then P^T
    float *dP;         // (BC, BR) dP^T = V dO^T, then dS^T
    float *dqa;        // (BR, hd) dQ of the tile
    float *qp, *dop;   // (BR, hd) Q, dO rows, contiguous (B of dK, dV)
    float *kp;         // (BC, hd) key rows, contiguous (B of dQ)
    float *D, *L;      // (BR) rowsum(dO * O), lse of the tile's rows
} HP_T_N(bws_t);

HP_T_INL size_t HP_T_N(bws_floats)(int hd) {
    return (size_t)hd * HP_ATT_BR * 5 + (size_t)HP_ATT_BC * HP_ATT_BR * 2 + (size_t)HP_ATT_BC * hd + 2 * HP_ATT_BR;
}

HP_T_INL HP_T_N(bws_t) HP_T_N(bws_carve)(float *p, int hd) {
    const size_t qn = (size_t)hd * HP_ATT_BR, sn = (size_t)HP_ATT_BC * HP_ATT_BR;
    HP_T_N(bws_t) w;
    w.qt = p;
    w.dot = w.qt + qn;
    w.S = w.dot + qn;
    w.dP = w.S + sn;
    w.dqa = w.dP + sn;
    w.qp = w.dqa + qn;
    w.dop = w.qp + qn;
    w.kp = w.dop + qn;
    w.D = w.kp + (size_t)HP_ATT_BC * hd;
    w.L = w.D + HP_ATT_BR;
    return w;
}

/* dK, dV rows t0 .. t1 = 0: they sum in place over query tiles (and heads). */
HP_T_INL void HP_T_N(bwd_zero_kv)(float *dk, int lddk, float *dv, int lddv, int t0, int t1, int hd) {
    for (int t = t0; t < t1; t++) {
        memset(dk + (size_t)t * lddk, 0, sizeof(float) * (size_t)hd);
        memset(dv + (size_t)t * lddv, 0, sizeof(float) * (size_t)hd);
    }
}

/* One (query tile, key tile) pair's dV (nc, hd) += P^T dO and dK (nc, hd) += dS^T Q, from the
 * P^T, dS^T of bwd_pds and the packed Q, dO rows (dk, dv at the key tile's first row). */
HP_T_INL void HP_T_N(bwd_kv_pair)(const HP_T_N(bws_t) *w, float *dk, int lddk, float *dv, int lddv, int nc, int nr,
                                  int off, int hd) {
    const int mode = off >= nc - 1 ? HP_ATT_DENSE : HP_ATT_KBEG;
    HP_T_N(gemm)(dv, lddv, 1, w->S, HP_ATT_BR, 1, w->dop, hd, nc, hd, nr, mode, off);
    HP_T_N(gemm)(dk, lddk, 1, w->dP, HP_ATT_BR, 1, w->qp, hd, nc, hd, nr, mode, off);
}

/* The pairs of one query tile, rows i0 .. i0 + nr of one head (q/dq/dout/out at its columns,
 * lse at its (T) row, k/v at its kv head's): dQ rows (=), summed in registers and dqa over the
 * key tiles 0 .. i0 + nr in order, written once; when dk is set, also those key tiles' dK, dV
 * (+=). bwd_group runs it for every query tile, bwd_q (dk NULL) for one. */
HP_T_INL void HP_T_N(bwd_qtile_pairs)(const HP_T_N(bws_t) *w, float *dq, int lddq, float *dk, int lddk, float *dv,
                                      int lddv, const float *dout, const float *out, int ldo, const float *lse,
                                      const float *q, int ldq, const float *k, int ldk, const float *v, int ldv,
                                      int i0, int nr, int hd, float scale) {
    const int nrp = (nr + HP_T_VW - 1) / HP_T_VW * HP_T_VW;
    HP_T_N(bwd_qtile)(w->qt, w->dot, dk ? w->qp : NULL, w->dop, w->D, w->L, q, ldq, dout, out, ldo, lse, i0, nr, nrp,
                      hd, scale);
    memset(w->dqa, 0, sizeof(float) * (size_t)nr * hd);
    const int jend = i0 + nr;
    for (int j0 = 0; j0 < jend; j0 += HP_ATT_BC) {
        const int nc = jend - j0 < HP_ATT_BC ? jend - j0 : HP_ATT_BC;
        const int off = i0 - j0, dense = off >= nc - 1;
        const float *kb = k + (size_t)j0 * ldk, *vb = v + (size_t)j0 * ldv;
        HP_T_N(bwd_pds)(w->S, w->dP, w->qt, w->dot, w->L, w->D, kb, ldk, vb, ldv, nc, nrp, off, hd, scale);
        // dQ (nr, hd) += dS K
        HP_T_N(pack_rows)(w->kp, kb, (size_t)ldk, nc, hd);
        HP_T_N(gemm)(w->dqa, hd, 1, w->dP, 1, HP_ATT_BR, w->kp, hd, nr, hd, nc, dense ? HP_ATT_DENSE : HP_ATT_KEND,
                     off);
        if (dk) HP_T_N(bwd_kv_pair)(w, dk + (size_t)j0 * lddk, lddk, dv + (size_t)j0 * lddv, lddv, nc, nr, off, hd);
    }
    for (int r = 0; r < nr; r++)
        memcpy(dq + (size_t)(i0 + r) * lddq, w->dqa + (size_t)r * hd, sizeof(float) * (size_t)hd);
}

/* One (batch, kv head) of the backward: dK, dV of the kv head (k/v/dk/dv point at its
 * columns) and dQ of its rep query heads h = 0 .. rep (q/dq/dout/out point at the first one's
 * columns, heads hd apart; lse at the first one's (T) row, heads T apart). Query tiles outer,
 * key tiles inner: dQ of a tile sums in registers and an accumulator and is written once; dK, dV
 * of the kv head sum in place (zeroed first). */
static HP_T_ATTR void HP_T_N(bwd_group)(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                                        const float *dout, const float *out, int ldo, const float *lse,
                                        const float *q, int ldq, const float *k, int ldk, const float *v, int ldv,
                                        int T, int rep, int hd, float scale) {
    float ws[HP_T_N(bws_floats)(hd)];
    const HP_T_N(bws_t) w = HP_T_N(bws_carve)(ws, hd);
    HP_T_N(bwd_zero_kv)(dk, lddk, dv, lddv, 0, T, hd);
    for (int h = 0; h < rep; h++)
        for (int i0 = 0; i0 < T; i0 += HP_ATT_BR)
            HP_T_N(bwd_qtile_pairs)(&w, dq + (size_t)h * hd, lddq, dk, lddk, dv, lddv, dout + (size_t)h * hd,
                                    out + (size_t)h * hd, ldo, lse + (size_t)h * T, q + (size_t)h * hd, ldq, k, ldk,
                                    v, ldv, i0, T - i0 < HP_ATT_BR ? T - i0 : HP_ATT_BR, hd, scale);
}

/* The split backward (attention.c picks it when there are fewer (batch, kv head) groups than
 * threads): the same pairs and products as bwd_group, in two passes that each own their
 * outputs. bwd_kv: key tile j0 of one group (pointers as bwd_group): dK, dV rows j0 .. j0 + BC
 * (=), summed over heads h = 0 .. rep and query tiles from j0 on, in bwd_group's order (so the
 * same bits). bwd_q: query tile i0 of one query head (q/dq/dout/out at its columns, lse at its
 * row, k/v at its kv head's): dQ rows (=), summed over key tiles in bwd_group's order. Each
 * recomputes S^T, P^T, dP^T, dS^T of its pairs: 7 tile products per pair instead of 5. */
static HP_T_ATTR void HP_T_N(bwd_kv)(float *dk, int lddk, float *dv, int lddv, const float *dout, const float *out,
                                     int ldo, const float *lse, const float *q, int ldq, const float *k, int ldk,
                                     const float *v, int ldv, int T, int rep, int hd, float scale, int j0) {
    float ws[HP_T_N(bws_floats)(hd)];
    const HP_T_N(bws_t) w = HP_T_N(bws_carve)(ws, hd);
    HP_T_N(bwd_zero_kv)(dk, lddk, dv, lddv, j0, T - j0 < HP_ATT_BC ? T : j0 + HP_ATT_BC, hd);
    const float *kb = k + (size_t)j0 * ldk, *vb = v + (size_t)j0 * ldv;
    for (int h = 0; h < rep; h++) {
        for (int i0 = j0 / HP_ATT_BR * HP_ATT_BR; i0 < T; i0 += HP_ATT_BR) {
            const int nr = T - i0 < HP_ATT_BR ? T - i0 : HP_ATT_BR;
            if (i0 + nr <= j0) continue;   // no row of this tile sees key j0
            const int nrp = (nr + HP_T_VW - 1) / HP_T_VW * HP_T_VW;
            const int nc = i0 + nr - j0 < HP_ATT_BC ? i0 + nr - j0 : HP_ATT_BC;
            const int off = i0 - j0;
            HP_T_N(bwd_qtile)(w.qt, w.dot, w.qp, w.dop, w.D, w.L, q + (size_t)h * hd, ldq, dout + (size_t)h * hd,
                              out + (size_t)h * hd, ldo, lse + (size_t)h * T, i0, nr, nrp, hd, scale);
            HP_T_N(bwd_pds)(w.S, w.dP, w.qt, w.dot, w.L, w.D, kb, ldk, vb, ldv, nc, nrp, off, hd, scale);
            HP_T_N(bwd_kv_pair)(&w, dk + (size_t)j0 * lddk, lddk, dv + (size_t)j0 * lddv, lddv, nc, nr, off, hd);
        }
    }
}

static HP_T_ATTR void HP_T_N(bwd_q)(float *dq, int lddq, const float *dout, const float *out, int ldo,
                                    const float *lse, const float *q, int ldq, const float *k, int ldk,
                                    const float *v, int ldv, int T, int hd, float scale, int i0) {
    float ws[HP_T_N(bws_floats)(hd)];
    const HP_T_N(bws_t) w = HP_T_N(bws_carve)(ws, hd);
    HP_T_N(bwd_qtile_pairs)(&w, dq, lddq, NULL, 0, NULL, 0, dout, out, ldo, lse, q, ldq, k, ldk, v, ldv, i0,
                            T - i0 < HP_ATT_BR ? T - i0 : HP_ATT_BR, hd, scale);
}

#undef LD
#undef ST
#undef VF
#undef VI
#undef VU
#undef HP_T_INL
#undef HP_T_NB
#undef HP_T_N
#undef HP_T_CAT
#undef HP_T_CAT_
#undef HP_T_SFX
#undef HP_T_VW
#undef HP_T_NV
#undef HP_T_MR
#undef HP_T_ATTR
#undef HP_T_FMA
#undef HP_T_AVX_TRANSPOSE
#undef HP_T_VMAX
