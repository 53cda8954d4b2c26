/* DistributedDataParallel (gradient buckets reduced asynchronously during backward, no_sync).
 * ZeroRedundancyOptimizer is zero.c. */
#include <stdlib.h>
#include <string.h>

#include "hyperparallel/ddp.h"
#include "parallel/dp-impl.h"

/* ---- bucket assignment ----------------------------------------------------------------- */

#define DDP_MAX_KEYS 8

int hp_ddp_bucket_assignment(const size_t *bytes, const int *keys, int n, const size_t *limits, int n_limits,
                             int *bucket_of, size_t *bucket_limit) {
    HP_ASSERT(n_limits >= 1);
    // per key: open bucket (raw id), its bytes, the limit index
    int key_of[DDP_MAX_KEYS], nk = 0;
    int open[DDP_MAX_KEYS];
    size_t open_bytes[DDP_MAX_KEYS];
    int lim_i[DDP_MAX_KEYS];
    int *raw = malloc(sizeof(int) * (size_t)(n ? n : 1));       // raw bucket id per tensor
    int *first = malloc(sizeof(int) * (size_t)(n ? n : 1));     // smallest tensor index per raw bucket
    size_t *rlim = malloc(sizeof(size_t) * (size_t)(n ? n : 1));
    HP_ASSERT(raw && first && rlim);
    int nraw = 0;
    for (int i = 0; i < n; i++) {
        int key = keys ? keys[i] : 0, k;
        for (k = 0; k < nk && key_of[k] != key; k++) {}
        if (k == nk) {
            HP_ASSERT(nk < DDP_MAX_KEYS);
            key_of[nk] = key; open[nk] = -1; open_bytes[nk] = 0; lim_i[nk] = 0;
            nk++;
        }
        if (open[k] < 0) {
            open[k] = nraw;
            first[nraw] = i;
            rlim[nraw] = limits[lim_i[k]];
            nraw++;
        }
        raw[i] = open[k];
        open_bytes[k] += bytes[i];
        if (open_bytes[k] >= limits[lim_i[k]]) {   // close; the next limit (the last one repeats)
            open[k] = -1;
            open_bytes[k] = 0;
            if (lim_i[k] + 1 < n_limits) lim_i[k]++;
        }
    }
    // raw ids are already in order of their smallest tensor index (a bucket is opened by its
    // first tensor), so sorting by minimum index keeps the raw order
    for (int i = 0; i < n; i++) bucket_of[i] = raw[i];
    if (bucket_limit)
        for (int b = 0; b < nraw; b++) bucket_limit[b] = rlim[b];
    free(raw);
    free(first);
    free(rlim);
    return nraw;
}

/* ---- DDP ------------------------------------------------------------------------------- */

typedef struct bucket {
    int n;
    int *idx;          /* model param indices */
    size_t floats;
    float *buf;
    int ready;         /* params whose gradient is ready this backward */
    int launched;
    hp_work_t work;
} bucket_t;

struct hp_ddp {
    hp_model_t model;
    hp_comm_t comm;
    hp_ddp_options_t o;
    int W;
    int nb;
    bucket_t *b;
    int *bucket_of;    /* per param */
    int next_launch;   /* buckets launch in index order */
    int sync;
    double wait_s;
};

hp_ddp_options_t hp_ddp_default_options(void) {
    hp_ddp_options_t o = {(size_t)1 << 20, (size_t)25 << 20, 1, 1};
    return o;
}

static hp_status_t launch_ready(hp_ddp_t d) {
    hp_param_t *P = hp_model_params(d->model);
    while (d->next_launch < d->nb && d->b[d->next_launch].ready == d->b[d->next_launch].n) {
        bucket_t *b = &d->b[d->next_launch];
        size_t off = 0;
        const float scale = d->o.average ? 1.0f / (float)d->W : 1.0f;
        for (int j = 0; j < b->n; j++) {
            const hp_tensor_t *g = &P[b->idx[j]].grad.local;
            size_t n = (size_t)hp_tensor_numel(g);
            const float *src = g->data;
            if (d->o.average)
                for (size_t k = 0; k < n; k++) b->buf[off + k] = src[k] * scale;
            else
                memcpy(b->buf + off, src, sizeof(float) * n);
            off += n;
        }
        double t0 = hp_clock_now_seconds();
        HP_TRY(hp_all_reduce(b->buf, b->buf, b->floats, HP_F32, HP_SUM, d->comm, d->o.overlap ? &b->work : NULL));
        if (!d->o.overlap) d->wait_s += hp_clock_now_seconds() - t0;
        b->launched = 1;
        d->next_launch++;
    }
    return HP_OK;
}

static hp_status_t ddp_post_backward(void *ctx, hp_module_t *mod, hp_act_t *act) {
    hp_ddp_t d = ctx;
    const int unit = mod->unit;
    (void)act;
    if (!d->sync) return HP_OK;
    int first, count;
    hp_model_unit_params(d->model, unit, &first, &count);
    for (int i = first; i < first + count; i++)
        if (d->bucket_of[i] >= 0) d->b[d->bucket_of[i]].ready++;   // -1: frozen, in no bucket
    HP_TRY(launch_ready(d));
    int u0, u1;
    hp_model_unit_range(d->model, &u0, &u1);
    if (unit == u0) {   // the final callback: wait every bucket, copy the results back
        HP_ASSERT_MSG(d->next_launch == d->nb, "DDP: %d of %d buckets launched at the end of backward",
                      d->next_launch, d->nb);
        hp_param_t *P = hp_model_params(d->model);
        for (int k = 0; k < d->nb; k++) {
            bucket_t *b = &d->b[k];
            double t0 = hp_clock_now_seconds();
            if (b->work) HP_TRY(hp_work_wait(&b->work));
            d->wait_s += hp_clock_now_seconds() - t0;
            size_t off = 0;
            for (int j = 0; j < b->n; j++) {
                hp_tensor_t *g = &P[b->idx[j]].grad.local;
                size_t n = (size_t)hp_tensor_numel(g);
                memcpy(g->data, b->buf + off, sizeof(float) * n);
                off += n;
            }
            b->ready = 0;
            b->launched = 0;
        }
        d->next_launch = 0;
    }
    return HP_OK;
}

hp_status_t hp_ddp_create(hp_model_t model, hp_comm_t comm, const hp_ddp_options_t *opts, hp_ddp_t *out) {
    if (!model || !comm || !out) return hp_error(HP_ERR_INVALID_ARG, "DDP: model, comm and out must be non-NULL");
    *out = NULL;
    hp_ddp_options_t o = opts ? *opts : hp_ddp_default_options();
    if (o.first_bucket_bytes == 0 || o.bucket_cap_bytes == 0)
        return hp_error(HP_ERR_INVALID_ARG, "DDP: bucket sizes must be > 0 (first %zu, cap %zu)",
                        o.first_bucket_bytes, o.bucket_cap_bytes);
    const hp_model_config_t *mc = hp_model_config(model);
    if (mc->tie_embeddings)
        return hp_error(HP_ERR_UNSUPPORTED, "DDP: model %s/%s ties tok_embeddings and output (the gradient is "
                        "ready only after both units); untied models only", mc->name, mc->flavor);
    HP_TRY(hp_dp_register(model, "DDP"));
    hp_ddp_t d = hp_calloc(1, sizeof(*d));
    const int np = hp_model_num_params(model);
    hp_param_t *P = hp_model_params(model);
    size_t *bytes = hp_malloc(sizeof(size_t) * (size_t)np);
    if (d) d->bucket_of = hp_malloc(sizeof(int) * (size_t)np);
    if (!d || !bytes || !d->bucket_of) {
        free(bytes);
        if (d) free(d->bucket_of);
        free(d);
        hp_dp_unregister(model);
        return HP_ERR_OOM;
    }
    d->model = model;
    d->comm = comm;
    d->o = o;
    d->W = hp_comm_size(comm);
    d->sync = 1;
    /* buckets over the parameters that require a gradient (PyTorch's DDP): a frozen one (LoRA's
     * base) is in none (bucket -1) and never all-reduced */
    int *tr = hp_malloc(sizeof(int) * (size_t)(np ? np : 1)), ntr = 0;
    if (!tr) {
        free(bytes);
        free(d->bucket_of);
        free(d);
        hp_dp_unregister(model);
        return HP_ERR_OOM;
    }
    for (int i = 0; i < np; i++)
        if (!P[i].frozen) {
            tr[ntr] = i;
            bytes[ntr++] = sizeof(float) * (size_t)hp_tensor_numel(&P[i].value.local);
        }
    size_t limits[2] = {o.first_bucket_bytes, o.bucket_cap_bytes};
    int *bo = hp_malloc(sizeof(int) * (size_t)(ntr ? ntr : 1));
    int nb = bo ? hp_ddp_bucket_assignment(bytes, NULL, ntr, limits, 2, bo, NULL) : 0;
    free(bytes);
    // reverse the bucket order: gradients arrive roughly in reverse parameter order
    for (int i = 0; i < np; i++) d->bucket_of[i] = -1;
    for (int k = 0; bo && k < ntr; k++) d->bucket_of[tr[k]] = nb - 1 - bo[k];
    free(tr);
    free(bo);
    d->nb = nb;
    d->b = hp_calloc((size_t)nb, sizeof(bucket_t));
    hp_status_t st = d->b ? HP_OK : HP_ERR_OOM;
    for (int k = 0; st == HP_OK && k < nb; k++) {
        bucket_t *b = &d->b[k];
        for (int i = 0; i < np; i++)
            if (d->bucket_of[i] == k) { b->n++; b->floats += (size_t)hp_tensor_numel(&P[i].value.local); }
        b->idx = hp_malloc(sizeof(int) * (size_t)b->n);
        b->buf = hp_aligned_alloc(sizeof(float) * (b->floats + 1));
        if (!b->idx || !b->buf) { st = HP_ERR_OOM; break; }
        int j = 0;
        for (int i = 0; i < np; i++)
            if (d->bucket_of[i] == k) b->idx[j++] = i;
    }
    // init_sync: every rank starts from rank 0's weights
    for (int i = 0; st == HP_OK && i < np; i++)
        st = hp_broadcast(P[i].value.local.data, (size_t)hp_tensor_numel(&P[i].value.local), HP_F32, 0, comm, NULL);
    const hp_module_hook_fn h[HP_HOOK_KINDS] = {NULL, NULL, NULL, ddp_post_backward};
    if (st == HP_OK) st = hp_dp_attach_hooks(model, d, h);
    if (st == HP_OK) *out = d;
    else hp_ddp_destroy(d);
    return st;
}

void hp_ddp_destroy(hp_ddp_t d) {
    if (!d) return;
    for (int k = 0; d->b && k < d->nb; k++) {
        if (d->b[k].work) (void)hp_work_wait(&d->b[k].work);
        free(d->b[k].idx);
        hp_free_aligned(d->b[k].buf);
    }
    hp_dp_detach_hooks(d->model, d);
    hp_dp_unregister(d->model);
    free(d->b);
    free(d->bucket_of);
    free(d);
}

void hp_ddp_set_requires_gradient_sync(hp_ddp_t d, int sync) { d->sync = sync != 0; }
int hp_ddp_num_buckets(hp_ddp_t d) { return d->nb; }
int hp_ddp_bucket_params(hp_ddp_t d, int b, int *indices, int cap) {
    if (b < 0 || b >= d->nb) return 0;
    for (int j = 0; j < d->b[b].n && j < cap; j++) indices[j] = d->b[b].idx[j];
    return d->b[b].n;
}
double hp_ddp_comm_wait_seconds(hp_ddp_t d) { return d->wait_s; }
