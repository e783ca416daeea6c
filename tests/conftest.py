"""Shared helpers: compose the real config, and run train.py as a user would (a real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

#: small and quick: every multi-process test starts from these
FAST = ("trainer.log_every=1", "logger=none", "data.seq_len=32", "data.global_batch_size=8")


@dataclass
class TrainRun:
    proc: subprocess.CompletedProcess
    run_dir: Path

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr

    def metrics(self) -> list[dict]:
        with open(self.run_dir / "metrics.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def losses(self) -> list[float]:
        return [m["loss"] for m in self.metrics()]


def run_train(
    *overrides: str,
    run_dir: Path,
    expect_ok: bool = True,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    multirun: bool = False,
    cwd: Path = ROOT,
) -> TrainRun:
    """``python train.py OVERRIDES`` with its output folder under ``run_dir``."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    cmd = [sys.executable, str(ROOT / "train.py"), *(["-m"] if multirun else []), *overrides, f"{key}={run_dir}"]
    full_env = {**os.environ, "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
    run = TrainRun(proc=proc, run_dir=run_dir)
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{run.output[-6000:]}")
    return run


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


def assert_losses_close(a: list[float], b: list[float], rel: float = 1e-4) -> None:
    assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
    for step, (x, y) in enumerate(zip(a, b), start=1):
        assert abs(x - y) <= rel * abs(y), f"step {step}: {x} vs {y} (rel {abs(x - y) / abs(y):.2e} > {rel})"


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A one-node Slurm on this machine (benchmarks/slurm_cluster.py), started once for the `slurm` tests.

    Installs Debian's packages if they are missing (CI: .ci/run does it first). If Slurm cannot start, the
    tests fail with the daemons' logs: they are never skipped in silence.
    """
    from benchmarks.slurm_cluster import SlurmUnavailable, start, stop

    root = tmp_path_factory.mktemp("slurm")
    try:
        cluster = start(root, install_missing=True)
    except SlurmUnavailable as exc:
        pytest.fail(f"the one-node Slurm for the `slurm` tests did not start: {exc}", pytrace=False)
    print(f"\none-node Slurm up in {cluster.setup_s:.1f} s ({cluster.conf})")
    yield cluster
    stop(root)
