"""``trainer.precision``: how parameters are stored and in which dtype the model computes.

- ``fp32``: everything in float32 (the default; parity with ``parallel=single`` within 1e-4).
- ``bf16-mixed``: float32 parameters, gradients and optimizer state (the master copy); the forward and
  backward compute in bfloat16; gradients are reduced across replicas in float32. On fsdp/hybrid with a
  sharded dp dimension this is FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``
  (parameters all-gathered in bf16, gradients reduce-scattered in fp32); everywhere else (single, ddp,
  tp, pp, mp) ``torch.autocast(device_type, bfloat16)`` around the module's forward (for pipelines: each
  stage's forward), so DDP all-reduces the fp32 gradients of fp32 parameters.
- ``bf16``: parameters (and so gradients and optimizer state) stored in bfloat16; floating inputs are cast
  on the way in. Half the memory, no master copy: small updates round away.
- ``fp8``: ``bf16-mixed``, with the matmuls of the eligible Linears in float8 through torchao's ``Float8Linear``
  (``trainer.fp8.*``; ``parallel/techniques/fp8.py``); emulated where the device has no float8 matmul (CPU).

The loss is computed in float32 in every mode (``models.losses.token_cross_entropy`` upcasts the logits);
softmax inside attention accumulates in float32 in torch's SDPA kernels (CPU and CUDA) whatever the input
dtype, and autocast runs softmax, norms and the loss in float32 by its own op lists.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a function runs: the schema and validation read PRECISIONS
    import torch
    from torch import nn

#: the ``trainer.precision`` values: the one list (conf/schema.py types the key with it, validation names it)
PRECISIONS = ("fp32", "bf16-mixed", "bf16", "fp8")

#: the precisions that compute in bf16 around fp32 master weights (autocast, or FSDP2's MixedPrecisionPolicy)
MIXED_PRECISIONS = ("bf16-mixed", "fp8")

#: ``trainer.fp8.recipe`` values: torchao's ``Float8LinearRecipeName`` members offered (parallel/techniques/fp8.py)
FP8_RECIPES = ("tensorwise", "rowwise")

#: the CUDA compute capability from which GPUs multiply in float8 (Ada 8.9, Hopper 9.0, Blackwell)
FP8_MIN_CAPABILITY = 8.9


@dataclass(frozen=True)
class PlannerPrecision:
    """A ``planner.precision`` class: the ``trainer.precision`` that trains it and the bytes the cost model counts."""

    trains_as: str
    state_bytes: tuple[int, int, int]
    """Bytes per parameter for (weights, gradients, optimizer states) with Adam, as in ZeRO (arXiv 1910.02054,
    section 3.1): mixed precision keeps 16-bit weights and grads plus an fp32 master copy, momentum and variance
    (K = 12); fp32 keeps weights, grads, momentum and variance (4 + 4 + 8)."""
    activation_bytes: int


#: ``planner.precision`` (besides ``auto``) -> what it means; parallel/plan/specs.py reads it
PLANNER_PRECISIONS = {
    "fp32": PlannerPrecision(trains_as="fp32", state_bytes=(4, 4, 8), activation_bytes=4),
    "mixed": PlannerPrecision(trains_as="bf16-mixed", state_bytes=(2, 2, 12), activation_bytes=2),
}


def planner_precision(trainer_precision: str, *, device: str | None = None) -> str:
    """The one mapping from ``trainer.precision`` to the planner's class (``PLANNER_PRECISIONS``): fp32 is ``fp32``,
    every 16-bit or narrower mode (bf16-mixed, bf16, fp8) is ``mixed``. With ``device`` (``planner.precision=auto``,
    planning a run rather than describing one), an fp32 run on cuda is planned as ``mixed``, the precision
    ``parallel=auto`` then trains it in (``PLANNER_PRECISIONS["mixed"].trains_as``)."""
    if str(trainer_precision) != "fp32" or device == "cuda":
        return "mixed"
    return "fp32"


def param_dtype(precision: str) -> torch.dtype:
    """The dtype parameters are stored in."""
    import torch

    return torch.bfloat16 if precision == "bf16" else torch.float32


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype matmuls run in (what the device's peak FLOP/s is measured for); fp8 counts against the bf16 peak,
    as torchtitan reports its float8 MFU (not every matmul is float8: attention, the head)."""
    import torch

    return torch.float32 if precision == "fp32" else torch.bfloat16


def fsdp_mp_policy(precision: str) -> Any:
    """FSDP2's mixed-precision policy for ``precision`` (None: FSDP2 keeps the parameters' dtype)."""
    if precision not in MIXED_PRECISIONS:
        return None
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def _cast_floating_inputs(module: nn.Module, args: tuple) -> tuple:
    import torch

    return tuple(a.to(torch.bfloat16) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def cast_parameters(model: nn.Module, precision: str) -> nn.Module:
    """``bf16``: parameters and buffers to bfloat16 and floating inputs cast on entry; others unchanged."""
    if precision == "bf16":
        import torch

        model.to(torch.bfloat16)
        model.register_forward_pre_hook(_cast_floating_inputs)
    return model


def enable_autocast(module: nn.Module, *, device_type: str) -> nn.Module:
    """Run ``module``'s forward under ``torch.autocast(device_type, bfloat16)``.

    The instance's ``forward`` is replaced (no wrapper module), so parameter names do not change and
    DDP, a ``PipelineStage`` or a checkpoint see the same module. Backward replays the dtypes autocast
    chose; activation checkpointing restores the autocast state when it recomputes.
    """
    import torch

    inner = module.forward

    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
            return inner(*args, **kwargs)

    module.forward = forward  # type: ignore[method-assign]
    return module
