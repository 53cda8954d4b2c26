/* The composition as a library (issue 25's acceptance 3): llama3 with TP 2 x FSDP 2 built through
 * the public steps alone (ParallelDims, meshes, an empty model (hp_model_create_empty),
 * hp_parallel_create, hp_apply_tp, hp_apply_ac, hp_apply_fsdp, hp_parallel_init_weights, the
 * gradient finalizer, the optimizer; no trainer)
 * gives the per-step losses and gradient norms of hp-train's run of the same config for 5 steps.
 * Tolerance: none. The library path calls the same kernels, collectives and reductions in the
 * same order on the same data as the trainer's composition, so the results are bitwise equal;
 * the negative case (the library path with lr x 1.001) must differ, which shows the comparison
 * sees a small change. 4 ranks. */
// hp-test: ranks 4 timeout 300
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_corpus.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/config.h"
#include "hyperparallel/data.h"
#include "hyperparallel/models.h"
#include "hyperparallel/optim.h"
#include "hyperparallel/parallelize.h"
#include "hyperparallel/tokenizer.h"
#include "hyperparallel/trainer.h"

enum { N = 5, B = 2, T = 16 };

static void config(hp_config_t *c) {
    hp_test_base_config(c, 1);
    c->parallelism.data_parallel_replicate_degree = 1;
    c->parallelism.data_parallel_shard_degree = 2;
    c->parallelism.tensor_parallel_degree = 2;
    c->training.steps = N;
    c->training.seq_len = T;
    c->training.local_batch_size = B;
    c->training.max_norm = 1.0;
    c->validation.enable = false;
    hp_test_use_bin(c, 'x', 2);
}

/* The same run through the public composition steps; lr_scale 1 reproduces the config. */
static void library_run(const hp_config_t *c, hp_comm_t world, double lr_scale, double *l, double *n) {
    hp_parallel_dims_t pd;
    HP_CHECK_OK(hp_parallel_dims_init(&pd, 1, 2, 1, 2, 1, 1, 1, hp_comm_size(world)));
    hp_parallel_meshes_t meshes;
    HP_CHECK_OK(hp_parallel_dims_build_mesh(&pd, world, &meshes));
    hp_tokenizer_t tok = NULL;
    HP_CHECK_OK(hp_tokenizer_load(&tok, c->tokenizer.path));
    hp_model_config_t mc;
    HP_CHECK_OK(hp_config_resolve_model(c, hp_tokenizer_vocab_size(tok), "the test tokenizer", T, &mc));
    hp_model_t model = NULL;   /* described only: each rank allocates its shards at init */
    HP_CHECK_OK(hp_model_create_empty(&mc, B, T, &model));
    hp_parallel_t par = NULL;
    HP_CHECK_OK(hp_parallel_create(model, B, T, &par));
    /* TorchTitan's order: TP on the tp dim, AC (off), FSDP on the dp_shard dim, then init */
    hp_mesh_t tp_mesh = NULL, dp_mesh = NULL;
    HP_CHECK_OK(hp_mesh_slice(meshes.world, 1, (const char *[]){"tp"}, &tp_mesh));
    HP_CHECK_OK(hp_mesh_slice(meshes.world, 1, (const char *[]){"dp_shard"}, &dp_mesh));
    hp_tp_plan_entry_t plan[32];
    const int n_plan = hp_model_spec_find("llama3")->tp_plan(&mc, 1, 1, plan, 32);
    HP_CHECK_OK(hp_apply_tp(par, tp_mesh, plan, n_plan));
    HP_CHECK_OK(hp_apply_ac(par, 0));
    hp_fsdp_options_t fo = hp_fsdp_default_options();
    fo.gradient_divide_factor = 1.0;   /* sums: the loss is normalised by the global token count */
    fo.mp.param_dtype = strcmp(c->training.mixed_precision_param, "bfloat16") == 0 ? HP_BF16 : HP_F32;
    HP_CHECK_OK(hp_apply_fsdp(par, dp_mesh, &fo));
    HP_CHECK_OK(hp_parallel_init_weights(par, (uint64_t)c->training.seed));
    /* the optimizer and schedule on the composition's table */
    hp_optim_config_t oc = hp_optim_default(HP_OPTIM_ADAMW);
    oc.lr = c->optimizer.lr * lr_scale;
    oc.weight_decay = c->optimizer.weight_decay;
    oc.beta1 = c->optimizer.beta1;
    oc.beta2 = c->optimizer.beta2;
    oc.eps = c->optimizer.eps;
    hp_optim_t opt = NULL;
    HP_CHECK_OK(hp_optim_create(&oc, hp_parallel_params(par), hp_parallel_num_params(par), &opt));
    hp_lr_decay_t decay;
    HP_CHECK_OK(hp_lr_decay_from_name(c->lr_scheduler.decay_type, &decay));
    hp_lr_schedule_t lr;
    HP_CHECK_OK(hp_lr_schedule_init(&lr, N, c->lr_scheduler.warmup_steps, c->lr_scheduler.decay_ratio, decay,
                                    c->lr_scheduler.min_lr_factor));
    /* this data-parallel rank's rows */
    hp_comm_t batch = hp_mesh_get_comm(meshes.batch, 0), loss = hp_mesh_get_comm(meshes.loss, 0);
    hp_dataset_options_t dso = hp_dataset_options_from_config(c);
    hp_dataset_t ds = NULL;
    HP_CHECK_OK(hp_dataset_open(&dso, &ds));
    hp_dataloader_options_t dlo = {HP_SPLIT_TRAIN, T, B, hp_comm_rank(batch), hp_comm_size(batch), true,
                                   mc.vocab_size};
    hp_dataloader_t dl = NULL;
    HP_CHECK_OK(hp_dataloader_create(ds, NULL, &dlo, &dl));
    int32_t in[B * T], lab[B * T];
    for (int s = 0; dl && s < N; s++) {
        bool got = false;
        HP_CHECK_OK(hp_dataloader_next(dl, in, lab, &got));
        int64_t valid = 0, global = 0;
        for (int i = 0; i < B * T; i++) valid += lab[i] != -100;
        HP_CHECK_OK(hp_all_reduce(&valid, &global, 1, HP_I64, HP_SUM, batch, NULL));
        HP_CHECK_OK(hp_parallel_zero_grad(par));
        double local = 0.0;
        HP_CHECK_OK(hp_parallel_forward_backward(par, in, lab, B, T, (float)global, 1, &local));
        hp_grad_finalizer_t fin = hp_parallel_finalizer(par);
        HP_CHECK_OK(hp_grad_finalizer_reduce(fin));
        float lf = (float)local, gf = 0.0f;
        HP_CHECK_OK(hp_all_reduce(&lf, &gf, 1, HP_F32, HP_SUM, loss, NULL));
        HP_CHECK_OK(hp_grad_finalizer_clip(fin, c->training.max_norm, &n[s]));
        l[s] = gf;
        HP_CHECK_OK(hp_optim_step(opt, hp_lr_schedule_factor(&lr, s)));
    }
    hp_dataloader_destroy(dl);
    hp_dataset_close(ds);
    hp_optim_free(opt);
    hp_parallel_destroy(par);
    hp_model_destroy(model);
    hp_mesh_destroy(dp_mesh);
    hp_mesh_destroy(tp_mesh);
    hp_tokenizer_free(tok);
    hp_parallel_meshes_destroy(&meshes);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    if (ws != 4) {
        if (rank == 0) printf("SKIP: needs 4 ranks\n");
        hp_comm_finalize();
        return 0;
    }
    hp_test_make_corpus(world, "hp_test_parallelize_api");
    hp_test_write_dp_bins(world, 2, B, T, N);
    hp_config_t *c = calloc(1, sizeof *c);
    config(c);
    double tl[N] = {0}, tn[N] = {0}, ll[N] = {0}, ln[N] = {0}, xl[N] = {0}, xn[N] = {0};
    hp_test_run_on(c, world, NULL, N, tl, tn, NULL);   // the trainer's run
    library_run(c, world, 1.0, ll, ln);
    library_run(c, world, 1.001, xl, xn);
    int same = 1, moved = 0;
    for (int i = 0; i < N; i++) {
        same &= tl[i] == ll[i] && tn[i] == ln[i];
        moved |= xl[i] != tl[i] || xn[i] != tn[i];
        if (rank == 0)
            printf("step %d: trainer loss %.9g norm %.9g | library loss %.9g norm %.9g | lr x 1.001 loss %.9g\n", i + 1,
                   tl[i], tn[i], ll[i], ln[i], xl[i]);
    }
    HP_CHECK(isfinite(tl[N - 1]) && tl[N - 1] < tl[0], "the trainer's loss falls (%g -> %g)", tl[0], tl[N - 1]);
    HP_CHECK(same, "the public steps reproduce the trainer's losses and norms bitwise");
    HP_CHECK(moved, "negative: an lr 1.001x off changes the losses or norms");
    free(c);
    return hp_test_corpus_finish(world, "test_parallelize_api");
}
