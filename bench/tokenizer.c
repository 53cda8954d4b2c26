/* Tokenizer encode speed on the multilingual sample of the HF goldens, one thread, for each
 * family's tokenizer (tests/data/tokenizer/hf): every sample encoded as one text (as a data
 * loader encodes documents), and the samples joined into 64 KiB documents. The HF side of
 * the same measurement: bench/tokenizer_hf.py; both in one run: tools/bench_tokenizer.sh.
 *   bench_tokenizer [--data tests/data/tokenizer/hf] [--reps 5] [family ...]
 * Prints one line per family and mode: MB/s of UTF-8 text and million tokens per second,
 * the best of --reps runs, each with a freshly loaded tokenizer (an empty word cache). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hyperparallel/status.h>
#include <hyperparallel/tokenizer.h>

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) *len = (size_t)n;
    return b;
}

int main(int argc, char **argv) {
    const char *data = "tests/data/tokenizer/hf";
    int reps = 5;
    const char *fams[16];
    int nf = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc) data = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (nf < 16) fams[nf++] = argv[i];
    }
    static const char *all[] = {"qwen2", "qwen3", "llama2", "mistral", "gemma", "llama3", "deepseek_v3"};
    if (nf == 0)
        for (nf = 0; nf < 7; nf++) fams[nf] = all[nf];
    char path[1200];
    snprintf(path, sizeof(path), "%s/samples.bin", data);
    size_t len;
    unsigned char *buf = slurp(path, &len);
    if (!buf || len < 12 || memcmp(buf, "HPTS", 4) != 0) {
        fprintf(stderr, "%s: cannot read the sample (run from the source tree or pass --data)\n", path);
        return 2;
    }
    uint32_t n;
    memcpy(&n, buf + 8, 4);
    const char **text = calloc(n, sizeof(char *));
    size_t *tlen = calloc(n, sizeof(size_t)), bytes = 0, off = 12;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t l;
        memcpy(&l, buf + off, 4);
        text[i] = (const char *)buf + off + 4;
        tlen[i] = l;
        bytes += l;
        off += 4 + l;
    }
    /* documents: the samples joined by "\n\n" into pieces of about 64 KiB */
    size_t nd = 0, cap = bytes + 2 * n + 1;
    char *docs = malloc(cap);
    size_t *doff = calloc(n + 1, sizeof(size_t)), dl = 0;
    doff[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        memcpy(docs + dl, text[i], tlen[i]);
        dl += tlen[i];
        memcpy(docs + dl, "\n\n", 2);
        dl += 2;
        if (dl - doff[nd] >= 65536 || i + 1 == n) doff[++nd] = dl;
    }
    printf("sample: %u texts, %zu bytes (%zu documents of ~64 KiB, %zu bytes)\n", n, bytes, nd, dl);
    printf("%-12s %-9s %9s %9s %8s\n", "family", "mode", "MB/s", "Mtok/s", "load s");
    for (int f = 0; f < nf; f++) {
        snprintf(path, sizeof(path), "%s/%s", data, fams[f]);
        double t0 = hp_clock_now_seconds();
        hp_tokenizer_t tok;
        if (hp_tokenizer_load_dir(&tok, path) != HP_OK) {
            fprintf(stderr, "%s\n", hp_last_error());
            return 1;
        }
        double load = hp_clock_now_seconds() - t0;
        hp_token_ids_t ids = {0};
        for (int mode = 0; mode < 2; mode++) {
            double best = 1e30;
            size_t ntok = 0;
            for (int r = 0; r < reps; r++) {
                /* a fresh tokenizer: its word cache starts empty (each sample is seen once) */
                hp_tokenizer_free(tok);
                if (hp_tokenizer_load_dir(&tok, path) != HP_OK) {
                    fprintf(stderr, "%s\n", hp_last_error());
                    return 1;
                }
                ntok = 0;
                t0 = hp_clock_now_seconds();
                size_t count = mode ? nd : n;
                for (size_t i = 0; i < count; i++) {
                    ids.len = 0;
                    const char *s = mode ? docs + doff[i] : text[i];
                    size_t l = mode ? doff[i + 1] - doff[i] : tlen[i];
                    if (hp_tokenizer_encode(tok, s, l, 0, &ids) != HP_OK) {
                        fprintf(stderr, "%s\n", hp_last_error());
                        return 1;
                    }
                    ntok += ids.len;
                }
                double dt = hp_clock_now_seconds() - t0;
                if (dt < best) best = dt;
            }
            double b = mode ? (double)dl : (double)bytes;
            printf("%-12s %-9s %9.2f %9.3f %8.3f\n", fams[f], mode ? "documents" : "samples",
                   b / best / 1e6, (double)ntok / best / 1e6, load);
        }
        hp_token_ids_free(&ids);
        hp_tokenizer_free(tok);
    }
    free(docs);
    free(doff);
    free(text);
    free(tlen);
    free(buf);
    return 0;
}
