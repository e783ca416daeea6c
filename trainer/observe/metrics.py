"""Metric files of a run: metrics.jsonl (one object per logged step) and summary.json."""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any


def _clean(obj: Any) -> Any:
    """JSON-safe values: NaN/inf become null, numpy scalars become Python numbers."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()
        except (TypeError, ValueError):
            pass
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json(path: Path, obj: Any) -> None:
    """Write atomically: a reader never sees half a file, a crash never leaves one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(_clean(obj), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


class MetricsFile:
    """Appends one JSON line per logged step, flushed so a crash keeps what was logged.

    A resumed run (``keep_through_step`` > 0) keeps the lines up to the step it resumes from and drops
    later ones (they were logged after the checkpoint and are about to be recomputed).
    """

    def __init__(self, path: Path, *, keep_through_step: int = 0):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        kept = []
        if keep_through_step > 0 and path.exists():
            kept = [r for r in read_metrics(path) if r.get("step", 0) <= keep_through_step]
        self._f = open(path, "w")
        for record in kept:
            self.write(record)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(_clean(record)) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class StepStats:
    """Per-step timings kept on rank 0 for the summary (medians skip the warm-up steps)."""

    def __init__(self, *, warmup: int = 2):
        self.warmup = warmup
        self.step_times: list[float] = []
        self.tokens_per_s: list[float] = []

    def add(self, step_time: float, tokens: int) -> None:
        self.step_times.append(step_time)
        self.tokens_per_s.append(tokens / max(step_time, 1e-12))

    def _steady(self, values: list[float]) -> list[float]:
        return values[self.warmup :] if len(values) > self.warmup else values

    def median_step_time(self) -> float:
        v = self._steady(self.step_times)
        return statistics.median(v) if v else float("nan")

    def median_tokens_per_s(self) -> float:
        v = self._steady(self.tokens_per_s)
        return statistics.median(v) if v else float("nan")
