"""The family's schema: its ``_target_`` and ``family`` are defined here, once (spec.py derives them). No torch."""

from __future__ import annotations

from dataclasses import dataclass

from models.llama.config import LlamaConfig


@dataclass(frozen=True)
class TinyDecoderConfig(LlamaConfig):
    _target_: str = "tests.families.tiny_decoder.model.TinyDecoder"
    name: str = "tiny_decoder"
    family: str = "tiny_decoder"
    n_layers: int = 2
    d_model: int = 32
