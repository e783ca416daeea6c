"""What happened to each job of a multirun folder: read back from the files the jobs left.

A job folder is ``<sweep dir>/<job number>`` (``hydra.sweep.subdir``). A job that trained leaves
``summary.json``; one that was refused before launch (invalid layout) or failed leaves ``status.json``
(``{status: skipped|failed|preempted, reason, overrides}``, written by ``trainer.task``); a job with
neither crashed outside the task or is still running. A job the Slurm launcher requeued after a time
limit or preemption (``requeues.json``, trainer/sweeps/slurm.py) counts as completed once its last
attempt finished, and as preempted while it stopped without finishing. Torch-free and quick: the Hydra callback that
counts jobs at the end of every sweep uses it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainer.observe.durable import read_json, write_json

#: the statuses a job can end with, in report order
STATUSES = ("completed", "skipped", "failed", "preempted")
COUNTS_FILE = "sweep_status.json"


@dataclass
class SweepJob:
    """One job of a sweep: its number, folder, outcome and (when it trained) its summary."""

    num: int
    path: Path
    status: str
    reason: str = ""
    overrides: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # the job's composed config (.hydra/config.yaml)
    summary: dict[str, Any] | None = None
    requeues: list[dict[str, Any]] = field(default_factory=list)  # Slurm requeues after a checkpoint

    @property
    def succeeded(self) -> bool:
        return self.status == "completed"


def sweep_name(sweep_dir: Path) -> str:
    """The W&B group of a sweep, as the jobs name it (``trainer.task.hydra_run_meta``)."""
    return "sweep-" + "-".join(Path(sweep_dir).resolve().parts[-2:])


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def read_job(path: Path) -> SweepJob:
    # Hydra writes these in place: a torn one may parse as something else than a list / mapping
    overrides = _read_yaml(path / ".hydra" / "overrides.yaml")
    overrides = [str(o) for o in overrides] if isinstance(overrides, list) else []
    config = _read_yaml(path / ".hydra" / "config.yaml")
    config = config if isinstance(config, dict) else {}
    # torn files give their whole members (trainer/observe/durable.py); a summary torn before its status is none
    summary = _dict_or_none(read_json(path / "summary.json"))
    if summary is not None and "status" not in summary:
        summary = None
    status_file = _dict_or_none(read_json(path / "status.json"))
    if summary is not None:
        status, reason = str(summary.get("status", "completed")), ""
        if status != "completed" and status_file is not None:
            reason = str(status_file.get("reason", ""))
    elif status_file is not None:
        status, reason = str(status_file.get("status", "failed")), str(status_file.get("reason", ""))
        if isinstance(status_file.get("overrides"), list):
            overrides = status_file["overrides"]
    else:
        status, reason = (
            "failed",
            "no summary.json or status.json: the job crashed outside the task or is still running",
        )
    return SweepJob(
        num=int(path.name),
        path=path,
        status=status,
        reason=reason,
        overrides=list(overrides),
        config=config,
        summary=summary,
        requeues=[r for r in read_json(path / "requeues.json", default=[]) or [] if isinstance(r, dict)],
    )


def _dict_or_none(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def read_sweep(sweep_dir: Path) -> list[SweepJob]:
    """Every job of a multirun folder, by job number; a clear error if the folder holds none."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"{sweep_dir}: no such folder (give a multirun folder, e.g. multirun/DATE/TIME)")
    folders = [p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit() and (p / ".hydra").is_dir()]
    if not folders:
        raise FileNotFoundError(f"{sweep_dir}: no job folders (0/, 1/, ... with .hydra/): is this a multirun folder?")
    return [read_job(p) for p in sorted(folders, key=lambda p: int(p.name))]


def count_statuses(jobs: list[SweepJob]) -> dict[str, int]:
    counts = Counter(job.status for job in jobs)
    return {status: counts.get(status, 0) for status in (*STATUSES, *sorted(set(counts) - set(STATUSES)))}


def counts_line(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    parts = [f"{n} {status}" for status, n in counts.items() if n or status in ("completed", "skipped", "failed")]
    return f"{total} jobs: " + ", ".join(parts)


def write_counts(sweep_dir: Path, jobs: list[SweepJob]) -> dict[str, Any]:
    """``<sweep dir>/sweep_status.json``: the counts and each job's status and reason."""
    counts = count_statuses(jobs)
    record = {
        "counts": counts,
        "jobs": [
            {
                "job": j.num,
                "status": j.status,
                "reason": j.reason,
                "overrides": j.overrides,
                "requeues": len(j.requeues),
            }
            for j in jobs
        ],
    }
    write_json(Path(sweep_dir) / COUNTS_FILE, record)
    return record


def link_runs(sweep_dir: Path, jobs: list[SweepJob]) -> list[Path]:
    """Every job's W&B run folder linked into ``<sweep dir>/wandb/`` (relative links), so that
    ``wandb leet <sweep dir>/wandb`` browses the whole sweep (and the report run, once ``trainer.report`` wrote
    it). Called when the sweep ends (trainer/sweeps/callback.py) and again by the report; returns the new links."""
    from trainer.observe.wandb_read import segment_dirs

    links = []
    for job in jobs:
        for seg in segment_dirs(job.path):
            link = sweep_dir / "wandb" / seg.name
            if link.is_symlink() or link.exists():
                continue
            link.parent.mkdir(exist_ok=True)
            link.symlink_to(Path("..") / seg.relative_to(sweep_dir))
            links.append(link)
    return links
