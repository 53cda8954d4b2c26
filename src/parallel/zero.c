/* ZeroRedundancyOptimizer (ZeRO-1): greedy partition of the parameters over the ranks, a
 * local optimizer step on this rank's share, then every parameter broadcast from its owner.
 * The local optimizer comes in through hp_zero_local_optim_t, so this layer needs no
 * optimizer header. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/zero.h"

struct hp_zero {
    hp_comm_t comm;
    int n, rank;
    hp_param_t *params;
    int *owner;
    hp_param_t *mine;   /* copies of the owned params' descriptors (same storage) */
    int n_mine;
    hp_zero_local_optim_t lo;   /* the local optimizer's calls (its ctx only used at create) */
    void *opt;                  /* the local optimizer over `mine`; NULL when this rank owns none */
    hp_work_t *work;
    hp_param_t *view;           /* (n) hp_zero_create_partition: the owned entries, placeholders elsewhere */
};

void hp_zero_partition(const int64_t *numel, int n, int world, int *owner) {
    int *order = malloc(sizeof(int) * (size_t)(n ? n : 1));
    int64_t *total = calloc((size_t)world, sizeof(int64_t));
    HP_ASSERT(order && total);
    for (int i = 0; i < n; i++) order[i] = i;
    // stable sort by numel descending (insertion sort keeps equal sizes in index order)
    for (int i = 1; i < n; i++) {
        int v = order[i], j = i - 1;
        while (j >= 0 && numel[order[j]] < numel[v]) { order[j + 1] = order[j]; j--; }
        order[j + 1] = v;
    }
    for (int k = 0; k < n; k++) {
        int best = 0;
        for (int r = 1; r < world; r++)
            if (total[r] < total[best]) best = r;
        owner[order[k]] = best;
        total[best] += numel[order[k]];
    }
    free(order);
    free(total);
}

/* The common part of both constructors: the struct, the owner of each parameter by the greedy
 * partition, the work handles, and (mine / view) the table each constructor fills. */
static hp_status_t zero_new(hp_param_t *params, int n_params, hp_comm_t comm, int with_mine, int with_view,
                            hp_zero_t *out) {
    hp_zero_t z = hp_calloc(1, sizeof(*z));
    if (!z) return HP_ERR_OOM;
    z->comm = comm;
    z->n = n_params;
    z->rank = hp_comm_rank(comm);
    z->params = params;
    z->owner = hp_malloc(sizeof(int) * (size_t)n_params);
    z->work = hp_calloc((size_t)n_params, sizeof(hp_work_t));
    if (with_mine) z->mine = hp_calloc((size_t)n_params, sizeof(hp_param_t));
    if (with_view) z->view = hp_calloc((size_t)n_params, sizeof(hp_param_t));
    int64_t *numel = hp_malloc(sizeof(int64_t) * (size_t)n_params);
    if (!z->owner || !z->work || (with_mine && !z->mine) || (with_view && !z->view) || !numel) {
        free(numel);
        hp_zero_free(z);
        return HP_ERR_OOM;
    }
    for (int i = 0; i < n_params; i++) numel[i] = hp_tensor_numel(&params[i].value.local);
    hp_zero_partition(numel, n_params, hp_comm_size(comm), z->owner);
    free(numel);
    *out = z;
    return HP_OK;
}

hp_status_t hp_zero_create(const hp_zero_local_optim_t *lo, hp_param_t *params, int n_params, hp_comm_t comm,
                           hp_zero_t *out) {
    if (!lo || !lo->create || !lo->step || !lo->destroy || !params || n_params <= 0 || !comm || !out)
        return hp_error(HP_ERR_INVALID_ARG, "ZeroRedundancyOptimizer: the local optimizer (create, step, destroy), "
                        "params (n > 0), comm and out are required");
    *out = NULL;
    hp_zero_t z;
    HP_TRY(zero_new(params, n_params, comm, 1, 0, &z));
    z->lo = *lo;
    for (int i = 0; i < n_params; i++)
        if (z->owner[i] == z->rank) z->mine[z->n_mine++] = params[i];
    const hp_status_t st = z->n_mine > 0 ? lo->create(lo->ctx, z->mine, z->n_mine, &z->opt) : HP_OK;
    if (st == HP_OK) *out = z;
    else hp_zero_free(z);
    return st;
}

void hp_zero_free(hp_zero_t z) {
    if (!z) return;
    if (z->opt) z->lo.destroy(z->opt);
    free(z->owner);
    free(z->mine);
    free(z->work);
    free(z->view);
    free(z);
}

/* A placeholder of p: its global shape, no local elements, Replicate on `mesh` (its data a
 * dummy: no element is ever read). */
static float absent_dummy;
static void placeholder(hp_dtensor_t *d, const hp_dtensor_t *p, hp_mesh_t mesh) {
    memset(d, 0, sizeof *d);
    const int nd = p->local.ndim;
    int64_t shape[HP_MAX_DIMS];
    for (int a = 0; a < nd; a++) {
        d->global_shape[a] = p->mesh ? p->global_shape[a] : p->local.shape[a];
        shape[a] = a == 0 ? 0 : p->local.shape[a];
    }
    (void)hp_tensor_init(&d->local, HP_F32, nd, shape, &absent_dummy);
    d->mesh = mesh;
    d->mesh_ndim = hp_mesh_ndim(mesh);
    for (int a = 0; a < d->mesh_ndim; a++) d->placements[a] = hp_replicate();
}

hp_status_t hp_zero_create_partition(hp_param_t *params, int n_params, hp_comm_t comm, hp_mesh_t mesh,
                                     hp_zero_t *out) {
    if (!params || n_params <= 0 || !comm || !mesh || !out || hp_mesh_ndim(mesh) < 1 || !hp_mesh_contains_self(mesh))
        return hp_error(HP_ERR_INVALID_ARG, "hp_zero_create_partition: params (n > 0), comm, a mesh holding this rank "
                        "and out are required");
    *out = NULL;
    hp_zero_t z;
    HP_TRY(zero_new(params, n_params, comm, 0, 1, &z));
    for (int i = 0; i < n_params; i++) {
        hp_param_t *v = &z->view[i];
        if (z->owner[i] == z->rank) {
            *v = params[i];
            continue;
        }
        snprintf(v->name, sizeof v->name, "%s", params[i].name);
        v->frozen = params[i].frozen;
        placeholder(&v->value, &params[i].value, mesh);
        placeholder(&v->grad, &params[i].grad, mesh);
    }
    *out = z;
    return HP_OK;
}

hp_param_t *hp_zero_optim_params(hp_zero_t z) { return z ? z->view : NULL; }

hp_status_t hp_zero_sync(hp_zero_t z) {
    for (int i = 0; i < z->n; i++) {
        hp_tensor_t *v = &z->params[i].value.local;
        HP_TRY(hp_broadcast(v->data, (size_t)hp_tensor_numel(v), HP_F32, z->owner[i], z->comm, &z->work[i]));
    }
    for (int i = 0; i < z->n; i++) HP_TRY(hp_work_wait(&z->work[i]));
    return HP_OK;
}

hp_status_t hp_zero_step(hp_zero_t z, double lr_factor) {
    if (z->opt) HP_TRY(z->lo.step(z->opt, lr_factor));
    for (int i = 0; i < z->n; i++) {
        hp_tensor_t *v = &z->params[i].value.local;
        HP_TRY(hp_broadcast(v->data, (size_t)hp_tensor_numel(v), HP_F32, z->owner[i], z->comm, &z->work[i]));
    }
    for (int i = 0; i < z->n; i++) HP_TRY(hp_work_wait(&z->work[i]));
    return HP_OK;
}

int hp_zero_owner(hp_zero_t z, int i) { return (i >= 0 && i < z->n) ? z->owner[i] : -1; }
size_t hp_zero_state_bytes(hp_zero_t z) {
    return z->opt && z->lo.state_bytes ? z->lo.state_bytes(z->opt) : 0;
}
