"""Cheap names for torch's rendezvous events.

torch 2.13's elastic rendezvous (``dynamic_rendezvous.get_method_name``) names each event it records after the
method that recorded it, by calling ``inspect.stack()`` twice. A full stack reads every frame's source lines and
looks up each frame's module, scanning ``sys.modules`` (about 2,400 modules once torch, transformers and Hydra are
imported) for each file it has not seen as a module (``train.py`` run as ``__main__``, runpy's frames). In the
launcher of a two-rank ``python train.py parallel=ddp`` run, with its imports done, that was a quarter of the
process's samples (py-spy) and 0.5-0.6 s of its CPU: 1.80-2.03 s per launch with torch's namer, 1.29-1.39 s
with this one (3 alternating pairs, process time). The same name read from the frame costs microseconds.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.rendezvous import dynamic_rendezvous

UNNAMED = "no_method_name"
"""torch's answer when the stack is shallower than asked."""

TORCH_NAMER = getattr(dynamic_rendezvous, "get_method_name", None)
"""torch's own namer, as imported (what ``method_name`` must answer like)."""


def method_name(depth: int = 2) -> str:
    """``get_method_name``'s answer without source lookups: the function ``depth`` frames up, counting this one as
    0 as torch's counts its own."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return UNNAMED


def name_events_cheaply() -> None:
    """Replace torch's event namer in this process (the launcher, where the elastic agent runs)."""
    if TORCH_NAMER is not None:  # a torch without it needs nothing
        dynamic_rendezvous.get_method_name = method_name
