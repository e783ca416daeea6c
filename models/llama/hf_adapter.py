"""The Llama family <-> transformers' ``LlamaForCausalLM`` (Llama 3, 3.1 and 3.2 checkpoints).

Renames (``attention.wq`` -> ``self_attn.q_proj``, ``feed_forward.w1/w3/w2`` -> ``mlp.gate_proj/up_proj/down_proj``,
``attention_norm`` -> ``input_layernorm``, ``ffn_norm`` -> ``post_attention_layernorm``), the rotary permutation of
``wq`` / ``wk`` rows (``models/hf_adapter.py``), a tied head read from the embedding, and the config: sizes,
``rope_theta``, Llama 3.1's ``rope_scaling`` (``rope_type: llama3``), ``tie_word_embeddings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from models.hf_adapter import HFAdapter, first, over_base, unsupported
from models.llama.config import RopeScaling
from models.llama.spec import ffn_width, kv_heads

LLAMA_KEYS = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "layers.{}.attention_norm.weight": "model.layers.{}.input_layernorm.weight",
    "layers.{}.attention.wq.weight": "model.layers.{}.self_attn.q_proj.weight",
    "layers.{}.attention.wk.weight": "model.layers.{}.self_attn.k_proj.weight",
    "layers.{}.attention.wv.weight": "model.layers.{}.self_attn.v_proj.weight",
    "layers.{}.attention.wo.weight": "model.layers.{}.self_attn.o_proj.weight",
    "layers.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "layers.{}.feed_forward.w1.weight": "model.layers.{}.mlp.gate_proj.weight",
    "layers.{}.feed_forward.w3.weight": "model.layers.{}.mlp.up_proj.weight",
    "layers.{}.feed_forward.w2.weight": "model.layers.{}.mlp.down_proj.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LLAMA_ROTARY = {"layers.{}.attention.wq.weight": "n_heads", "layers.{}.attention.wk.weight": "n_kv_heads"}

#: meshtrain's rope_scaling keys -> transformers' (llama3 rope type)
SCALING_KEYS = {
    "factor": "factor",
    "low_freq_factor": "low_freq_factor",
    "high_freq_factor": "high_freq_factor",
    "original_max_seq_len": "original_max_position_embeddings",
}


def rope_to_hf(model: Mapping[str, Any]) -> dict[str, Any]:
    """``rope_theta`` and ``rope_scaling`` as config.json holds them: transformers 5's ``rope_parameters`` and the
    older top-level ``rope_theta`` / ``rope_scaling`` that vLLM and transformers 4 read."""
    theta = float(model["rope_theta"])
    scaling = model.get("rope_scaling")
    on = bool(scaling and float(scaling["factor"]))
    hf_scaling = {"rope_type": "llama3", **{h: scaling[m] for m, h in SCALING_KEYS.items()}} if on else None
    parameters = {**(hf_scaling or {"rope_type": "default"}), "rope_theta": theta}
    return {"rope_theta": theta, "rope_scaling": hf_scaling, "rope_parameters": parameters}


def rope_from_hf(hf: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(``rope_theta`` and ``rope_scaling`` as meshtrain keys, what cannot be represented) from either form."""
    parameters = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or parameters
    kind = first(scaling, "rope_type", "type", default="default")
    theta = float(first(hf, "rope_theta", default=parameters.get("rope_theta", 10000.0)))
    problems = []
    if kind not in ("default", "llama3"):
        problems.append(
            f"rope_scaling rope_type={kind!r}: meshtrain's rotary embedding knows Llama 3.1's 'llama3' scaling "
            "or none; this checkpoint needs another"
        )
    ours = {m: scaling[h] for m, h in SCALING_KEYS.items()} if kind == "llama3" else asdict(RopeScaling())
    return {"rope_theta": theta, "rope_scaling": ours}, problems


def dense_config(model: Mapping[str, Any], *, head_dim: int) -> dict[str, Any]:
    """The keys Llama and Qwen3 share in config.json."""
    return {
        "vocab_size": int(model["vocab_size"]),
        "hidden_size": int(model["d_model"]),
        "intermediate_size": ffn_width(model),
        "num_hidden_layers": int(model["n_layers"]),
        "num_attention_heads": int(model["n_heads"]),
        "num_key_value_heads": kv_heads(model),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": float(model["norm_eps"]),
        **rope_to_hf(model),
        "tie_word_embeddings": bool(model.get("tie_embeddings", False)),
        "attention_bias": False,
    }


def dense_model_config(hf: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(meshtrain keys, problems) for what Llama and Qwen3 share."""
    rope, problems = rope_from_hf(hf)
    if first(hf, "hidden_act", default="silu") != "silu":
        problems.append(f"hidden_act={hf['hidden_act']!r}: meshtrain's feed-forward is SwiGLU (silu)")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        problems.append("attention_bias / mlp_bias: meshtrain's projections have no biases")
    heads = int(hf["num_attention_heads"])
    out = {
        "vocab_size": int(hf["vocab_size"]),
        "n_layers": int(hf["num_hidden_layers"]),
        "d_model": int(hf["hidden_size"]),
        "n_heads": heads,
        "n_kv_heads": int(first(hf, "num_key_value_heads", default=heads)),
        "d_ff": int(hf["intermediate_size"]),
        "norm_eps": float(first(hf, "rms_norm_eps", default=1e-6)),
        **rope,
    }
    return out, problems


def with_base(cfg: dict[str, Any], base: Mapping[str, Any] | None, max_seq_len: int) -> dict[str, Any]:
    """``cfg`` over the config a run started from (``over_base``), keeping its context length when longer than
    the one trained at."""
    context = max(int(max_seq_len), int((base or {}).get("max_position_embeddings") or 0))
    return over_base({**cfg, "max_position_embeddings": context}, base)


class LlamaAdapter(HFAdapter):
    model_type = "llama"
    architecture = "LlamaForCausalLM"
    keys = LLAMA_KEYS
    rotary = LLAMA_ROTARY

    def hf_config(self, model: Mapping[str, Any], *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        cfg = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            **dense_config(model, head_dim=int(model["d_model"]) // int(model["n_heads"])),
            "mlp_bias": False,
        }
        return with_base(cfg, base, int(model["max_seq_len"]))

    def model_config(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        self.check_model_type(hf)
        out, problems = dense_model_config(hf)
        head_dim = hf.get("head_dim")
        if head_dim and int(head_dim) * out["n_heads"] != out["d_model"]:
            problems.append(
                f"head_dim={head_dim} is not hidden_size / num_attention_heads = {out['d_model']} / {out['n_heads']}: "
                "meshtrain's Llama derives the head width (the qwen3 family sets it on its own)"
            )
        unsupported(problems)
        return {**out, "tie_embeddings": bool(hf.get("tie_word_embeddings", False))}


ADAPTER = LlamaAdapter()
