"""Muon over sharded matrices (parallel/optim/muon_shards.py) on 4 real gloo processes, a 2 x 2 mesh: FSDP2-like
row shards, TP-like column shards, both at once, uneven sizes, a replicated matrix and experts sharded by expert.
Both ways (spread over owner ranks, gathered everywhere) give, bitwise, torch.optim.Muon's update of the whole
matrices: each matrix reaches torch's step whole, so nothing but the gather differs from one process. The same 4
processes run both ways, one after the other, each from the same start."""

from __future__ import annotations

import multiprocessing
import traceback

import pytest
import torch

pytestmark = pytest.mark.slow

#: (shape, placements over the (dp, tp) mesh)
CASES = {
    "layers.0.attention.wq.weight": ((12, 8), ("S0", "S1")),  # FSDP rows x TP columns
    "layers.0.attention.wo.weight": ((8, 12), ("S0", "S0")),  # FSDP over a row-wise TP shard: dim 0 twice
    "layers.0.feed_forward.w1.weight": ((7, 5), ("S1", "R")),  # uneven
    "layers.0.feed_forward.w2.weight": ((5, 9), ("R", "R")),  # replicated: stepped where it is
    "layers.1.feed_forward.experts.w1": ((4, 6, 5), ("S0", "R")),  # experts sharded by expert: held whole
    "norm.weight": ((8,), ("S0", "R")),  # AdamW
}
STEPS = 2


def _placements(codes):
    from torch.distributed.tensor import Replicate, Shard

    return [Replicate() if c == "R" else Shard(int(c[1])) for c in codes]


def _full_values(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(shape, generator=g) for n, (shape, _) in CASES.items()}


WAYS = ("spread", "everywhere")


def _worker(rank: int, store: str, queue) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from parallel.optim.muon import Muon

    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=4)
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        for way in WAYS:  # each from the same start, with its own parameters and optimizer
            start = _full_values(0)
            params = {
                n: torch.nn.Parameter(distribute_tensor(start[n], mesh, _placements(c))) for n, (_, c) in CASES.items()
            }
            opt = Muon(list(params.items()), lr=0.05, weight_decay=0.1, muon_gather=way, implementation="for-loop")
            for step in range(STEPS):
                grads = _full_values(100 + step)
                for n, p in params.items():
                    p.grad = distribute_tensor(grads[n], mesh, p.placements, src_data_rank=None)
                opt.step()
            # numpy arrays travel by value (torch tensors would go by shared memory, gone when the process ends)
            out = {n: p.detach().full_tensor().numpy() for n, p in params.items()}
            bufs = {n: opt.state[p]["momentum_buffer"].full_tensor().numpy() for n, p in params.items() if p.ndim >= 2}
            if rank == 0:
                queue.put(("ok", way, out, bufs))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the parent shows it
        queue.put(("error", None, traceback.format_exc(), None))


def _reference() -> dict[str, torch.Tensor]:
    """torch.optim.Muon over the whole matrices (an experts' tensor as its expert matrices), same gradients."""
    from parallel.optim.muon import muon_role

    start = _full_values(0)
    names = [n for n in CASES if muon_role(n, start[n]) == "muon"]
    pieces = {
        n: [torch.nn.Parameter(m.clone()) for m in (start[n] if start[n].ndim == 3 else [start[n]])] for n in names
    }
    muon = torch.optim.Muon([m for n in names for m in pieces[n]], lr=0.05, weight_decay=0.1)
    for step in range(STEPS):
        grads = _full_values(100 + step)
        for n in names:
            for m, g in zip(pieces[n], grads[n] if grads[n].ndim == 3 else [grads[n]]):
                m.grad = g.clone()
        muon.step()
    return {
        n: torch.stack([m.detach() for m in pieces[n]]) if start[n].ndim == 3 else pieces[n][0].detach() for n in names
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple]:
    """way -> (status, the parameters, the momentum buffers) from one start of 4 processes running both ways."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    store = str(tmp_path_factory.mktemp("muon_shards") / "store")
    procs = [ctx.Process(target=_worker, args=(r, store, queue)) for r in range(4)]
    for p in procs:
        p.start()
    found: dict[str, tuple] = {}
    while len(found) < len(WAYS):
        status, way, out, bufs = queue.get(timeout=240)
        if status != "ok":  # every way fails with the traceback
            found = {w: (status, out, None) for w in WAYS}
            break
        found[way] = (status, out, bufs)
    for p in procs:
        p.join(timeout=60)
    return found


@pytest.mark.parametrize("way", WAYS)
def test_sharded_matrices_get_torch_muons_update_bitwise(results, way):
    status, out, bufs = results[way]
    assert status == "ok", out
    want = _reference()
    out = {n: torch.from_numpy(a) for n, a in out.items()}
    for n, w in want.items():
        assert torch.equal(out[n], w), (n, (out[n] - w).abs().max().item())
    assert not torch.equal(out["layers.0.attention.wq.weight"], _full_values(0)["layers.0.attention.wq.weight"])
    # the momentum is kept sharded like its parameter and equals torch's for a whole 2-D matrix
    assert set(bufs) == {n for n in CASES if n != "norm.weight"}
