"""Faults injected from outside the product, as trainer callbacks the reliability tests pass on the command line:
``inject(KillAt, step=7, rank=1)`` is the override ``trainer.callbacks=[{_target_:tests.faults.KillAt,step:7,rank:1}]``.

- ``FailAt``: the rank raises before the step (in every attempt, so an elastic restart fails again);
- ``KillAt``: the rank sends itself SIGKILL; ``HangAt``: it stops answering; ``NaNAt``: its loss and one gradient
  become NaN after the backward pass; each in the first attempt only, so an elastic restart does not repeat it;
- ``WaitAt``: every rank holds before the step until a stop signal arrives or ``file`` exists (at most
  ``WAIT_MAX_S``): a test that signals a run, or acts while it runs, does so at a point the run waits for;
- ``CrashWandbAt``: rank 0 tears W&B's service down under its run (its calls then raise): training must go on.

``rank`` defaults to 0; a rank the job does not have is refused before any worker starts (``Callback.problems``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from trainer.loop.callbacks import Callback

#: how long ``WaitAt`` holds a run that is never signalled before it goes on
WAIT_MAX_S = 600.0


def inject(fault: type[Callback], **kwargs: Any) -> str:
    """The command-line override that passes ``fault(**kwargs)`` as the run's one trainer callback."""
    args = "".join(f",{k}:{_value(v)}" for k, v in kwargs.items())
    return f"trainer.callbacks=[{{_target_:{fault.__module__}.{fault.__qualname__}{args}}}]"


def _value(v: Any) -> str:
    return str(v) if isinstance(v, (int, float)) else f"'{v}'"


def first_attempt() -> bool:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0


class Fault(Callback):
    """A fault at ``step`` on ``rank``."""

    every_attempt = False

    def __init__(self, *, step: int, rank: int = 0):
        self.step, self.rank = int(step), int(rank)

    @classmethod
    def problems(cls, *, world_size: int, step: int = 1, rank: int = 0, **kwargs: Any) -> list[str]:
        out = []
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            out.append(f"{cls.__name__}(step={step}): the step must be an integer >= 1")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            out.append(f"{cls.__name__}(rank={rank}): no such rank; the job has ranks 0..{world_size - 1}")
        return out

    def due(self, trainer: Any, step: int) -> bool:
        """This step, this rank, and (but for faults repeated in every attempt) the first attempt."""
        return step == self.step and trainer.ctx.rank == self.rank and (self.every_attempt or first_attempt())

    def say(self, trainer: Any, what: str) -> None:
        trainer.ctx.log.info("fault injection (%s): rank %d %s", type(self).__name__, trainer.ctx.rank, what)


class FailAt(Fault):
    every_attempt = True

    def on_step_start(self, trainer: Any, *, step: int) -> None:
        if self.due(trainer, step):
            raise RuntimeError(f"injected failure at step {step} on rank {self.rank} (tests.faults.FailAt)")


class KillAt(Fault):
    def on_step_start(self, trainer: Any, *, step: int) -> None:
        if self.due(trainer, step):
            self.say(trainer, f"is killed at step {step}")
            os.kill(os.getpid(), signal.SIGKILL)


class HangAt(Fault):
    def on_step_start(self, trainer: Any, *, step: int) -> None:
        if self.due(trainer, step):
            self.say(trainer, f"stops answering at step {step}")
            time.sleep(10**6)


class NaNAt(Fault):
    def on_after_backward(self, trainer: Any, *, step: int, loss: Any) -> None:
        if not self.due(trainer, step):
            return
        for p in trainer.engine.parameters():
            if p.grad is not None:
                p.grad.fill_(float("nan"))
                break
        if loss is not None:
            loss.fill_(float("nan"))  # detached: the loop's finiteness check reads this tensor


class WaitAt(Fault):
    """Every rank (``rank`` is not asked) waits before ``step``."""

    def __init__(self, *, step: int, file: str | None = None):
        super().__init__(step=step)
        self.file = Path(file) if file else None

    def on_step_start(self, trainer: Any, *, step: int) -> None:
        flag = trainer.preemption
        if step != self.step or flag is None or not first_attempt():
            return
        self.say(trainer, f"waits before step {step} for a stop signal")
        deadline = time.monotonic() + WAIT_MAX_S
        while not flag.requested and not (self.file and self.file.exists()) and time.monotonic() < deadline:
            time.sleep(0.05)


class CrashWandbAt(Fault):
    """Before ``step`` is logged, rank 0's W&B service goes away under its run, as when it crashes."""

    def on_step_start(self, trainer: Any, *, step: int) -> None:
        from trainer.observe.wandb_sink import WandbSink

        for sink in trainer.sinks:
            if step == self.step and isinstance(sink, WandbSink) and sink.client.ready():
                import wandb

                self.say(trainer, f"tears W&B's service down at step {step}")
                wandb.teardown()
