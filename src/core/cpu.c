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
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) f |= HP_CPU_AVX2_FMA;
    if (__builtin_cpu_supports("avx512f")) f |= HP_CPU_AVX512F;
#endif
    __atomic_store_n(&cached, f, __ATOMIC_RELAXED);
    return f & ~(1u << 31);
}
