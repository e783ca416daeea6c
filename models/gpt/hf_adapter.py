"""The GPT family <-> transformers' ``GPT2LMHeadModel``.

GPT-2 stores its projections as ``Conv1D`` weights, (in, out): meshtrain's rows are their columns
(``Source.transpose``). Its attention fuses q, k and v into one ``c_attn`` of three equal blocks
(``Source.part``). There is no rotary embedding, hence no permutation. Published files may leave out the
``transformer.`` prefix and carry old attention-mask buffers (``attn.bias``, ``attn.masked_bias``): both are
accepted. A model without biases (``gpt_small``) is written with zero biases, exact GELU
(``activation_function: gelu``) and its own head, so transformers computes what meshtrain does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the adapters run on tensors but import no torch: validation reads their config maps
    import torch

from models.gpt.spec import ffn_widths
from models.hf_adapter import HFAdapter, HFConfigError, Source, first, over_base, template, unsupported

H = "transformer.h.{}."
GPT2_KEYS: dict[str, str | Source] = {
    "tok_embeddings.weight": "transformer.wte.weight",
    "pos_embeddings.weight": "transformer.wpe.weight",
    "norm.weight": "transformer.ln_f.weight",
    "norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",
    "layers.{}.attention_norm.weight": H + "ln_1.weight",
    "layers.{}.attention_norm.bias": H + "ln_1.bias",
    "layers.{}.ffn_norm.weight": H + "ln_2.weight",
    "layers.{}.ffn_norm.bias": H + "ln_2.bias",
    "layers.{}.attention.wo.weight": Source(H + "attn.c_proj.weight", transpose=True),
    "layers.{}.attention.wo.bias": H + "attn.c_proj.bias",
    "layers.{}.feed_forward.w1.weight": Source(H + "mlp.c_fc.weight", transpose=True),
    "layers.{}.feed_forward.w1.bias": H + "mlp.c_fc.bias",
    "layers.{}.feed_forward.w2.weight": Source(H + "mlp.c_proj.weight", transpose=True),
    "layers.{}.feed_forward.w2.bias": H + "mlp.c_proj.bias",
}
for _part, _w in enumerate(("wq", "wk", "wv")):
    GPT2_KEYS[f"layers.{{}}.attention.{_w}.weight"] = Source(H + "attn.c_attn.weight", True, _part, 3)
    GPT2_KEYS[f"layers.{{}}.attention.{_w}.bias"] = Source(H + "attn.c_attn.bias", False, _part, 3)

#: transformers' activation names -> meshtrain's ``model.activation``
ACTIVATION_NAMES = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
#: the projections whose biases GPT-2's layout has (written as zeros for a model without biases)
LINEARS = tuple(f"layers.{{}}.{p}.weight" for p in ("attention.wq", "attention.wk", "attention.wv", "attention.wo"))
LINEARS += ("layers.{}.feed_forward.w1.weight", "layers.{}.feed_forward.w2.weight")
MASK_BUFFERS = re.compile(r"^(transformer\.)?h\.\d+\.attn\.(masked_)?bias$")


class GPT2Adapter(HFAdapter):
    model_type = "gpt2"
    architecture = "GPT2LMHeadModel"
    keys = GPT2_KEYS
    prefix = "transformer."

    def ignored(self, hf_key: str, model: Mapping[str, Any]) -> bool:
        return super().ignored(hf_key, model) or bool(MASK_BUFFERS.match(hf_key))

    def to_hf(self, state: Mapping[str, torch.Tensor], model: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        out = super().to_hf(state, model)
        for fqn, weight in state.items():
            bias = fqn[: -len("weight")] + "bias"
            if template(fqn)[0] in LINEARS and bias not in state:
                src = self.source(bias, model)
                out.setdefault(src.key, weight.new_zeros(src.hf_shape((weight.shape[0],))))
        return out

    def hf_config(self, model: Mapping[str, Any], *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        widths = ffn_widths(model)
        if len(set(widths)) > 1:
            raise HFConfigError(
                f"model.layer_d_ff={widths}: GPT-2's config.json has one feed-forward width (n_inner); only a "
                "model with equal widths exports"
            )
        dropout = float(model.get("dropout", 0.0))
        tanh = model.get("activation", "gelu") == "gelu_tanh"
        cfg = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": int(model["vocab_size"]),
            "n_positions": int(model["max_seq_len"]),
            "n_embd": int(model["d_model"]),
            "n_layer": int(model["n_layers"]),
            "n_head": int(model["n_heads"]),
            "n_inner": widths[0],
            "activation_function": "gelu_new" if tanh else "gelu",
            "resid_pdrop": dropout,
            "embd_pdrop": dropout,
            "attn_pdrop": dropout,
            "layer_norm_epsilon": float(model.get("norm_eps", 1e-5)),
            "scale_attn_weights": True,
            "tie_word_embeddings": bool(model.get("tie_embeddings", False)),
        }
        return over_base(cfg, base)

    def training_fields(self, hf: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """GPT-2's three dropouts (residual, embedding, attention) are one ``model.dropout``."""
        rates = {k: float(first(hf, k, default=0.1)) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
        notes = []
        if len(set(rates.values())) > 1:
            shown = ", ".join(f"{k}={v}" for k, v in rates.items())
            notes.append(f"config.json {shown}: meshtrain's GPT has one dropout; it trains with resid_pdrop's")
        return {"dropout": rates["resid_pdrop"]}, notes

    def model_config(self, hf: Mapping[str, Any]) -> dict[str, Any]:
        self.check_model_type(hf)
        problems = []
        activation = first(hf, "activation_function", default="gelu_new")
        if activation not in ACTIVATION_NAMES:
            problems.append(f"activation_function={activation!r}: meshtrain's GPT knows {sorted(ACTIVATION_NAMES)}")
        if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("add_cross_attention"):
            problems.append("scale_attn_by_inverse_layer_idx / add_cross_attention: not in meshtrain's GPT")
        if hf.get("scale_attn_weights") is False:
            problems.append("scale_attn_weights=false: meshtrain's attention scales by 1/sqrt(head width)")
        unsupported(problems)
        d_model = int(hf["n_embd"])
        return {
            "vocab_size": int(hf["vocab_size"]),
            "n_layers": int(hf["n_layer"]),
            "d_model": d_model,
            "n_heads": int(hf["n_head"]),
            "d_ff": int(first(hf, "n_inner", default=4 * d_model)),
            "max_seq_len": int(hf["n_positions"]),
            "norm_eps": float(first(hf, "layer_norm_epsilon", default=1e-5)),
            "activation": ACTIVATION_NAMES[activation],
            "tie_embeddings": bool(first(hf, "tie_word_embeddings", default=True)),
            "bias": True,
        }


ADAPTER = GPT2Adapter()
