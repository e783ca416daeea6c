"""A Llama-3-style decoder whose blocks split into pipeline stages by name, like ``models/gpt/model.py``.

RMSNorm before attention and feed-forward, rotary position embeddings on queries and keys, a SwiGLU
feed-forward (``w2(silu(w1 x) * w3 x)``), grouped-query attention (``n_kv_heads`` key/value heads, each
shared by ``n_heads / n_kv_heads`` query heads), optionally tied input and output embeddings.

Same layout as the GPT: blocks in ``layers`` (a ``ModuleDict`` keyed "0", "1", ...), ``forward`` skips
top-level parts set to ``None``, separate ``nn.Linear`` projections (wq, wk, wv, wo, w1, w2, w3) whose
outputs are reshaped with ``-1`` heads so a tensor-parallel shard works unchanged. The rotary table is a
non-persistent buffer of the top-level module (not in checkpoints; every stage keeps it), recomputed by
``init_weights`` (or ``init_buffers``, when the weights come from a checkpoint) after a meta-device build.

Two options serve published checkpoints: Llama 3.1's rotary frequency scaling (``rope_scaling``, the
"llama3" rule) and, for the Qwen3 family built on these classes (``models/qwen3``), a head width set on its
own (``head_dim``) and RMSNorm of each query and key head before the rotation (``qk_norm``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from models.attention import causal_attention, chunk_start
from models.blocks import PreNormBlock, SwiGLU
from models.documents import document_mask, unpack_inputs
from models.init import check_rule, init_llama
from models.llama.config import LlamaConfig
from models.spec import config_or_fields


def llama3_scaled(freqs: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1's frequency scaling: wavelengths longer than ``original_max_seq_len / low_freq_factor`` are
    stretched by ``factor``, shorter than ``original_max_seq_len / high_freq_factor`` kept, and the band
    between blended smoothly (Meta's reference code and transformers' "llama3" rope type)."""
    factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    original = float(scaling["original_max_seq_len"])
    wavelen = 2 * math.pi / freqs
    smooth = ((original / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * freqs / factor + smooth * freqs


def rotary_table(
    head_dim: int,
    max_seq_len: int,
    theta: float,
    device: torch.device | None = None,
    *,
    scaling: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """(max_seq_len, head_dim / 2, 2): cos and sin of position x frequency, frequencies theta^(-2i/d)
    (with ``scaling``: Llama 3.1's, ``llama3_scaled``)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if scaling and float(scaling["factor"]):  # factor 0: no scaling
        freqs = llama3_scaled(freqs, scaling)
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), freqs)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rotary(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate each (even, odd) channel pair of ``x`` (b, t, heads, head_dim) by its position's angle: one complex
    multiply, as Meta's reference code, with the pairs read as complex numbers and the (cos, sin) table as
    ``cos + i sin`` (views, no copies; 4x faster forward + backward on CPU than the real-valued form, same bits).
    The table stays real so casts and buffer broadcasts never meet a complex tensor. Under ``torch.compile`` the
    same rotation is written with real numbers: Inductor generates no code for complex operators (it warns and
    falls back to eager kernels), while the real form fuses into the block's kernels."""
    if torch.compiler.is_compiling():
        return rotate_pairs(x, table)
    # (t, 1, head_dim / 2), or (b, t, 1, head_dim / 2) at packed documents' positions: broadcast over b, heads
    rotation = torch.view_as_complex(table.float()).unsqueeze(-2)
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * rotation).flatten(-2).type_as(x)


def rotate_pairs(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``apply_rotary`` in real arithmetic: (x0 cos - x1 sin, x0 sin + x1 cos) per channel pair (a (t, ...) table,
    or (b, t, ...) at packed documents' positions)."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    angles = table.float().unsqueeze(-3)  # a heads dimension to broadcast over
    cos, sin = angles[..., 0], angles[..., 1]
    x0, x1 = pairs[..., 0], pairs[..., 1]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        *,
        head_dim: int = 0,
        qk_norm: bool = False,
        eps: float = 1e-6,
    ):
        super().__init__()
        self.head_dim = head_dim or d_model // n_heads
        self.wq = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
        # Qwen3: each query and key head normalised over its channels before the rotation
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps) if qk_norm else None
        self.attend = causal_attention  # context parallel swaps in its all-to-all wrapper (models/attention.py)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, -1, self.head_dim)
        k = self.wk(x).view(b, t, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        v = self.wv(x).view(b, t, -1, self.head_dim)
        return self.wo(self.attend(q, k, v, mask=mask).reshape(b, t, -1))


class Block(PreNormBlock):
    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int, norm_eps: float, *, head_dim: int, qk_norm: bool
    ):
        super().__init__()
        self.attention_norm = nn.RMSNorm(d_model, eps=norm_eps)
        self.attention = Attention(d_model, n_heads, n_kv_heads, head_dim=head_dim, qk_norm=qk_norm, eps=norm_eps)
        self.ffn_norm = nn.RMSNorm(d_model, eps=norm_eps)
        self.feed_forward = SwiGLU(d_model, d_ff)


class Llama(nn.Module):
    """Built from its config (``LlamaConfig``: the sizes and their defaults, written once); ``Llama(**keys)`` makes
    the config from keywords, as ``hydra.utils.instantiate`` of a ``model`` node calls it. A subclass sets
    ``config_class`` (Qwen3's) and ``qk_norm``."""

    config_class: type = LlamaConfig
    qk_norm: bool = False
    """RMSNorm of each query and key head before the rotation (Qwen3)."""

    def __init__(self, config: LlamaConfig | None = None, **fields: Any):
        super().__init__()
        from models.llama.spec import ffn_width, kv_heads

        self.config = c = config_or_fields(self.config_class, config, fields)
        n_kv_heads = kv_heads(c)
        head_dim = int(c.get("head_dim", 0)) or (c.d_model // c.n_heads if c.d_model % c.n_heads == 0 else 0)
        if not head_dim or c.n_heads % n_kv_heads or head_dim % 2:
            raise ValueError(
                f"model.d_model={c.d_model}, model.n_heads={c.n_heads}, model.n_kv_heads={n_kv_heads}: heads must "
                "divide d_model (or head_dim be set) into an even head width, and n_kv_heads must divide n_heads"
            )
        d_ff = ffn_width(c)
        self.n_layers = c.n_layers
        self.head_dim = head_dim
        self.max_seq_len = c.max_seq_len
        self.rope_theta = c.rope_theta
        self.rope_scaling = c.rope_scaling if float(c.rope_scaling.factor) else None
        self.tie_embeddings = c.tie_embeddings
        self.d_model = c.d_model
        self.init = check_rule(c.init)
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleDict(
            {
                str(i): Block(
                    c.d_model, c.n_heads, n_kv_heads, d_ff, c.norm_eps, head_dim=head_dim, qk_norm=self.qk_norm
                )
                for i in range(c.n_layers)
            }
        )
        self.norm: nn.RMSNorm | None = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.output: nn.Linear | None = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.register_buffer("rope", self._rotary_table(), persistent=False)
        self.seq_chunk = 0  # which contiguous chunk of the sequence the inputs are (context parallel sets it)
        self._init_parameters()
        if c.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: token ids ``(b, t)``, a packed batch ``(b, 2, t)`` (ids and positions within each document:
        ``models/documents.py``; rotary angles at those positions), or, on a later pipeline stage, the hidden
        states. Under context parallel ``x`` is chunk ``seq_chunk`` of the sequence: positions start there."""
        tokens, positions = unpack_inputs(x) if self.tok_embeddings is not None else (x, None)
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else x
        start = chunk_start(self.seq_chunk, h.shape[1])
        rope = self.rope[start : start + h.shape[1]] if positions is None else self.rope[positions]
        mask = None if positions is None else document_mask(positions)
        for layer in self.layers.values():
            h = layer(h, rope, mask=mask)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    def _rotary_table(self, device: torch.device | None = None) -> torch.Tensor:
        return rotary_table(self.head_dim, self.max_seq_len, self.rope_theta, device, scaling=self.rope_scaling)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise whatever this (possibly sharded, possibly pruned) module holds, after ``to_empty``."""
        self._init_parameters()
        self.init_buffers()

    def _init_parameters(self) -> None:
        init_llama(self, self.init, d_model=self.d_model, tie_embeddings=self.tie_embeddings)

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Recompute what no checkpoint holds (the rotary table), leaving the weights alone: after ``to_empty``
        when the weights are then read from a checkpoint (``model.init_from``)."""
        self.rope = self._rotary_table(device=self.rope.device)
