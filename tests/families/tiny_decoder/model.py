"""The family's module: Llama's blocks (RMSNorm, rotary positions, SwiGLU, grouped-query attention) reused whole."""

from __future__ import annotations

from models.llama.model import Llama


class TinyDecoder(Llama):
    """A family of its own (its own class, config and spec) whose forward is Llama's."""
