"""The command line as a user types it in bash: ``key=~/path`` and relative paths work, a key nothing reads is refused
with the nearest one (``+paralel=fsdp``), every printed command parses, refusals suggest what runs. In process; the
same through ``python train.py`` (exit 2, no run folder left behind): tests/integration/test_command_line_processes.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conf.command_line import shell_expanded
from tests.helpers import ROOT
from trainer.validate import ConfigError, validate


def problems(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        validate(cfg, environ={})
    return str(err.value)


# ---- ~ and relative paths ---------------------------------------------------------------------------------------


def test_tilde_in_a_value_is_expanded_as_bash_expands_a_path(monkeypatch):
    monkeypatch.setenv("HOME", "/users/me")
    assert shell_expanded(["model.init_from=~/models/Qwen3-0.6B", "data.path=~", "--config-dir=~/conf"]) == [
        "model.init_from=/users/me/models/Qwen3-0.6B",
        "data.path=/users/me",
        "--config-dir=/users/me/conf",
    ]
    assert shell_expanded(["+data.path=~/a,~/b"]) == ["+data.path=/users/me/a,/users/me/b"]  # each sweep value
    kept = ["~model.lora", "parallel=fsdp", "'data.path=~/x'", "x=[~/a]", "data.path=~nobody_by_that_name/x"]
    assert shell_expanded(kept) == kept  # Hydra's delete, no ~, quoted or structured values, an unknown user


def test_relative_paths_are_read_against_the_users_folder_when_the_job_moves(compose_cfg, tmp_path):
    """hydra.job.chdir=true runs the job in its run folder: the user's relative paths still name theirs."""
    from trainer.task import user_paths

    cfg = compose_cfg("data=chat", "data.path=chats.jsonl", "model.init_from='~/models/X'", "trainer.resume=runs/a")
    user_paths(cfg, cwd=tmp_path)
    assert cfg.data.path == str(tmp_path / "chats.jsonl") and cfg.trainer.resume == str(tmp_path / "runs/a")
    assert cfg.model.init_from == str(Path("~/models/X").expanduser())
    assert cfg.data.tokenizer == cfg.model.init_from  # an interpolation follows what it names
    cfg = compose_cfg("trainer.resume=auto")
    user_paths(cfg, cwd=tmp_path)
    assert cfg.trainer.resume == "auto" and cfg.data.path is None  # a word, and no path, stay


# ---- keys nothing reads -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "+paralel=fsdp",
            "paralel=fsdp: no key 'paralel' exists, so nothing in meshtrain would read it; did you mean parallel=fsdp?",
        ),
        ("+trainer.max_step=5", "did you mean trainer.max_steps=5?"),
        ("++dp.sise=2", "did you mean dp.size=2?"),
        ("+model.lora.rnk=8", "did you mean model.lora.rank=8?"),
        ("+optim.fuse=false", "did you mean optim.fused=false?"),  # the optimizer class's own argument
        (
            "+parallel.foo=1",
            "parallel.foo=1: no key 'parallel.foo' exists, so nothing in meshtrain would read it; drop it",
        ),
        ("+data.foo=1", "data.foo=1: no key 'data.foo' exists"),
        ("+model.foo=1", "model.foo=1: no key 'model.foo' exists"),
        ("+whatever.x=1", "whatever={'x': 1}: no key 'whatever' exists"),
    ],
)
def test_a_key_nothing_reads_is_refused_with_the_nearest_one(compose_cfg, override, message):
    assert message in problems(compose_cfg(override))


@pytest.mark.parametrize(
    "overrides",
    [
        ("optim=sgd", "+optim.fused=false"),  # an argument of the optimizer class (torch.optim.SGD)
        ("+model.spec=models.gpt.spec:SPEC",),  # a key the model schema has, added
        ("trainer.callbacks=[{_target_:tests.recording_callback.Recorder,path:x}]",),  # a callback's own
        ("optim.scheduler={_target_:torch.optim.lr_scheduler.StepLR,_partial_:true,step_size:10}",),
        ("model.lora.rank=8",),
    ],
)
def test_keys_something_reads_are_accepted(compose_cfg, overrides):
    from conf.keys import unread_keys

    assert unread_keys(compose_cfg(*overrides)) == {}


# ---- a refusal leaves nothing behind --------------------------------------------------------------------------------


# ---- python -m parallel.plan model.init_from=DIR ----------------------------------------------------------------

QWEN3_0_6B = {  # Qwen/Qwen3-0.6B's config.json, the keys a model is built from
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
}


def test_the_planner_plans_the_folders_model_as_training_builds_it(compose_cfg, tmp_path, monkeypatch, capsys):
    import json
    import struct

    from models.registry import model_shape
    from parallel.plan.cli import main
    from tests.planning import plan_cli_composes_once
    from trainer.hf.start import adopt
    from trainer.typed.run_spec import model_config

    plan_cli_composes_once(monkeypatch)  # the command's own Hydra compose runs in the test below
    folder = tmp_path / "models" / "Qwen3-0.6B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(QWEN3_0_6B))
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")  # training opens it; no tensor needed
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["model.init_from=~/models/Qwen3-0.6B", "--json", "--top", "1"]) == 0
    planned = json.loads(capsys.readouterr().out)["model"]
    cfg = compose_cfg(f"model.init_from={folder}")
    adopt(cfg, overrides=[f"model.init_from={folder}"])  # what train.py model.init_from=DIR trains
    trained = model_shape(model_config(cfg))
    assert planned["name"] == "Qwen3-0.6B" and planned["params"] == trained.params
    assert (planned["n_layers"], planned["d_model"], planned["vocab_size"]) == (28, 1024, 151936)

    (folder / "config.json").write_text(json.dumps({**QWEN3_0_6B, "model_type": "no_such_model"}))
    assert main([f"model.init_from={folder}"]) == 2  # no family reads it, and transformers knows no such model
    assert "model_type='no_such_model' is not a causal language model" in capsys.readouterr().err
    assert main([f"model.init_from={tmp_path / 'nowhere'}"]) == 2
    assert "no readable config.json" in capsys.readouterr().err


# ---- refusals whose suggestions run ---------------------------------------------------------------------------------

#: refused runs (one problem each) whose message suggests what to run instead
REFUSED = [
    ("cp.size=2",),  # under ddp: hybrid with the run's degrees (not hybrid's dp2 x tp2 x pp2 on top: 16 ranks)
    ("tp.size=2",),
    ("ep.size=2",),  # a dense model: no expert-parallel layout is suggested
    ("model=llama_debug", "cp.size=2", "data.seq_len=1024"),
    ("topology.nproc_per_node=4",),  # layouts of 4 workers (none with ep for the dense default model)
    ("model=qwen3_moe_debug", "topology.nproc_per_node=4"),
    ("parallel=hybrid", "dp.size=2", "ep.size=2", "tp.size=1", "pp.size=1"),  # ep for a dense model
    ("dp.size=3",),
    ("parallel=hybrid", "topology.nproc_per_node=4"),
    ("parallel=pp", "pp.micro_batches=3"),
    ("parallel=hybrid", "tp.loss_parallel=true"),
]
SUGGESTION = re.compile(
    r"(?:use |: |; )(?P<layout>parallel=\w+(?: [a-z]+\.size=\d+)*)"  # a whole layout (not "with parallel=ddp:")
    r"|set (?P<set>[\w.]+=[\w.\[\]]+)"  # set key=value
    r"|use (?P<use>[\w.]+)=(?P<values>\w+(?: or \d+)*)"  # use key=a or b
    r"|\((?P<choice>model=\w+)\)"
)


def suggestions(problem: str) -> list[list[str]]:
    """Each suggestion of a refusal as the overrides it adds to the command line."""
    out = []
    for m in SUGGESTION.finditer(problem):
        if m["layout"] or m["set"] or m["choice"]:
            out.append((m["layout"] or m["set"] or m["choice"]).split())
        else:
            out += [[f"{m['use']}={v}"] for v in m["values"].split(" or ")]
    return out


@pytest.mark.parametrize("overrides", REFUSED, ids=" ".join)
def test_every_layout_a_refusal_suggests_passes_validation_for_that_run(compose_cfg, overrides):
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*overrides), environ={})
    [problem] = err.value.problems
    found = suggestions(problem)
    assert found, f"no suggestion to run in {problem!r}"
    for words in found:
        if not any("moe" in w for w in (*overrides, *words)):  # a dense model is never sent to expert parallel
            assert not any(re.match(r"ep\.size=[2-9]", w) for w in words), (problem, words)
        try:
            validate(compose_cfg(*overrides, *words), environ={})
        except ConfigError as exc:
            raise AssertionError(f"{' '.join(overrides)}: the suggested {' '.join(words)} is refused: {exc}") from None


# ---- every printed command, as bash passes it --------------------------------------------------------------------

PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|^\[.*\]$|^[A-Z_]+$|=[A-Z_]+$|\|")


def test_every_printed_train_command_parses_as_bash_passes_it(monkeypatch):
    """Every ``python train.py`` / ``meshtrain`` line of every shell block in README.md and docs/ (runnable or not),
    read with bash's word rules, gets past Hydra's override grammar once meshtrain expanded it (``~/models/...``
    unquoted included); placeholders (``HF_DIR``, ``<date>``, ``[--resolve]``, ``...``) aside."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from tests.readme_commands import fenced_blocks

    monkeypatch.setenv("HOME", "/users/me")
    parser = OverridesParser.create()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checked = 0
    for block in (b for page in pages for b in fenced_blocks(page) if b.lang in ("bash", "sh", "shell")):
        for words in block.commands():
            start = 2 if words[:2] == ["python", "train.py"] else 1 if words[:1] == ["meshtrain"] else None
            if start is None or words[start : start + 1] == ["export"]:
                continue
            args = [w for w in words[start:] if "=" in w and not w.startswith("-") and not PLACEHOLDER.search(w)]
            parser.parse_overrides(shell_expanded(args))  # raises as train.py would (LexerNoViableAltException)
            checked += 1
    assert checked >= 30


def test_the_planner_refuses_a_key_nothing_reads_as_training_does(capsys):
    """Through the command's own composition (``parallel.plan.cli.compose``: Hydra's compose, as the command runs)."""
    from parallel.plan.cli import main

    assert main(["+paralel=fsdp"]) == 2
    assert "paralel=fsdp: no key 'paralel' exists" in capsys.readouterr().err
    assert main(["paralel=fsdp"]) == 2  # Hydra's own refusal, followed by the hint (before: a traceback, exit 1)
    err = capsys.readouterr().err
    assert "To append to your config use +paralel=fsdp" in err and "did you mean parallel=fsdp?" in err


OPTIONS = [
    f"{group}={path.stem}"
    for group in ("model", "data", "optim", "parallel", "topology", "logger", "experiment", "hparams_search")
    for path in sorted((ROOT / "conf" / group).glob("*.yaml"))
]


@pytest.mark.parametrize("option", OPTIONS)
def test_every_shipped_option_sets_only_keys_something_reads(compose_cfg, option):
    from conf.keys import unread_keys

    extra = ("model=cnn_bn",) if option == "data=images" else ()
    assert unread_keys(compose_cfg(option, *extra)) == {}
