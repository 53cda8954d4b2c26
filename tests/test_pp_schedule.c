// hp-test: ranks 1 timeout 60
/* The pipeline schedule layer against PyTorch (test/distributed/pipelining/test_schedule.py):
 * TestScheduleLowering (action parse round trip, unshard/reshard, reduce_grad, merge_bw,
 * send_recv with 11 and 24 simulated steps, the zb1p CSV with 113), TestScheduleCsv (DualPipeV
 * against dualpipev_4rank_10mb), TestValidateSchedule, ScheduleUtilTests (stage-to-rank
 * mappings), test_get_schedule_class, and TestSchedulePlan's (L, n, P) grid for Interleaved1F1B,
 * LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble and DualPipeV (whose refusals are
 * test_pipeline_order_for_v_schedules'): every generated order, its _add_send_recv lowering, its
 * simulated step count and its full lowering equal PyTorch's own output stored by
 * tools/golden/make_pp_golden.py (tests/data/pp_schedule_golden.txt), as do GPipe and 1F1B.
 * Plus the CSV form, the grid text, bubble fractions against (P-1)/(n+P-1), negative cases (a
 * missing RECV deadlocks, malformed actions are named) and the hp-pp-schedule tool. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hp_test.h"
#include "hyperparallel/pp_schedule.h"

/* ---- helpers ---------------------------------------------------------------------------- */

/* A schedule from one text per rank ("0F0 0F1 _ 0B0"; "_" = bubble). Aborts the test on a
 * parse error of the test's own text. */
static hp_pp_schedule_t *sched(int n_ranks, const char *const *rows) {
    hp_pp_schedule_t *s = NULL;
    HP_ASSERT(hp_pp_schedule_create(n_ranks, &s) == HP_OK);
    for (int r = 0; r < n_ranks; r++) HP_ASSERT_MSG(hp_pp_schedule_append_text(s, r, rows[r]) == HP_OK, "%s", hp_last_error());
    return s;
}

/* One rank's list as "0F0 _ 0B0" (bubbles as "_"). */
static const char *row_text(const hp_pp_schedule_t *s, int r, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < hp_pp_schedule_len(s, r) && n + 40 < cap; i++) {
        const hp_pp_action_t *a = hp_pp_schedule_at(s, r, i);
        if (i) buf[n++] = ' ';
        if (a) n += (size_t)hp_pp_action_format(a, buf + n, cap - n);
        else buf[n++] = '_';
        buf[n] = '\0';
    }
    return buf;
}

#define CHECK_ROW(s, r, expected)                                                                  \
    do {                                                                                           \
        char rb_[8192];                                                                            \
        row_text((s), (r), rb_, sizeof rb_);                                                       \
        HP_CHECK(strcmp(rb_, (expected)) == 0, "rank %d:\n   got      %s\n   expected %s", (r), rb_, (expected)); \
    } while (0)

static uint64_t fnv64(const char *t) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *t; t++) h = (h ^ (unsigned char)*t) * 0x100000001b3ULL;
    return h;
}

static uint64_t csv_hash(const hp_pp_schedule_t *s) {
    char *t = NULL;
    if (hp_pp_schedule_to_csv(s, &t) != HP_OK) return 0;
    uint64_t h = fnv64(t);
    free(t);
    return h;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    HP_ASSERT(f != NULL);
    fputs(text, f);
    fclose(f);
}

static void loop_map(int *m, int num_stages, int pp) {
    HP_ASSERT(hp_pp_stage_to_rank(HP_PP_STYLE_LOOP, pp, num_stages, m) == HP_OK);
}

/* ---- TestScheduleLowering.test_action_parse and malformed actions ------------------------ */
static void test_action_parse(void) {
    static const struct { const char *text; hp_pp_action_t ref; } cases[] = {
        {"1F0", {1, HP_PP_F, 0, 0, 0}},          {"2I1", {2, HP_PP_I, 1, 0, 0}},
        {"0W3", {0, HP_PP_W, 3, 0, 0}},          {"0B3", {0, HP_PP_B, 3, 0, 0}},
        {"1UNSHARD", {1, HP_PP_UNSHARD, HP_PP_NO_MB, 0, 0}}, {"3RESHARD", {3, HP_PP_RESHARD, HP_PP_NO_MB, 0, 0}},
        {"2SEND_B2", {2, HP_PP_SEND_B, 2, 0, 0}}, {"1RECV_F1", {1, HP_PP_RECV_F, 1, 0, 0}},
        /* beyond PyTorch's list: the other types */
        {"2SEND_F3", {2, HP_PP_SEND_F, 3, 0, 0}}, {"0RECV_B7", {0, HP_PP_RECV_B, 7, 0, 0}},
        {"0REDUCE_GRAD", {0, HP_PP_REDUCE_GRAD, HP_PP_NO_MB, 0, 0}}, {"12F345", {12, HP_PP_F, 345, 0, 0}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        hp_pp_action_t a = {-7, HP_PP_TYPE_COUNT, -7, 0, 0};
        int bub = -1;
        HP_CHECK_OK(hp_pp_action_parse(cases[k].text, NULL, &a, &bub));
        HP_CHECK(bub == 0 && a.stage == cases[k].ref.stage && a.type == cases[k].ref.type && a.mb == cases[k].ref.mb,
                 "%s -> (%d, %d, %d)", cases[k].text, a.stage, (int)a.type, a.mb);
        char buf[32];
        hp_pp_action_format(&a, buf, sizeof buf);
        HP_CHECK(strcmp(buf, cases[k].text) == 0, "round trip %s -> %s", cases[k].text, buf);
    }
    hp_pp_action_t a;
    int bub = 0;
    HP_CHECK_OK(hp_pp_action_parse("  1F0 \t", NULL, &a, &bub));
    HP_CHECK(a.stage == 1 && a.type == HP_PP_F && a.mb == 0 && !bub, "spaces are stripped (_Action.from_str)");
    HP_CHECK_OK(hp_pp_action_parse("   ", NULL, &a, &bub));
    HP_CHECK(bub == 1, "blank text is a bubble (None)");
    HP_CHECK(strcmp(hp_pp_type_name(HP_PP_REDUCE_GRAD), "REDUCE_GRAD") == 0 && hp_pp_type_name(HP_PP_TYPE_COUNT) == NULL,
             "type names");
    HP_CHECK(hp_pp_type_is_compute(HP_PP_W) && !hp_pp_type_is_compute(HP_PP_SEND_F), "is_compute_op");
    /* negative: each malformed text is rejected and named */
    static const struct { const char *text, *needle; hp_status_t st; } bad[] = {
        {"0X1", "'0X1' is not a pipeline action", HP_ERR_INVALID_ARG},
        {"F0", "'F0' is not a pipeline action", HP_ERR_INVALID_ARG},
        {"1F", "F needs a microbatch index, e.g. '1F0'", HP_ERR_INVALID_ARG},
        {"1UNSHARD3", "UNSHARD takes no microbatch index; write '1UNSHARD'", HP_ERR_INVALID_ARG},
        {"2BW0", "unexpected 'W0' after '2B'", HP_ERR_INVALID_ARG},   /* PyTorch's re.match reads "2B" */
        {"1F0x", "unexpected 'x' after '1F0'", HP_ERR_INVALID_ARG},
        {"1 F0", "'1 F0' is not a pipeline action", HP_ERR_INVALID_ARG},
        {"99999999F0", "stage index exceeds", HP_ERR_INVALID_ARG},
        {"0F99999999999", "microbatch index exceeds", HP_ERR_INVALID_ARG},
        {"(0F0;3F1)OVERLAP_F_B", "overlaps a forward and a full backward, got F and F", HP_ERR_INVALID_ARG},
        {"(0F0;3B1)OVERLAP", "expected '(F;B)OVERLAP_F_B'", HP_ERR_INVALID_ARG},
        {"(0F0 3B1)OVERLAP_F_B", "expected '(F;B)OVERLAP_F_B'", HP_ERR_INVALID_ARG},
        {"(0F0;3Q1)OVERLAP_F_B", "'3Q1' is not a pipeline action", HP_ERR_INVALID_ARG},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        HP_CHECK_ERR(hp_pp_action_parse(bad[k].text, NULL, &a, &bub), bad[k].st, bad[k].needle);
    HP_CHECK_ERR(hp_pp_action_parse("", "cell 3", &a, NULL), HP_ERR_INVALID_ARG, "cell 3: empty text is a bubble");
    /* OVERLAP_F_B: PyTorch's "(F;B)OVERLAP_F_B" round trip, its leaves, is_compute_op */
    HP_CHECK_OK(hp_pp_action_parse(" (0F7;7B3)OVERLAP_F_B ", NULL, &a, &bub));
    HP_CHECK(a.type == HP_PP_OVERLAP_F_B && a.stage == 0 && a.mb == 7 && a.sub_stage == 7 && a.sub_mb == 3,
             "overlap fields (%d %d %d %d)", a.stage, a.mb, a.sub_stage, a.sub_mb);
    char obuf[48];
    hp_pp_action_format(&a, obuf, sizeof obuf);
    HP_CHECK(strcmp(obuf, "(0F7;7B3)OVERLAP_F_B") == 0, "overlap round trip: %s", obuf);
    hp_pp_action_t lv[2];
    HP_CHECK(hp_pp_action_leaves(&a, lv) == 2 && lv[0].type == HP_PP_F && lv[0].stage == 0 && lv[0].mb == 7 &&
             lv[1].type == HP_PP_B && lv[1].stage == 7 && lv[1].mb == 3 && hp_pp_type_is_compute(HP_PP_OVERLAP_F_B),
             "overlap leaves");
    /* appending a bad struct is refused */
    hp_pp_schedule_t *s;
    HP_CHECK_OK(hp_pp_schedule_create(1, &s));
    hp_pp_action_t f_no_mb = {0, HP_PP_F, HP_PP_NO_MB, 0, 0}, neg = {-1, HP_PP_W, 0, 0, 0};
    HP_CHECK_ERR(hp_pp_schedule_append(s, 0, &f_no_mb), HP_ERR_INVALID_ARG, "F needs a microbatch");
    HP_CHECK_ERR(hp_pp_schedule_append(s, 0, &neg), HP_ERR_INVALID_ARG, "stage -1 outside");
    HP_CHECK_ERR(hp_pp_schedule_append(s, 1, NULL), HP_ERR_INVALID_ARG, "rank 1 outside [0, 1)");
    HP_CHECK_ERR(hp_pp_schedule_append_text(s, 0, "0F0 0Q1"), HP_ERR_INVALID_ARG, "rank 0, item 1 '0Q1'");
    hp_pp_schedule_free(s);
    HP_CHECK_ERR(hp_pp_schedule_create(0, &s), HP_ERR_INVALID_ARG, "n_ranks 0");
}

/* ---- test_unshard_reshard, test_reduce_grad, test_merge_bw --------------------------------- */
static void one_rank_pass(const char *in, const char *expected, int which) {
    const char *rows[] = {in};
    hp_pp_schedule_t *s = sched(1, rows), *o = NULL;
    hp_status_t st = which == 0 ? hp_pp_add_unshard_reshard(s, 3, &o) : which == 1 ? hp_pp_add_reduce_grad(s, 2, &o)
                                                                                   : hp_pp_merge_bw(s, &o);
    HP_CHECK_OK(st);
    if (o) CHECK_ROW(o, 0, expected);
    hp_pp_schedule_free(s);
    hp_pp_schedule_free(o);
}

static void test_local_passes(void) {
    one_rank_pass("0F0 0F1 _ 0B0 0B1", "0UNSHARD 0F0 0F1 0B0 0B1 0RESHARD", 0);
    one_rank_pass("0F0 0F1 1F0 1F1 1B0 1B1 0B0 0B1",
                  "0UNSHARD 1UNSHARD 0F0 0F1 1F0 1F1 1B0 1B1 1RESHARD 0B0 0B1 0RESHARD", 0);
    one_rank_pass("0F0 0F1 _ 0B0 0B1", "0F0 0F1 0B0 0B1 0REDUCE_GRAD", 1);
    one_rank_pass("0F0 0F1 1F0 1F1 1B0 1B1 0B0 0B1", "0F0 0F1 1F0 1F1 1B0 1B1 1REDUCE_GRAD 0B0 0B1 0REDUCE_GRAD", 1);
    one_rank_pass("0F0 0F1 0F2 0I0 0I1 0W0 0I2 0W2 0W1", "0F0 0F1 0F2 0I0 0I1 0W0 0B2 0W1", 2);
    one_rank_pass("0I0 _ _ 0W0 1I0 1W1", "0B0 1I0 1W1", 2);   /* bubbles skipped; other mb kept apart */
    one_rank_pass("0F0 1F0 1B0 1W0 1I0 1W0", "0F0 1F0 1B0 1W0 1REDUCE_GRAD 1I0 1W0", 1);   /* B and W both count */
    /* Interleaved1F1B pp 2, 4 microbatches, rank 0 with max_active_stages 2: PyTorch 2.15's
     * _add_unshard_reshard output (tools/golden/make_pp_golden.py's library) */
    hp_pp_schedule_t *g = NULL, *u = NULL;
    HP_CHECK_OK(hp_pp_generate(HP_PP_INTERLEAVED_1F1B, 2, 2, 4, &g));
    if (g) {
        CHECK_ROW(g, 0, "0F0 0F1 2F0 2F1 _ _ 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 _ 2B2 _ 2B3 _ 0B2 _ 0B3");
        CHECK_ROW(g, 1, "_ 1F0 1F1 _ 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 _ 1B2 _ 1B3");
        HP_CHECK_OK(hp_pp_add_unshard_reshard(g, 2, &u));
    }
    if (u) {
        CHECK_ROW(u, 0, "0UNSHARD 2UNSHARD 0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 2RESHARD 0B2 0B3 0RESHARD");
        CHECK_ROW(u, 1, "1UNSHARD 3UNSHARD 1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 3RESHARD 1B2 1B3 1RESHARD");
    }
    hp_pp_schedule_free(u);
    /* max_active_stages 1: every change of stage evicts the previous one */
    u = NULL;
    const char *one[] = {"0F0 1F0 0B0"};
    hp_pp_schedule_t *s1 = sched(1, one);
    HP_CHECK_OK(hp_pp_add_unshard_reshard(s1, 1, &u));
    if (u) CHECK_ROW(u, 0, "0UNSHARD 0F0 0RESHARD 1UNSHARD 1F0 1RESHARD 0UNSHARD 0B0 0RESHARD");
    hp_pp_schedule_t *keep = u;   /* a non-NULL out that the failing calls must clear */
    HP_CHECK_ERR(hp_pp_add_unshard_reshard(s1, 0, &u), HP_ERR_INVALID_ARG, "max_active_stages 0");
    HP_CHECK_ERR(hp_pp_add_reduce_grad(s1, 0, &u), HP_ERR_INVALID_ARG, "n_microbatches 0");
    HP_CHECK(u == NULL, "out cleared on error");
    hp_pp_schedule_free(keep);
    hp_pp_schedule_free(s1);
    hp_pp_schedule_free(g);
}

/* ---- test_send_recv (11 and 24 simulated steps) ------------------------------------------- */
static void send_recv_case(const char *name, int R, const char *const *compute, const char *const *comms,
                           const int *s2r, int num_stages, int steps_expected) {
    hp_pp_schedule_t *c = sched(R, compute), *o = NULL, *sim = NULL;
    HP_CHECK_OK(hp_pp_add_send_recv(c, s2r, num_stages, &o));
    for (int r = 0; o && r < R; r++) CHECK_ROW(o, r, comms[r]);
    int steps = -1;
    if (o) HP_CHECK_OK(hp_pp_simulate(o, s2r, num_stages, &sim, &steps));
    HP_CHECK(steps == steps_expected, "%s: %d simulated steps, PyTorch's test expects %d", name, steps, steps_expected);
    /* the simulated schedule holds every action once, bubbles where a rank waited */
    if (sim) HP_CHECK(hp_pp_schedule_count(sim) == hp_pp_schedule_count(o), "%s: simulated action count", name);
    hp_pp_schedule_free(c);
    hp_pp_schedule_free(o);
    hp_pp_schedule_free(sim);
}

static void test_send_recv(void) {
    const char *c1[] = {"0F0 0F1 _ 0B0 _ 0B1", "_ 1F0 1B0 1F1 1B1 _"};
    const char *o1[] = {"0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
                        "1RECV_F0 1RECV_F1 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1"};
    const int m1[] = {0, 1};
    send_recv_case("simple_2_rank_2_stage", 2, c1, o1, m1, 2, 11);
    const char *c2[] = {"0F0 0F1 _ 3F0 3B0 3F1 3B1 0B0 3W0 0B1 3W1 0W0 0W1",
                        "_ 1F0 2F0 1F1 2F1 2B0 1B0 2B1 1B1 2W0 2W1 1W0 1W1"};
    const char *o2[] = {"0F0 0SEND_F0 0F1 0SEND_F1 3RECV_F0 3F0 3B0 3SEND_B0 3RECV_F1 3F1 3B1 3SEND_B1 0RECV_B0 0B0 3W0 "
                        "0RECV_B1 0B1 3W1 0W0 0W1",
                        "1RECV_F0 1RECV_F1 1F0 2F0 2SEND_F0 1F1 2RECV_B0 2F1 2SEND_F1 2B0 2RECV_B1 1B0 1SEND_B0 2B1 1B1 "
                        "1SEND_B1 2W0 2W1 1W0 1W1"};
    int m2[4];
    HP_CHECK_OK(hp_pp_stage_to_rank(HP_PP_STYLE_V, 2, 4, m2));
    HP_CHECK(m2[0] == 0 && m2[1] == 1 && m2[2] == 1 && m2[3] == 0, "V mapping [0, 1, 1, 0]");
    send_recv_case("v_2_rank_4_stage", 2, c2, o2, m2, 4, 24);

    /* negative: a schedule with a missing RECV deadlocks in the simulator */
    const char *miss[] = {"0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
                          "1RECV_F0 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1"};
    hp_pp_schedule_t *d = sched(2, miss), *sim = NULL;
    int steps = -1;
    HP_CHECK_ERR(hp_pp_simulate(d, m1, 2, &sim, &steps), HP_ERR_INVALID_ARG, "Schedule is not progressing");
    HP_CHECK(strstr(hp_last_error(), "rank 1 next action 1F1 waits for 1RECV_F1 or 0F1 on rank 1") != NULL &&
             strstr(hp_last_error(), "rank 0 next action 0RECV_B1 waits for 1SEND_B1 on rank 1") != NULL,
             "the deadlock names what each rank waits for: %s", hp_last_error());
    HP_CHECK(steps == -1 && sim != NULL && hp_pp_schedule_len(sim, 1) > 0, "the WIP schedule comes back to show");
    if (sim) {
        char *grid = NULL;
        HP_CHECK_OK(hp_pp_format_grid(sim, -1, &grid));
        HP_CHECK(grid && strstr(grid, "1SEND_B0"), "WIP grid shows what ran");
        free(grid);
    }
    hp_pp_schedule_free(d);
    hp_pp_schedule_free(sim);
    /* a RECV ordered before what feeds its SEND also deadlocks */
    const char *order[] = {"0RECV_B0 0F0 0SEND_F0 0B0", "1RECV_F0 1F0 1B0 1SEND_B0"};
    d = sched(2, order);
    HP_CHECK_ERR(hp_pp_simulate(d, m1, 2, NULL, &steps), HP_ERR_INVALID_ARG, "rank 0 next action 0RECV_B0 waits for 1SEND_B0");
    hp_pp_schedule_free(d);
    /* _add_send_recv refuses a compute order that cannot make progress */
    const char *mal[] = {"0B0 0F0", "1F0 1B0"};
    d = sched(2, mal);
    hp_pp_schedule_t *o = NULL;
    HP_CHECK_ERR(hp_pp_add_send_recv(d, m1, 2, &o), HP_ERR_INVALID_ARG, "Malformed compute schedule, can't schedule sends/recvs");
    HP_CHECK(strstr(hp_last_error(), "rank 0 waits at 0B0") && strstr(hp_last_error(), "rank 1 waits at 1F0"),
             "both stuck ranks named: %s", hp_last_error());
    const int badmap[] = {0, 2};
    HP_CHECK_ERR(hp_pp_add_send_recv(d, badmap, 2, &o), HP_ERR_INVALID_ARG, "stage_to_rank[1] = 2 is not a rank");
    HP_CHECK_ERR(hp_pp_add_send_recv(d, m1, 1, &o), HP_ERR_INVALID_ARG, "names stage 1, but the schedule has num_stages 1");
    HP_CHECK(o == NULL, "no output on error");
    hp_pp_schedule_free(d);
}

/* ---- test_csv: zb1p_2rank_2stagep, 113 simulated steps -------------------------------------- */
/* PyTorch's test artifacts (BSD-3-Clause): test/distributed/pipelining/artifacts/
 * zb1p_2rank_2stagep_compute.csv and zb1p_2rank_2stagep_comms.csv, as data. */
static const char zb1p_compute[] =
    "0F0,0F1,2F0,,2F1,2I0,2W0,0F2,2I1,2W1,0F3,0I0,0W0,2F2,0I1,0W1,2F3,2I2,2W2,0F4,2I3,2W3,0F5,0I2,0W2,2F4,0I3,0W3,"
    "2F5,2I4,2W4,0F6,2I5,2W5,0F7,0I4,0W4,2F6,0I5,0W5,2F7,2I6,2W6,2I7,2W7,0I6,0W6,0I7,0W7\n"
    ",1F0,1F1,3F0,3I0,3F1,3I1,3W0,1F2,1I0,3W1,1F3,1I1,1W0,3F2,3I2,1W1,3F3,3I3,3W2,1F4,1I2,3W3,1F5,1I3,1W2,3F4,3I4,"
    "1W3,3F5,3I5,3W4,1F6,1I4,3W5,1F7,1I5,1W4,3F6,3I6,1W5,3F7,3I7,3W6,1I6,3W7,1I7,1W6,1W7\n";
static const char zb1p_comms[] =
    "0F0,0SEND_F0,2RECV_F0,0F1,0SEND_F1,2RECV_F1,2F0,2SEND_F0,2F1,2SEND_F1,2RECV_B0,2B0,2SEND_B0,0F2,0SEND_F2,"
    "2RECV_B1,2B1,2SEND_B1,0F3,0SEND_F3,2RECV_F2,0RECV_B0,0B0,2F2,2SEND_F2,2RECV_F3,0RECV_B1,0B1,2F3,2SEND_F3,"
    "2RECV_B2,2B2,2SEND_B2,0F4,0SEND_F4,2RECV_B3,2B3,2SEND_B3,0F5,0SEND_F5,2RECV_F4,0RECV_B2,0B2,2F4,2SEND_F4,"
    "2RECV_F5,0RECV_B3,0B3,2F5,2SEND_F5,2RECV_B4,2B4,2SEND_B4,0F6,0SEND_F6,2RECV_B5,2B5,2SEND_B5,0F7,0SEND_F7,"
    "2RECV_F6,0RECV_B4,0B4,2F6,2SEND_F6,2RECV_F7,0RECV_B5,0B5,2F7,2SEND_F7,2RECV_B6,2B6,2SEND_B6,2RECV_B7,2B7,"
    "2SEND_B7,0RECV_B6,0B6,0RECV_B7,0B7\n"
    "1RECV_F0,1F0,1SEND_F0,1RECV_F1,1F1,1SEND_F1,3RECV_F0,3F0,3RECV_F1,3I0,3SEND_B0,1RECV_B0,3F1,1RECV_F2,3I1,"
    "3SEND_B1,1RECV_B1,3W0,1RECV_F3,1F2,1SEND_F2,1I0,1SEND_B0,3W1,3RECV_F2,1F3,1SEND_F3,1I1,1SEND_B1,1W0,3RECV_F3,"
    "3F2,3I2,3SEND_B2,1RECV_B2,1W1,1RECV_F4,3F3,3I3,3SEND_B3,1RECV_B3,3W2,1RECV_F5,1F4,1SEND_F4,1I2,1SEND_B2,3W3,"
    "3RECV_F4,1F5,1SEND_F5,1I3,1SEND_B3,1W2,3RECV_F5,3F4,3I4,3SEND_B4,1RECV_B4,1W3,1RECV_F6,3F5,3I5,3SEND_B5,"
    "1RECV_B5,3W4,1RECV_F7,1F6,1SEND_F6,1I4,1SEND_B4,3W5,3RECV_F6,1F7,1SEND_F7,1I5,1SEND_B5,1W4,3RECV_F7,3F6,3I6,"
    "3SEND_B6,1RECV_B6,1W5,3F7,3I7,3SEND_B7,1RECV_B7,3W6,1I6,1SEND_B6,3W7,1I7,1SEND_B7,1W6,1W7\n";

/* A failed check naming, per rank, the first timestep where schedule got differs from want (the
 * detail of a failed hp_pp_schedule_equal); checks nothing when they agree. */
static void report_first_diffs(const hp_pp_schedule_t *got, const hp_pp_schedule_t *want, int ranks) {
    for (int r = 0; got && r < ranks; r++)
        for (int i = 0; i < hp_pp_schedule_len(want, r) && i < hp_pp_schedule_len(got, r); i++) {
            const hp_pp_action_t *x = hp_pp_schedule_at(got, r, i), *y = hp_pp_schedule_at(want, r, i);
            char a[48] = "_", b[48] = "_";
            if (x) hp_pp_action_format(x, a, sizeof a);
            if (y) hp_pp_action_format(y, b, sizeof b);
            if (strcmp(a, b) != 0) {
                HP_CHECK(0, "rank %d timestep %d: %s, expected %s", r, i, a, b);
                break;
            }
        }
}

static void test_csv_zb1p(void) {
    hp_pp_schedule_t *c = NULL, *ref = NULL, *m = NULL, *o = NULL;
    HP_CHECK_OK(hp_pp_schedule_from_csv(zb1p_compute, "zb1p_2rank_2stagep_compute.csv", &c));
    HP_CHECK_OK(hp_pp_schedule_from_csv(zb1p_comms, "zb1p_2rank_2stagep_comms.csv", &ref));
    if (!c || !ref) return;
    HP_CHECK(hp_pp_schedule_n_ranks(c) == 2 && hp_pp_schedule_at(c, 0, 3) == NULL && hp_pp_schedule_at(c, 1, 0) == NULL,
             "empty cells are bubbles");
    HP_CHECK_OK(hp_pp_validate(c, 2, 4, 8, NULL));
    HP_CHECK_OK(hp_pp_merge_bw(c, &m));
    int map[4];
    loop_map(map, 4, 2);
    if (m) HP_CHECK_OK(hp_pp_add_send_recv(m, map, 4, &o));
    HP_CHECK(o && hp_pp_schedule_equal(o, ref), "merge_bw + send_recv equals zb1p_2rank_2stagep_comms.csv");
    report_first_diffs(o, ref, 2);
    int steps = -1;
    if (o) HP_CHECK_OK(hp_pp_simulate(o, map, 4, NULL, &steps));
    HP_CHECK(steps == 113, "zb1p: %d simulated steps, PyTorch's test_csv expects 113", steps);
    hp_pp_schedule_free(c);
    hp_pp_schedule_free(ref);
    hp_pp_schedule_free(m);
    hp_pp_schedule_free(o);
}

/* ---- TestScheduleCsv.test_csv_compare: ScheduleDualPipeV against dualpipev_4rank_10mb ---------- */
/* PyTorch's regression artifact (BSD-3-Clause) test/distributed/pipelining/artifacts/
 * dualpipev_4rank_10mb.csv, as data: DualPipeV's compute order for pp 4, 2 stages per rank, 10
 * microbatches. */
static const char dualpipev_4rank_10mb[] =
    "0F0,0F1,0F2,0F3,0F4,0F5,0F6,7F0,7I0,7W0,7F1,7I1,7W1,7F2,7I2,7W2,7F3,(0F7;7B3)OVERLAP_F_B,"
    "(7F4;0B0)OVERLAP_F_B,(0F8;7B4)OVERLAP_F_B,(7F5;0B1)OVERLAP_F_B,(0F9;7B5)OVERLAP_F_B,"
    "(7F6;0B2)OVERLAP_F_B,7B6,(7F7;0B3)OVERLAP_F_B,7B7,(7F8;0B4)OVERLAP_F_B,7B8,(7F9;0B5)OVERLAP_F_B,7B9,"
    "0I6,0W6,0I7,0W7,0I8,0W8,0I9,0W9\n"
    "1F0,1F1,1F2,1F3,1F4,6F0,1F5,6F1,6I0,6W0,6F2,6I1,6W1,6F3,(1F6;6B2)OVERLAP_F_B,(6F4;1B0)OVERLAP_F_B,"
    "(1F7;6B3)OVERLAP_F_B,(6F5;1B1)OVERLAP_F_B,(1F8;6B4)OVERLAP_F_B,(6F6;1B2)OVERLAP_F_B,"
    "(1F9;6B5)OVERLAP_F_B,(6F7;1B3)OVERLAP_F_B,6B6,(6F8;1B4)OVERLAP_F_B,6B7,(6F9;1B5)OVERLAP_F_B,6B8,1B6,"
    "6I9,1I7,6W9,1I8,1W7,1I9,1W8,1W9\n"
    "2F0,2F1,2F2,5F0,2F3,5F1,2F4,5F2,5I0,5W0,5F3,(2F5;5B1)OVERLAP_F_B,(5F4;2B0)OVERLAP_F_B,"
    "(2F6;5B2)OVERLAP_F_B,(5F5;2B1)OVERLAP_F_B,(2F7;5B3)OVERLAP_F_B,(5F6;2B2)OVERLAP_F_B,"
    "(2F8;5B4)OVERLAP_F_B,(5F7;2B3)OVERLAP_F_B,(2F9;5B5)OVERLAP_F_B,(5F8;2B4)OVERLAP_F_B,5B6,"
    "(5F9;2B5)OVERLAP_F_B,5B7,2B6,5B8,2I7,5I9,2I8,2W7,2I9,5W9,2W8,2W9\n"
    "3F0,4F0,3F1,4F1,3F2,4F2,3F3,4F3,3F4,4B0,(4F4;3B0)OVERLAP_F_B,(3F5;4B1)OVERLAP_F_B,"
    "(4F5;3B1)OVERLAP_F_B,(3F6;4B2)OVERLAP_F_B,(4F6;3B2)OVERLAP_F_B,(3F7;4B3)OVERLAP_F_B,"
    "(4F7;3B3)OVERLAP_F_B,(3F8;4B4)OVERLAP_F_B,(4F8;3B4)OVERLAP_F_B,(3F9;4B5)OVERLAP_F_B,"
    "(4F9;3B5)OVERLAP_F_B,4B6,3B6,4B7,3B7,4I8,3I8,4I9,3I9,4W8,3W8,4W9,3W9\n";

static void test_csv_dualpipev(void) {
    hp_pp_schedule_t *ref = NULL, *g = NULL, *gd = NULL, *low = NULL;
    HP_CHECK_OK(hp_pp_schedule_from_csv(dualpipev_4rank_10mb, "dualpipev_4rank_10mb.csv", &ref));
    HP_CHECK_OK(hp_pp_generate(HP_PP_DUALPIPEV, 4, 2, 10, &g));
    if (!ref || !g) return;
    HP_CHECK_OK(hp_pp_drop_bubbles(g, &gd));
    HP_CHECK(gd && hp_pp_schedule_equal(gd, ref), "DualPipeV(pp 4, 10 microbatches) equals dualpipev_4rank_10mb.csv");
    for (int r = 0; gd && r < 4; r++)
        HP_CHECK(hp_pp_schedule_len(gd, r) == hp_pp_schedule_len(ref, r), "rank %d: %d actions, the CSV %d", r,
                 hp_pp_schedule_len(gd, r), hp_pp_schedule_len(ref, r));
    report_first_diffs(gd, ref, 4);
    /* the V mapping validates, lowers (comms around both halves of each overlap) and runs
     * without deadlock; REDUCE_GRAD counts the B inside an OVERLAP_F_B */
    int map[8], vmap[8], steps = -1;
    HP_CHECK_OK(hp_pp_validate(ref, 4, 8, 10, map));
    HP_ASSERT(hp_pp_stage_to_rank(HP_PP_STYLE_V, 4, 8, vmap) == HP_OK);
    HP_CHECK(memcmp(map, vmap, sizeof map) == 0, "the schedule's stage-to-rank mapping is the V mapping");
    HP_CHECK_OK(hp_pp_lower(ref, 8, 10, &low, NULL));
    if (low) HP_CHECK_OK(hp_pp_simulate(low, vmap, 8, NULL, &steps));
    int rg = 0, sends = 0;
    for (int r = 0; low && r < 4; r++)
        for (int i = 0; i < hp_pp_schedule_len(low, r); i++) {
            const hp_pp_action_t *x = hp_pp_schedule_at(low, r, i);
            rg += x->type == HP_PP_REDUCE_GRAD;
            sends += x->type == HP_PP_SEND_F || x->type == HP_PP_SEND_B;
        }
    /* per microbatch 7 forward hand-overs, of which 3 -> 4 stays on rank 3 (the V's tip): 6 SEND_F,
     * and 6 SEND_B the other way */
    HP_CHECK(rg == 8 && sends == 2 * 6 * 10 && steps > 0, "lowered DualPipeV: %d REDUCE_GRAD (8), %d sends (%d), "
             "%d simulated steps", rg, sends, 2 * 6 * 10, steps);
    /* the overlap costs F + B in the unit-cost timing; the bubble is below 1F1B's at the same size */
    hp_pp_timing_t t, t1;
    hp_pp_schedule_t *one = NULL;
    HP_CHECK_OK(hp_pp_timing(ref, 8, &t));
    HP_CHECK_OK(hp_pp_generate(HP_PP_1F1B, 4, 1, 10, &one));
    if (one) HP_CHECK_OK(hp_pp_timing(one, 4, &t1));
    HP_CHECK(t.busy == 8 * 10 * 3 && t.bubble_fraction < t1.bubble_fraction, "DualPipeV busy %lld (240), bubble %.3f "
             "< 1F1B's %.3f", (long long)t.busy, t.bubble_fraction, t1.bubble_fraction);
    hp_pp_schedule_free(one);
    hp_pp_schedule_free(ref);
    hp_pp_schedule_free(g);
    hp_pp_schedule_free(gd);
    hp_pp_schedule_free(low);
}

/* ---- CSV form ------------------------------------------------------------------------------ */
static void test_csv_format(void) {
    const char *rows[] = {"0F0 _ 0B0", "_", "1UNSHARD 1RECV_F0 1F0"};
    hp_pp_schedule_t *s = sched(3, rows), *back = NULL;
    hp_pp_schedule_t *empty = NULL;
    HP_CHECK_OK(hp_pp_schedule_create(2, &empty));
    char *t = NULL;
    HP_CHECK_OK(hp_pp_schedule_to_csv(s, &t));
    /* csv.writer: "\r\n" rows, a lone empty field quoted (so the row is not blank) */
    HP_CHECK(t && strcmp(t, "0F0,,0B0\r\n\"\"\r\n1UNSHARD,1RECV_F0,1F0\r\n") == 0, "csv text: %s", t ? t : "");
    if (t) HP_CHECK_OK(hp_pp_schedule_from_csv(t, "mem", &back));
    HP_CHECK(back && hp_pp_schedule_equal(s, back), "to_csv / from_csv round trip");
    free(t);
    hp_pp_schedule_free(back);
    back = NULL;
    HP_CHECK_OK(hp_pp_schedule_to_csv(empty, &t));
    HP_CHECK(t && strcmp(t, "\r\n\r\n") == 0, "ranks without actions are blank rows");
    if (t) HP_CHECK_OK(hp_pp_schedule_from_csv(t, "mem", &back));
    HP_CHECK(back && hp_pp_schedule_equal(empty, back), "blank rows round trip");
    free(t);
    hp_pp_schedule_free(back);
    /* files; "\n" endings, quoted cells and spaces are read too */
    char path[] = "/tmp/hp_test_pp_XXXXXX";
    int fd = mkstemp(path);
    HP_CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        close(fd);
        HP_CHECK_OK(hp_pp_schedule_save_csv(s, path));
        back = NULL;
        HP_CHECK_OK(hp_pp_schedule_load_csv(path, &back));
        HP_CHECK(back && hp_pp_schedule_equal(s, back), "save_csv / load_csv round trip");
        hp_pp_schedule_free(back);
        put(path, " 0F0 ,\"0B0\"\n\n\"\"\n1F0,1B0");
        back = NULL;
        HP_CHECK_OK(hp_pp_schedule_load_csv(path, &back));
        if (back) {
            HP_CHECK(hp_pp_schedule_n_ranks(back) == 4, "4 rows");
            CHECK_ROW(back, 0, "0F0 0B0");
            CHECK_ROW(back, 1, "");
            CHECK_ROW(back, 2, "_");
            CHECK_ROW(back, 3, "1F0 1B0");
        }
        hp_pp_schedule_free(back);
        /* a bad cell is named with file, line and cell */
        put(path, "0F0,0B0\n1F0,1Z0,1B0\n");
        back = NULL;
        char needle[256];
        snprintf(needle, sizeof needle, "%s:2: cell 2: '1Z0' is not a pipeline action", path);
        HP_CHECK_ERR(hp_pp_schedule_load_csv(path, &back), HP_ERR_FORMAT, needle);
        put(path, "");
        HP_CHECK_ERR(hp_pp_schedule_load_csv(path, &back), HP_ERR_FORMAT, "no rows");
        put(path, "0F0,\"0B0\n");
        HP_CHECK_ERR(hp_pp_schedule_load_csv(path, &back), HP_ERR_FORMAT, "unterminated quoted cell");
        HP_CHECK(back == NULL, "no schedule on error");
        remove(path);
        HP_CHECK_ERR(hp_pp_schedule_load_csv(path, &back), HP_ERR_IO, "cannot open the schedule CSV");
        HP_CHECK_ERR(hp_pp_schedule_save_csv(s, "/nonexistent-dir/x.csv"), HP_ERR_IO, "cannot create");
    }
    hp_pp_schedule_free(s);
    hp_pp_schedule_free(empty);
}

/* ---- _format_pipeline_order and TestValidateSchedule --------------------------------------- */
static void test_grid_and_validate(void) {
    const char *c1[] = {"0F0 0F1 _ 0B0 _ 0B1", "_ 1F0 1B0 1F1 1B1 _"};
    hp_pp_schedule_t *s = sched(2, c1);
    char *g = NULL;
    /* PyTorch's _format_pipeline_order of the same schedule, byte for byte */
    HP_CHECK_OK(hp_pp_format_grid(s, 2, &g));
    static const char grid2[] = "        Rank 0 Rank 1\nStep 0: 0F0          \nStep 1: 0F1    1F0   \nStep 2:        1B0"
                                "    <-- ERROR HERE\nStep 3: 0B0    1F1   \nStep 4:        1B1   \nStep 5: 0B1          \n";
    HP_CHECK(g && strcmp(g, grid2) == 0, "grid:\n%s", g ? g : "");
    free(g);
    int map[2] = {-5, -5};
    HP_CHECK_OK(hp_pp_validate(s, 2, 2, 2, map));
    HP_CHECK(map[0] == 0 && map[1] == 1, "stage_index_to_rank_mapping");
    hp_pp_schedule_free(s);

    /* test_valid_schedule */
    const char *v1[] = {"0F0 0B0", "1F0 1B0"}, *v2[] = {"0F0 0I0 0W0", "1F0 1I0 1W0"};
    s = sched(2, v1);
    HP_CHECK_OK(hp_pp_validate(s, 2, 2, 1, NULL));
    hp_pp_schedule_free(s);
    s = sched(2, v2);
    HP_CHECK_OK(hp_pp_validate(s, 2, 2, 1, NULL));
    hp_pp_schedule_free(s);
    /* B before F: PyTorch's message and grid, byte for byte */
    const char *bf[] = {"0F0 0B0", "1B0 1F0"};
    s = sched(2, bf);
    HP_CHECK_ERR(hp_pp_validate(s, 2, 2, 1, NULL), HP_ERR_INVALID_ARG, "Running Full Backward");
    static const char bf_msg[] = "Rank 1, step 0: Running Full Backward for stage 1, microbatch 0 without first running "
                                 "Forward\n\nFull pipeline schedule:\n        Rank 0 Rank 1\nStep 0: 0F0    1B0    <-- "
                                 "ERROR HERE\nStep 1: 0B0    1F0   \n";
    HP_CHECK(strcmp(hp_last_error(), bf_msg) == 0, "B before F message:\n%s", hp_last_error());
    hp_pp_schedule_free(s);
    /* test_invalid_schedule_missing_rank (rank 1's row NULL: a 1-rank schedule),
     * test_invalid_schedule_missing_action, the other rules, and Schedule1F1B's own numbering of
     * the last rank (it fails PyTorch's _validate_schedule) */
    static const struct { const char *r0, *r1; int n_mb; const char *needle; } bad[] = {
        {"0F0 0B0", NULL, 1, "Schedule has incorrect number of ranks - expected 2, actual 1"},
        {"0F0", "1F0", 1,
         "Invalid backward microbatches for stage 0: expected 1 total backwards, but got B=0, I=0, W=0"},
        {"0F0 0W0 0I0", "1F0 1I0 1W0", 1, "Rank 0, step 1: Running Backward Weight for stage 0, microbatch 0 without first running Backward Input"},
        {"0F0 0I1 0W0", "1F0 1I0 1W0", 1, "Running Backward Input for stage 0, microbatch 1 without first running Forward"},
        {"0F0 0B0 1F0", "1F0 1B0", 1, "Rank 1, step 0: Stage 1 is assigned to both rank 1 and rank 0"},
        {"0F0 0B0", "1F0 1B0", 2, "Got 1 F microbatches for stage 0, expected 2"},
        {"0F0 0F0 0B0 0B0", "1F0 1B0", 2, "Got 1 F microbatches for stage 0, expected 2"},   /* distinct microbatches */
        {"0F0 0I0", "1F0 1B0", 1, "Invalid backward microbatches for stage 0: I and W must have equal counts, but got I=1, W=0"},
        {"0F0 0F1 0B0 0I1 0W1 0B1", "1F0 1F1 1B0 1B1", 2, "expected 2 total backwards, but got B=2, I=1, W=1"},
        {"0F0 0B0", "1F0 1B0 2F0", 1, "Rank 1, step 2: action 2F0 names stage 2, but the schedule has 2 stages (0..1)"},
        {"0F0 0F1 0B0 0B1", "_ 1F1 1B0 1F2 1B1", 2,
         "Rank 1, step 2: Running Full Backward for stage 1, microbatch 0 without first running Forward"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const char *rows[] = {bad[k].r0, bad[k].r1};
        s = sched(bad[k].r1 ? 2 : 1, rows);
        HP_CHECK_ERR(hp_pp_validate(s, 2, 2, bad[k].n_mb, NULL), HP_ERR_INVALID_ARG, bad[k].needle);
        hp_pp_schedule_free(s);
    }
    /* a long schedule: the message keeps the rows around the error, marked */
    hp_pp_schedule_t *big = NULL;
    HP_CHECK_OK(hp_pp_generate(HP_PP_GPIPE, 4, 1, 64, &big));
    if (big) {
        hp_pp_action_t f = {3, HP_PP_B, 99, 0, 0};
        HP_CHECK_OK(hp_pp_schedule_append(big, 3, &f));
        int at = hp_pp_schedule_len(big, 3) - 1;
        char needle[160];
        snprintf(needle, sizeof needle, "Rank 3, step %d: Running Full Backward for stage 3, microbatch 99", at);
        HP_CHECK_ERR(hp_pp_validate(big, 4, 4, 64, NULL), HP_ERR_INVALID_ARG, needle);
        snprintf(needle, sizeof needle, "Step %d:", at);
        HP_CHECK(strstr(hp_last_error(), "<-- ERROR HERE") && strstr(hp_last_error(), needle) &&
                 strstr(hp_last_error(), "hp_pp_format_grid prints all") && strstr(hp_last_error(), "Rank 3"),
                 "windowed grid: %s", hp_last_error());
        hp_pp_schedule_free(big);
    }
}

/* ---- hp_pp_lower (_prepare_schedule_with_comms) --------------------------------------------- */
static void test_lower(void) {
    const char *c1[] = {"0F0 0F1 _ 0B0 _ 0B1", "_ 1F0 1B0 1F1 1B1 _"};
    hp_pp_schedule_t *s = sched(2, c1), *o = NULL;
    int map[2] = {-1, -1};
    HP_CHECK_OK(hp_pp_lower(s, 2, 2, &o, map));
    /* PyTorch 2.15: _add_unshard_reshard, _add_reduce_grad (WAIT_REDUCE_GRAD dropped), _add_send_recv */
    if (o) {
        CHECK_ROW(o, 0, "0UNSHARD 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 0REDUCE_GRAD 0RESHARD");
        CHECK_ROW(o, 1, "1UNSHARD 1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1B1 1SEND_B1 1REDUCE_GRAD 1RESHARD");
        int steps = 0;
        HP_CHECK_OK(hp_pp_simulate(o, map, 2, NULL, &steps));   /* FSDP and REDUCE_GRAD actions are local */
        /* an extension (PyTorch's simulator refuses UNSHARD): the local actions take one step each, the
         * first UNSHARD and the last REDUCE_GRAD / RESHARD in parallel on both ranks: 11 + 2 */
        HP_CHECK(steps == 13, "lowered simple schedule: %d simulated steps, expected 11 + 2", steps);
    }
    HP_CHECK(map[0] == 0 && map[1] == 1, "stage mapping from validation");
    hp_pp_schedule_free(o);
    o = NULL;
    hp_pp_schedule_free(s);
    const char *c2[] = {"0F0 0SEND_F0 0B0", "1F0 1B0"};
    s = sched(2, c2);
    HP_CHECK_ERR(hp_pp_lower(s, 2, 1, &o, NULL), HP_ERR_INVALID_ARG,
                 "Expected compute-only schedule but found communication action '0SEND_F0' at rank 0, position 1");
    hp_pp_schedule_free(s);
    const char *c3[] = {"0F0 0B0", "1B0 1F0"};
    s = sched(2, c3);
    HP_CHECK_ERR(hp_pp_lower(s, 2, 1, &o, NULL), HP_ERR_INVALID_ARG, "without first running Forward");
    HP_CHECK(o == NULL, "nothing lowered");
    hp_pp_schedule_free(s);
}

/* ---- ScheduleUtilTests.test_generate_stage_to_rank_mapping, test_get_schedule_class -------- */
static void test_mapping_and_names(void) {
    int m[16];
    static const struct { hp_pp_style_t style; int pp, n; int want[16]; } cases[] = {
        {HP_PP_STYLE_LOOP, 2, 2, {0, 1}},
        {HP_PP_STYLE_LOOP, 2, 4, {0, 1, 0, 1}},
        {HP_PP_STYLE_LOOP, 4, 8, {0, 1, 2, 3, 0, 1, 2, 3}},
        {HP_PP_STYLE_V, 2, 4, {0, 1, 1, 0}},
        {HP_PP_STYLE_V, 4, 12, {0, 1, 2, 3, 3, 2, 1, 0, 0, 1, 2, 3}},
        {HP_PP_STYLE_V, 4, 16, {0, 1, 2, 3, 3, 2, 1, 0, 0, 1, 2, 3, 3, 2, 1, 0}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        HP_CHECK_OK(hp_pp_stage_to_rank(cases[k].style, cases[k].pp, cases[k].n, m));
        HP_CHECK(memcmp(m, cases[k].want, (size_t)cases[k].n * sizeof(int)) == 0, "mapping case %zu", k);
    }
    HP_CHECK_ERR(hp_pp_stage_to_rank(HP_PP_STYLE_V, 5, 12, m), HP_ERR_INVALID_ARG,
                 "num_stages 12 must be evenly divisible by pp_size 5 for V schedules");
    hp_pp_kind_t k = HP_PP_KIND_COUNT;
    static const char *const names[] = {"1F1B", "1f1b", "Interleaved1F1B", "INTERLEAVED1F1B", "GPipe", "LoopedBFS"};
    static const hp_pp_kind_t kinds[] = {HP_PP_1F1B, HP_PP_1F1B, HP_PP_INTERLEAVED_1F1B, HP_PP_INTERLEAVED_1F1B,
                                         HP_PP_GPIPE, HP_PP_LOOPED_BFS};
    for (int i = 0; i < 6; i++) {
        HP_CHECK_OK(hp_pp_kind_from_name(names[i], &k));
        HP_CHECK(k == kinds[i], "%s", names[i]);
    }
    HP_CHECK(strcmp(hp_pp_kind_name(HP_PP_LOOPED_BFS), "LoopedBFS") == 0 && hp_pp_kind_is_single_stage(HP_PP_GPIPE) &&
             !hp_pp_kind_is_single_stage(HP_PP_INTERLEAVED_1F1B), "kind names");
    HP_CHECK_ERR(hp_pp_kind_from_name("ScheduleThatDoesNotExist", &k), HP_ERR_INVALID_ARG,
                 "Unknown schedule name 'ScheduleThatDoesNotExist'");
    HP_CHECK_ERR(hp_pp_kind_from_name("PipelineScheduleMulti", &k), HP_ERR_UNSUPPORTED, "base class");
    static const char *const zb_names[] = {"InterleavedZeroBubble", "zbvzerobubble", "DUALPIPEV"};
    static const hp_pp_kind_t zb_kinds[] = {HP_PP_INTERLEAVED_ZB, HP_PP_ZBV, HP_PP_DUALPIPEV};
    for (int i = 0; i < 3; i++) {
        HP_CHECK_OK(hp_pp_kind_from_name(zb_names[i], &k));
        HP_CHECK(k == zb_kinds[i] && hp_pp_kind_style(k) == (i ? HP_PP_STYLE_V : HP_PP_STYLE_LOOP), "%s", zb_names[i]);
    }
}

/* ---- generators: errors, the 1F1B deviation, bubble fractions --------------------------------- */
static void test_generators(void) {
    hp_pp_schedule_t *s = NULL;
    HP_CHECK_ERR(hp_pp_generate(HP_PP_1F1B, 4, 1, 3, &s), HP_ERR_INVALID_ARG,
                 "Number of microbatches (3) must be greater than or equal to the number of stages (4).");
    HP_CHECK_ERR(hp_pp_generate(HP_PP_INTERLEAVED_1F1B, 4, 2, 9, &s), HP_ERR_INVALID_ARG,
                 "Interleaved 1F1B requires the number of microbatches to be a multiple of the number of rounds (2), but got 9.");
    HP_CHECK_ERR(hp_pp_generate(HP_PP_GPIPE, 4, 2, 8, &s), HP_ERR_INVALID_ARG, "single-stage schedule");
    HP_CHECK_ERR(hp_pp_generate(HP_PP_LOOPED_BFS, 0, 2, 8, &s), HP_ERR_INVALID_ARG, "must all be >= 1");
    HP_CHECK_ERR(hp_pp_generate(HP_PP_LOOPED_BFS, 1024, 64, 1024, &s), HP_ERR_INVALID_ARG, "exceeds 2^24");
    HP_CHECK(s == NULL, "no schedule on error");

    /* GPipe / 1F1B exactly as PyTorch for pp 3, n 4 (before _add_reduce_grad) */
    HP_CHECK_OK(hp_pp_generate(HP_PP_GPIPE, 3, 1, 4, &s));
    if (s) {
        CHECK_ROW(s, 0, "0F0 0F1 0F2 0F3 _ _ _ _ _ _ 0B0 0B1 0B2 0B3");
        CHECK_ROW(s, 2, "_ _ 2F0 2F1 2F2 2F3 2B0 2B1 2B2 2B3");
    }
    hp_pp_schedule_free(s);
    HP_CHECK_OK(hp_pp_generate(HP_PP_1F1B, 3, 1, 4, &s));
    if (s) {
        CHECK_ROW(s, 0, "0F0 0F1 _ _ _ _ 0F2 0B0 0F3 0B1 _ 0B2 _ 0B3");
        CHECK_ROW(s, 1, "_ 1F0 _ _ 1F1 1B0 1F2 1B1 1F3 1B2 _ 1B3");
        /* PyTorch would write 2F1 2B0 2F2 2B1 ... 2F4: B0 before any F0 (see the header) */
        CHECK_ROW(s, 2, "_ _ 2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3");
    }
    hp_pp_schedule_free(s);

    /* bubble fraction (P-1)/(n+P-1) for GPipe and 1F1B, unit costs F = 1, B = 2 */
    for (int P = 1; P <= 8; P++)
        for (int n = 1; n <= 16; n++)
            for (int kind = HP_PP_GPIPE; kind <= HP_PP_1F1B; kind++) {
                if (kind == HP_PP_1F1B && n < P) continue;
                s = NULL;
                HP_CHECK_OK(hp_pp_generate((hp_pp_kind_t)kind, P, 1, n, &s));
                hp_pp_timing_t t = {0};
                if (s) HP_CHECK_OK(hp_pp_timing(s, P, &t));
                HP_CHECK(t.makespan == 3 * (n + P - 1) && t.busy == 3LL * n * P, "%s P=%d n=%d: makespan %lld busy %lld",
                         hp_pp_kind_name((hp_pp_kind_t)kind), P, n, (long long)t.makespan, (long long)t.busy);
                HP_CHECK_CLOSE(t.bubble_fraction, (double)(P - 1) / (n + P - 1), 1e-12, 1e-15);
                hp_pp_schedule_free(s);
            }
    /* interleaving shrinks the bubble: Megatron's (P-1)/(L*n + P-1) for n % P == 0 */
    for (int L = 1; L <= 4; L++) {
        s = NULL;
        HP_CHECK_OK(hp_pp_generate(HP_PP_INTERLEAVED_1F1B, 4, L, 8, &s));
        hp_pp_timing_t t = {0};
        if (s) HP_CHECK_OK(hp_pp_timing(s, 4 * L, &t));
        HP_CHECK_CLOSE(t.bubble_fraction, 3.0 / (L * 8 + 3), 1e-12, 1e-15);
        hp_pp_schedule_free(s);
    }
    /* the timing refuses a compute order whose input never comes */
    const char *dl[] = {"0B0 0F0", "1F0 1B0"};
    s = sched(2, dl);
    hp_pp_timing_t t;
    HP_CHECK_ERR(hp_pp_timing(s, 2, &t), HP_ERR_INVALID_ARG, "the compute schedule deadlocks: rank 0 waits at 0B0");
    hp_pp_schedule_free(s);
}

/* ---- TestSchedulePlan grid and the single-stage schedules against PyTorch's output ----------- */
/* Schedule1F1B's numbering: the last rank's forwards 1..n (ours are 0..n-1). */
static hp_pp_schedule_t *pytorch_1f1b_numbering(const hp_pp_schedule_t *s) {
    const int R = hp_pp_schedule_n_ranks(s);
    hp_pp_schedule_t *o;
    HP_ASSERT(hp_pp_schedule_create(R, &o) == HP_OK);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < hp_pp_schedule_len(s, r); i++) {
            const hp_pp_action_t *a = hp_pp_schedule_at(s, r, i);
            hp_pp_action_t b = a ? *a : (hp_pp_action_t){0};
            if (a && r == R - 1 && a->type == HP_PP_F) b.mb++;
            HP_ASSERT(hp_pp_schedule_append(o, r, a ? &b : NULL) == HP_OK);
        }
    return o;
}

static void test_golden(void) {
    const char *src = getenv("HP_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/pp_schedule_golden.txt", src ? src : "..");
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("SKIP: %s not found (ctest sets HP_SOURCE_DIR)\n", path);
        return;
    }
    char line[512];
    int cases = 0, errors = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char kindname[32], order_h[32] = "", sr_h[32] = "", low_h[32] = "";
        int L, n, P, steps = -2;
        int got = sscanf(line, "%31s %d %d %d order=%31s send_recv=%31s steps=%d lowered=%31s", kindname, &L, &n, &P,
                         order_h, sr_h, &steps, low_h);
        HP_CHECK(got == 8 || (got == 4 && strstr(line, " error")), "golden line: %s", line);
        hp_pp_kind_t kind;
        HP_CHECK_OK(hp_pp_kind_from_name(strcmp(kindname, "interleaved1f1b") == 0 ? "Interleaved1F1B" : kindname, &kind));
        hp_pp_schedule_t *s = NULL;
        hp_status_t st = hp_pp_generate(kind, P, L, n, &s);
        if (got == 4) {   /* PyTorch's constructor raises: so must we */
            HP_CHECK(st == HP_ERR_INVALID_ARG, "%s L=%d n=%d P=%d: PyTorch refuses, we return %s", kindname, L, n, P,
                     hp_status_string(st));
            errors++;
            hp_pp_schedule_free(s);
            continue;
        }
        HP_CHECK(st == HP_OK, "%s L=%d n=%d P=%d: %s", kindname, L, n, P, hp_last_error());
        if (!s) continue;
        cases++;
        const int S = L * P;
        int *map = malloc((size_t)S * sizeof *map);
        HP_ASSERT(hp_pp_stage_to_rank(hp_pp_kind_style(kind), P, S, map) == HP_OK);
        HP_CHECK_OK(hp_pp_validate(s, P, S, n, NULL));
        /* the compute order: the multi-stage pipeline_order as is; the single-stage ones as stored
         * (after _add_reduce_grad, bubbles dropped), 1F1B's last rank numbered as PyTorch does */
        hp_pp_schedule_t *ord = NULL, *compute = NULL, *sr = NULL, *low = NULL;
        if (hp_pp_kind_is_single_stage(kind)) {
            hp_pp_schedule_t *q = kind == HP_PP_1F1B ? pytorch_1f1b_numbering(s) : NULL;
            HP_CHECK_OK(hp_pp_add_reduce_grad(q ? q : s, n, &ord));
            hp_pp_schedule_free(q);
            HP_CHECK_OK(hp_pp_drop_bubbles(s, &compute));   /* PyTorch lowers the stored order: no bubbles */
        } else {
            HP_CHECK_OK(hp_pp_schedule_copy(s, &ord));
            HP_CHECK_OK(hp_pp_schedule_copy(s, &compute));
        }
        char want[20];
        snprintf(want, sizeof want, "%016llx", (unsigned long long)(ord ? csv_hash(ord) : 0));
        HP_CHECK(strcmp(want, order_h) == 0, "%s L=%d n=%d P=%d: compute order differs from PyTorch's", kindname, L, n, P);
        int sim_steps = -1;
        if (compute) HP_CHECK_OK(hp_pp_add_send_recv(compute, map, S, &sr));
        if (sr) {
            snprintf(want, sizeof want, "%016llx", (unsigned long long)csv_hash(sr));
            HP_CHECK(strcmp(want, sr_h) == 0, "%s L=%d n=%d P=%d: _add_send_recv differs from PyTorch's", kindname, L,
                     n, P);
            HP_CHECK_OK(hp_pp_simulate(sr, map, S, NULL, &sim_steps));
        }
        if (kind == HP_PP_DUALPIPEV)   /* PyTorch's simulator does not model OVERLAP_F_B: ours must finish */
            HP_CHECK(steps == -1 && sim_steps > 0, "%s L=%d n=%d P=%d: %d simulated steps", kindname, L, n, P, sim_steps);
        else
            HP_CHECK(sim_steps == steps, "%s L=%d n=%d P=%d: %d simulated steps, PyTorch %d", kindname, L, n, P,
                     sim_steps, steps);
        int lmap[1024];
        HP_CHECK_OK(hp_pp_lower(s, S, n, &low, S <= 1024 ? lmap : NULL));
        if (low) {
            snprintf(want, sizeof want, "%016llx", (unsigned long long)csv_hash(low));
            HP_CHECK(strcmp(want, low_h) == 0, "%s L=%d n=%d P=%d: full lowering differs from PyTorch's", kindname, L,
                     n, P);
        }
        hp_pp_timing_t t;
        HP_CHECK_OK(hp_pp_timing(s, S, &t));
        if ((L == 2 && n == 8 && P == 4) || (L == 1 && n == 8 && P == 4) || (L == 2 && n == 10 && P == 4))
            printf("%-16s L=%d n=%-3d P=%d: %d simulated steps (PyTorch %d), bubble %.4f\n", hp_pp_kind_name(kind), L, n,
                   P, sim_steps, steps, t.bubble_fraction);
        hp_pp_schedule_free(ord);
        hp_pp_schedule_free(compute);
        hp_pp_schedule_free(sr);
        hp_pp_schedule_free(low);
        free(map);
        hp_pp_schedule_free(s);
    }
    fclose(f);
    HP_CHECK(cases == 152 && errors == 54, "golden: %d cases, %d error cases", cases, errors);
}


/* ---- tools/hp-pp-schedule ---------------------------------------------------------------- */

static char TOOL_OUT[1 << 17];

static int run_tool(const char *bin, const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1 </dev/null", bin, args);
    return hp_test_run_capture(cmd, TOOL_OUT, sizeof TOOL_OUT);
}

#define EXPECT_TOOL(args, rc_want, needle)                                                                    \
    do {                                                                                                      \
        int rc_ = run_tool(bin, args);                                                                        \
        HP_CHECK(rc_ == (rc_want) && strstr(TOOL_OUT, needle) != NULL,                                        \
                 "hp-pp-schedule %s -> rc %d (want %d), output:\n%.3000s\nexpected to contain: %s", args, rc_, \
                 rc_want, TOOL_OUT, needle);                                                                  \
    } while (0)

/* The built tool `name` in bin; 0, with a SKIP line naming the part of this test, when it is
 * not built. */
static int find_tool(char *bin, size_t cap, const char *name, const char *part) {
    const char *build = getenv("HP_BUILD_DIR");
    snprintf(bin, cap, "%s/%s", build ? build : ".", name);
    if (access(bin, X_OK) == 0) return 1;
    printf("SKIP: %s not built (%s)\n", bin, part);
    return 0;
}

static void test_tool(void) {
    char bin[1024];
    if (!find_tool(bin, sizeof bin, "hp-pp-schedule", "the tool part of this test")) return;
    EXPECT_TOOL("--schedule 1F1B --pp 4 --microbatches 8", 0, "simulated steps: 61 ");
    HP_CHECK(strstr(TOOL_OUT, "bubble fraction: 0.2727") && strstr(TOOL_OUT, "(P-1)/(n+P-1) = 0.2727") &&
             strstr(TOOL_OUT, "Step 24: 0B7") && strstr(TOOL_OUT, "         Rank 0  Rank 1  Rank 2  Rank 3"),
             "1F1B table and bubble:\n%.3000s", TOOL_OUT);
    EXPECT_TOOL("--schedule gpipe --pp 4 --microbatches 8", 0, "simulated steps: 56 ");
    EXPECT_TOOL("--schedule interleaved1f1b --pp 4 --microbatches 8 --stages-per-rank 2 --lower", 0,
                "simulated steps: 149 ");
    HP_CHECK(strstr(TOOL_OUT, "0UNSHARD") && strstr(TOOL_OUT, "4REDUCE_GRAD") && strstr(TOOL_OUT, "0SEND_F0") &&
             strstr(TOOL_OUT, "lowered simulated steps:") && strstr(TOOL_OUT, "bubble fraction: 0.1579"),
             "lowered table:\n%.2000s", TOOL_OUT);
    char csv[] = "/tmp/hp_test_pp_tool_XXXXXX";
    int fd = mkstemp(csv);
    HP_CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        close(fd);
        char args[1200];
        snprintf(args, sizeof args, "--schedule LoopedBFS --pp 4 --microbatches 4 --save-csv %s", csv);
        EXPECT_TOOL(args, 0, "simulated steps: 81 ");
        snprintf(args, sizeof args, "--csv %s", csv);   /* read back: same schedule, n inferred */
        EXPECT_TOOL(args, 0, "4 ranks, 8 stages, 4 microbatches");
        HP_CHECK(strstr(TOOL_OUT, "simulated steps: 81 "), "CSV round trip simulates the same:\n%.2000s", TOOL_OUT);
        snprintf(args, sizeof args, "--schedule LoopedBFS --pp 4 --microbatches 4 --lower --save-csv %s", csv);
        EXPECT_TOOL(args, 0, "lowered simulated steps: ");
        char want[128];
        const char *ls = strstr(TOOL_OUT, "lowered simulated steps: ");
        snprintf(want, sizeof want, "simulated steps: %d (", ls ? atoi(ls + 25) : -1);
        snprintf(args, sizeof args, "--csv %s", csv);   /* a lowered CSV is taken verbatim (compute_comms) */
        EXPECT_TOOL(args, 0, want);
        HP_CHECK(strstr(TOOL_OUT, "compute_comms, taken verbatim"), "format compute_comms:\n%.2000s", TOOL_OUT);
        snprintf(args, sizeof args, "--csv %s --lower", csv);
        EXPECT_TOOL(args, 2, "--lower needs a compute-only schedule");
        snprintf(args, sizeof args, "--csv %s --pp 2", csv);
        EXPECT_TOOL(args, 2, "--pp 2 but");
        put(csv, "0F0,2F0,2B0,0B0\n3F0,3B0,1F0,1B0\n");   /* valid per stage, but rank 1 waits for itself */
        snprintf(args, sizeof args, "--csv %s", csv);
        EXPECT_TOOL(args, 1, "Malformed compute schedule, can't schedule sends/recvs");
        put(csv, "0F0,0B0\n1F0,1BB0\n");
        char needle[1200];
        snprintf(needle, sizeof needle, "%s:2: cell 2: '1BB0' is not a pipeline action", csv);
        EXPECT_TOOL(args, 1, needle);
        put(csv, "0F0,0B0\n1B0,1F0\n");
        EXPECT_TOOL(args, 1, "<-- ERROR HERE");
        /* issue 28: a microbatch index past the bound is refused naming it (it once made the checks
         * ask 16 GB); the largest allowed index still loads */
        put(csv, "0F2147483646,0B2147483646\n");
        snprintf(needle, sizeof needle, "%s:1: cell 1: '0F2147483646': microbatch index exceeds 1048575 (HP_PP_MAX_MB: "
                 "at most 2^20 microbatches per step)", csv);
        EXPECT_TOOL(args, 1, needle);
        put(csv, "0F1048576\n");
        EXPECT_TOOL(args, 1, "'0F1048576': microbatch index exceeds 1048575");
        hp_pp_schedule_t *big = NULL;
        HP_CHECK_OK(hp_pp_schedule_from_csv("0F1048575,0B1048575\n", "max.csv", &big));
        HP_CHECK(big && hp_pp_schedule_at(big, 0, 0)->mb == HP_PP_MAX_MB, "the largest microbatch index loads");
        hp_pp_schedule_free(big);
        remove(csv);
        EXPECT_TOOL(args, 1, "cannot open the schedule CSV");
    }
    /* bad flags and numbers: exit 2, the flag, the value and the range named */
    static const struct {
        const char *args;
        int rc;
        const char *needle;
    } flags[] = {
        {"--schedule 1F1B --pp 0 --microbatches 8", 2, "--pp expects an integer in [1, 1024], got '0'"},
        {"--schedule 1F1B --pp 4 --microbatches lots", 2, "--microbatches expects an integer, got 'lots'"},
        {"--schedule 1F1B --pp 4 --microbatchs 8", 2, "did you mean '--microbatches'"},
        {"--schedule ZBV --pp 4 --microbatches 8", 2, "Unknown schedule name 'ZBV'"},
        {"--schedule DualPipeV --pp 4 --microbatches 8", 0, "V mapping: rank r holds stages r and 7 - r"},
        {"--schedule DualPipeV --pp 4 --microbatches 6", 2, "DualPipeV requires at least as many microbatches"},
        {"--schedule ZBVZeroBubble --pp 2 --microbatches 4 --stages-per-rank 3", 2,
         "ZBV requires exactly 2 stages per rank, but got 3"},
        {"--schedule 1F1B --pp 4 --microbatches 2", 2, "Number of microbatches (2) must be greater than or equal"},
        {"--schedule GPipe --pp 2 --microbatches 2 --stages-per-rank 2", 2, "single-stage schedule"},
        {"--schedule Interleaved1F1B --pp 4 --microbatches 9", 2, "multiple of the number of rounds (2)"},
        {"--schedule 1F1B --pp 4", 2, "--schedule needs --pp and --microbatches"},
        {"--pp 4", 2, "give exactly one of --schedule NAME and --csv FILE"},
        {"--schedule 1F1B --pp 4 --microbatches 8 extra", 2, "unexpected argument 'extra'"},
        {"--schedule", 2, "--schedule"},
        {"--help", 0, "usage: hp-pp-schedule"},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        EXPECT_TOOL(flags[i].args, flags[i].rc, flags[i].needle);
}

/* ---- tools/hp-pp-timeline ------------------------------------------------------------------ */
static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static int slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
    return (int)n;
}

static void test_timeline_tool(void) {
    char bin[1024];
    if (!find_tool(bin, sizeof bin, "hp-pp-timeline", "the timeline tool part of this test")) return;
    char dir[] = "/tmp/hp_test_pp_timeline_XXXXXX";
    HP_ASSERT(mkdtemp(dir) != NULL);
    static char svg[1 << 18];
    char args[2048], out[1100], run[1100];
    /* the simulator alone: one rect per compute action (DualPipeV pp 2 n 4: 4 stages x 4 F, B as
     * I + W or B or inside an overlap, the overlaps drawn as two half rects) and the bubble */
    snprintf(out, sizeof out, "%s/dpv.svg", dir);
    snprintf(args, sizeof args, "--schedule DualPipeV --pp 2 --microbatches 4 -o %s", out);
    EXPECT_TOOL(args, 0, "simulated bubble");
    hp_pp_schedule_t *g = NULL;
    hp_pp_timing_t tm = {0};
    HP_CHECK_OK(hp_pp_generate(HP_PP_DUALPIPEV, 2, 2, 4, &g));
    if (g) HP_CHECK_OK(hp_pp_timing(g, 4, &tm));
    int n_compute = 0, n_overlap = 0;
    for (int r = 0; g && r < 2; r++)
        for (int i = 0; i < hp_pp_schedule_len(g, r); i++) {
            const hp_pp_action_t *a = hp_pp_schedule_at(g, r, i);
            n_compute += a != NULL;
            n_overlap += a && a->type == HP_PP_OVERLAP_F_B;
        }
    hp_pp_schedule_free(g);
    char want[64];
    snprintf(want, sizeof want, "bubble %.3f", tm.bubble_fraction);
    HP_CHECK(slurp(out, svg, sizeof svg) > 0 && strstr(svg, want) && strstr(svg, "<svg") && strstr(svg, "</svg>"),
             "DualPipeV SVG with '%s'", want);
    /* 2 background rects + 6 legend swatches + per rank a row background; compute rects carry a
     * stroke, an overlap's halves sit in a <g> */
    HP_CHECK(count_of(svg, "stroke-width=\"0.5\"") == n_compute - n_overlap && count_of(svg, "<g><title>") == n_overlap &&
                 n_overlap > 0,
             "DualPipeV SVG: %d plain compute rects (want %d), %d overlaps (want %d)",
             count_of(svg, "stroke-width=\"0.5\""), n_compute - n_overlap, count_of(svg, "<g><title>"), n_overlap);
    /* a recorded run: 2 ranks, one micro-batch, 5 ms; compute 1 + 2 + 1 + 1 = 5 of 10 rank-ms -> 0.500
     * measured; the simulator: F F B B with B = 2 -> makespan 6, busy 6 of 12 -> 0.500 */
    snprintf(run, sizeof run, "%s/run.csv", dir);
    put(run, "# hp-pp timeline: schedule=1F1B pp=2 stages=2 microbatches=1\nrank,action,start_ms,end_ms\n"
             "0,0UNSHARD,0,0\n0,0F0,0,1\n0,0SEND_F0,1,1.1\n0,0RECV_B0,1.1,3\n0,0B0,3,5\n"
             "1,1RECV_F0,0,1\n1,1F0,1,2\n1,1B0,2,3\n1,1SEND_B0,3,3.1\n");
    snprintf(args, sizeof args, "%s", run);
    EXPECT_TOOL(args, 0, "1F1B: measured bubble 0.500, simulated 0.500");
    snprintf(out, sizeof out, "%s/run.svg", dir);
    HP_CHECK(slurp(out, svg, sizeof svg) > 0 && strstr(svg, "measured run: bubble 0.500") &&
                 strstr(svg, "step 5.00 ms") && count_of(svg, "height=\"4\"") == 5,
             "run SVG: measured panel, 5 thin communication / FSDP bars");
    /* malformed inputs are named with file and line; a missing file and a missing header */
    static const char *const bad_runs[4][2] = {
        {"# hp-pp timeline: schedule=1F1B pp=2 stages=2 microbatches=1\n0,0F0,0,1\n0,0X0,1,2\n", "run.csv:3"},
        {"# hp-pp timeline: schedule=1F1B pp=1 stages=2 microbatches=1\n0,0F0,0,1\n1,1F0,1,2\n",
         "actions of rank 1, but the header says pp=1"},
        {"0,0F0,0,1\n", "no '# hp-pp timeline:"},
        {"# hp-pp timeline: schedule=1F1B pp=1 stages=1 microbatches=1\n0,0F0,2,1\n", "start 2.000 <= end 1.000"},
    };
    for (int i = 0; i < 4; i++) {
        put(run, bad_runs[i][0]);
        EXPECT_TOOL(args, 1, bad_runs[i][1]);
    }
    remove(run);
    EXPECT_TOOL(args, 1, "cannot open the timeline");
    EXPECT_TOOL("--schedule ZBV --pp 2 --microbatches 4", 2, "Unknown schedule name 'ZBV'");
    EXPECT_TOOL("--schedule 1F1B --pp 2", 2, "--schedule needs --pp and --microbatches");
    snprintf(out, sizeof out, "%s/dpv.svg", dir);
    remove(out);
    snprintf(out, sizeof out, "%s/run.svg", dir);
    remove(out);
    HP_CHECK(rmdir(dir) == 0, "the tool wrote only the files named (%s is empty)", dir);
}

/* HyperParallel's ScheduleMPipeTranspose (PyTorch has none, so no golden lines): checked by its
 * rules against Interleaved1F1B's order, then lowered, simulated and timed. */
static int same_action(const hp_pp_action_t *a, int stage, hp_pp_type_t t, int mb) {
    return a && a->stage == stage && a->type == t && a->mb == mb;
}
static void test_mpipe(void) {
    static const int cases[][3] = {{2, 2, 2}, {2, 4, 2}, {2, 8, 2}, {3, 3, 2}, {4, 4, 2}, {4, 8, 2}, {4, 2, 2}, {2, 4, 3}};
    hp_pp_kind_t k = HP_PP_KIND_COUNT;
    HP_CHECK_OK(hp_pp_kind_from_name("mpipetranspose", &k));
    HP_CHECK(k == HP_PP_MPIPE && strcmp(hp_pp_kind_name(k), "MPipeTranspose") == 0 && hp_pp_kind_style(k) == HP_PP_STYLE_LOOP,
             "MPipeTranspose's name and mapping");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int P = cases[c][0], n = cases[c][1], L = cases[c][2], S = P * L, NT = P < n ? P : n;
        hp_pp_schedule_t *mp = NULL, *base = NULL, *low = NULL, *sim = NULL, *back = NULL;
        HP_CHECK_OK(hp_pp_generate(HP_PP_MPIPE, P, L, n, &mp));
        HP_CHECK_OK(hp_pp_generate(HP_PP_INTERLEAVED_1F1B, P, L, n, &base));
        if (!mp || !base) continue;
        /* the rules: Interleaved1F1B's slots, rank m's first bubble -> 0MPIPE_F{m}, stage 0's F / B of
         * m -> TRANSPOSE_F / TRANSPOSE_B, for m in 1 .. NT-1; nothing else changes */
        int n_mf = 0, n_tf = 0, n_tb = 0, bad = 0;
        for (int r = 0; r < P; r++) {
            bad += hp_pp_schedule_len(mp, r) != hp_pp_schedule_len(base, r);
            for (int i = 0; i < hp_pp_schedule_len(base, r) && i < hp_pp_schedule_len(mp, r); i++) {
                const hp_pp_action_t *a = hp_pp_schedule_at(mp, r, i), *b = hp_pp_schedule_at(base, r, i);
                if (r >= 1 && r < NT && i == 0) {
                    bad += b != NULL || !same_action(a, 0, HP_PP_MPIPE_F, r);
                    n_mf += a && a->type == HP_PP_MPIPE_F;
                } else if (b && b->stage == 0 && b->mb >= 1 && b->mb < NT) {
                    bad += !same_action(a, 0, b->type == HP_PP_F ? HP_PP_TRANSPOSE_F : HP_PP_TRANSPOSE_B, b->mb);
                    n_tf += a && a->type == HP_PP_TRANSPOSE_F;
                    n_tb += a && a->type == HP_PP_TRANSPOSE_B;
                } else {
                    bad += (a == NULL) != (b == NULL) || (a && !same_action(a, b->stage, b->type, b->mb));
                }
            }
        }
        HP_CHECK(bad == 0 && n_mf == NT - 1 && n_tf == NT - 1 && n_tb == NT - 1,
                 "MPipe pp %d n %d L %d: %d slots off the rules, %d MPIPE_F, %d TRANSPOSE_F, %d TRANSPOSE_B (expected %d)",
                 P, n, L, bad, n_mf, n_tf, n_tb, NT - 1);
        int map[16];
        HP_CHECK_OK(hp_pp_validate(mp, P, S, n, map));
        HP_CHECK(map[0] == 0, "stage 0 stays on rank 0 (the helpers' MPIPE_F own no stage)");
        HP_CHECK_OK(hp_pp_lower(mp, S, n, &low, map));
        if (low) {
            /* each helper sends right after its MPIPE_F; rank 0 receives before the TRANSPOSE_F */
            for (int m = 1; m < NT; m++) {
                int f = -1, snd = -1, rcv = -1, tf = -1;
                for (int i = 0; i < hp_pp_schedule_len(low, m); i++) {
                    const hp_pp_action_t *a = hp_pp_schedule_at(low, m, i);
                    if (same_action(a, 0, HP_PP_MPIPE_F, m)) f = i;
                    if (same_action(a, 0, HP_PP_MPIPE_SEND_F, m)) snd = i;
                    HP_CHECK(!(a && a->type == HP_PP_UNSHARD && a->stage == 0), "the replica is not unsharded as stage 0");
                }
                for (int i = 0; i < hp_pp_schedule_len(low, 0); i++) {
                    const hp_pp_action_t *a = hp_pp_schedule_at(low, 0, i);
                    if (same_action(a, 0, HP_PP_MPIPE_RECV_F, m)) rcv = i;
                    if (same_action(a, 0, HP_PP_TRANSPOSE_F, m)) tf = i;
                }
                HP_CHECK(f >= 0 && snd == f + 1 && rcv >= 0 && tf > rcv, "MPipe pp %d n %d mb %d: MPIPE_F at %d, "
                         "MPIPE_SEND_F at %d, MPIPE_RECV_F at %d, TRANSPOSE_F at %d", P, n, m, f, snd, rcv, tf);
            }
            int steps = 0;
            HP_CHECK_OK(hp_pp_simulate(low, map, S, &sim, &steps));
            HP_CHECK(steps > 0, "simulated");
            char *csv = NULL;   /* the text form round-trips */
            HP_CHECK_OK(hp_pp_schedule_to_csv(low, &csv));
            if (csv) HP_CHECK_OK(hp_pp_schedule_from_csv(csv, "mpipe.csv", &back));
            HP_CHECK(back && hp_pp_schedule_equal(back, low), "MPipe's lowered CSV round-trips");
            free(csv);
        }
        /* unit costs: the helpers' forwards fill idle slots; stage 0's rank keeps its whole F
         * (a unit cost cannot express that only the part after the preprocess remains), so the
         * makespan equals Interleaved1F1B's and the bubble drops by exactly the added busy slots */
        hp_pp_timing_t tm, tb;
        HP_CHECK_OK(hp_pp_timing(mp, S, &tm));
        HP_CHECK_OK(hp_pp_timing(base, S, &tb));
        HP_CHECK(tm.makespan == tb.makespan && tm.busy == tb.busy + NT - 1 &&
                 (NT == 1 || tm.bubble_fraction < tb.bubble_fraction),
                 "MPipe pp %d n %d: makespan %lld vs %lld, busy %lld vs %lld, bubble %.4f vs %.4f", P, n,
                 (long long)tm.makespan, (long long)tb.makespan, (long long)tm.busy, (long long)tb.busy,
                 tm.bubble_fraction, tb.bubble_fraction);
        hp_pp_schedule_free(mp);
        hp_pp_schedule_free(base);
        hp_pp_schedule_free(low);
        hp_pp_schedule_free(sim);
        hp_pp_schedule_free(back);
    }
    /* the five actions' text round-trips */
    static const char *const texts[] = {"0MPIPE_F1", "0MPIPE_SEND_F1", "0MPIPE_RECV_F3", "0TRANSPOSE_F1", "0TRANSPOSE_B2"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        hp_pp_action_t a;
        char t[64];
        HP_CHECK_OK(hp_pp_action_parse(texts[i], NULL, &a, NULL));
        hp_pp_action_format(&a, t, sizeof t);
        HP_CHECK(strcmp(t, texts[i]) == 0 && a.stage == 0, "'%s' round-trips as '%s'", texts[i], t);
    }
    HP_CHECK(hp_pp_type_is_compute(HP_PP_MPIPE_F) && hp_pp_type_is_compute(HP_PP_TRANSPOSE_B) &&
             !hp_pp_type_is_compute(HP_PP_MPIPE_SEND_F), "MPipe compute / communication types");
    /* negatives: a TRANSPOSE_F without a helper's MPIPE_F, an MPIPE_F on stage 0's rank, a lowered
     * list without its MPIPE_RECV_F (deadlocks) */
    {
        const char *rows1[] = {"0F0 0TRANSPOSE_F1 0B0 0TRANSPOSE_B1", "1F0 1B0 1F1 1B1"};
        hp_pp_schedule_t *x = sched(2, rows1);
        HP_CHECK_ERR(hp_pp_validate(x, 2, 2, 2, NULL), HP_ERR_INVALID_ARG, "has 0 MPIPE_F and 1 TRANSPOSE_F");
        hp_pp_schedule_free(x);
        const char *rows2[] = {"0F0 0MPIPE_F1 0TRANSPOSE_F1 0B0 0TRANSPOSE_B1", "1F0 1B0 1F1 1B1"};
        x = sched(2, rows2);
        HP_CHECK_ERR(hp_pp_validate(x, 2, 2, 2, NULL), HP_ERR_INVALID_ARG, "on stage 0's own rank");
        hp_pp_schedule_free(x);
        const char *rows3[] = {"0F0 0SEND_F0 0TRANSPOSE_F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0TRANSPOSE_B1",
                               "0MPIPE_F1 0MPIPE_SEND_F1 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"};
        x = sched(2, rows3);
        const int m2[2] = {0, 1};
        int steps = 0;
        HP_CHECK_ERR(hp_pp_simulate(x, m2, 2, NULL, &steps), HP_ERR_INVALID_ARG, "waits for 0MPIPE_RECV_F1");
        hp_pp_schedule_free(x);
        const char *rows4[] = {"0F0 0SEND_F0 0MPIPE_RECV_F1 0TRANSPOSE_F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0TRANSPOSE_B1",
                               "0MPIPE_F1 0MPIPE_SEND_F1 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"};
        x = sched(2, rows4);
        HP_CHECK_OK(hp_pp_simulate(x, m2, 2, NULL, &steps));
        hp_pp_schedule_free(x);
    }
}

int main(void) {
    test_action_parse();
    test_local_passes();
    test_send_recv();
    test_csv_zb1p();
    test_csv_dualpipev();
    test_csv_format();
    test_grid_and_validate();
    test_lower();
    test_mapping_and_names();
    test_generators();
    test_mpipe();
    test_golden();
    test_tool();
    test_timeline_tool();
    return hp_test_finish("test_pp_schedule");
}
