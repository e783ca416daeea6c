"""Faults injected on purpose, for tests and drills: ``+debug.<kind>_at_step=N`` (``+debug.<kind>_rank=R``,
default rank 0).

Kinds: ``fail`` raises in the worker (every attempt), ``kill`` sends SIGKILL to it, ``hang`` stops it
answering, ``nan`` makes the loss and one gradient NaN; all but ``fail`` fire in the first attempt only,
so an elastic restart does not repeat them. ``wait`` (every rank, ``+debug.wait_at_step=N``) holds the run
before step N until a stop signal arrives or ``+debug.wait_file`` exists (at most ``WAIT_MAX_S``): a test that
signals a run, or acts while it runs, does so at a point the run waits for instead of racing its last steps. The loop asks only when some
``+debug.*_at_step`` is set.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

KINDS = ("fail", "kill", "hang", "nan", "wait")

#: how long ``debug.wait_at_step`` holds a run that is never signalled before it goes on
WAIT_MAX_S = 600.0


class FaultInjector:
    def __init__(self, debug: Mapping[str, Any], *, rank: int, log: logging.Logger):
        self.debug = dict(debug)
        self.rank = rank
        self.log = log

    @classmethod
    def from_config(cls, debug: Mapping[str, Any] | None, *, rank: int, log: logging.Logger) -> FaultInjector | None:
        """An injector when ``debug`` asks for any fault; None (nothing to do in the loop) otherwise."""
        debug = dict(debug or {})
        if not any(f"{kind}_at_step" in debug for kind in KINDS):
            return None
        return cls(debug, rank=rank, log=log)

    def due(self, kind: str, step: int) -> bool:
        """True when ``+debug.<kind>_at_step=step`` targets this rank (and, but for ``fail``, this is the
        first attempt)."""
        if self.debug.get(f"{kind}_at_step") != step or self.rank != int(self.debug.get(f"{kind}_rank") or 0):
            return False
        return kind == "fail" or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0

    def wait_for_stop(self, step: int, stop_requested: Callable[[], bool]) -> None:
        """wait: every rank holds before ``step`` until ``stop_requested()`` (a stop signal arrived) or the file
        ``debug.wait_file`` exists."""
        if self.debug.get("wait_at_step") != step or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")):
            return
        go = Path(self.debug["wait_file"]) if self.debug.get("wait_file") else None
        self.log.info("debug.wait_at_step: rank %d waits before step %d for a stop signal", self.rank, step)
        deadline = time.monotonic() + WAIT_MAX_S
        while not stop_requested() and not (go and go.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)

    def before_step(self, step: int) -> None:
        """fail, kill or hang before the step's forward pass."""
        if self.due("fail", step):
            raise RuntimeError(f"injected failure at step {step} on rank {self.rank} (debug.fail_at_step)")
        if self.due("kill", step):
            self.log.info("debug.kill_at_step: killing rank %d at step %d", self.rank, step)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.due("hang", step):
            self.log.info("debug.hang_at_step: rank %d stops answering at step %d", self.rank, step)
            time.sleep(10**6)

    def after_backward(self, step: int, loss: torch.Tensor | None, parameters) -> torch.Tensor | None:
        """nan: one gradient and the loss become NaN after the backward pass."""
        if not self.due("nan", step):
            return loss
        for p in parameters:
            if p.grad is not None:
                p.grad.fill_(float("nan"))
                break
        return loss * float("nan") if loss is not None else loss
