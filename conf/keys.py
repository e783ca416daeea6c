"""Keys that no part of meshtrain reads: refused, with the nearest key that exists.

Hydra's ``+key=value`` (and ``++key=value``, or a key a user's config file adds) puts any key into the composed
config, and a typo there (``+paralel=fsdp``, ``+trainer.max_step=5``) would train as if it were not written. Each
section of the config is typed by its schema (conf/schema.py, a family's config): a key is read when the schema
has it, or when the section's ``_target_`` takes it as an argument (``+optim.fused=false`` reaches the optimizer
class; ``parallel``, ``data`` and ``model`` are built from theirs the same way). Untyped sections (``optim.scheduler``,
a callback's arguments) are the user's own and not looked into. The target is imported only when a key is
unknown to the schema, so a valid config costs no import. Validation (trainer/checks/keys.py) and
``python -m parallel.plan`` refuse them; train.py, ``meshtrain`` and the planner follow Hydra's own "use +key" hint
with whether the key exists (``append_hint``).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from models.spec import import_object


def _typed_children(node: DictConfig):
    content = node.__dict__["_content"]  # key -> child node, what ``_get_node`` looks up (15x faster as a dict here)
    pairs = content.items() if isinstance(content, dict) else ((k, node._get_node(k)) for k in node.keys())
    for key, child in pairs:
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            yield str(key), child


#: the packages of meshtrain's own targets: their sections' keys are their schemas' (a target's ``**kwargs`` there
#: passes nothing on to a user); any other target (``torch.optim.AdamW``, a user's dataset) takes its own arguments
OWN_PACKAGES = ("models.", "parallel.", "trainer.")


def _target_arguments(node: DictConfig) -> set[str] | None:
    """The keyword arguments a foreign ``_target_`` of ``node`` takes (None: any, or it cannot be read here)."""
    target = OmegaConf.select(node, "_target_", throw_on_resolution_failure=False)
    if target is None or str(target).startswith(OWN_PACKAGES):
        return set()
    try:
        params = inspect.signature(import_object(str(target))).parameters.values()
    except Exception:  # noqa: BLE001 - an unimportable target is another check's problem
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind is not p.VAR_POSITIONAL}


def unread_keys(cfg: DictConfig) -> dict[str, set[str]]:
    """The dotted keys of ``cfg`` that their schemas lack and no ``_target_`` takes, in config order, each with the
    keys that its section does read (for the nearest one)."""
    found: dict[str, set[str]] = {}

    def walk(node: DictConfig, prefix: str) -> None:
        typ = OmegaConf.get_type(node)
        if typ is None or not dataclasses.is_dataclass(typ):
            return  # a free-form section: the user's own keys
        known = {f.name for f in dataclasses.fields(typ)}
        unknown = [str(k) for k in node.keys() if str(k) not in known]
        if unknown:
            taken = _target_arguments(node)
            for key in unknown:
                if taken is not None and key not in taken:
                    found[f"{prefix}{key}"] = {k for k in known | taken if not k.startswith("_")}
        for key, child in _typed_children(node):
            if key in known:
                walk(child, f"{prefix}{key}.")

    walk(cfg, "")
    return found


def nearest_key(key: str, siblings: set[str]) -> str | None:
    """The key beside ``key`` (``siblings``: the names its section reads) most like it (difflib), with its section's
    prefix; None when none is close."""
    prefix, _, leaf = key.rpartition(".")
    close = difflib.get_close_matches(leaf, sorted(siblings), n=1, cutoff=0.6)
    return f"{prefix}.{close[0]}" if close and prefix else (close[0] if close else None)


def _shown(value: Any) -> str:
    """``value`` as a command line writes it."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def unread_problems(cfg: DictConfig) -> list[str]:
    """``key=value: ...; did you mean ...?`` for each key of ``cfg`` nothing reads."""
    out = []
    for key, siblings in unread_keys(cfg).items():
        value = _shown(OmegaConf.select(cfg, key, throw_on_resolution_failure=False))
        near = nearest_key(key, siblings)
        fix = f"did you mean {near}={value}?" if near else "drop it"
        out.append(f"{key}={value}: no key '{key}' exists, so nothing in meshtrain would read it; {fix}")
    return out


# ---- Hydra's "To append to your config use +key=value" -------------------------------------------------------

APPEND = re.compile(r"Could not override '([^']+)'\.\s*To append to your config use \+(\S+)")


def schema_sections() -> dict[str, set[str]]:
    """Section prefix (``""``, ``"trainer."`` ...) -> the names every schema of it has: the root's and each
    ``schema/<group>/<shape>`` in Hydra's ConfigStore (every model family, data kind, optimizer)."""
    from hydra.core.config_store import ConfigStore

    from conf.schema import SCHEMA_ROOT, MeshtrainConfig

    sections: dict[str, set[str]] = {}

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, DictConfig):
            return
        names = sections.setdefault(prefix, set())
        for key in node.keys():
            names.add(str(key))
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                walk(child, f"{prefix}{key}.")

    walk(OmegaConf.structured(MeshtrainConfig), "")
    for group, options in ConfigStore.instance().repo.get(SCHEMA_ROOT, {}).items():
        for option in options.values():
            walk(OmegaConf.structured(option.node), f"{group}.")
    return sections


def append_hint(message: str) -> str | None:
    """What to say after Hydra's "To append to your config use +key=value": whether that key exists, and the nearest
    one; None when ``message`` is another error."""
    found = APPEND.search(message)
    if found is None:
        return None
    key, line = found.group(1), found.group(2)
    value = line.partition("=")[2]
    prefix, _, leaf = key.rpartition(".")
    names = {n for n in schema_sections().get(f"{prefix}." if prefix else "", set()) if not n.startswith("_")}
    if leaf in names:
        return (
            f"meshtrain: '{key}' is a key of other {prefix}= options, not of this run's: choose one that has it; "
            f"+{line} would add a key nothing reads (refused)"
        )
    near = nearest_key(key, names)
    fix = f"did you mean {near}={value}?" if near else "drop it"
    return f"meshtrain: no key '{key}' exists, and +{line} would add a key nothing reads (refused); {fix}"
