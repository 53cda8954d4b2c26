/* The job config's parallelism keys turned into the composition's inputs: ParallelDims, the
 * options of the model's parallelize, and the layout checks that name the config key (before the
 * library's generic errors), as TorchTitan's trainer reads job_config.parallelism. */
#ifndef HYPERPARALLEL_PARALLEL_CONFIG_H
#define HYPERPARALLEL_PARALLEL_CONFIG_H

#include "config.h"
#include "model_parallelize.h"
#include "parallel_dims.h"

#ifdef __cplusplus
extern "C" {
#endif

/* parallelism.*_degree -> validated ParallelDims (errors name the key). */
hp_status_t hp_parallel_dims_from_config(const hp_config_t *cfg, int world_size, hp_parallel_dims_t *out);

/* The parallelize options of the run (tensor / sequence / loss parallel, context parallel,
 * activation checkpointing, FSDP's mixed precision and reshard policy, the pipeline keys). */
hp_status_t hp_parallelize_options_from_config(const hp_config_t *cfg, hp_parallelize_options_t *out);

/* Every layout rule of the run against the model, named by config key: training.dtype, the
 * parallelisms this build implements, TP's divisibility of heads, KV heads, FFN hidden dim and
 * vocabulary (and sequence parallel's of seq_len), CP's seq_len, Ulysses and SP rules, the MoE
 * layouts, and pipeline-parallel limits. batch / val_batch: the local training and validation
 * batch. Pure arithmetic: identical on every rank. */
hp_status_t hp_parallel_config_check(const hp_config_t *cfg, const hp_model_config_t *mc, const hp_parallel_dims_t *pd,
                                     int batch, int val_batch);

#ifdef __cplusplus
}
#endif
#endif
