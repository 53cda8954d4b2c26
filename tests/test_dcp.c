/* Distributed checkpoint: save on 4 ranks (Shard(0), Replicate, 2x2 [S(0),S(1)]), load on 2
 * ranks (sub-communicator), on a 2x2 mesh and on 1 rank with identical values; dedup of
 * replicated chunks; blobs (shared and per rank); strict / non-strict keys; wrong shape and
 * dtype; Partial refused; a StridedShard (FSDP x TP) layout saved and loaded across layouts; async save stages a snapshot while the tensors change; listing
 * skips partial directories; crafted corrupted checkpoints give errors, never a crash. */
// hp-test: ranks 1 4 timeout 120
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/dtensor.h"
#include "hyperparallel/mesh.h"

static hp_comm_t W;
static int R, N;
static char ROOT[256];

static float val(const char *name, int64_t flat) { return (float)(flat * 0.5 + (name[0] == 'b' ? 1000 : 0)) + 0.25f; }

/* The global tensor `name` of shape sh filled with val(). */
static hp_tensor_t global_of(const char *name, int nd, const int64_t *sh) {
    hp_tensor_t t;
    HP_ASSERT(hp_tensor_malloc(&t, HP_F32, nd, sh) == HP_OK);
    float *p = t.data;
    for (int64_t i = 0; i < hp_tensor_numel(&t); i++) p[i] = val(name, i);
    return t;
}

/* A DTensor of `name` on mesh m with placements pl, zero-filled (fill = 0) or holding the values. */
static hp_dtensor_t make(const char *name, int nd, const int64_t *sh, hp_mesh_t m, int np, const hp_placement_t *pl,
                         int fill) {
    hp_tensor_t g = global_of(name, nd, sh);
    hp_dtensor_t d;
    if (m) {
        HP_ASSERT(hp_dtensor_distribute(&d, NULL, &g, m, np, pl, -1) == HP_OK);
        hp_tensor_free_data(&g);
    } else {
        memset(&d, 0, sizeof d);
        d.local = g;
        d.owned = g.data;
        memcpy(d.global_shape, sh, sizeof(int64_t) * (size_t)nd);
    }
    if (!fill) hp_tensor_fill(&d.local, 0.0);
    return d;
}

/* Every local element equals the global value at its position (box layouts). */
static int check_values(const char *name, const hp_dtensor_t *d, const char *what) {
    if (d->mesh && !hp_mesh_contains_self(d->mesh)) return 1;
    int nd = d->local.ndim;
    int64_t off[HP_MAX_DIMS] = {0}, idx[HP_MAX_DIMS] = {0};
    HP_CHECK_OK(hp_dtensor_global_offset(d, off));
    const int64_t *gs = d->mesh ? d->global_shape : d->local.shape;
    int64_t n = hp_tensor_numel(&d->local);
    int bad = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t rem = k, flat = 0;
        for (int i = nd - 1; i >= 0; i--) {
            idx[i] = rem % d->local.shape[i];
            rem /= d->local.shape[i];
        }
        for (int i = 0; i < nd; i++) flat = flat * gs[i] + idx[i] + off[i];
        float v = *(float *)hp_tensor_ptr(&d->local, idx);
        if (v != val(name, flat)) bad++;
    }
    HP_CHECK(bad == 0, "%s: %s: %d wrong elements of %lld", what, name, bad, (long long)n);
    return bad == 0;
}

static void path(char *buf, size_t n, const char *rel) { snprintf(buf, n, "%s/%s", ROOT, rel); }

static const int64_t SA[2] = {10, 6}, SB[1] = {7}, SC[2] = {5, 8};

/* the 4-rank save: a = Shard(0) (uneven 3,3,3,1), b = Replicate, c on a 2x2 mesh [S(0), S(1)] */
static void save_four(hp_mesh_t m1, hp_mesh_t m2, const char *rel) {
    hp_placement_t s0 = hp_shard(0), r = hp_replicate(), s01[2] = {hp_shard(0), hp_shard(1)};
    hp_dtensor_t a = make("a", 2, SA, m1, 1, &s0, 1), b = make("b", 1, SB, m1, 1, &r, 1),
                 c = make("c", 2, SC, m2, 2, s01, 1);
    hp_dcp_tensor_t ts[3] = {{"a", &a, -1, 0}, {"b", &b, -1, 0}, {"c", &c, -1, 0}};
    char shared[16] = "shared-state", mine[16];
    snprintf(mine, sizeof mine, "rank-%d", R);
    hp_dcp_blob_t bl[2] = {{"train_state", shared, strlen(shared), 0, 0, 0}, {"dataloader", mine, strlen(mine), 0, 1, 0}};
    hp_dcp_state_t st = {ts, 3, bl, 2};
    char dir[512];
    path(dir, sizeof dir, rel);
    HP_CHECK_OK(hp_dcp_save(dir, &st, W));
    hp_dtensor_free(&a);
    hp_dtensor_free(&b);
    hp_dtensor_free(&c);
}

/* The 1-D mesh over every rank and, when m2 is not NULL, the 2-D one (2 x N/2; 1 x N below 4
 * ranks). */
static void meshes(hp_mesh_t *m1, hp_mesh_t *m2) {
    int64_t s4 = N, s22[2] = {N >= 4 ? 2 : 1, N >= 4 ? N / 2 : N};
    HP_CHECK_OK(hp_mesh_create(W, 1, &s4, NULL, m1));
    if (m2) HP_CHECK_OK(hp_mesh_create(W, 2, s22, NULL, m2));
}

static void test_reshard(void) {
    hp_mesh_t m1, m2;
    meshes(&m1, &m2);
    save_four(m1, m2, "step-10");
    char dir[512];
    path(dir, sizeof dir, "step-10");
    /* metadata: a has N chunks (one per rank), b one (dedup), c N */
    hp_dcp_metadata_t md;
    HP_CHECK_OK(hp_dcp_metadata_read(dir, &md));
    if (md) {
        const hp_dcp_entry_t *ea = hp_dcp_metadata_find(md, "a"), *eb = hp_dcp_metadata_find(md, "b");
        HP_CHECK(ea && ea->n_chunks == N && ea->ndim == 2 && ea->shape[0] == 10, "a: %d chunks", ea ? ea->n_chunks : -1);
        HP_CHECK(eb && eb->n_chunks == 1 && eb->chunks[0].rank == 0, "b replicated: written once by rank 0");
        HP_CHECK(hp_dcp_metadata_world_size(md) == N && hp_dcp_metadata_step(md) == 10, "world/step");
        hp_dcp_metadata_free(md);
    }
    hp_placement_t s0 = hp_shard(0), s1 = hp_shard(1), r = hp_replicate();
    /* same layout */
    {
        hp_dtensor_t a = make("a", 2, SA, m1, 1, &s0, 0), b = make("b", 1, SB, m1, 1, &s0, 0),
                     c = make("c", 2, SC, m1, 1, &s1, 0);
        hp_dcp_tensor_t ts[3] = {{"a", &a, -1, 0}, {"b", &b, -1, 0}, {"c", &c, -1, 0}};
        char sh[32] = {0}, mine[32] = {0};
        hp_dcp_blob_t bl[2] = {{"train_state", sh, 0, sizeof sh, 0, 0}, {"dataloader", mine, 0, sizeof mine, 1, 0}};
        hp_dcp_state_t st = {ts, 3, bl, 2};
        HP_CHECK_OK(hp_dcp_load(dir, &st, W, NULL));
        check_values("a", &a, "load S(0) same world");
        check_values("b", &b, "load R->S(0)");
        check_values("c", &c, "load [S0,S1] -> S(1)");
        char want[16];
        snprintf(want, sizeof want, "rank-%d", R);
        HP_CHECK(bl[0].loaded && bl[0].size == 12 && !memcmp(sh, "shared-state", 12), "shared blob");
        HP_CHECK(bl[1].loaded && bl[1].size == strlen(want) && !memcmp(mine, want, strlen(want)), "per-rank blob '%s'", mine);
        hp_dtensor_free(&a);
        hp_dtensor_free(&b);
        hp_dtensor_free(&c);
    }
    /* 2x2 mesh [S(0), S(1)] for a, [R, S(0)] for b */
    if (N >= 4) {
        hp_placement_t pa[2] = {s0, s1}, pb[2] = {r, s0}, pc[2] = {s1, s0};
        hp_dtensor_t a = make("a", 2, SA, m2, 2, pa, 0), b = make("b", 1, SB, m2, 2, pb, 0),
                     c = make("c", 2, SC, m2, 2, pc, 0);
        hp_dcp_tensor_t ts[3] = {{"a", &a, -1, 0}, {"b", &b, -1, 0}, {"c", &c, -1, 0}};
        hp_dcp_state_t st = {ts, 3, NULL, 0};
        hp_dcp_load_options_t o = {0, 0, NULL, 0, 0};   /* non-strict: blobs not requested */
        HP_CHECK_OK(hp_dcp_load(dir, &st, W, &o));
        check_values("a", &a, "load on 2x2 [S0,S1]");
        check_values("b", &b, "load on 2x2 [R,S0]");
        check_values("c", &c, "load on 2x2 [S1,S0]");
        hp_dtensor_free(&a);
        hp_dtensor_free(&b);
        hp_dtensor_free(&c);
    }
    /* 2 ranks (a sub-communicator emulates a smaller world) and 1 rank */
    for (int sub = 2; sub >= 1; sub--) {
        if (sub > N) continue;
        hp_comm_t c2 = NULL;
        HP_CHECK_OK(hp_comm_split(W, R < sub ? 0 : -1, R, &c2));
        if (c2) {
            hp_mesh_t ms;
            HP_CHECK_OK(hp_mesh_from_comm(c2, "dp", &ms));
            hp_dtensor_t a = make("a", 2, SA, ms, 1, &s0, 0), b = make("b", 1, SB, NULL, 0, NULL, 0),
                         c = make("c", 2, SC, ms, 1, &r, 0);
            hp_dcp_tensor_t ts[3] = {{"a", &a, -1, 0}, {"b", &b, -1, 0}, {"c", &c, -1, 0}};
            char sh[32] = {0}, mine[32] = {0};
            hp_dcp_blob_t bl[2] = {{"train_state", sh, 0, sizeof sh, 0, 0}, {"dataloader", mine, 0, sizeof mine, 1, 0}};
            hp_dcp_state_t st = {ts, 3, bl, 1};
            char what[64];
            snprintf(what, sizeof what, "load on %d rank(s)", sub);
            const char *exd[1] = {"dataloader"};
            hp_dcp_load_options_t so = {1, 0, exd, 1, 0};
            HP_CHECK_OK(hp_dcp_load(dir, &st, c2, &so));
            check_values("a", &a, what);
            check_values("b", &b, what);
            check_values("c", &c, what);
            HP_CHECK(bl[0].loaded && !memcmp(sh, "shared-state", 12), "%s: shared blob", what);
            /* a per-rank blob cannot be resharded */
            st.n_blobs = 2;
            if (sub != N)
                HP_CHECK_ERR(hp_dcp_load(dir, &st, c2, NULL), HP_ERR_INVALID_ARG, "cannot be resharded");
            hp_dtensor_free(&a);
            hp_dtensor_free(&b);
            hp_dtensor_free(&c);
            hp_mesh_destroy(ms);
            hp_comm_destroy(c2);
        }
    }
    hp_mesh_destroy(m2);
    hp_mesh_destroy(m1);
}


/* A 2-d DTensor with any placements (StridedShard too) built from the layout's index lists. */
static hp_dtensor_t make_idx(const char *name, const int64_t *sh, hp_mesh_t m, int np, const hp_placement_t *pl,
                             int fill) {
    int64_t ms[HP_MESH_MAX_DIMS], *idx[2], cnt[2];
    int coord[HP_MESH_MAX_DIMS] = {0};
    for (int i = 0; i < np; i++) ms[i] = hp_mesh_size(m, i);
    hp_mesh_get_coordinate(m, coord);
    for (int d = 0; d < 2; d++) {
        idx[d] = malloc(sizeof(int64_t) * (size_t)sh[d]);
        cnt[d] = hp_layout_dim_indices(sh[d], d, np, ms, coord, pl, idx[d]);
    }
    hp_tensor_t loc;
    HP_ASSERT(hp_tensor_malloc(&loc, HP_F32, 2, cnt) == HP_OK);
    float *p = loc.data;
    for (int64_t i = 0; i < cnt[0]; i++)
        for (int64_t j = 0; j < cnt[1]; j++) p[i * cnt[1] + j] = fill ? val(name, idx[0][i] * sh[1] + idx[1][j]) : 0.0f;
    hp_dtensor_t d;
    HP_ASSERT(hp_dtensor_from_local(&d, &loc, m, np, pl, sh) == HP_OK);
    d.owned = loc.data;
    free(idx[0]);
    free(idx[1]);
    return d;
}

static void check_idx(const char *name, const hp_dtensor_t *d, const char *what) {
    int64_t ms[HP_MESH_MAX_DIMS], *idx[2];
    int coord[HP_MESH_MAX_DIMS] = {0};
    for (int i = 0; i < d->mesh_ndim; i++) ms[i] = hp_mesh_size(d->mesh, i);
    hp_mesh_get_coordinate(d->mesh, coord);
    for (int k = 0; k < 2; k++) {
        idx[k] = malloc(sizeof(int64_t) * (size_t)d->global_shape[k]);
        hp_layout_dim_indices(d->global_shape[k], k, d->mesh_ndim, ms, coord, d->placements, idx[k]);
    }
    int bad = 0;
    const float *p = d->local.data;
    for (int64_t i = 0; i < d->local.shape[0]; i++)
        for (int64_t j = 0; j < d->local.shape[1]; j++)
            bad += p[i * d->local.shape[1] + j] != val(name, idx[0][i] * d->global_shape[1] + idx[1][j]);
    HP_CHECK(bad == 0, "%s: %s: %d wrong elements", what, name, bad);
    free(idx[0]);
    free(idx[1]);
}

/* StridedShard layouts on a 2x2 mesh, saved and loaded across layouts (several boxes per
 * rank). */
static void test_strided(void) {
    if (N < 4) return;
    hp_mesh_t m1, m2;
    meshes(&m1, &m2);
    /* [SS(0,2), S(1)]: dp rank 0 holds rows 0-2 and 6-8 (two boxes); [SS(0,2), S(0)] is
     * TorchTitan's FSDP-over-TP layout (one box: rows tp*6 + dp*3 ...) */
    hp_placement_t ss1[2] = {hp_strided_shard(0, 2), hp_shard(1)};
    hp_placement_t ss[2] = {hp_strided_shard(0, 2), hp_shard(0)}, s0 = hp_shard(0);
    int64_t sh[2] = {12, 6};
    hp_dtensor_t a = make_idx("s", sh, m2, 2, ss1, 1);
    hp_dcp_tensor_t ts[1] = {{"s", &a, -1, 0}};
    hp_dcp_state_t st = {ts, 1, NULL, 0};
    char dir[512], dir10[512];
    path(dir, sizeof dir, "step-20");
    path(dir10, sizeof dir10, "step-10");
    HP_CHECK_OK(hp_dcp_save(dir, &st, W));
    hp_dcp_metadata_t md = NULL;
    HP_CHECK_OK(hp_dcp_metadata_read(dir, &md));
    if (md) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_find(md, "s");
        HP_CHECK(e && e->n_chunks == 8, "strided: %d chunks, expected 8 (two row runs per rank)", e ? e->n_chunks : -1);
        hp_dcp_metadata_free(md);
    }
    /* into Shard(0) on 4 ranks and into a plain tensor on every rank */
    hp_dtensor_t b = make("s", 2, sh, m1, 1, &s0, 0), c = make("s", 2, sh, NULL, 0, NULL, 0);
    hp_dcp_tensor_t tb[1] = {{"s", &b, -1, 0}}, tc[1] = {{"s", &c, -1, 0}};
    hp_dcp_state_t sb = {tb, 1, NULL, 0}, sc = {tc, 1, NULL, 0};
    HP_CHECK_OK(hp_dcp_load(dir, &sb, W, NULL));
    check_values("s", &b, "strided -> S(0)");
    HP_CHECK_OK(hp_dcp_load(dir, &sc, W, NULL));
    check_values("s", &c, "strided -> whole");
    /* Shard(0)-saved "a" (10 rows, uneven) into the strided layout */
    int64_t sa[2] = {10, 6};
    hp_dtensor_t d = make_idx("a", sa, m2, 2, ss, 0);
    hp_dcp_tensor_t td[1] = {{"a", &d, -1, 0}};
    hp_dcp_state_t sd = {td, 1, NULL, 0};
    hp_dcp_load_options_t ns = {0, 0, NULL, 0, 0};
    HP_CHECK_OK(hp_dcp_load(dir10, &sd, W, &ns));
    check_idx("a", &d, "S(0) -> [SS(0,2), S(0)]");
    /* and the two-box layout back from the two-box save */
    hp_dtensor_t e2 = make_idx("s", sh, m2, 2, ss1, 0);
    hp_dcp_tensor_t te[1] = {{"s", &e2, -1, 0}};
    hp_dcp_state_t se = {te, 1, NULL, 0};
    HP_CHECK_OK(hp_dcp_load(dir, &se, W, NULL));
    check_idx("s", &e2, "[SS(0,2), S(1)] round trip");
    hp_dtensor_free(&e2);
    hp_dtensor_free(&a);
    hp_dtensor_free(&b);
    hp_dtensor_free(&c);
    hp_dtensor_free(&d);
    hp_mesh_destroy(m2);
    hp_mesh_destroy(m1);
}

static void test_errors(void) {
    hp_mesh_t m1;
    meshes(&m1, NULL);
    char dir[512];
    path(dir, sizeof dir, "step-10");
    hp_placement_t s0 = hp_shard(0), r = hp_replicate();
    hp_dtensor_t a = make("a", 2, SA, m1, 1, &s0, 0), b = make("b", 1, SB, m1, 1, &r, 0);
    int64_t bad[2] = {10, 7};
    hp_dtensor_t a7 = make("a", 2, bad, m1, 1, &s0, 0), x = make("x", 1, SB, m1, 1, &r, 0);
    /* strict: a missing key and unexpected keys are listed */
    hp_dcp_tensor_t t1[3] = {{"a", &a, -1, 0}, {"b", &b, -1, 0}, {"x", &x, -1, 0}};
    hp_dcp_state_t st = {t1, 3, NULL, 0};
    HP_CHECK_ERR(hp_dcp_load(dir, &st, W, NULL), HP_ERR_NOT_FOUND, "1 missing key(s): 'x'");
    HP_CHECK_ERR(hp_dcp_load(dir, &st, W, NULL), HP_ERR_NOT_FOUND, "'c', 'train_state', 'dataloader'");
    hp_dcp_load_options_t ns = {0, 0, NULL, 0, 0};
    HP_CHECK_OK(hp_dcp_load(dir, &st, W, &ns));
    HP_CHECK(t1[0].loaded && t1[1].loaded && !t1[2].loaded, "non-strict: a, b loaded, x skipped");
    check_values("a", &a, "non-strict");
    const char *ex[3] = {"c", "train_state", "dataloader"};
    hp_dcp_load_options_t exo = {1, 0, ex, 3, 0};
    st.n_tensors = 2;
    HP_CHECK_OK(hp_dcp_load(dir, &st, W, &exo));
    /* wrong shape */
    hp_dcp_tensor_t t2[1] = {{"a", &a7, -1, 0}};
    hp_dcp_state_t st2 = {t2, 1, NULL, 0};
    HP_CHECK_ERR(hp_dcp_load(dir, &st2, W, &ns), HP_ERR_INVALID_ARG, "has global shape (10, 6) in the checkpoint but (10, 7)");
    /* wrong dtype; allowed with conversion */
    hp_tensor_t bf;
    HP_ASSERT(hp_tensor_malloc(&bf, HP_BF16, 1, SB) == HP_OK);
    hp_dtensor_t bd;
    memset(&bd, 0, sizeof bd);
    bd.local = bf;
    hp_dcp_tensor_t t3[1] = {{"b", &bd, -1, 0}};
    hp_dcp_state_t st3 = {t3, 1, NULL, 0};
    HP_CHECK_ERR(hp_dcp_load(dir, &st3, W, &ns), HP_ERR_INVALID_ARG, "is f32 in the checkpoint but bf16");
    hp_dcp_load_options_t cv = {0, 1, NULL, 0, 0};
    HP_CHECK_OK(hp_dcp_load(dir, &st3, W, &cv));
    HP_CHECK(hp_bf16_to_f32(((hp_bf16_t *)bf.data)[3]) == hp_bf16_to_f32(hp_f32_to_bf16(val("b", 3))), "bf16 converted value");
    hp_tensor_free_data(&bf);
    /* Partial is refused */
    hp_tensor_t loc;
    HP_ASSERT(hp_tensor_malloc(&loc, HP_F32, 1, SB) == HP_OK);
    hp_placement_t p = hp_partial(HP_SUM);
    hp_dtensor_t pd;
    HP_CHECK_OK(hp_dtensor_from_local(&pd, &loc, m1, 1, &p, NULL));
    hp_dcp_tensor_t t4[1] = {{"p", &pd, -1, 0}};
    hp_dcp_state_t st4 = {t4, 1, NULL, 0};
    char d2[512];
    path(d2, sizeof d2, "step-99");
    HP_CHECK_ERR(hp_dcp_save(d2, &st4, W), HP_ERR_INVALID_ARG, "Partial placement");
    hp_tensor_free_data(&loc);
    hp_dtensor_free(&a);
    hp_dtensor_free(&b);
    hp_dtensor_free(&a7);
    hp_dtensor_free(&x);
    hp_mesh_destroy(m1);
}

static void test_async(void) {
    hp_mesh_t m1;
    meshes(&m1, NULL);
    hp_placement_t s0 = hp_shard(0);
    hp_dtensor_t a = make("a", 2, SA, m1, 1, &s0, 1);
    hp_dcp_tensor_t ts[1] = {{"a", &a, -1, 0}};
    hp_dcp_state_t st = {ts, 1, NULL, 0};
    hp_dcp_saver_t sv;
    HP_CHECK_OK(hp_dcp_saver_create(W, &sv));
    char dir[512], dir2[512];
    path(dir, sizeof dir, "async/step-1");
    path(dir2, sizeof dir2, "async/step-2");
    HP_CHECK_OK(hp_dcp_saver_save(sv, dir, &st));
    HP_CHECK(hp_dcp_saver_pending(sv), "pending after async save");
    hp_tensor_fill(&a.local, -1.0);   /* "training continues": the staged copy is what is saved */
    /* a second save waits for (and commits) the first */
    HP_CHECK_OK(hp_dcp_saver_save(sv, dir2, &st));
    struct stat sb;
    char m[600];
    snprintf(m, sizeof m, "%s/%s", dir, HP_DCP_METADATA_FILE);
    HP_CHECK(stat(m, &sb) == 0, "first async save committed before the second starts");
    int committed = 0;
    for (int i = 0; i < 2000 && !committed; i++) {
        HP_CHECK_OK(hp_dcp_saver_poll(sv, &committed));
        if (!committed) usleep(1000);
    }
    HP_CHECK(committed, "poll commits the second save");
    HP_CHECK_OK(hp_dcp_saver_destroy(sv));
    hp_dtensor_t b = make("a", 2, SA, m1, 1, &s0, 0);
    hp_dcp_tensor_t tb[1] = {{"a", &b, -1, 0}};
    hp_dcp_state_t sb2 = {tb, 1, NULL, 0};
    HP_CHECK_OK(hp_dcp_load(dir, &sb2, W, NULL));
    check_values("a", &b, "async save holds the values at save time");
    HP_CHECK_OK(hp_dcp_load(dir2, &sb2, W, NULL));
    HP_CHECK(((float *)b.local.data)[0] == -1.0f || hp_tensor_numel(&b.local) == 0, "second save holds the new values");
    /* listing: committed steps only */
    if (R == 0) {
        char p1[700], p2[700], folder[600];
        path(folder, sizeof folder, "async");
        snprintf(p1, sizeof p1, "%s/step-3.tmp-abc", folder);
        snprintf(p2, sizeof p2, "%s/step-4", folder);
        mkdir(p1, 0755);
        mkdir(p2, 0755);
        int64_t steps[8];
        int n = 0;
        HP_CHECK_OK(hp_dcp_list_steps(folder, steps, 8, &n));
        HP_CHECK(n == 2 && steps[0] == 1 && steps[1] == 2, "list: %d steps", n);
    }
    hp_dtensor_free(&a);
    hp_dtensor_free(&b);
    hp_mesh_destroy(m1);
}

/* ---- crafted bad checkpoints (rank 0, single process) ------------------------------------ */

/* Checksums across ranks: every rank's chunks get the checksum of what that rank wrote (the
 * gather maps them right, so a clean N-rank save verifies); a byte flipped in the last rank's
 * file is caught by hp_dcp_verify naming that file, and by a load on every rank. */
static void test_checksums(void) {
    hp_mesh_t m1, m2;
    meshes(&m1, &m2);
    save_four(m1, m2, "sums");
    char dir[512], fp[600], fn[64];
    path(dir, sizeof dir, "sums");
    snprintf(fn, sizeof fn, "__%d_0.safetensors", N - 1);
    snprintf(fp, sizeof fp, "%s/%s", dir, fn);
    if (R == 0) {
        HP_CHECK_OK(hp_dcp_verify(dir, 1));
        hp_dcp_metadata_t md = NULL;
        HP_CHECK_OK(hp_dcp_metadata_read(dir, &md));
        int with = 0, all = 0;
        for (int i = 0; md && i < hp_dcp_metadata_count(md); i++)
            for (int c = 0; c < hp_dcp_metadata_entry(md, i)->n_chunks; c++)
                with += hp_dcp_metadata_entry(md, i)->chunks[c].has_xxh3, all++;
        HP_CHECK(all > 0 && with == all, "%d of %d chunks have a checksum", with, all);
        hp_dcp_metadata_free(md);
        /* flip the first data byte of the last rank's file (its first chunk) */
        FILE *f = fopen(fp, "r+b");
        unsigned char h[8];
        HP_ASSERT(f && fread(h, 1, 8, f) == 8);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | h[i];
        fseek(f, (long)(8 + hl), SEEK_SET);
        int ch = fgetc(f);
        fseek(f, (long)(8 + hl), SEEK_SET);
        fputc(ch ^ 0x01, f);
        fclose(f);
        hp_status_t s = hp_dcp_verify(dir, 1);
        HP_CHECK(s == HP_ERR_FORMAT && strstr(hp_last_error(), fn) && strstr(hp_last_error(), "fails its checksum"),
                 "verify after a flip in %s: %s", fn, hp_last_error());
    }
    hp_barrier(W, NULL);
    hp_placement_t r = hp_replicate();
    hp_dtensor_t a = make("a", 2, SA, m1, 1, &r, 0), b = make("b", 1, SB, m1, 1, &r, 0), c = make("c", 2, SC, m1, 1, &r, 0);
    hp_dcp_tensor_t ts[3] = {{"a", &a, -1, 0}, {"b", &b, -1, 0}, {"c", &c, -1, 0}};
    hp_dcp_state_t st = {ts, 3, NULL, 0};
    hp_dcp_load_options_t ns = {0, 0, NULL, 0, 0};
    HP_CHECK(hp_dcp_load(dir, &st, W, &ns) == HP_ERR_FORMAT, "load of a corrupted %d-rank save: %s", N, hp_last_error());
    ns.skip_checksums = 1;
    HP_CHECK_OK(hp_dcp_load(dir, &st, W, &ns));
    hp_dtensor_free(&a);
    hp_dtensor_free(&b);
    hp_dtensor_free(&c);
    hp_mesh_destroy(m1);
    hp_mesh_destroy(m2);
}

static void write_file(const char *p, const void *data, size_t n) {
    FILE *f = fopen(p, "wb");
    HP_ASSERT(f);
    fwrite(data, 1, n, f);
    fclose(f);
}

static void test_corrupt(void) {
    if (R != 0) return;
    char dir[512], cmd[1400], mp[600], fp[600];
    path(dir, sizeof dir, "bad");
    int64_t sh[2] = {4, 3};
    hp_dtensor_t a = make("a", 2, sh, NULL, 0, NULL, 1);
    hp_dcp_tensor_t ts[1] = {{"a", &a, -1, 0}};
    hp_dcp_state_t st = {ts, 1, NULL, 0};
    HP_CHECK_OK(hp_dcp_save(dir, &st, NULL));
    snprintf(mp, sizeof mp, "%s/%s", dir, HP_DCP_METADATA_FILE);
    snprintf(fp, sizeof fp, "%s/__0_0.safetensors", dir);
    FILE *f = fopen(mp, "rb");
    char good[4096];
    size_t gl = fread(good, 1, sizeof good - 1, f);
    fclose(f);
    good[gl] = 0;
    HP_CHECK_OK(hp_dcp_load(dir, &st, NULL, NULL));
    /* truncated metadata */
    write_file(mp, good, gl / 2);
    HP_CHECK_ERR(hp_dcp_load(dir, &st, NULL, NULL), HP_ERR_FORMAT, "not valid JSON");
    /* bad magic, version, chunk out of bounds, missing coverage, path escape */
    struct { const char *from, *to, *needle; } edits[] = {
        {"hyperparallel-dcp", "pytorch-dcp", "not a hyperparallel checkpoint"},
        {"\"version\": 1", "\"version\": 7", "version 7"},
        {"\"F32\"", "\"Q8\"", "dtype \"Q8\""},
        {"\"sizes\": [\n", "\"sizes\": [ 9,\n", "has 3 entries, expected 2"},
        {"__0_0.safetensors", "../x.safetensors", "not a plain file name"},
        {"\"shape\": [\n", "\"shape\": [ 8,\n", "expected 3 (the tensor's ndim)"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char *at = strstr(good, edits[i].from);
        HP_CHECK(at != NULL, "edit %zu: '%s' not in the metadata", i, edits[i].from);
        if (!at) continue;
        char buf[4200];
        size_t pre = (size_t)(at - good);
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)pre, good, edits[i].to, at + strlen(edits[i].from));
        write_file(mp, buf, strlen(buf));
        hp_clear_error();
        hp_status_t s = hp_dcp_load(dir, &st, NULL, NULL);
        HP_CHECK(s != HP_OK && strstr(hp_last_error(), edits[i].needle), "edit %zu: %s: '%s'", i,
                 hp_status_string(s), hp_last_error());
    }
    /* sizes that do not cover the tensor */
    {
        char *at = strstr(good, "\"sizes\": [");
        HP_CHECK(at != NULL, "sizes present");
        if (at) {
            char buf[4200];
            char *digit = at + strlen("\"sizes\": [");
            while (*digit == ' ' || *digit == '\n') digit++;
            size_t pre = (size_t)(digit - good);
            snprintf(buf, sizeof buf, "%.*s2%s", (int)pre, good, digit + 1);   /* 4 -> 2 rows */
            write_file(mp, buf, strlen(buf));
            HP_CHECK_ERR(hp_dcp_load(dir, &st, NULL, NULL), HP_ERR_FORMAT, "incomplete checkpoint");
        }
    }
    /* metadata dtype that disagrees with the rank file (a mixed-up checkpoint) */
    {
        char *at = strstr(good, "\"F32\"");
        if (at) {
            char buf[4200];
            snprintf(buf, sizeof buf, "%.*s\"F16\"%s", (int)(at - good), good, at + 5);
            write_file(mp, buf, strlen(buf));
            HP_CHECK_ERR(hp_dcp_load(dir, &st, NULL, NULL), HP_ERR_INVALID_ARG, "is f16 in the checkpoint but f32");
            hp_dcp_load_options_t cv = {1, 1, NULL, 0, 0};
            HP_CHECK_ERR(hp_dcp_load(dir, &st, NULL, &cv), HP_ERR_FORMAT, "does not match the metadata chunk");
        }
    }
    write_file(mp, good, gl);
    /* truncated rank file */
    struct stat sb;
    stat(fp, &sb);
    HP_CHECK(truncate(fp, sb.st_size - 8) == 0, "truncate");
    hp_clear_error();
    hp_status_t s = hp_dcp_load(dir, &st, NULL, NULL);
    HP_CHECK(s == HP_ERR_FORMAT || s == HP_ERR_IO, "truncated rank file: %s '%s'", hp_status_string(s), hp_last_error());
    /* missing rank file */
    unlink(fp);
    HP_CHECK_ERR(hp_dcp_load(dir, &st, NULL, NULL), HP_ERR_IO, "__0_0.safetensors");
    /* a rank file from another save (different key) */
    hp_dtensor_t z = make("z", 2, sh, NULL, 0, NULL, 1);
    hp_dcp_tensor_t tz[1] = {{"z", &z, -1, 0}};
    hp_dcp_state_t sz = {tz, 1, NULL, 0};
    char d3[512];
    path(d3, sizeof d3, "bad2");
    HP_CHECK_OK(hp_dcp_save(d3, &sz, NULL));
    snprintf(cmd, sizeof cmd, "cp %s/__0_0.safetensors %s", d3, fp);
    HP_CHECK(system(cmd) == 0, "cp");
    HP_CHECK_ERR(hp_dcp_load(dir, &st, NULL, NULL), HP_ERR_FORMAT, "does not hold it");
    /* not a checkpoint at all */
    HP_CHECK_ERR(hp_dcp_load(ROOT, &st, NULL, NULL), HP_ERR_NOT_FOUND, "not a committed checkpoint");
    hp_dtensor_free(&a);
    hp_dtensor_free(&z);
}

int main(int argc, char **argv) {
    W = hp_test_mpi_init(&argc, &argv, &R, &N);
    if (R == 0) {
        snprintf(ROOT, sizeof ROOT, "/tmp/hp_test_dcp_XXXXXX");
        HP_ASSERT(mkdtemp(ROOT));
    }
    HP_ASSERT(hp_broadcast(ROOT, sizeof ROOT, HP_U8, 0, W, NULL) == HP_OK);
    test_reshard();
    test_strided();
    test_errors();
    test_async();
    test_checksums();
    test_corrupt();
    hp_barrier(W, NULL);
    if (R == 0 && !getenv("HP_KEEP")) hp_test_remove_dir(ROOT);
    return hp_test_mpi_finish("test_dcp");
}
