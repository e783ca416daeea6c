"""The README's commands (and docs/ blocks marked runnable) each have a plan (tests/readme_commands.py): run by
tests/integration/test_readme_commands.py, composed and validated here in one process, covered by a named test
that exists, or skipped with a reason. A new command without a plan, or a plan for a command no page prints,
fails here."""

from __future__ import annotations

import ast
import re

from tests.readme_commands import (
    PLANS,
    ROOT,
    Compose,
    Covered,
    Run,
    Skip,
    all_commands,
    fenced_blocks,
    printed_words,
    python_blocks,
)

#: the scenarios tests/integration/test_readme_commands.py runs, one test each
SCENARIOS = ("default_job", "default_export", "own_data", "hugging_face")


def test_every_printed_command_has_a_plan_and_every_plan_a_printed_command():
    printed = all_commands()
    missing = {cmd: where for cmd, where in printed.items() if cmd not in PLANS}
    stale = sorted(set(PLANS) - set(printed))
    assert not missing, f"commands without a plan in tests/readme_commands.py PLANS: {missing}"
    assert not stale, f"plans for commands no page prints any more: {stale}"
    assert {s for p in PLANS.values() if isinstance(p, Run) for s in p.scenarios} == set(SCENARIOS)
    assert all(p.reason for p in PLANS.values() if isinstance(p, Skip))


def test_covering_tests_exist():
    """Each Covered plan names a test function that is there (renaming it fails here, not in silence)."""
    absent = []
    for cmd, plan in PLANS.items():
        if not isinstance(plan, Covered):
            continue
        path, _, name = plan.test.partition("::")
        file = ROOT / path
        names = (
            {n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)}
            if file.is_file()
            else set()
        )
        if not name.startswith("test_") or name not in names:
            absent.append(f"{cmd!r}: {plan.test}")
    assert not absent, "covering tests that do not exist:\n" + "\n".join(absent)


def train_overrides(words: list[str]) -> list[str]:
    """A ``python train.py`` / ``meshtrain`` command's overrides, without the flags that only print the config."""
    start = 2 if words[:2] == ["python", "train.py"] else 1
    assert words[0] == "meshtrain" or start == 2, words
    flags = {"--cfg", "job", "--resolve", "[--resolve]"}
    return [w for w in words[start:] if w not in flags]


def test_commands_that_only_compose_compose_and_validate(compose_cfg):
    """Every Compose plan in one process: Hydra composes it as train.py would and the pre-spawn validation passes
    (no worker started)."""
    from trainer.validate import validate

    composed = 0
    for cmd, plan in PLANS.items():
        if isinstance(plan, Compose):
            overrides = train_overrides(printed_words(cmd))
            cfg = compose_cfg(*overrides)
            assert validate(cfg).layout.world_size >= 1, cmd
            composed += 1
    assert composed >= 15


def test_experiment_hybrid_is_the_readme_hybrid_command_for_50_steps(compose_cfg):
    """README: ``python train.py parallel=hybrid pp.micro_batches=8`` and ``experiment=hybrid``, "the same with
    trainer.max_steps=50"."""
    experiment = compose_cfg("experiment=hybrid")
    command = compose_cfg(*train_overrides(printed_words("python train.py parallel=hybrid pp.micro_batches=8")))
    for key in ("parallel", "dp", "tp", "pp", "model", "data", "optim", "topology"):
        assert experiment[key] == command[key], key
    assert experiment.pp.micro_batches == 8 and experiment.trainer.max_steps == 50
    assert "`experiment=hybrid`: the same with `trainer.max_steps=50`" in (ROOT / "README.md").read_text()


def test_readme_files_are_the_ones_tests_read():
    """The user config dir's yaml blocks are read from README.md by test_meshtrain_command (pasted as printed); the
    one python block is the pipeline snippet tests/integration/test_readme_commands.py runs."""
    covering = (ROOT / "tests/integration/test_meshtrain_command.py").read_text()
    yaml_blocks = [b for b in fenced_blocks(ROOT / "README.md") if b.lang == "yaml"]
    assert len(yaml_blocks) == 2
    for block in yaml_blocks:
        named = re.findall(r"^# (~/my_conf/\S+\.yaml)$", block.text, flags=re.M)
        assert len(named) == 1 and f'readme_file("{named[0]}")' in covering, block.text
    assert block.text.startswith("# @package _global_\n")  # the experiment: its header on line 1
    [snippet] = python_blocks()
    assert 'pipeline("text-generation", model="exported/")' in snippet.text
