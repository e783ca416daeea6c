"""The cost model beside real runs: one layout per strategy family (single, ddp, fsdp, tp, mp, pp 1F1B), the
calibration that feeds it, and the report ``benchmarks/planner.py`` writes.

Only what is deterministic is asserted: the calibration measures every quantity, every layout gets a finite
prediction next to its measurement, the model state the cost model counts is the bytes the workers held, and the
report section is written once. How close predictions come to measured step times, and whether the planner's first
choice is the fastest, depend on this machine's speed and load: ``python benchmarks/planner.py`` measures them on
an idle machine and prints them beside their targets (docs/benchmarks.md, "Planner")."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.planner import QUICK, calibrated, first_choice, markdown, summary_of, sweep, write_section
from tests.helpers import run_train


def _train(overrides: list[str], run_dir: Path) -> None:
    run_train(*overrides, run_dir=run_dir)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_planner_predicts_every_strategy_beside_its_measured_step(tmp_path):
    hardware = calibrated()
    assert hardware.measured, "topology.calibrate=true measured nothing"
    for key, value in hardware.measured.items():
        assert math.isfinite(value) and value >= 0, (key, value)
    rows = sweep(QUICK, steps=4, hardware=hardware, train=_train)
    assert [r["layout"] for r in rows] == [lay.label for lay in QUICK]
    for r in rows:
        for side in ("predicted", "measured"):
            assert math.isfinite(r[side]["step_s"]) and r[side]["step_s"] > 0, r
        assert math.isfinite(r["error"]), r
        # model state: the cost model's bytes are what the workers held (fp32 AdamW, local shards)
        assert r["measured"]["model_state_bytes"] == pytest.approx(r["predicted"]["model_state_bytes"], rel=0.05), r
    choice, best = first_choice(rows, QUICK)
    assert choice["predicted"]["step_s"] == min(r["predicted"]["step_s"] for r in rows)
    assert best["measured"]["step_s"] == min(r["measured"]["step_s"] for r in rows)
    s = summary_of(rows, QUICK)
    assert s["median_abs_error"] <= s["worst_abs_error"] and s["choice"] == choice["layout"]
    text = markdown(rows, layouts=QUICK, steps=4, hardware=hardware)
    assert "target ≤ 15%" in text and "target: within 10%" in text
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    write_section(text, doc)
    write_section(text, doc)  # idempotent: replaces its own section
    out = doc.read_text()
    assert out.count("## Planner") == 1 and "## Other\n\nkept" in out and choice["layout"] in out
