"""The attention kernel the decoder families call, and the two places context parallel reaches into a model.

Every decoder's attention module calls ``self.attend(q, k, v, mask=..., dropout_p=...)`` on (batch, tokens, heads,
head_dim) tensors: ``causal_attention`` by default. Context parallel (``parallel/techniques/cp.py``) swaps
``attend`` for its all-to-all wrapper around the same kernel, so the model code is the same on one rank and
on many. Each family's top-level module also has a ``seq_chunk`` (0 by default): which contiguous chunk of
the sequence its inputs are, so its positions (rotary angles, learned positions) start at ``seq_chunk x
tokens``. Models import nothing from ``parallel/``: these two attributes are the whole contract.
"""

from __future__ import annotations

import torch

from models.documents import attention


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Causal attention of (b, t, heads, head_dim) queries over (b, t, kv_heads, head_dim) keys and values, each
    key/value head shared by ``heads / kv_heads`` query heads (also on a tensor- or context-parallel shard: both
    are split alike); within each document only under ``mask`` (packed documents, ``models/documents.py``).

    SDPA's ``enable_gqa`` reads the shared heads in place (no ``repeat_interleave`` copies; forward and backward
    on CPU in torch 2.13). Returns (b, t, heads, head_dim)."""
    y = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask=mask, dropout=dropout_p)
    return y.transpose(1, 2)


def chunk_start(seq_chunk: int, tokens: int) -> int:
    """The position of a rank's first token when each rank holds ``tokens`` contiguous tokens of the sequence
    and this one holds chunk ``seq_chunk``."""
    return seq_chunk * tokens
