"""The tensor-parallel (DTensor) plan shared by the decoder families (GPT, Llama): Megatron's pattern as
torchtitan applies it, over the FQNs both families use (``layers.N.attention.wq`` ..., ``norm``, ``output``).

In each block, the projections that fan out (``wq``/``wk``/``wv``, the feed-forward's input projections)
are column-wise, the ones that fan back in (``wo``, ``w2``) row-wise: one all-reduce per sub-block forward,
one in backward. Options:
- ``sequence_parallel``: the residual stream between sub-blocks is sharded along the sequence; norms run on
  the shard (``SequenceParallel``), the all-reduce becomes all-gather + reduce-scatter. The first block of
  the module shards the incoming activation and, when the module is a pipeline stage that ends before the
  final norm, its last block gathers it back, so stage boundaries always carry full activations.
- ``loss_parallel``: the output projection stays sharded over the vocabulary and the loss is computed on the
  shards (``torch.distributed.tensor.parallel.loss_parallel``): the logits are never gathered. The engine
  must run forward *and* backward inside ``loss_parallel()``.

Works on the full model and on a pipeline stage (parts set to ``None`` are skipped).
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class DecoderBlockTP:
    """What differs between families: the feed-forward's column-wise inputs, how many inputs a block and its
    attention take after the residual stream (Llama passes the rotary table, a plain tensor), and norms that
    run on each attention head (Qwen3's q/k norms: their input is sharded over the heads dimension, 2)."""

    ffn_in: tuple[str, ...] = ("w1",)
    extra_inputs: int = 0
    head_norms: tuple[str, ...] = ()

    def plan(self, prefix: str, *, sequence_parallel: bool) -> dict:
        out = Shard(1) if sequence_parallel else Replicate()
        plan = {f"{prefix}.attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")}
        plan.update(
            {
                f"{prefix}.attention.{n}": SequenceParallel(sequence_dim=2, use_local_output=True)
                for n in self.head_norms
            }
        )
        plan[f"{prefix}.attention.wo"] = RowwiseParallel(output_layouts=out)
        plan.update({f"{prefix}.feed_forward.{w}": ColwiseParallel() for w in self.ffn_in})
        plan[f"{prefix}.feed_forward.w2"] = RowwiseParallel(output_layouts=out)
        if sequence_parallel:
            extra = (None,) * self.extra_inputs
            plan[f"{prefix}.attention_norm"] = SequenceParallel()
            plan[f"{prefix}.attention"] = PrepareModuleInput(
                input_layouts=(Shard(1), *extra), desired_input_layouts=(Replicate(), *extra)
            )
            plan[f"{prefix}.ffn_norm"] = SequenceParallel()
            plan[f"{prefix}.feed_forward"] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            )
        return plan


def parallelize_decoder(
    model: nn.Module,
    *,
    tp_mesh: DeviceMesh,
    block: DecoderBlockTP,
    sequence_parallel: bool = False,
    loss_parallel: bool = False,
) -> nn.Module:
    """Apply the plan in place (blocks, then the head, then stage edges); returns ``model``."""
    if tp_mesh.size() == 1:
        return model
    blocks = list(model.layers.keys())
    plan: dict = {}
    for name in blocks:
        plan.update(block.plan(f"layers.{name}", sequence_parallel=sequence_parallel))
    if model.norm is not None and sequence_parallel:
        plan["norm"] = SequenceParallel()
    if model.output is not None:
        plan["output"] = ColwiseParallel(
            input_layouts=Shard(1) if sequence_parallel else Replicate(),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    parallelize_module(model, tp_mesh, plan)
    # sequence parallel: shard the residual stream where it enters, gather it where a stage leaves
    # (separate calls, so one block can be both entry and exit of a stage)
    if sequence_parallel and blocks:
        extra = (None,) * block.extra_inputs
        parallelize_module(
            model.layers[blocks[0]],
            tp_mesh,
            PrepareModuleInput(
                input_layouts=(Replicate(), *extra), desired_input_layouts=(Shard(1), *extra), use_local_output=True
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
