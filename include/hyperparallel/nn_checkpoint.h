/* nn: activation checkpointing (docs/nn.md "Activation checkpointing"): the checkpoint wrapper
 * module, the save policies TorchTitan offers (full, op-level selective, memory budget) over
 * the save_items protocol of nn_module.h, and what a policy costs: activation bytes and
 * recompute FLOPs. The model container (model.h) uses these for its blocks; they work on any
 * module tree. */
#ifndef HYPERPARALLEL_NN_CHECKPOINT_H
#define HYPERPARALLEL_NN_CHECKPOINT_H

#include <stddef.h>
#include "nn_module.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a checkpointed block keeps through the forward (the rest is recomputed in backward). */
typedef enum hp_ac_policy {
    HP_AC_FULL = 0,     /* its input only: the whole forward again (TorchTitan mode full / layer selective) */
    HP_AC_OP,           /* TorchTitan's op-level selective AC: matmul outputs except every second one, SDPA
                         * outputs and statistics, reductions (the MoE router's choices), the collectives'
                         * outputs TorchTitan lists; recompute the rest (selective_ac_option = op) */
    HP_AC_BUDGET,       /* torch's memory budget (mode memory_budget): a 0-1 knapsack over the block's items,
                         * value = recompute FLOPs, weight = bytes, capacity memory_budget x all bytes;
                         * 0 = full AC, 1 = everything kept */
} hp_ac_policy_t;

#define HP_AC_FORCE_MAX 256
typedef struct hp_ac_options {
    int every_k;                 /* blocks l with (l + 1) % every_k == 0 are checkpointed; 0: none, 1: all */
    hp_ac_policy_t policy;
    double memory_budget;        /* HP_AC_BUDGET: in [0, 1] */
    /* HP_AC_OP: TorchTitan's per_op_sac_force_recompute_mm_shapes_by_fqns, comma-separated: every
     * GEMM whose weight shape is that of a weight whose FQN contains one of these is recomputed
     * and not counted in the every-second rule (TorchTitan's default: the MoE router's gate) */
    char force_recompute[HP_AC_FORCE_MAX];
} hp_ac_options_t;

/* every_k 0 (off), HP_AC_FULL, memory_budget 0.5 and force_recompute "moe.router.gate"
 * (TorchTitan's defaults). */
hp_ac_options_t hp_ac_default_options(void);
/* Checks the options: every_k >= 0, a known policy, memory_budget in [0, 1]; `what` prefixes
 * the message (a config key or function name). */
hp_status_t hp_ac_options_check(const hp_ac_options_t *o, const char *what);
/* "none", "full", "layer k", "op", "memory_budget 0.5": for start-up reports. */
const char *hp_ac_options_describe(const hp_ac_options_t *o, char *buf, size_t n);

/* What one checkpointed module costs for (B, T) under a policy. */
typedef struct hp_ac_stats {
    size_t bytes;            /* the module's activation bytes without checkpointing (act_bytes) */
    size_t kept_bytes;       /* kept through the forward (its items in the main arena) */
    size_t region_bytes;     /* dropped state: the recompute region the replay fills */
    double forward_flops;    /* FLOPs of every item's op (what full AC recomputes) */
    double recompute_flops;  /* FLOPs the replay runs (the dropped items' ops) */
    int n_items, n_kept;
} hp_ac_stats_t;

/* Decides which items of `wrapper`'s module (a checkpoint wrapper) the policy keeps for (B, T):
 * keep[id * HP_SAVE_SLOTS + slot] = 1 for a kept item (entries of modules outside the wrapped
 * tree are left alone; n_ids: the table's modules), and its costs. The decisions depend on
 * sizes only, so every rank of a layout decides alike. */
hp_status_t hp_ac_decide(const hp_module_t *wrapper, const hp_ac_options_t *o, int B, int T, unsigned char *keep,
                         int n_ids, hp_ac_stats_t *stats);
/* The items of module m's forward over (B, T), in forward order (hp_save_item_t, nn_module.h);
 * returns their count (entries past cap are not written). The checkpoint wrapper's are its
 * module's items and the module's output (kind and FLOPs of its last op, no bytes: the output
 * is the caller's). */
int hp_ac_items(const hp_module_t *m, int B, int T, hp_save_item_t *items, int cap);

/* ---- the checkpoint wrapper ----------------------------------------------------------------- */

/* What a context carries for the checkpoint wrappers in it: the save decisions and the kept
 * tensors' addresses ([n_slots * HP_SAVE_SLOTS] each, n_slots = the act's), and the recompute
 * regions: region_of[wrapper id] is the region a wrapper's dropped state goes to, in its
 * forward and again (same order, so the same addresses) in its replay. One region serves every
 * wrapper when each block's backward follows its replay at once; a split-backward context
 * (deferred weight passes) gives each wrapper its own. */
typedef struct hp_act_ckpt {
    const unsigned char *keep;
    void **kept;
    hp_arena_t *regions;
    int n_regions;
    const int *region_of;
    const size_t *kept_of;   /* optional [n_slots]: a wrapper's kept bytes (hp_ac_stats_t), checked after its forward */
} hp_act_ckpt_t;

typedef struct hp_checkpoint_impl {
    int in_cols, out_cols;   /* the wrapped module's input (B*T, in_cols) and output (B*T, out_cols) */
} hp_checkpoint_impl_t;
/* The checkpoint wrapper (kind "checkpoint", TorchTitan's checkpoint_wrapper; it keeps the inner
 * module's name) around `inner`, into caller-owned storage: its forward runs `inner` with the
 * dropped state in its region (keeping its input, which must outlive the backward), its
 * backward_input replays the forward (the same kernels on the same inputs: bitwise the state
 * the forward made; the ops of kept items skipped) and then runs inner's backward. The caller
 * puts the decisions (hp_ac_decide) and regions in act->ckpt. */
void hp_checkpoint_module_init(hp_module_t *w, hp_checkpoint_impl_t *impl, hp_module_t *inner, int in_cols,
                               int out_cols);
int hp_module_is_checkpoint(const hp_module_t *m);

#ifdef __cplusplus
}
#endif
#endif
