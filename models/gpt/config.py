"""Config schema of the GPT family (``conf/model/gpt_*.yaml``). No torch import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from models.spec import ModelArgs, hydra_schema


@dataclass(frozen=True)
class GPTConfig(ModelArgs):
    _target_: str = "models.gpt.model.GPT"
    name: str = "gpt"
    family: str = "gpt"
    vocab_size: int = 256
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    d_ff: int = 0
    """Feed-forward width; 0 means 4 * d_model."""
    layer_d_ff: List[int] = field(default_factory=list)
    """Per-block feed-forward widths (uneven models); empty means d_ff everywhere."""
    max_seq_len: int = 128
    dropout: float = 0.0
    bias: bool = False
    """Biases on every projection (GPT-2's layout); gpt_small has none."""
    activation: str = "gelu"
    """gelu (exact) or gelu_tanh (GPT-2's tanh approximation, transformers' ``gelu_new``)."""
    tie_embeddings: bool = False
    """The output head shares the token embedding's weight (GPT-2 does)."""
    init: str = "reference"
    """Weight initialisation (``models/init.py``): reference (the family's published rule: torchtitan's Llama 3 for
    llama/qwen3, GPT-2's for gpt) or normal (N(0, 0.02) everywhere, meshtrain's rule before 2026-12-05)."""
    norm_eps: float = 1e-5


@dataclass(frozen=True)
class GPTDescriptionConfig(GPTConfig):
    """A GPT far too big to build here, described for the planner only (``python -m parallel.plan``)."""

    _target_: str = "models.shape.refuse_to_build"
    planner_only: bool = True
    global_batch_size: int = 512
    """The batch the published run used (samples of max_seq_len tokens)."""
    source: str = ""
    """Where the shape comes from."""


# The mutable twins Hydra composes (models.spec.hydra_schema), made at import: a composed config holds them by
# name, and a submitit or Slurm job unpickles it in a fresh interpreter that imports only this module.
GPTConfigSchema = hydra_schema(GPTConfig)
GPTDescriptionConfigSchema = hydra_schema(GPTDescriptionConfig)
