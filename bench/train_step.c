/* Training-step benchmark: one full step (zero_grad, forward, backward, clip_grad_norm, AdamW)
 * of a model.h model on one rank, reporting tokens/s, GFLOP/s by TorchTitan's FLOPs-per-token
 * formula, and MFU against two peaks measured in the same run with the same thread count: the
 * cores' f32 FMA peak (hp_cpu_fma_peak_flops: what the hardware does, whatever kernels the BLAS
 * picked) and the cblas_sgemm peak (what the GEMM library reaches); plus the per-op time
 * breakdown of hp_model_profile. Run through
 * tools/bench_train_step.sh, which also runs the PyTorch eager and torch.compile steps
 * (bench/train_step_torch.py). It prints the CPU model, the nn kernels' ISA path (hp_nn_isa,
 * chosen from cpuid at run time) and the GEMM kernels in use (hp_gemm_describe: the OpenBLAS
 * family against the CPU's ISA, a WARNING when below), so a result says what it ran on.
 * --dtype bfloat16 runs the linears' GEMMs in bf16 (hp_model_set_compute_dtype; training.dtype),
 * the row PyTorch's CPU autocast bf16 step (train_step_torch.py --autocast) is compared with.
 *   bench_train_step [--model llama3] [--flavor debugmodel] [--batch 8] [--seq 256]
 *                    [--steps 5] [--warmup 2] [--threads 2] [--dtype float32|bfloat16] */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/nn.h"
#include "hyperparallel/optim.h"

void openblas_set_num_threads(int n);   /* OpenBLAS extensions (cblas.h of some versions lacks them) */
char *openblas_get_corename(void);
char *openblas_get_config(void);

/* The CPU's model name from /proc/cpuinfo (Linux), or "unknown". */
static void cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *c = strchr(line, ':');
        if (c && (!strncmp(line, "model name", 10) || !strncmp(line, "Model", 5))) {
            c++;
            while (*c == ' ' || *c == '\t') c++;
            snprintf(buf, n, "%s", c);
            buf[strcspn(buf, "\n")] = 0;
            break;
        }
    }
    fclose(f);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best GFLOP/s of C = A B on n x n f32 squares (the machine's attainable GEMM peak). */
static double sgemm_peak(int n, int reps) {
    float *a = malloc(sizeof(float) * (size_t)n * n), *b = malloc(sizeof(float) * (size_t)n * n),
          *c = malloc(sizeof(float) * (size_t)n * n);
    if (!a || !b || !c) {
        fprintf(stderr, "sgemm_peak: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
        b[i] = (float)((i * 53) % 103) / 103.0f - 0.5f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = hp_clock_now_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double g = 2.0 * n * (double)n * n / (hp_clock_now_seconds() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

/* The bf16 register-only peak of this CPU (no memory traffic): 16 independent accumulators
 * per thread, every thread of the OpenMP team busy; GFLOP/s over the team. vdpbf16ps zmm
 * (AVX512_BF16: 32 bf16 pairs multiplied and added into 16 f32 lanes, 64 FLOP each), the
 * fastest arithmetic a bf16 GEMM on this CPU could use. (The f32 FMA peak is the library's
 * hp_cpu_fma_peak_flops, the MFU denominator of hp-train too.) */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PEAK_ITERS 4000000L
__attribute__((target("avx512f,avx512bf16"))) static double bf16_dot_peak_kernel(long iters, float *sink) {
    __m512 acc[16];
    __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f80);   // 1.0
    for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    }
    __m512 s = acc[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_ps(s, acc[i]);
    *sink = _mm512_reduce_add_ps(s);
    return 64.0 * 16.0 * (double)iters;
}
/* kind 1: bf16 dot product. Best of 3; 0 when the CPU lacks the instructions. */
static double arith_peak(int kind) {
    __builtin_cpu_init();
    if (kind != 1 || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) return 0.0;
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double flops = 0, t0 = hp_clock_now_seconds();
#pragma omp parallel reduction(+ : flops)
        {
            float sink;
            flops += bf16_dot_peak_kernel(PEAK_ITERS, &sink);
            if (sink == 1234.5f) printf(" ");   /* keeps the loop alive */
        }
        double g = flops / (hp_clock_now_seconds() - t0) / 1e9;
        if (g > best) best = g;
    }
    return best;
}
#else
static double arith_peak(int kind) { (void)kind; return 0.0; }
#endif

#define CHECK(expr)                                                                     \
    do {                                                                                \
        hp_status_t s_ = (expr);                                                        \
        if (s_ != HP_OK) {                                                              \
            fprintf(stderr, "%s failed: %s: %s\n", #expr, hp_status_string(s_), hp_last_error()); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

int main(int argc, char **argv) {
    const char *model = "llama3", *flavor = "debugmodel", *dtype = "float32";
    int B = 8, T = 256, steps = 5, warmup = 2, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--flavor")) flavor = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
        else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (steps < 1 || B < 1 || T < 1 || threads < 1) {
        fprintf(stderr, "steps, batch, seq and threads must be >= 1\n");
        return 2;
    }
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);

    double peak = fmax(sgemm_peak(1024, 5), sgemm_peak(2048, 3));

    hp_model_config_t cfg;
    CHECK(hp_model_flavor(model, flavor, &cfg));
    cfg.max_seq_len = T;
    hp_model_t m;
    CHECK(hp_model_create(&cfg, B, T, &m));
    CHECK(hp_model_init_weights(m, 0));
    const int bf16 = !strcmp(dtype, "bfloat16");
    if (!bf16 && strcmp(dtype, "float32")) {
        fprintf(stderr, "--dtype %s: expected float32 or bfloat16\n", dtype);
        return 2;
    }
    if (bf16) CHECK(hp_model_set_compute_dtype(m, HP_BF16));
    hp_optim_config_t oc = hp_optim_default(HP_OPTIM_ADAMW);   // TorchTitan's defaults
    oc.lr = 8e-4;
    oc.beta2 = 0.95;
    oc.weight_decay = 0.1;
    hp_optim_t opt;
    CHECK(hp_optim_create(&oc, hp_model_params(m), hp_model_num_params(m), &opt));

    // a fixed batch: tokens from an LCG, targets = next token
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B * T), *tgt = malloc(sizeof(int32_t) * (size_t)B * T);
    uint64_t x = 12345;
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int32_t)((x >> 33) % (uint64_t)cfg.vocab_size);
    }
    for (int64_t i = 0; i < (int64_t)B * T; i++) tgt[i] = (i + 1) % T ? tok[i + 1] : -100;
    int64_t valid = 0;
    for (int64_t i = 0; i < (int64_t)B * T; i++) valid += tgt[i] != -100;

    const char **names = NULL;
    const double *secs = NULL;
    int nops = hp_model_profile(m, &names, &secs);
    double *op_total = calloc((size_t)nops + 1, sizeof(double));
    double *step_t = calloc((size_t)steps, sizeof(double));
    double t_fwd = 0, t_bwd = 0, t_clip = 0, t_opt = 0, t_zero = 0;
    float loss = 0, first_loss = 0;
    for (int s = 0; s < warmup + steps; s++) {
        double t0 = hp_clock_now_seconds();
        CHECK(hp_model_zero_grad(m));
        double t1 = hp_clock_now_seconds();
        CHECK(hp_model_forward(m, tok, tgt, B, T, (float)valid, &loss));
        double t2 = hp_clock_now_seconds();
        CHECK(hp_model_backward(m));
        double t3 = hp_clock_now_seconds();
        double norm;
        CHECK(hp_clip_grad_norm(hp_model_params(m), hp_model_num_params(m), 1.0, NULL, 0, &norm));
        double t4 = hp_clock_now_seconds();
        CHECK(hp_optim_step(opt, 1.0));
        double t5 = hp_clock_now_seconds();
        if (s == 0) first_loss = loss;
        if (s >= warmup) {
            int k = s - warmup;
            step_t[k] = t5 - t0;
            t_zero += t1 - t0;
            t_fwd += t2 - t1;
            t_bwd += t3 - t2;
            t_clip += t4 - t3;
            t_opt += t5 - t4;
            hp_model_profile(m, &names, &secs);
            for (int i = 0; i < nops; i++) op_total[i] += secs[i];
        }
    }
    /* the peak again after the steps; the higher of the two (other load on a shared machine
     * only lowers it) */
    peak = fmax(peak, fmax(sgemm_peak(1024, 5), sgemm_peak(2048, 3)));
    double *sorted = malloc(sizeof(double) * (size_t)steps);
    memcpy(sorted, step_t, sizeof(double) * (size_t)steps);
    qsort(sorted, (size_t)steps, sizeof(double), cmp_double);
    double med = sorted[steps / 2], best = sorted[0];
    double mean = 0;
    for (int i = 0; i < steps; i++) mean += step_t[i];
    mean /= steps;
    double tokens = (double)B * T;
    double fpt = hp_model_flops_per_token(&cfg, T);
    double tps = tokens / med;
    double gflops = fpt * tps / 1e9;

    printf("bench_train_step: %s %s, B=%d T=%d, %d threads, %lld params, %.1f MFLOP/token (TorchTitan formula)\n",
           model, flavor, B, T, threads, (long long)hp_model_param_count(&cfg, 0), fpt / 1e6);
    {
        char cpu[256];
        cpu_model(cpu, sizeof cpu);
        const char *core = openblas_get_corename(), *conf = openblas_get_config();
        printf("cpu: %s (%s); nn ISA path: %s (HP_NN_ISA to force); OpenBLAS core: %s (%s)\n", cpu,
               hp_cpu_isa_name(), hp_nn_isa_name(hp_nn_isa()), core ? core : "?", conf ? conf : "?");
        char gemm[512];
        const int below = hp_gemm_describe(gemm, sizeof gemm);
        printf("%s%s\n", below ? "WARNING: " : "", gemm);
        if (bf16) {
            hp_gemm_bf16_describe(gemm, sizeof gemm);
            printf("dtype bfloat16: the linears' GEMMs in bf16 (f32 sums), all else f32; %s\n", gemm);
        }
        printf("RESULT env isa %s openblas_core %s cpu_isa %s gemm_below_cpu %d\n", hp_nn_isa_name(hp_nn_isa()),
               core ? core : "?", hp_cpu_isa_name(), below);
    }
    printf("sgemm peak (cblas_sgemm 1024^3 and 2048^3, best of reps before and after the steps): %.1f GFLOP/s\n", peak);
    double pf = 0;
    {
        double pb = arith_peak(1);
        CHECK(hp_cpu_fma_peak_flops(threads, 0.5, &pf));
        pf /= 1e9;
        printf("f32 FMA peak (hp_cpu_fma_peak_flops, %s, %d threads): %.1f GFLOP/s; sgemm reaches %.1f%% of it\n",
               hp_cpu_isa_name(), threads, pf, 100.0 * peak / pf);
        printf("register peaks (%d threads, no memory traffic): f32 FMA %.1f GFLOP/s, bf16 dot product "
               "(vdpbf16ps) %.1f GFLOP/s%s\n", threads, pf, pb, pb > 0 ? "" : " (no AVX512_BF16 on this CPU)");
        printf("tokens/s ceilings at %.1f MFLOP/token (every FLOP at the peak): sgemm %.0f, f32 FMA %.0f, "
               "bf16 dot %.0f\n", fpt / 1e6, peak * 1e9 / fpt, pf * 1e9 / fpt, pb * 1e9 / fpt);
        printf("RESULT peaks f32_fma_gflops %.1f bf16_dot_gflops %.1f mflop_per_token %.3f\n", pf, pb, fpt / 1e6);
    }
    printf("loss: step 0 %.4f -> step %d %.4f (same batch)\n", first_loss, warmup + steps - 1, loss);
    printf("step time: median %.1f ms, mean %.1f ms over %d steps (after %d warm-up)\n", med * 1e3, mean * 1e3,
           steps, warmup);
    printf("step time: best %.1f ms\n", best * 1e3);
    /* median-based, then best-step-based (least disturbed by other load on the machine) */
    printf("RESULT hp tokens_per_s %.1f gflops %.2f mfu_pct %.1f peak_gflops %.1f step_ms %.1f "
           "best_tokens_per_s %.1f best_gflops %.2f best_step_ms %.1f fma_peak_gflops %.1f mfu_fma_pct %.1f\n",
           tps, gflops, 100.0 * gflops / peak, peak, med * 1e3, tokens / best, fpt * tokens / best / 1e9,
           best * 1e3, pf, 100.0 * gflops / pf);
    printf("MFU: %.1f%% of the f32 FMA peak (%.1f GFLOP/s), %.1f%% of the sgemm peak (%.1f GFLOP/s)\n",
           100.0 * gflops / pf, pf, 100.0 * gflops / peak, peak);
    printf("phase breakdown (mean per step): zero_grad %.1f ms, forward %.1f ms, backward %.1f ms, "
           "clip %.1f ms, adamw %.1f ms\n",
           1e3 * t_zero / steps, 1e3 * t_fwd / steps, 1e3 * t_bwd / steps, 1e3 * t_clip / steps,
           1e3 * t_opt / steps);
    double prof_sum = 0;
    for (int i = 0; i < nops; i++) prof_sum += op_total[i];
    /* FLOPs per step of the GEMM-shaped ops, to show each kernel's efficiency: block linears
     * 2 * tokens * (dim x (q + 2 kv) + q x dim + 3 dim x hidden) per layer, once per product
     * (fwd, bwd_input, bwd_weight); output 2 * tokens * dim * vocab; attention (causal, exact
     * count) fwd 2 * B * H * T * (T + 1) * hd per layer (QK^T and PV), bwd 2.5x fwd (S
     * recomputed, then dV, dP, dQ, dK). */
    const double qd = (double)cfg.n_heads * cfg.head_dim, kd = (double)cfg.n_kv_heads * cfg.head_dim;
    const double lin = 2.0 * tokens * cfg.n_layers *
                       (cfg.dim * (qd + 2 * kd) + qd * cfg.dim + 3.0 * cfg.dim * cfg.hidden_dim);
    const double outp = 2.0 * tokens * cfg.dim * (double)cfg.vocab_size;
    const double att = 2.0 * B * (double)cfg.n_heads * T * (T + 1.0) * cfg.head_dim * cfg.n_layers;
    printf("per-op (hp_model_profile, mean per step; %% of forward+backward; GFLOP/s where GEMM-shaped):\n");
    for (int i = 0; i < nops; i++) {
        if (op_total[i] <= 0) continue;
        double fl = 0;
        if (!strcmp(names[i], "linear.fwd") || !strcmp(names[i], "linear.bwd_input") ||
            !strcmp(names[i], "linear.bwd_weight"))
            fl = lin;
        else if (!strncmp(names[i], "output.", 7)) fl = outp;
        else if (!strcmp(names[i], "attention.fwd")) fl = att;
        else if (!strcmp(names[i], "attention.bwd")) fl = 2.5 * att;
        printf("  %-22s %8.2f ms  %5.1f%%", names[i], 1e3 * op_total[i] / steps,
               100.0 * op_total[i] / (t_fwd + t_bwd));
        if (fl > 0) printf("  %7.1f GFLOP/s", fl * steps / op_total[i] / 1e9);
        printf("\n");
    }
    printf("  %-22s %8.2f ms  %5.1f%%\n", "(unattributed)", 1e3 * (t_fwd + t_bwd - prof_sum) / steps,
           100.0 * (t_fwd + t_bwd - prof_sum) / (t_fwd + t_bwd));
    free(sorted);
    free(step_t);
    free(op_total);
    free(tok);
    free(tgt);
    hp_optim_free(opt);
    hp_model_destroy(m);
    return 0;
}
