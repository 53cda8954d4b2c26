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
#include "hyperparallel/trainer.h"

enum { N = 6 };

static void moe_config(hp_config_t *c, int ws, const char *name) { hp_test_moe_config(c, ws, name, N); }

enum { NP = 10 };   /* steps of the pipeline-parallel comparisons */

/* Runs c for NP steps on `comm` when this rank is in it; losses and norms reach every rank of
 * world from world rank 0 (as test_trainer_pp's run). */
static void run_pp(const hp_config_t *c, hp_comm_t comm, hp_comm_t world, double *l, double *n) {
    double buf[2 * NP] = {0};
    if (comm) {
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(c, comm, &t));
        for (int i = 0; t && i < NP; i++) {
            hp_step_stats_t st;
            HP_CHECK_OK(hp_trainer_step(t, &st));
            buf[i] = st.loss;
            buf[NP + i] = st.grad_norm;
        }
        hp_trainer_destroy(t);
    }
    HP_CHECK_OK(hp_broadcast(buf, sizeof buf, HP_U8, 0, world, NULL));   // doubles as bytes
    for (int i = 0; i < NP; i++) l[i] = buf[i], n[i] = buf[NP + i];
}

static int close_all(const double *a, const double *b, double rtol, int report, const char *what) {
    int ok = 1;
    for (int i = 0; i < NP; i++) {
        const int c = fabs(a[i] - b[i]) <= rtol * fabs(b[i]);
        if (report) HP_CHECK(c, "%s step %d: %.9g vs %.9g", what, i + 1, a[i], b[i]);
        ok &= c;
    }
    return ok;
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

/* Trains n steps; returns losses and, via bias_out (n_moe * E floats), the expert biases. */
static int train(const hp_config_t *c, hp_comm_t world, double *losses, float *bias_out) {
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, world, &t));
    if (!t) return 0;
    for (int i = 0; i < N; i++) {
        hp_step_stats_t st;
        HP_CHECK_OK(hp_trainer_step(t, &st));
        losses[i] = st.loss;
    }
    const hp_param_t *w1 = hp_model_find_param(hp_trainer_model(t), "layers.1.moe.experts.w1");
    for (int d = 0; d < 3; d++) last_w1_local[d] = w1 ? w1->value.local.shape[d] : -1;
    hp_module_t *mods[512];
    int nm = hp_model_modules(hp_trainer_model(t), mods, 512), k = 0;
    for (int i = 0; i < nm; i++) {
        if (!hp_module_is_moe(mods[i])) continue;
        const hp_moe_impl_t *M = mods[i]->impl;
        memcpy(bias_out + (size_t)k * M->c.n_experts, M->expert_bias, sizeof(float) * (size_t)M->c.n_experts);
        k++;
    }
    hp_trainer_destroy(t);
    return k;
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    hp_test_make_corpus(world, "hp_test_trainer_moe");
    hp_config_t *c = calloc(1, sizeof *c), *f = calloc(1, sizeof *f);
    double dl[N], fl[N], ds_losses[N];
    float bias[64 * 8], fbias[64 * 8], bias_ds[16];
    const char *models[2] = {"deepseek_v3", "qwen3_moe"};
    for (int mi = 0; mi < 2; mi++) {
        moe_config(c, ws, models[mi]);
        if (ws == 1 && mi == 0) {   // metrics to JSONL at every step
            snprintf(c->job.dump_folder, sizeof c->job.dump_folder, "%s/out", dir_);
            snprintf(c->metrics.jsonl_file, sizeof c->metrics.jsonl_file, "metrics.jsonl");
            c->metrics.log_freq = 1;
        }
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
        if (ws > 1) {   // counts summed over the batch mesh: every rank holds the same bias
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
            for (int i = 0; i < N; i++) HP_CHECK_CLOSE(fl[i], dl[i], 1e-5, 0.0);
            if (rank == 0)
                printf("%s FSDP %d: losses %.6f .. %.6f (DP %.6f .. %.6f)\n", models[mi], ws, fl[0], fl[N - 1], dl[0],
                       dl[N - 1]);
            if (mi == 0) {   // negative test (docs/testing.md)
                f->optimizer.lr *= 1.001;
                train(f, world, fl, fbias);
                int caught = 0;
                for (int i = 0; i < N; i++) caught |= fabs(fl[i] - dl[i]) > 1e-5 * fabs(dl[i]);
                HP_CHECK(caught, "negative test: lr x 1.001 stays within the 1e-5 loss tolerance");
            }
        } else if (rank == 0) {
            printf("%s: losses %.4f -> %.4f, bias[0] %+.4f\n", models[mi], dl[0], dl[N - 1], bias[0]);
        }
    }
    if (ws == 1) {   // full activation checkpointing: the same losses, bias and (halved) routing counts
        moe_config(c, ws, "deepseek_v3");
        snprintf(c->job.dump_folder, sizeof c->job.dump_folder, "%s/ac", dir_);
        snprintf(c->metrics.jsonl_file, sizeof c->metrics.jsonl_file, "metrics.jsonl");
        c->metrics.log_freq = 1;
        snprintf(c->activation_checkpoint.mode, sizeof c->activation_checkpoint.mode, "full");
        double al[N];
        float ab[64 * 8];
        int n_moe = train(c, world, al, ab);
        int same = n_moe == 2 && memcmp(ab, bias_ds, sizeof(float) * 16) == 0;
        for (int i = 0; i < N; i++) same &= al[i] == ds_losses[i];
        HP_CHECK(same, "full AC changed the MoE run (losses or expert_bias)");
        char pa[400], pb[400], la[512], lb[512];
        snprintf(pa, sizeof pa, "%s/ac/metrics.jsonl", dir_);
        snprintf(pb, sizeof pb, "%s/out/metrics.jsonl", dir_);
        FILE *fa = fopen(pa, "r"), *fb = fopen(pb, "r");
        int n_cmp = 0, n_eq = 0;
        while (fa && fb && fgets(la, sizeof la, fa)) {
            if (!strstr(la, "tokens_per_expert_max")) continue;
            while (fgets(lb, sizeof lb, fb) && !strstr(lb, "tokens_per_expert_max")) {}
            n_cmp++;
            n_eq += strcmp(la, lb) == 0;
        }
        if (fa) fclose(fa);
        if (fb) fclose(fb);
        HP_CHECK(n_cmp == 2 * N && n_eq == n_cmp, "full AC: %d of %d tokens_per_expert_max lines equal the run "
                 "without AC (the recompute must not count twice)", n_eq, n_cmp);
    }
    if (ws == 2) {   // TP 2 (dense layers TP, experts sharded on their hidden dim) == the single-rank run
        moe_config(c, 1, "qwen3_moe");
        double rl[N] = {0};
        float rb[64 * 8] = {0};
        int n_moe = 0;
        hp_comm_t solo = NULL;
        HP_CHECK_OK(hp_comm_split(world, rank == 0 ? 0 : -1, 0, &solo));
        if (rank == 0) n_moe = train(c, solo, rl, rb);
        if (solo) hp_comm_destroy(solo);
        HP_CHECK_OK(hp_broadcast(rl, N, HP_I64, 0, world, NULL));
        HP_CHECK_OK(hp_broadcast(rb, 64 * 8, HP_F32, 0, world, NULL));
        HP_CHECK_OK(hp_broadcast(&n_moe, 1, HP_I32, 0, world, NULL));
        c->parallelism.tensor_parallel_degree = 2;
        c->parallelism.enable_sequence_parallel = false;
        train(c, world, fl, fbias);
        for (int i = 0; i < N; i++) HP_CHECK_CLOSE(fl[i], rl[i], 1e-4, 0.0);   // test_tp_trainer's bound
        HP_CHECK(last_w1_local[0] == 8 && last_w1_local[1] == 16 && last_w1_local[2] == 64,
                 "tp 2: experts.w1 local (%lld, %lld, %lld), expected (8, 16, 64)", (long long)last_w1_local[0],
                 (long long)last_w1_local[1], (long long)last_w1_local[2]);
        if (rank == 0) printf("qwen3_moe tp 2: losses %.6f .. %.6f (one rank %.6f .. %.6f)\n", fl[0], fl[N - 1], rl[0], rl[N - 1]);
        // sequence parallel around the MoE layers: each tp rank routes its own sequence shard, so the
        // tokens per expert are summed over tp too; the bias update then equals the single rank's
        // (integer counts; equal while no top-k tie flips)
        for (int ep = 1; ep <= 2; ep++) {   // TP of the experts (EP 1), and EP 2 borrowing the tp ranks
            c->parallelism.enable_sequence_parallel = true;
            c->parallelism.expert_parallel_degree = ep;
            const int k = train(c, world, fl, fbias);
            HP_CHECK(k == n_moe && k > 0, "tp 2 + SP, ep %d: %d MoE layers, the single rank %d", ep, k, n_moe);
            for (int i = 0; i < N; i++) HP_CHECK_CLOSE(fl[i], rl[i], 1e-4, 0.0);
            double bmax = 0, bmove = 0;
            for (int i = 0; i < k * 8; i++) bmove = fmax(bmove, fabs((double)rb[i]));
            HP_CHECK(bmove > 0, "the single-rank expert_bias did not move");
            for (int i = 0; i < k * 8; i++) bmax = fmax(bmax, fabs((double)fbias[i] - rb[i]));
            HP_CHECK(bmax <= 1e-6, "tp 2 + SP, ep %d: expert_bias differs from the single rank's by %.3g", ep, bmax);
            if (rank == 0) printf("qwen3_moe tp 2 + SP, ep %d: losses %.6f .. %.6f, expert_bias max diff %.1e\n", ep, fl[0],
                                  fl[N - 1], bmax);
        }
        c->parallelism.expert_parallel_degree = 1;
        c->parallelism.enable_sequence_parallel = false;
    }
    if (ws == 1) {   // HyperParallel's auxiliary loss: logged, changes the router's training, still trains
        moe_config(c, ws, "deepseek_v3");
        snprintf(c->job.dump_folder, sizeof c->job.dump_folder, "%s/aux", dir_);
        snprintf(c->metrics.jsonl_file, sizeof c->metrics.jsonl_file, "metrics.jsonl");
        c->metrics.log_freq = 1;
        c->model.moe_aux_loss_coeff = 0.1;
        double xl[N];
        float xb[64 * 8];
        train(c, world, xl, xb);
        int differs = 0;
        for (int i = 1; i < N; i++) differs |= xl[i] != ds_losses[i];
        HP_CHECK(differs && xl[0] == ds_losses[0] && xl[N - 1] < xl[0] - 0.3,
                 "aux loss: losses %.6f .. %.6f (without %.6f .. %.6f): step 1 must match, later steps differ", xl[0],
                 xl[N - 1], ds_losses[0], ds_losses[N - 1]);
        char path[400], line[512];
        snprintf(path, sizeof path, "%s/aux/metrics.jsonl", dir_);
        FILE *fp = fopen(path, "r");
        int n_aux = 0, ok = 1;
        while (fp && fgets(line, sizeof line, fp)) {
            const char *q = strstr(line, "\"moe/aux_loss\": ");
            if (!q) continue;
            n_aux++;
            // 2 layers x 0.1 x E sum f p: at least 0.1 x 2 x K/E x ... > 0, at most 0.1 x 2 x E
            const double v = atof(q + 16);
            ok &= v > 0.0 && v < 0.1 * 2 * 8;
        }
        if (fp) fclose(fp);
        HP_CHECK(n_aux == N && ok, "metrics.jsonl: %d moe/aux_loss lines (expected %d), in range %d", n_aux, N, ok);
    }
    if (ws == 1) {   // the JSONL has the per-layer routing metrics
        char path[400], line[512];
        snprintf(path, sizeof path, "%s/out/metrics.jsonl", dir_);
        FILE *fp = fopen(path, "r");
        int imb = 0, tmax = 0;
        while (fp && fgets(line, sizeof line, fp)) {
            imb += strstr(line, "\"moe/layers.1/imbalance_max_over_mean\"") != NULL;
            tmax += strstr(line, "\"moe/layers.2/tokens_per_expert_max\"") != NULL;
        }
        if (fp) fclose(fp);
        HP_CHECK(imb == N && tmax == N, "metrics.jsonl: %d imbalance and %d tokens_per_expert_max lines, expected %d",
                 imb, tmax, N);
    }
    if (ws == 1) {   // expert_bias is checkpointed: 3 steps, save, resume, 3 more == 6 straight steps
        moe_config(c, ws, "deepseek_v3");
        snprintf(c->job.dump_folder, sizeof c->job.dump_folder, "%s/ck", dir_);
        c->checkpoint.enable = true;
        c->checkpoint.interval = 3;
        c->checkpoint.last_save_model_only = false;
        hp_trainer_t t = NULL;
        double rl[N];
        float b3[64 * 8];
        HP_CHECK_OK(hp_trainer_create(c, world, &t));
        for (int i = 0; t && i < 3; i++) {
            hp_step_stats_t st;
            HP_CHECK_OK(hp_trainer_step(t, &st));
            rl[i] = st.loss;
        }
        if (t) {
            hp_module_t *mods[512];
            int nm = hp_model_modules(hp_trainer_model(t), mods, 512);
            for (int i = 0; i < nm; i++)
                if (hp_module_is_moe(mods[i])) { memcpy(b3, ((hp_moe_impl_t *)mods[i]->impl)->expert_bias, 32); break; }
            hp_trainer_destroy(t);
        }
        t = NULL;
        HP_CHECK_OK(hp_trainer_create(c, world, &t));
        if (t) {
            HP_CHECK(hp_trainer_current_step(t) == 3, "resumed at step %lld, expected 3",
                     (long long)hp_trainer_current_step(t));
            hp_module_t *mods[512];
            int nm = hp_model_modules(hp_trainer_model(t), mods, 512);
            for (int i = 0; i < nm; i++)
                if (hp_module_is_moe(mods[i])) {
                    HP_CHECK(memcmp(b3, ((hp_moe_impl_t *)mods[i]->impl)->expert_bias, 32) == 0,
                             "expert_bias was not restored from the checkpoint");
                    break;
                }
            for (int i = 3; i < N; i++) {
                hp_step_stats_t st;
                HP_CHECK_OK(hp_trainer_step(t, &st));
                rl[i] = st.loss;
            }
            hp_trainer_destroy(t);
            for (int i = 0; i < N; i++)
                HP_CHECK(rl[i] == ds_losses[i], "resumed run step %d: loss %.9g, straight run %.9g", i + 1, rl[i],
                         ds_losses[i]);
        }
    }
    if (ws == 2) {   // pipeline parallel: pp 2 against the single rank over the same global batch
        hp_comm_t one = NULL;
        HP_CHECK_OK(hp_comm_split(world, rank == 0 ? 0 : -1, rank, &one));
        double rl[NP], rn[NP], pl[NP], pn[NP];
        const char *sched[2] = {"1F1B", "InterleavedZeroBubble"};
        for (int mi = 0; mi < 2; mi++) {
            moe_config(c, 1, models[mi]);
            c->model.n_layers = 4;   // layer 0 dense, 1 .. 3 MoE: 4 stages for the interleaved schedule
            c->training.steps = NP;
            c->training.local_batch_size = 4;
            c->training.max_norm = 1.0;
            snprintf(c->training.mixed_precision_param, sizeof c->training.mixed_precision_param, "float32");
            run_pp(c, one, world, rl, rn);
            for (int k = 0; k < 2; k++) {
                *f = *c;
                f->parallelism.pipeline_parallel_degree = 2;
                snprintf(f->parallelism.pipeline_parallel_schedule, sizeof f->parallelism.pipeline_parallel_schedule,
                         "%s", sched[k]);
                run_pp(f, world, world, pl, pn);
                char what[96];
                snprintf(what, sizeof what, "%s pp 2 %s", models[mi], sched[k]);
                close_all(pl, rl, 1e-5, 1, what);
                close_all(pn, rn, 1e-4, 1, "grad norm");
                if (rank == 0)
                    printf("%s: losses %.6f .. %.6f (single rank %.6f .. %.6f)\n", what, pl[0], pl[NP - 1], rl[0],
                           rl[NP - 1]);
            }
            if (mi == 1) {   // negative test (docs/testing.md): lr x 1.001 leaves the tolerance
                f->optimizer.lr *= 1.001;
                run_pp(f, world, world, pl, pn);
                HP_CHECK(!close_all(pl, rl, 1e-5, 0, ""), "pp 2 MoE run with lr x 1.001 matched within 1e-5");
                // the bias update matters here: without it the losses leave the tolerance, so the
                // matches above also say every stage moved its layers' biases as the single rank did
                f->optimizer.lr = c->optimizer.lr;
                f->model.moe_load_balance_coeff = 0.0;
                run_pp(f, world, world, pl, pn);
                HP_CHECK(!close_all(pl, rl, 1e-5, 0, ""), "pp 2 MoE run without the bias update matched within 1e-5");
                // the auxiliary loss is per forward pass (N = its tokens): PP's 4 micro-batches of
                // one sequence against the single rank accumulating 4 batches of one sequence
                hp_config_t *r = calloc(1, sizeof *r);
                *r = *c;
                r->model.moe_aux_loss_coeff = 0.1;
                r->training.local_batch_size = 1;
                r->training.global_batch_size = 4;
                double al[NP], an[NP], bl[NP], bn[NP];
                run_pp(r, one, world, al, an);
                *f = *r;
                f->training.local_batch_size = 4;
                f->parallelism.pipeline_parallel_degree = 2;
                snprintf(f->parallelism.pipeline_parallel_schedule, sizeof f->parallelism.pipeline_parallel_schedule,
                         "1F1B");
                run_pp(f, world, world, pl, pn);
                close_all(pl, al, 1e-5, 1, "qwen3_moe pp 2 1F1B with the aux loss");
                close_all(pn, an, 1e-4, 1, "grad norm");
                f->model.moe_aux_loss_coeff = 0.0;   // and the aux loss changes that run
                run_pp(f, world, world, bl, bn);
                HP_CHECK(!close_all(bl, al, 1e-5, 0, ""), "pp 2 without the aux loss matched the run with it");
                if (rank == 0) printf("qwen3_moe pp 2 with the aux loss: losses %.6f .. %.6f (one rank, accum 4: %.6f "
                                      ".. %.6f)\n", pl[0], pl[NP - 1], al[0], al[NP - 1]);
                free(r);
            }
        }
        {   // checkpoint: saved under pp 2 at step 5 (each stage's expert_bias), loaded under pp 1 on one
            // rank: the biases of all 3 MoE layers equal the single rank's after 5 steps (bitwise:
            // integer counts and sign updates, the same routing)
            float bref[3 * 8], bload[3 * 8];
            *f = *c;
            f->training.steps = 5;
            int nb = 0;
            if (one) {
                hp_trainer_t t = NULL;
                HP_CHECK_OK(hp_trainer_create(f, one, &t));
                for (int i = 0; t && i < 5; i++) {
                    hp_step_stats_t st;
                    HP_CHECK_OK(hp_trainer_step(t, &st));
                }
                nb = biases(t, bref);
                hp_trainer_destroy(t);
            }
            snprintf(f->job.dump_folder, sizeof f->job.dump_folder, "%s/ckpp", dir_);
            f->checkpoint.enable = true;
            f->checkpoint.interval = 5;
            f->checkpoint.last_save_model_only = false;
            f->parallelism.pipeline_parallel_degree = 2;
            snprintf(f->parallelism.pipeline_parallel_schedule, sizeof f->parallelism.pipeline_parallel_schedule, "1F1B");
            hp_trainer_t t = NULL;
            HP_CHECK_OK(hp_trainer_create(f, world, &t));
            for (int i = 0; t && i < 5; i++) {
                hp_step_stats_t st;
                HP_CHECK_OK(hp_trainer_step(t, &st));
            }
            hp_trainer_destroy(t);
            t = NULL;
            if (one) {
                f->parallelism.pipeline_parallel_degree = 1;
                f->checkpoint.exclude_from_loading.n = 1;
                snprintf(f->checkpoint.exclude_from_loading.items[0], HP_CONFIG_STR_MAX, "dataloader");
                HP_CHECK_OK(hp_trainer_create(f, one, &t));
                HP_CHECK(t && hp_trainer_current_step(t) == 5, "pp 2 checkpoint not loaded under pp 1 (step %lld)",
                         t ? (long long)hp_trainer_current_step(t) : -1LL);
                HP_CHECK(nb == 3 && biases(t, bload) == 3 && memcmp(bref, bload, sizeof bref) == 0,
                         "expert_bias after loading the pp 2 checkpoint differs from the single rank's (%d layers)", nb);
                hp_trainer_destroy(t);
            }
            hp_barrier(world, NULL);
        }
        hp_comm_destroy(one);
    }
    // bad MoE keys are named
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
    free(f);
    free(c);
    int rc = hp_test_finish("test_trainer_moe");
    hp_test_remove_corpus(world);
    hp_comm_finalize();
    return rc;
}
