"""A small CNN with BatchNorm: the model where per-rank batch size changes the statistics.

With DDP each replica normalises over its own slice of the batch; below about 8 samples per rank the
batch statistics get noisy and training degrades. ``dp.sync_batchnorm=true`` converts BatchNorm to
SyncBatchNorm so statistics span the whole global batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.cnn.config import CNNConfig
from models.spec import config_or_fields


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, batch_norm: bool):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=not batch_norm)
        self.norm = nn.BatchNorm2d(c_out) if batch_norm else nn.Identity()
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.norm(self.conv(x))))


class ConvNet(nn.Module):
    """Built from its config (``CNNConfig``: the sizes and their defaults, written once); ``ConvNet(**keys)`` makes
    the config from keywords, as ``hydra.utils.instantiate`` of a ``model`` node calls it."""

    def __init__(self, config: CNNConfig | None = None, **fields: Any):
        super().__init__()
        self.config = c = config_or_fields(CNNConfig, config, fields)
        widths = [c.in_channels, *c.channels]
        self.n_layers = len(c.channels)
        self.layers = nn.ModuleDict(
            {str(i): ConvBlock(widths[i], widths[i + 1], c.batch_norm) for i in range(len(c.channels))}
        )
        self.output = nn.Linear(widths[-1], c.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        if self.output is not None:  # None on all but the last pipeline stage
            x = self.output(x.mean(dim=(2, 3)))
        return x
