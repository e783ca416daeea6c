"""After validation the run is typed, frozen objects: each family's config (its module's one argument, the sizes'
defaults written there once), the ``RunSpec`` the trainer builds for ``parallel/``, and one trainer -> planner
precision mapping."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest
import torch

from models.registry import REGISTRY
from models.spec import ConfigView, hydra_schema, make_config
from parallel.foundation.precision import PLANNER_PRECISIONS, PRECISIONS, planner_precision
from parallel.foundation.run import RunSpec

DECODERS = ("gpt", "llama", "qwen3", "qwen3_moe")
FAMILIES = (*DECODERS, "cnn")


SIZES = {"cnn": {"channels": [4, 8], "num_classes": 3}}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_is_built_from_its_frozen_config(family):
    spec = REGISTRY[family]
    sizes = SIZES.get(family, {"n_layers": 2, "d_model": 32, "n_heads": 4, "vocab_size": 64, "max_seq_len": 16})
    config = spec.config(**sizes)
    assert dataclasses.is_dataclass(config) and spec.config.__dataclass_params__.frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.n_layers = 3  # type: ignore[misc]
    torch.manual_seed(0)
    built = spec.build(config)
    assert spec.takes_config and built.config is config and len(built.layers) == 2
    torch.manual_seed(0)  # the keywords make the same config, so the same weights
    by_keys = type(built)(**sizes)
    assert by_keys.config == config
    for (name, a), (_, b) in zip(built.state_dict().items(), by_keys.state_dict().items()):
        assert torch.equal(a, b), name
    # the module's signature repeats no size: the config is where the defaults live
    params = inspect.signature(type(built).__init__).parameters
    assert list(params) == ["self", "config", "fields"], params


def test_the_config_and_its_keywords_are_not_both_taken():
    from models.gpt.config import GPTConfig
    from models.gpt.model import GPT

    with pytest.raises(TypeError, match=r"not both .*n_layers"):
        GPT(GPTConfig(), n_layers=2)


def test_an_unknown_key_is_named_with_the_keys_there_are():
    from models.gpt.config import GPTConfig

    with pytest.raises(TypeError, match=r"GPTConfig has no key\(s\) \['n_layer'\]; its keys: .*'n_layers'"):
        make_config(GPTConfig, {"n_layer": 2})


def test_nested_values_become_nested_configs_and_hydra_composes_a_mutable_twin(compose_cfg):
    from models.llama.config import LlamaConfig, RopeScaling
    from trainer.typed.run_spec import model_config

    cfg = compose_cfg("model=llama_debug", "model.rope_scaling.factor=8")
    typed = model_config(cfg)
    assert type(typed) is LlamaConfig and type(typed.rope_scaling) is RopeScaling
    assert typed.rope_scaling.factor == 8.0 and typed.n_layers == cfg.model.n_layers
    assert typed.get("n_kv_heads") == cfg.model.n_kv_heads and "rope_theta" in typed and typed["d_model"] > 0
    twin = hydra_schema(LlamaConfig)
    assert not twin.__dataclass_params__.frozen and twin is hydra_schema(LlamaConfig)
    assert cfg.model._metadata.object_type is twin
    assert pickle.loads(pickle.dumps(cfg)).model._metadata.object_type is twin  # a sweep job's config pickles


def test_a_description_for_the_planner_types_as_its_own_schema(compose_cfg):
    from models.gpt.config import GPTDescriptionConfig
    from trainer.typed.run_spec import model_config

    typed = model_config(compose_cfg("model=gpt_175b"))
    assert type(typed) is GPTDescriptionConfig and typed.planner_only and typed.n_layers == 96


def test_a_model_without_a_schema_is_a_read_only_view():
    view = ConfigView({"_target_": "my.Model", "width": 8})
    assert view.width == 8 and view["width"] == 8 and view.get("depth") is None and dict(view)["width"] == 8
    with pytest.raises(AttributeError, match="read-only"):
        view.width = 9
    assert pickle.loads(pickle.dumps(view)) == view


def test_the_run_spec_is_what_the_config_says(compose_cfg):
    from trainer.typed.run_spec import run_spec
    from trainer.validate import validate

    cfg = compose_cfg(
        "parallel=hybrid",
        "dp.size=1",
        "tp.size=2",
        "pp.size=1",
        "model=llama_debug",
        "trainer.precision=bf16-mixed",
        "trainer.activation_checkpointing=selective",
        "tp.sequence_parallel=true",
        "data.micro_batch_size=4",
    )
    run = run_spec(cfg, validate(cfg, environ={}).layout)
    assert isinstance(run, RunSpec) and dataclasses.is_dataclass(run)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.seed = 1  # type: ignore[misc]
    assert run.precision == "bf16-mixed" and run.compose.activation_checkpointing == "selective"
    assert run.compose.sequence_parallel and not run.compose.loss_parallel
    assert run.layout.tp == 2 and run.batch.global_batch_size == cfg.data.global_batch_size
    assert run.batch.accumulation_steps(run.layout.dp) == cfg.data.global_batch_size // 4
    assert run.model.n_layers == cfg.model.n_layers and run.seed == cfg.trainer.seed
    assert run.memory_budget_bytes == cfg.topology.device_memory_gb * 1e9 * cfg.planner.memory_fraction


def test_one_trainer_to_planner_precision_mapping():
    assert {p: planner_precision(p) for p in PRECISIONS} == {
        p: ("fp32" if p == "fp32" else "mixed") for p in PRECISIONS
    }
    assert planner_precision("fp32", device="cuda") == "mixed"  # planner.precision=auto plans a GPU run mixed
    assert planner_precision("fp32", device="cpu") == "fp32"
    assert {planner_precision(PLANNER_PRECISIONS[p].trains_as) for p in PLANNER_PRECISIONS} == set(PLANNER_PRECISIONS)
