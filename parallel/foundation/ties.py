"""Parameters registered under two names (a tied embedding and output projection): found by identity, and shared
again where something gave each name its own (``to_empty`` after a meta-device build, a tensor-parallel plan).
``parallel/pipeline/tied.py`` keeps the two ends equal when pipeline stages hold them apart."""

from __future__ import annotations

from torch import nn


def tied_parameters(module: nn.Module) -> list[tuple[str, str]]:
    """(alias, original) names of parameters registered under two names (a tied embedding and head)."""
    first: dict[int, str] = {}
    pairs = []
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            pairs.append((name, first[id(p)]))
        else:
            first[id(p)] = name
    return pairs


def retie(module: nn.Module, pairs: list[tuple[str, str]]) -> None:
    """Share the parameters again that ``to_empty`` gave separate storage (FSDP2 keeps them shared itself)."""
    for alias, original in pairs:
        owner, _, attr = alias.rpartition(".")
        target = module.get_parameter(original)
        if module.get_parameter(alias) is not target:
            setattr(module.get_submodule(owner), attr, target)
