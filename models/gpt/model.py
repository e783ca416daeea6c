"""A small decoder-only GPT whose blocks can be split into pipeline stages by name.

Blocks live in ``layers`` (a ``ModuleDict`` keyed "0", "1", ...), so deleting the parts a stage does
not own keeps every remaining parameter's name (``layers.3.attention.wq.weight``): checkpoints, split
points and tensor-parallel plans all speak the same FQNs. ``forward`` skips parts set to ``None``
(embeddings on later stages, norm and head on earlier ones), the pattern torchtitan uses.
Projections are separate ``nn.Linear`` layers (wq, wk, wv, wo, w1, w2) so a TP plan can shard each
one column- or row-wise; attention reshapes with ``-1`` heads so it works on a tensor-parallel shard.

The GPT-2 layout (``model=gpt2``, so GPT-2 checkpoints load): biases on every projection (``bias``), the tanh
approximation of GELU (``activation: gelu_tanh``) and the output head tied to the token embedding
(``tie_embeddings``). ``gpt_small`` keeps the original layout: no biases, exact GELU, its own head.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import causal_attention, chunk_start
from models.blocks import PreNormBlock
from models.documents import document_mask, unpack_inputs
from models.gpt.config import GPTConfig
from models.gpt.spec import ACTIVATIONS, ffn_widths
from models.init import check_rule, init_gpt
from models.spec import config_or_fields


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float, *, bias: bool = False):
        super().__init__()
        self.head_dim = d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=bias)
        self.wk = nn.Linear(d_model, d_model, bias=bias)
        self.wv = nn.Linear(d_model, d_model, bias=bias)
        self.wo = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout
        self.attend = causal_attention  # context parallel swaps in its all-to-all wrapper (models/attention.py)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, -1, self.head_dim)
        k = self.wk(x).view(b, t, -1, self.head_dim)
        v = self.wv(x).view(b, t, -1, self.head_dim)
        y = self.attend(q, k, v, mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.wo(y.reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, *, bias: bool = False, activation: str = "gelu"):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.approximate = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x), approximate=self.approximate))


class Block(PreNormBlock):
    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, dropout: float, *, bias: bool, activation: str, norm_eps: float
    ):
        super().__init__()
        self.attention_norm = nn.LayerNorm(d_model, eps=norm_eps)
        self.attention = Attention(d_model, n_heads, dropout, bias=bias)
        self.ffn_norm = nn.LayerNorm(d_model, eps=norm_eps)
        self.feed_forward = FeedForward(d_model, d_ff, bias=bias, activation=activation)


class GPT(nn.Module):
    """Built from its config (``GPTConfig``: the sizes and their defaults, written once); ``GPT(**keys)`` makes
    the config from keywords, as ``hydra.utils.instantiate`` of a ``model`` node calls it."""

    def __init__(self, config: GPTConfig | None = None, **fields: Any):
        super().__init__()
        self.config = c = config_or_fields(GPTConfig, config, fields)
        if c.d_model % c.n_heads:
            raise ValueError(f"model.d_model={c.d_model} must be divisible by model.n_heads={c.n_heads}")
        if c.activation not in ACTIVATIONS:
            raise ValueError(f"model.activation={c.activation}: use one of {sorted(ACTIVATIONS)}")
        widths = ffn_widths(c)
        if len(widths) != c.n_layers:
            raise ValueError(f"model.layer_d_ff has {len(widths)} entries for model.n_layers={c.n_layers}")
        self.n_layers = c.n_layers
        self.tie_embeddings = c.tie_embeddings
        self.init = check_rule(c.init)
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_embeddings: nn.Embedding | None = nn.Embedding(c.max_seq_len, c.d_model)
        self.layers = nn.ModuleDict(
            {
                str(i): Block(
                    c.d_model,
                    c.n_heads,
                    widths[i],
                    c.dropout,
                    bias=c.bias,
                    activation=c.activation,
                    norm_eps=c.norm_eps,
                )
                for i in range(c.n_layers)
            }
        )
        self.norm: nn.LayerNorm | None = nn.LayerNorm(c.d_model, eps=c.norm_eps)
        self.output: nn.Linear | None = nn.Linear(c.d_model, c.vocab_size, bias=False)
        init_gpt(self, self.init, n_layers=c.n_layers)
        self.seq_chunk = 0  # which contiguous chunk of the sequence the inputs are (context parallel sets it)
        if c.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: token ids ``(b, t)``, a packed batch ``(b, 2, t)`` (ids and positions within each document:
        ``models/documents.py``), or, on a later pipeline stage, the hidden states."""
        h = x
        mask = None
        if self.tok_embeddings is not None:
            x, positions = unpack_inputs(x)
            start = chunk_start(self.seq_chunk, x.shape[1])  # context parallel: this rank's chunk starts there
            pos = torch.arange(start, start + x.shape[1], device=x.device) if positions is None else positions
            h = self.tok_embeddings(x) + self.pos_embeddings(pos)
            mask = None if positions is None else document_mask(positions)
        for layer in self.layers.values():
            h = layer(h, mask=mask)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise whatever this (possibly sharded, possibly pruned) module holds, after ``to_empty``."""
        init_gpt(self, self.init, n_layers=self.n_layers)
