"""What a strategy is: a class built from the ``parallel`` config group that turns the model into an ``Engine``.

A user plugs in a strategy of their own by pointing ``parallel._target_`` at a ``Strategy`` subclass; the named
ones (``parallel/strategies/``) are presets of ``compose`` (``parallel/assembly/build.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from parallel.assembly.context import WorkerContext
from parallel.assembly.engine import Engine


class Strategy(ABC):
    """Built by Hydra's ``instantiate`` of the ``parallel`` node inside each worker (``parallel._target_``)."""

    def __init__(self, *, name: str, **options: Any):
        self.name = name
        self.options = options

    @abstractmethod
    def build(self, *, ctx: WorkerContext) -> Engine:
        """Build this rank's engine: split, shard and wrap the model as the strategy says."""
