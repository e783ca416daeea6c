"""Config schema of the Qwen3 family (``conf/model/qwen3*.yaml``). No torch import."""

from __future__ import annotations

from dataclasses import dataclass

from models.llama.config import LlamaConfig
from models.spec import hydra_schema


@dataclass(frozen=True)
class Qwen3Config(LlamaConfig):
    """Llama's keys, Qwen3's defaults, and ``head_dim``."""

    _target_: str = "models.qwen3.model.Qwen3"
    name: str = "qwen3"
    family: str = "qwen3"
    head_dim: int = 0
    """Width of one attention head, set on its own (Qwen3: 128 at every size); 0 means d_model / n_heads."""
    rope_theta: float = 1000000.0
    norm_eps: float = 1e-6


# The mutable twins Hydra composes (models.spec.hydra_schema), made at import: a composed config holds them by
# name, and a submitit or Slurm job unpickles it in a fresh interpreter that imports only this module.
Qwen3ConfigSchema = hydra_schema(Qwen3Config)
