"""How the Llama in ``models/llama/model.py`` is split inside each layer: its tensor-parallel (DTensor) plan.

The GPT's Megatron plan (``models/tensor_parallel.py``) with Llama's extra pieces, as torchtitan applies it, over
the module names its spec declares (``SPEC.tp_plan``, ``models/llama/spec.py``):
- attention: ``wq`` column-wise (each tp rank owns ``n_heads / tp`` query heads), ``wk``/``wv`` column-wise
  (each rank owns ``n_kv_heads / tp`` key/value heads, so the query heads of one group and their shared
  key/value head sit on the same rank), ``wo`` row-wise;
- SwiGLU: ``w1`` and ``w3`` column-wise, ``w2`` row-wise; one all-reduce per sub-block, as in the GPT;
- the rotary table is passed to every block as a plain (replicated) tensor: its input layout is ``None``.

``sequence_parallel`` and ``loss_parallel`` work as for the GPT (RMSNorm on the sequence shard; the head
vocabulary-sharded). A tied embedding (``tie_embeddings``: Llama 3.2 1B) is vocabulary-sharded as its head and
stays one Parameter with it. What the plan needs from the sizes (``n_heads`` and ``n_kv_heads`` divisible by
tp, widths too) is checked before any process starts (``models/llama/spec.py``, asked by ``trainer/validate.py``).
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from models.llama.spec import SPEC
from models.tensor_parallel import parallelize_decoder


def parallelize_llama(model: nn.Module, *, tp_mesh: DeviceMesh, **options: Any) -> nn.Module:
    """Apply the tensor-parallel plan in place; returns ``model``. ``options``: ``parallelize_decoder``'s
    (sequence_parallel, loss_parallel, styles)."""
    return parallelize_decoder(model, tp_mesh=tp_mesh, plan=SPEC.tp_plan, **options)
