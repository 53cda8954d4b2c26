/* Pipeline schedules as data (docs/pp.md): PyTorch's pipelining action IR ("1F0", "2SEND_B2",
 * "0UNSHARD"), per-rank action lists with bubbles, the CSV form of _load_csv / _dump_csv, the
 * generators of ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B and ScheduleLoopedBFS, the
 * lowering passes (_add_unshard_reshard, _add_reduce_grad, _merge_bw, _add_send_recv),
 * _validate_schedule and the lock-step simulator _simulate_comms_compute. Pure logic: no model,
 * no communicator. Reference: torch/distributed/pipelining/schedules.py. */
#ifndef HYPERPARALLEL_PP_SCHEDULE_H
#define HYPERPARALLEL_PP_SCHEDULE_H

#include <stdint.h>
#include <stdio.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* _ComputationType, in PyTorch's text form. */
typedef enum hp_pp_type {
    HP_PP_F = 0,        /* "F"  forward */
    HP_PP_I,            /* "I"  backward input (dX) */
    HP_PP_W,            /* "W"  backward weight (dW +=) */
    HP_PP_B,            /* "B"  full backward (I then W) */
    HP_PP_UNSHARD,      /* "UNSHARD"     FSDP all-gather of the stage's parameters (no micro-batch) */
    HP_PP_RESHARD,      /* "RESHARD"     FSDP free of the gathered parameters (no micro-batch) */
    HP_PP_SEND_F,       /* "SEND_F"      activations of stage s to stage s+1 */
    HP_PP_RECV_F,       /* "RECV_F"      activations into stage s from stage s-1 */
    HP_PP_SEND_B,       /* "SEND_B"      input gradient of stage s to stage s-1 */
    HP_PP_RECV_B,       /* "RECV_B"      output gradient into stage s from stage s+1 */
    HP_PP_REDUCE_GRAD,  /* "REDUCE_GRAD" the stage's gradient reduction after its last backward */
    HP_PP_OVERLAP_F_B,  /* "(0F5;1B2)OVERLAP_F_B" DualPipeV: F of (stage, mb) and B of (sub_stage, sub_mb)
                         * run together; both stages are on the action's rank */
    /* HyperParallel's MPipe transpose (ScheduleMPipeTranspose, docs/pp.md "MPipe"): the
     * preprocess units (tok_embeddings + the first T layers, part of stage 0) of micro-batch mb
     * run forward on a helping rank's replica; stage 0 continues from that activation and runs
     * the preprocess backward itself (recomputing its forward from the tokens). */
    HP_PP_MPIPE_F,      /* "MPIPE_F"      0MPIPE_F1: the replica's preprocess forward of mb on a helping rank
                         * (stage is 0: the units are stage 0's; the replica holds no gradients) */
    HP_PP_MPIPE_SEND_F, /* "MPIPE_SEND_F" the helper's preprocess output to stage 0's rank (MPIPE_FWD_SEND) */
    HP_PP_MPIPE_RECV_F, /* "MPIPE_RECV_F" on stage 0's rank: that activation */
    HP_PP_TRANSPOSE_F,  /* "TRANSPOSE_F"  stage 0's F of mb starting after the preprocess, from MPIPE_RECV_F */
    HP_PP_TRANSPOSE_B,  /* "TRANSPOSE_B"  stage 0's B of mb: the rest's backward, then the preprocess forward
                         * recomputed from the tokens and its backward (MPIPE_TRANSPOSE_BWD) */
    HP_PP_TYPE_COUNT
} hp_pp_type_t;

enum {
    HP_PP_NO_MB = -1,                /* microbatch of UNSHARD / RESHARD / REDUCE_GRAD */
    HP_PP_MAX_STAGE = (1 << 24) - 1, /* largest stage index an action may name */
    /* largest microbatch index an action may name: 2^20 microbatches per step, as hp-pp-schedule's
     * --microbatches (the checks allocate per microbatch: a CSV naming 2147483646 would ask 16 GB) */
    HP_PP_MAX_MB = (1 << 20) - 1,
};

/* _Action(stage_index, computation_type, microbatch_index[, sub_actions]). A list slot holding
 * no action (PyTorch's None, a bubble) is a NULL action pointer. OVERLAP_F_B is PyTorch's
 * _Action(-1, OVERLAP_F_B, None, (F action, B action)): here stage / mb are the F's and
 * sub_stage / sub_mb the full backward's (PyTorch's DualPipeV only makes (F; B) pairs, and
 * that is the one pair accepted). Other types leave sub_stage / sub_mb at 0. */
typedef struct hp_pp_action {
    int32_t stage;      /* [0, HP_PP_MAX_STAGE] */
    hp_pp_type_t type;
    int32_t mb;         /* [0, HP_PP_MAX_MB], or HP_PP_NO_MB for UNSHARD / RESHARD / REDUCE_GRAD */
    int32_t sub_stage;  /* OVERLAP_F_B only: the B's stage */
    int32_t sub_mb;     /* OVERLAP_F_B only: the B's microbatch */
} hp_pp_action_t;

/* The compute actions an action stands for: OVERLAP_F_B -> its F and its B (2), a compute or
 * communication action -> itself (1). out holds 2. */
int hp_pp_action_leaves(const hp_pp_action_t *a, hp_pp_action_t out[2]);

/* "F", "SEND_B", ... ; NULL for a value outside the enum. */
const char *hp_pp_type_name(hp_pp_type_t type);
/* 1 for F, I, W, B, OVERLAP_F_B (_Action.is_compute_op) and MPIPE_F, TRANSPOSE_F, TRANSPOSE_B. */
int hp_pp_type_is_compute(hp_pp_type_t type);

/* Parses one action, "{stage}{TYPE}{mb}" with surrounding spaces allowed: "1F0", "2I1",
 * "2SEND_B2", "1RECV_F1", "1UNSHARD", "0RESHARD", "0REDUCE_GRAD". F, I, W, B, SEND_* and RECV_*
 * need a microbatch; UNSHARD, RESHARD and REDUCE_GRAD take none. Text that is empty or only
 * spaces is a bubble: *is_bubble = 1 and *out is untouched. Stricter than PyTorch's re.match,
 * which ignores trailing text ("2BW0" would read as "2B"): the whole text must be one action.
 * `what` names the input in messages ("zb1p.csv:2: cell 4"; NULL: "action"). Errors
 * HP_ERR_INVALID_ARG naming the text, e.g. "action '0X1' is not a pipeline action: expected
 * {stage}{TYPE}{microbatch} ...". "(0F7;7B3)OVERLAP_F_B" is an overlap of exactly an F and a B
 * on two stages; other sub-action pairs are refused by name. */
hp_status_t hp_pp_action_parse(const char *text, const char *what, hp_pp_action_t *out, int *is_bubble);

/* _Action.__repr__: "1F0", "1UNSHARD", "(0F7;7B3)OVERLAP_F_B". Writes at most cap bytes (NUL included); returns the
 * length of the full text (snprintf's rule). */
int hp_pp_action_format(const hp_pp_action_t *a, char *buf, size_t cap);

/* A schedule: one action list per rank (pipeline_order: dict[rank, list[_Action | None]]). */
typedef struct hp_pp_schedule hp_pp_schedule_t;

/* An empty schedule of n_ranks ranks, n_ranks in [1, 1 << 20]. */
hp_status_t hp_pp_schedule_create(int n_ranks, hp_pp_schedule_t **out);
void hp_pp_schedule_free(hp_pp_schedule_t *s);
hp_status_t hp_pp_schedule_copy(const hp_pp_schedule_t *s, hp_pp_schedule_t **out);
int hp_pp_schedule_n_ranks(const hp_pp_schedule_t *s);
int hp_pp_schedule_len(const hp_pp_schedule_t *s, int rank);
/* Slot i of the rank's list; NULL for a bubble. Valid until the schedule changes. */
const hp_pp_action_t *hp_pp_schedule_at(const hp_pp_schedule_t *s, int rank, int i);
/* Appends one slot (a NULL action appends a bubble); the action is range-checked. */
hp_status_t hp_pp_schedule_append(hp_pp_schedule_t *s, int rank, const hp_pp_action_t *a);
/* Appends parsed actions from space- or comma-separated text ("0F0 0F1 _ 0B0"; "_" and empty
 * comma cells are bubbles), so tests can write schedules as PyTorch's tests do. */
hp_status_t hp_pp_schedule_append_text(hp_pp_schedule_t *s, int rank, const char *text);
/* Number of non-bubble actions over all ranks. */
int64_t hp_pp_schedule_count(const hp_pp_schedule_t *s);
/* 1 when both have the same ranks and the same slots (bubbles included). */
int hp_pp_schedule_equal(const hp_pp_schedule_t *a, const hp_pp_schedule_t *b);

/* CSV as PyTorch's _dump_csv / _load_csv (csv module, excel dialect): one row per rank in rank
 * order, one cell per slot, a bubble is an empty cell, rows end in "\r\n". Reading accepts
 * "\n" or "\r\n", cells in double quotes, spaces around actions; every cell is parsed as
 * hp_pp_action_parse and a bad one is reported as "FILE:LINE: cell K: ...". An empty file is an
 * error (a schedule has at least one rank). Saving replaces the file atomically. */
hp_status_t hp_pp_schedule_save_csv(const hp_pp_schedule_t *s, const char *path);
hp_status_t hp_pp_schedule_load_csv(const char *path, hp_pp_schedule_t **out);
/* The same from and to memory; `what` names the text in messages. The string from to_csv is
 * malloc'd (free()). */
hp_status_t hp_pp_schedule_from_csv(const char *text, const char *what, hp_pp_schedule_t **out);
hp_status_t hp_pp_schedule_to_csv(const hp_pp_schedule_t *s, char **out);

/* _format_pipeline_order: a step (row) x rank (column) grid, "Step 07: 0F1  1B0 ..." with the
 * line of error_step (>= 0) marked " <-- ERROR HERE"; -1 marks none. malloc'd (free()). */
hp_status_t hp_pp_format_grid(const hp_pp_schedule_t *s, int error_step, char **out);

/* ---- stage-to-rank mappings (generate_stage_to_rank_mapping) --------------------------- */
typedef enum hp_pp_style {
    HP_PP_STYLE_LOOP = 0, /* stage s on rank s % pp */
    HP_PP_STYLE_V,        /* zig-zag: pp=2, 4 stages -> ranks 0 1 1 0; num_stages % pp == 0 */
} hp_pp_style_t;
/* out[s] for s in [0, num_stages). */
hp_status_t hp_pp_stage_to_rank(hp_pp_style_t style, int pp, int num_stages, int *out);

/* ---- generators -------------------------------------------------------------------------- */
typedef enum hp_pp_kind {
    HP_PP_GPIPE = 0,          /* ScheduleGPipe, 1 stage per rank */
    HP_PP_1F1B,               /* Schedule1F1B, 1 stage per rank, n >= pp */
    HP_PP_INTERLEAVED_1F1B,   /* ScheduleInterleaved1F1B, L stages per rank, loop mapping */
    HP_PP_LOOPED_BFS,         /* ScheduleLoopedBFS, L stages per rank, loop mapping */
    HP_PP_INTERLEAVED_ZB,     /* ScheduleInterleavedZeroBubble (ZB1P), L stages per rank, loop mapping, I / W */
    HP_PP_ZBV,                /* ScheduleZBVZeroBubble, exactly 2 stages per rank, V mapping, I / W */
    HP_PP_DUALPIPEV,          /* ScheduleDualPipeV, exactly 2 stages per rank, V mapping, OVERLAP_F_B, n >= 2 pp */
    HP_PP_MPIPE,              /* HyperParallel's ScheduleMPipeTranspose: Interleaved1F1B (loop mapping, L stages per
                               * rank) plus, for mb in 1 .. min(pp, n) - 1, rank mb's 0MPIPE_F{mb} in its first
                               * bubble and stage 0's TRANSPOSE_F / TRANSPOSE_B of mb for its F / B */
    HP_PP_KIND_COUNT
} hp_pp_kind_t;

/* get_schedule_class: case-insensitive "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS",
 * "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV", and HyperParallel's "MPipeTranspose". PyTorch's base-class names
 * (PipelineScheduleSingle, PipelineScheduleMulti) are HP_ERR_UNSUPPORTED (they generate no
 * order); any other name is HP_ERR_INVALID_ARG naming it and listing the valid options. */
hp_status_t hp_pp_kind_from_name(const char *name, hp_pp_kind_t *out);
const char *hp_pp_kind_name(hp_pp_kind_t kind);   /* "GPipe", ... */
/* 1 for the single-stage schedules (GPipe, 1F1B), which TorchTitan gives one stage per rank;
 * the looped ones get 2 by default. */
int hp_pp_kind_is_single_stage(hp_pp_kind_t kind);
/* The stage-to-rank style a kind runs with: HP_PP_STYLE_V for ZBVZeroBubble and DualPipeV
 * (rank r holds stages r and 2 pp - 1 - r), HP_PP_STYLE_LOOP otherwise. */
hp_pp_style_t hp_pp_kind_style(hp_pp_kind_t kind);

/* The compute-only order PyTorch computes for each rank (F and B; bubbles as NULL slots):
 *   GPipe            r bubbles, F0..F(n-1), 3(P-1-r) bubbles, B0..B(n-1)
 *   1F1B             r bubbles, F0..F(P-2-r), 2(P-1-r) bubbles, F/B pairs, then (bubble, B)
 *   Interleaved1F1B  _get_1f1b_rank_ops with rounds = max(1, n // P), mb_per_round = n / rounds
 *   LoopedBFS        r bubbles, all F of stage r, r+P, ..., 2(P-1-r) bubbles, B in reverse
 *   InterleavedZeroBubble  _get_1f1b_rank_ops(enable_zero_bubble) with warm-up factor 1: I for
 *                    B, the oldest pending W after each backward past the first r, then
 *                    _add_bubbles_to_actions (an F waits for the previous stage's F)
 * with stage s on rank s % P; and with the V mapping (stages r and 2P-1-r on rank r):
 *   ZBVZeroBubble    warm-up 2(P-r)-1 F0, r (F1, F0), P-r (F1, I1, W1), steady (F0, I0, W0, F1,
 *                    I1, W1), cool-down, on max(2P-1, n) microbatches, those >= n as bubbles
 *   DualPipeV        PyTorch's eight steps with OVERLAP_F_B (F0+B1, F1+B0) in the main loop.
 *   MPipeTranspose   Interleaved1F1B's lists; for mb in 1 .. min(pp, n) - 1 rank mb's first slot (a
 *                    bubble there) becomes 0MPIPE_F{mb} and stage 0's F / B of mb become 0TRANSPOSE_F{mb}
 *                    / 0TRANSPOSE_B{mb} (HyperParallel's ScheduleMPipeTranspose; not in PyTorch).
 * For GPipe and 1F1B this is the list before _add_reduce_grad:
 * PyTorch's stored pipeline_order is hp_pp_add_reduce_grad of it (bubbles dropped). One
 * deliberate difference: Schedule1F1B numbers the last rank's forwards 1..n (its forward_mb
 * starts at 0 when there is no warm-up forward), an order that runs B0 before any F0 and fails
 * _validate_schedule; here they are 0..n-1, every other slot is PyTorch's.
 * Errors (HP_ERR_INVALID_ARG, PyTorch's messages): GPipe / 1F1B with stages_per_rank != 1;
 * 1F1B with n < pp; Interleaved1F1B / InterleavedZeroBubble with n % rounds != 0; ZBV and
 * DualPipeV with stages_per_rank != 2 ("ZBV requires exactly 2 stages per rank, but got 3.");
 * DualPipeV with n < 2 pp ("DualPipeV requires at least as many microbatches as stages"); pp,
 * n, stages_per_rank < 1; more than 2^24 compute actions in all. */
hp_status_t hp_pp_generate(hp_pp_kind_t kind, int pp, int stages_per_rank, int n_microbatches,
                           hp_pp_schedule_t **out);

/* ---- lowering passes (each returns a new schedule; the input is not changed) ------------- */

/* _add_unshard_reshard, per rank: before each action RESHARD the unsharded stages that are not
 * among the next max_active_stages distinct stages the rank computes on (in the order they
 * were unsharded), then UNSHARD those of them not yet unsharded (in order of use); RESHARD
 * what is left at the end. Bubbles are dropped. PyTorch's default max_active_stages is 3. */
hp_status_t hp_pp_add_unshard_reshard(const hp_pp_schedule_t *s, int max_active_stages, hp_pp_schedule_t **out);
/* _add_reduce_grad: REDUCE_GRAD of a stage right after its n_microbatches-th B or W. Bubbles
 * are dropped. (PyTorch 2.15 also appends a WAIT_REDUCE_GRAD after each; not modelled.) */
hp_status_t hp_pp_add_reduce_grad(const hp_pp_schedule_t *s, int n_microbatches, hp_pp_schedule_t **out);
/* _merge_bw: an I followed (bubbles skipped) by the W of the same stage and microbatch becomes
 * one B. Bubbles are dropped. */
hp_status_t hp_pp_merge_bw(const hp_pp_schedule_t *s, hp_pp_schedule_t **out);
/* The same lists without their bubbles (PyTorch's stored GPipe / 1F1B orders have none; a bubble
 * costs a round in hp_pp_add_send_recv, so the two lower differently). */
hp_status_t hp_pp_drop_bubbles(const hp_pp_schedule_t *s, hp_pp_schedule_t **out);
/* _add_send_recv: rounds over the ranks in order; a rank's next action is taken once its input
 * is there (F of stage s > 0: sRECV_Fm or (s-1)Fm on this rank; I/B of stage s < last: sRECV_Bm,
 * (s+1)Im or (s+1)Bm on this rank); an F whose next stage is on another rank is followed by
 * SEND_F and puts the matching RECV_F on the receiver's list; I/B likewise SEND_B / RECV_B.
 * Bubbles are dropped. Every action's stage must be < num_stages and stage_to_rank[s] a rank of
 * the schedule. A round without progress is HP_ERR_INVALID_ARG "Malformed compute schedule,
 * can't schedule sends/recvs" naming each stuck rank's next action. */
hp_status_t hp_pp_add_send_recv(const hp_pp_schedule_t *s, const int *stage_to_rank, int num_stages,
                                hp_pp_schedule_t **out);
/* _PipelineScheduleRuntime._prepare_schedule_with_comms(format="compute_only"): validate (which
 * gives the stage-to-rank mapping, written to stage_to_rank_out[num_stages] when not NULL),
 * refuse a communication or FSDP action ("Expected compute-only schedule but found
 * communication action '0SEND_F0' at rank 0, position 1"), then per rank
 * hp_pp_add_unshard_reshard(3) and hp_pp_add_reduce_grad, then hp_pp_add_send_recv. */
hp_status_t hp_pp_lower(const hp_pp_schedule_t *compute, int num_stages, int n_microbatches,
                        hp_pp_schedule_t **out, int *stage_to_rank_out);

/* _validate_schedule(actions, pp, num_stages, n): exactly pp ranks; for each stage a B or I
 * needs an earlier F of that microbatch, a W an earlier I; every stage is on one rank; per stage
 * the distinct F microbatches number n, I and W numbers are equal and B + (I + W) / 2 == n.
 * An action naming a stage >= num_stages is an error (PyTorch raises KeyError). Fills
 * stage_to_rank_out[num_stages] (when not NULL; -1 for a stage no action names). Errors are
 * HP_ERR_INVALID_ARG with PyTorch's words, e.g. "Rank 1, step 2: Running Full Backward for stage
 * 1, microbatch 0 without first running Forward" followed by "Full pipeline schedule:" and the
 * grid with "<-- ERROR HERE" (the rows around the error when the whole does not fit). */
hp_status_t hp_pp_validate(const hp_pp_schedule_t *s, int pp, int num_stages, int n_microbatches,
                           int *stage_to_rank_out);

/* _simulate_comms_compute: bubbles dropped, then lock-step rounds; in each, ranks in order run
 * their next action if it is ready (F, I/B as in hp_pp_add_send_recv but looking at the actions
 * already simulated on the stage's rank; W always; SEND_F after the stage's F; SEND_B after its
 * I or B; RECV_F once the peer's SEND_F ran, RECV_B once the peer's SEND_B ran), else idle;
 * then a second pass lets an idle rank take its next action if a later rank unblocked it.
 * UNSHARD, RESHARD and REDUCE_GRAD are local and always ready (PyTorch raises "Unsupported
 * action type" on them). *steps (required) = the longest simulated list. A round in which no rank
 * progresses is HP_ERR_INVALID_ARG "Schedule is not progressing" naming each rank's next action
 * and what it waits for. When `simulated` is not NULL it receives the simulated schedule, on
 * success and, so that it can be shown (hp_pp_format_grid), also on that error. */
hp_status_t hp_pp_simulate(const hp_pp_schedule_t *comms, const int *stage_to_rank, int num_stages,
                           hp_pp_schedule_t **simulated, int *steps);

/* Bubble fraction of a compute-only schedule with unit costs F = I = W = 1 and B = 2 (= I + W),
 * communication free: each rank runs its actions in list order (bubbles ignored), an action
 * starting once the rank is free and its input is done (F of stage s after F of s-1, I/B after
 * I/B of s+1 and F of s, W after I of s, same microbatch). bubble = 1 - busy / (ranks x
 * makespan). For GPipe and 1F1B this is (P-1)/(n+P-1). A dependency that never comes is
 * HP_ERR_INVALID_ARG naming the waiting action. */
typedef struct hp_pp_timing {
    int64_t makespan;       /* time units until the last action ends */
    int64_t busy;           /* sum of action costs over all ranks */
    double bubble_fraction; /* 1 - busy / (n_ranks * makespan) */
} hp_pp_timing_t;
hp_status_t hp_pp_timing(const hp_pp_schedule_t *compute, int num_stages, hp_pp_timing_t *out);
/* The same, with each action's unit-cost start and end (malloc'd, free()): rank r's slot i is
 * at index len(rank 0) + ... + len(rank r-1) + i; -1 for bubbles and communication actions.
 * What hp-pp-timeline draws as the simulator's timeline. */
hp_status_t hp_pp_timing_actions(const hp_pp_schedule_t *compute, int num_stages, hp_pp_timing_t *out,
                                 int64_t **start, int64_t **end);

#ifdef __cplusplus
}
#endif
#endif
