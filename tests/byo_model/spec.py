"""The user's ``ModelSpec``: no torch import, so meshtrain's validation stays fast when it reads it.

Named from the model's YAML by ``spec: tests.byo_model.spec:SPEC``; nothing in meshtrain is edited.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.spec import ModelConfig, ModelSpec, PipelineUnits


@dataclass
class MLPLMConfig(ModelConfig):
    """Keys the YAML may set (validation checks them against this schema)."""

    _target_: str = "tests.byo_model.model.MLPLM"
    name: str = "mlp_lm"
    vocab_size: int = 256
    width: int = 64
    n_blocks: int = 4


def problems(model) -> list[str]:
    out = []
    if int(model.width) % 2:
        out.append(f"model.width={model.width}: must be even (the blocks widen to 2 x width and back)")
    return out


SPEC = ModelSpec(
    family="mlp_lm",
    builder="tests.byo_model.model.MLPLM",
    config=MLPLMConfig,
    pipeline=PipelineUnits(pre=("embed",), post=("norm", "head")),
    blocks=lambda model: int(model.n_blocks),
    check=problems,
    description="a residual MLP language model (one token in, next token out)",
)
