"""Rank 0's console: a rich progress bar with loss and tokens/s (samples/s for image data) on a terminal, a log line
per logged step (above the bar on a terminal; always in logs/rank0.log). Off a terminal (a file, a pipe, a batch job's
log), where no bar moves, a line comes at least every ``HEARTBEAT_S`` seconds even when logged steps are further
apart."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from parallel.foundation import dims
from trainer.observe.sink import Sink

HEARTBEAT_S = 30.0
"""Off a terminal, the longest the console stays silent during the loop."""


class ConsoleSink(Sink):
    def __init__(
        self,
        *,
        total_steps: int,
        start_step: int,
        log: logging.Logger,
        terminal: bool | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log = log
        console = Console()
        self.progress = None
        self.total_steps = total_steps
        self.heartbeat_s, self.clock = heartbeat_s, clock
        self.last_line = (clock(), start_step)
        """(when, at which step) the console last had a line: the heartbeat's reference."""
        if console.is_terminal if terminal is None else terminal:
            self.progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
                redirect_stdout=True,
                redirect_stderr=True,
            )
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step, loss="-", rate="-")
            self.progress.start()

    def advance(self, step: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step)
            return
        now = self.clock()
        since, at = self.last_line
        if now - since >= self.heartbeat_s and step > at:
            self.log.info(
                f"step {step:>5} of {self.total_steps} | {(now - since) / (step - at):.1f} s/step over the last "
                f"{step - at} step(s) (a line at least every {self.heartbeat_s:.0f} s; losses every trainer.log_every)"
            )
            self.last_line = (now, step)

    def log_step(self, record: dict) -> None:
        extras = ""
        if "comm_fraction" in record:
            extras += f" comm {record['comm_fraction']:.0%}"
        for d in dims.DIMENSIONS:  # each dimension's share of the step, as its row names it (tp comm, ep a2a ...)
            share = f"{d.metrics[0]}_fraction" if d.label else ""
            if share in record:
                extras += f" {d.label} {record[share]:.0%}"
        if "bubble_fraction" in record:
            extras += f" bubble {record['bubble_fraction']:.0%}"
        if "rewards_accuracy" in record:
            extras += f" | reward acc {record['rewards_accuracy']:.2f} margin {record['rewards_margin']:.4f}"
        if "val_loss" in record:
            extras += f" | val loss {record['val_loss']:.4f}"
            extras += f" (ppl {record['val_ppl']:.2f})" if "val_ppl" in record else ""
        if "val_rewards_accuracy" in record:
            extras += f" reward acc {record['val_rewards_accuracy']:.2f} margin {record['val_rewards_margin']:.4f}"
        rate = throughput(record)
        if self.progress is not None:
            self.progress.update(self.task, loss=f"{record['loss']:.4f}", rate=rate)
        line = (
            f"step {record['step']:>5} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
            f"{record['step_time_s'] * 1000:.0f} ms/step | {rate}{extras}"
        )
        self.log.info(line)  # above the live bar on a terminal; always in logs/rank0.log
        self.last_line = (self.clock(), int(record["step"]))

    def log_summary(self, summary: dict) -> None:
        """The bar goes (the loop is over), then a completed run's end line: its first and final loss and its median
        throughput."""
        self.close(exit_code=0)
        if summary.get("status") == "completed" and summary.get("final_loss") is not None:
            self.log.info(
                "done: loss %.4f at step %d -> %.4f at step %d, %s (median)",
                summary["first_loss"],
                summary["first_loss_step"],
                summary["final_loss"],
                summary["last_step"],
                throughput(summary),
            )

    def close(self, *, exit_code: int) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def throughput(record: dict) -> str:
    """A record's (or a summary's) throughput as the console says it: samples/s where the data counts samples (image
    data: ``samples_per_s``), else tok/s."""
    if record.get("samples_per_s") is not None:
        return f"{record['samples_per_s']:,.0f} samples/s"
    return f"{record['tokens_per_s']:,.0f} tok/s"
