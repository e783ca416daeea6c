"""parallel=dp: legacy single-process ``torch.nn.DataParallel`` over the local CUDA devices.

Kept because users meet it first. Each step it scatters the batch, replicates the model to every GPU
and gathers outputs on GPU 0, all from one GIL-bound process: DDP (one process per device, bucketed
all-reduce overlapping backward) is faster and is what this product recommends.
"""

from __future__ import annotations

import torch
from torch import nn

from parallel.core.base import Engine, ModuleEngine, Strategy, WorkerContext


class DataParallelStrategy(Strategy):
    def build(self, *, ctx: WorkerContext) -> Engine:
        model = ctx.prepare(ctx.build_model().to(ctx.device))
        gpus = torch.cuda.device_count() if ctx.device.type == "cuda" else 0
        if gpus > 1:
            model = nn.DataParallel(model)
            ctx.log.info("parallel=dp: DataParallel over %d CUDA devices", gpus)
        else:
            ctx.log.warning(
                "parallel=dp runs as parallel=single here: DataParallel needs several CUDA devices "
                "(found %d). Prefer parallel=ddp: one process per device, gradients all-reduced while "
                "backward runs, no per-step model replication.",
                gpus,
            )
        return ModuleEngine(model, accumulation=ctx.accumulation_steps())
