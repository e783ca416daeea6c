"""Tied embeddings across pipeline stages: the token embedding lives on the first stage, the output projection
(which shares its weight) on the last.

Megatron's way, as torchtitan also trains tied models under pipelining:
- **Two ranks**: each holds a copy. The copies start equal (``TiedCopies.sync_values``: the last stage's copy
  takes the first stage's values, whatever drew them) and their gradients are summed over the *embedding group*
  (the pp ranks holding the first or the last stage, one group per pp line of the mesh) before the gradient norm
  and the optimizer step (``TiedCopies.sync_grads``), so both ranks apply the same update and the copies stay
  equal. The norm counts the weight once (the head's copy is ``uncounted``).
- **One rank** (V-shaped schedules put stage 0 and the last stage on pp rank 0): one Parameter, shared by the two
  stage modules (``share_across_stages``, in ``compose`` before the stages become ``PipelineStage``s), whose
  gradient accumulates from both, as in one process. Where FSDP2 wraps each stage on its own (dp > 1) one
  Parameter cannot live in two FSDP modules, so the two local copies are kept equal as above, without a group.

Checkpoints: a rank holding only the head's copy saves its optimizer state under the embedding's name, so the state
is written once and reads back under any layout (``saved_optimizer_state`` / ``restored_optimizer_state``; one
process saves a tied weight's optimizer state under the embedding's name too). The model state keeps both names,
as one process's tied model does.

The gradients are all-reduced as local tensors (a DTensor's local shard): both copies are parallelized alike (the
same tensor-parallel plan, the same FSDP2 mesh and shape), so their shards are the same rows on every rank.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

#: the prefixes of a flattened optimizer state dict (``StateDictOptions(flatten_optimizer_state_dict=True)``)
_OPTIMIZER_PREFIXES = ("state", "param_groups")


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a view: writing it writes the DTensor), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _find(modules: Sequence[nn.Module], fqn: str) -> tuple[int, nn.Parameter] | None:
    """(index of the module holding parameter ``fqn``, the parameter); None when no module holds it (its owner is
    absent or set to None, as in a pipeline stage)."""
    owner, _, attr = fqn.rpartition(".")
    for i, module in enumerate(modules):
        try:
            holder = module.get_submodule(owner) if owner else module
        except AttributeError:
            continue
        param = getattr(holder, attr, None) if holder is not None else None
        if isinstance(param, nn.Parameter):
            return i, param
    return None


def share_across_stages(modules: Sequence[nn.Module], ties: Sequence[tuple[str, str]]) -> None:
    """Where one rank holds both ends of a tie (``(alias, original)`` names, ``parallel.foundation.ties.tied_parameters``)
    in two of its stage ``modules``, the alias's owner takes the original's Parameter: one weight, one gradient."""
    for alias, original in ties:
        found_alias, found_original = _find(modules, alias), _find(modules, original)
        if found_alias is None or found_original is None or found_alias[1] is found_original[1]:
            continue
        owner, _, attr = alias.rpartition(".")
        setattr(modules[found_alias[0]].get_submodule(owner), attr, found_original[1])


def embedding_group_ranks(world_ranks: torch.Tensor, *, pp_dim: int, first: int, last: int) -> list[list[int]]:
    """Per pp line of the world mesh's rank tensor (every other coordinate fixed), the global ranks of the pp
    positions ``first`` and ``last`` (those holding the first and the last stage): every embedding group, in the
    same order on every rank (``new_subgroups_by_enumeration`` is collective)."""
    lines = world_ranks.movedim(pp_dim, -1).reshape(-1, world_ranks.shape[pp_dim])
    return [[int(line[first]), int(line[last])] for line in lines]


def embedding_group(mesh: Any, *, first: int, last: int) -> Any:
    """The process group of this rank's embedding group: None when one pp position holds both stages; the pp
    group itself when the two positions are all of it (pp 2); else a new group per pp line (collective)."""
    if first == last:
        return None
    pp = mesh["pp"]
    if pp.size() == 2:
        return pp.get_group()
    names = list(mesh.mesh_dim_names)
    lists = embedding_group_ranks(mesh.mesh, pp_dim=names.index("pp"), first=first, last=last)
    mine, _ = dist.new_subgroups_by_enumeration(lists)
    return mine


def tied_copies(modules: Sequence[nn.Module], *, alias: str, original: str, group: Any) -> TiedCopies:
    """The copies of the tie ``(alias, original)`` that this rank's stage ``modules`` hold."""
    held: dict[str, nn.Parameter] = {}
    for name in (original, alias):
        found = _find(modules, name)
        if found is not None and all(found[1] is not p for p in held.values()):
            held[name] = found[1]
    return TiedCopies(held, original=original, group=group if held else None)


class TiedCopies:
    """This rank's copies of a weight tied across pipeline stages, kept equal: ``params`` maps each name this rank
    holds it under to its Parameter (distinct objects; a name whose Parameter another name already holds is left
    out), ``original`` is the name the weight counts under (the embedding's); ``group`` is the embedding group
    (None: every copy is on this rank)."""

    def __init__(self, params: Mapping[str, nn.Parameter], *, original: str, group: Any = None):
        self.params = dict(params)
        self.original = original
        self.group = group if group is not None and dist.get_world_size(group) > 1 else None

    @property
    def active(self) -> bool:
        """Whether there is anything to keep equal: another rank holds a copy, or this rank holds two."""
        return bool(self.params) and (self.group is not None or len(self.params) > 1)

    @property
    def uncounted(self) -> list[nn.Parameter]:
        """The copies whose gradient the norm must not count again (all but the original's)."""
        return [p for name, p in self.params.items() if name != self.original]

    @property
    def aliases(self) -> dict[str, str]:
        """copy name -> original name, for the checkpoint's optimizer state."""
        return {name: self.original for name in self.params if name != self.original}

    def _summed(self, tensors: list[torch.Tensor | None], *, template: nn.Parameter) -> torch.Tensor:
        """The sum of this rank's ``tensors`` (None counts as zero), summed over the embedding group."""
        total = torch.zeros_like(_local(template.detach()))
        for t in tensors:
            if t is not None:
                total += _local(t)
        if self.group is not None:
            dist.all_reduce(total, group=self.group)
        return total

    @torch.no_grad()
    def sync_values(self) -> None:
        """Every copy takes the original's values (the last stage's drawn weights replaced by the first stage's;
        Megatron zeroes the copy and all-reduces, as here). Collective over the embedding group."""
        if not self.active:
            return
        held = self.params.get(self.original)
        template = next(iter(self.params.values()))
        value = self._summed([held.detach() if held is not None else None], template=template)
        for p in self.params.values():
            _local(p.data).copy_(value)

    @torch.no_grad()
    def sync_grads(self) -> None:
        """Every copy's gradient becomes the sum of all copies' gradients (this rank's and the group's): the
        gradient of the one tied weight. Collective over the embedding group; call it after the backward and
        before the gradient norm."""
        if not self.active:
            return
        params = list(self.params.values())
        total = self._summed([p.grad for p in params], template=params[0])
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            _local(p.grad).copy_(total)


def _renamed(key: str, old: str, new: str) -> str | None:
    """``key`` of a flattened optimizer state dict with parameter name ``old`` replaced by ``new``; None when the
    key is not ``old``'s."""
    for prefix in _OPTIMIZER_PREFIXES:
        head = f"{prefix}.{old}."
        if key.startswith(head):
            return f"{prefix}.{new}.{key[len(head) :]}"
    return None


def _holds(state: Mapping[str, Any], fqn: str) -> bool:
    return any(key.startswith(tuple(f"{p}.{fqn}." for p in _OPTIMIZER_PREFIXES)) for key in state)


def saved_optimizer_state(state: Mapping[str, Any], aliases: Mapping[str, str]) -> dict[str, Any]:
    """A flattened optimizer state dict as written to (and read from) a checkpoint: each copy's entries under its
    original's name, or left out where this rank holds the original too (then they are the same numbers)."""
    out = dict(state)
    for alias, original in aliases.items():
        held = _holds(state, original)
        for key in [k for k in state if _renamed(k, alias, original) is not None]:
            value = out.pop(key)
            if not held:
                out[_renamed(key, alias, original)] = value
    return out


def restored_optimizer_state(
    saved: Mapping[str, Any], aliases: Mapping[str, str], *, template: Mapping[str, Any]
) -> dict[str, Any]:
    """The inverse of ``saved_optimizer_state`` after a load: ``template``'s keys (the optimizer's own state dict)
    with each copy's entries read from its original's (cloned where this rank holds the original too, so the two
    never share a tensor the optimizer updates in place)."""
    out = {}
    for key in template:
        for alias, original in aliases.items():
            source = _renamed(key, alias, original)
            if source is not None:
                value = saved[source]
                if _holds(template, original):  # both on this rank: two optimizer states, equal numbers
                    value = value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
                out[key] = value
                break
        else:
            out[key] = saved[key]
    return out
