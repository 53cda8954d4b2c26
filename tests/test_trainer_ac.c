/* Trainer with activation checkpointing: activation_checkpoint.mode full, selective with
 * selective_ac_option "2" (layer-level) and "op" (op-level SAC), memory_budget with
 * memory_budget 0, 0.5 and 1: losses and gradient norms of 3 steps are bitwise those of mode
 * none, under FSDP (dp_shard = world, float32 params: the replay runs after FSDP's pre_backward
 * all-gather) for llama3 and qwen3_moe (MoE: its load balancing reads the tokens per expert,
 * counted once per micro-batch whatever the replay runs) and, on 2 ranks, under tensor
 * parallelism for llama3 (the replay re-issues the dropped ops' TP collectives, the kept ones'
 * not); the model's activation arena is smaller with AC (budget 1 keeps everything: at most the
 * arena without AC). */
// hp-test: ranks 1 2 timeout 900
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_corpus.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"
#include "hyperparallel/trainer.h"

enum { N = 3 };

static void run(const hp_config_t *c, hp_comm_t world, double *losses, double *norms, size_t *act) {
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, world, &t));
    if (!t) return;
    hp_model_memory(hp_trainer_model(t), NULL, NULL, act, NULL);
    hp_test_steps(t, N, losses, norms);
    hp_trainer_destroy(t);
}

static void set_ac(hp_config_t *c, const char *mode, const char *opt, double budget) {
    snprintf(c->activation_checkpoint.mode, sizeof c->activation_checkpoint.mode, "%s", mode);
    snprintf(c->activation_checkpoint.selective_ac_option, sizeof c->activation_checkpoint.selective_ac_option,
             "%s", opt);
    c->activation_checkpoint.memory_budget = budget;
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_config_t *c = NULL;
    hp_comm_t world = hp_test_corpus_init(&argc, &argv, "hp_test_trainer_ac", &rank, &ws, &c);
    c->training.steps = N;
    c->validation.enable = false;
    hp_config_t *f = calloc(1, sizeof *f);
    const struct { const char *mode, *opt; double budget; } modes[6] = {
        {"full", "2", 0.5}, {"selective", "2", 0.5}, {"selective", "op", 0.5},
        {"memory_budget", "2", 0.0}, {"memory_budget", "2", 0.5}, {"memory_budget", "2", 1.0},
    };
    for (int run_i = 0; run_i < (ws > 1 ? 3 : 2); run_i++) {
        const int tp = run_i == 2, moe = run_i == 1;
        *f = *c;
        if (moe) {
            snprintf(f->model.name, sizeof f->model.name, "qwen3_moe");
            f->model.n_layers = 2;
        }
        f->parallelism.data_parallel_replicate_degree = 1;
        if (tp) {
            f->parallelism.tensor_parallel_degree = ws;
        } else {
            f->parallelism.data_parallel_shard_degree = ws;
            snprintf(f->training.mixed_precision_param, sizeof f->training.mixed_precision_param, "float32");
        }
        const char *lay = tp ? "tp" : "fsdp";
        double l0[N], n0[N], l1[N], n1[N];
        size_t a0 = 0, a1 = 0;
        set_ac(f, "none", "2", 0.5);
        run(f, world, l0, n0, &a0);
        for (int k = moe ? 2 : 0; k < 6; k++) {   // the MoE model: op and the budgets
            set_ac(f, modes[k].mode, modes[k].opt, modes[k].budget);
            run(f, world, l1, n1, &a1);
            for (int i = 0; i < N; i++) {
                HP_CHECK(l1[i] == l0[i], "%s %s %s/%s/%g step %d: loss %.17g vs %.17g without AC", f->model.name, lay,
                         modes[k].mode, modes[k].opt, modes[k].budget, i, l1[i], l0[i]);
                HP_CHECK(n1[i] == n0[i], "%s %s %s/%s/%g step %d: grad norm %.17g vs %.17g without AC", f->model.name,
                         lay, modes[k].mode, modes[k].opt, modes[k].budget, i, n1[i], n0[i]);
            }
            if (k < 5)
                HP_CHECK(a1 < a0, "%s %s %s: activations %zu < %zu bytes", f->model.name, lay, modes[k].mode, a1, a0);
            else
                HP_CHECK(a1 <= a0, "%s %s budget 1: activations %zu <= %zu bytes", f->model.name, lay, a1, a0);
            if (rank == 0)
                printf("%s %s on %d ranks, AC %s/%s/%g: losses %.6f %.6f %.6f, activations %.3f MiB (none: %.3f MiB)\n",
                       f->model.name, lay, ws, modes[k].mode, modes[k].opt, modes[k].budget, l1[0], l1[1], l1[2],
                       a1 / 1048576.0, a0 / 1048576.0);
        }
    }
    free(f);
    free(c);
    return hp_test_corpus_finish(world, "test_trainer_ac");
}
