/* The model registry (models layer, above checkpoint, below train): one spec per model family,
 * TorchTitan's train_spec. A family lives in one folder, src/models/<family>/, with its model
 * args and flavors, its architecture (the nn builder), its tensor-parallel plan and its HF
 * state-dict adapter with its config.json mapping; src/models/registry.c lists the families.
 * Nothing outside src/models/ names a family: callers find its spec here (docs/architecture.md,
 * "Adding a model family"). Also the functions that need the registry: resolving a flavor, the
 * model of an HF config.json, the model weights file. */
#ifndef HYPERPARALLEL_MODELS_H
#define HYPERPARALLEL_MODELS_H

#include <stddef.h>
#include "checkpoint.h"
#include "model.h"
#include "model_builder.h"
#include "model_parallelize.h"
#include "status.h"
#include "tp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_model_spec {
    const char *name;      /* the registry key: hp_model_config_t.name ("llama3") */
    const char *flavors;   /* its flavors, for messages: "debugmodel, 1B, 8B, 70B, 405B" */
    /* Fills cfg (every field, name and arch excepted) with the named flavor, unvalidated;
     * returns 0 without touching cfg when the family has no such flavor. hp_model_flavor wraps
     * it. */
    int (*flavor)(const char *flavor, hp_model_config_t *cfg);
    const hp_model_arch_t *arch;   /* how hp_model_create builds the units (model_builder.h) */
    /* TorchTitan's tensor-parallel plan of the family for cfg: writes at most cap entries,
     * returns the count. sequence_parallel: the norms are SequenceParallel and the residual
     * stream Shard(1); loss_parallel: the output keeps vocab-sharded logits (Shard(-1)). */
    int (*tp_plan)(const hp_model_config_t *cfg, int sequence_parallel, int loss_parallel, hp_tp_plan_entry_t *plan,
                   int cap);
    /* HF state-dict adapter with the config.json mapping; NULL: none (HF export and import
     * refuse the family with a message) */
    const hp_hf_adapter_t *hf;
    /* The family's parallelize (TorchTitan's parallelize_fn): the public apply steps in order
     * over the parts of p (model_parallelize.h); hp_parallelize calls it. The four decoder
     * families use hp_parallelize_decoder, which takes the plan from tp_plan above. */
    hp_status_t (*parallelize)(hp_parallel_t p, const hp_parallel_dims_t *pd, const hp_parallel_meshes_t *meshes,
                               const hp_parallelize_options_t *o);
} hp_model_spec_t;

/* The family named `name`, or NULL. */
const hp_model_spec_t *hp_model_spec_find(const char *name);
/* Iteration in registry order: hp_model_spec_at(i) for i in [0, hp_model_spec_count()). */
int hp_model_spec_count(void);
const hp_model_spec_t *hp_model_spec_at(int i);
/* The HF state-dict adapter of cfg's family (hp_hf_export / import / convert); NULL when the
 * family is unknown or has none (those functions then refuse with a message). */
const hp_hf_adapter_t *hp_model_hf_adapter(const hp_model_config_t *cfg);

/* Fills cfg with a family's named flavor (TorchTitan's shapes; arch set, validated). An unknown
 * name or flavor is HP_ERR_INVALID_ARG with a message listing the registry's families and
 * their flavors. */
hp_status_t hp_model_flavor(const char *model_name, const char *flavor, hp_model_config_t *cfg);

/* --- HF config.json (hf_config.c and each family's state_dict_adapter.c) -------------------
 * The model config of an HF directory's config.json: model_type picks the family (its
 * adapter's model_type), whose debugmodel flavor gives the fields HF does not have; then every
 * field the HF class reads (hidden_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads, head_dim, intermediate_size, vocab_size, rms_norm_eps, rope_theta,
 * rope_scaling / rope_parameters, tie_word_embeddings, max_position_embeddings -> max_seq_len,
 * and the family's own: MoE routing, MLA sizes, YaRN); flavor "config.json". A field the model
 * cannot reproduce (another rope type, attention_bias, mlp_bias, a sliding window, another
 * hidden_act, attention_dropout, partial_rotary_factor) is HP_ERR_UNSUPPORTED naming it; a
 * missing or mistyped field is HP_ERR_FORMAT naming it. */
hp_status_t hp_hf_read_config(const char *dir, hp_model_config_t *out);
/* Compares the fields that change the numerics (all but max_seq_len) of the model of a
 * config.json (hf) with another model config (mc); returns how many differ. msg gets
 * "config.json 'hidden_size' = 80 (model.dim = 256), ..." and flags the hp-ckpt flags that
 * would describe the checkpoint ("--model.dim 80 ..."); both may be cut at their size. */
int hp_hf_config_diff(const hp_model_config_t *hf, const hp_model_config_t *mc, char *msg, size_t msg_n,
                      char *flags, size_t flags_n);

/* --- model weights file (weights.c) ---------------------------------------------------------
 * Writes the model weights (rank 0 of a replicated model) and each MoE layer's expert_bias
 * ("layers.N.moe.expert_bias", the routing's selection bias) with the model config in the
 * safetensors metadata, loadable by hp_model_load_weights / hp-generate. */
hp_status_t hp_model_save_weights(hp_model_t m, const char *path);
/* Creates a model from a file written by hp_model_save_weights (its family's flavor, then the
 * config in its metadata; expert_bias when the file has it), or from an HF directory (config
 * from its config.json, hp_hf_read_config; weights and DeepSeek-V3's
 * e_score_correction_bias through hp_hf_import). The config keeps its context (max_seq_len:
 * the training sequence length, or max_position_embeddings, which decides MLA's YaRN); the
 * model is built for max_seq_len positions when > 0 (at most that context), else for the
 * context (an HF directory's capped at 4096); hp_model_max_seq_len says which. */
hp_status_t hp_model_load_weights(const char *path, int max_batch, int max_seq_len, hp_model_t *out);

#ifdef __cplusplus
}
#endif
#endif
