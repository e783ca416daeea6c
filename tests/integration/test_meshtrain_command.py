"""The command line as users meet it. ``pip install .`` (not editable) gives a ``meshtrain`` command with the configs packaged, usable from any
folder, and ``--config-dir`` adds a user's own model and experiment without forking.

The fresh virtual environment sees the shared site-packages (torch, hydra, wandb ...) through a ``.pth``
path line, so nothing is downloaded: only meshtrain itself is built and installed (``--no-deps``).
And ``hydra.verbose`` / ``hydra/job_logging`` reach the workers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.helpers import FAST, ROOT, run_train

pytestmark = pytest.mark.slow


def readme_file(path: str) -> str:
    """The README's yaml block whose first lines name ``path`` (as a comment), exactly as printed."""
    for block in re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S):
        if any(line.strip() == f"# {path}" for line in block.splitlines()[:2]):
            return block
    raise AssertionError(f"README.md shows no yaml block for {path}")


# the user config dir as the README prints it (pasted into ~/my_conf)
MY_MODEL = readme_file("~/my_conf/model/my_gpt.yaml")
MY_EXPERIMENT = readme_file("~/my_conf/experiment/my_exp.yaml")


def _copy_source(dest: Path) -> Path:
    """The checkout's files (not .git, .venv or run outputs): the build writes into its source folder."""
    ignore = shutil.ignore_patterns(".git", ".venv", "outputs", "multirun", "build", "*.egg-info", "__pycache__")
    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("install")
    src = _copy_source(base / "src")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    # a path line (not an import line): the shared packages become importable, their .pth hooks do not run
    (site / "shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(src)]
    out = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    work = base / "elsewhere"  # a folder with no meshtrain in it
    (work / "my_conf" / "model").mkdir(parents=True)
    (work / "my_conf" / "experiment").mkdir(parents=True)
    (work / "my_conf" / "model" / "my_gpt.yaml").write_text(MY_MODEL)
    (work / "my_conf" / "experiment" / "my_exp.yaml").write_text(MY_EXPERIMENT)
    return venv, site, work


def _meshtrain(venv: Path, work: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(WANDB_SILENT="true", PYTHONUNBUFFERED="1")
    return subprocess.run(
        [str(venv / "bin" / "meshtrain"), *args], cwd=work, capture_output=True, text=True, timeout=300, env=env
    )


def test_installed_package_carries_its_configs(installed):
    venv, site, work = installed
    assert (venv / "bin" / "meshtrain").exists()
    assert (site / "conf" / "config.yaml").exists() and (site / "conf" / "hydra" / "help" / "meshtrain.yaml").exists()
    assert (site / "conf" / "parallel" / "hybrid.yaml").exists() and (site / "trainer" / "command.py").exists()
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import trainer, conf; print(trainer.__file__, conf.__file__)"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.split() == [str(site / "trainer" / "__init__.py"), str(site / "conf" / "__init__.py")]


def test_meshtrain_composes_from_any_folder(installed):
    venv, _, work = installed
    out = _meshtrain(venv, work, "parallel=hybrid", "pp.micro_batches=8", "--cfg", "job", "--resolve")
    assert out.returncode == 0, out.stderr
    # parallel._target_ is the registry's resolver (${mt_strategy:${.name}}): resolved, it names the class
    assert "_target_: parallel.strategies.hybrid.HybridStrategy" in out.stdout and "micro_batches: 8" in out.stdout
    help_text = _meshtrain(venv, work, "--config-dir", "my_conf", "--help").stdout
    assert "meshtrain: distributed training" in help_text
    assert "my_gpt" in help_text and "my_exp" in help_text and "gpt_schema" not in help_text


def test_meshtrain_trains_a_user_model_and_experiment(installed):
    venv, _, work = installed
    # the README's command; logger=none and log_every=1 keep it short and log every step
    out = _meshtrain(
        venv,
        work,
        "--config-dir",
        "my_conf",
        "experiment=my_exp",
        "logger=none",
        "trainer.log_every=1",
        "hydra.run.dir=outputs/mine",
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run_dir = work / "outputs" / "mine"
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    resolved = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "name: my_gpt" in resolved and "n_layers: 2" in resolved


def test_hydra_verbose_and_job_logging_reach_the_workers(tmp_path):
    run = run_train(
        "parallel=ddp",
        *FAST,
        "trainer.max_steps=2",
        "hydra.verbose=meshtrain",
        "hydra/job_logging=default",
        run_dir=tmp_path / "run",
    )
    logs = tmp_path / "run" / "logs"
    for rank in (0, 1):  # hydra.verbose: each rank logs its debug lines
        assert f"[rank{rank}] DEBUG rank {rank}: layout" in (logs / f"rank{rank}.log").read_text()
    # hydra/job_logging=default on rank 0: Hydra's format on the console and <run dir>/<job name>.log
    job_log = (tmp_path / "run" / "meshtrain.log").read_text()
    assert "[meshtrain][INFO] - done: loss" in job_log and "[meshtrain][DEBUG] - rank 0: layout" in job_log
    assert "[meshtrain][INFO] - done: loss" in run.proc.stdout
