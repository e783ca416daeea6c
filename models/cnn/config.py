"""Config schema of the CNN (``conf/model/cnn_bn.yaml``). No torch import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from models.spec import ModelArgs, hydra_schema


@dataclass(frozen=True)
class CNNConfig(ModelArgs):
    _target_: str = "models.cnn.model.ConvNet"
    name: str = "cnn"
    family: str = "cnn"
    in_channels: int = 3
    channels: List[int] = field(default_factory=lambda: [16, 32, 64])
    num_classes: int = 10
    batch_norm: bool = True


# The mutable twins Hydra composes (models.spec.hydra_schema), made at import: a composed config holds them by
# name, and a submitit or Slurm job unpickles it in a fresh interpreter that imports only this module.
CNNConfigSchema = hydra_schema(CNNConfig)
