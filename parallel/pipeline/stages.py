"""How a pipeline stage is built: a copy of the full model with the parts other stages own removed.

A model is pipeline-ready when its blocks live in ``layers`` (a ModuleDict keyed "0".."n-1") and its
``forward`` skips top-level parts set to None. The top-level children before ``layers`` (embeddings)
belong to the first stage, those after it (final norm, head) to the last. Pruning a deep copy keeps
every parameter's name (``layers.3.feed_forward.w1.weight``), so a stage's state dict is a slice of the
full model's, and split points, checkpoints and TP plans speak the same names (torchtitan's pattern).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from models.spec import PipelineUnits
from parallel.pipeline.schedules import stage_ranks
from parallel.pipeline.split import uniform_split


def pipeline_parts(model: nn.Module, units: PipelineUnits | None = None) -> tuple[list[str], list[str], list[str]]:
    """(parts before the blocks, block keys, parts after the blocks) of a pipeline-ready model.

    ``units`` is the model's ``ModelSpec.pipeline``: it names the parts before and after ``layers``; where
    it leaves them ``None`` they are the model's top-level children before / after ``layers``.
    """
    names = [name for name, _ in model.named_children()]
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleDict):
        raise TypeError(
            f"{type(model).__name__} cannot be split into pipeline stages: it needs its blocks in "
            "`self.layers = nn.ModuleDict({'0': ..., '1': ...})` and a forward that skips parts set to None"
        )
    i = names.index("layers")
    pre = list(units.pre) if units is not None and units.pre is not None else names[:i]
    post = list(units.post) if units is not None and units.post is not None else names[i + 1 :]
    missing = [n for n in (*pre, *post) if n not in names]
    if missing:
        raise TypeError(f"{type(model).__name__} has no top-level part(s) {missing} named by its ModelSpec.pipeline")
    return pre, list(layers.keys()), post


@dataclass(frozen=True)
class StageSpec:
    """One stage: its index, the pp rank that runs it, and the blocks [start, stop) it owns."""

    index: int
    pp_rank: int
    start: int
    stop: int
    first: bool
    last: bool

    def describe(self, pre: Sequence[str], post: Sequence[str]) -> str:
        parts = list(pre) if self.first else []
        blocks = f"layers.{self.start}" if self.stop - self.start == 1 else f"layers.{self.start}-{self.stop - 1}"
        parts.append(blocks)
        parts += list(post) if self.last else []
        return " + ".join(parts)


def stage_specs(*, n_blocks: int, split_points: Sequence[int], stage_ranks: Sequence[int]) -> list[StageSpec]:
    bounds = [0, *split_points, n_blocks]
    num = len(bounds) - 1
    if len(stage_ranks) != num:
        raise ValueError(f"{num} stages from split points {list(split_points)} but {len(stage_ranks)} stage ranks")
    return [
        StageSpec(index=s, pp_rank=stage_ranks[s], start=bounds[s], stop=bounds[s + 1], first=s == 0, last=s == num - 1)
        for s in range(num)
    ]


def placed_stages(
    *, n_blocks: int, split_points: Sequence[int], schedule: str, pp: int, num_stages: int
) -> list[StageSpec]:
    """The ``num_stages`` stages ``split_points`` cut, each on the pp rank ``schedule`` places it (``stage_ranks``):
    what the trainer's pipeline engine builds and the dry run measures."""
    ranks = stage_ranks(schedule=schedule, pp=pp, num_stages=num_stages)
    return stage_specs(n_blocks=n_blocks, split_points=split_points, stage_ranks=ranks)


def model_stages(
    model: nn.Module,
    units: PipelineUnits | None,
    *,
    split_points: Sequence[int] | None,
    schedule: str,
    pp: int,
    num_stages: int,
) -> tuple[tuple[int, ...], list[StageSpec]]:
    """``model``'s blocks cut into ``num_stages`` stages at ``split_points`` (None: the trainer's uniform policy,
    ``split.uniform_split``), each on the pp rank ``schedule`` places it (``placed_stages``): the split points and
    the stages, as the dry run measures them."""
    pre, blocks, post = pipeline_parts(model, units)
    if split_points is None:
        split_points = uniform_split(len(blocks), num_stages, pre=bool(pre), post=bool(post))
    points = tuple(split_points)
    stages = placed_stages(n_blocks=len(blocks), split_points=points, schedule=schedule, pp=pp, num_stages=num_stages)
    return points, stages


def build_stage_module(model: nn.Module, *, spec: StageSpec, units: PipelineUnits | None = None) -> nn.Module:
    """A deep copy of ``model`` keeping only what ``spec`` owns; parameter names unchanged. The blocks other stages
    own are not copied (deepcopy's memo stands None in for each, then its key is removed): a deep model's copy is
    mostly its blocks, and the dry run cuts two stages per sampled rank."""
    pre, blocks, post = pipeline_parts(model, units)
    dropped = [key for key in blocks if not spec.start <= int(key) < spec.stop]
    stage = copy.deepcopy(model, memo={id(model.layers[key]): None for key in dropped})
    for key in dropped:
        del stage.layers[key]
    for name in pre if not spec.first else ():
        setattr(stage, name, None)
    for name in post if not spec.last else ():
        setattr(stage, name, None)
    return stage
