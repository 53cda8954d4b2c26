// The module protocol on its own: leaf modules (linear with a bias, two stacked weights as
// one fused linear, RMSNorm, embedding) driven through hp_module_forward /
// backward_input / backward_weight with a per-microbatch activation context; results equal
// the kernels called directly; two microbatch contexts in flight keep their own saved
// state; errors name the module and the expected shape.
// hp-test: ranks 1 timeout 60
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "hyperparallel/nn.h"
#include "hp_test.h"

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xFFFF) / 32768.0f - 1.0f;
}

static void make_param(hp_param_t *p, const char *name, float *value, float *grad, int64_t d0, int64_t d1) {
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof p->name, "%s", name);
    int64_t shape[2] = {d0, d1};
    int nd = d1 > 0 ? 2 : 1;
    HP_ASSERT(hp_tensor_init(&p->value.local, HP_F32, nd, shape, value) == HP_OK);
    HP_ASSERT(hp_tensor_init(&p->grad.local, HP_F32, nd, shape, grad) == HP_OK);
}

static void tensor2(hp_tensor_t *t, float *data, int64_t r, int64_t c) { hp_tensor_view2(t, data, r, c); }

int main(void) {
    uint32_t seed = 7;
    enum { N = 10, IC = 12, O1 = 5, O2 = 7, OC = O1 + O2 };
    // two params stacked in one buffer (as wq|wk or w1|w3), plus a bias
    float w[OC * IC], dw[OC * IC], b[OC], db[OC];
    for (int i = 0; i < OC * IC; i++) w[i] = frand(&seed);
    for (int i = 0; i < OC; i++) b[i] = frand(&seed);
    memset(dw, 0, sizeof dw);
    memset(db, 0, sizeof db);
    hp_param_t pw1, pw2, pb;
    make_param(&pw1, "fused.w1.weight", w, dw, O1, IC);
    make_param(&pw2, "fused.w2.weight", w + O1 * IC, dw + O1 * IC, O2, IC);
    make_param(&pb, "fused.bias", b, db, OC, 0);
    hp_module_t lin;
    hp_linear_impl_t lin_i;
    hp_param_t *stack[2] = {&pw1, &pw2};
    hp_linear_module_init(&lin, &lin_i, "fused", stack, 2, &pb, IC, OC);
    lin.id = 0;
    HP_CHECK(lin.n_params == 3 && strcmp(lin.ops->kind, "linear") == 0, "linear module params");

    float rw[OC], drw[OC];
    for (int i = 0; i < OC; i++) rw[i] = 1.0f + 0.1f * frand(&seed);
    memset(drw, 0, sizeof drw);
    hp_param_t prw;
    make_param(&prw, "norm.weight", rw, drw, OC, 0);
    hp_module_t norm;
    hp_rmsnorm_impl_t norm_i;
    hp_rmsnorm_module_init(&norm, &norm_i, "norm", &prw, OC, 1e-5f);
    norm.id = 1;

    // two microbatches in flight, each with its own activation context
    hp_act_t act[2];
    size_t bytes = lin.ops->act_bytes(&lin, 1, N) + norm.ops->act_bytes(&norm, 1, N);
    float x[2][N * IC], y[2][N * OC], z[2][N * OC], dz[2][N * OC], dy[2][N * OC], dx[2][N * IC];
    for (int mb = 0; mb < 2; mb++) {
        HP_CHECK_OK(hp_act_init(&act[mb], 2, bytes));
        act[mb].B = 1;
        act[mb].T = N;
        for (int i = 0; i < N * IC; i++) x[mb][i] = frand(&seed);
        for (int i = 0; i < N * OC; i++) dz[mb][i] = frand(&seed);
        hp_tensor_t tx, ty, tz;
        tensor2(&tx, x[mb], N, IC);
        tensor2(&ty, y[mb], N, OC);
        tensor2(&tz, z[mb], N, OC);
        HP_CHECK_OK(hp_module_forward(&lin, &act[mb], &tx, &ty));
        HP_CHECK_OK(hp_module_forward(&norm, &act[mb], &ty, &tz));
    }
    // backward of microbatch 1 first, then 0 (any order: the saved state is per context)
    for (int mb = 1; mb >= 0; mb--) {
        hp_tensor_t tdz, tdy, tdx;
        tensor2(&tdz, dz[mb], N, OC);
        tensor2(&tdy, dy[mb], N, OC);
        tensor2(&tdx, dx[mb], N, IC);
        HP_CHECK_OK(hp_module_backward_input(&norm, &act[mb], &tdz, &tdy));
        HP_CHECK_OK(hp_module_backward_input(&lin, &act[mb], &tdy, &tdx));
        HP_CHECK_OK(hp_module_backward_weight(&norm, &act[mb]));
        HP_CHECK_OK(hp_module_backward_weight(&lin, &act[mb]));
    }
    // the same through the kernels
    float ey[N * OC], ez[N * OC], rstd[N], edy[N * OC], edx[N * IC];
    float edw[OC * IC], edb[OC], edrw[OC];
    memset(edw, 0, sizeof edw);
    memset(edb, 0, sizeof edb);
    memset(edrw, 0, sizeof edrw);
    int ok_fwd = 1, ok_dx = 1;
    for (int mb = 1; mb >= 0; mb--) {
        hp_linear_forward(ey, x[mb], w, b, N, IC, OC);
        hp_rmsnorm_forward(ez, rstd, ey, rw, N, OC, 1e-5f);
        ok_fwd &= memcmp(ey, y[mb], sizeof ey) == 0 && memcmp(ez, z[mb], sizeof ez) == 0;
        hp_rmsnorm_backward_input(edy, dz[mb], ey, rw, rstd, N, OC, 0);
        hp_linear_backward_input(edx, edy, w, N, IC, OC, 0);
        hp_rmsnorm_backward_weight(edrw, dz[mb], ey, rstd, N, OC);
        hp_linear_backward_weight(edw, edb, edy, x[mb], N, IC, OC);
        ok_dx &= memcmp(edx, dx[mb], sizeof edx) == 0;
    }
    HP_CHECK(ok_fwd, "module forward differs from the kernels");
    HP_CHECK(ok_dx, "module backward_input differs from the kernels");
    HP_CHECK(memcmp(edw, dw, sizeof dw) == 0 && memcmp(edb, db, sizeof db) == 0 &&
             memcmp(edrw, drw, sizeof drw) == 0, "module weight grads differ from the kernels");

    // embedding module
    float ew[6 * 3], edw2[6 * 3], eout[4 * 3], egrad[4 * 3], ref[6 * 3];
    for (int i = 0; i < 18; i++) ew[i] = frand(&seed);
    for (int i = 0; i < 12; i++) egrad[i] = frand(&seed);
    memset(edw2, 0, sizeof edw2);
    memset(ref, 0, sizeof ref);
    hp_param_t pe;
    make_param(&pe, "tok_embeddings.weight", ew, edw2, 6, 3);
    hp_module_t emb;
    hp_embedding_impl_t emb_i;
    hp_embedding_module_init(&emb, &emb_i, "tok_embeddings", &pe, 6, 3);
    emb.id = 0;
    hp_act_t eact;
    HP_CHECK_OK(hp_act_init(&eact, 1, emb.ops->act_bytes(&emb, 1, 4)));
    eact.B = 1;
    eact.T = 4;
    int32_t tok[4] = {5, 0, 5, 2};
    int64_t tshape[2] = {1, 4};
    hp_tensor_t ttok, tout, tg;
    HP_CHECK_OK(hp_tensor_init(&ttok, HP_I32, 2, tshape, tok));
    tensor2(&tout, eout, 4, 3);
    tensor2(&tg, egrad, 4, 3);
    HP_CHECK_OK(hp_module_forward(&emb, &eact, &ttok, &tout));
    HP_CHECK(memcmp(eout + 3, ew, sizeof(float) * 3) == 0, "embedding row of token 0");
    HP_CHECK_OK(hp_module_backward_input(&emb, &eact, &tg, NULL));
    HP_CHECK_OK(hp_module_backward_weight(&emb, &eact));
    hp_ref_embedding_backward(ref, egrad, tok, 4, 3, 6);
    HP_CHECK(memcmp(ref, edw2, sizeof ref) == 0, "embedding module grads");
    tok[1] = 6;
    HP_CHECK_ERR(hp_module_forward(&emb, &eact, &ttok, &tout), HP_ERR_INVALID_ARG, "outside [0, 6)");

    // shape errors name the module
    hp_tensor_t bad;
    tensor2(&bad, x[0], N, IC + 1);
    hp_tensor_t ty;
    tensor2(&ty, y[0], N, OC);
    hp_act_reset(&act[0]);
    HP_CHECK_ERR(hp_module_forward(&lin, &act[0], &bad, &ty), HP_ERR_INVALID_ARG, "linear 'fused'");
    HP_CHECK_ERR(hp_module_forward(NULL, &act[0], &bad, &ty), HP_ERR_INVALID_ARG, "no forward");

    hp_act_free(&act[0]);
    hp_act_free(&act[1]);
    hp_act_free(&eact);
    return hp_test_finish("test_nn_modules");
}
