/* Pipeline parallel (docs/pp.md): TorchTitan's split of the model's units into stages, and the
 * runtime that executes a rank's lowered action list (pp_schedule.h) over stage models created
 * for their unit range only (hp_model_create_range): F / I / W / B on caller-owned micro-batch
 * contexts, SEND_* / RECV_* as tagged asynchronous point-to-point on the pp communicator,
 * UNSHARD / RESHARD / REDUCE_GRAD through the caller's hooks (FSDP). Shapes are fixed at
 * creation from the micro-batch size, so no metadata travels per step. Semantics: PyTorch's
 * _PipelineScheduleRuntime and PipelineStage (torch/distributed/pipelining/schedules.py, stage.py). */
#ifndef HYPERPARALLEL_PP_H
#define HYPERPARALLEL_PP_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "model.h"
#include "pp_schedule.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HP_PP_MAX_STAGES 1024

/* ---- the split (torchtitan/distributed/pipeline_parallel.py) ----------------------------- */

/* _get_pipeline_metadata: the number of (virtual) stages. layers_per_stage <= 0: pp x (1 for a
 * single-stage schedule, 2 for a looped one); else ceil((n_layers + w_in + w_out) /
 * layers_per_stage), which must be a multiple of pp, 1 per rank for single-stage schedules and
 * >= 2 for looped ones. Errors name the config keys (parallelism.pipeline_parallel_*). */
hp_status_t hp_pp_num_stages(int pp, int single_stage_schedule, int n_layers, int layers_per_stage, int w_in,
                             int w_out, int *num_stages);

/* generate_llm_fqn_per_model_part over units: the model's units are 0 = tok_embeddings,
 * 1..n_layers = layers.{u-1}, n_layers + 1 = norm + output. n_layers + w_in + w_out
 * "effective layers" are divided evenly, the first (effective % num_stages) stages one more;
 * stage 0 holds the embedding and w_in fewer layers, the last stage w_out fewer layers and the
 * head. Stage s gets units [unit_lo[s], unit_lo[s + 1]) (unit_lo has num_stages + 1 entries).
 * Errors (HP_ERR_INVALID_ARG, TorchTitan's checks): more stages than effective layers, an
 * empty stage, w_in or w_out larger than the layers per stage. */
hp_status_t hp_pp_split_layers(int n_layers, int num_stages, int w_in, int w_out, int *unit_lo);

/* parallelism.module_fqns_per_model_part: stages separated by ';', module names by ',' (e.g.
 * "tok_embeddings,layers.0;layers.1,norm,output"). Each stage must list contiguous units in
 * order; "norm" and "output" go together; every module exactly once. `key` names the input
 * in messages. */
hp_status_t hp_pp_split_fqns(const char *spec, const char *key, int n_layers, int *num_stages, int *unit_lo);

/* ---- the runtime ---------------------------------------------------------------------------- */

typedef struct hp_pp *hp_pp_t;

/* Called by the runtime around the actions that concern a data-parallel wrapper of a stage.
 * Any may be NULL (the action is then a no-op). pre_backward runs before every B and I of
 * stage `stage`; `last` is 1 for the stage's last backward of the step (FSDP: gradient sync
 * on for that one only). Under a split backward (I now, W later) fully_shard keeps the
 * parameters unsharded and the gradient buffer in place while weight passes are pending and
 * reduces after the stage's last W, so the flag set at the last I governs that reduction. */
typedef struct hp_pp_hooks {
    void *user;
    hp_status_t (*pre_backward)(void *user, int stage, int mb, int last);
    hp_status_t (*unshard)(void *user, int stage);
    hp_status_t (*reshard)(void *user, int stage);
    hp_status_t (*reduce_grad)(void *user, int stage);
} hp_pp_hooks_t;

/* How an OVERLAP_F_B action (DualPipeV) runs its F and its B (docs/pp.md "Overlap": measured,
 * INTERLEAVE chosen). All three compute the same values bitwise: the F and the B are the same
 * kernel calls on the same data, only their order against the communication differs. */
typedef enum hp_pp_overlap {
    HP_PP_OVERLAP_DEFAULT = 0,   /* env HP_PP_OVERLAP (off | interleave | thread), else INTERLEAVE */
    HP_PP_OVERLAP_OFF,           /* as the list [F, B] followed by its sends: both inputs waited first */
    HP_PP_OVERLAP_INTERLEAVE,    /* wait the F's input, F, post its send, wait the B's input, B, post its send:
                                  * the B's receive lands during the F, the F's send leaves during the B */
    HP_PP_OVERLAP_THREAD,        /* the B on a second thread (created per action: a measurement mode) while
                                  * the F runs; stages without collectives inside only (no FSDP / TP / CP:
                                  * the runtime refuses FSDP hooks, the caller must refuse the rest, as
                                  * the trainer does); the F and B stages must differ */
} hp_pp_overlap_t;

/* Point-to-point transport (HyperParallel's p2p transports). */
typedef enum hp_pp_p2p {
    HP_PP_P2P_DEFAULT = 0,       /* env HP_PP_P2P (per_op | coalesced), else PER_OP */
    HP_PP_P2P_PER_OP,            /* one asynchronous send / receive per SEND / RECV action */
    HP_PP_P2P_COALESCED,         /* a SEND and a RECV with the same peer, adjacent in the list: one batched
                                  * isend / irecv pair (hp_group_end_work), one handle */
} hp_pp_p2p_t;

typedef struct hp_pp_options {
    int num_stages;
    const int *stage_to_rank;  /* (num_stages) rank on pp_comm of each stage */
    int n_microbatches;
    int microbatch_size;       /* sequences per micro-batch */
    int seq_len;
} hp_pp_options_t;

/* Collective over pp_comm (duplicated for the runtime's messages). `lowered` holds every pp
 * rank's list (hp_pp_lower of a compute-only schedule, or a CSV with its communication); it is
 * validated and simulated here so that a schedule that would deadlock is refused before any
 * step ("Schedule is not progressing", naming the actions). stages[i] is the model of stage
 * stage_ids[i] (ascending), created by hp_model_create_range for exactly that stage's units;
 * adjacent stages on this rank must have adjacent unit ranges. The runtime sizes every
 * buffer now: per local stage as many micro-batch contexts as the schedule keeps in flight
 * (F starts one, its B or W ends it), and the activation / gradient buffers of the sends and
 * receives; hp_pp_step allocates nothing. */
hp_status_t hp_pp_create(hp_comm_t pp_comm, const hp_pp_schedule_t *lowered, hp_model_t *stages,
                         const int *stage_ids, int n_local, const hp_pp_options_t *o, const hp_pp_hooks_t *hooks,
                         hp_pp_t *out);
/* hp_pp_create for a schedule with MPipe's actions (MPIPE_F / TRANSPOSE_F / TRANSPOSE_B,
 * HP_PP_MPIPE; docs/pp.md "MPipe"): the preprocess is units [0, transpose_layers + 1)
 * (tok_embeddings and the first transpose_layers layers), part of stage 0, which must hold them
 * all. Every rank without stage 0 gets a replica of them (created here by hp_model_create_range),
 * refreshed from stage 0's parameters by a broadcast over pp_comm at the start of each
 * hp_pp_step; the replicas' gradients are never written. hp_pp_create is this with
 * transpose_layers 0 (the embedding only). */
hp_status_t hp_pp_create_mpipe(hp_comm_t pp_comm, const hp_pp_schedule_t *lowered, hp_model_t *stages,
                               const int *stage_ids, int n_local, const hp_pp_options_t *o, const hp_pp_hooks_t *hooks,
                               int transpose_layers, hp_pp_t *out);
void hp_pp_destroy(hp_pp_t p);

/* One run of this rank's action list over n_microbatches micro-batches: tokens and targets are
 * (n_microbatches x microbatch_size, T) int32 (micro-batch m = rows [m*mbs, (m+1)*mbs)); the
 * first stage reads tokens, the last targets (others may pass NULL; under MPipe a helping rank
 * with an MPIPE_F reads tokens too). Each micro-batch's loss is
 * its summed cross-entropy / loss_divisor; gradients accumulate (+=) into the stage models.
 * *loss_sum / *n_valid receive the sums over micro-batches on a rank holding the last stage (0
 * elsewhere). Every receive and send is complete on return. */
hp_status_t hp_pp_step(hp_pp_t p, const int32_t *tokens, const int32_t *targets, float loss_divisor,
                       double *loss_sum, int64_t *n_valid);
/* Forward only (evaluation): every micro-batch through every local stage in stage order, the
 * activations sent on as they are made; no backward, gradients untouched. */
hp_status_t hp_pp_eval(hp_pp_t p, const int32_t *tokens, const int32_t *targets, float loss_divisor,
                       double *loss_sum, int64_t *n_valid);

/* Memory of this rank: the micro-batch contexts (saved activations: what the schedule keeps in
 * flight), the point-to-point buffers. */
void hp_pp_memory(hp_pp_t p, size_t *context_bytes, size_t *buffer_bytes);
/* Contexts of local stage i (the schedule's peak in-flight micro-batches on that stage). */
int hp_pp_stage_contexts(hp_pp_t p, int i);
/* Most contexts of local stage i in use at once during the last hp_pp_step / hp_pp_eval
 * (measured: the pool's high-water mark; equals hp_pp_stage_contexts when the schedule reaches
 * its peak). */
int hp_pp_stage_peak_contexts(hp_pp_t p, int i);
/* Per-action record of the last step (for the benchmark): action i of this rank's list ran
 * from start[i] to end[i] seconds (hp_clock_now_seconds); returns the list length. */
int hp_pp_last_timeline(hp_pp_t p, const hp_pp_action_t **actions, const double **start, const double **end);
/* Sets the overlap and p2p modes (DEFAULT: the env, else INTERLEAVE / PER_OP, which
 * hp_pp_create applies); between steps only. Errors: THREAD with FSDP hooks or with an overlap
 * of one stage's F and B; an unknown value or env text. */
hp_status_t hp_pp_set_transport(hp_pp_t p, hp_pp_overlap_t overlap, hp_pp_p2p_t p2p);
/* The modes in effect and the number of SEND / RECV pairs of this rank's list that run
 * coalesced (0 under PER_OP). */
/* MPipe: bytes of preprocess parameters each hp_pp_step broadcasts from stage 0's rank (the
 * replicas' refresh; 0 when the schedule transposes nothing), and the micro-batches whose
 * preprocess forward this rank ran on its replica in the last step. */
size_t hp_pp_mpipe_broadcast_bytes(hp_pp_t p);
int hp_pp_mpipe_forwards(hp_pp_t p);
hp_pp_overlap_t hp_pp_overlap_mode(hp_pp_t p);
int hp_pp_coalesced_pairs(hp_pp_t p);

#ifdef __cplusplus
}
#endif
#endif
