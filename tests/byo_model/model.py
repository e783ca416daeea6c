"""The user's ``nn.Module``: blocks in ``layers`` (a ModuleDict), parts skipped when set to None."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class MLPLM(nn.Module):
    def __init__(self, *, vocab_size: int = 256, width: int = 64, n_blocks: int = 4):
        super().__init__()
        self.embed: nn.Embedding | None = nn.Embedding(vocab_size, width)
        self.layers = nn.ModuleDict({str(i): Block(width) for i in range(n_blocks)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(width)
        self.head: nn.Linear | None = nn.Linear(width, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x
        for block in self.layers.values():
            h = block(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.head(h) if self.head is not None else h
