/* A model family's parallelize (TorchTitan's parallelize_llama / pipeline_llm): the public
 * apply steps of parallelize.h in TorchTitan's order, with the family's tensor-parallel plan,
 * over the run's ParallelDims and meshes. The trainer calls hp_parallelize (or, with pipeline
 * parallel, hp_parallelize_pipeline) and never names a model or a parallelism itself. */
#ifndef HYPERPARALLEL_MODEL_PARALLELIZE_H
#define HYPERPARALLEL_MODEL_PARALLELIZE_H

#include "parallelize.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_parallelize_options {
    /* tensor parallel (tp > 1): sequence parallel around the norms (and MoE), loss parallel
     * over the vocabulary-sharded logits; plan NULL: the family's plan */
    int sequence_parallel, loss_parallel;
    const hp_tp_plan_entry_t *tp_plan;
    int n_tp_plan;
    hp_cp_options_t cp;               /* context parallel (cp > 1) */
    hp_ac_options_t ac;               /* activation checkpointing (hp_apply_ac_options; ac.every_k 0: off) */
    uint64_t seed;                    /* hp_parallel_init_weights */
    hp_fsdp_options_t fsdp;           /* dp_shard x cp > 1 */
    int zero_stage;                   /* 1: ZeRO-1 over dp_replicate (DDP; hp_apply_zero) */
    hp_pipeline_options_t pp;         /* pp > 1 */
} hp_parallelize_options_t;

/* The options' defaults: sequence parallel on, loss parallel on, CP defaults, no AC, seed 0,
 * FSDP with sums (gradient divide factor 1: the loss is globally normalised), 1F1B with
 * micro-batches of one sequence. */
hp_parallelize_options_t hp_parallelize_default_options(void);

/* The model family's parallelize (its registry spec's, models.h) over p's parts. Not pipeline
 * parallel's split or runtime: see hp_parallelize_pipeline. */
hp_status_t hp_parallelize(hp_parallel_t p, const hp_parallel_dims_t *pd, const hp_parallel_meshes_t *meshes,
                           const hp_parallelize_options_t *o);
/* The decoder LLMs' parallelize (TorchTitan's parallelize_llama), the four families' spec: TP
 * (tp > 1; o->tp_plan, else the family's plan; each part takes the entries it holds), EP (an
 * MoE model with ep > 1 or tp > 1), CP (cp > 1), AC, then FSDP / HSDP over dp_shard (x cp)
 * (x dp_replicate) when dp_shard x cp > 1, else DDP over dp_replicate when > 1 (with ZeRO-1 when
 * o->zero_stage is 1), then init (each rank draws only what it holds). The meshes are
 * slices of meshes->world (adopted by p). */
hp_status_t hp_parallelize_decoder(hp_parallel_t p, const hp_parallel_dims_t *pd, const hp_parallel_meshes_t *meshes,
                                   const hp_parallelize_options_t *o);

/* Pipeline parallel (pd->pp > 1): hp_pipeline_split of cfg's model, hp_parallelize of the local
 * stages, hp_apply_pp; each failure agreed over `world` before the next collective, so every
 * rank returns the same status. batch / seq_len: the local batch and T. */
hp_status_t hp_parallelize_pipeline(const hp_model_config_t *cfg, const hp_parallel_dims_t *pd,
                                    const hp_parallel_meshes_t *meshes, hp_comm_t world, int batch, int seq_len,
                                    const hp_parallelize_options_t *o, hp_parallel_t *out);

#ifdef __cplusplus
}
#endif
#endif
