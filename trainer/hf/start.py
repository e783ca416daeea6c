"""``python train.py model.init_from=DIR`` alone: the model config is read from DIR's ``config.json``, as
``AutoModelForCausalLM.from_pretrained`` does, instead of the default ``model=``.

The family is the one whose Hugging Face adapter reads ``config.json``'s ``model_type``; every size comes from
the adapter's ``model_config`` and the training-relevant keys (dropout) from its ``training_fields``. The result
replaces ``cfg.model`` as that family's schema (typed, as a ``model=`` option would be), with ``max_seq_len`` at
``${data.seq_len}`` when config.json does not fix it, and the command line's other ``model.*`` overrides applied
over it. An explicit ``model=`` (on the command line, or a config that overrides the default) wins: then the
folder is only checked against it (``trainer/hf/checks.py``), as before.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from models.hf_adapter import HFConfigError
from models.hf_family import hf_model
from models.registry import UnknownModel
from models.spec import hydra_schema
from trainer.hf.folder import HFFolder, HFFolderError

#: the model group's name in the defaults list and on the command line
GROUP = "model"


def default_model_choice() -> str | None:
    """The ``model`` option conf/config.yaml's defaults list chooses (read there: the one place it is set)."""
    import conf

    defaults = OmegaConf.load(Path(conf.__file__).parent / "config.yaml").get("defaults", [])
    for entry in defaults:
        if isinstance(entry, DictConfig) and GROUP in entry:
            return str(entry[GROUP])
    return None


def chose_model(overrides: list[str], choice: str | None) -> bool:
    """Whether the run chose a ``model=`` itself: on the command line, or a choice other than the default (an
    experiment or a config file that overrides /model)."""
    named = any(o.lstrip("+~").split("=", 1)[0] == GROUP for o in overrides)
    return named or (choice is not None and choice != default_model_choice())


def model_overrides(overrides: list[str]) -> list[str]:
    """The keys (below ``model.``) the command line set, ``init_from`` aside."""
    keys = []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key.startswith(f"{GROUP}.") and key != f"{GROUP}.init_from":
            keys.append(key[len(GROUP) + 1 :])
    return keys


class InitFromError(ValueError):
    """config.json cannot describe a meshtrain model; the message names the folder and the fix."""


def adopt(cfg: DictConfig, *, overrides: list[str]) -> list[str]:
    """Replace ``cfg.model`` (in place) by the model ``cfg.model.init_from``'s config.json describes; returns
    notes for the log (what was taken, what could not be carried). Raises InitFromError."""
    start = str(cfg.model.init_from)
    try:
        folder = HFFolder(start)
        hf = folder.config()
    except HFFolderError as exc:
        scratch = ""
        if (Path(start).expanduser() / "config.json").is_file():
            scratch = f"; to pretrain its architecture from random weights: model=hf model.config_dir={start}"
        raise InitFromError(f"{exc}{scratch}") from None
    try:
        backend = str(cfg.model.get("backend", "auto"))
        spec, values, notes = hf_model(hf, start=start, backend=backend, stored=set(folder.tensors))
    except UnknownModel as exc:
        raise InitFromError(str(exc)) from None
    except HFConfigError as exc:
        raise InitFromError(f"model.init_from={start}: {exc}") from None
    fixed = [k for k in values if k not in ("name", "init_from", "rope_scaling")]  # what config.json set
    previous = cfg.model
    model = OmegaConf.structured(hydra_schema(spec.config))  # the mutable twin Hydra composes
    if "max_seq_len" not in values and "max_seq_len" in model:
        values["max_seq_len"] = "${data.seq_len}"
    model = OmegaConf.merge(model, values)
    if "lora" in previous and "lora" in model:  # the run's adapters, which no config.json describes
        model.lora = previous.lora
    for key in model_overrides(overrides):
        if OmegaConf.select(model, key, default=KeyError) is KeyError:
            raise InitFromError(
                f"model.{key}: the {spec.family} model config.json describes (model.init_from={start}) has no such "
                f"key; drop the override, or choose model= yourself"
            )
        OmegaConf.update(model, key, OmegaConf.select(previous, key), merge=False)
    cfg.model = model
    shown = ", ".join(f"{k}={OmegaConf.select(cfg.model, k)}" for k in fixed)
    notes.insert(0, f"model.init_from={start}: the {spec.family} model its config.json describes ({shown})")
    return notes
