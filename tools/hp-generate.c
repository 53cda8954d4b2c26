/* hp-generate: sample text from weights written by hp-train.
 *   hp-generate --weights W.safetensors|HF_DIR --tokenizer tokenizer.json [--prompt TEXT]
 *               [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--print-ids]
 * --print-ids prints the token ids (prompt with BOS, then the generated ones) on a line
 * "ids: ..." after the text (to compare with transformers' generate).
 * The prompt is prefilled into a KV cache (model.h) and each new token is one decode step.
 * The context window is the model's: the training sequence length stored with the weights, or
 * an HF folder's max_position_embeddings (which also decides DeepSeek-V3's YaRN). The model and
 * its cache are built for min(window, prompt + new tokens) positions; once prompt plus output
 * exceed the window, every further token sees exactly the last window: the cache is reset and
 * the last window re-prefilled per token (a full-window forward, as before the cache), so the
 * output is the same as recomputing the window each step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hyperparallel/checkpoint.h>
#include <hyperparallel/model.h>
#include <hyperparallel/models.h>
#include <hyperparallel/parse.h>
#include <hyperparallel/rng.h>
#include <hyperparallel/tokenizer.h>

typedef struct { float p; int32_t id; } cand_t;

static int by_prob_desc(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;   /* deterministic order for ties */
}

/* Temperature, top-k, then top-p (nucleus) sampling with a uniform u in [0, 1). */
static int32_t sample(const float *logits, int V, float temperature, int top_k, float top_p, float u, cand_t *c) {
    if (temperature <= 0.0f) {   /* greedy */
        int32_t best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        return best;
    }
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) mx = fmaxf(mx, logits[v]);
    double z = 0.0;
    for (int v = 0; v < V; v++) {
        c[v].id = v;
        c[v].p = expf((logits[v] - mx) / temperature);
        z += c[v].p;
    }
    for (int v = 0; v < V; v++) c[v].p = (float)(c[v].p / z);
    qsort(c, (size_t)V, sizeof *c, by_prob_desc);
    int n = top_k > 0 && top_k < V ? top_k : V;
    double cum = 0.0;
    int keep = n;
    for (int i = 0; i < n; i++) {
        cum += c[i].p;
        if (cum >= top_p) {
            keep = i + 1;
            break;
        }
    }
    double mass = 0.0;
    for (int i = 0; i < keep; i++) mass += c[i].p;
    double r = u * mass, acc = 0.0;
    for (int i = 0; i < keep; i++) {
        acc += c[i].p;
        if (r < acc) return c[i].id;
    }
    return c[keep - 1].id;
}

static void usage(FILE *f) {
    fprintf(f, "usage: hp-generate --weights FILE --tokenizer FILE [--prompt TEXT] [--max-new-tokens N]\n"
               "                   [--temperature T] [--top-k K] [--top-p P] [--seed S] [--print-ids]\n"
               "  --weights: a weights file written by hp-train or an HF model folder\n");
}

int main(int argc, char **argv) {
    const char *weights = NULL, *tokpath = NULL, *prompt = "";
    int32_t max_new = 64, top_k = 0;
    float temperature = 0.8f, top_p = 1.0f;
    unsigned long long seed = 0;
    static const char *const flags[] = {"--weights", "--tokenizer", "--prompt", "--max-new-tokens", "--temperature",
                                        "--top-k", "--top-p", "--seed", "--print-ids", "--help"};
    int print_ids = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        hp_status_t s = HP_OK;
        int r;
        if (!strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--print-ids")) { print_ids = 1; continue; }
        if ((r = hp_flag_value("hp-generate", argc, argv, &i, "--weights", &v)) > 0) weights = v;
        else if (!r && (r = hp_flag_value("hp-generate", argc, argv, &i, "--tokenizer", &v)) > 0) tokpath = v;
        else if (!r && (r = hp_flag_value("hp-generate", argc, argv, &i, "--prompt", &v)) > 0) prompt = v;
        else if (!r && (r = hp_flag_value("hp-generate", argc, argv, &i, "--max-new-tokens", &v)) > 0)
            s = hp_parse_i32("hp-generate: --max-new-tokens", v, 0, 1 << 24, "tokens to generate, e.g. 64", &max_new);
        else if (!r && (r = hp_flag_value("hp-generate", argc, argv, &i, "--temperature", &v)) > 0)
            s = hp_parse_f32("hp-generate: --temperature", v, 0.0, 1e6, "0 = greedy, e.g. 0.8", &temperature);
        else if (!r && (r = hp_flag_value("hp-generate", argc, argv, &i, "--top-k", &v)) > 0)
            s = hp_parse_i32("hp-generate: --top-k", v, 0, HP_MODEL_MAX_VOCAB, "0 = no top-k cut", &top_k);
        else if (!r && (r = hp_flag_value("hp-generate", argc, argv, &i, "--top-p", &v)) > 0) {
            s = hp_parse_f32("hp-generate: --top-p", v, 0.0, 1.0, "0 < p <= 1, 1 = no nucleus cut", &top_p);
            if (s == HP_OK && !(top_p > 0.0f))
                s = hp_error(HP_ERR_INVALID_ARG, "hp-generate: --top-p expects a number in (0, 1], got '%s'", v);
        } else if (!r && (r = hp_flag_value("hp-generate", argc, argv, &i, "--seed", &v)) > 0) {
            uint64_t x = 0;
            s = hp_parse_u64("hp-generate: --seed", v, UINT64_MAX, NULL, &x);
            seed = (unsigned long long)x;
        } else if (!r) {
            s = hp_flag_unknown_error("hp-generate", a, flags, sizeof flags / sizeof flags[0]);
        }
        if (r < 0 || s != HP_OK) {
            fprintf(stderr, "%s\n", hp_last_error());
            usage(stderr);
            return 2;
        }
    }
    if (!weights || !tokpath) { fprintf(stderr, "hp-generate: error: --weights and --tokenizer are required\n"); usage(stderr); return 2; }
    if (max_new < 0 || top_k < 0 || !(top_p > 0.0f && top_p <= 1.0f) || temperature < 0.0f) {
        fprintf(stderr, "hp-generate: error: expected --max-new-tokens >= 0, --top-k >= 0, 0 < --top-p <= 1, --temperature >= 0\n");
        return 2;
    }
    hp_tokenizer_t tok = NULL;
    hp_model_t m = NULL;
    if (hp_tokenizer_load(&tok, tokpath) != HP_OK) { fprintf(stderr, "hp-generate: error: %s\n", hp_last_error()); return 1; }
    /* the prompt first: its length sizes the model; its error is reported after the weights' */
    hp_token_ids_t ids = {0};
    static char enc_err[2048];
    const hp_status_t enc = hp_tokenizer_encode(tok, prompt, strlen(prompt), HP_TOKENIZE_ADD_BOS, &ids);
    if (enc != HP_OK) snprintf(enc_err, sizeof enc_err, "%s", hp_last_error());
    size_t n_prompt = ids.len;
    /* built for the positions this run can reach, at most the model's context (the window) */
    const int64_t need = (int64_t)n_prompt + max_new;
    if (hp_model_load_weights(weights, 1, need < 1 ? 1 : need > HP_MODEL_MAX_SEQ_LEN ? HP_MODEL_MAX_SEQ_LEN : (int)need,
                              &m) != HP_OK) {
        fprintf(stderr, "hp-generate: error: %s\n", hp_last_error());
        hp_tokenizer_free(tok);
        return 1;
    }
    if (enc != HP_OK) {
        fprintf(stderr, "hp-generate: error: %s\n", enc_err);
        return 1;
    }
    const hp_model_config_t *cfg = hp_model_config(m);
    if (hp_tokenizer_vocab_size(tok) > cfg->vocab_size) {
        fprintf(stderr, "hp-generate: error: tokenizer %s has %d ids but the model's vocabulary is %d; use the "
                        "tokenizer the model was trained with\n", tokpath, hp_tokenizer_vocab_size(tok), cfg->vocab_size);
        return 1;
    }
    /* the sliding window: the built length, the whole context whenever the run can exceed it */
    int ctx = hp_model_max_seq_len(m), V = cfg->vocab_size;
    int32_t *all = malloc(sizeof(int32_t) * (n_prompt + (size_t)max_new + 1));
    cand_t *cands = malloc(sizeof(cand_t) * (size_t)V);
    if (!all || !cands) return 1;
    memcpy(all, ids.ids, n_prompt * sizeof(int32_t));
    size_t n = n_prompt;
    hp_rng_key_t key = hp_rng_key(seed, "hp-generate");
    int32_t eos = hp_tokenizer_eos_id(tok);
    hp_model_kv_cache_t kc = NULL;
    if (hp_model_kv_cache_create(m, ctx, &kc) != HP_OK) {
        fprintf(stderr, "hp-generate: error: %s\n", hp_last_error());
        return 1;
    }
    for (int k = 0; k < max_new; k++) {
        const float *logits = NULL;
        hp_status_t st;
        if (k > 0 && n <= (size_t)ctx && (size_t)hp_model_kv_cache_pos(kc) + 1 == n) {
            st = hp_model_decode(m, kc, all[n - 1], &logits);   /* the token sampled last */
        } else {   /* the prompt, or a slid window: (re)prefill the last ctx tokens */
            size_t start = n > (size_t)ctx ? n - (size_t)ctx : 0;
            hp_model_kv_cache_reset(kc);
            st = hp_model_prefill(m, kc, all + start, (int)(n - start), &logits);
        }
        if (st != HP_OK) {
            fprintf(stderr, "hp-generate: error: %s\n", hp_last_error());
            return 1;
        }
        int32_t next = sample(logits, V, temperature, top_k, top_p, hp_rng_uniform_at(key, (uint64_t)k), cands);
        all[n++] = next;
        if (next == eos) break;
    }
    char *text = NULL;
    size_t tl = 0;
    if (hp_tokenizer_decode(tok, all, n, HP_DETOKENIZE_SKIP_SPECIAL, &text, &tl) != HP_OK) {
        fprintf(stderr, "hp-generate: error: %s\n", hp_last_error());
        return 1;
    }
    printf("%s\n", text);
    if (print_ids) {
        printf("ids:");
        for (size_t i = 0; i < n; i++) printf(" %d", all[i]);
        printf("\n");
    }
    free(text);
    free(all);
    free(cands);
    hp_model_kv_cache_destroy(kc);
    hp_token_ids_free(&ids);
    hp_model_destroy(m);
    hp_tokenizer_free(tok);
    return 0;
}
