"""Tensor parallel for the Hugging Face backend, from the architecture's own plan: transformers' config carries
``base_model_tp_plan`` (module pattern -> style name, ``layers.*.self_attn.q_proj: colwise`` ...), applied here with
torch's DTensor styles over the tp mesh, the head split as transformers splits it (``lm_head``: column-wise, its
logits gathered, or left vocabulary-sharded under loss parallel).

| transformers' style            | torch's style here                                                              |
|--------------------------------|---------------------------------------------------------------------------------|
| colwise                        | ``ColwiseParallel()``: output split over the features (heads)                   |
| rowwise                        | ``RowwiseParallel()``: input split, output all-reduced                          |
| colwise_gather_output          | ``ColwiseParallel(output_layouts=Replicate())`` (OLMo 2, Phi-3: a norm or a split over the whole width follows) |
| rowwise_split_input            | ``RowwiseParallel(input_layouts=Replicate())``                                  |
| replicated_with_grad_allreduce | per-head norms on a tp rank's own heads: weights replicated, gradients summed over tp |
| mla_kv_a_proj                  | DeepSeek's latent projection, replicated: the column-wise ``kv_b_proj`` after it sums its input's gradient, and the rotary key's columns, which every head reads and no projection follows, have theirs summed over tp (``share_rotary_key``) |
| embedding_rowwise              | the embedding split over the vocabulary, the partial lookups summed             |

LoRA's adapters (``model.lora.targets``: transformers' layer names) follow their layer's split as on the native
decoders (``models/lora.py: attach_adapters``): a column-wise layer's ``B`` split by rows (the gathered styles too:
the sum is gathered with the base output), a row-wise one's ``A`` by columns; a layer the plan leaves whole keeps
its adapters whole. A tied embedding is split as the head (``Shard(0)`` of one matrix) and the head takes its
Parameter again, as the native decoders do (``models/tensor_parallel.py``). Sequence parallel is not offered: where
each architecture's norms sit relative to its projections differs (OLMo 2's after them), so the residual stream
stays replicated; validation refuses ``tp.sequence_parallel=true`` with this family before spawn. What the plan
needs of the sizes (heads, key/value heads, widths divisible by tp) and a plan that splits no attention are refused
before spawn too (``models/hf_transformers/spec.py``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from models.hf_transformers.spec import TP_STYLES
from models.lora import attach_adapters, detach_adapters
from models.tensor_parallel import sum_grad_over_tp


def torch_style(name: str) -> Any:
    """torch's parallel style for transformers' style ``name`` (None: the module stays replicated)."""
    if name == "colwise":
        return ColwiseParallel()
    if name == "rowwise":
        return RowwiseParallel()
    if name == "colwise_gather_output":
        return ColwiseParallel(output_layouts=Replicate())
    if name == "rowwise_split_input":
        return RowwiseParallel(input_layouts=Replicate())
    if name == "replicated_with_grad_allreduce":
        # the input is this rank's heads: declared sharded on a dimension the norm does not reduce over, so the
        # replicated weight's gradient is summed over tp (local tensors unchanged)
        return SequenceParallel(sequence_dim=0, use_local_output=True)
    if name == "embedding_rowwise":
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if name == "mla_kv_a_proj":
        return None
    raise ValueError(f"transformers' tensor-parallel style {name!r} is not one meshtrain applies ({TP_STYLES})")


def _matches(model: nn.Module, plan: dict[str, str]) -> Iterator[tuple[str, str]]:
    """(submodule name, transformers' style) for each of the plan's patterns, in the plan's order, matched against
    this module's (a whole model's or a pipeline stage's) submodules."""
    present = [name for name, module in model.named_modules() if name and module is not None]
    for pattern, style in plan.items():
        for name in fnmatch.filter(present, pattern):
            yield name, style


def plan_for(model: nn.Module, plan: dict[str, str]) -> dict[str, Any]:
    """The plan's patterns matched against this module's submodules, as torch's styles."""
    out: dict[str, Any] = {}
    for name, style in _matches(model, plan):
        chosen = torch_style(style)
        if chosen is not None:
            out[name] = chosen
    return out


def share_rotary_key(model: nn.Module, plan: dict[str, str], tp_mesh: DeviceMesh) -> int:
    """The ``mla_kv_a_proj`` modules' outputs (the latent, then ``qk_rope_head_dim`` rotary key channels): the rotary
    key goes to every head's attention as it is, so a tp rank's heads give only their share of its gradient, summed
    over tp here in backward (transformers' ``MlaKvAProjParallel``); returns how many modules."""
    names = [name for name, style in _matches(model, plan) if style == "mla_kv_a_proj"]
    rope, group = int(getattr(model.hf_config, "qk_rope_head_dim", 0) or 0), tp_mesh.get_group()

    def hook(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        latent, key = out.split([out.shape[-1] - rope, rope], dim=-1)
        return torch.cat([latent, sum_grad_over_tp(key, group)], dim=-1)

    for name in names:
        model.get_submodule(name).register_forward_hook(hook)
    return len(names)


def parallelize_hf(
    model: nn.Module, *, tp_mesh: DeviceMesh, sequence_parallel: bool = False, loss_parallel: bool = False, **_: Any
) -> nn.Module:
    """Apply the architecture's ``base_model_tp_plan`` in place, then the head's split; returns ``model``."""
    if tp_mesh.size() == 1:
        return model
    if sequence_parallel:
        raise ValueError("tp.sequence_parallel=true: the Hugging Face backend keeps the residual stream replicated")
    plan = dict(model.hf_config.base_model_tp_plan or {})
    by_name = plan_for(model, plan)
    tied = bool(getattr(model.hf_config, "tie_word_embeddings", False))
    embedding, head = model.embed_tokens, model.lm_head
    if tied and embedding is not None:
        by_name["embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if head is not None:
        by_name["lm_head"] = ColwiseParallel(
            input_layouts=Replicate(),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    adapters = detach_adapters(model)  # LoRA: the base weights split first, then their adapters to match
    parallelize_module(model, tp_mesh, by_name)
    share_rotary_key(model, plan, tp_mesh)
    for name, p in model.named_parameters():  # torch's SequenceParallel makes every weight it replicates trainable
        if name in frozen:
            p.requires_grad_(False)
    if adapters:
        split = {name: parts for name, parts in adapters.items() if name in by_name}
        colwise = [name for name, style in by_name.items() if isinstance(style, ColwiseParallel)]
        attach_adapters(model, split, tp_mesh=tp_mesh, colwise=colwise)
        for name in adapters.keys() - split.keys():  # a layer the plan leaves whole keeps its adapters whole
            module = model.get_submodule(name)
            module.lora_A, module.lora_B, module.lora_dropout = adapters[name]
    if tied and embedding is not None and head is not None:
        head.weight = embedding.weight  # one Parameter again (each module's weight was distributed on its own)
    return model
