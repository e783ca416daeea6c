"""Who holds what: every global rank's node, local rank, mesh coordinates and the layers it holds.

The layout knows the coordinates before any process starts (``ParallelLayout.rank_map``); which
layers a rank holds is only known once its strategy has built its stage, so each rank reports its own
(one ``all_gather_object`` after build) and rank 0 prints the table, draws the grid (nodes × local
ranks, coloured by pipeline stage, labelled with dp/tp coordinates) and stores both in the run.

The grid is drawn when the run ends (``parallel/foundation/figures.py``): drawn at build, matplotlib's import and
the drawing held rank 0 for 0.9-1.4 s before the first step, and every other rank with it.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from parallel.foundation import dims
from parallel.foundation.figures import draw_later


def held_layers(modules: Sequence[nn.Module]) -> list[str]:
    """Top-level parts present in ``modules`` by FQN (``layers.3``, ``output`` ...), in model order."""
    names: list[str] = []
    for module in modules:
        module = getattr(module, "module", module)  # DDP wraps the stage
        for name, child in module.named_children():
            if child is None:
                continue
            if isinstance(child, nn.ModuleDict) and name == "layers":
                names += [f"layers.{k}" for k in child.keys()]
            else:
                names.append(name)
    return names


def short_label(layers: Sequence[str]) -> str:
    """``['tok_embeddings', 'pos_embeddings', 'layers.0', 'layers.1']`` → ``emb L0-1``."""
    blocks = [int(n.split(".")[1]) for n in layers if n.startswith("layers.")]
    parts = []
    if any("embed" in n for n in layers):
        parts.append("emb")
    if blocks:
        runs, start, prev = [], blocks[0], blocks[0]
        for b in blocks[1:] + [None]:
            if b is not None and b == prev + 1:
                prev = b
                continue
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
            if b is not None:
                start = prev = b
        parts.append("L" + ",".join(runs))
    if "output" in layers:
        parts.append("head")
    others = [n for n in layers if not n.startswith("layers.") and "embed" not in n and n not in ("output", "norm")]
    parts += others
    return " ".join(parts)


def gather_rank_map(
    *, layout, rank: int, stages: Sequence[int], modules: Sequence[nn.Module], mesh=None
) -> list[dict[str, Any]]:
    """Every rank's row (collective: call on all ranks).

    Coordinates come from the layout; each rank also reports where the DeviceMesh actually put it
    (``mesh_coordinate``, in the mesh's order: ``parallel.foundation.dims.mesh_names()``), so a disagreement is visible in summary.json.
    """
    coordinate = mesh.get_coordinate() if mesh is not None else None
    mine = {
        "rank": rank,
        "stages": list(stages),
        "layers": held_layers(modules),
        "mesh_coordinate": list(coordinate) if coordinate is not None else None,
    }
    reports = [mine]
    if dist.is_initialized() and dist.get_world_size() > 1:
        reports = [None] * dist.get_world_size()
        dist.all_gather_object(reports, mine)
    held = {r["rank"]: r for r in reports}
    rows = []
    for row in layout.rank_map():
        report = held[row["rank"]]
        rows.append(
            {
                **row,
                "stages": report["stages"],
                "layers": report["layers"],
                "holds": short_label(report["layers"]),
                "mesh_coordinate": report["mesh_coordinate"],
            }
        )
    return rows


def rank_map_table(rows: Sequence[dict[str, Any]]):
    from rich.table import Table

    table = Table(title="rank map", title_justify="left")
    mesh = dims.coord_names()
    for col in ("rank", "node", "local", *mesh, "stages", "holds"):
        table.add_column(col, justify="right" if col not in ("holds", "stages") else "left")
    for r in rows:
        table.add_row(
            str(r["rank"]),
            str(r["node"]),
            str(r["local_rank"]),
            *(str(r[name]) for name in mesh),
            ",".join(map(str, r["stages"])),
            r["holds"],
        )
    return table


def print_rank_map(rows: Sequence[dict[str, Any]], *, log: logging.Logger) -> None:
    """The table, rendered by rich, through rank 0's log: on the console and in logs/rank0.log."""
    from rich.console import Console

    console = Console(record=True, width=120, file=io.StringIO())
    console.print(rank_map_table(rows))
    log.info("\n%s", console.export_text().rstrip())


def draw_rank_map(rows: Sequence[dict[str, Any]], *, nnodes: int, nproc_per_node: int, path: Path) -> Path:
    """PNG grid: one row per node, one cell per local rank, coloured by pipeline stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(max(4.0, 1.7 * nproc_per_node), max(1.6, 1.3 * nnodes + 0.6)))
    for r in rows:
        x, y = r["local_rank"], nnodes - 1 - r["node"]
        stage = r["stages"][0] if r["stages"] else r["pp"]
        ax.add_patch(plt.Rectangle((x + 0.04, y + 0.06), 0.92, 0.88, color=cmap(stage % 10), alpha=0.55))
        ax.text(
            x + 0.5,
            y + 0.5,
            f"rank {r['rank']}\ndp{r['dp']} tp{r['tp']}\n{r['holds']}",
            ha="center",
            va="center",
            fontsize=8,
        )
    stages = sorted({s for r in rows for s in (r["stages"] or [r["pp"]])})
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(s % 10), alpha=0.55) for s in stages]
    ax.legend(
        handles,
        [f"stage {s}" for s in stages],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18 / max(1, nnodes)),
        ncol=min(len(stages), 6),
        fontsize=8,
        frameon=False,
    )
    ax.set_xlim(0, nproc_per_node)
    ax.set_ylim(0, nnodes)
    ax.set_xticks([i + 0.5 for i in range(nproc_per_node)], [f"local {i}" for i in range(nproc_per_node)])
    ax.set_yticks([nnodes - 1 - n + 0.5 for n in range(nnodes)], [f"node {n}" for n in range(nnodes)])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title("rank map (colour: pipeline stage)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def announce_rank_map(ctx, *, stage_modules: Sequence[nn.Module], stages: Sequence[int] | None = None) -> dict:
    """Gather the rank map (all ranks), then on rank 0 print it and announce its grid (``rank_map.png``, drawn
    at the end of the run); returns summary extras."""
    stages = list(stages) if stages is not None else [ctx.coords["pp"]]
    rows = gather_rank_map(layout=ctx.layout, rank=ctx.rank, stages=stages, modules=stage_modules, mesh=ctx.mesh)
    extras: dict[str, Any] = {"rank_map": rows}
    if ctx.is_rank0:
        print_rank_map(rows, log=ctx.log)
        png = ctx.run_dir / "rank_map.png"
        nnodes, nproc = ctx.layout.nnodes, ctx.layout.nproc_per_node
        draw_later(png, lambda: draw_rank_map(rows, nnodes=nnodes, nproc_per_node=nproc, path=png))
        extras["artifacts"] = {"images": {"rank_map": str(png)}, "files": []}
    return extras
