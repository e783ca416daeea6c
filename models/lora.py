"""LoRA (``model.lora.rank > 0``): low-rank adapters beside frozen weights, named as PEFT names them.

Each targeted ``nn.Linear`` (``model.lora.targets``: module names such as ``wq``, ``wv``, ``w1``, or ``fnmatch``
patterns over the FQN such as ``layers.*.attention.wq``) becomes a ``LoRALinear``: the same module, its ``weight``
(and bias) kept under the same name and frozen, plus ``lora_A`` (rank x in) and ``lora_B`` (out x rank), so the
output is ``x W^T + (alpha / rank) * B A x``. Every other parameter is frozen too: only the adapters have
gradients and optimizer state. The adapters start as PEFT's do (``A`` Kaiming-uniform, ``B`` zero: the model
starts equal to its base), drawn from the seed and the adapter's name on the full tensor, so every layout (a whole
model, a pipeline stage, an FSDP2 shard) holds the same values (``init_lora``). ``merged_state`` folds them into the
base weights (``--merge`` exports); ``trainer/export.py`` writes them as a PEFT adapter folder otherwise.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.shape import targeted

#: the adapters' parameter names inside a ``LoRALinear`` (PEFT's, without its adapter name)
ADAPTERS = ("lora_A", "lora_B")


@dataclass(frozen=True)
class LoRA:
    rank: int
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("wq", "wv")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def of(cls, model: Mapping[str, Any]) -> LoRA | None:
        """The run's adapters (``model.lora`` of the typed model config), or None when ``rank`` is 0 (no LoRA)."""
        lora = model.get("lora")
        if not lora or int(lora.get("rank", 0)) <= 0:
            return None
        return cls(
            rank=int(lora["rank"]),
            alpha=float(lora.get("alpha", 16.0)),
            dropout=float(lora.get("dropout", 0.0)),
            targets=tuple(str(t) for t in lora.get("targets", ("wq", "wv"))),
        )


class LoRALinear(nn.Linear):
    """An ``nn.Linear`` with adapters (``apply_lora`` swaps the class of an existing one; its weight stays)."""

    lora_A: nn.Linear
    lora_B: nn.Linear
    lora_dropout: nn.Module
    scaling: float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


@contextmanager
def adapters_disabled(modules: Iterable[nn.Module]) -> Iterator[int]:
    """Run ``modules`` as their base (every ``LoRALinear``'s adapters scaled by 0), as PEFT's ``disable_adapter``:
    the reference a preference objective compares with, no copy held. Yields how many layers it switched off."""
    adapted = [m for part in modules for m in part.modules() if isinstance(m, LoRALinear)]
    saved = [m.scaling for m in adapted]
    for m in adapted:
        m.scaling = 0.0
    try:
        yield len(adapted)
    finally:
        for m, scaling in zip(adapted, saved):
            m.scaling = scaling


def is_adapter(fqn: str) -> bool:
    """Whether ``fqn`` names an adapter tensor (``....lora_A.weight``)."""
    return any(f".{name}." in f".{fqn}" for name in ADAPTERS)


def apply_lora(model: nn.Module, lora: LoRA) -> list[str]:
    """Add adapters to every targeted ``nn.Linear`` of ``model`` (on its device: meta too) and freeze everything
    else; returns the adapted modules' FQNs. Raises ValueError when no module matches."""
    adapted = []
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear or not targeted(name, lora.targets):
            continue
        device, dtype = module.weight.device, module.weight.dtype
        module.__class__ = LoRALinear
        module.lora_A = nn.Linear(module.in_features, lora.rank, bias=False, device=device, dtype=dtype)
        module.lora_B = nn.Linear(lora.rank, module.out_features, bias=False, device=device, dtype=dtype)
        module.lora_dropout = nn.Dropout(lora.dropout) if lora.dropout > 0 else nn.Identity()
        module.scaling = lora.scaling
        adapted.append(name)
    if not adapted:
        linears = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m) is nn.Linear})
        raise ValueError(
            f"model.lora.targets={list(lora.targets)} match no linear layer of the model; its linear layers are "
            f"named {linears}"
        )
    for fqn, p in model.named_parameters():
        p.requires_grad_(is_adapter(fqn))
    return adapted


def _draw(fqn: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """``A``'s full initial value (PEFT's ``kaiming_uniform_(a=sqrt(5))``: bound 1/sqrt(in)), from the seed and its
    name alone, so any rank holding any slice of it draws the same numbers."""
    digest = int.from_bytes(hashlib.sha256(f"{seed}:{fqn}".encode()).digest()[:8], "little")
    generator = torch.Generator().manual_seed(digest % (2**63))
    bound = 1.0 / math.sqrt(shape[1])
    return (torch.rand(shape, generator=generator, dtype=torch.float32) * 2 - 1) * bound


def add_adapters(model: nn.Module, model_config: Any, *, seed: int, draw: bool) -> int | None:
    """``model.lora``'s adapters added to ``model`` (the rest frozen), as the trainer and the planner's dry run build
    it: how many modules got them, None when the config asks for none. ``draw``: initialise them now (a model
    built on the meta device draws them once placed, ``init_lora``)."""
    lora = LoRA.of(model_config)
    if lora is None:
        return None
    adapted = len(apply_lora(model, lora))
    if draw:
        init_lora(model, seed=seed)
    return adapted


@torch.no_grad()
def init_lora(module: nn.Module, *, seed: int) -> int:
    """Initialise the adapters ``module`` (whole, a stage or a shard; full FQNs) holds: ``A`` drawn, ``B`` zero.
    Returns how many tensors were set."""
    from torch.distributed.tensor import DTensor

    count = 0
    for fqn, p in module.named_parameters():
        if not is_adapter(fqn):
            continue
        local = p.to_local() if isinstance(p, DTensor) else p
        if ".lora_B." in f".{fqn}":
            local.zero_()
        else:
            full = _draw(fqn, tuple(p.shape), seed)
            if isinstance(p, DTensor):
                from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

                shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
                full = full[tuple(slice(o, o + n) for o, n in zip(offset, shape))]
            local.copy_(full.to(local.dtype))
        count += 1
    return count


def merged_state(state: Mapping[str, torch.Tensor], lora: LoRA) -> dict[str, torch.Tensor]:
    """A full state dict with every adapter folded into its base weight (``W + (alpha / rank) B A``) and dropped."""
    out = {k: v for k, v in state.items() if not is_adapter(k)}
    for key, a in state.items():
        if key.endswith(".lora_A.weight"):
            module = key[: -len(".lora_A.weight")]
            b = state[f"{module}.lora_B.weight"]
            base = out[f"{module}.weight"]
            out[f"{module}.weight"] = (base.float() + lora.scaling * (b.float() @ a.float())).to(base.dtype)
    return out


def detach_adapters(model: nn.Module) -> dict[str, tuple[nn.Module, ...]]:
    """Take every ``LoRALinear``'s ``lora_A``, ``lora_B`` and ``lora_dropout`` out of ``model`` (FQN of the adapted
    layer -> the three), so a tensor-parallel plan, which splits every submodule of the layer it is given, shards
    the base weights alone; ``attach_adapters`` puts them back, sharded."""
    out = {}
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear) and "lora_A" in module._modules:
            out[name] = tuple(module._modules.pop(k) for k in ("lora_A", "lora_B", "lora_dropout"))
    return out


def attach_adapters(
    model: nn.Module, adapters: dict[str, tuple[nn.Module, ...]], *, tp_mesh: Any, colwise: Iterable[str]
) -> None:
    """Put the adapters back as DTensors matching their base layer's split over ``tp_mesh``: a column-wise layer
    (its output rows sharded) keeps ``A`` whole and shards ``B``'s rows; a row-wise one (its input columns
    sharded) shards ``A``'s columns and keeps ``B`` whole, so ``B A x`` has the base output's placement (sharded,
    or a pending sum)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    colwise = set(colwise)
    for name, (a, b, dropout) in adapters.items():
        module = model.get_submodule(name)
        placements = ([Replicate()], [Shard(0)]) if name in colwise else ([Shard(1)], [Replicate()])
        for part, placement in zip((a, b), placements):
            weight = part.weight
            part.weight = nn.Parameter(distribute_tensor(weight.data, tp_mesh, placement), requires_grad=True)
        module.lora_A, module.lora_B, module.lora_dropout = a, b, dropout
