"""``data.*``: the dataset's files exist, its splits and sizes are sound, the objective has an evaluation, and the
model takes the sequence length. No torch import."""

from __future__ import annotations

import os

from omegaconf import DictConfig

from models.objectives import OBJECTIVES as PREFERENCE_OBJECTIVES
from models.registry import UnknownModel, spec_for
from parallel.foundation import dims
from trainer.checks.findings import Findings, number
from trainer.checks.run import VAL_OBJECTIVES
from trainer.data.packing import PACKINGS


def check_data(cfg: DictConfig, layout: object, f: Findings) -> None:
    path = cfg.data.get("path")
    prepared = cfg.data.get("name") == "tokens"
    if prepared and not path:
        f.error(
            "data=tokens needs data.path=<folder written by `python -m trainer.data.prepare --input FILES "
            "--output FOLDER`>; or use data=text (byte-level, no preparation)"
        )
    elif path and not os.path.exists(os.path.expanduser(str(path))):
        what = {
            "tokens": "a prepared dataset folder (write one with "
            f"`python -m trainer.data.prepare --input FILES --output {path}`)",
            "chat": "a .jsonl of conversations or a folder of them",
        }.get(str(cfg.data.get("name")), "a UTF-8 text file or a .npy/.bin token file")
        f.error(f"data.path={path}: no such file or folder; point it at {what}")
    check_chat_and_packing(cfg, layout, f)
    check_preference(cfg, layout, f)
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
    model = f.model(cfg)  # the family's typed config: what its rules read
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


def check_chat_and_packing(cfg: DictConfig, layout: object, f: Findings) -> None:
    """data=chat has its conversations and a tokenizer; packed documents reach every layer that needs their
    positions (a later pipeline stage gets hidden states only)."""
    if cfg.data.get("name") == "chat":
        if not cfg.data.get("path"):
            f.error('data=chat needs data.path=<a .jsonl of conversations ({"messages": [...]} per line)>')
        if not cfg.data.get("tokenizer"):
            f.error(
                "data=chat needs a tokenizer with a chat template: start from a model folder (model.init_from=DIR) "
                "or set data.tokenizer=DIR"
            )
    packing = str(cfg.data.get("packing", "none"))
    if packing not in PACKINGS:
        f.error(f"data.packing={packing}: use one of {', '.join(PACKINGS)}")
    elif packing == "documents" and int(getattr(layout, "pp", 1)) > 1:
        f.error(
            f"data.packing=documents with pp.size={layout.pp}: a later pipeline stage receives hidden states "
            "without the documents' positions, so it cannot keep them apart; train packed documents under "
            "single, ddp, fsdp, tp or hybrid with pp.size=1, or set data.packing=none"
        )
    elif packing == "documents":
        for d, size in sequence_splits(layout):
            f.error(
                f"data.packing=documents with {d.key}={size}: the documents' attention mask spans the whole "
                f"sequence and {d.title} does not split it yet; set data.packing=none, or {d.key}=1"
            )


def sequence_splits(layout: object) -> list[tuple[dims.MeshDim, int]]:
    """The dimensions in use that split each sample's sequence over ranks (``MeshDim.splits_sequence``: cp)."""
    sizes = getattr(layout, "sizes", {})
    return [(d, int(sizes.get(d.name, 1))) for d in dims.DIMENSIONS if d.splits_sequence and sizes.get(d.name, 1) > 1]


def check_preference(cfg: DictConfig, layout: object, f: Findings) -> None:
    """data=preference and trainer.objective=dpo/simpo come together; each micro-batch holds whole pairs (an even
    number of rows). Context parallel splits each row's tokens; the loss sums a row's chunks over the cp ranks
    (``models/preference.py``)."""
    objective, preference = str(cfg.trainer.objective), cfg.data.get("name") == "preference"
    if objective in PREFERENCE_OBJECTIVES and not preference:
        f.error(f"trainer.objective={objective} trains on preference pairs: set data=preference data.path=PAIRS.jsonl")
    if not preference:
        return
    if objective not in PREFERENCE_OBJECTIVES:
        f.error(
            f"data=preference with trainer.objective={objective}: name the loss, "
            f"trainer.objective={' or '.join(PREFERENCE_OBJECTIVES)}"
        )
    if not cfg.data.get("path"):
        f.error("data=preference needs data.path=<a .jsonl of pairs (prompt/chosen/rejected per line)>")
    if not cfg.data.get("tokenizer"):
        f.error("data=preference needs a tokenizer with a chat template: model.init_from=DIR or data.tokenizer=DIR")
    rows = int(cfg.data.global_batch_size) // max(1, int(getattr(layout, "dp", 1)))
    if getattr(layout, "pp", 1) > 1:
        rows //= max(1, int(getattr(layout, "micro_batches", 1)))
    elif cfg.data.get("micro_batch_size"):
        rows = int(cfg.data.micro_batch_size)
    if int(cfg.data.global_batch_size) % 2 or rows % 2:
        f.error(
            f"data.global_batch_size={cfg.data.global_batch_size}: data=preference counts sequences, two per pair, "
            f"and a pair stays in one micro-batch, but a micro-batch here holds {rows} rows; use a multiple of "
            "2 x dp.size x (pp.micro_batches, or the accumulation chunks)"
        )
    limit = cfg.data.get("max_prompt_len")
    if limit is not None and int(limit) < 0:
        f.error(f"data.max_prompt_len={limit}: must be >= 0 tokens, or null (the whole prompt)")
