// The MoE model flavors (deepseek_v3, qwen3_moe; src/models/): parameter counts of the
// real-size flavors (total and active, Qwen3-30B-A3B's published 30.5B / 3.3B), the declared
// parameters (3-D stacked experts, TorchTitan names), a one-expert top-1 softmax MoE equal to
// the dense model with the same weights (logits and gradients), tokens_per_expert counting
// every (token, choice) once, training on one rank (the loss falls), bad configs named.
// hp-test: ranks 1 timeout 120
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/checkpoint.h"
#include "hp_test.h"

static void small(hp_model_config_t *c) {
    c->dim = 48;
    c->n_layers = 3;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 12;
    c->hidden_dim = 64;
    c->moe_hidden = 24;
    c->vocab_size = 97;
    c->max_seq_len = 16;
    c->kv_lora_rank = 16;   // deepseek_v3's MLA (the GQA models ignore these)
    c->qk_nope_head_dim = 8;
    c->qk_rope_head_dim = 4;
    c->v_head_dim = 12;
}

static void tokens(int32_t *t, int32_t *y, int n, int V, uint32_t s) {
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        t[i] = (int32_t)((s >> 8) % (uint32_t)V);
    }
    for (int i = 0; i < n; i++) y[i] = t[(i + 1) % n];
}

static double max_rel(const float *a, const float *b, size_t n) {
    double w = 0, s = 0;
    for (size_t i = 0; i < n; i++) s = fmax(s, fabs(b[i]));
    for (size_t i = 0; i < n; i++) w = fmax(w, fabs(a[i] - b[i]) / (s > 0 ? s : 1));
    return w;
}

int main(void) {
    hp_model_config_t c;
    // 1. real-size counts: Qwen3-30B-A3B is published as 30.5B total, 3.3B active
    HP_CHECK_OK(hp_model_flavor("qwen3_moe", "30B-A3B", &c));
    int64_t tot = hp_model_param_count(&c, 0), act = hp_model_active_param_count(&c, 0);
    HP_CHECK(tot > 30.4e9 && tot < 30.6e9 && act > 3.3e9 && act < 3.4e9, "qwen3_moe 30B-A3B: %lld total, %lld active",
             (long long)tot, (long long)act);
    HP_CHECK(fabs(hp_model_flops_per_token(&c, 0) - 6.0 * (double)hp_model_active_param_count(&c, 1)) < 1.0,
             "FLOPs/token must use the active parameters");
    HP_CHECK_OK(hp_model_flavor("deepseek_v3", "671B", &c));
    tot = hp_model_param_count(&c, 0);
    act = hp_model_active_param_count(&c, 0);
    // DeepSeek-V3: 671B / 37B with MLA; this GQA attention adds ~1.6B per token path
    HP_CHECK(tot > 660e9 && tot < 680e9 && act > 35e9 && act < 40e9, "deepseek_v3 671B: %lld total, %lld active",
             (long long)tot, (long long)act);
    printf("qwen3_moe 30B-A3B and deepseek_v3 671B counts checked (deepseek: %.1fB total, %.1fB active)\n",
           tot / 1e9, act / 1e9);

    // 2. declared parameters of the debug model
    HP_CHECK_OK(hp_model_flavor("deepseek_v3", "debugmodel", &c));
    small(&c);
    HP_CHECK_OK(hp_model_config_validate(&c));
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&c, 2, 16, &m));
    if (!m) return hp_test_finish("test_model_moe");
    hp_param_t *w1 = hp_model_find_param(m, "layers.1.moe.experts.w1");
    hp_param_t *w2 = hp_model_find_param(m, "layers.2.moe.experts.w2");
    HP_CHECK(w1 && w1->value.local.ndim == 3 && w1->value.local.shape[0] == 8 && w1->value.local.shape[1] == 24 &&
             w1->value.local.shape[2] == 48, "layers.1.moe.experts.w1 must be (8, 24, 48)");
    HP_CHECK(w2 && w2->value.local.shape[1] == 48 && w2->value.local.shape[2] == 24, "w2 must be (E, D, F)");
    HP_CHECK(hp_model_find_param(m, "layers.0.feed_forward.w1.weight") != NULL &&
             hp_model_find_param(m, "layers.0.moe.experts.w1") == NULL, "layer 0 must stay dense");
    HP_CHECK(hp_model_find_param(m, "layers.1.moe.shared_experts.w2.weight") != NULL &&
             hp_model_find_param(m, "layers.1.moe.router.gate.weight") != NULL, "shared experts and gate");
    int64_t n = 0;
    for (int i = 0; i < hp_model_num_params(m); i++) n += hp_tensor_numel(&hp_model_params(m)[i].value.local);
    HP_CHECK(n == hp_model_param_count(&c, 0), "allocated %lld params, counted %lld", (long long)n,
             (long long)hp_model_param_count(&c, 0));
    HP_CHECK_OK(hp_model_init_weights(m, 7));

    // 3. training on one rank: plain SGD on one batch, the loss must fall
    enum { B = 2, T = 16 };
    int32_t tk[B * T], tg[B * T];
    tokens(tk, tg, B * T, c.vocab_size, 3);
    float loss0 = 0, loss = 0;
    for (int step = 0; step < 25; step++) {
        HP_CHECK_OK(hp_model_zero_grad(m));
        HP_CHECK_OK(hp_model_forward(m, tk, tg, B, T, (float)(B * T), &loss));
        HP_CHECK_OK(hp_model_backward(m));
        if (step == 0) loss0 = loss;
        for (int i = 0; i < hp_model_num_params(m); i++) {
            hp_param_t *p = &hp_model_params(m)[i];
            float *v = hp_param_w(p), *g = hp_param_g(p);
            for (int64_t j = 0; j < hp_tensor_numel(&p->value.local); j++) v[j] -= 0.5f * g[j];
        }
    }
    hp_module_t *mods[256];
    int nm_ = hp_model_modules(m, mods, 256), n_moe = 0;
    for (int i = 0; i < nm_; i++) {
        if (!hp_module_is_moe(mods[i])) continue;
        const hp_moe_impl_t *M = mods[i]->impl;
        double s = 0;
        for (int e = 0; e < M->c.n_experts; e++) s += M->tokens_per_expert[e];
        HP_CHECK(s == 25.0 * B * T * c.moe_top_k, "%s: tokens_per_expert sums to %.0f, expected %d", mods[i]->name, s,
                 25 * B * T * c.moe_top_k);
        n_moe++;
    }
    HP_CHECK(n_moe == c.n_layers - c.moe_n_dense_layers, "%d MoE modules, expected %d", n_moe,
             c.n_layers - c.moe_n_dense_layers);
    printf("deepseek_v3 (small): loss %.4f -> %.4f in 25 SGD steps\n", loss0, loss);
    HP_CHECK(isfinite(loss) && loss < 0.7f * loss0, "the MoE model did not train: %.4f -> %.4f", loss0, loss);
    hp_model_destroy(m);

    // 4. one expert, top-1, softmax (gate exactly 1), no shared experts == the dense model with
    //    the same weights: f32 GEMMs of other shapes (w1 and w3 apart instead of stacked) may
    //    round differently, ~1e-6 relative per layer, so 1e-5 relative to the largest value
    hp_model_config_t cm, cd;
    HP_CHECK_OK(hp_model_flavor("qwen3_moe", "debugmodel", &cm));
    small(&cm);
    cm.moe_experts = 1;
    cm.moe_top_k = 1;
    cm.moe_shared_experts = 0;
    cm.moe_route_norm = 0;
    cm.moe_n_dense_layers = 1;
    HP_CHECK_OK(hp_model_config_validate(&cm));
    cd = cm;
    snprintf(cd.name, sizeof cd.name, "qwen3");
    cd.moe_experts = 0;
    cd.hidden_dim = cm.moe_hidden;
    cm.hidden_dim = cm.moe_hidden;
    HP_CHECK_OK(hp_model_config_validate(&cd));
    hp_model_t mm = NULL, md = NULL;
    HP_CHECK_OK(hp_model_create(&cm, B, T, &mm));
    HP_CHECK_OK(hp_model_create(&cd, B, T, &md));
    if (!mm || !md) return hp_test_finish("test_model_moe");
    HP_CHECK_OK(hp_model_init_weights(md, 5));
    HP_CHECK_OK(hp_model_init_weights(mm, 6));
    char nm[128];
    for (int i = 0; i < hp_model_num_params(md); i++) {   // the dense weights into the MoE model
        hp_param_t *pd = &hp_model_params(md)[i];
        const char *s = strstr(pd->name, "feed_forward.");
        int layer = atoi(pd->name + 7);
        hp_param_t *pm;
        if (s && layer >= 1) {
            snprintf(nm, sizeof nm, "layers.%d.moe.experts.%.2s", layer, s + 13);
            pm = hp_model_find_param(mm, nm);
        } else {
            pm = hp_model_find_param(mm, pd->name);
        }
        HP_CHECK(pm && hp_tensor_numel(&pm->value.local) == hp_tensor_numel(&pd->value.local), "no match for %s",
                 pd->name);
        if (pm) memcpy(hp_param_w(pm), hp_param_w(pd), sizeof(float) * (size_t)hp_tensor_numel(&pd->value.local));
    }
    float lm = 0, ld = 0;
    HP_CHECK_OK(hp_model_zero_grad(mm));
    HP_CHECK_OK(hp_model_zero_grad(md));
    HP_CHECK_OK(hp_model_forward(mm, tk, tg, B, T, (float)(B * T), &lm));
    HP_CHECK_OK(hp_model_forward(md, tk, tg, B, T, (float)(B * T), &ld));
    const double lg = max_rel(hp_model_logits(mm), hp_model_logits(md), (size_t)B * T * cm.vocab_size);
    HP_CHECK(lg < 1e-5, "one-expert MoE logits differ from the dense model by %.2e", lg);
    HP_CHECK_OK(hp_model_backward(mm));
    HP_CHECK_OK(hp_model_backward(md));
    hp_param_t *gd = hp_model_find_param(md, "layers.2.feed_forward.w2.weight");
    hp_param_t *gm = hp_model_find_param(mm, "layers.2.moe.experts.w2");
    hp_param_t *ed = hp_model_find_param(md, "tok_embeddings.weight"), *em = hp_model_find_param(mm, "tok_embeddings.weight");
    const double g2 = max_rel(hp_param_g(gm), hp_param_g(gd), (size_t)hp_tensor_numel(&gd->grad.local));
    const double ge = max_rel(hp_param_g(em), hp_param_g(ed), (size_t)hp_tensor_numel(&ed->grad.local));
    HP_CHECK(g2 < 1e-4 && ge < 1e-4, "one-expert MoE grads differ from the dense model (w2 %.2e, emb %.2e)", g2, ge);
    // the harness sees a small difference: perturb one expert weight by 1% of its scale
    hp_param_t *w1m = hp_model_find_param(mm, "layers.1.moe.experts.w1");
    hp_param_w(w1m)[3] += 0.01f * 0.02f * 50;
    HP_CHECK_OK(hp_model_forward(mm, tk, tg, B, T, (float)(B * T), &lm));
    HP_CHECK(max_rel(hp_model_logits(mm), hp_model_logits(md), (size_t)B * T * cm.vocab_size) >= 1e-5,
             "the harness missed a perturbed expert weight");
    printf("one-expert MoE vs dense: logits %.2e, grads %.2e / %.2e (relative)\n", lg, g2, ge);
    hp_model_destroy(mm);
    hp_model_destroy(md);

    // 5. HF export / import of qwen3_moe with HF's names (Qwen3MoeForCausalLM: one tensor per
    // expert, mlp.gate the router): export -> config.json read back -> import into a fresh model
    // gives bitwise the same parameters and logits; a changed expert is seen; a qwen3_moe HF
    // cannot express is refused by name
    {
        char dir[] = "/tmp/hp_test_model_moe_hf_XXXXXX";
        HP_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
        hp_model_config_t q;
        HP_CHECK_OK(hp_model_flavor("qwen3_moe", "debugmodel", &q));
        q.dim = 32; q.n_layers = 3; q.n_heads = 4; q.n_kv_heads = 2; q.head_dim = 8; q.hidden_dim = 48;
        q.moe_hidden = 16; q.moe_experts = 4; q.moe_top_k = 2; q.vocab_size = 64; q.max_seq_len = 16;
        HP_CHECK_OK(hp_model_config_validate(&q));
        hp_model_t a = NULL, b = NULL;
        HP_CHECK_OK(hp_model_create(&q, B, T, &a));
        HP_CHECK_OK(hp_model_create(&q, B, T, &b));
        HP_CHECK_OK(hp_model_init_weights(a, 21));
        HP_CHECK_OK(hp_model_init_weights(b, 22));
        HP_CHECK_OK(hp_hf_export(dir, hp_model_hf_adapter(&q), &q, hp_model_params(a), hp_model_num_params(a), NULL,
                                 HP_F32, 40000));
        char path[200];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        FILE *f = fopen(path, "r");
        char idx[1 << 16] = {0};
        if (f) { size_t nread = fread(idx, 1, sizeof idx - 1, f); idx[nread] = 0; fclose(f); }
        HP_CHECK(strstr(idx, "\"model.layers.1.mlp.experts.3.gate_proj.weight\"") &&
                 strstr(idx, "\"model.layers.2.mlp.experts.0.down_proj.weight\"") &&
                 strstr(idx, "\"model.layers.1.mlp.gate.weight\"") && strstr(idx, "\"model.layers.0.mlp.up_proj.weight\"") &&
                 !strstr(idx, "moe.experts") && !strstr(idx, "model.layers.0.mlp.experts"),
                 "HF index lacks the per-expert / router names (or keeps TorchTitan's)");
        hp_model_config_t back;
        HP_CHECK_OK(hp_hf_read_config(dir, &back));
        char msg[1500], flags[700];
        HP_CHECK(strcmp(back.name, "qwen3_moe") == 0 && hp_hf_config_diff(&back, &q, msg, sizeof msg, flags, sizeof flags) == 0,
                 "config.json read back as %s differs: %s", back.name, msg);
        HP_CHECK_OK(hp_hf_import(dir, hp_model_hf_adapter(&q), &q, hp_model_params(b), hp_model_num_params(b), NULL));
        int same = 1;
        for (int i = 0; i < hp_model_num_params(a); i++) {
            const hp_param_t *pa = &hp_model_params(a)[i], *pb = &hp_model_params(b)[i];
            same &= memcmp(hp_param_w(pa), hp_param_w(pb), sizeof(float) * (size_t)hp_tensor_numel(&pa->value.local)) == 0;
        }
        float la = 0, lb = 0;
        for (int i = 0; i < B * T; i++) tk[i] %= 64, tg[i] %= 64;
        HP_CHECK_OK(hp_model_forward(a, tk, tg, B, T, (float)(B * T), &la));
        HP_CHECK_OK(hp_model_forward(b, tk, tg, B, T, (float)(B * T), &lb));
        HP_CHECK(same && la == lb && memcmp(hp_model_logits(a), hp_model_logits(b), sizeof(float) * (size_t)B * T * 64) == 0,
                 "HF round trip of qwen3_moe: parameters %s, loss %.7f vs %.7f", same ? "equal" : "differ", la, lb);
        // negative: one expert's weight changed in the exported model is not what the import of the old files gives
        hp_param_w(hp_model_find_param(a, "layers.2.moe.experts.w3"))[16 * 32 * 3 + 5] += 1e-3f;
        HP_CHECK(memcmp(hp_param_w(hp_model_find_param(a, "layers.2.moe.experts.w3")),
                        hp_param_w(hp_model_find_param(b, "layers.2.moe.experts.w3")), sizeof(float) * 4 * 16 * 32) != 0,
                 "the comparison missed a changed expert 3");
        // a config.json with other MoE keys is refused naming them
        hp_model_config_t q2 = q;
        q2.moe_top_k = 1;
        HP_CHECK_ERR(hp_hf_import(dir, hp_model_hf_adapter(&q2), &q2, hp_model_params(b), hp_model_num_params(b), NULL),
                     HP_ERR_INVALID_ARG, "'num_experts_per_tok' = 2 (model.moe_top_k = 1)");
        q2 = q;
        q2.moe_route_scale = 2.0f;
        HP_CHECK_ERR(hp_hf_export(dir, hp_model_hf_adapter(&q2), &q2, hp_model_params(a), hp_model_num_params(a), NULL,
                                  HP_F32, 0),
                     HP_ERR_UNSUPPORTED, "model.moe_route_scale");
        printf("qwen3_moe HF round trip (%s): parameters and logits bitwise equal\n", dir);
        hp_model_destroy(a);
        hp_model_destroy(b);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        HP_CHECK(system(cmd) == 0, "rm %s", dir);
    }
    // DeepSeek-V3 (DeepseekV3ForCausalLM: MLA, shared experts, sigmoid routing over groups): the
    // same round trip (with expert_bias as e_score_correction_bias), for q_lora 0 (q_proj) and > 0
    // (q_a_proj, q_a_layernorm, q_b_proj), YaRN on
    for (int ql = 0; ql <= 8; ql += 8) {
        char dir[] = "/tmp/hp_test_model_moe_ds_XXXXXX";
        HP_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
        hp_model_config_t d;
        HP_CHECK_OK(hp_model_flavor("deepseek_v3", "debugmodel", &d));
        small(&d);
        d.q_lora_rank = ql; d.moe_experts = 4; d.moe_top_k = 2; d.moe_score_fn = HP_MOE_SCORE_SIGMOID;
        d.moe_route_norm = 1; d.moe_route_scale = 2.5f; d.moe_expert_groups = 2; d.moe_limited_groups = 1;
        d.max_seq_len = 64; d.rope_original_max_pos = 32; d.rope_factor = 4.0f;
        HP_CHECK_OK(hp_model_config_validate(&d));
        // TorchTitan's MLA norms (eps = norm_eps 1e-5) have no HF class: transformers' use 1e-6 (issue 28)
        HP_CHECK_ERR(hp_model_hf_adapter(&d)->check(&d, "export"), HP_ERR_UNSUPPORTED,
                     "q_a_layernorm / kv_a_layernorm use eps 1e-6 whatever rms_norm_eps says, but this deepseek_v3 "
                     "model's q_norm / kv_norm use 1e-05 (model.mla_norm_eps = 0");
        d.mla_norm_eps = 1e-6f;
        hp_model_t a = NULL, b = NULL;
        HP_CHECK_OK(hp_model_create(&d, B, T, &a));
        HP_CHECK_OK(hp_model_create(&d, B, T, &b));
        HP_CHECK_OK(hp_model_init_weights(a, 31));
        HP_CHECK_OK(hp_model_init_weights(b, 32));
        // the trainer's list: the parameters and each MoE layer's expert_bias (e_score_correction_bias)
        const int npa = hp_model_num_params(a);
        hp_param_t *la_ = calloc((size_t)npa + 2, sizeof *la_), *lb_ = calloc((size_t)npa + 2, sizeof *lb_);
        float bias_a[2][4], bias_b[2][4] = {{0}};
        memcpy(la_, hp_model_params(a), sizeof(hp_param_t) * (size_t)npa);
        memcpy(lb_, hp_model_params(b), sizeof(hp_param_t) * (size_t)npa);
        for (int j = 0; j < 2; j++) {
            const int64_t shape[1] = {4};
            for (int e = 0; e < 4; e++) bias_a[j][e] = 0.01f * (float)(e - j) + 0.003f;
            snprintf(la_[npa + j].name, sizeof la_[npa + j].name, "layers.%d.moe.expert_bias", j + 1);
            snprintf(lb_[npa + j].name, sizeof lb_[npa + j].name, "layers.%d.moe.expert_bias", j + 1);
            HP_CHECK_OK(hp_tensor_init(&la_[npa + j].value.local, HP_F32, 1, shape, bias_a[j]));
            HP_CHECK_OK(hp_tensor_init(&lb_[npa + j].value.local, HP_F32, 1, shape, bias_b[j]));
            la_[npa + j].value.global_shape[0] = lb_[npa + j].value.global_shape[0] = 4;
        }
        HP_CHECK_OK(hp_hf_export(dir, hp_model_hf_adapter(&d), &d, la_, npa + 2, NULL, HP_F32, 0));
        char path[200];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        FILE *f = fopen(path, "r");
        char idx[1 << 16] = {0};
        if (f) { size_t nread = fread(idx, 1, sizeof idx - 1, f); idx[nread] = 0; fclose(f); }
        HP_CHECK(strstr(idx, ql ? "\"model.layers.1.self_attn.q_b_proj.weight\"" : "\"model.layers.1.self_attn.q_proj.weight\"") &&
                 (!ql || strstr(idx, "\"model.layers.0.self_attn.q_a_layernorm.weight\"")) &&
                 strstr(idx, "\"model.layers.2.self_attn.kv_a_proj_with_mqa.weight\"") &&
                 strstr(idx, "\"model.layers.2.self_attn.kv_a_layernorm.weight\"") &&
                 strstr(idx, "\"model.layers.2.self_attn.kv_b_proj.weight\"") &&
                 strstr(idx, "\"model.layers.2.mlp.shared_experts.down_proj.weight\"") &&
                 strstr(idx, "\"model.layers.1.mlp.experts.3.up_proj.weight\"") && !strstr(idx, "wkv"),
                 "deepseek_v3 HF index (q_lora %d) lacks the MLA / shared-expert names", ql);
        hp_model_config_t back;
        HP_CHECK_OK(hp_hf_read_config(dir, &back));
        char msg[1500], flags[700];
        HP_CHECK(strcmp(back.name, "deepseek_v3") == 0 && hp_hf_config_diff(&back, &d, msg, sizeof msg, flags, sizeof flags) == 0,
                 "deepseek_v3 config.json read back as %s differs: %s", back.name, msg);
        HP_CHECK(strstr(idx, "\"model.layers.2.mlp.gate.e_score_correction_bias\"") != NULL,
                 "deepseek_v3 HF index lacks e_score_correction_bias");
        HP_CHECK_OK(hp_hf_import(dir, hp_model_hf_adapter(&d), &d, lb_, npa + 2, NULL));
        HP_CHECK(memcmp(bias_a, bias_b, sizeof bias_a) == 0, "expert_bias did not survive the HF round trip");
        free(la_);
        free(lb_);
        int same = 1;
        for (int i = 0; i < hp_model_num_params(a); i++) {
            const hp_param_t *pa = &hp_model_params(a)[i], *pb = &hp_model_params(b)[i];
            same &= memcmp(hp_param_w(pa), hp_param_w(pb), sizeof(float) * (size_t)hp_tensor_numel(&pa->value.local)) == 0;
        }
        float la = 0, lb = 0;
        HP_CHECK_OK(hp_model_forward(a, tk, tg, B, T, (float)(B * T), &la));
        HP_CHECK_OK(hp_model_forward(b, tk, tg, B, T, (float)(B * T), &lb));
        HP_CHECK(same && la == lb, "HF round trip of deepseek_v3 (q_lora %d): parameters %s, loss %.7f vs %.7f", ql,
                 same ? "equal" : "differ", la, lb);
        hp_model_config_t d2 = d;   // config fields that change no shape are named
        d2.moe_route_scale = 1.0f;
        HP_CHECK_ERR(hp_hf_import(dir, hp_model_hf_adapter(&d2), &d2, hp_model_params(b), hp_model_num_params(b), NULL),
                     HP_ERR_INVALID_ARG, "'routed_scaling_factor' = 2.5 (model.moe_route_scale = 1)");
        d2 = d;
        d2.max_seq_len = 32;   // YaRN off here, on in config.json
        HP_CHECK_ERR(hp_hf_import(dir, hp_model_hf_adapter(&d2), &d2, hp_model_params(b), hp_model_num_params(b), NULL),
                     HP_ERR_INVALID_ARG, "'rope_parameters.rope_type' = yarn");
        d2 = d;
        d2.moe_score_fn = HP_MOE_SCORE_SOFTMAX;   // HF routes with a sigmoid
        HP_CHECK_ERR(hp_hf_export(dir, hp_model_hf_adapter(&d2), &d2, hp_model_params(a), hp_model_num_params(a), NULL,
                                  HP_F32, 0),
                     HP_ERR_UNSUPPORTED, "model.moe_score_func (HF: sigmoid)");
        printf("deepseek_v3 HF round trip (q_lora %d): parameters and loss bitwise equal\n", ql);
        hp_model_destroy(a);
        hp_model_destroy(b);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        HP_CHECK(system(cmd) == 0, "rm %s", dir);
    }

    // 6. bad configs are named
    HP_CHECK_OK(hp_model_flavor("qwen3_moe", "debugmodel", &c));
    c.moe_top_k = 9;
    HP_CHECK_ERR(hp_model_config_validate(&c), HP_ERR_INVALID_ARG, "top_k = 9");
    HP_CHECK_OK(hp_model_flavor("qwen3_moe", "debugmodel", &c));
    c.moe_n_dense_layers = 9;
    HP_CHECK_ERR(hp_model_config_validate(&c), HP_ERR_INVALID_ARG, "moe_n_dense_layers = 9");
    HP_CHECK_ERR(hp_model_flavor("qwen3_moe", "7B", &c), HP_ERR_INVALID_ARG, "30B-A3B");
    return hp_test_finish("test_model_moe");
}
