"""float8 training (``trainer.precision=fp8``) through torchao's ``Float8Linear``: the first step of
``parallel/assembly/compose.py``'s order, before tensor parallel and FSDP2 (torchtitan's converters run at model build).

``fp8`` is ``bf16-mixed`` (fp32 master weights, bf16 compute elsewhere) with the matmuls of the eligible
``nn.Linear`` layers in float8: inputs and weights cast to e4m3, gradients to e5m2 (tensorwise) or e4m3
(rowwise), with dynamic scales. Recipes (``trainer.fp8.recipe``):
- ``tensorwise``: one scale per tensor (cuBLAS's fp8 kernel); the fastest. Under FSDP2 the weights can be
  all-gathered in float8 (``enable_fsdp_float8_all_gather``): half the bytes of bf16; their scales are then
  computed for every weight in one all-reduce after the optimizer step (``precompute_float8_dynamic_scale_for_fsdp``),
  which this module hands the engine as its ``after_update``. Under tensor parallel torchao's float8 styles
  (``Float8ColwiseParallel``, ``Float8RowwiseParallel``, ``PrepareFloat8ModuleInput``) cast before the collective.
- ``rowwise``: one scale per row (CUTLASS's kernel), power-of-two scales; more accurate, communication stays
  in high precision (torchao has no rowwise float8 all-gather).

Which Linears convert (``fp8_eligible``): not the output head nor a MoE router (the family's spec names them;
``trainer.fp8.skip`` adds patterns), and only those whose dimensions, after tensor-parallel sharding, are
multiples of 16 (the fp8 kernels' requirement). On a device without float8 matmuls (CPU) torchao's
emulation runs the same casts and scales and multiplies the dequantised values in high precision: the numbers
of float8, not its speed. Validation (``trainer/checks/compute.py``) refuses what cannot run before any process
starts. torchao is imported where a function runs (it is slow to import and prints on import).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from fnmatch import fnmatch
from typing import Any

from torch import nn

from parallel.foundation.run import Float8Settings

log = logging.getLogger("meshtrain")

#: the fp8 matmul (``torch._scaled_mm``) needs both dimensions of the weight to be multiples of this
FP8_DIM_MULTIPLE = 16


@functools.cache
def _import_torchao() -> None:
    """Import torchao once, without its import-time warnings: on a CPU build its CUDA kernels' libraries fail to
    load ("Failed to load ..._C_cutlass_90a.abi3.so") and it has no triton; float8 training needs neither here."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]  # the latter: an enum registration
    levels = [g.level for g in loggers]
    for g in loggers:
        g.setLevel(logging.ERROR)
    try:
        import torchao.float8  # noqa: F401
    finally:
        for g, level in zip(loggers, levels):
            g.setLevel(level)


def float8_config(settings: Float8Settings, *, emulate: bool, fsdp_float8_all_gather: bool) -> Any:
    """torchao's ``Float8LinearConfig`` for the recipe; ``emulate``: no fp8 matmul on this device (CPU)."""
    _import_torchao()
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(settings.recipe)
    return dataclasses.replace(config, emulate=emulate, enable_fsdp_float8_all_gather=fsdp_float8_all_gather)


def fp8_eligible(module: nn.Module, fqn: str, *, skip: Sequence[str], tp: int = 1) -> bool:
    """A plain ``nn.Linear`` not named in ``skip`` whose weight dimensions, divided over ``tp`` ranks, are multiples of
    16 (the dimension tensor parallel shards is divided; both are checked divided, which is what either style
    leaves on a rank)."""
    if type(module) is not nn.Linear:  # a subclass (LoRA's LoRALinear) has a forward Float8Linear would drop
        return False
    if any(fnmatch(fqn, p) or fnmatch(fqn, f"*.{p}") for p in skip):
        return False
    return all(d % (FP8_DIM_MULTIPLE * tp) == 0 for d in (module.in_features, module.out_features))


def convert_to_fp8(
    module: nn.Module, *, settings: Float8Settings, emulate: bool, fsdp_float8_all_gather: bool, tp: int = 1
) -> list[str]:
    """Swap the eligible Linears of ``module`` (a whole model or a stage, possibly on the meta device) for
    ``Float8Linear`` in place; returns their FQNs. Parameter names do not change: checkpoints and TP plans
    read the same keys."""
    _import_torchao()
    from torchao.float8 import convert_to_float8_training

    converted: list[str] = []

    def keep(mod: nn.Module, fqn: str) -> bool:
        ok = fp8_eligible(mod, fqn, skip=settings.skip, tp=tp)
        if ok:
            converted.append(fqn)
        return ok

    config = float8_config(settings, emulate=emulate, fsdp_float8_all_gather=fsdp_float8_all_gather)
    if (
        settings.recipe == "rowwise"
    ):  # compiled rowwise casts round as eager's only with this (pytorch#150859), as torchtitan
        import torch._inductor.config

        torch._inductor.config.emulate_precision_casts = True
    convert_to_float8_training(module, config=config, module_filter_fn=keep)
    linears = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
    log.info(
        "fp8 (%s%s%s): %d of %d Linears converted to Float8Linear; kept in high precision: %s",
        settings.recipe,
        ", emulated" if emulate else "",
        ", float8 all-gather" if fsdp_float8_all_gather else "",
        len(converted),
        len(linears),
        [n for n in linears if n not in converted] or "none",
    )
    if not converted:
        log.warning(
            "fp8: no Linear of this model is eligible (dims multiples of 16, not skipped): it trains as bf16-mixed"
        )
    return converted


def float8_linears(module: nn.Module) -> list[str]:
    """FQNs of the ``Float8Linear`` layers in ``module``."""
    _import_torchao()
    from torchao.float8.float8_linear import Float8Linear

    return [n for n, m in module.named_modules() if isinstance(m, Float8Linear)]


def precompute_scales(module: nn.Module) -> Callable[[], None]:
    """What runs after each optimizer step when FSDP2 all-gathers float8 weights: every weight's scale from one
    all-reduce of their amaxes, instead of one per weight inside the next forward (torchao's
    ``precompute_float8_dynamic_scale_for_fsdp``, as torchtitan calls it)."""
    _import_torchao()
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    return lambda: precompute_float8_dynamic_scale_for_fsdp(module)


def float8_tp_styles(*, sequence_parallel: bool, device_type: str) -> Any:
    """torchao's float8 tensor-parallel styles (inputs cast to float8 before the all-gather), as a
    ``models.tensor_parallel.TPStyles`` that applies to sub-blocks whose Linears are all ``Float8Linear``;
    None where the torch styles stay: with sequence parallel on a backend without float8 collectives
    (gloo: the sequence all-gather would carry float8 tensors; these styles then run in high precision)."""
    if sequence_parallel and device_type != "cuda":
        log.info("fp8 with sequence parallel on %s: tensor-parallel collectives stay in high precision", device_type)
        return None
    _import_torchao()
    from torchao.float8.float8_linear import Float8Linear
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    from models.tensor_parallel import TPStyles

    def all_float8(sub_block: nn.Module) -> bool:
        linears = [m for m in sub_block.modules() if isinstance(m, nn.Linear)]
        return bool(linears) and all(isinstance(m, Float8Linear) for m in linears)

    log.info("fp8 with tensor parallel: torchao's float8 styles on the sub-blocks whose projections are all float8")
    return TPStyles(
        colwise=Float8ColwiseParallel,
        rowwise=Float8RowwiseParallel,
        prepare_input=PrepareFloat8ModuleInput,
        applies=all_float8,
    )
