/* Private helpers of the nn layer shared by module.c and model.c: activation-arena slots,
 * gradient scratch carving, module base initialisation. */
#ifndef HP_NN_IMPL_H
#define HP_NN_IMPL_H

#include "hyperparallel/nn.h"

/* Allocation from the activation arena; asserts (size-table bug) when it runs out. */
void *hp_act_alloc(hp_act_t *act, size_t bytes);
/* Allocates a module's saved-state struct and registers it under the module id. */
void *hp_act_slot_new(hp_act_t *act, const hp_module_t *m, size_t bytes);
/* The module's saved state of this microbatch (asserts it exists). */
void *hp_act_slot(hp_act_t *act, const hp_module_t *m);
/* Carves `floats` from act->grad_scratch at *offset (advanced). */
float *hp_act_scratch(hp_act_t *act, size_t *offset, size_t floats);
void hp_module_base_init(hp_module_t *m, const hp_module_ops_t *ops, const char *name, void *impl);

#endif
