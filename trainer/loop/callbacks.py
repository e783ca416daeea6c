"""Trainer callbacks (``trainer.callbacks``): objects named by ``_target_`` and built by Hydra's instantiate, whose
hooks the loop calls on every rank, Lightning style. Override the hooks you need; ``trainer.ctx.is_rank0`` tells a
callback whether to write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.utils import instantiate


class Callback:
    """The hooks, all no-ops here. ``metrics`` is the step's record (the keys of metrics.jsonl) on logged steps
    (``trainer.log_every``) and ``{"step": step}`` on the others."""

    def on_train_start(self, trainer: Any, *, start_step: int) -> None:
        """Before the first step (``start_step`` > 0: a resumed run)."""

    def on_step_end(self, trainer: Any, *, step: int, metrics: dict[str, Any]) -> None:
        """After every step's optimizer update."""

    def on_validation(self, trainer: Any, *, step: int, metrics: dict[str, float]) -> None:
        """After an evaluation (``trainer.eval_every``): val_loss, val_ppl, eval_time_s."""

    def on_checkpoint(self, trainer: Any, *, step: int, path: Path | None) -> None:
        """After a checkpoint save was started (``path`` None: it failed, or completes in the background)."""

    def on_train_end(self, trainer: Any, *, summary: dict[str, Any]) -> None:
        """After the loop, with the summary that summary.json will hold."""


def build_callbacks(specs: Any) -> list[Callback]:
    """``trainer.callbacks``: a list of ``{_target_: module.Class, ...kwargs}``, each instantiated once per rank."""
    out = []
    for i, spec in enumerate(specs or []):
        if not hasattr(spec, "get") or not spec.get("_target_"):
            raise ValueError(
                f"trainer.callbacks[{i}] = {spec!r} names no class: give a mapping with _target_: module.Class"
            )
        out.append(instantiate(spec))
    return out


def call(callbacks: list[Callback], hook: str, trainer: Any, **kwargs: Any) -> None:
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if method is not None:
            method(trainer, **kwargs)
