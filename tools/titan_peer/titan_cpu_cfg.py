"""TorchTitan config_registry for the CPU runs: --module titan_cpu_cfg --config NAME, NAME one of
llama3_debugmodel_cpu, deepseek_v3_debugmodel_cpu, qwen3_moe_debug_cpu.

Copied from the lead's peer harness (../shared/peer/titan_cpu_cfg.py, llama3 only) and extended
to the MoE debug models. Each is TorchTitan's own config (torchtitan/models/<family>/
config_registry.py: llama3_debugmodel, deepseek_v3_debugmodel, qwen3_moe_debug) with one change:
every layer's inner attention is TorchTitan's ScaledDotProductAttention (causal
F.scaled_dot_product_attention over the packed sequence, no document mask) instead of
FlexAttention. TorchTitan 0.3.0 offers language models only "flex" and "varlen"
(models/common/config_utils.py; "sdpa" raises "sdpa is no longer supported for language
models"). Flex cannot train on CPU: PyTorch raises in torch/nn/attention/flex_attention.py
_validate_device "NotImplementedError: FlexAttention does not support backward on CPU"; varlen
is CUDA flash/cuDNN and casts to bf16 (models/common/attention.py VarlenAttention.forward). The
trainer supports the maskless SDPA config (trainer.py post_dataloading_process builds masks only
for Flex/Varlen). Causal attention over the packed sequence is also what hp-train computes
(src/nn/attention.c); MLA's q|k (192) and v (128) head widths go to SDPA as they are.
"""
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel
from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.models.qwen3.config_registry import qwen3_moe_debug


def _sdpa(cfg):
    for layer in cfg.model_spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return cfg


def llama3_debugmodel_cpu():
    return _sdpa(llama3_debugmodel())


def deepseek_v3_debugmodel_cpu():
    return _sdpa(deepseek_v3_debugmodel())


def qwen3_moe_debug_cpu():
    return _sdpa(qwen3_moe_debug())
