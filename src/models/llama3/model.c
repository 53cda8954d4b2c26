/* llama3 (TorchTitan's llama3): the model args of its flavors, its architecture (the decoder
 * with RoPE on interleaved pairs), its TP plan and its registry spec. Its HF state-dict adapter
 * and config.json mapping are in state_dict_adapter.c. */
#include <string.h>
#include "models/models-impl.h"

static int args(const char *flavor, hp_model_config_t *c) {
    if (strcmp(flavor, "debugmodel") == 0)
        decoder_llama_args(c, flavor, 256, 6, 16, 16, 256, 0.0f, 2048);
    else if (strcmp(flavor, "1B") == 0) {
        // Llama 3.2 1B shape (untied here as TorchTitan's llama3 model; rope factor 32)
        decoder_llama_args(c, flavor, 2048, 16, 32, 8, 256, 1.5f, 128256);
        c->rope_factor = 32.0f;
    } else if (strcmp(flavor, "8B") == 0)
        decoder_llama_args(c, flavor, 4096, 32, 32, 8, 1024, 1.3f, 128256);
    else if (strcmp(flavor, "70B") == 0)
        decoder_llama_args(c, flavor, 8192, 80, 64, 8, 4096, 1.3f, 128256);
    else if (strcmp(flavor, "405B") == 0)
        decoder_llama_args(c, flavor, 16384, 126, 128, 8, 4096, 1.2f, 128256);
    else
        return 0;
    return 1;
}

extern const models_hf_family_t llama3_hf;   /* state_dict_adapter.c */

/* The TP plan is TorchTitan's llama3 apply_tp: the decoder's (models-impl.h). */
const hp_model_spec_t hp_llama3_spec = {
    "llama3", "debugmodel, 1B, 8B, 70B, 405B", args, &decoder_arch_interleaved, decoder_tp_plan, &llama3_hf.adapter,
};
