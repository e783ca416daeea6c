"""Packed documents: several documents share one sequence without seeing each other.

A packed batch's inputs are ``(batch, 2, seq)``: the token ids, and each token's position within its own document
(0 where a document starts; ``trainer/data``'s ``data.packing=documents``). The decoder families split them
(``unpack_inputs``), take their position embeddings (GPT's learned table, Llama's and Qwen's rotary angles) at those
positions, and attend under ``document_mask``: causal inside a document, nothing across. So each document's
logits are the ones it gets alone in a sequence of its own (tests/unit/test_packed_documents.py). Plain
``(batch, seq)`` inputs keep the causal path unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: rows of a packed batch's inputs: token ids, positions within the document
PACKED_ROWS = 2


def unpack_inputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(token ids ``(b, t)``, positions ``(b, t)`` or None): a ``(b, 2, t)`` packed batch split, plain ids kept."""
    if x.dim() == 3 and x.shape[1] == PACKED_ROWS:
        return x[:, 0], x[:, 1]
    return x, None


def document_mask(positions: torch.Tensor) -> torch.Tensor:
    """``(b, 1, t, t)`` boolean attention mask (True: may attend): query i sees key j when j <= i and both lie in
    the same document, a document starting wherever the position is 0."""
    doc = torch.cumsum(positions == 0, dim=1)
    same = doc[:, :, None] == doc[:, None, :]
    t = positions.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=positions.device).tril()
    return (same & causal)[:, None]


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None = None, dropout: float = 0.0
) -> torch.Tensor:
    """SDPA over (b, heads, t, head_dim): causal, or under ``mask`` (``document_mask``) when documents are packed;
    key/value heads shared by groups of query heads (``enable_gqa``) when there are fewer of them."""
    gqa = q.shape[1] != k.shape[1]
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, enable_gqa=gqa)
