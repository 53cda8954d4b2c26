/* Tokenizer against HF `tokenizers` golden ids (tests/data/tokenizer, made by
 * tools/golden/make_tokenizer_golden.py): GPT-2-style and Llama-3-style tokenizer.json files
 * trained by `tokenizers`, and one trained by our hp-tokenizer; decode and round trips,
 * special tokens, training determinism, and error messages for bad files. */
// hp-test: ranks 1 timeout 120
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/status.h"
#include "hyperparallel/tokenizer.h"

static char data_dir[1024];

static const char *data_path(const char *name) {
    static char buf[4][1200];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", data_dir, name);
    return buf[k];
}

static int ids_equal(const hp_token_ids_t *got, json_object *want) {
    size_t n = json_object_array_length(want);
    if (got->len != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (got->ids[i] != json_object_get_int(json_object_array_get_idx(want, i))) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, size_t n, json_object *want) {
    fprintf(stderr, "  %s ours:", what);
    for (size_t i = 0; i < n && i < 60; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n  %s HF:  ", what);
    for (size_t i = 0; i < json_object_array_length(want) && i < 60; i++)
        fprintf(stderr, " %d", json_object_get_int(json_object_array_get_idx(want, i)));
    fprintf(stderr, "\n");
}

/* The golden document and the tokenizer.json its cases edit; 0 when either is missing
 * (reported; the caller frees both with json_object_put). */
static int read_pair(const char *golden, const char *tokenizer, json_object **doc, json_object **base) {
    *doc = json_object_from_file(data_path(golden));
    *base = json_object_from_file(data_path(tokenizer));
    HP_CHECK(*doc && *base, "cannot read %s / %s", golden, tokenizer);
    return *doc && *base;
}

/* base (a tokenizer.json document, edited by the caller) serialized and loaded; NULL when the
 * load fails (reported). */
static hp_tokenizer_t load_doc(json_object *base, const char *name) {
    size_t len;
    const char *js = json_object_to_json_string_length(base, JSON_C_TO_STRING_PLAIN, &len);
    hp_tokenizer_t tok = NULL;
    HP_CHECK_OK(hp_tokenizer_load_json(&tok, js, len, name));
    return tok;
}

/* Encodes the JSON string text with tok; 1 when the ids are HF's (want), else prints both. */
static int encodes_as(hp_tokenizer_t tok, json_object *text, json_object *want) {
    hp_token_ids_t got = {0};
    HP_CHECK_OK(hp_tokenizer_encode(tok, json_object_get_string(text), (size_t)json_object_get_string_len(text), 0,
                                    &got));
    const int ok = ids_equal(&got, want);
    if (!ok) print_ids("ids", got.ids, got.len, want);
    hp_token_ids_free(&got);
    return ok;
}

static void check_golden(const char *golden_name) {
    json_object *doc = json_object_from_file(data_path(golden_name));
    HP_CHECK(doc != NULL, "cannot read %s", data_path(golden_name));
    if (!doc) return;
    json_object *v, *cases, *decodes;
    json_object_object_get_ex(doc, "tokenizer", &v);
    const char *tok_name = json_object_get_string(v);
    json_object_object_get_ex(doc, "cases", &cases);
    json_object_object_get_ex(doc, "decodes", &decodes);
    hp_tokenizer_t tok = NULL;
    HP_CHECK_OK(hp_tokenizer_load(&tok, data_path(tok_name)));
    if (!tok) {
        json_object_put(doc);
        return;
    }
    int n_ok = 0, n_cases = (int)json_object_array_length(cases);
    size_t n_ids = 0;
    for (int i = 0; i < n_cases; i++) {
        json_object *c = json_object_array_get_idx(cases, (size_t)i), *text, *ids, *ids_sp, *dec, *dec_skip;
        json_object_object_get_ex(c, "text", &text);
        json_object_object_get_ex(c, "ids", &ids);
        json_object_object_get_ex(c, "ids_special", &ids_sp);
        json_object *ids_txt;
        json_object_object_get_ex(c, "ids_special_as_text", &ids_txt);
        json_object_object_get_ex(c, "decoded", &dec);
        json_object_object_get_ex(c, "decoded_skip", &dec_skip);
        int roundtrip = json_object_object_get_ex(c, "roundtrip", &v) && json_object_get_boolean(v);
        const char *s = json_object_get_string(text);
        size_t len = (size_t)json_object_get_string_len(text);
        hp_token_ids_t got = {0}, got_sp = {0};
        HP_CHECK_OK(hp_tokenizer_encode(tok, s, len, 0, &got));
        HP_CHECK_OK(hp_tokenizer_encode(tok, s, len, HP_TOKENIZE_ADD_SPECIAL, &got_sp));
        int ok1 = ids_equal(&got, ids), ok2 = ids_equal(&got_sp, ids_sp);
        HP_CHECK(ok1, "%s case %d: ids differ from HF for \"%.60s\"", golden_name, i, s);
        HP_CHECK(ok2, "%s case %d: ids with special tokens differ from HF", golden_name, i);
        if (!ok1) print_ids("ids", got.ids, got.len, ids);
        hp_token_ids_t got_txt = {0};
        HP_CHECK_OK(hp_tokenizer_encode(tok, s, len, HP_TOKENIZE_SPECIAL_AS_TEXT, &got_txt));
        HP_CHECK(ids_equal(&got_txt, ids_txt), "%s case %d: SPECIAL_AS_TEXT ids differ from HF "
                 "encode_special_tokens=True", golden_name, i);
        hp_token_ids_free(&got_txt);
        n_ids += got.len;
        char *out = NULL;
        size_t out_len = 0;
        HP_CHECK_OK(hp_tokenizer_decode(tok, got_sp.ids, got_sp.len, 0, &out, &out_len));
        HP_CHECK(out && strcmp(out, json_object_get_string(dec)) == 0,
                 "%s case %d: decode \"%.60s\" != HF \"%.60s\"", golden_name, i, out ? out : "",
                 json_object_get_string(dec));
        free(out);
        out = NULL;
        HP_CHECK_OK(hp_tokenizer_decode(tok, got_sp.ids, got_sp.len, HP_DETOKENIZE_SKIP_SPECIAL,
                                        &out, &out_len));
        HP_CHECK(out && strcmp(out, json_object_get_string(dec_skip)) == 0,
                 "%s case %d: decode(skip special) \"%.60s\" != HF \"%.60s\"", golden_name, i,
                 out ? out : "", json_object_get_string(dec_skip));
        free(out);
        if (roundtrip) {
            out = NULL;
            HP_CHECK_OK(hp_tokenizer_decode(tok, got.ids, got.len, 0, &out, &out_len));
            HP_CHECK(out && out_len == len && memcmp(out, s, len) == 0,
                     "%s case %d: decode(encode(x)) != x for \"%.60s\"", golden_name, i, s);
            free(out);
        }
        n_ok += ok1 && ok2;
        hp_token_ids_free(&got);
        hp_token_ids_free(&got_sp);
    }
    int n_dec = (int)json_object_array_length(decodes), dec_ok = 0;
    for (int i = 0; i < n_dec; i++) {
        json_object *c = json_object_array_get_idx(decodes, (size_t)i), *ids, *text;
        json_object_object_get_ex(c, "ids", &ids);
        json_object_object_get_ex(c, "text", &text);
        size_t n = json_object_array_length(ids);
        int32_t buf[64];
        for (size_t k = 0; k < n && k < 64; k++) buf[k] = json_object_get_int(json_object_array_get_idx(ids, k));
        char *out = NULL;
        size_t out_len;
        HP_CHECK_OK(hp_tokenizer_decode(tok, buf, n, 0, &out, &out_len));
        int ok = out && strcmp(out, json_object_get_string(text)) == 0;
        HP_CHECK(ok, "%s decode %d: \"%s\" != HF \"%s\"", golden_name, i, out ? out : "",
                 json_object_get_string(text));
        dec_ok += ok;
        free(out);
    }
    printf("%-28s %-22s %d/%d cases equal HF (%zu ids), %d/%d lossy decodes\n", golden_name,
           tok_name, n_ok, n_cases, n_ids, dec_ok, n_dec);
    hp_tokenizer_free(tok);
    json_object_put(doc);
}

/* Split behaviours (Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous),
 * invert, String / Regex patterns, empty matches, ByteLevel after Split with and without
 * add_prefix_space: each variant's pre_tokenizer is put into gpt2_hf.json. */
static void check_split(void) {
    json_object *doc, *base;
    if (!read_pair("golden_split.json", "gpt2_hf.json", &doc, &base)) return;
    json_object *texts, *variants;
    json_object_object_get_ex(doc, "texts", &texts);
    json_object_object_get_ex(doc, "variants", &variants);
    int nv = (int)json_object_array_length(variants), ok_v = 0;
    for (int v = 0; v < nv; v++) {
        json_object *var = json_object_array_get_idx(variants, (size_t)v), *pre, *ids;
        json_object_object_get_ex(var, "pre_tokenizer", &pre);
        json_object_object_get_ex(var, "ids", &ids);
        json_object_object_add(base, "pre_tokenizer", json_object_get(pre));
        hp_tokenizer_t tok = load_doc(base, "split-variant");
        if (!tok) continue;
        int all = 1;
        for (size_t i = 0; i < json_object_array_length(texts); i++) {
            json_object *t = json_object_array_get_idx(texts, i);
            const int ok = encodes_as(tok, t, json_object_array_get_idx(ids, i));
            HP_CHECK(ok, "split variant %d text %zu \"%s\": ids differ from HF; pre_tokenizer %s", v,
                     i, json_object_get_string(t), json_object_to_json_string(pre));
            all &= ok;
        }
        ok_v += all;
        hp_tokenizer_free(tok);
    }
    printf("golden_split.json: %d/%d Split pre-tokenizer variants equal HF\n", ok_v, nv);
    json_object_put(base);
    json_object_put(doc);
}

/* unk_token / fuse_unk: a vocabulary without every byte (golden_unk.json). */
static void check_unk(void) {
    json_object *doc, *base;
    if (!read_pair("golden_unk.json", "gpt2_unk.json", &doc, &base)) return;
    json_object *cases, *model;
    json_object_object_get_ex(doc, "cases", &cases);
    json_object_object_get_ex(base, "model", &model);
    int ok_n = 0, n = (int)json_object_array_length(cases);
    for (int fuse = 0; fuse < 2; fuse++) {
        json_object_object_add(model, "fuse_unk", json_object_new_boolean(fuse));
        hp_tokenizer_t tok = load_doc(base, "gpt2_unk.json");
        if (!tok) continue;
        for (int i = 0; i < n; i++) {
            json_object *c = json_object_array_get_idx(cases, (size_t)i), *text, *ids;
            json_object_object_get_ex(c, "text", &text);
            json_object_object_get_ex(c, fuse ? "ids_fused" : "ids", &ids);
            const int ok = encodes_as(tok, text, ids);
            HP_CHECK(ok, "unk case %d (fuse_unk %d): ids differ from HF", i, fuse);
            ok_n += ok;
        }
        hp_tokenizer_free(tok);
    }
    printf("golden_unk.json: %d/%d unk / fuse_unk cases equal HF\n", ok_n, 2 * n);
    json_object_put(base);
    json_object_put(doc);
}

/* A vocab that lacks some bytes and has no unk_token (HF's BpeTrainer default): HF drops the
 * unknown characters. A word made only of such bytes gives no ids, and must not hand NULL
 * to memcpy (test_tokenizer_ubsan runs this under -fsanitize=undefined). */
static void check_no_unk(void) {
    json_object *base = json_object_from_file(data_path("gpt2_unk.json")), *model;
    HP_CHECK(base != NULL, "cannot read gpt2_unk.json");
    if (!base) return;
    json_object_object_get_ex(base, "model", &model);
    json_object_object_del(model, "unk_token");
    hp_tokenizer_t tok = load_doc(base, "gpt2_no_unk.json");
    if (tok) {
        /* '#' (0x23) and 0x01 have no token in gpt2_unk.json. The first encode of a fresh
         * tokenizer (empty id list, empty cache), then the same word from the cache. */
        for (int rep = 0; rep < 2; rep++) {
            hp_token_ids_t ids = {0};
            HP_CHECK_OK(hp_tokenizer_encode(tok, "#\x01#", 3, 0, &ids));
            HP_CHECK(ids.len == 0, "no unk, rep %d: '#\\x01#' gave %zu ids, expected none", rep,
                     ids.len);
            hp_token_ids_free(&ids);
        }
        /* Between known words the unknown piece vanishes: a#b == a then b. */
        hp_token_ids_t ab = {0}, a = {0}, b = {0};
        HP_CHECK_OK(hp_tokenizer_encode(tok, "a#b", 3, 0, &ab));
        HP_CHECK_OK(hp_tokenizer_encode(tok, "a", 1, 0, &a));
        HP_CHECK_OK(hp_tokenizer_encode(tok, "b", 1, 0, &b));
        HP_CHECK(ab.len == a.len + b.len && a.len > 0 && b.len > 0 &&
                     !memcmp(ab.ids, a.ids, a.len * sizeof(int32_t)) &&
                     !memcmp(ab.ids + a.len, b.ids, b.len * sizeof(int32_t)),
                 "no unk: a#b gave %zu ids, expected a (%zu) then b (%zu)", ab.len, a.len, b.len);
        hp_token_ids_free(&ab);
        hp_token_ids_free(&a);
        hp_token_ids_free(&b);
        hp_tokenizer_free(tok);
    }
    json_object_put(base);
}

/* Random mixes of scripts, Unicode spaces, marks and token spellings (golden_random.json). */
static void check_random(void) {
    json_object *doc = json_object_from_file(data_path("golden_random.json")), *cases;
    HP_CHECK(doc != NULL, "cannot read golden_random.json");
    if (!doc) return;
    json_object_object_get_ex(doc, "cases", &cases);
    int n = (int)json_object_array_length(cases), ok_n = 0;
    hp_tokenizer_t tok = NULL;
    const char *loaded = "";
    for (int i = 0; i < n; i++) {
        json_object *c = json_object_array_get_idx(cases, (size_t)i), *name, *text, *ids;
        json_object_object_get_ex(c, "tokenizer", &name);
        json_object_object_get_ex(c, "text", &text);
        json_object_object_get_ex(c, "ids", &ids);
        if (strcmp(loaded, json_object_get_string(name)) != 0) {
            hp_tokenizer_free(tok);
            tok = NULL;
            loaded = json_object_get_string(name);
            HP_CHECK_OK(hp_tokenizer_load(&tok, data_path(loaded)));
        }
        if (!tok) continue;
        hp_token_ids_t got = {0};
        HP_CHECK_OK(hp_tokenizer_encode(tok, json_object_get_string(text),
                                        (size_t)json_object_get_string_len(text), 0, &got));
        int ok = ids_equal(&got, ids);
        HP_CHECK(ok, "random case %d (%s): ids differ from HF", i, loaded);
        if (!ok) print_ids("ids", got.ids, got.len, ids);
        ok_n += ok;
        hp_token_ids_free(&got);
    }
    hp_tokenizer_free(tok);
    printf("golden_random.json: %d/%d random texts equal HF\n", ok_n, n);
    json_object_put(doc);
}

static void check_special(void) {
    hp_tokenizer_t tok = NULL;
    HP_CHECK_OK(hp_tokenizer_load(&tok, data_path("ours.json")));
    if (!tok) return;
    int32_t bos = hp_tokenizer_bos_id(tok), eos = hp_tokenizer_eos_id(tok);
    HP_CHECK(bos == 0 && eos == 1, "ours.json: bos %d eos %d, expected 0 1", bos, eos);
    HP_CHECK(hp_tokenizer_token_to_id(tok, "<|end_of_text|>") == 1, "token_to_id");
    HP_CHECK(hp_tokenizer_is_special(tok, 0) && !hp_tokenizer_is_special(tok, 300), "is_special");
    HP_CHECK(strcmp(hp_tokenizer_id_to_token(tok, 1), "<|end_of_text|>") == 0, "id_to_token");
    {
        /* token_bytes of the ids of "é" concatenate to its UTF-8. */
        hp_token_ids_t e = {0};
        HP_CHECK_OK(hp_tokenizer_encode(tok, "\xc3\xa9t\xc3\xa9", 5, 0, &e));
        char buf[16];
        size_t n = 0, l;
        for (size_t i = 0; i < e.len; i++) {
            const char *b = hp_tokenizer_token_bytes(tok, e.ids[i], &l);
            if (b && n + l <= sizeof(buf)) memcpy(buf + n, b, l), n += l;
        }
        HP_CHECK(n == 5 && memcmp(buf, "\xc3\xa9t\xc3\xa9", 5) == 0, "token_bytes");
        HP_CHECK(hp_tokenizer_token_bytes(tok, -1, &l) == NULL, "token_bytes(-1)");
        hp_token_ids_free(&e);
    }
    hp_token_ids_t ids = {0};
    /* ADD_BOS / ADD_EOS add once, even combined with the template. */
    HP_CHECK_OK(hp_tokenizer_encode(tok, "Hi", 2, HP_TOKENIZE_ADD_SPECIAL | HP_TOKENIZE_ADD_BOS |
                                                       HP_TOKENIZE_ADD_EOS, &ids));
    HP_CHECK(ids.len >= 3 && ids.ids[0] == bos && ids.ids[ids.len - 1] == eos &&
                 ids.ids[1] != bos && ids.ids[ids.len - 2] != eos,
             "BOS/EOS added twice or missing");
    size_t n1 = ids.len;
    /* Appending: a second document goes after the first. */
    HP_CHECK_OK(hp_tokenizer_encode(tok, "Hi", 2, HP_TOKENIZE_ADD_BOS | HP_TOKENIZE_ADD_EOS, &ids));
    HP_CHECK(ids.len == 2 * n1 && ids.ids[n1] == bos, "encode appends");
    /* Special tokens in the text are matched whole. */
    ids.len = 0;
    const char *t = "a<|end_of_text|>b";
    HP_CHECK_OK(hp_tokenizer_encode(tok, t, strlen(t), 0, &ids));
    HP_CHECK(ids.len == 3 && ids.ids[1] == eos, "special token in text -> %zu ids", ids.len);
    /* Empty text. */
    ids.len = 0;
    HP_CHECK_OK(hp_tokenizer_encode(tok, "", 0, HP_TOKENIZE_ADD_BOS | HP_TOKENIZE_ADD_EOS, &ids));
    HP_CHECK(ids.len == 2 && ids.ids[0] == bos && ids.ids[1] == eos, "empty text with BOS/EOS");
    /* Invalid UTF-8 and unknown ids are errors. */
    HP_CHECK_ERR(hp_tokenizer_encode(tok, "ab\xff", 3, 0, &ids), HP_ERR_INVALID_ARG, "byte 2");
    int32_t bad[2] = {5, 999999};
    char *out = NULL;
    HP_CHECK_ERR(hp_tokenizer_decode(tok, bad, 2, 0, &out, NULL), HP_ERR_INVALID_ARG, "999999");
    hp_token_ids_free(&ids);
    hp_tokenizer_free(tok);

    /* GPT-2 style: one special token, no template: BOS/EOS by name. */
    HP_CHECK_OK(hp_tokenizer_load(&tok, data_path("gpt2_hf.json")));
    if (tok) {
        HP_CHECK(hp_tokenizer_eos_id(tok) == 0 && hp_tokenizer_bos_id(tok) == -1,
                 "gpt2: eos %d bos %d", hp_tokenizer_eos_id(tok), hp_tokenizer_bos_id(tok));
        hp_token_ids_t x = {0};
        HP_CHECK_ERR(hp_tokenizer_encode(tok, "a", 1, HP_TOKENIZE_ADD_BOS, &x), HP_ERR_STATE, "no BOS");
        HP_CHECK_OK(hp_tokenizer_set_bos_eos(tok, 0, 0));
        HP_CHECK_OK(hp_tokenizer_encode(tok, "a", 1, HP_TOKENIZE_ADD_BOS, &x));
        HP_CHECK(x.len == 2 && x.ids[0] == 0, "set_bos_eos");
        hp_token_ids_free(&x);
        hp_tokenizer_free(tok);
    }
}

static char *slurp(const char *path, size_t *len);

/* Training the committed corpus again reproduces the committed ours.json byte for byte. */
static void check_training(void) {
    char out[256];
    snprintf(out, sizeof(out), "test_tokenizer_train_%ld.json", (long)getpid());
    const char *special[] = {"<|begin_of_text|>", "<|end_of_text|>"};
    hp_tokenizer_train_options_t o = {.vocab_size = 1500, .special = special, .n_special = 2};
    const char *files[] = {data_path("corpus.txt")};
    HP_CHECK_OK(hp_tokenizer_train(&o, files, 1, out));
    FILE *a = fopen(out, "rb"), *b = fopen(data_path("ours.json"), "rb");
    HP_CHECK(a && b, "cannot open %s or ours.json", out);
    if (a && b) {
        int same = 1, ca, cb;
        do {
            ca = fgetc(a), cb = fgetc(b);
            if (ca != cb) same = 0;
        } while (same && ca != EOF);
        HP_CHECK(same, "retraining corpus.txt does not reproduce tests/data/tokenizer/ours.json");
    }
    if (a) fclose(a);
    if (b) fclose(b);
    remove(out);
    /* JSONL input trains exactly like the same documents given in memory. */
    {
        char jl[256], o1[256], o2[256];
        snprintf(jl, sizeof(jl), "test_tokenizer_%ld.jsonl", (long)getpid());
        snprintf(o1, sizeof(o1), "test_tokenizer_j1_%ld.json", (long)getpid());
        snprintf(o2, sizeof(o2), "test_tokenizer_j2_%ld.json", (long)getpid());
        const char *docs[] = {"Hello world, hello there.\n", "caf\xc3\xa9 \"quoted\" hello\tworld",
                              "don't stop hello"};
        size_t lens[3];
        FILE *f = fopen(jl, "wb");
        HP_ASSERT(f);
        fputs("{\"text\": \"Hello world, hello there.\\n\"}\n\n", f);
        fputs("{\"id\": 2, \"text\": \"caf\\u00e9 \\\"quoted\\\" hello\\tworld\"}\r\n", f);
        fputs("{\"text\": \"don't stop hello\"}", f);
        fclose(f);
        for (int i = 0; i < 3; i++) lens[i] = strlen(docs[i]);
        hp_tokenizer_train_options_t oj = {.vocab_size = 300, .min_frequency = 1, .jsonl_field = "text"};
        const char *jf[] = {jl};
        HP_CHECK_OK(hp_tokenizer_train(&oj, jf, 1, o1));
        oj.jsonl_field = NULL;
        HP_CHECK_OK(hp_tokenizer_train_texts(&oj, docs, lens, 3, o2));
        size_t l1 = 0, l2 = 0;
        char *a1 = slurp(o1, &l1), *a2 = slurp(o2, &l2);
        HP_CHECK(a1 && a2 && l1 == l2 && memcmp(a1, a2, l1) == 0, "JSONL training != in-memory training");
        free(a1);
        free(a2);
        f = fopen(jl, "wb");
        HP_ASSERT(f);
        fputs("{\"text\": \"x\"}\n{\"body\": \"y\"}\n", f);
        fclose(f);
        oj.jsonl_field = "text";
        char needle[400];
        snprintf(needle, sizeof(needle), "%s:2: expected an object with a string field \"text\"", jl);
        HP_CHECK_ERR(hp_tokenizer_train(&oj, jf, 1, o1), HP_ERR_FORMAT, needle);
        remove(jl);
        remove(o1);
        remove(o2);
    }
    /* Option errors. */
    o.vocab_size = 100;
    HP_CHECK_ERR(hp_tokenizer_train(&o, files, 1, out), HP_ERR_INVALID_ARG, "vocab_size 100");
    o.vocab_size = 400;
    const char *one_byte[] = {"<s>", "x"};
    hp_tokenizer_train_options_t ob = {.vocab_size = 400, .special = one_byte, .n_special = 2};
    HP_CHECK_ERR(hp_tokenizer_train(&ob, files, 1, out), HP_ERR_INVALID_ARG, "single byte");
    const char *twice[] = {"<s>", "<s>"};
    ob.special = twice;
    HP_CHECK_ERR(hp_tokenizer_train(&ob, files, 1, out), HP_ERR_INVALID_ARG, "given twice");
    const char *missing[] = {"/nonexistent/corpus.txt"};
    HP_CHECK_ERR(hp_tokenizer_train(&o, missing, 1, out), HP_ERR_IO, "/nonexistent/corpus.txt");
}

static void write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    HP_ASSERT(f);
    fputs(s, f);
    fclose(f);
}

/* A small valid document with one piece replaced. */
static void check_bad(const char *name, const char *doc, hp_status_t want, const char *needle) {
    char path[256];
    snprintf(path, sizeof(path), "test_tokenizer_%s_%ld.json", name, (long)getpid());
    write_file(path, doc);
    hp_tokenizer_t tok = (hp_tokenizer_t)1;
    hp_clear_error();
    hp_status_t st = hp_tokenizer_load(&tok, path);
    HP_CHECK(st == want && strstr(hp_last_error(), needle) && strstr(hp_last_error(), path) &&
                 tok == NULL,
             "%s: got %s '%s', expected %s containing '%s' and the file name", name,
             hp_status_string(st), hp_last_error(), hp_status_string(want), needle);
    remove(path);
}

#define PRE "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}"
#define VOCAB "{\"a\": 0, \"b\": 1, \"ab\": 2}"
#define DOC(norm, pre, model) \
    "{\"normalizer\": " norm ", \"pre_tokenizer\": " pre ", \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": " model "}"

static void check_errors(void) {
    hp_tokenizer_t tok = NULL;
    HP_CHECK_ERR(hp_tokenizer_load(&tok, "/nonexistent/tokenizer.json"), HP_ERR_IO,
                 "/nonexistent/tokenizer.json");
    /* a directory is a model folder: it needs a tokenizer.json */
    HP_CHECK_ERR(hp_tokenizer_load(&tok, data_dir), HP_ERR_IO, "no tokenizer.json in this folder");
    /* The valid skeleton loads and works. */
    char path[256];
    snprintf(path, sizeof(path), "test_tokenizer_ok_%ld.json", (long)getpid());
    write_file(path, DOC("null", PRE, "{\"type\": \"BPE\", \"vocab\": " VOCAB ", \"merges\": [\"a b\"]}"));
    HP_CHECK_OK(hp_tokenizer_load(&tok, path));
    if (tok) {
        hp_token_ids_t ids = {0};
        HP_CHECK_OK(hp_tokenizer_encode(tok, "abba", 4, 0, &ids));
        HP_CHECK(ids.len == 3 && ids.ids[0] == 2 && ids.ids[1] == 1 && ids.ids[2] == 0,
                 "skeleton: abba -> %zu ids", ids.len);
        hp_token_ids_free(&ids);
        hp_tokenizer_free(tok);
    }
    remove(path);

    check_bad("garbage", "this is not json", HP_ERR_FORMAT, "not valid JSON");
    check_bad("truncated", "{\"model\": {\"vocab\": {\"a\": 0", HP_ERR_FORMAT, "not valid JSON");
    check_bad("empty", "", HP_ERR_FORMAT, "not valid JSON");
    check_bad("array", "[1, 2]", HP_ERR_FORMAT, "expected a tokenizer.json object");
    check_bad("trailing", DOC("null", PRE, "{\"vocab\": " VOCAB ", \"merges\": []}") " x",
              HP_ERR_FORMAT, "trailing data");
    check_bad("nomodel", "{\"pre_tokenizer\": " PRE "}", HP_ERR_FORMAT, "missing member \"model\"");
    check_bad("vocabtype", DOC("null", PRE, "{\"vocab\": [1], \"merges\": []}"), HP_ERR_FORMAT,
              "model: member \"vocab\" is array, expected object");
    check_bad("idtype", DOC("null", PRE, "{\"vocab\": {\"a\": \"0\"}, \"merges\": []}"),
              HP_ERR_FORMAT, "model.vocab[\"a\"]: is string, expected an integer id");
    check_bad("negid", DOC("null", PRE, "{\"vocab\": {\"a\": -3}, \"merges\": []}"),
              HP_ERR_FORMAT, "id -3 is outside");
    check_bad("mergeunknown", DOC("null", PRE, "{\"vocab\": " VOCAB ", \"merges\": [\"a b\", \"a zz\"]}"),
              HP_ERR_FORMAT, "model.merges[1]: token \"zz\" is not in model.vocab");
    check_bad("mergeresult", DOC("null", PRE, "{\"vocab\": " VOCAB ", \"merges\": [[\"b\", \"a\"]]}"),
              HP_ERR_FORMAT, "model.merges[0]: the merged token \"ba\" is not in model.vocab");
    check_bad("mergeform", DOC("null", PRE, "{\"vocab\": " VOCAB ", \"merges\": [\"a b c\"]}"),
              HP_ERR_FORMAT, "model.merges[0]: \"a b c\" is not of the form");
    check_bad("mergetype", DOC("null", PRE, "{\"vocab\": " VOCAB ", \"merges\": [7]}"),
              HP_ERR_FORMAT, "model.merges[0]: is int");
    check_bad("wordpiece", DOC("null", PRE, "{\"type\": \"WordPiece\", \"vocab\": " VOCAB "}"),
              HP_ERR_UNSUPPORTED, "model.type: model \"WordPiece\" is not supported");
    check_bad("normalizer", DOC("{\"type\": \"Lowercase\"}", PRE, "{\"vocab\": " VOCAB ", \"merges\": []}"),
              HP_ERR_UNSUPPORTED, "normalizer: normalizer \"Lowercase\" is not supported (supported: NFC");
    check_bad("normalizerseq",
              DOC("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Precompiled\"}]}",
                  PRE, "{\"vocab\": " VOCAB ", \"merges\": []}"),
              HP_ERR_UNSUPPORTED, "normalizer.normalizers[1]: normalizer \"Precompiled\" is not supported");
    check_bad("pretok", DOC("null", "{\"type\": \"BertPreTokenizer\"}", "{\"vocab\": " VOCAB ", \"merges\": []}"),
              HP_ERR_UNSUPPORTED, "pre_tokenizer: pre-tokenizer type \"BertPreTokenizer\" is not supported");
    check_bad("pretokseq",
              DOC("null", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"CharDelimiterSplit\"}]}",
                  "{\"vocab\": " VOCAB ", \"merges\": []}"),
              HP_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[0]: pre-tokenizer type \"CharDelimiterSplit\"");
    check_bad("splitorder",
              DOC("null", "{\"type\": \"Sequence\", \"pretokenizers\": [" PRE ", {\"type\": \"Digits\"}]}",
                  "{\"vocab\": " VOCAB ", \"merges\": []}"),
              HP_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[1]: a splitting step after a ByteLevel");
    check_bad("badregex",
              DOC("null", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}, " PRE "]}",
                  "{\"vocab\": " VOCAB ", \"merges\": []}"),
              HP_ERR_FORMAT, "pre_tokenizer.pretokenizers[0].pattern.Regex: regex does not compile");
    check_bad("prefix", DOC("null", PRE, "{\"vocab\": " VOCAB ", \"merges\": [], \"continuing_subword_prefix\": \"##\"}"),
              HP_ERR_UNSUPPORTED, "model.continuing_subword_prefix: is \"##\"; only null or \"\" is supported");
    check_bad("addedtype",
              "{\"added_tokens\": [{\"id\": \"x\", \"content\": \"<s>\"}], \"pre_tokenizer\": " PRE
              ", \"model\": {\"vocab\": " VOCAB ", \"merges\": []}}",
              HP_ERR_FORMAT, "added_tokens[0]: member \"id\" is string, expected int");
    check_bad("dropout", DOC("null", PRE, "{\"vocab\": " VOCAB ", \"merges\": [], \"dropout\": 0.1}"),
              HP_ERR_UNSUPPORTED, "model.dropout: BPE dropout 0.1 is not supported");
    check_bad("decoder",
              "{\"pre_tokenizer\": " PRE ", \"decoder\": {\"type\": \"WordPiece\"}, \"model\": {\"vocab\": " VOCAB ", \"merges\": []}}",
              HP_ERR_UNSUPPORTED, "decoder: decoder \"WordPiece\" is not supported (supported: ByteLevel, Replace");
    /* Only added tokens: text would encode to nothing, training would see BOS/EOS only. */
    check_bad("onlyadded",
              "{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\", \"special\": true}, "
              "{\"id\": 1, \"content\": \"</s>\", \"special\": true}], \"pre_tokenizer\": " PRE
              ", \"model\": {\"vocab\": {}, \"merges\": []}}",
              HP_ERR_FORMAT, "model.vocab: has no tokens besides the 2 added tokens");
    check_bad("onlyaddedinvocab",
              "{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\", \"special\": true}], "
              "\"pre_tokenizer\": " PRE ", \"model\": {\"vocab\": {\"<s>\": 0}, \"merges\": []}}",
              HP_ERR_FORMAT, "model.vocab: has no tokens besides the 1 added tokens");
    check_bad("template",
              "{\"pre_tokenizer\": " PRE ", \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
              "[{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
              "\"special_tokens\": {}}, \"model\": {\"vocab\": " VOCAB ", \"merges\": []}}",
              HP_ERR_FORMAT, "post_processor.special_tokens: has no entry \"<s>\"");
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0, *len = (size_t)n;
    return buf;
}

/* Truncated and byte-flipped tokenizer.json files give an error or load, never crash. */
static void check_fuzz(void) {
    size_t len;
    char *doc = slurp(data_path("llama3_hf.json"), &len);
    HP_CHECK(doc != NULL, "cannot read llama3_hf.json");
    if (!doc) return;
    char *mut = malloc(len);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int errors = 0, loaded = 0;
    for (int trial = 0; trial < 300; trial++) {
        memcpy(mut, doc, len);
        size_t n = len;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (trial < 100) {
            n = (size_t)(x % len); /* truncation */
        } else {
            for (int k = 0; k < 1 + trial % 4; k++) { /* a few byte changes */
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                static const char repl[] = "\"{}[],:0-9 x\\\x80\xff";
                mut[x % len] = repl[(x >> 32) % (sizeof(repl) - 1)];
            }
        }
        hp_tokenizer_t tok = NULL;
        hp_status_t st = hp_tokenizer_load_json(&tok, mut, n, "fuzz.json");
        if (st == HP_OK) {
            hp_token_ids_t ids = {0};
            const char *t = "Fuzzing: don't crash 123 \xc3\xa9!";
            if (hp_tokenizer_encode(tok, t, strlen(t), HP_TOKENIZE_ADD_SPECIAL, &ids) == HP_OK) {
                char *out = NULL;
                hp_tokenizer_decode(tok, ids.ids, ids.len, 0, &out, NULL);
                free(out);
            }
            hp_token_ids_free(&ids);
            hp_tokenizer_free(tok);
            loaded++;
        } else {
            HP_CHECK(strstr(hp_last_error(), "fuzz.json") != NULL && tok == NULL,
                     "fuzz %d: message without the file name: %s", trial, hp_last_error());
            errors++;
        }
    }
    printf("fuzz: 300 damaged files, %d rejected with a message, %d still valid\n", errors, loaded);
    free(mut);
    free(doc);
}

/* decode(encode(corpus)) == corpus, and throughput. */
static void check_corpus(void) {
    size_t len;
    char *text = slurp(data_path("corpus.txt"), &len);
    HP_CHECK(text != NULL, "cannot read corpus.txt");
    if (!text) return;
    hp_tokenizer_t tok = NULL;
    HP_CHECK_OK(hp_tokenizer_load(&tok, data_path("ours.json")));
    if (tok) {
        hp_token_ids_t ids = {0};
        double t0 = hp_clock_now_seconds();
        int reps = 20;
        for (int r = 0; r < reps; r++) {
            ids.len = 0;
            HP_CHECK_OK(hp_tokenizer_encode(tok, text, len, 0, &ids));
        }
        double s = hp_clock_now_seconds() - t0;
        char *out = NULL;
        size_t out_len = 0;
        HP_CHECK_OK(hp_tokenizer_decode(tok, ids.ids, ids.len, 0, &out, &out_len));
        HP_CHECK(out && out_len == len && memcmp(out, text, len) == 0, "corpus round trip");
        printf("corpus.txt: %zu bytes -> %zu ids, encode %.1f MB/s (warm cache)\n", len, ids.len,
               (double)len * reps / s / 1e6);
        free(out);
        hp_token_ids_free(&ids);
        hp_tokenizer_free(tok);
    }
    free(text);
}

int main(void) {
    const char *src = getenv("HP_SOURCE_DIR");
    snprintf(data_dir, sizeof(data_dir), "%s/tests/data/tokenizer", src ? src : "..");
    check_golden("golden_gpt2_hf.json");
    check_golden("golden_gpt2_hf_prefix.json");
    check_golden("golden_llama3_hf.json");
    check_golden("golden_ours.json");
    check_split();
    check_random();
    check_unk();
    check_no_unk();
    check_special();
    check_training();
    check_errors();
    check_fuzz();
    check_corpus();
    return hp_test_finish("test_tokenizer");
}
