"""Qwen3's tensor-parallel plan: Llama's (``models/llama/parallelize.py``) plus its per-head q/k norms, as its
spec declares them (``SPEC.tp_plan``, ``models/qwen3/spec.py``).

A tp rank holds whole query and key heads, so each head's norm runs locally; the norm weights are replicated,
and each rank's gradient for them covers only its own heads. The plan therefore treats the norms' input as
sharded over the heads dimension (``SequenceParallel(sequence_dim=2)``, local output, on ``(batch, seq, heads, head_dim)``):
the weights become replicated DTensors whose gradients are summed over the tp group, as torchtitan does.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from models.qwen3.spec import SPEC
from models.tensor_parallel import parallelize_decoder


def parallelize_qwen3(model: nn.Module, *, tp_mesh: DeviceMesh, **options: Any) -> nn.Module:
    """Apply the tensor-parallel plan in place; returns ``model``. ``options``: ``parallelize_decoder``'s
    (sequence_parallel, loss_parallel, styles)."""
    return parallelize_decoder(model, tp_mesh=tp_mesh, plan=SPEC.tp_plan, **options)
