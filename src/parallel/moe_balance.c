/* The MoE layers' aux-loss-free load balancing over a composition (moe_balance.h): each rank
 * copies out its MoE modules' token counts, the counts are summed over the ranks that routed
 * different tokens, and every layer's expert_bias moves towards balance; the imbalance and the
 * auxiliary loss go to the caller's metrics. */
#include "hyperparallel/moe_balance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/parallel-impl.h"

struct hp_moe_balancer {
    hp_parallel_t p;
    hp_comm_t loss_comm;
    int loss_ranks;
    hp_model_config_t cfg;
    int n_moe;                 /* MoE modules held here (under PP: the local stages'), layer order */
    hp_module_t **mods;
    int n_moe_all;             /* the model's MoE layers */
    int *layer;                /* (n_moe_all) layer index of each */
    int *slot;                 /* (n_moe) row of counts of each held module (in layer's allocation) */
    float *counts;             /* (n_moe_all, E) tokens per expert of a step */
    hp_param_t *state;         /* table + one expert_bias per MoE layer */
    int n_state;
    float *zero;               /* (E) the bias entries' (unused) gradient (in counts' allocation) */
};

void hp_moe_balancer_destroy(hp_moe_balancer_t b) {
    if (!b) return;
    free(b->mods);
    free(b->layer);    /* and slot */
    free(b->counts);   /* and zero */
    free(b->state);
    free(b);
}

hp_param_t *hp_moe_balancer_state(hp_moe_balancer_t b, int *n) {
    *n = b->n_state;
    return b->state;
}

/* Finds the held MoE modules and lists each layer's expert_bias after the table. */
static hp_status_t setup(hp_moe_balancer_t b) {
    hp_parallel_t p = b->p;
    const int E = b->cfg.moe_experts, L = b->cfg.n_layers;
    b->mods = hp_calloc((size_t)L + 1, sizeof(hp_module_t *));
    b->layer = hp_calloc(2 * ((size_t)L + 1), sizeof(int));
    if (!b->mods || !b->layer) return HP_ERR_OOM;
    b->slot = b->layer + L + 1;
    for (int l = 0; l < L; l++)
        if (hp_model_layer_is_moe(&b->cfg, l)) b->layer[b->n_moe_all++] = l;
    for (int k = 0; k < p->n_parts; k++) {
        hp_module_t *mods[4096];
        const int nm = hp_model_modules(p->parts[k], mods, 4096);
        for (int i = 0; i < nm && i < 4096; i++) {
            if (!hp_module_is_moe(mods[i])) continue;
            const int layer = atoi(mods[i]->name + 7);   // "layers.N.moe"
            int j = 0;
            while (j < b->n_moe_all && b->layer[j] != layer) j++;
            if (j == b->n_moe_all || b->n_moe >= L)
                return hp_error(HP_ERR_STATE, "moe: module '%s' is not an MoE layer of model %s", mods[i]->name,
                                b->cfg.name);
            b->slot[b->n_moe] = j;
            b->mods[b->n_moe++] = mods[i];
        }
    }
    const int np = hp_parallel_num_params(p);
    b->counts = hp_calloc((size_t)(b->n_moe_all + 1) * E, sizeof(float));
    b->state = hp_calloc((size_t)np + b->n_moe_all, sizeof(hp_param_t));
    if (!b->counts || !b->state) return HP_ERR_OOM;
    b->zero = b->counts + (size_t)b->n_moe_all * E;
    memcpy(b->state, hp_parallel_params(p), sizeof(hp_param_t) * (size_t)np);
    b->n_state = np + b->n_moe_all;
    for (int j = 0; j < b->n_moe_all; j++) {   // every rank lists every layer's bias, in layer order
        hp_param_t *e = &b->state[np + j];
        hp_moe_impl_t *M = NULL;
        for (int i = 0; i < b->n_moe; i++)
            if (b->slot[i] == j) M = b->mods[i]->impl;
        snprintf(e->name, sizeof e->name, "layers.%d.moe.expert_bias", b->layer[j]);
        if (!M) {   /* pipeline parallel: another stage's layer, a placeholder like the table's */
            if (!p->pipe) return hp_error(HP_ERR_STATE, "moe: layer %d's MoE module is missing", b->layer[j]);
            hp_mesh_t world = hp_pipeline_world_mesh(p->pipe);
            hp_dtensor_t *v[2] = {&e->value, &e->grad};
            for (int k = 0; k < 2; k++) {
                v[k]->mesh = world;
                v[k]->mesh_ndim = hp_mesh_ndim(world);
                for (int a = 0; a < v[k]->mesh_ndim; a++) v[k]->placements[a] = hp_replicate();
                const int64_t zero[1] = {0};
                HP_TRY(hp_tensor_init(&v[k]->local, HP_F32, 1, zero, b->zero));
                v[k]->global_shape[0] = E;
            }
            continue;
        }
        const int64_t shape[1] = {E};
        HP_TRY(hp_tensor_init(&e->value.local, HP_F32, 1, shape, M->expert_bias));
        HP_TRY(hp_tensor_init(&e->grad.local, HP_F32, 1, shape, b->zero));
        e->value.global_shape[0] = e->grad.global_shape[0] = E;
    }
    return HP_OK;
}

hp_status_t hp_moe_balancer_create(hp_parallel_t p, hp_comm_t loss_comm, hp_moe_balancer_t *out) {
    *out = NULL;
    const hp_model_config_t *mc = hp_model_config(p->parts[0]);
    if (mc->moe_experts <= 0) return HP_OK;
    hp_moe_balancer_t b = hp_calloc(1, sizeof *b);
    if (!b) return HP_ERR_OOM;
    b->p = p;
    b->cfg = *mc;
    b->loss_comm = loss_comm;
    b->loss_ranks = loss_comm ? hp_comm_size(loss_comm) : 1;
    hp_status_t s = setup(b);
    if (s != HP_OK) {
        hp_moe_balancer_destroy(b);
        return s;
    }
    *out = b;
    return HP_OK;
}

hp_status_t hp_moe_balancer_step(hp_moe_balancer_t b, hp_moe_log_fn log, void *user) {
    hp_parallel_t p = b->p;
    const int E = b->cfg.moe_experts;
    const size_t n = (size_t)b->n_moe_all * E;
    memset(b->counts, 0, sizeof(float) * n);
    for (int i = 0; i < b->n_moe; i++) {
        hp_moe_impl_t *M = b->mods[i]->impl;
        memcpy(b->counts + (size_t)b->slot[i] * E, M->tokens_per_expert, sizeof(float) * (size_t)E);
        memset(M->tokens_per_expert, 0, sizeof(float) * (size_t)E);
    }
    /* the ranks of the loss mesh route their own tokens (each cp rank its sequence shard) */
    if (b->loss_ranks > 1) HP_TRY(hp_all_reduce(b->counts, b->counts, n, HP_F32, HP_SUM, b->loss_comm, NULL));
    /* sequence parallel: each tp rank routed its own sequence shard (TorchTitan sums over tp too) */
    hp_comm_t spc = p->ep_sp ? hp_mesh_get_comm(p->sp_mesh, 0) : NULL;
    if (spc) HP_TRY(hp_all_reduce(b->counts, b->counts, n, HP_F32, HP_SUM, spc, NULL));
    /* pipeline parallel: each layer's row is held by one stage (zeros elsewhere): the sum over pp
     * gathers every layer's counts on every rank, so the logging rank logs them all */
    hp_comm_t ppc = hp_parallel_pp_comm(p);
    if (ppc) HP_TRY(hp_all_reduce(b->counts, b->counts, n, HP_F32, HP_SUM, ppc, NULL));
    if (b->cfg.moe_aux_loss_coeff > 0.0f) {   /* the auxiliary loss of the step, summed over layers and micro-batches */
        float aux = 0.0f, all = 0.0f;
        for (int i = 0; i < b->n_moe; i++) {
            hp_moe_impl_t *M = b->mods[i]->impl;
            aux += (float)M->aux_loss_sum;   // once per micro-batch: a checkpointed block's replay does not count
            M->aux_loss_sum = 0.0;
        }
        HP_TRY(hp_all_reduce(&aux, &all, 1, HP_F32, HP_SUM, b->loss_comm, NULL));
        if (spc) {   // mean over the tp ranks' sequence shards as well
            HP_TRY(hp_all_reduce(&all, &all, 1, HP_F32, HP_SUM, spc, NULL));
            all /= (float)hp_comm_size(spc);
        }
        if (ppc) HP_TRY(hp_all_reduce(&all, &all, 1, HP_F32, HP_SUM, ppc, NULL));   /* every stage's layers */
        if (log) HP_TRY(log(user, "moe/aux_loss", all / (b->loss_ranks > 0 ? b->loss_ranks : 1)));
    }
    for (int j = 0; j < b->n_moe_all; j++) {   // every MoE layer; the bias of those held here moves
        float *bias = NULL;
        for (int i = 0; i < b->n_moe; i++)
            if (b->slot[i] == j) bias = ((hp_moe_impl_t *)b->mods[i]->impl)->expert_bias;
        float *c = b->counts + (size_t)j * E;
        const int layer = b->layer[j];
        const double imb = hp_moe_update_expert_bias(bias, c, E, bias ? b->cfg.moe_load_balance_coeff : 0.0f);
        if (!log) continue;
        float mx = c[0], mn = c[0];
        for (int e = 1; e < E; e++) { mx = c[e] > mx ? c[e] : mx; mn = c[e] < mn ? c[e] : mn; }
        char tag[64];
        snprintf(tag, sizeof tag, "moe/layers.%d/imbalance_max_over_mean", layer);
        HP_TRY(log(user, tag, imb));
        snprintf(tag, sizeof tag, "moe/layers.%d/tokens_per_expert_max", layer);
        HP_TRY(log(user, tag, mx));
        snprintf(tag, sizeof tag, "moe/layers.%d/tokens_per_expert_min", layer);
        HP_TRY(log(user, tag, mn));
    }
    return HP_OK;
}
