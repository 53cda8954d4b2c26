/* hp-tokenizer: train a byte-level BPE tokenizer.json from text files, and encode / decode
 * with any supported tokenizer.json. docs/tokenizer.md. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/file.h"
#include "hyperparallel/model.h"
#include "hyperparallel/parse.h"
#include "hyperparallel/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage:\n"
            "  hp-tokenizer train --vocab-size N --output tokenizer.json\n"
            "                     [--special \"<|begin_of_text|>,<|end_of_text|>\"]\n"
            "                     [--separator %%] [--jsonl-field text] [--min-frequency K]\n"
            "                     [--quiet] FILES...\n"
            "      byte-level BPE (GPT-2 regex); with special tokens the first is BOS, the\n"
            "      second EOS; --separator drops lines equal to it (fortune files: %%);\n"
            "      --jsonl-field reads JSONL files and trains on that string field\n"
            "  hp-tokenizer encode --tokenizer tokenizer.json [--add-special] [--bos] [--eos]\n"
            "                      [--special-as-text] [--text STRING | FILE]\n"
            "      prints ids separated by spaces; --special-as-text encodes special tokens\n"
            "      written in the text as ordinary text\n"
            "  hp-tokenizer decode --tokenizer tokenizer.json [--skip-special] [IDS...]\n"
            "      ids from the arguments, or from stdin when none are given\n"
            "  hp-tokenizer info --tokenizer tokenizer.json\n"
            "  --tokenizer also takes a Hugging Face model folder (tokenizer.json, and\n"
            "  tokenizer_config.json for BOS / EOS / pad, add_bos_token, the chat template)\n");
}

static int fail(const char *what, hp_status_t st) {
    fprintf(stderr, "hp-tokenizer %s: %s: %s\n", what, hp_status_string(st), hp_last_error());
    return 1;
}

static int cmd_train(int argc, char **argv) {
    hp_tokenizer_train_options_t o = {0};
    const char *out = NULL, *special = NULL;
    const char **files = calloc((size_t)argc + 1, sizeof(char *));
    size_t nf = 0;
    o.verbose = 1;
    static const char *const flags[] = {"--vocab-size", "--output", "--special", "--separator", "--jsonl-field",
                                        "--min-frequency", "--quiet"};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        hp_status_t s = HP_OK;
        int r;
        if ((r = hp_flag_value("hp-tokenizer train", argc, argv, &i, "--vocab-size", &v)) > 0)
            s = hp_parse_i32("hp-tokenizer train: --vocab-size", v, 1, HP_MODEL_MAX_VOCAB,
                             "ids including the 256 bytes and the special tokens, e.g. 2048; at most 2^24",
                             &o.vocab_size);
        else if (!r && (r = hp_flag_value("hp-tokenizer train", argc, argv, &i, "--output", &v)) > 0) out = v;
        else if (!r && (r = hp_flag_value("hp-tokenizer train", argc, argv, &i, "--special", &v)) > 0) special = v;
        else if (!r && (r = hp_flag_value("hp-tokenizer train", argc, argv, &i, "--separator", &v)) > 0)
            o.separator_line = v;
        else if (!r && (r = hp_flag_value("hp-tokenizer train", argc, argv, &i, "--jsonl-field", &v)) > 0)
            o.jsonl_field = v;
        else if (!r && (r = hp_flag_value("hp-tokenizer train", argc, argv, &i, "--min-frequency", &v)) > 0)
            s = hp_parse_i64("hp-tokenizer train: --min-frequency", v, 0, INT64_MAX,
                             "how often a pair must occur to be merged, e.g. 2", &o.min_frequency);
        else if (!r && !strcmp(a, "--quiet"))
            o.verbose = 0;
        else if (!r && a[0] == '-' && a[1] == '-')
            s = hp_flag_unknown_error("hp-tokenizer train", a, flags, sizeof flags / sizeof flags[0]);
        else if (!r)
            files[nf++] = a;
        if (r < 0 || s != HP_OK) {
            fprintf(stderr, "%s\n", hp_last_error());
            usage(stderr);
            free(files);
            return 2;
        }
    }
    if (!out || o.vocab_size == 0 || nf == 0) {
        fprintf(stderr, "hp-tokenizer train: needs --vocab-size, --output and at least one file\n");
        usage(stderr);
        free(files);
        return 2;
    }
    char *list = special ? strdup(special) : NULL;
    const char *sp[256];
    if (list) {
        for (char *tok = strtok(list, ","); tok && o.n_special < 256; tok = strtok(NULL, ","))
            if (*tok) sp[o.n_special++] = tok;
        o.special = sp;
    }
    hp_status_t st = hp_tokenizer_train(&o, files, nf, out);
    free(list);
    free(files);
    if (st != HP_OK) return fail("train", st);
    return 0;
}

static int cmd_encode(int argc, char **argv) {
    const char *path = NULL, *text = NULL, *file = NULL;
    unsigned flags = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--tokenizer") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(a, "--text") && i + 1 < argc) text = argv[++i];
        else if (!strcmp(a, "--add-special")) flags |= HP_TOKENIZE_ADD_SPECIAL;
        else if (!strcmp(a, "--bos")) flags |= HP_TOKENIZE_ADD_BOS;
        else if (!strcmp(a, "--eos")) flags |= HP_TOKENIZE_ADD_EOS;
        else if (!strcmp(a, "--special-as-text")) flags |= HP_TOKENIZE_SPECIAL_AS_TEXT;
        else if (a[0] != '-' && !file) file = a;
        else if (a[0] == '-' && a[1] == '-') {
            static const char *const flags[] = {"--tokenizer", "--text", "--add-special", "--bos", "--eos",
                                                "--special-as-text"};
            hp_flag_unknown_error("hp-tokenizer encode", a, flags, sizeof flags / sizeof flags[0]);
            fprintf(stderr, "%s\n", hp_last_error());
            usage(stderr);
            return 2;
        } else {
            fprintf(stderr, "hp-tokenizer encode: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "hp-tokenizer encode: needs --tokenizer\n");
        return 2;
    }
    hp_tokenizer_t tok;
    hp_status_t st = hp_tokenizer_load(&tok, path);
    if (st != HP_OK) return fail("encode", st);
    char *buf = NULL;
    size_t len = 0;
    if (text) {
        len = strlen(text);
    } else {
        st = file ? hp_file_read_all(file, "text file", SIZE_MAX, &buf, &len)
                  : hp_file_read_stream(stdin, "stdin", "text", SIZE_MAX, &buf, &len);
        if (st != HP_OK) {
            hp_tokenizer_free(tok);
            return fail("encode", st);
        }
        text = buf;
    }
    hp_token_ids_t ids = {0};
    st = hp_tokenizer_encode(tok, text, len, flags, &ids);
    if (st == HP_OK) {
        for (size_t i = 0; i < ids.len; i++) printf(i ? " %d" : "%d", ids.ids[i]);
        printf("\n");
    }
    hp_token_ids_free(&ids);
    free(buf);
    hp_tokenizer_free(tok);
    return st == HP_OK ? 0 : fail("encode", st);
}

/* One id of the decode input: strtoll with full checks (the whole text is a base-10 number
 * that fits in 64 bits); the vocabulary range is checked once the tokenizer is loaded. */
static int parse_id(const char *text, const char *where, long long *v) {
    char *end;
    errno = 0;
    *v = strtoll(text, &end, 10);
    if (end == text || *end) {
        fprintf(stderr, "hp-tokenizer decode: %s: '%s' is not an id (expected a non-negative "
                "integer token id; ids are separated by spaces or newlines)\n", where, text);
        return 0;
    }
    if (errno == ERANGE) {
        fprintf(stderr, "hp-tokenizer decode: %s: id '%s' is out of range (expected 0 <= id < "
                "the vocabulary size)\n", where, text);
        return 0;
    }
    return 1;
}

/* Appends an id and where it came from (for the range error after loading). */
static int push_id(long long **ids, long **pos, size_t *n, size_t *cap, long long v, long p) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 1024;
        long long *a = realloc(*ids, c * sizeof(**ids));
        if (!a) return 0;
        *ids = a;
        long *b = realloc(*pos, c * sizeof(**pos));
        if (!b) return 0;
        *pos = b;
        *cap = c;
    }
    (*ids)[*n] = v;
    (*pos)[(*n)++] = p;
    return 1;
}

static int cmd_decode(int argc, char **argv) {
    const char *path = NULL;
    unsigned flags = 0;
    long long *ids = NULL; /* as parsed: range-checked below */
    long *pos = NULL;      /* argument index (from_args) or stdin line of each id */
    size_t n = 0, cap = 0;
    int from_args = 0, rc = 2;
    char where[64];
    char *input = NULL;
    int32_t *ids32 = NULL;
    hp_tokenizer_t tok = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            path = argv[++i];
        } else if (!strcmp(a, "--skip-special")) {
            flags |= HP_DETOKENIZE_SKIP_SPECIAL;
        } else if (a[0] == '-' && a[1] == '-') {
            static const char *const known[] = {"--tokenizer", "--skip-special"};
            hp_flag_unknown_error("hp-tokenizer decode", a, known, sizeof known / sizeof known[0]);
            fprintf(stderr, "%s\n", hp_last_error());
            free(ids);
            return 2;
        } else {
            long long v;
            /* numbered as on the command line: 0 is the program, 1 is "decode" */
            snprintf(where, sizeof(where), "argument %d", i + 2);
            if (!parse_id(a, where, &v)) goto done;
            if (!push_id(&ids, &pos, &n, &cap, v, i + 2)) goto oom;
            from_args = 1;
        }
    }
    if (!path) {
        fprintf(stderr, "hp-tokenizer decode: needs --tokenizer\n");
        goto done;
    }
    if (!from_args) {
        size_t len;
        hp_status_t rs = hp_file_read_stream(stdin, "stdin", "token ids", SIZE_MAX, &input, &len);
        if (rs != HP_OK) {
            rc = fail("decode", rs);
            goto done;
        }
        long line = 1;
        for (size_t i = 0; i < len;) {
            if (input[i] && strchr(" \t\r\n", input[i])) {
                line += input[i++] == '\n';
                continue;
            }
            size_t j = i;
            while (j < len && !(input[j] && strchr(" \t\r\n", input[j]))) j++;
            char c = input[j];
            input[j] = 0;
            /* a NUL byte inside the item makes it bad text, not a shorter number */
            for (size_t k = i; k < j; k++) input[k] = input[k] ? input[k] : '?';
            snprintf(where, sizeof(where), "stdin line %ld", line);
            long long v;
            if (!parse_id(input + i, where, &v)) goto done;
            if (!push_id(&ids, &pos, &n, &cap, v, line)) goto oom;
            input[j] = c;
            i = j;
        }
    }
    hp_status_t st = hp_tokenizer_load(&tok, path);
    if (st != HP_OK) {
        rc = fail("decode", st);
        goto done;
    }
    int32_t vocab = hp_tokenizer_vocab_size(tok);
    ids32 = malloc((n + 1) * sizeof(int32_t));
    if (!ids32) goto oom;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab) {
            fprintf(stderr, "hp-tokenizer decode: %s %ld: id %lld is outside the vocabulary of "
                    "%s (expected 0 <= id < %d)\n", from_args ? "argument" : "stdin line",
                    pos[i], ids[i], path, vocab);
            goto done;
        }
        ids32[i] = (int32_t)ids[i];
    }
    char *text;
    size_t len;
    st = hp_tokenizer_decode(tok, ids32, n, flags, &text, &len);
    if (st == HP_OK) {
        fwrite(text, 1, len, stdout);
        free(text);
        rc = 0;
    } else {
        rc = fail("decode", st);
    }
    goto done;
oom:
    fprintf(stderr, "hp-tokenizer decode: out of memory reading the ids\n");
    rc = 1;
done:
    free(ids);
    free(pos);
    free(ids32);
    free(input);
    if (tok) hp_tokenizer_free(tok);
    return rc;
}

static int cmd_info(int argc, char **argv) {
    if (argc != 2 || strcmp(argv[0], "--tokenizer") != 0) {
        static const char *const known[] = {"--tokenizer"};
        for (int i = 0; i < argc; i++)
            if (!strncmp(argv[i], "--", 2) && strcmp(argv[i], "--tokenizer") != 0) {
                hp_flag_unknown_error("hp-tokenizer info", argv[i], known, 1);
                fprintf(stderr, "%s\n", hp_last_error());
                break;
            }
        usage(stderr);
        return 2;
    }
    hp_tokenizer_t tok;
    hp_status_t st = hp_tokenizer_load(&tok, argv[1]);
    if (st != HP_OK) return fail("info", st);
    int32_t bos = hp_tokenizer_bos_id(tok), eos = hp_tokenizer_eos_id(tok), pad = hp_tokenizer_pad_id(tok);
    printf("vocab_size %d\nbos %d %s\neos %d %s\n", hp_tokenizer_vocab_size(tok), bos,
           bos >= 0 ? hp_tokenizer_id_to_token(tok, bos) : "-", eos,
           eos >= 0 ? hp_tokenizer_id_to_token(tok, eos) : "-");
    /* from tokenizer_config.json when the argument is a model folder */
    unsigned fl = hp_tokenizer_config_flags(tok);
    const char *ct = hp_tokenizer_chat_template(tok, NULL);
    size_t n_special = 0;
    for (size_t i = 0; i < hp_tokenizer_added_count(tok); i++)
        n_special += hp_tokenizer_is_special(tok, hp_tokenizer_added_id(tok, i)) != 0;
    printf("pad %d %s\nadd_bos_token %s\nadd_eos_token %s\nadded_tokens %zu (%zu special)\n"
           "chat_template %s\n",
           pad, pad >= 0 ? hp_tokenizer_id_to_token(tok, pad) : "-",
           fl & HP_TOKENIZE_ADD_BOS ? "true" : "false", fl & HP_TOKENIZE_ADD_EOS ? "true" : "false",
           hp_tokenizer_added_count(tok), n_special, ct ? "yes" : "none");
    hp_tokenizer_free(tok);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "train")) return cmd_train(argc - 2, argv + 2);
    if (!strcmp(argv[1], "encode")) return cmd_encode(argc - 2, argv + 2);
    if (!strcmp(argv[1], "decode")) return cmd_decode(argc - 2, argv + 2);
    if (!strcmp(argv[1], "info")) return cmd_info(argc - 2, argv + 2);
    fprintf(stderr, "hp-tokenizer: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
