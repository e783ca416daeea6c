"""Config schema of the Hugging Face backend (``model.init_from=DIR`` for a ``model_type`` no native family reads,
``model.backend=transformers``, or ``model=hf model.config_dir=DIR``). No torch import.

The architecture is the folder's ``config.json``, read by transformers (``AutoConfig``); meshtrain's keys say only
where it is and how to run it. Every size the planner, validation and the tensor-parallel checks need is read from
that file (``models/hf_transformers/spec.py``)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.spec import ModelArgs, hydra_schema

CONFIG_JSON = "config.json"


@functools.lru_cache(maxsize=32)
def _read(path: str, mtime: float) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def hf_json(model: Any) -> dict[str, Any]:
    """``config.json`` of ``model.config_dir`` (read once per file version); a multimodal config's ``text_config``
    keys over its own."""
    path = Path(str(model.get("config_dir"))).expanduser() / CONFIG_JSON
    hf = _read(str(path), path.stat().st_mtime)
    return {**hf, **hf["text_config"]} if isinstance(hf.get("text_config"), dict) else hf


def max_seq_len(model: Any) -> int:
    """``model.max_seq_len``, else config.json's ``max_position_embeddings``."""
    return int(model.get("max_seq_len") or 0) or int(hf_json(model).get("max_position_embeddings") or 0)


def tied(model: Any) -> bool:
    """Whether the head is the token embedding: transformers' default, tied unless config.json says otherwise."""
    return bool(hf_json(model).get("tie_word_embeddings", True))


def n_experts(model: Any) -> int:
    """Routed experts per sparse layer (0: a dense architecture), under the names transformers' configs use."""
    hf = hf_json(model)
    return int(next((hf[k] for k in ("num_local_experts", "n_routed_experts", "num_experts") if hf.get(k)), 0))


@dataclass(frozen=True)
class HFTransformersConfig(ModelArgs):
    _target_: str = "models.hf_transformers.model.HFCausalLM"
    name: str = "hf"
    family: str = "hf"
    config_dir: str = "???"
    """The folder whose ``config.json`` describes the architecture (``model.init_from`` sets it to that folder)."""
    max_seq_len: int = 0
    """The longest sequence trained on; 0: config.json's ``max_position_embeddings``."""
    attn_implementation: str = ""
    """transformers' attention kernel (``config._attn_implementation``): sdpa, eager, flex_attention, or '' for the
    one transformers picks (gpt_oss: eager, for its attention sinks)."""
    trust_remote_code: bool = False
    """Run the Python code a folder's ``config.json`` names (``auto_map``); never implicit."""

    # the sizes meshtrain's generic checks read (tp, loss parallel, data), from config.json: never set twice
    @property
    def vocab_size(self) -> int:
        return int(hf_json(self)["vocab_size"])

    @property
    def n_layers(self) -> int:
        return int(hf_json(self)["num_hidden_layers"])

    @property
    def n_heads(self) -> int:
        return int(hf_json(self)["num_attention_heads"])

    @property
    def d_model(self) -> int:
        return int(hf_json(self)["hidden_size"])


# The mutable twin Hydra composes (models.spec.hydra_schema), made at import: a composed config holds it by name.
HFTransformersConfigSchema = hydra_schema(HFTransformersConfig)
