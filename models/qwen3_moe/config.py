"""Config schema of the Qwen3-MoE family (``conf/model/qwen3_moe*.yaml``, ``qwen3_30b_a3b``, ``qwen3_235b_a22b``).
No torch import."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.qwen3.config import Qwen3Config
from models.spec import hydra_schema


@dataclass(frozen=True)
class Qwen3MoeConfig(Qwen3Config):
    """Qwen3's keys (``d_ff``: the dense layers' width, transformers' ``intermediate_size``) and the experts'."""

    _target_: str = "models.qwen3_moe.model.Qwen3Moe"
    name: str = "qwen3_moe"
    family: str = "qwen3_moe"
    n_experts: int = 8
    """Routed experts per sparse layer (``num_experts``)."""
    top_k: int = 2
    """Experts each token runs through (``num_experts_per_tok``)."""
    moe_d_ff: int = 0
    """One expert's SwiGLU width (``moe_intermediate_size``); 0 means ``d_ff``."""
    n_shared_experts: int = 0
    """Experts every token runs through besides its top-k, as one SwiGLU of ``n_shared_experts x moe_d_ff``
    (Qwen3-MoE has none; DeepSeek-V3 one)."""
    decoder_sparse_step: int = 1
    """Layer i is sparse when (i + 1) % decoder_sparse_step == 0 and i is not in ``mlp_only_layers``."""
    mlp_only_layers: list[int] = field(default_factory=list)
    """Layers that keep a dense feed-forward of width ``d_ff``."""
    norm_topk_prob: bool = True
    """Renormalise the top-k router weights to sum to 1 (Qwen3-MoE: true)."""
    router_aux_loss_coef: float = 0.001
    """Weight of the load-balancing loss (Switch); its gradient trains the router, the reported loss is the LM's. At 0
    the balance loss is still reported (``moe_aux_loss``), over each rank's own tokens whatever ``balance_scope`` says:
    its expert counts are not summed over the ranks (no collective in the forward)."""
    bias_update_rate: float = 0.0
    """DeepSeek-V3's auxiliary-loss-free balancing: the per-step bias update (0: off; DeepSeek-V3: 0.001)."""
    capacity_factor: float = 0.0
    """0: no token dropped; f > 0: each expert keeps ceil(f x tokens x top_k / n_experts) rows, drops (and counts)
    the rest."""
    expert_impl: str = "auto"
    """auto (``torch._grouped_mm`` on CUDA, a per-expert loop elsewhere), grouped_mm, loop."""
    balance_scope: str = "global"
    """The tokens the load-balancing loss's expert fractions cover: ``global``, every data- and context-parallel
    rank's micro-batch together (the layout does not change training); ``micro_batch``, one forward's sequences
    (transformers' and Megatron-core's default; the data-parallel degree changes it). docs/parallelism.md."""


# The mutable twins Hydra composes (models.spec.hydra_schema), made at import: a composed config holds them by
# name, and a submitit or Slurm job unpickles it in a fresh interpreter that imports only this module.
Qwen3MoeConfigSchema = hydra_schema(Qwen3MoeConfig)
