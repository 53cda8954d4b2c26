/* 2-D: TP inside (TorchTitan's llama3 plan on the mesh's tp dim), FSDP outside (fully_shard
 * over dp_shard) on a (dp_shard 2, tp 2) mesh (4 ranks); 3-D: HSDP over (dp_replicate 2,
 * dp_shard 2) outside TP 2 (8 ranks). 10 SGD steps on llama3 debugmodel shapes (2 layers,
 * vocabulary 302 so the FSDP chunks of TP shards are uneven), each dp rank its own sequence (B = 1,
 * T = 16), equal the single-rank run of the global batch (B = 2 or 4) computed on rank 0:
 * global losses rel 2e-5 at every step; gradients at steps 1 and 10 within 2e-5 of each
 * parameter's largest |g|, taken as full_tensor of FSDP's sharded gradient DTensor on the
 * (dp..., tp) mesh; the gradient norm over hp_fsdp_grad_comms equals the reference's (rel
 * 1e-5). The sharded layout is PyTorch's: placements (_StridedShard(0, 2), Shard(0)) for TP
 * Shard(0) weights, (Shard(0), Shard(1)) for TP Shard(1), (Shard(0), Replicate()) for the
 * rest (HSDP: Replicate() first), global shape the full parameter's, local shape the layout's;
 * full_tensor of the initial values equals the reference weights bitwise. With and without
 * sequence parallel + loss_parallel. */
// hp-test: ranks 4 8 timeout 240 coretype 4
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/fsdp.h"
#include "hyperparallel/mesh.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/optim.h"
#include "hyperparallel/tp.h"

#define T 16
#define STEPS 10

static hp_comm_t g_world;
static int g_rank;

static int NB;   /* sequences in the global batch = dp ranks */

static void batch(int step, int V, int32_t *tok, int32_t *tgt) {
    uint32_t s = 4242u + 131u * (uint32_t)step;
    for (int i = 0; i < NB * T; i++) {
        s = s * 1664525u + 1013904223u;
        tok[i] = (int32_t)((s >> 8) % (uint32_t)V);
    }
    for (int i = 0; i < NB * T; i++) tgt[i] = (i % T == T - 1) ? tok[(i + 1) % (NB * T)] : tok[i + 1];
    tgt[3] = HP_IGNORE_INDEX;
}

static void sgd(hp_param_t *P, int n, float lr) {
    for (int i = 0; i < n; i++) {
        float *w = P[i].value.local.data;
        const float *g = P[i].grad.local.data;
        int64_t k = hp_tensor_numel(&P[i].value.local);
        for (int64_t j = 0; j < k; j++) w[j] -= lr * g[j];
    }
}

/* PyTorch's FSDP-over-TP placements, shapes, and full_tensor of the initial weights. */
static void check_layout(const hp_param_t *fp, const hp_param_t *tpp, int n, hp_model_t ref, hp_mesh_t dp,
                         const char *what) {
    const int nd = hp_mesh_ndim(dp);
    for (int i = 0; i < n; i++) {
        const hp_dtensor_t *v = &fp[i].value, *t = &tpp[i].value;
        char b1[128], b2[128];
        HP_CHECK(v->mesh_ndim == nd + 1, "%s %s: mesh of %d dims", what, fp[i].name, v->mesh_ndim);
        hp_placement_t want[3];
        want[0] = hp_replicate();
        want[nd - 1] = hp_shard(0);
        want[nd] = t->placements[0];
        if (t->placements[0].kind == HP_SHARD && t->placements[0].dim == 0) want[nd - 1] = hp_strided_shard(0, 2);
        int same = v->mesh_ndim == nd + 1;
        for (int d = 0; same && d <= nd; d++) same = hp_placement_equal(v->placements[d], want[d]);
        HP_CHECK(same, "%s %s: placements %s, expected %s", what, fp[i].name,
                 hp_placements_str(v->mesh_ndim, v->placements, b1, sizeof b1),
                 hp_placements_str(nd + 1, want, b2, sizeof b2));
        int64_t ls[HP_MAX_DIMS], off[HP_MAX_DIMS];
        HP_CHECK_OK(hp_dtensor_compute_local_shape_and_offset(ls, off, v->local.ndim, v->global_shape, v->mesh,
                                                             v->mesh_ndim, v->placements));
        for (int a = 0; a < v->local.ndim; a++) {
            HP_CHECK(v->global_shape[a] == t->global_shape[a], "%s %s: global shape[%d] %lld, expected %lld", what,
                     fp[i].name, a, (long long)v->global_shape[a], (long long)t->global_shape[a]);
            HP_CHECK(ls[a] == v->local.shape[a], "%s %s: local shape[%d] %lld, layout says %lld", what, fp[i].name,
                     a, (long long)v->local.shape[a], (long long)ls[a]);
        }
        hp_tensor_t full;
        void *owned = NULL;
        HP_CHECK_OK(hp_dtensor_full_tensor(&full, &owned, NULL, v));
        hp_param_t *r = ref ? hp_model_find_param(ref, fp[i].name) : NULL;
        if (r && owned)
            HP_CHECK(memcmp(full.data, r->value.local.data, sizeof(float) * (size_t)hp_tensor_numel(&r->value.local)) == 0,
                     "%s %s: full_tensor of the sharded value differs from the reference weights", what, fp[i].name);
        free(owned);
    }
}

static void run(hp_mesh_t dp, hp_comm_t loss_comm, int dpr, hp_mesh_t tpm, int sp) {
    char what[64];
    snprintf(what, sizeof(what), "tp2 x %s sp%d lp%d", NB == 2 ? "fsdp2" : "hsdp2x2", sp, sp);
    hp_model_config_t c;
    HP_ASSERT(hp_model_flavor("llama3", "debugmodel", &c) == HP_OK);
    c.n_layers = 2;
    c.vocab_size = 302;   // 151 rows per TP rank: uneven FSDP chunks (76 + 75) of the embedding and output
    hp_model_t ref = NULL, m = NULL;
    if (g_rank == 0) {
        HP_CHECK_OK(hp_model_create(&c, NB, T, &ref));
        HP_CHECK_OK(hp_model_init_weights(ref, 11));
    }
    HP_CHECK_OK(hp_model_create(&c, 1, T, &m));
    hp_tp_plan_entry_t plan[32];
    int np = hp_model_spec_find(c.name)->tp_plan(&c, sp, sp, plan, 32);
    hp_tp_t tp = NULL;
    HP_CHECK_OK(hp_tp_parallelize_model(&tp, m, tpm, plan, np));
    HP_CHECK_OK(hp_model_init_weights(m, 11));
    // the TP layout of every parameter (kept: FSDP re-points only the data pointers)
    const int n = hp_model_num_params(m);
    hp_param_t *tpp = malloc(sizeof(hp_param_t) * (size_t)n);
    memcpy(tpp, hp_model_params(m), sizeof(hp_param_t) * (size_t)n);
    hp_fsdp_options_t fo = hp_fsdp_default_options();
    fo.gradient_divide_factor = 1.0;
    hp_fsdp_t f = NULL;
    HP_CHECK_OK(hp_fully_shard(m, dp, &fo, &f));
    if (!f || !tp) return;
    hp_param_t *fp = hp_fsdp_params(f);
    check_layout(fp, tpp, n, ref, dp, what);
    int32_t tok[4 * T], tgt[4 * T];
    for (int step = 1; step <= STEPS; step++) {
        batch(step, c.vocab_size, tok, tgt);
        int valid = 0;
        for (int i = 0; i < NB * T; i++) valid += tgt[i] != HP_IGNORE_INDEX;
        float lref = 0, l = 0, lg = 0;
        if (ref) {
            HP_CHECK_OK(hp_model_zero_grad(ref));
            HP_CHECK_OK(hp_model_forward(ref, tok, tgt, NB, T, (float)valid, &lref));
            HP_CHECK_OK(hp_model_backward(ref));
        }
        HP_CHECK_OK(hp_fsdp_zero_grad(f));
        HP_CHECK_OK(hp_model_forward(m, tok + dpr * T, tgt + dpr * T, 1, T, (float)valid, &l));
        HP_CHECK_OK(hp_model_backward(m));
        HP_CHECK_OK(hp_all_reduce(&l, &lg, 1, HP_F32, HP_SUM, loss_comm, NULL));
        HP_CHECK_OK(hp_broadcast(&lref, 1, HP_F32, 0, g_world, NULL));
        HP_CHECK_CLOSE(lg, lref, 2e-5, 0);
        if (step == 1 || step == STEPS) {
            double worst = 0;
            const char *wn = "";
            for (int i = 0; i < n; i++) {
                hp_tensor_t full;
                void *owned = NULL;
                HP_CHECK_OK(hp_dtensor_full_tensor(&full, &owned, NULL, &fp[i].grad));   // over (dp..., tp)
                hp_param_t *r = ref ? hp_model_find_param(ref, tpp[i].name) : NULL;
                if (r && owned) {
                    const float *a = full.data, *b = r->grad.local.data;
                    double mx = 0, df = 0;
                    for (int64_t j = 0; j < hp_tensor_numel(&r->grad.local); j++) {
                        mx = fmax(mx, fabs(b[j]));
                        df = fmax(df, fabs((double)a[j] - b[j]));
                    }
                    if (df / (mx > 0 ? mx : 1) > worst) { worst = df / (mx > 0 ? mx : 1); wn = tpp[i].name; }
                }
                free(owned);
            }
            hp_comm_t comms[3];
            int ncomm = hp_fsdp_grad_comms(f, comms);
            HP_CHECK(ncomm == (NB == 2 ? 2 : 3), "%s: %d gradient-norm communicators", what, ncomm);
            double norm = 0, rnorm = 0;
            HP_CHECK_OK(hp_grad_norm(fp, n, comms, ncomm, &norm));
            if (ref) HP_CHECK_OK(hp_grad_norm(hp_model_params(ref), hp_model_num_params(ref), NULL, 0, &rnorm));
            HP_CHECK_OK(hp_broadcast(&rnorm, 1, HP_I64, 0, g_world, NULL));
            HP_CHECK_CLOSE(norm, rnorm, 1e-5, 0);
            if (ref) {
                HP_CHECK(worst <= 2e-5, "%s step %d: worst gradient error %.3g at %s", what, step, worst, wn);
                printf("%s step %d: loss %.7f ref %.7f, worst grad rel err %.3g (%s), norm %.6f ref %.6f\n", what,
                       step, lg, lref, worst, wn, norm, rnorm);
            }
        }
        if (ref) sgd(hp_model_params(ref), hp_model_num_params(ref), 0.05f);
        sgd(fp, hp_fsdp_num_params(f), 0.05f);
    }
    hp_fsdp_destroy(f);
    hp_tp_destroy(tp);
    hp_model_destroy(m);
    if (ref) hp_model_destroy(ref);
    free(tpp);
}

int main(int argc, char **argv) {
    g_world = hp_test_mpi_init(&argc, &argv, &g_rank, NULL);
    omp_set_num_threads(1);
    const int W = hp_comm_size(g_world);
    if (W != 4 && W != 8) {
        printf("SKIP: test_tp_fsdp needs 4 or 8 ranks\n");
        hp_comm_finalize();
        return 0;
    }
    NB = W / 2;
    int64_t shape[3] = {2, 2, 2};
    const char *names[3] = {"dp_replicate", "dp_shard", "tp"};
    const int nd = W == 8 ? 3 : 2;
    const char *const *nm = W == 8 ? names : names + 1;
    hp_mesh_t mesh = NULL, dp = NULL, tpm = NULL, batch_mesh = NULL;
    HP_ASSERT(hp_mesh_create(g_world, nd, shape, nm, &mesh) == HP_OK);
    HP_ASSERT(hp_mesh_slice(mesh, nd - 1, nm, &dp) == HP_OK);            // FSDP (dp_shard) or HSDP (rep, shard)
    HP_ASSERT(hp_mesh_slice(mesh, 1, nm + nd - 1, &tpm) == HP_OK);
    HP_ASSERT(hp_mesh_flatten(mesh, nd - 1, nm, "batch", &batch_mesh) == HP_OK);
    const int dpr = hp_mesh_get_local_rank(batch_mesh, 0);
    hp_comm_t loss_comm = hp_mesh_get_comm(batch_mesh, 0);
    run(dp, loss_comm, dpr, tpm, 0);
    run(dp, loss_comm, dpr, tpm, 1);
    hp_mesh_destroy(batch_mesh);
    hp_mesh_destroy(tpm);
    hp_mesh_destroy(dp);
    hp_mesh_destroy(mesh);
    int rc = hp_test_finish("test_tp_fsdp");
    hp_comm_finalize();
    return rc;
}
