"""The Qwen3 family <-> transformers' ``Qwen3ForCausalLM``: Llama's names and config (``models/llama/hf_adapter.py``)
plus the per-head q/k norms and ``head_dim``.

The q/k norm weights scale a head's channels, so they take the same rotary permutation as the rows of ``wq`` /
``wk``, for one head (``models/hf_adapter.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from models.hf_adapter import HFAdapter, unsupported
from models.llama.hf_adapter import LLAMA_KEYS, LLAMA_ROTARY, dense_config, dense_model_config, with_base
from models.qwen3.spec import head_dim

QWEN3_KEYS = {
    **LLAMA_KEYS,
    "layers.{}.attention.q_norm.weight": "model.layers.{}.self_attn.q_norm.weight",
    "layers.{}.attention.k_norm.weight": "model.layers.{}.self_attn.k_norm.weight",
}
QWEN3_ROTARY = {**LLAMA_ROTARY, "layers.{}.attention.q_norm.weight": "one", "layers.{}.attention.k_norm.weight": "one"}


class Qwen3Adapter(HFAdapter):
    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    keys = QWEN3_KEYS
    rotary = QWEN3_ROTARY

    def hf_config(self, model: Mapping[str, Any], *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        cfg = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            **dense_config(model, head_dim=head_dim(model)),
            "use_sliding_window": False,
        }
        return with_base(cfg, base, int(model["max_seq_len"]))

    def model_config(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        self.check_model_type(hf)
        out, problems = dense_model_config(hf)
        if hf.get("use_sliding_window"):
            problems.append("use_sliding_window=true: meshtrain's attention is full causal attention")
        unsupported(problems)
        width = int(hf.get("head_dim") or out["d_model"] // out["n_heads"])
        return {**out, "head_dim": width, "tie_embeddings": bool(hf.get("tie_word_embeddings", False))}


ADAPTER = Qwen3Adapter()
