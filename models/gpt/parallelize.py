"""How the GPT in ``models/gpt/model.py`` is split inside each layer: its tensor-parallel (DTensor) plan.

Megatron's pattern, as torchtitan applies it: in attention, ``wq``/``wk``/``wv`` are column-wise
(each tp rank owns a slice of the heads) and ``wo`` is row-wise (partial sums all-reduced); in the
feed-forward, ``w1`` is column-wise and ``w2`` row-wise. One all-reduce per sub-block forward, one in
backward. Embeddings stay replicated (the byte vocabulary is tiny).

Options:
- ``sequence_parallel``: the residual stream between sub-blocks is sharded along the sequence;
  LayerNorms run on the shard (``SequenceParallel``), the all-reduce becomes all-gather +
  reduce-scatter. The first block of the module shards the incoming activation and, when the module
  is a pipeline stage that ends before the final norm, its last block gathers it back, so stage
  boundaries always carry full activations.
- ``loss_parallel``: the output projection stays sharded over the vocabulary and the loss is
  computed on the shards (``torch.distributed.tensor.parallel.loss_parallel``): the logits are never
  gathered. The engine must run forward *and* backward inside ``loss_parallel()``.

What the plan needs from the model's sizes (heads, widths, vocabulary divisible by tp) is checked
before any process starts, in ``trainer/validate.py`` (``check_tensor_parallel``).
Works on the full model and on a pipeline stage (parts set to ``None`` are skipped); plan keys are
the model's own FQNs.
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
    """Plan of one ``Block``: attention and feed-forward, optionally with sequence-parallel norms."""
    if not sequence_parallel:
        return {
            f"{prefix}.attention.wq": ColwiseParallel(),
            f"{prefix}.attention.wk": ColwiseParallel(),
            f"{prefix}.attention.wv": ColwiseParallel(),
            f"{prefix}.attention.wo": RowwiseParallel(),
            f"{prefix}.feed_forward.w1": ColwiseParallel(),
            f"{prefix}.feed_forward.w2": RowwiseParallel(),
        }
    return {
        f"{prefix}.attention_norm": SequenceParallel(),
        f"{prefix}.attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        f"{prefix}.attention.wq": ColwiseParallel(),
        f"{prefix}.attention.wk": ColwiseParallel(),
        f"{prefix}.attention.wv": ColwiseParallel(),
        f"{prefix}.attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        f"{prefix}.ffn_norm": SequenceParallel(),
        f"{prefix}.feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        f"{prefix}.feed_forward.w1": ColwiseParallel(),
        f"{prefix}.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


def parallelize_gpt(
    model: nn.Module,
    *,
    tp_mesh: DeviceMesh,
    sequence_parallel: bool = False,
    loss_parallel: bool = False,
) -> nn.Module:
    """Apply the tensor-parallel plan in place (blocks, then stage edges, then the head); returns ``model``."""
    if tp_mesh.size() == 1:
        return model
    blocks = list(model.layers.keys())
    plan: dict = {}
    # 1. every block: column-wise in, row-wise out
    for name in blocks:
        plan.update(_block_plan(f"layers.{name}", sequence_parallel=sequence_parallel))
    # 2. the head: final norm on the sequence shard, output projection sharded or gathered
    if model.norm is not None and sequence_parallel:
        plan["norm"] = SequenceParallel()
    if model.output is not None:
        plan["output"] = ColwiseParallel(
            input_layouts=Shard(1) if sequence_parallel else Replicate(),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    parallelize_module(model, tp_mesh, plan)
    # 3. sequence parallel: shard the residual stream where it enters, gather it where a stage leaves
    #    (separate calls, so one block can be both entry and exit of a stage)
    if sequence_parallel and blocks:
        parallelize_module(
            model.layers[blocks[0]],
            tp_mesh,
            PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True),
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
