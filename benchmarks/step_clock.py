"""One clock for both sides of ``benchmarks/vs_torchtitan.py``: each rank notes, at the end of every step, the wall
clock, its process's CPU seconds (all its threads: gloo's included) and the loss when the step logged one, and writes
them at the end; the harness reads every rank's file and derives the same numbers for meshtrain and torchtitan.

Standard library only: meshtrain loads :class:`StepClock` as a trainer callback (``trainer.callbacks``, called with
the loop's own hooks), and torchtitan's side (``benchmarks/torchtitan_side.py``, in torchtitan's own environment)
calls :meth:`StepClock.mark` after each ``Trainer.train_step``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

WARMUP_STEPS = 2
"""Steps left out of the steady rates (the first steps build lazily: meshtrain's StepStats warm-up)."""


class StepClock:
    """This rank's step ends: ``{rank}.json`` in ``out`` at the end of the run."""

    def __init__(self, out: str):
        self.out = Path(out)
        self.rank = int(os.environ.get("RANK", "0"))
        self.marks: list[tuple[int, float, float, float, float | None]] = []

    def mark(self, step: int, loss: float | None = None) -> None:
        self.marks.append((step, time.perf_counter(), time.process_time(), time.time(), loss))

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        keys = ("step", "wall_s", "cpu_s", "unix", "loss")
        (self.out / f"{self.rank}.json").write_text(json.dumps([dict(zip(keys, m)) for m in self.marks]))

    # meshtrain's callback hooks (trainer/loop/callbacks.py calls them by name)
    def on_step_end(self, trainer: Any, *, step: int, metrics: dict[str, Any]) -> None:
        self.mark(step, metrics.get("loss"))

    def on_train_end(self, trainer: Any, *, summary: dict[str, Any]) -> None:
        self.write()


def read_ranks(out: Path) -> list[list[dict[str, Any]]]:
    """Every rank's marks, rank order."""
    files = sorted(out.glob("*.json"), key=lambda p: int(p.stem))
    return [json.loads(f.read_text()) for f in files]


def side_numbers(ranks: list[list[dict[str, Any]]], *, tokens_per_step: int, launch_unix: float) -> dict[str, Any]:
    """One run's numbers from its ranks' marks: tokens/s over the steady steps (every second between the end of step
    ``WARMUP_STEPS`` and the last, logging included), the median step's rate, the CPU seconds per steady step summed
    over the ranks, launch to the end of step 1 (the latest rank), and the logged losses (the first rank that has them:
    rank 0, or a pipeline's last stage)."""
    first = ranks[0]
    if len(first) <= WARMUP_STEPS + 1:
        raise ValueError(f"{len(first)} steps: the steady rates need more than {WARMUP_STEPS + 1}")
    span = first[-1]["wall_s"] - first[WARMUP_STEPS - 1]["wall_s"]
    steady = len(first) - WARMUP_STEPS
    gaps = [b["wall_s"] - a["wall_s"] for a, b in zip(first[WARMUP_STEPS - 1 :], first[WARMUP_STEPS:])]
    cpu = sum((r[-1]["cpu_s"] - r[WARMUP_STEPS - 1]["cpu_s"]) / steady for r in ranks)
    logged = [[(m["step"], m["loss"]) for m in r if m["loss"] is not None] for r in ranks]
    losses = next((rank for rank in logged if rank), [])
    return {
        "tokens_per_s": tokens_per_step * steady / span,
        "median_step_tokens_per_s": tokens_per_step / statistics.median(gaps),
        "step_cpu_s": cpu,
        "time_to_first_step_s": max(r[0]["unix"] for r in ranks) - launch_unix,
        "losses": losses,
    }


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def ratio_table(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per pair, over rounds of ``{"meshtrain": numbers, "torchtitan": numbers}``: the median (and range) of each
    round's meshtrain / torchtitan tokens/s ratio and CPU-per-step ratio, each side's CPU per step and time to first
    step, and the last round's final losses."""
    tps = [r["meshtrain"]["tokens_per_s"] / r["torchtitan"]["tokens_per_s"] for r in rounds]
    cpu = [r["meshtrain"]["step_cpu_s"] / r["torchtitan"]["step_cpu_s"] for r in rounds]
    side = {
        name: {
            "tokens_per_s": spread([r[name]["tokens_per_s"] for r in rounds]),
            "step_cpu_s": spread([r[name]["step_cpu_s"] for r in rounds]),
            "time_to_first_step_s": spread([r[name]["time_to_first_step_s"] for r in rounds]),
            "first_loss": rounds[-1][name]["losses"][0] if rounds[-1][name]["losses"] else None,
            "last_loss": rounds[-1][name]["losses"][-1] if rounds[-1][name]["losses"] else None,
        }
        for name in ("meshtrain", "torchtitan")
    }
    return {"tokens_per_s_ratio": spread(tps), "step_cpu_ratio": spread(cpu), "rounds": len(rounds), **side}
