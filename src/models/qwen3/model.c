/* qwen3 (TorchTitan's qwen3, dense): the model args of its flavors, its architecture (the
 * decoder with qk-norm and rotate_half RoPE), its TP plan and its registry spec. Its HF
 * state-dict adapter and config.json mapping are in state_dict_adapter.c. */
#include <string.h>
#include "models/models-impl.h"

static int args(const char *flavor, hp_model_config_t *c) {
    if (strcmp(flavor, "debugmodel") == 0)
        decoder_qwen_args(c, flavor, 256, 8, 16, 8, 128, 3072, 2048);
    else if (strcmp(flavor, "0.6B") == 0)
        decoder_qwen_args(c, flavor, 1024, 28, 16, 8, 128, 3072, 151936);
    else
        return 0;
    return 1;
}

static hp_status_t build(hp_model_t m, int unit, hp_param_t **params, int n_params, hp_module_t **out) {
    return decoder_build(m, unit, params, n_params, out, HP_ROPE_HALF);   // rotate_half
}

static const hp_model_arch_t arch = {decoder_n_units, decoder_unit_kind, decoder_declare, build};

extern const hp_hf_adapter_t qwen3_hf_adapter;             /* state_dict_adapter.c */
extern const struct hp_model_hf_config qwen3_hf_config;

/* TorchTitan's qwen3 uses the llama plan (the decoder's, models-impl.h); its q_norm / k_norm
 * (SequenceParallel over the head dim there) are parameters of the attention module here,
 * reduced by its wrapper. */
const hp_model_spec_t hp_qwen3_spec = {
    "qwen3", "debugmodel, 0.6B", args, &arch, decoder_tp_plan, &qwen3_hf_adapter, &qwen3_hf_config,
};
