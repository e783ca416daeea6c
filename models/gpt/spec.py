"""The GPT family's ``ModelSpec``: builder, TP plan, pipeline units, formulas, checks. No torch import."""

from __future__ import annotations

from typing import Any

from models.gpt.config import GPTConfig, GPTDescriptionConfig
from models.shape import ModelShape
from models.spec import (
    ModelSpec,
    PipelineUnits,
    builder_kwargs,
    decoder_tp_plan,
    init_problems,
    size_problems,
    transformer_problems,
    transformer_tp_problems,
)

#: ``model.activation`` -> the GELU variant (``approximate`` of ``F.gelu``): exact, or GPT-2's tanh approximation
ACTIVATIONS = {"gelu": "none", "gelu_tanh": "tanh"}


def ffn_widths(model: Any) -> list[int]:
    """Per-block feed-forward widths: ``layer_d_ff``, else ``d_ff``, else 4 x d_model."""
    n = int(model["n_layers"])
    d_ff = int(model.get("d_ff") or 0) or 4 * int(model["d_model"])
    return [int(w) for w in (model.get("layer_d_ff") or [])] or [d_ff] * n


def gpt_shape(model: Any) -> ModelShape:
    return ModelShape(
        name=str(model.get("name", "gpt")),
        n_layers=int(model.n_layers),
        d_model=int(model.d_model),
        n_heads=int(model.n_heads),
        vocab_size=int(model.vocab_size),
        max_seq_len=int(model.max_seq_len),
        layer_d_ff=tuple(ffn_widths(model)),
        bias=bool(model.get("bias", False)),
        tied_embeddings=bool(model.get("tie_embeddings", False)),
    )


def gpt_problems(model: Any) -> list[str]:
    out = size_problems(
        model,
        positive=("vocab_size", "n_layers", "d_model", "n_heads"),
        non_negative={"d_ff": "0 means 4 * model.d_model"},
    )
    if out:
        return out  # the rules below divide by these sizes
    out = transformer_problems(model)
    dropout = model.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        out.append(f"model.dropout={dropout}: must be in [0, 1)")
    widths = [int(w) for w in (model.get("layer_d_ff") or [])]
    n = int(model.n_layers)
    if widths and len(widths) != n:
        out.append(
            f"model.layer_d_ff={widths}: {len(widths)} width(s) for model.n_layers={n}; give one width per "
            f"block ({n} entries), or [] to use model.d_ff everywhere"
        )
    if any(w < 1 for w in widths):
        out.append(f"model.layer_d_ff={widths}: every feed-forward width must be >= 1")
    activation = model.get("activation", "gelu")
    if activation not in ACTIVATIONS:
        out.append(f"model.activation={activation}: use one of {', '.join(ACTIVATIONS)} (gelu_tanh: GPT-2's)")
    out += init_problems(model)
    return out


def gpt_tp_problems(model: Any, tp: int) -> list[str]:
    return transformer_tp_problems(model, tp, widths=ffn_widths(model))


def gpt_resized(model: Any, sizes: dict[str, int]) -> dict[str, Any]:
    """``models.gpt.model.GPT`` kwargs of ``model`` with ``sizes`` replaced (per-block widths cut to n_layers)."""
    kwargs = {k: v for k, v in builder_kwargs(model).items() if k != "_target_"}
    kwargs.update(sizes)
    if kwargs.get("layer_d_ff"):
        kwargs["layer_d_ff"] = [int(w) for w in kwargs["layer_d_ff"]][: int(kwargs["n_layers"])]
    return kwargs


SPEC = ModelSpec.decoder(
    GPTConfig,
    context_parallel=True,
    schemas={"gpt_schema": GPTConfig, "gpt_description_schema": GPTDescriptionConfig},
    tp_plan=decoder_tp_plan(ffn_in=("w1",)),
    pipeline=PipelineUnits(pre=("tok_embeddings", "pos_embeddings"), post=("norm", "output")),
    shape=gpt_shape,
    check=gpt_problems,
    tp_check=gpt_tp_problems,
    hf_adapter="models.gpt.hf_adapter:ADAPTER",
    resized=gpt_resized,
    description="GPT-2-style decoder: learned positions, LayerNorm, GELU MLP, multi-head attention",
)
