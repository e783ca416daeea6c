"""tp's collective timer: plain ops (and a DTensor's, desugared) pass through unchanged and uncounted, functional
collectives on the watched group are counted and timed from issue to wait."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate

from parallel.foundation.comm_timer import CollectiveTimer


def test_counts_the_watched_groups_collectives_and_passes_other_ops(gloo_one_rank):
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    x = torch.arange(6.0).reshape(2, 3)
    group = mesh.get_group().group_name
    timer = CollectiveTimer(group_name=group)
    funcol = torch.ops._c10d_functional
    with timer:
        plain = (x @ x.T).relu_() + 1
        doubled = (DTensor.from_local(x.clone(), mesh, [Replicate()]) * 2).to_local()
        summed = funcol.wait_tensor(funcol.all_reduce(x, "sum", group))
    torch.testing.assert_close(plain, (x @ x.T).relu() + 1, rtol=0, atol=0)
    torch.testing.assert_close(doubled, x * 2, rtol=0, atol=0)
    torch.testing.assert_close(summed, x, rtol=0, atol=0)
    assert len(timer.intervals) == 1
    seconds, count = timer.take()
    assert count == 1 and seconds > 0.0
    assert timer.take() == (0.0, 0)
