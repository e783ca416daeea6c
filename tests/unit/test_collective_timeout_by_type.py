"""A collective timeout is told by the exception's type (and, for gloo's plain RuntimeError, by having waited
topology.timeout_s in the step), never by its message text."""

from __future__ import annotations


def test_timeouts_are_recognised_by_type_not_message():
    import torch.distributed as dist

    from trainer.loop.fit import is_collective_timeout

    assert is_collective_timeout(dist.DistNetworkError("anything"), waited_s=0.0, timeout_s=300)
    assert is_collective_timeout(dist.DistBackendError("anything"), waited_s=0.0, timeout_s=300)
    # gloo raises a plain RuntimeError: a timeout only once the timeout has passed in the step
    assert is_collective_timeout(RuntimeError("Connection closed by peer"), waited_s=5.1, timeout_s=5)
    assert not is_collective_timeout(RuntimeError("timeout: not really"), waited_s=0.2, timeout_s=5)
    assert not is_collective_timeout(ValueError("timed out"), waited_s=60, timeout_s=5)
