"""Hydra as Hydra users expect it: meshtrain's own --help on one screen, schemas out of the option lists,
enum-typed choices refused at compose time, parallel options that set parallel keys only, searches that
are multiruns by themselves."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.helpers import CONF, ROOT, refused_before_torch


@pytest.fixture(scope="module")
def help_text() -> str:
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def help_groups(lines: list[str]) -> dict[str, str]:
    """The '== Groups ==' table: group -> its options, a long list's wrapped lines joined to their group's."""
    table = lines[lines.index("== Groups (group=option) ==") + 1 :]
    groups: dict[str, str] = {}
    for line in table[: table.index("")]:
        if line.startswith("   "):  # a wrapped line continues the group above
            last = next(reversed(groups))
            groups[last] = f"{groups[last]} {line.strip()}"
        else:
            name, options = line.split(None, 1)
            groups[name] = options
    return groups


def test_help_is_meshtrains_own_and_fits_one_screen(help_text):
    lines = help_text.rstrip().splitlines()
    assert len(lines) <= 45 and max(len(line) for line in lines) <= 110, (len(lines), max(map(len, lines)))
    assert lines[0].startswith("meshtrain: distributed training") and "Powered by Hydra" not in help_text
    groups = help_groups(lines)
    assert groups["parallel"].split(", ") == ["auto", "ddp", "dp", "fsdp", "hybrid", "mp", "pp", "single", "tp"]
    assert (
        "gpt_small" in groups["model"]
        and groups["optim"] == "adamw, muon, sgd"
        and groups["data"] == "chat, images, preference, text, tokens"
    )
    # schemas are not options, Hydra's own groups are not listed
    assert "schema" not in help_text and "hydra/" not in help_text
    # main keys with the values their enum types accept, and example commands
    assert "gpipe|1f1b|interleaved_1f1b" in help_text and "offline|online|disabled" in help_text
    assert "cosine|linear|constant" in help_text and "stop|skip" in help_text
    assert "meshtrain parallel=hybrid pp.micro_batches=8" in help_text
    # every degree (ep borrows its ranks, so it is not in the world size), and fine-tuning's keys (issue 42)
    keys = {line.split("  ")[1].strip(): line for line in lines if line.startswith("  ") and "  " in line[2:]}
    assert "the world size is dp x tp x pp x cp" in keys["dp.size tp.size pp.size cp.size"]
    assert "borrowed from dp x cp" in keys["ep.size"]
    assert "model.init_from" in keys and "model.lora.rank" in keys


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


def test_typo_on_the_command_line_starts_nothing(tmp_path):
    """Refused as Hydra composes: exit 2, no worker, and before torch is imported (what keeps a refusal fast)."""
    run = refused_before_torch("optim.decay=linearr", run_dir=tmp_path / "run")
    assert "Invalid value 'linearr', expected one of [cosine, linear, constant]" in run.output
    assert "full_key: optim.decay" in run.output and not (tmp_path / "run" / "logs").exists()


def test_choices_reach_workers_as_plain_strings(compose_cfg):
    from trainer.validate import resolved_container

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


def test_shell_completion_offers_options_not_schemas():
    env = {**os.environ, "COMP_LINE": "python train.py model="}
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "-sc", "query=bash"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    options = out.stdout.split()
    assert "model=gpt_small" in options and not [o for o in options if "schema" in o]
