/* Private to the models layer: the decoder the families here are built from (decoder.c: model
 * args presets, the architecture's declare / build, the Llama TP plan) and the config.json
 * pieces every family shares (hf_config.c: the JSON readers, the comparison, the common
 * LlamaConfig keys), with the hooks through which a family's folder adds its own. */
#ifndef HP_MODELS_IMPL_H
#define HP_MODELS_IMPL_H

#include <json-c/json.h>
#include "hyperparallel/models.h"

/* ---- decoder.c: the Llama-style decoder, parameterised by config fields --------------------
 * Units: 0 the embedding, 1..n_layers the blocks (GQA attention with optional qk-norm, or MLA;
 * a dense SwiGLU feed-forward, or MoE from layer moe_n_dense_layers on), n_layers + 1 the head.
 * A family's architecture is {decoder_n_units, decoder_unit_kind, decoder_declare, its build},
 * its build calling decoder_build with its RoPE layout. */
int decoder_n_units(const hp_model_config_t *c);
int decoder_unit_kind(const hp_model_config_t *c, int unit);
int decoder_declare(const hp_model_config_t *c, int unit, int has_embedding, hp_param_decl_t *out);
hp_status_t decoder_build(hp_model_t m, int unit, hp_param_t **params, int n_params, hp_module_t **out,
                          hp_rope_style_t style);

/* Model-args presets of the flavors (memset first; name and arch are the registry's):
 * llama_args: TorchTitan's llama3 args (FFN hidden from multiple_of / ffn_dim_multiplier,
 * Llama 3.1 RoPE scaling, eps 1e-5, theta 5e5); qwen_args: Qwen3's (explicit head_dim and
 * hidden, qk-norm, tied embeddings, eps 1e-6, theta 1e6); moe_args and mla_args set the MoE
 * routing and the MLA sizes with YaRN on top of one of them. */
void decoder_llama_args(hp_model_config_t *c, const char *flavor, int dim, int layers, int heads, int kv,
                        int multiple_of, float mult, int vocab);
void decoder_qwen_args(hp_model_config_t *c, const char *flavor, int dim, int layers, int heads, int kv,
                       int head_dim, int hidden, int vocab);
void decoder_moe_args(hp_model_config_t *c, int E, int K, int F, int shared, int score_fn, int norm, float scale,
                      int groups, int limited, int dense);
void decoder_mla_args(hp_model_config_t *c, int q_lora, int kv_lora, int nope, int rope, int v, float mscale);

/* TorchTitan's llama3 apply_tp plan over the decoder's module names (hp_model_spec_t.tp_plan). */
int decoder_tp_plan(const hp_model_config_t *c, int sp, int loss_parallel, hp_tp_plan_entry_t *plan, int cap);

/* The type of a family's tp_plan, declared once in its model.c and defined in its
 * parallelize.c, so the compiler checks both against hp_model_spec_t. */
typedef int models_tp_plan_fn(const hp_model_config_t *c, int sp, int loss_parallel, hp_tp_plan_entry_t *plan,
                              int cap);

/* ---- hf_config.c: config.json ------------------------------------------------------------ */

/* A config.json being read: its path (for the messages) and the object. */
typedef struct hfj {
    const char *path;
    json_object *o;
} hfj_t;
/* A present, non-null value of key in o (NULL when absent or JSON null). */
json_object *hfj_get(json_object *o, const char *key);
/* Typed reads of c->o's `key` (get_num: of the object o) with the range checked; an absent
 * key is an error when required, else def; the message names the file and the key. */
hp_status_t hfj_int(const hfj_t *c, const char *key, int required, int64_t def, int64_t lo,
                            int64_t hi, int64_t *out);
hp_status_t hfj_num(const hfj_t *c, json_object *o, const char *key, int required, double def,
                            double lo, double hi, double *out);
hp_status_t hfj_bool(const hfj_t *c, const char *key, int def, int *out);
/* HP_ERR_UNSUPPORTED: key = value is something the model does not have (expected: what it has). */
hp_status_t hfj_unsupported(const hfj_t *c, const char *key, const char *value, const char *expected);
/* rope_theta and rope_scaling / rope_parameters of type "default" or Llama 3.1's "llama3". */
hp_status_t models_hf_read_rope(const hfj_t *c, hp_model_config_t *mc);

/* A running comparison of two configs (hp_hf_config_diff): each difference appends
 * "config.json 'hfkey' = hfv (model.key = mcv)" to msg and "--model.key hfv" to flags. */
typedef struct models_diff {
    char *msg, *flags;
    size_t msg_n, flags_n, lm, lf;
    int n;
} models_diff_t;
void models_diff_int(models_diff_t *d, const char *hfkey, const char *key, int hf, int mc);
void models_diff_float(models_diff_t *d, const char *hfkey, const char *key, float hf, float mc);
void models_diff_bool(models_diff_t *d, const char *hfkey, const char *key, int hf, int mc);
void models_diff_str(models_diff_t *d, const char *hfkey, const char *key, const char *hf, const char *mc);

/* The per-layer HF names of the decoder (LlamaForCausalLM's: self_attn.q_proj, mlp.gate_proj,
 * input_layernorm, ..., with Qwen3's q_norm / k_norm and the MoE router mlp.gate), qk set on
 * q_proj / k_proj. */
extern const hp_hf_name_pair_t models_hf_decoder_names[];

/* The LlamaConfig-style keys every Llama-like family writes (architectures, model_type, sizes,
 * eps, RoPE with Llama 3.1 scaling, ...), and the finished text (the object is released). */
json_object *models_hf_decoder_json(const hp_hf_adapter_t *a, const hp_model_config_t *mc, hp_dtype_t dtype);
char *models_hf_json_text(json_object *c);

/* Refusals the families share: an MoE config in a family whose HF class is dense; a qk_norm the
 * HF class cannot express (want: whether it has q_norm / k_norm; why and hint name it). */
hp_status_t models_hf_refuse_experts(const hp_model_config_t *mc, const char *what);
hp_status_t models_hf_refuse_qk_norm(const hp_model_config_t *mc, const char *what, int want, const char *why,
                                     const char *hint);

/* A family's config.json mapping (hp_model_spec_t.hf_config). hp_hf_read_config reads the keys
 * every family shares, then calls `read`; hp_hf_config_diff compares the shared fields, then
 * calls `diff` when both configs are of this family. */
struct hp_model_hf_config {
    int max_position_default;    /* HF's default max_position_embeddings of the class */
    int qk_norm;                 /* the HF class has q_norm / k_norm */
    int refuse_sliding_window;   /* the class has no sliding window: a sliding_window key is refused */
    /* the family's keys and its RoPE (models_hf_read_rope for Llama 3.1 / plain RoPE), after the
     * shared fields are in mc; max_pos: max_position_embeddings */
    hp_status_t (*read)(const hfj_t *c, hp_model_config_t *mc, int64_t max_pos);
    void (*diff)(models_diff_t *d, const hp_model_config_t *hf, const hp_model_config_t *mc);   /* NULL: none */
};

#endif
