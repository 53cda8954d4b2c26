/* qwen3's HF state-dict adapter (Qwen3ForCausalLM, model_type "qwen3"): the decoder's names
 * (rotate_half RoPE on both sides: nothing permuted), and its config.json mapping (q/k norm
 * always, the sliding window off, Qwen3Config's defaults). */
#include "models/models-impl.h"

extern const hp_hf_adapter_t qwen3_hf_adapter;

static hp_status_t check(const hp_model_config_t *mc, const char *what) {
    HP_TRY(models_hf_refuse_experts(mc, what));
    return models_hf_refuse_qk_norm(mc, what, 1, "Qwen3ForCausalLM always has q_norm/k_norm",
                                    "keep model.qk_norm true for qwen3");
}

static hp_status_t read_keys(const hfj_t *c, hp_model_config_t *mc, int64_t max_pos) {
    return models_hf_read_rope(c, mc);
}

static char *config_json(const hp_model_config_t *mc, hp_dtype_t dtype) {
    json_object *c = models_hf_decoder_json(&qwen3_hf_adapter, mc, dtype);
    json_object_object_add(c, "use_sliding_window", json_object_new_boolean(0));
    json_object_object_add(c, "sliding_window", NULL);
    json_object_object_add(c, "max_window_layers", json_object_new_int(mc->n_layers));
    return models_hf_json_text(c);
}

static const hp_hf_name_pair_t *const names[] = {models_hf_decoder_names, NULL};

const hp_hf_adapter_t qwen3_hf_adapter = {
    "qwen3", "qwen3", "Qwen3ForCausalLM", names, 0, check, hp_hf_read_config, hp_hf_config_diff, config_json,
};
/* Qwen3Config: max_position_embeddings 32768 by default */
const struct hp_model_hf_config qwen3_hf_config = {32768, 1, 0, read_keys, NULL};
