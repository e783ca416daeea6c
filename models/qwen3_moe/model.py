"""Qwen3-MoE: Qwen3 (``models/qwen3/model.py``: Llama's decoder with per-head q/k norms) whose sparse layers' feed-
forward is a mixture of experts (``models/moe.py``). The names stay Llama's: ``layers.N.feed_forward`` is a ``MoE``
(``router.weight``, ``experts.w1`` / ``w2`` / ``w3``) in a sparse layer and Llama's ``FeedForward`` in a dense one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from models.llama.model import Llama
from models.moe import MoE


def sparse_layers(
    *, n_layers: int, n_experts: int, decoder_sparse_step: int, mlp_only_layers: Sequence[int]
) -> list[int]:
    """transformers' rule: layer i is sparse when not in ``mlp_only_layers`` and (i + 1) % step == 0."""
    skip = set(int(i) for i in mlp_only_layers)
    step = int(decoder_sparse_step)
    return [i for i in range(n_layers) if n_experts > 0 and step > 0 and i not in skip and (i + 1) % step == 0]


class Qwen3Moe(Llama):
    def __init__(
        self,
        *,
        n_experts: int = 8,
        top_k: int = 2,
        moe_d_ff: int = 0,
        n_shared_experts: int = 0,
        decoder_sparse_step: int = 1,
        mlp_only_layers: Sequence[int] = (),
        norm_topk_prob: bool = True,
        router_aux_loss_coef: float = 0.0,
        bias_update_rate: float = 0.0,
        capacity_factor: float = 0.0,
        expert_impl: str = "auto",
        **kwargs: Any,
    ):
        from models.llama.spec import ffn_width  # as Llama's constructor: the spec modules import models.spec

        super().__init__(**kwargs, qk_norm=True)
        d_model = int(kwargs.get("d_model", 128))
        width = moe_d_ff or ffn_width({"d_ff": kwargs.get("d_ff", 0), "d_model": d_model})
        for i in sparse_layers(
            n_layers=self.n_layers,
            n_experts=n_experts,
            decoder_sparse_step=decoder_sparse_step,
            mlp_only_layers=mlp_only_layers,
        ):
            self.layers[str(i)].feed_forward = MoE(
                d_model,
                width,
                n_experts=n_experts,
                top_k=top_k,
                norm_topk_prob=norm_topk_prob,
                n_shared_experts=n_shared_experts,
                aux_loss_coef=router_aux_loss_coef,
                bias_update_rate=bias_update_rate,
                capacity_factor=capacity_factor,
                expert_impl=expert_impl,
            )
        self._init_parameters()  # the family's rule (models/init.py) over the experts too
