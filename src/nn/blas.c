/* The CPU backend's one door to BLAS (nn-blas.h): the row-major sgemm call, OpenBLAS's thread
 * count, and the check that OpenBLAS runs the kernels of the CPU it is on (hp_gemm_info,
 * nn_kernels.h).
 *
 * Why the check: OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernel family at load
 * from the CPU's family / model numbers, and a model it does not know falls back to its oldest
 * x86-64 kernels: Debian 12's 0.3.21 ran the SSE3 "Prescott" kernels on an Intel family 6 model
 * 207 Xeon with AVX-512 (sgemm 64 instead of ~225 GFLOP/s, the training step at 0.30x
 * PyTorch), silently. The family those kernels need is a question of ISA, which cpuid answers
 * for any CPU, including ones newer than the library. So at load (a constructor of this
 * library, which runs after OpenBLAS's own, before main) the family OpenBLAS chose is compared
 * with the widest ISA the CPU and the OS support; when it is below, the family for that ISA is
 * selected through OpenBLAS's own door for it: OPENBLAS_CORETYPE, read by
 * gotoblas_dynamic_init (exported by DYNAMIC_ARCH builds), after gotoblas_dynamic_quit. No BLAS
 * call can be running then (constructors run on the loading thread; OpenBLAS's pool is idle),
 * and its buffers are sized for every family of the build. A user's OPENBLAS_CORETYPE is
 * respected as given. A library without that door (a build for one target) is reported below
 * the CPU, and hp-train / the benches warn at start-up. docs/dependencies.md, "GEMM library",
 * has the alternatives that were measured (oneDNN, BLIS). */
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/nn.h"
#include "core/core-cpu.h"
#include "nn/nn-blas.h"

/* OpenBLAS extensions: weak, so a BLAS without them still links (then no family is known). */
void openblas_set_num_threads(int num_threads) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
char *openblas_get_corename(void) __attribute__((weak));
char *openblas_get_config(void) __attribute__((weak));
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));

void hp_cpu_sgemm(float *c, int ldc, const float *a, int lda, const float *b, int ldb, int M, int N, int K,
                  int trans_a, int trans_b, float alpha, float beta) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, a, lda, b, ldb, beta, c, ldc);
}
void hp_cpu_blas_set_num_threads(int n) {
    if (openblas_set_num_threads) openblas_set_num_threads(n);
}
int hp_cpu_blas_get_num_threads(void) { return openblas_get_num_threads ? openblas_get_num_threads() : 1; }

/* ISA levels, lowest first, and their names (hp_cpu_isa_name, hp_gemm_info_t.core_isa). */
enum { ISA_UNKNOWN, ISA_SSE2, ISA_SSE42, ISA_AVX, ISA_AVX2, ISA_AVX512 };
static const char *const isa_names[] = {"unknown", "sse2", "sse4.2", "avx", "avx2", "avx512"};

static int cpu_isa_level(void) {
#if defined(__x86_64__)
    const unsigned f = hp_cpu_features();
    return f & HP_CPU_AVX512 ? ISA_AVX512 : f & HP_CPU_AVX2_FMA ? ISA_AVX2 : f & HP_CPU_AVX ? ISA_AVX
         : f & HP_CPU_SSE42 ? ISA_SSE42 : ISA_SSE2;
#else
    return ISA_UNKNOWN;
#endif
}

const char *hp_cpu_isa_name(void) {
#if defined(__aarch64__)
    return "arm64";
#else
    return isa_names[cpu_isa_level()];
#endif
}

/* The ISA level an OpenBLAS x86-64 kernel family (openblas_get_corename) is written for. */
static int core_isa_level(const char *core) {
    static const struct {
        const char *name;
        int isa;
    } t[] = {{"sapphirerapids", ISA_AVX512}, {"cooperlake", ISA_AVX512}, {"skylakex", ISA_AVX512},
             {"haswell", ISA_AVX2},          {"zen", ISA_AVX2},          {"excavator", ISA_AVX2},
             {"sandybridge", ISA_AVX},       {"bulldozer", ISA_AVX},     {"piledriver", ISA_AVX},
             {"steamroller", ISA_AVX},       {"nehalem", ISA_SSE42},     {"barcelona", ISA_SSE2},
             {"penryn", ISA_SSE2},           {"dunnington", ISA_SSE2},   {"core2", ISA_SSE2},
             {"atom", ISA_SSE2},             {"nano", ISA_SSE2},         {"bobcat", ISA_SSE2},
             {"opteron", ISA_SSE2},          {"prescott", ISA_SSE2}};
    if (!core) return ISA_UNKNOWN;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strncasecmp(core, t[i].name, strlen(t[i].name))) return t[i].isa;
    return ISA_UNKNOWN;
}

static struct {
    int done, selected, forced;
    char library_choice[32];
} state;

/* Families to try for an ISA level, best first, with the exported table that tells whether
 * this build has them (force_coretype falls back to Prescott for a name it does not know, so
 * only families the build has are asked for). */
static int select_family(int want) {
    static const struct {
        const char *name, *table;
        int isa;
    } ladder[] = {
        // SkylakeX, not Cooperlake on AVX512_BF16 CPUs: the same sgemm kernels (Cooperlake adds
        // sbgemm, which Debian's build does not export), and the family OpenBLAS itself picks on
        // the AVX-512 models it knows, so a re-selected CPU computes what a known one does
        {"SkylakeX", "gotoblas_SKYLAKEX", ISA_AVX512},
        {"Zen", "gotoblas_ZEN", ISA_AVX2},   // AMD only (below)
        {"Haswell", "gotoblas_HASWELL", ISA_AVX2},
        {"Sandybridge", "gotoblas_SANDYBRIDGE", ISA_AVX},
        {"Nehalem", "gotoblas_NEHALEM", ISA_SSE42},
    };
    const unsigned f = hp_cpu_features();
    for (size_t i = 0; i < sizeof ladder / sizeof ladder[0]; i++) {
        if (ladder[i].isa > want) continue;
        if (!strcmp(ladder[i].name, "Zen") && (f & HP_CPU_INTEL)) continue;
        if (!dlsym(RTLD_DEFAULT, ladder[i].table)) continue;
        gotoblas_dynamic_quit();
        setenv("OPENBLAS_CORETYPE", ladder[i].name, 1);
        gotoblas_dynamic_init();
        unsetenv("OPENBLAS_CORETYPE");
        const int got = core_isa_level(openblas_get_corename());
        if (got >= ladder[i].isa) return got;
    }
    return core_isa_level(openblas_get_corename());
}

/* The load-time check: the family OpenBLAS chose against the CPU's ISA, re-selected when below
 * (unless the user's OPENBLAS_CORETYPE chose it and honour_env is set). */
static void check_family(int honour_env) {
    const char *core = openblas_get_corename ? openblas_get_corename() : NULL;
    snprintf(state.library_choice, sizeof state.library_choice, "%s", core ? core : "unknown");
    const char *env = getenv("OPENBLAS_CORETYPE");
    state.forced = honour_env && env && *env;
    state.selected = 0;
    const int want = cpu_isa_level();
    int have = core_isa_level(core);
#if defined(__x86_64__)
    if (!state.forced && have != ISA_UNKNOWN && have < want && gotoblas_dynamic_init && gotoblas_dynamic_quit &&
        openblas_get_corename) {
        select_family(want);
        state.selected = 1;
        have = core_isa_level(openblas_get_corename());
    }
#endif
    if (!state.forced && have != ISA_UNKNOWN && have < want)   // could not be fixed: say so at once
        hp_log(HP_LOG_WARN, "GEMM: OpenBLAS runs its %s kernels (%s) on a CPU with %s and cannot switch (not a "
               "DYNAMIC_ARCH build with that family): every GEMM runs several times slower than this CPU can; "
               "install an OpenBLAS built with DYNAMIC_ARCH (Debian's libopenblas0) or for this CPU",
               openblas_get_corename ? openblas_get_corename() : "?", isa_names[have], isa_names[want]);
}

/* Once, at load (below) or at the first hp_gemm_info. */
static void match_cpu(void) {
    if (__atomic_load_n(&state.done, __ATOMIC_ACQUIRE)) return;
    check_family(1);
    __atomic_store_n(&state.done, 1, __ATOMIC_RELEASE);
}

hp_status_t hp_cpu_blas_select_family(const char *name) {
    match_cpu();
    if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit || !openblas_get_corename)
        return hp_error(HP_ERR_UNSUPPORTED, "OpenBLAS kernel family '%s': this BLAS cannot switch families (not an "
                        "OpenBLAS DYNAMIC_ARCH build)", name);
    const char *old = getenv("OPENBLAS_CORETYPE");
    char keep[64];
    snprintf(keep, sizeof keep, "%s", old ? old : "");
    gotoblas_dynamic_quit();
    setenv("OPENBLAS_CORETYPE", name, 1);
    gotoblas_dynamic_init();
    if (old) setenv("OPENBLAS_CORETYPE", keep, 1);
    else unsetenv("OPENBLAS_CORETYPE");
    if (strncasecmp(openblas_get_corename(), name, strlen(name)))
        return hp_error(HP_ERR_UNSUPPORTED, "OpenBLAS kernel family '%s': the library runs '%s' instead (a family "
                        "this build or CPU lacks)", name, openblas_get_corename());
    return HP_OK;
}

void hp_cpu_blas_recheck(void) {
    match_cpu();
    check_family(0);
}

__attribute__((constructor)) static void match_cpu_at_load(void) { match_cpu(); }

void hp_gemm_info(hp_gemm_info_t *out) {
    match_cpu();
    memset(out, 0, sizeof *out);
    const char *core = openblas_get_corename ? openblas_get_corename() : NULL;
    const char *conf = openblas_get_config ? openblas_get_config() : NULL;
    snprintf(out->library, sizeof out->library, "%s", openblas_get_corename ? "OpenBLAS" : "cblas");
    out->version[0] = 0;
    if (conf) {   // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64"
        const char *v = strncmp(conf, "OpenBLAS ", 9) ? conf : conf + 9;
        snprintf(out->version, sizeof out->version, "%.*s", (int)strcspn(v, " "), v);
        out->dynamic_arch = strstr(conf, "DYNAMIC_ARCH") != NULL;
    }
    snprintf(out->core, sizeof out->core, "%s", core ? core : "unknown");
    snprintf(out->library_choice, sizeof out->library_choice, "%s", state.library_choice);
    const int have = core_isa_level(core), want = cpu_isa_level();
    snprintf(out->core_isa, sizeof out->core_isa, "%s", isa_names[have]);
    snprintf(out->cpu_isa, sizeof out->cpu_isa, "%s", hp_cpu_isa_name());
    out->selected = state.selected;
    out->forced = state.forced;
    out->below_cpu = have != ISA_UNKNOWN && want != ISA_UNKNOWN && have < want;
}

int hp_gemm_describe(char *buf, size_t n) {
    hp_gemm_info_t g;
    hp_gemm_info(&g);
    const unsigned f = hp_cpu_features();   // the bf16 units, for the record (f32 GEMMs do not use them)
    int k = snprintf(buf, n, "GEMM: %s %s, %s kernels (%s) on a CPU with %s%s%s", g.library, g.version, g.core,
                     g.core_isa, g.cpu_isa, f & HP_CPU_AVX512_BF16 ? " + avx512_bf16" : "",
                     f & HP_CPU_AMX ? " + amx" : "");
    if (k < 0 || (size_t)k >= n) return g.below_cpu;
    if (g.selected && !g.below_cpu)
        snprintf(buf + k, n - (size_t)k, "; selected at start-up (%s chose %s by itself, a %s family)", g.library,
                 g.library_choice, isa_names[core_isa_level(g.library_choice)]);
    else if (g.below_cpu && g.forced)
        snprintf(buf + k, n - (size_t)k, "; BELOW this CPU: OPENBLAS_CORETYPE=%s is set in the environment (unset "
                 "it to run the %s kernels)", getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "?",
                 g.cpu_isa);
    else if (g.below_cpu)
        snprintf(buf + k, n - (size_t)k, "; BELOW this CPU: %s has no %s kernel family it can switch to (%s); "
                 "GEMMs run several times slower than this CPU can: install an OpenBLAS built with DYNAMIC_ARCH "
                 "(Debian's libopenblas0) or for this CPU", g.library, g.cpu_isa,
                 g.dynamic_arch ? "DYNAMIC_ARCH build without it" : "not a DYNAMIC_ARCH build");
    return g.below_cpu;
}
