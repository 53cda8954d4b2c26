/* qwen3_moe (Qwen3-MoE; docs/moe.md): softmax router with route_norm, no shared
 * experts, qk-norm GQA with rotate_half RoPE. The model args of its flavors, its architecture
 * and TP plan, and its registry spec; its HF state-dict adapter and config.json mapping are in
 * state_dict_adapter.c. */
#include <string.h>
#include "models/models-impl.h"

static int args(const char *flavor, hp_model_config_t *c) {
    if (strcmp(flavor, "debugmodel") == 0) {
        decoder_qwen_args(c, flavor, 256, 4, 16, 8, 32, 768, 2048);
        decoder_moe_args(c, 8, 2, 256, 0, HP_MOE_SCORE_SOFTMAX, 1, 1.0f, 0, 0, 1);
    } else if (strcmp(flavor, "30B-A3B") == 0) {   // Qwen3-30B-A3B: every layer MoE
        decoder_qwen_args(c, flavor, 2048, 48, 32, 4, 128, 6144, 151936);
        decoder_moe_args(c, 128, 8, 768, 0, HP_MOE_SCORE_SOFTMAX, 1, 1.0f, 0, 0, 0);
    } else {
        return 0;
    }
    c->tie_embeddings = 0;
    return 1;
}

extern const models_hf_family_t qwen3_moe_hf;   /* state_dict_adapter.c */

/* The TP plan is the llama plan (the decoder's, models-impl.h) for the attention and the dense
 * layers; the experts are sharded by expert parallel (ep.h). */
const hp_model_spec_t hp_qwen3_moe_spec = {
    "qwen3_moe", "debugmodel, 30B-A3B", args, &decoder_arch_half, decoder_tp_plan, &qwen3_moe_hf.adapter,
    hp_parallelize_decoder,
};
