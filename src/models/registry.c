/* The model registry: one line per family (its folder under src/models/ defines the spec), the
 * lookups, and resolving a flavor. A new family is a new folder plus one line in FAMILIES
 * (docs/architecture.md, "Adding a model family"). */
#include <stdio.h>
#include <string.h>
#include "models/models-impl.h"

#define FAMILIES(X) \
    X(llama3)       \
    X(qwen3)        \
    X(deepseek_v3)  \
    X(qwen3_moe)

#define DECLARE(f) extern const hp_model_spec_t hp_##f##_spec;
FAMILIES(DECLARE)
#undef DECLARE
#define ENTRY(f) &hp_##f##_spec,
static const hp_model_spec_t *const registry[] = {FAMILIES(ENTRY)};
#undef ENTRY
#define N_FAMILIES ((int)(sizeof registry / sizeof registry[0]))

int hp_model_spec_count(void) { return N_FAMILIES; }

const hp_model_spec_t *hp_model_spec_at(int i) { return i >= 0 && i < N_FAMILIES ? registry[i] : NULL; }

const hp_model_spec_t *hp_model_spec_find(const char *name) {
    for (int i = 0; name && i < N_FAMILIES; i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return NULL;
}

const hp_hf_adapter_t *hp_model_hf_adapter(const hp_model_config_t *cfg) {
    const hp_model_spec_t *s = cfg ? hp_model_spec_find(cfg->name) : NULL;
    return s ? s->hf : NULL;
}

hp_status_t hp_model_flavor(const char *model_name, const char *flavor, hp_model_config_t *cfg) {
    if (!model_name || !flavor || !cfg)
        return hp_error(HP_ERR_INVALID_ARG, "hp_model_flavor: model name, flavor and cfg must be non-NULL");
    const hp_model_spec_t *s = hp_model_spec_find(model_name);
    if (!s) {
        char list[512];
        size_t l = 0;
        list[0] = 0;
        for (int i = 0; i < N_FAMILIES && l < sizeof list; i++)
            l += (size_t)snprintf(list + l, sizeof list - l, "%s%s (%s)", i ? ", " : "", registry[i]->name,
                                  registry[i]->flavors);
        return hp_error(HP_ERR_INVALID_ARG, "unknown model '%s'; valid models: %s", model_name, list);
    }
    if (!s->flavor(flavor, cfg))
        return hp_error(HP_ERR_INVALID_ARG, "model '%s': unknown flavor '%s'; valid flavors: %s", s->name, flavor,
                        s->flavors);
    snprintf(cfg->name, sizeof cfg->name, "%s", s->name);
    cfg->arch = s->arch;
    return hp_model_config_validate(cfg);
}
