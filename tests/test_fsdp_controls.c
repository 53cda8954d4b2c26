/* FSDP's explicit controls (issue 26; docs/fsdp.md "Explicit control"): the prefetch lists
 * (set_modules_to_forward_prefetch / set_modules_to_backward_prefetch) and the public unshard /
 * reshard. (1) The llama3 debug model under FSDP with every unit prefetching its next two units
 * in forward and previous two in backward matches the single rank within the parity engine's
 * derived bounds (tests/test_dp_util.h: loss, every gradient, the norm, the weights, 4 steps)
 * and its losses are bitwise those of the implicit prefetches (prefetching moves when an
 * all-gather starts, never what it computes); the events show the lists (layers.2 gathered
 * before layers.0 is resharded), and the rotating pool grows to hold them. (2) A manually
 * unsharded unit exposes the full weights (the full_tensor of its shards) until hp_fsdp_reshard,
 * its pre-forward all-gather is skipped, and a step after it gives bitwise the same loss;
 * misuse is refused. 2 ranks. */
// hp-test: ranks 2 timeout 600
#include "test_fsdp_util.h"
#include "hp_test_mpi.h"

static int event_index(hp_fsdp_t f, const char *e) {
    for (int i = 0; i < hp_fsdp_num_events(f); i++)
        if (strcmp(hp_fsdp_event(f, i), e) == 0) return i;
    return -1;
}

/* One step's loss of this rank's sequences (divisor fixed: bitwise comparisons only). */
static float step_loss(hp_model_t m) {
    int32_t tok[DP_B * DP_T], tgt[DP_B * DP_T];
    const int V = hp_model_config(m)->vocab_size;
    for (int b = 0; b < DP_B; b++) dp_sequence(0, 0, g_rank * DP_B + b, V, tok + b * DP_T, tgt + b * DP_T);
    float l = 0.0f;
    HP_CHECK_OK(hp_model_forward(m, tok, tgt, DP_B, DP_T, 100.0f, &l));
    HP_CHECK_OK(hp_model_backward(m));
    return l;
}

int main(int argc, char **argv) {
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &g_rank, &g_world);
    /* (1) prefetch lists of depth 2 against the single rank, and bitwise against implicit */
    double l_impl[10], l_expl[10];
    const pcase_t base = {"fsdp implicit prefetch", 4, 1, 0, HP_FSDP_RESHARD_DEFAULT, 1, 1, HP_F32, HP_F32,
                          DP_INJECT_NONE};
    run_case(world, &base, l_impl);
    pcase_t c = base;
    c.what = "fsdp explicit prefetch lists (depth 2)";
    g_prefetch = 2;
    run_case(world, &c, l_expl);
    dp_check_same_losses(l_impl, l_expl, 4, "implicit prefetch", "explicit lists");
    c.what = "fsdp explicit prefetch negative: lr x (1 + 1e-3)";   // the harness still sees an error
    c.steps = 2;
    c.inject = DP_INJECT_LR;
    run_case(world, &c, l_expl);
    g_prefetch = 0;

    /* the events and the pool */
    const hp_model_config_t cfg = dp_config(0);
    hp_fsdp_options_t o = hp_fsdp_default_options();
    o.gradient_divide_factor = 1.0;
    hp_model_t m[2];
    hp_mesh_t mesh[2];
    hp_fsdp_t f[2];
    for (int k = 0; k < 2; k++) fsdp_shard_model(world, &cfg, 1, &o, &m[k], &mesh[k], &f[k]);
    const int n_units = hp_model_num_units(m[1]);
    HP_CHECK(hp_fsdp_num_slots(f[0]) == 2, "implicit prefetch: 2 rotating slots (got %d)", hp_fsdp_num_slots(f[0]));
    fsdp_set_prefetch(f[1], n_units, 2);
    HP_CHECK(hp_fsdp_num_slots(f[1]) == 3, "prefetch depth 2: 3 rotating slots (got %d)", hp_fsdp_num_slots(f[1]));
    for (int k = 0; k < 2; k++) hp_fsdp_record_events(f[k], 1);
    float l0 = step_loss(m[0]), l1 = step_loss(m[1]);
    HP_CHECK(l0 == l1, "explicit lists: loss %.9g, implicit %.9g (bitwise equal expected)", l1, l0);
    const int i_impl = event_index(f[0], "unshard layers.2"), r_impl = event_index(f[0], "reshard layers.0");
    const int i_expl = event_index(f[1], "unshard layers.2"), r_expl = event_index(f[1], "reshard layers.0");
    HP_CHECK(i_impl > r_impl && r_impl >= 0, "implicit: layers.2 gathered after layers.0 is resharded (%d, %d)", i_impl,
             r_impl);
    HP_CHECK(i_expl >= 0 && i_expl < r_expl, "explicit depth 2: layers.2 gathered before layers.0 is resharded (%d, %d)",
             i_expl, r_expl);
    /* misuse of the lists */
    int bad = n_units;
    HP_CHECK_ERR(hp_fsdp_set_modules_to_forward_prefetch(f[1], 0, &bad, 1), HP_ERR_INVALID_ARG, "outside the model's units");
    HP_CHECK_ERR(hp_fsdp_set_modules_to_backward_prefetch(f[1], -1, NULL, 0), HP_ERR_INVALID_ARG, "unit -1");

    /* (2) unshard / reshard */
    HP_CHECK_OK(hp_fsdp_zero_grad(f[0]));
    HP_CHECK_OK(hp_fsdp_zero_grad(f[1]));
    const int u = 2, pi = 0;   // layers.1 and its first parameter
    int first = 0, cnt = 0;
    hp_model_unit_params(m[1], u, &first, &cnt);
    const hp_param_t *mp = &hp_model_params(m[1])[first + pi];
    HP_CHECK(!hp_fsdp_is_unsharded(f[1], u) && mp->value.local.data == NULL, "unit %d starts sharded", u);
    hp_fsdp_clear_events(f[1]);
    HP_CHECK_OK(hp_fsdp_unshard(f[1], u, 1));   // async, then waited
    HP_CHECK_OK(hp_fsdp_wait_unshard(f[1], u));
    HP_CHECK(hp_fsdp_is_unsharded(f[1], u) && mp->value.local.data != NULL, "unit %d unsharded", u);
    const size_t n = (size_t)hp_tensor_numel(&mp->value.local);
    float *full = malloc(sizeof(float) * n);
    HP_CHECK_OK(hp_fsdp_full_value(f[1], first + pi, full));
    HP_CHECK(memcmp(full, mp->value.local.data, sizeof(float) * n) == 0, "the unsharded %s is its full tensor", mp->name);
    free(full);
    HP_CHECK_ERR(hp_fsdp_wait_unshard(f[1], 1), HP_ERR_STATE, "no all-gather in flight");
    HP_CHECK_OK(hp_fsdp_reshard(f[1], u));
    HP_CHECK(!hp_fsdp_is_unsharded(f[1], u) && mp->value.local.data == NULL, "unit %d resharded", u);
    /* a step with unit u gathered up front: its pre-forward all-gather is skipped, the loss the same */
    HP_CHECK_OK(hp_fsdp_unshard(f[1], u, 0));
    hp_fsdp_clear_events(f[1]);
    l0 = step_loss(m[0]);
    l1 = step_loss(m[1]);
    HP_CHECK(l0 == l1, "after a manual unshard: loss %.9g, expected %.9g bitwise", l1, l0);
    int gathers = 0;
    for (int i = 0; i < hp_fsdp_num_events(f[1]); i++) gathers += strcmp(hp_fsdp_event(f[1], i), "unshard layers.1") == 0;
    HP_CHECK(gathers == 1, "unit layers.1 gathered once (in backward) after the manual unshard, got %d", gathers);
    for (int k = 0; k < 2; k++) {
        hp_fsdp_destroy(f[k]);
        hp_model_destroy(m[k]);
        hp_mesh_destroy(mesh[k]);
    }
    return hp_test_mpi_finish("test_fsdp_controls");
}
