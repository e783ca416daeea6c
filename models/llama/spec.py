"""The Llama family's ``ModelSpec``: builder, TP plan, pipeline units, formulas, checks. No torch import."""

from __future__ import annotations

from typing import Any

from models.llama.config import LlamaConfig
from models.shape import ModelShape
from models.spec import (
    ModelSpec,
    builder_kwargs,
    decoder_tp_plan,
    init_problems,
    size_problems,
    transformer_problems,
    transformer_tp_problems,
)


def ffn_width(model: Any) -> int:
    """``d_ff``, or Llama's default: 2/3 of 4 x d_model, rounded up to a multiple of 64."""
    d_ff = int(model.get("d_ff") or 0)
    if d_ff:
        return d_ff
    hidden = int(2 * 4 * int(model["d_model"]) / 3)
    return 64 * ((hidden + 63) // 64)


def kv_heads(model: Any) -> int:
    return int(model.get("n_kv_heads") or 0) or int(model["n_heads"])


def llama_shape(model: Any) -> ModelShape:
    return ModelShape(
        name=str(model.get("name", "llama")),
        n_layers=int(model.n_layers),
        d_model=int(model.d_model),
        n_heads=int(model.n_heads),
        n_kv_heads=kv_heads(model),
        vocab_size=int(model.vocab_size),
        max_seq_len=int(model.max_seq_len),
        layer_d_ff=(ffn_width(model),) * int(model.n_layers),
        tied_embeddings=bool(model.get("tie_embeddings", False)),
        gated_mlp=True,
        norm_params=1,
        learned_positions=False,
    )


#: sizes every Llama-style config must give (>= 1), and those where 0 picks a default (>= 0)
POSITIVE = ("vocab_size", "n_layers", "d_model", "n_heads")
DEFAULTED = {
    "n_kv_heads": "0 means model.n_heads",
    "d_ff": "0 means Llama's rule: 8/3 x model.d_model rounded up to a multiple of 64",
}


def llama_problems(model: Any) -> list[str]:
    out = size_problems(model, positive=POSITIVE, non_negative=DEFAULTED)
    if out:
        return out  # the rules below divide by these sizes
    out = transformer_problems(model, kv_heads=True) + rope_scaling_problems(model)
    heads, d_model = int(model.n_heads), int(model.d_model)
    if heads and d_model % heads == 0 and (d_model // heads) % 2:
        out.append(
            f"model.d_model={d_model} / model.n_heads={heads} = {d_model // heads}: rotary embeddings rotate pairs "
            "of channels, so the head width must be even; change model.d_model or model.n_heads"
        )
    out += init_problems(model)
    return out


def rope_scaling_problems(model: Any) -> list[str]:
    """Llama 3.1's scaling blends between two wavelengths: both factors positive, low below high, factor >= 1."""
    scaling = model.get("rope_scaling")
    if not scaling or not float(scaling["factor"]):
        return []
    factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    if factor >= 1 and 0 < low < high and int(scaling["original_max_seq_len"]) > 0:
        return []
    return [
        f"model.rope_scaling={dict(scaling)}: needs factor >= 1, 0 < low_freq_factor < high_freq_factor and a positive "
        "original_max_seq_len (Llama 3.1: factor 8, low 1, high 4, original 8192); or model.rope_scaling.factor=0 "
        "(no scaling)"
    ]


def llama_tp_problems(model: Any, tp: int) -> list[str]:
    return transformer_tp_problems(model, tp, widths=[ffn_width(model)], kv_heads=True)


def llama_resized(model: Any, sizes: dict[str, int]) -> dict[str, Any]:
    """Builder kwargs (Llama's, Qwen3's) of ``model`` with ``sizes`` replaced: every block has the same width."""
    return {**{k: v for k, v in builder_kwargs(model).items() if k != "_target_"}, **sizes}


SPEC = ModelSpec.decoder(
    LlamaConfig,
    context_parallel=True,
    tp_plan=decoder_tp_plan(ffn_in=("w1", "w3"), extra_inputs=1),
    shape=llama_shape,
    check=llama_problems,
    tp_check=llama_tp_problems,
    hf_adapter="models.llama.hf_adapter:ADAPTER",
    resized=llama_resized,
    description="Llama-3-style decoder: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention",
)
