"""The cost model against real runs on this machine: ±25% on six layouts, and the benchmark's machinery.

The sweep uses single and ddp only (pipeline/TP layouts are not in it yet): the six layouts vary
dp, gradient-accumulation micro-batches and the global batch instead (benchmarks/planner.py SWEEP).
"""

from __future__ import annotations

import pytest

from benchmarks.planner import SWEEP, calibrated, first_choice, layout_of, markdown, sweep, write_section


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_predicted_step_time_within_25_percent_of_measured(tmp_path):
    hardware = calibrated()
    rows = sweep(SWEEP, steps=12, hardware=hardware)
    report = "\n".join(
        f"{r['layout']}: predicted {r['predicted_s']:.4f} s, measured {r['measured_s']:.4f} s ({r['error']:+.0%})"
        for r in rows
    )
    within = [r for r in rows if abs(r["error"]) <= 0.25]
    assert len(within) >= 6, (
        f"{len(within)} of {len(rows)} layouts within ±25% (measured {hardware.measured}):\n{report}"
    )
    # the benchmark's report machinery: the first choice is one of the layouts and the section is written
    choice = layout_of(first_choice(hardware), global_batch_size=16)
    best = min(rows[:4], key=lambda r: r["measured_s"])
    text = markdown(rows, choice=choice.label, choice_s=best["measured_s"], best=best, steps=12)
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    write_section(text, doc)
    write_section(text, doc)  # idempotent: replaces its own section
    out = doc.read_text()
    assert out.count("## Planner") == 1 and "## Other\n\nkept" in out and choice.label.split(" B=")[0] in out
