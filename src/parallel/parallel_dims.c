/* ParallelDims: validation of the parallel degrees (TorchTitan's _validate), rank
 * coordinates, the refusal of parallelisms not implemented yet, and the world and derived
 * meshes built with hp_mesh. */
#include "hyperparallel/parallel_dims.h"

#include <stdio.h>
#include <string.h>

const char *const hp_parallel_dims_names[HP_PD_NDIM] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

hp_status_t hp_parallel_dims_init(hp_parallel_dims_t *pd, int dp_replicate, int dp_shard, int cp, int tp, int pp,
                                  int ep, int etp, int world_size) {
    if (!pd) return hp_error(HP_ERR_INVALID_ARG, "hp_parallel_dims_init: NULL output");
    if (world_size < 1) return hp_error(HP_ERR_INVALID_ARG, "parallel dims: world size must be >= 1, got %d", world_size);
    struct { const char *key; int v; } deg[] = {
        {"data_parallel_replicate_degree", dp_replicate}, {"context_parallel_degree", cp},
        {"tensor_parallel_degree", tp}, {"pipeline_parallel_degree", pp},
        {"expert_parallel_degree", ep}, {"expert_tensor_parallel_degree", etp}};
    for (size_t i = 0; i < sizeof deg / sizeof deg[0]; i++)
        if (deg[i].v < 1)
            return hp_error(HP_ERR_INVALID_ARG, "config key 'parallelism.%s' must be >= 1, got %d", deg[i].key,
                            deg[i].v);
    if (dp_shard != -1 && dp_shard < 1)
        return hp_error(HP_ERR_INVALID_ARG,
                        "config key 'parallelism.data_parallel_shard_degree' must be -1 (use the remaining ranks) "
                        "or >= 1, got %d",
                        dp_shard);
    int64_t others = (int64_t)dp_replicate * cp * tp * pp;
    if (dp_shard == -1) {
        if (world_size % others != 0)
            return hp_error(HP_ERR_INVALID_ARG,
                            "parallel dims: parallelism.data_parallel_shard_degree=-1 needs the world size (%d) to be a "
                            "multiple of parallelism.data_parallel_replicate_degree * context_parallel_degree * "
                            "tensor_parallel_degree * pipeline_parallel_degree = %d*%d*%d*%d = %lld; hint: change "
                            "those degrees or the rank count",
                            world_size, dp_replicate, cp, tp, pp, (long long)others);
        dp_shard = (int)(world_size / others);
    }
    int64_t prod = others * dp_shard;
    if (prod != world_size)
        return hp_error(HP_ERR_INVALID_ARG,
                        "parallel dims: parallelism.data_parallel_replicate_degree * data_parallel_shard_degree * "
                        "context_parallel_degree * tensor_parallel_degree * pipeline_parallel_degree = "
                        "%d*%d*%d*%d*%d = %lld must equal the world size %d; hint: set "
                        "parallelism.data_parallel_shard_degree=-1 to use the remaining ranks",
                        dp_replicate, dp_shard, cp, tp, pp, (long long)prod, world_size);
    int64_t ep_pool = (int64_t)dp_shard * cp * tp;
    if (ep_pool % ep != 0)
        return hp_error(HP_ERR_INVALID_ARG,
                        "config key 'parallelism.expert_parallel_degree' = %d must divide "
                        "parallelism.data_parallel_shard_degree * context_parallel_degree * tensor_parallel_degree "
                        "= %d*%d*%d = %lld (expert parallelism borrows those ranks)",
                        ep, dp_shard, cp, tp, (long long)ep_pool);
    if (etp != 1 && etp != tp)
        return hp_error(HP_ERR_INVALID_ARG,
                        "config key 'parallelism.expert_tensor_parallel_degree' = %d must be 1 or "
                        "parallelism.tensor_parallel_degree (%d)",
                        etp, tp);
    /* ETP: the experts' tp dim is tp itself, so ep and efsdp split dp_shard*cp alone
     * (TorchTitan v0.2.2: efsdp = dp_shard*cp*tp / (etp*ep)) */
    if (etp > 1 && ((int64_t)dp_shard * cp) % ep != 0)
        return hp_error(HP_ERR_INVALID_ARG,
                        "config key 'parallelism.expert_parallel_degree' = %d must divide "
                        "parallelism.data_parallel_shard_degree * context_parallel_degree = %d*%d = %lld with "
                        "expert_tensor_parallel_degree = tensor_parallel_degree = %d (the experts' tp ranks are tp's); "
                        "hint: use a divisor of %lld, or expert_tensor_parallel_degree 1",
                        ep, dp_shard, cp, (long long)dp_shard * cp, etp, (long long)dp_shard * cp);
    *pd = (hp_parallel_dims_t){dp_replicate, dp_shard, cp, tp, pp, ep, etp, world_size};
    return HP_OK;
}

void hp_parallel_dims_coords(const hp_parallel_dims_t *pd, int rank, int coords[HP_PD_NDIM]) {
    const int size[HP_PD_NDIM] = {pd->pp, pd->dp_replicate, pd->dp_shard, pd->cp, pd->tp};
    for (int d = HP_PD_NDIM - 1; d >= 0; d--) {   /* tp fastest */
        coords[d] = rank % size[d];
        rank /= size[d];
    }
}

int hp_parallel_dims_batch_rank(const hp_parallel_dims_t *pd, int rank) {
    int c[HP_PD_NDIM];
    hp_parallel_dims_coords(pd, rank, c);
    return c[HP_PD_DP_REPLICATE] * pd->dp_shard + c[HP_PD_DP_SHARD];
}

int hp_parallel_dims_metrics_rank(const hp_parallel_dims_t *pd) {
    return pd->pp > 1 ? (pd->world_size / pd->pp) * (pd->pp - 1) : 0;
}

const char *hp_parallel_dims_str(const hp_parallel_dims_t *pd, char *buf, size_t n) {
    snprintf(buf, n, "pp=%d dp_replicate=%d dp_shard=%d cp=%d tp=%d ep=%d etp=%d (world %d)", pd->pp,
             pd->dp_replicate, pd->dp_shard, pd->cp, pd->tp, pd->ep, pd->etp, pd->world_size);
    return buf;
}

hp_status_t hp_parallel_dims_check_implemented(const hp_parallel_dims_t *pd, unsigned implemented) {
    struct { unsigned bit; const char *key; const char *what; int v; } p[] = {
        {HP_PAR_DP_REPLICATE, "data_parallel_replicate_degree", "data parallel replication (DDP/HSDP)", pd->dp_replicate},
        {HP_PAR_DP_SHARD, "data_parallel_shard_degree", "fully sharded data parallel (FSDP)", pd->dp_shard},
        {HP_PAR_TP, "tensor_parallel_degree", "tensor parallel", pd->tp},
        {HP_PAR_PP, "pipeline_parallel_degree", "pipeline parallel", pd->pp},
        {HP_PAR_CP, "context_parallel_degree", "context parallel", pd->cp},
        {HP_PAR_EP, "expert_parallel_degree", "expert parallel", pd->ep},
    };
    char have[256] = "";
    size_t o = 0;
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (implemented & p[i].bit)
            o += (size_t)snprintf(have + o, o < sizeof have ? sizeof have - o : 0, "%s%s", o ? ", " : "", p[i].key);
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        if (p[i].v > 1 && !(implemented & p[i].bit)) {
            const char *hint = p[i].bit == HP_PAR_DP_SHARD
                                   ? " (data_parallel_shard_degree=-1 takes every remaining rank: run on fewer ranks "
                                     "or set it to 1)"
                                   : "";
            return hp_error(HP_ERR_UNSUPPORTED,
                            "parallelism.%s=%d: %s is not implemented in this build yet; set "
                            "--parallelism.%s=1%s. Implemented with degree > 1: %s",
                            p[i].key, p[i].v, p[i].what, p[i].key, hint, o ? have : "none (single rank only)");
        }
    }
    if (pd->etp > 1 && !(implemented & HP_PAR_EP))
        return hp_error(HP_ERR_UNSUPPORTED,
                        "parallelism.expert_tensor_parallel_degree=%d: expert tensor parallel is not implemented in "
                        "this build yet; set it to 1",
                        pd->etp);
    return HP_OK;
}

void hp_parallel_meshes_destroy(hp_parallel_meshes_t *m) {
    if (!m) return;
    hp_mesh_destroy(m->sparse);
    hp_mesh_destroy(m->fsdp);
    hp_mesh_destroy(m->loss);
    hp_mesh_destroy(m->batch);
    hp_mesh_destroy(m->world);
    memset(m, 0, sizeof *m);
}

hp_status_t hp_parallel_dims_build_mesh(const hp_parallel_dims_t *pd, hp_comm_t world, hp_parallel_meshes_t *out) {
    if (!pd || !world || !out) return hp_error(HP_ERR_INVALID_ARG, "hp_parallel_dims_build_mesh: NULL argument");
    memset(out, 0, sizeof *out);
    if (hp_comm_size(world) != pd->world_size)
        return hp_error(HP_ERR_INVALID_ARG,
                        "parallel dims were validated for a world of %d ranks but the communicator has %d; hint: "
                        "pass the world size of the job to hp_parallel_dims_init",
                        pd->world_size, hp_comm_size(world));
    const int64_t shape[HP_PD_NDIM] = {pd->pp, pd->dp_replicate, pd->dp_shard, pd->cp, pd->tp};
    hp_status_t st = hp_mesh_create(world, HP_PD_NDIM, shape, hp_parallel_dims_names, &out->world);
    const char *batch[] = {"dp_replicate", "dp_shard"};
    const char *loss[] = {"dp_replicate", "dp_shard", "cp"};
    const char *fsdp[] = {"dp_shard", "cp"};
    if (st == HP_OK) st = hp_mesh_flatten(out->world, 2, batch, "batch", &out->batch);
    if (st == HP_OK) st = hp_mesh_flatten(out->world, 3, loss, "loss", &out->loss);
    if (st == HP_OK) st = hp_mesh_flatten(out->world, 2, fsdp, "fsdp", &out->fsdp);
    if (st == HP_OK && pd->ep > 1) {
        /* dp_shard, cp and tp are the innermost world dims, so (efsdp, ep) is their product
         * unflattened row-major: ranks of one ep group are consecutive. Under ETP (etp = tp)
         * (efsdp, ep) unflattens dp_shard x cp and etp is the world's tp dim, innermost. */
        const int64_t sparse[5] = {pd->pp, pd->dp_replicate, hp_parallel_dims_efsdp(pd), pd->ep, pd->etp};
        const char *names[5] = {"pp", "dp_replicate", "efsdp", "ep", "etp"};
        st = hp_mesh_create(world, pd->etp > 1 ? 5 : 4, sparse, names, &out->sparse);
    }
    if (st != HP_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", hp_last_error());
        hp_parallel_meshes_destroy(out);
        return hp_error(st, "building the device mesh: %s", msg);
    }
    return HP_OK;
}
