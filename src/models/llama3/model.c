/* llama3 (TorchTitan's llama3): the model args of its flavors, its architecture (the decoder
 * with RoPE on interleaved pairs), its TP plan and its registry spec. Its HF state-dict adapter
 * and config.json mapping are in state_dict_adapter.c. */
#include <string.h>
#include "models/models-impl.h"

/* TorchTitan's llama3_args: dim, layers, heads, kv heads, multiple_of, ffn_dim_multiplier,
 * vocab, and the RoPE scaling factor where it is not Llama 3.1's 8. */
static const struct {
    const char *name;
    int dim, layers, heads, kv, multiple_of;
    float mult;
    int vocab;
    float rope_factor;
} flavors[] = {
    {"debugmodel", 256, 6, 16, 16, 256, 0.0f, 2048, 0.0f},
    {"1B", 2048, 16, 32, 8, 256, 1.5f, 128256, 32.0f},   // Llama 3.2 1B shape (untied here, as TorchTitan's)
    {"8B", 4096, 32, 32, 8, 1024, 1.3f, 128256, 0.0f},
    {"70B", 8192, 80, 64, 8, 4096, 1.3f, 128256, 0.0f},
    {"405B", 16384, 126, 128, 8, 4096, 1.2f, 128256, 0.0f},
};

static int args(const char *flavor, hp_model_config_t *c) {
    for (size_t i = 0; i < sizeof flavors / sizeof flavors[0]; i++) {
        if (strcmp(flavors[i].name, flavor) != 0) continue;
        decoder_llama_args(c, flavor, flavors[i].dim, flavors[i].layers, flavors[i].heads, flavors[i].kv,
                           flavors[i].multiple_of, flavors[i].mult, flavors[i].vocab);
        if (flavors[i].rope_factor > 0.0f) c->rope_factor = flavors[i].rope_factor;
        return 1;
    }
    return 0;
}

extern const models_hf_family_t llama3_hf;   /* state_dict_adapter.c */

/* The TP plan is TorchTitan's llama3 apply_tp: the decoder's (models-impl.h). */
const hp_model_spec_t hp_llama3_spec = {
    "llama3", "debugmodel, 1B, 8B, 70B, 405B", args, &decoder_arch_interleaved, decoder_tp_plan, &llama3_hf.adapter,
    hp_parallelize_decoder,
};
