"""How the Llama in ``models/llama/model.py`` is split inside each layer: its tensor-parallel (DTensor) plan.

The GPT's Megatron plan (``models/gpt/parallelize.py``) with Llama's extra pieces, as torchtitan applies it:
- attention: ``wq`` column-wise (each tp rank owns ``n_heads / tp`` query heads), ``wk``/``wv`` column-wise
  (each rank owns ``n_kv_heads / tp`` key/value heads, so the query heads of one group and their shared
  key/value head sit on the same rank), ``wo`` row-wise;
- SwiGLU: ``w1`` and ``w3`` column-wise, ``w2`` row-wise; one all-reduce per sub-block, as in the GPT;
- the rotary table is passed to every block as a plain (replicated) tensor: its input layout is ``None``.

``sequence_parallel`` and ``loss_parallel`` work as for the GPT (RMSNorm on the sequence shard; the head
vocabulary-sharded). What the plan needs from the sizes (``n_heads`` and ``n_kv_heads`` divisible by
tp, widths too, no tied embeddings) is checked before any process starts (``models/llama/spec.py``,
asked by ``trainer/validate.py``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def _block_plan(prefix: str, *, sequence_parallel: bool) -> dict:
    plan = {
        f"{prefix}.attention.wq": ColwiseParallel(),
        f"{prefix}.attention.wk": ColwiseParallel(),
        f"{prefix}.attention.wv": ColwiseParallel(),
        f"{prefix}.attention.wo": RowwiseParallel(output_layouts=Shard(1) if sequence_parallel else Replicate()),
        f"{prefix}.feed_forward.w1": ColwiseParallel(),
        f"{prefix}.feed_forward.w3": ColwiseParallel(),
        f"{prefix}.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1) if sequence_parallel else Replicate()),
    }
    if sequence_parallel:
        plan.update(
            {
                f"{prefix}.attention_norm": SequenceParallel(),
                f"{prefix}.attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
                ),
                f"{prefix}.ffn_norm": SequenceParallel(),
                f"{prefix}.feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
            }
        )
    return plan


def parallelize_llama(
    model: nn.Module,
    *,
    tp_mesh: DeviceMesh,
    sequence_parallel: bool = False,
    loss_parallel: bool = False,
) -> nn.Module:
    """Apply the tensor-parallel plan in place (blocks, then the head, then stage edges); returns ``model``."""
    if tp_mesh.size() == 1:
        return model
    blocks = list(model.layers.keys())
    plan: dict = {}
    for name in blocks:
        plan.update(_block_plan(f"layers.{name}", sequence_parallel=sequence_parallel))
    if model.norm is not None and sequence_parallel:
        plan["norm"] = SequenceParallel()
    if model.output is not None:
        plan["output"] = ColwiseParallel(
            input_layouts=Shard(1) if sequence_parallel else Replicate(),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    parallelize_module(model, tp_mesh, plan)
    if sequence_parallel and blocks:
        parallelize_module(
            model.layers[blocks[0]],
            tp_mesh,
            PrepareModuleInput(
                input_layouts=(Replicate(), None), desired_input_layouts=(Shard(1), None), use_local_output=True
            ),
        )
        if model.norm is None:
            parallelize_module(
                model.layers[blocks[-1]],
                tp_mesh,
                PrepareModuleOutput(
                    output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True
                ),
            )
    return model
