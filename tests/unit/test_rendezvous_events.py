"""trainer/launch/rendezvous_events.py: torch's rendezvous events keep their names, read without inspect.stack."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from trainer.launch.rendezvous_events import TORCH_NAMER, UNNAMED, method_name, name_events_cheaply


def _record(namer, depth: int) -> str:
    """As torch's ``_record`` asks for the name of the method that called it."""
    return namer(depth)


def _next_rendezvous(namer, depth: int) -> str:
    return _record(namer, depth)


@pytest.mark.parametrize("depth", [1, 2, 3, 10_000])
def test_the_cheap_name_is_torchs_name(depth):
    assert _next_rendezvous(method_name, depth) == _next_rendezvous(TORCH_NAMER, depth)
    assert _next_rendezvous(method_name, 2) == "_next_rendezvous" and method_name(10_000) == UNNAMED


def test_the_launcher_replaces_torchs_namer(monkeypatch):
    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", TORCH_NAMER)
    name_events_cheaply()
    assert dynamic_rendezvous.get_method_name is method_name
