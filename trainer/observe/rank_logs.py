"""Per-rank logging: every rank writes logs/rank{N}.log; only rank 0 also writes to the console."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

LOGGER_NAME = "meshtrain"
TRACE_LOGGER_NAME = "meshtrain.trace"


class _CurrentStdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is at emit time, so rich's live progress can redirect it."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


def setup_rank_logging(run_dir: Path, rank: int) -> tuple[logging.Logger, list[logging.Handler]]:
    log = logging.getLogger(LOGGER_NAME)
    log.setLevel(logging.INFO)
    log.propagate = False
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = []
    fh = logging.FileHandler(run_dir / "logs" / f"rank{rank}.log")
    fh.setFormatter(logging.Formatter(f"%(asctime)s [rank{rank}] %(levelname)s %(message)s"))
    handlers.append(fh)
    if rank == 0:
        ch = _CurrentStdoutHandler()
        ch.setFormatter(logging.Formatter("%(message)s"))
        handlers.append(ch)
    for h in handlers:
        log.addHandler(h)
    # tracebacks go to the rank's file only; the console gets one line per failure
    trace = logging.getLogger(TRACE_LOGGER_NAME)
    trace.setLevel(logging.INFO)
    trace.propagate = False
    trace.addHandler(fh)
    return log, handlers


def teardown_rank_logging(handlers: list[logging.Handler]) -> None:
    for name in (LOGGER_NAME, TRACE_LOGGER_NAME):
        log = logging.getLogger(name)
        for h in handlers:
            log.removeHandler(h)
    for h in handlers:
        h.close()
