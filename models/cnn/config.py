"""Config schema of the CNN (``conf/model/cnn_bn.yaml``). No torch import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from models.spec import ModelArgs


@dataclass(frozen=True)
class CNNConfig(ModelArgs):
    _target_: str = "models.cnn.model.ConvNet"
    name: str = "cnn"
    family: str = "cnn"
    in_channels: int = 3
    channels: List[int] = field(default_factory=lambda: [16, 32, 64])
    num_classes: int = 10
    batch_norm: bool = True
