/* The memory plan: each rank's peak from the config, by building the rank's parts empty and
 * placing their parameters as the apply steps would (no mesh, no collective, nothing of the
 * model's size allocated), then summing what the run allocates (docs/memory.md). The terms
 * follow the allocators: FSDP's hp_fsdp_plan_memory, tensor parallel's wrappers sized by
 * hp_tp_plan_model, the contexts by hp_model_ctx_size, the optimizer's arena rule. */
#include "hyperparallel/memory_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/ep.h"
#include "hyperparallel/zero.h"
#include "parallel/parallel-impl.h"
#include "parallel/tp-impl.h"

/* The optimizer's arena (optim.c): per state tensor one 64-byte rounded slice of the local
 * parameter, plus the arena's own 64 bytes. */
static size_t optim_bytes(const int64_t *numel, int n, int states) {
    size_t b = 0;
    for (int i = 0; i < n; i++) b += (size_t)states * hp_arena_round(sizeof(float) * (size_t)numel[i]);
    return b + 64;
}

/* The experts' local shapes under expert parallel (ep.c): Shard(0) over ep, the hidden F over
 * etp (or over tp with ep 1), and expert FSDP over efsdp (dim 0, or dim 1 when efsdp x ep
 * exceeds the experts). */
static void place_experts(hp_model_t m, const hp_parallel_dims_t *pd) {
    const int efsdp = pd->ep > 1 ? hp_parallel_dims_efsdp(pd) : 1;
    const int f_split = pd->ep > 1 ? pd->etp : pd->tp;
    hp_param_t *P = hp_model_params(m);
    for (int i = 0; i < hp_model_num_params(m); i++) {
        if (!hp_ep_is_expert_param(&P[i])) continue;
        hp_tensor_t *ts[2] = {&P[i].value.local, &P[i].grad.local};
        const int f_dim = strstr(P[i].name, ".moe.experts.w2") ? 2 : 1;
        for (int k = 0; k < 2; k++) {
            hp_tensor_t *t = ts[k];
            const int64_t E = t->shape[0];
            t->shape[0] = E / pd->ep;
            if (f_split > 1) t->shape[f_dim] /= f_split;
            if (efsdp > 1) {
                if ((int64_t)efsdp * pd->ep > E) t->shape[1] /= efsdp;
                else t->shape[0] /= efsdp;
            }
            int64_t st = 1;
            for (int a = t->ndim - 1; a >= 0; a--) {
                t->stride[a] = st;
                st *= t->shape[a];
            }
        }
    }
}

typedef struct stage_in {
    int u0, u1, B, T, n_ctx, split, first, last, prev_remote, next_remote, n_mb;
} stage_in_t;

/* One part of this rank (the whole model, or one pipeline stage): its terms added to *r. */
static hp_status_t plan_part(const hp_memory_plan_input_t *in, const stage_in_t *si, hp_memory_plan_t *r) {
    const hp_parallel_dims_t *pd = &in->dims;
    const hp_model_config_t *mc = in->model;
    hp_model_t m = NULL;
    hp_tp_t tp = NULL;
    hp_tp_plan_entry_t *mine = NULL;
    int64_t *numel = NULL;
    hp_status_t st = hp_model_create_range_empty(mc, si->u0, si->u1, si->B, si->T, &m);
    if (st == HP_OK && pd->tp > 1) {   // the entries the stage holds, as hp_apply_tp
        mine = hp_calloc((size_t)in->n_tp_plan + 1, sizeof *mine);
        if (!mine) st = HP_ERR_OOM;
        const int k = mine ? hp_parallel_plan_entries_held(m, in->tp_plan, in->n_tp_plan, mine) : 0;
        if (st == HP_OK) st = hp_tp_plan_model(&tp, m, pd->tp, mine, k);
    }
    if (st == HP_OK && mc->moe_experts > 0 && (pd->ep > 1 || pd->tp > 1)) place_experts(m, pd);
    if (st == HP_OK && in->ac.every_k > 0) st = hp_model_set_activation_checkpoint_options(m, &in->ac);
    if (st == HP_OK && in->bf16_compute) st = hp_model_set_compute_dtype(m, HP_BF16);
    if (st == HP_OK) st = hp_model_compact_storage(m);   // the layout of the local sizes
    if (st != HP_OK) goto done;
    /* contexts: the model's own (B, T/cp), or the pipeline runtime's pool of micro-batches */
    const int cp_rows = si->T / (pd->cp > 0 ? pd->cp : 1);
    size_t ab = 0, wb = 0;
    hp_model_ctx_size(m, si->B, cp_rows, si->split ? HP_MODEL_CTX_SPLIT_BACKWARD : 0, &ab, &wb);
    r->activations += (size_t)si->n_ctx * (ab + wb);
    r->n_contexts += si->n_ctx;
    r->comm += hp_tp_buffer_bytes(tp);
    if (pd->pp > 1) {   // the p2p buffers (pp.c): per micro-batch an input, output and gradients
        const size_t act = sizeof(float) * (size_t)si->B * (size_t)cp_rows * (size_t)mc->dim;
        const int bufs = si->prev_remote + !si->last + si->next_remote + !si->first;
        r->comm += (size_t)si->n_mb * (size_t)bufs * act;
    }
    /* parameters and gradients: FSDP's padded shards and workspace, or the local storage */
    const int np = hp_model_num_params(m);
    const hp_param_t *P = hp_model_params(m);
    numel = hp_calloc((size_t)np + 1, sizeof *numel);
    if (!numel) {
        st = HP_ERR_OOM;
        goto done;
    }
    const int W = pd->dp_shard * pd->cp;
    for (int i = 0; i < np; i++) {
        const hp_tensor_t *t = &P[i].value.local;
        numel[i] = hp_tensor_numel(t);
        const int fsdp_sharded = W > 1 && !(pd->ep > 1 && hp_ep_is_expert_param(&P[i]));
        if (fsdp_sharded) {   // FSDP rank 0's rows (the largest piece of torch.chunk)
            const int64_t d0 = t->shape[0], rest = numel[i] / (d0 > 0 ? d0 : 1);
            numel[i] = (d0 + W - 1) / W * rest;
        }
        if (P[i].frozen) numel[i] = 0;   // LoRA's frozen base: no optimizer state (optim.c)
    }
    if (W > 1) {
        hp_fsdp_options_t fo = in->fsdp;
        if (pd->pp > 1 && fo.reshard_after_forward == HP_FSDP_RESHARD_DEFAULT) fo.reshard_after_forward = 0;
        if (pd->ep > 1) fo.ignored_params = hp_ep_is_expert_param;
        size_t pb = 0, gb = 0, ws = 0, rs = 0;
        /* under pipelining FSDP reduces after the step's last micro-batch only (pipeline.c) */
        st = hp_fsdp_plan_memory(m, W, pd->dp_replicate, &fo, pd->pp > 1 && si->n_mb > 1, &pb, &gb, &ws, &rs);
        if (st != HP_OK) goto done;
        r->params += pb;
        r->grads += gb;
        r->gathered += ws;
        if (rs > r->mpi) r->mpi = rs;
    } else {
        const size_t n = hp_model_storage_floats(m);
        r->params += sizeof(float) * (n ? n : 16);
        r->grads += sizeof(float) * (n ? n : 16);
        /* DDP's buckets (ddp.c): a flat copy of every gradient; not with tied embeddings,
         * pipeline stages or experts (one all-reduce per gradient then) */
        if (pd->dp_replicate > 1 && pd->pp == 1 && !mc->tie_embeddings && mc->moe_experts <= 0) {
            r->comm += sizeof(float) * n;
            /* the all-reduce's temporary: one bucket (25 MiB cap, DDP's default) */
            const size_t bucket = sizeof(float) * n < (size_t)25 << 20 ? sizeof(float) * n : (size_t)25 << 20;
            if (bucket > r->mpi) r->mpi = bucket;
        }
    }
    if (in->zero_stage == 1 && pd->dp_replicate > 1) {   // the largest ZeRO-1 share
        int *owner = hp_calloc((size_t)np + 1, sizeof(int));
        if (!owner) {
            st = HP_ERR_OOM;
            goto done;
        }
        hp_zero_partition(numel, np, pd->dp_replicate, owner);
        size_t best = 0;
        for (int q = 0; q < pd->dp_replicate; q++) {
            int k = 0;
            for (int i = 0; i < np; i++)
                if (owner[i] == q) numel[k++] = hp_tensor_numel(&P[i].value.local);
            const size_t b = optim_bytes(numel, k, in->optim_states);
            if (b > best) best = b;
            for (int i = 0; i < np; i++) numel[i] = hp_tensor_numel(&P[i].value.local);   // restored for the next
        }
        free(owner);
        r->optim += best;
    } else {
        r->optim += optim_bytes(numel, np, in->optim_states);
    }
done:
    free(numel);
    free(mine);
    hp_tp_destroy(tp);
    hp_model_destroy(m);
    return st;
}

hp_status_t hp_memory_plan(const hp_memory_plan_input_t *in, hp_memory_plan_t *out) {
    if (!in || !out || !in->model || in->batch < 1 || in->seq_len < 1)
        return hp_error(HP_ERR_INVALID_ARG, "hp_memory_plan: a model config, batch and seq_len >= 1 are required");
    memset(out, 0, sizeof *out);
    const hp_parallel_dims_t *pd = &in->dims;
    if (pd->tp > 1 && (!in->tp_plan || in->n_tp_plan < 1))
        return hp_error(HP_ERR_INVALID_ARG, "hp_memory_plan: tensor_parallel_degree %d needs the model's TP plan", pd->tp);
    const int nu = hp_model_describe_params(in->model, 0, 1, NULL, 0) >= 0 ? in->model->n_layers + 2 : -1;
    if (nu < 0) return hp_error_prefix(HP_ERR_INVALID_ARG, "hp_memory_plan: ");
    if (pd->pp <= 1) {
        stage_in_t si = {0, nu, in->batch, in->seq_len, 1, 0, 1, 1, 0, 0, 1};
        HP_TRY(plan_part(in, &si, out));
    } else {
        hp_pipeline_layout_t *pl = hp_calloc(1, sizeof *pl);
        if (!pl) return HP_ERR_OOM;
        hp_status_t st = hp_pipeline_plan_layout(in->model, pd, in->batch, &in->pp, pl);
        for (int r = 0; st == HP_OK && r < pd->pp; r++) {   // the pp rank asked for, or the largest peak
            if (in->pp_rank >= 0 && r != in->pp_rank) continue;
            hp_memory_plan_t here;
            memset(&here, 0, sizeof here);
            here.pp_rank = r;
            for (int s = 0; st == HP_OK && s < pl->S; s++) {
                if (pl->stage_to_rank[s] != r) continue;
                stage_in_t si = {pl->unit_lo[s], pl->unit_lo[s + 1], in->pp.microbatch_size, in->seq_len,
                                 pl->n_ctx[s], pl->split[s], s == 0, s == pl->S - 1,
                                 s > 0 && pl->stage_to_rank[s - 1] != r, s + 1 < pl->S && pl->stage_to_rank[s + 1] != r,
                                 pl->n_microbatches};
                st = plan_part(in, &si, &here);
            }
            here.peak = here.params + here.grads + here.optim + here.gathered + here.activations + here.comm + here.mpi;
            if (st == HP_OK && (in->pp_rank >= 0 || r == 0 || here.peak > out->peak)) *out = here;
        }
        free(pl);
        HP_TRY(st);
    }
    out->base = in->base_bytes;
    out->peak = out->params + out->grads + out->optim + out->gathered + out->activations + out->comm + out->mpi +
                out->base;
    return HP_OK;
}

const char *hp_memory_plan_str(const hp_memory_plan_t *p, char *buf, size_t n) {
    const double mib = 1048576.0;
    snprintf(buf, n, "%.2f GiB = parameters %.1f MiB + gradients %.1f MiB + optimizer %.1f MiB + FSDP buffers %.1f "
             "MiB + activations %.1f MiB (%d context%s) + communication buffers %.1f MiB + MPI temporaries %.1f MiB + "
             "process %.1f MiB",
             (double)p->peak / (mib * 1024.0), p->params / mib, p->grads / mib, p->optim / mib, p->gathered / mib,
             p->activations / mib, p->n_contexts, p->n_contexts == 1 ? "" : "s", p->comm / mib, p->mpi / mib,
             p->base / mib);
    return buf;
}
