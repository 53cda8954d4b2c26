/* SFT data through the trainer's layouts (issue 28): hp-train's trainer on chat data (the
 * example's conversations and qwen3 model folder, examples/sft/, with Qwen3's released chat
 * template; labels -100 except on assistant tokens) on 2 ranks equals the single rank of the
 * same global batch: CP 2 and PP 2 with packing (every rank reads the same rows), and FSDP 2
 * without packing (one sample per row, so the single rank with local batch 2 B reads the two
 * data-parallel ranks' rows from a file whose samples are interleaved by rank). An lr 1% off
 * fails the tolerance (negative test). The loss falls over the steps. */
// hp-test: ranks 2 timeout 600
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_corpus.h"

enum { N = 6 };

/* Tolerance (as test_cp_trainer.c; FSDP in float32, training.mixed_precision_param): CP, PP and
 * FSDP change only f32 summation orders (attention
 * merged by log-sum-exp, gradients summed over ranks by the reduce-scatter, the loss of the
 * micro-batches summed in another order), ~1e-6 relative per step; AdamW's normalised update
 * and 6 steps amplify that to ~1e-5 on the loss, so 1e-4 (losses) / 1e-3 (gradient norms)
 * hold with margin, while an lr 1% off moves the loss by ~1e-3 relative after a few steps. The
 * masked labels change nothing here: the valid-token count is global (DESIGN invariant 7). */
#define LOSS_RTOL 1e-4
#define NORM_RTOL 1e-3

static hp_comm_t world;
static int rank_, ws_;
static char x_[300], y_[300];

static void sft_config(hp_config_t *c) {
    hp_test_small_config(c, 1, "qwen3", 2);
    c->parallelism.data_parallel_replicate_degree = 1;
    c->training.seq_len = 64;
    c->training.local_batch_size = 2;
    c->training.steps = N;
    c->validation.enable = false;
    c->data.validation_fraction = 0;
    char p[600];
    hp_test_source_path(p, sizeof p, "examples/sft/chat.jsonl");
    snprintf(c->data.path, sizeof c->data.path, "%.250s", p);
    snprintf(c->data.format, sizeof c->data.format, "chat");
    hp_test_source_path(p, sizeof p, "examples/sft/qwen3");
    snprintf(c->tokenizer.path, sizeof c->tokenizer.path, "%.250s", p);
    c->data.pack = true;
    /* FSDP (also over the cp ranks) computes in float32 here, as the single rank does */
    snprintf(c->training.mixed_precision_param, sizeof c->training.mixed_precision_param, "float32");
    c->lr_scheduler.warmup_steps = 2;
}

static void run(const hp_config_t *c, hp_comm_t comm, double *l, double *n) { hp_test_run_on(c, comm, world, N, l, n, NULL); }

int main(int argc, char **argv) {
    hp_config_t *c = NULL;
    world = hp_test_corpus_init(&argc, &argv, "hp_test_sft_trainer", &rank_, &ws_, &c);
    sft_config(c);
    hp_comm_t solo = hp_test_first_ranks(world, 1);
    double rl[N], rn[N], l[N], n[N];

    /* the single rank, packed rows */
    hp_config_t *r = calloc(1, sizeof *r);
    *r = *c;
    hp_test_single_rank(r);
    run(r, solo, rl, rn);
    HP_CHECK(rl[N - 1] < rl[0] && isfinite(rl[0]), "SFT loss does not fall: %g -> %g", rl[0], rl[N - 1]);

    hp_config_t *v = calloc(1, sizeof *v);
    *v = *r;
    v->parallelism.context_parallel_degree = 2;
    run(v, world, l, n);
    hp_test_compare_runs("sft cp 2 (packed)", N, l, rl, n, rn, LOSS_RTOL, NORM_RTOL);

    *v = *r;
    v->parallelism.pipeline_parallel_degree = 2;
    run(v, world, l, n);
    hp_test_compare_runs("sft pp 2 (packed)", N, l, rl, n, rn, LOSS_RTOL, NORM_RTOL);

    /* negative: the same layout with lr 1% off leaves the tolerance */
    v->optimizer.lr *= 1.01;
    run(v, world, l, n);
    HP_CHECK(hp_test_any_outside(l, rl, N, LOSS_RTOL), "an lr 1%% off stays within the tolerance");

    /* FSDP 2, one sample per row: the single rank of the global batch reads y.jsonl */
    const int B = (int)c->training.local_batch_size;
    hp_test_sft_files(world, B, N * B, x_, y_, sizeof x_);
    *v = *r;
    v->data.pack = false;
    snprintf(v->data.path, sizeof v->data.path, "%s", y_);
    v->training.local_batch_size = 2 * B;
    run(v, solo, rl, rn);
    *v = *r;
    v->data.pack = false;
    snprintf(v->data.path, sizeof v->data.path, "%s", x_);
    v->parallelism.data_parallel_shard_degree = 2;
    run(v, world, l, n);
    hp_test_compare_runs("sft fsdp 2 (one sample per row)", N, l, rl, n, rn, LOSS_RTOL, NORM_RTOL);

    free(v);
    free(r);
    free(c);
    if (solo) hp_comm_destroy(solo);
    return hp_test_corpus_finish(world, "test_sft_trainer");
}
