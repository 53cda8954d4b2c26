/* llama3's HF state-dict adapter (LlamaForCausalLM, model_type "llama"): the decoder's names,
 * with the q/k rows permuted (HF keeps rotate_half order, the model interleaved pairs), and its
 * config.json mapping (no q/k norm, no sliding window, LlamaConfig's defaults). */
#include "models/models-impl.h"

static void write_keys(json_object *c, const hp_model_config_t *mc) {
    models_hf_write_llama_rope(c, mc);
    json_object_object_add(c, "mlp_bias", json_object_new_boolean(0));
    json_object_object_add(c, "pretraining_tp", json_object_new_int(1));
}

static const hp_hf_name_pair_t *const names[] = {models_hf_decoder_names, NULL};

/* q/k rows permuted; LlamaConfig: max_position_embeddings 2048 by default, no q/k norm, no sliding window */
const models_hf_family_t llama3_hf = {
    {"llama3", "llama", "LlamaForCausalLM", names, 1, MODELS_HF_HOOKS},
    2048, 0, 1, models_hf_read_rope, NULL, write_keys, NULL,
};
