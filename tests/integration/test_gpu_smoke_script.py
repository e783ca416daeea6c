"""benchmarks/gpu_smoke.py's code path on CPU: its reduced configuration in bf16-mixed and fp8 (torchao's emulation
here), a few steps, results read back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow


def test_gpu_smoke_tiny_on_cpu(tmp_path):
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_smoke.py"), "--tiny", "--precision", "bf16-mixed,fp8"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpu_smoke on CPU (reduced configuration" in proc.stdout
    results = {(r["run"], r["precision"]): r for r in json.loads(out.read_text())}
    assert set(results) == {(n, p) for n in ("single", "fsdp") for p in ("bf16-mixed", "fp8")}
    for (name, precision), r in results.items():
        assert f"trainer.precision={precision}" in r["command"] and "model=llama_debug" in r["command"]
        assert r["world_size"] == (2 if name == "fsdp" else 1)
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["peak_memory_bytes_max"] > 2**20
        assert r["peak_saved_activation_bytes_max"] > 0
        assert f"{precision:>10} {name:>6} x{r['world_size']}:" in proc.stdout and "MFU" in proc.stdout
        # the first step's loss comes before any update: fp8 moves it by float8's rounding only
        bf16 = results[(name, "bf16-mixed")]["first_loss"]
        assert abs(r["first_loss"] - bf16) < 1e-2 * bf16
