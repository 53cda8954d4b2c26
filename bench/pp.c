/* Pipeline schedules on real stages: per schedule, the step time (median of --steps after one
 * warm-up step) of the pipeline runtime (src/parallel/pp.c) on stage models that hold only
 * their units, the measured bubble (1 - sum over ranks of the time in F / I / W / B actions /
 * (ranks x step time)) next to the simulator's prediction with unit costs (hp_pp_timing: F = I
 * = W = 1, B = 2, communication free) and the lock-step simulator's step count. One thread per
 * rank. On a machine with fewer cores than ranks the ranks share cores: an action runs slower
 * while another rank computes (and OpenMPI polls while it waits), which stretches the busy
 * time, so the measured bubble there is a lower bound of the real one; say so with the numbers.
 * Every schedule kind: GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble,
 * ZBVZeroBubble, DualPipeV (skipped when --microbatches < 2 x ranks). --timeline DIR writes the
 * median step's per-rank action times of each schedule to DIR/NAME.csv, which hp-pp-timeline
 * draws next to the simulator (docs/pp.md "Timelines").
 *   mpirun -np 4 bench_pp [--layers 8] [--dim 256] [--seq 128] [--mbs 1] [--microbatches 8]
 *                         [--steps 3] [--timeline DIR] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/comm.h"
#include "hyperparallel/model.h"
#include "hyperparallel/pp.h"
#include "hyperparallel/pp_schedule.h"
#include "pp_bench.h"

#define CHECK(expr)                                                             \
    do {                                                                        \
        hp_status_t s_ = (expr);                                                \
        if (s_ != HP_OK) {                                                      \
            fprintf(stderr, "bench_pp: %s: %s\n", #expr, hp_last_error());      \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

/* Rank 0 writes every rank's recorded actions (7 int64 each: stage, type, mb, sub_stage, sub_mb,
 * start and end in ns from the rank's step start) to DIR/NAME.csv. */
static void write_timeline(hp_comm_t world, const char *dir, hp_pp_kind_t kind, int P, int S, int n_mb,
                           const int64_t *rec, int n, double span) {
    const int me = hp_comm_rank(world);
    int32_t mine = n, *cnt = malloc(sizeof(int32_t) * (size_t)P);
    CHECK(hp_all_gather(&mine, cnt, 1, HP_I32, world, NULL));
    int maxn = 0;
    for (int r = 0; r < P; r++) maxn = cnt[r] > maxn ? cnt[r] : maxn;
    int64_t *pad = calloc((size_t)maxn * 7 + 1, sizeof(int64_t)), *all = NULL;
    if (n) memcpy(pad, rec, sizeof(int64_t) * 7 * (size_t)n);
    if (me == 0) all = malloc(sizeof(int64_t) * 7 * (size_t)maxn * (size_t)P + 1);
    CHECK(hp_gather(pad, all, (size_t)maxn * 7, HP_I64, 0, world, NULL));
    if (me == 0) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.csv", dir, hp_pp_kind_name(kind));
        FILE *f = fopen(path, "w");
        if (!f) {
            fprintf(stderr, "bench_pp: cannot write %s (does --timeline %s exist?)\n", path, dir);
        } else {
            fprintf(f, "# hp-pp timeline: schedule=%s pp=%d stages=%d microbatches=%d\n# bench_pp, the median step "
                    "(%.2f ms); times from each rank's step start after a barrier\nrank,action,start_ms,end_ms\n",
                    hp_pp_kind_name(kind), P, S, n_mb, 1e3 * span);
            for (int r = 0; r < P; r++)
                for (int a = 0; a < cnt[r]; a++) {
                    const int64_t *q = all + ((size_t)r * (size_t)maxn + (size_t)a) * 7;
                    hp_pp_action_t x = {(int32_t)q[0], (hp_pp_type_t)q[1], (int32_t)q[2], (int32_t)q[3], (int32_t)q[4]};
                    char txt[48];
                    hp_pp_action_format(&x, txt, sizeof txt);
                    fprintf(f, "%d,%s,%.4f,%.4f\n", r, txt, (double)q[5] * 1e-6, (double)q[6] * 1e-6);
                }
            fclose(f);
        }
    }
    free(cnt);
    free(pad);
    free(all);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    hp_comm_t world = NULL;
    CHECK(hp_comm_init(&argc, &argv, &world));
    const int P = hp_comm_size(world), me = hp_comm_rank(world);
    int layers = 8, dim = 256, T = 128, mbs = 1, n_mb = 8, steps = 3;
    const char *tl_dir = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--timeline")) tl_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) layers = v;
        else if (!strcmp(argv[i], "--dim")) dim = v;
        else if (!strcmp(argv[i], "--seq")) T = v;
        else if (!strcmp(argv[i], "--mbs")) mbs = v;
        else if (!strcmp(argv[i], "--microbatches")) n_mb = v;
        else if (!strcmp(argv[i], "--steps")) steps = v;
        else {
            if (me == 0) fprintf(stderr, "bench_pp: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    omp_set_num_threads(1);
    hp_model_config_t cfg;
    CHECK(pp_bench_config(layers, dim, T, &cfg));
    const int N = n_mb * mbs * T;
    int32_t *tok, *tgt;
    pp_bench_tokens(N, cfg.vocab_size, &tok, &tgt);
    if (!tok || !tgt) CHECK(HP_ERR_OOM);
    if (me == 0)
        printf("bench_pp: %d ranks, llama3 %d layers dim %d, %d micro-batches of %d x %d tokens, 1 thread per rank\n"
               "%-22s %7s %10s %12s %12s %10s\n",
               P, layers, dim, n_mb, mbs, T, "schedule", "stages", "step ms", "bubble meas", "bubble sim", "sim steps");
    for (int k = 0; k < HP_PP_KIND_COUNT; k++) {
        const hp_pp_kind_t kind = (hp_pp_kind_t)k;
        const int L = hp_pp_kind_is_single_stage(kind) ? 1 : 2, S = P * L;
        if (kind == HP_PP_DUALPIPEV && n_mb < 2 * P) {
            if (me == 0) printf("%-22s skipped: needs --microbatches >= %d (2 x ranks)\n", hp_pp_kind_name(kind), 2 * P);
            continue;
        }
        int lo[HP_PP_MAX_STAGES + 1], s2r[HP_PP_MAX_STAGES];
        CHECK(hp_pp_split_layers(layers, S, 1, 1, lo));
        hp_pp_schedule_t *compute = NULL, *lowered = NULL;
        CHECK(hp_pp_generate(kind, P, L, n_mb, &compute));
        CHECK(hp_pp_lower(compute, S, n_mb, &lowered, s2r));
        hp_pp_timing_t tm;
        int sim_steps = 0;
        CHECK(hp_pp_timing(compute, S, &tm));
        CHECK(hp_pp_simulate(lowered, s2r, S, NULL, &sim_steps));
        hp_model_t m[4];
        int ids[4], nl = 0;
        for (int s = 0; s < S; s++)
            if (s2r[s] == me) {
                ids[nl] = s;
                CHECK(hp_model_create_range(&cfg, lo[s], lo[s + 1], mbs, T, &m[nl]));
                CHECK(hp_model_init_weights(m[nl], 1));
                nl++;
            }
        hp_pp_options_t o = {S, s2r, n_mb, mbs, T};
        hp_pp_t rt = NULL;
        CHECK(hp_pp_create(world, lowered, m, ids, nl, &o, NULL, &rt));
        double *t = malloc(sizeof(double) * (size_t)(steps + 1)), bubble_sum = 0;
        double *bub = malloc(sizeof(double) * (size_t)(steps + 1));
        int64_t *rec = NULL;   /* the timeline of the step whose time is nearest the median: 7 per action */
        int rec_n = 0;
        double rec_span = 0;
        for (int it = 0; it <= steps; it++) {
            for (int i = 0; i < nl; i++) CHECK(hp_model_zero_grad(m[i]));
            hp_barrier(world, NULL);
            double t0 = hp_clock_now_seconds(), ls = 0;
            int64_t nv = 0;
            CHECK(hp_pp_step(rt, tok, tgt, (float)N, &ls, &nv));
            double t1 = hp_clock_now_seconds();
            hp_barrier(world, NULL);
            double span = hp_clock_now_seconds() - t0;
            (void)t1;
            const hp_pp_action_t *acts;
            const double *st, *en;
            int na = hp_pp_last_timeline(rt, &acts, &st, &en);
            double busy = 0, all_busy = 0, all_span = 0;
            for (int a = 0; a < na; a++)
                if (hp_pp_type_is_compute(acts[a].type)) busy += en[a] - st[a];
            float v[2] = {(float)busy, (float)span}, g[2];
            CHECK(hp_all_reduce(v, g, 2, HP_F32, HP_SUM, world, NULL));
            all_busy = g[0];
            all_span = g[1] / P;
            if (it > 0) {
                t[it - 1] = all_span;
                bub[it - 1] = 1.0 - all_busy / (P * all_span);
                bubble_sum += bub[it - 1];
                if (tl_dir && it == (steps + 1) / 2) {   /* the middle step's record */
                    free(rec);
                    rec = malloc(sizeof(int64_t) * 7 * (size_t)(na + 1));
                    for (int a = 0; a < na; a++) {
                        int64_t *q = rec + 7 * a;
                        q[0] = acts[a].stage, q[1] = acts[a].type, q[2] = acts[a].mb;
                        q[3] = acts[a].sub_stage, q[4] = acts[a].sub_mb;
                        q[5] = (int64_t)((st[a] - t0) * 1e9), q[6] = (int64_t)((en[a] - t0) * 1e9);
                    }
                    rec_n = na;
                    rec_span = all_span;
                }
            }
        }
        if (tl_dir) write_timeline(world, tl_dir, kind, P, S, n_mb, rec, rec_n, rec_span);
        free(rec);
        qsort(t, (size_t)steps, sizeof(double), cmp_double);
        qsort(bub, (size_t)steps, sizeof(double), cmp_double);
        if (me == 0)
            printf("%-22s %7d %10.1f %12.3f %12.3f %10d\n", hp_pp_kind_name(kind), S, 1e3 * t[steps / 2],
                   bub[steps / 2], tm.bubble_fraction, sim_steps);
        (void)bubble_sum;
        free(t);
        free(bub);
        hp_pp_destroy(rt);
        for (int i = 0; i < nl; i++) hp_model_destroy(m[i]);
        hp_pp_schedule_free(compute);
        hp_pp_schedule_free(lowered);
    }
    free(tok);
    free(tgt);
    hp_comm_finalize();
    return 0;
}
