/* Training metrics as TorchTitan's MetricsProcessor: one console line per log step (step,
 * loss, grad norm, LR, tokens/s, TFLOP/s, MFU, RSS and peak RSS, ETA), a JSONL file (one
 * JSON object per log step) and TensorBoard event files (TFRecord framing with masked
 * CRC32C, Event protobufs with scalar Summary values, hand-encoded), plus a reader of those
 * files that verifies every CRC. Formulas: docs/metrics.md. */
#ifndef HYPERPARALLEL_METRICS_H
#define HYPERPARALLEL_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "config.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- TensorBoard event files ---------------------------------------------------------- */

/* CRC-32C (Castagnoli), as TFRecord uses; `crc` is the running value (0 to start). */
uint32_t hp_crc32c(uint32_t crc, const void *data, size_t n);
/* TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t hp_crc32c_mask(uint32_t crc);

typedef struct hp_tb_writer *hp_tb_writer_t;
/* Creates `dir` (and parents) and the file events.out.tfevents.<unix time>.<host>.<pid>.<tag>
 * (tag may be NULL), and writes the first event (file_version "brain.Event:2"). */
hp_status_t hp_tb_writer_open(const char *dir, const char *tag, hp_tb_writer_t *out);
/* One Event{wall_time, step, Summary{Value{tag, simple_value}}}. wall_time < 0 = now. */
hp_status_t hp_tb_writer_add_scalar(hp_tb_writer_t w, const char *tag, int64_t step, float value, double wall_time);
hp_status_t hp_tb_writer_flush(hp_tb_writer_t w);
const char *hp_tb_writer_path(hp_tb_writer_t w);
void hp_tb_writer_close(hp_tb_writer_t w);

#define HP_TB_MAX_VALUES 16
#define HP_TB_TAG_MAX 128
typedef struct hp_tb_event {
    double wall_time;
    int64_t step;
    char file_version[64];   /* "" unless the event is the file-version record */
    int n_values;            /* scalar values of the event's Summary */
    struct {
        char tag[HP_TB_TAG_MAX];
        float value;
    } values[HP_TB_MAX_VALUES];
} hp_tb_event_t;
typedef hp_status_t (*hp_tb_event_fn)(void *ctx, const hp_tb_event_t *ev);
/* Reads every record of an event file, verifying both CRCs, decodes each Event and calls
 * fn. Errors name the file, the record index and the byte offset (HP_ERR_FORMAT for a CRC
 * mismatch, truncation or a malformed protobuf). Summary values other than simple_value
 * (images, histograms, tensors) are skipped. */
hp_status_t hp_tb_read_file(const char *path, hp_tb_event_fn fn, void *ctx);

/* ---- memory and peak ---------------------------------------------------------------- */

/* Resident set size and its peak (VmRSS, VmHWM of /proc/self/status), bytes. */
hp_status_t hp_memory_rss(int64_t *rss, int64_t *peak_rss);
/* This rank's float32 GEMM peak (FLOP/s): after a warm-up product, the fastest single GEMM of
 * the default backend's kernel table (backend.h; the CPU: one BLAS sgemm) of n = 256, 512, 768,
 * 1024 over about `seconds` in all; the second MFU figure (mfu_sgemm_pct) when no peak is
 * configured. */
hp_status_t hp_measure_peak_flops(double seconds, double *flops);

/* ---- the metrics processor ------------------------------------------------------------ */

typedef struct hp_metrics_options {
    int64_t log_freq;          /* log at step 1 and every log_freq steps */
    int64_t total_steps;       /* for the ETA */
    double flops_per_token;    /* model training FLOPs per token (6N + attention); 0: no TFLOP/s, MFU */
    double peak_flops;         /* per rank; 0 = measure at create (FMA peak 0.2 s + sgemm peak 0.5 s); < 0 = no MFU */
    int64_t tokens_divisor;    /* ranks sharing one stream of tokens (cp*tp*pp); 0 = 1 */
    const char *tb_dir;        /* NULL or "" = no TensorBoard */
    const char *tb_tag;        /* suffix of the event file name (e.g. "rank0"); may be NULL */
    const char *jsonl_path;    /* NULL or "" = no JSONL */
    FILE *out;                 /* console lines; NULL = none (other ranks) */
    bool color;
} hp_metrics_options_t;

/* Options for a rank from the config: files under job.dump_folder (relative paths) on the
 * metrics rank, or on every rank with metrics.save_for_all_ranks (then the file names get
 * the rank); the console line on the metrics rank only. The strings live in `storage`. */
typedef struct hp_metrics_paths {
    char tb_dir[2 * HP_CONFIG_STR_MAX];
    char tb_tag[32];
    char jsonl[2 * HP_CONFIG_STR_MAX + 16];
} hp_metrics_paths_t;
hp_metrics_options_t hp_metrics_options_from_config(const hp_config_t *cfg, int rank, bool is_metrics_rank,
                                                    double flops_per_token, int64_t tokens_divisor,
                                                    hp_metrics_paths_t *storage);

/* What one log step reports (also what the last hp_metrics_log computed). */
typedef struct hp_metrics_record {
    int64_t step;
    double loss;             /* global average loss */
    double max_loss;         /* NAN when not given */
    double grad_norm;
    double lr;
    double tokens_per_s;     /* per rank: tokens since the last log / time / tokens_divisor */
    double tflops;           /* flops_per_token * tokens_per_s / 1e12 */
    double mfu_pct;          /* 100 * flops_per_token * tokens_per_s / peak; NAN without a peak */
    double mfu_sgemm_pct;    /* the same against the measured sgemm peak; NAN when the peak is configured */
    double step_time_s;      /* mean over the steps since the last log */
    double elapsed_s;        /* since hp_metrics_create */
    double eta_s;            /* step_time_s * (total_steps - step) */
    int64_t rss_bytes, peak_rss_bytes;
    int64_t tokens_seen;     /* all tokens added so far on this rank */
} hp_metrics_record_t;

typedef struct hp_metrics *hp_metrics_t;
hp_status_t hp_metrics_create(const hp_metrics_options_t *opts, hp_metrics_t *out);
void hp_metrics_destroy(hp_metrics_t m);
/* The peak FLOP/s used for MFU: configured, or measured at create as the f32 FMA peak of the
 * rank's threads (hp_cpu_fma_peak_flops, nn_kernels.h: what the hardware does, whatever kernels
 * the BLAS picked); <= 0 when MFU is off. */
double hp_metrics_peak_flops(hp_metrics_t m);
/* The sgemm peak measured beside it (hp_measure_peak_flops; 0 when the peak is configured): the
 * second MFU figure, against what the GEMM library reaches. */
double hp_metrics_sgemm_peak_flops(hp_metrics_t m);
/* Tokens this rank loaded for the step (labels.numel()). */
void hp_metrics_add_tokens(hp_metrics_t m, int64_t ntokens);
bool hp_metrics_should_log(hp_metrics_t m, int64_t step);
/* Computes the record (from the given step, loss, max_loss, grad_norm, lr and the timing
 * since the previous log), prints the line, appends the JSONL object, writes the TensorBoard
 * scalars and restarts the interval. Non-finite values print as nan/inf and are written as
 * JSON null. */
hp_status_t hp_metrics_log(hp_metrics_t m, int64_t step, double loss, double max_loss, double grad_norm, double lr,
                           hp_metrics_record_t *out);
/* An extra scalar (e.g. "validation_metrics/loss") to the console, JSONL and TensorBoard. */
hp_status_t hp_metrics_log_scalar(hp_metrics_t m, const char *tag, int64_t step, double value);
/* The TensorBoard file being written (NULL when off). */
const char *hp_metrics_tb_path(hp_metrics_t m);

#ifdef __cplusplus
}
#endif
#endif
