"""``data.*``: the dataset's files exist, its splits and sizes are sound, the objective has an evaluation, and the
model takes the sequence length. No torch import."""

from __future__ import annotations

import os

from omegaconf import DictConfig

from models.registry import UnknownModel, spec_for
from trainer.checks.findings import Findings, number
from trainer.checks.run import VAL_OBJECTIVES


def check_data(cfg: DictConfig, layout: object, f: Findings) -> None:
    path = cfg.data.get("path")
    prepared = cfg.data.get("name") == "tokens"
    if prepared and not path:
        f.error(
            "data=tokens needs data.path=<folder written by `python -m trainer.data.prepare --input FILES "
            "--output FOLDER`>; or use data=text (byte-level, no preparation)"
        )
    elif path and not os.path.exists(os.path.expanduser(str(path))):
        what = "a prepared dataset folder" if prepared else "a UTF-8 text file or a .npy/.bin token file"
        f.error(f"data.path={path}: no such file or folder; point it at {what}")
    if str(cfg.trainer.objective) in VAL_OBJECTIVES and int(cfg.trainer.eval_every) <= 0:
        f.error(
            f"trainer.objective={cfg.trainer.objective} needs an evaluation: set trainer.eval_every to a "
            "positive number of steps"
        )
    if "val_fraction" in cfg.data and not 0 <= float(cfg.data.val_fraction) < 1:
        f.error(f"data.val_fraction={cfg.data.val_fraction}: must be in [0, 1)")
    for key in ("channels", "num_classes", "image_size", "max_bytes"):  # image and corpus sizes
        if key in cfg.data and int(cfg.data[key]) < 1:
            f.error(f"data.{key}={cfg.data[key]}: must be a positive integer (>= 1)")
    if "noise" in cfg.data:
        noise = number(cfg.data.noise)
        f.require("data.noise", cfg.data.noise, noise is not None and noise >= 0, "must be >= 0")
    model = cfg.model
    try:
        spec = spec_for(model)
    except UnknownModel:
        spec = None  # the model check says so
    longest = spec.max_seq_len(model) if spec is not None and spec.max_seq_len is not None else None
    if longest is not None and longest < int(cfg.data.seq_len):
        f.error(
            f"data.seq_len={cfg.data.seq_len} exceeds model.max_seq_len={longest}; "
            f"lower data.seq_len or raise model.max_seq_len"
        )
    if model.get("planner_only", False):
        f.error(
            f"model={model.name} is a description for the planner, too big to build here; plan it with "
            f"python -m parallel.plan model={model.name} topology=..., or train model=gpt_small"
        )
