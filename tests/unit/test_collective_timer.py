"""tp's collective timer: plain ops pass through unchanged and uncounted, functional collectives on the watched
group are counted and timed from issue to wait (DTensor's, desugared: tests/integration/test_tp_fsdp_parity.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.foundation.comm_timer import CollectiveTimer


def test_counts_the_watched_groups_collectives_and_passes_other_ops(gloo_one_rank):
    x = torch.arange(6.0).reshape(2, 3)
    group = dist.group.WORLD.group_name
    timer = CollectiveTimer(group_name=group)
    funcol = torch.ops._c10d_functional
    with timer:
        plain = (x @ x.T).relu_() + 1
        summed = funcol.wait_tensor(funcol.all_reduce(x, "sum", group))
    torch.testing.assert_close(plain, (x @ x.T).relu() + 1, rtol=0, atol=0)
    torch.testing.assert_close(summed, x, rtol=0, atol=0)
    assert len(timer.intervals) == 1
    seconds, count = timer.take()
    assert count == 1 and seconds > 0.0
    assert timer.take() == (0.0, 0)
