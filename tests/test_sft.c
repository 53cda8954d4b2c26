/* SFT data (issue 28): every known chat template renders tests/data/sft/golden.json's
 * conversations exactly as transformers' apply_chat_template(tokenize=False) (the text, or the
 * template's refusal), the ids of that text equal the `tokenizers` library's, the assistant
 * spans and token masks equal the golden ones; the released template texts are recognised
 * (also with CR LF and surrounding whitespace) and others refused by name with a hint;
 * malformed lines, unknown roles and the other sample errors name the file and line; the
 * loader packs whole samples with their boundaries (positions), masks all but the assistant
 * tokens, never lets a sample's last label predict the next sample, pads with pad_id / -100,
 * truncates / drops / refuses long samples per data.sft_truncation, shards by dp rank, and
 * resumes from its state blob with the identical next batches. */
// hp-test: ranks 1 timeout 120
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/chat_template.h"
#include "hyperparallel/data.h"
#include "hyperparallel/tokenizer.h"

static hp_status_t encode_cb(void *ctx, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n) {
    static hp_token_ids_t scratch;
    scratch.len = 0;
    HP_TRY(hp_tokenizer_encode((hp_tokenizer_t)ctx, text, len, 0, &scratch));
    if (scratch.len > 0 && cap > 0) memcpy(ids, scratch.ids, (scratch.len < cap ? scratch.len : cap) * sizeof *ids);
    *n = scratch.len;
    return HP_OK;
}

static hp_tokenizer_t load_tok(const char *family) {
    char p[600], rel[128];
    snprintf(rel, sizeof rel, "tests/data/tokenizer/hf/%s", family);
    hp_test_source_path(p, sizeof p, rel);
    hp_tokenizer_t tok = NULL;
    HP_CHECK_OK(hp_tokenizer_load_dir(&tok, p));
    return tok;
}

static json_object *golden_;

/* The golden cases: text, ids, spans and masks equal transformers' / tokenizers'. */
static void golden_cases(void) {
    char p[600];
    hp_test_source_path(p, sizeof p, "tests/data/sft/golden.json");
    golden_ = json_object_from_file(p);
    HP_CHECK(golden_ != NULL, "cannot read %s", p);
    if (!golden_) return;
    json_object *tmpls = json_object_object_get(golden_, "templates"), *cases = json_object_object_get(golden_, "cases");
    size_t nt = json_object_array_length(tmpls), nc = json_object_array_length(cases);
    HP_CHECK(nt == 10 && nc >= 150, "golden: %zu templates, %zu cases", nt, nc);
    for (size_t i = 0; i < nt; i++) {   /* the released texts are recognised */
        json_object *t = json_object_array_get_idx(tmpls, i);
        const char *want = json_object_get_string(json_object_object_get(t, "name")), *got = NULL;
        HP_CHECK_OK(hp_chat_template_recognize(json_object_get_string(json_object_object_get(t, "text")), &got));
        HP_CHECK(got && strcmp(got, want) == 0, "recognised %s as %s", want, got ? got : "nothing");
    }
    int texts = 0, refusals = 0, masks = 0;
    hp_chat_sample_t s = {0};
    hp_chat_render_t r = {0};
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < nc; i++) {
        json_object *c = json_object_array_get_idx(cases, i);
        const char *name = json_object_get_string(json_object_object_get(c, "template"));
        const char *cname = json_object_get_string(json_object_object_get(c, "name"));
        const char *fam = NULL;
        for (size_t k = 0; k < nt; k++) {
            json_object *t = json_object_array_get_idx(tmpls, k);
            if (strcmp(json_object_get_string(json_object_object_get(t, "name")), name) == 0)
                fam = json_object_get_string(json_object_object_get(t, "tokenizer"));
        }
        hp_tokenizer_t tok = load_tok(fam);
        hp_chat_template_t tm = NULL;
        HP_CHECK_OK(hp_chat_template_from_tokenizer(tok, name, &tm));
        const char *line = json_object_get_string(json_object_object_get(c, "line"));
        HP_CHECK_OK(hp_chat_sample_parse(line, strlen(line), "golden: ", false, &s));
        bool gen = json_object_get_boolean(json_object_object_get(c, "add_generation_prompt"));
        hp_status_t st = tm ? hp_chat_template_render(tm, s.m, s.n, s.first_trained, gen, &r) : HP_ERR_STATE;
        json_object *err = json_object_object_get(c, "error");
        if (err) {   /* the template refuses it: so do we, in its words */
            char head[40];
            snprintf(head, sizeof head, "%.30s", json_object_get_string(err));
            HP_CHECK(st == HP_ERR_INVALID_ARG && strstr(hp_last_error(), head), "%s/%s: expected the refusal '%s', got "
                     "%d: %s", name, cname, json_object_get_string(err), (int)st, hp_last_error());
            refusals++;
        } else {
            const char *want = json_object_get_string(json_object_object_get(c, "text"));
            HP_CHECK(st == HP_OK && strlen(want) == r.len && memcmp(want, r.text, r.len) == 0,
                     "%s/%s: rendering differs from transformers (%d: %s)\n want: %s\n got:  %s", name, cname, (int)st,
                     st ? hp_last_error() : "", want, r.text ? r.text : "");
            texts++;
            hp_text_encoder_t enc = {encode_cb, tok, -1, -1};
            if (st == HP_OK) HP_CHECK_OK(hp_chat_tokenize(&r, &enc, &ids, &mask, &n, &cap));
            json_object *gi = json_object_object_get(c, "ids"), *gm = json_object_object_get(c, "mask"),
                        *gs = json_object_object_get(c, "spans");
            size_t ng = json_object_array_length(gi);
            bool same = ng == n;
            for (size_t k = 0; same && k < n; k++) same = ids[k] == json_object_get_int(json_object_array_get_idx(gi, k));
            HP_CHECK(same, "%s/%s: %zu ids, tokenizers gave %zu (or they differ)", name, cname, n, ng);
            if (gs && !gen) {
                bool ok = json_object_array_length(gs) == r.n_spans;
                for (size_t k = 0; ok && k < r.n_spans; k++) {
                    json_object *sp = json_object_array_get_idx(gs, k);
                    ok = (size_t)json_object_get_int64(json_object_array_get_idx(sp, 0)) == r.spans[k][0] &&
                         (size_t)json_object_get_int64(json_object_array_get_idx(sp, 1)) == r.spans[k][1];
                }
                HP_CHECK(ok, "%s/%s: assistant spans differ from transformers' prompt renderings", name, cname);
                for (size_t k = 0; same && k < n; k++)
                    ok &= mask[k] == json_object_get_int(json_object_array_get_idx(gm, k));
                HP_CHECK(ok, "%s/%s: token mask differs from the golden one", name, cname);
                masks++;
            }
        }
        hp_chat_template_free(tm);
        hp_tokenizer_free(tok);
    }
    printf("golden: %d renderings equal transformers', %d refusals as the templates', %d masks\n", texts, refusals,
           masks);
    HP_CHECK(texts >= 140 && refusals >= 20 && masks >= 120, "too few golden checks ran");
    hp_chat_sample_free(&s);
    hp_chat_render_free(&r);
    free(ids);
    free(mask);
}

/* Recognition: normalised variants match, other templates are refused by name with a hint. */
static void recognition(void) {
    json_object *t = json_object_array_get_idx(json_object_object_get(golden_, "templates"), 2);   // qwen3
    const char *q3 = json_object_get_string(json_object_object_get(t, "text"));
    size_t n = strlen(q3);
    char *v = malloc(3 * n + 16);
    size_t k = 0;
    v[k++] = '\n';
    for (size_t i = 0; i < n; i++) {
        if (q3[i] == '\n') v[k++] = '\r';
        v[k++] = q3[i];
    }
    strcpy(v + k, "  \n");
    const char *got = NULL;
    HP_CHECK_OK(hp_chat_template_recognize(v, &got));
    HP_CHECK(got && strcmp(got, "qwen3") == 0, "CR LF qwen3 recognised as %s", got ? got : "nothing");
    strcpy(v, q3);
    char *at = strstr(v, "<think>\\n\\n</think>");
    at[1] = 'T';   /* one byte off */
    HP_CHECK_ERR(hp_chat_template_recognize(v, &got), HP_ERR_UNSUPPORTED, "closest, qwen3");
    HP_CHECK(strstr(hp_last_error(), "data.chat_template") && strstr(hp_last_error(), "hint"), "%s", hp_last_error());
    free(v);
    /* the tokenizer tests' folders: ChatML is a released template, the llama2 one is not */
    hp_tokenizer_t tok = load_tok("qwen3");
    hp_chat_template_t tm = NULL;
    HP_CHECK_OK(hp_chat_template_from_tokenizer(tok, NULL, &tm));
    HP_CHECK(tm && strcmp(hp_chat_template_name(tm), "chatml") == 0, "qwen3 test folder: %s",
             tm ? hp_chat_template_name(tm) : "?");
    hp_chat_template_free(tm);
    hp_tokenizer_free(tok);
    tok = load_tok("llama2");
    HP_CHECK_ERR(hp_chat_template_from_tokenizer(tok, NULL, &tm), HP_ERR_UNSUPPORTED, "none of the known ones");
    HP_CHECK_OK(hp_chat_template_from_tokenizer(tok, "llama2", &tm));   /* data.chat_template overrides */
    hp_chat_template_free(tm);
    HP_CHECK_ERR(hp_chat_template_from_tokenizer(tok, "vicuna", &tm), HP_ERR_INVALID_ARG,
                 "data.chat_template = 'vicuna' is not a known chat template; expected one of qwen2.5, chatml");
    hp_tokenizer_free(tok);
}

/* Sample errors name the place and give a hint. */
static void sample_errors(void) {
    static const struct { const char *line, *needle; } bad[] = {
        {"{\"messages\": [", "f.jsonl:7: invalid JSON"},
        {"[1, 2]", "f.jsonl:7: the line is not a JSON object"},
        {"{\"text\": \"x\"}", "neither \"messages\" nor \"prompt\" and \"completion\""},
        {"{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}", "unknown role \"bot\"; expected one of system, user"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 3}, {\"role\": \"assistant\", \"content\": \"a\"}]}",
         "\"content\" is int; expected a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}", "no assistant message: nothing to train on"},
        {"{\"prompt\": \"q\", \"completion\": [{\"role\": \"user\", \"content\": \"a\"}]}",
         "no assistant message in \"completion\""},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"\", "
         "\"tool_calls\": [{}]}]}", "tool_calls are not supported"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]} x", "unexpected text after the JSON value"},
    };
    hp_chat_sample_t s = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hp_status_t st = hp_chat_sample_parse(bad[i].line, strlen(bad[i].line), "f.jsonl:7: ", true, &s);
        HP_CHECK(st != HP_OK && strstr(hp_last_error(), bad[i].needle) && strstr(hp_last_error(), "f.jsonl:7: "),
                 "line %zu: expected '%s', got %d: %s", i, bad[i].needle, (int)st, hp_last_error());
    }
    hp_chat_sample_free(&s);
}

/* ---- the loader ---------------------------------------------------------------------- */

enum { NS = 24, T = 48, BR = 2 };
static char dir_[256], file_[300];

static void write_file(void) {
    snprintf(dir_, sizeof dir_, "/tmp/hp_test_sft_XXXXXX");
    HP_CHECK(mkdtemp(dir_) != NULL, "mkdtemp");
    snprintf(file_, sizeof file_, "%s/chat.jsonl", dir_);
    FILE *f = fopen(file_, "w");
    for (int i = 0; i < NS; i++) {
        if (i % 3 == 2)
            fprintf(f, "{\"prompt\": \"sum %d and %d\", \"completion\": \"%d\"}\n", i, i + 1, 2 * i + 1);
        else if (i == 7)   /* a long one */
            fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"tell me a long story number %d\"}, "
                       "{\"role\": \"assistant\", \"content\": \"once upon a time there was a story that went on and "
                       "on and on and on and on and on and on and on and on and on and on until the end\"}]}\n", i);
        else
            fprintf(f, "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", "
                       "\"content\": \"question %d\"}, {\"role\": \"assistant\", \"content\": \"answer %d\"}, "
                       "{\"role\": \"user\", \"content\": \"and %d?\"}, {\"role\": \"assistant\", \"content\": "
                       "\"%d\"}]}\n", i, i, i + 1, i * 7);
        if (i == 10) fprintf(f, "\n");   /* blank lines are skipped */
    }
    fclose(f);
}

typedef struct setup {
    hp_tokenizer_t tok;
    hp_chat_template_t tm;
    hp_dataset_t ds;
    hp_text_encoder_t enc;
} setup_t;

static void open_all(setup_t *u) {
    u->tok = load_tok("qwen3");
    HP_CHECK_OK(hp_chat_template_from_tokenizer(u->tok, "qwen3", &u->tm));
    hp_dataset_options_t o = {file_, "chat", NULL, NULL, NULL, 0.0};
    HP_CHECK_OK(hp_dataset_open(&o, &u->ds));
    u->enc = (hp_text_encoder_t){encode_cb, u->tok, -1, -1};
}

static hp_dataloader_t loader(setup_t *u, int r, int w, bool pack, hp_sft_truncation_t tr, int64_t t) {
    hp_dataloader_options_t o = {HP_SPLIT_TRAIN, t, BR, r, w, true, hp_tokenizer_vocab_size(u->tok)};
    hp_sft_options_t so = {u->tm, hp_tokenizer_pad_id(u->tok), pack, tr};
    hp_dataloader_t dl = NULL;
    HP_CHECK_OK(hp_dataloader_create_sft(u->ds, &u->enc, &o, &so, &dl));
    return dl;
}

/* The standalone (input, label) pairs of document d: what every packed copy must hold. */
static size_t sample_pairs(setup_t *u, int64_t d, int32_t *in, int32_t *lab) {
    const char *line;
    size_t len, n = 0, cap = 0;
    HP_CHECK_OK(hp_dataset_document(u->ds, HP_SPLIT_TRAIN, d, &line, &len));
    hp_chat_sample_t s = {0};
    hp_chat_render_t r = {0};
    int32_t *ids = NULL;
    uint8_t *mask = NULL;
    HP_CHECK_OK(hp_chat_sample_parse(line, len, "", true, &s));
    HP_CHECK_OK(hp_chat_template_render(u->tm, s.m, s.n, s.first_trained, false, &r));
    HP_CHECK_OK(hp_chat_tokenize(&r, &u->enc, &ids, &mask, &n, &cap));
    for (size_t j = 0; j + 1 < n; j++) {
        in[j] = ids[j];
        lab[j] = mask[j + 1] ? ids[j + 1] : -100;
    }
    hp_chat_sample_free(&s);
    hp_chat_render_free(&r);
    free(ids);
    free(mask);
    return n - 1;
}

static void packing(setup_t *u) {
    int32_t in[BR * 2 * T], lab[BR * 2 * T], pos[BR * 2 * T], si[4 * T], sl[4 * T];
    bool got;
    /* pack: each row holds whole samples in document order; positions restart at each */
    hp_dataloader_t dl = loader(u, 0, 1, true, HP_SFT_TRUNCATE, 2 * T);
    int64_t doc = 0;
    int rows_multi = 0, masked = 0, trained = 0;
    for (int b = 0; b < 6; b++) {
        HP_CHECK_OK(hp_dataloader_next_docs(dl, in, lab, pos, &got));
        for (int r = 0; r < BR; r++) {
            int32_t *ri = in + r * 2 * T, *rl = lab + r * 2 * T, *rp = pos + r * 2 * T;
            int t = 0, here = 0;
            while (t < 2 * T) {
                if (doc >= NS) break;
                size_t n = sample_pairs(u, doc, si, sl);
                if (n > 2 * T) n = 2 * T;
                if (t > 0 && t + (int)n > 2 * T) break;
                HP_CHECK(rp[t] == 0, "row %d of batch %d: sample %lld starts at %d with position %d", r, b,
                         (long long)doc, t, rp[t]);
                HP_CHECK(memcmp(ri + t, si, n * 4) == 0 && memcmp(rl + t, sl, n * 4) == 0,
                         "batch %d row %d: sample %lld differs from its standalone pairs", b, r, (long long)doc);
                /* the label of the sample's last position is its own last token, not the next sample's first */
                HP_CHECK(rl[t + n - 1] == -100 || rl[t + n - 1] == sl[n - 1], "last label crosses into the next sample");
                for (size_t j = 0; j < n; j++) masked += sl[j] == -100, trained += sl[j] != -100;
                t += (int)n;
                doc++;
                here++;
            }
            rows_multi += here > 1;
            for (int k = t; k < 2 * T && doc < NS; k++)
                HP_CHECK(ri[k] == hp_tokenizer_pad_id(u->tok) && rl[k] == -100 && rp[k] == k - t,
                         "padding at %d: id %d label %d position %d", k, ri[k], rl[k], rp[k]);
        }
    }
    HP_CHECK(rows_multi >= 3 && masked > trained && trained > 20, "packing: %d rows with several samples, %d masked "
             "and %d trained labels", rows_multi, masked, trained);
    hp_dataloader_destroy(dl);
    /* no packing: one sample per row */
    dl = loader(u, 0, 1, false, HP_SFT_TRUNCATE, 2 * T);
    HP_CHECK_OK(hp_dataloader_next_docs(dl, in, lab, pos, &got));
    size_t n1 = sample_pairs(u, 1, si, sl);
    HP_CHECK(memcmp(in + 2 * T, si, n1 * 4) == 0 && pos[2 * T + n1] == 0 && in[2 * T + n1] == hp_tokenizer_pad_id(u->tok),
             "pack = false: row 1 is sample 1 then padding");
    hp_dataloader_destroy(dl);
    /* truncation: Tt fits every sample but 7 */
    int64_t Tt = 0;
    for (int d = 0; d < NS; d++) {
        size_t n = sample_pairs(u, d, si, sl);
        if (d != 7 && (int64_t)n > Tt) Tt = (int64_t)n;
    }
    size_t n7 = sample_pairs(u, 7, si, sl);
    HP_CHECK((int64_t)n7 > Tt && Tt <= 2 * T, "sample 7 has %zu pairs, the others at most %lld", n7, (long long)Tt);
    dl = loader(u, 0, 1, false, HP_SFT_ERROR, Tt);
    hp_status_t st = HP_OK;
    for (int b = 0; b < 6 && st == HP_OK; b++) st = hp_dataloader_next(dl, in, lab, &got);
    HP_CHECK(st == HP_ERR_INVALID_ARG && strstr(hp_last_error(), "chat.jsonl:8: the conversation has") &&
             strstr(hp_last_error(), "data.sft_truncation"), "error policy: %s", hp_last_error());
    hp_dataloader_destroy(dl);
    dl = loader(u, 0, 1, false, HP_SFT_TRUNCATE, Tt);
    for (int b = 0; b < 4; b++) HP_CHECK_OK(hp_dataloader_next(dl, in, lab, &got));   /* row 7 = batch 3 row 1 */
    HP_CHECK(memcmp(in + Tt, si, (size_t)Tt * 4) == 0 && memcmp(lab + Tt, sl, (size_t)Tt * 4) == 0,
             "truncate keeps the first seq_len pairs");
    hp_dataloader_destroy(dl);
    dl = loader(u, 0, 1, false, HP_SFT_DROP, Tt);
    for (int b = 0; b < 4; b++) HP_CHECK_OK(hp_dataloader_next(dl, in, lab, &got));   /* row 7 is sample 8 now */
    size_t n8 = sample_pairs(u, 8, si, sl);
    HP_CHECK(memcmp(in + Tt, si, n8 * 4) == 0, "drop skips sample 7");
    hp_dataloader_destroy(dl);
}

/* dp shards: rank r starts at its contiguous shard; state blobs resume exactly. */
static void shards_and_state(setup_t *u) {
    int32_t in[BR * T], lab[BR * T], pos[BR * T], si[4 * T], sl[4 * T];
    bool got;
    for (int r = 0; r < 2; r++) {
        hp_dataloader_t dl = loader(u, r, 2, true, HP_SFT_TRUNCATE, T);
        HP_CHECK(hp_dataloader_shard_documents(dl) == NS / 2, "shard of %lld", (long long)hp_dataloader_shard_documents(dl));
        HP_CHECK_OK(hp_dataloader_next(dl, in, lab, &got));
        size_t n = sample_pairs(u, r * NS / 2, si, sl);
        HP_CHECK(memcmp(in, si, (n < T ? n : T) * 4) == 0, "dp rank %d does not start at document %d", r, r * NS / 2);
        hp_dataloader_destroy(dl);
    }
    for (int k = 0; k < 9; k++) {   /* after k batches (over epochs: 9 x 2 rows > 12 samples of a shard) */
        hp_dataloader_t a = loader(u, 1, 2, true, HP_SFT_TRUNCATE, T), c = loader(u, 1, 2, true, HP_SFT_TRUNCATE, T);
        for (int i = 0; i < k; i++) HP_CHECK_OK(hp_dataloader_next(a, in, lab, &got));
        unsigned char blob[256];
        size_t bn = 0;
        HP_CHECK_OK(hp_dataloader_state_save(a, blob, sizeof blob, &bn));
        HP_CHECK_OK(hp_dataloader_state_load(c, blob, bn));
        bool same = true;
        for (int i = 0; i < 4; i++) {
            int32_t in2[BR * T], lab2[BR * T], pos2[BR * T];
            HP_CHECK_OK(hp_dataloader_next_docs(a, in, lab, pos, &got));
            HP_CHECK_OK(hp_dataloader_next_docs(c, in2, lab2, pos2, &got));
            same &= !memcmp(in, in2, sizeof in) && !memcmp(lab, lab2, sizeof lab) && !memcmp(pos, pos2, sizeof pos);
        }
        HP_CHECK(same, "restored after %d batches: the next batches differ", k);
        HP_CHECK(k < 8 || hp_dataloader_epoch(a) >= 1, "the state test did not cross an epoch");
        hp_dataloader_destroy(a);
        hp_dataloader_destroy(c);
    }
}

static void open_errors(void) {
    char p[400];
    snprintf(p, sizeof p, "%s/bad.jsonl", dir_);
    FILE *f = fopen(p, "w");
    fprintf(f, "{\"prompt\": \"a\", \"completion\": \"b\"}\n\n{\"messages\": [{\"role\": \"narrator\", \"content\": "
               "\"x\"}]}\n");
    fclose(f);
    hp_dataset_options_t o = {p, "chat", NULL, NULL, NULL, 0.0};
    hp_dataset_t ds = NULL;
    HP_CHECK_ERR(hp_dataset_open(&o, &ds), HP_ERR_FORMAT, "bad.jsonl:3: messages[0]: unknown role \"narrator\"");
    /* positions need boundaries: text windows have none */
    snprintf(p, sizeof p, "%s/t.txt", dir_);
    f = fopen(p, "w");
    fprintf(f, "one two three four five six seven eight nine ten eleven twelve\n");
    fclose(f);
    hp_dataset_options_t to = {p, "text", "line", NULL, NULL, 0.0};
    HP_CHECK_OK(hp_dataset_open(&to, &ds));
    hp_text_encoder_t enc = hp_text_encoder_bytes();
    hp_dataloader_options_t lo = {HP_SPLIT_TRAIN, 4, 1, 0, 1, true, 0};
    hp_dataloader_t dl = NULL;
    HP_CHECK_OK(hp_dataloader_create(ds, &enc, &lo, &dl));
    int32_t a[4], b[4], c[4];
    bool got;
    HP_CHECK_ERR(hp_dataloader_next_docs(dl, a, b, c, &got), HP_ERR_UNSUPPORTED, "carry no document boundaries");
    hp_dataloader_destroy(dl);
    hp_dataset_close(ds);
}

int main(void) {
    golden_cases();
    if (golden_) {
        recognition();
        sample_errors();
        write_file();
        setup_t u = {0};
        open_all(&u);
        if (u.ds && u.tm) {
            HP_CHECK(hp_dataset_num_documents(u.ds, HP_SPLIT_TRAIN) == NS && !strcmp(hp_dataset_format(u.ds), "chat"),
                     "chat dataset: %lld documents", (long long)hp_dataset_num_documents(u.ds, HP_SPLIT_TRAIN));
            packing(&u);
            shards_and_state(&u);
        }
        open_errors();
        hp_dataset_close(u.ds);
        hp_chat_template_free(u.tm);
        hp_tokenizer_free(u.tok);
        hp_test_remove_dir(dir_);
        json_object_put(golden_);
    }
    return hp_test_finish("test_sft");
}
