// Micro-batch contexts and the unit-range driver (model.h): two and three contexts in flight
// with forwards and backwards interleaved in any order equal running them one at a time,
// bitwise; W of a micro-batch run after the I of two later ones gives the same gradients;
// a model created for units [k, n) allocates only their parameters and its range
// forward/backward equals the same range inside the full model, bitwise (llama3 and tied
// qwen3); the same with activation checkpointing (every_k 1 and 2, op-level SAC, memory budget
// 0.5); chainable module hooks run in registration order; misuse gets named errors. All
// comparisons are bitwise: the same kernels run on the same inputs with the same threads.
// hp-test: ranks 1 timeout 120 coretype 1
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hp_test.h"

enum { B = 2, T = 16, MB = 3 };

static hp_model_config_t small(const char *name) {
    hp_model_config_t c;
    HP_ASSERT(hp_model_flavor(name, "debugmodel", &c) == HP_OK);
    c.dim = 64;
    c.n_layers = 3;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 16;
    c.vocab_size = 96;
    if (strcmp(name, "qwen3") == 0) c.hidden_dim = 160;
    else c.hidden_dim = 0;
    HP_ASSERT(hp_model_config_validate(&c) == HP_OK);
    return c;
}

static int32_t g_tok[MB][B * T], g_tgt[MB][B * T];

static void make_batches(int vocab) {
    uint32_t x = 99;
    for (int m = 0; m < MB; m++)
        for (int i = 0; i < B * T; i++) {
            x = x * 1664525u + 1013904223u;
            g_tok[m][i] = (int32_t)((x >> 8) % (uint32_t)vocab);
            x = x * 1664525u + 1013904223u;
            g_tgt[m][i] = (int32_t)((x >> 8) % (uint32_t)vocab);
        }
    g_tgt[1][5] = -100;
}

static size_t n_grad(hp_model_t m) {
    size_t n = 0;
    for (int i = 0; i < hp_model_num_params(m); i++) n += (size_t)hp_tensor_numel(&hp_model_params(m)[i].grad.local);
    return n;
}

static void snap_grads(hp_model_t m, float *out) {
    for (int i = 0; i < hp_model_num_params(m); i++) {
        const hp_tensor_t *g = &hp_model_params(m)[i].grad.local;
        memcpy(out, g->data, hp_tensor_nbytes(g));
        out += hp_tensor_numel(g);
    }
}

/* The reference: micro-batch i alone (zero grads, forward, backward). */
typedef struct ref {
    float loss[MB];
    float *grads[MB];    // per micro-batch, from zero
    float *accum;        // 0, 1, 2 accumulated in order
} ref_t;

static void reference(hp_model_t m, ref_t *r, size_t ng) {
    for (int i = 0; i < MB; i++) {
        r->grads[i] = malloc(sizeof(float) * ng);
        HP_CHECK_OK(hp_model_zero_grad(m));
        HP_CHECK_OK(hp_model_forward(m, g_tok[i], g_tgt[i], B, T, 40.0f, &r->loss[i]));
        HP_CHECK_OK(hp_model_backward(m));
        snap_grads(m, r->grads[i]);
    }
    r->accum = malloc(sizeof(float) * ng);
    HP_CHECK_OK(hp_model_zero_grad(m));
    for (int i = 0; i < MB; i++) {
        float l;
        HP_CHECK_OK(hp_model_forward(m, g_tok[i], g_tgt[i], B, T, 40.0f, &l));
        HP_CHECK_OK(hp_model_backward(m));
    }
    snap_grads(m, r->accum);
}

static void free_ref(ref_t *r) {
    for (int i = 0; i < MB; i++) free(r->grads[i]);
    free(r->accum);
}

/* Forwards in order fo[], backwards in order bo[], n contexts; each backward's gradients
 * (from zero) and each loss must equal the reference bitwise. */
static void interleaved(hp_model_t m, const ref_t *r, size_t ng, int n, const int *fo, const int *bo,
                        const char *what) {
    hp_model_ctx_t c[MB] = {0};
    float *g = malloc(sizeof(float) * ng);
    for (int i = 0; i < n; i++) HP_CHECK_OK(hp_model_ctx_create(m, B, T, 0, &c[i]));
    for (int k = 0; k < n; k++) {
        float l = -1.0f;
        const int i = fo[k];
        HP_CHECK_OK(hp_model_forward_ctx(m, c[i], g_tok[i], g_tgt[i], B, T, 40.0f, &l));
        HP_CHECK(l == r->loss[i], "%s: loss of micro-batch %d %.9g vs alone %.9g", what, i, l, r->loss[i]);
    }
    for (int k = 0; k < n; k++) {
        const int i = bo[k];
        HP_CHECK_OK(hp_model_zero_grad(m));
        HP_CHECK_OK(hp_model_backward_ctx(m, c[i]));
        snap_grads(m, g);
        HP_CHECK(memcmp(g, r->grads[i], sizeof(float) * ng) == 0, "%s: gradients of micro-batch %d bitwise", what, i);
    }
    for (int i = 0; i < n; i++) hp_model_ctx_destroy(c[i]);
    free(g);
}

static void test_contexts(const char *name, int ac) {
    hp_model_config_t cfg = small(name);
    make_batches(cfg.vocab_size);
    hp_model_t m = NULL;
    HP_ASSERT(hp_model_create(&cfg, B, T, &m) == HP_OK);
    HP_CHECK_OK(hp_model_init_weights(m, 5));
    if (ac > 0) HP_CHECK_OK(hp_model_set_activation_checkpoint(m, ac));
    if (ac < 0) {   // -1: op-level selective AC, -2: memory budget 0.5 (kept items survive deferred W passes)
        hp_ac_options_t o = hp_ac_default_options();
        o.every_k = 1;
        o.policy = ac == -1 ? HP_AC_OP : HP_AC_BUDGET;
        HP_CHECK_OK(hp_model_set_activation_checkpoint_options(m, &o));
    }
    const size_t ng = n_grad(m);
    ref_t r;
    reference(m, &r, ng);
    char what[64];
    snprintf(what, sizeof what, "%s ac=%d two", name, ac);
    const int f2[] = {0, 1}, b2a[] = {0, 1}, b2b[] = {1, 0};
    interleaved(m, &r, ng, 2, f2, b2a, what);
    interleaved(m, &r, ng, 2, f2, b2b, what);
    snprintf(what, sizeof what, "%s ac=%d three", name, ac);
    const int f3a[] = {0, 1, 2}, f3b[] = {2, 0, 1}, b3a[] = {2, 1, 0}, b3b[] = {1, 2, 0}, b3c[] = {0, 2, 1};
    interleaved(m, &r, ng, 3, f3a, b3a, what);
    interleaved(m, &r, ng, 3, f3b, b3b, what);
    interleaved(m, &r, ng, 3, f3b, b3c, what);

    // split backward: F0 F1 F2, I0 I1 I2, then W0 W1 W2 (W0 after the I of two later ones)
    hp_model_ctx_t c[MB];
    for (int i = 0; i < MB; i++) HP_CHECK_OK(hp_model_ctx_create(m, B, T, HP_MODEL_CTX_SPLIT_BACKWARD, &c[i]));
    const int nu = hp_model_num_units(m);
    float *g = malloc(sizeof(float) * ng);
    for (int pass = 0; pass < 2; pass++) {
        HP_CHECK_OK(hp_model_zero_grad(m));
        for (int i = 0; i < MB; i++) {
            float l;
            HP_CHECK_OK(hp_model_forward_ctx(m, c[i], g_tok[i], g_tgt[i], B, T, 40.0f, &l));
            HP_CHECK(l == r.loss[i], "%s ac=%d split: loss %d", name, ac, i);
        }
        for (int i = 0; i < MB; i++) HP_CHECK_OK(hp_model_backward_input_range(m, c[i], 0, nu, NULL, NULL));
        if (pass == 0) {
            // the input passes touch no parameter gradient
            snap_grads(m, g);
            int zero = 1;
            for (size_t k = 0; k < ng; k++) zero &= g[k] == 0.0f;
            HP_CHECK(zero, "%s ac=%d: backward_input leaves parameter gradients untouched", name, ac);
            HP_CHECK_OK(hp_model_backward_weight_range(m, c[0], 0, nu));
            snap_grads(m, g);
            HP_CHECK(memcmp(g, r.grads[0], sizeof(float) * ng) == 0,
                     "%s ac=%d: W of micro-batch 0 after the I of 1 and 2 equals its own backward", name, ac);
            HP_CHECK_OK(hp_model_backward_weight_range(m, c[1], 0, nu));
            HP_CHECK_OK(hp_model_backward_weight_range(m, c[2], 0, nu));
        } else {
            // weight passes unit range by unit range, newest micro-batch's last
            for (int i = 0; i < MB; i++) {
                HP_CHECK_OK(hp_model_backward_weight_range(m, c[i], 2, nu));
                HP_CHECK_OK(hp_model_backward_weight_range(m, c[i], 0, 2));
            }
        }
        snap_grads(m, g);
        HP_CHECK(memcmp(g, r.accum, sizeof(float) * ng) == 0,
                 "%s ac=%d pass %d: I0 I1 I2 then W0 W1 W2 accumulate the reference gradients bitwise", name, ac, pass);
    }
    // misuse
    HP_CHECK_ERR(hp_model_backward_weight_range(m, c[0], 0, nu), HP_ERR_STATE, "no pending weight pass");
    hp_model_ctx_t plain;
    HP_CHECK_OK(hp_model_ctx_create(m, B, T, 0, &plain));
    float l;
    HP_CHECK_OK(hp_model_forward_ctx(m, plain, g_tok[0], g_tgt[0], B, T, 40.0f, &l));
    HP_CHECK_ERR(hp_model_backward_input_range(m, plain, 0, nu, NULL, NULL), HP_ERR_STATE, "SPLIT_BACKWARD");
    HP_CHECK_ERR(hp_model_ctx_create(m, B + 1, T, 0, &c[0]), HP_ERR_INVALID_ARG, "outside the model's");
    hp_model_ctx_destroy(plain);
    if (!ac) {   // a context sized before checkpointing changes is refused
        hp_model_ctx_t old;
        HP_CHECK_OK(hp_model_ctx_create(m, B, T, 0, &old));
        HP_CHECK_OK(hp_model_set_activation_checkpoint(m, 1));
        HP_CHECK_ERR(hp_model_forward_ctx(m, old, g_tok[0], g_tgt[0], B, T, 40.0f, &l), HP_ERR_STATE,
                     "activation checkpointing changed");
        hp_model_ctx_destroy(old);
    }
    for (int i = 0; i < MB; i++) hp_model_ctx_destroy(c[i]);
    free(g);
    free_ref(&r);
    hp_model_destroy(m);
}

/* A stage: units [k, n) (and a middle stage [1, k)) against the same ranges of the full model. */
static void test_stage(const char *name, int k) {
    hp_model_config_t cfg = small(name);
    make_batches(cfg.vocab_size);
    hp_model_t full = NULL, tail = NULL, mid = NULL;
    HP_ASSERT(hp_model_create(&cfg, B, T, &full) == HP_OK);
    const int nu = hp_model_num_units(full);
    HP_CHECK_OK(hp_model_create_range(&cfg, k, nu, B, T, &tail));
    HP_CHECK_OK(hp_model_create_range(&cfg, 1, k, B, T, &mid));
    if (!tail || !mid) { hp_model_destroy(full); hp_model_destroy(tail); hp_model_destroy(mid); return; }
    HP_CHECK_OK(hp_model_init_weights(full, 11));
    HP_CHECK_OK(hp_model_init_weights(tail, 11));
    HP_CHECK_OK(hp_model_init_weights(mid, 11));
    // parameters: only the stage's units, the same names, shapes and values as in the full model
    size_t pb_full, pb_tail, pb_mid;
    hp_model_memory(full, &pb_full, NULL, NULL, NULL);
    hp_model_memory(tail, &pb_tail, NULL, NULL, NULL);
    hp_model_memory(mid, &pb_mid, NULL, NULL, NULL);
    size_t want_tail = 0, want_mid = 0;
    for (int u = 0; u < nu; u++) {
        size_t off, fl;
        hp_model_unit_span(full, u, &off, &fl);
        if (u >= k) want_tail += fl * sizeof(float);
        if (u >= 1 && u < k) want_mid += fl * sizeof(float);
    }
    const int tied = cfg.tie_embeddings;
    // a tied head without the embedding holds its own copy of the shared weight
    if (tied) want_tail += (size_t)cfg.vocab_size * cfg.dim * sizeof(float);
    HP_CHECK(pb_tail == want_tail, "%s stage [%d, %d): %zu parameter bytes, expected %zu (its units only)", name, k,
             nu, pb_tail, want_tail);
    HP_CHECK(pb_mid == want_mid, "%s stage [1, %d): %zu parameter bytes, expected %zu", name, k, pb_mid, want_mid);
    size_t off0, emb0;
    hp_model_unit_span(full, 0, &off0, &emb0);
    const size_t copy = tied ? (size_t)cfg.vocab_size * cfg.dim * sizeof(float) : 0;
    HP_CHECK(pb_mid + pb_tail - copy + emb0 * sizeof(float) == pb_full,
             "%s: the stages hold the full model's parameters less the embedding unit (plus the tied copy)", name);
    printf("%s: full model %zu parameter bytes, stage [1, %d) %zu, stage [%d, %d) %zu\n", name, pb_full, k, pb_mid,
           k, nu, pb_tail);
    hp_model_t stages[2] = {mid, tail};
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < hp_model_num_params(stages[s]); i++) {
            const hp_param_t *p = &hp_model_params(stages[s])[i];
            const hp_param_t *q = hp_model_find_param(full, p->name);
            HP_CHECK(q && hp_tensor_same_shape(&p->value.local, &q->value.local) &&
                         memcmp(p->value.local.data, q->value.local.data, hp_tensor_nbytes(&q->value.local)) == 0,
                     "%s: stage parameter '%s' has the full model's name, shape and initial values", name, p->name);
        }
    // forward: full [0, n) vs full [0, 1) -> mid [1, k) -> tail [k, n)
    const size_t xd = (size_t)B * T * cfg.dim;
    float *x1 = malloc(sizeof(float) * xd), *xk = malloc(sizeof(float) * xd), *dxk = malloc(sizeof(float) * xd),
          *dx1 = malloc(sizeof(float) * xd), *dx1_full = malloc(sizeof(float) * xd);
    hp_model_ctx_t cf, cm, ct, cf2;
    HP_CHECK_OK(hp_model_ctx_create(full, B, T, 0, &cf));
    HP_CHECK_OK(hp_model_ctx_create(full, B, T, 0, &cf2));
    HP_CHECK_OK(hp_model_ctx_create(mid, B, T, 0, &cm));
    HP_CHECK_OK(hp_model_ctx_create(tail, B, T, 0, &ct));
    float lf;
    HP_CHECK_OK(hp_model_forward_ctx(full, cf, g_tok[0], g_tgt[0], B, T, 30.0f, &lf));
    HP_CHECK_OK(hp_model_ctx_begin(cf2, g_tok[0], g_tgt[0], B, T, 30.0f));
    HP_CHECK_OK(hp_model_forward_range(full, cf2, 0, 1, NULL, x1));
    HP_CHECK_OK(hp_model_ctx_begin(cm, NULL, NULL, B, T, 30.0f));
    HP_CHECK_OK(hp_model_forward_range(mid, cm, 1, k, x1, xk));
    HP_CHECK_OK(hp_model_ctx_begin(ct, NULL, g_tgt[0], B, T, 30.0f));
    HP_CHECK_OK(hp_model_forward_range(tail, ct, k, nu, xk, NULL));
    const double ls = hp_model_ctx_loss_sum(ct);
    HP_CHECK(ls == hp_model_ctx_loss_sum(cf), "%s: loss sum through the stages %.17g vs the full model %.17g", name,
             ls, hp_model_ctx_loss_sum(cf));
    HP_CHECK(memcmp(hp_model_ctx_logits(ct), hp_model_ctx_logits(cf), sizeof(float) * B * T * cfg.vocab_size) == 0,
             "%s: logits through the stages bitwise", name);
    // backward: tail [k, n) -> mid [1, k) -> embedding, against the full model's backward
    HP_CHECK_OK(hp_model_zero_grad(full));
    HP_CHECK_OK(hp_model_backward_range(full, cf, 1, nu, NULL, dx1_full));
    HP_CHECK_OK(hp_model_backward_range(tail, ct, k, nu, NULL, dxk));
    HP_CHECK_OK(hp_model_backward_range(mid, cm, 1, k, dxk, dx1));
    HP_CHECK(memcmp(dx1, dx1_full, sizeof(float) * xd) == 0, "%s: the input gradient of unit 1 bitwise", name);
    HP_CHECK_ERR(hp_model_backward_range(full, cf, 0, 1, NULL, NULL), HP_ERR_INVALID_ARG, "dout");
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < hp_model_num_params(stages[s]); i++) {
            const hp_param_t *p = &hp_model_params(stages[s])[i];
            const hp_param_t *q = hp_model_find_param(full, p->name);
            // (tied: the tail's tok_embeddings.weight holds the head's share; the full model's
            // embedding unit has not run its backward, so it holds the same)
            HP_CHECK(q && memcmp(p->grad.local.data, q->grad.local.data, hp_tensor_nbytes(&q->grad.local)) == 0,
                     "%s: gradient of '%s' through the stages bitwise", name, p->name);
        }
    // range errors name the model's units; whole-model calls refuse a stage
    float l;
    HP_CHECK_ERR(hp_model_forward_range(tail, ct, 0, nu, NULL, NULL), HP_ERR_INVALID_ARG, "outside the model's units");
    HP_CHECK_ERR(hp_model_forward(tail, g_tok[0], g_tgt[0], B, T, 30.0f, &l), HP_ERR_STATE, "holds units");
    HP_CHECK_ERR(hp_model_create_range(&cfg, 2, 2, B, T, &full), HP_ERR_INVALID_ARG, "expected 0 <= u0 < u1");
    HP_CHECK(hp_model_unit_module(tail, 0) == NULL && hp_model_unit_module(tail, k) != NULL,
             "unit modules exist for the stage's units only");
    hp_model_ctx_destroy(cf);
    hp_model_ctx_destroy(cf2);
    hp_model_ctx_destroy(cm);
    hp_model_ctx_destroy(ct);
    free(x1); free(xk); free(dxk); free(dx1); free(dx1_full);
    hp_model_destroy(full);
    hp_model_destroy(tail);
    hp_model_destroy(mid);
}

/* Hooks: several per module, registration order, removal by handle and by owner. */
static char g_log[256];
static hp_status_t log_hook(void *user, hp_module_t *m, hp_act_t *act) {
    (void)m; (void)act;
    strncat(g_log, (const char *)user, sizeof(g_log) - strlen(g_log) - 1);
    return HP_OK;
}
static hp_status_t fail_hook(void *user, hp_module_t *m, hp_act_t *act) {
    (void)user; (void)act;
    return hp_error(HP_ERR_STATE, "hook refused module '%s'", m->name);
}

static void test_hooks(void) {
    hp_model_config_t cfg = small("llama3");
    make_batches(cfg.vocab_size);
    hp_model_t m = NULL;
    HP_ASSERT(hp_model_create(&cfg, B, T, &m) == HP_OK);
    HP_CHECK_OK(hp_model_init_weights(m, 1));
    hp_module_t *u1 = hp_model_unit_module(m, 1);
    HP_CHECK(u1 && u1->unit == 1 && strcmp(u1->name, "layers.0") == 0, "unit 1 is layers.0");
    int h_b;
    HP_CHECK_OK(hp_module_add_hook(u1, HP_HOOK_PRE_FORWARD, log_hook, "a", NULL));
    HP_CHECK_OK(hp_module_add_hook(u1, HP_HOOK_PRE_FORWARD, log_hook, "b", &h_b));
    HP_CHECK_OK(hp_module_add_hook(u1, HP_HOOK_POST_FORWARD, log_hook, "c", NULL));
    HP_CHECK_OK(hp_module_add_hook(u1, HP_HOOK_PRE_BACKWARD, log_hook, "d", NULL));
    HP_CHECK_OK(hp_module_add_hook(u1, HP_HOOK_POST_BACKWARD, log_hook, "e", NULL));
    float l;
    g_log[0] = 0;
    HP_CHECK_OK(hp_model_forward(m, g_tok[0], g_tgt[0], B, T, 30.0f, &l));
    HP_CHECK_OK(hp_model_backward(m));
    HP_CHECK(strcmp(g_log, "abcde") == 0, "hooks in registration order around the unit: '%s'", g_log);
    // the hooks follow the unit when activation checkpointing wraps it
    HP_CHECK_OK(hp_model_set_activation_checkpoint(m, 1));
    HP_CHECK(hp_model_unit_module(m, 1) != u1 && hp_model_unit_module(m, 1)->n_hooks[HP_HOOK_PRE_FORWARD] == 2,
             "the checkpoint wrapper is the unit's module and holds its hooks");
    hp_module_remove_hook(hp_model_unit_module(m, 1), h_b);
    g_log[0] = 0;
    HP_CHECK_OK(hp_model_forward(m, g_tok[0], g_tgt[0], B, T, 30.0f, &l));
    HP_CHECK_OK(hp_model_backward(m));
    HP_CHECK(strcmp(g_log, "acde") == 0, "after removing 'b' (recompute runs no forward hooks): '%s'", g_log);
    HP_CHECK_OK(hp_model_set_activation_checkpoint(m, 0));
    hp_module_remove_hooks_of(hp_model_unit_module(m, 1), "a");
    HP_CHECK_OK(hp_module_add_hook(hp_model_unit_module(m, 2), HP_HOOK_PRE_FORWARD, fail_hook, NULL, NULL));
    g_log[0] = 0;
    HP_CHECK_ERR(hp_model_forward(m, g_tok[0], g_tgt[0], B, T, 30.0f, &l), HP_ERR_STATE, "refused module 'layers.1'");
    HP_CHECK(strcmp(g_log, "c") == 0, "an error stops the pass after unit 1: '%s'", g_log);
    for (int i = 0; i < HP_MODULE_MAX_HOOKS - 1; i++)
        HP_CHECK_OK(hp_module_add_hook(u1, HP_HOOK_POST_BACKWARD, log_hook, "x", NULL));
    HP_CHECK_ERR(hp_module_add_hook(u1, HP_HOOK_POST_BACKWARD, log_hook, "x", NULL), HP_ERR_INVALID_ARG,
                 "HP_MODULE_MAX_HOOKS");
    hp_model_destroy(m);
}

/* A replacement module (the seam context parallelism uses for the attention core and tensor
 * parallelism for the head's loss): this one delegates to the module it replaced and counts
 * calls, so the model's results must not change. A loss keeps its result as its own slot. */
typedef struct spy { hp_module_t *orig; int fwd, bwd; } spy_t;
static size_t spy_bytes(const hp_module_t *m, int b, int t) {
    const spy_t *s = m->impl;
    return s->orig->ops->act_bytes(s->orig, b, t) + (hp_module_is_loss(s->orig) ? hp_loss_act_bytes(s->orig, b, t) : 0);
}
static hp_status_t spy_forward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *in, hp_tensor_t *out) {
    spy_t *s = m->impl;
    s->fwd++;
    HP_TRY(hp_module_forward(s->orig, act, in, out));
    if (!hp_module_is_loss(s->orig)) return HP_OK;
    hp_loss_saved_t *mine;
    HP_TRY(hp_loss_begin(m, act, in, &mine));
    mine->sum = hp_loss_result(act, s->orig)->sum;
    mine->n_valid = hp_loss_result(act, s->orig)->n_valid;
    return HP_OK;
}
static hp_status_t spy_backward(hp_module_t *m, hp_act_t *act, const hp_tensor_t *dout, hp_tensor_t *din) {
    spy_t *s = m->impl;
    s->bwd++;
    return hp_module_backward_input(s->orig, act, dout, din);
}
static const hp_module_ops_t spy_ops = {"spy", spy_bytes, NULL, spy_forward, spy_backward, NULL, NULL, NULL};

/* One step on batch 0 from zero gradients: the loss, the gradients into g. */
static float step_grads(hp_model_t m, float *g) {
    float l = 0.0f;
    HP_CHECK_OK(hp_model_zero_grad(m));
    HP_CHECK_OK(hp_model_forward(m, g_tok[0], g_tgt[0], B, T, 30.0f, &l));
    HP_CHECK_OK(hp_model_backward(m));
    snap_grads(m, g);
    return l;
}

/* Replaces `old`, a child of `parent`, by a spy delegating to it: bitwise the same loss and
 * gradients, the spy run once each way, listed by hp_model_modules in old's place, contexts
 * created before refused, a second replacement of `old` refused. */
static void check_spy(hp_model_t m, hp_module_t *parent, hp_module_t *old, const char *what) {
    const size_t ng = n_grad(m);
    float *g0 = malloc(sizeof(float) * ng), *g1 = malloc(sizeof(float) * ng), l1;
    const float l0 = step_grads(m, g0);
    hp_model_ctx_t before;
    HP_CHECK_OK(hp_model_ctx_create(m, B, T, 0, &before));
    hp_module_t *mods[512];
    const int n = hp_model_modules(m, mods, 512);
    spy_t spy = {old, 0, 0};
    hp_module_t rep;
    hp_module_base_init(&rep, &spy_ops, old->name, &spy);
    HP_CHECK_OK(hp_model_replace_module(m, parent, old, &rep));
    int child = 0, listed_new = 0, listed_old = 0;
    for (int i = 0; i < parent->n_children; i++) child += parent->children[i] == &rep;
    const int n2 = hp_model_modules(m, mods, 512);
    for (int i = 0; i < n2 && n2 <= 512; i++) {
        listed_new += mods[i] == &rep;
        listed_old += mods[i] == old;
    }
    HP_CHECK(child == 1 && n2 == n && listed_new == 1 && listed_old == 0, "%s: the replacement is the parent's child "
             "(%d) and hp_model_modules lists the tree as it is: %d modules (%d before), the replacement %d time(s), "
             "the replaced module %d", what, child, n2, n, listed_new, listed_old);
    l1 = step_grads(m, g1);
    HP_CHECK(spy.fwd == 1 && spy.bwd == 1, "%s: the replacement ran once each way (%d, %d)", what, spy.fwd, spy.bwd);
    HP_CHECK(l0 == l1 && memcmp(g0, g1, sizeof(float) * ng) == 0, "%s: results through the replacement bitwise", what);
    HP_CHECK_ERR(hp_model_forward_ctx(m, before, g_tok[0], g_tgt[0], B, T, 30.0f, &l1), HP_ERR_STATE, "re-create it");
    HP_CHECK_ERR(hp_model_replace_module(m, parent, old, &rep), HP_ERR_INVALID_ARG, "is not a child");
    hp_model_ctx_destroy(before);
    free(g0);
    free(g1);
}

static void test_replace(void) {
    for (int k = 0; k < 2; k++) {   // the attention core (qwen3), the head's loss (llama3)
        hp_model_config_t cfg = small(k ? "llama3" : "qwen3");
        make_batches(cfg.vocab_size);
        hp_model_t m = NULL;
        HP_ASSERT(hp_model_create(&cfg, B, T, &m) == HP_OK);
        HP_CHECK_OK(hp_model_init_weights(m, 3));
        hp_module_t *parent = NULL, *old = NULL, *mods[512];
        if (k == 0) {
            const int n = hp_model_modules(m, mods, 512);
            for (int i = 0; i < n && n <= 512; i++)
                if (strcmp(mods[i]->name, "layers.1.attention") == 0) parent = mods[i];
            old = hp_attention_core(parent);
            HP_CHECK(old && strcmp(old->name, "layers.1.attention.core") == 0, "layers.1.attention has its core child");
        } else {
            parent = hp_model_unit_module(m, hp_model_num_units(m) - 1);
            for (int i = 0; parent && i < parent->n_children; i++)
                if (hp_module_is_loss(parent->children[i])) old = parent->children[i];
            HP_CHECK(old && strcmp(old->name, "loss") == 0 && strcmp(old->ops->kind, "cross_entropy") == 0,
                     "the head has its cross-entropy child 'loss'");
        }
        if (old) check_spy(m, parent, old, k ? "the loss" : "the attention core");
        hp_model_destroy(m);
    }
}

int main(void) {
    test_contexts("llama3", 0);
    test_contexts("llama3", 1);
    test_contexts("qwen3", 0);
    test_contexts("qwen3", 2);
    test_contexts("llama3", -1);
    test_contexts("qwen3", -2);
    test_stage("llama3", 3);
    test_stage("qwen3", 2);
    test_hooks();
    test_replace();
    return hp_test_finish("test_model_contexts");
}
