"""How the GPT in ``models/gpt/model.py`` is split inside each layer: its tensor-parallel (DTensor) plan.

Megatron's pattern (``models/tensor_parallel.py``) over the module names its spec declares (``SPEC.tp_plan``,
``models/gpt/spec.py``): in attention, ``wq``/``wk``/``wv`` are column-wise
(each tp rank owns a slice of the heads) and ``wo`` is row-wise (partial sums all-reduced); in the
feed-forward, ``w1`` is column-wise and ``w2`` row-wise. Embeddings stay replicated (the byte vocabulary
is tiny), except a token embedding tied to the head (GPT-2), which is vocabulary-sharded as the head and stays one
Parameter with it. ``sequence_parallel`` puts the LayerNorms on the sequence shard; ``loss_parallel`` keeps the
logits vocabulary-sharded.

What the plan needs from the model's sizes (heads, widths, vocabulary divisible by tp) is checked
before any process starts, in ``trainer/validate.py`` (``check_tensor_parallel``).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from models.gpt.spec import SPEC
from models.tensor_parallel import parallelize_decoder


def parallelize_gpt(model: nn.Module, *, tp_mesh: DeviceMesh, **options: Any) -> nn.Module:
    """Apply the tensor-parallel plan in place; returns ``model``. ``options``: ``parallelize_decoder``'s
    (sequence_parallel, loss_parallel, styles)."""
    return parallelize_decoder(model, tp_mesh=tp_mesh, plan=SPEC.tp_plan, **options)
