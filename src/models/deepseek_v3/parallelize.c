/* deepseek_v3's tensor-parallel plan (TorchTitan's deepseek_v3 apply_non_moe_tp) for the MLA
 * attention: wq (q_lora_rank 0) or wq_b colwise, wkv_b colwise, wo rowwise (heads split over
 * tp); wq_a, q_norm, wkv_a, kv_norm stay replicated (NoParallel); the dense feed-forward and the
 * rest as llama3's. The colwise projections reduce their own input gradients (wkv_a's is already
 * complete), and the shared k_pe gradient is summed over the TP ranks by the MLA module itself
 * (its wq shard is Shard(0) on the TP mesh). */
#include <string.h>
#include "models/models-impl.h"

models_tp_plan_fn deepseek_v3_tp_plan;

int deepseek_v3_tp_plan(const hp_model_config_t *c, int sp, int loss_parallel, hp_tp_plan_entry_t *plan, int cap) {
    // the llama entries with the attention's replaced
    hp_tp_plan_entry_t all[32];
    const int n_all = decoder_tp_plan(c, sp, loss_parallel, all, 32);
    hp_placement_t seq = sp ? hp_shard(1) : hp_replicate();
    int n = 0;
    for (int i = 0; i < n_all && i < 32; i++) {
        if (!strncmp(all[i].pattern, "layers.*.attention.", 19)) continue;
        if (plan && n < cap) plan[n] = all[i];
        n++;
        if (!strcmp(all[i].pattern, "layers.*.attention")) {
            n = hp_tp_plan_add(plan, cap, n, c->q_lora_rank > 0 ? "layers.*.attention.wq_b" : "layers.*.attention.wq",
                               hp_tp_colwise());
            n = hp_tp_plan_add(plan, cap, n, "layers.*.attention.wkv_b", hp_tp_colwise());
            n = hp_tp_plan_add(plan, cap, n, "layers.*.attention.wo", hp_tp_with_output(hp_tp_rowwise(), seq, 1));
        }
    }
    return n;
}
