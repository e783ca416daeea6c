"""The config stops at the trainer: ``parallel/`` and ``models/`` take typed objects (``parallel/foundation/run.py``, each
family's frozen config) and never read a composed config. A grep of their sources for ``DictConfig``, ``OmegaConf``
and ``cfg.`` finds nothing outside the planner's command-line entry point, which composes the config and hands typed
objects on (``parallel/plan/cli.py``)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import ROOT

#: what reading a composed config looks like in source
MARKERS = ("DictConfig", "OmegaConf", "cfg.")

#: the packages below the trainer
TYPED_PACKAGES = ("parallel", "models")

#: the one module allowed to read a config: ``python -m parallel.plan`` composes one
ENTRY_POINT = "parallel/plan/cli.py"


def config_reads(root: Path) -> list[str]:
    """``path:line: text`` for every line of ``root``'s typed packages that names a marker, the entry point aside."""
    hits = []
    for package in TYPED_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == ENTRY_POINT:
                continue
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if any(marker in line for marker in MARKERS):
                    hits.append(f"{rel}:{number}: {line.strip()}")
    return hits


def test_parallel_and_models_read_no_config():
    hits = config_reads(ROOT)
    assert not hits, "a config read below the trainer (take a typed object: parallel/foundation/run.py):\n" + "\n".join(
        hits
    )


def test_the_grep_finds_a_planted_config_read(tmp_path):
    for package in TYPED_PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "parallel" / "fine.py").write_text("def f(run):\n    return run.layout.dp\n")
    assert config_reads(tmp_path) == []
    (tmp_path / "models" / "reads.py").write_text("def f(cfg):\n    return cfg.model.n_layers\n")
    (tmp_path / "parallel" / "typed.py").write_text("from omegaconf import DictConfig\n")
    assert config_reads(tmp_path) == [
        "parallel/typed.py:1: from omegaconf import DictConfig",
        "models/reads.py:2: return cfg.model.n_layers",
    ]
    (tmp_path / "parallel" / "plan").mkdir()
    (tmp_path / "parallel" / "plan" / "cli.py").write_text("cfg = compose([])\nn = cfg.model.n_layers\n")
    assert len(config_reads(tmp_path)) == 2  # the entry point may read the config it composes
