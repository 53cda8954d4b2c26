/* Expert parallelism at the model level (src/parallel/ep.c): on 2 and 4 ranks each rank holds
 * num_experts / ep experts (local shape, bytes 1/ep), drawn at their global indices; one
 * forward/backward per rank on its own tokens equals the single-rank model on the same tokens
 * (loss, logits, dense gradients; expert gradients equal the single-rank ones summed over the
 * ranks, sliced to the local experts); the all-to-all calls and bytes equal what the routing
 * implies (count exchange + 4 row exchanges per MoE layer, (N K + R) D floats each way); an
 * injected error fails the comparison; two micro-batch contexts in flight keep their own
 * dispatch state. Both MoE flavors. Tensor parallel of the experts alone
 * (F sharded over the ranks, same tokens everywhere) and, on 4 ranks, expert tensor parallel
 * on (ep 2, tp 2) and expert FSDP on (efsdp 2, ep 2) equal the single-rank model too. */
// hp-test: ranks 2 4 timeout 120 coretype 2
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/dtensor.h"
#include "hyperparallel/ep.h"
#include "hyperparallel/mesh.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"

static double rel(const float *a, const float *b, size_t n) {
    double w = 0, s = 0;
    for (size_t i = 0; i < n; i++) s = fmax(s, fabs(b[i]));
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs(a[i] - b[i]));
    return s > 0 ? w / s : w;
}

/* The small MoE model every run here uses: the flavor's debugmodel on dim 48, 3 layers, E
 * experts of hidden 24, top-2 (2 experts: no expert groups). */
static void small_config(hp_model_config_t *c, const char *name, int E) {
    HP_CHECK_OK(hp_model_flavor(name, "debugmodel", c));
    c->dim = 48; c->n_layers = 3; c->n_heads = 4; c->n_kv_heads = 2; c->head_dim = 12; c->hidden_dim = 64;
    c->moe_hidden = 24; c->moe_experts = E; c->moe_top_k = 2; c->vocab_size = 97; c->max_seq_len = 16;
    c->kv_lora_rank = 16; c->qk_nope_head_dim = 8; c->qk_rope_head_dim = 4; c->v_head_dim = 12;   // MLA (deepseek_v3)
    if (E <= 2 && c->moe_expert_groups > 1) c->moe_expert_groups = c->moe_limited_groups = 0;
    HP_CHECK_OK(hp_model_config_validate(c));
}

/* n tokens from an LCG seeded with seed (ids < 97) and their next-token targets. */
static void lcg_tokens(int32_t *tk, int32_t *tg, int n, uint32_t seed) {
    for (int i = 0; i < n; i++) { seed = seed * 1664525u + 1013904223u; tk[i] = (int32_t)((seed >> 8) % 97u); }
    for (int i = 0; i < n; i++) tg[i] = tk[(i + 1) % n];
}

enum { B = 2, T = 16 };

/* A single-rank reference model and a parallel one of the same config, weights and tokens. */
typedef struct {
    hp_model_config_t c;
    hp_model_t ref, m;
    hp_mesh_t mesh;
    hp_ep_t ep;
    hp_comm_t world, sum_comm;   /* the expert grads of the reference are summed over sum_comm (NULL: not) */
    int rank, ws;
    int32_t tk[B * T], tg[B * T];
    int El, Fl, Ef, er, tr, f, r, dim1;   /* the layout's slicing (see the want_* functions) */
} pair_t;

/* Creates both models of flavor `name` with E experts, the reference initialized with init_seed,
 * the parallel one made by parallelize on a mesh of `shape` over world and then initialized
 * alike (its local shards at their global indices); tokens from token_seed. Returns 0 when a
 * step failed (already reported). */
static int pair_create(pair_t *p, const char *name, int E, hp_comm_t world, uint32_t token_seed, uint64_t init_seed,
                       int ndim, const int64_t *shape, const char **dims,
                       hp_status_t (*parallelize)(hp_model_t, hp_mesh_t, hp_ep_t *)) {
    memset(p, 0, sizeof *p);
    p->world = world;
    p->rank = hp_comm_rank(world);
    p->ws = hp_comm_size(world);
    small_config(&p->c, name, E);
    lcg_tokens(p->tk, p->tg, B * T, token_seed);
    HP_CHECK_OK(hp_model_create(&p->c, B, T, &p->ref));
    HP_CHECK_OK(hp_model_create(&p->c, B, T, &p->m));
    if (!p->ref || !p->m) return 0;
    HP_CHECK_OK(hp_model_init_weights(p->ref, init_seed));
    HP_CHECK_OK(hp_mesh_create(world, ndim, shape, dims, &p->mesh));
    HP_CHECK_OK(parallelize(p->m, p->mesh, &p->ep));
    if (!p->ep) return 0;
    HP_CHECK_OK(hp_model_init_weights(p->m, init_seed));
    return 1;
}

static void pair_destroy(pair_t *p) {
    hp_ep_destroy(p->ep);
    hp_model_destroy(p->m);
    hp_model_destroy(p->ref);
    hp_mesh_destroy(p->mesh);
}

/* One forward/backward of the reference, then of the parallel model; returns the logits'
 * largest difference relative to the reference's largest logit. */
static double pair_step(pair_t *p, float *loss_ref, float *loss) {
    HP_CHECK_OK(hp_model_zero_grad(p->ref));
    HP_CHECK_OK(hp_model_zero_grad(p->m));
    HP_CHECK_OK(hp_model_forward(p->ref, p->tk, p->tg, B, T, (float)(B * T), loss_ref));
    HP_CHECK_OK(hp_model_backward(p->ref));
    HP_CHECK_OK(hp_model_forward(p->m, p->tk, p->tg, B, T, (float)(B * T), loss));
    HP_CHECK_OK(hp_model_backward(p->m));
    return rel(hp_model_logits(p->m), hp_model_logits(p->ref), (size_t)B * T * p->c.vocab_size);
}

/* The local gradient (or weight) an expert tensor of the layout should hold, from the
 * reference's full one (summed over sum_comm first when there is one). */
typedef void (*want_fn)(const pair_t *p, const hp_param_t *pr, const float *full, float *out, size_t n);

/* EP: this rank's El experts. */
static void want_ep(const pair_t *p, const hp_param_t *pr, const float *full, float *out, size_t n) {
    (void)pr;
    memcpy(out, full + (size_t)p->rank * n, sizeof(float) * n);
}

/* Experts' F over tp: every expert, this rank's Fl features of F (w1/w3 dim 1, w2 dim 2). */
static void want_tp(const pair_t *p, const hp_param_t *pr, const float *full, float *out, size_t n) {
    const int64_t E = pr->grad.local.shape[0], A = pr->grad.local.shape[1], Bd = pr->grad.local.shape[2];
    const int w2 = strstr(pr->name, "experts.w2") != NULL;
    size_t k = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t a = 0; a < A; a++)
            for (int64_t b = 0; b < Bd; b++)
                if ((w2 ? b : a) / p->Fl == p->rank && k < n) out[k++] = full[(e * A + a) * Bd + b];
    HP_CHECK(k == n, "slice size");
}

/* ETP (ep, tp): the El experts of ep coordinate er, their Fl features of tp coordinate tr. */
static void want_etp(const pair_t *p, const hp_param_t *pr, const float *full, float *out, size_t n) {
    const int64_t A = pr->grad.local.shape[1], Bd = pr->grad.local.shape[2];
    const int w2 = strstr(pr->name, "experts.w2") != NULL;
    size_t k = 0;
    for (int64_t e = p->er * p->El; e < p->er * p->El + p->El; e++)
        for (int64_t a = 0; a < A; a++)
            for (int64_t b = 0; b < Bd; b++)
                if ((w2 ? b : a) / p->Fl == p->tr && k < n) out[k++] = full[(e * A + a) * Bd + b];
    HP_CHECK(k == n, "ETP slice size");
}

/* This rank's shard of an expert tensor (E, d1, rest) of the single-rank model: Shard(0)
 * experts r El + f Ef .. + Ef, or (dim1) experts r El .. + El on rows [f d1/2, (f+1) d1/2). */
static void want_efsdp(const pair_t *p, const hp_param_t *pr, const float *full, float *out, size_t n) {
    (void)n;
    const int64_t d1 = pr->value.local.shape[1], rest = pr->value.local.shape[2], c = p->dim1 ? d1 / 2 : d1;
    for (int e = 0; e < p->Ef; e++) {
        const int ge = p->dim1 ? p->r * p->El + e : p->r * p->El + p->f * p->Ef + e;
        memcpy(out + (size_t)e * c * rest, full + ((size_t)ge * d1 + (p->dim1 ? (size_t)p->f * c : 0)) * rest,
               sizeof(float) * (size_t)(c * rest));
    }
}

/* The worst relative gradient errors of the parallel model after pair_step: dense params
 * against the reference's (gd), expert params against want of the reference's (summed over
 * sum_comm) (ge). */
static void grad_errors(const pair_t *p, want_fn want, double *gd, double *ge) {
    *gd = *ge = 0;
    for (int i = 0; i < hp_model_num_params(p->ref); i++) {
        hp_param_t *pr = &hp_model_params(p->ref)[i], *pe = hp_model_find_param(p->m, pr->name);
        HP_CHECK(pe != NULL, "no %s in the parallel model", pr->name);
        if (!pe) continue;
        const size_t n = (size_t)hp_tensor_numel(&pr->grad.local), nl = (size_t)hp_tensor_numel(&pe->grad.local);
        if (!hp_ep_is_expert_param(pr)) {
            *gd = fmax(*gd, rel(hp_param_g(pe), hp_param_g(pr), n));
            continue;
        }
        float *sum = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * nl);
        if (p->sum_comm) HP_CHECK_OK(hp_all_reduce(hp_param_g(pr), sum, n, HP_F32, HP_SUM, p->sum_comm, NULL));
        else memcpy(sum, hp_param_g(pr), sizeof(float) * n);
        want(p, pr, sum, w, nl);
        *ge = fmax(*ge, rel(hp_param_g(pe), w, nl));
        free(sum);
        free(w);
    }
}

/* Expert parallel over the world: the local expert shard, its bytes and storage, one step
 * (counting the all-to-alls), the gradients, an injected error, two micro-batches in flight. */
static void run(const char *name, hp_comm_t world, int rank, int ws) {
    pair_t p;
    const int64_t shape[1] = {ws};
    const char *dn[1] = {"ep"};
    if (!pair_create(&p, name, 8, world, 17u + 101u * (uint32_t)rank, 11, 1, shape, dn, hp_ep_parallelize_model)) {
        pair_destroy(&p);
        return;
    }
    hp_model_config_t c = p.c;
    const int NK = B * T * c.moe_top_k, E = c.moe_experts, El = E / ws, n_moe = c.n_layers - c.moe_n_dense_layers;
    p.sum_comm = world;

    // the local expert shard and its bytes
    hp_param_t *w1 = hp_model_find_param(p.m, "layers.1.moe.experts.w1");
    HP_CHECK(w1 && w1->value.local.shape[0] == El && w1->value.global_shape[0] == E,
             "experts.w1 local (%lld, ...) global %lld, expected %d of %d",
             w1 ? (long long)w1->value.local.shape[0] : -1, w1 ? (long long)w1->value.global_shape[0] : -1, El, E);
    const size_t full = (size_t)n_moe * 3 * E * c.moe_hidden * c.dim * sizeof(float);
    HP_CHECK(hp_ep_local_expert_bytes(p.ep) * ws == full, "local expert bytes %zu x %d != %zu",
             hp_ep_local_expert_bytes(p.ep), ws, full);
    size_t pb_ep = 0, pb_ref = 0, gb, ab, wb;
    hp_model_memory(p.m, &pb_ep, &gb, &ab, &wb);
    hp_model_memory(p.ref, &pb_ref, &gb, &ab, &wb);
    HP_CHECK(pb_ref - pb_ep >= full - full / ws - 64 * 16 * sizeof(float),
             "parameter storage %zu vs single-rank %zu: the remote experts were not freed", pb_ep, pb_ref);
    const hp_param_t *rw1 = hp_model_find_param(p.ref, "layers.1.moe.experts.w1");
    const size_t per = (size_t)c.moe_hidden * c.dim;
    HP_CHECK(memcmp(hp_param_w(w1), hp_param_w(rw1) + (size_t)rank * El * per, sizeof(float) * El * per) == 0,
             "rank %d's experts are not the single-rank model's experts %d..%d", rank, rank * El, rank * El + El - 1);

    // one step each (the reference makes no calls: the counts are the EP model's)
    float lr = 0, le = 0;
    hp_comm_counts_t c0, c1;
    hp_comm_counts_get(&c0);
    /* only the GEMM row sets differ (a local expert multiplies the rows of every rank at
     * once): per-element f32 rounding of a few chained products, below 1e-5 relative */
    const double lg = pair_step(&p, &lr, &le);
    hp_comm_counts_get(&c1);
    HP_CHECK(lg < 1e-5 && fabs(le - lr) < 1e-5 * fabs(lr), "%s ep %d: logits differ by %.2e, loss %.9g vs %.9g",
             name, ws, lg, le, lr);
    /* gradients: dense local == dense reference; experts == reference summed over ranks, local
     * slice (the reference sums ws per-rank GEMMs, EP one GEMM over all rows: summation order),
     * 1e-5 relative to the largest entry */
    double gd, ge;
    grad_errors(&p, want_ep, &gd, &ge);
    HP_CHECK(gd < 1e-5 && ge < 1e-5, "%s ep %d: dense grads %.2e, expert grads %.2e off", name, ws, gd, ge);
    // negative: a 1e-4 relative error in one expert grad is seen
    {
        hp_param_t *pe = hp_model_find_param(p.m, "layers.2.moe.experts.w2"),
                   *pr = hp_model_find_param(p.ref, "layers.2.moe.experts.w2");
        const size_t n = (size_t)hp_tensor_numel(&pr->grad.local), pe_n = (size_t)hp_tensor_numel(&pe->grad.local);
        float *sum = malloc(sizeof(float) * n);
        HP_CHECK_OK(hp_all_reduce(hp_param_g(pr), sum, n, HP_F32, HP_SUM, world, NULL));
        double mx = 0;
        for (size_t j = 0; j < pe_n; j++) mx = fmax(mx, fabs(sum[(size_t)rank * pe_n + j]));
        hp_param_g(pe)[0] += (float)(1e-4 * mx);
        HP_CHECK(rel(hp_param_g(pe), sum + (size_t)rank * pe_n, pe_n) >= 1e-5, "harness missed an injected error");
        free(sum);
    }
    // all-to-all counts and bytes from the routing: R = rows of every rank for my experts
    hp_module_t *mods[256];
    int nm = hp_model_modules(p.ref, mods, 256);
    uint64_t want_bytes = 0;
    for (int i = 0; i < nm; i++) {
        if (!hp_module_is_moe(mods[i])) continue;
        const hp_moe_impl_t *M = mods[i]->impl;
        float tot[64];
        HP_CHECK_OK(hp_all_reduce(M->tokens_per_expert, tot, (size_t)E, HP_F32, HP_SUM, world, NULL));
        double R = 0;
        for (int e = rank * El; e < rank * El + El; e++) R += tot[e];
        want_bytes += (uint64_t)(2.0 * (NK + R) * c.dim * sizeof(float));
    }
    const uint64_t a2a = c1.calls[HP_COMM_ALL_TO_ALL] - c0.calls[HP_COMM_ALL_TO_ALL];
    const uint64_t a2av = c1.calls[HP_COMM_ALL_TO_ALL_V] - c0.calls[HP_COMM_ALL_TO_ALL_V];
    const uint64_t bytes = c1.bytes[HP_COMM_ALL_TO_ALL_V] - c0.bytes[HP_COMM_ALL_TO_ALL_V];
    HP_CHECK(a2a == (uint64_t)n_moe && a2av == 4u * (uint64_t)n_moe && bytes == want_bytes,
             "%s ep %d: %llu all_to_all, %llu all_to_all_v of %llu bytes; routing implies %d, %d, %llu", name, ws,
             (unsigned long long)a2a, (unsigned long long)a2av, (unsigned long long)bytes, n_moe, 4 * n_moe,
             (unsigned long long)want_bytes);
    /* two micro-batch contexts in flight (pipeline style): forward A, forward B, backward B,
     * backward A; A's logits equal the single forward's, the grads equal two sequential steps */
    {
        int32_t tk2[B * T];
        for (int i = 0; i < B * T; i++) tk2[i] = (p.tk[i] * 7 + 3) % 97;
        hp_model_ctx_t ca = NULL, cb = NULL;
        HP_CHECK_OK(hp_model_ctx_create(p.m, B, T, 0, &ca));
        HP_CHECK_OK(hp_model_ctx_create(p.m, B, T, 0, &cb));
        float la = 0, lb = 0;
        const size_t ng = (size_t)hp_tensor_numel(&w1->grad.local), nlog = (size_t)B * T * c.vocab_size;
        float *g_seq = malloc(sizeof(float) * ng), *logit_a = malloc(sizeof(float) * nlog);
        // sequential reference: A then B
        HP_CHECK_OK(hp_model_zero_grad(p.m));
        HP_CHECK_OK(hp_model_forward_ctx(p.m, ca, p.tk, p.tg, B, T, (float)(B * T), &la));
        memcpy(logit_a, hp_model_ctx_logits(ca), sizeof(float) * nlog);
        HP_CHECK_OK(hp_model_backward_ctx(p.m, ca));
        HP_CHECK_OK(hp_model_forward_ctx(p.m, cb, tk2, p.tg, B, T, (float)(B * T), &lb));
        HP_CHECK_OK(hp_model_backward_ctx(p.m, cb));
        memcpy(g_seq, hp_param_g(w1), sizeof(float) * ng);
        // interleaved
        HP_CHECK_OK(hp_model_zero_grad(p.m));
        HP_CHECK_OK(hp_model_forward_ctx(p.m, ca, p.tk, p.tg, B, T, (float)(B * T), &la));
        HP_CHECK_OK(hp_model_forward_ctx(p.m, cb, tk2, p.tg, B, T, (float)(B * T), &lb));
        HP_CHECK(memcmp(hp_model_ctx_logits(ca), logit_a, sizeof(float) * nlog) == 0,
                 "%s ep %d: a second micro-batch in flight changed the first one's logits", name, ws);
        HP_CHECK_OK(hp_model_backward_ctx(p.m, cb));
        HP_CHECK_OK(hp_model_backward_ctx(p.m, ca));
        /* B's and A's grads are added in the other order: f32 addition of two terms */
        HP_CHECK(rel(hp_param_g(w1), g_seq, ng) < 1e-6, "%s ep %d: micro-batches in flight mixed their dispatch "
                 "state (expert grads %.2e off)", name, ws, rel(hp_param_g(w1), g_seq, ng));
        free(g_seq);
        free(logit_a);
        hp_model_ctx_destroy(ca);
        hp_model_ctx_destroy(cb);
    }
    if (rank == 0)
        printf("%s ep %d: logits %.2e, dense grads %.2e, expert grads %.2e; %llu a2a, %llu a2a_v, %llu bytes\n",
               name, ws, lg, gd, ge, (unsigned long long)a2a, (unsigned long long)a2av, (unsigned long long)bytes);
    pair_destroy(&p);
}

/* Checks a layout's step: logits, dense and expert gradients within 1e-5 relative (the F-split
 * or row-set sums of the expert GEMMs reorder f32 sums); prints them on rank 0. */
static void check_step(pair_t *p, want_fn want, const char *what) {
    float lr = 0, lt = 0;
    const double lg = pair_step(p, &lr, &lt);
    double gd, ge;
    grad_errors(p, want, &gd, &ge);
    HP_CHECK(lg < 1e-5 && gd < 1e-5 && ge < 1e-5, "%s: logits %.2e, dense grads %.2e, expert grads %.2e", what, lg, gd,
             ge);
    if (p->rank == 0) printf("%s: logits %.2e, dense grads %.2e, expert grads %.2e\n", what, lg, gd, ge);
}

/* Tensor parallel of the experts (hp_ep_tensor_parallel_experts): every rank the same tokens,
 * experts on F/ws features; logits and every gradient equal the single-rank model (expert
 * grads: this rank's F slice); expert bytes 1/ws. */
static void run_tp(const char *name, hp_comm_t world, int rank, int ws) {
    (void)rank;
    pair_t p;
    const int64_t shape[1] = {ws};
    const char *dn[1] = {"tp"};
    if (pair_create(&p, name, 8, world, 29u, 12, 1, shape, dn, hp_ep_tensor_parallel_experts)) {
        const int n_moe = p.c.n_layers - p.c.moe_n_dense_layers;
        p.Fl = p.c.moe_hidden / ws;
        const size_t full = (size_t)n_moe * 3 * 8 * p.c.moe_hidden * p.c.dim * sizeof(float);
        HP_CHECK(hp_ep_local_expert_bytes(p.ep) * ws == full, "TP experts: local expert bytes %zu",
                 hp_ep_local_expert_bytes(p.ep));
        char what[80];
        snprintf(what, sizeof what, "%s tp-experts %d", name, ws);
        check_step(&p, want_tp, what);
    }
    pair_destroy(&p);
}

/* Expert tensor parallel on a (ep 2, tp 2) mesh of 4 ranks: ranks of one ep coordinate share
 * tokens (Replicate over tp); logits equal the single-rank model; each rank's expert grads
 * equal the single-rank ones summed over the ep column, sliced to its experts and F slice. */
static void run_etp(const char *name, hp_comm_t world, int rank) {
    pair_t p;
    const int64_t shape[2] = {2, 2};
    const char *dn[2] = {"ep", "tp"}, *epn[1] = {"ep"};
    hp_mesh_t col = NULL;
    if (pair_create(&p, name, 8, world, 31u + 7u * (uint32_t)(rank / 2), 13, 2, shape, dn,
                    hp_ep_parallelize_model_etp)) {
        p.er = rank / 2, p.tr = rank % 2, p.El = 4, p.Fl = 12;
        HP_CHECK_OK(hp_mesh_slice(p.mesh, 1, epn, &col));
        p.sum_comm = hp_mesh_get_comm(col, 0);
        HP_CHECK(hp_ep_local_expert_bytes(p.ep) * 4 == (size_t)2 * 3 * 8 * 24 * 48 * sizeof(float),
                 "ETP expert bytes %zu", hp_ep_local_expert_bytes(p.ep));
        char what[80];
        snprintf(what, sizeof what, "%s ETP ep 2 x tp 2", name);
        check_step(&p, want_etp, what);
    }
    hp_mesh_destroy(col);
    pair_destroy(&p);
}

/* Expert FSDP on the (efsdp 2, ep 2) mesh of 4 ranks, every rank its own tokens: with 8
 * experts (Shard(0)) rank (f, r) holds experts r*4 + f*2 .. +2; with 2 (efsdp x ep = 4 > 2:
 * TorchTitan's Shard(1)) expert r on half of its dim 1 (F rows of w1/w3, D rows of w2). Its
 * weights are the single-rank model's slice; logits and dense grads equal the single-rank
 * model on its tokens, expert grads equal the single-rank ones summed over all ranks
 * (dispatch over ep, reduce-scatter over efsdp), sliced alike; expert bytes 1/4. */
static void run_efsdp(const char *name, hp_comm_t world, int rank, int E) {
    pair_t p;
    const int64_t shape[2] = {2, 2};
    const char *dn[2] = {"efsdp", "ep"};
    if (!pair_create(&p, name, E, world, 41u + 13u * (uint32_t)rank, 14, 2, shape, dn, hp_ep_parallelize_model_efsdp)) {
        pair_destroy(&p);
        return;
    }
    p.dim1 = 2 * 2 > E, p.f = rank / 2, p.r = rank % 2, p.El = E / 2, p.Ef = p.dim1 ? p.El : p.El / 2;
    p.sum_comm = world;
    HP_CHECK(hp_ep_local_expert_bytes(p.ep) * 4 == (size_t)2 * 3 * E * 24 * 48 * sizeof(float), "expert FSDP bytes %zu",
             hp_ep_local_expert_bytes(p.ep));
    /* every expert tensor is the reference's slice; after an HF export of the reference and an
     * import into this layout (qwen3_moe) too: the import reads exactly this rank's slices */
    char dir[64] = "";
    for (int pass = 0; pass < (strcmp(name, "qwen3_moe") ? 1 : 2); pass++) {
        if (pass) {
            snprintf(dir, sizeof dir, "/tmp/hp_test_ep_hf_%d_%d_XXXXXX", E, rank);
            HP_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
            HP_CHECK_OK(hp_hf_export(dir, hp_model_hf_adapter(&p.c), &p.c, hp_model_params(p.ref), hp_model_num_params(p.ref), NULL, HP_F32, 0));
            for (int i = 0; i < hp_model_num_params(p.m); i++) {
                hp_param_t *pe = &hp_model_params(p.m)[i];
                if (hp_ep_is_expert_param(pe))
                    memset(hp_param_w(pe), 0, sizeof(float) * (size_t)hp_tensor_numel(&pe->value.local));
            }
            HP_CHECK_OK(hp_hf_import(dir, hp_model_hf_adapter(&p.c), &p.c, hp_model_params(p.m), hp_model_num_params(p.m), NULL));
        }
        for (int i = 0; i < hp_model_num_params(p.ref); i++) {
            const hp_param_t *pr = &hp_model_params(p.ref)[i], *pe = hp_model_find_param(p.m, pr->name);
            if (!hp_ep_is_expert_param(pr) || !pe) continue;
            const size_t n = (size_t)hp_tensor_numel(&pe->value.local);
            float *want = malloc(sizeof(float) * n);
            want_efsdp(&p, pr, hp_param_w(pr), want, n);
            if (pass)
                HP_CHECK(memcmp(hp_param_w(pe), want, sizeof(float) * n) == 0, "rank %d: HF import of %s under expert "
                         "FSDP (Shard(%d)) is not the single-rank slice", rank, pr->name, p.dim1);
            else
                HP_CHECK(pe->value.local.shape[0] == p.Ef &&
                         pe->value.local.shape[1] * (p.dim1 ? 2 : 1) == pr->value.local.shape[1] &&
                         memcmp(hp_param_w(pe), want, sizeof(float) * n) == 0 &&
                         hp_placement_equal(pe->value.placements[0], p.dim1 ? hp_shard(1) : hp_strided_shard(0, 2)) &&
                         hp_placement_equal(pe->value.placements[1], hp_shard(0)),
                         "rank %d: %s is not the single-rank model's slice (placement on efsdp, dim %d)", rank,
                         pr->name, p.dim1);
            free(want);
        }
    }
    if (dir[0]) {
        char cmd[100];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        HP_CHECK(system(cmd) == 0, "rm %s", dir);
    }
    char what[80];
    snprintf(what, sizeof what, "%s ep 2 x efsdp 2, %d experts (Shard(%d))", name, E, p.dim1);
    check_step(&p, want_efsdp, what);
    pair_destroy(&p);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    run("deepseek_v3", world, rank, ws);
    run("qwen3_moe", world, rank, ws);
    run_tp("deepseek_v3", world, rank, ws);
    run_tp("qwen3_moe", world, rank, ws);
    if (ws == 4) {
        run_etp("deepseek_v3", world, rank);
        run_etp("qwen3_moe", world, rank);
        run_efsdp("deepseek_v3", world, rank, 8);
        run_efsdp("qwen3_moe", world, rank, 8);
        run_efsdp("deepseek_v3", world, rank, 2);   // efsdp x ep > E: Shard(1)
        run_efsdp("qwen3_moe", world, rank, 2);
    }
    // the degree must divide the experts (named)
    hp_model_config_t c;
    HP_CHECK_OK(hp_model_flavor("qwen3_moe", "debugmodel", &c));
    c.moe_experts = 6;
    c.moe_top_k = 2;
    if (ws == 4) {
        hp_model_t m = NULL;
        HP_CHECK_OK(hp_model_create(&c, 1, 8, &m));
        hp_mesh_t mesh = NULL;
        const int64_t shape[1] = {ws};
        const char *dn[1] = {"ep"};
        HP_CHECK_OK(hp_mesh_create(world, 1, shape, dn, &mesh));
        hp_ep_t ep = NULL;
        HP_CHECK_ERR(hp_ep_parallelize_model(m, mesh, &ep), HP_ERR_INVALID_ARG, "does not divide the 6 experts");
        hp_mesh_destroy(mesh);
        hp_model_destroy(m);
    }
    return hp_test_mpi_finish("test_ep");
}
