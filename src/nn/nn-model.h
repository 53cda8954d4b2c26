/* Private to the nn layer: the model container's body (units, parameter table, module pool),
 * the constructors only nn calls (SDPA core, activation-checkpoint wrapper) and the
 * micro-batch context (model.c, kv_cache.c). */
#ifndef HP_NN_MODEL_H
#define HP_NN_MODEL_H

#include "hyperparallel/model.h"
#include "hyperparallel/model_builder.h"
#include "hyperparallel/nn.h"
#include "hyperparallel/rng.h"

/* The model builder API (declarations, hp_model_arch_t, the composite modules' constructors)
 * is public: hyperparallel/model_builder.h. What follows stays inside nn. */

/* The causal SDPA core over rows [q | k | v]: q|k heads head_dim wide, v heads v_dim wide
 * (equal but for MLA); training, and KV-cache decode reading layer `layer` of the cache. Its
 * heads are those of the projection feeding it: q's local rows / q_per and kv's local rows /
 * kv_per, read at every call. With v_dim != head_dim a call takes the two widths when the
 * backend has the separate-width kernels (attention_qk_v_*) and it is not decoding, else one
 * width pad_dim (>= both; the KV cache's head width) for both, the narrower side zero-padded by
 * the caller. GQA: all three equal. */
hp_status_t nn_sdpa_core_new(hp_model_t m, const char *name, const hp_param_t *q, int q_per, const hp_param_t *kv,
                             int kv_per, int head_dim, int v_dim, int pad_dim, int layer, hp_module_t **out);
/* The q|k and v head widths of the rows `core` takes in this call (act: its backend, decode or
 * not; NULL: a training call of the model's contexts, which run the model's backend, as save
 * items are sized); 0 when core is not the model's SDPA core (a replacement, e.g. context
 * parallel's, which takes the model's head_dim for both). */
int nn_sdpa_core_widths(const hp_module_t *core, const hp_act_t *act, int *hd, int *hv);
/* The loss child of the head in m's tree (m: the head, or a module above it); NULL if none. */
hp_module_t *nn_head_loss(hp_module_t *m);
/* activation-checkpoint wrapper around `inner` (a block: (B*T, dim) to (B*T, dim); ac.c). */
hp_status_t nn_checkpoint_new(hp_model_t m, hp_module_t *inner, hp_module_t **out);

/* ---- the container ------------------------------------------------------------------- */

typedef struct nn_unit {
    int kind;                 /* HP_MODEL_UNIT_* */
    hp_module_t *module;      /* the outer module (the AC wrapper when checkpointed) */
    hp_module_t *inner;       /* the unit's own module (block, embedding, head) */
    hp_module_t *ac;          /* its AC wrapper (blocks), created with the unit */
    int first, count;         /* parameter table range (local indices) */
} nn_unit_t;

struct hp_model {
    hp_model_config_t cfg;
    const hp_model_arch_t *arch;   /* the family's builder (cfg.arch) */
    int max_batch, max_seq_len;
    int ctx_batch, ctx_seq_len;   /* the model's own context's limits (hp_model_set_context_limits) */
    int n_units_total;        /* the full model's units (global numbering) */
    int u0, u1;               /* the units this model holds: [u0, u1) */
    nn_unit_t *units;         /* [n_units_total]; entries outside [u0, u1) are empty */
    int n_params;
    hp_param_t *params;
    hp_param_decl_t *decl;    /* per param: its declaration (init rule) */
    size_t *param_off;        /* per param: float offset in the flat layout (units contiguous) */
    size_t param_floats;      /* the layout's extent */
    /* The storage the model owns (hp_model_compact_storage): one buffer each for values and
     * gradients, same offsets (zero_grad = one memset); NULL / 0 when every parameter entry
     * points into storage another owner allocated (FSDP). */
    float *param_data, *grad_data;
    size_t store_floats;
    /* Created without storage (hp_model_create_empty): the entries describe the parameters
     * (names, shapes, the layouts the parallelisms give them) and point nowhere until
     * hp_model_materialize allocates the local shards or an owner (FSDP) takes them over
     * (hp_model_release_storage). */
    int empty;
    hp_module_t **mods;       /* every module, creation order (ids) */
    int n_mods, cap_mods;
    int n_owned;              /* mods[0 .. n_owned) were created by the model (freed with it) */
    float *cos_t, *sin_t;     /* (max_seq_len, head_dim/2) */
    hp_arena_t tables;        /* units, params, decl, param_off, cos_t, sin_t live here */
    const hp_backend_t *be;
    hp_model_ctx_t dflt;      /* the context of the whole-model calls (hp_model_forward); NULL: re-created on use */
    hp_ac_options_t ac;       /* activation checkpointing: blocks with (l+1) % ac.every_k == 0, its policy */
    int ac_generation;        /* bumped when AC or the tree changes: contexts sized before are refused */
    hp_dtype_t compute_dtype; /* the linears' GEMMs (hp_model_set_compute_dtype): HP_F32 or HP_BF16 */
};

/* The micro-batch context: the module protocol's activation context plus the unit
 * boundaries, the loss and the activation-gradient buffers of one micro-batch. */
struct hp_model_ctx {
    hp_model_t m;
    unsigned flags;           /* HP_MODEL_CTX_* */
    int max_B, max_T;
    int ac_generation;
    hp_act_t act;
    int B, T, N, Nr, Vc;      /* this micro-batch: rows N = B*T, residual rows Nr = N / its sequence split */
    int32_t *tokens, *targets;        /* (max N) copies */
    int has_targets;
    float loss_divisor;
    float **x;                /* [n_units_total + 1]: x[u] input of unit u ((Nr, dim); x[u0] copied in) */
    float *logits;            /* (N, Vc) head output */
    double loss_sum;
    int64_t n_valid;
    float *dlogits;           /* (N, Vc) */
    float **g;                /* [n_units_total + 1]: g[u] gradient of x[u] (split: one per unit) */
    float *gbuf[2];           /* non-split: ping-pong */
    float **scratch;          /* [n_units_total]: per-unit backward scratch (split) or all one */
    size_t *scratch_n;        /* its floats */
    size_t mem_bytes;         /* the workspace */
    int pending;              /* a forward with targets whose backward has not run */
    unsigned char *state;     /* per unit: 0 none, 1 forward done, 2 input grads done */
    void *mem;                /* the one workspace allocation */
    double prof[HP_NN_OP_COUNT];
    /* activation checkpointing (act.ckpt points here; NULL tables when no block is checkpointed):
     * the decisions for (max_B, max_T), the kept items' addresses, the recompute regions */
    hp_act_ckpt_t ckpt;
    void *ckpt_mem;
};

/* The KV cache (kv_cache.c): per layer the keys (after qk-norm and RoPE) and values of
 * positions [0, pos); the attention modules append to it and the core reads it when a
 * context's act.kv points here. */
struct hp_model_kv_cache {
    hp_model_t m;
    int max_len, pos, chunk, n_threads;
    float *k, *v;          // per layer l at l * max_len * kd: (max_len, KV, hd)
    float *scores;         // (n_threads, max_len) one attention score row per thread
    float *logits;         // (V) logits of the last row
    hp_model_ctx_t ctx;    // (1, chunk) forward context of the block modules
    float *mem;
};


#endif
