"""Config schema of the Llama family (``conf/model/llama*.yaml``). No torch import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from models.spec import ConfigReads, ModelArgs, hydra_schema


@dataclass(frozen=True)
class RopeScaling(ConfigReads):
    """Llama 3.1's rotary frequency scaling (transformers' ``rope_type: llama3``): low frequencies are divided by
    ``factor``, high ones kept, the band between blended (``models/llama/model.py: llama3_scaled``). A struct, not
    an optional one, so that ``model.rope_scaling.factor=8`` works on the command line (the config library, 2.3, cannot
    merge a dict into a null structured node)."""

    factor: float = 0.0
    """0: no scaling (Llama 3); Llama 3.1: 8, Llama 3.2: 32."""
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_seq_len: int = 8192
    """The context length the model was pre-trained with before the scaling (``original_max_position_embeddings``)."""


@dataclass(frozen=True)
class LlamaConfig(ModelArgs):
    _target_: str = "models.llama.model.Llama"
    name: str = "llama"
    family: str = "llama"
    vocab_size: int = 256
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int = 0
    """Key/value heads (grouped-query attention); must divide n_heads. 0 means n_heads."""
    d_ff: int = 0
    """SwiGLU hidden width; 0 means the Llama rule: 8/3 x d_model rounded up to a multiple of 64."""
    max_seq_len: int = 128
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    """Llama 3.1 / 3.2's frequency scaling; ``factor: 0``: none (Llama 3)."""
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    """Output projection shares the token embedding's weight (Llama 3.2 1B/3B do; 8B/70B/405B do not)."""
    init: str = "reference"
    """Weight initialisation (``models/init.py``): reference (the family's published rule: torchtitan's Llama 3 for
    llama/qwen3, GPT-2's for gpt) or normal (N(0, 0.02) everywhere, meshtrain's rule before 2026-12-05)."""
    global_batch_size: Optional[int] = None
    """Planner: the published run's batch (samples of max_seq_len tokens); null = data.global_batch_size."""
    source: str = ""
    """Where the published dimensions come from."""


# The mutable twins Hydra composes (models.spec.hydra_schema), made at import: a composed config holds them by
# name, and a submitit or Slurm job unpickles it in a fresh interpreter that imports only this module.
RopeScalingSchema = hydra_schema(RopeScaling)
LlamaConfigSchema = hydra_schema(LlamaConfig)
