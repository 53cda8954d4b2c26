/* Trainer with fully_shard on a model with tied embeddings (qwen3 debugmodel, output uses
 * tok_embeddings.weight; the embedding and the root are one FSDP group, docs/fsdp.md), 2 ranks:
 * - FSDP (dp_shard 2, mixed_precision_param float32) gives the losses and gradient norms of
 *   replicated data parallel (dp_replicate 2: the trainer's per-parameter all-reduce for tied
 *   models) for 4 steps (fp32 reduction order: 1e-5 relative loss, 1e-4 norm);
 * - checkpoint under FSDP 2: a run interrupted after step 3 and resumed gives bitwise the
 *   uninterrupted FSDP losses; the tied weight is saved once (tok_embeddings.weight in two row
 *   chunks, no output.weight); the FSDP checkpoint resumes under replicated DP;
 * - 4 ranks: TP2 x FSDP2 (with and without sequence + loss parallel; the tied weight is
 *   Shard(0) on tp from both users and FSDP shards its TP-local rows) gives the losses and
 *   norms of replicated DP over the first 2 ranks (1e-4 relative, norms 1e-3, as
 *   test_tp_trainer_2d). */
// hp-test: ranks 4 timeout 900 coretype 2
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
#include "hyperparallel/tokenizer.h"
#include "hyperparallel/trainer.h"

enum { N = 4, STEPS = 6 };

static void steps(hp_trainer_t t, double *losses, int n) {
    for (int i = 0; i < n; i++) {
        hp_step_stats_t st;
        HP_CHECK_OK(hp_trainer_step(t, &st));
        losses[i] = st.loss;
    }
}

static void base(hp_config_t *c, int dp) {
    hp_test_base_config(c, dp);
    snprintf(c->model.name, sizeof c->model.name, "qwen3");
    c->training.seq_len = 16;
    c->training.steps = STEPS;
    c->validation.steps = 1;
    snprintf(c->training.mixed_precision_param, sizeof c->training.mixed_precision_param, "float32");
}

/* 4 ranks: TP2 x FSDP2 against replicated DP over ranks 0 and 1 (the same data per dp rank). */
static void tp_cases(hp_comm_t world) {
    const int rank = hp_comm_rank(world);
    hp_config_t *c = calloc(1, sizeof *c), *d = calloc(1, sizeof *d);
    base(c, 2);
    c->training.local_batch_size = 1;
    c->validation.enable = false;
    c->training.max_norm = 1.0;
    double rl[N] = {0}, rn[N] = {0}, l[N], n[N];
    hp_comm_t pair = NULL;
    HP_CHECK_OK(hp_comm_split(world, rank < 2 ? 0 : -1, rank, &pair));
    if (pair) hp_test_train_steps(c, pair, N, rl, rn, 0);
    if (pair) hp_comm_destroy(pair);
    HP_CHECK_OK(hp_broadcast(rl, N, HP_I64, 0, world, NULL));
    HP_CHECK_OK(hp_broadcast(rn, N, HP_I64, 0, world, NULL));
    for (int sp = 0; sp < 2; sp++) {
        *d = *c;
        d->parallelism.data_parallel_replicate_degree = 1;
        d->parallelism.data_parallel_shard_degree = 2;
        d->parallelism.tensor_parallel_degree = 2;
        d->parallelism.enable_sequence_parallel = sp;
        d->parallelism.enable_loss_parallel = sp;
        hp_test_train_steps(d, world, N, l, n, 0);
        double wl = 0, wn = 0;
        for (int i = 0; i < N; i++) {
            HP_CHECK(fabs(l[i] - rl[i]) <= 1e-4 * fabs(rl[i]), "qwen3 tp2 x fsdp2 sp%d step %d: loss %.7f, dp2 %.7f", sp,
                     i + 1, l[i], rl[i]);
            HP_CHECK(fabs(n[i] - rn[i]) <= 1e-3 * fabs(rn[i]), "qwen3 tp2 x fsdp2 sp%d step %d: grad norm %.7f, dp2 %.7f",
                     sp, i + 1, n[i], rn[i]);
            wl = fmax(wl, fabs(l[i] - rl[i]) / fabs(rl[i]));
            wn = fmax(wn, fabs(n[i] - rn[i]) / fabs(rn[i]));
        }
        if (rank == 0)
            printf("qwen3 (tied) tp2 x fsdp2 sp%d: losses %.6f -> %.6f (dp2 %.6f -> %.6f); worst rel loss %.2e norm %.2e\n",
                   sp, l[0], l[N - 1], rl[0], rl[N - 1], wl, wn);
    }
    free(d);
    free(c);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    hp_test_make_corpus(world, "hp_test_trainer_fsdp_tied");
    if (ws == 4) {
        tp_cases(world);
        int rc = hp_test_finish("test_trainer_fsdp_tied");
        hp_test_remove_corpus(world);
        hp_comm_finalize();
        return rc;
    }
    hp_config_t *c = calloc(1, sizeof *c), *f = calloc(1, sizeof *f);
    base(c, ws);

    /* parity: FSDP 2 vs replicated DP */
    double dl[N], dn[N], fl[N], fn[N];
    hp_test_train_steps(c, world, N, dl, dn, 1);
    *f = *c;
    f->parallelism.data_parallel_replicate_degree = 1;
    f->parallelism.data_parallel_shard_degree = ws;
    hp_test_train_steps(f, world, N, fl, fn, 1);
    double wl = 0, wn = 0;
    for (int i = 0; i < N; i++) {
        HP_CHECK_CLOSE(fl[i], dl[i], 1e-5, 0.0);
        HP_CHECK_CLOSE(fn[i], dn[i], 1e-4, 0.0);
        wl = fmax(wl, fabs(fl[i] - dl[i]) / fabs(dl[i]));
        wn = fmax(wn, fabs(fn[i] - dn[i]) / fabs(dn[i]));
    }
    if (rank == 0)
        printf("qwen3 (tied) shard %d: losses %.6f %.6f %.6f %.6f (replicated DP %.6f %.6f %.6f %.6f); "
               "worst rel loss %.2e norm %.2e\n", ws, fl[0], fl[1], fl[2], fl[3], dl[0], dl[1], dl[2], dl[3], wl, wn);

    /* checkpoint under FSDP: uninterrupted reference, then interrupted after step 3 + resume */
    double ref[STEPS], l[STEPS];
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(f, world, &t));
    if (t) {
        steps(t, ref, STEPS);
        hp_trainer_destroy(t);
    }
    f->checkpoint.enable = true;
    snprintf(f->checkpoint.folder, sizeof f->checkpoint.folder, "%s/ckpt", dir_);
    f->checkpoint.interval = 3;
    f->checkpoint.keep_latest_k = 0;
    t = NULL;
    HP_CHECK_OK(hp_trainer_create(f, world, &t));
    if (t) {
        steps(t, l, 3);
        hp_trainer_destroy(t);   /* "killed" after step 3 */
    }
    char d[700];
    snprintf(d, sizeof d, "%s/step-3", f->checkpoint.folder);
    hp_dcp_metadata_t md = NULL;
    HP_CHECK_OK(hp_dcp_metadata_read(d, &md));
    if (md) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_find(md, "tok_embeddings.weight");
        HP_CHECK(e && e->ndim == 2 && e->n_chunks == ws, "tok_embeddings.weight: %d chunks, expected %d (one per "
                 "shard)", e ? e->n_chunks : -1, ws);
        HP_CHECK(!hp_dcp_metadata_find(md, "output.weight"), "the tied output.weight must not be saved separately");
        hp_dcp_metadata_free(md);
    }
    t = NULL;
    HP_CHECK_OK(hp_trainer_create(f, world, &t));
    if (t) {
        HP_CHECK(hp_trainer_current_step(t) == 3, "resumed at step %lld, expected 3", (long long)hp_trainer_current_step(t));
        steps(t, l + 3, STEPS - 3);
        hp_trainer_destroy(t);
    }
    for (int i = 0; i < STEPS; i++)
        HP_CHECK(l[i] == ref[i], "step %d: loss %.17g (resumed at 3) vs uninterrupted %.17g", i + 1, l[i], ref[i]);

    /* the FSDP checkpoint of step 3 resumes under replicated DP (dp_replicate 2) */
    hp_config_t *r = calloc(1, sizeof *r);
    *r = *f;
    r->parallelism.data_parallel_replicate_degree = ws;
    r->parallelism.data_parallel_shard_degree = 1;
    r->checkpoint.load_step = 3;
    r->checkpoint.interval = 1000;
    t = NULL;
    HP_CHECK_OK(hp_trainer_create(r, world, &t));
    if (t) {
        HP_CHECK(hp_trainer_current_step(t) == 3, "FSDP -> DDP resume at step %lld", (long long)hp_trainer_current_step(t));
        steps(t, l + 3, STEPS - 3);
        hp_trainer_destroy(t);
        double worst = 0;
        for (int i = 3; i < STEPS; i++) {
            double rel = fabs(l[i] - ref[i]) / fabs(ref[i]);
            worst = fmax(worst, rel);
            HP_CHECK(rel <= 1e-4, "FSDP(1-3) -> DDP(4-6) step %d: %.9g vs FSDP %.9g", i + 1, l[i], ref[i]);
        }
        if (rank == 0) printf("qwen3 FSDP(1-3) -> DDP(4-6) vs FSDP(1-6): max relative loss difference %.2g\n", worst);
    }
    free(r);
    free(f);
    free(c);
    int rc = hp_test_finish("test_trainer_fsdp_tied");
    hp_test_remove_corpus(world);
    hp_comm_finalize();
    return rc;
}
