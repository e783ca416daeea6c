"""Time covered by a set of possibly overlapping intervals: how busy a link or a rank was."""

from __future__ import annotations

from collections.abc import Iterable


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
