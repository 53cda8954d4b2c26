/* The trainer with expert parallelism (parallelism.expert_parallel_degree; ep borrows the
 * dp_shard x cp ranks as TorchTitan; the dense params FSDP-sharded over dp_shard x cp, the
 * experts over the sparse mesh): for both MoE flavors, 10 steps with the aux-loss-free bias
 * update on give the losses and gradient norms of the single-rank run of the same global batch
 * (a token file whose rows the one rank reads in the order the dp ranks read theirs): ep = world;
 * on 2 ranks cp 2 x ep 2 and cp 2 alone (qwen3_moe); on 4 ranks ep 2 x efsdp 2, ETP (ep 2 x tp
 * 2), 2 experts on ep 2 x efsdp 2 (Shard(1)), cp 2 x dp_shard 2 with ep 2 x efsdp 2 and with ep
 * 4, cp 2 x tp 2 with ETP ep 2; on 8 ranks ETP x expert FSDP (ep 2 x etp 2 x efsdp 2, dense TP 2
 * x FSDP 4; the same with cp 2 x dp_shard 2; 2 experts in Shard(1), 1/8 of each expert tensor
 * per rank, checkpointed at step 4 and resumed under TP 2 with ep 1) and HSDP 2 x ep 2 x efsdp 2,
 * and inside pipeline stages pp 2 x ETP, pp 2 x ep 2 x efsdp 2 and pp 2 x HSDP 2 x 2 with ep 2;
 * ETP ep 4 x TP 2 x FSDP 4 with SP and HSDP 2 x 2 x tp 2 with ep 4 borrowing dp_shard x tp (SP
 * on). Sequence parallel around the MoE layers (the MoE input Shard(seq) over tp): tp 2 + SP (EP
 * 1) and ep 2 borrowing tp 2 (etp 1) on 2 ranks, ETP ep 2 x tp 2 + SP and ep 4 over dp_shard 2 x
 * tp 2 on 4 ranks; one checkpoint saved under ep 2 borrowing tp 2 resumes under tp 2 + SP with EP
 * 1, and gradient accumulation with full AC under ep 2 borrowing tp 2 + SP equals the single
 * rank's batch of the two micro-batches. Float32 GEMM row sets and reduction orders differ, and
 * Adam turns relative gradient differences of ~1e-7 into parameter differences of up to
 * lr x 1e-3 near zero gradients: 1e-5 relative on the loss, 1e-4 on the norm; an lr x 1.001 run
 * falls outside. A checkpoint saved under EP resumes under replicated DP and the reverse
 * (experts and expert_bias resharded); gradient accumulation, validation and full AC run
 * under EP. Pipeline parallel of both flavors (4 ranks) equals the single rank too: with data
 * parallel (pp 2 x FSDP 2, pp 2 x DDP 2), with expert parallel inside the stages (pp 2 x ep 2,
 * dense FSDP 2 per stage, under 1F1B, InterleavedZeroBubble, ZBVZeroBubble and DualPipeV) and
 * with tensor parallel (pp 2 x tp 2, experts TP on their hidden dim), each expert tensor held 1/ep
 * or 1/tp per rank; a route scale of 24 lifts the experts' share of the gradient norm above its
 * bound, so a norm that misses a stage's experts fails; an lr x 1.001 run of pp 2 x ep 2 and of
 * pp 2 x tp 2 falls outside. A checkpoint saved under pp 2 x ep 2 resumes under DP 2 and the
 * reverse (experts and expert_bias resharded across the stages, the final weights files equal
 * tensor by tensor); gradient accumulation, full AC and validation under pp 2 x ep 2 equal DP 2;
 * HP_PP_OVERLAP=thread stays refused with EP. Bad EP keys are named. */
// hp-test: ranks 2 4 8 timeout 300
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_corpus.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/trainer.h"

enum { N = 10, B = 2, T = 16 };   // steps; moe_config's local batch and sequence

static void moe_config(hp_config_t *c, int ws, const char *name) {
    hp_test_moe_config(c, ws, name, N);
    c->validation.enable = false;
    // FSDP (the dense params under EP) all-gathers in f32 (TorchTitan's default is bf16), as the
    // single-rank and replicated runs compute
    snprintf(c->training.mixed_precision_param, sizeof c->training.mixed_precision_param, "float32");
}

static void set_ep(hp_config_t *f, int rep, int shard, int tp, int ep, int etp) {
    f->parallelism.context_parallel_degree = 1;
    f->parallelism.data_parallel_replicate_degree = rep;
    f->parallelism.data_parallel_shard_degree = shard;
    f->parallelism.tensor_parallel_degree = tp;
    f->parallelism.enable_sequence_parallel = false;
    f->parallelism.expert_parallel_degree = ep;
    f->parallelism.expert_tensor_parallel_degree = etp;
}

/* The token files of data-parallel degree dp hold rows for local batch b (written when they do
 * not yet). Collective. */
static void ensure_bins(hp_comm_t world, int dp, int b) {
    static int written[9];
    if (written[dp] == b) return;
    hp_test_write_dp_bins(world, dp, b, T, N);
    written[dp] = b;
}

/* The single-rank runs made so far, by their whole config: a layout whose single-rank config is
 * byte for byte one of them reuses its losses (the run is deterministic). */
static struct {
    hp_config_t *c;
    double l[N], n[N];
} solos[40];
static int n_solos;

/* The single-rank run of layout f's global batch (dp ranks x B rows): rank 0 alone, local batch
 * dp x B, on the interleaved file; results broadcast to every rank. */
static void solo_steps(const hp_config_t *f, hp_comm_t world, int dp, double *l, double *n) {
    hp_config_t *c = calloc(1, sizeof *c);
    *c = *f;
    hp_test_single_rank(c);
    c->training.local_batch_size = dp * f->training.local_batch_size;
    c->training.global_batch_size = -1;
    hp_test_use_bin(c, 'y', dp);
    int32_t hit = -1;   // rank 0 decides, so that every rank takes the same path
    for (int i = 0; hp_comm_rank(world) == 0 && i < n_solos && hit < 0; i++)
        if (memcmp(solos[i].c, c, sizeof *c) == 0) hit = i;
    HP_CHECK_OK(hp_broadcast(&hit, 1, HP_I32, 0, world, NULL));
    if (hit >= 0) {
        memcpy(l, solos[hit].l, sizeof solos[hit].l);
        memcpy(n, solos[hit].n, sizeof solos[hit].n);
        free(c);
        return;
    }
    hp_comm_t solo = hp_test_first_ranks(world, 1);
    hp_test_run_on(c, solo, world, N, l, n, NULL);
    hp_comm_destroy(solo);
    if (n_solos < 40) {
        solos[n_solos].c = c;
        memcpy(solos[n_solos].l, l, sizeof solos[n_solos].l);
        memcpy(solos[n_solos].n, n, sizeof solos[n_solos].n);
        n_solos++;
    } else {
        free(c);
    }
}

/* Every routed-expert tensor of the trainer's model holds 1/share of its global elements. */
static void check_expert_share(hp_trainer_t t, int share, const char *what) {
    hp_model_t m = hp_trainer_model(t);
    hp_param_t *ps = hp_model_params(m);
    int n = 0;
    for (int i = 0; i < hp_model_num_params(m); i++) {
        if (!strstr(ps[i].name, ".moe.experts.")) continue;
        int64_t g = 1;
        for (int d = 0; d < ps[i].value.local.ndim; d++) g *= ps[i].value.global_shape[d];
        HP_CHECK(hp_tensor_numel(&ps[i].value.local) * share == g, "%s: %s holds %lld of %lld elements, expected 1/%d",
                 what, ps[i].name, (long long)hp_tensor_numel(&ps[i].value.local), (long long)g, share);
        n++;
    }
    HP_CHECK(n > 0, "%s: no expert parameters", what);
}

/* 4 steps of layout a saved (each rank holding 1/share_a of every expert tensor), resumed under
 * layout b (1/share_b; a share of 0: that layout's experts are data parallel's, not checked) for
 * 6 more: all 10 losses equal the reference sl (the single rank's, or a straight run of the
 * same global batch; 1e-5). */
static void reshard_run(const char *what, hp_config_t *a, hp_config_t *b, hp_comm_t world, const char *ck, int share_a,
                        int share_b, const double *sl) {
    double fl[N];
    hp_config_t *cs[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        snprintf(cs[k]->job.dump_folder, sizeof cs[k]->job.dump_folder, "%.200s/%s", dir_, ck);
        cs[k]->checkpoint.enable = true;
        cs[k]->checkpoint.interval = 4;
        cs[k]->checkpoint.last_save_model_only = false;
    }
    hp_trainer_t t = NULL;
    HP_CHECK_OK(hp_trainer_create(a, world, &t));
    if (t && share_a > 0) check_expert_share(t, share_a, what);
    if (t) hp_test_steps(t, 4, fl, NULL);
    if (t) hp_trainer_destroy(t);
    t = NULL;
    HP_CHECK_OK(hp_trainer_create(b, world, &t));
    if (t) {
        HP_CHECK(hp_trainer_current_step(t) == 4, "%s: resume at step %lld, expected 4", what,
                 (long long)hp_trainer_current_step(t));
        if (share_b > 0) check_expert_share(t, share_b, what);
        hp_test_steps(t, N - 4, fl + 4, NULL);
        hp_trainer_destroy(t);
    }
    char w[200];
    snprintf(w, sizeof w, "checkpoint %s at step 4", what);
    hp_test_compare_runs(w, N, fl, sl, NULL, NULL, 1e-5, 0);
}

/* One layout against the single-rank run of its global batch (losses 1e-5, norms 1e-4: see the
 * top), or (needle set) a config that must be refused. */
typedef struct {
    int ws;                          /* the world size it runs on */
    const char *model;
    int rep, shard, tp, ep, etp;     /* set_ep's */
    int cp, sp, pp;                  /* 0: 1, off, 1 */
    const char *sched;               /* the pipeline schedule (NULL: the default) */
    int route, experts, batch;       /* moe_route_scale, moe_num_experts, local batch (0: moe_config's) */
    int dp;                          /* data-parallel ranks: the token files of dp (0: the corpus) */
    int lr;                          /* also the negative test (STYLE rule 17): lr x 1.001 leaves the 1e-5 bound */
    const char *ck;                  /* then 4 steps saved under it and resumed with ep to_ep, etp to_etp: */
    int to_ep, to_etp, share_a, share_b;   /* all 10 losses are the single rank's (reshard_run) */
    const char *env;                 /* "NAME=value" around a refusal */
    hp_status_t status;
    const char *needle;
} ep_case_t;

#define DS "deepseek_v3"
#define QM "qwen3_moe"
#define L(w, m, r, s, t, e, x) .ws = w, .model = m, .rep = r, .shard = s, .tp = t, .ep = e, .etp = x
#define PP(s) .pp = 2, .sched = s
/* the same layout for both flavors */
#define BOTH(w, r, s, t, e, x, ...) {L(w, DS, r, s, t, e, x), __VA_ARGS__}, {L(w, QM, r, s, t, e, x), __VA_ARGS__}

static const ep_case_t cases[] = {
    /* 8 ranks: ETP x expert FSDP (dense TP 2 x FSDP 4; experts efsdp 2 x ep 2 x etp 2, Shard(0)), where
     * SP is refused by key; ep 4 x etp 2 (efsdp 1) + SP; dense TP 2 x HSDP (2, 2) with ep 4 over
     * dp_shard x tp, summed over dp_replicate; HSDP (2, 4) with ep 2 x efsdp 2; cp 2 x dp_shard 2 x tp 2
     * with (efsdp 2, ep 2) over dp_shard 2 x cp 2; both flavors */
    BOTH(8, 1, 4, 2, 2, 2, .dp = 4),
    BOTH(8, 1, 4, 2, 2, 2, .sp = 1, .dp = 4, .status = HP_ERR_UNSUPPORTED,
         .needle = "'parallelism.enable_sequence_parallel' = true with expert FSDP degree 2"),
    BOTH(8, 1, 4, 2, 4, 2, .sp = 1, .dp = 4),
    BOTH(8, 2, 2, 2, 4, 1, .sp = 1, .dp = 4),
    BOTH(8, 2, 4, 1, 2, 1, .dp = 8),
    BOTH(8, 1, 2, 2, 2, 2, .cp = 2, .dp = 2),
    /* 2 experts on efsdp 2 x ep 2 x etp 2 (efsdp x ep > E: Shard(1), w1/w3's F slice of etp split
     * again over efsdp, _StridedShard(1, etp)): each rank holds 1/8 of every expert tensor; 4 steps
     * saved under it resume under dp_shard 4 x tp 2 with ep 1 (the experts TP on F alone) */
    {L(8, QM, 1, 4, 2, 2, 2), .experts = 2, .dp = 4, .ck = "ck_etp", .to_ep = 1, .to_etp = 1, .share_a = 8,
     .share_b = 2},
    /* inside pipeline stages (1F1B; route scale 24 as on 4 ranks): pp 2 x ETP (ep 2 x tp 2, dense TP 2 x
     * FSDP 2) for both flavors, pp 2 x ep 2 x efsdp 2 (dense FSDP 4) and pp 2 x HSDP 2 x 2 with ep 2 (expert
     * grads summed over dp_replicate inside the stage) */
    BOTH(8, 1, 2, 2, 2, 2, PP("1F1B"), .route = 24, .dp = 2),
    {L(8, DS, 1, 4, 1, 2, 1), PP("1F1B"), .route = 24, .dp = 4},
    {L(8, QM, 2, 2, 1, 2, 1), PP("1F1B"), .route = 24, .dp = 4},

    /* 2 and 4 ranks: ep = world, and ep 2 x efsdp 2 on 4 ranks (qwen3_moe: and the lr x 1.001 run) */
    {L(2, DS, 1, 2, 1, 2, 1), .dp = 2}, {L(2, QM, 1, 2, 1, 2, 1), .dp = 2, .lr = 1},
    {L(4, DS, 1, 4, 1, 4, 1), .dp = 4}, {L(4, DS, 1, 4, 1, 2, 1), .dp = 4},
    {L(4, QM, 1, 4, 1, 4, 1), .dp = 4, .lr = 1}, {L(4, QM, 1, 4, 1, 2, 1), .dp = 4},
    /* 2 ranks: sequence parallel around the MoE layers (the MoE input Shard(seq) over tp 2, dp 1): TP 2
     * + SP with the experts on F/2 (rows to both tp ranks, partials summed), and ep 2 borrowing the tp
     * ranks (etp 1: each routes its own shard), refused without SP (every token would be dispatched
     * tp times) */
    {L(2, DS, 1, 1, 2, 1, 1), .sp = 1, .dp = 1}, {L(2, DS, 1, 1, 2, 2, 1), .sp = 1, .dp = 1},
    {L(2, QM, 1, 1, 2, 1, 1), .sp = 1, .dp = 1}, {L(2, QM, 1, 1, 2, 2, 1), .sp = 1, .dp = 1, .lr = 1},
    {L(2, QM, 1, 1, 2, 2, 1), .dp = 1, .status = HP_ERR_UNSUPPORTED,
     .needle = "'parallelism.enable_sequence_parallel' = false"},
    /* context parallel of an MoE model: cp 2 x ep 2 (ep over the cp ranks), and cp 2 with ep 1 */
    {L(2, QM, 1, 1, 1, 2, 1), .cp = 2, .dp = 1}, {L(2, QM, 1, 1, 1, 1, 1), .cp = 2, .dp = 1},

    /* 4 ranks: ETP, experts over [ep 2, tp 2], dense TP 2 x FSDP 2; the same with SP (rows to the F
     * slices' 2 ranks); ep 4 over dp_shard 2 x tp 2 (etp 1) + SP; ep borrowing tp with expert FSDP
     * (ep 2 < dp_shard x tp) is refused by key */
    BOTH(4, 1, 2, 2, 2, 2, .dp = 2), BOTH(4, 1, 2, 2, 2, 2, .sp = 1, .dp = 2),
    {L(4, DS, 1, 2, 2, 4, 1), .sp = 1, .dp = 2}, {L(4, QM, 1, 2, 2, 4, 1), .sp = 1, .dp = 2, .lr = 1},
    {L(4, QM, 1, 2, 2, 2, 1), .sp = 1, .dp = 2, .status = HP_ERR_UNSUPPORTED,
     .needle = "expert_parallel_degree = data_parallel_shard_degree x context_parallel_degree x "
               "tensor_parallel_degree"},
    /* pipeline parallel with data parallel: pp 2 x FSDP 2 (deepseek_v3) and pp 2 x DDP 2 (qwen3_moe),
     * 1F1B, bias update on (counts summed over dp and pp) */
    {L(4, DS, 1, 2, 1, 1, 1), PP("1F1B"), .dp = 2}, {L(4, QM, 2, 1, 1, 1, 1), PP("1F1B"), .dp = 2},
    /* pipeline parallel x expert parallel / x TP, bias update on (counts summed over the stage's dp x
     * ep ranks, rows of each stage's layers gathered over pp): pp 2 x ep 2 (dense FSDP 2 in each
     * stage, experts ep 2) under 1F1B and under InterleavedZeroBubble (2 stages per rank, I/W split:
     * the all-to-alls of backward_input and the expert grads of backward_weight run apart), and pp 2
     * x tp 2 (dense TP plan, experts TP on their hidden dim) under 1F1B; the route scale lifts the
     * experts' share of the norm above its 1e-4 bound, so a norm that misses a stage's experts fails */
    {L(4, DS, 1, 2, 1, 2, 1), PP("1F1B"), .route = 24, .dp = 2, .lr = 1},
    {L(4, DS, 1, 2, 1, 2, 1), PP("InterleavedZeroBubble"), .route = 24, .dp = 2},
    {L(4, DS, 1, 1, 2, 1, 1), PP("1F1B"), .route = 24, .dp = 1, .lr = 1},
    {L(4, QM, 1, 2, 1, 2, 1), PP("1F1B"), .route = 24, .dp = 2},
    {L(4, QM, 1, 2, 1, 2, 1), PP("InterleavedZeroBubble"), .route = 24, .dp = 2},
    {L(4, QM, 1, 1, 2, 1, 1), PP("1F1B"), .route = 24, .dp = 1},
    /* the V schedules with EP inside the stages: ZBVZeroBubble (2 micro-batches) and DualPipeV (at
     * least as many micro-batches as its 4 stages: local batch 4) */
    {L(4, DS, 1, 2, 1, 2, 1), PP("ZBVZeroBubble"), .route = 24, .dp = 2},
    {L(4, QM, 1, 2, 1, 2, 1), PP("DualPipeV"), .route = 24, .batch = 4, .dp = 2},
    /* what stays refused under PP x EP: the runtime's second thread (HP_PP_OVERLAP=thread) would issue
     * EP's all-to-alls in a rank-dependent order; context parallel of an MoE model inside pipeline
     * stages; ETP without expert parallel */
    {L(4, QM, 1, 2, 1, 2, 1), .pp = 2, .env = "HP_PP_OVERLAP=thread", .status = HP_ERR_UNSUPPORTED,
     .needle = "expert_parallel_degree 2: FSDP, TP and EP"},
    {L(4, QM, 1, 1, 1, 1, 1), .pp = 2, .cp = 2, .status = HP_ERR_UNSUPPORTED,
     .needle = "parallelism.context_parallel_degree 2 with the MoE model qwen3_moe and "
               "parallelism.pipeline_parallel_degree 2 is not supported yet"},
    {L(4, QM, 1, 2, 2, 1, 2), .status = HP_ERR_UNSUPPORTED,
     .needle = "'parallelism.expert_tensor_parallel_degree' = 2: expert tensor parallel needs "
               "expert_parallel_degree > 1"},
    /* context parallel x EP: ep borrows from dp_shard x cp, each cp rank routing its sequence shard: cp 2
     * x dp_shard 2 with ep 2 x efsdp 2 (efsdp spans the cp ranks) and with ep 4 (ep spans dp_shard x cp;
     * saved there with 2 experts per rank, resumed with ep 1: FSDP over dp_shard x cp); ETP with cp: ep
     * 2 over the cp ranks x etp 2 (efsdp 1) */
    BOTH(4, 1, 2, 1, 2, 1, .cp = 2, .dp = 2),
    {L(4, QM, 1, 2, 1, 4, 1), .cp = 2, .dp = 2, .ck = "ck_cp", .to_ep = 1, .to_etp = 1, .share_a = 4},
    {L(4, QM, 1, 1, 2, 2, 2), .cp = 2, .dp = 1},
    /* 2 experts over ep 2 x efsdp 2: efsdp x ep > E, the experts FSDP-sharded on dim 1 (Shard(1)) */
    {L(4, QM, 1, 4, 1, 2, 1), .experts = 2, .dp = 4},
};

static void case_config(hp_config_t *f, const ep_case_t *k) {
    moe_config(f, k->ws, k->model);
    set_ep(f, k->rep, k->shard, k->tp, k->ep, k->etp);
    if (k->cp) f->parallelism.context_parallel_degree = k->cp;
    f->parallelism.enable_sequence_parallel = k->sp;
    if (k->pp) f->parallelism.pipeline_parallel_degree = k->pp;
    if (k->sched)
        snprintf(f->parallelism.pipeline_parallel_schedule, sizeof f->parallelism.pipeline_parallel_schedule, "%s",
                 k->sched);
    if (k->route) f->model.moe_route_scale = k->route;
    if (k->experts) f->model.moe_num_experts = k->experts;
    if (k->batch) f->training.local_batch_size = k->batch;
    if (k->dp) hp_test_use_bin(f, 'x', k->dp);
}

static void case_name(char *what, size_t n, const ep_case_t *k) {
    snprintf(what, n, "%s dp %d x %d, tp %d%s, ep %d x etp %d", k->model, k->rep, k->shard, k->tp, k->sp ? " + SP" : "",
             k->ep, k->etp);
    if (k->cp) snprintf(what + strlen(what), n - strlen(what), ", cp %d", k->cp);
    if (k->pp) snprintf(what + strlen(what), n - strlen(what), ", pp %d %s", k->pp, k->sched ? k->sched : "");
    if (k->experts) snprintf(what + strlen(what), n - strlen(what), ", %d experts", k->experts);
    if (k->batch) snprintf(what + strlen(what), n - strlen(what), ", local batch %d", k->batch);
}

static void run_case(hp_comm_t world, const ep_case_t *k) {
    hp_config_t *f = calloc(1, sizeof *f);
    char what[300];
    case_name(what, sizeof what, k);
    if (k->dp) ensure_bins(world, k->dp, k->batch ? k->batch : B);
    case_config(f, k);
    if (k->needle) {
        char name[64] = "";
        if (k->env) {
            snprintf(name, sizeof name, "%.*s", (int)(strchr(k->env, '=') - k->env), k->env);
            setenv(name, strchr(k->env, '=') + 1, 1);
        }
        hp_trainer_t t = NULL;
        HP_CHECK_ERR(hp_trainer_create(f, world, &t), k->status, k->needle);
        hp_trainer_destroy(t);
        if (k->env) unsetenv(name);
        free(f);
        return;
    }
    double sl[N], sn[N], fl[N], fn[N];
    solo_steps(f, world, k->dp, sl, sn);
    hp_test_train_steps(f, world, N, fl, fn, 0);
    hp_test_compare_runs(what, N, fl, sl, fn, sn, 1e-5, 1e-4);
    if (k->lr) {
        hp_config_t *g = calloc(1, sizeof *g);
        *g = *f;
        g->optimizer.lr *= 1.001;
        hp_test_train_steps(g, world, N, fl, fn, 0);
        HP_CHECK(hp_test_any_outside(fl, sl, N, 1e-5), "negative test: lr x 1.001 under %s stays within the 1e-5 loss "
                 "tolerance", what);
        free(g);
    }
    if (k->ck) {
        hp_config_t *b = calloc(1, sizeof *b);
        *b = *f;
        b->parallelism.expert_parallel_degree = k->to_ep;
        b->parallelism.expert_tensor_parallel_degree = k->to_etp;
        reshard_run(what, f, b, world, k->ck, k->share_a, k->share_b, sl);
        free(b);
    }
    free(f);
}

/* Under EP fully_shard owns the dense params (storage released, gathered per unit) while the
 * experts stay the model's own ep shards. */
static void dense_fsdp_managed(hp_comm_t world, int ws) {
    hp_config_t *f = calloc(1, sizeof *f);
    moe_config(f, ws, QM);
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
    free(f);
}

/* 2 ranks: gradient accumulation (2 micro-batches of B) with full AC under ep 2 borrowing tp 2 +
 * SP == the single rank's batch of 2 B: the router / shared-expert grads are summed over tp once,
 * after both. */
static void borrow_accum(hp_comm_t world) {
    hp_config_t *c = calloc(1, sizeof *c);
    double dl[N], dn[N], fl[N], fn[N];
    ensure_bins(world, 1, B);
    moe_config(c, 1, "qwen3_moe");
    hp_test_use_bin(c, 'x', 1);
    c->training.local_batch_size = 2 * B;
    hp_comm_t solo = hp_test_first_ranks(world, 1);
    hp_test_run_on(c, solo, world, N / 2, dl, dn, NULL);
    hp_comm_destroy(solo);
    set_ep(c, 1, 1, 2, 2, 1);
    c->parallelism.enable_sequence_parallel = true;
    c->training.local_batch_size = B;
    c->training.global_batch_size = 2 * B;
    snprintf(c->activation_checkpoint.mode, sizeof c->activation_checkpoint.mode, "full");
    hp_test_train_steps(c, world, N / 2, fl, fn, 0);
    hp_test_compare_runs("ep 2 borrowing tp 2 + SP, accumulation 2, full AC vs one rank", N / 2, fl, dl, fn, dn, 1e-5,
                         1e-4);
    free(c);
}

/* 2 ranks: a checkpoint saved under ep 2 borrowing tp 2 (experts Shard(0) over ep) resumes under
 * tp 2 + SP with EP 1 (experts Shard(F) over tp): 4 + 6 steps == 10 straight steps of the second
 * layout (1e-5). */
static void borrow_reshard(hp_comm_t world) {
    hp_config_t *c = calloc(1, sizeof *c);
    double dl[N], dn[N];
    ensure_bins(world, 1, B);
    moe_config(c, 2, "deepseek_v3");
    set_ep(c, 1, 1, 2, 1, 1);
    c->parallelism.enable_sequence_parallel = true;
    hp_test_use_bin(c, 'x', 1);
    hp_test_train_steps(c, world, N, dl, dn, 0);
    hp_config_t *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    *a = *c;
    a->parallelism.expert_parallel_degree = 2;
    *b = *c;   // experts 1/2 per rank in both: Shard(0) over ep, then Shard(F) over tp
    reshard_run("ep 2 borrowing tp 2 -> tp 2 + SP", a, b, world, "ck_borrow", 2, 2, dl);
    free(b);
    free(a);
    free(c);
}

/* 4 ranks: the experts held per rank under pp 2 x ep 2 and pp 2 x tp 2: 1/ep of the experts, 1/tp
 * of their hidden dim, of the stage's MoE layers only. */
static void pp_expert_shares(hp_comm_t world, int ws) {
    const int rank = hp_comm_rank(world);
    hp_config_t *f = calloc(1, sizeof *f);
    for (int k = 0; k < 2; k++) {
        moe_config(f, ws, "qwen3_moe");
        if (k == 0) set_ep(f, 1, 2, 1, 2, 1);
        else set_ep(f, 1, 1, 2, 1, 1);
        f->parallelism.pipeline_parallel_degree = 2;
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(f, world, &t));
        if (!t) continue;
        const hp_model_t m = hp_trainer_model(t);   // this rank's stage
        int n_exp = 0, bad = 0;
        for (int i = 0; i < hp_model_num_params(m); i++) {
            const hp_param_t *q = &hp_model_params(m)[i];
            if (!strstr(q->name, ".moe.experts.")) continue;
            n_exp++;
            const int w2 = strstr(q->name, ".w2") != NULL;
            const int64_t e = q->value.local.shape[0], fdim = q->value.local.shape[w2 ? 2 : 1];
            const int64_t want_e = k == 0 ? 8 / 2 : 8, want_f = k == 0 ? 32 : 32 / 2;
            bad |= e != want_e || fdim != want_f || hp_tensor_numel(&q->value.local) * 2 !=
                   q->value.global_shape[0] * q->value.global_shape[1] * q->value.global_shape[2];
        }
        // each stage holds its own MoE layers' experts: (w1, w2, w3) per MoE layer over the two
        // stages, held by each of a stage's 2 ranks
        int32_t all = n_exp;
        HP_CHECK_OK(hp_all_reduce(&all, &all, 1, HP_I32, HP_SUM, world, NULL));
        int n_moe = 0;   // the flavor's MoE layers (qwen3_moe's debugmodel: layer 0 dense)
        for (int l = 0; l < 3; l++) n_moe += hp_model_layer_is_moe(hp_model_config(m), l);
        HP_CHECK(n_exp > 0 && all == 2 * 3 * n_moe && !bad, "pp 2 x %s 2 rank %d: %d expert tensors here, %d on "
                 "all ranks (expected %d); local shapes %s1/%s", k == 0 ? "ep" : "tp", rank, n_exp, (int)all,
                 6 * n_moe, bad ? "not " : "", k == 0 ? "ep" : "tp");
        hp_trainer_destroy(t);
    }
    free(f);
}

/* 4 ranks: checkpoints reshard between pp 2 x ep 2 (world) and DP 2 on ranks 0 and 1 (both dp 2,
 * the same rows): 4 steps under one, saved; resumed at step 4 under the other for 6 steps (the
 * per-rank dataloader blob is not loaded across world sizes: every resume reads the data from its
 * start), against DP 2 resumed from its own step 4 (1e-5): the experts and each stage's
 * expert_bias are gathered from / split into the stages. */
static void pp_ckpt_reshard(hp_comm_t world) {
    const int rank = hp_comm_rank(world);
    hp_comm_t two = hp_test_first_ranks(world, 2);
    double ref[N], got[2][N];
    float bias[3][3 * 8];   // resumes k = 2, 3, 4: expert_bias of layers 0..2 held here after loading (E = 8)
    int held[3][3];
    memset(held, 0, sizeof held);
    hp_config_t *run = calloc(1, sizeof *run);
    for (int k = 0; k < 5; k++) {   // DP 2 save, pp x ep save, DP 2 <- DP 2, DP 2 <- pp x ep, pp x ep <- DP 2
        static const int from[5] = {-1, -1, 0, 1, 0}, pp_run[5] = {0, 1, 0, 0, 1};
        moe_config(run, 2, "qwen3_moe");
        run->checkpoint.enable = true;
        run->checkpoint.interval = from[k] < 0 ? 4 : 1000;
        run->checkpoint.last_save_model_only = false;
        // a resume reads step 4 of the first runs' folder (and saves its last step there); each run
        // writes its final weights to its own folder
        snprintf(run->job.dump_folder, sizeof run->job.dump_folder, "%.240s/outpp%d", dir_, k);
        snprintf(run->checkpoint.folder, sizeof run->checkpoint.folder, "%.240s/ckpp%d", dir_,
                 from[k] < 0 ? k : from[k]);
        if (from[k] >= 0) {
            run->checkpoint.load_step = 4;
            run->checkpoint.exclude_from_loading.n = 1;
            snprintf(run->checkpoint.exclude_from_loading.items[0], HP_CONFIG_STR_MAX, "dataloader");
        }
        if (pp_run[k]) {
            set_ep(run, 1, 2, 1, 2, 1);
            run->parallelism.pipeline_parallel_degree = 2;
        }
        double *out = k == 0 ? ref : k == 1 ? got[0] : k == 2 ? ref + 4 : k == 3 ? got[0] + 4 : got[1] + 4;
        hp_comm_t comm = pp_run[k] ? world : two;
        hp_trainer_t t = NULL;
        if (comm) HP_CHECK_OK(hp_trainer_create(run, comm, &t));
        if (t) {
            HP_CHECK(hp_trainer_current_step(t) == (from[k] < 0 ? 0 : 4), "run %d starts at step %lld", k,
                     (long long)hp_trainer_current_step(t));
            hp_module_t *mods[512];
            const int nm = from[k] < 0 ? 0 : hp_model_modules(hp_trainer_model(t), mods, 512);
            for (int i = 0; i < nm && i < 512; i++) {
                if (!hp_module_is_moe(mods[i])) continue;
                const int l = atoi(mods[i]->name + 7);   // "layers.N.moe"
                memcpy(bias[k - 2] + 8 * l, ((hp_moe_impl_t *)mods[i]->impl)->expert_bias, sizeof(float) * 8);
                held[k - 2][l] = 1;
            }
            for (int i = 0; i < (from[k] < 0 ? 4 : N - 4); i++) {
                hp_step_stats_t st;
                HP_CHECK_OK(hp_trainer_step(t, &st));
                out[i] = st.loss;
            }
            if (from[k] >= 0) HP_CHECK_OK(hp_trainer_train(t));   // no steps left: the final weights
            hp_trainer_destroy(t);
        }
        HP_CHECK_OK(hp_broadcast(out, from[k] < 0 ? 4 : N - 4, HP_I64, 0, world, NULL));
    }
    memcpy(got[1], ref, sizeof(double) * 4);
    // the loaded expert_bias (sign updates, so equal unless a count ties) is the DP run's: from the
    // pp 2 x ep 2 save on DP 2, and split into each stage from the DP 2 save
    HP_CHECK_OK(hp_broadcast(bias[0], 3 * 8, HP_F32, 0, world, NULL));
    HP_CHECK_OK(hp_broadcast(held[0], 3, HP_I32, 0, world, NULL));
    int n_held = 0, n_ref = 0;
    for (int l = 0; l < 3; l++) {
        n_ref += held[0][l];
        for (int k = 1; k < 3; k++) {
            n_held += held[k][l];
            for (int e = 0; held[k][l] && e < 8; e++)
                HP_CHECK(held[0][l] && fabsf(bias[k][8 * l + e] - bias[0][8 * l + e]) <= 1e-6f,
                         "resume %s layer %d expert %d: expert_bias %.7g, the DP 2 resume's %.7g",
                         k == 1 ? "pp 2 x ep 2 -> DP 2" : "DP 2 -> pp 2 x ep 2", l, e, bias[k][8 * l + e],
                         bias[0][8 * l + e]);
        }
    }
    HP_CHECK(n_ref > 0 && n_held > 0, "no MoE layer's expert_bias compared (%d, %d)", n_ref, n_held);
    // the final weights files hold the full model (the MoE keys in their metadata): pp 2 x ep 2's (each
    // stage's experts gathered over ep, sent to rank 0) and the DP 2 resume's equal the DP 2 -> DP 2
    // file within Adam's lr x 1e-3 per step near zero gradients (see the top), over 10 steps
    hp_barrier(world, NULL);
    if (rank == 0) {
        hp_model_t wm[3] = {NULL, NULL, NULL};
        for (int k = 0; k < 3; k++) {
            char wp[400];
            snprintf(wp, sizeof wp, "%.240s/outpp%d/weights.safetensors", dir_, k + 2);
            HP_CHECK_OK(hp_model_load_weights(wp, 1, T, &wm[k]));
        }
        for (int k = 1; k < 3 && wm[0]; k++) {
            if (!wm[k]) continue;
            double dmax = 0;
            int n_cmp = 0;
            for (int i = 0; i < hp_model_num_params(wm[0]); i++) {
                const hp_param_t *a = &hp_model_params(wm[0])[i], *q = hp_model_find_param(wm[k], a->name);
                HP_CHECK(q && hp_tensor_numel(&q->value.local) == hp_tensor_numel(&a->value.local),
                         "final weights: '%s' missing or of another size", a->name);
                if (!q || hp_tensor_numel(&q->value.local) != hp_tensor_numel(&a->value.local)) continue;
                n_cmp += strstr(a->name, ".moe.experts.") != NULL;
                const float *x = a->value.local.data, *y = q->value.local.data;
                for (int64_t j = 0; j < hp_tensor_numel(&a->value.local); j++)
                    dmax = fmax(dmax, fabs(x[j] - y[j]));
            }
            HP_CHECK(dmax <= N * run->optimizer.lr * 1e-3 && n_cmp > 0, "final weights of %s: max |diff| %.3g "
                     "from DP 2's (%d expert tensors)", k == 1 ? "pp 2 x ep 2 -> DP 2" : "DP 2 -> pp 2 x ep 2",
                     dmax, n_cmp);
            printf("final weights of %s: max |diff| %.2g from DP 2 -> DP 2's\n",
                   k == 1 ? "pp 2 x ep 2 -> DP 2" : "DP 2 -> pp 2 x ep 2", dmax);
        }
        for (int k = 0; k < 3; k++) hp_model_destroy(wm[k]);
    }
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < N; i++) HP_CHECK_CLOSE(got[d][i], ref[i], 1e-5, 0.0);
    if (rank == 0)
        printf("checkpoint pp 2 x ep 2 -> DP 2 and DP 2 -> pp 2 x ep 2 at step 4: loss %.6f and %.6f at step 10 "
               "(DP 2 -> DP 2 %.6f)\n", got[0][N - 1], got[1][N - 1], ref[N - 1]);
    free(run);
    hp_comm_destroy(two);
}

/* 4 ranks: gradient accumulation (2 steps of the schedule per optimizer step), full AC (the
 * recompute dispatches again) and validation (hp_pp_eval through the stages) under pp 2 x ep 2 ==
 * DP 2 on ranks 0 and 1 (the same rows: both dp 2; 1e-5 on the losses and the validation loss). */
static void pp_accum(hp_comm_t world) {
    const int rank = hp_comm_rank(world);
    hp_config_t *c = calloc(1, sizeof *c);
    double dl[N], fl[N];
    hp_comm_t two = hp_test_first_ranks(world, 2);
    double vl[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        moe_config(c, 2, "deepseek_v3");
        c->training.global_batch_size = 2 * B * 2;
        c->validation.enable = true;
        c->validation.steps = 2;
        snprintf(c->activation_checkpoint.mode, sizeof c->activation_checkpoint.mode, "full");
        if (k) {
            set_ep(c, 1, 2, 1, 2, 1);
            c->parallelism.pipeline_parallel_degree = 2;
        }
        double *out = k ? fl : dl;
        hp_trainer_t t = NULL;
        if (k || two) HP_CHECK_OK(hp_trainer_create(c, k ? world : two, &t));
        for (int i = 0; t && i < 4; i++) {
            hp_step_stats_t st;
            HP_CHECK_OK(hp_trainer_step(t, &st));
            out[i] = st.loss;
        }
        if (t) HP_CHECK(hp_trainer_grad_accum(t) == 2, "grad accumulation %lld, expected 2",
                        (long long)hp_trainer_grad_accum(t));
        if (t) HP_CHECK_OK(hp_trainer_validate(t, &vl[k]));
        if (t) hp_trainer_destroy(t);
    }
    HP_CHECK_OK(hp_broadcast(dl, 4, HP_I64, 0, world, NULL));
    HP_CHECK_OK(hp_broadcast(vl, 1, HP_I64, 0, world, NULL));
    for (int i = 0; i < 4; i++) HP_CHECK_CLOSE(fl[i], dl[i], 1e-5, 0.0);
    HP_CHECK(isfinite(vl[0]) && fabs(vl[1] - vl[0]) <= 1e-5 * fabs(vl[0]), "validation under pp 2 x ep 2 %.7g, "
             "DP 2 %.7g", vl[1], vl[0]);
    if (rank == 0)
        printf("pp 2 x ep 2 with grad accumulation 2, full AC: loss %.6f at step 4 (DP 2 %.6f), validation %.6f "
               "(DP 2 %.6f)\n", fl[3], dl[3], vl[1], vl[0]);
    hp_comm_destroy(two);
    free(c);
}

/* 2 and 4 ranks: gradient accumulation (2 micro-batches per step) and validation under EP. */
static void ep_accum(hp_comm_t world, int ws) {
    hp_config_t *c = calloc(1, sizeof *c), *f = calloc(1, sizeof *f);
    double dl[N], dn[N], fl[N], fn[N];
    moe_config(c, ws, "qwen3_moe");
    c->training.global_batch_size = 2 * 2 * ws;
    c->validation.enable = true;
    hp_test_train_steps(c, world, 4, dl, dn, 1);
    *f = *c;
    f->parallelism.data_parallel_replicate_degree = 1;
    f->parallelism.data_parallel_shard_degree = ws;
    f->parallelism.expert_parallel_degree = ws;
    hp_test_train_steps(f, world, 4, fl, fn, 1);
    hp_test_close_steps("EP, accumulation 2", fl, dl, 4, 1e-5);
    // and with full activation checkpointing (the recompute dispatches again)
    snprintf(f->activation_checkpoint.mode, sizeof f->activation_checkpoint.mode, "full");
    hp_test_train_steps(f, world, 4, fl, fn, 0);
    hp_test_close_steps("EP, accumulation 2, full AC", fl, dl, 4, 1e-5);
    free(f);
    free(c);
}

/* 2 and 4 ranks: checkpoints reshard between layouts: 4 steps under EP, resume under replicated DP
 * (and the reverse) for 6 more == 10 straight steps of the other layout (same 1e-5 bound). */
static void ep_dp_reshard(hp_comm_t world, int ws) {
    hp_config_t *c = calloc(1, sizeof *c);
    double dl[N], dn[N];
    for (int dir = 0; dir < 2; dir++) {
        moe_config(c, ws, "deepseek_v3");
        hp_test_train_steps(c, world, N, dl, dn, 0);   // DP reference
        hp_config_t *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
        *a = *c;
        *b = *c;
        hp_config_t *epc = dir == 0 ? a : b;   // dir 0: EP first, DP second; dir 1: the reverse
        epc->parallelism.data_parallel_replicate_degree = 1;
        epc->parallelism.data_parallel_shard_degree = ws;
        epc->parallelism.expert_parallel_degree = ws == 4 ? 2 : ws;   // 4 ranks: ep 2 x efsdp 2 (strided shards)
        const int share = ws;   // ep x efsdp = ws: every expert tensor 1/ws per rank; DP's are fully_shard's
        reshard_run(dir == 0 ? "EP -> DP" : "DP -> EP", a, b, world, dir == 0 ? "ck0" : "ck1", dir == 0 ? share : 0,
                    dir == 0 ? 0 : share, dl);
        free(a);
        free(b);
    }
    free(c);
}

/* Bad EP input, named by key. */
static void bad_keys(hp_comm_t world, int ws) {
    hp_config_t *c = calloc(1, sizeof *c);
    hp_trainer_t t = NULL;
    moe_config(c, ws, "qwen3_moe");
    c->parallelism.data_parallel_replicate_degree = 1;
    c->parallelism.data_parallel_shard_degree = ws;
    c->parallelism.expert_parallel_degree = ws;
    c->model.moe_num_experts = 6;
    if (ws == 4)
        HP_CHECK_ERR(hp_trainer_create(c, world, &t), HP_ERR_INVALID_ARG,
                     "'parallelism.expert_parallel_degree' = 4 must divide");
    moe_config(c, ws, "llama3");
    c->model.moe_num_experts = -1;
    c->model.moe_top_k = -1;
    c->model.moe_hidden_dim = -1;
    c->model.moe_load_balance_coeff = -1;
    c->parallelism.data_parallel_replicate_degree = 1;
    c->parallelism.data_parallel_shard_degree = ws;
    c->parallelism.expert_parallel_degree = ws;
    HP_CHECK_ERR(hp_trainer_create(c, world, &t), HP_ERR_INVALID_ARG, "needs an MoE model");
    free(c);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_config_t *c = NULL;
    hp_comm_t world = hp_test_corpus_init(&argc, &argv, "hp_test_trainer_ep", &rank, &ws, &c);
    if (ws != 8) dense_fsdp_managed(world, ws);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        if (cases[k].ws == ws) run_case(world, &cases[k]);
    if (ws == 2) {
        borrow_accum(world);
        borrow_reshard(world);
    }
    if (ws == 4) {
        pp_expert_shares(world, ws);
        pp_ckpt_reshard(world);
        pp_accum(world);
    }
    if (ws != 8) {
        ep_accum(world, ws);
        ep_dp_reshard(world, ws);
        bad_keys(world, ws);
    }
    for (int i = 0; i < n_solos; i++) free(solos[i].c);
    free(c);
    return hp_test_corpus_finish(world, "test_trainer_ep");
}
