"""Save and load training state with ``torch.distributed.checkpoint`` (DCP), under any layout.

State is keyed by parameter names (FQNs), which every strategy keeps (pipeline stages are pruned
copies of the full model; DDP/FSDP/TP wrappers are looked through by DCP's ``get_state_dict``). So a
checkpoint written under pp=2 loads under ddp=2 or single: DCP reads each rank's keys from whichever
files hold them. What a checkpoint holds: model and optimizer (DCP), lr schedule and step (marker),
each rank's RNG states (``rng_rank{R}.pt``). The data position is the step: batches are a function
of (seed, step).
"""

from __future__ import annotations

import copy
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from omegaconf import OmegaConf
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from parallel.pipeline.tied import restored_optimizer_state, saved_optimizer_state
from trainer.checkpoint.files import (
    MARKER,
    CheckpointError,
    check_model_matches,
    checkpoints_root,
    complete_checkpoints,
    read_marker,
    step_dir_name,
)
from trainer.observe.durable import write_json


def dcp_failure(exc: BaseException) -> str:
    """One line saying why DCP failed: a ``CheckpointException``'s first rank's own error (its text holds every
    rank's traceback), else the error itself."""
    if isinstance(exc, CheckpointException) and exc.failures:
        rank, (exc, _) = next(iter(exc.failures.items()))
    lines = str(exc).strip().splitlines() or [""]
    return f"{type(exc).__name__}: {lines[-1][:300]}"


def read_dcp_metadata(path: Path) -> Any:
    """The ``.metadata`` of a checkpoint's DCP files (what each tensor is and which file holds it), read before any
    worker loads it: one that does not unpickle (damaged in place, its size unchanged) is refused naming it."""
    try:
        return dcp.FileSystemReader(str(path)).read_metadata()
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - unpickling, a missing file: one answer
        raise CheckpointError(
            f"checkpoint {path}: its {Path(path) / '.metadata'} cannot be read ({dcp_failure(exc)}); resume from or "
            "export an earlier checkpoint, or copy the folder again"
        ) from None


def state_view(parts: list[nn.Module]) -> nn.Module:
    """One module holding this rank's parts under their original names (no copies, no prefixes).

    A rank with several pipeline stages holds several pruned copies of the model; merging their
    children (``layers`` dicts merged) gives one module whose FQNs are those of the full model, which
    is what DCP and one optimizer over all parts need.
    """
    unwrapped = [
        p.module if isinstance(p, (nn.parallel.DistributedDataParallel, nn.DataParallel)) else p for p in parts
    ]
    if len(unwrapped) == 1:
        return unwrapped[0]
    view = nn.Module()
    for part in unwrapped:
        for name, child in part.named_children():
            if isinstance(child, nn.ModuleDict):
                merged = view._modules.get(name) or nn.ModuleDict()
                merged.update(child)
                view.add_module(name, merged)
            elif child is not None:
                view.add_module(name, child)
    return view


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _agree_on(value):
    """Rank 0's ``value`` on every rank."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


#: what a failed write raises: OSError & co, and DCP's CheckpointException (a BaseException) wrapping them
SAVE_ERRORS = (Exception, CheckpointException)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CheckpointException) and exc.failures:  # the first failing rank's own error
        rank, wrapped = next(iter(sorted(exc.failures.items())))
        inner = getattr(wrapped, "exception", wrapped)
        return f"rank {rank}: {_describe(inner)}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _attempt(call) -> str | None:
    """Run ``call``; None when it worked, else one line describing the error."""
    try:
        call()
    except SAVE_ERRORS as exc:  # reported as one line; the save fails on every rank
        return _describe(exc)
    return None


def _first_error(local: str | None) -> str | None:
    """Collective: the first rank's error, if any rank had one."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return local
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, local)
    return next((f"rank {r}: {e}" for r, e in enumerate(errors) if e), None)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


class Checkpointer:
    def __init__(self, *, ctx, engine, optimizer: torch.optim.Optimizer, scheduler):
        self.ctx = ctx
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.view = state_view(engine.model_parts)
        self.aliases = dict(engine.state_aliases)  # a tied weight's copy: optimizer state under the original's name
        self.root = checkpoints_root(ctx.run_dir)
        self.keep = int(ctx.cfg.trainer.keep_checkpoints)
        self.async_save = bool(ctx.cfg.trainer.get("async_checkpoint", False))
        self.failed_steps: list[int] = []
        self._pending = None
        self._group = None

    #: optimizer state and param-group settings keyed per parameter FQN ("param_groups.<fqn>.lr"), not
    #: by group index: ranks holding different stages then never overwrite each other's groups, and a
    #: checkpoint reshards to any layout (torchtitan does the same)
    OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(what DCP writes and reads: model and optimizer state by name, a tied weight's copy under its original's
        name; the optimizer's own flattened state dict)."""
        model_sd, optim_sd = get_state_dict(self.view, self.optimizer, options=self.OPTIONS)
        return {"model": model_sd, "optim": saved_optimizer_state(optim_sd, self.aliases)}, optim_sd

    def save(self, step: int) -> Path | None:
        """Collective: every rank writes its shard into ``.tmp-step_N``; rank 0 checks that every rank's
        files are there, adds the marker and renames the folder into place. "saved" is logged only for
        such a complete folder. A write that fails on any rank (full disk, unwritable folder) fails this
        save on every rank: the partial folder is removed, the previous checkpoint stays as it was, one
        line says so, and training goes on (None is returned). With ``trainer.async_checkpoint`` the
        shards are written in the background (``dcp.async_save``) and the marker follows in ``wait``."""
        self.wait()
        ctx = self.ctx
        final = self.root / step_dir_name(step)
        tmp = self.root / f".tmp-{final.name}"
        t0 = time.perf_counter()
        sched = copy.deepcopy(self.scheduler.state_dict())  # as of this step (the marker may come later)
        error = None
        if ctx.rank == 0:
            error = _attempt(lambda: (shutil.rmtree(tmp, ignore_errors=True), tmp.mkdir(parents=True)))
        error = _agree_on(error)
        if error is None:
            error = _first_error(_attempt(lambda: torch.save(_rng_state(), tmp / f"rng_rank{ctx.rank}.pt")))
        if error is not None:
            return self._failed(step, tmp, error)
        if self.async_save:
            try:
                future = dcp.async_save(self._state()[0], checkpoint_id=str(tmp), process_group=self._async_group())
            except SAVE_ERRORS as exc:  # DCP raises the same error on every rank
                return self._failed(step, tmp, _describe(exc))
            self._pending = (future, step, tmp, final, t0, sched)
            ctx.log.info("checkpoint step %d: writing in the background to %s", step, tmp)
            return None
        try:
            dcp.save(self._state()[0], checkpoint_id=str(tmp))
        except SAVE_ERRORS as exc:  # DCP gathers every rank's write error and raises it on all
            return self._failed(step, tmp, _describe(exc))
        return self._complete(step, tmp, final, t0, sched)

    def wait(self) -> Path | None:
        """Finish a background save (collective): wait for every rank's shards, then marker and rename."""
        if self._pending is None:
            return None
        future, step, tmp, final, t0, sched = self._pending
        self._pending = None
        error = _first_error(_attempt(future.result))
        if error is not None:
            return self._failed(step, tmp, error)
        return self._complete(step, tmp, final, t0, sched)

    def _async_group(self):
        """A separate gloo group for the background writer's collectives (the training loop keeps the
        default group busy; DCP's async save needs a CPU backend)."""
        if self._group is None and dist.is_initialized() and dist.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _failed(self, step: int, tmp: Path, error: str) -> None:
        ctx = self.ctx
        _barrier()
        if ctx.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        found = complete_checkpoints(self.root) if ctx.rank == 0 else []
        previous = f"{found[-1][1]} is intact" if found else "there is no earlier checkpoint"
        self.failed_steps.append(step)
        ctx.log.warning("checkpoint step %d NOT saved (%s); %s; training goes on", step, error, previous)
        return None

    def _complete(self, step: int, tmp: Path, final: Path, t0: float, sched: dict) -> Path:
        ctx = self.ctx
        _barrier()
        missing = _agree_on(self._missing_shards(tmp) if ctx.rank == 0 else None)
        if missing:
            if ctx.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"checkpoint step {step} is incomplete, not saved: {missing} missing from {tmp} (ranks on other "
                "nodes wrote theirs elsewhere: nodes must share the run folder, hydra.run.dir=<shared path>)"
            )
        error = None
        if ctx.rank == 0:
            error = _attempt(lambda: self._seal(step, tmp, final, sched))
        error = _agree_on(error)
        if error is not None:
            return self._failed(step, tmp, error)
        ctx.log.info("checkpoint step %d saved to %s (%.2fs)", step, final, time.perf_counter() - t0)
        return final

    def _seal(self, step: int, tmp: Path, final: Path, sched: dict) -> None:
        """Rank 0: the marker (written last, with every file's size), then the atomic rename."""
        ctx = self.ctx
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        marker = {
            "step": step,
            "time": time.time(),
            "world_size": ctx.world_size,
            "layout": ctx.layout.to_dict(),
            "model": OmegaConf.to_container(ctx.cfg.model, resolve=True),
            "seed": int(ctx.cfg.trainer.seed),
            "scheduler": sched,
            "files": files,
        }
        write_json(tmp / MARKER, marker)  # fsynced before the folder is renamed into place
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        self._prune()

    def _missing_shards(self, tmp: Path) -> str:
        """What is not in ``tmp`` that every rank should have written there ('' when complete)."""
        names = {p.name for p in tmp.iterdir()} if tmp.is_dir() else set()
        missing = [f"rng_rank{r}.pt" for r in range(self.ctx.world_size) if f"rng_rank{r}.pt" not in names]
        if ".metadata" not in names:
            missing.append(".metadata")
        return ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")

    def _prune(self) -> None:
        if self.keep <= 0:
            return
        for _, path in complete_checkpoints(self.root)[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    def load(self, path: Path) -> int:
        """Collective: restore model, optimizer, schedule and (same world size) RNG; returns the step."""
        ctx = self.ctx
        meta = read_marker(path)
        check_model_matches(meta, OmegaConf.to_container(ctx.cfg.model, resolve=True), path)
        state, optim_sd = self._state()
        try:
            dcp.load(state, checkpoint_id=str(path))
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP raises many kinds; path and cause matter
            raise CheckpointError(f"checkpoint {path} cannot be loaded into this model: {dcp_failure(exc)}") from None
        set_state_dict(
            self.view,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=restored_optimizer_state(state["optim"], self.aliases, template=optim_sd),
            options=self.OPTIONS,
        )
        self.scheduler.load_state_dict(meta["scheduler"])
        rng = Path(path) / f"rng_rank{ctx.rank}.pt"
        if meta.get("world_size") == ctx.world_size and rng.exists():
            _set_rng_state(torch.load(rng, weights_only=False))
        step = int(meta["step"])
        same = (
            meta.get("layout", {}).get("strategy") == ctx.layout.strategy and meta.get("world_size") == ctx.world_size
        )
        ctx.log.info(
            "resumed from %s at step %d%s",
            path,
            step,
            ""
            if same
            else f" (written under {meta.get('layout', {}).get('strategy')} with "
            f"{meta.get('world_size')} ranks; resharded by DCP)",
        )
        return step
