"""What the decoder families share: the pre-norm residual block, ``x + attention(norm(x)) + feed_forward(norm(x))``,
and the SwiGLU feed-forward (Llama's, Qwen3's, a mixture of experts' shared expert).

Each family builds its own norms, attention and feed-forward (their names are the ones ``ModelSpec.tp_plan`` and
the Hugging Face adapters use); this class holds only the residual wiring, so it is written once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    """``w2(silu(w1(x)) * w3(x))``, the names Llama's checkpoints and ``ModelSpec.tp_plan`` use."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


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
