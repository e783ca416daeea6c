"""Per-rank logging: every rank writes logs/rank{N}.log; only rank 0 also writes to the console.

Hydra's logging settings reach the workers (``run_meta["logging"]``, from ``trainer.task``):
``hydra.verbose`` (true, a logger name or a list; ``hydra.verbose=meshtrain`` shows meshtrain's debug lines)
sets those loggers to DEBUG on every rank, and a ``hydra/job_logging`` other than meshtrain's default
``none`` (e.g. ``hydra/job_logging=default``: ``<run dir>/meshtrain.log`` and Hydra's console format) is
applied on rank 0 with Hydra's own ``configure_log``, the ``meshtrain`` logger then going through it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

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


def _verbose_names(verbose: Any) -> list[str]:
    if verbose is True:
        return ["", LOGGER_NAME]  # root, and meshtrain (which does not take the root's level)
    if not verbose:
        return []
    return [str(verbose)] if isinstance(verbose, str) else [str(v) for v in verbose]


def _job_logging_active(job_logging: dict | None) -> bool:
    return bool(job_logging) and job_logging.get("root") is not None


def setup_rank_logging(
    run_dir: Path, rank: int, *, hydra_logging: dict[str, Any] | None = None
) -> tuple[logging.Logger, list[logging.Handler]]:
    hydra_logging = hydra_logging or {}
    job_logging = hydra_logging.get("job_logging")
    via_hydra = rank == 0 and _job_logging_active(job_logging)
    if via_hydra:
        from hydra.core.utils import configure_log
        from omegaconf import OmegaConf

        configure_log(OmegaConf.create(job_logging), False)
    log = logging.getLogger(LOGGER_NAME)
    log.setLevel(logging.INFO)
    log.propagate = via_hydra  # rank 0's console then comes from the job_logging handlers
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = []
    fh = logging.FileHandler(run_dir / "logs" / f"rank{rank}.log")
    fh.setFormatter(logging.Formatter(f"%(asctime)s [rank{rank}] %(levelname)s %(message)s"))
    handlers.append(fh)
    if rank == 0 and not via_hydra:
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
    for name in _verbose_names(hydra_logging.get("verbose")):
        logging.getLogger(name).setLevel(logging.DEBUG)
    return log, handlers


def teardown_rank_logging(handlers: list[logging.Handler]) -> None:
    for name in (LOGGER_NAME, TRACE_LOGGER_NAME):
        log = logging.getLogger(name)
        for h in handlers:
            log.removeHandler(h)
    for h in handlers:
        h.close()
    logging.getLogger(LOGGER_NAME).propagate = False
