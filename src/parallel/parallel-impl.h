/* Private to the composition (parallel.c, pipeline.c, ep_apply.c, grad_finalizer.c): the body of
 * hp_parallel_t and of the gradient finalizer. */
#ifndef HP_PARALLEL_IMPL_H
#define HP_PARALLEL_IMPL_H

#include "hyperparallel/parallelize.h"
#include "hyperparallel/ep.h"
#include "hyperparallel/pp.h"
#include "hyperparallel/zero.h"

#define HP_GRAD_MAX_REDUCTIONS 16

struct hp_grad_finalizer {
    hp_parallel_t par;
    int n_red;
    struct {
        hp_grad_phase_t phase;
        hp_grad_reduce_fn fn;
        void *ctx;
    } red[HP_GRAD_MAX_REDUCTIONS];   /* phase order, registration order within a phase */
    struct {
        int exists;
        int n_comms;
        hp_comm_t comms[HP_GRAD_MAX_COMMS];
        hp_param_t *members;          /* (n) descriptors of the norm table's entries in the group */
        int n;
    } group[HP_GRAD_GROUPS];
    int built;                        /* members listed (first use, after the table is final) */
};

/* The pipeline's state (pipeline.c); NULL without pipeline parallel. */
typedef struct hp_pipeline hp_pipeline_t;

struct hp_parallel {
    int n_parts;
    int owns_parts;               /* the pipeline made the parts: destroyed with p */
    hp_model_t *parts;            /* (n_parts) the models (the pipeline runtime takes this array) */
    struct {                      /* (n_parts) what each step made of the part; NULL where not applied */
        hp_tp_t tp;
        hp_ep_t ep, ep_tp;        /* expert parallel / TP of the experts alone */
        hp_fsdp_t fsdp;
    } *part;
    hp_ddp_t ddp;                 /* one part only */
    hp_zero_t zero;               /* ZeRO-1 over the replicated data-parallel ranks (hp_apply_zero) */
    hp_mesh_t zero_mesh;          /* its placeholders' mesh (adopted) */
    hp_ep_t ep_sp;                /* sequence parallel around MoE (borrowed: ep[0] or ep_tp[0]) */
    hp_mesh_t ep_mesh, etp_mesh;  /* slices of the sparse mesh (adopted) */
    hp_mesh_t ep_rep_mesh;        /* the sparse mesh's dp_replicate (adopted; NULL when 1) */
    hp_mesh_t sp_mesh;            /* the tp mesh under sequence parallel around MoE (borrowed) */
    hp_cp_t cp;                   /* context parallel (one per rank) */
    int ac_every_k;               /* activation checkpointing: which blocks (ac.every_k) */
    hp_ac_options_t ac;           /* and what each keeps (hp_apply_ac_options) */
    int tp_degree;
    int batch, seq_len, rows;     /* largest (B, T) fed; rows per sequence on this rank (T / cp) */
    int32_t *cp_tokens, *cp_targets;   /* (batch, rows) this rank's rows of a batch (one allocation) */
    int np_total;                 /* entries of the whole model's table */
    hp_work_t *grad_work;         /* (np_total) replicated data parallel's per-parameter all-reduce */
    hp_comm_t dp_comm;            /* replicated data parallel without DDP buckets, else NULL */
    int dp_expert_skip;           /* that all-reduce leaves the experts to their own groups */
    hp_pipeline_t *pipe;
    struct hp_grad_finalizer fin;
    int n_meshes;
    hp_mesh_t meshes[8];          /* adopted (hp_parallel_adopt_mesh) */
};

/* An empty composition of n parts (hp_parallel_create, hp_pipeline_split); np_total: entries of
 * the whole model's table. */
hp_status_t hp_parallel_new(int n_parts, int batch, int seq_len, int np_total, hp_parallel_t *out);
/* The norm table: the entries this rank holds, a tied weight's second copy left out. */
hp_param_t *hp_parallel_norm_params(hp_parallel_t p, int *n);
/* pipeline.c's parts of the public functions. */
void hp_pipeline_free(hp_pipeline_t *pl);
hp_param_t *hp_pipeline_params(hp_pipeline_t *pl, int *n);
hp_param_t *hp_pipeline_norm_params(hp_pipeline_t *pl, int *n);
hp_status_t hp_pipeline_step(hp_parallel_t p, const int32_t *tokens, const int32_t *targets, float divisor,
                             int last, double *loss);
hp_status_t hp_pipeline_eval(hp_parallel_t p, const int32_t *tokens, const int32_t *targets, double *loss_sum,
                             int64_t *n_valid);
hp_comm_t hp_pipeline_comm(hp_pipeline_t *pl);
hp_mesh_t hp_pipeline_world_mesh(hp_pipeline_t *pl);
/* Layer `layer`'s MoE expert_bias in m (E floats), NULL when m holds no such MoE module. */
float *hp_parallel_moe_bias(hp_model_t m, int layer);   /* the placeholders' mesh */
hp_status_t hp_pipeline_gather(hp_parallel_t p, hp_comm_t world, hp_model_t full);
int hp_pipeline_stage_of_part(hp_pipeline_t *pl, int i);
/* The memory plan's view of a pipeline (no model is built): the split, each stage's pp rank and
 * the micro-batch contexts it keeps at once under the lowered schedule (split: weight passes
 * run apart, so its contexts keep every unit's output gradient). */
typedef struct hp_pipeline_layout {
    int S, n_microbatches;
    int unit_lo[HP_PP_MAX_STAGES + 1];
    int stage_to_rank[HP_PP_MAX_STAGES];
    int n_ctx[HP_PP_MAX_STAGES];
    int split[HP_PP_MAX_STAGES];
} hp_pipeline_layout_t;
hp_status_t hp_pipeline_plan_layout(const hp_model_config_t *cfg, const hp_parallel_dims_t *pd, int batch,
                                    const hp_pipeline_options_t *o, hp_pipeline_layout_t *out);
/* The plan entries whose pattern names a module of m (or a fused module's part): a pipeline
 * stage takes those it holds. Writes them to mine (capacity n) and returns the count. */
int hp_parallel_plan_entries_held(hp_model_t m, const hp_tp_plan_entry_t *plan, int n, hp_tp_plan_entry_t *mine);
#endif
