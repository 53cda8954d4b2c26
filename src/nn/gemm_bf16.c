/* bfloat16 compute on the CPU: f32 <-> bf16 array conversions (round to nearest even, one
 * explicit-vector loop per ISA path, bitwise the scalar hp_f32_to_bf16 / hp_bf16_to_f32) and the
 * bf16 GEMM c (f32) = alpha op(a bf16) op(b bf16) + beta c, run by oneDNN's AMX kernels where the
 * CPU has AMX, else by the f32 path (widen to f32, one OpenBLAS sgemm). docs/nn.md "bf16 GEMM". */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/nn.h"
#include "core/core-cpu.h"
#include "nn/nn-blas.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HP_BF16_X86 1
#endif

/* ---- conversions ------------------------------------------------------------------------- */

void hp_ref_convert_f32_to_bf16(hp_bf16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = hp_f32_to_bf16(src[i]);
}

void hp_ref_convert_bf16_to_f32(float *dst, const hp_bf16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = hp_bf16_to_f32(src[i]);
}

#ifdef HP_BF16_X86
/* hp_f32_to_bf16 per lane: u + 0x7fff + lsb, then the high half; NaN -> (u >> 16) | 0x40 (quiet).
 * Not VCVTNEPS2BF16 (AVX512_BF16): it flushes denormal inputs to zero, which the scalar rule
 * does not. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void f32_to_bf16_avx512(hp_bf16_t *dst, const float *src, int64_t n) {
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), absm = _mm512_set1_epi32(0x7fffffff),
                  inf = _mm512_set1_epi32(0x7f800000), qbit = _mm512_set1_epi32(0x40);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_loadu_si512((const void *)(src + i));
        const __m512i hi = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), inf);
        r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(hi, qbit));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++) dst[i] = hp_f32_to_bf16(src[i]);   // tail: the same rule, scalar
}

__attribute__((target("avx512f,avx512bw,avx512vl")))
static void bf16_to_f32_avx512(float *dst, const hp_bf16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_si512((void *)(dst + i), _mm512_slli_epi32(h, 16));
    }
    for (; i < n; i++) dst[i] = hp_bf16_to_f32(src[i]);
}

__attribute__((target("avx2")))
static void f32_to_bf16_avx2(hp_bf16_t *dst, const float *src, int64_t n) {
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), absm = _mm256_set1_epi32(0x7fffffff),
                  inf = _mm256_set1_epi32(0x7f800000), qbit = _mm256_set1_epi32(0x40);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
        const __m256i hi = _mm256_srli_epi32(u, 16);
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
        // |u| and inf are below 2^31, so the signed compare is the unsigned one
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, qbit), nan);
        // lanes hold values < 2^16: unsigned-saturating pack is exact; qwords 0 and 2 are the 8 results
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_castsi256_si128(p));
    }
    for (; i < n; i++) dst[i] = hp_f32_to_bf16(src[i]);
}

__attribute__((target("avx2")))
static void bf16_to_f32_avx2(float *dst, const hp_bf16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(h, 16));
    }
    for (; i < n; i++) dst[i] = hp_bf16_to_f32(src[i]);
}
#endif

void hp_convert_f32_to_bf16(hp_bf16_t *dst, const float *src, int64_t n) {
#ifdef HP_BF16_X86
    const hp_nn_isa_t isa = hp_nn_isa();
    if (isa == HP_NN_ISA_AVX512) { f32_to_bf16_avx512(dst, src, n); return; }
    if (isa == HP_NN_ISA_AVX2) { f32_to_bf16_avx2(dst, src, n); return; }
#endif
    hp_ref_convert_f32_to_bf16(dst, src, n);   // portable: the scalar rule (the compiler may vectorise it)
}

void hp_convert_bf16_to_f32(float *dst, const hp_bf16_t *src, int64_t n) {
#ifdef HP_BF16_X86
    const hp_nn_isa_t isa = hp_nn_isa();
    if (isa == HP_NN_ISA_AVX512) { bf16_to_f32_avx512(dst, src, n); return; }
    if (isa == HP_NN_ISA_AVX2) { bf16_to_f32_avx2(dst, src, n); return; }
#endif
    hp_ref_convert_bf16_to_f32(dst, src, n);
}

/* ---- the GEMM --------------------------------------------------------------------------- */

void hp_ref_gemm_bf16(float *c, int ldc, const hp_bf16_t *a, int lda, const hp_bf16_t *b, int ldb, int M, int N,
                      int K, int trans_a, int trans_b, float alpha, float beta) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;   // bf16 x bf16 products are exact; one rounding at the end
            for (int k = 0; k < K; k++) {
                const hp_bf16_t x = trans_a ? a[(size_t)k * lda + i] : a[(size_t)i * lda + k];
                const hp_bf16_t y = trans_b ? b[(size_t)j * ldb + k] : b[(size_t)k * ldb + j];
                s += (double)hp_bf16_to_f32(x) * hp_bf16_to_f32(y);
            }
            float *o = &c[(size_t)i * ldc + j];
            *o = (float)((double)alpha * s + (beta == 0.0f ? 0.0 : (double)beta * *o));   // beta 0: c not read (BLAS)
        }
}

/* oneDNN's BLAS-like bf16 GEMM (row-major, dnnl.h of oneDNN >= 1.2; not declared in 2.6's
 * public header, exported by libdnnl): loaded with dlopen, so neither the build nor a machine
 * without AMX needs oneDNN. */
typedef int (*dnnl_gemm_bf16_fn)(char, char, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t,
                                 const uint16_t *, int64_t, float, float *, int64_t);
typedef struct { int major, minor, patch; const char *hash; unsigned cpu_runtime, gpu_runtime; } dnnl_version_t_;

enum { DNNL_ISA_AVX512_CORE_BF16 = 0xe7, DNNL_ISA_AVX512_CORE_AMX = 0x3e7 };   // dnnl_cpu_isa_t bit sets

static struct {
    pthread_once_t once;
    dnnl_gemm_bf16_fn fn;
    char version[24];
    int isa;   // oneDNN's effective ISA (dnnl_cpu_isa_t), 0 when not loaded
    char why[96];
} dn = {PTHREAD_ONCE_INIT, NULL, "", 0, ""};

static int impl_now = -1;   // hp_gemm_bf16_impl_t once chosen

static void dnnl_load(void) {
    void *h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libdnnl.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(dn.why, sizeof dn.why, "oneDNN not installed (Debian libdnnl2)");
        return;
    }
    dn.fn = (dnnl_gemm_bf16_fn)dlsym(h, "dnnl_gemm_bf16bf16f32");
    int (*isa)(void) = (int (*)(void))dlsym(h, "dnnl_get_effective_cpu_isa");
    const dnnl_version_t_ *(*ver)(void) = (const dnnl_version_t_ *(*)(void))dlsym(h, "dnnl_version");
    if (!dn.fn || !isa || !ver) {
        dn.fn = NULL;
        snprintf(dn.why, sizeof dn.why, "libdnnl lacks dnnl_gemm_bf16bf16f32");
        return;
    }
    const dnnl_version_t_ *v = ver();
    snprintf(dn.version, sizeof dn.version, "%d.%d.%d", v->major, v->minor, v->patch);
    dn.isa = isa();   // honours ONEDNN_MAX_CPU_ISA
}

static int supported(hp_gemm_bf16_impl_t impl) {
    if (impl == HP_GEMM_BF16_F32) return 1;
    if (impl != HP_GEMM_BF16_ONEDNN) return 0;
    pthread_once(&dn.once, dnnl_load);
    // oneDNN's bf16 GEMM needs at least AVX512_BF16 (it returns "unimplemented" below)
    return dn.fn && (dn.isa & DNNL_ISA_AVX512_CORE_BF16) == DNNL_ISA_AVX512_CORE_BF16;
}

/* AUTO: oneDNN where it runs AMX kernels; elsewhere the f32 path. Measured on an AMX Xeon
 * (docs/performance.md "bf16 GEMM"): oneDNN's AMX kernels run the step's shapes at about 2.5x
 * OpenBLAS's f32 sgemm per core, its AVX512_BF16 kernels (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16)
 * at about 0.7x of it, so without AMX widening to f32 and sgemm is faster. */
static hp_gemm_bf16_impl_t best(void) {
    if (supported(HP_GEMM_BF16_ONEDNN) && (dn.isa & DNNL_ISA_AVX512_CORE_AMX) == DNNL_ISA_AVX512_CORE_AMX &&
        (hp_cpu_features() & HP_CPU_AMX))
        return HP_GEMM_BF16_ONEDNN;
    return HP_GEMM_BF16_F32;
}

const char *hp_gemm_bf16_impl_name(hp_gemm_bf16_impl_t impl) {
    switch (impl) {
    case HP_GEMM_BF16_AUTO: return "auto";
    case HP_GEMM_BF16_ONEDNN: return "onednn";
    case HP_GEMM_BF16_F32: return "f32";
    }
    return "unknown";
}

hp_status_t hp_gemm_bf16_set_impl(hp_gemm_bf16_impl_t impl) {
    if (impl == HP_GEMM_BF16_AUTO) impl = best();
    if (!supported(impl))
        return hp_error(HP_ERR_UNSUPPORTED,
                        "hp_gemm_bf16_set_impl: no %s bf16 GEMM here (%s; oneDNN needs AVX512_BF16 or AMX); "
                        "use auto or f32",
                        hp_gemm_bf16_impl_name(impl), dn.why[0] ? dn.why : "the CPU lacks AVX512_BF16");
    __atomic_store_n(&impl_now, (int)impl, __ATOMIC_RELAXED);
    return HP_OK;
}

hp_gemm_bf16_impl_t hp_gemm_bf16_impl(void) {
    int v = __atomic_load_n(&impl_now, __ATOMIC_RELAXED);
    if (v >= 0) return (hp_gemm_bf16_impl_t)v;
    hp_gemm_bf16_impl_t impl = best();   // racing first calls compute the same value
    const char *env = getenv("HP_GEMM_BF16");
    if (env && *env && strcmp(env, "auto")) {
        const hp_gemm_bf16_impl_t want = !strcmp(env, "onednn") ? HP_GEMM_BF16_ONEDNN
                                       : !strcmp(env, "f32")    ? HP_GEMM_BF16_F32
                                                                : HP_GEMM_BF16_AUTO;
        if (want != HP_GEMM_BF16_AUTO && supported(want)) impl = want;
        else hp_log(HP_LOG_WARN, "HP_GEMM_BF16=%s: not a bf16 GEMM this machine has (auto, onednn, f32); using %s",
                    env, hp_gemm_bf16_impl_name(impl));
    }
    __atomic_store_n(&impl_now, (int)impl, __ATOMIC_RELAXED);
    return impl;
}

static const char *dnnl_isa_name(int isa) {
    if ((isa & DNNL_ISA_AVX512_CORE_AMX) == DNNL_ISA_AVX512_CORE_AMX) return "amx_bf16";
    if ((isa & DNNL_ISA_AVX512_CORE_BF16) == DNNL_ISA_AVX512_CORE_BF16) return "avx512_bf16";
    return "no bf16 units";
}

int hp_gemm_bf16_describe(char *buf, size_t n) {
    const hp_gemm_bf16_impl_t impl = hp_gemm_bf16_impl();
    pthread_once(&dn.once, dnnl_load);
    const unsigned f = hp_cpu_features();
    const char *cpu = (f & HP_CPU_AMX) ? "AMX and AVX512_BF16" : (f & HP_CPU_AVX512_BF16) ? "AVX512_BF16" : "no bf16 units";
    if (impl == HP_GEMM_BF16_ONEDNN)
        return snprintf(buf, n, "bf16 GEMM: oneDNN %s dnnl_gemm_bf16bf16f32, %s kernels (CPU: %s)", dn.version,
                        dnnl_isa_name(dn.isa), cpu);
    const char *why = !(f & (HP_CPU_AMX | HP_CPU_AVX512_BF16)) ? "the CPU has no bf16 units"
                    : dn.fn == NULL                             ? dn.why
                    : (f & HP_CPU_AMX) && dn.isa != 0 && (dn.isa & DNNL_ISA_AVX512_CORE_AMX) != DNNL_ISA_AVX512_CORE_AMX
                        ? "oneDNN capped below AMX (ONEDNN_MAX_CPU_ISA); its AVX512_BF16 kernels are slower than sgemm"
                    : !(f & HP_CPU_AMX) ? "no AMX: oneDNN's AVX512_BF16 kernels are slower than f32 sgemm"
                                        : "forced (HP_GEMM_BF16=f32 or hp_gemm_bf16_set_impl)";
    return snprintf(buf, n, "bf16 GEMM: f32 path (widen to f32, OpenBLAS sgemm; %s; CPU: %s)", why, cpu);
}

size_t hp_gemm_bf16_ws_floats(int M, int N, int K, int ta, int tb) {
    (void)ta;
    (void)tb;   // op(a) is M x K and op(b) K x N whichever way they are stored
    return (size_t)M * K + (size_t)K * N + 1;
}

/* The f32 path: widen op(a) and op(b) as stored (rows of their stored width) into the caller's
 * scratch (or, without one, a buffer allocated for this call), one sgemm. */
static void gemm_bf16_f32(float *c, int ldc, const hp_bf16_t *a, int lda, const hp_bf16_t *b, int ldb, int M, int N,
                          int K, int ta, int tb, float alpha, float beta, float *ws, size_t ws_floats) {
    const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const size_t need = hp_gemm_bf16_ws_floats(M, N, K, ta, tb);
    float *w = ws;
    if (w) HP_ASSERT_MSG(ws_floats >= need, "hp_gemm_bf16_ws: %zu floats of scratch, the f32 path needs %zu (M %d N %d "
                         "K %d; size it with hp_gemm_bf16_ws_floats)", ws_floats, need, M, N, K);
    else w = hp_malloc(sizeof(float) * need);
    HP_ASSERT_MSG(w != NULL, "hp_gemm_bf16: no memory for %d x %d x %d f32 scratch", M, N, K);
    float *fa = w, *fb = w + (size_t)ar * ac;
    for (int r = 0; r < ar; r++) hp_convert_bf16_to_f32(fa + (size_t)r * ac, a + (size_t)r * lda, ac);
    for (int r = 0; r < br; r++) hp_convert_bf16_to_f32(fb + (size_t)r * bc, b + (size_t)r * ldb, bc);
    hp_cpu_sgemm(c, ldc, fa, ac > 0 ? ac : 1, fb, bc > 0 ? bc : 1, M, N, K, ta, tb, alpha, beta);
    if (w != ws) free(w);
}

void hp_gemm_bf16_ws(float *c, int ldc, const hp_bf16_t *a, int lda, const hp_bf16_t *b, int ldb, int M, int N,
                     int K, int trans_a, int trans_b, float alpha, float beta, float *ws, size_t ws_floats) {
    if (M <= 0 || N <= 0) return;
    if (hp_gemm_bf16_impl() == HP_GEMM_BF16_ONEDNN && K > 0) {
        const int st = dn.fn(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
        HP_ASSERT_MSG(st == 0, "dnnl_gemm_bf16bf16f32 failed (status %d) for M %d N %d K %d lda %d ldb %d ldc %d", st,
                      M, N, K, lda, ldb, ldc);
        return;
    }
    gemm_bf16_f32(c, ldc, a, lda, b, ldb, M, N, K, trans_a, trans_b, alpha, beta, ws, ws_floats);
}

void hp_gemm_bf16(float *c, int ldc, const hp_bf16_t *a, int lda, const hp_bf16_t *b, int ldb, int M, int N, int K,
                  int trans_a, int trans_b, float alpha, float beta) {
    hp_gemm_bf16_ws(c, ldc, a, lda, b, ldb, M, N, K, trans_a, trans_b, alpha, beta, NULL, 0);
}
