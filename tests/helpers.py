"""Helpers shared by tests/unit and tests/integration: run train.py as a user would (a real subprocess), read its
outputs back, compare losses. The ``compose_cfg`` fixture lives in tests/conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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


def assert_losses_close(a: list[float], b: list[float], rel: float = 1e-4) -> None:
    assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
    for step, (x, y) in enumerate(zip(a, b), start=1):
        assert abs(x - y) <= rel * abs(y), f"step {step}: {x} vs {y} (rel {abs(x - y) / abs(y):.2e} > {rel})"
