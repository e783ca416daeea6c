"""DDP's communication is read from its C++ reducer on the logged steps only (no Python comm hook)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from parallel.assembly.module_engine import ModuleEngine
from parallel.techniques.ddp import ReducerCommMeter


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)])


def test_logged_steps_are_timed_and_others_are_not(gloo_one_rank):
    """The steps the loop says it logs, whatever their numbers (a resumed run's logged steps are 10, 20 ...
    while its meter sees its 1st, 3rd ... step)."""
    ddp = DDP(_model(), bucket_cap_mb=0.02)  # 16 KiB buckets: several per backward
    meter = ReducerCommMeter(ddp)
    logged = {1, 2, 5}
    seen = {}
    for step in range(1, 8):
        with meter.step(step in logged):
            ddp(torch.randn(8, 64)).sum().backward()
        seen[step] = meter.take()
    measured = {s for s, v in seen.items() if v is not None}
    assert measured == logged
    for step in measured:
        seconds, buckets = seen[step]
        assert 0 < seconds and math.isfinite(seconds), seen[step]  # measured; how long is the machine's
        assert buckets >= (1 if step == 1 else 2), seen  # the first backward: one 1 MiB bucket, then rebuilt
    assert meter.take() is None  # read once per step


def test_engine_reports_ddp_comm_with_accumulation(gloo_one_rank):
    """Two accumulated chunks, the first under no_sync: the measured step's buckets are the synchronising
    backward's, and the engine reports them as comm_time_s within the step."""
    ddp = DDP(_model(), bucket_cap_mb=0.02)
    meter = ReducerCommMeter(ddp)
    engine = ModuleEngine(
        ddp,
        accumulation=2,
        loss_fn=lambda out, y, reduction: getattr((out - y).pow(2), reduction)(),
        no_sync=ddp.no_sync,
        dp_timer=meter,
    )
    for step in range(1, 4):
        engine.train_step(torch.randn(8, 64), torch.randn(8, 64))
        metrics = engine.step_metrics()
        assert metrics["comm_buckets"] >= (1 if step == 1 else 2), metrics
        assert 0 < metrics["comm_time_s"] and 0 < metrics["comm_fraction"] <= 1, metrics


class _WorldMesh:
    """What wrap_ddp reads of a mesh: its process group (here the one-rank world)."""

    def get_group(self):
        import torch.distributed as dist

        return dist.group.WORLD


def test_ddp_keeps_torchs_first_small_bucket_unless_a_size_is_given(gloo_one_rank):
    """dp.bucket_cap_mb null (the default): torch's buckets, a first one of 1 MiB whose all-reduce overlaps the rest
    of the backward; any number sizes the first bucket too (torch's rule: gpt_small's 3.5 MB of gradients then went
    in one all-reduce after the whole backward)."""
    from parallel.techniques.ddp import wrap_ddp

    default, _ = wrap_ddp(_model(), dp_mesh=_WorldMesh(), device=torch.device("cpu"))
    sized, _ = wrap_ddp(_model(), dp_mesh=_WorldMesh(), device=torch.device("cpu"), bucket_cap_mb=25.0)
    assert default.bucket_bytes_cap_default and default.bucket_bytes_cap == 25 * 2**20
    assert not sized.bucket_bytes_cap_default and sized.bucket_bytes_cap == 25 * 2**20


def test_ddp_gradients_are_views_of_its_buckets_with_the_same_values(gloo_one_rank):
    """wrap_ddp's gradients live in DDP's all-reduce buckets (no copy back after the reduction, the memory held
    once); their values are what a DDP with separate gradients computes, step after step, with set_to_none
    between steps (the loop's zero_grad) and an optimizer updating the weights."""
    from parallel.techniques.ddp import wrap_ddp

    views, _ = wrap_ddp(_model(), dp_mesh=_WorldMesh(), device=torch.device("cpu"))
    plain = DDP(_model())
    assert views.gradient_as_bucket_view and not plain.gradient_as_bucket_view
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (views, plain)]
    torch.manual_seed(1)
    for _ in range(3):
        x = torch.randn(8, 64)
        for m, opt in zip((views, plain), opts, strict=True):
            opt.zero_grad(set_to_none=True)
            m(x).pow(2).mean().backward()
        for a, b in zip(views.parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7)
        for opt in opts:
            opt.step()
    storages = {p.grad.untyped_storage().data_ptr() for p in views.parameters()}
    assert len(storages) == 1, storages  # the model's 100 KB of gradients: one bucket, every gradient a view of it
    assert len({p.grad.untyped_storage().data_ptr() for p in plain.parameters()}) == len(list(plain.parameters()))
