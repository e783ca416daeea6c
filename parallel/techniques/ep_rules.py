"""What expert parallel needs of a run (``MeshDim.rules``), checked before any worker starts: a mixture of experts
whose expert count ep divides. No torch import, so a refused ``ep.size`` costs no torch start-up; the technique
itself is ``parallel/techniques/ep.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from models.registry import spec_or_none
from parallel.foundation import dims

if TYPE_CHECKING:
    from parallel.foundation.run import RunSpec


def problems(run: RunSpec, strategy: Any = None) -> list[str]:
    """Expert parallel splits each MoE layer's experts into ep equal sets of whole experts: the model must be a
    mixture of experts and ep must divide its expert count (that ep divides dp x cp is ``dims.borrow_problems``')."""
    layout, model = run.layout, run.model
    ep = layout.sizes.get("ep", 1)
    if ep == 1:
        return []
    spec = spec_or_none(model)
    if spec is None:
        return []  # validation's model check says so
    if spec.moe is None or spec.moe.n_experts is None:
        return [
            f"ep.size={ep} with model={model.get('name')}: expert parallel splits a mixture of experts' experts and "
            "this model has none; set ep.size=1, or use a MoE model (model=qwen3_moe_debug)"
        ]
    experts = int(spec.moe.n_experts(model))
    if experts < 1:
        return [
            f"ep.size={ep} with model={model.get('name')}: expert parallel splits a mixture of experts' experts and "
            "this model has none; set ep.size=1"
        ]
    if experts % ep:
        fits = [d for d in range(1, experts + 1) if experts % d == 0 and dims.lent("ep", layout.sizes) % d == 0]
        return [
            f"ep.size={ep} does not divide model.n_experts={experts}: each ep rank holds n_experts / ep whole "
            f"experts; set ep.size to one of {', '.join(map(str, fits))}, or model.n_experts to a multiple of {ep}"
        ]
    return []
