"""The Qwen3 family's ``ModelSpec``: Llama's checks and formulas with its own head width and q/k norms. No torch
import."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from models.llama.spec import (
    DEFAULTED,
    POSITIVE,
    kv_heads,
    llama_resized,
    llama_shape,
    llama_tp_problems,
    rope_scaling_problems,
)
from models.qwen3.config import Qwen3Config
from models.shape import ModelShape
from models.spec import ModelSpec, decoder_tp_plan, init_problems, size_problems


def head_dim(model: Any) -> int:
    """``head_dim``, or d_model / n_heads when it is 0."""
    return int(model.get("head_dim") or 0) or int(model["d_model"]) // int(model["n_heads"])


def qwen3_shape(model: Any) -> ModelShape:
    """Llama's formulas, with the head width set on its own and the per-head q/k norms."""
    return replace(llama_shape(model), name=str(model.get("name", "qwen3")), head_dim=head_dim(model), qk_norm=True)


def qwen3_problems(model: Any) -> list[str]:
    out = size_problems(model, positive=POSITIVE, non_negative={**DEFAULTED, "head_dim": "0 means d_model / n_heads"})
    if out:
        return out  # the rules below divide by these sizes
    out = rope_scaling_problems(model)
    heads, kv = int(model.n_heads), kv_heads(model)
    if heads < 1 or kv < 1 or heads % kv:
        ok = [d for d in range(1, max(heads, 1) + 1) if heads % d == 0]
        out.append(
            f"model.n_kv_heads={kv} does not divide model.n_heads={heads}: each key/value head serves a whole "
            f"group of query heads; use model.n_kv_heads in {ok}"
        )
    if not int(model.get("head_dim") or 0) and (heads < 1 or int(model.d_model) % heads):
        out.append(
            f"model.d_model={model.d_model} is not divisible by model.n_heads={heads} and model.head_dim is 0; "
            "set model.head_dim (Qwen3: 128) or choose heads dividing d_model"
        )
    elif heads >= 1 and head_dim(model) % 2:
        out.append(
            f"model.head_dim={head_dim(model)}: rotary embeddings rotate pairs of channels, so the head width "
            "must be even; change model.head_dim"
        )
    out += init_problems(model)
    return out


SPEC = ModelSpec.decoder(
    Qwen3Config,
    context_parallel=True,
    tp_plan=decoder_tp_plan(ffn_in=("w1", "w3"), extra_inputs=1, head_norms=("q_norm", "k_norm")),
    shape=qwen3_shape,
    check=qwen3_problems,
    tp_check=llama_tp_problems,  # Llama's blocks: the same TP plan and rules
    hf_adapter="models.qwen3.hf_adapter:ADAPTER",
    resized=llama_resized,  # the same kwargs: every block has the same width
    description="Qwen3 dense decoder: Llama's blocks with per-head q/k RMSNorm and its own head width",
)
