/* nn: the module protocol (docs/nn.md): the per-micro-batch activation context, a module's
 * ops table, children, parameters and hooks, replacing a child, the profile's kernel kinds,
 * and the calls through a module's ops. */
#ifndef HYPERPARALLEL_NN_MODULE_H
#define HYPERPARALLEL_NN_MODULE_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "arena.h"
#include "tensor.h"
#include "param.h"
#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_IGNORE_INDEX (-100)   /* a target id no loss counts */

/* ---- module protocol ----------------------------------------------------------------- */

/* Per-microbatch activation context: what forward saved for backward lives in `arena`
 * (one microbatch's lifetime) and is found again through `slots[module id]`. Several
 * contexts can be in flight at once (pipelining), dropped and rebuilt (checkpointing). The
 * model's micro-batch context (model.h, hp_model_ctx_t) embeds one. */
typedef struct hp_act {
    hp_arena_t arena;     /* saved tensors of this microbatch */
    int B, T;             /* microbatch shape: rows are (b, t), t < T local positions */
    int n_slots;
    void **slots;         /* per module id: the module's saved state (in arena) */
    /* Scratch for activation gradients inside a module's backward (set by the caller). A
     * module carves disjoint regions for its children, so a backward_weight may run after
     * later backward_input calls as long as the caller gives each unit its own scratch. */
    float *grad_scratch;
    size_t grad_scratch_floats;
    double *prof;         /* optional: seconds per kernel kind (HP_NN_OP_*), accumulated */
    const hp_backend_t *be;   /* the kernel table (hp_act_init: hp_backend_default()) */
    /* Global position of local row t = 0 (RoPE angle and causal mask use pos0 + t): 0 for a
     * whole sequence, the cache position under KV-cache decode, a shard's offset under
     * context parallelism. The model's contexts start every micro-batch at 0. */
    int pos0;
    /* A rank's rows of each sequence as n_pos_segs equal segments, segment i starting at global
     * position pos_segs[i] (context parallelism's head-tail balancing: its hooks on the attention
     * modules set them, cp.h hp_cp_set_positions); 0: one segment at pos0. */
    int n_pos_segs;
    const int *pos_segs;
    /* The micro-batch's target ids (B*T, HP_IGNORE_INDEX for none) that a loss module reads
     * (model.h: the model container sets them; NULL: logits only). */
    const int32_t *targets;
    /* Inference: the KV cache the attention modules append to and read (NULL: training). */
    struct hp_model_kv_cache *kv;
    /* Weight passes may be deferred past later input passes (a split-backward context):
     * checkpoint wrappers keep their recomputed state until the context is reset. */
    int keep_recompute;
} hp_act_t;

typedef struct hp_module hp_module_t;

/* How an activation of a micro-batch of B sequences of T positions and C features is split
 * across ranks: each rank holds T / seq positions of every sequence (rows (b, t), t in its
 * share) and C / cols of the features. {1, 1}: whole. */
typedef struct hp_act_split {
    int seq, cols;
} hp_act_split_t;

typedef struct hp_module_ops {
    const char *kind;   /* "linear", "rmsnorm", "embedding", "attention", "feed_forward", ... */
    /* Bytes this module (children included) takes from an activation arena for (B, T). */
    size_t (*act_bytes)(const hp_module_t *m, int B, int T);
    /* Floats of activation-gradient scratch backward_input needs for (B, T). */
    size_t (*grad_scratch_floats)(const hp_module_t *m, int B, int T);
    /* out = f(in); saves what backward needs into act. */
    hp_status_t (*forward)(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out);
    /* din (=) from dout; keeps in act what backward_weight needs (dout stays valid until then). */
    hp_status_t (*backward_input)(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din);
    /* Parameter grads += . */
    hp_status_t (*backward_weight)(hp_module_t *m, hp_act_t *act);
    /* Optional: the split of the module's input (output = 0) or output (output = 1) when the
     * module decides it: returns 1 and fills *s. NULL or 0: the module takes what it is given
     * and passes it on. Tensor parallel's wrappers report their styles' layouts (sequence
     * parallel: seq = degree; vocab-parallel logits: cols = degree), composite modules ask the
     * child that sees the input (or makes the output) first; the model container reads its
     * units' to size the residual stream and the logits (docs/nn.md, "Activation splits"). */
    int (*act_split)(const hp_module_t *m, int output, hp_act_split_t *s);
} hp_module_ops_t;

#define HP_MODULE_MAX_CHILDREN 8
#define HP_MODULE_MAX_PARAMS 8
#define HP_MODULE_MAX_HOOKS 4   /* per kind */

/* Module hooks (torch.nn.Module register_forward_pre_hook / ..._hook /
 * register_full_backward_pre_hook / ..._hook): called by hp_module_forward (pre before,
 * post after), hp_module_backward_input (pre_backward before) and hp_module_backward_weight
 * (post_backward after: the module's weight gradients are complete). Several per module,
 * called in registration order; an error stops the call. A hook may re-point its module's
 * parameter data (value.local.data / grad.local.data): modules read them at every call.
 * FSDP, DDP and the pipeline attach here; activation checkpointing is a wrapper module. */
typedef enum hp_hook_kind {
    HP_HOOK_PRE_FORWARD = 0, HP_HOOK_POST_FORWARD, HP_HOOK_PRE_BACKWARD, HP_HOOK_POST_BACKWARD,
    HP_HOOK_KINDS
} hp_hook_kind_t;
typedef hp_status_t (*hp_module_hook_fn)(void *user, hp_module_t *m, hp_act_t *act);
typedef struct hp_module_hook {
    hp_module_hook_fn fn;
    void *user;
    int handle;
} hp_module_hook_t;

struct hp_module {
    char name[HP_PARAM_NAME_MAX];   /* fully qualified ("layers.3.attention"); "" for the root */
    const hp_module_ops_t *ops;
    int id;                         /* index into hp_act_t.slots */
    int unit;                       /* the model unit this module is the outer module of, else -1 */
    int n_children;
    hp_module_t *children[HP_MODULE_MAX_CHILDREN];
    int n_params;
    hp_param_t *params[HP_MODULE_MAX_PARAMS];   /* owned by the model's parameter table */
    void *impl;                     /* layer configuration (sizes, flags) */
    double *timer;                  /* optional: seconds accumulated by forward + backward */
    int n_hooks[HP_HOOK_KINDS];
    hp_module_hook_t hooks[HP_HOOK_KINDS][HP_MODULE_MAX_HOOKS];
};

/* Registers a hook; *handle (may be NULL) identifies it for removal. HP_ERR_INVALID_ARG when
 * the module already has HP_MODULE_MAX_HOOKS of that kind. */
hp_status_t hp_module_add_hook(hp_module_t *m, hp_hook_kind_t kind, hp_module_hook_fn fn, void *user, int *handle);
/* Removes the hook with that handle (any kind); unknown handles are ignored. */
void hp_module_remove_hook(hp_module_t *m, int handle);
/* Removes every hook whose user pointer is `user` (a wrapper detaching itself). */
void hp_module_remove_hooks_of(hp_module_t *m, void *user);
/* Moves m's hooks to `to` (an outer wrapper taking m's place), appended after to's own. */
hp_status_t hp_module_move_hooks(hp_module_t *to, hp_module_t *m);

/* Kernel kinds of the per-op profile (hp_act_t.prof, hp_model_profile). */
enum {
    HP_NN_OP_EMBEDDING = 0,
    HP_NN_OP_RMSNORM_FWD, HP_NN_OP_RMSNORM_BWD,
    HP_NN_OP_LINEAR_FWD, HP_NN_OP_LINEAR_BWD_INPUT, HP_NN_OP_LINEAR_BWD_WEIGHT,
    HP_NN_OP_OUTPUT_FWD, HP_NN_OP_OUTPUT_BWD_INPUT, HP_NN_OP_OUTPUT_BWD_WEIGHT,
    HP_NN_OP_ROPE, HP_NN_OP_QK_NORM,
    HP_NN_OP_ATTENTION_FWD, HP_NN_OP_ATTENTION_BWD,
    HP_NN_OP_SWIGLU_FWD, HP_NN_OP_SWIGLU_BWD,
    HP_NN_OP_CROSS_ENTROPY, HP_NN_OP_ELEMENTWISE,
    HP_NN_OP_MOE_ROUTE, HP_NN_OP_MOE_EXPERTS, HP_NN_OP_MOE_COMBINE, HP_NN_OP_MOE_DISPATCH,   /* moe.c, ep.c */
    HP_NN_OP_COUNT
};
extern const char *const hp_nn_op_names[HP_NN_OP_COUNT];

/* Reserves the activation context for modules 0..n_modules-1 with an arena of `bytes`;
 * be = hp_backend_default(), pos0 = 0, no KV cache. */
hp_status_t hp_act_init(hp_act_t *act, int n_modules, size_t bytes);
void hp_act_free(hp_act_t *act);
/* Drops the saved state of a microbatch (start of forward, or after checkpointing). */
void hp_act_reset(hp_act_t *act);

/* For module authors (nn's layers, the parallel wrappers): allocation from the activation
 * arena (asserts (a size-table bug) when it runs out), a module's saved-state struct
 * registered under its id, that state again in backward (asserts it exists), gradient
 * scratch carved from act->grad_scratch at *offset (advanced), and the base set-up of a
 * module struct (zeroes it; id and unit -1). */
void *hp_act_alloc(hp_act_t *act, size_t bytes);
void *hp_act_slot_new(hp_act_t *act, const hp_module_t *m, size_t bytes);
void *hp_act_slot(hp_act_t *act, const hp_module_t *m);
float *hp_act_scratch(hp_act_t *act, size_t *offset, size_t floats);
void hp_module_base_init(hp_module_t *m, const hp_module_ops_t *ops, const char *name, void *impl);

/* Replaces child `old` of `parent` by `repl` in the same position: the one way a parallelism
 * changes a module tree (tensor parallelism puts a wrapper holding `old` as its child in its
 * place, context parallelism swaps an attention's core, loss_parallel the head's loss).
 * Composite modules read their children at every call. HP_ERR_INVALID_ARG when old is not a
 * child of parent. A model's modules are replaced through hp_model_replace_module (model.h),
 * which gives the new module its activation slot. */
hp_status_t hp_module_replace_child(hp_module_t *parent, hp_module_t *old, hp_module_t *repl);

/* m's act_split answer (1 and *s), or 0 when m (or its ops) does not decide it. */
int hp_module_act_split(const hp_module_t *m, int output, hp_act_split_t *s);

/* Calls through a module's ops table with checks (named errors instead of NULL calls). */
hp_status_t hp_module_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out);
hp_status_t hp_module_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din);
hp_status_t hp_module_backward_weight(hp_module_t *m, hp_act_t *act);

#ifdef __cplusplus
}
#endif
#endif
