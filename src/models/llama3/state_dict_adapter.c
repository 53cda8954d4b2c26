/* llama3's HF state-dict adapter (LlamaForCausalLM, model_type "llama"): the decoder's names,
 * with the q/k rows permuted (HF keeps rotate_half order, the model interleaved pairs), and its
 * config.json mapping (no q/k norm, no sliding window, LlamaConfig's defaults). */
#include "models/models-impl.h"

extern const hp_hf_adapter_t llama3_hf_adapter;

static hp_status_t check(const hp_model_config_t *mc, const char *what) {
    HP_TRY(models_hf_refuse_experts(mc, what));
    return models_hf_refuse_qk_norm(mc, what, 0, "LlamaForCausalLM has no q_norm/k_norm",
                                    "use model.name qwen3 for a model with qk_norm");
}

static hp_status_t read_keys(const hfj_t *c, hp_model_config_t *mc, int64_t max_pos) {
    return models_hf_read_rope(c, mc);
}

static char *config_json(const hp_model_config_t *mc, hp_dtype_t dtype) {
    json_object *c = models_hf_decoder_json(&llama3_hf_adapter, mc, dtype);
    json_object_object_add(c, "mlp_bias", json_object_new_boolean(0));
    json_object_object_add(c, "pretraining_tp", json_object_new_int(1));
    return models_hf_json_text(c);
}

static const hp_hf_name_pair_t *const names[] = {models_hf_decoder_names, NULL};

const hp_hf_adapter_t llama3_hf_adapter = {
    "llama3", "llama", "LlamaForCausalLM", names, 1, check, hp_hf_read_config, hp_hf_config_diff, config_json,
};
/* LlamaConfig: max_position_embeddings 2048 by default */
const struct hp_model_hf_config llama3_hf_config = {2048, 0, 1, read_keys, NULL};
