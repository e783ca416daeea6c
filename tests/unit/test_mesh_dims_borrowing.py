"""A dimension that borrows its ranks: an ep row (borrows dp x cp, and tp where the model asks) added to the table
(with its cp row, which multiplies the world size and splits the data) by monkeypatch reaches the world size, the
rank map, the factorizations, the planner's candidates, validation and real DeviceMeshes cut out of the
world mesh (parallel/foundation/meshes.py)."""

from __future__ import annotations

import itertools
import math

import pytest
from omegaconf import OmegaConf

from parallel.assembly.registry import describe_factorization, strategy_for
from parallel.foundation import dims
from parallel.foundation.dims import MeshDim
from parallel.foundation.layout import ParallelLayout, factorizations


@pytest.fixture
def with_cp_ep(monkeypatch):
    """torchtitan's world order pp, dp, cp, tp; ep borrows dp x cp (and tp where the model asks)."""
    rows = {d.name: d for d in dims.DIMENSIONS}
    table = (
        rows["dp"],
        rows["tp"],
        rows["pp"],
        rows["cp"],
        MeshDim(
            "ep",
            None,
            "ep.size",
            "EPConfig",
            "expert parallel: the experts split",
            borrows=("dp", "cp"),
            may_borrow=("tp",),
        ),
    )
    monkeypatch.setattr(dims, "DIMENSIONS", table)


def test_todays_table_borrows_ep_from_dp_cp():
    assert dims.multiplying() == ("dp", "tp", "pp", "cp") and dims.borrowing() == ("ep",)
    assert dims.data_names() == ("dp", "cp") and dims.coord_names() == (*dims.mesh_names(), "ep")
    assert dims.borrow_problems({"dp": 3, "tp": 2}) == []
    assert dims.borrow_problems({"dp": 3, "tp": 2, "ep": 2})[0].startswith(
        "ep.size=2 does not divide dp.size=3 = 3"  # cp at 1 is not named
    )


def test_borrowing_adds_no_rank_and_its_coordinate_follows_its_lenders(with_cp_ep):
    assert dims.names() == ("dp", "tp", "pp", "cp", "ep")
    assert dims.mesh_names() == ("pp", "dp", "cp", "tp") and dims.coord_names() == ("pp", "dp", "cp", "tp", "ep")
    assert dims.lenders("ep") == ("dp", "cp") and dims.lenders("ep", asked=["tp"]) == ("dp", "cp", "tp")
    with pytest.raises(ValueError, match=r"ep may borrow \['tp'\] where the model asks, not \['pp'\]"):
        dims.lenders("ep", asked=["pp"])
    assert dims.data_names() == ("dp", "cp")
    layout = ParallelLayout(strategy="hybrid", dp=2, cp=2, tp=2, ep=4, nproc_per_node=8)
    assert layout.world_size == 8 and layout.mesh_shape == (1, 2, 2, 2) and layout.ep == 4
    with pytest.raises(ValueError, match=r"ep borrows its ranks from \('dp', 'cp'\)"):
        layout.stride("ep")
    rows = layout.rank_map()
    assert [r["rank"] for r in rows] == list(range(8))
    for r in rows:
        rank = r["rank"]
        dp, cp, tp = rank // 4, rank // 2 % 2, rank % 2
        assert {k: r[k] for k in dims.coord_names()} == {"pp": 0, "dp": dp, "cp": cp, "tp": tp, "ep": dp * 2 + cp}
        assert layout.rank_of(**{k: r[k] for k in dims.coord_names()}) == rank
    half = ParallelLayout(strategy="hybrid", dp=2, cp=2, tp=2, ep=2)
    assert [half.coords(r)["ep"] for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]  # ep inner to its own FSDP
    assert layout.to_dict()["ep"] == 4 and layout.to_dict()["world_size"] == 8


def test_factorizations_candidates_and_strategies_follow_the_table(with_cp_ep, compose_cfg):
    from parallel.plan.cli import specs_from_cfg
    from parallel.plan.cost_model import Candidate
    from parallel.plan.search import enumerate_candidates, strategy_of

    expected = {
        t
        for t in itertools.product(range(1, 5), repeat=5)
        if t[0] * t[1] * t[2] * t[3] == 4 and (t[0] * t[3]) % t[4] == 0
    }
    four = factorizations(4)
    assert set(four) == expected and len(four) == len(expected) == 20
    assert four == sorted(four, key=lambda t: tuple(-s for s in t)) and four[0] == (4, 1, 1, 1, 4)
    assert (1, 4, 1, 1, 2) not in four  # ep=2 with dp x cp = 1: nothing to borrow
    assert strategy_for(dp=2, ep=2) == "hybrid" and strategy_for(dp=2) == "ddp"
    assert describe_factorization(2, 1, 1, 2, 4) == "parallel=hybrid dp.size=2 cp.size=2 ep.size=4"
    c = Candidate(dp=2, cp=2, ep=4)
    assert c.world_size == 4 and strategy_of(c) == "hybrid"

    cfg = compose_cfg("model=gpt_small", "topology.nproc_per_node=4", "data.global_batch_size=8")
    model, hardware, workload = specs_from_cfg(cfg)
    cands = list(enumerate_candidates(model=model, hardware=hardware, workload=workload))
    assert all(c.world_size == 4 for c in cands)
    assert {c.ep for c in cands} == {1}  # no expert to split in a dense model (and no ep cost terms yet)
    assert {c.cp for c in cands} == {1, 2, 4}


def test_validation_refuses_an_ep_that_does_not_divide_dp_cp(with_cp_ep, compose_cfg):
    from trainer.validate import ConfigError, build_layout, validate

    cfg = compose_cfg("parallel=hybrid", "dp.size=2", "tp.size=1", "pp.size=1", "topology.nproc_per_node=4")
    OmegaConf.set_struct(cfg, False)
    cfg.cp.size = 2
    cfg.ep.size = 4
    layout = build_layout(cfg)
    assert layout.sizes == {"dp": 2, "tp": 1, "pp": 1, "cp": 2, "ep": 4} and layout.world_size == 4
    cfg.topology.nproc_per_node = None
    assert build_layout(cfg).nproc_per_node == 4  # null follows the layout: ep adds no worker
    cfg.topology.nproc_per_node = 4
    cfg.ep.size = 3
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert (
        "ep.size=3 does not divide dp.size=2 x cp.size=2 = 4, the ranks ep borrows (it adds none of its own); "
        "set ep.size to one of 1, 2, 4, or change dp.size / cp.size so that 3 divides their product"
    ) in str(err.value)
    assert "topology" not in str(err.value)  # the world fits: 2 x 2 workers, ep borrows
    cfg.ep.size = 2
    cfg.parallel.name = "ddp"
    with pytest.raises(ConfigError, match="ep.size=2 with parallel=ddp: ddp does not use the ep dimension"):
        validate(cfg)
    assert dims.borrow_problems({"dp": 2, "cp": 2, "tp": 2, "ep": 8}, asked={"ep": ["tp"]}) == []
    assert dims.borrow_problems({"dp": 2, "cp": 2, "tp": 2, "ep": 8})[0].startswith("ep.size=8 does not divide")


def test_a_borrowing_row_with_a_mesh_place_is_refused(monkeypatch):
    bad = MeshDim("ep", 3, "ep.size", "EPConfig", "expert parallel", borrows=("dp",))
    monkeypatch.setattr(dims, "DIMENSIONS", (*dims.DIMENSIONS, bad))
    with pytest.raises(ValueError, match=r"\['ep'\] borrow their ranks, so their mesh_place must be None"):
        dims.mesh_names()


def _groups(mesh) -> list[int]:
    import torch.distributed as dist

    return sorted(dist.get_process_group_ranks(mesh.get_group()))


def _meshes_on(rank: int, layout: ParallelLayout, asked=()):
    """The world mesh and what parallel/foundation/meshes.py derives from it, on ``rank`` of a fake process group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from parallel.foundation.meshes import expert_meshes, fsdp_mesh, loss_mesh

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=layout.world_size)
    try:
        world = init_device_mesh("cpu", layout.mesh_shape, mesh_dim_names=layout.mesh_dim_names)
        ep, ep_fsdp = (
            expert_meshes(world, layout.sizes, name="ep", asked=asked) if "ep" in dims.borrowing() else (None, None)
        )
        return {
            "fsdp": _groups(fsdp_mesh(world, layout.sizes)),
            "loss": _groups(loss_mesh(world, layout.sizes)),
            "fsdp_names": fsdp_mesh(world, layout.sizes).mesh_dim_names,
            "ep": _groups(ep) if ep is not None else None,
            "ep_fsdp": _groups(ep_fsdp) if ep_fsdp is not None else None,
        }
    finally:
        dist.destroy_process_group()


def test_todays_fsdp_mesh_is_the_dp_mesh():
    layout = ParallelLayout(strategy="hybrid", dp=2, tp=2, pp=2)
    for rank in range(layout.world_size):
        got = _meshes_on(rank, layout)
        c = layout.coords(rank)
        dp_group = sorted(layout.rank_of(pp=c["pp"], dp=d, cp=0, tp=c["tp"]) for d in range(2))
        assert got["fsdp"] == got["loss"] == dp_group and got["fsdp_names"] == ("dp",)


@pytest.mark.parametrize(("ep", "asked"), [(2, ()), (4, ()), (8, ("tp",))])
def test_expert_meshes_borrow_dp_cp_and_leave_their_fsdp_mesh(with_cp_ep, ep, asked):
    layout = ParallelLayout(strategy="hybrid", pp=2, dp=2, cp=2, tp=2, ep=ep)
    lenders = dims.lenders("ep", asked=asked)
    for rank in range(layout.world_size):
        got = _meshes_on(rank, layout, asked=asked)
        c = layout.coords(rank)
        same = {n: c[n] for n in dims.mesh_names() if n not in lenders}  # what a borrowed group keeps fixed
        pool = [r for r in range(layout.world_size) if {n: layout.coords(r)[n] for n in same} == same]
        data = sorted(r for r in range(16) if (layout.coords(r)["pp"], layout.coords(r)["tp"]) == (c["pp"], c["tp"]))
        assert got["fsdp"] == got["loss"] == data and got["fsdp_names"] == ("dp_cp",)
        flat = {r: _flat(layout.coords(r), lenders, layout) for r in pool}
        assert len(pool) == math.prod(layout.size(n) for n in lenders)
        assert got["ep"] == sorted(r for r in pool if flat[r] // ep == flat[rank] // ep)  # ep: neighbours
        assert got["ep_fsdp"] == sorted(r for r in pool if flat[r] % ep == flat[rank] % ep)  # the complement
        assert len(got["ep"]) == ep and len(got["ep_fsdp"]) * ep == len(pool)
        assert set(got["ep"]) & set(got["ep_fsdp"]) == {rank}
    if ep == 2:  # rank 5 = pp 0, dp 1, cp 0, tp 1: its ep pair is cp 0/1, its expert FSDP the other dp
        got = _meshes_on(5, layout)
        assert got["ep"] == [5, 7] and got["ep_fsdp"] == [1, 5]


def _flat(coords: dict[str, int], over: tuple[str, ...], layout: ParallelLayout) -> int:
    flat = 0
    for n in over:
        flat = flat * layout.size(n) + coords[n]
    return flat


def test_expert_meshes_refuse_a_degree_that_does_not_divide(with_cp_ep):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from parallel.foundation.meshes import expert_meshes

    layout = ParallelLayout(strategy="hybrid", dp=2, cp=2, ep=4)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        world = init_device_mesh("cpu", layout.mesh_shape, mesh_dim_names=layout.mesh_dim_names)
        with pytest.raises(ValueError, match="ep.size=3 does not divide dp.size=2 x cp.size=2 = 4"):
            expert_meshes(world, {**layout.sizes, "ep": 3}, name="ep")
    finally:
        dist.destroy_process_group()
