"""Compose conf/ with overrides in the test process, as Hydra composes it for train.py, many times over.

Hydra's compose takes ~0.1 s here, most of it building the defaults tree of the config-group choices
(``model=cnn_bn`` ...). ``Composer`` composes each set of group choices once, then applies the key=value overrides
to a copy with Hydra's own code (``ConfigLoaderImpl._apply_overrides_to_config``), which is what compose does after
merging the defaults. Overrides of Hydra's own keys (``hydra.searchpath`` ...) belong to the composition.

Each composition it does make runs Hydra's own ``compose`` less the work Hydra repeats on every one (``lean_hydra``):
YAML files parsed once per process, no deep copy of the whole ConfigStore ...
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
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
#: each ConfigStore node Hydra loaded, pickled: config path -> (the stored ConfigNode, its node pickled)
_STORED: dict[str, tuple[object, bytes]] = {}


@contextlib.contextmanager
def lean_hydra():
    """Hydra's own compose, less work it repeats on every composition (95 -> ~60 ms a composition here, measured;
    the composed configs compare equal to plain Hydra's):

    - each YAML file of conf/ and hydra.conf is parsed once per process: a fresh copy (pickle round trip) of the
      first ConfigResult, keyed by source, path and the file's stamp (mtime and size);
    - a ConfigStore node is copied by a pickle round trip of the stored node instead of ``copy.deepcopy`` (the same
      fresh copy; a node registered again is a new stored object, and copied anew);
    - the repository copy Hydra makes "to avoid mutating it with initialize_sources()" shares the one ConfigStore
      instead of deep-copying it (initialize_sources builds new sources on the one ConfigStore anyway);
    - a defaults list without an interpolation (``- model: ${...}``) gets no interpolation map (Hydra builds one for
      every config with a defaults list; only interpolated entries read it)."""
    from hydra._internal import defaults_list
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

    def store_load(self, config_path: str):
        stored = self._load(config_path)  # what ConfigStore.load copies
        if config_path not in _STORED or _STORED[config_path][0] is not stored:
            _STORED[config_path] = (stored, pickle.dumps(stored.node))
        out = copy.copy(stored)
        out.node = pickle.loads(_STORED[config_path][1])
        return out

    def repo_copy(self, delegate) -> None:
        store = ConfigStore.instance()
        self.delegate = copy.deepcopy(delegate, {id(store): store})
        self.cache = {}

    interpolation_map = defaults_list._create_interpolation_map

    def interpolation_map_if_read(overrides, defaults, self_added):
        if not any(d.is_interpolation() for d in defaults):
            return None  # _create_defaults_tree_impl passes it to interpolated entries only
        return interpolation_map(overrides, defaults, self_added)

    patched = [
        (FileConfigSource, "load_config", parsed(FileConfigSource.load_config, file_stamp)),
        (
            ImportlibResourcesConfigSource,
            "load_config",
            parsed(ImportlibResourcesConfigSource.load_config, package_stamp),
        ),
        (ConfigStore, "load", store_load),
        (CachingConfigRepository, "__init__", repo_copy),
        (defaults_list, "_create_interpolation_map", interpolation_map_if_read),
    ]
    saved = [(owner, name, vars(owner)[name]) for owner, name, _ in patched]
    try:
        for owner, name, new in patched:
            setattr(owner, name, new)
        yield
    finally:
        for owner, name, old in saved:
            setattr(owner, name, old)


def is_composition(override: str) -> bool:
    """A group choice (``model=cnn_bn``, ``+llama_case=x``, ``hydra/launcher=slurm``) or a Hydra key."""
    key = override.split("=", 1)[0].lstrip("+~")
    return "." not in key or key.startswith("hydra.")


class Composer:
    """``composer(overrides)``: the composed config (a fresh copy each call). Needs an initialized Hydra
    (``initialize_config_dir``) on a cache miss only.

    With ``shared`` (a folder every process of one test session sees: the xdist workers'), each composition is
    written there once, pickled, and another process reads it instead of composing it again; one it cannot read (a
    class only the writer defines, a file being written) it composes itself."""

    def __init__(self, conf_dir: Path | None = None, *, shared: Path | None = None) -> None:
        self.bases: dict[tuple[str, ...], bytes] = {}  # each composition, pickled
        self.conf_dir = conf_dir  # the primary config's folder: its own group choices are not composed twice
        self.shared = shared

    def __call__(self, overrides: list[str] | tuple[str, ...], *, initialize=None):
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.core.override_parser.overrides_parser import OverridesParser

        # Hydra takes choices of different groups in any order, and of one group the last: sorted by group, stably
        groups = tuple(sorted((o for o in overrides if is_composition(o)), key=lambda o: o.split("=", 1)[0]))
        if self.conf_dir is not None:
            groups = canonical(groups, self.conf_dir)
        if groups not in self.bases:
            self.bases[groups] = self._from_shared(groups) or self._composed(groups, initialize)
        cfg = pickle.loads(self.bases[groups])  # a fresh copy: 7x cheaper than copy.deepcopy of a DictConfig
        rest = [o for o in overrides if not is_composition(o)]
        if rest:
            ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(rest), cfg)
        return cfg

    def _shared_file(self, groups: tuple[str, ...]) -> Path | None:
        if self.shared is None:
            return None
        key = hashlib.sha256(repr((str(self.conf_dir), groups)).encode()).hexdigest()[:40]
        return self.shared / f"{key}.pkl"

    def _from_shared(self, groups: tuple[str, ...]) -> bytes | None:
        path = self._shared_file(groups)
        try:
            data = path.read_bytes() if path is not None else None
            return data if data is not None and pickle.loads(data) is not None else None
        except Exception:  # noqa: BLE001 - absent, or unreadable here: composed in this process
            return None

    def _composed(self, groups: tuple[str, ...], initialize) -> bytes:
        from hydra import compose

        with lean_hydra(), initialize() if initialize is not None else contextlib.nullcontext():
            data = pickle.dumps(compose("config", overrides=list(groups)))
        path = self._shared_file(groups)
        if path is not None:
            part = path.with_suffix(f".{os.getpid()}.part")
            part.write_bytes(data)
            os.replace(part, path)  # whole or absent for a reader
        return data


@functools.cache
def session_composer(conf_dir: Path) -> Composer:
    """The one Composer of this process for ``conf_dir``: the ``compose_cfg`` fixture (tests/conftest.py, which gives
    it the xdist workers' shared folder) and tests/planning.py compose each set of group choices once between them."""
    return Composer(conf_dir)
