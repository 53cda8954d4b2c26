/* CPU features for kernels that pick an ISA path at run time (private to the library: the
 * public switch is hp_nn_set_isa in nn.h). Detected once from cpuid (x86-64, including the OS
 * check that YMM state is saved); 0 on other architectures. */
#ifndef HP_CORE_CPU_H
#define HP_CORE_CPU_H

enum {
    HP_CPU_AVX2_FMA = 1 << 0,   /* AVX2 and FMA3 (Haswell, Zen and later) */
    HP_CPU_AVX512F = 1 << 1,    /* AVX-512 F (detected for reports; no kernel path uses it yet) */
};

/* Bit set of HP_CPU_* this CPU supports. Thread-safe; no allocation. */
unsigned hp_cpu_features(void);

#endif
