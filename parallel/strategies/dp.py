"""parallel=dp: legacy single-process ``torch.nn.DataParallel`` over the local CUDA devices.

Kept because users meet it first. Each step it scatters the batch, replicates the model to every GPU
and gathers outputs on GPU 0, all from one GIL-bound process: DDP (one process per device, bucketed
all-reduce overlapping backward) is faster and is what this product recommends.
"""

from __future__ import annotations

import torch
from torch import nn

from parallel.core.base import Engine, ModuleEngine, Strategy, WorkerContext
from parallel.core.precision import enable_autocast


class DataParallelStrategy(Strategy):
    def build(self, *, ctx: WorkerContext) -> Engine:
        gpus = torch.cuda.device_count() if ctx.device.type == "cuda" else 0
        model = ctx.build_model().to(ctx.device)
        if gpus > 1:
            # DataParallel copies the module to every GPU each step; per-block forwards replaced by
            # checkpointing or compile would still point at the original: refused in trainer/validate.py
            model = (
                enable_autocast(nn.DataParallel(model), device_type="cuda")
                if ctx.precision == "bf16-mixed"
                else nn.DataParallel(model)
            )
            ctx.log.info("parallel=dp: DataParallel over %d CUDA devices", gpus)
        else:
            model = ctx.prepare(model)
            ctx.log.warning(
                "parallel=dp runs as parallel=single here: DataParallel needs several CUDA devices "
                "(found %d). Prefer parallel=ddp: one process per device, gradients all-reduced while "
                "backward runs, no per-step model replication.",
                gpus,
            )
        return ModuleEngine(model, accumulation=ctx.accumulation_steps())
