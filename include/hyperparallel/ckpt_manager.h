/* The checkpoint manager (TorchTitan's CheckpointManager), part of the train layer: when to
 * save (interval, last step, model-only export at the end), what (model, optimizer state +
 * step, LR scheduler, dataloader per rank, train state with step and seed), retention
 * (keep_latest_k), async commit polling, and resume (latest complete / load_step, else
 * initial_load_path as DCP or HF). It turns the training state into the checkpoint layer's
 * named entries (hp_dcp_state_t) and back; the checkpoint layer never sees an optimizer or a
 * data loader. See docs/checkpoint.md. */
#ifndef HYPERPARALLEL_CKPT_MANAGER_H
#define HYPERPARALLEL_CKPT_MANAGER_H

#include <stdint.h>
#include "checkpoint.h"
#include "comm.h"
#include "config.h"
#include "data.h"
#include "model.h"
#include "optim.h"
#include "param.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The training state the manager saves and loads. Any pointer may be NULL (not saved). */
typedef struct hp_ckpt_train_state {
    hp_param_t *params;              /* model: value DTensors under their TorchTitan FQNs */
    int n_params;
    const hp_model_config_t *model_config;   /* for HF import via initial_load_path */
    hp_optim_t optim;               /* state tensors "optimizer.<fqn>.<slot>" + step */
    hp_dataloader_t dataloader;     /* per-rank blob "dataloader" */
    int64_t *step;                   /* "train_state": step (also the LR schedule position) */
    uint64_t *seed;                  /* "train_state": RNG seed */
    /* The table the optimizer was built on (its state's layouts; ZeRO-1: the owned entries and
     * placeholders, hp_parallel_optim_params), in params' order; NULL: params. */
    hp_param_t *optim_params;
} hp_ckpt_train_state_t;

typedef struct hp_ckpt_manager *hp_ckpt_manager_t;
/* Collective over `world`. folder = cfg checkpoint.folder under job.dump_folder (when
 * relative). Nothing is written until a save. */
hp_status_t hp_ckpt_manager_create(const hp_config_t *cfg, hp_comm_t world,
                                   hp_ckpt_manager_t *out);
/* Call after every step on every rank: commits a finished async save, and saves when
 * step % interval == 0 or step == last_step (model only, cast to export_dtype, when
 * checkpoint.last_save_model_only). Purges all but keep_latest_k. */
hp_status_t hp_ckpt_manager_maybe_save(hp_ckpt_manager_t m, int64_t step, int64_t last_step,
                                       const hp_ckpt_train_state_t *st);
/* Saves now (e.g. the seed checkpoint step-0, model only when model_only). */
hp_status_t hp_ckpt_manager_save(hp_ckpt_manager_t m, int64_t step, int model_only,
                                 const hp_ckpt_train_state_t *st);
/* Resume: loads the latest complete step-N (or checkpoint.load_step) of the folder: a newer
 * step with a missing or truncated shard, or whose data fails its checksums, is skipped with
 * a warning naming the file (never deleted) and the previous complete step is loaded; when
 * steps exist but none is complete, a clear error. Otherwise the
 * model from checkpoint.initial_load_path (a DCP step dir or an HF dir); otherwise nothing.
 * *loaded_step = the step loaded (0 for initial weights or a fresh start); *loaded = 1 when
 * anything was loaded. exclude_from_loading keys ("optimizer", "dataloader", "train_state",
 * "lr_scheduler", "model" refused) are skipped. */
hp_status_t hp_ckpt_manager_load(hp_ckpt_manager_t m, const hp_ckpt_train_state_t *st,
                                 int64_t *loaded_step, int *loaded);
/* Waits for a pending async save and commits it. */
hp_status_t hp_ckpt_manager_wait(hp_ckpt_manager_t m);
/* 1 while an async save is in flight (not yet committed). */
int hp_ckpt_manager_pending(hp_ckpt_manager_t m);
hp_status_t hp_ckpt_manager_destroy(hp_ckpt_manager_t m);
const char *hp_ckpt_manager_folder(hp_ckpt_manager_t m);

#ifdef __cplusplus
}
#endif
#endif
