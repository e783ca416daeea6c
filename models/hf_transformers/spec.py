"""The Hugging Face backend's ``ModelSpec``: every size read from the folder's ``config.json`` (JSON only, no torch),
the pipeline units and tensor-parallel plan of transformers' decoders, and what each dimension needs of an
architecture, refused before spawn with the reason and what works instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from models.hf_transformers.config import CONFIG_JSON, HFTransformersConfig, hf_json, max_seq_len, n_experts
from models.hf_transformers.shape import hf_shape
from models.spec import ModelSpec, MoESpec, PipelineUnits

#: the base model's parts before and after its layers (transformers' ``base_model_pp_plan`` names them so)
UNITS = PipelineUnits(pre=("embed_tokens",), post=("norm", "lm_head"))


def n_layers(model: Any) -> int:
    return int(hf_json(model)["num_hidden_layers"])


def hf_problems(model: Any) -> list[str]:
    """The folder has a config.json of a decoder-only causal LM transformers knows, whose code may run."""
    where = f"model.config_dir={model.get('config_dir')}"
    path = Path(str(model.get("config_dir"))).expanduser() / CONFIG_JSON
    if not path.is_file():
        return [f"{where}: no {CONFIG_JSON} there; give a Hugging Face model folder (config.json, safetensors)"]
    try:
        hf = hf_json(model)
    except ValueError as exc:
        return [f"{where}: {CONFIG_JSON} is not JSON ({exc})"]
    return architecture_problems(hf, where=where, trust_remote_code=bool(model.get("trust_remote_code")))


def architecture_problems(hf: dict[str, Any], *, where: str, trust_remote_code: bool) -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    kind = hf.get("model_type")
    if hf.get("auto_map") and not trust_remote_code:
        return [
            f"{where}: config.json (model_type={kind!r}) names Python code of its own (auto_map), which meshtrain "
            "never runs unasked; read that code, then run it with model=hf model.config_dir=DIR "
            "model.trust_remote_code=true (and model.init_from=DIR for its weights)"
        ]
    if hf.get("auto_map"):
        return []
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return [
            f"{where}: model_type={kind!r} is not a causal language model transformers knows "
            "(AutoModelForCausalLM); the backend trains decoder-only causal LMs: give such a folder"
        ]
    if "num_hidden_layers" not in hf:
        return [f"{where}: config.json has no num_hidden_layers; the backend needs a decoder of layers"]
    return []


#: transformers' tensor-parallel styles meshtrain applies (``models/hf_transformers/tensor_parallel.py``)
TP_STYLES = (
    "colwise",
    "rowwise",
    "colwise_gather_output",
    "rowwise_split_input",
    "replicated_with_grad_allreduce",
    "mla_kv_a_proj",
    "embedding_rowwise",
)
#: the styles that split a layer's attention: a plan with none of them would run every layer whole on every rank
SPLITTING = ("colwise", "rowwise", "colwise_gather_output", "rowwise_split_input")


def tp_problems(model: Any, tp: int) -> list[str]:
    """The architecture's ``base_model_tp_plan`` exists, splits its attention with styles meshtrain applies, and
    tp divides what it splits (query and key/value heads, the feed-forward width)."""
    hf = hf_json(model)
    kind = hf.get("model_type")
    plan = tp_plan(hf)
    if not any(style in SPLITTING for pattern, style in plan.items() if "attn" in pattern):
        return [
            f"tp.size={tp} with model_type={kind!r}: transformers gives this architecture no tensor-parallel plan "
            "for its attention (config.base_model_tp_plan); use tp.size=1 and shard with parallel=fsdp, or pipeline "
            "it (pp.size)" + (", or ep.size for its experts" if hf.get("num_local_experts") else "")
        ]
    unknown = sorted({style for style in plan.values() if style not in TP_STYLES})
    out = []
    if unknown:
        out.append(
            f"tp.size={tp} with model_type={kind!r}: its tensor-parallel plan uses style(s) {unknown} that meshtrain "
            f"does not apply (it applies {', '.join(TP_STYLES)}); use tp.size=1"
        )
    heads = int(hf["num_attention_heads"])
    kv = int(hf.get("num_key_value_heads") or heads)
    for key, value in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if value % tp:
            out.append(
                f"tp.size={tp} does not divide config.json's {key}={value}: each tp rank owns whole heads; use "
                f"tp.size in {[d for d in range(1, value + 1) if value % d == 0]}"
            )
    width = int(hf.get("intermediate_size") or 0)
    if width % tp and any("mlp" in p and s in SPLITTING for p, s in plan.items()):
        out.append(f"tp.size={tp} does not divide config.json's intermediate_size={width}: the MLP is split by it")
    return out


def tp_plan(hf: dict[str, Any]) -> dict[str, str]:
    """transformers' ``base_model_tp_plan`` of this architecture (its config class's, as config.json rarely
    writes it)."""
    if hf.get("base_model_tp_plan"):
        return dict(hf["base_model_tp_plan"])
    from transformers import AutoConfig

    cls = type(AutoConfig.for_model(hf["model_type"]))
    return dict(getattr(cls, "base_model_tp_plan", None) or {})


#: model types whose attention is more than causal softmax attention at a scale (gpt-oss: attention sinks)
CP_REFUSED = {"gpt_oss": "its attention sinks"}


def cp_problems(model: Any, cp: int, seq_len: int) -> list[str]:
    """Context parallel runs causal SDPA at the module's scaling over the whole sequence
    (``models/hf_transformers/model.py``): refused where a layer's attention is more (a sliding window shorter than
    the sequence, logit softcapping, attention sinks)."""
    hf = hf_json(model)
    kind = hf.get("model_type")
    n = int(hf["num_hidden_layers"])
    window = hf.get("sliding_window")
    sliding = "sliding_attention" in (hf.get("layer_types") or ["sliding_attention"] * n)[:n]
    out = []
    if window and sliding and int(window) < seq_len:
        out.append(
            f"cp.size={cp} with model_type={kind!r}: its sliding-window layers (sliding_window={window} < "
            f"data.seq_len={seq_len}) attend within a window that context parallel's causal kernel over the whole "
            f"sequence does not apply; use cp.size=1, or data.seq_len<={window}"
        )
    extra = CP_REFUSED.get(str(kind)) or ("its attention logit softcapping" if hf.get("attn_logit_softcapping") else "")
    if extra:
        out.append(
            f"cp.size={cp} with model_type={kind!r}: {extra}: not in context parallel's causal kernel; use "
            "cp.size=1 (tp.size or pp.size split it instead)"
        )
    return out


SPEC = ModelSpec.of(
    HFTransformersConfig,
    takes_config=True,
    blocks=n_layers,
    max_seq_len=max_seq_len,
    pipeline=UNITS,
    parallelize="models.hf_transformers.tensor_parallel:parallelize_hf",
    tp_check=tp_problems,
    sequence_parallel=False,
    context_parallel=True,  # transformers' attention through AttentionInterface's meshtrain_ulysses (model.py)
    cp_check=cp_problems,
    check=hf_problems,
    shape=hf_shape,
    hf_adapter="models.hf_transformers.hf_adapter:ADAPTER",
    # transformers' experts run behind meshtrain's dispatch seam (models/hf_transformers/experts.py)
    moe=MoESpec(
        experts=("layers.*.experts.*",),
        router=("layers.*.mlp.gate.weight", "layers.*.mlp.router.weight"),
        n_experts=n_experts,
        top_k=lambda model: int(hf_json(model).get("num_experts_per_tok") or 0),
    ),
    description="any decoder-only causal LM transformers knows, run by transformers' own modules (config.json)",
)
