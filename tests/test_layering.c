// The layer rule (docs/architecture.md): every #include in src/<layer>/ (its subfolders too:
// src/models/<family>/) and in each public header names only its own layer or one below it,
// and no source outside src/comm includes mpi.h. The public headers are mapped to their layer
// below; a new header must be added here (an unknown one fails the test). Plus negative cases:
// the checker itself must flag upward includes written into a temporary file (nn into train
// and parallel; parallel into models).
// hp-test: ranks 1 timeout 60
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hp_test.h"

enum { CORE, COMM, MESH, DTENSOR, NN, PARALLEL, CHECKPOINT, MODELS, TRAIN, N_LAYERS };
static const char *const layer_names[N_LAYERS] = {"core", "comm", "mesh", "dtensor", "nn", "parallel",
                                                  "checkpoint", "models", "train"};

static const struct { const char *header; int layer; } headers[] = {
    {"status.h", CORE}, {"dtype.h", CORE}, {"arena.h", CORE}, {"tensor.h", CORE}, {"rng.h", CORE},
    {"parse.h", CORE}, {"clock.h", CORE}, {"time.h", CORE}, {"file.h", CORE},
    {"backend.h", CORE},   // the kernel table's type: the device seam every layer calls (the CPU backend is nn's)
    {"comm.h", COMM}, {"launch.h", COMM},
    {"mesh.h", MESH},
    {"dtensor.h", DTENSOR}, {"param.h", DTENSOR},
    {"nn.h", NN}, {"model.h", NN}, {"nn_loss.h", NN}, {"attention_block.h", NN},
    {"model_builder.h", NN}, {"nn_module.h", NN}, {"nn_layers.h", NN}, {"nn_moe.h", NN}, {"nn_kernels.h", NN},
    {"nn_attention.h", NN}, {"nn_checkpoint.h", NN},
    {"fsdp.h", PARALLEL}, {"ep.h", PARALLEL}, {"ddp.h", PARALLEL}, {"tp.h", PARALLEL}, {"zero.h", PARALLEL}, {"pp_schedule.h", PARALLEL}, {"pp.h", PARALLEL}, {"cp.h", PARALLEL},
    {"parallel_dims.h", PARALLEL}, {"parallelize.h", PARALLEL}, {"clip.h", PARALLEL}, {"moe_balance.h", PARALLEL},
    {"memory_plan.h", PARALLEL},
    {"planner.h", TRAIN},
    {"safetensors.h", CHECKPOINT}, {"checkpoint.h", CHECKPOINT}, {"weights.h", CHECKPOINT},
    {"model_parallelize.h", MODELS}, {"models.h", MODELS},
    {"config.h", TRAIN}, {"parallel_config.h", TRAIN}, {"data.h", TRAIN}, {"tokenizer.h", TRAIN}, {"chat_template.h", TRAIN},
    {"optim.h", TRAIN}, {"metrics.h", TRAIN}, {"trainer.h", TRAIN}, {"ckpt_manager.h", TRAIN},
    {"hyperparallel.h", TRAIN},
};

static int header_layer(const char *h) {
    for (size_t i = 0; i < sizeof(headers) / sizeof(headers[0]); i++)
        if (strcmp(headers[i].header, h) == 0) return headers[i].layer;
    return -1;
}

static int layer_of_dir(const char *d) {
    for (int i = 0; i < N_LAYERS; i++)
        if (strcmp(layer_names[i], d) == 0) return i;
    return -1;
}

/* Checks one file of layer `layer`; returns the number of violations (printed). */
static int check_file(const char *path, int layer, int report) {
    FILE *f = fopen(path, "r");
    if (!f) {
        HP_CHECK(0, "cannot read %s", path);
        return 1;
    }
    char line[512];
    int bad = 0, ln = 0;
    while (fgets(line, sizeof line, f)) {
        ln++;
        const char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "#include", 8) != 0) continue;
        p += 8;
        while (*p == ' ') p++;
        char name[256];
        if (sscanf(p, "\"%255[^\"]\"", name) != 1) {
            if (strstr(p, "<mpi.h>") && layer != COMM) {
                if (report) fprintf(stderr, "%s:%d: mpi.h outside src/comm\n", path, ln);
                bad++;
            }
            continue;
        }
        int to = -1;
        if (strncmp(name, "hyperparallel/", 14) == 0) {
            to = header_layer(name + 14);
            if (to < 0) {
                if (report) fprintf(stderr, "%s:%d: public header '%s' has no layer in tests/test_layering.c\n", path, ln, name);
                bad++;
                continue;
            }
        } else {
            char dir[64];
            if (sscanf(name, "%63[^/]/", dir) == 1 && strchr(name, '/')) to = layer_of_dir(dir);
            else if (!strchr(name, '/')) to = header_layer(name);   // a public header including a sibling
            if (to < 0) continue;   // a local header of the same folder
        }
        if (to > layer) {
            if (report)
                fprintf(stderr, "%s:%d: layer '%s' includes '%s' of the higher layer '%s'\n", path, ln,
                        layer_names[layer], name, layer_names[to]);
            bad++;
        }
    }
    fclose(f);
    return bad;
}

/* Every .c and .h of dir; a layer's subfolders (src/models/<family>/) belong to the layer. */
static int check_dir(const char *dir, int layer, int *files) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int bad = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const size_t n = strlen(e->d_name);
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (layer >= 0 && e->d_type == DT_DIR && e->d_name[0] != '.') {
            bad += check_dir(p, layer, files);
            continue;
        }
        if (n < 3 || (strcmp(e->d_name + n - 2, ".c") != 0 && strcmp(e->d_name + n - 2, ".h") != 0)) continue;
        int l = layer;
        if (l < 0) {   // include/hyperparallel: each header's own layer
            l = header_layer(e->d_name);
            HP_CHECK(l >= 0, "public header %s has no layer in tests/test_layering.c", e->d_name);
            if (l < 0) continue;
        }
        bad += check_file(p, l, 1);
        (*files)++;
    }
    closedir(d);
    return bad;
}

/* A temporary file holding `text` (three includes, the last two upward from layer `bad`): the
 * checker must report both in layer `bad` and none in layer `ok`. */
static void negative(const char *text, int bad, int ok, const char *what) {
    char tmp[] = "/tmp/hp_layering_XXXXXX";
    int fd = mkstemp(tmp);
    HP_CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
    HP_CHECK(check_file(tmp, bad, 0) == 2, "the checker reports both upward includes of %s", what);
    HP_CHECK(check_file(tmp, ok, 0) == 0, "the same includes are fine in %s", layer_names[ok]);
    remove(tmp);
}

int main(void) {
    const char *src = getenv("HP_SOURCE_DIR");
    if (!src) {
        printf("SKIP: HP_SOURCE_DIR not set (ctest sets it)\n");
        return 0;
    }
    int bad = 0, files = 0;
    char dir[1024];
    for (int l = 0; l < N_LAYERS; l++) {
        snprintf(dir, sizeof dir, "%s/src/%s", src, layer_names[l]);
        bad += check_dir(dir, l, &files);
    }
    snprintf(dir, sizeof dir, "%s/include/hyperparallel", src);
    bad += check_dir(dir, -1, &files);
    HP_CHECK(files > 60, "scanned %d files (expected the whole tree)", files);
    HP_CHECK(bad == 0, "%d upward includes (listed above)", bad);
    printf("layering: %d files, %d upward includes\n", files, bad);
    // negative: the checker flags an nn file including train and parallel headers
    negative("#include \"hyperparallel/nn.h\"\n#include \"hyperparallel/trainer.h\"\n#include \"parallel/dp-impl.h\"\n",
             NN, TRAIN, "an nn file including train and parallel");
    // negative: parallel (and checkpoint) including the models layer, its public or private header
    const char *models = "#include \"hyperparallel/tp.h\"\n#include \"hyperparallel/models.h\"\n"
                         "#include \"models/models-impl.h\"\n";
    negative(models, PARALLEL, MODELS, "a parallel file including models");
    negative(models, CHECKPOINT, TRAIN, "a checkpoint file including models");
    return hp_test_finish("test_layering");
}
