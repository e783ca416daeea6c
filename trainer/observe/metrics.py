"""metrics.jsonl: one object per logged step, appended by rank 0, cut back to whole records on resume."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from trainer.observe.durable import json_line, keep_records, read_jsonl


class MetricsFile:
    """Appends one JSON line per logged step, flushed so a crash keeps what was logged.

    A resumed run (``keep_through_step`` > 0) keeps the whole records up to the step it resumes from and
    drops the rest (logged after the checkpoint and about to be recomputed, or torn by a crash): the file is
    truncated back to the end of its last kept record, then appended to. Where a torn line sits among the
    kept ones (a file edited or damaged in the middle), the kept records are rewritten atomically instead.
    """

    def __init__(self, path: Path, *, keep_through_step: int = 0):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        if keep_through_step > 0 and path.exists():
            keep_records(path, lambda r: _step(r) <= keep_through_step)
            self._f = open(path, "a")
        else:
            self._f = open(path, "w")

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json_line(record))
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _step(record: dict[str, Any]) -> float:
    value = record.get("step", 0)
    return value if isinstance(value, (int, float)) else math.inf


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's whole records (a torn line is skipped, with one warning naming it)."""
    return read_jsonl(path)


class StepStats:
    """Per-step timings of this rank for the summary (medians skip the warm-up steps)."""

    def __init__(self, *, warmup: int = 2):
        self.warmup = warmup
        self.step_times: list[float] = []
        self.tokens_per_s: list[float] = []
        self.step_cpu_s: list[float] = []
        """The process's CPU seconds (all its threads) during each step: the host work a step costs, which a
        busy or shared machine inflates far less than the wall time."""

    def add(self, step_time: float, tokens: int, *, cpu_s: float) -> None:
        self.step_times.append(step_time)
        self.tokens_per_s.append(tokens / max(step_time, 1e-12))
        self.step_cpu_s.append(cpu_s)

    def _steady(self, values: list[float]) -> list[float]:
        return values[self.warmup :] if len(values) > self.warmup else values

    def median_step_time(self) -> float:
        v = self._steady(self.step_times)
        return statistics.median(v) if v else float("nan")

    def median_tokens_per_s(self) -> float:
        v = self._steady(self.tokens_per_s)
        return statistics.median(v) if v else float("nan")

    def median_step_cpu_s(self) -> float:
        v = self._steady(self.step_cpu_s)
        return statistics.median(v) if v else float("nan")
