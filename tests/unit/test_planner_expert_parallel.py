"""The planner under expert parallel: the experts' memory and all-to-all terms on a hand-computed example, the MoE
block's saved activations against what autograd saves (with and without ep), ep candidates, the keep-ep-inside-a-node
pitfall, and one MoE block's all-to-alls under the fake process group (the dry runs of whole ep layouts:
tests/system/test_dry_runs_match_the_plan.py; the 235B plan choosing ep, a full-size search:
tests/system/test_planner_full_size.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parallel.plan.cost_model import (
    ActivationCase,
    Candidate,
    estimate,
    moe_saved_activation_bytes,
    rank_params,
    tp_collectives_per_layer,
)
from parallel.plan.search import enumerate_candidates, pitfalls, plan
from parallel.plan.specs import HardwareSpec, Link, ModelShape, PlanError, Workload
from tests.planning import planned

#: two blocks: a mixture of 8 experts of width 32 (2 per token), then a dense SwiGLU of width 128
MOE = ModelShape(
    name="moe",
    n_layers=2,
    d_model=64,
    n_heads=4,
    vocab_size=128,
    max_seq_len=32,
    gated_mlp=True,
    norm_params=1,
    learned_positions=False,
    n_experts=8,
    top_k=2,
    moe_d_ff=32,
    layer_d_ff=(2 * 32, 128),
    sparse=(True, False),
)
#: 2 nodes of 4 devices: 100 GB/s, 1 us inside a node, 10 GB/s, 10 us across
HW = HardwareSpec(
    name="two_nodes",
    nnodes=2,
    devices_per_node=4,
    device="cuda",
    memory_bytes=80e9,
    flops=1e14,
    memory_bytes_per_s=1e12,
    intra=Link(800.0, 1e-6),
    inter=Link(80.0, 1e-5),
    p2p=Link(800.0, 1e-6),
)
WORK = Workload(global_batch_size=8, seq_len=32, precision="mixed")  # bf16 activations, fp32 states (4, 4, 8)


def test_expert_counts_of_the_shape():
    assert MOE.layer_expert_params(0) == 3 * 64 * 32 * 8 == 49152 and MOE.layer_expert_params(1) == 0
    assert MOE.layer_moe_params(0) == 49152 + 64 * 8  # + the router, no shared experts
    assert MOE.layer_moe_active_params(0) == 3 * 64 * 64 + 64 * 8  # top-2 experts and the router


def test_expert_memory_and_all_to_all_by_hand():
    c = Candidate(dp=8, ep=4, zero_stage=3)
    est = estimate(c, model=MOE, hardware=HW, workload=WORK)
    flat = estimate(Candidate(dp=8, zero_stage=3), model=MOE, hardware=HW, workload=WORK)
    P, E = MOE.params, 49152
    # ZeRO-3: the rest over the 8 data ranks, the experts / 4 over the 2 ranks holding them: P/8 either way
    assert est.memory.params == pytest.approx((P - E) / 8 * 4 + E / 4 / 2 * 4) == pytest.approx(P / 8 * 4)
    assert est.memory.optimizer == pytest.approx(P / 8 * 8)
    assert (est.memory.params, est.memory.grads, est.memory.optimizer) == pytest.approx(
        (flat.memory.params, flat.memory.grads, flat.memory.optimizer)
    )
    # saved activations: ep adds the all-to-all's reordering of the 32 x 2 rows and its inverse (int64)
    assert est.memory.activations - flat.memory.activations == 2 * 32 * 2 * 8

    # all-to-alls: 1 sample x 32 tokens x top-2 rows of 64 bf16 channels among 4 ranks of a node (100 GB/s, 1 us):
    # dispatch + combine forward, the reverse two backward, and one exchange of the 8 int64 counts
    rows = 3 / 4 * (32 * 2 * 64 * 2) / 100e9 + 3 * 1e-6
    counts = 3 / 4 * (8 * 8) / 100e9 + 3 * 1e-6
    assert est.ep_comm_s == pytest.approx(4 * rows + counts)
    assert flat.ep_comm_s == 0.0
    assert est.to_dict()["breakdown_s"]["ep_comm"] == est.ep_comm_s

    # data parallel (nothing overlapped: dp_comm_overlap 0): the rest's 1.5 x fp32 gradients over 8 ranks, which span
    # both nodes (10 GB/s, 10 us); each rank's 2 experts (E/4 fp32 gradients x 1.5) over the 2 ranks holding the
    # same experts, 4 apart: across the nodes too
    dense = 2 * 7 / 8 * ((P - E) * 4 * 1.5) / 10e9 + 2 * 7 * 1e-5
    experts = 2 * 1 / 2 * (E / 4 * 4 * 1.5) / 10e9 + 2 * 1 * 1e-5
    assert est.dp_comm_s == pytest.approx(dense + experts)
    assert flat.dp_comm_s == pytest.approx(2 * 7 / 8 * (P * 4 * 1.5) / 10e9 + 2 * 7 * 1e-5)
    assert est.comm_fraction == pytest.approx((est.ep_comm_s + est.dp_comm_s) / est.step_time_s)


def test_full_recomputation_sends_the_forward_all_to_alls_again():
    none = estimate(Candidate(dp=8, ep=4, zero_stage=3), model=MOE, hardware=HW, workload=WORK)
    full = estimate(Candidate(dp=8, ep=4, zero_stage=3, recompute="full"), model=MOE, hardware=HW, workload=WORK)
    rows = 3 / 4 * (32 * 2 * 64 * 2) / 100e9 + 3 * 1e-6
    counts = 3 / 4 * (8 * 8) / 100e9 + 3 * 1e-6
    assert full.ep_comm_s - none.ep_comm_s == pytest.approx(2 * rows + counts)


def test_meshtrain_runs_a_mixture_of_experts_whole_on_every_tp_rank():
    # attention split over tp 2, the MoE block (router and experts) and the norms whole
    split = MOE.attention_matmul_params
    whole = MOE.layer_moe_params(0) + MOE.layer_norm_params(0)
    assert rank_params(MOE, [0], first=False, last=False, tp=2, meshtrain=True) == split / 2 + whole
    assert rank_params(MOE, [0], first=False, last=False, tp=2, meshtrain=False) == MOE.layer_params(0) / 2
    # its FLOPs are not divided by t either: 64 tokens per rank (2 samples x 32), 3 passes
    est = estimate(Candidate(dp=4, tp=2, zero_stage=3), model=MOE, hardware=HW, workload=WORK)
    layers = sum(3 * MOE.layer_forward_flops_per_token(i, 32) for i in range(2)) + 3 * 2 * 128 * 64
    moe = 3 * 2 * (3 * 64 * 64 + 64 * 8)
    assert est.compute_s == pytest.approx(((layers - moe) / 2 + moe) * 64 / 1e14)
    # no tensor-parallel collective in its feed-forward: the attention's output (1) and q, k, v input gradients (3)
    assert tp_collectives_per_layer(MOE, meshtrain=True, sparse=True) == 4
    assert tp_collectives_per_layer(MOE, meshtrain=True, sparse=False) == 7


def _moe_debug():
    """qwen3_moe_debug at 64 tokens: (its typed model config, its ModelShape)."""
    model_config, (shape, _, _) = planned("model=qwen3_moe_debug", "data.seq_len=64")
    return model_config, shape


def _moe_block_saved_bytes(*, ep: int, recompute: str) -> int:
    """What qwen3_moe_debug's first MoE block keeps for backward for 2 x 64 tokens in bf16, counted by the dry run's
    own counter on fake tensors; under a fake process group with the experts split over ``ep`` ranks, checkpointed
    as the trainer checkpoints a block under ``recompute``."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from parallel.plan.dry_run import _saved_activation_bytes, build_meta_model
    from parallel.techniques.checkpointing import checkpoint_block
    from parallel.techniques.ep import apply_ep

    block = build_meta_model(_moe_debug()[0]).layers["0"].feed_forward
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ep)
    try:
        if ep > 1:
            apply_ep(block, ep_mesh=init_device_mesh("cpu", (ep,), mesh_dim_names=("ep",)))
        if recompute != "none":
            checkpoint_block(block, selective=recompute == "selective")
        return _saved_activation_bytes(
            block, first=False, last=False, micro_batch=2, seq_len=64, d_model=128, vocab_size=256,
            dtype=torch.bfloat16, loss=None,
        )  # fmt: skip
    finally:
        dist.destroy_process_group()


#: by hand, T = 128 tokens, k = 2 of E = 8 experts, h = 128, moe_d_ff = 128, bf16. Without recomputation: router
#: 128·8·4 + 256·(8 + 4) + 128·4, dispatch 2·256·8 (twice under ep), experts 256·(128 + 4·128)·2, combine 256·2 +
#: 2·256·128·2, aux 8·4; selective (matmul outputs): the router logits 128·8·2, the experts' 256·(2·128 + 128)·2
BY_HAND = {
    (1, "none"): 7680 + 4096 + 327680 + 131584 + 32,
    (2, "none"): 7680 + 2 * 4096 + 327680 + 131584 + 32,
    (1, "selective"): 2048 + 196608,
    (2, "selective"): 2048 + 196608,
    (2, "full"): 0,
}


@pytest.mark.parametrize("ep,recompute", list(BY_HAND))
def test_moe_saved_activations_are_what_autograd_keeps(ep, recompute):
    shape = _moe_debug()[1]
    case = ActivationCase(
        seq_len=64, micro_batch=2, tp=1, sequence_parallel=False, recompute=recompute, element_bytes=2, ep=ep
    )
    assert moe_saved_activation_bytes(shape, 0, case) == BY_HAND[ep, recompute]
    # plus the block's input (the normed hidden state, the layer formula's), and without recomputation the aux
    # loss's scalar
    extra = 128 * 128 * 2 + (4 if recompute == "none" else 0)
    assert _moe_block_saved_bytes(ep=ep, recompute=recompute) == BY_HAND[ep, recompute] + extra


def test_ep_candidates_only_for_experts_that_split():
    moe = list(enumerate_candidates(model=MOE, hardware=HW, workload=WORK))
    with_ep = [c for c in moe if c.ep > 1]
    assert {c.ep for c in with_ep} == {2, 4, 8}
    for c in with_ep:
        assert MOE.n_experts % c.ep == 0 and (c.dp * c.cp) % c.ep == 0 and c.zero_stage == 3
    dense = ModelShape(name="d", n_layers=2, d_model=64, n_heads=4, vocab_size=128, max_seq_len=32)
    assert all(c.ep == 1 for c in enumerate_candidates(model=dense, hardware=HW, workload=WORK))


def test_ep_across_nodes_is_a_pitfall_with_its_numbers():
    c = Candidate(dp=8, ep=8, zero_stage=3)
    est = estimate(c, model=MOE, hardware=HW, workload=WORK)
    (line,) = [p for p in pitfalls(c, est, model=MOE, hardware=HW, workload=WORK) if p.startswith("ep.size")]
    inside = estimate(Candidate(dp=8, ep=4, zero_stage=3), model=MOE, hardware=HW, workload=WORK)
    assert "ep.size=8 spans 2 nodes" in line and "keep ep inside a node" in line
    assert f"{est.ep_comm_s:.3g} s of a predicted {est.step_time_s:.3g} s step" in line
    assert f"({inside.ep_comm_s:.3g} s of {inside.step_time_s:.3g} s at ep.size=4 inside a node)" in line
    assert est.ep_comm_s > inside.ep_comm_s
    c4 = Candidate(dp=8, ep=4, zero_stage=3)
    assert not [p for p in pitfalls(c4, inside, model=MOE, hardware=HW, workload=WORK) if p.startswith("ep.size")]


def test_recomputation_fallback_and_the_strict_refusal():
    """planner.recompute=auto plans without recomputation first and with every mode when nothing fits; an explicit
    mode is strict and the refusal names auto as a fix (not when every mode was already planned)."""
    tight = replace(HW, memory_bytes=3.2e5)  # 288 kB of budget: 309 kB at least without recomputation, 261 kB with
    strict = plan(model=MOE, hardware=tight, workload=WORK)
    with pytest.raises(PlanError, match="allow planner.recompute=auto"):
        _ = strict.best
    auto = plan(model=MOE, hardware=tight, workload=replace(WORK, recompute_fallback=("none", "selective", "full")))
    assert auto.best.candidate.recompute != "none" and "nothing fits without recomputation" in auto.reason
    every = plan(
        model=MOE, hardware=replace(HW, memory_bytes=1e3), workload=replace(WORK, recompute=auto.workload.recompute)
    )
    with pytest.raises(PlanError) as refused:
        _ = every.best
    assert "planner.recompute" not in str(refused.value)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_all_to_alls_per_layer_are_the_blocks(recompute):
    """One MoE block under ep 2 (fake process group and tensors), checkpointed as the trainer does, forward and
    backward: its timed row exchanges are the planner's count (the counts' exchange needs real values: not run)."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from parallel.plan.cost_model import ep_all_to_alls_per_layer
    from parallel.plan.dry_run import _fake_parameters, build_meta_model
    from parallel.techniques.checkpointing import checkpoint_block
    from parallel.techniques.ep import A2AMeter, apply_ep

    block = build_meta_model(_moe_debug()[0]).layers["0"].feed_forward
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        meter = A2AMeter()
        apply_ep(block, ep_mesh=init_device_mesh("cpu", (2,), mesh_dim_names=("ep",)), meter=meter)
        if recompute != "none":
            checkpoint_block(block, selective=recompute == "selective")
        with FakeTensorMode(allow_non_fake_inputs=True):
            _fake_parameters(block, dtype=torch.float32)
            block(torch.randn(2, 64, 128, requires_grad=True)).sum().backward()
    finally:
        dist.destroy_process_group()
    assert len(meter.take_intervals()) == ep_all_to_alls_per_layer(recompute=recompute)
