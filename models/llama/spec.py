"""The Llama family's ``ModelSpec``: builder, TP plan, pipeline units, formulas, checks. No torch import."""

from __future__ import annotations

from typing import Any

from models.llama.config import LlamaConfig
from models.shape import ModelShape
from models.spec import ModelSpec, PipelineUnits, transformer_problems, transformer_tp_problems


def ffn_width(model: Any) -> int:
    """``d_ff``, or Llama's default: 2/3 of 4 x d_model, rounded up to a multiple of 64."""
    d_ff = int(model.get("d_ff") or 0)
    if d_ff:
        return d_ff
    hidden = int(2 * 4 * int(model["d_model"]) / 3)
    return 64 * ((hidden + 63) // 64)


def kv_heads(model: Any) -> int:
    return int(model.get("n_kv_heads") or 0) or int(model.n_heads)


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


def llama_problems(model: Any) -> list[str]:
    out = transformer_problems(model, kv_heads=True)
    heads, d_model = int(model.n_heads), int(model.d_model)
    if heads and d_model % heads == 0 and (d_model // heads) % 2:
        out.append(
            f"model.d_model={d_model} / model.n_heads={heads} = {d_model // heads}: rotary embeddings rotate pairs "
            "of channels, so the head width must be even; change model.d_model or model.n_heads"
        )
    return out


def llama_tp_problems(model: Any, tp: int) -> list[str]:
    out = transformer_tp_problems(model, tp, widths=[ffn_width(model)], kv_heads=True)
    if model.get("tie_embeddings", False):
        out.append(
            f"model.tie_embeddings=true with tp.size={tp}: the output projection is sharded over the vocabulary "
            "while the token embedding stays whole, so they cannot share one weight; set model.tie_embeddings=false"
        )
    return out


SPEC = ModelSpec(
    family="llama",
    builder="models.llama.model.Llama",
    config=LlamaConfig,
    schemas={"llama_schema": LlamaConfig},
    parallelize="models.llama.parallelize:parallelize_llama",
    pipeline=PipelineUnits(pre=("tok_embeddings",), post=("norm", "output")),
    blocks=lambda model: int(model.n_layers),
    max_seq_len=lambda model: int(model.max_seq_len),
    shape=llama_shape,
    check=llama_problems,
    tp_check=llama_tp_problems,
    description="Llama-3-style decoder: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention",
)
