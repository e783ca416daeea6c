"""A trainer callback for parity tests of optimizers: after each backward it replaces every trainable parameter's
gradient by the same values under every layout (a function of the parameter's name and the step), each rank writing
the part its shard holds. Layouts then differ only in how the optimizer handles the shards, which is what the test is
about: torch's Muon orthogonalises in bf16, where a gradient one float32 rounding apart (a layout's other summation
order, as tensor parallel's) changes a matrix's update by about 1% (parallel/optim/muon_shards.py), so there real
gradients cannot test the optimizer's distribution to 1e-6. Use with ``trainer.grad_clip=0`` (a norm of these
gradients would clip them by a coefficient no real run has)."""

from __future__ import annotations

import zlib
from typing import Any

import torch

from trainer.loop.callbacks import Callback
from trainer.loop.fit import parameter_names


class SameGradients(Callback):
    def __init__(self, scale: float = 0.01) -> None:
        self.scale = scale

    def on_after_backward(self, trainer: Any, *, step: int, loss: Any) -> None:
        from torch.distributed.tensor import DTensor, distribute_tensor

        names = parameter_names(trainer.engine)
        for p in trainer.engine.parameters():
            if not p.requires_grad:
                continue
            g = torch.Generator().manual_seed(zlib.crc32(f"{names[id(p)]}@{step}".encode()))
            full = torch.randn(tuple(p.shape), generator=g) * self.scale
            if isinstance(p, DTensor):
                local = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None)
                p.grad = local.to(p.dtype)
            else:
                p.grad = full.to(device=p.device, dtype=p.dtype)
