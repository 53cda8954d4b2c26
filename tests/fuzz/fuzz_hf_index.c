/* libFuzzer target for the HF index parser (model.safetensors.index.json): any byte string is
 * offered to hp_hf_index_parse; a rejected input must carry a message, an accepted one must
 * give plain shard file names and names findable through the index.
 * Not a ctest program (no test_ prefix); docs/checkpoint.md gives the clang build line. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hp_hf_index_t ix = NULL;
    if (hp_hf_index_parse((const char *)data, size, "fuzz", &ix) != HP_OK) {
        if (hp_last_error()[0] == '\0') abort();
        return 0;
    }
    if (hp_hf_index_count(ix) < 1 || hp_hf_index_n_files(ix) < 1) abort();
    for (int i = 0; i < hp_hf_index_n_files(ix); i++) {
        const char *f = hp_hf_index_file(ix, i);
        if (!f || !f[0] || f[0] == '.' || strchr(f, '/')) abort();
    }
    for (int i = 0; i < hp_hf_index_count(ix); i++) {
        const char *name, *file;
        hp_hf_index_at(ix, i, &name, &file);
        const char *g = hp_hf_index_find(ix, name);
        if (!g || strcmp(g, file)) abort();
    }
    hp_hf_index_free(ix);
    return 0;
}
