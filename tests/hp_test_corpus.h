/* Trainer-level tests share one small English corpus (400 '%'-separated documents) and a
 * 320-token byte-level BPE tokenizer trained on it, written into a fresh directory that rank 0
 * creates with mkdtemp and every rank learns by broadcast, so concurrent test runs never share
 * files. Include after hp_test.h; defines dir_, corpus_ and tok_. */
#ifndef HP_TEST_CORPUS_H
#define HP_TEST_CORPUS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/comm.h"
#include "hyperparallel/config.h"
#include "hyperparallel/trainer.h"
#include "hyperparallel/tokenizer.h"
#include "hp_test_mpi.h"
#include "hp_test_tokenizer.h"

static char dir_[256] __attribute__((unused)), corpus_[300] __attribute__((unused)), tok_[300] __attribute__((unused));

static const char *const hp_test_sentences_[] = {
    "the quick brown fox jumps over the lazy dog",
    "a journey of a thousand miles begins with a single step",
    "all that glitters is not gold",
    "the early bird catches the worm",
    "where there is a will there is a way",
    "actions speak louder than words",
};

/* prefix: the directory name under /tmp ("hp_test_trainer"). Collective over world. */
static inline void hp_test_make_corpus(hp_comm_t world, const char *prefix) {
    memset(dir_, 0, sizeof dir_);
    if (hp_comm_rank(world) == 0) {
        snprintf(dir_, sizeof dir_, "/tmp/%s_XXXXXX", prefix);
        HP_CHECK(mkdtemp(dir_) != NULL, "mkdtemp %s", dir_);
    }
    hp_broadcast(dir_, sizeof dir_, HP_U8, 0, world, NULL);
    snprintf(corpus_, sizeof corpus_, "%s/corpus.txt", dir_);
    snprintf(tok_, sizeof tok_, "%s/tokenizer.json", dir_);
    if (hp_comm_rank(world) == 0) {
        FILE *f = fopen(corpus_, "w");
        HP_CHECK(f != NULL, "cannot write %s", corpus_);
        if (!f) return;
        for (int d = 0; d < 400; d++) {
            /* not periodic in d: every data-parallel shard of the documents reads other text */
            for (int s = 0; s < 3; s++)
                fprintf(f, "%s%s", s ? " " : "", hp_test_sentences_[(d * d * 3 + d / 7 + s * 5) % 6]);
            fprintf(f, ".\n%%\n");
        }
        long len = ftell(f);
        fclose(f);
        char *text = malloc((size_t)len);
        FILE *r = fopen(corpus_, "r");
        HP_CHECK(r && text && fread(text, 1, (size_t)len, r) == (size_t)len, "read %s", corpus_);
        if (r) fclose(r);
        hp_test_train_tokenizer(text, (size_t)len, tok_);
        free(text);
    }
    hp_barrier(world, NULL);
}

/* The small llama3 debugmodel run these tests share: 12 steps of 2 x 32 tokens on the corpus,
 * replicated data parallel over `world` ranks, validation on. */
static inline void hp_test_base_config(hp_config_t *c, int world) {
    hp_config_defaults(c);
    snprintf(c->model.name, sizeof c->model.name, "llama3");
    snprintf(c->model.flavor, sizeof c->model.flavor, "debugmodel");
    c->training.steps = 12;
    c->training.seq_len = 32;
    c->training.local_batch_size = 2;
    c->training.seed = 3;
    c->optimizer.lr = 3e-3;
    c->lr_scheduler.warmup_steps = 2;
    c->parallelism.data_parallel_replicate_degree = world;
    c->parallelism.data_parallel_shard_degree = 1;
    c->metrics.log_freq = 1000;
    c->metrics.peak_flops = -1;
    c->job.dump_folder[0] = '\0';
    snprintf(c->data.path, sizeof c->data.path, "%s", corpus_);
    snprintf(c->data.format, sizeof c->data.format, "text");
    snprintf(c->data.text_separator, sizeof c->data.text_separator, "percent");
    c->data.validation_fraction = 0.1;
    c->validation.enable = true;
    c->validation.steps = 2;
    c->data.loop = true;
    snprintf(c->tokenizer.path, sizeof c->tokenizer.path, "%s", tok_);
}

/* The small model of the pipeline, Muon and MoE trainer tests: dim 64, 4 heads of 16 (2 kv
 * heads), hidden 128, n_layers blocks, 16-token sequences. */
static inline void hp_test_small_config(hp_config_t *c, int world, const char *name, int n_layers) {
    hp_test_base_config(c, world);
    snprintf(c->model.name, sizeof c->model.name, "%s", name);
    c->model.dim = 64;
    c->model.n_heads = 4;
    c->model.n_kv_heads = 2;
    c->model.head_dim = 16;
    c->model.hidden_dim = 128;
    c->model.n_layers = n_layers;
    c->training.seq_len = 16;
}

/* The small MoE model the MoE trainer tests share (model name deepseek_v3 or qwen3_moe): dim 64,
 * 3 layers (the first dense), 8 experts of hidden 32, top-2, a bias step of 1e-2 (large enough
 * to move the bias visibly in a few steps), 16-token sequences, `steps` steps; deepseek_v3's MLA
 * with a small latent and small heads (q|k 12, v 16). */
static inline void hp_test_moe_config(hp_config_t *c, int world, const char *name, int steps) {
    hp_test_small_config(c, world, name, 3);
    if (strcmp(name, "deepseek_v3") == 0) {   // MLA: its own head sizes, not the dense ones
        c->model.n_kv_heads = -1;
        c->model.head_dim = -1;
        c->model.kv_lora_rank = 16;
        c->model.qk_nope_head_dim = 8;
        c->model.qk_rope_head_dim = 4;
        c->model.v_head_dim = 16;
    }
    c->model.hidden_dim = 96;
    c->model.moe_hidden_dim = 32;
    c->model.moe_num_experts = 8;
    c->model.moe_top_k = 2;
    c->model.moe_load_balance_coeff = 1e-2;
    c->training.steps = steps;
}

/* c's layout collapsed onto one rank: every parallel degree 1 (the rest of the config kept). */
static inline void hp_test_single_rank(hp_config_t *c) {
    int64_t *const degrees[] = {
        &c->parallelism.data_parallel_replicate_degree, &c->parallelism.data_parallel_shard_degree,
        &c->parallelism.tensor_parallel_degree,         &c->parallelism.pipeline_parallel_degree,
        &c->parallelism.context_parallel_degree,        &c->parallelism.expert_parallel_degree,
        &c->parallelism.expert_tensor_parallel_degree,
    };
    for (size_t i = 0; i < sizeof degrees / sizeof degrees[0]; i++) *degrees[i] = 1;
}

/* The start of a trainer test's main: MPI (hp_test_mpi_init), the corpus in a fresh
 * /tmp/<prefix>_XXXXXX, and *c (heap; the caller frees it) set to hp_test_base_config for the
 * world size. Returns the world communicator. */
static inline hp_comm_t hp_test_corpus_init(int *argc, char ***argv, const char *prefix, int *rank, int *ws,
                                            hp_config_t **c) {
    int size = 0;
    hp_comm_t world = hp_test_mpi_init(argc, argv, rank, &size);
    if (ws) *ws = size;
    hp_test_make_corpus(world, prefix);
    *c = calloc(1, sizeof **c);
    hp_test_base_config(*c, size);
    return world;
}

/* n steps of t: each step's loss into losses[i] and, when norms is not NULL, its gradient norm
 * into norms[i]. */
static inline void hp_test_steps(hp_trainer_t t, int n, double *losses, double *norms) {
    for (int i = 0; i < n; i++) {
        hp_step_stats_t st;
        HP_CHECK_OK(hp_trainer_step(t, &st));
        losses[i] = st.loss;
        if (norms) norms[i] = st.grad_norm;
    }
}

/* Creates c's trainer on comm and runs its steps from + 1 .. to, their losses into
 * losses[from .. to - 1]; a resumed run (from > 0) must start at step `from` (a check naming
 * what). Returns 0 when no trainer came. */
static inline int hp_test_run_steps(const hp_config_t *c, hp_comm_t comm, int from, int to, double *losses,
                                    const char *what) {
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, comm, &t));
    if (!t) return 0;
    if (from > 0)
        HP_CHECK(hp_trainer_current_step(t) == from, "%s: resumed at step %lld, expected %d", what,
                 (long long)hp_trainer_current_step(t), from);
    hp_test_steps(t, to - from, losses + from, NULL);
    hp_trainer_destroy(t);
    return 1;
}

/* Two SFT data files under dir_ from the example's first 2 R conversations (examples/sft/chat.jsonl):
 * x = them in order (dp rank r's shard of 2 ranks = its half), y = the same interleaved in blocks
 * of B (step k: rank 0's B samples, then rank 1's), so a 1-rank run on y sees each step's global
 * batch in the 2-rank run's order. Written by rank 0; every rank returns after it. */
static inline void hp_test_sft_files(hp_comm_t world, int B, int R, char *x_path, char *y_path, size_t cap) {
    snprintf(x_path, cap, "%s/x.jsonl", dir_);
    snprintf(y_path, cap, "%s/y.jsonl", dir_);
    if (hp_comm_rank(world) == 0) {
        char src[600];
        hp_test_source_path(src, sizeof src, "examples/sft/chat.jsonl");
        FILE *f = fopen(src, "r");
        HP_CHECK(f != NULL, "cannot read %s", src);
        static char lines[512][512];
        int n = 0;
        while (f && n < 2 * R && fgets(lines[n], sizeof lines[n], f)) n++;
        if (f) fclose(f);
        HP_CHECK(n == 2 * R, "examples/sft/chat.jsonl has %d lines, need %d", n, 2 * R);
        FILE *x = fopen(x_path, "w"), *y = fopen(y_path, "w");
        for (int i = 0; i < n; i++) fputs(lines[i], x);
        for (int k = 0; k < R / B; k++)
            for (int r = 0; r < 2; r++)
                for (int b = 0; b < B; b++) fputs(lines[r * R + k * B + b], y);
        fclose(x);
        fclose(y);
    }
    hp_barrier(world, NULL);
}

/* A communicator of world's ranks 0 .. k-1 (NULL on the other ranks). */
static inline hp_comm_t hp_test_first_ranks(hp_comm_t world, int k) {
    hp_comm_t sub = NULL;
    const int rank = hp_comm_rank(world);
    HP_CHECK_OK(hp_comm_split(world, rank < k ? 0 : -1, rank, &sub));
    return sub;
}

/* Runs c on comm when this rank is in it (comm NULL: it is not) for n steps, or fewer where a
 * resumed run reaches training.steps first (the steps not run stay 0), recording the losses,
 * the gradient norms (norms NULL: not kept) and, when val is not NULL, the validation loss after
 * the last step; then every rank of world receives world rank 0's values (world NULL: no
 * broadcast, comm must then hold this rank). n <= 64. */
static inline void hp_test_run_on(const hp_config_t *c, hp_comm_t comm, hp_comm_t world, int n, double *losses,
                                  double *norms, double *val) {
    double buf[2 * 64 + 1] = {0};
    if (comm) {
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(c, comm, &t));
        for (int i = 0; t && i < n && hp_trainer_current_step(t) < c->training.steps; i++) {
            hp_step_stats_t st;
            HP_CHECK_OK(hp_trainer_step(t, &st));
            buf[i] = st.loss;
            buf[64 + i] = st.grad_norm;
        }
        if (t && val) HP_CHECK_OK(hp_trainer_validate(t, &buf[128]));
        hp_trainer_destroy(t);
    }
    if (world) HP_CHECK_OK(hp_broadcast(buf, sizeof buf, HP_U8, 0, world, NULL));   // doubles as bytes
    for (int i = 0; i < n; i++) {
        losses[i] = buf[i];
        if (norms) norms[i] = buf[64 + i];
    }
    if (val) *val = buf[128];
}

/* Checks a[i] against b[i] within rtol relative to b[i] for every step, naming what and the
 * step; returns 1 when all are within. */
static inline int hp_test_close_steps(const char *what, const double *a, const double *b, int n, double rtol) {
    int ok = 1;
    for (int i = 0; i < n; i++) {
        const int c = fabs(a[i] - b[i]) <= rtol * fabs(b[i]);
        HP_CHECK(c, "%s step %d: %.9g vs %.9g (rtol %g)", what, i + 1, a[i], b[i], rtol);
        ok &= c;
    }
    return ok;
}

/* 1 when some step's a[i] lies outside rtol of b[i]: what a negative test (STYLE rule 17)
 * must see. */
static inline int hp_test_any_outside(const double *a, const double *b, int n, double rtol) {
    int out = 0;
    for (int i = 0; i < n; i++) out |= fabs(a[i] - b[i]) > rtol * fabs(b[i]);
    return out;
}

/* The largest |a[i] - b[i]| / |b[i]| over n steps. */
static inline double hp_test_worst_rel(const double *a, const double *b, int n) {
    double w = 0;
    for (int i = 0; i < n; i++) w = fmax(w, fabs(a[i] - b[i]) / fabs(b[i]));
    return w;
}

/* A layout's run against its reference: losses within ltol and (ntol > 0) gradient norms
 * within ntol, step by step, relative to the reference; rank 0 prints the first and last
 * losses of both and the worst relative loss difference. */
static inline void hp_test_compare_runs(const char *what, int n, const double *l, const double *rl,
                                        const double *nm, const double *rn, double ltol, double ntol) {
    hp_test_close_steps(what, l, rl, n, ltol);
    if (ntol > 0) {
        char w[300];
        snprintf(w, sizeof w, "%.280s grad norm", what);
        hp_test_close_steps(w, nm, rn, n, ntol);
    }
    if (hp_test_rank_ == 0)
        printf("%s: losses %.6f .. %.6f (reference %.6f .. %.6f, worst rel diff %.1e)\n", what, l[0], l[n - 1], rl[0],
               rl[n - 1], hp_test_worst_rel(l, rl, n));
}

/* Runs n trainer steps of config c on comm, recording each step's loss and gradient norm;
 * with validate, also checks that validation gives a finite positive loss. */
static inline void hp_test_train_steps(const hp_config_t *c, hp_comm_t comm, int n, double *losses, double *norms,
                                       int validate) {
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(c, comm, &t));
    if (!t) return;
    hp_test_steps(t, n, losses, norms);
    if (validate) {
        double vl = NAN;
        HP_CHECK_OK(hp_trainer_validate(t, &vl));
        HP_CHECK(isfinite(vl) && vl > 0, "validation loss %g", vl);
    }
    hp_trainer_destroy(t);
}

/* Token files for a data-parallel degree dp, in dir_: rank 0 writes x_dp<dp>.bin (dp contiguous
 * shards, shard r = the rows data-parallel rank r reads over `steps` steps of B rows) and
 * y_dp<dp>.bin (the same rows interleaved: row (k dp + r) B + b of y = row k B + b of shard r),
 * so one rank with local batch dp x B reads at step k exactly the dp ranks' rows of step k: the
 * single-rank run of a data-parallel layout's global batch. Rows are T + 1 tokens (the bin
 * loader's window), each an arithmetic progression mod 251 (learnable, so the loss moves; the
 * vocabulary must hold 251 ids). Collective over world. */
static inline void hp_test_write_dp_bins(hp_comm_t world, int dp, int B, int T, int steps) {
    const int R = steps * B, Wt = T + 1;   // rows per shard: no wrap
    if (hp_comm_rank(world) == 0) {
        uint16_t *x = calloc((size_t)dp * R * Wt, sizeof *x), *y = calloc((size_t)dp * R * Wt, sizeof *y);
        uint32_t st = 12345u + (uint32_t)dp;
        for (int r = 0; r < dp; r++)
            for (int i = 0; i < R; i++) {
                st = st * 1664525u + 1013904223u;
                const int a = 1 + (int)(st >> 28), b = (int)((st >> 8) % 251);
                uint16_t *row = x + ((size_t)r * R + i) * Wt;
                for (int t = 0; t < Wt; t++) row[t] = (uint16_t)((a * t + b) % 251);
                const int k = i / B, bb = i % B;
                memcpy(y + ((size_t)(k * dp + r) * B + bb) * Wt, row, sizeof *row * (size_t)Wt);
            }
        for (int f = 0; f < 2; f++) {
            char path[300];
            snprintf(path, sizeof path, "%s/%c_dp%d.bin", dir_, f ? 'y' : 'x', dp);
            FILE *fp = fopen(path, "wb");
            HP_CHECK(fp && fwrite(f ? y : x, sizeof *x, (size_t)dp * R * Wt, fp) == (size_t)dp * R * Wt, "write %s", path);
            if (fp) fclose(fp);
        }
        free(x);
        free(y);
    }
    hp_barrier(world, NULL);
}

/* Points c at x_dp<dp>.bin ('x': the data-parallel layout) or y_dp<dp>.bin ('y': the single
 * rank with local batch dp x B). */
static inline void hp_test_use_bin(hp_config_t *c, char which, int dp) {
    snprintf(c->data.path, sizeof c->data.path, "%.200s/%c_dp%d.bin", dir_, which, dp);
    snprintf(c->data.format, sizeof c->data.format, "bin");
    c->data.validation_fraction = 0.0;
}

/* The single-rank run of layout f's global batch (dp data-parallel ranks x B rows): rank 0 alone
 * with every parallelism degree 1 and local batch dp x B, on the interleaved file y_dp<dp>.bin
 * (hp_test_write_dp_bins), n steps; the losses and norms reach every rank of world. */
static inline void hp_test_solo_steps(const hp_config_t *f, hp_comm_t world, int dp, int n, double *losses,
                                      double *norms) {
    hp_config_t *c = calloc(1, sizeof *c);
    *c = *f;
    hp_test_single_rank(c);
    c->training.local_batch_size = dp * f->training.local_batch_size;
    c->training.global_batch_size = -1;
    hp_test_use_bin(c, 'y', dp);
    hp_comm_t solo = hp_test_first_ranks(world, 1);
    hp_test_run_on(c, solo, world, n, losses, norms, NULL);
    if (solo) hp_comm_destroy(solo);
    free(c);
}

/* Removes the directory (rank 0, after every rank is done) unless HP_KEEP is set. */
static inline void hp_test_remove_corpus(hp_comm_t world) {
    hp_barrier(world, NULL);
    if (hp_comm_rank(world) == 0 && !getenv("HP_KEEP") && dir_[0]) hp_test_remove_dir(dir_);
}

/* The end of a trainer test's main: the summary line, the corpus removed, MPI finalized.
 * Returns the exit code. */
static inline int hp_test_corpus_finish(hp_comm_t world, const char *name) {
    const int rc = hp_test_finish(name);
    hp_test_remove_corpus(world);
    hp_comm_finalize();
    return rc;
}

#endif
