/* The auto-parallel planner (planner.h, docs/planner.md): the layouts of a world size, checked by
 * the trainer's own layout rules and the memory plan, ranked by a step time predicted from this
 * machine's measured rates and each layout's communication volume (counted as the comm layer's
 * counters count it). The calibration is in planner_calib.c. */
#define _GNU_SOURCE
#include "hyperparallel/planner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/ddp.h"
#include "hyperparallel/models.h"
#include "hyperparallel/parallel_config.h"
#include "hyperparallel/pp_schedule.h"
#include "hyperparallel/tokenizer.h"
#include "hyperparallel/zero.h"

hp_status_t hp_plan_resolve_model(const hp_config_t *cfg, hp_model_config_t *out) {
    if (!cfg->tokenizer.path[0])
        return hp_error(HP_ERR_INVALID_ARG, "tokenizer.path is empty; the planner sizes the model with the "
                        "tokenizer's vocabulary as hp-train does; hint: set --tokenizer.path=FILE");
    hp_tokenizer_t tok = NULL;
    HP_TRY(hp_tokenizer_load(&tok, cfg->tokenizer.path));
    char what[HP_CONFIG_STR_MAX + 32];
    snprintf(what, sizeof what, "tokenizer.path '%s'", cfg->tokenizer.path);
    hp_status_t s = hp_config_resolve_model(cfg, hp_tokenizer_vocab_size(tok), what, (int)cfg->training.seq_len, out);
    hp_tokenizer_free(tok);
    return s;
}

/* ---- communication volume ------------------------------------------------------------------- */

static void add(hp_plan_comm_t *c, hp_comm_op_t op, uint64_t calls, uint64_t bytes) {
    c->calls[op] += calls;
    c->bytes[op] += bytes;
}

/* Seconds of `calls` calls moving `bytes` in all over `ranks`. */
static double coll_time(const hp_plan_calib_t *cal, hp_plan_coll_t op, int ranks, uint64_t calls, uint64_t bytes) {
    if (!cal || ranks <= 1 || calls == 0) return 0.0;
    return (double)calls * hp_plan_coll_seconds(cal, op, ranks, (double)bytes / (double)calls);
}

/* FSDP's group sizes (floats per rank: sum over the group's parameters of ceil(d0 / W) x the rest,
 * fsdp.c's rule) from the empty model: one group per unit (embedding, each block, the root; tied:
 * embedding and root one group). Under TP the local shapes are not known here (exact = 0). */
static hp_status_t fsdp_groups(const hp_model_config_t *mc, int W, int tp, int B, int T, double **S_out, int *n_out,
                               double *total_floats) {
    hp_model_t m = NULL;
    HP_TRY(hp_model_create_empty(mc, B, T, &m));
    const int nu = hp_model_num_units(m);
    double *S = calloc((size_t)nu, sizeof *S);
    if (!S) { hp_model_destroy(m); return HP_ERR_OOM; }
    hp_param_t *P = hp_model_params(m);
    double tot = 0.0;
    for (int u = 0; u < nu; u++) {
        int first = 0, count = 0;
        hp_model_unit_params(m, u, &first, &count);
        for (int i = first; i < first + count; i++) {
            const hp_tensor_t *t = &P[i].value.local;
            int64_t d0 = t->shape[0], rest = 1;
            for (int d = 1; d < t->ndim; d++) rest *= t->shape[d];
            if (tp > 1) {   /* TP-local: an estimate (the plan's styles are not applied here) */
                S[u] += (double)(d0 * rest) / tp / W;
            } else {
                S[u] += (double)((d0 + W - 1) / W * rest);
            }
            tot += (double)(d0 * rest);
        }
    }
    hp_model_destroy(m);
    *S_out = S;
    *n_out = nu;
    if (total_floats) *total_floats = tot;
    return HP_OK;
}

/* Local parameter numels of the whole model in table order (DDP's buckets, ZeRO's partition). */
static hp_status_t param_numels(const hp_model_config_t *mc, int B, int T, int64_t **out, int *n) {
    hp_model_t m = NULL;
    HP_TRY(hp_model_create_empty(mc, B, T, &m));
    const int np = hp_model_num_params(m);
    int64_t *v = malloc(sizeof *v * (size_t)(np > 0 ? np : 1));
    if (!v) { hp_model_destroy(m); return HP_ERR_OOM; }
    hp_param_t *P = hp_model_params(m);
    for (int i = 0; i < np; i++) v[i] = hp_tensor_numel(&P[i].value.local);
    hp_model_destroy(m);
    *out = v;
    *n = np;
    return HP_OK;
}

hp_status_t hp_plan_comm_predict(const hp_config_t *cfg, const hp_model_config_t *mc, const hp_parallel_dims_t *pd,
                                 int rank, const hp_plan_calib_t *cal, hp_plan_comm_t *out) {
    memset(out, 0, sizeof *out);
    out->exact = 1;
    const int B = (int)cfg->training.local_batch_size, T = (int)cfg->training.seq_len;
    int64_t accum = 1;
    HP_TRY(hp_config_grad_accum_steps(cfg, hp_parallel_dims_dp(pd), &accum));
    const int tp = pd->tp, cp = pd->cp, pp = pd->pp, W = pd->dp_shard * pd->cp, R = pd->dp_replicate;
    const int L = mc->n_layers, C = mc->dim;
    const int dense_plain = mc->moe_experts == 0 && !mc->mla && !mc->qk_norm && !mc->tie_embeddings;
    const int sp = tp > 1 && cfg->parallelism.enable_sequence_parallel;
    const int lp = tp > 1 && cfg->parallelism.enable_loss_parallel;
    if (pp > 1 || pd->ep > 1 || cp > 1 || !dense_plain || (tp > 1 && !lp)) out->exact = 0;
    const int dp = hp_parallel_dims_dp(pd);
    double blocking = 0.0, overl = 0.0;
    /* the step's own small collectives (trainer.c): valid-target count (3 x i64 over the batch
     * mesh), the loss (f32 over pp when pipelined, then over the loss mesh) */
    add(out, HP_COMM_ALL_REDUCE, 1, 24);
    blocking += coll_time(cal, HP_PLAN_ALL_REDUCE, dp, 1, 24);
    if (pp > 1) add(out, HP_COMM_ALL_REDUCE, 1, 4), blocking += coll_time(cal, HP_PLAN_ALL_REDUCE, pp, 1, 4);
    add(out, HP_COMM_ALL_REDUCE, 1, 4);
    blocking += coll_time(cal, HP_PLAN_ALL_REDUCE, dp * cp, 1, 4);
    /* the gradient norm: one f32 all-reduce per communicator the gradients are sharded over
     * (hp_fsdp_grad_comms: shard, replicate under HSDP, tp; tp alone; pp) */
    const int fsdp = W > 1;
    int norm_comms = fsdp ? 1 + (R > 1) + (tp > 1) : (tp > 1);
    if (pp > 1) norm_comms++;
    add(out, HP_COMM_ALL_REDUCE, (uint64_t)norm_comms, 4ull * (uint64_t)norm_comms);
    blocking += coll_time(cal, HP_PLAN_ALL_REDUCE, W > 1 ? W : tp > 1 ? tp : pp, (uint64_t)norm_comms,
                          4ull * (uint64_t)norm_comms);

    /* micro-batches through this rank per step and their local rows */
    const int mbs = pp > 1 ? (int)cfg->parallelism.pipeline_parallel_microbatch_size : B;
    const int n_micro = pp > 1 ? (int)(B / (mbs > 0 ? mbs : 1)) : 1;
    const uint64_t passes = (uint64_t)accum * (uint64_t)n_micro;
    const uint64_t rows = (uint64_t)mbs * (uint64_t)(T / cp);
    const int L_rank = (L + pp - 1) / pp;   /* layers of this rank's stage(s) */

    /* TP (the dense decoder's plan, tp_wrap.c): per block two row-parallel outputs (wo, w2)
     * forward and two column-parallel input gradients backward; the vocab-parallel embedding's
     * output forward, the output projection's input gradient backward. Without sequence
     * parallel each is an all-reduce of (rows, C); with it an all-gather of (rows / tp, C) and a
     * reduce-scatter of (rows, C) each, plus the replicated norms' weight gradients (2 per block
     * and the final norm) all-reduced. Loss parallel: max, sum-exp and target logit (rows f32). */
    if (tp > 1) {
        const uint64_t n_act = (uint64_t)(4 * L_rank + 2), act = rows * (uint64_t)C * 4;
        if (!sp) {
            add(out, HP_COMM_ALL_REDUCE, n_act * passes, n_act * passes * act);
            blocking += coll_time(cal, HP_PLAN_ALL_REDUCE, tp, n_act * passes, n_act * passes * act);
        } else {
            add(out, HP_COMM_ALL_GATHER, n_act * passes, n_act * passes * act / (uint64_t)tp);
            add(out, HP_COMM_REDUCE_SCATTER, n_act * passes, n_act * passes * act);
            const uint64_t nn = (uint64_t)(2 * L_rank + 1);
            add(out, HP_COMM_ALL_REDUCE, nn, nn * (uint64_t)C * 4);
            blocking += coll_time(cal, HP_PLAN_ALL_GATHER, tp, n_act * passes, n_act * passes * act / (uint64_t)tp) +
                        coll_time(cal, HP_PLAN_REDUCE_SCATTER, tp, n_act * passes, n_act * passes * act) +
                        coll_time(cal, HP_PLAN_ALL_REDUCE, tp, nn, nn * (uint64_t)C * 4);
        }
        if (lp) {
            add(out, HP_COMM_ALL_REDUCE, 3 * passes, 3 * passes * rows * 4);
            blocking += coll_time(cal, HP_PLAN_ALL_REDUCE, tp, 3 * passes, 3 * passes * rows * 4);
        } else {   /* the logits gathered for the loss (an estimate) */
            const uint64_t lg = rows * (uint64_t)(mc->vocab_size / tp) * 4;
            add(out, HP_COMM_ALL_GATHER, passes, passes * lg);
            blocking += coll_time(cal, HP_PLAN_ALL_GATHER, tp, passes, passes * lg);
        }
    }

    /* FSDP / HSDP (fsdp.c): each group all-gathered before its forward and, when resharded after
     * forward (Default: every group but the root's; not under pipelining), again before its
     * backward; its gradients reduce-scattered once per backward (every micro-batch without
     * pipelining; under pipelining once per step) and under HSDP the shard all-reduced over the
     * replicas as often. */
    if (fsdp) {
        double *S = NULL, tot = 0;
        int nu = 0;
        HP_TRY(fsdp_groups(mc, W, tp, 1, T, &S, &nu, &tot));
        const char *raf = cfg->parallelism.fsdp_reshard_after_forward;
        const int rdef = strcmp(raf, "default") == 0, ralways = strcmp(raf, "always") == 0;
        const size_t pe = strcmp(cfg->training.mixed_precision_param, "bfloat16") == 0 ? 2 : 4;
        const size_t re = strcmp(cfg->training.mixed_precision_reduce, "bfloat16") == 0 ? 2 : 4;
        /* the groups this rank holds: a stage's share under pipelining (an estimate) */
        const double share = pp > 1 ? 1.0 / pp : 1.0;
        uint64_t ag_calls = 0, rs_calls = 0;
        double ag_b = 0, rs_b = 0, ar_b = 0;
        for (int u = 0; u < nu; u++) {
            const int root = u == nu - 1;
            const int re_gather = pp > 1 ? ralways : (ralways || (rdef && !root));
            ag_calls += (uint64_t)(1 + re_gather);
            ag_b += (1 + re_gather) * S[u] * (double)pe;
            rs_calls += 1;
            rs_b += (double)W * S[u] * (double)re;
            ar_b += S[u] * (double)re;
        }
        free(S);
        const uint64_t per = pp > 1 ? 1 : passes;   /* reductions per step */
        const double p_ag = (double)passes * share, p_rs = (double)per * share;
        add(out, HP_COMM_ALL_GATHER, (uint64_t)llround(ag_calls * p_ag), (uint64_t)llround(ag_b * p_ag));
        add(out, HP_COMM_REDUCE_SCATTER, (uint64_t)llround(rs_calls * p_rs), (uint64_t)llround(rs_b * p_rs));
        overl += coll_time(cal, HP_PLAN_ALL_GATHER, W, (uint64_t)llround(ag_calls * p_ag), (uint64_t)llround(ag_b * p_ag)) +
                 coll_time(cal, HP_PLAN_REDUCE_SCATTER, W, (uint64_t)llround(rs_calls * p_rs),
                           (uint64_t)llround(rs_b * p_rs));
        if (tp > 1) out->exact = 0;   /* the TP-local shard sizes are estimated (fsdp_groups) */
        if (R > 1) {
            add(out, HP_COMM_ALL_REDUCE, (uint64_t)llround(rs_calls * p_rs), (uint64_t)llround(ar_b * p_rs));
            overl += coll_time(cal, HP_PLAN_ALL_REDUCE, R, (uint64_t)llround(rs_calls * p_rs),
                               (uint64_t)llround(ar_b * p_rs));
        }
    } else if (R > 1) {
        /* DDP (ddp.c): buckets of 1 MiB first then 25 MiB over the parameters in table order
         * (hp_ddp_bucket_assignment), each all-reduced once per step (no_sync before the last
         * micro-batch); under pipelining one all-reduce per held gradient (an estimate) */
        int64_t *numel = NULL;
        int np = 0;
        HP_TRY(param_numels(mc, 1, T, &numel, &np));
        size_t *bytes = malloc(sizeof *bytes * (size_t)(np > 0 ? np : 1));
        int *bucket_of = malloc(sizeof *bucket_of * (size_t)(np > 0 ? np : 1));
        if (!bytes || !bucket_of) { free(numel); free(bytes); free(bucket_of); return HP_ERR_OOM; }
        uint64_t total = 0;
        for (int i = 0; i < np; i++) {
            bytes[i] = 4 * (size_t)numel[i] / (size_t)tp;
            total += bytes[i];
        }
        if (tp > 1) out->exact = 0;
        const size_t limits[2] = {(size_t)1 << 20, (size_t)25 << 20};
        const int nb = pp > 1 ? (np + pp - 1) / pp : hp_ddp_bucket_assignment(bytes, NULL, np, limits, 2, bucket_of, NULL);
        if (pp > 1) total /= (uint64_t)pp;
        add(out, HP_COMM_ALL_REDUCE, (uint64_t)nb, total);
        overl += coll_time(cal, HP_PLAN_ALL_REDUCE, R, (uint64_t)nb, total);
        /* ZeRO-1 (zero.c): after the optimizer step every parameter is broadcast from its owner
         * (hp_zero_partition's greedy rule); the counters count the bytes at the root */
        if (cfg->parallelism.zero_stage == 1) {
            int *owner = malloc(sizeof *owner * (size_t)(np > 0 ? np : 1));
            if (!owner) { free(numel); free(bytes); free(bucket_of); return HP_ERR_OOM; }
            hp_zero_partition(numel, np, R, owner);
            int coords[HP_PD_NDIM];
            hp_parallel_dims_coords(pd, rank, coords);
            uint64_t mine = 0;
            for (int i = 0; i < np; i++)
                if (owner[i] == coords[HP_PD_DP_REPLICATE]) mine += 4 * (uint64_t)numel[i];
            add(out, HP_COMM_BROADCAST, (uint64_t)np, mine);
            blocking += coll_time(cal, HP_PLAN_BROADCAST, R, (uint64_t)np, total);
            free(owner);
        }
        free(numel);
        free(bytes);
        free(bucket_of);
    }

    /* context parallel (cp.c, an estimate): each block's K and V all-gathered over the ring in
     * forward and again in backward, their gradients reduce-scattered */
    if (cp > 1) {
        const int hkv = mc->mla ? mc->n_heads : mc->n_kv_heads;
        const uint64_t kv = 2 * rows * (uint64_t)(hkv / tp) * (uint64_t)mc->head_dim * 4;
        const uint64_t n = 2 * (uint64_t)L_rank * passes;
        add(out, HP_COMM_ALL_GATHER, n, n * kv);
        add(out, HP_COMM_REDUCE_SCATTER, n / 2, n / 2 * kv * (uint64_t)cp);
        blocking += coll_time(cal, HP_PLAN_ALL_GATHER, cp, n, n * kv) +
                    coll_time(cal, HP_PLAN_REDUCE_SCATTER, cp, n / 2, n / 2 * kv * (uint64_t)cp);
    }
    /* pipeline p2p (an estimate): each micro-batch's activations (mbs, T / cp, C) forward to the
     * next stage, their gradients backward to the previous one; a middle rank sends both */
    if (pp > 1) {
        const uint64_t act = rows * (uint64_t)C * 4 / (uint64_t)(sp ? tp : 1);
        add(out, HP_COMM_SEND, (uint64_t)accum * n_micro, (uint64_t)accum * n_micro * act);
        add(out, HP_COMM_RECV, (uint64_t)accum * n_micro, 0);
        blocking += 2.0 * coll_time(cal, HP_PLAN_P2P, 2, (uint64_t)accum * n_micro, (uint64_t)accum * n_micro * act);
    }
    /* expert parallel (ep.c, an estimate): each MoE block dispatches and combines its tokens'
     * top-k copies by all-to-all in forward and backward */
    if (pd->ep > 1 && mc->moe_experts > 0) {
        const int moe_layers = L - mc->moe_n_dense_layers;
        const uint64_t tok = rows / (uint64_t)(sp ? tp : 1) * (uint64_t)mc->moe_top_k * (uint64_t)C * 4;
        const uint64_t n = 4 * (uint64_t)((moe_layers + pp - 1) / pp) * passes;
        add(out, HP_COMM_ALL_TO_ALL_V, n, n * tok);
        blocking += coll_time(cal, HP_PLAN_ALL_TO_ALL, pd->ep, n, n * tok);
    }
    out->overlappable_s = overl;
    out->blocking_s = blocking;
    return HP_OK;
}

/* ---- compute ------------------------------------------------------------------------------ */

typedef struct compute_est {
    double gemm_s, attn_s, row_s, recompute_s, optim_s;
    double total_s;   /* one rank's step without communication or bubble */
} compute_est_t;

/* One GEMM's forward and both backward products at (rows, out, in). */
static double linear_seconds(const hp_plan_calib_t *c, double rows, double out, double in, double speed) {
    const double f = 2.0 * rows * out * in;
    return (f / hp_plan_gemm_rate(c, rows, out, in) + f / hp_plan_gemm_rate(c, rows, in, out) +
            f / hp_plan_gemm_rate(c, out, in, rows)) / speed;
}

/* Attention rate (B T^2 H hd per second, forward + backward) at T, interpolated in log T. */
static double attn_rate(const hp_plan_calib_t *c, double T) {
    int i = 0;
    while (i + 2 < HP_PLAN_ATTN_T && c->attn_t[i + 1] < T) i++;
    const double t0 = log(c->attn_t[i]), t1 = log(c->attn_t[i + 1]);
    double w = (log(T) - t0) / (t1 - t0);
    if (w < 0) w = 0;
    if (w > 1) w = 1;
    return exp(log(c->attn_flops[i]) * (1 - w) + log(c->attn_flops[i + 1]) * w);
}

/* One rank's compute per step: the model's linears at the shapes this layout gives them (rows
 * B T / cp, output features / tp), attention (T / cp queries over T keys, heads / tp), the row
 * kernels (norms, RoPE, SwiGLU, residuals: floats moved per token), the recompute that AC adds,
 * and the optimizer's sweep over the local parameters; speed = the share of the calibration's
 * cores this rank gets. */
static compute_est_t compute_estimate(const hp_plan_calib_t *c, const hp_model_config_t *mc, const hp_plan_layout_t *l,
                                      int T, double speed, size_t param_bytes) {
    compute_est_t e;
    memset(&e, 0, sizeof e);
    const int tp = l->dims.tp, cp = l->dims.cp, pp = l->dims.pp;
    const double mb = l->dims.pp > 1 ? l->microbatch_size : l->local_batch;
    const double passes = (double)l->grad_accum * (pp > 1 ? (double)l->local_batch / mb : 1.0);
    const double rows = mb * T / cp;
    const double C = mc->dim, hd = mc->head_dim, hq = mc->n_heads, hkv = mc->mla ? mc->n_heads : mc->n_kv_heads;
    const int moe_layers = mc->moe_experts > 0 ? mc->n_layers - mc->moe_n_dense_layers : 0;
    const double hid_dense = mc->hidden_dim;
    const double hid_moe = (double)(mc->moe_top_k + mc->moe_shared_experts) * mc->moe_hidden;
    const double etp = mc->moe_experts > 0 ? (l->dims.etp > 1 ? tp : (l->dims.ep > 1 ? 1 : tp)) : tp;
    const double L = (double)mc->n_layers / pp;   /* a stage's share (the split is near even) */
    double layer_dense = linear_seconds(c, rows, hq * hd / tp, C, speed) +
                         2 * linear_seconds(c, rows, hkv * hd / tp, C, speed) +
                         linear_seconds(c, rows, C, hq * hd / tp, speed);
    double attn = layer_dense;
    double ffn_dense = 2 * linear_seconds(c, rows, hid_dense / tp, C, speed) + linear_seconds(c, rows, C, hid_dense / tp, speed);
    double ffn_moe = moe_layers ? 2 * linear_seconds(c, rows, hid_moe / etp, C, speed) +
                                   linear_seconds(c, rows, C, hid_moe / etp, speed) : 0;
    const double frac_moe = (double)moe_layers / mc->n_layers;
    const double gemm_layer = attn + (1 - frac_moe) * ffn_dense + frac_moe * ffn_moe;
    const double head = linear_seconds(c, rows, (double)mc->vocab_size / tp, C, speed) / pp;
    e.gemm_s = passes * (L * gemm_layer + head);
    const double units = mb * (double)T / cp * (double)T * (hq / tp) * hd;
    e.attn_s = passes * L * units / attn_rate(c, T) / speed;
    /* floats moved per token per block, forward: two RMSNorms (read + write C each), two
     * residual adds (3 C), RoPE on q and k (read + write), SwiGLU (read 2 H, write H); backward
     * about twice that; norms and residuals over C / tp under sequence parallel */
    const double nc = l->sequence_parallel ? C / tp : C;
    const double hid = (1 - frac_moe) * hid_dense / tp + frac_moe * hid_moe / etp;
    const double fwd_floats = 2 * 2 * nc + 2 * 3 * nc + 2 * 2 * (hq + hkv) * hd / tp + 3 * hid;
    const double row_fwd = passes * L * rows * fwd_floats * 4.0 / c->row_bytes_per_s / speed;
    e.row_s = 3.0 * row_fwd;
    /* AC: the forward of the checkpointed blocks again (full: every block; selective k: every
     * k-th; op: the saved matmul and attention outputs are kept, the row kernels rerun) */
    double share = 0.0;
    if (!strcmp(l->ac_mode, "full")) share = 1.0;
    else if (!strcmp(l->ac_mode, "selective") && strcmp(l->ac_option, "op")) share = 1.0 / atof(l->ac_option);
    const double fwd_part = (e.gemm_s - passes * head) / 3.0 + e.attn_s / 3.5 + row_fwd;
    e.recompute_s = share * fwd_part;
    if (!strcmp(l->ac_mode, "selective") && !strcmp(l->ac_option, "op")) e.recompute_s = row_fwd;
    /* AdamW-like sweep: read p, g and two states, write p and the states */
    e.optim_s = (double)param_bytes * 7.0 / c->row_bytes_per_s / speed;
    e.total_s = e.gemm_s + e.attn_s + e.row_s + e.recompute_s + e.optim_s;
    return e;
}

/* Bubble of the schedule from the simulator's unit-cost timing (hp_pp_timing: F 1, B 2). */
static double bubble_fraction(const char *schedule, int pp, int n_micro) {
    hp_pp_kind_t kind;
    if (hp_pp_kind_from_name(schedule, &kind) != HP_OK) return -1;
    const int spr = hp_pp_kind_is_single_stage(kind) ? 1 : 2;
    hp_pp_schedule_t *s = NULL;
    if (hp_pp_generate(kind, pp, spr, n_micro, &s) != HP_OK) return -1;
    hp_pp_timing_t t;
    hp_status_t st = hp_pp_timing(s, pp * spr, &t);
    hp_pp_schedule_free(s);
    return st == HP_OK ? t.bubble_fraction : -1;
}

/* ---- the search --------------------------------------------------------------------------- */

void hp_plan_apply(hp_config_t *c, const hp_plan_layout_t *l) {
    c->parallelism.data_parallel_replicate_degree = l->dims.dp_replicate;
    c->parallelism.data_parallel_shard_degree = l->dims.dp_shard;
    c->parallelism.tensor_parallel_degree = l->dims.tp;
    c->parallelism.context_parallel_degree = l->dims.cp;
    c->parallelism.pipeline_parallel_degree = l->dims.pp;
    c->parallelism.expert_parallel_degree = l->dims.ep;
    c->parallelism.expert_tensor_parallel_degree = l->dims.etp;
    c->parallelism.enable_sequence_parallel = l->sequence_parallel;
    c->parallelism.zero_stage = l->zero_stage;
    if (l->dims.pp > 1) {
        snprintf(c->parallelism.pipeline_parallel_schedule, sizeof c->parallelism.pipeline_parallel_schedule, "%s",
                 l->schedule);
        c->parallelism.pipeline_parallel_microbatch_size = l->microbatch_size;
    }
    snprintf(c->activation_checkpoint.mode, sizeof c->activation_checkpoint.mode, "%s", l->ac_mode);
    snprintf(c->activation_checkpoint.selective_ac_option, sizeof c->activation_checkpoint.selective_ac_option, "%s",
             l->ac_option);
    c->training.local_batch_size = l->local_batch;
}

const char *hp_plan_overrides(const hp_plan_layout_t *l, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "--parallelism.data_parallel_replicate_degree=%d "
                                "--parallelism.data_parallel_shard_degree=%d --parallelism.tensor_parallel_degree=%d "
                                "--parallelism.context_parallel_degree=%d --parallelism.pipeline_parallel_degree=%d",
                                l->dims.dp_replicate, l->dims.dp_shard, l->dims.tp, l->dims.cp, l->dims.pp);
    if (o < n && l->dims.ep > 1)
        o += (size_t)snprintf(buf + o, n - o, " --parallelism.expert_parallel_degree=%d "
                              "--parallelism.expert_tensor_parallel_degree=%d", l->dims.ep, l->dims.etp);
    if (o < n && l->dims.tp > 1)
        o += (size_t)snprintf(buf + o, n - o, " --parallelism.enable_sequence_parallel=%s",
                              l->sequence_parallel ? "true" : "false");
    if (o < n && l->dims.pp > 1)
        o += (size_t)snprintf(buf + o, n - o, " --parallelism.pipeline_parallel_schedule=%s "
                              "--parallelism.pipeline_parallel_microbatch_size=%d", l->schedule, l->microbatch_size);
    if (o < n && l->zero_stage) o += (size_t)snprintf(buf + o, n - o, " --parallelism.zero_stage=1");
    if (o < n)
        o += (size_t)snprintf(buf + o, n - o, " --activation_checkpoint.mode=%s", l->ac_mode);
    if (o < n && !strcmp(l->ac_mode, "selective"))
        o += (size_t)snprintf(buf + o, n - o, " --activation_checkpoint.selective_ac_option=%s", l->ac_option);
    if (o < n) snprintf(buf + o, n - o, " --training.local_batch_size=%d", l->local_batch);
    return buf;
}

/* The memory plan's input for cfg with layout pd (trainer.c's plan_input without a trainer). */
static hp_status_t memory_plan(const hp_config_t *c, const hp_model_config_t *mc, const hp_parallel_dims_t *pd,
                               size_t base, hp_memory_plan_t *out) {
    hp_parallelize_options_t po;
    HP_TRY(hp_parallelize_options_from_config(c, &po));
    hp_tp_plan_entry_t plan[64];
    hp_memory_plan_input_t in;
    memset(&in, 0, sizeof in);
    in.model = mc;
    in.dims = *pd;
    if (pd->tp > 1) {
        const hp_model_spec_t *spec = hp_model_spec_find(mc->name);
        if (spec && spec->tp_plan) in.n_tp_plan = spec->tp_plan(mc, po.sequence_parallel, po.loss_parallel, plan, 64);
        in.tp_plan = plan;
    }
    const int B = (int)c->training.local_batch_size;
    const int vB = c->validation.local_batch_size > 0 ? (int)c->validation.local_batch_size : B;
    in.batch = B > vB ? B : vB;
    in.seq_len = (int)c->training.seq_len;
    in.ac = po.ac;
    in.fsdp = po.fsdp;
    in.pp = po.pp;
    in.optim_states = !strcmp(c->optimizer.name, "adamw") ? 2 : !strcmp(c->optimizer.name, "muon") ? 1
                      : c->optimizer.momentum != 0 ? 1 : 0;
    in.zero_stage = po.zero_stage;
    in.base_bytes = base;
    in.pp_rank = -1;
    return hp_memory_plan(&in, out);
}

static int divisors(int n, int *d) {
    int k = 0;
    for (int i = 1; i <= n; i++)
        if (n % i == 0) d[k++] = i;
    return k;
}

static int cmp_layout(const void *a, const void *b) {
    const hp_plan_layout_t *x = a, *y = b;
    if (x->step_s != y->step_s) return x->step_s < y->step_s ? -1 : 1;
    return x->mem.peak < y->mem.peak ? -1 : x->mem.peak > y->mem.peak;
}

/* Evaluates one candidate: the trainer's checks, the memory plan, the predicted step. */
static void consider(const hp_config_t *base, const hp_model_config_t *mc, const hp_plan_options_t *o,
                     hp_plan_layout_t *l, hp_plan_result_t *r, int *cap) {
    r->n_enumerated++;
    hp_config_t c = *base;
    hp_plan_apply(&c, l);
    hp_parallel_dims_t pd;
    int64_t accum = 0;
    const int vB = c.validation.local_batch_size > 0 ? (int)c.validation.local_batch_size : (int)c.training.local_batch_size;
    if (hp_parallel_dims_init(&pd, l->dims.dp_replicate, l->dims.dp_shard, l->dims.cp, l->dims.tp, l->dims.pp,
                              l->dims.ep, l->dims.etp, o->world) != HP_OK ||
        hp_parallel_config_check(&c, mc, &pd, (int)c.training.local_batch_size, vB) != HP_OK ||
        hp_config_grad_accum_steps(&c, hp_parallel_dims_dp(&pd), &accum) != HP_OK) {
        r->n_refused++;
        return;
    }
    l->dims = pd;
    l->grad_accum = (int)accum;
    if (pd.pp > 1) {   /* the schedule must exist for this many micro-batches (pp.c's rules) */
        const int n_micro = l->local_batch / l->microbatch_size;
        if (bubble_fraction(l->schedule, pd.pp, n_micro) < 0) {
            r->n_refused++;
            return;
        }
    }
    if (memory_plan(&c, mc, &pd, o->base_bytes, &l->mem) != HP_OK) {
        r->n_refused++;
        return;
    }
    if (r->smallest_peak <= 0 || (double)l->mem.peak < r->smallest_peak) {
        r->smallest_peak = (double)l->mem.peak;
        hp_plan_overrides(l, r->smallest_what, sizeof r->smallest_what);
    }
    if (o->memory_limit_bytes > 0 && (double)l->mem.peak > o->memory_limit_bytes) {
        r->n_over_memory++;
        return;
    }
    if (hp_plan_comm_predict(&c, mc, &pd, 0, o->calib, &l->comm) != HP_OK) {
        r->n_refused++;
        return;
    }
    const int per_host = o->ranks_per_host > 0 ? o->ranks_per_host : o->world;
    double speed = (double)o->calib->cores / ((double)per_host * o->calib->threads);
    if (speed > 1.0) speed = 1.0;
    const compute_est_t ce = compute_estimate(o->calib, mc, l, (int)c.training.seq_len, speed, l->mem.params);
    l->compute_s = ce.total_s;
    l->gemm_s = ce.gemm_s, l->attn_s = ce.attn_s, l->row_s = ce.row_s, l->recompute_s = ce.recompute_s;
    l->optim_s = ce.optim_s;
    /* exposed communication: blocking collectives in full; FSDP's and DDP's overlap with the
     * forward / backward compute (prefetched all-gathers, asynchronous reduce-scatters and DDP
     * buckets), except what does not fit under it and, at least, the first gather and the last
     * reduction (2 / units of it) */
    const double units = mc->n_layers + 2.0;
    const double ov = l->comm.overlappable_s;
    double hidden = ov - fmax(ov - ce.total_s, 2.0 * ov / units);
    if (hidden < 0) hidden = 0;
    l->exposed_comm_s = l->comm.blocking_s + ov - hidden;
    l->bubble_s = 0.0;
    if (pd.pp > 1) {
        const double bf = bubble_fraction(l->schedule, pd.pp, l->local_batch / l->microbatch_size);
        l->bubble_s = (ce.total_s - ce.optim_s + l->exposed_comm_s) * bf / (1.0 - bf);
    }
    l->step_s = l->compute_s + l->exposed_comm_s + l->bubble_s;
    const double tokens = (double)l->local_batch * (double)c.training.seq_len * (double)l->grad_accum *
                          (double)hp_parallel_dims_dp(&pd);
    l->tokens_per_s = tokens / l->step_s;
    if (r->n == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        hp_plan_layout_t *nl = realloc(r->layouts, sizeof *nl * (size_t)nc);
        if (!nl) return;
        r->layouts = nl;
        *cap = nc;
    }
    r->layouts[r->n++] = *l;
}

hp_status_t hp_plan_search(const hp_config_t *cfg, const hp_model_config_t *mc, const hp_plan_options_t *o,
                           hp_plan_result_t *out) {
    memset(out, 0, sizeof *out);
    if (!o || o->world < 1)
        return hp_error(HP_ERR_INVALID_ARG, "planner: world = %d ranks; expected >= 1 (hp-plan --world N)",
                        o ? o->world : 0);
    if (!o->calib)
        return hp_error(HP_ERR_INVALID_ARG, "planner: no calibration; hint: run `mpirun -np 8 hp-plan --calibrate` "
                        "once on this machine");
    const int N = o->world, B = (int)cfg->training.local_batch_size;
    /* the global batch every layout trains: the config's, else local x world (pure data parallel) */
    hp_config_t base = *cfg;
    if (base.training.global_batch_size <= 0) base.training.global_batch_size = (int64_t)B * N;
    static const char *const schedules[] = {"GPipe", "1F1B", "Interleaved1F1B"};
    static const char *const ac_modes[][2] = {{"none", "2"}, {"full", "2"}, {"selective", "2"}, {"selective", "op"}};
    int d[64], nd = divisors(N, d), bd[64], nbd = divisors(B, bd);
    int cap = 0;
    for (int ipp = 0; ipp < nd; ipp++)
    for (int itp = 0; itp < nd; itp++)
    for (int icp = 0; icp < nd; icp++)
    for (int ir = 0; ir < nd; ir++) {
        const int pp = d[ipp], tp = d[itp], cp = d[icp], rep = d[ir];
        if ((long)pp * tp * cp * rep > N || N % (pp * tp * cp * rep)) continue;
        const int shard = N / (pp * tp * cp * rep);
        int eps[64], neps = 1;
        eps[0] = 1;
        if (mc->moe_experts > 0) neps = divisors(shard * cp * tp, eps);
        for (int ie = 0; ie < neps; ie++)
        for (int etp_on = 0; etp_on <= (mc->moe_experts > 0 && tp > 1 && eps[ie] > 1); etp_on++)
        for (int sp = 0; sp <= (tp > 1); sp++)
        for (int is = 0; is < (pp > 1 ? 3 : 1); is++)
        for (int im = 0; im < (pp > 1 ? nbd : 1); im++)
        for (int z = 0; z <= (rep > 1 && shard * cp == 1 && pp == 1); z++)
        for (int ia = 0; ia < 4; ia++) {
            hp_plan_layout_t l;
            memset(&l, 0, sizeof l);
            l.dims = (hp_parallel_dims_t){rep, shard, cp, tp, pp, eps[ie], etp_on ? tp : 1, N};
            l.sequence_parallel = sp;
            if (pp > 1) {
                snprintf(l.schedule, sizeof l.schedule, "%s", schedules[is]);
                l.microbatch_size = bd[im];
            }
            snprintf(l.ac_mode, sizeof l.ac_mode, "%s", ac_modes[ia][0]);
            snprintf(l.ac_option, sizeof l.ac_option, "%s", ac_modes[ia][1]);
            l.zero_stage = z;
            l.local_batch = B;
            consider(&base, mc, o, &l, out, &cap);
        }
    }
    if (out->n > 1) qsort(out->layouts, (size_t)out->n, sizeof *out->layouts, cmp_layout);
    return HP_OK;
}

void hp_plan_result_free(hp_plan_result_t *r) {
    if (!r) return;
    free(r->layouts);
    memset(r, 0, sizeof *r);
}
