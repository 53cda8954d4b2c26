/* The trainer with expert parallelism (parallelism.expert_parallel_degree; ep borrows the
 * dp_shard ranks as TorchTitan): for both MoE flavors, 10 steps with the aux-loss-free bias
 * update on give the losses and gradient norms of replicated data parallel over the same
 * ranks (the layout whose parity with one rank test_trainer and test_ddp show): ep = world,
 * and on 4 ranks also ep 2 x efsdp 2 (expert grads summed over efsdp). Float32 GEMM row sets
 * and reduction orders differ: 1e-5 relative on the loss, 1e-4 on the norm; an lr x 1.001 run
 * falls outside. A checkpoint saved under EP resumes under replicated DP and the reverse
 * (experts and expert_bias resharded). On 4 ranks ETP (experts over [ep 2, tp 2]) gives the
 * losses of TP 2 x DP 2; gradient accumulation, validation and full AC run under EP. Bad EP keys are
 * named. */
// hp-test: ranks 2 4 timeout 300
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_corpus.h"
#include "hyperparallel/config.h"
#include "hyperparallel/trainer.h"

enum { N = 10 };

static void moe_config(hp_config_t *c, int ws, const char *name) {
    hp_test_base_config(c, ws);
    snprintf(c->model.name, sizeof c->model.name, "%s", name);
    c->model.dim = 64;
    c->model.n_layers = 3;
    c->model.n_heads = 4;
    c->model.n_kv_heads = 2;
    c->model.head_dim = 16;
    c->model.hidden_dim = 96;
    c->model.moe_hidden_dim = 32;
    c->model.moe_num_experts = 8;
    c->model.moe_top_k = 2;
    c->model.moe_load_balance_coeff = 1e-2;
    c->training.seq_len = 16;
    c->training.steps = N;
    c->validation.enable = false;
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    hp_test_make_corpus(world, "hp_test_trainer_ep");
    hp_config_t *c = calloc(1, sizeof *c), *f = calloc(1, sizeof *f);
    double dl[N], dn[N], fl[N], fn[N];
    const char *models[2] = {"deepseek_v3", "qwen3_moe"};
    for (int mi = 0; mi < 2; mi++) {
        moe_config(c, ws, models[mi]);
        hp_test_train_steps(c, world, N, dl, dn, 0);   // replicated data parallel
        for (int ep = ws; ep >= 2; ep /= 2) {
            *f = *c;
            f->parallelism.data_parallel_replicate_degree = 1;
            f->parallelism.data_parallel_shard_degree = ws;
            f->parallelism.expert_parallel_degree = ep;
            hp_test_train_steps(f, world, N, fl, fn, 0);
            for (int i = 0; i < N; i++) {
                HP_CHECK_CLOSE(fl[i], dl[i], 1e-5, 0.0);
                HP_CHECK_CLOSE(fn[i], dn[i], 1e-4, 0.0);
            }
            if (rank == 0)
                printf("%s ep %d (efsdp %d): losses %.6f .. %.6f (DP %.6f .. %.6f)\n", models[mi], ep, ws / ep, fl[0],
                       fl[N - 1], dl[0], dl[N - 1]);
        }
    }
    if (ws == 4) {   // ETP: experts over [ep 2, tp 2] == TP 2 x replicated DP 2 (experts TP'd on F)
        for (int mi = 0; mi < 2; mi++) {
            moe_config(c, 2, models[mi]);
            c->parallelism.tensor_parallel_degree = 2;
            c->parallelism.enable_sequence_parallel = false;
            hp_test_train_steps(c, world, N, dl, dn, 0);
            *f = *c;
            f->parallelism.data_parallel_replicate_degree = 1;
            f->parallelism.data_parallel_shard_degree = 2;
            f->parallelism.expert_parallel_degree = 2;
            f->parallelism.expert_tensor_parallel_degree = 2;
            hp_test_train_steps(f, world, N, fl, fn, 0);
            for (int i = 0; i < N; i++) {
                HP_CHECK_CLOSE(fl[i], dl[i], 1e-5, 0.0);
                HP_CHECK_CLOSE(fn[i], dn[i], 1e-4, 0.0);
            }
            if (rank == 0)
                printf("%s ETP ep 2 x tp 2: losses %.6f .. %.6f (TP 2 x DP 2 %.6f .. %.6f)\n", models[mi], fl[0],
                       fl[N - 1], dl[0], dl[N - 1]);
        }
        hp_trainer_t t = NULL;   // ep borrowing tp ranks (etp 1) is refused by key
        f->parallelism.expert_tensor_parallel_degree = 1;
        HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_UNSUPPORTED, "expert_tensor_parallel_degree");
    }
    {   // gradient accumulation (2 micro-batches per step) and validation under EP
        moe_config(c, ws, "qwen3_moe");
        c->training.global_batch_size = 2 * 2 * ws;
        c->validation.enable = true;
        hp_test_train_steps(c, world, 4, dl, dn, 1);
        *f = *c;
        f->parallelism.data_parallel_replicate_degree = 1;
        f->parallelism.data_parallel_shard_degree = ws;
        f->parallelism.expert_parallel_degree = ws;
        hp_test_train_steps(f, world, 4, fl, fn, 1);
        for (int i = 0; i < 4; i++) HP_CHECK_CLOSE(fl[i], dl[i], 1e-5, 0.0);
        // and with full activation checkpointing (the recompute dispatches again)
        snprintf(f->activation_checkpoint.mode, sizeof f->activation_checkpoint.mode, "full");
        hp_test_train_steps(f, world, 4, fl, fn, 0);
        for (int i = 0; i < 4; i++) HP_CHECK_CLOSE(fl[i], dl[i], 1e-5, 0.0);
    }
    {   // negative test (STYLE rule 17)
        moe_config(c, ws, "qwen3_moe");
        hp_test_train_steps(c, world, N, dl, dn, 0);
        *f = *c;
        f->parallelism.data_parallel_replicate_degree = 1;
        f->parallelism.data_parallel_shard_degree = ws;
        f->parallelism.expert_parallel_degree = ws;
        f->optimizer.lr *= 1.001;
        hp_test_train_steps(f, world, N, fl, fn, 0);
        int caught = 0;
        for (int i = 0; i < N; i++) caught |= fabs(fl[i] - dl[i]) > 1e-5 * fabs(dl[i]);
        HP_CHECK(caught, "negative test: lr x 1.001 under EP stays within the 1e-5 loss tolerance");
    }
    {   // checkpoints reshard between layouts: 4 steps under EP, resume under replicated DP (and
        // the reverse) for 6 more == 10 straight steps of the other layout (same 1e-5 bound)
        char ck[2][256];
        for (int dir = 0; dir < 2; dir++) {
            moe_config(c, ws, "deepseek_v3");
            hp_test_train_steps(c, world, N, dl, dn, 0);   // DP reference
            hp_config_t *a = calloc(1, sizeof *a);
            *a = *c;
            snprintf(ck[dir], sizeof ck[dir], "%.240s/ck%d", dir_, dir);
            snprintf(a->job.dump_folder, sizeof a->job.dump_folder, "%s", ck[dir]);
            a->checkpoint.enable = true;
            a->checkpoint.interval = 4;
            a->checkpoint.last_save_model_only = false;
            hp_config_t *b = calloc(1, sizeof *b);
            *b = *a;
            hp_config_t *epc = dir == 0 ? a : b;   // dir 0: EP first, DP second; dir 1: the reverse
            epc->parallelism.data_parallel_replicate_degree = 1;
            epc->parallelism.data_parallel_shard_degree = ws;
            epc->parallelism.expert_parallel_degree = ws == 4 ? 2 : ws;   // 4 ranks: ep 2 x efsdp 2 (strided shards)
            hp_trainer_t t = NULL;
            HP_CHECK_OK(hp_trainer_create(a, world, &t));
            for (int i = 0; t && i < 4; i++) {
                hp_step_stats_t st;
                HP_CHECK_OK(hp_trainer_step(t, &st));
                fl[i] = st.loss;
            }
            if (t) hp_trainer_destroy(t);
            t = NULL;
            HP_CHECK_OK(hp_trainer_create(b, world, &t));
            if (t) {
                HP_CHECK(hp_trainer_current_step(t) == 4, "resume under the other layout at step %lld, expected 4",
                         (long long)hp_trainer_current_step(t));
                for (int i = 4; i < N; i++) {
                    hp_step_stats_t st;
                    HP_CHECK_OK(hp_trainer_step(t, &st));
                    fl[i] = st.loss;
                }
                hp_trainer_destroy(t);
            }
            for (int i = 0; i < N; i++) HP_CHECK_CLOSE(fl[i], dl[i], 1e-5, 0.0);
            if (rank == 0)
                printf("checkpoint %s -> %s at step 4: loss %.6f at step 10 (DP %.6f)\n", dir == 0 ? "EP" : "DP",
                       dir == 0 ? "DP" : "EP", fl[N - 1], dl[N - 1]);
            free(a);
            free(b);
        }
    }
    // bad EP input named by key
    hp_trainer_t t = NULL;
    moe_config(c, ws, "qwen3_moe");
    c->parallelism.data_parallel_replicate_degree = 1;
    c->parallelism.data_parallel_shard_degree = ws;
    c->parallelism.expert_parallel_degree = ws;
    c->model.moe_num_experts = 6;
    if (ws == 4) HP_CHECK_ERR(hp_trainer_create(c, world, &t), HP_ERR_INVALID_ARG, "'parallelism.expert_parallel_degree' = 4 must divide");
    moe_config(c, ws, "llama3");
    c->model.moe_num_experts = -1; c->model.moe_top_k = -1; c->model.moe_hidden_dim = -1; c->model.moe_load_balance_coeff = -1;
    c->parallelism.data_parallel_replicate_degree = 1;
    c->parallelism.data_parallel_shard_degree = ws;
    c->parallelism.expert_parallel_degree = ws;
    HP_CHECK_ERR(hp_trainer_create(c, world, &t), HP_ERR_INVALID_ARG, "needs an MoE model");
    free(f);
    free(c);
    int rc = hp_test_finish("test_trainer_ep");
    hp_test_remove_corpus(world);
    hp_comm_finalize();
    return rc;
}
