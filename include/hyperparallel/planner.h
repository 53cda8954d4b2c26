/* The auto-parallel planner (docs/planner.md; HyperParallel's SAPP): every layout the trainer
 * supports for a world size, validated by the trainer's own rules (hp_parallel_config_check),
 * filtered by the memory plan (hp_memory_plan) and ranked by a predicted step time made from
 * this machine's measured rates (a calibration: GEMM, attention and row-kernel rates, each
 * collective's latency and bandwidth) and the communication volume each layout moves per step,
 * counted as the runtime counts it (hp_comm_counts_get). Pure arithmetic apart from the
 * calibration, which measures. */
#ifndef HYPERPARALLEL_PLANNER_H
#define HYPERPARALLEL_PLANNER_H

#include <stddef.h>
#include <stdint.h>
#include "comm.h"
#include "config.h"
#include "memory_plan.h"
#include "model.h"
#include "parallel_dims.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- calibration: this machine's rates ---------------------------------------------------- */
enum { HP_PLAN_GEMM_DIMS = 4, HP_PLAN_ATTN_T = 4, HP_PLAN_COLL_SIZES = 3 };
typedef enum hp_plan_coll {
    HP_PLAN_ALL_REDUCE = 0, HP_PLAN_ALL_GATHER, HP_PLAN_REDUCE_SCATTER, HP_PLAN_BROADCAST, HP_PLAN_P2P,
    HP_PLAN_ALL_TO_ALL, HP_PLAN_COLL_COUNT
} hp_plan_coll_t;

typedef struct hp_plan_calib {
    char cpu[128];          /* lscpu's model name (/proc/cpuinfo) */
    int cores;              /* online CPUs when measured */
    int threads;            /* OpenMP threads each kernel ran with */
    /* sgemm FLOP/s at (M, N, K) on the grid dims x dims x dims (hp_linear_forward: out (M, N) =
     * inp (M, K) @ weight^T); between grid points interpolated in log space */
    int gemm_dims[HP_PLAN_GEMM_DIMS];
    double gemm_flops[HP_PLAN_GEMM_DIMS][HP_PLAN_GEMM_DIMS][HP_PLAN_GEMM_DIMS];
    /* causal attention forward + backward FLOP/s at B 1, 4 heads of 64, T = attn_t[i] */
    int attn_t[HP_PLAN_ATTN_T];
    double attn_flops[HP_PLAN_ATTN_T];
    double row_bytes_per_s;     /* RMSNorm forward + backward (the row kernels' bandwidth) */
    /* t(bytes per call) = alpha + bytes * beta (seconds), for communicators of coll_ranks[i]
     * ranks (0: not measured: the calibration ran on fewer ranks) */
    int coll_ranks[HP_PLAN_COLL_SIZES];
    double alpha[HP_PLAN_COLL_COUNT][HP_PLAN_COLL_SIZES], beta[HP_PLAN_COLL_COUNT][HP_PLAN_COLL_SIZES];
} hp_plan_calib_t;

/* Measures every rate (collective over world: the collectives on its first 2, 4 and 8 ranks;
 * rank 0's kernels); every rank gets rank 0's result. quick: fewer repetitions (seconds). */
hp_status_t hp_plan_calibrate(hp_comm_t world, int quick, hp_plan_calib_t *out);
/* Text file with a magic line and a version; a mismatch names the file and says to rerun
 * `hp-plan --calibrate`. */
hp_status_t hp_plan_calib_save(const hp_plan_calib_t *c, const char *path);
hp_status_t hp_plan_calib_load(const char *path, hp_plan_calib_t *out);
/* $HP_PLAN_CALIBRATION, else ~/.cache/hyperparallel/calibration.txt. */
void hp_plan_calib_default_path(char *buf, size_t n);
/* Interpolated rate of one GEMM (FLOP/s) on the calibration's threads. */
double hp_plan_gemm_rate(const hp_plan_calib_t *c, double M, double N, double K);
/* Seconds of one collective call of `bytes` (the counters' send-side bytes) over `ranks`. */
double hp_plan_coll_seconds(const hp_plan_calib_t *c, hp_plan_coll_t op, int ranks, double bytes);

/* ---- communication volume of one step ----------------------------------------------------- */
/* What a rank sends per training step (hp_trainer_step: data counts, forward / backward over
 * every micro-batch, the gradient reduction, loss and norm), per counter op, exactly as
 * hp_comm_counts_get counts it; exact = 0 when a part is an estimate (see docs/planner.md). */
typedef struct hp_plan_comm {
    uint64_t calls[HP_COMM_OP_COUNT], bytes[HP_COMM_OP_COUNT];
    int exact;
    /* predicted seconds of that traffic by where it runs: overlappable with compute (FSDP's
     * prefetched all-gathers / reduce-scatters, DDP's buckets) and blocking (TP, CP, PP p2p, the
     * step's small all-reduces, ZeRO's broadcasts) */
    double overlappable_s, blocking_s;
} hp_plan_comm_t;

/* cfg: the layout to evaluate (its parallelism / training keys); mc resolved; rank: the world
 * rank whose traffic to count (they differ only where a rank's share does: ZeRO-1's broadcasts
 * from their owners); calib may be NULL (no seconds). */
hp_status_t hp_plan_comm_predict(const hp_config_t *cfg, const hp_model_config_t *mc, const hp_parallel_dims_t *pd,
                                 int rank, const hp_plan_calib_t *calib, hp_plan_comm_t *out);

/* ---- the search --------------------------------------------------------------------------- */
typedef struct hp_plan_layout {
    hp_parallel_dims_t dims;
    int sequence_parallel;
    char schedule[32];          /* pp > 1 */
    int microbatch_size;        /* pp > 1 */
    char ac_mode[16], ac_option[8];
    int zero_stage;
    int local_batch, grad_accum;
    hp_memory_plan_t mem;       /* the largest rank's */
    hp_plan_comm_t comm;
    double compute_s, exposed_comm_s, bubble_s, step_s, tokens_per_s;
    /* compute_s by part: the linears' GEMMs, attention, the row kernels, AC's recompute, the
     * optimizer's sweep */
    double gemm_s, attn_s, row_s, recompute_s, optim_s;
} hp_plan_layout_t;

typedef struct hp_plan_options {
    int world;
    double memory_limit_bytes;  /* <= 0: no limit */
    size_t base_bytes;          /* the process before the model (resident set) */
    int ranks_per_host;         /* ranks sharing this host's cores (<= 0: world) */
    const hp_plan_calib_t *calib;
} hp_plan_options_t;

typedef struct hp_plan_result {
    hp_plan_layout_t *layouts;  /* fitting ones, fastest first */
    int n;
    int n_enumerated, n_refused, n_over_memory;
    double smallest_peak;       /* of the valid layouts (bytes), for the refusal */
    char smallest_what[512];
} hp_plan_result_t;

/* Enumerates dp_replicate x dp_shard x cp x tp (sequence parallel on / off) x pp (GPipe, 1F1B,
 * Interleaved1F1B, each micro-batch size dividing the local batch) x ep (MoE models) x AC (none,
 * full, selective 2, op) x ZeRO-1 (DDP) for o->world ranks, keeps the config's global batch
 * (training.global_batch_size, else local_batch_size x world) with its local batch and gradient
 * accumulation, drops what hp_parallel_config_check refuses and what exceeds the memory limit,
 * ranks the rest. An empty result is not an error (the caller refuses with the figures). */
hp_status_t hp_plan_search(const hp_config_t *cfg, const hp_model_config_t *mc, const hp_plan_options_t *o,
                           hp_plan_result_t *out);
void hp_plan_result_free(hp_plan_result_t *r);
/* Sets the layout's parallelism / training / activation_checkpoint keys in cfg. */
void hp_plan_apply(hp_config_t *cfg, const hp_plan_layout_t *l);
/* "--parallelism.data_parallel_shard_degree=2 ..." (every key hp_plan_apply sets). */
const char *hp_plan_overrides(const hp_plan_layout_t *l, char *buf, size_t n);
/* The model cfg trains, resolved with its tokenizer's vocabulary (as hp-train does). */
hp_status_t hp_plan_resolve_model(const hp_config_t *cfg, hp_model_config_t *out);

#ifdef __cplusplus
}
#endif
#endif
