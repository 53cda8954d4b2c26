/* Optimizers (AdamW, SGD with momentum, Muon) over hp_param_t arrays, learning-rate
 * schedules (TorchTitan's warmup / stable / decay) and gradient clipping by global norm.
 * Optimizers see only (name, value, grad) pairs and step the local shards; their state lives
 * in one arena sized at creation, so a step never allocates. Semantics follow
 * torch.optim.AdamW / SGD / Muon and torchtitan/components/lr_scheduler.py (docs/optim.md). */
#ifndef HYPERPARALLEL_OPTIM_H
#define HYPERPARALLEL_OPTIM_H

#include <stdint.h>
#include "comm.h"
#include "param.h"
#include "status.h"
#include "zero.h"
#include "clip.h"   /* hp_grad_norm, hp_clip_grad_norm (the parallel layer) */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hp_optim_kind {
    HP_OPTIM_ADAMW = 0,
    HP_OPTIM_SGD,
    HP_OPTIM_MUON,
    HP_OPTIM_KIND_COUNT
} hp_optim_kind_t;

/* Muon's learning-rate scaling by the matrix shape (A, B) = (rows, cols), as torch.optim.Muon's
 * adjust_lr_fn: ORIGINAL sqrt(max(1, A/B)) (Keller Jordan), MATCH_RMS_ADAMW 0.2 sqrt(max(A, B))
 * (Moonshot), SPECTRAL_UNCLAMPED sqrt(A/B), NONE 1. */
typedef enum hp_muon_adjust_lr {
    HP_MUON_ADJUST_ORIGINAL = 0,
    HP_MUON_ADJUST_MATCH_RMS_ADAMW,
    HP_MUON_ADJUST_SPECTRAL_UNCLAMPED,
    HP_MUON_ADJUST_NONE
} hp_muon_adjust_lr_t;

typedef struct hp_optim_config {
    hp_optim_kind_t kind;
    double lr;              /* peak learning rate; each step multiplies it by the schedule factor */
    double weight_decay;    /* AdamW/Muon: decoupled (p *= 1 - lr*wd); SGD: L2 (g += wd*p) */
    /* AdamW, and Muon's AdamW fallback for embeddings, output and norms */
    double beta1, beta2, eps;
    /* SGD */
    double momentum, dampening;
    int nesterov;
    /* Muon (matrices) */
    double muon_momentum;   /* 0.95 */
    int muon_nesterov;      /* 1 */
    int ns_steps;           /* 5 */
    double ns_a, ns_b, ns_c;/* quintic coefficients (3.4445, -4.7750, 2.0315) */
    double ns_eps;          /* 1e-7: X / max(||X||_F, eps) */
    hp_muon_adjust_lr_t adjust_lr;
    double muon_adamw_lr;   /* lr of the AdamW fallback; 0 = same as lr */
} hp_optim_config_t;

/* PyTorch's defaults: AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01);
 * SGD(lr 1e-3, momentum 0, dampening 0, weight_decay 0, nesterov False); Muon(lr 1e-3,
 * weight_decay 0.1, momentum 0.95, nesterov True, ns (3.4445, -4.7750, 2.0315), eps 1e-7,
 * 5 steps, adjust "original") with AdamW defaults for the fallback. TorchTitan's trainer
 * default is AdamW(lr 8e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1). */
hp_optim_config_t hp_optim_default(hp_optim_kind_t kind);
const char *hp_optim_kind_name(hp_optim_kind_t kind);
hp_status_t hp_optim_kind_from_name(const char *name, hp_optim_kind_t *out);   /* "adamw", "sgd", "muon" */

/* Muon's rule: a parameter is updated by Muon when its value is 2-D and its name is not an
 * embedding or output projection (names ending in "tok_embeddings.weight", "embed_tokens.weight",
 * "output.weight" or "lm_head.weight"); everything else (embeddings, output, norms, biases)
 * is updated by AdamW. */
int hp_optim_muon_applies(const hp_param_t *param);

typedef struct hp_optim *hp_optim_t;

/* Builds an optimizer over `params` (kept by pointer; the array must outlive the optimizer).
 * Sizes and allocates all state (and Muon's Newton-Schulz workspace) in one arena. Muon needs
 * the whole matrix: one sharded over a mesh (Shard / _StridedShard placements) is gathered
 * within its shard group at every step (hp_dtensor_full_tensor; the gathers' scratch is a
 * second arena sized here), Newton-Schulz runs on the whole matrix and each rank keeps its
 * shard; every rank of a group must build its optimizer over the same parameters in the same
 * order (the gathers are collectives). A pipeline placeholder (Replicate, fewer local elements
 * than its global shape) is skipped; a Partial value is HP_ERR_UNSUPPORTED. docs/optim.md. */
hp_status_t hp_optim_create(const hp_optim_config_t *cfg, hp_param_t *params, int n_params,
                            hp_optim_t *out);
void hp_optim_free(hp_optim_t opt);

/* One step with learning rate cfg.lr * lr_factor (the schedule's factor for this step).
 * Uses each parameter's grad as it is (clip first). Never allocates. Collective over the
 * shard groups of sharded Muon matrices (call it on every rank). */
hp_status_t hp_optim_step(hp_optim_t opt, double lr_factor);
/* A step pre-hook (torch.optim.Optimizer.register_step_pre_hook): called at the start of
 * every hp_optim_step, before any parameter changes; an error stops the step. At most
 * HP_OPTIM_MAX_HOOKS; the MoE load-balancing update (docs/moe.md) is one. */
#define HP_OPTIM_MAX_HOOKS 4
typedef hp_status_t (*hp_optim_hook_fn)(void *user, hp_optim_t opt);
hp_status_t hp_optim_register_step_pre_hook(hp_optim_t opt, hp_optim_hook_fn fn, void *user);
/* Number of completed steps (PyTorch's state["step"]); settable for checkpoint loading. */
int64_t hp_optim_get_step(hp_optim_t opt);
void hp_optim_set_step(hp_optim_t opt, int64_t step);
const hp_optim_config_t *hp_optim_config(hp_optim_t opt);
size_t hp_optim_state_bytes(hp_optim_t opt);

/* State tensors for checkpoints, in a fixed order: for each parameter, its slots
 * ("exp_avg", "exp_avg_sq" for AdamW; "momentum_buffer" for SGD with momentum and Muon).
 * `state` is a view (f32, same local shape as the parameter) into the optimizer's arena. */
int hp_optim_num_states(hp_optim_t opt);
void hp_optim_state_at(hp_optim_t opt, int i, int *param_index, const char **slot,
                       hp_tensor_t *state);

/* ZeRO-1's local optimizer (zero.h) as this module's optimizer of `cfg`: hp_zero_create(&lo,
 * ...) with lo = hp_optim_zero_local(&cfg) builds hp_optim_create(cfg, share) on each rank
 * (cfg is read during hp_zero_create only). */
hp_zero_local_optim_t hp_optim_zero_local(const hp_optim_config_t *cfg);

/* ---- learning-rate schedule (torchtitan linear_warmup_stable_decay) ----------------------- */

typedef enum hp_lr_decay { HP_LR_DECAY_LINEAR = 0, HP_LR_DECAY_SQRT, HP_LR_DECAY_COSINE } hp_lr_decay_t;
hp_status_t hp_lr_decay_from_name(const char *name, hp_lr_decay_t *out);   /* "linear", "sqrt", "cosine" */
const char *hp_lr_decay_name(hp_lr_decay_t d);

typedef struct hp_lr_schedule {
    int64_t warmup_steps;
    int64_t stable_steps;   /* includes TorchTitan's virtual last step */
    int64_t decay_steps;
    hp_lr_decay_t decay;
    double min_lr_factor;
} hp_lr_schedule_t;

/* As TorchTitan's build_lr_schedulers: warmup is clamped to training_steps; decay_steps =
 * round-half-even(training_steps * decay_ratio) (decay_ratio < 0 means None: training_steps -
 * warmup), clamped to training_steps - warmup; stable = training_steps + 1 - warmup - decay.
 * Clamps are logged as warnings. */
hp_status_t hp_lr_schedule_init(hp_lr_schedule_t *s, int64_t training_steps, int64_t warmup_steps,
                                double decay_ratio, hp_lr_decay_t decay, double min_lr_factor);
/* LambdaLR factor for 0-based step s (the s-th optimizer step uses lr * factor(s)):
 * s < warmup: (s+1)/warmup; s < warmup+stable: 1; else p = (s+1-warmup-stable)/decay and
 * f = 1-p | 1-sqrt(p) | (1+cos(pi p))/2, returned as min + (1-min) f. */
double hp_lr_schedule_factor(const hp_lr_schedule_t *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
