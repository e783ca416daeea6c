"""The CNN's ``ModelSpec``: no tensor-parallel plan, no transformer formulas; its conv blocks pipeline."""

from __future__ import annotations

from models.cnn.config import CNNConfig
from models.spec import ModelSpec, PipelineUnits

SPEC = ModelSpec(
    family="cnn",
    builder="models.cnn.model.ConvNet",
    config=CNNConfig,
    schemas={"cnn_schema": CNNConfig},
    parallelize=None,
    loss="models.losses:class_cross_entropy",
    pipeline=PipelineUnits(pre=(), post=("output",)),
    blocks=lambda model: len(model.channels),
    description="small CNN with BatchNorm (the per-rank batch statistics example)",
)
