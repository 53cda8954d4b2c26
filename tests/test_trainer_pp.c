/* The trainer under pipeline parallel (parallelism.pipeline_parallel_degree > 1): 10 steps of
 * llama3 (and qwen3 with tied embeddings, whose two copies' gradients are summed over pp) give
 * the losses and gradient norms of the run without PP over the same global batch (1e-5 relative
 * loss, 1e-4 norm: fp32 summation order of the micro-batch gradients and of the norm's cross-rank
 * sum, as the data-parallel trainer tests); 2 ranks: GPipe, 1F1B, Interleaved1F1B, LoopedBFS,
 * InterleavedZeroBubble, ZBVZeroBubble, DualPipeV (its run with the overlap off and coalesced p2p
 * bitwise equal), MPipeTranspose (T = 0 and 1, HyperParallel's), a hand-written CSV, module_fqns_per_model_part, activation checkpointing,
 * gradient accumulation; 4 ranks: pp 4 (all seven schedules; 2, 4 and 8 micro-batches), pp 2 x TP
 * 2 (Interleaved1F1B, the three new ones, a zero-bubble CSV) against the single rank, pp 2 x FSDP
 * 2 (1F1B, the zero-bubble CSV, the three new ones), pp 2 x CP 2 (InterleavedZeroBubble,
 * DualPipeV; CP tolerance 1e-4 / 1e-3), pp 2 x DDP 2 (1F1B, ZBV, MPipeTranspose) against replicated
 * DP 2; 8 ranks: pp 2 x FSDP 2 x TP 2 (llama3, qwen3) against replicated DP 2 (TP's tolerance,
 * 1e-4 / 1e-3), pp 4 x FSDP 2 and pp 4 x TP 2 with the three new schedules, pp 2 x HSDP 2 x 2
 * against replicated DP 4. A run whose optimizer is 1e-3 off must fall outside the tolerance. A
 * checkpoint saved under pp 2 loads under pp 1 (2 ranks) and pp 4 (4 ranks) with the same
 * validation loss; bad schedules, CSVs and splits are refused naming the key; the final weights
 * file gathers every stage.
 */
// hp-test: ranks 2 4 8 timeout 900
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_corpus.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"
#include "hyperparallel/trainer.h"

enum { N = 10 };

static void base(hp_config_t *c, int dp, const char *model) {
    hp_test_small_config(c, dp, model, 6);
    c->training.local_batch_size = 4;
    c->training.steps = N;
    c->training.max_norm = 1.0;
    c->validation.steps = 1;
    c->validation.local_batch_size = -1;
    snprintf(c->training.mixed_precision_param, sizeof c->training.mixed_precision_param, "float32");
}

/* Runs c on `comm` when this rank is in it (comm NULL: not); the losses and norms reach
 * every rank of world from world rank 0. */
static void run(const hp_config_t *c, hp_comm_t comm, hp_comm_t world, double *l, double *n, double *val) {
    for (int i = 0; i < N; i++) l[i] = n[i] = 0;
    double v = 0;
    if (comm) {
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(c, comm, &t));
        for (int i = 0; t && hp_trainer_current_step(t) < c->training.steps; i++) {
            hp_step_stats_t st;
            HP_CHECK_OK(hp_trainer_step(t, &st));
            l[i] = st.loss;
            n[i] = st.grad_norm;
        }
        if (t && val) HP_CHECK_OK(hp_trainer_validate(t, &v));
        hp_trainer_destroy(t);
    }
    double buf[2 * N + 1];
    for (int i = 0; i < N; i++) buf[i] = l[i], buf[N + i] = n[i];
    buf[2 * N] = v;
    HP_CHECK_OK(hp_broadcast(buf, sizeof buf, HP_U8, 0, world, NULL));   // doubles as bytes
    for (int i = 0; i < N; i++) l[i] = buf[i], n[i] = buf[N + i];
    if (val) *val = buf[2 * N];
}

static int close_all(const double *a, const double *b, int steps, double rtol, int report, const char *what) {
    int ok = 1;
    for (int i = 0; i < steps; i++) {
        int c = fabs(a[i] - b[i]) <= rtol * fabs(b[i]);
        if (report) HP_CHECK(c, "%s step %d: %.9g vs %.9g", what, i + 1, a[i], b[i]);
        ok &= c;
    }
    return ok;
}

static void set_pp(hp_config_t *f, int pp, const char *sched) {
    f->parallelism.pipeline_parallel_degree = pp;
    snprintf(f->parallelism.pipeline_parallel_schedule, sizeof f->parallelism.pipeline_parallel_schedule, "%s", sched);
}

/* c under pp 2 for 5 steps, saving the last one with the optimizer state (for the reshard loads). */
static void ckpt_pp2(hp_config_t *f, const hp_config_t *c) {
    *f = *c;
    set_pp(f, 2, "1F1B");
    f->training.steps = 5;
    f->checkpoint.enable = true;
    f->checkpoint.interval = 5;
    f->checkpoint.keep_latest_k = 0;
    f->checkpoint.last_save_model_only = false;
    snprintf(f->checkpoint.folder, sizeof f->checkpoint.folder, "%s/ckpt_pp2", dir_);
}

/* A zero-bubble (ZB-H1) compute-only CSV for pp 2 x 4 micro-batches: rank 0 runs the input
 * passes of two micro-batches and a forward before the first weight pass, so a weight pass
 * runs long after its input pass (contexts live from F to W, FSDP's reduction after the last W,
 * TP's gathered gradients per context). Written by world rank 0. */
static void zb_csv(hp_comm_t world, int rank, char *path, size_t n) {
    snprintf(path, n, "%s/zb.csv", dir_);
    if (rank == 0) {
        FILE *fp = fopen(path, "w");
        fprintf(fp, "0F0,0F1,0F2,0I0,0F3,0I1,0W0,0I2,0W1,0I3,0W2,0W3\n"
                    "1F0,1I0,1F1,1I1,1W0,1F2,1I2,1W1,1F3,1I3,1W2,1W3\n");
        fclose(fp);
    }
    hp_barrier(world, NULL);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    hp_test_make_corpus(world, "hp_test_trainer_pp");
    hp_comm_t one = NULL, two = NULL;
    HP_CHECK_OK(hp_comm_split(world, rank == 0 ? 0 : -1, rank, &one));
    HP_CHECK_OK(hp_comm_split(world, rank < 2 ? 0 : -1, rank, &two));
    hp_config_t *c = calloc(1, sizeof *c), *f = calloc(1, sizeof *f);
    double rl[N], rn[N], l[N], n[N];
    const char *models[2] = {"llama3", "qwen3"};
    if (ws == 2) {
        for (int mi = 0; mi < 2; mi++) {
            base(c, 1, models[mi]);
            run(c, one, world, rl, rn, NULL);   // the single-rank reference
            const char *sched[4] = {"1F1B", "GPipe", "Interleaved1F1B", "LoopedBFS"};
            for (int k = 0; k < (mi == 0 ? 4 : 2); k++) {
                *f = *c;
                set_pp(f, 2, sched[k]);
                f->parallelism.data_parallel_replicate_degree = 1;
                run(f, world, world, l, n, NULL);
                close_all(l, rl, N, 1e-5, 1, sched[k]);
                close_all(n, rn, N, 1e-4, 1, "grad norm");
                if (rank == 0) printf("%s pp 2 %s: losses %.6f .. %.6f (single rank %.6f .. %.6f)\n", models[mi],
                                      sched[k], l[0], l[N - 1], rl[0], rl[N - 1]);
            }
        }
        base(c, 1, "llama3");
        run(c, one, world, rl, rn, NULL);
        // the zero-bubble and V schedules (ZBV, DualPipeV on the V mapping: 2 stages per rank)
        {
            const char *zs[3] = {"InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"};
            double dl[N], dn[N], v0 = 0, v1 = 0;
            run(c, one, world, l, n, &v0);   // the single rank's validation loss after 10 steps
            for (int k = 0; k < 3; k++) {
                *f = *c;
                set_pp(f, 2, zs[k]);
                run(f, world, world, l, n, &v1);   // validation through hp_pp_eval on the mapping
                HP_CHECK(fabs(v1 - v0) <= 1e-5 * fabs(v0), "%s validation %.9g vs %.9g", zs[k], v1, v0);
                close_all(l, rl, N, 1e-5, 1, zs[k]);
                close_all(n, rn, N, 1e-4, 1, "grad norm");
                if (rank == 0) printf("llama3 pp 2 %s: losses %.6f .. %.6f (single rank %.6f .. %.6f)\n", zs[k], l[0],
                                      l[N - 1], rl[0], rl[N - 1]);
                if (k == 2) memcpy(dl, l, sizeof dl), memcpy(dn, n, sizeof dn);
            }
            // OVERLAP_F_B run as F then B (HP_PP_OVERLAP=off): bitwise the same losses and norms
            setenv("HP_PP_OVERLAP", "off", 1);
            setenv("HP_PP_P2P", "coalesced", 1);
            *f = *c;
            set_pp(f, 2, "DualPipeV");
            run(f, world, world, l, n, NULL);
            unsetenv("HP_PP_OVERLAP");
            unsetenv("HP_PP_P2P");
            HP_CHECK(memcmp(l, dl, sizeof dl) == 0 && memcmp(n, dn, sizeof dn) == 0, "DualPipeV without the overlap "
                     "(and coalesced p2p) differs bitwise: loss %.9g vs %.9g", l[N - 1], dl[N - 1]);
        }
        // HyperParallel's MPipeTranspose: T = 0 (the embedding) and T = 1 (stage 0 = the embedding and
        // layer 0, exactly the preprocess); validation through hp_pp_eval; refusals by key
        {
            double v0 = 0, v1 = 0;
            run(c, one, world, l, n, &v0);
            for (int T = 0; T <= 1; T++) {
                *f = *c;
                set_pp(f, 2, "MPipeTranspose");
                f->parallelism.pipeline_parallel_mpipe_transpose_layers = T;
                run(f, world, world, l, n, &v1);
                HP_CHECK(fabs(v1 - v0) <= 1e-5 * fabs(v0), "MPipe T %d validation %.9g vs %.9g", T, v1, v0);
                close_all(l, rl, N, 1e-5, 1, T ? "MPipeTranspose T 1" : "MPipeTranspose T 0");
                close_all(n, rn, N, 1e-4, 1, "grad norm");
                if (rank == 0) printf("llama3 pp 2 MPipeTranspose T %d: losses %.6f .. %.6f (single rank %.6f .. %.6f)\n",
                                      T, l[0], l[N - 1], rl[0], rl[N - 1]);
            }
            hp_trainer_t t = NULL;
            *f = *c;
            set_pp(f, 2, "mpipetranspose");
            f->parallelism.pipeline_parallel_mpipe_transpose_layers = 2;   // stage 0 holds one layer
            HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_INVALID_ARG, "pipeline_parallel_mpipe_transpose_layers = 2");
            // qwen3's tied embeddings: stage 0's copy (and the replicas refreshed from it) and the
            // last stage's, their gradients summed, equal the single rank
            hp_config_t *q = calloc(1, sizeof *q);
            double ql[N], qn[N];
            base(q, 1, "qwen3");
            run(q, one, world, ql, qn, NULL);
            *f = *q;
            set_pp(f, 2, "MPipeTranspose");
            f->parallelism.pipeline_parallel_mpipe_transpose_layers = 1;
            run(f, world, world, l, n, NULL);
            close_all(l, ql, N, 1e-5, 1, "qwen3 MPipeTranspose T 1");
            close_all(n, qn, N, 1e-4, 1, "grad norm");
            if (rank == 0) printf("qwen3 pp 2 MPipeTranspose T 1: losses %.6f .. %.6f (single rank %.6f .. %.6f)\n",
                                  l[0], l[N - 1], ql[0], ql[N - 1]);
            free(q);
        }
        // a hand-written compute-only CSV (GPipe's order) and a user split
        {
            char csv[320];
            snprintf(csv, sizeof csv, "%s/gpipe.csv", dir_);
            if (rank == 0) {
                FILE *fp = fopen(csv, "w");
                fprintf(fp, "0F0,0F1,0F2,0F3,,,0B0,0B1,0B2,0B3\n,1F0,1F1,1F2,1F3,1B0,1B1,1B2,1B3\n");
                fclose(fp);
            }
            hp_barrier(world, NULL);
            *f = *c;
            set_pp(f, 2, "1F1B");
            snprintf(f->parallelism.pipeline_parallel_schedule_csv, sizeof f->parallelism.pipeline_parallel_schedule_csv,
                     "%s", csv);
            snprintf(f->parallelism.module_fqns_per_model_part, sizeof f->parallelism.module_fqns_per_model_part,
                     "tok_embeddings,layers.0,layers.1;layers.2,layers.3,layers.4,layers.5,norm,output");
            run(f, world, world, l, n, NULL);
            close_all(l, rl, N, 1e-5, 1, "csv + fqns");
            // activation checkpointing inside the stages
            *f = *c;
            set_pp(f, 2, "1F1B");
            snprintf(f->activation_checkpoint.mode, sizeof f->activation_checkpoint.mode, "full");
            run(f, world, world, l, n, NULL);
            close_all(l, rl, N, 1e-5, 1, "pp + full AC");
        }
        // gradient accumulation: global batch 8 = 2 steps of the local 4, the schedule run twice
        {
            hp_config_t *r = calloc(1, sizeof *r);
            *r = *c;
            r->training.global_batch_size = 8;
            double al[N], an[N];
            run(r, one, world, al, an, NULL);
            *f = *r;
            set_pp(f, 2, "1F1B");
            run(f, world, world, l, n, NULL);
            close_all(l, al, N, 1e-5, 1, "pp 2 with gradient accumulation 2");
            close_all(n, an, N, 1e-4, 1, "grad norm");
            free(r);
        }
        // negative (docs/testing.md): lr x 1.001 must leave the tolerance on some step
        *f = *c;
        set_pp(f, 2, "1F1B");
        f->optimizer.lr *= 1.001;
        run(f, world, world, l, n, NULL);
        HP_CHECK(!close_all(l, rl, N, 1e-5, 0, ""), "a run with lr x 1.001 matched within 1e-5");
        // checkpoint: save under pp 2 at step 5, load under pp 1 on one rank: same validation loss
        {
            ckpt_pp2(f, c);
            double v2 = 0, v1 = 0;
            run(f, world, world, l, n, &v2);
            hp_config_t *g = calloc(1, sizeof *g);
            *g = *f;
            g->parallelism.pipeline_parallel_degree = 1;
            // resumes at step 5 = training.steps: load only
            g->checkpoint.exclude_from_loading.n = 1;
            snprintf(g->checkpoint.exclude_from_loading.items[0], HP_CONFIG_STR_MAX, "dataloader");
            run(g, one, world, l, n, &v1);
            HP_CHECK(fabs(v1 - v2) <= 1e-5 * fabs(v2), "validation after loading the pp-2 checkpoint under pp 1: %.9g vs "
                     "%.9g", v1, v2);
            if (rank == 0) printf("checkpoint pp 2 -> pp 1: validation %.6f vs %.6f\n", v1, v2);
            free(g);
        }
        // bad input: named by key
        {
            hp_trainer_t t = NULL;
            *f = *c;
            set_pp(f, 2, "1F1B");
            f->training.local_batch_size = 3;
            f->parallelism.pipeline_parallel_microbatch_size = 2;
            HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_INVALID_ARG, "pipeline_parallel_microbatch_size 2");
            *f = *c;
            set_pp(f, 2, "1F1B");
            snprintf(f->parallelism.module_fqns_per_model_part, sizeof f->parallelism.module_fqns_per_model_part,
                     "tok_embeddings,layers.0;layers.2,layers.3,layers.4,layers.5,norm,output");
            HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_INVALID_ARG, "module_fqns_per_model_part");
            *f = *c;
            set_pp(f, 2, "1F1B");
            f->parallelism.pipeline_parallel_first_stage_less_layers = 10;
            HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_INVALID_ARG, "first_stage_less_layers 10");
            *f = *c;
            set_pp(f, 2, "zbvzerobubble");
            f->parallelism.pipeline_parallel_layers_per_stage = 1;   // 8 stages: 4 per rank
            HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_INVALID_ARG, "needs exactly 2 stages per pp rank");
            *f = *c;
            set_pp(f, 2, "DualPipeV");
            snprintf(f->model.name, sizeof f->model.name, "qwen3");
            HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_UNSUPPORTED, "tied embeddings");
            *f = *c;
            set_pp(f, 2, "ZBV");
            HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_INVALID_ARG, "pipeline_parallel_schedule");
            *f = *c;
            set_pp(f, 2, "1F1B");
            char csv[320];
            snprintf(csv, sizeof csv, "%s/bad.csv", dir_);
            if (rank == 0) {
                FILE *fp = fopen(csv, "w");
                fprintf(fp, "0F0,0F1,0F2,0F3,0B0,0B1,0B2\n1F0,1F1,1F2,1F3,1B0,1B1,1B2,1B3\n");
                fclose(fp);
            }
            hp_barrier(world, NULL);
            snprintf(f->parallelism.pipeline_parallel_schedule_csv, sizeof f->parallelism.pipeline_parallel_schedule_csv,
                     "%s", csv);
            HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_INVALID_ARG, "pipeline_parallel_schedule_csv");
        }
    } else if (ws == 4) {
        base(c, 1, "llama3");
        run(c, one, world, rl, rn, NULL);
        const char *sched[4] = {"1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS"};
        for (int k = 0; k < 4; k++) {
            *f = *c;
            set_pp(f, 4, sched[k]);
            run(f, world, world, l, n, NULL);
            close_all(l, rl, N, 1e-5, 1, sched[k]);
            close_all(n, rn, N, 1e-4, 1, "grad norm");
        }
        // 8 micro-batches of 1 and 2 micro-batches of 2 (same global batch 8 per step)
        {
            hp_config_t *r = calloc(1, sizeof *r);
            *r = *c;
            r->training.local_batch_size = 8;
            double bl[N], bn[N];
            run(r, one, world, bl, bn, NULL);
            const int mbs[5] = {1, 4, 1, 1, 1};
            const char *ss[5] = {"Interleaved1F1B", "GPipe", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"};
            for (int k = 0; k < 5; k++) {   // the zero-bubble / V ones: 8 micro-batches >= 8 stages
                *f = *r;
                set_pp(f, 4, ss[k]);
                f->parallelism.pipeline_parallel_microbatch_size = mbs[k];
                run(f, world, world, l, n, NULL);
                const char *what = k >= 2 ? ss[k] : k ? "pp 4 GPipe, 2 micro-batches of 4" : "pp 4 interleaved, 8 mbs";
                close_all(l, bl, N, 1e-5, 1, what);
                close_all(n, bn, N, 1e-4, 1, "grad norm");
            }
            free(r);
        }
        // pp 2 x TP 2 (sequence + loss parallel inside each stage) against the single rank (TP's
        // tolerance, test_tp_trainer: 1e-4 loss, 1e-3 norm: TP reorders the GEMMs' sums)
        *f = *c;
        set_pp(f, 2, "Interleaved1F1B");
        f->parallelism.tensor_parallel_degree = 2;
        run(f, world, world, l, n, NULL);
        close_all(l, rl, N, 1e-4, 1, "pp2 x TP2");
        close_all(n, rn, N, 1e-3, 1, "grad norm");
        if (rank == 0) printf("pp 2 x TP 2: losses %.6f .. %.6f (single rank %.6f .. %.6f)\n", l[0], l[N - 1], rl[0],
                              rl[N - 1]);
        {   // the zero-bubble / V schedules x TP 2
            const char *zs[3] = {"InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"};
            for (int k = 0; k < 3; k++) {
                *f = *c;
                set_pp(f, 2, zs[k]);
                f->parallelism.tensor_parallel_degree = 2;
                run(f, world, world, l, n, NULL);
                close_all(l, rl, N, 1e-4, 1, zs[k]);
                close_all(n, rn, N, 1e-3, 1, "grad norm");
                if (rank == 0) printf("pp 2 %s x TP 2: losses %.6f .. %.6f\n", zs[k], l[0], l[N - 1]);
            }
        }
        {   // pp 2 x CP 2 with split-backward and V schedules: the CP cores' collectives in I
            // (CP's tolerance, test_cp_trainer: 1e-4 loss, 1e-3 norm, attention sums reordered)
            const char *zs[2] = {"InterleavedZeroBubble", "DualPipeV"};
            for (int k = 0; k < 2; k++) {
                *f = *c;
                set_pp(f, 2, zs[k]);
                f->parallelism.context_parallel_degree = 2;
                run(f, world, world, l, n, NULL);
                close_all(l, rl, N, 1e-4, 1, zs[k]);
                close_all(n, rn, N, 1e-3, 1, "grad norm");
                if (rank == 0) printf("pp 2 %s x CP 2: losses %.6f .. %.6f\n", zs[k], l[0], l[N - 1]);
            }
        }
        // the same with a zero-bubble CSV (I and W apart): TP's collectives in I, W deferred
        {
            char zb[320];
            zb_csv(world, rank, zb, sizeof zb);
            *f = *c;
            set_pp(f, 2, "1F1B");
            f->parallelism.tensor_parallel_degree = 2;
            snprintf(f->parallelism.pipeline_parallel_schedule_csv, sizeof f->parallelism.pipeline_parallel_schedule_csv,
                     "%s", zb);
            run(f, world, world, l, n, NULL);
            close_all(l, rl, N, 1e-4, 1, "pp2 zero-bubble CSV x TP2");
            close_all(n, rn, N, 1e-3, 1, "grad norm");
        }
        // pp 2 x FSDP 2 and pp 2 x DDP 2 against replicated DP 2 on ranks 0, 1
        base(c, 2, "llama3");
        run(c, two, world, rl, rn, NULL);
        const char *fs[8] = {"1F1B", "1F1B", "1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV",
                             "ZBVZeroBubble", "MPipeTranspose"};
        const char *fname[8] = {"FSDP", "DDP", "FSDP (zero-bubble CSV)", "FSDP (InterleavedZeroBubble)",
                                "FSDP (ZBVZeroBubble)", "FSDP (DualPipeV)", "DDP (ZBVZeroBubble)",
                                "DDP (MPipeTranspose T 1)"};
        for (int k = 0; k < 8; k++) {   // 3..5: the zero-bubble / V schedules x FSDP 2; 6: ZBV x DDP 2; 7: MPipe
            *f = *c;
            set_pp(f, 2, fs[k]);
            if (k == 7) f->parallelism.pipeline_parallel_mpipe_transpose_layers = 1;
            const int ddp = k == 1 || k == 6 || k == 7;
            f->parallelism.data_parallel_replicate_degree = ddp ? 2 : 1;
            f->parallelism.data_parallel_shard_degree = ddp ? 1 : 2;
            if (k == 2) {   // FSDP with a zero-bubble CSV: the reduce-scatter follows the stage's last W
                char zb[320];
                zb_csv(world, rank, zb, sizeof zb);
                snprintf(f->parallelism.pipeline_parallel_schedule_csv,
                         sizeof f->parallelism.pipeline_parallel_schedule_csv, "%s", zb);
            }
            run(f, world, world, l, n, NULL);
            close_all(l, rl, N, 1e-5, 1, fname[k]);
            close_all(n, rn, N, 1e-4, 1, "grad norm");
            if (rank == 0) printf("pp 2 x %s 2: losses %.6f .. %.6f (DP 2 %.6f .. %.6f)\n", fname[k], l[0],
                                  l[N - 1], rl[0], rl[N - 1]);
        }
        {   // the overlap's thread mode is refused with FSDP (collectives inside the stages); a bad env value named
            hp_trainer_t t = NULL;
            *f = *c;
            set_pp(f, 2, "DualPipeV");
            f->parallelism.data_parallel_replicate_degree = 1;
            f->parallelism.data_parallel_shard_degree = 2;
            setenv("HP_PP_OVERLAP", "thread", 1);
            HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_UNSUPPORTED, "HP_PP_OVERLAP = thread");
            unsetenv("HP_PP_OVERLAP");
            set_pp(f, 2, "MPipeTranspose");   // the replica takes plain parameters: not under FSDP
            HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_UNSUPPORTED, "MPipeTranspose with data_parallel_shard_degree 2");
            set_pp(f, 2, "DualPipeV");
            setenv("HP_PP_OVERLAP", "sideways", 1);
            HP_CHECK_ERR(hp_trainer_create(f, world, &t), HP_ERR_INVALID_ARG, "HP_PP_OVERLAP = 'sideways'");
            unsetenv("HP_PP_OVERLAP");
        }
        // checkpoint saved under pp 2 (ranks 0, 1) loads under pp 4 with the same validation loss
        {
            base(c, 1, "llama3");
            ckpt_pp2(f, c);
            double v2 = 0, v4 = 0;
            run(f, two, world, l, n, &v2);
            hp_config_t *g = calloc(1, sizeof *g);
            *g = *f;
            set_pp(g, 4, "Interleaved1F1B");
            g->training.steps = 7;   // and goes on for two steps
            g->checkpoint.exclude_from_loading.n = 1;
            snprintf(g->checkpoint.exclude_from_loading.items[0], HP_CONFIG_STR_MAX, "dataloader");
            snprintf(g->checkpoint.folder, sizeof g->checkpoint.folder, "%s/ckpt_pp2", dir_);
            g->checkpoint.interval = 1000;
            hp_trainer_t t = NULL;
            HP_CHECK_OK(hp_trainer_create(g, world, &t));
            if (t) {
                HP_CHECK(hp_trainer_current_step(t) == 5, "resumed at step %lld", (long long)hp_trainer_current_step(t));
                HP_CHECK_OK(hp_trainer_validate(t, &v4));
                HP_CHECK(fabs(v4 - v2) <= 1e-5 * fabs(v2), "validation after loading under pp 4: %.9g vs %.9g", v4, v2);
                hp_step_stats_t st;
                HP_CHECK_OK(hp_trainer_step(t, &st));
                HP_CHECK(isfinite(st.loss), "step after the reshard: loss %g", st.loss);
                hp_trainer_destroy(t);
            }
            free(g);
        }
    } else if (ws == 8) {
        // pp 2 x FSDP 2 x TP 2 against replicated DP 2 (qwen3: the tied weight too); every pair
        // of ranks runs the reference, so that no rank waits idle (polling) through it
        hp_comm_t pair = NULL;
        HP_CHECK_OK(hp_comm_split(world, rank / 2, rank, &pair));
        for (int mi = 0; mi < 2; mi++) {
            base(c, 2, models[mi]);
            run(c, pair, world, rl, rn, NULL);
            *f = *c;
            set_pp(f, 2, "1F1B");
            f->parallelism.data_parallel_replicate_degree = 1;
            f->parallelism.data_parallel_shard_degree = 2;
            f->parallelism.tensor_parallel_degree = 2;
            run(f, world, world, l, n, NULL);
            close_all(l, rl, N, 1e-4, 1, "pp2 x FSDP2 x TP2");
            close_all(n, rn, N, 1e-3, 1, "grad norm");
            if (rank == 0) printf("%s pp 2 x FSDP 2 x TP 2: losses %.6f .. %.6f (DP 2 %.6f .. %.6f)\n", models[mi], l[0],
                                  l[N - 1], rl[0], rl[N - 1]);
        }
        // pp 4 x FSDP 2 and pp 4 x TP 2 with the zero-bubble / V schedules (8 micro-batches >= 8 stages)
        {
            const char *zs[3] = {"InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"};
            base(c, 2, "llama3");
            c->training.local_batch_size = 8;
            run(c, pair, world, rl, rn, NULL);
            for (int k = 0; k < 3; k++) {
                *f = *c;
                set_pp(f, 4, zs[k]);
                f->parallelism.data_parallel_replicate_degree = 1;
                f->parallelism.data_parallel_shard_degree = 2;
                run(f, world, world, l, n, NULL);
                close_all(l, rl, N, 1e-5, 1, zs[k]);
                close_all(n, rn, N, 1e-4, 1, "grad norm");
                if (rank == 0) printf("pp 4 %s x FSDP 2: losses %.6f .. %.6f (DP 2 %.6f .. %.6f)\n", zs[k], l[0],
                                      l[N - 1], rl[0], rl[N - 1]);
            }
            hp_comm_t self = NULL;
            HP_CHECK_OK(hp_comm_split(world, rank, 0, &self));
            base(c, 1, "llama3");
            c->training.local_batch_size = 8;
            run(c, self, world, rl, rn, NULL);
            hp_comm_destroy(self);
            for (int k = 0; k < 3; k++) {
                *f = *c;
                set_pp(f, 4, zs[k]);
                f->parallelism.tensor_parallel_degree = 2;
                run(f, world, world, l, n, NULL);
                close_all(l, rl, N, 1e-4, 1, zs[k]);
                close_all(n, rn, N, 1e-3, 1, "grad norm");
                if (rank == 0) printf("pp 4 %s x TP 2: losses %.6f .. %.6f (single rank %.6f .. %.6f)\n", zs[k], l[0],
                                      l[N - 1], rl[0], rl[N - 1]);
            }
        }
        hp_comm_destroy(pair);
        // pp 2 x HSDP (dp_replicate 2 x dp_shard 2) against replicated DP 4 (every quad runs it)
        hp_comm_t quad = NULL;
        HP_CHECK_OK(hp_comm_split(world, rank / 4, rank, &quad));
        base(c, 4, "llama3");
        run(c, quad, world, rl, rn, NULL);
        *f = *c;
        set_pp(f, 2, "Interleaved1F1B");
        f->parallelism.data_parallel_replicate_degree = 2;
        f->parallelism.data_parallel_shard_degree = 2;
        run(f, world, world, l, n, NULL);
        close_all(l, rl, N, 1e-5, 1, "pp2 x HSDP 2x2");
        close_all(n, rn, N, 1e-4, 1, "grad norm");
        if (rank == 0) printf("pp 2 x HSDP 2x2: losses %.6f .. %.6f (DP 4 %.6f .. %.6f)\n", l[0], l[N - 1], rl[0], rl[N - 1]);
        hp_comm_destroy(quad);
    }
    free(c);
    free(f);
    hp_comm_destroy(one);
    hp_comm_destroy(two);
    hp_test_remove_corpus(world);
    int rc = hp_test_finish("test_trainer_pp");
    hp_comm_finalize();
    return rc;
}
