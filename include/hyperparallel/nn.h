/* nn: the module protocol (docs/nn.md) and the CPU kernels of the Llama-family layers, one
 * header per concept, all included here. Kernels take raw f32 pointers in the house order
 * (outputs, saved, inputs, weights, sizes; backward: gradients first). Each optimised kernel
 * has a plain reference twin (hp_ref_*) that tests compare it with. Activation-gradient
 * outputs say whether they are written (=) or accumulated (+=); parameter gradients always
 * accumulate (+=). */
#ifndef HYPERPARALLEL_NN_H
#define HYPERPARALLEL_NN_H

#include "nn_module.h"      /* the module protocol: activation context, ops, hooks, children */
#include "nn_layers.h"      /* linear, RMSNorm, embedding; the composite modules' interface */
#include "nn_moe.h"         /* the mixture-of-experts module and its expert kernels */
#include "nn_kernels.h"     /* the layers' kernels and their reference twins; ISA paths */
#include "nn_attention.h"   /* the causal attention kernels */
#include "nn_checkpoint.h"  /* activation checkpointing: the wrapper, save policies, their costs */

#endif
