"""The one place that owns the parallel degrees and the rank map.

A ``ParallelLayout`` is computed from the config before any process starts (no torch import here),
checked once, and then asked by everyone else: the launcher (how many workers), the worker (which
mesh), the data loader (which dp shard), the reports (the rank map). Global ranks are laid out
row-major over the mesh dimensions ``(pp, dp, tp)``: tp neighbours are adjacent ranks, so they share
a node first, where bandwidth is highest, as Megatron and torchtitan order them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from parallel.core.registry import DIMS, strategy_for

MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class ParallelLayout:
    strategy: str
    dp: int = 1
    tp: int = 1
    pp: int = 1
    nnodes: int = 1
    nproc_per_node: int = 1
    micro_batches: int = 1
    schedule: str | None = None
    stages_per_rank: int = 1
    split_points: tuple[int, ...] | None = None
    dp_shard: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        return (self.pp, self.dp, self.tp)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of size {self.world_size}")
        tp_i = rank % self.tp
        dp_i = (rank // self.tp) % self.dp
        pp_i = rank // (self.tp * self.dp)
        return {"pp": pp_i, "dp": dp_i, "tp": tp_i}

    def rank_of(self, *, pp: int, dp: int, tp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def rank_map(self) -> list[dict[str, int]]:
        """Every global rank once: its node, local rank and mesh coordinates."""
        rows = []
        for rank in range(self.world_size):
            rows.append(
                {
                    "rank": rank,
                    "node": rank // self.nproc_per_node,
                    "local_rank": rank % self.nproc_per_node,
                    **self.coords(rank),
                }
            )
        return rows

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["split_points"] = list(self.split_points) if self.split_points is not None else None
        d["world_size"] = self.world_size
        d["rank_map"] = self.rank_map()
        return d


def factorizations(world_size: int) -> list[tuple[int, int, int]]:
    """All (dp, tp, pp) with dp * tp * pp == world_size, data parallel first."""
    out = []
    for pp in range(1, world_size + 1):
        if world_size % pp:
            continue
        for tp in range(1, world_size // pp + 1):
            if (world_size // pp) % tp:
                continue
            out.append((world_size // (pp * tp), tp, pp))
    return sorted(out, key=lambda t: (-t[0], -t[1]))


def describe_factorization(dp: int, tp: int, pp: int) -> str:
    """The command-line words for a layout: ``parallel=ddp dp.size=4`` (the registry names the strategy)."""
    dims = [f"{k}.size={v}" for k, v in zip(DIMS, (dp, tp, pp)) if v > 1]
    strategy = strategy_for(dp=dp, tp=tp, pp=pp)
    return " ".join([f"parallel={strategy}", *dims])


#: why the dp dimension cannot be DDP when tp > 1 or pp > 1 (seen with torch 2.13 on gloo)
DDP_OVER_DTENSOR = (
    "DDP over tensor-parallel (DTensor) modules fails on torch 2.13 "
    "(aten.cat.default got mixed torch.Tensor and DTensor)"
)
DDP_IN_PIPELINE = (
    "DDP inside a PipelineStage with several micro-batches fails on torch 2.13 (reducer.cpp: rebuilt "
    "parameter indices size is not same as original model parameters size; with static_graph it runs "
    "but the gradients are 2% off)"
)


def dp_needs_fsdp(*, dp: int, tp: int, pp: int) -> bool:
    """The one rule: a dp dimension beside tp or pp is FSDP2 (``fully_shard``), never DDP (``why_dp_needs_fsdp``)."""
    return dp > 1 and (tp > 1 or pp > 1)


def why_dp_needs_fsdp(layout: ParallelLayout) -> str:
    """Why ``dp_needs_fsdp`` holds for this layout, one reason per dimension ("" when it does not)."""
    if not dp_needs_fsdp(dp=layout.dp, tp=layout.tp, pp=layout.pp):
        return ""
    reasons = []
    if layout.tp > 1:
        reasons.append(f"tp.size={layout.tp}: {DDP_OVER_DTENSOR}")
    if layout.pp > 1:
        reasons.append(f"pp.size={layout.pp}: {DDP_IN_PIPELINE}")
    return "; ".join(reasons)
