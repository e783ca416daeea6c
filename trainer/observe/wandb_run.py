"""What makes one training run one W&B run: its id kept in the run folder, sectioned metric names,
``define_metric``, and the provenance (git commit, command line, Hydra overrides) in the run config.

A run folder holds ``wandb_run.json``: the W&B run id and the last step W&B received. Every process
that logs for this run folder (a resume with ``trainer.resume=auto``, an elastic restart, a job
preempted and started again) opens W&B with that id and ``resume="allow"``, so the run's history
continues instead of a new run with the same name starting; steps up to the last one W&B already has
are not sent again (a restart recomputes the steps after its checkpoint), so each step is in the
history once. Offline, every process writes its own ``wandb/offline-run-*-<id>`` folder with the same
id; ``wandb sync`` appends them to one run. No torch, no wandb import here.
"""

from __future__ import annotations

import secrets
import shlex
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

from parallel.foundation import dims
from trainer.observe.durable import read_json, write_json

ID_FILE = "wandb_run.json"

#: flat metrics.jsonl keys of the train/ section (exact names)
_TRAIN = ("step", "loss", "lr", "grad_norm", "skipped_steps")
#: other sections, by name prefix (first match wins)
_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("perf", ("step_time_s", "tokens_per_s", "mfu", "samples_per_s", "flops")),
    (
        "pipeline",
        (
            "bubble_",
            "pipeline_",
            "imbalance_ratio",
            "activation_bytes_sent",
            "gradient_bytes_sent",
            "peak_activation_bytes",
            "stage",
            "rank",
        ),
    ),
    ("comm", ("comm_", *(m for d in dims.DIMENSIONS for m in d.metrics))),  # each dimension's meter (dims.py)
    ("moe", ("moe_",)),
    ("memory", ("memory", "mem_", "peak_memory")),
    ("eval", ("eval_", "val_")),
)

STEP_KEY = "train/step"
#: W&B summary aggregates (define_metric) for the headline metrics
SUMMARIES = {
    "train/loss": "min,last",
    "perf/tokens_per_s": "max,mean",
    "perf/step_time_s": "min,mean",
    "pipeline/bubble_fraction": "min,mean",
    "eval/val_loss": "min,last",
}


def wandb_key(name: str) -> str:
    """``loss`` -> ``train/loss``, ``tokens_per_s`` -> ``perf/tokens_per_s``, ``bubble_fraction`` ->
    ``pipeline/bubble_fraction``; a name that already has a section keeps it; others go to ``train/``."""
    if "/" in name:
        return name
    if name in _TRAIN:
        return f"train/{name}"
    if "memory" in name:
        return f"memory/{name}"
    for section, prefixes in _SECTIONS:
        if any(name == p or name.startswith(p) for p in prefixes):
            return f"{section}/{name}"
    return f"train/{name}"


def wandb_metrics(record: dict[str, Any]) -> dict[str, float | int]:
    """One metrics.jsonl record as W&B history keys (numbers only; ``step`` becomes ``train/step``)."""
    return {wandb_key(k): v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def define_metrics(run: Any) -> None:
    """Charts plot against the training step; the summary keeps min loss and max tokens/s."""
    run.define_metric(STEP_KEY)
    for section in ("train", "perf", "pipeline", "comm", "memory", "eval"):
        run.define_metric(f"{section}/*", step_metric=STEP_KEY)
    for key, summary in SUMMARIES.items():
        run.define_metric(key, step_metric=STEP_KEY, summary=summary)


# ---- the run id kept in the run folder --------------------------------------------------------


def new_run_id() -> str:
    """8 characters of [a-z0-9], W&B's own id alphabet."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


class RunIdentity:
    """``<run dir>/wandb_run.json``: ``{"id": ..., "last_step": ...}``, written by rank 0 only."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ID_FILE
        # a torn file keeps its whole members: the id survives a cut that only took the last step
        data = read_json(self.path, default={})
        if not isinstance(data, dict):
            data = {}
        self.id: str = str(data.get("id") or new_run_id())
        self.last_step: int = int(data.get("last_step") or 0)
        self.resumed = bool(data.get("id"))
        self.segments: int = int(data.get("segments") or 0)
        self.best_loss: float | None = data.get("best_loss")

    def is_best(self, loss: float | None) -> bool:
        """Record a checkpoint's loss; True when it is the lowest so far (the ``best`` alias)."""
        if loss is None or loss != loss:
            return self.best_loss is None
        if self.best_loss is None or loss <= self.best_loss:
            self.best_loss = float(loss)
            self._write()
            return True
        return False

    def started(self) -> None:
        """A process opened W&B for this run: count it and keep the id even if nothing is logged."""
        self.segments += 1
        self._write()

    def logged(self, step: int) -> None:
        self.last_step = max(self.last_step, int(step))
        self._write()

    def _write(self) -> None:
        # atomic; W&B's init thread and the training loop may both write: each gets its own temporary file
        write_json(
            self.path,
            {"id": self.id, "last_step": self.last_step, "segments": self.segments, "best_loss": self.best_loss},
        )


# ---- provenance ---------------------------------------------------------------------------------


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_info(*dirs: Path) -> dict[str, Any]:
    """Commit, dirty flag and remote of the first of ``dirs`` inside a git work tree (meshtrain's
    checkout first, then the working directory); nulls when none is (an installed package)."""
    for d in dirs:
        if not Path(d).is_dir():
            continue
        commit = _git(["rev-parse", "HEAD"], d)
        if commit:
            status = _git(["status", "--porcelain", "--untracked-files=no"], d)
            return {
                "commit": commit,
                "dirty": bool(status),
                "root": _git(["rev-parse", "--show-toplevel"], d),
                "remote": _git(["config", "--get", "remote.origin.url"], d),
            }
    return {"commit": None, "dirty": None, "root": None, "remote": None}


def provenance(*, overrides: list[str], argv: list[str] | None = None) -> dict[str, Any]:
    """What reproduces this run: git state, the command line, Hydra's overrides. Recorded in the W&B
    config under ``run/`` whatever ``logger.wandb.system_stats`` says."""
    argv = list(sys.argv if argv is None else argv)
    source = Path(__file__).resolve().parents[2]
    return {
        "git": git_info(source, Path.cwd()),
        "command": shlex.join([Path(argv[0]).name if argv else "", *argv[1:]]).strip(),
        "overrides": list(overrides),
        "cwd": str(Path.cwd()),
    }
