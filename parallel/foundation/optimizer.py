"""How a torch optimizer is built over an engine's parameters, for the trainer and the calibration alike.

Two choices a hand-written loop leaves to torch's defaults, made here once:

- **Groups by kind.** One foreach or fused kernel takes tensors of one kind: all plain, or all DTensors of one
  mesh. TP leaves norms and embeddings plain beside its shards, and FSDP2 over TP puts parameters on two
  meshes, so one list of them would force the per-parameter loop. torch runs each param group apart, so the
  parameters go in one group per kind (plain tensors, then DTensors by mesh) and every group gets the fast
  path. The groups share every setting; checkpoints key optimizer state by parameter name, so the grouping
  never reaches a checkpoint.
- **The implementation** (``optim.implementation``): ``auto`` picks torch's fused kernel where the optimizer
  has one (AdamW, Adam, SGD, Adagrad; over DTensors only those in ``FUSED_OVER_DTENSORS``) and every parameter
  is on a device torch fuses on (``FUSED_DEVICES``), as torchtitan does; otherwise torch's own default (foreach
  on CUDA, the loop on CPU). On this machine a fused AdamW step over gpt_small took 0.6 ms against 2.3 ms for
  the loop, and over TP's DTensors 0.8 against 4.6 ms (docs/performance.md, "The optimizer"). ``fused``,
  ``foreach`` and ``for-loop`` ask for one.

No torch import at module level: the config schema reads ``IMPLEMENTATIONS``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: ``optim.implementation``'s values (conf/schema.py types the key with them)
IMPLEMENTATIONS = ("auto", "fused", "foreach", "for-loop")

#: the implementations that are an optimizer constructor's argument (``fused=True``, ``foreach=True``); the user's own
#: ``+optim.fused`` / ``+optim.foreach`` wins over ``optim.implementation``
KERNEL_ARGUMENTS = ("fused", "foreach")

#: devices whose parameters ``auto`` updates with torch's fused kernels (torch 2.6+ has them on both)
FUSED_DEVICES = ("cpu", "cuda")

#: optimizers whose fused kernel DTensor can shard: torch 2.13 registers ``_fused_adam_`` and ``_fused_adamw_``
#: only (torch/distributed/tensor/_ops/_pointwise_ops.py); SGD's or Adagrad's fused kernel over FSDP2's or TP's
#: parameters fails at the first step
FUSED_OVER_DTENSORS = ("Adam", "AdamW")


def param_groups_by_kind(params: Iterable[torch.Tensor]) -> list[dict[str, Any]]:
    """``[{"params": [...]}, ...]``: plain tensors first, then DTensors mesh by mesh, in first-seen order. By
    type name: a run without DTensors need not import torch.distributed.tensor."""
    groups: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        groups.setdefault(p.device_mesh if type(p).__name__ == "DTensor" else None, []).append(p)
    plain = groups.pop(None, [])
    return [{"params": g} for g in ([plain] if plain else []) + list(groups.values())]


def implementation_kwargs(
    optimizer_cls: Callable[..., Any], params: list[torch.Tensor], *, implementation: str, given: Iterable[str] = ()
) -> dict[str, bool]:
    """The ``fused`` / ``foreach`` arguments for ``implementation``; none where the optimizer's own arguments
    (``given``, e.g. ``optim.foreach=true``) already choose. Raises ValueError for an implementation the class
    lacks (``implementation_problem``)."""
    if set(KERNEL_ARGUMENTS) & set(given):
        return {}
    accepts = inspect.signature(optimizer_cls).parameters
    distributed = any(type(p).__name__ == "DTensor" for p in params)
    if implementation == "auto":
        fusable = all(p.device.type in FUSED_DEVICES and p.is_floating_point() for p in params)
        sharded_fused = not distributed or _fused_over_dtensors(optimizer_cls)
        return {"fused": True} if "fused" in accepts and fusable and sharded_fused else {}
    if implementation == "for-loop":
        return {"foreach": False} if "foreach" in accepts else {}
    problem = implementation_problem(optimizer_cls, implementation=implementation, over_dtensors=distributed)
    if problem:
        raise ValueError(problem)
    return {implementation: True}


def implementation_problem(optimizer_cls: Callable[..., Any], *, implementation: str, over_dtensors: bool) -> str:
    """Why ``optim.implementation=<implementation>`` cannot build ``optimizer_cls`` (over DTensor parameters when
    ``over_dtensors``), as the error says it; "" when it can. Validation asks it before any worker starts, the
    build again over the real parameters."""
    if implementation not in KERNEL_ARGUMENTS:
        return ""
    name = getattr(optimizer_cls, "__name__", str(optimizer_cls))
    if implementation not in inspect.signature(optimizer_cls).parameters:
        return (
            f"optim.implementation={implementation}: {name} takes no `{implementation}` argument; "
            f"use optim.implementation=auto or for-loop"
        )
    if implementation == "fused" and over_dtensors and not _fused_over_dtensors(optimizer_cls):
        return (
            f"optim.implementation=fused: torch shards the fused kernel of {', '.join(FUSED_OVER_DTENSORS)} "
            f"only, and this run's {name} updates DTensor parameters (FSDP2 or TP); use optim.implementation=auto "
            f"or foreach"
        )
    return ""


def _fused_over_dtensors(optimizer_cls: Callable[..., Any]) -> bool:
    """Whether the class is (or derives from) one whose fused kernel DTensor shards."""
    return any(getattr(c, "__name__", "") in FUSED_OVER_DTENSORS for c in getattr(optimizer_cls, "__mro__", ()))


def build_optimizer_over(
    factory: Callable[..., torch.optim.Optimizer], params: Iterable[torch.Tensor], *, implementation: str = "auto"
) -> torch.optim.Optimizer:
    """``factory`` (an optimizer class, or a partial of one with its settings) over ``params`` grouped by kind,
    with ``implementation``'s kernels."""
    params = list(params)
    cls, given = (factory.func, factory.keywords) if isinstance(factory, functools.partial) else (factory, {})
    return factory(
        param_groups_by_kind(params), **implementation_kwargs(cls, params, implementation=implementation, given=given)
    )
