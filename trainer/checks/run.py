"""The run's own keys: ``trainer.*`` (clipping, objective, checkpoints, resume, stop), DDP's bucket, W&B and
``debug.*``. Enum-typed keys (trainer.on_nonfinite, logger.wandb.mode, logger.wandb.console) are refused by the
schema at compose (conf/schema.py). No torch import."""

from __future__ import annotations

import math
from dataclasses import fields

from omegaconf import DictConfig

from conf.schema import DebugConfig
from trainer.checks.findings import Findings, finite, number

#: summary.json keys written by runs that evaluate (trainer.eval_every > 0): objectives that need an evaluation
VAL_OBJECTIVES = ("val_loss", "best_val_loss", "val_ppl")

#: numeric summary.json keys: what trainer.objective may name (the validation ones need trainer.eval_every > 0)
OBJECTIVES = (
    "tokens_per_s",
    "final_loss",
    "first_loss",
    "median_step_time_s",
    "time_to_first_step_s",
    "wall_time_s",
    "peak_memory_bytes_max",
    *VAL_OBJECTIVES,
)


def check_trainer(cfg: DictConfig, layout: object, f: Findings) -> None:
    t = cfg.trainer
    clip = number(t.grad_clip)
    ok = clip is not None and not math.isnan(clip)
    f.require(
        "trainer.grad_clip",
        t.grad_clip,
        ok,
        "must be a number: the max global gradient norm (<= 0 or inf disables clipping)",
    )
    ok = str(t.objective) in OBJECTIVES
    f.require("trainer.objective", t.objective, ok, f"not a summary.json number; use one of {', '.join(OBJECTIVES)}")
    f.require("trainer.keep_checkpoints", t.keep_checkpoints, int(t.keep_checkpoints) >= 1, "must be >= 1")
    f.require("trainer.stop_grace_s", t.stop_grace_s, float(t.stop_grace_s) >= 0, "must be >= 0 seconds")
    resume = str(t.resume)
    if resume not in ("auto", "never") and not resume.strip():
        f.error("trainer.resume='': use auto, never, or a checkpoint folder")
    bucket = cfg.dp.bucket_cap_mb
    ok = finite(bucket) and number(bucket) > 0
    f.require("dp.bucket_cap_mb", bucket, ok, "must be a number of MiB > 0 (DDP's gradient bucket size, e.g. 25)")
    w = cfg.logger.wandb
    f.require("logger.wandb.init_timeout", w.init_timeout, float(w.init_timeout) > 0, "must be > 0 seconds")
    # the schema also takes auto, which W&B's console capture does not
    f.require(
        "logger.wandb.console", w.console, str(w.console) in ("off", "wrap", "redirect"), "use off, wrap or redirect"
    )


def check_debug(cfg: DictConfig, layout, f: Findings) -> None:
    """``+debug.<key>`` adds keys past the typed group: anything not in DebugConfig is a typo."""
    known = [fl.name for fl in fields(DebugConfig)]
    debug = cfg.get("debug") or {}
    for key in debug:
        if key not in known:
            f.error(f"debug.{key}={debug[key]}: unknown debug key; known: {', '.join(known)}")
            continue
        value = debug[key]
        if value is None or not key.endswith(("_at_step", "_rank")):  # the others are typed by the schema
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key.endswith("_rank") else 1):
            f.error(f"debug.{key}={value}: must be an integer >= {0 if key.endswith('_rank') else 1}")
        elif key.endswith("_rank") and value >= layout.world_size:
            f.error(f"debug.{key}={value}: no such rank; the job has ranks 0..{layout.world_size - 1}")
