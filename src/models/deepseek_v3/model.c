/* deepseek_v3 (TorchTitan's deepseek_v3; docs/moe.md): MLA attention (src/nn/mla.c)
 * with YaRN RoPE on interleaved pairs, and DeepSeek's MoE (sigmoid router, node-limited groups,
 * route_scale, shared experts, dense first layers). The model args of its flavors, its
 * architecture and its registry spec; its TP plan is in parallelize.c, its HF state-dict
 * adapter and config.json mapping in state_dict_adapter.c. */
#include <string.h>
#include "models/models-impl.h"

static int args(const char *flavor, hp_model_config_t *c) {
    if (strcmp(flavor, "debugmodel") == 0) {   // TorchTitan's deepseek_v3 debugmodel sizes
        decoder_llama_args(c, flavor, 256, 6, 16, 16, 256, 0.0f, 2048);
        c->hidden_dim = 1024;
        decoder_moe_args(c, 8, 3, 256, 2, HP_MOE_SCORE_SOFTMAX, 0, 1.0f, 0, 0, 1);
        decoder_mla_args(c, 0, 512, 128, 64, 128, 0.70f);
    } else if (strcmp(flavor, "671B") == 0) {
        decoder_llama_args(c, flavor, 7168, 61, 128, 128, 256, 0.0f, 129280);
        c->hidden_dim = 18432;
        decoder_moe_args(c, 256, 8, 2048, 1, HP_MOE_SCORE_SIGMOID, 1, 2.5f, 8, 4, 3);
        decoder_mla_args(c, 1536, 512, 128, 64, 128, 1.0f);
    } else {
        return 0;
    }
    c->rope_scaling = 0;   // YaRN (decoder_mla_args), not Llama 3.1's
    return 1;
}

models_tp_plan_fn deepseek_v3_tp_plan;                     /* parallelize.c */
extern const models_hf_family_t deepseek_v3_hf;   /* state_dict_adapter.c */

const hp_model_spec_t hp_deepseek_v3_spec = {
    "deepseek_v3", "debugmodel, 671B", args, &decoder_arch_interleaved, deepseek_v3_tp_plan, &deepseek_v3_hf.adapter,
    hp_parallelize_decoder,
};
