"""``model=hf``, any decoder-only architecture transformers knows (its config.json from ``model.config_dir``, here
a tiny random Mistral written by transformers), composes with conf/config.yaml's data=text and instantiates as
WorkerContext.build_model does. The ``hf`` case of tests/unit/test_config_groups.py::test_model_option_instantiates,
moved here with its assertion unchanged: building a transformers model loads transformers' modelling code, which
the fast tier never does (tests/unit/conftest.py)."""

from __future__ import annotations

from hydra.utils import instantiate

from models.spec import builder_kwargs
from tests.hf_helpers import save_architecture


def test_model_hf_instantiates(compose_cfg, tmp_path):
    cfg = compose_cfg("model=hf", f"model.config_dir={save_architecture('mistral', tmp_path / 'mistral')}")
    assert "num_classes" not in cfg.model and "d_model" not in cfg.model  # text, and no full-size skip applies
    model = instantiate(builder_kwargs(cfg.model))  # as WorkerContext.build_model: without meshtrain's own keys
    assert sum(p.numel() for p in model.parameters()) > 0
