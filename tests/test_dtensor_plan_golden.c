/* Layout math and the greedy redistribute planner against PyTorch itself (2.15, fake process
 * group): tests/data/dtensor/plan_golden.txt holds _gen_transform_infos_non_cached's plans for
 * 320 seeded random cases on 8 meshes, for every rank; hp_redistribute_plan must give exactly
 * the same steps (mesh dim, source, target) and logical shapes. layout_golden.txt holds
 * compute_local_shape_and_global_offset for 150 cases x every rank, and _StridedShard's
 * pieces of arange(n). Regenerate with tests/data/dtensor/gen_{plan,layout}_golden.py. */
// hp-test: ranks 1
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hp_test.h"
#include "hyperparallel/dtensor.h"

static hp_placement_t parse_pl(const char *t) {
    if (t[0] == 'R') return hp_replicate();
    if (t[0] == 'P') return hp_partial(HP_SUM);
    return hp_shard(atoi(t + 1));
}

/* The next case line of a golden file (comments and blank lines skipped), split at spaces
 * into tok; returns the token count, -1 at the end. */
static int next_case(FILE *f, char *line, size_t cap, char **tok) {
    while (fgets(line, (int)cap, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        int nt = 0;
        for (char *p = strtok(line, " \n"); p && nt < 256; p = strtok(NULL, " \n")) tok[nt++] = p;
        return nt;
    }
    return -1;
}

/* A rank's coordinates on a row-major mesh of mnd dims of sizes ms. */
static void mesh_coord(int rank, int mnd, const int64_t *ms, int *coord) {
    for (int i = mnd - 1, q = rank; i >= 0; i--) {
        coord[i] = q % (int)ms[i];
        q /= (int)ms[i];
    }
}

static FILE *open_golden(const char *rel) {
    char path[1024];
    hp_test_source_path(path, sizeof path, rel);
    FILE *f = fopen(path, "r");
    HP_CHECK(f != NULL, "cannot open %s (set HP_SOURCE_DIR to the source tree)", path);
    return f;
}

/* plan_golden.txt: every plan's steps and logical shapes. Returns 0 when the file is missing. */
static int plan_golden(void) {
    FILE *f = open_golden("tests/data/dtensor/plan_golden.txt");
    if (!f) return 0;
    char line[4096], *tok[256];
    int lines = 0, steps_total = 0;
    while (next_case(f, line, sizeof line, tok) >= 0) {
        int k = 0;
        int mnd = atoi(tok[k++]);
        int64_t ms[HP_MESH_MAX_DIMS];
        for (int i = 0; i < mnd; i++) ms[i] = atoll(tok[k++]);
        int nd = atoi(tok[k++]);
        int64_t shape[HP_MAX_DIMS];
        for (int d = 0; d < nd; d++) shape[d] = atoll(tok[k++]);
        hp_placement_t src[HP_MESH_MAX_DIMS], dst[HP_MESH_MAX_DIMS];
        for (int i = 0; i < mnd; i++) src[i] = parse_pl(tok[k++]);
        for (int i = 0; i < mnd; i++) dst[i] = parse_pl(tok[k++]);
        int rank = atoi(tok[k++]);
        int nexp = atoi(tok[k++]);
        int coord[HP_MESH_MAX_DIMS];
        mesh_coord(rank, mnd, ms, coord);
        hp_transform_t steps[2 * HP_MESH_MAX_DIMS];
        int n = -1;
        HP_CHECK_OK(hp_redistribute_plan(steps, 2 * HP_MESH_MAX_DIMS, &n, nd, shape, mnd, ms, coord, src, dst));
        char a[96], b[96];
        hp_placements_str(mnd, src, a, sizeof a);
        hp_placements_str(mnd, dst, b, sizeof b);
        HP_CHECK(n == nexp, "line %d: %s -> %s rank %d: %d steps, PyTorch has %d", lines + 2, a, b, rank, n, nexp);
        for (int s = 0; s < nexp && s < n; s++) {
            int md = atoi(tok[k++]);
            hp_placement_t es = parse_pl(tok[k++]), ed = parse_pl(tok[k++]);
            int same = steps[s].mesh_dim == md && hp_placement_equal(steps[s].src, es) &&
                       hp_placement_equal(steps[s].dst, ed);
            for (int d = 0; d < nd; d++) same &= steps[s].logical_shape[d] == atoll(tok[k++]);
            HP_CHECK(same, "line %d: %s -> %s rank %d: step %d differs from PyTorch's", lines + 2, a, b, rank, s);
        }
        steps_total += n;
        lines++;
    }
    fclose(f);
    HP_CHECK(lines == 2080, "read %d plans", lines);
    printf("test_dtensor_plan_golden: %d plans, %d steps compared\n", lines, steps_total);
    return 1;
}

/* layout_golden.txt: local shapes and offsets (L lines) and _StridedShard's pieces (the rest). */
static void layout_golden(void) {
    FILE *f = open_golden("tests/data/dtensor/layout_golden.txt");
    if (!f) return;
    char line[4096], *tok[256];
    int nl = 0, nx = 0;
    while (next_case(f, line, sizeof line, tok) >= 0) {
        int k = 1;
        if (tok[0][0] == 'L') {
            int mnd = atoi(tok[k++]);
            int64_t ms[HP_MESH_MAX_DIMS], shape[HP_MAX_DIMS], ls[HP_MAX_DIMS], off[HP_MAX_DIMS];
            for (int i = 0; i < mnd; i++) ms[i] = atoll(tok[k++]);
            int nd = atoi(tok[k++]);
            for (int d = 0; d < nd; d++) shape[d] = atoll(tok[k++]);
            hp_placement_t pl[HP_MESH_MAX_DIMS];
            for (int i = 0; i < mnd; i++) pl[i] = parse_pl(tok[k++]);
            int rank = atoi(tok[k++]), coord[HP_MESH_MAX_DIMS];
            mesh_coord(rank, mnd, ms, coord);
            hp_layout_local_shape_and_offset(nd, shape, mnd, ms, coord, pl, ls, off);
            int same = 1;
            for (int d = 0; d < nd; d++) same &= ls[d] == atoll(tok[k + d]) && off[d] == atoll(tok[k + nd + d]);
            char a[96];
            HP_CHECK(same, "layout line %d: %s rank %d: local shape / offset differ from PyTorch's", nl + nx + 2,
                     hp_placements_str(mnd, pl, a, sizeof a), rank);
            nl++;
        } else {
            int64_t n = atoll(tok[k++]), ms = atoll(tok[k++]);
            int sf = atoi(tok[k++]), r = atoi(tok[k++]);
            int64_t cnt = atoll(tok[k++]), idx[64];
            hp_placement_t p = hp_strided_shard(0, sf);
            int64_t got = hp_layout_dim_indices(n, 0, 1, &ms, &r, &p, idx);
            int same = got == cnt;
            for (int64_t i = 0; same && i < cnt; i++) same = idx[i] == atoll(tok[k + i]);
            HP_CHECK(same, "strided n=%lld k=%lld sf=%d piece %d differs from PyTorch's", (long long)n,
                     (long long)ms, sf, r);
            nx++;
        }
    }
    fclose(f);
    HP_CHECK(nl == 900 && nx == 420, "read %d layouts and %d strided pieces", nl, nx);
    printf("test_dtensor_plan_golden: %d layouts and %d strided pieces compared\n", nl, nx);
}

int main(void) {
    if (plan_golden()) layout_golden();
    return hp_test_finish("test_dtensor_plan_golden");
}
