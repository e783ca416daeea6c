"""The pre-norm residual block the decoder families share: ``x + attention(norm(x)) + feed_forward(norm(x))``.

Each family builds its own norms, attention and feed-forward (their names are the ones ``ModelSpec.tp_plan`` and
the Hugging Face adapters use); this class holds only the residual wiring, so it is written once.
"""

from __future__ import annotations

import torch
from torch import nn


class PreNormBlock(nn.Module):
    """Set ``attention_norm``, ``attention``, ``ffn_norm`` and ``feed_forward`` in ``__init__``. ``context``
    (Llama's rotary table) is passed to the attention after the normed input, and ``mask`` (packed documents'
    attention mask, ``models/documents.py``) as a keyword, which tensor-parallel input plans leave alone."""

    attention_norm: nn.Module
    attention: nn.Module
    ffn_norm: nn.Module
    feed_forward: nn.Module

    def forward(self, x: torch.Tensor, *context: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), *context, mask=mask)
        return x + self.feed_forward(self.ffn_norm(x))
