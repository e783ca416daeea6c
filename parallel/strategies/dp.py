"""parallel=dp: legacy single-process ``torch.nn.DataParallel`` over the local CUDA devices.

Kept because users meet it first. Each step it scatters the batch, replicates the model to every GPU
and gathers outputs on GPU 0, all from one GIL-bound process: DDP (one process per device, bucketed
all-reduce overlapping backward) is faster and is what this product recommends.
"""

from __future__ import annotations

import torch
from torch import nn

from parallel.assembly.build import build_engine
from parallel.assembly.compose import Composition
from parallel.assembly.context import WorkerContext
from parallel.assembly.engine import Engine
from parallel.assembly.module_engine import ModuleEngine
from parallel.assembly.strategy import Strategy
from parallel.foundation.precision import MIXED_PRECISIONS, enable_autocast


class DataParallelStrategy(Strategy):
    def build(self, *, ctx: WorkerContext) -> Engine:
        gpus = torch.cuda.device_count() if ctx.device.type == "cuda" else 0
        if gpus <= 1:
            ctx.log.warning(
                "parallel=dp runs as parallel=single here: DataParallel needs several CUDA devices "
                "(found %d). Prefer parallel=ddp: one process per device, gradients all-reduced while "
                "backward runs, no per-step model replication.",
                gpus,
            )
            return build_engine(ctx=ctx, composition=Composition())
        # DataParallel copies the module to every GPU each step; per-block forwards replaced by
        # checkpointing or compile would still point at the original: refused in trainer/validate.py
        model = nn.DataParallel(ctx.build_model().to(ctx.device))
        if ctx.precision in MIXED_PRECISIONS:
            model = enable_autocast(model, device_type="cuda")
        ctx.log.info("parallel=dp: DataParallel over %d CUDA devices", gpus)
        return ModuleEngine(model, accumulation=ctx.accumulation_steps(), loss_fn=ctx.loss_fn())
