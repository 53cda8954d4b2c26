/* The memory plan (docs/memory.md): each rank's peak predicted from the model, the layout, the
 * batch, activation checkpointing and the dtypes, before anything of the model's size is
 * allocated. It builds the rank's parts empty (hp_model_create_range_empty: module trees and
 * parameter entries, no storage), places their parameters as the apply steps would (tensor
 * parallel's plan without a mesh, expert shards, FSDP's padded shards and workspace rule) and
 * sums what the run will allocate: parameters, gradients, optimizer state, FSDP's gathered
 * buffers, the micro-batch contexts in flight (the pipeline schedule's count), the collective
 * buffers (TP's, DDP's buckets, the pipeline's p2p). No collective and no mesh: a planner can
 * evaluate any layout from one process. The trainer checks it against the rank's memory before
 * step 1 (training.memory_limit_gib). */
#ifndef HYPERPARALLEL_MEMORY_PLAN_H
#define HYPERPARALLEL_MEMORY_PLAN_H

#include <stddef.h>
#include "fsdp.h"
#include "model.h"
#include "parallel_dims.h"
#include "parallelize.h"
#include "status.h"
#include "tp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_memory_plan_input {
    const hp_model_config_t *model;       /* resolved (the tokenizer's vocabulary, max_seq_len) */
    hp_parallel_dims_t dims;
    const hp_tp_plan_entry_t *tp_plan;    /* tp > 1: the family's plan (each stage takes what it holds) */
    int n_tp_plan;
    int batch, seq_len;                   /* the largest (B, T) a data-parallel rank feeds (whole sequences) */
    hp_ac_options_t ac;                   /* hp_apply_ac_options' (every_k 0: off) */
    hp_fsdp_options_t fsdp;               /* dtypes, reshard_after_forward, overlap (dp_shard x cp > 1) */
    hp_pipeline_options_t pp;             /* pp > 1 */
    int optim_states;                     /* f32 state tensors per parameter: AdamW 2, SGD with momentum 1 */
    int zero_stage;                       /* 1: the optimizer state of the largest ZeRO-1 share */
    size_t base_bytes;                    /* the process before the model (resident: libraries, MPI, tokenizer) */
    int bf16_compute;                     /* training.dtype=bfloat16: each context's bf16 workspace (hp_model_set_compute_dtype) */
    int pp_rank;                          /* pp > 1: the pipeline rank to plan; -1 the one with the largest peak */
} hp_memory_plan_input_t;

/* One rank's predicted peak, by term (bytes). */
typedef struct hp_memory_plan {
    int pp_rank;                          /* the pipeline rank whose peak is the largest (0 without pp) */
    size_t params, grads, optim;          /* this rank's shards (FSDP's padded ones) */
    size_t gathered;                      /* FSDP's unsharded buffers, all-gather / reduce-scatter buffers */
    size_t activations;                   /* micro-batch contexts (saved activations + workspace) in flight */
    int n_contexts;                       /* how many live at once */
    size_t comm;                          /* TP's buffers, DDP's buckets, the pipeline's p2p buffers */
    size_t mpi;                           /* the MPI library's temporaries (not the library's allocations):
                                             a copy of the largest reduce-scatter input (FSDP) or
                                             all-reduced bucket (DDP) while the collective runs */
    size_t base;                          /* the input's base_bytes */
    size_t peak;                          /* the sum; peak - base - mpi is hp_memory_tracked's */
} hp_memory_plan_t;

hp_status_t hp_memory_plan(const hp_memory_plan_input_t *in, hp_memory_plan_t *out);
/* "peak 1.02 GiB = parameters 183 MiB + gradients ..." */
const char *hp_memory_plan_str(const hp_memory_plan_t *p, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
