"""Hydra as Hydra users expect it: schemas out of the option lists, enum-typed choices refused at compose time,
parallel options that set parallel keys only, searches that are multiruns by themselves. (meshtrain's own --help on
one screen, shell completion and a typo's exit code, as processes: tests/integration/test_command_line_processes.py.)"""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import CONF


def test_schemas_are_not_choices():
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    from conf.schema import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        options = {g: loader.get_group_options(g, ObjectType.CONFIG) for g in ("model", "data", "optim")}
        schemas = loader.get_group_options("schema/model", ObjectType.CONFIG)
    assert not [o for opts in options.values() for o in opts if "schema" in o], options
    assert {"gpt", "cnn"} <= set(schemas)


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.decay=linearr", "Invalid value 'linearr', expected one of [cosine, linear, constant]"),
        ("logger.wandb.mode=ofline", "Invalid value 'ofline', expected one of [offline, online, disabled]"),
        ("trainer.on_nonfinite=ignore", "Invalid value 'ignore', expected one of [stop, skip]"),
        ("topology.device=tpu", "Invalid value 'tpu', expected one of [auto, cpu, cuda]"),
        ("trainer.precision=fp16", "Invalid value 'fp16', expected one of [fp32, bf16-mixed, bf16, fp8]"),
        ("trainer.precision=bf16_mixed", "Invalid value 'bf16_mixed', expected one of [fp32, bf16-mixed, bf16, fp8]"),
        ("trainer.activation_checkpointing=some", "Invalid value 'some', expected one of [none, selective, full]"),
        ("trainer.fp8.recipe=blockwise", "Invalid value 'blockwise', expected one of [tensorwise, rowwise]"),
    ],
)
def test_typo_in_a_choice_fails_at_compose_time(compose_cfg, override, message):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg(override)
    assert message in str(err.value.__cause__) and override.split("=")[0] in str(err.value.__cause__)


def test_choices_reach_workers_as_plain_strings(compose_cfg):
    from trainer.task import resolved_container

    cfg = compose_cfg("parallel=pp", "pp.schedule=gpipe")
    assert cfg.pp.schedule == "gpipe" and f"{cfg.pp.schedule}" == "gpipe"
    plain = resolved_container(cfg)
    assert type(plain["pp"]["schedule"]) is str and type(plain["optim"]["decay"]) is str


def test_parallel_options_set_parallel_keys_only():
    for path in sorted((CONF / "parallel").glob("*.yaml")):
        keys = set(yaml.safe_load(path.read_text()))
        assert keys <= {"defaults", "parallel", "dp", "tp", "pp", "mp"}, f"{path.name} sets {keys}"


def test_hparams_search_is_a_multirun_by_itself(compose_cfg):
    cfg = compose_cfg("hparams_search=pp_throughput", return_hydra_config=True)
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
