/* The model (nn layer): the decoder config every family fills, its checks, parameter counts
 * and FLOPs/token, and the model container built from hp_module layers (nn.h) by the family's
 * architecture (model_builder.h): TorchTitan init through the counter RNG, forward (summed
 * cross-entropy / divisor) and split backward on one rank, units, micro-batch contexts and the
 * KV cache. The families and their flavors are in the model registry (models.h). Parameter
 * names are TorchTitan's ("layers.3.attention.wq.weight"); see docs/nn.md. */
#ifndef HYPERPARALLEL_MODEL_H
#define HYPERPARALLEL_MODEL_H

#include <stdint.h>
#include "status.h"
#include "param.h"
#include "nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds on model dimensions. They are checked where a dimension enters (config keys, tool
 * flags, an HF config.json, weights metadata; the message names that input) and again by
 * hp_model_config_validate. Real models sit far below them (Llama 3 405B: dim 16384, 126
 * layers, vocab 128256); beyond them products of dims overflow or the allocation is absurd. */
#define HP_MODEL_MAX_VOCAB (1 << 24)        /* token ids; also the tokenizer's limit */
#define HP_MODEL_MAX_SEQ_LEN (1 << 20)      /* RoPE tables and activations grow with it */
#define HP_MODEL_MAX_DIM (1 << 20)          /* dim, hidden_dim, head_dim x heads */
#define HP_MODEL_MAX_LAYERS 4096
#define HP_MODEL_MAX_HEADS 4096
#define HP_MODEL_MAX_PARAMS ((int64_t)1 << 40)   /* 4 TiB of float32 parameters */

typedef struct hp_model_config {
    char name[32];          /* the family in the model registry (models.h) */
    char flavor[32];        /* "debugmodel", "8B", ... */
    int dim, n_layers, n_heads, n_kv_heads, head_dim;   /* head_dim = dim/n_heads unless set (qwen3) */
    int vocab_size;
    int hidden_dim;         /* ffn hidden size after TorchTitan's multiple_of / ffn_dim_multiplier
                               rule (llama3) or explicit (qwen3) */
    int multiple_of;
    float ffn_dim_multiplier;   /* 0 = none */
    float norm_eps, rope_theta;
    int rope_scaling;       /* Llama 3.1 frequency scaling on/off */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_pos;
    int qk_norm;            /* qwen3: RMSNorm over head_dim on q and k before RoPE */
    int tie_embeddings;     /* output projection uses tok_embeddings.weight */
    int max_seq_len;
    /* Mixture of experts (docs/moe.md): moe_experts 0: every layer dense. Layers [0, moe_n_dense_layers) keep the dense feed_forward (hidden_dim); the others
     * have an MoE of moe_experts routed experts of hidden moe_hidden, top moe_top_k, plus
     * moe_shared_experts shared experts (one SwiGLU of hidden moe_shared_experts x moe_hidden). */
    int moe_experts, moe_top_k, moe_hidden, moe_shared_experts;
    int moe_score_fn;             /* hp_moe_score_fn_t (nn.h): sigmoid 0, softmax 1 */
    int moe_route_norm;
    float moe_route_scale;
    int moe_score_before_experts;
    int moe_expert_groups, moe_limited_groups;   /* node-limited routing; 0: off */
    int moe_n_dense_layers;
    float moe_load_balance_coeff; /* aux-loss-free expert_bias update step; 0: off */
    float moe_aux_loss_coeff;     /* HyperParallel's auxiliary loss (hp_moe_config_t); 0: off */
    /* MLA, DeepSeek-V3's multi-head latent attention (deepseek_v3; docs/moe.md): mla 1:
     * q = wq x (q_lora_rank 0) or wq_b q_norm(wq_a x); [c | k_pe] = wkv_a x; [k_nope | v] per
     * head = wkv_b kv_norm(c); RoPE (interleaved pairs) on q's last qk_rope_head_dim channels
     * of each head and on k_pe (one shared by every head). hp_model_config_validate derives
     * n_kv_heads = n_heads and head_dim = max(qk_nope + qk_rope, v_head_dim) (the attention
     * core's head width: the narrower of q|k and v is zero-padded). YaRN RoPE (TorchTitan's
     * deepseek_v3 precompute_freqs_cis: beta_fast / beta_slow correction range, linear ramp)
     * and the softmax scale qk_head^-0.5 x mscale^2, mscale = 0.1 mla_mscale ln(rope_factor) + 1,
     * apply when max_seq_len > rope_original_max_pos. */
    int mla;
    int q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    float mla_mscale, rope_beta_fast, rope_beta_slow;
    /* epsilon of MLA's q_norm and kv_norm; 0: norm_eps (TorchTitan's deepseek_v3 builds them
     * with the model's norm_eps; transformers' DeepseekV3 with a fixed 1e-6, which an HF
     * config.json gives here). hp_model_mla_norm_eps says which applies. */
    float mla_norm_eps;
    /* LoRA (docs/finetune.md "LoRA"; PEFT / TorchTitan LoRAConverter): lora_rank > 0 adds to
     * each targeted linear (lora_targets: HP_LORA_* bits) out += (lora_alpha / lora_rank)
     * B (A x), A (r, in) Kaiming-uniform, B (out, r) zeros, and freezes every other parameter.
     * 0: off. Dense GQA decoders only (hp_model_config_validate says so). */
    int lora_rank;
    float lora_alpha;
    int lora_targets;
    /* The family's builder (model_builder.h): set by the registry when it resolves a config
     * (hp_model_flavor, hp_hf_read_config; models.h) and kept by copies of it. */
    const struct hp_model_arch *arch;
} hp_model_config_t;

/* Recomputes derived fields (hidden_dim from multiple_of / ffn_dim_multiplier when hidden_dim
 * is 0, head_dim when 0) and checks the config, including the HP_MODEL_MAX_* bounds and the
 * total parameter count; the message names the bad field. */
hp_status_t hp_model_config_validate(hp_model_config_t *cfg);

/* Number of parameters; exclude_embedding drops tok_embeddings (when untied), as TorchTitan's
 * get_nparams_and_flops. */
int64_t hp_model_param_count(const hp_model_config_t *cfg, int exclude_embedding);
/* Whether block `layer` has an MoE feed-forward; its hp_moe_config_t (nn.h). */
int hp_model_layer_is_moe(const hp_model_config_t *cfg, int layer);
void hp_model_moe_config(const hp_model_config_t *cfg, hp_moe_config_t *out);
/* Parameters one token meets: routed experts counted top_k of n_experts (TorchTitan's
 * nparams_sparse_active); equals hp_model_param_count for dense models. */
int64_t hp_model_active_param_count(const hp_model_config_t *cfg, int exclude_embedding);
/* MLA: whether YaRN (and the mscale^2 softmax factor) applies: max_seq_len > the original
 * context; the softmax scale of the attention scores. */
int hp_model_mla_yarn(const hp_model_config_t *cfg);
double hp_model_mla_softmax_scale(const hp_model_config_t *cfg);
/* MLA: the epsilon q_norm and kv_norm use (mla_norm_eps, or norm_eps when that is 0). */
float hp_model_mla_norm_eps(const hp_model_config_t *cfg);
/* TorchTitan's formula: 6 * (N - N_emb) + 6 * L * H * 2 * head_dim * seq_len (MLA: H *
 * (qk_nope + qk_rope + v_head) in place of H * 2 * head_dim, TorchTitan's deepseek_v3)
 * (N_emb not subtracted when embeddings are tied); N counts the active parameters of an MoE
 * model (hp_model_active_param_count), as TorchTitan's MoE models. */
double hp_model_flops_per_token(const hp_model_config_t *cfg, int seq_len);

/* LoRA target modules: our projections, PEFT's target_modules names beside them. */
enum {
    HP_LORA_WQ = 1 << 0,   /* q_proj */
    HP_LORA_WK = 1 << 1,   /* k_proj */
    HP_LORA_WV = 1 << 2,   /* v_proj */
    HP_LORA_WO = 1 << 3,   /* o_proj */
    HP_LORA_W1 = 1 << 4,   /* gate_proj */
    HP_LORA_W2 = 1 << 5,   /* down_proj */
    HP_LORA_W3 = 1 << 6,   /* up_proj */
    HP_LORA_N_TARGETS = 7
};
/* Target i (0 .. HP_LORA_N_TARGETS): our module name ("wq") and PEFT's ("q_proj"). */
const char *hp_lora_target_name(int i);
const char *hp_lora_target_peft_name(int i);
/* The bit of a name, ours or PEFT's ("wq" or "q_proj"); 0 when unknown. */
int hp_lora_target_bit(const char *name);

typedef struct hp_model *hp_model_t;

/* Computes all sizes first, then creates one arena each for parameters, gradients,
 * activations (max_batch x max_seq_len) and workspace. Weights are zero until
 * hp_model_init_weights or a load writes them. cfg->arch builds the units (an error when
 * NULL: take the config from the registry, models.h). */
hp_status_t hp_model_create(const hp_model_config_t *cfg, int max_batch, int max_seq_len, hp_model_t *out);
/* The model described without parameter storage (PyTorch's meta device, HyperParallel's
 * init_empty_weights; docs/memory.md): the module trees and the parameter entries (FQNs, the
 * declared shapes and init rules) exist, the entries' data is NULL, nothing of the model's size
 * is allocated. The parallelisms then place each parameter (tensor / expert parallel shrink the
 * entries' local shapes, FSDP keeps its shards), and each rank allocates only what it holds:
 * hp_model_materialize (the model's local storage), or an owner's own storage
 * (hp_fully_shard, which then calls hp_model_release_storage). Forward refuses an empty model. */
hp_status_t hp_model_create_empty(const hp_model_config_t *cfg, int max_batch, int max_seq_len, hp_model_t *out);
/* Allocates (zeroed) storage of the entries' current local sizes in the creation layout
 * (units contiguous, stacked GEMM members adjacent) and points the entries at it; a no-op for a
 * model that has storage or whose entries another owner holds. */
hp_status_t hp_model_materialize(hp_model_t m);
/* The entries now point at storage another owner allocated (FSDP's shards and gathered
 * buffers; none may point into the model's): the model frees its own and is no longer empty. */
hp_status_t hp_model_release_storage(hp_model_t m);
int hp_model_is_empty(hp_model_t m);
/* Floats per buffer (values, gradients) the model's storage takes in its current layout (what
 * hp_model_materialize allocates for an empty model). */
size_t hp_model_storage_floats(hp_model_t m);
void hp_model_destroy(hp_model_t m);
const hp_model_config_t *hp_model_config(hp_model_t m);

/* TorchTitan init (embeddings N(0,1), linears trunc_normal std 0.02, wo/w2/w3 depth-scaled
 * 0.02/sqrt(2*(layer+1)), output trunc_normal dim^-0.5 cut at +-3 sigma, norms ones),
 * drawn from hp_rng keyed by (seed, parameter name, element index). */
hp_status_t hp_model_init_weights(hp_model_t m, uint64_t seed);
/* The same draw into `params`, a table of the model's parameters in its order held in any
 * layout (the model's own entries, or FSDP's sharded ones: hp_fsdp_params): every local element
 * gets the value the whole tensor has at its global index (the DTensor layout maps local to
 * global indices, FSDP over TP's _StridedShard included), so every layout starts from bitwise
 * the weights of the single rank and no rank draws more than it holds. */
hp_status_t hp_model_init_params(hp_model_t m, hp_param_t *params, uint64_t seed);

int hp_model_num_params(hp_model_t m);
/* Array of hp_model_num_params entries in a fixed order (embedding, layers in order, norm,
 * output). value/grad are non-distributed DTensors (mesh NULL) over contiguous f32 storage
 * shaped as PyTorch's (Linear weights (out_features, in_features)). */
hp_param_t *hp_model_params(hp_model_t m);
hp_param_t *hp_model_find_param(hp_model_t m, const char *name);   /* NULL if absent */

/* tokens/targets: (B, T) int32, B <= max_batch, T <= max_seq_len. targets may be NULL
 * (logits only; loss = 0). loss_sum = sum over valid targets (target != -100) of the
 * cross-entropy; *loss = loss_sum / loss_divisor (the global number of valid targets, so every
 * layout has the same loss: docs/architecture.md). */
hp_status_t hp_model_forward(hp_model_t m, const int32_t *tokens, const int32_t *targets,
                             int B, int T, float loss_divisor, float *loss);
/* After a forward with targets: backward of loss; accumulates (+=) into every param grad. */
hp_status_t hp_model_backward(hp_model_t m);
hp_status_t hp_model_zero_grad(hp_model_t m);
/* (B, T, V) logits of the last forward. */
const float *hp_model_logits(hp_model_t m);
/* Cross-entropy summed over the valid targets of the last forward, in double (the loss
 * before the divisor; for metrics and finite-difference checks). */
double hp_model_loss_sum(hp_model_t m);
/* Number of valid targets (!= -100) of the last forward. */
int64_t hp_model_valid_tokens(hp_model_t m);

/* ---- inference: KV cache, prefill and decode (one rank; docs/nn.md) -----------------------
 * A cache holds one sequence: per layer the keys (after qk-norm for qwen3, and RoPE) and the
 * values of positions [0, pos), at most max_len positions, fixed at creation. Prefill and
 * decode append tokens at positions pos, pos + 1, ... and compute only those positions:
 * each layer's new queries attend causally to the cached keys (GQA: kv head h / (H/KV)).
 * Every buffer is allocated by hp_model_kv_cache_create; prefill and decode allocate nothing.
 * The logits of the token at position p equal row p of hp_model_forward over the same
 * tokens up to float rounding (tests/test_model_decode.c); the model's own forward state
 * (hp_model_logits, backward) is left untouched. A tensor-parallel or FSDP-wrapped model is
 * refused (its weights are shards); DDP-wrapped models hold full weights and work. */
typedef struct hp_model_kv_cache *hp_model_kv_cache_t;

/* max_len in [1, the max_seq_len the model was created with] (the RoPE table's length).
 * The cache belongs to m: pass the same model to prefill/decode. */
hp_status_t hp_model_kv_cache_create(hp_model_t m, int max_len, hp_model_kv_cache_t *out);
void hp_model_kv_cache_destroy(hp_model_kv_cache_t c);
/* Forgets every position (pos = 0); keeps the memory. */
void hp_model_kv_cache_reset(hp_model_kv_cache_t c);
/* Positions held (the position the next token gets) and the capacity. */
int hp_model_kv_cache_pos(hp_model_kv_cache_t c);
int hp_model_kv_cache_max_len(hp_model_kv_cache_t c);

/* Appends tokens[0..n) (n >= 1) at positions [pos, pos + n), processed in chunks of up to 64
 * rows, and sets *logits (if non-NULL) to the (vocab_size) logits of the last of them: the
 * prediction for position pos + n. The array belongs to the cache and stays valid until the
 * next prefill, decode, reset or destroy. Errors (cache and logits unchanged): pos + n >
 * max_len (cache full), a token outside [0, vocab_size), a tensor-parallel or FSDP model. */
hp_status_t hp_model_prefill(hp_model_t m, hp_model_kv_cache_t c, const int32_t *tokens, int n,
                             const float **logits);
/* hp_model_prefill of one token: one position, causal attention over the cached keys. */
hp_status_t hp_model_decode(hp_model_t m, hp_model_kv_cache_t c, int32_t token, const float **logits);

/* ---- units, micro-batch contexts and the range driver (docs/nn.md) ------------------------
 * The model is an ordered list of units, each a module tree built by the family's architecture:
 * 0 = tok_embeddings, 1..n_layers = layers[u-1] (one transformer block), n_layers+1 = the
 * head (norm, output; the loss), as TorchTitan's fully_shard groups and pipeline split
 * units. A unit's params are a contiguous range of the param table and a contiguous span of
 * the flat storage layout (stacked params wq|wk|wv and w1|w3 adjacent, offsets rounded to
 * 16 floats). A model may hold a unit range [u0, u1) only (a pipeline stage): it allocates
 * parameters for those units alone; unit numbers stay global. */
/* The residual stream between units holds T / seq rows of each sequence and the head writes
 * V / cols logits columns, as the units' modules report their activation splits (nn.h
 * act_split: tensor parallel's sequence-parallel and vocab-parallel layouts; docs/nn.md); the
 * loss is the head's loss module (nn.h). */
int hp_model_num_units(hp_model_t m);                 /* of the full model */
void hp_model_unit_range(hp_model_t m, int *u0, int *u1);
/* Local parameter-table range of a unit (count 0 for a unit this model does not hold). */
void hp_model_unit_params(hp_model_t m, int unit, int *first, int *count);
/* Offset (floats) of param i in the flat storage layout. */
size_t hp_model_param_offset(hp_model_t m, int i);
/* [offset, offset + floats) of a unit in the flat storage layout. */
void hp_model_unit_span(hp_model_t m, int unit, size_t *offset, size_t *floats);
/* The unit's outer module (hooks on it run around the unit; its `unit` field is the unit). */
hp_module_t *hp_model_unit_module(hp_model_t m, int unit);
/* Every module of the model's current tree (reachable from its units' outer modules), in
 * creation order; returns the count (writes at most cap). A replaced module that is no longer
 * in the tree is not listed; a wrapper (hp_model_replace_module) is listed after the module it
 * wraps, which it holds as a child and whose name it carries: tell them apart by kind. */
int hp_model_modules(hp_model_t m, hp_module_t **out, int cap);
/* Replaces a module of the model's tree (hp_module_replace_child): the one way a parallelism
 * changes the model (a wrapper holding `old` as its child, a replaced attention core, a
 * replaced loss), besides module hooks. Gives the new module (caller-owned; it must outlive
 * the model's use of it) an activation slot. Contexts created before are refused afterwards
 * (their slot tables are smaller); the model's own context is re-created at its next use. A
 * replaced unit module (parent NULL, old = hp_model_unit_module) keeps the unit's hooks: they
 * move to `repl`. */
hp_status_t hp_model_replace_module(hp_model_t m, hp_module_t *parent, hp_module_t *old, hp_module_t *repl);
/* The parameters units [u0, u1) of cfg's model declare, in table order, without building
 * anything (a pipeline's view of the stages other ranks hold): FQN, ndim and shape. A tied head
 * without the embedding (u0 > 0) declares its own tok_embeddings.weight. Returns the count
 * (writes at most cap entries), or -1 for an invalid config or range (hp_last_error says). */
typedef struct hp_model_param_desc {
    char name[HP_PARAM_NAME_MAX];
    int ndim;
    int64_t shape[3];
    int frozen;   /* hp_param_t.frozen (LoRA's base) */
} hp_model_param_desc_t;
int hp_model_describe_params(const hp_model_config_t *cfg, int u0, int u1, hp_model_param_desc_t *out, int cap);
/* The modules' activation sizes changed (a parallel wrapper saves per-micro-batch state in the
 * context's arena: tensor parallel's gathered inputs): the model's own context is re-created
 * and contexts created before are refused afterwards (re-create them). */
hp_status_t hp_model_refresh_contexts(hp_model_t m);
/* The compute dtype of the linear layers' GEMMs (training.dtype; docs/nn.md "bf16 compute"):
 * HP_F32 (the default) or HP_BF16, under which every linear (attention and feed-forward
 * projections, the output head) rounds its GEMM operands to bf16 and multiplies them with the
 * backend's gemm_bf16 (f32 sums); master weights, gradients, activations and every other op stay
 * f32. Contexts are re-created (those made before are refused), each with a bf16 workspace for
 * the model's largest linear. HP_ERR_UNSUPPORTED for MoE models, linears with a bias, a backend
 * without gemm_bf16. */
hp_status_t hp_model_set_compute_dtype(hp_model_t m, hp_dtype_t dtype);
hp_dtype_t hp_model_compute_dtype(hp_model_t m);
/* The largest micro-batch (B sequences of T rows) the model's own context (hp_model_forward /
 * hp_model_backward) is sized for: the creation limits by default; 0 keeps a value. A caller
 * that feeds shorter rows (a context-parallel rank's T/cp of each sequence: hp_cp_apply sets
 * it) shrinks that context's activation arena with it. Contexts the caller created are not
 * affected; the RoPE table keeps the creation's max_seq_len positions. */
hp_status_t hp_model_set_context_limits(hp_model_t m, int max_batch, int max_seq_len);
int hp_model_max_seq_len(hp_model_t m);   /* the creation limit: positions of the RoPE table */
/* Creates the model for units [u0, u1) of cfg's model (0 <= u0 < u1 <= n_layers + 2). */
hp_status_t hp_model_create_range(const hp_model_config_t *cfg, int u0, int u1, int max_batch, int max_seq_len,
                                  hp_model_t *out);
/* The same, empty (hp_model_create_empty). */
hp_status_t hp_model_create_range_empty(const hp_model_config_t *cfg, int u0, int u1, int max_batch, int max_seq_len,
                                        hp_model_t *out);

/* A micro-batch context: the saved activations, unit boundaries, logits, loss sums and
 * activation-gradient buffers of one micro-batch, sized once from (max_B, max_T) for the
 * model's units (and its activation checkpointing at creation). Any number can be alive;
 * nothing is allocated per step. HP_MODEL_CTX_SPLIT_BACKWARD keeps every unit's output
 * gradient and backward scratch until its backward_weight, so weight passes can run after
 * later micro-batches' input passes (zero-bubble schedules); without it backward_input and
 * backward_weight of a range run together (hp_model_backward_range). */
typedef struct hp_model_ctx *hp_model_ctx_t;
#define HP_MODEL_CTX_SPLIT_BACKWARD 1u
hp_status_t hp_model_ctx_create(hp_model_t m, int max_B, int max_T, unsigned flags, hp_model_ctx_t *out);
void hp_model_ctx_destroy(hp_model_ctx_t c);
/* Bytes the context holds (arena + workspace). */
size_t hp_model_ctx_bytes(hp_model_ctx_t c);
/* What hp_model_ctx_create(m, max_B, max_T, flags) would allocate, without allocating: the
 * activation arena's and the workspace's bytes (the memory plan's activations). */
void hp_model_ctx_size(hp_model_t m, int max_B, int max_T, unsigned flags, size_t *arena_bytes, size_t *work_bytes);
/* Starts a micro-batch in the context (drops what it held): tokens (B, T) are needed when
 * the range includes unit 0, targets when it includes the head (NULL: logits only); the
 * loss is sum / loss_divisor (the global number of valid targets: docs/architecture.md). pos0:
 * global position of t = 0. */
hp_status_t hp_model_ctx_begin(hp_model_ctx_t c, const int32_t *tokens, const int32_t *targets, int B, int T,
                               float loss_divisor);
/* Forward of units [u0, u1) (inside the model's range). in: unit u0's input (B, T/sp, dim)
 * f32 when u0 > 0 (copied into the context; NULL when u0 == 0: the tokens). out: when
 * u1 < n_units and out is non-NULL, unit u1-1's output (B, T/sp, dim) is copied there. */
hp_status_t hp_model_forward_range(hp_model_t m, hp_model_ctx_t c, int u0, int u1, const float *in, float *out);
/* Backward of units [u0, u1) after their forward: dout = gradient of unit u1-1's output
 * (NULL when u1 is the head: the loss); din (may be NULL) receives unit u0's input gradient
 * (u0 > 0). backward_range runs backward_input then backward_weight per unit;
 * backward_input_range / backward_weight_range split them (a SPLIT_BACKWARD context). */
hp_status_t hp_model_backward_range(hp_model_t m, hp_model_ctx_t c, int u0, int u1, const float *dout, float *din);
hp_status_t hp_model_backward_input_range(hp_model_t m, hp_model_ctx_t c, int u0, int u1, const float *dout,
                                          float *din);
hp_status_t hp_model_backward_weight_range(hp_model_t m, hp_model_ctx_t c, int u0, int u1);
/* Whole model through a context: ctx_begin + forward_range(0, n) / backward_range(0, n). */
hp_status_t hp_model_forward_ctx(hp_model_t m, hp_model_ctx_t c, const int32_t *tokens, const int32_t *targets,
                                 int B, int T, float loss_divisor, float *loss);
hp_status_t hp_model_backward_ctx(hp_model_t m, hp_model_ctx_t c);
const float *hp_model_ctx_logits(hp_model_ctx_t c);      /* (B, T, V) after the head's forward */
double hp_model_ctx_loss_sum(hp_model_ctx_t c);
int64_t hp_model_ctx_valid_tokens(hp_model_ctx_t c);
/* The context's activation context (module protocol; its `be` is the kernel table). */
hp_act_t *hp_model_ctx_act(hp_model_ctx_t c);

/* Parameter storage. The parameter entries (hp_model_params) are the only truth: each entry's
 * value and grad say where its local shard lives (data) and how large it is (local shape), and
 * modules read both at every call. Storage belongs to whoever allocated it: the model allocates
 * the creation layout; a parallelism that shards a parameter in place (tensor and expert
 * parallel pack each shard at the start of its old span and shrink the local shape) or moves it
 * into storage of its own (FSDP re-points the entries at its shards and gathered buffers) then
 * calls hp_model_compact_storage. It re-packs the entries that still point into the model's
 * storage into new storage of their current sizes (in address order: entries that were
 * adjacent, the stacked GEMM members wq|wk|wv and w1|w3, stay adjacent, units stay contiguous,
 * 16-float alignment otherwise), re-points them and frees the old storage; hp_model_unit_span
 * and hp_model_param_offset then describe the new layout. Entries pointing elsewhere are left
 * to their owner; when none is left in the model's storage the model holds none:
 * hp_model_zero_grad only zeroes what the model holds, hp_model_memory reports it, and
 * hp_model_init_weights refuses entries it does not hold. On an empty model
 * (hp_model_create_empty) nothing moves: the layout follows the entries' new local sizes. */
hp_status_t hp_model_compact_storage(hp_model_t m);
int hp_model_max_tokens(hp_model_t m);   /* max_batch * max_seq_len */

/* Per-op timing of the last forward + backward of the whole-model calls: *names and
 * *seconds receive arrays of the returned length, owned by the model. */
int hp_model_profile(hp_model_t m, const char ***names, const double **seconds);
/* Activation checkpointing of the transformer blocks (TorchTitan semantics, docs/nn.md):
 * every_k = 0 off, 1 every block (mode full), k > 1 the blocks l (0-based) with
 * (l + 1) % k == 0 (TorchTitan's layer-level selective AC). A checkpointed block is wrapped
 * by a checkpoint module that becomes the unit's outer module (its hooks move with it): it
 * keeps only the block's input through forward; its backward first recomputes the block's
 * forward (bitwise the same activations; after the unit's pre_backward hooks, without the
 * forward hooks), then runs the block's backward and releases the recomputed state.
 * Re-sizes the model's own context (hp_model_memory reports it); contexts created before
 * are refused afterwards (re-create them); refused between a forward and its backward. */
hp_status_t hp_model_set_activation_checkpoint(hp_model_t m, int every_k);
int hp_model_activation_checkpoint(hp_model_t m);
/* The same with a save policy (nn_checkpoint.h): o->every_k picks the blocks (TorchTitan: 1 for
 * op-level selective AC and for the memory budget), o->policy what each keeps through the forward:
 * nothing (HP_AC_FULL), TorchTitan's op-level save list (HP_AC_OP) or a knapsack under
 * o->memory_budget (HP_AC_BUDGET); the replay recomputes the rest and skips the ops whose outputs
 * were kept, so losses and gradients are bitwise those without checkpointing. A context decides
 * for its (max_B, max_T) when it is created. hp_model_set_activation_checkpoint(m, k) is this with
 * every_k k and HP_AC_FULL. */
hp_status_t hp_model_set_activation_checkpoint_options(hp_model_t m, const hp_ac_options_t *o);
void hp_model_activation_checkpoint_options(hp_model_t m, hp_ac_options_t *o);
/* What AC costs per micro-batch context of (B, T) (every context is one micro-batch in flight). */
typedef struct hp_ac_estimate {
    size_t act_bytes;          /* the context's activation memory: saved tensors plus recompute regions */
    size_t kept_bytes;         /* of which: kept through the forward (non-checkpointed units and kept items) */
    size_t region_bytes;       /* of which: recompute regions (one, or one per block with split_backward) */
    size_t none_bytes;         /* the same context without checkpointing */
    double recompute_flops;    /* forward FLOPs the replays run in backward */
    double checkpointed_flops; /* forward FLOPs of the checkpointed blocks' items (what full AC recomputes) */
    int n_checkpointed;        /* blocks */
} hp_ac_estimate_t;
/* The estimate for options o (not necessarily the model's), the model's module tree (its
 * parallelisms included: the shards it runs) and (B, T); split_backward: contexts with deferred
 * weight passes (HP_MODEL_CTX_SPLIT_BACKWARD). A library call for memory plans and planners: it
 * allocates no activations. */
hp_status_t hp_model_activation_checkpoint_estimate(hp_model_t m, const hp_ac_options_t *o, int B, int T,
                                                    int split_backward, hp_ac_estimate_t *out);
/* Bytes of each arena (parameters, gradients, activations, workspace) for start-up reports. */
void hp_model_memory(hp_model_t m, size_t *param_bytes, size_t *grad_bytes,
                     size_t *act_bytes, size_t *work_bytes);

#ifdef __cplusplus
}
#endif
#endif
