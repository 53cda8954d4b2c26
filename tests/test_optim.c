/* Optimizers, LR schedule and gradient clipping against PyTorch: 3 steps of AdamW, SGD
 * (momentum + dampening + L2 decay, nesterov, plain) and Muon (+ AdamW fallback) on four
 * parameters, compared with torch.optim results stored by tools/golden/make_optim_golden.py;
 * clip_grad_norm_; TorchTitan LR factors; hand-computed single steps; config errors. */
// hp-test: ranks 1 timeout 60
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/optim.h"
#include "hyperparallel/safetensors.h"

#define NP 4
static const char *names[NP] = {"layers.0.attention.wq.weight", "layers.0.feed_forward.w2.weight",
                                "layers.0.ffn_norm.weight", "tok_embeddings.weight"};
static const int64_t shapes[NP][2] = {{5, 7}, {9, 4}, {7, 0}, {6, 5}};
static const int ndims[NP] = {2, 2, 1, 2};
static const double lr_factors[3] = {1.0, 0.5, 0.25};

static hp_safetensors_t gold;
static hp_param_t params[NP];

static void make_params(void) {
    for (int i = 0; i < NP; i++) {
        memset(&params[i], 0, sizeof params[i]);
        snprintf(params[i].name, sizeof params[i].name, "%s", names[i]);
        HP_ASSERT(hp_tensor_malloc(&params[i].value.local, HP_F32, ndims[i], shapes[i]) == HP_OK);
        HP_ASSERT(hp_tensor_malloc(&params[i].grad.local, HP_F32, ndims[i], shapes[i]) == HP_OK);
        for (int d = 0; d < ndims[i]; d++) {
            params[i].value.global_shape[d] = shapes[i][d];
            params[i].grad.global_shape[d] = shapes[i][d];
        }
    }
}

static void free_params(void) {
    for (int i = 0; i < NP; i++) {
        hp_tensor_free_data(&params[i].value.local);
        hp_tensor_free_data(&params[i].grad.local);
    }
}

static void load(const char *prefix, int i, hp_tensor_t *dst) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", prefix, names[i]);
    HP_CHECK_OK(hp_safetensors_read(gold, key, dst, 0));
}

static void load_init(void) {
    for (int i = 0; i < NP; i++) load("init", i, &params[i].value.local);
}

static void load_grads(int step) {
    char prefix[16];
    snprintf(prefix, sizeof prefix, "grad%d", step);
    for (int i = 0; i < NP; i++) load(prefix, i, &params[i].grad.local);
}

/* max |a - ref| over a tensor vs the stored reference; checks it is within atol + rtol|ref| */
static double compare(const char *prefix, int i, const hp_tensor_t *got, double rtol, double atol) {
    hp_tensor_t ref;
    HP_ASSERT(hp_tensor_malloc(&ref, HP_F32, got->ndim, got->shape) == HP_OK);
    load(prefix, i, &ref);
    double maxd = 0;
    int ok = hp_tensor_allclose(got, &ref, rtol, atol, &maxd);
    HP_CHECK(ok, "%s.%s: max |diff| %.3g beyond rtol %g atol %g", prefix, names[i], maxd, rtol, atol);
    hp_tensor_free_data(&ref);
    return maxd;
}

static void run(const hp_optim_config_t *cfg, const char *prefix, double rtol, double atol) {
    load_init();
    hp_optim_t opt = NULL;
    HP_CHECK_OK(hp_optim_create(cfg, params, NP, &opt));
    if (!opt) return;
    for (int s = 0; s < 3; s++) {
        load_grads(s);
        HP_CHECK_OK(hp_optim_step(opt, lr_factors[s]));
    }
    HP_CHECK(hp_optim_get_step(opt) == 3, "step count");
    double worst = 0;
    for (int i = 0; i < NP; i++) {
        double d = compare(prefix, i, &params[i].value.local, rtol, atol);
        if (d > worst) worst = d;
    }
    printf("%-14s max |C - torch| over all params after 3 steps: %.3g\n", prefix, worst);
    if (cfg->kind == HP_OPTIM_ADAMW) {
        HP_CHECK(hp_optim_num_states(opt) == 2 * NP, "AdamW has 2 state tensors per param");
        for (int k = 0; k < hp_optim_num_states(opt); k++) {
            int pi;
            const char *slot;
            hp_tensor_t st;
            hp_optim_state_at(opt, k, &pi, &slot, &st);
            char pre[64];
            snprintf(pre, sizeof pre, "adamw.%s", slot);
            compare(pre, pi, &st, 1e-5, 1e-7);
        }
    }
    hp_optim_free(opt);
}

static void test_against_torch(void) {
    hp_optim_config_t c = hp_optim_default(HP_OPTIM_ADAMW);
    c.lr = 1e-2;
    c.beta1 = 0.9;
    c.beta2 = 0.95;
    c.eps = 1e-8;
    c.weight_decay = 0.1;
    run(&c, "adamw", 1e-5, 2e-6);

    c = hp_optim_default(HP_OPTIM_SGD);
    c.lr = 0.1;
    c.momentum = 0.9;
    c.dampening = 0.1;
    c.weight_decay = 0.01;
    run(&c, "sgd_momentum", 1e-5, 1e-6);
    c.dampening = 0;
    c.weight_decay = 0;
    c.nesterov = 1;
    run(&c, "sgd_nesterov", 1e-5, 1e-6);
    c = hp_optim_default(HP_OPTIM_SGD);
    c.lr = 0.1;
    c.weight_decay = 0.01;
    run(&c, "sgd_plain", 1e-5, 1e-6);

    c = hp_optim_default(HP_OPTIM_MUON);
    c.lr = 0.02;
    c.weight_decay = 0.1;
    c.beta1 = 0.9;
    c.beta2 = 0.95;
    c.muon_adamw_lr = 3e-3;
    /* f32 Newton-Schulz vs the float64 restatement: the quintic amplifies rounding a little */
    run(&c, "muon", 1e-4, 2e-5);
}

static void test_muon_rule(void) {
    HP_CHECK(hp_optim_muon_applies(&params[0]) == 1, "wq uses Muon");
    HP_CHECK(hp_optim_muon_applies(&params[1]) == 1, "w2 uses Muon");
    HP_CHECK(hp_optim_muon_applies(&params[2]) == 0, "norm uses AdamW");
    HP_CHECK(hp_optim_muon_applies(&params[3]) == 0, "embedding uses AdamW");
    hp_param_t p = params[0];
    snprintf(p.name, sizeof p.name, "output.weight");
    HP_CHECK(hp_optim_muon_applies(&p) == 0, "output uses AdamW");
    snprintf(p.name, sizeof p.name, "model.layers.0.mlp.noutput.weight");
    HP_CHECK(hp_optim_muon_applies(&p) == 1, "suffix match is per name component");
    /* Muon takes sharded matrices (gathered, test_trainer_muon) but not a Partial value; the
     * message names the config key */
    p = params[0];
    p.value.mesh = (hp_mesh_t)&p;   /* never dereferenced: the Partial check comes first */
    p.value.mesh_ndim = 1;
    p.value.placements[0] = hp_partial(HP_SUM);
    hp_optim_config_t mc = hp_optim_default(HP_OPTIM_MUON);
    hp_optim_t o = NULL;
    HP_CHECK_ERR(hp_optim_create(&mc, &p, 1, &o), HP_ERR_UNSUPPORTED, "optimizer.name = muon");
    mc.muon_momentum = 1.0;
    HP_CHECK_ERR(hp_optim_create(&mc, params, 1, &o), HP_ERR_INVALID_ARG, "optimizer.momentum");
}

static void test_clip(void) {
    load_init();
    load_grads(0);
    double norm = 0;
    HP_CHECK_OK(hp_clip_grad_norm(params, NP, 0.5, NULL, 0, &norm));
    float ref_norm;
    HP_CHECK_OK(hp_safetensors_read_raw(gold, "clip.norm", &ref_norm, 4));
    HP_CHECK_CLOSE(norm, ref_norm, 1e-6, 0);
    for (int i = 0; i < NP; i++) compare("clip", i, &params[i].grad.local, 1e-6, 1e-8);
    /* below max_norm: unchanged */
    load_grads(0);
    float before = ((float *)params[1].grad.local.data)[3];
    HP_CHECK_OK(hp_clip_grad_norm(params, NP, 100.0, NULL, 0, &norm));
    HP_CHECK(((float *)params[1].grad.local.data)[3] == before, "no scaling below max_norm");
    /* non-finite */
    ((float *)params[2].grad.local.data)[0] = NAN;
    HP_CHECK_ERR(hp_clip_grad_norm(params, NP, 1.0, NULL, 0, &norm), HP_ERR_NUMERIC, "left unscaled");
    HP_CHECK(((float *)params[1].grad.local.data)[3] == before, "grads untouched on NaN");
    HP_CHECK_ERR(hp_clip_grad_norm(params, NP, 0.0, NULL, 0, &norm), HP_ERR_INVALID_ARG, "max_norm");
    /* a Partial gradient must be reduced first */
    hp_param_t p = params[0];
    p.grad.mesh = (hp_mesh_t)&p;   /* never dereferenced: the Partial check comes first */
    p.grad.mesh_ndim = 1;
    p.grad.placements[0] = hp_partial(HP_SUM);
    HP_CHECK_ERR(hp_grad_norm(&p, 1, NULL, 0, &norm), HP_ERR_STATE, "still Partial");
}

static void test_schedules(void) {
    struct { int64_t total, warmup; double ratio; hp_lr_decay_t d; double minf; } sc[] = {
        {10, 2, 0.8, HP_LR_DECAY_LINEAR, 0.0}, {20, 5, -1, HP_LR_DECAY_COSINE, 0.1},
        {10, 3, 0.5, HP_LR_DECAY_SQRT, 0.0},   {5, 10, 0.5, HP_LR_DECAY_LINEAR, 0.0},
        {10, 0, 0.0, HP_LR_DECAY_LINEAR, 0.0}, {9, 2, 0.25, HP_LR_DECAY_COSINE, 0.2},
    };
    for (int k = 0; k < (int)(sizeof sc / sizeof sc[0]); k++) {
        hp_lr_schedule_t s;
        HP_CHECK_OK(hp_lr_schedule_init(&s, sc[k].total, sc[k].warmup, sc[k].ratio, sc[k].d, sc[k].minf));
        float ref[32];
        char key[32];
        snprintf(key, sizeof key, "schedule%d", k);
        HP_CHECK_OK(hp_safetensors_read_raw(gold, key, ref, (size_t)sc[k].total * 4));
        for (int64_t i = 0; i < sc[k].total; i++)
            HP_CHECK(fabs(hp_lr_schedule_factor(&s, i) - ref[i]) < 1e-6, "schedule %d step %lld: %.7f vs torch %.7f",
                     k, (long long)i, hp_lr_schedule_factor(&s, i), ref[i]);
    }
    /* by hand, TorchTitan's debugmodel schedule: 10 steps, warmup 2, decay_ratio 0.8, linear */
    hp_lr_schedule_t s;
    HP_CHECK_OK(hp_lr_schedule_init(&s, 10, 2, 0.8, HP_LR_DECAY_LINEAR, 0.0));
    HP_CHECK(s.warmup_steps == 2 && s.decay_steps == 8 && s.stable_steps == 1, "step counts %lld %lld %lld",
             (long long)s.warmup_steps, (long long)s.stable_steps, (long long)s.decay_steps);
    HP_CHECK_CLOSE(hp_lr_schedule_factor(&s, 0), 0.5, 0, 1e-15);
    HP_CHECK_CLOSE(hp_lr_schedule_factor(&s, 1), 1.0, 0, 1e-15);
    HP_CHECK_CLOSE(hp_lr_schedule_factor(&s, 2), 1.0, 0, 1e-15);
    HP_CHECK_CLOSE(hp_lr_schedule_factor(&s, 3), 0.875, 0, 1e-15);
    HP_CHECK_CLOSE(hp_lr_schedule_factor(&s, 9), 0.125, 0, 1e-15);   /* last step stays above 0 */
    /* round half to even: 0.25 * 10 = 2.5 -> 2 decay steps */
    HP_CHECK_OK(hp_lr_schedule_init(&s, 10, 1, 0.25, HP_LR_DECAY_LINEAR, 0.0));
    HP_CHECK(s.decay_steps == 2, "round half even: %lld", (long long)s.decay_steps);
    HP_CHECK_ERR(hp_lr_schedule_init(&s, 0, 1, 0.5, HP_LR_DECAY_LINEAR, 0.0), HP_ERR_INVALID_ARG, "training steps");
    HP_CHECK_ERR(hp_lr_schedule_init(&s, 10, 1, 0.5, HP_LR_DECAY_LINEAR, 1.5), HP_ERR_INVALID_ARG, "min_lr_factor");
    hp_lr_decay_t d;
    HP_CHECK_OK(hp_lr_decay_from_name("cosine", &d));
    HP_CHECK(d == HP_LR_DECAY_COSINE, "cosine");
    HP_CHECK_ERR(hp_lr_decay_from_name("exp", &d), HP_ERR_INVALID_ARG, "linear, sqrt or cosine");
}

/* One AdamW step by hand: p=1, g=0.5, lr=0.1, wd=0.1, betas (0.9, 0.999), eps 1e-8:
 * p = 0.99; m = 0.05; v = 2.5e-4; step_size = 0.1/0.1 = 1; denom = sqrt(v)/sqrt(1e-3) + eps
 * = 0.5 + 1e-8; p = 0.99 - 0.05/denom = 0.89 (to 1e-7). SGD nesterov m=0.9, lr 0.1, g=0.5:
 * buf = 0.5, d = 0.5 + 0.45 = 0.95, p = 1 - 0.095 = 0.905. */
static void test_by_hand(void) {
    float pv = 1.0f, gv = 0.5f;
    hp_param_t p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "w");
    int64_t one[1] = {1};
    HP_CHECK_OK(hp_tensor_init(&p.value.local, HP_F32, 1, one, &pv));
    HP_CHECK_OK(hp_tensor_init(&p.grad.local, HP_F32, 1, one, &gv));
    hp_optim_config_t c = hp_optim_default(HP_OPTIM_ADAMW);
    c.lr = 0.1;
    c.weight_decay = 0.1;
    hp_optim_t o = NULL;
    HP_CHECK_OK(hp_optim_create(&c, &p, 1, &o));
    HP_CHECK_OK(hp_optim_step(o, 1.0));
    HP_CHECK_CLOSE(pv, 0.89, 0, 1e-6);
    HP_CHECK_ERR(hp_optim_step(o, -1.0), HP_ERR_INVALID_ARG, "lr factor");
    hp_optim_free(o);
    pv = 1.0f;
    c = hp_optim_default(HP_OPTIM_SGD);
    c.lr = 0.1;
    c.momentum = 0.9;
    c.nesterov = 1;
    HP_CHECK_OK(hp_optim_create(&c, &p, 1, &o));
    HP_CHECK_OK(hp_optim_step(o, 1.0));
    HP_CHECK_CLOSE(pv, 0.905, 0, 1e-7);
    hp_optim_free(o);
    /* config errors */
    c.dampening = 0.5;
    HP_CHECK_ERR(hp_optim_create(&c, &p, 1, &o), HP_ERR_INVALID_ARG, "nesterov");
    c = hp_optim_default(HP_OPTIM_ADAMW);
    c.beta2 = 1.0;
    HP_CHECK_ERR(hp_optim_create(&c, &p, 1, &o), HP_ERR_INVALID_ARG, "betas");
    c = hp_optim_default(HP_OPTIM_ADAMW);
    uint16_t bf = 0;
    hp_param_t q = p;
    HP_CHECK_OK(hp_tensor_init(&q.value.local, HP_BF16, 1, one, &bf));
    HP_CHECK_ERR(hp_optim_create(&c, &q, 1, &o), HP_ERR_INVALID_ARG, "contiguous f32");
    hp_optim_kind_t k;
    HP_CHECK_OK(hp_optim_kind_from_name("Muon", &k));
    HP_CHECK(k == HP_OPTIM_MUON, "muon by name");
    HP_CHECK_ERR(hp_optim_kind_from_name("lion", &k), HP_ERR_INVALID_ARG, "adamw, sgd or muon");
}

/* Two identical runs are bitwise equal (determinism), including Muon's BLAS path. */
static void test_deterministic(void) {
    float out[2][6 * 5 + 5 * 7];
    for (int r = 0; r < 2; r++) {
        load_init();
        hp_optim_config_t c = hp_optim_default(HP_OPTIM_MUON);
        hp_optim_t o = NULL;
        HP_CHECK_OK(hp_optim_create(&c, params, NP, &o));
        for (int s = 0; s < 3; s++) {
            load_grads(s);
            HP_CHECK_OK(hp_optim_step(o, 1.0));
        }
        memcpy(out[r], params[0].value.local.data, 35 * 4);
        memcpy(out[r] + 35, params[3].value.local.data, 30 * 4);
        hp_optim_free(o);
    }
    HP_CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0, "two runs differ");
}

/* Large parameters take the parallel paths (one region over all parameters): the norm equals
 * a serial f64 sum, and norm, clipping and AdamW are bitwise equal with 1 and 3 threads. */
static void test_threads(void) {
    enum { NB = 5 };
    const int64_t sizes[NB] = {70000, 3, 40000, 1, 123457};
    float out[2][NB];
    double norms[2];
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run == 0 ? 1 : 3);
        hp_param_t p[NB];
        memset(p, 0, sizeof p);
        double ss = 0;
        for (int i = 0; i < NB; i++) {
            snprintf(p[i].name, sizeof p[i].name, "p%d", i);
            HP_ASSERT(hp_tensor_malloc(&p[i].value.local, HP_F32, 1, &sizes[i]) == HP_OK);
            HP_ASSERT(hp_tensor_malloc(&p[i].grad.local, HP_F32, 1, &sizes[i]) == HP_OK);
            float *g = p[i].grad.local.data, *v = p[i].value.local.data;
            for (int64_t j = 0; j < sizes[i]; j++) {
                g[j] = (float)((j * 31 + i * 7) % 97) / 97.0f - 0.5f;
                v[j] = (float)((j * 17 + i) % 89) / 89.0f;
                ss += (double)g[j] * g[j];
            }
        }
        double norm;
        HP_CHECK_OK(hp_clip_grad_norm(p, NB, 1.0, NULL, 0, &norm));
        HP_CHECK_CLOSE(norm, sqrt(ss), 1e-12, 0);
        norms[run] = norm;
        hp_optim_t o = NULL;
        hp_optim_config_t c = hp_optim_default(HP_OPTIM_ADAMW);
        HP_CHECK_OK(hp_optim_create(&c, p, NB, &o));
        HP_CHECK_OK(hp_optim_step(o, 1.0));
        HP_CHECK_OK(hp_optim_step(o, 0.5));
        hp_optim_free(o);
        for (int i = 0; i < NB; i++) {
            out[run][i] = ((float *)p[i].value.local.data)[sizes[i] - 1] + ((float *)p[i].grad.local.data)[0];
            hp_tensor_free_data(&p[i].value.local);
            hp_tensor_free_data(&p[i].grad.local);
        }
    }
    omp_set_num_threads(1);
    HP_CHECK(norms[0] == norms[1], "norm differs with thread count: %.17g vs %.17g", norms[0], norms[1]);
    HP_CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0, "clip/AdamW results differ with thread count");
}

/* Optimizer state survives a save/load through safetensors: 2 steps, save values + states +
 * step, a fresh optimizer loads them and takes step 3; bitwise equal to 3 straight steps. */
static void test_state_round_trip(hp_optim_kind_t kind) {
    float ref[NP][64], got[NP][64];
    hp_optim_config_t c = hp_optim_default(kind);
    c.momentum = 0.9;   /* SGD keeps a buffer */
    for (int pass = 0; pass < 2; pass++) {
        load_init();
        hp_optim_t o = NULL;
        HP_CHECK_OK(hp_optim_create(&c, params, NP, &o));
        if (!o) return;
        for (int s = 0; s < 2; s++) {
            load_grads(s);
            HP_CHECK_OK(hp_optim_step(o, lr_factors[s]));
        }
        if (pass == 1) {
            char path[] = "/tmp/hp_test_optim_state_XXXXXX";
            int fd = mkstemp(path);
            HP_ASSERT(fd >= 0);
            close(fd);
            int ns = hp_optim_num_states(o);
            hp_st_entry_t e[NP + 3 * NP + 1];
            hp_tensor_t st[3 * NP];
            char keys[3 * NP][128];
            int k = 0;
            for (int i = 0; i < NP; i++) e[k++] = (hp_st_entry_t){names[i], &params[i].value.local, HP_ST_AUTO, NULL, 0, NULL};
            for (int j = 0; j < ns; j++) {
                int pi;
                const char *slot;
                hp_optim_state_at(o, j, &pi, &slot, &st[j]);
                snprintf(keys[j], sizeof keys[j], "optim.%s.%s", names[pi], slot);
                e[k++] = (hp_st_entry_t){keys[j], &st[j], HP_ST_AUTO, NULL, 0, NULL};
            }
            int64_t step = hp_optim_get_step(o);
            e[k++] = (hp_st_entry_t){"optim.step", NULL, HP_ST_I64, &step, 0, NULL};
            HP_CHECK_OK(hp_safetensors_write(path, e, k, NULL, 0));
            hp_optim_free(o);
            /* scramble, then restore into a fresh optimizer */
            for (int i = 0; i < NP; i++) HP_CHECK_OK(hp_tensor_fill(&params[i].value.local, 0.0));
            HP_CHECK_OK(hp_optim_create(&c, params, NP, &o));
            hp_safetensors_t f = NULL;
            HP_CHECK_OK(hp_safetensors_open(path, &f));
            if (!f) return;
            for (int i = 0; i < NP; i++) HP_CHECK_OK(hp_safetensors_read(f, names[i], &params[i].value.local, 0));
            for (int j = 0; j < hp_optim_num_states(o); j++) {
                int pi;
                const char *slot;
                hp_tensor_t t;
                char key[128];
                hp_optim_state_at(o, j, &pi, &slot, &t);
                snprintf(key, sizeof key, "optim.%s.%s", names[pi], slot);
                HP_CHECK_OK(hp_safetensors_read(f, key, &t, 0));
            }
            int64_t loaded = 0;
            HP_CHECK_OK(hp_safetensors_read_raw(f, "optim.step", &loaded, 8));
            hp_optim_set_step(o, loaded);
            hp_safetensors_close(f);
            unlink(path);
        }
        load_grads(2);
        HP_CHECK_OK(hp_optim_step(o, lr_factors[2]));
        for (int i = 0; i < NP; i++)
            memcpy(pass ? got[i] : ref[i], params[i].value.local.data, hp_tensor_nbytes(&params[i].value.local));
        hp_optim_free(o);
    }
    for (int i = 0; i < NP; i++)
        HP_CHECK(memcmp(ref[i], got[i], hp_tensor_nbytes(&params[i].value.local)) == 0,
                 "%s: state round trip changed %s", hp_optim_kind_name(kind), names[i]);
}

int main(void) {
    const char *src = getenv("HP_SOURCE_DIR");
    char p[512];
    snprintf(p, sizeof p, "%s/tests/data/golden_optim.safetensors", src ? src : "..");
    HP_CHECK_OK(hp_safetensors_open(p, &gold));
    if (!gold) return hp_test_finish("test_optim");
    make_params();
    test_against_torch();
    test_muon_rule();
    test_clip();
    test_schedules();
    test_by_hand();
    test_deterministic();
    test_threads();
    test_state_round_trip(HP_OPTIM_ADAMW);
    test_state_round_trip(HP_OPTIM_SGD);
    test_state_round_trip(HP_OPTIM_MUON);
    free_params();
    hp_safetensors_close(gold);
    return hp_test_finish("test_optim");
}
