/* The planner's calibration (planner.h): this machine's sgemm rate on a grid of shapes, the
 * attention and row kernels' rates, and each collective's latency and bandwidth on 2, 4 and 8
 * ranks, measured with the library's own kernels and collectives; saved as a small text file. */
#define _GNU_SOURCE
#include "hyperparallel/planner.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperparallel/nn_attention.h"
#include "hyperparallel/nn_kernels.h"

#define CALIB_MAGIC "hyperparallel planner calibration"
#define CALIB_VERSION 1

static const int k_gemm_dims[HP_PLAN_GEMM_DIMS] = {32, 256, 1024, 4096};
static const int k_attn_t[HP_PLAN_ATTN_T] = {32, 128, 512, 2048};
static const int k_coll_ranks[HP_PLAN_COLL_SIZES] = {2, 4, 8};

static void fill(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] = s * (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f * s;
}

/* Seconds per call of fn, the median of rounds timed over at least `budget` seconds each. */
#define TIME_MEDIAN(out_, budget_, stmt_)                                              \
    do {                                                                               \
        double r_[5];                                                                  \
        stmt_;                                                                         \
        for (int k_ = 0; k_ < 5; k_++) {                                               \
            int n_ = 0;                                                                \
            double t0_ = hp_clock_now_seconds(), t_;                                   \
            do { stmt_; n_++; t_ = hp_clock_now_seconds() - t0_; } while (t_ < (budget_)); \
            r_[k_] = t_ / n_;                                                          \
        }                                                                              \
        for (int a_ = 0; a_ < 5; a_++)                                                 \
            for (int b_ = a_ + 1; b_ < 5; b_++)                                        \
                if (r_[b_] < r_[a_]) { double s_ = r_[a_]; r_[a_] = r_[b_]; r_[b_] = s_; } \
        (out_) = r_[2];                                                                \
    } while (0)

static void cpu_name(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *p = strchr(line, ':');
        if (!p) break;
        p++;
        while (*p == ' ') p++;
        snprintf(buf, n, "%.127s", p);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    fclose(f);
}

static hp_status_t calibrate_kernels(int quick, hp_plan_calib_t *c) {
    const double budget = quick ? 0.004 : 0.03;
    const size_t maxd = (size_t)k_gemm_dims[HP_PLAN_GEMM_DIMS - 1];
    float *a = hp_aligned_alloc(sizeof(float) * maxd * maxd), *w = hp_aligned_alloc(sizeof(float) * maxd * maxd),
          *o = hp_aligned_alloc(sizeof(float) * maxd * maxd);
    if (!a || !w || !o) { free(a); free(w); free(o); return HP_ERR_OOM; }
    fill(a, maxd * maxd, 1.0f);
    fill(w, maxd * maxd, 0.1f);
    for (int i = 0; i < HP_PLAN_GEMM_DIMS; i++) c->gemm_dims[i] = k_gemm_dims[i];
    for (int i = 0; i < HP_PLAN_GEMM_DIMS; i++)
        for (int j = 0; j < HP_PLAN_GEMM_DIMS; j++)
            for (int k = 0; k < HP_PLAN_GEMM_DIMS; k++) {
                const int M = k_gemm_dims[i], N = k_gemm_dims[j], K = k_gemm_dims[k];
                /* quick mode skips the GEMMs above 2^31 FLOP/2 (compute bound there): they take
                 * the rate of the same (M, N) at the next smaller K */
                double s = 0;
                if (quick && (double)M * N * K > 2147483648.0) { c->gemm_flops[i][j][k] = c->gemm_flops[i][j][k - 1]; continue; }
                TIME_MEDIAN(s, budget, hp_linear_forward(o, a, w, NULL, M, K, N));
                c->gemm_flops[i][j][k] = 2.0 * M * N * K / s;
            }
    free(o);
    free(w);
    /* the row kernels: RMSNorm forward + backward over (N, C) = (4096, 256): reads x, writes y
     * (forward), reads x, dy, writes dx (backward), 5 passes of N C floats */
    {
        const int N = 4096, C = 256;
        float *x = a, *y = hp_aligned_alloc(sizeof(float) * N * C), *dx = hp_aligned_alloc(sizeof(float) * N * C);
        float *wt = hp_aligned_alloc(sizeof(float) * C), *rs = hp_aligned_alloc(sizeof(float) * N);
        if (!y || !dx || !wt || !rs) { free(y); free(dx); free(wt); free(rs); free(a); return HP_ERR_OOM; }
        fill(wt, C, 1.0f);
        double s = 0;
        TIME_MEDIAN(s, budget, (hp_rmsnorm_forward(y, rs, x, wt, N, C, 1e-5f),
                                hp_rmsnorm_backward_input(dx, y, x, wt, rs, N, C, 0)));
        c->row_bytes_per_s = 5.0 * N * C * 4.0 / s;
        free(y); free(dx); free(wt); free(rs);
    }
    /* attention forward + backward, B 1, 4 heads of 64 (q, k, v, out, grads: (T, 4 x 64)) */
    for (int i = 0; i < HP_PLAN_ATTN_T; i++) {
        const int T = k_attn_t[i], H = 4, hd = 64, ld = H * hd;
        const size_t n = (size_t)T * ld;
        float *buf = hp_aligned_alloc(sizeof(float) * (8 * n + (size_t)T * H));
        if (!buf) { free(a); return HP_ERR_OOM; }
        float *q = buf, *k = q + n, *v = k + n, *out = v + n, *dout = out + n, *dq = dout + n, *dk = dq + n,
              *dv = dk + n, *lse = dv + n;
        fill(q, 4 * n, 0.5f);
        fill(dout, n, 0.1f);
        hp_attention_forward(out, lse, q, ld, k, ld, v, ld, 1, T, H, H, hd);
        double s = 0;
        TIME_MEDIAN(s, budget, (hp_attention_forward(out, lse, q, ld, k, ld, v, ld, 1, T, H, H, hd),
                                hp_attention_backward(dq, ld, dk, ld, dv, ld, dout, out, lse, q, ld, k, ld, v, ld, 1, T,
                                                      H, H, hd)));
        c->attn_t[i] = T;
        c->attn_flops[i] = (double)T * T * H * hd / s;
        free(buf);
    }
    free(a);
    return HP_OK;
}

/* alpha (s) and beta (s per byte) of op over comm from two message sizes. */
static hp_status_t calibrate_coll(hp_comm_t comm, hp_plan_coll_t op, int quick, double *alpha, double *beta) {
    const int p = hp_comm_size(comm), me = hp_comm_rank(comm);
    const size_t small = 256, large = quick ? ((size_t)1 << 18) : ((size_t)1 << 20);   /* floats per rank */
    float *buf = hp_aligned_alloc(sizeof(float) * large * (size_t)p * 2);
    if (!buf) return HP_ERR_OOM;
    fill(buf, large * (size_t)p * 2, 1.0f);
    float *out = buf + large * (size_t)p;
    double t[2] = {0, 0};
    const size_t sizes[2] = {small, large};
    const int reps = quick ? 5 : 21;
    hp_status_t s = HP_OK;
    for (int z = 0; z < 2 && s == HP_OK; z++) {
        const size_t n = sizes[z];
        double ts[32];
        int nt = 0;
        for (int r = 0; r < reps + 1 && s == HP_OK; r++) {
            s = hp_barrier(comm, NULL);
            const double t0 = hp_clock_now_seconds();
            switch (op) {
            case HP_PLAN_ALL_REDUCE: s = s ? s : hp_all_reduce(buf, out, n, HP_F32, HP_SUM, comm, NULL); break;
            case HP_PLAN_ALL_GATHER: s = s ? s : hp_all_gather(buf, out, n, HP_F32, comm, NULL); break;
            case HP_PLAN_REDUCE_SCATTER: s = s ? s : hp_reduce_scatter(buf, out, n / (size_t)p + 1, HP_F32, HP_SUM, comm, NULL); break;
            case HP_PLAN_BROADCAST: s = s ? s : hp_broadcast(buf, n, HP_F32, 0, comm, NULL); break;
            case HP_PLAN_ALL_TO_ALL: s = s ? s : hp_all_to_all(buf, out, n / (size_t)p + 1, HP_F32, comm, NULL); break;
            case HP_PLAN_P2P:
                if (me == 0) s = s ? s : hp_send(buf, n, HP_F32, 1, comm, NULL);
                else if (me == 1) s = s ? s : hp_recv(out, n, HP_F32, 0, comm, NULL);
                break;
            default: break;
            }
            float dt = (float)(hp_clock_now_seconds() - t0), mx = dt;   /* the slowest rank's time */
            if (s == HP_OK) s = hp_all_reduce(&dt, &mx, 1, HP_F32, HP_MAX, comm, NULL);
            if (r > 0 && nt < 32) ts[nt++] = mx;   /* the first is a warm-up */
        }
        /* the median, not the best: with more ranks than cores a collective waits for its ranks
         * to be scheduled, and the runs pay that too */
        for (int a = 0; a < nt; a++)
            for (int b = a + 1; b < nt; b++)
                if (ts[b] < ts[a]) { double x = ts[a]; ts[a] = ts[b]; ts[b] = x; }
        t[z] = nt ? ts[nt / 2] : 0.0;
    }
    free(buf);
    HP_TRY(s);
    /* the counters' send-side bytes of each call (docs/comm.md): all-reduce, all-gather,
     * broadcast, send: n floats; reduce-scatter, all-to-all: p x (n / p + 1) */
    double b[2];
    for (int z = 0; z < 2; z++)
        b[z] = 4.0 * (op == HP_PLAN_REDUCE_SCATTER || op == HP_PLAN_ALL_TO_ALL ? (double)p * (sizes[z] / (size_t)p + 1)
                                                                                : (double)sizes[z]);
    *beta = fmax((t[1] - t[0]) / (b[1] - b[0]), 1e-13);
    *alpha = fmax(t[0] - *beta * b[0], 1e-7);
    return HP_OK;
}

hp_status_t hp_plan_calibrate(hp_comm_t world, int quick, hp_plan_calib_t *out) {
    memset(out, 0, sizeof *out);
    const int rank = world ? hp_comm_rank(world) : 0, ws = world ? hp_comm_size(world) : 1;
    hp_status_t s = HP_OK;
    /* the other ranks wait in a non-blocking barrier, sleeping between tests: a blocking
     * collective would poll and take the cores rank 0 measures on */
    hp_work_t bar = NULL;
    if (world && ws > 1) HP_TRY(hp_barrier(world, &bar));
    if (rank == 0) {
        cpu_name(out->cpu, sizeof out->cpu);
        out->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
        out->threads = omp_get_max_threads();
        s = calibrate_kernels(quick, out);
    }
    for (int done = 0; bar && !done;) {
        HP_TRY(hp_work_test(&bar, &done));
        if (!done) usleep(2000);
    }
    if (world) HP_TRY(hp_comm_agree(world, s, NULL));
    else HP_TRY(s);
    for (int i = 0; i < HP_PLAN_COLL_SIZES; i++) {
        const int p = k_coll_ranks[i];
        if (p > ws) break;
        hp_comm_t sub = NULL;
        HP_TRY(hp_comm_split(world, rank < p ? 0 : -1, rank, &sub));
        for (int op = 0; op < HP_PLAN_COLL_COUNT && sub; op++) {
            double a = 0, b = 0;
            hp_status_t cs = calibrate_coll(sub, (hp_plan_coll_t)op, quick, &a, &b);
            if (cs != HP_OK) { hp_comm_destroy(sub); return cs; }
            out->alpha[op][i] = a;
            out->beta[op][i] = b;
        }
        if (sub) HP_TRY(hp_comm_destroy(sub));
        out->coll_ranks[i] = p;
    }
    if (world && ws > 1) HP_TRY(hp_broadcast(out, sizeof *out, HP_U8, 0, world, NULL));
    return HP_OK;
}

double hp_plan_gemm_rate(const hp_plan_calib_t *c, double M, double N, double K) {
    /* trilinear in log of each dim, clamped at the grid's ends */
    const double x[3] = {M, N, K};
    int lo[3];
    double w[3];
    for (int d = 0; d < 3; d++) {
        int i = 0;
        while (i + 2 < HP_PLAN_GEMM_DIMS && c->gemm_dims[i + 1] < x[d]) i++;
        const double a = log(c->gemm_dims[i]), b = log(c->gemm_dims[i + 1]);
        double t = (log(x[d] > 1 ? x[d] : 1) - a) / (b - a);
        lo[d] = i;
        w[d] = t < 0 ? 0 : t > 1 ? 1 : t;
    }
    double acc = 0;
    for (int m = 0; m < 8; m++) {
        const int di = m & 1, dj = (m >> 1) & 1, dk = (m >> 2) & 1;
        const double wt = (di ? w[0] : 1 - w[0]) * (dj ? w[1] : 1 - w[1]) * (dk ? w[2] : 1 - w[2]);
        acc += wt * log(c->gemm_flops[lo[0] + di][lo[1] + dj][lo[2] + dk]);
    }
    return exp(acc);
}

double hp_plan_coll_seconds(const hp_plan_calib_t *c, hp_plan_coll_t op, int ranks, double bytes) {
    if (ranks <= 1) return 0.0;
    /* the measured communicator size nearest above (or the largest, its bandwidth term scaled
     * by the ring's (p - 1) / p) */
    int best = -1;
    for (int i = 0; i < HP_PLAN_COLL_SIZES; i++)
        if (c->coll_ranks[i] > 0 && (best < 0 || (c->coll_ranks[best] < ranks && c->coll_ranks[i] > c->coll_ranks[best])))
            best = i;
    for (int i = 0; i < HP_PLAN_COLL_SIZES; i++)
        if (c->coll_ranks[i] >= ranks && c->coll_ranks[i] < c->coll_ranks[best]) best = i;
    if (best < 0) return 0.0;
    const double q = c->coll_ranks[best];
    const double scale = ranks > q ? ((ranks - 1.0) / ranks) / ((q - 1.0) / q) : 1.0;
    return c->alpha[op][best] + bytes * c->beta[op][best] * scale;
}

void hp_plan_calib_default_path(char *buf, size_t n) {
    const char *e = getenv("HP_PLAN_CALIBRATION");
    if (e && *e) { snprintf(buf, n, "%s", e); return; }
    const char *home = getenv("HOME");
    snprintf(buf, n, "%s/.cache/hyperparallel/calibration.txt", home && *home ? home : "/tmp");
}

static void mkdirs_for(const char *path) {
    char d[1024];
    snprintf(d, sizeof d, "%s", path);
    for (char *p = d + 1; *p; p++)
        if (*p == '/') { *p = '\0'; (void)mkdir(d, 0755); *p = '/'; }
}

hp_status_t hp_plan_calib_save(const hp_plan_calib_t *c, const char *path) {
    mkdirs_for(path);
    FILE *f = fopen(path, "w");
    if (!f)
        return hp_error(HP_ERR_IO, "planner calibration '%s': cannot write (%s); hint: pass --calibration FILE with a "
                        "writable path", path, strerror(errno));
    fprintf(f, "%s %d\ncpu %s\ncores %d\nthreads %d\n", CALIB_MAGIC, CALIB_VERSION, c->cpu, c->cores, c->threads);
    for (int i = 0; i < HP_PLAN_GEMM_DIMS; i++)
        for (int j = 0; j < HP_PLAN_GEMM_DIMS; j++)
            for (int k = 0; k < HP_PLAN_GEMM_DIMS; k++)
                fprintf(f, "gemm %d %d %d %.6e\n", c->gemm_dims[i], c->gemm_dims[j], c->gemm_dims[k], c->gemm_flops[i][j][k]);
    for (int i = 0; i < HP_PLAN_ATTN_T; i++) fprintf(f, "attention %d %.6e\n", c->attn_t[i], c->attn_flops[i]);
    fprintf(f, "row_bytes_per_s %.6e\n", c->row_bytes_per_s);
    for (int i = 0; i < HP_PLAN_COLL_SIZES; i++)
        for (int op = 0; op < HP_PLAN_COLL_COUNT && c->coll_ranks[i]; op++)
            fprintf(f, "coll %d %d %.6e %.6e\n", op, c->coll_ranks[i], c->alpha[op][i], c->beta[op][i]);
    if (fclose(f) != 0) return hp_error(HP_ERR_IO, "planner calibration '%s': write failed (%s)", path, strerror(errno));
    return HP_OK;
}

hp_status_t hp_plan_calib_load(const char *path, hp_plan_calib_t *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f)
        return hp_error(HP_ERR_IO, "planner calibration '%s': cannot read (%s); hint: measure this machine once with "
                        "`mpirun -np 8 hp-plan --calibrate` (or pass --calibration FILE)", path, strerror(errno));
    char line[512];
    int version = 0, ng = 0, na = 0, bad = 0;
    if (!fgets(line, sizeof line, f) || sscanf(line, CALIB_MAGIC " %d", &version) != 1 || version != CALIB_VERSION) {
        fclose(f);
        return hp_error(HP_ERR_FORMAT, "planner calibration '%s': not a version %d calibration file (first line "
                        "expected '%s %d'); hint: rerun `hp-plan --calibrate`", path, CALIB_VERSION, CALIB_MAGIC,
                        CALIB_VERSION);
    }
    for (int i = 0; i < HP_PLAN_GEMM_DIMS; i++) out->gemm_dims[i] = k_gemm_dims[i];
    while (fgets(line, sizeof line, f)) {
        int a, b, c3, op;
        double v, w;
        if (!strncmp(line, "cpu ", 4)) {
            snprintf(out->cpu, sizeof out->cpu, "%.127s", line + 4);
            out->cpu[strcspn(out->cpu, "\n")] = '\0';
        } else if (sscanf(line, "cores %d", &a) == 1) out->cores = a;
        else if (sscanf(line, "threads %d", &a) == 1) out->threads = a;
        else if (sscanf(line, "gemm %d %d %d %lf", &a, &b, &c3, &v) == 4 && ng < 64) {
            out->gemm_flops[ng / 16][(ng / 4) % 4][ng % 4] = v;
            bad |= a != k_gemm_dims[ng / 16] || b != k_gemm_dims[(ng / 4) % 4] || c3 != k_gemm_dims[ng % 4];
            ng++;
        } else if (sscanf(line, "attention %d %lf", &a, &v) == 2 && na < HP_PLAN_ATTN_T) {
            out->attn_t[na] = a;
            out->attn_flops[na++] = v;
        } else if (sscanf(line, "row_bytes_per_s %lf", &v) == 1) out->row_bytes_per_s = v;
        else if (sscanf(line, "coll %d %d %lf %lf", &op, &a, &v, &w) == 4 && op >= 0 && op < HP_PLAN_COLL_COUNT) {
            for (int i = 0; i < HP_PLAN_COLL_SIZES; i++)
                if (k_coll_ranks[i] == a) {
                    out->coll_ranks[i] = a;
                    out->alpha[op][i] = v;
                    out->beta[op][i] = w;
                }
        }
    }
    fclose(f);
    if (bad || ng != 64 || na != HP_PLAN_ATTN_T || out->row_bytes_per_s <= 0 || out->cores < 1 || out->threads < 1)
        return hp_error(HP_ERR_FORMAT, "planner calibration '%s': incomplete (%d of 64 GEMM rates, %d of %d attention "
                        "rates); hint: rerun `hp-plan --calibrate`", path, ng, na, HP_PLAN_ATTN_T);
    return HP_OK;
}
