"""Start-up progress: what a run is doing before its first step, each line with the seconds since the command started;
and a long preparation (chat, tokens, the corpus) said as it goes (``Steps``).

The clock starts when the command's process started (``python train.py``, ``meshtrain``, a torchrun or srun rank); a
job of a multirun starts it when Hydra hands it the job, so each job counts its own start-up. The launcher passes the
start to the workers (``run_meta[STARTED_KEY]``), which log their stages on the same clock (rank 0 on the console, every
rank in its own ``logs/rank{N}.log``); ``summary.json``'s ``time_to_first_step_s`` is measured on it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

STARTED_KEY = "started_unix"
"""run_meta's key for the clock's start (seconds since the epoch)."""

PREPARATION_EVERY_S = 5.0
"""The longest a preparation stays silent between its start and end lines."""


def console(line: str) -> None:
    """A line on the console, at once. Under torchrun or srun every rank runs the launcher's code; only rank 0 says
    it."""
    if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
        print(line, file=sys.stdout, flush=True)


def process_started_unix() -> float:
    """When this process started, to about 10 ms: now less the process's age (Linux: /proc/uptime less its start tick
    in /proc/self/stat). psutil's create_time adds the boot time, which Linux gives in whole seconds, so it can be up
    to 1 s early; it serves only where /proc does not answer, and now where nothing does."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks
            age = float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError):  # not Linux
        pass
    import psutil

    try:
        return float(psutil.Process(os.getpid()).create_time())
    except (psutil.Error, OSError):  # pragma: no cover - no process table: from now
        return time.time()


@dataclass(frozen=True)
class StartClock:
    started_unix: float

    @classmethod
    def for_job(cls, *, multirun: bool) -> StartClock:
        """A single run's clock starts with its process; a multirun job's when it begins."""
        return cls(time.time() if multirun else process_started_unix())

    @classmethod
    def from_meta(cls, run_meta: dict) -> StartClock:
        """The launcher's clock (a worker's run_meta); a run without one (a test's) starts it now."""
        started = run_meta.get(STARTED_KEY)
        return cls(float(started) if started is not None else time.time())

    def elapsed(self) -> float:
        return max(0.0, time.time() - self.started_unix)

    def line(self, message: str) -> str:
        """``[+2.1 s] message``: a stage of the start-up as the console and the rank logs show it."""
        return f"[+{self.elapsed():.1f} s] {message}"

    def say(self, message: str) -> None:
        """A stage of the launcher process (before any worker has a log): on the console, at once."""
        console(self.line(message))


@dataclass
class Steps:
    """A long preparation said as it goes: a start line, a line with what is done at least every ``every_s`` while
    ``advance`` is called, and an end line with its time (``what: done, SUMMARY, in 8.1 s``)."""

    what: str
    unit: str
    total: int | None = None
    say: Callable[[str], None] = console
    every_s: float = PREPARATION_EVERY_S
    clock: Callable[[], float] = time.monotonic
    done: int = 0
    started: float = field(init=False)
    last: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.last = self.clock()
        self.say(f"{self.what}: started" + (f" ({self.total:,} {self.unit})" if self.total is not None else ""))

    def advance(self, n: int = 1, *, note: str = "") -> None:
        self.done += n
        now = self.clock()
        if now - self.last >= self.every_s:
            self.last = now
            of = f"/{self.total:,}" if self.total else ""
            share = f" ({self.done / self.total:.0%})" if self.total else ""
            self.say(
                f"{self.what}: {self.done:,}{of} {self.unit}{share}{', ' + note if note else ''}, "
                f"{now - self.started:.1f} s"
            )

    def note(self, message: str) -> None:
        """A stage of the preparation (``what: message, 2.0 s``)."""
        self.last = self.clock()
        self.say(f"{self.what}: {message}, {self.last - self.started:.1f} s")

    def end(self, summary: str) -> None:
        self.say(f"{self.what}: done, {summary}, in {self.clock() - self.started:.1f} s")
