/* Config: defaults, YAML loading, command-line overrides, the error messages of issue 4
 * acceptance 3 (unknown key with a suggestion and file:line, wrong type, missing file),
 * print/parse round trip, gradient accumulation, and docs/config.md in sync with the schema.
 * Numbers enter range-checked (parse.h): narrowing, float32 underflow, a second YAML
 * document, model dimension bounds.
 * `test_config --write-doc` prints the generated docs/config.md table. */
// hp-test: ranks 1 timeout 60
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/parallel_config.h"
#include "hyperparallel/parse.h"
#include "hyperparallel/status.h"

static char src_dir_[1024];

static const char *data_path(const char *name, char *buf, size_t n) {
    snprintf(buf, n, "%s/tests/data/config/%s", src_dir_, name);
    return buf;
}

static void test_defaults(void) {
    hp_config_t c;
    hp_config_defaults(&c);
    HP_CHECK(c.training.steps == 10000, "steps %lld", (long long)c.training.steps);
    HP_CHECK(c.training.local_batch_size == 8, "lbs");
    HP_CHECK(c.training.global_batch_size == -1, "gbs");
    HP_CHECK(c.parallelism.data_parallel_shard_degree == -1, "dp_shard");
    HP_CHECK(strcmp(c.optimizer.name, "adamw") == 0, "opt %s", c.optimizer.name);
    HP_CHECK_CLOSE(c.optimizer.lr, 8e-4, 0, 0);
    HP_CHECK_CLOSE(c.optimizer.eps, 1e-8, 0, 0);
    HP_CHECK(strcmp(c.lr_scheduler.decay_type, "linear") == 0, "decay");
    HP_CHECK(c.lr_scheduler.decay_ratio == -1, "decay_ratio");
    HP_CHECK(strcmp(c.activation_checkpoint.mode, "none") == 0, "ac");
    HP_CHECK(c.checkpoint.exclude_from_loading.n == 0, "list");
    HP_CHECK(c.job.print_config, "print_config");
    HP_CHECK_OK(hp_config_validate(&c));
    size_t n;
    const hp_config_key_t *s = hp_config_schema(&n);
    HP_CHECK(n > 60, "schema has %zu keys", n);
    /* Every section the issue names is in the schema. */
    const char *sections[] = {"job", "model", "training", "optimizer", "lr_scheduler", "parallelism",
                              "activation_checkpoint", "checkpoint", "metrics", "validation", "data", "tokenizer"};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++) {
        bool found = false;
        for (size_t j = 0; j < n; j++) found |= strcmp(s[j].section, sections[i]) == 0;
        HP_CHECK(found, "section %s missing", sections[i]);
    }
    HP_CHECK(hp_config_find_key("parallelism.tp") == hp_config_find_key("parallelism.tensor_parallel_degree"),
             "alias tp");
    HP_CHECK(hp_config_find_key("training.nope") == NULL, "unknown");
    HP_CHECK(hp_edit_distance("trainig.steps", "training.steps") == 1, "edit distance");
    HP_CHECK(hp_edit_distance("", "abc") == 3, "edit distance empty");
    HP_CHECK(hp_edit_distance("kitten", "sitting") == 3, "edit distance kitten");
}

static void test_errors(void) {
    hp_config_t c;
    char p[1200];
    hp_config_defaults(&c);
    /* The exact message of the issue, with the file's line. */
    HP_CHECK_ERR(hp_config_load_file(&c, data_path("typo_section.yaml", p, sizeof p)), HP_ERR_INVALID_ARG,
                 "typo_section.yaml:7: unknown key 'trainig.steps'; did you mean 'training.steps'?");
    HP_CHECK_ERR(hp_config_load_file(&c, data_path("typo_key.yaml", p, sizeof p)), HP_ERR_INVALID_ARG,
                 "typo_key.yaml:3: unknown key 'training.seq_length'; did you mean 'training.seq_len'?");
    HP_CHECK_ERR(hp_config_load_file(&c, data_path("wrong_type.yaml", p, sizeof p)), HP_ERR_INVALID_ARG,
                 "wrong_type.yaml:2: key 'training.steps' expects an integer, got 'ten'");
    HP_CHECK_ERR(hp_config_load_file(&c, data_path("wrong_enum.yaml", p, sizeof p)), HP_ERR_INVALID_ARG,
                 "wrong_enum.yaml:2: key 'optimizer.name' expects one of adamw|sgd|muon, got 'adam'; did you mean 'adamw'?");
    HP_CHECK_ERR(hp_config_load_file(&c, data_path("wrong_bool.yaml", p, sizeof p)), HP_ERR_INVALID_ARG,
                 "wrong_bool.yaml:2: key 'checkpoint.enable' expects a boolean");
    HP_CHECK_ERR(hp_config_load_file(&c, data_path("mapping_for_scalar.yaml", p, sizeof p)), HP_ERR_INVALID_ARG,
                 "mapping_for_scalar.yaml:2: key 'training.seq_len' expects an integer, got a mapping");
    HP_CHECK_ERR(hp_config_load_file(&c, data_path("syntax_error.yaml", p, sizeof p)), HP_ERR_FORMAT,
                 "syntax_error.yaml:3:");
    HP_CHECK_ERR(hp_config_load_file(&c, data_path("duplicate.yaml", p, sizeof p)), HP_ERR_INVALID_ARG,
                 "duplicate.yaml:4: key 'parallelism.tensor_parallel_degree' is given twice (first at line 2)");
    HP_CHECK_ERR(hp_config_load_file(&c, "/nonexistent/dir/cfg.yaml"), HP_ERR_IO,
                 "config file '/nonexistent/dir/cfg.yaml': cannot open");
    /* hp_config_set and far-off names. */
    HP_CHECK_ERR(hp_config_set(&c, "optimizer.lr", "fast", "test"), HP_ERR_INVALID_ARG,
                 "test: key 'optimizer.lr' expects a finite number, got 'fast'");
    HP_CHECK_ERR(hp_config_set(&c, "optimizer.lr", "nan", "test"), HP_ERR_INVALID_ARG, "finite number");
    HP_CHECK_ERR(hp_config_set(&c, "training.steps", "1.5", "test"), HP_ERR_INVALID_ARG, "expects an integer");
    HP_CHECK_ERR(hp_config_set(&c, "zzzzzz.qqqqqqqqq", "1", "test"), HP_ERR_INVALID_ARG, "sections: job, model");
    HP_CHECK_ERR(hp_config_set(&c, "training.qqqqqqqqqqqqqqq", "1", "test"), HP_ERR_INVALID_ARG,
                 "keys of section 'training': steps, seq_len");
    HP_CHECK_ERR(hp_config_set(&c, "parallelism.tp_degree", "1", "test"), HP_ERR_INVALID_ARG, "did you mean");
    /* Validation naming the key. */
    hp_config_defaults(&c);
    c.checkpoint.keep_latest_k = 1;
    HP_CHECK_ERR(hp_config_validate(&c), HP_ERR_INVALID_ARG, "checkpoint.keep_latest_k");
    hp_config_defaults(&c);
    c.validation.enable = true;
    HP_CHECK_ERR(hp_config_validate(&c), HP_ERR_INVALID_ARG, "data.validation_fraction");
    hp_config_defaults(&c);
    c.training.seq_len = 0;
    HP_CHECK_ERR(hp_config_validate(&c), HP_ERR_INVALID_ARG, "'training.seq_len': must be >= 1, got 0");
}

static void test_full_file(void) {
    hp_config_t c;
    char p[1200];
    hp_config_defaults(&c);
    HP_CHECK_OK(hp_config_load_file(&c, data_path("full.yaml", p, sizeof p)));
    HP_CHECK(strcmp(c.job.dump_folder, "/tmp/hp-out") == 0, "dump %s", c.job.dump_folder);
    HP_CHECK(strcmp(c.job.description, "a: quoted # string") == 0, "desc '%s'", c.job.description);
    HP_CHECK(strcmp(c.model.name, "qwen3") == 0, "model");
    HP_CHECK(c.training.steps == 123 && c.training.seq_len == 64, "training");
    HP_CHECK(c.training.deterministic, "yes -> true");
    HP_CHECK_CLOSE(c.training.max_norm, 0.5, 0, 0);
    HP_CHECK(strcmp(c.optimizer.name, "sgd") == 0, "enum canonical: %s", c.optimizer.name);
    HP_CHECK_CLOSE(c.optimizer.lr, 3e-4, 0, 0);
    HP_CHECK(c.parallelism.data_parallel_shard_degree == 2, "alias dp_shard");
    HP_CHECK(strcmp(c.parallelism.pipeline_parallel_schedule, "interleaved1f1b") == 0, "schedule %s",
             c.parallelism.pipeline_parallel_schedule);
    HP_CHECK(c.checkpoint.exclude_from_loading.n == 2 &&
                 strcmp(c.checkpoint.exclude_from_loading.items[1], "dataloader") == 0,
             "list");
    HP_CHECK(c.metrics.log_freq == 5, "flat dotted key");
    HP_CHECK(c.data.path[0] == '\0', "null string");
    HP_CHECK(strstr(c.job.config_file, "full.yaml") != NULL, "config_file recorded");
    int64_t ga = 0;
    HP_CHECK_OK(hp_config_grad_accum_steps(&c, 2, &ga));
    HP_CHECK(ga == 2, "grad accum 16/(4*2) = %lld", (long long)ga);
    HP_CHECK_ERR(hp_config_grad_accum_steps(&c, 3, &ga), HP_ERR_INVALID_ARG,
                 "'training.global_batch_size' = 16 is not a multiple of local_batch_size (4) x dp degree (3) = 12");
    c.training.global_batch_size = -1;
    HP_CHECK_OK(hp_config_grad_accum_steps(&c, 3, &ga));
    HP_CHECK(ga == 1, "-1 -> 1");

    /* Round trip: print, load the printed YAML over defaults, every key prints the same. */
    char tmp[] = "/tmp/hp_test_config_XXXXXX";
    int fd = mkstemp(tmp);
    HP_CHECK(fd >= 0, "mkstemp");
    FILE *f = fdopen(fd, "w");
    hp_config_print(&c, f);
    fclose(f);
    hp_config_t d;
    hp_config_defaults(&d);
    HP_CHECK_OK(hp_config_load_file(&d, tmp));
    size_t n;
    const hp_config_key_t *s = hp_config_schema(&n);
    for (size_t i = 0; i < n; i++) {
        char dotted[128], a[HP_CONFIG_STR_MAX * 4], b[HP_CONFIG_STR_MAX * 4];
        snprintf(dotted, sizeof dotted, "%s.%s", s[i].section, s[i].key);
        if (strcmp(dotted, "job.config_file") == 0) continue;   /* set to the file read */
        HP_CHECK_OK(hp_config_get_string(&c, dotted, a, sizeof a));
        HP_CHECK_OK(hp_config_get_string(&d, dotted, b, sizeof b));
        HP_CHECK(strcmp(a, b) == 0, "round trip %s: '%s' vs '%s'", dotted, a, b);
    }
    unlink(tmp);
}

static void test_examples(void) {
    const char *names[] = {"llama3_debug.yaml", "qwen3_debug.yaml", "qwen3_lora_sft.yaml"};
    for (int i = 0; i < 3; i++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/examples/%s", src_dir_, names[i]);
        hp_config_t c;
        hp_config_defaults(&c);
        HP_CHECK_OK(hp_config_load_file(&c, p));
        HP_CHECK_OK(hp_config_validate(&c));
        if (i == 2) {   /* the LoRA keys: the YAML list, and what hp_config_apply_lora makes of them */
            HP_CHECK(c.lora.enable && c.lora.rank == 8 && c.lora.target_modules.n == 7, "lora keys of %s", p);
            hp_model_config_t mc;
            HP_CHECK_OK(hp_model_flavor("qwen3", "debugmodel", &mc));
            HP_CHECK_OK(hp_config_apply_lora(&c, &mc));
            HP_CHECK(mc.lora_rank == 8 && mc.lora_alpha == 16.0f && mc.lora_targets == 0x7f, "lora model fields");
            snprintf(c.lora.target_modules.items[1], HP_CONFIG_STR_MAX, "qkv");
            HP_CHECK_ERR(hp_config_apply_lora(&c, &mc), HP_ERR_INVALID_ARG, "'qkv'");
            snprintf(c.lora.target_modules.items[1], HP_CONFIG_STR_MAX, "wk");
            c.parallelism.expert_parallel_degree = 2;
            HP_CHECK_ERR(hp_config_apply_lora(&c, &mc), HP_ERR_UNSUPPORTED, "parallelism.expert_parallel_degree = 2");
        }
    }
}

static void test_cli(void) {
    hp_config_t c;
    char full[1200];
    data_path("full.yaml", full, sizeof full);
    char *argv[] = {"hp-train",
                    "--nproc", "4",
                    "--training.steps=20",
                    "--config", full,
                    "--training.seq_len", "32",
                    "--parallelism.tp=1",
                    "--checkpoint.enable",
                    "--optimizer.name", "Muon",
                    "--checkpoint.exclude_from_loading=[model, optimizer, train_state]",
                    "--metrics.enable_tensorboard", "false",
                    "extra"};
    int argc = (int)(sizeof argv / sizeof argv[0]);
    char *rest[32];
    int nrest = -1;
    HP_CHECK_OK(hp_config_parse_args(&c, argc, argv, rest, &nrest));
    HP_CHECK(c.training.steps == 20, "cli overrides file: %lld", (long long)c.training.steps);
    HP_CHECK(c.training.seq_len == 32, "space form");
    HP_CHECK(c.training.local_batch_size == 4, "file value kept");
    HP_CHECK(c.checkpoint.enable, "bare bool flag");
    HP_CHECK(strcmp(c.optimizer.name, "muon") == 0, "enum");
    HP_CHECK(c.checkpoint.exclude_from_loading.n == 3 &&
                 strcmp(c.checkpoint.exclude_from_loading.items[2], "train_state") == 0,
             "flow list");
    HP_CHECK(!c.metrics.enable_tensorboard, "bool value");
    HP_CHECK(nrest == 3 && strcmp(rest[0], "--nproc") == 0 && strcmp(rest[1], "4") == 0 &&
                 strcmp(rest[2], "extra") == 0,
             "rest: %d", nrest);

    char *bad[] = {"hp-train", "--trainig.steps=3"};
    HP_CHECK_ERR(hp_config_parse_args(&c, 2, bad, rest, &nrest), HP_ERR_INVALID_ARG,
                 "command line: unknown key '--trainig.steps'; did you mean '--training.steps'?");
    char *bad2[] = {"hp-train", "--training.steps", "many"};
    HP_CHECK_ERR(hp_config_parse_args(&c, 3, bad2, rest, &nrest), HP_ERR_INVALID_ARG,
                 "command line: key 'training.steps' expects an integer, got 'many'");
    char *bad3[] = {"hp-train", "--config", "/no/such/file.yaml"};
    HP_CHECK_ERR(hp_config_parse_args(&c, 3, bad3, rest, &nrest), HP_ERR_IO, "'/no/such/file.yaml'");
    char *bad4[] = {"hp-train", "--training.seq_len"};
    HP_CHECK_ERR(hp_config_parse_args(&c, 2, bad4, rest, &nrest), HP_ERR_INVALID_ARG, "needs a value");
}

/* docs/config.md must contain the generated tables verbatim. */
static void test_docs(void) {
    char p[1200];
    snprintf(p, sizeof p, "%s/docs/config.md", src_dir_);
    FILE *f = fopen(p, "rb");
    HP_CHECK(f != NULL, "cannot open %s", p);
    if (!f) return;
    static char doc[1 << 20];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    doc[n] = '\0';
    fclose(f);
    char *gen = NULL;
    size_t gen_n = 0;
    FILE *m = open_memstream(&gen, &gen_n);
    hp_config_write_markdown(m);
    fclose(m);
    HP_CHECK(strstr(doc, gen) != NULL,
             "docs/config.md is out of date with the schema; regenerate the tables with "
             "`build/test_config --write-doc` and paste them in");
    size_t ns;
    const hp_config_key_t *s = hp_config_schema(&ns);
    for (size_t i = 0; i < ns; i++) {
        char key[160];
        snprintf(key, sizeof key, "`%s.%s`", s[i].section, s[i].key);
        HP_CHECK(strstr(doc, key) != NULL, "docs/config.md lacks %s", key);
    }
    free(gen);
}

/* The parse helpers themselves. */
static void test_parse_helpers(void) {
    int64_t i64 = 7;
    int32_t i32 = 7;
    uint64_t u64 = 7;
    double f64 = 7;
    float f32 = 7;
    HP_CHECK_OK(hp_parse_i64("x", " 42 ", 0, 100, NULL, &i64));
    HP_CHECK(i64 == 42, "spaces around digits: %lld", (long long)i64);
    HP_CHECK_ERR(hp_parse_i64("--n", "12abc", 0, 100, NULL, &i64), HP_ERR_INVALID_ARG, "--n expects an integer, got '12abc'");
    HP_CHECK_ERR(hp_parse_i64("--n", "", 0, 100, NULL, &i64), HP_ERR_INVALID_ARG, "expects an integer, got ''");
    HP_CHECK_ERR(hp_parse_i64("--n", "99999999999999999999", INT64_MIN, INT64_MAX, NULL, &i64), HP_ERR_INVALID_ARG,
                 "--n expects an integer in [-9223372036854775808, 9223372036854775807], got '99999999999999999999'");
    HP_CHECK(i64 == 42, "a refused value leaves the output alone");
    HP_CHECK_ERR(hp_parse_i32("--n", "4294967312", 1, INT32_MAX, "why", &i32), HP_ERR_INVALID_ARG,
                 "--n expects an integer in [1, 2147483647], got '4294967312'; hint: why");
    HP_CHECK(i32 == 7, "not narrowed to 16");
    HP_CHECK_ERR(hp_parse_u64("--seed", "-1", UINT64_MAX, NULL, &u64), HP_ERR_INVALID_ARG,
                 "--seed expects a non-negative integer, got '-1'");
    HP_CHECK_OK(hp_parse_u64("--seed", "18446744073709551615", UINT64_MAX, NULL, &u64));
    HP_CHECK(u64 == UINT64_MAX, "u64 max");
    HP_CHECK_ERR(hp_parse_f64("--t", "1e-400", 0, 1, NULL, &f64), HP_ERR_INVALID_ARG, "underflows a double");
    HP_CHECK_ERR(hp_parse_f64("--t", "inf", -HUGE_VAL, HUGE_VAL, NULL, &f64), HP_ERR_INVALID_ARG, "finite");
    HP_CHECK_ERR(hp_parse_f64("--t", "2", 0, 1, NULL, &f64), HP_ERR_INVALID_ARG, "--t expects a number in [0, 1], got '2'");
    HP_CHECK_ERR(hp_parse_f32("--eps", "1e-300", 0, 1, NULL, &f32), HP_ERR_INVALID_ARG, "--eps = 1e-300 underflows float32");
    HP_CHECK_ERR(hp_parse_f32("--big", "1e39", -HUGE_VAL, HUGE_VAL, NULL, &f32), HP_ERR_INVALID_ARG,
                 "not representable in float32");
    HP_CHECK_OK(hp_parse_f32("--eps", "0", 0, 1, NULL, &f32));
    HP_CHECK(f32 == 0.0f, "0 is representable");
    HP_CHECK_OK(hp_check_f32("x", 1.2e-38));
    const char *flags[] = {"--model", "--flavor", "--dtype"};
    HP_CHECK(hp_nearest_name("--dtyp", flags, 3) == flags[2], "nearest");
    HP_CHECK(hp_nearest_name("--zzzzzzzzzzzz", flags, 3) == NULL, "nothing near");
    HP_CHECK_ERR(hp_flag_unknown_error("tool", "--flavour=x", flags, 3), HP_ERR_INVALID_ARG,
                 "tool: unknown option '--flavour'; did you mean '--flavor'? (options: --model, --flavor, --dtype)");
    char *argv[] = {"tool", "--dtype=bf16", "--model", "m", "--flavor"};
    const char *v = NULL;
    int i = 1;
    HP_CHECK(hp_flag_value("tool", 5, argv, &i, "--dtype", &v) == 1 && !strcmp(v, "bf16") && i == 1, "=form");
    i = 1;
    HP_CHECK(hp_flag_value("tool", 5, argv, &i, "--dtyp", &v) == 0, "a prefix is not the flag");
    i = 2;
    HP_CHECK(hp_flag_value("tool", 5, argv, &i, "--model", &v) == 1 && !strcmp(v, "m") && i == 3, "space form");
    i = 4;
    HP_CHECK(hp_flag_value("tool", 5, argv, &i, "--flavor", &v) == -1, "missing value");
    HP_CHECK(strstr(hp_last_error(), "tool: option '--flavor' needs a value") != NULL, "%s", hp_last_error());
}

/* Config values are range-checked where they enter: nothing is narrowed, nothing underflows. */
static void test_ranges(void) {
    hp_config_t c;
    char p[1200];
    hp_config_defaults(&c);
    HP_CHECK_ERR(hp_config_set(&c, "training.seq_len", "4294967312", "command line"), HP_ERR_INVALID_ARG,
                 "command line: key 'training.seq_len' expects an integer in [1, 1048576], got '4294967312'; hint:");
    HP_CHECK(c.training.seq_len == 2048, "refused value left the default: %lld", (long long)c.training.seq_len);
    HP_CHECK_ERR(hp_config_set(&c, "training.local_batch_size", "4294967304", "cli"), HP_ERR_INVALID_ARG,
                 "expects an integer in [1, 2147483647], got '4294967304'; hint: the value is held in a 32-bit int");
    HP_CHECK_ERR(hp_config_set(&c, "parallelism.tp", "4294967298", "cli"), HP_ERR_INVALID_ARG,
                 "key 'parallelism.tensor_parallel_degree' expects an integer in [-1, 16777216]");
    HP_CHECK_ERR(hp_config_set(&c, "tokenizer.vocab_size", "4294967360", "cli"), HP_ERR_INVALID_ARG,
                 "key 'tokenizer.vocab_size' expects an integer in [1, 16777216]");
    HP_CHECK_ERR(hp_config_set(&c, "training.steps", "99999999999999999999", "cli"), HP_ERR_INVALID_ARG,
                 "key 'training.steps' expects an integer in [1, 9223372036854775807]");
    HP_CHECK_OK(hp_config_set(&c, "training.seed", "-5", "cli"));   /* int64 keys keep their full range */
    HP_CHECK_OK(hp_config_set(&c, "training.seq_len", "1048576", "cli"));
    /* floats used in float32 */
    HP_CHECK_ERR(hp_config_set(&c, "optimizer.eps", "1e-300", "command line"), HP_ERR_INVALID_ARG,
                 "command line: key 'optimizer.eps' = 1e-300 underflows float32");
    HP_CHECK_CLOSE(c.optimizer.eps, 1e-8, 0, 0);
    HP_CHECK_ERR(hp_config_set(&c, "optimizer.lr", "1e39", "cli"), HP_ERR_INVALID_ARG, "not representable in float32");
    HP_CHECK_OK(hp_config_set(&c, "optimizer.weight_decay", "0", "cli"));   /* 0 is exact in float32 */
    HP_CHECK_OK(hp_config_set(&c, "metrics.peak_flops", "1e300", "cli"));   /* a double key: no f32 check */
    /* from a file: file:line named */
    hp_config_defaults(&c);
    HP_CHECK_ERR(hp_config_load_file(&c, data_path("out_of_range.yaml", p, sizeof p)), HP_ERR_INVALID_ARG,
                 "out_of_range.yaml:2: key 'training.seq_len' expects an integer in [1, 1048576], got '4294967312'");
    HP_CHECK_ERR(hp_config_load_file(&c, data_path("eps_underflow.yaml", p, sizeof p)), HP_ERR_INVALID_ARG,
                 "eps_underflow.yaml:3: key 'optimizer.eps' = 1e-300 underflows float32");
    /* values set directly in the struct: validate repeats the checks */
    hp_config_defaults(&c);
    c.optimizer.eps = 1e-300;
    HP_CHECK_ERR(hp_config_validate(&c), HP_ERR_INVALID_ARG, "config key 'optimizer.eps' = 1e-300 underflows float32");
    hp_config_defaults(&c);
    c.training.seq_len = 4294967312LL;
    HP_CHECK_ERR(hp_config_validate(&c), HP_ERR_INVALID_ARG,
                 "config key 'training.seq_len' = 4294967312 is out of range: expected an integer in [1, 1048576]");
    hp_config_defaults(&c);
    c.optimizer.lr = 0;
    HP_CHECK_ERR(hp_config_validate(&c), HP_ERR_INVALID_ARG, "'optimizer.lr': must be > 0");
}

/* A second YAML document is refused with the file and the line; a leading '---' is fine. */
static void test_multi_document(void) {
    hp_config_t c;
    char p[1200];
    hp_config_defaults(&c);
    HP_CHECK_ERR(hp_config_load_file(&c, data_path("multi_doc.yaml", p, sizeof p)), HP_ERR_FORMAT,
                 "multi_doc.yaml:3: a second YAML document starts here ('---')");
    hp_config_defaults(&c);
    HP_CHECK_OK(hp_config_load_file(&c, data_path("leading_marker.yaml", p, sizeof p)));
    HP_CHECK(c.training.steps == 21, "one document with a leading ---: %lld", (long long)c.training.steps);
}

/* Model dimensions: bounded where they are validated, the bad field named. */
static void test_model_bounds(void) {
    hp_model_config_t mc;
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.vocab_size = HP_MODEL_MAX_VOCAB + 1;
    HP_CHECK_ERR(hp_model_config_validate(&mc), HP_ERR_INVALID_ARG,
                 "'llama3/debugmodel': vocab_size = 16777217 exceeds the limit 16777216");
    HP_CHECK_OK(hp_model_flavor("llama3", "debugmodel", &mc));
    mc.max_seq_len = 1000000000;
    HP_CHECK_ERR(hp_model_config_validate(&mc), HP_ERR_INVALID_ARG, "max_seq_len = 1000000000 exceeds the limit 1048576");
    HP_CHECK_OK(hp_model_flavor("llama3", "405B", &mc));   /* the largest real flavor passes */
    mc.n_layers = HP_MODEL_MAX_LAYERS;
    HP_CHECK_ERR(hp_model_config_validate(&mc), HP_ERR_INVALID_ARG, "parameters (vocab_size 128256 x dim 16384, 4096 layers");
}

/* Issue 28: the keys that let hp-ckpt to-hf express a DeepSeek-V3 HF config (node-limited
 * groups, YaRN's betas, the MLA norms' eps) reach the model config, and their bad values (and
 * pipeline_parallel_layers_per_stage = 0) are refused naming the key and the value. */
static void test_issue28_keys(void) {
    hp_config_t c;
    hp_model_config_t mc;
    hp_config_defaults(&c);
    snprintf(c.model.name, sizeof c.model.name, "deepseek_v3");
    HP_CHECK_OK(hp_config_resolve_model(&c, 2048, "the test", 0, &mc));
    HP_CHECK(mc.mla_norm_eps == 0.0f && hp_model_mla_norm_eps(&mc) == mc.norm_eps && mc.norm_eps == 1e-5f,
             "TorchTitan's deepseek_v3 flavors: q_norm / kv_norm use norm_eps (%g, %g)", mc.mla_norm_eps, mc.norm_eps);
    HP_CHECK_OK(hp_config_set(&c, "model.moe_n_expert_groups", "4", "test"));
    HP_CHECK_OK(hp_config_set(&c, "model.moe_n_limited_groups", "2", "test"));
    HP_CHECK_OK(hp_config_set(&c, "model.rope_beta_fast", "16", "test"));
    HP_CHECK_OK(hp_config_set(&c, "model.rope_beta_slow", "2", "test"));
    HP_CHECK_OK(hp_config_set(&c, "model.mla_norm_eps", "1e-6", "test"));
    HP_CHECK_OK(hp_config_resolve_model(&c, 2048, "the test", 0, &mc));
    HP_CHECK(mc.moe_expert_groups == 4 && mc.moe_limited_groups == 2 && mc.rope_beta_fast == 16.0f &&
                 mc.rope_beta_slow == 2.0f && hp_model_mla_norm_eps(&mc) == 1e-6f,
             "the keys reach the model: groups %d/%d, beta %g/%g, mla eps %g", mc.moe_expert_groups,
             mc.moe_limited_groups, mc.rope_beta_fast, mc.rope_beta_slow, hp_model_mla_norm_eps(&mc));
    HP_CHECK_OK(hp_config_set(&c, "model.moe_n_limited_groups", "5", "test"));
    HP_CHECK_ERR(hp_config_resolve_model(&c, 2048, "the test", 0, &mc), HP_ERR_INVALID_ARG,
                 "'model.moe_n_limited_groups' = 5 must be in 1 .. model.moe_n_expert_groups = 4");
    HP_CHECK_OK(hp_config_set(&c, "model.moe_n_limited_groups", "2", "test"));
    HP_CHECK_OK(hp_config_set(&c, "model.moe_n_expert_groups", "3", "test"));
    HP_CHECK_ERR(hp_config_resolve_model(&c, 2048, "the test", 0, &mc), HP_ERR_INVALID_ARG,
                 "'model.moe_num_experts' = 8 (the flavor's) is not divisible by model.moe_n_expert_groups = 3");
    HP_CHECK_OK(hp_config_set(&c, "model.moe_n_expert_groups", "4", "test"));
    HP_CHECK_OK(hp_config_set(&c, "model.rope_beta_slow", "16", "test"));
    HP_CHECK_ERR(hp_config_resolve_model(&c, 2048, "the test", 0, &mc), HP_ERR_INVALID_ARG,
                 "'model.rope_beta_fast' = 16 must be above model.rope_beta_slow = 16");
    hp_config_defaults(&c);   /* MLA keys on a GQA model */
    HP_CHECK_OK(hp_config_set(&c, "model.rope_beta_fast", "16", "test"));
    HP_CHECK_ERR(hp_config_resolve_model(&c, 2048, "the test", 0, &mc), HP_ERR_INVALID_ARG,
                 "config key 'model.rope_beta_fast' sizes MLA attention, which model.name = llama3 does not have");
    /* layers_per_stage: 0 is no split (TorchTitan divides by it) */
    hp_config_defaults(&c);
    hp_parallelize_options_t po;
    HP_CHECK_OK(hp_parallelize_options_from_config(&c, &po));
    HP_CHECK(po.pp.layers_per_stage == -1, "the default: split evenly (%d)", po.pp.layers_per_stage);
    HP_CHECK_OK(hp_config_set(&c, "parallelism.pipeline_parallel_layers_per_stage", "0", "test"));
    HP_CHECK_ERR(hp_parallelize_options_from_config(&c, &po), HP_ERR_INVALID_ARG,
                 "config key 'parallelism.pipeline_parallel_layers_per_stage' = 0: expected at least 1");
    HP_CHECK_OK(hp_config_set(&c, "parallelism.pipeline_parallel_layers_per_stage", "2", "test"));
    HP_CHECK_OK(hp_parallelize_options_from_config(&c, &po));
    HP_CHECK(po.pp.layers_per_stage == 2, "layers_per_stage 2 (%d)", po.pp.layers_per_stage);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--write-doc") == 0) {
        hp_config_write_markdown(stdout);
        return 0;
    }
    const char *src = getenv("HP_SOURCE_DIR");
    snprintf(src_dir_, sizeof src_dir_, "%s", src ? src : "..");
    test_defaults();
    test_errors();
    test_full_file();
    test_examples();
    test_cli();
    test_docs();
    test_parse_helpers();
    test_ranges();
    test_multi_document();
    test_model_bounds();
    test_issue28_keys();
    return hp_test_finish("test_config");
}
