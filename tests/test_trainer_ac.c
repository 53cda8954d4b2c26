/* Trainer with activation checkpointing (activation_checkpoint.mode full, selective with
 * selective_ac_option "2"): losses and gradient norms of 3 steps are bitwise those of mode
 * none, under FSDP (dp_shard = world, float32 params: the recompute runs after FSDP's
 * pre_backward all-gather) and, on 2 ranks, under tensor parallelism (the recompute re-issues
 * the block's TP collectives); the model's activation arena is smaller with AC. */
// hp-test: ranks 1 2 timeout 600
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

static void set_ac(hp_config_t *c, const char *mode, const char *opt) {
    snprintf(c->activation_checkpoint.mode, sizeof c->activation_checkpoint.mode, "%s", mode);
    snprintf(c->activation_checkpoint.selective_ac_option, sizeof c->activation_checkpoint.selective_ac_option,
             "%s", opt);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_config_t *c = NULL;
    hp_comm_t world = hp_test_corpus_init(&argc, &argv, "hp_test_trainer_ac", &rank, &ws, &c);
    c->training.steps = N;
    c->validation.enable = false;
    hp_config_t *f = calloc(1, sizeof *f);
    for (int tp = 0; tp < (ws > 1 ? 2 : 1); tp++) {
        *f = *c;
        if (tp) {
            f->parallelism.data_parallel_replicate_degree = 1;
            f->parallelism.tensor_parallel_degree = ws;
        } else {
            f->parallelism.data_parallel_replicate_degree = 1;
            f->parallelism.data_parallel_shard_degree = ws;
            snprintf(f->training.mixed_precision_param, sizeof f->training.mixed_precision_param, "float32");
        }
        double l0[N], n0[N], l1[N], n1[N];
        size_t a0 = 0, a1 = 0;
        set_ac(f, "none", "2");
        run(f, world, l0, n0, &a0);
        const char *modes[2][2] = {{"full", "2"}, {"selective", "2"}};
        for (int k = 0; k < 2; k++) {
            set_ac(f, modes[k][0], modes[k][1]);
            run(f, world, l1, n1, &a1);
            for (int i = 0; i < N; i++) {
                HP_CHECK(l1[i] == l0[i], "%s %s/%s step %d: loss %.17g vs %.17g without AC", tp ? "tp" : "fsdp",
                         modes[k][0], modes[k][1], i, l1[i], l0[i]);
                HP_CHECK(n1[i] == n0[i], "%s %s/%s step %d: grad norm %.17g vs %.17g without AC",
                         tp ? "tp" : "fsdp", modes[k][0], modes[k][1], i, n1[i], n0[i]);
            }
            HP_CHECK(a1 < a0, "%s %s: activations %zu < %zu bytes", tp ? "tp" : "fsdp", modes[k][0], a1, a0);
            if (rank == 0)
                printf("%s on %d ranks, AC %s/%s: losses %.6f %.6f %.6f, activations %.3f MiB (none: %.3f MiB)\n",
                       tp ? "tp" : "fsdp", ws, modes[k][0], modes[k][1], l1[0], l1[1], l1[2], a1 / 1048576.0,
                       a0 / 1048576.0);
        }
    }
    free(f);
    free(c);
    return hp_test_corpus_finish(world, "test_trainer_ac");
}
