/* hp_parallel_t: the rank's model parts and the apply steps that compose the parallelisms over
 * them (TP, CP, AC, init, FSDP / DDP), the step entry points (forward-backward, eval, gather)
 * that hide which steps ran, and the replicated data-parallel reduction the finalizer runs.
 * Expert parallel is ep_apply.c, pipelining pipeline.c, the finalizer grad_finalizer.c. */
#include "parallel/parallel-impl.h"

#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/dtensor.h"

static hp_status_t alloc_parts(hp_parallel_t p, int n) {
    p->n_parts = n;
    p->parts = hp_calloc((size_t)n + 1, sizeof(hp_model_t));
    p->part = hp_calloc((size_t)n + 1, sizeof(*p->part));
    return p->parts && p->part ? HP_OK : HP_ERR_OOM;
}

/* Shared by hp_parallel_create and the pipeline's split: an empty composition of n parts. */
hp_status_t hp_parallel_new(int n_parts, int batch, int seq_len, int np_total, hp_parallel_t *out) {
    *out = NULL;
    hp_parallel_t p = hp_calloc(1, sizeof *p);
    if (!p) return HP_ERR_OOM;
    hp_status_t s = alloc_parts(p, n_parts);
    p->batch = batch;
    p->seq_len = p->rows = seq_len;
    p->tp_degree = 1;
    p->np_total = np_total;
    p->fin.par = p;
    p->fin.group[HP_GRAD_GROUP_DENSE].exists = 1;
    if (s != HP_OK) {
        hp_parallel_destroy(p);
        return s;
    }
    *out = p;
    return HP_OK;
}

hp_status_t hp_parallel_create(hp_model_t model, int batch, int seq_len, hp_parallel_t *out) {
    if (!model || !out || batch < 1 || seq_len < 1)
        return hp_error(HP_ERR_INVALID_ARG, "hp_parallel_create: a model and batch, seq_len >= 1 are required "
                        "(got batch %d, seq_len %d)", batch, seq_len);
    HP_TRY(hp_parallel_new(1, batch, seq_len, hp_model_num_params(model), out));
    (*out)->parts[0] = model;
    return HP_OK;
}

void hp_parallel_destroy(hp_parallel_t p) {
    if (!p) return;
    hp_pipeline_free(p->pipe);
    for (int i = 0; p->part && i < p->n_parts; i++) {
        hp_fsdp_destroy(p->part[i].fsdp);
        hp_tp_destroy(p->part[i].tp);
        hp_ep_destroy(p->part[i].ep);
        hp_ep_destroy(p->part[i].ep_tp);
    }
    hp_ddp_destroy(p->ddp);
    hp_zero_free(p->zero);
    if (p->owns_parts)
        for (int i = 0; i < p->n_parts; i++) hp_model_destroy(p->parts[i]);
    hp_cp_destroy(p->cp);   /* after the models that use its cores */
    for (int g = 0; g < HP_GRAD_GROUPS; g++) free(p->fin.group[g].members);
    for (int i = p->n_meshes - 1; i >= 0; i--) hp_mesh_destroy(p->meshes[i]);   /* children before parents */
    free(p->parts);
    free(p->part);
    free(p->grad_work);
    free(p->cp_tokens);   /* and cp_targets */
    free(p);
}

hp_status_t hp_parallel_adopt_mesh(hp_parallel_t p, hp_mesh_t mesh) {
    if (p->n_meshes >= (int)(sizeof p->meshes / sizeof p->meshes[0])) {
        hp_mesh_destroy(mesh);
        return hp_error(HP_ERR_UNSUPPORTED, "hp_parallel_adopt_mesh: more than %d meshes",
                        (int)(sizeof p->meshes / sizeof p->meshes[0]));
    }
    p->meshes[p->n_meshes++] = mesh;
    return HP_OK;
}

int hp_parallel_num_parts(hp_parallel_t p) { return p->n_parts; }
hp_model_t hp_parallel_part(hp_parallel_t p, int i) { return i >= 0 && i < p->n_parts ? p->parts[i] : NULL; }
int hp_parallel_is_pipelined(hp_parallel_t p) { return p->pipe != NULL; }
hp_comm_t hp_parallel_pp_comm(hp_parallel_t p) { return p->pipe ? hp_pipeline_comm(p->pipe) : NULL; }

hp_param_t *hp_parallel_params(hp_parallel_t p) {
    int n;
    if (p->pipe) return hp_pipeline_params(p->pipe, &n);
    return p->part[0].fsdp ? hp_fsdp_params(p->part[0].fsdp) : hp_model_params(p->parts[0]);
}

int hp_parallel_num_params(hp_parallel_t p) {
    int n = 0;
    if (p->pipe && hp_pipeline_params(p->pipe, &n)) return n;
    return hp_model_num_params(p->parts[0]);
}

hp_param_t *hp_parallel_norm_params(hp_parallel_t p, int *n) {
    if (p->pipe) return hp_pipeline_norm_params(p->pipe, n);
    *n = hp_parallel_num_params(p);
    return hp_parallel_params(p);
}

void hp_parallel_memory(hp_parallel_t p, size_t *param_bytes, size_t *grad_bytes, size_t *act_bytes,
                        size_t *work_bytes) {
    *param_bytes = *grad_bytes = *act_bytes = *work_bytes = 0;
    for (int i = 0; i < p->n_parts; i++) {
        size_t pb, gb, ab, wb, fw = 0;
        hp_model_memory(p->parts[i], &pb, &gb, &ab, &wb);
        if (p->part[i].fsdp) hp_fsdp_memory(p->part[i].fsdp, &pb, &gb, &fw);
        *param_bytes += pb;
        *grad_bytes += gb;
        *act_bytes += ab;
        *work_bytes += wb + fw;
    }
}

/* ---- apply steps --------------------------------------------------------------------------- */

/* Whether a module of m (or one parameter of a fused module, named without ".weight") matches
 * the plan entry's pattern: under pipelining each stage takes the entries it holds. */
static int part_holds(hp_module_t **mods, int nm, const char *pattern) {
    for (int j = 0; j < nm; j++) {
        if (mods[j]->name[0] && fnmatch(pattern, mods[j]->name, 0) == 0) return 1;
        for (int q = 0; mods[j]->n_params > 1 && q < mods[j]->n_params; q++) {   // fused parts
            char pn[HP_PARAM_NAME_MAX];
            snprintf(pn, sizeof pn, "%s", mods[j]->params[q]->name);
            char *dot = strrchr(pn, '.');
            if (dot && !strcmp(dot, ".weight")) *dot = '\0';
            if (fnmatch(pattern, pn, 0) == 0) return 1;
        }
    }
    return 0;
}

int hp_parallel_plan_entries_held(hp_model_t m, const hp_tp_plan_entry_t *plan, int n, hp_tp_plan_entry_t *mine) {
    hp_module_t *mods[4096];
    const int nm = hp_model_modules(m, mods, 4096);
    int k = 0;
    for (int e = 0; e < n; e++)
        if (part_holds(mods, nm < 4096 ? nm : 4096, plan[e].pattern)) mine[k++] = plan[e];
    return k;
}

hp_status_t hp_apply_tp(hp_parallel_t p, hp_mesh_t tp_mesh, const hp_tp_plan_entry_t *plan, int n_plan) {
    if (!tp_mesh || hp_mesh_ndim(tp_mesh) != 1)
        return hp_error(HP_ERR_INVALID_ARG, "hp_apply_tp: a 1-D tp mesh is required");
    if (!p->pipe) {
        HP_TRY(hp_tp_parallelize_model(&p->part[0].tp, p->parts[0], tp_mesh, plan, n_plan));
    } else {   // TorchTitan's order: split, then TP per stage with the plan entries it holds
        hp_tp_plan_entry_t *mine = hp_calloc((size_t)n_plan + 1, sizeof *mine);
        if (!mine) return HP_ERR_OOM;
        hp_status_t s = HP_OK;
        for (int i = 0; s == HP_OK && i < p->n_parts; i++) {
            const int k = hp_parallel_plan_entries_held(p->parts[i], plan, n_plan, mine);
            s = hp_tp_parallelize_model(&p->part[i].tp, p->parts[i], tp_mesh, mine, k);
        }
        free(mine);
        HP_TRY(s);
    }
    p->tp_degree = hp_mesh_size(tp_mesh, 0);
    /* the norm: TP's placements span the tp dim (FSDP replaces this with its own) */
    const hp_comm_t c = hp_mesh_get_comm(tp_mesh, 0);
    return hp_grad_finalizer_set_comms(&p->fin, HP_GRAD_GROUP_DENSE, &c, 1);
}

hp_status_t hp_apply_cp(hp_parallel_t p, hp_mesh_t cp_mesh, const hp_cp_options_t *o) {
    if (!cp_mesh || hp_mesh_ndim(cp_mesh) != 1)
        return hp_error(HP_ERR_INVALID_ARG, "hp_apply_cp: a 1-D cp mesh is required");
    if (p->cp) return hp_error(HP_ERR_STATE, "hp_apply_cp: context parallel is already applied");
    /* the CP handle for the attention's local heads (after tensor parallel: n_heads / tp) */
    const hp_model_config_t *mc = hp_model_config(p->parts[0]);
    const int hd = mc->head_dim > 0 ? mc->head_dim : mc->dim / mc->n_heads;
    HP_TRY(hp_cp_create(hp_mesh_get_comm(cp_mesh, 0), o, p->batch, p->seq_len, mc->n_heads / p->tp_degree,
                        mc->n_kv_heads / p->tp_degree, hd, &p->cp));
    for (int i = 0; i < p->n_parts; i++) {   // a stage without attention has no core to replace
        hp_module_t *mods[4096];
        const int nm = hp_model_modules(p->parts[i], mods, 4096);
        int cores = 0;
        for (int j = 0; j < nm && j < 4096; j++) cores += strcmp(mods[j]->ops->kind, "sdpa") == 0;
        if (cores > 0 || p->n_parts == 1) HP_TRY(hp_cp_apply(p->cp, p->parts[i]));
    }
    p->rows = p->seq_len / hp_mesh_size(cp_mesh, 0);
    const size_t n = (size_t)p->batch * (size_t)p->rows;
    p->cp_tokens = hp_malloc(2 * n * sizeof(int32_t));
    if (!p->cp_tokens) return HP_ERR_OOM;
    p->cp_targets = p->cp_tokens + n;
    return HP_OK;
}

hp_status_t hp_apply_ac(hp_parallel_t p, int every_k) {
    if (every_k < 0) return hp_error(HP_ERR_INVALID_ARG, "hp_apply_ac: every_k %d must be >= 0", every_k);
    hp_ac_options_t o = hp_ac_default_options();
    o.every_k = every_k;
    return hp_apply_ac_options(p, &o);
}

hp_status_t hp_apply_ac_options(hp_parallel_t p, const hp_ac_options_t *o) {
    HP_TRY(hp_ac_options_check(o, "hp_apply_ac_options"));
    for (int i = 0; o->every_k > 0 && i < p->n_parts; i++)
        HP_TRY(hp_model_set_activation_checkpoint_options(p->parts[i], o));
    p->ac_every_k = o->every_k;
    p->ac = *o;
    return HP_OK;
}

hp_status_t hp_parallel_ac_estimate(hp_parallel_t p, int micro_batch, hp_ac_estimate_t *out) {
    if (!p || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_parallel_ac_estimate: parallel and out are required");
    const int B = micro_batch > 0 ? micro_batch : p->batch, T = p->rows > 0 ? p->rows : p->seq_len;
    memset(out, 0, sizeof(*out));
    for (int i = 0; i < p->n_parts; i++) {   // every stage part of this rank: one context each in flight
        hp_ac_estimate_t e;
        HP_TRY(hp_model_activation_checkpoint_estimate(p->parts[i], &p->ac, B, T, 0, &e));
        out->act_bytes += e.act_bytes;
        out->kept_bytes += e.kept_bytes;
        out->region_bytes += e.region_bytes;
        out->none_bytes += e.none_bytes;
        out->recompute_flops += e.recompute_flops;
        out->checkpointed_flops += e.checkpointed_flops;
        out->n_checkpointed += e.n_checkpointed;
    }
    return HP_OK;
}

hp_status_t hp_parallel_init_weights(hp_parallel_t p, uint64_t seed) {
    for (int i = 0; i < p->n_parts; i++) {
        hp_model_t m = p->parts[i];
        hp_param_t *table = hp_model_params(m);
        if (p->part[i].fsdp) {   // FSDP holds the shards (allocated at their sharded size)
            table = hp_fsdp_params(p->part[i].fsdp);
        } else {                 // the model's local storage: TP / EP shards, or the whole part
            HP_TRY(hp_model_materialize(m));
        }
        HP_TRY(hp_model_init_params(m, table, seed));
    }
    return HP_OK;
}

hp_status_t hp_apply_fsdp(hp_parallel_t p, hp_mesh_t dp_mesh, const hp_fsdp_options_t *o) {
    hp_fsdp_options_t fo = o ? *o : hp_fsdp_default_options();
    if (p->part[0].ep) {   /* the experts stay on the sparse mesh (ep.c) */
        for (int i = 0; i < p->n_parts; i++) HP_TRY(hp_ep_restore_dense_layout(p->part[i].ep, p->parts[i]));
        fo.ignored_params = hp_ep_is_expert_param;
    }
    for (int i = 0; i < p->n_parts; i++) HP_TRY(hp_fully_shard(p->parts[i], dp_mesh, &fo, &p->part[i].fsdp));
    hp_comm_t comms[HP_GRAD_MAX_COMMS];
    const int n = hp_fsdp_grad_comms(p->part[0].fsdp, comms);   /* shard, replicate, tp */
    return hp_grad_finalizer_set_comms(&p->fin, HP_GRAD_GROUP_DENSE, comms, n);
}

/* Replicated data parallel without buckets: every held gradient SUM-all-reduced over dp_comm
 * (asynchronously, then waited), the experts left to their own groups. */
static hp_status_t dp_all_reduce(void *ctx, hp_param_t *params, int n) {
    hp_parallel_t p = ctx;
    for (int i = 0; i < n; i++) {
        hp_tensor_t *g = &params[i].grad.local;
        if (hp_tensor_numel(g) == 0) continue;   /* pipeline parallel: held by another stage */
        if (params[i].frozen) continue;          /* requires_grad = False (LoRA's base): no gradient */
        if (p->dp_expert_skip && hp_ep_is_expert_param(&params[i])) continue;
        HP_TRY(hp_all_reduce(g->data, g->data, (size_t)hp_tensor_numel(g), HP_F32, HP_SUM, p->dp_comm,
                             &p->grad_work[i]));
    }
    for (int i = 0; i < n; i++)
        if (p->grad_work[i]) HP_TRY(hp_work_wait(&p->grad_work[i]));
    return HP_OK;
}

hp_status_t hp_apply_ddp(hp_parallel_t p, hp_comm_t dp_comm, const hp_ddp_options_t *o) {
    if (!dp_comm) return hp_error(HP_ERR_INVALID_ARG, "hp_apply_ddp: a data-parallel communicator is required");
    /* replicated: every rank holds its whole part, and DDP's buckets view the gradients now */
    for (int i = 0; i < p->n_parts; i++) HP_TRY(hp_model_materialize(p->parts[i]));
    const hp_model_config_t *mc = hp_model_config(p->parts[0]);
    if (!p->pipe && !mc->tie_embeddings && !p->part[0].ep) {
        /* DDP: gradient buckets (1 MiB first, 25 MiB cap) all-reduced (SUM) asynchronously as they
         * fill during backward; no_sync on all micro-batches but the last */
        hp_ddp_options_t dop = hp_ddp_default_options();
        if (o) dop = *o;
        else dop.average = 0;
        return hp_ddp_create(p->parts[0], dp_comm, &dop, &p->ddp);
    }
    /* tied embeddings (two uses of one tensor), pipeline stages, or experts on their own groups:
     * one all-reduce per gradient after backward */
    p->dp_comm = dp_comm;
    p->dp_expert_skip = p->part[0].ep != NULL;
    p->grad_work = hp_calloc((size_t)p->np_total + 1, sizeof(hp_work_t));
    if (!p->grad_work) return HP_ERR_OOM;
    return hp_grad_finalizer_add_reduction(&p->fin, HP_GRAD_PHASE_DATA_PARALLEL, dp_all_reduce, p);
}

hp_status_t hp_apply_zero(hp_parallel_t p, hp_comm_t dp_comm) {
    if (!dp_comm) return hp_error(HP_ERR_INVALID_ARG, "hp_apply_zero: a data-parallel communicator is required");
    if (p->zero) return hp_error(HP_ERR_STATE, "hp_apply_zero: ZeRO-1 is already applied");
    if (p->pipe || p->n_parts != 1 || p->part[0].fsdp || p->part[0].ep)
        return hp_error(HP_ERR_UNSUPPORTED, "hp_apply_zero: ZeRO-1 partitions the optimizer state of replicated data "
                        "parallel (DDP) without pipeline stages or experts; FSDP already shards it; hint: "
                        "parallelism.zero_stage = 0 with data_parallel_shard_degree > 1");
    if (!p->ddp && !p->dp_comm)
        return hp_error(HP_ERR_STATE, "hp_apply_zero: apply replicated data parallel first (hp_apply_ddp): ZeRO-1 "
                        "steps every rank's share with the whole gradient");
    HP_TRY(hp_model_materialize(p->parts[0]));
    HP_TRY(hp_mesh_from_comm(dp_comm, "dp_replicate", &p->zero_mesh));
    HP_TRY(hp_parallel_adopt_mesh(p, p->zero_mesh));
    return hp_zero_create_partition(hp_parallel_params(p), hp_parallel_num_params(p), dp_comm, p->zero_mesh,
                                    &p->zero);
}

hp_param_t *hp_parallel_optim_params(hp_parallel_t p) {
    return p->zero ? hp_zero_optim_params(p->zero) : hp_parallel_params(p);
}

hp_status_t hp_parallel_after_optimizer_step(hp_parallel_t p) { return p->zero ? hp_zero_sync(p->zero) : HP_OK; }

/* ---- running a step ------------------------------------------------------------------------ */

hp_status_t hp_parallel_zero_grad(hp_parallel_t p) {
    for (int i = 0; i < p->n_parts; i++) {
        HP_TRY(hp_model_zero_grad(p->parts[i]));
        if (p->part[i].fsdp) HP_TRY(hp_fsdp_zero_grad(p->part[i].fsdp));
    }
    return HP_OK;
}

/* Context parallel: this rank's rows of every sequence (the caller's buffers otherwise). */
static hp_status_t local_rows(hp_parallel_t p, const int32_t **tokens, const int32_t **targets, int B, int *T) {
    if (!p->cp) return HP_OK;
    HP_TRY(hp_cp_shard_tokens(p->cp, p->cp_tokens, *tokens, B));
    HP_TRY(hp_cp_shard_tokens(p->cp, p->cp_targets, *targets, B));
    *tokens = p->cp_tokens;
    *targets = p->cp_targets;
    *T = p->rows;
    return HP_OK;
}

hp_status_t hp_parallel_forward_backward(hp_parallel_t p, const int32_t *tokens, const int32_t *targets, int B,
                                         int T, float loss_divisor, int last, double *loss) {
    *loss = 0.0;
    HP_TRY(local_rows(p, &tokens, &targets, B, &T));
    if (p->pipe) return hp_pipeline_step(p, tokens, targets, loss_divisor, last, loss);
    if (p->ddp) hp_ddp_set_requires_gradient_sync(p->ddp, last);
    float l = 0.0f;
    hp_status_t fs = hp_model_forward(p->parts[0], tokens, targets, B, T, loss_divisor, &l);
    /* a non-finite loss is not returned here: every rank must enter the same collectives, so
     * it flows into the global loss and all ranks stop together */
    if (fs == HP_ERR_NUMERIC) l = NAN;
    else HP_TRY(fs);
    HP_TRY(hp_model_backward(p->parts[0]));
    *loss = l;
    return HP_OK;
}

hp_status_t hp_parallel_eval(hp_parallel_t p, const int32_t *tokens, const int32_t *targets, int B, int T,
                             double *loss_sum, int64_t *n_valid) {
    *loss_sum = 0.0;
    *n_valid = 0;
    HP_TRY(local_rows(p, &tokens, &targets, B, &T));
    if (p->pipe) return hp_pipeline_eval(p, tokens, targets, loss_sum, n_valid);
    float l = 0.0f;
    HP_TRY(hp_model_forward(p->parts[0], tokens, targets, B, T, 1.0f, &l));
    *loss_sum = l;
    *n_valid = hp_model_valid_tokens(p->parts[0]);
    return HP_OK;
}

double hp_parallel_comm_wait_seconds(hp_parallel_t p) {
    return p->part[0].fsdp ? hp_fsdp_comm_wait_seconds(p->part[0].fsdp) : p->ddp ? hp_ddp_comm_wait_seconds(p->ddp) : 0.0;
}

float *hp_parallel_moe_bias(hp_model_t m, int layer) {
    char name[64];
    snprintf(name, sizeof name, "layers.%d.moe", layer);
    hp_module_t *mods[4096];
    const int n = hp_model_modules(m, mods, 4096);
    for (int i = 0; i < n && i < 4096; i++)
        if (hp_module_is_moe(mods[i]) && !strcmp(mods[i]->name, name)) return ((hp_moe_impl_t *)mods[i]->impl)->expert_bias;
    return NULL;
}

hp_status_t hp_parallel_gather_full_model(hp_parallel_t p, hp_comm_t world, int seq_len, hp_model_t *full,
                                         int *owned) {
    *full = NULL;
    *owned = 0;
    const int rank = hp_comm_rank(world);
    if (!p->pipe && !p->part[0].tp && !p->part[0].fsdp) {   /* replicated: rank 0's own copy is the whole model */
        if (rank == 0) *full = p->parts[0];
        return HP_OK;
    }
    const hp_model_config_t *mc = hp_model_config(p->parts[0]);
    hp_status_t s = HP_OK;
    hp_model_t m = NULL;
    if (p->pipe) {   /* each stage's parameters to rank 0 */
        if (rank == 0) s = hp_model_create(mc, 1, seq_len, &m);
        s = hp_comm_agree(world, s, NULL);
        if (s == HP_OK) s = hp_pipeline_gather(p, world, m);
    } else {   /* sharded DTensors: full_tensor (collective) on every rank; only rank 0 keeps them, the
                * others gather each parameter into one scratch tensor (no rank but the writer holds
                * the whole model) */
        const hp_param_t *params = hp_parallel_params(p);
        const int np = hp_parallel_num_params(p);
        size_t most = 1;
        for (int i = 0; i < np; i++) {
            size_t n = 1;
            for (int a = 0; a < params[i].value.local.ndim; a++) n *= (size_t)params[i].value.global_shape[a];
            if (n > most) most = n;
        }
        float *scratch = NULL;
        if (rank == 0) s = hp_model_create(mc, 1, seq_len, &m);
        else if (!(scratch = hp_aligned_alloc(sizeof(float) * most))) s = HP_ERR_OOM;
        s = hp_comm_agree(world, s, NULL);
        for (int i = 0; s == HP_OK && i < np; i++) {
            float *dst = m ? hp_model_params(m)[i].value.local.data : scratch;
            const size_t cap = m ? (size_t)hp_tensor_numel(&hp_model_params(m)[i].value.local) : most;
            hp_dtensor_mem_t mem = {NULL, dst, sizeof(float) * cap};
            hp_tensor_t out;
            s = hp_dtensor_full_tensor(&out, NULL, &mem, &params[i].value);
        }
        /* the MoE layers' expert_bias (state, replicated on every rank) */
        for (int l = 0; s == HP_OK && l < mc->n_layers; l++) {
            float *src = hp_model_layer_is_moe(mc, l) ? hp_parallel_moe_bias(p->parts[0], l) : NULL;
            float *dst = src && m ? hp_parallel_moe_bias(m, l) : NULL;
            if (src && dst) memcpy(dst, src, sizeof(float) * (size_t)mc->moe_experts);
        }
        hp_free_aligned(scratch);
    }
    if (s != HP_OK || rank != 0) {
        hp_model_destroy(m);
        return s;
    }
    *full = m;
    *owned = 1;
    return HP_OK;
}
