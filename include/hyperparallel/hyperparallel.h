/* Umbrella header: every public HyperParallel-C header. */
#ifndef HYPERPARALLEL_H
#define HYPERPARALLEL_H

#include "status.h"
#include "parse.h"
#include "dtype.h"
#include "arena.h"
#include "tensor.h"
#include "rng.h"
#include "comm.h"
#include "launch.h"
#include "mesh.h"
#include "dtensor.h"
#include "param.h"
#include "nn.h"
#include "nn_loss.h"
#include "model.h"
#include "optim.h"
#include "safetensors.h"
#include "checkpoint.h"
#include "fsdp.h"
#include "ddp.h"
#include "zero.h"
#include "tp.h"
#include "tokenizer.h"
#include "config.h"
#include "parallel_dims.h"
#include "data.h"
#include "metrics.h"
#include "ckpt_manager.h"
#include "trainer.h"

#endif
