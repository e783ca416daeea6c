"""Qwen3 (dense): the Llama decoder of ``models/llama/model.py`` with its two differences switched on.

Each query and key head is RMS-normalised over its channels before the rotation (``attention.q_norm`` /
``attention.k_norm``, one ``head_dim`` weight each, shared by the heads), and the head width is its own
setting (``head_dim``: 128 in every published size, so ``n_heads x head_dim`` need not equal ``d_model``).
Everything else (SwiGLU, grouped-query attention, RMSNorm, tied embeddings for the small sizes, rotary
positions with theta 1e6) is Llama's, imported rather than copied.
"""

from __future__ import annotations

from models.llama.model import Llama
from models.qwen3.config import Qwen3Config


class Qwen3(Llama):
    """``Qwen3(Qwen3Config(...))``: Llama's constructor over Qwen3's config, with the per-head q/k norms."""

    config_class = Qwen3Config
    qk_norm = True
