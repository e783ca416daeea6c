"""Fixtures for every test under tests/ (unit and integration); plain helpers are in tests/helpers.py."""

from __future__ import annotations

import pytest

from tests.helpers import CONF


@pytest.fixture
def compose_cfg():
    """Compose conf/ with overrides, as Hydra would for train.py (no process started)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from conf.resolvers import register_resolvers
    from conf.schema import register_configs

    register_resolvers()
    register_configs()

    def _compose(*overrides: str, return_hydra_config: bool = False):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=return_hydra_config)

    yield _compose
    GlobalHydra.instance().clear()
