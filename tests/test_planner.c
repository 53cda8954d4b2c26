/* The auto-parallel planner (docs/planner.md) on the llama3 debug model, 2 and 4 ranks:
 * 1. the communication the planner predicts for one step equals, per collective kind, the calls
 *    and bytes hp_comm_counts_get counts in the trainer's second step, exactly (2 ranks: FSDP 2,
 *    FSDP 2 with gradient accumulation 2, TP 2 with and without sequence parallel, DDP 2, DDP 2
 *    with ZeRO-1; 4 ranks: HSDP 2 x 2, FSDP 4, DDP 4). Negative: the FSDP prediction does not
 *    match the DDP run.
 * 2. every layout hp_plan_search proposes for 2 and 8 ranks (and 4 on 4) passes the trainer's
 *    layout rules (hp_parallel_config_check) and its memory plan is under the limit, which drops
 *    some; on the job's own world size the trainer is created with the proposals; a limit below
 *    every layout's peak proposes none.
 * 3. parallelism.auto = true trains 2 steps on the job's ranks with the planned layout; with a limit no
 *    layout fits it stops up front (HP_ERR_OOM) naming the smallest predicted peak.
 * The calibration is measured once here (quick) into a temporary file. */
// hp-test: ranks 2 4 timeout 600
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_corpus.h"
#include "hyperparallel/metrics.h"
#include "hyperparallel/parallel_config.h"
#include "hyperparallel/planner.h"

typedef struct row {
    const char *what;
    int rep, shard, tp, sp, zero, accum;   /* rep x shard x tp ranks */
} row_t;

/* The counts of the trainer's second step (the first pays for nothing extra in the counters, but
 * the second is the steady state the planner predicts). */
static void measured_step(const hp_config_t *c, hp_comm_t world, hp_comm_counts_t *out) {
    memset(out, 0, sizeof *out);
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, world, &t));
    if (!t) return;
    hp_step_stats_t st;
    HP_CHECK_OK(hp_trainer_step(t, &st));
    hp_comm_counts_reset();
    HP_CHECK_OK(hp_trainer_step(t, &st));
    hp_comm_counts_get(out);
    hp_trainer_destroy(t);
}

static int same(const hp_plan_comm_t *p, const hp_comm_counts_t *m) {
    for (int o = 0; o < HP_COMM_OP_COUNT; o++)
        if (p->calls[o] != m->calls[o] || p->bytes[o] != m->bytes[o]) return 0;
    return 1;
}

static void print_counts(const char *what, const hp_plan_comm_t *p, const hp_comm_counts_t *m) {
    printf("%-22s", what);
    for (int o = 0; o < HP_COMM_OP_COUNT; o++)
        if (p->calls[o] || m->calls[o])
            printf(" %s predicted %llu calls %llu B, counted %llu calls %llu B;", hp_comm_op_name(o),
                   (unsigned long long)p->calls[o], (unsigned long long)p->bytes[o], (unsigned long long)m->calls[o],
                   (unsigned long long)m->bytes[o]);
    printf("\n");
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_config_t *base;
    hp_comm_t world = hp_test_corpus_init(&argc, &argv, "hp_test_planner", &rank, &ws, &base);
    if (ws != 2 && ws != 4) {
        if (rank == 0) printf("SKIP: needs 2 or 4 ranks\n");
        free(base);
        return hp_test_corpus_finish(world, "test_planner");
    }
    base->validation.enable = false;
    base->training.steps = 2;

    /* 1. communication accounting */
    static const row_t rows[] = {
        {"FSDP 2", 1, 2, 1, 0, 0, 1},       {"FSDP 2, accumulation 2", 1, 2, 1, 0, 0, 2},
        {"TP 2", 1, 1, 2, 0, 0, 1},         {"TP 2, SP", 1, 1, 2, 1, 0, 1},
        {"DDP 2", 2, 1, 1, 0, 0, 1},        {"DDP 2, ZeRO-1", 2, 1, 1, 0, 1, 1},
        {"HSDP 2 x 2", 2, 2, 1, 0, 0, 1},   {"FSDP 4", 1, 4, 1, 0, 0, 1},
        {"DDP 4", 4, 1, 1, 0, 0, 1},
    };
    hp_model_config_t mc;
    HP_CHECK_OK(hp_plan_resolve_model(base, &mc));
    hp_plan_comm_t fsdp_pred;
    hp_comm_counts_t ddp_meas;
    memset(&fsdp_pred, 0, sizeof fsdp_pred);
    memset(&ddp_meas, 0, sizeof ddp_meas);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const row_t *r = &rows[i];
        if (r->rep * r->shard * r->tp != ws) continue;
        hp_config_t c = *base;
        c.parallelism.data_parallel_replicate_degree = r->rep;
        c.parallelism.data_parallel_shard_degree = r->shard;
        c.parallelism.tensor_parallel_degree = r->tp;
        c.parallelism.enable_sequence_parallel = r->sp;
        c.parallelism.zero_stage = r->zero;
        c.training.global_batch_size = c.training.local_batch_size * r->rep * r->shard * r->accum;
        hp_parallel_dims_t pd;
        HP_CHECK_OK(hp_parallel_dims_from_config(&c, ws, &pd));
        hp_plan_comm_t pred;
        HP_CHECK_OK(hp_plan_comm_predict(&c, &mc, &pd, rank, NULL, &pred));
        hp_comm_counts_t meas;
        measured_step(&c, world, &meas);
        HP_CHECK(pred.exact, "%s: the planner marks its prediction as an estimate", r->what);
        HP_CHECK(same(&pred, &meas), "%s: predicted communication differs from the counted one", r->what);
        if (rank == 0) print_counts(r->what, &pred, &meas);
        if (i == 0 || i == 7) fsdp_pred = pred;
        if (i == 4 || i == 8) ddp_meas = meas;
    }
    HP_CHECK(!same(&fsdp_pred, &ddp_meas), "negative: the FSDP %d prediction must not match the DDP %d run", ws, ws);

    /* the calibration, measured here (quick) and shared through HP_PLAN_CALIBRATION */
    char cal_path[400];
    snprintf(cal_path, sizeof cal_path, "%s/calibration.txt", dir_);
    hp_plan_calib_t cal;
    HP_CHECK_OK(hp_plan_calibrate(world, 1, &cal));
    if (rank == 0) HP_CHECK_OK(hp_plan_calib_save(&cal, cal_path));
    hp_barrier(world, NULL);
    hp_plan_calib_t loaded;
    HP_CHECK_OK(hp_plan_calib_load(cal_path, &loaded));
    HP_CHECK(loaded.coll_ranks[0] == 2 && loaded.alpha[HP_PLAN_ALL_REDUCE][0] > 0 && loaded.row_bytes_per_s > 0 &&
             (ws < 4 || (loaded.coll_ranks[1] == 4 && loaded.beta[HP_PLAN_REDUCE_SCATTER][1] > 0)),
             "the calibration file round-trips the collectives of 2 (and 4) ranks and the row rate");
    setenv("HP_PLAN_CALIBRATION", cal_path, 1);

    /* 2. the search: every proposal passes the trainer's rules and fits */
    int64_t rss = 0;
    HP_CHECK_OK(hp_memory_rss(&rss, NULL));
    int n_built = 0;
    for (int world_n = 2; world_n <= 8; world_n *= 2) {
        if (world_n == 4 && ws != 4) continue;
        hp_plan_options_t o = {world_n, 0, (size_t)rss, world_n, &loaded};
        hp_plan_result_t all;
        HP_CHECK_OK(hp_plan_search(base, &mc, &o, &all));
        HP_CHECK(all.n > 4, "world %d: %d layouts proposed without a limit", world_n, all.n);
        /* a limit between the smallest and the largest peak: some must go */
        double lo = 1e30, hi = 0;
        for (int i = 0; i < all.n; i++) {
            lo = all.layouts[i].mem.peak < lo ? all.layouts[i].mem.peak : lo;
            hi = all.layouts[i].mem.peak > hi ? all.layouts[i].mem.peak : hi;
        }
        o.memory_limit_bytes = 0.5 * (lo + hi);
        hp_plan_result_t r;
        HP_CHECK_OK(hp_plan_search(base, &mc, &o, &r));
        HP_CHECK(r.n > 0 && r.n < all.n && r.n_over_memory == all.n - r.n, "world %d: a limit between the peaks keeps "
                 "%d of %d layouts (%d over it)", world_n, r.n, all.n, r.n_over_memory);
        for (int i = 0; i < r.n; i++) {
            const hp_plan_layout_t *l = &r.layouts[i];
            hp_config_t c = *base;
            c.training.global_batch_size = c.training.local_batch_size * world_n;
            hp_plan_apply(&c, l);
            hp_parallel_dims_t pd;
            int64_t accum = 0;
            char ov[1024];
            hp_plan_overrides(l, ov, sizeof ov);
            HP_CHECK(hp_parallel_dims_from_config(&c, world_n, &pd) == HP_OK &&
                     hp_parallel_config_check(&c, &mc, &pd, (int)c.training.local_batch_size,
                                              (int)c.training.local_batch_size) == HP_OK &&
                     hp_config_grad_accum_steps(&c, hp_parallel_dims_dp(&pd), &accum) == HP_OK,
                     "world %d: proposed layout %s fails the trainer's rules: %s", world_n, ov, hp_last_error());
            HP_CHECK((double)l->mem.peak <= o.memory_limit_bytes, "world %d: %s predicted %zu bytes over the limit",
                     world_n, ov, l->mem.peak);
            HP_CHECK(l->step_s > 0 && l->step_s >= l->compute_s && (i == 0 || l->step_s >= r.layouts[i - 1].step_s),
                     "world %d: layout %d's step time is positive and sorted", world_n, i);
            /* on the job's own world size the trainer builds the proposals (its parallelize and
             * memory check included), not only its layout rules: every one on 2 ranks, the 12
             * fastest and every 10th on 4 (about 150 fit there; each build takes a second) */
            if (world_n == ws && (ws == 2 || i < 12 || i % 10 == 0)) {
                hp_trainer_t t = NULL;
                c.training.memory_limit_gib = -1;
                HP_CHECK(hp_trainer_create(&c, world, &t) == HP_OK, "world %d: the trainer refuses proposed layout %s: %s",
                         world_n, ov, hp_last_error());
                hp_trainer_destroy(t);
                n_built++;
            }
        }
        if (rank == 0) {
            char ov[1024];
            printf("world %d: %d enumerated, %d refused, %d fit without a limit, %d under %.1f MiB; best %s (%.2f ms)\n",
                   world_n, all.n_enumerated, all.n_refused, all.n, r.n, o.memory_limit_bytes / 1048576.0,
                   hp_plan_overrides(&r.layouts[0], ov, sizeof ov), r.layouts[0].step_s * 1e3);
        }
        /* below every peak: nothing */
        o.memory_limit_bytes = 0.5 * lo;
        hp_plan_result_t none;
        HP_CHECK_OK(hp_plan_search(base, &mc, &o, &none));
        HP_CHECK(none.n == 0 && none.n_over_memory == all.n && none.smallest_peak == lo,
                 "world %d: a limit below every peak proposes nothing (%d) and reports the smallest peak", world_n, none.n);
        hp_plan_result_free(&none);
        hp_plan_result_free(&r);
        hp_plan_result_free(&all);
    }

    HP_CHECK(n_built > 0, "the trainer built the proposals of %d ranks (%d)", ws, n_built);
    if (rank == 0) printf("the trainer built %d proposals of %d ranks under the limit\n", n_built, ws);

    /* 3. parallelism.auto = true */
    {
        hp_config_t c = *base;
        c.parallelism.auto_layout = true;
        c.parallelism.data_parallel_replicate_degree = 7;   /* replaced by the plan */
        double l[2] = {0, 0};
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(&c, world, &t));
        if (t) {
            hp_test_steps(t, 2, l, NULL);
            HP_CHECK(l[0] > 0 && l[1] > 0, "parallelism.auto trains: losses %g, %g", l[0], l[1]);
            hp_trainer_destroy(t);
        }
        c.training.memory_limit_gib = 1e-3;   /* 1 MiB: no layout of this model fits */
        t = NULL;
        const hp_status_t s = hp_trainer_create(&c, world, &t);
        HP_CHECK(s == HP_ERR_OOM && !t, "parallelism.auto with no fitting layout refuses (got %s)", hp_status_string(s));
        const char *msg = hp_last_error();
        static const char *const needles[] = {"parallelism.auto = true", "GiB per rank",
                                              "smallest predicted peak", "training.memory_limit_gib"};
        for (size_t k = 0; k < sizeof needles / sizeof needles[0]; k++)
            HP_CHECK(strstr(msg, needles[k]) != NULL, "the refusal names '%s': %s", needles[k], msg);
        if (rank == 0) printf("auto: losses %.4f %.4f; refusal: %s\n", l[0], l[1], msg);
        hp_trainer_destroy(t);
    }
    free(base);
    return hp_test_corpus_finish(world, "test_planner");
}
