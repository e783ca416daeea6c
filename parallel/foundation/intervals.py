"""Time covered by a set of possibly overlapping intervals: how busy a link or a rank was."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol


def union_seconds(intervals: Iterable[tuple[float, float]], *, within: tuple[float, float] | None = None) -> float:
    """Total length covered by [start, end] intervals, clamped to ``within`` when given."""
    lo, hi = within if within is not None else (float("-inf"), float("inf"))
    total, cur_start, cur_end = 0.0, 0.0, None
    for start, end in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if end <= start:
            continue
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


class StepCommMeter(Protocol):
    """What an engine asks of a dp dimension's communication meter: wrap each step, then take its time."""

    count_key: str

    def step(self, measure: bool = True) -> AbstractContextManager:
        """Context for one whole step; ``measure``: the loop logs this step (a sampling meter times only those)."""
        ...

    def take(self) -> tuple[float, int] | None:
        """(busy seconds, collectives) of the step just run; None when that step was not measured."""
        ...


class Meter(Protocol):
    """What an engine asks of a technique's meter (tp's collectives, cp's and ep's all-to-alls): enter it around
    each step, then read the step's metrics and, at the end, the run's summary. The engine never names the
    technique: each offers its own (``tp.tp_meter``, ``cp.cp_meter``, ``ep.EPMeter``)."""

    def step(self, measure: bool = True) -> AbstractContextManager:
        """Context for one whole step; ``measure``: the loop logs this step (a sampling meter times only those)."""
        ...

    def metrics(self, elapsed_s: float) -> dict[str, Any]:
        """The step just run (``elapsed_s`` long, as the loop timed it): its metrics, empty when not measured."""
        ...

    def summary(self) -> dict[str, Any]:
        """The run's figures for summary.json (empty when there are none)."""
        ...


class IntervalLog:
    """[start, end] intervals added from any thread (a collective's completion callback runs on the
    backend's thread), taken and cleared once per step by the loop."""

    count_key = "collectives"

    def __init__(self) -> None:
        self._intervals: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def add(self, start: float, end: float) -> None:
        with self._lock:
            self._intervals.append((start, end))

    def take_intervals(self) -> list[tuple[float, float]]:
        with self._lock:
            intervals, self._intervals = self._intervals, []
        return intervals

    def step(self, measure: bool = True) -> AbstractContextManager:
        """Context for one whole step; intervals are logged on every step, ``measure`` or not."""
        return nullcontext()

    def take(self) -> tuple[float, int] | None:
        """(busy seconds: union of the intervals, how many) since the last call."""
        intervals = self.take_intervals()
        return union_seconds(intervals), len(intervals)
