"""benchmarks/gpu_smoke.py's code path on CPU: its reduced configuration, a few steps, results read back."""

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
        [sys.executable, str(ROOT / "benchmarks" / "gpu_smoke.py"), "--tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpu_smoke on CPU (reduced configuration" in proc.stdout
    results = {r["run"]: r for r in json.loads(out.read_text())}
    assert set(results) == {"single", "fsdp"} and results["fsdp"]["world_size"] == 2
    for name, r in results.items():
        assert "trainer.precision=bf16-mixed" in r["command"] and "model=llama_debug" in r["command"]
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["peak_memory_bytes_max"] > 2**20
        assert r["peak_saved_activation_bytes_max"] > 0
        assert f"{name:>6} x{r['world_size']}:" in proc.stdout and "MFU" in proc.stdout
