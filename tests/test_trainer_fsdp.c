/* Trainer with fully_shard: on 2 ranks FSDP (dp_shard 2) and on 4 ranks FSDP 4 and HSDP 2 x 2
 * give the losses and gradient norms of the replicated data-parallel run of the same config
 * (mixed_precision_param float32; fp32 reduction order: 1e-5 relative) for 4 steps; the
 * default bf16 all-gather trains with finite, falling losses; validation and the final
 * weights file work with sharded parameters. */
// hp-test: ranks 2 4 timeout 900 coretype 2
#include <math.h>
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


enum { N = 4 };

/* c's config under replicate x shard data parallel, parameters all-gathered in f32 (f32 keeps
 * the reduction order the only difference from replicated data parallel). */
static void f32_layout(hp_config_t *f, const hp_config_t *c, int replicate, int shard) {
    *f = *c;
    f->parallelism.data_parallel_replicate_degree = replicate;
    f->parallelism.data_parallel_shard_degree = shard;
    snprintf(f->training.mixed_precision_param, sizeof f->training.mixed_precision_param, "float32");
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_config_t *c = NULL;
    hp_comm_t world = hp_test_corpus_init(&argc, &argv, "hp_test_trainer_fsdp", &rank, &ws, &c);
    c->training.steps = N;
    c->validation.steps = 1;
    double dl[N], dn[N], fl[N], fn[N];
    hp_test_train_steps(c, world, N, dl, dn, 1);   /* replicated data parallel */
    hp_config_t *f = calloc(1, sizeof *f);
    /* FSDP (replicate 1 x shard ws) and, on 4 ranks, HSDP (2 x ws / 2): losses 1e-5, norms 1e-4 */
    for (int replicate = 1; replicate <= (ws >= 4 ? 2 : 1); replicate++) {
        f32_layout(f, c, replicate, ws / replicate);
        hp_test_train_steps(f, world, N, fl, fn, 1);
        char what[64];
        snprintf(what, sizeof what, "replicate %d x shard %d", replicate, ws / replicate);
        hp_test_compare_runs(what, N, fl, dl, fn, dn, 1e-5, 1e-4);
    }
    /* negative test (docs/testing.md): an FSDP run whose optimizer is 1e-3 off (lr x 1.001) must
     * fall outside the loss tolerance on some step */
    f32_layout(f, c, 1, ws);
    f->optimizer.lr *= 1.001;
    hp_test_train_steps(f, world, N, fl, fn, 1);
    HP_CHECK(hp_test_any_outside(fl, dl, N, 1e-5), "negative test: lr x 1.001 under FSDP stays within the 1e-5 loss "
             "tolerance (last loss %.9g vs %.9g)", fl[N - 1], dl[N - 1]);
    /* default MixedPrecisionPolicy of the config: bf16 all-gather, f32 reduce; final weights */
    *f = *c;
    f->parallelism.data_parallel_replicate_degree = 1;
    f->parallelism.data_parallel_shard_degree = ws;
    snprintf(f->job.dump_folder, sizeof f->job.dump_folder, "%s/out", dir_);
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(f, world, &t));
    if (t) {
        HP_CHECK_OK(hp_trainer_train(t));
        hp_trainer_destroy(t);
    }
    if (rank == 0) {
        char path[400];
        snprintf(path, sizeof path, "%s/out/weights.safetensors", dir_);
        hp_model_t m = NULL;
        HP_CHECK_OK(hp_model_load_weights(path, 1, 0, &m));
        if (m) {
            const hp_param_t *p = hp_model_find_param(m, "norm.weight");
            HP_CHECK(p && ((const float *)p->value.local.data)[0] != 1.0f, "final norm.weight was not trained");
            hp_model_destroy(m);
        }
    }
    free(f);
    free(c);
    return hp_test_corpus_finish(world, "test_trainer_fsdp");
}
