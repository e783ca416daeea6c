"""The cost model's terms against figures published in the papers they come from."""

from __future__ import annotations

import math

import pytest

from models.registry import model_shape
from parallel.plan.cost_model import (
    ActivationCase,
    Candidate,
    bubble_fraction,
    estimate,
    layer_activation_bytes,
    micro_batches_in_flight,
    model_state_bytes,
    tp_collectives_per_layer,
)
from parallel.plan.specs import HardwareSpec, Link, ModelShape, Workload

# Megatron-LM 2021 (arXiv 2104.04473) Table 1: (heads, hidden, layers) -> parameters in billions; V = 51200, s = 2048
MEGATRON_TABLE_1 = [
    (24, 2304, 24, 1.7),
    (32, 3072, 30, 3.6),
    (32, 4096, 36, 7.5),
    (48, 6144, 40, 18.4),
    (64, 8192, 48, 39.1),
    (80, 10240, 60, 76.1),
    (96, 12288, 80, 145.6),
    (128, 16384, 96, 310.1),
    (128, 20480, 105, 529.6),
    (160, 25600, 128, 1008.0),
]


def megatron_gpt(heads: int, hidden: int, layers: int) -> ModelShape:
    return ModelShape(
        name="megatron",
        n_layers=layers,
        d_model=hidden,
        n_heads=heads,
        vocab_size=51200,
        max_seq_len=2048,
        bias=True,
        tied_embeddings=True,
    )


@pytest.mark.parametrize("heads,hidden,layers,billions", MEGATRON_TABLE_1)
def test_parameter_counts_match_megatron_table_1(heads, hidden, layers, billions):
    assert megatron_gpt(heads, hidden, layers).params / 1e9 == pytest.approx(billions, abs=0.051)


@pytest.mark.parametrize("heads,hidden,layers,_", MEGATRON_TABLE_1[::3])
def test_flops_with_full_recompute_are_megatrons_formula(heads, hidden, layers, _):
    """96·B·s·l·h²(1 + s/6h + V/16lh) per iteration (arXiv 2104.04473, eq. 3), per token here."""
    m, s, V, h, l = megatron_gpt(heads, hidden, layers), 2048, 51200, hidden, layers  # noqa: E741 - the paper's names
    paper = 96 * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)) / s
    assert m.training_flops_per_token(s, recompute="full") == pytest.approx(paper, rel=1e-12)
    # without recomputation: three passes instead of four over the blocks
    assert m.training_flops_per_token(s) < m.training_flops_per_token(s, recompute="full")


def test_gpt3_175b_training_time_matches_megatron_estimate():
    """arXiv 2104.04473 section 5.1: 175B on 300B tokens, 1024 A100s at 140 TFLOP/s each → about 34 days."""
    m = megatron_gpt(96, 12288, 96)
    seconds = m.training_flops_per_token(2048, recompute="full") * 300e9 / (1024 * 140e12)
    assert seconds / 86400 == pytest.approx(34, rel=0.05)


@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_memory_example(stage, expected_gb):
    """ZeRO (arXiv 1910.02054) Figure 1: Ψ = 7.5B, N_d = 64, K = 12 (mixed-precision Adam)."""
    total = sum(model_state_bytes(7.5e9, bytes_per_param=(2, 2, 12), zero_stage=stage, dp=64))
    assert total / 1e9 == pytest.approx(expected_gb, abs=0.06)


def test_activation_memory_matches_korthikanti():
    """arXiv 2205.05198 section 4, 16-bit: sbh(34 + 5as/h); TP: sbh(10 + 24/t + 5as/(ht)); TP+SP: /t."""
    m = ModelShape(name="gpt3", n_layers=96, d_model=12288, n_heads=96, vocab_size=51200, max_seq_len=2048)
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    kw = dict(seq_len=s, micro_batch=b, element_bytes=2)
    plain = layer_activation_bytes(m, 0, ActivationCase(tp=1, sequence_parallel=False, recompute="none", **kw))
    assert plain == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    tp = layer_activation_bytes(m, 0, ActivationCase(tp=t, sequence_parallel=False, recompute="none", **kw))
    assert tp == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    sp = layer_activation_bytes(m, 0, ActivationCase(tp=t, sequence_parallel=True, recompute="none", **kw))
    assert sp == pytest.approx(s * b * h / t * (34 + 5 * a * s / h))
    sel = layer_activation_bytes(m, 0, ActivationCase(tp=t, sequence_parallel=True, recompute="selective", **kw))
    assert sel == pytest.approx(34 * s * b * h / t)
    full = layer_activation_bytes(m, 0, ActivationCase(tp=t, sequence_parallel=True, recompute="full", **kw))
    assert full == pytest.approx(2 * s * b * h / t)


def test_bubble_fractions():
    # GPipe / 1F1B: (p-1)/(m+p-1); as overhead over ideal time (p-1)/m (Megatron eq. 1)
    assert bubble_fraction("gpipe", pp=4, m=4) == pytest.approx(3 / 7)
    f = bubble_fraction("1f1b", pp=8, m=32)
    assert f / (1 - f) == pytest.approx(7 / 32)
    # interleaved: (p-1)/(v·m) (Megatron eq. 2)
    f = bubble_fraction("interleaved_1f1b", pp=8, m=32, v=4)
    assert f / (1 - f) == pytest.approx(7 / (4 * 32))
    # ZB-H1: a third of 1F1B's; ZB-V: none with m >= 2p (arXiv 2401.10241)
    f = bubble_fraction("zero_bubble", pp=4, m=8)
    assert f / (1 - f) == pytest.approx(3 / (3 * 8))
    assert bubble_fraction("zbv", pp=4, m=8) == 0.0
    assert bubble_fraction("1f1b", pp=1, m=8) == 0.0


def test_micro_batches_in_flight_per_schedule():
    assert micro_batches_in_flight("gpipe", pp=4, m=16, v=1) == 16
    assert micro_batches_in_flight("1f1b", pp=4, m=16, v=1) == 4
    assert micro_batches_in_flight("1f1b", pp=4, m=16, v=1, stage=3) == 1
    assert micro_batches_in_flight("1f1b", pp=4, m=2, v=1) == 2
    assert micro_batches_in_flight("interleaved_1f1b", pp=4, m=16, v=2) == pytest.approx(4 + 3 / 2)


def _hw(**kw) -> HardwareSpec:
    base = dict(
        name="t",
        nnodes=1,
        devices_per_node=8,
        device="cuda",
        memory_bytes=80e9,
        flops=100e12,
        memory_bytes_per_s=2e12,
        intra=Link(2400, 5e-6),
        inter=Link(2400, 5e-6),
        p2p=Link(2400, 5e-6),
    )
    return HardwareSpec(**{**base, **kw})


def test_estimate_terms_move_the_right_way():
    m = ModelShape(name="m", n_layers=32, d_model=4096, n_heads=32, vocab_size=51200, max_seq_len=2048)
    w = Workload(global_batch_size=64, seq_len=2048, precision="mixed")
    hw = _hw()
    gpipe = estimate(Candidate(pp=8, micro_batches=8, schedule="gpipe"), model=m, hardware=hw, workload=w)
    ofob = estimate(Candidate(pp=8, micro_batches=8, schedule="1f1b"), model=m, hardware=hw, workload=w)
    assert ofob.memory.activations < gpipe.memory.activations  # 1F1B holds p, GPipe m micro-batches
    more_m = estimate(Candidate(pp=8, micro_batches=32, schedule="1f1b"), model=m, hardware=hw, workload=w)
    assert more_m.bubble_fraction < ofob.bubble_fraction
    slow = _hw(intra=Link(1.0, 1e-4), inter=Link(1.0, 1e-4))
    ddp_fast = estimate(Candidate(dp=8, micro_batches=8), model=m, hardware=hw, workload=w)
    ddp_slow = estimate(Candidate(dp=8, micro_batches=8), model=m, hardware=slow, workload=w)
    assert ddp_slow.dp_comm_s > 100 * ddp_fast.dp_comm_s and ddp_slow.comm_fraction > 0.9
    # one all-reduce of the fp16 gradients, ring over 8: 2·7/8·2Ψ bytes at 300 GB/s plus 2·7 latencies per
    # 25 MiB bucket; dp_comm_overlap of it hidden behind the backward pass
    buckets = math.ceil(2 * m.params / (25 * 2**20))
    expected = 2 * 7 / 8 * 2 * m.params / 300e9 + 2 * 7 * 5e-6 * buckets
    megatron = Workload(global_batch_size=64, seq_len=2048, precision="mixed", implementation="megatron")
    ddp_fp16 = estimate(Candidate(dp=8, micro_batches=8), model=m, hardware=hw, workload=megatron)
    assert ddp_fp16.dp_comm_s == pytest.approx(expected * (1 - hw.dp_comm_overlap), rel=0.01)
    # meshtrain's bf16-mixed reduces fp32 gradients: twice the bytes, the same number of buckets' latencies
    buckets32 = math.ceil(4 * m.params / (25 * 2**20))
    expected32 = 2 * 7 / 8 * 4 * m.params / 300e9 + 2 * 7 * 5e-6 * buckets32
    assert ddp_fast.dp_comm_s == pytest.approx(expected32 * (1 - hw.dp_comm_overlap), rel=0.01)


def test_tp_collectives_are_counted_as_each_implementation_issues_them(compose_cfg):
    """Megatron fuses each sub-block's input-gradient all-reduce (2 fwd + 2 bwd); meshtrain's DTensor plan
    all-reduces every column-wise projection's input gradient: gpt_small's 4 blocks + head run the 26 that
    tests/integration/test_tp_fsdp_parity.py counts in a real tp run."""
    gpt = model_shape(compose_cfg("model=gpt_small").model)
    llama = model_shape(compose_cfg("model=llama_debug").model)
    assert tp_collectives_per_layer(gpt, meshtrain=False) == 4
    assert tp_collectives_per_layer(gpt, meshtrain=False, recompute="full") == 6
    assert tp_collectives_per_layer(gpt, meshtrain=True) == 6 and gpt.n_layers * 6 + 2 == 26
    assert tp_collectives_per_layer(llama, meshtrain=True) == 7
