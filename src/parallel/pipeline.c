/* Pipeline parallel as composition steps (TorchTitan's pipeline_llm): the schedule's stage
 * count, the split of the units, the mapping of stages onto pp ranks, one model per local stage
 * holding only its units (hp_pipeline_split), then, after the per-stage apply steps, the
 * runtime over the lowered schedule and the whole model's table (hp_apply_pp). The optimizer,
 * clipping and checkpoints see the whole model's table: the parameters held here, and for the
 * others a placeholder with the global shape and no local elements (no DCP boxes, no optimizer
 * work), so every rank passes the same entries in the same order and checkpoint keys stay the
 * full model's FQNs. */
#include "parallel/parallel-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/dtensor.h"

struct hp_pipeline {
    hp_model_config_t cfg;
    int S, n_local, n_mb, mbs, coord, pp, per;   /* stages, local stages, micro-batches, seqs each,
                                                    pp rank, pp degree, world ranks per pp rank */
    int *unit_lo;                 /* (S + 1) */
    int *stage_to_rank;           /* (S), in unit_lo's allocation */
    int *ids;                     /* (n_local) */
    hp_pp_schedule_t *sched;      /* every pp rank's lowered list */
    hp_pp_t rt;
    hp_comm_t comm;               /* the world mesh's pp dim */
    hp_mesh_t world_mesh;         /* the placeholders' mesh (borrowed) */
    int accum_last;               /* the current schedule run is the step's last */
    hp_param_t *full;             /* (np) the whole model's table */
    int *stage_of;                /* (np) stage of each entry (the tied weight: 0) */
    int np;
    hp_param_t *norm;             /* held entries counted by the gradient norm (in full's allocation) */
    int n_norm;
    int tie_idx;                  /* tied weight held here (first or last stage), else -1 */
    hp_comm_t tie_comm;           /* the first and last stage's ranks of this pp slice, else NULL */
    float absent_dummy;
    int mpipe;                    /* the schedule has MPipe's transposed actions */
    int transpose_layers;
    char schedule_name[128];
    hp_parallel_dims_t pd;
};

void hp_pipeline_free(hp_pipeline_t *pl) {
    if (!pl) return;
    hp_pp_destroy(pl->rt);
    hp_pp_schedule_free(pl->sched);
    free(pl->ids);
    free(pl->unit_lo);   /* and stage_to_rank */
    hp_comm_destroy(pl->tie_comm);
    free(pl->full);      /* and norm */
    free(pl->stage_of);
    free(pl);
}

hp_param_t *hp_pipeline_params(hp_pipeline_t *pl, int *n) {
    *n = pl->np;
    return pl->full;
}
hp_param_t *hp_pipeline_norm_params(hp_pipeline_t *pl, int *n) {
    *n = pl->n_norm;
    return pl->norm;
}
hp_comm_t hp_pipeline_comm(hp_pipeline_t *pl) { return pl->comm; }
hp_mesh_t hp_pipeline_world_mesh(hp_pipeline_t *pl) { return pl->world_mesh; }

static const char *const key_csv = "parallelism.pipeline_parallel_schedule_csv";

/* The schedule: a CSV (compute-only, lowered here; or with its communication, taken as it is)
 * or a generated one; the kind decides 1 or 2 stages per rank. */
static hp_status_t make_schedule(hp_pipeline_t *pl, const hp_pipeline_options_t *o, const hp_pp_schedule_t *csv,
                                 hp_pp_kind_t kind) {
    const int pp = pl->pp;
    hp_pp_schedule_t *compute = NULL;
    if (csv) {
        int has_comm = 0;
        for (int r = 0; r < hp_pp_schedule_n_ranks(csv); r++)
            for (int i = 0; i < hp_pp_schedule_len(csv, r); i++) {
                const hp_pp_action_t *a = hp_pp_schedule_at(csv, r, i);
                has_comm |= a && !hp_pp_type_is_compute(a->type);
            }
        if (hp_pp_schedule_n_ranks(csv) != pp)
            return hp_error(HP_ERR_INVALID_ARG, "%s '%s' has %d rows; parallelism.pipeline_parallel_degree is %d (one "
                            "row per pp rank)", key_csv, o->schedule_csv, hp_pp_schedule_n_ranks(csv), pp);
        if (has_comm) {   // format compute_comms: validate the compute part only through simulation
            HP_TRY(hp_pp_schedule_copy(csv, &pl->sched));
            for (int s = 0; s < pl->S; s++) pl->stage_to_rank[s] = s % pp;
            return HP_OK;
        }
        HP_TRY(hp_pp_schedule_copy(csv, &compute));
    } else {
        HP_TRY(hp_pp_generate(kind, pp, pl->S / pp, pl->n_mb, &compute));
    }
    hp_status_t s = hp_pp_lower(compute, pl->S, pl->n_mb, &pl->sched, pl->stage_to_rank);
    hp_pp_schedule_free(compute);
    if (s != HP_OK && csv) return hp_error_prefix(s, "%s '%s': ", key_csv, o->schedule_csv);
    return s;
}

/* The stage count and the split of the units (from the CSV's own stages, the FQN lists or the
 * layer counts), then the schedule. */
static hp_status_t split_units(hp_pipeline_t *pl, const hp_pipeline_options_t *o, int tie_embeddings,
                               const char *model_name) {
    const int pp = pl->pp, L = pl->cfg.n_layers;
    hp_pp_schedule_t *csv = NULL;
    hp_pp_kind_t kind = HP_PP_1F1B;
    int single = 1, csv_stages = 0;
    const int has_csv = o->schedule_csv && o->schedule_csv[0];
    if (has_csv) {
        HP_TRY(hp_pp_schedule_load_csv(o->schedule_csv, &csv));
        for (int r = 0; r < hp_pp_schedule_n_ranks(csv); r++)   // the CSV names its own stages
            for (int i = 0; i < hp_pp_schedule_len(csv, r); i++) {
                const hp_pp_action_t *a = hp_pp_schedule_at(csv, r, i);
                if (a && a->stage + 1 > csv_stages) csv_stages = a->stage + 1;
            }
        single = csv_stages <= pp;
    } else {
        hp_status_t ks = hp_pp_kind_from_name(o->schedule, &kind);
        if (ks != HP_OK) return hp_error_prefix(ks, "parallelism.pipeline_parallel_schedule: ");
        single = hp_pp_kind_is_single_stage(kind);
        // the V schedules (ZBVZeroBubble, DualPipeV): rank r holds stages r and 2 pp - 1 - r, so
        // the first and the last stage share rank 0; a tied weight would have two copies there
        // that the optimizer does not keep equal (TorchTitan refuses weight tying under PP)
        if (hp_pp_kind_style(kind) == HP_PP_STYLE_V && tie_embeddings)
            return hp_error(HP_ERR_UNSUPPORTED, "parallelism.pipeline_parallel_schedule = %s (V mapping: the first and "
                            "last stage on pp rank 0) with the tied embeddings of model %s is not supported; hint: use "
                            "InterleavedZeroBubble or Interleaved1F1B", hp_pp_kind_name(kind), model_name);
    }
    hp_status_t st = HP_OK;
    pl->unit_lo = hp_calloc(2 * HP_PP_MAX_STAGES + 1, sizeof(int));
    if (!pl->unit_lo) st = HP_ERR_OOM;
    else pl->stage_to_rank = pl->unit_lo + HP_PP_MAX_STAGES + 1;
    if (st == HP_OK && o->module_fqns_per_model_part && o->module_fqns_per_model_part[0]) {
        st = hp_pp_split_fqns(o->module_fqns_per_model_part, "parallelism.module_fqns_per_model_part", L, &pl->S,
                              pl->unit_lo);
        if (st == HP_OK && pl->S % pp != 0)
            st = hp_error(HP_ERR_INVALID_ARG, "parallelism.module_fqns_per_model_part gives %d stages, not a multiple of "
                          "parallelism.pipeline_parallel_degree %d", pl->S, pp);
        if (st == HP_OK && single && pl->S != pp && !csv)
            st = hp_error(HP_ERR_INVALID_ARG, "parallelism.module_fqns_per_model_part gives %d stages; the single-stage "
                          "schedule %s needs exactly %d (one per pp rank)", pl->S, o->schedule, pp);
    } else if (st == HP_OK) {
        st = hp_pp_num_stages(pp, single, L, o->layers_per_stage, o->first_stage_less_layers,
                              o->last_stage_less_layers, &pl->S);
        if (st == HP_OK && csv) pl->S = csv_stages;
        if (st == HP_OK)
            st = hp_pp_split_layers(L, pl->S, o->first_stage_less_layers, o->last_stage_less_layers, pl->unit_lo);
    }
    if (st == HP_OK && !csv && hp_pp_kind_style(kind) == HP_PP_STYLE_V && pl->S != 2 * pp)
        st = hp_error(HP_ERR_INVALID_ARG, "parallelism.pipeline_parallel_schedule = %s needs exactly 2 stages per pp rank "
                      "(%d); the split gives %d (parallelism.pipeline_parallel_layers_per_stage / "
                      "module_fqns_per_model_part); hint: leave layers_per_stage unset or give %d stages",
                      hp_pp_kind_name(kind), 2 * pp, pl->S, 2 * pp);
    if (st == HP_OK) st = make_schedule(pl, o, csv, kind);
    hp_pp_schedule_free(csv);
    return st;
}

/* MPipe (HyperParallel's ScheduleMPipeTranspose): helpers run a replica of stage 0's preprocess
 * units [0, T + 1) refreshed by a broadcast of plain parameters each step. */
static hp_status_t check_mpipe(hp_pipeline_t *pl, const hp_parallel_dims_t *pd) {
    for (int r = 0; r < hp_pp_schedule_n_ranks(pl->sched); r++)
        for (int i = 0; i < hp_pp_schedule_len(pl->sched, r); i++) {
            const hp_pp_action_t *a = hp_pp_schedule_at(pl->sched, r, i);
            pl->mpipe |= a && (a->type == HP_PP_MPIPE_F || a->type == HP_PP_TRANSPOSE_F);
        }
    if (!pl->mpipe) return HP_OK;
    const int T = pl->transpose_layers;
    if (T + 1 > pl->unit_lo[1])
        return hp_error(HP_ERR_INVALID_ARG, "parallelism.pipeline_parallel_mpipe_transpose_layers = %d: the "
                        "preprocess (tok_embeddings and %d layers) must be part of stage 0, which holds "
                        "tok_embeddings and %d layer(s); hint: at most %d, or lower "
                        "parallelism.pipeline_parallel_first_stage_less_layers", T, T, pl->unit_lo[1] - 1,
                        pl->unit_lo[1] - 1);
    if (pd->dp_shard > 1 || pd->tp > 1 || pd->cp > 1)
        return hp_error(HP_ERR_UNSUPPORTED, "parallelism.pipeline_parallel_schedule = MPipeTranspose with "
                        "data_parallel_shard_degree %d / tensor_parallel_degree %d / context_parallel_degree %d is "
                        "not supported: the helpers' replica takes stage 0's plain (unsharded, unsplit) parameters; "
                        "hint: use Interleaved1F1B, or MPipeTranspose with pp (and DDP) only", pd->dp_shard, pd->tp,
                        pd->cp);
    // tied embeddings: the replica is refreshed from stage 0's copy, which the tie's gradient sum
    // and the optimizer keep equal to the last stage's (test_trainer_pp runs qwen3)
    return HP_OK;
}

hp_status_t hp_pipeline_split(const hp_model_config_t *cfg, const hp_parallel_dims_t *pd, int rank, int batch,
                              int seq_len, const hp_pipeline_options_t *o, hp_parallel_t *out) {
    *out = NULL;
    hp_pipeline_t *pl = hp_calloc(1, sizeof *pl);
    if (!pl) return HP_ERR_OOM;
    pl->cfg = *cfg;
    pl->pd = *pd;
    pl->tie_idx = -1;
    pl->pp = pd->pp;
    pl->per = pd->world_size / pd->pp;
    int coords[HP_PD_NDIM];
    hp_parallel_dims_coords(pd, rank, coords);
    pl->coord = coords[HP_PD_PP];
    pl->mbs = o->microbatch_size;
    pl->transpose_layers = o->mpipe_transpose_layers;
    snprintf(pl->schedule_name, sizeof pl->schedule_name, "%s",
             o->schedule_csv && o->schedule_csv[0] ? o->schedule_csv : o->schedule);
    hp_status_t st = HP_OK;
    if (pl->mbs < 1 || batch % pl->mbs != 0)
        st = hp_error(HP_ERR_INVALID_ARG, "training.local_batch_size %d is not divisible by "
                      "parallelism.pipeline_parallel_microbatch_size %d (micro-batches = local batch / microbatch "
                      "size); hint: use a divisor of %d", batch, pl->mbs, batch);
    if (st == HP_OK) {
        pl->n_mb = batch / pl->mbs;
        st = split_units(pl, o, cfg->tie_embeddings, cfg->name);
    }
    if (st == HP_OK) st = check_mpipe(pl, pd);
    for (int s = 0; st == HP_OK && s < pl->S; s++) pl->n_local += pl->stage_to_rank[s] == pl->coord;
    if (st == HP_OK && pl->n_local == 0)
        st = hp_error(HP_ERR_INVALID_ARG, "pipeline: pp rank %d holds no stage of %d", pl->coord, pl->S);
    const int np_total = st == HP_OK ? hp_model_describe_params(cfg, 0, cfg->n_layers + 2, NULL, 0) : 0;
    if (st == HP_OK && np_total < 0) st = hp_error_prefix(HP_ERR_INVALID_ARG, "pipeline: ");
    hp_parallel_t p = NULL;
    if (st == HP_OK) st = hp_parallel_new(pl->n_local, batch, seq_len, np_total, &p);
    if (st != HP_OK) {
        hp_pipeline_free(pl);
        return st;
    }
    p->pipe = pl;
    p->owns_parts = 1;
    pl->ids = hp_calloc((size_t)pl->n_local + 1, sizeof(int));
    if (!pl->ids) st = HP_ERR_OOM;
    for (int s = 0, i = 0; st == HP_OK && s < pl->S; s++)
        if (pl->stage_to_rank[s] == pl->coord) pl->ids[i++] = s;
    for (int i = 0; st == HP_OK && i < pl->n_local; i++) {
        const int s = pl->ids[i];
        /* described only: the stage's parallelize places its parameters, init allocates them */
        st = hp_model_create_range_empty(cfg, pl->unit_lo[s], pl->unit_lo[s + 1], pl->mbs, seq_len, &p->parts[i]);
    }
    if (st != HP_OK) {
        hp_parallel_destroy(p);
        return st;
    }
    *out = p;
    return HP_OK;
}

hp_status_t hp_pipeline_plan_layout(const hp_model_config_t *cfg, const hp_parallel_dims_t *pd, int batch,
                                    const hp_pipeline_options_t *o, hp_pipeline_layout_t *out) {
    memset(out, 0, sizeof *out);
    hp_pipeline_t *pl = hp_calloc(1, sizeof *pl);
    if (!pl) return HP_ERR_OOM;
    pl->cfg = *cfg;
    pl->pd = *pd;
    pl->pp = pd->pp;
    pl->mbs = o->microbatch_size;
    hp_status_t st = HP_OK;
    if (pl->mbs < 1 || batch % pl->mbs != 0)
        st = hp_error(HP_ERR_INVALID_ARG, "training.local_batch_size %d is not divisible by "
                      "parallelism.pipeline_parallel_microbatch_size %d", batch, pl->mbs);
    if (st == HP_OK) {
        pl->n_mb = batch / pl->mbs;
        st = split_units(pl, o, cfg->tie_embeddings, cfg->name);
    }
    if (st == HP_OK && pl->S > HP_PP_MAX_STAGES) st = hp_error(HP_ERR_UNSUPPORTED, "pipeline: %d stages", pl->S);
    if (st == HP_OK) {
        out->S = pl->S;
        out->n_microbatches = pl->n_mb;
        for (int s = 0; s <= pl->S; s++) out->unit_lo[s] = pl->unit_lo[s];
        for (int s = 0; s < pl->S; s++) {
            const int r = pl->stage_to_rank[s];
            out->stage_to_rank[s] = r;
            /* the runtime's rule (pp.c): a context lives from its F to its B or W */
            int live = 0, peak = 0;
            for (int i = 0; i < hp_pp_schedule_len(pl->sched, r); i++) {
                hp_pp_action_t lv[2];
                const int nlv = hp_pp_action_leaves(hp_pp_schedule_at(pl->sched, r, i), lv);
                for (int j = 0; j < nlv; j++) {
                    const hp_pp_action_t *a = &lv[j];
                    if (a->stage != s) continue;
                    if (a->type == HP_PP_F || a->type == HP_PP_TRANSPOSE_F) live++;
                    if (a->type == HP_PP_B || a->type == HP_PP_W || a->type == HP_PP_TRANSPOSE_B) live--;
                    if (a->type == HP_PP_I || a->type == HP_PP_W) out->split[s] = 1;
                    if (live > peak) peak = live;
                }
            }
            out->n_ctx[s] = peak > 0 ? peak : 1;
        }
    }
    hp_pipeline_free(pl);
    return st;
}

/* pre_backward hook of the runtime: FSDP reduces only after the stage's last backward of the
 * step (set_requires_gradient_sync, as PyTorch's schedules do for FSDP). */
static hp_status_t pre_backward(void *user, int stage, int mb, int last) {
    hp_parallel_t p = user;
    (void)mb;
    for (int i = 0; i < p->n_parts; i++)
        if (p->pipe->ids[i] == stage && p->part[i].fsdp)
            hp_fsdp_set_requires_gradient_sync(p->part[i].fsdp, last && p->pipe->accum_last);
    return HP_OK;
}

/* A placeholder entry: the global shape, no local elements, Replicate on the world mesh. */
static hp_status_t placeholder(hp_dtensor_t *v, hp_mesh_t world, int ndim, const int64_t *shape, float *dummy) {
    memset(v, 0, sizeof *v);
    v->mesh = world;
    v->mesh_ndim = hp_mesh_ndim(world);
    for (int a = 0; a < v->mesh_ndim; a++) v->placements[a] = hp_replicate();
    int64_t local[3] = {0, 0, 0};
    for (int a = 0; a < ndim; a++) {
        local[a] = a == 0 ? 0 : shape[a];
        v->global_shape[a] = shape[a];
    }
    return hp_tensor_init(&v->local, HP_F32, ndim, local, dummy);
}

/* The whole model's table: held entries point at the stage's (sharded) parameters. */
static hp_status_t full_table(hp_parallel_t p, hp_mesh_t world) {
    hp_pipeline_t *pl = p->pipe;
    const hp_model_config_t *c = &pl->cfg;
    const int nu = c->n_layers + 2, np = p->np_total;
    hp_model_param_desc_t *d = hp_calloc((size_t)np + 1, sizeof *d);
    pl->full = hp_calloc(2 * (size_t)np + 1, sizeof(hp_param_t));
    pl->stage_of = hp_calloc((size_t)np + 1, sizeof(int));
    if (!d || !pl->full || !pl->stage_of) { free(d); return HP_ERR_OOM; }
    pl->norm = pl->full + np;
    hp_model_describe_params(c, 0, nu, d, np);
    pl->np = np;
    int s = 0, u = 0, u_end = hp_model_describe_params(c, 0, 1, NULL, 0);   // entries [.., u_end) are unit u's
    for (int i = 0; i < np; i++) {
        // the units are in table order: advance the unit, then the stage holding it
        while (i >= u_end && u + 1 < nu) {
            u++;
            u_end += hp_model_describe_params(c, u, u + 1, NULL, 0);
        }
        while (s + 1 < pl->S && pl->unit_lo[s + 1] <= u) s++;
        pl->stage_of[i] = s;
        hp_param_t *e = &pl->full[i];
        snprintf(e->name, sizeof e->name, "%s", d[i].name);
        int li = -1;
        for (int k = 0; k < pl->n_local; k++)
            if (pl->ids[k] == s) li = k;
        // the tied weight also lives on the last stage (its own copy)
        const int tied_here = c->tie_embeddings && i == 0 && li < 0 && pl->stage_to_rank[pl->S - 1] == pl->coord;
        if (tied_here) li = pl->n_local - 1;
        if (li >= 0) {
            hp_param_t *src = p->part[li].fsdp ? hp_fsdp_params(p->part[li].fsdp) : hp_model_params(p->parts[li]);
            const int n_src = p->part[li].fsdp ? hp_fsdp_num_params(p->part[li].fsdp) : hp_model_num_params(p->parts[li]);
            const hp_param_t *q = NULL;
            for (int k = 0; k < n_src && !q; k++)
                if (!strcmp(src[k].name, e->name)) q = &src[k];
            if (!q) { free(d); return hp_error(HP_ERR_STATE, "pipeline: stage %d has no parameter '%s'", s, e->name); }
            *e = *q;
            if (!tied_here) pl->norm[pl->n_norm++] = *e;   // the second copy of a tied weight counts once
            if (c->tie_embeddings && i == 0) pl->tie_idx = 0;
        } else {
            HP_TRY(placeholder(&e->value, world, d[i].ndim, d[i].shape, &pl->absent_dummy));
            HP_TRY(placeholder(&e->grad, world, d[i].ndim, d[i].shape, &pl->absent_dummy));
            e->frozen = d[i].frozen;   // every rank's table says the same (the optimizer's state names)
        }
    }
    free(d);
    return HP_OK;
}

/* After the schedule: the two copies of a tied weight get the sum of both gradients. */
static hp_status_t tie_grads(void *ctx, hp_param_t *params, int n) {
    hp_pipeline_t *pl = ctx;
    (void)params;
    (void)n;
    if (!pl->tie_comm) return HP_OK;   // a middle stage holds no copy
    hp_tensor_t *g = &pl->full[pl->tie_idx].grad.local;
    return hp_all_reduce(g->data, g->data, (size_t)hp_tensor_numel(g), HP_F32, HP_SUM, pl->tie_comm, NULL);
}

hp_status_t hp_apply_pp(hp_parallel_t p, hp_comm_t world, hp_mesh_t world_mesh) {
    (void)world;
    hp_pipeline_t *pl = p->pipe;
    if (!pl) return hp_error(HP_ERR_STATE, "hp_apply_pp: the parts were not made by hp_pipeline_split");
    pl->world_mesh = world_mesh;
    HP_TRY(full_table(p, world_mesh));
    pl->comm = hp_mesh_get_comm(world_mesh, HP_PD_PP);
    /* the norm's squares summed over pp (each stage's layers) */
    for (int g = 0; g < HP_GRAD_GROUPS; g++)
        if (p->fin.group[g].exists) HP_TRY(hp_grad_finalizer_add_comm(&p->fin, (hp_grad_group_t)g, pl->comm));
    // a tied weight's two copies (first and last stage) are summed between their ranks only
    if (pl->cfg.tie_embeddings) {
        HP_TRY(hp_comm_split(pl->comm, pl->tie_idx >= 0 ? 0 : -1, pl->coord, &pl->tie_comm));
        HP_TRY(hp_grad_finalizer_add_reduction(&p->fin, HP_GRAD_PHASE_PIPELINE, tie_grads, pl));
    }
    hp_pp_options_t po = {pl->S, pl->stage_to_rank, pl->n_mb, pl->mbs, p->rows};
    hp_pp_hooks_t hooks = {p, pre_backward, NULL, NULL, NULL};
    HP_TRY(hp_pp_create_mpipe(pl->comm, pl->sched, p->parts, pl->ids, pl->n_local, &po, &hooks, pl->transpose_layers,
                              &pl->rt));
    // FSDP's and TP's collectives, CP's and EP's all-to-alls run inside the stages' modules: two
    // threads would issue them in a rank-dependent order
    const hp_parallel_dims_t *pd = &pl->pd;
    if (hp_pp_overlap_mode(pl->rt) == HP_PP_OVERLAP_THREAD && (pd->dp_shard > 1 || pd->tp > 1 || pd->ep > 1 || pd->cp > 1))
        return hp_error(HP_ERR_UNSUPPORTED, "env HP_PP_OVERLAP = thread with parallelism.context_parallel_degree %d / "
                        "data_parallel_shard_degree %d / tensor_parallel_degree %d / expert_parallel_degree %d: FSDP, TP "
                        "and EP issue collectives inside the stages (CP too), which two threads would order differently "
                        "on each rank; hint: HP_PP_OVERLAP=interleave (the default)", pd->cp, pd->dp_shard, pd->tp, pd->ep);
    return HP_OK;
}

int hp_pipeline_stage_of_part(hp_pipeline_t *pl, int i) { return pl->ids[i]; }

hp_status_t hp_pipeline_step(hp_parallel_t p, const int32_t *tokens, const int32_t *targets, float divisor,
                             int last, double *loss) {
    hp_pipeline_t *pl = p->pipe;
    double ls = 0.0;
    int64_t nv = 0;
    pl->accum_last = last;
    HP_TRY(hp_pp_step(pl->rt, tokens, targets, divisor, &ls, &nv));
    *loss = ls / (double)divisor;
    return HP_OK;
}

hp_status_t hp_pipeline_eval(hp_parallel_t p, const int32_t *tokens, const int32_t *targets, double *loss_sum,
                             int64_t *n_valid) {
    return hp_pp_eval(p->pipe->rt, tokens, targets, 1.0f, loss_sum, n_valid);
}

/* The final weights under PP: every parameter is gathered within its stage's ranks (full_tensor
 * over FSDP) and sent by the stage's first rank to world rank 0. */
hp_status_t hp_pipeline_gather(hp_parallel_t p, hp_comm_t world, hp_model_t full) {
    hp_pipeline_t *pl = p->pipe;
    const int rank = hp_comm_rank(world), sub = rank % pl->per;
    hp_status_t s = HP_OK;
    float *buf = NULL;
    size_t cap = 0;
    for (int i = 0; s == HP_OK && i < pl->np; i++) {
        const int holder = pl->stage_to_rank[pl->stage_of[i]];
        const int64_t n = rank == 0 ? hp_tensor_numel(&hp_model_params(full)[i].value.local) : 0;
        int64_t numel = 1;
        for (int a = 0; a < pl->full[i].value.local.ndim; a++) numel *= pl->full[i].value.global_shape[a];
        if (!pl->full[i].value.mesh) numel = hp_tensor_numel(&pl->full[i].value.local);
        if (pl->coord == holder) {
            if ((size_t)numel > cap) {
                free(buf);
                cap = (size_t)numel;
                buf = hp_malloc(sizeof(float) * cap);
                if (!buf) return HP_ERR_OOM;
            }
            if (pl->full[i].value.mesh) {
                hp_dtensor_mem_t mem = {NULL, buf, sizeof(float) * (size_t)numel};
                hp_tensor_t out;
                s = hp_dtensor_full_tensor(&out, NULL, &mem, &pl->full[i].value);
            } else {
                memcpy(buf, pl->full[i].value.local.data, sizeof(float) * (size_t)numel);
            }
            if (s == HP_OK && sub == 0 && rank != 0) s = hp_send_tag(buf, (size_t)numel, HP_F32, 0, 1 + i, world, NULL);
            if (s == HP_OK && rank == 0) memcpy(hp_model_params(full)[i].value.local.data, buf, sizeof(float) * (size_t)n);
        } else if (rank == 0) {
            s = hp_recv_tag(hp_model_params(full)[i].value.local.data, (size_t)n, HP_F32, holder * pl->per, 1 + i,
                            world, NULL);
        }
    }
    free(buf);
    /* the MoE layers' expert_bias: from the first rank of the stage holding the layer */
    const int E = pl->cfg.moe_experts;
    for (int l = 0; s == HP_OK && l < pl->cfg.n_layers; l++) {
        if (!hp_model_layer_is_moe(&pl->cfg, l)) continue;
        int st = 0;
        while (st + 1 < pl->S && pl->unit_lo[st + 1] <= l + 1) st++;
        const int holder = pl->stage_to_rank[st], tag = 1 + pl->np + l;
        float *dst = rank == 0 ? hp_parallel_moe_bias(full, l) : NULL;
        if (pl->coord == holder) {
            float *src = NULL;
            for (int k = 0; k < pl->n_local && !src; k++)
                if (pl->ids[k] == st) src = hp_parallel_moe_bias(p->parts[k], l);
            if (!src) return hp_error(HP_ERR_STATE, "pipeline: stage %d has no MoE layer %d", st, l);
            if (sub == 0 && rank != 0) s = hp_send_tag(src, (size_t)E, HP_F32, 0, tag, world, NULL);
            if (dst) memcpy(dst, src, sizeof(float) * (size_t)E);
        } else if (dst) {
            s = hp_recv_tag(dst, (size_t)E, HP_F32, holder * pl->per, tag, world, NULL);
        }
    }
    return s;
}

hp_status_t hp_pipeline_log_layout(hp_parallel_t p, hp_comm_t world) {
    hp_pipeline_t *pl = p->pipe;
    if (!pl) return HP_OK;
    float mf[3] = {0, 0, 0}, af[3 * 64];
    for (int i = 0; i < pl->n_local; i++) {
        size_t pb, gb, ab, wb, fw = 0;
        hp_model_memory(p->parts[i], &pb, &gb, &ab, &wb);
        if (p->part[i].fsdp) hp_fsdp_memory(p->part[i].fsdp, &pb, &gb, &fw);
        mf[0] += (float)pb;
    }
    size_t cb = 0, bb = 0;
    hp_pp_memory(pl->rt, &cb, &bb);
    mf[1] = (float)cb;
    mf[2] = (float)bb;
    if (pl->pp > 64) return HP_OK;
    HP_TRY(hp_all_gather(mf, af, 3, HP_F32, pl->comm, NULL));
    if (hp_comm_rank(world) != 0) return HP_OK;
    static const char *const ov[4] = {"default", "off", "interleave", "thread"};
    hp_log(HP_LOG_INFO, "pipeline: %s, %d stages over %d pp ranks (%s mapping), %d micro-batches of %d "
           "sequences; OVERLAP_F_B %s, %d coalesced send/receive pairs on rank 0 (HP_PP_OVERLAP, HP_PP_P2P)",
           pl->schedule_name, pl->S, pl->pp, pl->S > pl->pp && pl->stage_to_rank[pl->pp] == pl->pp - 1 ? "V" : "loop",
           pl->n_mb, pl->mbs, ov[hp_pp_overlap_mode(pl->rt) & 3], hp_pp_coalesced_pairs(pl->rt));
    for (int r = 0; r < pl->pp; r++) {
        char st[256] = "";
        for (int s = 0, n = 0; s < pl->S; s++)
            if (pl->stage_to_rank[s] == r)
                n += snprintf(st + n, sizeof st - (size_t)n, "%s%d[units %d-%d]", n ? " " : "", s, pl->unit_lo[s],
                              pl->unit_lo[s + 1] - 1);
        hp_log(HP_LOG_INFO, "pipeline rank %d: stages %s; parameters %.2f MiB, micro-batch contexts %.2f MiB, "
               "p2p buffers %.2f MiB", r, st, af[3 * r] / 1048576.0, af[3 * r + 1] / 1048576.0,
               af[3 * r + 2] / 1048576.0);
    }
    if (pl->mpipe)
        hp_log(HP_LOG_INFO, "pipeline MPipe: preprocess units [0, %d) replicated on the helpers, %.2f MiB "
               "broadcast from stage 0 per step", pl->transpose_layers + 1,
               (double)hp_pp_mpipe_broadcast_bytes(pl->rt) / 1048576.0);
    return HP_OK;
}
