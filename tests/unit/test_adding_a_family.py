"""Adding a family is its folder, one ``register(...)`` line and its YAML: a dense decoder defined entirely inside
tests/ (tests/families/tiny_decoder/) composes, validates (its own checks answer) and trains two steps under
parallel=single, in this process. docs/models.md, "Adding a family"."""

from __future__ import annotations

import json

import pytest

from tests.composing import Composer
from tests.families.tiny_decoder import write_conf
from tests.helpers import CONF, FAST
from trainer.validate import ConfigError, validate


@pytest.fixture
def registered(monkeypatch):
    """The registry and ConfigStore as a family's import would leave them, undone after the test."""
    import models.registry

    monkeypatch.setattr(models.registry, "REGISTRY", dict(models.registry.REGISTRY))
    from models.registry import register
    from tests.families.tiny_decoder.spec import SPEC

    register(SPEC)  # the one line a family adds to models/registry.py (BUILT_IN), here made by the test

    from conf.resolvers import register_resolvers
    from conf.schema import register_configs

    register_resolvers()
    register_configs()  # the family's schema comes from the registry
    return SPEC


#: this module's compositions: conf/ with the family's YAML on Hydra's search path, each composed once
COMPOSER = Composer()


def compose(search_path: str, *overrides: str):
    """conf/ with ``model=tiny_decoder`` from ``search_path`` as train.py composes it: the group choices and the search
    path composed once (tests/composing.py), the key=value ``overrides`` applied to a copy."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    def initialize():
        GlobalHydra.instance().clear()
        return initialize_config_dir(config_dir=str(CONF), version_base="1.3")

    return COMPOSER(["model=tiny_decoder", search_path, *overrides], initialize=initialize)


def test_the_family_is_found_by_its_name_and_checked_by_its_spec(registered, tmp_path):
    from models.registry import spec_for

    search_path = write_conf(tmp_path)
    cfg = compose(search_path, "parallel=single")
    assert spec_for(cfg.model) is registered
    validate(cfg, environ={})
    with pytest.raises(ConfigError) as err:
        validate(compose(search_path, "parallel=single", "model.n_kv_heads=3"), environ={})
    assert "model.n_kv_heads=3 does not divide model.n_heads=4" in str(err.value)
    with pytest.raises(ConfigError) as err:  # its d_ff rule is Llama's, and the message says so
        validate(compose(search_path, "parallel=single", "model.d_ff=-1"), environ={})
    assert "model.d_ff=-1: must be >= 0 (0 means Llama's rule" in str(err.value)


def test_the_family_trains_two_steps(registered, tmp_path):
    from trainer.task import train

    cfg = compose(
        write_conf(tmp_path),
        "parallel=single",
        *FAST,
        "trainer.max_steps=2",
        "trainer.checkpoint_every=0",
        "trainer.prefetch=0",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    run_dir = tmp_path / "run"
    summary = train(cfg, run_dir=run_dir, run_meta={"multirun": False, "overrides": [], "run_name": "tiny"})
    assert summary is not None and summary["status"] == "completed", summary
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(loss == loss and loss > 0 for loss in losses), losses
