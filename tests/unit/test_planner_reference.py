"""The planner counts DPO's reference as ``trainer.preference.reference`` holds it: ``copy`` without LoRA keeps a
frozen copy of the weights on every rank (sharded like them: no gradients, no optimizer state) and runs it forward
on every micro-batch; with LoRA the reference is the base with the adapters off (no bytes); ``pass`` computes its
log-probabilities once before step 1 (nothing per step). The dry run measures the copy as the trainer takes it
(``parallel/foundation/state_bytes.py`` ``frozen_copy`` of the composed rank's parameters): tests/system/test_dry_run_fake_group.py's
small cluster holds one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parallel.plan.cli import specs_from_cfg
from parallel.plan.cost_model import Candidate, estimate

DPO = ("trainer.objective=dpo", "data.seq_len=64", "data.global_batch_size=8", "topology.nproc_per_node=2")


def test_the_key_reaches_the_workload(compose_cfg):
    from parallel.plan.api import planner_inputs
    from trainer.typed.planner_request import planner_request  # what parallel=auto and trainer.dry_run plan with

    for extra, held in ((("trainer.preference.reference=copy",), True), ((), False)):
        cfg = compose_cfg("model=llama_debug", *DPO, *extra)
        assert specs_from_cfg(cfg, calibrate=False)[2].reference_copy is held
        assert planner_inputs(planner_request(cfg), calibrate=False)[2].reference_copy is held
    cfg = compose_cfg("model=llama_debug", "trainer.objective=simpo", "trainer.preference.reference=copy")
    assert specs_from_cfg(cfg, calibrate=False)[2].reference_copy is False  # SimPO has no reference


def test_a_frozen_copy_costs_the_weights_once_more_and_a_forward(compose_cfg):
    cfg = compose_cfg("model=llama_debug", *DPO, "trainer.preference.reference=copy")
    model, hardware, held = specs_from_cfg(cfg, calibrate=False)
    free = replace(held, reference_copy=False)
    for c in (Candidate(dp=1), Candidate(dp=2, zero_stage=3), Candidate(pp=2, micro_batches=2, schedule="1f1b")):
        with_copy, without = (estimate(c, model=model, hardware=hardware, workload=w) for w in (held, free))
        for a, b in zip(with_copy.rank_memory, without.rank_memory, strict=True):
            assert a.reference == a.params == b.params and b.reference == 0.0  # the weights, sharded as they are
            assert (a.grads, a.optimizer, a.activations) == (b.grads, b.optimizer, b.activations)
            assert a.total == pytest.approx(b.total + b.params)
        assert with_copy.compute_s > without.compute_s  # the reference's forward on every micro-batch
    lora = compose_cfg("model=llama_debug", *DPO, "trainer.preference.reference=copy", "model.lora.rank=4")
    model, hardware, workload = specs_from_cfg(lora, calibrate=False)
    assert (
        estimate(Candidate(dp=2, zero_stage=3), model=model, hardware=hardware, workload=workload).memory.reference == 0
    )
