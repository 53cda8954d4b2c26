/* hp_config: the training configuration. A schema table (section, key, type, default, doc)
 * drives YAML parsing (libyaml), dotted command-line overrides (--training.steps=20 or
 * --training.steps 20), printing the resolved config and the docs/config.md table.
 * Precedence: schema defaults < YAML file < command line. Unknown keys and wrong types are
 * errors naming the key (file:line for YAML) and suggesting the nearest valid key. Integers
 * are range-checked against the type that uses them and floats used in float32 must be
 * representable there (parse.h), when they enter. A file holds one YAML document.
 * Key names follow TorchTitan's (v0.2.2 TOML era); see docs/config.md. */
#ifndef HYPERPARALLEL_CONFIG_H
#define HYPERPARALLEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "parse.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_CONFIG_STR_MAX 512   /* bytes of a string value, including the NUL */
#define HP_CONFIG_LIST_MAX 16   /* items of a list value */

typedef struct hp_config_list {
    int n;
    char items[HP_CONFIG_LIST_MAX][HP_CONFIG_STR_MAX];
} hp_config_list_t;

/* Enum values are stored as their canonical lower-case spelling (parsing is
 * case-insensitive), so callers compare with strcmp(cfg->optimizer.name, "adamw"). */
typedef struct hp_config {
    struct {
        char dump_folder[HP_CONFIG_STR_MAX];
        char description[HP_CONFIG_STR_MAX];
        bool print_config;
        char config_file[HP_CONFIG_STR_MAX];   /* set by the loader: the YAML file read */
    } job;
    struct {
        char name[HP_CONFIG_STR_MAX];
        char flavor[HP_CONFIG_STR_MAX];
        /* Overrides of the flavor's fields (hp_config_resolve_model; docs/config.md "Custom
         * model dimensions"). -1, the default, keeps the flavor's value; the tristate keys
         * hold -1 (default), 0 or 1. */
        int64_t dim, n_layers, n_heads, n_kv_heads, head_dim;
        int64_t hidden_dim;           /* FFN hidden size */
        int64_t vocab_size, multiple_of;
        double ffn_dim_multiplier;    /* 0 = none */
        double norm_eps, rope_theta;
        int rope_scaling;             /* tristate: Llama 3.1 frequency scaling */
        double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
        int64_t rope_original_max_pos;
        int qk_norm, tie_embeddings;  /* tristate */
        int64_t max_seq_len;
        /* the MoE keys (docs/moe.md): -1 / "default" keep the flavor's */
        int64_t moe_num_experts, moe_top_k, moe_hidden_dim, moe_num_shared_experts, moe_n_dense_layers;
        int64_t moe_n_expert_groups, moe_n_limited_groups;   /* node-limited routing (HF n_group / topk_group) */
        char moe_score_func[HP_CONFIG_STR_MAX];   /* default | sigmoid | softmax */
        int moe_route_norm, moe_score_before_experts;   /* tristate */
        double moe_route_scale, moe_load_balance_coeff, moe_aux_loss_coeff;
        /* MLA attention's keys (deepseek_v3; docs/moe.md): -1 keeps the flavor's */
        int64_t q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
        double mla_mscale, mla_norm_eps, rope_beta_fast, rope_beta_slow;
    } model;
    struct {
        int64_t steps;
        int64_t seq_len;
        int64_t local_batch_size;
        int64_t global_batch_size;   /* -1: local_batch_size * dp degree (no accumulation) */
        double max_norm;
        int64_t seed;
        bool deterministic;
        char dtype[HP_CONFIG_STR_MAX];
        char mixed_precision_param[HP_CONFIG_STR_MAX];
        char mixed_precision_reduce[HP_CONFIG_STR_MAX];
        double memory_limit_gib;     /* 0: this host's MemAvailable / its ranks; < 0: no limit */
    } training;
    struct {
        char name[HP_CONFIG_STR_MAX];
        double lr;
        double beta1;
        double beta2;
        double eps;
        double weight_decay;
        double momentum;
    } optimizer;
    struct {
        int64_t warmup_steps;
        double decay_ratio;   /* < 0: None (decay over every step after warm-up) */
        char decay_type[HP_CONFIG_STR_MAX];
        double min_lr_factor;
    } lr_scheduler;
    struct {
        int64_t data_parallel_replicate_degree;
        int64_t data_parallel_shard_degree;
        int64_t tensor_parallel_degree;
        int64_t pipeline_parallel_degree;
        int64_t context_parallel_degree;
        int64_t expert_parallel_degree;
        int64_t expert_tensor_parallel_degree;
        char fsdp_reshard_after_forward[HP_CONFIG_STR_MAX];
        int64_t zero_stage;          /* 1: ZeRO-1 over dp_replicate (DDP) */
        bool auto_layout;            /* key `auto`: the planner chooses the layout (docs/planner.md) */
        bool enable_loss_parallel;
        bool enable_sequence_parallel;
        char pipeline_parallel_schedule[HP_CONFIG_STR_MAX];
        int64_t pipeline_parallel_mpipe_transpose_layers;
        int64_t pipeline_parallel_microbatch_size;
        int64_t pipeline_parallel_layers_per_stage;
        int64_t pipeline_parallel_first_stage_less_layers;
        int64_t pipeline_parallel_last_stage_less_layers;
        char pipeline_parallel_schedule_csv[HP_CONFIG_STR_MAX];
        char module_fqns_per_model_part[HP_CONFIG_STR_MAX];
        char context_parallel_rotate_method[HP_CONFIG_STR_MAX];
        char context_parallel_load_balancer[HP_CONFIG_STR_MAX];
        int64_t context_parallel_ulysses_degree;
        bool context_parallel_async;
    } parallelism;
    struct {
        char mode[HP_CONFIG_STR_MAX];
        char selective_ac_option[HP_CONFIG_STR_MAX];   /* integer k, or "op" */
        double memory_budget;                          /* mode memory_budget: [0, 1] */
        char per_op_sac_force_recompute_mm_shapes_by_fqns[HP_CONFIG_STR_MAX];   /* comma-separated */
    } activation_checkpoint;
    struct {
        bool enable;
        char folder[HP_CONFIG_STR_MAX];
        int64_t interval;
        int64_t keep_latest_k;
        char initial_load_path[HP_CONFIG_STR_MAX];
        int64_t load_step;
        bool last_save_model_only;
        char export_dtype[HP_CONFIG_STR_MAX];
        char async_mode[HP_CONFIG_STR_MAX];
        hp_config_list_t exclude_from_loading;
        bool verify_checksums;
    } checkpoint;
    struct {
        int64_t log_freq;
        bool enable_tensorboard;
        char save_tb_folder[HP_CONFIG_STR_MAX];
        char jsonl_file[HP_CONFIG_STR_MAX];
        double peak_flops;
        bool save_for_all_ranks;
        bool enable_color;
    } metrics;
    struct {
        bool enable;
        int64_t freq;
        int64_t steps;
        int64_t local_batch_size;
    } validation;
    struct {
        char path[HP_CONFIG_STR_MAX];
        char format[HP_CONFIG_STR_MAX];
        char text_separator[HP_CONFIG_STR_MAX];
        char jsonl_field[HP_CONFIG_STR_MAX];
        char bin_dtype[HP_CONFIG_STR_MAX];
        double validation_fraction;
        bool loop;
        char chat_template[HP_CONFIG_STR_MAX];   /* chat data: a known template by name; "" = the folder's */
        bool pack;                               /* chat data: several samples per row */
        char sft_truncation[HP_CONFIG_STR_MAX];  /* chat data: truncate | drop | error */
    } data;
    struct {
        char path[HP_CONFIG_STR_MAX];
        int64_t vocab_size;
    } tokenizer;
    struct {
        bool enable;
    } fault_tolerance;
    struct {   /* LoRA fine-tuning (docs/finetune.md "LoRA") */
        bool enable;
        int64_t rank;
        double alpha;
        hp_config_list_t target_modules;           /* PEFT's names (q_proj, ...) or ours (wq, ...) */
        char adapter_path[HP_CONFIG_STR_MAX];      /* a PEFT folder to start from; "" = A drawn, B zeros */
        char save_folder[HP_CONFIG_STR_MAX];       /* PEFT folder written at the end (under job.dump_folder) */
    } lora;
} hp_config_t;

typedef enum hp_config_type {
    HP_CONFIG_INT = 0,
    HP_CONFIG_FLOAT,
    HP_CONFIG_BOOL,
    HP_CONFIG_STRING,
    HP_CONFIG_ENUM,
    HP_CONFIG_LIST,
    HP_CONFIG_TRISTATE,   /* int field: -1 ("default": keep the flavor's value), 0 or 1 */
} hp_config_type_t;

/* One schema row. */
typedef struct hp_config_key {
    const char *section;
    const char *key;
    hp_config_type_t type;
    const char *default_value;   /* as it would be written in YAML ("" for empty string/list) */
    const char *choices;         /* enum only: "a|b|c" (canonical spellings) */
    const char *alias;           /* another accepted key name in the same section, or NULL */
    const char *doc;
    size_t offset;               /* of the field inside hp_config_t */
    int64_t int_min, int_max;    /* int only: accepted range, that of the type that uses the value */
    bool f32;                    /* float only: used in float32, so it must be representable there */
    double float_min, float_max; /* float only: accepted range */
    bool flavor_default;         /* int / float: -1 (the default) keeps the model flavor's value and is
                                    accepted besides the range */
    const char *hint;            /* appended to a range error, or NULL */
} hp_config_key_t;

/* The schema, in section order. */
const hp_config_key_t *hp_config_schema(size_t *count);
const char *hp_config_type_name(hp_config_type_t type);
/* Row of "section.key" (an alias is accepted); NULL when unknown. */
const hp_config_key_t *hp_config_find_key(const char *dotted);

/* Every key set to its schema default. */
void hp_config_defaults(hp_config_t *cfg);
/* Applies a YAML file on top of *cfg. Errors: HP_ERR_IO (message names the path),
 * HP_ERR_FORMAT (YAML syntax, "path:line: ..."), HP_ERR_INVALID_ARG (unknown key / wrong
 * type, "path:line: unknown key 'a.b'; did you mean 'a.c'?"). */
hp_status_t hp_config_load_file(hp_config_t *cfg, const char *path);
/* Sets one key from its text form; `origin` prefixes the message ("command line"). */
hp_status_t hp_config_set(hp_config_t *cfg, const char *dotted, const char *value,
                          const char *origin);
/* Full command-line handling: defaults, then the file of `--config FILE` (also
 * --config=FILE or --job.config_file), then every `--section.key=value` or
 * `--section.key value` in order. Arguments that are not dotted options (e.g. --nproc 4)
 * are copied, in order, into rest[] (capacity argc) for the caller; *nrest their count.
 * argv[0] is skipped. */
hp_status_t hp_config_parse_args(hp_config_t *cfg, int argc, char **argv, char **rest,
                                 int *nrest);
/* Cross-key checks (positive steps/seq_len/batch, lr >= 0, ...). */
hp_status_t hp_config_validate(const hp_config_t *cfg);
/* Gradient accumulation steps = global_batch_size / (local_batch_size * dp_degree);
 * global_batch_size = -1 gives 1. Error when it does not divide exactly. */
hp_status_t hp_config_grad_accum_steps(const hp_config_t *cfg, int64_t dp_degree,
                                       int64_t *out);

/* The model a run trains: hp_model_flavor(model.name, model.flavor), then every model.* key
 * that is set (not -1 / default) replaces the flavor's field. What the flavor derives follows
 * the overridden fields unless given too: head_dim = dim / n_heads when the flavor's head_dim
 * is dim / n_heads (llama3); the FFN size from dim, multiple_of and ffn_dim_multiplier when
 * the flavor uses that rule (llama3); n_kv_heads = n_heads when the flavor has as many KV
 * heads as heads. Then hp_model_config_validate. vocab_size > 0 is the vocabulary of the data
 * (the tokenizer, a checkpoint; vocab_from names it): model.vocab_size must be unset or equal.
 * seq_len > 0 is the training context: max_seq_len = model.max_seq_len (at least seq_len) or
 * seq_len. Errors name the model.* key, the value, what is expected and a hint. */
struct hp_model_config;
/* The lora.* keys into a resolved model config (rank, alpha, target bits) and the layouts LoRA
 * supports (every layout of a dense model; expert parallel refused), named by key. */
hp_status_t hp_config_apply_lora(const hp_config_t *cfg, struct hp_model_config *mc);
hp_status_t hp_config_resolve_model(const hp_config_t *cfg, int vocab_size, const char *vocab_from, int seq_len,
                                    struct hp_model_config *out);
/* "model.dim=80 model.n_heads=5" for the keys that are set; "" when none. */
void hp_config_model_overrides(const hp_config_t *cfg, char *buf, size_t n);
/* "dim 80, n_layers 2, n_heads 5, ..." of a model config (start-up reports, tools). */
void hp_config_describe_model(const struct hp_model_config *mc, char *buf, size_t n);

/* Writes the resolved config as YAML (parseable by hp_config_load_file). */
void hp_config_print(const hp_config_t *cfg, FILE *f);
/* Writes the schema as Markdown tables, one per section (the docs/config.md body). */
void hp_config_write_markdown(FILE *f);
/* Value of one key as text (as hp_config_print writes it). */
hp_status_t hp_config_get_string(const hp_config_t *cfg, const char *dotted, char *buf,
                                 size_t n);

#ifdef __cplusplus
}
#endif
#endif
