"""TensorBoard event files from rank 0 (logger=tensorboard): every numeric metric of a logged step as a scalar."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainer.observe.sink import Sink


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers (bools and the step itself left out): what TensorBoard can plot."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(float(value)):
            out[key] = float(value)
    return out


class TensorBoardSink(Sink):
    """One event-file writer per run folder; a resumed run appends a new event file to the same folder, and
    TensorBoard's reader orders the steps."""

    def __init__(self, *, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package (a dependency)

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def log_step(self, record: dict[str, Any]) -> None:
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, global_step=int(record["step"]))

    def log_summary(self, summary: dict[str, Any]) -> None:
        self.writer.add_text("summary", "\n".join(f"{k}: {v}" for k, v in scalars(summary).items()))
        self.writer.flush()

    def close(self, *, exit_code: int) -> None:
        self.writer.close()
