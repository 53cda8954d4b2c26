/* Non-GEMM kernel benchmark: rmsnorm, rope, swiglu, cross-entropy and the AdamW update at the
 * llama3 debugmodel shapes (B 8, T 256: 2048 rows, dim 256, 16 heads of 16, ffn 768, vocab
 * 2048; AdamW over its 6.16 M parameters) against a stream-like bound: for each kernel, a
 * "twin" loop that reads and writes exactly the arrays the kernel must touch (out = sum of the
 * inputs, OpenMP over the same threads, same buffers), timed interleaved with the kernel in the
 * same rounds. kernel time / twin time near 1 means the kernel runs at memory bandwidth; the
 * GB/s column counts the kernel's compulsory bytes.
 *   bench_kernels [--rounds 7] [--threads 2] [--isa auto|portable|avx2|avx512] [--secs 0.1] [--rows 2048]
 * Best over rounds (least disturbed by other load on a shared machine). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/backend.h"
#include "hyperparallel/nn.h"
#include "hyperparallel/nn_loss.h"

static float *filled(size_t n, unsigned seed, float scale, float shift) {
    float *p = hp_aligned_alloc(sizeof(float) * (n ? n : 1));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        p[i] = ((float)(x >> 40) / 16777216.0f * 2.0f - 1.0f) * scale + shift;
    }
    return p;
}

/* The stream twin: out_j[i] = in_0[i] + ... for nr <= 4 inputs and nw <= 3 outputs of n floats
 * (one specialised loop per count, so each vectorises like a STREAM kernel; reads-only twins
 * sum into a sink so that the loads stay). */
static volatile float twin_sink;
#define TWIN_LOOP(EXPR, STORES)                                                                      \
    do {                                                                                             \
        float acc = 0.0f;                                                                            \
        _Pragma("omp parallel for simd schedule(static) reduction(+ : acc)")                         \
        for (int64_t i = 0; i < n; i++) {                                                            \
            const float s_ = EXPR;                                                                   \
            STORES;                                                                                  \
        }                                                                                            \
        twin_sink = acc;                                                                             \
    } while (0)
static void twin(int nr, const float *const *in, int nw, float *const *out, int64_t n) {
    const float *a = in[0], *b = nr > 1 ? in[1] : NULL, *c = nr > 2 ? in[2] : NULL, *d = nr > 3 ? in[3] : NULL;
    float *x = nw > 0 ? out[0] : NULL, *y = nw > 1 ? out[1] : NULL, *z = nw > 2 ? out[2] : NULL;
    const int key = nr * 10 + nw;
    switch (key) {
    case 10: TWIN_LOOP(a[i], acc += s_); break;
    case 11: TWIN_LOOP(a[i], x[i] = s_); break;
    case 20: TWIN_LOOP(a[i] + b[i], acc += s_); break;
    case 21: TWIN_LOOP(a[i] + b[i], x[i] = s_); break;
    case 32: TWIN_LOOP(a[i] + b[i] + c[i], (x[i] = s_, y[i] = s_)); break;
    case 43: TWIN_LOOP(a[i] + b[i] + c[i] + d[i], (x[i] = s_, y[i] = s_, z[i] = s_)); break;
    default: fprintf(stderr, "twin: no loop for %d reads, %d writes\n", nr, nw); exit(1);
    }
}

enum { K_RMS_F, K_RMS_BI, K_RMS_BW, K_ROPE, K_SWI_F, K_SWI_B, K_CE_F, K_CE_B, K_ADAMW, N_K };
static const char *const names[N_K] = {"rmsnorm.fwd", "rmsnorm.bwd_input", "rmsnorm.bwd_weight", "rope",
                                       "swiglu.fwd", "swiglu.bwd", "cross_entropy.fwd", "cross_entropy.bwd",
                                       "adamw"};

typedef struct {
    int N, C, H, V, nh, hd;
    int64_t np;   // AdamW parameters
    float *x, *y, *dy, *dx, *w, *dw, *rstd, *qk, *cs, *sn, *h13, *sw, *dsw, *dh13, *lg, *dlg, *lse, *p, *m, *v, *g;
    double *losses;
    int32_t *tgt;
    const hp_backend_t *be;
} prob_t;

/* Runs kernel k (twin_too: its stream twin instead); returns the compulsory bytes. */
static double run(prob_t *P, int k, int as_twin) {
    const int N = P->N, C = P->C, H = P->H, V = P->V;
    const int64_t NC = (int64_t)N * C, NH = (int64_t)N * H, NV = (int64_t)N * V, NQ = (int64_t)N * P->nh * P->hd;
    switch (k) {
    case K_RMS_F:
        if (as_twin) twin(1, (const float *[]){P->x}, 1, (float *[]){P->y}, NC);
        else hp_rmsnorm_forward(P->y, P->rstd, P->x, P->w, N, C, 1e-5f);
        return 8.0 * NC;
    case K_RMS_BI:
        if (as_twin) twin(2, (const float *[]){P->x, P->dy}, 1, (float *[]){P->dx}, NC);
        else hp_rmsnorm_backward_input(P->dx, P->dy, P->x, P->w, P->rstd, N, C, 0);
        return 12.0 * NC;
    case K_RMS_BW:
        if (as_twin) twin(2, (const float *[]){P->x, P->dy}, 0, NULL, NC);
        else hp_rmsnorm_backward_weight(P->dw, P->dy, P->x, P->rstd, N, C);
        return 8.0 * NC;
    case K_ROPE:   // q and k heads of a packed row, in place (read + write)
        if (as_twin) twin(1, (const float *[]){P->qk}, 1, (float *[]){P->qk}, NQ);
        else hp_rope_apply(P->qk, P->nh * P->hd, 8, N / 8, P->nh, P->hd, P->cs, P->sn, HP_ROPE_INTERLEAVED, 0);
        return 8.0 * NQ;
    case K_SWI_F:
        if (as_twin) twin(2, (const float *[]){P->h13, P->h13 + NH}, 1, (float *[]){P->sw}, NH);
        else hp_swiglu_forward(P->sw, P->h13, N, H);
        return 12.0 * NH;
    case K_SWI_B:
        if (as_twin) twin(3, (const float *[]){P->dsw, P->h13, P->h13 + NH}, 2, (float *[]){P->dh13, P->dh13 + NH}, NH);
        else hp_swiglu_backward(P->dh13, P->dsw, P->h13, N, H);
        return 20.0 * NH;
    case K_CE_F:
        if (as_twin) twin(1, (const float *[]){P->lg}, 0, NULL, NV);
        else hp_cross_entropy_forward(P->losses, P->lse, P->lg, P->tgt, N, V, NULL);
        return 4.0 * NV;
    case K_CE_B:
        if (as_twin) twin(1, (const float *[]){P->lg}, 1, (float *[]){P->dlg}, NV);
        else hp_cross_entropy_backward(P->dlg, P->lg, P->lse, P->tgt, 1.0f / N, N, V);
        return 8.0 * NV;
    default:
        if (as_twin) twin(4, (const float *[]){P->p, P->m, P->v, P->g}, 3, (float *[]){P->p, P->m, P->v}, P->np);
        else P->be->adamw_update(P->be->ctx, P->p, P->m, P->v, P->g, P->np, 1e-9, 0.9, 0.95, 1e-8, 0.1, 3);
        return 28.0 * (double)P->np;
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int rounds = 7, threads = 2, rows = 2048;
    double secs = 0.1;
    const char *isa = "auto";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--secs") && i + 1 < argc) secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) isa = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--rounds N] [--threads N] [--secs S] [--rows N] [--isa auto|portable|avx2|avx512]\n",
                    argv[0]);
            return 2;
        }
    }
    if (rounds < 1 || threads < 1 || rows < 8 || rows % 8) {
        fprintf(stderr, "rounds, threads >= 1; rows a multiple of 8\n");
        return 2;
    }
    if (strcmp(isa, "auto")) {
        hp_nn_isa_t want = !strcmp(isa, "portable") ? HP_NN_ISA_PORTABLE : !strcmp(isa, "avx2") ? HP_NN_ISA_AVX2
                         : !strcmp(isa, "avx512") ? HP_NN_ISA_AVX512 : HP_NN_ISA_AUTO;
        if (want == HP_NN_ISA_AUTO || hp_nn_set_isa(want) != HP_OK) {
            fprintf(stderr, "--isa %s: not available here (%s)\n", isa, hp_last_error());
            return 2;
        }
    }
    omp_set_num_threads(threads);
    prob_t P = {.N = rows, .C = 256, .H = 768, .V = 2048, .nh = 32, .hd = 16, .np = 6163712};
    const int64_t NC = (int64_t)P.N * P.C, NH = (int64_t)P.N * P.H, NV = (int64_t)P.N * P.V;
    P.x = filled(NC, 1, 1, 0), P.y = filled(NC, 2, 1, 0), P.dy = filled(NC, 3, 1, 0), P.dx = filled(NC, 4, 1, 0);
    P.w = filled(P.C, 5, 0.1f, 1), P.dw = filled(P.C, 6, 0, 0), P.rstd = filled(P.N, 7, 0.1f, 1);
    P.qk = filled((int64_t)P.N * P.nh * P.hd, 8, 1, 0);
    P.cs = filled((int64_t)(P.N / 8) * P.hd / 2, 9, 1, 0), P.sn = filled((int64_t)(P.N / 8) * P.hd / 2, 10, 1, 0);
    P.h13 = filled(2 * NH, 11, 3, 0), P.sw = filled(NH, 12, 1, 0), P.dsw = filled(NH, 13, 1, 0);
    P.dh13 = filled(2 * NH, 14, 1, 0);
    P.lg = filled(NV, 15, 4, 0), P.dlg = filled(NV, 16, 1, 0), P.lse = filled(P.N, 17, 1, 0);
    P.p = filled(P.np, 18, 0.02f, 0), P.m = filled(P.np, 19, 0.001f, 0), P.v = filled(P.np, 20, 1e-6f, 1e-6f);
    P.g = filled(P.np, 21, 0.001f, 0);
    P.losses = malloc(sizeof(double) * (size_t)P.N);
    P.tgt = malloc(sizeof(int32_t) * (size_t)P.N);
    for (int n = 0; n < P.N; n++) P.tgt[n] = (n * 7919) % P.V;
    P.be = hp_backend_cpu();
    hp_cross_entropy_forward(P.losses, P.lse, P.lg, P.tgt, P.N, P.V, NULL);   // a real lse for the backward

    double *t = calloc((size_t)N_K * 2 * rounds, sizeof(double));
    int reps[N_K][2];
    for (int k = 0; k < N_K; k++)
        for (int s = 0; s < 2; s++) {
            double t0 = hp_clock_now_seconds();
            run(&P, k, s);   // warm-up; sizes the repetitions
            double dt = hp_clock_now_seconds() - t0;
            reps[k][s] = dt > 0 ? (int)ceil(secs / dt) : 1;
            if (reps[k][s] < 1) reps[k][s] = 1;
        }
    double bytes[N_K];
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < N_K; k++)
            for (int s = 0; s < 2; s++) {   // kernel, then its twin: interleaved
                double t0 = hp_clock_now_seconds();
                for (int n = 0; n < reps[k][s]; n++) bytes[k] = run(&P, k, s);
                t[((size_t)k * 2 + s) * rounds + r] = (hp_clock_now_seconds() - t0) / reps[k][s];
            }
    double la[1] = {0};
    if (getloadavg(la, 1) != 1) la[0] = -1;
    printf("bench_kernels: %d rows (llama3 debugmodel B*T), %d threads, isa %s, best of %d rounds, load average %.2f\n",
           P.N, threads, hp_nn_isa_name(hp_nn_isa()), rounds, la[0]);
    printf("%-20s %10s %10s %9s %9s %12s\n", "kernel", "ms", "twin ms", "GB/s", "twin GB/s", "kernel/twin");
    for (int k = 0; k < N_K; k++) {
        double *a = t + (size_t)k * 2 * rounds, *b = a + rounds;
        qsort(a, rounds, sizeof(double), cmp_double);
        qsort(b, rounds, sizeof(double), cmp_double);
        printf("%-20s %10.3f %10.3f %9.1f %9.1f %11.2fx\n", names[k], 1e3 * a[0], 1e3 * b[0], bytes[k] / a[0] / 1e9,
               bytes[k] / b[0] / 1e9, a[0] / b[0]);
        printf("RESULT kernel %s ms %.4f twin_ms %.4f ratio %.3f\n", names[k], 1e3 * a[0], 1e3 * b[0], a[0] / b[0]);
    }
    free(t);
    return 0;
}
