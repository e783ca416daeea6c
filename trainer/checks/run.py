"""The run's own keys: ``trainer.*`` (clipping, objective, checkpoints, resume, stop, callbacks), DDP's bucket and
W&B. Enum-typed keys (trainer.on_nonfinite, trainer.precision, logger.wandb.mode ...) are refused by the schema at
compose (conf/schema.py). No torch import (a callback's own module may import it)."""

from __future__ import annotations

import math

from omegaconf import DictConfig

from models.objectives import OBJECTIVES as PREFERENCE_OBJECTIVES
from models.objectives import REFERENCES
from trainer.checks.findings import Findings, finite, number
from trainer.loop.callbacks import callback_problems

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
    ok = str(t.objective) in (*OBJECTIVES, *PREFERENCE_OBJECTIVES)
    f.require(
        "trainer.objective",
        t.objective,
        ok,
        f"not a summary.json number; use one of {', '.join(OBJECTIVES)} (or a training objective on "
        f"data=preference: {', '.join(PREFERENCE_OBJECTIVES)})",
    )
    p = t.preference
    f.require("trainer.preference.beta", p.beta, finite(p.beta) and number(p.beta) > 0, "must be a number > 0")
    ok = finite(p.label_smoothing) and 0 <= number(p.label_smoothing) < 0.5
    f.require("trainer.preference.label_smoothing", p.label_smoothing, ok, "must be in [0, 0.5)")
    ok = str(p.reference) in REFERENCES
    f.require("trainer.preference.reference", p.reference, ok, f"use one of {', '.join(REFERENCES)}")
    f.require("trainer.keep_checkpoints", t.keep_checkpoints, int(t.keep_checkpoints) >= 1, "must be >= 1")
    f.require("trainer.stop_grace_s", t.stop_grace_s, float(t.stop_grace_s) >= 0, "must be >= 0 seconds")
    resume = str(t.resume)
    if resume not in ("auto", "never") and not resume.strip():
        f.error("trainer.resume='': use auto, never, or a checkpoint folder")
    bucket = cfg.dp.bucket_cap_mb
    ok = bucket is None or (finite(bucket) and number(bucket) > 0)
    f.require(
        "dp.bucket_cap_mb",
        bucket,
        ok,
        "must be null (torch's default) or a number of MiB > 0 (DDP's bucket size, e.g. 25)",
    )
    w = cfg.logger.wandb
    f.require("logger.wandb.init_timeout", w.init_timeout, float(w.init_timeout) > 0, "must be > 0 seconds")
    f.require("logger.wandb.answer_timeout_s", w.answer_timeout_s, float(w.answer_timeout_s) > 0, "must be > 0 seconds")
    # the schema also takes auto, which W&B's console capture does not
    f.require(
        "logger.wandb.console", w.console, str(w.console) in ("off", "wrap", "redirect"), "use off, wrap or redirect"
    )


def check_callbacks(cfg: DictConfig, layout, f: Findings) -> None:
    """Each ``trainer.callbacks`` entry imports and takes its arguments (trainer/loop/callbacks.py)."""
    for problem in callback_problems(cfg.trainer.get("callbacks"), world_size=layout.world_size):
        f.error(problem)
