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
    /* Activation checkpointing (nn_checkpoint.h): the context's save decisions, kept-tensor
     * table and recompute regions (NULL: no checkpointed module), and while a checkpoint
     * wrapper runs its block: the region its dropped state goes to, whether this forward is
     * the backward's replay, and the depth of calls whose whole state is kept. Set by the
     * wrapper; modules read them through hp_act_save / hp_act_save_out / hp_act_out_kept. */
    const struct hp_act_ckpt *ckpt;
    hp_arena_t *region;
    int replay;
    int keep_depth;
    /* The linear layers' compute dtype (hp_model_set_compute_dtype; docs/nn.md "bf16 compute"):
     * HP_F32 (0, the default) or HP_BF16: a linear rounds its GEMM's inputs and weights to bf16
     * into bf16_ws (bf16_ws_bytes, the context's workspace, sized for every linear of the model
     * by hp_linear_bf16_ws_bytes) and runs the backend's gemm_bf16 (f32 sums); all else is f32. */
    hp_dtype_t compute_dtype;
    void *bf16_ws;
    size_t bf16_ws_bytes;
} hp_act_t;

typedef struct hp_module hp_module_t;

/* ---- saved tensors under activation checkpointing (docs/nn.md "Activation checkpointing") -
 * Inside a checkpointed block every tensor a forward saves for backward is an item: kept
 * through the forward (the main arena) or dropped (a recompute region) and made again by the
 * backward's replay of the forward, which skips the ops whose outputs were kept. An item is
 * owned by a module and a slot: slot HP_SAVE_OUT is the module's output (the buffer its parent
 * allocates for it; a module without a save_items op is one op: when its output is kept, its
 * whole state is kept with it and the replay skips the call), slots 1 .. HP_SAVE_SLOTS - 1 the
 * module's own tensors. The kind is TorchTitan's op class, which op-level selective AC saves
 * or recomputes; the FLOPs are FlopCounterMode's count of the op that makes the item (2 M N K
 * per GEMM, the SDPA's 4 B H T T d per head-dim of a full attention, 0 for elementwise ops). */
#define HP_SAVE_SLOTS 8
#define HP_SAVE_OUT 0
typedef enum hp_save_kind {
    HP_SAVE_OTHER = 0,   /* norms, elementwise, copies, gathers, grouped GEMMs: recomputed by op SAC */
    HP_SAVE_MM,          /* a matmul's output (aten.mm; a fused stacked GEMM is one): every second one recomputed */
    HP_SAVE_ATTENTION,   /* the SDPA's output and its statistics (log-sum-exp) */
    HP_SAVE_CHOICE,      /* reductions: max / top-k, the MoE router's choices */
    HP_SAVE_COMM,        /* outputs of a collective TorchTitan saves (reduce-scatter, all-to-all) */
} hp_save_kind_t;

typedef struct hp_save_item {
    const hp_module_t *owner;   /* the module whose decision it is */
    int slot;                   /* HP_SAVE_OUT or an own slot */
    hp_save_kind_t kind;
    size_t bytes;               /* arena bytes the item holds (the output and, for a one-op module, its state) */
    double flops;               /* forward FLOPs of the op(s) that make it */
    const hp_param_t *const *mm_w;   /* HP_SAVE_MM: the GEMM's weights (stacked along out), for TorchTitan's */
    int mm_nw;                       /* force-recompute-by-shape rule (hp_ac_options_t.force_recompute) */
    const hp_module_t *same_as; /* an alias entry: owner's output decision is same_as's (owner writes it) */
    int tie;                    /* decided with the item before it (one knapsack item) */
    int caller_out;             /* the checkpointed module's output: the caller's buffer, not needed by backward */
} hp_save_item_t;

/* The list a save_items op appends to (hp_save_* below); cap is its capacity: entries past it
 * are counted in n but not written (the caller retries larger). */
typedef struct hp_save_list {
    hp_save_item_t *items;
    int n, cap;
    /* the producer of the output of the module being enumerated (hp_save_final), picked up
     * by the output item its parent appends */
    int has_final;
    hp_save_kind_t final_kind;
    double final_flops;
    size_t final_bytes;
    const hp_param_t *const *final_w;
    int final_nw;
} hp_save_list_t;

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
    /* Optional: the items of this module's forward over (B, T) in forward order (its own
     * tensors, its children's items and outputs; hp_save_own / hp_save_child / hp_save_final),
     * and in forward: hp_act_save / hp_act_save_out for them, the ops that make a kept item
     * skipped on the replay. NULL: the module is one op to activation checkpointing (its
     * parent's item for its output covers its whole state). */
    void (*save_items)(const hp_module_t *m, int B, int T, hp_save_list_t *list);
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

/* ---- saved tensors (the save_items protocol above) ------------------------------------------
 * In forward: own item `slot` of m (bytes, one block the module carves), kept or dropped per
 * the context's decisions; *run = 0 on the replay when it was kept (the pointer is the first
 * forward's, its contents intact: skip the op that makes it). Outside a checkpointed block:
 * hp_act_alloc and *run = 1. */
void *hp_act_save(hp_act_t *act, const hp_module_t *m, int slot, size_t bytes, int *run);
/* The buffer a parent allocates for child c's output (bytes), per c's output decision: kept in
 * the main arena or dropped; the same pointer on the replay when kept. */
void *hp_act_save_out(hp_act_t *act, const hp_module_t *c, size_t bytes);
/* 1 on the replay when m's output was kept: m (a module with save_items) must not write it. */
int hp_act_out_kept(const hp_act_t *act, const hp_module_t *m);
/* Whether slot `slot` of m is kept (the first forward and the replay). */
int hp_act_save_kept(const hp_act_t *act, const hp_module_t *m, int slot);
/* Around an own op whose state the op allocates itself (an expert stage): while kept != 0
 * every allocation goes to the main arena with the item. */
void hp_act_keep_begin(hp_act_t *act, int kept);
void hp_act_keep_end(hp_act_t *act, int kept);

/* For save_items ops. An own item of m. */
void hp_save_own(hp_save_list_t *L, const hp_module_t *m, int slot, hp_save_kind_t kind, size_t bytes, double flops);
/* An own GEMM output of m with weights w[0 .. nw) (m->params entries). */
void hp_save_own_mm(hp_save_list_t *L, const hp_module_t *m, int slot, size_t bytes, double flops,
                    const hp_param_t *const *w, int nw);
/* Child c's items (its save_items, when it has one) and then its output: out_bytes (the buffer
 * the caller allocates with hp_act_save_out) plus, for a one-op child, its whole state. kind
 * and flops describe the op making it unless c declared its own producer (hp_save_final); w /
 * nw: the GEMM's weights of an MM (NULL: c's stacked linear weights when c is a linear). */
void hp_save_child(hp_save_list_t *L, const hp_module_t *c, int B, int T, size_t out_bytes, hp_save_kind_t kind,
                   double flops, const hp_param_t *const *w, int nw);
/* Child c writes m's own output (wo into the attention's, w2 into the feed-forward's): c's
 * items, then an alias so that c's output decision is m's, and c (kind, flops, its state) as
 * the producer of the output item m's parent appends for m. */
void hp_save_final(hp_save_list_t *L, const hp_module_t *m, const hp_module_t *c, int B, int T, hp_save_kind_t kind,
                   double flops, const hp_param_t *const *w, int nw);
/* m writes its own output with its own op (kind, flops, GEMM weights w / nw), as the producer
 * of the output item m's parent appends (the MoE's combine or shared-expert w2). */
void hp_save_output(hp_save_list_t *L, hp_save_kind_t kind, double flops, const hp_param_t *const *w, int nw);
/* Marks the last appended item as decided with the one before it. */
void hp_save_tie(hp_save_list_t *L);

/* Calls through a module's ops table with checks (named errors instead of NULL calls). Inside
 * a checkpointed block hp_module_forward also applies the save decision of a module without
 * save_items: its output kept -> its allocations go to the main arena, and on the replay the
 * call (hooks included) is skipped. */
hp_status_t hp_module_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out);
hp_status_t hp_module_backward_input(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din);
hp_status_t hp_module_backward_weight(hp_module_t *m, hp_act_t *act);

#ifdef __cplusplus
}
#endif
#endif
