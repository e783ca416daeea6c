"""``model.lora.*``: sizes LoRA can use (every layout trains it: tests/integration/test_lora_layouts.py). No torch import."""

from __future__ import annotations

from omegaconf import DictConfig

from trainer.checks.findings import Findings, number

#: the linear layers of meshtrain's own decoders (models/llama, models/gpt ...), LoRA's default targets among them
NATIVE_LINEARS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


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
    targets = [str(t) for t in lora.get("targets") or []]
    if not targets:
        f.error("model.lora.targets=[]: name the linear layers that get adapters (e.g. [wq, wv])")
    native = [t for t in targets if t in NATIVE_LINEARS]
    if cfg.model.get("family") == "hf" and native:
        f.error(
            f"model.lora.targets={targets}: {native} are meshtrain's names for its own families' layers; the Hugging "
            "Face backend runs transformers' modules, whose layers have transformers' names: e.g. "
            "model.lora.targets=[q_proj,v_proj] (or fnmatch patterns over the full names, layers.*.self_attn.q_proj)"
        )
