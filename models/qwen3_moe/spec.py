"""The Qwen3-MoE family's ``ModelSpec``: Qwen3's checks and formulas with the experts' sizes, and the ``MoESpec``
naming the expert parameters for expert parallel and the planner. No torch import."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from models.llama.spec import ffn_width, llama_resized
from models.qwen3.spec import qwen3_problems, qwen3_shape
from models.qwen3_moe.config import Qwen3MoeConfig
from models.shape import ModelShape
from models.spec import BALANCE_SCOPES, ModelSpec, MoESpec, decoder_tp_plan, transformer_tp_problems

EXPERT_IMPLS = ("auto", "grouped_mm", "loop")  # models/moe.py's, written here without importing torch


def sparse_flags(model: Any) -> tuple[bool, ...]:
    """Per layer, whether it is a mixture of experts (transformers' rule, ``models/qwen3_moe/model.py``)."""
    skip = {int(i) for i in (model.get("mlp_only_layers") or ())}
    step, experts = int(model.get("decoder_sparse_step", 1)), int(model.get("n_experts", 0))
    return tuple(experts > 0 and step > 0 and i not in skip and (i + 1) % step == 0 for i in range(int(model.n_layers)))


def expert_width(model: Any) -> int:
    return int(model.get("moe_d_ff") or 0) or ffn_width(model)


def qwen3_moe_shape(model: Any) -> ModelShape:
    """Qwen3's formulas; a sparse layer's MLP is its experts (all counted in ``params``, top-k in the FLOPs)."""
    base = qwen3_shape(model)
    sparse, width = sparse_flags(model), expert_width(model)
    k, shared = int(model.top_k), int(model.get("n_shared_experts", 0))
    layer_d_ff = tuple((k + shared) * width if s else f for s, f in zip(sparse, base.layer_d_ff))
    return replace(
        base,
        name=str(model.get("name", "qwen3_moe")),
        layer_d_ff=layer_d_ff,
        sparse=sparse,
        n_experts=int(model.n_experts),
        top_k=k,
        moe_d_ff=width,
        n_shared_experts=shared,
    )


def qwen3_moe_problems(model: Any) -> list[str]:
    out = qwen3_problems(model)
    experts, k = int(model.get("n_experts", 0)), int(model.get("top_k", 0))
    if experts < 1:
        out.append(f"model.n_experts={experts}: a mixture of experts needs at least 1 (a dense model: model=qwen3_*)")
    elif not 1 <= k <= experts:
        out.append(
            f"model.top_k={k}: each token picks 1 to model.n_experts={experts} experts; use 1 <= top_k <= {experts}"
        )
    for key in ("moe_d_ff", "n_shared_experts"):
        if int(model.get(key, 0) or 0) < 0:
            out.append(f"model.{key}={model[key]}: must be >= 0")
    if int(model.get("decoder_sparse_step", 1)) < 1:
        out.append(f"model.decoder_sparse_step={model.decoder_sparse_step}: must be >= 1 (1: every layer sparse)")
    bad = [i for i in (model.get("mlp_only_layers") or ()) if not 0 <= int(i) < int(model.n_layers)]
    if bad:
        out.append(f"model.mlp_only_layers={list(model.mlp_only_layers)}: {bad} not in 0..{int(model.n_layers) - 1}")
    if float(model.get("capacity_factor", 0.0)) < 0:
        out.append(f"model.capacity_factor={model.capacity_factor}: 0 (no token dropped) or a positive factor")
    if str(model.get("expert_impl", "auto")) not in EXPERT_IMPLS:
        out.append(f"model.expert_impl={model.expert_impl}: choose one of {', '.join(EXPERT_IMPLS)}")
    if str(model.get("balance_scope", "global")) not in BALANCE_SCOPES:
        out.append(f"model.balance_scope={model.balance_scope}: choose one of {', '.join(BALANCE_SCOPES)}")
    return out


def qwen3_moe_tp_problems(model: Any, tp: int) -> list[str]:
    """Qwen3's attention split by tp; the dense layers' widths split too, the sparse ones run whole on every tp
    rank (``models/tensor_parallel.py``), so the experts' sizes need not divide tp."""
    dense = [] if all(sparse_flags(model)) else [ffn_width(model)]
    return transformer_tp_problems(model, tp, widths=dense, kv_heads=True)


SPEC = ModelSpec.decoder(
    Qwen3MoeConfig,
    context_parallel=True,  # Llama's attention; the load-balancing loss takes its counts over the cp group
    # Qwen3's plan; a sparse layer's feed-forward (marked by its router) runs whole on every tp rank
    tp_plan=decoder_tp_plan(
        ffn_in=("w1", "w3"), extra_inputs=1, head_norms=("q_norm", "k_norm"), ffn_whole_if="router"
    ),
    tp_check=qwen3_moe_tp_problems,
    shape=qwen3_moe_shape,
    check=qwen3_moe_problems,
    hf_adapter="models.qwen3_moe.hf_adapter:ADAPTER",
    resized=llama_resized,
    moe=MoESpec(
        experts=(
            "layers.*.feed_forward.experts.w1",
            "layers.*.feed_forward.experts.w2",
            "layers.*.feed_forward.experts.w3",
        ),
        router=("layers.*.feed_forward.router.weight",),
        n_experts=lambda model: int(model.n_experts),
        top_k=lambda model: int(model.top_k),
    ),
    description="Qwen3-MoE: Qwen3's attention, sparse layers of top-k routed SwiGLU experts (models/moe.py)",
)
