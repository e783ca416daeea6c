"""Measured activation memory: the bytes autograd keeps alive for backward, live and at their peak.

``SavedActivationMeter.step()`` installs ``torch.autograd.graph.saved_tensors_hooks`` around one training
step. Every tensor autograd saves is counted once per storage (a view and its base are one buffer) from the
moment it is saved until autograd frees it (after its backward ran), so ``peak`` is the largest amount of
saved activation memory alive at once during the step, on this rank, whatever the strategy (a pipeline
schedule's in-flight micro-batches included). Parameters are not activations and are excluded.

Activation checkpointing keeps tensors outside autograd's saved-tensor mechanism, and those are counted too:
the inputs a checkpointed region keeps for its recomputation (``hold_inputs``) and the op outputs a selective
policy keeps (``CountingSACStorage``), each until backward consumes it. Under ``torch.compile`` the compiled
region's saved tensors are autograd saved tensors like any other. Under bf16 autocast, the bf16 copies of
weights that matmuls save for backward count as activations: they are memory held for backward.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

_ACTIVE: SavedActivationMeter | None = None


def active_meter() -> SavedActivationMeter | None:
    """The meter measuring the current step, if any (pipeline instrumentation and AC chain to it)."""
    return _ACTIVE


def _local(t: torch.Tensor) -> torch.Tensor:
    return getattr(t, "_local_tensor", t)  # DTensor: this rank's shard


def _is_parameter(t: torch.Tensor) -> bool:
    base = getattr(t, "_base", None)
    return isinstance(t, nn.Parameter) or isinstance(base, nn.Parameter)


class _Token:
    """Alive while the tensor it stands for is held for backward; releasing it un-counts the bytes."""

    __slots__ = ("meter", "key")

    def __init__(self, meter: SavedActivationMeter, key: int):
        self.meter = meter
        self.key = key

    def __del__(self) -> None:
        self.meter._release(self.key)


class _Saved:
    __slots__ = ("tensor", "token")

    def __init__(self, tensor: torch.Tensor, token: _Token | None):
        self.tensor = tensor
        self.token = token


class SavedActivationMeter:
    def __init__(self) -> None:
        self._refs: dict[int, list[int]] = {}  # storage address -> [holders, bytes]
        self.live = 0
        self.peak = 0
        self.run_peak = 0
        self.bytes_by_dtype: dict[str, int] = defaultdict(int)
        """Bytes saved over the run by dtype (each buffer once per save): which precision computed."""

    # ---- counting ---------------------------------------------------------------------------------

    def hold(self, t: Any) -> _Token | None:
        """Count ``t`` as held for backward until the returned token is dropped (None: not counted)."""
        if not isinstance(t, torch.Tensor) or _is_parameter(t) or torch.compiler.is_compiling():
            return None
        local = _local(t)
        if _is_parameter(local) or local.device.type == "meta":
            return None
        try:
            storage = local.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # fake, functional or storage-less tensors
            return None
        if key == 0 or nbytes == 0:
            return None
        ref = self._refs.get(key)
        if ref is None:
            self._refs[key] = [1, nbytes]
            self.bytes_by_dtype[str(local.dtype).removeprefix("torch.")] += nbytes
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        else:
            ref[0] += 1
        return _Token(self, key)

    def _release(self, key: int) -> None:
        ref = self._refs.get(key)
        if ref is None:
            return
        ref[0] -= 1
        if ref[0] <= 0:
            del self._refs[key]
            self.live -= ref[1]

    def pack(self, t: torch.Tensor) -> _Saved:
        return _Saved(t, self.hold(t))

    @staticmethod
    def unpack(saved: _Saved) -> torch.Tensor:
        return saved.tensor

    # ---- one step ---------------------------------------------------------------------------------

    @contextmanager
    def step(self) -> Iterator[SavedActivationMeter]:
        """Measure one training step; ``peak`` afterwards holds its peak live saved bytes."""
        self.peak = self.live
        try:
            with metering(self), torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield self
        finally:
            self.run_peak = max(self.run_peak, self.peak)


@contextmanager
def metering(meter: Any) -> Iterator[None]:
    """Make ``meter`` the active one while inside: what checkpointed regions keep outside autograd's saved tensors
    (``hold_inputs``, a selective policy's cache) goes to its ``hold(tensor)`` (the planner's dry run passes a
    counter of fake tensors' storages)."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, meter
    try:
        yield
    finally:
        _ACTIVE = previous


class _KeepForBackward(torch.autograd.Function):
    """Identity whose backward does nothing but pass the gradient; it saves its input so that the
    meter sees the tensor a checkpointed region keeps for recomputation, for exactly as long."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def hold_inputs(args: tuple) -> tuple:
    """Pass the inputs of a checkpointed region through ``_KeepForBackward`` while a meter is active."""
    if _ACTIVE is None or torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return args
    return tuple(_KeepForBackward.apply(a) if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args)


class _CountingDict(dict):
    """One op's SAC cache (invocation index -> saved outputs); counts entries until they are consumed."""

    def __init__(self, meter: SavedActivationMeter | None):
        super().__init__()
        self.meter = meter
        self.tokens: dict[Any, list[_Token]] = {}

    def __setitem__(self, idx: Any, value: Any) -> None:
        super().__setitem__(idx, value)
        self.tokens.pop(idx, None)  # consumed (or overwritten): release what it held
        if self.meter is None:
            return
        tensors = [getattr(v, "val", None) for v in torch.utils._pytree.tree_leaves(value)]
        held = [tok for t in tensors if (tok := self.meter.hold(t)) is not None]
        if held:
            self.tokens[idx] = held


class CountingSACStorage(defaultdict):
    """Storage for ``create_selective_checkpoint_contexts``' two modes that counts what the policy keeps."""

    def __init__(self, meter: SavedActivationMeter | None):
        super().__init__(lambda: _CountingDict(meter))
