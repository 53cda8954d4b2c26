/* LoRA SFT through hp-train's trainer (docs/finetune.md "LoRA"): a small qwen3 and a small llama3
 * HF folder (made here: drawn, exported, with the example's tokenizer) fine-tuned with adapters on
 * all seven projections on the example's conversations. One run of the single rank gives: the loss
 * falls; every frozen parameter is bitwise the folder's after training and has no gradient; the
 * optimizer's state is the adapters' alone (its bytes equal an optimizer built on the adapters);
 * the PEFT folder written at the end (and at the step-3 checkpoint) loads back bitwise; a run
 * resumed from the step-3 checkpoint continues bitwise. AC (full, op-level) is bitwise the run
 * without; FSDP 2, DDP 2, TP 2, CP 2, PP 2 and ZeRO-1 equal the single rank of the same global
 * batch within the derived bound (an lr 1% off leaves it); the PEFT folder loaded and saved
 * again under FSDP 2, TP 2, DDP 2 and PP 2 is bitwise the same file. */
// hp-test: ranks 2 timeout 600
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_corpus.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/file.h"
#include "hyperparallel/models.h"
#include "hyperparallel/optim.h"
#include "hyperparallel/tokenizer.h"

enum { N = 6 };

/* Tolerance (as test_sft_trainer.c, FSDP in float32): FSDP and DDP change only f32 summation
 * orders (gradients summed over ranks by the reduce-scatter / all-reduce, the loss of the two
 * ranks' rows summed in another order), ~1e-6 relative per step; AdamW's normalised update over
 * 6 steps amplifies that to ~1e-5 on the loss, so 1e-4 (losses) / 1e-3 (gradient norms) hold
 * with margin, while an lr 1% off moves the loss by more than 1e-4 relative within 6 steps.
 * Frozen weights change no rounding: they are compared bitwise. */
#define LOSS_RTOL 1e-4
#define NORM_RTOL 1e-3

static hp_comm_t world;
static int rank_, ws_;
static char base_[300], x_[300], y_[300];

/* The base folder: qwen3 with the small test dims and the example tokenizer's vocabulary, drawn
 * with seed 11 and exported (config.json, model.safetensors), the tokenizer files beside it. */
static void make_base(const char *family, hp_model_config_t *mc) {
    snprintf(base_, sizeof base_, "%s/base_%s", dir_, family);
    char tokdir[600];
    hp_test_source_path(tokdir, sizeof tokdir, "examples/sft/qwen3");
    hp_tokenizer_t tok = NULL;
    HP_CHECK_OK(hp_tokenizer_load(&tok, tokdir));
    HP_CHECK_OK(hp_model_flavor(family, "debugmodel", mc));
    mc->multiple_of = 0;   /* llama3: hidden_dim as given */
    mc->dim = 64;
    mc->n_heads = 4;
    mc->n_kv_heads = 2;
    mc->head_dim = 16;
    mc->hidden_dim = 128;
    mc->n_layers = 2;
    mc->vocab_size = tok ? hp_tokenizer_vocab_size(tok) : 0;
    mc->max_seq_len = 64;
    HP_CHECK_OK(hp_model_config_validate(mc));
    hp_tokenizer_free(tok);
    if (rank_ == 0) {
        hp_model_t m = NULL;
        HP_CHECK_OK(hp_model_create(mc, 1, 8, &m));
        HP_CHECK_OK(hp_model_init_weights(m, 11));
        HP_CHECK_OK(hp_hf_export(base_, hp_model_hf_adapter(mc), mc, hp_model_params(m), hp_model_num_params(m), NULL,
                                 HP_F32, 0));
        hp_model_destroy(m);
        const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
        for (int i = 0; i < 2; i++) {
            char from[700], to[700], *data = NULL;
            size_t len = 0;
            snprintf(from, sizeof from, "%s/%s", tokdir, files[i]);
            snprintf(to, sizeof to, "%s/%s", base_, files[i]);
            HP_CHECK_OK(hp_file_read_all(from, "tokenizer", (size_t)64 << 20, &data, &len));
            HP_CHECK_OK(hp_file_write_atomic(to, data, len));
            free(data);
        }
    }
    hp_barrier(world, NULL);
}

static void lora_config(hp_config_t *c) {
    hp_test_base_config(c, 1);
    snprintf(c->model.name, sizeof c->model.name, "qwen3");
    snprintf(c->model.flavor, sizeof c->model.flavor, "hf");
    c->checkpoint.enable = true;
    snprintf(c->checkpoint.initial_load_path, sizeof c->checkpoint.initial_load_path, "%s", base_);
    c->checkpoint.interval = 1000;
    snprintf(c->tokenizer.path, sizeof c->tokenizer.path, "%s", base_);
    c->parallelism.data_parallel_replicate_degree = 1;
    c->training.seq_len = 64;
    c->training.local_batch_size = 2;
    c->training.steps = N;
    c->validation.enable = false;
    c->data.validation_fraction = 0;
    char p[600];
    hp_test_source_path(p, sizeof p, "examples/sft/chat.jsonl");
    snprintf(c->data.path, sizeof c->data.path, "%.250s", p);
    snprintf(c->data.format, sizeof c->data.format, "chat");
    c->data.pack = false;
    snprintf(c->training.mixed_precision_param, sizeof c->training.mixed_precision_param, "float32");
    c->optimizer.lr = 1e-2;
    c->lr_scheduler.warmup_steps = 1;
    c->lora.enable = true;
    c->lora.rank = 4;
    c->lora.alpha = 8;
    const char *t[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    c->lora.target_modules.n = 7;
    for (int i = 0; i < 7; i++) snprintf(c->lora.target_modules.items[i], HP_CONFIG_STR_MAX, "%s", t[i]);
}

/* The folder's model with the run's LoRA (adapters drawn), weights from the folder. */
static hp_model_t load_base(const hp_model_config_t *mc0, const hp_config_t *c) {
    hp_model_config_t mc = *mc0;
    HP_CHECK_OK(hp_config_apply_lora(c, &mc));
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 1, 8, &m));
    if (!m) return NULL;
    HP_CHECK_OK(hp_model_init_weights(m, 5));
    HP_CHECK_OK(hp_hf_import(base_, hp_model_hf_adapter(&mc), &mc, hp_model_params(m), hp_model_num_params(m), NULL));
    return m;
}

/* The single rank (reads y.jsonl, batch 2 B): the loss, the frozen weights, the gradients, the
 * optimizer's state and the PEFT folder written at the end. */
static void single(const hp_config_t *c, const hp_model_config_t *mc, hp_comm_t solo, double *l, double *n) {
    double buf[2 * N] = {0};
    if (solo) {
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(c, solo, &t));
        if (!t) return;
        for (int i = 0; i < N; i++) {
            hp_step_stats_t st;
            HP_CHECK_OK(hp_trainer_step(t, &st));
            buf[i] = st.loss;
            buf[N + i] = st.grad_norm;
        }
        HP_CHECK_OK(hp_trainer_train(t));   /* at training.steps: writes the adapter and the final weights */
        int np = 0;
        hp_param_t *ps = hp_trainer_params(t, &np);
        hp_model_t ref = load_base(mc, c);
        int frozen_changed = 0, frozen_grad = 0, n_frozen = 0, n_train = 0;
        hp_param_t *train = calloc((size_t)np, sizeof *train);
        for (int i = 0; ref && i < np; i++) {
            const hp_param_t *p = &ps[i], *q = hp_model_find_param(ref, p->name);
            HP_CHECK(q != NULL && p->frozen == q->frozen, "'%s' missing or not frozen alike in the base model", p->name);
            if (!q) continue;
            const size_t bytes = sizeof(float) * (size_t)hp_tensor_numel(&p->value.local);
            if (!p->frozen) {
                train[n_train++] = *p;
                continue;
            }
            n_frozen++;
            frozen_changed += memcmp(hp_param_w(p), hp_param_w(q), bytes) != 0;
            for (int64_t k = 0; k < hp_tensor_numel(&p->grad.local); k++) frozen_grad += hp_param_g(p)[k] != 0.0f;
        }
        HP_CHECK(n_frozen > 0 && n_train == 2 * 7 * mc->n_layers, "%d frozen, %d trainable entries", n_frozen, n_train);
        HP_CHECK(frozen_changed == 0, "%d of %d frozen parameters changed in training", frozen_changed, n_frozen);
        HP_CHECK(frozen_grad == 0, "%d gradient elements of frozen parameters are not zero", frozen_grad);
        /* the optimizer holds the adapters' state only: as one built on them alone */
        hp_optim_config_t oc = hp_optim_default(HP_OPTIM_ADAMW);
        hp_optim_t o2 = NULL;
        HP_CHECK_OK(hp_optim_create(&oc, train, n_train, &o2));
        if (o2) {
            HP_CHECK(hp_optim_state_bytes(hp_trainer_optim(t)) == hp_optim_state_bytes(o2),
                     "optimizer state %zu bytes, the adapters' alone %zu", hp_optim_state_bytes(hp_trainer_optim(t)),
                     hp_optim_state_bytes(o2));
            printf("optimizer state: %zu bytes (the adapters': %zu)\n", hp_optim_state_bytes(hp_trainer_optim(t)),
                   hp_optim_state_bytes(o2));
            hp_optim_free(o2);
        }
        /* the PEFT folder: loads back bitwise into the base model */
        char saved[2 * HP_CONFIG_STR_MAX + 2];
        snprintf(saved, sizeof saved, "%s/%s", c->job.dump_folder, c->lora.save_folder);
        hp_model_config_t mcl = *mc;
        HP_CHECK_OK(hp_config_apply_lora(c, &mcl));
        HP_CHECK_OK(hp_hf_import_lora(saved, hp_model_hf_adapter(&mcl), &mcl, hp_model_params(ref),
                                      hp_model_num_params(ref), NULL));
        for (int i = 0; i < n_train; i++) {
            const hp_param_t *q = hp_model_find_param(ref, train[i].name);
            HP_CHECK(q && !memcmp(hp_param_w(q), hp_param_w(&train[i]),
                                  sizeof(float) * (size_t)hp_tensor_numel(&train[i].value.local)),
                     "'%s' differs after the PEFT save -> load", train[i].name);
        }
        /* an interval checkpoint's adapter (save_folder/step-N) loads too */
        if (c->checkpoint.interval < N) {
            char mid[2 * HP_CONFIG_STR_MAX + 40];
            snprintf(mid, sizeof mid, "%s/step-%lld", saved, (long long)c->checkpoint.interval);
            HP_CHECK_OK(hp_hf_import_lora(mid, hp_model_hf_adapter(&mcl), &mcl, hp_model_params(ref),
                                          hp_model_num_params(ref), NULL));
        }
        free(train);
        hp_model_destroy(ref);
        hp_trainer_destroy(t);
    }
    HP_CHECK_OK(hp_broadcast(buf, sizeof buf, HP_U8, 0, world, NULL));
    for (int i = 0; i < N; i++) {
        l[i] = buf[i];
        n[i] = buf[N + i];
    }
}

int main(int argc, char **argv) {
    hp_config_t *c = NULL;
    world = hp_test_corpus_init(&argc, &argv, "hp_test_lora_trainer", &rank_, &ws_, &c);
    hp_model_config_t mc;
    make_base("qwen3", &mc);
    lora_config(c);
    const int B = (int)c->training.local_batch_size;
    hp_test_sft_files(world, B, N * B, x_, y_, sizeof x_);
    hp_comm_t solo = hp_test_first_ranks(world, 1);
    double rl[N], rn[N], l[N], n[N];

    hp_config_t *r = calloc(1, sizeof *r), *v = calloc(1, sizeof *v);
    *r = *c;
    hp_test_single_rank(r);
    snprintf(r->data.path, sizeof r->data.path, "%s", y_);
    r->training.local_batch_size = 2 * B;
    snprintf(r->job.dump_folder, sizeof r->job.dump_folder, "%s/single", dir_);
    r->checkpoint.interval = 3;   /* an adapter folder at step 3 as well */
    single(r, &mc, solo, rl, rn);
    r->checkpoint.interval = 1000;

    /* resume from the single run's step-3 checkpoint (adapters, their optimizer state, the frozen
     * base, data position): steps 4..6 bitwise the uninterrupted run's */
    {
        *v = *r;
        snprintf(v->checkpoint.folder, sizeof v->checkpoint.folder, "%s/single/checkpoint", dir_);
        v->checkpoint.load_step = 3;
        snprintf(v->job.dump_folder, sizeof v->job.dump_folder, "%s/resume", dir_);
        double rs[N] = {0};
        if (solo) HP_CHECK(hp_test_run_steps(v, solo, 3, N, rs, "lora resume") == 1, "no trainer");
        HP_CHECK_OK(hp_broadcast(rs, sizeof rs, HP_U8, 0, world, NULL));
        for (int i = 3; i < N; i++)
            HP_CHECK(rs[i] == rl[i], "lora resumed at step 3: step %d loss %.9g, uninterrupted %.9g", i + 1, rs[i], rl[i]);
    }
    HP_CHECK(rl[N - 1] < rl[0] && isfinite(rl[0]), "LoRA loss does not fall: %g -> %g", rl[0], rl[N - 1]);
    if (rank_ == 0) printf("LoRA single rank: loss %.4f -> %.4f\n", rl[0], rl[N - 1]);

    *v = *c;
    snprintf(v->data.path, sizeof v->data.path, "%s", x_);
    v->parallelism.data_parallel_shard_degree = 2;
    snprintf(v->job.dump_folder, sizeof v->job.dump_folder, "%s/fsdp", dir_);
    hp_test_run_on(v, world, world, N, l, n, NULL);
    hp_test_compare_runs("lora fsdp 2", N, l, rl, n, rn, LOSS_RTOL, NORM_RTOL);

    /* FSDP reduce-scatters the adapters' gradients only: one step's reduce-scatter input on each
     * rank is every trainable element once (the adapters' dims are even: no padding), f32 */
    {
        snprintf(v->job.dump_folder, sizeof v->job.dump_folder, "%s/fsdp_rs", dir_);
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(v, world, &t));
        if (t) {
            int np = 0;
            hp_param_t *ps = hp_trainer_params(t, &np);
            uint64_t trainable = 0, all = 0;
            for (int i = 0; i < np; i++) {
                uint64_t k = 1;
                for (int d = 0; d < ps[i].value.local.ndim; d++) k *= (uint64_t)ps[i].value.global_shape[d];
                all += k;
                trainable += ps[i].frozen ? 0 : k;
            }
            hp_comm_counts_reset();
            hp_step_stats_t st;
            HP_CHECK_OK(hp_trainer_step(t, &st));
            hp_comm_counts_t cc;
            hp_comm_counts_get(&cc);
            HP_CHECK(cc.bytes[HP_COMM_REDUCE_SCATTER] == 4 * trainable,
                     "FSDP reduce-scattered %llu bytes in a step; the adapters' gradients are %llu bytes (all "
                     "parameters %llu)", (unsigned long long)cc.bytes[HP_COMM_REDUCE_SCATTER],
                     (unsigned long long)(4 * trainable), (unsigned long long)(4 * all));
            if (rank_ == 0)
                printf("FSDP 2: reduce-scatter %llu bytes per step (adapters %llu, all parameters %llu)\n",
                       (unsigned long long)cc.bytes[HP_COMM_REDUCE_SCATTER], (unsigned long long)(4 * trainable),
                       (unsigned long long)(4 * all));
        }
        hp_trainer_destroy(t);
    }

    /* negative: the same layout with lr 1% off leaves the tolerance */
    v->optimizer.lr *= 1.01;
    snprintf(v->job.dump_folder, sizeof v->job.dump_folder, "%s/fsdp_lr", dir_);   /* a fresh run, not a resume */
    hp_test_run_on(v, world, world, N, l, n, NULL);
    HP_CHECK(l[N - 1] > 0, "the negative run did not train");
    HP_CHECK(hp_test_any_outside(l, rl, N, LOSS_RTOL), "an lr 1%% off stays within the tolerance");

    *v = *c;
    snprintf(v->data.path, sizeof v->data.path, "%s", x_);
    v->parallelism.data_parallel_shard_degree = 1;
    v->parallelism.data_parallel_replicate_degree = 2;
    snprintf(v->job.dump_folder, sizeof v->job.dump_folder, "%s/ddp", dir_);
    hp_test_run_on(v, world, world, N, l, n, NULL);
    hp_test_compare_runs("lora ddp 2", N, l, rl, n, rn, LOSS_RTOL, NORM_RTOL);

    /* activation checkpointing (full; TorchTitan's op-level selective): bitwise the run without */
    const char *acm[2][2] = {{"full", "2"}, {"selective", "op"}};
    for (int k = 0; k < 2; k++) {
        *v = *r;
        snprintf(v->activation_checkpoint.mode, sizeof v->activation_checkpoint.mode, "%s", acm[k][0]);
        snprintf(v->activation_checkpoint.selective_ac_option, sizeof v->activation_checkpoint.selective_ac_option,
                 "%s", acm[k][1]);
        snprintf(v->job.dump_folder, sizeof v->job.dump_folder, "%s/ac%d", dir_, k);
        hp_test_run_on(v, solo, world, N, l, n, NULL);
        int same = 1;
        for (int i = 0; i < N; i++) same &= l[i] == rl[i] && n[i] == rn[i];
        HP_CHECK(same, "lora with activation_checkpoint.mode %s: losses / norms not bitwise the run without AC",
                 acm[k][0]);
    }

    /* TP 2 (sequence parallel, as the config's default): every rank reads the single rank's rows
     * (y.jsonl, batch 2 B); colwise bases shard B's rows, rowwise bases A's columns */
    *v = *r;
    v->parallelism.tensor_parallel_degree = 2;
    snprintf(v->job.dump_folder, sizeof v->job.dump_folder, "%s/tp", dir_);
    hp_test_run_on(v, world, world, N, l, n, NULL);
    hp_test_compare_runs("lora tp 2", N, l, rl, n, rn, LOSS_RTOL, NORM_RTOL);

    /* CP 2 and PP 2: every rank reads the single rank's rows; ZeRO-1 over DDP 2 */
    const char *more[3] = {"cp", "pp", "zero"};
    for (int k = 0; k < 3; k++) {
        *v = k < 2 ? *r : *c;
        if (k == 0) v->parallelism.context_parallel_degree = 2;
        if (k == 1) v->parallelism.pipeline_parallel_degree = 2;
        if (k == 2) {
            snprintf(v->data.path, sizeof v->data.path, "%s", x_);
            v->parallelism.data_parallel_shard_degree = 1;
            v->parallelism.data_parallel_replicate_degree = 2;
            v->parallelism.zero_stage = 1;
        }
        snprintf(v->job.dump_folder, sizeof v->job.dump_folder, "%s/%s", dir_, more[k]);
        hp_test_run_on(v, world, world, N, l, n, NULL);
        char w[64];
        snprintf(w, sizeof w, "lora %s 2", more[k]);
        hp_test_compare_runs(w, N, l, rl, n, rn, LOSS_RTOL, NORM_RTOL);
    }

    /* the adapter through each layout's load and save, bitwise: the single rank's PEFT folder loaded
     * (lora.adapter_path: each rank reads its boxes of the adapters' shards) and saved (gathered)
     * again before any step */
    const char *lay[4] = {"fsdp_rt", "tp_rt", "ddp_rt", "pp_rt"};
    for (int k = 0; k < 4; k++) {
        *v = *c;
        snprintf(v->data.path, sizeof v->data.path, "%s", x_);
        v->parallelism.data_parallel_shard_degree = k == 0 ? 2 : 1;
        v->parallelism.tensor_parallel_degree = k == 1 ? 2 : 1;
        v->parallelism.data_parallel_replicate_degree = k == 2 ? 2 : 1;
        v->parallelism.pipeline_parallel_degree = k == 3 ? 2 : 1;
        snprintf(v->lora.adapter_path, sizeof v->lora.adapter_path, "%s/single/lora_adapter", dir_);
        snprintf(v->job.dump_folder, sizeof v->job.dump_folder, "%s/%s", dir_, lay[k]);
        hp_trainer_t t = NULL;
        HP_CHECK_OK(hp_trainer_create(v, world, &t));
        char out[700];
        snprintf(out, sizeof out, "%s/%s/lora_adapter", dir_, lay[k]);
        if (t) HP_CHECK_OK(hp_trainer_save_lora(t, out));
        hp_trainer_destroy(t);
        if (rank_ == 0) {
            char pa[700], pb[700];
            snprintf(pa, sizeof pa, "%s/single/lora_adapter/adapter_model.safetensors", dir_);
            snprintf(pb, sizeof pb, "%s/%s/lora_adapter/adapter_model.safetensors", dir_, lay[k]);
            char *a = NULL, *b = NULL;
            size_t na = 0, nb = 0;
            HP_CHECK_OK(hp_file_read_all(pa, "adapter", (size_t)64 << 20, &a, &na));
            HP_CHECK_OK(hp_file_read_all(pb, "adapter", (size_t)64 << 20, &b, &nb));
            HP_CHECK(a && b && na == nb && !memcmp(a, b, na), "%s: the adapter loaded and saved again differs from "
                     "the single rank's file (%zu vs %zu bytes)", lay[k], na, nb);
            free(a);
            free(b);
        }
        hp_barrier(world, NULL);
    }

    /* a Llama folder (its q/k rows permuted in HF's layout, lora_B's with them): the single-rank
     * checks again (loss, frozen weights, gradients, optimizer state, PEFT round trip) */
    hp_model_config_t mcl;
    make_base("llama3", &mcl);
    *v = *r;
    snprintf(v->model.name, sizeof v->model.name, "llama3");
    snprintf(v->checkpoint.initial_load_path, sizeof v->checkpoint.initial_load_path, "%s", base_);
    snprintf(v->tokenizer.path, sizeof v->tokenizer.path, "%s", base_);
    snprintf(v->job.dump_folder, sizeof v->job.dump_folder, "%s/llama", dir_);
    single(v, &mcl, solo, l, n);
    HP_CHECK(l[N - 1] < l[0] && isfinite(l[0]), "llama3 LoRA loss does not fall: %g -> %g", l[0], l[N - 1]);
    if (rank_ == 0) printf("LoRA llama3 single rank: loss %.4f -> %.4f\n", l[0], l[N - 1]);
    /* DDP 2 with its buckets (llama3's embeddings are untied): the frozen parameters in none */
    double ll[N], ln[N];
    memcpy(ll, l, sizeof ll);
    memcpy(ln, n, sizeof ln);
    hp_config_t *w = calloc(1, sizeof *w);
    *w = *v;
    snprintf(w->data.path, sizeof w->data.path, "%s", x_);
    w->training.local_batch_size = B;
    w->parallelism.data_parallel_replicate_degree = 2;
    snprintf(w->job.dump_folder, sizeof w->job.dump_folder, "%s/llama_ddp", dir_);
    hp_test_run_on(w, world, world, N, l, n, NULL);
    hp_test_compare_runs("lora llama3 ddp 2 (buckets)", N, l, ll, n, ln, LOSS_RTOL, NORM_RTOL);
    free(w);

    free(v);
    free(r);
    free(c);
    if (solo) hp_comm_destroy(solo);
    return hp_test_corpus_finish(world, "test_lora_trainer");
}
