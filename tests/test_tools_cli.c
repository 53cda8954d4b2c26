/* Every tool (hp-train, hp-ckpt, hp-generate, hp-tokenizer; found through HP_BUILD_DIR) with
 * bad flags and bad numbers: the exit code is 2 (usage) or 1 (bad input file), the message
 * names the flag, key or file with the value and the expected range, unknown flags get a
 * did-you-mean suggestion, and nothing is written when the arguments are refused. Also the
 * HF config.json vocab_size (clamped by json_object_get_int before) and a weights file whose
 * metadata says max_seq_len 1e9 (failed in malloc before). */
// hp-test: ranks 1 timeout 120
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/safetensors.h"

static char ROOT[] = "/tmp/hp_test_tools_cli_XXXXXX";
static char BUILD[1024], SRC[1024];
static char OUT[1 << 16];

/* Runs "BUILD/tool ARGS" with stdout and stderr captured into OUT; returns the exit code. */
static int run(const char *tool, const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s/%s' %s 2>&1 </dev/null", ROOT, BUILD, tool, args);
    const int rc = hp_test_run_capture(cmd, OUT, sizeof OUT);
    return rc > 128 ? 128 : rc;
}

#define EXPECT(tool, args, rc_want, needle)                                                                  \
    do {                                                                                                     \
        int rc_ = run(tool, args);                                                                           \
        HP_CHECK(rc_ == (rc_want) && strstr(OUT, needle) != NULL, "%s %s -> rc %d (want %d), output:\n%s\n"  \
                 "expected to contain: %s", tool, args, rc_, rc_want, OUT, needle);                          \
    } while (0)

static int exists(const char *name) {
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", ROOT, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void write_file(const char *name, const char *text) {
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", ROOT, name);
    FILE *f = fopen(p, "w");
    HP_ASSERT(f);
    fputs(text, f);
    fclose(f);
}

static void test_plan(void) {
    /* hp-plan: a bad world, a missing calibration (names the command that makes it), a broken one */
    EXPECT("hp-plan", "--world 0", 2, "--world expects an integer in [1");
    EXPECT("hp-plan", "--model.name llama3", 2, "--world N is required");
    EXPECT("hp-plan", "--world 2 --calibration nothere.txt", 2, "mpirun -np 8 hp-plan --calibrate");
    write_file("badcal.txt", "hyperparallel planner calibration 1\ncores 2\n");
    EXPECT("hp-plan", "--world 2 --calibration badcal.txt", 2, "incomplete (0 of 64 GEMM rates");
    EXPECT("hp-plan", "--world 2 --bogus", 2, "unknown argument '--bogus'");
}

static void test_ckpt(void) {
    /* unknown flags: suggestion, nothing written (before: --dtyp was ignored, f32 written) */
    EXPECT("hp-ckpt", "seed out1 --model llama3 --flavor debugmodel --vocab 64 --sed 3", 2,
           "hp-ckpt: unknown option '--sed'; did you mean '--seed'?");
    HP_CHECK(!exists("out1"), "a refused command wrote out1");
    EXPECT("hp-ckpt", "to-hf ck hf --model llama3 --flavor debugmodel --dtyp bf16", 2,
           "unknown option '--dtyp'; did you mean '--dtype'?");
    HP_CHECK(!exists("hf"), "a refused command wrote hf");
    /* numbers: atoi / strtoull gave 0 for "lots" and wrapped 2^32 + 64 to 64 */
    EXPECT("hp-ckpt", "to-hf ck hf --model llama3 --flavor debugmodel --max-shard-bytes lots", 2,
           "--max-shard-bytes expects a non-negative integer, got 'lots'");
    EXPECT("hp-ckpt", "to-hf ck hf --model llama3 --flavor debugmodel --max-shard-bytes -5", 2,
           "--max-shard-bytes expects a non-negative integer, got '-5'");
    EXPECT("hp-ckpt", "seed out1 --model llama3 --flavor debugmodel --vocab 4294967360", 2,
           "--vocab expects an integer in [1, 16777216], got '4294967360'");
    /* a huge vocabulary names --vocab (before: "out of memory ... needs 2318 GiB") */
    EXPECT("hp-ckpt", "seed out1 --model llama3 --flavor debugmodel --vocab 1200000000", 2,
           "--vocab expects an integer in [1, 16777216], got '1200000000'; hint:");
    EXPECT("hp-ckpt", "seed out1 --model llama3 --flavor debugmodel --vocab 64 --seed -1", 2,
           "--seed expects a non-negative integer, got '-1'");
    EXPECT("hp-ckpt", "seed out1 --model llama3 --flavor debugmodel --vocab", 2,
           "option '--vocab' needs a value");
    HP_CHECK(!exists("out1"), "a refused command wrote out1");
    /* the positive control: both spellings of a value are accepted and the seed is written */
    EXPECT("hp-ckpt", "seed out1 --model=llama3 --flavor debugmodel --vocab=64 --seed 3", 0,
           "wrote seed checkpoint out1 (llama3 debugmodel, vocab 64, seed 3)");
    /* HF config.json: vocab_size beyond int, a float, a string; the file and key are named */
    char hfin[2048];
    snprintf(hfin, sizeof hfin, "%s/hfin", ROOT);
    HP_ASSERT(mkdir(hfin, 0755) == 0);
    write_file("hfin/config.json", "{\"vocab_size\": 4294967360}");
    EXPECT("hp-ckpt", "from-hf hfin dcp --model llama3 --flavor debugmodel", 1,
           "hfin/config.json: 'vocab_size' = 4294967360 is out of range: expected an integer in [1, 16777216]");
    write_file("hfin/config.json", "{\"vocab_size\": 1e9}");
    EXPECT("hp-ckpt", "from-hf hfin dcp --model llama3 --flavor debugmodel", 1,
           "hfin/config.json: 'vocab_size' expects an integer, got double");
    write_file("hfin/config.json", "{\"vocab_size\": -3}");
    EXPECT("hp-ckpt", "from-hf hfin dcp --model llama3 --flavor debugmodel", 1, "'vocab_size' = -3 is out of range");
    HP_CHECK(!exists("dcp"), "a refused from-hf wrote dcp");
}

static void test_generate(void) {
    EXPECT("hp-generate", "--weigths w --tokenizer t", 2, "hp-generate: unknown option '--weigths'; did you mean '--weights'?");
    EXPECT("hp-generate", "--weights w --tokenizer t --top-k 99999999999", 2,
           "--top-k expects an integer in [0, 16777216], got '99999999999'");
    EXPECT("hp-generate", "--weights w --tokenizer t --max-new-tokens 12abc", 2,
           "--max-new-tokens expects an integer, got '12abc'");
    EXPECT("hp-generate", "--weights w --tokenizer t --temperature 1e-300", 2,
           "--temperature = 1e-300 underflows float32");
    EXPECT("hp-generate", "--weights w --tokenizer t --top-p 1.5", 2, "--top-p expects a number in [0, 1], got '1.5'");
    EXPECT("hp-generate", "--weights w --tokenizer t --seed", 2, "option '--seed' needs a value");

    /* a weights file whose metadata says max_seq_len 1e9: refused by name, before any allocation */
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.vocab_size = 64;
    mc.max_seq_len = 8;
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 1, 8, &m));
    if (!m) return;
    char good[2048], bad[2048];
    snprintf(good, sizeof good, "%s/good.safetensors", ROOT);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", ROOT);
    HP_CHECK_OK(hp_model_save_weights(m, good));
    hp_model_destroy(m);
    hp_model_t back = NULL;
    HP_CHECK_OK(hp_model_load_weights(good, 1, 0, &back));   /* the control loads */
    HP_CHECK(back && hp_model_config(back)->max_seq_len == 8, "max_seq_len kept");
    hp_model_destroy(back);
    /* the same metadata with one field changed */
    static const char *keys[] = {"format", "model.name", "model.flavor", "dim", "n_layers", "n_heads", "n_kv_heads",
                                 "head_dim", "vocab_size", "hidden_dim", "multiple_of", "ffn_dim_multiplier",
                                 "norm_eps", "rope_theta", "rope_scaling", "rope_factor", "rope_low_freq_factor",
                                 "rope_high_freq_factor", "rope_original_max_pos", "qk_norm", "tie_embeddings",
                                 "max_seq_len"};
    const int nk = (int)(sizeof keys / sizeof keys[0]);
    const char *cases[][3] = {{"max_seq_len", "1000000000", "__metadata__ 'max_seq_len' expects an integer in [1, 1048576], got '1000000000'"},
                              {"vocab_size", "4294967360", "__metadata__ 'vocab_size' expects an integer in [1, 16777216], got '4294967360'"},
                              {"norm_eps", "1e-300", "__metadata__ 'norm_eps' = 1e-300 underflows float32"}};
    for (int c = 0; c < 3; c++) {
        hp_safetensors_t st = NULL;
        HP_CHECK_OK(hp_safetensors_open(good, &st));
        if (!st) return;
        char vals[32][64];
        const char *meta[64];
        for (int i = 0; i < nk; i++) {
            const char *v = hp_safetensors_metadata(st, keys[i]);
            snprintf(vals[i], sizeof vals[i], "%s", !strcmp(keys[i], cases[c][0]) ? cases[c][1] : v ? v : "?");
            meta[2 * i] = keys[i];
            meta[2 * i + 1] = vals[i];
        }
        hp_safetensors_close(st);
        HP_CHECK_OK(hp_safetensors_write(bad, NULL, 0, meta, nk));
        hp_model_t mm = NULL;
        HP_CHECK_ERR(hp_model_load_weights(bad, 1, 0, &mm), HP_ERR_FORMAT, cases[c][2]);
        HP_CHECK(mm == NULL, "no model from a refused file");
    }
    /* and through the tool (the last case, norm_eps, is in bad.safetensors now) */
    char args[4096];
    snprintf(args, sizeof args, "--weights bad.safetensors --tokenizer '%s/tests/data/tokenizer/gpt2_hf.json'", SRC);
    EXPECT("hp-generate", args, 1, "bad.safetensors: __metadata__ 'norm_eps' = 1e-300 underflows float32");
}

static void test_train(void) {
    /* before: seq_len 4294967312 trained with seq_len 16 and exited 0 */
    EXPECT("hp-train", "--training.seq_len=4294967312", 2,
           "command line: key 'training.seq_len' expects an integer in [1, 1048576], got '4294967312'");
    EXPECT("hp-train", "--training.local_batch_size 4294967304", 2,
           "key 'training.local_batch_size' expects an integer in [1, 2147483647], got '4294967304'; hint: the value "
           "is held in a 32-bit int");
    EXPECT("hp-train", "--optimizer.eps=1e-300", 2, "key 'optimizer.eps' = 1e-300 underflows float32");
    EXPECT("hp-train", "--optimizer.lr=1e39", 2, "key 'optimizer.lr' = 1e+39 is not representable in float32");
    EXPECT("hp-train", "--nprocs 2", 2, "unknown option '--nprocs'; did you mean '--nproc'?");
    EXPECT("hp-train", "--confg x.yaml", 2, "unknown option '--confg'; did you mean '--config'?");
    EXPECT("hp-train", "--nproc 2x", 2, "--nproc expects an integer, got '2x'");
    EXPECT("hp-train", "--trainig.steps=3", 2, "unknown key '--trainig.steps'; did you mean '--training.steps'?");
}

static void test_tokenizer(void) {
    EXPECT("hp-tokenizer", "train --vocab-sise 300 --output tok.json corpus.txt", 2,
           "hp-tokenizer train: unknown option '--vocab-sise'; did you mean '--vocab-size'?");
    EXPECT("hp-tokenizer", "train --vocab-size 4294967552 --output tok.json corpus.txt", 2,
           "--vocab-size expects an integer in [1, 16777216], got '4294967552'");
    EXPECT("hp-tokenizer", "train --vocab-size 300 --min-frequency lots --output tok.json corpus.txt", 2,
           "--min-frequency expects an integer, got 'lots'");
    HP_CHECK(!exists("tok.json"), "a refused train wrote tok.json");
    EXPECT("hp-tokenizer", "encode --tokeniser tok.json", 2, "unknown option '--tokeniser'; did you mean '--tokenizer'?");
    EXPECT("hp-tokenizer", "decode --tokenizer tok.json --skip-specail 1 2", 2,
           "unknown option '--skip-specail'; did you mean '--skip-special'?");
    EXPECT("hp-tokenizer", "info --tokenizr tok.json", 2, "unknown option '--tokenizr'; did you mean '--tokenizer'?");
}

int main(void) {
    const char *bd = getenv("HP_BUILD_DIR"), *sd = getenv("HP_SOURCE_DIR");
    snprintf(BUILD, sizeof BUILD, "%s", bd && *bd ? bd : ".");
    snprintf(SRC, sizeof SRC, "%s", sd && *sd ? sd : "..");
    char probe[1100];
    snprintf(probe, sizeof probe, "%s/hp-ckpt", BUILD);
    if (access(probe, X_OK) != 0) {
        printf("SKIP: tools not built in %s (set HP_BUILD_DIR)\n", BUILD);
        return 0;
    }
    HP_ASSERT(mkdtemp(ROOT));
    test_ckpt();
    test_generate();
    test_train();
    test_plan();
    test_tokenizer();
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ROOT);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", ROOT);
    return hp_test_finish("test_tools_cli");
}
