"""The rotary families build under the dry run (dp 2 x tp 2 x pp 2, sequence parallel, FSDP2, 1F1B) on torch's fake
process group: Llama with its rotary-table buffer (once refused: a meta buffer met CPU activations) and Qwen3 with
its q/k head norms in the TP plan; the measured model state is the planner's estimate (5%)."""

from __future__ import annotations

import pytest

from parallel.plan.cli import compose, specs_from_cfg, typed_model
from parallel.plan.cost_model import Candidate
from parallel.plan.dry_run import dry_run


@pytest.mark.parametrize("name", ["llama_debug", "qwen3_debug"])
def test_dry_run_builds_every_sampled_rank(name):
    cfg = compose([f"model={name}", "data.seq_len=64", "data.global_batch_size=16", "topology.nproc_per_node=8"])
    model, hardware, workload = specs_from_cfg(cfg, calibrate=False)
    c = Candidate(dp=2, tp=2, pp=2, micro_batches=4, schedule="1f1b", zero_stage=3, sequence_parallel=True)
    report = dry_run(
        model_config=typed_model(cfg.model), candidate=c, model=model, hardware=hardware, workload=workload
    )
    for r in report.ranks:
        assert r.error is None, r.error
        assert r.ratio("model_state") == pytest.approx(1.0, abs=0.05), r
