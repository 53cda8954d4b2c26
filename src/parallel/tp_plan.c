/* Tensor parallel styles and plans (PyTorch's ParallelStyle classes and parallelize_module's
 * plan dict): the style constructors, plan entries, and matching a plan to the module tree
 * (fnmatch over dotted names, a fused linear's parts) with each (module, style) pair checked. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/tp-impl.h"

/* ---- styles ------------------------------------------------------------------------------ */

static hp_tp_style_t style_base(hp_tp_style_kind_t kind) {
    hp_tp_style_t s;
    memset(&s, 0, sizeof(s));
    s.kind = kind;
    s.use_local_output = 1;
    s.sequence_dim = 1;
    return s;
}

hp_tp_style_t hp_tp_colwise(void) { return style_base(HP_TP_COLWISE); }
hp_tp_style_t hp_tp_rowwise(void) { return style_base(HP_TP_ROWWISE); }
hp_tp_style_t hp_tp_sequence_parallel(void) {
    hp_tp_style_t s = style_base(HP_TP_SEQUENCE_PARALLEL);
    s.use_local_output = 0;
    return s;
}
hp_tp_style_t hp_tp_no_parallel(void) { return style_base(HP_TP_NO_PARALLEL); }

hp_tp_style_t hp_tp_prepare_input(hp_placement_t input_layout, hp_placement_t desired_input_layout) {
    hp_tp_style_t s = style_base(HP_TP_PREPARE_INPUT);
    s.use_local_output = 0;
    s.has_input_layout = s.has_desired_input = 1;
    s.input_layout = input_layout;
    s.desired_input_layout = desired_input_layout;
    return s;
}

hp_tp_style_t hp_tp_prepare_output(hp_placement_t output_layout, hp_placement_t desired_output_layout) {
    hp_tp_style_t s = style_base(HP_TP_PREPARE_OUTPUT);
    s.has_output_layout = s.has_desired_output = 1;
    s.output_layout = output_layout;
    s.desired_output_layout = desired_output_layout;
    return s;
}

hp_tp_style_t hp_tp_prepare_input_output(hp_placement_t input_layout, hp_placement_t desired_input_layout,
                                         hp_placement_t output_layout, hp_placement_t desired_output_layout) {
    hp_tp_style_t s = style_base(HP_TP_PREPARE_INPUT_OUTPUT);
    s.use_local_output = 0;
    s.has_input_layout = s.has_desired_input = s.has_output_layout = s.has_desired_output = 1;
    s.input_layout = input_layout;
    s.desired_input_layout = desired_input_layout;
    s.output_layout = output_layout;
    s.desired_output_layout = desired_output_layout;
    return s;
}

hp_tp_style_t hp_tp_with_input(hp_tp_style_t s, hp_placement_t input_layout) {
    s.has_input_layout = 1;
    s.input_layout = input_layout;
    return s;
}

hp_tp_style_t hp_tp_with_output(hp_tp_style_t s, hp_placement_t output_layout, int use_local_output) {
    s.has_output_layout = 1;
    s.output_layout = output_layout;
    s.use_local_output = use_local_output;
    return s;
}

const char *hp_tp_style_name(hp_tp_style_kind_t kind) {
    switch (kind) {
    case HP_TP_COLWISE: return "ColwiseParallel";
    case HP_TP_ROWWISE: return "RowwiseParallel";
    case HP_TP_SEQUENCE_PARALLEL: return "SequenceParallel";
    case HP_TP_PREPARE_INPUT: return "PrepareModuleInput";
    case HP_TP_PREPARE_OUTPUT: return "PrepareModuleOutput";
    case HP_TP_PREPARE_INPUT_OUTPUT: return "PrepareModuleInputOutput";
    case HP_TP_NO_PARALLEL: return "NoParallel";
    }
    return "?";
}

static int style_equal(const hp_tp_style_t *a, const hp_tp_style_t *b) {
    return memcmp(a, b, sizeof(*a)) == 0;
}

/* ---- plans ------------------------------------------------------------------------------- */

int hp_tp_plan_add(hp_tp_plan_entry_t *plan, int cap, int n, const char *pattern, hp_tp_style_t s) {
    if (plan && n < cap) {
        snprintf(plan[n].pattern, sizeof(plan[n].pattern), "%s", pattern);
        plan[n].style = s;
    }
    return n + 1;
}

/* ---- matching a plan ------------------------------------------------------------------------- */

/* Names a module answers to: its own, and for a stacked linear its params' module names. */
static int module_names(const hp_module_t *m, char names[][HP_PARAM_NAME_MAX], int cap) {
    int n = 0;
    snprintf(names[n++], HP_PARAM_NAME_MAX, "%s", m->name);
    const hp_module_t *lin = tp_lin_c(m);   /* LoRA's module answers to its linear's parts */
    if (module_kind(m) == MK_LINEAR && lin->n_params > 1) {
        for (int i = 0; i < lin->n_params && n < cap; i++) {
            const char *pn = lin->params[i]->name;
            size_t len = strlen(pn);
            if (len > 7 && strcmp(pn + len - 7, ".weight") == 0) len -= 7;
            snprintf(names[n++], HP_PARAM_NAME_MAX, "%.*s", (int)len, pn);
        }
    }
    return n;
}

/* "1, 2, 4, 8": the TP degrees that divide n (for the hint of a divisibility error); the
 * library does not know config keys, the trainer names them (src/train/trainer.c). */
const char *hp_tp_divisors_(int64_t n, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (int64_t d = 1; d <= n && o + 24 < cap; d++)
        if (n % d == 0) o += (size_t)snprintf(buf + o, cap - o, "%s%lld", o ? ", " : "", (long long)d);
    return buf;
}

/* Validates one (module, style) pair; fills the linear/embedding sizes. */
hp_status_t hp_tp_check_pair_(hp_tp_t tp, hp_module_t *m, const hp_tp_style_t *s, const char *pattern) {
    const int mk = module_kind(m), k = tp->k;
    const char *sn = hp_tp_style_name(s->kind);
    switch (s->kind) {
    case HP_TP_COLWISE:
    case HP_TP_ROWWISE:
        if (mk != MK_LINEAR && mk != MK_EMBEDDING)
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' applies %s to module '%s' of "
                            "kind '%s'; %s supports only linear and embedding modules (NotImplementedError in "
                            "PyTorch); hint: use PrepareModuleInput/Output for composite modules",
                            pattern, sn, m->name, m->ops->kind, sn);
        break;
    case HP_TP_SEQUENCE_PARALLEL:
        if (mk != MK_RMSNORM)
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' applies SequenceParallel to "
                            "module '%s' of kind '%s'; here it supports rmsnorm modules (rowwise ops over the "
                            "sequence)", pattern, m->name, m->ops->kind);
        break;
    case HP_TP_PREPARE_INPUT:
    case HP_TP_PREPARE_OUTPUT:
    case HP_TP_PREPARE_INPUT_OUTPUT:
        if (mk == MK_EMBEDDING && prep_in(&(tp_mod_t){.style = *s}))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s': %s on embedding '%s' (token "
                            "ids cannot be redistributed here)", pattern, sn, m->name);
        break;
    case HP_TP_NO_PARALLEL:
        break;
    }
    // layouts
    if (s->kind == HP_TP_COLWISE) {
        if (s->has_input_layout && !is_rep(&s->input_layout) && !is_shard_seq(&s->input_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (module '%s'): ColwiseParallel "
                            "input_layouts must be Replicate, Shard(0) or Shard(1)", pattern, m->name);
        if (s->has_output_layout && !is_rep(&s->output_layout) && !is_shard_last(&s->output_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (module '%s'): ColwiseParallel "
                            "output_layouts must be Shard(-1) or Replicate", pattern, m->name);
        if (mk == MK_EMBEDDING && s->has_input_layout && !is_rep(&s->input_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (embedding '%s'): input must be "
                            "Replicate token ids", pattern, m->name);
    }
    if (s->kind == HP_TP_ROWWISE) {
        if (mk == MK_LINEAR && s->has_input_layout && !is_shard_last(&s->input_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (linear '%s'): RowwiseParallel "
                            "input_layouts other than Shard(-1) are not supported; hint: put the colwise "
                            "producer before it", pattern, m->name);
        if (mk == MK_EMBEDDING && s->has_input_layout && !is_rep(&s->input_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (embedding '%s'): input must be "
                            "Replicate token ids", pattern, m->name);
        if (s->has_output_layout && !is_rep(&s->output_layout) && !is_shard_seq(&s->output_layout))
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (module '%s'): RowwiseParallel "
                            "output_layouts must be Replicate, Shard(0) or Shard(1)", pattern, m->name);
    }
    if (prep_in(&(tp_mod_t){.style = *s})) {
        const hp_placement_t *a = &s->input_layout, *b = &s->desired_input_layout;
        int ok = (is_rep(a) && is_rep(b)) || (is_shard_seq(a) && is_rep(b)) || (is_shard_seq(a) && is_shard_seq(b) && a->dim == b->dim);
        if (!ok)
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (module '%s'): PrepareModuleInput "
                            "supports Replicate->Replicate and Shard(0|1)->Replicate", pattern, m->name);
    }
    if (prep_out(&(tp_mod_t){.style = *s})) {
        const hp_placement_t *a = &s->output_layout, *b = &s->desired_output_layout;
        int ok = (is_rep(a) && is_rep(b)) || (is_shard_seq(a) && is_rep(b)) || (is_rep(a) && is_shard_seq(b)) ||
                 (is_shard_seq(a) && is_shard_seq(b) && a->dim == b->dim);
        if (!ok)
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: pattern '%s' (module '%s'): PrepareModuleOutput "
                            "supports Replicate<->Shard(0|1)", pattern, m->name);
    }
    // divisibility
    char dv[256];
    if (mk == MK_LINEAR && (s->kind == HP_TP_COLWISE || s->kind == HP_TP_ROWWISE)) {
        const hp_module_t *lin = tp_lin_c(m);
        const hp_linear_impl_t *L = lin->impl;
        if (s->kind == HP_TP_COLWISE) {
            for (int i = 0; i < lin->n_params; i++) {
                const hp_param_t *p = lin->params[i];
                if (L->has_bias && i == L->n_weights) continue;
                if (p->value.local.shape[0] % k != 0)
                    return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: ColwiseParallel on '%s': parameter '%s' has "
                                    "%lld rows, not divisible by the TP degree %d; hint: degrees dividing it: %s",
                                    m->name, p->name, (long long)p->value.local.shape[0], k,
                                    hp_tp_divisors_(p->value.local.shape[0], dv, sizeof dv));
            }
            if (L->has_bias)
                return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: linear '%s' has a bias; sharded biases are "
                                "not implemented (the llama/qwen models have none)", m->name);
        } else if (L->in_features % k != 0) {
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: RowwiseParallel on '%s': in_features %d is not "
                            "divisible by the TP degree %d; hint: degrees dividing it: %s", m->name, L->in_features, k,
                            hp_tp_divisors_(L->in_features, dv, sizeof dv));
        }
    }
    if (mk == MK_EMBEDDING && (s->kind == HP_TP_COLWISE || s->kind == HP_TP_ROWWISE)) {
        const hp_embedding_impl_t *E = m->impl;
        int64_t n = s->kind == HP_TP_ROWWISE ? E->vocab : E->dim;
        if (n % k != 0)
            return hp_error(HP_ERR_INVALID_ARG, "tensor parallel: %s on embedding '%s': %s %lld is not divisible by "
                            "the TP degree %d; hint: degrees dividing it: %s", sn, m->name,
                            s->kind == HP_TP_ROWWISE ? "vocab" : "dim", (long long)n, k,
                            hp_tp_divisors_(n, dv, sizeof dv));
    }
    return HP_OK;
}

/* Resolves the plan over the modules: style per module (NULL = none). TP wrappers are not
 * matched (they carry their module's name); a module a wrapper already holds is an error. */
hp_status_t hp_tp_resolve_plan_(hp_module_t **mods, hp_module_t **parents, int n, const hp_tp_plan_entry_t *plan,
                                int n_plan, const hp_tp_style_t **styles, int *entry_of) {
    int *hits = hp_calloc((size_t)(n_plan > 0 ? n_plan : 1), sizeof(int));
    if (!hits) return HP_ERR_OOM;
    hp_status_t st = HP_OK;
    for (int i = 0; i < n && st == HP_OK; i++) {
        styles[i] = NULL;
        entry_of[i] = -1;
        if (hp_tp_is_wrapper_(mods[i])) continue;
        if (is_lora(parents[i])) continue;   /* LoRA's linear: the style applies to the LoRA module */
        char names[HP_MODULE_MAX_PARAMS + 1][HP_PARAM_NAME_MAX];
        int nn = module_names(mods[i], names, HP_MODULE_MAX_PARAMS + 1);
        const hp_tp_style_t *got[HP_MODULE_MAX_PARAMS + 1] = {0};
        int got_e[HP_MODULE_MAX_PARAMS + 1];
        for (int j = 0; j < nn && st == HP_OK; j++) {
            got_e[j] = -1;
            for (int e = 0; e < n_plan; e++) {
                if (fnmatch(plan[e].pattern, names[j], 0) != 0) continue;
                hits[e]++;
                if (got[j] && !style_equal(got[j], &plan[e].style)) {
                    st = hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: module '%s' matches pattern '%s' (%s) "
                                  "and pattern '%s' (%s) with different styles; hint: make the patterns disjoint",
                                  names[j], plan[got_e[j]].pattern, hp_tp_style_name(got[j]->kind), plan[e].pattern,
                                  hp_tp_style_name(plan[e].style.kind));
                    break;
                }
                got[j] = &plan[e].style;
                got_e[j] = e;
            }
        }
        if (st != HP_OK) break;
        styles[i] = got[0];
        entry_of[i] = got_e[0];
        if (nn > 1) {   // a fused linear: its stacked parts must agree
            for (int j = 1; j < nn; j++) {
                int same = (got[j] == NULL && got[1] == NULL) ||
                           (got[j] && got[1] && style_equal(got[j], got[1]));
                if (!same) {
                    st = hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: '%s' and '%s' are one fused GEMM ('%s') "
                                  "and need the same style, got %s and %s", names[1], names[j], mods[i]->name,
                                  got[1] ? hp_tp_style_name(got[1]->kind) : "none",
                                  got[j] ? hp_tp_style_name(got[j]->kind) : "none");
                    break;
                }
            }
            if (st != HP_OK) break;
            if (got[1]) {
                if (got[0] && !style_equal(got[0], got[1])) {
                    st = hp_error(HP_ERR_INVALID_ARG, "tensor parallel plan: fused module '%s' gets %s by its own name "
                                  "and %s by its parts", mods[i]->name, hp_tp_style_name(got[0]->kind),
                                  hp_tp_style_name(got[1]->kind));
                    break;
                }
                styles[i] = got[1];
                entry_of[i] = got_e[1];
            }
        }
        if (styles[i] && parents[i] && hp_tp_is_wrapper_(parents[i])) {
            st = hp_error(HP_ERR_STATE, "tensor parallel: module '%s' is already parallelized; hint: call "
                          "parallelize once per module", mods[i]->name);
            break;
        }
    }
    for (int e = 0; st == HP_OK && e < n_plan; e++)
        if (hits[e] == 0) {
            char ex[HP_PARAM_NAME_MAX * 3] = "";
            int shown = 0;
            for (int i = 0; i < n && shown < 3; i++) {
                if (!mods[i]->name[0] || hp_tp_is_wrapper_(mods[i])) continue;
                size_t len = strlen(ex);
                snprintf(ex + len, sizeof(ex) - len, "%s'%s'", shown ? ", " : "", mods[i]->name);
                shown++;
            }
            st = hp_error(HP_ERR_NOT_FOUND, "tensor parallel plan: pattern '%s' (%s) matches no module; module "
                          "names look like %s (fnmatch over dotted names)", plan[e].pattern,
                          hp_tp_style_name(plan[e].style.kind), ex);
        }
    free(hits);
    return st;
}
