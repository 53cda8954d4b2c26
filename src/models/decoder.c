/* The Llama-style decoder the families in src/models/ are built from, parameterised by config
 * fields: the model-args presets of their flavors, the architecture (each unit's parameters:
 * names, shapes, TorchTitan init rules, stacking; and its module tree: embedding -> blocks
 * (attention_norm, attention [wq|wk|wv, qk-norm, RoPE, core, wo] or MLA, ffn_norm,
 * feed_forward [w1|w3, SwiGLU, w2] or MoE) -> head (norm, output)) and TorchTitan's llama3
 * tensor-parallel plan over those module names. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "models/models-impl.h"

/* ---- model args presets ------------------------------------------------------------------- */

/* The sizes every flavor names (the rest zero). */
static void sizes(hp_model_config_t *c, const char *flavor, int dim, int layers, int heads, int kv, int vocab) {
    memset(c, 0, sizeof(*c));
    snprintf(c->flavor, sizeof(c->flavor), "%s", flavor);
    c->dim = dim;
    c->n_layers = layers;
    c->n_heads = heads;
    c->n_kv_heads = kv;
    c->vocab_size = vocab;
}

void decoder_llama_args(hp_model_config_t *c, const char *flavor, int dim, int layers, int heads, int kv,
                        int multiple_of, float mult, int vocab) {
    sizes(c, flavor, dim, layers, heads, kv, vocab);
    c->multiple_of = multiple_of;
    c->ffn_dim_multiplier = mult;
    c->norm_eps = 1e-5f;
    c->rope_theta = 500000.0f;
    c->rope_scaling = 1;   // TorchTitan RoPE scaling="llama": factor 8, low 1, high 4, orig 8192
    c->rope_factor = 8.0f;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_original_max_pos = 8192;
    c->max_seq_len = 131072;
}

void decoder_qwen_args(hp_model_config_t *c, const char *flavor, int dim, int layers, int heads, int kv,
                       int head_dim, int hidden, int vocab) {
    sizes(c, flavor, dim, layers, heads, kv, vocab);
    c->head_dim = head_dim;
    c->hidden_dim = hidden;
    c->norm_eps = 1e-6f;
    c->rope_theta = 1000000.0f;
    c->qk_norm = 1;
    c->tie_embeddings = 1;
    c->max_seq_len = 4096;
}

/* The MoE sizes and routing of a flavor (TorchTitan MoEArgs; docs/moe.md). */
void decoder_moe_args(hp_model_config_t *c, int E, int K, int F, int shared, int score_fn, int norm, float scale,
                      int groups, int limited, int dense) {
    c->moe_experts = E;
    c->moe_top_k = K;
    c->moe_hidden = F;
    c->moe_shared_experts = shared;
    c->moe_score_fn = score_fn;
    c->moe_route_norm = norm;
    c->moe_route_scale = scale;
    c->moe_expert_groups = groups;
    c->moe_limited_groups = limited;
    c->moe_n_dense_layers = dense;
    c->moe_load_balance_coeff = 1e-3f;   // TorchTitan's default
}

/* MLA sizes and YaRN (TorchTitan deepseek_v3 DeepSeekV3ModelArgs). */
void decoder_mla_args(hp_model_config_t *c, int q_lora, int kv_lora, int nope, int rope, int v, float mscale) {
    c->mla = 1;
    c->q_lora_rank = q_lora;
    c->kv_lora_rank = kv_lora;
    c->qk_nope_head_dim = nope;
    c->qk_rope_head_dim = rope;
    c->v_head_dim = v;
    c->mla_mscale = mscale;
    c->rope_theta = 10000.0f;
    c->rope_factor = 40.0f;
    c->rope_beta_fast = 32.0f;
    c->rope_beta_slow = 1.0f;
    c->rope_original_max_pos = 4096;
    c->max_seq_len = 16384;
    c->head_dim = 0;   // derived: the core's head width
}

/* ---- the architecture --------------------------------------------------------------------- */

static int decoder_n_units(const hp_model_config_t *c) { return c->n_layers + 2; }

static int decoder_unit_kind(const hp_model_config_t *c, int u) {
    return u == 0 ? HP_MODEL_UNIT_EMBEDDING : u <= c->n_layers ? HP_MODEL_UNIT_BLOCK : HP_MODEL_UNIT_HEAD;
}

static hp_param_decl_t *decl(hp_param_decl_t *d, int *n, const char *name, int ndim, int64_t d0, int64_t d1,
                             int group) {
    hp_param_decl_t *p = &d[(*n)++];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->group = group;
    p->init = HP_PARAM_INIT_RNG;
    p->rng = (hp_rng_spec_t){HP_RNG_TRUNC_NORMAL, 0.0f, 0.02f, -2.0f, 2.0f};   // torch defaults a=-2, b=2
    return p;
}

static void init_ones(hp_param_decl_t *p) { p->init = HP_PARAM_INIT_ONES; }
/* TorchTitan's output projection: trunc_normal(std = dim^-0.5) cut at +-3 std. */
static void init_output(hp_param_decl_t *p, int dim) {
    const float s = 1.0f / sqrtf((float)dim);
    p->rng = (hp_rng_spec_t){HP_RNG_TRUNC_NORMAL, 0.0f, s, -3.0f * s, 3.0f * s};
}

/* LoRA target i's (in, out) in block l, and its weight's FQN prefix ("layers.l.attention.wq"). */
static void lora_target(const hp_model_config_t *c, int l, int i, int64_t *in, int64_t *out, char *nm, size_t cap) {
    const int64_t dm = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim,
                  hid = c->hidden_dim;
    const int64_t io[HP_LORA_N_TARGETS][2] = {{dm, qd}, {dm, kd}, {dm, kd}, {qd, dm}, {dm, hid}, {hid, dm}, {dm, hid}};
    *in = io[i][0];
    *out = io[i][1];
    snprintf(nm, cap, "layers.%d.%s.%s", l, i < 4 ? "attention" : "feed_forward", hp_lora_target_name(i));
}

/* The adapters of block l after its own parameters, in target order (wq wk wv wo w1 w2 w3):
 * lora_a (r, in) Kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)) (PEFT's
 * reset_lora_parameters), lora_b (out, r) zeros; drawn by name like every parameter. */
static int declare_lora(const hp_model_config_t *c, int l, hp_param_decl_t *d, int n) {
    for (int i = 0; c->lora_rank > 0 && i < HP_LORA_N_TARGETS; i++) {
        if (!(c->lora_targets & (1 << i))) continue;
        int64_t in, out;
        char base[HP_PARAM_NAME_MAX - 16], nm[HP_PARAM_NAME_MAX];   // "....lora_a.weight" fits
        lora_target(c, l, i, &in, &out, base, sizeof base);
        snprintf(nm, sizeof nm, "%s.lora_a.weight", base);
        const float b = 1.0f / sqrtf((float)in);
        decl(d, &n, nm, 2, c->lora_rank, in, 0)->rng = (hp_rng_spec_t){HP_RNG_UNIFORM, -b, b, 0.0f, 0.0f};
        snprintf(nm, sizeof nm, "%s.lora_b.weight", base);
        decl(d, &n, nm, 2, out, c->lora_rank, 0)->init = HP_PARAM_INIT_ZEROS;
    }
    return n;
}

static int decoder_declare(const hp_model_config_t *c, int u, int has_embedding, hp_param_decl_t *d) {
    const int64_t dm = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kd = (int64_t)c->n_kv_heads * c->head_dim,
                  hid = c->hidden_dim, V = c->vocab_size;
    int n = 0;
    char nm[HP_PARAM_NAME_MAX];
    switch (decoder_unit_kind(c, u)) {
    case HP_MODEL_UNIT_EMBEDDING: {
        hp_param_decl_t *e = decl(d, &n, "tok_embeddings.weight", 2, V, dm, 0);
        if (c->tie_embeddings) init_output(e, c->dim);   // the shared tensor is initialised as the output
        else e->rng = (hp_rng_spec_t){HP_RNG_NORMAL, 0.0f, 1.0f, 0.0f, 0.0f};
        break;
    }
    case HP_MODEL_UNIT_BLOCK: {
        const int l = u - 1;
        const float depth = 0.02f / sqrtf(2.0f * (float)(l + 1));   // TorchTitan depth init
#define L(suffix) (snprintf(nm, sizeof(nm), "layers.%d.%s", l, suffix), nm)
        if (c->mla) {   // TorchTitan deepseek_v3 Attention: linears std 0.02, wo depth-scaled, norms ones
            const int64_t H = c->n_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim, ql = c->q_lora_rank,
                          kvl = c->kv_lora_rank;
            if (ql) {
                decl(d, &n, L("attention.wq_a.weight"), 2, ql, dm, 0);
                init_ones(decl(d, &n, L("attention.q_norm.weight"), 1, ql, 0, 0));
                decl(d, &n, L("attention.wq_b.weight"), 2, H * qk, ql, 0);
            } else {
                decl(d, &n, L("attention.wq.weight"), 2, H * qk, dm, 0);
            }
            decl(d, &n, L("attention.wkv_a.weight"), 2, kvl + c->qk_rope_head_dim, dm, 0);
            init_ones(decl(d, &n, L("attention.kv_norm.weight"), 1, kvl, 0, 0));
            decl(d, &n, L("attention.wkv_b.weight"), 2, H * (c->qk_nope_head_dim + c->v_head_dim), kvl, 0);
            decl(d, &n, L("attention.wo.weight"), 2, dm, H * c->v_head_dim, 0)->rng.p1 = depth;
        } else {
        decl(d, &n, L("attention.wq.weight"), 2, qd, dm, 1);
        decl(d, &n, L("attention.wk.weight"), 2, kd, dm, 1);
        decl(d, &n, L("attention.wv.weight"), 2, kd, dm, 1);
        decl(d, &n, L("attention.wo.weight"), 2, dm, qd, 0)->rng.p1 = depth;
        if (c->qk_norm) {
            init_ones(decl(d, &n, L("attention.q_norm.weight"), 1, c->head_dim, 0, 0));
            init_ones(decl(d, &n, L("attention.k_norm.weight"), 1, c->head_dim, 0, 0));
        }
        }
        init_ones(decl(d, &n, L("attention_norm.weight"), 1, dm, 0, 0));
        if (hp_model_layer_is_moe(c, l)) {   // an MoE layer: routed experts, router, shared experts
            // TorchTitan MoE.init_weights: experts w1 std 0.02, w2/w3 and the gate depth-scaled
            const int64_t E = c->moe_experts, F = c->moe_hidden, Fs = F * c->moe_shared_experts;
            hp_param_decl_t *p = decl(d, &n, L("moe.experts.w1"), 3, E, F, 0);
            p->shape[2] = dm;
            p = decl(d, &n, L("moe.experts.w2"), 3, E, dm, 0);
            p->shape[2] = F;
            p->rng.p1 = depth;
            p = decl(d, &n, L("moe.experts.w3"), 3, E, F, 0);
            p->shape[2] = dm;
            p->rng.p1 = depth;
            decl(d, &n, L("moe.router.gate.weight"), 2, E, dm, 0)->rng.p1 = depth;
            if (Fs > 0) {
                decl(d, &n, L("moe.shared_experts.w1.weight"), 2, Fs, dm, 0);
                decl(d, &n, L("moe.shared_experts.w2.weight"), 2, dm, Fs, 0)->rng.p1 = depth;
                decl(d, &n, L("moe.shared_experts.w3.weight"), 2, Fs, dm, 0)->rng.p1 = depth;
            }
            init_ones(decl(d, &n, L("ffn_norm.weight"), 1, dm, 0, 0));
            break;
        }
        decl(d, &n, L("feed_forward.w1.weight"), 2, hid, dm, 2);
        decl(d, &n, L("feed_forward.w2.weight"), 2, dm, hid, 0)->rng.p1 = depth;
        decl(d, &n, L("feed_forward.w3.weight"), 2, hid, dm, 2)->rng.p1 = depth;
        init_ones(decl(d, &n, L("ffn_norm.weight"), 1, dm, 0, 0));
#undef L
        n = declare_lora(c, l, d, n);
        break;
    }
    default:
        init_ones(decl(d, &n, "norm.weight", 1, dm, 0, 0));
        if (!c->tie_embeddings) init_output(decl(d, &n, "output.weight", 2, V, dm, 0), c->dim);
        else if (!has_embedding) init_output(decl(d, &n, "tok_embeddings.weight", 2, V, dm, 0), c->dim);
        break;
    }
    for (int i = 0; c->lora_rank > 0 && i < n; i++)   // LoRA: everything but the adapters is frozen (PEFT)
        d[i].frozen = !strstr(d[i].name, ".lora_");
    return n;
}

static hp_module_t *new_linear(hp_model_t m, const char *name, hp_param_t **w, int n, int in, int out, int acc_out) {
    hp_module_t *mod = hp_model_module_new(m, sizeof(hp_linear_impl_t));
    if (!mod) return NULL;
    hp_linear_impl_t *L = mod->impl;
    hp_linear_module_init(mod, L, name, w, n, NULL, in, out);
    L->accumulate_output = acc_out;
    return mod;
}

static hp_module_t *new_rmsnorm(hp_model_t m, const char *name, hp_param_t *w, int dim, float eps, int acc) {
    hp_module_t *mod = hp_model_module_new(m, sizeof(hp_rmsnorm_impl_t));
    if (!mod) return NULL;
    hp_rmsnorm_impl_t *R = mod->impl;
    hp_rmsnorm_module_init(mod, R, name, w, dim, eps);
    R->accumulate_input_grad = acc;
    return mod;
}

/* MLA attention of block l over its params P (declared order). */
static hp_status_t build_mla(hp_model_t m, int l, hp_param_t **P, hp_module_t **out) {
    const hp_model_config_t *c = hp_model_config(m);
    const int d = c->dim, H = c->n_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim, ql = c->q_lora_rank,
              kvl = c->kv_lora_rank;
    char nm[HP_PARAM_NAME_MAX];
#define N(suffix) (snprintf(nm, sizeof(nm), "layers.%d.attention.%s", l, suffix), nm)
    hp_module_t *kids[7];
    int n = 0, p = 0;
    if (ql) {
        kids[n++] = new_linear(m, N("wq_a"), &P[p++], 1, d, ql, 0);
        kids[n++] = new_rmsnorm(m, N("q_norm"), P[p++], ql, hp_model_mla_norm_eps(c), 0);
        kids[n++] = new_linear(m, N("wq_b"), &P[p++], 1, ql, H * qk, 0);
    } else {
        kids[n++] = new_linear(m, N("wq"), &P[p++], 1, d, H * qk, 0);
    }
    kids[n++] = new_linear(m, N("wkv_a"), &P[p++], 1, d, kvl + c->qk_rope_head_dim, 0);
    kids[n++] = new_rmsnorm(m, N("kv_norm"), P[p++], kvl, hp_model_mla_norm_eps(c), 0);
    kids[n++] = new_linear(m, N("wkv_b"), &P[p++], 1, kvl, H * (c->qk_nope_head_dim + c->v_head_dim), 0);
    kids[n++] = new_linear(m, N("wo"), &P[p++], 1, H * c->v_head_dim, d, 1);
    for (int i = 0; i < n; i++)
        if (!kids[i]) return HP_ERR_OOM;
    ((hp_linear_impl_t *)kids[ql ? 3 : 1]->impl)->accumulate_input_grad = 1;   // wkv_a adds to the q path's din
#undef N
    snprintf(nm, sizeof(nm), "layers.%d.attention", l);
    const float *cos_t, *sin_t;
    hp_model_rope_tables(m, &cos_t, &sin_t);
    hp_mla_cfg_t mc = {d, H, l, ql, kvl, c->qk_nope_head_dim, c->qk_rope_head_dim, c->v_head_dim, c->head_dim,
                       (float)hp_model_mla_softmax_scale(c), cos_t, sin_t};
    return hp_mla_new(m, nm, &mc, kids, n, out);
}

/* Replaces linear `mod`, a child of `parent`, by a LoRA module holding it when any of its
 * members (LoRA targets t[0 .. n)) is targeted (TorchTitan's converter swaps the module in
 * place); LA: the block's adapters, (lora_a, lora_b) per target in target order. */
static hp_status_t lora_wrap(hp_model_t m, const hp_model_config_t *c, hp_module_t *parent, hp_module_t *mod,
                             const int *t, int n, hp_param_t **LA) {
    if (c->lora_rank <= 0) return HP_OK;
    hp_param_t *A[4] = {NULL, NULL, NULL, NULL}, *B[4] = {NULL, NULL, NULL, NULL};
    int any = 0;
    for (int i = 0; i < n; i++) {
        if (!(c->lora_targets & (1 << t[i]))) continue;
        const int at = 2 * __builtin_popcount((unsigned)c->lora_targets & ((1u << t[i]) - 1u));
        A[i] = LA[at];
        B[i] = LA[at + 1];
        any = 1;
    }
    if (!any) return HP_OK;
    hp_module_t *w;
    HP_TRY(hp_lora_new(m, mod, A, B, c->lora_rank, c->lora_alpha, &w));
    return hp_module_replace_child(parent, mod, w);
}

static hp_status_t decoder_build(hp_model_t m, int u, hp_param_t **P, int np, hp_module_t **out,
                                 hp_rope_style_t style) {
    const hp_model_config_t *c = hp_model_config(m);
    const int d = c->dim, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, hid = c->hidden_dim;
    char nm[HP_PARAM_NAME_MAX];
    switch (decoder_unit_kind(c, u)) {
    case HP_MODEL_UNIT_EMBEDDING: {
        hp_module_t *e = hp_model_module_new(m, sizeof(hp_embedding_impl_t));
        if (!e) return HP_ERR_OOM;
        hp_embedding_module_init(e, e->impl, "tok_embeddings", P[0], c->vocab_size, d);
        *out = e;
        return HP_OK;
    }
    case HP_MODEL_UNIT_BLOCK: {
        const int l = u - 1;
        const int na = c->lora_rank > 0 ? 2 * __builtin_popcount((unsigned)c->lora_targets) : 0;
        np -= na;   // the adapters follow the block's own parameters (declare_lora)
        hp_param_t **LA = P + np;
        int k = c->mla ? (c->q_lora_rank ? 7 : 5) : 4 + (c->qk_norm ? 2 : 0);
        hp_param_t *qkv[3] = {P[0], P[1], P[2]}, *wo = P[3];
        hp_param_t *qn = NULL, *kn = NULL;
        if (c->qk_norm) { qn = P[4]; kn = P[5]; }
        const int moe = hp_model_layer_is_moe(c, l);
        hp_param_t *an = P[k], *w13[2] = {P[k + 1], P[k + 3]}, *w2 = P[k + 2], *fn = P[np - 1];
        HP_ASSERT(moe ? k + 6 + (c->moe_shared_experts ? 3 : 0) == np : k + 5 == np);
#define N(suffix) (snprintf(nm, sizeof(nm), "layers.%d%s", l, suffix), nm)
        hp_module_t *attention_norm = new_rmsnorm(m, N(".attention_norm"), an, d, c->norm_eps, 1);
        if (!attention_norm) return HP_ERR_OOM;
        hp_module_t *attention, *ffn, *block;
        if (c->mla) {
            HP_TRY(build_mla(m, l, P, &attention));
        } else {
            hp_module_t *wqkv = new_linear(m, N(".attention.wqkv"), qkv, 3, d, (H + 2 * KV) * hd, 0);
            hp_module_t *wom = new_linear(m, N(".attention.wo"), &wo, 1, H * hd, d, 1);
            if (!wqkv || !wom) return HP_ERR_OOM;
            const float *cos_t, *sin_t;
            hp_model_rope_tables(m, &cos_t, &sin_t);
            hp_attention_cfg_t ac = {d, H, KV, hd, l, c->qk_norm, c->norm_eps, style, cos_t, sin_t};
            HP_TRY(hp_attention_new(m, N(".attention"), &ac, wqkv, wom, qn, kn, &attention));
            static const int qkv_t[3] = {0, 1, 2}, o_t[1] = {3};
            HP_TRY(lora_wrap(m, c, attention, wqkv, qkv_t, 3, LA));
            HP_TRY(lora_wrap(m, c, attention, wom, o_t, 1, LA));
        }
        hp_module_t *ffn_norm = new_rmsnorm(m, N(".ffn_norm"), fn, d, c->norm_eps, 1);
        if (!ffn_norm) return HP_ERR_OOM;
        if (moe) {   // the MoE feed-forward in the block's feed-forward slot
            hp_moe_config_t mc;
            hp_model_moe_config(c, &mc);
            const size_t E = (size_t)mc.n_experts;
            // impl, then expert_bias (E) and tokens_per_expert (E) in the module's zeroed storage
            hp_module_t *mm = hp_model_module_new(m, sizeof(hp_moe_impl_t) + 2 * E * sizeof(float));
            if (!mm) return HP_ERR_OOM;
            float *buf = (float *)((char *)mm->impl + sizeof(hp_moe_impl_t));
            hp_param_t *mp[7] = {P[k + 4], P[k + 1], P[k + 2], P[k + 3], NULL, NULL, NULL};
            const int nmp = mc.n_shared_experts ? 7 : 4;
            if (nmp == 7) { mp[4] = P[k + 5]; mp[5] = P[k + 6]; mp[6] = P[k + 7]; }
            HP_TRY(hp_moe_module_init(mm, mm->impl, N(".moe"), &mc, mp, nmp, buf, buf + E));
            HP_TRY(hp_block_new(m, N(""), d, attention_norm, attention, ffn_norm, mm, &block));
            *out = block;
            return HP_OK;
        }
        hp_module_t *w13m = new_linear(m, N(".feed_forward.w13"), w13, 2, d, 2 * hid, 0);
        hp_module_t *w2m = new_linear(m, N(".feed_forward.w2"), &w2, 1, hid, d, 1);
        if (!w13m || !w2m) return HP_ERR_OOM;
        HP_TRY(hp_feed_forward_new(m, N(".feed_forward"), d, hid, w13m, w2m, &ffn));
        static const int w13_t[2] = {4, 6}, w2_t[1] = {5};
        HP_TRY(lora_wrap(m, c, ffn, w13m, w13_t, 2, LA));
        HP_TRY(lora_wrap(m, c, ffn, w2m, w2_t, 1, LA));
        HP_TRY(hp_block_new(m, N(""), d, attention_norm, attention, ffn_norm, ffn, &block));
#undef N
        *out = block;
        return HP_OK;
    }
    default: {
        hp_module_t *norm = new_rmsnorm(m, "norm", P[0], d, c->norm_eps, 0);
        hp_param_t *ow = c->tie_embeddings ? hp_model_find_param(m, "tok_embeddings.weight") : P[1];
        HP_ASSERT(ow != NULL);
        hp_module_t *output = new_linear(m, "output", &ow, 1, d, c->vocab_size, 0);
        if (!norm || !output) return HP_ERR_OOM;
        ((hp_linear_impl_t *)output->impl)->prof_op = HP_NN_OP_OUTPUT_FWD;
        return hp_head_new(m, "", d, norm, output, out);
    }
    }
}


static hp_status_t build_interleaved(hp_model_t m, int u, hp_param_t **P, int np, hp_module_t **out) {
    return decoder_build(m, u, P, np, out, HP_ROPE_INTERLEAVED);   // pairs (2i, 2i+1)
}
static hp_status_t build_half(hp_model_t m, int u, hp_param_t **P, int np, hp_module_t **out) {
    return decoder_build(m, u, P, np, out, HP_ROPE_HALF);   // rotate_half
}
const hp_model_arch_t decoder_arch_interleaved = {decoder_n_units, decoder_unit_kind, decoder_declare,
                                                  build_interleaved};
const hp_model_arch_t decoder_arch_half = {decoder_n_units, decoder_unit_kind, decoder_declare, build_half};

/* ---- tensor parallel ------------------------------------------------------------------------ */

int decoder_tp_plan(const hp_model_config_t *c, int sp, int loss_parallel, hp_tp_plan_entry_t *plan, int cap) {
    // torchtitan apply_tp (llama3): rowwise embedding, colwise output, per block prepare
    // inputs, colwise wq/wk/wv/w1/w3, rowwise wo/w2; with SP the norms are SequenceParallel
    // and the residual stream is Shard(1)
    hp_placement_t seq = sp ? hp_shard(1) : hp_replicate(), R = hp_replicate();
    int n = 0;
    n = hp_tp_plan_add(plan, cap, n, "tok_embeddings", hp_tp_with_output(hp_tp_with_input(hp_tp_rowwise(), R), seq, 1));
    if (sp) n = hp_tp_plan_add(plan, cap, n, "norm", hp_tp_sequence_parallel());
    n = hp_tp_plan_add(plan, cap, n, "output",
                       hp_tp_with_output(hp_tp_with_input(hp_tp_colwise(), seq), loss_parallel ? hp_shard(-1) : R,
                                         !loss_parallel));
    if (sp) n = hp_tp_plan_add(plan, cap, n, "layers.*.attention_norm", hp_tp_sequence_parallel());
    n = hp_tp_plan_add(plan, cap, n, "layers.*.attention", hp_tp_prepare_input(seq, R));
    n = hp_tp_plan_add(plan, cap, n, "layers.*.attention.wq", hp_tp_colwise());
    n = hp_tp_plan_add(plan, cap, n, "layers.*.attention.wk", hp_tp_colwise());
    n = hp_tp_plan_add(plan, cap, n, "layers.*.attention.wv", hp_tp_colwise());
    n = hp_tp_plan_add(plan, cap, n, "layers.*.attention.wo", hp_tp_with_output(hp_tp_rowwise(), seq, 1));
    if (sp) n = hp_tp_plan_add(plan, cap, n, "layers.*.ffn_norm", hp_tp_sequence_parallel());
    n = hp_tp_plan_add(plan, cap, n, "layers.*.feed_forward", hp_tp_prepare_input(seq, R));
    n = hp_tp_plan_add(plan, cap, n, "layers.*.feed_forward.w1", hp_tp_colwise());
    n = hp_tp_plan_add(plan, cap, n, "layers.*.feed_forward.w2", hp_tp_with_output(hp_tp_rowwise(), seq, 1));
    n = hp_tp_plan_add(plan, cap, n, "layers.*.feed_forward.w3", hp_tp_colwise());
    return n;
}
