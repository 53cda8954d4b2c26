// The bf16 GEMM and the f32 <-> bf16 conversions (src/nn/gemm_bf16.c, docs/nn.md "bf16 GEMM"):
// (1) the conversions on the ISA path in use (HP_NN_ISA; the isa entries force avx2 / portable)
//     bitwise vs the scalar rule hp_f32_to_bf16 (round to nearest even): ties both ways, NaN
//     (quiet, payload and sign kept), +-Inf, overflow to Inf, denormals, +-0, vector tails; and
//     the kernel table's convert gives the same bits;
// (2) hp_gemm_bf16 on every implementation this machine has (oneDNN where it has AVX512_BF16 or
//     AMX, the f32 path always), forced one at a time, and the table's gemm_bf16 slot, vs the
//     double reference of the same bf16 inputs: all four transposes, odd sizes, strides, alpha,
//     beta (beta 0 must not read a NaN c); a one-ulp bf16 change in A must fail the bound;
// (3) the implementation chosen at start-up (HP_GEMM_BF16 env of the _f32path entry) and the
//     describe line naming it; oneDNN refused where it is unavailable.
// hp-test: ranks 1 timeout 120 isa
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hyperparallel/backend.h"
#include "hyperparallel/nn.h"

static uint64_t rng = 12345;
static float urand(void) { return (float)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 40) / 16777216.0f; }
static float f_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void check_conversions(void) {
    enum { N = 1000 };
    static float src[N];
    static hp_bf16_t got[N], ref[N], tab[N];
    static float back[N], back_ref[N];
    // specials first, then random bit patterns (every exponent, NaN payloads, denormals)
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                0x7f800001u /* signalling NaN: must come back quiet */, 0x7f7fffffu /* max: rounds to inf */,
                                0x3f808000u /* tie, even below: down */, 0x3f818000u /* tie, odd below: up */,
                                0x3f808001u, 0x3f807fffu, 0x00008000u /* denormal tie */, 0x00018000u, 0x807fffffu,
                                0x00000001u, 0x7f7f8000u /* tie at the top: up to inf */};
    const int ns = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < N; i++) {
        uint32_t u = i < ns ? special[i] : (uint32_t)(((rng = rng * 6364136223846793005ull + 1) >> 32));
        if (i >= ns && i % 3 == 0) u = (u & 0xffff0000u) | 0x8000u;   // exact ties, any exponent
        src[i] = f_of(u);
    }
    // lengths that leave every tail length of the 16- and 8-lane loops
    const int lens[] = {N, 1, 7, 8, 15, 16, 17, 31, 33, N - 1};
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
        const int n = lens[t];
        memset(got, 0xAB, sizeof got);
        hp_convert_f32_to_bf16(got, src, n);
        hp_ref_convert_f32_to_bf16(ref, src, n);
        int bad = -1;
        for (int i = 0; i < n && bad < 0; i++)
            if (got[i] != ref[i]) bad = i;
        HP_CHECK(bad < 0, "f32->bf16 (%s, n %d) at %d: %04x vs %04x", hp_nn_isa_name(hp_nn_isa()), n, bad,
                 bad >= 0 ? got[bad] : 0, bad >= 0 ? ref[bad] : 0);
        HP_CHECK(got[n] == 0xABAB || n == N, "f32->bf16 wrote past n %d", n);
    }
    // the rule itself at the specials (the reference is the definition; check it is RNE)
    HP_CHECK(ref[4] == 0x7fc0 && ref[5] == 0xffc0 && ref[6] == 0x7fc0, "NaN quiet: %04x %04x %04x", ref[4], ref[5],
             ref[6]);
    HP_CHECK(ref[7] == 0x7f80 && ref[16] == 0x7f80, "overflow to inf: %04x %04x", ref[7], ref[16]);
    HP_CHECK(ref[8] == 0x3f80 && ref[9] == 0x3f82 && ref[10] == 0x3f81 && ref[11] == 0x3f80,
             "ties to even / nearest: %04x %04x %04x %04x", ref[8], ref[9], ref[10], ref[11]);
    HP_CHECK(ref[12] == 0x0000 && ref[13] == 0x0002 && ref[1] == 0x8000, "denormal ties, -0: %04x %04x %04x", ref[12],
             ref[13], ref[1]);
    const hp_backend_t *be = hp_backend_cpu();
    be->convert(be->ctx, tab, HP_BF16, src, HP_F32, N);
    HP_CHECK(!memcmp(tab, ref, sizeof ref), "the table's convert f32->bf16 differs from the rule");
    // bf16 -> f32: exact widening, every tail
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
        const int n = lens[t];
        hp_convert_bf16_to_f32(back, ref, n);
        hp_ref_convert_bf16_to_f32(back_ref, ref, n);
        HP_CHECK(!memcmp(back, back_ref, sizeof(float) * (size_t)n), "bf16->f32 (n %d) differs", n);
    }
    be->convert(be->ctx, back, HP_F32, ref, HP_BF16, N);
    HP_CHECK(!memcmp(back, back_ref, sizeof back), "the table's convert bf16->f32 differs");
    // negative: one flipped low bit of one element is seen by the bitwise comparison
    hp_convert_f32_to_bf16(got, src, N);
    got[500] ^= 1;
    HP_CHECK(memcmp(got, ref, sizeof ref) != 0, "an injected one-bit change must be seen");
}

/* The worst |c - ref| over its bound. The bound: every path sums the K exact bf16 products in
 * f32 in some order, then scales by alpha and adds beta c (Higham 3.5: gamma_{K+2} of the
 * magnitudes); AMX / AVX512_BF16 also treat denormals as zero, which costs at most 2^-126 per
 * product or sum, hence the (K + 2) FLT_MIN term. */
static double gemm_case(void (*gemm)(float *, int, const hp_bf16_t *, int, const hp_bf16_t *, int, int, int, int,
                                     int, int, float, float),
                        int M, int N, int K, int ta, int tb, float alpha, float beta, int pad, int flip) {
    const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const int lda = ac + pad, ldb = bc + 2 * pad, ldc = N + pad;
    hp_bf16_t *a = malloc(sizeof(hp_bf16_t) * (size_t)ar * lda), *b = malloc(sizeof(hp_bf16_t) * (size_t)br * ldb);
    float *c = malloc(sizeof(float) * (size_t)M * ldc), *r = malloc(sizeof(float) * (size_t)M * ldc);
    for (int i = 0; i < ar * lda; i++) a[i] = hp_f32_to_bf16(2.0f * urand() - 1.0f);
    for (int i = 0; i < br * ldb; i++) b[i] = hp_f32_to_bf16(0.5f + urand());   // |b| >= 0.5: a flip shows
    a[0] = hp_f32_to_bf16(0.75f);   // its one-ulp change (2^-8) times |b| is ~14x the bound at K 67
    for (int i = 0; i < M * ldc; i++) c[i] = r[i] = beta == 0.0f ? NAN : 2.0f * urand() - 1.0f;
    hp_ref_gemm_bf16(r, ldc, a, lda, b, ldb, M, N, K, ta, tb, alpha, beta);
    if (flip) a[0] = (hp_bf16_t)(a[0] + 1);   // one bf16 ulp of op(a)[0][0]
    gemm(c, ldc, a, lda, b, ldb, M, N, K, ta, tb, alpha, beta);
    if (flip) a[0] = (hp_bf16_t)(a[0] - 1);
    const double u = ldexp(1.0, -24), gam = (K + 2) * u / (1 - (K + 2) * u);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double mag = 0;
            for (int k = 0; k < K; k++) {
                const hp_bf16_t x = ta ? a[(size_t)k * lda + i] : a[(size_t)i * lda + k];
                const hp_bf16_t y = tb ? b[(size_t)j * ldb + k] : b[(size_t)k * ldb + j];
                mag += fabs((double)hp_bf16_to_f32(x) * hp_bf16_to_f32(y));
            }
            const double c0 = beta == 0.0f ? 0.0 : fabs((double)beta * 1.0);   // |c0| <= 1
            const double bound = gam * (fabs((double)alpha) * mag + c0) + (K + 2) * (double)FLT_MIN;
            const double e = fabs((double)c[(size_t)i * ldc + j] - r[(size_t)i * ldc + j]) / bound;
            if (!(e <= worst)) worst = e;   // NaN-safe: a NaN makes worst NaN, which fails "<= 1"
        }
    free(a);
    free(b);
    free(c);
    free(r);
    return worst;
}

static void slot_gemm(float *c, int ldc, const hp_bf16_t *a, int lda, const hp_bf16_t *b, int ldb, int M, int N,
                      int K, int ta, int tb, float alpha, float beta) {
    const hp_backend_t *be = hp_backend_cpu();
    be->gemm_bf16(be->ctx, c, ldc, a, lda, b, ldb, M, N, K, ta, tb, alpha, beta, NULL, 0);
}

/* The slot with the caller's workspace of exactly hp_gemm_bf16_ws_floats floats (the training
 * step's way: no allocation in the call), its last float a guard the call must not touch. */
static void slot_gemm_ws(float *c, int ldc, const hp_bf16_t *a, int lda, const hp_bf16_t *b, int ldb, int M, int N,
                         int K, int ta, int tb, float alpha, float beta) {
    const hp_backend_t *be = hp_backend_cpu();
    const size_t n = hp_gemm_bf16_ws_floats(M, N, K, ta, tb);
    float *ws = malloc(sizeof(float) * (n + 1));
    ws[n] = 12345.0f;
    be->gemm_bf16(be->ctx, c, ldc, a, lda, b, ldb, M, N, K, ta, tb, alpha, beta, ws, n);
    HP_CHECK(ws[n] == 12345.0f, "gemm_bf16 wrote past its %zu-float workspace (M %d N %d K %d)", n, M, N, K);
    free(ws);
}

static void check_gemm(const char *what, void (*gemm)(float *, int, const hp_bf16_t *, int, const hp_bf16_t *, int,
                                                        int, int, int, int, int, float, float)) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            double w = gemm_case(gemm, 37, 29, 67, ta, tb, 1.0f, 0.0f, 0, 0);
            HP_CHECK(w <= 1.0, "%s ta %d tb %d: error %.3g of the bound", what, ta, tb, w);
            w = gemm_case(gemm, 33, 48, 100, ta, tb, 0.5f, 1.5f, 3, 0);
            HP_CHECK(w <= 1.0, "%s ta %d tb %d alpha beta strides: error %.3g of the bound", what, ta, tb, w);
        }
    double w = gemm_case(gemm, 64, 96, 256, 0, 1, 1.0f, 1.0f, 0, 0);   // the linear forward's layout
    HP_CHECK(w <= 1.0, "%s 64x96x256: error %.3g of the bound", what, w);
    w = gemm_case(gemm, 1, 1, 1, 0, 0, 1.0f, 0.0f, 0, 0);
    HP_CHECK(w <= 1.0, "%s 1x1x1: error %.3g", what, w);
    // negative: a one-ulp bf16 change of one element of A must exceed the bound
    w = gemm_case(gemm, 37, 29, 67, 0, 0, 1.0f, 0.0f, 0, 1);
    HP_CHECK(w > 1.0, "%s: a one-ulp change in A must fail the bound (error %.3g)", what, w);
    printf("%s: ok\n", what);
}

int main(void) {
    printf("ISA path %s\n", hp_nn_isa_name(hp_nn_isa()));
    check_conversions();

    char line[256];
    hp_gemm_bf16_describe(line, sizeof line);
    printf("%s\n", line);
    const hp_gemm_bf16_impl_t start = hp_gemm_bf16_impl();
    HP_CHECK(start != HP_GEMM_BF16_AUTO, "the running implementation is never auto");
    HP_CHECK(strstr(line, start == HP_GEMM_BF16_ONEDNN ? "oneDNN" : "f32 path") != NULL, "describe names %s: %s",
             hp_gemm_bf16_impl_name(start), line);
    const char *env = getenv("HP_GEMM_BF16");
    if (env && !strcmp(env, "f32"))
        HP_CHECK(start == HP_GEMM_BF16_F32, "HP_GEMM_BF16=f32 must select the f32 path (runs %s)",
                 hp_gemm_bf16_impl_name(start));
    HP_CHECK(hp_backend_has_gemm_bf16(hp_backend_cpu()), "the CPU backend fills gemm_bf16");

    check_gemm("reference twin (self)", hp_ref_gemm_bf16);
    HP_CHECK_OK(hp_gemm_bf16_set_impl(HP_GEMM_BF16_F32));
    check_gemm("f32 path", hp_gemm_bf16);
    check_gemm("f32 path via the table", slot_gemm);
    check_gemm("f32 path via the table, caller's workspace", slot_gemm_ws);
    if (hp_gemm_bf16_set_impl(HP_GEMM_BF16_ONEDNN) == HP_OK) {
        hp_gemm_bf16_describe(line, sizeof line);
        printf("%s\n", line);
        check_gemm("oneDNN", hp_gemm_bf16);
        check_gemm("oneDNN via the table", slot_gemm);
        check_gemm("oneDNN via the table, caller's workspace", slot_gemm_ws);
    } else {
        printf("oneDNN bf16 GEMM not available here (no libdnnl2 or no AVX512_BF16): only the f32 path checked\n");
    }
    HP_CHECK_OK(hp_gemm_bf16_set_impl(HP_GEMM_BF16_AUTO));
    HP_CHECK(hp_gemm_bf16_set_impl((hp_gemm_bf16_impl_t)7) == HP_ERR_UNSUPPORTED, "an unknown implementation refused");
    return hp_test_finish("test_gemm_bf16");
}
