/* Pipeline parallel runtime (src/parallel/pp.c): on pp = 2 and 4 ranks, GPipe, 1F1B,
 * Interleaved1F1B and LoopedBFS over micro-batch counts 2..8, llama3 and qwen3 (tied), stage
 * models that hold only their units give the single-rank model's loss and gradients (the
 * parity engine of test_dp_util.h: the reference runs every micro-batch of the step from zero
 * gradients on the whole model; a stage's gradient is those partials added in the schedule's
 * order, within gamma_n * sum|partials| + u |sum| of their exact sum, n = micro-batches, as
 * any summation order of n terms; the loss within two f32 roundings of its partials). A
 * corrupted gradient (1 ulp-scale relative error 2^-12 on one element) must fail that check.
 * Per-rank parameter bytes are 1/pp of the model plus the embedding / head imbalance; the
 * split rule and its errors are TorchTitan's. HyperParallel's MPipeTranspose (helpers' replica
 * forwards, stage 0's transposed F / B) passes the same parity check at T = 0 and 1. */
// hp-test: ranks 1 2 4   timeout 600
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "test_dp_util.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/pp.h"
#include "hyperparallel/pp_schedule.h"

enum { MBS = 1, TT = 8 };

static void split_tests(void) {
    int lo[HP_PP_MAX_STAGES + 1], ns = 0;
    // TorchTitan's examples (llama3 debugmodel, 6 layers): pp 2 1F1B -> [emb, 0-2] | [3-5, norm, output]
    HP_CHECK_OK(hp_pp_split_layers(6, 2, 1, 1, lo));
    HP_CHECK(lo[0] == 0 && lo[1] == 4 && lo[2] == 8, "pp2 split %d %d %d", lo[0], lo[1], lo[2]);
    // pp 4 Interleaved1F1B: 8 stages [emb] [l0] ... [l5] [norm, output]
    HP_CHECK_OK(hp_pp_split_layers(6, 8, 1, 1, lo));
    for (int s = 0; s <= 8; s++) HP_CHECK(lo[s] == s, "8-stage split: stage %d starts at unit %d", s, lo[s]);
    // 32 layers, 8 stages: 34 effective, 4 each, the first 2 one more: emb + layers 0-3 | 4-8 |
    // 9-12 ... | 29-31 + head
    HP_CHECK_OK(hp_pp_split_layers(32, 8, 1, 1, lo));
    HP_CHECK(lo[1] == 5 && lo[2] == 10 && lo[7] == 30 && lo[8] == 34, "32/8 split %d %d %d %d", lo[1], lo[2], lo[7], lo[8]);
    // 27 layers, 4 stages: remainder to the first stages (7 + 1 extra): emb + 0-6 | 7-13 | 14-20 | 21-26 + head
    HP_CHECK_OK(hp_pp_split_layers(27, 4, 1, 1, lo));
    HP_CHECK(lo[1] == 8 && lo[2] == 15 && lo[3] == 22 && lo[4] == 29, "27/4 split %d %d %d %d", lo[1], lo[2], lo[3], lo[4]);
    HP_CHECK_ERR(hp_pp_split_layers(2, 8, 1, 1, lo), HP_ERR_INVALID_ARG, "cannot be greater than effective layers");
    HP_CHECK_ERR(hp_pp_split_layers(6, 4, 3, 1, lo), HP_ERR_INVALID_ARG, "first_stage_less_layers 3");
    HP_CHECK_OK(hp_pp_num_stages(4, 0, 6, -1, 1, 1, &ns));
    HP_CHECK(ns == 8, "looped schedules get 2 stages per rank: %d", ns);
    HP_CHECK_OK(hp_pp_num_stages(2, 0, 6, 2, 1, 1, &ns));
    HP_CHECK(ns == 4, "layers_per_stage 2: %d stages", ns);
    HP_CHECK_ERR(hp_pp_num_stages(3, 0, 6, 2, 1, 1, &ns), HP_ERR_INVALID_ARG, "not divisible by");
    HP_CHECK_ERR(hp_pp_num_stages(2, 1, 6, 2, 1, 1, &ns), HP_ERR_INVALID_ARG, "exactly 1 stage per rank");
    // module_fqns_per_model_part
    HP_CHECK_OK(hp_pp_split_fqns("tok_embeddings,layers.0;layers.1, norm, output", "k", 2, &ns, lo));
    HP_CHECK(ns == 2 && lo[1] == 2 && lo[2] == 4, "fqns split %d: %d %d", ns, lo[1], lo[2]);
    HP_CHECK_ERR(hp_pp_split_fqns("tok_embeddings,layers.1;layers.0,norm,output", "k", 2, &ns, lo), HP_ERR_INVALID_ARG,
                 "'layers.1' where the next layer was expected");
    HP_CHECK_ERR(hp_pp_split_fqns("tok_embeddings,layers.0;layers.1", "k", 2, &ns, lo), HP_ERR_INVALID_ARG,
                 "before norm and output");
    HP_CHECK_ERR(hp_pp_split_fqns("tok_embeddings,layers.0;layers.9,norm,output", "k", 2, &ns, lo),
                 HP_ERR_INVALID_ARG, "names 'layers.9'");
    HP_CHECK_ERR(hp_pp_split_fqns("tok_embeddings;;layers.0,layers.1,norm,output", "k", 2, &ns, lo),
                 HP_ERR_INVALID_ARG, "stage 1 is empty");
}

/* Transport of a case and, when bits is not NULL, a copy of the loss and every local gradient
 * (malloc'd) for bitwise comparisons between transports. */
typedef struct mode {
    hp_pp_overlap_t ov;
    hp_pp_p2p_t p2p;
    float **bits;
    size_t *n_bits;
    int *pairs;   /* coalesced pairs of this rank's list */
} pp_mode_t;

/* The schedule's theoretical in-flight micro-batches of `stage` from its compute-only list: a
 * context is live from its F to its B or W (OVERLAP_F_B: its F, then its B). */
static int in_flight(const hp_pp_schedule_t *compute, int stage) {
    int live = 0, peak = 0;
    for (int r = 0; r < hp_pp_schedule_n_ranks(compute); r++)
        for (int i = 0; i < hp_pp_schedule_len(compute, r); i++) {
            const hp_pp_action_t *a = hp_pp_schedule_at(compute, r, i);
            if (!a) continue;
            hp_pp_action_t lv[2];
            const int n = hp_pp_action_leaves(a, lv);
            for (int j = 0; j < n; j++) {
                if (lv[j].stage != stage) continue;
                const hp_pp_type_t t = lv[j].type;
                live += t == HP_PP_F || t == HP_PP_TRANSPOSE_F ? 1
                        : (t == HP_PP_B || t == HP_PP_W || t == HP_PP_TRANSPOSE_B) ? -1 : 0;
                if (live > peak) peak = live;
            }
        }
    return peak;
}

/* MPipe cases: the transposed layers T and stage 0's first_stage_less_layers (1: stage 0 holds
 * the embedding and one layer at pp 2, the embedding alone at pp 4; 0: two layers at pp 2). */
static int g_mpipe_T = 0, g_mpipe_w_in = 1;

/* Threads of this process (/proc/self/task entries; -1 where there is no /proc). */
static int thread_count(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* One (model, schedule, n_mb) case on `world` (= the pp dim). Returns the worst error/bound. */
static double run_case_m(hp_comm_t world, const char *model, hp_pp_kind_t kind, int n_mb, int negative,
                         const pp_mode_t *md) {
    const int P = hp_comm_size(world), me = hp_comm_rank(world);
    const int L = hp_pp_kind_is_single_stage(kind) ? 1 : 2, S = P * L;
    hp_model_config_t cfg = dp_config(6);
    if (!strcmp(model, "qwen3")) {
        HP_ASSERT(hp_model_flavor("qwen3", "debugmodel", &cfg) == HP_OK);
        cfg.n_layers = 6;
        cfg.max_seq_len = 64;
    }
    // small dims keep the 2-core suite short: 4 heads of 16, 2 KV heads (GQA), vocab 256
    cfg.dim = 64;
    cfg.n_heads = 4;
    cfg.n_kv_heads = 2;
    cfg.head_dim = 0;
    cfg.hidden_dim = 128;
    cfg.vocab_size = 256;
    if (hp_model_config_validate(&cfg) != HP_OK) {
        fprintf(stderr, "config: %s\n", hp_last_error());
        exit(1);
    }
    int lo[HP_PP_MAX_STAGES + 1];
    const int mpipe = kind == HP_PP_MPIPE;
    HP_CHECK_OK(hp_pp_split_layers(cfg.n_layers, S, mpipe ? g_mpipe_w_in : 1, 1, lo));
    hp_pp_schedule_t *compute = NULL, *lowered = NULL;
    int s2r[HP_PP_MAX_STAGES];
    HP_CHECK_OK(hp_pp_generate(kind, P, L, n_mb, &compute));
    HP_CHECK_OK(hp_pp_lower(compute, S, n_mb, &lowered, s2r));
    hp_model_t stages[4];
    int ids[4], nl = 0;
    for (int s = 0; s < S; s++)
        if (s2r[s] == me) {
            ids[nl] = s;
            HP_CHECK_OK(hp_model_create_range(&cfg, lo[s], lo[s + 1], MBS, TT, &stages[nl]));
            HP_CHECK_OK(hp_model_init_weights(stages[nl], DP_SEED));
            HP_CHECK_OK(hp_model_zero_grad(stages[nl]));
            nl++;
        }
    hp_pp_options_t o = {S, s2r, n_mb, MBS, TT};
    hp_pp_t rt = NULL;
    if (mpipe) HP_CHECK_OK(hp_pp_create_mpipe(world, lowered, stages, ids, nl, &o, NULL, g_mpipe_T, &rt));
    else HP_CHECK_OK(hp_pp_create(world, lowered, stages, ids, nl, &o, NULL, &rt));
    HP_ASSERT(rt != NULL);
    if (md && md->ov == HP_PP_OVERLAP_THREAD) {   // refused values leave the runtime as it was
        HP_CHECK_ERR(hp_pp_set_transport(rt, (hp_pp_overlap_t)9, HP_PP_P2P_PER_OP), HP_ERR_INVALID_ARG,
                     "overlap mode 9");
        HP_CHECK_ERR(hp_pp_set_transport(rt, HP_PP_OVERLAP_OFF, (hp_pp_p2p_t)7), HP_ERR_INVALID_ARG, "p2p mode 7");
        HP_CHECK(hp_pp_overlap_mode(rt) == HP_PP_OVERLAP_INTERLEAVE, "a refused mode changed the overlap mode");
    }
    const int threads0 = thread_count();
    if (md) HP_CHECK_OK(hp_pp_set_transport(rt, md->ov, md->p2p));
    if (md && md->pairs) *md->pairs = hp_pp_coalesced_pairs(rt);
    // the step's data: n_mb sequences
    const int V = cfg.vocab_size, N = n_mb * MBS * TT;
    int32_t *tok = hp_malloc(sizeof(int32_t) * (size_t)N), *tgt = hp_malloc(sizeof(int32_t) * (size_t)N);
    for (int m = 0; m < n_mb; m++) dp_sequence(0, 0, m, V, tok + m * TT, tgt + m * TT);
    int64_t valid = 0;
    for (int i = 0; i < N; i++) valid += tgt[i] != -100;
    double ls = 0.0;
    int64_t nv = 0;
    HP_CHECK_OK(hp_pp_step(rt, tok, tgt, (float)valid, &ls, &nv));
    if (md && md->bits) {   // the loss and every local gradient, for a bitwise comparison
        size_t nb = 1;
        for (int i = 0; i < nl; i++)
            for (int j = 0; j < hp_model_num_params(stages[i]); j++)
                nb += (size_t)hp_tensor_numel(&hp_model_params(stages[i])[j].grad.local);
        float *b = hp_malloc(sizeof(float) * nb);
        size_t at = 0;
        b[at++] = (float)ls;
        for (int i = 0; i < nl; i++)
            for (int j = 0; j < hp_model_num_params(stages[i]); j++) {
                const hp_tensor_t *g = &hp_model_params(stages[i])[j].grad.local;
                memcpy(b + at, g->data, sizeof(float) * (size_t)hp_tensor_numel(g));
                at += (size_t)hp_tensor_numel(g);
            }
        *md->bits = b;
        *md->n_bits = nb;
    }
    if (md && md->ov == HP_PP_OVERLAP_THREAD) {   // one worker for every step: no thread per OVERLAP_F_B
        // the worker starts with the mode (one thread more), and the steps start none
        const int before = thread_count();
        for (int i = 0; i < nl; i++) HP_CHECK_OK(hp_model_zero_grad(stages[i]));   // the same gradients again
        HP_CHECK_OK(hp_pp_step(rt, tok, tgt, (float)valid, &ls, &nv));
        HP_CHECK(before > threads0 && thread_count() == before, "overlap thread: %d threads before the mode, %d "
                 "after a step, %d after another", threads0, before, thread_count());
    }
    // memory: every local stage's pool holds the schedule's in-flight count, which the step
    // reached (the measured high-water mark), and the context bytes are contexts x bytes each
    if (!negative) {
        size_t cb = 0, bb = 0, want = 0;
        hp_pp_memory(rt, &cb, &bb);
        for (int i = 0; i < nl; i++) {
            const int th = in_flight(compute, ids[i]);
            HP_CHECK(hp_pp_stage_contexts(rt, i) == th && hp_pp_stage_peak_contexts(rt, i) == th,
                     "%s n_mb %d stage %d: %d contexts, %d in use at the peak, the schedule keeps %d in flight",
                     hp_pp_kind_name(kind), n_mb, ids[i], hp_pp_stage_contexts(rt, i),
                     hp_pp_stage_peak_contexts(rt, i), th);
            hp_model_ctx_t one = NULL;
            HP_CHECK_OK(hp_model_ctx_create(stages[i], MBS, TT, 0, &one));
            size_t per = hp_model_ctx_bytes(one);
            hp_model_ctx_destroy(one);
            int split = 0;
            for (int r = 0; r < hp_pp_schedule_n_ranks(compute); r++)
                for (int q = 0; q < hp_pp_schedule_len(compute, r); q++) {
                    const hp_pp_action_t *a = hp_pp_schedule_at(compute, r, q);
                    split |= a && a->stage == ids[i] && (a->type == HP_PP_I || a->type == HP_PP_W);
                }
            if (split) {   // a zero-bubble stage's contexts keep every unit's gradient until W
                HP_CHECK_OK(hp_model_ctx_create(stages[i], MBS, TT, HP_MODEL_CTX_SPLIT_BACKWARD, &one));
                per = hp_model_ctx_bytes(one);
                hp_model_ctx_destroy(one);
            }
            want += (size_t)th * per;
        }
        if (mpipe) {   // a helper's replica: one context per MPIPE_F; the broadcast is the preprocess's bytes
            const int NT = P < n_mb ? P : n_mb, helper = me >= 1 && me < NT;
            hp_model_param_desc_t d[64];
            const int nd = hp_model_describe_params(&cfg, 0, g_mpipe_T + 1, d, 64);
            size_t pre = 0;
            for (int i = 0; i < nd; i++) {
                size_t e = 1;
                for (int k = 0; k < d[i].ndim; k++) e *= (size_t)d[i].shape[k];
                pre += sizeof(float) * e;
            }
            HP_CHECK(hp_pp_mpipe_forwards(rt) == helper && hp_pp_mpipe_broadcast_bytes(rt) == pre,
                     "MPipe T %d rank %d: %d replica forwards (expected %d), broadcast %zu bytes (the preprocess has %zu)",
                     g_mpipe_T, me, hp_pp_mpipe_forwards(rt), helper, hp_pp_mpipe_broadcast_bytes(rt), pre);
            if (helper) {
                hp_model_t rep = NULL;
                hp_model_ctx_t one = NULL;
                HP_CHECK_OK(hp_model_create_range(&cfg, 0, g_mpipe_T + 1, MBS, TT, &rep));
                HP_CHECK_OK(hp_model_ctx_create(rep, MBS, TT, 0, &one));
                want += hp_model_ctx_bytes(one);
                hp_model_ctx_destroy(one);
                hp_model_destroy(rep);
            }
        }
        HP_CHECK(cb == want, "%s: context bytes %zu, contexts x bytes per context %zu", hp_pp_kind_name(kind), cb,
                 want);
        if (md && md->pairs == NULL && md->bits == NULL && md->ov == HP_PP_OVERLAP_DEFAULT) {   // the memory table
            int64_t mine[2] = {0, (int64_t)cb}, all[2 * 64];
            for (int i = 0; i < nl; i++) mine[0] += hp_pp_stage_peak_contexts(rt, i);
            if (P <= 64) {
                HP_CHECK_OK(hp_all_gather(mine, all, 2, HP_I64, world, NULL));
                if (me == 0) {
                    printf("memory pp %d %s n_mb %d: contexts / bytes per rank:", P, hp_pp_kind_name(kind), n_mb);
                    for (int r = 0; r < P; r++) printf(" %lld / %lld", (long long)all[2 * r], (long long)all[2 * r + 1]);
                    printf("\n");
                }
            }
        }
    }
    // the reference: every micro-batch from zero gradients on the whole model
    hp_model_t ref = NULL;
    HP_CHECK_OK(hp_model_create(&cfg, MBS, TT, &ref));
    HP_CHECK_OK(hp_model_init_weights(ref, DP_SEED));
    dp_par_t par;
    dp_par_init(&par, hp_model_params(ref), hp_model_num_params(ref), n_mb, 0, 0.0, 1);
    par.negative = negative;
    dp_par_begin_step(&par);
    for (int m = 0; m < n_mb; m++) {
        float l = 0.0f;
        HP_CHECK_OK(hp_model_zero_grad(ref));
        HP_CHECK_OK(hp_model_forward(ref, tok + m * TT, tgt + m * TT, MBS, TT, (float)valid, &l));
        HP_CHECK_OK(hp_model_backward(ref));
        dp_par_add_partial(&par, l);
    }
    const int last_here = s2r[S - 1] == me;
    if (last_here) {
        HP_CHECK(nv == valid, "valid targets %lld vs %lld", (long long)nv, (long long)valid);
        dp_par_check_loss(&par, "pp loss", 0, ls / (double)valid);
    }
    // every held parameter's gradient against the partials' exact sum
    double worst = 0.0;
    for (int i = 0; i < nl; i++) {
        hp_param_t *sp = hp_model_params(stages[i]);
        for (int j = 0; j < hp_model_num_params(stages[i]); j++) {
            int ri = -1;
            for (int k = 0; k < par.np; k++)
                if (!strcmp(par.rp[k].name, sp[j].name)) ri = k;
            HP_CHECK(ri >= 0, "stage param %s not in the model", sp[j].name);
            if (ri < 0) continue;
            // a tied weight's copy holds one use's gradient only (the trainer sums the two)
            const int tied_part = cfg.tie_embeddings && !strcmp(sp[j].name, "tok_embeddings.weight") && P > 1;
            if (tied_part) continue;
            float *g = sp[j].grad.local.data;
            const int64_t n = hp_tensor_numel(&sp[j].grad.local);
            if (negative && n > 0) g[n / 2] += (float)(fabs(par.S[par.off[ri] + n / 2]) * (1.0 / 4096) + 1e-30);
            for (int64_t k = 0; k < n; k++) {
                const double S_ = par.S[par.off[ri] + k], b = dp_par_bound(&par, par.off[ri] + k),
                             e = fabs((double)g[k] - S_);
                if (e / b > worst) worst = e / b;
                DP_PAR_CHECK(&par, e <= b, "%s %s n_mb %d: %s[%lld] = %.9g vs %.9g (bound %.3g)", model,
                             hp_pp_kind_name(kind), n_mb, sp[j].name, (long long)k, g[k], S_, b);
            }
        }
    }
    if (negative) HP_CHECK(par.violations > 0, "the corrupted gradient passed the parity check");
    // memory: this rank's parameters against 1/pp of the model
    if (!negative && kind == HP_PP_1F1B) {
        int64_t mine = 0, all = 0;
        for (int i = 0; i < nl; i++) {
            hp_param_t *sp = hp_model_params(stages[i]);
            for (int j = 0; j < hp_model_num_params(stages[i]); j++) mine += hp_tensor_numel(&sp[j].value.local);
        }
        HP_CHECK_OK(hp_all_reduce(&mine, &all, 1, HP_I64, HP_SUM, world, NULL));
        const int64_t full = hp_model_param_count(&cfg, 0) + (cfg.tie_embeddings && P > 1 ? (int64_t)V * cfg.dim : 0);
        HP_CHECK(all == full, "stage parameters sum to %lld, the model has %lld", (long long)all, (long long)full);
        // a middle stage of pp 4 holds its layers only: within the embedding/head imbalance of 1/pp
        const int64_t emb = (int64_t)V * cfg.dim, per = (full - 2 * emb) / P;
        if (me > 0 && me < P - 1) HP_CHECK(mine <= per + per / 2, "middle rank %d holds %lld > 1.5 x %lld", me,
                                           (long long)mine, (long long)per);
        // activations: one context per micro-batch in flight; 1F1B keeps min(n, P - r) on rank r;
        // one context of every stage together is about one whole-model context (a stage's
        // context also holds its input copy and its own scratch: at most 1.5x in all)
        HP_CHECK(hp_pp_stage_contexts(rt, 0) == (n_mb < P - me ? n_mb : P - me), "1F1B rank %d keeps %d contexts, "
                 "expected min(%d, %d)", me, hp_pp_stage_contexts(rt, 0), n_mb, P - me);
        {
            size_t cb = 0, bb = 0;
            hp_pp_memory(rt, &cb, &bb);
            float one = (float)cb / (float)hp_pp_stage_contexts(rt, 0), sum = 0;
            HP_CHECK_OK(hp_all_reduce(&one, &sum, 1, HP_F32, HP_SUM, world, NULL));
            hp_model_t whole = NULL;
            hp_model_ctx_t wc = NULL;
            HP_CHECK_OK(hp_model_create(&cfg, MBS, TT, &whole));
            HP_CHECK_OK(hp_model_ctx_create(whole, MBS, TT, 0, &wc));
            const double w = (double)hp_model_ctx_bytes(wc);
            HP_CHECK(sum >= 0.9 * w && sum <= 1.5 * w, "one context per stage sums to %.0f bytes, a whole-model context "
                     "has %.0f", (double)sum, w);
            if (me == 0 && !strcmp(model, "llama3"))
                printf("pp %d: rank 0 context %.0f bytes (%.1f%% of the whole model's %.0f); all stages %.0f\n", P,
                       (double)one, 100.0 * one / w, w, (double)sum);
            hp_model_ctx_destroy(wc);
            hp_model_destroy(whole);
        }
        if (me == 0 && !negative && !strcmp(model, "llama3")) {
            size_t cb = 0, bb = 0;
            hp_pp_memory(rt, &cb, &bb);
            printf("pp %d %s: rank 0 holds %lld of %lld parameters (%.1f%%), %d contexts (%zu bytes), p2p %zu bytes\n",
                   P, model, (long long)mine, (long long)full, 100.0 * (double)mine / (double)full,
                   hp_pp_stage_contexts(rt, 0), cb, bb);
        }
    }
    dp_par_free(&par);
    hp_model_destroy(ref);
    hp_pp_destroy(rt);
    for (int i = 0; i < nl; i++) hp_model_destroy(stages[i]);
    hp_pp_schedule_free(compute);
    hp_pp_schedule_free(lowered);
    free(tok);
    free(tgt);
    return worst;
}

static double run_case(hp_comm_t world, const char *model, hp_pp_kind_t kind, int n_mb, int negative) {
    return run_case_m(world, model, kind, n_mb, negative, NULL);
}

/* The same case under transports a and b: bitwise equal loss and gradients. */
static void same_bits(hp_comm_t world, hp_pp_kind_t kind, int n_mb, pp_mode_t a, pp_mode_t b, const char *what) {
    float *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    a.bits = &x, a.n_bits = &nx, b.bits = &y, b.n_bits = &ny;
    run_case_m(world, "llama3", kind, n_mb, 0, &a);
    run_case_m(world, "llama3", kind, n_mb, 0, &b);
    HP_CHECK(nx == ny && x && y && memcmp(x, y, sizeof(float) * nx) == 0, "%s %s n_mb %d: loss and gradients differ "
             "bitwise (%zu vs %zu values)", what, hp_pp_kind_name(kind), n_mb, nx, ny);
    // the comparison can fail: one bit of one gradient flipped
    if (nx > 1 && y) {
        uint32_t u;
        memcpy(&u, &y[nx / 2], 4);
        u ^= 1u;
        memcpy(&y[nx / 2], &u, 4);
        HP_CHECK(memcmp(x, y, sizeof(float) * nx) != 0, "a flipped bit went unnoticed");
    }
    free(x);
    free(y);
}

/* HyperParallel's MPipe transpose: T = 0 (the embedding) and, at pp 2, T = 1 with stage 0 holding
 * exactly the preprocess (w_in 1) and more (w_in 0, qwen3's tied embedding); the harness's
 * negative too. */
/* A preprocess larger than stage 0 is refused on every rank (only stage 0's rank can see it). */
static void mpipe_refusal(hp_comm_t world, int ws) {
    const int me = hp_comm_rank(world), S = 2 * ws, n_mb = ws;
    hp_model_config_t cfg = dp_config(6);
    cfg.dim = 64, cfg.n_heads = 4, cfg.n_kv_heads = 2, cfg.head_dim = 0, cfg.hidden_dim = 128, cfg.vocab_size = 256;
    HP_ASSERT(hp_model_config_validate(&cfg) == HP_OK);
    int lo[HP_PP_MAX_STAGES + 1], s2r[HP_PP_MAX_STAGES], ids[4], nl = 0;
    HP_CHECK_OK(hp_pp_split_layers(cfg.n_layers, S, 1, 1, lo));
    hp_pp_schedule_t *compute = NULL, *lowered = NULL;
    HP_CHECK_OK(hp_pp_generate(HP_PP_MPIPE, ws, 2, n_mb, &compute));
    HP_CHECK_OK(hp_pp_lower(compute, S, n_mb, &lowered, s2r));
    hp_model_t stages[4];
    for (int s = 0; s < S; s++)
        if (s2r[s] == me) {
            ids[nl] = s;
            HP_CHECK_OK(hp_model_create_range(&cfg, lo[s], lo[s + 1], MBS, TT, &stages[nl++]));
        }
    hp_pp_options_t o = {S, s2r, n_mb, MBS, TT};
    hp_pp_t rt = NULL;
    const int T = lo[1];   // one layer more than stage 0 holds
    HP_CHECK_ERR(hp_pp_create_mpipe(world, lowered, stages, ids, nl, &o, NULL, T, &rt), HP_ERR_INVALID_ARG,
                 "MPipe's preprocess is units");
    HP_CHECK(rt == NULL, "a refused runtime was returned");
    for (int i = 0; i < nl; i++) hp_model_destroy(stages[i]);
    hp_pp_schedule_free(compute);
    hp_pp_schedule_free(lowered);
}

static void mpipe_cases(hp_comm_t world, int ws, int rank) {
    const double t0 = hp_clock_now_seconds();
    mpipe_refusal(world, ws);
    {
            static const int mc[][3] = {{0, 1, 0}, {1, 1, 0}, {1, 0, 1}, {0, 1, 2}};   // T, w_in, qwen3 (2: negative)
            for (size_t c = 0; c < sizeof mc / sizeof mc[0]; c++) {
                if (ws == 4 && mc[c][0] > 0) continue;   // pp 4's 8 stages: stage 0 holds the embedding alone
                g_mpipe_T = mc[c][0], g_mpipe_w_in = mc[c][1];
                const char *mname = mc[c][2] == 1 ? "qwen3" : "llama3";
                for (int n_mb = ws; n_mb <= 2 * ws; n_mb += ws) {
                    if (mc[c][2] == 2 && n_mb > ws) continue;
                    double w = run_case(world, mname, HP_PP_MPIPE, n_mb, mc[c][2] == 2);
                    if (rank == 0) printf("pp %d %s MPipeTranspose T %d (stage 0 units [0, %d)) n_mb %d%s: worst error / "
                                          "bound %.3g\n", ws, mname, g_mpipe_T, ws == 2 ? 3 - g_mpipe_w_in : 1, n_mb,
                                          mc[c][2] == 2 ? " (negative)" : "", w);
                }
            }
            g_mpipe_T = 0, g_mpipe_w_in = 1;
        }
    if (rank == 0) printf("pp %d MPipeTranspose cases: %.1f s\n", ws, hp_clock_now_seconds() - t0);   // for the suite budget
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    if (ws == 1) {
        split_tests();
        run_case(world, "llama3", HP_PP_GPIPE, 2, 0);   // one stage: the whole model through the runtime
    } else {
        const hp_pp_kind_t kinds[4] = {HP_PP_GPIPE, HP_PP_1F1B, HP_PP_INTERLEAVED_1F1B, HP_PP_LOOPED_BFS};
        const char *models[2] = {"llama3", "qwen3"};
        for (int mi = 0; mi < 2; mi++)
            for (int k = 0; k < 4; k++)
                for (int n_mb = 2; n_mb <= 8; n_mb *= 2) {
                    if (n_mb < ws && kinds[k] != HP_PP_GPIPE && kinds[k] != HP_PP_LOOPED_BFS) continue;
                    if (ws == 4 && mi == 1 && n_mb == 2) continue;   // keep pp 4 short
                    double w = run_case(world, models[mi], kinds[k], n_mb, 0);
                    if (rank == 0) printf("pp %d %s %s n_mb %d: worst error / bound %.3g\n", ws, models[mi],
                                          hp_pp_kind_name(kinds[k]), n_mb, w);
                }
        run_case(world, "llama3", HP_PP_1F1B, ws, 1);   // negative
        mpipe_cases(world, ws, rank);
        // the zero-bubble and V schedules (issue 15): parity with the single-rank model; ZBV and
        // DualPipeV on the V mapping (rank r: stages r and 2P-1-r, the middle pair in memory)
        const hp_pp_kind_t zk[3] = {HP_PP_INTERLEAVED_ZB, HP_PP_ZBV, HP_PP_DUALPIPEV};
        for (int k = 0; k < 3; k++)
            for (int mi = 0; mi < (ws == 2 ? 2 : 1); mi++) {
                const int n_mb = 2 * ws;   // DualPipeV needs n >= 2 pp
                double w = run_case(world, models[mi], zk[k], n_mb, 0);
                if (rank == 0) printf("pp %d %s %s n_mb %d: worst error / bound %.3g\n", ws, models[mi],
                                      hp_pp_kind_name(zk[k]), n_mb, w);
            }
        // OVERLAP_F_B: interleaved (and on a second thread) bitwise equal to F then B
        const pp_mode_t off = {HP_PP_OVERLAP_OFF, HP_PP_P2P_PER_OP, NULL, NULL, NULL},
                     inter = {HP_PP_OVERLAP_INTERLEAVE, HP_PP_P2P_PER_OP, NULL, NULL, NULL},
                     thr = {HP_PP_OVERLAP_THREAD, HP_PP_P2P_PER_OP, NULL, NULL, NULL};
        same_bits(world, HP_PP_DUALPIPEV, 2 * ws, off, inter, "overlap interleave vs off");
        if (ws == 2) same_bits(world, HP_PP_DUALPIPEV, 2 * ws, off, thr, "overlap thread vs off");
        // coalesced same-peer send + receive pairs: bitwise equal to per-op, and some exist
        {
            int pairs = 0;
            pp_mode_t co = {HP_PP_OVERLAP_DEFAULT, HP_PP_P2P_COALESCED, NULL, NULL, &pairs};
            same_bits(world, HP_PP_1F1B, 2 * ws, off, co, "coalesced p2p vs per-op");
            int all = 0;
            HP_CHECK_OK(hp_all_reduce(&pairs, &all, 1, HP_I32, HP_SUM, world, NULL));
            HP_CHECK(all > 0, "1F1B pp %d: no coalesced send / receive pair", ws);
            if (rank == 0) printf("pp %d 1F1B: %d coalesced pairs over the ranks\n", ws, all);
            same_bits(world, HP_PP_DUALPIPEV, 2 * ws, inter, co, "coalesced p2p + overlap vs per-op");
        }
        // memory at one micro-batch count: 1F1B, Interleaved1F1B, ZBV (the table in docs/pp.md)
        {
            const hp_pp_kind_t mk[3] = {HP_PP_1F1B, HP_PP_INTERLEAVED_1F1B, HP_PP_ZBV};
            const pp_mode_t dflt = {HP_PP_OVERLAP_DEFAULT, HP_PP_P2P_DEFAULT, NULL, NULL, NULL};
            for (int k = 0; k < 3; k++) run_case_m(world, "llama3", mk[k], 2 * ws, 0, &dflt);
        }
    }
    return hp_test_mpi_finish("test_pp");
}
