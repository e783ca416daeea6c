"""DeepSeek-V3 (arXiv 2412.19437): a decoder whose attention is multi-head latent attention (MLA) and whose layers,
after the first ``first_k_dense_replace`` dense ones, are mixtures of experts with shared experts and sigmoid,
group-limited routing (``models/moe.py``), with multi-token prediction (MTP) as an option.

The names follow torchtitan's DeepSeek-V3 and meshtrain's Llama: ``layers.N`` blocks of ``attention_norm``,
``attention`` (``wq_a``, ``q_norm``, ``wq_b`` or one ``wq``; ``wkv_a``, ``kv_norm``, ``wkv_b``; ``wo``), ``ffn_norm``
and ``feed_forward`` (Llama's SwiGLU ``w1``/``w2``/``w3`` in a dense layer, a ``MoE`` in a sparse one), then ``norm``
and ``output``; the parts a pipeline stage lacks are ``None``.

**MLA**: queries ``wq_b(q_norm(wq_a(x)))`` (or ``wq(x)``), per head ``qk_nope_head_dim`` channels without rotation and
``qk_rope_head_dim`` rotated; ``wkv_a(x)`` gives the compressed key/value (``kv_lora_rank`` channels, normed, then
``wkv_b`` to every head's key channels without rotation and its value) and one rotary key head every query head
shares. Attention is the family's causal kernel (``self.attend``: context parallel splits it by heads) over keys of
``qk_nope + qk_rope`` channels and values of ``v_head_dim``, padded with zeros to the keys' width and cut back after
(torch's fused SDPA kernels take one head width; with two, torch 2.13 falls back to the math kernel, which keeps the
s x s attention weights for backward: 50 GB per micro-batch of a 671B stage in the planner's dry run).

**Rotary positions**: DeepSeek rotates interleaved channel pairs, as meshtrain's Llama does (``apply_rotary``); only
the two rotary parts are rotated. With ``rope_scaling.factor`` > 0 (YaRN, ``yarn_frequencies``), the frequencies are
blended by a ramp and the rotation scaled by YaRN's attention factor, and the softmax scale ``1 / sqrt(qk head
dim)`` is multiplied by ``mscale_all_dim``'s factor squared (applied to the queries: the same logits).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import causal_attention, chunk_start
from models.blocks import PreNormBlock, SwiGLU
from models.deepseek_v3.config import DeepseekV3Config
from models.documents import document_mask, unpack_inputs
from models.init import check_rule, init_deepseek
from models.llama.model import apply_rotary
from models.moe import MoE, Routing
from models.mtp import MTP
from models.spec import config_or_fields


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude factor ``0.1 mscale ln(factor) + 1`` (1 for factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_frequencies(dim: int, theta: float, scaling: Mapping[str, Any]) -> torch.Tensor:
    """YaRN's rotary frequencies over ``dim`` channels (transformers' ``_compute_yarn_parameters``): kept above the
    ``beta_fast`` correction dimension, divided by ``factor`` below ``beta_slow``'s, a linear ramp between."""
    factor, original = float(scaling["factor"]), float(scaling["original_max_seq_len"])

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(float(scaling["beta_fast"]))), 0)
    high = min(math.ceil(correction_dim(float(scaling["beta_slow"]))), dim - 1)
    high = high + 0.001 if low == high else high
    base = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    keep = 1 - ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return (1.0 / (factor * base)) * (1 - keep) + (1.0 / base) * keep


def mla_rotary_table(dim: int, max_seq_len: int, theta: float, scaling: Mapping[str, Any], device=None) -> torch.Tensor:
    """(max_seq_len, dim / 2, 2): cos and sin of position x frequency, times YaRN's attention factor when scaled."""
    yarn = float(scaling["factor"]) > 0
    if yarn:
        freqs = yarn_frequencies(dim, theta, scaling).to(device)
    else:
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), freqs)
    table = torch.stack((angles.cos(), angles.sin()), dim=-1)
    return table * yarn_attention_factor(scaling) if yarn else table


def yarn_attention_factor(scaling: Mapping[str, Any]) -> float:
    """The rotation's scale: ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are set."""
    factor, mscale, all_dim = (float(scaling[k]) for k in ("factor", "mscale", "mscale_all_dim"))
    return yarn_mscale(factor, mscale) / yarn_mscale(factor, all_dim) if mscale and all_dim else yarn_mscale(factor)


def softmax_scale_factor(scaling: Mapping[str, Any]) -> float:
    """What YaRN multiplies the softmax scale by: ``mscale(factor, mscale_all_dim)`` squared (1 unscaled)."""
    factor, all_dim = float(scaling["factor"]), float(scaling["mscale_all_dim"])
    return yarn_mscale(factor, all_dim) ** 2 if factor > 0 and all_dim else 1.0


#: the latent norms' epsilon, fixed (DeepSeek's reference code and transformers: not ``rms_norm_eps``)
LATENT_NORM_EPS = 1e-6


class MLA(nn.Module):
    """Multi-head latent attention over (b, t, d) inputs and the rotary table of this chunk's positions."""

    def __init__(self, c: DeepseekV3Config):
        super().__init__()
        self.nope, self.rope_dim, self.v_dim = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        self.kv_rank = c.kv_lora_rank
        qk = self.nope + self.rope_dim
        if c.q_lora_rank:
            self.wq, self.wq_a = None, nn.Linear(c.d_model, c.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(c.q_lora_rank, eps=LATENT_NORM_EPS)
            self.wq_b = nn.Linear(c.q_lora_rank, c.n_heads * qk, bias=False)
        else:
            self.wq, self.wq_a, self.q_norm, self.wq_b = (
                nn.Linear(c.d_model, c.n_heads * qk, bias=False),
                None,
                None,
                None,
            )
        self.wkv_a = nn.Linear(c.d_model, c.kv_lora_rank + self.rope_dim, bias=False)
        self.kv_norm = nn.RMSNorm(c.kv_lora_rank, eps=LATENT_NORM_EPS)
        self.wkv_b = nn.Linear(c.kv_lora_rank, c.n_heads * (self.nope + self.v_dim), bias=False)
        self.wo = nn.Linear(c.n_heads * self.v_dim, c.d_model, bias=False)
        self.rope_key = nn.Identity()  # the rotary key every head shares: tensor parallel sums its gradient here
        self.q_scale = softmax_scale_factor(c.rope_scaling)
        self.attend = causal_attention  # context parallel swaps in its all-to-all wrapper (models/attention.py)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, *, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x) if self.wq is not None else self.wq_b(self.q_norm(self.wq_a(x)))
        q_nope, q_pe = q.view(b, t, -1, self.nope + self.rope_dim).split([self.nope, self.rope_dim], dim=-1)
        kv, k_pe = self.wkv_a(x).split([self.kv_rank, self.rope_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(kv)).view(b, t, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k_pe = apply_rotary(self.rope_key(k_pe).unsqueeze(2), rope).expand(-1, -1, k_nope.shape[2], -1)
        q = torch.cat([q_nope, apply_rotary(q_pe, rope)], dim=-1)
        if self.q_scale != 1.0:
            q = q * self.q_scale
        k = torch.cat([k_nope, k_pe], dim=-1)
        pad = q.shape[-1] - self.v_dim  # values padded to the query/key width: SDPA's fused kernels need one width
        out = self.attend(q, k, F.pad(v, (0, pad)) if pad > 0 else v, mask=mask)
        return self.wo((out[..., : self.v_dim] if pad > 0 else out).reshape(b, t, -1))


def sparse_layer(c: DeepseekV3Config, layer: int) -> bool:
    return layer >= c.first_k_dense_replace


class Block(PreNormBlock):
    def __init__(self, c: DeepseekV3Config, layer: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.attention = MLA(c)
        self.ffn_norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.feed_forward = moe_block(c) if sparse_layer(c, layer) else SwiGLU(c.d_model, c.d_ff)


def moe_block(c: DeepseekV3Config) -> MoE:
    """A sparse layer's feed-forward: routed experts behind DeepSeek-V3's router, the shared experts beside them,
    the sequence-wise balance loss and the routing bias (always held: checkpoints carry it)."""
    return MoE(
        c.d_model,
        c.moe_d_ff,
        n_experts=c.n_experts,
        top_k=c.top_k,
        norm_topk_prob=c.norm_topk_prob,
        n_shared_experts=c.n_shared_experts,
        aux_loss_coef=c.seq_aux_loss_coef,
        bias_update_rate=c.bias_update_rate,
        capacity_factor=c.capacity_factor,
        expert_impl=c.expert_impl,
        aux_loss="sequence",
        routing=Routing(score_func=c.score_func, n_group=c.n_group, topk_group=c.topk_group, route_scale=c.route_scale),
        score_bias=True,
    )


def mtp_modules(c: DeepseekV3Config) -> MTP:
    """``mtp_depth`` MTP modules, each around a block of a sparse layer's kind, keyed by their Hugging Face layer
    index (after the main model's layers)."""
    blocks = {i: Block(c, i) for i in range(c.n_layers, c.n_layers + c.mtp_depth)}
    return MTP(vocab_size=c.vocab_size, d_model=c.d_model, eps=c.norm_eps, blocks=blocks, loss_weight=c.mtp_loss_weight)


class DeepseekV3(nn.Module):
    """``DeepseekV3(DeepseekV3Config(...))``, or ``DeepseekV3(**keys)`` as ``hydra.utils.instantiate`` calls it."""

    config_class: type = DeepseekV3Config

    def __init__(self, config: DeepseekV3Config | None = None, **fields: Any):
        super().__init__()
        self.config = c = config_or_fields(self.config_class, config, fields)
        if c.qk_rope_head_dim % 2:
            raise ValueError(f"model.qk_rope_head_dim={c.qk_rope_head_dim}: rotary channels come in pairs (even)")
        self.n_layers, self.d_model, self.max_seq_len = c.n_layers, c.d_model, c.max_seq_len
        self.init = check_rule(c.init)
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleDict({str(i): Block(c, i) for i in range(c.n_layers)})
        self.norm: nn.RMSNorm | None = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.output: nn.Linear | None = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.mtp: MTP | None = mtp_modules(c) if c.mtp_depth else None
        self.register_buffer("rope", self._rotary_table(), persistent=False)
        self.seq_chunk = 0  # which contiguous chunk of the sequence the inputs are (context parallel sets it)
        self._init_parameters()
        if c.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        if self.mtp is not None:
            self.mtp.embed.weight = self.tok_embeddings.weight  # the main model's embedding, under a second name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids ``(b, t)``, a packed batch ``(b, 2, t)`` or, on a later pipeline stage, hidden states."""
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
            hidden, h = h, self.output(h)
            if self.mtp is not None:  # the loss runs the MTP modules (models/mtp.py)
                self.mtp.prepare(hidden, self.output, rope, mask=mask)
        return h

    def _rotary_table(self, device: torch.device | None = None) -> torch.Tensor:
        c = self.config
        return mla_rotary_table(c.qk_rope_head_dim, c.max_seq_len, c.rope_theta, c.rope_scaling, device)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise whatever this (possibly sharded, possibly pruned) module holds, after ``to_empty``."""
        self._init_parameters()
        self.init_buffers()

    def _init_parameters(self) -> None:
        init_deepseek(self, self.init)

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Recompute the rotary table (in no checkpoint), leaving the weights alone."""
        self.rope = self._rotary_table(device=self.rope.device)
