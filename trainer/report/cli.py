"""The sweep report: ``python -m trainer.report multirun/DATE/TIME``.

Reads every job folder of a multirun, writes ``report.md`` (one row per job: layout, schedule, m,
split, tokens/s, step time, measured vs theoretical bubble, peak memory per stage, status and the
reason a job was skipped or failed) and the PNG plots next to it, marks the best configuration and the
Pareto front (throughput vs peak memory). When the jobs logged to W&B (or with ``--wandb MODE``), the
table and plots go to one summary run in the sweep's W&B group, the plots also as interactive W&B charts
(``wandb.plot`` line series and scatter over a Table). ``--wandb-workspace`` builds a saved W&B workspace
for the group (``trainer/report/workspace.py``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from trainer.observe.durable import write_text
from trainer.report.plots import draw_all
from trainer.report.rows import MIB, RANK_KEYS, ReportRow, build_rows
from trainer.sweeps.jobs import (
    SweepJob,
    count_statuses,
    counts_line,
    link_runs,
    read_sweep,
    sweep_name,
    write_counts,
)

log = logging.getLogger("meshtrain.report")

COLUMNS = [
    "job",
    "layout",
    "schedule",
    "m",
    "split",
    "tokens/s",
    "step time (ms)",
    "bubble measured",
    "bubble theoretical",
    "bubble = schedule + imbalance + overhead",
    "peak memory per stage (MiB)",
    "planner (ms)",
    "planner error",
    "status",
]


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def _bubble_parts(row: ReportRow) -> str:
    parts = (row.bubble_schedule, row.bubble_imbalance, row.bubble_overhead)
    return "-" if None in parts else " + ".join(f"{p:.0%}" for p in parts)


def columns(rows: list[ReportRow]) -> list[str]:
    """COLUMNS, plus the validation losses when any job evaluated."""
    if any(r.val_loss is not None for r in rows):
        return COLUMNS[:-1] + ["val loss", "best val loss", COLUMNS[-1]]
    return COLUMNS


def row_cells(row: ReportRow, *, with_val: bool = False) -> list[str]:
    marks = ("★ " if row.best else "") + ("◆ " if row.pareto else "")
    status = row.status if row.status == "completed" else f"{row.status}: {row.reason.splitlines()[-1].strip(' -')}"
    val = [_fmt(row.val_loss, ".4f"), _fmt(row.best_val_loss, ".4f")] if with_val else []
    return [
        f"{marks}{row.job}",
        row.layout,
        row.schedule or "-",
        "-" if row.micro_batches is None else str(row.micro_batches),
        row.split,
        _fmt(row.tokens_per_s, ",.0f"),
        _fmt(row.step_time_s, ".1f", 1000.0),
        _fmt(row.bubble_measured, ".0%"),
        _fmt(row.bubble_theoretical, ".0%"),
        _bubble_parts(row),
        " / ".join(f"{b / MIB:.0f}" for b in row.peak_memory_per_stage) or "-",
        _fmt(row.predicted_step_time_s, ".1f", 1000.0),
        _fmt(row.prediction_error, "+.0%"),
        *val,
        status,
    ]


def _escape(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def markdown(
    *,
    sweep_dir: Path,
    jobs: list[SweepJob],
    rows: list[ReportRow],
    plots: dict[str, Path],
    rank_by: str | None = None,
) -> str:
    lines = [f"# Sweep report: {sweep_dir}", "", counts_line(count_statuses(jobs)), ""]
    best = next((r for r in rows if r.best), None)
    if best is not None:
        job = next(j for j in jobs if j.num == best.job)
        value = (
            f"validation loss {best.val_loss:.4f}" if rank_by == "val_loss" else f"{best.tokens_per_s:,.0f} tokens/s"
        )
        lines += [f"**Best** (★): job {best.job}, {value} — `{' '.join(job.overrides)}`", ""]
    if rank_by is not None:
        label, higher = RANK_KEYS[rank_by]
        lines += [f"Ranked by {label} ({'highest' if higher else 'lowest'} first).", ""]
    cols = columns(rows)
    with_val = len(cols) > len(COLUMNS)
    front = [str(r.job) for r in rows if r.pareto]
    if front:
        lines += [f"**Pareto front** (◆, throughput vs peak memory): jobs {', '.join(front)}", ""]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_escape(c) for c in row_cells(r, with_val=with_val)) + " |" for r in rows]
    not_run = [(j, r) for j, r in zip(jobs, rows) if j.status != "completed"]
    if not_run:
        lines += ["", "## Jobs that did not complete", ""]
        lines += [
            f"- job {j.num} **{j.status}** (`{' '.join(j.overrides)}`): {' '.join(j.reason.split())}"
            for j, _ in not_run
        ]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{name}]({path.name})" for name, path in plots.items()]
    return "\n".join(lines) + "\n"


def _wandb_settings(jobs: list[SweepJob], mode: str, sweep_dir: Path) -> tuple[str, dict[str, Any], str]:
    """(mode, logger.wandb config, group): the group the jobs logged to, read from their W&B runs."""
    wandb_cfg = (
        next((((j.config.get("logger") or {}).get("wandb")) for j in jobs if j.config.get("logger")), None) or {}
    )
    if mode == "auto":
        used = any((j.summary or {}).get("wandb_dir") for j in jobs)
        mode = str(wandb_cfg.get("mode", "offline")) if used else "disabled"
    group = wandb_cfg.get("group") or _group_from_runs(jobs) or sweep_name(sweep_dir)
    return mode, wandb_cfg, group


def _group_from_runs(jobs: list[SweepJob]) -> str | None:
    from trainer.observe.wandb_read import WandbReadError, read_run

    for job in jobs:
        try:
            group = read_run(job.path).group
        except (FileNotFoundError, WandbReadError):
            continue
        if group:
            return group
    return None


def log_to_wandb(
    *,
    sweep_dir: Path,
    jobs: list[SweepJob],
    rows: list[ReportRow],
    plots: dict[str, Path],
    report_path: Path,
    mode: str,
) -> str | None:
    """One summary run (job_type ``sweep-report``) in the sweep's group; returns its folder or None. A rerun of
    the report replaces it: the run id is kept in ``<sweep dir>/wandb_run.json`` (online: the same run, resumed)
    and the sweep folder's own earlier W&B run folders (only report runs are not links) are removed first."""
    mode, cfg, group = _wandb_settings(jobs, mode, sweep_dir)
    if mode == "disabled":
        return None
    import shutil

    from trainer.observe.wandb_client import WandbClient
    from trainer.observe.wandb_read import segment_dirs
    from trainer.observe.wandb_run import RunIdentity

    for earlier in segment_dirs(sweep_dir):
        shutil.rmtree(earlier)

    counts = count_statuses(jobs)
    client = WandbClient(
        mode=mode,
        project=str(cfg.get("project", "meshtrain")),
        entity=cfg.get("entity"),
        run_dir=sweep_dir,
        config={"sweep_dir": str(sweep_dir), "jobs": len(jobs), **counts},
        log=log,
        group=group,
        job_type="sweep-report",
        tags=["sweep-report"],
        name=f"{group}-report",
        init_timeout=float(cfg.get("init_timeout", 15)),
        identity=RunIdentity(sweep_dir),
    )
    if not client.ready():
        return None
    import wandb

    cols = columns(rows)
    with_val = len(cols) > len(COLUMNS)
    client.run.log({"sweep/table": wandb.Table(columns=cols, data=[row_cells(r, with_val=with_val) for r in rows])})
    client.run.log(interactive_charts(rows))
    best = next((r for r in rows if r.best), None)
    best_summary = {"best_job": best.job, "best_tokens_per_s": best.tokens_per_s} if best else {}
    if best is not None and best.val_loss is not None:
        best_summary["best_val_loss"] = best.val_loss
    client.log_summary(best_summary)
    client.log_files(images={f"sweep/{name}": path for name, path in plots.items()}, files=[report_path])
    directory = client.directory
    client.finish()
    return directory


def interactive_charts(rows: list[ReportRow]) -> dict[str, Any]:
    """The report's plots as W&B charts (``wandb.plot``) over one Table of the completed jobs."""
    import wandb

    done = [r for r in rows if r.tokens_per_s is not None]
    columns = ["job", "split", "schedule", "micro_batches", "tokens_per_s", "bubble_measured", "bubble_theoretical"]
    columns += ["peak_memory_mib", "best", "pareto"]
    data = [
        [
            r.job,
            r.split,
            r.schedule or "-",
            r.micro_batches,
            r.tokens_per_s,
            r.bubble_measured,
            r.bubble_theoretical,
            (r.peak_memory or 0) / MIB,
            r.best,
            r.pareto,
        ]
        for r in done
    ]
    table = wandb.Table(columns=columns, data=data)
    charts: dict[str, Any] = {"charts/jobs": table}
    piped = [r for r in done if r.micro_batches is not None]
    series = sorted({(r.split, r.schedule or "-") for r in piped})
    if piped:
        ms = sorted({r.micro_batches for r in piped})

        def line(value: str) -> tuple[list[list[float]], list[str]]:
            ys, keys = [], []
            for split, schedule in series:
                by_m = {
                    r.micro_batches: getattr(r, value)
                    for r in piped
                    if (r.split, r.schedule or "-") == (split, schedule)
                }
                ys.append([by_m.get(m) if by_m.get(m) is not None else float("nan") for m in ms])
                keys.append(f"split {split} {schedule}")
            return ys, keys

        ys, keys = line("tokens_per_s")
        charts["charts/tokens_per_s_vs_m"] = wandb.plot.line_series(
            xs=ms, ys=ys, keys=keys, title="tokens/s vs micro-batches, per split", xname="micro-batches"
        )
        ys, keys = line("bubble_measured")
        charts["charts/bubble_vs_m"] = wandb.plot.line_series(
            xs=ms, ys=ys, keys=keys, title="measured bubble vs micro-batches, per split", xname="micro-batches"
        )
    charts["charts/pareto"] = wandb.plot.scatter(
        table, "peak_memory_mib", "tokens_per_s", title="tokens/s vs peak memory (MiB)"
    )
    return charts


def write_report(
    sweep_dir: Path, *, wandb_mode: str = "auto", rank_by: str | None = None, workspace: bool = False
) -> dict[str, Any]:
    """Write ``report.md`` and the plots into ``sweep_dir``; returns what was written. ``rank_by``
    (tokens_per_s or val_loss) orders the table best first and picks the best job by that number;
    ``workspace`` also builds a W&B workspace for the sweep's group."""
    sweep_dir = Path(sweep_dir)
    jobs = read_sweep(sweep_dir)
    write_counts(sweep_dir, jobs)
    rows = build_rows(jobs, rank_by=rank_by)
    plots = draw_all(sorted(rows, key=lambda r: r.job), sweep_dir)
    report_path = sweep_dir / "report.md"
    write_text(report_path, markdown(sweep_dir=sweep_dir, jobs=jobs, rows=rows, plots=plots, rank_by=rank_by))
    wandb_dir = log_to_wandb(
        sweep_dir=sweep_dir, jobs=jobs, rows=rows, plots=plots, report_path=report_path, mode=wandb_mode
    )
    out = {"report": report_path, "plots": plots, "rows": rows, "wandb_dir": wandb_dir, "counts": count_statuses(jobs)}
    out["linked_runs"] = link_runs(sweep_dir, jobs)
    if workspace:
        from trainer.report.workspace import write_workspace

        _, cfg, group = _wandb_settings(jobs, "offline", sweep_dir)
        out["workspace"] = write_workspace(
            sweep_dir=sweep_dir,
            jobs=jobs,
            group=group,
            entity=cfg.get("entity"),
            project=str(cfg.get("project", "meshtrain")),
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="a multirun folder, e.g. multirun/2026-12-02/12-00-00")
    parser.add_argument(
        "--wandb",
        default="auto",
        choices=["auto", "offline", "online", "disabled"],
        help="auto: log to W&B when the jobs did, in their mode (default)",
    )
    parser.add_argument(
        "--rank-by",
        choices=list(RANK_KEYS),
        default=None,
        help="order the table best first by this number and pick the best job by it "
        "(val_loss: the jobs' final validation loss, trainer.eval_every > 0); default: job order, best by tokens/s",
    )
    parser.add_argument(
        "--wandb-workspace",
        action="store_true",
        help="also build a W&B workspace for the sweep's group (wandb-workspaces): written as "
        "wandb_workspace.json, saved to W&B when an account is configured",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        out = write_report(args.sweep_dir, wandb_mode=args.wandb, rank_by=args.rank_by, workspace=args.wandb_workspace)
    except FileNotFoundError as exc:
        print(f"meshtrain report: {exc}", file=sys.stderr)
        return 2
    print(f"{counts_line(out['counts'])}\nreport: {out['report']}")
    for path in out["plots"].values():
        print(f"plot:   {path}")
    if out["wandb_dir"]:
        print(f"W&B summary run: {out['wandb_dir']}")
    if out.get("workspace"):
        ws = out["workspace"]
        print(f"W&B workspace: {ws['url'] or ws['path']}")
    return 0
