/* The gradient finalizer: the post-backward reductions the apply steps registered, in phase
 * order, and the global gradient norm over the norm groups whose communicators the steps'
 * placements span, then clipping. One object per hp_parallel_t; the trainer calls reduce and
 * clip once per step whatever the layout. */
#include "parallel/parallel-impl.h"

#include <math.h>
#include <stdlib.h>

#include "hyperparallel/clip.h"

hp_grad_finalizer_t hp_parallel_finalizer(hp_parallel_t p) { return &p->fin; }

hp_status_t hp_grad_finalizer_add_reduction(hp_grad_finalizer_t f, hp_grad_phase_t phase, hp_grad_reduce_fn fn,
                                            void *ctx) {
    if (!fn || phase < 0 || phase >= HP_GRAD_PHASES)
        return hp_error(HP_ERR_INVALID_ARG, "gradient finalizer: a reduction needs a function and a phase");
    if (f->n_red >= HP_GRAD_MAX_REDUCTIONS)
        return hp_error(HP_ERR_UNSUPPORTED, "gradient finalizer: more than %d reductions", HP_GRAD_MAX_REDUCTIONS);
    int at = f->n_red;   /* after every reduction of this phase or an earlier one */
    while (at > 0 && f->red[at - 1].phase > phase) {
        f->red[at] = f->red[at - 1];
        at--;
    }
    f->red[at].phase = phase;
    f->red[at].fn = fn;
    f->red[at].ctx = ctx;
    f->n_red++;
    return HP_OK;
}

hp_status_t hp_grad_finalizer_set_comms(hp_grad_finalizer_t f, hp_grad_group_t g, const hp_comm_t *comms, int n) {
    if (g < 0 || g >= HP_GRAD_GROUPS || n < 0 || n > HP_GRAD_MAX_COMMS)
        return hp_error(HP_ERR_INVALID_ARG, "gradient finalizer: group %d with %d communicators (at most %d)", (int)g,
                        n, HP_GRAD_MAX_COMMS);
    f->group[g].exists = 1;
    f->group[g].n_comms = n;
    for (int i = 0; i < n; i++) f->group[g].comms[i] = comms[i];
    return HP_OK;
}

hp_status_t hp_grad_finalizer_add_comm(hp_grad_finalizer_t f, hp_grad_group_t g, hp_comm_t comm) {
    if (g < 0 || g >= HP_GRAD_GROUPS || f->group[g].n_comms >= HP_GRAD_MAX_COMMS)
        return hp_error(HP_ERR_INVALID_ARG, "gradient finalizer: group %d is full (%d communicators)", (int)g,
                        HP_GRAD_MAX_COMMS);
    f->group[g].exists = 1;
    f->group[g].comms[f->group[g].n_comms++] = comm;
    return HP_OK;
}

hp_status_t hp_grad_finalizer_reduce(hp_grad_finalizer_t f) {
    int n = 0;
    hp_param_t *params = hp_parallel_params(f->par);
    n = hp_parallel_num_params(f->par);
    for (int i = 0; i < f->n_red; i++) HP_TRY(f->red[i].fn(f->red[i].ctx, params, n));
    return HP_OK;
}

/* Each group's members: descriptors of the norm table's entries (storage does not move), the
 * dense ones first as the table orders them, then the experts. */
static hp_status_t build_groups(hp_grad_finalizer_t f) {
    int n = 0;
    const hp_param_t *ps = hp_parallel_norm_params(f->par, &n);
    const int split = f->group[HP_GRAD_GROUP_EXPERT].exists;
    for (int g = 0; g < HP_GRAD_GROUPS; g++) {
        if (!f->group[g].exists) continue;
        f->group[g].members = hp_calloc((size_t)n + 1, sizeof(hp_param_t));
        if (!f->group[g].members) return HP_ERR_OOM;
        f->group[g].n = 0;
        for (int i = 0; i < n; i++) {
            const int expert = split && hp_ep_is_expert_param(&ps[i]);
            if (expert == (g == HP_GRAD_GROUP_EXPERT)) f->group[g].members[f->group[g].n++] = ps[i];
        }
    }
    f->built = 1;
    return HP_OK;
}

hp_status_t hp_grad_finalizer_clip(hp_grad_finalizer_t f, double max_norm, double *norm) {
    *norm = 0.0;
    if (!f->built) HP_TRY(build_groups(f));
    double sq = 0.0, only = 0.0;
    int n_groups = 0;
    for (int g = 0; g < HP_GRAD_GROUPS; g++) {
        if (!f->group[g].exists) continue;
        double gn = 0.0;
        HP_TRY(hp_grad_norm(f->group[g].members, f->group[g].n, f->group[g].comms, f->group[g].n_comms, &gn));
        sq += gn * gn;
        only = gn;
        n_groups++;
    }
    /* one group: its norm; several: the norm of their norms */
    *norm = n_groups == 1 ? only : sqrt(sq);
    if (!isfinite(*norm))
        return hp_error(HP_ERR_NUMERIC, "clip_grad_norm: total gradient norm is %g; gradients left unscaled", *norm);
    if (!(max_norm > 0)) return HP_OK;
    return hp_clip_grads_with_norm(hp_parallel_params(f->par), hp_parallel_num_params(f->par), max_norm, *norm);
}
