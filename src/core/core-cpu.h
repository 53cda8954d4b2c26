/* CPU features for kernels that pick an ISA path at run time (private to the library: the
 * public switch is hp_nn_set_isa in nn.h, the public report hp_cpu_isa_name / hp_gemm_info in
 * nn_kernels.h). Detected once from cpuid (x86-64, including the OS check that the YMM / ZMM
 * state is saved); 0 on other architectures. */
#ifndef HP_CORE_CPU_H
#define HP_CORE_CPU_H

enum {
    HP_CPU_AVX2_FMA = 1 << 0,   /* AVX2 and FMA3 (Haswell, Zen and later) */
    HP_CPU_AVX512F = 1 << 1,    /* AVX-512 F */
    /* AVX-512 F, DQ, BW, VL and CD with AVX2 + FMA (Skylake-SP and later, Zen 4): what the
     * avx512 kernel path is compiled for (x86-64-v4) */
    HP_CPU_AVX512 = 1 << 2,
    HP_CPU_AVX = 1 << 3,        /* AVX (Sandy Bridge, Bulldozer) */
    HP_CPU_SSE42 = 1 << 4,      /* SSE4.2 (Nehalem) */
    HP_CPU_AVX512_BF16 = 1 << 5,/* AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4) */
    HP_CPU_AMX = 1 << 6,        /* AMX tiles with bf16 (Sapphire Rapids and later) */
    HP_CPU_INTEL = 1 << 7,      /* vendor GenuineIntel (else AMD or other) */
};

/* Bit set of HP_CPU_* this CPU supports. Thread-safe; no allocation. */
unsigned hp_cpu_features(void);

#endif
