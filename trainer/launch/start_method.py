"""How local workers start: ``fork`` (they inherit what the launcher imported) or ``spawn`` (a fresh interpreter).

A spawned worker imports torch, torch.distributed, the strategy and the optimizer again (about 6 s of CPU per
worker here: torch 2.7 s, ``torch._dynamo`` 2.7 s, pulled in by the first ``torch.optim`` constructor), and with
more workers than cores those imports queue. A forked worker starts with them in memory. Fork is safe while the
launcher has run no torch kernel (no OpenMP pool to inherit) and created no CUDA context, so CUDA keeps spawn.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable
from typing import Any

#: what every worker imports before its first step; importing them in the launcher makes a forked worker's free
WORKER_IMPORTS = (
    "torch",
    "torch.distributed",
    "torch.distributed.device_mesh",
    "torch._dynamo",  # the first torch.optim constructor imports it (2.7 s here)
    "torch.distributed.checkpoint",
    "trainer.launch.worker",
)


def resolve_start_method(topology: Any) -> str:
    """``topology.start_method``, with ``auto`` made concrete: fork for CPU workers on Linux, else spawn (and after
    a calibration in this process)."""
    wanted = str(topology.start_method)
    if wanted != "auto":
        return wanted
    if not sys.platform.startswith("linux") or topology.get("calibrate", False):
        return "spawn"  # topology.calibrate=true timed torch kernels in this process: its OpenMP pool is in use
    device = str(topology.device)
    if device == "cpu":
        return "fork"
    if device == "cuda":
        return "spawn"
    import torch

    return "spawn" if torch.cuda.is_available() else "fork"


def import_for_workers(cfg: Any) -> None:
    """Import, in the launcher, the modules each forked worker would otherwise import itself: torch's, the
    strategy's and the model's. Imports only: running a torch kernel here would hand the workers a used
    OpenMP pool."""
    for name in WORKER_IMPORTS:
        importlib.import_module(name)
    if cfg.logger.wandb.mode != "disabled":  # rank 0's W&B run: its import (0.5 s of CPU) not in its first steps
        importlib.import_module("wandb")
    for target in (cfg.parallel.get("_target_"), cfg.model.get("_target_")):
        if isinstance(target, str) and "." in target:
            module = target.partition(":")[0] if ":" in target else target.rpartition(".")[0]
            try:
                importlib.import_module(module)
            except ImportError:  # the worker reports it with its own message
                pass


def prepare_start(cfg: Any, *, say: Callable[[str], None]) -> str:
    """The start method (``resolve_start_method``); before forking, what the workers need imported in this process
    (``import_for_workers``, announced through ``say``) and its garbage collected."""
    start_method = resolve_start_method(cfg.topology)
    if start_method == "fork":
        say("importing the rest of what the workers need (they fork from this process)")
        import_for_workers(cfg)
        # A failed in-process job (a multirun's parallel=single) leaves its gloo process group in a reference cycle
        # (its traceback's frames). Collected in a forked worker, its destructor joined gloo threads that exist only
        # here and the worker hung forever (inside its first gc pass): collect it here, where they run.
        gc.collect()
    return start_method
