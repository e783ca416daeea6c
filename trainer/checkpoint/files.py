"""Checkpoint folders on disk: naming, completeness, choosing one to resume from. No torch import.

A checkpoint is ``checkpoints/step_NNNNNNN/``: the files of ``torch.distributed.checkpoint`` (one
``.distcp`` per writing rank plus ``.metadata``), ``rng_rank{R}.pt`` per rank, and ``meshtrain.json``,
the marker, written last. Writers fill ``.tmp-step_NNNNNNN`` and rename it when every rank is done, so
a crash mid-write leaves a folder that is ignored, never one that looks complete. The marker records
each file's size, so a truncated copy is caught before any worker loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.observe.durable import read_whole_json, warn_torn

MARKER = "meshtrain.json"
PREFIX = "step_"
#: model keys that must match between a checkpoint and the run loading it (shape-defining)
MODEL_KEYS = (
    "_target_",
    "vocab_size",
    "n_layers",
    "d_model",
    "n_heads",
    "n_kv_heads",
    "d_ff",
    "layer_d_ff",
    "channels",
    "num_classes",
)


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, truncated or written for another model; names the path."""


def checkpoints_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir_name(step: int) -> str:
    return f"{PREFIX}{step:07d}"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under ``root``, oldest first.

    Complete: its marker is there and whole, and every file it lists has the size it records. One whose
    marker is torn or whose files were cut short (a damaged copy, a disk that filled) is passed over with one
    warning, so ``trainer.resume=auto`` continues from the newest checkpoint that can be loaded."""
    out = []
    for step, p, problem in _marked(root):
        if problem:
            warn_torn(p / MARKER, None, f"checkpoint {p.name} {problem}: skipped")
            continue
        out.append((step, p))
    return sorted(out)


def damaged_checkpoints(root: Path) -> list[tuple[Path, str]]:
    """(path, what is wrong) of each checkpoint under ``root`` whose marker is there but that cannot be loaded."""
    return [(p, problem) for _, p, problem in sorted(_marked(root)) if problem]


def _marked(root: Path) -> list[tuple[int, Path, str | None]]:
    """(step, path, problem or None) of every ``step_N`` folder under ``root`` that has a marker."""
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and (p / MARKER).is_file():
            try:
                step = int(p.name[len(PREFIX) :])
            except ValueError:
                continue
            out.append((step, p, _marker_and_problem(p)[1]))
    return out


def _marker_and_problem(path: Path) -> tuple[dict[str, Any], str | None]:
    """A checkpoint folder's marker and what makes the checkpoint unusable (None: nothing)."""
    meta, why = read_whole_json(path / MARKER)
    if why is not None:
        return {}, f"has a marker {MARKER} that is {why}"
    if not isinstance(meta, dict):
        return {}, f"has a marker {MARKER} that is not a JSON object"
    for key, kind in (("files", dict), ("model", dict), ("step", int), ("scheduler", dict)):
        if key in meta and not isinstance(meta[key], kind):
            return {}, f"has a marker {MARKER} whose {key!r} is {meta[key]!r}, not a {kind.__name__} (an edited file)"
    for name, size in (meta.get("files") or {}).items():
        f = path / name
        if not f.is_file():
            return meta, f"is missing {name}; the copy is incomplete"
        if f.stat().st_size != size:
            return meta, f"is truncated: {name} has {f.stat().st_size} bytes, expected {size}"
    return meta, None


def read_marker(path: Path) -> dict[str, Any]:
    """The marker of a checkpoint folder, after checking that the folder is complete and whole."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(
            f"checkpoint {path} does not exist; set trainer.resume to an existing "
            f"checkpoints/step_* folder, or trainer.resume=never"
        )
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a file; trainer.resume takes a checkpoints/step_* folder")
    marker = path / MARKER
    if not marker.is_file():
        hint = (
            "it was interrupted while being written"
            if (path / ".metadata").exists() or path.name.startswith(".tmp")
            else "it is not a meshtrain checkpoint"
        )
        raise CheckpointError(
            f"checkpoint {path} is incomplete: no {MARKER} marker ({hint}); "
            f"resume from an earlier checkpoint or use trainer.resume=never"
        )
    meta, problem = _marker_and_problem(path)
    if problem:
        raise CheckpointError(
            f"checkpoint {path} {problem}; resume from an earlier checkpoint "
            "(trainer.resume=auto picks the newest whole one) or use trainer.resume=never"
        )
    return meta


#: what a marker must hold for a run to resume from it (the checkpointer writes each)
RESUME_KEYS = ("step", "model", "scheduler")


def check_model_matches(meta: dict[str, Any], model_cfg: dict[str, Any], path: Path) -> None:
    """The marker holds what resuming reads, and was written for a model of this run's shape."""
    missing = [k for k in RESUME_KEYS if k not in meta]
    if missing:
        raise CheckpointError(
            f"checkpoint {path}: its {MARKER} has no {', '.join(missing)} (an edited or foreign marker); resume from "
            "an earlier checkpoint or use trainer.resume=never"
        )
    saved = meta["model"]
    diffs = [
        f"model.{k}: checkpoint {saved.get(k)!r} vs this run {model_cfg.get(k)!r}"
        for k in MODEL_KEYS
        if (k in saved or k in model_cfg) and saved.get(k) != model_cfg.get(k)
    ]
    if diffs:
        raise CheckpointError(
            f"checkpoint {path} was written for another model ({'; '.join(diffs)}); "
            "resume with the same model settings or use trainer.resume=never"
        )


def resumable(resume: str, run_dir: Path, model_cfg: dict[str, Any]) -> Path | None:
    """The checkpoint ``trainer.resume`` names, checked before any worker starts: complete and whole (its marker)
    and written for this model (``model_cfg``, resolved); None for never, or auto with nothing saved yet."""
    path = resolve_resume(resume, run_dir)
    if path is not None:
        check_model_matches(read_marker(path), model_cfg, path)
    return path


def resolve_resume(resume: str, run_dir: Path) -> Path | None:
    """The checkpoint to start from: ``auto`` = newest complete one in this run, ``never``, or a path."""
    if resume == "never":
        return None
    if resume == "auto":
        found = complete_checkpoints(checkpoints_root(run_dir))
        return found[-1][1] if found else None
    path = Path(resume).expanduser()
    if path.is_dir() and not (path / MARKER).exists() and (path / "checkpoints").is_dir():
        found = complete_checkpoints(path / "checkpoints")  # a run folder: its newest checkpoint
        if found:
            return found[-1][1]
    return path
