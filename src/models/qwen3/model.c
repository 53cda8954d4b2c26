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

extern const models_hf_family_t qwen3_hf;   /* state_dict_adapter.c */

/* TorchTitan's qwen3 uses the llama plan (the decoder's, models-impl.h); its q_norm / k_norm
 * (SequenceParallel over the head dim there) are parameters of the attention module here,
 * reduced by its wrapper. */
const hp_model_spec_t hp_qwen3_spec = {
    "qwen3", "debugmodel, 0.6B", args, &decoder_arch_half, decoder_tp_plan, &qwen3_hf.adapter,
    hp_parallelize_decoder,
};
