"""The cost model against real runs on this machine: one layout per strategy family (single, ddp, fsdp, tp, mp,
pp 1F1B), predicted vs measured step time, and the planner's first choice checked by its own measured time.

The accuracy targets (median error <= 15%, worst <= 30%) are ``benchmarks/planner.py``'s, on an idle machine,
with its table in docs/benchmarks.md. This test runs the same functions and bounds what one noisy run can
show: the same layout at the same commit measured 0.11-0.28 s (pp m=4) and 0.15-0.20 s (mp) run to run on
this 2-core VM. Its bounds (median <= 25%, worst <= 40%) still catch a term the cost model misses or
miscounts: before tensor parallel's collectives were counted as meshtrain issues them (6 per GPT block, not
Megatron's 4, plus the head's 2) and calibrated on the configured model, tp was predicted -51% to -72%."""

from __future__ import annotations

import pytest

from benchmarks.planner import QUICK, calibrated, first_choice, markdown, summary_of, sweep, write_section


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_planner_predicts_every_strategy_and_its_first_choice_is_near_the_best(tmp_path):
    hardware = calibrated()
    rows = sweep(QUICK, steps=10, hardware=hardware)
    report = "\n".join(
        f"{r['layout']}: predicted {r['predicted']['step_s']:.4f} s, measured {r['measured']['step_s']:.4f} s "
        f"({r['error']:+.0%})"
        for r in rows
    )
    s = summary_of(rows, QUICK)
    assert s["median_abs_error"] <= 0.25 and s["worst_abs_error"] <= 0.40, f"{hardware.measured}\n{report}"
    # the claim: the layout the planner ranks first runs within 10% of the fastest one measured
    choice, best = first_choice(rows, QUICK)
    assert choice["measured"]["step_s"] <= 1.10 * best["measured"]["step_s"], f"{choice['layout']}\n{report}"
    # model state: the cost model's bytes are what the workers held (fp32 AdamW, local shards)
    for r in rows:
        assert r["measured"]["model_state_bytes"] == pytest.approx(r["predicted"]["model_state_bytes"], rel=0.05)
    text = markdown(rows, layouts=QUICK, steps=10, hardware=hardware)
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    write_section(text, doc)
    write_section(text, doc)  # idempotent: replaces its own section
    out = doc.read_text()
    assert out.count("## Planner") == 1 and "## Other\n\nkept" in out and choice["layout"] in out
