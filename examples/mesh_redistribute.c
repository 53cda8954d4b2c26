/* `make demo` example (4 ranks): a 2x2 ("dp", "tp") device mesh, a 5x6 matrix distributed
 * as [Shard(0), Shard(1)] (uneven rows: 3 + 2), then redistributed to [Replicate, Replicate]
 * and to [Shard(1), Shard(1)]; prints each rank's local piece in rank order and the
 * collectives each redistribute issued. Run: mpirun -np 4 example_mesh_redistribute */
#include <stdio.h>
#include <string.h>

#include "hyperparallel/dtensor.h"

#define LINE 1024
static hp_comm_t W;

/* Rank 0 prints every rank's text in rank order (gathered, so lines never interleave). */
static void print_ordered(const char *mine) {
    static char all[64 * LINE];
    char buf[LINE];
    snprintf(buf, sizeof buf, "%s", mine);
    int n = hp_comm_size(W);
    if (n > 64) return;
    HP_ASSERT(hp_gather(buf, all, LINE, HP_U8, 0, W, NULL) == HP_OK);
    if (hp_comm_rank(W) == 0)
        for (int r = 0; r < n; r++) printf("%s", all + r * LINE);
    fflush(stdout);
}

static void show(const char *title, const hp_dtensor_t *t) {
    char text[LINE], pl[96], sh[64];
    size_t used = (size_t)snprintf(text, sizeof text, "  rank %d coord (%d,%d) %s local %s:",
                                   hp_comm_rank(W), hp_mesh_get_local_rank(t->mesh, 0),
                                   hp_mesh_get_local_rank(t->mesh, 1),
                                   hp_placements_str(t->mesh_ndim, t->placements, pl, sizeof pl),
                                   hp_tensor_shape_str(&t->local, sh, sizeof sh));
    int64_t rows = t->local.shape[0], cols = t->local.shape[1];
    for (int64_t i = 0; i < rows && used < sizeof text; i++) {
        used += (size_t)snprintf(text + used, sizeof text - used, " [");
        for (int64_t j = 0; j < cols && used < sizeof text; j++)
            used += (size_t)snprintf(text + used, sizeof text - used, "%s%g", j ? " " : "",
                                     ((float *)t->local.data)[i * cols + j]);
        if (used < sizeof text) used += (size_t)snprintf(text + used, sizeof text - used, "]");
    }
    if (used < sizeof text) snprintf(text + used, sizeof text - used, "\n");
    if (hp_comm_rank(W) == 0) printf("%s\n", title);
    fflush(stdout);
    print_ordered(text);
}

static void show_counts(const char *what) {
    hp_comm_counts_t c;
    hp_comm_counts_get(&c);   /* read before the printing gathers */
    char text[256];
    size_t used = (size_t)snprintf(text, sizeof text, "  collectives for %s:", what);
    int any = 0;
    for (int k = 0; k < HP_COMM_OP_COUNT; k++)
        if (c.calls[k]) {
            used += (size_t)snprintf(text + used, sizeof text - used, " %s x%llu (%llu bytes sent)",
                                     hp_comm_op_name((hp_comm_op_t)k), (unsigned long long)c.calls[k],
                                     (unsigned long long)c.bytes[k]);
            any = 1;
        }
    if (!any) snprintf(text + used, sizeof text - used, " none");
    if (hp_comm_rank(W) == 0) printf("%s (per rank, rank 0 shown)\n", text);
    fflush(stdout);
}

static int fail(const char *what) {
    fprintf(stderr, "[rank %d] %s: %s\n", hp_comm_rank(W), what, hp_last_error());
    hp_comm_abort(W, 1, what);
}

int main(int argc, char **argv) {
    if (hp_comm_init(&argc, &argv, &W) != HP_OK) {
        fprintf(stderr, "hp_comm_init: %s\n", hp_last_error());
        return 1;
    }
    if (hp_comm_size(W) != 4) {
        if (hp_comm_rank(W) == 0) fprintf(stderr, "run this example on 4 ranks (mpirun -np 4), got %d\n", hp_comm_size(W));
        hp_comm_finalize();
        return 1;
    }
    hp_mesh_t mesh;
    int64_t shape[2] = {2, 2};
    const char *names[2] = {"dp", "tp"};
    if (hp_mesh_create(W, 2, shape, names, &mesh) != HP_OK) return fail("hp_mesh_create");
    char ms[128];
    if (hp_comm_rank(W) == 0) printf("%s\n", hp_mesh_str(mesh, ms, sizeof ms));

    /* the global 5x6 matrix 0..29, present on every rank; only rank 0's copy is read */
    int64_t gshape[2] = {5, 6};
    float data[30];
    for (int i = 0; i < 30; i++) data[i] = (float)i;
    hp_tensor_t full;
    hp_tensor_init(&full, HP_F32, 2, gshape, data);

    hp_placement_t s0s1[2] = {hp_shard(0), hp_shard(1)};
    hp_placement_t rr[2] = {hp_replicate(), hp_replicate()};
    hp_placement_t s1s1[2] = {hp_shard(1), hp_shard(1)};
    hp_dtensor_t a, b, c;
    hp_comm_counts_reset();
    if (hp_dtensor_distribute(&a, NULL, &full, mesh, 2, s0s1, 0) != HP_OK) return fail("distribute");
    show_counts("distribute_tensor [S(0), S(1)]");
    show("distribute_tensor(5x6, [S(0), S(1)]): rows split by dp (3 + 2), columns by tp", &a);

    hp_comm_counts_reset();
    if (hp_dtensor_redistribute(&b, NULL, &a, 2, rr) != HP_OK) return fail("redistribute to R,R");
    show_counts("[S(0), S(1)] -> [R, R]");
    show("redistribute -> [R, R]: every rank holds the whole matrix", &b);

    hp_comm_counts_reset();
    if (hp_dtensor_redistribute(&c, NULL, &a, 2, s1s1) != HP_OK) return fail("redistribute to S1,S1");
    show_counts("[S(0), S(1)] -> [S(1), S(1)]");
    show("redistribute -> [S(1), S(1)]: columns split by dp, then again by tp (nested)", &c);

    hp_dtensor_free(&a), hp_dtensor_free(&b), hp_dtensor_free(&c);
    hp_mesh_destroy(mesh);
    hp_comm_finalize();
    return 0;
}
