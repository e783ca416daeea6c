"""Expert parallel's pieces that need no process group: the reorder of received rows by local expert, the ep row
of the dimension table, and the refusals before any worker starts (a dense model, an ep that does not divide the
experts or the ranks it borrows, and ep without FSDP2). Parity runs in tests/integration/test_qwen3_moe_parity.py."""

from __future__ import annotations

import pytest
import torch

from parallel.assembly.compose import Composition
from parallel.foundation import dims
from parallel.foundation.layout import ParallelLayout
from parallel.techniques.ep import _by_local_expert


def test_received_rows_are_reordered_expert_major():
    # 2 source ranks x 3 local experts: rows per (source, expert); received source-major
    recv = torch.tensor([[2, 0, 1], [1, 3, 0]])
    received = [("s0", "e0"), ("s0", "e0"), ("s0", "e2"), ("s1", "e0"), ("s1", "e1"), ("s1", "e1"), ("s1", "e1")]
    order = _by_local_expert(recv, rows=7).tolist()
    assert [received[i] for i in order] == [
        ("s0", "e0"), ("s0", "e0"), ("s1", "e0"), ("s1", "e1"), ("s1", "e1"), ("s1", "e1"), ("s0", "e2")
    ]  # fmt: skip
    assert order == [0, 1, 3, 4, 5, 6, 2]


def test_the_ep_row_borrows_dp_and_adds_no_rank():
    assert dims.borrowing() == ("ep",) and dims.lenders("ep") == ("dp", "cp") and "ep" not in dims.mesh_names()
    layout = ParallelLayout(strategy="hybrid", dp=4, ep=2)
    assert layout.world_size == 4 and [layout.coords(r)["ep"] for r in range(4)] == [0, 1, 0, 1]
    assert Composition.from_degrees(ParallelLayout(strategy="hybrid", dp=2, ep=2, dp_shard=True)).dims == ("ep",)
    with pytest.raises(ValueError, match=r"Composition\(ep=True, dp='ddp'\): expert parallel shards with FSDP2"):
        Composition(dims=("ep",), dp="ddp")


MOE = ("model=qwen3_moe_debug", "parallel=hybrid", "tp.size=1", "pp.size=1")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("model=llama_debug", "parallel=hybrid", "tp.size=1", "pp.size=1", "dp.size=2", "ep.size=2"),
            "ep.size=2 with model=llama_debug: expert parallel splits a mixture of experts' experts and this model "
            "has none; set ep.size=1, or use a MoE model (model=qwen3_moe_debug)",
        ),
        (
            (*MOE, "dp.size=4", "ep.size=4", "model.n_experts=6"),
            "ep.size=4 does not divide model.n_experts=6: each ep rank holds n_experts / ep whole experts; set "
            "ep.size to one of 1, 2, or model.n_experts to a multiple of 4",
        ),
        (
            (*MOE, "dp.size=2", "ep.size=4"),
            "ep.size=4 does not divide dp.size=2 = 2, the ranks ep borrows (it adds none of its own); set ep.size "
            "to one of 1, 2",
        ),
        (
            (*MOE, "dp.size=2", "ep.size=2", "model.top_k=9"),
            "model.top_k=9: each token picks 1 to model.n_experts=8 experts; use 1 <= top_k <= 8",
        ),
        (
            ("model=qwen3_moe_debug", "parallel=fsdp", "dp.size=2", "ep.size=2"),
            "ep.size=2 with parallel=fsdp: fsdp does not use the ep dimension",
        ),
        (  # ep borrows dp x cp, not tp: each tp rank runs the sparse blocks whole on the same tokens
            ("model=qwen3_moe_debug", "parallel=hybrid", "dp.size=1", "tp.size=2", "pp.size=1", "ep.size=2"),
            "ep.size=2 does not divide dp.size=1 = 1, the ranks ep borrows (it adds none of its own); set ep.size "
            "to one of 1",
        ),
        (
            (*MOE, "dp.size=1", "cp.size=2", "ep.size=2", "model.capacity_factor=1.25"),
            "model.capacity_factor=1.25 with cp.size=2: each cp rank routes its chunk of the sequence, so an expert's "
            "capacity (a share of one forward's tokens) and which tokens go over it would be the chunk's",
        ),
        (
            ("model=qwen3_moe_debug", "parallel=tp", "tp.size=4"),
            "model.n_kv_heads=2 is not divisible by tp.size=4: wk/wv are split by key/value heads",
        ),
    ],
)
def test_refused_before_any_worker_starts(compose_cfg, overrides, message):
    from trainer.validate import ConfigError, validate

    with pytest.raises(ConfigError) as err:
        validate(compose_cfg(*overrides))
    assert message in str(err.value)


def test_tensor_parallel_with_expert_parallel_is_accepted(compose_cfg):
    """The attention split over tp, the sparse blocks whole on each tp rank (no width of theirs need divide tp)."""
    from trainer.validate import build_layout, validate

    validate(compose_cfg("model=qwen3_moe_debug", "parallel=tp", "model.moe_d_ff=63"))
    cfg = compose_cfg(*MOE, "dp.size=2", "ep.size=2", "tp.size=2", "tp.sequence_parallel=true")
    layout = build_layout(cfg)
    assert layout.world_size == 4 and layout.ep == 2 and layout.dp_shard
    validate(cfg)


def test_dp_is_fsdp2_under_expert_parallel(compose_cfg):
    from trainer.validate import build_layout, validate

    cfg = compose_cfg(*MOE, "dp.size=2", "ep.size=2", "dp.shard=false")
    layout = build_layout(cfg)
    assert layout.dp_shard and layout.ep == 2 and layout.world_size == 2
    validate(cfg)
