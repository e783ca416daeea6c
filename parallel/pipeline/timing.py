"""When did each stage compute what: wall-clock intervals of every F/B/W action, per micro-batch.

``StageRecorder.instrument(stage)`` wraps a ``PipelineStage``'s own action methods
(``forward_one_chunk``, ``backward_one_chunk``, ``backward_weight_one_chunk``) on that instance, so
whatever torch schedule drives the stage, each action is timed where it computes; the time a rank
spends waiting for a peer's activations or gradients falls between actions and counts as idle. The
loss is computed by the schedule right after the last stage's forward: its time joins that forward.

Alongside the times it counts, per action: bytes sent to a stage on another rank (activations after
F, input gradients after B/I), and, on the steps the loop measures (``begin_step(count_saved=True)``: its
logged steps), the autograd-saved activation bytes a forward leaves alive until its backward, giving the
peak activation memory the schedule holds on each stage. Counting them takes a Python call per saved
tensor (a saved-tensor hook, ~2% of a step), so the other steps leave it out.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from parallel.foundation.activations import active_meter
from parallel.foundation.intervals import union_seconds


@dataclass
class Action:
    kind: str  # F, B (full or input backward), W
    stage: int
    micro_batch: int
    start: float
    end: float

    @property
    def label(self) -> str:
        return f"{self.kind}{self.micro_batch}"

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(_nbytes(o) for o in obj)
    return 0


@dataclass
class StepRecord:
    start: float = 0.0
    end: float = 0.0
    actions: list[Action] = field(default_factory=list)
    sent_activation_bytes: int = 0
    sent_gradient_bytes: int = 0
    peak_live_activation_bytes: dict[int, int] = field(default_factory=dict)


class StageRecorder:
    """Collects one step's actions on this rank; times are seconds since ``origin`` (set after a barrier)."""

    def __init__(self, *, origin: float | None = None):
        self.origin = time.perf_counter() if origin is None else origin
        self.step = StepRecord()
        self.count_saved = True
        """Whether this step's forwards count the activations they save (``peak_live_activation_bytes``)."""
        self._saved: dict[tuple[int, int], int] = {}  # (stage, mb) -> saved activation bytes alive
        self._live: dict[int, int] = {}

    def now(self) -> float:
        return time.perf_counter() - self.origin

    # ---- step boundaries ------------------------------------------------------------------------

    def begin_step(self, *, count_saved: bool = True) -> None:
        self.count_saved = count_saved
        self.step = StepRecord(start=self.now())
        self._saved.clear()
        self._live.clear()

    def end_step(self) -> StepRecord:
        self.step.end = self.now()
        return self.step

    # ---- instrumentation ------------------------------------------------------------------------

    def instrument(self, stage: Any, *, sends_forward: bool, sends_backward: bool) -> None:
        """Wrap ``stage``'s action methods; ``sends_*``: whether the neighbour is on another rank."""
        rec = self
        idx = stage.stage_index
        params = {p.data_ptr() for p in stage.submod.parameters()}
        fwd, bwd, bwd_w = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

        def forward_one_chunk(fwd_chunk_id, *args, **kwargs):
            t0 = rec.now()
            if rec.count_saved:
                with rec._counting_saved(params) as seen:
                    out = fwd(fwd_chunk_id, *args, **kwargs)
                rec._hold(idx, fwd_chunk_id, sum(seen.values()))
            else:
                out = fwd(fwd_chunk_id, *args, **kwargs)
            rec.step.actions.append(Action("F", idx, fwd_chunk_id, t0, rec.now()))
            if sends_forward:
                rec.step.sent_activation_bytes += _nbytes(out)
            return out

        def backward_one_chunk(bwd_chunk_id, *args, full_backward: bool = True, **kwargs):
            t0 = rec.now()
            out = bwd(bwd_chunk_id, *args, full_backward=full_backward, **kwargs)
            rec.step.actions.append(Action("B", idx, bwd_chunk_id, t0, rec.now()))
            if sends_backward:
                rec.step.sent_gradient_bytes += _nbytes(stage.bwd_cache.get(bwd_chunk_id))
            if full_backward:
                rec._release(idx, bwd_chunk_id)
            return out

        def backward_weight_one_chunk(bwd_chunk_id, *args, **kwargs):
            t0 = rec.now()
            out = bwd_w(bwd_chunk_id, *args, **kwargs)
            rec.step.actions.append(Action("W", idx, bwd_chunk_id, t0, rec.now()))
            rec._release(idx, bwd_chunk_id)
            return out

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk

    def wrap_loss(self, loss_fn):
        """The schedule computes the loss right after the last stage's forward: extend that forward."""
        rec = self

        def loss(output, target):
            if not rec.count_saved:
                value = loss_fn(output, target)
            else:
                with rec._counting_saved(set()) as seen:
                    value = loss_fn(output, target)
            last = rec.step.actions[-1] if rec.step.actions else None
            if last is not None and last.kind == "F":
                last.end = rec.now()
                if rec.count_saved:
                    rec._hold(last.stage, last.micro_batch, sum(seen.values()))
            return value

        return loss

    @contextmanager
    def _counting_saved(self, params: set[int]):
        """Bytes of the tensors autograd saves for backward in this block (parameters excluded)."""
        seen: dict[int, int] = {}
        outer = active_meter()  # the loop's per-rank meter: these hooks shadow its own, so chain to it

        def pack(t):
            ptr = t.data_ptr() if t.layout == torch.strided else id(t)
            if ptr not in params and ptr not in seen:
                seen[ptr] = t.numel() * t.element_size()
            return outer.pack(t) if outer is not None else t

        def unpack(t):
            return outer.unpack(t) if outer is not None else t

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield seen

    # ---- activation memory ----------------------------------------------------------------------

    def _hold(self, stage: int, mb: int, nbytes: int) -> None:
        self._saved[(stage, mb)] = self._saved.get((stage, mb), 0) + nbytes
        self._live[stage] = self._live.get(stage, 0) + nbytes
        peaks = self.step.peak_live_activation_bytes
        peaks[stage] = max(peaks.get(stage, 0), self._live[stage])

    def _release(self, stage: int, mb: int) -> None:
        self._live[stage] = self._live.get(stage, 0) - self._saved.pop((stage, mb), 0)


def union_busy(actions: list[Action], *, start: float, end: float) -> float:
    """Seconds within [start, end] covered by at least one action (actions on one rank never overlap
    in a single thread, but clamp anyway)."""
    return union_seconds(((a.start, a.end) for a in actions), within=(start, end))
