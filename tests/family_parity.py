"""The decoder families' parity multirun (tests/integration/test_decoder_family_parity*.py, one module per family so
that pytest --dist loadfile runs the two families on both workers): every strategy against parallel=single, losses
and gradient norms within 1e-4 relative.

One multirun per family through train.py runs every case as its own job (its own workers, process group and
output folder), so Python, Hydra and torch start once for all of them: single, ddp, fsdp, tp (vocabulary-sharded
loss), mp, pp under each of the seven schedules, and a 4-rank hybrid (pp 2 x tp 2, sequence parallel).
The cases are written as a config group into a temporary search path: nothing under conf/ is added.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parallel.pipeline.schedules import available_schedules
from tests.helpers import FAST, assert_losses_close, case_multirun

#: smaller debug sizes: 4 blocks (4 stages for the looped / V schedules), grouped-query attention; Qwen3's heads
#: are 32 wide on a 64-wide model (q/k/v widths differ from d_model, as in the published Qwen3 sizes)
FAMILIES = {
    "llama": ("model=llama_debug", "model.d_model=64", "model.n_heads=4", "model.n_kv_heads=2", "model.d_ff=192"),
    "qwen3": (
        "model=qwen3_debug",
        "model.d_model=64",
        "model.n_heads=4",
        "model.n_kv_heads=2",
        "model.head_dim=32",
        "model.d_ff=192",
    ),
}
STEPS = ("trainer.max_steps=4", "trainer.checkpoint_every=0", "pp.trace_step=0")


def pp(schedule: str, m: int, v: int = 1) -> dict:
    return {
        "defaults": [{"override /parallel": "pp"}],
        "pp": {"schedule": schedule, "micro_batches": m, "stages_per_rank": v},
    }


CASES: dict[str, dict] = {
    "single": {"defaults": [{"override /parallel": "single"}]},
    "ddp": {"defaults": [{"override /parallel": "ddp"}]},
    "fsdp": {"defaults": [{"override /parallel": "fsdp"}]},
    "tp": {"defaults": [{"override /parallel": "tp"}], "tp": {"loss_parallel": True}},
    "mp": {"defaults": [{"override /parallel": "mp"}]},
    "gpipe": pp("gpipe", 4),
    "1f1b": pp("1f1b", 4),
    "interleaved_1f1b": pp("interleaved_1f1b", 4, 2),
    "looped_bfs": pp("looped_bfs", 2, 2),
    "zero_bubble": pp("zero_bubble", 4, 2),
    "zbv": pp("zbv", 4, 2),
    "dualpipev": pp("dualpipev", 4, 2),
    "hybrid_pp2_tp2_sp": {
        "defaults": [{"override /parallel": "hybrid"}],
        "dp": {"size": 1},
        "tp": {"size": 2, "sequence_parallel": True},
        "pp": {"size": 2, "schedule": "1f1b", "micro_batches": 4},
    },
}
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zero_bubble", "zbv", "dualpipev")
#: the cases compared with single
COMPARED = [c for c in CASES if c != "single"]


def family_runs(family: str, base: Path) -> dict[str, tuple[dict, list[dict]]]:
    """case -> (summary, metrics) of each job of one multirun of ``family``."""
    names = [c for c in CASES if c not in SCHEDULES or c in available_schedules()]
    jobs = case_multirun(
        {name: CASES[name] for name in names}, *FAMILIES[family], *FAST, *STEPS, base=base, group="parity_case"
    )
    out = {}
    for case, job in jobs.items():
        metrics = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines() if line.strip()]
        out[case] = (json.loads((job / "summary.json").read_text()), metrics)
    return out


def assert_single_trains(runs: dict) -> None:
    summary, metrics = runs["single"]
    assert summary["final_loss"] < summary["first_loss"]
    assert len(metrics) == 4


def assert_matches_single(case: str, runs: dict) -> None:
    if case in SCHEDULES and case not in available_schedules():
        pytest.skip(f"the installed torch has no {case} schedule")
    summary, metrics = runs[case]
    ref = [m["loss"] for m in runs["single"][1]]
    losses = [m["loss"] for m in metrics]
    print(case, "max relative loss difference", max(abs(a - b) / abs(b) for a, b in zip(losses, ref)))
    assert_losses_close(losses, ref, rel=1e-4)
    assert_losses_close([m["grad_norm"] for m in metrics], [m["grad_norm"] for m in runs["single"][1]], rel=1e-4)
    layout = summary["layout"]
    if case in SCHEDULES:
        assert (
            layout["schedule"] == case
            and len(summary["pipeline"]["stages"]) == 2 * CASES[case]["pp"]["stages_per_rank"]
        )
    if case == "hybrid_pp2_tp2_sp":
        assert (layout["pp"], layout["tp"], layout["dp"]) == (2, 2, 1)
        assert all(m.get("tp_comm_time_s", 0) > 0 for m in metrics)
    if case == "tp":
        # each tp rank holds half of every projection: the local parameters are below the full model's
        init = summary["model_init"]
        assert max(init["local_param_bytes_per_rank"]) < init["full_fp32_bytes"]
