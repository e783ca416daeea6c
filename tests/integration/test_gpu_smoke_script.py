"""benchmarks/gpu_smoke.py's code path on CPU: its reduced configuration, a few steps, results read back. It runs
fp8 (torchao's emulation here), the GPU session's second precision; bf16-mixed differs by the value only and is
trained under every strategy in tests/integration/test_precision_ac_compile_runs.py."""

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
        [sys.executable, str(ROOT / "benchmarks" / "gpu_smoke.py"), "--tiny", "--precision", "fp8"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpu_smoke on CPU (reduced configuration" in proc.stdout
    results = {(r["run"], r["precision"]): r for r in json.loads(out.read_text())}
    assert set(results) == {("single", "fp8"), ("fsdp", "fp8")}
    for (name, precision), r in results.items():
        assert f"trainer.precision={precision}" in r["command"] and "model=llama_debug" in r["command"]
        assert r["world_size"] == (2 if name == "fsdp" else 1)
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["peak_memory_bytes_max"] > 2**20
        assert r["peak_saved_activation_bytes_max"] > 0
        assert f"{precision:>10} {name:>6} x{r['world_size']}:" in proc.stdout and "MFU" in proc.stdout
