"""What every destination of rank 0's records implements: the console (``console.py``), the run folder's files
(``files_sink.py``: metrics.jsonl, summary.json), W&B (``wandb_sink.py``) and TensorBoard (``tensorboard_sink.py``).
``trainer/observe/sinks.py`` builds the list ``logger=`` asks for; the loop calls each hook on every sink in turn.
A destination writes ``log_step``; a hook it has no use for stays a no-op."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Sink:
    def log_step(self, record: dict[str, Any]) -> None:
        """A logged step's record (``trainer.log_every``): metrics.jsonl's keys, ``step`` among them."""
        raise NotImplementedError(f"{type(self).__name__} does not write a logged step")

    def advance(self, step: int) -> None:
        """Every step, logged or not (the console's progress bar)."""

    def log_checkpoint(self, path: Path, *, step: int, loss: float | None) -> None:
        """A checkpoint saved at ``step`` (complete on disk, or being written in the background)."""

    def summary_fields(self) -> dict[str, Any]:
        """What this sink adds to the summary before any sink receives it (W&B: its run folder)."""
        return {}

    def log_summary(self, summary: dict[str, Any]) -> None:
        """The run's end: what summary.json holds."""

    def close(self, *, exit_code: int) -> None:
        """Always called last, after a failed run too (``exit_code`` != 0)."""
