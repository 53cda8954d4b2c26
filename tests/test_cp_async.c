/* The asynchronous context-parallel core (HyperParallel's AsyncContextParallel: the K/V
 * collective started from the q|k|v projection's post-forward hook, waited in the core) gives
 * bitwise the loss and every parameter gradient of the synchronous core, for llama3 and qwen3
 * (qk-norm: the core applies k-norm and RoPE to the rows it receives), every rotate method
 * and balancer, Ulysses (cp) and on 4 ranks the hybrid Ulysses 2 x ring 2 (whose ring stays
 * synchronous), and under full activation checkpointing (the recomputed forward starts its
 * collective again); one collective per attention forward was started by a hook. On 4 ranks,
 * cp 2 x tp 2 (sequence and loss parallel): tensor parallel applied before or after context
 * parallel gives bitwise the same loss and local gradients, synchronous and asynchronous (the
 * projection hook follows the q|k|v projection to the wrapper TP puts in its place). The
 * comparison is exact (same kernels, same summation orders); a 1-ulp change of one gradient
 * fails it. */
// hp-test: ranks 2 4 timeout 120
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/cp.h"
#include "hyperparallel/tp.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hp_test_mpi.h"

enum { T = 32, B = 2, L = 2 };

static hp_comm_t world;
static int rank, ws;

/* One forward + backward of the rank's rows (B sequences of T / cp) of a fixed batch under CP
 * c, after init: the loss, and every local gradient (n_grads params, numel floats) copied out. */
static void step(hp_model_t m, hp_cp_t c, const hp_model_config_t *mc, float *loss, float **grads, int *n_grads,
                 size_t *numel) {
    HP_CHECK_OK(hp_model_init_weights(m, 11));
    int32_t tok[B * T], tgt[B * T], lt[B * T], lg[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 7919 + 5) % mc->vocab_size;
        tgt[i] = (i * 104729 + 3) % mc->vocab_size;
    }
    HP_CHECK_OK(hp_cp_shard_tokens(c, lt, tok, B));
    HP_CHECK_OK(hp_cp_shard_tokens(c, lg, tgt, B));
    HP_CHECK_OK(hp_model_zero_grad(m));
    HP_CHECK_OK(hp_model_forward(m, lt, lg, B, T / hp_cp_degree(c), (float)(B * T), loss));
    HP_CHECK_OK(hp_model_backward(m));
    const hp_param_t *p = hp_model_params(m);
    *n_grads = hp_model_num_params(m);
    size_t tot = 0;
    for (int i = 0; i < *n_grads; i++) tot += (size_t)hp_tensor_numel(&p[i].grad.local);
    *grads = malloc(sizeof(float) * tot);
    *numel = tot;
    for (int i = 0, off = 0; i < *n_grads; i++) {
        const size_t n = (size_t)hp_tensor_numel(&p[i].grad.local);
        memcpy(*grads + off, p[i].grad.local.data, sizeof(float) * n);
        off += (int)n;
    }
}

/* One forward + backward of the rank's rows under CP (opt); loss and all gradients out. */
static long run(const hp_model_config_t *mc, const hp_cp_options_t *opt, int ac, float *loss, float **grads,
                int *n_grads, size_t *numel) {
    hp_model_t m = NULL;
    hp_cp_t c = NULL;
    long launches = -1;
    HP_CHECK_OK(hp_model_create(mc, B, T, &m));
    HP_CHECK_OK(hp_cp_create(world, opt, B, T, mc->n_heads, mc->n_kv_heads, mc->head_dim, &c));
    if (!m || !c) return -1;
    if (ac) HP_CHECK_OK(hp_model_set_activation_checkpoint(m, 1));   // the trainer's order: AC, then CP
    HP_CHECK_OK(hp_cp_apply(c, m));
    step(m, c, mc, loss, grads, n_grads, numel);
    launches = hp_cp_async_count(c);
    hp_model_destroy(m);
    hp_cp_destroy(c);
    return launches;
}

/* 1 when loss and every gradient element are bitwise equal. */
static int same(float la, const float *a, float lb, const float *b, size_t n) {
    return memcmp(&la, &lb, sizeof la) == 0 && memcmp(a, b, sizeof(float) * n) == 0;
}

/* The family's debugmodel, small: L layers, dim 64, 4 heads / 2 kv heads of 16. */
static hp_model_config_t small_config(const char *model) {
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor(model, "debugmodel", &mc));
    mc.n_layers = L;
    mc.dim = 64;
    mc.n_heads = 4;
    mc.n_kv_heads = 2;
    mc.head_dim = 16;
    mc.hidden_dim = 128;   // the feed-forward is not what is tested: keep it small
    mc.max_seq_len = T;
    return mc;
}

static void variant(const char *model, hp_cp_rotate_t rot, hp_cp_balancer_t lb, int U, int ac, int negative) {
    hp_model_config_t mc = small_config(model);
    hp_cp_options_t o = hp_cp_options_default();
    o.rotate = rot;
    o.balancer = lb;
    o.ulysses_degree = U;
    float ls = 0, la = 0, *gs = NULL, *ga = NULL;
    int ns = 0, na = 0;
    size_t es = 0, ea = 0;
    const long sync_n = run(&mc, &o, ac, &ls, &gs, &ns, &es);
    o.async = 1;
    const long async_n = run(&mc, &o, ac, &la, &ga, &na, &ea);
    HP_CHECK(sync_n == 0 && async_n == (ac ? 2 : 1) * L, "%s: %ld / %ld collectives started from projection hooks "
             "(sync / async), expected 0 / %d (one per attention forward, recomputation included)", model, sync_n,
             async_n, (ac ? 2 : 1) * L);
    HP_CHECK(ns == na && es == ea && es > 0, "%s: gradient tables differ (%d / %d params)", model, ns, na);
    if (gs && ga && es == ea) {
        int ok = same(ls, gs, la, ga, es);
        size_t first = 0;
        while (first < es && memcmp(&gs[first], &ga[first], sizeof(float)) == 0) first++;
        HP_CHECK(ok, "%s cp %d (%s, %s, ulysses %d, ac %d): async loss %.9g vs sync %.9g, first gradient difference at "
                 "element %zu of %zu", model, ws, rot == HP_CP_ROTATE_ALLGATHER ? "allgather" : "alltoall",
                 lb == HP_CP_BALANCE_HEADTAIL ? "headtail" : "none", U, ac, la, ls, first, es);
        if (negative) {   // the exact comparison sees a 1-ulp change of one gradient element
            ga[es / 2] = nextafterf(ga[es / 2], INFINITY);
            HP_CHECK(!same(ls, gs, la, ga, es), "negative test: a 1-ulp gradient change passed the comparison");
        }
        if (rank == 0)
            printf("%s cp %d (%s, %s, ulysses %d%s): async == sync bitwise (loss %.7f, %zu gradient elements)\n",
                   model, ws, rot == HP_CP_ROTATE_ALLGATHER ? "allgather" : "alltoall",
                   lb == HP_CP_BALANCE_HEADTAIL ? "headtail" : "none", U, ac ? ", full AC" : "", la, es);
    }
    free(gs);
    free(ga);
}

/* cp 2 x tp 2 on 4 ranks, TP then CP (tp_first) or CP then TP; loss and the local gradients. */
static long run_tp(const hp_model_config_t *mc, int async, int tp_first, float *loss, float **grads, size_t *numel) {
    const int64_t shape[2] = {2, 2};
    const char *names[2] = {"cp", "tp"}, *tpn[1] = {"tp"};
    hp_mesh_t mesh = NULL, tpm = NULL;
    HP_CHECK_OK(hp_mesh_create(world, 2, shape, names, &mesh));
    HP_CHECK_OK(hp_mesh_slice(mesh, 1, tpn, &tpm));
    hp_model_t m = NULL;
    hp_cp_t c = NULL;
    hp_tp_t tp = NULL;
    hp_cp_options_t o = hp_cp_options_default();
    o.async = async;
    HP_CHECK_OK(hp_model_create(mc, B, T, &m));
    HP_CHECK_OK(hp_cp_create(hp_mesh_get_comm(mesh, 0), &o, B, T, mc->n_heads / 2, mc->n_kv_heads / 2, mc->head_dim,
                             &c));
    hp_tp_plan_entry_t plan[32];
    const int np = hp_model_spec_find(mc->name)->tp_plan(mc, 1, 1, plan, 32);
    if (!m || !c || !tpm) return -1;
    if (tp_first) HP_CHECK_OK(hp_tp_parallelize_model(&tp, m, tpm, plan, np));
    HP_CHECK_OK(hp_cp_apply(c, m));
    if (!tp_first) HP_CHECK_OK(hp_tp_parallelize_model(&tp, m, tpm, plan, np));
    int n_grads;
    step(m, c, mc, loss, grads, &n_grads, numel);
    const long launches = hp_cp_async_count(c);
    hp_tp_destroy(tp);
    hp_model_destroy(m);
    hp_cp_destroy(c);
    hp_mesh_destroy(tpm);
    hp_mesh_destroy(mesh);
    return launches;
}

static void tp_order(const char *model) {
    hp_model_config_t mc = small_config(model);
    float l[4] = {0};
    float *g[4] = {NULL};
    size_t e[4] = {0};
    long n[4];
    for (int k = 0; k < 4; k++) n[k] = run_tp(&mc, k / 2, k % 2, &l[k], &g[k], &e[k]);   // (async, tp_first)
    HP_CHECK(n[0] == 0 && n[1] == 0 && n[2] == L && n[3] == L, "%s cp 2 x tp 2: %ld %ld %ld %ld hook-started "
             "collectives (sync CP-TP, TP-CP, async CP-TP, TP-CP), expected 0 0 %d %d", model, n[0], n[1], n[2], n[3],
             L, L);
    for (int k = 1; k < 4; k++)
        HP_CHECK(g[0] && g[k] && e[k] == e[0] && same(l[0], g[0], l[k], g[k], e[0]), "%s cp 2 x tp 2: run %d (%s, %s) "
                 "differs from synchronous CP then TP (loss %.9g vs %.9g)", model, k, k / 2 ? "async" : "sync",
                 k % 2 ? "TP then CP" : "CP then TP", l[k], l[0]);
    if (rank == 0)
        printf("%s cp 2 x tp 2: CP then TP == TP then CP bitwise, sync and async (loss %.7f)\n", model, l[0]);
    for (int k = 0; k < 4; k++) free(g[k]);
}

int main(int argc, char **argv) {
    world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    variant("llama3", HP_CP_ROTATE_ALLGATHER, HP_CP_BALANCE_HEADTAIL, 1, 0, 1);
    variant("llama3", HP_CP_ROTATE_ALLTOALL, HP_CP_BALANCE_NONE, 1, 0, 0);
    variant("qwen3", HP_CP_ROTATE_ALLGATHER, HP_CP_BALANCE_NONE, 1, 0, 0);
    variant("qwen3", HP_CP_ROTATE_ALLTOALL, HP_CP_BALANCE_HEADTAIL, 1, 1, 0);   // under full activation checkpointing
    variant("qwen3", HP_CP_ROTATE_ALLTOALL, HP_CP_BALANCE_HEADTAIL, 2, 0, 0);   // Ulysses 2 (hybrid 2 x 2 on 4 ranks)
    variant("llama3", HP_CP_ROTATE_ALLGATHER, HP_CP_BALANCE_NONE, 2, 0, 0);     // Ulysses 2, no balancing
    if (ws == 4) {
        tp_order("llama3");
        tp_order("qwen3");
    }
    int rc = hp_test_finish("test_cp_async");
    hp_comm_finalize();
    return rc;
}
