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
    hp_config_t *c = calloc(1, sizeof *c), *d = calloc(1, sizeof *d);
    base(c, 2);
    c->training.local_batch_size = 1;
    c->validation.enable = false;
    c->training.max_norm = 1.0;
    double rl[N], rn[N], l[N], n[N];
    hp_comm_t pair = hp_test_first_ranks(world, 2);
    hp_test_run_on(c, pair, world, N, rl, rn, NULL);
    hp_comm_destroy(pair);
    for (int sp = 0; sp < 2; sp++) {
        *d = *c;
        d->parallelism.data_parallel_replicate_degree = 1;
        d->parallelism.data_parallel_shard_degree = 2;
        d->parallelism.tensor_parallel_degree = 2;
        d->parallelism.enable_sequence_parallel = sp;
        d->parallelism.enable_loss_parallel = sp;
        hp_test_train_steps(d, world, N, l, n, 0);
        char what[64];
        snprintf(what, sizeof what, "qwen3 (tied) tp2 x fsdp2 sp%d vs dp2", sp);
        hp_test_compare_runs(what, N, l, rl, n, rn, 1e-4, 1e-3);
    }
    free(d);
    free(c);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_config_t *c = NULL;
    hp_comm_t world = hp_test_corpus_init(&argc, &argv, "hp_test_trainer_fsdp_tied", &rank, &ws, &c);
    if (ws == 4) {
        tp_cases(world);
        free(c);
        return hp_test_corpus_finish(world, "test_trainer_fsdp_tied");
    }
    hp_config_t *f = calloc(1, sizeof *f);
    base(c, ws);

    /* parity: FSDP 2 vs replicated DP */
    double dl[N], dn[N], fl[N], fn[N];
    hp_test_train_steps(c, world, N, dl, dn, 1);
    *f = *c;
    f->parallelism.data_parallel_replicate_degree = 1;
    f->parallelism.data_parallel_shard_degree = ws;
    hp_test_train_steps(f, world, N, fl, fn, 1);
    hp_test_compare_runs("qwen3 (tied) FSDP vs replicated DP", N, fl, dl, fn, dn, 1e-5, 1e-4);

    /* checkpoint under FSDP: uninterrupted reference, then interrupted after step 3 + resume */
    double ref[STEPS], l[STEPS];
    hp_test_run_steps(f, world, 0, STEPS, ref, "FSDP");
    f->checkpoint.enable = true;
    snprintf(f->checkpoint.folder, sizeof f->checkpoint.folder, "%s/ckpt", dir_);
    f->checkpoint.interval = 3;
    f->checkpoint.keep_latest_k = 0;
    hp_test_run_steps(f, world, 0, 3, l, "FSDP");   /* "killed" after step 3 */
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
    hp_test_run_steps(f, world, 3, STEPS, l, "FSDP resume");
    for (int i = 0; i < STEPS; i++)
        HP_CHECK(l[i] == ref[i], "step %d: loss %.17g (resumed at 3) vs uninterrupted %.17g", i + 1, l[i], ref[i]);

    /* the FSDP checkpoint of step 3 resumes under replicated DP (dp_replicate 2) */
    hp_config_t *r = calloc(1, sizeof *r);
    *r = *f;
    r->parallelism.data_parallel_replicate_degree = ws;
    r->parallelism.data_parallel_shard_degree = 1;
    r->checkpoint.load_step = 3;
    r->checkpoint.interval = 1000;
    if (hp_test_run_steps(r, world, 3, STEPS, l, "FSDP -> DDP"))
        hp_test_compare_runs("qwen3 FSDP(1-3) -> DDP(4-6) vs FSDP(1-6)", STEPS - 3, l + 3, ref + 3, NULL, NULL, 1e-4,
                             0);
    free(r);
    free(f);
    free(c);
    return hp_test_corpus_finish(world, "test_trainer_fsdp_tied");
}
