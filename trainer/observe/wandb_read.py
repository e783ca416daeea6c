"""Read back a run's offline W&B data with W&B's own reader, ``wandb leet inspect``.

``wandb leet inspect --summary --json <run dir>`` prints a finished run's state, summary and config;
``wandb leet inspect --json <run dir>`` prints every record of the ``.wandb`` log as one JSON line
(run, config, history, summary, artifact ...). Both are W&B's reader (its ``wandb-core`` binary), so
meshtrain parses no W&B file format itself. A run folder may hold several offline segments of the same
W&B run (a resumed, restarted or preempted run opens the same run id again; ``wandb sync`` appends
them); ``read_run`` merges them in order, as the server would. Used by tests and the sweep report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class WandbReadError(RuntimeError):
    pass


def _leet(*args: str, timeout: float = 120.0) -> str:
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise WandbReadError(f"{' '.join(cmd[2:])} failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    return out.stdout


def inspect_summary(run_path: Path) -> dict[str, Any]:
    """``wandb leet inspect --summary --json``: state, exit code, summary, config of one offline run."""
    return json.loads(_leet("--summary", "--json", str(run_path)))


def inspect_records(run_path: Path) -> list[dict[str, Any]]:
    """``wandb leet inspect --json``: every record of one offline run, in order."""
    return [json.loads(line) for line in _leet("--json", str(run_path)).splitlines() if line.strip()]


def segment_dirs(run_dir: Path) -> list[Path]:
    """The W&B run folders under ``<run dir>/wandb``, oldest first (names start with their start time);
    links (a sweep folder links its jobs' runs for ``wandb leet``) are not this folder's own runs."""
    found = Path(run_dir).glob("wandb/*run-*")
    return sorted(p for p in found if p.is_dir() and not p.is_symlink() and list(p.glob("run-*.wandb")))


@dataclass
class WandbRun:
    run_id: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    """define_metric records"""
    segments: list[Path] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    """the run id of every segment (one id per training run)"""
    exit_codes: list[int | None] = field(default_factory=list)

    def steps(self, key: str = "train/step") -> list[int]:
        return [int(r[key]) for r in self.history if key in r]


def _merge(run: WandbRun, records: list[dict[str, Any]]) -> None:
    exit_code = None
    for rec in records:
        kind = rec.get("type")
        body = rec.get(kind) or {}
        if kind == "run":
            run.run_id = body.get("run_id", run.run_id)
            run.run_ids.append(run.run_id)
            run.group = body.get("run_group", run.group)
            run.job_type = body.get("job_type", run.job_type)
            run.tags = list(body.get("tags", run.tags))
            run.config.update((body.get("config") or {}).get("update") or {})
        elif kind == "config":
            run.config.update(body.get("update") or {})
        elif kind == "history":
            run.history.append(body.get("item") or {})
        elif kind == "summary":
            run.summary.update(body.get("update") or {})
        elif kind == "artifact":
            run.artifacts.append(body)
        elif kind == "metric":
            run.metrics.append(body)
        elif kind == "exit":
            exit_code = body.get("exit_code", 0)
    run.exit_codes.append(exit_code)
    run.config.pop("_wandb", None)


def read_run(run_dir: Path) -> WandbRun:
    """Every offline segment under ``<run dir>/wandb``, merged; raises FileNotFoundError when none."""
    segments = segment_dirs(run_dir)
    if not segments:
        raise FileNotFoundError(f"no W&B run under {run_dir}/wandb")
    run = WandbRun(segments=segments)
    for seg in segments:
        _merge(run, inspect_records(seg))
    return run
