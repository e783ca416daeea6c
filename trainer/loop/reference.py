"""The reference model of ``trainer.objective=dpo``, as ``trainer.preference.reference`` picks it: ``pass`` (its
log-probability of every sequence of the preference data, computed in one forward pass before the first step and
stored beside the shards) or ``copy`` (``FrozenReference``: held on the ranks and run on every batch).

The reference is the model the run starts from. With LoRA that is the base with its adapters switched off
(``models.lora.adapters_disabled``), so the pass needs no copy and gives the same values after a resume; without
LoRA it is the policy before its first update, so a resumed run reads the values its first attempt stored and is
refused when they are gone. The pass runs through the run's own engine (``eval_step``: every layout, pipelines
included), the loss in ``collect`` mode (``models/preference.py``) recording each row's log-probability against its
sequence index, gathered from every rank. The file is named by a key of the model the values came from (its config,
the weights' folder and files, the seed, the precision), so a second run of the same model and data reads it.

``copy`` keeps the reference on the ranks instead: without LoRA a frozen copy of this rank's shards of the initial
weights (sharded like the policy, no gradient, no optimizer state: one more copy of the weights per rank, what the
planner counts), taken before a checkpoint is restored, so a resumed run needs no file; with LoRA the base with the
adapters off (no copy). Every training and validation batch first runs forward through the run's own engine with
the reference's weights swapped in (in place, one tensor at a time), its rows' log-probabilities filling the
batch's reference column on the ranks that compute the loss; then the policy's step runs on it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from models.lora import adapters_disabled
from models.objectives import holds_reference
from models.preference import PreferenceLoss, reference_column
from parallel.foundation.state_bytes import frozen_copy, local_bytes
from trainer.data.preference import SPLITS, PreferenceData
from trainer.data.shards import DataError

#: bumped when how the values are computed changes (a file an older meshtrain stored is then computed again)
VERSION = 2


def reference_key(*, model: dict[str, Any], seed: int, precision: str, data_folder: Path) -> str:
    """sha256 naming the reference: the model config (adapters aside: they are off), its weights' folder and files
    (names, sizes, modification times), the seed that draws weights without one, the precision, the data, and
    ``VERSION``."""
    base = {k: v for k, v in model.items() if k != "lora"}
    weights = []
    folder = model.get("init_from")
    if folder:
        root = Path(str(folder)).expanduser()
        for path in sorted(root.glob("*.safetensors*")) + [root / "config.json"]:
            if path.is_file():
                st = path.stat()
                weights.append((path.name, st.st_size, st.st_mtime_ns))
    text = json.dumps(
        {
            "model": base,
            "weights": weights,
            "seed": seed,
            "precision": precision,
            "data": str(data_folder),
            "v": VERSION,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def attach_reference(*, trainer: Any, start_step: int) -> dict[str, Any] | None:
    """Give ``trainer.data`` the reference log-probabilities (read, or computed now); None when the run's objective
    needs none. Collective when it computes: every rank calls it."""
    ctx, data = trainer.ctx, trainer.data
    loss = ctx.loss_fn()
    if not isinstance(loss, PreferenceLoss) or not loss.objective.needs_reference:
        return None
    if not isinstance(data, PreferenceData):
        raise DataError(f"trainer.objective={loss.objective.name} needs data=preference")
    if trainer.frozen_reference is not None:
        return trainer.frozen_reference.summary()
    model = _plain(trainer.cfg.model)
    key = reference_key(model=model, seed=ctx.run.seed, precision=ctx.run.precision, data_folder=data.folder)
    path = data.reference_file(key)
    if path.is_file():
        with np.load(path) as stored:
            for split in SPLITS:
                data.set_reference(split, stored[split])
        return {"reference": "read", "reference_file": str(path)}
    lora = bool((model.get("lora") or {}).get("rank", 0))
    if start_step > 0 and not lora:
        raise DataError(
            f"{path}: the reference log-probabilities this run stored are gone and the model has trained since "
            "(no LoRA base to switch back to); restore the file or start the run again (trainer.resume=never)"
        )
    values = {split: _pass(trainer, split) for split in SPLITS}
    if ctx.is_rank0:
        tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npz")
        np.savez(tmp, **values)
        tmp.rename(path)
    for split, logps in values.items():
        data.set_reference(split, logps)
    return {"reference": "adapters off" if lora else "initial weights", "reference_file": str(path)}


def _plain(node: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True)  # type: ignore[return-value]


def _pass(trainer: Any, split: str) -> np.ndarray:
    """Every sequence of ``split`` through the engine's forward (the adapters off), each row's log-probability."""
    ctx, engine, data = trainer.ctx, trainer.engine, trainer.data
    loss: PreferenceLoss = ctx.loss_fn()
    loss.collect, loss.collected = True, []
    engine.train(False)
    try:
        with adapters_disabled(engine.model_parts):
            for i, (inputs, targets) in enumerate(data.reference_batches(split)):
                x, y = engine.local_batch(ctx, inputs, targets)
                _forward(trainer, x, y, first=i == 0 and split == SPLITS[0])
    finally:
        loss.collect = False
        engine.train(True)
    mine = [(ids.numpy(), lps.numpy()) for ids, lps in loss.collected]
    loss.collected = []
    everyone = [mine]
    if ctx.world_size > 1:
        everyone = [None] * ctx.world_size
        dist.all_gather_object(everyone, mine)
    values = np.full(data.sequences(split), np.nan)
    for part in everyone:
        for ids, lps in part:
            values[ids] = lps
    if np.isnan(values).any():
        raise RuntimeError(f"the reference pass left {int(np.isnan(values).sum())} {split} sequences without a value")
    return values


def _forward(trainer: Any, x: torch.Tensor, y: torch.Tensor, *, first: bool) -> None:
    """One forward of the engine in ``collect`` mode. A pipeline evaluates only after a training step
    (torch#162822): the ``first`` batch takes one (a zero loss: its gradients are dropped)."""
    if first:
        trainer.engine.train_step(x, y)
        trainer.optimizer.zero_grad(set_to_none=True)
    else:
        trainer.engine.eval_step(x, y)


def wants_copy(cfg: Any) -> bool:
    """Whether the run's objective compares with a reference held on the ranks (``trainer.preference.reference=copy``)."""
    return holds_reference(str(cfg.trainer.objective), str(cfg.trainer.preference.reference))


class FrozenReference:
    """``trainer.preference.reference=copy``: the reference on this rank, run on every batch before the policy.

    Without LoRA: a clone of each of the engine's parameters as built (this rank's shards of the initial weights),
    swapped in for the reference's forward and back out after it. With LoRA: the adapters switched off."""

    def __init__(self, *, engine: Any, lora: bool):
        self.engine, self.lora = engine, lora
        self.params = [] if lora else list(engine.parameters())
        self.weights: list[torch.Tensor] | None = [] if lora else None
        self.nbytes = 0
        self.stepped = False
        """Whether the engine has taken a step (a pipeline's first forward must be a training step)."""

    def take(self) -> None:
        """Clone the engine's weights as they are now: the run's initial weights (``Trainer.resume`` calls it
        after reading them, before a checkpoint)."""
        if self.lora:
            return
        self.weights = frozen_copy(self.params)
        self.nbytes = local_bytes(self.weights)

    def summary(self) -> dict[str, Any]:
        what = "adapters off, every batch" if self.lora else "frozen copy of the initial weights"
        return {"reference": what, "reference_bytes_per_rank": self.nbytes}

    @contextmanager
    def active(self) -> Iterator[None]:
        """The engine's modules as the reference for the body."""
        if self.lora:
            with adapters_disabled(self.engine.model_parts):
                yield
            return
        if self.weights is None:
            raise RuntimeError("FrozenReference.active before take(): the initial weights were never copied")
        self._swap()
        try:
            yield
        finally:
            for part in self.engine.model_parts:  # no all-gathered copy of the reference's weights outlives it
                for m in part.modules():
                    if isinstance(m, FSDPModule):
                        m.reshard()
            self._swap()

    def _swap(self) -> None:
        with torch.no_grad():
            for p, w in zip(self.params, self.weights):
                held = p.detach().clone()
                p.copy_(w)
                w.copy_(held)

    def fill(self, trainer: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` with its reference column the reference's log-probability of each row (NaN on ranks that compute
        no loss, which never read it)."""
        loss: PreferenceLoss = trainer.ctx.loss_fn()
        rows = torch.arange(y.shape[0], dtype=torch.int64, device=y.device)
        probe = torch.cat([y[:, :-1], rows[:, None]], dim=1)
        loss.collect, loss.collected = True, []
        training = next(iter(self.engine.model_parts)).training
        self.engine.train(False)
        try:
            with self.active():
                _forward(trainer, x, probe, first=not self.stepped)
        finally:
            loss.collect = False
            self.engine.train(training)
        self.stepped = True
        values = torch.full((y.shape[0],), float("nan"), dtype=torch.float64)
        for ids, lps in loss.collected:
            values[ids] = lps
        loss.collected = []
        return torch.cat([y[:, :-1], reference_column(values).to(y.device)[:, None]], dim=1)


def held_reference(cfg: Any, *, engine: Any, lora: bool) -> FrozenReference | None:
    """The reference this rank holds and runs on every batch when the run's objective asks for one on the ranks
    (``wants_copy``); None otherwise."""
    return FrozenReference(engine=engine, lora=lora) if wants_copy(cfg) else None
