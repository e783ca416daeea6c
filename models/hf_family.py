"""The model a Hugging Face ``config.json`` describes, in meshtrain's terms: the registered family that runs it (the
one whose adapter reads its ``model_type``, else transformers' own modules, family ``hf``) and the model keys it fixes.
Training's ``model.init_from`` start (``trainer/hf/start.py``) and the planner's command line
(``parallel/plan/cli.py``) build the same model from it. No torch import.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from models.hf_adapter import read_keys
from models.registry import REGISTRY, UnknownModel
from models.spec import ModelSpec


def spec_for_model_type(model_type: Any) -> ModelSpec | None:
    """The registered family whose Hugging Face adapter reads ``config.json``'s ``model_type``, or None."""
    for spec in REGISTRY.values():
        if spec.hf_adapter and spec.config is not None and spec.hf_adapter_obj().model_type == model_type:
            return spec
    return None


#: the family that runs any architecture with transformers' own modules (models/hf_transformers)
TRANSFORMERS = "hf"


def hf_model(
    hf: dict[str, Any], *, start: str, backend: str = "auto", stored: Collection[str] | None = None
) -> tuple[ModelSpec, dict[str, Any], list[str]]:
    """The model a Hugging Face ``config.json`` (``hf``, read from folder ``start``) describes: its family's spec, the
    model keys it fixes (every size from the adapter's ``model_config``, the training keys from ``training_fields``,
    ``name`` and ``init_from``) and notes on what could not be carried. Training (trainer/hf/start.py) and the
    planner (parallel/plan/cli.py) build the same model from it. ``backend`` (``model.backend``): auto takes the
    native family that reads ``model_type`` where one exists, else transformers' own modules (family ``hf``, whose
    architecture is config.json itself); native / transformers force one. ``stored``: the names of the folder's
    tensors, for the keys they decide (the adapter's ``stored_fields``; None: those keys keep their defaults). Raises
    UnknownModel naming the families that exist and the fix, or the adapter's HFConfigError."""
    kind = hf.get("model_type")
    spec = spec_for_model_type(kind) if backend != "transformers" else None
    name = Path(start).expanduser().name
    if spec is None:
        if backend == "native":
            known = sorted(s.hf_adapter_obj().model_type for s in REGISTRY.values() if s.hf_adapter and s.config)
            raise UnknownModel(
                f"model.init_from={start}: config.json has model_type={kind!r}, which no meshtrain family reads "
                f"(native: {', '.join(k for k in known if k != '*')}); model.backend=auto or transformers runs it "
                "with transformers' own modules"
            )
        spec = REGISTRY[TRANSFORMERS]
        problems = spec.problems({"config_dir": start})  # a causal LM transformers knows, no code of its own
        if problems:
            raise UnknownModel(problems[0].replace("model.config_dir=", "model.init_from=", 1))
        return spec, {"name": name or TRANSFORMERS, "init_from": start, "config_dir": start}, []
    adapter = spec.hf_adapter_obj()
    sizes = read_keys(adapter.model_config, hf)  # a damaged config.json refused as HFConfigError naming the key
    carried, notes = read_keys(adapter.training_fields, hf)
    if stored is not None:
        sizes.update(read_keys(lambda h: adapter.stored_fields(h, stored), hf))
    values = {"name": name or spec.family, "init_from": start, **sizes, **carried}
    return spec, values, notes
