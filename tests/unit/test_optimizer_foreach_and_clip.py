"""The optimizer's foreach rule for DTensor parameters, and clipping's arithmetic on plain and DTensor gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from parallel.core.grad_clip import clip_grad_norm_
from parallel.core.optimizer import foreach_for


def _params(n: int = 3) -> list[nn.Parameter]:
    torch.manual_seed(0)
    return [nn.Parameter(torch.randn(4, 3)) for _ in range(n)]


def _sharded(params: list[nn.Parameter], mesh) -> list[nn.Parameter]:
    return [nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])) for p in params]


def test_foreach_left_to_torch_unless_parameters_mix_meshes(gloo_one_rank):
    dp = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    tp = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    plain = _params()
    assert foreach_for(plain) is None
    assert foreach_for(_sharded(plain, dp)) is None  # FSDP2 alone: torch's default (foreach on CUDA)
    assert foreach_for([*_sharded(plain[:2], dp), plain[2]]) is False  # a plain norm beside shards
    assert foreach_for([*_sharded(plain[:2], dp), *_sharded(plain[2:], tp)]) is False  # two meshes


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_clipping_matches_torch_for_plain_and_dtensor_gradients(gloo_one_rank, max_norm):
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    reference, plain = _params(), _params()
    sharded = _sharded(_params(), mesh)
    torch.manual_seed(1)
    for ref, p, s in zip(reference, plain, sharded):
        g = torch.randn_like(ref)
        ref.grad, p.grad = g.clone(), g.clone()
        s.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
    expected = torch.nn.utils.clip_grad_norm_(reference, max_norm)
    norm_plain = clip_grad_norm_(plain, max_norm)
    norm_sharded = clip_grad_norm_(sharded, max_norm)
    assert float(norm_plain) == pytest.approx(float(expected), rel=1e-6)
    assert float(norm_sharded) == pytest.approx(float(expected), rel=1e-6)
    for ref, p, s in zip(reference, plain, sharded):
        torch.testing.assert_close(p.grad, ref.grad, rtol=0, atol=0)
        torch.testing.assert_close(s.grad.full_tensor(), ref.grad, rtol=1e-6, atol=1e-7)
