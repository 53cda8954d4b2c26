/* The measurement behind choosing utf8proc over ICU for the tokenizer's NFC / NFKC
 * (docs/dependencies.md): both libraries normalize the same texts (the HF golden sample,
 * decomposed with NFD so that every mark must be recomposed, and as it is), and the outputs
 * must agree. Not part of the build (ICU is not a dependency); run tools/nf_compare.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <utf8proc.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: nf_compare TEXTFILE [reps]\n");
        return 2;
    }
    int reps = argc > 2 ? atoi(argv[2]) : 20;
    FILE *f = fopen(argv[1], "rb");
    if (!f) return 2;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n);
    if (fread(text, 1, (size_t)n, f) != (size_t)n) return 2;
    fclose(f);
    /* the texts are separated by NUL bytes */
    UErrorCode e = U_ZERO_ERROR;
    const UNormalizer2 *icu_nfc = unorm2_getNFCInstance(&e), *icu_nfkc = unorm2_getNFKCInstance(&e);
    if (U_FAILURE(e)) return 1;
    printf("utf8proc %s (Unicode %s), ICU (u_getUnicodeVersion) ", utf8proc_version(), utf8proc_unicode_version());
    UVersionInfo uv;
    u_getUnicodeVersion(uv);
    printf("Unicode %d.%d; %ld bytes, %d reps\n", uv[0], uv[1], n, reps);
    for (int form = 0; form < 2; form++) {
        utf8proc_option_t opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE | (form ? UTF8PROC_COMPAT : 0);
        const UNormalizer2 *icu = form ? icu_nfkc : icu_nfc;
        size_t cap32 = (size_t)n * 4 + 16;
        int32_t *u32 = malloc(cap32 * sizeof(int32_t));
        UChar *u16 = malloc(((size_t)n * 2 + 16) * sizeof(UChar)), *o16 = malloc(((size_t)n * 8 + 16) * sizeof(UChar));
        char *o8 = malloc((size_t)n * 8 + 16);
        double best_u = 1e30, best_i = 1e30;
        size_t lu = 0, li = 0;
        char *ru = NULL;
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            utf8proc_ssize_t k = utf8proc_decompose_custom((const utf8proc_uint8_t *)text, n, u32,
                                                           (utf8proc_ssize_t)cap32, opt, NULL, NULL);
            k = utf8proc_reencode(u32, k, opt);
            double t1 = now();
            lu = (size_t)k;
            ru = (char *)u32;
            int32_t l16;
            e = U_ZERO_ERROR;
            u_strFromUTF8(u16, n * 2 + 16, &l16, text, (int32_t)n, &e);
            int32_t lo = unorm2_normalize(icu, u16, l16, o16, (int32_t)n * 8 + 16, &e);
            int32_t l8;
            u_strToUTF8(o8, (int32_t)n * 8 + 16, &l8, o16, lo, &e);
            double t2 = now();
            if (U_FAILURE(e)) return 1;
            li = (size_t)l8;
            if (t1 - t0 < best_u) best_u = t1 - t0;
            if (t2 - t1 < best_i) best_i = t2 - t1;
        }
        int same = lu == li && memcmp(ru, o8, lu) == 0;
        printf("%s: utf8proc %.1f MB/s, ICU (with UTF-16 conversion) %.1f MB/s, outputs %s\n",
               form ? "NFKC" : "NFC", (double)n / best_u / 1e6, (double)n / best_i / 1e6,
               same ? "identical" : "DIFFER");
        free(u32);
        free(u16);
        free(o16);
        free(o8);
    }
    free(text);
    return 0;
}
