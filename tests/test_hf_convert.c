/* Streaming HF <-> DCP conversion (hp_hf_convert_to_dcp / hp_hf_convert_from_dcp, issue 18
 * item 2): bitwise round trips against hp_hf_export / hp_hf_import (llama3 with q/k
 * permutation, qwen3 tied), a bf16 folder kept bf16 in the DCP and cast on load, each rank's
 * share under 2 ranks (about half the bytes each), hp_hf_import of a bf16 folder into Shard(1)
 * matrices (the column copy of the sharded reader, q/k permuted), and the peak RSS of hp-ckpt from-hf / to-hf
 * on a 170 MB model bounded by 3x its largest tensor (34 MB) above a tiny conversion's. */
// hp-test: ranks 1 2 timeout 120
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/config.h"
#include "hyperparallel/dtensor.h"
#include "hyperparallel/mesh.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"

static char ROOT[512];
static char BDIR[1024], SRC[1024];
static hp_comm_t WORLD;
static int RANK, SIZE;

/* a cheap deterministic pattern instead of the RNG init (the large model would take seconds) */
static void fill_pattern(hp_model_t m) {
    for (int i = 0; i < hp_model_num_params(m); i++) {
        hp_tensor_t *t = &hp_model_params(m)[i].value.local;
        float *w = t->data;
        for (int64_t j = 0; j < hp_tensor_numel(t); j++) w[j] = 0.05f * sinf(0.37f * (float)j + 1.3f * (float)i);
    }
}

static int params_equal(hp_model_t a, hp_model_t b, int bf16, const char **first) {
    for (int i = 0; i < hp_model_num_params(a); i++) {
        const hp_tensor_t *x = &hp_model_params(a)[i].value.local, *y = &hp_model_params(b)[i].value.local;
        const float *p = x->data, *q = y->data;
        for (int64_t j = 0; j < hp_tensor_numel(x); j++) {
            float want = bf16 ? hp_bf16_to_f32(hp_f32_to_bf16(p[j])) : p[j];
            if (memcmp(&want, &q[j], 4) != 0) {
                *first = hp_model_params(a)[i].name;
                return 0;
            }
        }
    }
    return 1;
}

static hp_model_t model_of(const hp_model_config_t *mc) {
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(mc, 1, 1, &m));
    return m;
}

static void round_trip(const char *tag, hp_model_config_t mc) {
    hp_model_t src = model_of(&mc), back = model_of(&mc), back2 = model_of(&mc);
    if (!src || !back || !back2) return;
    fill_pattern(src);
    char hf[700], dcp[700], hf2[700], hfb[700], dcpb[700];
    snprintf(hf, sizeof hf, "%s/%s_hf", ROOT, tag);
    snprintf(dcp, sizeof dcp, "%s/%s_dcp", ROOT, tag);
    snprintf(hf2, sizeof hf2, "%s/%s_hf2", ROOT, tag);
    snprintf(hfb, sizeof hfb, "%s/%s_hfb", ROOT, tag);
    snprintf(dcpb, sizeof dcpb, "%s/%s_dcpb", ROOT, tag);
    HP_CHECK_OK(hp_hf_export(hf, hp_model_hf_adapter(&mc), &mc, hp_model_params(src), hp_model_num_params(src), WORLD,
                             HP_F32, 0));
    hp_hf_convert_stats_t st;
    HP_CHECK_OK(hp_hf_convert_to_dcp(hf, hp_model_hf_adapter(&mc), &mc, dcp, WORLD, &st));
    /* the share: every tensor converted once; each rank within one largest tensor of half */
    int64_t mine[2] = {st.tensors, st.bytes_written}, all[2] = {0, 0};
    HP_CHECK_OK(hp_all_reduce(mine, all, 2, HP_I64, HP_SUM, WORLD, NULL));
    int moe_layers = 0;   /* each MoE layer's expert_bias is a DCP tensor too */
    for (int l = 0; l < mc.n_layers; l++) moe_layers += hp_model_layer_is_moe(&mc, l);
    HP_CHECK(all[0] == hp_model_num_params(src) + moe_layers, "%s: %lld tensors converted, the model has %d (+ %d "
             "expert_bias)", tag, (long long)all[0], hp_model_num_params(src), moe_layers);
    HP_CHECK(llabs(st.bytes_written * SIZE - all[1]) <= st.largest_tensor_bytes * SIZE,
             "%s: rank %d wrote %lld of %lld bytes (largest tensor %lld)", tag, RANK, (long long)st.bytes_written,
             (long long)all[1], (long long)st.largest_tensor_bytes);
    /* strict load: the converter's parameter list is the model's, names and shapes */
    int np = hp_model_num_params(back);
    hp_dcp_tensor_t *ts = calloc((size_t)np + HP_MODEL_MAX_LAYERS, sizeof *ts);
    for (int i = 0; i < np; i++) ts[i] = (hp_dcp_tensor_t){hp_model_params(back)[i].name, &hp_model_params(back)[i].value, -1, 0};
    /* and each MoE layer's expert_bias (what the trainer's initial load asks for): zeros, as
     * Qwen3-MoE has no HF tensor for it */
    static char bnames[HP_MODEL_MAX_LAYERS][48];
    static float bias[HP_MODEL_MAX_LAYERS][64];
    static hp_dtensor_t bt[HP_MODEL_MAX_LAYERS];
    int nt = np;
    for (int l = 0; l < mc.n_layers && mc.moe_experts <= 64; l++) {
        if (!hp_model_layer_is_moe(&mc, l)) continue;
        snprintf(bnames[l], sizeof bnames[l], "layers.%d.moe.expert_bias", l);
        for (int e = 0; e < 64; e++) bias[l][e] = 1.0f;
        memset(&bt[l], 0, sizeof bt[l]);
        int64_t bs[1] = {mc.moe_experts};
        HP_CHECK_OK(hp_tensor_init(&bt[l].local, HP_F32, 1, bs, bias[l]));
        ts[nt++] = (hp_dcp_tensor_t){bnames[l], &bt[l], -1, 0};
    }
    hp_dcp_state_t s = {ts, nt, NULL, 0};
    HP_CHECK_OK(hp_dcp_load(dcp, &s, NULL, NULL));
    for (int l = 0; l < mc.n_layers && mc.moe_experts <= 64; l++)
        for (int e = 0; hp_model_layer_is_moe(&mc, l) && e < mc.moe_experts; e++)
            HP_CHECK(bias[l][e] == 0.0f, "%s: layer %d's expert_bias[%d] = %g after from-hf, expected 0", tag, l, e,
                     bias[l][e]);
    const char *first = NULL;
    HP_CHECK(params_equal(src, back, 0, &first), "%s: HF -> DCP differs at %s", tag, first ? first : "?");
    /* negative control: one flipped bit is seen */
    float *w = hp_model_params(back)[2].value.local.data;
    w[5] = nextafterf(w[5], 1.0f);
    HP_CHECK(!params_equal(src, back, 0, &first), "%s: a flipped bit went unnoticed", tag);
    /* DCP -> HF (several shards), then the library import */
    HP_CHECK_OK(hp_hf_convert_from_dcp(dcp, hp_model_hf_adapter(&mc), &mc, hf2, HP_F32, 40000, WORLD, &st));
    HP_CHECK_OK(hp_hf_import(hf2, hp_model_hf_adapter(&mc), &mc, hp_model_params(back2), hp_model_num_params(back2),
                             WORLD));
    HP_CHECK(params_equal(src, back2, 0, &first), "%s: DCP -> HF differs at %s", tag, first ? first : "?");
    /* bf16: kept bf16 in the DCP, cast to f32 on load */
    HP_CHECK_OK(hp_hf_export(hfb, hp_model_hf_adapter(&mc), &mc, hp_model_params(src), hp_model_num_params(src), WORLD,
                             HP_BF16, 0));
    HP_CHECK_OK(hp_hf_convert_to_dcp(hfb, hp_model_hf_adapter(&mc), &mc, dcpb, WORLD, &st));
    hp_dcp_metadata_t md = NULL;
    HP_CHECK_OK(hp_dcp_metadata_read(dcpb, &md));
    if (md) {
        const hp_dcp_entry_t *e = hp_dcp_metadata_find(md, "layers.0.attention.wq.weight");
        HP_CHECK(e && e->dtype == HP_BF16, "%s: the bf16 folder is stored %s", tag, e ? hp_dtype_name(e->dtype) : "?");
        hp_dcp_metadata_free(md);
    }
    for (int i = 0; i < np; i++) ts[i].loaded = 0;
    hp_dcp_load_options_t o = {1, 1, NULL, 0, 0};
    HP_CHECK_OK(hp_dcp_load(dcpb, &s, NULL, &o));
    HP_CHECK(params_equal(src, back, 1, &first), "%s: bf16 HF -> DCP differs at %s", tag, first ? first : "?");
    /* a model that disagrees with config.json is refused before anything is written */
    hp_model_config_t other = mc;
    other.rope_theta *= 2;
    char bad[800];
    snprintf(bad, sizeof bad, "%s/%s_refused", ROOT, tag);
    HP_CHECK_ERR(hp_hf_convert_to_dcp(hf, hp_model_hf_adapter(&other), &other, bad, WORLD, NULL), HP_ERR_INVALID_ARG,
                 "config.json 'rope_theta'");
    HP_CHECK(access(bad, F_OK) != 0, "%s: a refused conversion wrote %s", tag, bad);
    free(ts);
    hp_model_destroy(src);
    hp_model_destroy(back);
    hp_model_destroy(back2);
}

/* A trainer checkpoint of an MoE model also holds each MoE layer's expert_bias (not an HF
 * tensor of Qwen3-MoE): to-hf converts the parameters (warning that the bias is dropped), and
 * the HF folder names every expert. */
static void moe_expert_bias(hp_model_config_t mc) {
    hp_model_t src = model_of(&mc), back = model_of(&mc);
    if (!src || !back) return;
    fill_pattern(src);
    int np = hp_model_num_params(src);
    hp_dcp_tensor_t *ts = calloc((size_t)np + 1, sizeof *ts);
    for (int i = 0; i < np; i++) ts[i] = (hp_dcp_tensor_t){hp_model_params(src)[i].name, &hp_model_params(src)[i].value, -1, 0};
    float bias[4] = {0.5f, -0.25f, 0.0f, 0.125f};
    hp_dtensor_t b;
    memset(&b, 0, sizeof b);
    int64_t shape[1] = {mc.moe_experts};
    HP_CHECK_OK(hp_tensor_init(&b.local, HP_F32, 1, shape, bias));
    char bname[64];
    snprintf(bname, sizeof bname, "layers.%d.moe.expert_bias", mc.n_layers - 1);
    ts[np] = (hp_dcp_tensor_t){bname, &b, -1, 0};
    hp_dcp_state_t st = {ts, np + 1, NULL, 0};
    char dcp[700], hf[700];
    snprintf(dcp, sizeof dcp, "%s/moe_bias_dcp", ROOT);
    snprintf(hf, sizeof hf, "%s/moe_bias_hf", ROOT);
    HP_CHECK_OK(hp_dcp_save(dcp, &st, WORLD));
    HP_CHECK_OK(hp_hf_convert_from_dcp(dcp, hp_model_hf_adapter(&mc), &mc, hf, HP_F32, 0, WORLD, NULL));
    HP_CHECK_OK(hp_hf_import(hf, hp_model_hf_adapter(&mc), &mc, hp_model_params(back), np, WORLD));
    const char *first = NULL;
    HP_CHECK(params_equal(src, back, 0, &first), "moe expert_bias: DCP -> HF differs at %s", first ? first : "?");
    char ix[800];
    snprintf(ix, sizeof ix, "%s/model.safetensors.index.json", hf);
    hp_hf_index_t wm = NULL;
    HP_CHECK_OK(hp_hf_index_read(ix, &wm));
    if (wm) {
        char want[160];
        snprintf(want, sizeof want, "model.layers.%d.mlp.experts.%d.down_proj.weight", mc.n_layers - 1, mc.moe_experts - 1);
        HP_CHECK(hp_hf_index_find(wm, want) != NULL, "moe expert_bias: the index lacks %s", want);
        snprintf(want, sizeof want, "model.layers.%d.mlp.experts.%d.up_proj.weight", mc.n_layers - 1, mc.moe_experts);
        HP_CHECK(hp_hf_index_find(wm, want) == NULL, "moe expert_bias: the index has a fifth expert %s", want);
        hp_hf_index_free(wm);
    }
    free(ts);
    hp_model_destroy(src);
    hp_model_destroy(back);
}

/* hp_hf_import into a tensor-parallel-like layout: every matrix Shard(1) (columns: each rank
 * reads its rows' full width, copies its columns), vectors Shard(0), over all ranks; every
 * local piece equals the slice of the source (q/k columns through the row permutation). */
static void sharded_columns(void) {
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.dim = 48, mc.n_layers = 2, mc.n_heads = 4, mc.n_kv_heads = 2, mc.head_dim = 16, mc.hidden_dim = 80;
    mc.vocab_size = 300, mc.max_seq_len = 16, mc.multiple_of = 0;
    HP_CHECK_OK(hp_model_config_validate(&mc));
    hp_model_t src = model_of(&mc);
    if (!src) return;
    fill_pattern(src);
    char hf[700];
    snprintf(hf, sizeof hf, "%s/cols_hf", ROOT);
    HP_CHECK_OK(hp_hf_export(hf, hp_model_hf_adapter(&mc), &mc, hp_model_params(src), hp_model_num_params(src), WORLD,
                             HP_BF16, 0));
    hp_mesh_t mesh = NULL;
    const char *names[1] = {"tp"};
    int64_t shape[1] = {SIZE};
    HP_CHECK_OK(hp_mesh_create(WORLD, 1, shape, names, &mesh));
    int np = hp_model_num_params(src);
    hp_param_t *ps = calloc((size_t)np, sizeof *ps);
    for (int i = 0; i < np; i++) {
        const hp_tensor_t *t = &hp_model_params(src)[i].value.local;
        snprintf(ps[i].name, sizeof ps[i].name, "%s", hp_model_params(src)[i].name);
        hp_placement_t pl = hp_shard(t->ndim > 1 ? 1 : 0);
        HP_CHECK_OK(hp_dtensor_full(&ps[i].value, NULL, HP_F32, t->ndim, t->shape, mesh, 1, &pl, -7.0));
    }
    hp_hf_import_counts_t c0, c1;
    hp_hf_import_counts_get(&c0);
    HP_CHECK_OK(hp_hf_import(hf, hp_model_hf_adapter(&mc), &mc, ps, np, WORLD));
    hp_hf_import_counts_get(&c1);
    int bad = 0;
    for (int i = 0; i < np && !bad; i++) {
        const hp_tensor_t *t = &hp_model_params(src)[i].value.local, *l = &ps[i].value.local;
        int64_t off[HP_MAX_DIMS] = {0};
        HP_CHECK_OK(hp_dtensor_global_offset(&ps[i].value, off));
        const int64_t cols = t->ndim > 1 ? t->shape[1] : 1, lc = l->ndim > 1 ? l->shape[1] : 1;
        for (int64_t r = 0; r < l->shape[0] && !bad; r++)
            for (int64_t c = 0; c < lc && !bad; c++) {
                float want = hp_bf16_to_f32(hp_f32_to_bf16(((const float *)t->data)[(off[0] + r) * cols + off[1] + c]));
                float got = ((const float *)l->data)[r * lc + c];
                if (memcmp(&want, &got, 4) != 0) {
                    bad = 1;
                    HP_CHECK(0, "Shard(1) import: %s[%lld, %lld] = %g, expected %g", ps[i].name, (long long)(off[0] + r),
                             (long long)(off[1] + c), got, want);
                }
            }
    }
    HP_CHECK(!bad, "every Shard(1) / Shard(0) piece is the source's slice");
    /* each rank reads exactly its columns: the reads add up to the weights' bytes */
    int64_t mine = (int64_t)(c1.bytes_read - c0.bytes_read), sum = 0;
    HP_CHECK_OK(hp_all_reduce(&mine, &sum, 1, HP_I64, HP_SUM, WORLD, NULL));
    HP_CHECK(sum == (int64_t)(c1.bytes_total - c0.bytes_total), "the ranks read %lld bytes of Shard(1) pieces, the "
             "weights hold %llu", (long long)sum, (unsigned long long)(c1.bytes_total - c0.bytes_total));
    for (int i = 0; i < np; i++) hp_dtensor_free(&ps[i].value);
    free(ps);
    hp_mesh_destroy(mesh);
    hp_model_destroy(src);
}

/* peak RSS (KiB) of one command run as a child */
static long child_maxrss(const char *cmd) {
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    HP_CHECK(wait4(pid, &status, 0, &ru) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: status %d", cmd,
             status);
    return ru.ru_maxrss;
}

static void test_memory_bound(void) {
    /* 170 MB of f32: embedding and output 65536 x 128 (33.5 MB each, the largest), 16 layers
     * with FFN 4096; the whole model is 5x its largest tensor */
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.dim = 128, mc.n_layers = 16, mc.n_heads = 4, mc.n_kv_heads = 2, mc.head_dim = 32, mc.hidden_dim = 4096;
    mc.vocab_size = 65536, mc.max_seq_len = 16, mc.multiple_of = 0;
    HP_CHECK_OK(hp_model_config_validate(&mc));
    hp_model_t m = model_of(&mc);
    if (!m) return;
    fill_pattern(m);
    char hf[700], cmd[3000];
    snprintf(hf, sizeof hf, "%s/big_hf", ROOT);
    HP_CHECK_OK(hp_hf_export(hf, hp_model_hf_adapter(&mc), &mc, hp_model_params(m), hp_model_num_params(m), NULL,
                             HP_F32, 0));
    hp_model_destroy(m);
    const long largest_kib = 65536L * 128 * 4 / 1024, total_kib = (long)(hp_model_param_count(&mc, 0) * 4 / 1024);
    snprintf(cmd, sizeof cmd, "'%s/hp-ckpt' from-hf '%s/tests/data/hf_shapes/llama_kv1_untied' '%s/tiny_dcp' >/dev/null",
             BDIR, SRC, ROOT);
    long base = child_maxrss(cmd);
    snprintf(cmd, sizeof cmd, "'%s/hp-ckpt' from-hf '%s' '%s/big_dcp' >/dev/null 2>&1", BDIR, hf, ROOT);
    long from = child_maxrss(cmd);
    snprintf(cmd, sizeof cmd, "'%s/hp-ckpt' to-hf '%s/big_dcp' '%s/big_hf2' --model llama3 --flavor debugmodel "
             "--model.dim 128 --model.n_layers 16 --model.n_heads 4 --model.n_kv_heads 2 --model.head_dim 32 "
             "--model.hidden_dim 4096 --model.rope_theta 500000 >/dev/null 2>&1", BDIR, ROOT, ROOT);
    long to = child_maxrss(cmd);
    /* the bound of the issue: 3x the largest tensor plus a few MB (8 MiB) above the tiny run;
     * holding the model (what the conversion did before) would need total_kib = 5x largest */
    const long bound = 3 * largest_kib + 8192;
    printf("peak RSS: tiny %ld KiB, from-hf %ld KiB, to-hf %ld KiB; largest tensor %ld KiB, model %ld KiB, bound "
           "%ld KiB above the tiny run\n", base, from, to, largest_kib, total_kib, bound);
    HP_CHECK(total_kib > bound, "the model (%ld KiB) must exceed the bound (%ld KiB) for the check to mean anything",
             total_kib, bound);
    HP_CHECK(from - base <= bound, "from-hf peak RSS %ld KiB - %ld KiB above the bound %ld KiB", from, base, bound);
    HP_CHECK(to - base <= bound, "to-hf peak RSS %ld KiB - %ld KiB above the bound %ld KiB", to, base, bound);
    HP_CHECK(from - base >= largest_kib / 2, "from-hf peak RSS %ld KiB: no tensor held? (the measurement is wrong)",
             from);
}

int main(int argc, char **argv) {
    WORLD = hp_test_mpi_init(&argc, &argv, &RANK, &SIZE);
    const char *bd = getenv("HP_BUILD_DIR"), *src = getenv("HP_SOURCE_DIR");
    if (!realpath(bd && *bd ? bd : ".", BDIR)) snprintf(BDIR, sizeof BDIR, ".");
    if (!realpath(src && *src ? src : "..", SRC)) snprintf(SRC, sizeof SRC, "..");
    /* one directory for all ranks: rank 0 makes it */
    int64_t pid = (int64_t)getpid();
    HP_CHECK_OK(hp_broadcast(&pid, 1, HP_I64, 0, WORLD, NULL));
    snprintf(ROOT, sizeof ROOT, "/tmp/hp_test_hf_convert_%lld", (long long)pid);
    if (RANK == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", ROOT, ROOT);
        HP_ASSERT(system(cmd) == 0);
    }
    hp_barrier(WORLD, NULL);
    /* first, while this process is small: the children's peak RSS includes the fork's copy */
    char tp[1200];
    snprintf(tp, sizeof tp, "%s/hp-ckpt", BDIR);
    if (SIZE == 1 && access(tp, X_OK) == 0) test_memory_bound();
    else if (SIZE == 1) printf("SKIP part: %s not built\n", tp);
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.dim = 48, mc.n_layers = 3, mc.n_heads = 4, mc.n_kv_heads = 1, mc.head_dim = 16, mc.hidden_dim = 80;
    mc.vocab_size = 300, mc.max_seq_len = 16, mc.multiple_of = 0;
    HP_CHECK_OK(hp_model_config_validate(&mc));
    round_trip("llama3", mc);
    HP_CHECK_OK(hp_model_flavor("qwen3", "debugmodel", &mc));
    mc.vocab_size = 300, mc.max_seq_len = 16, mc.n_layers = 2;
    HP_CHECK_OK(hp_model_config_validate(&mc));
    round_trip("qwen3", mc);
    /* mixture of experts: each (E, A, B) expert parameter is E HF tensors */
    HP_CHECK_OK(hp_model_flavor("qwen3_moe", "debugmodel", &mc));
    mc.vocab_size = 300, mc.max_seq_len = 16, mc.n_layers = 2, mc.moe_experts = 4, mc.moe_hidden = 48;
    HP_CHECK_OK(hp_model_config_validate(&mc));
    round_trip("qwen3_moe", mc);
    moe_expert_bias(mc);
    sharded_columns();
    hp_barrier(WORLD, NULL);
    if (RANK == 0 && !getenv("HP_KEEP")) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf %s", ROOT);
        if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", ROOT);
    }
    int rc = hp_test_finish("test_hf_convert");
    hp_comm_finalize();
    return rc;
}
