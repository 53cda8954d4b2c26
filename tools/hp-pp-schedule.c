/* hp-pp-schedule: print a pipeline schedule, its simulated step count and its bubble fraction
 * (single process; pure schedule logic, docs/pp.md).
 *   hp-pp-schedule --schedule 1F1B --pp 4 --microbatches 8 [--stages-per-rank 2] [--lower]
 *   hp-pp-schedule --csv FILE [--microbatches N] [--lower]      a compute-only CSV (_load_csv)
 *   ... [--save-csv OUT]                 the printed schedule (lowered with --lower) as _dump_csv
 * Exit 0; 1 when the schedule is invalid or deadlocks (the message says where); 2 for bad
 * arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hyperparallel/parse.h>
#include <hyperparallel/pp_schedule.h>

#include "pp-cli.h"

#define TOOL "hp-pp-schedule"

static int usage(void) {
    fprintf(stderr,
            "usage: " TOOL " --schedule NAME --pp P --microbatches N [--stages-per-rank L] [--lower] [--save-csv OUT]\n"
            "       " TOOL " --csv FILE [--pp P] [--microbatches N] [--lower] [--save-csv OUT]\n"
            "  NAME: GPipe, 1F1B (1 stage per rank), Interleaved1F1B, LoopedBFS, InterleavedZeroBubble (default\n"
            "        2 stages per rank, stage s on rank s %% P), ZBVZeroBubble, DualPipeV (2 stages per rank, V\n"
            "        mapping), MPipeTranspose (HyperParallel's; as Interleaved1F1B); case-insensitive, as PyTorch's\n"
            "        get_schedule_class\n"
            "  --csv FILE      a schedule, one row per rank (PyTorch's _load_csv); N defaults to the number of\n"
            "                  microbatches its forwards name. A CSV with SEND/RECV, UNSHARD/RESHARD or REDUCE_GRAD\n"
            "                  actions is taken verbatim (format compute_comms) and simulated as it is\n"
            "  --lower         also print the schedule with UNSHARD/RESHARD, REDUCE_GRAD and SEND/RECV added\n"
            "                  (_prepare_schedule_with_comms)\n"
            "  --save-csv OUT  write the compute schedule (the lowered one with --lower) as PyTorch's _dump_csv\n");
    return 2;
}

static int bad_args(void) {
    fprintf(stderr, "%s\n", hp_last_error());
    usage();
    return 2;
}

static int fail(hp_status_t s) {
    fprintf(stderr, TOOL ": %s: %s\n", hp_status_string(s), hp_last_error());
    return 1;
}

static int print_grid(const char *title, const hp_pp_schedule_t *s) {
    char *g = NULL;
    hp_status_t st = hp_pp_format_grid(s, -1, &g);
    if (st != HP_OK) return fail(st);
    printf("%s\n%s", title, g);
    free(g);
    return 0;
}

static const char *const flags[] = {"--schedule", "--pp", "--microbatches", "--stages-per-rank", "--csv", "--save-csv",
                                    "--lower", "--help"};
#define N_FLAGS (sizeof flags / sizeof flags[0])

int main(int argc, char **argv) {
    const char *csv = NULL, *save = NULL;
    pp_cli_t cli = {0};
    int lower = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        } else if (!strcmp(a, "--lower")) {
            lower = 1;
        } else if ((r = pp_cli_flag(TOOL, argc, argv, &i, &cli))) {
            if (r < 0) return bad_args();
        } else if ((r = hp_flag_value(TOOL, argc, argv, &i, "--csv", &v))) {
            if (r < 0) return bad_args();
            csv = v;
        } else if ((r = hp_flag_value(TOOL, argc, argv, &i, "--save-csv", &v))) {
            if (r < 0) return bad_args();
            save = v;
        } else if (a[0] == '-' && a[1]) {
            hp_flag_unknown_error(TOOL, a, flags, N_FLAGS);
            return bad_args();
        } else {
            fprintf(stderr, TOOL ": unexpected argument '%s' (every input is a flag)\n", a);
            return usage();
        }
    }
    const char *name = cli.schedule;
    int32_t pp = cli.pp, n = cli.n, L = cli.L;
    if (!!name == !!csv) {
        fprintf(stderr, TOOL ": give exactly one of --schedule NAME and --csv FILE\n");
        return usage();
    }
    hp_pp_schedule_t *compute = NULL;
    hp_pp_kind_t kind = HP_PP_KIND_COUNT;
    int num_stages = 0;
    if (name) {
        hp_status_t st = hp_pp_kind_from_name(name, &kind);
        if (st != HP_OK) {
            fprintf(stderr, TOOL ": --schedule: %s\n", hp_last_error());
            return 2;
        }
        if (!pp || !n) {
            fprintf(stderr, TOOL ": --schedule needs --pp and --microbatches\n");
            return usage();
        }
        if (!L) L = hp_pp_kind_is_single_stage(kind) ? 1 : 2;   /* TorchTitan's defaults */
        st = hp_pp_generate(kind, pp, L, n, &compute);
        if (st != HP_OK) {
            fprintf(stderr, TOOL ": %s\n", hp_last_error());
            return 2;
        }
        num_stages = pp * L;
        if (hp_pp_kind_style(kind) == HP_PP_STYLE_V)
            printf("%s: pp %d, %d stages per rank (%d stages, V mapping: rank r holds stages r and %d - r), %d "
                   "microbatches\n", hp_pp_kind_name(kind), pp, L, num_stages, num_stages - 1, n);
        else
            printf("%s: pp %d, %d stage(s) per rank (%d stages, stage s on rank s %% %d), %d microbatches\n",
                   hp_pp_kind_name(kind), pp, L, num_stages, pp, n);
    } else {
        if (L) {
            fprintf(stderr, TOOL ": --stages-per-rank applies to --schedule; a CSV names its stages\n");
            return usage();
        }
        hp_status_t st = hp_pp_schedule_load_csv(csv, &compute);
        if (st != HP_OK) return fail(st);
        const int R = hp_pp_schedule_n_ranks(compute);
        if (pp && pp != R) {
            fprintf(stderr, TOOL ": --pp %d but %s has %d rows (one per rank)\n", pp, csv, R);
            hp_pp_schedule_free(compute);
            return 2;
        }
        pp = R;
        int max_f = -1;
        for (int r = 0; r < R; r++)
            for (int i = 0; i < hp_pp_schedule_len(compute, r); i++) {
                const hp_pp_action_t *a = hp_pp_schedule_at(compute, r, i);
                if (!a) continue;
                if (a->stage + 1 > num_stages) num_stages = a->stage + 1;
                if (a->type == HP_PP_OVERLAP_F_B && a->sub_stage + 1 > num_stages) num_stages = a->sub_stage + 1;
                if (a->type == HP_PP_F && a->mb > max_f) max_f = a->mb;
            }
        if (!n) n = max_f + 1;
        if (num_stages == 0 || n < 1) {
            fprintf(stderr, TOOL ": %s holds no forward action; nothing to schedule\n", csv);
            hp_pp_schedule_free(compute);
            return 1;
        }
        printf("%s: %d ranks, %d stages, %d microbatches\n", csv, pp, num_stages, n);
    }
    int comms = 0;   /* a lowered CSV: PyTorch's format="compute_comms", taken verbatim */
    for (int r = 0; r < pp; r++)
        for (int i = 0; i < hp_pp_schedule_len(compute, r); i++) {
            const hp_pp_action_t *a = hp_pp_schedule_at(compute, r, i);
            comms |= a && !hp_pp_type_is_compute(a->type);
        }
    if (comms && lower) {
        fprintf(stderr, TOOL ": --lower needs a compute-only schedule; %s already has communication or FSDP actions "
                "(PyTorch's format=\"compute_comms\", simulated as it is without --lower)\n", csv);
        hp_pp_schedule_free(compute);
        return 2;
    }
    int rc = 0;
    int *map = calloc((size_t)num_stages, sizeof *map);
    hp_pp_schedule_t *sr = NULL, *sim = NULL, *low = NULL;
    hp_status_t st = map ? hp_pp_validate(compute, pp, num_stages, n, map) : HP_ERR_OOM;
    if (st != HP_OK) {
        rc = fail(st);
        goto done;
    }
    if ((rc = print_grid(comms ? "schedule (compute_comms, taken verbatim; an empty cell is a bubble):"
                               : "compute order (PyTorch's pipeline_order; an empty cell is a bubble):", compute)))
        goto done;
    /* PyTorch stores the single-stage orders without bubbles (and lowers them so) */
    hp_pp_schedule_t *stored = NULL;
    const int single = name && hp_pp_kind_is_single_stage(kind);
    st = single ? hp_pp_drop_bubbles(compute, &stored) : HP_OK;
    if (st == HP_OK && !comms) st = hp_pp_add_send_recv(stored ? stored : compute, map, num_stages, &sr);
    hp_pp_schedule_free(stored);
    int steps = 0;
    if (st == HP_OK) st = hp_pp_simulate(comms ? compute : sr, map, num_stages, &sim, &steps);
    if (st != HP_OK) {
        if (sim) print_grid("work-in-progress simulated schedule:", sim);
        rc = fail(st);
        goto done;
    }
    if (lower) {
        st = hp_pp_lower(compute, num_stages, n, &low, NULL);
        if (st != HP_OK) {
            rc = fail(st);
            goto done;
        }
        if ((rc = print_grid("lowered (UNSHARD/RESHARD, REDUCE_GRAD, SEND/RECV; _prepare_schedule_with_comms):", low)))
            goto done;
    }
    if (comms)
        printf("simulated steps: %d (_simulate_comms_compute over the schedule as given; UNSHARD, RESHARD and "
               "REDUCE_GRAD one local step each)\n", steps);
    else
        printf("simulated steps: %d (_simulate_comms_compute over the compute order%s with _add_send_recv's "
               "SEND/RECV)\n", steps, single ? " without bubbles, as PyTorch stores it," : "");
    if (low) {
        int lsteps = 0;
        st = hp_pp_simulate(low, map, num_stages, NULL, &lsteps);
        if (st != HP_OK) {
            rc = fail(st);
            goto done;
        }
        printf("lowered simulated steps: %d (UNSHARD, RESHARD and REDUCE_GRAD one local step each)\n", lsteps);
    }
    hp_pp_timing_t t;
    st = hp_pp_timing(compute, num_stages, &t);
    if (st != HP_OK) {
        rc = fail(st);
        goto done;
    }
    printf("bubble fraction: %.4f (unit costs F = I = W = 1, B = 2, communication free: makespan %lld, busy %lld of "
           "%d x %lld)", t.bubble_fraction, (long long)t.makespan, (long long)t.busy, pp, (long long)t.makespan);
    if (kind == HP_PP_GPIPE || kind == HP_PP_1F1B)
        printf("; (P-1)/(n+P-1) = %.4f", (double)(pp - 1) / (n + pp - 1));
    printf("\n");
    if (save) {
        st = hp_pp_schedule_save_csv(low ? low : compute, save);
        if (st != HP_OK) {
            rc = fail(st);
            goto done;
        }
        printf("wrote %s (%s schedule, PyTorch's _dump_csv format)\n", save, low ? "lowered" : "compute-only");
    }
done:
    free(map);
    hp_pp_schedule_free(compute);
    hp_pp_schedule_free(sr);
    hp_pp_schedule_free(sim);
    hp_pp_schedule_free(low);
    return rc;
}
