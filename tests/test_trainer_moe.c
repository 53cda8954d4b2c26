/* The trainer with the MoE models (deepseek_v3, qwen3_moe debug flavors, small overrides
 * through the model.moe_* keys): training falls on one rank; the aux-loss-free expert_bias
 * update runs as an optimizer pre-step hook (bias moves, sums to zero per layer, equal on
 * every rank because the counts are summed over the batch mesh); per-layer imbalance and
 * tokens per expert reach the JSONL metrics; on 2 ranks FSDP gives the losses of replicated
 * data parallel (float32 all-gather; reduction order: 1e-5 relative) and an lr x 1.001 run
 * does not; TP 2 (experts tensor parallel on their hidden dim) equals the single-rank run, also
 * with sequence parallel (EP 1, and EP 2 borrowing the tp ranks: the same expert_bias); bad
 * MoE keys are named; HyperParallel's auxiliary loss is logged and changes training. Pipeline
 * parallel (2 ranks): pp 2 with 1F1B and InterleavedZeroBubble, both models (4 layers, dense
 * first), bias update on, 10 steps equal the single-rank run over the same batch (the PP tests'
 * 1e-5 loss / 1e-4 norm: fp32 order of the micro-batch gradient sums; routing counts are
 * integers, so the biases match exactly while no top-k tie flips) and an lr x 1.001 run does
 * not. */
// hp-test: ranks 1 2 timeout 300
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
#include "hyperparallel/models.h"
#include "hyperparallel/trainer.h"

enum { N = 6 };
enum { NP = 10 };   /* steps of the pipeline-parallel comparisons */

static const char *const models[2] = {"deepseek_v3", "qwen3_moe"};

static void moe_config(hp_config_t *c, int ws, const char *name) { hp_test_moe_config(c, ws, name, N); }

/* c writes its metrics to <dir_>/<sub>/metrics.jsonl at every step. */
static void jsonl_every_step(hp_config_t *c, const char *sub) {
    snprintf(c->job.dump_folder, sizeof c->job.dump_folder, "%s/%s", dir_, sub);
    snprintf(c->metrics.jsonl_file, sizeof c->metrics.jsonl_file, "metrics.jsonl");
    c->metrics.log_freq = 1;
}

/* The expert_bias of every MoE layer of t's model (E = 8 each) into out; returns the count. */
static int biases(hp_trainer_t t, float *out) {
    if (!t) return 0;
    hp_module_t *mods[512];
    int nm = hp_model_modules(hp_trainer_model(t), mods, 512), k = 0;
    for (int i = 0; i < nm; i++)
        if (hp_module_is_moe(mods[i])) memcpy(out + 8 * k++, ((hp_moe_impl_t *)mods[i]->impl)->expert_bias, 32);
    return k;
}

static int64_t last_w1_local[3];   /* local shape of layers.1.moe.experts.w1 in the last train() */

/* Trains N steps; returns the number of MoE layers, the losses and, via bias_out (8 floats a
 * MoE layer), the expert biases. */
static int train(const hp_config_t *c, hp_comm_t world, double *losses, float *bias_out) {
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, world, &t));
    if (!t) return 0;
    hp_test_steps(t, N, losses, NULL);
    const hp_param_t *w1 = hp_model_find_param(hp_trainer_model(t), "layers.1.moe.experts.w1");
    for (int d = 0; d < 3; d++) last_w1_local[d] = w1 ? w1->value.local.shape[d] : -1;
    const int k = biases(t, bias_out);
    hp_trainer_destroy(t);
    return k;
}

/* Both flavors train on `world` with the bias update: the loss falls, each layer's expert_bias
 * sums to zero and moved; on 2 ranks every rank holds the same bias and FSDP gives the losses of
 * replicated data parallel (and an lr x 1.001 run does not). deepseek_v3's losses and first
 * 16 biases to ds_losses, bias_ds (1 rank: its metrics to <dir_>/out). */
static void flavors(hp_comm_t world, int ws, double *ds_losses, float *bias_ds) {
    hp_config_t *c = calloc(1, sizeof *c), *f = calloc(1, sizeof *f);
    double dl[N], fl[N];
    float bias[64 * 8], fbias[64 * 8];
    for (int mi = 0; mi < 2; mi++) {
        moe_config(c, ws, models[mi]);
        if (ws == 1 && mi == 0) jsonl_every_step(c, "out");
        int n_moe = train(c, world, dl, bias);
        if (mi == 0) {
            memcpy(ds_losses, dl, sizeof dl);
            memcpy(bias_ds, bias, sizeof(float) * 16);
        }
        HP_CHECK(n_moe == 2, "%s: %d MoE layers, expected 2 (1 dense of 3)", models[mi], n_moe);
        HP_CHECK(isfinite(dl[N - 1]) && dl[N - 1] < dl[0] - 0.3, "%s: loss %.4f -> %.4f does not fall", models[mi],
                 dl[0], dl[N - 1]);
        for (int l = 0; l < n_moe; l++) {
            double s = 0, a = 0;
            for (int e = 0; e < 8; e++) { s += bias[l * 8 + e]; a += fabs(bias[l * 8 + e]); }
            // N updates of +-coeff each, centred: sum 0 up to f32 rounding, some entry moved
            HP_CHECK(fabs(s) < 1e-5 && a > 0.5e-2, "%s layer %d: expert_bias sum %.3g, |bias|_1 %.3g", models[mi], l,
                     s, a);
        }
        if (ws == 1) {
            if (hp_comm_rank(world) == 0)
                printf("%s: losses %.4f -> %.4f, bias[0] %+.4f\n", models[mi], dl[0], dl[N - 1], bias[0]);
            continue;
        }
        // counts summed over the batch mesh: every rank holds the same bias
        float mx[64 * 8], mn[64 * 8];
        HP_CHECK_OK(hp_all_reduce(bias, mx, (size_t)n_moe * 8, HP_F32, HP_MAX, world, NULL));
        HP_CHECK_OK(hp_all_reduce(bias, mn, (size_t)n_moe * 8, HP_F32, HP_MIN, world, NULL));
        HP_CHECK(memcmp(mx, mn, sizeof(float) * (size_t)n_moe * 8) == 0, "%s: expert_bias differs across ranks",
                 models[mi]);
        // FSDP over 2 ranks == replicated data parallel
        *f = *c;
        f->parallelism.data_parallel_replicate_degree = 1;
        f->parallelism.data_parallel_shard_degree = ws;
        snprintf(f->training.mixed_precision_param, sizeof f->training.mixed_precision_param, "float32");
        train(f, world, fl, fbias);
        char what[64];
        snprintf(what, sizeof what, "%s FSDP %d vs DP", models[mi], ws);
        hp_test_compare_runs(what, N, fl, dl, NULL, NULL, 1e-5, 0);
        if (mi == 0) {   // negative test (STYLE rule 17)
            f->optimizer.lr *= 1.001;
            train(f, world, fl, fbias);
            HP_CHECK(hp_test_any_outside(fl, dl, N, 1e-5), "negative test: lr x 1.001 stays within the 1e-5 loss "
                     "tolerance");
        }
    }
    free(f);
    free(c);
}

/* The lines of a JSONL file that contain key, up to max, into lines (each up to 511 bytes);
 * returns their count. */
static int jsonl_lines(const char *sub, const char *key, char (*lines)[512], int max) {
    char path[400], line[512];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir_, sub);
    FILE *fp = fopen(path, "r");
    int n = 0;
    while (fp && fgets(line, sizeof line, fp))
        if (strstr(line, key)) {
            if (n < max) memcpy(lines[n], line, sizeof line);
            n++;
        }
    if (fp) fclose(fp);
    return n;
}

/* 1 rank: full activation checkpointing gives the same losses, bias and routing counts as the run
 * without (flavors' deepseek_v3 run): the MoE counts a micro-batch's first forward only. */
static void full_ac(hp_comm_t world, const double *ds_losses, const float *bias_ds) {
    hp_config_t *c = calloc(1, sizeof *c);
    moe_config(c, 1, "deepseek_v3");
    jsonl_every_step(c, "ac");
    snprintf(c->activation_checkpoint.mode, sizeof c->activation_checkpoint.mode, "full");
    double al[N];
    float ab[64 * 8];
    int n_moe = train(c, world, al, ab);
    int same = n_moe == 2 && memcmp(ab, bias_ds, sizeof(float) * 16) == 0;
    for (int i = 0; i < N; i++) same &= al[i] == ds_losses[i];
    HP_CHECK(same, "full AC changed the MoE run (losses or expert_bias)");
    static char la[4 * N][512], lb[4 * N][512];
    const int na = jsonl_lines("ac", "tokens_per_expert_max", la, 4 * N),
              nb = jsonl_lines("out", "tokens_per_expert_max", lb, 4 * N);
    int n_cmp = na, n_eq = 0;
    for (int i = 0; i < na && i < 4 * N; i++) n_eq += i < nb && strcmp(la[i], lb[i]) == 0;
    HP_CHECK(n_cmp == 2 * N && n_eq == n_cmp, "full AC: %d of %d tokens_per_expert_max lines equal the run "
             "without AC (the recompute must not count twice)", n_eq, n_cmp);
    free(c);
}

/* 2 ranks: TP 2 (dense layers TP, experts sharded on their hidden dim) == the single-rank run;
 * with sequence parallel around the MoE layers each tp rank routes its own sequence shard, so
 * the tokens per expert are summed over tp too and the bias update equals the single rank's
 * (integer counts; equal while no top-k tie flips): TP of the experts (EP 1), and EP 2 borrowing
 * the tp ranks. */
static void tp_cases(hp_comm_t world) {
    hp_config_t *c = calloc(1, sizeof *c);
    moe_config(c, 1, "qwen3_moe");
    double rl[N] = {0}, fl[N];
    float rb[64 * 8] = {0}, fbias[64 * 8];
    int n_moe = 0;
    hp_comm_t solo = hp_test_first_ranks(world, 1);
    if (solo) n_moe = train(c, solo, rl, rb);
    hp_comm_destroy(solo);
    HP_CHECK_OK(hp_broadcast(rl, N, HP_I64, 0, world, NULL));
    HP_CHECK_OK(hp_broadcast(rb, 64 * 8, HP_F32, 0, world, NULL));
    HP_CHECK_OK(hp_broadcast(&n_moe, 1, HP_I32, 0, world, NULL));
    c->parallelism.tensor_parallel_degree = 2;
    c->parallelism.enable_sequence_parallel = false;
    train(c, world, fl, fbias);
    hp_test_compare_runs("qwen3_moe tp 2 vs one rank", N, fl, rl, NULL, NULL, 1e-4, 0);   // test_tp_trainer's bound
    HP_CHECK(last_w1_local[0] == 8 && last_w1_local[1] == 16 && last_w1_local[2] == 64,
             "tp 2: experts.w1 local (%lld, %lld, %lld), expected (8, 16, 64)", (long long)last_w1_local[0],
             (long long)last_w1_local[1], (long long)last_w1_local[2]);
    for (int ep = 1; ep <= 2; ep++) {
        c->parallelism.enable_sequence_parallel = true;
        c->parallelism.expert_parallel_degree = ep;
        const int k = train(c, world, fl, fbias);
        HP_CHECK(k == n_moe && k > 0, "tp 2 + SP, ep %d: %d MoE layers, the single rank %d", ep, k, n_moe);
        char what[64];
        snprintf(what, sizeof what, "qwen3_moe tp 2 + SP, ep %d vs one rank", ep);
        hp_test_compare_runs(what, N, fl, rl, NULL, NULL, 1e-4, 0);
        double bmax = 0, bmove = 0;
        for (int i = 0; i < k * 8; i++) bmove = fmax(bmove, fabs((double)rb[i]));
        HP_CHECK(bmove > 0, "the single-rank expert_bias did not move");
        for (int i = 0; i < k * 8; i++) bmax = fmax(bmax, fabs((double)fbias[i] - rb[i]));
        HP_CHECK(bmax <= 1e-6, "tp 2 + SP, ep %d: expert_bias differs from the single rank's by %.3g", ep, bmax);
        if (hp_comm_rank(world) == 0) printf("%s: expert_bias max diff %.1e\n", what, bmax);
    }
    free(c);
}

/* 1 rank: HyperParallel's auxiliary loss is logged, changes the router's training, still trains. */
static void aux_loss(hp_comm_t world, const double *ds_losses) {
    hp_config_t *c = calloc(1, sizeof *c);
    moe_config(c, 1, "deepseek_v3");
    jsonl_every_step(c, "aux");
    c->model.moe_aux_loss_coeff = 0.1;
    double xl[N];
    float xb[64 * 8];
    train(c, world, xl, xb);
    int differs = 0;
    for (int i = 1; i < N; i++) differs |= xl[i] != ds_losses[i];
    HP_CHECK(differs && xl[0] == ds_losses[0] && xl[N - 1] < xl[0] - 0.3,
             "aux loss: losses %.6f .. %.6f (without %.6f .. %.6f): step 1 must match, later steps differ", xl[0],
             xl[N - 1], ds_losses[0], ds_losses[N - 1]);
    static char lines[4 * N][512];
    const int n_aux = jsonl_lines("aux", "\"moe/aux_loss\": ", lines, 4 * N);
    int ok = 1;
    for (int i = 0; i < n_aux && i < 4 * N; i++) {
        // 2 layers x 0.1 x E sum f p: at least 0.1 x 2 x K/E x ... > 0, at most 0.1 x 2 x E
        const double v = atof(strstr(lines[i], "\"moe/aux_loss\": ") + 16);
        ok &= v > 0.0 && v < 0.1 * 2 * 8;
    }
    HP_CHECK(n_aux == N && ok, "metrics.jsonl: %d moe/aux_loss lines (expected %d), in range %d", n_aux, N, ok);
    free(c);
}

/* 1 rank: the JSONL of flavors' deepseek_v3 run has the per-layer routing metrics. */
static void routing_metrics(void) {
    static char lines[4 * N][512];
    const int imb = jsonl_lines("out", "\"moe/layers.1/imbalance_max_over_mean\"", lines, 4 * N),
              tmax = jsonl_lines("out", "\"moe/layers.2/tokens_per_expert_max\"", lines, 4 * N);
    HP_CHECK(imb == N && tmax == N, "metrics.jsonl: %d imbalance and %d tokens_per_expert_max lines, expected %d",
             imb, tmax, N);
}

/* 1 rank: expert_bias is checkpointed: 3 steps, save, resume, 3 more == 6 straight steps. */
static void ckpt_bias(hp_comm_t world, const double *ds_losses) {
    hp_config_t *c = calloc(1, sizeof *c);
    moe_config(c, 1, "deepseek_v3");
    snprintf(c->job.dump_folder, sizeof c->job.dump_folder, "%s/ck", dir_);
    c->checkpoint.enable = true;
    c->checkpoint.interval = 3;
    c->checkpoint.last_save_model_only = false;
    hp_trainer_t t = NULL;
    double rl[N];
    float b3[64 * 8], b[64 * 8];
    HP_CHECK_OK(hp_trainer_create(c, world, &t));
    if (t) hp_test_steps(t, 3, rl, NULL);
    const int n3 = biases(t, b3);
    hp_trainer_destroy(t);
    t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, world, &t));
    if (t) {
        HP_CHECK(hp_trainer_current_step(t) == 3, "resumed at step %lld, expected 3",
                 (long long)hp_trainer_current_step(t));
        HP_CHECK(n3 > 0 && biases(t, b) == n3 && memcmp(b3, b, sizeof(float) * 8 * (size_t)n3) == 0,
                 "expert_bias was not restored from the checkpoint");
        hp_test_steps(t, N - 3, rl + 3, NULL);
        hp_trainer_destroy(t);
        for (int i = 0; i < N; i++)
            HP_CHECK(rl[i] == ds_losses[i], "resumed run step %d: loss %.9g, straight run %.9g", i + 1, rl[i],
                     ds_losses[i]);
    }
    free(c);
}

/* The pipeline-parallel config: 4 layers (layer 0 dense, 1 .. 3 MoE: 4 stages for the
 * interleaved schedule), NP steps of local batch 4, clipping, f32 parameters. */
static void pp_config(hp_config_t *c, const char *model) {
    moe_config(c, 1, model);
    c->model.n_layers = 4;
    c->training.steps = NP;
    c->training.local_batch_size = 4;
    c->training.max_norm = 1.0;
    snprintf(c->training.mixed_precision_param, sizeof c->training.mixed_precision_param, "float32");
}

static void set_pp2(hp_config_t *f, const char *sched) {
    f->parallelism.pipeline_parallel_degree = 2;
    snprintf(f->parallelism.pipeline_parallel_schedule, sizeof f->parallelism.pipeline_parallel_schedule, "%s", sched);
}

/* 2 ranks: pp 2 against the single rank over the same global batch, both flavors, 1F1B and
 * InterleavedZeroBubble; for qwen3_moe the lr x 1.001 run and the run without the bias update
 * leave the tolerance, and the auxiliary loss (per forward pass) under PP's 4 micro-batches of
 * one sequence equals the single rank accumulating 4 batches of one sequence. */
static void pp_cases(hp_comm_t world, hp_comm_t one) {
    static const char *const sched[2] = {"1F1B", "InterleavedZeroBubble"};
    hp_config_t *c = calloc(1, sizeof *c), *f = calloc(1, sizeof *f);
    double rl[NP], rn[NP], pl[NP], pn[NP];
    char what[96];
    for (int mi = 0; mi < 2; mi++) {
        pp_config(c, models[mi]);
        hp_test_run_on(c, one, world, NP, rl, rn, NULL);
        for (int k = 0; k < 2; k++) {
            *f = *c;
            set_pp2(f, sched[k]);
            hp_test_run_on(f, world, world, NP, pl, pn, NULL);
            snprintf(what, sizeof what, "%s pp 2 %s", models[mi], sched[k]);
            hp_test_compare_runs(what, NP, pl, rl, pn, rn, 1e-5, 1e-4);
        }
    }
    // negative (STYLE rule 17): lr x 1.001 must leave the tolerance on some step (f: qwen3_moe's
    // InterleavedZeroBubble run)
    f->optimizer.lr *= 1.001;
    hp_test_run_on(f, world, world, NP, pl, pn, NULL);
    HP_CHECK(hp_test_any_outside(pl, rl, NP, 1e-5), "pp 2 MoE run with lr x 1.001 matched within 1e-5");
    // the bias update matters here: without it the losses leave the tolerance, so the matches
    // above also say every stage moved its layers' biases as the single rank did
    f->optimizer.lr = c->optimizer.lr;
    f->model.moe_load_balance_coeff = 0.0;
    hp_test_run_on(f, world, world, NP, pl, pn, NULL);
    HP_CHECK(hp_test_any_outside(pl, rl, NP, 1e-5), "pp 2 MoE run without the bias update matched within 1e-5");
    // the auxiliary loss is per forward pass (N = its tokens)
    hp_config_t *r = calloc(1, sizeof *r);
    *r = *c;
    r->model.moe_aux_loss_coeff = 0.1;
    r->training.local_batch_size = 1;
    r->training.global_batch_size = 4;
    double al[NP], an[NP];
    hp_test_run_on(r, one, world, NP, al, an, NULL);
    *f = *r;
    f->training.local_batch_size = 4;
    set_pp2(f, "1F1B");
    hp_test_run_on(f, world, world, NP, pl, pn, NULL);
    hp_test_compare_runs("qwen3_moe pp 2 1F1B with the aux loss vs one rank, accumulation 4", NP, pl, al, pn, an,
                         1e-5, 1e-4);
    f->model.moe_aux_loss_coeff = 0.0;   // and the aux loss changes that run
    hp_test_run_on(f, world, world, NP, pl, pn, NULL);
    HP_CHECK(hp_test_any_outside(pl, al, NP, 1e-5), "pp 2 without the aux loss matched the run with it");
    free(r);
    free(f);
    free(c);
}

/* 2 ranks: a checkpoint saved under pp 2 at step 5 (each stage's expert_bias), loaded under
 * pp 1 on one rank: the biases of all 3 MoE layers equal the single rank's after 5 steps
 * (bitwise: integer counts and sign updates, the same routing). */
static void pp_ckpt(hp_comm_t world, hp_comm_t one) {
    hp_config_t *f = calloc(1, sizeof *f);
    pp_config(f, "qwen3_moe");
    f->training.steps = 5;
    float bref[3 * 8], bload[3 * 8];
    double l[5];
    int nb = 0;
    if (one) {
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(f, one, &t));
        if (t) hp_test_steps(t, 5, l, NULL);
        nb = biases(t, bref);
        hp_trainer_destroy(t);
    }
    snprintf(f->job.dump_folder, sizeof f->job.dump_folder, "%s/ckpp", dir_);
    f->checkpoint.enable = true;
    f->checkpoint.interval = 5;
    f->checkpoint.last_save_model_only = false;
    set_pp2(f, "1F1B");
    hp_test_run_steps(f, world, 0, 5, l, "pp 2");
    if (one) {
        f->parallelism.pipeline_parallel_degree = 1;
        f->checkpoint.exclude_from_loading.n = 1;
        snprintf(f->checkpoint.exclude_from_loading.items[0], HP_CONFIG_STR_MAX, "dataloader");
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(f, one, &t));
        HP_CHECK(t && hp_trainer_current_step(t) == 5, "pp 2 checkpoint not loaded under pp 1 (step %lld)",
                 t ? (long long)hp_trainer_current_step(t) : -1LL);
        HP_CHECK(nb == 3 && biases(t, bload) == 3 && memcmp(bref, bload, sizeof bref) == 0,
                 "expert_bias after loading the pp 2 checkpoint differs from the single rank's (%d layers)", nb);
        hp_trainer_destroy(t);
    }
    hp_barrier(world, NULL);
    free(f);
}

/* Bad MoE keys are named. */
static void bad_keys(int ws) {
    hp_config_t *c = calloc(1, sizeof *c);
    hp_model_config_t mc;
    moe_config(c, ws, "qwen3_moe");
    c->model.moe_top_k = 9;
    HP_CHECK_ERR(hp_config_resolve_model(c, 2048, "test", 16, &mc), HP_ERR_INVALID_ARG, "'model.moe_top_k' = 9");
    moe_config(c, ws, "qwen3_moe");
    c->parallelism.expert_parallel_degree = 3;
    HP_CHECK_ERR(hp_config_resolve_model(c, 2048, "test", 16, &mc), HP_ERR_INVALID_ARG,
                 "'parallelism.expert_parallel_degree' = 3 must divide model.moe_num_experts = 8");
    moe_config(c, ws, "llama3");
    c->model.moe_top_k = -1;
    c->model.moe_num_experts = 4;
    HP_CHECK_ERR(hp_config_resolve_model(c, 2048, "test", 16, &mc), HP_ERR_INVALID_ARG, "dense model");
    free(c);
}

/* The final weights file of a sharded run (FSDP 2, then PP 2) holds every MoE layer's trained
 * expert_bias: each rank compares the biases of the layers its model holds with the file's
 * (bitwise: the bias is replicated state, copied, never reduced). */
static void final_weights_bias(hp_comm_t world) {
    for (int pp = 0; pp < 2; pp++) {
        hp_config_t *c = calloc(1, sizeof *c);
        if (pp) {
            pp_config(c, "qwen3_moe");
            set_pp2(c, "1F1B");
        } else {
            moe_config(c, 1, "qwen3_moe");
            c->parallelism.data_parallel_shard_degree = 2;
        }
        snprintf(c->job.dump_folder, sizeof c->job.dump_folder, "%s/fw%d", dir_, pp);
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(c, world, &t));
        if (t) HP_CHECK_OK(hp_trainer_train(t));
        hp_barrier(world, NULL);
        char path[600];
        snprintf(path, sizeof path, "%s/weights.safetensors", c->job.dump_folder);
        hp_model_t m = NULL;
        HP_CHECK_OK(hp_model_load_weights(path, 1, 16, &m));
        hp_module_t *mine[512], *file[512];
        const int nm = t ? hp_model_modules(hp_trainer_model(t), mine, 512) : 0;
        const int nf = m ? hp_model_modules(m, file, 512) : 0;
        int compared = 0;
        for (int i = 0; i < nm; i++) {
            if (!hp_module_is_moe(mine[i])) continue;
            for (int j = 0; j < nf; j++) {
                if (!hp_module_is_moe(file[j]) || strcmp(file[j]->name, mine[i]->name)) continue;
                const float *a = ((hp_moe_impl_t *)mine[i]->impl)->expert_bias, *b = ((hp_moe_impl_t *)file[j]->impl)->expert_bias;
                float moved = 0;
                for (int e = 0; e < 8; e++) moved += a[e] != 0;
                HP_CHECK(memcmp(a, b, 8 * sizeof(float)) == 0 && moved > 0,
                         "%s: %s's expert_bias in the final weights differs from the trained one (or did not move)",
                         pp ? "pp 2" : "FSDP 2", mine[i]->name);
                compared++;
            }
        }
        HP_CHECK(compared > 0, "%s: no MoE layer compared", pp ? "pp 2" : "FSDP 2");
        hp_model_destroy(m);
        hp_trainer_destroy(t);
        free(c);
    }
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_config_t *c = NULL;
    hp_comm_t world = hp_test_corpus_init(&argc, &argv, "hp_test_trainer_moe", &rank, &ws, &c);
    double ds_losses[N];
    float bias_ds[16];
    flavors(world, ws, ds_losses, bias_ds);
    if (ws == 1) {
        full_ac(world, ds_losses, bias_ds);
        aux_loss(world, ds_losses);
        routing_metrics();
        ckpt_bias(world, ds_losses);
    }
    if (ws == 2) {
        tp_cases(world);
        hp_comm_t one = hp_test_first_ranks(world, 1);
        pp_cases(world, one);
        pp_ckpt(world, one);
        hp_comm_destroy(one);
        final_weights_bias(world);
    }
    bad_keys(ws);
    free(c);
    return hp_test_corpus_finish(world, "test_trainer_moe");
}
