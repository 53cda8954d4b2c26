/* Custom model dims through the config (issue 12 item 3): the model.* keys build a llama3
 * model of dim 80, 5 heads, 1 KV head, head_dim 16, FFN 224, vocab 257 (and a qwen3-shaped one
 * with qk-norm and tied embeddings); parameter count against the hand formula, forward and
 * backward against finite differences, AdamW lowers the loss, HF export / import bitwise
 * (library and hp-ckpt with --model.* flags), hp-train through YAML keys and dotted
 * overrides, and refused values naming the key. */
// hp-test: ranks 1 timeout 120
#define _GNU_SOURCE
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_corpus.h"
#include "hyperparallel/checkpoint.h"
#include "hyperparallel/config.h"
#include "hyperparallel/model.h"
#include "hyperparallel/models.h"
#include "hyperparallel/optim.h"
#include "hyperparallel/safetensors.h"
#include "hyperparallel/tokenizer.h"

static char ROOT[] = "/tmp/hp_test_custom_dims_XXXXXX";
static char BDIR[1024];
static char OUT[1 << 17];

/* The custom shape on the llama3 debugmodel flavor, as command-line overrides. */
static char *llama_argv[] = {"hp-train", "--model.name=llama3", "--model.flavor", "debugmodel", "--model.dim", "80",
                             "--model.n_layers=2", "--model.n_heads", "5", "--model.n_kv_heads=1", "--model.head_dim",
                             "16", "--model.hidden_dim=224", "--model.vocab_size", "257"};
/* qwen3-shaped: qk-norm and tied embeddings (the flavor's), rope scaling off, GQA 4:2. */
static char *qwen_argv[] = {"hp-train", "--model.name", "qwen3", "--model.dim=64", "--model.n_layers", "2",
                            "--model.n_heads=4", "--model.n_kv_heads", "2", "--model.head_dim=16",
                            "--model.hidden_dim", "96", "--model.vocab_size=257", "--model.qk_norm",
                            "--model.tie_embeddings=true"};

static void resolve(char **argv, int argc, int seq_len, hp_model_config_t *mc) {
    hp_config_t *c = calloc(1, sizeof *c);
    int nrest = 0;
    HP_CHECK_OK(hp_config_parse_args(c, argc, argv, NULL, &nrest));
    HP_CHECK(nrest == 0, "every argument is a config key (%d left)", nrest);
    HP_CHECK_OK(hp_config_validate(c));
    HP_CHECK_OK(hp_config_resolve_model(c, 0, NULL, seq_len, mc));
    free(c);
}

/* Parameters by hand: per layer wq (H*hd, D), wk, wv (KV*hd, D), wo (D, H*hd), w1, w3 (F, D),
 * w2 (D, F), two RMSNorm weights (D) and, with qk-norm, q_norm and k_norm (hd); embedding
 * (V, D), final norm (D), output (V, D) unless tied. */
static int64_t hand_count(int64_t V, int64_t D, int64_t L, int64_t H, int64_t KV, int64_t hd, int64_t F, int qk,
                          int tied) {
    int64_t layer = D * H * hd + 2 * D * KV * hd + H * hd * D + 3 * D * F + 2 * D + (qk ? 2 * hd : 0);
    return V * D + L * layer + D + (tied ? 0 : V * D);
}

static int64_t numel(const hp_tensor_t *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

static void test_config_shape(void) {
    hp_model_config_t mc;
    resolve(llama_argv, (int)(sizeof llama_argv / sizeof llama_argv[0]), 16, &mc);
    HP_CHECK(mc.dim == 80 && mc.n_layers == 2 && mc.n_heads == 5 && mc.n_kv_heads == 1 && mc.head_dim == 16 &&
                 mc.hidden_dim == 224 && mc.vocab_size == 257 && mc.max_seq_len == 16 && !mc.qk_norm &&
                 !mc.tie_embeddings && mc.rope_scaling && strcmp(mc.name, "llama3") == 0,
             "llama3 custom: dim %d L %d H %d KV %d hd %d F %d V %d T %d", mc.dim, mc.n_layers, mc.n_heads,
             mc.n_kv_heads, mc.head_dim, mc.hidden_dim, mc.vocab_size, mc.max_seq_len);
    /* 2 x 20560 (embedding, output) + 2 x 69280 (layers) + 80 (norm) */
    int64_t want = hand_count(257, 80, 2, 5, 1, 16, 224, 0, 0);
    HP_CHECK(want == 179760, "hand formula %lld", (long long)want);
    HP_CHECK(hp_model_param_count(&mc, 0) == want, "param count %lld, by hand %lld",
             (long long)hp_model_param_count(&mc, 0), (long long)want);
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 1, 16, &m));
    if (m) {   /* and the allocated tensors hold exactly that many */
        int64_t n = 0;
        for (int i = 0; i < hp_model_num_params(m); i++) n += numel(&hp_model_params(m)[i].value.local);
        HP_CHECK(n == want, "allocated %lld parameters, by hand %lld", (long long)n, (long long)want);
        hp_param_t *wk = hp_model_find_param(m, "layers.1.attention.wk.weight");
        HP_CHECK(wk && wk->value.local.shape[0] == 16 && wk->value.local.shape[1] == 80, "wk is (KV*hd, D) = (16, 80)");
        hp_model_destroy(m);
    }
    resolve(qwen_argv, (int)(sizeof qwen_argv / sizeof qwen_argv[0]), 16, &mc);
    HP_CHECK(mc.dim == 64 && mc.n_heads == 4 && mc.n_kv_heads == 2 && mc.head_dim == 16 && mc.hidden_dim == 96 &&
                 mc.qk_norm && mc.tie_embeddings && strcmp(mc.name, "qwen3") == 0,
             "qwen3 custom: dim %d hd %d F %d qk %d tie %d", mc.dim, mc.head_dim, mc.hidden_dim, mc.qk_norm,
             mc.tie_embeddings);
    HP_CHECK(hp_model_param_count(&mc, 0) == hand_count(257, 64, 2, 4, 2, 16, 96, 1, 1), "qwen3 param count %lld",
             (long long)hp_model_param_count(&mc, 0));

    /* what the flavor derives follows the overridden fields: llama3 head_dim = dim / n_heads,
     * n_kv_heads = n_heads (MHA flavor), the FFN from TorchTitan's rule */
    hp_config_t *c = calloc(1, sizeof *c);
    hp_config_defaults(c);
    HP_CHECK_OK(hp_config_set(c, "model.dim", "96", "test"));
    HP_CHECK_OK(hp_config_set(c, "model.n_heads", "4", "test"));
    HP_CHECK_OK(hp_config_resolve_model(c, 300, "the test", 32, &mc));
    /* hidden = 256 * ceil(int(2 * 4 * 96 / 3) / 256) = 256 */
    HP_CHECK(mc.head_dim == 24 && mc.n_kv_heads == 4 && mc.hidden_dim == 256 && mc.vocab_size == 300 &&
                 mc.max_seq_len == 32, "derived: hd %d kv %d F %d V %d T %d", mc.head_dim, mc.n_kv_heads,
             mc.hidden_dim, mc.vocab_size, mc.max_seq_len);
    HP_CHECK_OK(hp_config_set(c, "model.multiple_of", "32", "test"));
    HP_CHECK_OK(hp_config_resolve_model(c, 300, "the test", 32, &mc));
    HP_CHECK(mc.hidden_dim == 256, "multiple_of 32: F %d (int(768 / 3) = 256)", mc.hidden_dim);
    HP_CHECK_OK(hp_config_set(c, "model.ffn_dim_multiplier", "1.5", "test"));
    HP_CHECK_OK(hp_config_resolve_model(c, 300, "the test", 32, &mc));
    HP_CHECK(mc.hidden_dim == 384, "multiplier 1.5: F %d (32 * ceil(384 / 32))", mc.hidden_dim);
    free(c);
}

/* ---- forward, backward and finite differences --------------------------------------------- */

typedef struct { hp_model_t m; int32_t *tok, *tgt; int B, T; float div; } batch_t;

static double loss_of(batch_t *b) {
    float l = 0;
    HP_ASSERT(hp_model_forward(b->m, b->tok, b->tgt, b->B, b->T, b->div, &l) == HP_OK);
    return hp_model_loss_sum(b->m) / b->div;   /* double: the f32 loss would quantise the differences */
}

/* |fd - an| <= 2e-4 + 2e-2 |an|: the f32 forward moves the (double-summed) mean loss by ~1e-6
 * between nearby points, /2h = 1e-2 -> ~1e-4 of noise in fd; the O(h^2) truncation of the
 * central difference at h = 1e-2 stays below 1% of the derivative (as test_nn_gradcheck's models). */
static int fd_agrees(double fd, double an) { return fabs(fd - an) <= 2e-4 + 2e-2 * fabs(an); }

static void test_grad_and_train(void) {
    hp_model_config_t mc;
    resolve(llama_argv, (int)(sizeof llama_argv / sizeof llama_argv[0]), 16, &mc);
    hp_model_t m = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 2, 16, &m));
    if (!m) return;
    HP_CHECK_OK(hp_model_init_weights(m, 11));
    int32_t tok[32], tgt[32];
    for (int i = 0; i < 32; i++) {
        tok[i] = (i * 37 + 5) % 257;
        tgt[i] = (i * 53 + 11) % 257;
    }
    tgt[7] = -100;
    batch_t b = {m, tok, tgt, 2, 16, 31.0f};
    double l0 = loss_of(&b);
    HP_CHECK(fabs(l0 - log(257.0)) < 1.5, "initial loss %.4f near ln 257 = %.4f", l0, log(257.0));
    /* linears x8 (std 0.16) and norms off 1, as test_nn_gradcheck: at the init's std 0.02 the
     * attention gradients are ~1e-4, too close to the bound's absolute term to test anything */
    for (int i = 0; i < hp_model_num_params(m); i++) {
        hp_param_t *p = &hp_model_params(m)[i];
        float *w = p->value.local.data;
        int is_norm = strstr(p->name, "norm") != NULL, is_emb = strstr(p->name, "tok_embeddings") != NULL;
        for (int64_t k = 0; k < numel(&p->value.local); k++)
            w[k] = is_norm ? 1.0f + 0.3f * sinf((float)k * 0.37f) : is_emb ? w[k] : 8.0f * w[k];
    }
    HP_CHECK_OK(hp_model_zero_grad(m));
    loss_of(&b);
    HP_CHECK_OK(hp_model_backward(m));
    /* the largest-gradient element of parameters on every path: embedding, the shared KV head,
     * queries, FFN, norms, output */
    const char *names[] = {"tok_embeddings.weight", "layers.0.attention.wk.weight", "layers.0.attention.wv.weight",
                           "layers.1.attention.wq.weight", "layers.0.feed_forward.w2.weight",
                           "layers.1.attention_norm.weight", "norm.weight", "output.weight"};
    int checked = 0, injected_fails = 0;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        hp_param_t *p = hp_model_find_param(m, names[k]);
        HP_CHECK(p != NULL, "parameter %s", names[k]);
        if (!p) continue;
        float *w = p->value.local.data;
        const float *g = p->grad.local.data;
        int64_t n = numel(&p->value.local), imax = 0;
        for (int64_t i = 1; i < n; i++)
            if (fabsf(g[i]) > fabsf(g[imax])) imax = i;
        const double h = 1e-2, an = g[imax];
        const float orig = w[imax];
        w[imax] = orig + (float)h;
        double lp = loss_of(&b);
        w[imax] = orig - (float)h;
        double lm = loss_of(&b);
        w[imax] = orig;
        /* the step actually taken in float32 */
        double fd = (lp - lm) / ((double)(orig + (float)h) - (double)(orig - (float)h));
        HP_CHECK(fd_agrees(fd, an) && fabs(an) > 1e-2, "%s[%lld]: fd %.8g analytic %.8g", names[k], (long long)imax,
                 fd, an);
        if (getenv("HP_VERBOSE")) printf("%s[%lld]: fd %.8g analytic %.8g\n", names[k], (long long)imax, fd, an);
        checked++;
        /* negative control: a 5% error in the analytic value fails the bound */
        injected_fails += !fd_agrees(fd, an * 1.05 + (an >= 0 ? 3e-4 : -3e-4));
    }
    HP_CHECK(checked == 8 && injected_fails == checked, "an injected 5%% gradient error passed %d of %d checks",
             checked - injected_fails, checked);

    /* AdamW on the same batch: the loss falls */
    hp_optim_config_t oc = hp_optim_default(HP_OPTIM_ADAMW);
    oc.lr = 3e-3;
    oc.weight_decay = 0.0;
    hp_optim_t opt = NULL;
    HP_CHECK_OK(hp_optim_create(&oc, hp_model_params(m), hp_model_num_params(m), &opt));
    double first = 0, last = 0;
    for (int s = 0; opt && s < 8; s++) {
        HP_CHECK_OK(hp_model_zero_grad(m));
        double l = loss_of(&b);
        HP_CHECK_OK(hp_model_backward(m));
        HP_CHECK_OK(hp_optim_step(opt, 1.0));
        if (s == 0) first = l;
        last = l;
        HP_CHECK(isfinite(l), "step %d loss %g", s, l);
    }
    HP_CHECK(last < first - 0.5, "AdamW: loss %.4f -> %.4f did not fall", first, last);
    hp_optim_free(opt);
    hp_model_destroy(m);
}

/* ---- HF export / import ------------------------------------------------------------------- */

static int params_equal(hp_model_t a, hp_model_t b, const char **first_diff) {
    *first_diff = NULL;
    if (hp_model_num_params(a) != hp_model_num_params(b)) return 0;
    for (int i = 0; i < hp_model_num_params(a); i++) {
        const hp_tensor_t *x = &hp_model_params(a)[i].value.local, *y = &hp_model_params(b)[i].value.local;
        if (numel(x) != numel(y) || memcmp(x->data, y->data, sizeof(float) * (size_t)numel(x)) != 0) {
            *first_diff = hp_model_params(a)[i].name;
            return 0;
        }
    }
    return 1;
}

static void test_hf_round_trip(const char *tag, char **argv, int argc, int want_dim, int want_heads, int want_kv) {
    hp_model_config_t mc;
    resolve(argv, argc, 16, &mc);
    hp_model_t m = NULL, back = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 1, 16, &m));
    HP_CHECK_OK(hp_model_create(&mc, 1, 16, &back));
    if (!m || !back) return;
    HP_CHECK_OK(hp_model_init_weights(m, 5));
    char dir[400], path[500];
    snprintf(dir, sizeof dir, "%s/hf_%s", ROOT, tag);
    HP_CHECK_OK(hp_hf_export(dir, hp_model_hf_adapter(&mc), &mc, hp_model_params(m), hp_model_num_params(m), NULL,
                             HP_F32, 64 * 1024));
    /* config.json carries the custom dims */
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_object *cj = json_object_from_file(path), *v;
    const struct { const char *k; int want; } f[] = {
        {"hidden_size", want_dim}, {"num_attention_heads", want_heads}, {"num_key_value_heads", want_kv},
        {"head_dim", 16}, {"intermediate_size", mc.hidden_dim}, {"vocab_size", 257}, {"num_hidden_layers", 2}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        HP_CHECK(cj && json_object_object_get_ex(cj, f[i].k, &v) && json_object_get_int(v) == f[i].want,
                 "%s: config.json %s != %d", tag, f[i].k, f[i].want);
    HP_CHECK(cj && json_object_object_get_ex(cj, "tie_word_embeddings", &v) &&
                 json_object_get_boolean(v) == !!mc.tie_embeddings, "%s: tie_word_embeddings", tag);
    json_object_put(cj);
    HP_CHECK_OK(hp_hf_import(dir, hp_model_hf_adapter(&mc), &mc, hp_model_params(back), hp_model_num_params(back),
                             NULL));
    const char *diff = NULL;
    HP_CHECK(params_equal(m, back, &diff), "%s: HF round trip differs first at %s", tag, diff ? diff : "(count)");
    /* negative control: one flipped bit is seen */
    float *w = hp_model_params(back)[1].value.local.data;
    uint32_t bits;
    memcpy(&bits, w, 4);
    bits ^= 1u;
    memcpy(w, &bits, 4);
    HP_CHECK(!params_equal(m, back, &diff), "%s: a flipped bit went unnoticed", tag);
    /* a model of other dims is refused by config.json, naming the field and the key */
    hp_model_config_t other = mc;
    other.n_kv_heads = want_heads;
    hp_model_t o = NULL;
    HP_CHECK_OK(hp_model_create(&other, 1, 16, &o));
    if (o) {
        HP_CHECK_ERR(hp_hf_import(dir, hp_model_hf_adapter(&other), &other, hp_model_params(o), hp_model_num_params(o),
                                  NULL),
                     HP_ERR_INVALID_ARG, "config.json 'num_key_value_heads'");
        HP_CHECK(strstr(hp_last_error(), "model.n_kv_heads"), "the hint names the key: %s", hp_last_error());
        hp_model_destroy(o);
    }
    hp_model_destroy(m);
    hp_model_destroy(back);
}

/* hp-ckpt to-hf / from-hf with the --model.* flags: DCP -> HF -> DCP bitwise. */
static int tool(const char *tool_name, const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd %s && '%s/%s' %s 2>&1", ROOT, BDIR, tool_name, args);
    return hp_test_run_capture(cmd, OUT, sizeof OUT);
}

static const char *FLAGS = "--model llama3 --flavor debugmodel --model.dim 80 --model.n_layers=2 --model.n_heads 5 "
                           "--model.n_kv_heads=1 --model.head_dim 16 --model.hidden_dim 224";

static void test_hp_ckpt(void) {
    char tp[1200];
    snprintf(tp, sizeof tp, "%s/hp-ckpt", BDIR);
    if (access(tp, X_OK) != 0) {
        printf("SKIP part: %s not built\n", tp);
        return;
    }
    hp_model_config_t mc;
    resolve(llama_argv, (int)(sizeof llama_argv / sizeof llama_argv[0]), 16, &mc);
    hp_model_t m = NULL, back = NULL;
    HP_CHECK_OK(hp_model_create(&mc, 1, 1, &m));
    HP_CHECK_OK(hp_model_create(&mc, 1, 1, &back));
    if (!m || !back) return;
    HP_CHECK_OK(hp_model_init_weights(m, 9));
    int np = hp_model_num_params(m);
    hp_dcp_tensor_t *ts = calloc((size_t)np, sizeof *ts);
    for (int i = 0; i < np; i++) ts[i] = (hp_dcp_tensor_t){hp_model_params(m)[i].name, &hp_model_params(m)[i].value, -1, 0};
    hp_dcp_state_t st = {ts, np, NULL, 0};
    char d[500];
    snprintf(d, sizeof d, "%s/dcp", ROOT);
    HP_CHECK_OK(hp_dcp_save(d, &st, NULL));
    char args[1024];
    snprintf(args, sizeof args, "to-hf dcp hf %s", FLAGS);
    int rc = tool("hp-ckpt", args);
    HP_CHECK(rc == 0 && strstr(OUT, "dim 80, n_layers 2, n_heads 5, n_kv_heads 1, head_dim 16, hidden_dim 224"),
             "to-hf: exit %d\n%s", rc, OUT);
    snprintf(args, sizeof args, "from-hf hf dcp2 %s", FLAGS);
    rc = tool("hp-ckpt", args);
    HP_CHECK(rc == 0, "from-hf: exit %d\n%s", rc, OUT);
    for (int i = 0; i < np; i++) ts[i] = (hp_dcp_tensor_t){hp_model_params(back)[i].name, &hp_model_params(back)[i].value, -1, 0};
    snprintf(d, sizeof d, "%s/dcp2", ROOT);
    HP_CHECK_OK(hp_dcp_load(d, &st, NULL, NULL));
    const char *diff = NULL;
    HP_CHECK(params_equal(m, back, &diff), "hp-ckpt DCP -> HF -> DCP differs first at %s", diff ? diff : "(count)");
    /* without the flags: refused by config.json, naming the flag, and nothing written */
    rc = tool("hp-ckpt", "from-hf hf dcp3 --model llama3 --flavor debugmodel");
    HP_CHECK(rc == 1 && strstr(OUT, "config.json 'hidden_size' = 80") && strstr(OUT, "--model.dim 80"),
             "from-hf without the dims: exit %d\n%s", rc, OUT);
    /* fewer layers than the checkpoint: refused instead of dropping layers.1.* */
    snprintf(args, sizeof args, "to-hf dcp hf4 %s --model.n_layers 1", FLAGS);
    rc = tool("hp-ckpt", args);
    HP_CHECK(rc == 1 && strstr(OUT, "holds model tensor 'layers.1."), "to-hf with fewer layers: exit %d\n%s", rc, OUT);
    rc = tool("hp-ckpt", "to-hf dcp hf5 --model llama3 --flavor debugmodel --model.dimm 80");
    HP_CHECK(rc == 2 && strstr(OUT, "did you mean 'model.dim'?"), "misspelt flag: exit %d\n%s", rc, OUT);
    char p4[500], p3[500];
    snprintf(p4, sizeof p4, "%s/hf4", ROOT);
    snprintf(p3, sizeof p3, "%s/dcp3", ROOT);
    HP_CHECK(access(p4, F_OK) != 0 && access(p3, F_OK) != 0, "a refused command wrote its output");
    free(ts);
    hp_model_destroy(m);
    hp_model_destroy(back);
}

/* ---- hp-train ------------------------------------------------------------------------------- */

static const char *const sentences_[] = {
    "the quick brown fox jumps over the lazy dog", "a journey of a thousand miles begins with a single step",
    "all that glitters is not gold", "the early bird catches the worm", "actions speak louder than words"};

static int train(const char *extra) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && '%s/hp-train' --job.print_config=false --job.dump_folder=out --tokenizer.path=tok.json "
             "--data.path=corpus.txt --data.format=text --data.text_separator=percent --training.seq_len=16 "
             "--training.local_batch_size=2 --training.seed=3 --optimizer.lr=3e-3 --lr_scheduler.warmup_steps=1 "
             "--metrics.log_freq=1 --metrics.peak_flops=-1 --parallelism.data_parallel_shard_degree=1 %s 2>&1",
             ROOT, BDIR, extra);
    return hp_test_run_capture(cmd, OUT, sizeof OUT);
}

static void test_trainer(void) {
    char tp[1200];
    snprintf(tp, sizeof tp, "%s/hp-train", BDIR);
    if (access(tp, X_OK) != 0) {
        printf("SKIP part: %s not built\n", tp);
        return;
    }
    /* a tiny corpus and a 320-token tokenizer */
    char path[600];
    snprintf(path, sizeof path, "%s/corpus.txt", ROOT);
    static char text[1 << 16];
    size_t n = 0;
    for (int d = 0; d < 200; d++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s %s.\n%%\n", sentences_[(d * d + d / 3) % 5],
                              sentences_[(d * 7 + 2) % 5]);
    FILE *f = fopen(path, "w");
    HP_CHECK(f && fwrite(text, 1, n, f) == n, "write %s", path);
    if (f) fclose(f);
    snprintf(path, sizeof path, "%s/tok.json", ROOT);
    hp_test_train_tokenizer(text, n, path);

    /* the dims from a YAML file, n_kv_heads overridden on the command line */
    snprintf(path, sizeof path, "%s/custom.yaml", ROOT);
    f = fopen(path, "w");
    HP_CHECK(f != NULL, "write %s", path);
    if (f) {
        fprintf(f, "model:\n  name: llama3\n  flavor: debugmodel\n  dim: 80\n  n_layers: 2\n  n_heads: 5\n"
                   "  n_kv_heads: 5\n  head_dim: 16\n  hidden_dim: 224\n  rope_theta: 10000\n"
                   "training:\n  steps: 6\n");
        fclose(f);
    }
    int rc = train("--config custom.yaml --model.n_kv_heads 1");
    HP_CHECK(rc == 0 && strstr(OUT, "model dims: dim 80, n_layers 2, n_heads 5, n_kv_heads 1, head_dim 16, "
                                    "hidden_dim 224, vocab_size 320") &&
                 strstr(OUT, "rope_theta 10000,") && strstr(OUT, "model.n_kv_heads=1") &&
                 strstr(OUT, "final weights written"),
             "hp-train with custom dims: exit %d\n%s", rc, OUT);
    double l1 = NAN, l6 = NAN;
    const char *p1 = strstr(OUT, "step:     1  loss: "), *p6 = strstr(OUT, "step:     6  loss: ");
    if (p1) l1 = atof(p1 + 19);
    if (p6) l6 = atof(p6 + 19);
    HP_CHECK(isfinite(l1) && isfinite(l6) && l6 < l1, "loss %g -> %g", l1, l6);
    /* the weights file records the dims */
    snprintf(path, sizeof path, "%s/out/weights.safetensors", ROOT);
    hp_safetensors_t st = NULL;
    HP_CHECK_OK(hp_safetensors_open(path, &st));
    if (st) {
        const char *keys[][2] = {{"dim", "80"}, {"n_heads", "5"}, {"n_kv_heads", "1"}, {"head_dim", "16"},
                                 {"hidden_dim", "224"}, {"vocab_size", "320"}, {"n_layers", "2"}};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            const char *v = hp_safetensors_metadata(st, keys[i][0]);
            HP_CHECK(v && strcmp(v, keys[i][1]) == 0, "weights metadata %s = %s, expected %s", keys[i][0],
                     v ? v : "(none)", keys[i][1]);
        }
        hp_safetensors_close(st);
    }

    /* refused values name the key */
    const struct { const char *args, *want; } bad[] = {
        {"--model.n_heads 6 --model.n_kv_heads 4", "config key 'model.n_heads' = 6 is not a multiple of model.n_kv_heads = 4"},
        {"--model.head_dim 15", "config key 'model.head_dim' = 15 must be even"},
        {"--model.dim 0", "command line: key 'model.dim' expects an integer in [1, 1048576], got '0'"},
        {"--model.dim=90 --model.n_heads=4", "'model.dim' = 90 is not divisible by model.n_heads = 4"},
        {"--model.n_kv_heads 3", "'model.n_heads' = 16 (the flavor's) is not a multiple of model.n_kv_heads = 3"},
        {"--model.vocab_size 257", "config key 'model.vocab_size' = 257 does not match the vocabulary of tokenizer.path"},
        {"--model.max_seq_len 8", "config key 'model.max_seq_len' = 8 is below training.seq_len = 16"},
        {"--model.norm_eps 0", "key 'model.norm_eps' expects a number in"},
        {"--model.qk_norm maybe", "key 'model.qk_norm' expects a boolean (true/false, yes/no, on/off, 1/0) or default"},
        {"--model.n_head 4", "unknown key '--model.n_head'; did you mean '--model.n_heads'?"},
        {"--config bad.yaml", "bad.yaml:2: key 'model.head_dim' expects an integer in [2, 512], got '1024'"},
    };
    snprintf(path, sizeof path, "%s/bad.yaml", ROOT);
    f = fopen(path, "w");
    if (f) {
        fprintf(f, "model:\n  head_dim: 1024\n");
        fclose(f);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char extra[512];
        snprintf(extra, sizeof extra, "--training.steps=1 %s", bad[i].args);
        rc = train(extra);
        HP_CHECK(rc != 0 && rc < 128 && strstr(OUT, bad[i].want), "'%s': exit %d, expected '%s' in\n%s", bad[i].args,
                 rc, bad[i].want, OUT);
    }
}

int main(void) {
    const char *bd = getenv("HP_BUILD_DIR");
    if (!realpath(bd && *bd ? bd : ".", BDIR)) snprintf(BDIR, sizeof BDIR, ".");   /* the tools run in ROOT */
    HP_ASSERT(mkdtemp(ROOT));
    test_config_shape();
    test_grad_and_train();
    test_hf_round_trip("llama3", llama_argv, (int)(sizeof llama_argv / sizeof llama_argv[0]), 80, 5, 1);
    test_hf_round_trip("qwen3", qwen_argv, (int)(sizeof qwen_argv / sizeof qwen_argv[0]), 64, 4, 2);
    test_hp_ckpt();
    test_trainer();
    if (!getenv("HP_KEEP")) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf %s", ROOT);
        if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", ROOT);
    }
    return hp_test_finish("test_model_custom_dims");
}
