/* The training loop (TorchTitan's Trainer.train_step in C): global token normalisation,
 * gradient accumulation, data-parallel gradient reduction, clipping, finiteness check,
 * optimizer and LR schedule, validation, logging, final weights. */
#define _GNU_SOURCE
#include "hyperparallel/trainer.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <omp.h>
#include <signal.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperparallel/data.h"
#include "hyperparallel/metrics.h"
#include "hyperparallel/optim.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/ckpt_manager.h"
#include "hyperparallel/ddp.h"
#include "hyperparallel/fsdp.h"
#include "hyperparallel/tp.h"
#include "hyperparallel/ep.h"
#include "hyperparallel/cp.h"   /* context parallel (owner cp) */
#include "hyperparallel/parallel_dims.h"
#include "hyperparallel/pp.h"
#include "hyperparallel/tokenizer.h"

/* Parallelisms this build implements: replicated data parallel (one SUM all-reduce per
 * gradient after backward), FSDP (dp_shard > 1) and HSDP (both > 1) through fully_shard
 * (src/parallel/fsdp.c), tensor / sequence parallel (src/parallel/tp.c), pipeline parallel
 * (src/parallel/pp.c), expert parallel (src/parallel/ep.c), context parallel (src/parallel/cp.c)
 * under FSDP over dp_shard x cp; compositions the trainer does not support are refused by key. */
#define HP_TRAINER_IMPLEMENTED (HP_PAR_DP_REPLICATE | HP_PAR_DP_SHARD | HP_PAR_TP | HP_PAR_PP | HP_PAR_EP | HP_PAR_CP)

struct hp_trainer {
    hp_config_t cfg;
    hp_comm_t world;
    int rank, world_size;
    hp_parallel_dims_t pd;
    hp_parallel_meshes_t meshes;
    hp_comm_t dp_comm;          /* batch mesh: data-parallel ranks */
    int dp_rank, dp_size;
    hp_model_config_t mcfg;
    hp_model_t model;
    hp_optim_t opt;
    hp_lr_schedule_t lr;
    hp_tokenizer_t tok;
    hp_token_ids_t scratch;     /* encoder scratch for the data loaders */
    hp_dataset_t ds;
    hp_dataloader_t dl, val_dl;
    int64_t accum;
    int B, T, val_B;
    int32_t *inputs, *labels;   /* (accum, B, T) */
    hp_work_t *grad_work;       /* one handle per parameter for the gradient all-reduce */
    int64_t step;
    double flops_per_token;
    hp_metrics_t metrics;
    hp_metrics_paths_t metric_paths;
    /* --- checkpoint (src/checkpoint/manager.c, owner dcp) --- */
    hp_ckpt_manager_t ckpt;
    uint64_t ckpt_seed;
    /* --- data parallel (owner fsdp): fully_shard when dp_shard > 1 --- */
    hp_mesh_t dp_mesh;          /* (dp_shard) or (dp_replicate, dp_shard): a slice of world */
    hp_fsdp_t fsdp;
    hp_ddp_t ddp;              /* dp_replicate only: bucketed async all-reduce in backward */
    hp_param_t *params;         /* what the optimizer, clipping and checkpoints see */
    int np;
    hp_comm_t clip_comms[6];   /* FSDP's (shard, replicate, tp) or tp / ep / efsdp, then pp */
    int n_clip_comms;
    /* --- tensor parallel (owner tp) --- */
    hp_mesh_t tp_mesh;          /* the world mesh's tp dim */
    hp_tp_t tp;
    /* --- pipeline parallel (owner pp): NULL unless pipeline_parallel_degree > 1; then
     * t->model is the first local stage and t->params the whole model's table --- */
    struct trainer_pp *pp;
    /* --- mixture of experts (owner moe): load balancing, routing metrics, expert_bias in
     * checkpoints --- */
    int n_moe, moe_ac_k;
    hp_module_t **moe_mods;     /* the MoE modules held here (under PP: the local stages'), layer order */
    int n_moe_all;              /* the model's MoE layers (n_moe unless PP) */
    int *moe_layer;             /* (n_moe_all) layer index of each MoE layer */
    int *moe_slot;              /* (n_moe) row of moe_counts of each held module */
    float *moe_counts;          /* (n_moe_all, E) tokens per expert of a step, summed over dp (and pp) */
    hp_param_t *moe_ckpt_params;   /* params + one "layers.N.moe.expert_bias" per MoE layer */
    float *moe_zero;            /* (E) the bias entries' (unused) gradient */
    hp_mesh_t ep_mesh;          /* expert parallel: the sparse mesh's ep dim */
    hp_ep_t ep;
    hp_ep_t ep_tp;              /* tensor parallel of the experts (tp > 1, ep = 1) */
    hp_ep_t ep_sp;              /* ep or ep_tp under sequence parallel (tp > 1): the MoE input is
                                   Shard(seq) over tp, counts and router grads summed over tp */
    hp_mesh_t etp_mesh;         /* ETP: (ep, etp); expert FSDP: (efsdp, ep), with ETP (efsdp, ep, etp) */
    hp_mesh_t ep_grad_mesh[2];  /* (efsdp), (dp_replicate): expert grads are summed over these */
    /* dense FSDP under EP: the norm is sqrt(dense^2 + experts^2), each over its own comms */
    hp_param_t *ep_norm_p;      /* (np) the dense params, then the experts (descriptors) */
    int ep_n_dense, ep_n_expert_comms;
    hp_comm_t ep_expert_comms[6];
    int ep_n_norm;              /* entries of ep_norm_p */
    /* --- context parallel (owner cp) --- */
    hp_mesh_t cp_mesh;          /* the world mesh's cp dim */
    hp_cp_t cp;
    int Tl;                     /* rows per sequence on this rank: T / cp */
    int32_t *cp_inputs, *cp_labels;   /* (B, T/cp) this rank's rows of a micro-batch */
    hp_mesh_t cp_fsdp_flat;     /* (dp_shard x cp) flattened: FSDP's shard dim */
    /* --- end --- */
};

/* hp_encode_fn over the tokenizer (documents get BOS/EOS from the data layer). */
static hp_status_t encode_cb(void *ctx, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n_ids) {
    hp_trainer_t t = ctx;
    t->scratch.len = 0;
    HP_TRY(hp_tokenizer_encode(t->tok, text, len, 0, &t->scratch));
    size_t n = t->scratch.len;
    memcpy(ids, t->scratch.ids, (n < cap ? n : cap) * sizeof(int32_t));
    *n_ids = n;
    return HP_OK;
}

static hp_status_t refuse_unimplemented(const hp_config_t *c) {
    if (strcmp(c->training.dtype, "float32") != 0)
        return hp_error(HP_ERR_UNSUPPORTED,
                        "training.dtype = %s is not implemented yet (parameters and optimizer state are float32); "
                        "set --training.dtype=float32", c->training.dtype);
    return HP_OK;
}

/* activation_checkpoint -> hp_model_set_activation_checkpoint's every_k (TorchTitan: full =
 * every block; selective with an integer k = every k-th block; selective "op" = op-level SAC,
 * not implemented). */
static hp_status_t ac_every_k(const hp_config_t *c, int *every_k) {
    const char *mode = c->activation_checkpoint.mode, *opt = c->activation_checkpoint.selective_ac_option;
    *every_k = 0;
    if (strcmp(mode, "none") == 0) return HP_OK;
    if (strcmp(mode, "full") == 0) { *every_k = 1; return HP_OK; }
    if (strcmp(mode, "selective") != 0)
        return hp_error(HP_ERR_INVALID_ARG, "activation_checkpoint.mode = %s, expected none, full or selective",
                        mode);
    if (strcmp(opt, "op") == 0)
        return hp_error(HP_ERR_UNSUPPORTED,
                        "activation_checkpoint.selective_ac_option = op (op-level selective AC) is not implemented "
                        "yet; hint: use an integer k (checkpoint every k-th block) or "
                        "--activation_checkpoint.mode=full");
    char *end = NULL;
    errno = 0;
    long k = strtol(opt, &end, 10);
    if (end == opt || *end != '\0' || errno != 0 || k < 0 || k > 1000000 || opt[0] == '-' || opt[0] == '+')
        return hp_error(HP_ERR_INVALID_ARG,
                        "activation_checkpoint.selective_ac_option = '%s', expected a non-negative integer k "
                        "(checkpoint every k-th transformer block; 0 = every block, as TorchTitan) or op; hint: e.g. --activation_checkpoint.selective_ac_option=2",
                        opt);
    *every_k = k == 0 ? 1 : (int)k;   // TorchTitan: `not ac_freq` wraps every block
    return HP_OK;
}

static hp_status_t make_dirs(const char *path) {
    char buf[HP_CONFIG_STR_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return hp_error(HP_ERR_IO, "cannot create folder '%s': %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return hp_error(HP_ERR_IO, "cannot create folder '%s': %s", buf, strerror(errno));
    return HP_OK;
}

/* An output folder of the run: `key` = `value` in the config, `dir` the folder it needs
 * (value itself, or a file's folder). Created with its parents, then probed by creating and
 * removing a file, so an unusable path stops the run at start-up instead of losing the
 * trained weights after the last step. */
static hp_status_t probe_folder(const char *key, const char *value, const char *dir, int rank) {
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return hp_error(HP_ERR_IO, "%s = '%s': '%s' exists and is not a folder; expected a writable folder for the "
                        "run's outputs; hint: remove that file or set --%s to another path", key, value, dir, key);
    if (make_dirs(dir) != HP_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", hp_last_error());
        return hp_error(HP_ERR_IO, "%s = '%s': %s; expected a writable folder; hint: set --%s to a path you can "
                        "write", key, value, why, key);
    }
    char probe[4096 + 64];
    snprintf(probe, sizeof probe, "%s/.hp-write-probe.%ld.%d", dir, (long)getpid(), rank);
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return hp_error(HP_ERR_IO, "%s = '%s': cannot create a file in '%s' (%s); expected a writable folder; hint: "
                        "fix its permissions or set --%s to another path", key, value, dir, strerror(errno), key);
    close(fd);
    unlink(probe);
    return HP_OK;
}

/* An output file: not a folder, and its folder passes probe_folder. */
static hp_status_t probe_file(const char *key, const char *path, int rank) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return hp_error(HP_ERR_IO, "%s = '%s' is a folder; expected a file path the run can write; hint: set --%s "
                        "to a file name", key, path, key);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    return probe_folder(key, path, dir, rank);
}

/* Every output path this rank will write, checked before the first step (docs/config.md):
 * job.dump_folder (and its weights file), checkpoint.folder, the TensorBoard folder and the
 * JSONL file. */
static hp_status_t probe_outputs(hp_trainer_t t) {
    const hp_config_t *c = &t->cfg;
    char path[2 * HP_CONFIG_STR_MAX + 32];
    if (c->job.dump_folder[0]) {
        HP_TRY(probe_folder("job.dump_folder", c->job.dump_folder, c->job.dump_folder, t->rank));
        snprintf(path, sizeof path, "%s/weights.safetensors", c->job.dump_folder);
        struct stat sb;
        if (t->rank == 0 && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
            return hp_error(HP_ERR_IO, "job.dump_folder: the final weights file '%s' is a folder; hint: remove it "
                            "or set --job.dump_folder to another path", path);
    }
    if (c->checkpoint.enable) {
        const char *f = c->checkpoint.folder;
        if (f[0] == '/' || !c->job.dump_folder[0]) snprintf(path, sizeof path, "%s", f);
        else snprintf(path, sizeof path, "%s/%s", c->job.dump_folder, f);
        HP_TRY(probe_folder("checkpoint.folder", path, path, t->rank));
    }
    if (t->metric_paths.tb_dir[0])
        HP_TRY(probe_folder("metrics.save_tb_folder", t->metric_paths.tb_dir, t->metric_paths.tb_dir, t->rank));
    if (t->metric_paths.jsonl[0]) HP_TRY(probe_file("metrics.jsonl_file", t->metric_paths.jsonl, t->rank));
    return HP_OK;
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

/* --- context parallel (owner cp) --- */
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

/* The CP handle over the cp mesh dim, before TP (on the local heads TP will leave). */
static hp_status_t cp_prepare(hp_trainer_t t, hp_model_t *models, int n) {
    const hp_config_t *c = &t->cfg;
    t->Tl = t->T;
    if (t->pd.cp == 1) return HP_OK;
    const char *cpn[1] = {"cp"};
    HP_TRY(hp_mesh_slice(t->meshes.world, 1, cpn, &t->cp_mesh));
    hp_cp_options_t co = hp_cp_options_default();
    HP_TRY(hp_cp_rotate_parse(c->parallelism.context_parallel_rotate_method,
                              "parallelism.context_parallel_rotate_method", &co.rotate));
    HP_TRY(hp_cp_balancer_parse(c->parallelism.context_parallel_load_balancer,
                                "parallelism.context_parallel_load_balancer", &co.balancer));
    co.ulysses_degree = (int)c->parallelism.context_parallel_ulysses_degree;
    co.async = c->parallelism.context_parallel_async;
    const int hd = t->mcfg.head_dim > 0 ? t->mcfg.head_dim : t->mcfg.dim / t->mcfg.n_heads;
    HP_TRY(hp_cp_create(hp_mesh_get_comm(t->cp_mesh, 0), &co, t->B > t->val_B ? t->B : t->val_B, t->T,
                        t->mcfg.n_heads / t->pd.tp, t->mcfg.n_kv_heads / t->pd.tp, hd, &t->cp));
    (void)models, (void)n;   /* hp_cp_apply finds each attention's projection itself, before or after TP */
    return HP_OK;
}

/* The CP cores in each of the n models (the whole model, or each local pipeline stage; a
 * stage without attention has no core to replace), after TP (the cores run the local heads)
 * and before FSDP. Sets t->Tl, the rows a rank feeds. */
static hp_status_t cp_install(hp_trainer_t t, hp_model_t *models, int n) {
    if (!t->cp) return HP_OK;
    for (int i = 0; i < n; i++) {
        hp_module_t *mods[4096];
        const int nm = hp_model_modules(models[i], mods, 4096);
        int cores = 0;
        for (int j = 0; j < nm && j < 4096; j++) cores += strcmp(mods[j]->ops->kind, "sdpa") == 0;
        if (cores > 0 || n == 1) HP_TRY(hp_cp_apply(t->cp, models[i]));
    }
    t->Tl = t->T / t->pd.cp;
    return HP_OK;
}

/* FSDP's mesh under CP: (dp_shard, cp) flattened; HSDP adds dp_replicate in front. */
static hp_status_t cp_fsdp_mesh(hp_trainer_t t) {
    const char *sc[2] = {"dp_shard", "cp"};
    hp_mesh_t flat = NULL;
    HP_TRY(hp_mesh_flatten(t->meshes.world, 2, sc, "dp_shard_cp", &flat));
    t->cp_fsdp_flat = flat;
    if (t->pd.dp_replicate > 1) {
        const char *rn[1] = {"dp_replicate"};
        hp_mesh_t rep = NULL;
        HP_TRY(hp_mesh_slice(t->meshes.world, 1, rn, &rep));
        hp_status_t cs = hp_mesh_concat(rep, flat, &t->dp_mesh);
        hp_mesh_destroy(rep);
        return cs;
    }
    return hp_mesh_slice(flat, 1, (const char *[]){"dp_shard_cp"}, &t->dp_mesh);
}
/* --- end context parallel --- */

/* training.deterministic: no run-time choice of thread counts. Reduction orders are fixed by
 * construction (the comm layer's deterministic algorithms, static OpenMP partitions, chunked
 * norms); what can still vary between runs is the number of threads a region gets when
 * OpenMP's dynamic adjustment is on (OMP_DYNAMIC=true) and OpenBLAS's own thread count, which
 * change how GEMMs and reductions are partitioned. */
static void pin_threads(const hp_config_t *c) {
    if (!c->training.deterministic) return;
    omp_set_dynamic(0);
    const int n = omp_get_max_threads();
    openblas_set_num_threads(n);
    hp_log(HP_LOG_INFO, "training.deterministic: OpenMP dynamic threads off, %d OpenMP and %d OpenBLAS thread(s) "
           "per rank", n, n);
}

/* The rank-local part of the set-up (config rules, tokenizer, model allocation): no
 * collective runs here, so a rank that fails is agreed on before the first one. */
static hp_status_t moe_check_layout(const hp_trainer_t t);   /* mixture of experts (owner moe) */
static hp_status_t moe_setup(hp_trainer_t t, int ac_k);
static hp_status_t ep_norm_setup(hp_trainer_t t, const hp_param_t *ps, int np);
static hp_status_t ep_grad_norm(hp_trainer_t t, double *norm);

/* --- data parallel (owner fsdp): fully_shard's options from the config. Reductions are sums
 * (the loss is globally normalised: divide factor 1); reshard_after_forward "default" is
 * TorchTitan's `not pp_enabled` under pipeline parallel (no all-gather per micro-batch) and
 * FSDP's own default (reshard all but the root) otherwise. --- */
static hp_fsdp_options_t fsdp_options(const hp_config_t *c, int pp) {
    hp_fsdp_options_t fo = hp_fsdp_default_options();
    fo.gradient_divide_factor = 1.0;
    fo.mp.param_dtype = strcmp(c->training.mixed_precision_param, "bfloat16") == 0 ? HP_BF16 : HP_F32;
    fo.mp.reduce_dtype = strcmp(c->training.mixed_precision_reduce, "bfloat16") == 0 ? HP_BF16 : HP_F32;
    const char *raf = c->parallelism.fsdp_reshard_after_forward;
    fo.reshard_after_forward = strcmp(raf, "always") == 0 ? 1 : strcmp(raf, "never") == 0 ? 0
                             : pp ? 0 : HP_FSDP_RESHARD_DEFAULT;
    return fo;
}

static hp_status_t tp_plan(hp_trainer_t t, hp_tp_plan_entry_t plan[32], int *n);
static hp_status_t ep_apply(hp_trainer_t t, hp_model_t m, int first, hp_ep_t *ep, hp_ep_t *ep_tp);   /* owner moe */

/* --- pipeline parallel (owner pp) ------------------------------------------------------------
 * TorchTitan's pipeline_llm: the schedule's stage count, the split of the units, the loop
 * mapping (stage s on pp rank s % pp), one model per local stage holding only its units, then
 * per stage TP, AC, init and FSDP (reshard_after_forward default off under PP), and the
 * runtime over the lowered schedule. The optimizer, clipping and checkpoints see the whole
 * model's table: the parameters held here, and for the others a placeholder with the global
 * shape and no local elements (no DCP boxes, no optimizer work), so every rank passes the
 * same entries in the same order and checkpoint keys stay the full model's FQNs. */
typedef struct trainer_pp {
    int S, n_local, n_mb, mbs, coord;   /* stages, local stages, micro-batches, seqs each, pp rank */
    int *unit_lo;                       /* (S + 1) */
    int *stage_to_rank;                 /* (S) */
    int *ids;                           /* (n_local) */
    hp_model_t *m;                      /* (n_local) */
    hp_fsdp_t *fsdp;                    /* (n_local) or NULL entries */
    hp_tp_t *tp;
    hp_ep_t *ep, *ep_tp;                /* (n_local) owner moe: expert parallel / TP of the experts per stage */
    hp_pp_schedule_t *sched;            /* every pp rank's lowered list */
    hp_pp_t rt;
    hp_comm_t comm;                     /* the world mesh's pp dim */
    int accum_last;                     /* the current schedule run is the step's last */
    hp_param_t *full;                   /* (np) the whole model's table */
    int *stage_of;                      /* (np) stage of each entry (the tied weight: 0) */
    int np;
    hp_param_t *norm;                   /* held entries counted by the gradient norm */
    int n_norm;
    int tie_idx;                        /* tied weight held here (first or last stage), else -1 */
    hp_comm_t tie_comm;                 /* the first and last stage's ranks of this pp slice, else NULL */
    float absent_dummy;
    int mpipe;                          /* the schedule has MPipe's transposed actions */
} trainer_pp_t;

static void pp_free(trainer_pp_t *p) {
    if (!p) return;
    hp_pp_destroy(p->rt);
    hp_pp_schedule_free(p->sched);
    for (int i = 0; i < p->n_local; i++) {
        if (p->fsdp) hp_fsdp_destroy(p->fsdp[i]);
        if (p->tp) hp_tp_destroy(p->tp[i]);
        if (p->ep) hp_ep_destroy(p->ep[i]);   /* owner moe */
        if (p->ep_tp) hp_ep_destroy(p->ep_tp[i]);
        if (p->m) hp_model_destroy(p->m[i]);
    }
    free(p->fsdp);
    free(p->tp);
    free(p->ep);
    free(p->ep_tp);
    free(p->m);
    free(p->ids);
    free(p->unit_lo);
    free(p->stage_to_rank);
    free(p->full);
    free(p->stage_of);
    free(p->norm);
    hp_comm_destroy(p->tie_comm);
    free(p);
}

/* The schedule: a CSV (compute-only, lowered here; or with its communication, taken as it is)
 * or a generated one; the kind decides 1 or 2 stages per rank. */
static hp_status_t pp_schedule(hp_trainer_t t, trainer_pp_t *p, const hp_pp_schedule_t *csv, hp_pp_kind_t kind) {
    const char *key = "parallelism.pipeline_parallel_schedule_csv";
    const int pp = t->pd.pp;
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
                            "row per pp rank)", key, t->cfg.parallelism.pipeline_parallel_schedule_csv,
                            hp_pp_schedule_n_ranks(csv), pp);
        if (has_comm) {   // format compute_comms: validate the compute part only through simulation
            HP_TRY(hp_pp_schedule_copy(csv, &p->sched));
            for (int s = 0; s < p->S; s++) p->stage_to_rank[s] = s % pp;
            return HP_OK;
        }
        HP_TRY(hp_pp_schedule_copy(csv, &compute));
    } else {
        HP_TRY(hp_pp_generate(kind, pp, p->S / pp, p->n_mb, &compute));
    }
    hp_status_t s = hp_pp_lower(compute, p->S, p->n_mb, &p->sched, p->stage_to_rank);
    hp_pp_schedule_free(compute);
    if (s != HP_OK && csv) return hp_error(s, "%s '%s': %s", key, t->cfg.parallelism.pipeline_parallel_schedule_csv,
                                           hp_last_error());
    return s;
}

/* Split, mapping, schedule and the local stage models (from build_local: no collectives). */
static hp_status_t pp_create_stages(hp_trainer_t t) {
    const hp_config_t *c = &t->cfg;
    const int pp = t->pd.pp, L = t->mcfg.n_layers;
    trainer_pp_t *p = hp_calloc(1, sizeof *p);
    if (!p) return HP_ERR_OOM;
    t->pp = p;
    p->tie_idx = -1;
    int coords[HP_PD_NDIM];
    hp_parallel_dims_coords(&t->pd, t->rank, coords);
    p->coord = coords[HP_PD_PP];
    p->mbs = (int)c->parallelism.pipeline_parallel_microbatch_size;
    if (t->B % p->mbs != 0)
        return hp_error(HP_ERR_INVALID_ARG, "training.local_batch_size %d is not divisible by "
                        "parallelism.pipeline_parallel_microbatch_size %d (micro-batches = local batch / microbatch "
                        "size); hint: use a divisor of %d", t->B, p->mbs, t->B);
    p->n_mb = t->B / p->mbs;
    if (t->val_B != t->B)
        return hp_error(HP_ERR_UNSUPPORTED, "validation.local_batch_size %d differs from training.local_batch_size %d; "
                        "under pipeline parallel validation runs the training micro-batches; hint: leave "
                        "validation.local_batch_size at -1", t->val_B, t->B);
    if (strcmp(c->optimizer.name, "muon") == 0)
        return hp_error(HP_ERR_UNSUPPORTED, "optimizer.name = muon is not supported with pipeline parallel yet; hint: "
                        "use adamw or sgd");
    // the schedule kind (or the user's CSV) decides the stages per rank
    hp_pp_schedule_t *csv = NULL;
    hp_pp_kind_t kind = HP_PP_1F1B;
    int single = 1, csv_stages = 0;
    if (c->parallelism.pipeline_parallel_schedule_csv[0]) {
        HP_TRY(hp_pp_schedule_load_csv(c->parallelism.pipeline_parallel_schedule_csv, &csv));
        for (int r = 0; r < hp_pp_schedule_n_ranks(csv); r++)   // the CSV names its own stages
            for (int i = 0; i < hp_pp_schedule_len(csv, r); i++) {
                const hp_pp_action_t *a = hp_pp_schedule_at(csv, r, i);
                if (a && a->stage + 1 > csv_stages) csv_stages = a->stage + 1;
            }
        single = csv_stages <= pp;
    } else {
        hp_status_t ks = hp_pp_kind_from_name(c->parallelism.pipeline_parallel_schedule, &kind);
        if (ks != HP_OK)
            return hp_error(ks, "parallelism.pipeline_parallel_schedule: %s", hp_last_error());
        single = hp_pp_kind_is_single_stage(kind);
        // the V schedules (ZBVZeroBubble, DualPipeV): rank r holds stages r and 2 pp - 1 - r, so
        // the first and the last stage share rank 0; a tied weight would have two copies there
        // that the optimizer does not keep equal (TorchTitan refuses weight tying under PP)
        if (hp_pp_kind_style(kind) == HP_PP_STYLE_V && t->mcfg.tie_embeddings)
            return hp_error(HP_ERR_UNSUPPORTED, "parallelism.pipeline_parallel_schedule = %s (V mapping: the first and "
                            "last stage on pp rank 0) with the tied embeddings of model %s is not supported; hint: use "
                            "InterleavedZeroBubble or Interleaved1F1B", hp_pp_kind_name(kind), c->model.name);
    }
    hp_status_t st = HP_OK;
    p->unit_lo = hp_calloc(HP_PP_MAX_STAGES + 1, sizeof(int));
    p->stage_to_rank = hp_calloc(HP_PP_MAX_STAGES, sizeof(int));
    if (!p->unit_lo || !p->stage_to_rank) st = HP_ERR_OOM;
    if (st == HP_OK && c->parallelism.module_fqns_per_model_part[0]) {
        st = hp_pp_split_fqns(c->parallelism.module_fqns_per_model_part, "parallelism.module_fqns_per_model_part", L,
                              &p->S, p->unit_lo);
        if (st == HP_OK && p->S % pp != 0)
            st = hp_error(HP_ERR_INVALID_ARG, "parallelism.module_fqns_per_model_part gives %d stages, not a multiple of "
                          "parallelism.pipeline_parallel_degree %d", p->S, pp);
        if (st == HP_OK && single && p->S != pp && !csv)
            st = hp_error(HP_ERR_INVALID_ARG, "parallelism.module_fqns_per_model_part gives %d stages; the single-stage "
                          "schedule %s needs exactly %d (one per pp rank)", p->S,
                          c->parallelism.pipeline_parallel_schedule, pp);
    } else if (st == HP_OK) {
        st = hp_pp_num_stages(pp, single, L, (int)c->parallelism.pipeline_parallel_layers_per_stage,
                              (int)c->parallelism.pipeline_parallel_first_stage_less_layers,
                              (int)c->parallelism.pipeline_parallel_last_stage_less_layers, &p->S);
        if (st == HP_OK && csv) p->S = csv_stages;
        if (st == HP_OK)
            st = hp_pp_split_layers(L, p->S, (int)c->parallelism.pipeline_parallel_first_stage_less_layers,
                                    (int)c->parallelism.pipeline_parallel_last_stage_less_layers, p->unit_lo);
    }
    if (st == HP_OK && !csv && hp_pp_kind_style(kind) == HP_PP_STYLE_V && p->S != 2 * pp)
        st = hp_error(HP_ERR_INVALID_ARG, "parallelism.pipeline_parallel_schedule = %s needs exactly 2 stages per pp rank "
                      "(%d); the split gives %d (parallelism.pipeline_parallel_layers_per_stage / "
                      "module_fqns_per_model_part); hint: leave layers_per_stage unset or give %d stages",
                      hp_pp_kind_name(kind), 2 * pp, p->S, 2 * pp);
    if (st == HP_OK) st = pp_schedule(t, p, csv, kind);
    hp_pp_schedule_free(csv);
    HP_TRY(st);
    // MPipe (HyperParallel's ScheduleMPipeTranspose): helpers run a replica of stage 0's
    // preprocess units [0, T + 1) refreshed by a broadcast of plain parameters each step
    for (int r = 0; r < hp_pp_schedule_n_ranks(p->sched); r++)
        for (int i = 0; i < hp_pp_schedule_len(p->sched, r); i++) {
            const hp_pp_action_t *a = hp_pp_schedule_at(p->sched, r, i);
            p->mpipe |= a && (a->type == HP_PP_MPIPE_F || a->type == HP_PP_TRANSPOSE_F);
        }
    if (p->mpipe) {
        const int64_t T = c->parallelism.pipeline_parallel_mpipe_transpose_layers;
        if (T + 1 > p->unit_lo[1])
            return hp_error(HP_ERR_INVALID_ARG, "parallelism.pipeline_parallel_mpipe_transpose_layers = %lld: the "
                            "preprocess (tok_embeddings and %lld layers) must be part of stage 0, which holds "
                            "tok_embeddings and %d layer(s); hint: at most %d, or lower "
                            "parallelism.pipeline_parallel_first_stage_less_layers", (long long)T, (long long)T,
                            p->unit_lo[1] - 1, p->unit_lo[1] - 1);
        if (t->pd.dp_shard > 1 || t->pd.tp > 1 || t->pd.cp > 1)
            return hp_error(HP_ERR_UNSUPPORTED, "parallelism.pipeline_parallel_schedule = MPipeTranspose with "
                            "data_parallel_shard_degree %d / tensor_parallel_degree %d / context_parallel_degree %d is "
                            "not supported: the helpers' replica takes stage 0's plain (unsharded, unsplit) parameters; "
                            "hint: use Interleaved1F1B, or MPipeTranspose with pp (and DDP) only", t->pd.dp_shard,
                            t->pd.tp, t->pd.cp);
        // tied embeddings: the replica is refreshed from stage 0's copy, which the tie's gradient sum
        // and the optimizer keep equal to the last stage's (test_trainer_pp runs qwen3)
    }
    for (int s = 0; s < p->S; s++) p->n_local += p->stage_to_rank[s] == p->coord;
    p->ids = hp_calloc((size_t)p->n_local + 1, sizeof(int));
    p->m = hp_calloc((size_t)p->n_local + 1, sizeof(hp_model_t));
    p->fsdp = hp_calloc((size_t)p->n_local + 1, sizeof(hp_fsdp_t));
    p->tp = hp_calloc((size_t)p->n_local + 1, sizeof(hp_tp_t));
    p->ep = hp_calloc((size_t)p->n_local + 1, sizeof(hp_ep_t));   /* owner moe */
    p->ep_tp = hp_calloc((size_t)p->n_local + 1, sizeof(hp_ep_t));
    if (!p->ids || !p->m || !p->fsdp || !p->tp || !p->ep || !p->ep_tp) return HP_ERR_OOM;
    for (int s = 0, i = 0; s < p->S; s++)
        if (p->stage_to_rank[s] == p->coord) p->ids[i++] = s;
    for (int i = 0; i < p->n_local; i++) {
        const int s = p->ids[i];
        HP_TRY(hp_model_create_range(&t->mcfg, p->unit_lo[s], p->unit_lo[s + 1], p->mbs, t->T, &p->m[i]));
    }
    if (p->n_local == 0)
        return hp_error(HP_ERR_INVALID_ARG, "pipeline: pp rank %d holds no stage of %d", p->coord, p->S);
    t->model = p->m[0];
    return HP_OK;
}

/* pre_backward hook of the runtime: FSDP reduces only after the stage's last backward of the
 * step (set_requires_gradient_sync, as PyTorch's schedules do for FSDP). */
static hp_status_t pp_pre_backward(void *user, int stage, int mb, int last) {
    hp_trainer_t t = user;
    trainer_pp_t *p = t->pp;
    (void)mb;
    for (int i = 0; i < p->n_local; i++)
        if (p->ids[i] == stage && p->fsdp[i]) hp_fsdp_set_requires_gradient_sync(p->fsdp[i], last && p->accum_last);
    return HP_OK;
}

/* The whole model's table: held entries point at the stage's (sharded) parameters. */
static hp_status_t pp_full_table(hp_trainer_t t) {
    trainer_pp_t *p = t->pp;
    const int nu = t->mcfg.n_layers + 2;
    int np = hp_model_describe_params(&t->mcfg, 0, nu, NULL, 0);
    if (np < 0) return hp_error(HP_ERR_INVALID_ARG, "%s", hp_last_error());
    hp_model_param_desc_t *d = hp_calloc((size_t)np + 1, sizeof *d);
    p->full = hp_calloc((size_t)np + 1, sizeof(hp_param_t));
    p->stage_of = hp_calloc((size_t)np + 1, sizeof(int));
    p->norm = hp_calloc((size_t)np + 1, sizeof(hp_param_t));
    if (!d || !p->full || !p->stage_of || !p->norm) { free(d); return HP_ERR_OOM; }
    hp_model_describe_params(&t->mcfg, 0, nu, d, np);
    p->np = np;
    int s = 0, u = 0, u_end = hp_model_describe_params(&t->mcfg, 0, 1, NULL, 0);   // entries [.., u_end) are unit u's
    for (int i = 0; i < np; i++) {
        // the units are in table order: advance the unit, then the stage holding it
        while (i >= u_end && u + 1 < nu) {
            u++;
            u_end += hp_model_describe_params(&t->mcfg, u, u + 1, NULL, 0);
        }
        while (s + 1 < p->S && p->unit_lo[s + 1] <= u) s++;
        p->stage_of[i] = s;
        hp_param_t *e = &p->full[i];
        snprintf(e->name, sizeof e->name, "%s", d[i].name);
        int li = -1;
        for (int k = 0; k < p->n_local; k++)
            if (p->ids[k] == s) li = k;
        // the tied weight also lives on the last stage (its own copy)
        const int tied_here = t->mcfg.tie_embeddings && i == 0 && li < 0 && p->stage_to_rank[p->S - 1] == p->coord;
        if (tied_here) li = p->n_local - 1;
        if (li >= 0) {
            hp_param_t *src = p->fsdp[li] ? hp_fsdp_params(p->fsdp[li]) : hp_model_params(p->m[li]);
            const int n_src = p->fsdp[li] ? hp_fsdp_num_params(p->fsdp[li]) : hp_model_num_params(p->m[li]);
            const hp_param_t *q = NULL;
            for (int k = 0; k < n_src && !q; k++)
                if (!strcmp(src[k].name, e->name)) q = &src[k];
            if (!q) { free(d); return hp_error(HP_ERR_STATE, "pipeline: stage %d has no parameter '%s'", s, e->name); }
            *e = *q;
            if (!tied_here) p->norm[p->n_norm++] = *e;   // the second copy of a tied weight counts once
            if (t->mcfg.tie_embeddings && i == 0) p->tie_idx = 0;
        } else {
            hp_dtensor_t *v[2] = {&e->value, &e->grad};
            for (int k = 0; k < 2; k++) {
                memset(v[k], 0, sizeof *v[k]);
                v[k]->mesh = t->meshes.world;
                v[k]->mesh_ndim = hp_mesh_ndim(t->meshes.world);
                for (int a = 0; a < v[k]->mesh_ndim; a++) v[k]->placements[a] = hp_replicate();
                int64_t shape[3] = {0, 0, 0};
                for (int a = 0; a < d[i].ndim; a++) {
                    shape[a] = a == 0 ? 0 : d[i].shape[a];
                    v[k]->global_shape[a] = d[i].shape[a];
                }
                HP_TRY(hp_tensor_init(&v[k]->local, HP_F32, d[i].ndim, shape, &p->absent_dummy));
            }
        }
    }
    free(d);
    return HP_OK;
}

/* Stage-by-stage TP / AC / init / FSDP (after the meshes exist), the table, the runtime. */
static hp_status_t pp_parallelize_local(hp_trainer_t t, int ac_k);

/* The stages' set-up differs per pp rank (a stage may fail where another does not): every rank
 * agrees before the runtime's collective creation. */
static hp_status_t pp_parallelize(hp_trainer_t t, int ac_k) {
    trainer_pp_t *p = t->pp;
    HP_TRY(hp_comm_agree(t->world, pp_parallelize_local(t, ac_k), NULL));
    // a tied weight's two copies (first and last stage) are summed between their ranks only
    if (t->mcfg.tie_embeddings) HP_TRY(hp_comm_split(p->comm, p->tie_idx >= 0 ? 0 : -1, p->coord, &p->tie_comm));
    hp_pp_options_t po = {p->S, p->stage_to_rank, p->n_mb, p->mbs, t->Tl};   /* owner cp: T/cp rows */
    hp_pp_hooks_t hooks = {t, pp_pre_backward, NULL, NULL, NULL};
    HP_TRY(hp_pp_create_mpipe(p->comm, p->sched, p->m, p->ids, p->n_local, &po, &hooks,
                              (int)t->cfg.parallelism.pipeline_parallel_mpipe_transpose_layers, &p->rt));
    // FSDP's and TP's collectives and EP's all-to-alls run inside the stages' modules: two
    // threads would issue them in a rank-dependent order
    if (hp_pp_overlap_mode(p->rt) == HP_PP_OVERLAP_THREAD && (t->pd.dp_shard > 1 || t->pd.tp > 1 || t->pd.ep > 1))
        return hp_error(HP_ERR_UNSUPPORTED, "env HP_PP_OVERLAP = thread with parallelism.data_parallel_shard_degree %d "
                        "/ tensor_parallel_degree %d / expert_parallel_degree %d: FSDP, TP and EP issue collectives "
                        "inside the stages, which two threads would order differently on each rank; hint: "
                        "HP_PP_OVERLAP=interleave (the default)", t->pd.dp_shard, t->pd.tp, t->pd.ep);
    return HP_OK;
}

static hp_status_t pp_parallelize_local(hp_trainer_t t, int ac_k) {
    const hp_config_t *c = &t->cfg;
    trainer_pp_t *p = t->pp;
    for (int i = 0; i < p->n_local; i++)
        if (ac_k > 0) HP_TRY(hp_model_set_activation_checkpoint(p->m[i], ac_k));
    HP_TRY(cp_prepare(t, p->m, p->n_local));   /* context parallel (owner cp): before TP */
    if (t->pd.tp > 1) {   // TorchTitan's order: split, then TP per part (the plan's entries it holds)
        hp_tp_plan_entry_t plan[32], mine[32];
        int n = 0;
        HP_TRY(tp_plan(t, plan, &n));
        for (int i = 0; i < p->n_local; i++) {
            hp_module_t *mods[4096];
            const int nm = hp_model_modules(p->m[i], mods, 4096);
            int k = 0;
            for (int e = 0; e < n; e++) {
                int hit = 0;
                for (int j = 0; j < nm && j < 4096 && !hit; j++) {
                    hit = mods[j]->name[0] && fnmatch(plan[e].pattern, mods[j]->name, 0) == 0;
                    for (int q = 0; mods[j]->n_params > 1 && q < mods[j]->n_params && !hit; q++) {   // fused parts
                        char pn[HP_PARAM_NAME_MAX];
                        snprintf(pn, sizeof pn, "%s", mods[j]->params[q]->name);
                        char *dot = strrchr(pn, '.');
                        if (dot && !strcmp(dot, ".weight")) *dot = '\0';
                        hit = fnmatch(plan[e].pattern, pn, 0) == 0;
                    }
                }
                if (hit) mine[k++] = plan[e];
            }
            HP_TRY(hp_tp_parallelize_model(&p->tp[i], p->m[i], t->tp_mesh, mine, k));
        }
        t->clip_comms[t->n_clip_comms++] = hp_mesh_get_comm(t->tp_mesh, 0);
    }
    /* expert parallel / the experts' TP (owner moe): per stage, after TP, before init */
    for (int i = 0; i < p->n_local; i++) HP_TRY(ep_apply(t, p->m[i], i == 0, &p->ep[i], &p->ep_tp[i]));
    t->ep = p->ep[0];       /* borrowed: pp_free destroys the stages' handles */
    t->ep_tp = p->ep_tp[0];
    HP_TRY(cp_install(t, p->m, p->n_local));   /* context parallel (owner cp): per stage, after TP */
    for (int i = 0; i < p->n_local; i++) HP_TRY(hp_model_init_weights(p->m[i], (uint64_t)c->training.seed));
    if (t->pd.dp_shard > 1 || t->pd.cp > 1) {   /* owner cp: FSDP over dp_shard x cp sums the cp ranks' grads */
        const char *names[2] = {"dp_replicate", "dp_shard"};
        const int two = t->pd.dp_replicate > 1;
        if (t->pd.cp > 1) HP_TRY(cp_fsdp_mesh(t));   /* owner cp */
        else HP_TRY(hp_mesh_slice(t->meshes.world, two ? 2 : 1, two ? names : names + 1, &t->dp_mesh));
        hp_fsdp_options_t fo = fsdp_options(c, 1);
        if (t->ep) {   /* expert parallel (owner moe): the experts stay on the sparse mesh, as without PP */
            for (int i = 0; i < p->n_local; i++) HP_TRY(hp_ep_restore_dense_layout(p->ep[i], p->m[i]));
            fo.ignored_params = hp_ep_is_expert_param;
            t->ep_n_expert_comms = t->n_clip_comms;
            memcpy(t->ep_expert_comms, t->clip_comms, sizeof t->clip_comms);
        }
        for (int i = 0; i < p->n_local; i++) HP_TRY(hp_fully_shard(p->m[i], t->dp_mesh, &fo, &p->fsdp[i]));
        t->n_clip_comms = hp_fsdp_grad_comms(p->fsdp[0], t->clip_comms);
    } else if (t->ep) {
        return hp_error(HP_ERR_STATE, "pipeline: expert parallel without FSDP of the dense parameters "
                        "(data_parallel_shard_degree %d)", t->pd.dp_shard);
    }
    HP_TRY(pp_full_table(t));
    t->params = p->full;
    t->np = p->np;
    p->comm = hp_mesh_get_comm(t->meshes.world, HP_PD_PP);
    t->clip_comms[t->n_clip_comms++] = p->comm;   // the norm's square summed over pp
    if (t->ep) {   /* owner moe: dense and expert parts, each summed over its comms and pp */
        t->ep_expert_comms[t->ep_n_expert_comms++] = p->comm;
        HP_TRY(ep_norm_setup(t, p->norm, p->n_norm));
    }
    return HP_OK;
}

/* After the schedule: the two copies of a tied weight get the sum of both gradients. */
static hp_status_t pp_tie_grads(hp_trainer_t t) {
    trainer_pp_t *p = t->pp;
    if (!t->mcfg.tie_embeddings) return HP_OK;
    if (!p->tie_comm) return HP_OK;   // a middle stage holds no copy
    hp_tensor_t *g = &p->full[p->tie_idx].grad.local;
    return hp_all_reduce(g->data, g->data, (size_t)hp_tensor_numel(g), HP_F32, HP_SUM, p->tie_comm, NULL);
}

static hp_status_t pp_zero_grad(hp_trainer_t t) {
    trainer_pp_t *p = t->pp;
    for (int i = 0; i < p->n_local; i++) {
        HP_TRY(hp_model_zero_grad(p->m[i]));
        if (p->fsdp[i]) HP_TRY(hp_fsdp_zero_grad(p->fsdp[i]));
    }
    return HP_OK;
}

/* The final weights under PP: every parameter is gathered within its stage's ranks
 * (full_tensor over FSDP) and sent by the stage's first rank to world rank 0. */
static hp_status_t pp_gather_weights(hp_trainer_t t, hp_model_t full) {
    trainer_pp_t *p = t->pp;
    const int per = t->world_size / t->pd.pp, sub = t->rank % per;
    hp_status_t s = HP_OK;
    float *buf = NULL;
    size_t cap = 0;
    for (int i = 0; s == HP_OK && i < p->np; i++) {
        const int holder = p->stage_to_rank[p->stage_of[i]];
        const int64_t n = t->rank == 0 ? hp_tensor_numel(&hp_model_params(full)[i].value.local) : 0;
        int64_t numel = 1;
        for (int a = 0; a < p->full[i].value.local.ndim; a++) numel *= p->full[i].value.global_shape[a];
        if (!p->full[i].value.mesh) numel = hp_tensor_numel(&p->full[i].value.local);
        if (p->coord == holder) {
            if ((size_t)numel > cap) {
                free(buf);
                cap = (size_t)numel;
                buf = hp_malloc(sizeof(float) * cap);
                if (!buf) return HP_ERR_OOM;
            }
            if (p->full[i].value.mesh) {
                hp_dtensor_mem_t mem = {NULL, buf, sizeof(float) * (size_t)numel};
                hp_tensor_t out;
                s = hp_dtensor_full_tensor(&out, NULL, &mem, &p->full[i].value);
            } else {
                memcpy(buf, p->full[i].value.local.data, sizeof(float) * (size_t)numel);
            }
            if (s == HP_OK && sub == 0 && t->rank != 0)
                s = hp_send_tag(buf, (size_t)numel, HP_F32, 0, 1 + i, t->world, NULL);
            if (s == HP_OK && t->rank == 0) memcpy(hp_model_params(full)[i].value.local.data, buf, sizeof(float) * (size_t)n);
        } else if (t->rank == 0) {
            s = hp_recv_tag(hp_model_params(full)[i].value.local.data, (size_t)n, HP_F32, holder * per, 1 + i, t->world,
                            NULL);
        }
    }
    free(buf);
    return s;
}
/* --- end pipeline parallel ---------------------------------------------------------------- */

static hp_status_t build_local(hp_trainer_t t, int *ac_k_out) {
    const hp_config_t *c = &t->cfg;
    HP_TRY(hp_config_validate(c));
    pin_threads(c);
    HP_TRY(refuse_unimplemented(c));
    int ac_k = 0;
    HP_TRY(ac_every_k(c, &ac_k));
    HP_TRY(hp_parallel_dims_from_config(c, t->world_size, &t->pd));
    HP_TRY(hp_parallel_dims_check_implemented(&t->pd, HP_TRAINER_IMPLEMENTED));
    t->B = (int)c->training.local_batch_size;
    t->T = (int)c->training.seq_len;
    t->val_B = c->validation.local_batch_size > 0 ? (int)c->validation.local_batch_size : t->B;
    HP_TRY(hp_config_grad_accum_steps(c, hp_parallel_dims_dp(&t->pd), &t->accum));

    /* tokenizer: the model's vocabulary follows it (TorchTitan's update_from_config) */
    if (!c->tokenizer.path[0])
        return hp_error(HP_ERR_INVALID_ARG, "tokenizer.path is empty; expected a tokenizer.json (make one with "
                                            "`hp-tokenizer train --vocab-size 2048 --output tokenizer.json FILES`)");
    HP_TRY(hp_tokenizer_load(&t->tok, c->tokenizer.path));
    /* the flavor with the model.* overrides, validated; vocab from the tokenizer, context T */
    char tok_what[HP_CONFIG_STR_MAX + 32];
    snprintf(tok_what, sizeof tok_what, "tokenizer.path '%s'", c->tokenizer.path);
    HP_TRY(hp_config_resolve_model(c, hp_tokenizer_vocab_size(t->tok), tok_what, t->T, &t->mcfg));
    HP_TRY(moe_check_layout(t));   /* mixture of experts (owner moe) */
    HP_TRY(check_cp_layout(c, &t->mcfg, &t->pd));   /* context parallel (owner cp) */
    /* pipeline parallel (owner pp) with an MoE model: each stage's MoE layers get expert
     * parallel / the experts' TP as the whole model does (ep_apply, per local stage) */
    /* context parallel with an MoE model: each cp rank routes its sequence shard (dispatched
     * over ep, which borrows from dp_shard x cp); not yet inside pipeline stages */
    if (t->pd.cp > 1 && t->mcfg.moe_experts > 0 && t->pd.pp > 1)
        return hp_error(HP_ERR_UNSUPPORTED, "parallelism.context_parallel_degree %d with the MoE model %s and "
                        "parallelism.pipeline_parallel_degree %d is not supported yet; hint: set "
                        "pipeline_parallel_degree 1 (context parallel of MoE models runs without pipeline stages)",
                        t->pd.cp, t->mcfg.name, t->pd.pp);
    if (t->pd.pp > 1) HP_TRY(pp_create_stages(t));   /* pipeline parallel (owner pp): the local stages only */
    else HP_TRY(hp_model_create(&t->mcfg, t->B > t->val_B ? t->B : t->val_B, t->T, &t->model));
    *ac_k_out = ac_k;
    return HP_OK;
}

/* --- tensor parallel (owner tp): the tp mesh and TorchTitan's plan for the model --- */
static hp_status_t tp_plan(hp_trainer_t t, hp_tp_plan_entry_t plan[32], int *n) {
    const hp_config_t *c = &t->cfg;
    const char *tpn[1] = {"tp"};
    HP_TRY(hp_mesh_slice(t->meshes.world, 1, tpn, &t->tp_mesh));
    const int sp = c->parallelism.enable_sequence_parallel, lp = c->parallelism.enable_loss_parallel;
    *n = t->mcfg.mla ? hp_tp_deepseek_v3_plan(plan, 32, sp, lp, t->mcfg.q_lora_rank)
         : strcmp(t->mcfg.name, "qwen3") == 0 ? hp_tp_qwen3_plan(plan, 32, sp, lp) : hp_tp_llama3_plan(plan, 32, sp, lp);
    if (sp && t->T % t->pd.tp != 0)
        return hp_error(HP_ERR_INVALID_ARG, "training.seq_len %d is not divisible by parallelism.tensor_parallel_degree %d "
                        "(sequence parallel shards the sequence); hint: use a multiple of %d or "
                        "--parallelism.enable_sequence_parallel=false", t->T, t->pd.tp, t->pd.tp);
    return check_tp_layout(c, &t->mcfg, t->pd.tp);
}

/* --- expert parallel (owner moe): experts Shard(0) over the sparse mesh's ep dim before
 * the weights are drawn, FSDP-sharded over efsdp when efsdp > 1; expert grads are summed
 * over dp_replicate (and efsdp by the reduce-scatter); the dense ones are FSDP-sharded over
 * the dense fsdp mesh (fully_shard with the experts ignored). Applied to one model: the whole
 * model, or one pipeline stage (under PP every rank of an ep group is in the same stage: the
 * sparse mesh's pp dim is outermost, so its ep / efsdp / dp_replicate slices stay inside one
 * pp coordinate, and the ranks run the same action list, so their all-to-alls line up). The
 * meshes and the norm's comms are made on the first call. --- */
static hp_status_t ep_apply(hp_trainer_t t, hp_model_t m, int first, hp_ep_t *ep, hp_ep_t *ep_tp) {
    const char *drn[1] = {"dp_replicate"}, *epn[1] = {"ep"};
    const int efsdp = hp_parallel_dims_efsdp(&t->pd);
    if (t->pd.ep > 1 && t->pd.etp > 1 && efsdp == 1) {   /* ETP: the sparse (ep, etp) */
        if (first) {
            const char *n2[2] = {"ep", "etp"};
            HP_TRY(hp_mesh_slice(t->meshes.sparse, 2, n2, &t->etp_mesh));
            HP_TRY(hp_mesh_slice(t->meshes.sparse, 1, epn, &t->ep_mesh));
            if (t->pd.dp_replicate > 1) HP_TRY(hp_mesh_slice(t->meshes.sparse, 1, drn, &t->ep_grad_mesh[1]));
            t->clip_comms[t->n_clip_comms++] = hp_mesh_get_comm(t->ep_mesh, 0);   // after TP's tp comm
        }
        return hp_ep_parallelize_model_etp(m, t->etp_mesh, ep);
    }
    if (t->pd.ep > 1 && t->pd.etp > 1) {
        /* ETP with expert FSDP: the sparse (efsdp, ep, etp); F over etp, the F slices FSDP-sharded
         * over efsdp (all-gathered per use, grads reduce-scattered) */
        if (first) {
            const char *n3[3] = {"efsdp", "ep", "etp"};
            HP_TRY(hp_mesh_slice(t->meshes.sparse, 3, n3, &t->etp_mesh));
            HP_TRY(hp_mesh_slice(t->meshes.sparse, 1, epn, &t->ep_mesh));
            if (t->pd.dp_replicate > 1) HP_TRY(hp_mesh_slice(t->meshes.sparse, 1, drn, &t->ep_grad_mesh[1]));
            t->clip_comms[t->n_clip_comms++] = hp_mesh_get_comm(t->etp_mesh, 1);   // ep, after TP's tp comm
            t->clip_comms[t->n_clip_comms++] = hp_mesh_get_comm(t->etp_mesh, 0);   // efsdp
        }
        return hp_ep_parallelize_model_efsdp(m, t->etp_mesh, ep);
    }
    if (t->pd.ep > 1 && efsdp > 1) {
        /* experts FSDP-sharded over efsdp (all-gather per use, reduce-scatter of the grads) */
        if (first) {
            const char *n2[2] = {"efsdp", "ep"};
            HP_TRY(hp_mesh_slice(t->meshes.sparse, 2, n2, &t->etp_mesh));
            HP_TRY(hp_mesh_slice(t->meshes.sparse, 1, epn, &t->ep_mesh));
            if (t->pd.dp_replicate > 1) HP_TRY(hp_mesh_slice(t->meshes.sparse, 1, drn, &t->ep_grad_mesh[1]));
            t->clip_comms[t->n_clip_comms++] = hp_mesh_get_comm(t->etp_mesh, 1);   // ep
            t->clip_comms[t->n_clip_comms++] = hp_mesh_get_comm(t->etp_mesh, 0);   // efsdp
        }
        return hp_ep_parallelize_model_efsdp(m, t->etp_mesh, ep);
    }
    if (t->pd.ep > 1) {
        if (first) {
            HP_TRY(hp_mesh_slice(t->meshes.sparse, 1, epn, &t->ep_mesh));
            if (t->pd.dp_replicate > 1) HP_TRY(hp_mesh_slice(t->meshes.sparse, 1, drn, &t->ep_grad_mesh[1]));
            if (t->pd.tp > 1)   /* ep borrows tp ranks (etp 1): dense keep the TP plan's comms, experts sum over ep only */
                t->ep_expert_comms[t->ep_n_expert_comms++] = hp_mesh_get_comm(t->ep_mesh, 0);
            else
                t->clip_comms[t->n_clip_comms++] = hp_mesh_get_comm(t->ep_mesh, 0);   // dense counted once, experts summed
        }
        return hp_ep_parallelize_model(m, t->ep_mesh, ep);
    }
    /* TP of the experts alone (EP = 1): hidden F sharded over tp, partial outputs all-reduced */
    if (t->pd.tp > 1 && t->mcfg.moe_experts > 0) return hp_ep_tensor_parallel_experts(m, t->tp_mesh, ep_tp);
    return HP_OK;
}
/* --- end expert parallel --- */

/* AC, TP, init and data parallel of the (whole) model. */
static hp_status_t parallelize(hp_trainer_t t, int ac_k) {
    const hp_config_t *c = &t->cfg;
    if (ac_k > 0) HP_TRY(hp_model_set_activation_checkpoint(t->model, ac_k));
    HP_TRY(cp_prepare(t, &t->model, 1));   /* context parallel (owner cp): before TP */
    /* --- tensor parallel (owner tp): TorchTitan's plan on the tp mesh, before the weights
     * are drawn (each rank draws its shards at their global indices) --- */
    if (t->pd.tp > 1) {
        hp_tp_plan_entry_t plan[32];
        int n = 0;
        HP_TRY(tp_plan(t, plan, &n));
        HP_TRY(hp_tp_parallelize_model(&t->tp, t->model, t->tp_mesh, plan, n));
        t->clip_comms[t->n_clip_comms++] = hp_mesh_get_comm(t->tp_mesh, 0);
    }
    /* --- end tensor parallel --- */
    HP_TRY(ep_apply(t, t->model, 1, &t->ep, &t->ep_tp));   /* expert parallel (owner moe), before init */
    /* sequence parallel around the MoE layers: the MoE input stays Shard(seq) over tp, each tp
     * rank routes its own tokens (TorchTitan's MoE layouts with SP on) */
    if (t->mcfg.moe_experts > 0 && t->pd.tp > 1 && c->parallelism.enable_sequence_parallel) {
        t->ep_sp = t->ep ? t->ep : t->ep_tp;
        HP_TRY(hp_ep_enable_sequence_parallel(t->ep_sp, t->model, t->tp_mesh));
    }
    /* --- context parallel (owner cp): ring / Ulysses cores over the cp dim, after TP (on
     * the local heads) and before FSDP, which then shards over dp_shard x cp --- */
    HP_TRY(cp_install(t, &t->model, 1));
    /* --- end context parallel --- */
    HP_TRY(hp_model_init_weights(t->model, (uint64_t)c->training.seed));
    /* --- data parallel (owner fsdp) --- */
    t->params = hp_model_params(t->model);
    t->np = hp_model_num_params(t->model);
    if (t->pd.dp_shard > 1 || t->pd.cp > 1) {   /* owners cp (dp_shard x cp), moe (dense params under EP) */
        /* fully_shard every unit (embedding, blocks, norm + output) over (dp_shard) or, with
         * dp_replicate > 1, HSDP over (dp_replicate, dp_shard); reductions are sums since the
         * loss is globally normalised (gradient divide factor 1, docs/fsdp.md) */
        const char *names[2] = {"dp_replicate", "dp_shard"};
        const int two = t->pd.dp_replicate > 1;
        if (t->pd.cp > 1) HP_TRY(cp_fsdp_mesh(t));   /* context parallel (owner cp): (dp_shard, cp) flattened */
        else
        HP_TRY(hp_mesh_slice(t->meshes.world, two ? 2 : 1, two ? names : names + 1, &t->dp_mesh));
        hp_fsdp_options_t fo = fsdp_options(c, 0);
        if (t->ep) {   /* expert parallel (owner moe): the experts stay on the sparse mesh (ep.c) */
            HP_TRY(hp_ep_restore_dense_layout(t->ep, t->model));
            fo.ignored_params = hp_ep_is_expert_param;
            if (!t->ep_n_expert_comms) {   // EP borrowing tp set its own (ep) above
                t->ep_n_expert_comms = t->n_clip_comms;
                memcpy(t->ep_expert_comms, t->clip_comms, sizeof t->clip_comms);
            }
        }
        HP_TRY(hp_fully_shard(t->model, t->dp_mesh, &fo, &t->fsdp));
        t->params = hp_fsdp_params(t->fsdp);
        t->n_clip_comms = hp_fsdp_grad_comms(t->fsdp, t->clip_comms);   /* shard, replicate, tp */
        if (t->ep) HP_TRY(ep_norm_setup(t, t->params, t->np));   /* expert parallel (owner moe) */
    } else if (t->dp_size > 1 && !t->mcfg.tie_embeddings && !t->ep) {
        /* DDP: gradient buckets (1 MiB first, 25 MiB cap) all-reduced (SUM) asynchronously as
         * they fill during backward; no_sync on all micro-batches but the last. Tied
         * embeddings keep the per-parameter all-reduce after backward (step 4). */
        hp_ddp_options_t dop = hp_ddp_default_options();
        dop.average = 0;
        HP_TRY(hp_ddp_create(t->model, t->dp_comm, &dop, &t->ddp));
    }
    /* expert parallel (owner moe) borrowing tp ranks without FSDP: dense over the TP comms, experts over ep */
    if (t->ep && !t->ep_norm_p && t->ep_n_expert_comms) HP_TRY(ep_norm_setup(t, t->params, t->np));
    /* --- end data parallel --- */
    return HP_OK;
}

static hp_status_t build(hp_trainer_t t) {
    const hp_config_t *c = &t->cfg;
    int ac_k = 0;
    hp_status_t local = build_local(t, &ac_k);
    HP_TRY(t->world ? hp_comm_agree(t->world, local, NULL) : local);
    HP_TRY(t->pp ? pp_parallelize(t, ac_k) : parallelize(t, ac_k));   /* pipeline parallel (owner pp) */
    t->flops_per_token = hp_model_flops_per_token(&t->mcfg, t->T);

    hp_optim_kind_t kind;
    HP_TRY(hp_optim_kind_from_name(c->optimizer.name, &kind));
    hp_optim_config_t oc = hp_optim_default(kind);
    oc.lr = c->optimizer.lr;
    oc.weight_decay = c->optimizer.weight_decay;
    oc.beta1 = c->optimizer.beta1;
    oc.beta2 = c->optimizer.beta2;
    oc.eps = c->optimizer.eps;
    if (kind == HP_OPTIM_SGD) oc.momentum = c->optimizer.momentum;
    if (kind == HP_OPTIM_MUON) oc.muon_momentum = c->optimizer.momentum;
    HP_TRY(hp_optim_create(&oc, t->params, t->np, &t->opt));
    HP_TRY(moe_setup(t, ac_k));   /* mixture of experts (owner moe) */
    hp_lr_decay_t decay;
    HP_TRY(hp_lr_decay_from_name(c->lr_scheduler.decay_type, &decay));
    HP_TRY(hp_lr_schedule_init(&t->lr, c->training.steps, c->lr_scheduler.warmup_steps, c->lr_scheduler.decay_ratio,
                               decay, c->lr_scheduler.min_lr_factor));

    /* data */
    hp_dataset_options_t dso = hp_dataset_options_from_config(c);
    HP_TRY(hp_dataset_open(&dso, &t->ds));
    hp_text_encoder_t enc = {encode_cb, t, hp_tokenizer_bos_id(t->tok), hp_tokenizer_eos_id(t->tok)};
    hp_dataloader_options_t dlo = {HP_SPLIT_TRAIN, t->T, t->B, t->dp_rank, t->dp_size, c->data.loop,
                                   t->mcfg.vocab_size};
    HP_TRY(hp_dataloader_create(t->ds, &enc, &dlo, &t->dl));
    if (c->validation.enable) {
        if (hp_dataset_num_documents(t->ds, HP_SPLIT_VALIDATION) == 0)
            return hp_error(HP_ERR_INVALID_ARG, "validation.enable = true but the validation split of '%s' is empty; "
                                                "set data.validation_fraction > 0", c->data.path);
        hp_dataloader_options_t vo = dlo;
        vo.split = HP_SPLIT_VALIDATION;
        vo.batch_size = t->val_B;
        vo.loop = false;
        HP_TRY(hp_dataloader_create(t->ds, &enc, &vo, &t->val_dl));
    }

    /* one buffer serves the training micro-batches (accum x B rows) and a validation batch
     * (val_B rows, which validation.local_batch_size may make larger) */
    size_t rows = (size_t)t->accum * (size_t)t->B;
    if ((size_t)t->val_B > rows) rows = (size_t)t->val_B;
    size_t n = rows * (size_t)t->T;
    t->inputs = hp_malloc(n * sizeof(int32_t));
    t->labels = hp_malloc(n * sizeof(int32_t));
    t->grad_work = hp_calloc((size_t)t->np + 1, sizeof(hp_work_t));
    if (!t->inputs || !t->labels || !t->grad_work) return HP_ERR_OOM;
    if (t->cp) {   /* context parallel (owner cp) */
        t->cp_inputs = hp_malloc(rows * (size_t)t->Tl * sizeof(int32_t));
        t->cp_labels = hp_malloc(rows * (size_t)t->Tl * sizeof(int32_t));
        if (!t->cp_inputs || !t->cp_labels) return HP_ERR_OOM;
    }

    int metrics_rank = hp_parallel_dims_metrics_rank(&t->pd);
    hp_metrics_options_t mo = hp_metrics_options_from_config(c, t->rank, t->rank == metrics_rank, t->flops_per_token,
                                                             hp_parallel_dims_non_dp(&t->pd), &t->metric_paths);
    HP_TRY(probe_outputs(t));
    mo.total_steps = c->training.steps;
    HP_TRY(hp_metrics_create(&mo, &t->metrics));
    return HP_OK;
}

/* --- mixture of experts (owner moe) -------------------------------------------------------
 * TorchTitan's aux-loss-free load balancing as an optimizer step pre-hook: the step's tokens
 * per expert of every MoE layer, summed over the batch mesh (each dp rank routes its own
 * tokens; TP ranks see the same tokens and are not summed, except under sequence parallel,
 * where each routes its own sequence shard and they are; under CP over the loss mesh, batch x
 * cp, since each cp rank routes its own sequence shard), halved for layers whose block is
 * recomputed by activation checkpointing (the recompute counts again), then per layer
 * bias += coeff * sign(mean - c) - mean(...), and the counts are zeroed. The imbalance
 * max/mean and the max/min tokens per expert of each layer go to the metrics (console, JSONL,
 * TensorBoard) on logging steps. */
static hp_status_t moe_pre_step(void *user, hp_optim_t opt) {
    (void)opt;
    hp_trainer_t t = user;
    const int E = t->mcfg.moe_experts;
    const size_t n = (size_t)t->n_moe_all * E;
    memset(t->moe_counts, 0, sizeof(float) * n);
    for (int i = 0; i < t->n_moe; i++) {
        hp_moe_impl_t *M = t->moe_mods[i]->impl;
        memcpy(t->moe_counts + (size_t)t->moe_slot[i] * E, M->tokens_per_expert, sizeof(float) * (size_t)E);
        memset(M->tokens_per_expert, 0, sizeof(float) * (size_t)E);
    }
    /* context parallel: each cp rank routes its sequence shard, so the sum runs over the loss
     * mesh (batch x cp) */
    hp_comm_t cc = t->cp ? hp_mesh_get_comm(t->meshes.loss, 0) : t->dp_comm;
    const int csize = t->dp_size * t->pd.cp;
    if (csize > 1) HP_TRY(hp_all_reduce(t->moe_counts, t->moe_counts, n, HP_F32, HP_SUM, cc, NULL));
    /* sequence parallel: each tp rank routed its own sequence shard (TorchTitan sums over tp too) */
    hp_comm_t spc = t->ep_sp ? hp_mesh_get_comm(t->tp_mesh, 0) : NULL;
    if (spc) HP_TRY(hp_all_reduce(t->moe_counts, t->moe_counts, n, HP_F32, HP_SUM, spc, NULL));
    /* pipeline parallel (owner pp): each layer's row is held by one stage (zeros elsewhere): the
     * sum over pp gathers every layer's counts on every rank, so the logging rank logs them all */
    if (t->pp) HP_TRY(hp_all_reduce(t->moe_counts, t->moe_counts, n, HP_F32, HP_SUM, t->pp->comm, NULL));
    const int64_t step = t->step + 1;
    const int log = hp_metrics_should_log(t->metrics, step);
    if (t->mcfg.moe_aux_loss_coeff > 0.0f) {   /* the auxiliary loss of the step, summed over layers and micro-batches */
        float aux = 0.0f, all = 0.0f;
        for (int i = 0; i < t->n_moe; i++) {
            hp_moe_impl_t *M = t->moe_mods[i]->impl;
            const int layer = atoi(t->moe_mods[i]->name + 7);
            const int recomputed = t->moe_ac_k > 0 && (layer + 1) % t->moe_ac_k == 0;   // counted twice
            aux += (float)(recomputed ? 0.5 * M->aux_loss_sum : M->aux_loss_sum);
            M->aux_loss_sum = 0.0;
        }
        HP_TRY(hp_all_reduce(&aux, &all, 1, HP_F32, HP_SUM, cc, NULL));
        if (spc) {   // mean over the tp ranks' sequence shards as well
            HP_TRY(hp_all_reduce(&all, &all, 1, HP_F32, HP_SUM, spc, NULL));
            all /= (float)t->pd.tp;
        }
        if (t->pp) HP_TRY(hp_all_reduce(&all, &all, 1, HP_F32, HP_SUM, t->pp->comm, NULL));   /* owner pp: every stage's layers */
        if (log) HP_TRY(hp_metrics_log_scalar(t->metrics, "moe/aux_loss", step, all / (csize > 0 ? csize : 1)));
    }
    for (int j = 0; j < t->n_moe_all; j++) {   // every MoE layer; the bias of those held here moves
        float *bias = NULL;
        for (int i = 0; i < t->n_moe; i++)
            if (t->moe_slot[i] == j) bias = ((hp_moe_impl_t *)t->moe_mods[i]->impl)->expert_bias;
        float *c = t->moe_counts + (size_t)j * E;
        const int layer = t->moe_layer[j];
        if (t->moe_ac_k > 0 && (layer + 1) % t->moe_ac_k == 0)
            for (int e = 0; e < E; e++) c[e] *= 0.5f;
        const double imb = hp_moe_update_expert_bias(bias, c, E, bias ? t->mcfg.moe_load_balance_coeff : 0.0f);
        if (!log) continue;
        float mx = c[0], mn = c[0];
        for (int e = 1; e < E; e++) { mx = c[e] > mx ? c[e] : mx; mn = c[e] < mn ? c[e] : mn; }
        char tag[64];
        snprintf(tag, sizeof tag, "moe/layers.%d/imbalance_max_over_mean", layer);
        HP_TRY(hp_metrics_log_scalar(t->metrics, tag, step, imb));
        snprintf(tag, sizeof tag, "moe/layers.%d/tokens_per_expert_max", layer);
        HP_TRY(hp_metrics_log_scalar(t->metrics, tag, step, mx));
        snprintf(tag, sizeof tag, "moe/layers.%d/tokens_per_expert_min", layer);
        HP_TRY(hp_metrics_log_scalar(t->metrics, tag, step, mn));
    }
    return HP_OK;
}

/* After the optimizer exists: finds the MoE modules, registers the hook and lists each
 * expert_bias (f32, replicated) with the parameters the checkpoint saves. */
static hp_status_t moe_setup(hp_trainer_t t, int ac_k) {
    if (t->mcfg.moe_experts <= 0) return HP_OK;
    const int E = t->mcfg.moe_experts;
    const int L = t->mcfg.n_layers;
    t->moe_mods = hp_calloc((size_t)L + 1, sizeof(hp_module_t *));
    t->moe_layer = hp_calloc((size_t)L + 1, sizeof(int));
    t->moe_slot = hp_calloc((size_t)L + 1, sizeof(int));
    if (!t->moe_mods || !t->moe_layer || !t->moe_slot) return HP_ERR_OOM;
    for (int l = 0; l < L; l++)
        if (hp_model_layer_is_moe(&t->mcfg, l)) t->moe_layer[t->n_moe_all++] = l;
    /* pipeline parallel (owner pp): the MoE modules of every local stage */
    const int n_models = t->pp ? t->pp->n_local : 1;
    for (int k = 0; k < n_models; k++) {
        hp_module_t *mods[4096];
        const int nm = hp_model_modules(t->pp ? t->pp->m[k] : t->model, mods, 4096);
        for (int i = 0; i < nm && i < 4096; i++) {
            if (!hp_module_is_moe(mods[i])) continue;
            const int layer = atoi(mods[i]->name + 7);   // "layers.N.moe"
            int j = 0;
            while (j < t->n_moe_all && t->moe_layer[j] != layer) j++;
            if (j == t->n_moe_all || t->n_moe >= L)
                return hp_error(HP_ERR_STATE, "moe: module '%s' is not an MoE layer of model %s", mods[i]->name,
                                t->mcfg.name);
            t->moe_slot[t->n_moe] = j;
            t->moe_mods[t->n_moe++] = mods[i];
        }
    }
    t->moe_ac_k = ac_k;
    t->moe_counts = hp_calloc((size_t)t->n_moe_all * E, sizeof(float));
    t->moe_zero = hp_calloc((size_t)E, sizeof(float));
    t->moe_ckpt_params = hp_calloc((size_t)t->np + t->n_moe_all, sizeof(hp_param_t));
    if (!t->moe_counts || !t->moe_zero || !t->moe_ckpt_params) return HP_ERR_OOM;
    memcpy(t->moe_ckpt_params, t->params, sizeof(hp_param_t) * (size_t)t->np);
    for (int j = 0; j < t->n_moe_all; j++) {   // every rank lists every layer's bias, in layer order
        hp_param_t *p = &t->moe_ckpt_params[t->np + j];
        hp_moe_impl_t *M = NULL;
        for (int i = 0; i < t->n_moe; i++)
            if (t->moe_slot[i] == j) M = t->moe_mods[i]->impl;
        snprintf(p->name, sizeof p->name, "layers.%d.moe.expert_bias", t->moe_layer[j]);
        if (!M) {   /* pipeline parallel (owner pp): another stage's layer, a placeholder as in pp_full_table */
            hp_dtensor_t *v[2] = {&p->value, &p->grad};
            for (int k = 0; k < 2; k++) {
                v[k]->mesh = t->meshes.world;
                v[k]->mesh_ndim = hp_mesh_ndim(t->meshes.world);
                for (int a = 0; a < v[k]->mesh_ndim; a++) v[k]->placements[a] = hp_replicate();
                const int64_t zero[1] = {0};
                HP_TRY(hp_tensor_init(&v[k]->local, HP_F32, 1, zero, t->moe_zero));
                v[k]->global_shape[0] = E;
            }
            continue;
        }
        const int64_t shape[1] = {E};
        HP_TRY(hp_tensor_init(&p->value.local, HP_F32, 1, shape, M->expert_bias));
        HP_TRY(hp_tensor_init(&p->grad.local, HP_F32, 1, shape, t->moe_zero));
        p->value.global_shape[0] = p->grad.global_shape[0] = E;
    }
    return hp_optim_register_step_pre_hook(t->opt, moe_pre_step, t);
}

static void moe_destroy(hp_trainer_t t) {
    free(t->moe_mods);
    free(t->moe_layer);
    free(t->moe_slot);
    free(t->moe_counts);
    free(t->moe_zero);
    free(t->moe_ckpt_params);
    free(t->ep_norm_p);
}

/* Dense FSDP under EP: the dense params are DTensors of the dense fsdp mesh (their squares
 * summed over FSDP's comms), the experts of the sparse mesh (summed over ep / efsdp / tp): one
 * comm list cannot count both once, so the norm is sqrt(dense^2 + experts^2); under PP both
 * lists end with the pp comm (each stage's layers). The table holds descriptors of ps (t->params,
 * or under PP the entries held here, a tied weight's second copy left out; storage does not
 * move). */
static hp_status_t ep_norm_setup(hp_trainer_t t, const hp_param_t *ps, int np) {
    t->ep_norm_p = hp_calloc((size_t)np + 1, sizeof(hp_param_t));
    if (!t->ep_norm_p) return HP_ERR_OOM;
    int n = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < np; i++)
            if (hp_ep_is_expert_param(&ps[i]) == pass) t->ep_norm_p[n++] = ps[i];
    t->ep_n_dense = 0;
    for (int i = 0; i < np; i++) t->ep_n_dense += !hp_ep_is_expert_param(&ps[i]);
    t->ep_n_norm = np;
    return HP_OK;
}

static hp_status_t ep_grad_norm(hp_trainer_t t, double *norm) {
    double dn = 0.0, en = 0.0;
    HP_TRY(hp_grad_norm(t->ep_norm_p, t->ep_n_dense, t->clip_comms, t->n_clip_comms, &dn));
    HP_TRY(hp_grad_norm(t->ep_norm_p + t->ep_n_dense, t->ep_n_norm - t->ep_n_dense, t->ep_expert_comms,
                        t->ep_n_expert_comms, &en));
    *norm = sqrt(dn * dn + en * en);
    return HP_OK;
}

/* Layouts the MoE layers do not support yet, named by key. */
static hp_status_t moe_check_layout(const hp_trainer_t t) {
    if (t->pd.ep > 1 && t->mcfg.moe_experts <= 0)
        return hp_error(HP_ERR_INVALID_ARG, "config key 'parallelism.expert_parallel_degree' = %d needs an MoE model; "
                        "model.name = %s is dense; hint: use deepseek_v3 or qwen3_moe, or set the degree to 1",
                        t->pd.ep, t->mcfg.name);
    /* ETP: experts over the sparse [efsdp, ep, etp] (ep x efsdp = dp_shard x cp, etp = tp) */
    const int etp = t->pd.ep > 1 && t->pd.tp > 1 && t->pd.etp == t->pd.tp;
    if (t->pd.etp > 1 && (!etp || t->mcfg.moe_experts <= 0))
        return hp_error(HP_ERR_UNSUPPORTED, "config key 'parallelism.expert_tensor_parallel_degree' = %d: expert "
                        "tensor parallel needs expert_parallel_degree > 1 (here %d) and an MoE model (model.name %s); "
                        "hint: set expert_parallel_degree, or set expert_tensor_parallel_degree to 1 (with "
                        "expert_parallel_degree 1 the experts are then tensor parallel on their hidden dim)",
                        t->pd.etp, t->pd.ep, t->mcfg.name);
    /* TP with an MoE model: the dense layers follow the TP plan; the routed experts are sharded
     * on their hidden dim over tp (hp_ep_tensor_parallel_experts, ETP) or EP borrows the tp
     * ranks (etp 1). Under sequence parallel each tp rank routes its own sequence shard
     * (hp_ep_enable_sequence_parallel). EP borrowing tp needs that: with a Replicate MoE input
     * every tp rank would dispatch the same tokens. */
    const int borrow = t->mcfg.moe_experts > 0 && t->pd.tp > 1 && t->pd.ep > 1 && t->pd.etp == 1;
    if (t->mcfg.moe_experts > 0 && t->pd.tp > 1 && t->pd.pp > 1 && t->cfg.parallelism.enable_sequence_parallel)
        return hp_error(HP_ERR_UNSUPPORTED, "config key 'parallelism.enable_sequence_parallel' = true with "
                        "tensor_parallel_degree %d, pipeline_parallel_degree %d and the MoE model '%s': sequence "
                        "parallel around MoE layers is not implemented inside pipeline stages; hint: "
                        "--parallelism.enable_sequence_parallel=false (the experts are then tensor parallel on their "
                        "hidden dim, or ETP)", t->pd.tp, t->pd.pp, t->mcfg.name);
    if (borrow && !t->cfg.parallelism.enable_sequence_parallel)
        return hp_error(HP_ERR_UNSUPPORTED, "config key 'parallelism.enable_sequence_parallel' = false with "
                        "expert_parallel_degree %d borrowing tensor_parallel_degree %d ranks (expert_tensor_parallel_degree "
                        "1): the tokens must be sequence-sharded over tp before dispatch (TorchTitan's EP + TP); hint: "
                        "--parallelism.enable_sequence_parallel=true, or expert_tensor_parallel_degree = %d (ETP)",
                        t->pd.ep, t->pd.tp, t->pd.tp);
    if (borrow && t->pd.ep != t->pd.dp_shard * t->pd.cp * t->pd.tp)
        return hp_error(HP_ERR_UNSUPPORTED, "config keys 'parallelism.expert_parallel_degree' = %d and "
                        "'parallelism.tensor_parallel_degree' = %d with expert_tensor_parallel_degree 1: EP borrowing tp "
                        "ranks is implemented for expert_parallel_degree = data_parallel_shard_degree x "
                        "context_parallel_degree x tensor_parallel_degree (= %d here, expert FSDP degree 1); hint: set "
                        "expert_parallel_degree to %d, or expert_tensor_parallel_degree = %d (ETP)", t->pd.ep, t->pd.tp,
                        t->pd.dp_shard * t->pd.cp * t->pd.tp, t->pd.dp_shard * t->pd.cp * t->pd.tp, t->pd.tp);
    const int efsdp = hp_parallel_dims_efsdp(&t->pd);
    if (t->mcfg.moe_experts > 0 && t->pd.tp > 1 && t->pd.ep > 1 && efsdp > 1 &&
        t->cfg.parallelism.enable_sequence_parallel)
        return hp_error(HP_ERR_UNSUPPORTED, "config key 'parallelism.enable_sequence_parallel' = true with expert FSDP "
                        "degree %d (expert_parallel_degree %d x expert_tensor_parallel_degree %d of data_parallel_shard_degree "
                        "x context_parallel_degree x tensor_parallel_degree = %d ranks): sequence parallel around MoE "
                        "layers is implemented for expert FSDP degree 1; hint: --parallelism.enable_sequence_parallel=false, "
                        "or expert_parallel_degree = %d", efsdp, t->pd.ep, t->pd.etp, t->pd.dp_shard * t->pd.cp * t->pd.tp,
                        t->pd.dp_shard * t->pd.cp * t->pd.tp / t->pd.etp);
    return HP_OK;
}
/* --- end mixture of experts ---------------------------------------------------------------- */

/* --- checkpoint (owner dcp): the state the manager saves and restores ---------------------- */
static hp_ckpt_train_state_t ckpt_state(hp_trainer_t t) {
    hp_ckpt_train_state_t st = {t->params, t->np, hp_model_config(t->model),
                                t->opt, t->dl, &t->step, &t->ckpt_seed};
    if (t->moe_ckpt_params) {   /* mixture of experts (owner moe): expert_bias is checkpointed */
        st.params = t->moe_ckpt_params;
        st.n_params = t->np + t->n_moe_all;
    }
    return st;
}

/* Collective (after the start-up agreement): creates the manager and resumes. */
static hp_status_t ckpt_setup(hp_trainer_t t) {
    if (!t->cfg.checkpoint.enable) return HP_OK;
    t->ckpt_seed = (uint64_t)t->cfg.training.seed;
    HP_TRY(hp_ckpt_manager_create(&t->cfg, t->world, &t->ckpt));
    hp_ckpt_train_state_t st = ckpt_state(t);
    int64_t step = 0;
    int loaded = 0;
    HP_TRY(hp_ckpt_manager_load(t->ckpt, &st, &step, &loaded));
    if (loaded && t->ckpt_seed != (uint64_t)t->cfg.training.seed && t->rank == 0)
        hp_log(HP_LOG_WARN, "checkpoint was trained with seed %llu, the config says %lld",
               (unsigned long long)t->ckpt_seed, (long long)t->cfg.training.seed);
    return HP_OK;
}
/* --- end checkpoint ------------------------------------------------------------------------ */

hp_status_t hp_trainer_create(const hp_config_t *cfg, hp_comm_t world, hp_trainer_t *out) {
    *out = NULL;
    hp_trainer_t t = hp_calloc(1, sizeof *t);
    if (!t) return HP_ERR_OOM;
    t->cfg = *cfg;
    t->world = world;
    t->rank = hp_comm_rank(world);
    t->world_size = hp_comm_size(world);
    /* ParallelDims first (pure arithmetic, identical on every rank), then the meshes. */
    hp_status_t s = hp_parallel_dims_from_config(cfg, t->world_size, &t->pd);
    if (s == HP_OK) s = hp_parallel_dims_check_implemented(&t->pd, HP_TRAINER_IMPLEMENTED);
    if (s == HP_OK) s = hp_parallel_dims_build_mesh(&t->pd, world, &t->meshes);
    if (s == HP_OK) {
        t->dp_comm = hp_mesh_get_comm(t->meshes.batch, 0);
        t->dp_rank = hp_comm_rank(t->dp_comm);
        t->dp_size = hp_comm_size(t->dp_comm);
        s = build(t);
    }
    /* every rank learns whether any failed, with the failing rank's message (rank 0 prints it) */
    s = hp_comm_agree(world, s, NULL);
    if (s == HP_OK) s = hp_comm_agree(world, ckpt_setup(t), NULL);   /* checkpoint (owner dcp): resume */
    if (s != HP_OK) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", hp_last_error());
        hp_trainer_destroy(t);
        return hp_error(s, "%s", msg);
    }
    if (t->pp) {   /* pipeline parallel (owner pp): every pp rank's share, printed by rank 0 */
        trainer_pp_t *p = t->pp;
        double mine[3] = {0, 0, 0}, all[3 * 64];
        for (int i = 0; i < p->n_local; i++) {
            size_t pb, gb, ab, wb, fw = 0;
            hp_model_memory(p->m[i], &pb, &gb, &ab, &wb);
            if (p->fsdp[i]) hp_fsdp_memory(p->fsdp[i], &pb, &gb, &fw);
            mine[0] += (double)pb;
        }
        size_t cb = 0, bb = 0;
        hp_pp_memory(p->rt, &cb, &bb);
        mine[1] = (double)cb;
        mine[2] = (double)bb;
        float mf[3] = {(float)mine[0], (float)mine[1], (float)mine[2]}, af[3 * 64];
        if (t->pd.pp <= 64 && hp_all_gather(mf, af, 3, HP_F32, p->comm, NULL) == HP_OK && t->rank == 0) {
            for (int r = 0; r < t->pd.pp; r++) for (int k = 0; k < 3; k++) all[3 * r + k] = af[3 * r + k];
            static const char *const ov[4] = {"default", "off", "interleave", "thread"};
            hp_log(HP_LOG_INFO, "pipeline: %s, %d stages over %d pp ranks (%s mapping), %d micro-batches of %d "
                   "sequences; OVERLAP_F_B %s, %d coalesced send/receive pairs on rank 0 (HP_PP_OVERLAP, HP_PP_P2P)",
                   t->cfg.parallelism.pipeline_parallel_schedule_csv[0] ? t->cfg.parallelism.pipeline_parallel_schedule_csv
                                                                    : t->cfg.parallelism.pipeline_parallel_schedule,
                   p->S, t->pd.pp, p->S > t->pd.pp && p->stage_to_rank[t->pd.pp] == t->pd.pp - 1 ? "V" : "loop",
                   p->n_mb, p->mbs, ov[hp_pp_overlap_mode(p->rt) & 3], hp_pp_coalesced_pairs(p->rt));
            for (int r = 0; r < t->pd.pp; r++) {
                char st[256] = "";
                for (int s = 0, n = 0; s < p->S; s++)
                    if (p->stage_to_rank[s] == r)
                        n += snprintf(st + n, sizeof st - (size_t)n, "%s%d[units %d-%d]", n ? " " : "", s, p->unit_lo[s],
                                      p->unit_lo[s + 1] - 1);
                hp_log(HP_LOG_INFO, "pipeline rank %d: stages %s; parameters %.2f MiB, micro-batch contexts %.2f MiB, "
                       "p2p buffers %.2f MiB", r, st, all[3 * r] / 1048576.0, all[3 * r + 1] / 1048576.0,
                       all[3 * r + 2] / 1048576.0);
            }
            if (p->mpipe)
                hp_log(HP_LOG_INFO, "pipeline MPipe: preprocess units [0, %lld) replicated on the helpers, %.2f MiB "
                       "broadcast from stage 0 per step", (long long)t->cfg.parallelism.pipeline_parallel_mpipe_transpose_layers + 1,
                       (double)hp_pp_mpipe_broadcast_bytes(p->rt) / 1048576.0);
        }
    }
    if (t->rank == 0) {
        size_t pb, gb, ab, wb;
        hp_model_memory(t->model, &pb, &gb, &ab, &wb);
        if (t->fsdp) {   /* data parallel (owner fsdp): sharded params/grads, gather workspace */
            size_t fw = 0;
            hp_fsdp_memory(t->fsdp, &pb, &gb, &fw);
            wb += fw;
        }
        char dims[256];
        hp_log(HP_LOG_INFO, "model %s %s: %lld parameters, vocab %d, %.3g FLOPs/token (seq %d)", t->mcfg.name,
               t->mcfg.flavor, (long long)hp_model_param_count(&t->mcfg, 0), t->mcfg.vocab_size, t->flops_per_token,
               t->T);
        char md[1024], ov[1024];
        hp_config_describe_model(&t->mcfg, md, sizeof md);
        hp_config_model_overrides(cfg, ov, sizeof ov);
        hp_log(HP_LOG_INFO, "model dims: %s%s%s%s", md, ov[0] ? " (flavor overridden by " : "", ov, ov[0] ? ")" : "");
        hp_log(HP_LOG_INFO, "parallel dims: %s; grad accumulation %lld; global batch %lld x %d tokens",
               hp_parallel_dims_str(&t->pd, dims, sizeof dims), (long long)t->accum,
               (long long)(t->accum * t->B * t->dp_size), t->T);
        hp_log(HP_LOG_INFO, "memory per rank: parameters %.1f MiB, gradients %.1f MiB, optimizer %.1f MiB, "
                            "activations %.1f MiB, workspace %.1f MiB",
               pb / 1048576.0, gb / 1048576.0, hp_optim_state_bytes(t->opt) / 1048576.0, ab / 1048576.0,
               wb / 1048576.0);
        /* which figure MFU divides by */
        double peak = hp_metrics_peak_flops(t->metrics);
        if (peak > 0 && cfg->metrics.peak_flops > 0)
            hp_log(HP_LOG_INFO, "mfu: peak %.4g FLOP/s per rank, as configured (metrics.peak_flops)", peak);
        else if (peak > 0)
            hp_log(HP_LOG_INFO, "mfu: peak %.4g FLOP/s per rank, measured (fastest float32 sgemm at start-up); set "
                                "metrics.peak_flops to state the figure", peak);
        else
            hp_log(HP_LOG_INFO, "mfu: not reported (metrics.peak_flops = %g)", cfg->metrics.peak_flops);
    }
    *out = t;
    return HP_OK;
}

void hp_trainer_destroy(hp_trainer_t t) {
    if (!t) return;
    if (t->ckpt && hp_ckpt_manager_destroy(t->ckpt) != HP_OK)   /* checkpoint (owner dcp): finish an async save */
        hp_log(HP_LOG_ERROR, "checkpoint: %s", hp_last_error());
    hp_metrics_destroy(t->metrics);
    free(t->inputs);
    free(t->labels);
    free(t->grad_work);
    hp_dataloader_destroy(t->val_dl);
    hp_dataloader_destroy(t->dl);
    hp_dataset_close(t->ds);
    hp_token_ids_free(&t->scratch);
    hp_tokenizer_free(t->tok);
    hp_optim_free(t->opt);
    if (t->pp) {   /* pipeline parallel (owner pp): the stages (t->model among them), their FSDP and EP */
        pp_free(t->pp);
        t->model = NULL;
        t->ep = t->ep_tp = NULL;
    }
    hp_fsdp_destroy(t->fsdp);   /* data parallel (owner fsdp) */
    hp_ddp_destroy(t->ddp);
    hp_mesh_destroy(t->dp_mesh);
    hp_tp_destroy(t->tp);       /* tensor parallel (owner tp) */
    moe_destroy(t);             /* mixture of experts (owner moe) */
    hp_ep_destroy(t->ep);
    hp_ep_destroy(t->ep_tp);
    hp_mesh_destroy(t->ep_grad_mesh[0]);
    hp_mesh_destroy(t->ep_grad_mesh[1]);
    hp_mesh_destroy(t->ep_mesh);
    hp_mesh_destroy(t->etp_mesh);
    hp_mesh_destroy(t->tp_mesh);
    hp_model_destroy(t->model);
    hp_cp_destroy(t->cp);       /* context parallel (owner cp): after the model that uses its cores */
    hp_mesh_destroy(t->cp_mesh);
    hp_mesh_destroy(t->cp_fsdp_flat);
    free(t->cp_inputs);
    free(t->cp_labels);
    if (t->meshes.world) hp_parallel_meshes_destroy(&t->meshes);
    free(t);
}

hp_model_t hp_trainer_model(hp_trainer_t t) { return t->model; }
int64_t hp_trainer_current_step(hp_trainer_t t) { return t->step; }
int64_t hp_trainer_grad_accum(hp_trainer_t t) { return t->accum; }

hp_status_t hp_trainer_step(hp_trainer_t t, hp_step_stats_t *stats) {
    double t0 = hp_clock_now_seconds();
    const int64_t bt = (int64_t)t->B * t->T;
    int64_t step = t->step + 1;
    /* 1. pull every micro-batch first and count valid targets */
    int64_t local[3] = {0, 0, 0};   /* (valid targets, ranks whose data ran out, ranks whose data failed) */
    hp_status_t ds = HP_OK;
    for (int64_t a = 0; a < t->accum && !local[1] && ds == HP_OK; a++) {
        bool got = false;
        ds = hp_dataloader_next(t->dl, t->inputs + a * bt, t->labels + a * bt, &got);
        if (ds != HP_OK) break;
        if (!got) local[1] = 1;
        for (int64_t i = 0; got && i < bt; i++) local[0] += t->labels[a * bt + i] != -100;
    }
    local[2] = ds != HP_OK;
    /* 2. global valid tokens over the batch mesh (DESIGN invariant 7); every rank learns
     * whether any rank's data ran out or failed (a bad token or document in its shard), so
     * all stop together; a failure is then agreed, which brings that rank's message to all */
    int64_t global[3];
    HP_TRY(hp_all_reduce(local, global, 3, HP_I64, HP_SUM, t->dp_comm, NULL));
    if (global[2]) return hp_comm_agree(t->dp_comm, ds, NULL);
    if (global[1])
        return hp_error(HP_ERR_STATE, "step %lld: the training data is exhausted (data.loop = false); "
                                      "lower training.steps or set --data.loop=true", (long long)step);
    int64_t global_valid = global[0];
    hp_metrics_add_tokens(t->metrics, t->accum * bt);
    const double t_data = hp_clock_now_seconds();   /* phases of the step (hp_step_stats_t) */
    /* 3. forward/backward per micro-batch; grads accumulate */
    if (t->pp) HP_TRY(pp_zero_grad(t));   /* pipeline parallel (owner pp) */
    else HP_TRY(hp_model_zero_grad(t->model));
    if (t->fsdp) HP_TRY(hp_fsdp_zero_grad(t->fsdp));   /* data parallel (owner fsdp) */
    /* step profile: data parallel's exposed collective waits over forward, backward, reduce */
    const double dp_wait0 = t->fsdp ? hp_fsdp_comm_wait_seconds(t->fsdp) : t->ddp ? hp_ddp_comm_wait_seconds(t->ddp) : 0.0;
    double local_loss = 0.0;
    for (int64_t a = 0; a < t->accum; a++) {
        float loss = 0.0f;
        if (t->pp) {   /* pipeline parallel (owner pp): the schedule over the step's micro-batches */
            double ls = 0.0;
            int64_t nv = 0;
            t->pp->accum_last = a == t->accum - 1;
            const int32_t *pin = t->inputs + a * bt, *plab = t->labels + a * bt;
            if (t->cp) {   /* context parallel (owner cp): this rank's rows of every sequence */
                HP_TRY(hp_cp_shard_tokens(t->cp, t->cp_inputs, pin, t->B));
                HP_TRY(hp_cp_shard_tokens(t->cp, t->cp_labels, plab, t->B));
                pin = t->cp_inputs;
                plab = t->cp_labels;
            }
            HP_TRY(hp_pp_step(t->pp->rt, pin, plab, (float)global_valid, &ls, &nv));
            local_loss += ls / (double)global_valid;
            continue;
        }
        if (t->ddp) hp_ddp_set_requires_gradient_sync(t->ddp, a == t->accum - 1);   /* owner fsdp */
        const int32_t *in = t->inputs + a * bt, *lab = t->labels + a * bt;
        int Tf = t->T;
        if (t->cp) {   /* context parallel (owner cp): this rank's rows; the divisor stays the batch's count */
            HP_TRY(hp_cp_shard_tokens(t->cp, t->cp_inputs, in, t->B));
            HP_TRY(hp_cp_shard_tokens(t->cp, t->cp_labels, lab, t->B));
            in = t->cp_inputs;
            lab = t->cp_labels;
            Tf = t->Tl;
        }
        hp_status_t fs = hp_model_forward(t->model, in, lab, t->B, Tf, (float)global_valid, &loss);
        /* A non-finite local loss is not returned here: every rank must enter the same
         * collectives, so it flows into the global loss below and all ranks stop together. */
        if (fs == HP_ERR_NUMERIC) loss = NAN;
        else HP_TRY(fs);
        HP_TRY(hp_model_backward(t->model));
        local_loss += loss;
    }
    const double t_fb = hp_clock_now_seconds();
    /* 4. data parallel: gradients are sums over ranks (the loss is already globally
     * normalised), reduced asynchronously per parameter, then waited for. */
    int np = t->np;
    hp_param_t *params = t->params;
    /* FSDP / HSDP reduce-scatter (and all-reduce) inside backward, per unit */
    const int pp_fsdp = t->pp && t->pp->fsdp[0];   /* pipeline parallel: FSDP per stage */
    if (t->dp_size > 1 && !t->fsdp && !t->ddp && !pp_fsdp) {
        for (int i = 0; i < np; i++) {
            hp_tensor_t *g = &params[i].grad.local;
            if (hp_tensor_numel(g) == 0) continue;   /* pipeline parallel: held by another stage */
            if (t->ep && hp_ep_is_expert_param(&params[i])) continue;   /* expert parallel (owner moe): below */
            HP_TRY(hp_all_reduce(g->data, g->data, (size_t)hp_tensor_numel(g), HP_F32, HP_SUM, t->dp_comm,
                                 &t->grad_work[i]));
        }
        for (int i = 0; i < np; i++)
            if (t->grad_work[i]) HP_TRY(hp_work_wait(&t->grad_work[i]));
    }
    if (t->ep) {   /* expert parallel (owner moe): expert grads summed over the ranks holding the same experts */
        for (int k = 0; k < 2; k++) {
            if (!t->ep_grad_mesh[k]) continue;
            hp_comm_t gc = hp_mesh_get_comm(t->ep_grad_mesh[k], 0);
            for (int i = 0; i < np; i++) {
                hp_tensor_t *g = &params[i].grad.local;
                if (!hp_ep_is_expert_param(&params[i]) || hp_tensor_numel(g) == 0) continue;   // PP: another stage's
                HP_TRY(hp_all_reduce(g->data, g->data, (size_t)hp_tensor_numel(g), HP_F32, HP_SUM, gc, NULL));
            }
        }
    }
    /* sequence parallel around MoE layers (owner moe): the router and shared experts saw this tp rank's tokens */
    if (t->ep_sp) HP_TRY(hp_ep_reduce_sequence_parallel_grads(t->ep_sp, params, np));
    if (t->pp) HP_TRY(pp_tie_grads(t));   /* pipeline parallel (owner pp): tied copies summed */
    const double t_red = hp_clock_now_seconds();
    const double dp_wait =
        (t->fsdp ? hp_fsdp_comm_wait_seconds(t->fsdp) : t->ddp ? hp_ddp_comm_wait_seconds(t->ddp) : 0.0) - dp_wait0;
    /* 5. global loss and finiteness (every rank agrees); under PP only the last stage has it */
    double global_loss;
    {
        float lf = (float)local_loss, gf = 0.0f;
        if (t->pp) HP_TRY(hp_all_reduce(&lf, &lf, 1, HP_F32, HP_SUM, t->pp->comm, NULL));   /* owner pp */
        /* the loss mesh: batch x cp (each cp rank holds part of every sequence's loss) */
        hp_comm_t lc = t->cp ? hp_mesh_get_comm(t->meshes.loss, 0) : t->dp_comm;   /* owner cp */
        HP_TRY(hp_all_reduce(&lf, &gf, 1, HP_F32, HP_SUM, lc, NULL));
        global_loss = gf;
    }
    double norm = 0.0;
    hp_status_t cs;
    if (t->pp && !t->ep_norm_p) {   /* pipeline parallel (owner pp): the norm counts a tied weight once */
        cs = hp_grad_norm(t->pp->norm, t->pp->n_norm, t->clip_comms, t->n_clip_comms, &norm);
        if (cs == HP_OK && t->cfg.training.max_norm > 0)
            cs = hp_clip_grads_with_norm(params, np, t->cfg.training.max_norm, norm);
    } else if (t->ep_norm_p) {   /* expert parallel (owner moe): dense (FSDP comms) and expert parts (and pp) */
        cs = ep_grad_norm(t, &norm);
        if (cs == HP_OK && t->cfg.training.max_norm > 0)
            cs = hp_clip_grads_with_norm(params, np, t->cfg.training.max_norm, norm);
    } else {
        cs = t->cfg.training.max_norm > 0
                 ? hp_clip_grad_norm(params, np, t->cfg.training.max_norm, t->clip_comms, t->n_clip_comms, &norm)
                 : hp_grad_norm(params, np, t->clip_comms, t->n_clip_comms, &norm);
    }
    if (!isfinite(global_loss))
        return hp_error(HP_ERR_NUMERIC, "step %lld: the loss is %g; training stopped before the optimizer step "
                                        "(lower optimizer.lr or check the data)", (long long)step, global_loss);
    if (cs == HP_ERR_NUMERIC || !isfinite(norm))
        return hp_error(HP_ERR_NUMERIC, "step %lld: the gradient norm is %g; training stopped before the optimizer "
                                        "step (lower optimizer.lr or set training.max_norm)", (long long)step, norm);
    HP_TRY(cs);
    /* 6. optimizer and schedule */
    double factor = hp_lr_schedule_factor(&t->lr, step - 1);
    const double t_clip = hp_clock_now_seconds();
    HP_TRY(hp_optim_step(t->opt, factor));
    const double t_opt = hp_clock_now_seconds();
    t->step = step;
    if (stats) {
        stats->step = step;
        stats->loss = global_loss;
        stats->grad_norm = norm;
        stats->lr = t->cfg.optimizer.lr * factor;
        stats->tokens = t->accum * bt;
        stats->valid_tokens = global_valid;
        stats->seconds = t_opt - t0;
        stats->data_s = t_data - t0;
        stats->fwd_bwd_s = t_fb - t_data;
        stats->reduce_s = t_red - t_fb;
        stats->clip_s = t_clip - t_red;
        stats->optim_s = t_opt - t_clip;
        stats->ckpt_s = 0.0;
        stats->comm_wait_s = dp_wait;
    }
    if (t->ckpt) {   /* checkpoint (owner dcp): interval / last-step save, async commit */
        hp_ckpt_train_state_t st = ckpt_state(t);
        HP_TRY(hp_ckpt_manager_maybe_save(t->ckpt, step, t->cfg.training.steps, &st));
        if (stats) stats->ckpt_s = hp_clock_now_seconds() - t_opt;
    }
    return HP_OK;
}

hp_status_t hp_trainer_validate(hp_trainer_t t, double *loss) {
    *loss = NAN;
    if (!t->val_dl)
        return hp_error(HP_ERR_STATE, "validation is not enabled; set --validation.enable=true and "
                                      "--data.validation_fraction > 0");
    hp_dataloader_reset(t->val_dl);
    double sums[2] = {0.0, 0.0};   /* (loss sum, valid targets) on this rank */
    for (int64_t i = 0; t->cfg.validation.steps < 0 || i < t->cfg.validation.steps; i++) {
        bool got = false;
        hp_status_t ds = hp_dataloader_next(t->val_dl, t->inputs, t->labels, &got);
        /* every rank must run the same number of collectives: stop when any rank runs dry;
         * -1 = this rank's data failed (agreed below, with its message) */
        int32_t have = ds != HP_OK ? -1 : got, all = 0;
        HP_TRY(hp_all_reduce(&have, &all, 1, HP_I32, HP_MIN, t->dp_comm, NULL));
        if (all < 0) return hp_comm_agree(t->dp_comm, ds, NULL);
        if (!all) break;
        float l = 0.0f;
        if (t->pp) {   /* pipeline parallel (owner pp): forward through the stages */
            double ls = 0.0;
            int64_t nv = 0;
            if (t->cp) {   /* context parallel (owner cp) */
                HP_TRY(hp_cp_shard_tokens(t->cp, t->cp_inputs, t->inputs, t->val_B));
                HP_TRY(hp_cp_shard_tokens(t->cp, t->cp_labels, t->labels, t->val_B));
            }
            HP_TRY(hp_pp_eval(t->pp->rt, t->cp ? t->cp_inputs : t->inputs, t->cp ? t->cp_labels : t->labels, 1.0f,
                              &ls, &nv));
            sums[0] += ls;
            sums[1] += (double)nv;
            continue;
        }
        if (t->cp) {   /* context parallel (owner cp): this rank's rows, summed over the loss mesh below */
            HP_TRY(hp_cp_shard_tokens(t->cp, t->cp_inputs, t->inputs, t->val_B));
            HP_TRY(hp_cp_shard_tokens(t->cp, t->cp_labels, t->labels, t->val_B));
            HP_TRY(hp_model_forward(t->model, t->cp_inputs, t->cp_labels, t->val_B, t->Tl, 1.0f, &l));
        } else
        HP_TRY(hp_model_forward(t->model, t->inputs, t->labels, t->val_B, t->T, 1.0f, &l));
        sums[0] += l;
        sums[1] += (double)hp_model_valid_tokens(t->model);
    }
    float local[2] = {(float)sums[0], (float)sums[1]}, global[2];
    if (t->pp) HP_TRY(hp_all_reduce(local, local, 2, HP_F32, HP_SUM, t->pp->comm, NULL));   /* owner pp */
    HP_TRY(hp_all_reduce(local, global, 2, HP_F32, HP_SUM, t->cp ? hp_mesh_get_comm(t->meshes.loss, 0) : t->dp_comm,
                         NULL));   /* owner cp: the loss mesh */
    if (global[1] <= 0)
        return hp_error(HP_ERR_STATE, "the validation split yields no full batch of %d x %d tokens; lower "
                                      "validation.local_batch_size or raise data.validation_fraction", t->val_B, t->T);
    *loss = global[0] / global[1];
    return HP_OK;
}

/* job.dump_folder/weights.safetensors: rank 0 writes the full model. Sharded parameters (TP,
 * FSDP, both: DTensors on their meshes) are first gathered with full_tensor into a full model
 * on every rank (collective). */
static hp_status_t save_final_weights(hp_trainer_t t) {
    char path[2 * HP_CONFIG_STR_MAX];
    snprintf(path, sizeof path, "%s/weights.safetensors", t->cfg.job.dump_folder);
    hp_model_t full = NULL;
    hp_status_t s = HP_OK;
    if (t->pp) {   /* pipeline parallel (owner pp): each stage's parameters to rank 0 */
        if (t->rank == 0) s = hp_model_create(&t->mcfg, 1, t->T, &full);
        s = hp_comm_agree(t->world, s, NULL);
        if (s == HP_OK) s = pp_gather_weights(t, full);
    } else if (t->tp || t->fsdp) {
        s = hp_model_create(&t->mcfg, 1, t->T, &full);
        for (int i = 0; s == HP_OK && i < t->np; i++) {
            hp_param_t *fp = &hp_model_params(full)[i];
            hp_dtensor_mem_t mem = {NULL, fp->value.local.data, sizeof(float) * (size_t)hp_tensor_numel(&fp->value.local)};
            hp_tensor_t out;
            s = hp_dtensor_full_tensor(&out, NULL, &mem, &t->params[i].value);
        }
    }
    if (s == HP_OK && t->rank == 0) {
        s = hp_model_save_weights(full ? full : t->model, path);
        if (s == HP_OK) hp_log(HP_LOG_INFO, "final weights written to %s", path);
    }
    hp_model_destroy(full);
    return s;
}

static const char *signal_name(int sig) {
    return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal";
}

/* Every rank: whether any rank was interrupted (a signal reaches ranks at different times). */
static hp_status_t agree_interrupt(hp_trainer_t t, int *sig) {
    int64_t v = hp_dcp_interrupted(), g = v;
    if (t->world && t->world_size > 1) HP_TRY(hp_all_reduce(&v, &g, 1, HP_I64, HP_MAX, t->world, NULL));
    if (g && !hp_dcp_interrupted()) hp_dcp_interrupt((int)g);
    *sig = (int)g;
    return HP_OK;
}

/* After an interruption (every rank, after the same step): finish a pending async save
 * (committed when its files are complete), find the last complete checkpoint, and say it all
 * in one error. */
static hp_status_t interrupted(hp_trainer_t t, int sig) {
    char what[2 * HP_CONFIG_STR_MAX + 300] = "";
    int n = snprintf(what, sizeof what, "after step %lld of %lld", (long long)t->step,
                     (long long)t->cfg.training.steps);
    if (t->ckpt && hp_ckpt_manager_pending(t->ckpt)) {
        hp_status_t w = hp_ckpt_manager_wait(t->ckpt);
        snprintf(what + n, sizeof what - (size_t)n, w == HP_OK ? " (the async checkpoint save in flight was completed)"
                 : " (the async checkpoint save in flight failed and was not committed: %s)", hp_last_error());
    }
    char last[2 * HP_CONFIG_STR_MAX + 200] = "checkpointing is off (checkpoint.enable = false): nothing was saved";
    if (t->ckpt) {
        int64_t ls = -1;
        if (t->rank == 0 && hp_dcp_latest_complete(hp_ckpt_manager_folder(t->ckpt), &ls, NULL) != HP_OK) ls = -1;
        if (ls >= 0)
            snprintf(last, sizeof last, "the last complete checkpoint is step-%lld in %s (rerun the same command to "
                     "resume from it)", (long long)ls, hp_ckpt_manager_folder(t->ckpt));
        else
            snprintf(last, sizeof last, "no complete checkpoint exists in %s", hp_ckpt_manager_folder(t->ckpt));
    }
    return hp_error(HP_ERR_STATE, "interrupted by %s (signal %d) %s; %s", signal_name(sig), sig, what, last);
}

/* --- step profile (owner perf): the mean step's phases after the first step, rank 0 --- */
static void log_step_phases(const hp_step_stats_t *sum, double metrics_s, int64_t n) {
    if (n <= 0 || sum->seconds <= 0) return;
    const double s = sum->seconds, ms = 1e3 / (double)n;
    const double other = s - sum->data_s - sum->fwd_bwd_s - sum->reduce_s - sum->clip_s - sum->optim_s;
    hp_log(HP_LOG_INFO, "step phases (mean of %lld steps after the first): step %.1f ms = data %.2f ms (%.1f%%), "
           "forward+backward %.1f ms (%.1f%%; data-parallel waits %.2f ms), grad reduce %.2f ms (%.1f%%), loss/norm/clip %.2f ms (%.1f%%), "
           "optimizer %.2f ms (%.1f%%), other %.2f ms; outside the step: checkpoint %.2f ms, metrics %.2f ms",
           (long long)n, s * ms, sum->data_s * ms, 100 * sum->data_s / s, sum->fwd_bwd_s * ms,
           100 * sum->fwd_bwd_s / s, sum->comm_wait_s * ms, sum->reduce_s * ms, 100 * sum->reduce_s / s, sum->clip_s * ms,
           100 * sum->clip_s / s, sum->optim_s * ms, 100 * sum->optim_s / s, other * ms, sum->ckpt_s * ms,
           metrics_s * ms);
}
/* --- end --- */

hp_status_t hp_trainer_train(hp_trainer_t t) {
    const hp_config_t *c = &t->cfg;
    hp_step_stats_t sum = {0};   /* step profile: phases summed over the steps after the first */
    double metrics_s = 0.0;
    int64_t n_prof = 0, first = t->step + 1;
    while (t->step < c->training.steps) {
        hp_step_stats_t st;
        hp_status_t ss = hp_trainer_step(t, &st);
        int sig = 0;
        if (ss != HP_OK) return ss;   /* agreed inside the step (a failed save says if a signal came) */
        const double tm = hp_clock_now_seconds();
        if (hp_metrics_should_log(t->metrics, st.step))
            HP_TRY(hp_metrics_log(t->metrics, st.step, st.loss, NAN, st.grad_norm, st.lr, NULL));
        if (st.step > first) {   /* the first step pays for first touches and warm-up */
            sum.seconds += st.seconds, sum.data_s += st.data_s, sum.fwd_bwd_s += st.fwd_bwd_s;
            sum.reduce_s += st.reduce_s, sum.clip_s += st.clip_s, sum.optim_s += st.optim_s;
            sum.ckpt_s += st.ckpt_s, sum.comm_wait_s += st.comm_wait_s;
            metrics_s += hp_clock_now_seconds() - tm;
            n_prof++;
        }
        HP_TRY(agree_interrupt(t, &sig));
        if (sig) return interrupted(t, sig);
        if (t->val_dl && c->validation.freq > 0 && st.step % c->validation.freq == 0) {
            double vl;
            HP_TRY(hp_trainer_validate(t, &vl));
            HP_TRY(hp_metrics_log_scalar(t->metrics, "validation_metrics/loss", st.step, vl));
        }
    }
    if (t->rank == 0) log_step_phases(&sum, metrics_s, n_prof);
    return c->job.dump_folder[0] ? save_final_weights(t) : HP_OK;
}
