/* Run-time CPU feature detection (core-cpu.h): __builtin_cpu_supports reads cpuid and, for
 * AVX features, whether the OS enables the wider register state (xgetbv), so a kernel compiled
 * with __attribute__((target("avx2,fma"))) runs only where it can. */
#include "core/core-cpu.h"

unsigned hp_cpu_features(void) {
    static unsigned cached = 0;   // bit 31: detected; racing first calls store the same value
    unsigned f = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (f) return f & ~(1u << 31);
    f = 1u << 31;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) f |= HP_CPU_SSE42;
    if (__builtin_cpu_supports("avx")) f |= HP_CPU_AVX;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) f |= HP_CPU_AVX2_FMA;
    if (__builtin_cpu_supports("avx512f")) f |= HP_CPU_AVX512F;
    if ((f & HP_CPU_AVX2_FMA) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512cd"))
        f |= HP_CPU_AVX512;
    if ((f & HP_CPU_AVX512) && __builtin_cpu_supports("avx512bf16")) f |= HP_CPU_AVX512_BF16;
    if (__builtin_cpu_is("intel")) f |= HP_CPU_INTEL;
#if defined(__x86_64__)
    {
        /* AMX: cpuid.(7,0):EDX bits 22 (AMX-BF16) and 24 (AMX-TILE), and the OS's XTILE state
         * (XCR0 bits 17, 18); GCC 12's __builtin_cpu_supports does not know AMX */
        unsigned a, b, c, d;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
        if ((d >> 22 & 1) && (d >> 24 & 1)) {
            __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
            if (c >> 27 & 1) {   // OSXSAVE: xgetbv is available
                unsigned lo, hi;
                __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
                if ((lo >> 17 & 3) == 3) f |= HP_CPU_AMX;
            }
        }
    }
#endif
#endif
    __atomic_store_n(&cached, f, __ATOMIC_RELAXED);
    return f & ~(1u << 31);
}
