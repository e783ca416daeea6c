"""The family's ``ModelSpec``: its family name and builder come from its config; checks, formulas and the TP plan
are Llama's functions (the blocks are Llama's). No torch import."""

from __future__ import annotations

from models.llama.spec import SPEC as LLAMA
from models.llama.spec import llama_problems, llama_shape, llama_tp_problems
from models.spec import ModelSpec
from tests.families.tiny_decoder.config import TinyDecoderConfig

SPEC = ModelSpec.decoder(
    TinyDecoderConfig,
    tp_plan=LLAMA.tp_plan,  # the decoders' one parallelize function over Llama's module names
    shape=llama_shape,
    check=llama_problems,
    tp_check=llama_tp_problems,
    description="a test-only dense decoder: Llama's blocks under a family of its own",
)
