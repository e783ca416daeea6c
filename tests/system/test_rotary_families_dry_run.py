"""The rotary families build under the dry run on torch's fake process group, and the planner's bytes are what it
measures: Llama with its rotary-table buffer (once refused: a meta buffer met CPU activations) and Qwen3 with its
q/k head norms in the TP plan. Model state within 5% of the estimate; saved activations per micro-batch (the cost
model's per-family formula, ``saved_layer_activation_bytes``) within 1% on every sampled rank: tensor parallel with
sequence parallel across two pipeline stages (the first stage's token ids and the last stage's head included), and
context parallel (Ulysses: its all-to-all's output copy, and the key/value heads repeated when cp exceeds them)."""

from __future__ import annotations

import pytest

from models.registry import typed_model
from parallel.plan.cli import plain, specs_from_cfg, workload_overrides
from parallel.plan.cost_model import Candidate
from parallel.plan.dry_run import dry_run

#: measured over planned activations: the formula counts what the blocks save (the first stage's int64 token ids,
#: 8 bytes a token, and the loss's scalar are left out)
ACTIVATION_TOLERANCE = 0.01


def _dry_run(compose_cfg, name: str, candidate: Candidate, *overrides: str):
    """``candidate`` of ``name`` at 64 tokens, 16 samples, dry-run on every sampled rank (composed as the planner's
    command line composes it, through the session's composer: each model's groups composed once)."""
    cfg = compose_cfg(
        *workload_overrides([f"model={name}", "data.seq_len=64", "data.global_batch_size=16", *overrides])
    )
    model, hardware, workload = specs_from_cfg(cfg, calibrate=False)
    return dry_run(
        model_config=typed_model(plain(cfg.model)),
        candidate=candidate,
        model=model,
        hardware=hardware,
        workload=workload,
    )


@pytest.mark.parametrize("name", ["llama_debug", "qwen3_debug"])
def test_dry_run_builds_every_sampled_rank(compose_cfg, name):
    c = Candidate(dp=2, tp=2, pp=2, micro_batches=4, schedule="1f1b", zero_stage=3, sequence_parallel=True)
    report = _dry_run(compose_cfg, name, c, "topology.nproc_per_node=8")
    for r in report.ranks:
        assert r.error is None, r.error
        assert r.ratio("model_state") == pytest.approx(1.0, abs=0.05), r
        assert r.ratio("activations_per_micro_batch") == pytest.approx(1.0, abs=ACTIVATION_TOLERANCE), r


@pytest.mark.parametrize("name", ["llama_debug", "qwen3_debug"])
def test_context_parallel_activations_are_the_plan(compose_cfg, name):
    """cp 4 over 2 key/value heads (each repeated twice) in bf16, and cp 2 x tp 2 with sequence parallel in fp32."""
    for c, precision in (
        (Candidate(cp=4, micro_batches=4), "mixed"),
        (Candidate(cp=2, tp=2, sequence_parallel=True, micro_batches=4), "fp32"),
    ):
        report = _dry_run(compose_cfg, name, c, "topology.nproc_per_node=4", f"planner.precision={precision}")
        for r in report.ranks:
            assert r.error is None, r.error
            assert r.ratio("activations_per_micro_batch") == pytest.approx(1.0, abs=ACTIVATION_TOLERANCE), (c, r)
