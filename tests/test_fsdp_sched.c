/* fully_shard schedule and misuse on a 4-layer llama3 debug model (units: tok_embeddings,
 * layers.0-3, root = norm + output):
 * - collectives per step follow PyTorch's test_fully_shard_communication_count with G = 6
 *   groups: forward all-gathers G; backward all-gathers G-1 (reshard_after_forward None: the
 *   root is kept), G (True), 0 (False); reduce-scatters G; HSDP adds G all-reduces; a
 *   backward without gradient sync reduces nothing.
 * - the unshard / reshard / post_backward event order equals PyTorch's prefetch tests
 *   (test_fully_shard_comm.py) mapped onto our units: overlap off = no prefetch; overlap on =
 *   forward prefetch of the next unit (as set_modules_to_forward_prefetch(next 1)) and the
 *   default backward prefetch of the previous unit in post-forward order.
 * - divide factor: the default (AVG) gives the SUM gradients (factor 1) divided by W.
 * - misuse: fully_shard twice, a 3-D mesh, a 2-D mesh without names, a scalar parameter,
 *   set_requires_all_reduce on a 1-D mesh, zero_grad with unreduced no-sync gradients, a bad
 *   reshard_after_forward. (Tied embeddings are supported: tests/test_fsdp_tied.c.) */
// hp-test: ranks 2 4 timeout 900
#include "test_fsdp_util.h"
#include "hp_test_mpi.h"

static void fwd_bwd(hp_model_t m, int step) { fsdp_rank_step(m, step, 1); }

static void counts(hp_comm_t world, int raf, int R, int sync, uint64_t ag, uint64_t rs, uint64_t ar) {
    hp_model_config_t cfg = dp_config(4);
    hp_fsdp_options_t o = hp_fsdp_default_options();
    o.reshard_after_forward = raf;
    o.gradient_divide_factor = 1.0;
    hp_model_t m;
    hp_mesh_t mesh;
    hp_fsdp_t f;
    fsdp_shard_model(world, &cfg, R, &o, &m, &mesh, &f);
    for (int step = 0; f && step < 2; step++) {   // the second step sees the steady state
        HP_CHECK_OK(hp_fsdp_zero_grad(f));
        hp_fsdp_set_requires_gradient_sync(f, sync);
        hp_comm_counts_reset();
        fwd_bwd(m, step);
        hp_comm_counts_t c;
        hp_comm_counts_get(&c);
        HP_CHECK(c.calls[HP_COMM_ALL_GATHER] == ag && c.calls[HP_COMM_REDUCE_SCATTER] == rs &&
                     c.calls[HP_COMM_ALL_REDUCE] == ar,
                 "raf %d R %d sync %d step %d: all-gather %llu reduce-scatter %llu all-reduce %llu, expected "
                 "%llu %llu %llu", raf, R, sync, step, (unsigned long long)c.calls[HP_COMM_ALL_GATHER],
                 (unsigned long long)c.calls[HP_COMM_REDUCE_SCATTER], (unsigned long long)c.calls[HP_COMM_ALL_REDUCE],
                 (unsigned long long)ag, (unsigned long long)rs, (unsigned long long)ar);
        if (!sync) {   // reduce what was accumulated so the model can be destroyed cleanly
            hp_fsdp_set_requires_gradient_sync(f, 1);
            fwd_bwd(m, step);
        }
    }
    hp_fsdp_destroy(f);
    hp_model_destroy(m);
    hp_mesh_destroy(mesh);
}

static void check_events(hp_fsdp_t f, const char *const *expect, int n, const char *what) {
    int got = hp_fsdp_num_events(f);
    int ok = got == n;
    for (int i = 0; ok && i < n; i++) ok = strcmp(hp_fsdp_event(f, i), expect[i]) == 0;
    HP_CHECK(ok, "%s: %d events, expected %d", what, got, n);
    if (!ok && g_rank == 0)
        for (int i = 0; i < (got > n ? got : n); i++)
            fprintf(stderr, "  %2d got %-28s expected %s\n", i, i < got ? hp_fsdp_event(f, i) : "-",
                    i < n ? expect[i] : "-");
}

static void events(hp_comm_t world, int overlap) {
    hp_model_config_t cfg = dp_config(4);
    hp_fsdp_options_t o = hp_fsdp_default_options();
    o.overlap = overlap;
    hp_model_t m;
    hp_mesh_t mesh;
    hp_fsdp_t f;
    fsdp_shard_model(world, &cfg, 1, &o, &m, &mesh, &f);
    if (!f) return;
    hp_fsdp_record_events(f, 1);
    int32_t tok[DP_T], tgt[DP_T];
    dp_sequence(0, 0, g_rank, cfg.vocab_size, tok, tgt);
    float l;
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, 1, DP_T, 100.0f, &l));
    static const char *const fwd_off[] = {
        "unshard tok_embeddings", "reshard tok_embeddings", "unshard layers.0", "reshard layers.0",
        "unshard layers.1", "reshard layers.1", "unshard layers.2", "reshard layers.2",
        "unshard layers.3", "reshard layers.3", "unshard root"};
    // PyTorch set_modules_to_forward_prefetch(next 1): unshard L0, L1, reshard L0, unshard L2, ...
    static const char *const fwd_on[] = {
        "unshard tok_embeddings", "unshard layers.0", "reshard tok_embeddings", "unshard layers.1",
        "reshard layers.0", "unshard layers.2", "reshard layers.1", "unshard layers.3", "reshard layers.2",
        "unshard root", "reshard layers.3"};
    check_events(f, overlap ? fwd_on : fwd_off, 11, overlap ? "forward, overlap on" : "forward, overlap off");
    hp_fsdp_clear_events(f);
    HP_CHECK_OK(hp_model_backward(m));
    static const char *const bwd_off[] = {
        "reshard root", "post_backward root",
        "unshard layers.3", "reshard layers.3", "post_backward layers.3",
        "unshard layers.2", "reshard layers.2", "post_backward layers.2",
        "unshard layers.1", "reshard layers.1", "post_backward layers.1",
        "unshard layers.0", "reshard layers.0", "post_backward layers.0",
        "unshard tok_embeddings", "reshard tok_embeddings", "post_backward tok_embeddings"};
    // PyTorch default backward prefetch (4 layers): unshard L3, unshard L2, reshard L3,
    // post_backward L3, unshard L1, reshard L2, post_backward L2, ... (our root runs first)
    static const char *const bwd_on[] = {
        "unshard layers.3", "reshard root", "post_backward root",
        "unshard layers.2", "reshard layers.3", "post_backward layers.3",
        "unshard layers.1", "reshard layers.2", "post_backward layers.2",
        "unshard layers.0", "reshard layers.1", "post_backward layers.1",
        "unshard tok_embeddings", "reshard layers.0", "post_backward layers.0",
        "reshard tok_embeddings", "post_backward tok_embeddings"};
    check_events(f, overlap ? bwd_on : bwd_off, 17, overlap ? "backward, overlap on" : "backward, overlap off");
    hp_fsdp_destroy(f);
    hp_model_destroy(m);
    hp_mesh_destroy(mesh);
}

static void divide_factor(hp_comm_t world) {
    hp_model_config_t cfg = dp_config(1);
    hp_model_t m[2] = {NULL, NULL};
    hp_fsdp_t f[2] = {NULL, NULL};
    hp_mesh_t mesh = make_mesh(world, 1);
    for (int k = 0; k < 2; k++) {
        HP_ASSERT(hp_model_create(&cfg, DP_B, DP_T, &m[k]) == HP_OK);
        HP_ASSERT(hp_model_init_weights(m[k], DP_SEED) == HP_OK);
        hp_fsdp_options_t o = hp_fsdp_default_options();
        o.gradient_divide_factor = k == 0 ? 0.0 : 1.0;   // unset (AVG) vs 1 (SUM)
        HP_CHECK_OK(hp_fully_shard(m[k], mesh, &o, &f[k]));
        fwd_bwd(m[k], 0);
    }
    const hp_param_t *p = &hp_fsdp_params(f[0])[1];
    int64_t n = p->value.global_shape[0] * p->value.global_shape[1];
    float *a = hp_malloc(sizeof(float) * n), *b = hp_malloc(sizeof(float) * n);
    HP_CHECK_OK(hp_fsdp_full_grad(f[0], 1, a));
    HP_CHECK_OK(hp_fsdp_full_grad(f[1], 1, b));
    for (int64_t i = 0; i < n; i++) a[i] *= (float)g_world;
    HP_CHECK(dp_rel_err(a, b, n) < 1e-6, "AVG x W differs from SUM (rel %.3g)", dp_rel_err(a, b, n));
    free(a);
    free(b);
    for (int k = 0; k < 2; k++) { hp_fsdp_destroy(f[k]); hp_model_destroy(m[k]); }
    hp_mesh_destroy(mesh);
}

static void misuse(hp_comm_t world) {
    hp_model_config_t cfg = dp_config(1);
    hp_model_t m = NULL;
    HP_ASSERT(hp_model_create(&cfg, DP_B, DP_T, &m) == HP_OK);
    HP_ASSERT(hp_model_init_weights(m, DP_SEED) == HP_OK);
    hp_mesh_t mesh = make_mesh(world, 1), m3 = NULL, m2 = NULL;
    hp_fsdp_t f = NULL, f2 = NULL;
    hp_fsdp_options_t o = hp_fsdp_default_options();
    // a 3-D mesh; a 2-D mesh without names
    int64_t s3[3] = {1, 1, g_world};
    const char *n3[3] = {"a", "b", "c"};
    HP_ASSERT(hp_mesh_create(world, 3, s3, n3, &m3) == HP_OK);
    HP_CHECK_ERR(hp_fully_shard(m, m3, &o, &f2), HP_ERR_INVALID_ARG, "fully_shard expects a 1D or 2D DeviceMesh");
    int64_t s2[2] = {1, g_world};
    HP_ASSERT(hp_mesh_create(world, 2, s2, NULL, &m2) == HP_OK);
    HP_CHECK_ERR(hp_fully_shard(m, m2, &o, &f2), HP_ERR_INVALID_ARG, "mesh_dim_names");
    o.reshard_after_forward = 3;
    HP_CHECK_ERR(hp_fully_shard(m, mesh, &o, &f2), HP_ERR_INVALID_ARG, "reshard_after_forward = 3");
    o = hp_fsdp_default_options();
    // a scalar parameter
    hp_param_t sc;
    memset(&sc, 0, sizeof(sc));
    snprintf(sc.name, sizeof(sc.name), "scale");
    sc.value.local.dtype = HP_F32;
    sc.value.local.ndim = 0;
    HP_CHECK_ERR(hp_fsdp_validate_param(&sc), HP_ERR_INVALID_ARG, "Change scale to a 1D tensor with numel equal to 1.");
    // fully_shard twice
    HP_CHECK_OK(hp_fully_shard(m, mesh, &o, &f));
    HP_CHECK_ERR(hp_fully_shard(m, mesh, &o, &f2), HP_ERR_STATE, "already wrapped by fully_shard");
    // conflicting gradient accumulation settings
    HP_CHECK_ERR(hp_fsdp_set_requires_all_reduce(f, 0), HP_ERR_INVALID_ARG, "no replicate");
    hp_fsdp_set_requires_gradient_sync(f, 0);
    fwd_bwd(m, 0);
    HP_CHECK_ERR(hp_fsdp_zero_grad(f), HP_ERR_STATE, "set_requires_gradient_sync(false)");
    hp_fsdp_set_requires_gradient_sync(f, 1);
    fwd_bwd(m, 0);
    HP_CHECK_OK(hp_fsdp_zero_grad(f));
    hp_fsdp_destroy(f);
    hp_model_destroy(m);
    hp_mesh_destroy(m3);
    hp_mesh_destroy(m2);
    hp_mesh_destroy(mesh);
}

int main(int argc, char **argv) {
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &g_rank, &g_world);
    const uint64_t G = 6;
    counts(world, HP_FSDP_RESHARD_DEFAULT, 1, 1, G + G - 1, G, 0);
    counts(world, 1, 1, 1, 2 * G, G, 0);
    counts(world, 0, 1, 1, G, G, 0);
    counts(world, HP_FSDP_RESHARD_DEFAULT, 1, 0, 2 * G - 1, 0, 0);
    if (g_world >= 4) counts(world, HP_FSDP_RESHARD_DEFAULT, 2, 1, 2 * G - 1, G, G);
    events(world, 0);
    events(world, 1);
    divide_factor(world);
    misuse(world);
    return hp_test_mpi_finish("test_fsdp_sched");
}
