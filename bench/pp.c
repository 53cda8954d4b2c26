/* Pipeline schedules on real stages: per schedule, the step time (median of --steps after one
 * warm-up step) of the pipeline runtime (src/parallel/pp.c) on stage models that hold only
 * their units, the measured bubble (1 - sum over ranks of the time in F / I / W / B actions /
 * (ranks x step time)) next to the simulator's prediction with unit costs (hp_pp_timing: F = I
 * = W = 1, B = 2, communication free) and the lock-step simulator's step count. One thread per
 * rank. On a machine with fewer cores than ranks the ranks share cores: an action runs slower
 * while another rank computes (and OpenMPI polls while it waits), which stretches the busy
 * time, so the measured bubble there is a lower bound of the real one; say so with the numbers.
 *   mpirun -np 4 bench_pp [--layers 8] [--dim 256] [--seq 128] [--mbs 1] [--microbatches 8]
 *                         [--steps 3] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/comm.h"
#include "hyperparallel/model.h"
#include "hyperparallel/pp.h"
#include "hyperparallel/pp_schedule.h"

#define CHECK(expr)                                                             \
    do {                                                                        \
        hp_status_t s_ = (expr);                                                \
        if (s_ != HP_OK) {                                                      \
            fprintf(stderr, "bench_pp: %s: %s\n", #expr, hp_last_error());      \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    hp_comm_t world = NULL;
    CHECK(hp_comm_init(&argc, &argv, &world));
    const int P = hp_comm_size(world), me = hp_comm_rank(world);
    int layers = 8, dim = 256, T = 128, mbs = 1, n_mb = 8, steps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--layers")) layers = v;
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
    CHECK(hp_model_flavor("llama3", "debugmodel", &cfg));
    cfg.n_layers = layers;
    cfg.dim = dim;
    cfg.head_dim = 0;
    cfg.max_seq_len = T;
    CHECK(hp_model_config_validate(&cfg));
    const int N = n_mb * mbs * T;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)N), *tgt = malloc(sizeof(int32_t) * (size_t)N);
    for (int i = 0; i < N; i++) {
        tok[i] = (int32_t)((i * 2654435761u) % (unsigned)cfg.vocab_size);
        tgt[i] = (int32_t)((i * 40503u + 7) % (unsigned)cfg.vocab_size);
    }
    if (me == 0)
        printf("bench_pp: %d ranks, llama3 %d layers dim %d, %d micro-batches of %d x %d tokens, 1 thread per rank\n"
               "%-16s %7s %10s %12s %12s %10s\n",
               P, layers, dim, n_mb, mbs, T, "schedule", "stages", "step ms", "bubble meas", "bubble sim", "sim steps");
    const hp_pp_kind_t kinds[4] = {HP_PP_GPIPE, HP_PP_1F1B, HP_PP_INTERLEAVED_1F1B, HP_PP_LOOPED_BFS};
    for (int k = 0; k < 4; k++) {
        const int L = hp_pp_kind_is_single_stage(kinds[k]) ? 1 : 2, S = P * L;
        int lo[HP_PP_MAX_STAGES + 1], s2r[HP_PP_MAX_STAGES];
        CHECK(hp_pp_split_layers(layers, S, 1, 1, lo));
        hp_pp_schedule_t *compute = NULL, *lowered = NULL;
        CHECK(hp_pp_generate(kinds[k], P, L, n_mb, &compute));
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
            }
        }
        qsort(t, (size_t)steps, sizeof(double), cmp_double);
        qsort(bub, (size_t)steps, sizeof(double), cmp_double);
        if (me == 0)
            printf("%-16s %7d %10.1f %12.3f %12.3f %10d\n", hp_pp_kind_name(kinds[k]), S, 1e3 * t[steps / 2],
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
