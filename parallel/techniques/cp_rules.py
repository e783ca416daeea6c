"""What context parallel needs of a run (``MeshDim.rules``), checked before any worker starts: whole attention heads
per cp rank, a sequence that splits evenly, no MoE capacity and no multi-token prediction across the chunks. No torch
import, so a refused ``cp.size`` costs no torch start-up; the technique itself is ``parallel/techniques/cp.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from models.registry import spec_or_none
from parallel.foundation.dims import nearest_multiples

if TYPE_CHECKING:
    from parallel.foundation.run import RunSpec


def problems(run: RunSpec, strategy: Any = None) -> list[str]:
    """Ulysses gives each cp rank whole heads of its tp rank and each rank an equal contiguous chunk of every
    sample (nothing when cp.size is 1)."""
    layout, model = run.layout, run.model
    cp, tp = layout.cp, layout.tp
    if cp == 1:
        return []
    spec = spec_or_none(model)
    if spec is None:
        return []  # validation's model check says so
    name = model.get("name") or spec.family
    if not spec.context_parallel or spec.shape is None:
        return [
            f"cp.size={cp} with model.name={name}: the model family '{spec.family}' has no context-parallel "
            "attention (ModelSpec.context_parallel: attention through self.attend and positions from seq_chunk, "
            "models/attention.py; gpt, llama, qwen3, qwen3_moe, deepseek_v3 and hf have it); use cp.size=1"
        ]
    if spec.cp_check is not None and (refused := list(spec.cp_check(model, cp, run.batch.seq_len))):
        return refused
    if int(model.get("mtp_depth", 0) or 0):  # models/mtp.py: depth k reads targets k places on, across the chunks
        return [
            f"cp.size={cp} with model.mtp_depth={model.mtp_depth}: multi-token prediction reads the targets beyond "
            "each rank's chunk of the sequence, which context parallel does not exchange; use cp.size=1 or "
            "model.mtp_depth=0"
        ]
    out = []
    heads = spec.shape(model).n_heads
    if heads % tp == 0 and (heads // tp) % cp:
        local = heads // tp
        fits = [d for d in range(1, local + 1) if local % d == 0]
        per = (
            f"model.n_heads={heads} / tp.size={tp} = {local} heads per tp rank" if tp > 1 else f"model.n_heads={heads}"
        )
        out.append(
            f"{per} not divisible by cp.size={cp}: context parallel (ulysses) gives each cp rank whole attention "
            f"heads over the full sequence; use cp.size in {fits}" + (" or a smaller tp.size" if tp > 1 else "")
        )
    capacity = float(model.get("capacity_factor", 0.0) or 0.0) if spec.moe is not None else 0.0
    if capacity > 0:
        out.append(
            f"model.capacity_factor={capacity} with cp.size={cp}: each cp rank routes its chunk of the sequence, so "
            "an expert's capacity (a share of one forward's tokens) and which tokens go over it would be the "
            "chunk's, not the sequence's; set model.capacity_factor=0 (no token dropped) or cp.size=1"
        )
    seq = run.batch.seq_len
    split = cp * (tp if run.compose.sequence_parallel else 1)
    if seq % split:
        by = f"cp.size={cp} x tp.size={tp} (tp.sequence_parallel=true)" if split != cp else f"cp.size={cp}"
        out.append(
            f"data.seq_len={seq} is not divisible by {by}: each rank holds an equal contiguous chunk of every "
            f"sample; use data.seq_len={nearest_multiples(seq, split)}"
        )
    return out
