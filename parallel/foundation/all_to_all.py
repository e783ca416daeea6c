"""The timed all-to-all of the techniques that exchange rows between ranks: expert parallel's token dispatch
(``parallel/techniques/ep.py``: uneven splits, this step's routing) and context parallel's Ulysses attention
(``parallel/techniques/cp.py``: even splits, sequence chunks for head groups).

``all_to_all_single`` from its issue to its completion, added to a log (``add(start, end)``: an ``IntervalLog``, whose
union over a step is the technique's all-to-all time); as an autograd function its backward is the reverse exchange
(a row's gradient goes back to the rank that sent it), timed the same way, and optionally scaled (expert parallel's
gradient bookkeeping). Blocking, on gloo and NCCL alike: the call returns when this rank's share has arrived.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch
import torch.distributed as dist


class Log(Protocol):
    def add(self, start: float, end: float) -> None: ...


def exchange(
    x: torch.Tensor,
    *,
    group,
    log: Log | None = None,
    out_splits: list[int] | None = None,
    in_splits: list[int] | None = None,
) -> torch.Tensor:
    """One ``all_to_all_single`` of ``x``'s rows (dim 0): ``in_splits[j]`` rows to rank j, ``out_splits[i]`` from rank
    i (None: equal parts), timed into ``log``. Not differentiable (``timed_all_to_all`` is)."""
    x = x.contiguous()  # a gradient arrives in any layout; the exchange reads and writes dense rows
    out = torch.empty_like(x) if out_splits is None else x.new_empty((sum(out_splits), *x.shape[1:]))
    start = time.perf_counter()
    dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    if log is not None:
        log.add(start, time.perf_counter())
    return out


class _TimedAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, log, grad_scale):
        ctx.splits, ctx.group, ctx.log, ctx.grad_scale = (out_splits, in_splits), group, log, grad_scale
        return exchange(x, group=group, log=log, out_splits=out_splits, in_splits=in_splits)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = exchange(grad, group=ctx.group, log=ctx.log, out_splits=in_splits, in_splits=out_splits)
        return (back * ctx.grad_scale if ctx.grad_scale != 1 else back), None, None, None, None, None


def timed_all_to_all(
    x: torch.Tensor,
    *,
    group,
    log: Log | None,
    out_splits: list[int] | None = None,
    in_splits: list[int] | None = None,
    grad_scale: float = 1.0,
) -> torch.Tensor:
    """``exchange`` whose backward is the reverse exchange, times ``grad_scale``, both directions timed into
    ``log``."""
    return _TimedAllToAll.apply(x, out_splits, in_splits, group, log, grad_scale)
