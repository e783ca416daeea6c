"""Context parallel at issue 34's length: llama_debug at 1024 tokens under cp2 and dp2 x cp2 x pp2 (8 workers, FSDP2
over dp x cp, 1F1B) reproduces parallel=single (losses and gradient norms within 1e-4 relative, final parameters read
back from the last checkpoint within 1e-4), one multirun of 3 jobs. A module of its own beside
tests/integration/test_cp_parity.py (the layouts at 32 tokens): pytest --dist loadfile runs the two on both workers.
"""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import TrainRun, assert_parity, case_multirun, layout_case

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

CP2 = {"cp": {"size": 2}}

#: issue 34's done-when at its own length: llama_debug at 1024 tokens under cp2 and dp2 x cp2 x pp2 (8 workers, FSDP2
#: over dp x cp, 1F1B) against single, 2 steps (tests/integration/test_cp_parity.py's cases run at 32 tokens)
LONG = ("trainer.log_every=1", "logger=none", "data.seq_len=1024", "data.global_batch_size=4", "pp.trace_step=0")
LONG_CASES: dict[str, dict] = {
    "long_single": layout_case("llama_debug", "single"),
    "long_cp2": layout_case("llama_debug", **CP2),
    "long_dp2_cp2_pp2": layout_case(
        "llama_debug", **CP2, dp={"size": 2}, pp={"size": 2, "schedule": "1f1b", "micro_batches": 2}
    ),
}


@pytest.fixture(scope="module")
def long_runs(tmp_path_factory):
    steps = ("trainer.max_steps=2", "trainer.checkpoint_every=2")
    jobs = case_multirun(LONG_CASES, *LONG, *steps, base=tmp_path_factory.mktemp("cp_long"), group="cp_long")
    return {name: TrainRun(proc=None, run_dir=job) for name, job in jobs.items()}  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["long_cp2", "long_dp2_cp2_pp2"])
def test_matches_single_at_1024_tokens(name, long_runs):
    run, ref = long_runs[name], long_runs["long_single"]
    worst = assert_parity(run, ref)
    losses = max(abs(a - b) / abs(b) for a, b in zip(run.losses(), ref.losses()))
    print(f"{name} at 1024 tokens: max relative loss difference {losses:.1e}; max parameter difference {worst:.1e}")
    layout = run.summary()["layout"]
    assert (layout["cp"], layout["world_size"]) == (2, 2 * layout["dp"] * layout["pp"])
    assert len(run.losses()) == 2 and layout["world_size"] == (8 if name.endswith("pp2") else 2)
    assert yaml.safe_load((run.run_dir / "resolved_config.yaml").read_text())["data"]["seq_len"] == 1024
