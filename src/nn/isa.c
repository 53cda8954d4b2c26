/* Which ISA path the nn kernels take (nn.h, hp_nn_set_isa): the best one the CPU supports
 * (core-cpu.h), or the one a test or HP_NN_ISA=portable|avx2|avx512 forces. */
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/nn.h"
#include "core/core-cpu.h"

static int isa_now = -1;   // hp_nn_isa_t once set; -1 until the first query

static int supported(hp_nn_isa_t isa) {
    switch (isa) {
    case HP_NN_ISA_PORTABLE: return 1;
    case HP_NN_ISA_AVX2:
#if defined(__x86_64__) && defined(__GNUC__)
        return (hp_cpu_features() & HP_CPU_AVX2_FMA) != 0;
#else
        return 0;   // the AVX2 path is compiled on x86-64 only
#endif
    case HP_NN_ISA_AVX512:
#if defined(__x86_64__) && defined(__GNUC__)
        return (hp_cpu_features() & HP_CPU_AVX512) != 0;
#else
        return 0;
#endif
    default: return 0;
    }
}

static hp_nn_isa_t best(void) {
    return supported(HP_NN_ISA_AVX512) ? HP_NN_ISA_AVX512 : supported(HP_NN_ISA_AVX2) ? HP_NN_ISA_AVX2 : HP_NN_ISA_PORTABLE;
}

const char *hp_nn_isa_name(hp_nn_isa_t isa) {
    switch (isa) {
    case HP_NN_ISA_AUTO: return "auto";
    case HP_NN_ISA_PORTABLE: return "portable";
    case HP_NN_ISA_AVX2: return "avx2";
    case HP_NN_ISA_AVX512: return "avx512";
    }
    return "unknown";
}

hp_status_t hp_nn_set_isa(hp_nn_isa_t isa) {
    if (isa == HP_NN_ISA_AUTO) isa = best();
    if (!supported(isa))
        return hp_error(HP_ERR_UNSUPPORTED, "hp_nn_set_isa: this CPU or build has no %s path (best here: %s)",
                        hp_nn_isa_name(isa), hp_nn_isa_name(best()));
    __atomic_store_n(&isa_now, (int)isa, __ATOMIC_RELAXED);
    return HP_OK;
}

hp_nn_isa_t hp_nn_isa(void) {
    int v = __atomic_load_n(&isa_now, __ATOMIC_RELAXED);
    if (v >= 0) return (hp_nn_isa_t)v;
    hp_nn_isa_t isa = best();   // racing first calls compute the same value
    const char *env = getenv("HP_NN_ISA");
    if (env && *env && strcmp(env, "auto")) {
        hp_nn_isa_t want = !strcmp(env, "portable") ? HP_NN_ISA_PORTABLE
                         : !strcmp(env, "avx2")     ? HP_NN_ISA_AVX2
                         : !strcmp(env, "avx512")   ? HP_NN_ISA_AVX512
                                                    : HP_NN_ISA_AUTO;
        // an unknown or unsupported value keeps the best path (a kernel cannot fail here)
        if (want != HP_NN_ISA_AUTO && supported(want)) isa = want;
        else hp_log(HP_LOG_WARN, "HP_NN_ISA=%s: not a path this CPU has (portable, avx2, avx512); using %s", env,
                    hp_nn_isa_name(isa));
    }
    __atomic_store_n(&isa_now, (int)isa, __ATOMIC_RELAXED);
    return isa;
}
