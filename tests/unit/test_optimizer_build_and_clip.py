"""The optimizer built over an engine's parameters (groups by kind, fused or foreach kernels), and clipping's
arithmetic on plain and DTensor gradients."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from parallel.foundation import grad_clip
from parallel.foundation.grad_clip import clip_grad_norm_, total_grad_norm
from parallel.foundation.optimizer import build_optimizer_over, implementation_kwargs, param_groups_by_kind


def _params(n: int = 3) -> list[nn.Parameter]:
    torch.manual_seed(0)
    return [nn.Parameter(torch.randn(4, 3)) for _ in range(n)]


def _sharded(params: list[nn.Parameter], mesh) -> list[nn.Parameter]:
    return [nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)])) for p in params]


def test_parameters_are_grouped_by_kind_plain_first_then_mesh_by_mesh(gloo_one_rank):
    dp = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    tp = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    plain = _params(4)
    on_dp, on_tp = _sharded(plain[:2], dp), _sharded(plain[2:3], tp)
    groups = param_groups_by_kind([on_dp[0], plain[3], on_tp[0], on_dp[1]])
    assert [[id(p) for p in g["params"]] for g in groups] == [
        [id(plain[3])],
        [id(on_dp[0]), id(on_dp[1])],
        [id(on_tp[0])],
    ]
    assert [len(g["params"]) for g in param_groups_by_kind(plain)] == [4]  # one kind: one group
    assert [len(g["params"]) for g in param_groups_by_kind(on_dp)] == [2]


def test_implementation_arguments_follow_the_setting_the_class_and_what_the_user_gave():
    plain = _params()
    assert implementation_kwargs(torch.optim.AdamW, plain, implementation="auto") == {"fused": True}
    assert implementation_kwargs(torch.optim.RMSprop, plain, implementation="auto") == {}  # no fused kernel
    assert implementation_kwargs(torch.optim.AdamW, plain, implementation="foreach") == {"foreach": True}
    assert implementation_kwargs(torch.optim.AdamW, plain, implementation="for-loop") == {"foreach": False}
    as_ints = [torch.zeros(3, dtype=torch.int64)]
    assert implementation_kwargs(torch.optim.AdamW, as_ints, implementation="auto") == {}  # fused takes floats only
    assert implementation_kwargs(torch.optim.AdamW, plain, implementation="auto", given=["foreach"]) == {}
    with pytest.raises(ValueError, match=r"optim.implementation=fused: RMSprop takes no `fused` argument; use"):
        implementation_kwargs(torch.optim.RMSprop, plain, implementation="fused")


def test_fused_over_dtensors_only_where_torch_shards_the_kernel(gloo_one_rank):
    """torch registers DTensor rules for Adam's and AdamW's fused kernels only: SGD over FSDP2's or TP's
    parameters takes torch's default under auto, and an explicit fused is refused before the first step."""
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    mixed = [*_sharded(_params(2), mesh), *_params(1)]
    assert implementation_kwargs(torch.optim.AdamW, mixed, implementation="auto") == {"fused": True}
    assert implementation_kwargs(torch.optim.SGD, mixed, implementation="auto") == {}
    assert implementation_kwargs(torch.optim.SGD, _params(), implementation="auto") == {"fused": True}
    with pytest.raises(ValueError, match=r"fused kernel of Adam, AdamW only, and this run's SGD updates DTensor"):
        implementation_kwargs(torch.optim.SGD, mixed, implementation="fused")
    for p in mixed:
        p.grad = torch.ones_like(p)
    sgd = build_optimizer_over(functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9), mixed)
    sgd.step()  # torch's default kernels over the shards and the plain tensor
    assert float(mixed[2].detach().sum()) == pytest.approx(float(_params(1)[0].detach().sum()) - 0.1 * mixed[2].numel())


@pytest.mark.parametrize("implementation", ["auto", "foreach", "for-loop"])
def test_grouped_fused_or_foreach_updates_match_torchs_loop_over_plain_tensors(gloo_one_rank, implementation):
    """TP's mix (shards beside plain tensors) updated in one optimizer: the same parameters as torch's
    per-parameter AdamW loop over plain copies, step after step."""
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    reference, plain = _params(), _params()
    mixed = [*_sharded(plain[:2], mesh), plain[2]]
    ref_opt = torch.optim.AdamW(reference, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)
    factory = functools.partial(torch.optim.AdamW, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    opt = build_optimizer_over(factory, mixed, implementation=implementation)
    assert len(opt.param_groups) == 2 and all(g["lr"] == 1e-2 for g in opt.param_groups)
    assert opt.defaults.get("fused") is (True if implementation == "auto" else None)
    torch.manual_seed(2)
    for _ in range(3):
        for ref, p in zip(reference, mixed):
            g = torch.randn_like(ref)
            ref.grad = g.clone()
            p.grad = distribute_tensor(g.clone(), mesh, p.placements) if hasattr(p, "placements") else g.clone()
        ref_opt.step()
        opt.step()
    for ref, p in zip(reference, mixed):
        got = p.full_tensor() if hasattr(p, "full_tensor") else p
        torch.testing.assert_close(got.detach(), ref.detach(), rtol=1e-6, atol=1e-7)


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


def test_pending_sums_are_reduced_in_one_all_reduce_and_kept_summed(gloo_one_rank, monkeypatch):
    """Sequence parallel's norm weights: replicated parameters with pending-sum gradients. Their sums are made
    by one flat all-reduce and written back replicated; the shards' squares by one more (two sharded groups
    on the same mesh dimension share it); norm and clipping as torch's over the whole tensors."""
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    reference = _params(5)
    torch.manual_seed(1)
    grads = [torch.randn_like(r) for r in reference]
    params = []
    for i, (ref, g) in enumerate(zip(reference, grads)):
        ref.grad = g.clone()
        if i < 3:  # replicated, gradient pending a sum
            p = nn.Parameter(DTensor.from_local(ref.detach().clone(), mesh, [Replicate()]))
            p.grad = DTensor.from_local(g.clone(), mesh, [Partial()])
        else:  # rows, then columns: one mesh dimension
            placement = Shard(i - 3)
            p = nn.Parameter(distribute_tensor(ref.detach().clone(), mesh, [placement]))
            p.grad = distribute_tensor(g.clone(), mesh, [placement])
        params.append(p)
    calls = []
    real = grad_clip.dist.all_reduce
    monkeypatch.setattr(grad_clip.dist, "all_reduce", lambda t, **kw: calls.append(t.numel()) or real(t, **kw))
    expected = torch.nn.utils.clip_grad_norm_(reference, 0.5)
    norm = clip_grad_norm_(params, 0.5)
    assert calls == [3 * 12, 1]
    assert float(norm) == pytest.approx(float(expected), rel=1e-6)
    for ref, p in zip(reference, params):
        assert not any(pl.is_partial() for pl in p.grad.placements)
        torch.testing.assert_close(p.grad.full_tensor(), ref.grad, rtol=1e-6, atol=1e-7)


def test_the_norm_of_shards_is_the_norm_of_the_whole():
    """Squares summed in float64: a layout's pieces give single's float32 norm, the float64 norm rounded
    (torch's float32 norm of these tensors is 1.4e-6 below it, and of their thirds 3.1e-7)."""
    torch.manual_seed(0)
    grads = [torch.randn(n) for n in (300_000, 40_000, 77)]
    pieces = [p for g in grads for p in g.tensor_split(3)]
    exact = torch.stack([g.double().square().sum() for g in grads]).sum().sqrt().float()
    assert torch.equal(total_grad_norm(grads), exact)
    assert torch.equal(total_grad_norm(pieces), exact)
