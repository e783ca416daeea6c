"""The DeepSeek-V3 family <-> transformers' ``DeepseekV3ForCausalLM``.

| meshtrain                                   | transformers checkpoint                                        |
|---------------------------------------------|----------------------------------------------------------------|
| ``layers.N.attention.wq_a`` / ``q_norm`` / ``wq_b`` (or ``wq``) | ``model.layers.N.self_attn.q_a_proj`` / ``q_a_layernorm`` / ``q_b_proj`` (``q_proj``) |
| ``layers.N.attention.wkv_a`` / ``kv_norm`` / ``wkv_b`` / ``wo`` | ``...self_attn.kv_a_proj_with_mqa`` / ``kv_a_layernorm`` / ``kv_b_proj`` / ``o_proj`` |
| ``layers.N.feed_forward.w1`` / ``w3`` / ``w2`` (dense layers)   | ``...mlp.gate_proj`` / ``up_proj`` / ``down_proj``            |
| ``layers.N.feed_forward.router.weight`` / ``expert_bias``       | ``...mlp.gate.weight`` / ``gate.e_score_correction_bias``      |
| ``layers.N.feed_forward.experts.w1[e]`` / ``w3[e]`` / ``w2[e]`` | ``...mlp.experts.e.gate_proj`` / ``up_proj`` / ``down_proj``   |
| ``layers.N.feed_forward.shared.w1`` / ``w3`` / ``w2``           | ``...mlp.shared_experts.gate_proj`` / ``up_proj`` / ``down_proj`` |

No rotary permutation: with ``rope_interleave: true`` (transformers' default, DeepSeek-V3's checkpoints) transformers
rotates the interleaved channel pairs meshtrain rotates (its output lists the pairs' first members, then their
second: the same permutation of q's and k's rotary channels, so the same attention). A checkpoint with
``rope_interleave: false`` is refused.

**Multi-token prediction** (``models/mtp.py``): MTP module ``k`` is HF layer ``num_hidden_layers + k - 1`` (the
published checkpoint's ``model.layers.61``), the names vLLM's ``deepseek_mtp.py`` reads: ``enorm``, ``hnorm``,
``eh_proj``, ``shared_head.norm``, a decoder layer's tensors under the layer itself (``self_attn``, ``mlp``,
``input_layernorm``, ``post_attention_layernorm``), and copies of the main embedding and head (``embed_tokens``,
``shared_head.head``), written on export and not read (meshtrain's modules share the main model's). config.json's
``num_nextn_predict_layers`` is written as ``model.mtp_depth``; a run started from a folder takes the modules its
safetensors hold (``stored_fields``: transformers saves none, and its DeepseekV3 drops ``model.layers.61`` on load;
an exported folder's MTP layers at another index show in its load report as unused keys). Tensors of MTP layers
beyond ``model.mtp_depth`` are not read.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from models.hf_adapter import HFAdapter, HFConfigError, Stacked, first, unsupported
from models.llama.hf_adapter import with_base

ATTN = "model.layers.{}.self_attn"
MLP = "model.layers.{}.mlp"
DEEPSEEK_KEYS = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "layers.{}.attention_norm.weight": "model.layers.{}.input_layernorm.weight",
    "layers.{}.attention.wq.weight": f"{ATTN}.q_proj.weight",
    "layers.{}.attention.wq_a.weight": f"{ATTN}.q_a_proj.weight",
    "layers.{}.attention.q_norm.weight": f"{ATTN}.q_a_layernorm.weight",
    "layers.{}.attention.wq_b.weight": f"{ATTN}.q_b_proj.weight",
    "layers.{}.attention.wkv_a.weight": f"{ATTN}.kv_a_proj_with_mqa.weight",
    "layers.{}.attention.kv_norm.weight": f"{ATTN}.kv_a_layernorm.weight",
    "layers.{}.attention.wkv_b.weight": f"{ATTN}.kv_b_proj.weight",
    "layers.{}.attention.wo.weight": f"{ATTN}.o_proj.weight",
    "layers.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "layers.{}.feed_forward.w1.weight": f"{MLP}.gate_proj.weight",
    "layers.{}.feed_forward.w3.weight": f"{MLP}.up_proj.weight",
    "layers.{}.feed_forward.w2.weight": f"{MLP}.down_proj.weight",
    "layers.{}.feed_forward.router.weight": f"{MLP}.gate.weight",
    "layers.{}.feed_forward.router.expert_bias": f"{MLP}.gate.e_score_correction_bias",
    "layers.{}.feed_forward.experts.w1": Stacked(f"{MLP}.experts.{{e}}.gate_proj.weight"),
    "layers.{}.feed_forward.experts.w3": Stacked(f"{MLP}.experts.{{e}}.up_proj.weight"),
    "layers.{}.feed_forward.experts.w2": Stacked(f"{MLP}.experts.{{e}}.down_proj.weight"),
    "layers.{}.feed_forward.shared.w1.weight": f"{MLP}.shared_experts.gate_proj.weight",
    "layers.{}.feed_forward.shared.w3.weight": f"{MLP}.shared_experts.up_proj.weight",
    "layers.{}.feed_forward.shared.w2.weight": f"{MLP}.shared_experts.down_proj.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
MTP_OWN = {
    "mtp.layers.{}.enorm.weight": "model.layers.{}.enorm.weight",
    "mtp.layers.{}.hnorm.weight": "model.layers.{}.hnorm.weight",
    "mtp.layers.{}.eh_proj.weight": "model.layers.{}.eh_proj.weight",
    "mtp.layers.{}.norm.weight": "model.layers.{}.shared_head.norm.weight",
}
#: an MTP module's block: a decoder layer's tensors, under the MTP layer's own index
MTP_BLOCK = {f"mtp.layers.{{}}.block.{k[len('layers.{}.') :]}": v for k, v in DEEPSEEK_KEYS.items() if "{}" in k}
#: the main model's tensors an MTP layer carries a copy of in the published checkpoint (vLLM reads the first's)
MTP_COPIES = {"embed_tokens.weight": "tok_embeddings.weight", "shared_head.head.weight": "output.weight"}
MTP_EMBED = "mtp.embed.weight"
HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

#: meshtrain key -> config.json key, read and written as they are
SAME = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "d_ff": "intermediate_size",
    "moe_d_ff": "moe_intermediate_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "kv_lora_rank": "kv_lora_rank",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
    "n_experts": "n_routed_experts",
    "n_shared_experts": "n_shared_experts",
    "top_k": "num_experts_per_tok",
    "first_k_dense_replace": "first_k_dense_replace",
}
#: meshtrain's YaRN keys -> transformers' rope_parameters keys
YARN_KEYS = {
    "factor": "factor",
    "original_max_seq_len": "original_max_position_embeddings",
    "beta_fast": "beta_fast",
    "beta_slow": "beta_slow",
    "mscale": "mscale",
    "mscale_all_dim": "mscale_all_dim",
}
YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.0}


def rope_to_hf(model: Mapping[str, Any]) -> dict[str, Any]:
    theta, scaling = float(model["rope_theta"]), model.get("rope_scaling")
    if scaling and float(scaling["factor"]):
        yarn = {"rope_type": "yarn", **{h: scaling[m] for m, h in YARN_KEYS.items()}}
        return {"rope_theta": theta, "rope_scaling": yarn, "rope_parameters": {**yarn, "rope_theta": theta}}
    return {"rope_theta": theta, "rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": theta}}


def rope_from_hf(hf: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    parameters = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or parameters
    kind = first(scaling, "rope_type", "type", default="default")
    theta = float(first(hf, "rope_theta", default=parameters.get("rope_theta", 10000.0)))
    if kind == "default":
        return {"rope_theta": theta, "rope_scaling": {"factor": 0.0}}, []
    if kind != "yarn":
        return {}, [f"rope_parameters rope_type={kind!r}: meshtrain's DeepSeek-V3 knows YaRN or none"]
    yarn = {m: scaling.get(h) for m, h in YARN_KEYS.items()}
    yarn = {m: YARN_DEFAULTS[m] if v is None else v for m, v in yarn.items()}
    if yarn["factor"] is None:  # transformers' rule: the ratio of the context lengths
        yarn["factor"] = float(hf["max_position_embeddings"]) / float(yarn["original_max_seq_len"])
    return {"rope_theta": theta, "rope_scaling": yarn}, []


class DeepseekV3Adapter(HFAdapter):
    model_type = "deepseek_v3"
    architecture = "DeepseekV3ForCausalLM"
    keys = {**DEEPSEEK_KEYS, **MTP_OWN, **MTP_BLOCK}

    def source(self, fqn: str, model: Mapping[str, Any]):
        """The MTP modules' embedding is the main model's."""
        return super().source(self.embedding if fqn == MTP_EMBED else fqn, model)

    def to_hf(self, state: Mapping[str, Any], model: Mapping[str, Any]) -> dict[str, Any]:
        """The main tensors and the MTP modules' own; each MTP layer's copies of the embedding and the head."""
        out = super().to_hf({k: v for k, v in state.items() if k != MTP_EMBED}, model)
        embed = out[self.hf_name(self.embedding)]
        head = embed if self.tied(model) else out[self.hf_name(self.head)]
        main = int(model["n_layers"])
        for layer in range(main, main + int(model.get("mtp_depth") or 0)):
            out[f"model.layers.{layer}.embed_tokens.weight"] = embed.clone()
            out[f"model.layers.{layer}.shared_head.head.weight"] = head.clone()
        return out

    def ignored(self, hf_key: str, model: Mapping[str, Any]) -> bool:
        """Besides a tied head's copy: the MTP layers' copies of the embedding and head, and MTP layers past
        ``model.mtp_depth``."""
        m = HF_LAYER.match(hf_key)
        if m is None or int(m[1]) < int(model["n_layers"]):
            return super().ignored(hf_key, model)
        return m[2] in MTP_COPIES or int(m[1]) >= int(model["n_layers"]) + int(model.get("mtp_depth") or 0)

    def stored_fields(self, hf: Mapping[str, Any], stored: Collection[str]) -> dict[str, Any]:
        """``mtp_depth``: the MTP layers (of config.json's ``num_nextn_predict_layers``) whose ``eh_proj`` the
        safetensors hold, in order."""
        main = int(hf["num_hidden_layers"])
        depth = int(first(hf, "num_nextn_predict_layers", "num_mtp_layers", default=0) or 0)
        held = 0
        while held < depth and self.locate(f"model.layers.{main + held}.eh_proj.weight", set(stored)):
            held += 1
        return {"mtp_depth": held}

    def hf_config(self, model: Mapping[str, Any], *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        problems = []
        if str(model.get("score_func", "sigmoid")) != "sigmoid":
            problems.append(f"model.score_func={model['score_func']}: DeepSeek-V3 routes by sigmoid scores")
        unsupported(problems)
        heads, q_rank = int(model["n_heads"]), int(model.get("q_lora_rank") or 0)
        cfg = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            **{hf: int(model[ours]) for ours, hf in SAME.items()},
            "num_key_value_heads": heads,
            "q_lora_rank": q_rank or None,
            "head_dim": int(model["qk_rope_head_dim"]),
            "qk_head_dim": int(model["qk_nope_head_dim"]) + int(model["qk_rope_head_dim"]),
            "n_group": int(model["n_group"]),
            "topk_group": int(model["topk_group"]),
            # the published config.json's routing keys: transformers ignores them, vLLM builds the gate's
            # e_score_correction_bias (which the export writes) only when topk_method says noaux_tc
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "routed_scaling_factor": float(model["route_scale"]),
            "norm_topk_prob": bool(model["norm_topk_prob"]),
            "rms_norm_eps": float(model["norm_eps"]),
            **rope_to_hf(model),
            "rope_interleave": True,
            "hidden_act": "silu",
            "attention_bias": False,
            "tie_word_embeddings": bool(model.get("tie_embeddings", False)),
            "num_nextn_predict_layers": int(model.get("mtp_depth") or 0),
        }
        return with_base(cfg, base, int(model["max_seq_len"]))

    def model_config(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        self.check_model_type(hf)
        rope, problems = rope_from_hf(hf)
        if hf.get("rope_interleave") is False:
            problems.append("rope_interleave=false: meshtrain rotates interleaved pairs (DeepSeek-V3's checkpoints)")
        if first(hf, "hidden_act", default="silu") != "silu":
            problems.append(f"hidden_act={hf['hidden_act']!r}: meshtrain's feed-forward is SwiGLU (silu)")
        if hf.get("attention_bias"):
            problems.append("attention_bias=true: meshtrain's MLA projections have no biases")
        heads = int(hf["num_attention_heads"])
        if int(first(hf, "num_key_value_heads", default=heads)) != heads:
            problems.append(f"num_key_value_heads={hf['num_key_value_heads']}: MLA has one per query head ({heads})")
        unsupported(problems)
        try:
            sizes = {ours: int(hf[key]) for ours, key in SAME.items()}
        except KeyError as exc:
            raise HFConfigError(f"config.json lacks {exc}: not a DeepSeek-V3 config") from None
        return {
            **sizes,
            **rope,
            "q_lora_rank": int(hf.get("q_lora_rank") or 0),
            "n_group": int(hf.get("n_group") or 1),
            "topk_group": int(hf.get("topk_group") or 1),
            "route_scale": float(first(hf, "routed_scaling_factor", default=1.0)),
            "norm_topk_prob": bool(first(hf, "norm_topk_prob", default=True)),
            "score_func": "sigmoid",
            "norm_eps": float(first(hf, "rms_norm_eps", default=1e-6)),
            "tie_embeddings": bool(hf.get("tie_word_embeddings", False)),
        }


ADAPTER = DeepseekV3Adapter()
