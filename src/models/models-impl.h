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
 * One architecture per RoPE layout; a family picks its own: interleaved pairs (2i, 2i+1), as
 * TorchTitan's llama3 and deepseek_v3, or rotate_half (i, i + hd/2), as HF's Qwen3. */
extern const hp_model_arch_t decoder_arch_interleaved, decoder_arch_half;

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

/* A config.json being read: its path (for the messages), the object and, once model_type named
 * the family, its transformers config class ("Qwen3MoeConfig"; NULL before). */
typedef struct hfj {
    const char *path;
    json_object *o;
    const char *cls;
} hfj_t;
/* A present, non-null value of key in o (NULL when absent or JSON null). */
json_object *hfj_get(json_object *o, const char *key);
/* Typed reads of c->o's `key` (hfj_num: of the object o) with the range checked; an absent
 * key is an error when required, else def; the message names the file and the key. */
hp_status_t hfj_int(const hfj_t *c, const char *key, int required, int64_t def, int64_t lo, int64_t hi,
                    int64_t *out);
hp_status_t hfj_num(const hfj_t *c, json_object *o, const char *key, int required, double def, double lo,
                    double hi, double *out);
hp_status_t hfj_bool(const hfj_t *c, const char *key, int def, int *out);
/* HP_ERR_UNSUPPORTED: key = value is something the model does not have (expected: what it has). */
hp_status_t hfj_unsupported(const hfj_t *c, const char *key, const char *value, const char *expected);
/* config.json's RoPE object: rope_parameters (transformers 5) or rope_scaling (4.x), NULL when
 * neither; *rkey its key, *type its rope_type (or older "type"; "default" when absent). A value
 * that is not an object (the bare string "yarn") or a rope_type that is not a string is
 * HP_ERR_FORMAT naming the key. */
hp_status_t models_hf_rope_object(const hfj_t *c, json_object **r, const char **rkey, const char **type);
/* rope_theta and rope_scaling / rope_parameters of type "default" or Llama 3.1's "llama3" (a
 * family's `read` when it has no keys of its own). */
hp_status_t models_hf_read_rope(const hfj_t *c, hp_model_config_t *mc, int64_t max_pos);

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
/* One difference in words of its own (msg) and the flags that describe the checkpoint (flags,
 * e.g. "--model.max_seq_len 256 --model.rope_factor 4"; NULL: none). */
void models_diff_add(models_diff_t *d, const char *msg, const char *flags);
/* A flag the checkpoint's description needs although the field agrees (a value the other flags
 * would otherwise re-derive, as head_dim from a new dim); counts no difference. */
void models_diff_flag(models_diff_t *d, const char *key, const char *value);

/* The per-layer HF names of the decoder (LlamaForCausalLM's: self_attn.q_proj, mlp.gate_proj,
 * input_layernorm, ..., with Qwen3's q_norm / k_norm and the MoE router mlp.gate), qk set on
 * q_proj / k_proj. */
extern const hp_hf_name_pair_t models_hf_decoder_names[];

/* The text of the model's config.json (hp_hf_adapter_t.config_json): the keys every family's
 * HF class has (architectures, model_type, sizes, eps, rope_theta, tie_word_embeddings, ...),
 * then the family's (`write`). models_hf_write_llama_rope: LlamaConfig's head_dim,
 * max_position_embeddings and rope_scaling (Llama 3.1's), for the families that have them. */
char *models_hf_config_json(const hp_model_config_t *mc, hp_dtype_t dtype);
void models_hf_write_llama_rope(json_object *c, const hp_model_config_t *mc);

/* The adapter's `check` of every family: MoE routing through the family's check_moe (an MoE
 * config in a dense class is refused), and a qk_norm the HF class does not have. */
hp_status_t models_hf_check(const hp_model_config_t *mc, const char *what);

/* A family's HF side (its state_dict_adapter.c): the checkpoint layer's adapter first, so the
 * spec's `hf` points at the whole and the shared code here reaches the config.json mapping from
 * the spec (models_hf_family). hp_hf_read_config reads the keys every family shares, then calls
 * `read`; hp_hf_config_diff compares the shared fields, then calls `diff` when both configs are
 * of this family; models_hf_config_json writes the shared keys, then calls `write`;
 * models_hf_check calls `check_moe`. */
typedef struct models_hf_family {
    hp_hf_adapter_t adapter;     /* its hooks: models_hf_check and the three config.json functions */
    int max_position_default;    /* HF's default max_position_embeddings of the class */
    int qk_norm;                 /* the HF class has q_norm / k_norm (always), else none */
    int refuse_sliding_window;   /* the class has no sliding window: a sliding_window key is refused */
    /* the family's keys and its RoPE (models_hf_read_rope for Llama 3.1 / plain RoPE), after the
     * shared fields are in mc; max_pos: max_position_embeddings */
    hp_status_t (*read)(const hfj_t *c, hp_model_config_t *mc, int64_t max_pos);
    void (*diff)(models_diff_t *d, const hp_model_config_t *hf, const hp_model_config_t *mc);   /* NULL: none */
    void (*write)(json_object *c, const hp_model_config_t *mc);   /* the family's config.json keys */
    /* what HF's router and experts can express (HP_ERR_UNSUPPORTED naming the config key); NULL:
     * the class is dense */
    hp_status_t (*check_moe)(const hp_model_config_t *mc, const char *what);
} models_hf_family_t;
/* The adapter's hooks of every family here (the shared functions above, which reach the
 * family's own parts through the registry). */
#define MODELS_HF_HOOKS models_hf_check, hp_hf_read_config, hp_hf_config_diff, models_hf_config_json
/* The HF side of a family in src/models (NULL when it has none). */
const models_hf_family_t *models_hf_family(const hp_model_spec_t *sp);

#endif
