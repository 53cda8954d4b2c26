/* ZeRO-1 in the trainer (issue 26: parallelism.zero_stage = 1, the composition's hp_apply_zero;
 * docs/fsdp.md "ZeRO-1"). On 2 ranks of replicated data parallel: (1) bitwise the DDP run's losses,
 * gradient norms and final weights (each parameter's owner computes the update every rank would,
 * then broadcasts it: the same arithmetic); (2) the single rank of the same global batch within
 * DDP's bounds (losses 1e-5, norms 1e-4 relative: the gradients' all-reduce sums the two ranks'
 * halves in another order than the single rank's batch; fp32 rounding of that order), with the
 * negative test (lr x 1.001 must leave the loss bound); (3) each rank's optimizer state is its
 * share, about half (the plan's term and the measured allocations); (4) a ZeRO-1 checkpoint
 * resumes under ZeRO-1 and under DDP bitwise as the continuous run (each state saved by its
 * owner, loaded wherever the layout puts it). */
// hp-test: ranks 2 timeout 600
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_corpus.h"
#include "hyperparallel/trainer.h"

enum { N = 5, B = 2 };

typedef struct run_out {
    double l[N], n[N];
    double optim;     /* the plan's optimizer bytes */
    double alloc;     /* the peak of the library's allocations */
    float *w;         /* the final weights (every parameter, table order) */
    size_t nw;
} run_out_t;

static void run(const hp_config_t *c, hp_comm_t world, run_out_t *o) {
    size_t before = 0, peak = 0;
    hp_memory_tracked(&before, NULL);
    hp_memory_tracked_reset_peak();
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, world, &t));
    if (!t) return;
    hp_test_steps(t, N, o->l, o->n);
    hp_memory_tracked(NULL, &peak);
    o->optim = (double)hp_trainer_memory_plan(t)->optim;
    o->alloc = (double)(peak - before);
    hp_model_t m = hp_trainer_model(t);
    o->nw = 0;
    for (int i = 0; i < hp_model_num_params(m); i++) o->nw += (size_t)hp_tensor_numel(&hp_model_params(m)[i].value.local);
    o->w = malloc(sizeof(float) * o->nw);
    for (int i = 0, off = 0; i < hp_model_num_params(m); i++) {
        const hp_tensor_t *v = &hp_model_params(m)[i].value.local;
        memcpy(o->w + off, v->data, sizeof(float) * (size_t)hp_tensor_numel(v));
        off += (int)hp_tensor_numel(v);
    }
    hp_trainer_destroy(t);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_config_t *c = NULL;
    hp_comm_t world = hp_test_corpus_init(&argc, &argv, "hp_test_zero_trainer", &rank, &ws, &c);
    if (ws != 2) {
        if (rank == 0) printf("SKIP: needs 2 ranks\n");
        free(c);
        return hp_test_corpus_finish(world, "test_zero_trainer");
    }
    hp_test_write_dp_bins(world, 2, B, c->training.seq_len, N);
    c->training.steps = N;
    c->training.local_batch_size = B;
    c->validation.enable = false;
    c->parallelism.data_parallel_replicate_degree = 2;
    c->parallelism.data_parallel_shard_degree = 1;
    hp_test_use_bin(c, 'x', 2);
    run_out_t ddp = {0}, zero = {0};
    run(c, world, &ddp);
    c->parallelism.zero_stage = 1;
    run(c, world, &zero);
    /* (1) bitwise DDP */
    int same = ddp.nw == zero.nw && memcmp(ddp.w, zero.w, sizeof(float) * ddp.nw) == 0;
    for (int i = 0; i < N; i++) same &= ddp.l[i] == zero.l[i] && ddp.n[i] == zero.n[i];
    HP_CHECK(same, "ZeRO-1 reproduces DDP's losses, norms and final weights bitwise");
    /* (2) the single rank, with the negative test */
    double sl[N], sn[N];
    hp_config_t solo = *c;
    solo.parallelism.zero_stage = 0;   // one rank: nothing to partition
    hp_test_solo_steps(&solo, world, 2, N, sl, sn);
    hp_test_compare_runs("ZeRO-1 (dp_replicate 2) vs single rank", N, zero.l, sl, zero.n, sn, 1e-5, 1e-4);
    hp_config_t neg = *c;
    neg.optimizer.lr *= 1.001;
    run_out_t off = {0};
    run(&neg, world, &off);
    HP_CHECK(hp_test_any_outside(off.l, sl, N, 1e-5), "negative: ZeRO-1 with lr x 1.001 stays within the loss bound");
    /* (3) the optimizer state is this rank's share */
    HP_CHECK(zero.optim < 0.6 * ddp.optim, "the plan's optimizer state under ZeRO-1 %.2f MiB, DDP %.2f MiB", zero.optim / 1048576.0,
             ddp.optim / 1048576.0);
    HP_CHECK(ddp.alloc - zero.alloc > 0.4 * ddp.optim, "measured: ZeRO-1 saves %.2f MiB of DDP's %.2f MiB of state",
             (ddp.alloc - zero.alloc) / 1048576.0, ddp.optim / 1048576.0);
    if (rank == 0)
        printf("optimizer state per rank: DDP %.2f MiB, ZeRO-1 %.2f MiB; allocations peak DDP %.2f MiB, ZeRO-1 %.2f MiB\n",
               ddp.optim / 1048576.0, zero.optim / 1048576.0, ddp.alloc / 1048576.0, zero.alloc / 1048576.0);
    /* (4) checkpoint at step 3, resumed under ZeRO-1 and under DDP */
    hp_config_t k = *c;
    snprintf(k.job.dump_folder, sizeof k.job.dump_folder, "%s", dir_);
    k.checkpoint.enable = true;
    k.checkpoint.interval = 3;
    k.checkpoint.last_save_model_only = false;   // step 3 is the run's last: keep the optimizer state
    snprintf(k.checkpoint.folder, sizeof k.checkpoint.folder, "ckpt_zero");
    k.training.steps = 3;
    double first[N];
    HP_CHECK(hp_test_run_steps(&k, world, 0, 3, first, "ZeRO-1 steps 1-3"), "ZeRO-1 run with a checkpoint");
    for (int z = 1; z >= 0; z--) {
        k.training.steps = N;
        k.checkpoint.interval = 1000;
        k.checkpoint.load_step = 3;   // each resume saves its last step: load step 3 explicitly
        k.parallelism.zero_stage = z;
        double l[N] = {0};
        HP_CHECK(hp_test_run_steps(&k, world, 3, N, l, z ? "ZeRO-1 resumed" : "DDP resumed from ZeRO-1"), "resume");
        int eq = 1;
        for (int i = 3; i < N; i++) eq &= l[i] == zero.l[i];
        HP_CHECK(eq, "%s: steps 4-%d equal the continuous run bitwise", z ? "ZeRO-1 resumed" : "DDP resumed", N);
        if (rank == 0)
            printf("%s at step 3: losses %.9g %.9g (continuous %.9g %.9g)\n", z ? "ZeRO-1 resumed" : "DDP resumed",
                   l[3], l[4], zero.l[3], zero.l[4]);
    }
    free(ddp.w);
    free(zero.w);
    free(off.w);
    free(c);
    return hp_test_corpus_finish(world, "test_zero_trainer");
}
