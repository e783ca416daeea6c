"""Compose conf/ with overrides in the test process, as Hydra composes it for train.py, many times over.

Hydra's compose takes ~0.1 s here, most of it building the defaults tree of the config-group choices
(``model=cnn_bn`` ...). ``Composer`` composes each set of group choices once, then applies the key=value overrides
to a copy with Hydra's own code (``ConfigLoaderImpl._apply_overrides_to_config``), which is what compose does after
merging the defaults. Overrides of Hydra's own keys (``hydra.searchpath`` ...) belong to the composition.

Each composition it does make runs Hydra's own ``compose`` with two of its costs paid once per process
(``parsed_once``): the YAML files are parsed once, and the ConfigStore is not deep-copied each time.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import pickle
from pathlib import Path

import yaml


@functools.cache
def primary_choices(conf_dir: Path) -> dict[str, str]:
    """conf/config.yaml's own group choices (``model: gpt_small`` ...): the groups whose option a command line may
    name or leave out alike."""
    entries = yaml.safe_load((conf_dir / "config.yaml").read_text())["defaults"]
    return {k: v for e in entries if isinstance(e, dict) for k, v in e.items() if isinstance(v, str) and "/" not in k}


def canonical(groups: tuple[str, ...], conf_dir: Path) -> tuple[str, ...]:
    """``groups`` without the choices conf/config.yaml makes anyway (``model=gpt_small``): composed with or without
    them, Hydra's defaults list, and so the config, is the same. Only where every choice is of such a group: an
    option of another group (``experiment=add_pp``) may override a group, and then an explicit default wins."""
    primary = primary_choices(conf_dir)
    pairs = [g.split("=", 1) for g in groups]
    keys = [key for key, _ in pairs]
    if any(key not in primary for key in keys) or len(set(keys)) < len(keys):  # a +/~ prefix, a Hydra group, a
        return groups  # global option, or a group chosen twice: composed as written
    return tuple(g for g, (key, value) in zip(groups, pairs) if primary[key] != value)


#: each YAML file Hydra parsed in this process, pickled: (source, config path, file stamp) -> ConfigResult
_PARSED: dict[tuple, bytes] = {}


@contextlib.contextmanager
def parsed_once():
    """Hydra's compose, less two costs it pays on every composition (130 -> 80 ms a composition here, measured): parsing each YAML file
    of conf/ and hydra.conf again (a fresh copy of the first parse is the same ConfigResult; a file's stamp, its
    mtime and size, is in the key), and deep-copying the whole ConfigStore with the repository it copies "to avoid
    mutating it with initialize_sources()" (initialize_sources builds new sources on the one ConfigStore anyway:
    the copy is shared with it, as Hydra's fresh sources are)."""
    from hydra._internal.config_repository import CachingConfigRepository
    from hydra._internal.core_plugins.file_config_source import FileConfigSource
    from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource
    from hydra.core.config_store import ConfigStore

    def parsed(load, stamp):
        def load_config(self, config_path: str):
            key = (type(self).__name__, self.path, config_path, stamp(self, config_path))
            if key not in _PARSED:
                _PARSED[key] = pickle.dumps(load(self, config_path))
            return pickle.loads(_PARSED[key])

        return load_config

    def file_stamp(source, config_path: str):
        full = os.path.join(source.path, source._normalize_file_name(config_path))
        with contextlib.suppress(OSError):
            st = os.stat(full)
            return st.st_mtime_ns, st.st_size
        return None

    def package_stamp(source, config_path: str) -> None:
        return None  # hydra.conf's files, installed with Hydra

    def repo_copy(self, delegate) -> None:
        store = ConfigStore.instance()
        self.delegate = copy.deepcopy(delegate, {id(store): store})
        self.cache = {}

    patched = [
        (FileConfigSource, "load_config", parsed(FileConfigSource.load_config, file_stamp)),
        (
            ImportlibResourcesConfigSource,
            "load_config",
            parsed(ImportlibResourcesConfigSource.load_config, package_stamp),
        ),
        (CachingConfigRepository, "__init__", repo_copy),
    ]
    saved = [(cls, name, cls.__dict__[name]) for cls, name, _ in patched]
    try:
        for cls, name, new in patched:
            setattr(cls, name, new)
        yield
    finally:
        for cls, name, old in saved:
            setattr(cls, name, old)


def is_composition(override: str) -> bool:
    """A group choice (``model=cnn_bn``, ``+llama_case=x``, ``hydra/launcher=slurm``) or a Hydra key."""
    key = override.split("=", 1)[0].lstrip("+~")
    return "." not in key or key.startswith("hydra.")


class Composer:
    """``composer(overrides)``: the composed config (a fresh copy each call). Needs an initialized Hydra
    (``initialize_config_dir``) on a cache miss only."""

    def __init__(self, conf_dir: Path | None = None) -> None:
        self.bases: dict[tuple[str, ...], bytes] = {}  # each composition, pickled
        self.conf_dir = conf_dir  # the primary config's folder: its own group choices are not composed twice

    def __call__(self, overrides: list[str] | tuple[str, ...], *, initialize=None):
        from hydra import compose
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.core.override_parser.overrides_parser import OverridesParser

        groups = tuple(sorted(o for o in overrides if is_composition(o)))  # Hydra takes group choices in any order
        if self.conf_dir is not None:
            groups = canonical(groups, self.conf_dir)
        if groups not in self.bases:
            with parsed_once(), initialize() if initialize is not None else contextlib.nullcontext():
                base = compose("config", overrides=list(groups))
            self.bases[groups] = pickle.dumps(base)
        cfg = pickle.loads(self.bases[groups])  # a fresh copy: 7x cheaper than copy.deepcopy of a DictConfig
        rest = [o for o in overrides if not is_composition(o)]
        if rest:
            ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(rest), cfg)
        return cfg
