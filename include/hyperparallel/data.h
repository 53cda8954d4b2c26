/* hp_dataset / hp_dataloader: training text as token windows, with TorchTitan's
 * (v0.2.2 HuggingFaceTextDataset) semantics: every document is encoded with BOS and EOS and
 * appended to a token buffer; windows of seq_len + 1 tokens are cut from its front (no
 * overlap), giving input = w[:-1] and labels = w[1:]. Documents are split contiguously across
 * data-parallel ranks (as HF split_dataset_by_node for map-style data); a rank's shard can
 * loop forever. The state (position, epoch, leftover buffer) is a small blob that restores
 * the exact next batches. Sources: plain text (documents separated by blank lines, '%' lines
 * as in fortune files, or one per line), JSONL with a string field, and pre-tokenized
 * little-endian uint16/uint32 files (memory-mapped). The tokenizer is reached through a
 * callback (hp_text_encoder_t) so this module does not depend on its internals.
 * SFT data (format chat): JSONL conversations rendered with a chat template
 * (chat_template.h), labels -100 except on assistant tokens, whole samples packed into rows
 * with their boundaries recorded (hp_dataloader_next_docs).
 * Details and the file rules: docs/data.md, docs/finetune.md. */
#ifndef HYPERPARALLEL_DATA_H
#define HYPERPARALLEL_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "config.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Encodes `len` bytes of text into token ids (without BOS/EOS; the data layer adds them).
 * Writes min(n, cap) ids to ids[] and sets *n_ids = n, the full count; when n > cap the
 * caller grows the buffer and calls again with the same text. */
typedef hp_status_t (*hp_encode_fn)(void *ctx, const char *text, size_t len, int32_t *ids, size_t cap,
                                    size_t *n_ids);

typedef struct hp_text_encoder {
    hp_encode_fn encode;
    void *ctx;
    int32_t bos_id;   /* prepended to every document; -1 = none */
    int32_t eos_id;   /* appended to every document; -1 = none */
} hp_text_encoder_t;

/* Trivial byte-level encoder: id = byte value (0..255), BOS = 256, EOS = 257 (vocab 258).
 * For tests and for running without a trained tokenizer. */
hp_text_encoder_t hp_text_encoder_bytes(void);

typedef enum hp_data_split { HP_SPLIT_TRAIN = 0, HP_SPLIT_VALIDATION = 1 } hp_data_split_t;

/* The label of a position no loss counts (the loss's HP_IGNORE_INDEX). */
#define HP_SFT_IGNORE (-100)

typedef struct hp_chat_template *hp_chat_template_t;   /* chat_template.h */
/* data.sft_truncation: a sample longer than seq_len + 1 tokens */
typedef enum hp_sft_truncation {
    HP_SFT_TRUNCATE = 0,   /* keep its first seq_len + 1 tokens */
    HP_SFT_DROP,           /* skip it */
    HP_SFT_ERROR,          /* stop, naming its file and line */
} hp_sft_truncation_t;
/* SFT (chat format) options of a loader. */
typedef struct hp_sft_options {
    hp_chat_template_t chat_template;   /* must outlive the loader */
    int32_t pad_id;                     /* input id of padding positions (their labels are -100) */
    bool pack;                          /* several samples per row (else one, padded) */
    hp_sft_truncation_t truncation;
} hp_sft_options_t;

typedef struct hp_dataset_options {
    const char *path;             /* a file, or (text/jsonl) a directory: see docs/data.md */
    const char *format;           /* "auto" | "text" | "jsonl" | "bin" | "chat" (alias "sft"); NULL = auto */
    const char *text_separator;   /* "blank_line" | "percent" | "line"; NULL = blank_line */
    const char *jsonl_field;      /* NULL = "text" */
    const char *bin_dtype;        /* "uint16" | "uint32"; NULL = uint16 */
    double validation_fraction;   /* last fraction of documents (tokens for bin), [0, 1) */
} hp_dataset_options_t;

/* Options pointing into cfg->data (cfg must outlive the options). */
hp_dataset_options_t hp_dataset_options_from_config(const hp_config_t *cfg);

typedef struct hp_dataset *hp_dataset_t;
typedef struct hp_dataloader *hp_dataloader_t;

/* Opens, maps and indexes the data (and, for JSONL, checks every line). Errors name the
 * file (and line for JSONL, byte offset for text): missing file, NUL bytes in a text file,
 * invalid JSON, a missing or non-string field, a binary size that is not a multiple of the
 * id width, no documents at all. */
hp_status_t hp_dataset_open(const hp_dataset_options_t *opts, hp_dataset_t *out);
void hp_dataset_close(hp_dataset_t ds);
/* Documents in a split (tokens for bin). */
int64_t hp_dataset_num_documents(hp_dataset_t ds, hp_data_split_t split);
/* Number of files read (a directory gives several). */
int hp_dataset_num_files(hp_dataset_t ds);
/* "text" | "jsonl" | "bin" | "chat" (after auto detection). */
const char *hp_dataset_format(hp_dataset_t ds);
/* Text of document i of a split (text and jsonl only). The pointer stays valid until the
 * next call on the same dataset or its close; JSON escapes are decoded. */
hp_status_t hp_dataset_document(hp_dataset_t ds, hp_data_split_t split, int64_t i, const char **text,
                                size_t *len);

typedef struct hp_dataloader_options {
    hp_data_split_t split;
    int64_t seq_len;      /* T: a window holds T + 1 tokens */
    int64_t batch_size;   /* B rows per hp_dataloader_next */
    int dp_rank;          /* this rank's coordinate on the batch mesh */
    int dp_world;         /* size of the batch mesh */
    bool loop;            /* restart the shard when exhausted (an epoch) */
    int64_t vocab_size;   /* > 0: ids (bin files and encoder output) must be below it */
} hp_dataloader_options_t;

/* The dataset must outlive the loader; several loaders may share one dataset but the
 * loaders of one dataset must be used from one thread. The encoder is copied; text and
 * jsonl need one (bin files ignore it). */
hp_status_t hp_dataloader_create(hp_dataset_t ds, const hp_text_encoder_t *enc, const hp_dataloader_options_t *opts,
                                 hp_dataloader_t *out);
/* The same with the SFT options chat data needs (sft may be NULL for other formats; it is
 * copied, its template must outlive the loader). */
hp_status_t hp_dataloader_create_sft(hp_dataset_t ds, const hp_text_encoder_t *enc, const hp_dataloader_options_t *opts,
                                     const hp_sft_options_t *sft, hp_dataloader_t *out);
void hp_dataloader_destroy(hp_dataloader_t dl);
/* Fills the next batch: inputs (B, T) and labels (B, T), row-major, labels[b][t] =
 * window[b][t+1]. *got = false when a non-looping loader has no further full batch (the
 * partial batch is dropped); the buffers' contents are then unspecified. */
hp_status_t hp_dataloader_next(hp_dataloader_t dl, int32_t *inputs, int32_t *labels, bool *got);
/* The same, and positions (B, T): each token's index within its document (0 where a packed
 * sample starts; padding counts from 0 as one more document), for a document mask. Chat data
 * only (pretraining windows carry no boundaries: HP_ERR_UNSUPPORTED); positions may be NULL. */
hp_status_t hp_dataloader_next_docs(hp_dataloader_t dl, int32_t *inputs, int32_t *labels, int32_t *positions,
                                    bool *got);
/* Back to the start of the shard with an empty buffer (e.g. before each validation pass). */
void hp_dataloader_reset(hp_dataloader_t dl);
int64_t hp_dataloader_epoch(hp_dataloader_t dl);          /* completed passes over the shard */
int64_t hp_dataloader_samples(hp_dataloader_t dl);        /* windows yielded so far */
int64_t hp_dataloader_shard_documents(hp_dataloader_t dl);   /* documents (tokens for bin) of this rank */

/* State: little-endian blob with magic "HPDL", version, split, dp rank and world, seq_len,
 * document count of the split, position, epoch, samples and the leftover token buffer (and,
 * version 2, the carried ranges of a resharded resume, below). hp_dataloader_state_size is the
 * exact size of the blob save would write now. Loading refuses a blob from another dp rank or
 * world, another seq_len, split or dataset size. */
size_t hp_dataloader_state_size(hp_dataloader_t dl);
hp_status_t hp_dataloader_state_save(hp_dataloader_t dl, void *buf, size_t cap, size_t *n);
hp_status_t hp_dataloader_state_load(hp_dataloader_t dl, const void *buf, size_t n);
/* The dp rank and world a state blob was saved by. */
hp_status_t hp_dataloader_state_peek(const void *buf, size_t n, int *dp_rank, int *dp_world);
/* Resume with another data-parallel degree (an elastic restart on fewer hosts; TorchTitan
 * refuses it). blobs[r] / sizes[r]: the state of old dp rank r of n_old. The rule, so that no
 * window of an interrupted pass is repeated or skipped: every old rank's pass is finished by
 * exactly one new rank, dp rank q taking old ranks q, q + Q, q + 2Q, ... (Q the new degree):
 * first their leftover buffered tokens (in that order), then the documents (tokens for bin)
 * of their shards they had not read yet, range by range (a range's tail shorter than a window
 * is skipped for bin, as the old rank would have). Then each new rank starts a fresh pass
 * over its own shard of the new degree, numbered one past the highest old epoch (so does a
 * rank that took no old rank). samples = the sum over the old ranks it took. Not looping: the
 * loader ends after the carried ranges. The carried ranges are part of the state (version 2),
 * so a resharded run can itself be checkpointed and resharded again. docs/data.md. */
hp_status_t hp_dataloader_state_reshard(hp_dataloader_t dl, const void *const *blobs, const size_t *sizes, int n_old);

#ifdef __cplusplus
}
#endif
#endif
