/* The checkpoint manager (TorchTitan's CheckpointManager): when to save (interval, last
 * step, model-only export at the end), what (model, optimizer state + step, LR scheduler,
 * dataloader per rank, train state with step and seed) as named DCP entries, retention
 * (keep_latest_k), async commit polling, and resume (latest / load_step, else
 * initial_load_path as DCP or HF). Only the public checkpoint API (checkpoint.h) is used, and
 * the registry (models.h) for the model family's HF state-dict adapter. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hyperparallel/ckpt_manager.h"
#include "hyperparallel/models.h"

struct hp_ckpt_manager {
    hp_comm_t comm;
    int rank;
    char folder[2 * HP_CONFIG_STR_MAX];
    int64_t interval, keep, load_step;
    int last_model_only;
    hp_dtype_t export_dtype;
    int async;
    int skip_checksums;      /* !checkpoint.verify_checksums */
    hp_dcp_saver_t saver;
    char pending_dir[2 * HP_CONFIG_STR_MAX + 32];   /* the async save in flight (for the log) */
    char initial[HP_CONFIG_STR_MAX];
    int n_exclude;
    const char *exclude[HP_CONFIG_LIST_MAX];
    hp_config_list_t exclude_store;
};

#define TS_MAGIC INT64_C(0x3154535048)   /* "HPTS1" little-endian */

/* Every rank returns the same status (comm NULL: a single process); a failure without a
 * message gets one naming `what`. */
static hp_status_t agree(hp_comm_t comm, hp_status_t s, const char *what) {
    if (s != HP_OK && !hp_last_error()[0]) hp_error(s, "%s failed (%s)", what, hp_status_string(s));
    return comm ? hp_comm_agree(comm, s, NULL) : s;
}

const char *hp_ckpt_manager_folder(hp_ckpt_manager_t m) { return m->folder; }

hp_status_t hp_ckpt_manager_create(const hp_config_t *cfg, hp_comm_t world, hp_ckpt_manager_t *out) {
    *out = NULL;
    const hp_config_list_t *ex = &cfg->checkpoint.exclude_from_loading;
    int has_opt = 0, has_lr = 0;
    for (int i = 0; i < ex->n; i++) {
        const char *k = ex->items[i];
        if (!strcmp(k, "model"))
            return hp_error(HP_ERR_INVALID_ARG, "checkpoint.exclude_from_loading contains 'model'; the model is always "
                            "loaded (as TorchTitan). Remove it");
        if (strcmp(k, "optimizer") && strcmp(k, "lr_scheduler") && strcmp(k, "dataloader") && strcmp(k, "train_state"))
            return hp_error(HP_ERR_INVALID_ARG, "checkpoint.exclude_from_loading: unknown key '%s'; expected optimizer, "
                            "lr_scheduler, dataloader or train_state", k);
        has_opt |= !strcmp(k, "optimizer");
        has_lr |= !strcmp(k, "lr_scheduler");
    }
    if (has_opt && !has_lr)
        return hp_error(HP_ERR_INVALID_ARG, "checkpoint.exclude_from_loading: excluding 'optimizer' also requires "
                        "excluding 'lr_scheduler' (as TorchTitan)");
    hp_ckpt_manager_t m = hp_calloc(1, sizeof *m);
    if (!m) return HP_ERR_OOM;
    m->comm = world;
    m->rank = world ? hp_comm_rank(world) : 0;
    const char *f = cfg->checkpoint.folder;
    if (f[0] == '/' || !cfg->job.dump_folder[0]) snprintf(m->folder, sizeof m->folder, "%s", f);
    else snprintf(m->folder, sizeof m->folder, "%s/%s", cfg->job.dump_folder, f);
    m->interval = cfg->checkpoint.interval;
    m->keep = cfg->checkpoint.keep_latest_k;
    m->load_step = cfg->checkpoint.load_step;
    m->last_model_only = cfg->checkpoint.last_save_model_only;
    m->export_dtype = !strcmp(cfg->checkpoint.export_dtype, "bfloat16") ? HP_BF16 : HP_F32;
    m->async = strcmp(cfg->checkpoint.async_mode, "disabled") != 0;
    m->skip_checksums = !cfg->checkpoint.verify_checksums;
    snprintf(m->initial, sizeof m->initial, "%s", cfg->checkpoint.initial_load_path);
    m->exclude_store = *ex;
    m->n_exclude = ex->n;
    for (int i = 0; i < ex->n; i++) m->exclude[i] = m->exclude_store.items[i];
    hp_status_t s = HP_OK;
    if (m->async) s = hp_dcp_saver_create(world, &m->saver);
    if (s != HP_OK) {
        free(m);
        return s;
    }
    *out = m;
    return HP_OK;
}

/* ---- the state as DCP entries ------------------------------------------------------------ */

typedef struct built {
    hp_dcp_tensor_t *t;
    hp_dtensor_t *odt;       /* optimizer state DTensors (the parameter's layout over the state view) */
    char **names;
    int nt, n_names;
    hp_dcp_blob_t b[4];
    int nb;
    int64_t opt_step, lr_epoch, ts[3];
    unsigned char *dl;
    hp_dcp_state_t st;
} built_t;

static void built_free(built_t *b) {
    for (int i = 0; i < b->n_names; i++) free(b->names[i]);
    free(b->names);
    free(b->t);
    free(b->odt);
    free(b->dl);
    memset(b, 0, sizeof *b);
}

/* model_only: only the parameters. dl_cap: dataloader blob capacity for a load (0 = save). */
static hp_status_t build_state(const hp_ckpt_train_state_t *s, int model_only, int store_dtype, size_t dl_cap,
                               built_t *b) {
    memset(b, 0, sizeof *b);
    int nopt = (!model_only && s->optim) ? hp_optim_num_states(s->optim) : 0;
    b->t = hp_calloc((size_t)(s->n_params + nopt + 1), sizeof *b->t);
    b->odt = hp_calloc((size_t)nopt + 1, sizeof *b->odt);
    b->names = hp_calloc((size_t)nopt + 1, sizeof *b->names);
    if (!b->t || !b->odt || !b->names) {
        built_free(b);
        return HP_ERR_OOM;
    }
    for (int i = 0; i < s->n_params; i++) {
        hp_dcp_tensor_t *x = &b->t[b->nt++];
        x->name = s->params[i].name;
        x->t = &s->params[i].value;
        x->store_dtype = store_dtype;
    }
    for (int i = 0; i < nopt; i++) {
        int pi;
        const char *slot;
        hp_tensor_t view;
        hp_optim_state_at(s->optim, i, &pi, &slot, &view);
        HP_ASSERT(pi >= 0 && pi < s->n_params);
        b->odt[i] = (s->optim_params ? s->optim_params : s->params)[pi].value;
        b->odt[i].local = view;
        b->odt[i].owned = NULL;
        char nm[HP_PARAM_NAME_MAX + 64];
        snprintf(nm, sizeof nm, "optimizer.%s.%s", s->params[pi].name, slot);
        b->names[b->n_names] = strdup(nm);
        if (!b->names[b->n_names]) {
            built_free(b);
            return HP_ERR_OOM;
        }
        hp_dcp_tensor_t *x = &b->t[b->nt++];
        x->name = b->names[b->n_names++];
        x->t = &b->odt[i];
        x->store_dtype = -1;
    }
    if (!model_only) {
        if (s->optim) {
            b->opt_step = hp_optim_get_step(s->optim);
            b->b[b->nb++] = (hp_dcp_blob_t){"optimizer.step", &b->opt_step, sizeof b->opt_step, sizeof b->opt_step, 0, 0};
        }
        if (s->step) {
            b->lr_epoch = *s->step;
            b->b[b->nb++] = (hp_dcp_blob_t){"lr_scheduler", &b->lr_epoch, sizeof b->lr_epoch, sizeof b->lr_epoch, 0, 0};
            b->ts[0] = TS_MAGIC;
            b->ts[1] = *s->step;
            b->ts[2] = s->seed ? (int64_t)*s->seed : 0;
            b->b[b->nb++] = (hp_dcp_blob_t){"train_state", b->ts, sizeof b->ts, sizeof b->ts, 0, 0};
        }
        if (s->dataloader) {
            size_t n = dl_cap ? dl_cap : hp_dataloader_state_size(s->dataloader), got = 0;
            b->dl = hp_malloc(n ? n : 1);
            if (!b->dl) {
                built_free(b);
                return HP_ERR_OOM;
            }
            if (!dl_cap) {
                hp_status_t r = hp_dataloader_state_save(s->dataloader, b->dl, n, &got);
                if (r != HP_OK) {
                    built_free(b);
                    return r;
                }
            }
            b->b[b->nb++] = (hp_dcp_blob_t){"dataloader", b->dl, dl_cap ? 0 : got, n, 1, 0};
        }
    }
    b->st = (hp_dcp_state_t){b->t, b->nt, b->b, b->nb};
    return HP_OK;
}

/* ---- save --------------------------------------------------------------------------------- */

/* Retention after a commit (rank 0); a failure to remove is a warning, not an error. */
static void purge(hp_ckpt_manager_t m) {
    if (m->rank != 0 || m->keep <= 0) return;
    if (hp_dcp_purge(m->folder, m->keep) != HP_OK) hp_log(HP_LOG_WARN, "checkpoint purge: %s", hp_last_error());
}

hp_status_t hp_ckpt_manager_save(hp_ckpt_manager_t m, int64_t step, int model_only, const hp_ckpt_train_state_t *st) {
    char dir[2 * HP_CONFIG_STR_MAX + 32];
    snprintf(dir, sizeof dir, "%s/step-%lld", m->folder, (long long)step);
    hp_status_t s = HP_OK;   /* the save creates the folder with its temporary directory */
    built_t b;
    HP_TRY(agree(m->comm, build_state(st, model_only, model_only ? (int)m->export_dtype : -1, 0, &b),
                        "checkpoint: collecting the state"));
    if (m->saver && !model_only) {
        s = hp_dcp_saver_save(m->saver, dir, &b.st);   /* staged: b can go now */
        if (s == HP_OK) snprintf(m->pending_dir, sizeof m->pending_dir, "%s", dir);
    } else {
        if (m->saver) s = hp_dcp_saver_wait(m->saver);
        if (s == HP_OK) s = hp_dcp_save(dir, &b.st, m->comm);
        if (s == HP_OK && m->rank == 0) hp_log(HP_LOG_INFO, "checkpoint: saved %s%s", dir, model_only ? " (model only)" : "");
        if (s == HP_OK) purge(m);
    }
    built_free(&b);
    return s;
}

hp_status_t hp_ckpt_manager_maybe_save(hp_ckpt_manager_t m, int64_t step, int64_t last_step,
                                       const hp_ckpt_train_state_t *st) {
    if (m->saver) {
        int committed = 0;
        HP_TRY(hp_dcp_saver_poll(m->saver, &committed));
        if (committed) {
            if (m->rank == 0) hp_log(HP_LOG_INFO, "checkpoint: saved %s (async)", m->pending_dir);
            purge(m);
        }
    }
    int last = step == last_step;
    if (!(last || (m->interval > 0 && step % m->interval == 0))) return HP_OK;
    HP_TRY(hp_ckpt_manager_save(m, step, last && m->last_model_only, st));
    if (last) HP_TRY(hp_ckpt_manager_wait(m));
    return HP_OK;
}

hp_status_t hp_ckpt_manager_wait(hp_ckpt_manager_t m) {
    if (!m->saver) return HP_OK;
    int was = hp_dcp_saver_pending(m->saver);
    HP_TRY(hp_dcp_saver_wait(m->saver));
    if (was) {
        if (m->rank == 0) hp_log(HP_LOG_INFO, "checkpoint: saved %s (async)", m->pending_dir);
        purge(m);
    }
    return HP_OK;
}

int hp_ckpt_manager_pending(hp_ckpt_manager_t m) { return m->saver && hp_dcp_saver_pending(m->saver); }

hp_status_t hp_ckpt_manager_destroy(hp_ckpt_manager_t m) {
    if (!m) return HP_OK;
    hp_status_t s = hp_ckpt_manager_wait(m);
    hp_status_t d = hp_dcp_saver_destroy(m->saver);
    free(m);
    return s != HP_OK ? s : d;
}

/* ---- load ----------------------------------------------------------------------------------- */

/* Loads the data loader's state saved by saved_world ranks into a run of another world size:
 * one blob per old data-parallel rank (ranks of one dp rank share the loader's state), then
 * the same dp degree loads its own rank's state, another degree reshards
 * (hp_dataloader_state_reshard: every old rank's interrupted pass is finished by one new rank). */
static hp_status_t reshard_loader(hp_ckpt_manager_t m, const char *dir, hp_dataloader_t dl, int saved_world, size_t cap) {
    unsigned char *all = hp_malloc((size_t)saved_world * (cap ? cap : 1));
    const void **by_dp = hp_calloc((size_t)saved_world, sizeof *by_dp);
    size_t *sizes = hp_calloc((size_t)saved_world, sizeof *sizes), *got = hp_calloc((size_t)saved_world, sizeof *got);
    hp_status_t s = all && by_dp && sizes && got ? HP_OK : hp_error(HP_ERR_OOM, "checkpoint: out of memory for the "
                                                                                "data loader's states");
    int old_dp = -1;
    for (int r = 0; r < saved_world && s == HP_OK; r++) {
        unsigned char *p = all + (size_t)r * cap;
        s = hp_dcp_load_rank_blob(dir, "dataloader", r, p, cap, &got[r], !m->skip_checksums);
        int dr = -1, dw = -1;
        if (s == HP_OK) s = hp_dataloader_state_peek(p, got[r], &dr, &dw);
        if (s == HP_OK && (dw < 1 || dr < 0 || dr >= dw || (old_dp >= 0 && dw != old_dp)))
            s = hp_error(HP_ERR_FORMAT, "checkpoint %s: the data loader states disagree on the dp degree (rank %d: dp "
                         "rank %d of %d)", dir, r, dr, dw);
        if (s != HP_OK) break;
        old_dp = dw;
        if (!by_dp[dr]) by_dp[dr] = p, sizes[dr] = got[r];
    }
    for (int d = 0; s == HP_OK && d < old_dp; d++)
        if (!by_dp[d]) s = hp_error(HP_ERR_FORMAT, "checkpoint %s: no data loader state of dp rank %d", dir, d);
    if (s == HP_OK) {
        int my_dp = -1, my_world = -1;
        size_t need = hp_dataloader_state_size(dl);
        unsigned char *probe = hp_malloc(need ? need : 1);
        s = probe ? hp_dataloader_state_save(dl, probe, need, &need) : HP_ERR_OOM;
        if (s == HP_OK) s = hp_dataloader_state_peek(probe, need, &my_dp, &my_world);
        free(probe);
        if (s == HP_OK && my_world == old_dp) {
            s = hp_dataloader_state_load(dl, by_dp[my_dp], sizes[my_dp]);
        } else if (s == HP_OK) {
            s = hp_dataloader_state_reshard(dl, by_dp, sizes, old_dp);
            if (s == HP_OK && m->rank == 0)
                hp_log(HP_LOG_INFO, "checkpoint: the data loader's state was saved by %d data-parallel rank(s), this "
                       "run has %d: dp rank q finishes the passes of old ranks q, q + %d, ... first (docs/data.md)",
                       old_dp, my_world, my_world);
        }
    }
    free(all);
    free(by_dp);
    free(sizes);
    free(got);
    return s;
}

static hp_status_t load_dir(hp_ckpt_manager_t m, const char *dir, const hp_ckpt_train_state_t *st, int initial,
                            int64_t *loaded_step) {
    hp_dcp_metadata_t md = NULL;
    hp_status_t s = hp_dcp_metadata_read(dir, &md);
    HP_TRY(agree(m->comm, s, "checkpoint: reading the metadata"));
    int full = !initial && hp_dcp_metadata_find(md, "train_state") != NULL;
    size_t dl_cap = 0;
    const hp_dcp_entry_t *e = hp_dcp_metadata_find(md, "dataloader");
    if (e && e->is_blob) {
        for (int c = 0; c < e->n_chunks; c++)
            if ((size_t)e->chunks[c].sizes[0] > dl_cap) dl_cap = (size_t)e->chunks[c].sizes[0];
    }
    int64_t md_step = hp_dcp_metadata_step(md);
    int saved_world = hp_dcp_metadata_world_size(md);
    hp_dcp_metadata_free(md);
    /* the data loader's per-rank state of another world size (an elastic restart on fewer
     * hosts): not loaded by DCP, which needs the same world for per-rank blobs, but below by
     * the loader's own resharding rule */
    int world = m->comm ? hp_comm_size(m->comm) : 1, dl_excluded = 0;
    for (int i = 0; i < m->n_exclude; i++) dl_excluded |= !strcmp(m->exclude[i], "dataloader");
    int reshard_dl = full && e && e->is_blob && st->dataloader && saved_world != world && !dl_excluded;
    const char *exclude[HP_CONFIG_LIST_MAX + 1];
    int n_exclude = full ? m->n_exclude : 0;
    for (int i = 0; i < n_exclude; i++) exclude[i] = m->exclude[i];
    if (reshard_dl) exclude[n_exclude++] = "dataloader";
    built_t b;
    HP_TRY(build_state(st, !full, -1, dl_cap ? dl_cap : 1, &b));
    hp_dcp_load_options_t o = {full, 1, exclude, n_exclude, m->skip_checksums};
    s = hp_dcp_load(dir, &b.st, m->comm, &o);
    if (s == HP_OK && reshard_dl) s = agree(m->comm, reshard_loader(m, dir, st->dataloader, saved_world, dl_cap),
                                             "checkpoint: resharding the data loader's state");
    if (s == HP_OK && !full) {
        /* model-only: every parameter must be there */
        char miss[512] = "";
        int nm = 0;
        for (int i = 0; i < b.nt; i++)
            if (!b.t[i].loaded) {
                if (nm < 6) snprintf(miss + strlen(miss), sizeof miss - strlen(miss), "%s'%s'", nm ? ", " : "", b.t[i].name);
                nm++;
            }
        if (nm)
            s = hp_error(HP_ERR_NOT_FOUND, "checkpoint %s lacks %d model parameter(s): %s%s (a different model?)", dir, nm,
                         miss, nm > 6 ? ", ..." : "");
        s = agree(m->comm, s, "checkpoint: model-only load");
    }
    if (s == HP_OK && full) {
        for (int i = 0; i < b.nb; i++) {
            hp_dcp_blob_t *bl = &b.b[i];
            if (!bl->loaded) continue;
            if (!strcmp(bl->name, "optimizer.step") && st->optim) hp_optim_set_step(st->optim, b.opt_step);
            if (!strcmp(bl->name, "train_state")) {
                if (bl->size != sizeof b.ts || b.ts[0] != TS_MAGIC) {
                    s = hp_error(HP_ERR_FORMAT, "checkpoint %s: train_state blob is malformed", dir);
                } else {
                    if (st->step) *st->step = b.ts[1];
                    if (st->seed) *st->seed = (uint64_t)b.ts[2];
                }
            }
            if (!strcmp(bl->name, "dataloader") && st->dataloader && s == HP_OK)
                s = hp_dataloader_state_load(st->dataloader, bl->data, bl->size);
        }
        s = agree(m->comm, s, "checkpoint: restoring the train state");
    }
    *loaded_step = full ? (st->step ? *st->step : md_step) : (initial ? 0 : (md_step > 0 ? md_step : 0));
    if (s == HP_OK && !full && !initial && md_step > 0) {
        /* a model-only checkpoint (the last-step export) in the run folder: continue at its step
         * with fresh optimizer and data state */
        if (st->step) *st->step = md_step;
        if (m->rank == 0)
            hp_log(HP_LOG_WARN, "checkpoint %s holds only the model (last_save_model_only); the optimizer state "
                   "and the data loader restart fresh at step %lld", dir, (long long)md_step);
    }
    built_free(&b);
    return s;
}

/* Rank 0 checks a step's files (sizes, keys) and tells every rank; the failure text stays
 * in `why` on rank 0. */
static hp_status_t step_complete(hp_ckpt_manager_t m, const char *dir, int *ok, char *why, size_t n) {
    int64_t v = 1;
    if (m->rank == 0 && hp_dcp_verify(dir, 0) != HP_OK) {
        v = 0;
        snprintf(why, n, "%s", hp_last_error());
    }
    if (m->comm && hp_comm_size(m->comm) > 1) HP_TRY(hp_broadcast(&v, 1, HP_I64, 0, m->comm, NULL));
    *ok = (int)v;
    return HP_OK;
}

hp_status_t hp_ckpt_manager_load(hp_ckpt_manager_t m, const hp_ckpt_train_state_t *st, int64_t *loaded_step,
                                 int *loaded) {
    *loaded_step = 0;
    *loaded = 0;
    int64_t steps[4096];
    int n = 0;
    hp_status_t s = hp_dcp_list_steps(m->folder, steps, 4096, &n);
    HP_TRY(agree(m->comm, s, "checkpoint: listing the folder"));
    if (n > 4096) n = 4096;
    if (n > 0) {
        if (m->load_step >= 0) {
            int found = 0;
            for (int i = 0; i < n; i++) found |= steps[i] == m->load_step;
            if (!found) {
                char list[256] = "";
                for (int i = 0; i < n && i < 16; i++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%lld", i ? ", " : "", (long long)steps[i]);
                return hp_error(HP_ERR_NOT_FOUND, "checkpoint.load_step = %lld but %s holds steps %s", (long long)m->load_step,
                                m->folder, list);
            }
        }
        /* newest first; an incomplete or corrupt step is skipped with a warning and kept on disk
         * (nothing saved is deleted); an explicit load_step does not fall back */
        char why[1024] = "";
        int n_bad = 0;
        int64_t newest_bad = -1;
        for (int i = n - 1; i >= 0; i--) {
            if (m->load_step >= 0 && steps[i] != m->load_step) continue;
            char dir[2 * HP_CONFIG_STR_MAX + 32];
            snprintf(dir, sizeof dir, "%s/step-%lld", m->folder, (long long)steps[i]);
            int ok = 0;
            HP_TRY(step_complete(m, dir, &ok, why, sizeof why));
            if (ok) {
                s = load_dir(m, dir, st, 0, loaded_step);
                if (s == HP_OK) {
                    if (m->rank == 0) {
                        hp_log(HP_LOG_INFO, "checkpoint: resumed from %s (step %lld)", dir, (long long)*loaded_step);
                        if (n_bad)
                            hp_log(HP_LOG_WARN, "checkpoint: resumed from step %lld, not from the newer step %lld, "
                                   "which is incomplete or corrupt (kept on disk; see the warning above)",
                                   (long long)steps[i], (long long)newest_bad);
                    }
                    *loaded = 1;
                    return HP_OK;
                }
                /* a corrupt shard (bad checksum, bad header) falls back; anything else (a
                 * different model, missing keys) is a real error */
                if (s != HP_ERR_FORMAT || m->load_step >= 0) return s;
                snprintf(why, sizeof why, "%s", hp_last_error());
            } else if (m->load_step >= 0) {
                return hp_error(HP_ERR_FORMAT, "checkpoint.load_step = %lld: %s is incomplete: %s", (long long)m->load_step,
                                dir, m->rank == 0 ? why : "see rank 0's log");
            }
            if (m->rank == 0)
                hp_log(HP_LOG_WARN, "checkpoint: skipping %s (kept on disk): %s", dir, why);
            if (newest_bad < 0) newest_bad = steps[i];
            n_bad++;
        }
        return hp_error(HP_ERR_FORMAT, "checkpoint folder %s holds %d step(s) but none is complete (newest problem: %s). "
                        "Hint: restore the files, set checkpoint.load_step, or move the folder aside to start fresh",
                        m->folder, n_bad, m->rank == 0 ? why : "see rank 0's log");
    }
    if (m->initial[0]) {
        if (hp_hf_is_hf_dir(m->initial)) {
            if (!st->model_config)
                return hp_error(HP_ERR_INVALID_ARG, "checkpoint.initial_load_path %s is an HF checkpoint but no model "
                                "config was given to the manager", m->initial);
            hp_hf_import_counts_t c0, c1;
            hp_hf_import_counts_get(&c0);
            HP_TRY(hp_hf_import(m->initial, hp_model_hf_adapter(st->model_config), st->model_config, st->params,
                                st->n_params, m->comm));
            hp_hf_import_counts_get(&c1);
            if (m->rank == 0)   /* each rank reads only its shards' rows (docs/checkpoint.md) */
                hp_log(HP_LOG_INFO, "checkpoint: HF initial load read %llu of the %llu bytes of the weights on rank 0",
                       (unsigned long long)(c1.bytes_read - c0.bytes_read),
                       (unsigned long long)(c1.bytes_total - c0.bytes_total));
        } else {
            HP_TRY(load_dir(m, m->initial, st, 1, loaded_step));
        }
        if (m->rank == 0) hp_log(HP_LOG_INFO, "checkpoint: initial weights from %s", m->initial);
        *loaded_step = 0;
        *loaded = 1;
    }
    return HP_OK;
}
