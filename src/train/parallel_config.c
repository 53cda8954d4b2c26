/* The job config's parallelism keys -> ParallelDims, the parallelize options and the layout
 * checks named by config key (parallel_config.h). Everything here is arithmetic on the config
 * and the model config: identical on every rank, no communication. */
#define _GNU_SOURCE
#include "hyperparallel/parallel_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parallelisms this build implements: replicated data parallel, FSDP / HSDP, tensor / sequence
 * parallel, pipeline parallel, expert parallel, context parallel; compositions not supported are
 * refused by key. */
#define HP_TRAINER_IMPLEMENTED (HP_PAR_DP_REPLICATE | HP_PAR_DP_SHARD | HP_PAR_TP | HP_PAR_PP | HP_PAR_EP | HP_PAR_CP)

static hp_status_t narrow(const char *key, int64_t v, int *out) {
    if (v < -1 || v > (1 << 24))
        return hp_error(HP_ERR_INVALID_ARG, "config key 'parallelism.%s' = %lld is out of range", key, (long long)v);
    *out = (int)v;
    return HP_OK;
}

hp_status_t hp_parallel_dims_from_config(const hp_config_t *cfg, int world_size, hp_parallel_dims_t *out) {
    int r = 0, s = 0, c = 0, t = 0, p = 0, e = 0, et = 0;
    HP_TRY(narrow("data_parallel_replicate_degree", cfg->parallelism.data_parallel_replicate_degree, &r));
    HP_TRY(narrow("data_parallel_shard_degree", cfg->parallelism.data_parallel_shard_degree, &s));
    HP_TRY(narrow("context_parallel_degree", cfg->parallelism.context_parallel_degree, &c));
    HP_TRY(narrow("tensor_parallel_degree", cfg->parallelism.tensor_parallel_degree, &t));
    HP_TRY(narrow("pipeline_parallel_degree", cfg->parallelism.pipeline_parallel_degree, &p));
    HP_TRY(narrow("expert_parallel_degree", cfg->parallelism.expert_parallel_degree, &e));
    HP_TRY(narrow("expert_tensor_parallel_degree", cfg->parallelism.expert_tensor_parallel_degree, &et));
    return hp_parallel_dims_init(out, r, s, c, t, p, e, et, world_size);
}


/* activation_checkpoint -> the AC options (TorchTitan: full = every block; selective with an
 * integer k = every k-th block, with "op" = op-level SAC in every block; memory_budget = torch's
 * knapsack under memory_budget in every block). */
static hp_status_t ac_options(const hp_config_t *c, hp_ac_options_t *o) {
    const char *mode = c->activation_checkpoint.mode, *opt = c->activation_checkpoint.selective_ac_option;
    *o = hp_ac_default_options();
    o->memory_budget = c->activation_checkpoint.memory_budget;
    const char *force = c->activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns;
    if (strlen(force) >= sizeof o->force_recompute)
        return hp_error(HP_ERR_INVALID_ARG, "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns is "
                        "%zu characters, expected at most %zu", strlen(force), sizeof o->force_recompute - 1);
    memcpy(o->force_recompute, force, strlen(force) + 1);   // fits: checked above
    if (strcmp(mode, "none") == 0) return HP_OK;
    if (strcmp(mode, "full") == 0) { o->every_k = 1; return HP_OK; }
    if (strcmp(mode, "memory_budget") == 0) {
        o->every_k = 1;
        o->policy = HP_AC_BUDGET;
        return hp_ac_options_check(o, "activation_checkpoint.memory_budget");
    }
    if (strcmp(mode, "selective") != 0)
        return hp_error(HP_ERR_INVALID_ARG, "activation_checkpoint.mode = %s, expected none, full, selective or "
                        "memory_budget", mode);
    if (strcmp(opt, "op") == 0) {
        o->every_k = 1;
        o->policy = HP_AC_OP;
        return HP_OK;
    }
    char *end = NULL;
    errno = 0;
    long k = strtol(opt, &end, 10);
    if (end == opt || *end != '\0' || errno != 0 || k < 0 || k > 1000000 || opt[0] == '-' || opt[0] == '+')
        return hp_error(HP_ERR_INVALID_ARG,
                        "activation_checkpoint.selective_ac_option = '%s', expected a non-negative integer k "
                        "(checkpoint every k-th transformer block; 0 = every block, as TorchTitan) or op; hint: e.g. --activation_checkpoint.selective_ac_option=2",
                        opt);
    o->every_k = k == 0 ? 1 : (int)k;   // TorchTitan: `not ac_freq` wraps every block
    return HP_OK;
}

/* fully_shard's options: sums (the loss is globally normalised: divide factor 1), the mixed
 * precision policy, reshard_after_forward (default: FSDP's own, which the model's parallelize
 * turns off under pipelining as TorchTitan's `not pp_enabled`). */
static hp_fsdp_options_t fsdp_options(const hp_config_t *c) {
    hp_fsdp_options_t fo = hp_fsdp_default_options();
    fo.gradient_divide_factor = 1.0;
    fo.mp.param_dtype = strcmp(c->training.mixed_precision_param, "bfloat16") == 0 ? HP_BF16 : HP_F32;
    fo.mp.reduce_dtype = strcmp(c->training.mixed_precision_reduce, "bfloat16") == 0 ? HP_BF16 : HP_F32;
    const char *raf = c->parallelism.fsdp_reshard_after_forward;
    fo.reshard_after_forward = strcmp(raf, "always") == 0 ? 1 : strcmp(raf, "never") == 0 ? 0
                             : HP_FSDP_RESHARD_DEFAULT;
    return fo;
}

/* TP shards attention heads and KV heads (wq/wk/wv/wo), the FFN hidden dim (w1/w3/w2) and the
 * vocabulary (tok_embeddings, output): the degree must divide each. Checked here, where the
 * config keys are known, before the library's generic layout errors. */
static hp_status_t check_tp_layout(const hp_config_t *c, const hp_model_config_t *mc, int tp) {
    struct { const char *what; int n; } dims[] = {
        {"the model's n_heads", mc->n_heads}, {"the model's n_kv_heads", mc->n_kv_heads},
        {"the model's FFN hidden dim", mc->hidden_dim}, {"the vocabulary size", mc->vocab_size}};
    int g = 0;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        int a = g, b = dims[i].n;
        while (b) { int r = a % b; a = b; b = r; }
        g = a;
    }
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (dims[i].n % tp == 0) continue;
        char ok[256];
        size_t o = 0;
        for (int d = 1; d <= g && o + 16 < sizeof ok; d++)
            if (g % d == 0) o += (size_t)snprintf(ok + o, sizeof ok - o, "%s%d", o ? ", " : "", d);
        char from[HP_CONFIG_STR_MAX + 64] = "";
        if (i == 3) snprintf(from, sizeof from, " (of tokenizer.path '%.480s')", c->tokenizer.path);
        else snprintf(from, sizeof from, " (model.name %.200s, model.flavor %.200s)", c->model.name, c->model.flavor);
        return hp_error(HP_ERR_INVALID_ARG, "parallelism.tensor_parallel_degree %d does not divide %s %d%s; tensor "
                        "parallel shards n_heads %d, n_kv_heads %d, the FFN hidden dim %d and the vocabulary %d; "
                        "hint: valid parallelism.tensor_parallel_degree values for this model and tokenizer: %s",
                        tp, dims[i].what, dims[i].n, from, mc->n_heads, mc->n_kv_heads, mc->hidden_dim,
                        mc->vocab_size, ok);
    }
    return HP_OK;
}

/* The CP keys against the run, named by key before the library's generic errors: the
 * balancer's divisibility of seq_len, the Ulysses degree against cp and the (per-TP-rank)
 * heads, and sequence parallel's split of the local rows. */
static hp_status_t check_cp_layout(const hp_config_t *c, const hp_model_config_t *mc, const hp_parallel_dims_t *pd) {
    hp_cp_rotate_t rot;
    hp_cp_balancer_t lb;
    HP_TRY(hp_cp_rotate_parse(c->parallelism.context_parallel_rotate_method,
                              "parallelism.context_parallel_rotate_method", &rot));
    HP_TRY(hp_cp_balancer_parse(c->parallelism.context_parallel_load_balancer,
                                "parallelism.context_parallel_load_balancer", &lb));
    const int cp = pd->cp, U = (int)c->parallelism.context_parallel_ulysses_degree, T = (int)c->training.seq_len;
    if (cp == 1 && U == 1) return HP_OK;
    if (U < 1 || cp % U != 0)
        return hp_error(HP_ERR_INVALID_ARG, "parallelism.context_parallel_ulysses_degree = %d does not divide "
                        "parallelism.context_parallel_degree = %d; hint: cp = ulysses x ring degree, e.g. "
                        "--parallelism.context_parallel_ulysses_degree=1 (ring only) or %d (Ulysses only)", U, cp, cp);
    const int d = lb == HP_CP_BALANCE_HEADTAIL ? 2 * cp : cp;
    if (T % d != 0)
        return hp_error(HP_ERR_INVALID_ARG, "training.seq_len = %d is not divisible by %s = %d "
                        "(parallelism.context_parallel_degree = %d, context_parallel_load_balancer = %s); hint: "
                        "use a seq_len that is a multiple of %d%s", T, d == cp ? "cp" : "2 x cp", d, cp,
                        c->parallelism.context_parallel_load_balancer, d,
                        d == cp ? "" : " or --parallelism.context_parallel_load_balancer=none");
    const int hq = mc->n_heads / pd->tp, hkv = mc->n_kv_heads / pd->tp;
    if (hq % U != 0 || hkv % U != 0)
        return hp_error(HP_ERR_INVALID_ARG, "parallelism.context_parallel_ulysses_degree = %d does not divide the "
                        "model's %d heads and %d kv heads per tensor-parallel rank (n_heads %d, n_kv_heads %d, "
                        "tensor_parallel_degree %d; model.name %s, model.flavor %s); hint: use a Ulysses degree "
                        "that divides both, e.g. 1", U, hq, hkv, mc->n_heads, mc->n_kv_heads, pd->tp, c->model.name,
                        c->model.flavor);
    if (pd->tp > 1 && c->parallelism.enable_sequence_parallel && (T / cp) % pd->tp != 0)
        return hp_error(HP_ERR_INVALID_ARG, "training.seq_len / parallelism.context_parallel_degree = %d rows per "
                        "rank are not divisible by parallelism.tensor_parallel_degree %d (sequence parallel splits "
                        "them); hint: use a seq_len that is a multiple of %d or "
                        "--parallelism.enable_sequence_parallel=false", T / cp, pd->tp, cp * pd->tp);
    return HP_OK;
}

/* Layouts the MoE layers do not support yet, named by key. */
static hp_status_t moe_check_layout(const hp_config_t *c, const hp_model_config_t *mc, const hp_parallel_dims_t *pd) {
    if (pd->ep > 1 && mc->moe_experts <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'parallelism.expert_parallel_degree' = %d needs an MoE model; "
                        "model.name = %s is dense; hint: use deepseek_v3 or qwen3_moe, or set the degree to 1",
                        pd->ep, mc->name);
    /* ETP: experts over the sparse [efsdp, ep, etp] (ep x efsdp = dp_shard x cp, etp = tp) */
    const int etp = pd->ep > 1 && pd->tp > 1 && pd->etp == pd->tp;
    if (pd->etp > 1 && (!etp || mc->moe_experts <= 0))
        return hp_error(HP_ERR_UNSUPPORTED, "config key 'parallelism.expert_tensor_parallel_degree' = %d: expert "
                        "tensor parallel needs expert_parallel_degree > 1 (here %d) and an MoE model (model.name %s); "
                        "hint: set expert_parallel_degree, or set expert_tensor_parallel_degree to 1 (with "
                        "expert_parallel_degree 1 the experts are then tensor parallel on their hidden dim)",
                        pd->etp, pd->ep, mc->name);
    /* TP with an MoE model: the dense layers follow the TP plan; the routed experts are sharded
     * on their hidden dim over tp (hp_ep_tensor_parallel_experts, ETP) or EP borrows the tp
     * ranks (etp 1). Under sequence parallel each tp rank routes its own sequence shard
     * (hp_ep_enable_sequence_parallel). EP borrowing tp needs that: with a Replicate MoE input
     * every tp rank would dispatch the same tokens. */
    const int borrow = mc->moe_experts > 0 && pd->tp > 1 && pd->ep > 1 && pd->etp == 1;
    if (mc->moe_experts > 0 && pd->tp > 1 && pd->pp > 1 && c->parallelism.enable_sequence_parallel)
        return hp_error(HP_ERR_UNSUPPORTED, "config key 'parallelism.enable_sequence_parallel' = true with "
                        "tensor_parallel_degree %d, pipeline_parallel_degree %d and the MoE model '%s': sequence "
                        "parallel around MoE layers is not implemented inside pipeline stages; hint: "
                        "--parallelism.enable_sequence_parallel=false (the experts are then tensor parallel on their "
                        "hidden dim, or ETP)", pd->tp, pd->pp, mc->name);
    if (borrow && !c->parallelism.enable_sequence_parallel)
        return hp_error(HP_ERR_UNSUPPORTED, "config key 'parallelism.enable_sequence_parallel' = false with "
                        "expert_parallel_degree %d borrowing tensor_parallel_degree %d ranks (expert_tensor_parallel_degree "
                        "1): the tokens must be sequence-sharded over tp before dispatch (TorchTitan's EP + TP); hint: "
                        "--parallelism.enable_sequence_parallel=true, or expert_tensor_parallel_degree = %d (ETP)",
                        pd->ep, pd->tp, pd->tp);
    if (borrow && pd->ep != pd->dp_shard * pd->cp * pd->tp)
        return hp_error(HP_ERR_UNSUPPORTED, "config keys 'parallelism.expert_parallel_degree' = %d and "
                        "'parallelism.tensor_parallel_degree' = %d with expert_tensor_parallel_degree 1: EP borrowing tp "
                        "ranks is implemented for expert_parallel_degree = data_parallel_shard_degree x "
                        "context_parallel_degree x tensor_parallel_degree (= %d here, expert FSDP degree 1); hint: set "
                        "expert_parallel_degree to %d, or expert_tensor_parallel_degree = %d (ETP)", pd->ep, pd->tp,
                        pd->dp_shard * pd->cp * pd->tp, pd->dp_shard * pd->cp * pd->tp, pd->tp);
    const int efsdp = hp_parallel_dims_efsdp(pd);
    if (mc->moe_experts > 0 && pd->tp > 1 && pd->ep > 1 && efsdp > 1 &&
        c->parallelism.enable_sequence_parallel)
        return hp_error(HP_ERR_UNSUPPORTED, "config key 'parallelism.enable_sequence_parallel' = true with expert FSDP "
                        "degree %d (expert_parallel_degree %d x expert_tensor_parallel_degree %d of data_parallel_shard_degree "
                        "x context_parallel_degree x tensor_parallel_degree = %d ranks): sequence parallel around MoE "
                        "layers is implemented for expert FSDP degree 1; hint: --parallelism.enable_sequence_parallel=false, "
                        "or expert_parallel_degree = %d", efsdp, pd->ep, pd->etp, pd->dp_shard * pd->cp * pd->tp,
                        pd->dp_shard * pd->cp * pd->tp / pd->etp);
    return HP_OK;
}

hp_status_t hp_parallelize_options_from_config(const hp_config_t *c, hp_parallelize_options_t *o) {
    *o = hp_parallelize_default_options();
    o->sequence_parallel = c->parallelism.enable_sequence_parallel;
    o->loss_parallel = c->parallelism.enable_loss_parallel;
    HP_TRY(hp_cp_rotate_parse(c->parallelism.context_parallel_rotate_method,
                              "parallelism.context_parallel_rotate_method", &o->cp.rotate));
    HP_TRY(hp_cp_balancer_parse(c->parallelism.context_parallel_load_balancer,
                                "parallelism.context_parallel_load_balancer", &o->cp.balancer));
    o->cp.ulysses_degree = (int)c->parallelism.context_parallel_ulysses_degree;
    o->cp.async = c->parallelism.context_parallel_async;
    HP_TRY(ac_options(c, &o->ac));
    o->seed = (uint64_t)c->training.seed;
    o->fsdp = fsdp_options(c);
    o->zero_stage = (int)c->parallelism.zero_stage;
    hp_pipeline_options_t *pp = &o->pp;
    pp->schedule = c->parallelism.pipeline_parallel_schedule;
    pp->schedule_csv = c->parallelism.pipeline_parallel_schedule_csv;
    pp->module_fqns_per_model_part = c->parallelism.module_fqns_per_model_part;
    pp->microbatch_size = (int)c->parallelism.pipeline_parallel_microbatch_size;
    pp->layers_per_stage = (int)c->parallelism.pipeline_parallel_layers_per_stage;
    /* TorchTitan divides by it (ceil(layers / layers_per_stage) stages): 0 is no split */
    if (pp->layers_per_stage == 0)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'parallelism.pipeline_parallel_layers_per_stage' = 0: expected "
                        "at least 1 transformer layer per virtual stage (the stage count is ceil(layers / "
                        "layers_per_stage)); hint: -1 (the default) splits the layers evenly by the schedule's stage "
                        "count");
    pp->first_stage_less_layers = (int)c->parallelism.pipeline_parallel_first_stage_less_layers;
    pp->last_stage_less_layers = (int)c->parallelism.pipeline_parallel_last_stage_less_layers;
    pp->mpipe_transpose_layers = (int)c->parallelism.pipeline_parallel_mpipe_transpose_layers;
    return HP_OK;
}

hp_status_t hp_parallel_config_check(const hp_config_t *c, const hp_model_config_t *mc, const hp_parallel_dims_t *pd,
                                     int batch, int val_batch) {
    /* bfloat16: the linears' GEMMs in bf16 (hp_model_set_compute_dtype), made and tested at 1 rank,
     * under FSDP (dp_shard) and tensor parallel; other layouts and MoE models refused by key */
    if (strcmp(c->training.dtype, "bfloat16") == 0) {
        const char *key = pd->pp > 1 ? "parallelism.pipeline_parallel_degree"
                        : pd->cp > 1 ? "parallelism.context_parallel_degree"
                        : pd->ep > 1 ? "parallelism.expert_parallel_degree"
                        : pd->dp_replicate > 1 ? "parallelism.data_parallel_replicate_degree" : NULL;
        if (key)
            return hp_error(HP_ERR_UNSUPPORTED, "training.dtype = bfloat16 with %s > 1 is not implemented yet (bf16 "
                            "compute runs at 1 rank, under FSDP (data_parallel_shard_degree) and tensor parallel); "
                            "hint: set %s = 1 or training.dtype = float32", key, key);
        if (mc->moe_experts > 0)
            return hp_error(HP_ERR_UNSUPPORTED, "training.dtype = bfloat16 with the MoE model %s is not implemented "
                            "yet (the experts' grouped GEMMs are float32 only); hint: set training.dtype = float32",
                            mc->name);
    } else if (strcmp(c->training.dtype, "float32") != 0) {
        return hp_error(HP_ERR_INVALID_ARG, "training.dtype = %s; expected float32 or bfloat16", c->training.dtype);
    }
    HP_TRY(hp_parallel_dims_check_implemented(pd, HP_TRAINER_IMPLEMENTED));
    hp_ac_options_t ac;
    HP_TRY(ac_options(c, &ac));
    HP_TRY(moe_check_layout(c, mc, pd));
    HP_TRY(check_cp_layout(c, mc, pd));
    /* context parallel with an MoE model: each cp rank routes its sequence shard (dispatched
     * over ep, which borrows from dp_shard x cp); not yet inside pipeline stages */
    if (pd->cp > 1 && mc->moe_experts > 0 && pd->pp > 1)
        return hp_error(HP_ERR_UNSUPPORTED, "parallelism.context_parallel_degree %d with the MoE model %s and "
                        "parallelism.pipeline_parallel_degree %d is not supported yet; hint: set "
                        "pipeline_parallel_degree 1 (context parallel of MoE models runs without pipeline stages)",
                        pd->cp, mc->name, pd->pp);
    if (pd->pp > 1 && val_batch != batch)
        return hp_error(HP_ERR_UNSUPPORTED, "validation.local_batch_size %d differs from training.local_batch_size %d; "
                        "under pipeline parallel validation runs the training micro-batches; hint: leave "
                        "validation.local_batch_size at -1", val_batch, batch);
    if (c->parallelism.zero_stage == 1 &&
        (pd->dp_replicate < 2 || pd->dp_shard * pd->cp > 1 || pd->pp > 1 || mc->moe_experts > 0))
        return hp_error(HP_ERR_UNSUPPORTED, "parallelism.zero_stage = 1 partitions the optimizer state of replicated "
                        "data parallel: it needs data_parallel_replicate_degree > 1 (here %d) with "
                        "data_parallel_shard_degree x context_parallel_degree 1 (here %d; FSDP shards the state "
                        "already), pipeline_parallel_degree 1 (here %d) and a dense model (model.name %s); hint: "
                        "--parallelism.zero_stage=0, or FSDP (data_parallel_shard_degree > 1)", pd->dp_replicate,
                        pd->dp_shard * pd->cp, pd->pp, mc->name);
    if (pd->tp > 1) {
        const int T = (int)c->training.seq_len;
        if (c->parallelism.enable_sequence_parallel && T % pd->tp != 0)
            return hp_error(HP_ERR_INVALID_ARG, "training.seq_len %d is not divisible by parallelism.tensor_parallel_degree "
                            "%d (sequence parallel shards the sequence); hint: use a multiple of %d or "
                            "--parallelism.enable_sequence_parallel=false", T, pd->tp, pd->tp);
        HP_TRY(check_tp_layout(c, mc, pd->tp));
    }
    return HP_OK;
}
