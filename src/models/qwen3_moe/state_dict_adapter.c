/* qwen3_moe's HF state-dict adapter (Qwen3MoeForCausalLM, model_type "qwen3_moe"):
 * the decoder's names with the router (mlp.gate) and the routed experts (one HF tensor per
 * expert, hf.c); the expert_bias the trainer keeps has no HF tensor (skipped both ways). Its
 * config.json mapping: Qwen3MoeConfig's routing keys (decoder_sparse_step 1 and mlp_only_layers
 * [0, k), the dense first layers, are the layouts the model has), q/k norm always. */
#include <stdio.h>
#include "models/models-impl.h"

/* Qwen3MoeForCausalLM's router: softmax over the experts, top-k renormalised when
 * norm_topk_prob, no shared experts, no groups, no scale. */
static hp_status_t check_moe(const hp_model_config_t *mc, const char *what) {
    const char *key = mc->moe_experts <= 0                      ? NULL
                      : mc->moe_shared_experts > 0               ? "model.moe_num_shared_experts (HF: 0)"
                      : mc->moe_score_fn != HP_MOE_SCORE_SOFTMAX ? "model.moe_score_func (HF: softmax)"
                      : mc->moe_route_scale != 1.0f             ? "model.moe_route_scale (HF: 1)"
                      : mc->moe_score_before_experts            ? "model.moe_score_before_experts (HF: false)"
                      : mc->moe_expert_groups > 1               ? "model.moe_n_expert_groups (HF: none)"
                                                                : NULL;
    if (key)
        return hp_error(HP_ERR_UNSUPPORTED, "HF %s: Qwen3MoeForCausalLM cannot express this qwen3_moe model's %s; hint: "
                        "keep the flavor's value, or use the DCP checkpoint", what, key);
    return HP_OK;
}

static hp_status_t read_keys(const hfj_t *c, hp_model_config_t *mc, int64_t max_pos) {
    int64_t ne = 0, k = 0, mh = 0, step = 1;
    int norm = 0;
    /* transformers 5 writes num_local_experts (its attribute map of num_experts), 4.x num_experts */
    if (!hfj_get(c->o, "num_experts") && !hfj_get(c->o, "num_local_experts"))
        return hp_error(HP_ERR_FORMAT, "%s: the routed experts per MoE layer are missing: neither 'num_experts' "
                        "(transformers 4.x) nor 'num_local_experts' (transformers 5) is set; expected an integer (every "
                        "Qwen3MoeConfig saves one of them); hint: use the config.json saved with the weights", c->path);
    HP_TRY(hfj_int(c, hfj_get(c->o, "num_experts") ? "num_experts" : "num_local_experts", 1, 0, 1, 1 << 16, &ne));
    HP_TRY(hfj_int(c, "num_experts_per_tok", 1, 0, 1, ne, &k));
    HP_TRY(hfj_int(c, "moe_intermediate_size", 1, 0, 1, HP_MODEL_MAX_DIM, &mh));
    HP_TRY(hfj_int(c, "decoder_sparse_step", 0, 1, 1, HP_MODEL_MAX_LAYERS, &step));
    HP_TRY(hfj_bool(c, "norm_topk_prob", 0, &norm));
    if (step != 1) {
        char b[32];
        snprintf(b, sizeof b, "%lld", (long long)step);
        return hfj_unsupported(c, "decoder_sparse_step", b, "MoE in every layer after the mlp_only_layers (1)");
    }
    int dense = 0;
    json_object *v = hfj_get(c->o, "mlp_only_layers");
    if (v && !json_object_is_type(v, json_type_array))
        return hp_error(HP_ERR_FORMAT, "%s: 'mlp_only_layers' expects an array of layer indices", c->path);
    for (size_t i = 0; v && i < json_object_array_length(v); i++) {
        json_object *e = json_object_array_get_idx(v, i);
        if (!e || !json_object_is_type(e, json_type_int) || json_object_get_int64(e) != (int64_t)i) {
            char key[64];
            snprintf(key, sizeof key, "mlp_only_layers[%zu]", i);
            return hfj_unsupported(c, key, e ? json_object_to_json_string(e) : "null",
                                   "the first layers dense, in order (0, 1, ..., as model.moe_n_dense_layers)");
        }
        dense++;
    }
    if (dense > mc->n_layers)   /* named here: the model config would report its own field */
        return hp_error(HP_ERR_FORMAT, "%s: 'mlp_only_layers' lists %d layers but 'num_hidden_layers' = %d; hint: list "
                        "dense layers of the model only", c->path, dense, mc->n_layers);
    mc->moe_experts = (int)ne;
    mc->moe_top_k = (int)k;
    mc->moe_hidden = (int)mh;
    mc->moe_route_norm = norm;
    mc->moe_n_dense_layers = dense;
    return models_hf_read_rope(c, mc, max_pos);
}

static void diff(models_diff_t *d, const hp_model_config_t *hf, const hp_model_config_t *mc) {
    /* config.json's names and the config keys' */
    models_diff_int(d, "num_experts", "moe_num_experts", hf->moe_experts, mc->moe_experts);
    models_diff_int(d, "num_experts_per_tok", "moe_top_k", hf->moe_top_k, mc->moe_top_k);
    models_diff_int(d, "moe_intermediate_size", "moe_hidden_dim", hf->moe_hidden, mc->moe_hidden);
    models_diff_bool(d, "norm_topk_prob", "moe_route_norm", hf->moe_route_norm, mc->moe_route_norm);
    models_diff_int(d, "mlp_only_layers (count)", "moe_n_dense_layers", hf->moe_n_dense_layers, mc->moe_n_dense_layers);
}

/* The Qwen3 keys, then the routing: the first moe_n_dense_layers are mlp_only_layers. */
static void write_keys(json_object *c, const hp_model_config_t *mc) {
    models_hf_write_llama_rope(c, mc);
    json_object_object_add(c, "use_sliding_window", json_object_new_boolean(0));
    json_object_object_add(c, "sliding_window", NULL);
    json_object_object_add(c, "max_window_layers", json_object_new_int(mc->n_layers));
    json_object_object_add(c, "num_experts", json_object_new_int(mc->moe_experts));
    json_object_object_add(c, "num_experts_per_tok", json_object_new_int(mc->moe_top_k));
    json_object_object_add(c, "moe_intermediate_size", json_object_new_int(mc->moe_hidden));
    json_object_object_add(c, "norm_topk_prob", json_object_new_boolean(mc->moe_route_norm));
    json_object_object_add(c, "decoder_sparse_step", json_object_new_int(1));
    json_object *dense = json_object_new_array();
    for (int l = 0; l < mc->moe_n_dense_layers; l++) json_object_array_add(dense, json_object_new_int(l));
    json_object_object_add(c, "mlp_only_layers", dense);
    json_object_object_add(c, "output_router_logits", json_object_new_boolean(0));
    json_object_object_add(c, "router_aux_loss_coef", json_object_new_double(mc->moe_aux_loss_coeff));
}

static const hp_hf_name_pair_t *const names[] = {models_hf_decoder_names, NULL};

/* Qwen3MoeConfig: max_position_embeddings 32768 by default, q/k norm, a sliding window (off) */
const models_hf_family_t qwen3_moe_hf = {
    {"qwen3_moe", "qwen3_moe", "Qwen3MoeForCausalLM", names, 0, MODELS_HF_HOOKS},
    32768, 1, 0, read_keys, diff, write_keys, check_moe,
};
