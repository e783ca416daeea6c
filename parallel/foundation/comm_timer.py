"""How long a rank blocks in the collectives of one process group (tensor parallel's, typically).

DTensor turns redistributions into functional collectives (``_c10d_functional.all_reduce`` ...,
then ``wait_tensor``). A ``TorchDispatchMode`` sees them, forward and backward: it lets DTensor
desugar its ops first (returning ``NotImplemented`` for DTensor arguments, as ``CommDebugMode``
does), then times each collective on the watched group from issue to the matching ``wait_tensor``.
The union of those [issue, wait] intervals (collectives in flight together count once) is the time
this rank spent issuing and waiting for that group's communication, a share of the step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from parallel.foundation.intervals import union_seconds

_funcol = torch.ops._c10d_functional
COLLECTIVES = {
    _funcol.all_reduce,
    _funcol.all_reduce_coalesced,
    _funcol.all_gather_into_tensor,
    _funcol.all_gather_into_tensor_coalesced,
    _funcol.reduce_scatter_tensor,
    _funcol.reduce_scatter_tensor_coalesced,
    _funcol.all_to_all_single,
    _funcol.broadcast,
}
WAIT = _funcol.wait_tensor
# by name: an op's own hash is a Python call (OpOverload.__hash__), a string's is not
_COLLECTIVE_NAMES = frozenset(c._qualified_op_name for c in COLLECTIVES)
_WAIT_NAME = WAIT._qualified_op_name


class CollectiveTimer(TorchDispatchMode):
    """Use as a context manager around forward and backward; ``take()`` returns what was measured."""

    def __init__(self, *, group_name: str):
        super().__init__()
        self.group_name = group_name
        self._pending: dict[int, float] = {}  # id(output) -> time the collective was issued
        self.intervals: list[tuple[float, float]] = []
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # every op of the step (~2,900 on the tp pair's model) comes through here, so the ops that are neither
        # a collective nor its wait pass with one C call (getattr) and the op's own: no isinstance (an ABC
        # check), generator or op hash, and the op's C function called without OpOverload.__call__'s frame
        kwargs = kwargs or {}
        packet = getattr(func, "_overloadpacket", None)
        if packet is None:  # a higher-order operator
            return func(*args, **kwargs)
        if DTensor in types:
            return NotImplemented  # let DTensor desugar into local ops and collectives first
        name = packet._qualified_op_name
        if name in _COLLECTIVE_NAMES and self.group_name in (a for a in args if isinstance(a, str)):
            start = time.perf_counter()
            out = func(*args, **kwargs)
            self.count += 1
            for t in out if isinstance(out, (list, tuple)) else (out,):
                self._pending[id(t)] = start
            return out
        if name == _WAIT_NAME and id(args[0]) in self._pending:
            start = self._pending.pop(id(args[0]))
            out = func(*args, **kwargs)
            self.intervals.append((start, time.perf_counter()))
            return out
        return func._op(*args, **kwargs)

    def take(self) -> tuple[float, int]:
        """(seconds covered by the union of the collectives' intervals, collectives) since the last call."""
        seconds, count = union_seconds(self.intervals), self.count
        self.intervals, self.count = [], 0
        self._pending.clear()
        return seconds, count


class SampledCommMeter:
    """Runs a ``CollectiveTimer`` on the steps the loop measures (logged steps, at most one per window of
    ``trainer.measure_every``; it says which: ``Engine.measure_step``).

    The timer costs a Python dispatch per op, so the other steps run without it.
    """

    def __init__(self, timer: CollectiveTimer | None, *, prefix: str = "tp"):
        self.timer = timer
        self.prefix = prefix
        self.active = False
        self._start = 0.0
        self._step_s = 0.0
        self.history: list[tuple[float, float]] = []
        """(seconds, share of the step) of each measured step, for ``summary``."""

    def step(self, measure: bool = True) -> AbstractContextManager:
        """Context for one whole step (forward and backward of all its micro-batches), timed if ``measure``."""
        self.active = self.timer is not None and measure
        return self._measuring() if self.active else nullcontext()

    @contextmanager
    def _measuring(self) -> Iterator[None]:
        start = time.perf_counter()
        with self.timer:
            yield
        self._step_s = time.perf_counter() - start

    def metrics(self, elapsed_s: float | None = None) -> dict[str, float]:
        """The measured step's time, share and count (its share of its own window, not of ``elapsed_s``)."""
        if not self.active:
            return {}
        seconds, count = self.timer.take()
        p = self.prefix
        share = min(1.0, seconds / max(self._step_s, 1e-9))
        self.history.append((seconds, share))
        return {f"{p}_comm_time_s": seconds, f"{p}_comm_fraction": share, f"{p}_collectives": count}

    def summary(self) -> dict[str, float]:
        """The median measured step's time and share (``<prefix>_comm_time_s_median``, ``..._fraction_median``),
        the first measured step left out when there are others (it includes warm-up); empty when none was."""
        steps = self.history[1:] or self.history
        if not steps:
            return {}
        p, n = self.prefix, len(steps)
        times, shares = sorted(t for t, _ in steps), sorted(f for _, f in steps)
        return {f"{p}_comm_time_s_median": times[n // 2], f"{p}_comm_fraction_median": shares[n // 2]}
