"""The one place that owns the parallel degrees and the rank map.

A ``ParallelLayout`` is computed from the config before any process starts (no torch import here),
checked once, and then asked by everyone else: the launcher (how many workers), the worker (which
mesh), the data loader (which dp shard), the reports (the rank map). The degrees are one ``sizes``
entry per mesh dimension of ``parallel/foundation/dims.py`` (read as ``layout.dp``, ``layout.tp`` ...). Global
ranks are laid out row-major over the mesh dimensions in mesh order (``pp, dp, tp``): tp neighbours are
adjacent ranks, so they share a node first, where bandwidth is highest, as Megatron and torchtitan order
them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from parallel.foundation import dims
from parallel.foundation.dims import Sized, with_dim_kwargs

#: the mesh dimension names, outermost first, as the table stood at import (``dims.mesh_names()`` follows it)
MESH_DIMS = dims.mesh_names()


@with_dim_kwargs
@dataclass(frozen=True)
class ParallelLayout(Sized):
    strategy: str
    sizes: dict[str, int] = field(default_factory=dict)
    """Degree per mesh dimension, every dimension present (``ParallelLayout(..., dp=2)`` fills it)."""
    nnodes: int = 1
    nproc_per_node: int = 1
    micro_batches: int = 1
    schedule: str | None = None
    stages_per_rank: int = 1
    split_points: tuple[int, ...] | None = None
    dp_shard: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

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
        d = self.flat_dict()
        d["split_points"] = list(self.split_points) if self.split_points is not None else None
        d["world_size"] = self.world_size
        d["rank_map"] = self.rank_map()
        return d


def factorizations(world_size: int) -> list[tuple[int, ...]]:
    """All degree tuples (``dims.names()`` order: dp, tp, pp) whose product is world_size, data parallel first."""
    return dims.factorizations(world_size)


def dp_needs_fsdp(sizes: Mapping[str, int]) -> bool:
    """The one rule: data dimensions (``dims.data_names``: dp x cp) of more than one rank beside a dimension that
    ``needs_fsdp`` (tp, pp, ep) of size > 1 are FSDP2 (``fully_shard``), never DDP (``why_dp_needs_fsdp``)."""
    data = math.prod(int(sizes.get(n, 1)) for n in dims.data_names())
    return data > 1 and any(d.needs_fsdp and int(sizes.get(d.name, 1)) > 1 for d in dims.DIMENSIONS)


def why_dp_needs_fsdp(layout: ParallelLayout) -> str:
    """Why ``dp_needs_fsdp`` holds for this layout, one reason per dimension ("" when it does not)."""
    if not dp_needs_fsdp(layout.sizes):
        return ""
    used = [d for d in dims.DIMENSIONS if d.needs_fsdp and layout.size(d.name) > 1]
    return "; ".join(f"{d.key}={layout.size(d.name)}: {d.needs_fsdp}" for d in used)
