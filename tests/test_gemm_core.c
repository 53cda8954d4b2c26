// The GEMM library matched to the CPU (src/nn/blas.c, hp_gemm_info; docs/dependencies.md "GEMM
// library") and the FMA peak (hp_cpu_fma_peak_flops):
// (1) at start-up the OpenBLAS kernel family is at the CPU's ISA (a DYNAMIC_ARCH OpenBLAS, no
//     OPENBLAS_CORETYPE in the environment);
// (2) the load-time check itself, on the real library: the family is set to Prescott (what an
//     unknown CPU model gets from Debian 12's OpenBLAS), which hp_gemm_info must report below the
//     CPU (the negative case: the report sees a slow family), then hp_cpu_blas_recheck must bring
//     it back to the CPU's ISA; products are checked against a double loop under each family
//     (bound gamma_{K+2} of the magnitudes, Higham 3.5: every family sums K f32 products);
// (3) the FMA peak is a positive finite figure, refuses a NULL output, and the one-line
//     description names the kernels in use.
// hp-test: ranks 1 timeout 120
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hyperparallel/nn.h"
#include "nn/nn-blas.h"

/* c = a b (M, K) x (K, N) through the CPU backend's sgemm; the worst error over its bound. */
static double gemm_error(int M, int N, int K) {
    float *a = malloc(sizeof(float) * (size_t)M * K), *b = malloc(sizeof(float) * (size_t)K * N),
          *c = malloc(sizeof(float) * (size_t)M * N);
    uint64_t x = 99;
    for (int i = 0; i < M * K; i++) a[i] = (float)((x = x * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f;
    for (int i = 0; i < K * N; i++) b[i] = (float)((x = x * 6364136223846793005ull + 1) >> 40) / 16777216.0f - 0.5f;
    hp_cpu_sgemm(c, N, a, K, b, N, M, N, K, 0, 0, 1.0f, 0.0f);
    const double u = ldexp(1.0, -24), gam = (K + 2) * u / (1 - (K + 2) * u);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                ref += (double)a[(size_t)i * K + k] * b[(size_t)k * N + j];
                mag += fabs((double)a[(size_t)i * K + k] * b[(size_t)k * N + j]);
            }
            const double r = fabs(c[(size_t)i * N + j] - ref) / (gam * mag + 1e-30);
            if (!(r <= worst)) worst = r;   // NaN-safe
        }
    free(a);
    free(b);
    free(c);
    return worst;
}

int main(void) {
    hp_gemm_info_t g;
    hp_gemm_info(&g);
    char line[512];
    hp_gemm_describe(line, sizeof line);
    printf("%s\n", line);
    HP_CHECK(strstr(line, g.core) != NULL && strstr(line, g.cpu_isa) != NULL, "description names the kernels: %s",
             line);
    HP_CHECK(!strcmp(g.cpu_isa, hp_cpu_isa_name()), "cpu ISA %s vs %s", g.cpu_isa, hp_cpu_isa_name());

    // (1) at the CPU's ISA, unless the environment forced a family or the library cannot switch
    if (g.forced) printf("OPENBLAS_CORETYPE is set: the start-up family (%s) is the user's choice\n", g.core);
    else if (!g.dynamic_arch) printf("not a DYNAMIC_ARCH OpenBLAS: the family check can only report (%s)\n", g.core);
    else HP_CHECK(!g.below_cpu, "start-up kernels %s (%s) below this CPU's %s", g.core, g.core_isa, g.cpu_isa);
    HP_CHECK(gemm_error(37, 29, 41) <= 1.0, "sgemm under %s", g.core);

    // (2) the check on the real library: Prescott, reported below, then back to the CPU's ISA
    if (strcmp(g.cpu_isa, "unknown") && strcmp(g.cpu_isa, "arm64") && strcmp(g.cpu_isa, "sse2") &&
        hp_cpu_blas_select_family("Prescott") == HP_OK) {
        hp_gemm_info_t p;
        hp_gemm_info(&p);
        HP_CHECK(!strcmp(p.core, "Prescott") && p.below_cpu, "Prescott must be reported below a %s CPU (core %s, "
                 "below %d)", p.cpu_isa, p.core, p.below_cpu);
        hp_gemm_describe(line, sizeof line);
        HP_CHECK(strstr(line, "BELOW") != NULL, "the description must warn: %s", line);
        HP_CHECK(gemm_error(37, 29, 41) <= 1.0, "sgemm under Prescott");
        hp_cpu_blas_recheck();
        hp_gemm_info(&p);
        printf("after the check: %s kernels (%s), selected %d\n", p.core, p.core_isa, p.selected);
        HP_CHECK(!p.below_cpu && p.selected && !strcmp(p.core_isa, p.cpu_isa),
                 "the check must select the %s family (runs %s, %s)", p.cpu_isa, p.core, p.core_isa);
        HP_CHECK(!strcmp(p.library_choice, "Prescott"), "library choice %s", p.library_choice);
        hp_gemm_describe(line, sizeof line);
        HP_CHECK(strstr(line, "selected") != NULL && !strstr(line, "BELOW"), "description after the fix: %s", line);
        HP_CHECK(gemm_error(64, 48, 96) <= 1.0, "sgemm after the check");
        HP_CHECK(hp_cpu_blas_select_family("NoSuchCore") != HP_OK, "an unknown family must be refused");
        hp_cpu_blas_recheck();   // (an unknown name leaves Prescott: back to the CPU's family)
        hp_gemm_info(&p);
        HP_CHECK(!p.below_cpu, "after a refused family: %s", p.core);
    } else {
        printf("SKIP-PART: this BLAS cannot switch kernel families; only the report is checked\n");
    }

    // (3) the FMA peak
    double fma = 0;
    HP_CHECK_OK(hp_cpu_fma_peak_flops(1, 0.05, &fma));
    HP_CHECK(isfinite(fma) && fma > 1e8, "FMA peak %g FLOP/s", fma);
    printf("f32 FMA peak, 1 thread (%s): %.1f GFLOP/s\n", hp_cpu_isa_name(), fma / 1e9);
    HP_CHECK(hp_cpu_fma_peak_flops(1, 0.01, NULL) == HP_ERR_INVALID_ARG, "NULL output refused");
    return hp_test_finish("test_gemm_core");
}
