"""The Qwen3-MoE family <-> transformers' ``Qwen3MoeForCausalLM``: Qwen3's names and config plus the experts.

A sparse layer's stacked expert weights are the published per-expert tensors, one slice each (``Stacked``):

| meshtrain (one tensor per layer)        | transformers checkpoint (one tensor per expert e)        |
|-----------------------------------------|----------------------------------------------------------|
| ``layers.N.feed_forward.experts.w1[e]`` | ``model.layers.N.mlp.experts.e.gate_proj.weight``        |
| ``layers.N.feed_forward.experts.w3[e]`` | ``model.layers.N.mlp.experts.e.up_proj.weight``          |
| ``layers.N.feed_forward.experts.w2[e]`` | ``model.layers.N.mlp.experts.e.down_proj.weight``        |
| ``layers.N.feed_forward.router.weight`` | ``model.layers.N.mlp.gate.weight``                       |

transformers 5 fuses the experts in memory (``experts.gate_up_proj``) but ``save_pretrained`` writes, and
``from_pretrained`` reads, the per-expert keys above, as published checkpoints hold them. Dense layers
(``mlp_only_layers``, ``decoder_sparse_step``) keep Qwen3's ``mlp.gate_proj`` names. Shared experts and
DeepSeek-V3's balancing bias have no place in a Qwen3-MoE checkpoint; a model with them is refused on export.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from models.hf_adapter import HFConfigError, Stacked, first, unsupported
from models.qwen3.hf_adapter import QWEN3_KEYS, QWEN3_ROTARY, Qwen3Adapter
from models.qwen3_moe.spec import expert_width

EXPERT = "model.layers.{}.mlp.experts.{e}"
QWEN3_MOE_KEYS = {
    **QWEN3_KEYS,
    "layers.{}.feed_forward.router.weight": "model.layers.{}.mlp.gate.weight",
    "layers.{}.feed_forward.experts.w1": Stacked(f"{EXPERT}.gate_proj.weight"),
    "layers.{}.feed_forward.experts.w3": Stacked(f"{EXPERT}.up_proj.weight"),
    "layers.{}.feed_forward.experts.w2": Stacked(f"{EXPERT}.down_proj.weight"),
}

#: meshtrain key -> transformers' config.json key, for the experts
MOE_CONFIG = {
    "n_experts": "num_experts",
    "top_k": "num_experts_per_tok",
    "decoder_sparse_step": "decoder_sparse_step",
    "norm_topk_prob": "norm_topk_prob",
    "router_aux_loss_coef": "router_aux_loss_coef",
}
CASTS = {
    "n_experts": int,
    "top_k": int,
    "decoder_sparse_step": int,
    "norm_topk_prob": bool,
    "router_aux_loss_coef": float,
}


class Qwen3MoeAdapter(Qwen3Adapter):
    model_type = "qwen3_moe"
    architecture = "Qwen3MoeForCausalLM"
    keys = QWEN3_MOE_KEYS
    rotary = QWEN3_ROTARY

    def hf_config(self, model: Mapping[str, Any], *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        problems = []
        if int(model.get("n_shared_experts", 0) or 0):
            problems.append(f"model.n_shared_experts={model['n_shared_experts']}: Qwen3-MoE has no shared experts")
        if float(model.get("bias_update_rate", 0.0) or 0.0):
            problems.append("model.bias_update_rate > 0: Qwen3-MoE's router has no balancing bias (DeepSeek-V3's)")
        unsupported(problems)
        cfg = super().hf_config(model, base=base)
        moe = {hf: model[ours] for ours, hf in MOE_CONFIG.items()}
        moe["mlp_only_layers"] = [int(i) for i in (model.get("mlp_only_layers") or ())]
        moe["moe_intermediate_size"] = expert_width(model)
        return {**cfg, **moe, "architectures": [self.architecture], "model_type": self.model_type}

    def model_config(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        out = super().model_config(hf)  # checks model_type, then Qwen3's keys
        experts = int(first(hf, "num_experts", "num_local_experts", default=0))  # transformers 5 writes the second
        if experts < 1:
            raise HFConfigError("num_experts=0: a dense checkpoint; read it with a qwen3 model (model=qwen3_*)")
        moe = {ours: CASTS[ours](hf[key]) for ours, key in MOE_CONFIG.items() if hf.get(key) is not None}
        return {
            **out,
            **moe,
            "n_experts": experts,
            "moe_d_ff": int(hf["moe_intermediate_size"]),
            "mlp_only_layers": [int(i) for i in (hf.get("mlp_only_layers") or [])],
        }


ADAPTER = Qwen3MoeAdapter()
