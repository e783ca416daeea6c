"""Tokens per expert per MoE layer: each step's (a metrics.jsonl field, drawn as the run's expert-load heatmap) and
the run's (summary.json), the same for every engine (one module, a pipeline's stages gathered over pp)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from models.moe import balance_metrics, imbalance, moe_step_table

#: the per-layer lists of tokens per expert: one step's in a metrics.jsonl record, the run's in summary.json
KEY = "moe_tokens_per_expert"


class ExpertLoad:
    """The run's tokens per expert per layer, added up step by step (every data-parallel rank's, as the step's
    table is summed over them before it gets here)."""

    def __init__(self) -> None:
        self.totals: dict[str, torch.Tensor] = {}

    def add(self, layers: list[str], table: torch.Tensor) -> dict[str, Any]:
        """One step's table (``models.moe.moe_step_table``: per layer aux loss sum, forwards, dropped, tokens per
        expert...): its balance metrics and its tokens per expert per layer (``KEY``), added to the run's."""
        counts = table[:, 3:]
        for layer, row in zip(layers, counts, strict=True):
            self.totals[layer] = row + self.totals[layer] if layer in self.totals else row.clone()
        return {**balance_metrics(layers, table), KEY: as_lists(layers, counts)}

    def take(self, module: nn.Module, *, reduce: Callable[[torch.Tensor], None] | None) -> dict[str, Any]:
        """The step's table of ``module``'s MoE blocks, summed over the data-parallel ranks by ``reduce``, as
        ``add``'s metrics; empty when no block ran."""
        taken = moe_step_table(module, reduce=reduce)
        return {} if taken is None else self.add(*taken)

    def take_stages(
        self,
        parts: list[nn.Module],
        *,
        reduce: Callable[[torch.Tensor], None] | None,
        gather: Callable[[list], list[list]] | None,
    ) -> dict[str, Any]:
        """``take`` over a pipeline rank's stages: each stage's table summed over dp by ``reduce``, the stages'
        rows gathered over pp by ``gather`` (a collective every pp rank calls), a layer once (tp and dp copies
        hold the same numbers), in layer order."""
        mine = []
        for part in parts:
            taken = moe_step_table(part, reduce=reduce)
            if taken is not None:
                mine += [(layer, row.tolist()) for layer, row in zip(*taken, strict=True)]
        gathered = gather(mine) if gather is not None else [mine]
        rows = dict(r for g in gathered for r in g)
        if not rows:
            return {}
        layers = sorted(rows, key=lambda k: int(k.removeprefix("layer")) if k.startswith("layer") else 0)
        return self.add(layers, torch.tensor([rows[k] for k in layers], dtype=torch.float64))

    def summary(self) -> dict[str, Any]:
        """``moe_tokens_per_expert`` (the run's, per layer) and ``moe_imbalance`` (its max / mean, per layer); empty
        before any MoE step."""
        if not self.totals:
            return {}
        layers = list(self.totals)
        return {
            KEY: as_lists(layers, torch.stack([self.totals[k] for k in layers])),
            "moe_imbalance": {k: float(imbalance(v)) for k, v in self.totals.items()},
        }


def as_lists(layers: list[str], counts: torch.Tensor) -> dict[str, list[int]]:
    return {layer: [int(c) for c in row.tolist()] for layer, row in zip(layers, counts, strict=True)}
