"""The measured schedule of one step as pictures: a Chrome/Perfetto trace and a Gantt PNG.

Input is what every rank recorded (``parallel/pipeline/timing.py``), gathered on rank 0: per rank a dict
with ``rank``, ``pp_rank``, ``start``, ``end`` and ``actions`` as (kind, stage, micro-batch, start, end)
in seconds on a common origin. One track per rank, one slice per action labelled F3 / B3 / W3. Open the
JSON in https://ui.perfetto.dev or chrome://tracing; matplotlib is imported only here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: colours by action kind (forward, backward / input-backward, weight-gradient)
COLOURS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}


def write_chrome_trace(path: Path, *, ranks: Sequence[dict[str, Any]], title: str) -> Path:
    """Trace Event Format: pid 0 is the job, tid is the global rank; times in microseconds."""
    t0 = min(r["start"] for r in ranks)
    events: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": title}}]
    for r in sorted(ranks, key=lambda r: r["rank"]):
        stages = sorted({a[1] for a in r["actions"]})
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": 0,
                "tid": r["rank"],
                "args": {"name": f"rank {r['rank']} (pp {r['pp_rank']}, stages {stages})"},
            }
        )
        events.append(
            {"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": r["rank"], "args": {"sort_index": r["rank"]}}
        )
        for kind, stage, mb, start, end in r["actions"]:
            events.append(
                {
                    "name": f"{kind}{mb}",
                    "cat": kind,
                    "ph": "X",
                    "pid": 0,
                    "tid": r["rank"],
                    "ts": (start - t0) * 1e6,
                    "dur": max(end - start, 0.0) * 1e6,
                    "args": {"stage": stage, "micro_batch": mb, "kind": kind},
                }
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return path


def write_gantt_png(path: Path, *, ranks: Sequence[dict[str, Any]], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ordered = sorted(ranks, key=lambda r: r["rank"])
    t0 = min(r["start"] for r in ordered)
    t1 = max(r["end"] for r in ordered)
    n_actions = max(len(r["actions"]) for r in ordered)
    pp = max(r["pp_rank"] for r in ordered) + 1
    fig, ax = plt.subplots(figsize=(min(24, 6 + 0.25 * n_actions), 1.0 + 0.6 * len(ordered)))
    for row, r in enumerate(ordered):
        for kind, stage, mb, start, end in r["actions"]:
            left, width = (start - t0) * 1e3, (end - start) * 1e3
            # a second stage on the same rank is drawn hatched
            hatch = "//" if stage >= pp else None
            ax.barh(
                row,
                width,
                left=left,
                height=0.8,
                color=COLOURS.get(kind, "grey"),
                edgecolor="black",
                linewidth=0.4,
                hatch=hatch,
            )
            if width > 0.04 * (t1 - t0) * 1e3 / max(1, n_actions / 4):
                ax.text(left + width / 2, row, f"{kind}{mb}", ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(ordered)), [f"rank {r['rank']}" for r in ordered])
    ax.invert_yaxis()
    ax.set_xlabel("time in step (ms)")
    ax.set_xlim(0, (t1 - t0) * 1e3)
    ax.set_title(title, fontsize=9)
    ax.legend(
        handles=[Patch(color=c, label=k) for k, c in COLOURS.items()],
        loc="lower right",
        fontsize=7,
        bbox_to_anchor=(1.0, 1.0),
        frameon=False,
        ncol=3,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
