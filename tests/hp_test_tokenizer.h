/* The suite's tokenizers: byte-level BPE with the two Llama 3 specials, trained on n bytes
 * of '%'-separated text and written to path (tests that build a tokenizer share this). */
#ifndef HP_TEST_TOKENIZER_H
#define HP_TEST_TOKENIZER_H

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

#endif
