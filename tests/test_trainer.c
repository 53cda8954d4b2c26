/* Trainer (issue 4): a short run on a generated corpus lowers the loss; two runs are bitwise
 * equal; validation gives a finite loss; weights round-trip through the weights file; a
 * diverging run stops cleanly naming the step; impossible or unimplemented layouts and a
 * missing tokenizer are refused with messages naming the key. Runs on 1 and 2 ranks (2 ranks:
 * replicated data parallel). */
// hp-test: ranks 1 2 timeout 300 coretype 2
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_corpus.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/tokenizer.h"
#include "hyperparallel/trainer.h"


static void run(const hp_config_t *c, hp_comm_t world, double *losses, int n, hp_trainer_t *keep) {
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, world, &t));
    if (!t) return;
    for (int i = 0; i < n; i++) {
        hp_step_stats_t st;
        HP_CHECK_OK(hp_trainer_step(t, &st));
        losses[i] = st.loss;
        HP_CHECK(st.step == i + 1 && st.valid_tokens > 0 && isfinite(st.grad_norm), "step stats %lld", (long long)st.step);
        /* the phases telescope to the step's time (one clock read between each): only rounding */
        const double ph = st.data_s + st.fwd_bwd_s + st.reduce_s + st.clip_s + st.optim_s;
        HP_CHECK(st.data_s >= 0 && st.fwd_bwd_s > 0 && st.reduce_s >= 0 && st.clip_s >= 0 && st.optim_s > 0 &&
                 st.ckpt_s >= 0 && fabs(ph - st.seconds) <= 1e-9 * (1.0 + st.seconds) && st.comm_wait_s >= 0 &&
                 st.comm_wait_s <= st.fwd_bwd_s + st.reduce_s,
                 "step %lld phases: data %g fwd+bwd %g reduce %g clip %g optim %g, sum %g vs step %g s",
                 (long long)st.step, st.data_s, st.fwd_bwd_s, st.reduce_s, st.clip_s, st.optim_s, ph, st.seconds);
    }
    if (keep) *keep = t;
    else hp_trainer_destroy(t);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_config_t *c = NULL;
    hp_comm_t world = hp_test_corpus_init(&argc, &argv, "hp_test_trainer", &rank, &ws, &c);

    /* 1. the loss falls; 2. a second run is bitwise identical */
    enum { N = 12 };
    double a[N], b[N];
    hp_trainer_t t = NULL;
    run(c, world, a, N, &t);
    run(c, world, b, N, NULL);
    HP_CHECK(a[N - 1] < a[0] - 1.0, "loss did not fall: %.4f -> %.4f", a[0], a[N - 1]);
    HP_CHECK(memcmp(a, b, sizeof a) == 0, "two runs differ: %.9g vs %.9g", a[N - 1], b[N - 1]);

    /* 2b. training.deterministic pins the thread counts: OpenMP's dynamic adjustment (which
     * would change the partition of reductions from run to run) is switched off */
    {
        hp_config_t d = *c;
        d.training.deterministic = true;
        omp_set_dynamic(1);
        double e[2];
        run(&d, world, e, 2, NULL);
        HP_CHECK(omp_get_dynamic() == 0, "training.deterministic left OpenMP dynamic threads on");
        HP_CHECK(memcmp(e, a, sizeof e) == 0, "deterministic run differs: %.9g vs %.9g", e[0], a[0]);
        d.training.deterministic = false;
        omp_set_dynamic(1);
        run(&d, world, e, 1, NULL);
        HP_CHECK(omp_get_dynamic() == 1, "training.deterministic false changed OpenMP's dynamic setting");
        omp_set_dynamic(0);
    }

    /* 3. validation */
    if (t) {
        double vl = NAN;
        HP_CHECK_OK(hp_trainer_validate(t, &vl));
        HP_CHECK(isfinite(vl) && vl > 0 && vl < a[0], "validation loss %g (first train loss %g)", vl, a[0]);
        /* 4. weights round trip */
        char wpath[400];
        snprintf(wpath, sizeof wpath, "%s/weights_%d.safetensors", dir_, rank);
        hp_model_t m = hp_trainer_model(t), m2 = NULL;
        HP_CHECK_OK(hp_model_save_weights(m, wpath));
        HP_CHECK_OK(hp_model_load_weights(wpath, 1, 0, &m2));
        if (m2) {
            int32_t toks[8] = {5, 9, 40, 7, 3, 99, 12, 1};
            float l;
            HP_CHECK_OK(hp_model_forward(m, toks, NULL, 1, 8, 1.0f, &l));
            float *ref = malloc(sizeof(float) * 8 * (size_t)hp_model_config(m)->vocab_size);
            memcpy(ref, hp_model_logits(m), sizeof(float) * 8 * (size_t)hp_model_config(m)->vocab_size);
            HP_CHECK_OK(hp_model_forward(m2, toks, NULL, 1, 8, 1.0f, &l));
            HP_CHECK(memcmp(ref, hp_model_logits(m2), sizeof(float) * 8 * (size_t)hp_model_config(m)->vocab_size) == 0,
                     "reloaded weights give other logits");
            free(ref);
            hp_model_destroy(m2);
        }
        HP_CHECK_ERR(hp_model_load_weights(corpus_, 1, 0, &m2), HP_ERR_FORMAT, corpus_);
        hp_trainer_destroy(t);
    }

    /* 5. divergence stops cleanly, naming the step, on every rank */
    {
        hp_config_t d = *c;
        d.optimizer.lr = 1e6;
        d.lr_scheduler.warmup_steps = 1;
        d.training.max_norm = 0;
        hp_trainer_t dt = NULL;
        HP_CHECK_OK(hp_trainer_create(&d, world, &dt));
        hp_status_t s = HP_OK;
        int steps = 0;
        for (; dt && steps < 10 && s == HP_OK; steps++) s = hp_trainer_step(dt, NULL);
        HP_CHECK(s == HP_ERR_NUMERIC && strstr(hp_last_error(), "step ") && strstr(hp_last_error(), "training stopped"),
                 "divergence after %d steps: %s '%s'", steps, hp_status_string(s), hp_last_error());
        hp_trainer_destroy(dt);
    }

    /* 6. refused layouts and inputs, with messages naming the key */
    {
        hp_config_t e = *c;
        hp_trainer_t x = NULL;
        e.parallelism.tensor_parallel_degree = 3;
        HP_CHECK_ERR(hp_trainer_create(&e, world, &x), HP_ERR_INVALID_ARG, "must equal the world size");
        e = *c;
        /* context parallel is implemented (tests/test_cp_trainer.c); a bad Ulysses degree names its key */
        e.parallelism.data_parallel_replicate_degree = 1;
        e.parallelism.data_parallel_shard_degree = 1;
        e.parallelism.context_parallel_degree = ws;
        e.parallelism.context_parallel_ulysses_degree = 3;
        if (ws > 1) HP_CHECK_ERR(hp_trainer_create(&e, world, &x), HP_ERR_INVALID_ARG, "context_parallel_ulysses_degree");
        e = *c;
        /* activation checkpointing: bad values name the key (a memory budget outside [0, 1]) */
        snprintf(e.activation_checkpoint.mode, sizeof e.activation_checkpoint.mode, "memory_budget");
        e.activation_checkpoint.memory_budget = 1.5;
        HP_CHECK_ERR(hp_trainer_create(&e, world, &x), HP_ERR_INVALID_ARG, "activation_checkpoint.memory_budget");
        HP_CHECK(strstr(hp_last_error(), "[0, 1]") != NULL, "the budget's range: %s", hp_last_error());
        e.activation_checkpoint.memory_budget = 0.5;
        snprintf(e.activation_checkpoint.mode, sizeof e.activation_checkpoint.mode, "selective");
        snprintf(e.activation_checkpoint.selective_ac_option, sizeof e.activation_checkpoint.selective_ac_option, "-1");
        HP_CHECK_ERR(hp_trainer_create(&e, world, &x), HP_ERR_INVALID_ARG, "activation_checkpoint.selective_ac_option");
        snprintf(e.activation_checkpoint.selective_ac_option, sizeof e.activation_checkpoint.selective_ac_option, "2x");
        HP_CHECK_ERR(hp_trainer_create(&e, world, &x), HP_ERR_INVALID_ARG, "activation_checkpoint.selective_ac_option");
        snprintf(e.activation_checkpoint.mode, sizeof e.activation_checkpoint.mode, "sometimes");
        HP_CHECK_ERR(hp_trainer_create(&e, world, &x), HP_ERR_INVALID_ARG, "activation_checkpoint.mode");
        HP_CHECK(strstr(hp_last_error(), "none, full, selective or memory_budget") != NULL, "allowed values: %s",
                 hp_last_error());
        e = *c;
        snprintf(e.tokenizer.path, sizeof e.tokenizer.path, "%s/missing.json", dir_);
        HP_CHECK_ERR(hp_trainer_create(&e, world, &x), HP_ERR_IO, "missing.json");
        e = *c;
        snprintf(e.model.flavor, sizeof e.model.flavor, "debugmodel2");
        HP_CHECK_ERR(hp_trainer_create(&e, world, &x), HP_ERR_INVALID_ARG, "debugmodel");
        HP_CHECK(x == NULL, "no trainer on failure");
    }
    free(c);
    return hp_test_corpus_finish(world, "test_trainer");
}
