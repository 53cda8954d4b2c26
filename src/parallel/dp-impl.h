/* Private helpers shared by the data-parallel wrappers (fsdp.c, ddp.c). */
#ifndef HP_DP_IMPL_H
#define HP_DP_IMPL_H

#include "hyperparallel/model.h"
#include "hyperparallel/status.h"

/* Marks `model` as wrapped by `what` ("fully_shard", "DDP"); HP_ERR_STATE naming the earlier
 * wrapper when it already is (fully_shard twice, DDP over FSDP). */
hp_status_t hp_dp_register(hp_model_t model, const char *what);
void hp_dp_unregister(hp_model_t model);
/* Registers the wrapper's unit hooks (NULL slots skipped) on every unit's outer module, user
 * as their context; detach removes them again. */
hp_status_t hp_dp_attach_hooks(hp_model_t model, void *user, const hp_module_hook_fn fns[HP_HOOK_KINDS]);
void hp_dp_detach_hooks(hp_model_t model, void *user);

#endif
