/* Distributed checkpoint (torch.distributed.checkpoint in C): save, async save and load of
 * named DTensors and small byte blobs with resharding on load, atomic commit by rename,
 * retention, and HF import/export through a model family's state-dict adapter. The checkpoint
 * layer sees a state only as a list of named entries (hp_dcp_state_t); what they mean (model,
 * optimizer, LR schedule, data loader, RNG, step) is the train layer's business
 * (ckpt_manager.h). Layout of a checkpoint:
 *   step-N/__{rank}_0.safetensors   one file per rank holding the chunks that rank owns
 *   step-N/metadata.json            written last by rank 0: magic "hyperparallel-dcp",
 *                                   version, per tensor dtype, global shape and chunk boxes
 *                                   (offsets, sizes, file, key); per blob its chunks.
 * See docs/checkpoint.md. */
#ifndef HYPERPARALLEL_CHECKPOINT_H
#define HYPERPARALLEL_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include "comm.h"
#include "dtensor.h"
#include "model.h"
#include "param.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_DCP_MAGIC "hyperparallel-dcp"
#define HP_DCP_VERSION 1
#define HP_DCP_METADATA_FILE "metadata.json"

/* One tensor of a state: a DTensor (mesh NULL = a plain tensor held whole by every rank).
 * Save: `store_dtype` >= 0 stores the values converted to that dtype (float only, e.g. the
 * bf16 export); -1 stores the tensor's own dtype. Load: fills t->local in place. */
typedef struct hp_dcp_tensor {
    const char *name;
    hp_dtensor_t *t;
    int store_dtype;         /* hp_dtype_t or -1 */
    int loaded;              /* load: set to 1 when the tensor was found and read */
} hp_dcp_tensor_t;

/* A small byte blob (dataloader state, train state, RNG). per_rank = 0: the same on every
 * rank, written once by rank 0, loaded by every rank. per_rank = 1: every rank has its own;
 * loading needs the same world size (as TorchTitan's dataloader state). Load: `data` has
 * `capacity` bytes; `size` receives the stored size. */
typedef struct hp_dcp_blob {
    const char *name;
    void *data;
    size_t size;
    size_t capacity;
    int per_rank;
    int loaded;
} hp_dcp_blob_t;

/* The state dict: every entry of a save or load, by name. The caller assembles it (the
 * trainer's checkpoint manager: parameters, "optimizer.<fqn>.<slot>" state, "lr_scheduler",
 * "dataloader", "train_state"); entries are kept by pointer for the call. */
typedef struct hp_dcp_state {
    hp_dcp_tensor_t *tensors;
    int n_tensors;
    hp_dcp_blob_t *blobs;
    int n_blobs;
} hp_dcp_state_t;

/* --- save ------------------------------------------------------------------------------
 * Collective over `comm` (NULL = a single process). `dir` is the final directory
 * ("run/checkpoint/step-5"); data is written to "<dir>.tmp-<token>/", fsync'd, every rank
 * agrees, rank 0 writes metadata.json last, fsyncs, renames the directory to `dir` and
 * fsyncs the parent. A replicated chunk is written once, by the lowest rank holding it.
 * Partial placements are refused (reduce first); StridedShard layouts that are not one box
 * per rank are refused. The returned status is the same on every rank. */
hp_status_t hp_dcp_save(const char *dir, const hp_dcp_state_t *st, hp_comm_t comm);

/* Async save: hp_dcp_saver_save copies this rank's owned chunks into the saver's staging
 * buffer (grown once, then reused) and writes them in a background thread; the caller
 * continues. The background thread does only file I/O; the cross-rank agreement and the
 * commit run on the calling thread in hp_dcp_saver_poll (commits when every rank has
 * finished writing; call it at the same points on every rank, e.g. once per step) or
 * hp_dcp_saver_wait (blocks). A second save first waits for the first. All collective. */
typedef struct hp_dcp_saver *hp_dcp_saver_t;
hp_status_t hp_dcp_saver_create(hp_comm_t comm, hp_dcp_saver_t *out);
hp_status_t hp_dcp_saver_save(hp_dcp_saver_t s, const char *dir, const hp_dcp_state_t *st);
/* *committed = 1 when a pending save was committed by this call (0 otherwise). */
hp_status_t hp_dcp_saver_poll(hp_dcp_saver_t s, int *committed);
hp_status_t hp_dcp_saver_wait(hp_dcp_saver_t s);
int hp_dcp_saver_pending(hp_dcp_saver_t s);
size_t hp_dcp_saver_staging_bytes(hp_dcp_saver_t s);
/* Waits for a pending save (collective), then frees. */
hp_status_t hp_dcp_saver_destroy(hp_dcp_saver_t s);

/* --- load ------------------------------------------------------------------------------
 * Reads, for each rank's target box, only the saved chunks that intersect it (any change of
 * mesh, placements or world size). strict: a requested name missing from the checkpoint or
 * a checkpoint name not requested is an error listing the names; non-strict: missing
 * entries are skipped (loaded = 0) and extra ones ignored. Global shapes must match; dtypes
 * must match unless allow_convert (float <-> float with round-to-nearest-even). `exclude`
 * (n_exclude prefixes) names entries neither loaded nor counted as unexpected. Collective
 * over comm when comm != NULL (the status is agreed). */
typedef struct hp_dcp_load_options {
    int strict;
    int allow_convert;
    const char *const *exclude;
    int n_exclude;
    /* 0 (default): every chunk that has a recorded checksum is read whole and verified
     * (XXH3-64); a mismatch is HP_ERR_FORMAT naming the file and tensor. 1: skip the check
     * (checkpoint.verify_checksums = false). Chunks without a checksum load unverified. */
    int skip_checksums;
} hp_dcp_load_options_t;
hp_status_t hp_dcp_load(const char *dir, hp_dcp_state_t *st, hp_comm_t comm,
                        const hp_dcp_load_options_t *opt);

/* --- metadata --------------------------------------------------------------------------- */
typedef struct hp_dcp_chunk {
    int64_t offsets[HP_MAX_DIMS];
    int64_t sizes[HP_MAX_DIMS];
    const char *file;        /* relative file name inside the checkpoint directory */
    const char *key;         /* tensor name inside that safetensors file */
    int rank;                /* blobs: the saving rank; tensors: the writer rank */
    int has_xxh3;            /* 1 when the metadata records the chunk's checksum ("xxh3");
                              * checkpoints written before checksums have none */
    uint64_t xxh3;           /* XXH3-64 of the chunk's stored bytes (its safetensors data) */
} hp_dcp_chunk_t;

typedef struct hp_dcp_entry {
    const char *name;
    int is_blob;
    int per_rank;            /* blobs */
    hp_dtype_t dtype;        /* tensors */
    int ndim;
    int64_t shape[HP_MAX_DIMS];
    int n_chunks;
    const hp_dcp_chunk_t *chunks;
} hp_dcp_entry_t;

typedef struct hp_dcp_metadata *hp_dcp_metadata_t;
/* Parses and validates a metadata document (bounds, overlaps, coverage, safe file names);
 * never crashes on hostile input (fuzz target tests/fuzz/fuzz_dcp_metadata.c). */
hp_status_t hp_dcp_metadata_parse(const char *json, size_t len, const char *what,
                                  hp_dcp_metadata_t *out);
hp_status_t hp_dcp_metadata_read(const char *dir, hp_dcp_metadata_t *out);
void hp_dcp_metadata_free(hp_dcp_metadata_t md);
int hp_dcp_metadata_count(hp_dcp_metadata_t md);
const hp_dcp_entry_t *hp_dcp_metadata_entry(hp_dcp_metadata_t md, int i);
const hp_dcp_entry_t *hp_dcp_metadata_find(hp_dcp_metadata_t md, const char *name);
int hp_dcp_metadata_world_size(hp_dcp_metadata_t md);
int64_t hp_dcp_metadata_step(hp_dcp_metadata_t md);   /* -1 when not recorded */

/* Committed checkpoints step-N/ (with metadata.json) under `folder`, ascending; directories
 * that look like checkpoints but are partial (step-N.tmp-*, step-N/ without metadata) are
 * skipped with a warning. *n receives the count; steps gets up to cap of them, the newest when there are more. A missing folder has
 * none. */
hp_status_t hp_dcp_list_steps(const char *folder, int64_t *steps, int cap, int *n);

/* Integrity of a committed step directory (dcp_verify.c): metadata.json parses; every file
 * it names exists and is at least as long as its safetensors header says (8 + header
 * length + the end of its data section); it holds every chunk key with the byte size the
 * metadata implies; and, when `checksums`, every recorded chunk checksum matches (this reads
 * all data; otherwise only headers are read). HP_OK, or HP_ERR_FORMAT / HP_ERR_IO with a
 * message naming the file (and tensor) with the expected and actual size or checksum. */
hp_status_t hp_dcp_verify(const char *dir, int checksums);
/* Reads saved rank `saved_rank`'s copy of the per-rank blob `name` (a data loader's state) into
 * buf[cap]; *size = its bytes. For state that is resharded by its owner when the world size
 * changed (every new rank may read any old rank's blob). Checks the recorded checksum when
 * `verify`. Local (no communication). */
hp_status_t hp_dcp_load_rank_blob(const char *dir, const char *name, int saved_rank, void *buf, size_t cap,
                                  size_t *size, int verify);
/* The newest step-N under `folder` that passes hp_dcp_verify (sizes only). Each newer step
 * that fails is reported with a warning naming what is wrong (and left in place: nothing
 * saved is deleted). *step = -1 when no step is complete (*n_bad counts the failing ones;
 * may be NULL). Local (no communication). */
hp_status_t hp_dcp_latest_complete(const char *folder, int64_t *step, int *n_bad);

/* Interruption (SIGTERM / SIGINT). A program's signal handler calls hp_dcp_interrupt(sig),
 * which only stores the number (async-signal-safe). A save that finds any rank interrupted
 * at its commit point is abandoned on every rank: rank 0 removes its temporary directory
 * step-N.tmp-* and the save returns HP_ERR_STATE naming the signal, so the previous
 * checkpoint stays the latest complete one. hp_dcp_interrupted() = the signal (0 = none). */
void hp_dcp_interrupt(int sig);
int hp_dcp_interrupted(void);

/* Retention (keep_latest_k): removes every committed step-N under `folder` but the newest
 * `keep` (keep <= 0 keeps all), logging each removal; partial directories are left alone. A
 * step that cannot be removed is a warning and the rest are still removed; an error only
 * when the folder cannot be listed. Local: call it on one rank, after a commit. */
hp_status_t hp_dcp_purge(const char *folder, int64_t keep);

/* --- HF interop (hf.c) ---------------------------------------------------------------------
 * A state-dict adapter is what one model family gives the HF code (its folder under
 * src/models/ defines it; the registry, models.h, finds it: hp_model_hf_adapter): the HF
 * architecture, the per-layer name pairs TorchTitan <-> HF, whether q/k rows are permuted,
 * what HF's class cannot express, and its config.json mapping. The checkpoint layer calls the
 * hooks; it never names a family. */
struct hp_model_config;
/* A per-layer name pair: the TorchTitan suffix after "layers.N." and the HF suffix after
 * "model.layers.N.". qk: a q/k projection, whose rows are permuted when the adapter says so. */
typedef struct hp_hf_name_pair {
    const char *tt, *hf;
    int qk;
} hp_hf_name_pair_t;
typedef struct hp_hf_adapter {
    const char *family;              /* the model family (hp_model_config_t.name), for messages */
    const char *model_type;          /* config.json's model_type ("llama") */
    const char *architecture;        /* config.json's architectures[0] ("LlamaForCausalLM") */
    /* name tables searched in order, each ended by a {NULL, NULL, 0} pair; the list ends with
     * NULL. Top-level names (embedding, final norm, lm_head) and routed experts (one HF tensor
     * per expert) are HF's common decoder names, mapped by hf.c. */
    const hp_hf_name_pair_t *const *layer_names;
    /* HF stores q/k rows in rotate_half order while the model keeps TorchTitan's interleaved
     * pairs: row h*hd + 2i + p (TorchTitan) is row h*hd + p*hd/2 + i (HF). */
    int permute_qk;
    /* HP_ERR_UNSUPPORTED, naming the config key, for a model HF's class cannot express;
     * `what` is the operation ("export", "import") for the message. */
    hp_status_t (*check)(const struct hp_model_config *mc, const char *what);
    /* config.json: read a directory's (hp_hf_read_config), compare two configs
     * (hp_hf_config_diff), and the text of the model's (malloc'ed; NULL when out of memory). */
    hp_status_t (*read_config)(const char *dir, struct hp_model_config *out);
    int (*config_diff)(const struct hp_model_config *hf, const struct hp_model_config *mc, char *msg, size_t msg_n,
                       char *flags, size_t flags_n);
    char *(*config_json)(const struct hp_model_config *mc, hp_dtype_t dtype);
} hp_hf_adapter_t;

/* Export writes model-0000i-of-0000n.safetensors shards (at most max_shard_bytes each; 0 =
 * 5 GB), model.safetensors.index.json and config.json, with names mapped by the family's
 * state-dict adapter `a` and its q/k rotary permutation applied. Tensors are gathered to rank
 * 0 (collective over comm; comm NULL = single process); dtype HP_F32 or HP_BF16. Import reads
 * an HF directory (index json or one model.safetensors) into params, any layout, reading from
 * the files only this rank's boxes of each tensor (pread of their rows), casting F32 / BF16 /
 * F16 to the parameters' f32; a config.json beside them must describe mc (the adapter's
 * read_config and config_diff). a NULL: the family has no HF architecture (an error). */
hp_status_t hp_hf_export(const char *dir, const hp_hf_adapter_t *a, const struct hp_model_config *mc,
                         const hp_param_t *params, int n_params, hp_comm_t comm, hp_dtype_t dtype,
                         size_t max_shard_bytes);
hp_status_t hp_hf_import(const char *dir, const hp_hf_adapter_t *a, const struct hp_model_config *mc,
                         hp_param_t *params, int n_params, hp_comm_t comm);
/* LoRA adapters in PEFT's format (docs/finetune.md "LoRA"): hp_hf_is_lora_param says whether an
 * FQN is an adapter ("....lora_a.weight" / "....lora_b.weight"; hp_hf_import skips them, so
 * they keep their init). hp_hf_save_lora writes DIR/adapter_config.json (r, lora_alpha,
 * target_modules of mc) and DIR/adapter_model.safetensors (f32, PEFT's keys
 * "base_model.model.<HF module>.lora_A.weight" (r, in) / "lora_B.weight" (out, r), q/k rows
 * through the adapter's permutation), gathered to rank 0 (collective over comm). hp_hf_import_lora
 * loads them back into params (any layout, each rank its boxes) after checking the config
 * against mc. hp_hf_merge_lora writes out_dir = the HF folder base_dir with every adapted
 * weight replaced by W + (lora_alpha / r) B A (PEFT's merge_and_unload) in W's dtype, the
 * other files copied; one rank, one shard file in memory at a time. */
int hp_hf_is_lora_param(const char *fqn);
hp_status_t hp_hf_save_lora(const char *dir, const hp_hf_adapter_t *a, const struct hp_model_config *mc,
                            const hp_param_t *params, int n_params, hp_comm_t comm, const char *base_model);
hp_status_t hp_hf_import_lora(const char *dir, const hp_hf_adapter_t *a, const struct hp_model_config *mc,
                              hp_param_t *params, int n_params, hp_comm_t comm);
hp_status_t hp_hf_merge_lora(const char *base_dir, const char *adapter_dir, const char *out_dir);
/* Bytes hp_hf_import read on this process (only each rank's boxes: the rows of its shard of
 * every tensor, q/k rows through the permutation) and the bytes of the tensors it loaded, since
 * the last reset; process-wide, as hp_comm_counts_get. */
typedef struct hp_hf_import_counts {
    uint64_t bytes_read, bytes_total;
} hp_hf_import_counts_t;
void hp_hf_import_counts_get(hp_hf_import_counts_t *out);
void hp_hf_import_counts_reset(void);
/* Writes DIR/config.json for the model (what hp_hf_export writes; dtype names torch_dtype). */
hp_status_t hp_hf_write_config(const char *dir, const hp_hf_adapter_t *a, const struct hp_model_config *mc,
                               hp_dtype_t dtype);
/* Streaming conversion (hf_convert.c; hp-ckpt from-hf / to-hf): one tensor in memory at a time
 * (plus its q/k permutation and a dtype cast), no model and no gradients; the parameter list
 * comes from mc. Collective over comm (NULL = one process): from-hf balances the tensors over
 * the ranks by bytes, each writing its own rank file of the DCP directory (rank 0 the
 * metadata, then out_dir is committed by rename); to-hf gives HF shard f to rank (f-1) % size.
 * from-hf keeps each tensor's dtype (F32 / BF16 / F16; hp_dcp_load casts to the parameters'),
 * checks config.json against mc (as hp_hf_import) and every tensor's shape and finiteness. */
typedef struct hp_hf_convert_stats {
    int64_t tensors;                /* converted by this rank */
    int64_t bytes_read, bytes_written;
    int64_t largest_tensor_bytes;   /* of the output, over all tensors */
} hp_hf_convert_stats_t;
hp_status_t hp_hf_convert_to_dcp(const char *hf_dir, const hp_hf_adapter_t *a, const struct hp_model_config *mc,
                                 const char *out_dir, hp_comm_t comm, hp_hf_convert_stats_t *stats);
hp_status_t hp_hf_convert_from_dcp(const char *dcp_dir, const hp_hf_adapter_t *a, const struct hp_model_config *mc,
                                   const char *out_dir, hp_dtype_t dtype, size_t max_shard_bytes, hp_comm_t comm,
                                   hp_hf_convert_stats_t *stats);
/* The adapter's name map in one direction: HP_HF_TO_HF takes a TorchTitan FQN
 * ("layers.0.attention.wq.weight") to its HF name ("model.layers.0.self_attn.q_proj.weight"),
 * HP_HF_FROM_HF the other way. *permute = 1 for the q/k weights whose rows are permuted.
 * HP_ERR_NOT_FOUND for a name without a mapping (a routed expert's 3-D tensor is E HF tensors,
 * not one name). */
typedef enum { HP_HF_TO_HF = 0, HP_HF_FROM_HF = 1 } hp_hf_direction_t;
hp_status_t hp_hf_map_name(const hp_hf_adapter_t *a, hp_hf_direction_t direction, const char *name, char *out,
                           size_t n, int *permute);
/* The HF shard index (model.safetensors.index.json, hf_index.c): an object whose
 * "weight_map" is an object of tensor name -> plain shard file name ("metadata", when
 * present, an object). Hostile input never crashes it (fuzz target
 * tests/fuzz/fuzz_hf_index.c); an error names `what` (the file) and the key at fault. */
typedef struct hp_hf_index *hp_hf_index_t;
hp_status_t hp_hf_index_parse(const char *json, size_t len, const char *what, hp_hf_index_t *out);
hp_status_t hp_hf_index_read(const char *path, hp_hf_index_t *out);
void hp_hf_index_free(hp_hf_index_t ix);
int hp_hf_index_count(hp_hf_index_t ix);                  /* weight_map entries */
void hp_hf_index_at(hp_hf_index_t ix, int i, const char **name, const char **file);
int hp_hf_index_n_files(hp_hf_index_t ix);                /* distinct shard files */
const char *hp_hf_index_file(hp_hf_index_t ix, int i);
const char *hp_hf_index_find(hp_hf_index_t ix, const char *name);   /* NULL: absent */
/* 1 when a directory holds an HF checkpoint (model.safetensors.index.json or model.safetensors). */
int hp_hf_is_hf_dir(const char *dir);

#ifdef __cplusplus
}
#endif
#endif
