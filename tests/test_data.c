/* Data: TorchTitan packing (BOS + doc + EOS, seq_len + 1 windows without overlap, inputs =
 * w[:-1], labels = w[1:]), contiguous sharding over dp ranks, looping, the same windows from
 * text, JSONL and pre-tokenized bin files, the validation split, and (issue 4 acceptance 4)
 * restoring dataloader state yields the identical next batches on every rank; states are
 * exchanged between ranks to check that a rank refuses another rank's state. Bad files give
 * errors naming the file. Corpus files are generated per rank under /tmp. */
// hp-test: ranks 1 2 4 timeout 120
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hp_test.h"
#include "hp_test_mpi.h"
#include "hyperparallel/comm.h"
#include "hyperparallel/data.h"
#include "hyperparallel/status.h"

#define NDOCS 40
#define T 16
#define B 3
#define NB 12

static char docs_[NDOCS][160];
static char dir_[256];
static int rank_, world_;

static void make_docs(void) {
    static const char *words[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"};
    for (int i = 0; i < NDOCS; i++) {
        int n = snprintf(docs_[i], sizeof docs_[i], "doc %d:", i);
        int nw = 1 + (i * 7) % 9;
        for (int w = 0; w < nw; w++)
            n += snprintf(docs_[i] + n, sizeof docs_[i] - (size_t)n, " %s", words[(i + w * 3) % 8]);
        if (i % 5 == 0) n += snprintf(docs_[i] + n, sizeof docs_[i] - (size_t)n, "\n  second \"line\"");
    }
}

static void path(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", dir_, name); }

static void write_file(const char *name, const void *data, size_t n) {
    char p[512];
    path(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    HP_ASSERT(f);
    fwrite(data, 1, n, f);
    fclose(f);
}

static void write_text(const char *name, const char *s) { write_file(name, s, strlen(s)); }

static void make_files(void) {
    static char text[1 << 16], blank[1 << 16], jsonl[1 << 16];
    size_t a = 0, b = 0, c = 0;
    for (int i = 0; i < NDOCS; i++) {
        a += (size_t)snprintf(text + a, sizeof text - a, "%s\n%%\n", docs_[i]);
        /* blank-line separated: an inner blank line would split the document, so the test
         * documents' second lines are indented text, and separators vary (several blank lines). */
        b += (size_t)snprintf(blank + b, sizeof blank - b, "%s\n\n%s", docs_[i], i % 3 ? "" : "  \n\n");
        c += (size_t)snprintf(jsonl + c, sizeof jsonl - c, "{\"id\": %d, \"text\": \"", i);
        for (const char *p = docs_[i]; *p; p++) {
            if (*p == '\n') c += (size_t)snprintf(jsonl + c, sizeof jsonl - c, "\\n");
            else if (*p == '"') c += (size_t)snprintf(jsonl + c, sizeof jsonl - c, "\\\"");
            else jsonl[c++] = *p;
        }
        c += (size_t)snprintf(jsonl + c, sizeof jsonl - c, "\"}\n%s", i == 7 ? "\n" : "");
    }
    write_text("corpus.txt", text);
    write_text("blank.txt", blank);
    write_text("corpus.jsonl", jsonl);
    /* The byte-encoder stream of all documents as uint16 and uint32. */
    static uint16_t s16[1 << 15];
    static uint32_t s32[1 << 15];
    size_t n = 0;
    for (int i = 0; i < NDOCS; i++) {
        s16[n] = 256, s32[n++] = 256;
        for (const char *p = docs_[i]; *p; p++) s16[n] = (unsigned char)*p, s32[n++] = (unsigned char)*p;
        s16[n] = 257, s32[n++] = 257;
    }
    write_file("corpus.bin", s16, n * 2);
    write_file("corpus32.bin", s32, n * 4);
}

/* The token stream of documents [b, e) with the byte encoder. */
static size_t doc_stream(int b, int e, int32_t *out) {
    size_t n = 0;
    for (int i = b; i < e; i++) {
        out[n++] = 256;
        for (const char *p = docs_[i]; *p; p++) out[n++] = (unsigned char)*p;
        out[n++] = 257;
    }
    return n;
}

static void shard(int n, int r, int w, int *b, int *e) {
    int div = n / w, mod = n % w;
    *b = div * r + (r < mod ? r : mod);
    *e = *b + div + (r < mod ? 1 : 0);
}

static hp_dataset_t open_ds(const char *name, const char *format, const char *sep, double val) {
    char p[512];
    path(p, sizeof p, name);
    hp_dataset_options_t o = {p, format, sep, NULL, NULL, val};
    hp_dataset_t ds = NULL;
    HP_CHECK_OK(hp_dataset_open(&o, &ds));
    return ds;
}

static hp_dataloader_t make_dl(hp_dataset_t ds, hp_data_split_t split, int r, int w, bool loop) {
    hp_text_encoder_t enc = hp_text_encoder_bytes();
    hp_dataloader_options_t o = {split, T, B, r, w, loop, 258};
    hp_dataloader_t dl = NULL;
    HP_CHECK_OK(hp_dataloader_create(ds, &enc, &o, &dl));
    return dl;
}

/* Batches equal the cyclic stream `s` (length n) cut into T+1 windows. */
static void check_against_stream(hp_dataloader_t dl, const int32_t *s, size_t n, const char *what) {
    int32_t in[B * T], lab[B * T];
    size_t pos = 0;
    int bad = 0;
    for (int k = 0; k < NB; k++) {
        bool got = false;
        HP_CHECK_OK(hp_dataloader_next(dl, in, lab, &got));
        HP_CHECK(got, "%s: batch %d", what, k);
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                bad += in[b * T + t] != s[(pos + (size_t)t) % n];
                bad += lab[b * T + t] != s[(pos + (size_t)t + 1) % n];
            }
            pos += T + 1;
        }
    }
    HP_CHECK(bad == 0, "%s: %d tokens differ from the expected packed stream", what, bad);
    HP_CHECK(hp_dataloader_epoch(dl) >= 1 || pos < n, "%s: epoch %lld after %zu of %zu tokens", what,
             (long long)hp_dataloader_epoch(dl), pos, n);
}

static void test_packing(void) {
    static int32_t s[1 << 15];
    int b, e;
    shard(NDOCS, rank_, world_, &b, &e);
    size_t n = doc_stream(b, e, s);
    struct { const char *file, *format, *sep; } cases[] = {
        {"corpus.txt", "text", "percent"}, {"blank.txt", "text", "blank_line"}, {"corpus.jsonl", "auto", NULL}};
    for (int c = 0; c < 3; c++) {
        hp_dataset_t ds = open_ds(cases[c].file, cases[c].format, cases[c].sep, 0);
        if (!ds) continue;
        HP_CHECK(hp_dataset_num_documents(ds, HP_SPLIT_TRAIN) == NDOCS, "%s: %lld docs", cases[c].file,
                 (long long)hp_dataset_num_documents(ds, HP_SPLIT_TRAIN));
        const char *t;
        size_t l;
        HP_CHECK_OK(hp_dataset_document(ds, HP_SPLIT_TRAIN, 5, &t, &l));
        HP_CHECK(l == strlen(docs_[5]) && memcmp(t, docs_[5], l) == 0, "%s: doc 5 is '%.*s'", cases[c].file, (int)l, t);
        hp_dataloader_t dl = make_dl(ds, HP_SPLIT_TRAIN, rank_, world_, true);
        HP_CHECK(hp_dataloader_shard_documents(dl) == e - b, "shard size");
        check_against_stream(dl, s, n, cases[c].file);
        hp_dataloader_destroy(dl);
        hp_dataset_close(ds);
    }
    /* Binary: sharded by tokens; the shard's tail shorter than a window is skipped on wrap. */
    static int32_t all[1 << 15];
    size_t total = doc_stream(0, NDOCS, all);
    const char *bins[] = {"corpus.bin", "corpus32.bin"};
    for (int c = 0; c < 2; c++) {
        char p[512];
        path(p, sizeof p, bins[c]);
        hp_dataset_options_t o = {p, "auto", NULL, NULL, c ? "uint32" : "uint16", 0};
        hp_dataset_t ds = NULL;
        HP_CHECK_OK(hp_dataset_open(&o, &ds));
        if (!ds) continue;
        HP_CHECK(hp_dataset_num_documents(ds, HP_SPLIT_TRAIN) == (int64_t)total, "bin tokens");
        hp_dataloader_t dl = make_dl(ds, HP_SPLIT_TRAIN, rank_, world_, true);
        int tb, te;
        shard((int)total, rank_, world_, &tb, &te);
        size_t usable = (size_t)(te - tb) / (T + 1) * (T + 1);
        check_against_stream(dl, all + tb, usable, bins[c]);
        hp_dataloader_destroy(dl);
        hp_dataset_close(ds);
    }
}

/* Issue 4 acceptance 4: save after k batches, restore into a fresh loader: identical next batches. */
static void test_restore(const char *file, const char *format) {
    hp_dataset_t ds = open_ds(file, format, "percent", 0);
    if (!ds) return;
    for (int k = 0; k < NB; k++) {
        hp_dataloader_t a = make_dl(ds, HP_SPLIT_TRAIN, rank_, world_, true);
        int32_t in[B * T], lab[B * T], in2[B * T], lab2[B * T];
        bool got;
        for (int i = 0; i < k; i++) HP_CHECK_OK(hp_dataloader_next(a, in, lab, &got));
        static unsigned char blob[1 << 16], blob2[1 << 16];
        size_t n = 0, n2 = 0;
        HP_CHECK(hp_dataloader_state_size(a) < sizeof blob, "state size");
        HP_CHECK_OK(hp_dataloader_state_save(a, blob, sizeof blob, &n));
        HP_CHECK(n == hp_dataloader_state_size(a), "state size exact");
        hp_dataloader_t b = make_dl(ds, HP_SPLIT_TRAIN, rank_, world_, true);
        /* advance b elsewhere first: loading must overwrite everything */
        HP_CHECK_OK(hp_dataloader_next(b, in2, lab2, &got));
        HP_CHECK_OK(hp_dataloader_state_load(b, blob, n));
        int bad = 0;
        for (int i = 0; i < 6; i++) {
            HP_CHECK_OK(hp_dataloader_next(a, in, lab, &got));
            HP_CHECK_OK(hp_dataloader_next(b, in2, lab2, &got));
            bad += memcmp(in, in2, sizeof in) != 0 || memcmp(lab, lab2, sizeof lab) != 0;
        }
        HP_CHECK(bad == 0, "%s: restored after %d batches: %d of 6 next batches differ", file, k, bad);
        HP_CHECK(hp_dataloader_epoch(a) == hp_dataloader_epoch(b) && hp_dataloader_samples(a) == hp_dataloader_samples(b),
                 "epoch/samples restored");
        HP_CHECK_OK(hp_dataloader_state_save(a, blob, sizeof blob, &n));
        HP_CHECK_OK(hp_dataloader_state_save(b, blob2, sizeof blob2, &n2));
        HP_CHECK(n == n2 && memcmp(blob, blob2, n) == 0, "states equal after the same batches");
        hp_dataloader_destroy(a);
        hp_dataloader_destroy(b);
    }
    hp_dataset_close(ds);
}

/* Every rank's state goes to every rank: only its own is accepted. */
static void test_cross_rank_states(hp_comm_t world) {
    hp_dataset_t ds = open_ds("corpus.txt", "text", "percent", 0);
    if (!ds) return;
    hp_dataloader_t dl = make_dl(ds, HP_SPLIT_TRAIN, rank_, world_, true);
    int32_t in[B * T], lab[B * T];
    bool got;
    for (int i = 0; i < 3; i++) HP_CHECK_OK(hp_dataloader_next(dl, in, lab, &got));
    enum { SLOT = 4096 };
    unsigned char mine[SLOT + 8];
    memset(mine, 0, sizeof mine);
    size_t n = 0;
    HP_CHECK_OK(hp_dataloader_state_save(dl, mine + 8, SLOT, &n));
    memcpy(mine, &n, sizeof n);
    unsigned char *all = calloc((size_t)world_, SLOT + 8);
    HP_CHECK_OK(hp_all_gather(mine, all, SLOT + 8, HP_U8, world, NULL));
    /* The documents each rank consumed partition the corpus. */
    int32_t docs = (int32_t)hp_dataloader_shard_documents(dl), total = 0;
    HP_CHECK_OK(hp_all_reduce(&docs, &total, 1, HP_I32, HP_SUM, world, NULL));
    HP_CHECK(total == NDOCS, "shards cover %d of %d documents", total, NDOCS);
    int32_t first[T];
    hp_dataloader_t fresh = make_dl(ds, HP_SPLIT_TRAIN, rank_, world_, true);
    for (int r = 0; r < world_; r++) {
        size_t nr;
        memcpy(&nr, all + (size_t)r * (SLOT + 8), sizeof nr);
        const unsigned char *blob = all + (size_t)r * (SLOT + 8) + 8;
        if (r == rank_) {
            HP_CHECK_OK(hp_dataloader_state_load(fresh, blob, nr));
        } else {
            HP_CHECK_ERR(hp_dataloader_state_load(fresh, blob, nr), HP_ERR_INVALID_ARG,
                         "the data-parallel degree cannot change");
        }
    }
    /* After loading its own state the fresh loader continues exactly like the original. */
    int32_t in2[B * T], lab2[B * T];
    HP_CHECK_OK(hp_dataloader_next(dl, in, lab, &got));
    HP_CHECK_OK(hp_dataloader_next(fresh, in2, lab2, &got));
    HP_CHECK(memcmp(in, in2, sizeof in) == 0 && memcmp(lab, lab2, sizeof lab) == 0, "cross-rank exchange kept state");
    /* A loader of a different dp world refuses it too. */
    if (world_ > 1) {
        hp_dataloader_t other = make_dl(ds, HP_SPLIT_TRAIN, 0, 1, true);
        HP_CHECK_ERR(hp_dataloader_state_load(other, mine + 8, n), HP_ERR_INVALID_ARG, "cannot change across a resume");
        hp_dataloader_destroy(other);
    }
    /* Ranks start at their own shard's first document. */
    int b, e;
    shard(NDOCS, rank_, world_, &b, &e);
    hp_dataloader_reset(fresh);
    HP_CHECK_OK(hp_dataloader_next(fresh, in2, lab2, &got));
    memcpy(first, in2, sizeof first);
    HP_CHECK(first[0] == 256 && first[1] == (unsigned char)docs_[b][0] && first[5] == (unsigned char)docs_[b][4],
             "rank %d starts with document %d", rank_, b);
    free(all);
    hp_dataloader_destroy(fresh);
    hp_dataloader_destroy(dl);
    hp_dataset_close(ds);
}

static void test_no_loop_and_validation(void) {
    hp_dataset_t ds = open_ds("corpus.txt", "text", "percent", 0.1);
    if (!ds) return;
    HP_CHECK(hp_dataset_num_documents(ds, HP_SPLIT_VALIDATION) == 4, "validation docs");
    HP_CHECK(hp_dataset_num_documents(ds, HP_SPLIT_TRAIN) == NDOCS - 4, "train docs");
    const char *t;
    size_t l;
    HP_CHECK_OK(hp_dataset_document(ds, HP_SPLIT_VALIDATION, 0, &t, &l));
    HP_CHECK(l == strlen(docs_[NDOCS - 4]) && memcmp(t, docs_[NDOCS - 4], l) == 0, "validation = last documents");
    /* Non-looping: exactly floor(shard tokens / (T+1)) windows, then got = false. */
    static int32_t s[1 << 15];
    int b, e;
    shard(4, rank_, world_, &b, &e);
    size_t n = doc_stream(NDOCS - 4 + b, NDOCS - 4 + e, s);
    hp_dataloader_options_t o = {HP_SPLIT_VALIDATION, T, 1, rank_, world_, false, 258};
    hp_text_encoder_t enc = hp_text_encoder_bytes();
    hp_dataloader_t dl = NULL;
    HP_CHECK_OK(hp_dataloader_create(ds, &enc, &o, &dl));
    if (dl) {
        int32_t in[T], lab[T];
        bool got = true;
        int64_t count = 0;
        int bad = 0;
        while (count < 1000) {
            HP_CHECK_OK(hp_dataloader_next(dl, in, lab, &got));
            if (!got) break;
            for (int t = 0; t < T; t++) bad += in[t] != s[(size_t)count * (T + 1) + (size_t)t];
            count++;
        }
        HP_CHECK(!got && count == (int64_t)(n / (T + 1)), "non-looping gave %lld windows, expected %zu",
                 (long long)count, n / (T + 1));
        HP_CHECK(bad == 0, "validation windows");
        hp_dataloader_reset(dl);
        HP_CHECK_OK(hp_dataloader_next(dl, in, lab, &got));
        HP_CHECK(got && in[0] == 256 && in[1] == (unsigned char)docs_[NDOCS - 4 + b][0], "reset restarts");
        hp_dataloader_destroy(dl);
    }
    /* More ranks than validation documents. */
    hp_dataloader_options_t o5 = {HP_SPLIT_VALIDATION, T, 1, 0, 5, false, 0};
    HP_CHECK_ERR(hp_dataloader_create(ds, &enc, &o5, &dl), HP_ERR_INVALID_ARG,
                 "the validation split has 4 documents, fewer than the 5 data-parallel ranks");
    hp_dataset_close(ds);
}

static void test_directory(void) {
    char d[512], p[512];
    path(d, sizeof d, "dir");
    mkdir(d, 0755);
    path(p, sizeof p, "dir/b");
    FILE *f = fopen(p, "w");
    fputs("two\n%\nthree\n%\n", f);
    fclose(f);
    path(p, sizeof p, "dir/a");
    f = fopen(p, "w");
    fputs("one\n%\n", f);
    fclose(f);
    path(p, sizeof p, "dir/a.dat");
    f = fopen(p, "w");
    fputc(0, f);
    fclose(f);
    path(p, sizeof p, "dir/.hidden");
    f = fopen(p, "w");
    fputs("hidden\n", f);
    fclose(f);
    char target[512];
    path(target, sizeof target, "dir/b");
    path(p, sizeof p, "dir/b.u8");
    if (symlink(target, p) != 0) perror("symlink");   /* a .u8 link as in fortune packages: skipped */
    hp_dataset_options_t o = {d, "text", "percent", NULL, NULL, 0};
    hp_dataset_t ds = NULL;
    HP_CHECK_OK(hp_dataset_open(&o, &ds));
    if (!ds) return;
    HP_CHECK(hp_dataset_num_files(ds) == 2, "files %d", hp_dataset_num_files(ds));
    HP_CHECK(hp_dataset_num_documents(ds, HP_SPLIT_TRAIN) == 3, "docs");
    const char *t;
    size_t l;
    HP_CHECK_OK(hp_dataset_document(ds, HP_SPLIT_TRAIN, 0, &t, &l));
    HP_CHECK(l == 3 && memcmp(t, "one", 3) == 0, "name order");
    HP_CHECK_OK(hp_dataset_document(ds, HP_SPLIT_TRAIN, 2, &t, &l));
    HP_CHECK(l == 5 && memcmp(t, "three", 5) == 0, "last doc");
    hp_dataset_close(ds);
    o.format = "bin";
    HP_CHECK_ERR(hp_dataset_open(&o, &ds), HP_ERR_INVALID_ARG, "the bin format reads one file");
}

static void test_errors(void) {
    char p[512];
    hp_dataset_t ds = NULL;
    hp_dataset_options_t o = {"/no/such/corpus.txt", NULL, NULL, NULL, NULL, 0};
    HP_CHECK_ERR(hp_dataset_open(&o, &ds), HP_ERR_IO, "data file '/no/such/corpus.txt': cannot open");
    o.path = "";
    HP_CHECK_ERR(hp_dataset_open(&o, &ds), HP_ERR_INVALID_ARG, "set data.path");

    /* bad files (len 0: the text's strlen) */
    static const struct {
        const char *name, *bytes;
        size_t len;
        const char *needle;   /* all HP_ERR_FORMAT */
    } bad[] = {
        {"nul.txt", "abc\0def", 7, "nul.txt': NUL byte at offset 3"},
        {"bad.jsonl", "{\"text\": \"ok\"}\n\n{\"text\": \"broken\n{\"text\": 3}\n", 0, "bad.jsonl:3: "},
        {"field.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n", 0,
         "field.jsonl:2: expected a string field 'text' (the field is missing)"},
        {"type.jsonl", "{\"text\": [1]}\n", 0,
         "type.jsonl:1: expected a string field 'text' (the field is not a string)"},
        {"trail.jsonl", "{\"text\": \"a\"} x\n", 0, "trail.jsonl:1: unexpected text after the JSON value"},
        {"array.jsonl", "[1, 2]\n", 0, "not a JSON object"},
        {"odd.bin", "abc", 3, "3 bytes is not a multiple of 2 (data.bin_dtype=uint16)"},
    };
    o.path = p;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(bad[i].name, bad[i].bytes, bad[i].len ? bad[i].len : strlen(bad[i].bytes));
        path(p, sizeof p, bad[i].name);
        HP_CHECK_ERR(hp_dataset_open(&o, &ds), HP_ERR_FORMAT, bad[i].needle);
    }
    write_text("empty.txt", "\n\n%\n\n");
    path(p, sizeof p, "empty.txt");
    o.text_separator = "percent";
    HP_CHECK_ERR(hp_dataset_open(&o, &ds), HP_ERR_FORMAT, "no documents found");
    o.text_separator = "commas";
    path(p, sizeof p, "corpus.txt");
    HP_CHECK_ERR(hp_dataset_open(&o, &ds), HP_ERR_INVALID_ARG, "text_separator 'commas'");
    o.text_separator = "percent";
    o.validation_fraction = 0.99;
    HP_CHECK_ERR(hp_dataset_open(&o, &ds), HP_ERR_INVALID_ARG, "leaves no training data");
    o.validation_fraction = 0;

    /* Ids outside the vocabulary: bin (BOS 256 with vocab 200) and encoder output. */
    path(p, sizeof p, "corpus.bin");
    HP_CHECK_OK(hp_dataset_open(&o, &ds));
    if (ds) {
        hp_dataloader_options_t lo = {HP_SPLIT_TRAIN, T, 1, 0, 1, true, 200};
        hp_dataloader_t dl = NULL;
        HP_CHECK_OK(hp_dataloader_create(ds, NULL, &lo, &dl));
        int32_t in[T], lab[T];
        bool got;
        if (dl) HP_CHECK_ERR(hp_dataloader_next(dl, in, lab, &got), HP_ERR_FORMAT, "token 0 has id 256, outside the vocabulary [0, 200)");
        hp_dataloader_destroy(dl);
        hp_dataloader_options_t big = {HP_SPLIT_TRAIN, 100000, 1, 0, 1, true, 0};
        HP_CHECK_ERR(hp_dataloader_create(ds, NULL, &big, &dl), HP_ERR_INVALID_ARG, "fewer than seq_len + 1 = 100001");
        hp_dataset_close(ds);
    }
    path(p, sizeof p, "corpus.txt");
    HP_CHECK_OK(hp_dataset_open(&o, &ds));
    if (ds) {
        hp_text_encoder_t enc = hp_text_encoder_bytes();
        hp_dataloader_options_t lo = {HP_SPLIT_TRAIN, T, 1, 0, 1, true, 100};
        hp_dataloader_t dl = NULL;
        HP_CHECK_ERR(hp_dataloader_create(ds, NULL, &lo, &dl), HP_ERR_INVALID_ARG, "needs a text encoder");
        HP_CHECK_OK(hp_dataloader_create(ds, &enc, &lo, &dl));
        int32_t in[T], lab[T];
        bool got;
        if (dl) HP_CHECK_ERR(hp_dataloader_next(dl, in, lab, &got), HP_ERR_INVALID_ARG, "corpus.txt:1; hint: the tokenizer");
        /* State blobs: garbage and another seq_len. */
        unsigned char blob[4096];
        size_t n;
        hp_dataloader_options_t lo2 = {HP_SPLIT_TRAIN, T + 1, 1, 0, 1, true, 0};
        hp_dataloader_t dl2 = NULL;
        HP_CHECK_OK(hp_dataloader_create(ds, &enc, &lo2, &dl2));
        if (dl && dl2) {
            HP_CHECK_OK(hp_dataloader_state_save(dl2, blob, sizeof blob, &n));
            HP_CHECK_ERR(hp_dataloader_state_load(dl, blob, n), HP_ERR_INVALID_ARG, "with seq_len 17");
            HP_CHECK_ERR(hp_dataloader_state_load(dl, "nonsense", 8), HP_ERR_FORMAT, "not a dataloader state");
            HP_CHECK_ERR(hp_dataloader_state_save(dl2, blob, 4, &n), HP_ERR_INVALID_ARG, "need");
            int32_t in2[T + 1], lab2[T + 1];
            HP_CHECK_OK(hp_dataloader_next(dl2, in2, lab2, &got));   /* leaves tokens in the buffer */
            HP_CHECK_OK(hp_dataloader_state_save(dl2, blob, sizeof blob, &n));
            HP_CHECK(n > 76, "buffered tokens in the state");
            HP_CHECK_ERR(hp_dataloader_state_load(dl2, blob, n - 1), HP_ERR_FORMAT, "corrupt");
        }
        hp_dataloader_destroy(dl);
        hp_dataloader_destroy(dl2);
        hp_dataset_close(ds);
    }
}

int main(int argc, char **argv) {
    hp_comm_t world = hp_test_mpi_init(&argc, &argv, &rank_, &world_);
    snprintf(dir_, sizeof dir_, "/tmp/hp_test_data_%d_%d", (int)getpid(), rank_);
    mkdir(dir_, 0755);
    make_docs();
    make_files();
    test_packing();
    test_restore("corpus.txt", "text");
    test_restore("corpus.jsonl", "jsonl");
    test_restore("corpus.bin", "bin");
    test_cross_rank_states(world);
    test_no_loop_and_validation();
    test_directory();
    test_errors();
    hp_test_remove_dir(dir_);
    return hp_test_mpi_finish("test_data");
}
