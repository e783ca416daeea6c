"""Start a run from Hugging Face weights (``model.init_from``), under any layout.

The model was built on the meta device and each rank's part (whole, a pipeline stage, a tensor-parallel or FSDP2
shard, or both) given storage without initialisation (``WorkerContext.place``). Here every tensor of that part
is filled with exactly the slice of the checkpoint it holds: a DTensor's local shard knows its offset in the
full tensor, the family's adapter says where that full tensor lives in the checkpoint (name, fused part,
transposition, rotary permutation), and the folder reads those rows and columns from the file. No rank reads or
holds more than its own share plus the one slice in flight.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from models.lora import is_adapter
from models.registry import spec_for
from parallel.foundation.memory import peak_rss_since_reset, reset_peak_rss
from trainer.hf.folder import HFFolder


def local_part(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """(this rank's local tensor, the slice of the full tensor it holds)."""
    if not isinstance(tensor, DTensor):
        return tensor, tuple(slice(0, n) for n in tensor.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    local = tensor.to_local()
    if tuple(local.shape) != tuple(shape):
        raise RuntimeError(f"local shard {tuple(local.shape)} is not the computed {tuple(shape)} ({tensor.placements})")
    return local, tuple(slice(o, o + n) for o, n in zip(offset, shape))


@torch.no_grad()
def load_hf_weights(module: nn.Module, *, folder: str | Path, model_cfg: Any) -> dict[str, Any]:
    """Fill every tensor of ``module``'s state dict (this rank's part of the model, full FQNs) from ``folder``.
    Returns what was read: tensors, bytes, the process's peak resident memory while reading (Linux ``VmHWM``, reset
    when the reading starts) and its growth over the resident memory at that start."""
    adapter = spec_for(model_cfg).hf_adapter_obj()
    hf = HFFolder(folder)
    stored = set(hf.tensors)
    base = reset_peak_rss()

    def read(key: str, index: tuple[slice, ...]) -> torch.Tensor:
        return hf.read(adapter.locate(key, stored) or key, index)

    count = nbytes = 0
    filled: set[int] = set()  # storages already read: a tied head shares its embedding's
    for fqn, tensor in module.state_dict().items():
        if is_adapter(fqn):  # LoRA's adapters are new: drawn by WorkerContext.place, in no base checkpoint
            continue
        src = adapter.source(fqn, model_cfg)
        if src is None:
            raise KeyError(f"{fqn}: the {adapter.model_type} adapter has no Hugging Face name for it")
        local, index = local_part(tensor)
        if local.numel() == 0 or local.data_ptr() in filled:
            continue
        filled.add(local.data_ptr())
        block = src.take(read, index, tuple(tensor.shape))
        local.copy_(block)
        count, nbytes = count + 1, nbytes + block.numel() * block.element_size()
    peak = peak_rss_since_reset()
    growth = peak - base if peak is not None and base is not None else None
    return {"tensors": count, "bytes_read": nbytes, "peak_rss_bytes": peak, "peak_rss_growth_bytes": growth}
