/* The training configuration: schema table, YAML loading (libyaml document API), dotted
 * command-line overrides, validation, YAML printing and the Markdown reference table.
 * Every value is parsed through one function (set_from_text), so the file, the command
 * line and the defaults obey the same rules and produce the same messages. */
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"   /* the registry: flavors, model.flavor = hf (owner hf) */

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

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
#define I32 INT32_MAX
#define I64 INT64_MAX
#define DEG (1 << 24)   /* parallel degrees (parallel_dims.c narrows them to int) */

static const hp_config_key_t schema_[] = {
    /* job */
    K(job, dump_folder, STRING, "./outputs", NULL, NULL,
      "Folder for run outputs; relative checkpoint, TensorBoard and JSONL paths are placed under it."),
    K(job, description, STRING, "", NULL, NULL, "Free text describing the run (printed at start-up)."),
    K(job, print_config, BOOL, "true", NULL, NULL, "Print the resolved config (YAML) on rank 0 at start-up."),
    K(job, config_file, STRING, "", NULL, NULL,
      "The YAML file this config was read from (set by `--config FILE`; informational)."),
    /* model */
    K(model, name, STRING, "llama3", NULL, NULL, "Model family in the model registry (llama3, qwen3)."),
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
    /* --- mixture of experts (owner moe; docs/moe.md) --- */
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
    /* --- end --- */
    /* --- MLA attention (deepseek_v3; docs/moe.md) --- */
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
    /* --- end --- */
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
    K(training, dtype, ENUM, "float32", "float32|bfloat16", NULL, "Dtype of the parameters and optimizer state."),
    K(training, mixed_precision_param, ENUM, "bfloat16", "bfloat16|float32", NULL,
      "Dtype FSDP all-gathers parameters in (compute dtype) when mixed precision is on."),
    K(training, mixed_precision_reduce, ENUM, "float32", "float32|bfloat16", NULL,
      "Dtype FSDP reduces gradients in."),
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
    /* --- context parallel (owner cp) --- */
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
    /* --- end --- */
    /* activation_checkpoint */
    K(activation_checkpoint, mode, ENUM, "none", "none|full|selective", NULL,
      "Recompute activations in backward: none, every block (full) or selected blocks/ops (selective)."),
    K(activation_checkpoint, selective_ac_option, STRING, "2", NULL, NULL,
      "Selective mode: an integer k checkpoints every k-th transformer block; \"op\" (op-level SAC) is not implemented yet."),
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
      "Peak FLOP/s per rank for MFU; 0 = measure a float32 GEMM at start-up; -1 = do not report MFU."),
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
    K(data, format, ENUM, "auto", "auto|text|jsonl|bin", NULL,
      "File format; auto picks by extension (.jsonl/.json = jsonl, .bin = bin, otherwise text)."),
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
    /* tokenizer */
    K(tokenizer, path, STRING, "", NULL, NULL,
      "HF tokenizer.json file; empty = train one from the data at first run and cache it under job.dump_folder."),
    KI(tokenizer, vocab_size, "2048", 1, HP_MODEL_MAX_VOCAB, NULL,
      "Vocabulary size of a tokenizer trained at first run (ignored when path is set)."),
};

#define SCHEMA_N (sizeof(schema_) / sizeof(schema_[0]))

const hp_config_key_t *hp_config_schema(size_t *count) {
    if (count) *count = SCHEMA_N;
    return schema_;
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

static const char *type_words(hp_config_type_t type) {
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
    for (size_t i = 0; i < SCHEMA_N; i++)
        if (key_matches(&schema_[i], dotted, (size_t)(dot - dotted), dot + 1)) return &schema_[i];
    return NULL;
}

/* "unknown key 'x'; did you mean 'y'?" or a list of the section's keys. `prefix` is
 * prepended to suggestions (the command line uses "--"). */
static hp_status_t unknown_key_error(const char *origin, const char *dotted, const char *prefix) {
    char best[160] = "";
    size_t best_d = (size_t)-1;
    char cand[160];
    for (size_t i = 0; i < SCHEMA_N; i++) {
        for (int a = 0; a < 2; a++) {
            const char *name = a ? schema_[i].alias : schema_[i].key;
            if (!name) continue;
            snprintf(cand, sizeof cand, "%s.%s", schema_[i].section, name);
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
    for (size_t i = 0; i < SCHEMA_N; i++)
        if (strlen(schema_[i].section) == slen && strncmp(schema_[i].section, dotted, slen) == 0) {
            section_known = true;
            used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0, "%s%s",
                                     used ? ", " : "", schema_[i].key);
            if (used >= sizeof list) break;
        }
    if (!section_known) {
        used = 0;
        for (size_t i = 0; i < SCHEMA_N; i++) {
            if (i > 0 && strcmp(schema_[i].section, schema_[i - 1].section) == 0) continue;
            used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0, "%s%s",
                                     used ? ", " : "", schema_[i].section);
            if (used >= sizeof list) break;
        }
        return hp_error(HP_ERR_INVALID_ARG,
                        "%s: unknown key '%s%s' (keys are section.key; sections: %s)", origin, prefix,
                        dotted, list);
    }
    return hp_error(HP_ERR_INVALID_ARG, "%s: unknown key '%s%s' (keys of section '%.*s': %s)", origin,
                    prefix, dotted, (int)slen, dotted, list);
}

static bool parse_bool(const char *s, bool *out) {
    static const char *yes[] = {"true", "yes", "on", "1"};
    static const char *no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) { *out = true; return true; }
        if (strcasecmp(s, no[i]) == 0) { *out = false; return true; }
    }
    return false;
}

static bool parse_int(const char *s, int64_t *out) {
    if (!*s) return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    while (*end == ' ') end++;
    if (errno || *end) return false;
    *out = v;
    return true;
}

static bool parse_float(const char *s, double *out) {
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
static hp_status_t copy_str(char *dst, const char *s, const char *origin, const hp_config_key_t *k) {
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
static const char *range_hint(const hp_config_key_t *k) {
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

static hp_status_t set_from_text(hp_config_t *cfg, const hp_config_key_t *k, const char *text,
                                 const char *origin) {
    char *field = (char *)cfg + k->offset;
    switch (k->type) {
    case HP_CONFIG_INT: {
        int64_t v;
        char what[HP_CONFIG_STR_MAX + 160];
        snprintf(what, sizeof what, "%s: key '%s.%s'", origin, k->section, k->key);
        /* -1 keeps the flavor's value; any other value must be in the range */
        if (!is_unset_text(k, text)) HP_TRY(hp_parse_i64(what, text, k->int_min, k->int_max, range_hint(k), &v));
        else v = -1;
        memcpy(field, &v, sizeof v);
        return HP_OK;
    }
    case HP_CONFIG_FLOAT: {
        double v;
        char what[HP_CONFIG_STR_MAX + 160];
        snprintf(what, sizeof what, "%s: key '%s.%s'", origin, k->section, k->key);
        if (!is_unset_text(k, text)) HP_TRY(hp_parse_f64(what, text, k->float_min, k->float_max, range_hint(k), &v));
        else v = -1;
        if (k->f32) HP_TRY(hp_check_f32(what, v));
        memcpy(field, &v, sizeof v);
        return HP_OK;
    }
    case HP_CONFIG_BOOL: {
        bool v;
        if (!parse_bool(text, &v))
            return hp_error(HP_ERR_INVALID_ARG,
                            "%s: key '%s.%s' expects a boolean (true/false, yes/no, on/off, 1/0), got '%s'",
                            origin, k->section, k->key, text);
        memcpy(field, &v, sizeof v);
        return HP_OK;
    }
    case HP_CONFIG_TRISTATE: {
        bool b;
        int v = -1;
        if (parse_bool(text, &b)) v = b;
        else if (strcasecmp(text, "default") != 0 && strcmp(text, "-1") != 0)
            return hp_error(HP_ERR_INVALID_ARG,
                            "%s: key '%s.%s' expects a boolean (true/false, yes/no, on/off, 1/0) or default (the "
                            "flavor's value), got '%s'", origin, k->section, k->key, text);
        memcpy(field, &v, sizeof v);
        return HP_OK;
    }
    case HP_CONFIG_STRING: return copy_str(field, text, origin, k);
    case HP_CONFIG_ENUM: {
        const char *p = k->choices;
        char best[64] = "";
        size_t best_d = (size_t)-1;
        while (*p) {
            const char *e = strchr(p, '|');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            char choice[64];
            snprintf(choice, sizeof choice, "%.*s", (int)n, p);
            if (strcasecmp(choice, text) == 0) return copy_str(field, choice, origin, k);
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
    for (size_t i = 0; i < SCHEMA_N; i++) {
        hp_status_t s = set_from_text(cfg, &schema_[i], schema_[i].default_value, "schema default");
        HP_ASSERT_MSG(s == HP_OK, "bad default for %s.%s: %s", schema_[i].section, schema_[i].key,
                      hp_last_error());
    }
}

hp_status_t hp_config_set(hp_config_t *cfg, const char *dotted, const char *value, const char *origin) {
    if (!cfg || !dotted || !value)
        return hp_error(HP_ERR_INVALID_ARG, "hp_config_set: NULL argument");
    const hp_config_key_t *k = hp_config_find_key(dotted);
    if (!k) return unknown_key_error(origin ? origin : "config", dotted, "");
    return set_from_text(cfg, k, value, origin ? origin : "config");
}

/* ---- YAML ------------------------------------------------------------------------------ */

static const char *node_kind(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_MAPPING_NODE: return "a mapping";
    case YAML_SEQUENCE_NODE: return "a list";
    default: return "a scalar";
    }
}

static bool is_null_scalar(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || strcmp(v, "~") == 0 || strcasecmp(v, "null") == 0;
}

/* Applies one `key: value` pair whose dotted name is known. */
static hp_status_t apply_yaml_value(hp_config_t *cfg, yaml_document_t *doc, const char *path, const char *dotted,
                                    const yaml_node_t *key_node, yaml_node_t *val, size_t *seen_line) {
    char origin[HP_CONFIG_STR_MAX + 32];
    snprintf(origin, sizeof origin, "%s:%zu", path, key_node->start_mark.line + 1);
    const hp_config_key_t *k = hp_config_find_key(dotted);
    if (!k) return unknown_key_error(origin, dotted, "");
    /* A key given twice (also through an alias) is an error rather than "last one wins". */
    size_t row = (size_t)(k - schema_);
    if (seen_line[row])
        return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s.%s' is given twice (first at line %zu)", origin, k->section,
                        k->key, seen_line[row]);
    seen_line[row] = key_node->start_mark.line + 1;
    if (k->type == HP_CONFIG_LIST) {
        hp_config_list_t *l = (hp_config_list_t *)((char *)cfg + k->offset);
        if (val->type == YAML_SEQUENCE_NODE) {
            l->n = 0;
            for (yaml_node_item_t *it = val->data.sequence.items.start; it < val->data.sequence.items.top; it++) {
                yaml_node_t *item = yaml_document_get_node(doc, *it);
                if (!item || item->type != YAML_SCALAR_NODE)
                    return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s' expects a list of strings, got an item that is %s",
                                    origin, dotted, item ? node_kind(item) : "empty");
                if (l->n >= HP_CONFIG_LIST_MAX)
                    return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s': more than %d items", origin, dotted,
                                    HP_CONFIG_LIST_MAX);
                HP_TRY(copy_str(l->items[l->n], (const char *)item->data.scalar.value, origin, k));
                l->n++;
            }
            return HP_OK;
        }
        if (is_null_scalar(val)) {
            l->n = 0;
            return HP_OK;
        }
    }
    if (val->type != YAML_SCALAR_NODE) {
        if (k->type == HP_CONFIG_ENUM)
            return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s' expects one of %s, got %s", origin, dotted, k->choices,
                            node_kind(val));
        return hp_error(HP_ERR_INVALID_ARG, "%s: key '%s' expects %s, got %s", origin, dotted, type_words(k->type),
                        node_kind(val));
    }
    const char *text = (const char *)val->data.scalar.value;
    if (k->type == HP_CONFIG_STRING && is_null_scalar(val)) text = "";
    return set_from_text(cfg, k, text, origin);
}

static hp_status_t apply_yaml(hp_config_t *cfg, yaml_document_t *doc, const char *path) {
    size_t seen_line[SCHEMA_N] = {0};
    yaml_node_t *root = yaml_document_get_root_node(doc);
    if (!root || is_null_scalar(root)) return HP_OK;   /* empty file: nothing to set */
    if (root->type != YAML_MAPPING_NODE)
        return hp_error(HP_ERR_FORMAT, "%s:%zu: expected a mapping of sections (e.g. 'training:'), got %s", path,
                        root->start_mark.line + 1, node_kind(root));
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(doc, p->value);
        if (kn->type != YAML_SCALAR_NODE)
            return hp_error(HP_ERR_FORMAT, "%s:%zu: a section name must be a scalar", path, kn->start_mark.line + 1);
        const char *section = (const char *)kn->data.scalar.value;
        if (strchr(section, '.')) {   /* flat "training.steps: 20" is accepted too */
            HP_TRY(apply_yaml_value(cfg, doc, path, section, kn, vn, seen_line));
            continue;
        }
        if (is_null_scalar(vn)) continue;   /* "training:" with nothing below */
        bool known = false;
        for (size_t i = 0; i < SCHEMA_N; i++) known |= strcmp(schema_[i].section, section) == 0;
        if (!known && vn->type == YAML_MAPPING_NODE && vn->data.mapping.pairs.start < vn->data.mapping.pairs.top) {
            /* Name the section's line and its first key: "trainig.steps" -> "training.steps". */
            yaml_node_t *k2 = yaml_document_get_node(doc, vn->data.mapping.pairs.start->key);
            char dotted[256], origin[HP_CONFIG_STR_MAX + 32];
            snprintf(dotted, sizeof dotted, "%s.%s", section,
                     k2->type == YAML_SCALAR_NODE ? (const char *)k2->data.scalar.value : "?");
            snprintf(origin, sizeof origin, "%s:%zu", path, kn->start_mark.line + 1);
            return unknown_key_error(origin, dotted, "");
        }
        if (vn->type != YAML_MAPPING_NODE) {
            if (!known) {
                char origin[HP_CONFIG_STR_MAX + 32];
                snprintf(origin, sizeof origin, "%s:%zu", path, kn->start_mark.line + 1);
                return unknown_key_error(origin, section, "");
            }
            return hp_error(HP_ERR_INVALID_ARG, "%s:%zu: section '%s' must be a mapping of keys, got %s", path,
                            kn->start_mark.line + 1, section, node_kind(vn));
        }
        for (yaml_node_pair_t *q = vn->data.mapping.pairs.start; q < vn->data.mapping.pairs.top; q++) {
            yaml_node_t *k2 = yaml_document_get_node(doc, q->key);
            yaml_node_t *v2 = yaml_document_get_node(doc, q->value);
            if (k2->type != YAML_SCALAR_NODE)
                return hp_error(HP_ERR_FORMAT, "%s:%zu: a key must be a scalar", path, k2->start_mark.line + 1);
            char dotted[256];
            snprintf(dotted, sizeof dotted, "%s.%s", section, (const char *)k2->data.scalar.value);
            HP_TRY(apply_yaml_value(cfg, doc, path, dotted, k2, v2, seen_line));
        }
    }
    return HP_OK;
}

hp_status_t hp_config_load_file(hp_config_t *cfg, const char *path) {
    if (!cfg || !path) return hp_error(HP_ERR_INVALID_ARG, "hp_config_load_file: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f)
        return hp_error(HP_ERR_IO, "config file '%s': cannot open (%s); hint: check the --config path", path,
                        strerror(errno));
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return hp_error(HP_ERR_OOM, "config file '%s': cannot initialise the YAML parser", path);
    }
    yaml_parser_set_input_file(&parser, f);
    hp_status_t st = HP_OK;
    if (!yaml_parser_load(&parser, &doc)) {
        st = hp_error(HP_ERR_FORMAT, "%s:%zu:%zu: YAML syntax error: %s%s%s", path, parser.problem_mark.line + 1,
                      parser.problem_mark.column + 1, parser.problem ? parser.problem : "unknown",
                      parser.context ? " " : "", parser.context ? parser.context : "");
    } else {
        st = apply_yaml(cfg, &doc, path);
        yaml_document_delete(&doc);
        /* A second document after '---' would be silently ignored: refuse it. */
        yaml_document_t doc2;
        if (st == HP_OK && !yaml_parser_load(&parser, &doc2)) {
            st = hp_error(HP_ERR_FORMAT, "%s:%zu:%zu: YAML syntax error: %s%s%s", path, parser.problem_mark.line + 1,
                          parser.problem_mark.column + 1, parser.problem ? parser.problem : "unknown",
                          parser.context ? " " : "", parser.context ? parser.context : "");
        } else if (st == HP_OK) {
            if (yaml_document_get_root_node(&doc2))
                st = hp_error(HP_ERR_FORMAT,
                              "%s:%zu: a second YAML document starts here ('---'); a config file holds one "
                              "document; hint: merge it into the first or pass it as its own --config file",
                              path, doc2.start_mark.line + 1);
            yaml_document_delete(&doc2);
        }
        if (st == HP_OK) st = copy_str(cfg->job.config_file, path, path, hp_config_find_key("job.config_file"));
    }
    yaml_parser_delete(&parser);
    fclose(f);
    return st;
}

/* ---- command line -------------------------------------------------------------------- */

hp_status_t hp_config_parse_args(hp_config_t *cfg, int argc, char **argv, char **rest, int *nrest) {
    if (!cfg) return hp_error(HP_ERR_INVALID_ARG, "hp_config_parse_args: NULL config");
    if (nrest) *nrest = 0;
    hp_config_defaults(cfg);
    /* The file first (wherever --config appears), so the command line overrides it. */
    const char *file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0 || strcmp(a, "--job.config_file") == 0) {
            if (i + 1 >= argc)
                return hp_error(HP_ERR_INVALID_ARG, "command line: %s needs a file name (--config FILE.yaml)", a);
            file = argv[++i];
        } else if (strncmp(a, "--config=", 9) == 0) {
            file = a + 9;
        } else if (strncmp(a, "--job.config_file=", 18) == 0) {
            file = a + 18;
        }
    }
    if (file) HP_TRY(hp_config_load_file(cfg, file));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0 || strcmp(a, "--job.config_file") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0 || strncmp(a, "--job.config_file=", 18) == 0) continue;
        const char *eq = strchr(a, '=');
        size_t namelen = eq ? (size_t)(eq - a) : strlen(a);
        bool dotted = strncmp(a, "--", 2) == 0 && memchr(a + 2, '.', namelen - 2) != NULL;
        if (!dotted) {
            if (rest) rest[*nrest] = argv[i];
            if (nrest) (*nrest)++;
            continue;
        }
        char name[256];
        if (namelen - 2 >= sizeof name)
            return hp_error(HP_ERR_INVALID_ARG, "command line: option '%.40s...' is too long", a);
        memcpy(name, a + 2, namelen - 2);
        name[namelen - 2] = '\0';
        const hp_config_key_t *k = hp_config_find_key(name);
        if (!k) return unknown_key_error("command line", name, "--");
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if ((k->type == HP_CONFIG_BOOL || k->type == HP_CONFIG_TRISTATE) &&
                   (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
            value = "true";   /* a bare boolean flag: --checkpoint.enable */
        } else {
            if (i + 1 >= argc)
                return hp_error(HP_ERR_INVALID_ARG, "command line: option '--%s' needs a value (--%s=VALUE)", name,
                                name);
            value = argv[++i];
        }
        HP_TRY(set_from_text(cfg, k, value, "command line"));
    }
    return HP_OK;
}

/* ---- checks ------------------------------------------------------------------------------ */

static hp_status_t check_model_keys(const hp_config_t *c);

hp_status_t hp_config_validate(const hp_config_t *c) {
#define REQUIRE(cond, key, fmt, ...)                                                               \
    do {                                                                                           \
        if (!(cond)) return hp_error(HP_ERR_INVALID_ARG, "config key '" key "': " fmt, __VA_ARGS__); \
    } while (0)
    REQUIRE(c->training.steps >= 1, "training.steps", "must be >= 1, got %lld", (long long)c->training.steps);
    REQUIRE(c->training.seq_len >= 1, "training.seq_len", "must be >= 1, got %lld", (long long)c->training.seq_len);
    REQUIRE(c->training.local_batch_size >= 1, "training.local_batch_size", "must be >= 1, got %lld",
            (long long)c->training.local_batch_size);
    REQUIRE(c->training.global_batch_size == -1 || c->training.global_batch_size >= 1, "training.global_batch_size",
            "must be -1 (= local x dp) or >= 1, got %lld", (long long)c->training.global_batch_size);
    REQUIRE(c->training.max_norm >= 0, "training.max_norm", "must be >= 0 (0 disables clipping), got %g",
            c->training.max_norm);
    REQUIRE(c->optimizer.lr >= 0, "optimizer.lr", "must be >= 0, got %g", c->optimizer.lr);
    REQUIRE(c->optimizer.beta1 >= 0 && c->optimizer.beta1 < 1, "optimizer.beta1", "must be in [0, 1), got %g",
            c->optimizer.beta1);
    REQUIRE(c->optimizer.beta2 >= 0 && c->optimizer.beta2 < 1, "optimizer.beta2", "must be in [0, 1), got %g",
            c->optimizer.beta2);
    REQUIRE(c->optimizer.eps > 0, "optimizer.eps", "must be > 0, got %g", c->optimizer.eps);
    REQUIRE(c->optimizer.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0, got %g",
            c->optimizer.weight_decay);
    REQUIRE(c->optimizer.momentum >= 0 && c->optimizer.momentum < 1, "optimizer.momentum",
            "must be in [0, 1), got %g", c->optimizer.momentum);
    REQUIRE(c->lr_scheduler.warmup_steps >= 0, "lr_scheduler.warmup_steps", "must be >= 0, got %lld",
            (long long)c->lr_scheduler.warmup_steps);
    REQUIRE(c->lr_scheduler.decay_ratio == -1 || (c->lr_scheduler.decay_ratio >= 0 && c->lr_scheduler.decay_ratio <= 1),
            "lr_scheduler.decay_ratio", "must be -1 (None) or in [0, 1], got %g", c->lr_scheduler.decay_ratio);
    REQUIRE(c->lr_scheduler.min_lr_factor >= 0 && c->lr_scheduler.min_lr_factor <= 1, "lr_scheduler.min_lr_factor",
            "must be in [0, 1], got %g", c->lr_scheduler.min_lr_factor);
    REQUIRE(c->checkpoint.interval >= 1, "checkpoint.interval", "must be >= 1, got %lld",
            (long long)c->checkpoint.interval);
    REQUIRE(c->checkpoint.keep_latest_k == 0 || c->checkpoint.keep_latest_k >= 2, "checkpoint.keep_latest_k",
            "must be 0 (keep all) or >= 2 (1 could delete the only good checkpoint mid-save), got %lld",
            (long long)c->checkpoint.keep_latest_k);
    REQUIRE(c->metrics.log_freq >= 1, "metrics.log_freq", "must be >= 1, got %lld", (long long)c->metrics.log_freq);
    REQUIRE(c->metrics.peak_flops >= 0 || c->metrics.peak_flops == -1, "metrics.peak_flops",
            "must be > 0, 0 (measure) or -1 (no MFU), got %g", c->metrics.peak_flops);
    REQUIRE(c->validation.freq >= 1, "validation.freq", "must be >= 1, got %lld", (long long)c->validation.freq);
    REQUIRE(c->validation.steps == -1 || c->validation.steps >= 1, "validation.steps",
            "must be -1 (whole split) or >= 1, got %lld", (long long)c->validation.steps);
    REQUIRE(c->validation.local_batch_size == -1 || c->validation.local_batch_size >= 1,
            "validation.local_batch_size", "must be -1 or >= 1, got %lld", (long long)c->validation.local_batch_size);
    REQUIRE(c->data.validation_fraction >= 0 && c->data.validation_fraction < 1, "data.validation_fraction",
            "must be in [0, 1), got %g", c->data.validation_fraction);
    REQUIRE(!c->validation.enable || c->data.validation_fraction > 0, "validation.enable",
            "needs a validation split; set data.validation_fraction > 0 (e.g. %g)", 0.05);
    REQUIRE(c->tokenizer.vocab_size >= 1, "tokenizer.vocab_size", "must be >= 1, got %lld",
            (long long)c->tokenizer.vocab_size);
    REQUIRE(c->optimizer.lr > 0, "optimizer.lr", "must be > 0 (0 trains nothing), got %g", c->optimizer.lr);
#undef REQUIRE
    /* The schema's ranges and float32 checks once more, for values set directly in the struct. */
    for (size_t i = 0; i < SCHEMA_N; i++) {
        const hp_config_key_t *k = &schema_[i];
        const char *field = (const char *)c + k->offset;
        char what[160];
        snprintf(what, sizeof what, "config key '%s.%s'", k->section, k->key);
        if (k->type == HP_CONFIG_INT) {
            int64_t v;
            memcpy(&v, field, sizeof v);
            if (!(k->flavor_default && v == -1)) HP_TRY(hp_check_i64(what, v, k->int_min, k->int_max, range_hint(k)));
        } else if (k->type == HP_CONFIG_FLOAT) {
            double v;
            memcpy(&v, field, sizeof v);
            if (k->flavor_default && v == -1) continue;
            if (!(v >= k->float_min && v <= k->float_max))
                return hp_error(HP_ERR_INVALID_ARG, "%s = %g is out of range: expected a number in [%g, %g]%s%s", what,
                                v, k->float_min, k->float_max, range_hint(k) ? "; hint: " : "",
                                range_hint(k) ? range_hint(k) : "");
            if (k->f32) HP_TRY(hp_check_f32(what, v));
        } else if (k->type == HP_CONFIG_TRISTATE) {
            int v;
            memcpy(&v, field, sizeof v);
            if (v < -1 || v > 1)
                return hp_error(HP_ERR_INVALID_ARG, "%s = %d: expected -1 (default), 0 (false) or 1 (true)", what, v);
        }
    }
    return check_model_keys(c);
}

hp_status_t hp_config_grad_accum_steps(const hp_config_t *cfg, int64_t dp_degree, int64_t *out) {
    if (dp_degree < 1) return hp_error(HP_ERR_INVALID_ARG, "grad accumulation: dp degree must be >= 1, got %lld",
                                       (long long)dp_degree);
    int64_t per_step = cfg->training.local_batch_size * dp_degree;
    int64_t global = cfg->training.global_batch_size;
    if (global == -1) {
        *out = 1;
        return HP_OK;
    }
    if (global < per_step || global % per_step != 0)
        return hp_error(HP_ERR_INVALID_ARG,
                        "config key 'training.global_batch_size' = %lld is not a multiple of local_batch_size (%lld) "
                        "x dp degree (%lld) = %lld; hint: use a multiple of %lld or -1",
                        (long long)global, (long long)cfg->training.local_batch_size, (long long)dp_degree,
                        (long long)per_step, (long long)per_step);
    *out = global / per_step;
    return HP_OK;
}

/* ---- printing ------------------------------------------------------------------------- */

static void format_float(double v, char *buf, size_t n) {
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    /* Keep a float looking like a float in YAML ("1" -> "1.0"). */
    if (!strpbrk(buf, ".eEn") && strlen(buf) + 3 < n) strcat(buf, ".0");
}

/* YAML-quotes a string when plain style would change its meaning. */
static void format_string(const char *s, char *buf, size_t n) {
    bool plain = *s != '\0';
    bool b;
    int64_t i;
    double d;
    if (plain && (parse_bool(s, &b) || parse_int(s, &i) || parse_float(s, &d) || strcasecmp(s, "null") == 0 ||
                  strcmp(s, "~") == 0))
        plain = false;
    if (plain && (strchr("-?:,[]{}#&*!|>'\"%@` ", s[0]) || s[strlen(s) - 1] == ' ')) plain = false;
    if (plain && (strstr(s, ": ") || strstr(s, " #"))) plain = false;
    for (const char *p = s; plain && *p; p++)
        if ((unsigned char)*p < 0x20) plain = false;
    if (plain) {
        snprintf(buf, n, "%s", s);
        return;
    }
    size_t o = 0;
    if (o + 1 < n) buf[o++] = '"';
    for (const char *p = s; *p && o + 4 < n; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else if (c == '\n') {
            buf[o++] = '\\';
            buf[o++] = 'n';
        } else if (c == '\t') {
            buf[o++] = '\\';
            buf[o++] = 't';
        } else if (c < 0x20) {
            o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
        } else {
            buf[o++] = (char)c;
        }
    }
    if (o + 1 < n) buf[o++] = '"';
    buf[o < n ? o : n - 1] = '\0';
}

static void format_value(const hp_config_t *cfg, const hp_config_key_t *k, char *buf, size_t n) {
    const char *field = (const char *)cfg + k->offset;
    switch (k->type) {
    case HP_CONFIG_INT: {
        int64_t v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "%lld", (long long)v);
        break;
    }
    case HP_CONFIG_FLOAT: {
        double v;
        memcpy(&v, field, sizeof v);
        format_float(v, buf, n);
        break;
    }
    case HP_CONFIG_BOOL: {
        bool v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "%s", v ? "true" : "false");
        break;
    }
    case HP_CONFIG_TRISTATE: {
        int v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "%s", v < 0 ? "default" : v ? "true" : "false");
        break;
    }
    case HP_CONFIG_STRING:
    case HP_CONFIG_ENUM: format_string(field, buf, n); break;
    case HP_CONFIG_LIST: {
        const hp_config_list_t *l = (const hp_config_list_t *)field;
        size_t o = (size_t)snprintf(buf, n, "[");
        for (int i = 0; i < l->n && o < n; i++) {
            char item[HP_CONFIG_STR_MAX * 2];
            format_string(l->items[i], item, sizeof item);
            o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? ", " : "", item);
        }
        if (o < n) snprintf(buf + o, n - o, "]");
        break;
    }
    }
}

hp_status_t hp_config_get_string(const hp_config_t *cfg, const char *dotted, char *buf, size_t n) {
    const hp_config_key_t *k = hp_config_find_key(dotted);
    if (!k) return unknown_key_error("hp_config_get_string", dotted, "");
    format_value(cfg, k, buf, n);
    return HP_OK;
}

void hp_config_print(const hp_config_t *cfg, FILE *f) {
    char buf[HP_CONFIG_STR_MAX * HP_CONFIG_LIST_MAX * 2];
    for (size_t i = 0; i < SCHEMA_N; i++) {
        if (i == 0 || strcmp(schema_[i].section, schema_[i - 1].section) != 0)
            fprintf(f, "%s:\n", schema_[i].section);
        format_value(cfg, &schema_[i], buf, sizeof buf);
        fprintf(f, "  %s: %s\n", schema_[i].key, buf);
    }
}

void hp_config_write_markdown(FILE *f) {
    for (size_t i = 0; i < SCHEMA_N; i++) {
        const hp_config_key_t *k = &schema_[i];
        if (i == 0 || strcmp(k->section, schema_[i - 1].section) != 0) {
            fprintf(f, "%s### %s\n\n", i ? "\n" : "", k->section);
            fprintf(f, "| key | type | default | meaning |\n|---|---|---|---|\n");
        }
        char type[512];
        if (k->type == HP_CONFIG_ENUM) {
            size_t o = (size_t)snprintf(type, sizeof type, "enum: ");
            for (const char *p = k->choices; *p && o + 8 < sizeof type; p++) {
                if (*p == '|') {
                    type[o++] = ',';
                    type[o++] = ' ';
                } else {
                    type[o++] = *p;
                }
            }
            type[o] = '\0';
        } else if (k->type == HP_CONFIG_INT && (k->int_min != INT64_MIN || k->int_max != INT64_MAX)) {
            char lo[32], hi[32];
            snprintf(lo, sizeof lo, "%lld", (long long)k->int_min);
            if (k->int_max == I64) snprintf(hi, sizeof hi, "2^63-1");
            else if (k->int_max == I32) snprintf(hi, sizeof hi, "2^31-1");
            else if (k->int_max == HP_MODEL_MAX_SEQ_LEN) snprintf(hi, sizeof hi, "2^20");
            else if (k->int_max == HP_MODEL_MAX_VOCAB || k->int_max == DEG) snprintf(hi, sizeof hi, "2^24");
            else snprintf(hi, sizeof hi, "%lld", (long long)k->int_max);
            snprintf(type, sizeof type, "int in [%s, %s]%s", lo, hi, k->flavor_default ? " or -1" : "");
        } else if (k->type == HP_CONFIG_FLOAT && isfinite(k->float_min)) {
            char lo[32], hi[32];
            if (k->float_min == FLT_MIN) snprintf(lo, sizeof lo, "(0");   /* > 0, and normal in float32 */
            else snprintf(lo, sizeof lo, "[%g", k->float_min);
            if (k->float_max == FLT_MAX) snprintf(hi, sizeof hi, "3.4e38]");
            else snprintf(hi, sizeof hi, "%g]", k->float_max);
            snprintf(type, sizeof type, "float in %s, %s%s%s", lo, hi, k->flavor_default ? " or -1" : "",
                     k->f32 ? " (used in float32)" : "");
        } else if (k->type == HP_CONFIG_FLOAT && k->f32) {
            snprintf(type, sizeof type, "float (used in float32)");
        } else {
            snprintf(type, sizeof type, "%s", hp_config_type_name(k->type));
        }
        const char *def = k->default_value;
        fprintf(f, "| `%s.%s` | %s | %s%s%s | %s", k->section, k->key, type, *def ? "`" : "",
                *def ? def : (k->type == HP_CONFIG_LIST ? "`[]`" : "`\"\"`"), *def ? "`" : "", k->doc);
        if (k->alias) fprintf(f, " Alias: `%s.%s`.", k->section, k->alias);
        fprintf(f, " |\n");
    }
}

/* ---- model: the flavor plus the model.* overrides ----------------------------------------- */

/* The keys that override a flavor field, in schema order. */
static bool model_key_set(const hp_config_t *c, const hp_config_key_t *k) {
    if (!k->flavor_default) return false;
    const char *field = (const char *)c + k->offset;
    if (k->type == HP_CONFIG_INT) {
        int64_t v;
        memcpy(&v, field, sizeof v);
        return v != -1;
    }
    if (k->type == HP_CONFIG_FLOAT) {
        double v;
        memcpy(&v, field, sizeof v);
        return v != -1;
    }
    int v;
    memcpy(&v, field, sizeof v);
    return v != -1;
}

void hp_config_model_overrides(const hp_config_t *c, char *buf, size_t n) {
    if (!n) return;
    buf[0] = '\0';
    size_t o = 0;
    for (size_t i = 0; i < SCHEMA_N && o < n; i++) {
        if (!model_key_set(c, &schema_[i])) continue;
        char v[64];
        format_value(c, &schema_[i], v, sizeof v);
        o += (size_t)snprintf(buf + o, n - o, "%smodel.%s=%s", o ? " " : "", schema_[i].key, v);
    }
}

void hp_config_describe_model(const hp_model_config_t *mc, char *buf, size_t n) {
    int o = snprintf(buf, n, "dim %d, n_layers %d, n_heads %d, n_kv_heads %d, head_dim %d, hidden_dim %d, vocab_size %d, "
                     "norm_eps %g, rope_theta %g, rope_scaling ", mc->dim, mc->n_layers, mc->n_heads, mc->n_kv_heads,
                     mc->head_dim, mc->hidden_dim, mc->vocab_size, mc->norm_eps, mc->rope_theta);
    if (o < 0 || (size_t)o >= n) return;
    if (mc->rope_scaling)
        o += snprintf(buf + o, n - (size_t)o, "true (factor %g, low %g, high %g, original %d)", mc->rope_factor,
                      mc->rope_low_freq_factor, mc->rope_high_freq_factor, mc->rope_original_max_pos);
    else
        o += snprintf(buf + o, n - (size_t)o, "false");
    if (o < 0 || (size_t)o >= n) return;
    o += snprintf(buf + o, n - (size_t)o, ", qk_norm %s, tie_embeddings %s, max_seq_len %d", mc->qk_norm ? "true" : "false",
                  mc->tie_embeddings ? "true" : "false", mc->max_seq_len);
    if (o >= 0 && (size_t)o < n && mc->mla)   /* MLA: head_dim above is the core's padded width */
        o += snprintf(buf + o, n - (size_t)o, ", MLA: q_lora_rank %d, kv_lora_rank %d, qk_nope %d + qk_rope %d, v_head %d, "
                      "YaRN %s (factor %g, mscale %g, original %d)", mc->q_lora_rank, mc->kv_lora_rank,
                      mc->qk_nope_head_dim, mc->qk_rope_head_dim, mc->v_head_dim, hp_model_mla_yarn(mc) ? "on" : "off",
                      mc->rope_factor, mc->mla_mscale, mc->rope_original_max_pos);
    if (o < 0 || (size_t)o >= n || mc->moe_experts == 0) return;   /* mixture of experts (owner moe) */
    snprintf(buf + o, n - (size_t)o, ", moe: %d experts top-%d hidden %d, %d shared, %s%s, route_scale %g, %d dense "
             "layers, load_balance_coeff %g", mc->moe_experts, mc->moe_top_k, mc->moe_hidden, mc->moe_shared_experts,
             mc->moe_score_fn == HP_MOE_SCORE_SIGMOID ? "sigmoid" : "softmax", mc->moe_route_norm ? " route_norm" : "",
             mc->moe_route_scale, mc->moe_n_dense_layers, mc->moe_load_balance_coeff);
}

/* "" when the value came from a model.* key, " (the flavor's)" when from the flavor. */
static const char *from_flavor(double key_value) { return key_value == -1 ? " (the flavor's)" : ""; }

/* Divisors of n, "1, 2, 3, 6", for hints. */
static void divisors(int n, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = '\0';
    for (int d = 1; d <= n && o + 16 < cap; d++)
        if (n % d == 0) o += (size_t)snprintf(buf + o, cap - o, "%s%d", o ? ", " : "", d);
}

static hp_status_t check_heads(const char *origin, int n_heads, double key_h, int n_kv, double key_kv) {
    if (n_kv > 0 && n_heads % n_kv == 0) return HP_OK;
    char ok[256];
    divisors(n_heads, ok, sizeof ok);
    return hp_error(HP_ERR_INVALID_ARG, "%s 'model.n_heads' = %d%s is not a multiple of model.n_kv_heads = %d%s: "
                    "grouped-query attention shares each KV head among n_heads / n_kv_heads query heads; hint: set "
                    "model.n_kv_heads to a divisor of %d (%s)", origin, n_heads, from_flavor(key_h), n_kv,
                    from_flavor(key_kv), n_heads, ok);
}

static hp_status_t check_head_dim(const char *origin, int head_dim) {
    if (head_dim % 2 == 0) return HP_OK;
    return hp_error(HP_ERR_INVALID_ARG, "%s 'model.head_dim' = %d must be even: RoPE rotates pairs of channels; hint: "
                    "use %d or %d", origin, head_dim, head_dim - 1, head_dim + 1);
}

/* Checks between model.* keys that are set (the flavor's values are checked by
 * hp_config_resolve_model); part of hp_config_validate. */
/* MLA keys (deepseek_v3): they size the MLA attention, which has no head_dim / n_kv_heads of
 * its own (both derived: hp_model_config_validate); on a GQA model they are refused. */
static hp_status_t apply_mla_keys(const hp_config_t *c, const hp_model_config_t *base, hp_model_config_t *mc) {
    const struct { const char *key; int64_t v; } k[] = {
        {"q_lora_rank", c->model.q_lora_rank}, {"kv_lora_rank", c->model.kv_lora_rank},
        {"qk_nope_head_dim", c->model.qk_nope_head_dim}, {"qk_rope_head_dim", c->model.qk_rope_head_dim},
        {"v_head_dim", c->model.v_head_dim}, {"mla_mscale", c->model.mla_mscale != -1 ? 0 : -1}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].v != -1 && !base->mla)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'model.%s' sizes MLA attention, which model.name = %s does "
                            "not have (grouped-query attention); hint: use model.name = deepseek_v3, or leave "
                            "model.%s at -1", k[i].key, c->model.name, k[i].key);
    if (!base->mla) return HP_OK;
    if (c->model.head_dim != -1 || c->model.n_kv_heads != -1)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.%s' = %lld does not apply to %s's MLA attention: every "
                        "head has its own keys and values (n_kv_heads = n_heads) and the head widths are "
                        "model.qk_nope_head_dim, qk_rope_head_dim and v_head_dim; hint: leave model.%s at -1",
                        c->model.head_dim != -1 ? "head_dim" : "n_kv_heads",
                        (long long)(c->model.head_dim != -1 ? c->model.head_dim : c->model.n_kv_heads), c->model.name,
                        c->model.head_dim != -1 ? "head_dim" : "n_kv_heads");
    if (c->model.q_lora_rank != -1) mc->q_lora_rank = (int)c->model.q_lora_rank;
    if (c->model.kv_lora_rank != -1) mc->kv_lora_rank = (int)c->model.kv_lora_rank;
    if (c->model.qk_nope_head_dim != -1) mc->qk_nope_head_dim = (int)c->model.qk_nope_head_dim;
    if (c->model.qk_rope_head_dim != -1) mc->qk_rope_head_dim = (int)c->model.qk_rope_head_dim;
    if (c->model.v_head_dim != -1) mc->v_head_dim = (int)c->model.v_head_dim;
    if (c->model.mla_mscale != -1) mc->mla_mscale = (float)c->model.mla_mscale;
    if (mc->qk_rope_head_dim % 2 != 0)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.qk_rope_head_dim' = %d must be even: RoPE rotates pairs "
                        "of channels; hint: use %d or %d", mc->qk_rope_head_dim, mc->qk_rope_head_dim - 1,
                        mc->qk_rope_head_dim + 1);
    return HP_OK;
}

static hp_status_t check_model_keys(const hp_config_t *c) {
    if (c->model.head_dim != -1) HP_TRY(check_head_dim("config key", (int)c->model.head_dim));
    if (c->model.n_heads != -1 && c->model.n_kv_heads != -1)
        HP_TRY(check_heads("config key", (int)c->model.n_heads, (double)c->model.n_heads, (int)c->model.n_kv_heads,
                           (double)c->model.n_kv_heads));
    if (c->model.rope_low_freq_factor != -1 && c->model.rope_high_freq_factor != -1 &&
        !(c->model.rope_high_freq_factor > c->model.rope_low_freq_factor))
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.rope_high_freq_factor' = %g must be above "
                        "model.rope_low_freq_factor = %g; hint: Llama 3.1 uses 4 and 1",
                        c->model.rope_high_freq_factor, c->model.rope_low_freq_factor);
    return HP_OK;
}

/* --- HF interop (owner hf) ---
 * model.flavor = hf: the model is the one of checkpoint.initial_load_path's config.json
 * (hp_hf_read_config); model.name must be its family, no model.* key may change it, and
 * the tokenizer's ids must fit its vocab_size. */
static hp_status_t resolve_model_from_hf(const hp_config_t *c, int vocab_size, const char *vocab_from, int seq_len,
                                         hp_model_config_t *out) {
    const char *dir = c->checkpoint.initial_load_path;
    if (!dir[0] || !hp_hf_is_hf_dir(dir))
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.flavor' = hf takes the model from the HF checkpoint at "
                        "checkpoint.initial_load_path, but that is %s%s%s; hint: point checkpoint.initial_load_path "
                        "at an HF folder (config.json + model.safetensors[.index.json]) or name a flavor",
                        dir[0] ? "'" : "empty", dir, dir[0] ? "', not an HF folder" : "");
    hp_model_config_t mc;
    HP_TRY(hp_hf_read_config(dir, &mc));
    char ov[1024];
    hp_config_model_overrides(c, ov, sizeof ov);
    if (ov[0])
        return hp_error(HP_ERR_INVALID_ARG, "config keys %s change the model, but model.flavor = hf takes every "
                        "dimension from %s/config.json; hint: remove them, or name a flavor with them (the "
                        "checkpoint's config.json must then agree)", ov, dir);
    if (strcmp(c->model.name, mc.name) != 0)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.name' = %.100s, but %s/config.json describes a %s "
                        "model; hint: set model.name = %s", c->model.name, dir, mc.name, mc.name);
    /* HF checkpoints often pad the embedding beyond the tokenizer (Qwen3: 151936 rows for
     * 151669 ids): every id must have a row, spare rows are harmless */
    if (vocab_size > mc.vocab_size)
        return hp_error(HP_ERR_INVALID_ARG, "%s/config.json 'vocab_size' = %d is below the vocabulary of %s (%d "
                        "tokens): the embedding rows are token ids; hint: use the checkpoint's tokenizer",
                        dir, mc.vocab_size, vocab_from ? vocab_from : "the data", vocab_size);
    /* the RoPE table covers the trained context; MLA keeps config.json's longer context, which
     * decides whether YaRN applies (hp_model_mla_yarn) */
    if (seq_len > 0 && !(mc.mla && mc.max_seq_len >= seq_len)) mc.max_seq_len = seq_len;
    *out = mc;
    return HP_OK;
}
/* --- end --- */

/* --- mixture of experts (owner moe): the MoE keys against each other and the flavor --- */
static hp_status_t check_moe_keys(const hp_config_t *c, const hp_model_config_t *base, const hp_model_config_t *mc) {
    const int set = c->model.moe_num_experts != -1 || c->model.moe_top_k != -1 || c->model.moe_hidden_dim != -1 ||
                    c->model.moe_num_shared_experts != -1 || c->model.moe_n_dense_layers != -1 ||
                    strcmp(c->model.moe_score_func, "default") != 0 || c->model.moe_route_norm != -1 ||
                    c->model.moe_score_before_experts != -1 || c->model.moe_route_scale != -1 ||
                    c->model.moe_load_balance_coeff != -1 || c->model.moe_aux_loss_coeff != -1;
    if (base->moe_experts == 0) {
        if (set)
            return hp_error(HP_ERR_INVALID_ARG, "config keys 'model.moe_*' are set but model.name = %s is a dense model; "
                            "hint: use model.name = deepseek_v3 or qwen3_moe", c->model.name);
        return HP_OK;
    }
    if (mc->moe_top_k > mc->moe_experts)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.moe_top_k' = %d%s exceeds model.moe_num_experts = %d%s: "
                        "each token picks top_k distinct experts; hint: lower model.moe_top_k or raise "
                        "model.moe_num_experts", mc->moe_top_k, from_flavor((double)c->model.moe_top_k), mc->moe_experts,
                        from_flavor((double)c->model.moe_num_experts));
    if (mc->moe_n_dense_layers > mc->n_layers)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.moe_n_dense_layers' = %d%s exceeds model.n_layers = %d; "
                        "hint: at most n_layers (then no layer is MoE)", mc->moe_n_dense_layers,
                        from_flavor((double)c->model.moe_n_dense_layers), mc->n_layers);
    if (mc->moe_expert_groups > 1 && mc->moe_experts % mc->moe_expert_groups != 0)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.moe_num_experts' = %d is not divisible by the flavor's "
                        "%d expert groups (node-limited routing); hint: use a multiple of %d", mc->moe_experts,
                        mc->moe_expert_groups, mc->moe_expert_groups);
    if (mc->moe_expert_groups > 1 &&
        (int64_t)mc->moe_limited_groups * (mc->moe_experts / mc->moe_expert_groups) < mc->moe_top_k)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.moe_top_k' = %d exceeds the experts of the %d groups a "
                        "token may use (%d each); hint: lower model.moe_top_k", mc->moe_top_k, mc->moe_limited_groups,
                        mc->moe_experts / mc->moe_expert_groups);
    const int64_t ep = c->parallelism.expert_parallel_degree;
    if (ep > 1 && mc->moe_experts % ep != 0)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'parallelism.expert_parallel_degree' = %lld must divide "
                        "model.moe_num_experts = %d%s (each EP rank holds num_experts / ep whole experts); hint: use "
                        "a divisor of %d", (long long)ep, mc->moe_experts, from_flavor((double)c->model.moe_num_experts),
                        mc->moe_experts);
    return HP_OK;
}
/* --- end --- */

hp_status_t hp_config_resolve_model(const hp_config_t *c, int vocab_size, const char *vocab_from, int seq_len,
                                    hp_model_config_t *out) {
    if (!c || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_config_resolve_model: NULL argument");
    /* --- HF interop (owner hf) --- */
    if (!strcmp(c->model.flavor, "hf")) return resolve_model_from_hf(c, vocab_size, vocab_from, seq_len, out);
    /* --- end --- */
    hp_model_config_t base, mc;
    hp_status_t s = hp_model_flavor(c->model.name, c->model.flavor, &base);
    if (s != HP_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", hp_last_error());
        return hp_error(s, "config keys 'model.name' = %.200s, 'model.flavor' = %.200s: %s", c->model.name,
                        c->model.flavor, msg);
    }
    HP_TRY(check_model_keys(c));
    const char *fl = c->model.flavor;
    mc = base;
    /* what the flavor derives (docs/config.md): head_dim = dim / n_heads, TorchTitan's FFN rule,
     * n_kv_heads = n_heads; the flavor structs hold the derived values, so recognise them */
    const int hd_follows = base.head_dim * base.n_heads == base.dim;
    const int ffn_follows = base.multiple_of > 0 || c->model.multiple_of != -1;
    const int kv_follows = base.n_kv_heads == base.n_heads;
#define SET_INT(f) if (c->model.f != -1) mc.f = (int)c->model.f
#define SET_F32(f) if (c->model.f != -1) mc.f = (float)c->model.f
#define SET_TRI(f) if (c->model.f != -1) mc.f = c->model.f
    SET_INT(dim); SET_INT(n_layers); SET_INT(n_heads); SET_INT(n_kv_heads); SET_INT(head_dim); SET_INT(hidden_dim);
    SET_INT(vocab_size); SET_INT(multiple_of); SET_INT(rope_original_max_pos); SET_INT(max_seq_len);
    SET_F32(ffn_dim_multiplier); SET_F32(norm_eps); SET_F32(rope_theta); SET_F32(rope_factor);
    SET_F32(rope_low_freq_factor); SET_F32(rope_high_freq_factor);
    SET_TRI(rope_scaling); SET_TRI(qk_norm); SET_TRI(tie_embeddings);
    /* --- mixture of experts (owner moe) --- */
    if (c->model.moe_num_experts != -1) mc.moe_experts = (int)c->model.moe_num_experts;
    if (c->model.moe_top_k != -1) mc.moe_top_k = (int)c->model.moe_top_k;
    if (c->model.moe_hidden_dim != -1) mc.moe_hidden = (int)c->model.moe_hidden_dim;
    if (c->model.moe_num_shared_experts != -1) mc.moe_shared_experts = (int)c->model.moe_num_shared_experts;
    if (c->model.moe_n_dense_layers != -1) mc.moe_n_dense_layers = (int)c->model.moe_n_dense_layers;
    if (strcmp(c->model.moe_score_func, "sigmoid") == 0) mc.moe_score_fn = HP_MOE_SCORE_SIGMOID;
    if (strcmp(c->model.moe_score_func, "softmax") == 0) mc.moe_score_fn = HP_MOE_SCORE_SOFTMAX;
    if (c->model.moe_route_norm != -1) mc.moe_route_norm = c->model.moe_route_norm;
    if (c->model.moe_score_before_experts != -1) mc.moe_score_before_experts = c->model.moe_score_before_experts;
    if (c->model.moe_route_scale != -1) mc.moe_route_scale = (float)c->model.moe_route_scale;
    if (c->model.moe_load_balance_coeff != -1) mc.moe_load_balance_coeff = (float)c->model.moe_load_balance_coeff;
    if (c->model.moe_aux_loss_coeff != -1) mc.moe_aux_loss_coeff = (float)c->model.moe_aux_loss_coeff;
    HP_TRY(check_moe_keys(c, &base, &mc));
    /* --- end --- */
    HP_TRY(apply_mla_keys(c, &base, &mc));
#undef SET_INT
#undef SET_F32
#undef SET_TRI
    if (c->model.n_kv_heads == -1 && kv_follows) mc.n_kv_heads = mc.n_heads;
    if (c->model.head_dim == -1 && hd_follows && (c->model.dim != -1 || c->model.n_heads != -1)) {
        if (mc.dim % mc.n_heads != 0)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'model.dim' = %d%s is not divisible by model.n_heads = %d%s, "
                            "and head_dim follows dim / n_heads in %s/%s; hint: set model.head_dim, or a dim that is a "
                            "multiple of n_heads (e.g. %d)", mc.dim, from_flavor((double)c->model.dim), mc.n_heads,
                            from_flavor((double)c->model.n_heads), c->model.name, fl,
                            mc.n_heads * (mc.dim / mc.n_heads > 0 ? mc.dim / mc.n_heads : 1));
        mc.head_dim = mc.dim / mc.n_heads;
        if (mc.head_dim % 2 != 0 || mc.head_dim > 512)
            return hp_error(HP_ERR_INVALID_ARG, "config keys 'model.dim' = %d%s, 'model.n_heads' = %d%s give head_dim = dim / "
                            "n_heads = %d, which must be even and at most 512 (RoPE rotates pairs of channels); hint: "
                            "set model.head_dim or change dim or n_heads", mc.dim, from_flavor((double)c->model.dim),
                            mc.n_heads, from_flavor((double)c->model.n_heads), mc.head_dim);
    }
    if (c->model.hidden_dim == -1 && (c->model.dim != -1 || c->model.multiple_of != -1 ||
                                      c->model.ffn_dim_multiplier != -1)) {
        if (ffn_follows) mc.hidden_dim = 0;   /* hp_model_config_validate applies the rule */
        else if (c->model.ffn_dim_multiplier != -1)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'model.ffn_dim_multiplier' = %g has no effect: %s/%s sets the "
                            "FFN size explicitly (hidden_dim %d); hint: set model.hidden_dim, or model.multiple_of to use "
                            "TorchTitan's rule", c->model.ffn_dim_multiplier, c->model.name, fl, base.hidden_dim);
    }
    HP_TRY(check_heads("config key", mc.n_heads, (double)c->model.n_heads, mc.n_kv_heads, (double)c->model.n_kv_heads));
    if (mc.rope_scaling && (!(mc.rope_factor > 0) || mc.rope_original_max_pos <= 0 ||
                            !(mc.rope_high_freq_factor > mc.rope_low_freq_factor)))
        return hp_error(HP_ERR_INVALID_ARG, "config key 'model.rope_scaling' = true needs model.rope_factor > 0 (it is "
                        "%g%s), model.rope_original_max_pos > 0 (%d%s) and model.rope_high_freq_factor (%g%s) above "
                        "model.rope_low_freq_factor (%g%s); hint: set them, e.g. 8, 8192, 4 and 1 as Llama 3.1",
                        mc.rope_factor, from_flavor(c->model.rope_factor), mc.rope_original_max_pos,
                        from_flavor((double)c->model.rope_original_max_pos), mc.rope_high_freq_factor,
                        from_flavor(c->model.rope_high_freq_factor), mc.rope_low_freq_factor,
                        from_flavor(c->model.rope_low_freq_factor));
    if (vocab_size > 0) {   /* the data's vocabulary decides (TorchTitan's update_from_config) */
        if (c->model.vocab_size != -1 && c->model.vocab_size != vocab_size)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'model.vocab_size' = %lld does not match the vocabulary of "
                            "%s (%d tokens): the embedding and output rows are token ids; hint: set model.vocab_size = "
                            "%d or -1 (take it from there), or use the matching tokenizer", (long long)c->model.vocab_size,
                            vocab_from ? vocab_from : "the data", vocab_size, vocab_size);
        mc.vocab_size = vocab_size;
    }
    if (seq_len > 0) {
        if (c->model.max_seq_len == -1) mc.max_seq_len = seq_len;
        else if (c->model.max_seq_len < seq_len)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'model.max_seq_len' = %lld is below training.seq_len = %d (the "
                            "RoPE table must cover every trained position); hint: set model.max_seq_len >= %d or -1 (= "
                            "training.seq_len)", (long long)c->model.max_seq_len, seq_len, seq_len);
    }
    s = hp_model_config_validate(&mc);
    if (s != HP_OK) {
        char msg[1024], ov[1024];
        snprintf(msg, sizeof msg, "%s", hp_last_error());
        hp_config_model_overrides(c, ov, sizeof ov);
        char vb[600] = "";
        if (vocab_size > 0)
            snprintf(vb, sizeof vb, ", vocabulary %d from %.500s", vocab_size, vocab_from ? vocab_from : "the data");
        return hp_error(s, "%s (model.name %.100s, model.flavor %.100s%s%s%s); hint: check %s%s%s", msg, c->model.name,
                        fl, ov[0] ? ", with " : "", ov, vb, ov[0] ? "the model.* keys (docs/config.md)" : "",
                        ov[0] && vb[0] ? " and " : "", vb[0] ? (vocab_from ? vocab_from : "the data") :
                        ov[0] ? "" : "model.name and model.flavor");
    }
    *out = mc;
    return HP_OK;
}
