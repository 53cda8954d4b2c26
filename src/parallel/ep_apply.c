/* hp_apply_ep: expert parallel of the MoE layers as a composition step (TorchTitan's
 * apply_moe_ep_tp). The sparse mesh's dims choose the mode: experts Shard(0) over ep, the
 * experts' hidden F over etp (ETP), FSDP of the experts over efsdp, or with ep 1 the experts'
 * F over the dense tp mesh. Expert gradients are summed over dp_replicate after backward and
 * counted by the norm over the experts' own mesh; under sequence parallel around the MoE layers
 * the router's and shared experts' gradients are summed over tp. Applied to every part (a
 * pipeline stage: every rank of an ep group is in the same stage, the sparse mesh's pp dim being
 * outermost, and runs the same action list, so their all-to-alls line up). */
#include "parallel/parallel-impl.h"

#include <stdlib.h>

/* The size of the sparse mesh's dim `name` (1 when it has none). */
static int dim_size(hp_mesh_t m, const char *name) {
    int d = -1;
    if (!m || hp_mesh_dim_index(m, name, &d) != HP_OK) return 1;
    return (int)hp_mesh_size(m, d);
}

/* After the step's backward: the experts' gradients summed over the ranks holding the same
 * experts (the sparse mesh's dp_replicate). */
static hp_status_t expert_all_reduce(void *ctx, hp_param_t *params, int n) {
    hp_parallel_t p = ctx;
    hp_comm_t gc = hp_mesh_get_comm(p->ep_rep_mesh, 0);
    for (int i = 0; i < n; i++) {
        hp_tensor_t *g = &params[i].grad.local;
        if (!hp_ep_is_expert_param(&params[i]) || hp_tensor_numel(g) == 0) continue;   // PP: another stage's
        HP_TRY(hp_all_reduce(g->data, g->data, (size_t)hp_tensor_numel(g), HP_F32, HP_SUM, gc, NULL));
    }
    return HP_OK;
}

/* Sequence parallel around MoE layers: the router and shared experts saw this tp rank's tokens. */
static hp_status_t sp_reduce(void *ctx, hp_param_t *params, int n) {
    hp_parallel_t p = ctx;
    return hp_ep_reduce_sequence_parallel_grads(p->ep_sp, params, n);
}

/* A slice of the sparse mesh, destroyed with p. */
static hp_status_t slice(hp_parallel_t p, hp_mesh_t sparse, int n, const char *const *names, hp_mesh_t *out) {
    HP_TRY(hp_mesh_slice(sparse, n, names, out));
    return hp_parallel_adopt_mesh(p, *out);
}

hp_status_t hp_apply_ep(hp_parallel_t p, hp_mesh_t sparse, hp_mesh_t tp_mesh, int sequence_parallel) {
    const hp_model_config_t *mc = hp_model_config(p->parts[0]);
    if (mc->moe_experts <= 0) return hp_error(HP_ERR_INVALID_ARG, "hp_apply_ep: model %s has no MoE layer", mc->name);
    const int ep = dim_size(sparse, "ep"), etp = dim_size(sparse, "etp"), efsdp = dim_size(sparse, "efsdp");
    const int tp = tp_mesh ? (int)hp_mesh_size(tp_mesh, 0) : 1;
    const int borrow = ep > 1 && tp > 1 && etp == 1;   /* EP borrows the tp ranks */
    static const char *const drn[1] = {"dp_replicate"}, *const epn[1] = {"ep"};
    hp_comm_t comms[HP_GRAD_MAX_COMMS];
    int nc = 0;
    if (tp > 1 && !borrow) comms[nc++] = hp_mesh_get_comm(tp_mesh, 0);   /* the dense TP plan's dim first */
    if (ep > 1) {
        if (etp > 1 || efsdp > 1) {   /* ETP (ep, etp), expert FSDP (efsdp, ep), both (efsdp, ep, etp) */
            static const char *const n_etp[2] = {"ep", "etp"}, *const n_efsdp[3] = {"efsdp", "ep", "etp"};
            const int with_efsdp = efsdp > 1;
            HP_TRY(slice(p, sparse, with_efsdp ? (etp > 1 ? 3 : 2) : 2, with_efsdp ? n_efsdp : n_etp, &p->etp_mesh));
            comms[nc++] = hp_mesh_get_comm(p->etp_mesh, with_efsdp ? 1 : 0);   /* ep */
            if (with_efsdp) comms[nc++] = hp_mesh_get_comm(p->etp_mesh, 0);   /* efsdp */
        }
        HP_TRY(slice(p, sparse, 1, epn, &p->ep_mesh));
        if (!p->etp_mesh) comms[nc++] = hp_mesh_get_comm(p->ep_mesh, 0);
        if (dim_size(sparse, "dp_replicate") > 1) HP_TRY(slice(p, sparse, 1, drn, &p->ep_rep_mesh));
    }
    for (int i = 0; i < p->n_parts; i++) {
        hp_model_t m = p->parts[i];
        if (ep > 1 && (etp > 1 || efsdp > 1)) {
            HP_TRY(etp > 1 && efsdp == 1 ? hp_ep_parallelize_model_etp(m, p->etp_mesh, &p->part[i].ep)
                                         : hp_ep_parallelize_model_efsdp(m, p->etp_mesh, &p->part[i].ep));
        } else if (ep > 1) {
            HP_TRY(hp_ep_parallelize_model(m, p->ep_mesh, &p->part[i].ep));
        } else if (tp > 1) {   /* TP of the experts alone: hidden F sharded over tp, partial outputs all-reduced */
            HP_TRY(hp_ep_tensor_parallel_experts(m, tp_mesh, &p->part[i].ep_tp));
        }
    }
    if (sequence_parallel && tp > 1) {
        if (p->n_parts > 1)
            return hp_error(HP_ERR_UNSUPPORTED, "hp_apply_ep: sequence parallel around MoE layers is not implemented "
                            "inside pipeline stages; hint: parallelism.enable_sequence_parallel=false");
        p->ep_sp = p->part[0].ep ? p->part[0].ep : p->part[0].ep_tp;
        p->sp_mesh = tp_mesh;
        HP_TRY(hp_ep_enable_sequence_parallel(p->ep_sp, p->parts[0], tp_mesh));
        HP_TRY(hp_grad_finalizer_add_reduction(&p->fin, HP_GRAD_PHASE_TENSOR_PARALLEL, sp_reduce, p));
    }
    if (ep == 1) return HP_OK;   /* the experts are dense parameters of the TP plan's group */
    if (p->ep_rep_mesh) HP_TRY(hp_grad_finalizer_add_reduction(&p->fin, HP_GRAD_PHASE_EXPERT, expert_all_reduce, p));
    return hp_grad_finalizer_set_comms(&p->fin, HP_GRAD_GROUP_EXPERT, comms, nc);
}
