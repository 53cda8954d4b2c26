/* Tile kernels of the causal flash attention (attention.c), written once over a vector width
 * and instantiated once per ISA path: attention.c includes this file several times, each
 * time with
 *   HP_T_SFX   suffix of the generated names (avx2, generic4, generic1)
 *   HP_T_VW    floats per vector (8: AVX2 ymm; 4: SSE2 / NEON; 1: scalar, any head_dim)
 *   HP_T_NV    vectors per micro-tile column block (1 or 2)
 *   HP_T_MR    rows per micro-tile (<= 8)
 *   HP_T_ATTR  function attribute (__attribute__((target("avx2,fma"))) or nothing)
 * and HP_ATT_BR / HP_ATT_BC (query rows / keys per tile) defined.
 *
 * Every product of the forward (S = Q K^T, O += P V) and backward (S, dP = dO V^T, dQ += dS K,
 * dV += P^T dO, dK += dS^T Q) goes through one register-blocked micro-kernel, HP_T_MR x
 * (HP_T_NV * HP_T_VW) accumulators (AVX2: 6 x 16 floats = 12 ymm, the Haswell sgemm shape,
 * leaving 4 registers for the B row and the A broadcast, so nothing spills), over A with
 * arbitrary row/column strides (P^T and dS^T are read in place) and B rows at a stride. The
 * causal mask is applied at micro-tile granularity: blocks wholly above the diagonal are not
 * computed and each row block's key range stops at its last row's key. Softmax (row max, exp,
 * rescale) runs on the same vectors; exp is hp_nn_expf's polynomial, lane-wise. */

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
HP_T_INL VF HP_T_N(vmax)(VF a, VF b) { return HP_T_N(vsel)(a > b, a, b); }
HP_T_INL VF HP_T_N(vsplat)(float x) { return (VF){0} + x; }
/* lanes < n set, n in [0, VW] */
HP_T_INL VI HP_T_N(vfirst)(int n) {
    VI iota;
    for (int l = 0; l < HP_T_VW; l++) iota[l] = l;
    return iota < n;
}
HP_T_INL float HP_T_N(hmax)(VF x, float m) {
    for (int l = 0; l < HP_T_VW; l++) m = x[l] > m ? x[l] : m;
    return m;
}
HP_T_INL float HP_T_N(hsum)(VF x) {
    float s = 0.0f;
    for (int l = 0; l < HP_T_VW; l++) s += x[l];
    return s;
}

/* hp_nn_expf lane-wise (nn-math.h: the same range reduction and polynomial, so the same
 * relative error < 2e-7): x < -87 gives 0, x > 88 is clamped. */
HP_T_INL VF HP_T_N(vexp)(VF x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    const float magic = 12582912.0f;
    const VI under = x < -87.0f;
    VF xc = HP_T_N(vsel)(under, HP_T_N(vsplat)(-87.0f), x);
    xc = HP_T_N(vsel)(xc > 88.0f, HP_T_N(vsplat)(88.0f), xc);
    const VF n = (xc * log2e + magic) - magic;
    VF r = xc - n * ln2_hi;
    r = r - n * ln2_lo;
    VF p = HP_T_N(vsplat)(1.3888889e-3f);
    p = p * r + 8.3333333e-3f;
    p = p * r + 4.1666667e-2f;
    p = p * r + 1.6666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const VU e = ((VU)__builtin_convertvector(n, VI) + 127u) << 23;
    return (VF)((VI)(p * (VF)e) & ~under);
}

/* The micro-kernel: C[r][c] (+)= sum_{k < K} A[r * ars + k * acs] * B[k * ldb + c] for r < MR_,
 * c < NV_ * VW; the k terms are summed in order in registers, then added to C (accum) or
 * stored. MR_ and NV_ are constants at every call (ukr_any), so the loops unroll. */
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

#define HP_T_UKR_ARGS C, ldc, accum, A, ars, acs, B, ldb, K
#define HP_T_UKR_ROW(M)                                                                            \
    do {                                                                                           \
        if (nv == HP_T_NV) HP_T_N(ukr)(M, HP_T_NV, HP_T_UKR_ARGS);                                 \
        else HP_T_N(ukr)(M, 1, HP_T_UKR_ARGS);                                                     \
    } while (0)
/* ukr for mr in [1, MR] rows and nv in {1, NV} vectors, chosen at run time */
static HP_T_ATTR void HP_T_N(ukr_any)(int mr, int nv, float *C, size_t ldc, int accum, const float *A, size_t ars,
                                      size_t acs, const float *B, size_t ldb, int K) {
    switch (mr) {
#if HP_T_MR >= 8
    case 8: HP_T_UKR_ROW(8); break;
#endif
#if HP_T_MR >= 7
    case 7: HP_T_UKR_ROW(7); break;
#endif
#if HP_T_MR >= 6
    case 6: HP_T_UKR_ROW(6); break;
#endif
#if HP_T_MR >= 5
    case 5: HP_T_UKR_ROW(5); break;
#endif
#if HP_T_MR >= 4
    case 4: HP_T_UKR_ROW(4); break;
#endif
#if HP_T_MR >= 3
    case 3: HP_T_UKR_ROW(3); break;
#endif
#if HP_T_MR >= 2
    case 2: HP_T_UKR_ROW(2); break;
#endif
    default: HP_T_UKR_ROW(1); break;
    }
}
#undef HP_T_UKR_ROW
#undef HP_T_UKR_ARGS

/* C (M, N) (+)= A (M, K) B (K, N), N a multiple of VW, in micro-tiles; `mode` applies the
 * causal mask given off = (first query row) - (first key) of the tile (attention.c, HP_ATT_*):
 * DENSE everything; COLS rows are queries and columns keys: columns past the row block's last
 * key are not computed (C there is left as it was); KEND rows are queries, k keys: k stops at
 * the row block's last key; KBEG rows are keys, k queries: k starts at the first query that
 * sees the row block's first key. The skipped terms are exactly those the mask zeroes. */
static HP_T_ATTR void HP_T_N(gemm)(float *C, size_t ldc, int accum, const float *A, size_t ars, size_t acs,
                                   const float *B, size_t ldb, int M, int N, int K, int mode, int off) {
    for (int r0 = 0; r0 < M; r0 += HP_T_MR) {
        const int mr = M - r0 < HP_T_MR ? M - r0 : HP_T_MR;
        int kb = 0, ke = K, n = N;
        if (mode == HP_ATT_KEND) {
            ke = off + r0 + mr;
            if (ke > K) ke = K;
        } else if (mode == HP_ATT_KBEG) {
            kb = r0 - off;
            if (kb < 0) kb = 0;
        } else if (mode == HP_ATT_COLS) {
            n = (off + r0 + mr + HP_T_VW - 1) / HP_T_VW * HP_T_VW;
            if (n > N) n = N;
        }
        if (ke <= kb || n <= 0) continue;
        for (int c0 = 0; c0 < n;) {
            const int nv = n - c0 >= HP_T_NB ? HP_T_NV : 1;   // a one-vector tail (hd 24: 16 + 8)
            HP_T_N(ukr_any)(mr, nv, C + (size_t)r0 * ldc + c0, ldc, accum, A + (size_t)r0 * ars + (size_t)kb * acs,
                            ars, acs, B + (size_t)kb * ldb + c0, ldb, ke - kb);
            c0 += nv * HP_T_VW;
        }
    }
}

/* dst (hd, ncv) = src rows 0..nc transposed (src row stride ld); columns [nc, ncv) zero. */
HP_T_INL void HP_T_N(pack_t)(float *dst, const float *src, size_t ld, int nc, int ncv, int hd) {
    for (int c = 0; c < nc; c++) {
        const float *s = src + (size_t)c * ld;
        for (int d = 0; d < hd; d++) dst[(size_t)d * HP_ATT_BC + c] = s[d];
    }
    for (int d = 0; d < hd; d++)
        for (int c = nc; c < ncv; c++) dst[(size_t)d * HP_ATT_BC + c] = 0.0f;
}

/* One query tile of one (batch, head): rows i0 .. i0 + nr of q (rows at stride ldq, the head's
 * columns), every key 0 .. i0 + nr - 1 of k/v; writes those rows of out (stride ldo) and lse. */
static HP_T_ATTR void HP_T_N(fwd_tile)(float *out, int ldo, float *lse, const float *q, int ldq, const float *k,
                                       int ldk, const float *v, int ldv, int i0, int nr, int hd, float scale) {
    float qs[HP_ATT_BR * hd];       // (BR, hd) scaled query rows
    float kt[hd * HP_ATT_BC];       // (hd, BC) key tile, transposed
    float S[HP_ATT_BR * HP_ATT_BC]; // (BR, BC) scores, then probabilities
    float o[HP_ATT_BR * hd];        // (BR, hd) unnormalised output rows
    float m[HP_ATT_BR], l[HP_ATT_BR];
    for (int i = 0; i < nr; i++) {
        const float *qi = q + (size_t)(i0 + i) * ldq;
        for (int d = 0; d < hd; d++) qs[(size_t)i * hd + d] = qi[d] * scale;
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    memset(o, 0, sizeof(float) * (size_t)nr * hd);
    const int jend = i0 + nr;   // keys past the tile's last row are seen by none of its rows
    for (int j0 = 0; j0 < jend; j0 += HP_ATT_BC) {
        const int nc = jend - j0 < HP_ATT_BC ? jend - j0 : HP_ATT_BC;
        const int ncv = (nc + HP_T_VW - 1) / HP_T_VW * HP_T_VW;
        const int off = i0 - j0, dense = off >= nc - 1;   // dense: row 0 already sees every key
        HP_T_N(pack_t)(kt, k + (size_t)j0 * ldk, (size_t)ldk, nc, ncv, hd);
        HP_T_N(gemm)(S, HP_ATT_BC, 0, qs, hd, 1, kt, HP_ATT_BC, nr, ncv, hd, dense ? HP_ATT_DENSE : HP_ATT_COLS, off);
        for (int i = 0; i < nr; i++) {
            float *s = S + (size_t)i * HP_ATT_BC;
            int jmax = i + off + 1;   // causal: keys j0 .. i0 + i
            if (jmax > nc) jmax = nc;
            int c = 0;
            if (jmax > 0) {
                const int nfull = jmax / HP_T_VW, rem = jmax % HP_T_VW;
                const VI tail = HP_T_N(vfirst)(rem);
                const VF ninf = HP_T_N(vsplat)(-INFINITY);
                VF vm = ninf;
                for (int t = 0; t < nfull; t++) vm = HP_T_N(vmax)(vm, LD(s + t * HP_T_VW));
                if (rem) vm = HP_T_N(vmax)(vm, HP_T_N(vsel)(tail, LD(s + nfull * HP_T_VW), ninf));
                const float mx = HP_T_N(hmax)(vm, m[i]);
                const float corr = hp_nn_expf(m[i] - mx);   // 0 on the row's first tile
                VF vs = {0};
                for (int t = 0; t < nfull; t++, c += HP_T_VW) {
                    const VF e = HP_T_N(vexp)(LD(s + c) - mx);
                    ST(s + c, e);
                    vs += e;
                }
                if (rem) {
                    const VF e = (VF)((VI)HP_T_N(vexp)(LD(s + c) - mx) & tail);
                    ST(s + c, e);
                    vs += e;
                    c += HP_T_VW;
                }
                l[i] = l[i] * corr + HP_T_N(hsum)(vs);
                m[i] = mx;
                if (corr != 1.0f) {
                    float *oi = o + (size_t)i * hd;
                    for (int d = 0; d < hd; d += HP_T_VW) ST(oi + d, LD(oi + d) * corr);
                }
            }
            for (; c < ncv; c += HP_T_VW) ST(s + c, (VF){0});   // masked keys: P = 0
        }
        HP_T_N(gemm)(o, hd, 1, S, HP_ATT_BC, 1, v + (size_t)j0 * ldv, ldv, nr, hd, nc,
                     dense ? HP_ATT_DENSE : HP_ATT_KEND, off);
    }
    for (int i = 0; i < nr; i++) {
        float *oi = out + (size_t)(i0 + i) * ldo;
        const float inv = 1.0f / l[i];
        for (int d = 0; d < hd; d++) oi[d] = o[(size_t)i * hd + d] * inv;
        lse[i0 + i] = m[i] + logf(l[i]);
    }
}

/* One (batch, kv head) of the backward: dK, dV of the kv head (k/v/dk/dv point at its
 * columns) and dQ of its rep query heads h = 0 .. rep (q/dq/dout/out point at the first one's
 * columns, heads hd apart; lse at the first one's (T) row, heads T apart). */
static HP_T_ATTR void HP_T_N(bwd_group)(float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                                        const float *dout, const float *out, int ldo, const float *lse,
                                        const float *q, int ldq, const float *k, int ldk, const float *v, int ldv,
                                        int T, int rep, int hd, float scale) {
    float kt[hd * HP_ATT_BC], vt[hd * HP_ATT_BC];   // (hd, BC) transposed key / value tiles
    float qs[HP_ATT_BR * hd];                       // (BR, hd) scaled query rows
    float S[HP_ATT_BR * HP_ATT_BC];                 // (BR, BC) scores, then P
    float dP[HP_ATT_BR * HP_ATT_BC];                // (BR, BC) dO V^T, then dS
    float dka[HP_ATT_BC * hd], dva[HP_ATT_BC * hd]; // (BC, hd) dK, dV of the key tile
    for (int t = 0; t < T; t++) memset(dq + (size_t)t * lddq, 0, sizeof(float) * (size_t)rep * hd);
    for (int j0 = 0; j0 < T; j0 += HP_ATT_BC) {
        const int nc = T - j0 < HP_ATT_BC ? T - j0 : HP_ATT_BC;
        const int ncv = (nc + HP_T_VW - 1) / HP_T_VW * HP_T_VW;
        HP_T_N(pack_t)(kt, k + (size_t)j0 * ldk, (size_t)ldk, nc, ncv, hd);
        HP_T_N(pack_t)(vt, v + (size_t)j0 * ldv, (size_t)ldv, nc, ncv, hd);
        memset(dka, 0, sizeof(float) * (size_t)nc * hd);
        memset(dva, 0, sizeof(float) * (size_t)nc * hd);
        for (int h = 0; h < rep; h++) {
            // query rows from j0 on: earlier rows see none of these keys
            for (int i0 = j0; i0 < T; i0 += HP_ATT_BR) {
                const int nr = T - i0 < HP_ATT_BR ? T - i0 : HP_ATT_BR;
                const int off = i0 - j0, dense = off >= nc - 1;
                const float *qb = q + (size_t)i0 * ldq + (size_t)h * hd;
                const float *dob = dout + (size_t)i0 * ldo + (size_t)h * hd;
                const float *ob = out + (size_t)i0 * ldo + (size_t)h * hd;
                const float *lb = lse + (size_t)h * T + i0;
                for (int i = 0; i < nr; i++)
                    for (int d = 0; d < hd; d++) qs[(size_t)i * hd + d] = qb[(size_t)i * ldq + d] * scale;
                HP_T_N(gemm)(S, HP_ATT_BC, 0, qs, hd, 1, kt, HP_ATT_BC, nr, ncv, hd, dense ? HP_ATT_DENSE : HP_ATT_COLS,
                             off);
                HP_T_N(gemm)(dP, HP_ATT_BC, 0, dob, ldo, 1, vt, HP_ATT_BC, nr, ncv, hd,
                             dense ? HP_ATT_DENSE : HP_ATT_COLS, off);
                for (int i = 0; i < nr; i++) {
                    float *s = S + (size_t)i * HP_ATT_BC, *ds = dP + (size_t)i * HP_ATT_BC;
                    int jmax = i + off + 1;
                    if (jmax > nc) jmax = nc;
                    int c = 0;
                    if (jmax > 0) {
                        const float *doi = dob + (size_t)i * ldo, *oi = ob + (size_t)i * ldo;
                        VF vd = {0};
                        for (int d = 0; d < hd; d += HP_T_VW) vd += LD(doi + d) * LD(oi + d);
                        const float Di = HP_T_N(hsum)(vd);   // rowsum(dO * O)
                        const float li = lb[i];
                        const int nfull = jmax / HP_T_VW, rem = jmax % HP_T_VW;
                        for (int t = 0; t < nfull; t++, c += HP_T_VW) {
                            const VF p = HP_T_N(vexp)(LD(s + c) - li);
                            ST(s + c, p);
                            ST(ds + c, p * (LD(ds + c) - Di) * scale);
                        }
                        if (rem) {
                            const VF p = (VF)((VI)HP_T_N(vexp)(LD(s + c) - li) & HP_T_N(vfirst)(rem));
                            ST(s + c, p);
                            ST(ds + c, p * (LD(ds + c) - Di) * scale);
                            c += HP_T_VW;
                        }
                    }
                    for (; c < ncv; c += HP_T_VW) {   // masked keys: P = dS = 0
                        ST(s + c, (VF){0});
                        ST(ds + c, (VF){0});
                    }
                }
                // dQ rows += dS K; dV += P^T dO; dK += dS^T Q (P^T, dS^T read in place)
                HP_T_N(gemm)(dq + (size_t)i0 * lddq + (size_t)h * hd, lddq, 1, dP, HP_ATT_BC, 1, k + (size_t)j0 * ldk,
                             ldk, nr, hd, nc, dense ? HP_ATT_DENSE : HP_ATT_KEND, off);
                HP_T_N(gemm)(dva, hd, 1, S, 1, HP_ATT_BC, dob, ldo, nc, hd, nr, dense ? HP_ATT_DENSE : HP_ATT_KBEG, off);
                HP_T_N(gemm)(dka, hd, 1, dP, 1, HP_ATT_BC, qb, ldq, nc, hd, nr, dense ? HP_ATT_DENSE : HP_ATT_KBEG, off);
            }
        }
        for (int c = 0; c < nc; c++) {
            memcpy(dk + (size_t)(j0 + c) * lddk, dka + (size_t)c * hd, sizeof(float) * (size_t)hd);
            memcpy(dv + (size_t)(j0 + c) * lddv, dva + (size_t)c * hd, sizeof(float) * (size_t)hd);
        }
    }
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
