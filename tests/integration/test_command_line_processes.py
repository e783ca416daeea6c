"""The command line as processes: each test starts ``python train.py``, ``python -m parallel.plan`` or a fresh
interpreter, because what it checks is a process's: the exit code (2 for every refused command line, with
``HYDRA_FULL_ERROR=1`` too), a refusal before torch is imported and before any worker, ``key=~/path`` as bash passes
it, the run folder a refusal leaves (none), Hydra's own ``--help`` and shell completion, a composed config that
unpickles where nothing was imported, the import-time warnings a new interpreter logs. The same refusals' messages
are asserted in process in tests/unit (validation, composition, the planner's ``main``); these came from there:
the unit tier starts no process."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, refused_before_torch, run_train
from tests.unit.test_pipeline_stages_splits_schedules import BAD

pytestmark = pytest.mark.slow


def train_py(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    """``python train.py ARGS`` as bash starts it from ``cwd`` (no ``hydra.run.dir``: the default outputs/ folder)."""
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def test_tilde_paths_reach_the_config_from_train_py_unquoted(tmp_path):
    """``python train.py model.init_from=~/models/X`` composes (Hydra's grammar alone refuses the ~)."""
    out = train_py(
        "model.init_from=~/models/X", "data=tokens", "data.path=~/data/x", "--cfg", "job", cwd=tmp_path, home=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"init_from: {tmp_path}/models/X" in out.stdout and f"path: {tmp_path}/data/x" in out.stdout


def test_hydra_append_hint_says_whether_the_key_exists(tmp_path):
    """Hydra refuses ``paralel=fsdp`` with "To append to your config use +paralel=fsdp"; meshtrain adds that no such
    key exists and names the nearest (exit 2, before torch), and ``+paralel=fsdp`` is refused too, leaving no folder."""
    run = refused_before_torch("paralel=fsdp", run_dir=tmp_path / "run")
    assert "To append to your config use +paralel=fsdp" in run.output
    assert (
        "meshtrain: no key 'paralel' exists, and +paralel=fsdp would add a key nothing reads (refused); " in run.output
    )
    assert "did you mean parallel=fsdp?" in run.output
    run = refused_before_torch("model=cnn_bn", "data=images", "model.n_layers=3", run_dir=tmp_path / "run")
    assert "'model.n_layers' is a key of other model= options, not of this run's" in run.output
    run = refused_before_torch("+paralel=fsdp", run_dir=tmp_path / "run")
    assert "did you mean parallel=fsdp?" in run.output and not (tmp_path / "run").exists()


def test_a_refused_run_leaves_no_run_folder(tmp_path):
    """A refused command's outputs/<date>/<time> is taken away again (and outputs/ when it made it), so the newest
    folder under outputs/ stays the last run that ran; a folder the user named that existed is kept."""
    earlier = tmp_path / "outputs" / "2026-01-01" / "00-00-00"
    earlier.mkdir(parents=True)
    out = train_py("dp.size=3", cwd=tmp_path, home=tmp_path)
    assert out.returncode == 2 and "dp.size=3" in out.stderr, out.stderr[-2000:]
    assert [p.relative_to(tmp_path) for p in sorted((tmp_path / "outputs").glob("*/*"))] == [
        earlier.relative_to(tmp_path)
    ]
    out = train_py("dp.size=3", cwd=earlier.parent, home=tmp_path)
    assert out.returncode == 2 and sorted(p.name for p in earlier.parent.iterdir()) == ["00-00-00"]  # outputs/ too
    mine = tmp_path / "mine"
    mine.mkdir()
    out = train_py("dp.size=3", f"hydra.run.dir={mine}", cwd=tmp_path, home=tmp_path)
    assert out.returncode == 2 and mine.is_dir()  # the user's own folder is not this run's to remove


# ---- refusals: exit 2, before torch and before any worker ------------------------------------------------------


def test_a_callback_that_does_not_import_exits_2_before_any_worker(tmp_path):
    run = refused_before_torch("trainer.callbacks=[{_target_:no_such_module.Callback}]", run_dir=tmp_path / "run")
    assert "trainer.callbacks[0]._target_=no_such_module.Callback: cannot be imported" in run.proc.stderr
    assert not (tmp_path / "run" / "logs").exists()


def test_bad_config_exits_fast_without_workers(tmp_path):
    """Refused before any worker and before torch is imported (what keeps a refusal fast), with the fix."""
    run = refused_before_torch("data.global_batch_size=15", run_dir=tmp_path / "run")
    assert "data.global_batch_size=15 is not divisible by dp.size=2" in run.proc.stderr
    assert "no worker was started" in run.proc.stderr
    assert "Traceback" not in run.output
    assert not (run.run_dir / "logs").exists(), "a worker started"


def test_unknown_model_option_is_named(tmp_path):
    run = run_train("model=gpt_nonexistent", run_dir=tmp_path / "run", expect_ok=False, timeout=60)
    assert run.proc.returncode != 0
    assert "gpt_nonexistent" in run.output and "gpt_small" in run.output


@pytest.mark.parametrize("full_error", ["", "1"], ids=["plain", "HYDRA_FULL_ERROR"])
def test_override_that_does_not_compose_exits_2(tmp_path, full_error):
    run = run_train(
        "trainer.fial_at_step=3",
        "optim.lr=fast",
        run_dir=tmp_path / "run",
        expect_ok=False,
        timeout=60,
        env={"HYDRA_FULL_ERROR": full_error},
    )
    assert run.proc.returncode == 2, run.output
    assert "fial_at_step" in run.output and "no worker" not in run.output
    assert not (run.run_dir / "logs").exists()
    # HYDRA_FULL_ERROR=1 is what users set to debug: the whole trace, and still the documented code
    assert ("Traceback (most recent call last)" in run.proc.stderr) == bool(full_error), run.proc.stderr[-2000:]


def test_refused_on_the_command_line_without_workers(tmp_path):
    run = run_train(
        "parallel=hybrid",
        "model.n_heads=3",
        "model.d_model=96",
        "logger=none",
        run_dir=tmp_path / "run",
        expect_ok=False,
        timeout=120,
    )
    assert run.proc.returncode == 2
    assert "model.n_heads=3 is not divisible by tp.size=2" in run.output
    assert "no worker was started" in run.output
    assert not (run.run_dir / "logs").exists()


@pytest.mark.parametrize("case", ["1f1b_too_few_micro_batches", "split_out_of_range"])
def test_bad_pipeline_config_exits_2_before_any_worker(case, tmp_path):
    overrides, message = BAD[case]
    run = run_train(*overrides, "logger=none", run_dir=tmp_path / "run", expect_ok=False, timeout=120)
    assert run.proc.returncode == 2, run.output[-2000:]
    assert message in run.output and "no worker was started" in run.output
    assert not (tmp_path / "run" / "logs").exists()  # workers write logs/rank*.log first thing
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ---- Hydra's own: --help, shell completion, a typo in a choice -------------------------------------------------


@pytest.fixture(scope="module")
def help_text() -> str:
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_typo_on_the_command_line_starts_nothing(tmp_path):
    """Refused as Hydra composes: exit 2, no worker, and before torch is imported (what keeps a refusal fast)."""
    run = refused_before_torch("optim.decay=linearr", run_dir=tmp_path / "run")
    assert "Invalid value 'linearr', expected one of [cosine, linear, constant]" in run.output
    assert "full_key: optim.decay" in run.output and not (tmp_path / "run" / "logs").exists()


def test_shell_completion_offers_options_not_schemas():
    env = {**os.environ, "COMP_LINE": "python train.py model="}
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "-sc", "query=bash"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    options = out.stdout.split()
    assert "model=gpt_small" in options and not [o for o in options if "schema" in o]


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


# ---- the planner command, and fresh interpreters ---------------------------------------------------------------


def test_plan_cli_is_torch_free():
    """A plan imports no torch (its refusals, exit 2 with the reason: tests/unit/test_planner_search_and_cli.py)."""
    code = (
        "import sys, parallel.plan.cli as p; rc = p.main(['model=gpt_small', '--top', '3']); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "reason:" in proc.stdout and "ddp" in proc.stdout


def test_composed_configs_unpickle_in_a_fresh_interpreter(compose_cfg, tmp_path):
    """A submitit or Slurm job unpickles the composed config in a new interpreter that has imported nothing: each
    family's Hydra twin (``GPTConfigSchema``, ``LlamaConfigSchema``, ...) must be importable by name."""
    models = ("gpt_small", "gpt_175b", "llama_debug", "llama3_8b", "qwen3_debug", "qwen3_moe_debug", "cnn_bn")
    path = tmp_path / "configs.pkl"
    path.write_bytes(pickle.dumps([pickle.dumps(compose_cfg(f"model={m}")) for m in models]))
    code = "import pickle, sys; print(len([pickle.loads(b) for b in pickle.load(open(sys.argv[1], 'rb'))]))"
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == str(len(models)), out.stderr[-3000:]


def test_torchao_kernel_library_warnings_alone_are_filtered():
    """transformers, peft and lm-eval import torchao whenever it is installed; on a CPU build its import logs a
    'Failed to load .../torchao/_C_....so' warning per CUDA kernel library. Those records alone are dropped."""
    code = (
        "import trainer, logging, torchao\n"
        "logging.getLogger('torchao').warning('Failed to load /x/torchao/_C_mxfp8.abi3.so: no CUDA')\n"
        "logging.getLogger('torchao').warning('another torchao warning')\n"
        "logging.getLogger('torch.utils._pytree').warning('another pytree warning')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Failed to load" not in out.stderr and "KernelPreference" not in out.stderr, out.stderr[-2000:]
    assert "another torchao warning" in out.stderr and "another pytree warning" in out.stderr
