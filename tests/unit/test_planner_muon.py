"""The planner with ``optim=muon`` (parallel/plan/muon_cost.py): the blocks' matrices keep one momentum buffer instead
of AdamW's two moments (the dry run's optimizer-state bytes, the real optimizer's state on meta tensors, equal the
plan's: tests/system/test_dry_runs_match_the_plan.py); the Newton-Schulz FLOPs are torch's own count; the gathers
are the sharded matrices' volume."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from parallel.plan.cost_model import Candidate, elementwise_optimizer_s, estimate, rank_muon_state_params
from parallel.plan.muon_cost import ns_flops
from tests.planning import MUON, planned


def test_the_workload_reads_optim_muon():
    _, (_, _, workload) = planned(*MUON, "model=llama_debug", "optim.muon_gather=everywhere", "optim.ns_steps=3")
    assert (workload.optimizer, workload.muon_gather, workload.ns_steps) == ("muon", "everywhere", 3)
    assert workload.muon_bytes_per_param == (4, 4, 4)  # AdamW: (4, 4, 8)


def test_newton_schulz_flops_are_torchs_own_count():
    from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, _zeropower_via_newtonschulz
    from torch.utils.flop_counter import FlopCounterMode

    for rows, cols in [(64, 176), (176, 64), (128, 128)]:
        with FlopCounterMode(display=False) as counter:
            _zeropower_via_newtonschulz(torch.randn(rows, cols), (DEFAULT_A, DEFAULT_B, DEFAULT_C), 5, 1e-7)
        assert counter.get_total_flops() == ns_flops(rows, cols, steps=5)


def test_spread_gathers_a_share_and_everywhere_gathers_all():
    _, (model, hardware, workload) = planned(*MUON, "model=llama_debug")
    c = Candidate(dp=2, zero_stage=3)
    spread = estimate(c, model=model, hardware=hardware, workload=workload).muon
    everywhere = estimate(
        c, model=model, hardware=hardware, workload=dataclasses.replace(workload, muon_gather="everywhere")
    ).muon
    matrices = sum(model.layer_matmul_params(i) for i in range(model.n_layers))
    # spread: half of the rank's half of each matrix goes to its owner (parameter, gradient, momentum; 4 bytes each)
    # and half comes back (parameter, momentum)
    assert spread.gather_bytes == pytest.approx(0.5 * matrices / 2 * (12 + 8))
    assert everywhere.gather_bytes == pytest.approx(0.5 * matrices * 12)
    assert spread.ns_flops == pytest.approx(everywhere.ns_flops / 2)
    assert spread.gather_s > 0 and spread.ns_s > 0
    ddp = estimate(Candidate(dp=2), model=model, hardware=hardware, workload=workload).muon
    assert ddp.gather_bytes == 0 and ddp.ns_flops == everywhere.ns_flops  # replicated: every rank all, no gather


def test_the_elementwise_pass_moves_one_momentum_buffer_for_the_matrices():
    _, (model, hardware, workload) = planned(*MUON, "model=llama_debug")
    c, layers = Candidate(dp=2, zero_stage=3), list(range(model.n_layers))
    matrices = sum(model.layer_matmul_params(i) for i in layers)
    assert rank_muon_state_params(model, layers, c=c, workload=workload, meshtrain=True) == matrices / 2
    memory = estimate(c, model=model, hardware=hardware, workload=workload).memory
    rest = (model.params - matrices) / 2  # embeddings, head, norms: AdamW's, sharded over dp2
    assert memory.optimizer == pytest.approx(rest * 8 + matrices / 2 * 4)
    # read w, g, K and write w, K (clipping reads g): K = 8 bytes of moments for AdamW's, 4 of momentum for Muon's
    want = (rest * (8 + 8 + 16) + matrices / 2 * (8 + 8 + 8)) / hardware.memory_bytes_per_s
    got = elementwise_optimizer_s(c, model, hardware, workload, memory, layers, meshtrain=True)
    assert got == pytest.approx(want, rel=1e-12)
    adamw = dataclasses.replace(workload, optimizer="adamw")
    memory = estimate(c, model=model, hardware=hardware, workload=adamw).memory
    assert rank_muon_state_params(model, layers, c=c, workload=adamw, meshtrain=True) == 0
    got = elementwise_optimizer_s(c, model, hardware, adamw, memory, layers, meshtrain=True)
    assert got == pytest.approx(model.params / 2 * 32 / hardware.memory_bytes_per_s, rel=1e-12)
