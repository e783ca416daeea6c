"""Qwen3-MoE: Qwen3 (``models/qwen3/model.py``: Llama's decoder with per-head q/k norms) whose sparse layers' feed-
forward is a mixture of experts (``models/moe.py``). The names stay Llama's: ``layers.N.feed_forward`` is a ``MoE``
(``router.weight``, ``experts.w1`` / ``w2`` / ``w3``) in a sparse layer and the SwiGLU feed-forward (``models/blocks.py``) in a dense one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from models.llama.model import Llama
from models.moe import MoE
from models.qwen3_moe.config import Qwen3MoeConfig


def sparse_layers(
    *, n_layers: int, n_experts: int, decoder_sparse_step: int, mlp_only_layers: Sequence[int]
) -> list[int]:
    """transformers' rule: layer i is sparse when not in ``mlp_only_layers`` and (i + 1) % step == 0."""
    skip = set(int(i) for i in mlp_only_layers)
    step = int(decoder_sparse_step)
    return [i for i in range(n_layers) if n_experts > 0 and step > 0 and i not in skip and (i + 1) % step == 0]


class Qwen3Moe(Llama):
    """``Qwen3Moe(Qwen3MoeConfig(...))``: Qwen3 whose sparse layers' feed-forward is a ``MoE``."""

    config_class = Qwen3MoeConfig
    qk_norm = True

    def __init__(self, config: Qwen3MoeConfig | None = None, **fields: Any):
        from models.llama.spec import ffn_width  # as Llama's constructor: the spec modules import models.spec

        super().__init__(config, **fields)
        c = self.config
        width = c.moe_d_ff or ffn_width(c)
        for i in sparse_layers(
            n_layers=c.n_layers,
            n_experts=c.n_experts,
            decoder_sparse_step=c.decoder_sparse_step,
            mlp_only_layers=c.mlp_only_layers,
        ):
            self.layers[str(i)].feed_forward = MoE(
                c.d_model,
                width,
                n_experts=c.n_experts,
                top_k=c.top_k,
                norm_topk_prob=c.norm_topk_prob,
                n_shared_experts=c.n_shared_experts,
                aux_loss_coef=c.router_aux_loss_coef,
                bias_update_rate=c.bias_update_rate,
                capacity_factor=c.capacity_factor,
                expert_impl=c.expert_impl,
                balance_scope=c.balance_scope,
            )
        self._init_parameters()  # the family's rule (models/init.py) over the experts too
