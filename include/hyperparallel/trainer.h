/* hp_trainer: TorchTitan's training loop in C. Builds ParallelDims and meshes, the model
 * (registry by name/flavor), optimizer, LR schedule, tokenizer and data loaders from an
 * hp_config_t; each step pulls grad_accum micro-batches, normalises the loss by the global
 * number of valid target tokens (summed over the batch mesh), runs forward/backward, reduces
 * gradients over the data-parallel ranks, clips, checks finiteness and steps the optimizer.
 * A non-finite loss or gradient norm stops the run with HP_ERR_NUMERIC naming the step. */
#ifndef HYPERPARALLEL_TRAINER_H
#define HYPERPARALLEL_TRAINER_H

#include <stdint.h>
#include "comm.h"
#include "config.h"
#include "memory_plan.h"
#include "model.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hp_trainer *hp_trainer_t;

/* Collective over `world`. Validates the config against the world size and refuses any
 * parallelism this build does not implement (see docs/config.md). */
hp_status_t hp_trainer_create(const hp_config_t *cfg, hp_comm_t world, hp_trainer_t *out);
void hp_trainer_destroy(hp_trainer_t t);

typedef struct hp_step_stats {
    int64_t step;          /* 1-based, as TorchTitan */
    double loss;           /* global mean loss over every valid target of the step */
    double grad_norm;      /* before clipping */
    double lr;
    int64_t tokens;        /* input tokens this rank processed in the step */
    int64_t valid_tokens;  /* global valid targets (the loss divisor) */
    double seconds;        /* wall time of the step */
    /* Where the step's wall time went (seconds; all but ckpt_s sum to `seconds`, which ends
     * before the checkpoint save):
     * pulling the batch and the valid-target count (with its all-reduce), forward + backward
     * (FSDP's all-gathers and reduce-scatters run inside), the gradient reduction after
     * backward (replicated data parallel, expert grads, tied pipeline copies), the loss
     * all-reduce + gradient norm + clipping, the optimizer step, and the checkpoint save. */
    double data_s, fwd_bwd_s, reduce_s, clip_s, optim_s, ckpt_s;
    double comm_wait_s;    /* of fwd_bwd_s + reduce_s: FSDP's / DDP's exposed collective waits
                            * (hp_fsdp_comm_wait_seconds; 0 without data parallel) */
} hp_step_stats_t;

/* One optimizer step (all micro-batches). *stats may be NULL. */
hp_status_t hp_trainer_step(hp_trainer_t t, hp_step_stats_t *stats);
/* Runs the remaining training.steps steps with logging and validation; then writes the final
 * weights (rank 0) to job.dump_folder/weights.safetensors when dump_folder is set. At the end
 * rank 0 logs (INFO) the mean step's phases (hp_step_stats_t) and the metrics logging time
 * over the steps after the first, as shares of the step: what is not compute in the loop.
 * Interruption: after every step the ranks agree (one all-reduce) on whether any got a
 * signal through hp_dcp_interrupt (hp-train's SIGTERM / SIGINT handler); then a pending or
 * cut-short checkpoint save is abandoned (its step-N.tmp-* directory removed) and the call
 * returns HP_ERR_STATE with a message saying at which step, whether during a save, and
 * which checkpoint is the last complete one; hp_dcp_interrupted() gives the signal. */
hp_status_t hp_trainer_train(hp_trainer_t t);
/* Mean loss over validation.steps batches of the validation split (all ranks). */
hp_status_t hp_trainer_validate(hp_trainer_t t, double *loss);

hp_model_t hp_trainer_model(hp_trainer_t t);
/* The LoRA adapters (lora.enable) as a PEFT folder at path (collective; docs/finetune.md): what
 * hp_trainer_train writes to lora.save_folder at the end. */
hp_status_t hp_trainer_save_lora(hp_trainer_t t, const char *path);
/* The composition's (name, DTensor) table (this rank's shards) and the optimizer. */
hp_param_t *hp_trainer_params(hp_trainer_t t, int *n);
struct hp_optim;
struct hp_optim *hp_trainer_optim(hp_trainer_t t);
int64_t hp_trainer_current_step(hp_trainer_t t);
/* Gradient accumulation steps in use. */
int64_t hp_trainer_grad_accum(hp_trainer_t t);
/* This rank's memory plan, made before the model was allocated (docs/memory.md): the predicted
 * peak by term; peak - base - mpi is what the library's allocations (hp_memory_tracked) should reach. */
const hp_memory_plan_t *hp_trainer_memory_plan(hp_trainer_t t);

#ifdef __cplusplus
}
#endif
#endif
