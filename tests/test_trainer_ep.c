/* The trainer with expert parallelism (parallelism.expert_parallel_degree; ep borrows the
 * dp_shard ranks as TorchTitan; the dense params FSDP-sharded over dp_shard, the experts over
 * the sparse mesh): for both MoE flavors, 10 steps with the aux-loss-free bias update on give
 * the losses and gradient norms of the single-rank run of the same global batch (a token file
 * whose rows the one rank reads in the order the dp ranks read theirs): ep = world and, on 4
 * ranks, ep 2 x efsdp 2, ETP (ep 2 x tp 2) and 2 experts on ep 2 x efsdp 2 (Shard(1)); on 8 ranks ep 4 x TP 2 x FSDP 4 (ETP, dense TP +
 * FSDP) and HSDP 2 x ep 2 x efsdp 2. Float32 GEMM row sets and reduction orders differ, and
 * Adam turns relative gradient differences of ~1e-7 into parameter differences of up to
 * lr x 1e-3 near zero gradients: 1e-5 relative on the loss, 1e-4 on the norm; an lr x 1.001 run
 * falls outside. A checkpoint saved under EP resumes under replicated DP and the reverse
 * (experts and expert_bias resharded); gradient accumulation, validation and full AC run
 * under EP. Pipeline parallel of both flavors with data parallel (pp 2 x FSDP 2, pp 2 x DDP 2, 4
 * ranks) equals the single rank too; PP x EP and PP x TP of MoE models are refused by key. Bad EP
 * keys are named. */
// hp-test: ranks 2 4 8 timeout 300
#include <math.h>
#include <stdint.h>
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
    if (strcmp(name, "deepseek_v3") == 0) {   // MLA: a small latent and small heads (q|k 12, v 16)
        c->model.kv_lora_rank = 16;
        c->model.qk_nope_head_dim = 8;
        c->model.qk_rope_head_dim = 4;
        c->model.v_head_dim = 16;
    } else {
        c->model.n_kv_heads = 2;
        c->model.head_dim = 16;
    }
    c->model.hidden_dim = 96;
    c->model.moe_hidden_dim = 32;
    c->model.moe_num_experts = 8;
    c->model.moe_top_k = 2;
    c->model.moe_load_balance_coeff = 1e-2;
    c->training.seq_len = 16;
    c->training.steps = N;
    c->validation.enable = false;
    // FSDP (the dense params under EP) all-gathers in f32 (TorchTitan's default is bf16), as the
    // single-rank and replicated runs compute
    snprintf(c->training.mixed_precision_param, sizeof c->training.mixed_precision_param, "float32");
}

/* The single-rank run of layout f's global batch (dp ranks x B rows): rank 0 alone, local batch
 * dp x B, on the interleaved file; results broadcast to every rank. */
static void solo_steps(const hp_config_t *f, hp_comm_t world, int dp, double *l, double *n) {
    hp_config_t *c = calloc(1, sizeof *c);
    *c = *f;
    c->parallelism.data_parallel_replicate_degree = 1;
    c->parallelism.data_parallel_shard_degree = 1;
    c->parallelism.tensor_parallel_degree = 1;
    c->parallelism.expert_parallel_degree = 1;
    c->parallelism.expert_tensor_parallel_degree = 1;
    c->parallelism.pipeline_parallel_degree = 1;
    c->training.local_batch_size = dp * f->training.local_batch_size;
    c->training.global_batch_size = -1;
    hp_test_use_bin(c, 'y', dp);
    hp_comm_t solo = NULL;
    HP_CHECK_OK(hp_comm_split(world, hp_comm_rank(world) == 0 ? 0 : -1, 0, &solo));
    if (solo) hp_test_train_steps(c, solo, N, l, n, 0);
    if (solo) hp_comm_destroy(solo);
    HP_CHECK_OK(hp_broadcast(l, N, HP_I64, 0, world, NULL));   // doubles as 8-byte words
    HP_CHECK_OK(hp_broadcast(n, N, HP_I64, 0, world, NULL));
    free(c);
}

/* Trains layout f (dp data-parallel ranks) on the sharded file and checks it against the
 * single-rank run of the same global batch (losses 1e-5, norms 1e-4: see the top). */
static void check_vs_solo(const char *what, hp_config_t *f, hp_comm_t world, int dp) {
    double sl[N], sn[N], fl[N], fn[N];
    solo_steps(f, world, dp, sl, sn);
    hp_test_use_bin(f, 'x', dp);
    hp_test_train_steps(f, world, N, fl, fn, 0);
    for (int i = 0; i < N; i++) {
        HP_CHECK_CLOSE(fl[i], sl[i], 1e-5, 0.0);
        HP_CHECK_CLOSE(fn[i], sn[i], 1e-4, 0.0);
    }
    double dmax = 0;
    for (int i = 0; i < N; i++) dmax = fmax(dmax, fabs(fl[i] - sl[i]) / fabs(sl[i]));
    if (hp_comm_rank(world) == 0)
        printf("%s: losses %.6f .. %.6f (one rank %.6f .. %.6f, max rel diff %.1e)\n", what, fl[0], fl[N - 1], sl[0],
               sl[N - 1], dmax);
}

static void set_ep(hp_config_t *f, int rep, int shard, int tp, int ep, int etp) {
    f->parallelism.data_parallel_replicate_degree = rep;
    f->parallelism.data_parallel_shard_degree = shard;
    f->parallelism.tensor_parallel_degree = tp;
    f->parallelism.enable_sequence_parallel = false;
    f->parallelism.expert_parallel_degree = ep;
    f->parallelism.expert_tensor_parallel_degree = etp;
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    hp_test_make_corpus(world, "hp_test_trainer_ep");
    hp_config_t *c = calloc(1, sizeof *c), *f = calloc(1, sizeof *f);
    double dl[N], dn[N], fl[N], fn[N];
    const char *models[2] = {"deepseek_v3", "qwen3_moe"};
    char what[128];
    const int B = 2, T = 16;   // moe_config's local batch and sequence
    hp_test_write_dp_bins(world, ws, B, T, N);
    if (ws == 8) {   // ep x TP x FSDP and HSDP x ep x efsdp against the single rank, both flavors
        hp_test_write_dp_bins(world, 4, B, T, N);
        for (int mi = 0; mi < 2; mi++) {
            moe_config(f, ws, models[mi]);
            set_ep(f, 1, 4, 2, 4, 2);   // dense: TP 2 x FSDP 4; experts: ep 4 x etp 2
            snprintf(what, sizeof what, "%s ep 4 x tp 2 x fsdp 4 (ETP)", models[mi]);
            check_vs_solo(what, f, world, 4);
            moe_config(f, ws, models[mi]);
            set_ep(f, 2, 4, 1, 2, 1);   // dense: HSDP (2, 4); experts: ep 2 x efsdp 2, summed over dp_replicate
            snprintf(what, sizeof what, "%s hsdp 2 x 4, ep 2 x efsdp 2", models[mi]);
            check_vs_solo(what, f, world, 8);
        }
        free(f);
        free(c);
        int rc = hp_test_finish("test_trainer_ep");
        hp_test_remove_corpus(world);
        hp_comm_finalize();
        return rc;
    }
    {   // under EP fully_shard owns the dense params (storage released, gathered per unit) while the
        // experts stay the model's own ep shards
        moe_config(f, ws, models[1]);
        set_ep(f, 1, ws, 1, ws, 1);
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(f, world, &t));
        if (t) {
            const hp_param_t *wq = hp_model_find_param(hp_trainer_model(t), "layers.0.attention.wq.weight"),
                             *w1 = hp_model_find_param(hp_trainer_model(t), "layers.1.moe.experts.w1");
            HP_CHECK(wq && !wq->value.local.data && w1 && w1->value.local.data && w1->value.local.shape[0] == 8 / ws,
                     "dense params not FSDP-managed (wq data %p) or experts not local (w1 %lld experts)",
                     wq ? wq->value.local.data : NULL, w1 ? (long long)w1->value.local.shape[0] : -1LL);
            hp_trainer_destroy(t);
        }
    }
    for (int mi = 0; mi < 2; mi++)
        for (int ep = ws; ep >= 2; ep /= 2) {   // ep = world, and ep 2 x efsdp 2 on 4 ranks
            moe_config(f, ws, models[mi]);
            set_ep(f, 1, ws, 1, ep, 1);
            snprintf(what, sizeof what, "%s ep %d (efsdp %d)", models[mi], ep, ws / ep);
            check_vs_solo(what, f, world, ws);
        }
    if (ws == 4) {   // ETP: experts over [ep 2, tp 2], dense TP 2 x FSDP 2
        hp_test_write_dp_bins(world, 2, B, T, N);
        for (int mi = 0; mi < 2; mi++) {
            moe_config(f, ws, models[mi]);
            set_ep(f, 1, 2, 2, 2, 2);
            snprintf(what, sizeof what, "%s ETP ep 2 x tp 2", models[mi]);
            check_vs_solo(what, f, world, 2);
        }
        hp_trainer_t t = NULL;   // ep borrowing tp ranks (etp 1) is refused by key
        f->parallelism.expert_tensor_parallel_degree = 1;
        HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_UNSUPPORTED, "expert_tensor_parallel_degree");
        // pipeline parallel of the MoE models with data parallel: pp 2 x FSDP 2 (deepseek_v3) and pp 2 x
        // DDP 2 (qwen3_moe), 1F1B, bias update on (counts summed over dp and pp) == the single rank
        for (int mi = 0; mi < 2; mi++) {
            moe_config(f, ws, models[mi]);
            set_ep(f, mi ? 2 : 1, mi ? 1 : 2, 1, 1, 1);
            f->parallelism.pipeline_parallel_degree = 2;
            snprintf(f->parallelism.pipeline_parallel_schedule, sizeof f->parallelism.pipeline_parallel_schedule, "1F1B");
            snprintf(what, sizeof what, "%s pp 2 x %s 2", models[mi], mi ? "DDP" : "FSDP");
            check_vs_solo(what, f, world, 2);
        }
        // experts are not sharded inside pipeline stages yet: pp 2 x ep 2 and pp 2 x tp 2 refused by key
        moe_config(f, ws, "qwen3_moe");
        set_ep(f, 1, 2, 1, 2, 1);
        f->parallelism.pipeline_parallel_degree = 2;
        HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_UNSUPPORTED,
                     "parallelism.pipeline_parallel_degree 2 with the MoE model qwen3_moe and "
                     "parallelism.expert_parallel_degree 2");
        set_ep(f, 1, 1, 2, 1, 1);
        HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_UNSUPPORTED, "tensor_parallel_degree 2 is not supported");
        // 2 experts over ep 2 x efsdp 2: efsdp x ep > E, the experts FSDP-sharded on dim 1 (Shard(1))
        moe_config(f, ws, "qwen3_moe");
        f->model.moe_num_experts = 2;
        set_ep(f, 1, 4, 1, 2, 1);
        check_vs_solo("qwen3_moe 2 experts, ep 2 x efsdp 2 (Shard(1))", f, world, 4);
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
    {   // negative test (STYLE rule 17): the single-rank reference against an lr x 1.001 EP run
        moe_config(c, ws, "qwen3_moe");
        solo_steps(c, world, ws, dl, dn);
        *f = *c;
        set_ep(f, 1, ws, 1, ws, 1);
        hp_test_use_bin(f, 'x', ws);
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
