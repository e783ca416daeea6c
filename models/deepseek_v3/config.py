"""Config schema of the DeepSeek-V3 family (``conf/model/deepseek_v3_debug.yaml``, ``deepseek_v2_lite``,
``deepseek_v3_671b``). No torch import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from models.spec import ConfigReads, ModelArgs, hydra_schema


@dataclass(frozen=True)
class YarnScaling(ConfigReads):
    """YaRN's rotary scaling (arXiv 2309.00071; transformers' ``rope_type: yarn``, DeepSeek-V3's 128K extension):
    frequencies blended between kept (fast) and divided by ``factor`` (slow) by a ramp over the rotary channels,
    the rotation scaled by ``attention_factor``, the attention's softmax scale by ``mscale_all_dim``'s factor
    squared (``models/deepseek_v3/model.py``). A struct, not an optional one (``model.rope_scaling.factor=40``)."""

    factor: float = 0.0
    """0: no scaling; DeepSeek-V3: 40."""
    original_max_seq_len: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    """DeepSeek-V3: mscale 1, mscale_all_dim 1 (the rotation unscaled, the softmax scale multiplied)."""


@dataclass(frozen=True)
class DeepseekV3Config(ModelArgs):
    _target_: str = "models.deepseek_v3.model.DeepseekV3"
    name: str = "deepseek_v3"
    family: str = "deepseek_v3"
    vocab_size: int = 256
    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    # -- multi-head latent attention (MLA): low-rank queries and keys/values, a decoupled rotary part
    q_lora_rank: int = 0
    """The queries' down-projection width (``wq_a``, normed, then ``wq_b``); 0: one projection ``wq``
    (DeepSeek-V2-Lite)."""
    kv_lora_rank: int = 64
    """The compressed key/value width (``wkv_a``'s first part, normed, then ``wkv_b`` to every head)."""
    qk_nope_head_dim: int = 32
    """A query/key head's channels without rotation."""
    qk_rope_head_dim: int = 16
    """A query/key head's rotary channels; the keys' are one head shared by every query head."""
    v_head_dim: int = 32
    d_ff: int = 384
    """The dense layers' SwiGLU width (``intermediate_size``)."""
    first_k_dense_replace: int = 1
    """The first layers, dense (DeepSeek-V3: 3); the rest are mixtures of experts."""
    # -- the mixture of experts
    n_experts: int = 8
    """Routed experts per sparse layer (``n_routed_experts``)."""
    top_k: int = 2
    """Routed experts each token runs through (``num_experts_per_tok``)."""
    moe_d_ff: int = 64
    """One expert's SwiGLU width (``moe_intermediate_size``)."""
    n_shared_experts: int = 1
    """Experts every token runs through, as one SwiGLU of ``n_shared_experts x moe_d_ff``."""
    score_func: str = "sigmoid"
    """The router's scores: sigmoid (DeepSeek-V3) or softmax (DeepSeek-V2)."""
    n_group: int = 1
    """Expert groups (DeepSeek-V3: 8, one per node); a token picks ``topk_group`` groups by the sum of each group's
    two best scores, then its top-k inside them (node-limited routing). 1: no groups."""
    topk_group: int = 1
    route_scale: float = 1.0
    """The routed experts' weights multiplied by it (``routed_scaling_factor``; DeepSeek-V3: 2.5)."""
    norm_topk_prob: bool = True
    """The top-k weights renormalised to sum to 1 before the scaling."""
    bias_update_rate: float = 0.001
    """Auxiliary-loss-free balancing: each expert's routing bias moves by this after each optimizer step (0: the
    bias stays as loaded)."""
    seq_aux_loss_coef: float = 0.0001
    """The sequence-wise balance loss's weight (alpha; its gradient trains the router, the reported loss is the
    LM's)."""
    capacity_factor: float = 0.0
    expert_impl: str = "auto"
    # -- multi-token prediction (models/mtp.py)
    mtp_depth: int = 0
    """MTP modules after the main model, on its last pipeline stage (config.json's ``num_nextn_predict_layers``;
    DeepSeek-V3: 1). 0: none. From a Hugging Face folder: the modules its safetensors hold (transformers saves
    none)."""
    mtp_loss_weight: float = 0.3
    """The MTP loss's weight (lambda: 0.3 for DeepSeek-V3's first 10T tokens, 0.1 after); the reported loss is the
    main one, ``mtp_loss`` is logged beside it."""
    # -- positions, norms, heads
    max_seq_len: int = 128
    rope_theta: float = 10000.0
    rope_scaling: YarnScaling = field(default_factory=YarnScaling)
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    init: str = "reference"
    """reference: DeepSeek-V3's N(0, 0.006) for every weight (norms ones, routing biases zero); normal: N(0, 0.02)."""
    global_batch_size: Optional[int] = None
    """Planner: the published run's batch (samples of max_seq_len tokens); null = data.global_batch_size."""
    source: str = ""


YarnScalingSchema = hydra_schema(YarnScaling)
DeepseekV3ConfigSchema = hydra_schema(DeepseekV3Config)
