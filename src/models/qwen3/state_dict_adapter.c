/* qwen3's HF state-dict adapter (Qwen3ForCausalLM, model_type "qwen3"): the decoder's names
 * (rotate_half RoPE on both sides: nothing permuted), and its config.json mapping (q/k norm
 * always, the sliding window off, Qwen3Config's defaults). */
#include "models/models-impl.h"

static void write_keys(json_object *c, const hp_model_config_t *mc) {
    models_hf_write_llama_rope(c, mc);
    json_object_object_add(c, "use_sliding_window", json_object_new_boolean(0));
    json_object_object_add(c, "sliding_window", NULL);
    json_object_object_add(c, "max_window_layers", json_object_new_int(mc->n_layers));
}

static const hp_hf_name_pair_t *const names[] = {models_hf_decoder_names, NULL};

/* Qwen3Config: max_position_embeddings 32768 by default, q/k norm, a sliding window (off) */
const models_hf_family_t qwen3_hf = {
    {"qwen3", "qwen3", "Qwen3ForCausalLM", names, 0, MODELS_HF_HOOKS},
    32768, 1, 0, models_hf_read_rope, NULL, write_keys, NULL,
};
