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
#include <strings.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_corpus.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"
#include "hyperparallel/trainer.h"

enum { N = 10 };

/* A reference run: `model` without PP, replicated data parallel over dp ranks (1: the single
 * rank), local batch `batch`, global batch gbatch (0: dp x batch). */
typedef struct {
    const char *model;
    int dp, batch, gbatch;
} ref_t;

/* One case: a layout against its reference, or (needle set) a config that must be refused. */
typedef struct {
    int ws;                     /* the world size it runs on */
    ref_t ref;                  /* the reference; the layout starts from its config */
    int pp;
    const char *sched;
    int rep, shard;             /* data parallel of the layout (0, 0: the reference's) */
    int tp, cp, mbs, mpipe_t;   /* 0: unset */
    const char *csv;            /* a schedule CSV of csv_text ("gpipe", "zb", "bad") */
    const char *fqns;           /* module_fqns_per_model_part */
    const char *ac;             /* activation_checkpoint.mode */
    const char *env[2];         /* "NAME=value" set around the run */
    int less, per_stage;        /* first_stage_less_layers, layers_per_stage (0: unset) */
    int val;                    /* the validation losses agree within 1e-5 too */
    double ltol, ntol;          /* loss and norm rtol; 0: 1e-5 and 1e-4; ntol < 0: norms not compared */
    double lr_scale;            /* 0: 1 */
    int negative;               /* the losses must leave ltol on some step (STYLE rule 17) */
    int bitwise_prev;           /* bitwise the previous case's losses and norms (no tolerance check) */
    hp_status_t status;         /* with needle: the expected refusal of hp_trainer_create */
    const char *needle;
} pp_case_t;

/* the references: llama3 / qwen3, dp ranks, local batch, global batch */
#define L1 {"llama3", 1, 4, 0}
#define L2 {"llama3", 2, 4, 0}
#define L4 {"llama3", 4, 4, 0}
#define L1B3 {"llama3", 1, 3, 0}
#define L1B8 {"llama3", 1, 8, 0}
#define L2B8 {"llama3", 2, 8, 0}
#define L1G8 {"llama3", 1, 4, 8}
#define Q1 {"qwen3", 1, 4, 0}
#define Q2 {"qwen3", 2, 4, 0}
#define C(w, r, p, s) .ws = w, .ref = r, .pp = p, .sched = s
#define DP(r, s) .rep = r, .shard = s
#define TPTOL .ltol = 1e-4, .ntol = 1e-3   /* TP's and CP's tolerance: they reorder the GEMMs' and attention's sums */

static const pp_case_t cases[] = {
    /* 2 ranks: the schedules against the single rank */
    {C(2, L1, 2, "1F1B")}, {C(2, L1, 2, "GPipe")}, {C(2, L1, 2, "Interleaved1F1B")}, {C(2, L1, 2, "LoopedBFS")},
    {C(2, Q1, 2, "1F1B")}, {C(2, Q1, 2, "GPipe")},
    /* the zero-bubble and V schedules (ZBV, DualPipeV on the V mapping: 2 stages per rank),
     * validation through hp_pp_eval on the mapping */
    {C(2, L1, 2, "InterleavedZeroBubble"), .val = 1}, {C(2, L1, 2, "ZBVZeroBubble"), .val = 1},
    {C(2, L1, 2, "DualPipeV"), .val = 1},
    /* OVERLAP_F_B run as F then B (and coalesced p2p): bitwise DualPipeV's losses and norms */
    {C(2, L1, 2, "DualPipeV"), .env = {"HP_PP_OVERLAP=off", "HP_PP_P2P=coalesced"}, .bitwise_prev = 1},
    /* HyperParallel's MPipeTranspose: T = 0 (the embedding) and T = 1 (stage 0 = the embedding and
     * layer 0, exactly the preprocess); T = 2 leaves stage 0 one layer: refused */
    {C(2, L1, 2, "MPipeTranspose"), .mpipe_t = 0, .val = 1}, {C(2, L1, 2, "MPipeTranspose"), .mpipe_t = 1, .val = 1},
    {C(2, L1, 2, "mpipetranspose"), .mpipe_t = 2, .status = HP_ERR_INVALID_ARG,
     .needle = "pipeline_parallel_mpipe_transpose_layers = 2"},
    /* qwen3's tied embeddings: stage 0's copy (and the replicas refreshed from it) and the last
     * stage's, their gradients summed */
    {C(2, Q1, 2, "MPipeTranspose"), .mpipe_t = 1},
    /* a hand-written compute-only CSV (GPipe's order) with a user split; full AC in the stages */
    {C(2, L1, 2, "1F1B"), .csv = "gpipe", .ntol = -1,
     .fqns = "tok_embeddings,layers.0,layers.1;layers.2,layers.3,layers.4,layers.5,norm,output"},
    {C(2, L1, 2, "1F1B"), .ac = "full", .ntol = -1},
    /* gradient accumulation: global batch 8 = 2 steps of the local 4, the schedule run twice */
    {C(2, L1G8, 2, "1F1B")},
    {C(2, L1, 2, "1F1B"), .lr_scale = 1.001, .negative = 1},
    /* bad input, named by key */
    {C(2, L1B3, 2, "1F1B"), .mbs = 2, .status = HP_ERR_INVALID_ARG,
     .needle = "pipeline_parallel_microbatch_size 2"},
    {C(2, L1, 2, "1F1B"), .fqns = "tok_embeddings,layers.0;layers.2,layers.3,layers.4,layers.5,norm,output",
     .status = HP_ERR_INVALID_ARG, .needle = "module_fqns_per_model_part"},
    {C(2, L1, 2, "1F1B"), .less = 10, .status = HP_ERR_INVALID_ARG, .needle = "first_stage_less_layers 10"},
    {C(2, L1, 2, "zbvzerobubble"), .per_stage = 1, .status = HP_ERR_INVALID_ARG,   /* 8 stages: 4 per rank */
     .needle = "needs exactly 2 stages per pp rank"},
    {C(2, Q1, 2, "DualPipeV"), .status = HP_ERR_UNSUPPORTED, .needle = "tied embeddings"},
    {C(2, L1, 2, "ZBV"), .status = HP_ERR_INVALID_ARG, .needle = "pipeline_parallel_schedule"},
    {C(2, L1, 2, "1F1B"), .csv = "bad", .status = HP_ERR_INVALID_ARG, .needle = "pipeline_parallel_schedule_csv"},
    {C(2, L1, 2, "1F1B"), .csv = "huge", .status = HP_ERR_FORMAT,
     .needle = "huge.csv:1: cell 1: '0F2147483646': microbatch index exceeds 1048575 (HP_PP_MAX_MB"},

    /* 4 ranks: pp 4 */
    {C(4, L1, 4, "1F1B")}, {C(4, L1, 4, "Interleaved1F1B")}, {C(4, L1, 4, "GPipe")}, {C(4, L1, 4, "LoopedBFS")},
    /* 8 micro-batches of 1 and 2 micro-batches of 4 (global batch 8 per step); the zero-bubble /
     * V ones: 8 micro-batches >= 8 stages */
    {C(4, L1B8, 4, "Interleaved1F1B"), .mbs = 1}, {C(4, L1B8, 4, "GPipe"), .mbs = 4},
    {C(4, L1B8, 4, "InterleavedZeroBubble"), .mbs = 1},
    {C(4, L1B8, 4, "ZBVZeroBubble"), .mbs = 1}, {C(4, L1B8, 4, "DualPipeV"), .mbs = 1},
    /* pp 2 x TP 2 (sequence + loss parallel inside each stage) against the single rank, with the
     * zero-bubble / V schedules and a zero-bubble CSV (TP's collectives in I, W deferred) */
    {C(4, L1, 2, "Interleaved1F1B"), .tp = 2, TPTOL}, {C(4, L1, 2, "InterleavedZeroBubble"), .tp = 2, TPTOL},
    {C(4, L1, 2, "ZBVZeroBubble"), .tp = 2, TPTOL}, {C(4, L1, 2, "DualPipeV"), .tp = 2, TPTOL},
    /* pp 2 x CP 2 with split-backward and V schedules: the CP cores' collectives in I */
    {C(4, L1, 2, "InterleavedZeroBubble"), .cp = 2, TPTOL}, {C(4, L1, 2, "DualPipeV"), .cp = 2, TPTOL},
    {C(4, L1, 2, "1F1B"), .tp = 2, .csv = "zb", TPTOL},
    /* pp 2 x FSDP 2 and pp 2 x DDP 2 against replicated DP 2 on ranks 0, 1 (FSDP with the
     * zero-bubble CSV: the reduce-scatter follows the stage's last W) */
    {C(4, L2, 2, "1F1B"), DP(1, 2)}, {C(4, L2, 2, "1F1B"), DP(2, 1)}, {C(4, L2, 2, "1F1B"), DP(1, 2), .csv = "zb"},
    {C(4, L2, 2, "InterleavedZeroBubble"), DP(1, 2)}, {C(4, L2, 2, "ZBVZeroBubble"), DP(1, 2)},
    {C(4, L2, 2, "DualPipeV"), DP(1, 2)},
    {C(4, L2, 2, "ZBVZeroBubble"), DP(2, 1)}, {C(4, L2, 2, "MPipeTranspose"), DP(2, 1), .mpipe_t = 1},
    /* the overlap's thread mode is refused with FSDP (collectives inside the stages), and
     * MPipeTranspose (its replica takes plain parameters); a bad env value is named */
    {C(4, L2, 2, "DualPipeV"), DP(1, 2), .env = {"HP_PP_OVERLAP=thread"}, .status = HP_ERR_UNSUPPORTED,
     .needle = "HP_PP_OVERLAP = thread"},
    {C(4, L2, 2, "MPipeTranspose"), DP(1, 2), .status = HP_ERR_UNSUPPORTED,
     .needle = "MPipeTranspose with data_parallel_shard_degree 2"},
    {C(4, L2, 2, "DualPipeV"), DP(1, 2), .env = {"HP_PP_OVERLAP=sideways"}, .status = HP_ERR_INVALID_ARG,
     .needle = "HP_PP_OVERLAP = 'sideways'"},

    /* 8 ranks: pp 2 x FSDP 2 x TP 2 against replicated DP 2 (qwen3: the tied weight too) */
    {C(8, L2, 2, "1F1B"), DP(1, 2), .tp = 2, TPTOL}, {C(8, Q2, 2, "1F1B"), DP(1, 2), .tp = 2, TPTOL},
    /* pp 4 x FSDP 2 and pp 4 x TP 2 with the zero-bubble / V schedules (8 micro-batches >= 8 stages) */
    {C(8, L2B8, 4, "InterleavedZeroBubble"), DP(1, 2)}, {C(8, L2B8, 4, "ZBVZeroBubble"), DP(1, 2)},
    {C(8, L2B8, 4, "DualPipeV"), DP(1, 2)},
    {C(8, L1B8, 4, "InterleavedZeroBubble"), .tp = 2, TPTOL},
    {C(8, L1B8, 4, "ZBVZeroBubble"), .tp = 2, TPTOL},
    {C(8, L1B8, 4, "DualPipeV"), .tp = 2, TPTOL},
    /* pp 2 x HSDP (dp_replicate 2 x dp_shard 2) against replicated DP 4 */
    {C(8, L4, 2, "Interleaved1F1B"), DP(2, 2)},
};

/* The schedule CSVs of the cases, for pp 2 x 4 micro-batches: GPipe's order by hand; a
 * zero-bubble (ZB-H1) compute-only one where rank 0 runs the input passes of two micro-batches
 * and a forward before the first weight pass, so a weight pass runs long after its input pass
 * (contexts live from F to W, FSDP's reduction after the last W, TP's gathered gradients per
 * context); one whose rank 0 misses a backward. */
static const char *const csv_text[4][2] = {
    {"gpipe", "0F0,0F1,0F2,0F3,,,0B0,0B1,0B2,0B3\n,1F0,1F1,1F2,1F3,1B0,1B1,1B2,1B3\n"},
    {"zb", "0F0,0F1,0F2,0I0,0F3,0I1,0W0,0I2,0W1,0I3,0W2,0W3\n1F0,1I0,1F1,1I1,1W0,1F2,1I2,1W1,1F3,1I3,1W2,1W3\n"},
    {"bad", "0F0,0F1,0F2,0F3,0B0,0B1,0B2\n1F0,1F1,1F2,1F3,1B0,1B1,1B2,1B3\n"},
    {"huge", "0F2147483646,0B2147483646\n1F0,1B0\n"},   /* a microbatch index past HP_PP_MAX_MB (issue 28) */
};

static void base(hp_config_t *c, int dp, const char *model) {
    hp_test_base_config(c, dp);
    snprintf(c->model.name, sizeof c->model.name, "%s", model);
    c->model.dim = 64;
    c->model.n_heads = 4;
    c->model.n_kv_heads = 2;
    c->model.head_dim = 16;
    c->model.hidden_dim = 128;
    c->model.n_layers = 6;
    c->training.seq_len = 16;
    c->training.local_batch_size = 4;
    c->training.steps = N;
    c->training.max_norm = 1.0;
    c->validation.steps = 1;
    c->validation.local_batch_size = -1;
    snprintf(c->training.mixed_precision_param, sizeof c->training.mixed_precision_param, "float32");
}

static void ref_config(hp_config_t *c, ref_t r) {
    base(c, r.dp, r.model);
    c->training.local_batch_size = r.batch;
    if (r.gbatch) c->training.global_batch_size = r.gbatch;
}

static void set_pp(hp_config_t *f, int pp, const char *sched) {
    f->parallelism.pipeline_parallel_degree = pp;
    snprintf(f->parallelism.pipeline_parallel_schedule, sizeof f->parallelism.pipeline_parallel_schedule, "%s", sched);
}

/* The layout config of case k. */
static void case_config(hp_config_t *f, const pp_case_t *k) {
    ref_config(f, k->ref);
    set_pp(f, k->pp, k->sched);
    if (k->rep) f->parallelism.data_parallel_replicate_degree = k->rep;
    if (k->shard) f->parallelism.data_parallel_shard_degree = k->shard;
    if (k->tp) f->parallelism.tensor_parallel_degree = k->tp;
    if (k->cp) f->parallelism.context_parallel_degree = k->cp;
    if (k->mbs) f->parallelism.pipeline_parallel_microbatch_size = k->mbs;
    f->parallelism.pipeline_parallel_mpipe_transpose_layers = k->mpipe_t;
    if (k->less) f->parallelism.pipeline_parallel_first_stage_less_layers = k->less;
    if (k->per_stage) f->parallelism.pipeline_parallel_layers_per_stage = k->per_stage;
    if (k->csv)
        snprintf(f->parallelism.pipeline_parallel_schedule_csv, sizeof f->parallelism.pipeline_parallel_schedule_csv,
                 "%s/%s.csv", dir_, k->csv);
    if (k->fqns)
        snprintf(f->parallelism.module_fqns_per_model_part, sizeof f->parallelism.module_fqns_per_model_part, "%s",
                 k->fqns);
    if (k->ac) snprintf(f->activation_checkpoint.mode, sizeof f->activation_checkpoint.mode, "%s", k->ac);
    if (k->lr_scale) f->optimizer.lr *= k->lr_scale;
}

/* Sets (on) or unsets case k's environment variables. */
static void case_env(const pp_case_t *k, int on) {
    for (int i = 0; i < 2 && k->env[i]; i++) {
        char name[64];
        const char *eq = strchr(k->env[i], '=');
        snprintf(name, sizeof name, "%.*s", (int)(eq - k->env[i]), k->env[i]);
        if (on) setenv(name, eq + 1, 1);
        else unsetenv(name);
    }
}

static void case_name(char *what, size_t n, const pp_case_t *k) {
    snprintf(what, n, "%s (dp %d, batch %d", k->ref.model, k->ref.dp, k->ref.batch);
    if (k->ref.gbatch) snprintf(what + strlen(what), n - strlen(what), ", global %d", k->ref.gbatch);
    snprintf(what + strlen(what), n - strlen(what), ") pp %d %s", k->pp, k->sched);
    if (k->rep || k->shard) snprintf(what + strlen(what), n - strlen(what), " x dp %d x %d", k->rep, k->shard);
    if (k->tp) snprintf(what + strlen(what), n - strlen(what), " x TP %d", k->tp);
    if (k->cp) snprintf(what + strlen(what), n - strlen(what), " x CP %d", k->cp);
    if (k->mbs) snprintf(what + strlen(what), n - strlen(what), ", mbs %d", k->mbs);
    if (!strcasecmp(k->sched, "MPipeTranspose")) snprintf(what + strlen(what), n - strlen(what), " T %d", k->mpipe_t);
    if (k->csv) snprintf(what + strlen(what), n - strlen(what), ", %s csv", k->csv);
    if (k->fqns) snprintf(what + strlen(what), n - strlen(what), ", fqns");
    if (k->ac) snprintf(what + strlen(what), n - strlen(what), ", AC %s", k->ac);
    if (k->env[0]) snprintf(what + strlen(what), n - strlen(what), ", %s", k->env[0]);
    if (k->lr_scale) snprintf(what + strlen(what), n - strlen(what), ", lr x %g", k->lr_scale);
}

/* The references computed so far (each once; a reference that some case compares the
 * validation loss of runs with validation). */
static struct {
    ref_t r;
    double l[N], n[N], v;
} refs[8];
static int n_refs;

static int same_ref(ref_t a, ref_t b) {
    return !strcmp(a.model, b.model) && a.dp == b.dp && a.batch == b.batch && a.gbatch == b.gbatch;
}

/* The reference r of world size ws: on ranks 0 .. dp-1 (on 8 ranks every group of dp ranks runs
 * it, so that no rank waits idle (polling) through it), results on every rank. */
static int reference(hp_comm_t world, int ws, ref_t r) {
    for (int i = 0; i < n_refs; i++)
        if (same_ref(refs[i].r, r)) return i;
    HP_ASSERT(n_refs < 8);
    int val = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        val |= cases[k].ws == ws && cases[k].val && same_ref(cases[k].ref, r);
    hp_config_t *c = calloc(1, sizeof *c);
    ref_config(c, r);
    const int rank = hp_comm_rank(world);
    hp_comm_t comm = NULL;
    if (ws == 8) HP_CHECK_OK(hp_comm_split(world, rank / r.dp, rank, &comm));
    else comm = hp_test_first_ranks(world, r.dp);
    refs[n_refs].r = r;
    hp_test_run_on(c, comm, world, N, refs[n_refs].l, refs[n_refs].n, val ? &refs[n_refs].v : NULL);
    hp_comm_destroy(comm);
    free(c);
    return n_refs++;
}

static void run_case(hp_comm_t world, int ws, const pp_case_t *k) {
    static double prev_l[N], prev_n[N];
    hp_config_t *f = calloc(1, sizeof *f);
    case_config(f, k);
    char what[300];
    case_name(what, sizeof what, k);
    case_env(k, 1);
    if (k->needle) {
        hp_trainer_t t = NULL;
        HP_CHECK_ERR(hp_trainer_create(f, world, &t), k->status, k->needle);
        hp_trainer_destroy(t);
    } else {
        double l[N], n[N], v = 0;
        const int r = k->bitwise_prev ? -1 : reference(world, ws, k->ref);
        hp_test_run_on(f, world, world, N, l, n, k->val ? &v : NULL);
        const double ltol = k->ltol ? k->ltol : 1e-5, ntol = k->ntol ? k->ntol : 1e-4;
        if (k->bitwise_prev)
            HP_CHECK(memcmp(l, prev_l, sizeof l) == 0 && memcmp(n, prev_n, sizeof n) == 0,
                     "%s: differs bitwise from the case before: loss %.9g vs %.9g", what, l[N - 1], prev_l[N - 1]);
        else if (k->negative)
            HP_CHECK(hp_test_any_outside(l, refs[r].l, N, ltol), "%s: matched within %g", what, ltol);
        else
            hp_test_compare_runs(what, N, l, refs[r].l, n, refs[r].n, ltol, ntol);
        if (k->val)
            HP_CHECK(fabs(v - refs[r].v) <= 1e-5 * fabs(refs[r].v), "%s: validation %.9g vs %.9g", what, v, refs[r].v);
        memcpy(prev_l, l, sizeof l);
        memcpy(prev_n, n, sizeof n);
    }
    case_env(k, 0);
    free(f);
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

/* A checkpoint saved under pp 2 (2 ranks: both; 4 ranks: ranks 0, 1) loads under pp 1 on one
 * rank (2 ranks) or pp 4 (4 ranks, going on for two steps) with the same validation loss. */
static void ckpt_reshard(hp_comm_t world, int ws) {
    hp_config_t *c = calloc(1, sizeof *c), *f = calloc(1, sizeof *f), *g = calloc(1, sizeof *g);
    base(c, 1, "llama3");
    ckpt_pp2(f, c);
    double l[N], n[N], v2 = 0, v = 0;
    hp_comm_t two = hp_test_first_ranks(world, 2), one = hp_test_first_ranks(world, 1);
    hp_test_run_on(f, two, world, N, l, n, &v2);
    *g = *f;
    g->checkpoint.exclude_from_loading.n = 1;
    snprintf(g->checkpoint.exclude_from_loading.items[0], HP_CONFIG_STR_MAX, "dataloader");
    if (ws == 2) {
        g->parallelism.pipeline_parallel_degree = 1;   // resumes at step 5 = training.steps: load only
        hp_test_run_on(g, one, world, N, l, n, &v);
        HP_CHECK(fabs(v - v2) <= 1e-5 * fabs(v2), "validation after loading the pp-2 checkpoint under pp 1: %.9g vs "
                 "%.9g", v, v2);
        if (hp_comm_rank(world) == 0) printf("checkpoint pp 2 -> pp 1: validation %.6f vs %.6f\n", v, v2);
    } else {
        set_pp(g, 4, "Interleaved1F1B");
        g->training.steps = 7;   // and goes on for two steps
        g->checkpoint.interval = 1000;
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(g, world, &t));
        if (t) {
            HP_CHECK(hp_trainer_current_step(t) == 5, "resumed at step %lld", (long long)hp_trainer_current_step(t));
            HP_CHECK_OK(hp_trainer_validate(t, &v));
            HP_CHECK(fabs(v - v2) <= 1e-5 * fabs(v2), "validation after loading under pp 4: %.9g vs %.9g", v, v2);
            hp_step_stats_t st;
            HP_CHECK_OK(hp_trainer_step(t, &st));
            HP_CHECK(isfinite(st.loss), "step after the reshard: loss %g", st.loss);
            hp_trainer_destroy(t);
        }
    }
    hp_comm_destroy(one);
    hp_comm_destroy(two);
    free(g);
    free(f);
    free(c);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_config_t *c = NULL;
    hp_comm_t world = hp_test_corpus_init(&argc, &argv, "hp_test_trainer_pp", &rank, &ws, &c);
    if (rank == 0)
        for (int i = 0; i < 4; i++) {
            char path[400];
            snprintf(path, sizeof path, "%s/%s.csv", dir_, csv_text[i][0]);
            FILE *fp = fopen(path, "w");
            HP_CHECK(fp && fputs(csv_text[i][1], fp) >= 0, "write %s", path);
            if (fp) fclose(fp);
        }
    hp_barrier(world, NULL);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        if (cases[k].ws == ws) run_case(world, ws, &cases[k]);
    if (ws == 2 || ws == 4) ckpt_reshard(world, ws);
    free(c);
    return hp_test_corpus_finish(world, "test_trainer_pp");
}
