"""The tensor-parallel (DTensor) plan shared by the decoder families (GPT, Llama, Qwen3): Megatron's pattern as
torchtitan applies it, over the module names each family declares in its ``ModelSpec.tp_plan`` (``TPPlan``,
``models/spec.py``): no name is assumed here.

In each sub-block, the projections that fan out (``colwise``: attention's q/k/v, the feed-forward's input
projections) are column-wise, the one that fans back in (``rowwise``) row-wise: one all-reduce per sub-block forward,
one in backward. Options:
- ``sequence_parallel``: the residual stream between sub-blocks is sharded along the sequence; norms run on
  the shard (``SequenceParallel``), the all-reduce becomes all-gather + reduce-scatter. The first block of
  the module shards the incoming activation and, when the module is a pipeline stage that ends before the
  final norm, its last block gathers it back, so stage boundaries always carry full activations.
- ``loss_parallel``: the output projection stays sharded over the vocabulary and the loss is computed on the
  shards (``torch.distributed.tensor.parallel.loss_parallel``): the logits are never gathered. The engine
  must run forward *and* backward inside ``loss_parallel()``.

Tied embeddings (a model whose ``tie_embeddings`` is true, such as Llama 3.2 1B, Qwen3 0.6B, GPT-2): the token
embedding is split over the vocabulary too (``RowwiseParallel`` of an ``nn.Embedding``: each rank looks up the
rows it holds, the partial embeddings are summed), so it has the head's placement, ``Shard(0)`` of the same
(vocab, d_model) matrix; after ``parallelize_module`` (which makes a separate DTensor of each module's weight)
the head takes the embedding's Parameter again: one weight, one placement, one gradient, as torchtitan and Megatron
tie them. A pipeline stage holding only one of the two shards it the same way, so the copies on the first and last
stage have equal shards (``parallel/pipeline/tied.py`` keeps them equal).

Works on the full model and on a pipeline stage (parts set to ``None`` are skipped). ``styles`` swaps the
block's parallel styles for others of the same shape (torchao's float8 styles, ``parallel/techniques/fp8.py``)
on the sub-blocks they apply to; the head keeps torch's.

``parallelize_decoder`` is the one tensor-parallel function of the decoder families (``ModelSpec.decoder``'s
``parallelize``, bound to the family's plan by ``ModelSpec.parallelize_fn``); the plans differ only in names:
- GPT: ``wq``/``wk``/``wv`` column-wise (each tp rank owns a slice of the heads), ``wo`` row-wise; ``w1``
  column-wise, ``w2`` row-wise. Embeddings stay replicated (the byte vocabulary is tiny), except a token embedding
  tied to the head (GPT-2), vocabulary-sharded as the head and kept one Parameter with it.
- Llama: ``wk``/``wv`` column-wise too, each rank owning ``n_kv_heads / tp`` key/value heads, so the query heads of
  one group and their shared key/value head sit on the same rank; SwiGLU's ``w1`` and ``w3`` column-wise, ``w2``
  row-wise; the rotary table is passed to every block as a plain (replicated) tensor (``extra_inputs``).
- Qwen3: Llama's plus the per-head q/k norms (``head_norms``). A tp rank holds whole query and key heads, so each
  head's norm runs locally; the norms' input is treated as sharded over the heads dimension
  (``SequenceParallel(sequence_dim=2)``, local output), so their replicated weights' gradients are summed over the
  tp group, as torchtitan does.
- Qwen3-MoE: Qwen3's plan in every block; a sparse block's feed-forward (``models/moe.py``, marked by its
  ``router``: ``SubBlockTP.whole_if``) is not split. Each tp rank runs the whole block on the same tokens:
  the router, the dispatch and (under expert parallel, ``parallel/techniques/ep.py``) the all-to-all over its own
  ep group, which lies inside one tp coordinate since ep borrows dp x cp. Why whole and not each rank routing its
  slice of the sequence (torchtitan's choice when ep also borrows tp): the load-balancing loss is a product of
  two means over one forward's tokens, so per-slice losses would not add up to it; and the router's and experts'
  gradients are then full and equal on every tp rank, so they stay plain tensors with no tp reduction to get
  right, and the balance counts are each rank's, summed over dp x cp only, counted once. The cost: the block's
  compute and its all-to-all volume repeat tp times. With sequence parallel its input is gathered and its output
  sliced back to the rank's shard (``whole_sub_block``). Dense layers (``mlp_only_layers``) are split as Qwen3's.

What a plan needs from the model's sizes (heads, widths, vocabulary divisible by tp) is
checked before any process starts, by the family's ``ModelSpec.tp_check`` (asked by ``trainer/validate.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from models.lora import attach_adapters, detach_adapters
from models.spec import SubBlockTP, TPPlan


@dataclass(frozen=True)
class TPStyles:
    """The style classes of a sub-block's column-wise and row-wise projections and of its input under sequence
    parallel; ``applies(sub_block)`` says whether they fit that sub-block (torch's styles fit every one)."""

    colwise: type = ColwiseParallel
    rowwise: type = RowwiseParallel
    prepare_input: type = PrepareModuleInput
    applies: Callable[[nn.Module], bool] = lambda sub_block: True


def block_plan(
    plan: TPPlan,
    prefix: str,
    *,
    sequence_parallel: bool,
    model: nn.Module | None = None,
    styles: TPStyles | None = None,
) -> dict:
    """The parallel styles of one block (``prefix``: ``layers.N``), from the names the family declares;
    ``styles`` (asked about each sub-block of ``model``) instead of torch's where they apply."""
    out = Shard(1) if sequence_parallel else Replicate()
    present = module_names(model) if model is not None else set()
    result: dict = {}
    for sub in plan.sub_blocks:
        base = f"{prefix}.{sub.module}"
        if sub.is_whole(prefix, present):
            result.update(whole_sub_block(prefix, sub, sequence_parallel=sequence_parallel))
            continue
        fits = styles is not None and model is not None and styles.applies(model.get_submodule(base))
        s = styles if fits else TPStyles()
        result.update({f"{base}.{w}": s.colwise() for w in sub.colwise})
        result.update({f"{base}.{n}": SequenceParallel(sequence_dim=2, use_local_output=True) for n in sub.head_norms})
        result[f"{base}.{sub.rowwise}"] = s.rowwise(output_layouts=out)
        if sequence_parallel:
            local = PrepareModuleInput(
                input_layouts=Replicate(), desired_input_layouts=Replicate(), use_local_output=True
            )
            result.update({f"{base}.{n}": local for n in sub.replicated})
            extra = (None,) * sub.extra_inputs
            result[f"{prefix}.{sub.norm}"] = SequenceParallel()
            result[base] = s.prepare_input(
                input_layouts=(Shard(1), *extra), desired_input_layouts=(Replicate(), *extra)
            )
    return result


class _SumGradOverTP(torch.autograd.Function):
    """Identity forward; backward all-reduces the gradient over the tp group (each rank's heads' share)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def sum_grad_over_tp(x: torch.Tensor, group) -> torch.Tensor:
    """``x`` unchanged; its gradient summed over the tp ``group`` in backward (a tensor every rank's heads read)."""
    return _SumGradOverTP.apply(x, group)


def share_over_tp(model: nn.Module, plan: TPPlan, tp_mesh: DeviceMesh) -> int:
    """Every ``SubBlockTP.shared`` module of ``model``'s blocks gets a forward hook passing its output through
    ``_SumGradOverTP``; returns how many."""
    group, hooked = tp_mesh.get_group(), 0
    for key in model.layers.keys():
        for sub in plan.sub_blocks:
            for name in sub.shared:
                module = model.get_submodule(f"layers.{key}.{sub.module}.{name}")
                module.register_forward_hook(lambda mod, args, out: sum_grad_over_tp(out, group))
                hooked += 1
    return hooked


def whole_sub_block(prefix: str, sub: SubBlockTP, *, sequence_parallel: bool) -> dict:
    """The styles of a sub-block that runs whole on every tp rank (a mixture of experts): none without sequence
    parallel (its input is the replicated residual stream already); with it, its norm runs on the sequence shard,
    the shards are gathered into its input and its output is cut back to this rank's shard (no communication:
    every rank computed the same output, so the gradient of the gathered input is also the same on every rank
    and backward keeps its slice)."""
    if not sequence_parallel:
        return {}
    return {
        f"{prefix}.{sub.norm}": SequenceParallel(),
        f"{prefix}.{sub.module}": PrepareModuleInputOutput(
            input_layouts=(Shard(1),),
            desired_input_layouts=(Replicate(),),
            use_local_input=True,
            output_layouts=(Replicate(),),
            desired_output_layouts=(Shard(1),),
            use_local_output=True,
        ),
    }


def module_names(model: nn.Module) -> set[str]:
    """The FQNs of ``model``'s submodules (a pipeline stage's parts set to None left out)."""
    return {name for name, module in model.named_modules() if module is not None}


def missing_modules(model: nn.Module, plan: TPPlan) -> list[str]:
    """The names ``plan`` reads that ``model`` (a whole model or a stage) does not have."""
    present = module_names(model)
    wanted = [n for key in model.layers.keys() for n in plan.block_modules(f"layers.{key}", present=present)]
    wanted += [n for n in (plan.final_norm, plan.head) if getattr(model, n, None) is not None]
    missing = [n for n in wanted if n not in present]
    if getattr(model, "tie_embeddings", False) and not hasattr(model, plan.embedding):  # a stage keeps it as None
        missing.append(plan.embedding)
    return missing


def parallelize_decoder(
    model: nn.Module,
    *,
    tp_mesh: DeviceMesh,
    plan: TPPlan,
    sequence_parallel: bool = False,
    loss_parallel: bool = False,
    styles: TPStyles | None = None,
) -> nn.Module:
    """Apply the family's ``plan`` in place (blocks, then the head, then stage edges); returns ``model``.
    ``styles``: the blocks' projection styles where they apply (torch's by default)."""
    if tp_mesh.size() == 1:
        return model
    missing = missing_modules(model, plan)
    if missing:
        raise ValueError(
            f"{type(model).__name__} has no submodule(s) {missing[:6]} that its ModelSpec.tp_plan names; make the "
            "family's tp_plan (its spec.py) name the model's modules"
        )
    blocks = list(model.layers.keys())
    by_name: dict = {}
    for name in blocks:
        by_name.update(
            block_plan(plan, f"layers.{name}", sequence_parallel=sequence_parallel, model=model, styles=styles)
        )
    has_final_norm = getattr(model, plan.final_norm, None) is not None
    if has_final_norm and sequence_parallel:
        by_name[plan.final_norm] = SequenceParallel()
    tied = bool(getattr(model, "tie_embeddings", False))
    embedding = getattr(model, plan.embedding, None)
    if tied and embedding is not None:  # the head's split: Shard(0) of the same matrix; full embeddings out
        by_name[plan.embedding] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if getattr(model, plan.head, None) is not None:
        by_name[plan.head] = ColwiseParallel(
            input_layouts=Shard(1) if sequence_parallel else Replicate(),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    adapters = detach_adapters(model)  # LoRA: the base weights split first, then their adapters to match
    parallelize_module(model, tp_mesh, by_name)
    for name, p in model.named_parameters():  # torch's SequenceParallel makes every weight it replicates trainable
        if name in frozen:
            p.requires_grad_(False)
    if adapters:
        colwise = [n for n, style in by_name.items() if isinstance(style, ColwiseParallel)]
        attach_adapters(model, adapters, tp_mesh=tp_mesh, colwise=colwise)
    share_over_tp(model, plan, tp_mesh)
    head = getattr(model, plan.head, None)
    if tied and embedding is not None and head is not None:
        head.weight = embedding.weight  # one Parameter again (each module's weight was distributed on its own)
    # sequence parallel: shard the residual stream where it enters, gather it where a stage leaves
    # (separate calls, so one block can be both entry and exit of a stage)
    if sequence_parallel and blocks:
        extra = (None,) * plan.block_extra_inputs
        parallelize_module(
            model.layers[blocks[0]],
            tp_mesh,
            PrepareModuleInput(
                input_layouts=(Replicate(), *extra), desired_input_layouts=(Shard(1), *extra), use_local_output=True
            ),
        )
        if not has_final_norm:
            parallelize_module(
                model.layers[blocks[-1]],
                tp_mesh,
                PrepareModuleOutput(
                    output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True
                ),
            )
    return model
