"""The expert-load heatmap of a MoE run: every MoE layer's tokens per expert over the logged steps (metrics.jsonl's
``moe_tokens_per_expert``, the global batch's), one panel per layer, stacked. Each cell is an expert's load that
step as a multiple of the layer's mean, on one diverging colour scale for all panels: white at 1 (balanced), red
above (an expert the router crowds), blue below (a starved one, darkest at 0); each panel's title gives its worst
step's max / mean.

Drawn by rank 0 when the run ends (``parallel/foundation/figures.py``: matplotlib stays out of the first step), from the
whole metrics.jsonl (a resumed run's earlier steps too), and listed among the summary's images, which the W&B sink
logs (``moe/moe_expert_load``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from parallel.foundation.expert_load import KEY
from parallel.foundation.figures import draw_later
from trainer.observe.metrics import read_metrics

FILE = "moe_expert_load.png"
IMAGE = "moe_expert_load"
"""Its key among the summary's images (and so W&B's)."""
DPI = 100
WIDTH_IN, PANEL_IN, MARGIN_IN = 8.0, 1.6, 1.0


def figure_size_px(layers: int) -> tuple[int, int]:
    """(width, height) of the PNG for ``layers`` panels: the size is fixed (no tight bounding box)."""
    return round(WIDTH_IN * DPI), round((MARGIN_IN + PANEL_IN * layers) * DPI)


def load_grid(records: Sequence[dict[str, Any]]) -> tuple[list[int], dict[str, list[list[float]]]]:
    """(the logged steps that carry tokens per expert, per layer in layer order the (experts x steps) grid of each
    expert's tokens over the layer's mean that step)."""
    rows = [r for r in records if isinstance(r.get(KEY), dict)]
    layers = sorted({layer for r in rows for layer in r[KEY]}, key=_layer_order)
    grid: dict[str, list[list[float]]] = {}
    for layer in layers:
        columns = []
        for r in rows:
            counts = r[KEY].get(layer) or []
            mean = sum(counts) / len(counts) if counts else 0.0
            columns.append([c / mean if mean else 0.0 for c in counts])
        experts = max(len(c) for c in columns)
        grid[layer] = [[c[e] if e < len(c) else float("nan") for c in columns] for e in range(experts)]
    return [int(r["step"]) for r in rows], grid


def _layer_order(layer: str) -> tuple[int, str]:
    digits = layer.removeprefix("layer")
    return (int(digits), "") if digits.isdigit() else (1 << 30, layer)


def draw_expert_load(records: Sequence[dict[str, Any]], path: Path) -> Path:
    """The heatmap of ``records`` (metrics.jsonl's) to ``path``; a ValueError when none carries tokens per
    expert."""
    steps, grid = load_grid(records)
    if not grid:
        raise ValueError(f"no logged step carries {KEY}: no expert-load heatmap")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    width, height = figure_size_px(len(grid))
    w_in, h_in = width / DPI, height / DPI
    fig, axes = plt.subplots(len(grid), 1, figsize=(w_in, h_in), sharex=True, squeeze=False)
    # margins fixed in inches (the size is): matplotlib's constrained layout measured every label first, half the
    # drawing's CPU
    fig.subplots_adjust(left=0.6 / w_in, right=1 - 0.1 / w_in, bottom=0.5 / h_in, top=1 - 0.6 / h_in, hspace=0.3)
    top = max(max(v for row in g for v in row if v == v) for g in grid.values())
    norm = TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=max(top, 2.0))
    image = None
    for ax, (layer, g) in zip(axes[:, 0], grid.items(), strict=True):
        image = ax.imshow(g, aspect="auto", origin="lower", cmap="RdBu_r", norm=norm, interpolation="nearest")
        worst = max(range(len(steps)), key=lambda i: max(row[i] for row in g))
        ax.set_title(
            f"{layer}: max / mean {max(row[worst] for row in g):.2f} at step {steps[worst]}", fontsize=9, loc="left"
        )
        ax.set_ylabel("expert", fontsize=8)
        ax.tick_params(labelsize=7)
    every = max(1, len(steps) // 10)
    axes[-1, 0].set_xticks(range(0, len(steps), every), [str(s) for s in steps[::every]])
    axes[-1, 0].set_xlabel("logged step", fontsize=8)
    fig.colorbar(image, ax=axes[:, 0].tolist(), label="tokens / layer mean")
    fig.suptitle("expert load (tokens per expert, global batch)", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def announce_expert_load(*, run_dir: Path, summary: dict[str, Any]) -> None:
    """For a run whose engine reported tokens per expert (``summary`` holds the run's): draw the heatmap from
    ``run_dir``'s metrics.jsonl at the run's end and list it among ``summary``'s images. Rank 0 only."""
    if KEY not in summary:
        return
    path = run_dir / FILE
    draw_later(path, lambda: draw_expert_load(read_metrics(run_dir / "metrics.jsonl"), path))
    artifacts = dict(summary.get("artifacts") or {})
    summary["artifacts"] = {
        **artifacts,
        "images": {**artifacts.get("images", {}), IMAGE: str(path)},
        "files": list(artifacts.get("files", [])),
    }
