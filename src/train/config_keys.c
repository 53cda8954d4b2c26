/* The training configuration's keys (docs/config.md): the schema table (section, name, type,
 * default, range, choices, aliases, doc), key lookup with "did you mean", and the one function
 * that parses every value (hp_cfg_set_from_text), so the file, the command line and the
 * defaults obey the same rules and produce the same messages. */
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "train/config-impl.h"

#define OFF(field) offsetof(hp_config_t, field)
#define KR(sec, name, type_, def, choices_, alias_, doc_, lo, hi, f32_)                                  \
    {.section = #sec, .key = #name, .type = HP_CONFIG_##type_, .default_value = def, .choices = choices_,     \
     .alias = alias_, .doc = doc_, .offset = OFF(sec.name), .int_min = lo, .int_max = hi, .f32 = f32_,            \
     .float_min = -HUGE_VAL, .float_max = HUGE_VAL}
#define K(sec, name, type_, def, choices_, alias_, doc_) \
    KR(sec, name, type_, def, choices_, alias_, doc_, INT64_MIN, INT64_MAX, false)
/* An integer key with the range of the type that uses it; a float key used in float32. */
#define KI(sec, name, def, lo, hi, alias_, doc_) KR(sec, name, INT, def, NULL, alias_, doc_, lo, hi, false)
#define KF32(sec, name, def, alias_, doc_) KR(sec, name, FLOAT, def, NULL, alias_, doc_, INT64_MIN, INT64_MAX, true)
/* model.* overrides of the flavor: -1 (the default) keeps the flavor's value (docs/config.md). */
#define KM_INT(name, lo, hi, doc_, hint_)                                                                         \
    {.section = "model", .key = #name, .type = HP_CONFIG_INT, .default_value = "-1", .doc = doc_,                  \
     .offset = OFF(model.name), .int_min = lo, .int_max = hi, .float_min = -HUGE_VAL, .float_max = HUGE_VAL,       \
     .flavor_default = true, .hint = hint_}
#define KM_F32(name, lo, hi, doc_, hint_)                                                                         \
    {.section = "model", .key = #name, .type = HP_CONFIG_FLOAT, .default_value = "-1", .doc = doc_,                \
     .offset = OFF(model.name), .int_min = INT64_MIN, .int_max = INT64_MAX, .f32 = true, .float_min = lo,          \
     .float_max = hi, .flavor_default = true, .hint = hint_}
#define KM_TRI(name, doc_)                                                                                        \
    {.section = "model", .key = #name, .type = HP_CONFIG_TRISTATE, .default_value = "default", .doc = doc_,        \
     .offset = OFF(model.name), .int_min = INT64_MIN, .int_max = INT64_MAX, .float_min = -HUGE_VAL,                \
     .float_max = HUGE_VAL, .flavor_default = true}

const hp_config_key_t hp_cfg_keys[] = {
    /* job */
    K(job, dump_folder, STRING, "./outputs", NULL, NULL,
      "Folder for run outputs; relative checkpoint, TensorBoard and JSONL paths are placed under it."),
    K(job, description, STRING, "", NULL, NULL, "Free text describing the run (printed at start-up)."),
    K(job, print_config, BOOL, "true", NULL, NULL, "Print the resolved config (YAML) on rank 0 at start-up."),
    K(job, config_file, STRING, "", NULL, NULL,
      "The YAML file this config was read from (set by `--config FILE`; informational)."),
    /* model */
    K(model, name, STRING, "llama3", NULL, NULL,
      "Model family in the model registry (llama3, qwen3, deepseek_v3, qwen3_moe)."),
    K(model, flavor, STRING, "debugmodel", NULL, NULL, "Size preset of the model family (e.g. debugmodel); hf = the model of the HF checkpoint at "
      "checkpoint.initial_load_path (its config.json)."),
    KM_INT(dim, 1, HP_MODEL_MAX_DIM, "Model width (embedding and residual size); -1 = the flavor's.",
           "the model width; -1 (the default) keeps the flavor's"),
    KM_INT(n_layers, 1, HP_MODEL_MAX_LAYERS, "Transformer blocks; -1 = the flavor's.",
           "the number of transformer blocks; -1 (the default) keeps the flavor's"),
    KM_INT(n_heads, 1, HP_MODEL_MAX_HEADS, "Attention (query) heads; -1 = the flavor's.",
           "the number of query heads; -1 (the default) keeps the flavor's"),
    KM_INT(n_kv_heads, 1, HP_MODEL_MAX_HEADS,
           "Key/value heads (grouped-query attention); must divide n_heads; -1 = the flavor's (n_heads when the "
           "flavor has as many KV heads as heads).",
           "must divide model.n_heads; -1 (the default) keeps the flavor's"),
    KM_INT(head_dim, 2, 512,
           "Channels per attention head; even (RoPE rotates pairs); -1 = the flavor's (llama3: dim / n_heads, "
           "following model.dim and model.n_heads).",
           "an even number of channels per head; -1 (the default) keeps the flavor's"),
    KM_INT(hidden_dim, 1, HP_MODEL_MAX_DIM,
           "FFN hidden size (rows of w1 and w3); -1 = the flavor's (llama3: TorchTitan's rule from dim, "
           "multiple_of and ffn_dim_multiplier, following them).",
           "the FFN hidden size; -1 (the default) keeps the flavor's rule"),
    KM_INT(vocab_size, 1, HP_MODEL_MAX_VOCAB,
           "Vocabulary size; must equal the tokenizer's (-1: the trainer takes the tokenizer's).",
           "vocabularies above HP_MODEL_MAX_VOCAB = 2^24 ids are refused; -1 (the default) takes the tokenizer's"),
    KM_INT(multiple_of, 1, HP_MODEL_MAX_DIM,
           "llama3 FFN rule: the hidden size is rounded up to a multiple of this; -1 = the flavor's.",
           "-1 (the default) keeps the flavor's"),
    KM_F32(ffn_dim_multiplier, 0, 64,
           "llama3 FFN rule: hidden size = multiplier x 8/3 x dim before rounding; 0 = none; -1 = the flavor's.",
           "0 = none; -1 (the default) keeps the flavor's"),
    KM_F32(norm_eps, FLT_MIN, 1, "RMSNorm epsilon; -1 = the flavor's.", "a value > 0 such as 1e-5; -1 (the default) keeps the flavor's"),
    KM_F32(rope_theta, FLT_MIN, FLT_MAX, "RoPE base frequency; -1 = the flavor's.",
           "a value > 0 such as 500000; -1 (the default) keeps the flavor's"),
    KM_TRI(rope_scaling, "Llama 3.1 RoPE frequency scaling (true/false); default = the flavor's."),
    KM_F32(rope_factor, FLT_MIN, FLT_MAX, "RoPE scaling factor; -1 = the flavor's.",
           "a value > 0 such as 8; -1 (the default) keeps the flavor's"),
    KM_F32(rope_low_freq_factor, FLT_MIN, FLT_MAX, "RoPE scaling low-frequency factor; -1 = the flavor's.",
           "a value > 0 such as 1; -1 (the default) keeps the flavor's"),
    KM_F32(rope_high_freq_factor, FLT_MIN, FLT_MAX,
           "RoPE scaling high-frequency factor (above the low one); -1 = the flavor's.",
           "a value > 0 such as 4; -1 (the default) keeps the flavor's"),
    KM_INT(rope_original_max_pos, 1, I32, "RoPE scaling: the original context length; -1 = the flavor's.",
           "a context length such as 8192; -1 (the default) keeps the flavor's"),
    KM_TRI(qk_norm, "RMSNorm over head_dim on q and k before RoPE (qwen3); default = the flavor's."),
    KM_TRI(tie_embeddings, "The output projection uses tok_embeddings.weight; default = the flavor's."),
    KM_INT(max_seq_len, 1, HP_MODEL_MAX_SEQ_LEN,
           "Longest context the model supports (RoPE table; HF max_position_embeddings); at least "
           "training.seq_len; -1 = training.seq_len.",
           "at least training.seq_len and at most HP_MODEL_MAX_SEQ_LEN = 2^20; -1 (the default) = training.seq_len"),
    /* the MoE families' keys (docs/moe.md): -1 / default keep the flavor's */
    KM_INT(moe_num_experts, 1, HP_MOE_MAX_EXPERTS,
           "MoE models (deepseek_v3, qwen3_moe): routed experts per MoE layer; -1 = the flavor's.",
           "1 .. 512 routed experts; -1 (the default) keeps the flavor's"),
    KM_INT(moe_top_k, 1, HP_MOE_MAX_EXPERTS, "MoE: experts each token is routed to (at most moe_num_experts); "
           "-1 = the flavor's.", "1 .. model.moe_num_experts; -1 (the default) keeps the flavor's"),
    KM_INT(moe_hidden_dim, 1, HP_MODEL_MAX_DIM, "MoE: hidden size of each routed (and shared) expert; -1 = the "
           "flavor's.", "-1 (the default) keeps the flavor's"),
    KM_INT(moe_num_shared_experts, 0, 64, "MoE: shared experts (one dense SwiGLU of moe_num_shared_experts x "
           "moe_hidden_dim every token passes); 0 = none; -1 = the flavor's.", "0 = none; -1 (the default) keeps the flavor's"),
    KM_INT(moe_n_dense_layers, 0, HP_MODEL_MAX_LAYERS, "MoE: the first layers keep a dense feed-forward; -1 = the "
           "flavor's.", "0 .. model.n_layers; -1 (the default) keeps the flavor's"),
    KM_INT(moe_n_expert_groups, 0, HP_MOE_MAX_EXPERTS, "MoE node-limited routing (deepseek_v3; HF n_group): the "
           "experts form this many groups and each token picks experts of its best moe_n_limited_groups groups only; "
           "0 = no groups; -1 = the flavor's (671B 8).", "0 (no groups) or a divisor of model.moe_num_experts; -1 (the "
           "default) keeps the flavor's"),
    KM_INT(moe_n_limited_groups, 0, HP_MOE_MAX_EXPERTS, "MoE node-limited routing (HF topk_group): the groups a token "
           "may use, at most moe_n_expert_groups; -1 = the flavor's (671B 4).",
           "1 .. model.moe_n_expert_groups; -1 (the default) keeps the flavor's"),
    K(model, moe_score_func, ENUM, "default", "default|sigmoid|softmax", NULL,
      "MoE router score function; default = the flavor's (deepseek_v3 671B sigmoid, the debug models softmax)."),
    KM_TRI(moe_route_norm, "MoE: divide the top-k gate values by their sum; default = the flavor's."),
    KM_F32(moe_route_scale, FLT_MIN, 1000, "MoE: gate values are multiplied by this; -1 = the flavor's.",
           "a value > 0 such as 1 or 2.5; -1 (the default) keeps the flavor's"),
    KM_TRI(moe_score_before_experts, "MoE: scale the expert input by the gate instead of its output; default = the "
           "flavor's (false)."),
    KM_F32(moe_load_balance_coeff, 0, 1, "MoE: aux-loss-free load balancing, the expert_bias step per optimizer step "
           "(TorchTitan: 1e-3); 0 = off; -1 = the flavor's.", "0 (off) .. 1; -1 (the default) keeps the flavor's"),
    KM_F32(moe_aux_loss_coeff, 0, 1000, "MoE: HyperParallel's auxiliary loss coeff x E x sum_e f_e p_e per layer and "
           "micro-batch (its gradient added to the router, logged as moe/aux_loss); 0 = off (the flavors); -1 = the "
           "flavor's.", "0 (off) or a small value such as 1e-3; -1 (the default) keeps the flavor's"),
    /* MLA attention's keys (deepseek_v3, docs/moe.md) */
    KM_INT(q_lora_rank, 0, HP_MODEL_MAX_DIM, "MLA (deepseek_v3): rank of the query projection wq_a -> q_norm -> wq_b; "
           "0 = one full wq; -1 = the flavor's (debugmodel 0, 671B 1536).", "0 (a full wq) or a rank; -1 (the default) "
           "keeps the flavor's"),
    KM_INT(kv_lora_rank, 1, HP_MODEL_MAX_DIM, "MLA: width of the compressed key/value latent (wkv_a, kv_norm, wkv_b); "
           "-1 = the flavor's (512).", "-1 (the default) keeps the flavor's"),
    KM_INT(qk_nope_head_dim, 0, 512, "MLA: per-head query/key channels without RoPE; -1 = the flavor's (128).",
           "0 .. 512; -1 (the default) keeps the flavor's"),
    KM_INT(qk_rope_head_dim, 2, 512, "MLA: per-head query/key channels with RoPE (the key part k_pe is shared by every "
           "head); even; -1 = the flavor's (64).", "an even 2 .. 512; -1 (the default) keeps the flavor's"),
    KM_INT(v_head_dim, 1, 512, "MLA: per-head value channels; -1 = the flavor's (128).",
           "1 .. 512; -1 (the default) keeps the flavor's"),
    KM_F32(mla_mscale, 0, 100, "MLA YaRN: the softmax scale gets (0.1 mla_mscale ln(rope_factor) + 1)^2 when "
           "max_seq_len > rope_original_max_pos; -1 = the flavor's (debugmodel 0.7, 671B 1).",
           "a value >= 0 such as 1; -1 (the default) keeps the flavor's"),
    KM_F32(mla_norm_eps, 0, 1, "MLA: epsilon of q_norm and kv_norm; 0 = model.norm_eps (TorchTitan's deepseek_v3); an "
           "HF config.json gives 1e-6 (transformers' DeepseekV3 fixes it); -1 = the flavor's (0).",
           "0 (= model.norm_eps) or an epsilon such as 1e-6; -1 (the default) keeps the flavor's"),
    KM_F32(rope_beta_fast, FLT_MIN, 1e6, "MLA YaRN: beta_fast, the rotations that bound the extrapolated band of the "
           "RoPE frequencies (HF rope_parameters.beta_fast); -1 = the flavor's (32).",
           "a value above model.rope_beta_slow such as 32; -1 (the default) keeps the flavor's"),
    KM_F32(rope_beta_slow, FLT_MIN, 1e6, "MLA YaRN: beta_slow, the rotations that bound the interpolated band (HF "
           "rope_parameters.beta_slow); -1 = the flavor's (1).",
           "a value > 0 below model.rope_beta_fast such as 1; -1 (the default) keeps the flavor's"),
    /* training */
    KI(training, steps, "10000", 1, I64, NULL, "Number of optimizer steps to train."),
    KI(training, seq_len, "2048", 1, HP_MODEL_MAX_SEQ_LEN, NULL, "Tokens per sequence (context length of a training sample)."),
    KI(training, local_batch_size, "8", 1, I32, NULL,
      "Sequences per data-parallel rank per microbatch (one forward/backward)."),
    KI(training, global_batch_size, "-1", -1, I32, NULL,
      "Sequences per optimizer step over all data-parallel ranks; -1 = local_batch_size x dp degree. "
      "Gradient accumulation steps = global_batch_size / (local_batch_size x dp degree), which must divide exactly."),
    KF32(training, max_norm, "1.0", NULL,
      "Clip the global gradient norm to this value; 0 disables clipping (the norm is still computed and logged)."),
    KI(training, seed, "0", INT64_MIN, I64, NULL,
      "Seed of the counter-based RNG (parameter init, dropout-free sampling); the same on every rank."),
    K(training, deterministic, BOOL, "false", NULL, NULL,
      "Pin thread counts: OpenMP dynamic adjustment off, OpenBLAS threads = OpenMP threads (reduction orders are always fixed)."),
    K(training, dtype, ENUM, "float32", "float32|bfloat16", NULL, "Compute dtype of the linear layers' GEMMs. bfloat16: their inputs and weights are rounded to bf16 and multiplied with float32 sums (CPU autocast's matmuls); parameters, gradients, optimizer state, activations and all other ops stay float32, so activation memory is not halved. Runs at 1 rank, under FSDP and TP; refused with pipeline, context, expert or replicate parallelism and for MoE models (docs/nn.md, bf16 compute)."),
    K(training, mixed_precision_param, ENUM, "bfloat16", "bfloat16|float32", NULL,
      "Dtype FSDP all-gathers parameters in (compute dtype) when mixed precision is on."),
    K(training, mixed_precision_reduce, ENUM, "float32", "float32|bfloat16", NULL,
      "Dtype FSDP reduces gradients in."),
    KR(training, memory_limit_gib, FLOAT, "0", NULL, NULL,
       "Memory per rank (GiB) the memory plan checks its predicted peak against before allocating the model; 0 = "
       "what the process holds plus this host's MemAvailable divided by its ranks, < 0 = no check (docs/memory.md).",
       INT64_MIN, INT64_MAX, false),
    /* optimizer */
    K(optimizer, name, ENUM, "adamw", "adamw|sgd|muon", NULL, "Optimizer."),
    KF32(optimizer, lr, "0.0008", NULL, "Peak learning rate (the schedule multiplies it)."),
    KF32(optimizer, beta1, "0.9", NULL, "AdamW first-moment decay."),
    KF32(optimizer, beta2, "0.95", NULL, "AdamW second-moment decay."),
    KF32(optimizer, eps, "1e-08", NULL, "AdamW denominator epsilon."),
    KF32(optimizer, weight_decay, "0.1", NULL, "Decoupled weight decay (AdamW) or L2 decay (SGD)."),
    KF32(optimizer, momentum, "0.9", NULL, "Momentum of SGD and Muon (ignored by AdamW)."),
    /* lr_scheduler */
    KI(lr_scheduler, warmup_steps, "200", 0, I64, NULL,
      "Linear warm-up steps: factor (s+1)/warmup_steps for 0-based step s."),
    K(lr_scheduler, decay_ratio, FLOAT, "-1", NULL, NULL,
      "Fraction of the steps spent decaying at the end (warm-up, stable, decay: WSD); -1 = None: decay over "
      "every step after warm-up."),
    K(lr_scheduler, decay_type, ENUM, "linear", "linear|sqrt|cosine", NULL,
      "Shape of the decay: 1-p, 1-sqrt(p) or (1+cos(pi p))/2 of progress p."),
    K(lr_scheduler, min_lr_factor, FLOAT, "0.0", NULL, NULL,
      "The decay ends at min_lr_factor x lr: factor = min_lr_factor + (1 - min_lr_factor) x decay."),
    /* parallelism */
    KI(parallelism, data_parallel_replicate_degree, "1", -1, DEG, "dp_replicate",
      "Replicas of the model (DDP, or the replicate dim of HSDP)."),
    KI(parallelism, data_parallel_shard_degree, "-1", -1, DEG, "dp_shard",
      "FSDP shard degree; -1 takes the ranks left after the other degrees."),
    KI(parallelism, tensor_parallel_degree, "1", -1, DEG, "tp", "Tensor (and sequence) parallel degree."),
    KI(parallelism, pipeline_parallel_degree, "1", -1, DEG, "pp", "Pipeline stages (ranks along pp)."),
    KI(parallelism, context_parallel_degree, "1", -1, DEG, "cp", "Context (sequence) parallel degree."),
    KI(parallelism, expert_parallel_degree, "1", -1, DEG, "ep",
      "Expert parallel degree; borrows ranks from dp_shard x cp x tp, which it must divide."),
    KI(parallelism, expert_tensor_parallel_degree, "1", -1, DEG, "etp",
      "Tensor parallel degree inside experts; 1 or tensor_parallel_degree."),
    K(parallelism, fsdp_reshard_after_forward, ENUM, "default", "default|always|never", NULL,
      "Free gathered parameters after forward: default = always unless pipeline parallel."),
    KI(parallelism, zero_stage, "0", 0, 1, NULL,
      "1: ZeRO-1 (ZeroRedundancyOptimizer) under replicated data parallel (DDP): each dp_replicate rank holds the "
      "optimizer state of its share of the parameters; 0: off (FSDP shards the state already). HyperParallel-C's key, "
      "not TorchTitan's (docs/fsdp.md, ZeRO-1)."),
    /* `auto` is a C keyword: the field is auto_layout */
    {.section = "parallelism", .key = "auto", .type = HP_CONFIG_BOOL, .default_value = "false",
     .doc = "Let the planner choose the layout for the world size (docs/planner.md): every layout the trainer "
            "supports is checked by its rules and the memory plan against training.memory_limit_gib, and the one "
            "with the smallest predicted step time (the planner's calibration) replaces the parallelism / "
            "activation_checkpoint keys; the run stops with the smallest predicted peak when none fits. "
            "HyperParallel-C's key (HyperParallel's SAPP).",
     .offset = OFF(parallelism.auto_layout), .int_min = INT64_MIN, .int_max = INT64_MAX,
     .float_min = -HUGE_VAL, .float_max = HUGE_VAL},
    K(parallelism, enable_loss_parallel, BOOL, "true", NULL, NULL,
      "Under TP, compute the cross-entropy on vocab-sharded logits instead of gathering them."),
    K(parallelism, enable_sequence_parallel, BOOL, "true", NULL, NULL,
      "Under TP, shard norms and residuals along the sequence (SP)."),
    K(parallelism, pipeline_parallel_schedule, ENUM, "1f1b",
      "gpipe|1f1b|interleaved1f1b|loopedbfs|interleavedzerobubble|zbvzerobubble|dualpipev|mpipetranspose", NULL,
      "Pipeline schedule (names as TorchTitan's, case-insensitive; MPipeTranspose is HyperParallel's)."),
    KI(parallelism, pipeline_parallel_mpipe_transpose_layers, "0", 0, I32, NULL,
      "MPipeTranspose: transformer layers in the transposed preprocess besides tok_embeddings (HyperParallel's "
      "num_transpose_layers); stage 0 must hold them."),
    KI(parallelism, pipeline_parallel_microbatch_size, "1", 1, I32, NULL,
      "Sequences per pipeline microbatch; microbatches = local_batch_size / this."),
    KI(parallelism, pipeline_parallel_layers_per_stage, "-1", -1, I32, NULL,
      "Transformer layers per virtual stage; -1 = split evenly by the schedule's stage count."),
    KI(parallelism, pipeline_parallel_first_stage_less_layers, "1", 0, I32, NULL,
      "Layers the first stage gives up for the embedding."),
    KI(parallelism, pipeline_parallel_last_stage_less_layers, "1", 0, I32, NULL,
      "Layers the last stage gives up for the final norm and output head."),
    K(parallelism, pipeline_parallel_schedule_csv, STRING, "", NULL, NULL,
      "A schedule written by hand: CSV, one row per pp rank, cells {stage}{F|I|W|B}{microbatch} (empty = idle; "
      "SEND/RECV cells make it a full compute+comms list); overrides pipeline_parallel_schedule."),
    K(parallelism, module_fqns_per_model_part, STRING, "", NULL, NULL,
      "Modules of each pipeline stage: stages separated by ';', names by ',' (e.g. "
      "\"tok_embeddings,layers.0;layers.1,norm,output\"); overrides the layer split."),
    K(parallelism, context_parallel_rotate_method, ENUM, "allgather", "allgather|alltoall", NULL,
      "How context parallel exchanges keys and values: allgather (K/V all-gathered once, dK/dV "
      "reduce-scattered) or alltoall (passed round the ring, the next block in flight during the current one)."),
    K(parallelism, context_parallel_load_balancer, ENUM, "headtail", "headtail|none", NULL,
      "Sequence layout over the cp ranks: headtail (2 cp chunks, rank r holds chunks r and 2 cp - 1 - r, so "
      "causal work is balanced; seq_len divisible by 2 cp) or none (contiguous T/cp rows per rank)."),
    KI(parallelism, context_parallel_ulysses_degree, "1", 1, I32, NULL,
      "Ulysses (all-to-all sequence <-> heads) part of the cp degree: cp = ulysses x ring; must divide "
      "context_parallel_degree and the (per-TP-rank) query and kv heads. 1 = ring attention only."),
    K(parallelism, context_parallel_async, BOOL, "false", NULL, NULL,
      "HyperParallel's AsyncContextParallel: start the K/V collective (Ulysses all-to-all, the all-gather, or "
      "the ring's first transfer) from the fused q/k/v projection's post-forward hook and wait in the attention core; "
      "bitwise the synchronous results."),
    /* activation_checkpoint */
    K(activation_checkpoint, mode, ENUM, "none", "none|full|selective|memory_budget", NULL,
      "Recompute activations in backward: none, every block (full), selected blocks or ops (selective), or what "
      "a knapsack under memory_budget drops (memory_budget). Losses and gradients are bitwise those of none."),
    K(activation_checkpoint, selective_ac_option, STRING, "2", NULL, NULL,
      "Selective mode: an integer k checkpoints every k-th transformer block (0 = every block); \"op\" is "
      "TorchTitan's op-level SAC: save matmul outputs except every second one, attention outputs, the MoE "
      "router's choices; recompute the rest."),
    {.section = "activation_checkpoint", .key = "memory_budget", .type = HP_CONFIG_FLOAT, .default_value = "0.5",
     .doc = "Mode memory_budget: the share of each block's activation bytes kept, chosen by a 0-1 knapsack "
            "maximising the recompute FLOPs saved (torch's partitioner); 0 = full AC, 1 = keep everything.",
     .offset = OFF(activation_checkpoint.memory_budget), .int_min = INT64_MIN, .int_max = INT64_MAX,
     .float_min = 0.0, .float_max = 1.0},
    K(activation_checkpoint, per_op_sac_force_recompute_mm_shapes_by_fqns, STRING, "moe.router.gate", NULL, NULL,
      "Op-level SAC: comma-separated FQN parts; every matmul with the weight shape of a matching weight is "
      "recomputed and not counted in the every-second rule (TorchTitan's key; default: the MoE router gate)."),
    /* checkpoint */
    K(checkpoint, enable, BOOL, "false", NULL, NULL, "Save (and resume from) checkpoints."),
    K(checkpoint, folder, STRING, "checkpoint", NULL, NULL,
      "Checkpoint folder (under job.dump_folder when relative); holds step-N/ directories."),
    KI(checkpoint, interval, "500", 1, I64, NULL, "Save every this many steps (and at the last step)."),
    KI(checkpoint, keep_latest_k, "10", 0, I32, NULL,
      "Keep only the newest k checkpoints; 0 keeps all (1 is refused, as in TorchTitan)."),
    K(checkpoint, initial_load_path, STRING, "", NULL, NULL,
      "Checkpoint to start from when the folder has none (e.g. converted HF weights)."),
    KI(checkpoint, load_step, "-1", -1, I64, NULL, "Step to resume from; -1 = the latest."),
    K(checkpoint, last_save_model_only, BOOL, "true", NULL, NULL,
      "The final checkpoint holds only the model weights."),
    K(checkpoint, export_dtype, ENUM, "float32", "float32|bfloat16", NULL,
      "Dtype of the model-only final checkpoint."),
    K(checkpoint, async_mode, ENUM, "disabled", "disabled|async|async_with_pinned_mem", NULL,
      "Write checkpoints in the background."),
    K(checkpoint, exclude_from_loading, LIST, "", NULL, NULL,
      "State keys not restored on load (model, optimizer, lr_scheduler, dataloader, train_state)."),
    K(checkpoint, verify_checksums, BOOL, "true", NULL, NULL,
      "Verify each tensor's XXH3 checksum (recorded in metadata.json) when loading; false skips the check. "
      "Checkpoints without checksums load unverified."),
    /* metrics */
    KI(metrics, log_freq, "10", 1, I64, NULL, "Log at step 1 and every log_freq steps."),
    K(metrics, enable_tensorboard, BOOL, "false", NULL, NULL, "Write TensorBoard event files."),
    K(metrics, save_tb_folder, STRING, "tb", NULL, NULL,
      "TensorBoard folder (under job.dump_folder when relative)."),
    K(metrics, jsonl_file, STRING, "", NULL, NULL,
      "Write one JSON object per log step to this file (under job.dump_folder when relative); empty = off."),
    K(metrics, peak_flops, FLOAT, "0", NULL, NULL,
      "Peak FLOP/s per rank for MFU; 0 = measure the cores' float32 FMA peak at start-up (and the sgemm peak beside it); -1 = do not report MFU."),
    K(metrics, save_for_all_ranks, BOOL, "false", NULL, NULL,
      "Every rank writes its own metrics files (default: rank 0 only)."),
    K(metrics, enable_color, BOOL, "false", NULL, NULL, "Colour the console metrics line."),
    /* validation */
    K(validation, enable, BOOL, "false", NULL, NULL, "Evaluate the loss on the validation split."),
    KI(validation, freq, "10", 1, I64, NULL, "Validate every this many steps."),
    KI(validation, steps, "-1", -1, I64, NULL, "Validation batches per evaluation; -1 = the whole split."),
    KI(validation, local_batch_size, "-1", -1, I32, NULL,
      "Sequences per rank per validation batch; -1 = training.local_batch_size."),
    /* data */
    K(data, path, STRING, "", NULL, NULL, "Training data file (text, JSONL or pre-tokenized binary)."),
    K(data, format, ENUM, "auto", "auto|text|jsonl|bin|chat|sft", NULL,
      "File format; auto picks by extension (.jsonl/.json = jsonl, .bin = bin, otherwise text); chat (alias sft): "
      "JSONL conversations for supervised fine-tuning (docs/finetune.md)."),
    K(data, text_separator, ENUM, "blank_line", "blank_line|percent|line", NULL,
      "Text format: documents are separated by blank lines, by lines holding only '%' (fortune files), "
      "or each line is a document."),
    K(data, jsonl_field, STRING, "text", NULL, NULL, "JSONL format: the string field holding the document."),
    K(data, bin_dtype, ENUM, "uint16", "uint16|uint32", NULL,
      "Binary format: little-endian token id width (the file is the concatenated token stream)."),
    K(data, validation_fraction, FLOAT, "0.0", NULL, NULL,
      "Fraction of documents (tokens for bin) at the end of the file held out as the validation split."),
    K(data, loop, BOOL, "true", NULL, NULL,
      "Restart from the beginning of the rank's shard when it is exhausted (infinite data)."),
    /* supervised fine-tuning (data.format=chat): docs/finetune.md */
    K(data, chat_template, STRING, "", NULL, NULL,
      "Chat data: the chat template by name (qwen2.5, chatml, qwen3, llama2, llama3, llama3.1, mistral-v0.1, mistral, "
      "gemma, deepseek_v3); empty = the one of the tokenizer.path model folder, recognised from its text."),
    K(data, pack, BOOL, "true", NULL, NULL,
      "Chat data: pack several whole samples into each row (boundaries recorded, padding at the row's end); false = "
      "one sample per row."),
    K(data, sft_truncation, ENUM, "truncate", "truncate|drop|error", NULL,
      "Chat data: a conversation longer than training.seq_len + 1 tokens is cut to that length (truncate), skipped "
      "(drop) or stops the run naming its file and line (error)."),
    /* tokenizer */
    K(tokenizer, path, STRING, "", NULL, NULL,
      "HF tokenizer.json file; empty = train one from the data at first run and cache it under job.dump_folder."),
    KI(tokenizer, vocab_size, "2048", 1, HP_MODEL_MAX_VOCAB, NULL,
      "Vocabulary size of a tokenizer trained at first run (ignored when path is set)."),
    /* fault_tolerance (TorchFT): not implemented; the key exists so that a TorchTitan config
     * that sets it gets a refusal that points at --max-restarts */
    K(fault_tolerance, enable, BOOL, "false", NULL, NULL,
      "TorchFT-style continuation of the surviving replica groups after a lost host: not implemented, true is "
      "refused by name (it would also need an MPI with ULFM, MPIX_Comm_shrink; docs/multihost.md). hp-train "
      "--max-restarts restarts from the last checkpoint instead."),
    /* lora */
    K(lora, enable, BOOL, "false", NULL, NULL,
      "LoRA fine-tuning: adapters on lora.target_modules, every other parameter frozen (docs/finetune.md)."),
    KI(lora, rank, "8", 1, 4096, NULL, "LoRA rank r (PEFT's r)."),
    KF32(lora, alpha, "16", NULL, "LoRA alpha; the update is scaled by alpha / rank (PEFT's lora_alpha)."),
    K(lora, target_modules, LIST, "q_proj,v_proj", NULL, NULL,
      "Projections that get adapters: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj (PEFT's names) or "
      "wq wk wv wo w1 w3 w2."),
    K(lora, adapter_path, STRING, "", NULL, NULL,
      "A PEFT adapter folder (adapter_config.json + adapter_model.safetensors) to start from; empty = A Kaiming-uniform, "
      "B zeros."),
    K(lora, save_folder, STRING, "lora_adapter", NULL, NULL,
      "The adapter is written in PEFT's format to this folder (under job.dump_folder when relative) at the end of "
      "training, and to FOLDER/step-N at each checkpoint.interval step when checkpoint.enable; empty = not written."),
};

const size_t hp_cfg_n_keys = sizeof(hp_cfg_keys) / sizeof(hp_cfg_keys[0]);
_Static_assert(sizeof(hp_cfg_keys) / sizeof(hp_cfg_keys[0]) <= HP_CFG_MAX_KEYS, "raise HP_CFG_MAX_KEYS");

const hp_config_key_t *hp_config_schema(size_t *count) {
    if (count) *count = hp_cfg_n_keys;
    return hp_cfg_keys;
}

const char *hp_config_type_name(hp_config_type_t type) {
    switch (type) {
    case HP_CONFIG_INT: return "int";
    case HP_CONFIG_FLOAT: return "float";
    case HP_CONFIG_BOOL: return "bool";
    case HP_CONFIG_STRING: return "string";
    case HP_CONFIG_ENUM: return "enum";
    case HP_CONFIG_LIST: return "list";
    case HP_CONFIG_TRISTATE: return "bool or default";
    }
    return "?";
}

const char *hp_cfg_type_words(hp_config_type_t type) {
    switch (type) {
    case HP_CONFIG_INT: return "an integer";
    case HP_CONFIG_FLOAT: return "a number";
    case HP_CONFIG_BOOL: return "a boolean (true/false)";
    case HP_CONFIG_STRING: return "a string";
    case HP_CONFIG_ENUM: return "one of";
    case HP_CONFIG_LIST: return "a list of strings";
    case HP_CONFIG_TRISTATE: return "a boolean (true/false) or default";
    }
    return "?";
}

static bool key_matches(const hp_config_key_t *k, const char *section, size_t slen, const char *key) {
    if (strlen(k->section) != slen || strncmp(k->section, section, slen) != 0) return false;
    return strcmp(k->key, key) == 0 || (k->alias && strcmp(k->alias, key) == 0);
}

const hp_config_key_t *hp_config_find_key(const char *dotted) {
    const char *dot = strchr(dotted, '.');
    if (!dot) return NULL;
    for (size_t i = 0; i < hp_cfg_n_keys; i++)
        if (key_matches(&hp_cfg_keys[i], dotted, (size_t)(dot - dotted), dot + 1)) return &hp_cfg_keys[i];
    return NULL;
}

/* "unknown key 'x'; did you mean 'y'?" or a list of the section's keys. `prefix` is
 * prepended to suggestions (the command line uses "--"). */
hp_status_t hp_cfg_unknown_key_error(const char *origin, const char *dotted, const char *prefix) {
    char best[160] = "";
    size_t best_d = (size_t)-1;
    char cand[160];
    for (size_t i = 0; i < hp_cfg_n_keys; i++) {
        for (int a = 0; a < 2; a++) {
            const char *name = a ? hp_cfg_keys[i].alias : hp_cfg_keys[i].key;
            if (!name) continue;
            snprintf(cand, sizeof cand, "%s.%s", hp_cfg_keys[i].section, name);
            size_t d = hp_edit_distance(dotted, cand);
            if (d < best_d) {
                best_d = d;
                snprintf(best, sizeof best, "%s", cand);
            }
        }
    }
    size_t len = strlen(dotted);
    size_t limit = len / 3 > 3 ? len / 3 : 3;
    if (best_d <= limit)
        return hp_error(HP_ERR_INVALID_ARG, "%s: unknown key '%s%s'; did you mean '%s%s'?", origin,
                        prefix, dotted, prefix, best);
    /* No close key: list the section's keys when the section exists, else the sections. */
    const char *dot = strchr(dotted, '.');
    size_t slen = dot ? (size_t)(dot - dotted) : len;
    char list[2048] = "";
    size_t used = 0;
    bool section_known = false;
    for (size_t i = 0; i < hp_cfg_n_keys; i++)
        if (strlen(hp_cfg_keys[i].section) == slen && strncmp(hp_cfg_keys[i].section, dotted, slen) == 0) {
            section_known = true;
            used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0, "%s%s",
                                     used ? ", " : "", hp_cfg_keys[i].key);
            if (used >= sizeof list) break;
        }
    if (!section_known) {
        used = 0;
        for (size_t i = 0; i < hp_cfg_n_keys; i++) {
            if (i > 0 && strcmp(hp_cfg_keys[i].section, hp_cfg_keys[i - 1].section) == 0) continue;
            used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0, "%s%s",
                                     used ? ", " : "", hp_cfg_keys[i].section);
            if (used >= sizeof list) break;
        }
        return hp_error(HP_ERR_INVALID_ARG,
                        "%s: unknown key '%s%s' (keys are section.key; sections: %s)", origin, prefix,
                        dotted, list);
    }
    return hp_error(HP_ERR_INVALID_ARG, "%s: unknown key '%s%s' (keys of section '%.*s': %s)", origin,
                    prefix, dotted, (int)slen, dotted, list);
}

bool hp_cfg_parse_bool(const char *s, bool *out) {
    static const char *yes[] = {"true", "yes", "on", "1"};
    static const char *no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) { *out = true; return true; }
        if (strcasecmp(s, no[i]) == 0) { *out = false; return true; }
    }
    return false;
}

bool hp_cfg_parse_int(const char *s, int64_t *out) {
    if (!*s) return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    while (*end == ' ') end++;
    if (errno || *end) return false;
    *out = v;
    return true;
}

bool hp_cfg_parse_float(const char *s, double *out) {
    if (!*s) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    while (*end == ' ') end++;
    if (errno || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

/* Writes `s` into a string field, or fails when too long. */
hp_status_t hp_cfg_copy_str(char *dst, const char *s, const char *origin, const hp_config_key_t *k) {
    size_t n = strlen(s);
    if (n >= HP_CONFIG_STR_MAX)
        return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s.%s': value of %zu bytes is longer than the %d-byte limit",
                        origin, k->section, k->key, n, HP_CONFIG_STR_MAX - 1);
    memcpy(dst, s, n + 1);
    return HP_OK;
}

/* Appends the items of a comma-separated list. */
static hp_status_t list_append_csv(hp_config_list_t *l, const char *s, const char *origin,
                                   const hp_config_key_t *k) {
    const char *p = s;
    while (*p) {
        while (*p == ' ') p++;
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n > 0 && p[n - 1] == ' ') n--;
        if (n > 0) {
            if (l->n >= HP_CONFIG_LIST_MAX)
                return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s.%s': more than %d items", origin, k->section,
                                k->key, HP_CONFIG_LIST_MAX);
            if (n >= HP_CONFIG_STR_MAX)
                return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s.%s': item longer than %d bytes", origin,
                                k->section, k->key, HP_CONFIG_STR_MAX - 1);
            memcpy(l->items[l->n], p, n);
            l->items[l->n][n] = '\0';
            l->n++;
        }
        if (!e) break;
        p = e + 1;
    }
    return HP_OK;
}

/* Why an integer key has its range, for the error message. */
const char *hp_cfg_range_hint(const hp_config_key_t *k) {
    if (k->hint) return k->hint;
    if (k->int_max == HP_MODEL_MAX_SEQ_LEN && strcmp(k->key, "seq_len") == 0)
        return "contexts longer than HP_MODEL_MAX_SEQ_LEN = 1048576 tokens are refused (the RoPE tables and "
               "activation arenas grow with it)";
    if (k->int_max == HP_MODEL_MAX_VOCAB) return "vocabularies above HP_MODEL_MAX_VOCAB = 2^24 ids are refused";
    if (k->int_max == DEG) return "parallel degrees are rank counts, at most 2^24";
    if (k->int_max == I32) return "the value is held in a 32-bit int";
    return NULL;
}

/* A model.* override given as -1 (the flavor's value): "-1", "-1.0", " -1 ". */
static bool is_unset_text(const hp_config_key_t *k, const char *text) {
    if (!k->flavor_default || !*text) return false;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    while (*end == ' ' || *end == '\t') end++;
    return errno == 0 && *end == '\0' && v == -1.0;
}

hp_status_t hp_cfg_set_from_text(hp_config_t *cfg, const hp_config_key_t *k, const char *text,
                                 const char *origin) {
    char *field = (char *)cfg + k->offset;
    switch (k->type) {
    case HP_CONFIG_INT: {
        int64_t v;
        char what[HP_CONFIG_STR_MAX + 160];
        snprintf(what, sizeof what, "%s: key '%s.%s'", origin, k->section, k->key);
        /* -1 keeps the flavor's value; any other value must be in the range */
        if (!is_unset_text(k, text)) HP_TRY(hp_parse_i64(what, text, k->int_min, k->int_max, hp_cfg_range_hint(k), &v));
        else v = -1;
        memcpy(field, &v, sizeof v);
        return HP_OK;
    }
    case HP_CONFIG_FLOAT: {
        double v;
        char what[HP_CONFIG_STR_MAX + 160];
        snprintf(what, sizeof what, "%s: key '%s.%s'", origin, k->section, k->key);
        if (!is_unset_text(k, text)) HP_TRY(hp_parse_f64(what, text, k->float_min, k->float_max, hp_cfg_range_hint(k), &v));
        else v = -1;
        if (k->f32) HP_TRY(hp_check_f32(what, v));
        memcpy(field, &v, sizeof v);
        return HP_OK;
    }
    case HP_CONFIG_BOOL: {
        bool v;
        if (!hp_cfg_parse_bool(text, &v))
            return hp_error(HP_ERR_INVALID_ARG,
                            "%s: key '%s.%s' expects a boolean (true/false, yes/no, on/off, 1/0), got '%s'",
                            origin, k->section, k->key, text);
        memcpy(field, &v, sizeof v);
        return HP_OK;
    }
    case HP_CONFIG_TRISTATE: {
        bool b;
        int v = -1;
        if (hp_cfg_parse_bool(text, &b)) v = b;
        else if (strcasecmp(text, "default") != 0 && strcmp(text, "-1") != 0)
            return hp_error(HP_ERR_INVALID_ARG,
                            "%s: key '%s.%s' expects a boolean (true/false, yes/no, on/off, 1/0) or default (the "
                            "flavor's value), got '%s'", origin, k->section, k->key, text);
        memcpy(field, &v, sizeof v);
        return HP_OK;
    }
    case HP_CONFIG_STRING: return hp_cfg_copy_str(field, text, origin, k);
    case HP_CONFIG_ENUM: {
        const char *p = k->choices;
        char best[64] = "";
        size_t best_d = (size_t)-1;
        while (*p) {
            const char *e = strchr(p, '|');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            char choice[64];
            snprintf(choice, sizeof choice, "%.*s", (int)n, p);
            if (strcasecmp(choice, text) == 0) return hp_cfg_copy_str(field, choice, origin, k);
            size_t d = hp_edit_distance(text, choice);
            if (d < best_d) {
                best_d = d;
                snprintf(best, sizeof best, "%s", choice);
            }
            if (!e) break;
            p = e + 1;
        }
        if (best_d <= 3)
            return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s.%s' expects one of %s, got '%s'; did you mean '%s'?",
                            origin, k->section, k->key, k->choices, text, best);
        return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s.%s' expects one of %s, got '%s'", origin, k->section,
                        k->key, k->choices, text);
    }
    case HP_CONFIG_LIST: {
        hp_config_list_t *l = (hp_config_list_t *)field;
        l->n = 0;
        /* "[a, b]" (flow style written on the command line) is accepted too. */
        size_t n = strlen(text);
        if (n >= 2 && text[0] == '[' && text[n - 1] == ']') {
            char tmp[HP_CONFIG_STR_MAX * 2];
            if (n - 2 >= sizeof tmp)
                return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s.%s': list text too long", origin, k->section,
                                k->key);
            memcpy(tmp, text + 1, n - 2);
            tmp[n - 2] = '\0';
            return list_append_csv(l, tmp, origin, k);
        }
        return list_append_csv(l, text, origin, k);
    }
    }
    return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s.%s': bad schema type", origin, k->section, k->key);
}

void hp_config_defaults(hp_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < hp_cfg_n_keys; i++) {
        hp_status_t s = hp_cfg_set_from_text(cfg, &hp_cfg_keys[i], hp_cfg_keys[i].default_value, "schema default");
        HP_ASSERT_MSG(s == HP_OK, "bad default for %s.%s: %s", hp_cfg_keys[i].section, hp_cfg_keys[i].key,
                      hp_last_error());
    }
}

hp_status_t hp_config_set(hp_config_t *cfg, const char *dotted, const char *value, const char *origin) {
    if (!cfg || !dotted || !value)
        return hp_error(HP_ERR_INVALID_ARG, "hp_config_set: NULL argument");
    const hp_config_key_t *k = hp_config_find_key(dotted);
    if (!k) return hp_cfg_unknown_key_error(origin ? origin : "config", dotted, "");
    return hp_cfg_set_from_text(cfg, k, value, origin ? origin : "config");
}
