"""The sweep report's pictures (PNG, matplotlib without a display).

- tokens/s vs micro-batches, one line per schedule (and split, when the sweep has several);
- measured vs theoretical bubble vs micro-batches, per schedule;
- peak memory per stage vs split point;
- throughput vs peak memory with the Pareto front and the best job.
Each plot is drawn only when the sweep has the data for it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from trainer.report.rows import MIB, ReportRow


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    # tight_layout leaves a placeholder layout engine, for which savefig draws the whole figure once more before
    # printing it (a layout pass that lays out nothing): without it the same pixels, a fifth less CPU per plot
    fig.set_layout_engine(None)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _series_label(row: ReportRow, *, several_splits: bool) -> str:
    return f"{row.schedule} split {row.split}" if several_splits else str(row.schedule)


def _m_axis(ax, rows: list[ReportRow]) -> None:
    """Micro-batches on a log-2 axis, labelled with the swept values themselves."""
    ms = sorted({r.micro_batches for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.minorticks_off()


def _pipeline_rows(rows: list[ReportRow]) -> list[ReportRow]:
    return [r for r in rows if r.status == "completed" and r.micro_batches is not None and r.schedule]


def tokens_vs_m(rows: list[ReportRow], path: Path) -> Path | None:
    piped = [r for r in _pipeline_rows(rows) if r.tokens_per_s is not None]
    if not piped:
        return None
    several = len({r.split for r in piped}) > 1
    series: dict[str, list[ReportRow]] = defaultdict(list)
    for r in piped:
        series[_series_label(r, several_splits=several)].append(r)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, members in sorted(series.items()):
        members.sort(key=lambda r: r.micro_batches)
        ax.plot([r.micro_batches for r in members], [r.tokens_per_s for r in members], marker="o", label=label)
    ax.set(xlabel="micro-batches (m)", ylabel="tokens/s", title="Throughput vs micro-batches")
    _m_axis(ax, piped)
    ax.legend(fontsize=8)
    return _save(fig, path)


def bubble_vs_m(rows: list[ReportRow], path: Path) -> Path | None:
    """Per schedule: the measured bubble's parts stacked against m (schedule, imbalance, overhead), the
    measured total on top; runs from before the parts existed show the measured total and the theory only."""
    piped = [r for r in _pipeline_rows(rows) if r.bubble_measured is not None]
    if not piped:
        return None
    by_schedule: dict[str, list[ReportRow]] = defaultdict(list)
    for r in piped:
        by_schedule[str(r.schedule)].append(r)
    plt = _pyplot()
    n = len(by_schedule)
    fig, axes = plt.subplots(1, n, figsize=(4.5 * n, 4), squeeze=False, sharey=True)
    for ax, (schedule, members) in zip(axes[0], sorted(by_schedule.items())):
        members.sort(key=lambda r: (r.micro_batches, r.split))
        xs = list(range(len(members)))
        split_labels = len({r.split for r in members}) > 1
        labels = [f"m={r.micro_batches}" + (f"\nsplit {r.split}" if split_labels else "") for r in members]
        bottom = [0.0] * len(members)
        for name, color in (("schedule", "C0"), ("imbalance", "C1"), ("overhead", "C3")):
            values = [getattr(r, f"bubble_{name}") for r in members]
            if any(v is None for v in values):
                continue
            # a negative imbalance (faster backward than B = 2F) is drawn below zero, not hidden
            ax.bar(xs, values, bottom=[b if v >= 0 else 0.0 for b, v in zip(bottom, values)], color=color, label=name)
            bottom = [b + max(v, 0.0) for b, v in zip(bottom, values)]
        ax.plot(xs, [r.bubble_measured for r in members], "k_", markersize=22, mew=2, label="measured")
        theory = [r.bubble_theoretical for r in members]
        if all(t is not None for t in theory):
            ax.plot(xs, theory, "k:", marker=".", label="theory (equal stages)")
        ax.set_xticks(xs, labels, fontsize=8)
        ax.set(xlabel="micro-batches", title=f"{schedule}")
        ax.axhline(0, color="grey", linewidth=0.5)
    axes[0][0].set_ylabel("bubble fraction")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("Pipeline bubble = schedule + imbalance + overhead")
    return _save(fig, path)


def memory_vs_split(rows: list[ReportRow], path: Path) -> Path | None:
    split_rows = [r for r in rows if r.status == "completed" and r.split_points and r.peak_memory_per_stage]
    if not split_rows:
        return None
    splits = sorted({r.split for r in split_rows}, key=lambda s: [int(x) for x in s.split(",")])
    stages = max(len(r.peak_memory_per_stage) for r in split_rows)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for stage in range(stages):
        points = [
            (splits.index(r.split), r.peak_memory_per_stage[stage] / MIB)
            for r in split_rows
            if stage < len(r.peak_memory_per_stage)
        ]
        ax.scatter([x for x, _ in points], [y for _, y in points], color=f"C{stage}", alpha=0.6)
        peak = {x: max(y for px, y in points if px == x) for x, _ in points}
        ax.plot(sorted(peak), [peak[x] for x in sorted(peak)], color=f"C{stage}", label=f"stage {stage} (max)")
    ax.set_xticks(range(len(splits)), [f"[{s}]" for s in splits])
    ax.set(xlabel="split points", ylabel="peak memory (MiB)", title="Peak memory per stage vs split point")
    ax.legend(fontsize=8)
    return _save(fig, path)


def pareto(rows: list[ReportRow], path: Path) -> Path | None:
    measured = [r for r in rows if r.tokens_per_s is not None and r.peak_memory is not None]
    if not measured:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([r.peak_memory / MIB for r in measured], [r.tokens_per_s for r in measured], color="C7", label="jobs")
    front = sorted((r for r in measured if r.pareto), key=lambda r: r.peak_memory)
    ax.plot(
        [r.peak_memory / MIB for r in front],
        [r.tokens_per_s for r in front],
        color="C3",
        marker="o",
        label="Pareto front",
    )
    for r in measured:
        ax.annotate(
            f"{r.job}", (r.peak_memory / MIB, r.tokens_per_s), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    best = [r for r in measured if r.best]
    if best:
        ax.scatter(
            [best[0].peak_memory / MIB],
            [best[0].tokens_per_s],
            marker="*",
            s=220,
            color="C1",
            label=f"best (job {best[0].job})",
            zorder=3,
        )
    ax.set(xlabel="peak memory, max over ranks (MiB)", ylabel="tokens/s", title="Throughput vs peak memory")
    ax.legend(fontsize=8)
    return _save(fig, path)


def draw_all(rows: list[ReportRow], out_dir: Path) -> dict[str, Path]:
    """Every plot the sweep has data for: {name: png path}."""
    drawn = {
        "tokens_per_s_vs_m": tokens_vs_m(rows, out_dir / "tokens_per_s_vs_m.png"),
        "bubble_vs_m": bubble_vs_m(rows, out_dir / "bubble_vs_m.png"),
        "peak_memory_vs_split": memory_vs_split(rows, out_dir / "peak_memory_vs_split.png"),
        "pareto": pareto(rows, out_dir / "pareto.png"),
    }
    return {name: path for name, path in drawn.items() if path is not None}
