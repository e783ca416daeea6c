"""The CNN's ``ModelSpec``: no tensor-parallel plan, no transformer formulas; its conv blocks pipeline."""

from __future__ import annotations

from typing import Any

from models.cnn.config import CNNConfig
from models.spec import ModelSpec, PipelineUnits


def cnn_problems(model: Any) -> list[str]:
    channels = [int(c) for c in model.channels]
    if not channels or any(c < 1 for c in channels):
        return [f"model.channels={channels}: give one or more positive channel counts, e.g. [16,32,64]"]
    return []


def cnn_data_problems(model: Any, data: Any) -> list[str]:
    """Each block halves the image (2x2 max-pool): the image must survive every block."""
    channels, size = list(model.channels), data.get("image_size")
    if size is None or not channels or int(size) >= 2 ** len(channels):
        return []
    return [
        f"data.image_size={size} with model.channels={channels}: each of the {len(channels)} blocks halves "
        f"the image (2x2 max-pool); use data.image_size >= {2 ** len(channels)} or fewer channels"
    ]


SPEC = ModelSpec.of(
    CNNConfig,
    parallelize=None,
    takes_config=True,  # ConvNet(config)
    loss="models.losses:class_cross_entropy",
    pipeline=PipelineUnits(pre=(), post=("output",)),
    blocks=lambda model: len(model.channels),
    check=cnn_problems,
    description="small CNN with BatchNorm (the per-rank batch statistics example)",
    inputs="images",
    data_check=cnn_data_problems,
)
