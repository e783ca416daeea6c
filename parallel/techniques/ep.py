"""Expert parallel: each MoE block's experts split over the ``ep`` mesh, tokens sent to their experts' owners and
back by all-to-all (torchtitan's and Megatron-core's dispatch; GShard's layout).

``apply_ep`` does two things to every ``models.moe.MoE`` block of a module (and every other module behind the same
dispatch seam, ``models.moe.dispatch_seams``: the Hugging Face backend's experts):

1. The stacked expert weights (E, ...) become DTensors sharded on dim 0 over the ep mesh (``Shard(0)``): rank
   ``r`` of ``ep`` holds experts ``r x E/ep`` to ``(r + 1) x E/ep - 1``. The router and everything else stay
   replicated: every rank routes its own tokens. FSDP2 then shards the experts over their own mesh, the ranks
   the ep groups leave (``parallel/foundation/meshes.py`` ``expert_meshes``), and the rest over dp x cp.
2. The block's ``LocalDispatch`` seam gets an ``AllToAllDispatch``: after the local sort by expert, the rows
   for expert e go to the rank owning it (``all_to_all_single`` with this step's uneven splits, the counts
   exchanged first), are grouped there by local expert, run through the local experts and come back the same
   way, where ``combine`` weighs and sums them into their tokens exactly as without expert parallel.

Gradients: an expert's gradient on its owner sums the contributions of the tokens every ep rank sent it, each
rank's loss already scaled to the global token mean over dp x cp (``parallel/foundation/token_loss.py``), and FSDP2
then averages over the experts' own mesh only; so the outputs' gradient is divided by ep on its way back into the
experts and the rows' gradient multiplied by ep on its way out (exact for powers of two): the experts' gradients
are the mean over every data-parallel rank, the rest unchanged, and the update equals one process's. (FSDP2's
``set_gradient_divide_factor`` would say it in one line but reduces with PREMUL_SUM, which gloo refuses.) The
all-to-all's backward is the reverse all-to-all; both directions are timed (``A2AMeter``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from models.moe import LocalDispatch, Routed, dispatch_seams, has_values, stacked_experts
from parallel.foundation.all_to_all import exchange, timed_all_to_all
from parallel.foundation.intervals import IntervalLog, union_seconds
from parallel.foundation.meshes import expert_meshes


class A2AMeter(IntervalLog):
    """[start, end] of every expert-parallel all-to-all on this rank (dispatch and combine, forward and backward,
    the split exchange included)."""

    count_key = "ep_a2a_calls"


class EPMeter:
    """Expert parallel's all-to-alls as an engine's meter, over every local part's ``A2AMeter`` (a pipeline rank's
    stages as one union): ``ep_a2a_time_s``, ``ep_a2a_fraction`` of the step, ``ep_a2a_calls`` each step (logged
    on every step), ``ep_a2a_time_s_total`` in the summary."""

    def __init__(self, logs: list[A2AMeter]):
        self.logs = logs
        self.total = 0.0

    def step(self, measure: bool = True) -> AbstractContextManager:
        return nullcontext()

    def metrics(self, elapsed_s: float) -> dict[str, Any]:
        intervals = [i for log in self.logs for i in log.take_intervals()]
        busy = union_seconds(intervals)
        self.total += busy
        return {
            "ep_a2a_time_s": busy,
            "ep_a2a_fraction": min(1.0, busy / elapsed_s),
            A2AMeter.count_key: len(intervals),
        }

    def summary(self) -> dict[str, Any]:
        return {"ep_a2a_time_s_total": self.total}


@dataclass
class EPRouted(Routed):
    """``Routed`` after the all-to-all: ``rows`` and ``counts`` are this rank's experts' (grouped by local
    expert); the rest is what ``combine`` needs to send the outputs back."""

    send_splits: list[int] | None = None
    """Rows this rank sent to each ep rank (the local rows, grouped by owner)."""
    recv_splits: list[int] | None = None
    """Rows each ep rank sent here."""
    order: torch.Tensor | None = None
    """Received row of each local-expert-ordered row (received rows come source rank by source rank)."""


class AllToAllDispatch(LocalDispatch):
    """``LocalDispatch``'s local sort, then the rows exchanged with the ep group so each rank runs its own
    ``n_experts / ep`` experts over every ep rank's rows for them."""

    def __init__(self, n_experts: int, capacity_factor: float, *, mesh: DeviceMesh, meter: IntervalLog | None = None):
        super().__init__(n_experts, capacity_factor)
        self.ep = mesh.size()
        if n_experts % self.ep:
            raise ValueError(f"model.n_experts={n_experts} is not divisible by ep.size={self.ep}")
        self.group = mesh.get_group()
        self.local_experts = n_experts // self.ep
        self.meter = meter

    # dispatch and combine run eagerly also inside a compiled block: the rows each rank sends are host values
    # (``tolist``) and the exchanges are timed, which dynamo would trace as a dozen graph breaks per block, then
    # recompile for every new row count
    @torch.compiler.disable
    def dispatch(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> EPRouted:
        routed = super().dispatch(x, idx, weights)
        ep, local = self.ep, self.local_experts
        if has_values(routed.counts):
            # per source rank, per local expert
            recv = exchange(routed.counts, group=self.group, log=self.meter).view(ep, local)
            send_splits, recv_splits = routed.counts.view(ep, local).sum(1).tolist(), recv.sum(1).tolist()
        else:  # the dry run's shapes (meta, fake): balanced routing
            per = routed.rows.shape[0] // (ep * local)
            recv = torch.full((ep, local), per, dtype=torch.long, device=routed.counts.device)
            send_splits = recv_splits = [per * local] * ep
        rows = timed_all_to_all(
            routed.rows,
            group=self.group,
            log=self.meter,
            out_splits=recv_splits,
            in_splits=send_splits,
            grad_scale=float(ep),
        )
        order = _by_local_expert(recv, rows=sum(recv_splits))
        return EPRouted(
            rows=rows[order],
            counts=recv.sum(0),
            token=routed.token,
            weight=routed.weight,
            dropped=routed.dropped,
            send_splits=send_splits,
            recv_splits=recv_splits,
            order=order,
        )

    @torch.compiler.disable
    def combine(self, y: torch.Tensor, routed: EPRouted, tokens: int) -> torch.Tensor:
        back = torch.empty_like(routed.order).index_copy_(
            0, routed.order, torch.arange(routed.order.numel(), device=routed.order.device)
        )
        y = timed_all_to_all(
            y[back],
            group=self.group,
            log=self.meter,
            out_splits=routed.send_splits,
            in_splits=routed.recv_splits,
            grad_scale=1.0 / self.ep,
        )
        return super().combine(y, routed, tokens)


def _by_local_expert(recv: torch.Tensor, *, rows: int) -> torch.Tensor:
    """The received rows (source-major: source 0's rows for each local expert, then source 1's ...) reordered
    expert-major (expert 0's rows from every source in source order, then expert 1's ...), as the experts
    read them: the received row of each expert-ordered row. ``recv``: (sources, local experts) row counts."""
    sizes = recv.reshape(-1)
    starts = (sizes.cumsum(0) - sizes).view(recv.shape).t().reshape(-1)  # each (expert, source) segment's start
    lengths = recv.t().reshape(-1)
    out_starts = lengths.cumsum(0) - lengths
    shift = torch.repeat_interleave(starts - out_starts, lengths, output_size=rows)
    return torch.arange(rows, device=recv.device) + shift


def apply_ep(module: nn.Module, *, ep_mesh: DeviceMesh, meter: IntervalLog | None = None) -> list[nn.Module]:
    """Shard every MoE block's experts of ``module`` over ``ep_mesh`` and route its tokens by all-to-all;
    returns the expert modules (FSDP2 wraps each over the experts' own mesh)."""
    from torch.distributed.tensor import DTensor, Shard

    ep, rank = ep_mesh.size(), ep_mesh.get_local_rank()
    experts = []
    for block in dispatch_seams(module):
        block.dispatcher = AllToAllDispatch(
            block.n_experts, block.dispatcher.capacity_factor, mesh=ep_mesh, meter=meter
        )
        holder = stacked_experts(block)
        for name, param in list(holder.named_parameters(recurse=False)):
            local = param.detach().chunk(ep, dim=0)[rank].clone()
            sharded = DTensor.from_local(local, ep_mesh, [Shard(0)], run_check=False)
            setattr(holder, name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        experts.append(holder)
    return experts


class ExpertParallel:
    """ep as ``compose`` applies it, after context parallel (``MeshDim.technique``): each MoE block's experts sharded
    over the ep mesh borrowed from dp x cp, its tokens routed by all-to-all (one log per part, one meter over them);
    the experts are FSDP2 units of their own mesh, the lenders' ranks holding the same experts."""

    step = "expert parallel"

    def __init__(self, *, mesh: Any, sizes: Any, settings: Any):
        self.world, self.sizes = mesh, sizes
        self.logs: list[A2AMeter] = []

    def apply(self, module: nn.Module) -> list[tuple[nn.Module, DeviceMesh]]:
        """The experts sharded and dispatched; returns each with the mesh FSDP2 shards it over."""
        ep_mesh, experts_mesh = expert_meshes(self.world, self.sizes, name="ep")  # cached on the root mesh
        log = A2AMeter()
        self.logs.append(log)
        return [(unit, experts_mesh) for unit in apply_ep(module, ep_mesh=ep_mesh, meter=log)]

    def meter(self) -> EPMeter | None:
        return EPMeter(self.logs) if self.logs else None

    def sample_share(self) -> None:
        return None  # every rank of an ep group keeps its own tokens


technique = ExpertParallel
"""What ``compose`` makes of this module for a run (``technique(mesh=..., sizes=..., settings=...)``)."""
