"""Weight initialisation of the decoder families, ``model.init=reference|normal``.

``reference`` (the default) is each family's published rule:

- Llama and Qwen3, as Meta's Llama 3 in torchtitan: token embeddings N(0, 1); the input projections (wq, wk, wv,
  w1) N(0, 0.02); the projections whose outputs feed the residual stream or gate it (wo, w2, w3) N(0, 0.02 /
  sqrt(2 (layer + 1))), deeper blocks smaller ("depth init"); the output layer N(0, d_model^-1/2) truncated at 3
  standard deviations; norms ones. A tied embedding is the output layer's weight, so it takes the output rule
  (torchtitan's order: the output is initialised last).
- DeepSeek-V3, as its report (arXiv 2412.19437, section 4.2): every weight N(0, 0.006), the experts and routers
  included; norms ones, routing biases zero.
- GPT, as GPT-2: every Linear and Embedding N(0, 0.02), biases zero, the residual projections (wo, w2)
  N(0, 0.02 / sqrt(2 n_layers)); LayerNorms ones and zeros.

``normal`` is meshtrain's rule before this module: every Linear and Embedding N(0, 0.02), biases zero.

Each rule is a function of the parameter's place (block index, role), never of what else the module holds, so a
pipeline stage or an FSDP shard initialised after a meta-device build draws from the same distribution per tensor
as the whole model; with a cpu build the whole model is drawn once and split, so every layout holds the same
values. ``models.spec.INIT_RULES`` names the choices (validation reads them).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.moe import MoE
from models.spec import INIT_RULES

BASE_STD = 0.02
DEEPSEEK_STD = 0.006
OUTPUT_CUTOFF = 3.0
"""The output layer's truncation, in standard deviations (torchtitan's ``cutoff_factor``)."""


def check_rule(init: str) -> str:
    if init not in INIT_RULES:
        raise ValueError(
            f"model.init={init}: use one of {', '.join(INIT_RULES)} (reference: the family's published rule)"
        )
    return init


def llama_depth_std(layer: int) -> float:
    """Standard deviation of block ``layer``'s output projections (wo, w2, w3): 0.02 / sqrt(2 (layer + 1))."""
    return BASE_STD / math.sqrt(2 * (layer + 1))


def llama_output_std(d_model: int) -> float:
    return d_model**-0.5


def gpt2_residual_std(n_layers: int) -> float:
    """GPT-2's residual projections: 0.02 / sqrt(2 n_layers) (two residual additions per block)."""
    return BASE_STD / math.sqrt(2 * n_layers)


def _normal(weight: torch.Tensor, std: float) -> None:
    nn.init.normal_(weight, mean=0.0, std=std)


def _output(weight: torch.Tensor, std: float) -> None:
    nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-OUTPUT_CUTOFF * std, b=OUTPUT_CUTOFF * std)


def holds_values(module: nn.Module) -> bool:
    """Whether ``module`` has values to draw: a meta-device build (the trainer's before ``to_empty``, the planner's dry
    run) has none, and drawing on meta tensors changes nothing (no values, no random numbers drawn) but costs more
    than the build (torch's reference kernels of ``normal_``): 1.4 of qwen3_235b_a22b's 1.8 s."""
    return any(not p.is_meta for p in module.parameters())


def _reset_norms(module: nn.Module) -> None:
    for sub in module.modules():
        if isinstance(sub, (nn.RMSNorm, nn.LayerNorm)):
            sub.reset_parameters()


def normal_init(module: nn.Module) -> None:
    """``model.init=normal``: N(0, 0.02) for every Linear and Embedding, zero biases, norms reset."""
    _reset_norms(module)
    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            _normal(sub.weight, BASE_STD)
            if getattr(sub, "bias", None) is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, MoE):  # stacked experts and the router: N(0, 0.02) too
            sub.init_weights(std=BASE_STD, out_std=BASE_STD)


@torch.no_grad()
def init_llama(model: nn.Module, init: str, *, d_model: int, tie_embeddings: bool) -> None:
    """Initialise what ``model`` (a Llama or Qwen3, whole or a pipeline stage, on a real device or meta) holds."""
    rule = check_rule(init)
    if not holds_values(model):
        return
    if rule == "normal":
        normal_init(model)
        return
    _reset_norms(model)
    out_std = llama_output_std(d_model)
    if model.tok_embeddings is not None:
        if tie_embeddings:  # the output layer's weight: its rule (a stage without the output draws it the same way)
            _output(model.tok_embeddings.weight, out_std)
        else:
            _normal(model.tok_embeddings.weight, 1.0)
    for key, block in model.layers.items():
        depth_std = llama_depth_std(int(key))
        attention, ffn = block.attention, block.feed_forward
        sparse = isinstance(ffn, MoE)  # Qwen3-MoE: the same rule over the stacked experts (router as w1)
        if sparse:
            ffn.init_weights(std=BASE_STD, out_std=depth_std)
        for linear in (attention.wq, attention.wk, attention.wv, *(() if sparse else (ffn.w1,))):
            _normal(linear.weight, BASE_STD)
        for linear in (attention.wo, *(() if sparse else (ffn.w2, ffn.w3))):
            _normal(linear.weight, depth_std)
    if model.output is not None and not (tie_embeddings and model.tok_embeddings is not None):
        _output(model.output.weight, out_std)


@torch.no_grad()
def init_gpt(model: nn.Module, init: str, *, n_layers: int) -> None:
    """Initialise what ``model`` (a GPT, whole or a pipeline stage) holds: GPT-2's rule or ``normal``."""
    rule = check_rule(init)
    if not holds_values(model):
        return
    normal_init(model)
    if rule == "reference":
        residual_std = gpt2_residual_std(n_layers)
        for block in model.layers.values():
            _normal(block.attention.wo.weight, residual_std)
            _normal(block.feed_forward.w2.weight, residual_std)


@torch.no_grad()
def init_deepseek(model: nn.Module, init: str) -> None:
    """Initialise what ``model`` (a DeepSeek-V3, whole or a pipeline stage) holds: N(0, 0.006) everywhere (the
    reference) or ``normal``'s N(0, 0.02); norms ones, routing biases zero."""
    std = DEEPSEEK_STD if check_rule(init) == "reference" else BASE_STD
    if not holds_values(model):
        return
    _reset_norms(model)
    for sub in model.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            _normal(sub.weight, std)
        elif isinstance(sub, MoE):
            sub.init_weights(std=std, out_std=std)
