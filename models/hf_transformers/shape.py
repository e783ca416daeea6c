"""The planner's ``ModelShape`` of an architecture the Hugging Face backend runs, from its ``config.json``: sizes under
transformers' names (a dense decoder; a mixture of experts with its shared experts and dense first layers,
DeepSeek-V3's ``first_k_dense_replace``; multi-head latent attention), and per block the parameters the shared
formulas (``models/shape.py``) do not see (Gemma's four norms per block, OLMo 2's full-width q/k norms, gpt-oss's
biases and attention sinks), counted once on the module built on the meta device, so the planner's and the dry run's
model state are the built model's."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

from models.hf_transformers.activations import block_counter
from models.hf_transformers.config import CONFIG_JSON, hf_json, max_seq_len, n_experts, tied
from models.shape import ModelShape


def hf_shape(model: Any) -> ModelShape:
    hf = hf_json(model)
    n, d, heads = int(hf["num_hidden_layers"]), int(hf["hidden_size"]), int(hf["num_attention_heads"])
    experts, top_k = n_experts(model), int(hf.get("num_experts_per_tok") or 0)
    shared = int(hf.get("n_shared_experts") or 0)
    dense_first = int(hf.get("first_k_dense_replace") or 0)
    sparse = tuple(experts > 0 and i >= dense_first for i in range(n))
    d_ff = int(hf.get("intermediate_size") or 4 * d)
    moe_d_ff = int(hf.get("moe_intermediate_size") or d_ff) if experts else 0
    mla = int(hf.get("kv_lora_rank") or 0)
    rope = int(hf.get("qk_rope_head_dim") or 0)
    head_dim = int(hf.get("qk_nope_head_dim") or 0) + rope if mla else int(hf.get("head_dim") or d // heads)
    formulas = ModelShape(
        name=str(model.get("name") or hf.get("model_type")),
        n_layers=n,
        d_model=d,
        n_heads=heads,
        vocab_size=int(hf["vocab_size"]),
        max_seq_len=max_seq_len(model),
        layer_d_ff=tuple((top_k + shared) * moe_d_ff if s else d_ff for s in sparse),
        bias=bool(hf.get("attention_bias") or False),
        tied_embeddings=tied(model),
        n_kv_heads=int(hf.get("num_key_value_heads") or heads),
        gated_mlp=True,
        norm_params=1,
        learned_positions=False,
        head_dim=head_dim,
        n_experts=experts,
        top_k=top_k,
        moe_d_ff=moe_d_ff,
        n_shared_experts=shared,
        sparse=sparse,
        kv_lora_rank=mla,
        q_lora_rank=int(hf.get("q_lora_rank") or 0) if mla else 0,
        qk_rope_head_dim=rope,
        v_head_dim=int(hf.get("v_head_dim") or 0),
    )
    path, remote = Path(str(model.get("config_dir"))).expanduser(), bool(model.get("trust_remote_code"))
    built, kinds = built_blocks(str(path), (path / CONFIG_JSON).stat().st_mtime, remote)
    return replace(
        formulas,
        layer_extra_params=tuple(b - formulas.layer_params(i) for i, b in enumerate(built)),
        layer_kinds=kinds,
        block_saved_bytes=block_counter(str(path), remote, first_alike(built, kinds)),
    )


def first_alike(params: tuple[int, ...], kinds: tuple[str, ...]) -> tuple[int, ...]:
    """Per layer, the first layer of the same parameter count and attention kind (a block of the same build)."""
    first: dict[tuple[int, str], int] = {}
    return tuple(first.setdefault((p, k), i) for i, (p, k) in enumerate(zip(params, kinds)))


@functools.lru_cache(maxsize=8)
def built_blocks(config_dir: str, mtime: float, trust_remote_code: bool) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Parameters and attention kind of each decoder layer of the architecture, read from a meta-device build (no
    memory)."""
    import torch

    from models.hf_transformers.config import HFTransformersConfig
    from models.hf_transformers.model import HFCausalLM

    with torch.device("meta"):
        model = HFCausalLM(HFTransformersConfig(config_dir=config_dir, trust_remote_code=trust_remote_code))
    params = tuple(sum(p.numel() for p in layer.parameters()) for layer in model.layers.values())
    return params, tuple(model.layer_types)
