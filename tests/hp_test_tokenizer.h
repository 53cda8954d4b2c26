/* The suite's tokenizers: byte-level BPE with the two Llama 3 specials, trained on n bytes
 * of '%'-separated text and written to path (tests that build a tokenizer share this). */
#ifndef HP_TEST_TOKENIZER_H
#define HP_TEST_TOKENIZER_H

#include <stdio.h>

#include "hyperparallel/tokenizer.h"

static inline void hp_test_train_tokenizer_vocab(const char *text, size_t n, int vocab, const char *path) {
    const char *special[] = {"<|begin_of_text|>", "<|end_of_text|>"};
    hp_tokenizer_train_options_t o = {0};
    o.vocab_size = vocab;
    o.special = special;
    o.n_special = 2;
    o.separator_line = "%";
    o.min_frequency = 2;
    const char *texts[1] = {text};
    HP_CHECK_OK(hp_tokenizer_train_texts(&o, texts, &n, 1, path));
}

/* The 320-token tokenizer most trainer tests use. */
static inline void hp_test_train_tokenizer(const char *text, size_t n, const char *path) {
    hp_test_train_tokenizer_vocab(text, n, 320, path);
}

/* A corpus of 300 short %-separated documents (four proverbs in a fixed pattern) and its
 * 300-token tokenizer under root: corpus = root/corpus.txt, tok = root/tokenizer.json. */
static inline void hp_test_short_corpus(const char *root, char *corpus, char *tok, size_t cap) {
    static const char *const sent[] = {"the quick brown fox jumps over the lazy dog", "all that glitters is not gold",
                                       "the early bird catches the worm", "actions speak louder than words"};
    snprintf(corpus, cap, "%s/corpus.txt", root);
    snprintf(tok, cap, "%s/tokenizer.json", root);
    static char text[1 << 16];
    size_t tl = 0;
    for (int d = 0; d < 300; d++)
        tl += (size_t)snprintf(text + tl, sizeof text - tl, "%s %s.\n%%\n", sent[(d * d + d / 5) % 4], sent[(d + 1) % 4]);
    FILE *f = fopen(corpus, "w");
    HP_ASSERT(f && fwrite(text, 1, tl, f) == tl);
    fclose(f);
    hp_test_train_tokenizer_vocab(text, tl, 300, tok);
}

#endif
