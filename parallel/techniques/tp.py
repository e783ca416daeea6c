"""Tensor parallel with DTensor over the mesh's tp dimension: the model family's plan applied, and the meter of the
tp group's collectives. The first step of ``parallel/assembly/compose.py``'s order.

The model is built whole on every rank from the same seed (or on the meta device, ``model.init_device``), then its
family's plan (``ModelSpec.parallelize``) shards its
projections; each tp rank keeps its slice (a meta-built model is materialised after that). Every tp rank of a
replica sees the same batch. The engine times the tp group's collectives (``tp_comm_time_s``,
``tp_comm_fraction``) on the steps the loop measures and runs forward and backward inside ``loss_parallel()`` when
the head is vocabulary-sharded.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from parallel.foundation.comm_timer import CollectiveTimer, SampledCommMeter


def apply_tp(
    model: nn.Module,
    *,
    parallelize: Callable[..., nn.Module],
    tp_mesh: DeviceMesh,
    sequence_parallel: bool,
    loss_parallel: bool,
    styles: Any = None,
) -> nn.Module:
    """The model's own TP plan (its ``ModelSpec.parallelize``) on the tp sub-mesh; validation refuses families
    without one before spawn. ``styles``: other projection styles (``models.tensor_parallel.TPStyles``: float8's),
    passed only when given, so a family's plan without the keyword still runs."""
    extra = {"styles": styles} if styles is not None and _takes(parallelize, "styles") else {}
    return parallelize(
        model, tp_mesh=tp_mesh, sequence_parallel=sequence_parallel, loss_parallel=loss_parallel, **extra
    )


def _takes(fn: Callable[..., object], name: str) -> bool:
    params = inspect.signature(fn).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


log = logging.getLogger("meshtrain")


def tp_meter(*, tp_mesh: DeviceMesh | None, measure: bool, compiled: bool) -> SampledCommMeter:
    """Times the tp group's collectives on the steps the loop measures (none with tp.measure_comm=false, none with
    tp 1)."""
    timer = None
    if tp_mesh is not None and tp_mesh.size() > 1:
        if compiled:
            # the timer is a TorchDispatchMode: while one is active torch.compile runs the blocks eagerly
            log.info("tp_comm_time_s is not measured with trainer.compile=true (it would disable compile)")
        elif measure:
            timer = CollectiveTimer(group_name=tp_mesh.get_group().group_name)
    return SampledCommMeter(timer, prefix="tp")
