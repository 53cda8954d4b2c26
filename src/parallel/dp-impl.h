/* Private helpers shared by the data-parallel wrappers (fsdp.c, ddp.c). */
#ifndef HP_DP_IMPL_H
#define HP_DP_IMPL_H

#include "hyperparallel/model.h"
#include "hyperparallel/status.h"

/* Marks `model` as wrapped by `what` ("fully_shard", "DDP"); HP_ERR_STATE naming the earlier
 * wrapper when it already is (fully_shard twice, DDP over FSDP). */
hp_status_t hp_dp_register(hp_model_t model, const char *what);
void hp_dp_unregister(hp_model_t model);
double hp_dp_now(void);

#endif
