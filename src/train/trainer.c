/* The training loop (TorchTitan's Trainer.train_step in C): global token normalisation,
 * gradient accumulation, data-parallel gradient reduction, clipping, finiteness check,
 * optimizer and LR schedule, validation, logging, final weights. */
#define _GNU_SOURCE
#include "hyperparallel/trainer.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
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
#include "hyperparallel/cp.h"   /* context parallel (owner cp) */
#include "hyperparallel/parallel_dims.h"
#include "hyperparallel/tokenizer.h"

/* Parallelisms this build implements: replicated data parallel (one SUM all-reduce per
 * gradient after backward), FSDP (dp_shard > 1) and HSDP (both > 1) through fully_shard
 * (src/parallel/fsdp.c), tensor / sequence parallel (src/parallel/tp.c), alone or inside
 * any of those, context parallel (src/parallel/cp.c) under FSDP over dp_shard x cp. PP and
 * EP are refused by ParallelDims. */
#define HP_TRAINER_IMPLEMENTED (HP_PAR_DP_REPLICATE | HP_PAR_DP_SHARD | HP_PAR_TP | HP_PAR_CP)

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
    hp_comm_t clip_comms[3];
    int n_clip_comms;
    /* --- tensor parallel (owner tp) --- */
    hp_mesh_t tp_mesh;          /* the world mesh's tp dim */
    hp_tp_t tp;
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
    HP_TRY(check_cp_layout(c, &t->mcfg, &t->pd));   /* context parallel (owner cp) */
    HP_TRY(hp_model_create(&t->mcfg, t->B > t->val_B ? t->B : t->val_B, t->T, &t->model));
    *ac_k_out = ac_k;
    return HP_OK;
}

static hp_status_t build(hp_trainer_t t) {
    const hp_config_t *c = &t->cfg;
    int ac_k = 0;
    hp_status_t local = build_local(t, &ac_k);
    HP_TRY(t->world ? hp_comm_agree(t->world, local, NULL) : local);
    if (ac_k > 0) HP_TRY(hp_model_set_activation_checkpoint(t->model, ac_k));
    /* --- tensor parallel (owner tp): TorchTitan's plan on the tp mesh, before the weights
     * are drawn (each rank draws its shards at their global indices) --- */
    if (t->pd.tp > 1) {
        const char *tpn[1] = {"tp"};
        HP_TRY(hp_mesh_slice(t->meshes.world, 1, tpn, &t->tp_mesh));
        hp_tp_plan_entry_t plan[32];
        const int sp = c->parallelism.enable_sequence_parallel, lp = c->parallelism.enable_loss_parallel;
        int n = strcmp(t->mcfg.name, "qwen3") == 0 ? hp_tp_qwen3_plan(plan, 32, sp, lp) : hp_tp_llama3_plan(plan, 32, sp, lp);
        if (sp && t->T % t->pd.tp != 0)
            return hp_error(HP_ERR_INVALID_ARG, "training.seq_len %d is not divisible by parallelism.tensor_parallel_degree %d "
                            "(sequence parallel shards the sequence); hint: use a multiple of %d or "
                            "--parallelism.enable_sequence_parallel=false", t->T, t->pd.tp, t->pd.tp);
        HP_TRY(check_tp_layout(c, &t->mcfg, t->pd.tp));
        HP_TRY(hp_tp_parallelize_model(&t->tp, t->model, t->tp_mesh, plan, n));
        t->clip_comms[t->n_clip_comms++] = hp_mesh_get_comm(t->tp_mesh, 0);
    }
    /* --- end tensor parallel --- */
    /* --- context parallel (owner cp): ring / Ulysses cores over the cp dim, after TP (on
     * the local heads) and before FSDP, which then shards over dp_shard x cp --- */
    t->Tl = t->T;
    if (t->pd.cp > 1) {
        const char *cpn[1] = {"cp"};
        HP_TRY(hp_mesh_slice(t->meshes.world, 1, cpn, &t->cp_mesh));
        hp_cp_options_t co = hp_cp_options_default();
        HP_TRY(hp_cp_rotate_parse(c->parallelism.context_parallel_rotate_method,
                                  "parallelism.context_parallel_rotate_method", &co.rotate));
        HP_TRY(hp_cp_balancer_parse(c->parallelism.context_parallel_load_balancer,
                                    "parallelism.context_parallel_load_balancer", &co.balancer));
        co.ulysses_degree = (int)c->parallelism.context_parallel_ulysses_degree;
        const int hd = t->mcfg.head_dim > 0 ? t->mcfg.head_dim : t->mcfg.dim / t->mcfg.n_heads;
        HP_TRY(hp_cp_create(hp_mesh_get_comm(t->cp_mesh, 0), &co, t->B > t->val_B ? t->B : t->val_B, t->T,
                            t->mcfg.n_heads / t->pd.tp, t->mcfg.n_kv_heads / t->pd.tp, hd, &t->cp));
        HP_TRY(hp_cp_apply(t->cp, t->model));
        t->Tl = t->T / t->pd.cp;
    }
    /* --- end context parallel --- */
    HP_TRY(hp_model_init_weights(t->model, (uint64_t)c->training.seed));
    t->flops_per_token = hp_model_flops_per_token(&t->mcfg, t->T);
    /* --- data parallel (owner fsdp) --- */
    t->params = hp_model_params(t->model);
    t->np = hp_model_num_params(t->model);
    if (t->pd.dp_shard > 1 || t->pd.cp > 1) {   /* context parallel (owner cp): FSDP over dp_shard x cp */
        /* fully_shard every unit (embedding, blocks, norm + output) over (dp_shard) or, with
         * dp_replicate > 1, HSDP over (dp_replicate, dp_shard); reductions are sums since the
         * loss is globally normalised (gradient divide factor 1, docs/fsdp.md) */
        const char *names[2] = {"dp_replicate", "dp_shard"};
        const int two = t->pd.dp_replicate > 1;
        if (t->pd.cp > 1) {   /* context parallel (owner cp): (dp_shard, cp) flattened, HSDP adds dp_replicate */
            const char *sc[2] = {"dp_shard", "cp"};
            hp_mesh_t flat = NULL;
            HP_TRY(hp_mesh_flatten(t->meshes.world, 2, sc, "dp_shard_cp", &flat));
            t->cp_fsdp_flat = flat;
            if (two) {
                const char *rn[1] = {"dp_replicate"};
                hp_mesh_t rep = NULL;
                HP_TRY(hp_mesh_slice(t->meshes.world, 1, rn, &rep));
                hp_status_t cs = hp_mesh_concat(rep, flat, &t->dp_mesh);
                hp_mesh_destroy(rep);
                HP_TRY(cs);
            } else {
                HP_TRY(hp_mesh_slice(flat, 1, (const char *[]){"dp_shard_cp"}, &t->dp_mesh));
            }
        } else
        HP_TRY(hp_mesh_slice(t->meshes.world, two ? 2 : 1, two ? names : names + 1, &t->dp_mesh));
        hp_fsdp_options_t fo = hp_fsdp_default_options();
        fo.gradient_divide_factor = 1.0;
        fo.mp.param_dtype = strcmp(c->training.mixed_precision_param, "bfloat16") == 0 ? HP_BF16 : HP_F32;
        fo.mp.reduce_dtype = strcmp(c->training.mixed_precision_reduce, "bfloat16") == 0 ? HP_BF16 : HP_F32;
        const char *raf = c->parallelism.fsdp_reshard_after_forward;
        fo.reshard_after_forward = strcmp(raf, "always") == 0 ? 1 : strcmp(raf, "never") == 0 ? 0
                                                                                              : HP_FSDP_RESHARD_DEFAULT;
        HP_TRY(hp_fully_shard(t->model, t->dp_mesh, &fo, &t->fsdp));
        t->params = hp_fsdp_params(t->fsdp);
        t->n_clip_comms = hp_fsdp_grad_comms(t->fsdp, t->clip_comms);   /* shard, replicate, tp */
    } else if (t->dp_size > 1 && !t->mcfg.tie_embeddings) {
        /* DDP: gradient buckets (1 MiB first, 25 MiB cap) all-reduced (SUM) asynchronously as
         * they fill during backward; no_sync on all micro-batches but the last. Tied
         * embeddings keep the per-parameter all-reduce after backward (step 4). */
        hp_ddp_options_t dop = hp_ddp_default_options();
        dop.average = 0;
        HP_TRY(hp_ddp_create(t->model, t->dp_comm, &dop, &t->ddp));
    }
    /* --- end data parallel --- */

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
    t->grad_work = hp_calloc((size_t)hp_model_num_params(t->model), sizeof(hp_work_t));
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

/* --- checkpoint (owner dcp): the state the manager saves and restores ---------------------- */
static hp_ckpt_train_state_t ckpt_state(hp_trainer_t t) {
    hp_ckpt_train_state_t st = {t->params, t->np, hp_model_config(t->model),
                                t->opt, t->dl, &t->step, &t->ckpt_seed};
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
    hp_fsdp_destroy(t->fsdp);   /* data parallel (owner fsdp) */
    hp_ddp_destroy(t->ddp);
    hp_mesh_destroy(t->dp_mesh);
    hp_tp_destroy(t->tp);       /* tensor parallel (owner tp) */
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
    /* 3. forward/backward per micro-batch; grads accumulate */
    HP_TRY(hp_model_zero_grad(t->model));
    if (t->fsdp) HP_TRY(hp_fsdp_zero_grad(t->fsdp));   /* data parallel (owner fsdp) */
    double local_loss = 0.0;
    for (int64_t a = 0; a < t->accum; a++) {
        float loss = 0.0f;
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
    /* 4. data parallel: gradients are sums over ranks (the loss is already globally
     * normalised), reduced asynchronously per parameter, then waited for. */
    int np = t->np;
    hp_param_t *params = t->params;
    /* FSDP / HSDP reduce-scatter (and all-reduce) inside backward, per unit */
    if (t->dp_size > 1 && !t->fsdp && !t->ddp) {
        for (int i = 0; i < np; i++) {
            hp_tensor_t *g = &params[i].grad.local;
            HP_TRY(hp_all_reduce(g->data, g->data, (size_t)hp_tensor_numel(g), HP_F32, HP_SUM, t->dp_comm,
                                 &t->grad_work[i]));
        }
        for (int i = 0; i < np; i++) HP_TRY(hp_work_wait(&t->grad_work[i]));
    }
    /* 5. global loss and finiteness (every rank agrees) */
    double global_loss;
    {
        float lf = (float)local_loss, gf = 0.0f;
        /* the loss mesh: batch x cp (each cp rank holds part of every sequence's loss) */
        hp_comm_t lc = t->cp ? hp_mesh_get_comm(t->meshes.loss, 0) : t->dp_comm;   /* owner cp */
        HP_TRY(hp_all_reduce(&lf, &gf, 1, HP_F32, HP_SUM, lc, NULL));
        global_loss = gf;
    }
    double norm = 0.0;
    hp_status_t cs = t->cfg.training.max_norm > 0
                         ? hp_clip_grad_norm(params, np, t->cfg.training.max_norm, t->clip_comms, t->n_clip_comms, &norm)
                         : hp_grad_norm(params, np, t->clip_comms, t->n_clip_comms, &norm);
    if (!isfinite(global_loss))
        return hp_error(HP_ERR_NUMERIC, "step %lld: the loss is %g; training stopped before the optimizer step "
                                        "(lower optimizer.lr or check the data)", (long long)step, global_loss);
    if (cs == HP_ERR_NUMERIC || !isfinite(norm))
        return hp_error(HP_ERR_NUMERIC, "step %lld: the gradient norm is %g; training stopped before the optimizer "
                                        "step (lower optimizer.lr or set training.max_norm)", (long long)step, norm);
    HP_TRY(cs);
    /* 6. optimizer and schedule */
    double factor = hp_lr_schedule_factor(&t->lr, step - 1);
    HP_TRY(hp_optim_step(t->opt, factor));
    t->step = step;
    if (stats) {
        stats->step = step;
        stats->loss = global_loss;
        stats->grad_norm = norm;
        stats->lr = t->cfg.optimizer.lr * factor;
        stats->tokens = t->accum * bt;
        stats->valid_tokens = global_valid;
        stats->seconds = hp_clock_now_seconds() - t0;
    }
    if (t->ckpt) {   /* checkpoint (owner dcp): interval / last-step save, async commit */
        hp_ckpt_train_state_t st = ckpt_state(t);
        HP_TRY(hp_ckpt_manager_maybe_save(t->ckpt, step, t->cfg.training.steps, &st));
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
    if (t->tp || t->fsdp) {
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

hp_status_t hp_trainer_train(hp_trainer_t t) {
    const hp_config_t *c = &t->cfg;
    while (t->step < c->training.steps) {
        hp_step_stats_t st;
        hp_status_t ss = hp_trainer_step(t, &st);
        int sig = 0;
        if (ss != HP_OK) return ss;   /* agreed inside the step (a failed save says if a signal came) */
        if (hp_metrics_should_log(t->metrics, st.step))
            HP_TRY(hp_metrics_log(t->metrics, st.step, st.loss, NAN, st.grad_norm, st.lr, NULL));
        HP_TRY(agree_interrupt(t, &sig));
        if (sig) return interrupted(t, sig);
        if (t->val_dl && c->validation.freq > 0 && st.step % c->validation.freq == 0) {
            double vl;
            HP_TRY(hp_trainer_validate(t, &vl));
            HP_TRY(hp_metrics_log_scalar(t->metrics, "validation_metrics/loss", st.step, vl));
        }
    }
    return c->job.dump_folder[0] ? save_final_weights(t) : HP_OK;
}
