"""``model.lora.*``: sizes LoRA can use (every layout trains it: tests/integration/test_lora_layouts.py). No torch import."""

from __future__ import annotations

from omegaconf import DictConfig

from trainer.checks.findings import Findings, number


def check_lora(cfg: DictConfig, layout: object, f: Findings) -> None:
    lora = cfg.model.get("lora")
    if not lora:
        return
    rank = number(lora.get("rank", 0))
    if rank is None or rank < 0 or rank != int(rank):
        f.error(f"model.lora.rank={lora.get('rank')}: must be a whole number >= 0 (0: no LoRA)")
        return
    if rank == 0:
        return
    alpha, dropout = number(lora.get("alpha")), number(lora.get("dropout"))
    f.require("model.lora.alpha", lora.get("alpha"), alpha is not None and alpha > 0, "must be a number > 0")
    f.require("model.lora.dropout", lora.get("dropout"), dropout is not None and 0 <= dropout < 1, "must be in [0, 1)")
    if not list(lora.get("targets") or []):
        f.error("model.lora.targets=[]: name the linear layers that get adapters (e.g. [wq, wv])")
