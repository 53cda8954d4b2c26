/* OVERLAP_F_B and the p2p transports on real stages (docs/pp.md "Overlap"): DualPipeV (and
 * 1F1B for the transports) through the pipeline runtime, per mode the median step time over
 * --steps steps. The modes run round-robin (one step of each in turn, after a warm-up step
 * each), so a change in the machine's load hits every mode alike. One OpenMP thread per rank;
 * "thread" adds a second thread per rank for the B half.
 *   mpirun -np 2 bench_pp_overlap [--layers 8] [--dim 256] [--seq 128] [--microbatches 8] [--steps 9] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/comm.h"
#include "hyperparallel/model.h"
#include "hyperparallel/pp.h"
#include "hyperparallel/pp_schedule.h"
#include "pp_bench.h"

#define CHECK(expr)                                                                  \
    do {                                                                             \
        hp_status_t s_ = (expr);                                                     \
        if (s_ != HP_OK) {                                                           \
            fprintf(stderr, "bench_pp_overlap: %s: %s\n", #expr, hp_last_error());   \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

enum { N_MODES = 5 };

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct run {
    hp_pp_kind_t kind;
    hp_pp_overlap_t ov;
    hp_pp_p2p_t p2p;
    const char *name;
    hp_model_t m[4];
    int nl;
    hp_pp_t rt;
    hp_pp_schedule_t *compute, *lowered;
    double *t;
} run_t;

int main(int argc, char **argv) {
    hp_comm_t world = NULL;
    CHECK(hp_comm_init(&argc, &argv, &world));
    const int P = hp_comm_size(world), me = hp_comm_rank(world);
    int layers = 8, dim = 256, T = 128, n_mb = 8, steps = 9;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--layers")) layers = v;
        else if (!strcmp(argv[i], "--dim")) dim = v;
        else if (!strcmp(argv[i], "--seq")) T = v;
        else if (!strcmp(argv[i], "--microbatches")) n_mb = v;
        else if (!strcmp(argv[i], "--steps")) steps = v;
        else {
            if (me == 0) fprintf(stderr, "bench_pp_overlap: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    if (steps < 1 || n_mb < 2 * P) {
        if (me == 0) fprintf(stderr, "bench_pp_overlap: --steps >= 1 and --microbatches >= 2 x ranks (DualPipeV)\n");
        return 2;
    }
    omp_set_num_threads(1);
    hp_model_config_t cfg;
    CHECK(pp_bench_config(layers, dim, T, &cfg));
    const int N = n_mb * T;
    int32_t *tok, *tgt;
    pp_bench_tokens(N, cfg.vocab_size, &tok, &tgt);
    if (!tok || !tgt) CHECK(HP_ERR_OOM);
    run_t r[N_MODES] = {
        {HP_PP_DUALPIPEV, HP_PP_OVERLAP_OFF, HP_PP_P2P_PER_OP, "DualPipeV off (F then B)", {0}, 0, 0, 0, 0, 0},
        {HP_PP_DUALPIPEV, HP_PP_OVERLAP_INTERLEAVE, HP_PP_P2P_PER_OP, "DualPipeV interleave", {0}, 0, 0, 0, 0, 0},
        {HP_PP_DUALPIPEV, HP_PP_OVERLAP_THREAD, HP_PP_P2P_PER_OP, "DualPipeV thread", {0}, 0, 0, 0, 0, 0},
        {HP_PP_1F1B, HP_PP_OVERLAP_OFF, HP_PP_P2P_PER_OP, "1F1B per-op p2p", {0}, 0, 0, 0, 0, 0},
        {HP_PP_1F1B, HP_PP_OVERLAP_OFF, HP_PP_P2P_COALESCED, "1F1B coalesced p2p", {0}, 0, 0, 0, 0, 0},
    };
    for (int k = 0; k < N_MODES; k++) {
        const int L = hp_pp_kind_is_single_stage(r[k].kind) ? 1 : 2, S = P * L;
        int lo[HP_PP_MAX_STAGES + 1], s2r[HP_PP_MAX_STAGES], ids[4];
        CHECK(hp_pp_split_layers(layers, S, 1, 1, lo));
        CHECK(hp_pp_generate(r[k].kind, P, L, n_mb, &r[k].compute));
        CHECK(hp_pp_lower(r[k].compute, S, n_mb, &r[k].lowered, s2r));
        for (int s = 0; s < S; s++)
            if (s2r[s] == me) {
                ids[r[k].nl] = s;
                CHECK(hp_model_create_range(&cfg, lo[s], lo[s + 1], 1, T, &r[k].m[r[k].nl]));
                CHECK(hp_model_init_weights(r[k].m[r[k].nl], 1));
                r[k].nl++;
            }
        hp_pp_options_t o = {S, s2r, n_mb, 1, T};
        CHECK(hp_pp_create(world, r[k].lowered, r[k].m, ids, r[k].nl, &o, NULL, &r[k].rt));
        CHECK(hp_pp_set_transport(r[k].rt, r[k].ov, r[k].p2p));
        r[k].t = calloc((size_t)steps, sizeof(double));
    }
    for (int it = 0; it <= steps; it++)
        for (int k = 0; k < N_MODES; k++) {
            for (int i = 0; i < r[k].nl; i++) CHECK(hp_model_zero_grad(r[k].m[i]));
            hp_barrier(world, NULL);
            double t0 = hp_clock_now_seconds(), ls = 0;
            int64_t nv = 0;
            CHECK(hp_pp_step(r[k].rt, tok, tgt, (float)N, &ls, &nv));
            hp_barrier(world, NULL);
            if (it > 0) r[k].t[it - 1] = hp_clock_now_seconds() - t0;
        }
    if (me == 0)
        printf("bench_pp_overlap: %d ranks, llama3 %d layers dim %d, %d micro-batches of 1 x %d tokens, 1 thread per "
               "rank, median of %d steps (modes round-robin)\n%-28s %10s %8s\n",
               P, layers, dim, n_mb, T, steps, "mode", "step ms", "pairs");
    for (int k = 0; k < N_MODES; k++) {
        qsort(r[k].t, (size_t)steps, sizeof(double), cmp_double);
        int pairs = hp_pp_coalesced_pairs(r[k].rt), all = 0;
        CHECK(hp_all_reduce(&pairs, &all, 1, HP_I32, HP_SUM, world, NULL));
        if (me == 0) printf("%-28s %10.1f %8d\n", r[k].name, 1e3 * r[k].t[steps / 2], all);
        hp_pp_destroy(r[k].rt);
        for (int i = 0; i < r[k].nl; i++) hp_model_destroy(r[k].m[i]);
        hp_pp_schedule_free(r[k].compute);
        hp_pp_schedule_free(r[k].lowered);
        free(r[k].t);
    }
    free(tok);
    free(tgt);
    hp_comm_finalize();
    return 0;
}
