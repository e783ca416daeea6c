"""``model.init_from`` checked before any worker starts: the folder is a Hugging Face model folder, its
``config.json`` describes this run's model (else: each differing key with both values, and the fix: a ``model=``
config that matches, or the overrides), and its safetensors hold exactly the tensors this model reads, in the
right shapes (else: the missing, unexpected and mis-shaped ones by name).

It reads JSON only (config and safetensors headers), and builds the model on the meta device (no memory) to
know its tensors: torch is imported only when a run names ``model.init_from``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from models.hf_adapter import HFConfigError, read_keys
from models.registry import spec_for
from models.spec import hydra_schema
from trainer.hf.folder import FLOAT_DTYPES, HFFolder

#: names listed in one message before "and N more"
SHOWN = 6


def check_init_from(cfg: DictConfig, layout: Any, f: Any) -> None:
    """The validation check (``trainer/validate.py``): silent without ``model.init_from``, or after other problems
    (the model config must be sound before it is compared)."""
    if cfg.model.get("init_from") and not f.problems:
        for problem in init_from_problems(cfg):
            f.error(problem)
        if f.problems:
            return
        try:
            notes = training_field_notes(cfg)
        except ValueError as exc:  # HFConfigError, HFFolderError: config.json's dropout keys of another type
            f.error(f"model.init_from={cfg.model.init_from}: {exc}")
            return
        for note in notes:
            f.warn(note)


def training_field_notes(cfg: DictConfig) -> list[str]:
    """What config.json sets for training (dropout) that this run does otherwise or cannot carry: a warning
    each, as the weights still load (the base's dropout is not the run's business to refuse)."""
    start = str(cfg.model.init_from)
    adapter = spec_for(cfg.model).hf_adapter_obj()
    carried, notes = read_keys(adapter.training_fields, HFFolder(start).config())
    for key, theirs in carried.items():
        mine = cfg.model.get(key)
        if not _same(mine, theirs):
            notes.append(
                f"config.json has {key} {theirs} and this run model.{key}={mine}: the run trains with {mine}; set "
                f"model.{key}={theirs} to keep the base's"
            )
    return [f"model.init_from={start}: {n}" for n in notes]


def init_from_problems(cfg: DictConfig) -> list[str]:
    start = str(cfg.model.init_from)
    spec = spec_for(cfg.model)
    try:
        adapter = spec.hf_adapter_obj()
        folder = HFFolder(start)
        want = read_keys(adapter.model_config, folder.config())
    except ValueError as exc:  # HFConfigError, HFFolderError, a family without an adapter
        return [f"model.init_from={start}: {exc}"]
    model = OmegaConf.to_container(cfg.model, resolve=True)
    have = adapter.model_config(adapter.hf_config(model))
    differ = {k: (have.get(k), v) for k, v in want.items() if not _same(have.get(k), v)}
    if differ:
        return [_mismatch(start, differ, matching_configs(cfg, adapter, want))]
    return tensor_problems(folder, adapter, cfg.model, start)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def _override(key: str, mine: Any, theirs: Any) -> str:
    """The command-line override giving ``key`` the value ``theirs`` (a struct: only its differing fields)."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return " ".join(_override(f"{key}.{k}", mine.get(k), v) for k, v in theirs.items() if not _same(mine.get(k), v))
    return f"model.{key}={'null' if theirs is None else str(theirs).lower() if isinstance(theirs, bool) else theirs}"


def _mismatch(start: str, differ: dict[str, tuple[Any, Any]], matches: list[str]) -> str:
    keys = "; ".join(f"model.{k}: this run {mine!r}, config.json {theirs!r}" for k, (mine, theirs) in differ.items())
    fix = " ".join(_override(k, mine, theirs) for k, (mine, theirs) in differ.items())
    choose = f"use model={' or model='.join(matches)}, or override: " if matches else "override: "
    return f"model.init_from={start}: its config.json describes another model than this run's ({keys}); {choose}{fix}"


def matching_configs(cfg: DictConfig, adapter: Any, want: dict[str, Any]) -> list[str]:
    """The packaged ``model=`` configs of this family whose keys match ``want``."""
    import conf

    spec = spec_for(cfg.model)
    out = []
    schema = f"/schema/model/{spec.family}@_here_"
    for path in sorted((Path(conf.__file__).parent / "model").glob("*.yaml")):
        if schema not in path.read_text():  # another family's: not parsed (6 ms a file)
            continue
        raw = OmegaConf.load(path)
        if schema not in list(raw.get("defaults", [])):
            continue
        body = {k: v for k, v in OmegaConf.to_container(raw).items() if k != "defaults"}
        root = OmegaConf.create({"data": OmegaConf.to_container(cfg.data), "model": {}})
        root.model = OmegaConf.merge(OmegaConf.structured(hydra_schema(spec.config)), body)
        model = OmegaConf.to_container(root.model, resolve=True)
        try:
            have = adapter.model_config(adapter.hf_config(model))
        except HFConfigError:
            continue
        if all(_same(have.get(k), v) for k, v in want.items()):
            out.append(path.stem)
    return out


def _names(items: list[str]) -> str:
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


def model_shapes(model_cfg: Any) -> dict[str, tuple[int, ...]]:
    """The model's state-dict shapes, from the model built on the meta device, once per model config in a process:
    a refusal validates each layout it suggests (trainer/checks/suggest.py), with this check in each."""
    from models.spec import builder_kwargs

    plain = OmegaConf.to_container(model_cfg, resolve=True) if OmegaConf.is_config(model_cfg) else model_cfg
    kwargs = builder_kwargs(plain)
    try:
        key = json.dumps(kwargs, sort_keys=True)
    except TypeError:  # a value JSON does not hold: built each time
        return dict(_meta_shapes(kwargs))
    return dict(_cached_meta_shapes(key))


@functools.lru_cache(maxsize=16)
def _cached_meta_shapes(kwargs_json: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return _meta_shapes(json.loads(kwargs_json))


def _meta_shapes(kwargs: dict[str, Any]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    import torch
    from hydra.utils import instantiate

    with torch.device("meta"):
        module = instantiate(kwargs)
    return tuple((k, tuple(v.shape)) for k, v in module.state_dict().items())


def tensor_problems(folder: HFFolder, adapter: Any, model_cfg: DictConfig, start: str) -> list[str]:
    """Missing, unexpected and mis-shaped tensors, by name (the model built on the meta device says what it reads)."""
    expected = adapter.hf_shapes(model_shapes(model_cfg), model_cfg)
    stored = folder.shapes()
    located = {key: adapter.locate(key, stored) for key in expected}
    missing = [k for k, at in located.items() if at is None]
    wrong = [
        f"{k} {stored[at]} (this model: {expected[k]})" for k, at in located.items() if at and stored[at] != expected[k]
    ]
    used = {at for at in located.values() if at}
    unexpected = [k for k in stored if k not in used and not adapter.ignored(k, model_cfg)]
    out = []
    where = f"model.init_from={start}"
    if missing:
        out.append(
            f"{where}: {len(missing)} tensor(s) this model reads are not in its safetensors: {_names(missing)} "
            "(an incomplete copy, or a checkpoint of another model: check the folder and model=)"
        )
    if unexpected:
        if all(k.endswith(".bias") for k in unexpected) and model_cfg.get("bias") is False:
            # GPT-2 folders carry biases; gpt_small (bias=false) exports zeros for them
            fix = "the folder's layers have biases: add model.bias=true, or leave model= out (init_from alone)"
        else:
            fix = "a checkpoint of another family or layout: leave model= out (init_from alone) or choose its model="
        out.append(
            f"{where}: {len(unexpected)} tensor(s) in its safetensors that this model has no place for: "
            f"{_names(unexpected)} ({fix})"
        )
    if wrong:
        out.append(f"{where}: {len(wrong)} tensor(s) of another shape than this model's: {_names(wrong)}")
    stored_as = {k: folder.tensors[at] for k, at in located.items() if at}
    not_float = [f"{k} ({t.dtype}, in {t.file.name})" for k, t in stored_as.items() if t.dtype not in FLOAT_DTYPES]
    if not_float:
        out.append(
            f"{where}: {len(not_float)} tensor(s) stored in a dtype that is not a float one ({', '.join(FLOAT_DTYPES)}): "
            f"{_names(not_float)} (a damaged header, or a quantized checkpoint: give the folder of the float model)"
        )
    return out
