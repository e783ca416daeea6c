"""Trainer callbacks (``trainer.callbacks``): objects named by ``_target_`` and built by Hydra's instantiate, whose
hooks the loop calls on every rank, Lightning style. Override the hooks you need; ``trainer.ctx.is_rank0`` tells a
callback whether to write. Before any worker starts, ``callback_problems`` checks that each entry's class imports
and takes the entry's arguments, and asks the class's own ``problems``. No torch import."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import OmegaConf


class Callback:
    """The hooks, all no-ops here. ``metrics`` is the step's record (the keys of metrics.jsonl) on logged steps
    (``trainer.log_every``) and ``{"step": step}`` on the others."""

    def on_train_start(self, trainer: Any, *, start_step: int) -> None:
        """Before the first step (``start_step`` > 0: a resumed run)."""

    def on_step_start(self, trainer: Any, *, step: int) -> None:
        """Before the step's batch and forward pass (outside its timing)."""

    def on_after_backward(self, trainer: Any, *, step: int, loss: Any) -> None:
        """After the step's backward pass, before clipping and the update: the gradients are in the parameters'
        ``.grad`` (``trainer.engine.parameters()``); ``loss`` is this rank's detached mean loss (None on ranks that
        compute none, such as early pipeline stages)."""

    def on_step_end(self, trainer: Any, *, step: int, metrics: dict[str, Any]) -> None:
        """After every step's optimizer update."""

    def on_validation(self, trainer: Any, *, step: int, metrics: dict[str, float]) -> None:
        """After an evaluation (``trainer.eval_every``): val_loss, val_ppl, eval_time_s."""

    def on_checkpoint(self, trainer: Any, *, step: int, path: Path | None) -> None:
        """After a checkpoint save was started (``path`` None: it failed, or completes in the background)."""

    def on_train_end(self, trainer: Any, *, summary: dict[str, Any]) -> None:
        """After the loop, with the summary that summary.json will hold."""

    @classmethod
    def problems(cls, *, world_size: int, **kwargs: Any) -> list[str]:
        """What is wrong with these arguments for a job of ``world_size`` ranks, said before any worker starts."""
        return []


def build_callbacks(specs: Any) -> list[Callback]:
    """``trainer.callbacks``: a list of ``{_target_: module.Class, ...kwargs}``, each instantiated once per rank."""
    return [instantiate(spec) for spec in specs or []]


def callback_problems(specs: Any, *, world_size: int) -> list[str]:
    """Each ``trainer.callbacks`` entry that names no class, whose ``_target_`` does not import (resolved as Hydra's
    instantiate resolves it), whose class does not take its arguments, or whose class's ``problems`` object."""
    from hydra._internal.utils import _locate  # instantiate's own resolution of _target_, without its error log

    out = []
    for i, spec in enumerate(specs or []):
        where = f"trainer.callbacks[{i}]"
        spec = OmegaConf.to_container(spec, resolve=True) if OmegaConf.is_config(spec) else spec
        if not isinstance(spec, dict) or not spec.get("_target_"):
            out.append(
                f"{where}={spec}: names no class; give a mapping with _target_: module.Class (a subclass of "
                "trainer.loop.callbacks.Callback), e.g. trainer.callbacks=[{_target_:my_callbacks.PrintLoss}]"
            )
            continue
        target = str(spec["_target_"])
        try:
            obj = _locate(target)
        except Exception as exc:  # noqa: BLE001 - whatever importing its module raised (ImportError, SyntaxError ...)
            why = exc.__cause__ if isinstance(exc, ImportError) and exc.__cause__ is not None else exc
            out.append(
                f"{where}._target_={target}: cannot be imported ({type(why).__name__}: {why}); name a class as "
                "module.Class, its module importable where train.py runs (the working folder or PYTHONPATH)"
            )
            continue
        if not callable(obj):
            out.append(f"{where}._target_={target}: a {type(obj).__name__}, not a class; name a Callback subclass")
            continue
        kwargs = {k: v for k, v in spec.items() if not (k.startswith("_") and k.endswith("_"))}
        wrong = _argument_problem(obj, kwargs)
        if wrong:
            out.append(f"{where}: {target}{wrong}")
        elif isinstance(obj, type) and issubclass(obj, Callback):
            out += [f"{where}: {problem}" for problem in obj.problems(world_size=world_size, **kwargs)]
    return out


def _argument_problem(obj: Any, kwargs: dict[str, Any]) -> str | None:
    """Why ``obj(**kwargs)`` would fail on its signature (an argument it does not take, one it needs), or None."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):  # no signature to read (some builtins): instantiate will tell
        return None
    takes = ", ".join(sig.parameters) or "no arguments"
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        unknown = [k for k in kwargs if k not in sig.parameters]
        if unknown:
            return f" takes no argument {', '.join(unknown)}; it takes: {takes}"
    try:
        sig.bind(**kwargs)
    except TypeError as exc:
        return f"({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}): {exc}; it takes: {takes}"
    return None


def call(callbacks: list[Callback], hook: str, trainer: Any, **kwargs: Any) -> None:
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if method is not None:
            method(trainer, **kwargs)
