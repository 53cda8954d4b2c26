/* Pipeline parallel: TorchTitan's stage split over the model's units and the runtime that runs
 * one rank's lowered action list (PyTorch _PipelineScheduleRuntime._step_microbatches) on
 * stage models that hold only their units. One model protocol for a stage and the whole
 * model: the stage is an hp_model_t for its unit range, driven by hp_model_forward_range /
 * backward_*_range on caller-owned micro-batch contexts (docs/pp.md). */
#include "hyperparallel/pp.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- split -------------------------------------------------------------------------------- */

hp_status_t hp_pp_num_stages(int pp, int single_stage_schedule, int n_layers, int layers_per_stage, int w_in,
                             int w_out, int *num_stages) {
    *num_stages = 0;
    if (pp < 1) return hp_error(HP_ERR_INVALID_ARG, "parallelism.pipeline_parallel_degree %d must be >= 1", pp);
    if (w_in < 0 || w_out < 0)
        return hp_error(HP_ERR_INVALID_ARG, "parallelism.pipeline_parallel_first_stage_less_layers (%d) and "
                        "..._last_stage_less_layers (%d) must be >= 0", w_in, w_out);
    if (layers_per_stage <= 0) {
        *num_stages = pp * (single_stage_schedule ? 1 : 2);
        return HP_OK;
    }
    const int eff = n_layers + w_in + w_out;
    const int n = (eff + layers_per_stage - 1) / layers_per_stage;
    if (n % pp != 0)
        return hp_error(HP_ERR_INVALID_ARG, "parallelism.pipeline_parallel_layers_per_stage %d gives %d virtual stages "
                        "(ceil((%d layers + %d + %d) / %d)), which is not divisible by "
                        "parallelism.pipeline_parallel_degree %d; hint: choose layers_per_stage so that the stage "
                        "count is a multiple of %d", layers_per_stage, n, n_layers, w_in, w_out, layers_per_stage, pp,
                        pp);
    const int per_rank = n / pp;
    if (single_stage_schedule && per_rank != 1)
        return hp_error(HP_ERR_INVALID_ARG, "parallelism.pipeline_parallel_layers_per_stage %d gives %d stages per rank; "
                        "a single-stage schedule (GPipe, 1F1B) requires exactly 1 stage per rank; hint: use a looped "
                        "schedule (Interleaved1F1B, LoopedBFS) or layers_per_stage %d", layers_per_stage, per_rank,
                        (eff + pp - 1) / pp);
    if (!single_stage_schedule && per_rank < 2)
        return hp_error(HP_ERR_INVALID_ARG, "parallelism.pipeline_parallel_layers_per_stage %d gives %d stage per rank; "
                        "a multi-stage schedule requires at least 2 stages per rank; hint: lower layers_per_stage",
                        layers_per_stage, per_rank);
    *num_stages = n;
    return HP_OK;
}

hp_status_t hp_pp_split_layers(int n_layers, int num_stages, int w_in, int w_out, int *unit_lo) {
    if (num_stages < 1 || num_stages > HP_PP_MAX_STAGES)
        return hp_error(HP_ERR_INVALID_ARG, "pipeline split: %d stages; expected 1..%d", num_stages, HP_PP_MAX_STAGES);
    if (num_stages == 1) {
        unit_lo[0] = 0;
        unit_lo[1] = n_layers + 2;
        return HP_OK;
    }
    const int eff = n_layers + w_in + w_out;
    if (num_stages > eff)
        return hp_error(HP_ERR_INVALID_ARG, "pipeline split: number of stages (%d) cannot be greater than effective "
                        "layers (%d = %d layers + first_stage_less_layers %d + last_stage_less_layers %d); hint: "
                        "lower parallelism.pipeline_parallel_degree or use a single-stage schedule", num_stages, eff,
                        n_layers, w_in, w_out);
    const int per = eff / num_stages, extra = eff % num_stages;
    if (per == 0)
        return hp_error(HP_ERR_INVALID_ARG, "pipeline split: %d stages over %d effective layers would leave stages "
                        "empty", num_stages, eff);
    if (w_in > per || w_out > per)
        return hp_error(HP_ERR_INVALID_ARG, "pipeline split: parallelism.pipeline_parallel_first_stage_less_layers %d / "
                        "last_stage_less_layers %d exceed the minimum layers per stage (%d); hint: lower them or "
                        "use fewer stages", w_in, w_out, per);
    int layer = 0;
    unit_lo[0] = 0;
    for (int s = 0; s < num_stages; s++) {
        int k = per + (s < extra ? 1 : 0);
        if (s == 0) k -= w_in;
        if (s == num_stages - 1) k -= w_out;
        if (k < 0) k = 0;
        if (layer + k > n_layers) k = n_layers - layer;
        const int lo = s == 0 ? 0 : 1 + layer;   // unit of the stage's first module
        layer += k;
        int hi = 1 + layer;                      // one past its last layer unit
        if (s == num_stages - 1) {
            if (layer != n_layers)
                return hp_error(HP_ERR_INVALID_ARG, "pipeline split: %d of %d layers assigned (the last stage "
                                "gives up %d); hint: lower parallelism.pipeline_parallel_last_stage_less_layers",
                                layer, n_layers, w_out);
            hi = n_layers + 2;
        }
        if (hi <= lo)
            return hp_error(HP_ERR_INVALID_ARG, "pipeline split: stage %d of %d would hold no module (%d layers, "
                            "first/last stage less layers %d/%d); hint: use fewer stages", s, num_stages, n_layers,
                            w_in, w_out);
        unit_lo[s] = lo;
        unit_lo[s + 1] = hi;
    }
    return HP_OK;
}

/* Unit of one module name, or -1 (norm/output: the head unit; 0: tok_embeddings). */
static int fqn_unit(const char *name, int n_layers) {
    if (!strcmp(name, "tok_embeddings")) return 0;
    if (!strcmp(name, "norm") || !strcmp(name, "output")) return n_layers + 1;
    if (!strncmp(name, "layers.", 7) && isdigit((unsigned char)name[7])) {
        char *end;
        long l = strtol(name + 7, &end, 10);
        if (*end == '\0' && l >= 0 && l < n_layers) return (int)l + 1;
    }
    return -1;
}

hp_status_t hp_pp_split_fqns(const char *spec, const char *key, int n_layers, int *num_stages, int *unit_lo) {
    *num_stages = 0;
    if (!key) key = "module_fqns_per_model_part";
    char buf[8192];
    if (strlen(spec) >= sizeof buf) return hp_error(HP_ERR_INVALID_ARG, "%s: longer than %zu characters", key, sizeof buf);
    snprintf(buf, sizeof buf, "%s", spec);
    {   // an empty stage (";;", a leading or trailing ';') is an error, not skipped
        const char *e = strstr(spec, ";;");
        size_t len = strlen(spec);
        if (e || spec[0] == ';' || (len && spec[len - 1] == ';')) {
            int k = 0;
            const char *at = e ? e + 1 : spec[0] == ';' ? spec : spec + len - 1;
            for (const char *c = spec; c < at; c++) k += *c == ';';
            return hp_error(HP_ERR_INVALID_ARG, "%s: stage %d is empty (\"%s\"); hint: every stage lists at least one "
                            "module", key, k, spec);
        }
    }
    int next = 0, seen_norm = 0, seen_out = 0, ns = 0;
    char *save_s = NULL;
    for (char *st = strtok_r(buf, ";", &save_s); st; st = strtok_r(NULL, ";", &save_s)) {
        if (ns >= HP_PP_MAX_STAGES) return hp_error(HP_ERR_INVALID_ARG, "%s: more than %d stages", key, HP_PP_MAX_STAGES);
        int lo = -1, hi = -1, cnt = 0;
        char *save_m = NULL;
        for (char *m = strtok_r(st, ",", &save_m); m; m = strtok_r(NULL, ",", &save_m)) {
            while (isspace((unsigned char)*m)) m++;
            char *e = m + strlen(m);
            while (e > m && isspace((unsigned char)e[-1])) *--e = '\0';
            if (!*m) continue;
            int u = fqn_unit(m, n_layers);
            if (u < 0)
                return hp_error(HP_ERR_INVALID_ARG, "%s: stage %d names '%s'; expected tok_embeddings, layers.0 .. "
                                "layers.%d, norm or output", key, ns, m, n_layers - 1);
            int is_norm = !strcmp(m, "norm"), is_out = !strcmp(m, "output");
            if ((is_norm && seen_norm) || (is_out && seen_out))
                return hp_error(HP_ERR_INVALID_ARG, "%s: '%s' is listed twice", key, m);
            if (is_norm || is_out) {
                seen_norm |= is_norm;
                seen_out |= is_out;
                if (u == hi - 1 && hi == n_layers + 2) { cnt++; continue; }   // the other half of the head
            }
            if (u != next)
                return hp_error(HP_ERR_INVALID_ARG, "%s: stage %d lists '%s' where %s was expected (stages must hold "
                                "contiguous modules in model order, each exactly once)", key, ns, m,
                                next == 0 ? "tok_embeddings" : next > n_layers ? "norm, output" : "the next layer");
            if (lo < 0) lo = u;
            hi = u + 1;
            next = u + 1;
            cnt++;
        }
        if (cnt == 0) return hp_error(HP_ERR_INVALID_ARG, "%s: stage %d is empty", key, ns);
        unit_lo[ns] = lo;
        unit_lo[ns + 1] = hi;
        ns++;
    }
    if (next != n_layers + 2 || !seen_norm || !seen_out)
        return hp_error(HP_ERR_INVALID_ARG, "%s: the stages end before %s; every module (tok_embeddings, layers.0 .. "
                        "layers.%d, norm, output) must be in exactly one stage", key,
                        next <= n_layers ? "the last layer" : "norm and output", n_layers - 1);
    *num_stages = ns;
    return HP_OK;
}

/* ---- runtime -------------------------------------------------------------------------------- */

enum { DIR_F = 0, DIR_B = 1 };

typedef struct stage {
    hp_model_t m;
    int id, u0, u1;
    int first, last;             /* holds unit 0 / the head */
    int n_ctx;
    hp_arena_t tables;           /* the stage's tables below live here */
    hp_model_ctx_t *ctx;         /* (n_ctx) pool */
    int *free_ctx, n_free;       /* free list */
    int hw;                      /* most contexts in use at once in the last step (measured) */
    int *ctx_of;                 /* (n_mb) pool index of micro-batch m, -1 none */
    float **in_act, **out_act;   /* (n_mb) (mbs*T, dim): RECV_F target / F output */
    float **dout, **din;         /* (n_mb): RECV_B target / backward input gradient */
    hp_work_t *recv_f, *recv_b;  /* (n_mb) pending receives */
    unsigned char *got_f, *got_b;   /* (n_mb) a receive was posted and not yet consumed */
    int *rgrp_f, *rgrp_b;        /* (n_mb) the receive went in a coalesced pair: its handle is sends[k], else -1 */
    int n_bwd;                   /* backwards (B or I) run this step */
    int split;                   /* the list has I / W for this stage */
} stage_t;

struct hp_pp {
    hp_comm_t comm;              /* dup of pp_comm */
    int rank, size;
    hp_pp_options_t o;
    hp_arena_t tables;           /* stage_to_rank, local_of, st and the (n_acts) tables live here */
    int *stage_to_rank;          /* (num_stages) */
    int *local_of;               /* (num_stages) local index or -1 */
    stage_t *st;
    int n_local;
    hp_pp_action_t *acts;        /* this rank's list (bubbles dropped) */
    int n_acts;
    hp_work_t *sends;            /* (n_acts) */
    unsigned char *done;         /* (n_acts) a SEND posted early by an overlapped action this step */
    int *early_f, *early_b;      /* (n_acts) OVERLAP_F_B at k: index of its F's SEND_F / B's SEND_B, or -1 */
    unsigned char *pair;         /* (n_acts) actions k and k + 1 are one coalesced send / receive pair */
    int n_pairs;
    hp_pp_overlap_t ov;
    hp_pp_p2p_t p2p;
    double *t_start, *t_end;
    hp_pp_hooks_t hooks;
    size_t ctx_bytes, buf_bytes;
    int dim;
    size_t act_floats;           /* mbs * T * dim */
    /* MPipe (docs/pp.md "MPipe"): the preprocess is units [0, mp_hi) of stage 0 */
    int mp;                      /* the schedule transposes micro-batches */
    int mp_hi;                   /* T + 1 */
    int mp_root;                 /* pp rank of stage 0 */
    hp_model_t mp_rep;           /* the replica (ranks without stage 0) */
    hp_arena_t mp_tables;        /* the (n_mb) mp_* tables live here */
    hp_model_ctx_t *mp_ctx;      /* (n_mb) replica context of an MPIPE_F of this rank, else NULL */
    float **mp_out, **mp_in;     /* (n_mb) helper: the replica's output; stage 0: the MPIPE_RECV_F target */
    float *mp_grad;              /* (mbs*T, dim) stage 0: gradient of the preprocess output in TRANSPOSE_B */
    int *mp_src;                 /* (n_mb) pp rank of micro-batch m's MPIPE_F, -1 none */
    hp_work_t *mp_recv;          /* (n_mb) */
    unsigned char *mp_got;       /* (n_mb) */
    float **mp_bc;               /* (mp_nbc) parameters broadcast each step (stage 0's or the replica's) */
    size_t *mp_bcn;              /* (mp_nbc) their floats */
    int mp_nbc;
    size_t mp_bc_bytes;
    int mp_fwd;                  /* MPIPE_F run in the last step */
    /* overlap mode 'thread': one worker made at set-up runs the B halves (and keeps its own
     * OpenMP team between steps); the step loop only hands it jobs */
    struct bwd_worker *worker;
};

static int msg_tag(const hp_pp_t p, int sender_stage, int mb, int dir) {
    return 1 + (sender_stage * p->o.n_microbatches + mb) * 2 + dir;
}
/* MPIPE_SEND_F / MPIPE_RECV_F of micro-batch mb: after every stage's tags. */
static int mp_tag(const hp_pp_t p, int mb) { return 1 + p->o.num_stages * p->o.n_microbatches * 2 + mb; }

typedef struct bwd_job {
    hp_pp_t p;
    stage_t *s;
    hp_pp_action_t a;
    hp_status_t st;
    char msg[512];
} bwd_job_t;

typedef struct bwd_worker {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, quit;           /* a job was handed over and not finished; the worker should exit */
    bwd_job_t job;
} bwd_worker_t;

static hp_status_t run_backward(hp_pp_t p, stage_t *s, int m, int type, const hp_pp_action_t *a);

static void *worker_main(void *arg) {
    bwd_worker_t *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->pending && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (w->quit) break;
        pthread_mutex_unlock(&w->mu);
        bwd_job_t *j = &w->job;
        j->st = run_backward(j->p, j->s, j->a.mb, HP_PP_B, &j->a);
        if (j->st != HP_OK) snprintf(j->msg, sizeof j->msg, "%s", hp_last_error());
        pthread_mutex_lock(&w->mu);
        w->pending = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static hp_status_t worker_start(hp_pp_t p) {
    if (p->worker) return HP_OK;
    bwd_worker_t *w = calloc(1, sizeof *w);
    if (!w) return HP_ERR_OOM;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->th, NULL, worker_main, w) != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return hp_error(HP_ERR_STATE, "pipeline overlap mode 'thread': pthread_create failed; hint: "
                        "HP_PP_OVERLAP=interleave");
    }
    p->worker = w;
    return HP_OK;
}

static void worker_stop(hp_pp_t p) {
    bwd_worker_t *w = p->worker;
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->th, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
    p->worker = NULL;
}

void hp_pp_destroy(hp_pp_t p) {
    if (!p) return;
    for (int i = 0; p->st && i < p->n_local; i++) {
        stage_t *s = &p->st[i];
        for (int c = 0; s->ctx && c < s->n_ctx; c++) hp_model_ctx_destroy(s->ctx[c]);
        for (int m = 0; m < p->o.n_microbatches; m++) {
            if (s->in_act) hp_free_aligned(s->in_act[m]);
            if (s->out_act) hp_free_aligned(s->out_act[m]);
            if (s->dout) hp_free_aligned(s->dout[m]);
            if (s->din) hp_free_aligned(s->din[m]);
        }
        hp_arena_free(&s->tables);
    }
    for (int m = 0; m < p->o.n_microbatches; m++) {
        if (p->mp_ctx && p->mp_ctx[m]) hp_model_ctx_destroy(p->mp_ctx[m]);
        if (p->mp_out) hp_free_aligned(p->mp_out[m]);
        if (p->mp_in) hp_free_aligned(p->mp_in[m]);
    }
    hp_free_aligned(p->mp_grad);
    if (p->mp_rep) hp_model_destroy(p->mp_rep);
    hp_arena_free(&p->mp_tables);
    free(p->mp_bc);
    free(p->mp_bcn);
    worker_stop(p);
    hp_arena_free(&p->tables);
    if (p->comm) hp_comm_destroy(p->comm);
    free(p);
}

static float *act_buf(hp_pp_t p) {
    float *b = hp_aligned_alloc(sizeof(float) * (p->act_floats ? p->act_floats : 1));
    if (b) {
        memset(b, 0, sizeof(float) * p->act_floats);
        p->buf_bytes += sizeof(float) * p->act_floats;
    }
    return b;
}

static hp_status_t fmt_action_error(const hp_pp_action_t *a, const char *what) {
    char t[64];
    hp_pp_action_format(a, t, sizeof t);
    return hp_error(HP_ERR_INVALID_ARG, "pipeline runtime: action '%s' %s", t, what);
}

/* Peer rank of a SEND / RECV action (-1 for other types). */
static int peer_of(const hp_pp_t p, const hp_pp_action_t *a) {
    switch (a->type) {
    case HP_PP_SEND_F: case HP_PP_RECV_B: return a->stage + 1 < p->o.num_stages ? p->stage_to_rank[a->stage + 1] : -1;
    case HP_PP_SEND_B: case HP_PP_RECV_F: return a->stage > 0 ? p->stage_to_rank[a->stage - 1] : -1;
    default: return -1;
    }
}
static int is_send(hp_pp_type_t t) { return t == HP_PP_SEND_F || t == HP_PP_SEND_B; }
static int is_recv(hp_pp_type_t t) { return t == HP_PP_RECV_F || t == HP_PP_RECV_B; }

static hp_status_t mode_from_env(const char *var, const char *const *names, int n, int dflt, int *out) {
    const char *e = getenv(var);
    *out = dflt;
    if (!e || !*e) return HP_OK;
    for (int i = 0; i < n; i++)
        if (!strcmp(e, names[i])) {
            *out = i + 1;
            return HP_OK;
        }
    return hp_error(HP_ERR_INVALID_ARG, "env %s = '%s'; expected %s%s%s%s%s", var, e, names[0], n > 1 ? " | " : "",
                    n > 1 ? names[1] : "", n > 2 ? " | " : "", n > 2 ? names[2] : "");
}

/* The overlap and p2p modes, each overlap's early sends, the coalesced pairs. */
static hp_status_t plan_transport(hp_pp_t p, const hp_pp_hooks_t *hooks, hp_pp_overlap_t ov, hp_pp_p2p_t p2p) {
    static const char *const ov_names[3] = {"off", "interleave", "thread"};
    static const char *const p2p_names[2] = {"per_op", "coalesced"};
    int v = (int)ov;
    if (v == HP_PP_OVERLAP_DEFAULT) HP_TRY(mode_from_env("HP_PP_OVERLAP", ov_names, 3, HP_PP_OVERLAP_INTERLEAVE, &v));
    if (v < HP_PP_OVERLAP_OFF || v > HP_PP_OVERLAP_THREAD)
        return hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: overlap mode %d; expected an hp_pp_overlap_t", v);
    p->ov = (hp_pp_overlap_t)v;
    v = (int)p2p;
    if (v == HP_PP_P2P_DEFAULT) HP_TRY(mode_from_env("HP_PP_P2P", p2p_names, 2, HP_PP_P2P_PER_OP, &v));
    if (v < HP_PP_P2P_PER_OP || v > HP_PP_P2P_COALESCED)
        return hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: p2p mode %d; expected an hp_pp_p2p_t", v);
    p->p2p = (hp_pp_p2p_t)v;
    if (p->ov == HP_PP_OVERLAP_THREAD && hooks && (hooks->unshard || hooks->reshard || hooks->reduce_grad))
        return hp_error(HP_ERR_UNSUPPORTED, "pipeline overlap mode 'thread' with FSDP hooks: the two halves would "
                        "issue collectives from two threads; hint: HP_PP_OVERLAP=interleave");
    if (p->ov == HP_PP_OVERLAP_THREAD) HP_TRY(worker_start(p));
    p->n_pairs = 0;
    memset(p->pair, 0, (size_t)p->n_acts);
    for (int k = 0; k < p->n_acts; k++) {
        const hp_pp_action_t *a = &p->acts[k];
        p->early_f[k] = p->early_b[k] = -1;
        if (a->type != HP_PP_OVERLAP_F_B) continue;
        if (p->ov == HP_PP_OVERLAP_THREAD && a->stage == a->sub_stage)
            return fmt_action_error(a, "overlaps an F and a B of one stage, which overlap mode 'thread' cannot run "
                                    "on two threads; hint: HP_PP_OVERLAP=interleave");
        // the sends of its two halves, between it and the next compute action
        for (int j = k + 1; j < p->n_acts && !hp_pp_type_is_compute(p->acts[j].type); j++) {
            const hp_pp_action_t *b = &p->acts[j];
            if (b->type == HP_PP_SEND_F && b->stage == a->stage && b->mb == a->mb) p->early_f[k] = j;
            if (b->type == HP_PP_SEND_B && b->stage == a->sub_stage && b->mb == a->sub_mb) p->early_b[k] = j;
        }
    }
    for (int k = 0; k < p->n_acts; k++) {   // an early send is posted alone
        if (p->early_f[k] >= 0) p->done[p->early_f[k]] = 1;
        if (p->early_b[k] >= 0) p->done[p->early_b[k]] = 1;
    }
    if (p->p2p == HP_PP_P2P_COALESCED)
        for (int k = 0; k + 1 < p->n_acts; k++) {
            const hp_pp_action_t *a = &p->acts[k], *b = &p->acts[k + 1];
            if (p->done[k] || p->done[k + 1]) continue;
            const int one_each = (is_send(a->type) && is_recv(b->type)) || (is_recv(a->type) && is_send(b->type));
            if (!one_each || peer_of(p, a) < 0 || peer_of(p, a) != peer_of(p, b)) continue;
            p->pair[k] = 1;
            p->n_pairs++;
            k++;   // each action in one pair at most
        }
    memset(p->done, 0, (size_t)p->n_acts);
    return HP_OK;
}

/* MPipe: whether any rank's list transposes (the same answer on every rank: the broadcast is
 * collective), the replica on ranks without stage 0, the buffers, the broadcast list. */
static hp_status_t mpipe_setup(hp_pp_t p, const hp_pp_schedule_t *lowered, hp_model_t *stages, int n_local) {
    const int n = p->o.n_microbatches, P = p->size;
    for (int r = 0; r < P; r++)
        for (int i = 0; i < hp_pp_schedule_len(lowered, r); i++) {
            const hp_pp_action_t *a = hp_pp_schedule_at(lowered, r, i);
            if (!a) continue;
            if (a->type == HP_PP_MPIPE_F || a->type == HP_PP_TRANSPOSE_F || a->type == HP_PP_TRANSPOSE_B ||
                a->type == HP_PP_MPIPE_SEND_F || a->type == HP_PP_MPIPE_RECV_F)
                p->mp = 1;
        }
    if (!p->mp) return HP_OK;
    const hp_model_config_t *cfg = n_local ? hp_model_config(stages[0]) : NULL;
    const int T = p->mp_hi - 1;
    if (!cfg) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: MPipe on a rank with no stage");
    if (T < 0 || T > cfg->n_layers)
        return hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: MPipe transpose_layers %d; expected 0 .. %d (the model's "
                        "layers)", T, cfg->n_layers);
    p->mp_hi = T + 1;
    p->mp_root = p->stage_to_rank[0];
    const int l0 = p->local_of[0];
    if (l0 >= 0 && p->st[l0].u1 < p->mp_hi)
        return hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: MPipe's preprocess is units [0, %d) (tok_embeddings and %d "
                        "layers), but stage 0 holds units [0, %d); hint: lower the transpose layers to %d or give "
                        "stage 0 more layers", p->mp_hi, T, p->st[l0].u1, p->st[l0].u1 - 1);
    if (l0 >= 0 && p->st[l0].last)
        return hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: MPipe needs at least 2 stages (stage 0 must not hold the "
                        "head)");
    const size_t nm = (size_t)n;
    const size_t mb_bytes[6] = {nm * sizeof *p->mp_ctx, nm * sizeof *p->mp_out, nm * sizeof *p->mp_in,
                                nm * sizeof *p->mp_src, nm * sizeof *p->mp_recv, nm};
    void *const mb_tables[6] = {&p->mp_ctx, &p->mp_out, &p->mp_in, &p->mp_src, &p->mp_recv, &p->mp_got};
    HP_TRY(hp_arena_init_tables(&p->mp_tables, "MPipe tables", 6, mb_bytes, mb_tables));
    for (int m = 0; m < n; m++) p->mp_src[m] = -1;
    for (int r = 0; r < P; r++)
        for (int i = 0; i < hp_pp_schedule_len(lowered, r); i++) {
            const hp_pp_action_t *a = hp_pp_schedule_at(lowered, r, i);
            if (a && a->type == HP_PP_MPIPE_F && a->mb >= 0 && a->mb < n) p->mp_src[a->mb] = r;
        }
    hp_model_t src = NULL;
    if (l0 >= 0) {
        src = p->st[l0].m;
        for (int k = 0; k < p->n_acts; k++)
            if (p->acts[k].type == HP_PP_MPIPE_RECV_F && !p->mp_in[p->acts[k].mb] && !(p->mp_in[p->acts[k].mb] = act_buf(p)))
                return HP_ERR_OOM;
        if (!(p->mp_grad = act_buf(p))) return HP_ERR_OOM;
    } else {
        HP_TRY(hp_model_create_range(cfg, 0, p->mp_hi, p->o.microbatch_size, p->o.seq_len, &p->mp_rep));
        src = p->mp_rep;
        for (int k = 0; k < p->n_acts; k++) {
            const int m = p->acts[k].mb;
            if (p->acts[k].type != HP_PP_MPIPE_F || p->mp_ctx[m]) continue;
            HP_TRY(hp_model_ctx_create(p->mp_rep, p->o.microbatch_size, p->o.seq_len, 0, &p->mp_ctx[m]));
            p->ctx_bytes += hp_model_ctx_bytes(p->mp_ctx[m]);
            if (!(p->mp_out[m] = act_buf(p))) return HP_ERR_OOM;
        }
    }
    // the broadcast list: the preprocess units' parameters, in table order (the same on both sides)
    int first = 0, cnt = 0, last = 0;
    hp_model_unit_params(src, 0, &first, &cnt);
    for (int u = 0; u < p->mp_hi; u++) {
        int f, c;
        hp_model_unit_params(src, u, &f, &c);
        last = f + c;
    }
    p->mp_nbc = last - first;
    p->mp_bc = hp_calloc((size_t)(p->mp_nbc ? p->mp_nbc : 1), sizeof *p->mp_bc);
    p->mp_bcn = hp_calloc((size_t)(p->mp_nbc ? p->mp_nbc : 1), sizeof *p->mp_bcn);
    if (!p->mp_bc || !p->mp_bcn) return HP_ERR_OOM;
    hp_param_t *par = hp_model_params(src);
    for (int i = 0; i < p->mp_nbc; i++) {
        p->mp_bc[i] = par[first + i].value.local.data;
        p->mp_bcn[i] = (size_t)hp_tensor_numel(&par[first + i].value.local);
        p->mp_bc_bytes += sizeof(float) * p->mp_bcn[i];
    }
    return HP_OK;
}

hp_status_t hp_pp_create(hp_comm_t pp_comm, const hp_pp_schedule_t *lowered, hp_model_t *stages,
                         const int *stage_ids, int n_local, const hp_pp_options_t *o, const hp_pp_hooks_t *hooks,
                         hp_pp_t *out) {
    return hp_pp_create_mpipe(pp_comm, lowered, stages, stage_ids, n_local, o, hooks, 0, out);
}

hp_status_t hp_pp_create_mpipe(hp_comm_t pp_comm, const hp_pp_schedule_t *lowered, hp_model_t *stages,
                               const int *stage_ids, int n_local, const hp_pp_options_t *o, const hp_pp_hooks_t *hooks,
                               int transpose_layers, hp_pp_t *out) {
    *out = NULL;
    if (!pp_comm || !lowered || !o || (n_local > 0 && (!stages || !stage_ids)))
        return hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: pp_comm, lowered, options, stages must be non-NULL");
    const int P = hp_comm_size(pp_comm), me = hp_comm_rank(pp_comm), S = o->num_stages, n = o->n_microbatches;
    if (hp_pp_schedule_n_ranks(lowered) != P)
        return hp_error(HP_ERR_INVALID_ARG, "pipeline schedule has %d rank lists; the pp dimension has %d ranks",
                        hp_pp_schedule_n_ranks(lowered), P);
    if (S < 1 || S > HP_PP_MAX_STAGES || n < 1 || o->microbatch_size < 1 || o->seq_len < 1)
        return hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: %d stages, %d micro-batches of %d x %d tokens; expected "
                        "positive sizes and at most %d stages", S, n, o->microbatch_size, o->seq_len, HP_PP_MAX_STAGES);
    if ((int64_t)S * n * 2 + n + 2 > HP_P2P_MAX_TAG)
        return hp_error(HP_ERR_INVALID_ARG, "pipeline: %d stages x %d micro-batches exceed the message tags (%d)", S, n,
                        HP_P2P_MAX_TAG);
    // the whole schedule must run to the end: simulate it (deadlock = "Schedule is not progressing")
    {
        int steps = 0;
        HP_TRY(hp_pp_simulate(lowered, o->stage_to_rank, S, NULL, &steps));
    }
    hp_status_t st = HP_OK;
    hp_pp_t p = hp_calloc(1, sizeof *p);
    if (!p) return HP_ERR_OOM;
    p->o = *o;
    p->mp_hi = transpose_layers + 1;
    p->rank = me;
    p->size = P;
    p->n_local = n_local;
    if (hooks) p->hooks = *hooks;
    // the handle's tables in one arena, sized first: per stage of the schedule, per local
    // stage, and per action of this rank's list (bubbles dropped: at most len)
    const int len = hp_pp_schedule_len(lowered, me);
    const size_t L = (size_t)(len ? len : 1);
    const size_t table_bytes[11] = {(size_t)S * sizeof(int), (size_t)S * sizeof(int),
                                    (size_t)(n_local ? n_local : 1) * sizeof(stage_t), L * sizeof(hp_pp_action_t),
                                    L * sizeof(hp_work_t), L * sizeof(double), L * sizeof(double), L, L,
                                    L * sizeof(int), L * sizeof(int)};
    void *const tables[11] = {&p->stage_to_rank, &p->local_of, &p->st, &p->acts, &p->sends, &p->t_start,
                              &p->t_end, &p->done, &p->pair, &p->early_f, &p->early_b};
    st = hp_arena_init_tables(&p->tables, "pipeline tables", 11, table_bytes, tables);
    if (st != HP_OK) goto fail;
    memcpy(p->stage_to_rank, o->stage_to_rank, sizeof(int) * (size_t)S);
    p->o.stage_to_rank = p->stage_to_rank;
    for (int s = 0; s < S; s++) p->local_of[s] = -1;
    for (int i = 0; i < n_local; i++) {
        int id = stage_ids[i];
        if (id < 0 || id >= S || p->stage_to_rank[id] != me || (i > 0 && id <= stage_ids[i - 1])) {
            st = hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: local stage %d (index %d) is not a stage of pp rank %d in "
                          "the schedule's mapping, or stages are not ascending", id, i, me);
            goto fail;
        }
        p->local_of[id] = i;
    }
    for (int s = 0; s < S; s++)
        if (p->stage_to_rank[s] == me && p->local_of[s] < 0) {
            st = hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: the schedule maps stage %d to pp rank %d, which was given "
                          "no model for it", s, me);
            goto fail;
        }
    // this rank's actions (bubbles dropped), checked against its stages
    {
        for (int i = 0; i < len; i++) {
            const hp_pp_action_t *a = hp_pp_schedule_at(lowered, me, i);
            if (!a) continue;
            const int replica = a->type == HP_PP_MPIPE_F || a->type == HP_PP_MPIPE_SEND_F;
            if (replica && (a->stage != 0 || p->local_of[0] >= 0)) {
                st = fmt_action_error(a, "runs the preprocess replica on stage 0's own rank (or names a stage "
                                      "other than 0); hint: MPipe's helpers are the ranks without stage 0");
                goto fail;
            }
            if (!replica && (a->stage >= S || p->local_of[a->stage] < 0)) {
                st = fmt_action_error(a, "names a stage this rank does not hold");
                goto fail;
            }
            if (a->mb != HP_PP_NO_MB && a->mb >= n) {
                st = fmt_action_error(a, "names a micro-batch beyond n_microbatches");
                goto fail;
            }
            if (a->type == HP_PP_OVERLAP_F_B &&
                (a->sub_stage < 0 || a->sub_stage >= S || p->local_of[a->sub_stage] < 0 || a->sub_mb < 0 ||
                 a->sub_mb >= n)) {
                st = fmt_action_error(a, "overlaps a backward of a stage this rank does not hold or a micro-batch "
                                      "beyond n_microbatches");
                goto fail;
            }
            p->acts[p->n_acts++] = *a;
        }
    }
    // stages: unit ranges, in-flight peaks, buffers
    p->dim = n_local ? hp_model_config(stages[0])->dim : 0;
    p->act_floats = (size_t)o->microbatch_size * (size_t)o->seq_len * (size_t)p->dim;
    for (int i = 0; i < n_local; i++) {
        stage_t *s = &p->st[i];
        s->m = stages[i];
        s->id = stage_ids[i];
        hp_model_unit_range(s->m, &s->u0, &s->u1);
        s->first = s->u0 == 0;
        s->last = s->u1 == hp_model_num_units(s->m);
        if ((s->id == 0) != s->first || (s->id == S - 1) != s->last) {
            st = hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: stage %d's model holds units [%d, %d); the first stage "
                          "must hold the embedding (unit 0) and the last the head, and only they", s->id, s->u0, s->u1);
            goto fail;
        }
        if (i > 0 && p->st[i - 1].id == s->id - 1 && p->st[i - 1].u1 != s->u0) {
            st = hp_error(HP_ERR_INVALID_ARG, "hp_pp_create: stages %d and %d hold units ending at %d and starting at %d; "
                          "adjacent stages must hold adjacent units", s->id - 1, s->id, p->st[i - 1].u1, s->u0);
            goto fail;
        }
        int live = 0, peak = 0;
        for (int k = 0; k < p->n_acts; k++) {
            // an OVERLAP_F_B is its F then its B (a context starts at F and ends at B or W)
            hp_pp_action_t lv[2];
            const int nlv = hp_pp_action_leaves(&p->acts[k], lv);
            for (int j = 0; j < nlv; j++) {
                const hp_pp_action_t *a = &lv[j];
                if (a->stage != s->id) continue;
                if (a->type == HP_PP_F || a->type == HP_PP_TRANSPOSE_F) live++;
                if (a->type == HP_PP_B || a->type == HP_PP_W || a->type == HP_PP_TRANSPOSE_B) live--;
                if (a->type == HP_PP_I || a->type == HP_PP_W) s->split = 1;
                if (live > peak) peak = live;
            }
        }
        s->n_ctx = peak > 0 ? peak : 1;
        // the stage's tables in one arena: its context pool, then per micro-batch
        const size_t nc = (size_t)s->n_ctx, nm = (size_t)n, fp = nm * sizeof(float *), wk = nm * sizeof(hp_work_t);
        const size_t stage_bytes[13] = {nc * sizeof(hp_model_ctx_t), nc * sizeof(int), nm * sizeof(int), fp, fp, fp,
                                        fp, wk, wk, nm, nm, nm * sizeof(int), nm * sizeof(int)};
        void *const tables[13] = {&s->ctx, &s->free_ctx, &s->ctx_of, &s->in_act, &s->out_act, &s->dout, &s->din,
                                  &s->recv_f, &s->recv_b, &s->got_f, &s->got_b, &s->rgrp_f, &s->rgrp_b};
        st = hp_arena_init_tables(&s->tables, "pipeline stage tables", 13, stage_bytes, tables);
        if (st != HP_OK) goto fail;
        for (int c = 0; c < s->n_ctx && st == HP_OK; c++) {
            st = hp_model_ctx_create(s->m, o->microbatch_size, o->seq_len, s->split ? HP_MODEL_CTX_SPLIT_BACKWARD : 0,
                                     &s->ctx[c]);
            if (st == HP_OK) p->ctx_bytes += hp_model_ctx_bytes(s->ctx[c]);
        }
        if (st != HP_OK) goto fail;
        for (int m = 0; m < n; m++) {
            s->ctx_of[m] = -1;
            // receive buffers only where the neighbour is on another rank; outputs and input
            // gradients always (the local neighbour reads them)
            const int prev_remote = !s->first && p->local_of[s->id - 1] < 0;
            const int next_remote = !s->last && p->local_of[s->id + 1] < 0;
            if (prev_remote && !(s->in_act[m] = act_buf(p))) { st = HP_ERR_OOM; goto fail; }
            if (!s->last && !(s->out_act[m] = act_buf(p))) { st = HP_ERR_OOM; goto fail; }
            if (next_remote && !(s->dout[m] = act_buf(p))) { st = HP_ERR_OOM; goto fail; }
            if (!s->first && !(s->din[m] = act_buf(p))) { st = HP_ERR_OOM; goto fail; }
        }
    }
    st = mpipe_setup(p, lowered, stages, n_local);
    // only stage 0's rank can check the preprocess against its units: every rank learns its answer
    // (p->mp is the same on all, read from every rank's list), so no rank waits in the dup below
    if (p->mp) st = hp_comm_agree(pp_comm, st, NULL);
    if (st != HP_OK) goto fail;
    st = plan_transport(p, hooks, HP_PP_OVERLAP_DEFAULT, HP_PP_P2P_DEFAULT);
    if (st != HP_OK) goto fail;
    st = hp_comm_dup(pp_comm, &p->comm);
    if (st != HP_OK) goto fail;
    *out = p;
    return HP_OK;
fail:
    hp_pp_destroy(p);
    return st;
}

static void reset_step(hp_pp_t p) {
    for (int i = 0; i < p->n_local; i++) {
        stage_t *s = &p->st[i];
        s->n_free = s->n_ctx;
        for (int c = 0; c < s->n_ctx; c++) s->free_ctx[c] = s->n_ctx - 1 - c;
        for (int m = 0; m < p->o.n_microbatches; m++) s->ctx_of[m] = s->rgrp_f[m] = s->rgrp_b[m] = -1;
        s->n_bwd = 0;
        s->hw = 0;
    }
    memset(p->done, 0, (size_t)p->n_acts);
}

/* Completes micro-batch m's receive of direction dir on stage s: its own handle, or the
 * coalesced pair's (a no-op when done or never posted). */
static hp_status_t wait_recv(hp_pp_t p, stage_t *s, int m, int dir) {
    hp_work_t *w = dir == DIR_F ? &s->recv_f[m] : &s->recv_b[m];
    const int g = dir == DIR_F ? s->rgrp_f[m] : s->rgrp_b[m];
    if (*w) return hp_work_wait(w);
    if (g >= 0 && p->sends[g]) return hp_work_wait(&p->sends[g]);
    return HP_OK;
}

/* Waits every outstanding operation (after an error too, so no buffer is left in flight). */
static hp_status_t drain(hp_pp_t p, hp_status_t st) {
    for (int k = 0; k < p->n_acts; k++)
        if (p->sends[k]) {
            hp_status_t w = hp_work_wait(&p->sends[k]);
            if (st == HP_OK) st = w;
        }
    for (int i = 0; i < p->n_local; i++)
        for (int m = 0; m < p->o.n_microbatches; m++) {
            stage_t *s = &p->st[i];
            hp_work_t *w[2] = {&s->recv_f[m], &s->recv_b[m]};
            unsigned char *got[2] = {&s->got_f[m], &s->got_b[m]};
            for (int j = 0; j < 2; j++) {
                if (*w[j]) {
                    hp_status_t r = hp_work_wait(w[j]);
                    if (st == HP_OK) st = r;
                }
                if (*got[j] && st == HP_OK)
                    st = hp_error(HP_ERR_STATE, "pipeline runtime: stage %d received %s of micro-batch %d that no "
                                  "action used", s->id, j ? "a gradient" : "an activation", m);
                *got[j] = 0;
            }
        }
    for (int m = 0; p->mp && m < p->o.n_microbatches; m++) {
        if (p->mp_recv[m]) {
            hp_status_t r = hp_work_wait(&p->mp_recv[m]);
            if (st == HP_OK) st = r;
        }
        if (p->mp_got[m] && st == HP_OK)
            st = hp_error(HP_ERR_STATE, "pipeline runtime: stage 0 received the preprocess output of micro-batch %d "
                          "(MPIPE_RECV_F) that no TRANSPOSE_F used", m);
        p->mp_got[m] = 0;
    }
    return st;
}

static const int32_t *mb_rows(const int32_t *x, const hp_pp_t p, int m) {
    return x ? x + (size_t)m * (size_t)p->o.microbatch_size * (size_t)p->o.seq_len : NULL;
}

/* F: the stage's input (tokens, a local neighbour's output, or the received activation). */
static hp_status_t run_forward(hp_pp_t p, stage_t *s, int m, const int32_t *tokens, const int32_t *targets,
                               float div, double *loss_sum, int64_t *n_valid, const hp_pp_action_t *a) {
    if (s->ctx_of[m] >= 0) return fmt_action_error(a, "runs the forward of a micro-batch twice in one step");
    if (s->n_free == 0) return fmt_action_error(a, "finds no free micro-batch context (more in flight than planned)");
    const float *in = NULL;
    if (!s->first) {
        int pl = p->local_of[s->id - 1];
        if (pl >= 0) {
            if (p->st[pl].ctx_of[m] < 0)
                return fmt_action_error(a, "runs before the forward of the previous stage on this rank");
            in = p->st[pl].out_act[m];
        } else {
            if (!s->got_f[m]) return fmt_action_error(a, "runs without its RECV_F");
            HP_TRY(wait_recv(p, s, m, DIR_F));
            s->got_f[m] = 0;
            in = s->in_act[m];
        }
    }
    const int c = s->free_ctx[--s->n_free];
    if (s->n_ctx - s->n_free > s->hw) s->hw = s->n_ctx - s->n_free;
    s->ctx_of[m] = c;
    hp_model_ctx_t ctx = s->ctx[c];
    if (s->first && !tokens) return hp_error(HP_ERR_INVALID_ARG, "pipeline step: the first stage needs tokens");
    if (s->last && !targets) return hp_error(HP_ERR_INVALID_ARG, "pipeline step: the last stage needs targets");
    HP_TRY(hp_model_ctx_begin(ctx, s->first ? mb_rows(tokens, p, m) : NULL, s->last ? mb_rows(targets, p, m) : NULL,
                              p->o.microbatch_size, p->o.seq_len, div));
    hp_status_t fs = hp_model_forward_range(s->m, ctx, s->u0, s->u1, in, s->last ? NULL : s->out_act[m]);
    // A non-finite loss is not an error here: every rank must finish the schedule (the peers
    // wait for its gradients), so it flows into the loss sum and the caller stops all ranks.
    if (!(fs == HP_ERR_NUMERIC && s->last)) HP_TRY(fs);
    if (s->last) {
        *loss_sum += hp_model_ctx_loss_sum(ctx);
        *n_valid += hp_model_ctx_valid_tokens(ctx);
    }
    return HP_OK;
}

static void release_ctx(stage_t *s, int m) {
    s->free_ctx[s->n_free++] = s->ctx_of[m];
    s->ctx_of[m] = -1;
}

/* The output gradient of a stage that is not the last: the next stage's input gradient when it
 * is on this rank, else the received one (its RECV_B must have run). */
static hp_status_t stage_dout(hp_pp_t p, stage_t *s, int m, const hp_pp_action_t *a, const float **dout) {
    const int nl = p->local_of[s->id + 1];
    if (nl >= 0) {
        *dout = p->st[nl].din[m];
        return HP_OK;
    }
    if (!s->got_b[m]) return fmt_action_error(a, "runs without its RECV_B");
    HP_TRY(wait_recv(p, s, m, DIR_B));
    s->got_b[m] = 0;
    *dout = s->dout[m];
    return HP_OK;
}

/* B or I: the output gradient (the loss, a local neighbour's input gradient, or received). */
static hp_status_t run_backward(hp_pp_t p, stage_t *s, int m, int type, const hp_pp_action_t *a) {
    if (s->ctx_of[m] < 0) return fmt_action_error(a, "runs without the micro-batch's forward");
    const float *dout = NULL;
    if (!s->last) HP_TRY(stage_dout(p, s, m, a, &dout));
    const int last = ++s->n_bwd == p->o.n_microbatches;
    if (p->hooks.pre_backward) HP_TRY(p->hooks.pre_backward(p->hooks.user, s->id, m, last));
    hp_model_ctx_t ctx = s->ctx[s->ctx_of[m]];
    if (type == HP_PP_B) {
        HP_TRY(hp_model_backward_range(s->m, ctx, s->u0, s->u1, dout, s->first ? NULL : s->din[m]));
        release_ctx(s, m);
    } else {
        HP_TRY(hp_model_backward_input_range(s->m, ctx, s->u0, s->u1, dout, s->first ? NULL : s->din[m]));
    }
    return HP_OK;
}

/* Posts the SEND / RECV at k: alone with its own handle (group < 0), or queued in the open
 * coalesced group whose handle will be sends[group]. */
static hp_status_t post_p2p(hp_pp_t p, int k, int group) {
    const hp_pp_action_t *a = &p->acts[k];
    stage_t *s = &p->st[p->local_of[a->stage]];
    const int m = a->mb;
    const int g = group >= 0;
    switch (a->type) {
    case HP_PP_SEND_F:
        if (s->last || s->ctx_of[m] < 0) return fmt_action_error(a, "sends an activation that was not computed");
        return hp_send_tag(s->out_act[m], p->act_floats, HP_F32, p->stage_to_rank[s->id + 1],
                           msg_tag(p, s->id, m, DIR_F), p->comm, g ? NULL : &p->sends[k]);
    case HP_PP_SEND_B:
        if (s->first) return fmt_action_error(a, "sends an input gradient from the first stage");
        return hp_send_tag(s->din[m], p->act_floats, HP_F32, p->stage_to_rank[s->id - 1], msg_tag(p, s->id, m, DIR_B),
                           p->comm, g ? NULL : &p->sends[k]);
    case HP_PP_RECV_F:
        if (s->first || !s->in_act[m]) return fmt_action_error(a, "receives from a stage on this rank or none");
        if (s->got_f[m]) return fmt_action_error(a, "is posted twice");
        s->got_f[m] = 1;
        s->rgrp_f[m] = group;
        return hp_recv_tag(s->in_act[m], p->act_floats, HP_F32, p->stage_to_rank[s->id - 1],
                           msg_tag(p, s->id - 1, m, DIR_F), p->comm, g ? NULL : &s->recv_f[m]);
    case HP_PP_RECV_B:
        if (s->last || !s->dout[m]) return fmt_action_error(a, "receives from a stage on this rank or none");
        if (s->got_b[m]) return fmt_action_error(a, "is posted twice");
        s->got_b[m] = 1;
        s->rgrp_b[m] = group;
        return hp_recv_tag(s->dout[m], p->act_floats, HP_F32, p->stage_to_rank[s->id + 1],
                           msg_tag(p, s->id + 1, m, DIR_B), p->comm, g ? NULL : &s->recv_b[m]);
    default: return fmt_action_error(a, "is not a send or receive");
    }
}

/* Actions k and k + 1 (a SEND and a RECV with one peer) as one batched isend / irecv pair. */
static hp_status_t post_pair(hp_pp_t p, int k) {
    HP_TRY(hp_group_start());
    hp_status_t st = post_p2p(p, k, k);
    if (st == HP_OK) st = post_p2p(p, k + 1, k);
    hp_status_t e = hp_group_end_work(&p->sends[k]);   // closes the group after an error too
    return st != HP_OK ? st : e;
}

/* OVERLAP_F_B: the F of (stage, mb) and the B of (sub_stage, sub_mb), as hp_pp_overlap_t says.
 * The kernels and their inputs are the same in every mode, so the results are bitwise equal. */
static hp_status_t run_overlap(hp_pp_t p, int k, const int32_t *tokens, const int32_t *targets, float div,
                               double *loss_sum, int64_t *n_valid) {
    const hp_pp_action_t *a = &p->acts[k];
    const hp_pp_action_t fa = {a->stage, HP_PP_F, a->mb, 0, 0}, ba = {a->sub_stage, HP_PP_B, a->sub_mb, 0, 0};
    stage_t *sf = &p->st[p->local_of[a->stage]], *sb = &p->st[p->local_of[a->sub_stage]];
    if (p->ov == HP_PP_OVERLAP_THREAD) {
        bwd_worker_t *w = p->worker;
        if (!w) return hp_error(HP_ERR_STATE, "pipeline overlap mode 'thread': no worker (set-up failed)");
        pthread_mutex_lock(&w->mu);
        w->job = (bwd_job_t){p, sb, ba, HP_OK, ""};
        w->pending = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        hp_status_t st = run_forward(p, sf, fa.mb, tokens, targets, div, loss_sum, n_valid, &fa);
        if (st == HP_OK && p->early_f[k] >= 0) {
            st = post_p2p(p, p->early_f[k], -1);
            p->done[p->early_f[k]] = 1;
        }
        pthread_mutex_lock(&w->mu);
        while (w->pending) pthread_cond_wait(&w->cv, &w->mu);
        pthread_mutex_unlock(&w->mu);
        HP_TRY(st);
        if (w->job.st != HP_OK)
            return hp_error(w->job.st, "pipeline overlap: the backward on the second thread: %s", w->job.msg);
    } else {
        HP_TRY(run_forward(p, sf, fa.mb, tokens, targets, div, loss_sum, n_valid, &fa));
        if (p->ov == HP_PP_OVERLAP_INTERLEAVE && p->early_f[k] >= 0) {   // leaves during the B
            HP_TRY(post_p2p(p, p->early_f[k], -1));
            p->done[p->early_f[k]] = 1;
        }
        HP_TRY(run_backward(p, sb, ba.mb, HP_PP_B, &ba));
    }
    if (p->ov != HP_PP_OVERLAP_OFF && p->early_b[k] >= 0) {
        HP_TRY(post_p2p(p, p->early_b[k], -1));
        p->done[p->early_b[k]] = 1;
    }
    return HP_OK;
}

/* MPipe on a helping rank: the replica's preprocess forward of micro-batch m (MPIPE_F), its
 * output sent to stage 0's rank (MPIPE_SEND_F). */
static hp_status_t run_mpipe_replica(hp_pp_t p, int k, const int32_t *tokens) {
    const hp_pp_action_t *a = &p->acts[k];
    const int m = a->mb;
    if (!p->mp_ctx[m]) return fmt_action_error(a, "has no replica context (not planned at create)");
    if (a->type == HP_PP_MPIPE_F) {
        if (!tokens) return hp_error(HP_ERR_INVALID_ARG, "pipeline step: MPipe's helping rank %d needs the tokens "
                                     "(it runs the preprocess forward of micro-batch %d)", p->rank, m);
        HP_TRY(hp_model_ctx_begin(p->mp_ctx[m], mb_rows(tokens, p, m), NULL, p->o.microbatch_size, p->o.seq_len, 1.0f));
        HP_TRY(hp_model_forward_range(p->mp_rep, p->mp_ctx[m], 0, p->mp_hi, NULL, p->mp_out[m]));
        p->mp_fwd++;
        return HP_OK;
    }
    return hp_send_tag(p->mp_out[m], p->act_floats, HP_F32, p->mp_root, mp_tag(p, m), p->comm, &p->sends[k]);
}

/* MPipe on stage 0: TRANSPOSE_F continues micro-batch m from the received preprocess output;
 * TRANSPOSE_B runs the rest's backward, recomputes the preprocess forward from the tokens and
 * runs its backward with that gradient: the preprocess gradients accumulate here only. */
static hp_status_t run_transposed(hp_pp_t p, stage_t *s, int m, const int32_t *tokens, float div,
                                  const hp_pp_action_t *a) {
    if (a->type == HP_PP_TRANSPOSE_F) {
        if (s->ctx_of[m] >= 0) return fmt_action_error(a, "runs the forward of a micro-batch twice in one step");
        if (s->n_free == 0) return fmt_action_error(a, "finds no free micro-batch context (more in flight than planned)");
        if (!p->mp_got[m]) return fmt_action_error(a, "runs without its MPIPE_RECV_F");
        if (!tokens) return hp_error(HP_ERR_INVALID_ARG, "pipeline step: the first stage needs tokens");
        if (p->mp_recv[m]) HP_TRY(hp_work_wait(&p->mp_recv[m]));   // wait_input usually did
        p->mp_got[m] = 0;
        const int c = s->free_ctx[--s->n_free];
        if (s->n_ctx - s->n_free > s->hw) s->hw = s->n_ctx - s->n_free;
        s->ctx_of[m] = c;
        HP_TRY(hp_model_ctx_begin(s->ctx[c], mb_rows(tokens, p, m), NULL, p->o.microbatch_size, p->o.seq_len, div));
        if (p->mp_hi < s->u1) return hp_model_forward_range(s->m, s->ctx[c], p->mp_hi, s->u1, p->mp_in[m], s->out_act[m]);
        memcpy(s->out_act[m], p->mp_in[m], sizeof(float) * p->act_floats);   // stage 0 is the preprocess only
        return HP_OK;
    }
    if (s->ctx_of[m] < 0) return fmt_action_error(a, "runs without the micro-batch's forward");
    const float *dout = NULL;
    HP_TRY(stage_dout(p, s, m, a, &dout));
    const int last = ++s->n_bwd == p->o.n_microbatches;
    if (p->hooks.pre_backward) HP_TRY(p->hooks.pre_backward(p->hooks.user, s->id, m, last));
    hp_model_ctx_t ctx = s->ctx[s->ctx_of[m]];
    const float *g = dout;
    if (p->mp_hi < s->u1) {
        HP_TRY(hp_model_backward_range(s->m, ctx, p->mp_hi, s->u1, dout, p->mp_grad));
        g = p->mp_grad;
    }
    HP_TRY(hp_model_forward_range(s->m, ctx, 0, p->mp_hi, NULL, NULL));   // the recompute (MPIPE_TRANSPOSE_BWD)
    HP_TRY(hp_model_backward_range(s->m, ctx, 0, p->mp_hi, g, NULL));
    release_ctx(s, m);
    return HP_OK;
}

static hp_status_t run_action(hp_pp_t p, int k, const int32_t *tokens, const int32_t *targets, float div,
                              double *loss_sum, int64_t *n_valid) {
    const hp_pp_action_t *a = &p->acts[k];
    if (a->type == HP_PP_MPIPE_F || a->type == HP_PP_MPIPE_SEND_F) return run_mpipe_replica(p, k, tokens);
    stage_t *s = &p->st[p->local_of[a->stage]];
    const int m = a->mb;
    switch (a->type) {
    case HP_PP_TRANSPOSE_F:
    case HP_PP_TRANSPOSE_B: return run_transposed(p, s, m, tokens, div, a);
    case HP_PP_MPIPE_RECV_F:
        if (!p->mp_in[m] || p->mp_src[m] < 0) return fmt_action_error(a, "receives a preprocess output no helper sends");
        if (p->mp_got[m]) return fmt_action_error(a, "is posted twice");
        p->mp_got[m] = 1;
        return hp_recv_tag(p->mp_in[m], p->act_floats, HP_F32, p->mp_src[m], mp_tag(p, m), p->comm, &p->mp_recv[m]);
    case HP_PP_F: return run_forward(p, s, m, tokens, targets, div, loss_sum, n_valid, a);
    case HP_PP_B:
    case HP_PP_I: return run_backward(p, s, m, a->type, a);
    case HP_PP_W:
        if (s->ctx_of[m] < 0) return fmt_action_error(a, "runs without the micro-batch's forward");
        HP_TRY(hp_model_backward_weight_range(s->m, s->ctx[s->ctx_of[m]], s->u0, s->u1));
        release_ctx(s, m);
        return HP_OK;
    case HP_PP_SEND_F:
    case HP_PP_SEND_B:
    case HP_PP_RECV_F:
    case HP_PP_RECV_B: return post_p2p(p, k, -1);
    case HP_PP_OVERLAP_F_B: return run_overlap(p, k, tokens, targets, div, loss_sum, n_valid);
    case HP_PP_UNSHARD: return p->hooks.unshard ? p->hooks.unshard(p->hooks.user, s->id) : HP_OK;
    case HP_PP_RESHARD: return p->hooks.reshard ? p->hooks.reshard(p->hooks.user, s->id) : HP_OK;
    case HP_PP_REDUCE_GRAD: return p->hooks.reduce_grad ? p->hooks.reduce_grad(p->hooks.user, s->id) : HP_OK;
    default: return fmt_action_error(a, "is not executable");
    }
}

/* Before F / B / I: completes the receive the action reads (a no-op when it is local or done). */
static hp_status_t wait_input(hp_pp_t p, const hp_pp_action_t *a) {
    if (a->type == HP_PP_MPIPE_F || a->type == HP_PP_MPIPE_SEND_F || a->type == HP_PP_MPIPE_RECV_F) return HP_OK;
    if (a->type == HP_PP_TRANSPOSE_F) return p->mp_recv[a->mb] ? hp_work_wait(&p->mp_recv[a->mb]) : HP_OK;
    stage_t *s = &p->st[p->local_of[a->stage]];
    if (a->type == HP_PP_TRANSPOSE_B) return wait_recv(p, s, a->mb, DIR_B);
    const int m = a->mb;
    if (a->type == HP_PP_F) return wait_recv(p, s, m, DIR_F);
    if (a->type == HP_PP_B || a->type == HP_PP_I) return wait_recv(p, s, m, DIR_B);
    if (a->type == HP_PP_OVERLAP_F_B) {   // interleave: the B's receive is waited after the F
        HP_TRY(wait_recv(p, s, m, DIR_F));
        if (p->ov != HP_PP_OVERLAP_INTERLEAVE) return wait_recv(p, &p->st[p->local_of[a->sub_stage]], a->sub_mb, DIR_B);
    }
    return HP_OK;
}

/* The end of a step or an eval: every send and receive completed (the first error kept), then
 * the loss sums handed out. */
static hp_status_t finish_step(hp_pp_t p, hp_status_t st, double ls, int64_t nv, double *loss_sum,
                               int64_t *n_valid) {
    st = drain(p, st);
    if (loss_sum) *loss_sum = ls;
    if (n_valid) *n_valid = nv;
    return st;
}

hp_status_t hp_pp_step(hp_pp_t p, const int32_t *tokens, const int32_t *targets, float loss_divisor,
                       double *loss_sum, int64_t *n_valid) {
    double ls = 0.0;
    int64_t nv = 0;
    reset_step(p);
    hp_status_t st = HP_OK;
    p->mp_fwd = 0;
    // MPipe: the replicas take stage 0's current preprocess parameters (MPIPE_PARAM_BROADCAST)
    for (int i = 0; p->mp && i < p->mp_nbc && st == HP_OK; i++)
        st = hp_broadcast(p->mp_bc[i], p->mp_bcn[i], HP_F32, p->mp_root, p->comm, NULL);
    for (int k = 0; k < p->n_acts && st == HP_OK; k++) {
        if (p->done[k]) {   // a send an overlapped action posted early
            p->t_start[k] = p->t_end[k] = hp_clock_now_seconds();
            continue;
        }
        if (p->pair[k]) {
            p->t_start[k] = p->t_start[k + 1] = hp_clock_now_seconds();
            st = post_pair(p, k);
            p->t_end[k] = p->t_end[k + 1] = hp_clock_now_seconds();
            k++;
            continue;
        }
        st = wait_input(p, &p->acts[k]);   // a receive's wait is idle time, not the action's
        if (st != HP_OK) break;
        p->t_start[k] = hp_clock_now_seconds();
        st = run_action(p, k, tokens, targets, loss_divisor, &ls, &nv);
        p->t_end[k] = hp_clock_now_seconds();
    }
    for (int i = 0; st == HP_OK && i < p->n_local; i++)
        if (p->st[i].n_free != p->st[i].n_ctx)
            st = hp_error(HP_ERR_STATE, "pipeline runtime: stage %d ends the step with %d micro-batches whose backward "
                          "never ran", p->st[i].id, p->st[i].n_ctx - p->st[i].n_free);
    return finish_step(p, st, ls, nv, loss_sum, n_valid);
}

hp_status_t hp_pp_eval(hp_pp_t p, const int32_t *tokens, const int32_t *targets, float loss_divisor,
                       double *loss_sum, int64_t *n_valid) {
    const int n = p->o.n_microbatches;
    double ls = 0.0;
    int64_t nv = 0;
    reset_step(p);
    hp_status_t st = HP_OK;
    // Micro-batch major, stages ascending: every (m, stage) depends only on (m, stage - 1),
    // which comes earlier in that order on every rank, so blocking receives cannot deadlock;
    // each stage needs one context at a time. Sends reuse the step's handle slots.
    int k = 0;
    for (int m = 0; m < n && st == HP_OK; m++)
        for (int i = 0; i < p->n_local && st == HP_OK; i++) {
            stage_t *s = &p->st[i];
            const int prev_remote = !s->first && p->local_of[s->id - 1] < 0;
            const int next_remote = !s->last && p->local_of[s->id + 1] < 0;
            if (prev_remote) {
                s->got_f[m] = 1;
                st = hp_recv_tag(s->in_act[m], p->act_floats, HP_F32, p->stage_to_rank[s->id - 1],
                                 msg_tag(p, s->id - 1, m, DIR_F), p->comm, &s->recv_f[m]);
            }
            hp_pp_action_t a = {s->id, HP_PP_F, m, 0, 0};
            if (st == HP_OK) st = run_forward(p, s, m, tokens, targets, loss_divisor, &ls, &nv, &a);
            if (st == HP_OK && next_remote) {
                if (k >= p->n_acts) st = hp_error(HP_ERR_STATE, "pipeline eval: more sends than the schedule has");
                else st = hp_send_tag(s->out_act[m], p->act_floats, HP_F32, p->stage_to_rank[s->id + 1],
                                      msg_tag(p, s->id, m, DIR_F), p->comm, &p->sends[k++]);
            }
            if (st != HP_OK) break;
            if (!s->first && !prev_remote) release_ctx(&p->st[p->local_of[s->id - 1]], m);   // its output was read
            if (s->last || next_remote) release_ctx(s, m);
        }
    return finish_step(p, st, ls, nv, loss_sum, n_valid);
}

void hp_pp_memory(hp_pp_t p, size_t *context_bytes, size_t *buffer_bytes) {
    if (context_bytes) *context_bytes = p ? p->ctx_bytes : 0;
    if (buffer_bytes) *buffer_bytes = p ? p->buf_bytes : 0;
}

hp_status_t hp_pp_set_transport(hp_pp_t p, hp_pp_overlap_t overlap, hp_pp_p2p_t p2p) {
    if (!p) return hp_error(HP_ERR_INVALID_ARG, "hp_pp_set_transport: the runtime is NULL");
    const hp_pp_overlap_t ov = p->ov;
    const hp_pp_p2p_t pt = p->p2p;
    hp_status_t st = plan_transport(p, &p->hooks, overlap, p2p);
    if (st != HP_OK) {   // a refused mode leaves the previous plan in place (it was valid)
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", hp_last_error());
        (void)plan_transport(p, &p->hooks, ov, pt);
        return hp_error(st, "%s", msg);
    }
    return HP_OK;
}

size_t hp_pp_mpipe_broadcast_bytes(hp_pp_t p) { return p && p->mp ? p->mp_bc_bytes : 0; }
int hp_pp_mpipe_forwards(hp_pp_t p) { return p ? p->mp_fwd : 0; }

hp_pp_overlap_t hp_pp_overlap_mode(hp_pp_t p) { return p ? p->ov : HP_PP_OVERLAP_DEFAULT; }
int hp_pp_coalesced_pairs(hp_pp_t p) { return p ? p->n_pairs : 0; }

int hp_pp_stage_peak_contexts(hp_pp_t p, int i) { return p && i >= 0 && i < p->n_local ? p->st[i].hw : 0; }

int hp_pp_stage_contexts(hp_pp_t p, int i) { return p && i >= 0 && i < p->n_local ? p->st[i].n_ctx : 0; }

int hp_pp_last_timeline(hp_pp_t p, const hp_pp_action_t **actions, const double **start, const double **end) {
    *actions = p->acts;
    *start = p->t_start;
    *end = p->t_end;
    return p->n_acts;
}
