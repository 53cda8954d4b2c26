/* The training loop (TorchTitan's Trainer): config -> ParallelDims -> meshes -> the model's
 * parallelize (src/models/) -> the step loop (global token normalisation, gradient accumulation,
 * the gradient finalizer, finiteness check, optimizer and LR schedule) -> checkpoints, metrics,
 * validation and the final weights. Which parallelisms run is the composition's business
 * (parallelize.h): nothing here names one. */
#define _GNU_SOURCE
#include "hyperparallel/trainer.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hyperparallel/backend.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/ckpt_manager.h"
#include "hyperparallel/data.h"
#include "hyperparallel/file.h"
#include "hyperparallel/memory_plan.h"
#include "hyperparallel/metrics.h"
#include "hyperparallel/models.h"
#include "hyperparallel/moe_balance.h"
#include "hyperparallel/optim.h"
#include "hyperparallel/parallel_config.h"
#include "hyperparallel/planner.h"
#include "hyperparallel/tokenizer.h"
#include "hyperparallel/chat_template.h"

struct hp_trainer {
    hp_config_t cfg;
    hp_comm_t world;
    int rank, world_size;
    hp_parallel_dims_t pd;
    hp_parallel_meshes_t meshes;
    hp_comm_t dp_comm;          /* batch mesh: data-parallel ranks (data loading, token counts) */
    hp_comm_t loss_comm;        /* loss mesh: batch x cp (each cp rank holds part of each loss) */
    int dp_rank, dp_size;
    hp_model_config_t mcfg;
    hp_parallel_t par;          /* the model parts and every parallelism over them */
    hp_model_t model;           /* the first part (the whole model without pipeline parallel) */
    hp_moe_balancer_t moe;      /* MoE load balancing (NULL for dense models) */
    hp_optim_t opt;
    hp_lr_schedule_t lr;
    hp_tokenizer_t tok;
    hp_chat_template_t chat;    /* chat (SFT) data: the model folder's template */
    hp_token_ids_t scratch;     /* encoder scratch for the data loaders */
    hp_dataset_t ds;
    hp_dataloader_t dl, val_dl;
    int64_t accum;
    int B, T, val_B;
    int32_t *inputs, *labels;   /* (accum, B, T) */
    int64_t step;
    double flops_per_token;
    hp_metrics_t metrics;
    hp_metrics_paths_t metric_paths;
    hp_ckpt_manager_t ckpt;
    uint64_t ckpt_seed;
    hp_memory_plan_t plan;      /* this rank's predicted peak (memory plan, before the model exists) */
    double mem_limit;           /* the bytes it was checked against (0: no check) */
    char mem_limit_what[160];
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

/* An output folder of the run: `key` = `value` in the config, `dir` the folder it needs
 * (value itself, or a file's folder): created and probed now (hp_file_probe_writable_dir), so
 * an unusable path stops the run at start-up instead of losing the trained weights after the
 * last step. */
static hp_status_t probe_folder(const char *key, const char *value, const char *dir, int rank) {
    hp_status_t s = hp_file_probe_writable_dir(dir, rank);
    if (s != HP_OK)
        return hp_error(s, "%s = '%s': %s; expected a writable folder for the run's outputs; hint: remove what is "
                        "in the way, fix the permissions, or set --%s to another path", key, value, hp_last_error(), key);
    return HP_OK;
}

/* An output file: not a folder, and its folder passes probe_folder. */
static hp_status_t probe_file(const char *key, const char *path, int rank) {
    hp_status_t s = hp_file_probe_writable_file(path, rank);
    if (s != HP_OK)
        return hp_error(s, "%s = '%s': %s; hint: set --%s to a file path the run can write", key, path,
                        hp_last_error(), key);
    return HP_OK;
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

/* training.deterministic: no run-time choice of thread counts. Reduction orders are fixed by
 * construction (the comm layer's deterministic algorithms, static OpenMP partitions, chunked
 * norms); what can still vary between runs is the number of threads a region gets when
 * OpenMP's dynamic adjustment is on (OMP_DYNAMIC=true) and OpenBLAS's own thread count, which
 * change how GEMMs and reductions are partitioned. */
static void pin_threads(const hp_config_t *c) {
    if (!c->training.deterministic) return;
    omp_set_dynamic(0);
    const int n = omp_get_max_threads();
    hp_backend_set_num_threads(hp_backend_default(), n);
    hp_log(HP_LOG_INFO, "training.deterministic: OpenMP dynamic threads off, %d OpenMP and %d GEMM library thread(s) "
           "per rank", n, n);
}

/* The rank-local part of the set-up (config rules, tokenizer, the model without pipeline
 * parallel): no collective runs here, so a rank that fails is agreed on before the first one. */
static hp_status_t build_local(hp_trainer_t t, hp_parallelize_options_t *po) {
    const hp_config_t *c = &t->cfg;
    HP_TRY(hp_config_validate(c));
    pin_threads(c);
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
    HP_TRY(hp_config_apply_lora(c, &t->mcfg));   /* adapters declared with the model (docs/finetune.md) */
    HP_TRY(hp_parallel_config_check(c, &t->mcfg, &t->pd, t->B, t->val_B));
    HP_TRY(hp_parallelize_options_from_config(c, po));
    if (t->pd.pp > 1) return HP_OK;   /* the pipeline makes its stages */
    const int rows = t->B > t->val_B ? t->B : t->val_B;
    /* described only (the meta device): the parallelize places each parameter, then each rank
     * allocates and draws only its shards */
    HP_TRY(hp_model_create_empty(&t->mcfg, rows, t->T, &t->model));
    if (strcmp(c->training.dtype, "bfloat16") == 0) HP_TRY(hp_model_set_compute_dtype(t->model, HP_BF16));
    return hp_parallel_create(t->model, rows, t->T, &t->par);
}

/* The optimizer's step pre-hook: the MoE layers' load balancing, its metrics on logging steps. */
static hp_status_t moe_log(void *user, const char *tag, double value) {
    hp_trainer_t t = user;
    return hp_metrics_log_scalar(t->metrics, tag, t->step + 1, value);
}
static hp_status_t moe_pre_step(void *user, hp_optim_t opt) {
    (void)opt;
    hp_trainer_t t = user;
    return hp_moe_balancer_step(t->moe, hp_metrics_should_log(t->metrics, t->step + 1) ? moe_log : NULL, t);
}

/* ---- the memory plan (docs/memory.md) ------------------------------------------------------- */

/* The plan's input for this run with another layout / AC / micro-batch (the knobs). */
static hp_memory_plan_input_t plan_input(hp_trainer_t t, const hp_parallelize_options_t *po, hp_tp_plan_entry_t *plan,
                                         int cap) {
    const hp_config_t *c = &t->cfg;
    hp_memory_plan_input_t in;
    memset(&in, 0, sizeof in);
    in.model = &t->mcfg;
    in.dims = t->pd;
    if (t->pd.tp > 1) {
        const hp_model_spec_t *spec = hp_model_spec_find(t->mcfg.name);
        if (spec && spec->tp_plan) in.n_tp_plan = spec->tp_plan(&t->mcfg, po->sequence_parallel, po->loss_parallel, plan, cap);
        in.tp_plan = plan;
    }
    in.batch = t->B > t->val_B ? t->B : t->val_B;
    in.seq_len = t->T;
    in.ac = po->ac;
    in.fsdp = po->fsdp;
    in.pp = po->pp;
    in.optim_states = !strcmp(c->optimizer.name, "adamw") ? 2 : !strcmp(c->optimizer.name, "muon") ? 1
                      : c->optimizer.momentum != 0 ? 1 : 0;
    in.zero_stage = po->zero_stage;
    in.bf16_compute = strcmp(c->training.dtype, "bfloat16") == 0;
    int64_t rss = 0;
    if (hp_memory_rss(&rss, NULL) == HP_OK) in.base_bytes = (size_t)rss;
    int coords[HP_PD_NDIM];
    hp_parallel_dims_coords(&t->pd, t->rank, coords);
    in.pp_rank = t->pd.pp > 1 ? coords[HP_PD_PP] : -1;
    return in;
}

/* This host's MemAvailable (bytes; 0 when /proc/meminfo does not say). */
static double mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0.0;
    char line[256];
    double kb = 0.0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024.0;
}

/* Ranks of the world on this host (by host name; collective over world). */
static hp_status_t ranks_on_host(hp_trainer_t t, int *n) {
    *n = 1;
    if (!t->world || t->world_size == 1) return HP_OK;
    char host[256] = "";
    (void)gethostname(host, sizeof host - 1);
    uint64_t h = 1469598103934665603ull;
    for (const char *p = host; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    int64_t mine = (int64_t)h, *all = hp_calloc((size_t)t->world_size, sizeof(int64_t));
    if (!all) return HP_ERR_OOM;
    hp_status_t s = hp_all_gather(&mine, all, 1, HP_I64, t->world, NULL);
    *n = 0;
    for (int r = 0; s == HP_OK && r < t->world_size; r++) *n += all[r] == mine;
    free(all);
    return s;
}

/* The knobs that would fit, each alone: more FSDP ranks, full AC, smaller micro-batches. */
static void fitting_knobs(hp_trainer_t t, const hp_parallelize_options_t *po, double limit, char *buf, size_t n) {
    hp_tp_plan_entry_t plan[64];
    size_t o = 0;
    buf[0] = '\0';
    hp_memory_plan_t p;
#define FITS(in_) (hp_memory_plan(&(in_), &p) == HP_OK && (double)p.peak <= limit)
    for (int f = 2; f <= 1024; f *= 2) {   // FSDP over more ranks (the other degrees kept)
        hp_memory_plan_input_t in = plan_input(t, po, plan, 64);
        if (f <= in.dims.dp_shard) continue;
        in.dims.dp_shard = f;
        in.dims.world_size = t->pd.world_size / t->pd.dp_shard * f;
        if (FITS(in)) {
            o += (size_t)snprintf(buf + o, n - o, "%sparallelism.data_parallel_shard_degree=%d on %d ranks (%.2f GiB)",
                                  o ? "; " : "", f, in.dims.world_size, p.peak / 1073741824.0);
            break;
        }
    }
    if ((po->ac.every_k != 1 || po->ac.policy != HP_AC_FULL) && o < n) {
        hp_memory_plan_input_t in = plan_input(t, po, plan, 64);
        in.ac.every_k = 1;
        in.ac.policy = HP_AC_FULL;
        if (FITS(in))
            o += (size_t)snprintf(buf + o, n - o, "%sactivation_checkpoint.mode=full (%.2f GiB)", o ? "; " : "",
                                  p.peak / 1073741824.0);
    }
    for (int b = t->B / 2; b >= 1 && o < n; b /= 2) {   // smaller micro-batches, the global batch kept
        hp_memory_plan_input_t in = plan_input(t, po, plan, 64);
        in.batch = b;
        if (in.dims.pp > 1) in.pp.microbatch_size = in.pp.microbatch_size < b ? in.pp.microbatch_size : b;
        if (FITS(in)) {
            o += (size_t)snprintf(buf + o, n - o, "%straining.local_batch_size=%d with gradient accumulation (%.2f GiB)",
                                  o ? "; " : "", b, p.peak / 1073741824.0);
            break;
        }
    }
#undef FITS
    if (!o) snprintf(buf, n, "none of more FSDP ranks (up to 1024), full activation checkpointing or a micro-batch of one "
                     "sequence fits alone; hint: combine them, or tensor / pipeline parallel");
}

/* Before anything of the model's size is allocated: this rank's predicted peak against its
 * memory (training.memory_limit_gib, or this host's MemAvailable over its ranks). */
static hp_status_t check_memory_plan(hp_trainer_t t, const hp_parallelize_options_t *po, int n_host) {
    const hp_config_t *c = &t->cfg;
    hp_tp_plan_entry_t plan[64];
    hp_memory_plan_input_t in = plan_input(t, po, plan, 64);
    HP_TRY(hp_memory_plan(&in, &t->plan));
    const double gib = 1073741824.0, lim = c->training.memory_limit_gib;
    if (lim > 0) {
        t->mem_limit = lim * gib;
        snprintf(t->mem_limit_what, sizeof t->mem_limit_what, "training.memory_limit_gib = %g", lim);
    } else if (lim == 0) {
        const double avail = mem_available();
        if (avail > 0) {
            t->mem_limit = (double)in.base_bytes + avail / (n_host > 0 ? n_host : 1);
            snprintf(t->mem_limit_what, sizeof t->mem_limit_what, "this process's %.2f GiB plus this host's "
                     "MemAvailable %.2f GiB / %d rank(s) on it; set training.memory_limit_gib to state the limit",
                     (double)in.base_bytes / gib, avail / gib, n_host);
        }
    }
    if (t->mem_limit <= 0 || (double)t->plan.peak <= t->mem_limit) return HP_OK;
    char what[1024], knobs[1024];
    hp_memory_plan_str(&t->plan, what, sizeof what);
    fitting_knobs(t, po, t->mem_limit, knobs, sizeof knobs);
    return hp_error(HP_ERR_OOM, "memory plan: rank %d's predicted peak %.2f GiB exceeds the allowed %.2f GiB (%s), so "
                    "the run stops before allocating the model; predicted %s; knobs that would fit: %s", t->rank,
                    (double)t->plan.peak / gib, t->mem_limit / gib, t->mem_limit_what, what, knobs);
}

static hp_status_t build(hp_trainer_t t) {
    const hp_config_t *c = &t->cfg;
    hp_parallelize_options_t po;
    hp_status_t local = build_local(t, &po);
    HP_TRY(t->world ? hp_comm_agree(t->world, local, NULL) : local);
    int n_host = 1;
    HP_TRY(ranks_on_host(t, &n_host));
    local = check_memory_plan(t, &po, n_host);
    HP_TRY(t->world ? hp_comm_agree(t->world, local, NULL) : local);
    if (t->pd.pp > 1) {   /* TorchTitan's pipelining_fn: split, parallelize each stage, the runtime */
        HP_TRY(hp_parallelize_pipeline(&t->mcfg, &t->pd, &t->meshes, t->world, t->B, t->T, &po, &t->par));
        t->model = hp_parallel_part(t->par, 0);
    } else {
        HP_TRY(hp_parallelize(t->par, &t->pd, &t->meshes, &po));
    }
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
    /* the composition's optimizer table: every parameter, or ZeRO-1's share with placeholders */
    HP_TRY(hp_optim_create(&oc, hp_parallel_optim_params(t->par), hp_parallel_num_params(t->par), &t->opt));
    HP_TRY(hp_moe_balancer_create(t->par, t->loss_comm, &t->moe));
    if (t->moe) HP_TRY(hp_optim_register_step_pre_hook(t->opt, moe_pre_step, t));
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
    hp_sft_options_t sft = {0};
    if (strcmp(hp_dataset_format(t->ds), "chat") == 0) {   /* SFT: docs/finetune.md */
        hp_status_t s = hp_chat_template_from_tokenizer(t->tok, c->data.chat_template, &t->chat);
        if (s != HP_OK) return hp_error_prefix(s, "data.format = chat with tokenizer.path '%s': ", c->tokenizer.path);
        /* padding positions are masked (-100) and follow the row's samples, so the id only fills
         * them: the folder's pad token, else EOS, else 0 */
        int32_t pad = hp_tokenizer_pad_id(t->tok);
        if (pad < 0) pad = hp_tokenizer_eos_id(t->tok);
        if (pad < 0) pad = 0;
        const char *tr = c->data.sft_truncation;
        sft = (hp_sft_options_t){t->chat, pad, c->data.pack,
                                     strcmp(tr, "drop") == 0 ? HP_SFT_DROP : strcmp(tr, "error") == 0 ? HP_SFT_ERROR
                                                                                                      : HP_SFT_TRUNCATE};
        if (t->rank == 0)
            hp_log(HP_LOG_INFO, "SFT data: chat template %s (%s), pack %s, pad id %d, loss on assistant tokens only",
                   hp_chat_template_name(t->chat), hp_chat_template_models(t->chat), c->data.pack ? "on" : "off", pad);
    }
    HP_TRY(hp_dataloader_create_sft(t->ds, &enc, &dlo, &sft, &t->dl));
    if (c->validation.enable) {
        if (hp_dataset_num_documents(t->ds, HP_SPLIT_VALIDATION) == 0)
            return hp_error(HP_ERR_INVALID_ARG, "validation.enable = true but the validation split of '%s' is empty; "
                                                "set data.validation_fraction > 0", c->data.path);
        hp_dataloader_options_t vo = dlo;
        vo.split = HP_SPLIT_VALIDATION;
        vo.batch_size = t->val_B;
        vo.loop = false;
        HP_TRY(hp_dataloader_create_sft(t->ds, &enc, &vo, &sft, &t->val_dl));
    }

    /* one buffer serves the training micro-batches (accum x B rows) and a validation batch
     * (val_B rows, which validation.local_batch_size may make larger) */
    size_t rows = (size_t)t->accum * (size_t)t->B;
    if ((size_t)t->val_B > rows) rows = (size_t)t->val_B;
    size_t n = rows * (size_t)t->T;
    t->inputs = hp_malloc(n * sizeof(int32_t));
    t->labels = hp_malloc(n * sizeof(int32_t));
    if (!t->inputs || !t->labels) return HP_ERR_OOM;

    int metrics_rank = hp_parallel_dims_metrics_rank(&t->pd);
    hp_metrics_options_t mo = hp_metrics_options_from_config(c, t->rank, t->rank == metrics_rank, t->flops_per_token,
                                                             hp_parallel_dims_non_dp(&t->pd), &t->metric_paths);
    HP_TRY(probe_outputs(t));
    mo.total_steps = c->training.steps;
    HP_TRY(hp_metrics_create(&mo, &t->metrics));
    return HP_OK;
}

/* The state the checkpoint manager saves and restores (with the MoE layers' expert_bias). */
static hp_ckpt_train_state_t ckpt_state(hp_trainer_t t) {
    hp_ckpt_train_state_t st = {hp_parallel_params(t->par), hp_parallel_num_params(t->par), hp_model_config(t->model),
                                t->opt, t->dl, &t->step, &t->ckpt_seed, hp_parallel_optim_params(t->par)};
    if (t->moe) st.params = hp_moe_balancer_state(t->moe, &st.n_params);
    return st;
}

/* LoRA (collective): a fresh run starts from lora.adapter_path when set (a resumed one has its
 * adapters from the checkpoint); the trainable share is logged. */
static hp_status_t lora_setup(hp_trainer_t t) {
    const hp_config_t *c = &t->cfg;
    if (!c->lora.enable) return HP_OK;
    hp_param_t *ps = hp_parallel_params(t->par);
    const int n = hp_parallel_num_params(t->par);
    if (c->lora.adapter_path[0] && t->step == 0)
        HP_TRY(hp_hf_import_lora(c->lora.adapter_path, hp_model_hf_adapter(&t->mcfg), &t->mcfg, ps, n, t->world));
    if (t->rank == 0) {
        int64_t train = 0, all = 0;
        for (int i = 0; i < n; i++) {
            int64_t k = 1;
            for (int d = 0; d < ps[i].value.local.ndim; d++)
                k *= ps[i].value.mesh ? ps[i].value.global_shape[d] : ps[i].value.local.shape[d];
            all += k;
            train += ps[i].frozen ? 0 : k;
        }
        hp_log(HP_LOG_INFO, "LoRA: rank %d, alpha %g, %d target bits 0x%x; trainable %lld of %lld parameters (%.3f%%)%s%s",
               t->mcfg.lora_rank, (double)t->mcfg.lora_alpha, __builtin_popcount((unsigned)t->mcfg.lora_targets),
               (unsigned)t->mcfg.lora_targets, (long long)train, (long long)all, 100.0 * (double)train / (double)all,
               c->lora.adapter_path[0] ? ", adapters from " : "", c->lora.adapter_path);
    }
    return HP_OK;
}

hp_status_t hp_trainer_save_lora(hp_trainer_t t, const char *path) {
    const hp_config_t *c = &t->cfg;
    if (!c->lora.enable)
        return hp_error(HP_ERR_STATE, "hp_trainer_save_lora: the run has no LoRA (lora.enable = false)");
    const hp_hf_adapter_t *a = hp_model_hf_adapter(&t->mcfg);
    if (t->pd.pp == 1) {   /* every rank holds its shards of every adapter: gathered to rank 0 */
        HP_TRY(hp_hf_save_lora(path, a, &t->mcfg, hp_parallel_params(t->par), hp_parallel_num_params(t->par), t->world,
                               c->checkpoint.initial_load_path));
    } else {   /* a stage holds its own layers only: the whole model to rank 0, saved there */
        hp_model_t full = NULL;
        int owned = 0;
        hp_status_t s = hp_parallel_gather_full_model(t->par, t->world, t->T, &full, &owned);
        if (s == HP_OK && t->rank == 0)
            s = hp_hf_save_lora(path, a, &t->mcfg, hp_model_params(full), hp_model_num_params(full), NULL,
                                c->checkpoint.initial_load_path);
        if (owned) hp_model_destroy(full);
        HP_TRY(hp_comm_agree(t->world, s, NULL));
    }
    if (t->rank == 0) hp_log(HP_LOG_INFO, "LoRA adapter (PEFT format) written to %s", path);
    return HP_OK;
}

/* lora.save_folder, under job.dump_folder when relative. */
static void lora_folder(hp_trainer_t t, char *path, size_t n) {
    const hp_config_t *c = &t->cfg;
    if (c->lora.save_folder[0] == '/' || !c->job.dump_folder[0]) snprintf(path, n, "%s", c->lora.save_folder);
    else snprintf(path, n, "%s/%s", c->job.dump_folder, c->lora.save_folder);
}

/* The adapters in PEFT's format at the end of training. */
static hp_status_t save_lora(hp_trainer_t t) {
    const hp_config_t *c = &t->cfg;
    if (!c->lora.enable || !c->lora.save_folder[0]) return HP_OK;
    char path[2 * HP_CONFIG_STR_MAX + 2];
    lora_folder(t, path, sizeof path);
    return hp_trainer_save_lora(t, path);
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

/* parallelism.auto (docs/planner.md): rank 0 plans the layout of this world (the planner's
 * calibration, measured now over the world when there is none), every rank applies it to its
 * copy of the config. Collective over world. */
static hp_status_t auto_layout(hp_trainer_t t) {
    hp_config_t *c = &t->cfg;
    char path[1024];
    hp_plan_calib_default_path(path, sizeof path);
    hp_plan_calib_t cal;
    int have = t->rank == 0 && hp_plan_calib_load(path, &cal) == HP_OK;
    if (t->world_size > 1) HP_TRY(hp_broadcast(&have, 1, HP_I32, 0, t->world, NULL));
    if (!have) {
        if (t->rank == 0)
            hp_log(HP_LOG_INFO, "parallelism.auto: no planner calibration at %s; measuring this machine (quick)", path);
        HP_TRY(hp_plan_calibrate(t->world, 1, &cal));
        if (t->rank == 0 && hp_plan_calib_save(&cal, path) != HP_OK)
            hp_log(HP_LOG_WARN, "parallelism.auto: %s (the calibration is used for this run only)", hp_last_error());
    }
    int n_host = 1;
    HP_TRY(ranks_on_host(t, &n_host));
    hp_plan_layout_t best;
    memset(&best, 0, sizeof best);
    hp_status_t s = HP_OK;
    if (t->rank == 0) {
        hp_model_config_t mc;
        s = hp_plan_resolve_model(c, &mc);
        int64_t rss = 0;
        (void)hp_memory_rss(&rss, NULL);
        double limit = c->training.memory_limit_gib > 0 ? c->training.memory_limit_gib * 1073741824.0 : 0.0;
        if (c->training.memory_limit_gib == 0) limit = (double)rss + mem_available() / n_host;
        hp_plan_options_t o = {t->world_size, limit, (size_t)rss, n_host, &cal};
        hp_plan_result_t r;
        memset(&r, 0, sizeof r);
        if (s == HP_OK) s = hp_plan_search(c, &mc, &o, &r);
        if (s == HP_OK && r.n == 0)
            s = hp_error(HP_ERR_OOM, "parallelism.auto = true: none of the %d layouts of %d ranks fits %.2f GiB per rank "
                         "(%s; %d refused by the layout rules, %d over the limit); the smallest predicted peak is %.2f GiB "
                         "(%s); hint: more ranks, a smaller training.local_batch_size or training.seq_len, or a larger "
                         "training.memory_limit_gib", r.n_enumerated, t->world_size, limit / 1073741824.0,
                         c->training.memory_limit_gib > 0 ? "training.memory_limit_gib" : "this host's MemAvailable over its ranks",
                         r.n_refused, r.n_over_memory, r.smallest_peak / 1073741824.0, r.smallest_what);
        if (s == HP_OK) {
            best = r.layouts[0];
            char ov[1024];
            hp_log(HP_LOG_INFO, "parallelism.auto: %d layouts of %d ranks, %d fit; chose %s (predicted step %.1f ms = "
                   "compute %.1f + exposed communication %.1f + bubble %.1f; peak %.3f GiB per rank)", r.n_enumerated,
                   t->world_size, r.n, hp_plan_overrides(&best, ov, sizeof ov), best.step_s * 1e3, best.compute_s * 1e3,
                   best.exposed_comm_s * 1e3, best.bubble_s * 1e3, best.mem.peak / 1073741824.0);
        }
        hp_plan_result_free(&r);
    }
    HP_TRY(t->world_size > 1 ? hp_comm_agree(t->world, s, NULL) : s);
    if (t->world_size > 1) HP_TRY(hp_broadcast(&best, sizeof best, HP_U8, 0, t->world, NULL));
    if (c->training.global_batch_size <= 0) c->training.global_batch_size = c->training.local_batch_size * t->world_size;
    hp_plan_apply(c, &best);
    return HP_OK;
}

hp_status_t hp_trainer_create(const hp_config_t *cfg, hp_comm_t world, hp_trainer_t *out) {
    *out = NULL;
    hp_trainer_t t = hp_calloc(1, sizeof *t);
    if (!t) return HP_ERR_OOM;
    t->cfg = *cfg;
    t->world = world;
    t->rank = hp_comm_rank(world);
    t->world_size = hp_comm_size(world);
    hp_status_t s = cfg->parallelism.auto_layout ? auto_layout(t) : HP_OK;
    cfg = &t->cfg;   /* the planned layout from here on */
    /* ParallelDims first (pure arithmetic, identical on every rank), then the meshes. */
    if (s == HP_OK) s = hp_parallel_dims_from_config(cfg, t->world_size, &t->pd);
    if (s == HP_OK) s = hp_parallel_dims_build_mesh(&t->pd, world, &t->meshes);
    if (s == HP_OK) {
        t->dp_comm = hp_mesh_get_comm(t->meshes.batch, 0);
        t->loss_comm = hp_mesh_get_comm(t->meshes.loss, 0);
        t->dp_rank = hp_comm_rank(t->dp_comm);
        t->dp_size = hp_comm_size(t->dp_comm);
        s = build(t);
    }
    /* every rank learns whether any failed, with the failing rank's message (rank 0 prints it) */
    s = hp_comm_agree(world, s, NULL);
    if (s == HP_OK) s = hp_comm_agree(world, ckpt_setup(t), NULL);   /* resume */
    if (s == HP_OK) s = lora_setup(t);   /* collective */
    if (s == HP_OK) s = hp_pipeline_log_layout(t->par, world);
    if (s != HP_OK) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", hp_last_error());
        hp_trainer_destroy(t);
        return hp_error(s, "%s", msg);
    }
    if (t->rank == 0) {
        size_t pb, gb, ab, wb;   /* FSDP's sharded params/grads, its gather buffers in the workspace */
        hp_parallel_memory(t->par, &pb, &gb, &ab, &wb);
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
        char plan[1024];
        hp_memory_plan_str(&t->plan, plan, sizeof plan);
        if (t->mem_limit > 0)
            hp_log(HP_LOG_INFO, "memory plan (rank 0, before allocating): peak %s; allowed %.2f GiB (%s)", plan,
                   t->mem_limit / 1073741824.0, t->mem_limit_what);
        else
            hp_log(HP_LOG_INFO, "memory plan (rank 0, before allocating): peak %s; no limit (training.memory_limit_gib "
                   "< 0)", plan);
        hp_ac_estimate_t ace;   /* what activation checkpointing keeps and recomputes (nn_checkpoint.h) */
        if (hp_parallel_ac_estimate(t->par, 0, &ace) == HP_OK && ace.n_checkpointed > 0) {
            char mode[HP_CONFIG_STR_MAX + 32];
            const char *md = cfg->activation_checkpoint.mode;
            if (strcmp(md, "selective") == 0) snprintf(mode, sizeof mode, "selective %s", cfg->activation_checkpoint.selective_ac_option);
            else if (strcmp(md, "memory_budget") == 0) snprintf(mode, sizeof mode, "memory_budget %g", cfg->activation_checkpoint.memory_budget);
            else snprintf(mode, sizeof mode, "%s", md);
            hp_log(HP_LOG_INFO, "activation checkpointing %s: %d blocks; activations %.2f MiB per micro-batch (kept "
                                "%.2f, recompute region %.2f; %.2f without AC); recompute %.4g FLOPs per micro-batch "
                                "(full AC: %.4g)", mode, ace.n_checkpointed, ace.act_bytes / 1048576.0,
                   ace.kept_bytes / 1048576.0, ace.region_bytes / 1048576.0, ace.none_bytes / 1048576.0,
                   ace.recompute_flops, ace.checkpointed_flops);
        }
        /* which kernels run: the GEMM library's family against the CPU (loud when below), the nn path */
        char gemm[512];
        if (hp_gemm_describe(gemm, sizeof gemm))
            hp_log(HP_LOG_WARN, "%s", gemm);
        else
            hp_log(HP_LOG_INFO, "%s; nn kernels: %s path", gemm, hp_nn_isa_name(hp_nn_isa()));
        if (strcmp(cfg->training.dtype, "bfloat16") == 0) {
            hp_gemm_bf16_describe(gemm, sizeof gemm);
            hp_log(HP_LOG_INFO, "training.dtype bfloat16: the linears' GEMMs in bf16 (f32 sums); %s", gemm);
        }
        /* which figure MFU divides by */
        double peak = hp_metrics_peak_flops(t->metrics);
        if (peak > 0 && cfg->metrics.peak_flops > 0)
            hp_log(HP_LOG_INFO, "mfu: peak %.4g FLOP/s per rank, as configured (metrics.peak_flops)", peak);
        else if (peak > 0)
            hp_log(HP_LOG_INFO, "mfu: peak %.4g FLOP/s per rank, the f32 FMA peak of its %d thread(s) at %s, measured "
                                "at start-up; beside it the sgemm peak %.4g FLOP/s (mfu's second figure); set "
                                "metrics.peak_flops to state the figure", peak, omp_get_max_threads(),
                   hp_cpu_isa_name(), hp_metrics_sgemm_peak_flops(t->metrics));
        else
            hp_log(HP_LOG_INFO, "mfu: not reported (metrics.peak_flops = %g)", cfg->metrics.peak_flops);
    }
    *out = t;
    return HP_OK;
}

void hp_trainer_destroy(hp_trainer_t t) {
    if (!t) return;
    if (t->ckpt && hp_ckpt_manager_destroy(t->ckpt) != HP_OK)   /* finish an async save */
        hp_log(HP_LOG_ERROR, "checkpoint: %s", hp_last_error());
    hp_metrics_destroy(t->metrics);
    free(t->inputs);
    free(t->labels);
    hp_dataloader_destroy(t->val_dl);
    hp_dataloader_destroy(t->dl);
    hp_dataset_close(t->ds);
    hp_token_ids_free(&t->scratch);
    hp_tokenizer_free(t->tok);
    hp_chat_template_free(t->chat);
    hp_optim_free(t->opt);
    hp_moe_balancer_destroy(t->moe);
    const int own_model = t->par ? !hp_parallel_is_pipelined(t->par) : 1;
    hp_parallel_destroy(t->par);
    if (own_model) hp_model_destroy(t->model);
    if (t->meshes.world) hp_parallel_meshes_destroy(&t->meshes);
    free(t);
}

hp_model_t hp_trainer_model(hp_trainer_t t) { return t->model; }
hp_param_t *hp_trainer_params(hp_trainer_t t, int *n) {
    *n = hp_parallel_num_params(t->par);
    return hp_parallel_params(t->par);
}
hp_optim_t hp_trainer_optim(hp_trainer_t t) { return t->opt; }

int64_t hp_trainer_current_step(hp_trainer_t t) { return t->step; }
int64_t hp_trainer_grad_accum(hp_trainer_t t) { return t->accum; }
const hp_memory_plan_t *hp_trainer_memory_plan(hp_trainer_t t) { return &t->plan; }

/* The step's loss: summed over pp (only the last stage holds it), then over the loss mesh. */
static hp_status_t global_sum(hp_trainer_t t, float *v, int n, float *out) {
    hp_comm_t ppc = hp_parallel_pp_comm(t->par);
    if (ppc) HP_TRY(hp_all_reduce(v, v, (size_t)n, HP_F32, HP_SUM, ppc, NULL));
    return hp_all_reduce(v, out, (size_t)n, HP_F32, HP_SUM, t->loss_comm, NULL);
}

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
    HP_TRY(hp_parallel_zero_grad(t->par));
    const double dp_wait0 = hp_parallel_comm_wait_seconds(t->par);
    double local_loss = 0.0;
    for (int64_t a = 0; a < t->accum; a++) {
        double loss = 0.0;
        HP_TRY(hp_parallel_forward_backward(t->par, t->inputs + a * bt, t->labels + a * bt, t->B, t->T,
                                            (float)global_valid, a == t->accum - 1, &loss));
        local_loss += loss;
    }
    const double t_fb = hp_clock_now_seconds();
    /* 4. every post-backward reduction the layout needs (gradients are sums: the loss is
     * already globally normalised) */
    hp_grad_finalizer_t fin = hp_parallel_finalizer(t->par);
    HP_TRY(hp_grad_finalizer_reduce(fin));
    const double t_red = hp_clock_now_seconds();
    const double dp_wait = hp_parallel_comm_wait_seconds(t->par) - dp_wait0;
    /* 5. global loss and finiteness (every rank agrees), the norm and clipping */
    float lf = (float)local_loss, gf = 0.0f;
    HP_TRY(global_sum(t, &lf, 1, &gf));
    double global_loss = gf, norm = 0.0;
    hp_status_t cs = hp_grad_finalizer_clip(fin, t->cfg.training.max_norm, &norm);
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
    HP_TRY(hp_parallel_after_optimizer_step(t->par));   /* ZeRO-1: each parameter from its owner */
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
    if (t->ckpt) {   /* interval / last-step save, async commit */
        hp_ckpt_train_state_t st = ckpt_state(t);
        HP_TRY(hp_ckpt_manager_maybe_save(t->ckpt, step, t->cfg.training.steps, &st));
        /* LoRA: the adapter at each interval checkpoint too, as a PEFT folder save_folder/step-N
         * (HF Trainer's checkpoint-N); the last step's is save_folder itself (hp_trainer_train) */
        const hp_config_t *c = &t->cfg;
        if (c->lora.enable && c->lora.save_folder[0] && step % c->checkpoint.interval == 0 && step < c->training.steps) {
            char path[2 * HP_CONFIG_STR_MAX + 32];
            lora_folder(t, path, sizeof path);
            const size_t l = strlen(path);
            snprintf(path + l, sizeof path - l, "/step-%lld", (long long)step);
            HP_TRY(hp_trainer_save_lora(t, path));
        }
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
        double ls = 0.0;
        int64_t nv = 0;
        HP_TRY(hp_parallel_eval(t->par, t->inputs, t->labels, t->val_B, t->T, &ls, &nv));
        sums[0] += ls;
        sums[1] += (double)nv;
    }
    float local[2] = {(float)sums[0], (float)sums[1]}, global[2];
    HP_TRY(global_sum(t, local, 2, global));
    if (global[1] <= 0)
        return hp_error(HP_ERR_STATE, "the validation split yields no full batch of %d x %d tokens; lower "
                                      "validation.local_batch_size or raise data.validation_fraction", t->val_B, t->T);
    *loss = global[0] / global[1];
    return HP_OK;
}

/* job.dump_folder/weights.safetensors: rank 0 writes the whole model, gathered by the
 * composition (collective). */
static hp_status_t save_final_weights(hp_trainer_t t) {
    char path[2 * HP_CONFIG_STR_MAX];
    snprintf(path, sizeof path, "%s/weights.safetensors", t->cfg.job.dump_folder);
    hp_model_t full = NULL;
    int owned = 0;
    hp_status_t s = hp_parallel_gather_full_model(t->par, t->world, t->T, &full, &owned);
    if (s == HP_OK && t->rank == 0) {
        s = hp_model_save_weights(full, path);
        if (s == HP_OK) hp_log(HP_LOG_INFO, "final weights written to %s", path);
    }
    if (owned) hp_model_destroy(full);
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

/* After training, every rank's predicted peak beside the measured ones (collective over world):
 * the process's peak resident set (VmHWM) and the library's allocations (hp_memory_tracked). */
static hp_status_t report_memory(hp_trainer_t t) {
    int64_t rss = 0, hwm = 0;
    size_t live = 0, tracked = 0;
    HP_TRY(hp_memory_rss(&rss, &hwm));
    hp_memory_tracked(&live, &tracked);
    int64_t mine[4] = {(int64_t)t->plan.peak, hwm, (int64_t)(t->plan.peak - t->plan.base - t->plan.mpi),
                       (int64_t)tracked};
    int64_t *all = hp_calloc(4 * (size_t)t->world_size, sizeof(int64_t));
    if (!all) return HP_ERR_OOM;
    hp_status_t s = t->world && t->world_size > 1 ? hp_all_gather(mine, all, 4, HP_I64, t->world, NULL) : HP_OK;
    if (s == HP_OK && (!t->world || t->world_size == 1)) memcpy(all, mine, sizeof mine);
    if (s == HP_OK && t->rank == 0) {
        const double gib = 1073741824.0;
        double worst = 0.0, max_rss = 0.0;
        for (int r = 0; r < t->world_size; r++) {
            const double v[4] = {(double)all[4 * r], (double)all[4 * r + 1], (double)all[4 * r + 2],
                                 (double)all[4 * r + 3]};
            const double e = (v[0] - v[1]) / v[1];
            if (fabs(e) > fabs(worst)) worst = e;
            if (v[1] > max_rss) max_rss = v[1];
            if (r < 16)
                hp_log(HP_LOG_INFO, "memory rank %d: predicted peak %.3f GiB, measured peak RSS %.3f GiB (prediction "
                       "%+.1f%%); library allocations: predicted %.3f GiB, measured peak %.3f GiB (%+.1f%%)", r,
                       v[0] / gib, v[1] / gib, 100.0 * e, v[2] / gib, v[3] / gib, 100.0 * (v[2] - v[3]) / v[3]);
        }
        hp_log(HP_LOG_INFO, "memory: largest measured peak RSS %.3f GiB over %d rank(s); the prediction's worst error "
               "%+.1f%%", max_rss / gib, t->world_size, 100.0 * worst);
    }
    free(all);
    return s;
}

/* The step profile: the mean step's phases after the first step, logged by rank 0. */
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
    HP_TRY(report_memory(t));   /* before the final weights: their gather is not the training's peak */
    HP_TRY(save_lora(t));
    return c->job.dump_folder[0] ? save_final_weights(t) : HP_OK;
}
