"""Where stage boundaries go: explicit split points, or a policy (``uniform`` or ``balanced``).

Split points are block indices where a new stage starts (``[2]`` on a 4-block model: blocks 0-1 and
2-3). Both policies solve the same problem, contiguous blocks into S stages minimising the slowest
stage, and differ only in the cost of each block:

- ``uniform``: every block costs 1, the embedding and the head 1 each (torchtitan's
  ``input_weight``/``output_weight``), so the first and last stage hold one block fewer when that evens out.
- ``balanced``: each block's forward+backward time measured on the real model (``profile_blocks``),
  the embedding and the head measured the same way. The predicted stage times are kept and reported
  next to the measured ones.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

POLICIES = ("uniform", "balanced")


@dataclass(frozen=True)
class BlockCosts:
    """Cost of every block plus what the first stage (embedding) and the last (head, loss) add."""

    blocks: tuple[float, ...]
    pre: float = 0.0
    post: float = 0.0
    unit: str = "weight"
    """'weight' (uniform policy) or 's' (measured seconds per micro-batch, forward + backward)."""
    activation_bytes: tuple[int, ...] = ()
    """Bytes of each block's output per micro-batch (what crosses a boundary after that block)."""

    def stage_costs(self, split_points: Sequence[int]) -> list[float]:
        bounds = [0, *split_points, len(self.blocks)]
        out = [sum(self.blocks[a:b]) for a, b in zip(bounds, bounds[1:])]
        out[0] += self.pre
        out[-1] += self.post
        return out


@dataclass(frozen=True)
class SplitPlan:
    split_points: tuple[int, ...]
    policy: str
    """explicit, uniform, balanced or even (mp's default: blocks shared evenly)."""
    costs: BlockCosts | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def predicted(self) -> list[float] | None:
        return self.costs.stage_costs(self.split_points) if self.costs is not None else None


def min_max_partition(costs: BlockCosts, num_stages: int) -> tuple[int, ...]:
    """Split points minimising the most expensive stage (each stage keeps at least one block).

    Dynamic programme over (blocks used, stages used); ties go to the split with the earliest
    boundaries, so the result is deterministic on every rank.
    """
    n = len(costs.blocks)
    if not 1 <= num_stages <= n:
        raise ValueError(f"cannot split {n} blocks into {num_stages} non-empty stages")
    prefix = [0.0]
    for c in costs.blocks:
        prefix.append(prefix[-1] + c)

    def stage_cost(a: int, b: int, s: int) -> float:
        c = prefix[b] - prefix[a]
        if s == 0:
            c += costs.pre
        if s == num_stages - 1:
            c += costs.post
        return c

    inf = float("inf")
    # best[s][b]: minimal max cost putting blocks [0, b) into stages 0..s
    best = [[inf] * (n + 1) for _ in range(num_stages)]
    arg = [[0] * (n + 1) for _ in range(num_stages)]
    for b in range(1, n + 1):
        best[0][b] = stage_cost(0, b, 0)
    for s in range(1, num_stages):
        for b in range(s + 1, n + 1):
            for a in range(s, b):
                v = max(best[s - 1][a], stage_cost(a, b, s))
                if v < best[s][b] - 1e-12:
                    best[s][b], arg[s][b] = v, a
    points, b = [], n
    for s in range(num_stages - 1, 0, -1):
        b = arg[s][b]
        points.append(b)
    return tuple(reversed(points))


def uniform_costs(n_blocks: int, *, input_weight: float = 1.0, output_weight: float = 1.0) -> BlockCosts:
    return BlockCosts(blocks=(1.0,) * n_blocks, pre=input_weight, post=output_weight)


def uniform_split(n_blocks: int, num_stages: int, *, pre: bool, post: bool) -> tuple[int, ...]:
    """The trainer's uniform policy (``pp.split=uniform``): blocks of equal cost, the embeddings and the head (where
    the model has them) weighing one block each (torchtitan's weights), split by ``min_max_partition``."""
    costs = uniform_costs(n_blocks, input_weight=1.0 if pre else 0.0, output_weight=1.0 if post else 0.0)
    return min_max_partition(costs, num_stages)


def even_split(n_blocks: int, num_stages: int) -> tuple[int, ...]:
    """Blocks shared as evenly as possible, earlier stages taking the extra (mp's default)."""
    base, extra = divmod(n_blocks, num_stages)
    points, at = [], 0
    for s in range(num_stages - 1):
        at += base + (1 if s < extra else 0)
        points.append(at)
    return tuple(points)


def profile_blocks(
    model: Any,
    inputs: Any,
    targets: Any,
    *,
    loss_fn: Any,
    parts: tuple[Sequence[str], Sequence[str], Sequence[str]],
    warmup: int = 2,
    iters: int = 5,
) -> BlockCosts:
    """Forward+backward seconds of the embedding, each block and the head, on one micro-batch: the fastest of
    ``iters`` rounds, each round timing every part once (after ``warmup`` rounds). Interference only adds time; a
    burst of it (another process taking the core) falls in one round for all parts alike, where timing each part's
    samples back to back let it inflate one part's median and move the split (seen: a 2-wide, 2-narrow model split
    [2] beside a multi-process job, [1] alone).

    Each part runs on a detached copy of its input so its backward stops at its own boundary; the
    model must expose ``layers`` (a ModuleDict) and skip parts set to None, as ``models.gpt.model.GPT`` does.
    ``parts``: the names of the parts before the blocks, the blocks' keys and the parts after them
    (``parallel/pipeline/stages.py`` ``pipeline_parts``).
    """
    import torch

    pre_names, block_names, post_names = parts

    def run_pre():
        out = _run_only(model, inputs, keep=set(pre_names))
        if out.is_floating_point() and out.requires_grad:
            out.float().sum().backward()
        return out

    h = run_pre().detach()
    blocks, act_bytes = [], []
    for name in block_names:
        block = model.layers[name]
        x = h.detach().requires_grad_(h.is_floating_point())

        def fwd_bwd(block=block, x=x):
            out = block(x)
            out.backward(torch.ones_like(out))

        blocks.append(fwd_bwd)
        with torch.no_grad():
            h = block(x)
        act_bytes.append(h.numel() * h.element_size())
    x = h.detach().requires_grad_(h.is_floating_point())

    def run_post():
        out = _run_only(model, x, keep=set(post_names))
        loss_fn(out, targets).backward()

    parts = [*([run_pre] if pre_names else []), *blocks, run_post]
    fastest = [float("inf")] * len(parts)
    for k in range(warmup + iters):
        for i, part in enumerate(parts):
            t0 = time.perf_counter()
            part()
            if k >= warmup:
                fastest[i] = min(fastest[i], time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    pre_s = fastest.pop(0) if pre_names else 0.0
    return BlockCosts(
        blocks=tuple(fastest[:-1]), pre=pre_s, post=fastest[-1], unit="s", activation_bytes=tuple(act_bytes)
    )


def _run_only(model: Any, x: Any, *, keep: set[str]) -> Any:
    """Run the model with only the top-level parts in ``keep`` (others temporarily None, layers empty)."""
    from torch import nn

    saved = {}
    for name, child in list(model.named_children()):
        if name not in keep:
            saved[name] = child
            setattr(model, name, nn.ModuleDict() if name == "layers" else None)
    try:
        return model(x)
    finally:
        for name, child in saved.items():
            setattr(model, name, child)
