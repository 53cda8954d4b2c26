/* Muon under every layout (docs/optim.md "Muon under sharding").
 * (1) The optimizer alone: matrices sharded over a mesh as the parallelisms lay them out (FSDP
 * Shard(0) with uneven rows and with fewer rows than ranks, TP rowwise Shard(1); on 4 ranks
 * HSDP [Replicate, Shard(0)], FSDP over colwise TP [_StridedShard(0, 2), Shard(0)] and over
 * rowwise TP [Shard(0), Shard(1)]), tall and wide, next to a pipeline placeholder (global shape,
 * no local elements) and an AdamW norm, stepped 3 times from the same full gradients, equal
 * bitwise the single-rank Muon steps of the whole matrices (value and momentum): the gathered
 * update is the very matrix the single rank builds and Newton-Schulz runs the same f32 GEMMs on
 * it, so the bound is 0. Negative: one gradient element of the last rank x (1 + 1e-6) moves
 * rank 0's shard (Newton-Schulz mixes the whole matrix, so a shard-local Muon would not see it).
 * (2) The trainer with optimizer.name = muon, 10 steps against the single-rank run of the same
 * global batch: on 2 ranks FSDP 2, TP 2, EP 2 (qwen3_moe, dense FSDP 2) and PP 2 (1F1B); on 4
 * ranks FSDP 2 x TP 2 and PP 2 x FSDP 2. Bound: losses 1e-5 relative (1e-4 with TP), gradient
 * norms 1e-4 (1e-3 with TP). Why it holds: the gradients differ only by the fp32 order of their
 * reductions (~1e-7 relative; TP also splits the row-parallel K sums, ~1e-6), and both runs
 * orthogonalise the same full matrix with the same f32 Newton-Schulz, a fixed smooth polynomial
 * map; the update moves by the map's slope times those differences and the loss by g.dw of
 * that, first order in rounding, as for the AdamW trainer tests (docs/testing.md; measured
 * 8e-8). Negative: FSDP with lr x 1.001 leaves the loss bound (measured 4e-5). */
// hp-test: ranks 4 timeout 300 coretype 2
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hp_test_corpus.h"
#include "hyperparallel/config.h"
#include "hyperparallel/dtensor.h"
#include "hyperparallel/mesh.h"
#include "hyperparallel/optim.h"
#include "hyperparallel/trainer.h"

/* ---- (1) the optimizer step on sharded matrices --------------------------------------------- */

enum { NM = 4, STEPS = 3 };   // matrices per optimizer; steps
static const char *mat_names[NM] = {"layers.0.attention.wq.weight", "layers.0.feed_forward.w2.weight",
                                    "layers.1.attention.wo.weight", "layers.1.attention.wk.weight"};
/* tall (transposed), wide, tall; one row (Shard(0): one rank holds it all, the others none, and
 * every rank of the group must still take part in the gather) */
static const int64_t mat_shapes[NM][2] = {{7, 5}, {6, 10}, {12, 8}, {1, 6}};

static float value_at(int m, int64_t i) { return (float)sin(0.37 * (double)i + m) * 0.5f; }
static float grad_at(int m, int s, int64_t i) { return (float)cos(0.11 * (double)i * (s + 1) + 0.7 * m) * 0.1f; }

static void fill(hp_tensor_t *t, float (*f)(int, int64_t), int m) {
    for (int64_t i = 0; i < hp_tensor_numel(t); i++) ((float *)t->data)[i] = f(m, i);
}

static hp_optim_config_t muon_cfg(hp_muon_adjust_lr_t adjust) {
    hp_optim_config_t c = hp_optim_default(HP_OPTIM_MUON);
    c.lr = 0.02;
    c.adjust_lr = adjust;
    return c;
}

/* The single-rank reference: NM whole matrices and a norm, STEPS Muon steps. Writes the final
 * values and momentum buffers (whole) into ref_v / ref_b (NM x max numel). */
static void reference(hp_muon_adjust_lr_t adjust, float *ref_v, float *ref_b, int64_t stride) {
    hp_param_t ps[NM + 1];
    memset(ps, 0, sizeof ps);
    float *store[NM + 1][2];
    for (int m = 0; m <= NM; m++) {
        const int64_t shape[2] = {m < NM ? mat_shapes[m][0] : 5, m < NM ? mat_shapes[m][1] : 0};
        const int nd = m < NM ? 2 : 1;
        snprintf(ps[m].name, sizeof ps[m].name, "%s", m < NM ? mat_names[m] : "layers.0.ffn_norm.weight");
        for (int k = 0; k < 2; k++) {
            store[m][k] = calloc((size_t)(shape[0] * (nd == 2 ? shape[1] : 1)), sizeof(float));
            HP_CHECK_OK(hp_tensor_init(k ? &ps[m].grad.local : &ps[m].value.local, HP_F32, nd, shape, store[m][k]));
        }
        fill(&ps[m].value.local, value_at, m);
    }
    hp_optim_config_t c = muon_cfg(adjust);
    hp_optim_t o = NULL;
    HP_CHECK_OK(hp_optim_create(&c, ps, NM + 1, &o));
    for (int s = 0; o && s < STEPS; s++) {
        for (int m = 0; m <= NM; m++)
            for (int64_t i = 0; i < hp_tensor_numel(&ps[m].grad.local); i++)
                ((float *)ps[m].grad.local.data)[i] = grad_at(m, s, i);
        HP_CHECK_OK(hp_optim_step(o, 1.0));
    }
    for (int k = 0; o && k < hp_optim_num_states(o); k++) {
        int pi;
        const char *slot;
        hp_tensor_t st;
        hp_optim_state_at(o, k, &pi, &slot, &st);
        if (pi < NM) memcpy(ref_b + pi * stride, st.data, sizeof(float) * (size_t)hp_tensor_numel(&st));
    }
    for (int m = 0; m < NM; m++)
        memcpy(ref_v + m * stride, store[m][0], sizeof(float) * (size_t)(mat_shapes[m][0] * mat_shapes[m][1]));
    hp_optim_free(o);
    for (int m = 0; m <= NM; m++) free(store[m][0]), free(store[m][1]);
}

/* The same steps on shards of `mesh` with placements pl, a pipeline placeholder after the first
 * matrix; returns the number of elements (values and momentum, gathered whole) that differ from
 * the reference. perturb: the last rank's first local gradient element of matrix 0 x (1 + 1e-6)
 * at step 0 (the negative test; the count is then rank 0's own shard's). */
static int64_t sharded(hp_mesh_t mesh, const hp_placement_t *pl, hp_muon_adjust_lr_t adjust, const float *ref_v,
                       const float *ref_b, int64_t stride, int perturb, int *rank0_moved) {
    const int nmd = hp_mesh_ndim(mesh), P = NM + 2;   // matrices, the placeholder, the norm
    hp_param_t ps[NM + 2];
    memset(ps, 0, sizeof ps);
    float placeholder_dummy = 0;
    int idx[NM + 2];   // the matrix of each entry (-1 placeholder, NM norm)
    for (int e = 0, m = 0; e < P; e++) idx[e] = e == 1 ? -1 : m++;
    for (int e = 0; e < P; e++) {
        const int m = idx[e];
        if (m < 0) {   // as the pipeline builds it: world mesh, Replicate, global shape, no rows here
            snprintf(ps[e].name, sizeof ps[e].name, "layers.7.attention.wq.weight");
            hp_dtensor_t *d[2] = {&ps[e].value, &ps[e].grad};
            for (int k = 0; k < 2; k++) {
                d[k]->mesh = mesh;
                d[k]->mesh_ndim = nmd;
                for (int a = 0; a < nmd; a++) d[k]->placements[a] = hp_replicate();
                d[k]->global_shape[0] = 4;
                d[k]->global_shape[1] = 6;
                HP_CHECK_OK(hp_tensor_init(&d[k]->local, HP_F32, 2, (int64_t[]){0, 6}, &placeholder_dummy));
            }
            continue;
        }
        const int64_t shape[2] = {m < NM ? mat_shapes[m][0] : 5, m < NM ? mat_shapes[m][1] : 0};
        const int nd = m < NM ? 2 : 1;
        hp_placement_t rep[HP_MESH_MAX_DIMS];
        for (int a = 0; a < nmd; a++) rep[a] = hp_replicate();
        snprintf(ps[e].name, sizeof ps[e].name, "%s", m < NM ? mat_names[m] : "layers.0.ffn_norm.weight");
        hp_tensor_t full;
        float *buf = calloc((size_t)(shape[0] * (nd == 2 ? shape[1] : 1)), sizeof(float));
        HP_CHECK_OK(hp_tensor_init(&full, HP_F32, nd, shape, buf));
        fill(&full, value_at, m);
        HP_CHECK_OK(hp_dtensor_distribute(&ps[e].value, NULL, &full, mesh, nmd, nd == 2 ? pl : rep, -1));
        HP_CHECK_OK(hp_dtensor_distribute(&ps[e].grad, NULL, &full, mesh, nmd, nd == 2 ? pl : rep, -1));
        free(buf);
    }
    hp_optim_config_t c = muon_cfg(adjust);
    hp_optim_t o = NULL;
    HP_CHECK_OK(hp_optim_create(&c, ps, P, &o));
    for (int s = 0; o && s < STEPS; s++) {
        for (int e = 0; e < P; e++) {
            const int m = idx[e];
            if (m < 0) continue;
            const int nd = m < NM ? 2 : 1;
            const int64_t shape[2] = {m < NM ? mat_shapes[m][0] : 5, m < NM ? mat_shapes[m][1] : 0};
            float *buf = calloc((size_t)(shape[0] * (nd == 2 ? shape[1] : 1)), sizeof(float));
            hp_tensor_t full;
            HP_CHECK_OK(hp_tensor_init(&full, HP_F32, nd, shape, buf));
            for (int64_t i = 0; i < hp_tensor_numel(&full); i++) buf[i] = grad_at(m, s, i);
            hp_dtensor_t g;
            HP_CHECK_OK(hp_dtensor_distribute(&g, NULL, &full, mesh, nmd, ps[e].grad.placements, -1));
            memcpy(ps[e].grad.local.data, g.local.data, hp_tensor_nbytes(&g.local));
            hp_dtensor_free(&g);
            free(buf);
        }
        if (perturb && s == 0 && hp_comm_rank(hp_mesh_base_comm(mesh)) == hp_comm_size(hp_mesh_base_comm(mesh)) - 1 &&
            hp_tensor_numel(&ps[0].grad.local) > 0)
            ((float *)ps[0].grad.local.data)[0] *= 1.0f + 1e-6f;
        HP_CHECK_OK(hp_optim_step(o, 1.0));
    }
    int64_t bad = 0;
    *rank0_moved = 0;
    for (int e = 0; o && e < P; e++) {
        const int m = idx[e];
        if (m < 0 || m == NM) continue;
        int pi = -1;
        const char *slot;
        hp_tensor_t st;
        for (int k = 0; k < hp_optim_num_states(o) && pi != e; k++) hp_optim_state_at(o, k, &pi, &slot, &st);
        HP_CHECK(pi == e, "momentum buffer of %s", ps[e].name);
        // this rank's shard against the reference's entries at its global indices: rows / columns
        const int64_t R = mat_shapes[m][0], C = mat_shapes[m][1];
        int64_t ms[HP_MESH_MAX_DIMS], ri[64], ci[64];
        int coord[HP_MESH_MAX_DIMS];
        for (int a = 0; a < nmd; a++) ms[a] = hp_mesh_size(mesh, a);
        hp_mesh_get_coordinate(mesh, coord);
        const int64_t nr = hp_layout_dim_indices(R, 0, nmd, ms, coord, pl, ri);
        const int64_t nc = hp_layout_dim_indices(C, 1, nmd, ms, coord, pl, ci);
        HP_CHECK(nr == ps[e].value.local.shape[0] && nc == ps[e].value.local.shape[1], "local shape of %s", ps[e].name);
        for (int64_t r = 0; r < nr; r++)
            for (int64_t k = 0; k < nc; k++) {
                const float v = ((float *)ps[e].value.local.data)[r * nc + k], b = ((float *)st.data)[r * nc + k];
                const int64_t gi = ri[r] * C + ci[k];
                const int differs = memcmp(&v, &ref_v[m * stride + gi], sizeof v) != 0 ||
                                    memcmp(&b, &ref_b[m * stride + gi], sizeof b) != 0;
                bad += differs;
                if (m == 0 && hp_comm_rank(hp_mesh_base_comm(mesh)) == 0) *rank0_moved |= differs;
            }
    }
    hp_optim_free(o);
    for (int e = 0; e < P; e++)
        if (idx[e] >= 0) hp_dtensor_free(&ps[e].value), hp_dtensor_free(&ps[e].grad);
    return bad;
}

static void optimizer_cases(hp_comm_t world, int ws) {
    enum { STRIDE = 128 };
    float ref_v[2][NM * STRIDE], ref_b[2][NM * STRIDE];
    const hp_muon_adjust_lr_t adj[2] = {HP_MUON_ADJUST_ORIGINAL, HP_MUON_ADJUST_MATCH_RMS_ADAMW};
    for (int a = 0; a < 2; a++) reference(adj[a], ref_v[a], ref_b[a], STRIDE);
    hp_mesh_t m1 = NULL, m2 = NULL;
    HP_CHECK_OK(hp_mesh_create(world, 1, (int64_t[]){ws}, (const char *[]){"dp_shard"}, &m1));
    if (ws == 4) HP_CHECK_OK(hp_mesh_create(world, 2, (int64_t[]){2, 2}, (const char *[]){"dp_shard", "tp"}, &m2));
    const struct {
        const char *what;
        int two_d;
        hp_placement_t pl[2];
    } cases[] = {
        {"FSDP Shard(0)", 0, {{HP_SHARD, 0, HP_SUM, 1}}},
        {"TP rowwise Shard(1)", 0, {{HP_SHARD, 1, HP_SUM, 1}}},
        {"HSDP [Replicate, Shard(0)]", 1, {{HP_REPLICATE, 0, HP_SUM, 1}, {HP_SHARD, 0, HP_SUM, 1}}},
        {"FSDP x colwise TP [_StridedShard(0, 2), Shard(0)]", 1,
         {{HP_STRIDED_SHARD, 0, HP_SUM, 2}, {HP_SHARD, 0, HP_SUM, 1}}},
        {"FSDP x rowwise TP [Shard(0), Shard(1)]", 1, {{HP_SHARD, 0, HP_SUM, 1}, {HP_SHARD, 1, HP_SUM, 1}}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (cases[k].two_d && !m2) continue;
        for (int a = 0; a < 2; a++) {
            int moved;
            int64_t bad = sharded(cases[k].two_d ? m2 : m1, cases[k].pl, adj[a], ref_v[a], ref_b[a], STRIDE, 0, &moved);
            HP_CHECK(bad == 0, "%s (adjust %d): %lld entries differ from the single-rank Muon steps", cases[k].what, a,
                     (long long)bad);
            if (hp_comm_rank(world) == 0)
                printf("optimizer %s, adjust_lr %d: bitwise equal to one rank (%s)\n", cases[k].what, a,
                       bad ? "NO" : "yes");
        }
    }
    // negative: a 1e-6 change of one element on the last rank reaches rank 0's own shard
    int moved = 0;
    sharded(m1, cases[0].pl, adj[0], ref_v[0], ref_b[0], STRIDE, 1, &moved);
    HP_CHECK_OK(hp_broadcast(&moved, 1, HP_I32, 0, world, NULL));
    HP_CHECK(moved, "negative test: a 1e-6 change of the last rank's gradient did not move rank 0's shard");
    hp_mesh_destroy(m1);
    hp_mesh_destroy(m2);
}

/* ---- (2) the trainer ----------------------------------------------------------------------- */

enum { N = 10, B = 2, T = 16 };

static void small_llama(hp_config_t *c, int ws) {
    hp_test_small_config(c, ws, "llama3", 2);   // seq_len T
    c->training.local_batch_size = B;
    c->training.steps = N;
    c->validation.enable = false;
}

static void set_layout(hp_config_t *c, int dp, int tp, int ep, int pp) {
    snprintf(c->optimizer.name, sizeof c->optimizer.name, "muon");
    c->optimizer.lr = 0.01;   // Muon's usual scale: lr x 1.001 then moves the loss 4x past the bound
    snprintf(c->training.mixed_precision_param, sizeof c->training.mixed_precision_param, "float32");
    c->parallelism.data_parallel_replicate_degree = 1;
    c->parallelism.data_parallel_shard_degree = dp;
    c->parallelism.tensor_parallel_degree = tp;
    c->parallelism.expert_parallel_degree = ep;
    c->parallelism.pipeline_parallel_degree = pp;
    c->parallelism.pipeline_parallel_microbatch_size = 1;
}

/* Layout f (dp data-parallel ranks) against the single rank of the same global batch; returns
 * whether every loss is within rtol (checked unless expect_fail: the negative test, whose layout
 * runs with lr x lr_factor). */
static int check_vs_solo(const char *what, hp_config_t *f, hp_comm_t world, int dp, double rtol, double ntol,
                         double lr_factor, int expect_fail) {
    double sl[N], sn[N], fl[N], fn[N];
    hp_test_solo_steps(f, world, dp, N, sl, sn);
    hp_test_use_bin(f, 'x', dp);
    f->optimizer.lr *= lr_factor;
    hp_test_train_steps(f, world, N, fl, fn, 0);
    int ok = 1;
    double dl = 0, dn = 0;
    for (int i = 0; i < N; i++) {
        ok &= fabs(fl[i] - sl[i]) <= rtol * fabs(sl[i]);
        dl = fmax(dl, fabs(fl[i] - sl[i]) / fabs(sl[i]));
        dn = fmax(dn, fabs(fn[i] - sn[i]) / fabs(sn[i]));
        if (!expect_fail) {
            HP_CHECK_CLOSE(fl[i], sl[i], rtol, 0.0);
            HP_CHECK_CLOSE(fn[i], sn[i], ntol, 0.0);
        }
    }
    if (hp_comm_rank(world) == 0)
        printf("muon %s: losses %.6f .. %.6f (one rank %.6f .. %.6f), max rel diff loss %.1e norm %.1e\n", what, fl[0],
               fl[N - 1], sl[0], sl[N - 1], dl, dn);
    return ok;
}

static void trainer_cases(hp_comm_t world, int ws) {
    hp_config_t *c = calloc(1, sizeof *c);
    hp_test_write_dp_bins(world, 2, B, T, N);
    if (ws == 2) {
        hp_test_write_dp_bins(world, 1, B, T, N);
        small_llama(c, ws);
        set_layout(c, 2, 1, 1, 1);
        check_vs_solo("FSDP 2", c, world, 2, 1e-5, 1e-4, 1.0, 0);
        small_llama(c, ws);
        set_layout(c, 1, 2, 1, 1);
        check_vs_solo("TP 2", c, world, 1, 1e-4, 1e-3, 1.0, 0);
        small_llama(c, ws);
        set_layout(c, 1, 1, 1, 2);
        check_vs_solo("PP 2 (1F1B)", c, world, 1, 1e-5, 1e-4, 1.0, 0);
        hp_test_moe_config(c, ws, "qwen3_moe", N);
        c->validation.enable = false;
        set_layout(c, 2, 1, 2, 1);
        check_vs_solo("EP 2 (qwen3_moe, dense FSDP 2)", c, world, 2, 1e-5, 1e-4, 1.0, 0);
        // negative (STYLE rule 17): FSDP 2 with lr x 1.001 leaves the loss bound
        small_llama(c, ws);
        set_layout(c, 2, 1, 1, 1);
        const int within = check_vs_solo("FSDP 2, lr x 1.001 (negative)", c, world, 2, 1e-5, 1e-4, 1.001, 1);
        HP_CHECK(!within, "negative test: lr x 1.001 under FSDP 2 stays within the 1e-5 loss bound");
    } else {
        small_llama(c, ws);
        set_layout(c, 2, 2, 1, 1);
        check_vs_solo("FSDP 2 x TP 2", c, world, 2, 1e-4, 1e-3, 1.0, 0);
        small_llama(c, ws);   // each stage's matrices gathered over its own dp_shard pair, the others' placeholders
        set_layout(c, 2, 1, 1, 2);
        check_vs_solo("PP 2 x FSDP 2 (1F1B)", c, world, 2, 1e-5, 1e-4, 1.0, 0);
    }
    free(c);
}

int main(int argc, char **argv) {
    int rank, ws;
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank, &ws);
    if (ws != 2 && ws != 4) {
        if (rank == 0) printf("SKIP: test_trainer_muon runs on 2 or 4 ranks\n");
        hp_comm_finalize();
        return 0;
    }
    optimizer_cases(world, ws);
    hp_test_make_corpus(world, "hp_test_trainer_muon");
    trainer_cases(world, ws);
    int rc = hp_test_finish("test_trainer_muon");
    hp_test_remove_corpus(world);
    hp_comm_finalize();
    return rc;
}
