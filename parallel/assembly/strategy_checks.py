"""What a tensor-parallel run (parallel=tp, hybrid with tp.size > 1) and the further dimensions in use need of their
config, checked before any worker starts: the model's own rules for a tp degree (its ``ModelSpec.tp_check``), those
of loss and sequence parallelism, and each further dimension's own (``dimension_problems``: its technique module's). Each check takes ``(run, strategy)`` (the typed run, ``parallel/foundation/run.py``, and the strategy's
``StrategySpec``) and returns the problems as "key=value: what is wrong; the fix";
the strategies list them in ``StrategySpec.checks`` (``parallel/assembly/registry.py``). No torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from models.registry import spec_or_none
from parallel.foundation import dims
from parallel.foundation.dims import nearest_multiples

if TYPE_CHECKING:
    from parallel.foundation.run import RunSpec


def tensor_parallel_problems(run: RunSpec, strategy: Any = None) -> list[str]:
    """The model's plan splits heads and widths by tp; loss and sequence parallelism split the vocabulary and
    the sequence (nothing when tp.size is 1)."""
    layout, model, settings = run.layout, run.model, run.compose
    tp = layout.tp
    if tp == 1:
        return []
    spec = spec_or_none(model)
    if spec is None:
        return []  # validation's model check says so
    out = spec.tp_problems(model, tp)
    if spec.parallelize is None:
        return out
    if settings.loss_parallel and int(model.vocab_size) % tp:
        out.append(
            f"model.vocab_size={model.vocab_size} is not divisible by tp.size={tp} with tp.loss_parallel=true; "
            "set tp.loss_parallel=false"
        )
    if settings.loss_parallel and layout.pp > 1:
        out.append(
            f"tp.loss_parallel=true with pp.size={layout.pp}: the pipeline schedule computes the loss outside "
            "loss_parallel() on plain tensors; set tp.loss_parallel=false (the head then gathers the logits)"
        )
    if settings.sequence_parallel and not spec.sequence_parallel:
        out.append(
            f"tp.sequence_parallel=true with the model family '{spec.family}': its tensor-parallel plan keeps the "
            "residual stream replicated (ModelSpec.sequence_parallel); set tp.sequence_parallel=false"
        )
    seq = run.batch.seq_len
    if settings.sequence_parallel and seq % tp:
        out.append(
            f"data.seq_len={seq} is not divisible by tp.size={tp} with tp.sequence_parallel=true: "
            f"the sequence is split over tp ranks; use data.seq_len={nearest_multiples(seq, tp)}"
        )
    return out


def dimension_problems(run: RunSpec, strategy: Any = None) -> list[str]:
    """What each further dimension in use needs of the run (cp: heads and sequence; ep: whole experts): the
    ``problems`` of its rules module (``MeshDim.rules``, torch-free), imported only where its size is > 1."""
    out: list[str] = []
    for d in dims.DIMENSIONS:
        if d.rules and run.layout.size(d.name) > 1:
            out += importlib.import_module(d.rules).problems(run, strategy)
    return out
