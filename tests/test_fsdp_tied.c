/* fully_shard of a model with tied embeddings: the qwen3 debug model with 2 layers, whose
 * output projection uses tok_embeddings.weight. The embedding and the root (norm + output) are
 * one FSDP group, as fully_shard([tok_embeddings, norm, output]) (docs/fsdp.md):
 * - parity with the single-rank run (harness and tolerances of tests/test_fsdp_util.h): FSDP
 *   over every rank for 10 AdamW steps, overlap off (bitwise equal losses), reshard_after_
 *   forward True and False, no-sync accumulation, bf16 params vs a 1-rank mesh, and on 4 ranks
 *   HSDP 2 x 2 (10 steps) and reshard_after_forward = 2;
 * - the gradient of the shared weight is the sum of both uses (the single-rank gradient);
 * - collectives per step with G = L + 1 groups and the event order of the merged group:
 *   unsharded at the embedding's pre-forward, resharded after the root's forward (when
 *   reshard_after_forward says so), gathered for backward at the root's pre-backward, resharded
 *   and reduced once, after the embedding's backward. */
// hp-test: ranks 4 timeout 900 coretype 2
#include "test_fsdp_util.h"
#include "hp_test_mpi.h"

#define TIED_LAYERS 2

static hp_model_config_t tied_config(void) {
    hp_model_config_t c;
    HP_ASSERT(hp_model_flavor("qwen3", "debugmodel", &c) == HP_OK);
    c.n_layers = TIED_LAYERS;
    c.max_seq_len = 64;
    return c;
}

static void check_events(hp_fsdp_t f, const char *const *expect, int n, const char *what, const char *setting) {
    int got = hp_fsdp_num_events(f);
    int ok = got == n;
    for (int i = 0; ok && i < n; i++) ok = strcmp(hp_fsdp_event(f, i), expect[i]) == 0;
    HP_CHECK(ok, "%s (%s): %d events, expected %d", what, setting, got, n);
    if (!ok && g_rank == 0)
        for (int i = 0; i < (got > n ? got : n); i++)
            fprintf(stderr, "  %2d got %-34s expected %s\n", i, i < got ? hp_fsdp_event(f, i) : "-",
                    i < n ? expect[i] : "-");
}

/* Collective counts of the second step and the event order of the first (reshard_after_forward
 * Default or True), for one (reshard_after_forward, overlap) setting. */
static void schedule(hp_comm_t world, int raf, int overlap) {
    hp_model_config_t cfg = tied_config();
    hp_fsdp_options_t o = hp_fsdp_default_options();
    o.reshard_after_forward = raf;
    o.overlap = overlap;
    o.gradient_divide_factor = 1.0;
    hp_model_t m;
    hp_mesh_t mesh;
    hp_fsdp_t f;
    fsdp_shard_model(world, &cfg, 1, &o, &m, &mesh, &f);
    if (!f) { hp_model_destroy(m); hp_mesh_destroy(mesh); return; }
    char what[64];
    snprintf(what, sizeof what, "raf %d overlap %d", raf, overlap);
    // events, step 0
    const int ev = raf != 0;
    hp_fsdp_record_events(f, ev);
    fsdp_rank_step(m, 0, 0);
    static const char *const fwd_off[] = {
        "unshard tok_embeddings+root", "unshard layers.0", "reshard layers.0", "unshard layers.1",
        "reshard layers.1", "reshard tok_embeddings+root"};
    // the next unit's all-gather is issued at each pre-forward; the tied group stays gathered
    // from the embedding to the root, so the prefetch before the root is a no-op
    static const char *const fwd_on[] = {
        "unshard tok_embeddings+root", "unshard layers.0", "unshard layers.1", "reshard layers.0",
        "reshard layers.1", "reshard tok_embeddings+root"};
    const int nf = raf == 1 ? 6 : 5;   // Default: the tied group (root) stays gathered
    if (ev) check_events(f, overlap ? fwd_on : fwd_off, nf, "forward", what);
    hp_fsdp_clear_events(f);
    HP_CHECK_OK(hp_model_backward(m));
    // raf True: the root's pre-backward gathers the tied group again (first event)
    static const char *const bwd_off[] = {
        "unshard tok_embeddings+root",
        "unshard layers.1", "reshard layers.1", "post_backward layers.1",
        "unshard layers.0", "reshard layers.0", "post_backward layers.0",
        "reshard tok_embeddings+root", "post_backward tok_embeddings+root"};
    static const char *const bwd_on[] = {
        "unshard tok_embeddings+root",
        "unshard layers.1", "unshard layers.0", "reshard layers.1", "post_backward layers.1",
        "reshard layers.0", "post_backward layers.0",
        "reshard tok_embeddings+root", "post_backward tok_embeddings+root"};
    const int skip = raf == 1 ? 0 : 1;
    if (ev) check_events(f, (overlap ? bwd_on : bwd_off) + skip, 9 - skip, "backward", what);
    hp_fsdp_record_events(f, 0);
    // collectives, step 1 (G = L + 1 groups): forward G all-gathers; backward G - 1 (Default,
    // False: the tied group is kept) or G (True); G reduce-scatters
    const uint64_t G = TIED_LAYERS + 1;
    HP_CHECK_OK(hp_fsdp_zero_grad(f));
    hp_comm_counts_reset();
    fsdp_rank_step(m, 1, 0);
    HP_CHECK_OK(hp_model_backward(m));
    hp_comm_counts_t c;
    hp_comm_counts_get(&c);
    const uint64_t ag = G + (raf == 1 ? G : raf == 0 ? 0 : G - 1);
    HP_CHECK(c.calls[HP_COMM_ALL_GATHER] == ag && c.calls[HP_COMM_REDUCE_SCATTER] == G,
             "%s: all-gather %llu reduce-scatter %llu, expected %llu %llu", what,
             (unsigned long long)c.calls[HP_COMM_ALL_GATHER], (unsigned long long)c.calls[HP_COMM_REDUCE_SCATTER],
             (unsigned long long)ag, (unsigned long long)G);
    hp_fsdp_destroy(f);
    hp_model_destroy(m);
    hp_mesh_destroy(mesh);
}

int main(int argc, char **argv) {
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &g_rank, &g_world);
    g_cfg = tied_config();
    g_cfg_set = 1;

    double l_on[10], l_off[10];
    const pcase_t base = {"tied fsdp f32", 10, 1, 0, HP_FSDP_RESHARD_DEFAULT, 1, 1, HP_F32, HP_F32, DP_INJECT_NONE};
    run_case_overlap_off(world, &base, "tied fsdp f32 overlap off", l_on);
    pcase_t c = base; c.what = "tied fsdp reshard_after_forward True"; c.raf = 1; c.steps = 2;
    run_case(world, &c, l_off);
    dp_check_same_losses(l_on, l_off, 2, "reshard True", "Default");
    c = base; c.what = "tied fsdp reshard_after_forward False"; c.raf = 0; c.steps = 2;
    run_case(world, &c, l_off);
    c = base; c.what = "tied fsdp accum 2 (no sync until last)"; c.accum = 2; c.nosync = 1; c.steps = 2;
    run_case(world, &c, l_off);
    c = base; c.what = "tied fsdp bf16 params, f32 reduce"; c.pdt = HP_BF16; c.steps = 2;
    run_case(world, &c, l_off);
    if (g_world >= 4) {
        c = base; c.what = "tied hsdp 2 x W/2"; c.R = 2;
        run_case(world, &c, l_off);
        c = base; c.what = "tied fsdp reshard_after_forward 2"; c.raf = 2; c.steps = 2;
        run_case(world, &c, l_off);
    }
    schedule(world, HP_FSDP_RESHARD_DEFAULT, 0);
    schedule(world, HP_FSDP_RESHARD_DEFAULT, 1);
    schedule(world, 1, 1);
    schedule(world, 0, 1);
    return hp_test_mpi_finish("test_fsdp_tied");
}
