"""A user's own trainer callback, as a test passes one (trainer.callbacks=[{_target_: ...}]): every hook it sees,
one JSON line per call, in a file per rank."""

from __future__ import annotations

import json
from pathlib import Path

from trainer.loop.callbacks import Callback


class Recorder(Callback):
    def __init__(self, path: str):
        self.path = Path(path)

    def _write(self, trainer, **event) -> None:
        with open(self.path.with_suffix(f".rank{trainer.ctx.rank}.jsonl"), "a") as f:
            f.write(json.dumps(event, default=str) + "\n")

    def on_train_start(self, trainer, *, start_step):
        self._write(trainer, hook="on_train_start", start_step=start_step)

    def on_step_end(self, trainer, *, step, metrics):
        self._write(trainer, hook="on_step_end", step=step, loss=metrics.get("loss"))

    def on_validation(self, trainer, *, step, metrics):
        self._write(trainer, hook="on_validation", step=step, val_loss=metrics["val_loss"])

    def on_checkpoint(self, trainer, *, step, path):
        self._write(trainer, hook="on_checkpoint", step=step, path=path)

    def on_train_end(self, trainer, *, summary):
        self._write(trainer, hook="on_train_end", last_step=summary["last_step"], status=summary["status"])
