"""Bring your own model, as docs/models.md shows: a module and a ModelSpec outside meshtrain
(``tests/byo_model/``) and a YAML naming them; validation reads the user's spec (training it:
tests/integration/test_byo_model_trains.py)."""

from __future__ import annotations

import pytest

from tests.byo_model import write_user_conf


@pytest.fixture(scope="module")
def search_path(tmp_path_factory):
    return write_user_conf(tmp_path_factory.mktemp("user"))


def test_spec_is_found_from_the_yaml_and_checks_the_config(compose_cfg, search_path):
    from models.registry import spec_for
    from trainer.validate import ConfigError, validate

    cfg = compose_cfg("model=mlp_lm", search_path, "parallel=pp")
    spec = spec_for(cfg.model)
    assert spec.family == "mlp_lm" and spec.n_blocks(cfg.model) == 4
    assert validate(cfg).layout.pp == 2
    with pytest.raises(ConfigError) as bad:
        validate(compose_cfg("model=mlp_lm", search_path, "+model.widht=3"))
    assert "widht" in str(bad.value) and "MLPLMConfig" in str(bad.value)
    with pytest.raises(ConfigError) as odd:
        validate(compose_cfg("model=mlp_lm", search_path, "model.width=33"))
    assert "model.width=33: must be even" in str(odd.value)
    with pytest.raises(ConfigError) as no_tp:
        validate(compose_cfg("model=mlp_lm", search_path, "parallel=tp"))
    assert "model family 'mlp_lm' has no tensor-parallel plan" in str(no_tp.value)
    with pytest.raises(ConfigError) as deep:
        validate(compose_cfg("model=mlp_lm", search_path, "parallel=pp", "pp.size=2", "model.n_blocks=1"))
    assert "= 2 stages but 1 blocks in the model (its ModelSpec.blocks)" in str(deep.value)


def test_register_adds_a_family():
    from models.registry import REGISTRY, register, spec_for
    from tests.byo_model.spec import SPEC

    try:
        register(SPEC)
        assert spec_for({"family": "mlp_lm"}) is SPEC
        assert spec_for({"_target_": "tests.byo_model.model.MLPLM"}) is SPEC  # found by its builder too
    finally:
        REGISTRY.pop("mlp_lm", None)
