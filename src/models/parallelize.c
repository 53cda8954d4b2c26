/* hp_parallelize (the family's, from the registry), the decoder LLMs' parallelize (TorchTitan's
 * parallelize_llama: which public apply steps run, in which order, on which slices of the world
 * mesh; the four families of the registry compose this way and differ by their tensor-parallel
 * plan) and the pipelined composition (pipeline_llm). */
#include "hyperparallel/model_parallelize.h"
#include "hyperparallel/models.h"

#include <string.h>

#include "hyperparallel/ep.h"

hp_parallelize_options_t hp_parallelize_default_options(void) {
    hp_parallelize_options_t o;
    memset(&o, 0, sizeof o);
    o.sequence_parallel = o.loss_parallel = 1;
    o.cp = hp_cp_options_default();
    o.fsdp = hp_fsdp_default_options();
    o.fsdp.gradient_divide_factor = 1.0;
    o.pp.schedule = "1F1B";
    o.pp.microbatch_size = 1;
    o.pp.layers_per_stage = -1;
    o.ac = hp_ac_default_options();
    return o;
}

static hp_status_t slice_world(hp_parallel_t p, const hp_parallel_meshes_t *meshes, const char *dim, hp_mesh_t *out) {
    const char *names[1] = {dim};
    HP_TRY(hp_mesh_slice(meshes->world, 1, names, out));
    return hp_parallel_adopt_mesh(p, *out);
}

/* FSDP's mesh: (dp_shard) or HSDP (dp_replicate, dp_shard); under context parallel dp_shard x cp
 * flattened, FSDP then sums the cp ranks' gradients too. */
static hp_status_t fsdp_mesh(hp_parallel_t p, const hp_parallel_dims_t *pd, const hp_parallel_meshes_t *meshes,
                             hp_mesh_t *out) {
    const char *names[2] = {"dp_replicate", "dp_shard"};
    const int two = pd->dp_replicate > 1;
    if (pd->cp == 1) {
        HP_TRY(hp_mesh_slice(meshes->world, two ? 2 : 1, two ? names : names + 1, out));
        return hp_parallel_adopt_mesh(p, *out);
    }
    const char *sc[2] = {"dp_shard", "cp"};
    hp_mesh_t flat = NULL;
    HP_TRY(hp_mesh_flatten(meshes->world, 2, sc, "dp_shard_cp", &flat));
    HP_TRY(hp_parallel_adopt_mesh(p, flat));
    if (two) {
        const char *rn[1] = {"dp_replicate"};
        hp_mesh_t rep = NULL;
        HP_TRY(hp_mesh_slice(meshes->world, 1, rn, &rep));
        hp_status_t cs = hp_mesh_concat(rep, flat, out);
        hp_mesh_destroy(rep);
        HP_TRY(cs);
    } else {
        HP_TRY(hp_mesh_slice(flat, 1, (const char *[]){"dp_shard_cp"}, out));
    }
    return hp_parallel_adopt_mesh(p, *out);
}

hp_status_t hp_parallelize(hp_parallel_t p, const hp_parallel_dims_t *pd, const hp_parallel_meshes_t *meshes,
                           const hp_parallelize_options_t *o) {
    const hp_model_config_t *mc = hp_model_config(hp_parallel_part(p, 0));
    const hp_model_spec_t *spec = hp_model_spec_find(mc->name);
    if (!spec || !spec->parallelize)
        return hp_error(HP_ERR_UNSUPPORTED, "model %s has no parallelize in the model registry; hint: give its spec "
                        "one (docs/architecture.md, \"Adding a model family\")", mc->name);
    return spec->parallelize(p, pd, meshes, o);
}

hp_status_t hp_parallelize_decoder(hp_parallel_t p, const hp_parallel_dims_t *pd, const hp_parallel_meshes_t *meshes,
                                   const hp_parallelize_options_t *o) {
    const hp_model_config_t *mc = hp_model_config(hp_parallel_part(p, 0));
    hp_mesh_t tp_mesh = NULL, cp_mesh = NULL;
    if (pd->cp > 1) HP_TRY(slice_world(p, meshes, "cp", &cp_mesh));
    if (pd->tp > 1) {   /* TorchTitan's plan on the tp mesh, before the weights are drawn */
        HP_TRY(slice_world(p, meshes, "tp", &tp_mesh));
        hp_tp_plan_entry_t plan[32];
        const hp_tp_plan_entry_t *use = o->tp_plan;
        int n = o->n_tp_plan;
        if (!use) {
            const hp_model_spec_t *spec = hp_model_spec_find(mc->name);
            if (!spec || !spec->tp_plan)
                return hp_error(HP_ERR_UNSUPPORTED, "parallelism.tensor_parallel_degree %d: model %s has no tensor-parallel "
                                "plan in the model registry", pd->tp, mc->name);
            n = spec->tp_plan(mc, o->sequence_parallel, o->loss_parallel, plan, 32);
            use = plan;
        }
        HP_TRY(hp_apply_tp(p, tp_mesh, use, n));
    }
    if (mc->moe_experts > 0 && (pd->ep > 1 || pd->tp > 1))
        HP_TRY(hp_apply_ep(p, pd->ep > 1 ? meshes->sparse : NULL, tp_mesh, o->sequence_parallel));
    if (cp_mesh) HP_TRY(hp_apply_cp(p, cp_mesh, &o->cp));
    HP_TRY(hp_apply_ac_options(p, &o->ac));
    if (pd->dp_shard > 1 || pd->cp > 1) {
        hp_mesh_t dp_mesh = NULL;
        HP_TRY(fsdp_mesh(p, pd, meshes, &dp_mesh));
        hp_fsdp_options_t fo = o->fsdp;
        /* reshard_after_forward Default under pipelining: TorchTitan's `not pp_enabled` (no
         * all-gather per micro-batch) */
        if (hp_parallel_is_pipelined(p) && fo.reshard_after_forward == HP_FSDP_RESHARD_DEFAULT)
            fo.reshard_after_forward = 0;
        HP_TRY(hp_apply_fsdp(p, dp_mesh, &fo));
    } else if (hp_parallel_is_pipelined(p) && pd->ep > 1) {
        return hp_error(HP_ERR_UNSUPPORTED, "parallelism.expert_parallel_degree %d with pipeline_parallel_degree %d "
                        "needs FSDP of the dense parameters inside the stages (data_parallel_shard_degree x "
                        "context_parallel_degree > 1, here %d)", pd->ep, pd->pp, pd->dp_shard * pd->cp);
    } else if (pd->dp_replicate > 1) {
        HP_TRY(hp_apply_ddp(p, hp_mesh_get_comm(meshes->batch, 0), NULL));
        if (o->zero_stage == 1) HP_TRY(hp_apply_zero(p, hp_mesh_get_comm(meshes->batch, 0)));
    }
    /* TorchTitan's order: parallelize, then init_weights. Every parameter is placed now: each
     * rank allocates (the parts without FSDP) and draws only what it holds, at its global
     * indices, so every layout starts from the single rank's weights */
    return hp_parallel_init_weights(p, o->seed);
}

hp_status_t hp_parallelize_pipeline(const hp_model_config_t *cfg, const hp_parallel_dims_t *pd,
                                    const hp_parallel_meshes_t *meshes, hp_comm_t world, int batch, int seq_len,
                                    const hp_parallelize_options_t *o, hp_parallel_t *out) {
    *out = NULL;
    hp_parallel_t p = NULL;
    /* the split and the stages' set-up differ per pp rank (a stage may fail where another does
     * not): every rank agrees before the next collective */
    hp_status_t s = hp_comm_agree(world, hp_pipeline_split(cfg, pd, hp_comm_rank(world), batch, seq_len, &o->pp, &p),
                                  NULL);
    if (s == HP_OK) s = hp_comm_agree(world, hp_parallelize(p, pd, meshes, o), NULL);
    if (s == HP_OK) s = hp_apply_pp(p, world, meshes->world);
    if (s != HP_OK) {
        hp_parallel_destroy(p);
        return s;
    }
    *out = p;
    return HP_OK;
}
