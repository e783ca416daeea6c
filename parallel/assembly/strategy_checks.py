"""What a tensor-parallel run (parallel=tp, hybrid with tp.size > 1), an expert-parallel one and a context-parallel one
(cp.size > 1) need of their config, checked before any worker starts: the model's own rules for a tp degree (its
``ModelSpec.tp_check``), those of loss and sequence parallelism, the experts' split, and how heads and the sequence
split over cp. Each check takes ``(run, strategy)`` (the typed run, ``parallel/foundation/run.py``, and the strategy's
``StrategySpec``) and returns the problems as "key=value: what is wrong; the fix";
the strategies list them in ``StrategySpec.checks`` (``parallel/assembly/registry.py``). No torch import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from models.registry import UnknownModel, spec_for
from parallel.foundation import dims

if TYPE_CHECKING:
    from parallel.foundation.run import RunSpec


def nearest_multiples(value: int, base: int) -> str:
    """The multiples of ``base`` around ``value`` ("14 or 16" for 15 and 2): the fix a divisibility rule names."""
    lo = (value // base) * base
    hi = lo + base
    return str(hi) if lo < base else f"{lo} or {hi}"


def _spec_or_none(model: Any) -> Any:
    """The model's family spec, or None for a name the registry does not know (validation's model check says so)."""
    try:
        return spec_for(model)
    except UnknownModel:
        return None


def tensor_parallel_problems(run: RunSpec, strategy: Any = None) -> list[str]:
    """The model's plan splits heads and widths by tp; loss and sequence parallelism split the vocabulary and
    the sequence (nothing when tp.size is 1)."""
    layout, model, settings = run.layout, run.model, run.compose
    tp = layout.tp
    if tp == 1:
        return []
    spec = _spec_or_none(model)
    if spec is None:
        return []  # validation's model check says so
    out = spec.tp_problems(model, tp)
    if spec.parallelize is None:
        return out
    if settings.loss_parallel and int(model.vocab_size) % tp:
        out.append(
            f"model.vocab_size={model.vocab_size} is not divisible by tp.size={tp} with tp.loss_parallel=true; "
            "set tp.loss_parallel=false"
        )
    if settings.loss_parallel and layout.pp > 1:
        out.append(
            f"tp.loss_parallel=true with pp.size={layout.pp}: the pipeline schedule computes the loss outside "
            "loss_parallel() on plain tensors; set tp.loss_parallel=false (the head then gathers the logits)"
        )
    if settings.sequence_parallel and not spec.sequence_parallel:
        out.append(
            f"tp.sequence_parallel=true with the model family '{spec.family}': its tensor-parallel plan keeps the "
            "residual stream replicated (ModelSpec.sequence_parallel); set tp.sequence_parallel=false"
        )
    seq = run.batch.seq_len
    if settings.sequence_parallel and seq % tp:
        out.append(
            f"data.seq_len={seq} is not divisible by tp.size={tp} with tp.sequence_parallel=true: "
            f"the sequence is split over tp ranks; use data.seq_len={nearest_multiples(seq, tp)}"
        )
    return out


def expert_parallel_problems(run: RunSpec, strategy: Any = None) -> list[str]:
    """Expert parallel splits each MoE layer's experts into ep equal sets of whole experts: the model must be a
    mixture of experts and ep must divide its expert count (that ep divides dp x cp is ``dims.borrow_problems``')."""
    layout, model = run.layout, run.model
    ep = layout.sizes.get("ep", 1)
    if ep == 1:
        return []
    spec = _spec_or_none(model)
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


def context_parallel_problems(run: RunSpec, strategy: Any = None) -> list[str]:
    """Ulysses gives each cp rank whole heads of its tp rank and each rank an equal contiguous chunk of every
    sample (nothing when cp.size is 1)."""
    layout, model = run.layout, run.model
    cp, tp = layout.cp, layout.tp
    if cp == 1:
        return []
    spec = _spec_or_none(model)
    if spec is None:
        return []  # validation's model check says so
    name = model.get("name") or spec.family
    if not spec.context_parallel or spec.shape is None:
        return [
            f"cp.size={cp} with model.name={name}: the model family '{spec.family}' has no context-parallel "
            "attention (ModelSpec.context_parallel: attention through self.attend and positions from seq_chunk, "
            "models/attention.py; gpt, llama, qwen3 and qwen3_moe have it); use cp.size=1"
        ]
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
